"""Real redis-server processes for the tests, like the Rust harness
(tests/common/mod.rs): a free loopback port, a start-up deadline, stopped by
pid. Environment: REDIS_SERVER (default ``redis-server`` on PATH) and
TB_MODULE (default ``target/release/libtb.so`` at the repository root)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import redis

REPO = Path(__file__).resolve().parents[3]
START_DEADLINE = 15.0
STOP_DEADLINE = 10.0


def redis_server_bin() -> str:
    """The redis-server to run; fails clearly when there is none."""
    name = os.environ.get("REDIS_SERVER") or "redis-server"
    path = name if os.sep in name else shutil.which(name)
    if not path or not os.path.isfile(path):
        raise RuntimeError(f"redis-server not found ({name!r}): run `make test-python`, which installs it")
    return path


def module_path() -> str:
    """The tb module to load; fails clearly when it was not built."""
    p = Path(os.environ.get("TB_MODULE") or REPO / "target/release/libtb.so")
    if not p.is_file():
        raise RuntimeError(f"tb module not found at {p}: run `cargo build --release` first")
    return str(p.resolve())


def clockshift_lib() -> str:
    """The LD_PRELOAD clock shim (tests/clockshift/clockshift.c at the
    repository root), built with the C compiler (``CC`` or ``cc``) into
    target/clockshift/ when missing or older than its source. A server started
    with ``env=clockshift_env(path)`` takes its wall clock from the control
    file ``path`` (the format is in the C file)."""
    src = REPO / "tests/clockshift/clockshift.c"
    out = REPO / "target/clockshift/libclockshift.so"
    if not out.is_file() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.{os.getpid()}")
        cc = os.environ.get("CC") or "cc"
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror", "-o", str(tmp), str(src), "-ldl"],
                       check=True)
        os.replace(tmp, out)
    return str(out)


def clockshift_env(control_file: str) -> dict[str, str]:
    """Environment for a server whose wall clock ``control_file`` controls."""
    return {"LD_PRELOAD": clockshift_lib(), "TB_CLOCK_FILE": control_file}


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port at most 55535 whose cluster bus port (+10000) is free too."""
    for _ in range(1000):
        port = random.randint(20000, 55535)
        if _is_free(port) and _is_free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node on 127.0.0.1")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Server:
    """A redis-server child process on 127.0.0.1, with or without the module."""

    def __init__(
        self,
        *,
        with_module: bool,
        extra: list[str] | None = None,
        module_args: list[str] | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.with_module = with_module
        self.dir = tempfile.mkdtemp(prefix="tb-py-")
        self.port = port or free_port()
        args = [
            redis_server_bin(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self.dir,
            "--save", "",
            "--appendonly", "no",
            "--logfile", "redis.log",
        ]
        if with_module:
            args += ["--loadmodule", module_path(), *(module_args or [])]
        args += extra or []
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, cwd=self.dir,
                                     env={**os.environ, **env} if env else None)
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def connections_received(self) -> int:
        """Connections the server has accepted since it started."""
        return int(self.client().info("stats")["total_connections_received"])

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = Path(self.dir, "redis.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_DEADLINE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if self.client(socket_timeout=1).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer PING within {START_DEADLINE} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM by pid, SIGKILL after the deadline; removes the data dir."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(STOP_DEADLINE)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def example_redis() -> Iterator[str]:
    """The Redis URL an example runs against, also exported as TB_REDIS_URL:
    REDIS_URL when set, else a fresh redis-server with the module on a free
    port, stopped when the block ends."""
    server = None
    url = os.environ.get("REDIS_URL")
    if not url:
        server = Server(with_module=True)
        url = server.url
    os.environ["TB_REDIS_URL"] = url
    try:
        yield url
    finally:
        if server:
            server.stop()
