//! Leases (issue 13) on a real server: part of the bucket's state through
//! replication, AOF, RDB, DUMP/RESTORE and digests; a key never expires
//! while leased tokens are out; bad input changes nothing; the multi-key
//! form in a cluster with hash tags.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{replica_of, Server, ServerConfig};
use redis::{Connection, ConnectionLike, Value};

fn info(c: &mut dyn ConnectionLike, key: &str) -> HashMap<String, String> {
    let v: Vec<Value> = redis::cmd("TB.INFO").arg(key).query(c).unwrap();
    v.chunks(2)
        .map(|p| {
            (
                redis::from_redis_value::<String>(&p[0]).unwrap(),
                match &p[1] {
                    Value::Int(i) => i.to_string(),
                    other => redis::from_redis_value::<String>(other).unwrap(),
                },
            )
        })
        .collect()
}

fn digest(c: &mut Connection, key: &str) -> String {
    redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query::<Vec<String>>(c)
        .unwrap()[0]
        .clone()
}

fn lease(c: &mut dyn ConnectionLike, key: &str, rate: &str, cap: u64, n: u64, ttl: u64) -> i64 {
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .arg("LEASE")
        .arg(ttl)
        .query(c)
        .unwrap();
    assert_eq!(r.len(), 6, "a LEASE reply carries the lease id: {r:?}");
    assert_eq!(r[0], 1, "{key}: {r:?}");
    r[5]
}

fn release(c: &mut dyn ConnectionLike, key: &str, id: i64, used: Option<u64>) -> Option<i64> {
    let mut cmd = redis::cmd("TB.RELEASE");
    cmd.arg(key).arg(id);
    if let Some(u) = used {
        cmd.arg("USED").arg(u);
    }
    cmd.query(c).unwrap()
}

/// Buckets holding leases, some released or settled; returns the keys.
fn populate(c: &mut Connection) -> Vec<&'static str> {
    let a = lease(c, "inflight", "0", 3, 1, 600_000);
    lease(c, "inflight", "0", 3, 1, 600_000);
    assert_eq!(release(c, "inflight", a, None), Some(1));
    let t = lease(c, "tpm", "100/m", 1000, 400, 600_000);
    lease(c, "tpm", "100/m", 1000, 100, 300_000);
    assert_eq!(release(c, "tpm", t, Some(700)), Some(-300));
    vec!["inflight", "tpm"]
}

fn snapshot(c: &mut Connection, keys: &[&str]) -> Vec<(String, String, String)> {
    keys.iter()
        .map(|k| {
            let i = info(c, k);
            (
                digest(c, k),
                i.get("leases").cloned().unwrap_or_default(),
                i["updated_at_ms"].clone(),
            )
        })
        .collect()
}

#[test]
fn leases_survive_aof_rdb_dump_restore_and_reach_replicas() {
    let mut s = Server::start_with(ServerConfig {
        args: vec![
            "--appendonly".into(),
            "yes".into(),
            "--aof-use-rdb-preamble".into(),
            "no".into(),
        ],
        ..ServerConfig::default()
    });
    let r = replica_of(&s, ServerConfig::default());
    let mut c = s.conn();
    let keys = populate(&mut c);
    let before = snapshot(&mut c, &keys);
    assert_eq!(before[0].1, "1", "one in-flight lease held");
    // Replicas receive the state with its leases.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(15_000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let mut rc = r.conn();
    assert_eq!(
        snapshot(&mut rc, &keys),
        before,
        "the replica holds the same leases"
    );
    // DUMP/RESTORE carries them (the digest covers the key's name: restore
    // under the same name).
    let pttl: i64 = redis::cmd("PTTL").arg("tpm").query(&mut c).unwrap();
    let dump: Vec<u8> = redis::cmd("DUMP").arg("tpm").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("tpm")
        .arg(pttl)
        .arg(dump)
        .arg("REPLACE")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "tpm"), before[1].0, "RESTORE: same state");
    // AOF rewrite (TB.SETSTATE with the leases) and restart.
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
    s.wait_for("AOF rewrite done", Duration::from_secs(20), |c| {
        let info: String = redis::cmd("INFO").arg("persistence").query(c).unwrap();
        info.contains("aof_rewrite_in_progress:0")
            && info.contains("aof_rewrite_scheduled:0")
            && info.contains("aof_last_bgrewrite_status:ok")
    });
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!(snapshot(&mut c, &keys), before, "AOF rewrite + restart");
    // RDB reload.
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(snapshot(&mut c, &keys), before, "DEBUG RELOAD");
    // A lease restored is still released once.
    let held: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("inflight")
        .arg("0")
        .arg(3)
        .arg(2)
        .query(&mut c)
        .unwrap();
    assert_eq!(held[0], 1, "two of three slots free: {held:?}");
    let denied: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("inflight")
        .arg("0")
        .arg(3)
        .query(&mut c)
        .unwrap();
    assert_eq!(denied[0], 0, "the restored lease still holds its slot");
    assert!(
        denied[2] > 590_000,
        "the wait is the lease's expiry: {denied:?}"
    );
}

