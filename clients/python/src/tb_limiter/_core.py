"""What the blocking and the asyncio clients share: every operation as a
*plan*, a generator that yields the steps it needs (a command to run, a
sleep, a server-side wait) and receives their results. The two drivers
(:mod:`tb_limiter.sync`, :mod:`tb_limiter.aio`) only run commands and sleep;
everything else is here, once:

* the backend: the module's command first; on "unknown command" the Lua
  fallback (``EVALSHA``, then ``EVAL`` on ``NOSCRIPT``, or ``SCRIPT LOAD`` when
  ``EVAL`` is not allowed). No probe, no key, no permission beyond the
  limiter's own commands;
* the server's longest wait (``tb.max-wait-ms``): learned from the error
  that names it, kept per client, the call retried once;
* waiting: reserve, then sleep on the client (no connection held); a sleep
  that ends in an exception (cancellation, timeout, interrupt) gives back
  what it reserved with ``TB.REFUND`` before the exception goes on.

A driver throws every exception of a step into the plan, so the plan
decides what it can handle and what goes on to the caller.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Literal, Mapping, Sequence, TypeVar, Union, cast

from redis.exceptions import RedisClusterException

from ._protocol import (
    DEFAULT_MAX_WAIT_MS,
    SCRIPT,
    SCRIPT_SHA,
    Call,
    is_noscript,
    is_unknown_command,
    max_wait_error,
    wait_ms,
)
from ._spec import BucketSpec, mconsume_call
from ._types import Backend, BucketInfo, MultiResult, NotSent, RateLimited, Result

T = TypeVar("T")

log = logging.getLogger("tb_limiter")

#: A server-side wait (BLOCK) is capped this far below the socket timeout of
#: the connection that carries it: the reply must arrive before the socket
#: gives up.
BLOCK_MARGIN_MS = 1000
#: Waits shorter than this are not worth a server-side wait.
MIN_BLOCK_MS = 100


@dataclass(frozen=True)
class Command:
    """Run ``execute_command(*args)`` and send back its reply."""

    args: tuple[str | bytes | int, ...]


@dataclass(frozen=True)
class Sleep:
    """Sleep ``seconds`` on the client (holding no connection)."""

    seconds: float


@dataclass(frozen=True)
class Block:
    """Run a ``TB.CONSUME`` or ``TB.MCONSUME ... BLOCK ms`` on the dedicated
    blocking connection.

    The driver takes the connection, reads its real socket timeout, and
    sends ``call(block_cap(ms, socket_timeout))``; it sends back ``(ms,
    reply)``, or None when the connection cannot hold a useful wait.

    ``shared``: a call in a flow (``FLOW``), which must wait on the server
    to be served in its turn: without a blocking client, the driver takes a
    connection of the limiter's own client (of the key's node on a cluster)."""

    call: Callable[[int], Call]
    ms: int
    shared: bool = False


Step = Union[Command, Sleep, Block]
Plan = Generator[Step, Any, T]


def cluster_target(args: Sequence[Any], keyslot: Callable[[Any], int]) -> Any:
    """The key a cluster client routes ``args`` by, when it would otherwise
    ask the server (``COMMAND GETKEYS``, for TB.MCONSUME's movable keys):
    the first key, once ``keyslot`` shows every key of the call shares its
    slot (else ``RedisClusterException``, as redis-py raises, nothing sent).
    None for the commands a cluster client routes by itself."""
    if len(args) < 3 or args[0] != "TB.MCONSUME":
        return None
    keys = args[2 : 2 + int(args[1])]
    if len({keyslot(k) for k in keys}) > 1:
        raise RedisClusterException("TB.MCONSUME - all keys must map to the same key slot")
    return keys[0]


def block_cap(ms: int, socket_timeout: float | None) -> int | None:
    """The longest BLOCK a connection with ``socket_timeout`` (seconds, None
    for none) can carry, up to ``ms``; None when that is too short to use."""
    if socket_timeout is not None:
        ms = min(ms, int(socket_timeout * 1000) - BLOCK_MARGIN_MS)
    return ms if ms >= MIN_BLOCK_MS else None


class ServerState:
    """What a client has learned about its server: which backend answers
    (None until the first call decides) and the longest wait it accepts
    (None until it refuses one). Valid across forks: it describes the
    server, not a connection."""

    __slots__ = ("backend", "max_wait_ms")

    def __init__(self, backend: Backend | None) -> None:
        self.backend = backend
        self.max_wait_ms: int | None = None

    def wait_limit_ms(self) -> int:
        """The longest wait to ask for when the caller gives none."""
        return DEFAULT_MAX_WAIT_MS if self.max_wait_ms is None else min(DEFAULT_MAX_WAIT_MS, self.max_wait_ms)


def reach_ms(server: ServerState, ms: int | None) -> int:
    """How far ahead a reservation asked to reach ``ms`` (None: as far as
    allowed) can reach, as far as the client knows the server's limit."""
    want = server.wait_limit_ms() if ms is None else ms
    return want if server.max_wait_ms is None else min(want, server.max_wait_ms)


def execute(server: ServerState, call: Call) -> Plan[Any]:
    """Runs one command on the module, or through the Lua fallback."""
    if server.backend != "lua":
        try:
            reply = yield Command(call.module_args())
        except Exception as e:
            # "module" was forced, or proved by an earlier reply (a
            # concurrent first call may have decided "lua" meanwhile).
            if server.backend == "module" or not is_unknown_command(e):
                raise
            server.backend = "lua"
        else:
            server.backend = "module"
            return reply
    return (yield from _script(call))


def _script(call: Call) -> Plan[Any]:
    head = (len(call.keys), *call.keys, *call.script_args())
    try:
        return (yield Command(("EVALSHA", SCRIPT_SHA, *head)))
    except Exception as e:
        if not is_noscript(e):
            raise
    try:
        # Runs the script and caches it on the server in one round trip.
        return (yield Command(("EVAL", SCRIPT, *head)))
    except Exception as e:
        if not str(e).startswith("NOPERM") and type(e).__name__ != "NoPermissionError":
            raise
    # A user allowed EVALSHA and SCRIPT LOAD, but not EVAL.
    yield Command(("SCRIPT LOAD", SCRIPT))
    return (yield Command(("EVALSHA", SCRIPT_SHA, *head)))


def with_wait(server: ServerState, run: Callable[[int], Plan[T]], ms: int | None) -> Plan[tuple[T, int]]:
    """Runs ``run(wait)`` with the wait the caller asked for (``ms``; None:
    as long as the server allows), no longer than the server accepts.

    When the server refuses the wait (``ERR wait exceeds tb.max-wait-ms
    (N)``), N is remembered for this client and the call is made again with
    N. Servers older than this client do not say N: the wait is halved
    until one is accepted. Returns the reply and the wait used."""
    want = reach_ms(server, ms)
    for _ in range(32):
        try:
            return (yield from run(want)), want
        except Exception as e:
            refused, limit = max_wait_error(e)
            if not refused or want == 0:
                raise
            limit = want // 2 if limit is None else limit
            if limit >= want:
                raise
            server.max_wait_ms = limit
            want = limit
    raise AssertionError("unreachable: the wait halves to 0 within 32 tries")


def consume(server: ServerState, spec: BucketSpec, n: int, atmost: bool, chunk: int | None = None) -> Plan[Result]:
    return Result.from_reply((yield from execute(server, spec._consume_call(n, atmost=atmost, chunk=chunk))))


def reserve(server: ServerState, spec: BucketSpec, n: int, max_wait: float | None) -> Plan[Result]:
    r, _ = yield from _reserve_ms(server, _Single(spec, n), None if max_wait is None else wait_ms(max_wait))
    return cast(Result, r)


def consume_many(
    server: ServerState,
    items: Sequence[tuple[BucketSpec, int]],
    max_wait: float | None,
    reserve: bool,
    atmost: bool = False,
    chunk: int | None = None,
) -> Plan[MultiResult]:
    if atmost and reserve:
        raise ValueError("atmost cannot be combined with a reservation (max_wait or reserve=True)")
    if not reserve:
        call = mconsume_call(items, None, atmost=atmost, chunk=chunk)
        return MultiResult.from_reply((yield from execute(server, call)), atmost)
    r, _ = yield from _reserve_ms(server, _Many(items), None if max_wait is None else wait_ms(max_wait))
    return cast(MultiResult, r)


def refund(server: ServerState, spec: BucketSpec, n: int) -> Plan[int | None]:
    reply = yield from execute(server, spec._refund_call(n))
    return None if reply is None else int(reply)


def info(server: ServerState, spec: BucketSpec) -> Plan[BucketInfo | None]:
    reply = yield from execute(server, spec._info_call())
    return None if reply is None else BucketInfo.from_reply(reply)


#: First and longest pause between two tries of a lease that was denied: a
#: denial's ``retry_after`` is when enough leases expire, and a release can
#: come any time before, so a lease is polled, backing off.
LEASE_POLL = (0.01, 0.5)


def lease_ttl_ms(ttl: float) -> int:
    """A lease TTL in seconds as whole milliseconds (at least 1)."""
    ms = wait_ms(ttl)
    if ms < 1:
        raise ValueError(f"a lease TTL must be at least 1 ms, got {ttl!r} s")
    return ms


def lease(
    server: ServerState,
    spec: BucketSpec,
    n: int,
    ttl: float,
    timeout: float | None,
    flow: tuple[str | bytes, ...] = (),
) -> Plan[Result]:
    """Takes a lease of ``n`` tokens (TB.CONSUME ... LEASE). A lease is never
    reserved: a denial is tried again, backing off, until ``timeout``
    seconds have passed (None: until it is granted or can never be).
    ``flow``: ``FLOW name [WEIGHT w]`` (:func:`~tb_limiter._protocol.flow_args`)."""
    call = spec._lease_call(n, lease_ttl_ms(ttl))
    return cast(Result, (yield from _lease_wait(server, call, Result.from_reply, str(spec.key), timeout, flow)))


def lease_many(
    server: ServerState,
    items: Sequence[tuple[BucketSpec, int]],
    ttl: Mapping[int, float],
    timeout: float | None,
    flow: tuple[str | bytes, ...] = (),
) -> Plan[MultiResult]:
    """TB.MCONSUME with the parts in ``ttl`` (index from 0: TTL in seconds)
    leased, polled like :func:`lease`."""
    call = mconsume_call(items, None, {j: lease_ttl_ms(t) for j, t in ttl.items()})
    name = ",".join(str(b.key) for b, _ in items)
    parse: Callable[[Any], Any] = lambda r: MultiResult.from_reply(r, leases=True)  # noqa: E731
    return cast(MultiResult, (yield from _lease_wait(server, call, parse, name, timeout, flow)))


def _lease_wait(
    server: ServerState,
    call: Call,
    parse: Callable[[Any], Any],
    name: str,
    timeout: float | None,
    flow: tuple[str | bytes, ...] = (),
) -> Plan[Any]:
    """Waits server-side in the bucket's queue (``BLOCK`` with ``LEASE`` or
    ``FLOW``: the server queues the call and grants the queue in weighted
    fair order across flows, first come first served within one), on the
    dedicated blocking connection (with a flow, on the limiter's own client
    when there is none); a wait that runs out is asked again, in the same
    flow, until ``timeout``. Polls, backing off, where it cannot wait on the
    server: the Lua fallback (which ignores the flow), no blocking
    connection, or a module without it."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = LEASE_POLL[0]
    if server.backend != "lua":
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            started = time.monotonic()

            def run(m: int) -> Plan[Any]:
                def block_call(cap: int) -> Call:
                    return Call(call.name, call.keys, (*call.args, "BLOCK", str(cap), *flow))

                return (yield Block(block_call, m, shared=bool(flow)))

            try:
                out, _ = yield from with_wait(server, run, None if left is None else wait_ms(left))
            except Exception as e:
                older = "LEASE cannot be combined" in str(e) or "TB.MCONSUME takes RESERVE" in str(e)
                if not (is_unknown_command(e) or older):
                    raise
                break  # no server-side wait for leases here: poll
            if out is None:
                break  # the connection cannot hold a useful wait: poll
            server.backend = "module"
            r = parse(out[1])
            if r.allowed:
                return r
            if r.never or (deadline is not None and time.monotonic() >= deadline):
                raise RateLimited(name, r)
            if time.monotonic() - started < 0.9 * out[0] / 1000:
                # Answered without waiting (the server's tb.max-blocked or
                # memory bound): back off as polling does.
                wait = min(pause, r.retry_after_ms / 1000)
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                yield Sleep(max(0.001, wait))
                pause = min(pause * 2, LEASE_POLL[1])
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    return (yield from _poll(lambda: execute(server, call), parse, name, left))


def _poll(run: Callable[[], Plan[Any]], parse: Callable[[Any], Any], name: str, timeout: float | None) -> Plan[Any]:
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = LEASE_POLL[0]
    while True:
        r = parse((yield from run()))
        if r.allowed:
            return r
        left = None if deadline is None else deadline - time.monotonic()
        if r.never or (left is not None and left <= 0):
            raise RateLimited(name, r)
        wait = min(pause, r.retry_after_ms / 1000)
        yield Sleep(max(0.001, wait if left is None else min(wait, left)))
        pause = min(pause * 2, LEASE_POLL[1])


def release(server: ServerState, spec: BucketSpec, lease_id: int, used: int | None) -> Plan[int | None]:
    """TB.RELEASE: the tokens given back (negative: an overrun charged), or
    None when the lease is not held (released already, or expired)."""
    reply = yield from execute(server, spec._release_call(lease_id, used))
    return None if reply is None else int(reply)


#: How a lease ends. ``done``: the body returned; slots are released,
#: estimates settled to the use reported (released whole without one).
#: ``kept``: the body raised (the call may have reached the provider and
#: may still run): estimates are settled to the use reported, else to the
#: estimate, and slots stay held until their TTL. ``back``: the call is
#: known not to have left (:class:`NotSent`, a ``return_on`` type, or
#: ``give_back()``): every lease is released, every other part refunded.
Outcome = Literal["done", "kept", "back"]

#: Exception types that mean "not sent", as ``return_on=`` takes them.
ReturnOn = Union[type[BaseException], tuple[type[BaseException], ...]]


def lease_outcome(error: BaseException | None, return_on: ReturnOn) -> Outcome:
    """How a lease whose body ended with ``error`` (None: returned) ends."""
    if error is None:
        return "done"
    if isinstance(error, NotSent) or isinstance(error, return_on):
        return "back"
    return "kept"


def finish_leases(
    server: ServerState,
    items: Sequence[tuple[BucketSpec, int]],
    lease_ids: Sequence[int],
    used: Mapping[int, int],
    outcome: Outcome,
) -> Plan[list[int | None]]:
    """Ends the leases ``lease_ids`` (0: a part not leased) of the parts
    ``items`` as ``outcome`` says (see :data:`Outcome`); ``used``: {part:
    tokens used} as the body reported. Returns each part's reply (tokens
    back, negative for an overrun charged; None for nothing done or a lease
    no longer held). On ``kept`` a failure is logged, not raised: the
    body's exception goes on, and a KEEP expiry charges the estimate
    anyway."""
    out: list[int | None] = []
    for j, ((spec, n), lease_id) in enumerate(zip(items, lease_ids)):
        got: int | None = None
        if outcome == "back":
            if lease_id:
                got = yield from release(server, spec, lease_id, None)
            elif n > 0:
                got = yield from refund(server, spec, n)
        elif lease_id and outcome == "done":
            got = yield from release(server, spec, lease_id, used.get(j))
        elif lease_id and not spec.is_slot():
            try:
                got = yield from release(server, spec, lease_id, used.get(j, n))
            except Exception as e:  # noqa: BLE001 (reported; the body's exception goes on)
                log.warning("tb_limiter: could not settle lease %d on %r: %s", lease_id, spec.key, e)
        out.append(got)
    return out


def undo_result(server: ServerState, result: object, items: Sequence[tuple[BucketSpec, int]]) -> Plan[None]:
    """Gives back what a reply its caller never saw took: leases are
    released, other tokens refunded (best effort, as :func:`undo`)."""
    ids: Sequence[int] = ()
    if isinstance(result, Result) and result.lease_id:
        ids = (result.lease_id,)
    elif isinstance(result, MultiResult) and result.allowed and result.lease_ids:
        ids = result.lease_ids
    if not ids:
        yield from undo(server, taken_by(result, items))
        return
    for (spec, n), lease_id in zip(items, ids):
        try:
            if lease_id:
                yield from release(server, spec, lease_id, None)
            elif n > 0:
                yield from execute(server, spec._refund_call(n))
        except Exception as e:  # noqa: BLE001 (reported, and the caller's exception goes on)
            log.warning("tb_limiter: could not give back lease %d or %d token(s) on %r: %s", lease_id, n, spec.key, e)


def acquire(
    server: ServerState,
    spec: BucketSpec,
    n: int,
    timeout: float | None,
    blocking: bool,
    flow: tuple[str | bytes, ...] = (),
) -> Plan[Result]:
    """Waits for ``n`` tokens. In a flow (``FLOW name [WEIGHT w]``, see
    :func:`~tb_limiter._protocol.flow_args`) the call waits in the bucket's
    queue on the server (nothing reserved); ``timeout`` None is then the
    server's longest wait."""
    if flow:
        call = spec._consume_call(n)
        limit = _flow_timeout(server, timeout)
        return cast(Result, (yield from _lease_wait(server, call, Result.from_reply, str(spec.key), limit, flow)))
    target = _Single(spec, n)
    if blocking and server.backend == "module":
        r = yield from _block(server, target, timeout)
        if r is not None:
            return r
    return cast(Result, (yield from _acquire(server, target, timeout)))


