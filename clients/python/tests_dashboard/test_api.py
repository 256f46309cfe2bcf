"""The dashboard process without a browser: ``/metrics`` carries exactly
what the server reports, a read-only ACL user is enough, and ``--cluster``
reads every node and merges their top keys."""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import redis
from prometheus_client.parser import text_string_to_metric_families

from tb_limiter.dashboard.collect import command

from conftest import APP_RULES, DASHBOARD_EXTRA, Dashboard, Workload, setuser, workload_client

#: The dashboard on its own: read-only, no limiter command that writes.
READ_ONLY_RULES = "on >ro-secret resetkeys ~rl:* resetchannels -@all +info +tb.top +tb.info"


def metrics(d: Dashboard) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    status, body = d.get("/metrics")
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def sample(metric: str, **labels: str) -> Tuple[str, Tuple[Tuple[str, str], ...]]:
    """The key of a sample in :func:`metrics`' result."""
    return (metric, tuple(sorted(labels.items())))


def settle(d: Dashboard) -> Any:
    """Waits for two readings after the caller's last change, so the latest
    reading saw it."""
    polls = d.snapshot()["polls"]
    return d.wait_snapshot("two more readings", lambda s: s["polls"] >= polls + 2)


def acl_denials(admin: redis.Redis, user: str) -> list[Any]:
    """What the server refused ``user`` (``ACL LOG``)."""
    return [e for e in admin.acl_log() if e["username"] == user]


def test_metrics_carry_what_the_server_reports(server: Any, dashboard_factory: Any) -> None:
    admin = server.client()
    setuser(admin, "app", APP_RULES)
    setuser(admin, "dashboard", APP_RULES.replace(">app-secret", ">dash-secret") + " " + DASHBOARD_EXTRA)
    d = dashboard_factory("redis://dashboard:dash-secret@127.0.0.1:%d/0" % server.port, "--interval", "0.2")
    load = Workload(workload_client(server, "app", "app-secret")).start()
    d.wait_snapshot("the heavy key on top", lambda s: [k["key"] for k in s["top_denied"]["keys"][:1]] == ["rl:heavy:a"])
    load.stop()
    snap = settle(d)
    m = metrics(d)
    info = admin.info("tb")
    node = "127.0.0.1:%d" % server.port
    for name in ("calls", "allowed", "denied", "reservations", "peeks", "never_satisfiable", "tokens_granted"):
        assert m[sample("tb_%s_total" % name, node=node)] == info["tb_" + name], name
    assert m[sample("tb_node_up", node=node, role="server")] == 1.0
    assert m[sample("tb_blocked_now", node=node)] == info["tb_blocked_now"]
    assert m[sample("tb_setting", node=node, name="max_blocked")] == 1234
    assert m[sample("tb_setting", node=node, name="top_keys")] == 1
    # The wait histogram, in seconds as Prometheus has it.
    assert m[sample("tb_wait_seconds_count", node=node)] == info["tb_wait_ms_count"]
    assert m[sample("tb_wait_seconds_sum", node=node)] == info["tb_wait_ms_sum"] / 1000
    assert m[sample("tb_wait_seconds_bucket", node=node, le="1.0")] == info["tb_wait_ms_le_1000"]
    assert m[sample("tb_wait_seconds_bucket", node=node, le="+Inf")] == info["tb_wait_ms_le_inf"]
    # The top keys, as the page lists them.
    for k in snap["top_denied"]["keys"][:10]:
        assert m[sample("tb_top_denied", key=k["key"])] == k["count"]
    assert m[sample("tb_top_wait_ms", key="rl:slow")] == snap["top_waits"]["keys"][0]["count"]
    assert sample("tb_top_denied_error_bound") in m
    assert acl_denials(admin, "dashboard") == []


def test_a_read_only_user_is_enough(server: Any, dashboard_factory: Any) -> None:
    admin = server.client()
    setuser(admin, "ro", READ_ONLY_RULES)
    for _ in range(3):
        command(admin, "TB.CONSUME", "rl:x", "1/h", "1")
    d = dashboard_factory("redis://ro:ro-secret@127.0.0.1:%d/0" % server.port, "--interval", "0.2")
    s = d.wait_snapshot("rl:x listed", lambda s: bool(s["top_denied"]["keys"]))
    assert s["errors"] == []
    k = s["top_denied"]["keys"][0]
    assert k["key"] == "rl:x" and k["bucket"]["capacity"] == 1
    assert s["nodes"][0]["settings"]["max_blocked"] == "1234"
    assert acl_denials(admin, "ro") == []
    # Without +tb.top the page says so instead of failing.
    command(admin, "ACL", "SETUSER", "ro", "-tb.top")
    s = d.wait_snapshot("the TB.TOP error", lambda s: any("TB.TOP" in e for e in s["errors"]))
    assert s["top_denied"] is None and s["nodes"][0]["error"] is None
    assert acl_denials(admin, "ro") != [], "ACL LOG records refusals (so its emptiness above means something)"


def test_cluster_mode_reads_every_node_and_merges(dashboard_factory: Any) -> None:
    from tbcluster import Cluster  # the client suite's harness (tests/)

    cluster = Cluster()
    try:
        rc = redis.cluster.RedisCluster.from_url(cluster.url)
        # One key per master, denied 9, 6 and 3 times.
        keys: Dict[str, str] = {}
        tag = 0
        while len(keys) < 3:
            key = "rl:{%d}:user" % tag
            tag += 1
            node_of: Callable[[str], Any] = rc.get_node_from_key
            node = node_of(key).name
            if node not in keys.values():
                keys[key] = node
        expected = []
        for (key, node), denials in zip(keys.items(), (9, 6, 3)):
            for _ in range(denials + 1):
                command(rc, "TB.CONSUME", key, "1/h", "1")
            expected.append((key, node))
        # The read-only user, plus what redis-py's cluster client sends to
        # learn the topology and the key positions (docs/dashboard.md says so).
        for n in cluster.nodes:
            setuser(n.client(), "ro", READ_ONLY_RULES + " +cluster|slots +command")
        url = cluster.url.replace("redis://", "redis://ro:ro-secret@")
        d = dashboard_factory(url, "--cluster", "--interval", "0.2")
        s = d.wait_snapshot("three keys", lambda s: len(s["top_denied"]["keys"]) == 3)
        assert [(k["key"], k["node"]) for k in s["top_denied"]["keys"]] == expected
        assert all(k["bucket"]["capacity"] == 1 for k in s["top_denied"]["keys"]), "TB.INFO routed to each key's node"
        # Every master; the replicas redis-py knows (CLUSTER SLOTS lists a
        # replica once the gossip shows it has replicated something).
        roles = [n["role"] for n in s["nodes"]]
        assert roles.count("master") == 3 and set(roles) <= {"master", "replica"}, roles
        assert all(n["error"] is None and n["settings"]["top_keys"] == "1" for n in s["nodes"])
        assert s["errors"] == []
        m = metrics(d)
        assert sum(v for (name, _), v in m.items() if name == "tb_node_up") == len(roles)
        assert sum(v for (name, _), v in m.items() if name == "tb_denied_total") == 18
        for n in cluster.nodes:
            assert acl_denials(n.client(), "ro") == [], n.port
        rc.close()
    finally:
        cluster.stop()
