# Docs blocks (tools/doctest): every fenced code block of README.md,
# docs/**/*.md, clients/*/README.md and examples/*/README.md runs against
# real servers the harness
# starts (free loopback ports, TEST_SERVERS, TB_MODULE); a block with no
# runner and no directive fails. tools/doctest/blocks.py lists the directives.
# Every relative link of those pages must resolve (tools/doctest/links.py).
#
#   make test-docs   every block (part of `make test`); pass PYTEST_ARGS="-k ..."
#                    to run some

# markdown-it-py: the CommonMark parser that finds the blocks; mypy checks
# the harness (tools/doctest/mypy.ini: strict) and, through its tests, the
# generators in tools/.
DOCTEST_PIP := 'markdown-it-py==4.*' 'mypy==1.*' 'pytest==9.*'
PYTEST_ARGS ?=

.PHONY: test-docs

EXTRA_TESTS += test-docs
TEST_PREREQS += docs-venvs

# The python blocks run against the client as users get it: `python -m
# build` makes the sdist and, from it, the wheel (target/python-dist); each
# is installed, with the extras the blocks import, into a fresh venv, and
# the python blocks run in each; test_installed.py checks, in both, that the
# client is the installed one and holds every file of clients/python/src
# (tb.lua, py.typed, the dashboard's static files). Then the other blocks
# run in the wheel's venv (sh blocks find its python on PATH; one of them
# pip-installs ./clients/python into it, so they come last); js blocks run
# in a user's project with the packed Node client installed (mk/node.mk:
# node-installed), ruby blocks with the gem (mk/ruby.mk).
PY_DIST := $(CURDIR)/target/python-dist
DOCS_WHEEL_VENV = $(PY_DIR)/.venv-docs-wheel
DOCS_EXTRAS := [test,dashboard]

.PHONY: python-dist docs-venvs

python-dist: python-venv
	@rm -rf $(PY_DIST)
	@$(PY) -m pip install --quiet --disable-pip-version-check 'build==1.*'
	@$(PY) -m build --outdir $(PY_DIST) $(PY_DIR) > $(CURDIR)/target/python-dist.log 2>&1 || { cat $(CURDIR)/target/python-dist.log; exit 1; }

docs-venvs: python-dist
	@for kind in wheel sdist; do \
	  venv=$(PY_DIR)/.venv-docs-$$kind; \
	  if [ $$kind = wheel ]; then art=$$(ls $(PY_DIST)/*.whl); else art=$$(ls $(PY_DIST)/*.tar.gz); fi; \
	  rm -rf $$venv && $(CURDIR)/mk/venv.sh $$venv; \
	  echo "==> installing $$(basename $$art) into $$venv"; \
	  $$venv/bin/python -m pip install --quiet --disable-pip-version-check "$$art$(DOCS_EXTRAS)" $(DOCTEST_PIP) || exit 1; \
	done

test-docs: build redis8 docs-venvs node-installed ruby-gem
	cd $(CURDIR)/tools/doctest && $(DOCS_WHEEL_VENV)/bin/python -m mypy .
	@for kind in wheel sdist; do \
	  echo "== python docs blocks, the client installed from its $$kind"; \
	  (cd $(CURDIR)/tools/doctest && TEST_SERVERS="$(TEST_SERVERS)" TB_MODULE=$(MODULE) DOCTEST_LANGS=python \
	    $(PY_DIR)/.venv-docs-$$kind/bin/python -m pytest -q test_docs.py test_installed.py $(PYTEST_ARGS)) || exit 1; \
	done
	@echo "== the other docs blocks, and the harness' own tests"
	cd $(CURDIR)/tools/doctest && TEST_SERVERS="$(TEST_SERVERS)" TB_MODULE=$(MODULE) DOCTEST_LANGS=-python \
	  TB_NODE_PROJECT=$(NODE_INSTALLED)/packed \
	  $(DOCS_WHEEL_VENV)/bin/python -m pytest -q --ignore=test_installed.py $(PYTEST_ARGS)
