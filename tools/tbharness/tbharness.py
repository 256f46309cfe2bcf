"""Real redis-server / valkey-server processes for every Python harness of the
repository (client tests, dashboard tests, examples, tools/doctest, bench):
a free loopback port, a start-up deadline, stopped by pid; and a cluster of
N primaries (+ replicas) made with ``redis-cli --cluster create``.

Standard library only, so that any venv can use it: put this directory on
``sys.path`` and ``import tbharness``. (``Server.client()`` returns a redis-py
client and so needs redis-py; nothing else does.)

Environment: REDIS_SERVER (the binary; default ``redis-server`` on PATH),
TB_MODULE (the module; default ``target/release/libtb.so`` at the repository
root), REDIS_CLI (default ``redis-cli`` on PATH).
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    import redis

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE = 15.0
STOP_DEADLINE = 10.0
CLI_DEADLINE = 120.0
STABLE_DEADLINE = 60.0
LOG = "server.log"

#: A RESP2 reply as :func:`command` returns it.
Reply = Union[str, int, None, list["Reply"]]


class ReplyError(Exception):
    """An error reply (``-ERR ...``) from :func:`command`."""


def redis_server_bin() -> str:
    """``$REDIS_SERVER``, else ``redis-server`` on PATH; fails clearly when missing."""
    name = os.environ.get("REDIS_SERVER") or "redis-server"
    path = name if os.sep in name else shutil.which(name)
    if not path or not os.path.isfile(path):
        raise RuntimeError(f"redis-server not found ({name!r}): set REDIS_SERVER or run `make deps`")
    return path


def module_path() -> str:
    """``$TB_MODULE``, else the release build; fails clearly when it was not built."""
    p = Path(os.environ.get("TB_MODULE") or REPO / "target/release/libtb.so")
    if not p.is_file():
        raise RuntimeError(f"tb module not found at {p}: run `cargo build --release` first")
    return str(p.resolve())


def redis_cli_bin() -> str:
    """``$REDIS_CLI``, else ``redis-cli`` on PATH; fails clearly when missing."""
    path = os.environ.get("REDIS_CLI") or shutil.which("redis-cli")
    if not path or not os.path.isfile(path):
        raise RuntimeError("redis-cli not found: install redis-tools (`make deps`) or set REDIS_CLI")
    return path


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


def command(port: int, *args: str | int, timeout: float = 5.0) -> Reply:
    """Sends one command to 127.0.0.1:``port`` on a fresh connection and
    returns its reply (bulk strings decoded as UTF-8); raises
    :class:`ReplyError` on an error reply, OSError when it cannot connect."""
    parts = [str(a).encode() for a in args]
    req = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(req)
        return _read_reply(s.makefile("rb"))


def _read_reply(f: Any) -> Reply:
    line: bytes = f.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2].decode(errors="replace")
    if kind == b"+":
        return body
    if kind == b"-":
        raise ReplyError(body)
    if kind == b":":
        return int(body)
    if kind == b"$":
        n = int(body)
        if n < 0:
            return None
        data: bytes = f.read(n + 2)
        return data[:-2].decode(errors="replace")
    if kind == b"*":
        n = int(body)
        return None if n < 0 else [_read_reply(f) for _ in range(n)]
    raise ConnectionError(f"unexpected reply {line!r}")


class Server:
    """A server child process on 127.0.0.1 in a fresh directory, with or
    without the module; it answers PING (or an auth error) when the
    constructor returns.

    ``binary``: the server (default :func:`redis_server_bin`). ``module``:
    the module file (default :func:`module_path`). ``extra``:
    further command-line settings. ``module_args``: arguments after the
    module path. ``conf_text``: when given, the server reads a redis.conf of
    it (the module is loaded first unless the text loads it) and no
    persistence defaults are added; otherwise persistence is off. ``port``:
    fixed, else a free one (a lost race for it is retried). ``env``: added to
    the environment. ``prefix``: a command the server runs under (e.g.
    ``taskset -c 0``)."""

    def __init__(
        self,
        *,
        with_module: bool = True,
        binary: str | None = None,
        module: str | None = None,
        extra: Sequence[str] | None = None,
        module_args: Sequence[str] | None = None,
        conf_text: str | None = None,
        port: int | None = None,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        start_deadline: float = START_DEADLINE,
    ) -> None:
        self.with_module = with_module
        self.binary = binary or redis_server_bin()
        module = module or (module_path() if with_module else None)
        self.dir = tempfile.mkdtemp(prefix="tb-srv-")
        args = [self.binary]
        if conf_text is not None:
            conf = Path(self.dir, "redis.conf")
            lines = []
            if with_module and "loadmodule" not in conf_text:
                lines.append(" ".join(["loadmodule", str(module), *(module_args or [])]))
            conf.write_text("\n".join([*lines, conf_text]) + "\n")
            args.append(str(conf))
        args += ["--bind", "127.0.0.1", "--dir", self.dir, "--logfile", LOG, "--daemonize", "no"]
        if conf_text is None:
            args += ["--save", "", "--appendonly", "no"]
            if with_module:
                args += ["--loadmodule", str(module), *(module_args or [])]
        args += extra or []
        attempts = 1 if port else 3
        for attempt in range(attempts):
            self.port = port or (free_cluster_port() if "cluster-enabled yes" in (conf_text or "") else free_port())
            for name in (LOG, "stdout.log"):  # a retry reads only its own attempt's log
                Path(self.dir, name).unlink(missing_ok=True)
            out = open(Path(self.dir, "stdout.log"), "wb")
            try:
                self.proc = subprocess.Popen(
                    [*prefix, *args, "--port", str(self.port)], stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, cwd=self.dir, env={**os.environ, **env} if env else None)
            finally:
                out.close()
            try:
                if self._wait_ready(start_deadline):
                    return
            except BaseException:
                self.stop()
                raise
            log = self.log()
            self.stop(keep_dir=True)
            if "Address already in use" not in log or attempt + 1 == attempts:
                shutil.rmtree(self.dir, ignore_errors=True)
                raise RuntimeError(f"{self.binary} did not start within {start_deadline} s on port {self.port}"
                                   f" ({' '.join(args)}):\n{log[-3000:]}")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str | int, timeout: float = 5.0) -> Reply:
        """One command on a fresh connection (:func:`command`)."""
        return command(self.port, *args, timeout=timeout)

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client on this server (needs redis-py)."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def connections_received(self) -> int:
        """Connections the server has accepted since it started."""
        info = str(self.command("INFO", "stats"))
        return int(info.split("total_connections_received:", 1)[1].split()[0])

    def log(self) -> str:
        """The server's log and anything it wrote to stdout/stderr."""
        text = ""
        for name in ("stdout.log", LOG):
            try:
                text += Path(self.dir, name).read_text(errors="replace")
            except OSError:
                pass
        return text

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:]) or "(no log)"

    def _wait_ready(self, deadline_s: float) -> bool:
        """Until this process answers PING (PONG or an auth error: up);
        False when it exits or the deadline passes."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                command(self.port, "PING", timeout=1)
                if self._answered_by_another():
                    time.sleep(0.02)
                    continue
                return True
            except ReplyError as e:
                if "LOADING" not in str(e):
                    return True
            except OSError:
                pass
            time.sleep(0.02)
        return False

    def _answered_by_another(self) -> bool:
        """True when the server on the port is not this process (a fixed
        port already taken): then this one exits and the start fails."""
        try:
            info = str(command(self.port, "INFO", "server", timeout=1))
        except ReplyError:  # INFO denied: cannot tell, trust the PING
            return False
        pid = info.split("process_id:", 1)[1].split()[0] if "process_id:" in info else ""
        return pid != "" and int(pid) != self.proc.pid

    def stop(self, keep_dir: bool = False, deadline: float = STOP_DEADLINE) -> None:
        """SIGTERM by pid, SIGKILL after ``deadline`` seconds; removes the
        directory unless ``keep_dir``."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(deadline)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if not keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


