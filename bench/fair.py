#!/usr/bin/env python3
"""Fair share of a saturated bucket among flows, for `make bench` (and
`make bench-fair` alone): issue 22's figures.

One bucket of 100 tokens a second, capacity 1, on a server this script
starts itself. Flow A saturates it: 200 clients (threads, one connection
each, redis-py), each looping `TB.CONSUME k 100 1 1 BLOCK 60000 FLOW A`,
sending again as soon as it is answered, so A always has about 200 calls
waiting. Flow B then arrives with 10 clients looping the same with FLOW B,
for a few seconds, and stops. Every grant is recorded as the client sees it:
when the reply came, its flow, and the wait from sending to the reply.

Runs (each on a fresh server):
- `equal`: A and B at weight 1;
- `weighted`: A at weight 3, B at weight 1;
- `no_flow`: the same clients without FLOW (plain BLOCK: each call reserves
  at once and is answered when its reservation is due, first come first
  served across flows), for contrast;
- `b_alone`: B's 10 looping clients with nobody else;
- `burst_backlog`: B arrives once with 10 one-shot calls (sent together)
  into A's backlog, several times;
- `burst_alone`: the same 10 one-shot calls on a bucket just emptied, with
  nobody else waiting.

From each: B's share of the grants while both flows wait (from B's arrival
to B's last grant), the grant ratio, B's waits, the longest gap between
grants in the first refill intervals after B's last grant and A's grants
in the second after it, and the grants of the whole run against
`capacity + rate * T` (T from the first grant to the last). The server's
own count of tokens granted (INFO tb) is kept beside the clients' count.

Then `cargo test --release --test fair_cost -- --ignored --nocapture`
(tests/fair_cost.rs): the cost of choosing the next waiter in
`tb::fair::FairQueue` at 1 to 100,000 flows; and, with valgrind, the
instructions the server executes per grant with 10 and with 10,000 flows
waiting.

Runs with the Python client's venv (redis-py); writes bench/results-fair.json,
which bench/report.py puts in BENCHMARKS.md.
"""

import argparse
import json
import os
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B  # noqa: E402

import redis  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "results-fair.json")

RATE, CAPACITY = 100, 1
A_CLIENTS, B_CLIENTS = 200, 10
BLOCK_MS = 60000
KEY = "fair"
#: How long B loops in the looping runs (s), and how long A runs alone
#: after B's last grant.
B_SECONDS, AFTER_S = 6.0, 1.2
#: Times B arrives with its one-shot calls, and the pause between.
BURSTS, BURST_PAUSE_S = 10, 0.2
#: How long A's backlog stands before B arrives (s).
A_HEAD_S = 0.5
#: The first refill intervals after B's last grant whose gaps are reported.
GAP_INTERVALS = 10
#: Calls waiting while the server's instructions per grant are counted, and
#: the flows they are spread over.
COST_CALLS, COST_FLOWS = 10_000, (10, 10_000)


def call_args(flow, weight, use_flow):
    args = ["TB.CONSUME", KEY, RATE, CAPACITY, 1, "BLOCK", BLOCK_MS]
    if use_flow:
        args += ["FLOW", flow]
        if weight != 1:
            args += ["WEIGHT", weight]
    return args


class Run:
    """The grants of one run: (received, flow, wait, sent) as clients saw them."""

    def __init__(self, port):
        self.port = port
        self.grants = []
        self.denials = 0
        self.errors = []
        self.threads = []

    def record(self, flow, sent, rep):
        got = time.monotonic()
        if rep[0] == 1:
            self.grants.append((got, flow, got - sent, sent))
        else:
            self.denials += 1

    def looper(self, flow, weight, use_flow, stop_at, started):
        """A client that asks again as soon as it is answered, until `stop_at`
        (monotonic; None: until the server goes away)."""
        args = call_args(flow, weight, use_flow)
        r = redis.Redis(port=self.port, socket_timeout=None)
        try:
            r.ping()
            started.release()
            while stop_at is None or time.monotonic() < stop_at:
                sent = time.monotonic()
                self.record(flow, sent, r.execute_command(*args))
        except redis.ConnectionError:
            pass
        except redis.RedisError as e:
            self.errors.append("%s: %s" % (flow, e))
        finally:
            r.close()

    def start(self, n, flow, weight, use_flow, stop_at=None):
        started = threading.Semaphore(0)
        for _ in range(n):
            t = threading.Thread(target=self.looper, daemon=True,
                                 args=(flow, weight, use_flow, stop_at, started))
            t.start()
            self.threads.append(t)
        for _ in range(n):
            if not started.acquire(timeout=30):
                raise SystemExit("fair: a client did not connect within 30 s")
        return self.threads[-n:]

    def one_shots(self, n, flow, weight, use_flow, before=None):
        """`n` calls sent together, one per connection, right after `before()`
        (once every connection is up); waits for every reply."""
        conns = [redis.Redis(port=self.port, socket_timeout=None) for _ in range(n)]
        for c in conns:
            c.ping()
        go = threading.Barrier(n + 1)
        args = call_args(flow, weight, use_flow)

        def one(c):
            go.wait()
            sent = time.monotonic()
            try:
                self.record(flow, sent, c.execute_command(*args))
            except redis.RedisError as e:
                self.errors.append("%s: %s" % (flow, e))

        ts = [threading.Thread(target=one, args=(c,), daemon=True) for c in conns]
        for t in ts:
            t.start()
        if before:
            before()
        go.wait()
        for t in ts:
            t.join(timeout=BLOCK_MS / 1000 + 10)
        for c in conns:
            c.close()


