"""What a new user hit (issue 10), one test each, on both backends where the
point applies to both: socket timeouts, connections held while waiting,
cancelled waits, the least-privilege ACL user of docs/security.md, the server's longest
wait, and connections opened at start-up."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from decimal import Decimal
from typing import Any, Iterator

import pytest
import redis
import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, Limiter, RateLimited

FROZEN = "1e-12"
#: The least-privilege user of docs/security.md for the module, verbatim.
ACL_MODULE = (
    "ACL SETUSER limiter on >secret resetkeys ~rl:* resetchannels -@all "
    "+tb.consume +tb.mconsume +tb.refund +tb.info +cl.throttle"
)
#: The same for the Lua fallback (a server without the module): the script
#: runs by EVALSHA, and is loaded by EVAL (or SCRIPT LOAD) after NOSCRIPT;
#: a script runs with its caller's permissions, so the user also needs the
#: commands the script calls.
LUA_CALLS = "+time +type +hmget +hset +del +persist +pexpireat +pttl"
ACL_LUA_EVAL = f"ACL SETUSER limiter on >secret resetkeys ~rl:* resetchannels -@all +evalsha +eval {LUA_CALLS}"
ACL_LUA_LOAD = f"ACL SETUSER limiter on >secret resetkeys ~rl:* resetchannels -@all +evalsha +script|load {LUA_CALLS}"


class ShortTimeout(redis.Connection):
    """A connection whose socket timeout (1 s) is not in the pool's
    ``connection_kwargs``, as redis-py 8's default 5 s is not."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["socket_timeout"] = 1.0
        super().__init__(**kwargs)


class AsyncShortTimeout(aredis.Connection):
    def __init__(self, **kwargs: Any) -> None:
        kwargs["socket_timeout"] = 1.0
        super().__init__(**kwargs)


def tokens(server: Server, key: str, capacity: int = 1) -> Decimal:
    """The bucket's tokens as of now, read with a plain client (a missing
    key is a full bucket)."""
    lim = Limiter(server.client())
    info = lim.bucket(key, 1, capacity).info()
    return Decimal(capacity) if info is None else info.tokens


# 1. A wait longer than the connection's socket timeout.


def test_wait_longer_than_the_socket_timeout(server: Server) -> None:
    """redis-py 8 gives every connection a 5 s socket timeout that is not in
    connection_kwargs; a BLOCK longer than it timed out on the client and
    left its reservation taken. Here the timeout is 1 s and the wait 1.5 s."""
    pool = redis.ConnectionPool(connection_class=ShortTimeout, host="127.0.0.1", port=server.port)
    lim = Limiter(redis.Redis(connection_pool=pool))
    b = lim.bucket("rl:slow", 2, 1)
    b.consume()
    b.reserve()  # the next 0.5 s are taken: an acquire now waits 1 s ...
    start = time.monotonic()
    r = b.acquire(timeout=10)  # ... plus its own 0.5 s
    waited = time.monotonic() - start
    assert r.allowed and 0.9 < r.retry_after <= 1.0
    assert r.retry_after - 0.005 <= waited < r.retry_after + 0.5
    # exactly three tokens taken, none burnt by a timed-out attempt
    assert tokens(server, "rl:slow") > Decimal(-2) - Decimal("0.1")


async def test_async_wait_longer_than_the_socket_timeout(server: Server) -> None:
    pool = aredis.ConnectionPool(connection_class=AsyncShortTimeout, host="127.0.0.1", port=server.port)
    client = aredis.Redis(connection_pool=pool)
    lim = AsyncLimiter(client)
    b = lim.bucket("rl:aslow", 2, 1)
    await b.consume()
    await b.reserve()
    start = time.monotonic()
    r = await b.acquire(timeout=10)
    assert r.allowed and r.retry_after_ms > 900
    assert time.monotonic() - start >= r.retry_after - 0.005
    assert tokens(server, "rl:aslow") > Decimal(-2) - Decimal("0.1")
    await client.aclose()


