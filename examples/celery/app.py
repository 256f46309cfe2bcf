"""A Celery app whose workers call a rate-limited LLM API through tb.

The API publishes 0.5 calls/s with burst 1 (``LLM_RATE``, ``LLM_BURST``).
Every worker process, on every machine, takes its token from the same bucket
in Redis, so the whole fleet keeps to the limit. ``rate_limited`` (shipped in
``tb_limiter.celery``) reserves each task's turn (first come, first served
across the fleet) and requeues the task until the turn is due: no worker
process sleeps through a wait, and no call goes out without its token.

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

from celery import Celery, current_task

from tb_limiter import Limiter
from tb_limiter.celery import current_turn, rate_limited

REDIS_URL = os.environ.get("TB_REDIS_URL", "redis://127.0.0.1:6379/0")
API_URL = os.environ.get("LLM_API_URL", "http://127.0.0.1:8089")
API = urllib.parse.urlsplit(API_URL)
RATE = os.environ.get("LLM_RATE", "0.5")
BURST = int(os.environ.get("LLM_BURST", "1"))
#: How far ahead a task may reserve its turn (seconds; at most the server's
#: tb.max-wait-ms). Tasks further back ask again later, holding nothing.
MAX_WAIT = float(os.environ.get("TB_MAX_WAIT", "60"))

app = Celery("llm", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    result_serializer="json",
    worker_hijack_root_logger=False,
)

# Made once in the parent at import time: from_url keeps a URL and connects
# lazily, so each prefork child opens its own connection after the fork.
limiter = Limiter.from_url(REDIS_URL)
llm = limiter.bucket("llm:api", RATE, BURST)


@app.task
@rate_limited(llm, max_wait=MAX_WAIT)
def complete(prompt: str) -> dict[str, Any]:
    """Calls the LLM API once, within the fleet-wide limit."""
    api = http.client.HTTPConnection(API.hostname, API.port, timeout=30)
    try:
        started = time.time()
        turn = current_turn()  # when this task's token was due
        assert turn is not None
        api.request("POST", "/v1/complete", json.dumps({"prompt": prompt}), {"Content-Type": "application/json"})
        resp = api.getresponse()
        body = json.loads(resp.read() or b"{}")
    finally:
        api.close()
    return {"status": resp.status, "body": body, "retries": current_task.request.retries,
            "pid": os.getpid(), "started": started, "late": started - turn, "turn": turn, "prompt": prompt}
