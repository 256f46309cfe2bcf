"""``tb_limiter.celery.leased`` with a real Celery worker of leased_app.py
(issue 18 item 7): RPM + TPM + in flight in one leased call; a denied task
requeues with the server's wait (no worker process sleeps waiting), the estimate is settled
after the call, a failed call keeps its estimate, ``NotSent`` gives back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from scenario import worker  # noqa: E402
from tbharness import Server  # noqa: E402

TASKS = 10


def test_leased_tasks_keep_every_limit(module_server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = module_server.client()
    client.flushall()
    monkeypatch.setenv("TB_REDIS_URL", module_server.url)
    sys.modules.pop("leased_app", None)
    import leased_app as app

    with worker(module_server.url, "", concurrency=5, logfile=tmp_path / "worker.log", app="leased_app"):
        jobs = [app.call.delay(300, 120 + i, "") for i in range(TASKS)]
        outs = [j.get(timeout=60) for j in jobs]
        # A failed call: its estimate stays charged, its slot held.
        failed = app.call.delay(500, 0, "timeout")
        with pytest.raises(TimeoutError):
            failed.get(timeout=30)
        slots_after_failure = float(app.inflight.info().tokens)  # type: ignore[union-attr]
        notsent = app.call.delay(700, 0, "notsent")
        with pytest.raises(Exception, match="refused before sending"):
            notsent.get(timeout=30)

    calls = sorted(tuple(map(float, c.split())) for c in client.lrange("calls", 0, -1))
    most = max(sum(1 for s, e in calls if s <= t < e) for t, _ in calls)
    requeues = sum(o["retries"] for o in outs)
    used = sum(120 + i for i in range(TASKS))
    tpm = app.tpm.info()
    rpm = app.rpm.info()
    print(f"\nleased Celery tasks: {len(calls)} calls, at most {most} in flight (limit {app.INFLIGHT}), "
          f"{requeues} requeues, TPM {tpm.tokens if tpm else None}")
    assert most <= app.INFLIGHT, f"{most} calls in flight"
    assert requeues > 0, "5 processes on 2 slots: some tasks were denied and requeued"
    assert tpm is not None and tpm.tokens == 100_000 - used - 500, "settled to the use; the failed call's estimate kept"
    assert rpm is not None and rpm.tokens == 1000 - TASKS - 1, "requests: the NotSent one given back"
    assert slots_after_failure == app.INFLIGHT - 1, "the failed call's slot is held until its TTL"
