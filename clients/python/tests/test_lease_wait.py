"""Waiting for a lease server-side (``BLOCK`` with ``LEASE``) on the
blocking connection: one call per grant, instead of polling."""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, Limiter, RateLimited


def _consume_calls(server: Server) -> int:
    stats = server.client().info("commandstats").get("cmdstat_tb.consume", {})
    return int(stats.get("calls", 0)) if isinstance(stats, dict) else 0


def _blocked_now(server: Server) -> int:
    return int(server.client().info("tb")["tb_blocked_now"])


def test_lease_waits_server_side_one_call(module_server: Server) -> None:
    module_server.client().flushall()
    lim = Limiter(module_server.client(), blocking_client=redis.Redis(port=module_server.port))
    slot = lim.bucket("rl:lw:slot", 0, 1)
    got: list[float] = []
    held = slot.lease(ttl=60)
    held.__enter__()
    before = _consume_calls(module_server)

    def waiter() -> None:
        with slot.lease(ttl=60, timeout=10):
            got.append(time.monotonic())

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 10
    while _blocked_now(module_server) != 1:
        assert time.monotonic() < deadline, "the waiter never waited on the server"
        time.sleep(0.01)
    released = time.monotonic()
    held.__exit__(None, None, None)
    t.join(10)
    assert got and got[0] >= released
    assert _consume_calls(module_server) - before == 1, "one TB.CONSUME for the wait and the grant"


def test_async_lease_many_waits_server_side_one_call(module_server: Server) -> None:
    module_server.client().flushall()

    async def main() -> None:
        lim = AsyncLimiter(aredis.Redis(port=module_server.port), blocking_client=aredis.Redis(port=module_server.port))
        slot = lim.bucket("{lw}slot", 0, 1)
        rpm = lim.bucket("{lw}rpm", "100/m", 100)
        first = slot.lease(ttl=60)
        await first.__aenter__()
        calls = module_server.client().info("commandstats").get("cmdstat_tb.mconsume", {})
        before = int(calls.get("calls", 0)) if isinstance(calls, dict) else 0

        async def waiter() -> None:
            async with lim.lease_many([(rpm, 1), (slot, 1)], ttl={1: 60}, timeout=10):
                pass

        task = asyncio.ensure_future(waiter())
        deadline = time.monotonic() + 10
        while _blocked_now(module_server) != 1:
            assert time.monotonic() < deadline, "the waiter never waited on the server"
            await asyncio.sleep(0.01)
        await first.__aexit__(None, None, None)
        await asyncio.wait_for(task, 10)
        after = int(module_server.client().info("commandstats")["cmdstat_tb.mconsume"]["calls"])
        assert after - before == 1, "one TB.MCONSUME for the wait and the grant"

    asyncio.run(main())


def test_a_server_that_will_not_hold_the_wait_is_not_hammered(module_server: Server) -> None:
    """Past the server's tb.max-blocked it answers BLOCK at once: the client
    then backs off as polling does, rather than calling in a tight loop."""
    module_server.client().flushall()
    admin = module_server.client()
    admin.execute_command("TB.CONFIG", "SET", "max-blocked", "0")  # type: ignore[no-untyped-call]
    try:
        lim = Limiter(module_server.client(), blocking_client=redis.Redis(port=module_server.port))
        slot = lim.bucket("rl:lw:full", 0, 1)
        held = slot.lease(ttl=60)
        held.__enter__()
        before = _consume_calls(module_server)
        start = time.monotonic()
        try:
            with slot.lease(ttl=60, timeout=0.5):
                raise AssertionError("the slot is held")
        except RateLimited:
            pass
        assert time.monotonic() - start >= 0.45
        calls = _consume_calls(module_server) - before
        assert 1 <= calls <= 12, f"{calls} calls in 0.5 s: backing off from 10 ms to 500 ms"
        held.__exit__(None, None, None)
    finally:
        admin.execute_command("TB.CONFIG", "SET", "max-blocked", "10000")  # type: ignore[no-untyped-call]