def acquire_many(
    server: ServerState,
    items: Sequence[tuple[BucketSpec, int]],
    timeout: float | None,
    flow: tuple[str | bytes, ...] = (),
) -> Plan[MultiResult]:
    """Waits for every ``(bucket, n)`` at once; in a flow, queued on the
    server (``TB.MCONSUME ... BLOCK ms FLOW name``) as :func:`acquire`."""
    if flow:
        call = mconsume_call(items, None)
        name = ",".join(str(b.key) for b, _ in items)
        limit = _flow_timeout(server, timeout)
        return cast(MultiResult, (yield from _lease_wait(server, call, MultiResult.from_reply, name, limit, flow)))
    return cast(MultiResult, (yield from _acquire(server, _Many(items), timeout)))


def _flow_timeout(server: ServerState, timeout: float | None) -> float:
    """How long a call in a flow waits: ``timeout``, or when None the
    server's longest wait (as far as ``acquire`` reserves without a flow)."""
    return server.wait_limit_ms() / 1000 if timeout is None else timeout


def undo(server: ServerState, taken: Sequence[tuple[BucketSpec, int]]) -> Plan[None]:
    """Gives back what a call took, best effort: a failure is logged, not
    raised (it runs while another exception is on its way)."""
    for spec, n in taken:
        if n <= 0:
            continue
        try:
            yield from execute(server, spec._refund_call(n))
        except Exception as e:  # noqa: BLE001 (reported, and the caller's exception goes on)
            log.warning("tb_limiter: could not refund %d token(s) to %r: %s", n, spec.key, e)


