"""A Redis Cluster on loopback for the Python tests, like the Rust harness
(tests/common/cluster.rs): three masters with one replica each, made by the
shared harness (tools/tbharness/tbharness.py, re-exported by tbserver).

Environment, besides REDIS_SERVER and TB_MODULE: REDIS_CLI, the
``redis-cli`` binary (default: found on PATH)."""

from __future__ import annotations

import redis

from tbserver import Server  # noqa: F401  (puts tools/tbharness on sys.path)
from tbharness import Cluster, redis_cli_bin  # noqa: E402,F401  (re-exported for the tests)


def node_of(cluster: Cluster, key: str) -> redis.Redis:
    """A plain client on the master that serves ``key``."""
    rc = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    node = rc.get_node_from_key(key)
    rc.close()
    return redis.Redis(host=node.host, port=node.port)
