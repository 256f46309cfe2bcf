"""The gateway end to end: uvicorn serving examples/http/gateway.py in its
own process (the shipped tb_limiter.fastapi.RateLimit dependency), Redis
with the module, requests over loopback. Limits per tier from a YAML file
re-read when it changes; 429 with Retry-After and the IETF RateLimit and
RateLimit-Policy fields; a tier that queues, with a backlog deeper than its
wait."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from asgiproc import uvicorn_process
from tbharness import Server

HERE = Path(__file__).resolve().parent

TIERS = """
tiers:
  free:   {limits: "5/minute;8/hour"}
  fast:   {limits: "1/second"}
  queued: {limits: "2/second", wait: 3}
keys:
  key-alice-1: {user: alice, tier: free}
  key-dave:    {user: dave, tier: fast}
  key-erin:    {user: erin, tier: queued}
"""


@pytest.fixture
def tiers_file(tmp_path: Path) -> Path:
    p = tmp_path / "tiers.yaml"
    p.write_text(TIERS)
    return p


@pytest.fixture
def gateway(module_server: Server, tiers_file: Path, tmp_path: Path) -> Iterator[str]:
    """``uvicorn gateway:app`` in its own process."""
    module_server.client().flushall()
    env = {"TB_REDIS_URL": module_server.url, "TIERS_FILE": str(tiers_file)}
    with uvicorn_process("gateway:app", HERE, env, tmp_path / "uvicorn.log") as base:
        yield base


def get(base: str, key: str) -> httpx.Response:
    return httpx.get(base + "/v1/models", headers={"X-API-Key": key}, timeout=30)


def test_limits_and_headers(gateway: str) -> None:
    for i in range(5):
        r = get(gateway, "key-alice-1")
        assert r.status_code == 200
        assert r.headers["RateLimit-Policy"] == '"5/minute";q=5;w=60, "8/hour";q=8;w=3600'
        # t: at most one token's refill time until more are available
        assert r.headers["RateLimit"] == f'"5/minute";r={4 - i};t=12, "8/hour";r={7 - i};t=450'
        assert "Retry-After" not in r.headers
    denied = get(gateway, "key-alice-1")
    assert denied.status_code == 429
    # 1 token in 12 s: rounded up, never down to 11
    assert denied.headers["Retry-After"] == "12"
    assert denied.headers["RateLimit"] == '"5/minute";r=0;t=12, "8/hour";r=3;t=450'
    assert denied.headers["RateLimit-Policy"] == '"5/minute";q=5;w=60, "8/hour";q=8;w=3600'


def test_retry_after_is_enough(gateway: str) -> None:
    assert get(gateway, "key-dave").status_code == 200
    denied = get(gateway, "key-dave")
    assert denied.status_code == 429
    wait = int(denied.headers["Retry-After"])
    assert wait == 1  # just under 1000 ms, rounded up to a whole second
    time.sleep(wait)
    assert get(gateway, "key-dave").status_code == 200


def test_tiers_file_is_reread(gateway: str, tiers_file: Path) -> None:
    assert get(gateway, "key-carol").status_code == 401
    tiers_file.write_text(TIERS + "  key-carol:   {user: carol, tier: fast}\n")
    r = get(gateway, "key-carol")
    assert r.status_code == 200 and r.headers["RateLimit"] == '"1/second";r=0;t=1'


def test_a_backlog_deeper_than_the_wait(gateway: str) -> None:
    """Twelve requests at once on a tier of 2/s (burst 2) that waits up to
    3 s: the burst and the turns within 3 s are served, in turn; the others
    are refused at once, each with a Retry-After. The sixth turn is due 3 s
    after the burst, so whether it fits depends on the milliseconds between
    a request's arrival and its reservation: 7 or 8 are served."""

    async def burst() -> list[tuple[int, float, httpx.Headers]]:
        async with httpx.AsyncClient(base_url=gateway, timeout=30) as c:
            async def one() -> tuple[int, float, httpx.Headers]:
                start = time.monotonic()
                r = await c.get("/v1/models", headers={"X-API-Key": "key-erin"})
                return r.status_code, time.monotonic() - start, r.headers

            return await asyncio.gather(*(one() for _ in range(12)))

    start = time.monotonic()
    results = asyncio.run(burst())
    elapsed = time.monotonic() - start
    served = sorted(t for code, t, _ in results if code == 200)
    refused = [(t, h) for code, t, h in results if code == 429]
    assert len(served) in (7, 8) and len(served) + len(refused) == 12, [code for code, _, _ in results]
    assert len(served) <= 2 + 2 * elapsed, "never more than capacity + rate * T"
    # served in turn, one turn per 0.5 s after the burst of 2: the last one
    # waited for its turn, (served - 2) * 0.5 s (2.5 s or 3 s)
    turn = (len(served) - 2) * 0.5
    assert turn - 0.1 <= served[-1] < turn + 1.0, served
    assert all(t < 1.0 and int(h["Retry-After"]) >= 1 for t, h in refused), refused