def taken_by(result: object, items: Sequence[tuple[BucketSpec, int]]) -> list[tuple[BucketSpec, int]]:
    """What a reply took from ``items``: to give back when its caller never
    saw it (cancelled while the reply was on its way)."""
    if isinstance(result, Result) and result.allowed:
        return [(items[0][0], result.granted)]
    if isinstance(result, MultiResult) and result.allowed:
        if result.granted is None:
            return list(items)
        # ATMOST: the parts asking for the largest n gave the grant.
        big = max(n for _, n in items)
        return [(spec, result.granted if n == big else n) for spec, n in items]
    return []


class _Single:
    """TB.CONSUME on one bucket."""

    def __init__(self, spec: BucketSpec, n: int) -> None:
        self.spec, self.n = spec, n

    def call(self, ms: int) -> Call:
        return self.spec._reserve_call(self.n, ms)

    def result(self, reply: Any) -> Result:
        return Result.from_reply(reply)

    def taken(self, r: Result) -> list[tuple[BucketSpec, int]]:
        return [(self.spec, r.granted)] if r.allowed else []

    def name(self) -> str:
        return str(self.spec.key)


class _Many:
    """TB.MCONSUME on several buckets, all or nothing."""

    def __init__(self, items: Sequence[tuple[BucketSpec, int]]) -> None:
        self.items = list(items)

    def call(self, ms: int) -> Call:
        return mconsume_call(self.items, ms)

    def result(self, reply: Any) -> MultiResult:
        return MultiResult.from_reply(reply)

    def taken(self, r: MultiResult) -> list[tuple[BucketSpec, int]]:
        return list(self.items) if r.allowed else []

    def name(self) -> str:
        return ",".join(str(b.key) for b, _ in self.items)


