"""Waiting for a lease server-side (``BLOCK`` with ``LEASE``) on the
blocking connection: one call per grant, instead of polling."""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, Limiter


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
