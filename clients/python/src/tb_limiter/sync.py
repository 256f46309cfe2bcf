"""The blocking client: :class:`Limiter` and :class:`TokenBucket`."""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, TypeVar, cast

import redis
from redis.commands.core import Script

from ._protocol import DEFAULT_TIMEOUT, PROBE_KEY, SCRIPT, Call, RateLike, is_unknown_command
from ._spec import BucketSpec, mconsume_call
from ._types import Backend, BucketInfo, MultiResult, RateLimited, Result

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class _Conn:
    """The connection state of one process: never used after a fork."""

    pid: int
    client: redis.Redis
    backend: Backend
    script: Script | None


class Limiter:
    """Entry point of the blocking client.

    Holds a redis URL (or a factory of ``redis.Redis`` clients), never a
    connection across a fork: the client is created lazily in each process
    (``os.getpid()`` is checked on every call), so a Limiter made at import
    time in a Celery or gunicorn parent is safe in every forked worker.

    ``backend="auto"`` uses the tb module when the server has it and the Lua
    fallback (same commands, same replies) otherwise; ``"module"`` or
    ``"lua"`` force one.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        client_factory: Callable[[], redis.Redis] | None = None,
        backend: Backend | Literal["auto"] = "auto",
        **redis_kwargs: Any,
    ) -> None:
        if backend not in ("auto", "module", "lua"):
            raise ValueError(f"backend must be 'auto', 'module' or 'lua', not {backend!r}")
        self._factory = client_factory or (lambda: redis.Redis.from_url(url, **redis_kwargs))
        self._wanted = backend
        self._conn_state: _Conn | None = None

    def _conn(self) -> _Conn:
        c = self._conn_state
        if c is not None and c.pid == os.getpid():
            return c
        # A new process (or the first call): the parent's client, if any, is
        # left alone (closing it here could shut the parent's sockets).
        client = self._factory()
        backend: Backend
        if self._wanted == "auto":
            backend = _detect(client)
        else:
            backend = self._wanted
        script = client.register_script(SCRIPT) if backend == "lua" else None
        c = _Conn(os.getpid(), client, backend, script)
        self._conn_state = c
        return c

    @property
    def backend(self) -> Backend:
        """``"module"`` or ``"lua"``: which implementation answers."""
        return self._conn().backend

    @property
    def client(self) -> redis.Redis:
        """This process's redis client."""
        return self._conn().client

    def execute(self, call: Call) -> Any:
        """Runs one command on the module or through the Lua fallback and
        returns the raw reply."""
        c = self._conn()
        if c.script is None:
            return c.client.execute_command(*call.module_args())
        return c.script(keys=list(call.keys), args=call.script_args(), client=c.client)

    def bucket(self, key: str | bytes, rate: RateLike, capacity: int) -> "TokenBucket":
        """The bucket under ``key`` refilling at ``rate`` tokens/s up to ``capacity``."""
        return TokenBucket(self, key, rate, capacity)

    def consume_many(
        self, parts: Iterable[tuple[BucketSpec, int]], *, max_wait: float | None = None
    ) -> MultiResult:
        """TB.MCONSUME: all-or-nothing across ``(bucket, n)`` pairs (e.g.
        requests and tokens per minute). With ``max_wait`` (seconds), every
        bucket goes into debt if all will have refilled by then and
        ``retry_after`` says how long to wait before proceeding."""
        return MultiResult.from_reply(self.execute(mconsume_call(parts, max_wait)))

    def acquire_many(
        self, parts: Iterable[tuple[BucketSpec, int]], *, timeout: float = DEFAULT_TIMEOUT
    ) -> MultiResult:
        """Takes every ``(bucket, n)`` at once, waiting up to ``timeout``
        seconds: one reservation (RESERVE), then one sleep for the returned
        wait; never polls. Raises :class:`RateLimited` if that is too long."""
        items = list(parts)
        r = self.consume_many(items, max_wait=timeout)
        if not r.allowed:
            raise RateLimited(",".join(repr(b.key) for b, _ in items), r)
        if r.retry_after_ms > 0:
            time.sleep(r.retry_after)
        return r

    def _can_block(self, timeout: float) -> bool:
        """BLOCK is used with the module, unless the connection's socket
        timeout could expire while the server holds the reply."""
        c = self._conn()
        if c.backend != "module":
            return False
        kwargs = c.client.connection_pool.connection_kwargs
        sock_timeout = kwargs.get("socket_timeout")
        return sock_timeout is None or sock_timeout > timeout + 1.0