def _reserve_ms(server: ServerState, target: Any, ms: int | None) -> Plan[tuple[Any, int]]:
    reply, used = yield from with_wait(server, lambda m: execute(server, target.call(m)), ms)
    return target.result(reply), used


def _acquire(server: ServerState, target: Any, timeout: float | None) -> Plan[Any]:
    """Reserve, then sleep the reserved wait on the client.

    ``timeout`` None waits as long as the server lets a reservation reach
    (60 s, or ``tb.max-wait-ms`` if lower). A longer explicit ``timeout``
    than the server accepts: the reservation reaches as far as the server
    allows; when the tokens come later than that but within the timeout,
    the client sleeps, holding nothing, until they are that close, then
    reserves (its place in line is only kept from then on)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else wait_ms(max(0.0, deadline - time.monotonic()))
        r, used = yield from _reserve_ms(server, target, left)
        if r.allowed:
            break
        if r.never or left is None or r.retry_after_ms > left:
            raise RateLimited(target.name(), r)
        yield Sleep(max(r.retry_after_ms - used, 1) / 1000)
    if r.retry_after_ms > 0:
        yield from sleep_or_give_back(server, r.retry_after, target.taken(r))
    return r


def sleep_or_give_back(server: ServerState, seconds: float, taken: Sequence[tuple[BucketSpec, int]]) -> Plan[None]:
    """Sleeps until a reservation is due; if the sleep ends in an exception
    (cancelled, timed out, interrupted), gives the reservation back first."""
    try:
        yield Sleep(seconds)
    except GeneratorExit:
        raise
    except BaseException:
        yield from undo(server, taken)
        raise


def _block(server: ServerState, target: _Single, timeout: float | None) -> Plan[Result | None]:
    """Server-side wait on the dedicated connection. None when it cannot
    decide (the wait is longer than the connection can hold: reserve and
    sleep on the client instead)."""
    ms = None if timeout is None else wait_ms(timeout)

    def run(m: int) -> Plan[Any]:
        return (yield Block(lambda cap: target.spec._block_call(target.n, cap), m))

    out, _ = yield from with_wait(server, run, ms)
    if out is None:
        return None
    cap, reply = out
    r = target.result(reply)
    if r.allowed:
        if r.retry_after_ms > 0:
            # The server's tb.max-blocked was reached: it answered as RESERVE.
            yield from sleep_or_give_back(server, r.retry_after, target.taken(r))
        return r
    if r.never or (ms is not None and r.retry_after_ms > ms):
        raise RateLimited(target.name(), r)
    if r.retry_after_ms > cap:
        return None  # longer than the connection could hold
    raise RateLimited(target.name(), r)
