#!/usr/bin/env python3
"""What a write costs against the number of leases its bucket holds, for
`make bench` (and `make bench-leases` alone): issue 18's replication
amplification.

For 0, 1, 64 and 1,024 leases held on one bucket (1,024 is the most a bucket
may hold), a plain granted TB.CONSUME on that bucket:

1. bytes replicated per call: the master's `master_repl_offset` over a run
   of calls, with a replica attached (the same bytes go to the AOF);
2. instructions the server executes per call (valgrind's callgrind: exact
   whatever else runs on the machine), without a replica;

and the same for the calls that change one lease (a lease granted, a lease
released: `TB.CONSUME ... LEASE`, then `TB.RELEASE` of the id it returned),
one call at a time. Every server of `--servers` (Redis 7.0, 8.2, Valkey 8);
writes bench/results-leases.json, which bench/report.py puts in
BENCHMARKS.md.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results-leases.json")

COUNTS = (0, 1, 64, 1024)
RATE, CAPACITY = "1000", "1000000000"
TTL_MS = "3600000"


def key(count):
    """One bucket per lease count, names of equal length."""
    return "lease:%04d" % count


def lease(conn, count):
    r = conn.call("TB.CONSUME", key(count), RATE, CAPACITY, "1", "LEASE", TTL_MS)
    assert r[0] == 1, r
    return r[5]


def fill(conn, count):
    """Makes the bucket of `count` leases (each of one token, an hour);
    returns their ids."""
    conn.call("DEL", key(count))
    conn.call("TB.CONSUME", key(count), RATE, CAPACITY, "1")
    return [lease(conn, count) for _ in range(count)]


def take(conn, count, _ids=None):
    r = conn.call("TB.CONSUME", key(count), RATE, CAPACITY, "1")
    assert r[0] == 1, r


def churn(conn, count, ids):
    """Two calls that change one lease each, the bucket holding `count`
    leases after both: one released (the oldest of `ids`), one granted
    (without leases: one granted, then released)."""
    if ids:
        assert conn.call("TB.RELEASE", key(count), str(ids.pop(0))) is not None
        ids.append(lease(conn, count))
    else:
        assert conn.call("TB.RELEASE", key(count), str(lease(conn, count))) is not None


def repl_offset(conn):
    info = conn.call("INFO", "replication")
    info = info.decode() if isinstance(info, bytes) else info
    for line in info.splitlines():
        if line.startswith("master_repl_offset:"):
            return int(line.split(":")[1])
    raise SystemExit("no master_repl_offset in INFO replication")


def replication_bytes(binary, module, calls):
    """Bytes per call replicated to an attached replica, per lease count."""
    master = B.Server(binary, module, name="master")
    replica = None
    try:
        replica = B.Server(binary, module, extra=("--replicaof", "127.0.0.1", str(master.port)),
                           name="replica")
        deadline = time.time() + 30
        while b"master_link_status:up" not in _bytes(replica.conn.call("INFO", "replication")):
            if time.time() > deadline:
                raise SystemExit("the replica never linked up")
            time.sleep(0.1)
        out = {}
        for count in COUNTS:
            ids = fill(master.conn, count)
            row = {}
            for what, run, per in (("take", take, 1), ("churn", churn, 2)):
                run(master.conn, count, ids)  # a first write may carry a SELECT
                before = repl_offset(master.conn)
                for _ in range(calls):
                    run(master.conn, count, ids)
                row[what] = (repl_offset(master.conn) - before) / (calls * per)
            out[str(count)] = row
        return out
    finally:
        if replica:
            replica.stop()
        master.stop()


def _bytes(x):
    return x if isinstance(x, bytes) else str(x).encode()


def instructions(binary, module, requests):
    """Instructions per call, per lease count, with callgrind."""
    for tool in ("valgrind", "callgrind_control"):
        if not shutil.which(tool):
            return {"error": "%s is not installed (Debian package valgrind)" % tool}
    out_dir = tempfile.mkdtemp(prefix="tb-bench-leases-cg-")
    s = B.Server(binary, module, name="callgrind server", start_s=120,
                 prefix=["valgrind", "--tool=callgrind",
                         "--callgrind-out-file=" + os.path.join(out_dir, "cg.out")])
    pid = str(s.proc.pid)
    try:
        out = {}
        for count in COUNTS:
            ids = fill(s.conn, count)
            row = {}
            phases = (
                ("take", lambda: B.redis_benchmark(
                    s.port, ["TB.CONSUME", key(count), RATE, CAPACITY, "1"], requests, 16, None,
                    clients=10), requests),
                ("churn", lambda: [churn(s.conn, count, ids) for _ in range(requests // 20)],
                 2 * (requests // 20)),
            )
            for what, run, n in phases:
                subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
                run()
                before = set(os.listdir(out_dir))
                name = "%s_%d" % (what, count)
                subprocess.run(["callgrind_control", "-d", name, pid], capture_output=True,
                               check=True)
                row[what] = B.total_ir(B.wait_new_file(out_dir, before)) / n
            out[str(count)] = row
        return out
    finally:
        s.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def server_name(binary):
    return "%s %s" % ("Valkey" if "valkey" in binary else "Redis", B.version_of(binary))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default=os.path.join(B.ROOT, "target", "release", "libtb.so"))
    ap.add_argument("--servers", nargs="+",
                    default=[shutil.which("redis-server") or "/usr/bin/redis-server"])
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--callgrind-requests", type=int, default=10000)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    a.module = os.path.abspath(a.module)
    if not os.path.exists(a.module):
        raise SystemExit("module not built: %s (run cargo build --release)" % a.module)
    servers = [s for s in a.servers if s]
    results = {"machine": B.machine_info({server_name(s): B.version_of(s) for s in servers}),
               "params": {"counts": list(COUNTS), "calls": a.calls,
                          "callgrind_requests": a.callgrind_requests},
               "servers": {}}
    for binary in servers:
        name = server_name(binary)
        B.log("leases: %s: bytes replicated per call" % name)
        row = {"bytes": replication_bytes(binary, a.module, a.calls)}
        B.log("leases: %s: instructions per call (callgrind)" % name)
        row["instructions"] = instructions(binary, a.module, a.callgrind_requests)
        results["servers"][name] = row
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    B.log("leases: wrote %s" % a.out)


if __name__ == "__main__":
    main()