def test_blocking_client_is_capped_by_its_socket_timeout(module_server: Server) -> None:
    """BLOCK on the dedicated connection when the connection can hold the
    wait; reserve and sleep when it cannot (its real timeout is 2 s here, so
    BLOCK reaches 1 s)."""
    module_server.client().flushall()

    class TwoSeconds(redis.Connection):
        def __init__(self, **kwargs: Any) -> None:
            kwargs["socket_timeout"] = 2.0
            super().__init__(**kwargs)

    pool = redis.ConnectionPool(connection_class=TwoSeconds, host="127.0.0.1", port=module_server.port)
    lim = Limiter(module_server.client(), blocking_client=redis.Redis(connection_pool=pool))
    b = lim.bucket("rl:block", 2, 1)
    before = _blocked(module_server)
    b.consume()  # decides the backend: the module
    start = time.monotonic()
    short = b.acquire(timeout=5)  # 0.5 s: BLOCK holds it
    assert short.allowed and short.retry_after_ms == 0, "the server held the reply"
    assert 0.45 <= time.monotonic() - start < 1.0
    assert _blocked(module_server) == before + 1
    b.reserve()
    b.reserve()
    start = time.monotonic()
    long = b.acquire(timeout=5)  # 1.5 s: longer than BLOCK may reach
    assert long.allowed and long.retry_after_ms > 1000, "reserved, then slept on the client"
    assert time.monotonic() - start >= long.retry_after - 0.005
    assert _blocked(module_server) == before + 1


def _blocked(server: Server) -> int:
    return int(server.client().info("tb")["tb_blocked_total"])


# 5. Waiting holds no connection.


async def test_waiters_hold_no_connection(server: Server) -> None:
    """Ten concurrent waiters on a pool of 5: every one is served, in about
    the time of the longest wait, on at most 5 connections."""
    lim = AsyncLimiter.from_url(server.url, max_connections=5)
    b = lim.bucket("rl:pool", 10, 1)
    before = server.connections_received()
    start = time.monotonic()
    results = await asyncio.gather(*(b.acquire(timeout=5) for _ in range(10)))
    elapsed = time.monotonic() - start
    assert all(r.allowed for r in results)
    assert sorted(r.retry_after_ms for r in results)[-1] <= 900
    assert elapsed < 0.9 + 0.6, "waits ran side by side, not one connection at a time"
    assert server.connections_received() - before - 1 <= 5
    await lim.aclose()


