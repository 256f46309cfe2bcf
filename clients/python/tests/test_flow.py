"""Fair share (``flow=``, ``weight=``): the calls that wait in a flow are
queued on the server (``BLOCK ms FLOW name [WEIGHT w]``) and a saturated
bucket serves the flows by weight; ``info()`` shows who waits. On the Lua
fallback the flow is ignored (the client polls)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any, Awaitable, Callable

import pytest
import redis
import redis.asyncio as aredis

from tbserver import Server, free_port
from tb_limiter import AsyncLimiter, FlowInfo, Limiter, RateLimited
from tb_limiter._protocol import ERR_FLOW_NAME, ERR_WEIGHT, flow_args

#: Bad flows and weights, with the module's error line (as redis-py shows it).
BAD: list[tuple[Any, Any, str]] = [
    ("", 1, ERR_FLOW_NAME),
    ("x" * 129, 1, ERR_FLOW_NAME),
    ("é" * 65, 1, ERR_FLOW_NAME),  # 130 bytes in UTF-8
    (b"y" * 129, 1, ERR_FLOW_NAME),
    ("a", 0, ERR_WEIGHT),
    ("a", 1_000_001, ERR_WEIGHT),
    ("a", -3, ERR_WEIGHT),
    (None, 2, ERR_WEIGHT),  # a weight without a flow
]


def test_flow_args_as_the_module_takes_them() -> None:
    assert flow_args(None) == ()
    assert flow_args("tenant-a") == ("FLOW", "tenant-a")
    assert flow_args(b"t", 1) == ("FLOW", b"t")
    assert flow_args("t", 3) == ("FLOW", "t", "WEIGHT", "3")
    assert flow_args("x" * 128, 1_000_000) == ("FLOW", "x" * 128, "WEIGHT", "1000000")
    with pytest.raises(TypeError):
        flow_args("t", True)
    with pytest.raises(TypeError):
        flow_args(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("flow,weight,error", BAD)
def test_bad_flow_is_refused_before_any_round_trip(flow: Any, weight: Any, error: str) -> None:
    """Nothing listens on the port: a call that reached the network would
    raise ConnectionError, not the module's error line."""
    lim = Limiter(redis.Redis(port=free_port(), socket_connect_timeout=1), backend="module")
    b = lim.bucket("rl:f", 10, 10)
    calls: list[Callable[[], Any]] = [
        lambda: b.acquire(flow=flow, weight=weight),
        lambda: b.limit(flow=flow, weight=weight),
        lambda: b.lease(ttl=5, flow=flow, weight=weight),
        lambda: lim.acquire_many([(b, 1)], flow=flow, weight=weight),
        lambda: lim.lease_many([(b, 1)], ttl={0: 5}, flow=flow, weight=weight),
        lambda: lim.limits("rl:g", "10/second").acquire(flow=flow, weight=weight),
    ]
    for c in calls:
        with pytest.raises(ValueError) as e:
            c()
        assert str(e.value) == error
    alim = AsyncLimiter(aredis.Redis(port=free_port(), socket_connect_timeout=1), backend="module")
    ab = alim.bucket("rl:f", 10, 10)
    acalls: list[Callable[[], Any]] = [
        lambda: ab.acquire(flow=flow, weight=weight),
        lambda: ab.limit(flow=flow, weight=weight),
        lambda: ab.lease(ttl=5, flow=flow, weight=weight),
        lambda: alim.acquire_many([(ab, 1)], flow=flow, weight=weight),
        lambda: alim.lease_many([(ab, 1)], ttl={0: 5}, flow=flow, weight=weight),
    ]

    async def main() -> None:
        for c in acalls:
            with pytest.raises(ValueError) as e:
                r = c()
                if isinstance(r, Awaitable):
                    await r
            assert str(e.value) == error

    asyncio.run(main())


