"""FastAPI rate limiting per API key and per user, with limits per user tier.

Tiers and keys come from a YAML file (``TIERS_FILE``, default tiers.yaml)
that is re-read when it changes, so limits change without a restart. Each
request takes a token from its API key's bucket and one from its user's
bucket in one atomic TB.MCONSUME (both keys carry the user as hash tag, so
they share a cluster slot). A denied request gets 429 with

* ``Retry-After``: the reply's ``retry_after_ms`` rounded up to whole
  seconds: waiting that long always succeeds if nobody else takes the tokens
  (never optimistic);
* ``RateLimit-Limit`` / ``RateLimit-Remaining`` / ``RateLimit-Reset``: the
  capacity and remaining tokens of the tighter bucket, and the seconds until
  both are full again, an upper bound computed from the reply's remaining
  tokens and the tier's rate.

Served responses carry the ``RateLimit-*`` headers too.

    TB_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn gateway:app
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from tb_limiter import AsyncLimiter, BucketSpec

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def per_second(rate: str) -> Fraction:
    """The exact tokens per second of a rate string ("10", "0.5", "100/m")."""
    unit = 1
    if len(rate) >= 2 and rate[-2] == "/":
        unit, rate = UNITS[rate[-1].lower()], rate[:-2]
    return Fraction(Decimal(rate)) / unit


@dataclass(frozen=True)
class Limit:
    rate: str
    capacity: int


@dataclass(frozen=True)
class Client:
    user: str
    tier: str
    per_key: Limit
    per_user: Limit


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
            out[str(key)] = Client(
                user=str(entry["user"]),
                tier=str(entry["tier"]),
                per_key=Limit(str(tier["per_key"]["rate"]), int(tier["per_key"]["capacity"])),
                per_user=Limit(str(tier["per_user"]["rate"]), int(tier["per_user"]["capacity"])),
            )
        return out


def rate_limit_headers(buckets: list[BucketSpec], remaining: tuple[int, ...], retry_after_ms: int) -> dict[str, str]:
    """Headers from a TB.MCONSUME reply (see the module docstring)."""
    tight = min(range(len(buckets)), key=lambda i: remaining[i])
    reset = 0
    for b, rem in zip(buckets, remaining):
        if rem >= b.capacity:
            continue
        rate = per_second(b.rate)
        if rate == 0:
            reset = -1  # never full again
            break
        # At most (capacity - remaining) tokens are missing: an upper bound.
        reset = max(reset, math.ceil((b.capacity - rem) / rate))
    headers = {
        "RateLimit-Limit": str(buckets[tight].capacity),
        "RateLimit-Remaining": str(remaining[tight]),
        "RateLimit-Reset": str(reset),
    }
    if retry_after_ms > 0:
        headers["Retry-After"] = str(math.ceil(retry_after_ms / 1000))
    return headers


def create_app(redis_url: str, tiers_file: Path) -> FastAPI:
    limiter = AsyncLimiter(redis_url)
    tiers = Tiers(tiers_file)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await limiter.aclose()

    app = FastAPI(title="tb gateway example", lifespan=lifespan)

    @app.middleware("http")
    async def rate_limit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        api_key = request.headers.get("X-API-Key", "")
        client = tiers.lookup(api_key)
        if client is None:
            return JSONResponse({"error": "unknown API key"}, status_code=401)
        tag = "{" + client.user + "}"
        buckets = [
            limiter.bucket(f"{tag}:key:{api_key}", client.per_key.rate, client.per_key.capacity),
            limiter.bucket(f"{tag}:user", client.per_user.rate, client.per_user.capacity),
        ]
        r = await limiter.consume_many([(b, 1) for b in buckets])
        if r.never:
            return JSONResponse({"error": "this tier allows no requests"}, status_code=403)
        headers = rate_limit_headers(buckets, r.remaining, r.retry_after_ms)
        if not r.allowed:
            return JSONResponse({"error": "rate limited", "tier": client.tier}, status_code=429, headers=headers)
        response = await call_next(request)
        response.headers.update(headers)
        return response

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"models": ["small", "large"]}

    return app


app = create_app(
    os.environ.get("TB_REDIS_URL", "redis://127.0.0.1:6379/0"),
    Path(os.environ.get("TIERS_FILE", Path(__file__).with_name("tiers.yaml"))),
)
