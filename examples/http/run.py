"""One command: ``make example-http`` (or ``python run.py``).

Starts a redis-server with the tb module on a free port (or uses REDIS_URL)
and serves the gateway on http://127.0.0.1:8000 (PORT) with the limits of
tiers.yaml (TIERS_FILE); edit the file and the new limits apply at once.
Try:  curl -i -H 'X-API-Key: key-alice-1' http://127.0.0.1:8000/v1/models
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
        print(f"redis {redis_url}; try: curl -i -H 'X-API-Key: key-alice-1' http://127.0.0.1:{port}/v1/models")
        uvicorn.run("gateway:app", host="127.0.0.1", port=port, app_dir=str(HERE))


if __name__ == "__main__":
    main()
