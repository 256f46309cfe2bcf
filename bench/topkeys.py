#!/usr/bin/env python3
"""What the heavy-hitter sketches behind TB.TOP cost TB.CONSUME, for `make
bench` (and `make bench-topkeys` alone): the same build, the same server,
with the setting `tb.top-keys` on and off.

Throughput: redis-benchmark on 100k random keys (and one hot key), with and
without pipelining, allowed and denied requests; each round measures the
setting on and off back to back (order alternating), and the ratio of the two
is taken per round, so drift of the shared machine cancels out. Instructions:
callgrind counts per request, on and off, which are exact whatever the load.

Writes bench/results-topkeys.json; bench/report.py puts it in BENCHMARKS.md.
Standard library only, like bench.py, whose helpers it uses.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results-topkeys.json")

# (id, label, command, hot key?, Lua body creating the keys before measuring)
CASES = [
    ("allowed", "TB.CONSUME allowed, 100k keys",
     ["TB.CONSUME", "t:__rand_int__", *B.ACTIVE, "1"], False,
     B.tb_fill("t:", B.ACTIVE, B.ACTIVE_PREWARM)),
    ("denied", "TB.CONSUME denied, 100k keys (every call a new key for the sketch)",
     ["TB.CONSUME", "d:__rand_int__", *B.DENIED, "1"], False,
     B.tb_fill("d:", B.DENIED, "1")),
    ("denied_hot", "TB.CONSUME denied, 1 hot key",
     ["TB.CONSUME", "d:000000000000", *B.DENIED, "1"], True,
     B.tb_fill("d:", B.DENIED, "1")),
]
PIPELINES = [(1, "no pipelining"), (16, "pipelines of 16")]


def set_top_keys(conn, on):
    conn.call("CONFIG", "SET", "tb.top-keys", "yes" if on else "no")


def sketch_memory(conn):
    reply = conn.call("TB.TOP")
    fields = dict(zip(reply[::2], reply[1::2]))
    return fields[b"memory_bytes"]


def throughput(server, rounds, target_s, keyspace, probe):
    for _, _, _, _, fill in CASES:
        B.eval_fill(server.conn, fill, keyspace)
    # Calibration with the sketches on (the slower side): n for about
    # target_s seconds, twice that unpipelined.
    set_top_keys(server.conn, True)
    n_of = {}
    for pipeline, _ in PIPELINES:
        for cid, _, args, hot, _ in CASES:
            n = probe[1] if pipeline > 1 else probe[0]
            r = B.redis_benchmark(server.port, args, n, pipeline, None if hot else keyspace)
            seconds = target_s if pipeline > 1 else 2 * target_s
            n_of[(pipeline, cid)] = max(n, int(r["rps"] * seconds))
    raw = {}
    for rnd in range(rounds):
        i = rnd
        for pipeline, _ in PIPELINES:
            for cid, _, args, hot, _ in CASES:
                i += 1
                order = [True, False] if i % 2 == 0 else [False, True]
                pair = {}
                for on in order:
                    set_top_keys(server.conn, on)
                    pair[on] = B.redis_benchmark(server.port, args, n_of[(pipeline, cid)],
                                                 pipeline, None if hot else keyspace,
                                                 conn=server.conn)
                raw.setdefault((pipeline, cid), []).append(pair)
        B.log("top-keys round %d/%d done (load %.2f)" % (rnd + 1, rounds, os.getloadavg()[0]))
    set_top_keys(server.conn, True)
    groups = []
    for pipeline, plabel in PIPELINES:
        g = {"pipeline": pipeline, "label": plabel, "results": {}}
        for cid, label, args, hot, _ in CASES:
            pairs = raw[(pipeline, cid)]
            ratio = [p[True]["rps"] / p[False]["rps"] for p in pairs]
            cpu = [p[True]["cpu_us"] / p[False]["cpu_us"] for p in pairs]
            p99 = [p[True]["p99_ms"] / p[False]["p99_ms"] for p in pairs]
            g["results"][cid] = {
                "label": label, "command": " ".join(args),
                "rps_on": statistics.median(p[True]["rps"] for p in pairs),
                "rps_off": statistics.median(p[False]["rps"] for p in pairs),
                "ratio": statistics.median(ratio), "ratio_min": min(ratio),
                "ratio_max": max(ratio),
                "cpu_on_us": statistics.median(p[True]["cpu_us"] for p in pairs),
                "cpu_off_us": statistics.median(p[False]["cpu_us"] for p in pairs),
                "cpu_ratio": statistics.median(cpu),
                "p99_ratio": statistics.median(p99),
                "rounds": pairs,
            }
        groups.append(g)
    return groups


def instructions(binary, module, requests):
    """Instructions the server executes per request, on and off (callgrind)."""
    for tool in ("valgrind", "callgrind_control"):
        if not shutil.which(tool):
            return {"error": "%s is not installed (Debian package valgrind)" % tool}
    out_dir = tempfile.mkdtemp(prefix="tb-bench-topkeys-cg-")
    s = B.Server(binary, module, name="callgrind server", start_s=120,
                 prefix=["valgrind", "--tool=callgrind",
                         "--callgrind-out-file=" + os.path.join(out_dir, "cg.out")])
    keyspace = 10_000
    try:
        for _, _, _, _, fill in CASES:
            B.eval_fill(s.conn, fill, keyspace)
        res = {"requests": requests, "per_request": {}}
        pid = str(s.proc.pid)
        for cid, _, args, hot, _ in CASES:
            for on in (True, False):
                set_top_keys(s.conn, on)
                # Warm up first (the sketch fills, the key's entry exists).
                B.redis_benchmark(s.port, args, 2000, 16, None if hot else keyspace, clients=10)
                subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
                B.redis_benchmark(s.port, args, requests, 16, None if hot else keyspace,
                                  clients=10)
                before = set(os.listdir(out_dir))
                name = "%s_%s" % (cid, "on" if on else "off")
                subprocess.run(["callgrind_control", "-d", name, pid], capture_output=True,
                               check=True)
                dump = B.wait_new_file(out_dir, before)
                res["per_request"][name] = B.total_ir(dump) / requests
        return res
    finally:
        s.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default=os.path.join(B.ROOT, "target", "release", "libtb.so"))
    ap.add_argument("--server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--seconds", type=float, default=0.3,
                    help="target length of one pipelined run (unpipelined: twice that)")
    ap.add_argument("--keyspace", type=int, default=B.KEYSPACE)
    ap.add_argument("--callgrind-requests", type=int, default=20000)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args()
    a.module = os.path.abspath(a.module)
    if not os.path.exists(a.module):
        raise SystemExit("module not built: %s (run cargo build --release)" % a.module)
    t0 = time.time()
    results = {"machine": B.machine_info({"official": B.version_of(a.server)}),
               "params": {k: v for k, v in vars(a).items() if k != "out"}}
    B.log("top-keys: throughput on redis %s" % results["machine"]["servers"]["official"])
    s = B.Server(a.server, a.module, name="top-keys server")
    try:
        results["throughput"] = throughput(s, a.rounds, a.seconds, a.keyspace, (5000, 20000))
        results["sketch_memory_bytes"] = sketch_memory(s.conn)
    finally:
        s.stop()
    B.log("top-keys: instructions per request (callgrind)")
    results["instructions"] = instructions(a.server, a.module, a.callgrind_requests)
    results["machine"]["loadavg_end"] = os.getloadavg()[0]
    results["machine"]["run_seconds"] = round(time.time() - t0)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    B.log("wrote %s in %d s" % (a.out, results["machine"]["run_seconds"]))


if __name__ == "__main__":
    main()
