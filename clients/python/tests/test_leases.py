"""Leases and settling (issue 13), on both backends: a concurrency limit held
in a ``with`` block, released on exit, held on an exception and on
cancellation (see test_lease_failure.py);
releases and settles that apply once; RPM + TPM + in-flight in one call."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest
import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, Limiter, RateLimited

#: A rate that refills nothing within a test.
FROZEN = "1e-12"


def test_a_lease_is_held_for_the_block_and_released_once(limiter: Limiter) -> None:
    inflight = limiter.bucket("inflight", 0, 2)
    with inflight.lease(ttl=60) as a, inflight.lease(ttl=60) as b:
        assert a.id and b.id and a.id != b.id
        assert a.result is not None and a.result.remaining == 1
        full = inflight.consume()
        assert not full.allowed and 59_000 < full.retry_after_ms <= 60_000, "the wait for the first expiry"
        with pytest.raises(RateLimited):
            with inflight.lease(ttl=60, timeout=0.05):
                pass
    assert (a.released, b.released) == (1, 1)
    assert inflight.release(a.id) is None, "a second release gives nothing back"
    info = inflight.info()
    assert info is None, "both slots back: the bucket is full, its key gone"


def test_an_exception_holds_the_slot_until_its_ttl(limiter: Limiter) -> None:
    inflight = limiter.bucket("inflight:x", 0, 1)
    with pytest.raises(KeyError):
        with inflight.lease(ttl=0.2):
            raise KeyError("boom")
    assert not inflight.consume().allowed, "the call may still run: held (test_lease_failure.py)"
    with inflight.lease(ttl=60, timeout=5):
        pass


def test_a_lease_waits_for_a_release(limiter: Limiter) -> None:
    inflight = limiter.bucket("inflight:w", 0, 1)
    held = inflight.lease(ttl=0.3).__enter__()
    # Not released: it comes back when its TTL ends, and a waiting lease gets it.
    with inflight.lease(ttl=60, timeout=5) as second:
        assert second.id and second.id != held.id, "ids are random, never the held one"
    assert held.result is not None


def test_settle_charges_an_overrun_into_debt_and_applies_once(limiter: Limiter) -> None:
    tpm = limiter.bucket("tpm", FROZEN, 1000)
    with tpm.lease(400, ttl=60) as est:
        est.used = 900
    assert est.released == -500
    info = tpm.info()
    assert info is not None and info.tokens == 100
    assert tpm.settle(est.id, 900) is None, "a retried settle is not applied twice"
    again = tpm.info()
    assert again is not None and (again.tokens, again.updated_at_ms) == (info.tokens, info.updated_at_ms)
    with tpm.lease(100, ttl=60) as debt:
        debt.used = 300
    assert debt.released == -200
    info = tpm.info()
    assert info is not None and info.tokens == -200, "an overrun is charged into debt"
    assert not tpm.consume(1).allowed, "later callers wait for the overrun"
    tpm.refund(300)
    with tpm.lease(50, ttl=60) as small:
        small.used = 10
    assert small.released == 40


def test_rpm_tpm_and_inflight_in_one_call(limiter: Limiter) -> None:
    rpm = limiter.bucket("{u}:rpm", FROZEN, 60)
    tpm = limiter.bucket("{u}:tpm", FROZEN, 10000)
    inflight = limiter.bucket("{u}:inflight", 0, 1)
    with limiter.lease_many([(rpm, 1), (tpm, 3000), (inflight, 1)], ttl={1: 60, 2: 60}) as held:
        assert held.result is not None and held.result.allowed
        assert held.result.remaining == (59, 7000, 0)
        assert held.result.lease_ids[0] == 0 and all(held.result.lease_ids[1:])
        denied = limiter.consume_many([(rpm, 1), (inflight, 1)])
        assert not denied.allowed
        held.used[1] = 1200
    after = limiter.consume_many([(rpm, 1), (tpm, 1), (inflight, 1)])
    assert after.allowed and after.remaining == (58, 8799, 0)


@pytest.fixture
async def alimiter(server: Server) -> AsyncIterator[AsyncLimiter]:
    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    yield lim
    await lim.aclose()
    await client.aclose()


async def test_async_lease_cancelled_in_its_body_is_held(alimiter: AsyncLimiter) -> None:
    inflight = alimiter.bucket("a:inflight", 0, 1)
    entered = asyncio.Event()

    async def worker() -> None:
        async with inflight.lease(ttl=60):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.ensure_future(worker())
    await entered.wait()
    assert not (await inflight.consume()).allowed
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (await inflight.consume()).allowed, "the call may still run: the slot is held until its TTL"


async def test_async_waiting_lease_cancelled_holds_nothing(alimiter: AsyncLimiter) -> None:
    inflight = alimiter.bucket("a:inflight:w", 0, 1)
    async with inflight.lease(ttl=60) as first:
        waiter = asyncio.ensure_future(inflight.lease(ttl=60).__aenter__())
        await asyncio.sleep(0.05)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        info = await inflight.info()
        assert info is not None and info.tokens == 0
    assert first.released == 1
    async with alimiter.lease_many([(inflight, 1)], ttl={0: 5}) as many:
        assert many.result is not None and many.result.lease_ids[0] > 0
    assert (await inflight.consume()).allowed
