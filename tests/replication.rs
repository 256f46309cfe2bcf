//! Replication of effects: replicas receive the resulting absolute state
//! (TB.SETSTATE), never the clock-dependent TB.CONSUME, so master and replica
//! hold identical values after any workload.

mod common;

use std::time::Duration;

use common::{
    commandstats, consume, dataset_digest, replica_of, sync_replica, Server, ServerConfig,
};
use redis::Connection;

fn workload(c: &mut Connection, round: u64) {
    // Rates and capacities chosen so that no key expires during the test,
    // except the ones that are deleted at once because they are full.
    let rates = ["1e-3", "0.5", "100/d", "7/h", "0", "3"];
    for i in 0..60u64 {
        let key = format!("k{}", (i * 7 + round) % 23);
        let rate = rates[(i as usize + round as usize) % rates.len()];
        let cap = 1000 + (i % 3) * 10;
        let n = [1, 5, 0, 2000, 13][(i % 5) as usize];
        let _: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(&key)
            .arg(rate)
            .arg(cap)
            .arg(n)
            .query(c)
            .unwrap();
    }
    // Partial grants of at least a chunk, alone and shared by two buckets:
    // whatever each grants, the replica gets the resulting state.
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("bw")
        .arg("1e-3")
        .arg(500)
        .arg(400)
        .arg("ATMOST")
        .arg("MIN")
        .arg(100)
        .query(c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("TB.MCONSUME")
        .arg(2)
        .arg("{p}user")
        .arg("{p}global")
        .arg("1e-3")
        .arg(300)
        .arg(250)
        .arg("1e-3")
        .arg(200)
        .arg(250)
        .arg("ATMOST")
        .arg("MIN")
        .arg(50)
        .query(c)
        .unwrap();
    // A bucket that is full again after a capacity cut is deleted
    // (replicated as `TB.SETSTATE full DEL`).
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("full")
        .arg("1")
        .arg("5")
        .query(c)
        .unwrap();
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("full")
        .arg("1")
        .arg("1")
        .arg(5)
        .query(c)
        .unwrap();
}

#[test]
fn master_and_replica_hold_identical_buckets() {
    let m = Server::start();
    let r = replica_of(&m, ServerConfig::default());
    let mut mc = m.conn();
    workload(&mut mc, 0);
    // The replica is frozen for a second while the master keeps writing.
    r.pause();
    let paused_at = std::time::Instant::now();
    let mut round = 1;
    while paused_at.elapsed() < Duration::from_secs(1) {
        workload(&mut mc, round);
        round += 1;
    }
    r.resume();
    workload(&mut mc, round + 1);
    sync_replica(&mut mc);
    let mut rc = r.conn();
    let (dm, dr) = (dataset_digest(&mut mc), dataset_digest(&mut rc));
    assert_eq!(dm, dr, "DEBUG DIGEST differs after {round} rounds");
    let keys: i64 = redis::cmd("DBSIZE").query(&mut rc).unwrap();
    assert!(keys >= 20, "the workload created buckets: {keys}");
    let exists: i64 = redis::cmd("EXISTS").arg("full").query(&mut rc).unwrap();
    assert_eq!(exists, 0, "the full bucket was deleted on the replica too");
}

#[test]
fn replicas_receive_state_not_commands() {
    let m = Server::start();
    let r = replica_of(&m, ServerConfig::default());
    let mut mc = m.conn();
    for _ in 0..5 {
        let _: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg("s")
            .arg("1")
            .arg("3")
            .query(&mut mc)
            .unwrap();
    }
    sync_replica(&mut mc);
    let stats = commandstats(&mut r.conn());
    assert!(
        stats.contains("cmdstat_tb.setstate:calls=3"),
        "3 grants, 3 states: {stats}"
    );
    assert!(
        !stats.contains("cmdstat_tb.consume"),
        "TB.CONSUME is never replayed: {stats}"
    );
}

#[test]
fn deletions_replicate_with_del_renamed() {
    // Operators rename DEL away (rename-command), on every node alike. A
    // write that leaves a bucket full deletes its key; the deletion must
    // still reach the replica and the AOF, whatever DEL is called.
    let renamed = |extra: &[&str]| ServerConfig {
        args: ["--rename-command", "DEL", "del-7f3a9c"]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect(),
        ..ServerConfig::default()
    };
    let mut m = Server::start_with(renamed(&["--appendonly", "yes", "--appendfsync", "always"]));
    let r = replica_of(&m, renamed(&[]));
    let mut mc = m.conn();
    // Two buckets at 3 of 5 tokens (refilling over days, so no expiry).
    for key in ["refunded", "reshaped"] {
        assert_eq!(consume(&mut mc, key, "1/d", 5, 2)[..2], [1, 3]);
    }
    // A refund fills one; a capacity cut to 3 fills the other (the request
    // itself, for more than the capacity, is denied).
    let _: i64 = redis::cmd("TB.REFUND")
        .arg("refunded")
        .arg(2)
        .query(&mut mc)
        .unwrap();
    assert_eq!(consume(&mut mc, "reshaped", "1/d", 3, 5)[0], 0);
    let exists = |c: &mut Connection| -> i64 {
        redis::cmd("EXISTS")
            .arg(&["refunded", "reshaped"])
            .query(c)
            .unwrap()
    };
    assert_eq!(exists(&mut mc), 0, "full buckets are deleted on the master");
    sync_replica(&mut mc);
    let mut rc = r.conn();
    assert_eq!(exists(&mut rc), 0, "and on the replica");
    assert_eq!(dataset_digest(&mut mc), dataset_digest(&mut rc));
    drop(mc);
    m.restart();
    assert_eq!(exists(&mut m.conn()), 0, "and after replaying the AOF");
    for s in [&m, &r] {
        assert!(!s.log().contains("unknown command"), "{}", s.log());
    }
}
