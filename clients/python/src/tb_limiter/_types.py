"""Typed replies of the tb commands, and the errors the client raises."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Literal, Mapping, Sequence

#: Which implementation answers: the native module or the Lua script.
Backend = Literal["module", "lua"]


def _seconds(ms: int) -> float:
    """Milliseconds to seconds; -1 (never) becomes infinity."""
    return math.inf if ms < 0 else ms / 1000.0


@dataclass(frozen=True)
class Result:
    """The reply of ``TB.CONSUME``: ``[allowed, remaining, retry_after_ms,
    reset_after_ms, granted]``.

    ``retry_after_ms`` is 0 when allowed now, the wait (rounded up, never
    optimistic) when denied or reserved, and -1 when the request can never
    succeed; ``reset_after_ms`` is -1 for a bucket that never refills.
    """

    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    granted: int
    lease_id: int | None = None
    """With ``LEASE``: the lease's id (0 when denied); else None."""

    @classmethod
    def from_reply(cls, reply: Sequence[int]) -> "Result":
        """Builds a result from the five integers of the reply (six with a
        lease id)."""
        values = [int(x) for x in reply]
        a, rem, retry, reset, granted = values[:5]
        return cls(bool(a), rem, retry, reset, granted, values[5] if len(values) > 5 else None)

    @property
    def retry_after(self) -> float:
        """Seconds to wait before proceeding (or retrying); ``inf`` for never."""
        return _seconds(self.retry_after_ms)

    @property
    def reset_after(self) -> float:
        """Seconds until the bucket is full again; ``inf`` for never."""
        return _seconds(self.reset_after_ms)

    @property
    def never(self) -> bool:
        """True when the request can never succeed (n > capacity, or rate 0
        and too few tokens)."""
        return self.retry_after_ms < 0

    @property
    def reply(self) -> list[int]:
        """The reply as the server sent it."""
        head = [int(self.allowed), self.remaining, self.retry_after_ms,
                self.reset_after_ms, self.granted]
        return head if self.lease_id is None else [*head, self.lease_id]


@dataclass(frozen=True)
class MultiResult:
    """The reply of ``TB.MCONSUME``: ``[allowed, retry_after_ms, remaining_1,
    ..., remaining_k]``, and with ``ATMOST`` one more, ``granted``."""

    allowed: bool
    retry_after_ms: int
    remaining: tuple[int, ...]
    granted: int | None = None
    """With ``atmost``: the grant taken from every part asking for the
    largest ``n`` (0 when denied); None without ``atmost``."""
    lease_ids: tuple[int, ...] = ()
    """With ``LEASE`` parts: every part's lease id (0 for a part without a
    lease, or when denied); else empty."""

    @classmethod
    def from_reply(cls, reply: Sequence[int], atmost: bool = False, leases: bool = False) -> "MultiResult":
        """Builds a result from the reply's integers (``atmost``: the last one
        is the grant; ``leases``: the call had LEASE parts, so the lease ids
        follow the remaining tokens)."""
        values = [int(x) for x in reply]
        if atmost:
            return cls(bool(values[0]), values[1], tuple(values[2:-1]), values[-1])
        if leases:
            k = (len(values) - 2) // 2
            return cls(bool(values[0]), values[1], tuple(values[2 : 2 + k]), None, tuple(values[2 + k :]))
        return cls(bool(values[0]), values[1], tuple(values[2:]))

    @property
    def retry_after(self) -> float:
        """Seconds until every bucket would succeed; ``inf`` for never."""
        return _seconds(self.retry_after_ms)

    @property
    def never(self) -> bool:
        """True when some bucket can never give its ``n``."""
        return self.retry_after_ms < 0

    @property
    def reply(self) -> list[int]:
        """The reply as the server sent it."""
        extra = [] if self.granted is None else [self.granted]
        return [int(self.allowed), self.retry_after_ms, *self.remaining, *extra, *self.lease_ids]


