"""A stand-in for an LLM API with a published rate limit, on 127.0.0.1.

It publishes "``rate`` calls per second, burst 1" (limits count when calls
start; a completion takes ``latency`` seconds) and enforces it the strict
way: a call that arrives less than ``1 / rate`` seconds after the previous
accepted call gets 429. It records every arrival (``calls``: time, prompt,
accepted), so a test can show the fleet-wide rate held.

Tolerance: the limiter grants calls exactly ``1 / rate`` seconds apart on the
Redis server's clock, to the millisecond (the module reads a millisecond
clock on Redis 7.0, and waits are replied in whole milliseconds, rounded
up). Each call then goes through a worker process waking up from its sleep
and an HTTP request before it arrives here: that takes a few milliseconds
more or less from call to call, and tens of milliseconds on a 2-core machine
busy with other builds (one run saw a call arrive 27 ms late, so the next,
on time, came 1.973 s after it). The API accepts ``TOLERANCE`` (50 ms,
2.5% of the 2 s interval) of such jitter; a call made without a token comes
a whole interval early, or more. Whether each call started at or after its
token was due is checked exactly, on the worker's side, by the tests.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOLERANCE = 0.050


class FakeLLM:
    """Start with :meth:`start`, stop with :meth:`stop`; ``url`` is its address."""

    def __init__(self, rate: float, *, latency: float = 0.0, port: int = 0) -> None:
        self.interval = 1.0 / rate
        self.latency = latency  # seconds a completion takes, like a real LLM
        self.lock = threading.Lock()
        self.arrivals: list[float] = []  # wall-clock times of accepted calls
        self.calls: list[dict[str, Any]] = []  # every call: at, prompt, ok
        self.rejected = 0
        self._last: float | None = None
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                now = time.time()
                length = int(self.headers.get("Content-Length") or 0)
                prompt = json.loads(self.rfile.read(length) or b"{}").get("prompt", "")
                ok, wait = api._admit(now, prompt)
                if ok:
                    time.sleep(api.latency)
                    self._send(200, {"text": f"summary of {prompt!r}"})
                else:
                    self._send(429, {"error": "rate limit exceeded"}, {"Retry-After": str(max(1, round(wait)))})

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, api.stats())

            def _send(self, code: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _admit(self, now: float, prompt: str) -> tuple[bool, float]:
        with self.lock:
            ok = self._last is None or now - self._last >= self.interval - TOLERANCE
            self.calls.append({"at": now, "prompt": prompt, "ok": ok})
            if not ok:
                assert self._last is not None
                self.rejected += 1
                return False, self.interval - (now - self._last)
            self._last = now
            self.arrivals.append(now)
            return True, 0.0

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"accepted": len(self.arrivals), "rejected": self.rejected, "arrivals": list(self.arrivals),
                    "calls": list(self.calls)}

    def start(self) -> "FakeLLM":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
