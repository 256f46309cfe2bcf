//! A Redis Cluster on loopback: three masters, each with one replica, every
//! node a [`Server`] with the `tb` module loaded, created with
//! `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`.
//!
//! Nodes keep their index in [`Cluster::nodes`] for the whole test, whatever
//! their role becomes after a failover. Every wait has a deadline and panics
//! with what it was waiting for and the state it last saw.
//!
//! Environment, besides the harness's `REDIS_SERVER` and `TB_MODULE`:
//! - `REDIS_CLI`: the `redis-cli` binary (default: found on `PATH`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{Connection, RedisResult, Value};

use super::{Server, ServerConfig};

/// Number of hash slots in Redis Cluster.
pub const SLOTS: u16 = 16384;
/// How long `redis-cli --cluster ...` may run.
const CLI_DEADLINE: Duration = Duration::from_secs(120);
/// How long the cluster may take to agree on a (new) stable state.
const STABLE_DEADLINE: Duration = Duration::from_secs(60);
/// Read/write timeout of connections made by the cluster helpers.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The `redis-cli` binary: `$REDIS_CLI` if set, else `redis-cli` on `PATH`.
///
/// Panics with a hint to run `make test` if it cannot be found.
pub fn redis_cli_bin() -> PathBuf {
    if let Some(v) = std::env::var_os("REDIS_CLI").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(&v);
        if p.is_file() {
            return p;
        }
        panic!("REDIS_CLI={v:?} is not a file");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join("redis-cli"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!("redis-cli not found on PATH: run `make test`, which installs redis-tools")
        })
}

/// Runs `redis-cli` with `args`, panicking if it does not exit within two
/// minutes. Returns (success, stdout and stderr together).
pub fn redis_cli(args: &[String]) -> (bool, String) {
    let out = tempfile::NamedTempFile::new().expect("a temporary file for redis-cli output");
    let file = out.reopen().expect("reopen the redis-cli output file");
    let err = file.try_clone().expect("clone the redis-cli output file");
    let bin = redis_cli_bin();
    let mut child = Command::new(&bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(file))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let end = Instant::now() + CLI_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("poll redis-cli") {
            break status;
        }
        if Instant::now() >= end {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "redis-cli {args:?} did not finish within {CLI_DEADLINE:?}:\n{}",
                std::fs::read_to_string(out.path()).unwrap_or_default()
            );
        }
        thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(out.path()).unwrap_or_default();
    (status.success(), text)
}

/// The hash slot of `key` (CRC16 of the key or of its `{hash tag}`).
pub fn slot_of(key: &str) -> u16 {
    redis::cluster_routing::get_slot(key.as_bytes())
}

/// A key in `slot`, with a `{hash tag}` in front of `name`.
pub fn key_in_slot(slot: u16, name: &str) -> String {
    format!("{{{}}}:{name}", tag_for_slot(slot))
}

/// A hash tag (without braces) for every slot: `{tag}` puts a key in `slot`.
pub fn tag_for_slot(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); SLOTS as usize];
        let mut missing = SLOTS as usize;
        let mut i = 0u64;
        while missing > 0 {
            let t = format!("t{i}");
            let s = slot_of(&t) as usize;
            if tags[s].is_empty() {
                tags[s] = t;
                missing -= 1;
            }
            i += 1;
        }
        tags
    });
    &tags[slot as usize]
}

/// How to start a [`Cluster`].
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// `cluster-node-timeout`: how long a node may be unreachable before it
    /// is considered failing (and its replica takes over).
    pub node_timeout_ms: u64,
    /// Extra `redis-server` arguments for every node.
    pub args: Vec<String>,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        // Long enough that a loaded test machine does not trigger spurious
        // failovers; tests of automatic failover set a shorter one.
        ClusterConfig {
            node_timeout_ms: 5000,
            args: Vec::new(),
        }
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub id: String,
    pub flags: Vec<String>,
    /// The master's id for a replica, `None` for a master.
    pub master_id: Option<String>,
}

