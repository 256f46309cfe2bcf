"""The dashboard's reader: polls every node at a fixed interval, keeps a
bounded history, and derives the series the page draws (rates, wait
percentiles) and the top keys with their fill level."""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Deque, Dict, List, Optional

import redis

from . import collect
from .collect import AnyClient, NodeInfo, TopList


@dataclass
class Sample:
    """One reading of every node."""

    t: float
    nodes: List[NodeInfo]
    top_denied: Optional[TopList]
    top_waits: Optional[TopList]
    #: ``TB.INFO`` of each listed key (None: no key, a full bucket).
    infos: Dict[bytes, Optional[Dict[str, Any]]]
    errors: List[str]

    def totals(self, name: str) -> Optional[int]:
        """A counter summed over the nodes that answered."""
        vals = [n.counters[name] for n in self.nodes if name in n.counters]
        return sum(vals) if vals else None

    def gauge(self, name: str) -> Optional[int]:
        vals = [n.gauges[name] for n in self.nodes if name in n.gauges]
        return sum(vals) if vals else None

    def waits(self) -> List[Any]:
        """The wait histogram summed over nodes (empty if not reported)."""
        return collect.add_histograms(n.wait_buckets for n in self.nodes if n.wait_buckets)


def _num(x: Optional[float]) -> Optional[float]:
    return None if x is None or math.isnan(x) else round(x, 3)