#[test]
fn a_leased_bucket_is_not_dropped_before_its_leases_expire() {
    let s = Server::start();
    let mut c = s.conn();
    // A fast refill: full again in 10 ms without the lease, but the lease
    // holds 10 tokens for 1.5 s: the key must outlive it.
    let t0 = Instant::now();
    let id = lease(&mut c, "fast", "1000", 10, 10, 1_500);
    let pttl: i64 = redis::cmd("PTTL").arg("fast").query(&mut c).unwrap();
    let bound = 1_500 - t0.elapsed().as_millis() as i64;
    assert!(
        pttl >= bound - 1 && pttl <= 1_501,
        "the key expires with the lease: {pttl} ms, at least {bound}"
    );
    assert!(id > 0);
    // Released, the lease leaves a full bucket that holds none: the key
    // goes (random ids need no key kept to stay unique), and the next id
    // is another.
    // The reply is what went back: the 10 less what refilled since the
    // grant (1 token a ms, on a server with a µs clock), never above 10.
    let back = release(&mut c, "fast", id, None).expect("the lease is held");
    let refilled = t0.elapsed().as_millis() as i64 + 1;
    assert!(
        (10 - refilled..=10).contains(&back),
        "{back} went back, {refilled} ms after the grant"
    );
    let exists: i64 = redis::cmd("EXISTS").arg("fast").query(&mut c).unwrap();
    assert_eq!(exists, 0, "a full bucket holding no lease is a missing key");
    let next = lease(&mut c, "fast", "1000", 10, 1, 1_000);
    assert_ne!(next, id);
    // A concurrency bucket whose holder vanished: the key stays until the
    // lease expires, then the slot is back and the key goes.
    let _ = lease(&mut c, "gone", "0", 1, 1, 200);
    let pttl: i64 = redis::cmd("PTTL").arg("gone").query(&mut c).unwrap();
    // The lease's expiry in µs, rounded up to the key's ms: at most 201 ms
    // from the server's ms clock.
    assert!((1..=201).contains(&pttl), "expiry of the lease: {pttl}");
    s.wait_for(
        "the vanished holder's key expired",
        Duration::from_secs(10),
        |c| redis::cmd("EXISTS").arg("gone").query::<i64>(c).unwrap() == 0,
    );
    let again: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("gone")
        .arg("0")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(again[0], 1);
}

#[test]
fn a_block_reply_counts_the_leases_that_expired_while_it_waited() {
    let s = Server::start();
    let mut c = s.conn();
    // 1 token/s, capacity 2: a 300 ms lease of one token leaves one; BLOCK
    // for two reserves into debt (-1) and is answered about 1 s later. By
    // then the bare bucket has refilled to about 0 and the expired lease's
    // token is back: one whole token, not the zero of the stored state.
    let _ = lease(&mut c, "b", "1", 2, 1, 300);
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("b")
        .arg("1")
        .arg(2)
        .arg(2)
        .arg("BLOCK")
        .arg(5_000)
        .query(&mut c)
        .unwrap();
    assert_eq!((r[0], r[4]), (1, 2), "granted after its wait: {r:?}");
    assert!(
        (1..=2).contains(&r[1]),
        "the expired lease's token is back in the reply: {r:?}"
    );
    // The expired lease is gone: a bucket that holds none shows no lease
    // fields.
    let held = info(&mut c, "b");
    assert!(!held.contains_key("leases"), "{held:?}");
}

