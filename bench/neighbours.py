#!/usr/bin/env python3
"""Noisy neighbours, for `make bench`: what one tenant's limiter calls do to
another tenant on the server they share.

Two ACL users confined to their own keys (`victim` on `v:*`, `attacker` on
`a:*`, each allowed only limiter commands; the attacker also PING) share one
server with `maxmemory 64mb` and `noeviction`. The victim makes unpipelined
TB.CONSUME calls on its own buckets and records each call's latency and any
error, while the attacker runs, in turn:

- nothing (quiet);
- an unpipelined PING flood: the reference, what any client can always do;
- a connection flood without the limiter (connect, PING, hang up): what
  the next attack costs the server before any limiter command;
- a flood of abandoned BLOCKs, the issue's: connect, `TB.CONSUME a:x 200 1 1
  BLOCK 60000`, hang up;
- the same flood of abandoned BLPOPs (connect, `BLPOP a:l 60`, hang up):
  Redis' own blocking command, the reference for the two BLOCK floods;
- a flood of abandoned lease waits: connect, `TB.CONSUME a:s 0 1 1 LEASE
  60000 BLOCK 60000` (the slot is held: each waits), hang up;
- a stream of TB.MCONSUMEs naming as many keys as the module accepts, 1 KB
  each.

The streams (PING, TB.MCONSUME) come from one connection each, as fast as
it goes unpipelined; the connection floods from CONNECTORS processes, to
reach the issue's rate (20,000 BLOCKs in 3 s). The goal: in every scenario
the victim's p99 is within 1.5x of its p99 under the PING flood, and no
victim call fails. The connection flood without the limiter tells what the
abandoned-BLOCK flood costs because it is a connection flood.

`bench.py` calls `measure()`; `report.py` calls `render()`. Run as
`neighbours.py attack KIND PORT` it is one attacker process (until killed).
"""

import os
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resp import Conn, ReplyError, encode  # noqa: E402

#: Processes of the connection floods (each opens connections in a loop).
CONNECTORS = 4
#: Processes (one connection each) per scenario.
PROCESSES = {"quiet": 0, "ping": 1, "mconsume": 1, "churn": CONNECTORS, "block": CONNECTORS,
             "blpop": CONNECTORS, "leaseblock": CONNECTORS}
#: The victim's buckets: a steady state of existing keys.
VICTIM_KEYS = 1000
VICTIM_CALL = ("1000", "1000000", "1")  # rate, capacity, n: always allowed
#: The abandoned BLOCKs of the issue: one bucket of capacity 1 refilled 200
#: times a second, each BLOCK reserving one token (a fresh bucket per run).
BLOCK_CALL = ("200", "1", "1", "BLOCK", "60000")
#: The abandoned lease waits: an in-flight limit of 1 whose slot is held.
LEASE_BLOCK_CALL = ("0", "1", "1", "LEASE", "60000", "BLOCK", "60000")
#: The abandoned waiters whose server instructions bench.py counts with
#: callgrind (connect, AUTH, the call, hang up); `auth` alone is the baseline.
ABANDONED = {
    "auth": None,
    "ping": ["PING"],
    "blpop": ["BLPOP", "a:l", "60"],
    "block": ["TB.CONSUME", "a:x", *BLOCK_CALL],
    "leaseblock": ["TB.CONSUME", "a:s", *LEASE_BLOCK_CALL],
}
#: Key length of the MCONSUME stream, and the most keys it asks for (the
#: module's own limit, read from its error, applies if lower).
MCONSUME_KEY_BYTES = 1024
MCONSUME_KEYS = 1000
#: Goal: the victim's p99 within this factor of its p99 under the PING flood.
GOAL = 1.5
USERS = {
    "victim": ["resetkeys", "~v:*", "resetchannels", "-@all", "+tb.consume"],
    "attacker": ["resetkeys", "~a:*", "resetchannels", "-@all", "+tb.consume",
                 "+tb.mconsume", "+ping", "+blpop"],
}
PASSWORD = "neighbour-pw"
SCENARIOS = [
    ("quiet", "quiet: no other tenant"),
    ("ping", "unpipelined PING flood (the reference)"),
    ("churn", "connection flood without the limiter (connect, PING, hang up)"),
    ("block", "abandoned-BLOCK flood (connect, TB.CONSUME a:x 200 1 1 BLOCK 60000, hang up)"),
    ("blpop", "abandoned-BLPOP flood (connect, BLPOP a:l 60, hang up)"),
    ("leaseblock", "abandoned lease-wait flood (connect, TB.CONSUME a:s 0 1 1 LEASE 60000 "
                   "BLOCK 60000, hang up)"),
    ("mconsume", "TB.MCONSUME stream, 1 KB keys"),
]


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def login(port, user):
    c = Conn(port, timeout=30)
    c.call("AUTH", user, PASSWORD)
    return c


