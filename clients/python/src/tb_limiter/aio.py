"""The asyncio client: :class:`AsyncLimiter` and :class:`AsyncTokenBucket`,
the same operations as :mod:`tb_limiter.sync`, awaited."""

from __future__ import annotations

import asyncio
import functools
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Literal, TypeVar, cast

import redis
import redis.asyncio as aredis
from redis.commands.core import AsyncScript

from ._protocol import DEFAULT_TIMEOUT, PROBE_KEY, SCRIPT, Call, RateLike, is_unknown_command
from ._spec import BucketSpec, mconsume_call
from ._types import Backend, BucketInfo, MultiResult, RateLimited, Result

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


@dataclass(frozen=True)
class _Conn:
    """The connection state of one process and event loop."""

    pid: int
    loop: asyncio.AbstractEventLoop
    client: aredis.Redis
    backend: Backend
    script: AsyncScript | None


class AsyncLimiter:
    """Entry point of the asyncio client (FastAPI, aiohttp, ...).

    Like :class:`tb_limiter.Limiter`, it holds a URL or a client factory and
    creates its client lazily, once per process and per event loop, so it is
    safe to create at import time and across forks.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client_factory: Callable[[], aredis.Redis] | None = None,
        backend: Backend | Literal["auto"] = "auto",
        **redis_kwargs: Any,
    ) -> None:
        if backend not in ("auto", "module", "lua"):
            raise ValueError(f"backend must be 'auto', 'module' or 'lua', not {backend!r}")
        self._factory = client_factory or (lambda: aredis.Redis.from_url(url, **redis_kwargs))
        self._wanted = backend
        self._conn_state: _Conn | None = None

    async def _conn(self) -> _Conn:
        loop = asyncio.get_running_loop()
        c = self._conn_state
        if c is not None and c.pid == os.getpid() and c.loop is loop:
            return c
        client = self._factory()
        backend: Backend
        if self._wanted == "auto":
            backend = await _detect(client)
        else:
            backend = self._wanted
        script = client.register_script(SCRIPT) if backend == "lua" else None
        c = _Conn(os.getpid(), loop, client, backend, script)
        self._conn_state = c
        return c

    async def backend(self) -> Backend:
        """``"module"`` or ``"lua"``: which implementation answers."""
        return (await self._conn()).backend

    async def client(self) -> aredis.Redis:
        """The redis client of this process and event loop."""
        return (await self._conn()).client

    async def aclose(self) -> None:
        """Closes this process's client (call on shutdown)."""
        c = self._conn_state
        if c is not None and c.pid == os.getpid():
            self._conn_state = None
            await c.client.aclose()

    async def execute(self, call: Call) -> Any:
        """Runs one command on the module or through the Lua fallback."""
        c = await self._conn()
        if c.script is None:
            return await c.client.execute_command(*call.module_args())
        return await c.script(keys=list(call.keys), args=call.script_args(), client=c.client)

    def bucket(self, key: str | bytes, rate: RateLike, capacity: int) -> "AsyncTokenBucket":
        """The bucket under ``key`` refilling at ``rate`` tokens/s up to ``capacity``."""
        return AsyncTokenBucket(self, key, rate, capacity)

    async def consume_many(
        self, parts: Iterable[tuple[BucketSpec, int]], *, max_wait: float | None = None
    ) -> MultiResult:
        """TB.MCONSUME, all-or-nothing; see :meth:`tb_limiter.Limiter.consume_many`."""
        return MultiResult.from_reply(await self.execute(mconsume_call(parts, max_wait)))

    async def acquire_many(
        self, parts: Iterable[tuple[BucketSpec, int]], *, timeout: float = DEFAULT_TIMEOUT
    ) -> MultiResult:
        """Reserves every ``(bucket, n)`` at once and sleeps the returned wait."""
        items = list(parts)
        r = await self.consume_many(items, max_wait=timeout)
        if not r.allowed:
            raise RateLimited(",".join(repr(b.key) for b, _ in items), r)
        if r.retry_after_ms > 0:
            await asyncio.sleep(r.retry_after)
        return r

    async def _can_block(self, timeout: float) -> bool:
        c = await self._conn()
        if c.backend != "module":
            return False
        sock_timeout = c.client.connection_pool.connection_kwargs.get("socket_timeout")
        return sock_timeout is None or sock_timeout > timeout + 1.0


async def _detect(client: aredis.Redis) -> Backend:
    try:
        await client.execute_command("TB.INFO", PROBE_KEY)
    except redis.ResponseError as e:
        if is_unknown_command(e):
            return "lua"
        raise
    return "module"


class AsyncTokenBucket(BucketSpec):
    """One bucket, awaited: ``limiter.bucket("api:key42", rate=5, capacity=10)``."""

    __slots__ = ("limiter",)

    def __init__(
        self, limiter: AsyncLimiter, key: str | bytes, rate: RateLike, capacity: int
    ) -> None:
        super().__init__(key, rate, capacity)
        self.limiter = limiter

    async def consume(self, n: int = 1, *, atmost: bool = False) -> Result:
        """Takes ``n`` tokens now or none (``atmost``: as many as are there)."""
        return Result.from_reply(await self.limiter.execute(self._consume_call(n, atmost=atmost)))

    async def peek(self) -> Result:
        """Whether one request would be served now, changing nothing."""
        return await self.consume(0)

    async def reserve(self, n: int = 1, *, max_wait: float) -> Result:
        """RESERVE: take the tokens into debt if they come within ``max_wait``."""
        return Result.from_reply(await self.limiter.execute(self._reserve_call(n, max_wait)))

    async def acquire(self, n: int = 1, *, timeout: float = DEFAULT_TIMEOUT) -> Result:
        """Waits (BLOCK on the module, RESERVE and one sleep on the Lua
        fallback) until ``n`` tokens are taken; raises :class:`RateLimited`
        if that takes longer than ``timeout`` seconds or can never happen."""
        if await self.limiter._can_block(timeout):
            r = Result.from_reply(await self.limiter.execute(self._block_call(n, timeout)))
        else:
            r = await self.reserve(n, max_wait=timeout)
        if not r.allowed:
            raise RateLimited(str(self.key), r)
        if r.retry_after_ms > 0:
            await asyncio.sleep(r.retry_after)
        return r

    async def refund(self, n: int) -> int | None:
        """Gives back ``n`` tokens; the whole tokens now, or None if missing."""
        reply = await self.limiter.execute(self._refund_call(n))
        return None if reply is None else int(reply)

    async def info(self) -> BucketInfo | None:
        """The bucket as of now, or None for a missing key."""
        reply = await self.limiter.execute(self._info_call())
        return None if reply is None else BucketInfo.from_reply(reply)

    def limit(self, n: int = 1, *, timeout: float = DEFAULT_TIMEOUT) -> "AsyncLimit":
        """An async decorator and ``async with`` context manager that acquires
        ``n`` tokens first."""
        return AsyncLimit(self, n, timeout)


class AsyncLimit:
    """See :meth:`AsyncTokenBucket.limit`."""

    __slots__ = ("bucket", "n", "timeout")

    def __init__(self, bucket: AsyncTokenBucket, n: int, timeout: float) -> None:
        self.bucket, self.n, self.timeout = bucket, n, timeout

    async def __aenter__(self) -> Result:
        return await self.bucket.acquire(self.n, timeout=self.timeout)

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            await self.bucket.acquire(self.n, timeout=self.timeout)
            return await fn(*args, **kwargs)

        return cast(F, wrapper)