#[test]
fn bad_lease_input_gets_a_clear_error_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let id = lease(&mut c, "k", "0", 2, 1, 60_000);
    let before = digest(&mut c, "k");
    let calls: &[(&[&str], &str)] = &[
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE"],
            "LEASE takes a TTL",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE", "0"],
            "LEASE takes a TTL",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE", "-5"],
            "LEASE takes a TTL",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE", "1e3"],
            "LEASE takes a TTL",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE", "86400001"],
            "LEASE takes a TTL",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE", "5", "lease", "5"],
            "LEASE given twice",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "1", "LEASE", "5", "ATMOST"],
            "cannot be combined",
        ),
        (
            &[
                "TB.CONSUME",
                "k",
                "0",
                "2",
                "1",
                "RESERVE",
                "5",
                "LEASE",
                "5",
            ],
            "cannot be combined",
        ),
        (
            &["TB.CONSUME", "k", "0", "2", "0", "LEASE", "5"],
            "n of at least 1",
        ),
        (&["TB.RELEASE", "k", "x"], "lease-id must be"),
        (&["TB.RELEASE", "k", "-1"], "lease-id must be"),
        (
            &["TB.RELEASE", "k", "1", "USED"],
            "wrong number of arguments",
        ),
        (&["TB.RELEASE", "k", "1", "USED", "-1"], "USED takes"),
        (
            &["TB.RELEASE", "k", "1", "SPENT", "1"],
            "TB.RELEASE takes USED n",
        ),
        (&["TB.RELEASE", "k"], "wrong number of arguments"),
        (
            &["TB.MCONSUME", "1", "k", "0", "2", "1", "LEASE", "2", "5"],
            "part number",
        ),
        (
            &["TB.MCONSUME", "1", "k", "0", "2", "1", "LEASE", "0", "5"],
            "part number",
        ),
        (
            &["TB.MCONSUME", "1", "k", "0", "2", "1", "LEASE", "1"],
            "part number",
        ),
        (
            &["TB.MCONSUME", "1", "k", "0", "2", "1", "LEASE", "1", "0"],
            "LEASE takes a TTL",
        ),
        (
            &[
                "TB.MCONSUME",
                "1",
                "k",
                "0",
                "2",
                "1",
                "LEASE",
                "1",
                "5",
                "LEASE",
                "1",
                "5",
            ],
            "LEASE given twice",
        ),
        (
            &["TB.MCONSUME", "1", "k", "0", "2", "0", "LEASE", "1", "5"],
            "n of at least 1",
        ),
        (
            &[
                "TB.MCONSUME",
                "1",
                "k",
                "0",
                "2",
                "1",
                "RESERVE",
                "5",
                "RESERVE",
                "5",
            ],
            "unknown option",
        ),
    ];
    for (args, want) in calls {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        let e = cmd.query::<Value>(&mut c).unwrap_err();
        assert!(e.to_string().contains(want), "{args:?}: {e}");
        assert_eq!(digest(&mut c, "k"), before, "{args:?} changed the bucket");
    }
    // A full lease table: refused, nothing changed.
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut c).unwrap();
    let mut p = redis::pipe();
    for _ in 0..1024 {
        p.cmd("TB.CONSUME")
            .arg("k")
            .arg("0")
            .arg(5000)
            .arg(1)
            .arg("LEASE")
            .arg(60_000);
    }
    let granted: Vec<Vec<i64>> = p.query(&mut c).unwrap();
    assert!(granted.iter().all(|r| r[0] == 1));
    let before = digest(&mut c, "k");
    let e = redis::cmd("TB.CONSUME")
        .arg("k")
        .arg("0")
        .arg(5000)
        .arg(1)
        .arg("LEASE")
        .arg(60_000)
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("holds 1024 leases already"), "{e}");
    assert_eq!(digest(&mut c, "k"), before);
    assert_eq!(info(&mut c, "k")["leases"], "1024");
    let mem: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("k")
        .query(&mut c)
        .unwrap();
    assert!(mem < 40_000, "1024 leases take {mem} bytes");
    assert!(id > 0);
}

