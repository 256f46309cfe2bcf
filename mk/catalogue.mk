# The protocol catalogue: protocol/catalogue.json, which the Rust writes
# (src/catalogue.rs: the command specs, src/errors.rs, the limits and the
# settings), and every file generated from it by tools/catalogue.py (the Lua
# fallback's constants, the clients' limits and error texts, the syntax line
# of each docs/commands/ page).
#
#   make catalogue        regenerate the catalogue and everything made from it;
#                         list the Markdown lines that still state a changed
#                         limit's old value
#   make check-catalogue  fail, naming the files, if any of them is stale
#                         (part of `make quick` and `make test`)

CATALOGUE_JSON := $(CURDIR)/protocol/catalogue.json

.PHONY: catalogue check-catalogue

EXTRA_TESTS += check-catalogue

catalogue: ## regenerate protocol/catalogue.json from the Rust, and every file generated from it
	TB_CATALOGUE_OUT=$(CATALOGUE_JSON) $(CARGO) test $(UNIT_FLAGS) --lib catalogue::tests::catalogue_is_current -- --quiet
	python3 $(CURDIR)/tools/catalogue.py
	@$(MAKE) --no-print-directory lua-sync

check-catalogue: ## fail if protocol/catalogue.json or a file generated from it is stale (run make catalogue)
	@out=$$($(CARGO) test $(UNIT_FLAGS) --lib catalogue:: -- --quiet 2>&1) || { \
	  echo "$$out" >&2; \
	  echo "error: protocol/catalogue.json is stale (or the catalogue's tests fail): run 'make catalogue'" >&2; \
	  exit 1; }
	@python3 $(CURDIR)/tools/catalogue.py --check
	@$(MAKE) --no-print-directory lua-check