@pytest.mark.parametrize("flow,weight,error", [x for x in BAD if x[0] is not None])
def test_client_errors_are_the_module_s(module_server: Server, flow: Any, weight: Any, error: str) -> None:
    r = module_server.client()
    with pytest.raises(redis.ResponseError) as e:
        r.execute_command("TB.CONSUME", "rl:e", 10, 10, 1, "BLOCK", 100, "FLOW", flow, "WEIGHT", weight)
    assert str(e.value) == error
    assert not r.exists("rl:e")


def _waiting(server: Server, key: str) -> int:
    fields = server.client().execute_command("TB.INFO", key) or []
    return int(dict(zip(fields[0::2], fields[1::2])).get(b"waiting", 0))


def test_flow_waits_in_the_server_queue_without_a_blocking_client(module_server: Server) -> None:
    """Without blocking_client a call in a flow still waits on the server
    (on a connection of the limiter's client), visible in TB.INFO, and is
    granted when a token comes."""
    module_server.client().flushall()
    lim = Limiter(module_server.client())
    b = lim.bucket("rl:fq", "0.5", 1)
    b.consume()
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(b.acquire(timeout=5, flow="tenant-a", weight=3)))
    t.start()
    deadline = time.monotonic() + 5
    while _waiting(module_server, "rl:fq") != 1:
        assert time.monotonic() < deadline, "the call never waited in the server's queue"
        time.sleep(0.01)
    info = b.info()
    assert info is not None and info.waiting == 1
    assert info.flows == (FlowInfo("tenant-a", 3, 1),)
    t.join(5)
    assert got and got[0].allowed and got[0].granted == 1
    after = b.info()
    assert after is not None and after.waiting == 0 and after.flows == ()


def test_flow_wait_runs_out_as_rate_limited(module_server: Server) -> None:
    module_server.client().flushall()
    lim = Limiter(module_server.client())
    b = lim.bucket("rl:fo", "0.1", 1)
    b.consume()
    started = time.monotonic()
    with pytest.raises(RateLimited) as e:
        b.acquire(timeout=0.3, flow="a")
    took = time.monotonic() - started
    assert 0.25 <= took < 3, took
    assert not e.value.result.allowed and e.value.result.granted == 0
    assert _waiting(module_server, "rl:fo") == 0
    info = b.info()
    assert info is not None and info.tokens < 1, "a denied call in a flow reserved nothing, took nothing"
    started = time.monotonic()
    with pytest.raises(RateLimited) as never:
        b.acquire(2, timeout=5, flow="a")
    assert never.value.result.never and time.monotonic() - started < 1, "more than the capacity: refused at once"


def test_acquire_many_in_a_flow_waits_without_a_lease(module_server: Server) -> None:
    module_server.client().flushall()
    lim = Limiter(module_server.client())
    rpm = lim.bucket("{fm}rpm", "0.5", 1)
    tpm = lim.bucket("{fm}tpm", 100, 100)
    rpm.consume()
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(lim.acquire_many([(rpm, 1), (tpm, 10)], timeout=5, flow="b")))
    t.start()
    deadline = time.monotonic() + 5
    while _waiting(module_server, "{fm}rpm") != 1:
        assert time.monotonic() < deadline, "TB.MCONSUME in a flow never waited in the queue of the bucket that made it wait"
        time.sleep(0.01)
    info = rpm.info()
    assert info is not None and info.flows == (FlowInfo("b", 1, 1),)
    t.join(5)
    assert got and got[0].allowed and got[0].lease_ids == ()


def test_lease_in_a_flow(module_server: Server) -> None:
    module_server.client().flushall()
    lim = Limiter(module_server.client())
    slot = lim.bucket("rl:fl", 0, 1)
    first = slot.lease(ttl=60)
    first.__enter__()
    seen: list[Any] = []

    def waiter() -> None:
        with slot.lease(ttl=60, timeout=5, flow="batch", weight=2) as held:
            seen.append(held.id)

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 5
    while _waiting(module_server, "rl:fl") != 1:
        assert time.monotonic() < deadline, "the lease never waited in the server's queue"
        time.sleep(0.01)
    info = slot.info()
    assert info is not None and info.flows == (FlowInfo("batch", 2, 1),)
    first.__exit__(None, None, None)
    t.join(5)
    assert seen and seen[0] > 0


