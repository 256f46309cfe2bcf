#!/usr/bin/env python3
"""Byte streams and hot keys through the Python client, for `make bench` (and
`make bench-hotkeys` alone): issue 13's chunked grants and batches.

1. Calls per second of one byte stream (10 MB/s, 64 KiB chunks, a burst of
   a tenth of a second), counted by the server (INFO commandstats): `tb_limiter.stream.pace_sync`
   (ATMOST MIN chunk) against the loop the docs used to suggest (ATMOST, then
   sleep the denial's wait, the wait for one byte).
2. Grants per second on one key from 4 processes, a rate that never limits:
   one TB.CONSUME per grant against `bucket.batched(100)`.
3. The same 4 processes on a key that does limit (rate 20,000/s, capacity
   2,000), plus a fifth that is not batching and acquires one token every
   20 ms: the admitted total (tokens the processes handed out) audited
   against capacity + rate * T, the server's own count of tokens granted
   less those given back, and the worst wait the fifth process saw, with
   per-call neighbours and with batching neighbours.

Runs with the Python client's venv (redis-py and tb_limiter); writes
bench/results-hotkeys.json, which bench/report.py puts in BENCHMARKS.md.
"""

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402

import redis  # noqa: E402
from tb_limiter import Limiter  # noqa: E402
from tb_limiter.stream import pace_sync  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results-hotkeys.json")

STREAM_RATE = 10_000_000
STREAM_CHUNK = 64 * 1024
STREAM_CAPACITY = STREAM_RATE // 10  # a tenth of a second, as docs/examples.md suggests
PROCS = 4
BATCH = 100
LIMIT_RATE, LIMIT_CAP = 20_000, 2_000
MAX_HOLD = 0.1
HOLD = 0.02


def consume_calls(conn):
    stats = conn.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items()
               if k in ("cmdstat_tb.consume", "cmdstat_tb.mconsume"))


