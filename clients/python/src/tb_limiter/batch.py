"""Hot keys: a bucket's tokens handed out locally from batches.

    llm = limiter.bucket("llm:global", rate=2000, capacity=2000)
    with llm.batched(50, hold=0.05, max_hold=0.5) as local:
        if local.consume():       # one server call per batch of up to 50
            call_model()

One global key puts every worker of a fleet through one Redis thread. A
batcher takes up to ``batch`` tokens in one call (``TB.CONSUME ... ATMOST
batch MIN n``: at least what the caller asked for, or nothing) and hands them
out to the threads (or tasks) of its process without a call. The global bound
stays exact: every token handed out was granted by the server, so over any
``T`` seconds the fleet gets at most ``capacity + rate * T``.

What a batcher holds and has not handed out goes back (``TB.REFUND``) when
nothing asked for ``hold`` seconds, when it is closed, and at the latest
``max_hold`` seconds after it was taken: hoarding keeps tokens from other
workers for at most ``max_hold``. A refund never raises a bucket above its
capacity, so tokens given back into a full bucket are lost, never minted.

A process that dies (``kill -9``, a crash) gives nothing back: the bucket
stays short by what it held, the unused part of its current batch, which is
at most ``batch - 1`` tokens per process (after a grant of up to
``max(batch, n) - held`` and handing out ``n``, it holds less than a
batch), until the bucket refills it at its rate. It never admits more than
the limit: every token handed out was granted.

:class:`Batcher` is thread-safe (blocking client); :class:`AsyncBatcher` is
its asyncio twin. Each gives back through a helper (a thread, a task) that
runs only while it holds tokens.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING

from ._types import RateLimited, Result

if TYPE_CHECKING:
    from .aio import AsyncTokenBucket
    from .sync import TokenBucket

log = logging.getLogger("tb_limiter")


def _check(bucket_capacity: int, batch: int, hold: float, max_hold: float) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError("batch must be an int of at least 1")
    if batch > bucket_capacity:
        raise ValueError(f"batch ({batch}) must not exceed the bucket's capacity ({bucket_capacity})")
    if not 0 <= hold <= max_hold:
        raise ValueError("need 0 <= hold <= max_hold (seconds)")


class _Ledger:
    """What a batcher holds: tokens taken and not handed out, when they were
    taken, when one was last handed out; and counters."""

    def __init__(self, batch: int, hold: float, max_hold: float) -> None:
        self.batch, self.hold, self.max_hold = batch, hold, max_hold
        self.local = 0
        self.taken_at = 0.0
        self.last_use = 0.0
        self.closed = False
        #: Tokens handed out, batches taken, tokens given back (counters).
        self.handed_out = 0
        self.batches = 0
        self.given_back = 0

    def serve(self, n: int) -> bool:
        """Hands out ``n`` held tokens if there are that many."""
        if self.closed:
            raise RuntimeError("the batcher is closed")
        if self.local < n:
            return False
        self.local -= n
        self.handed_out += n
        self.last_use = time.monotonic()
        return True

    def ask(self, n: int) -> tuple[int, int]:
        """The call's ``n`` and its smallest grant: enough to hold a batch
        (or ``n``), at least what is missing for ``n``."""
        return max(self.batch, n) - self.local, n - self.local

    def book(self, r: Result) -> None:
        """Books a grant: the held tokens count as taken now."""
        if r.allowed and r.granted > 0:
            self.local += r.granted
            self.batches += 1
            self.taken_at = time.monotonic()

    def due(self) -> float:
        """When what is held must go back (monotonic seconds)."""
        return min(self.last_use + self.hold, self.taken_at + self.max_hold)


class Batcher:
    """Thread-safe batches of a bucket's tokens (see the module's doc).
    Made by :meth:`tb_limiter.TokenBucket.batched`."""

    def __init__(self, bucket: "TokenBucket", batch: int, *, hold: float = 0.05, max_hold: float = 0.5) -> None:
        _check(bucket.capacity, batch, hold, max_hold)
        self.bucket = bucket
        self._ledger = _Ledger(batch, hold, max_hold)
        self._cond = threading.Condition()
        self._helper: threading.Thread | None = None
        # Whether a helper is in charge of what is held: set and cleared
        # under the lock (a thread that is leaving may still be alive).
        self._helping = False

    @property
    def held(self) -> int:
        """Tokens taken from the server and not handed out yet."""
        return self._ledger.local

    @property
    def handed_out(self) -> int:
        """Tokens handed out so far."""
        return self._ledger.handed_out

    @property
    def batches(self) -> int:
        """Batches taken from the server so far (one call each)."""
        return self._ledger.batches

    def consume(self, n: int = 1) -> Result | None:
        """Takes ``n`` tokens: from the held batch when it has them (returns
        None, no call), else with one call that takes a new batch. Returns
        the server's reply when it made a call: ``allowed`` says whether the
        ``n`` tokens were handed out, ``retry_after`` how long until they
        could be."""
        with self._cond:
            led = self._ledger
            if led.serve(n):
                return None
            want, least = led.ask(n)
            r = self.bucket.consume(want, atmost=True, chunk=least)
            led.book(r)
            if r.allowed:
                led.serve(n)
                self._start_helper()
            return r

    def acquire(self, n: int = 1, *, timeout: float | None = None) -> None:
        """Takes ``n`` tokens, sleeping (holding no lock) between calls until
        the server can grant them; :class:`~tb_limiter.RateLimited` when that
        is never or later than ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            r = self.consume(n)
            if r is None or r.allowed:
                return
            if r.never or (deadline is not None and time.monotonic() + r.retry_after > deadline):
                raise RateLimited(str(self.bucket.key), r)
            time.sleep(r.retry_after)

    def close(self) -> None:
        """Gives back what is held and stops the helper. Idempotent."""
        with self._cond:
            self._ledger.closed = True
            self._give_back()
            self._cond.notify_all()
            helper = self._helper
        if helper is not None and helper is not threading.current_thread():
            helper.join()

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _give_back(self) -> None:
        led = self._ledger
        if led.local > 0:
            n, led.local = led.local, 0
            led.given_back += n
            self.bucket.refund(n)

    def _start_helper(self) -> None:
        """Starts a helper unless one is in charge (called under the lock)."""
        if not self._helping:
            self._helping = True
            self._helper = threading.Thread(target=self._run, name="tb-batcher", daemon=True)
            self._helper.start()

    def _run(self) -> None:
        """Gives back what is held once it is due; ends when nothing is held."""
        with self._cond:
            try:
                self._watch()
            finally:
                self._helping = False

    def _watch(self) -> None:
        led = self._ledger
        while led.local > 0 and not led.closed:
            left = led.due() - time.monotonic()
            if left <= 0:
                try:
                    self._give_back()
                except Exception as e:  # noqa: BLE001 (a helper thread has no caller to raise to)
                    log.warning("tb_limiter: could not give back to %r: %s", self.bucket.key, e)
            else:
                self._cond.wait(left)


