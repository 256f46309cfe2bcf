"""The Celery example, for real: a prefork worker of 3 processes, Redis with
the tb module as broker and limiter, and the stand-in LLM API publishing 0.5
calls/s with burst 1.

Five tasks are sent at once. The API must see one call every 2 s (never
closer than 2 s less its documented tolerance of 10 ms, see fake_llm.py)
and reject none; every task but the first must have requeued itself exactly
once (the reserved countdown) and slept at most the lead of 0.25 s."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from fake_llm import TOLERANCE, FakeLLM  # noqa: E402
from scenario import worker  # noqa: E402
from tbserver import Server  # noqa: E402

TASKS = 5


def test_fleet_wide_rate_holds(module_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module_server.client().flushall()
    api = FakeLLM(rate=0.5, latency=2.5).start()  # calls overlap: several processes work
    monkeypatch.setenv("TB_REDIS_URL", module_server.url)
    monkeypatch.setenv("LLM_API_URL", api.url)
    sys.modules.pop("app", None)
    import app

    try:
        with worker(module_server.url, api.url, concurrency=3, logfile=tmp_path / "worker.log"):
            start = time.time()
            results = [app.complete.delay(f"document {i}") for i in range(TASKS)]
            outs = [r.get(timeout=60) for r in results]
            elapsed = time.time() - start
    finally:
        api.stop()
    stats = api.stats()
    arrivals = stats["arrivals"]
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert stats["rejected"] == 0, f"the API answered 429 {stats['rejected']} times; gaps {gaps}"
    assert stats["accepted"] == TASKS and all(o["status"] == 200 for o in outs)
    assert min(gaps) >= 2.0 - TOLERANCE, gaps
    assert max(gaps) < 2.1, f"the fleet used its whole rate: {gaps}"
    # The first task found its token; each other one reserved its turn and
    # requeued itself once with the countdown, sleeping only the final lead.
    retries = sorted(o["retries"] for o in outs)
    assert retries == [0] + [1] * (TASKS - 1), retries
    assert all(o["slept"] <= app.LEAD + 0.05 for o in outs), [o["slept"] for o in outs]
    assert len({o["pid"] for o in outs}) >= 2, "several prefork processes called the API"
    assert os.getpid() not in {o["pid"] for o in outs}
    assert elapsed < 2.0 * (TASKS - 1) + 2.5 + 5, elapsed
