"""Fixtures of the dashboard suite: a redis-server with the module (the
shared harness, tools/tbharness), the dashboard started the way a
user starts it (``python -m tb_limiter.dashboard``) on a free port, and a
paced workload with known heavy keys.

Environment: REDIS_SERVER and TB_MODULE as for every suite;
TB_SCREENSHOT_DIR, where the browser test writes its screenshots (default:
``target/dashboard-screenshots`` at the repository root).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Tuple

import pytest
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools" / "tbharness"))

from tbharness import REPO, Server, free_port  # noqa: E402

from tb_limiter.dashboard.collect import command  # noqa: E402

START_DEADLINE = 30.0
STOP_DEADLINE = 10.0

#: The least-privilege line docs/security.md gives an application that only
#: rate-limits, and what the dashboard adds to it: INFO and TB.TOP.
APP_RULES = "on >app-secret resetkeys ~rl:* resetchannels -@all +tb.consume +tb.mconsume +tb.refund +tb.info +cl.throttle"
DASHBOARD_EXTRA = "+info +tb.top"


def setuser(client: redis.Redis, name: str, rules: str) -> None:
    command(client, "ACL", "SETUSER", name, *rules.split())


class Dashboard:
    """``python -m tb_limiter.dashboard`` as a child process on a free
    port; stopped by pid."""

    #: Starts tried: between free_port() and the dashboard's bind, another
    #: process (a suite running beside this one) may take the port.
    ATTEMPTS = 3

    def __init__(self, url: str, *args: str) -> None:
        for attempt in range(1, self.ATTEMPTS + 1):
            self.port = free_port()
            self.log = tempfile.NamedTemporaryFile(prefix="tb-dashboard-", suffix=".log", delete=False)
            cmd = [sys.executable, "-m", "tb_limiter.dashboard", "--url", url, "--port", str(self.port), *args]
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)
            if self._ready(retry=attempt < self.ATTEMPTS):
                return

    def _ready(self, retry: bool) -> bool:
        """Waits for /healthz; False when the port was taken first and
        ``retry`` (the log is then removed), else an error with the log."""
        deadline = time.monotonic() + START_DEADLINE
        while True:
            if self.proc.poll() is not None:
                out = self.output()
                if retry and "address already in use" in out.lower():
                    os.unlink(self.log.name)
                    return False
                raise RuntimeError("the dashboard exited with %s:\n%s" % (self.proc.returncode, out))
            try:
                if self.get("/healthz")[0] == 200:
                    return True
            except OSError:
                pass
            if time.monotonic() > deadline:
                out = self.output()
                self.stop()
                raise RuntimeError("the dashboard gave no reading within %s s:\n%s" % (START_DEADLINE, out))
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:%d" % self.port

    def get(self, path: str) -> Tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())

    def snapshot(self) -> Any:
        status, body = self.get("/api/snapshot")
        assert status == 200, body
        return json.loads(body)

    def wait_snapshot(self, what: str, ok: Callable[[Any], bool], deadline: float = 30.0) -> Any:
        """Polls /api/snapshot until ``ok`` holds; fails with the last one."""
        end = time.monotonic() + deadline
        while True:
            s = self.snapshot()
            if ok(s):
                return s
            if time.monotonic() > end:
                raise AssertionError("timed out waiting for %s; last snapshot:\n%s" % (what, json.dumps(s, indent=1)[:4000]))
            time.sleep(0.1)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        os.unlink(self.log.name)


class Workload:
    """A paced load with known heavy keys, on its own thread, at ``hz``
    ticks a second. Each tick: ``rl:heavy:a`` denied 3 times, ``rl:heavy:b``
    once (one token an hour, taken at the first call), one never-satisfiable
    request on a light key (``rl:light:<i>``, a new one every tick), 5
    allowed requests on ``rl:ok:<j>``, and one reservation on ``rl:slow``
    (10 tokens/s, asked 20 times a second: its wait grows 1 s a second)."""

    def __init__(self, client: redis.Redis, hz: float = 20.0) -> None:
        self.client = client
        self.hz = hz
        self.ticks = 0
        self.replies: Counter[str] = Counter()
        self.errors: List[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def start(self) -> "Workload":
        self._thread.start()
        return self

    def _tick(self, i: int) -> None:
        p = self.client.pipeline(transaction=False)
        add: Callable[..., Any] = p.execute_command
        for _ in range(3):
            add("TB.CONSUME", "rl:heavy:a", "1/h", "1")
        add("TB.CONSUME", "rl:heavy:b", "1/h", "1")
        add("TB.CONSUME", "rl:light:%d" % i, "1", "0")
        for j in range(5):
            add("TB.CONSUME", "rl:ok:%d" % j, "1000", "1000")
        add("TB.CONSUME", "rl:slow", "10", "1", "1", "RESERVE", "60000")
        for r in p.execute():
            self.replies["allowed" if r[0] == 1 else "denied"] += 1

    def _run(self) -> None:
        next_t = time.monotonic()
        i = 0
        try:
            while not self._stop.is_set():
                self._tick(i)
                i += 1
                self.ticks = i
                next_t += 1.0 / self.hz
                self._stop.wait(max(0.0, next_t - time.monotonic()))
        except BaseException as e:  # reported by stop()
            self.errors.append(e)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive(), "the workload did not stop"
        assert not self.errors, "the workload failed: %r" % self.errors


@pytest.fixture
def server() -> Iterator[Server]:
    """A fresh server with the module; max-wait-ms 60000 so that rl:slow's
    growing waits stay grantable, max-blocked 1234 to recognise the
    settings on the page."""
    s = Server(with_module=True, extra=["--tb.max-blocked", "1234"])
    yield s
    s.stop()


@pytest.fixture
def dashboard_factory() -> Iterator[Callable[..., Dashboard]]:
    started: List[Dashboard] = []

    def start(url: str, *args: str) -> Dashboard:
        d = Dashboard(url, *args)
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def screenshot_dir() -> Path:
    d = Path(os.environ.get("TB_SCREENSHOT_DIR") or REPO / "target" / "dashboard-screenshots")
    d.mkdir(parents=True, exist_ok=True)
    return d


def workload_client(server: Server, user: Optional[str] = None, password: Optional[str] = None) -> redis.Redis:
    return server.client(username=user, password=password, socket_timeout=10)