def test_lua_fallback_ignores_the_flow(plain_server: Server) -> None:
    plain_server.client().flushall()
    lim = Limiter(plain_server.client())
    b = lim.bucket("rl:lf", 20, 1)
    assert b.acquire(timeout=2, flow="a", weight=5).allowed
    assert lim.backend == "lua"
    assert b.acquire(timeout=2, flow="a").allowed  # polled: the refill comes in 50 ms
    assert lim.acquire_many([(b, 1)], timeout=2, flow=b"b").allowed
    with b.lease(ttl=5, timeout=2, flow="c") as held:
        assert held.id > 0
        info = b.info()
        assert info is not None and info.waiting == 0 and info.flows == ()
    with pytest.raises(ValueError):
        b.acquire(flow="")


def test_async_lua_fallback_ignores_the_flow(plain_server: Server) -> None:
    plain_server.client().flushall()

    async def main() -> None:
        lim = AsyncLimiter(aredis.Redis(port=plain_server.port))
        b = lim.bucket("rl:alf", 20, 1)
        assert (await b.acquire(timeout=2, flow="a", weight=5)).allowed
        assert (await b.acquire(timeout=2, flow="a")).allowed
        assert (await lim.acquire_many([(b, 1)], timeout=2, flow="b")).allowed
        async with b.lease(ttl=5, timeout=2, flow="c") as held:
            assert held.id > 0
        await lim.aclose()

    asyncio.run(main())


# Fair share on a saturated bucket. The module serves the flows by
# start-time fair queueing: while two flows both wait, the normalised grants
# a/wa and b/wb never drift apart by more than one grant of each
# (1/wa + 1/wb); counting over a window of grants adds at most one grant at
# each end. A waiter that is between two calls (its reply read, its next
# call not yet sent) leaves its flow's queue one waiter shorter, never empty
# (each flow has several waiters), so the bound holds while both flows wait.
RATE = 50
WINDOW = 80


def _bound(wa: int, wb: int) -> float:
    """Largest |a/wa - b/wb| over a window while both flows wait."""
    return 2 * (1 / wa + 1 / wb) + 1


def _check_share(order: list[str], wa: int, wb: int) -> tuple[int, int]:
    """The grants of A and B in the window (the first grants skipped, while
    the waiters join), checked against the fair-queueing bound."""
    window = order[10 : 10 + WINDOW]
    assert len(window) == WINDOW, f"only {len(order)} grants"
    c = Counter(window)
    a, b = c["A"], c["B"]
    assert abs(a / wa - b / wb) <= _bound(wa, wb), (a, b, wa, wb)
    return a, b


def _run_threads(server: Server, key: str, wa: int, wb: int, many: int = 12, few: int = 3) -> tuple[list[str], list[FlowInfo]]:
    lim = Limiter(server.client())
    bucket = lim.bucket(key, RATE, 1)
    order: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def loop(flow: str, weight: int) -> None:
        while not stop.is_set():
            try:
                bucket.acquire(timeout=10, flow=flow, weight=weight)
            except RateLimited:
                continue
            with lock:
                order.append(flow)

    threads = [threading.Thread(target=loop, args=("A", wa)) for _ in range(many)]
    threads += [threading.Thread(target=loop, args=("B", wb)) for _ in range(few)]
    for t in threads:
        t.start()
    flows: list[FlowInfo] = []
    deadline = time.monotonic() + 30
    try:
        while len(order) < 10 + WINDOW:
            assert time.monotonic() < deadline, f"only {len(order)} grants in 30 s"
            info = bucket.info()
            if info is not None and len(info.flows) == 2:
                flows = list(info.flows)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(15)
    return order, flows


@pytest.mark.parametrize("wa,wb", [(1, 1), (3, 1)])
def test_saturated_bucket_shares_by_weight(module_server: Server, wa: int, wb: int) -> None:
    module_server.client().flushall()
    order, flows = _run_threads(module_server, f"rl:fair:{wa}", wa, wb)
    a, b = _check_share(order, wa, wb)
    print(f"weights {wa}:{wb}: A {a}, B {b} of {WINDOW} grants (B {b / WINDOW:.0%})")
    assert {(f.name, f.weight) for f in flows} == {("A", wa), ("B", wb)}, flows
    assert all(f.waiting >= 1 for f in flows)


