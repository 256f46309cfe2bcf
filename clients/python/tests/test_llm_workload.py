"""The issue-13 workload: a fleet of processes calling an LLM API under three
limits at once (requests per minute, tokens per minute, requests in flight).
Each call is one all-or-nothing TB.MCONSUME that takes a request, lends the
token estimate and lends an in-flight slot; afterwards the estimate is
settled to the tokens "used" (up or down; over the estimate goes into debt)
and the slot released. Two workers are SIGKILLed while holding leases.

The audit is a server-side record, not the clients' clocks: every grant and
every settle runs in a transaction (MULTI/EXEC) that reads the server's TIME
around the call and appends an entry to a list in the same atomic step, so
the list is in execution order; the worker then fills its entry in (LSET)
with the reply. From
it the test replays the three limits and asserts none was ever exceeded,
that the killed workers' slots stayed taken until their TTL ended, and that
they came back then.

Time: the transaction reads TIME before and after the module's call; the module
read its own clock (the same server clock, in whole milliseconds on Redis
7.0) in between, so every bound allows the refill of the largest such
interval plus 1 ms, measured from the record itself.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import redis

from tbserver import Server

KEYS = ["{llm}:rpm", "{llm}:tpm", "{llm}:inflight", "{llm}:audit"]
RPM = ("600/m", 20)  # 10 requests/s, a burst of 20
RPM_RATE = Fraction(10)
TPM = ("180000/m", 6000)  # 3000 tokens/s, a burst of 6000
TPM_RATE = Fraction(3000)
INFLIGHT = 3  # the binding limit: calls take 0.2 to 0.5 s
TTL_MS = 30_000  # a live worker's leases (never reached)
KILLED_TTL_MS = 1_500  # the leases of the workers that get killed
RUN_S = 8.0

def acquire(r: redis.Redis, estimate: int, ttl: int, name: str) -> Any:
    """One grant: the three limits in one call, the estimate and the slot
    lent, recorded with the server's time around the call."""
    p = r.pipeline(transaction=True)
    p.execute_command("TIME")
    p.execute_command("TB.MCONSUME", 3, *KEYS[:3], *RPM, 1, *TPM, estimate, 0, INFLIGHT, 1,
                      "LEASE", 2, ttl, "LEASE", 3, ttl)
    p.execute_command("TIME")
    p.rpush(KEYS[3], "pending")
    t0, reply, t1, n = p.execute()
    entry = ["grant", *t0, *t1, name, estimate, ttl, reply[6], reply[7]] if reply[0] == 1 else ["denied"]
    r.lset(KEYS[3], n - 1, " ".join(map(str, entry)))
    return reply


def settle(r: redis.Redis, estimate_id: int, slot_id: int, used: int, name: str) -> None:
    """Settles the estimate to what was used and gives the slot back,
    recorded the same way."""
    p = r.pipeline(transaction=True)
    p.execute_command("TIME")
    p.execute_command("TB.RELEASE", KEYS[1], estimate_id, "USED", used)
    p.execute_command("TB.RELEASE", KEYS[2], slot_id)
    p.execute_command("TIME")
    p.rpush(KEYS[3], "pending")
    t0, back, slot, t1, n = p.execute()
    r.lset(KEYS[3], n - 1, " ".join(map(str, ["settle", *t0, *t1, name, used, back, slot])))


def worker(port: int, name: str, until: float, victim: Any) -> None:
    """Calls the "model" until ``until`` (monotonic); a victim tries until
    it has one grant, reports it through ``victim`` (an Event) and hangs
    there, holding its leases."""
    r = redis.Redis(port=port)
    rng = random.Random(name)
    ttl = KILLED_TTL_MS if victim is not None else TTL_MS
    while victim is not None or time.monotonic() < until:
        estimate = rng.randint(50, 400)
        reply = acquire(r, estimate, ttl, name)
        if reply[0] != 1:
            time.sleep(min(max(reply[1], 1), 20) / 1000)
            continue
        if victim is not None:
            victim.set()
            time.sleep(3600)  # holding both leases until SIGKILL
        time.sleep(rng.uniform(0.2, 0.5))  # the model call
        used = max(1, int(estimate * rng.uniform(0.3, 1.8)))
        settle(r, reply[6], reply[7], used, name)


@dataclass
class Call:
    """One grant from the record, and its settle if it came."""

    index: int  # position in the record (execution order)
    before: Fraction  # server TIME before and after the module's call, s
    after: Fraction
    worker: str
    estimate: int
    ttl: Fraction
    settled_index: int | None = None
    settled_at: Fraction | None = None
    used: int | None = None


def seconds(sec: str, usec: str) -> Fraction:
    return Fraction(int(sec)) + Fraction(int(usec), 1_000_000)


def read_record(records: list[bytes]) -> tuple[list[Call], Fraction]:
    """The calls, and the clock slack: the longest time between the TIMEs
    around a module call, plus the module clock's 1 ms."""
    calls: list[Call] = []
    open_call: dict[str, Call] = {}
    slack = Fraction(0)
    for i, raw in enumerate(records):
        f = raw.decode().split()
        assert f[0] != "pending", "every entry was filled in"
        if f[0] == "denied":
            continue
        before, after = seconds(f[1], f[2]), seconds(f[3], f[4])
        slack = max(slack, after - before)
        if f[0] == "grant":
            c = Call(i, before, after, f[5], int(f[6]), Fraction(int(f[7]), 1000))
            assert int(f[8]) > 0 and int(f[9]) > 0, raw
            calls.append(c)
            open_call[c.worker] = c
        else:
            c = open_call.pop(f[5])
            c.settled_index, c.settled_at, c.used = i, after, int(f[6])
            # The reply is what went back: the difference, less what the cap
            # at capacity kept out; an overrun charged in full.
            nominal, back = c.estimate - c.used, int(f[7])
            settled = back == nominal if nominal < 0 else 0 <= back <= nominal
            assert settled, ("settled once, by the difference", raw)
            assert f[8] == "1", ("the slot came back", raw)
    return calls, slack + Fraction(1, 1000)


