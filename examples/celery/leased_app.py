"""The Celery app of test_leased.py: a task leased on RPM + TPM + in
flight (``tb_limiter.celery.leased``) around a 0.3 s stand-in call, which
records when it ran in Redis."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, current_task

from tb_limiter import Limiter, NotSent
from tb_limiter.celery import current_lease, leased

URL = os.environ["TB_REDIS_URL"]
FROZEN = "1e-12"  # refills nothing within the test
CALL_SECONDS = 0.3
INFLIGHT = 2
SLOT_TTL = 2.0  # longer than a call: a failed call's slot is held that long

app = Celery("leased", broker=URL, backend=URL)
app.conf.update(broker_connection_retry_on_startup=True, task_serializer="json", result_serializer="json",
                worker_hijack_root_logger=False)
limiter = Limiter.from_url(URL)
rpm = limiter.bucket("{llm}:rpm", FROZEN, 1000)
tpm = limiter.bucket("{llm}:tpm", FROZEN, 100_000)
inflight = limiter.bucket("{llm}:inflight", 0, INFLIGHT)


def parts(estimate: int, used: int, fail: str) -> list[tuple[Any, int]]:
    return [(rpm, 1), (tpm, estimate), (inflight, 1)]


@app.task
@leased(limiter, parts, ttl={1: 60, 2: SLOT_TTL}, poll=0.2)
def call(estimate: int, used: int, fail: str) -> dict[str, Any]:
    r = redis.Redis.from_url(URL)
    start = time.time()
    if fail == "notsent":
        raise NotSent("refused before sending")
    time.sleep(CALL_SECONDS)  # the call itself (not a wait for a limit)
    r.rpush("calls", f"{start} {time.time()}")
    if fail == "timeout":
        raise TimeoutError("the provider may still bill it")
    held = current_lease()
    assert held is not None
    held.used[1] = used
    return {"retries": current_task.request.retries}
