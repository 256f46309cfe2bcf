//! Failover: a promoted replica continues from exactly the replicated bucket
//! state (no tokens minted, no bucket reset, reservations kept), and a client
//! blocked in `TB.CONSUME ... BLOCK` on the old master gets an error instead
//! of hanging. In a cluster (`CLUSTER FAILOVER`, and a master killed with
//! SIGKILL and replaced automatically) and for a plain master/replica pair
//! (`REPLICAOF NO ONE`).

mod common;

use std::thread;
use std::time::{Duration, Instant};

use common::cluster::{key_in_slot, wait_replicated, Cluster, ClusterConfig};
use common::{blocked_now, consume, digest, error_of, replica_of, state, Server, ServerConfig};
use redis::{Connection, ConnectionLike, ErrorKind, RedisResult};

/// Capacity of the fixed-budget bucket (rate 0), and what the test takes.
const CAP: u64 = 100;
const TAKEN: u64 = 37;

/// The rate of the bucket a client blocks on: one token every 10 s, so a
/// reservation made with the bucket empty is due in 10 s, far longer than a
/// failover takes.
const SLOW_RATE: &str = "0.1";

/// `DEBUG DIGEST-VALUE` of each key on one node: the stored values, exactly.
fn digests(c: &mut Connection, keys: &[&str]) -> Vec<String> {
    keys.iter().map(|k| digest(c, k)).collect()
}

/// Empties `key` (capacity 1 at [`SLOW_RATE`]) and starts a client blocked
/// on its next token, which is due in 10 s. Returns the blocked call's
/// thread, which yields the reply and how long it took.
fn block_on(server: &Server, key: &str) -> thread::JoinHandle<(RedisResult<Vec<i64>>, Duration)> {
    let mut c = server.conn();
    assert_eq!(consume(&mut c, key, SLOW_RATE, 1, 1)[0], 1);
    let before = blocked_now(&mut c);
    let mut blocked = server.conn();
    let key = key.to_string();
    let handle = thread::spawn(move || {
        let t = Instant::now();
        let r = redis::cmd("TB.CONSUME")
            .arg(&key)
            .arg(SLOW_RATE)
            .arg(1)
            .arg(1)
            .arg("BLOCK")
            .arg(15_000)
            .query(&mut blocked);
        (r, t.elapsed())
    });
    server.wait_for("the client to block", Duration::from_secs(10), |c| {
        blocked_now(c) == before + 1
    });
    handle
}

/// Asserts that a blocked call ended with Redis's `-UNBLOCKED` error, well
/// before its reservation was due.
fn assert_unblocked(reply: (RedisResult<Vec<i64>>, Duration)) {
    let (r, took) = reply;
    let e = r.expect_err("the blocked client gets an error, not tokens");
    assert_eq!(e.code(), Some("UNBLOCKED"), "{e}");
    assert!(took < Duration::from_secs(10), "answered after {took:?}");
}

/// Keys of one shard: a fixed budget, a slowly refilling bucket and one for
/// a blocked client, all in the first slot of master `m`.
fn shard_keys(cl: &Cluster, m: usize) -> [String; 3] {
    let slot = cl.slot_map().iter().position(|&o| o == m).unwrap() as u16;
    ["budget", "refill", "blocked"].map(|n| key_in_slot(slot, n))
}

/// Consumes on the budget and refilling buckets through `c`; checks the
/// replies.
fn spend(c: &mut dyn ConnectionLike, budget: &str, refill: &str) {
    assert_eq!(
        consume(c, budget, "0", CAP, TAKEN),
        [1, (CAP - TAKEN) as i64, 0, -1, TAKEN as i64]
    );
    assert_eq!(consume(c, refill, "1/h", 1000, 600)[0..2], [1, 400]);
}

