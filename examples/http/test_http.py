"""The FastAPI gateway: per API key and per user limits from a YAML file of
tiers (re-read when it changes), 429 with headers computed from the reply."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway import create_app  # noqa: E402
from tbserver import Server  # noqa: E402

TIERS = """
tiers:
  free:
    per_key:  {rate: "1/m", capacity: 5}
    per_user: {rate: "2/m", capacity: 8}
  tiny:
    per_key:  {rate: "1/m", capacity: 1}
    per_user: {rate: "1/m", capacity: 10}
  fast:
    per_key:  {rate: "4", capacity: 1}
    per_user: {rate: "4", capacity: 1}
keys:
  key-alice-1: {user: alice, tier: free}
  key-alice-2: {user: alice, tier: free}
  key-carol:   {user: carol, tier: tiny}
  key-dave:    {user: dave, tier: fast}
"""


@pytest.fixture
def tiers_file(tmp_path: Path) -> Path:
    p = tmp_path / "tiers.yaml"
    p.write_text(TIERS)
    return p


@pytest.fixture
async def client(module_server: Server, tiers_file: Path) -> httpx.AsyncClient:
    module_server.client().flushall()
    app = create_app(module_server.url, tiers_file)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
        yield c  # type: ignore[misc]


async def get(client: httpx.AsyncClient, key: str) -> httpx.Response:
    return await client.get("/v1/models", headers={"X-API-Key": key})


async def test_per_key_then_per_user_limits(client: httpx.AsyncClient) -> None:
    for i in range(5):
        r = await get(client, "key-alice-1")
        assert r.status_code == 200
        assert (r.headers["RateLimit-Limit"], r.headers["RateLimit-Remaining"]) == ("5", str(4 - i))
    denied = await get(client, "key-alice-1")
    assert denied.status_code == 429
    # 1 token a minute: the wait rounds up to 60 s, never down to 59
    assert denied.headers["Retry-After"] == "60"
    assert denied.headers["RateLimit-Remaining"] == "0"
    # the user's other key has its own bucket, but shares the user's 8
    for _ in range(3):
        assert (await get(client, "key-alice-2")).status_code == 200
    by_user = await get(client, "key-alice-2")
    assert by_user.status_code == 429
    assert (by_user.headers["RateLimit-Limit"], by_user.headers["RateLimit-Remaining"]) == ("8", "0")
    assert by_user.headers["Retry-After"] == "30"  # 2 a minute
    # upper bound of the time to full: 8 missing at 2/m, 4 missing at 1/m
    assert by_user.headers["RateLimit-Reset"] == "240"


async def test_retry_after_is_enough(client: httpx.AsyncClient) -> None:
    assert (await get(client, "key-dave")).status_code == 200
    denied = await get(client, "key-dave")
    assert denied.status_code == 429
    wait = int(denied.headers["Retry-After"])
    assert wait == 1  # 250 ms rounded up to a whole second
    await asyncio.sleep(wait)
    assert (await get(client, "key-dave")).status_code == 200


async def test_tiers_file_is_reread(client: httpx.AsyncClient, tiers_file: Path) -> None:
    assert (await get(client, "key-carol")).status_code == 200
    assert (await get(client, "key-carol")).status_code == 429
    assert (await get(client, "key-erin")).status_code == 401
    # carol moves to the free tier and erin gets a key: no restart
    text = tiers_file.read_text().replace("{user: carol, tier: tiny}", "{user: carol, tier: free}")
    tiers_file.write_text(text + "  key-erin:    {user: erin, tier: tiny}\n")
    r = await get(client, "key-carol")
    # the new limits apply at once; a change never mints tokens, so carol's
    # empty bucket waits for its next token at the free tier's capacity
    assert (r.status_code, r.headers["RateLimit-Limit"], r.headers["Retry-After"]) == (429, "5", "60")
    assert (await get(client, "key-erin")).status_code == 200


async def test_unknown_key(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/models")
    assert r.status_code == 401 and "RateLimit-Limit" not in r.headers