def stream_calls(port, seconds):
    """Calls per second of one stream: pace_sync, then the one-byte loop."""
    r = redis.Redis(port=port)
    lim = Limiter(r)
    out = {}
    total = int(STREAM_RATE * seconds)
    bw = lim.bucket("bw:pace", STREAM_RATE, STREAM_CAPACITY)
    before, start = consume_calls(r), time.monotonic()
    sent = sum(len(p) for p in pace_sync((b"x" * STREAM_CHUNK for _ in range(total // STREAM_CHUNK)),
                                         bw, chunk=STREAM_CHUNK))
    elapsed = time.monotonic() - start
    calls = consume_calls(r) - before
    out["pace"] = {"calls": calls, "seconds": elapsed, "bytes": sent, "calls_per_s": calls / elapsed,
                   "mb_per_s": sent / elapsed / 1e6}
    naive = lim.bucket("bw:naive", STREAM_RATE, STREAM_CAPACITY)
    left = total // STREAM_CHUNK * STREAM_CHUNK
    before, start = consume_calls(r), time.monotonic()
    while left > 0:
        g = naive.consume(min(left, STREAM_CHUNK), atmost=True)
        if g.allowed:
            left -= g.granted
        else:
            time.sleep(g.retry_after)
    elapsed = time.monotonic() - start
    calls = consume_calls(r) - before
    out["one_byte_wait"] = {"calls": calls, "seconds": elapsed, "bytes": sent, "calls_per_s": calls / elapsed,
                            "mb_per_s": sent / elapsed / 1e6}
    out["rate"], out["chunk"], out["capacity"] = STREAM_RATE, STREAM_CHUNK, STREAM_CAPACITY
    r.close()
    return out


def worker(port, key, rate, cap, batched, seconds, go, results):
    """Grants as many tokens as it can for `seconds`, one at a time."""
    lim = Limiter.from_url("redis://127.0.0.1:%d/0" % port)
    bucket = lim.bucket(key, rate, cap)
    bucket.peek()
    go.wait()
    start = time.monotonic()
    stop = start + seconds
    got = calls = 0
    local = bucket.batched(BATCH, hold=HOLD, max_hold=MAX_HOLD) if batched else None
    while time.monotonic() < stop:
        if local is not None:
            r = local.consume()
            if r is None or r.allowed:
                got += 1
            if r is not None:
                calls += 1
        else:
            r = bucket.consume()
            calls += 1
            if r.allowed:
                got += 1
        if r is not None and not r.allowed:
            time.sleep(r.retry_after)
    given_back = 0
    if local is not None:
        held = local.held
        local.close()
        given_back = local._ledger.given_back
        assert local.handed_out == got and held >= 0
    results.put({"granted": got, "calls": calls, "given_back": given_back,
                 "start": start, "end": time.monotonic()})


def prober(port, key, rate, cap, seconds, go, results):
    """Not batching: acquires one token every 20 ms; records each wait."""
    lim = Limiter.from_url("redis://127.0.0.1:%d/0" % port)
    bucket = lim.bucket(key, rate, cap)
    bucket.peek()
    go.wait()
    start = time.monotonic()
    stop = start + seconds
    waits = []
    while time.monotonic() < stop:
        t = time.monotonic()
        bucket.acquire(timeout=30)
        waits.append(time.monotonic() - t)
        time.sleep(0.02)
    results.put({"prober": True, "waits": waits, "start": start, "end": time.monotonic()})


def tokens_granted(conn):
    for section in ("tb", "tb_stats"):
        info = conn.info(section)
        for k, v in info.items():
            if k.endswith("tokens_granted"):
                return int(v)
    raise SystemExit("INFO has no tokens_granted field")


def run_fleet(port, key, rate, cap, batched, seconds, probe):
    ctx = mp.get_context("fork")
    go, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(port, key, rate, cap, batched, seconds, go, results))
             for _ in range(PROCS)]
    if probe:
        procs.append(ctx.Process(target=prober, args=(port, key, rate, cap, seconds, go, results)))
    conn = redis.Redis(port=port)
    for p in procs:
        p.start()
    time.sleep(0.5)  # every process connected and waiting on the event
    granted_before = tokens_granted(conn)
    go.set()
    out = [results.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    granted_after = tokens_granted(conn)
    workers = [o for o in out if "prober" not in o]
    waits = [w for o in out if "prober" in o for w in o["waits"]]
    span = max(o["end"] for o in out) - min(o["start"] for o in out)
    res = {
        "batched": batched,
        "granted": sum(o["granted"] for o in workers),
        "calls": sum(o["calls"] for o in workers),
        "given_back": sum(o["given_back"] for o in workers),
        "seconds": span,
        "grants_per_s": sum(o["granted"] for o in workers) / span,
        "server_granted": granted_after - granted_before,
    }
    if probe:
        res["probe_acquires"] = len(waits)
        res["admitted"] = res["granted"] + len(waits)
        res["probe_worst_wait_ms"] = max(waits) * 1000
        res["probe_median_wait_ms"] = sorted(waits)[len(waits) // 2] * 1000
        res["bound"] = cap + rate * span
    conn.close()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default=os.path.join(B.ROOT, "target", "release", "libtb.so"))
    ap.add_argument("--server", default="/usr/bin/redis-server")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    s = B.Server(a.server, a.module, name="hot-keys server")
    try:
        B.log("stream calls per second")
        stream = stream_calls(s.port, a.seconds)
        B.log("pace: %.1f calls/s; one-byte waits: %.1f calls/s"
              % (stream["pace"]["calls_per_s"], stream["one_byte_wait"]["calls_per_s"]))
        hot = {}
        for batched in (False, True):
            name = "batched" if batched else "per_call"
            hot[name] = run_fleet(s.port, "hot:" + name, 1_000_000_000, 1_000_000_000, batched, a.seconds, False)
            B.log("%s: %.0f grants/s from %d processes" % (name, hot[name]["grants_per_s"], PROCS))
        limited = {}
        for batched in (False, True):
            name = "batched" if batched else "per_call"
            r = run_fleet(s.port, "lim:" + name, LIMIT_RATE, LIMIT_CAP, batched, a.seconds, True)
            r["server_net"] = r["server_granted"] - r["given_back"]
            B.log("%s (limited): admitted %d (server: granted %d, given back %d, net %d), bound %.0f; "
                  "non-batching client's worst wait %.1f ms"
                  % (name, r["admitted"], r["server_granted"], r["given_back"], r["server_net"], r["bound"],
                     r["probe_worst_wait_ms"]))
            if not r["admitted"] <= r["server_net"] <= r["bound"]:
                raise SystemExit("audit failed: admitted %d, server net %d, capacity + rate * T = %.0f"
                                 % (r["admitted"], r["server_net"], r["bound"]))
            limited[name] = r
    finally:
        s.stop()
    results = {
        "server": B.version_of(a.server),
        "machine": {"cpus": os.cpu_count()},
        "procs": PROCS, "batch": BATCH, "hold_s": HOLD, "max_hold_s": MAX_HOLD,
        "limit": {"rate": LIMIT_RATE, "capacity": LIMIT_CAP},
        "stream": stream, "hot": hot, "limited": limited,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    B.log("wrote %s" % a.out)


if __name__ == "__main__":
    main()
