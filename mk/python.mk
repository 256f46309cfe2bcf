# Python client (clients/python) and the examples (examples/): a venv at
# clients/python/.venv, then pytest against redis-server processes the tests
# start themselves (REDIS_SERVER, TB_MODULE, as for the Rust tests).
#
#   make python-venv          create the venv, install the client and test deps
#   make test-python          client suite on Redis 7 and 8 (module and Lua
#                             fallback each), then the examples' tests
#   make example-celery|example-http|example-download   run one example

PY_DIR := $(CURDIR)/clients/python
PY_VENV := $(PY_DIR)/.venv
PY := $(PY_VENV)/bin/python
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
CARGO ?= cargo
REDIS_SERVER_SYS ?= $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)

.PHONY: python-venv test-python example-celery example-http example-download

EXTRA_TESTS += test-python

# The venv (python3 -m venv; python3-venv from apt when root and missing),
# with the client installed as users install it (pip install ./clients/python)
# plus the pinned test and example dependencies.
python-venv:
	@$(CURDIR)/mk/venv.sh $(PY_VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check "$(PY_DIR)[test]"
	@# The same version number would let pip keep a stale copy: reinstall the code.
	@$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$(PY_DIR)"

test-python: build redis8 python-venv
	@for server in $(TEST_SERVERS); do \
	  echo; \
	  echo "== Python client: module and Lua fallback on $$($$server --version | cut -d' ' -f1-3)"; \
	  (cd $(PY_DIR) && REDIS_SERVER=$$server TB_MODULE=$(MODULE) $(PY) -m pytest -q -p no:cacheprovider tests) || exit 1; \
	done
	@echo
	@echo "== Examples (Celery, HTTP, download, Rust) on $$($(REDIS_SERVER_SYS) --version | cut -d' ' -f1-3)"
	$(CARGO) build --release --example rust_client
	cd $(CURDIR)/examples && REDIS_SERVER=$(REDIS_SERVER_SYS) TB_MODULE=$(MODULE) $(PY) -m pytest -q -p no:cacheprovider

# One command per example: each starts its own redis-server with the module
# on a free port (or uses REDIS_URL) and runs until Ctrl-C.
example-celery: build python-venv
	cd $(CURDIR)/examples/celery && TB_MODULE=$(MODULE) $(PY) run.py

example-http: build python-venv
	cd $(CURDIR)/examples/http && TB_MODULE=$(MODULE) $(PY) run.py

example-download: build python-venv
	cd $(CURDIR)/examples/download && TB_MODULE=$(MODULE) $(PY) run.py
