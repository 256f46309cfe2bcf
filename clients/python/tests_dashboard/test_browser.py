"""The dashboard in a real browser: Debian's Chromium, headless, driven by
Playwright, loads the page served by ``python -m tb_limiter.dashboard``
(logged in as the application's least-privilege ACL user plus ``+info
+tb.top``) against a server under a known workload, and checks what the page
shows; the screenshots go to TB_SCREENSHOT_DIR (``make
dashboard-screenshots`` writes the ones in docs/)."""

from __future__ import annotations

import os
import re
import threading
from typing import Any, List, Tuple

import pytest
import redis
from playwright.sync_api import Page, sync_playwright
from redis.backoff import NoBackoff
from redis.retry import Retry

from tb_limiter.dashboard.collect import command

from conftest import APP_RULES, DASHBOARD_EXTRA, Dashboard, Workload, screenshot_dir, setuser, workload_client

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
#: Flags that keep Chromium off the network it cannot reach here.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def rows(page: Page, table: str) -> List[List[str]]:
    """The cells' text of a table's body, row by row."""
    result: List[List[str]] = page.eval_on_selector_all(
        "#%s tbody tr" % table, "trs => trs.map(tr => [...tr.cells].map(td => td.textContent))"
    )
    return result


def wait_for_rows(page: Page, table: str, first: List[str], timeout_ms: int = 30_000) -> None:
    """Waits until the table's first keys are ``first``, in that order."""
    page.wait_for_function(
        """([table, first]) => {
            const keys = [...document.querySelectorAll('#' + table + ' tbody td.key')].map(td => td.textContent);
            return first.every((k, i) => keys[i] === k);
        }""",
        arg=[table, first],
        timeout=timeout_ms,
    )


def start_waiters(server: Any, key: str, flows: List[Tuple[str, int]]) -> List[Tuple[int, threading.Thread]]:
    """One call per ``(flow, weight)`` waiting on ``key`` (one token an
    hour) on a connection of its own; see :func:`stop_waiters`."""
    out = []
    for flow, weight in flows:
        r: redis.Redis = server.client(retry=Retry(NoBackoff(), 0))

        def wait(r: redis.Redis = r, flow: str = flow, weight: int = weight) -> None:
            try:
                command(r, "TB.CONSUME", key, "1/h", "1", "BLOCK", "60000", "FLOW", flow, "WEIGHT", str(weight))
            except redis.ConnectionError:
                pass  # let go by stop_waiters

        t = threading.Thread(target=wait)
        out.append((int(r.client_id()), t))
        t.start()
    return out


def stop_waiters(server: Any, waiting: List[Tuple[int, threading.Thread]]) -> None:
    """Disconnects the waiting calls (they leave the queue) and joins them."""
    admin = server.client()
    for client_id, _ in waiting:
        admin.client_kill_filter(_id=str(client_id))
    for _, t in waiting:
        t.join(10)


def chart(page: Page, div: str) -> Any:
    """What a Plotly chart draws: each trace's name, x count and y values."""
    return page.evaluate(
        "id => document.getElementById(id).data.map(t => ({name: t.name, n: t.x.length, y: t.y}))", div
    )


def text(page: Page, selector: str) -> str:
    t = page.text_content(selector)
    assert t is not None, selector
    return t


def last_number(ys: List[Any]) -> float:
    vals = [y for y in ys if y is not None]
    assert vals, "the trace has no value yet"
    return float(vals[-1])


