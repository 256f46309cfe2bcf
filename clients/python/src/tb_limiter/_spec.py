"""A bucket's identity and limits, and the commands for each operation."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ._protocol import Call, amount_arg
from ._rates import LimitSpec, RateLike, is_limits_string, parse_limits, rate_arg


class BucketSpec:
    """A key with its limits: ``rate`` tokens per second (``10``, ``"0.5"``,
    ``"100/m"``) and burst ``capacity``, or a ``limits``-style string
    (``"100/minute"``: capacity 100 unless given). Every request carries the
    limits, so changing them here changes them for the key (refill is
    settled at the old rate first; tokens never grow by a change)."""

    __slots__ = ("key", "rate", "capacity")

    def __init__(self, key: str | bytes, rate: RateLike, capacity: int | None = None) -> None:
        if capacity is None:
            if not (isinstance(rate, str) and is_limits_string(rate)):
                raise TypeError("capacity is required unless the rate is written like '100/minute'")
            capacity = parse_limits(rate)[0].amount
        self.key = key
        self.rate = rate_arg(rate)
        self.capacity = int(amount_arg(capacity, "capacity"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r}, rate={self.rate!r}, capacity={self.capacity})"

    def _limits(self) -> tuple[str, str]:
        return (self.rate, str(self.capacity))

    def _consume_call(self, n: int, *, atmost: bool = False, chunk: int | None = None) -> Call:
        return Call("TB.CONSUME", (self.key,), (*self._limits(), amount_arg(n), *atmost_args(atmost, chunk)))

    def _reserve_call(self, n: int, ms: int) -> Call:
        return Call("TB.CONSUME", (self.key,), (*self._limits(), amount_arg(n), "RESERVE", str(ms)))

    def _block_call(self, n: int, ms: int) -> Call:
        return Call("TB.CONSUME", (self.key,), (*self._limits(), amount_arg(n), "BLOCK", str(ms)))

    def _refund_call(self, n: int) -> Call:
        return Call("TB.REFUND", (self.key,), (amount_arg(n),))

    def _info_call(self) -> Call:
        return Call("TB.INFO", (self.key,), ())

    def is_slot(self) -> bool:
        """True for a concurrency limit (rate 0): its leases are in-flight
        slots, given back when they expire. Any other bucket's leases are
        estimates, kept as used when they expire (``KEEP``)."""
        return _is_zero(self.rate)

    def _lease_call(self, n: int, ttl_ms: int) -> Call:
        keep = () if self.is_slot() else ("KEEP",)
        return Call("TB.CONSUME", (self.key,), (*self._limits(), amount_arg(n), "LEASE", str(ttl_ms), *keep))

    def _release_call(self, lease_id: int, used: int | None) -> Call:
        extra = () if used is None else ("USED", amount_arg(used))
        return Call("TB.RELEASE", (self.key,), (str(int(lease_id)), *extra))


def _is_zero(rate: str) -> bool:
    """Whether a rate argument (``"0"``, ``"0.0"``, ``"0/m"``) is zero."""
    head = rate.split("/", 1)[0].strip()
    try:
        return float(head) == 0
    except ValueError:
        return False


def atmost_args(atmost: bool, chunk: int | None) -> tuple[str, ...]:
    """``ATMOST [MIN chunk]``, or nothing; a chunk needs ``atmost``."""
    if chunk is not None and not atmost:
        raise ValueError("chunk is the smallest grant of atmost=True")
    if not atmost:
        return ()
    return ("ATMOST",) if chunk is None else ("ATMOST", "MIN", amount_arg(chunk, "chunk"))


def mconsume_call(
    items: Sequence[tuple[BucketSpec, int]],
    ms: int | None,
    leases: Mapping[int, int] | None = None,
    *,
    atmost: bool = False,
    chunk: int | None = None,
) -> Call:
    """TB.MCONSUME over ``(bucket, n)`` pairs, with RESERVE ``ms`` when
    given, or ``ATMOST [MIN chunk]``; ``leases``: {part index from 0: TTL in
    ms} for the leased parts (``KEEP`` unless the part is a slot: see
    :meth:`BucketSpec.is_slot`)."""
    if not items:
        raise ValueError("consume_many needs at least one (bucket, n) pair")
    keys = tuple(b.key for b, _ in items)
    args: list[str] = []
    for b, n in items:
        args += [*b._limits(), amount_arg(n)]
    for part, ttl_ms in sorted((leases or {}).items()):
        if not 0 <= part < len(items):
            raise ValueError(f"no part {part} to lease among {len(items)}")
        args += ["LEASE", str(part + 1), str(ttl_ms)]
        if not items[part][0].is_slot():
            args.append("KEEP")
    if ms is not None:
        args += ["RESERVE", str(ms)]
    args += atmost_args(atmost, chunk)
    return Call("TB.MCONSUME", keys, tuple(args))


def group_key(key: str, limit: LimitSpec) -> str:
    """The key of one limit of a group: ``rl:{alice}:10/1s`` for a key with a
    hash tag (``rl:{alice}``), else ``rl:alice:{rl:alice}:10/1s``. The keys
    of a group share a cluster slot (TB.MCONSUME needs it) and start with
    the key given (so ACL key patterns such as ``~rl:*`` cover them)."""
    start = key.find("{")
    tagged = start >= 0 and key.find("}", start + 1) > start + 1
    return f"{key}:{limit.key_suffix}" if tagged else f"{key}:{{{key}}}:{limit.key_suffix}"


def group_specs(key: str, limits: str | Iterable[LimitSpec]) -> list[tuple[LimitSpec, BucketSpec]]:
    """One bucket per limit of ``limits`` (``"10/second;1000/day"``)."""
    parsed = parse_limits(limits) if isinstance(limits, str) else list(limits)
    if not parsed:
        raise ValueError("no limits given")
    return [(lim, BucketSpec(group_key(key, lim), lim.rate, lim.amount)) for lim in parsed]
