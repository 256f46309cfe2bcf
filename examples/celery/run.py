"""One command: ``make example-celery`` (or ``python run.py``).

Starts a redis-server with the tb module on a free port (or uses REDIS_URL),
the stand-in LLM API (0.5 calls/s, burst 1), a Celery worker with 3 prefork
processes, then sends TASKS tasks (default 6) at once and prints when each
API call arrived: one every 2 s, none rejected.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tools" / "tbharness"))


def main() -> None:
    from tbharness import example_redis

    with example_redis() as redis_url:
        run(redis_url)


def run(redis_url: str) -> None:
    from fake_llm import FakeLLM
    from scenario import worker

    api = FakeLLM(rate=0.5, latency=2.5).start()
    os.environ["LLM_API_URL"] = api.url
    import app  # after the environment is set

    try:
        log = Path(tempfile.mkdtemp()) / "worker.log"
        with worker(redis_url, api.url, concurrency=3, logfile=log):
            n = int(os.environ.get("TASKS", "6"))
            print(f"redis {redis_url}, API {api.url} (0.5 calls/s), 3 worker processes, {n} tasks")
            start = time.time()
            results = [app.complete.delay(f"document {i}") for i in range(n)]
            for r in results:
                out = r.get(timeout=60)
                print(f"  task -> HTTP {out['status']} in worker pid {out['pid']}, requeued {out['retries']}x")
            stats = api.stats()
            for t in stats["arrivals"]:
                print(f"  API call at +{t - start:6.3f} s")
            print(f"accepted {stats['accepted']}, rejected (429) {stats['rejected']}")
    finally:
        api.stop()


if __name__ == "__main__":
    main()