#[test]
fn rpm_tpm_and_in_flight_in_one_call_in_a_cluster() {
    let cluster = Cluster::start();
    let mut cc = cluster.conn();
    let args = |reserve: bool| {
        let mut cmd = redis::cmd("TB.MCONSUME");
        cmd.arg(3)
            .arg("{user:7}:rpm")
            .arg("{user:7}:tpm")
            .arg("{user:7}:inflight")
            .arg("60/m")
            .arg(60)
            .arg(1)
            .arg("1000/m")
            .arg(1000)
            .arg(400)
            .arg(0)
            .arg(1)
            .arg(1)
            .arg("LEASE")
            .arg(3)
            .arg(60_000)
            .arg("LEASE")
            .arg(2)
            .arg(60_000);
        if reserve {
            cmd.arg("RESERVE").arg(30_000);
        }
        cmd
    };
    let r: Vec<i64> = args(false).query(&mut cc).unwrap();
    assert_eq!(&r[..5], &[1, 0, 59, 600, 0], "{r:?}");
    assert_eq!(r[5], 0, "the RPM part is taken, not lent");
    assert!(r[6] > 0 && r[7] > 0, "{r:?}");
    // The in-flight part is short: denied whole even with RESERVE, with
    // the wait for the lease's expiry, and nothing taken.
    let d: Vec<i64> = args(true).query(&mut cc).unwrap();
    assert_eq!(d[0], 0, "{d:?}");
    assert!(d[1] > 59_000, "the wait for the in-flight lease: {d:?}");
    assert_eq!(&d[2..5], &[59, 600, 0]);
    let settled: Option<i64> = redis::cmd("TB.RELEASE")
        .arg("{user:7}:tpm")
        .arg(r[6])
        .arg("USED")
        .arg(550)
        .query(&mut cc)
        .unwrap();
    assert_eq!(settled, Some(-150));
    let released: Option<i64> = redis::cmd("TB.RELEASE")
        .arg("{user:7}:inflight")
        .arg(r[7])
        .query(&mut cc)
        .unwrap();
    assert_eq!(released, Some(1));
    let again: Option<i64> = redis::cmd("TB.RELEASE")
        .arg("{user:7}:inflight")
        .arg(r[7])
        .query(&mut cc)
        .unwrap();
    assert_eq!(again, None, "a retried release gives nothing back");
    let t = info(&mut cc, "{user:7}:tpm");
    assert!(
        t["tokens"].starts_with("45"),
        "1000 - 550 plus refill: {t:?}"
    );
    // Without hash tags the keys are refused before anything changes.
    let e = redis::cmd("TB.MCONSUME")
        .arg(2)
        .arg("a:inflight")
        .arg("b:inflight")
        .arg(0)
        .arg(1)
        .arg(1)
        .arg(0)
        .arg(1)
        .arg(1)
        .arg("LEASE")
        .arg(1)
        .arg(100)
        .query::<Value>(&mut cc)
        .unwrap_err();
    assert!(
        e.to_string().contains("CROSSSLOT") || e.to_string().contains("same slot"),
        "{e}"
    );
}

/// `TB.CONSUME key rate capacity n LEASE ttl [KEEP]`: the lease id.
fn lease_with(c: &mut Connection, key: &str, rate: &str, cap: u64, n: u64, lease: &[&str]) -> i64 {
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .arg("LEASE")
        .arg(lease)
        .query(c)
        .unwrap();
    assert_eq!(r[0], 1, "{key}: {r:?}");
    r[5]
}

fn remaining(c: &mut Connection, key: &str, rate: &str, cap: u64) -> i64 {
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(0)
        .query(c)
        .unwrap();
    r[1]
}

