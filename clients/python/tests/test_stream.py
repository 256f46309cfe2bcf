"""The byte-stream helper: at most one call per chunk whatever the backlog
(ATMOST MIN chunk), never more than ``capacity + rate * T`` bytes in any
``T`` seconds, and unsent grants given back."""

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
    # Every call grants at least a chunk (none is wasted on a denial), plus
    # the refund of the bytes granted and not sent when the stream ends
    # (an EVALSHA with the Lua fallback).
    assert calls(server) - before <= len(sizes) + 1, "at most one call per chunk"
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


def test_calls_per_second_follow_rate_over_chunk(server: Server) -> None:
    """A stream alone on its bucket makes at most about ``rate / chunk``
    calls per second (40 here), where asking for single bytes made over a
    thousand."""
    lim = Limiter(server.client())
    bw = lim.bucket("bw:calls", RATE, CHUNK)  # no burst beyond one chunk
    bw.peek()
    pieces = 30
    before = calls(server)
    start = time.monotonic()
    sent = sum(len(p) for p in pace_sync((b"z" * CHUNK for _ in range(pieces)), bw, chunk=CHUNK))
    elapsed = time.monotonic() - start
    made = calls(server) - before
    assert sent == pieces * CHUNK
    # One call per chunk at most (plus a refund at the end); the time is at
    # least what the rate allows after the first chunk.
    assert made <= pieces + 1, made
    assert elapsed >= (sent - CHUNK) / RATE - 0.01
    per_second = made / elapsed
    bound = (pieces + 1) * RATE / (sent - CHUNK)
    print(f"stream calls/s: {per_second:.1f} (bound {bound:.1f}, rate/chunk {RATE / CHUNK:.0f})")
    assert per_second <= bound + 1, (made, elapsed)


def test_closing_early_gives_back_unsent_bytes(server: Server) -> None:
    """A stream granted more than it sent gives the rest back when closed."""
    lim = Limiter(server.client())
    bw = lim.bucket("bw:close", "1e-12", 100)  # no refill to speak of
    stream = pace_sync((b"w" * 10 for _ in range(50)), bw, chunk=10)
    assert next(stream) == b"w" * 10
    info = bw.info()
    assert info is not None and info.tokens == 60, "four chunks granted in one call"
    stream.close()
    info = bw.info()
    assert info is not None and info.tokens == 90, "the three unsent chunks came back"


async def test_async_stream_gives_back_when_cancelled(server: Server) -> None:
    """Cancelled while its consumer is busy: the bytes it was granted and did
    not send come back (the stream closed with ``aclosing``)."""
    import asyncio
    from contextlib import aclosing

    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    bw = lim.bucket("bw:cancel", "1e-3", 45)
    got: list[bytes] = []

    async def run() -> None:
        async with aclosing(pace((b"v" * 10 for _ in range(10)), bw, chunk=10)) as stream:
            async for piece in stream:
                got.append(piece)
                await asyncio.Event().wait()  # a consumer that never finishes sending

    task = asyncio.create_task(run())
    while not got:
        await asyncio.sleep(0.01)
    info = await bw.info()
    assert info is not None and 5 <= info.tokens < 6, "four chunks granted in one call"
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    info = await bw.info()
    assert info is not None and 35 <= info.tokens < 36, "the three unsent chunks came back"
    await client.aclose()


async def test_streams_sharing_a_binding_global_cap_make_one_call_per_chunk(server: Server) -> None:
    """Three streams whose own buckets allow twice the global rate: the
    global cap binds, the streams contend for it, and still no call is
    wasted (a stream that finds the cap taken reserves its next chunk in
    the queue instead of retrying), and the global bound holds. (The
    buckets hold two chunks: the reservation that makes up for the denial
    that revealed the contention takes two.)"""
    import asyncio

    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    glob = lim.bucket("{bw}:shared", RATE, 2 * CHUNK)
    await glob.peek()
    streams = 3
    per_stream = 12 * CHUNK  # 0.9 s of the global rate in all
    times: list[float] = []
    sizes: list[int] = []
    sent = [0] * streams

    async def one(i: int) -> None:
        user = lim.bucket("{bw}:u%d" % i, RATE * 2 // streams, 2 * CHUNK)
        async for piece in pace((b"s" * CHUNK for _ in range(per_stream // CHUNK)), user, glob, chunk=CHUNK):
            times.append(time.monotonic())
            sizes.append(len(piece))
            sent[i] += len(piece)

    before = calls(server)
    start = time.monotonic()
    await asyncio.gather(*(one(i) for i in range(streams)))
    elapsed = time.monotonic() - start
    made = calls(server) - before
    chunks = streams * per_stream // CHUNK
    print(f"calls per chunk: {made / chunks:.2f} ({made} calls, {chunks} chunks, {elapsed:.2f} s)")
    assert sent == [per_stream] * streams
    # The Lua fallback counts each stream's final refund (an EVALSHA) too.
    refunds = 0 if server.with_module else streams
    assert made <= chunks + refunds, f"{made} calls for {chunks} chunks"
    order = sorted(range(len(times)), key=times.__getitem__)
    check_bound([times[i] for i in order], [sizes[i] for i in order], RATE, 2 * CHUNK)
    assert elapsed >= (chunks * CHUNK - 2 * CHUNK) / RATE - 0.01

    await client.aclose()


def test_sync_streams_sharing_a_binding_global_cap_make_one_call_per_chunk(server: Server) -> None:
    """The same with the blocking client, one thread per stream."""
    import threading

    lim = Limiter(server.client())
    glob = lim.bucket("bw:sync-shared", RATE, 2 * CHUNK)
    glob.peek()
    streams = 2
    per_stream = 12 * CHUNK
    sent = [0] * streams
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            user = Limiter(server.client()).bucket("bw:sync-u%d" % i, RATE, 2 * CHUNK)
            for piece in pace_sync((b"t" * CHUNK for _ in range(per_stream // CHUNK)), user,
                                   lim.bucket("bw:sync-shared", RATE, 2 * CHUNK), chunk=CHUNK):
                sent[i] += len(piece)
        except BaseException as e:  # reported below
            errors.append(e)

    before = calls(server)
    start = time.monotonic()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    elapsed = time.monotonic() - start
    assert not errors, errors
    made = calls(server) - before
    chunks = streams * per_stream // CHUNK
    print(f"sync calls per chunk: {made / chunks:.2f} ({made} calls, {chunks} chunks, {elapsed:.2f} s)")
    assert sent == [per_stream] * streams
    refunds = 0 if server.with_module else streams
    assert made <= chunks + refunds, f"{made} calls for {chunks} chunks"
    assert elapsed >= (chunks * CHUNK - 2 * CHUNK) / RATE - 0.01
