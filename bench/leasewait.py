#!/usr/bin/env python3
"""Waiting for leases, for `make bench`: calls per lease grant against the
number of waiters, server-side (`BLOCK ms` with `LEASE`) against the
client polling it replaces.

N workers share one tenant's limits: requests per minute, tokens per
minute (an estimate of 100 tokens per call, leased) and an in-flight limit
of 4 (leased), in one `TB.MCONSUME`. Each worker, in
a loop for the run's length: gets its leases, holds them for HOLD_S (the
"call"), releases them. Waiting, it either sends one `TB.MCONSUME ... BLOCK
ms` (the server queues it, first come first served) or polls without BLOCK,
sleeping the reply's `retry_after_ms` (at least 10 ms, jittered, at most
1 s) between tries, as the Lua fallback's clients do. Figures: TB.MCONSUME
calls per grant (from INFO commandstats), grants, and how many of the
workers were served at least once.

`bench.py` calls `measure()`; `report.py` calls `render()`.
"""

import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resp import Conn  # noqa: E402

#: Waiters per case.
WAITERS = (10, 40, 60)
#: How long a worker holds its leases (the call it makes).
HOLD_S = 0.2
#: The limits: RPM, TPM (100 tokens a call), in flight.
LIMITS = [("{t}rpm", "1200/m", "100", "1"), ("{t}tpm", "120000/m", "2000", "100"),
          ("{t}slots", "0", "4", "1")]
#: Lease TTL of the TPM estimate and the slot (ms).
TTL_MS = "30000"
#: How long one BLOCK waits at most (ms).
BLOCK_MS = "5000"


def mconsume(block):
    keys = [k for k, _, _, _ in LIMITS]
    limits = [x for _, rate, cap, n in LIMITS for x in (rate, cap, n)]
    args = ["TB.MCONSUME", str(len(keys)), *keys, *limits,
            "LEASE", "2", TTL_MS, "LEASE", "3", TTL_MS]
    if block:
        args += ["BLOCK", BLOCK_MS]
    return args


def worker(port, block, stop_at, served, idx):
    c = Conn(port, timeout=30)
    call = mconsume(block)
    while time.time() < stop_at:
        r = c.call(*call)
        if r[0] != 1:
            if block:
                continue
            wait = r[1] / 1000 if r[1] >= 0 else 0.05
            time.sleep(min(max(wait, 0.01) * random.uniform(0.5, 1.5), 1.0))
            continue
        served[idx] += 1
        time.sleep(HOLD_S)
        k = len(LIMITS)
        ids = r[2 + k:]
        c.call("TB.RELEASE", LIMITS[1][0], str(ids[1]))
        c.call("TB.RELEASE", LIMITS[2][0], str(ids[2]))
    c.close()


def run_case(server_cls, binary, module, waiters, block, seconds):
    s = server_cls(binary, module, name="lease-wait server")
    try:
        served = [0] * waiters
        stop_at = time.time() + seconds
        threads = [threading.Thread(target=worker, args=(s.port, block, stop_at, served, i))
                   for i in range(waiters)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stats = s.conn.info("commandstats").get("cmdstat_tb.mconsume", "calls=0,")
        calls = int(stats.split(",")[0].split("=")[1])
        grants = sum(served)
        return {"waiters": waiters, "block": block, "seconds": seconds, "calls": calls,
                "grants": grants, "calls_per_grant": calls / grants if grants else None,
                "served_workers": sum(1 for x in served if x)}
    finally:
        s.stop()


def measure(server_cls, binary, module, seconds, log):
    out = {"server": None, "hold_s": HOLD_S, "limits": LIMITS, "cases": []}
    for n in WAITERS:
        for block in (True, False):
            r = run_case(server_cls, binary, module, n, block, seconds)
            log("lease waiting: %d waiters, %s: %d calls for %d grants" % (
                n, "BLOCK" if block else "polling", r["calls"], r["grants"]))
            out["cases"].append(r)
    return out


def render(w):
    """BENCHMARKS.md lines for results.json's `lease_wait`."""
    L = ["## Waiting for leases\n"]
    L.append(
        "N workers share one tenant's limits in one `TB.MCONSUME`: RPM `%s` (capacity %s), "
        "TPM `%s` (capacity %s, 100 tokens leased per call) and in flight %s (leased); each "
        "gets its leases, holds them %.1f s, releases them, for %.0f s. Server-side waiting "
        "is one `TB.MCONSUME ... BLOCK %s` per try (the server queues it, first come first "
        "served); polling sleeps the reply's `retry_after_ms` (at least 10 ms, jittered, at "
        "most 1 s) between tries, as clients of the Lua fallback do. Each worker's last wait "
        "runs out when the run ends: up to N calls without a grant are counted.\n" % (
            LIMITS[0][1], LIMITS[0][2], LIMITS[1][1], LIMITS[1][2], LIMITS[2][2], w["hold_s"],
            w["cases"][0]["seconds"], BLOCK_MS))
    L.append("| waiters | waiting | TB.MCONSUME calls | grants | calls per grant | "
             "workers served |")
    L.append("|---:|---|---:|---:|---:|---:|")
    for c in w["cases"]:
        cpg = "—" if c["calls_per_grant"] is None else "%.2f" % c["calls_per_grant"]
        L.append("| %d | %s | %s | %s | %s | %d of %d |" % (
            c["waiters"], "server-side (BLOCK)" if c["block"] else "client polling",
            "{:,}".format(c["calls"]), "{:,}".format(c["grants"]), cpg,
            c["served_workers"], c["waiters"]))
    L.append("")
    return L
