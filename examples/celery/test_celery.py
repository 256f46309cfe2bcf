"""The seed scenario, for real: an LLM API that allows 0.5 calls/s (burst 1),
a Celery worker of three prefork processes, Redis with the tb module as
broker and limiter, and 30 tasks queued at once with the shipped
``tb_limiter.celery.rate_limited`` (redis-py as pip installs it).

Tasks reserve at most 20 s ahead (``TB_MAX_WAIT``), so two thirds of the
backlog is deeper than a reservation reaches: those tasks are denied at
first, hold nothing, and ask again later. A call made without a token is
one that starts before its token is due: each task reports how long after
its turn it called (``current_turn``), which must never be negative, and
the turns must come one every 2 s (the fleet uses the whole rate). The API
answers 429 to any call closer than 2 s to the previous one (less a
tolerance for scheduling jitter, see fake_llm.py); what reaches it adds the
delay after each turn (a worker waking, an HTTP request), which the limiter
does not control, so the test checks the bound that delay leaves: a call
arrives closer than 2 s to the previous one only by the previous call's
delay (and its reservation reply's). The reservations made must stay far
below polling."""

from __future__ import annotations

import math
import os
import statistics
import sys
import time
from pathlib import Path

import pytest
import redis

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fake_llm import FakeLLM  # noqa: E402
from scenario import worker  # noqa: E402
from tbharness import Server  # noqa: E402

TASKS = 30
RATE = 0.5
#: How much later than the server sent it a reservation's reply may be read
#: (a busy 2-core machine), which delays a task's turn as its worker sees it.
REPLY_DELAY = 0.050
REACH = 20.0


def test_seed_scenario(module_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_server.client().flushall()
    module_server.client().config_resetstat()
    api = FakeLLM(rate=RATE, latency=2.5).start()  # calls overlap: several processes work
    monkeypatch.setenv("TB_REDIS_URL", module_server.url)
    monkeypatch.setenv("LLM_API_URL", api.url)
    monkeypatch.setenv("TB_MAX_WAIT", str(REACH))
    sys.modules.pop("app", None)
    import app

    try:
        with worker(module_server.url, api.url, concurrency=3, logfile=tmp_path / "worker.log"):
            start = time.time()
            results = [app.complete.delay(f"document {i}") for i in range(TASKS)]
            outs = [r.get(timeout=TASKS / RATE + 60) for r in results]
            elapsed = time.time() - start
    finally:
        api.stop()
    stats = api.stats()
    arrivals = stats["arrivals"]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    reservations = _calls(module_server.client(), "tb.consume")
    requeues = sum(o["retries"] for o in outs)
    early = [o["late"] for o in outs if o["late"] < 0]
    print(
        f"\nseed scenario: {TASKS} tasks, {RATE} calls/s, 3 prefork processes, "
        f"redis-py {redis.__version__.split('.')[0]}, reach {REACH:g} s\n"
        f"  calls made before their token was due: {len(early)}\n"
        f"  API calls: {stats['accepted']} accepted, {stats['rejected']} rejected (429)\n"
        f"  spacing: min {min(gaps):.3f} s, mean {statistics.mean(gaps):.3f} s, max {max(gaps):.3f} s\n"
        f"  latest start after its turn: {max(o['late'] for o in outs) * 1000:.1f} ms; "
        f"reservations (TB.CONSUME calls): {reservations}; requeues: {requeues}\n"
        f"  worker processes that called: {len({o['pid'] for o in outs})}; all done in {elapsed:.1f} s"
    )
    assert early == [], f"calls made before their token was due: {early}"
    # A task's turn is the reservation's wait added to the time its reply
    # came back: never before the token is due, later by the reply's delay.
    turns = sorted(o["turn"] for o in outs)
    turn_gaps = [b - a for a, b in zip(turns, turns[1:])]
    assert max(turn_gaps) < 1 / RATE + 0.1, f"the fleet used its whole rate: {turn_gaps}"
    # What the API saw: each call once; a call closer than an interval to the
    # one before it only by that one's delay after its turn (measured) and its
    # reservation reply's delay (at most REPLY_DELAY). So every 429 (the API's
    # tolerance absorbs most of those delays) is a delay after the turn,
    # never a call made early.
    calls = sorted(stats["calls"], key=lambda c: c["at"])
    assert sorted(c["prompt"] for c in calls) == sorted(o["prompt"] for o in outs)
    turn_of = {o["prompt"]: o["turn"] for o in outs}
    for prev, nxt in zip(calls, calls[1:]):
        delay = prev["at"] - turn_of[prev["prompt"]]
        assert nxt["at"] - prev["at"] >= 1 / RATE - delay - REPLY_DELAY, (prev, nxt, delay)
    assert all(o["status"] in (200, 429) for o in outs)
    assert stats["accepted"] + stats["rejected"] == TASKS
    # Never polling: a task reserves once, plus once per half-reach it spends
    # beyond the reach of a reservation (the last one waits TASKS / RATE).
    per_task = 1 + math.ceil((TASKS / RATE - REACH) / (REACH / 2))
    assert reservations <= TASKS * per_task, reservations
    assert len({o["pid"] for o in outs}) >= 2, "several prefork processes called the API"
    assert os.getpid() not in {o["pid"] for o in outs}


def _calls(client: redis.Redis, command: str) -> int:
    stats = client.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