def mconsume_keys(admin):
    """The most keys one TB.MCONSUME may name, capped at MCONSUME_KEYS."""
    try:
        admin.call("TB.MCONSUME", str(MCONSUME_KEYS + 1), "x", "1", "1", "1")
    except ReplyError as e:
        text = str(e)
        if "from 1 to " in text:
            return min(MCONSUME_KEYS, int(text.split("from 1 to ")[1].split()[0]))
    return MCONSUME_KEYS


# --------------------------------------------------------------------------
# the attacker (a process of its own, until killed)

def attack(kind, port, keys, run):
    if kind == "ping":
        c = login(port, "attacker")
        while True:
            c.call("PING")
    elif kind in ("block", "churn", "blpop", "leaseblock"):
        auth = encode(["AUTH", "attacker", PASSWORD])
        wire = {
            "churn": encode(["PING"]),
            "block": encode(["TB.CONSUME", "a:x:%s" % run, *BLOCK_CALL]),
            "blpop": encode(["BLPOP", "a:l:%s" % run, "60"]),
            "leaseblock": encode(["TB.CONSUME", "a:s:%s" % run, *LEASE_BLOCK_CALL]),
        }[kind]
        while True:
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(auth + wire)
            s.close()
    elif kind == "mconsume":
        c = login(port, "attacker")
        names = ["a:m:%d:%d:" % (os.getpid(), i) for i in range(keys)]
        names = [n + "k" * (MCONSUME_KEY_BYTES - len(n)) for n in names]
        wire = encode(["TB.MCONSUME", str(keys), *names, *(["1000", "1000000", "1"] * keys)])
        while True:
            c.sock.sendall(wire)
            r = c.read()
            if isinstance(r, ReplyError):
                raise SystemExit("attacker's TB.MCONSUME failed: %s" % r)
    else:
        raise SystemExit("unknown attack %r" % kind)


# --------------------------------------------------------------------------
# the measurement

def commandstats_calls(conn):
    out = {}
    for k, v in conn.info("commandstats").items():
        if k.startswith("cmdstat_"):
            out[k[len("cmdstat_"):]] = int(v.split(",")[0].split("=")[1])
    return out


def victim_run(port, admin, seconds):
    """Unpipelined TB.CONSUME calls for `seconds`: latencies (ms), failures,
    and the peak of used_memory sampled every 100 ms on the admin link."""
    c = login(port, "victim")
    lat, failed, errors = [], 0, {}
    peak = int(admin.info("memory")["used_memory"])
    end = time.perf_counter() + seconds
    next_sample = 0.0
    i = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if now >= next_sample:
            peak = max(peak, int(admin.info("memory")["used_memory"]))
            next_sample = time.perf_counter() + 0.1
        i += 1
        wire = encode(["TB.CONSUME", "v:%d" % (i % VICTIM_KEYS), *VICTIM_CALL])
        t0 = time.perf_counter()
        try:
            c.sock.sendall(wire)
            r = c.read()
        except OSError as e:
            r = ReplyError("connection: %s" % e)
            c = login(port, "victim")
        lat.append((time.perf_counter() - t0) * 1000)
        if isinstance(r, ReplyError):
            failed += 1
            errors[str(r)[:60]] = errors.get(str(r)[:60], 0) + 1
    c.close()
    return lat, failed, errors, peak


