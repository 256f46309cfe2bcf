"""The Celery side of the mixed-fleet test: a task that calls the same "API"
as the BullMQ workers, through the same tb bucket, with the Python client's
shipped Celery helper (``tb_limiter.celery.rate_limited``): each run
reserves its turn (TB.CONSUME ... RESERVE, first come first served with the
BullMQ jobs), requeues itself until the turn is due, and never calls
without a token; a denial (the backlog is longer than MAX_WAIT) takes
nothing and asks again later.

Environment: TB_REDIS_URL, REFEREE_URL, RATE, MAX_WAIT_MS, TB_REPLIES_DIR
(where each worker process writes the TB.CONSUME replies it saw, for the
test's observer).
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from typing import Any

from celery import Celery, current_task

import redis

from tb_limiter import Limiter
from tb_limiter.celery import rate_limited

REDIS_URL = os.environ["TB_REDIS_URL"]
REFEREE_URL = os.environ["REFEREE_URL"]
RATE = os.environ["RATE"]
MAX_WAIT = int(os.environ["MAX_WAIT_MS"]) / 1000
KEY = "api:shared"

app = Celery("mixed", broker=REDIS_URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    worker_hijack_root_logger=False,
)


def observe(execute_command: Any) -> Any:
    """The test's observer, around redis-py's Redis.execute_command: every
    TB.CONSUME reply (the module's, or the script's through EVALSHA/EVAL),
    with the task that asked and when the request left and the reply came
    back (CLOCK_MONOTONIC, as the calls and the Node processes). Each worker
    process appends to its own file."""

    def wrapper(self: redis.Redis, *args: Any, **options: Any) -> Any:
        words = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        script = words[0].upper() in ("EVALSHA", "EVAL")
        keys_at = 3 if script else 1
        consume = (words[keys_at + int(words[2])] if script else words[0]).upper() == "TB.CONSUME"
        send_ns = time.monotonic_ns()
        reply = execute_command(self, *args, **options)
        if consume and current_task and current_task.request.id:
            record = {
                "job": f"celery:{current_task.request.id}",
                "key": words[keys_at],
                "allowed": int(reply[0]) == 1,
                "sendNs": str(send_ns),
                "recvNs": str(time.monotonic_ns()),
                "retryAfterMs": int(reply[2]),
                "granted": int(reply[4]),
            }
            path = os.path.join(os.environ["TB_REPLIES_DIR"], f"celery-{os.getpid()}.jsonl")
            with open(path, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")
        return reply

    return wrapper


redis.Redis.execute_command = observe(redis.Redis.execute_command)  # type: ignore[method-assign]

limiter = Limiter.from_url(REDIS_URL)  # made in the parent: each child connects on its own
bucket = limiter.bucket(KEY, RATE, 1)


@app.task
@rate_limited(bucket, max_wait=MAX_WAIT)
def call_api(seq: int) -> int:
    """One call of the API, with a token of the shared bucket."""
    start_ns = time.monotonic_ns()
    body = json.dumps({
        "job": f"celery:{current_task.request.id}",
        "tenant": "shared",
        "seq": seq,
        "startNs": str(start_ns),
        "pid": os.getpid(),
        "side": "celery",
    }).encode()
    req = urllib.request.Request(REFEREE_URL, body, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return int(resp.status)
