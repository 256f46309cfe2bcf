"""Celery tasks that keep a fleet-wide limit: reserve a turn, requeue until
it is due, never call without a token.

    from tb_limiter import Limiter
    from tb_limiter.celery import rate_limited

    limiter = Limiter.from_url(REDIS_URL)         # at import, in the parent
    llm = limiter.bucket("llm:api", "0.5", 1)

    @app.task
    @rate_limited(llm)
    def complete(prompt): ...

Each run of the task first *reserves* its tokens (``TB.CONSUME ... RESERVE``:
first come, first served across every worker of every machine):

* granted now: the task body runs at once;
* granted later (the bucket goes into debt for it): the task requeues itself
  with the wait as its countdown, carrying its turn in a keyword argument,
  and runs its body when the turn is due. No worker process sleeps through
  the wait; Celery wakes the task ``lead`` seconds early and it sleeps the
  rest, because countdown tasks run a few milliseconds late by varying
  amounts;
* denied (the turn is further away than a reservation reaches: a backlog
  deeper than ``max_wait``, which is at most ``tb.max-wait-ms``): nothing is
  taken, and the task requeues itself to ask again when its tokens are that
  close, but not sooner than half the reach (so a deep backlog asks again
  in waves, each of which fills the queue, not at the bucket's rate). A
  denial's ``retry_after`` is when the tokens come, not a grant: the body
  never runs on it. Order among such tasks is Celery's, not first come,
  first served;
* never (more tokens than the bucket holds): :class:`~tb_limiter.RateLimited`.

Requeues count in ``task.request.retries`` but never against the task's
``max_retries``. Turns are kept in wall-clock time, as Celery keeps
countdowns: the workers' clocks must agree (NTP). A task lost with its
worker after reserving loses its turn (the tokens stay taken: the limiter
errs on the side of fewer calls). A task time limit hit while sleeping to
its turn gives the turn back.

Several limits at once, with leases (requests and tokens per minute, and
requests in flight, around an LLM call): :func:`leased`.

    @app.task
    @leased(limiter, lambda prompt: [(rpm, 1), (tpm, estimate(prompt)), (inflight, 1)],
            ttl={1: 60, 2: 120})
    def complete(prompt):
        reply = call_model(prompt)
        current_lease().used[1] = reply.usage.total_tokens
        return reply.text

Each run makes one all-or-nothing ``TB.MCONSUME`` that lends the leased
parts. Granted: the body runs, and on its exit the leases end as
:meth:`tb_limiter.Limiter.lease_many` says (settled after the call; on an
exception the estimate stays charged and the in-flight slot stays held until
its TTL; :class:`~tb_limiter.NotSent` gives everything back). Denied: the task
requeues itself, holding nothing, with the server's wait as its countdown
(capped at ``poll`` seconds, since a slot can come back before its TTL when
its holder finishes); never: :class:`~tb_limiter.RateLimited`. No worker
process sleeps waiting. Order among waiting tasks is Celery's.

Fair share between tenants (``flow=``, ``weight=``, on both decorators): a
task names its flow, a string or a function of the task's arguments (its
tenant), and waits for its tokens in that flow on the server, in the queue
of the bucket that makes it wait (``BLOCK ms FLOW name``). While several
tenants' tasks wait on a saturated bucket, grants go to the tenants in
proportion to their weights, first come first served within a tenant, so
a tenant with 10,000 queued tasks does not starve one with ten::

    @app.task
    @rate_limited(llm, flow=lambda tenant, prompt: tenant)
    def complete(tenant, prompt): ...

A task in a flow waits in its worker process (one connection held while it
waits) for at most ``max_wait`` seconds (default: the server's longest wait,
60 s or ``tb.max-wait-ms``), then requeues itself at once to wait again in
the same flow, holding nothing; its turn among its tenant's tasks is kept
by the server, not by Celery. On the Lua fallback the flow is ignored (the
task polls for its tokens in its worker process).
"""

from __future__ import annotations

import contextvars
import functools
import time
from typing import Any, Callable, Mapping, Sequence, TypeVar, Union, cast

from celery import current_task
from celery.exceptions import Retry

from ._core import ReturnOn, reach_ms, sleep_or_give_back
from ._protocol import flow_args, wait_ms
from ._spec import BucketSpec
from ._types import RateLimited
from .sync import LeasedMany, Limiter, TokenBucket

