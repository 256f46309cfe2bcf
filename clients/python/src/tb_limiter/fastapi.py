"""HTTP rate limits as a FastAPI dependency, with the IETF RateLimit header
fields (draft-ietf-httpapi-ratelimit-headers-11).

    from fastapi import Depends, FastAPI
    from tb_limiter import AsyncLimiter
    from tb_limiter.fastapi import RateLimit

    limiter = AsyncLimiter.from_url(REDIS_URL)
    per_key = RateLimit(limiter, "10/second;1000/day", key=lambda request: request.headers["X-API-Key"])

    @app.get("/v1/models", dependencies=[Depends(per_key)])
    async def models(): ...

Every limit of the string is one bucket (capacity = the limit's amount,
refilled at amount/period per second), all checked at once with
``TB.MCONSUME``: a request takes one token from each, or none. A denied
request gets ``429`` with

* ``Retry-After``: seconds until it would be served, rounded up (never
  optimistic);
* ``RateLimit-Policy``: per limit, ``"10/second";q=10;w=1``: the burst ``q``
  (the bucket's capacity) and ``w``, the seconds in which the bucket refills
  from empty (so ``q/w`` is the average rate);
* ``RateLimit``: per limit, ``"10/second";r=0;t=1``: ``r`` the whole tokens
  left; ``t`` the seconds until more are available: for a limit that denied
  the request, exactly the ``Retry-After``; for the others an upper bound
  (one token's refill time), and absent when the bucket is full.

Served responses carry ``RateLimit-Policy`` and ``RateLimit`` too. With
``wait`` (seconds), a request first waits that long for its turn (reserve,
then sleep: no connection held) before it is refused. The wait watches the
connection (the ASGI ``http.disconnect`` message; the request body is read
first): a client that goes away meanwhile gives its turn back (refunded) and
the handler does not run (the request ends with status 499). Servers such as
uvicorn do not cancel a handler when its client leaves, so without this
watch a turn would be kept for nobody.

With ``flow`` (a name, or a function of the request: the tenant of a shared
limit) and ``weight``, a request that waits does so in that flow on the
server (reserving nothing): while several tenants' requests wait on a
saturated limit, each tenant gets grants in proportion to its weight. A
client that leaves drops its wait, which takes it out of the queue.
"""

from __future__ import annotations

import asyncio
import math
from fractions import Fraction
from typing import Callable, Iterable, Sequence, Union

from fastapi import HTTPException, Request, Response

from ._protocol import FlowName, flow_args
from ._rates import LimitSpec
from ._types import MultiResult, RateLimited
from .aio import AsyncBucketGroup, AsyncLimiter


#: Limits: a string such as ``"10/second;1000/day"``, parsed limits, or a
#: function of the request that returns either (limits per user tier).
Limits = Union[str, Iterable[LimitSpec], Callable[[Request], Union[str, Iterable[LimitSpec]]]]


