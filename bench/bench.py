#!/usr/bin/env python3
"""Benchmark driver behind `make bench`: TB.CONSUME and friends against plain
INCR and the client-side Lua token bucket (bench/token_bucket.lua), on servers
this script starts itself on free loopback ports.

Every throughput and latency figure is also kept as a ratio to INCR measured in
the same round, because absolute numbers on a shared machine drift. Results go
to bench/results.json; bench/report.py turns them into BENCHMARKS.md and the
plot. Standard library only; run `bench.py --help` for the knobs.
"""

import argparse
import csv
import io
import json
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import leasewait  # noqa: E402
import neighbours  # noqa: E402
from resp import Conn, ReplyError, encode  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "tbharness"))
import tbharness  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
LUA_FILE = os.path.join(HERE, "token_bucket.lua")

# Bucket parameters of the cases (see BENCHMARKS.md for the reasoning).
ACTIVE = ("100", "1000000000")          # rate/s, capacity: a bucket in use
ACTIVE_PREWARM = "10000000"             # taken once per key: stays non-full for ~1 day
BYTES = ("1000000000", "1000000000000000")  # 1 GB/s, 1 PB burst
BYTES_N = "65536"
BYTES_PREWARM = "10000000000000"
DENIED = ("1/h", "1")                   # one token an hour, already taken
IDLE = ("100", "100")                   # seed 004's example: capacity 100, 100/s
LUA_DENIED_RATE = "0.00027777777777778"  # 1/h for the script, which takes a float

KEYSPACE = 100_000


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


class Server(tbharness.Server):
    """A server with the module on a free loopback port, stopped by pid
    (tools/tbharness), with a RESP connection ``conn``; exits the benchmark
    with the server's log when it does not start."""

    def __init__(self, binary, module, extra=(), name="server", prefix=(), start_s=15):
        try:
            super().__init__(binary=binary, module=module, extra=list(extra), prefix=prefix,
                             start_deadline=start_s)
        except RuntimeError as e:
            raise SystemExit("%s did not start: %s" % (name, e))
        self.conn = Conn(self.port)

    def stop(self, keep_dir=False, deadline=30):
        self.conn.close()
        super().stop(keep_dir=keep_dir, deadline=deadline)

    def used_memory(self):
        return int(self.conn.info("memory")["used_memory"])


def version_of(binary):
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"v=(\S+)", out) or re.search(r"(\d+\.\d+\.\d+)", out)
    return m.group(1) if m else out.strip()