def test_sync_waiters_hold_no_connection(server: Server) -> None:
    pool = redis.BlockingConnectionPool(host="127.0.0.1", port=server.port, max_connections=2, timeout=0.2)
    lim = Limiter(redis.Redis(connection_pool=pool))
    b = lim.bucket("rl:spool", 10, 1)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            b.acquire(timeout=5)
        except BaseException as e:  # noqa: BLE001 (collected and asserted)
            errors.append(e)

    threads = [threading.Thread(target=wait) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == [], "no thread waited for a connection held by a sleeper"


# 6. A wait cancelled on the client gives back what it reserved.


async def test_cancelled_wait_gives_back_its_reservation(server: Server) -> None:
    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    b = lim.bucket("rl:cancel", 1, 1)
    await b.consume()
    held = tokens(server, "rl:cancel")
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(b.acquire(timeout=5), 0.3)  # waits ~1 s: cancelled
    await lim.aclose()  # lets the background refund finish
    after = tokens(server, "rl:cancel")
    assert after >= held, f"the reservation was given back ({held} -> {after})"
    await client.aclose()


async def test_cancelled_while_the_reply_is_on_its_way(server: Server) -> None:
    """Cancelled after the server took the tokens but before the reply
    reached the caller: the reply is still read, and the tokens given back."""
    sent = asyncio.Event()
    release = asyncio.Event()

    class Slow(aredis.Redis):
        async def execute_command(self, *args: Any, **options: Any) -> Any:
            reply = await super().execute_command(*args, **options)
            if str(args[0]) in ("TB.CONSUME", "EVALSHA") and not sent.is_set():
                sent.set()
                await release.wait()  # the reply is "on its way"
            return reply

    client = Slow(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    b = lim.bucket("rl:inflight", FROZEN, 5)
    task = asyncio.ensure_future(b.consume(3))
    await sent.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert tokens(server, "rl:inflight", 5) == 2, "taken on the server, not yet given back"
    release.set()
    await lim.aclose()
    assert tokens(server, "rl:inflight", 5) == 5
    await client.aclose()


def test_interrupted_sleep_gives_back_its_reservation(server: Server) -> None:
    """An exception raised in the sleeping thread (Celery's soft time limit,
    a KeyboardInterrupt) gives the reservation back before it goes on."""

    class Interrupted(Exception):
        pass

    def raise_interrupted(signum: int, frame: object) -> None:
        raise Interrupted

    lim = Limiter(server.client())
    b = lim.bucket("rl:interrupt", 1, 1)
    b.consume()
    held = tokens(server, "rl:interrupt")
    old = signal.signal(signal.SIGALRM, raise_interrupted)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Interrupted):
            b.acquire(timeout=5)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert tokens(server, "rl:interrupt") >= held


# 3. The least-privilege user of docs/security.md.


@pytest.fixture
def acl_user(server: Server) -> Iterator[list[str]]:
    """Applies the ACL line of docs/security.md for the server's backend (exactly as
    written) and yields the lines applied; removes the user afterwards."""
    admin = server.client()
    lines = [ACL_MODULE] if server.with_module else [ACL_LUA_EVAL, ACL_LUA_LOAD]
    yield lines
    admin.execute_command("ACL", "DELUSER", "limiter")


def test_least_privilege_user_works_with_defaults(server: Server, acl_user: list[str]) -> None:
    admin = server.client()
    for line in acl_user:
        admin.flushall()
        admin.script_flush()
        admin.execute_command(*line.split())
        client = server.client(username="limiter", password="secret")
        lim = Limiter(client)
        _every_method(lim)
        assert lim.backend == ("module" if server.with_module else "lua")
        with pytest.raises(redis.exceptions.NoPermissionError):
            lim.bucket("other:key", 1, 1).consume()
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get("rl:a")
        client.close()


async def test_async_least_privilege_user(server: Server, acl_user: list[str]) -> None:
    server.client().execute_command(*acl_user[0].split())
    client = aredis.Redis(host="127.0.0.1", port=server.port, username="limiter", password="secret")
    lim = AsyncLimiter(client)
    b = lim.bucket("rl:async", 10, 2)
    assert (await b.consume()).allowed
    assert (await b.acquire(2)).allowed
    assert await b.info() is not None
    assert (await lim.limits("rl:g", "5/second").acquire()).allowed
    await client.aclose()


def _every_method(lim: Limiter) -> None:
    b = lim.bucket("rl:a", 10, 2)
    assert b.consume().allowed and b.peek().allowed
    assert b.reserve().allowed
    assert b.acquire().allowed
    assert b.refund(1) is not None
    assert b.info() is not None
    other = lim.bucket("rl:b", 10, 2)
    assert lim.consume_many([(b, 1), (other, 1)]).allowed is not None
    assert lim.acquire_many([(b, 1), (other, 1)]).allowed
    group = lim.limits("rl:group", "10/second;100/minute")
    assert group.acquire().allowed
    with b.limit():
        pass


# 8. The server's longest wait.


@pytest.fixture(scope="module")
def production_server() -> Iterator[Server]:
    """The module as docs/operations/configuration.md loads it: tb.max-wait-ms 10000."""
    s = Server(with_module=True, module_args=["max-wait-ms", "10000"])
    yield s
    s.stop()


def stated_max_wait(server: Server) -> float | None:
    """The longest wait the server says it accepts in its error (``ERR wait
    exceeds tb.max-wait-ms (N)``), or None when its error does not say."""
    with pytest.raises(redis.ResponseError) as e:
        server.client().execute_command("TB.CONSUME", "rl:probe", 1, 1, 1, "RESERVE", 86_400_000)
    m = re.search(r"\((\d+)\)", str(e.value))
    return int(m.group(1)) / 1000 if m else None


def learned_as_stated(lim: Limiter | AsyncLimiter, server: Server, actual: float) -> None:
    """The client learned the server's longest wait: exactly when the server
    states it, else (older servers) by halving, never above the real one."""
    assert lim.max_wait is not None
    if stated_max_wait(server) is not None:
        assert lim.max_wait == actual
    else:
        assert actual / 2 < lim.max_wait <= actual


def test_defaults_work_under_the_production_max_wait(production_server: Server) -> None:
    production_server.client().flushall()
    lim = Limiter(production_server.client())
    b = lim.bucket("rl:full", 1, 5)
    assert b.reserve(max_wait=60).allowed
    assert b.acquire().allowed
    with b.limit():
        pass
    other = lim.bucket("rl:other", 1, 5)
    assert lim.acquire_many([(b, 1), (other, 1)]).allowed
    learned_as_stated(lim, production_server, 10.0)
    assert lim.limits("rl:g", "1/second").acquire().allowed
    fresh = Limiter(production_server.client())
    assert fresh.acquire_many([(b, 1), (other, 1)]).allowed
    assert fresh.limits("rl:g2", "1/second").acquire().allowed


async def test_async_defaults_under_the_production_max_wait(production_server: Server) -> None:
    client = aredis.Redis(host="127.0.0.1", port=production_server.port)
    lim = AsyncLimiter(client)
    b = lim.bucket("rl:afull", 1, 5)
    assert (await b.reserve(max_wait=60)).allowed
    assert (await b.acquire()).allowed
    async with b.limit():
        pass
    learned_as_stated(lim, production_server, 10.0)
    await client.aclose()


def test_a_wait_longer_than_the_server_allows() -> None:
    """The caller allows 3 s, the server reserves at most 1 s ahead, the
    tokens come in 1.5 s: the client sleeps, holding nothing, until they are
    within what the server reserves, then reserves its turn and sleeps
    again."""
    s = Server(with_module=True, module_args=["max-wait-ms", "1000"])
    try:
        raw = s.client()
        lim = Limiter(s.client())
        b = lim.bucket("rl:far", 2, 1)
        b.consume()
        emptied = time.monotonic()  # turns count from here
        for _ in range(2):  # the next turn is 1.5 s away
            assert raw.execute_command("TB.CONSUME", "rl:far", 2, 1, 1, "RESERVE", 1000)[0] == 1
        r = b.acquire(timeout=3)
        waited = time.monotonic() - emptied
        assert r.allowed and 1.5 - 0.01 <= waited < 2.0, waited
        learned_as_stated(lim, s, 1.0)
        for _ in range(2):  # the next turn is 1.5 s away again
            assert raw.execute_command("TB.CONSUME", "rl:far", 2, 1, 1, "RESERVE", 1000)[0] == 1
        start = time.monotonic()
        with pytest.raises(RateLimited):
            b.acquire(timeout=1.2)
        assert time.monotonic() - start < 0.3, "refused at once, not after sleeping"
    finally:
        s.stop()


# 9. Connections opened by concurrent first calls.


async def test_concurrent_first_calls_share_one_pool(server: Server) -> None:
    lim = AsyncLimiter.from_url(server.url, max_connections=3)
    b = lim.bucket("rl:start", 100, 100)
    before = server.connections_received()
    results = await asyncio.gather(*(b.consume() for _ in range(10)))
    assert all(r.allowed for r in results)
    assert server.connections_received() - before - 1 <= 3
    await lim.aclose()
