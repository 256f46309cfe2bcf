"""Byte streams paced by a bucket whose tokens are bytes.

    user = limiter.bucket(f"bw:{name}", rate=10_000_000, capacity=1_000_000)
    async for block in pace(source, user):          # 10 MB/s, 1 MB burst
        await send(block)

The stream is cut into chunks (64 KiB by default, never more than the
smallest capacity) and each chunk waits for its bytes: one reservation, then
one sleep on the client, so a stream makes ``rate / chunk`` calls per second
(153 at 10 MB/s), whatever its backlog. Asking for single bytes instead
(ATMOST, then retrying after a denial's wait, which is the wait for *one*
byte) makes hundreds of calls per second per stream.

Burst and average: over any ``T`` seconds a bucket lets through at most
``capacity + rate * T`` bytes. A capacity of a whole second of the rate
lets a stream run at up to twice the rate for its first second, and a 10 s
download average 10% above the rate; a capacity of a chunk or a tenth of a
second keeps every stretch close to the rate. With several buckets (a
user's and a global one) every chunk comes from all of them at once
(TB.MCONSUME), all or nothing, and reservations queue first come, first
served across streams.

A chunk's bytes are taken before it is sent: a stream that stops early has
used no more than it sent plus one chunk.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from typing import Union

from .aio import AsyncTokenBucket
from .sync import TokenBucket

#: Bytes taken per call by default.
DEFAULT_CHUNK = 64 * 1024


def chunk_size(buckets: Sequence[TokenBucket] | Sequence[AsyncTokenBucket], chunk: int) -> int:
    """The chunk actually used: ``chunk``, at most the smallest capacity."""
    if not buckets:
        raise ValueError("pace needs at least one bucket")
    size = min(chunk, *(b.capacity for b in buckets))
    if size <= 0:
        raise ValueError("chunk and every capacity must be positive")
    return size


def rechunk(source: Iterable[bytes], size: int) -> Iterator[bytes]:
    """The bytes of ``source`` in pieces of exactly ``size`` (the last may be shorter)."""
    buf = bytearray()
    for block in source:
        buf += block
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


async def arechunk(source: AsyncIterable[bytes] | Iterable[bytes], size: int) -> AsyncIterator[bytes]:
    """:func:`rechunk` for an async (or plain) iterable."""
    if not isinstance(source, AsyncIterable):
        for piece in rechunk(source, size):
            yield piece
        return
    buf = bytearray()
    async for block in source:
        buf += block
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)


def pace_sync(
    source: Iterable[bytes], *buckets: TokenBucket, chunk: int = DEFAULT_CHUNK, timeout: float | None = None
) -> Iterator[bytes]:
    """Yields ``source`` in chunks, each once its bytes are taken from every
    bucket (blocking client). ``timeout`` bounds each chunk's wait
    (:class:`~tb_limiter.RateLimited` past it)."""
    size = chunk_size(buckets, chunk)
    for piece in rechunk(source, size):
        take_sync(buckets, len(piece), timeout)
        yield piece


async def pace(
    source: Union[AsyncIterable[bytes], Iterable[bytes]],
    *buckets: AsyncTokenBucket,
    chunk: int = DEFAULT_CHUNK,
    timeout: float | None = None,
) -> AsyncIterator[bytes]:
    """Yields ``source`` in chunks, each once its bytes are taken from every
    bucket (asyncio). A cancelled stream gives back the chunk it was
    waiting for."""
    size = chunk_size(buckets, chunk)
    async for piece in arechunk(source, size):
        await take(buckets, len(piece), timeout)
        yield piece


# The one step that obtains a chunk's bytes. Fixed chunks today: one
# reservation, then one sleep. When the server can grant a minimum size
# (issue 13's chunked grants), this is where a stream asks for the rest of
# its bytes with a chunk as the minimum, and sends what it is granted.


def take_sync(buckets: Sequence[TokenBucket], n: int, timeout: float | None) -> None:
    """Takes ``n`` bytes from every bucket at once, waiting for them."""
    if len(buckets) == 1:
        buckets[0].acquire(n, timeout=timeout)
    else:
        buckets[0].limiter.acquire_many([(b, n) for b in buckets], timeout=timeout)


async def take(buckets: Sequence[AsyncTokenBucket], n: int, timeout: float | None) -> None:
    """:func:`take_sync`, awaited."""
    if len(buckets) == 1:
        await buckets[0].acquire(n, timeout=timeout)
    else:
        await buckets[0].limiter.acquire_many([(b, n) for b in buckets], timeout=timeout)