class Sampler:
    """Reads a source every ``interval`` seconds; thread-safe snapshots."""

    #: Series the page draws, one value per sample.
    SERIES = (
        "allowed",
        "denied",
        "reservations",
        "blocked_now",
        "wait_p50_ms",
        "wait_p90_ms",
        "wait_p99_ms",
    )

    def __init__(
        self,
        client: AnyClient,
        *,
        source: str,
        interval: float = 1.0,
        top: int = 10,
        history_s: float = 600.0,
        window_s: float = 60.0,
    ) -> None:
        self.client = client
        self.source = source
        self.interval = interval
        self.top = top
        self.window_s = window_s
        self._samples: Deque[Sample] = deque(maxlen=max(2, int(history_s / interval) + 1))
        self._series: Deque[Dict[str, Optional[float]]] = deque(maxlen=self._samples.maxlen)
        self._lock = threading.Lock()
        self._snapshot: Dict[str, Any] = {"ready": False}
        self.polls = 0

    # -- reading ----------------------------------------------------------

    def read(self) -> Sample:
        """Reads every node once (never raises for a node's error: the
        sample carries it)."""
        errors: List[str] = []
        t = collect.now()
        try:
            nodes = collect.discover(self.client).nodes
        except redis.RedisError as e:
            return Sample(t, [], None, None, {}, ["cannot reach %s: %s" % (self.source, e)])
        infos = [collect.read_node(c, addr, role) for addr, role, c in nodes]
        errors += ["%s: %s" % (n.address, n.error) for n in infos if n.error]
        tops: Dict[str, List[TopList]] = {"denied": [], "waits": []}
        for addr, role, c in nodes:
            if role == "replica":
                continue  # replicas serve no TB.CONSUME: their lists are empty
            for metric in tops:
                try:
                    tops[metric].append(collect.read_top(c, metric, self.top, addr))
                except redis.RedisError as e:
                    errors.append("%s: TB.TOP %s: %s" % (addr, metric.upper(), e))
        denied = collect.merge_tops(tops["denied"], self.top)
        waits = collect.merge_tops(tops["waits"], self.top)
        fills: Dict[bytes, Optional[Dict[str, Any]]] = {}
        for lst in (denied, waits):
            for k in lst.keys if lst else []:
                if k.key not in fills:
                    fills[k.key] = collect.bucket_info(self.client, k.key)
        return Sample(t, infos, denied, waits, fills, errors)

    def poll(self) -> Sample:
        """Reads once, records the sample and rebuilds the snapshot."""
        return self.record(self.read())

    def record(self, s: Sample) -> Sample:
        """Adds a reading to the history and rebuilds the snapshot."""
        with self._lock:
            prev = self._samples[-1] if self._samples else None
            self._samples.append(s)
            self._series.append(self._derive(prev, s))
            self._snapshot = self._build(s)
            self.polls += 1
        return s

    def poll_safely(self) -> None:
        """:meth:`poll`, keeping any failure in the snapshot (``fatal``)
        instead of raising: the page keeps being served and says why."""
        try:
            self.poll()
        except Exception as e:
            with self._lock:
                self._snapshot = dict(self._snapshot, fatal=repr(e))

    def run(self, stop: threading.Event) -> None:
        """Polls every ``interval`` seconds until ``stop`` is set."""
        while not stop.wait(self.interval):
            self.poll_safely()

    # -- deriving ---------------------------------------------------------

    def _window_start(self, s: Sample) -> Optional[Sample]:
        """The oldest sample within the percentile window before ``s``."""
        start = None
        for old in self._samples:
            if old is s:
                break
            if s.t - old.t <= self.window_s + self.interval / 2:
                start = old
                break
        return start

    def _derive(self, prev: Optional[Sample], s: Sample) -> Dict[str, Optional[float]]:
        out: Dict[str, Optional[float]] = {"t": s.t}
        for name in ("allowed", "denied", "reservations"):
            out[name] = None
            if prev is not None and s.t > prev.t:
                a, b = prev.totals(name), s.totals(name)
                if a is not None and b is not None:
                    # A counter that went back was reset: count from zero.
                    out[name] = ((b - a) if b >= a else b) / (s.t - prev.t)
        g = s.gauge("blocked_now")
        out["blocked_now"] = None if g is None else float(g)
        p = self._percentiles(s)
        for q in ("p50", "p90", "p99"):
            out["wait_%s_ms" % q] = p["all"][q]
        return out

    def _percentiles(self, s: Sample) -> Dict[str, Dict[str, Optional[float]]]:
        """Wait percentiles over the last ``window_s``: of every granted
        request, and of the reservations only (waits above 0)."""
        empty: Dict[str, Optional[float]] = {"p50": None, "p90": None, "p99": None, "count": None}
        out = {"all": dict(empty), "reserved": dict(empty)}
        cur = s.waits()
        start = self._window_start(s)
        if not cur or start is None:
            return out  # no histogram, or no earlier reading yet
        window = collect.histogram_delta(cur, start.waits())
        for name, h in (("all", window), ("reserved", collect.without_zero_waits(window))):
            out[name]["count"] = float(h[-1][1]) if h else 0.0
            for q, v in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
                out[name][q] = collect.quantile(h, v)
        return out

    def _build(self, s: Sample) -> Dict[str, Any]:
        series: Dict[str, List[Optional[float]]] = {"t": []}
        for name in self.SERIES:
            series[name] = []
        for row in self._series:
            series["t"].append(row["t"])
            for name in self.SERIES:
                series[name].append(_num(row.get(name)))
        has_histogram = bool(s.waits())
        p = self._percentiles(s)
        return {
            "ready": True,
            "source": self.source,
            "time": s.t,
            "interval_s": self.interval,
            "window_s": self.window_s,
            "polls": self.polls + 1,
            "series": series,
            "waits": {
                "reported": has_histogram,
                "all": {k: _num(v) for k, v in p["all"].items()},
                "reserved": {k: _num(v) for k, v in p["reserved"].items()},
            },
            "top_denied": self._top_json(s.top_denied, s),
            "top_waits": self._top_json(s.top_waits, s),
            "nodes": [
                {
                    "address": n.address,
                    "role": n.role,
                    "error": n.error,
                    "settings": n.settings,
                    "gauges": n.gauges,
                    "counters": n.counters,
                    "other": n.other,
                }
                for n in s.nodes
            ],
            "errors": s.errors,
        }

    @staticmethod
    def _top_json(lst: Optional[TopList], s: Sample) -> Optional[Dict[str, Any]]:
        if lst is None:
            return None
        return {
            "metric": lst.metric,
            "enabled": lst.enabled,
            "tau_s": lst.tau_ms / 1000,
            "capacity": lst.capacity,
            "memory_bytes": lst.memory_bytes,
            "total": lst.total,
            "error_bound": lst.error_bound,
            "keys": [
                {
                    "key": collect.key_text(k.key),
                    "count": k.count,
                    "error": k.error,
                    "at_least": k.at_least,
                    "node": k.node,
                    "bucket": s.infos.get(k.key),
                }
                for k in lst.keys
            ],
        }

    # -- reading the results ----------------------------------------------

    def snapshot(self) -> Dict[str, Any]:
        """The latest snapshot, as JSON-able data."""
        with self._lock:
            return self._snapshot

    def latest(self) -> Optional[Sample]:
        """The latest sample, if any."""
        with self._lock:
            return self._samples[-1] if self._samples else None
