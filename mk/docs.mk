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
# the harness (tools/doctest/mypy.ini: strict).
DOCTEST_PIP := 'markdown-it-py==4.*' 'mypy==1.*'
PYTEST_ARGS ?=

.PHONY: test-docs

EXTRA_TESTS += test-docs

# The Python venv of mk/python.mk (the client installed as users install it)
# runs the harness and the python blocks; js blocks run with the Node
# client's packages (mk/node.mk).
test-docs: build redis8 python-venv node-deps
	@$(PY) -m pip install --quiet --disable-pip-version-check $(DOCTEST_PIP)
	cd $(CURDIR)/tools/doctest && $(PY) -m mypy .
	cd $(CURDIR)/tools/doctest && TEST_SERVERS="$(TEST_SERVERS)" TB_MODULE=$(MODULE) \
	  $(PY) -m pytest -q $(PYTEST_ARGS)