def wait_queued(conn, n, what):
    """Until `n` calls wait on the server (INFO tb's tb_blocked_now)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if blocked_now(conn) >= n:
            return
        time.sleep(0.05)
    raise SystemExit("fair: %s: %d calls never waited (%d do)" % (what, n, blocked_now(conn)))


def blocked_now(conn):
    return int(conn.info("tb").get("tb_blocked_now", 0))


def tokens_granted(conn):
    return int(conn.info("tb")["tb_tokens_granted"])


def queue_snapshot(conn):
    """TB.INFO's waiting and waiting_flows, as {flow: (weight, waiting)}.
    TB.INFO answers nil while the bucket is full, and a full bucket's key is
    gone (it expires when full), calls waiting or not: asked again then."""
    for nil in range(1000):
        info = conn.call("TB.INFO", KEY)
        if info is not None:
            break
    else:
        raise SystemExit("fair: TB.INFO %s answered nil 1000 times in a row" % KEY)
    fields = dict(zip((k.decode() for k in info[::2]), info[1::2]))
    flows = fields.get("waiting_flows") or []
    return {"waiting": fields.get("waiting", 0), "nil_answers_first": nil,
            "flows": {n.decode(): [w, k]
                      for n, w, k in zip(flows[::3], flows[1::3], flows[2::3])}}


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def admission(grants):
    """Grants from the first to the last against capacity + rate * T."""
    times = sorted(g[0] for g in grants)
    span = times[-1] - times[0]
    bound = CAPACITY + RATE * span
    return {"grants": len(times), "seconds": span, "bound": bound, "excess": len(times) - bound}


def median_interval_ms(grants):
    """The median time between consecutive grants (a refill interval when
    every token is granted as it comes)."""
    times = sorted(g[0] for g in grants)
    return percentile([(y - x) * 1000 for x, y in zip(times, times[1:])], 50)


def stalls(grants):
    """Gaps between consecutive grants longer than two refill intervals: how
    many, and the time they took beyond one interval each."""
    times = sorted(g[0] for g in grants)
    long = [y - x for x, y in zip(times, times[1:]) if y - x > 2 / RATE]
    return {"count": len(long), "lost_ms": 1000 * sum(g - 1 / RATE for g in long)}


def waits_ms(grants, flow):
    return [g[2] * 1000 for g in grants if g[1] == flow]


def summary_waits(ws):
    return {"count": len(ws), "p50_ms": percentile(ws, 50), "p99_ms": percentile(ws, 99),
            "max_ms": max(ws) if ws else None}


def looping(binary, module, weight_a, weight_b, use_flow, label):
    """A saturates; B arrives for B_SECONDS, then stops; A alone after."""
    B.log("fair: %s" % label)
    load = os.getloadavg()[0]
    s = B.Server(binary, module, name="fair server")
    run = Run(s.port)
    try:
        granted_before = tokens_granted(s.conn)
        run.start(A_CLIENTS, "A", weight_a, use_flow)
        wait_queued(s.conn, A_CLIENTS - 1, "flow A")
        time.sleep(A_HEAD_S)
        arrival = time.monotonic()
        b_threads = run.start(B_CLIENTS, "B", weight_b, use_flow, stop_at=arrival + B_SECONDS)
        time.sleep(B_SECONDS / 2)
        snapshot = queue_snapshot(s.conn)
        for t in b_threads:
            t.join(timeout=B_SECONDS + BLOCK_MS / 1000)
        time.sleep(AFTER_S)
        end = time.monotonic()
        granted = tokens_granted(s.conn) - granted_before
    finally:
        s.stop()
    for t in run.threads:
        t.join(timeout=10)
    grants = sorted(g for g in run.grants if g[0] <= end)
    b_last = max(g[0] for g in grants if g[1] == "B")
    both = [g for g in grants if arrival <= g[0] <= b_last]
    a_both = sum(1 for g in both if g[1] == "A")
    b_both = len(both) - a_both
    after = [g for g in grants if g[0] > b_last]
    first_after = [g[0] for g in after if g[0] <= b_last + GAP_INTERVALS / RATE]
    gaps = [(y - x) * 1000 for x, y in zip([b_last] + first_after, first_after)]
    return {
        "label": label,
        "loadavg": load,
        "flow": use_flow,
        "weights": {"A": weight_a, "B": weight_b},
        "both_wait": {"seconds": b_last - arrival, "A": a_both, "B": b_both,
                      "b_share": b_both / len(both), "a_per_b": a_both / b_both},
        "b_waits": summary_waits(waits_ms(grants, "B")),
        "a_waits_while_both": summary_waits(waits_ms(both, "A")),
        "after_b": {"first_gaps_ms": gaps, "max_gap_ms": max(gaps) if gaps else None,
                    "a_grants_next_second": sum(1 for g in after if g[0] <= b_last + 1.0),
                    "first_grant_after_ms": gaps[0] if gaps else None},
        "queue_midway": snapshot,
        "admission": admission(grants),
        "median_interval_ms": median_interval_ms(grants),
        "stalls": stalls(grants),
        "server_tokens_granted": granted,
        "clients_granted": len(run.grants),
        "denials": run.denials,
        "errors": run.errors[:5],
    }


def b_alone(binary, module):
    """B's 10 looping clients with nobody else, B_SECONDS."""
    B.log("fair: B alone, looping")
    load = os.getloadavg()[0]
    s = B.Server(binary, module, name="fair server")
    run = Run(s.port)
    try:
        threads = run.start(B_CLIENTS, "B", 1, True, stop_at=time.monotonic() + B_SECONDS)
        for t in threads:
            t.join(timeout=B_SECONDS + BLOCK_MS / 1000)
    finally:
        s.stop()
    return {"loadavg": load, "b_waits": summary_waits(waits_ms(run.grants, "B")),
            "admission": admission(run.grants),
            "median_interval_ms": median_interval_ms(run.grants), "stalls": stalls(run.grants),
            "denials": run.denials,
            "errors": run.errors[:5]}