impl NodeInfo {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
}

/// Three masters and three replicas on loopback.
pub struct Cluster {
    /// The nodes, in a fixed order (not by role).
    pub nodes: Vec<Server>,
    /// Whether each node is running (not killed).
    alive: Vec<bool>,
    /// Each node's cluster id (stable across restarts: kept in nodes.conf).
    ids: Vec<String>,
}

impl Cluster {
    /// Starts a cluster with the default [`ClusterConfig`].
    pub fn start() -> Cluster {
        Cluster::start_with(ClusterConfig::default())
    }

    /// Starts six nodes, creates the cluster with `redis-cli --cluster
    /// create`, and waits until it is stable (see [`Cluster::wait_stable`]).
    pub fn start_with(cfg: ClusterConfig) -> Cluster {
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &cfg.node_timeout_ms.to_string(),
            // Keep the topology the tests set up: no replica moves to
            // another master on its own.
            "--cluster-allow-replica-migration",
            "no",
            // Replicas sync at once instead of waiting for more replicas.
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(cfg.args.iter().cloned());
        let nodes: Vec<Server> = (0..6)
            .map(|_| {
                Server::start_with(ServerConfig {
                    args: args.clone(),
                    ..ServerConfig::default()
                })
            })
            .collect();
        let ids = nodes
            .iter()
            .map(|n| {
                redis::cmd("CLUSTER")
                    .arg("MYID")
                    .query::<String>(&mut n.conn())
                    .expect("CLUSTER MYID")
            })
            .collect();
        let mut cli_args = vec!["--cluster".to_string(), "create".to_string()];
        cli_args.extend(nodes.iter().map(Server::addr));
        cli_args.extend(
            ["--cluster-replicas", "1", "--cluster-yes"]
                .iter()
                .map(|s| s.to_string()),
        );
        let (ok, out) = redis_cli(&cli_args);
        assert!(
            ok && out.contains("All 16384 slots covered"),
            "redis-cli --cluster create failed:\n{out}"
        );
        let cluster = Cluster {
            alive: vec![true; nodes.len()],
            nodes,
            ids,
        };
        cluster.wait_stable();
        cluster
    }

    /// A connection to node `i` (plain, not cluster-aware: it gets MOVED).
    pub fn node_conn(&self, i: usize) -> Connection {
        self.nodes[i].conn()
    }

