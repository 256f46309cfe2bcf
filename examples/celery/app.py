"""A Celery app whose workers call a rate-limited LLM API through tb.

The API publishes 0.5 calls/s with burst 1 (``LLM_RATE``, ``LLM_BURST``). Every
worker process, on every machine, takes its token from the same bucket in
Redis, so the whole fleet keeps to the limit. A task whose token is not there
yet reserves it (RESERVE: first come, first served across the fleet) and
requeues itself with the reserved wait as its countdown: no worker process
polls, and none sleeps more than the last quarter second before its turn.

    TB_REDIS_URL=redis://127.0.0.1:6379/0 LLM_API_URL=http://127.0.0.1:8089 \\
        celery -A app worker --pool=prefork --concurrency=3
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
from typing import Any

from celery import Celery

from tb_limiter import Limiter

REDIS_URL = os.environ.get("TB_REDIS_URL", "redis://127.0.0.1:6379/0")
API_URL = os.environ.get("LLM_API_URL", "http://127.0.0.1:8089")
API = urllib.parse.urlsplit(API_URL)
RATE = os.environ.get("LLM_RATE", "0.5")
BURST = int(os.environ.get("LLM_BURST", "1"))
#: The longest wait a task reserves; a later token is asked for again then.
MAX_WAIT = 60.0
#: A requeued task comes back this much before its token is due and sleeps
#: the rest in the worker: Celery runs countdown tasks a few milliseconds
#: late, by amounts that differ from task to task, which would bring two
#: calls closer than the API allows. A short sleep is exact.
LEAD = 0.25

app = Celery("llm", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
    worker_hijack_root_logger=False,
)

# Made once in the parent at import time. The Limiter keeps a URL, not a
# connection: each prefork child opens its own after the fork.
limiter = Limiter(REDIS_URL)
llm = limiter.bucket("llm:api", RATE, BURST)


def server_now() -> float:
    """Redis' clock in seconds: the same for every machine of the fleet."""
    sec, usec = limiter.client.time()
    return sec + usec / 1e6


@app.task(bind=True, max_retries=None)
def complete(self: Any, prompt: str, due: float | None = None) -> dict[str, Any]:
    """Calls the LLM API once, within the fleet-wide limit."""
    # Connect first, so the request leaves right after the token is ours.
    api = http.client.HTTPConnection(API.hostname, API.port, timeout=30)
    api.connect()
    slept = 0.0
    try:
        if due is None:
            r = llm.reserve(1, max_wait=MAX_WAIT)
            if r.never:
                raise ValueError("a single call exceeds the API's burst")
            if not r.allowed:
                # Over MAX_WAIT away: ask again when it is that close.
                raise self.retry(countdown=r.retry_after - MAX_WAIT + 1)
            if r.retry_after_ms > 0:
                # The token is ours at the reserved time: requeue until then.
                due = server_now() + r.retry_after
                raise self.retry(countdown=max(0.0, r.retry_after - LEAD), kwargs={"prompt": prompt, "due": due})
        else:
            # Back from the queue, at most LEAD early: start on the dot.
            slept = max(0.0, due - server_now())
            time.sleep(slept)
        api.request("POST", "/v1/complete", json.dumps({"prompt": prompt}), {"Content-Type": "application/json"})
        resp = api.getresponse()
        body = json.loads(resp.read() or b"{}")
    finally:
        api.close()
    return {"status": resp.status, "body": body, "retries": self.request.retries, "pid": os.getpid(), "slept": slept}