def bursts(binary, module, backlog):
    """B's 10 one-shot calls, BURSTS times: into A's backlog, or alone on a
    bucket just emptied."""
    B.log("fair: B's one-shot calls, %s" % ("into A's backlog" if backlog else "alone"))
    load = os.getloadavg()[0]
    s = B.Server(binary, module, name="fair server")
    run = Run(s.port)
    try:
        if backlog:
            run.start(A_CLIENTS, "A", 1, True)
            wait_queued(s.conn, A_CLIENTS - 1, "flow A")
            time.sleep(A_HEAD_S)
        slowest = []
        for _ in range(BURSTS):
            # Alone, the bucket is emptied first, as A's backlog keeps it.
            empty = None if backlog else lambda: s.conn.call("TB.CONSUME", KEY, RATE, CAPACITY, 1)
            seen = len(run.grants)
            run.one_shots(B_CLIENTS, "B", 1, True, before=empty)
            slowest.append(max(g[2] * 1000 for g in run.grants[seen:] if g[1] == "B"))
            time.sleep(BURST_PAUSE_S)
    finally:
        s.stop()
    for t in run.threads:
        t.join(timeout=10)
    return {"loadavg": load, "bursts": BURSTS, "slowest_per_burst_ms": slowest,
            "median_slowest_ms": percentile(slowest, 50), "b_waits": summary_waits(waits_ms(run.grants, "B")),
            "b_waits_ms": sorted(waits_ms(run.grants, "B")), "denials": run.denials,
            "errors": run.errors[:5]}


