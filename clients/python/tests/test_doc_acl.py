"""Every ACL user the docs give the application (issue 18 item 2) runs
every documented Python recipe: consume, acquire, leases released and
settled (``lease``, ``lease_many``, ``give_back``), refund, info, waits in
a flow, batched and pace. The users are read from the markdown (README.md, docs/**,
clients/*/README.md), so the docs are the source: a user without
``TB.RELEASE`` fails on the first lease's exit with ``NOPERM``.

An application user is one allowed a limiter command (``+tb.consume``), or
the Lua fallback's user (``+evalsha``); the ``default`` user line is the
admin's and is not applied (it would change the server's password)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Iterator

import pytest
import redis

from tbserver import REPO, Server
from tb_limiter import Limiter, NotSent
from tb_limiter.stream import pace_sync

FROZEN = "1e-12"
FENCE = re.compile(r"^\s*```[a-z]*\n(.*?)^\s*```", re.S | re.M)


def _doc_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("**/*.md")),
             *sorted((REPO / "clients").glob("*/README.md"))]
    return [f for f in files if f.is_file()]


def documented_users() -> list[tuple[str, str, list[str]]]:
    """``(where, name, rules)`` of every application user in the docs."""
    users: list[tuple[str, str, list[str]]] = []
    for path in _doc_files():
        for block in FENCE.findall(path.read_text()):
            lines: list[str] = []
            if '"ACL SETUSER' in block:  # a Python call: adjacent string literals
                tail = block[block.index('"ACL SETUSER') :]
                tail = tail[: tail.index(")")]
                lines.append("".join(re.findall(r'"([^"]*)"', tail)).removeprefix("ACL SETUSER "))
            for m in re.finditer(r"^.*redis-cli .*ACL SETUSER (.+)$", block, re.M):  # a shell line
                lines.append(" ".join(shlex.split(m.group(1))))
            lines += [m.group(1) for m in re.finditer(r"^\s*user (.+)$", block, re.M)]
            for line in lines:
                name, *rules = line.split()
                if name != "default" and ("+tb.consume" in rules or "+evalsha" in rules):
                    users.append((f"{path.relative_to(REPO)}:{name}", name, rules))
    return users


USERS = documented_users()


def test_the_docs_give_application_users() -> None:
    names = {name for _, name, _ in USERS}
    assert "limiter" in names, f"no application user found in {[str(f) for f in _doc_files()]}"
    assert any("+evalsha" in rules for _, _, rules in USERS), "the Lua fallback's user"


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[bool, Server]]:
    s = {True: Server(with_module=True), False: Server(with_module=False)}
    yield s
    for server in s.values():
        server.stop()


@pytest.mark.parametrize("where,name,rules", USERS, ids=[u[0] for u in USERS])
def test_each_documented_user_runs_each_recipe(
    servers: dict[bool, Server], where: str, name: str, rules: list[str]
) -> None:
    server = servers["+evalsha" not in rules]
    admin = server.client()
    admin.flushall()
    admin.execute_command("ACL", "SETUSER", name, "reset", *rules)
    password = next(r[1:] for r in rules if r.startswith(">"))
    client = redis.Redis(host="127.0.0.1", port=server.port, username=name, password=password)
    lim = Limiter(client)
    try:
        # A slow refill: a full bucket's key expires, and info() must find it.
        b = lim.bucket("rl:alice", "1/m", 5)
        assert b.consume().allowed
        assert b.acquire(timeout=1).allowed
        assert b.refund(1) is not None
        assert b.info() is not None
        inflight = lim.bucket("rl:{u}:inflight", 0, 1)
        with inflight.lease(ttl=60) as slot:
            assert slot.id
        assert slot.released == 1, "released on exit"
        tpm = lim.bucket("rl:{u}:tpm", FROZEN, 1000)
        with tpm.lease(300, ttl=60) as est:
            est.used = 200
        assert est.released == 100, "settled on exit"
        rpm = lim.bucket("rl:{u}:rpm", FROZEN, 60)
        with lim.lease_many([(rpm, 1), (tpm, 100), (inflight, 1)], ttl={1: 60, 2: 60}) as held:
            held.used[1] = 50
        assert held.released == [None, 50, 1]
        with pytest.raises(NotSent):
            with lim.lease_many([(rpm, 1), (tpm, 100), (inflight, 1)], ttl={1: 60, 2: 60}):
                raise NotSent()
        with pytest.raises(TimeoutError):
            with tpm.lease(100, ttl=60):
                raise TimeoutError()
        # Waiting in a flow (fair share): queued on the server, or polled on
        # the Lua fallback; a multi-bucket wait too.
        shared = lim.bucket("rl:shared", 20, 1)
        assert shared.acquire(timeout=2, flow="tenant-a", weight=2).allowed
        assert shared.acquire(timeout=2, flow="tenant-b").allowed
        assert lim.acquire_many([(rpm, 1), (tpm, 10)], timeout=2, flow="tenant-a").allowed
        with inflight.lease(ttl=60, timeout=2, flow="tenant-b"):
            pass
        with lim.bucket("rl:hot", 1000, 1000).batched(10) as local:
            assert local.consume() is not None
        assert b"".join(pace_sync([b"x" * 300], lim.bucket("rl:bytes", 10_000, 1000), chunk=100)) == b"x" * 300
    finally:
        client.close()