#[test]
fn a_kept_lease_stays_used_at_expiry_on_the_master_its_replica_and_after_a_reload() {
    let s = Server::start();
    let r = replica_of(&s, ServerConfig::default());
    let mut c = s.conn();
    // An estimate of 6 kept, a slot of 4 returned, both for 300 ms, on a
    // bucket of 10 with no refill; and the same in one TB.MCONSUME.
    let t0 = Instant::now();
    let estimate = lease_with(&mut c, "k", "0", 10, 6, &["300", "KEEP"]);
    lease_with(&mut c, "k", "0", 10, 4, &["300"]);
    let m: Vec<i64> = redis::cmd("TB.MCONSUME")
        .arg(2)
        .arg("{m}est")
        .arg("{m}slot")
        .arg(&["0", "10", "6", "0", "10", "4"])
        .arg(&["LEASE", "1", "300", "keep", "LEASE", "2", "300"])
        .query(&mut c)
        .unwrap();
    assert_eq!(m[0], 1, "{m:?}");
    let _: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(300),
        "the reload ran before the leases expired: the KEEP flag went through RDB"
    );
    std::thread::sleep(
        Duration::from_millis(300).saturating_sub(t0.elapsed()) + Duration::from_millis(20),
    );
    assert_eq!(
        remaining(&mut c, "k", "0", 10),
        4,
        "the slot came back, the estimate did not"
    );
    assert_eq!(remaining(&mut c, "{m}est", "0", 10), 4);
    assert_eq!(remaining(&mut c, "{m}slot", "0", 10), 10);
    assert_eq!(
        release(&mut c, "k", estimate, None),
        None,
        "expired: nothing to release"
    );
    // A write to replicate the expiry, then the replica agrees exactly.
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("k")
        .arg("0")
        .arg(10)
        .arg(1)
        .query(&mut c)
        .unwrap();
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(15_000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let mut rc = r.conn();
    assert_eq!(digest(&mut rc, "k"), digest(&mut c, "k"));
    assert_eq!(info(&mut rc, "k")["tokens"], "3");
}

#[test]
fn giving_back_works_past_maxmemory_and_replies_what_went_back() {
    let s = Server::start();
    let mut c = s.conn();
    let a = lease(&mut c, "in", "0", 3, 1, 600_000);
    let b = lease(&mut c, "in", "0", 3, 1, 600_000);
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(1)
        .query(&mut c)
        .unwrap();
    let refused = redis::cmd("TB.CONSUME")
        .arg("in")
        .arg("0")
        .arg(3)
        .query::<Value>(&mut c)
        .unwrap_err()
        .to_string();
    assert!(refused.contains("OOM"), "{refused}");
    assert_eq!(
        release(&mut c, "in", a, None),
        Some(1),
        "giving back takes no memory"
    );
    assert_eq!(
        release(&mut c, "missing", 5, None),
        None,
        "nil, not OOM, for a missing key"
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut c)
        .unwrap();
    // The reply is what went back: a refund filled the bucket meanwhile.
    let _: i64 = redis::cmd("TB.REFUND")
        .arg("in")
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(
        release(&mut c, "in", b, None),
        Some(0),
        "the bucket was full: nothing went back"
    );
}

/// Lease ids of `count` leases on `key` (each released again).
fn ids(c: &mut Connection, key: &str, count: usize) -> Vec<i64> {
    (0..count)
        .map(|_| {
            let id = lease(c, key, "0", 5, 1, 600_000);
            assert_eq!(release(c, key, id, None), Some(1));
            id
        })
        .collect()
}

fn server_time_us(c: &mut Connection) -> i64 {
    let t: Vec<i64> = redis::cmd("TIME").query(c).unwrap();
    t[0] * 1_000_000 + t[1]
}