def server_cpu_s(conn):
    """The server's CPU time so far (user + system), in seconds."""
    cpu = conn.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def percentile(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def scenario(server, kind, seconds, keys, run=0):
    admin = server.conn
    procs = []
    before = commandstats_calls(admin)
    tb_before = admin.info("tb")
    if kind != "quiet":
        me = os.path.abspath(__file__)
        procs.extend(subprocess.Popen([sys.executable, me, "attack", kind,
                                       str(server.port), str(keys), "%s:%s" % (kind, run)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                     for _ in range(PROCESSES[kind]))
        # Measure once the attack is under way, as the server sees it.
        name = {"ping": "ping", "churn": "ping", "block": "tb.consume", "blpop": "blpop",
                "leaseblock": "tb.consume", "mconsume": "tb.mconsume"}[kind]
        deadline = time.time() + 30
        while commandstats_calls(admin).get(name, 0) - before.get(name, 0) < 10 * len(procs):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                errs = [p.stderr.read().decode(errors="replace")[-500:] for p in procs
                        if p.poll() is not None]
                raise SystemExit("neighbours: the %s attack did not start: %s" % (kind, errs))
            time.sleep(0.05)
        before = commandstats_calls(admin)
        tb_before = admin.info("tb")
    t0 = time.time()
    cpu0 = server_cpu_s(admin)
    try:
        lat, failed, errors, peak = victim_run(server.port, admin, seconds)
    finally:
        elapsed = time.time() - t0
        cpu = server_cpu_s(admin) - cpu0
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    after = commandstats_calls(admin)
    tb_after = admin.info("tb")
    attacker_calls = {
        "ping": after.get("ping", 0) - before.get("ping", 0),
        "churn": after.get("ping", 0) - before.get("ping", 0),
        "block": after.get("tb.consume", 0) - before.get("tb.consume", 0) - len(lat),
        "leaseblock": after.get("tb.consume", 0) - before.get("tb.consume", 0) - len(lat),
        "blpop": after.get("blpop", 0) - before.get("blpop", 0),
        "mconsume": after.get("tb.mconsume", 0) - before.get("tb.mconsume", 0),
        "quiet": 0,
    }[kind]
    blocked = int(tb_after["tb_blocked_total"]) - int(tb_before["tb_blocked_total"])
    # Let abandoned waiters' reply buffers drain before the next scenario.
    deadline = time.time() + 30
    while int(admin.info("tb")["tb_blocked_now"]) > 0 and time.time() < deadline:
        time.sleep(0.1)
    return {
        "calls": len(lat), "failed": failed, "errors": errors,
        "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
        "p999_ms": percentile(lat, 99.9), "max_ms": max(lat),
        "attacker_per_s": attacker_calls / elapsed, "blocked_per_s": blocked / elapsed,
        "peak_used_memory": peak,
        # Server CPU per attacker call (the victim's calls included, the
        # same in every scenario): steadier than a p99 on a shared machine.
        "cpu_us_per_attacker_call": cpu * 1e6 / attacker_calls if attacker_calls else None,
    }


def waiting_memory(server_cls, binary, module, waiters):
    """used_memory per client waiting in BLOCK, on its own server."""
    s = server_cls(binary, module, name="waiting-memory server")
    try:
        s.conn.call("EVAL", "for i = 0, %d do redis.call('TB.CONSUME', 'w:' .. i, '1/m', '1') "
                    "end return 1" % (waiters - 1), "0")
        socks = []
        # Connections first (their own memory is not the waiters'), then BLOCK.
        for _ in range(waiters):
            socks.append(socket.create_connection(("127.0.0.1", s.port)))
        deadline = time.time() + 30
        while int(s.conn.info("clients")["connected_clients"]) < waiters + 1:
            if time.time() > deadline:
                raise SystemExit("waiting memory: the connections were not accepted")
            time.sleep(0.05)
        before = int(s.conn.info("memory")["used_memory"])
        for i, so in enumerate(socks):
            so.sendall(encode(["TB.CONSUME", "w:%d" % i, "1/m", "1", "1", "BLOCK", "60000"]))
        deadline = time.time() + 30
        while int(s.conn.info("tb")["tb_blocked_now"]) < waiters:
            if time.time() > deadline:
                raise SystemExit("waiting memory: not every client blocked")
            time.sleep(0.05)
        after = int(s.conn.info("memory")["used_memory"])
        for so in socks:
            so.close()
        return {"server": s.conn.info("server").get("redis_version"), "waiters": waiters,
                "bytes_per_waiter": (after - before) / waiters}
    finally:
        s.stop()


def measure(server_cls, binary, module, seconds, rounds, servers_for_memory, smoke=False):
    """Runs every scenario `rounds` times (rotating their order) for
    `seconds` each; returns the figures for results.json."""
    s = server_cls(binary, module, ["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"],
                   name="neighbours server")
    try:
        for user, rules in USERS.items():
            s.conn.call("ACL", "SETUSER", user, "on", ">" + PASSWORD, *rules)
        s.conn.call("EVAL", "for i = 0, %d do redis.call('TB.CONSUME', 'v:' .. i, '%s', '%s') "
                    "end return 1" % (VICTIM_KEYS - 1, VICTIM_CALL[0], VICTIM_CALL[1]), "0")
        keys = mconsume_keys(s.conn)
        info = s.conn.info("memory")
        out = {"server": s.conn.info("server").get("redis_version"), "seconds": seconds,
               "rounds": rounds, "processes": PROCESSES, "mconsume_keys": keys,
               "mconsume_key_bytes": MCONSUME_KEY_BYTES, "maxmemory": int(info["maxmemory"]),
               "used_memory_start": int(info["used_memory"]), "goal": GOAL, "scenarios": {}}
        runs = {k: [] for k, _ in SCENARIOS}
        for rnd in range(rounds):
            order = SCENARIOS[rnd % len(SCENARIOS):] + SCENARIOS[:rnd % len(SCENARIOS)]
            for kind, _ in order:
                runs[kind].append(scenario(s, kind, seconds, keys, rnd))
            log("neighbours: round %d/%d done (load %.2f)" % (rnd + 1, rounds,
                                                              os.getloadavg()[0]))
        for kind, label in SCENARIOS:
            rs = runs[kind]
            errors = {}
            for r in rs:
                for e, n in r["errors"].items():
                    errors[e] = errors.get(e, 0) + n
            out["scenarios"][kind] = {
                "label": label,
                "calls": sum(r["calls"] for r in rs),
                "failed": sum(r["failed"] for r in rs),
                "errors": errors,
                "p50_ms": statistics.median(r["p50_ms"] for r in rs),
                "p99_ms": statistics.median(r["p99_ms"] for r in rs),
                # Against the PING flood of the same round: the machine's
                # other load changes between rounds, less within one.
                "p99_ratio": statistics.median(
                    r["p99_ms"] / p["p99_ms"] for r, p in zip(rs, runs["ping"])),
                "p99_ratio_churn": statistics.median(
                    r["p99_ms"] / p["p99_ms"] for r, p in zip(rs, runs["churn"])),
                # Against the abandoned-BLPOP flood of the same round: the
                # module's share against Redis' own blocking command's.
                "p99_ratio_blpop": statistics.median(
                    r["p99_ms"] / p["p99_ms"] for r, p in zip(rs, runs["blpop"])),
                "p999_ms": statistics.median(r["p999_ms"] for r in rs),
                "max_ms": max(r["max_ms"] for r in rs),
                "attacker_per_s": statistics.median(r["attacker_per_s"] for r in rs),
                "blocked_per_s": statistics.median(r["blocked_per_s"] for r in rs),
                "peak_used_memory": max(r["peak_used_memory"] for r in rs),
                "cpu_us_per_attacker_call": statistics.median(
                    r["cpu_us_per_attacker_call"] or 0 for r in rs),
                "rounds": rs,
            }
    finally:
        s.stop()
    out["waiting_memory"] = [waiting_memory(server_cls, b, module, 100 if smoke else 1000)
                             for b in servers_for_memory]
    return out


def check(n):
    """Problems with a run (for the smoke run): failed victim calls."""
    return ["neighbours/%s: %d victim calls failed: %s" % (k, v["failed"], v["errors"])
            for k, v in n["scenarios"].items() if v["failed"]]


# --------------------------------------------------------------------------
# the report

def render(n):
    """BENCHMARKS.md lines for results.json's `neighbours`."""
    sc = n["scenarios"]
    L = ["## Noisy neighbours\n"]
    L.append(
        "Two ACL users confined to their own keys share one Redis %s with `maxmemory 64mb` "
        "and `noeviction`: `victim` (`~v:*`, `+tb.consume`) and `attacker` (`~a:*`, "
        "`+tb.consume +tb.mconsume +ping`). The victim makes unpipelined `TB.CONSUME` calls "
        "on %s existing buckets of its own for %.0f s per run while the attacker runs each "
        "scenario: the streams (PING, `TB.MCONSUME`) on one connection each, as fast as it "
        "goes unpipelined, the connection floods from %d processes; %d rounds, the order rotated "
        "each round; the figures are the medians over the rounds (failed calls: the total; "
        "p99 / PING flood: the median of each round's ratio to that round's PING flood). "
        "The victim's latency is measured by a Python client, so it includes the client's "
        "own time, the same in every row.\n" % (
            n["server"], "{:,}".format(VICTIM_KEYS), n["seconds"], n["processes"]["block"],
            n["rounds"]))
    L.append("Goal: nothing the attacker does with the limiter commands on its own keys hurts "
             "the victim more than a PING flood does: p99 within %.1fx of the PING-flood "
             "row, and no failed call.\n" % n["goal"])
    L.append("| attacker | attacker calls/s | victim p50 | victim p99 | p99 / PING flood | "
             "victim p99.9 | victim max | victim failed calls | peak used_memory |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, _ in SCENARIOS:
        if kind not in sc:
            continue  # a results file from before the scenario existed
        v = sc[kind]
        label = v["label"]
        if kind == "mconsume":
            label = "TB.MCONSUME stream, %d keys of %d bytes" % (n["mconsume_keys"],
                                                                n["mconsume_key_bytes"])
        L.append("| %s | %s | %.3f ms | %.3f ms | %.2fx | %.3f ms | %.1f ms | %d of %s | "
                 "%.1f MB |" % (
                     label, "—" if kind == "quiet" else "{:,.0f}".format(v["attacker_per_s"]),
                     v["p50_ms"], v["p99_ms"], v["p99_ratio"], v["p999_ms"], v["max_ms"],
                     v["failed"], "{:,}".format(v["calls"]), v["peak_used_memory"] / 2**20))
    L.append("")
    worst = max(sc[k]["p99_ratio"] for k in ("block", "mconsume") if k in sc)
    failed = sum(v["failed"] for v in sc.values())
    L.append("Against the connection flood without the limiter (same processes, PING in "
             "place of BLOCK), the abandoned-BLOCK flood's p99 is %.2fx.\n"
             % sc["block"]["p99_ratio_churn"])
    if "blpop" in sc and "leaseblock" in sc:
        L.append("Against the same flood of abandoned `BLPOP`s (Redis' own blocking command), "
                 "the victim's p99 under the abandoned-BLOCK flood is %.2fx, under the "
                 "abandoned lease-wait flood %.2fx (goal: at most %.1fx). Server CPU per "
                 "attacker call (connection, AUTH and the call; the victim's calls "
                 "included): %.1f µs for an abandoned BLOCK, %.1f µs for an abandoned lease "
                 "wait, %.1f µs for an abandoned BLPOP.\n" % (
                     sc["block"]["p99_ratio_blpop"], sc["leaseblock"]["p99_ratio_blpop"],
                     n["goal"], sc["block"]["cpu_us_per_attacker_call"],
                     sc["leaseblock"]["cpu_us_per_attacker_call"],
                     sc["blpop"]["cpu_us_per_attacker_call"]))
    ir = n.get("abandoned_instructions", {}).get("per_connection")
    if ir:
        L.append("Server instructions per abandoned waiter (callgrind; %s connections one after "
                 "another: connect, AUTH, the call, hang up; serverCron left out): "
                 "%s. An abandoned BLOCK is %.2fx an abandoned BLPOP, an abandoned lease "
                 "wait %.2fx (goal: at most %.1fx).\n" % (
                     "{:,}".format(n["abandoned_instructions"]["connections"]),
                     ", ".join("%s %s" % (k, "{:,.0f}".format(v)) for k, v in ir.items()),
                     ir["block"] / ir["blpop"], ir["leaseblock"] / ir["blpop"], n["goal"]))
    L.append("The connection flood is there to tell what the abandoned-BLOCK flood costs "
             "because it opens and closes connections (Redis accepts up to a thousand at a "
             "time, each with its buffers) from what the BLOCKs add: clients that block hold "
             "their reply buffers until they hang up, and no client blocks past 75%% of "
             "`maxmemory` or beyond a tenth of `maxmemory` held by waiting clients (%s of these "
             "BLOCKs per second did block).\n" % (
                 "{:,.0f}".format(sc["block"]["blocked_per_s"])))
    L.append("Worst p99 against the PING flood, of the limiter attacks: %.2fx (goal %.1fx: "
             "%s); failed victim calls: %d (%s).\n"
             % (worst, n["goal"], "met" if worst <= n["goal"] else "missed", failed,
                "met" if failed == 0 else "missed"))
    if n.get("waiting_memory"):
        L.append("What each client waiting in `BLOCK` holds on the server (its two module reply "
                 "buffers; its connection's own memory not included), measured with "
                 "%s clients waiting at once: %s. The module counts 64 KB for each, lets "
                 "waiting clients hold at most a tenth of `maxmemory` and at most "
                 "`tb.max-blocked` of them wait; an abandoned wait holds nothing once its "
                 "client is gone.\n" % (
                     "{:,}".format(n["waiting_memory"][0]["waiters"]),
                     "; ".join("%.1f KB on Redis %s" % (w["bytes_per_waiter"] / 1024,
                                                        w["server"])
                               for w in n["waiting_memory"])))
    return L


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "attack":
        try:
            attack(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        except (KeyboardInterrupt, BrokenPipeError, ConnectionError):
            pass
    else:
        raise SystemExit("usage: neighbours.py attack KIND PORT KEYS RUN (bench.py runs it)")
