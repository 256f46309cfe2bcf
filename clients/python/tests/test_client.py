"""The blocking client, on both backends (the module, and the Lua fallback on
a server without it): every test runs twice through the ``limiter`` fixture."""

from __future__ import annotations

import dataclasses
import math
import time
from decimal import Decimal

import pytest
import redis

from tb_limiter import Limiter, MultiResult, RateLimited, Result

# 1e-12 tokens/s: one nano-token takes 1000 s, so nothing refills during a
# test and the replies do not depend on timing.
FROZEN = "1e-12"


def test_fresh_bucket_counts_down(limiter: Limiter) -> None:
    b = limiter.bucket("user:42", 10, 5)
    r = b.consume()
    assert r == Result(True, 4, 0, 100, 1)
    assert (r.retry_after, r.reset_after, r.never) == (0.0, 0.1, False)
    assert r.reply == [1, 4, 0, 100, 1]
    assert b.consume(4).granted == 4
    denied = b.consume()
    assert (denied.allowed, denied.granted, denied.remaining) == (False, 0, 0)
    assert 0 < denied.retry_after_ms <= 100


def test_denials_and_peeks_write_nothing(limiter: Limiter) -> None:
    b = limiter.bucket("k", FROZEN, 3)
    assert b.consume(4).never
    assert b.peek().allowed
    assert limiter.client.exists("k") == 0, "a missing key is a full bucket"
    b.consume(3)
    before = b.info()
    assert not b.consume(1).allowed
    after = b.info()
    assert before is not None and after is not None
    # reset_after_ms and ttl_ms count down from now: the stored state is what matters.
    assert dataclasses.replace(after, ttl_ms=0, reset_after_ms=0) == dataclasses.replace(before, ttl_ms=0,
                                                                                         reset_after_ms=0)


def test_never_cases(limiter: Limiter) -> None:
    over = limiter.bucket("a", 1, 5).consume(6)
    assert (over.allowed, over.retry_after_ms, over.retry_after, over.never) == (False, -1, math.inf, True)
    budget = limiter.bucket("b", 0, 2)
    assert budget.consume(2).reset_after_ms == -1
    assert budget.consume(1) == Result(False, 0, -1, -1, 0)
    assert limiter.client.ttl("b") == -1, "a fixed budget does not expire"


def test_atmost_grants_what_is_there(limiter: Limiter) -> None:
    b = limiter.bucket("bytes", FROZEN, 10)
    b.consume(7)
    r = b.consume(5, atmost=True)
    assert (r.allowed, r.granted, r.remaining) == (True, 3, 0)
    assert not b.consume(5, atmost=True).allowed
    # n above capacity: ATMOST still sends what it may
    assert limiter.bucket("big", FROZEN, 10).consume(1000, atmost=True).granted == 10


def test_reservations_queue_first_come_first_served(limiter: Limiter) -> None:
    b = limiter.bucket("llm", 10, 1)
    assert b.reserve(max_wait=1).retry_after_ms == 0
    t0 = time.monotonic()
    first = b.reserve(max_wait=1)
    second = b.reserve(max_wait=1)
    between_ms = (time.monotonic() - t0) * 1000
    assert first.allowed and second.allowed
    assert 0 < first.retry_after_ms <= 100 and second.retry_after_ms <= 200
    # The second turn is one token (100 ms) after the first; each wait counts
    # from its own call, so the second is shorter by the time between the
    # calls (measured around both, plus the millisecond clock's tick).
    gap = second.retry_after_ms - first.retry_after_ms
    assert 100 - math.ceil(between_ms) - 1 <= gap <= 100, (gap, between_ms)
    info = b.info()
    assert info is not None and info.tokens < 0
    late = b.reserve(max_wait=0.15)
    assert not late.allowed and late.granted == 0


def test_refund(limiter: Limiter) -> None:
    b = limiter.bucket("tpm", FROZEN, 1000)
    assert b.refund(5) is None, "missing key: already full"
    b.consume(800)
    assert b.refund(300) == 500
    assert b.refund(10_000) == 1000


def test_consume_many_is_all_or_nothing(limiter: Limiter) -> None:
    rpm = limiter.bucket("{acme}:rpm", FROZEN, 3)
    tpm = limiter.bucket("{acme}:tpm", FROZEN, 1000)
    assert limiter.consume_many([(rpm, 1), (tpm, 600)]) == MultiResult(True, 0, (2, 400))
    denied = limiter.consume_many([(rpm, 1), (tpm, 600)])
    assert not denied.allowed and denied.remaining == (2, 400)
    assert limiter.consume_many([(rpm, 1), (tpm, 2000)]).never


def test_acquire_many_reserves_and_sleeps_once(limiter: Limiter) -> None:
    a = limiter.bucket("{m}:a", 20, 1)
    b = limiter.bucket("{m}:b", 10, 1)
    limiter.acquire_many([(a, 1), (b, 1)])
    start = time.monotonic()
    r = limiter.acquire_many([(a, 1), (b, 1)], timeout=1)
    waited = time.monotonic() - start
    assert r.allowed and 0 < r.retry_after_ms <= 100
    assert r.retry_after - 0.005 <= waited < r.retry_after + 0.5