#[test]
fn lease_ids_cannot_be_guessed_and_are_not_handed_out_again() {
    let s = Server::start();
    let mut c = s.conn();
    let now = server_time_us(&mut c);
    let first = ids(&mut c, "k", 200);
    // Not the clock, not a counter: far from TIME, and far from each other.
    for w in first.windows(2) {
        assert!(
            (w[1] - w[0]).abs() > 1_000_000,
            "successive ids close: {w:?}"
        );
    }
    for id in &first {
        assert!(
            (id - now).abs() > 3_600_000_000,
            "an id near TIME in µs: {id} vs {now}"
        );
        assert!((1..1 << 53).contains(id), "{id}");
    }
    // Spread over the range: the top bit of 53 is set in about half.
    let high = first.iter().filter(|&&id| id >= 1 << 52).count();
    assert!(
        (50..=150).contains(&high),
        "{high} of 200 ids in the upper half"
    );
    // The key deleted and made again, or restored from a DUMP: new ids.
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut c).unwrap();
    let again = ids(&mut c, "k", 100);
    let held = lease(&mut c, "r", "0", 5, 1, 600_000);
    let dump: Vec<u8> = redis::cmd("DUMP").arg("r").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("r2")
        .arg(0)
        .arg(dump)
        .query(&mut c)
        .unwrap();
    let restored = ids(&mut c, "r2", 100);
    let mut all: Vec<i64> = first
        .iter()
        .chain(&again)
        .chain(&restored)
        .copied()
        .collect();
    all.push(held);
    let count = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), count, "an id was handed out twice");
}

fn repl_offset(c: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("replication").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .expect("master_repl_offset in INFO replication")
        .trim()
        .parse()
        .unwrap()
}

/// Bytes replicated per call of `run`, over `calls` calls.
fn bytes_per_call(c: &mut Connection, calls: i64, mut run: impl FnMut(&mut Connection)) -> f64 {
    run(c); // the first write may carry a SELECT
    let before = repl_offset(c);
    for _ in 0..calls {
        run(c);
    }
    (repl_offset(c) - before) as f64 / calls as f64
}

#[test]
fn replication_bytes_per_call_do_not_grow_with_the_leases_held() {
    let mut s = Server::start_with(ServerConfig {
        args: vec![
            "--appendonly".into(),
            "yes".into(),
            "--aof-use-rdb-preamble".into(),
            "no".into(),
        ],
        ..ServerConfig::default()
    });
    let r = replica_of(&s, ServerConfig::default());
    let mut c = s.conn();
    // "full" holds the most leases a bucket may (1,024), "none" none; same
    // limits (a refill slow enough that neither key expires during the
    // test), same key length.
    for _ in 0..1024 {
        lease(&mut c, "full", "1", 1_000_000, 1, 600_000);
    }
    let take = |key: &'static str| {
        move |c: &mut Connection| {
            let r: Vec<i64> = redis::cmd("TB.CONSUME")
                .arg(key)
                .arg("1")
                .arg(1_000_000)
                .arg(1)
                .query(c)
                .unwrap();
            assert_eq!(r[0], 1);
        }
    };
    let bare = bytes_per_call(&mut c, 200, take("none"));
    let held = bytes_per_call(&mut c, 200, take("full"));
    assert!(bare > 0.0);
    assert!(
        held <= 2.0 * bare,
        "a take replicates {held} bytes on a bucket with 1,024 leases, {bare} on one without"
    );
    // Releasing a lease and taking one again: a change of one lease each.
    let mut ids: Vec<i64> = Vec::new();
    let churn = bytes_per_call(&mut c, 200, |c| {
        if let Some(id) = ids.pop() {
            assert_eq!(release(c, "full", id, None), Some(1));
        } else {
            let r: Vec<i64> = redis::cmd("TB.CONSUME")
                .arg("full")
                .arg("1")
                .arg(1_000_000)
                .arg(1)
                .arg("LEASE")
                .arg(600_000)
                .query(c)
                .unwrap_or_default();
            if r.first() == Some(&1) {
                ids.push(r[5]);
            }
        }
    });
    assert!(
        churn <= 2.0 * bare,
        "a release or a lease replicates {churn} bytes with 1,024 leases held, a take {bare} without"
    );
    // Master, replica and the AOF replayed after a restart hold the same.
    let acked: i64 = redis::cmd("WAIT").arg(1).arg(15_000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let master = [digest(&mut c, "full"), digest(&mut c, "none")];
    let mut rc = r.conn();
    assert_eq!([digest(&mut rc, "full"), digest(&mut rc, "none")], master);
    drop(c);
    s.restart();
    let mut c = s.conn();
    assert_eq!([digest(&mut c, "full"), digest(&mut c, "none")], master);
}
