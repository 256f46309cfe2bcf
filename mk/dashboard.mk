# The live dashboard (clients/python/src/tb_limiter/dashboard, `python -m
# tb_limiter.dashboard`) and its suite (clients/python/tests_dashboard),
# which includes a test in a real browser: Debian's Chromium, headless,
# driven by Playwright (PyPI), which cannot download browsers here.
#
#   make test-dashboard         mypy --strict on the dashboard and its tests,
#                               then the suite: all of it on the first server
#                               of TEST_SERVERS, all but the browser test on
#                               the others (part of `make test`)
#   make dashboard-screenshots  the browser test alone, writing its
#                               screenshots to docs/ (docs/dashboard.md shows one)
#   make dashboard URL=redis://127.0.0.1:6379/0 [CLUSTER=1] [DASHBOARD_PORT=8000]
#                               serve the dashboard on http://127.0.0.1:DASHBOARD_PORT/

DASH_PY_DIR := $(CURDIR)/clients/python
DASH_VENV := $(DASH_PY_DIR)/.venv-dashboard
DASH_PY := $(DASH_VENV)/bin/python
DASH_TEST_PIP := "pytest==9.*" "playwright==1.*" "mypy==1.*"
CHROMIUM := /usr/bin/chromium
URL ?= redis://127.0.0.1:6379/0
DASHBOARD_PORT ?= 8000
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
APT ?= $(CURDIR)/mk/apt.sh

.PHONY: dashboard-deps dashboard-venv test-dashboard dashboard-screenshots dashboard

EXTRA_TESTS += test-dashboard
TEST_PREREQS += dashboard-venv dashboard-deps

# Debian's chromium, from apt when root and missing; otherwise the command
# to run is printed.
dashboard-deps:
	@[ -x $(CHROMIUM) ] || $(APT) "the dashboard's browser test drives Debian's Chromium" chromium

# clients/python/.venv-dashboard: the client with its [dashboard] extra, as
# users install it, plus pytest, Playwright and mypy.
dashboard-venv:
	@$(CURDIR)/mk/venv.sh $(DASH_VENV)
	@$(DASH_PY) -m pip install --quiet --disable-pip-version-check --upgrade "$(DASH_PY_DIR)[dashboard]" $(DASH_TEST_PIP)
	@# The same version number would let pip keep a stale copy: reinstall the code.
	@$(DASH_PY) -m pip install --quiet --disable-pip-version-check --no-deps --force-reinstall "$(DASH_PY_DIR)"

test-dashboard: build redis8 dashboard-deps dashboard-venv
	@echo "== mypy --strict (dashboard and its tests)"
	cd $(DASH_PY_DIR) && MYPYPATH=$(CURDIR)/tools/tbharness:tests_dashboard $(DASH_PY) -m mypy --strict --follow-imports=silent \
	  --cache-dir $(DASH_VENV)/.mypy_cache src/tb_limiter/dashboard tests_dashboard
	@first=1; for server in $(TEST_SERVERS); do \
	  echo; \
	  if [ $$first = 1 ]; then \
	    echo "== Dashboard, with the browser test, on $$($$server --version | cut -d' ' -f1-3)"; \
	    skip=""; \
	  else \
	    echo "== Dashboard, without the browser test, on $$($$server --version | cut -d' ' -f1-3)"; \
	    skip="--ignore=tests_dashboard/test_browser.py"; \
	  fi; \
	  first=0; \
	  (cd $(DASH_PY_DIR) && REDIS_SERVER=$$server TB_MODULE=$(MODULE) CHROMIUM=$(CHROMIUM) \
	    TB_SCREENSHOT_DIR=$(CURDIR)/target/dashboard-screenshots \
	    $(DASH_PY) -m pytest -q tests_dashboard $$skip) || exit 1; \
	done

dashboard-screenshots: build dashboard-deps dashboard-venv
	cd $(DASH_PY_DIR) && REDIS_SERVER=$(firstword $(TEST_SERVERS)) TB_MODULE=$(MODULE) CHROMIUM=$(CHROMIUM) \
	  TB_SCREENSHOT_DIR=$(CURDIR)/docs $(DASH_PY) -m pytest -q tests_dashboard/test_browser.py

dashboard: dashboard-venv
	$(DASH_PY) -m tb_limiter.dashboard --url "$(URL)" --port $(DASHBOARD_PORT) $(if $(CLUSTER),--cluster)