def test_the_page_shows_who_is_limited_and_updates_live(server: Any, dashboard_factory: Any) -> None:
    if not os.path.isfile(CHROMIUM):
        pytest.fail("Chromium not found at %s: `make test-dashboard` installs Debian's chromium" % CHROMIUM)
    admin = server.client()
    setuser(admin, "app", APP_RULES)
    dash_rules = APP_RULES.replace(">app-secret", ">dash-secret") + " " + DASHBOARD_EXTRA
    setuser(admin, "dashboard", dash_rules)
    load = Workload(workload_client(server, "app", "app-secret")).start()
    try:
        dash: Dashboard = dashboard_factory(
            "redis://dashboard:dash-secret@127.0.0.1:%d/0" % server.port, "--interval", "0.5"
        )
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                problems: List[str] = []
                page.on("pageerror", lambda e: problems.append("page error: %s" % e))
                page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
                page.goto(dash.url + "/")

                # The heaviest denied keys, in the workload's order (3:1), and
                # the key callers wait on.
                wait_for_rows(page, "top-denied", ["rl:heavy:a", "rl:heavy:b"])
                wait_for_rows(page, "top-waits", ["rl:slow"])
                denied = rows(page, "top-denied")
                assert float(denied[0][2].replace(",", "")) > float(denied[1][2].replace(",", ""))
                keys = [r[1] for r in denied]
                assert not any(k.startswith("rl:ok:") for k in keys), "allowed keys are never listed"
                # Their buckets' fill level: exhausted (one token an hour,
                # taken at the first call), and rl:slow in debt.
                assert re.fullmatch(r"0(\.0\d)? / 1", denied[0][4]), denied[0]
                fill = page.eval_on_selector("#top-denied tbody tr td.bucket", "td => Number(td.dataset.fill)")
                assert 0 <= fill < 0.01
                waits = rows(page, "top-waits")
                assert waits[0][4].endswith("(in debt)"), waits[0]
                assert denied[0][5] == "127.0.0.1:%d" % server.port

                # Rates over time: the workload allows and denies every tick.
                page.wait_for_function(
                    "() => window.tbDashboard.snapshot.series.denied.filter(v => v > 0).length >= 2", timeout=30_000
                )
                rates = {t["name"]: t for t in chart(page, "chart-rates")}
                assert set(rates) == {"allowed", "denied", "reserved"}
                assert last_number(rates["allowed"]["y"]) > 0
                assert last_number(rates["denied"]["y"]) > 0
                assert last_number(rates["reserved"]["y"]) > 0
                assert float(text(page, "#tile-denied").replace(",", "")) > 0

                # Wait percentiles: a sixth of the granted requests (rl:slow's)
                # wait, longer and longer: p90 and p99 are above 0.
                page.wait_for_function(
                    "() => (window.tbDashboard.snapshot.waits.all.p99 || 0) > 0", timeout=30_000
                )
                waits_chart = {t["name"]: t for t in chart(page, "chart-waits")}
                assert set(waits_chart) == {"p50", "p90", "p99"}
                assert last_number(waits_chart["p99"]["y"]) > 0
                assert text(page, "#tile-p99") != "—"
                assert "of them waited" in text(page, "#wait-summary")

                # Each node's settings, read through INFO by a user who
                # cannot run CONFIG.
                node = rows(page, "nodes")
                assert len(node) == 1 and node[0][0] == "127.0.0.1:%d" % server.port
                settings = dict(zip(["expire_idle", "max_wait_ms", "max_blocked", "top_keys"], node[0][2:6]))
                assert settings == {"expire_idle": "yes", "max_wait_ms": "60000", "max_blocked": "1234", "top_keys": "yes"}
                assert node[0][-1] == "ok"

                # Calls waiting in flows on a listed bucket: shown under its
                # fill level, per flow (name, weight, calls).
                waiting = start_waiters(server, "rl:heavy:b", [("tenant-a", 1), ("tenant-a", 1), ("tenant-b", 3)])
                try:
                    page.wait_for_selector("#top-denied td.bucket .flows[data-waiting='3']", timeout=30_000)
                    flows = page.eval_on_selector_all(
                        "#top-denied td.bucket .flows .flow",
                        "spans => spans.map(s => [s.dataset.name, s.dataset.weight, s.dataset.waiting])",
                    )
                    assert sorted(flows) == [["tenant-a", "1", "2"], ["tenant-b", "3", "1"]], flows
                    assert "3 waiting" in text(page, "#top-denied td.bucket .flows")
                    page.wait_for_function(
                        "() => document.querySelector('#nodes td.waiting').textContent === '3 / 2'", timeout=30_000
                    )
                    page.locator("#top-denied").screenshot(path=str(screenshot_dir() / "dashboard-flows.png"))
                finally:
                    stop_waiters(server, waiting)

                # Live: more readings arrive and the charts grow (to 20
                # points at least, for a screenshot that shows a trend).
                before = page.evaluate("() => [window.tbDashboard.updates, document.getElementById('chart-rates').data[0].x.length]")
                page.wait_for_function(
                    """([u, n]) => {
                        const x = document.getElementById('chart-rates').data[0].x.length;
                        return window.tbDashboard.updates >= u + 2 && x > n && x >= 20;
                    }""",
                    arg=before,
                    timeout=30_000,
                )
                page.screenshot(path=str(screenshot_dir() / "dashboard.png"), full_page=True)
                page.locator("section.tables").screenshot(path=str(screenshot_dir() / "dashboard-top-keys.png"))
                assert problems == [], problems
            finally:
                browser.close()
    finally:
        load.stop()
    # The dashboard needed nothing its user may not do.
    assert [e for e in admin.acl_log() if e["username"] == "dashboard"] == []
    assert load.ticks > 0 and load.replies["denied"] > 0
