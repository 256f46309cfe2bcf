"""The dashboard process without a browser: ``/metrics`` carries exactly
what the server reports, a read-only ACL user is enough, and ``--cluster``
reads every node and merges their top keys."""

from __future__ import annotations

import http.client
from typing import Any, Callable, Dict, Tuple

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from tb_limiter.dashboard.collect import command

from conftest import APP_RULES, DASHBOARD_EXTRA, Dashboard, Workload, setuser, workload_client
from tbharness import REPO

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
    from tbharness import Cluster  # the shared harness (tools/tbharness)

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


def get_with_host(d: Dashboard, path: str, host: str) -> Tuple[int, bytes]:
    """GET ``path`` from the dashboard with ``host`` as the Host header."""
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_no_password_in_the_url_reaches_the_page(server: Any, dashboard_factory: Any) -> None:
    admin = server.client()
    setuser(admin, "ro", READ_ONLY_RULES.replace(">ro-secret", ">q-secret"))
    command(admin, "TB.CONSUME", "rl:x", "1/h", "1")
    # redis-py takes the credentials from the query string as well.
    d = dashboard_factory("redis://127.0.0.1:%d/0?username=ro&password=q-secret" % server.port, "--interval", "0.2")
    s = d.wait_snapshot("a reading", lambda s: s["ready"])
    assert s["errors"] == [] and s["nodes"][0]["error"] is None, "the query-string credentials were used"
    for path in ("/", "/api/snapshot", "/metrics"):
        status, body = d.get(path)
        assert status == 200 and b"q-secret" not in body, path
    assert "password=***" in s["source"], s["source"]
    assert "q-secret" not in d.output()


def test_only_allowed_host_headers_are_answered(server: Any, dashboard_factory: Any) -> None:
    d = dashboard_factory("redis://127.0.0.1:%d/0" % server.port, "--allow-host", "dash.internal")
    for host in ("127.0.0.1:%d" % d.port, "localhost:%d" % d.port, "[::1]:%d" % d.port, "LOCALHOST.", "dash.internal:80"):
        assert get_with_host(d, "/api/snapshot", host)[0] == 200, host
    # A DNS-rebinding page reaches the dashboard's address under its own name.
    for host in ("attacker.example:%d" % d.port, "attacker.example", "127.0.0.1.attacker.example", "", "dash.internal.evil"):
        for path in ("/", "/api/snapshot", "/metrics"):
            status, body = get_with_host(d, path, host)
            assert status == 400 and b"rl:" not in body, (host, path, status)


def test_metrics_label_every_key_exactly(server: Any, dashboard_factory: Any) -> None:
    admin = server.client()
    # Keys that a lossy decoding merges (a byte that is not UTF-8 and its
    # backslash spelling), and a NUL that the text format must not carry.
    keys = [b"rl:\xff", b"rl:\\xff", b"rl:a\x00b", b"rl:a\\x00b", b"rl:q\"\n"]
    for i, k in enumerate(keys):
        for _ in range(i + 2):
            command(admin, "TB.CONSUME", k, "1/h", "1")
    # Two names TB.TOP counts as one (it keeps 256 bytes of a name): their
    # label says it is a prefix.
    long = b"rl:" + b"L" * 300
    for k in (long + b"1", long + b"2"):
        for _ in range(4):
            command(admin, "TB.CONSUME", k, "1/h", "1")
    keys.append(long)
    d = dashboard_factory("redis://127.0.0.1:%d/0" % server.port, "--interval", "0.2")
    d.wait_snapshot("every key listed", lambda s: len(s["top_denied"]["keys"]) == len(keys))
    status, body = d.get("/metrics")
    assert status == 200 and b"\x00" not in body
    m = metrics(d)
    labels = {dict(lbl)["key"]: round(v) for (name, lbl), v in m.items() if name == "tb_top_denied"}
    assert labels == {
        "rl:\\xff": 1.0,
        "rl:\\\\xff": 2.0,
        "rl:a\\x00b": 3.0,
        "rl:a\\\\x00b": 4.0,
        "rl:q\"\\x0a": 5.0,
        "rl:" + "L" * 253 + "\u2026": 6.0,
    }, labels
    assert sorted(k["key"] for k in d.snapshot()["top_denied"]["keys"]) == sorted(labels)