F = TypeVar("F", bound=Callable[..., Any])

#: The keyword argument that carries a requeued task's turn (wall-clock
#: seconds when its reserved tokens are due).
TURN_KWARG = "_tb_turn"
#: Seconds before its turn a requeued task is woken (it sleeps the rest).
DEFAULT_LEAD = 0.25

#: Longest countdown of a task requeued by :func:`leased` after a denial.
DEFAULT_POLL = 1.0

_turn: contextvars.ContextVar[float | None] = contextvars.ContextVar("tb_turn", default=None)
_lease: contextvars.ContextVar[LeasedMany | None] = contextvars.ContextVar("tb_lease", default=None)

#: A task's flow (``flow=``): a name, or a function of the task's arguments
#: that returns one (None: no flow for that run).
FlowOf = Union[str, bytes, Callable[..., Union[str, bytes, None]]]
#: A task's weight (``weight=``): an int, or a function of the task's arguments.
WeightOf = Union[int, Callable[..., int]]

#: The parts of :func:`leased`: ``(bucket, n)`` pairs, or a function of the
#: task's arguments that returns them (an estimate from the prompt).
Parts = Union[Sequence[tuple[BucketSpec, int]], Callable[..., Sequence[tuple[BucketSpec, int]]]]


def rate_limited(
    bucket: TokenBucket,
    n: int = 1,
    *,
    max_wait: float | None = None,
    lead: float = DEFAULT_LEAD,
    flow: FlowOf | None = None,
    weight: WeightOf = 1,
) -> Callable[[F], F]:
    """Decorates a Celery task function (under ``@app.task``, bound or not)
    so that its body runs only with ``n`` tokens of ``bucket``, taken in
    turn across the fleet. ``max_wait`` bounds how far ahead a task reserves
    (default: as far as the server allows, 60 s or ``tb.max-wait-ms``).
    ``flow`` and ``weight`` (each a value or a function of the task's
    arguments): the task waits in that flow on the server instead of
    reserving (fair share between tenants). See the module's docstring."""
    if lead < 0:
        raise ValueError("lead must be >= 0")
    _check_flow(flow, weight)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            turn = kwargs.pop(TURN_KWARG, None)
            name, w = _flow_of(flow, weight, args, kwargs)
            if turn is None and name is not None:
                _acquire_in_flow(bucket, n, max_wait, name, w, kwargs)
                turn = time.time()
            elif turn is None:
                wait = _reserve_or_requeue(bucket, n, max_wait, lead, kwargs)
                turn = time.time() + wait
                if wait > 0:
                    _sleep_to_turn(bucket, n, wait)
            else:
                _sleep_to_turn(bucket, n, float(turn) - time.time())
            token = _turn.set(float(turn))
            try:
                return fn(*args, **kwargs)
            finally:
                _turn.reset(token)

        return cast(F, wrapper)

    return decorate


def leased(
    limiter: Limiter,
    parts: Parts,
    *,
    ttl: Mapping[int, float],
    poll: float = DEFAULT_POLL,
    return_on: ReturnOn = (),
    flow: FlowOf | None = None,
    weight: WeightOf = 1,
    max_wait: float | None = None,
) -> Callable[[F], F]:
    """Decorates a Celery task function (under ``@app.task``) so that its
    body runs holding ``parts`` (``(bucket, n)`` pairs, or a function of the
    task's arguments returning them), the parts ``ttl`` names leased, as
    :meth:`tb_limiter.Limiter.lease_many`; the body reports its use with
    ``current_lease().used[part] = n``. A denial requeues the task with the
    server's wait, at most ``poll`` seconds: see the module's docstring.
    ``flow`` and ``weight`` (each a value or a function of the task's
    arguments): the task waits for its leases in that flow on the server,
    at most ``max_wait`` seconds (default: the server's longest wait), then
    requeues at once."""
    if poll <= 0:
        raise ValueError("poll must be > 0")
    _check_flow(flow, weight)

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            items = parts(*args, **kwargs) if callable(parts) else parts
            name, w = _flow_of(flow, weight, args, kwargs)
            wait = 0.0 if name is None else _flow_wait(limiter, max_wait)
            held = limiter.lease_many(items, ttl=ttl, timeout=wait, return_on=return_on, flow=name, weight=w)
            try:
                held.__enter__()
            except RateLimited as e:
                if e.result.never:
                    raise
                # In a flow the wait ran out on the server: wait again at once.
                countdown = 0.001 if name is not None else min(max(e.retry_after, 0.001), poll)
                _requeue(countdown, dict(kwargs))
            token = _lease.set(held)
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                held.__exit__(type(e), e, e.__traceback__)
                raise
            finally:
                _lease.reset(token)
            held.__exit__(None, None, None)
            return out

        return cast(F, wrapper)

    return decorate