def _detect(client: redis.Redis) -> Backend:
    """``module`` if the server knows TB.INFO, else ``lua``."""
    try:
        client.execute_command("TB.INFO", PROBE_KEY)
    except redis.ResponseError as e:
        if is_unknown_command(e):
            return "lua"
        raise
    return "module"


class TokenBucket(BucketSpec):
    """One bucket: ``limiter.bucket("llm:openai", rate="0.5", capacity=1)``."""

    __slots__ = ("limiter",)

    def __init__(self, limiter: Limiter, key: str | bytes, rate: RateLike, capacity: int) -> None:
        super().__init__(key, rate, capacity)
        self.limiter = limiter

    def consume(self, n: int = 1, *, atmost: bool = False) -> Result:
        """Takes ``n`` tokens now or none (``atmost``: as many as are there,
        at least one; ``granted`` says how many). ``n = 0`` is a peek."""
        return Result.from_reply(self.limiter.execute(self._consume_call(n, atmost=atmost)))

    def peek(self) -> Result:
        """Whether one request would be served now, changing nothing."""
        return self.consume(0)

    def reserve(self, n: int = 1, *, max_wait: float) -> Result:
        """RESERVE: if the tokens will be there within ``max_wait`` seconds,
        takes them now (into debt) and returns ``allowed`` with the wait in
        ``retry_after``; the caller waits that long, then proceeds. Later
        callers queue behind: first come, first served across the fleet."""
        return Result.from_reply(self.limiter.execute(self._reserve_call(n, max_wait)))

    def acquire(self, n: int = 1, *, timeout: float = DEFAULT_TIMEOUT) -> Result:
        """Waits until ``n`` tokens are taken, at most ``timeout`` seconds.

        With the module the server holds the reply (BLOCK); with the Lua
        fallback the tokens are reserved and the client sleeps the returned
        wait once. Neither polls. Raises :class:`RateLimited` when the wait
        would be longer than ``timeout`` or the request can never succeed.
        """
        if self.limiter._can_block(timeout):
            r = Result.from_reply(self.limiter.execute(self._block_call(n, timeout)))
        else:
            r = self.reserve(n, max_wait=timeout)
        if not r.allowed:
            raise RateLimited(str(self.key), r)
        if r.retry_after_ms > 0:
            # Reserved (the Lua fallback, or the server's max-blocked was
            # reached): the tokens are ours once this wait is over.
            time.sleep(r.retry_after)
        return r

    def refund(self, n: int) -> int | None:
        """Gives back ``n`` tokens (never above capacity): reserve an
        estimate, refund the unused part. Returns the whole tokens now in the
        bucket, or None for a missing key (a full bucket)."""
        reply = self.limiter.execute(self._refund_call(n))
        return None if reply is None else int(reply)

    def info(self) -> BucketInfo | None:
        """The bucket as of now, or None for a missing key (a full bucket)."""
        reply = self.limiter.execute(self._info_call())
        return None if reply is None else BucketInfo.from_reply(reply)

    def limit(self, n: int = 1, *, timeout: float = DEFAULT_TIMEOUT) -> "Limit":
        """A decorator and context manager that acquires ``n`` tokens first::

            @bucket.limit(timeout=30)
            def call_api(): ...

            with bucket.limit(5) as result: ...
        """
        return Limit(self, n, timeout)


class Limit:
    """See :meth:`TokenBucket.limit`."""

    __slots__ = ("bucket", "n", "timeout")

    def __init__(self, bucket: TokenBucket, n: int, timeout: float) -> None:
        self.bucket, self.n, self.timeout = bucket, n, timeout

    def __enter__(self) -> Result:
        return self.bucket.acquire(self.n, timeout=self.timeout)

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.bucket.acquire(self.n, timeout=self.timeout)
            return fn(*args, **kwargs)

        return cast(F, wrapper)
