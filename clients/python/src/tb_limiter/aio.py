"""The asyncio client: :class:`AsyncLimiter`, :class:`AsyncTokenBucket` and
:class:`AsyncBucketGroup`, the same operations as :mod:`tb_limiter.sync`,
awaited.

Cancellation (``asyncio.timeout``, a task cancelled, an ASGI client gone)
takes effect at once, and what it leaves behind is finished in the
background: a reservation whose sleep is cancelled is given back
(``TB.REFUND``), and so is a grant or reservation whose reply was still on
its way (the command is shielded, so the reply is read, not lost).
"""

from __future__ import annotations

import asyncio
import functools
import os
from types import TracebackType
from typing import Any, Awaitable, Callable, Iterable, Literal, Mapping, Sequence, TypeVar, Union, cast

import redis
import redis.asyncio as aredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from . import _core
from ._core import Block, Command, Plan, ReturnOn, Sleep
from .batch import AsyncBatcher
from ._protocol import Call, FlowName, flow_args
from ._rates import LimitSpec, RateLike
from ._spec import BucketSpec, group_specs
from ._types import Backend, BucketInfo, MultiResult, Result

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])
T = TypeVar("T")

#: The redis-py asyncio clients an :class:`AsyncLimiter` takes.
AsyncClient = Union[aredis.Redis, AsyncRedisCluster]

#: How long ``aclose`` lets background refunds finish.
CLOSE_DEADLINE = 5.0