/// After a failover: the new master holds exactly `before` and continues
/// from it: the budget gives one more token and no more than it had.
fn assert_continues(
    new_master: &mut Connection,
    keys: &[&str],
    before: &[String],
    refill_updated: &str,
) {
    assert_eq!(
        digests(new_master, keys),
        before,
        "the promoted replica holds the replicated values"
    );
    let budget = keys[0];
    assert_eq!(
        state(new_master, budget)["tokens"],
        (CAP - TAKEN).to_string()
    );
    assert_eq!(state(new_master, keys[1])["updated_at_ms"], refill_updated);
    assert_eq!(
        consume(new_master, budget, "0", CAP, 1),
        [1, (CAP - TAKEN - 1) as i64, 0, -1, 1],
        "no bucket reset, no token minted"
    );
    assert_eq!(
        consume(new_master, budget, "0", CAP, CAP - TAKEN),
        [0, (CAP - TAKEN - 1) as i64, -1, -1, 0]
    );
    // The blocked client's reservation was replicated: the bucket is in
    // debt, so the next token is not there.
    let r = consume(new_master, keys[2], SLOW_RATE, 1, 1);
    assert_eq!((r[0], r[4]), (0, 0), "the reservation is kept: {r:?}");
    assert!(r[2] > 10_000, "one reserved token ahead: {r:?}");
}

#[test]
fn cluster_failover_continues_from_the_replicated_state() {
    let cl = Cluster::start();
    let m = cl.masters()[0];
    let r = cl.replica_of(m);
    let keys = shard_keys(&cl, m);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut cc = cl.conn();
    spend(&mut cc, keys[0], keys[1]);
    let blocked = block_on(&cl.nodes[m], keys[2]);
    wait_replicated(&cl.nodes[m], &cl.nodes[r]);
    let mut mc = cl.node_conn(m);
    let before = digests(&mut mc, &keys);
    let refill_updated = state(&mut mc, keys[1])["updated_at_ms"].clone();

    cl.failover(r);
    assert_unblocked(blocked.join().unwrap());
    assert_continues(&mut cl.node_conn(r), &keys, &before, &refill_updated);

    // The old master is now a replica: writes there are redirected, and the
    // cluster client follows them to the new master.
    let e = error_of(
        &mut cl.node_conn(m),
        redis::cmd("TB.CONSUME").arg(keys[0]).arg(0).arg(CAP),
    );
    assert_eq!(e.kind(), ErrorKind::Moved, "{e}");
    assert_eq!(
        consume(&mut cc, keys[0], "0", CAP, 1),
        [1, (CAP - TAKEN - 2) as i64, 0, -1, 1]
    );
    wait_replicated(&cl.nodes[r], &cl.nodes[m]);
    assert_eq!(
        digests(&mut cl.node_conn(m), &keys),
        digests(&mut cl.node_conn(r), &keys),
        "the demoted master follows the new one"
    );
}

#[test]
fn cluster_replaces_a_killed_master_without_losing_state() {
    let mut cl = Cluster::start_with(ClusterConfig {
        node_timeout_ms: 1500,
        ..ClusterConfig::default()
    });
    let m = cl.masters()[0];
    let r = cl.replica_of(m);
    let keys = shard_keys(&cl, m);
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut cc = cl.conn();
    spend(&mut cc, keys[0], keys[1]);
    let blocked = block_on(&cl.nodes[m], keys[2]);
    wait_replicated(&cl.nodes[m], &cl.nodes[r]);
    let mut mc = cl.node_conn(m);
    let before = digests(&mut mc, &keys);
    let refill_updated = state(&mut mc, keys[1])["updated_at_ms"].clone();

    let killed_at = Instant::now();
    cl.kill9(m);
    // The blocked client's connection is gone with the server: an I/O
    // error at once, not a hang.
    let (reply, _) = blocked.join().unwrap();
    let e = reply.expect_err("no reply from a killed server");
    assert!(
        e.is_connection_dropped() || e.is_connection_refusal() || e.kind() == ErrorKind::IoError,
        "{e:?}"
    );
    assert!(!e.is_timeout(), "{e:?}");
    cl.wait_promoted(r);
    eprintln!("replica promoted {:?} after the kill", killed_at.elapsed());
    assert_continues(&mut cl.node_conn(r), &keys, &before, &refill_updated);
    // A new cluster connection finds the new master. (The `redis` crate's
    // sync cluster connection made before the kill keeps reconnecting to the
    // dead address instead of refreshing its slot map: a client matter.)
    assert_eq!(
        consume(&mut cl.conn(), keys[0], "0", CAP, 1),
        [1, (CAP - TAKEN - 2) as i64, 0, -1, 1]
    );

    // The old master comes back as a replica of the new one and converges
    // to its state (it does not bring its own back).
    cl.restart(m);
    cl.wait_stable();
    assert_eq!(cl.role(m), "slave");
    wait_replicated(&cl.nodes[r], &cl.nodes[m]);
    assert_eq!(
        digests(&mut cl.node_conn(m), &keys),
        digests(&mut cl.node_conn(r), &keys)
    );
}

