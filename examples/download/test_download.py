"""The download server, for real over loopback: parallel downloads, each
measured from request to last byte, must run within 10% of the configured
rate. The rates are smaller than the example's 10 and 50 MB/s (2 and
8 MB/s) to keep the test short and steady on a loaded 2-core machine; each
download lasts about 3 s, so the initial burst (a tenth of a second of the
rate) adds about 3%."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import uvicorn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from downloads import Config, create_app  # noqa: E402
from tbserver import Server, free_port  # noqa: E402

MB = 1_000_000
SECONDS = 3.0
USERS = {"alice": "normal", "bob": "premium", "carol": "premium"}
TIERS = {"normal": 2 * MB, "premium": 8 * MB}
START_DEADLINE = 15.0


class Uvicorn:
    """The app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app: object) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_DEADLINE
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def serve(module_server: Server) -> Iterator[object]:
    servers: list[Uvicorn] = []

    def start(global_rate: int | None) -> str:
        module_server.client().flushall()
        s = Uvicorn(create_app(module_server.url, Config(TIERS, USERS, global_rate)))
        servers.append(s)
        return f"http://127.0.0.1:{s.port}"

    yield start
    for s in servers:
        s.stop()


def download_all(base: str, sizes: dict[str, int]) -> dict[str, tuple[int, float]]:
    """Downloads in parallel, one thread per user: (bytes, seconds) each."""
    out: dict[str, tuple[int, float]] = {}
    barrier = threading.Barrier(len(sizes))

    def one(user: str, size: int) -> None:
        with httpx.Client(timeout=60) as c:
            barrier.wait()
            start = time.monotonic()
            got = 0
            with c.stream("GET", f"{base}/files/{size}", headers={"X-User": user}) as r:
                r.raise_for_status()
                for chunk in r.iter_bytes():
                    got += len(chunk)
            out[user] = (got, time.monotonic() - start)

    threads = [threading.Thread(target=one, args=item) for item in sizes.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(out) == len(sizes), "a download failed"
    return out


def within_10_percent(measured: float, configured: float) -> bool:
    return abs(measured - configured) <= 0.10 * configured


@pytest.mark.parametrize("global_rate", [None, 20 * MB], ids=["per-user-atmost", "with-global-mconsume"])
def test_each_user_gets_their_rate(serve: object, global_rate: int | None) -> None:
    base = serve(global_rate)  # type: ignore[operator]
    sizes = {u: int(TIERS[USERS[u]] * SECONDS) for u in ("alice", "bob")}
    result = download_all(base, sizes)
    for user, (got, secs) in result.items():
        rate = TIERS[USERS[user]]
        assert got == sizes[user]
        print(f"{user}: {got / secs / MB:.3f} MB/s (configured {rate / MB} MB/s)")
        assert within_10_percent(got / secs, rate), f"{user}: {got / secs / MB:.2f} MB/s, configured {rate / MB} MB/s"


def test_global_cap_holds_across_users(serve: object) -> None:
    global_rate = 10 * MB  # below the 16 MB/s that bob and carol could take
    base = serve(global_rate)  # type: ignore[operator]
    size = int(global_rate * SECONDS / 2)
    result = download_all(base, {"bob": size, "carol": size})
    total = sum(got for got, _ in result.values())
    secs = max(s for _, s in result.values())
    print(f"global: {total / secs / MB:.3f} MB/s (cap {global_rate / MB} MB/s)")
    assert within_10_percent(total / secs, global_rate), f"{total / secs / MB:.2f} MB/s in all"
    # first come, first served: neither premium user starves the other
    for user, (got, s) in result.items():
        assert s <= secs and got / s >= 0.35 * global_rate, f"{user}: {got / s / MB:.2f} MB/s"