def test_errors_are_the_modules(limiter: Limiter) -> None:
    with pytest.raises(redis.ResponseError, match="rate must be a non-negative decimal"):
        limiter.bucket("e", "-1", 5).consume()
    with pytest.raises(redis.ResponseError, match="rate out of range"):
        limiter.bucket("e", "1e-13", 5).consume()
    limiter.client.set("s", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        limiter.bucket("s", 1, 5).consume()
    with pytest.raises(TypeError):
        limiter.bucket("e", 1, 5).consume(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="capacity is required"):
        limiter.bucket("e", 1)


def test_rates_in_every_spelling(limiter: Limiter) -> None:
    for rate, shown in [(0.5, "0.5"), ("100/m", "1.666666666667"), ("1e-3", "0.001"), (10, "10")]:
        b = limiter.bucket(f"r{shown}", rate, 5)
        b.consume()
        info = b.info()
        assert info is not None and info.rate == Decimal(shown)


def test_info_numbers_are_numbers(limiter: Limiter) -> None:
    """Issue 10, point 10: TB.INFO's integers are ints, tokens and rate exact decimals."""
    b = limiter.bucket("typed", FROZEN, 10)
    b.consume(3)
    info = b.info()
    assert info is not None
    assert info.tokens == Decimal(7) and isinstance(info.tokens, Decimal)
    assert info.rate == Decimal("0.000000000001")
    for field in ("capacity", "updated_at_ms", "reset_after_ms", "ttl_ms"):
        assert type(getattr(info, field)) is int, field
    assert info.capacity == 10


def test_rate_strings_as_flask_limiter_writes_them(limiter: Limiter) -> None:
    per_minute = limiter.bucket("rl:m", "100/minute")
    assert (per_minute.rate, per_minute.capacity) == ("100/m", 100)
    assert limiter.bucket("rl:s", "10 per second").consume() == Result(True, 9, 0, 100, 1)
    assert limiter.bucket("rl:w", "5 per 10 seconds").rate == "0.5"
    group = limiter.limits("rl:alice", "2/second;3/day")
    assert [b.key for b in group.buckets] == ["rl:alice:{rl:alice}:2/1s", "rl:alice:{rl:alice}:3/86400s"]
    assert group.consume() == MultiResult(True, 0, (1, 2))
    assert group.consume() == MultiResult(True, 0, (0, 1))
    denied = group.consume()
    assert not denied.allowed and denied.remaining == (0, 1) and 0 < denied.retry_after_ms <= 500
    info = group.buckets[1].info()
    assert info is not None and info.tokens < 2, "all or nothing: the denial took nothing"
    with pytest.raises(ValueError, match="2 limits"):
        limiter.bucket("x", "1/second;2/minute")


def test_acquire_waits_without_polling(limiter: Limiter) -> None:
    b = limiter.bucket("w", 10, 1)
    b.consume()
    calls_before = _calls(limiter)
    start = time.monotonic()
    r = b.acquire(timeout=1)
    waited = time.monotonic() - start
    assert r.allowed and r.granted == 1 and 0 < r.retry_after_ms <= 100
    assert r.retry_after - 0.005 <= waited < 0.6, waited
    # one command (RESERVE, then a sleep on the client), not a polling loop
    assert _calls(limiter) - calls_before == 1


def test_acquire_gives_up_past_the_timeout(limiter: Limiter) -> None:
    b = limiter.bucket("t", FROZEN, 1)
    b.consume()
    start = time.monotonic()
    with pytest.raises(RateLimited) as e:
        b.acquire(timeout=0.5)
    assert time.monotonic() - start < 0.3, "answered at once, not after the timeout"
    assert not e.value.result.allowed
    # The wait on the exception itself (issue 19): for a Retry-After header.
    assert e.value.retry_after_ms == e.value.result.retry_after_ms > 500
    assert e.value.retry_after == e.value.retry_after_ms / 1000
    with pytest.raises(RateLimited) as never:
        limiter.bucket("n", 1, 1).acquire(2)
    assert never.value.result.never
    assert (never.value.retry_after_ms, never.value.retry_after) == (-1, math.inf)


def test_decorator_and_context_manager(limiter: Limiter) -> None:
    b = limiter.bucket("d", FROZEN, 2)
    calls = []

    @b.limit(timeout=0.1)
    def work(x: int) -> int:
        calls.append(x)
        return x * 2

    assert work(1) == 2
    with b.limit() as r:
        assert r.allowed and r.remaining == 0
    with pytest.raises(RateLimited):
        work(2)
    assert calls == [1]


def test_forced_backend(server: object) -> None:
    from tbserver import Server

    assert isinstance(server, Server)
    lua = Limiter(server.client(), backend="lua")
    assert lua.backend == "lua"
    assert lua.bucket("f", 1, 2).consume().reply == [1, 1, 0, 1000, 1]
    with pytest.raises(ValueError):
        Limiter(server.client(), backend="nope")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="from_url"):
        Limiter(server.url)  # type: ignore[arg-type]


def _calls(limiter: Limiter) -> int:
    """TB.CONSUME calls, or script calls, the server has run so far."""
    stats = limiter.client.info("commandstats")
    names = ("cmdstat_tb.consume", "cmdstat_evalsha", "cmdstat_eval")
    return sum(int(v["calls"]) for k, v in stats.items() if k in names)