def current_lease() -> LeasedMany | None:
    """Inside a task body run by :func:`leased`: its held leases (set
    ``used[part]`` to settle a part on exit; ``give_back()``)."""
    return _lease.get()


def current_turn() -> float | None:
    """Inside a task body run by :func:`rate_limited`: the wall-clock time
    (``time.time()``) at which its tokens were due. The body starts at or
    after it; ``time.time() - current_turn()`` is how late."""
    return _turn.get()


def _check_flow(flow: FlowOf | None, weight: WeightOf) -> None:
    """Checks a flow and weight given as values when the task is decorated
    (functions of the arguments are checked on each run)."""
    if not callable(flow) and not callable(weight):
        flow_args(flow, weight)


def _flow_of(flow: FlowOf | None, weight: WeightOf, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[str | bytes | None, int]:
    """The flow and weight of one run, from the task's arguments."""
    name = flow(*args, **kwargs) if callable(flow) else flow
    w = weight(*args, **kwargs) if callable(weight) else weight
    flow_args(name, w if name is not None else 1)
    return name, w if name is not None else 1


def _flow_wait(limiter: Limiter, max_wait: float | None) -> float:
    """How long a task waits in its flow before it requeues: ``max_wait``,
    at most what the server accepts (60 s or ``tb.max-wait-ms``)."""
    return reach_ms(limiter._server, None if max_wait is None else wait_ms(max_wait)) / 1000


def _acquire_in_flow(
    bucket: TokenBucket, n: int, max_wait: float | None, flow: str | bytes, weight: int, kwargs: dict[str, Any]
) -> None:
    """Waits for ``n`` tokens in ``flow`` on the server; when the wait runs
    out, requeues the task at once to wait again (raising Celery's Retry)."""
    try:
        bucket.acquire(n, timeout=_flow_wait(bucket.limiter, max_wait), flow=flow, weight=weight)
    except RateLimited as e:
        if e.result.never:
            raise
        _requeue(0.001, dict(kwargs))


def _reserve_or_requeue(
    bucket: TokenBucket, n: int, max_wait: float | None, lead: float, kwargs: dict[str, Any]
) -> float:
    """Reserves ``n`` tokens. Returns the wait (<= lead) to sleep before
    running; requeues the task (raising Celery's Retry) otherwise."""
    r = bucket.reserve(n, max_wait=max_wait)
    if r.allowed:
        if r.retry_after <= lead:
            return r.retry_after
        # Ours, later: come back just before the turn.
        _requeue(r.retry_after - lead, {**kwargs, TURN_KWARG: time.time() + r.retry_after})
    if r.never:
        raise RateLimited(str(bucket.key), r)
    # Not reserved (further away than a reservation reaches): ask again when
    # the tokens are within reach, and not sooner than half the reach, so a
    # deep backlog of denied tasks comes back in waves (each wave fills the
    # queue again), never at the bucket's rate. Nothing is held meanwhile.
    reach = reach_ms(bucket.limiter._server, None if max_wait is None else wait_ms(max_wait)) / 1000
    _requeue(max(r.retry_after - reach, reach / 2, 0.001), dict(kwargs))
    raise AssertionError("unreachable: _requeue raises")


def _requeue(countdown: float, kwargs: dict[str, Any]) -> None:
    task = current_task
    request = task.request
    # Passing max_retries allows this requeue whatever the task's own limit
    # (which is for failures).
    raise cast(Retry, task.retry(args=request.args, kwargs=kwargs, countdown=countdown,
                                 max_retries=request.retries + 1))


def _sleep_to_turn(bucket: TokenBucket, n: int, seconds: float) -> None:
    """Sleeps until the reserved turn; an exception meanwhile (a soft time
    limit) gives the tokens back before it goes on."""
    if seconds <= 0:
        return
    lim = bucket.limiter
    lim._run(sleep_or_give_back(lim._server, seconds, [(bucket, n)]))
