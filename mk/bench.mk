# Benchmarks (bench/): TB.CONSUME and friends against plain INCR and the Lua
# token bucket of the seed documents, on servers the driver starts itself on
# free loopback ports.
#
#   make bench         the whole suite (about 9 minutes): writes BENCHMARKS.md,
#                      bench/benchmarks.png, bench/results.json and
#                      docs/bench-summary.md
#   make bench-topkeys only what the TB.TOP sketches cost TB.CONSUME (about
#                      2 minutes; part of make bench), then the report
#   make bench-hotkeys only issue 13's byte streams and hot keys, through the
#                      Python client (about 30 s; part of make bench), then
#                      the report
#   make bench-leases  only issue 18's cost of a write against the leases its
#                      bucket holds (bytes replicated, instructions; about a
#                      minute per server; part of make bench), then the report
#   make bench-fair    only issue 22's fair share of a saturated bucket among
#                      flows (FLOW, 200 + 10 waiting clients through
#                      redis-py), the cost of choosing the next waiter with
#                      up to 100,000 flows and the server's instructions per
#                      grant with 10,000 (about 2 minutes; part of make
#                      bench), then the report
#   make bench-smoke   a tiny run with sanity checks (about 10 s; part of
#                      `make test` through EXTRA_TESTS)

BENCH_VENV := $(CURDIR)/bench/.venv
BENCH_PY := $(BENCH_VENV)/bin/python
BENCH_PIP := matplotlib==3.11.2
# Defaults when this fragment is used without the top Makefile's variables.
MODULE ?= $(CURDIR)/target/release/libtb.so
APT ?= $(CURDIR)/mk/apt.sh
REDIS_SERVER_SYS ?= $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)

.PHONY: bench bench-topkeys bench-hotkeys bench-leases bench-fair bench-smoke bench-deps bench-venv

EXTRA_TESTS += bench-smoke

# valgrind (instruction counts) and perf (profile), from apt when root and
# missing, otherwise the command to run is printed.
bench-deps:
	@missing=""; \
	command -v valgrind >/dev/null 2>&1 || missing="$$missing valgrind"; \
	command -v perf >/dev/null 2>&1 || missing="$$missing linux-perf"; \
	$(APT) "the benchmarks' instruction counts and profile" $$missing

# bench/.venv with matplotlib for the plot (python3-venv from apt if needed).
bench-venv:
	@$(CURDIR)/mk/venv.sh $(BENCH_VENV)
	@$(BENCH_PY) -m pip install --quiet --disable-pip-version-check $(BENCH_PIP)

bench: build redis8 test-deps bench-deps bench-venv python-venv ## the benchmark suite (about 9 min): BENCHMARKS.md and friends
	$(BENCH_PY) bench/bench.py --module $(MODULE) --server $(REDIS_SERVER_SYS) \
	  --server8 "$(REDIS8_SERVER)"
	$(BENCH_PY) bench/topkeys.py --module $(MODULE) --server $(REDIS_SERVER_SYS)
	$(PY) bench/hotkeys.py --module $(MODULE) --server $(REDIS_SERVER_SYS)
	$(BENCH_PY) bench/leases.py --module $(MODULE) --servers $(TEST_SERVERS)
	$(PY) bench/fair.py --module $(MODULE) --server $(REDIS_SERVER_SYS)
	$(BENCH_PY) bench/report.py

bench-leases: build redis8 test-deps bench-deps bench-venv
	$(BENCH_PY) bench/leases.py --module $(MODULE) --servers $(TEST_SERVERS)
	$(BENCH_PY) bench/report.py

# Through the Python client: its venv (mk/python.mk) has redis-py and tb_limiter.
bench-hotkeys: build bench-venv python-venv
	$(PY) bench/hotkeys.py --module $(MODULE) --server $(REDIS_SERVER_SYS)
	$(BENCH_PY) bench/report.py

# Through redis-py (the Python client's venv); tests/fair_cost.rs for the
# queue's own cost; valgrind (bench-deps) for the server's instructions.
bench-fair: build bench-deps bench-venv python-venv
	$(PY) bench/fair.py --module $(MODULE) --server $(REDIS_SERVER_SYS)
	$(BENCH_PY) bench/report.py

bench-topkeys: build bench-deps bench-venv
	$(BENCH_PY) bench/topkeys.py --module $(MODULE) --server $(REDIS_SERVER_SYS)
	$(BENCH_PY) bench/report.py

bench-smoke: build ## a tiny benchmark run with sanity checks (part of make test)
	python3 bench/bench.py --smoke --module $(MODULE) --server $(REDIS_SERVER_SYS)
