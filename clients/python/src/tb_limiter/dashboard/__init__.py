"""A live dashboard of the tb rate limiter, and the functions behind it.

Run it (``pip install 'tb-limiter[dashboard]'``)::

    python -m tb_limiter.dashboard --url redis://127.0.0.1:6379/0 [--cluster]

It polls every node once a second (``INFO tb``, ``TB.TOP``, ``TB.INFO``:
read-only commands) and serves, on http://127.0.0.1:8000/, charts of the
allowed, denied and reserved requests per second and of the wait
percentiles, the keys denied most and waited on most with their buckets'
fill level, and each node's settings; ``/metrics`` serves the same figures
in the Prometheus text format.

The reading functions need only redis-py::

    import redis
    from tb_limiter.dashboard import read_top

    top = read_top(redis.Redis(), "denied", count=5)
    for k in top.keys:
        print(k.key, k.count, k.at_least)
"""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from .collect import (
    AnyClient,
    NodeInfo,
    TopKey,
    TopList,
    bucket_info,
    merge_tops,
    parse_info_tb,
    parse_top,
    quantile,
    read_node,
    read_top,
)


def make_client(url: str, *, cluster: bool = False) -> AnyClient:
    """A redis-py client for ``url``: a cluster client with ``cluster``
    (the URL names any one node), else a plain one."""
    opts: Any = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
    if cluster:
        return RedisCluster.from_url(url, **opts)
    return redis.Redis.from_url(url, **opts)


__all__ = [
    "AnyClient",
    "NodeInfo",
    "TopKey",
    "TopList",
    "bucket_info",
    "make_client",
    "merge_tops",
    "parse_info_tb",
    "parse_top",
    "quantile",
    "read_node",
    "read_top",
]
