# Node.js client (clients/node): npm ci from the committed lockfile, the
# TypeScript checks (the JavaScript from its JSDoc, noImplicitAny; the
# shipped declarations, generated from it, by test/types.ts), then `node --test` against
# redis-server processes the tests start themselves (REDIS_SERVER,
# TB_MODULE), on every server of TEST_SERVERS: module and Lua fallback,
# node-redis 6 and 4, ioredis 6 and 5, the BullMQ end-to-end test with
# workers in two processes. The mixed Celery + BullMQ fleet runs once, on
# the first server, with the Python client's venv (mk/python.mk).
#
#   make node-deps    node and npm (apt-get when root and missing), npm ci
#   make test-node    the whole Node suite
#   make node-installed       the package installed as users get it, into
#                     fresh projects outside the repository (NODE_INSTALLED)
#   make test-node-installed  BullMQ and every docs Node snippet (run, and
#                     type-checked with tsc --strict) in those projects
#   make node-types   regenerate clients/node/types/ (the declarations, from
#                     the JSDoc of src/; committed)
#   make check-node-types  fail if types/ is stale (part of `make quick`)

NODE_DIR := $(CURDIR)/clients/node
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
APT ?= $(CURDIR)/mk/apt.sh
# A test that hangs fails after 5 minutes instead of holding make test.
NODE_TEST := node --test --test-concurrency=1 --test-timeout=300000 --test-reporter=spec

.PHONY: node-deps test-node node-installed test-node-installed node-types check-node-types

EXTRA_TESTS += test-node test-node-installed check-node-types
TEST_PREREQS += node-deps node-installed

# Fresh user projects, outside the repository (one directory per checkout):
# packed (the npm pack tarball, newest bullmq/ioredis/redis), oldest
# (node-redis 4, ioredis 5), linked (installed by path).
NODE_INSTALLED ?= $(or $(TMPDIR),/tmp)/tb-node-installed-$(shell printf %s '$(CURDIR)' | cksum | cut -d' ' -f1)

# Debian's nodejs and npm when either is missing (root), else the command to
# run; Node.js 20 or later (the package itself runs on 18, the newest
# node-redis and ioredis need 20); then the packages of the lockfile,
# exactly (npm ci).
node-deps: ## node and npm (apt-get when root and missing), npm ci in clients/node
	@missing=""; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	$(APT) "the Node client and its tests" $$missing
	@node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' || { \
	  echo "error: the Node suite needs Node.js 20 or later (node-redis 6 and ioredis 6, which it" >&2; \
	  echo "  tests, require it); found $$(node --version). Debian 12's nodejs package is 18; Debian 13's" >&2; \
	  echo "  is 20. Install Node.js 20 (https://nodejs.org/en/download) and run make again." >&2; \
	  exit 1; }
	@if [ ! -f $(NODE_DIR)/node_modules/.package-lock.json ] || \
	    [ $(NODE_DIR)/package-lock.json -nt $(NODE_DIR)/node_modules/.package-lock.json ]; then \
	  echo "==> npm ci in $(NODE_DIR)"; \
	  cd $(NODE_DIR) && npm ci --no-audit --no-fund --loglevel=error; \
	fi

test-node: build redis8 node-deps python-venv ## the Node client suite on every test server, BullMQ, the mixed fleet
	@echo
	@echo "== Node client: TypeScript check of the JavaScript (checkJs, noImplicitAny) and of the shipped types"
	cd $(NODE_DIR) && ./node_modules/.bin/tsc -p tsconfig.src.json
	cd $(NODE_DIR) && ./node_modules/.bin/tsc -p tsconfig.json --noEmit
	@for server in $(TEST_SERVERS); do \
	  echo; \
	  echo "== Node client: module and Lua fallback, node-redis and ioredis, BullMQ, on $$($$server --version | cut -d' ' -f1-3)"; \
	  (cd $(NODE_DIR) && REDIS_SERVER=$$server TB_MODULE=$(MODULE) $(NODE_TEST) test/*.test.js) || exit 1; \
	done
	@echo
	@echo "== Mixed fleet: a Celery worker and BullMQ workers share one bucket, on $$($(firstword $(TEST_SERVERS)) --version | cut -d' ' -f1-3)"
	cd $(NODE_DIR) && REDIS_SERVER=$(firstword $(TEST_SERVERS)) TB_MODULE=$(MODULE) TB_PYTHON=$(PY) \
	  $(NODE_TEST) test/fleet/*.test.js

# The declarations the package ships (clients/node/types/*.d.ts) are tsc's
# output from the JSDoc of src/ (tsconfig.types.json), committed so that a
# change of the public types shows in review; `npm pack` refuses stale ones.
node-types: node-deps ## regenerate clients/node/types/ (the declarations) from the JSDoc of src/
	cd $(NODE_DIR) && node tools/types.js

check-node-types: node-deps ## fail if clients/node/types/ is not what tsc generates from src/ (run make node-types)
	@cd $(NODE_DIR) && node tools/types.js --check

node-installed: node-deps ## the package packed and installed by path into fresh projects (NODE_INSTALLED)
	@echo "==> tb-limiter installed into fresh projects under $(NODE_INSTALLED)"
	node $(NODE_DIR)/tools/installed.js $(NODE_INSTALLED)

test-node-installed: build node-installed ## BullMQ and the docs Node snippets (run, tsc --strict) in the installed projects
	cd $(NODE_DIR) && TB_NODE_PROJECTS=$(NODE_INSTALLED) REDIS_SERVER=$(firstword $(TEST_SERVERS)) TB_MODULE=$(MODULE) \
	  $(NODE_TEST) test/installed/installed.test.js
