# Release artifacts.
#
#   make dist        target/dist/tb-VERSION-linux-ARCH.tar.gz and its .sha256
#                    (mk/dist.sh lists what is inside)
#   make install     libtb.so, redis.conf.example and the Prometheus
#                    exporter script tb-metrics.lua into PREFIX (default
#                    /opt/tb, where docs/operations/configuration.md loads them
#                    from); DESTDIR=... stages them for a package
#   make test-dist   from a fresh clone of the current commit: make dist,
#                    check its sums and contents, make install, load both on
#                    every server of TEST_SERVERS, and make run (part of
#                    `make test`; mk/test-dist.sh)

TB_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' $(CURDIR)/Cargo.toml | head -n1)
DIST_NAME := tb-$(TB_VERSION)-linux-$(shell uname -m)
DIST_DIR := $(CURDIR)/target/dist
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
CARGO ?= cargo
PREFIX ?= /opt/tb

.PHONY: dist install test-dist

EXTRA_TESTS += test-dist

dist: build ## release tarball in target/dist (module, config, exporter script, docs, sums)
	$(CURDIR)/mk/dist.sh $(MODULE) $(DIST_DIR) $(DIST_NAME)

# Builds first when cargo is on PATH; `sudo make install` (whose PATH often
# has no cargo) installs what `make build` built.
install: ## install libtb.so, redis.conf.example, tb-metrics.lua into PREFIX (/opt/tb)
	@if command -v $(CARGO) >/dev/null 2>&1; then \
	  $(MAKE) --no-print-directory build; \
	elif [ ! -f $(MODULE) ]; then \
	  echo "error: $(MODULE) is not built and cargo is not on PATH: run 'make build' first" >&2; \
	  exit 1; \
	fi
	install -d $(DESTDIR)$(PREFIX)
	install -m 0755 $(MODULE) $(DESTDIR)$(PREFIX)/libtb.so
	sed 's|^loadmodule /opt/tb/libtb.so|loadmodule $(PREFIX)/libtb.so|' $(CURDIR)/redis.conf.example \
	  > $(DESTDIR)$(PREFIX)/redis.conf.example
	chmod 0644 $(DESTDIR)$(PREFIX)/redis.conf.example
	install -m 0644 $(CURDIR)/contrib/prometheus/tb-metrics.lua $(DESTDIR)$(PREFIX)/tb-metrics.lua
	@echo "==> installed $(DESTDIR)$(PREFIX)/libtb.so; load it with: loadmodule $(PREFIX)/libtb.so"

test-dist: redis8 test-deps ## make dist/install/run from a fresh clone; load on every server
	$(CURDIR)/mk/test-dist.sh $(TEST_SERVERS)
