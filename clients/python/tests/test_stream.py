"""The byte-stream helper: one call per chunk whatever the backlog, and never
more than ``capacity + rate * T`` bytes in any ``T`` seconds."""

from __future__ import annotations

import time
from fractions import Fraction

import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, Limiter
from tb_limiter.stream import pace, pace_sync

RATE = 400_000  # bytes per second
CAPACITY = 40_000  # a tenth of a second
CHUNK = 10_000
TOTAL = 300_000  # 0.65 s after the burst


def check_bound(times: list[float], sizes: list[int], rate: int, capacity: int) -> None:
    """Chunk i+1..j were all granted after chunk i was sent and before chunk
    j was: their bytes are within the bound for t_j - t_i (plus 2 ms of
    clock difference between client and server)."""
    for i in range(len(times)):
        sent = 0
        for j in range(i + 1, len(times)):
            sent += sizes[j]
            window = times[j] - times[i] + 0.002
            assert sent <= capacity + rate * window, (i, j, sent, window)


def calls(server: Server) -> int:
    stats = server.client().info("commandstats")
    names = ("cmdstat_tb.consume", "cmdstat_tb.mconsume", "cmdstat_evalsha", "cmdstat_eval")
    return sum(int(v["calls"]) for k, v in stats.items() if k in names)


def test_sync_stream_keeps_the_bound(server: Server) -> None:
    lim = Limiter(server.client())
    bw = lim.bucket("bw:sync", RATE, CAPACITY)
    source = (b"x" * 7_000 for _ in range(TOTAL // 7_000 + 1))  # odd blocks: re-chunked
    bw.peek()  # decides the backend (and loads the script) before counting
    before = calls(server)
    times, sizes = [], []
    start = time.monotonic()
    for piece in pace_sync(source, bw, chunk=CHUNK):
        times.append(time.monotonic())
        sizes.append(len(piece))
    elapsed = time.monotonic() - start
    total = sum(sizes)
    assert total == (TOTAL // 7_000 + 1) * 7_000
    assert max(sizes) == CHUNK
    assert calls(server) - before == len(sizes), "one call per chunk, none wasted on denials"
    check_bound(times, sizes, RATE, CAPACITY)
    # the average: the burst, then the rate
    assert elapsed >= Fraction(total - CAPACITY, RATE) - Fraction(1, 100)


async def test_async_stream_with_a_global_cap(server: Server) -> None:
    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    user = lim.bucket("{bw}:user", RATE * 2, CAPACITY)
    glob = lim.bucket("{bw}:global", RATE, CAPACITY)

    async def source() -> object:
        for _ in range(TOTAL // CHUNK):
            yield b"y" * CHUNK

    times, sizes = [], []
    async for piece in pace(source(), user, glob, chunk=CHUNK):  # type: ignore[arg-type]
        times.append(time.monotonic())
        sizes.append(len(piece))
    assert sum(sizes) == TOTAL
    check_bound(times, sizes, RATE, CAPACITY)  # the tighter (global) bucket rules
    await client.aclose()