class AsyncBatcher:
    """:class:`Batcher` for asyncio: one task of the event loop gives back
    what is held. Made by :meth:`tb_limiter.AsyncTokenBucket.batched`."""

    def __init__(
        self, bucket: "AsyncTokenBucket", batch: int, *, hold: float = 0.05, max_hold: float = 0.5
    ) -> None:
        _check(bucket.capacity, batch, hold, max_hold)
        self.bucket = bucket
        self._ledger = _Ledger(batch, hold, max_hold)
        self._lock = asyncio.Lock()
        self._helper: asyncio.Task[None] | None = None

    @property
    def held(self) -> int:
        """Tokens taken from the server and not handed out yet."""
        return self._ledger.local

    @property
    def handed_out(self) -> int:
        """Tokens handed out so far."""
        return self._ledger.handed_out

    @property
    def batches(self) -> int:
        """Batches taken from the server so far (one call each)."""
        return self._ledger.batches

    async def consume(self, n: int = 1) -> Result | None:
        """See :meth:`Batcher.consume`."""
        led = self._ledger
        if led.serve(n):
            return None
        async with self._lock:
            if led.serve(n):  # another task took a batch meanwhile
                return None
            want, least = led.ask(n)
            r = await self.bucket.consume(want, atmost=True, chunk=least)
            led.book(r)
            if r.allowed:
                led.serve(n)
                if self._helper is None or self._helper.done():
                    self._helper = asyncio.get_running_loop().create_task(self._run())
            return r

    async def acquire(self, n: int = 1, *, timeout: float | None = None) -> None:
        """See :meth:`Batcher.acquire`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            r = await self.consume(n)
            if r is None or r.allowed:
                return
            if r.never or (deadline is not None and time.monotonic() + r.retry_after > deadline):
                raise RateLimited(str(self.bucket.key), r)
            await asyncio.sleep(r.retry_after)

    async def aclose(self) -> None:
        """Gives back what is held and stops the helper. Idempotent."""
        async with self._lock:
            self._ledger.closed = True
            await self._give_back()
        helper = self._helper
        if helper is not None and helper is not asyncio.current_task():
            helper.cancel()
            try:
                await helper
            except asyncio.CancelledError:
                pass

    async def __aenter__(self) -> "AsyncBatcher":
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def _give_back(self) -> None:
        led = self._ledger
        if led.local > 0:
            n, led.local = led.local, 0
            led.given_back += n
            await self.bucket.refund(n)

    async def _run(self) -> None:
        led = self._ledger
        while True:
            async with self._lock:
                if led.local == 0 or led.closed:
                    return
                left = led.due() - time.monotonic()
                if left <= 0:
                    try:
                        await self._give_back()
                    except Exception as e:  # noqa: BLE001 (a helper task has no caller to raise to)
                        log.warning("tb_limiter: could not give back to %r: %s", self.bucket.key, e)
                    return
            await asyncio.sleep(left)