#[test]
fn replicaof_no_one_promotes_a_plain_replica() {
    let m = Server::start();
    let r = replica_of(&m, ServerConfig::default());
    let keys = ["budget", "refill", "blocked"];
    let mut mc = m.conn();
    spend(&mut mc, keys[0], keys[1]);
    // Block a client on a reservation due in 10 s.
    let blocked = block_on(&m, keys[2]);
    wait_replicated(&m, &r);
    let before = digests(&mut mc, &keys);
    let refill_updated = state(&mut mc, keys[1])["updated_at_ms"].clone();

    let mut rc = r.conn();
    let ok: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rc)
        .unwrap();
    assert_eq!(ok, "OK");
    assert_continues(&mut rc, &keys, &before, &refill_updated);

    // Demote the old master: its blocked client gets -UNBLOCKED.
    let ok: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(r.port)
        .query(&mut mc)
        .unwrap();
    assert_eq!(ok, "OK");
    assert_unblocked(blocked.join().unwrap());
    m.wait_for(
        "the old master to sync from the new one",
        Duration::from_secs(20),
        |c| {
            redis::cmd("INFO")
                .arg("replication")
                .query::<String>(c)
                .is_ok_and(|i| i.contains("master_link_status:up"))
        },
    );
    wait_replicated(&r, &m);
    assert_eq!(digests(&mut m.conn(), &keys), digests(&mut rc, &keys));
    // When the reservation falls due, the module's timer finds its client
    // gone and cleans up quietly; the server stays up.
    m.wait_for(
        "the reservation timer to fire",
        Duration::from_secs(20),
        |c| blocked_now(c) == 0,
    );
    let pong: String = redis::cmd("PING").query(&mut m.conn()).unwrap();
    assert_eq!(pong, "PONG");
}

/// A call waiting for a lease on a master that a cluster failover demotes
/// gets `-UNBLOCKED` at once, on every server: never a reply made by a
/// replica at its deadline (Valkey 9 keeps it blocked; the module answers).
#[test]
fn cluster_failover_unblocks_a_lease_waiter() {
    let cl = Cluster::start();
    let m = cl.masters()[0];
    let r = cl.replica_of(m);
    let key = shard_keys(&cl, m)[2].clone();
    let mut c = cl.node_conn(m);
    let held: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(&key)
        .arg(SLOW_RATE)
        .arg(1)
        .arg(1)
        .arg("LEASE")
        .arg(60_000)
        .query(&mut c)
        .unwrap();
    assert_eq!(held[0], 1, "{held:?}");
    let before = blocked_now(&mut c);
    let mut w = cl.nodes[m].conn();
    let waiter = thread::spawn(move || {
        let t = Instant::now();
        let r = redis::cmd("TB.CONSUME")
            .arg(&key)
            .arg(SLOW_RATE)
            .arg(1)
            .arg(1)
            .arg("BLOCK")
            .arg(15_000)
            .arg("LEASE")
            .arg(60_000)
            .query::<Vec<i64>>(&mut w);
        (r, t.elapsed())
    });
    cl.nodes[m].wait_for("the call to wait", Duration::from_secs(10), |c| {
        blocked_now(c) == before + 1
    });
    cl.failover(r);
    assert_unblocked(waiter.join().unwrap());
}
