"""Real redis-server processes for the blocks, started through the shared
harness (tools/tbharness): free loopback port, start-up deadline, stopped by
pid.

The binaries come from TEST_SERVERS (space-separated, the Makefile's list),
the module from TB_MODULE. A missing binary or module is an error, never a
skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tbharness"))

import tbharness  # noqa: E402

START_DEADLINE_S = 20.0


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


def free_port() -> int:
    """A free loopback port."""
    return tbharness.free_port()


#: A running server (tools/tbharness): ``port``, ``url``, ``dir``, ``log()``.
Server = tbharness.Server


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
    if module:
        module_path()  # a clear error when TB_MODULE is unset
    return Server(binary=binary, with_module=module, conf_text=conf_text, extra=extra,
                  start_deadline=START_DEADLINE_S)


def stop(srv: Server) -> None:
    """Stops the server by its pid (SIGTERM, then SIGKILL past the deadline)."""
    srv.stop()


@contextmanager
def running(binary: str, **kw: object) -> Iterator[Server]:
    srv = start(binary, **kw)  # type: ignore[arg-type]
    try:
        yield srv
    finally:
        stop(srv)


def start_cluster(binary: str, masters: int = 3, conf_text: str = "") -> list[Server]:
    """``masters`` nodes made a cluster with ``redis-cli --cluster create``
    (no replicas), each with the module; returns once every node reports
    ``cluster_state:ok``. The caller stops every node."""
    return tbharness.Cluster(masters=masters, replicas=0, binary=binary, conf_text=conf_text).nodes