def server_cost(binary, module, seconds):
    """Instructions the server executes per grant (valgrind's callgrind,
    instrumenting only while measured), with COST_CALLS calls waiting in 10
    flows or in 10,000 (one call each), every client asking again as soon
    as it is answered; serverCron's share (which follows the wall time,
    stretched by valgrind) left out, as bench.py does."""
    for tool in ("valgrind", "callgrind_control", "callgrind_annotate"):
        if not shutil.which(tool):
            return {"error": "%s is not installed (Debian package valgrind)" % tool}
    out = {"calls": COST_CALLS, "seconds": seconds, "flows": {}}
    for flows in COST_FLOWS:
        B.log("fair: server instructions per grant, %s calls in %s flows (callgrind)" % (
            "{:,}".format(COST_CALLS), "{:,}".format(flows)))
        out_dir = tempfile.mkdtemp(prefix="tb-bench-fair-cg-")
        s = B.Server(binary, module, name="callgrind server", start_s=120,
                     extra=("--maxclients", str(COST_CALLS + 100)),
                     prefix=["valgrind", "--tool=callgrind", "--instr-atstart=no",
                             "--callgrind-out-file=" + os.path.join(out_dir, "cg.out")])
        pid = str(s.proc.pid)
        socks = []
        try:
            s.conn.call("TB.CONFIG", "SET", "max-blocked", str(2 * COST_CALLS))
            for i in range(COST_CALLS):
                so = socket.create_connection(("127.0.0.1", s.port))
                so.sendall(encode_call("f%d" % (i % flows)))
                socks.append(so)
            replies = []
            stop = threading.Event()
            t = threading.Thread(target=ask_again, args=(socks, flows, replies, stop),
                                 daemon=True)
            t.start()
            wait_queued(s.conn, COST_CALLS - 10, "%d flows" % flows)
            subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True,
                           check=True)
            time.sleep(1)
            subprocess.run(["callgrind_control", "-z", pid], capture_output=True, check=True)
            start = time.monotonic()
            time.sleep(seconds)
            end = time.monotonic()
            before = set(os.listdir(out_dir))
            subprocess.run(["callgrind_control", "-d", "flows_%d" % flows, pid],
                           capture_output=True, check=True)
            dump = B.wait_new_file(out_dir, before)
            stop.set()
            t.join(timeout=10)
            grants = sum(1 for x in replies if start <= x <= end)
            total = B.total_ir(dump)
            cron = B.inclusive_ir(dump).get("serverCron", 0)
            out["flows"][str(flows)] = {"grants": grants, "instructions": total,
                                        "server_cron": cron,
                                        "per_grant": (total - cron) / grants}
        finally:
            for so in socks:
                so.close()
            s.stop()
            shutil.rmtree(out_dir, ignore_errors=True)
    return out


def encode_call(flow):
    return B.encode(call_args(flow, 1, True))


def ask_again(socks, flows, replies, stop):
    """Each connection sends its call again as soon as it is answered (its
    reply: an array of 5 integers, 6 lines); `replies` gets the times."""
    sel = selectors.DefaultSelector()
    bufs = {}
    for i, so in enumerate(socks):
        so.setblocking(False)
        sel.register(so, selectors.EVENT_READ, i)
        bufs[i] = b""
    while not stop.is_set():
        for key, _ in sel.select(timeout=0.1):
            i = key.data
            try:
                data = key.fileobj.recv(4096)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(key.fileobj)
                continue
            bufs[i] += data
            if bufs[i].count(b"\r\n") >= 6:
                replies.append(time.monotonic())
                bufs[i] = b""
                key.fileobj.sendall(encode_call("f%d" % (i % flows)))
    sel.close()


def queue_cost():
    """tests/fair_cost.rs: FairQueue push + pop per grant against the flows."""
    B.log("fair: FairQueue cost (cargo test --release --test fair_cost)")
    cmd = [os.environ.get("CARGO", "cargo"), "test", "--release", "--test", "fair_cost", "--",
           "--ignored", "--nocapture"]
    out = subprocess.run(cmd, cwd=B.ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("fair: tests/fair_cost.rs failed:\n%s%s" % (out.stdout, out.stderr))
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("fair: tests/fair_cost.rs printed no JSON:\n%s" % out.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--module", default=os.path.join(B.ROOT, "target", "release", "libtb.so"))
    ap.add_argument("--server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--callgrind-seconds", type=float, default=2.0,
                    help="how long the server's instructions are counted, per case")
    a = ap.parse_args()
    a.module = os.path.abspath(a.module)
    if not os.path.exists(a.module):
        raise SystemExit("module not built: %s (run cargo build --release)" % a.module)
    started = time.time()
    name = "Redis %s" % B.version_of(a.server)
    results = {"machine": B.machine_info({name: B.version_of(a.server)}),
               "server": name,
               "params": {"rate": RATE, "capacity": CAPACITY, "a_clients": A_CLIENTS,
                          "b_clients": B_CLIENTS, "block_ms": BLOCK_MS, "a_head_s": A_HEAD_S,
                          "b_seconds": B_SECONDS, "after_s": AFTER_S, "bursts": BURSTS,
                          "gap_intervals": GAP_INTERVALS}}
    results["equal"] = looping(a.server, a.module, 1, 1, True, "FLOW, equal weights")
    results["weighted"] = looping(a.server, a.module, 3, 1, True, "FLOW, A at weight 3, B at 1")
    results["no_flow"] = looping(a.server, a.module, 1, 1, False, "without FLOW (plain BLOCK)")
    results["b_alone"] = b_alone(a.server, a.module)
    results["burst_backlog"] = bursts(a.server, a.module, True)
    results["burst_alone"] = bursts(a.server, a.module, False)
    results["queue_cost"] = queue_cost()
    results["server_cost"] = server_cost(a.server, a.module, a.callgrind_seconds)
    results["machine"]["loadavg_end"] = os.getloadavg()[0]
    results["machine"]["run_seconds"] = round(time.time() - started)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
    B.log("fair: wrote %s" % a.out)


if __name__ == "__main__":
    main()
