"""``python -m tb_limiter.dashboard --url redis://... [--cluster]``: serve
the live dashboard (see ``tb_limiter.dashboard``)."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional
from urllib.parse import parse_qsl, quote, urlsplit

from . import make_client


def redact(url: str) -> str:
    """The URL without its secrets, for display: the password of the
    userinfo and the value of every query parameter naming a password
    (``?password=``, ``?ssl_password=``: redis-py takes any query parameter
    as a connection option) become ``***``; a fragment (which redis-py
    ignores, and where part of an unescaped password can land) is dropped.
    User names stay: they tell which ACL user the dashboard reads as."""
    parts = urlsplit(url)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    port = hostport.rpartition("]")[2].partition(":")[2]
    if port and not port.isdigit():  # not a port: maybe part of a password
        hostport = "***"
    netloc = "%s%s%s%s" % (user, ":***" if colon else "", at, hostport)
    query = "&".join(
        "%s=%s" % (quote(name, safe=""), "***" if "password" in name.lower() else quote(value, safe=""))
        for name, value in parse_qsl(parts.query, keep_blank_values=True)
    )
    return "%s://%s%s%s" % (parts.scheme, netloc, parts.path, "?" + query if query else "")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tb_limiter.dashboard",
        description="Live dashboard of the tb rate limiter: rates, wait percentiles, "
        "the most limited keys and each node's settings; also /metrics for Prometheus.",
    )
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0", help="Redis URL (credentials in it: redis://user:pass@host:port/0)")
    ap.add_argument("--cluster", action="store_true", help="the URL is one node of a Redis Cluster: read every node")
    ap.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    ap.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients may use in the Host header (repeatable); loopback names and the --host "
        "address are always allowed, other Host headers get 400 (against DNS rebinding)",
    )
    ap.add_argument("--port", type=int, default=8000, help="port to serve on (default 8000)")
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between readings (default 1)")
    ap.add_argument("--top", type=int, default=10, help="keys listed per table (default 10, at most 256)")
    ap.add_argument("--history", type=float, default=600.0, help="seconds of history the charts keep (default 600)")
    ap.add_argument("--window", type=float, default=60.0, help="seconds the wait percentiles cover (default 60)")
    ap.add_argument("--metrics-top-keys", type=int, default=10, help="top keys exported on /metrics per list (default 10; 0: none)")
    a = ap.parse_args(argv)
    if not 0 < a.top <= 256:
        ap.error("--top must be from 1 to 256")
    if a.interval <= 0:
        ap.error("--interval must be positive")

    try:
        import uvicorn

        from .app import WILDCARDS, create_app
        from .sampler import Sampler
    except ImportError as e:
        print("error: %s; install the dashboard's dependencies: pip install 'tb-limiter[dashboard]'" % e, file=sys.stderr)
        return 2

    client = make_client(a.url, cluster=a.cluster)
    sampler = Sampler(
        client,
        source=redact(a.url) + (" (cluster)" if a.cluster else ""),
        interval=a.interval,
        top=a.top,
        history_s=a.history,
        window_s=a.window,
    )
    app = create_app(sampler, metrics_top_keys=a.metrics_top_keys, allowed_hosts=[a.host, *a.allow_host])
    print("tb dashboard for %s on http://%s:%d/ (metrics: /metrics)" % (sampler.source, a.host, a.port), flush=True)
    if a.host in WILDCARDS and not a.allow_host:
        print(
            "note: only requests naming a loopback host are answered; add --allow-host NAME "
            "for each name or address clients reach this host by",
            flush=True,
        )
    uvicorn.run(app, host=a.host, port=a.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
