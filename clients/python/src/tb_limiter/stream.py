"""Byte streams paced by a bucket whose tokens are bytes.

    user = limiter.bucket(f"bw:{name}", rate=10_000_000, capacity=1_000_000)
    async for block in pace(source, user):          # 10 MB/s, 1 MB burst
        await send(block)

The stream is cut into chunks (64 KiB by default, never more than the
smallest capacity). Each call asks for up to four chunks with ``TB.CONSUME
... ATMOST MIN chunk`` (``TB.MCONSUME ... ATMOST MIN chunk`` for several
buckets): the server grants at least a chunk or nothing, and a denial's
wait is the wait for a chunk. After a grant that left less than a chunk,
the stream sleeps until a chunk has refilled before asking again (the
rate is known), so a stream alone on its bucket makes at most ``rate /
chunk`` calls per second (153 at 10 MB/s), and fewer when it sends slower
than the rate or the bucket holds a burst. Asking for single bytes
instead (plain ATMOST, retrying after a denial's wait, the wait for *one*
byte) makes over a thousand calls per second per stream.

Burst and average: over any ``T`` seconds a bucket lets through at most
``capacity + rate * T`` bytes. A capacity of a whole second of the rate
lets a stream run at up to twice the rate for its first second, and a 10 s
download average 10% above the rate; a capacity of a chunk or a tenth of a
second keeps every stretch close to the rate. With several buckets (a
user's and a global one) every grant comes from all of them at once, the
same number of bytes from each.

Bytes are taken before they are sent: a stream holds at most four chunks
it has not sent yet, and gives them back (``TB.REFUND``) when it ends or is
closed or cancelled early. Nothing is taken while a stream waits, so
waiting streams hold nothing back from others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Sequence
from typing import Union

from . import _core
from ._rates import rate_per_second
from ._spec import BucketSpec
from ._types import MultiResult, RateLimited, Result
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
    """Yields ``source`` in chunks, each once its bytes are granted by every
    bucket (blocking client). ``timeout`` bounds each chunk's wait
    (:class:`~tb_limiter.RateLimited` past it)."""
    size = chunk_size(buckets, chunk)
    grants = Grants(buckets, size)
    try:
        for piece in rechunk(source, size):
            deadline = None if timeout is None else time.monotonic() + timeout
            while grants.credit < len(piece):
                time.sleep(grants.pause())
                grants.took(take_sync(buckets, grants.ask(), size), deadline)
            grants.credit -= len(piece)
            yield piece
    finally:
        if grants.credit > 0:
            lim = buckets[0].limiter
            lim._run(_core.undo(lim._server, grants.unsent()))


async def pace(
    source: Union[AsyncIterable[bytes], Iterable[bytes]],
    *buckets: AsyncTokenBucket,
    chunk: int = DEFAULT_CHUNK,
    timeout: float | None = None,
) -> AsyncIterator[bytes]:
    """Yields ``source`` in chunks, each once its bytes are granted by every
    bucket (asyncio). A stream closed or cancelled early gives back the
    bytes it was granted and did not send."""
    size = chunk_size(buckets, chunk)
    grants = Grants(buckets, size)
    try:
        async for piece in arechunk(source, size):
            deadline = None if timeout is None else time.monotonic() + timeout
            while grants.credit < len(piece):
                await asyncio.sleep(grants.pause())
                grants.took(await take(buckets, grants.ask(), size), deadline)
            grants.credit -= len(piece)
            yield piece
    finally:
        if grants.credit > 0:
            lim = buckets[0].limiter
            await lim._run(_core.undo(lim._server, grants.unsent()))


#: A call asks for up to this many chunks: what the buckets hold beyond a
#: chunk (a burst, or refill while the stream was busy sending) comes in the
#: same call.
GRANT_CHUNKS = 4


class Grants:
    """A stream's bookkeeping: bytes granted and not yet sent (``credit``),
    and when asking again can succeed."""

    def __init__(self, buckets: Sequence[TokenBucket] | Sequence[AsyncTokenBucket], size: int) -> None:
        self.buckets = list(buckets)
        self.rates = [rate_per_second(b.rate) for b in buckets]
        self.size = size
        self.credit = 0
        self.calls = 0
        self._not_before = 0.0

    def ask(self) -> int:
        """Bytes to ask for: enough to hold ``GRANT_CHUNKS`` chunks unsent
        (the server grants at least one chunk of them, or nothing)."""
        self.calls += 1
        return GRANT_CHUNKS * self.size - self.credit

    def pause(self) -> float:
        """Seconds to sleep before the next call (0 when it may succeed now)."""
        return max(0.0, self._not_before - time.monotonic())

    def took(self, r: Result | MultiResult, deadline: float | None) -> None:
        """Books a reply: a grant adds to the credit, and the next call waits
        until every bucket holds a chunk again (the remaining whole bytes are
        a lower bound of each bucket's level, so this is never early); a
        denial waits its ``retry_after``, or raises
        :class:`~tb_limiter.RateLimited` when that is never or past
        ``deadline``."""
        now = time.monotonic()
        granted = r.granted or 0
        if r.allowed and granted > 0:
            self.credit += granted
            remaining = [r.remaining] if isinstance(r, Result) else list(r.remaining)
            waits = [
                float((self.size - left) / rate)
                for left, rate in zip(remaining, self.rates)
                if left < self.size and rate > 0
            ]
            self._not_before = now + max(waits, default=0.0)
            return
        if r.never or (deadline is not None and now + r.retry_after > deadline):
            raise RateLimited(",".join(str(b.key) for b in self.buckets), r)
        self._not_before = now + r.retry_after

    def unsent(self) -> list[tuple[BucketSpec, int]]:
        """What to give back: the credit, to every bucket."""
        return [(b, self.credit) for b in self.buckets]


def take_sync(buckets: Sequence[TokenBucket], n: int, size: int) -> Result | MultiResult:
    """One call: up to ``n`` bytes from every bucket at once, at least ``size``
    (or nothing)."""
    if len(buckets) == 1:
        return buckets[0].consume(n, atmost=True, chunk=size)
    return buckets[0].limiter.consume_many([(b, n) for b in buckets], atmost=True, chunk=size)


async def take(buckets: Sequence[AsyncTokenBucket], n: int, size: int) -> Result | MultiResult:
    """:func:`take_sync`, awaited."""
    if len(buckets) == 1:
        return await buckets[0].consume(n, atmost=True, chunk=size)
    return await buckets[0].limiter.consume_many([(b, n) for b in buckets], atmost=True, chunk=size)
