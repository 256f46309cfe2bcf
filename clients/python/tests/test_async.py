"""The asyncio client, on both backends."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

import pytest
import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, MultiResult, RateLimited, Result

FROZEN = "1e-12"


@pytest.fixture
async def alimiter(server: Server) -> AsyncIterator[AsyncLimiter]:
    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    await lim.bucket("probe", 1, 1).peek()
    assert lim.backend == ("module" if server.with_module else "lua")
    yield lim
    await lim.aclose()
    await client.aclose()


async def test_consume_reserve_refund_info(alimiter: AsyncLimiter) -> None:
    b = alimiter.bucket("a:user", 10, 5)
    assert await b.consume() == Result(True, 4, 0, 100, 1)
    assert (await b.peek()).allowed
    frozen = alimiter.bucket("a:frozen", FROZEN, 10)
    await frozen.consume(7)
    assert (await frozen.consume(5, atmost=True)).granted == 3
    assert await frozen.refund(4) == 4
    info = await frozen.info()
    assert info is not None and (info.tokens, info.capacity) == (4, 10)
    llm = alimiter.bucket("a:llm", 10, 1)
    await llm.consume()
    r = await llm.reserve(max_wait=1)
    assert r.allowed and 0 < r.retry_after_ms <= 100


async def test_consume_many(alimiter: AsyncLimiter) -> None:
    rpm = alimiter.bucket("{t}:rpm", FROZEN, 3)
    tpm = alimiter.bucket("{t}:tpm", FROZEN, 1000)
    assert await alimiter.consume_many([(rpm, 1), (tpm, 600)]) == MultiResult(True, 0, (2, 400))
    assert not (await alimiter.consume_many([(rpm, 1), (tpm, 600)])).allowed


async def test_acquire_waits_and_times_out(alimiter: AsyncLimiter) -> None:
    b = alimiter.bucket("a:w", 10, 1)
    await b.consume()
    start = time.monotonic()
    assert (await b.acquire(timeout=1)).allowed
    assert 0.05 <= time.monotonic() - start < 0.6
    frozen = alimiter.bucket("a:t", FROZEN, 1)
    await frozen.consume()
    with pytest.raises(RateLimited):
        await frozen.acquire(timeout=0.2)


async def test_many_tasks_share_the_bucket_fairly(alimiter: AsyncLimiter) -> None:
    """Ten coroutines reserve from a 20/s bucket of capacity 1 at once: the
    server queues them one behind another (first come, first served), so the
    ten waits are ten distinct turns 50 ms apart, and each coroutine
    proceeds no earlier than its own turn, after one sleep."""
    b = alimiter.bucket("a:fair", 20, 1)
    done: list[tuple[int, float]] = []
    replies: list[float] = []
    first = time.monotonic()

    async def worker() -> None:
        start = time.monotonic()
        r = await b.reserve(max_wait=5)
        replies.append(time.monotonic())
        assert r.allowed
        await asyncio.sleep(r.retry_after)
        done.append((r.retry_after_ms, time.monotonic() - start))

    await asyncio.gather(*(worker() for _ in range(10)))
    spread_ms = (max(replies) - first) * 1000
    waits = sorted(w for w, _ in done)
    assert waits[0] == 0
    # Each turn is one token (50 ms) after the one before, less the time
    # between the two requests: distinct turns, none shared, none skipped.
    steps = [b - a for a, b in zip(waits, waits[1:])]
    assert all(0 < s <= 50 for s in steps), waits
    assert waits[-1] >= 9 * 50 - spread_ms, (waits, spread_ms)
    assert all(elapsed >= wait / 1000 for wait, elapsed in done), done


async def test_async_decorator_and_context_manager(alimiter: AsyncLimiter) -> None:
    b = alimiter.bucket("a:d", FROZEN, 2)

    @b.limit(timeout=0.1)
    async def work() -> str:
        return "done"

    assert await work() == "done"
    async with b.limit() as r:
        assert r.remaining == 0
    with pytest.raises(RateLimited):
        await work()