class AsyncLimiter:
    """Entry point of the asyncio client (FastAPI, aiohttp, ...):
    ``AsyncLimiter(redis.asyncio.Redis(...))``, or
    ``AsyncLimiter.from_url(url)`` for a client made lazily per process and
    event loop. The same options as :class:`tb_limiter.Limiter`."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        backend: Backend | Literal["auto"] = "auto",
        blocking_client: aredis.Redis | None = None,
    ) -> None:
        if backend not in ("auto", "module", "lua"):
            raise ValueError(f"backend must be 'auto', 'module' or 'lua', not {backend!r}")
        if isinstance(client, str):
            raise TypeError("AsyncLimiter takes a redis.asyncio client; use AsyncLimiter.from_url(url) for a URL")
        if blocking_client is not None and not isinstance(blocking_client, aredis.Redis):
            raise TypeError("blocking_client must be a redis.asyncio.Redis (server-side waits need one connection)")
        if blocking_client is not None and isinstance(client, AsyncRedisCluster):
            raise TypeError("blocking_client needs a single-node client: on a cluster, waits are reserved "
                            "and slept on the client")
        self._setup(client, None, backend, blocking_client)

    def _setup(
        self,
        client: AsyncClient | None,
        factory: Callable[[], AsyncClient] | None,
        backend: Backend | Literal["auto"],
        blocking_client: aredis.Redis | None,
    ) -> None:
        self._given = client
        self._factory = factory
        self._own: tuple[int, asyncio.AbstractEventLoop | None, AsyncClient] | None = None
        self._server = _core.ServerState(None if backend == "auto" else backend)
        self._blocking = blocking_client
        self._tasks: set[asyncio.Task[None]] = set()
        self._ready: _Ready | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        backend: Backend | Literal["auto"] = "auto",
        cluster: bool = False,
        **redis_kwargs: Any,
    ) -> "AsyncLimiter":
        """A limiter that makes its own client from ``url``, lazily, once per
        process and event loop (so it is safe to create at import time).
        ``cluster=True`` makes a ``RedisCluster``. With ``max_connections``,
        the pool waits for a free connection instead of failing (a
        ``BlockingConnectionPool``): concurrent calls share the connections."""
        if backend not in ("auto", "module", "lua"):
            raise ValueError(f"backend must be 'auto', 'module' or 'lua', not {backend!r}")
        if cluster:

            def factory() -> AsyncClient:
                return AsyncRedisCluster.from_url(url, **redis_kwargs)

        else:
            kwargs = dict(redis_kwargs)
            default = aredis.BlockingConnectionPool if "max_connections" in kwargs else aredis.ConnectionPool
            pool_class = kwargs.pop("connection_pool_class", default)

            def factory() -> AsyncClient:
                return aredis.Redis.from_pool(pool_class.from_url(url, **kwargs))

        self = cls.__new__(cls)
        self._setup(None, factory, backend, None)
        return self

    @property
    def client(self) -> AsyncClient:
        """The redis client: the one passed in, or this process's and event
        loop's own (made here, without awaiting, so concurrent first calls
        share one)."""
        if self._given is not None:
            return self._given
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        own = self._own
        if own is None or own[0] != os.getpid() or own[1] is not loop:
            assert self._factory is not None
            own = (os.getpid(), loop, self._factory())
            self._own = own
        return own[2]

    @property
    def backend(self) -> Backend | None:
        """``"module"`` or ``"lua"``; None until the first call has decided."""
        return self._server.backend

    @property
    def max_wait(self) -> float | None:
        """The server's longest wait in seconds, once it has refused a longer one."""
        ms = self._server.max_wait_ms
        return None if ms is None else ms / 1000

    async def aclose(self) -> None:
        """Lets background refunds finish (a few seconds at most), then
        closes the client this limiter made (:meth:`from_url`). A client
        passed in is the caller's to close."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_DEADLINE)
        own = self._own
        if own is not None and own[0] == os.getpid():
            self._own = None
            await _aclose(own[2])

    async def __aenter__(self) -> "AsyncLimiter":
        return self

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    def bucket(self, key: str | bytes, rate: RateLike, capacity: int | None = None) -> "AsyncTokenBucket":
        """The bucket under ``key`` refilling at ``rate`` tokens/s up to ``capacity``."""
        return AsyncTokenBucket(self, key, rate, capacity)

    def limits(self, key: str, limits: str | Iterable[LimitSpec]) -> "AsyncBucketGroup":
        """Several limits on one key, checked together: ``"10/second;1000/day"``."""
        return AsyncBucketGroup(self, key, limits)

    async def consume_many(
        self,
        parts: Iterable[tuple[BucketSpec, int]],
        *,
        max_wait: float | None = None,
        reserve: bool | None = None,
        atmost: bool = False,
        chunk: int | None = None,
    ) -> MultiResult:
        """TB.MCONSUME, all or nothing; see :meth:`tb_limiter.Limiter.consume_many`."""
        items = list(parts)
        use = max_wait is not None if reserve is None else reserve
        return await self._run(_core.consume_many(self._server, items, max_wait, use, atmost, chunk), items)

    async def acquire_many(
        self,
        parts: Iterable[tuple[BucketSpec, int]],
        *,
        timeout: float | None = None,
        flow: FlowName | None = None,
        weight: int = 1,
    ) -> MultiResult:
        """Reserves every ``(bucket, n)`` at once and sleeps the returned
        wait; with ``flow``, waits in the server's queue (see
        :meth:`tb_limiter.Limiter.acquire_many`)."""
        fa = flow_args(flow, weight)
        items = list(parts)
        return await self._run(_core.acquire_many(self._server, items, timeout, fa), items)

    def lease_many(
        self,
        parts: Iterable[tuple[BucketSpec, int]],
        *,
        ttl: Mapping[int, float],
        timeout: float | None = None,
        return_on: ReturnOn = (),
        flow: FlowName | None = None,
        weight: int = 1,
    ) -> "AsyncLeasedMany":
        """``async with``: see :meth:`tb_limiter.Limiter.lease_many` (the
        same exit rules). A cancellation while waiting for the leases holds
        nothing; one while the body runs counts as an exception (the call
        may be under way): estimates kept, slots held until their TTL."""
        fa = flow_args(flow, weight)
        return AsyncLeasedMany(self, list(parts), dict(ttl), timeout, return_on, fa)

    async def execute(self, call: Call) -> Any:
        """Runs one command on the module or through the Lua fallback."""
        return await self._run(_core.execute(self._server, call))

    # The driver: runs a plan's steps (see tb_limiter._core).

    async def _run(
        self, plan: Plan[T], items: Sequence[tuple[BucketSpec, int]] = (), error: BaseException | None = None
    ) -> T:
        value: Any = None
        while True:
            try:
                step = plan.send(value) if error is None else plan.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
            value, error = None, None
            if isinstance(step, Command):
                task = asyncio.ensure_future(self._command(step.args))
                try:
                    value = await asyncio.shield(task)
                except asyncio.CancelledError as e:
                    if task.cancelled():
                        error = e
                        continue
                    # The caller is cancelled; the reply is still coming.
                    self._spawn(self._after_cancel(plan, task, items))
                    raise
                except BaseException as e:  # noqa: BLE001 (thrown into the plan, which decides)
                    error = e
            elif isinstance(step, Sleep):
                try:
                    await asyncio.sleep(step.seconds)
                except asyncio.CancelledError:
                    self._spawn(self._after_cancel(plan, None, items))
                    raise
            elif isinstance(step, Block):
                try:
                    value = await self._block(step)
                except asyncio.CancelledError:
                    # A cancelled server-side wait cannot be given back: the
                    # server keeps a disconnected waiter's reservation.
                    plan.close()
                    raise
                except BaseException as e:  # noqa: BLE001
                    error = e

    async def _command(self, args: tuple[str | bytes | int, ...]) -> Any:
        client = self.client
        run: Callable[..., Awaitable[Any]] = client.execute_command
        if not isinstance(client, AsyncRedisCluster):
            return await run(*args)
        await self._initialized(client)
        target = _core.cluster_target(args, client.keyslot)
        if target is None:
            return await run(*args)
        node: Callable[[Any], Any] = client.get_node_from_key
        return await run(*args, target_nodes=node(target))

    async def _initialized(self, client: AsyncRedisCluster) -> None:
        """Initialises a cluster client once, under a lock, before its first
        command: redis-py 8.1's async cluster client fails concurrent first
        calls on a fresh client (``'NoneType' object has no attribute
        'writelines'``). Initialising an initialised client does nothing."""
        ready = self._ready
        if ready is None or ready.client is not client:
            ready = self._ready = _Ready(client)
        if ready.done:
            return
        async with ready.lock:
            if not ready.done:
                await client.initialize()
                ready.done = True

    async def _after_cancel(
        self, plan: Plan[Any], pending: asyncio.Future[Any] | None, items: Sequence[tuple[BucketSpec, int]]
    ) -> None:
        """Finishes a plan whose caller was cancelled: reads the reply that
        was on its way, then delivers the cancellation at the plan's next
        step, where it gives back what it reserved. A plan that had already
        finished took something its caller never saw: that is given back."""
        try:
            if pending is not None:
                try:
                    value, error = await pending, None
                except BaseException as e:  # noqa: BLE001
                    value, error = None, e
                try:
                    plan.send(value) if error is None else plan.throw(error)
                except StopIteration as done:
                    await self._run(_core.undo_result(self._server, done.value, items))
                    return
            await self._run(plan, items, asyncio.CancelledError())
        except BaseException as e:  # noqa: BLE001 (the caller has gone; report, never raise)
            if not isinstance(e, asyncio.CancelledError):
                _core.log.warning("tb_limiter: clean-up after a cancelled call failed: %r", e)

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _block(self, step: Block) -> tuple[int, Any] | None:
        """The server-side wait on a connection of the blocking client; a
        call in a flow without one waits on a connection of the limiter's
        client (on a cluster, of the key's primary)."""
        client: Any = self._blocking
        if client is None and step.shared:
            client = self.client
            if isinstance(client, AsyncRedisCluster):
                return await self._cluster_block(client, step)
        if client is None:
            return None
        pool = client.connection_pool
        conn = await _get_connection(pool)
        try:
            cap = _core.block_cap(step.ms, getattr(conn, "socket_timeout", None))
            if cap is None:
                return None
            args = step.call(cap).module_args()
            await conn.send_command(*args)
            return cap, await client.parse_response(conn, str(args[0]))
        except redis.ResponseError:
            raise
        except BaseException:
            await conn.disconnect(nowait=True)  # the reply may still come: never reuse it
            raise
        finally:
            await pool.release(conn)


    async def _cluster_block(self, client: AsyncRedisCluster, step: Block) -> tuple[int, Any] | None:
        """A flow's server-side wait on a cluster: capped by the socket
        timeout of a connection of the key's primary, sent there."""
        await self._initialized(client)
        node_of: Callable[[Any], Any] = client.get_node_from_key
        node = node_of(step.call(step.ms).keys[0])
        conn = node.acquire_connection()
        try:
            cap = _core.block_cap(step.ms, getattr(conn, "socket_timeout", None))
        finally:
            release = getattr(node, "release", None)
            if release is not None:
                release(conn)
            else:  # redis-py 5.0 has no ClusterNode.release: back to its free list
                node._free.append(conn)
        if cap is None:
            return None
        run: Callable[..., Awaitable[Any]] = client.execute_command
        return cap, await run(*step.call(cap).module_args(), target_nodes=node)


class _Ready:
    """Whether a cluster client was initialised (see ``_initialized``)."""

    __slots__ = ("client", "lock", "done")

    def __init__(self, client: AsyncRedisCluster) -> None:
        self.client, self.lock, self.done = client, asyncio.Lock(), False


async def _get_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py < 5.3 requires a command name
        return await pool.get_connection("TB.CONSUME")


async def _aclose(client: AsyncClient) -> None:
    close = getattr(client, "aclose", None) or client.close
    await close()


class AsyncTokenBucket(BucketSpec):
    """One bucket, awaited: ``limiter.bucket("api:key42", rate=5, capacity=10)``."""

    __slots__ = ("limiter",)

    def __init__(self, limiter: AsyncLimiter, key: str | bytes, rate: RateLike, capacity: int | None = None) -> None:
        super().__init__(key, rate, capacity)
        self.limiter = limiter

    def _mine(self, n: int) -> list[tuple[BucketSpec, int]]:
        return [(self, n)]

    async def consume(self, n: int = 1, *, atmost: bool = False, chunk: int | None = None) -> Result:
        """Takes ``n`` tokens now or none (``atmost``: as many as are there,
        at least ``chunk``; see :meth:`tb_limiter.TokenBucket.consume`)."""
        lim = self.limiter
        return await lim._run(_core.consume(lim._server, self, n, atmost, chunk), self._mine(n))

    async def peek(self) -> Result:
        """Whether one request would be served now, changing nothing."""
        return await self.consume(0)

    def batched(self, batch: int, *, hold: float = 0.05, max_hold: float = 0.5) -> AsyncBatcher:
        """Batches of this bucket's tokens handed out locally (see
        :meth:`tb_limiter.TokenBucket.batched`)."""
        return AsyncBatcher(self, batch, hold=hold, max_hold=max_hold)

    async def reserve(self, n: int = 1, *, max_wait: float | None = None) -> Result:
        """RESERVE: take the tokens into debt if they come within ``max_wait``
        (see :meth:`tb_limiter.TokenBucket.reserve`)."""
        lim = self.limiter
        return await lim._run(_core.reserve(lim._server, self, n, max_wait), self._mine(n))

    async def acquire(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> Result:
        """Reserves, then sleeps on the client; cancelled, it gives the
        tokens back. Raises :class:`RateLimited` at once when the wait would
        be longer than ``timeout`` or can never end. With ``flow``, waits in
        the server's queue in that flow (see :meth:`tb_limiter.TokenBucket.acquire`)."""
        lim = self.limiter
        fa = flow_args(flow, weight)
        plan = _core.acquire(lim._server, self, n, timeout, lim._blocking is not None, fa)
        return await lim._run(plan, self._mine(n))

    async def refund(self, n: int) -> int | None:
        """Gives back ``n`` tokens; the whole tokens now, or None if missing."""
        lim = self.limiter
        return await lim._run(_core.refund(lim._server, self, n))

    async def info(self) -> BucketInfo | None:
        """The bucket as of now, or None for a missing key."""
        lim = self.limiter
        return await lim._run(_core.info(lim._server, self))

    def lease(
        self,
        n: int = 1,
        *,
        ttl: float,
        timeout: float | None = None,
        return_on: ReturnOn = (),
        flow: FlowName | None = None,
        weight: int = 1,
    ) -> "AsyncLeased":
        """``async with``: holds a lease of ``n`` tokens for the block (see
        :meth:`tb_limiter.TokenBucket.lease`, the same exit rules). A
        cancellation while waiting for the lease holds nothing (a reply that
        arrives after it is released too); one while the body runs counts
        as an exception."""
        return AsyncLeased(self, n, ttl, timeout, return_on, flow_args(flow, weight))

    async def release(self, lease_id: int) -> int | None:
        """TB.RELEASE (see :meth:`tb_limiter.TokenBucket.release`)."""
        lim = self.limiter
        return await lim._run(_core.release(lim._server, self, lease_id, None))

    async def settle(self, lease_id: int, used: int) -> int | None:
        """TB.RELEASE ... USED (see :meth:`tb_limiter.TokenBucket.settle`)."""
        lim = self.limiter
        return await lim._run(_core.release(lim._server, self, lease_id, used))

    def limit(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> "AsyncLimit":
        """An async decorator and ``async with`` context manager that acquires
        ``n`` tokens first."""
        flow_args(flow, weight)
        return AsyncLimit(lambda: self.acquire(n, timeout=timeout, flow=flow, weight=weight))


class AsyncBucketGroup:
    """Several limits on one key, checked together (see :class:`tb_limiter.BucketGroup`)."""

    __slots__ = ("limiter", "specs", "buckets")

    def __init__(self, limiter: AsyncLimiter, key: str, limits: str | Iterable[LimitSpec]) -> None:
        self.limiter = limiter
        pairs = group_specs(key, limits)
        self.specs = [lim for lim, _ in pairs]
        self.buckets = [AsyncTokenBucket(limiter, b.key, b.rate, b.capacity) for _, b in pairs]

    def _parts(self, n: int) -> list[tuple[BucketSpec, int]]:
        return [(b, n) for b in self.buckets]

    async def consume(self, n: int = 1) -> MultiResult:
        """Takes ``n`` from every limit now, or nothing."""
        return await self.limiter.consume_many(self._parts(n))

    async def peek(self) -> MultiResult:
        """Whether one request would be served now, changing nothing."""
        return await self.consume(0)

    async def reserve(self, n: int = 1, *, max_wait: float | None = None) -> MultiResult:
        """Reserves ``n`` from every limit."""
        return await self.limiter.consume_many(self._parts(n), max_wait=max_wait, reserve=True)

    async def acquire(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> MultiResult:
        """Waits until ``n`` are taken from every limit."""
        return await self.limiter.acquire_many(self._parts(n), timeout=timeout, flow=flow, weight=weight)

    async def refund(self, n: int) -> None:
        """Gives ``n`` back to every limit."""
        for b in self.buckets:
            await b.refund(n)

    def limit(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> "AsyncLimit":
        """An async decorator and context manager that acquires ``n`` first."""
        flow_args(flow, weight)
        return AsyncLimit(lambda: self.acquire(n, timeout=timeout, flow=flow, weight=weight))


class AsyncLimit:
    """See :meth:`AsyncTokenBucket.limit`."""

    __slots__ = ("_acquire",)

    def __init__(self, acquire: Callable[[], Awaitable[Any]]) -> None:
        self._acquire = acquire

    async def __aenter__(self) -> Any:
        return await self._acquire()

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            await self._acquire()
            return await fn(*args, **kwargs)

        return cast(F, wrapper)


class AsyncLeased:
    """See :meth:`AsyncTokenBucket.lease` and :class:`tb_limiter.Leased`."""

    def __init__(
        self,
        bucket: AsyncTokenBucket,
        n: int,
        ttl: float,
        timeout: float | None,
        return_on: ReturnOn = (),
        flow: tuple[str | bytes, ...] = (),
    ) -> None:
        self.bucket, self.n, self.ttl, self.timeout, self.return_on = bucket, n, ttl, timeout, return_on
        self.flow = flow
        self.result: Result | None = None
        self.id = 0
        self.used: int | None = None
        self.released: int | None = None
        self._open = False

    async def __aenter__(self) -> "AsyncLeased":
        lim = self.bucket.limiter
        plan = _core.lease(lim._server, self.bucket, self.n, self.ttl, self.timeout, self.flow)
        self.result = await lim._run(plan, [(self.bucket, self.n)])
        self.id = self.result.lease_id or 0
        self._open = True
        return self

    async def give_back(self) -> int | None:
        """Gives the lease back now, whole; the exit then does nothing."""
        return await self._finish("back")

    async def _finish(self, outcome: _core.Outcome) -> int | None:
        if not self._open:
            return None
        self._open = False
        lim = self.bucket.limiter
        used = {} if self.used is None else {0: self.used}
        plan = _core.finish_leases(lim._server, [(self.bucket, self.n)], [self.id], used, outcome)
        self.released = (await lim._run(plan))[0]
        return self.released

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._finish(_core.lease_outcome(e, self.return_on))


class AsyncLeasedMany:
    """See :meth:`AsyncLimiter.lease_many` and :class:`tb_limiter.LeasedMany`."""

    def __init__(
        self,
        limiter: AsyncLimiter,
        items: list[tuple[BucketSpec, int]],
        ttl: dict[int, float],
        timeout: float | None,
        return_on: ReturnOn = (),
        flow: tuple[str | bytes, ...] = (),
    ) -> None:
        self.limiter, self.items, self.ttl, self.timeout, self.return_on = limiter, items, ttl, timeout, return_on
        self.flow = flow
        self.result: MultiResult | None = None
        self.used: dict[int, int] = {}
        self.released: list[int | None] = []
        self._open = False

    async def __aenter__(self) -> "AsyncLeasedMany":
        lim = self.limiter
        self.result = await lim._run(_core.lease_many(lim._server, self.items, self.ttl, self.timeout, self.flow), self.items)
        self._open = True
        return self

    async def give_back(self) -> list[int | None]:
        """Gives everything back now; the exit then does nothing."""
        return await self._finish("back")

    async def _finish(self, outcome: _core.Outcome) -> list[int | None]:
        if not self._open or self.result is None:
            return []
        self._open = False
        lim = self.limiter
        plan = _core.finish_leases(lim._server, self.items, self.result.lease_ids, self.used, outcome)
        self.released = await lim._run(plan)
        return self.released

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._finish(_core.lease_outcome(e, self.return_on))
