"""``/metrics``: the dashboard's latest reading in the Prometheus text
format, through ``prometheus_client``'s custom-collector API (so the figures
are exactly the ones the page shows, read at the last poll)."""

from __future__ import annotations

import math
from typing import Iterator, Optional

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from .collect import COUNTERS, TopList, key_text
from .sampler import Sampler

#: Help text of each ``INFO tb`` counter.
COUNTER_HELP = {
    "calls": "Consume requests answered",
    "allowed": "Requests granted, now or reserved",
    "denied": "Requests denied, including never-satisfiable ones",
    "reservations": "Requests granted into debt (RESERVE, BLOCK)",
    "peeks": "Requests with n = 0",
    "never_satisfiable": "Requests that can never succeed",
    "tokens_granted": "Tokens granted",
    "partial_grants": "ATMOST requests granted fewer tokens than asked",
    "blocked_total": "Clients ever blocked by BLOCK",
    "refunds": "TB.REFUND calls that gave tokens back",
}


class TbCollector(Collector):
    """Yields the sampler's latest reading as metrics, labelled by node."""

    def __init__(self, sampler: Sampler, top_keys: int) -> None:
        self.sampler = sampler
        self.top_keys = top_keys

    def collect(self) -> Iterator[Metric]:
        s = self.sampler.latest()
        up = GaugeMetricFamily("tb_node_up", "1 when INFO tb could be read from the node at the last poll", labels=["node", "role"])
        if s is None:
            yield up
            return
        for n in s.nodes:
            up.add_metric([n.address, n.role], 0.0 if n.error else 1.0)
        yield up
        for name in COUNTERS:
            fam = CounterMetricFamily("tb_" + name, COUNTER_HELP.get(name, name), labels=["node"])
            for n in s.nodes:
                if name in n.counters:
                    fam.add_metric([n.address], float(n.counters[name]))
            yield fam
        blocked = GaugeMetricFamily("tb_blocked_now", "Clients waiting in BLOCK now", labels=["node"])
        queued = GaugeMetricFamily(
            "tb_waiting_calls", "Calls waiting in the buckets' queues now (FLOW, LEASE, TB.MCONSUME BLOCK)",
            labels=["node"],
        )
        flows = GaugeMetricFamily("tb_waiting_flows", "Flows with a call waiting, summed over buckets", labels=["node"])
        evict = GaugeMetricFamily(
            "tb_eviction_policy_can_evict_buckets",
            "1 when maxmemory-policy can evict buckets (which hands out tokens)",
            labels=["node"],
        )
        setting = GaugeMetricFamily(
            "tb_setting", "The module's numeric settings (yes/no as 1/0)", labels=["node", "name"]
        )
        for n in s.nodes:
            if "blocked_now" in n.gauges:
                blocked.add_metric([n.address], float(n.gauges["blocked_now"]))
            if "waiting_calls" in n.gauges:
                queued.add_metric([n.address], float(n.gauges["waiting_calls"]))
            if "waiting_flows" in n.gauges:
                flows.add_metric([n.address], float(n.gauges["waiting_flows"]))
            if "eviction_policy_can_evict_buckets" in n.gauges:
                evict.add_metric([n.address], float(n.gauges["eviction_policy_can_evict_buckets"]))
            for k, v in n.settings.items():
                num = _number(v)
                if num is not None:
                    setting.add_metric([n.address, k], num)
        yield blocked
        yield queued
        yield flows
        yield evict
        yield setting
        waits = HistogramMetricFamily(
            "tb_wait_seconds",
            "How long granted requests were told to wait (0 when served at once)",
            labels=["node"],
        )
        for n in s.nodes:
            if n.wait_buckets and n.wait_sum_ms is not None:
                buckets = [("+Inf" if math.isinf(b) else _le(b / 1000.0), float(c)) for b, c in n.wait_buckets]
                waits.add_metric([n.address], buckets, n.wait_sum_ms / 1000.0)
        yield waits
        yield from self._top("denied", s.top_denied, "Decayed denials per key (about the last minute's), from TB.TOP")
        yield from self._top("wait_ms", s.top_waits, "Decayed ms of reservation wait per key, from TB.TOP WAITS")

    def _top(self, name: str, lst: Optional[TopList], help_text: str) -> Iterator[Metric]:
        fam = GaugeMetricFamily("tb_top_" + name, help_text + " (top %d)" % self.top_keys, labels=["key"])
        bound = GaugeMetricFamily(
            "tb_top_%s_error_bound" % name, "Every tb_top_%s is at most this much too high" % name
        )
        if lst is not None:
            for k in lst.keys[: self.top_keys]:
                fam.add_metric([key_text(k.key)], k.count)
            bound.add_metric([], lst.error_bound)
        yield fam
        yield bound


def _le(x: float) -> str:
    """A bucket bound as Prometheus writes it (``0.001``, ``1.0``)."""
    return repr(float(x))


def _number(v: str) -> Optional[float]:
    if v.lower() in ("yes", "no"):
        return 1.0 if v.lower() == "yes" else 0.0
    try:
        return float(v)
    except ValueError:
        return None


def registry(sampler: Sampler, top_keys: int) -> CollectorRegistry:
    """A registry holding only the tb collector."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(TbCollector(sampler, top_keys))
    return reg