    /// Node `i`'s cluster id.
    pub fn id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The index of the node listening on `port`.
    pub fn index_of_port(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// The index of the node with cluster id `id`.
    pub fn index_of_id(&self, id: &str) -> usize {
        self.ids
            .iter()
            .position(|x| x == id)
            .unwrap_or_else(|| panic!("no node with id {id}"))
    }

    /// Indexes of the running nodes.
    pub fn running(&self) -> Vec<usize> {
        (0..self.nodes.len()).filter(|&i| self.alive[i]).collect()
    }

    /// A cluster-aware client seeded with every running node.
    pub fn client(&self) -> ClusterClient {
        let seeds: Vec<String> = self
            .running()
            .iter()
            .map(|&i| format!("redis://{}/", self.nodes[i].addr()))
            .collect();
        ClusterClient::builder(seeds)
            .connection_timeout(IO_TIMEOUT)
            .response_timeout(IO_TIMEOUT)
            .build()
            .expect("a cluster client")
    }

    /// A cluster-aware connection (follows MOVED and ASK).
    pub fn conn(&self) -> ClusterConnection {
        self.client()
            .get_connection()
            .expect("a cluster connection")
    }

    /// `CLUSTER NODES` as node `i` sees it.
    pub fn nodes_seen_by(&self, i: usize) -> Vec<NodeInfo> {
        let text: String = query(&self.nodes[i], redis::cmd("CLUSTER").arg("NODES"))
            .unwrap_or_else(|e| panic!("CLUSTER NODES on node {i}: {e}"));
        parse_nodes(&text)
    }

    /// Slot ranges and the port of the master serving each, as node `i`
    /// sees them (`CLUSTER SLOTS`), sorted by first slot.
    pub fn slots_seen_by(&self, i: usize) -> RedisResult<Vec<(u16, u16, u16)>> {
        let v: Value = query(&self.nodes[i], redis::cmd("CLUSTER").arg("SLOTS"))?;
        Ok(parse_slots(&v))
    }

    /// For every slot, the index of the master serving it (as the first
    /// running node sees it).
    pub fn slot_map(&self) -> Vec<usize> {
        let i = self.running()[0];
        let slots = self
            .slots_seen_by(i)
            .unwrap_or_else(|e| panic!("CLUSTER SLOTS on node {i}: {e}"));
        let mut map = vec![usize::MAX; usize::from(SLOTS)];
        for (a, b, port) in slots {
            let m = self.index_of_port(port);
            map[usize::from(a)..=usize::from(b)].fill(m);
        }
        assert!(
            !map.contains(&usize::MAX),
            "not every slot is served (node {i})"
        );
        map
    }

    /// The index of the master serving `slot` (as the first running node sees it).
    pub fn owner_of_slot(&self, slot: u16) -> usize {
        let i = self.running()[0];
        let slots = self
            .slots_seen_by(i)
            .unwrap_or_else(|e| panic!("CLUSTER SLOTS on node {i}: {e}"));
        let port = slots
            .iter()
            .find(|(a, b, _)| (*a..=*b).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} is not served: {slots:?}"))
            .2;
        self.index_of_port(port)
    }

    /// The index of the master serving `key`.
    pub fn node_for_key(&self, key: &str) -> usize {
        self.owner_of_slot(slot_of(key))
    }

    /// Indexes of the running masters.
    pub fn masters(&self) -> Vec<usize> {
        self.running()
            .into_iter()
            .filter(|&i| self.role(i) == "master")
            .collect()
    }

    /// The index of the (first) replica of master `m`.
    pub fn replica_of(&self, m: usize) -> usize {
        let id = self.id(m).to_string();
        let seen = self.nodes_seen_by(m);
        let r = seen
            .iter()
            .find(|n| n.master_id.as_deref() == Some(id.as_str()))
            .unwrap_or_else(|| panic!("node {m} has no replica: {seen:?}"));
        self.index_of_id(&r.id)
    }

    /// `role:` of `INFO replication` on node `i` (`master` or `slave`).
    pub fn role(&self, i: usize) -> String {
        self.try_role(i).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like [`Cluster::role`], with an error instead of a panic.
    fn try_role(&self, i: usize) -> Result<String, String> {
        let info: String = query(&self.nodes[i], redis::cmd("INFO").arg("replication"))
            .map_err(|e| format!("INFO replication on node {i}: {e}"))?;
        Ok(info_field(&info, "role").unwrap_or_default())
    }

    /// Kills node `i` with SIGKILL.
    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].kill9();
        self.alive[i] = false;
    }

