"""What a lease keeps and gives back when its body fails (issue 18 item 1):
an exception keeps the token estimate charged and the in-flight slot held
(the call may have reached the provider and still be running); only
:class:`NotSent`, a ``return_on`` type or ``give_back()`` return everything;
a cancellation while still waiting for the lease holds nothing; at expiry an
estimate stays used (``KEEP``) and a slot comes back."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, AsyncIterator, Iterator

import pytest
import redis.asyncio as aredis

from tbserver import Server
from tb_limiter import AsyncLimiter, Limiter, NotSent

FROZEN = "1e-12"


def _level(bucket: Any) -> float:
    info = bucket.info()
    return float(bucket.capacity if info is None else info.tokens)


def test_an_exception_keeps_the_estimate_and_holds_the_slot(limiter: Limiter) -> None:
    tpm = limiter.bucket("{e}:tpm", FROZEN, 1000)
    inflight = limiter.bucket("{e}:inflight", 0, 2)
    with pytest.raises(TimeoutError):
        with limiter.lease_many([(tpm, 300), (inflight, 1)], ttl={0: 60, 1: 60}) as held:
            raise TimeoutError("the provider may still be processing it")
    assert held.released[0] == 0, "the estimate is settled to itself: nothing comes back"
    assert held.released[1] is None, "the slot is not released"
    assert _level(tpm) == 700
    assert _level(inflight) == 1, "the slot stays held until its TTL"
    assert held.result is not None and tpm.settle(held.result.lease_ids[0], 300) is None, "settled once already"


def test_an_exception_settles_to_the_use_reported(limiter: Limiter) -> None:
    tpm = limiter.bucket("u:tpm", FROZEN, 1000)
    with pytest.raises(ValueError):
        with tpm.lease(300, ttl=60) as held:
            held.used = 450
            raise ValueError("the reply could not be parsed")
    assert held.released == -150
    assert _level(tpm) == 550


def test_a_single_slot_is_held_on_an_exception(limiter: Limiter) -> None:
    inflight = limiter.bucket("s:inflight", 0, 1)
    with pytest.raises(KeyError):
        with inflight.lease(ttl=60):
            raise KeyError("boom")
    assert not inflight.consume().allowed, "held until its TTL: the call may still run"


def test_not_sent_gives_everything_back(limiter: Limiter) -> None:
    rpm = limiter.bucket("{n}:rpm", FROZEN, 10)
    tpm = limiter.bucket("{n}:tpm", FROZEN, 1000)
    inflight = limiter.bucket("{n}:inflight", 0, 1)
    with pytest.raises(NotSent):
        with limiter.lease_many([(rpm, 1), (tpm, 300), (inflight, 1)], ttl={1: 60, 2: 60}):
            try:
                raise ConnectionRefusedError("nothing listens")
            except ConnectionRefusedError as e:
                raise NotSent() from e
    assert (_level(rpm), _level(tpm), _level(inflight)) == (10, 1000, 1)


def test_return_on_and_give_back(limiter: Limiter) -> None:
    tpm = limiter.bucket("r:tpm", FROZEN, 1000)
    inflight = limiter.bucket("r:inflight", 0, 1)
    with pytest.raises(ConnectionRefusedError):
        with inflight.lease(ttl=60, return_on=(ConnectionRefusedError,)):
            raise ConnectionRefusedError()
    assert _level(inflight) == 1, "a return_on type gives the slot back"
    with pytest.raises(OSError):
        with tpm.lease(300, ttl=60, return_on=ConnectionRefusedError):
            raise OSError("not in return_on: kept")
    assert _level(tpm) == 700
    with tpm.lease(200, ttl=60) as held:
        assert held.give_back() == 200
        assert _level(tpm) == 700
        raise_nothing = held.give_back()
    assert raise_nothing is None and held.released == 200, "given back once; the exit does nothing more"
    with limiter.lease_many([(tpm, 100), (inflight, 1)], ttl={0: 60, 1: 60}) as many:
        assert many.give_back() == [100, 1]
    assert (_level(tpm), _level(inflight)) == (700, 1)


def test_at_expiry_an_estimate_stays_used_and_a_slot_comes_back(limiter: Limiter) -> None:
    tpm = limiter.bucket("{x}:tpm", FROZEN, 1000)
    inflight = limiter.bucket("{x}:inflight", 0, 1)
    # As a process that died holding them: entered, never exited.
    limiter.lease_many([(tpm, 300), (inflight, 1)], ttl={0: 0.2, 1: 0.2}).__enter__()
    time.sleep(0.3)
    assert (_level(tpm), _level(inflight)) == (700, 1)


@pytest.fixture
async def alimiter(server: Server) -> AsyncIterator[AsyncLimiter]:
    client = aredis.Redis(host="127.0.0.1", port=server.port)
    lim = AsyncLimiter(client)
    yield lim
    await lim.aclose()
    await client.aclose()


async def test_async_cancelled_body_keeps_and_waiting_holds_nothing(alimiter: AsyncLimiter) -> None:
    tpm = alimiter.bucket("{c}:tpm", FROZEN, 1000)
    inflight = alimiter.bucket("{c}:inflight", 0, 1)
    entered = asyncio.Event()

    async def caller() -> None:
        async with alimiter.lease_many([(tpm, 300), (inflight, 1)], ttl={0: 60, 1: 60}):
            entered.set()
            await asyncio.Event().wait()

    first = asyncio.ensure_future(caller())
    await entered.wait()
    waiting = asyncio.ensure_future(caller())
    await asyncio.sleep(0.05)
    waiting.cancel()
    first.cancel()
    for task in (first, waiting):
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0.05)
    info = await tpm.info()
    assert info is not None and info.tokens == 700, "the running call's estimate is kept, the waiter took nothing"
    assert not (await inflight.consume()).allowed, "the running call's slot is held"
    async with alimiter.lease_many([(tpm, 100)], ttl={0: 60}, return_on=KeyError) as many:
        pass
    assert many.released == [100], "a normal exit without a use reported releases the estimate whole"
    with pytest.raises(NotSent):
        async with tpm.lease(100, ttl=60):
            raise NotSent()
    info = await tpm.info()
    assert info is not None and info.tokens == 700


# The scenario: an LLM API that takes 1 s, called with a 0.5 s HTTP
# timeout, under TPM 6000/m (capacity 2000) and 4 in flight.
API_SECONDS = 1.0
HTTP_TIMEOUT = 0.5
RATE, CAPACITY, INFLIGHT, ESTIMATE = 100, 2000, 4, 200
RUN_SECONDS = 10.0
WORKERS = 8
#: Longer than a call may run (the API takes 1 s): the slot of a call that
#: timed out on the client is held that long.
SLOT_TTL = 1.5


class FakeApi:
    """A real HTTP server on loopback that bills every request it receives
    (the JSON body's ``tokens``) whether or not its caller still waits, and
    counts the calls in flight."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.arrivals: list[tuple[float, int]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.delays: list[float] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                now = time.monotonic()
                with api.lock:
                    api.arrivals.append((now, int(body["tokens"])))
                    api.delays.append(now - float(body["granted_at"]))
                    api.in_flight += 1
                    api.max_in_flight = max(api.max_in_flight, api.in_flight)
                try:
                    time.sleep(API_SECONDS)
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the caller hung up: billed all the same
                finally:
                    with api.lock:
                        api.in_flight -= 1

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/chat"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[FakeApi]:
    a = FakeApi()
    yield a
    a.close()


@pytest.mark.parametrize("server", ["module"], indirect=True)
def test_timeouts_never_push_the_api_past_the_limits(limiter: Limiter, api: FakeApi) -> None:
    tpm = limiter.bucket("{llm}:tpm", "6000/m", CAPACITY)
    inflight = limiter.bucket("{llm}:inflight", 0, INFLIGHT)
    stop = time.monotonic() + RUN_SECONDS
    timeouts = [0]

    def worker() -> None:
        while time.monotonic() < stop:
            try:
                with limiter.lease_many([(tpm, ESTIMATE), (inflight, 1)], ttl={0: 60, 1: SLOT_TTL}, timeout=0.5) as held:
                    body = json.dumps({"tokens": ESTIMATE, "granted_at": time.monotonic()}).encode()
                    req = urllib.request.Request(api.url, data=body, headers={"Content-Type": "application/json"})
                    urllib.request.urlopen(req, timeout=HTTP_TIMEOUT).read()
                    held.used[0] = ESTIMATE
            except OSError:  # the HTTP timeout (socket.timeout/URLError are OSErrors)
                timeouts[0] += 1
            except Exception:  # noqa: BLE001 (RateLimited: try again until the run ends)
                pass

    threads = [threading.Thread(target=worker) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(API_SECONDS + 0.2)  # let the calls still running arrive and finish

    arrivals = sorted(api.arrivals)
    assert arrivals and timeouts[0] > 0, "the scenario must time out calls"
    # A token is taken before its request arrives: an arrival at t was
    # taken at t - delay at most, so a window of arrivals [t1, t2] was taken
    # within [t1 - d, t2], plus the module clock's 1 ms (whole ms on Redis
    # 7.0). Use == estimate: no overrun term.
    d = max(api.delays) + 0.001
    worst = 0.0
    for i, (t1, _) in enumerate(arrivals):
        seen = 0
        for t2, tokens in arrivals[i:]:
            seen += tokens
            excess = seen - (CAPACITY + RATE * (t2 - t1 + d))
            worst = max(worst, excess)
    total = sum(tok for _, tok in arrivals)
    bound = CAPACITY + RATE * (arrivals[-1][0] - arrivals[0][0] + d)
    print(f"API saw {total} tokens (bound {bound:.0f}), {api.max_in_flight} in flight at most, "
          f"{timeouts[0]} timeouts, grant-to-arrival delay <= {d * 1000:.1f} ms")
    assert worst <= 0, f"some window saw {worst:.0f} tokens above capacity + rate*T (total {total}, bound {bound:.0f})"
    assert api.max_in_flight <= INFLIGHT, f"{api.max_in_flight} calls in flight against a limit of {INFLIGHT}"
