"""A Redis Cluster on loopback for the Python tests, like the Rust harness
(tests/common/cluster.rs): three masters with one replica each, every node a
:class:`tbserver.Server` on a free port (with or without the module), made
with ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``.
Every wait has a deadline; nodes are stopped by pid.

Environment, besides REDIS_SERVER and TB_MODULE: REDIS_CLI, the
``redis-cli`` binary (default: found on PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import redis

from tbserver import Server, free_cluster_port

CLI_DEADLINE = 120.0
STABLE_DEADLINE = 60.0


def redis_cli_bin() -> str:
    """``$REDIS_CLI``, else ``redis-cli`` on PATH; fails clearly when missing."""
    path = os.environ.get("REDIS_CLI") or shutil.which("redis-cli")
    if not path or not os.path.isfile(path):
        raise RuntimeError("redis-cli not found: run `make test-python`, which installs redis-tools")
    return path


class Cluster:
    """Six nodes: ``nodes[0:3]`` start as masters, ``nodes[3:6]`` as replicas."""

    def __init__(self, *, with_module: bool = True) -> None:
        self.nodes: list[Server] = []
        try:
            for _ in range(6):
                self.nodes.append(
                    Server(
                        with_module=with_module,
                        port=free_cluster_port(),
                        extra=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                               "--cluster-node-timeout", "5000"],
                    )
                )
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            cmd = [redis_cli_bin(), "--cluster", "create", *addrs, "--cluster-replicas", "1", "--cluster-yes"]
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=CLI_DEADLINE, stdin=subprocess.DEVNULL)
            if out.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed:\n{out.stdout}\n{out.stderr}")
            self._wait_stable()
        except BaseException:
            self.stop()
            raise

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def _wait_stable(self) -> None:
        """Until every node says ``cluster_state:ok`` and knows six nodes."""
        deadline = time.monotonic() + STABLE_DEADLINE
        last = ""
        while time.monotonic() < deadline:
            states = []
            for n in self.nodes:
                info = n.client().execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                states.append("cluster_state:ok" in text and "cluster_known_nodes:6" in text)
                last = text
            if all(states) and self._replicas_synced():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not become stable within {STABLE_DEADLINE} s:\n{last}")

    def _replicas_synced(self) -> bool:
        links = 0
        for n in self.nodes:
            info = n.client().info("replication")
            if info.get("role") == "slave" and info.get("master_link_status") == "up":
                links += 1
        return links == 3

    def flushall(self) -> None:
        """Empties every master (replicas follow)."""
        for n in self.nodes:
            c = n.client()
            if c.info("replication").get("role") == "master":
                c.flushall()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def node_of(cluster: Cluster, key: str) -> redis.Redis:
    """A plain client on the master that serves ``key``."""
    rc = redis.cluster.RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    node = rc.get_node_from_key(key)
    rc.close()
    return redis.Redis(host=node.host, port=node.port)
