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

Streams sharing a bucket (a global cap): a stream that is denied because
others took the bytes it expected RESERVEs its next chunk instead (see
:class:`Grants`): reservations queue first come, first served, are never
denied, and hold one chunk each, so contending streams take turns and
still make at most one call per chunk (given buckets of two chunks or
more).

Bytes are taken before they are sent: a stream holds at most four chunks
it has not sent yet (a contending one, two), and gives them back
(``TB.REFUND``) when it ends or is closed or cancelled early.
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
                n, reserve = grants.ask()
                grants.took(take_sync(buckets, n, size, reserve, grants.max_wait(deadline)), n, reserve, deadline)
            time.sleep(grants.until_ours())
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
                n, reserve = grants.ask()
                grants.took(await take(buckets, n, size, reserve, grants.max_wait(deadline)), n, reserve, deadline)
            await asyncio.sleep(grants.until_ours())
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
    when asking again can succeed, and whether the stream contends with
    others for its buckets.

    Uncontended, a call asks ``ATMOST MIN chunk`` for up to
    ``GRANT_CHUNKS`` chunks and is granted at least one. A denial means
    other streams took the bytes the stream expected (a shared global
    cap): from then on it RESERVEs its next chunk instead, which is never
    denied and queues it first come, first served behind the others, and
    sends the chunk when the reservation's wait is over. The first
    reservation after a denial takes one chunk more, so that the calls
    stay at most the chunks granted. It goes back to ``ATMOST`` when a
    reservation finds every bucket holding another chunk."""

    def __init__(self, buckets: Sequence[TokenBucket] | Sequence[AsyncTokenBucket], size: int) -> None:
        self.buckets = list(buckets)
        self.rates = [rate_per_second(b.rate) for b in buckets]
        #: The most one reservation may take: the smallest capacity.
        self.most = min(b.capacity for b in buckets)
        self.size = size
        self.credit = 0
        self.calls = 0
        #: Chunks granted so far (a call that granted none owes one).
        self.chunks = 0
        self.contended = False
        self._not_before = 0.0
        self._ours_at = 0.0

    def ask(self) -> tuple[int, bool]:
        """Bytes to ask for, and whether to reserve them: uncontended,
        enough to hold ``GRANT_CHUNKS`` chunks unsent (the server grants at
        least one chunk of them, or nothing); contended, a chunk, plus one
        for every call that granted nothing."""
        owed = max(0, self.calls - self.chunks)
        self.calls += 1
        if self.contended:
            return min(self.most, (1 + owed) * self.size), True
        return GRANT_CHUNKS * self.size - self.credit, False

    def max_wait(self, deadline: float | None) -> float | None:
        """The longest reservation worth making before ``deadline``."""
        return None if deadline is None else max(0.0, deadline - time.monotonic())

    def pause(self) -> float:
        """Seconds to sleep before the next call (0 when it may succeed now)."""
        return max(0.0, self._not_before - time.monotonic())

    def until_ours(self) -> float:
        """Seconds until the reserved bytes are the stream's to send."""
        return max(0.0, self._ours_at - time.monotonic())

    def took(self, r: Result | MultiResult, n: int, reserved: bool, deadline: float | None) -> None:
        """Books a reply to asking ``n`` bytes: a grant adds to the credit,
        and the next call waits until every bucket holds a chunk again (the
        remaining whole bytes are a lower bound of each bucket's level, so
        this is never early); a reservation adds ``n`` to the credit, to be
        sent after its wait, and the next one follows at once; a denial
        turns to reserving, or raises :class:`~tb_limiter.RateLimited` when
        the bytes never come or not before ``deadline``."""
        now = time.monotonic()
        granted = n if reserved and r.allowed else (r.granted or 0)
        remaining = [r.remaining] if isinstance(r, Result) else list(r.remaining)
        if r.allowed and granted > 0:
            self.credit += granted
            self.chunks += granted // self.size
            if reserved:
                self._ours_at = now + r.retry_after
                self._not_before = 0.0
                # The buckets held another chunk beyond this one: no
                # contention now.
                self.contended = not (r.retry_after == 0 and all(left >= self.size for left in remaining))
                return
            waits = [
                float((self.size - left) / rate)
                for left, rate in zip(remaining, self.rates)
                if left < self.size and rate > 0
            ]
            self._not_before = now + max(waits, default=0.0)
            return
        if r.never or (deadline is not None and now + r.retry_after > deadline):
            raise RateLimited(",".join(str(b.key) for b in self.buckets), r)
        if reserved:  # past the server's longest wait: try when it is shorter
            self._not_before = now + r.retry_after
        self.contended = True

    def unsent(self) -> list[tuple[BucketSpec, int]]:
        """What to give back: the credit, to every bucket."""
        return [(b, self.credit) for b in self.buckets]


def take_sync(
    buckets: Sequence[TokenBucket], n: int, size: int, reserve: bool = False, max_wait: float | None = None
) -> Result | MultiResult:
    """One call to every bucket at once: up to ``n`` bytes, at least
    ``size`` (or nothing); with ``reserve``, ``n`` bytes into debt if they
    come within ``max_wait``."""
    if reserve:
        if len(buckets) == 1:
            return buckets[0].reserve(n, max_wait=max_wait)
        return buckets[0].limiter.consume_many([(b, n) for b in buckets], max_wait=max_wait, reserve=True)
    if len(buckets) == 1:
        return buckets[0].consume(n, atmost=True, chunk=size)
    return buckets[0].limiter.consume_many([(b, n) for b in buckets], atmost=True, chunk=size)


async def take(
    buckets: Sequence[AsyncTokenBucket], n: int, size: int, reserve: bool = False, max_wait: float | None = None
) -> Result | MultiResult:
    """:func:`take_sync`, awaited."""
    if reserve:
        if len(buckets) == 1:
            return await buckets[0].reserve(n, max_wait=max_wait)
        return await buckets[0].limiter.consume_many([(b, n) for b in buckets], max_wait=max_wait, reserve=True)
    if len(buckets) == 1:
        return await buckets[0].consume(n, atmost=True, chunk=size)
    return await buckets[0].limiter.consume_many([(b, n) for b in buckets], atmost=True, chunk=size)
