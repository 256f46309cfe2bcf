"""A download server that caps bandwidth per user, with a global cap on top.

Tokens are bytes. Two ways to pace a stream, both exact to the byte:

* per user only (``global_rate=None``): ask the user's bucket for the rest of
  the file with ATMOST and send what it grants now; when it grants nothing,
  sleep until about a chunk has refilled (the sleep only sets the pace of
  the calls; the bucket alone decides how many bytes go out);
* with a global cap: take each 64 KiB chunk from the user's bucket and the
  global one at once (TB.MCONSUME ... RESERVE), all or nothing, then wait
  the reserved time and send it. Reservations queue first come, first
  served, so users share the global cap fairly.

Tiers: normal 10 MB/s, premium 50 MB/s, global 100 MB/s by default; each
bucket's burst is a tenth of a second of its rate (at least one chunk).

    TB_REDIS_URL=redis://127.0.0.1:6379/0 uvicorn downloads:app
    curl -H 'X-User: alice' http://127.0.0.1:8000/files/100000000 -o /dev/null
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from dataclasses import dataclass
from typing import AsyncIterator

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import StreamingResponse

from tb_limiter import AsyncLimiter, AsyncTokenBucket

CHUNK = 64 * 1024
#: The longest reservation a chunk may take (the module's default maximum).
MAX_WAIT = 60.0
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


async def per_user_stream(user: AsyncTokenBucket, rate: int, size: int) -> AsyncIterator[bytes]:
    left = size
    while left:
        r = await user.consume(left, atmost=True)  # the rest of the file, or what may go now
        if r.granted:
            for block in payload(r.granted):
                yield block
            left -= r.granted
            if r.granted < CHUNK:
                await asyncio.sleep((CHUNK - r.granted) / rate)
        else:
            await asyncio.sleep(max(r.retry_after, CHUNK / rate))


async def capped_stream(limiter: AsyncLimiter, user: AsyncTokenBucket, glob: AsyncTokenBucket, size: int) -> AsyncIterator[bytes]:
    left = size
    while left:
        n = min(left, CHUNK)
        r = await limiter.consume_many([(user, n), (glob, n)], max_wait=MAX_WAIT)
        if not r.allowed:
            raise RuntimeError(f"no bandwidth within {MAX_WAIT} s")
        if r.retry_after_ms:
            await asyncio.sleep(r.retry_after)
        yield _BLOCK[:n]
        left -= n


def create_app(redis_url: str, config: Config = DEFAULT) -> FastAPI:
    limiter = AsyncLimiter(redis_url)

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
        # The hash tag puts a user's keys in one cluster slot; the global
        # bucket is one key (MCONSUME with it needs a single-node Redis, or
        # a global key per slot group in a cluster).
        user = limiter.bucket(f"{{{name}}}:bw", rate, burst(rate))
        if config.global_rate is None:
            body = per_user_stream(user, rate, size)
        else:
            glob = limiter.bucket("global:bw", config.global_rate, burst(config.global_rate))
            body = capped_stream(limiter, user, glob, size)
        return StreamingResponse(body, media_type="application/octet-stream",
                                 headers={"Content-Length": str(size)})

    return app


app = create_app(os.environ.get("TB_REDIS_URL", "redis://127.0.0.1:6379/0"))
