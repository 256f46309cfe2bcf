"""FastAPI rate limiting per API key, with limits per user tier, on the
shipped ``tb_limiter.fastapi.RateLimit`` dependency.

Tiers and keys come from a YAML file (``TIERS_FILE``, default tiers.yaml)
that is re-read when it changes, so limits change without a restart. A
tier's limits are written as Flask-Limiter writes them ("5/minute;100/day");
each request takes a token from every limit of its key at once
(TB.MCONSUME). A denied request gets 429 with ``Retry-After`` and the IETF
``RateLimit`` / ``RateLimit-Policy`` fields; served responses carry the
latter two. Requests of a tier with ``wait`` queue for their turn that many
seconds before they are refused.

    TB_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn gateway:app
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import yaml
from fastapi import Depends, FastAPI, HTTPException, Request

from tb_limiter import AsyncLimiter
from tb_limiter.fastapi import RateLimit


@dataclass(frozen=True)
class Client:
    user: str
    tier: str
    limits: str
    wait: float


class Tiers:
    """The YAML file, re-read when its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._clients: dict[str, Client] = {}

    def lookup(self, api_key: str) -> Client | None:
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._clients = self._load()
                    self._stamp = stamp
        return self._clients.get(api_key)

    def _load(self) -> dict[str, Client]:
        doc = yaml.safe_load(self.path.read_text()) or {}
        tiers = doc.get("tiers", {})
        out = {}
        for key, entry in (doc.get("keys") or {}).items():
            tier = tiers[entry["tier"]]
            out[str(key)] = Client(str(entry["user"]), str(entry["tier"]), str(tier["limits"]),
                                   float(tier.get("wait", 0)))
        return out


def create_app(redis_url: str, tiers_file: Path) -> FastAPI:
    limiter = AsyncLimiter.from_url(redis_url)
    tiers = Tiers(tiers_file)

    def client(request: Request) -> Client:
        found = tiers.lookup(request.headers.get("X-API-Key", ""))
        if found is None:
            raise HTTPException(401, "unknown API key")
        return found

    per_key = RateLimit(
        limiter,
        lambda request: client(request).limits,
        key=lambda request: "key:" + request.headers["X-API-Key"],
        wait=lambda request: client(request).wait,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await limiter.aclose()

    app = FastAPI(title="tb gateway example", lifespan=lifespan)

    @app.get("/v1/models", dependencies=[Depends(per_key)])
    async def models() -> dict[str, Any]:
        return {"models": ["small", "large"]}

    return app


app = create_app(
    os.environ.get("TB_REDIS_URL", "redis://127.0.0.1:6379/0"),
    Path(os.environ.get("TIERS_FILE", Path(__file__).with_name("tiers.yaml"))),
)
