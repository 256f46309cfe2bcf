# Python client (clients/python) and the examples (examples/): two venvs, then
# pytest against redis-server processes the tests start themselves
# (REDIS_SERVER, TB_MODULE, as for the Rust tests).
#
#   make python-venv          create the venvs, install the client and test deps
#   make test-python          mypy --strict; the client suite with the newest
#                             redis-py the client allows on every server in
#                             TEST_SERVERS (module and Lua fallback each), and
#                             with the oldest on the first server; then the
#                             examples' tests (Celery, HTTP, download, Rust)
#   make example-celery|example-http|example-download   run one example

PY_DIR := $(CURDIR)/clients/python
PY_VENV := $(PY_DIR)/.venv
PY := $(PY_VENV)/bin/python
# The oldest redis-py the client allows (the lower bound of its dependency in
# clients/python/pyproject.toml): behaviour differs (e.g. no default socket
# timeout before 8), so the suite runs on it too.
PY_OLD_VENV := $(PY_DIR)/.venv-redis-oldest
PY_OLD := $(PY_OLD_VENV)/bin/python
REDIS_PY_OLDEST = $(shell sed -n 's/.*"redis>=\([0-9.]*\),.*/\1/p' $(PY_DIR)/pyproject.toml)
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
CARGO ?= cargo
REDIS_SERVER_SYS ?= $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)
PYTEST := -m pytest -q -p no:cacheprovider

.PHONY: python-venv test-python example-celery example-http example-download

EXTRA_TESTS += test-python
TEST_PREREQS += python-venv

# The venvs (python3 -m venv; python3-venv from apt when root and missing),
# with the client installed as users install it (pip install ./clients/python:
# the newest redis-py it allows) plus the test and example dependencies; the
# second one then pins redis-py to the oldest version allowed.
# Installed again only when the client's files changed since (the stamp):
# the docs blocks run `make example-*` while other suites use these venvs,
# and a reinstall under a running suite would pull its modules away.
PY_STAMP := $(PY_VENV)/.installed
python-venv: $(PY_STAMP)

$(PY_STAMP): $(PY_DIR)/pyproject.toml $(shell find $(PY_DIR)/src -type f -not -name '*.pyc' 2>/dev/null)
	@$(CURDIR)/mk/venv.sh $(PY_VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --upgrade "$(PY_DIR)[test]"
	@# The same version number would let pip keep a stale copy: reinstall the code.
	@$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$(PY_DIR)"
	@$(CURDIR)/mk/venv.sh $(PY_OLD_VENV)
	@$(PY_OLD) -m pip install --quiet --disable-pip-version-check "$(PY_DIR)[test]" "redis==$(REDIS_PY_OLDEST)"
	@$(PY_OLD) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$(PY_DIR)"
	@touch $@

test-python: build redis8 python-venv
	@echo "== mypy --strict (client, integrations)"
	cd $(PY_DIR) && $(PY) -m mypy --strict src
	@for server in $(TEST_SERVERS); do \
	  echo; \
	  echo "== Python client, redis-py $$($(PY) -c 'import redis; print(redis.__version__)'): module, Lua fallback and cluster on $$($$server --version | cut -d' ' -f1-3)"; \
	  (cd $(PY_DIR) && REDIS_SERVER=$$server TB_MODULE=$(MODULE) $(PY) $(PYTEST) tests) || exit 1; \
	done
	@echo
	@echo "== Python client, redis-py $$($(PY_OLD) -c 'import redis; print(redis.__version__)') (the oldest allowed) on $$($(REDIS_SERVER_SYS) --version | cut -d' ' -f1-3)"
	cd $(PY_DIR) && REDIS_SERVER=$(REDIS_SERVER_SYS) TB_MODULE=$(MODULE) $(PY_OLD) $(PYTEST) tests
	@echo
	@echo "== Examples (Celery, HTTP, download, Rust) on $$($(REDIS_SERVER_SYS) --version | cut -d' ' -f1-3)"
	$(CARGO) build --release --example rust_client
	cd $(CURDIR)/examples && REDIS_SERVER=$(REDIS_SERVER_SYS) TB_MODULE=$(MODULE) $(PY) $(PYTEST)

# One command per example: each starts its own redis-server with the module
# on a free port (or uses REDIS_URL) and runs until Ctrl-C.
example-celery: build python-venv
	cd $(CURDIR)/examples/celery && TB_MODULE=$(MODULE) $(PY) run.py

example-http: build python-venv
	cd $(CURDIR)/examples/http && TB_MODULE=$(MODULE) $(PY) run.py

# The download example needs only the client with FastAPI and uvicorn: its
# own small venv, so that it serves its first byte in seconds rather than
# after the two test venvs are built. Environment: PORT (8000), REDIS_URL
# (else a fresh server), DOWNLOAD_CONFIG (the tiers and the global cap, as
# JSON; examples/download/downloads.py).
EX_DL_VENV := $(PY_DIR)/.venv-examples
EX_DL_PY := $(EX_DL_VENV)/bin/python

example-download: build
	@$(CURDIR)/mk/venv.sh $(EX_DL_VENV)
	@$(EX_DL_PY) -c 'import fastapi, uvicorn' 2>/dev/null || \
	  $(EX_DL_PY) -m pip install --quiet --disable-pip-version-check "$(PY_DIR)[fastapi]" "uvicorn==0.*"
	@# The same version number would let pip keep a stale copy: reinstall the code.
	@$(EX_DL_PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$(PY_DIR)"
	cd $(CURDIR)/examples/download && TB_MODULE=$(MODULE) $(EX_DL_PY) run.py