class RateLimit:
    """A FastAPI dependency that takes ``cost`` tokens from every limit of
    ``limits`` for the key ``key(request)`` (prefixed by ``prefix``),
    waiting up to ``wait`` seconds for its turn first (in the flow
    ``flow``, with ``weight``, when given: see the module's docstring).
    ``limits``, ``wait``, ``flow`` and ``weight`` may be functions of the
    request; they and ``key`` may raise ``HTTPException`` (e.g. 401 for an
    unknown API key)."""

    def __init__(
        self,
        limiter: AsyncLimiter,
        limits: Limits,
        *,
        key: Callable[[Request], str],
        prefix: str = "rl:",
        cost: int = 1,
        wait: float | Callable[[Request], float] = 0.0,
        flow: FlowName | Callable[[Request], FlowName | None] | None = None,
        weight: int | Callable[[Request], int] = 1,
    ) -> None:
        if not callable(flow) and not callable(weight):
            flow_args(flow, weight)
        self.limiter = limiter
        self.limits = limits if isinstance(limits, str) or callable(limits) else list(limits)
        self.key = key
        self.prefix = prefix
        self.cost = cost
        self.wait = wait
        self.flow = flow
        self.weight = weight

    def group(self, request: Request) -> AsyncBucketGroup:
        """The buckets of this request's key."""
        limits = self.limits(request) if callable(self.limits) else self.limits
        return self.limiter.limits(self.prefix + self.key(request), limits)

    async def __call__(self, request: Request, response: Response) -> MultiResult:
        group = self.group(request)
        wait = self.wait(request) if callable(self.wait) else self.wait
        if wait > 0:
            try:
                flow = self.flow(request) if callable(self.flow) else self.flow
                weight = self.weight(request) if callable(self.weight) else self.weight
                weight = 1 if flow is None else weight
                r = await acquire_unless_gone(group, self.cost, wait, request, flow, weight)
            except RateLimited as e:
                assert isinstance(e.result, MultiResult)
                r = e.result
        else:
            r = await group.consume(self.cost)
        headers = rate_limit_headers(group.specs, r, self.cost)
        if not r.allowed:
            detail = "this request exceeds the limit" if r.never else "rate limited"
            raise HTTPException(status_code=429, detail=detail, headers=headers)
        response.headers.update(headers)
        return r


#: The status of a request whose client went away while it waited (nginx's
#: "client closed request"; nobody reads it).
CLIENT_GONE = 499


async def acquire_unless_gone(
    group: AsyncBucketGroup,
    cost: int,
    wait: float,
    request: Request,
    flow: FlowName | None = None,
    weight: int = 1,
) -> MultiResult:
    """``group.acquire(cost, timeout=wait, flow=flow, weight=weight)`` raced against the client's
    disconnect: when the client goes first, the wait is cancelled (which
    gives the turn back), a turn granted at that moment is refunded, and
    ``HTTPException(499)`` keeps the handler from running."""
    await request.body()  # after the body, the next message is the disconnect
    flow_args(flow, weight)  # a bad flow is refused before anything is sent
    acquire = asyncio.ensure_future(group.acquire(cost, timeout=wait, flow=flow, weight=weight))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({acquire, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not gone.done():
            gone.cancel()
    if not gone.done() or gone.cancelled() or gone.exception() is not None or not gone.result():
        return await acquire
    if acquire.done():
        if acquire.exception() is None:
            await group.refund(cost)
    else:
        acquire.cancel()
        try:
            await acquire
        except (asyncio.CancelledError, RateLimited):
            pass
    raise HTTPException(status_code=CLIENT_GONE, detail="client closed request")


async def _disconnected(request: Request) -> bool:
    """Waits for the ASGI ``http.disconnect`` message (the body was read)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return True


def rate_limit_headers(specs: Sequence[LimitSpec], r: MultiResult, cost: int = 1) -> dict[str, str]:
    """``Retry-After`` (denials), ``RateLimit-Policy`` and ``RateLimit`` from
    a TB.MCONSUME reply over ``specs`` (see the module's docstring)."""
    policies = []
    limits = []
    retry = None if r.allowed or r.never else math.ceil(r.retry_after_ms / 1000)
    for spec, remaining in zip(specs, r.remaining):
        name = _sf_string(spec.text)
        policies.append(f"{name};q={spec.amount};w={spec.seconds}")
        item = f"{name};r={max(remaining, 0)}"
        if retry is not None and remaining < cost:
            item += f";t={retry}"
        elif remaining < spec.amount and spec.amount > 0:
            item += f";t={math.ceil(Fraction(1) / spec.per_second)}"
        limits.append(item)
    headers = {"RateLimit-Policy": ", ".join(policies), "RateLimit": ", ".join(limits)}
    if retry is not None:
        headers["Retry-After"] = str(retry)
    return headers


def _sf_string(text: str) -> str:
    """A Structured Field String (RFC 9651): quoted, ``\\`` and ``"`` escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
