"""A bucket's identity and limits, and the commands for each operation."""

from __future__ import annotations

from typing import Iterable, Sequence

from ._protocol import Call, RateLike, amount_arg, rate_arg, wait_ms


class BucketSpec:
    """A key with its limits: ``rate`` tokens per second (``10``, ``"0.5"``,
    ``"100/m"``), burst ``capacity``. Every request carries the limits, so
    changing them here changes them for the key (refill is settled at the old
    rate first; tokens never grow by a change)."""

    __slots__ = ("key", "rate", "capacity")

    def __init__(self, key: str | bytes, rate: RateLike, capacity: int) -> None:
        self.key = key
        self.rate = rate_arg(rate)
        self.capacity = int(amount_arg(capacity, "capacity"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, rate={self.rate!r}, capacity={self.capacity})"

    def _limits(self) -> tuple[str, str]:
        return (self.rate, str(self.capacity))

    def _consume_call(self, n: int, *, atmost: bool = False) -> Call:
        args = (*self._limits(), amount_arg(n))
        return Call("TB.CONSUME", (self.key,), (*args, "ATMOST") if atmost else args)

    def _reserve_call(self, n: int, max_wait: float) -> Call:
        args = (*self._limits(), amount_arg(n), "RESERVE", str(wait_ms(max_wait)))
        return Call("TB.CONSUME", (self.key,), args)

    def _block_call(self, n: int, timeout: float) -> Call:
        args = (*self._limits(), amount_arg(n), "BLOCK", str(wait_ms(timeout)))
        return Call("TB.CONSUME", (self.key,), args)

    def _refund_call(self, n: int) -> Call:
        return Call("TB.REFUND", (self.key,), (amount_arg(n),))

    def _info_call(self) -> Call:
        return Call("TB.INFO", (self.key,), ())


def mconsume_call(parts: Iterable[tuple[BucketSpec, int]], max_wait: float | None) -> Call:
    """TB.MCONSUME over ``(bucket, n)`` pairs, with RESERVE when ``max_wait``
    is given."""
    items: Sequence[tuple[BucketSpec, int]] = list(parts)
    if not items:
        raise ValueError("consume_many needs at least one (bucket, n) pair")
    keys = tuple(b.key for b, _ in items)
    args: list[str] = []
    for b, n in items:
        args += [*b._limits(), amount_arg(n)]
    if max_wait is not None:
        args += ["RESERVE", str(wait_ms(max_wait))]
    return Call("TB.MCONSUME", keys, tuple(args))
