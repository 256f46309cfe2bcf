"""An ASGI app served by uvicorn in its own process, for the examples' end to
end tests: a free loopback port, a start-up deadline, stopped by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx

from tbharness import free_port

START_DEADLINE = 30.0
STOP_DEADLINE = 10.0


@contextlib.contextmanager
def uvicorn_process(app: str, app_dir: Path, env: dict[str, str], log: Path) -> Iterator[str]:
    """``uvicorn app`` (``module:attribute`` in ``app_dir``) with ``env`` added
    to the environment; yields its base URL once it answers HTTP."""
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
             "--app-dir", str(app_dir), "--log-level", "warning"],
            env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + START_DEADLINE
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"uvicorn exited with {proc.returncode}:\n{log.read_text()}")
                try:
                    httpx.get(base + "/openapi.json", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"uvicorn did not answer within {START_DEADLINE} s:\n{log.read_text()}")
                    time.sleep(0.05)
            yield base
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(STOP_DEADLINE)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(5)