def test_async_saturated_bucket_shares_equally(module_server: Server) -> None:
    module_server.client().flushall()

    async def main() -> list[str]:
        lim = AsyncLimiter(aredis.Redis(port=module_server.port))
        bucket = lim.bucket("rl:afair", RATE, 1)
        order: list[str] = []
        stop = asyncio.Event()

        async def loop(flow: str) -> None:
            while not stop.is_set():
                try:
                    await bucket.acquire(timeout=10, flow=flow)
                except RateLimited:
                    continue
                order.append(flow)

        tasks = [asyncio.ensure_future(loop("A")) for _ in range(12)]
        tasks += [asyncio.ensure_future(loop("B")) for _ in range(3)]
        deadline = time.monotonic() + 30
        seen: set[str] = set()
        while len(order) < 10 + WINDOW:
            assert time.monotonic() < deadline, f"only {len(order)} grants in 30 s"
            info = await bucket.info()
            if info is not None:
                seen |= {f.name for f in info.flows}
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)
        assert seen == {"A", "B"}
        await lim.aclose()
        return order

    order = asyncio.run(main())
    a, b = _check_share(order, 1, 1)
    print(f"async, weights 1:1: A {a}, B {b} of {WINDOW} grants")


def _celery_app() -> Any:
    from celery import Celery

    app = Celery("flowtest", broker="memory://", backend="cache+memory://")
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    return app


def test_celery_task_waits_in_its_tenant_s_flow(module_server: Server) -> None:
    """``rate_limited(..., flow=fn)``: the flow comes from the task's
    arguments; the run waits in it on the server, visible in TB.INFO."""
    from tb_limiter.celery import rate_limited

    module_server.client().flushall()
    app = _celery_app()
    lim = Limiter(module_server.client())
    llm = lim.bucket("rl:celery", "0.5", 1)

    @app.task
    @rate_limited(llm, flow=lambda tenant, prompt: f"tenant:{tenant}", weight=lambda tenant, prompt: 2)
    def complete(tenant: str, prompt: str) -> str:
        return f"{tenant}:{prompt}"

    llm.consume()
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(complete.apply(args=("acme", "hi")).get()))
    t.start()
    deadline = time.monotonic() + 5
    while _waiting(module_server, "rl:celery") != 1:
        assert time.monotonic() < deadline, "the task never waited in its flow on the server"
        time.sleep(0.01)
    info = llm.info()
    assert info is not None and info.flows == (FlowInfo("tenant:acme", 2, 1),)
    t.join(5)
    assert out == ["acme:hi"]
    with pytest.raises(ValueError, match="FLOW takes a name"):
        rate_limited(llm, flow="")


