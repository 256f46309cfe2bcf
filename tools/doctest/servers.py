"""Real redis-server processes for the blocks: free loopback port, start-up
deadline, stopped by pid.

The binaries come from TEST_SERVERS (space-separated, the Makefile's list),
the module from TB_MODULE. A missing binary or module is an error, never a
skip.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

START_DEADLINE_S = 20.0
STOP_DEADLINE_S = 10.0


def test_servers() -> list[str]:
    """The server binaries of TEST_SERVERS; fails clearly when unset or missing."""
    raw = os.environ.get("TEST_SERVERS", "").split()
    if not raw:
        raise RuntimeError("TEST_SERVERS is not set: run `make test-docs`")
    for path in raw:
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"TEST_SERVERS names {path}, which is not an executable")
    return raw


def module_path() -> str:
    path = os.environ.get("TB_MODULE", "")
    if not path or not Path(path).is_file():
        raise RuntimeError(f"TB_MODULE={path!r} is not a file: run `make test-docs`")
    return path


def server_label(binary: str) -> str:
    """``redis-7.0.15`` / ``valkey-8.0.1``: the name and version a binary reports."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    words = out.stdout.split()
    name = "valkey" if "valkey" in out.stdout.lower() else "redis"
    version = next((w[2:] for w in words if w.startswith("v=")), "unknown")
    return f"{name}-{version}"


def free_port(bus: bool = False) -> int:
    """A free loopback port; with ``bus``, one whose cluster bus port (+10000)
    is free too."""
    if not bus:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(1000):
        port = random.randint(20000, 55535)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            return port
        except OSError:
            continue
    raise RuntimeError("no free port pair for a cluster node")


@dataclass
class Server:
    binary: str
    port: int
    dir: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, timeout: float = 30) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=timeout, decode_responses=True)

    def log(self) -> str:
        p = self.dir / "server.log"
        return p.read_text(errors="replace") if p.exists() else ""


def start(
    binary: str,
    *,
    module: bool = True,
    conf_text: str = "",
    extra: list[str] | None = None,
) -> Server:
    """Starts ``binary`` on a free port in a new directory and waits until it
    answers PING. ``conf_text`` becomes its redis.conf (the module is loaded
    first unless the text loads it or ``module`` is False); ``extra`` are
    further command-line settings."""
    d = Path(tempfile.mkdtemp(prefix="tb-doctest-"))
    conf = d / "redis.conf"
    lines = []
    if module and "loadmodule" not in conf_text:
        lines.append(f"loadmodule {module_path()}")
    lines.append(conf_text)
    conf.write_text("\n".join(lines) + "\n")
    for attempt in range(3):
        port = free_port(bus="cluster-enabled yes" in conf_text)
        args = [
            binary,
            str(conf),
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--dir", str(d),
            "--logfile", str(d / "server.log"),
            "--daemonize", "no",
            *(extra or []),
        ]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        srv = Server(binary, port, d, proc)
        try:
            if _wait_ready(srv):
                return srv
        except BaseException:
            stop(srv)
            raise
        log = srv.log()
        stop(srv, keep_dir=True)
        if "Address already in use" in log and attempt < 2:
            continue
        raise RuntimeError(
            f"{binary} did not start within {START_DEADLINE_S} s on port {port}:\n{log[-3000:]}"
        )
    raise AssertionError("unreachable")


def _wait_ready(srv: Server) -> bool:
    """Waits until ``srv`` answers (True) or exits or misses the deadline."""
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            return False
        try:
            if srv.client(timeout=1).ping():
                return True
        except redis.AuthenticationError:  # up, with a password on default
            return True
        except redis.ConnectionError:
            time.sleep(0.02)
        except redis.ResponseError as e:  # LOADING, or PING denied to default
            if "LOADING" not in str(e):
                return True
            time.sleep(0.02)
    return False


def stop(srv: Server, keep_dir: bool = False) -> None:
    """Stops the server by its pid (SIGTERM, then SIGKILL past the deadline)."""
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        try:
            srv.proc.wait(STOP_DEADLINE_S)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait()
    if not keep_dir:
        shutil.rmtree(srv.dir, ignore_errors=True)


@contextmanager
def running(binary: str, **kw: object) -> Iterator[Server]:
    srv = start(binary, **kw)  # type: ignore[arg-type]
    try:
        yield srv
    finally:
        stop(srv)


CLUSTER_DEADLINE_S = 60.0


def start_cluster(binary: str, masters: int = 3, conf_text: str = "") -> list[Server]:
    """``masters`` nodes made a cluster with ``redis-cli --cluster create``
    (no replicas), each with the module; returns once every node reports
    ``cluster_state:ok``. The caller stops every node."""
    node_conf = "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 5000\n"
    nodes: list[Server] = []
    try:
        for _ in range(masters):
            nodes.append(start(binary, conf_text=node_conf + conf_text))
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not installed: run `make deps`")
        out = subprocess.run(
            [cli, "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=CLUSTER_DEADLINE_S,
        )
        if out.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}{out.stderr}")
        deadline = time.monotonic() + CLUSTER_DEADLINE_S
        for n in nodes:
            while "cluster_state:ok" not in str(n.client().execute_command("CLUSTER", "INFO")):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"node {n.port} not ok within {CLUSTER_DEADLINE_S} s")
                time.sleep(0.05)
        return nodes
    except BaseException:
        for n in nodes:
            stop(n)
        raise