def test_llm_fleet_with_killed_workers_never_exceeds_a_limit(module_server: Server) -> None:
    c = module_server.client()
    c.flushall()
    ctx = multiprocessing.get_context("fork")
    until = time.monotonic() + RUN_S  # the victims start first, within a second
    workers = [ctx.Process(target=worker, args=(module_server.port, f"w{i}", until, None), daemon=True)
               for i in range(5)]
    held = [ctx.Event() for _ in range(2)]
    victims = [ctx.Process(target=worker, args=(module_server.port, f"v{i}", until, e), daemon=True)
               for i, e in enumerate(held)]
    try:
        # The victims first, so that both hold their leases at once; killed
        # as soon as they do, while the fleet starts.
        for p in victims:
            p.start()
        for e in held:
            assert e.wait(60), "a victim got its leases within a minute"
        for p in workers:
            p.start()
        for p in victims:
            assert p.pid is not None
            os.kill(p.pid, signal.SIGKILL)
            p.join(10)
            assert p.exitcode == -signal.SIGKILL
        for p in workers:
            p.join(RUN_S + 60)
            assert p.exitcode == 0, f"worker exit code {p.exitcode}"
    finally:
        for p in workers + victims:
            if p.is_alive():
                p.kill()
                p.join(10)
    calls, slack = read_record(c.lrange(KEYS[3], 0, -1))
    killed = [x for x in calls if x.worker.startswith("v")]
    assert len(killed) == 2 and all(x.settled_index is None for x in killed)
    live = [x for x in calls if x not in killed]
    assert len(live) >= 20 and all(x.settled_index is not None for x in live), f"{len(live)} calls, all settled"

    # Requests per minute: in any window, at most the burst plus the refill.
    for i in range(len(calls)):
        for j in range(i, len(calls)):
            span = calls[j].after - calls[i].before
            assert j - i + 1 <= RPM[1] + RPM_RATE * (span + slack), f"{j - i + 1} requests in {float(span):.3f} s"

    # In flight, at every grant: the leases granted before it (record order)
    # and not settled before it, the killed ones counted only while surely
    # unexpired, stay within the limit.
    def in_flight(k: Call) -> int:
        n = 1
        for x in calls:
            if x.index >= k.index:
                break
            if x.settled_index is not None:
                n += x.settled_index > k.index
            else:
                n += k.after < x.before - Fraction(1, 1000) + x.ttl
        return n

    peaks = {x.index: in_flight(x) for x in calls}
    assert max(peaks.values()) <= INFLIGHT, f"over {INFLIGHT} in flight: {max(peaks.values())}"

    # The killed workers' slots: held until their TTL (while held, at most
    # one other call at a time got in), and back after it.
    held_from = max(x.after for x in killed)
    held_until = min(x.before for x in killed) - Fraction(1, 1000) + Fraction(KILLED_TTL_MS, 1000)
    during = [x for x in calls if x not in killed and held_from < x.before and x.after < held_until]
    assert during, "calls went on while the killed workers held two slots"
    assert all(peaks[x.index] == INFLIGHT for x in during if x.index > max(k.index for k in killed)), \
        "the killed workers' leases counted"
    back_from = max(x.after for x in killed) + Fraction(KILLED_TTL_MS, 1000)
    after = [x for x in calls if x.before > back_from]
    assert after, "work went on after the killed workers' leases expired"
    concurrent_after = max(sum(1 for y in live if y.index < x.index and y.settled_index is not None
                               and y.settled_index > x.index) + 1 for x in after)
    assert concurrent_after == INFLIGHT, f"their slots came back: {concurrent_after} live calls at once after the TTL"

    # Tokens per minute: replay the bucket from the record (an estimate
    # charged at its grant, settled up or down at its settle, a killed
    # worker's estimate back at its expiry); every grant found its estimate
    # there, up to the refill of the clock slack.
    moves: list[tuple[Fraction, int, int, Fraction]] = []
    for x in calls:
        moves.append((x.after, x.index, 0, Fraction(-x.estimate)))
        if x.used is not None and x.settled_at is not None and x.settled_index is not None:
            moves.append((x.settled_at, x.settled_index, 1, Fraction(x.estimate - x.used)))
        else:
            moves.append((x.before + x.ttl, len(calls) * 10, 2, Fraction(x.estimate)))
    moves.sort(key=lambda m: (m[0], m[1]))
    cap = Fraction(TPM[1])
    level, last = cap, moves[0][0]
    debt_seen = False
    for at, _, what, delta in moves:
        level = min(cap, level + TPM_RATE * max(Fraction(0), at - last))
        last = max(last, at)
        if what == 0:
            assert level + TPM_RATE * slack >= -delta, f"granted {-delta} tokens with {float(level):.1f} there"
        level = min(cap, level + delta) if delta > 0 else level + delta
        debt_seen |= level < 0
    assert any(x.used is not None and x.used > x.estimate for x in live), "some estimates were settled up"
    assert any(x.used is not None and x.used < x.estimate for x in live), "some estimates were settled down"

    # After the run: no lease left behind, every slot back.
    info = c.execute_command("TB.INFO", KEYS[2])
    if info is not None:
        fields = dict(zip(info[0::2], info[1::2]))
        assert fields.get(b"leases", 0) == 0, fields
    probe = c.execute_command("TB.CONSUME", KEYS[2], 0, INFLIGHT, INFLIGHT)
    assert probe[0] == 1, f"all {INFLIGHT} slots back: {probe}"
