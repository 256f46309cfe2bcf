"""The reading functions: TB.TOP parsing and merging, INFO tb parsing, the
histogram arithmetic behind the wait percentiles, and the URL shown on the
page."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import pytest
import redis

from tb_limiter.dashboard import bucket_info, merge_tops, parse_info_tb, parse_top, quantile, read_top
from tb_limiter.dashboard.__main__ import redact
from tb_limiter.dashboard.collect import NodeInfo, TopKey, TopList, histogram_delta, key_text, without_zero_waits
from tb_limiter.dashboard.sampler import Sample, Sampler

INF = math.inf


def top(keys: list[tuple[bytes, float, float, str]], bound: float, total: float = 100.0) -> TopList:
    return TopList("denied", True, 60000, 256, 1000, total, bound, [TopKey(k, c, e, n) for k, c, e, n in keys])


def test_parse_top_reads_every_field() -> None:
    reply = [
        b"metric", b"denied", b"enabled", 1, b"tau_ms", 60000, b"capacity", 256, b"memory_bytes", 154176,
        b"total", b"12.500", b"error_bound", b"0.250",
        b"keys", [[b"rl:a", b"10.000", b"0.000"], [b"rl:\xff", b"2.500", b"0.250"]],
    ]
    t = parse_top(reply, node="n1")
    assert (t.metric, t.enabled, t.tau_ms, t.capacity, t.memory_bytes) == ("denied", True, 60000, 256, 154176)
    assert (t.total, t.error_bound) == (12.5, 0.25)
    assert t.keys == [TopKey(b"rl:a", 10.0, 0.0, "n1"), TopKey(b"rl:\xff", 2.5, 0.25, "n1")]
    assert t.keys[1].at_least == 2.25


def test_merge_keeps_each_nodes_keys_and_sums_a_migrating_one() -> None:
    a = top([(b"x", 50, 0, "a"), (b"moving", 5, 1, "a")], bound=1.0)
    b = top([(b"y", 30, 2, "b"), (b"moving", 4, 0, "b"), (b"z", 3, 3, "b")], bound=3.0)
    m = merge_tops([a, b], count=3)
    assert m is not None
    assert [(k.key, k.count, k.error, k.node) for k in m.keys] == [
        (b"x", 50, 0, "a"),
        (b"y", 30, 2, "b"),
        (b"moving", 9, 1, "a,b"),
    ]
    assert (m.error_bound, m.total, m.memory_bytes) == (3.0, 200.0, 2000)
    assert merge_tops([], 3) is None


def test_parse_info_tb_sorts_fields() -> None:
    info = {
        "tb_calls": 10, "tb_allowed": 7, "tb_denied": 3, "tb_blocked_now": 1,
        "tb_eviction_policy_can_evict_buckets": 0, "tb_max_wait_ms": 60000, "tb_expire_idle": 1,
        "tb_wait_ms_le_1": 6, "tb_wait_ms_le_0": 5, "tb_wait_ms_le_inf": 7, "tb_wait_ms_sum": 900,
        "tb_wait_ms_count": 7, "tb_something_new": "x", "used_memory": 5,
    }
    n = parse_info_tb(info, "h:1", "master")
    assert n.counters == {"calls": 10, "allowed": 7, "denied": 3}
    assert n.gauges == {"blocked_now": 1, "eviction_policy_can_evict_buckets": 0}
    assert n.settings == {"max_wait_ms": "60000", "expire_idle": "1"}
    assert n.wait_buckets == [(0.0, 5), (1.0, 6), (INF, 7)]
    assert n.wait_sum_ms == 900
    assert n.other == {"something_new": "x"}


def test_quantile_interpolates_like_prometheus() -> None:
    h = [(0.0, 50), (10.0, 50), (100.0, 90), (1000.0, 100), (INF, 100)]
    assert quantile(h, 0.5) == 0.0
    assert quantile(h, 0.7) == pytest.approx(10 + 90 * (70 - 50) / 40)
    assert quantile(h, 0.9) == pytest.approx(100.0)
    assert quantile(h, 0.99) == pytest.approx(100 + 900 * 9 / 10)
    assert quantile([(10.0, 0), (INF, 0)], 0.5) is None
    assert quantile([], 0.5) is None
    assert quantile([(10.0, 1), (INF, 4)], 0.9) == 10.0, "past the last bound: the last bound"


def test_histogram_window_and_reservations_only() -> None:
    old = [(0.0, 5), (10.0, 6), (INF, 8)]
    new = [(0.0, 9), (10.0, 12), (INF, 20)]
    d = histogram_delta(new, old)
    assert d == [(0.0, 4), (10.0, 6), (INF, 12)]
    assert without_zero_waits(d) == [(10.0, 2), (INF, 8)]
    assert histogram_delta(old, new) == old, "a reset counts from zero"
    assert histogram_delta(new, [(1.0, 1)]) == new, "other bounds: no delta"


@pytest.mark.parametrize(
    "url,shown",
    [
        ("redis://u:secret@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://:secret@h/0", "redis://:***@h/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("redis://h:6379/0?password=secret&db=1", "redis://h:6379/0?password=***&db=1"),
        ("redis://h/0?username=u&password=s%40cret", "redis://h/0?username=u&password=***"),
        ("rediss://u:secret@h/0?ssl_password=secret", "rediss://u:***@h/0?ssl_password=***"),
        ("unix:///run/r.sock?password=secret", "unix:///run/r.sock?password=***"),
        # An unescaped '#' ends the URL early: no piece of the password shows.
        ("redis://u:sec#ret@h/0", "redis://***"),
    ],
)
def test_redact_hides_the_password(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_read_top_and_bucket_info_on_a_server(server: Any) -> None:
    c = server.client()
    for _ in range(4):
        c.execute_command("TB.CONSUME", "rl:k", "1/h", "1")
    t = read_top(c, "denied", count=5)
    assert [k.key for k in t.keys] == [b"rl:k"]
    assert 2.9 < t.keys[0].count <= 3.0 and t.keys[0].error == 0.0
    assert read_top(c, "waits").keys == []
    info = bucket_info(c, b"rl:k")
    assert info is not None and info["capacity"] == 1 and 0 <= info["fill"] < 0.01
    assert bucket_info(c, b"rl:missing") is None


def reading(t: float, allowed: int, denied: int, waits: list[tuple[float, int]]) -> Sample:
    node = NodeInfo("h:1", "server", counters={"allowed": allowed, "denied": denied, "reservations": 0},
                    gauges={"blocked_now": 0}, wait_buckets=waits)
    return Sample(t, [node], None, None, {}, [])


def test_sampler_rates_and_windowed_percentiles() -> None:
    s = Sampler(redis.Redis(), source="test", interval=1.0, window_s=2.0)
    s.record(reading(100.0, 10, 0, [(0.0, 10), (100.0, 10), (INF, 10)]))
    snap = s.snapshot()
    assert snap["series"]["allowed"] == [None], "one reading: no rate yet"
    assert snap["waits"]["all"]["p99"] is None, "one reading: no window yet"
    s.record(reading(101.0, 30, 5, [(0.0, 20), (100.0, 30), (INF, 30)]))
    s.record(reading(102.0, 40, 6, [(0.0, 20), (100.0, 40), (INF, 40)]))
    snap = s.snapshot()
    assert snap["series"]["allowed"] == [None, 20.0, 10.0]
    assert snap["series"]["denied"] == [None, 5.0, 1.0]
    # The window is the last 2 s: from the first reading, 30 grants, 10 of
    # them at once and 20 waiting up to 100 ms.
    w = snap["waits"]
    assert w["all"]["count"] == 30 and w["reserved"]["count"] == 20
    assert w["all"]["p50"] == pytest.approx(100 * (15 - 10) / 20)
    assert w["reserved"]["p50"] == pytest.approx(50.0)
    # A counter that goes back (TB.CONFIG RESETSTAT) counts from zero.
    s.record(reading(103.0, 4, 1, [(0.0, 0), (100.0, 0), (INF, 0)]))
    assert s.snapshot()["series"]["allowed"][-1] == 4.0


def test_key_text_is_one_to_one_and_marks_names_tb_top_may_have_cut() -> None:
    long = b"rl:" + b"x" * 253  # KEY_MAX bytes: TB.TOP's entry for every name starting so
    names = [b"rl:\xff", b"rl:\\xff", b"rl:\x00", b"rl:\\x00", b"rl:\xc2\x80", b"rl:\\u0080", b"a\\\\b", b"a\\b",
             "rl:caf\u00e9".encode(), long, long[:-1], long[:-1] + "\u2026".encode()[:1], b"rl:\n\"q"]
    texts = [key_text(n) for n in names]
    assert len(set(texts)) == len(names), texts
    assert key_text(b"rl:\xff") == "rl:\\xff" and key_text(b"rl:\\xff") == "rl:\\\\xff"
    assert key_text("rl:caf\u00e9".encode()) == "rl:caf\u00e9"
    assert key_text(long) == long.decode() + "\u2026" and key_text(long[:-1]) == long[:-1].decode()
    assert all(ch >= " " and ch != "\x7f" for t in texts for ch in t)


def test_bucket_info_shows_the_flows_that_wait(server: Any) -> None:
    """Calls waiting in flows on a bucket: ``waiting`` and each flow's name,
    weight and calls, in the order TB.INFO gives them."""
    c = server.client()
    c.execute_command("TB.CONSUME", "rl:flows", "1/h", "1")
    waiters = [server.client() for _ in range(3)]
    threads = [
        threading.Thread(
            target=lambda r=r, f=f, w=w: r.execute_command("TB.CONSUME", "rl:flows", "1/h", "1", "BLOCK", "3000",
                                                           "FLOW", f, "WEIGHT", w)
        )
        for r, f, w in zip(waiters, ["a", "a", "b"], ["1", "1", "3"])
    ]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    info = bucket_info(c, b"rl:flows")
    while info is None or info.get("waiting") != 3:
        assert time.monotonic() < deadline, info
        time.sleep(0.01)
        info = bucket_info(c, b"rl:flows")
    assert sorted((f["name"], f["weight"], f["waiting"]) for f in info["flows"]) == [("a", 1, 2), ("b", 3, 1)]
    for t in threads:
        t.join(10)
    after = bucket_info(c, b"rl:flows")
    assert after is not None and after["waiting"] == 0 and after["flows"] == []
