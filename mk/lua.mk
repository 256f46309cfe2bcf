# The Lua fallback: its source is lua/src/*.lua, a few files assembled in
# name order into lua/tb.lua (one script, as EVALSHA takes it), which each
# client package ships as a byte-identical copy (packages cannot reach
# outside their own directory). lua/src/02-constants.lua holds the block
# that `make catalogue` generates (mk/catalogue.mk).
#
#   make lua-sync    assemble lua/tb.lua and copy it into every client package
#   make lua-check   fail if lua/tb.lua or a package's copy is not what
#                    lua/src/ assembles to (part of `make test`)

LUA_SOURCE := lua/tb.lua
# The parts, in the order they are assembled.
LUA_PARTS = $(sort $(wildcard lua/src/*.lua))
# Every packaged copy of LUA_SOURCE; a new client package adds its own here.
LUA_COPIES := clients/python/src/tb_limiter/tb.lua clients/node/src/tb.lua clients/ruby/lib/tb_limiter/tb.lua
# Writes the assembled script to stdout: a first line saying where it comes
# from, then the parts, a blank line between two.
LUA_ASSEMBLE = awk 'BEGIN { print "-- Assembled by `make lua-sync` from lua/src/*.lua, in name order: edit those, not this file." } \
  FNR == 1 && NR > 1 { print "" } { print }' $(LUA_PARTS)

.PHONY: lua-sync lua-check

EXTRA_TESTS += lua-check

lua-sync: ## assemble lua/tb.lua from lua/src/ and copy it into every client package
	@$(LUA_ASSEMBLE) > $(LUA_SOURCE).tmp && mv $(LUA_SOURCE).tmp $(LUA_SOURCE)
	@echo "assembled $(LUA_SOURCE) from $(words $(LUA_PARTS)) files of lua/src/"
	@for f in $(LUA_COPIES); do cp $(LUA_SOURCE) $$f; echo "copied $(LUA_SOURCE) to $$f"; done

lua-check: ## fail if lua/tb.lua or a client package's copy differs from what lua/src/ assembles to (part of make test)
	@$(LUA_ASSEMBLE) | cmp -s - $(LUA_SOURCE) || { \
	  echo "error: $(LUA_SOURCE) is not what lua/src/*.lua assemble to; edit lua/src/, then run 'make lua-sync'" >&2; \
	  exit 1; }
	@for f in $(LUA_COPIES); do \
	  cmp -s $(LUA_SOURCE) $$f || { \
	    echo "error: $$f differs from $(LUA_SOURCE); edit lua/src/, then run 'make lua-sync'" >&2; \
	    exit 1; }; \
	done; echo "lua-check: $(LUA_SOURCE) is lua/src/ assembled, and its $(words $(LUA_COPIES)) copies are identical"
