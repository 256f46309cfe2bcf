"""The dashboard's web app (Starlette): the page, its JSON, and ``/metrics``.

Routes:

- ``/``: the page (static HTML and JavaScript; charts drawn by Plotly.js,
  served from the ``plotly`` package, so nothing is fetched from the
  internet);
- ``/api/snapshot``: the latest reading as JSON (what the page polls);
- ``/metrics``: the same figures in the Prometheus text format;
- ``/healthz``: ``ok`` once there is a reading, 503 before.
"""

from __future__ import annotations

import contextlib
import threading
from importlib import resources
from pathlib import Path
from typing import AsyncIterator

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .metrics import registry
from .sampler import Sampler

STATIC = Path(__file__).parent / "static"


def plotly_js() -> Path:
    """Plotly.js as the ``plotly`` package ships it."""
    path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    if not path.is_file():
        raise RuntimeError("plotly.min.js not found in the plotly package: pip install 'tb-limiter[dashboard]'")
    return path


def create_app(sampler: Sampler, *, metrics_top_keys: int = 10, poll: bool = True) -> Starlette:
    """The ASGI app; with ``poll``, it reads the source once at start-up,
    then a thread reads it every ``sampler.interval`` seconds while the app
    runs."""
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
        middleware=[Middleware(GZipMiddleware, minimum_size=1024)],
        lifespan=lifespan,
    )
