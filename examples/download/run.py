"""One command: ``make example-download`` (or ``python run.py``).

Starts a redis-server with the tb module on a free port (or uses REDIS_URL)
and serves downloads on http://127.0.0.1:8000 (PORT): alice is a normal user
(10 MB/s), bob and carol premium (50 MB/s), 100 MB/s for everyone together.
Try:  curl -H 'X-User: alice' http://127.0.0.1:8000/files/50000000 -o /dev/null
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "tools" / "tbharness"))


def main() -> None:
    import uvicorn

    from tbharness import example_redis

    with example_redis() as redis_url:
        port = int(os.environ.get("PORT", "8000"))
        print(f"redis {redis_url}; try: curl -H 'X-User: alice' http://127.0.0.1:{port}/files/50000000 -o /dev/null")
        uvicorn.run("downloads:app", host="127.0.0.1", port=port, app_dir=str(HERE))


if __name__ == "__main__":
    main()
