"""A download server that caps bandwidth per user, with a global cap on top.

Tokens are bytes. Every stream goes through the shipped
``tb_limiter.stream.pace``: 64 KiB chunks, taken from the user's bucket (and
the global one, in the same TB.MCONSUME, one grant from both) before they are
sent, with ATMOST MIN chunk: a grant is at least a chunk, and a stream that
finds less waits for a chunk without holding anything, so a stream makes at
most rate / 64 KiB calls per second whatever its backlog. When the global cap
binds, a stream denied because others took the bytes reserves its next chunk
instead (queued first come, first served, never denied): users sharing the
cap take turns, still with at most one call per chunk.

Tiers: normal 10 MB/s, premium 50 MB/s, global 100 MB/s by default; each
bucket's burst is a tenth of a second of its rate (at least one chunk): over
any T seconds a user gets at most burst + rate * T bytes, so a 10 s download
averages within 1% of the rate (a whole second of burst would allow 10%).

    TB_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn downloads:app
    curl -H 'X-User: alice' http://127.0.0.1:8000/files/100000000 -o /dev/null
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from tb_limiter import AsyncLimiter
from tb_limiter.stream import pace

CHUNK = 64 * 1024
_BLOCK = bytes(range(256)) * (CHUNK // 256)


@dataclass(frozen=True)
class Config:
    """Bytes per second per tier, and the global cap (None: no global cap)."""

    tiers: dict[str, int]
    users: dict[str, str]
    global_rate: int | None


DEFAULT = Config(
    tiers={"normal": 10_000_000, "premium": 50_000_000},
    users={"alice": "normal", "bob": "premium", "carol": "premium"},
    global_rate=100_000_000,
)


def burst(rate: int) -> int:
    """A tenth of a second of ``rate``, at least one chunk."""
    return max(CHUNK, rate // 10)


def payload(n: int) -> list[bytes]:
    """``n`` bytes of file content, in chunks."""
    return [_BLOCK[: min(CHUNK, n - i)] for i in range(0, n, CHUNK)]


def create_app(redis_url: str, config: Config = DEFAULT) -> FastAPI:
    limiter = AsyncLimiter.from_url(redis_url)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await limiter.aclose()

    app = FastAPI(title="tb download example", lifespan=lifespan)

    @app.get("/files/{size}")
    async def download(size: int, request: Request) -> StreamingResponse:
        name = request.headers.get("X-User", "")
        tier = config.users.get(name)
        if tier is None:
            raise HTTPException(401, "unknown user")
        rate = config.tiers[tier]
        # With the global cap, both keys go in one TB.MCONSUME: on a
        # cluster they would need one slot (a global key per slot group).
        buckets = [limiter.bucket(f"{{{name}}}:bw", rate, burst(rate))]
        if config.global_rate is not None:
            buckets.append(limiter.bucket("global:bw", config.global_rate, burst(config.global_rate)))
        body = pace(payload(size), *buckets, chunk=CHUNK)
        return StreamingResponse(body, media_type="application/octet-stream",
                                 headers={"Content-Length": str(size)})

    return app


def config_from_env() -> Config:
    """DEFAULT, or the JSON in DOWNLOAD_CONFIG (``{"tiers": {...}, "users":
    {...}, "global_rate": N or null}``)."""
    text = os.environ.get("DOWNLOAD_CONFIG")
    if not text:
        return DEFAULT
    doc = json.loads(text)
    return Config(doc["tiers"], doc["users"], doc["global_rate"])


app = create_app(os.environ.get("TB_REDIS_URL", "redis://127.0.0.1:6379/0"), config_from_env())
