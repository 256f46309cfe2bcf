"""Fork safety: a Limiter made (and used) in a parent process works in forked
children, each on its own connection, and the parent's connection survives."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

from tbserver import Server
from tb_limiter import Limiter

FROZEN = "1e-12"


def _child(lim: Limiter, parent_client_id: int, out: "mp.Queue[tuple[int, int, bool]]") -> None:
    r = lim.bucket("fork", FROZEN, 100).consume()
    out.put((os.getpid(), int(lim.client.client_id()), r.allowed and parent_client_id > 0))


@pytest.mark.parametrize("how", ["from_url", "client passed in"])
def test_limiter_survives_fork(server: Server, how: str) -> None:
    """from_url makes a client per process; a redis.Redis passed in is used
    as is, and redis-py's pool opens new connections in a forked child."""
    workers = 4
    lim = Limiter.from_url(server.url) if how == "from_url" else Limiter(server.client())
    bucket = lim.bucket("fork", FROZEN, 100)
    assert bucket.consume().allowed  # the parent connects before forking
    parent_id = int(lim.client.client_id())
    ctx = mp.get_context("fork")
    out: "mp.Queue[tuple[int, int, bool]]" = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(lim, parent_id, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=20) for _ in procs]
    for p in procs:
        p.join(20)
        assert p.exitcode == 0
    pids = {pid for pid, _, _ in results}
    ids = {cid for _, cid, _ in results}
    assert len(pids) == workers and os.getpid() not in pids
    assert len(ids) == workers and parent_id not in ids, "each process has its own connection"
    assert all(ok for _, _, ok in results)
    # the parent's connection is still good, and every consume counted
    assert int(lim.client.client_id()) == parent_id
    assert bucket.consume(0).remaining == 100 - 1 - workers
