# Fuzzing and soak runs (docs/security.md has what each proves).
#
#   make fuzz        libFuzzer on every parser and the bucket arithmetic,
#                    FUZZ_SECONDS (20) per target, two at a time; part of
#                    `make test`
#   make fuzz-long   the same for FUZZ_LONG_SECONDS (60) per target, then the
#                    protocol fuzzer and the RESTORE fuzzer with large counts
#                    on every server of TEST_SERVERS (the figures in docs/security.md
#                    ("Security and limits"))
#   make soak        the soak test for SOAK_SECONDS (300) of load on every
#                    server of TEST_SERVERS (its CI form, 20 s, runs with the
#                    other tests)
#   make check-figures  fail if the figures of docs/security.md are not the
#                    ones the last fuzz-long and soak runs recorded in
#                    docs/security-figures.json (in make quick and make test)
#
# cargo-fuzz needs nightly flags; only stable Rust is installed, so fuzz/run.sh
# sets RUSTC_BOOTSTRAP=1, under which stable rustc accepts them (AddressSanitizer
# included). cargo-fuzz itself is installed from crates.io when missing.

FUZZ_SECONDS ?= 20
FUZZ_LONG_SECONDS ?= 60
SOAK_SECONDS ?= 300
# Where fuzz-long and soak keep their output, from which
# tools/security_figures.py writes the figures of docs/security.md.
FIGURES_DIR := $(CURDIR)/target/figures
CARGO_FUZZ_VERSION := 0.13.2
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
APT ?= $(CURDIR)/mk/apt.sh
CARGO ?= cargo
REDIS_SERVER_SYS ?= $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)

.PHONY: fuzz-deps fuzz fuzz-long soak check-figures

EXTRA_TESTS += fuzz check-figures
TEST_PREREQS += fuzz-deps

# cargo-fuzz (cached once installed) and a C++ compiler for libFuzzer.
fuzz-deps:
	@command -v $(CARGO) >/dev/null 2>&1 || { echo "error: cargo not found" >&2; exit 1; }
	@command -v c++ >/dev/null 2>&1 || $(APT) "a C++ compiler: libFuzzer is C++" g++
	@if ! $(CARGO) fuzz --version >/dev/null 2>&1; then \
	  echo "==> installing cargo-fuzz $(CARGO_FUZZ_VERSION)"; \
	  $(CARGO) install cargo-fuzz --locked --version $(CARGO_FUZZ_VERSION); \
	fi

fuzz: fuzz-deps ## libFuzzer on every target, FUZZ_SECONDS each (part of make test)
	fuzz/run.sh $(FUZZ_SECONDS)

fuzz-long: fuzz-deps build redis8 valkey9 test-deps ## long fuzzing, then the protocol and RESTORE fuzzers on every server
	@mkdir -p $(FIGURES_DIR)
	@{ fuzz/run.sh $(FUZZ_LONG_SECONDS) && for server in $(TEST_SERVERS); do \
	  echo; echo "== protocol and RESTORE fuzzers, large counts, on $$($$server --version | cut -d' ' -f1-3)"; \
	  REDIS_SERVER=$$server TB_MODULE=$(MODULE) TB_HOSTILE_BATCHES=60 TB_HOSTILE_COMMANDS=2500 \
	    $(CARGO) test --release --test hostile -- --nocapture || exit 1; \
	  REDIS_SERVER=$$server TB_MODULE=$(MODULE) TB_RESTORE_INPUTS=200000 \
	    $(CARGO) test --release --test restore_fuzz -- --nocapture || exit 1; \
	done; } 2>&1 | tee $(FIGURES_DIR)/fuzz-long.log
	python3 $(CURDIR)/tools/security_figures.py --record $(FIGURES_DIR)/fuzz-long.log

soak: build redis8 valkey9 test-deps ## the soak test, SOAK_SECONDS of load on every server
	@mkdir -p $(FIGURES_DIR)
	@{ for server in $(TEST_SERVERS); do \
	  echo; echo "== soak, $(SOAK_SECONDS) s of load, on $$($$server --version | cut -d' ' -f1-3)"; \
	  REDIS_SERVER=$$server TB_MODULE=$(MODULE) TB_SOAK_SECONDS=$(SOAK_SECONDS) \
	    $(CARGO) test --release --test soak -- --nocapture || exit 1; \
	done; } 2>&1 | tee $(FIGURES_DIR)/soak.log
	python3 $(CURDIR)/tools/security_figures.py --record $(FIGURES_DIR)/soak.log

check-figures: ## fail if docs/security.md's figures are not those recorded by make fuzz-long and make soak
	@python3 $(CURDIR)/tools/security_figures.py --check