def test_celery_tenants_share_a_saturated_bucket(module_server: Server) -> None:
    """12 runs of tenant A and 3 of tenant B at a time, each looping: B gets
    half the grants (rate_limited), with leased too."""
    from tb_limiter.celery import current_lease, leased, rate_limited

    module_server.client().flushall()
    app = _celery_app()
    lim = Limiter(module_server.client())
    bucket = lim.bucket("rl:cfair", RATE, 1)
    order: list[str] = []
    lock = threading.Lock()

    @app.task
    @rate_limited(bucket, flow=lambda tenant: tenant, max_wait=10)
    def job(tenant: str) -> None:
        with lock:
            order.append(tenant)

    stop = threading.Event()

    def loop(tenant: str) -> None:
        while not stop.is_set():
            job.apply(args=(tenant,)).get()

    threads = [threading.Thread(target=loop, args=("A",)) for _ in range(12)]
    threads += [threading.Thread(target=loop, args=("B",)) for _ in range(3)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 30
    try:
        while len(order) < 10 + WINDOW:
            assert time.monotonic() < deadline, f"only {len(order)} grants in 30 s"
            time.sleep(0.05)
    finally:
        stop.set()
        for th in threads:
            th.join(15)
    a, b = _check_share(order, 1, 1)
    print(f"Celery tasks, tenants 1:1: A {a}, B {b} of {WINDOW} grants")

    slot = lim.bucket("rl:cslot", 0, 1)

    @app.task
    @leased(lim, [(slot, 1)], ttl={0: 60}, flow="tenant:b", max_wait=5)
    def call() -> int:
        held = current_lease()
        assert held is not None and held.result is not None
        return held.result.lease_ids[0]

    first = slot.lease(ttl=60)
    first.__enter__()
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(call.apply().get()))
    t.start()
    deadline = time.monotonic() + 5
    while _waiting(module_server, "rl:cslot") != 1:
        assert time.monotonic() < deadline, "the leased task never waited in its flow"
        time.sleep(0.01)
    info = slot.info()
    assert info is not None and info.flows == (FlowInfo("tenant:b", 1, 1),)
    first.__exit__(None, None, None)
    t.join(5)
    assert got and got[0] > 0


def test_async_cancelled_flow_wait_leaves_the_queue_holding_nothing(module_server: Server) -> None:
    """A task cancelled while it waits in a flow: its connection is dropped,
    so the server takes it out of the queue, and a token given back later
    stays in the bucket (nobody waits for it)."""
    module_server.client().flushall()

    async def main() -> None:
        lim = AsyncLimiter(aredis.Redis(port=module_server.port))
        b = lim.bucket("rl:acancel", "0.01", 1)
        await b.consume()
        task = asyncio.ensure_future(b.acquire(timeout=30, flow="t"))
        deadline = time.monotonic() + 5
        while _waiting(module_server, "rl:acancel") != 1:
            assert time.monotonic() < deadline, "the call never waited in the server's queue"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        while _waiting(module_server, "rl:acancel") != 0:
            assert time.monotonic() < deadline, "the cancelled call stayed in the queue"
            await asyncio.sleep(0.01)
        await b.refund(1)
        assert (await b.consume()).allowed, "the token given back went to nobody else"
        await lim.aclose()

    asyncio.run(main())


def test_fastapi_request_waits_in_its_tenant_s_flow(module_server: Server) -> None:
    """``RateLimit(..., wait=..., flow=fn)``: a request that waits does so in
    its tenant's flow on the server (visible in TB.INFO), then is served."""
    import httpx
    from fastapi import Depends, FastAPI

    from tb_limiter.fastapi import RateLimit

    module_server.client().flushall()
    key = "rl:shared:{rl:shared}:1/2s"  # tb_limiter._spec.group_key("rl:shared", 1 per 2 seconds)

    async def main() -> None:
        limiter = AsyncLimiter(aredis.Redis(port=module_server.port))
        shared = RateLimit(limiter, "1 per 2 seconds", key=lambda request: "shared", wait=10,
                           flow=lambda request: request.headers["X-Tenant"], weight=lambda request: 2)
        app = FastAPI()

        @app.get("/work", dependencies=[Depends(shared)])
        async def work() -> dict[str, bool]:
            return {"ok": True}

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            assert (await http.get("/work", headers={"X-Tenant": "acme"})).status_code == 200
            second = asyncio.ensure_future(http.get("/work", headers={"X-Tenant": "acme"}))
            deadline = time.monotonic() + 5
            while _waiting(module_server, key) != 1:
                assert time.monotonic() < deadline, "the request never waited in its tenant's flow"
                await asyncio.sleep(0.01)
            fields = module_server.client().execute_command("TB.INFO", key)
            flows = dict(zip(fields[0::2], fields[1::2]))[b"waiting_flows"]
            assert flows == [b"acme", 2, 1]
            assert (await asyncio.wait_for(second, 10)).status_code == 200
        await limiter.aclose()
        with pytest.raises(ValueError, match="FLOW takes a name"):
            RateLimit(limiter, "1/second", key=lambda request: "k", wait=1, flow="")

    asyncio.run(main())
