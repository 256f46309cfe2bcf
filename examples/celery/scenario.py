"""Runs the example end to end: a Celery worker (prefork, several processes)
against a Redis with the tb module and the stand-in LLM API."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
READY_DEADLINE = 60.0
STOP_DEADLINE = 20.0


@contextlib.contextmanager
def worker(
    redis_url: str, api_url: str, *, concurrency: int = 3, logfile: Path, app: str = "app"
) -> Iterator[subprocess.Popen[bytes]]:
    """A ``celery worker --pool=prefork`` of the Celery app ``app`` (a module
    here) in its own process group, ready when it logs so; stopped with
    SIGTERM (then SIGKILL) to its group."""
    env = dict(os.environ, TB_REDIS_URL=redis_url, LLM_API_URL=api_url)
    cmd = [
        sys.executable, "-m", "celery", "-A", app, "worker",
        "--pool=prefork", f"--concurrency={concurrency}",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        "--loglevel=INFO", f"--logfile={logfile}",
    ]
    proc = subprocess.Popen(cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_DEADLINE
        while b" ready." not in (logfile.read_bytes() if logfile.exists() else b""):
            if proc.poll() is not None:
                raise RuntimeError(f"celery worker exited with {proc.returncode}:\n{_tail(logfile)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"celery worker not ready within {READY_DEADLINE} s:\n{_tail(logfile)}")
            time.sleep(0.1)
        yield proc
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # prefork children left behind, if any
    proc.wait(5)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