    /// Restarts a killed or running node `i` with its data directory (and
    /// nodes.conf, so it rejoins the cluster).
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
        self.alive[i] = true;
    }

    /// Manual failover: `CLUSTER FAILOVER` on replica `r`, then waits until
    /// `r` is a master, its old master is its replica, and the cluster is
    /// stable.
    pub fn failover(&self, r: usize) {
        let seen = self.nodes_seen_by(r);
        let me = seen
            .iter()
            .find(|n| n.id == self.id(r))
            .expect("a node sees itself");
        let old = self.index_of_id(
            me.master_id
                .as_deref()
                .unwrap_or_else(|| panic!("node {r} is not a replica")),
        );
        let reply: String = query(&self.nodes[r], redis::cmd("CLUSTER").arg("FAILOVER"))
            .unwrap_or_else(|e| panic!("CLUSTER FAILOVER on node {r}: {e}"));
        assert_eq!(reply, "OK");
        self.wait_until(&format!("node {r} to replace node {old} as master"), || {
            let roles = (self.try_role(r)?, self.try_role(old)?);
            match roles {
                (new, was) if new == "master" && was == "slave" => Ok(()),
                (new, was) => Err(format!("roles: node {r} {new}, node {old} {was}")),
            }
        });
        self.wait_stable();
    }

    /// Waits until node `i` is a master serving slots and the cluster is
    /// stable (after an automatic failover).
    pub fn wait_promoted(&self, i: usize) {
        self.wait_until(&format!("node {i} to be promoted to master"), || {
            let role = self.try_role(i)?;
            (role == "master").then_some(()).ok_or(role)
        });
        self.wait_stable();
    }

    /// Waits until every running node reports `cluster_state:ok` with all
    /// 16384 slots ok, every running node maps every slot to the same
    /// running master, and every running replica's link to its master is up.
    pub fn wait_stable(&self) {
        self.wait_until("the cluster to be stable", || self.stable_state());
    }

    /// `Ok` if the cluster is stable, else what is not yet.
    fn stable_state(&self) -> Result<(), String> {
        let running = self.running();
        let mut first_map: Option<Vec<(u16, u16, u16)>> = None;
        for &i in &running {
            let info: String = query(&self.nodes[i], redis::cmd("CLUSTER").arg("INFO"))
                .map_err(|e| format!("CLUSTER INFO on node {i}: {e}"))?;
            if info_field(&info, "cluster_state").as_deref() != Some("ok")
                || info_field(&info, "cluster_slots_ok").as_deref() != Some("16384")
            {
                return Err(format!("node {i}: {info}"));
            }
            let map = self
                .slots_seen_by(i)
                .map_err(|e| format!("CLUSTER SLOTS on node {i}: {e}"))?;
            let covered: u32 = map.iter().map(|(a, b, _)| u32::from(b - a) + 1).sum();
            if covered != u32::from(SLOTS) {
                return Err(format!("node {i} maps {covered} slots: {map:?}"));
            }
            match &first_map {
                None => first_map = Some(map),
                Some(m) if *m != map => {
                    return Err(format!(
                        "nodes disagree on the slot map: {m:?} vs node {i}: {map:?}"
                    ))
                }
                Some(_) => {}
            }
            let repl: String = query(&self.nodes[i], redis::cmd("INFO").arg("replication"))
                .map_err(|e| format!("INFO replication on node {i}: {e}"))?;
            if info_field(&repl, "role").as_deref() == Some("slave")
                && info_field(&repl, "master_link_status").as_deref() != Some("up")
            {
                return Err(format!("replica {i}: {repl}"));
            }
        }
        // Every running node sees the same roles for all running nodes.
        let mut first_view: Option<Vec<(String, bool, Option<String>)>> = None;
        for &i in &running {
            let text: String = query(&self.nodes[i], redis::cmd("CLUSTER").arg("NODES"))
                .map_err(|e| format!("CLUSTER NODES on node {i}: {e}"))?;
            let mut view: Vec<_> = parse_nodes(&text)
                .into_iter()
                .filter(|n| running.iter().any(|&j| self.ids[j] == n.id))
                .map(|n| (n.id.clone(), n.is_master(), n.master_id.clone()))
                .collect();
            view.sort();
            if view.len() != running.len() {
                return Err(format!(
                    "node {i} knows {} running nodes: {text}",
                    view.len()
                ));
            }
            match &first_view {
                None => first_view = Some(view),
                Some(v) if *v != view => {
                    return Err(format!(
                        "nodes disagree on roles: {v:?} vs node {i}: {view:?}"
                    ))
                }
                Some(_) => {}
            }
        }
        for (_, _, port) in first_map.unwrap_or_default() {
            let m = self.index_of_port(port);
            if !self.alive[m] || self.try_role(m)? != "master" {
                return Err(format!(
                    "slots mapped to node {m}, which is not a running master"
                ));
            }
        }
        Ok(())
    }

    /// Calls `check` every 50 ms until it returns `Ok`; panics with `what`,
    /// the last error and the running nodes' log tails after 60 s.
    pub fn wait_until(&self, what: &str, mut check: impl FnMut() -> Result<(), String>) {
        let end = Instant::now() + STABLE_DEADLINE;
        loop {
            let last = match check() {
                Ok(()) => return,
                Err(e) => e,
            };
            if Instant::now() >= end {
                let logs: Vec<String> = self
                    .running()
                    .iter()
                    .map(|&i| {
                        let log = self.nodes[i].log();
                        let lines: Vec<&str> = log.lines().collect();
                        format!(
                            "--- node {i} ({}) ---\n{}",
                            self.nodes[i].addr(),
                            lines[lines.len().saturating_sub(15)..].join("\n")
                        )
                    })
                    .collect();
                panic!(
                    "timed out after {STABLE_DEADLINE:?} waiting for {what}; last: {last}\n{}",
                    logs.join("\n")
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }
}

fn repl_offset(c: &mut Connection, field: &str) -> i64 {
    let text: String = redis::cmd("INFO")
        .arg("replication")
        .query(c)
        .unwrap_or_else(|e| panic!("INFO replication: {e}"));
    info_field(&text, field)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {text}"))
}

/// Waits until `replica` has processed everything `master` wrote so far,
/// from any connection. (`WAIT` only covers the writes of the connection it
/// is sent on.)
pub fn wait_replicated(master: &Server, replica: &Server) {
    let offset = repl_offset(&mut master.conn(), "master_repl_offset");
    replica.wait_for(
        &format!("the replica to reach offset {offset}"),
        Duration::from_secs(20),
        |c| repl_offset(c, "slave_repl_offset") >= offset,
    );
}

/// Runs `cmd` on a fresh connection to `server` with short timeouts.
fn query<T: redis::FromRedisValue>(server: &Server, cmd: &redis::Cmd) -> RedisResult<T> {
    let client = server.client();
    let mut c = client.get_connection_with_timeout(Duration::from_secs(2))?;
    c.set_read_timeout(Some(IO_TIMEOUT))?;
    c.set_write_timeout(Some(IO_TIMEOUT))?;
    cmd.query(&mut c)
}

/// The value of `name:` in an `INFO`-style text.
pub fn info_field(info: &str, name: &str) -> Option<String> {
    info.lines().find_map(|l| {
        l.trim_end()
            .strip_prefix(name)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::to_string)
    })
}

/// Parses `CLUSTER NODES`.
fn parse_nodes(text: &str) -> Vec<NodeInfo> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            NodeInfo {
                id: f[0].to_string(),
                flags: f[2].split(',').map(str::to_string).collect(),
                master_id: (f[3] != "-").then(|| f[3].to_string()),
            }
        })
        .collect()
}

/// Parses `CLUSTER SLOTS` into sorted `(first, last, master port)`.
fn parse_slots(v: &Value) -> Vec<(u16, u16, u16)> {
    let int = |v: &Value| match v {
        Value::Int(n) => *n as u16,
        _ => 0,
    };
    let mut out = Vec::new();
    if let Value::Array(ranges) = v {
        for r in ranges {
            if let Value::Array(parts) = r {
                if let (Some(a), Some(b), Some(Value::Array(master))) =
                    (parts.first(), parts.get(1), parts.get(2))
                {
                    let port = master.get(1).map(int).unwrap_or(0);
                    out.push((int(a), int(b), port));
                }
            }
        }
    }
    out.sort_unstable();
    out
}
