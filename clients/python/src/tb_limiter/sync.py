"""The blocking client: :class:`Limiter`, :class:`TokenBucket` and
:class:`BucketGroup`."""

from __future__ import annotations

import functools
import os
import time
from types import TracebackType
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence, TypeVar, Union, cast

import redis
from redis.cluster import RedisCluster

from . import _core
from ._core import Block, Command, Plan, ReturnOn, Sleep
from .batch import Batcher
from ._protocol import Call, FlowName, flow_args
from ._rates import LimitSpec, RateLike
from ._spec import BucketSpec, group_specs
from ._types import Backend, BucketInfo, MultiResult, Result

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

#: The redis-py clients a :class:`Limiter` takes.
SyncClient = Union[redis.Redis, RedisCluster]


class Limiter:
    """Entry point of the blocking client: ``Limiter(redis_client)``.

    ``client`` is a ``redis.Redis`` or a ``redis.cluster.RedisCluster``,
    used as is (the limiter never closes it). :meth:`from_url` makes its own
    client instead, lazily and once per process, which is fork-safe.

    ``backend="auto"`` uses the tb module and falls back to the Lua script
    (same commands, same replies) the first time the server answers
    "unknown command"; ``"module"`` or ``"lua"`` force one.

    Waiting (``acquire``) reserves and sleeps on the client, holding no
    connection. With ``blocking_client`` (a ``redis.Redis`` used for nothing
    else), ``acquire`` asks the module to hold the reply instead (``BLOCK``):
    one round trip and a wake-up at the exact time, but one connection held
    per waiter, capped by the server's ``tb.max-blocked``. A call in a flow
    (``flow=``: fair share between tenants) always waits on the server, on
    ``blocking_client`` or else on a connection of ``client``.
    """

    def __init__(
        self,
        client: SyncClient,
        *,
        backend: Backend | Literal["auto"] = "auto",
        blocking_client: redis.Redis | None = None,
    ) -> None:
        if backend not in ("auto", "module", "lua"):
            raise ValueError(f"backend must be 'auto', 'module' or 'lua', not {backend!r}")
        if isinstance(client, str):
            raise TypeError("Limiter takes a redis client; use Limiter.from_url(url) for a URL")
        if blocking_client is not None and not isinstance(blocking_client, redis.Redis):
            raise TypeError("blocking_client must be a redis.Redis (server-side waits need one connection)")
        if blocking_client is not None and isinstance(client, RedisCluster):
            raise TypeError("blocking_client needs a single-node client: on a cluster, waits are reserved "
                            "and slept on the client")
        self._setup(client, None, backend, blocking_client)

    def _setup(
        self,
        client: SyncClient | None,
        factory: Callable[[], SyncClient] | None,
        backend: Backend | Literal["auto"],
        blocking_client: redis.Redis | None,
    ) -> None:
        self._given = client
        self._factory = factory
        self._own: tuple[int, SyncClient] | None = None
        self._server = _core.ServerState(None if backend == "auto" else backend)
        self._blocking = blocking_client

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        backend: Backend | Literal["auto"] = "auto",
        cluster: bool = False,
        **redis_kwargs: Any,
    ) -> "Limiter":
        """A limiter that makes its own client from ``url`` (and
        ``redis_kwargs``), lazily and once per process: safe to create at
        import time in a Celery, gunicorn or uwsgi parent. ``cluster=True``
        makes a ``RedisCluster``. With ``max_connections``, the pool waits for
        a free connection instead of failing (a ``BlockingConnectionPool``)."""
        if cluster:

            def factory() -> SyncClient:
                return RedisCluster.from_url(url, **redis_kwargs)

        else:
            kwargs = dict(redis_kwargs)
            default = redis.BlockingConnectionPool if "max_connections" in kwargs else redis.ConnectionPool
            pool_class = kwargs.pop("connection_pool_class", default)

            def factory() -> SyncClient:
                return redis.Redis.from_pool(pool_class.from_url(url, **kwargs))

        if backend not in ("auto", "module", "lua"):
            raise ValueError(f"backend must be 'auto', 'module' or 'lua', not {backend!r}")
        self = cls.__new__(cls)
        self._setup(None, factory, backend, None)
        return self

    @property
    def client(self) -> SyncClient:
        """The redis client: the one passed in, or this process's own."""
        if self._given is not None:
            return self._given
        own = self._own
        if own is None or own[0] != os.getpid():
            # A new process (or the first call): the parent's client, if
            # any, is left alone; closing it here could shut its sockets.
            assert self._factory is not None
            own = (os.getpid(), self._factory())
            self._own = own
        return own[1]

    @property
    def backend(self) -> Backend | None:
        """``"module"`` or ``"lua"``: which implementation answers; None
        until the first call has decided (``backend="auto"``)."""
        return self._server.backend

    @property
    def max_wait(self) -> float | None:
        """The server's longest wait in seconds, once it has refused a
        longer one (``tb.max-wait-ms``); None until then."""
        ms = self._server.max_wait_ms
        return None if ms is None else ms / 1000

    def close(self) -> None:
        """Closes the client this limiter made (:meth:`from_url`) in this
        process. A client passed in is the caller's to close."""
        own = self._own
        if own is not None and own[0] == os.getpid():
            self._own = None
            own[1].close()

    def __enter__(self) -> "Limiter":
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def bucket(self, key: str | bytes, rate: RateLike, capacity: int | None = None) -> "TokenBucket":
        """The bucket under ``key`` refilling at ``rate`` tokens/s up to
        ``capacity`` (``rate="100/minute"`` alone: capacity 100)."""
        return TokenBucket(self, key, rate, capacity)

    def limits(self, key: str, limits: str | Iterable[LimitSpec]) -> "BucketGroup":
        """Several limits on one key, checked together (all or nothing):
        ``limiter.limits("api:alice", "10/second;1000/day")``."""
        return BucketGroup(self, key, limits)

    def consume_many(
        self,
        parts: Iterable[tuple[BucketSpec, int]],
        *,
        max_wait: float | None = None,
        reserve: bool | None = None,
        atmost: bool = False,
        chunk: int | None = None,
    ) -> MultiResult:
        """TB.MCONSUME: all or nothing across ``(bucket, n)`` pairs (e.g.
        requests and tokens per minute). With ``max_wait`` (seconds), every
        bucket goes into debt if all will have refilled by then, and
        ``retry_after`` says how long to wait before proceeding.

        ``atmost``: the parts asking for the largest ``n`` (a per-user and a
        global byte cap) give one shared grant, between ``chunk`` (default 1;
        or all of ``n`` when smaller) and ``n``, in ``granted``; the other
        parts (a request counter) give all of their ``n``."""
        items = list(parts)
        use = max_wait is not None if reserve is None else reserve
        return self._run(_core.consume_many(self._server, items, max_wait, use, atmost, chunk), items)

    def acquire_many(
        self,
        parts: Iterable[tuple[BucketSpec, int]],
        *,
        timeout: float | None = None,
        flow: FlowName | None = None,
        weight: int = 1,
    ) -> MultiResult:
        """Takes every ``(bucket, n)`` at once, waiting up to ``timeout``
        seconds (default: as long as the server lets a reservation reach):
        one reservation, then one sleep on the client. Raises
        :class:`RateLimited` when that is not enough.

        ``flow`` (a tenant, a priority class; 1 to 128 bytes) and ``weight``
        (1 to 1,000,000): the call waits on the server in the queue of the
        bucket that makes it wait (``TB.MCONSUME ... BLOCK ms FLOW name
        [WEIGHT w]``), reserving nothing; while several flows wait there,
        grants go to them in proportion to their weights (see
        :meth:`TokenBucket.acquire`)."""
        fa = flow_args(flow, weight)
        items = list(parts)
        return self._run(_core.acquire_many(self._server, items, timeout, fa), items)

    def lease_many(
        self,
        parts: Iterable[tuple[BucketSpec, int]],
        *,
        ttl: Mapping[int, float],
        timeout: float | None = None,
        return_on: ReturnOn = (),
        flow: FlowName | None = None,
        weight: int = 1,
    ) -> "LeasedMany":
        """A context manager over one all-or-nothing TB.MCONSUME whose parts
        ``ttl`` names (index from 0: TTL in seconds) are leased: requests
        and tokens per minute taken, one slot of in-flight requests lent::

            with limiter.lease_many([(rpm, 1), (tpm, 500), (inflight, 1)], ttl={1: 60, 2: 60}) as held:
                used = call_model()
                held.used[1] = used     # settle the token estimate on exit

        A leased part on a bucket with rate 0 is an in-flight *slot*; on any
        other bucket an *estimate* (leased with ``KEEP``: if never settled,
        it stays used at its TTL). On a normal exit slots are released and
        estimates settled to ``used[part]`` (released whole when unset).
        When the body raises, the call may have reached the provider:
        estimates are settled to ``used[part]`` or else to the estimate, and
        slots stay held until their TTL (the call may still be running).
        Everything is given back (leases released, other parts refunded)
        only when the call is known not to have left: the body raises
        :class:`~tb_limiter.NotSent` (or wraps its failure in it), or an
        exception of a type in ``return_on``, or calls :meth:`LeasedMany.give_back`.
        Denials are tried again, backing off, until ``timeout`` seconds
        (None: until granted or never possible); then :class:`RateLimited`.
        ``flow`` and ``weight``: the call waits in the server's queue in that
        flow (see :meth:`acquire_many`)."""
        fa = flow_args(flow, weight)
        items = list(parts)
        return LeasedMany(self, items, dict(ttl), timeout, return_on, fa)

    def execute(self, call: Call) -> Any:
        """Runs one command on the module or through the Lua fallback and
        returns the raw reply."""
        return self._run(_core.execute(self._server, call))

    # The driver: runs a plan's steps (see tb_limiter._core).

    def _run(self, plan: Plan[T], items: Sequence[tuple[BucketSpec, int]] = ()) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = plan.send(value) if error is None else plan.throw(error)
            except StopIteration as done:
                return cast(T, done.value)
            value, error = None, None
            try:
                if isinstance(step, Command):
                    value = self._command(step.args)
                elif isinstance(step, Sleep):
                    time.sleep(step.seconds)
                elif isinstance(step, Block):
                    value = self._block(step)
            except BaseException as e:  # noqa: BLE001 (thrown into the plan, which decides)
                error = e

    def _command(self, args: tuple[str | bytes | int, ...]) -> Any:
        client = self.client
        run: Callable[..., Any] = client.execute_command
        if not isinstance(client, RedisCluster):
            return run(*args)
        target = _core.cluster_target(args, client.keyslot)
        if target is None:
            return run(*args)
        node: Callable[[Any], Any] = client.get_node_from_key
        return run(*args, target_nodes=node(target))

    def _block(self, step: Block) -> tuple[int, Any] | None:
        """``TB.CONSUME ... BLOCK`` on a connection of the blocking client,
        capped by that connection's real socket timeout; a call in a flow
        without one takes a connection of the limiter's client (of the
        key's node on a cluster) for the wait."""
        client = self._blocking
        if client is None and step.shared:
            client = self._node_client(step.call(step.ms).keys[0])
        if client is None:
            return None
        pool = client.connection_pool
        conn = _get_connection(pool)
        try:
            cap = _core.block_cap(step.ms, getattr(conn, "socket_timeout", None))
            if cap is None:
                return None
            args = step.call(cap).module_args()
            conn.send_command(*args)
            parse: Callable[..., Any] = client.parse_response
            return cap, parse(conn, str(args[0]))
        except redis.ResponseError:
            raise
        except BaseException:
            conn.disconnect()  # the reply may still come: never reuse it
            raise
        finally:
            pool.release(conn)


    def _node_client(self, key: str | bytes) -> redis.Redis:
        """The single-node client that serves ``key``: the limiter's client,
        or on a cluster the client of the key's primary."""
        client = self.client
        if isinstance(client, RedisCluster):
            node_of: Callable[[Any], Any] = client.get_node_from_key
            return client.get_redis_connection(node_of(key))
        return client


