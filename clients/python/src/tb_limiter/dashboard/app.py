"""The dashboard's web app (Starlette): the page, its JSON, and ``/metrics``.

Routes:

- ``/``: the page (static HTML and JavaScript; charts drawn by Plotly.js,
  served from the ``plotly`` package, so nothing is fetched from the
  internet);
- ``/api/snapshot``: the latest reading as JSON (what the page polls);
- ``/metrics``: the same figures in the Prometheus text format;
- ``/healthz``: ``ok`` once there is a reading, 503 before.

Every request must name an allowed host in its ``Host`` header (loopback
names and addresses, the address served on, and hosts added with
``--allow-host``); others get 400. This keeps a web page whose DNS name
was rebound to the dashboard's address (DNS rebinding) from reading it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import threading
from importlib import resources
from pathlib import Path
from typing import AsyncIterator, Iterable, Optional

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from .metrics import registry
from .sampler import Sampler

STATIC = Path(__file__).parent / "static"


def plotly_js() -> Path:
    """Plotly.js as the ``plotly`` package ships it."""
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise RuntimeError("plotly.min.js not found in the plotly package: pip install 'tb-limiter[dashboard]'")
    return path


#: Bind addresses that mean every interface: not a name a client uses.
WILDCARDS = ("", "0.0.0.0", "::")


def host_name(header: str) -> str:
    """The host of a ``Host`` header, without its port, lower case, without
    a trailing dot (``[::1]:8000`` -> ``::1``)."""
    h = header.strip().lower()
    if h.startswith("["):
        h = h[1 : h.find("]")] if "]" in h else ""
    elif h.count(":") == 1:
        h = h.partition(":")[0]
    return h.rstrip(".")


def is_loopback(host: str) -> bool:
    """``localhost`` (and names under it) or a loopback address."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class HostCheck:
    """ASGI middleware: 400 unless the ``Host`` header names a loopback
    host or one of ``allowed`` (compared without port, case or trailing
    dot)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = {host_name(h) for h in allowed if host_name(h) not in WILDCARDS}

    def allows(self, header: Optional[str]) -> bool:
        if header is None:
            return False
        h = host_name(header)
        return is_loopback(h) or h in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            header = dict(scope["headers"]).get(b"host")
            if not self.allows(None if header is None else header.decode("latin-1")):
                await PlainTextResponse("host not allowed\n", status_code=400)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    sampler: Sampler, *, metrics_top_keys: int = 10, poll: bool = True, allowed_hosts: Iterable[str] = ()
) -> Starlette:
    """The ASGI app; with ``poll``, it reads the source once at start-up,
    then a thread reads it every ``sampler.interval`` seconds while the app
    runs. It answers requests whose ``Host`` is a loopback name or address
    or one of ``allowed_hosts`` (see :class:`HostCheck`), 400 others."""
    reg = registry(sampler, metrics_top_keys)
    js = plotly_js()

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    async def plotly(request: Request) -> Response:
        return FileResponse(js, media_type="text/javascript")

    async def snapshot(request: Request) -> Response:
        return JSONResponse(sampler.snapshot(), headers={"Cache-Control": "no-store"})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> Response:
        snap = sampler.snapshot()
        if not snap.get("ready"):
            return PlainTextResponse("no reading yet\n", status_code=503)
        return PlainTextResponse("ok\n")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        stop = threading.Event()
        thread = None
        if poll:
            # One reading before serving: the page and /metrics have figures
            # from the start (a node's error is part of the reading).
            sampler.poll_safely()
            thread = threading.Thread(target=sampler.run, args=(stop,), name="tb-dashboard-poll", daemon=True)
            thread.start()
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join(timeout=10)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/static/plotly.min.js", plotly),
            Route("/api/snapshot", snapshot),
            Route("/metrics", metrics),
            Route("/healthz", healthz),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        middleware=[Middleware(HostCheck, allowed=list(allowed_hosts)), Middleware(GZipMiddleware, minimum_size=1024)],
        lifespan=lifespan,
    )