def machine_info(servers):
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem_gib = round(kb / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    git = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "src"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory_gib": mem_gib,
        "kernel": platform.release(),
        "servers": servers,
        "redis_benchmark": subprocess.run(["redis-benchmark", "--version"], capture_output=True,
                                          text=True).stdout.strip(),
        "module_commit": git + (" + local changes in src/" if dirty else ""),
        "loadavg_start": os.getloadavg()[0],
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


# --------------------------------------------------------------------------
# redis-benchmark

def server_cpu(conn):
    """CPU seconds used by the server's main thread (all threads on old servers)."""
    info = conn.info("cpu")
    if "used_cpu_user_main_thread" in info:
        return float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"])
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_benchmark(port, args, n, pipeline, keyspace, clients=50, conn=None):
    """One redis-benchmark run; with `conn`, also the server CPU per request,
    which other jobs on the machine disturb far less than wall-clock rates."""
    cmd = ["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "-c", str(clients),
           "-n", str(n), "-P", str(pipeline), "--csv"]
    if keyspace:
        cmd += ["-r", str(keyspace)]
    cmd += list(args)
    cpu0 = server_cpu(conn) if conn else None
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    elapsed = time.time() - t0
    cpu_us = (server_cpu(conn) - cpu0) * 1e6 / n if conn else None
    text = p.stdout + p.stderr
    if p.returncode != 0 or "Error" in text or "ERR" in text:
        raise SystemExit("redis-benchmark failed: %s\n%s" % (" ".join(cmd), text[-2000:]))
    rows = [r for r in csv.reader(io.StringIO(p.stdout)) if r and r[0] != "test"]
    if not rows:
        raise SystemExit("no CSV line from redis-benchmark: %s\n%s" % (" ".join(cmd), text))
    r = rows[-1]
    return {"rps": float(r[1]), "avg_ms": float(r[2]), "p50_ms": float(r[4]),
            "p95_ms": float(r[5]), "p99_ms": float(r[6]), "max_ms": float(r[7]),
            "cpu_us": cpu_us, "n": n, "seconds": round(elapsed, 3)}


def key(prefix, hot):
    return prefix + ("000000000000" if hot else "__rand_int__")


def tb_fill(prefix, params, n):
    """Lua body creating the bucket `prefix%012d` with TB.CONSUME."""
    return "redis.call('TB.CONSUME', string.format('%s%%012d', i), '%s', '%s', '%s')" % (
        prefix, params[0], params[1], n)


def cases():
    """Every throughput case: id, label, command (hot key or random keys), and
    how its keys are created before measuring: a Lua loop body for EVAL, or the
    script's own arguments (run through EVALSHA)."""
    lua = lambda sha, k, cap, rate: ["EVALSHA", sha, "1", k, cap, rate, "-", "1"]  # noqa: E731
    tb = lambda k, params, n="1": ["TB.CONSUME", k, *params, n]  # noqa: E731
    return [
        {"id": "incr", "label": "INCR", "args": lambda sha, h: ["INCR", key("i:", h)],
         "fill": ["redis.call('INCR', string.format('i:%012d', i))"]},
        {"id": "tb", "label": "TB.CONSUME n=1",
         "args": lambda sha, h: tb(key("t:", h), ACTIVE),
         "fill": [tb_fill("t:", ACTIVE, ACTIVE_PREWARM)]},
        {"id": "lua", "label": "Lua script (EVALSHA)",
         "args": lambda sha, h: lua(sha, key("l:", h), ACTIVE[1], ACTIVE[0]),
         "fill_script": ("l:", ACTIVE[1], ACTIVE[0])},
        {"id": "throttle", "label": "CL.THROTTLE",
         "args": lambda sha, h: ["CL.THROTTLE", key("c:", h), "999999999", ACTIVE[0], "1"],
         "fill": [tb_fill("c:", ACTIVE, ACTIVE_PREWARM)]},
        {"id": "tb_bytes", "label": "TB.CONSUME n=65536 (bytes)",
         "args": lambda sha, h: tb(key("b:", h), BYTES, BYTES_N),
         "fill": [tb_fill("b:", BYTES, BYTES_PREWARM)]},
        {"id": "tb_denied", "label": "TB.CONSUME denied",
         "args": lambda sha, h: tb(key("d:", h), DENIED),
         "fill": [tb_fill("d:", DENIED, "1")]},
        {"id": "lua_denied", "label": "Lua script denied",
         "args": lambda sha, h: lua(sha, key("e:", h), DENIED[1], LUA_DENIED_RATE),
         "fill_script": ("e:", DENIED[1], LUA_DENIED_RATE)},
        {"id": "tb_reserve", "label": "TB.CONSUME RESERVE 1000",
         "args": lambda sha, h: tb(key("r:", h), ACTIVE) + ["RESERVE", "1000"],
         "fill": [tb_fill("r:", ACTIVE, ACTIVE_PREWARM)]},
        {"id": "tb_multi", "label": "TB.MCONSUME, 2 buckets",
         "args": lambda sha, h: ["TB.MCONSUME", "2", key("ma:", h), key("mb:", h),
                                 *ACTIVE, "1", *ACTIVE, "1"],
         "fill": [tb_fill("ma:", ACTIVE, ACTIVE_PREWARM), tb_fill("mb:", ACTIVE, ACTIVE_PREWARM)]},
        {"id": "tb_idle", "label": "TB.CONSUME, idle buckets", "random_only": True,
         "args": lambda sha, h: tb(key("x:", h), IDLE)},
        {"id": "lua_idle", "label": "Lua script, idle buckets", "random_only": True,
         "args": lambda sha, h: lua(sha, key("y:", h), IDLE[1], IDLE[0])},
    ]


GROUPS = [  # (id, label, hot key?, pipeline)
    ("hot_p1", "1 hot key, no pipelining", True, 1),
    ("hot_p16", "1 hot key, pipelines of 16", True, 16),
    ("rand_p1", "100k random keys, no pipelining", False, 1),
    ("rand_p16", "100k random keys, pipelines of 16", False, 16),
]


def prewarm(conn, sha, all_cases, keyspace):
    """Creates every case's keys before measuring, so each call finds the
    steady state it is meant to measure (idle cases excepted)."""
    for c in all_cases:
        for body in c.get("fill", []):
            eval_fill(conn, body, keyspace)
        if "fill_script" in c:
            script_fill(conn, sha, keyspace, *c["fill_script"])


def throughput(server, sha, rounds, target_s, keyspace, probe=(5000, 20000)):
    all_cases = cases()
    log("prewarming %d keys for each of %d cases" % (keyspace, len(all_cases)))
    prewarm(server.conn, sha, all_cases, keyspace)
    plan = []
    for gid, glabel, hot, pipeline in GROUPS:
        for c in all_cases:
            if hot and c.get("random_only"):
                continue
            plan.append((gid, c, hot, pipeline))
    # Calibration: a short run per case sets n for about target_s seconds.
    n_of = {}
    for gid, c, hot, pipeline in plan:
        n = probe[1] if pipeline > 1 else probe[0]
        r = redis_benchmark(server.port, c["args"](sha, hot), n, pipeline,
                            None if hot else keyspace)
        # Unpipelined runs get twice as long: their p99 is a target.
        seconds = target_s if pipeline > 1 else 2 * target_s
        n_of[(gid, c["id"])] = max(n, int(r["rps"] * seconds))
    log("calibrated %d cases; %d rounds" % (len(plan), rounds))
    raw = {}
    for rnd in range(rounds):
        for gid, glabel, hot, pipeline in GROUPS:
            members = [p for p in plan if p[0] == gid]
            shift = rnd % len(members)  # rotate the order each round
            for _, c, hot_, pipe_ in members[shift:] + members[:shift]:
                r = redis_benchmark(server.port, c["args"](sha, hot_), n_of[(gid, c["id"])], pipe_,
                                    None if hot_ else keyspace, conn=server.conn)
                raw.setdefault(gid, {}).setdefault(c["id"], []).append(r)
        log("round %d/%d done (load %.2f)" % (rnd + 1, rounds, os.getloadavg()[0]))
    out = {"groups": [], "cases": {c["id"]: {"label": c["label"], "command": " ".join(
        c["args"]("<sha>", False))} for c in all_cases}}
    for gid, glabel, hot, pipeline in GROUPS:
        g = {"id": gid, "label": glabel, "pipeline": pipeline, "hot": hot, "results": {}}
        incr = raw[gid]["incr"]
        for cid, runs in raw[gid].items():
            ratio = [r["rps"] / i["rps"] for r, i in zip(runs, incr)]
            p99_ratio = [r["p99_ms"] / i["p99_ms"] for r, i in zip(runs, incr)]
            p50_ratio = [r["p50_ms"] / i["p50_ms"] for r, i in zip(runs, incr)]
            cpu_ratio = [r["cpu_us"] / i["cpu_us"] for r, i in zip(runs, incr)]
            g["results"][cid] = {
                "rps": statistics.median(r["rps"] for r in runs),
                "p50_ms": statistics.median(r["p50_ms"] for r in runs),
                "p99_ms": statistics.median(r["p99_ms"] for r in runs),
                "ratio": statistics.median(ratio),
                "ratio_min": min(ratio), "ratio_max": max(ratio),
                "p50_ratio": statistics.median(p50_ratio),
                "p99_ratio": statistics.median(p99_ratio),
                "cpu_us": statistics.median(r["cpu_us"] for r in runs),
                "cpu_ratio": statistics.median(cpu_ratio),
                "rounds": runs,
            }
        out["groups"].append(g)
    return out


# --------------------------------------------------------------------------
# profile: where TB.CONSUME's time goes, next to INCR

PROFILE_SYMBOLS = [
    ("RedisModuleCommandDispatcher", "module command dispatch, everything below included"),
    ("tb::commands::consume::run", "TB.CONSUME handler, everything below included"),
    ("RM_OpenKey", "open the key: lookup, expiry check, key handle allocation"),
    ("tb::glue::store::BucketKey::get", "read the value: robj -> module value -> bucket (cache misses)"),
    ("tb::bucket::consume", "token-bucket arithmetic"),
    ("tb::glue::store::commit", "write: value, expiry, replication"),
    ("RM_SetAbsExpire", "set the key's expiry (two dict lookups)"),
    ("RM_Replicate", "replicate TB.SETSTATE"),
    ("lookupCommandByCString", "  of which: look the command name up (every call)"),
    ("moduleCreateArgvFromUserFormat", "  of which: build the argument objects"),
    ("tb::glue::reply::Replier::ints", "reply with five integers"),
    ("processMultibulkBuffer", "parse requests (all commands)"),
    ("writeToClient", "write replies (all commands)"),
]


def commandstats(conn):
    out = {}
    for k, v in conn.info("commandstats").items():
        if k.startswith("cmdstat_"):
            fields = dict(kv.split("=") for kv in v.split(","))
            out[k[len("cmdstat_"):]] = {"calls": int(fields["calls"]),
                                        "usec_per_call": float(fields["usec_per_call"])}
    return out


def profile(server, sha, keyspace, perf_seconds):
    """Server CPU per call from INFO commandstats for INCR, TB.CONSUME and the
    script, and a perf call-graph profile of the server under TB.CONSUME."""
    out = {"commandstats": {}, "perf": None, "perf_error": None}
    for cid, args in [("incr", ["INCR", "i:__rand_int__"]),
                      ("tb", ["TB.CONSUME", "t:__rand_int__", *ACTIVE, "1"]),
                      ("lua", ["EVALSHA", sha, "1", "l:__rand_int__", ACTIVE[1], ACTIVE[0], "-", "1"])]:
        server.conn.call("CONFIG", "RESETSTAT")
        r = redis_benchmark(server.port, args, 300000 if cid != "lua" else 60000, 16, keyspace)
        stats = commandstats(server.conn)
        name = {"incr": "incr", "tb": "tb.consume", "lua": "evalsha"}[cid]
        out["commandstats"][cid] = {"rps": r["rps"], **stats[name]}
    perf = shutil.which("perf")
    if not perf:
        out["perf_error"] = "perf is not installed (Debian package linux-perf)"
        return out
    data = os.path.join(server.dir, "perf.data")
    load = subprocess.Popen(["redis-benchmark", "-h", "127.0.0.1", "-p", str(server.port),
                             "-c", "50", "-n", "100000000", "-P", "16", "-r", str(keyspace),
                             "-q", "TB.CONSUME", "t:__rand_int__", *ACTIVE, "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        rec = subprocess.run([perf, "record", "-F", "499", "--call-graph", "dwarf,16384",
                              "-p", str(server.proc.pid), "-o", data, "--", "sleep",
                              str(perf_seconds)], capture_output=True, text=True)
    finally:
        load.kill()
        load.wait()
    if rec.returncode != 0 or not os.path.exists(data):
        out["perf_error"] = "perf record failed: " + (rec.stderr.strip().splitlines() or ["?"])[-1]
        return out
    rep = subprocess.run([perf, "report", "-i", data, "--children", "--stdio", "-g", "none",
                          "--sort", "symbol", "--percent-limit", "0.2"],
                         capture_output=True, text=True)
    found = {}
    for line in rep.stdout.splitlines():
        m = re.match(r"^\s*([\d.]+)%\s+([\d.]+)%\s+\[[.k]\]\s+(.+?)(\s+-\s+-)?\s*$", line)
        if m and m.group(3) not in found:
            found[m.group(3)] = (float(m.group(1)), float(m.group(2)))
    if not found:
        out["perf_error"] = "perf report gave no samples: " + rep.stderr.strip()[-300:]
        return out
    out["perf"] = [{"symbol": s, "what": what, "children": found.get(s, (None, None))[0],
                    "self": found.get(s, (None, None))[1]} for s, what in PROFILE_SYMBOLS]
    top_self = sorted(found.items(), key=lambda kv: -kv[1][1])[:12]
    out["perf_top_self"] = [{"symbol": s, "self": v[1]} for s, v in top_self]
    return out


# --------------------------------------------------------------------------
# instructions per request (callgrind): deterministic, unlike timings

CALLGRIND_SYMBOLS = [
    ("call", "the command itself (Redis call(), everything below)"),
    ("processMultibulkBuffer", "parse the request"),
    ("RedisModuleCommandDispatcher", "module dispatch: context set-up and teardown, below"),
    ("tb::commands::consume::run", "TB.CONSUME handler, below"),
    ("tb::parse::rate", "parse the rate"),
    ("RM_OpenKey", "open the key (lookup, expiry check, handle allocation)"),
    ("tb::bucket::consume", "token-bucket arithmetic"),
    ("tb::glue::reply::Replier::ints", "reply with five integers"),
    ("tb::glue::store::commit", "write the bucket, its expiry, replicate"),
    ("RM_SetAbsExpire", "set the expiry"),
    ("RM_Replicate", "replicate TB.SETSTATE (even with no replica attached)"),
    ("lookupCommandByCString", "look up the command name, every call"),
    ("moduleCreateArgvFromUserFormat", "build one string object per argument"),
    ("incrDecrCommand", "INCR's own work"),
    ("evalGenericCommand", "the script call, everything below"),
]


def instructions(binary, module, lua_src, requests):
    """Instructions the server executes per request, with callgrind, for INCR,
    TB.CONSUME (allowed and denied) and the Lua script, and TB.CONSUME's
    instructions by function."""
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if not shutil.which(tool):
            return {"error": "%s is not installed (Debian package valgrind)" % tool}
    out_dir = tempfile.mkdtemp(prefix="tb-bench-cg-")
    s = Server(binary, module, name="callgrind server", start_s=120,
               prefix=["valgrind", "--tool=callgrind",
                       "--callgrind-out-file=" + os.path.join(out_dir, "cg.out")])
    keyspace = 10_000
    try:
        sha = s.conn.call("SCRIPT", "LOAD", lua_src).decode()
        eval_fill(s.conn, tb_fill("t:", ACTIVE, ACTIVE_PREWARM), keyspace)
        eval_fill(s.conn, tb_fill("d:", DENIED, "1"), keyspace)
        eval_fill(s.conn, "redis.call('INCR', string.format('i:%012d', i))", keyspace)
        script_fill(s.conn, sha, keyspace, "l:", ACTIVE[1], ACTIVE[0])
        phases = [
            ("incr", ["INCR", "i:__rand_int__"], requests),
            ("tb", ["TB.CONSUME", "t:__rand_int__", *ACTIVE, "1"], requests),
            ("tb_denied", ["TB.CONSUME", "d:__rand_int__", *DENIED, "1"], requests),
            ("lua", ["EVALSHA", sha, "1", "l:__rand_int__", ACTIVE[1], ACTIVE[0], "-", "1"],
             max(1000, requests // 4)),
        ]
        res = {"requests": requests, "per_request": {}, "functions": {}}
        pid = str(s.proc.pid)
        for name, args, n in phases:
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
            redis_benchmark(s.port, args, n, 16, keyspace, clients=10)
            before = set(os.listdir(out_dir))
            subprocess.run(["callgrind_control", "-d", name, pid], capture_output=True,
                           check=True)
            dump = wait_new_file(out_dir, before)
            res["per_request"][name] = total_ir(dump) / n
            res["functions"][name] = {sym: ir / n for sym, ir in inclusive_ir(dump).items()}
        return res
    finally:
        s.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def abandoned_instructions(binary, module, conns):
    """Server instructions per abandoned waiter, with callgrind: `conns`
    connections, one after another, each sending AUTH and one blocking call
    and hanging up (neighbours.py's floods, unhurried), per kind; serverCron's
    share (which follows the wall time, stretched by valgrind) left out.
    Steadier than a victim's p99 on a shared machine."""
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if not shutil.which(tool):
            return {"error": "%s is not installed (Debian package valgrind)" % tool}
    out_dir = tempfile.mkdtemp(prefix="tb-bench-cg-")
    s = Server(binary, module, name="callgrind server", start_s=120,
               prefix=["valgrind", "--tool=callgrind",
                       "--callgrind-out-file=" + os.path.join(out_dir, "cg.out")])
    try:
        s.conn.call("ACL", "SETUSER", "attacker", "on", ">" + neighbours.PASSWORD,
                    *neighbours.USERS["attacker"])
        auth = encode(["AUTH", "attacker", neighbours.PASSWORD])
        res = {"connections": conns, "per_connection": {}}
        pid = str(s.proc.pid)
        for kind, args in neighbours.ABANDONED.items():
            wire = auth + (encode(args) if args else b"")
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
            for _ in range(conns):
                so = socket.create_connection(("127.0.0.1", s.port))
                so.sendall(wire)
                so.recv(5)  # +OK of AUTH: the call was read with it
                time.sleep(0.002)
                so.close()
            time.sleep(0.5)
            before = set(os.listdir(out_dir))
            subprocess.run(["callgrind_control", "-d", kind, pid], capture_output=True,
                           check=True)
            dump = wait_new_file(out_dir, before)
            cron = inclusive_ir(dump).get("serverCron", 0)
            res["per_connection"][kind] = (total_ir(dump) - cron) / conns
        return res
    finally:
        s.stop()
        shutil.rmtree(out_dir, ignore_errors=True)


def wait_new_file(directory, before, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        new = sorted(set(os.listdir(directory)) - before)
        if new:
            path = os.path.join(directory, new[0])
            size = -1
            while os.path.getsize(path) != size:  # wait until the dump is written
                size = os.path.getsize(path)
                time.sleep(0.2)
            return path
        time.sleep(0.1)
    raise SystemExit("callgrind wrote no dump in %s" % directory)


def total_ir(path):
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise SystemExit("no totals in %s" % path)


def inclusive_ir(path):
    rep = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True).stdout
    found = {}
    for line in rep.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\([\s\d.]+%\)\s+\S*?:(\S+) \[", line)
        if m and m.group(2) not in found:
            found[m.group(2)] = int(m.group(1).replace(",", ""))
    return found


# --------------------------------------------------------------------------
# memory per bucket

def eval_fill(conn, body, count, start=0, chunk=200_000):
    """Runs `body` (Lua, with the key index in `i`) for i in [start, count)."""
    script = "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do %s end return 1" % body
    for lo in range(start, count, chunk):
        conn.call("EVAL", script, "0", lo, min(count, lo + chunk) - 1)


def memory(binary, module, sha_src, count):
    """used_memory per key after creating `count` keys of each kind."""
    s = Server(binary, module, name="memory server")
    try:
        sha = s.conn.call("SCRIPT", "LOAD", sha_src).decode()
        kinds = [
            ("tb", "t:", "TB.CONSUME bucket",
             lambda: eval_fill(s.conn, tb_fill("t:", ACTIVE, ACTIVE_PREWARM), count)),
            ("lua", "l:", "Lua script's hash",
             lambda: script_fill(s.conn, sha, count, "l:", ACTIVE[1], ACTIVE[0])),
            ("set_px", "p:", "string with expiry (SET k 1 PX)",
             lambda: eval_fill(s.conn, "redis.call('SET', string.format('p:%012d', i), '1', "
                               "'PX', '86400000')", count)),
            ("incr", "i:", "INCR counter (no expiry)",
             lambda: eval_fill(s.conn, "redis.call('INCR', string.format('i:%012d', i))", count)),
        ]
        out = {"server": version_of(binary), "count": count, "key_length": 14, "kinds": {}}
        for kid, prefix, label, fill in kinds:
            s.conn.call("FLUSHALL")
            before = s.used_memory()
            fill()
            after = s.used_memory()
            n = s.conn.call("DBSIZE")
            if n != count:
                raise SystemExit("memory: %s created %d keys, not %d" % (kid, n, count))
            ttl = s.conn.call("PTTL", "%s%012d" % (prefix, 7))
            out["kinds"][kid] = {"label": label, "bytes_per_key": (after - before) / count,
                                 "has_expiry": ttl > 0}
        return out
    finally:
        s.stop()


def script_fill(conn, sha, count, prefix, capacity, rate):
    """Runs the Lua script once on each key `prefix%012d` for i < count."""
    batch = 50_000
    for lo in range(0, count, batch):
        cmds = [["EVALSHA", sha, "1", "%s%012d" % (prefix, i), capacity, rate, "-", "1"]
                for i in range(lo, min(count, lo + batch))]
        for r in conn.pipeline(cmds):
            if isinstance(r, ReplyError):
                raise SystemExit("script fill failed: %s" % r)


# --------------------------------------------------------------------------
# throughput against the number of buckets

def scaling(binary, module, stages, rounds, target_s):
    s = Server(binary, module, name="scaling server")
    try:
        out = {"stages": []}
        filled = 0
        for stage in stages:
            t0 = time.time()
            eval_fill(s.conn, tb_fill("s:", ACTIVE, ACTIVE_PREWARM), stage, start=filled)
            eval_fill(s.conn, "redis.call('INCR', string.format('j:%012d', i))", stage,
                      start=filled)
            filled = stage
            log("scaling: %d buckets filled in %.1f s" % (stage, time.time() - t0))
            n = {}
            for cid, args in [("incr", ["INCR", "j:__rand_int__"]),
                              ("tb", ["TB.CONSUME", "s:__rand_int__", *ACTIVE, "1"])]:
                r = redis_benchmark(s.port, args, 20000, 16, stage)
                n[cid] = (args, max(20000, int(r["rps"] * target_s)))
            runs = {"incr": [], "tb": []}
            for _ in range(rounds):
                for cid in ("incr", "tb"):
                    args, count = n[cid]
                    runs[cid].append(redis_benchmark(s.port, args, count, 16, stage, conn=s.conn))
            ratio = [t["rps"] / i["rps"] for t, i in zip(runs["tb"], runs["incr"])]
            cpu = [t["cpu_us"] / i["cpu_us"] for t, i in zip(runs["tb"], runs["incr"])]
            out["stages"].append({
                "buckets": stage,
                "dbsize": s.conn.call("DBSIZE"),
                "incr_rps": statistics.median(r["rps"] for r in runs["incr"]),
                "tb_rps": statistics.median(r["rps"] for r in runs["tb"]),
                "ratio": statistics.median(ratio),
                "cpu_ratio": statistics.median(cpu),
                "used_memory": s.used_memory(),
            })
        return out
    finally:
        s.stop()


# --------------------------------------------------------------------------
# replication stream bytes per call

def replication(binary, module, sha_src, calls):
    master = Server(binary, module, ["--repl-diskless-sync-delay", "0"], name="master")
    replica = None
    capture = None
    try:
        replica = Server(binary, module, ["--replicaof", "127.0.0.1", str(master.port)],
                         name="replica")
        deadline = time.time() + 30
        while replica.conn.info("replication").get("master_link_status") != "up":
            if time.time() > deadline:
                raise SystemExit("replica did not sync:\n" + replica.log_tail())
            time.sleep(0.05)
        sha = master.conn.call("SCRIPT", "LOAD", sha_src).decode()
        capture_path = os.path.join(master.dir, "stream.txt")
        capture_file = open(capture_path, "w")
        capture = subprocess.Popen(["redis-cli", "-p", str(master.port), "--replica"],
                                   stdout=capture_file, stderr=subprocess.STDOUT)
        time.sleep(1.0)

        def tb(k, params, n="1"):
            return ["TB.CONSUME", k, *params, n]

        def lua(k, cap, rate):
            return ["EVALSHA", sha, "1", k, cap, rate, "-", "1"]

        def throttle(k, burst, count, period):
            return ["CL.THROTTLE", k, burst, count, period]

        # (id, label, the measured call on key i, the call that prepares key i
        # first, whether to wait for the keys to expire before reading).
        kinds = [
            ("incr", "INCR", lambda k: ["INCR", k], None, False),
            ("tb", "TB.CONSUME allowed", lambda k: tb(k, ACTIVE),
             lambda k: tb(k, ACTIVE, ACTIVE_PREWARM), False),
            ("tb_denied", "TB.CONSUME denied", lambda k: tb(k, DENIED),
             lambda k: tb(k, DENIED), False),
            ("lua", "Lua script allowed", lambda k: lua(k, ACTIVE[1], ACTIVE[0]),
             lambda k: lua(k, ACTIVE[1], ACTIVE[0]), False),
            ("lua_denied", "Lua script denied", lambda k: lua(k, DENIED[1], LUA_DENIED_RATE),
             lambda k: lua(k, DENIED[1], LUA_DENIED_RATE), False),
            ("throttle", "CL.THROTTLE allowed",
             lambda k: throttle(k, "999999999", ACTIVE[0], "1"),
             lambda k: tb(k, ACTIVE, ACTIVE_PREWARM), False),
            ("throttle_denied", "CL.THROTTLE denied", lambda k: throttle(k, "0", "1", "3600"),
             lambda k: throttle(k, "0", "1", "3600"), False),
            ("tb_multi", "TB.MCONSUME allowed, 2 buckets",
             lambda k: ["TB.MCONSUME", "2", "a" + k, "b" + k, *ACTIVE, "1", *ACTIVE, "1"],
             lambda k: [tb("a" + k, ACTIVE, ACTIVE_PREWARM), tb("b" + k, ACTIVE, ACTIVE_PREWARM)],
             False),
            ("tb_idle", "TB.CONSUME allowed, idle bucket, with its key's expiry",
             lambda k: tb(k, IDLE), None, True),
            ("lua_idle", "Lua script allowed, idle bucket, with its key's expiry",
             lambda k: lua(k, IDLE[1], IDLE[0]), None, True),
        ]
        out = {"server": version_of(binary), "calls": calls, "key_length": 14, "kinds": {}}
        for kid, label, make, setup, drain in kinds:
            master.conn.call("FLUSHALL")  # no key of an earlier case expires from here on
            names = ["k:%012d" % i for i in range(calls)]
            if setup:
                prep = []
                for k in names:
                    made = setup(k)
                    prep.extend(made if isinstance(made[0], list) else [made])
                master.conn.pipeline(prep)
            before = int(master.conn.info("replication")["master_repl_offset"])
            replies = master.conn.pipeline([make(k) for k in names])
            if drain:
                deadline = time.time() + 20
                while master.conn.call("DBSIZE") > 0:
                    if time.time() > deadline:
                        raise SystemExit("replication case %s: keys did not expire" % kid)
                    time.sleep(0.05)
            after = int(master.conn.info("replication")["master_repl_offset"])
            errors = [r for r in replies if isinstance(r, ReplyError)]
            if errors:
                raise SystemExit("replication case %s: %s" % (kid, errors[0]))
            allowed = sum(1 for r in replies if allowed_reply(kid, r))
            out["kinds"][kid] = {"label": label, "bytes_per_call": (after - before) / calls,
                                 "allowed_fraction": allowed / calls}
        time.sleep(1.0)
        capture.terminate()
        capture.wait()
        capture_file.close()
        out["samples"] = stream_samples(capture_path)
        return out
    finally:
        if capture and capture.poll() is None:
            capture.kill()
            capture.wait()
        if replica:
            replica.stop()
        master.stop()


def allowed_reply(kid, r):
    if kid == "incr":
        return True
    if kid.startswith("lua"):
        return r == 1
    if kid.startswith("throttle"):
        return r[0] == 0
    return r[0] == 1


def stream_samples(path):
    """The first replicated line of each command kind, as redis-cli shows it."""
    samples = {}
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return samples
    block = []
    for line in lines:
        if not line.startswith('"'):
            continue
        name = line.split('"')[1].upper()
        if name == "MULTI":
            block = [line]
            continue
        if block:
            block.append(line)
            if name == "EXEC":
                inner = block[1].split('"')[1].upper()
                samples.setdefault("MULTI " + inner, "\n".join(block))
                block = []
            continue
        if name not in ("SELECT", "PING", "FLUSHALL"):
            samples.setdefault(name, line)
    return samples


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default=os.path.join(ROOT, "target", "release", "libtb.so"))
    ap.add_argument("--server", default=shutil.which("redis-server") or "/usr/bin/redis-server",
                    help="the official server (Debian's 7.0.15)")
    ap.add_argument("--server8", default=None,
                    help="a second server (Redis 8) for the memory and replication figures")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=0.4,
                    help="target length of one pipelined run (unpipelined: twice that)")
    ap.add_argument("--keyspace", type=int, default=KEYSPACE)
    ap.add_argument("--memory-buckets", type=int, default=1_000_000)
    ap.add_argument("--scaling", default="1000,1000000,10000000")
    ap.add_argument("--replication-calls", type=int, default=2000)
    ap.add_argument("--perf-seconds", type=float, default=2.0)
    ap.add_argument("--callgrind-requests", type=int, default=20000)
    ap.add_argument("--neighbours-seconds", type=float, default=5.0,
                    help="length of each noisy-neighbour scenario (bench/neighbours.py)")
    ap.add_argument("--neighbours-rounds", type=int, default=5)
    ap.add_argument("--lease-wait-seconds", type=float, default=10.0,
                    help="length of each lease-waiting case (bench/leasewait.py)")
    ap.add_argument("--only", choices=["neighbours", "lease_wait"],
                    help="measure only this part and update it in the existing --out file")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"))
    ap.add_argument("--smoke", action="store_true",
                    help="tiny sizes and sanity checks only (for `make bench-smoke`)")
    ap.add_argument("--only-memory", action="store_true",
                    help="measure only the memory per bucket (on --server and --server8) and "
                         "replace that part of the existing results file, noting when and at "
                         "which commit: allocation sizes do not depend on the machine's load, "
                         "so they can be re-measured without re-running everything")
    a = ap.parse_args()
    # redis-server changes to its --dir before loading modules.
    a.module = os.path.abspath(a.module)
    if a.smoke:
        a.rounds, a.seconds, a.keyspace = 1, 0.05, 1000
        a.memory_buckets, a.scaling, a.replication_calls = 10000, "1000", 200
        # Two seconds: a connection flood's connects can stall a whole second
        # on a loaded machine (listen backlog full, the SYN resent after 1 s),
        # and the check below wants attacker calls inside the window.
        a.neighbours_seconds, a.neighbours_rounds = 2.0, 1
        a.lease_wait_seconds = 1.0
    for tool in ("redis-benchmark", "redis-cli"):
        if not shutil.which(tool):
            raise SystemExit("%s is missing (Debian package redis-tools)" % tool)
    if not os.path.exists(a.module):
        raise SystemExit("module not built: %s (run cargo build --release)" % a.module)
    with open(LUA_FILE) as f:
        lua_src = f.read()
    if a.only_memory:
        with open(a.out) as f:
            results = json.load(f)
        binaries = [a.server] + ([a.server8] if a.server8 else [])
        info = machine_info({"official": version_of(a.server)})
        results["memory"] = []
        for binary in binaries:
            log("memory per bucket on %s" % version_of(binary))
            m = memory(binary, a.module, lua_src, a.memory_buckets)
            results["memory"].append(m)
            for k in m["kinds"].values():
                log("  %-34s %6.1f bytes per key" % (k["label"], k["bytes_per_key"]))
        results["memory_run"] = {"date_utc": info["date_utc"], "module_commit": info["module_commit"]}
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        log("replaced the memory figures in %s" % a.out)
        return
    t_start = time.time()
    if a.only == "lease_wait":
        with open(a.out) as f:
            results = json.load(f)
        results["lease_wait"] = run_lease_wait(a)
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        log("updated the lease-waiting figures in %s in %d s" % (a.out, time.time() - t_start))
        return
    if a.only == "neighbours":
        with open(a.out) as f:
            results = json.load(f)
        results["neighbours"] = run_neighbours(a)
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        log("updated the noisy-neighbour figures in %s in %d s" % (a.out, time.time() - t_start))
        return
    servers = {"official": version_of(a.server)}
    if a.server8:
        servers["second"] = version_of(a.server8)
    results = {"machine": machine_info(servers), "params": vars(a).copy()}
    results["params"].pop("out")

    log("throughput on redis %s, module %s" % (servers["official"], a.module))
    main_server = Server(a.server, a.module, name="throughput server")
    try:
        sha = main_server.conn.call("SCRIPT", "LOAD", lua_src).decode()
        results["throughput"] = throughput(main_server, sha, a.rounds, a.seconds, a.keyspace,
                                           (500, 2000) if a.smoke else (5000, 20000))
        if not a.smoke:
            log("profile")
            results["profile"] = profile(main_server, sha, a.keyspace, a.perf_seconds)
    finally:
        main_server.stop()

    if not a.smoke:
        log("instructions per request (callgrind)")
        results["instructions"] = instructions(a.server, a.module, lua_src,
                                               a.callgrind_requests)

    results["memory"] = []
    results["replication"] = []
    for binary in [a.server] + ([a.server8] if a.server8 else []):
        log("memory per bucket on %s" % version_of(binary))
        results["memory"].append(memory(binary, a.module, lua_src, a.memory_buckets))
        log("replication bytes on %s" % version_of(binary))
        results["replication"].append(replication(binary, a.module, lua_src,
                                                  a.replication_calls))
    log("throughput against the number of buckets")
    stages = [int(x) for x in a.scaling.split(",")]
    results["scaling"] = scaling(a.server, a.module, stages, 3 if not a.smoke else 1, a.seconds)
    results["neighbours"] = run_neighbours(a)
    results["lease_wait"] = run_lease_wait(a)
    results["machine"]["loadavg_end"] = os.getloadavg()[0]
    results["machine"]["run_seconds"] = round(time.time() - t_start)
    if a.smoke:
        check_smoke(results)
        log("smoke run passed in %d s" % results["machine"]["run_seconds"])
        return
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    log("wrote %s in %d s" % (a.out, results["machine"]["run_seconds"]))


def run_neighbours(a):
    """The noisy-neighbour figures (bench/neighbours.py), on the official
    server; what a waiting client holds, on every server."""
    log("noisy neighbours on %s" % version_of(a.server))
    out = neighbours.measure(Server, a.server, a.module, a.neighbours_seconds,
                             a.neighbours_rounds, [a.server] + ([a.server8] if a.server8 else []),
                             smoke=a.smoke)
    log("instructions per abandoned waiter (callgrind)")
    out["abandoned_instructions"] = abandoned_instructions(a.server, a.module,
                                                           100 if a.smoke else 1000)
    return out


def run_lease_wait(a):
    """Calls per lease grant against the number of waiters (bench/leasewait.py)."""
    log("lease waiting on %s" % version_of(a.server))
    out = leasewait.measure(Server, a.server, a.module, a.lease_wait_seconds, log)
    out["server"] = version_of(a.server)
    return out


def check_smoke(results):
    """Sanity checks of a smoke run: every case ran, and the replication
    contract holds (denials propagate nothing, every write propagates)."""
    problems = []
    for g in results["throughput"]["groups"]:
        for cid, r in g["results"].items():
            if not r["rps"] > 0:
                problems.append("%s/%s: no throughput" % (g["id"], cid))
    for rep in results["replication"]:
        k = rep["kinds"]
        if k["tb_denied"]["bytes_per_call"] != 0 or k["tb_denied"]["allowed_fraction"] != 0:
            problems.append("denied TB.CONSUME replicated %s bytes" % k["tb_denied"])
        if not k["tb"]["bytes_per_call"] > 0 or k["tb"]["allowed_fraction"] != 1:
            problems.append("allowed TB.CONSUME: %s" % k["tb"])
    for m in results["memory"]:
        if not m["kinds"]["tb"]["has_expiry"]:
            problems.append("buckets have no expiry")
    for kind, sc in results["neighbours"]["scenarios"].items():
        if not sc["calls"] > 0 or (kind != "quiet" and not sc["attacker_per_s"] > 0):
            problems.append("neighbours/%s did not run: %s" % (kind, sc))
    if problems:
        raise SystemExit("smoke check failed:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main()