def _get_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 requires a command name
        return pool.get_connection("TB.CONSUME")


class TokenBucket(BucketSpec):
    """One bucket: ``limiter.bucket("llm:openai", rate="0.5", capacity=1)``."""

    __slots__ = ("limiter",)

    def __init__(self, limiter: Limiter, key: str | bytes, rate: RateLike, capacity: int | None = None) -> None:
        super().__init__(key, rate, capacity)
        self.limiter = limiter

    def _mine(self, n: int) -> list[tuple[BucketSpec, int]]:
        return [(self, n)]

    def consume(self, n: int = 1, *, atmost: bool = False, chunk: int | None = None) -> Result:
        """Takes ``n`` tokens now or none (``atmost``: as many as are there,
        at least ``chunk``, default 1, or all of ``n`` when smaller;
        ``granted`` says how many, and a denial's ``retry_after`` is the wait
        for ``chunk``). ``n = 0`` is a peek."""
        lim = self.limiter
        return lim._run(_core.consume(lim._server, self, n, atmost, chunk), self._mine(n))

    def peek(self) -> Result:
        """Whether one request would be served now, changing nothing."""
        return self.consume(0)

    def batched(self, batch: int, *, hold: float = 0.05, max_hold: float = 0.5) -> Batcher:
        """Hands this bucket's tokens out locally from batches of up to
        ``batch`` taken in one call, for a hot key; what is not handed out
        goes back after ``hold`` idle seconds, on close, and at the latest
        ``max_hold`` seconds after it was taken (see :mod:`tb_limiter.batch`)."""
        return Batcher(self, batch, hold=hold, max_hold=max_hold)

    def reserve(self, n: int = 1, *, max_wait: float | None = None) -> Result:
        """RESERVE: if the tokens will be there within ``max_wait`` seconds
        (default and most: what the server accepts, 60 s or its
        ``tb.max-wait-ms``), takes them now (into debt) and returns
        ``allowed`` with the wait in ``retry_after``; the caller waits that
        long, then proceeds. Later callers queue behind: first come, first
        served across the fleet. A denial also has ``retry_after`` (when the
        tokens will be there): ``allowed`` is what says "yours"."""
        lim = self.limiter
        return lim._run(_core.reserve(lim._server, self, n, max_wait), self._mine(n))

    def acquire(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> Result:
        """Waits until ``n`` tokens are taken, at most ``timeout`` seconds
        (default: as long as the server lets a reservation reach).

        Reserves, then sleeps on the client; an exception during the sleep
        (an interrupt, a task time limit) gives the tokens back first.
        Raises :class:`RateLimited` at once when the wait would be longer
        than ``timeout``, or the request can never succeed.

        ``flow`` (a tenant, a priority class: 1 to 128 bytes) and ``weight``
        (1 to 1,000,000, default 1): the call waits on the server, in the
        bucket's queue, reserving nothing (``BLOCK ms FLOW name [WEIGHT
        w]``; on the limiter's client when there is no ``blocking_client``:
        one connection held per waiter). While several flows wait on the
        bucket, grants go to them in proportion to their weights, first
        come first served within a flow; a flow alone gets everything.
        ``timeout`` None is then the server's longest wait (60 s or
        ``tb.max-wait-ms``). On the Lua fallback the flow is ignored: the
        call polls, and whoever polls first after a refill wins."""
        lim = self.limiter
        fa = flow_args(flow, weight)
        return lim._run(_core.acquire(lim._server, self, n, timeout, lim._blocking is not None, fa), self._mine(n))

    def refund(self, n: int) -> int | None:
        """Gives back ``n`` tokens (never above capacity): reserve an
        estimate, refund the unused part. Returns the whole tokens now in the
        bucket, or None for a missing key (a full bucket)."""
        lim = self.limiter
        return lim._run(_core.refund(lim._server, self, n))

    def info(self) -> BucketInfo | None:
        """The bucket as of now, or None for a missing key (a full bucket)."""
        lim = self.limiter
        return lim._run(_core.info(lim._server, self))

    def lease(
        self,
        n: int = 1,
        *,
        ttl: float,
        timeout: float | None = None,
        return_on: ReturnOn = (),
        flow: FlowName | None = None,
        weight: int = 1,
    ) -> "Leased":
        """A context manager that holds a lease of ``n`` tokens (a slot of a
        concurrency limit: a bucket with rate 0) for the ``with`` block::

            with inflight.lease(ttl=60) as held:
                ...                     # held.id, held.result
                held.used = 3           # optional: settle to 3 tokens on exit

        On a normal exit the lease is released (settled to ``used`` when
        set). When the body raises, a slot (rate 0) stays held until its TTL
        and an estimate (any other rate: leased with ``KEEP``) is settled to
        ``used``, else kept whole; :class:`~tb_limiter.NotSent`, a type in
        ``return_on`` or :meth:`Leased.give_back` give it back (see
        :meth:`Limiter.lease_many`). If the process dies, a slot comes back
        ``ttl`` seconds after it was taken and an estimate stays used. A
        lease is never reserved: a denial is tried again, backing off, until
        ``timeout`` seconds (None: until granted or never possible); then
        :class:`RateLimited`. ``flow`` and ``weight``: the call waits in the
        server's queue in that flow (see :meth:`acquire`)."""
        return Leased(self, n, ttl, timeout, return_on, flow_args(flow, weight))

    def release(self, lease_id: int) -> int | None:
        """TB.RELEASE: gives a lease's tokens back (never above capacity).
        Returns the whole tokens that went back (0 when the bucket was full
        already), or None when the lease is not held (released already,
        expired): a retried release does nothing."""
        lim = self.limiter
        return lim._run(_core.release(lim._server, self, lease_id, None))

    def settle(self, lease_id: int, used: int) -> int | None:
        """TB.RELEASE ... USED: settles a lease to the ``used`` tokens: the
        rest comes back, an overrun is charged (into debt: later callers
        wait). Returns the whole tokens that went back after the cap at
        capacity (negative: the overrun charged), or None
        when the lease was settled or released already, or expired: a
        retried settle never applies twice."""
        lim = self.limiter
        return lim._run(_core.release(lim._server, self, lease_id, used))

    def limit(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> "Limit":
        """A decorator and context manager that acquires ``n`` tokens first::

            @bucket.limit(timeout=30)
            def call_api(): ...

            with bucket.limit(5) as result: ...
        """
        flow_args(flow, weight)
        return Limit(lambda: self.acquire(n, timeout=timeout, flow=flow, weight=weight))


class BucketGroup:
    """Several limits on one key (``"10/second;1000/day"``), one bucket each
    (``{key}:10/1s``, ``{key}:1000/86400s``: one cluster slot), checked
    together with TB.MCONSUME: a request is served only if every limit has
    room, and then takes from all."""

    __slots__ = ("limiter", "specs", "buckets")

    def __init__(self, limiter: Limiter, key: str, limits: str | Iterable[LimitSpec]) -> None:
        self.limiter = limiter
        pairs = group_specs(key, limits)
        self.specs = [lim for lim, _ in pairs]
        self.buckets = [TokenBucket(limiter, b.key, b.rate, b.capacity) for _, b in pairs]

    def _parts(self, n: int) -> list[tuple[BucketSpec, int]]:
        return [(b, n) for b in self.buckets]

    def consume(self, n: int = 1) -> MultiResult:
        """Takes ``n`` from every limit now, or nothing."""
        return self.limiter.consume_many(self._parts(n))

    def peek(self) -> MultiResult:
        """Whether one request would be served now, changing nothing."""
        return self.consume(0)

    def reserve(self, n: int = 1, *, max_wait: float | None = None) -> MultiResult:
        """Reserves ``n`` from every limit (see :meth:`TokenBucket.reserve`)."""
        return self.limiter.consume_many(self._parts(n), max_wait=max_wait, reserve=True)

    def acquire(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> MultiResult:
        """Waits until ``n`` are taken from every limit (see :meth:`TokenBucket.acquire`)."""
        return self.limiter.acquire_many(self._parts(n), timeout=timeout, flow=flow, weight=weight)

    def refund(self, n: int) -> None:
        """Gives ``n`` back to every limit."""
        for b in self.buckets:
            b.refund(n)

    def limit(
        self, n: int = 1, *, timeout: float | None = None, flow: FlowName | None = None, weight: int = 1
    ) -> "Limit":
        """A decorator and context manager that acquires ``n`` first."""
        flow_args(flow, weight)
        return Limit(lambda: self.acquire(n, timeout=timeout, flow=flow, weight=weight))


class Limit:
    """See :meth:`TokenBucket.limit`."""

    __slots__ = ("_acquire",)

    def __init__(self, acquire: Callable[[], Any]) -> None:
        self._acquire = acquire

    def __enter__(self) -> Any:
        return self._acquire()

    def __exit__(self, *exc: object) -> None:
        return None

    def __call__(self, fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self._acquire()
            return fn(*args, **kwargs)

        return cast(F, wrapper)


class Leased:
    """See :meth:`TokenBucket.lease`: ``id`` and ``result`` once entered;
    set ``used`` to settle the lease on exit instead of releasing it whole;
    ``released`` is the reply of the release or settle made on exit (None
    when none was made)."""

    def __init__(
        self,
        bucket: TokenBucket,
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

    def __enter__(self) -> "Leased":
        lim = self.bucket.limiter
        self.result = lim._run(_core.lease(lim._server, self.bucket, self.n, self.ttl, self.timeout, self.flow))
        self.id = self.result.lease_id or 0
        self._open = True
        return self

    def give_back(self) -> int | None:
        """Gives the lease back now, whole (the call it guarded was never
        sent); the exit then does nothing. Returns the tokens given back."""
        return self._finish("back")

    def _finish(self, outcome: _core.Outcome) -> int | None:
        if not self._open:
            return None
        self._open = False
        lim = self.bucket.limiter
        used = {} if self.used is None else {0: self.used}
        plan = _core.finish_leases(lim._server, [(self.bucket, self.n)], [self.id], used, outcome)
        self.released = lim._run(plan)[0]
        return self.released

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(_core.lease_outcome(e, self.return_on))


class LeasedMany:
    """See :meth:`Limiter.lease_many`: ``result`` once entered; set
    ``used[part]`` to settle a leased part on exit; ``released`` holds each
    part's reply of what the exit did (None: nothing)."""

    def __init__(
        self,
        limiter: Limiter,
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

    def __enter__(self) -> "LeasedMany":
        lim = self.limiter
        self.result = lim._run(_core.lease_many(lim._server, self.items, self.ttl, self.timeout, self.flow))
        self._open = True
        return self

    def give_back(self) -> list[int | None]:
        """Gives everything back now (leases released, the other parts
        refunded: the call was never sent); the exit then does nothing."""
        return self._finish("back")

    def _finish(self, outcome: _core.Outcome) -> list[int | None]:
        if not self._open or self.result is None:
            return []
        self._open = False
        lim = self.limiter
        plan = _core.finish_leases(lim._server, self.items, self.result.lease_ids, self.used, outcome)
        self.released = lim._run(plan)
        return self.released

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(_core.lease_outcome(e, self.return_on))
