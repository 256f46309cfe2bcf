"""Every method on redis-py's cluster clients (``redis.cluster.RedisCluster``
and ``redis.asyncio.cluster.RedisCluster``), on a real three-master,
three-replica cluster: with the module on every node, and without it (the
Lua fallback)."""

from __future__ import annotations

import asyncio
import time
from typing import Iterator

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from tbcluster import Cluster
from tb_limiter import AsyncLimiter, Limiter, MultiResult, RateLimited, Result
from tb_limiter.stream import pace_sync

FROZEN = "1e-12"
#: Keys on every master: their slots fall in each third of the slot range.
KEYS = ["rl:a", "rl:b", "rl:c", "rl:d", "rl:e", "rl:f"]


@pytest.fixture(scope="module", params=["module", "lua"])
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    c = Cluster(with_module=request.param == "module")
    c.backend = request.param  # type: ignore[attr-defined]
    yield c
    c.stop()


@pytest.fixture
def limiter(cluster: Cluster) -> Iterator[Limiter]:
    cluster.flushall()
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    yield Limiter(rc)
    rc.close()


def test_keys_spread_over_the_masters(cluster: Cluster) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    owners = {rc.get_node_from_key(k).port for k in KEYS}
    rc.close()
    assert len(owners) == 3, "the test keys live on all three masters"


def test_every_method(cluster: Cluster, limiter: Limiter) -> None:
    for key in KEYS:
        # A full bucket has no key (info and refund answer None), and this
        # one fills 400 ms after the last call that took its last token:
        # info and refund come right after such calls.
        b = limiter.bucket(key, 5, 2)
        assert b.consume() == Result(True, 1, 0, 200, 1)
        assert b.peek().allowed
        assert b.reserve().allowed
        r = b.acquire(timeout=1)
        assert r.allowed and r.retry_after_ms > 0
        info = b.info()
        assert info is not None and info.capacity == 2
        with b.limit(timeout=1):
            pass
        assert b.refund(1) is not None
    assert limiter.backend == cluster.backend  # type: ignore[attr-defined]


def test_many_needs_one_slot(limiter: Limiter) -> None:
    rpm = limiter.bucket("{acme}:rpm", FROZEN, 3)
    tpm = limiter.bucket("{acme}:tpm", FROZEN, 1000)
    assert limiter.consume_many([(rpm, 1), (tpm, 600)]) == MultiResult(True, 0, (2, 400))
    assert limiter.acquire_many([(rpm, 1), (tpm, 100)], timeout=1).allowed
    # A shared partial grant (ATMOST MIN chunk) over a user's and a global
    # byte cap in one slot, and a byte stream paced through both.
    user = limiter.bucket("{acme}:user-bytes", FROZEN, 5000)
    glob = limiter.bucket("{acme}:global-bytes", FROZEN, 700)
    shared = limiter.consume_many([(user, 1000), (glob, 1000)], atmost=True, chunk=500)
    assert shared == MultiResult(True, 0, (4300, 0), 700)
    assert sum(len(p) for p in pace_sync([b"x" * 300], user, limiter.bucket("{acme}:g2", FROZEN, 1000),
                                         chunk=100)) == 300
    group = limiter.limits("rl:alice", "5/second;100/day")
    assert group.acquire().allowed and group.consume().allowed
    assert [b.info() is not None for b in group.buckets] == [True, True]
    # Keys in different slots: redis-py refuses to send the command, and
    # nothing is taken.
    a, b = limiter.bucket("rl:a", FROZEN, 5), limiter.bucket("rl:b", FROZEN, 5)
    with pytest.raises(RedisClusterException, match="all keys must map to the same key slot"):
        limiter.consume_many([(a, 1), (b, 1)])
    assert a.info() is None and b.info() is None


def test_acquire_waits_on_the_client(limiter: Limiter) -> None:
    b = limiter.bucket("rl:wait", 10, 1)
    b.consume()
    start = time.monotonic()
    r = b.acquire(timeout=1)
    assert r.allowed and time.monotonic() - start >= r.retry_after - 0.005
    with pytest.raises(RateLimited):
        limiter.bucket("rl:never", 1, 1).acquire(2)


def test_no_server_side_wait_on_a_cluster(cluster: Cluster) -> None:
    rc = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    with pytest.raises(TypeError, match="single-node"):
        Limiter(rc, blocking_client=cluster.nodes[0].client())
    rc.close()


def test_from_url(cluster: Cluster) -> None:
    cluster.flushall()
    with Limiter.from_url(cluster.url, cluster=True) as lim:
        assert lim.bucket("rl:url", 1, 1).consume().allowed
        assert isinstance(lim.client, RedisCluster)


async def test_every_method_async(cluster: Cluster) -> None:
    cluster.flushall()
    rc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    lim = AsyncLimiter(rc)
    for key in KEYS:
        b = lim.bucket(key, 5, 2)  # as in test_every_method
        assert await b.consume() == Result(True, 1, 0, 200, 1)
        assert (await b.peek()).allowed
        assert (await b.reserve()).allowed
        assert (await b.acquire(timeout=1)).allowed
        assert await b.info() is not None
        async with b.limit(timeout=1):
            pass
        assert await b.refund(1) is not None
    rpm = lim.bucket("{acme}:rpm", FROZEN, 3)
    tpm = lim.bucket("{acme}:tpm", FROZEN, 1000)
    assert await lim.consume_many([(rpm, 1), (tpm, 600)]) == MultiResult(True, 0, (2, 400))
    assert (await lim.acquire_many([(rpm, 1), (tpm, 100)], timeout=1)).allowed
    assert (await lim.limits("rl:bob", "5/second;100/day").acquire()).allowed
    assert lim.backend == cluster.backend  # type: ignore[attr-defined]
    await lim.aclose()
    await rc.aclose()