CLUSTER_CONF = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000"]


class Cluster:
    """``masters`` primaries with ``replicas`` replicas each (default 3 and
    1): ``nodes[:masters]`` start as primaries, the rest as replicas. Returns
    once every node reports ``cluster_state:ok``, knows every node, and every
    replica's link is up. ``conf_text``/``extra``/``binary`` as for
    :class:`Server`."""

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        with_module: bool = True,
        binary: str | None = None,
        conf_text: str | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.masters, self.replicas = masters, replicas
        self.nodes: list[Server] = []
        try:
            for _ in range(masters * (1 + replicas)):
                if conf_text is None:
                    node = Server(with_module=with_module, binary=binary, port=free_cluster_port(),
                                  extra=[*CLUSTER_CONF, *extra])
                else:
                    conf = "\n".join(f"{k[2:]} {v}" for k, v in zip(CLUSTER_CONF[::2], CLUSTER_CONF[1::2]))
                    node = Server(with_module=with_module, binary=binary, conf_text=conf + "\n" + conf_text,
                                  extra=extra)
                self.nodes.append(node)
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            cmd = [redis_cli_bin(), "--cluster", "create", *addrs, "--cluster-replicas", str(replicas),
                   "--cluster-yes"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_DEADLINE, stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            self._wait_stable()
        except BaseException:
            self.stop()
            raise

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def _wait_stable(self) -> None:
        deadline = time.monotonic() + STABLE_DEADLINE
        last = ""
        total = len(self.nodes)
        while time.monotonic() < deadline:
            ok = True
            for n in self.nodes:
                last = str(n.command("CLUSTER", "INFO"))
                ok = ok and "cluster_state:ok" in last and f"cluster_known_nodes:{total}\r" in last
            if ok and self._replicas_synced() == self.masters * self.replicas:
                return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not become stable within {STABLE_DEADLINE} s:\n{last}")

    def _replicas_synced(self) -> int:
        links = 0
        for n in self.nodes:
            info = str(n.command("INFO", "replication"))
            if "role:slave" in info and "master_link_status:up" in info:
                links += 1
        return links

    def flushall(self) -> None:
        """Empties every primary (replicas follow)."""
        for n in self.nodes:
            if "role:master" in str(n.command("INFO", "replication")):
                n.command("FLUSHALL")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
