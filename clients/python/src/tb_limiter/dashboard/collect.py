"""Reading the limiter's figures from Redis: ``INFO tb``, ``TB.TOP`` and
``TB.INFO``, from one server or every node of a cluster, and what the
dashboard derives from them (rates, wait percentiles, merged top keys).

Only read-only commands are sent: ``INFO tb``, ``TB.TOP``, ``TB.INFO`` (and,
for a cluster, what redis-py needs to learn the topology). The functions
here take redis-py clients; nothing in this file serves HTTP.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import redis
from redis.cluster import RedisCluster

#: A plain client or a cluster client.
AnyClient = Union[redis.Redis, RedisCluster]

#: Counters of ``INFO tb`` (without the ``tb_`` prefix), in display order.
COUNTERS = (
    "calls",
    "allowed",
    "denied",
    "reservations",
    "peeks",
    "never_satisfiable",
    "tokens_granted",
    "partial_grants",
    "blocked_total",
    "refunds",
)
#: Gauges of ``INFO tb``.
GAUGES = ("blocked_now", "waiting_calls", "waiting_flows", "eviction_policy_can_evict_buckets")
#: The module's settings as ``INFO tb`` shows them (``tb.max-wait-ms`` is
#: ``tb_max_wait_ms``).
SETTINGS = ("expire_idle", "max_wait_ms", "max_blocked", "top_keys")

_WAIT_BUCKET = re.compile(r"^wait_ms_le_(\d+|inf)$")


@dataclass
class TopKey:
    """One key of a ``TB.TOP`` list."""

    key: bytes
    #: Decayed count (denials, or ms of wait): never below the true value.
    count: float
    #: At most this much of ``count`` may belong to other keys.
    error: float
    #: The node that reported it (``host:port``).
    node: str = ""

    @property
    def at_least(self) -> float:
        """The guaranteed lower bound, ``count - error``."""
        return max(0.0, self.count - self.error)


@dataclass
class TopList:
    """One ``TB.TOP`` reply (or several nodes' replies merged)."""

    metric: str
    enabled: bool
    tau_ms: int
    capacity: int
    memory_bytes: int
    total: float
    error_bound: float
    keys: List[TopKey]


def command(client: AnyClient, *args: Any) -> Any:
    """``client.execute_command(*args)`` (untyped in redis-py)."""
    run: Callable[..., Any] = client.execute_command
    return run(*args)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


#: Bytes of a key name TB.TOP keeps: longer names are counted under their
#: first KEY_MAX bytes (src/topkeys.rs).
KEY_MAX = 256


def key_text(key: bytes) -> str:
    """A key name as text, one text per name (the page and ``/metrics``
    show this): valid UTF-8 stays as it is, except that a backslash is
    written ``\\\\``, a byte that is not UTF-8 or an ASCII control
    character (NUL included) ``\\xNN``, and a C1 control character
    ``\\u00NN``; a name of ``KEY_MAX`` bytes, which TB.TOP may have cut
    (it counts every name that starts so), ends in ``…``. No two names give
    the same text, and the text holds no control character."""
    cut = "\u2026" if len(key) >= KEY_MAX else ""
    out = []
    for ch in key[:KEY_MAX].decode("utf-8", "surrogateescape"):
        o = ord(ch)
        if ch == "\\":
            out.append("\\\\")
        elif 0xDC80 <= o <= 0xDCFF:  # a byte that is not UTF-8
            out.append("\\x%02x" % (o - 0xDC00))
        elif o < 0x20 or o == 0x7F:
            out.append("\\x%02x" % o)
        elif 0x80 <= o < 0xA0:
            out.append("\\u%04x" % o)
        else:
            out.append(ch)
    return "".join(out) + cut


def parse_top(reply: Sequence[Any], node: str = "") -> TopList:
    """Turns a ``TB.TOP`` reply (a flat field/value array) into a TopList."""
    fields: Dict[str, Any] = {_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    keys = [
        TopKey(
            key=k[0] if isinstance(k[0], bytes) else str(k[0]).encode(),
            count=float(_text(k[1])),
            error=float(_text(k[2])),
            node=node,
        )
        for k in fields["keys"]
    ]
    return TopList(
        metric=_text(fields["metric"]),
        enabled=int(fields["enabled"]) == 1,
        tau_ms=int(fields["tau_ms"]),
        capacity=int(fields["capacity"]),
        memory_bytes=int(fields["memory_bytes"]),
        total=float(_text(fields["total"])),
        error_bound=float(_text(fields["error_bound"])),
        keys=keys,
    )


def read_top(client: redis.Redis, metric: str = "denied", count: int = 10, node: str = "") -> TopList:
    """``TB.TOP metric COUNT count`` on one server (``metric``: ``denied`` or
    ``waits``)."""
    reply = command(client, "TB.TOP", metric.upper(), "COUNT", count)
    return parse_top(reply, node)


def merge_tops(lists: Sequence[TopList], count: int) -> Optional[TopList]:
    """Merges the lists of several nodes into the ``count`` heaviest keys.

    In a cluster each key belongs to one slot, so to one master: its count
    comes from that node and that node's bound applies to it. A key listed by
    several nodes (during a slot migration) has its counts summed. The merged
    ``error_bound`` is the largest of the nodes' bounds; ``total`` and
    ``memory_bytes`` add up.
    """
    if not lists:
        return None
    by_key: Dict[bytes, TopKey] = {}
    for lst in lists:
        for k in lst.keys:
            seen = by_key.get(k.key)
            if seen is None:
                by_key[k.key] = TopKey(k.key, k.count, k.error, k.node)
            else:
                seen.count += k.count
                seen.error += k.error
                seen.node = seen.node + "," + k.node
    keys = sorted(by_key.values(), key=lambda k: (-k.count, k.key))[:count]
    first = lists[0]
    return TopList(
        metric=first.metric,
        enabled=all(lst.enabled for lst in lists),
        tau_ms=first.tau_ms,
        capacity=first.capacity,
        memory_bytes=sum(lst.memory_bytes for lst in lists),
        total=sum(lst.total for lst in lists),
        error_bound=max(lst.error_bound for lst in lists),
        keys=keys,
    )


@dataclass
class NodeInfo:
    """What ``INFO tb`` says about one node, plus its role."""

    address: str
    role: str = "?"
    counters: Dict[str, int] = field(default_factory=dict)
    gauges: Dict[str, int] = field(default_factory=dict)
    settings: Dict[str, str] = field(default_factory=dict)
    #: Cumulative wait histogram: (upper bound in ms, or inf; count).
    wait_buckets: List[Tuple[float, int]] = field(default_factory=list)
    wait_sum_ms: Optional[int] = None
    #: Other ``tb_*`` fields this dashboard does not know.
    other: Dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None


def parse_info_tb(info: Mapping[str, Any], address: str = "", role: str = "?") -> NodeInfo:
    """Sorts the fields of ``INFO tb`` (as redis-py parses them) into
    counters, gauges, settings and the wait histogram."""
    n = NodeInfo(address=address, role=role)
    for name, value in info.items():
        if not name.startswith("tb_"):
            continue
        short = name[3:]
        m = _WAIT_BUCKET.match(short)
        if m:
            bound = math.inf if m.group(1) == "inf" else float(m.group(1))
            n.wait_buckets.append((bound, int(value)))
        elif short == "wait_ms_sum":
            n.wait_sum_ms = int(value)
        elif short == "wait_ms_count":
            pass  # equals the +Inf bucket
        elif short in COUNTERS:
            n.counters[short] = int(value)
        elif short in GAUGES:
            n.gauges[short] = int(value)
        elif short in SETTINGS:
            n.settings[short] = _text(value)
        else:
            n.other[short] = _text(value)
    n.wait_buckets.sort()
    return n


def read_node(client: redis.Redis, address: str, role: str = "?") -> NodeInfo:
    """``INFO tb`` of one server; errors are kept in the result, not raised."""
    try:
        return parse_info_tb(client.info("tb"), address, role)
    except redis.RedisError as e:
        return NodeInfo(address=address, role=role, error=str(e))


def quantile(buckets: Sequence[Tuple[float, int]], q: float) -> Optional[float]:
    """The ``q`` quantile (0..1) of a cumulative histogram, interpolating
    linearly inside the bucket it falls in, as Prometheus'
    ``histogram_quantile`` does. None when the histogram is empty. A
    quantile in the ``+Inf`` bucket is reported as the largest finite bound."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_bound, prev_count = 0.0, 0
    for bound, count in buckets:
        if count >= rank and count > prev_count:
            if math.isinf(bound):
                return prev_bound
            if bound == prev_bound:
                return bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / (count - prev_count)
        prev_bound, prev_count = (bound if not math.isinf(bound) else prev_bound), count
    return prev_bound


def histogram_delta(
    new: Sequence[Tuple[float, int]], old: Sequence[Tuple[float, int]]
) -> List[Tuple[float, int]]:
    """The waits recorded between two readings of the same buckets (a
    counter reset, as after ``TB.CONFIG RESETSTAT``, gives the new reading)."""
    if len(new) != len(old) or any(a[0] != b[0] for a, b in zip(new, old)):
        return list(new)
    delta = [(b, c - o) for (b, c), (_, o) in zip(new, old)]
    if any(d < 0 for _, d in delta):
        return list(new)
    return delta


def add_histograms(hs: Iterable[Sequence[Tuple[float, int]]]) -> List[Tuple[float, int]]:
    """Sums cumulative histograms with the same bounds (nodes of a cluster)."""
    out: Dict[float, int] = {}
    for h in hs:
        for b, c in h:
            out[b] = out.get(b, 0) + c
    return sorted(out.items())


def without_zero_waits(buckets: Sequence[Tuple[float, int]]) -> List[Tuple[float, int]]:
    """The histogram of the waits above 0 ms only (reservations), from the
    histogram of every granted request (the ``le_0`` bucket holds the ones
    served at once)."""
    zero = next((c for b, c in buckets if b == 0), 0)
    return [(b, c - zero) for b, c in buckets if b > 0]


@dataclass
class Cluster:
    """The nodes of a source: one server, or every node of a cluster."""

    nodes: List[Tuple[str, str, redis.Redis]]
    """(address, role, client) for each node."""


def discover(client: AnyClient) -> Cluster:
    """Every node to read: the server itself, or each node of a cluster
    (masters first) with its own client."""
    if isinstance(client, RedisCluster):
        nodes: List[Tuple[str, str, redis.Redis]] = []
        primaries: Callable[[], List[Any]] = client.get_primaries
        replicas: Callable[[], List[Any]] = client.get_replicas
        for role, group in (("master", primaries()), ("replica", replicas())):
            for n in sorted(group, key=lambda n: n.name):
                conn = client.get_redis_connection(n)
                nodes.append((n.name, role, conn))
        return Cluster(nodes)
    kw = client.connection_pool.connection_kwargs
    address = "%s:%s" % (kw.get("host", "?"), kw.get("port", "?"))
    if "path" in kw:
        address = str(kw["path"])
    return Cluster([(address, "server", client)])


def bucket_info(client: AnyClient, key: bytes) -> Optional[Dict[str, Any]]:
    """``TB.INFO key`` as a dict (``tokens``, ``capacity``, ``rate`` as
    numbers, ``fill`` = tokens / capacity clamped to 0..1, ``waiting``: the
    calls queued on it, ``flows``: ``{"name", "weight", "waiting"}`` per
    flow, in the order they are served next), None for a missing key (a
    full bucket), or ``{"error": ...}`` when it cannot be read (e.g. no
    permission on that key)."""
    try:
        reply = command(client, "TB.INFO", key)
    except redis.RedisError as e:
        return {"error": str(e)}
    if reply is None:
        return None
    d = {_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}
    tokens = float(_text(d["tokens"]))
    capacity = int(d["capacity"])
    return {
        "tokens": tokens,
        "capacity": capacity,
        "rate": float(_text(d["rate"])),
        "fill": 0.0 if capacity == 0 else min(1.0, max(0.0, tokens / capacity)),
        "reset_after_ms": int(d["reset_after_ms"]),
        "waiting": int(d.get("waiting", 0)),
        "flows": _flows(d.get("waiting_flows")),
    }


def _shown(v: Any) -> str:
    """A name for display: bytes that are not UTF-8 are replaced."""
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def _flows(value: Any) -> List[Dict[str, Any]]:
    """TB.INFO's ``waiting_flows`` (``[name, weight, waiting, ...]``) as
    one dict per flow; the default flow (calls that named none) is ``""``."""
    if not isinstance(value, (list, tuple)):
        return []
    return [
        {"name": _shown(value[i]), "weight": int(value[i + 1]), "waiting": int(value[i + 2])}
        for i in range(0, len(value) - 2, 3)
    ]


def now() -> float:
    """Wall-clock seconds (a function, so tests can see where time is read)."""
    return time.time()
