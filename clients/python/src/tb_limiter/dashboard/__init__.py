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

import inspect
from typing import Any, Dict

import redis
import redis.connection
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


def _without_setinfo() -> Dict[str, Any]:
    """Options that keep redis-py from sending ``CLIENT SETINFO`` on each
    connection: a user allowed only what the dashboard reads is refused it
    (Redis 7.2+, Valkey), and every refusal lands in the server's ``ACL
    LOG``. redis-py 8 takes ``driver_info=None``; older ones ``lib_name`` and
    ``lib_version`` None."""
    params = inspect.signature(redis.connection.AbstractConnection.__init__).parameters
    if "driver_info" in params:
        return {"driver_info": None}
    return {"lib_name": None, "lib_version": None}


def make_client(url: str, *, cluster: bool = False) -> AnyClient:
    """A redis-py client for ``url``: a cluster client with ``cluster``
    (the URL names any one node), else a plain one."""
    opts: Any = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0, **_without_setinfo()}
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
