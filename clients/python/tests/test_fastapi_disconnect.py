"""FastAPI ``RateLimit(wait=...)`` under a real uvicorn process (issue 19,
blocker 2): uvicorn does not cancel a handler whose client went away, so the
wait races the ASGI ``http.disconnect`` message. Clients that give up after
0.3 s leave the bucket as if they never came, their handler never runs, and
the next real request waits only for what the bucket really lacks."""

from __future__ import annotations

import socket
import sys
import time
from decimal import Decimal
from pathlib import Path

import httpx

from tbserver import REPO, Server

sys.path.insert(0, str(REPO / "examples"))
from asgiproc import uvicorn_process  # noqa: E402

APP = '''
import os

from fastapi import Depends, FastAPI

from tb_limiter import AsyncLimiter
from tb_limiter.fastapi import RateLimit

limiter = AsyncLimiter.from_url(os.environ["REDIS_URL"])
app = FastAPI()
per_key = RateLimit(limiter, "1/second", key=lambda request: "k", wait=10)


@app.get("/work", dependencies=[Depends(per_key)])
async def work() -> dict[str, bool]:
    await limiter.client.incr("handler-runs")
    return {"ok": True}
'''
KEY = "rl:k:{rl:k}:1/1s"  # tb_limiter._spec.group_key("rl:k", 1/second)
GONE_AFTER = 0.3
#: The refund follows the disconnect by one round trip; a turn kept instead
#: would show for at least its reserved wait (1 s and more).
SETTLE_DEADLINE = 0.8


def _tokens(server: Server) -> Decimal:
    info = server.client().execute_command("TB.INFO", KEY)
    if info is None:
        return Decimal(1)
    fields = dict(zip(info[0::2], info[1::2]))
    return Decimal(fields[b"tokens"].decode())


def test_clients_that_leave_give_their_turn_back(module_server: Server, tmp_path: Path) -> None:
    module_server.client().flushall()
    (tmp_path / "app.py").write_text(APP)
    env = {"REDIS_URL": module_server.url}
    with uvicorn_process("app:app", tmp_path, env, tmp_path / "uvicorn.log") as base:
        assert httpx.get(base + "/work", timeout=5).status_code == 200
        served_at = time.monotonic()
        assert _tokens(module_server) < Decimal("0.1"), "the first request took the only token"
        port = int(base.rsplit(":", 1)[1])
        leavers = [socket.create_connection(("127.0.0.1", port)) for _ in range(4)]
        for s in leavers:
            s.sendall(b"GET /work HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(GONE_AFTER)
        for s in leavers:
            s.close()
        # As if they never came: the level is the refill since the first
        # request, capped at the capacity (1 token per second, capacity 1).
        deadline = time.monotonic() + SETTLE_DEADLINE
        while True:
            before = time.monotonic()
            level = _tokens(module_server)
            expected = min(1.0, before - served_at)
            if float(level) >= expected - 0.01 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert float(level) >= expected - 0.01, f"level {level} after the leavers, {expected:.3f} if they never came"
        assert int(module_server.client().get("handler-runs") or 0) == 1, "no handler ran for a client that left"
        lacking = max(0.0, 1 - float(_tokens(module_server)))
        start = time.monotonic()
        assert httpx.get(base + "/work", timeout=15).status_code == 200
        waited = time.monotonic() - start
        # Its turn: when the bucket has refilled what it lacked (measured just
        # before it was sent), neither sooner nor a turn per leaver later.
        assert lacking - 0.05 <= waited < lacking + 0.5, f"the next request waited {waited:.2f} s for {lacking:.2f} s"
        assert int(module_server.client().get("handler-runs") or 0) == 2