def _getkeys_calls(cluster: Cluster) -> int:
    """``COMMAND GETKEYS`` calls the nodes have served since their last
    ``CONFIG RESETSTAT``."""
    total = 0
    for node in cluster.nodes:
        stats = node.client().info("commandstats")
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


def _reset_stats(cluster: Cluster) -> None:
    for node in cluster.nodes:
        node.client().config_resetstat()


async def test_fresh_async_clients_take_concurrent_first_calls(cluster: Cluster) -> None:
    """Issue 19: redis-py 8.1's async cluster client failed 2-17 concurrent
    first calls of a fresh client (``'NoneType' object has no attribute
    'writelines'``), and asked ``COMMAND GETKEYS`` before every
    TB.MCONSUME. Fresh clients, 30 to 80 concurrent first calls, rounds."""
    cluster.flushall()
    _reset_stats(cluster)
    failures: list[BaseException] = []
    calls = 0
    for rnd, n in enumerate([30, 80, 50, 60, 40]):
        if rnd % 2:
            lim = AsyncLimiter.from_url(cluster.url, cluster=True)
        else:
            lim = AsyncLimiter(AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[rnd % 3].port))

        async def first_call(i: int) -> bool:
            if i % 3 == 0:
                return (await lim.bucket(f"rl:{rnd}:{i}", 5, 2).consume()).allowed
            if i % 3 == 1:
                return (await lim.limits(f"rl:{rnd}:{i}", "5/second;100/day").consume()).allowed
            tpm = lim.bucket(f"{{t{rnd}:{i}}}:tpm", FROZEN, 1000)
            slot = lim.bucket(f"{{t{rnd}:{i}}}:slot", 0, 1)
            async with lim.lease_many([(tpm, 10), (slot, 1)], ttl={0: 60, 1: 60}) as held:
                held.used[0] = 5
            return True

        results = await asyncio.gather(*(first_call(i) for i in range(n)), return_exceptions=True)
        failures += [r for r in results if isinstance(r, BaseException)]
        assert all(r is True for r in results if not isinstance(r, BaseException))
        calls += n
        await lim.aclose()
        if rnd % 2 == 0:
            await lim.client.aclose()
    assert not failures, f"{len(failures)} of {calls} first calls failed: {failures[:3]!r}"
    if cluster.backend == "module":  # type: ignore[attr-defined]
        assert _getkeys_calls(cluster) == 0, "TB.MCONSUME is routed by its first key's slot"


def test_sync_mconsume_needs_no_getkeys(cluster: Cluster, limiter: Limiter) -> None:
    _reset_stats(cluster)
    for i in range(20):
        assert limiter.limits(f"rl:s{i}", "5/second;100/day").consume().allowed
        tpm = limiter.bucket(f"{{s{i}}}:tpm", FROZEN, 1000)
        with limiter.lease_many([(tpm, 10)], ttl={0: 60}):
            pass
    assert _getkeys_calls(cluster) == 0


def test_flow_waits_on_the_primary_of_its_key(cluster: Cluster, limiter: Limiter) -> None:
    """A call in a flow waits on the server that holds its key (the module:
    visible in TB.INFO there), or polls (the Lua fallback); sync and async."""
    import threading

    from tb_limiter import FlowInfo

    module = cluster.backend == "module"  # type: ignore[attr-defined]
    for key in KEYS:
        b = limiter.bucket(key, "0.5", 1)
        b.consume()
        got: list[Result] = []
        t = threading.Thread(target=lambda: got.append(b.acquire(timeout=5, flow="tenant", weight=2)))
        t.start()
        deadline = time.monotonic() + 5
        while module:
            info = b.info()
            if info is not None and info.waiting == 1:
                assert info.flows == (FlowInfo("tenant", 2, 1),)
                break
            assert time.monotonic() < deadline, f"no call waiting on {key}"
            time.sleep(0.01)
        t.join(5)
        assert got and got[0].allowed
    group = [limiter.bucket("{acme}:f1", 20, 1), limiter.bucket("{acme}:f2", 20, 1)]
    assert limiter.acquire_many([(x, 1) for x in group], timeout=2, flow="t").allowed
    assert limiter.acquire_many([(x, 1) for x in group], timeout=2, flow="t").allowed

    async def main() -> None:
        arc = AsyncRedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
        alim = AsyncLimiter(arc)
        for key in KEYS:
            ab = alim.bucket(key + ":async", 20, 1)
            assert (await ab.acquire(timeout=2, flow="t")).allowed
            started = time.monotonic()
            assert (await ab.acquire(timeout=2, flow="t", weight=3)).allowed
            assert time.monotonic() - started >= 0.03, "the second call waited for the refill"
        await arc.aclose()

    asyncio.run(main())