@dataclass(frozen=True)
class FlowInfo:
    """One flow waiting on a bucket (``TB.INFO``'s ``waiting_flows``)."""

    name: str
    """The flow's name, decoded as UTF-8 (bytes that are not UTF-8 as
    surrogates: ``name.encode(errors="surrogateescape")`` gives them back);
    ``""`` for the default flow (waiting calls that named none)."""
    weight: int
    waiting: int
    """Calls of this flow waiting on the bucket."""


def _text(value: object) -> str:
    return value.decode(errors="surrogateescape") if isinstance(value, bytes) else str(value)


def _flows(value: object) -> tuple[FlowInfo, ...]:
    """``[name, weight, waiting, ...]`` as flows, in the order given."""
    if not isinstance(value, (list, tuple)):
        return ()
    return tuple(FlowInfo(_text(value[i]), int(value[i + 1]), int(value[i + 2])) for i in range(0, len(value) - 2, 3))


@dataclass(frozen=True)
class BucketInfo:
    """The reply of ``TB.INFO``: the bucket as of now (read-only).

    ``tokens`` is exact (the server keeps nano-tokens); ``rate`` is the
    server's decimal, exact when it terminates within 12 decimals (``0.5``;
    ``100/m`` reads ``1.666666666667``)."""

    tokens: Decimal
    """Tokens as of now; negative while reservations are pending."""
    capacity: int
    rate: Decimal
    """Tokens per second."""
    updated_at_ms: int
    """Server time (ms since the epoch) of the stored state."""
    reset_after_ms: int
    """Milliseconds until full, rounded up; -1 if never."""
    ttl_ms: int
    """Milliseconds until the key expires; -1 without expiry."""
    waiting: int = 0
    """Calls waiting in the bucket's queue on the server (in a flow, for a
    lease, or a multi-bucket wait); 0 when none."""
    flows: tuple[FlowInfo, ...] = ()
    """The flows of those calls, in the order they will be served next."""

    @classmethod
    def from_reply(cls, reply: Sequence[object] | Mapping[object, object]) -> "BucketInfo":
        """Builds the info from the flat field/value array (or a RESP3 map)."""
        pairs = reply.items() if isinstance(reply, Mapping) else zip(reply[0::2], reply[1::2])
        fields: dict[str, str] = {}
        flows: tuple[FlowInfo, ...] = ()
        for name, value in pairs:
            key = _text(name)
            if key == "waiting_flows":
                flows = _flows(value)
            elif not isinstance(value, (list, tuple)):
                fields[key] = _text(value)
        return cls(
            tokens=Decimal(fields["tokens"]),
            capacity=int(fields["capacity"]),
            rate=Decimal(fields["rate"]),
            updated_at_ms=int(fields["updated_at_ms"]),
            reset_after_ms=int(fields["reset_after_ms"]),
            ttl_ms=int(fields["ttl_ms"]),
            waiting=int(fields.get("waiting", 0)),
            flows=flows,
        )


class RateLimited(Exception):
    """Raised by ``acquire`` and the decorator/context manager when the
    tokens cannot be had within the timeout. ``result`` is the reply that
    said so (``result.never`` when they can never be had);
    ``retry_after_ms`` and ``retry_after`` (seconds) say how long to wait
    before trying again (-1 ms and ``inf`` for never), e.g. for an HTTP
    ``Retry-After`` header."""

    def __init__(self, key: str, result: Result | MultiResult) -> None:
        self.key = key
        self.result = result
        self.retry_after_ms: int = result.retry_after_ms
        """Milliseconds to wait before trying again; -1 for never."""
        if result.never:
            why = "can never be satisfied"
        else:
            why = f"needs {result.retry_after_ms} ms"
        super().__init__(f"rate limited on {key!r}: {why}")

    @property
    def retry_after(self) -> float:
        """Seconds to wait before trying again; ``inf`` for never."""
        return _seconds(self.retry_after_ms)


class NotSent(Exception):
    """Raise it (or wrap a failure in it: ``raise NotSent() from e``) in the
    body of a lease when the call it guards is known not to have left (a
    connection refused, a request that failed validation): the lease gives
    back everything it took. Any other exception keeps the charge (see
    :meth:`tb_limiter.Limiter.lease_many`). It goes on to the caller."""