def documented_user(name: str) -> str:
    """The rules of ``user NAME ...`` as the docs (README.md, docs/) give them."""
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    found = [
        line.split(None, 2)[2]
        for path in docs
        for line in path.read_text().splitlines()
        if line.startswith("user %s " % name)
    ]
    assert len(found) == 1, "expected one 'user %s' line in the docs, found %r" % (name, found)
    return found[0]


def test_metrics_need_no_scripting_as_the_documented_user(server: Any, dashboard_factory: Any) -> None:
    """The docs' recommended way to collect metrics: the dashboard's
    /metrics read as the user they give, which cannot run a script."""
    admin = server.client()
    setuser(admin, "metrics", documented_user("metrics"))
    for _ in range(3):
        command(admin, "TB.CONSUME", "rl:m", "1/h", "1")
    d = dashboard_factory("redis://metrics:metrics-secret@127.0.0.1:%d/0" % server.port, "--interval", "0.2")
    d.wait_snapshot("rl:m listed", lambda s: bool(s["top_denied"]["keys"]))
    settle(d)
    m = metrics(d)
    node = "127.0.0.1:%d" % server.port
    info = admin.info("tb")
    assert m[sample("tb_calls_total", node=node)] == info["tb_calls"]
    assert m[sample("tb_denied_total", node=node)] == info["tb_denied"] == 2
    assert round(m[sample("tb_top_denied", key="rl:m")]) == 2
    assert acl_denials(admin, "metrics") == []
    as_user = redis.Redis(host="127.0.0.1", port=server.port, username="metrics", password="metrics-secret")
    with pytest.raises(redis.exceptions.NoPermissionError):
        as_user.eval("return 1", 0)
    as_user.close()


def test_snapshot_shows_the_flows_waiting_on_a_listed_bucket(server: Any, dashboard_factory: Any) -> None:
    """A listed key with calls waiting in flows: its bucket carries
    ``waiting`` and each flow's name, weight and calls (the page shows them
    under the fill level)."""
    import threading

    admin = server.client()
    admin.flushall()
    for _ in range(3):  # denied: the key is listed
        command(admin, "TB.CONSUME", "rl:shared", "1/h", "1")
    d = dashboard_factory("redis://127.0.0.1:%d/0" % server.port, "--interval", "0.2")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    def waiter() -> redis.Redis:
        r: redis.Redis = server.client(retry=Retry(NoBackoff(), 0))  # killed at the end: no retry
        return r

    waiters = [(waiter(), "tenant-a", "1"), (waiter(), "tenant-a", "1"), (waiter(), "tenant-b", "4")]
    ids = [r.client_id() for r, _, _ in waiters]

    def wait(r: redis.Redis, f: str, w: str) -> None:
        try:
            command(r, "TB.CONSUME", "rl:shared", "1/h", "1", "BLOCK", "10000", "FLOW", f, "WEIGHT", w)
        except redis.ConnectionError:
            pass  # let go at the end of the test

    threads = [threading.Thread(target=wait, args=w) for w in waiters]
    for t in threads:
        t.start()

    def bucket(s: Any) -> Any:
        return next((k["bucket"] for k in s["top_denied"]["keys"] if k["key"] == "rl:shared"), None)

    s = d.wait_snapshot("three calls waiting on rl:shared", lambda s: (bucket(s) or {}).get("waiting") == 3)
    flows = sorted((f["name"], f["weight"], f["waiting"]) for f in bucket(s)["flows"])
    assert flows == [("tenant-a", 1, 2), ("tenant-b", 4, 1)]
    assert {k: s["nodes"][0]["gauges"][k] for k in ("waiting_calls", "waiting_flows")} == {
        "waiting_calls": 3, "waiting_flows": 2}
    m = metrics(d)
    node = "127.0.0.1:%d" % server.port
    assert m[sample("tb_waiting_calls", node=node)] == 3 and m[sample("tb_waiting_flows", node=node)] == 2
    for i in ids:
        admin.client_kill_filter(_id=str(i))
    for t in threads:
        t.join(15)
