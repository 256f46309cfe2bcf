//! Crash durability: the server is killed with SIGKILL in the middle of a
//! load of TB.CONSUME calls and restarted from its files. With
//! `appendonly yes` and `appendfsync always` (and `everysec`, for a process
//! crash), every grant a client saw acknowledged is still taken (nothing
//! lost) and none is taken twice (nothing duplicated); with RDB, the buckets
//! are exactly as snapshotted.
//! Either way, a bucket whose time passed while the server was down has
//! refilled by the server clock, from its stored time: the files hold
//! absolute state, not calls to replay.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    aof_rewrite_done, digest, info_field, nanos, server_time_us, state, Server, ServerConfig,
};
use redis::Connection;

/// Load keys: fixed budgets (rate 0), so their tokens are exact integers.
const LOAD_KEYS: usize = 4;
const LOAD_CAP: u64 = 1_000_000;
/// Load connections, each with at most one call in flight.
const CLIENTS: usize = 4;

/// The refilling bucket: 1000 tokens/s (one token per ms, a nano-token per
/// ns), capacity far above what it can refill during a test.
const REFILL_KEY: &str = "refill";
const REFILL_RATE: &str = "1000";
const REFILL_CAP: u64 = 100_000_000;
/// What the test takes from the refilling bucket, leaving this level.
const REFILL_LEVEL: u64 = 50_000_000;
/// Nano-tokens the refilling bucket gains per microsecond.
const REFILL_NANOS_PER_US: i128 = 1_000_000;
/// How long the server stays down after a kill, so that the refilling
/// bucket's time visibly passes (the bounds checked do not depend on it).
const DOWNTIME: Duration = Duration::from_millis(300);

fn load_key(i: usize) -> String {
    format!("load:{i}")
}

/// Tokens taken from load key `i`: its capacity minus its exact tokens.
fn taken(c: &mut Connection, i: usize) -> u64 {
    let t = nanos(&state(c, &load_key(i))["tokens"]);
    assert_eq!(t % 1_000_000_000, 0, "rate 0 keeps whole tokens");
    LOAD_CAP - (t / 1_000_000_000) as u64
}

/// Takes [`REFILL_LEVEL`] tokens from a new refilling bucket; returns its
/// stored time (`updated_at_ms`).
fn start_refilling(c: &mut Connection) -> i64 {
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(REFILL_KEY)
        .arg(REFILL_RATE)
        .arg(REFILL_CAP)
        .arg(REFILL_CAP - REFILL_LEVEL)
        .query(c)
        .unwrap();
    assert_eq!(r[0..2], [1, REFILL_LEVEL as i64]);
    state(c, REFILL_KEY)["updated_at_ms"].parse().unwrap()
}

/// Checks that the refilling bucket kept its stored time `updated_ms` and
/// holds exactly its level plus refill from that time to the server's
/// clock now. Returns the refill since the stored time, in tokens, and the
/// server time just before TB.INFO.
///
/// Exact bounds: the bucket's stored time is within `[updated_ms * 1000,
/// updated_ms * 1000 + 999]` µs; TB.INFO reads the clock between two TIME
/// calls `t1` and `t2` (on Redis 7.0 the millisecond clock, up to 999 µs
/// below `t1`).
fn assert_refilled_by_clock(c: &mut Connection, updated_ms: i64) -> (f64, i64) {
    let t1 = server_time_us(c);
    let i = state(c, REFILL_KEY);
    let t2 = server_time_us(c);
    assert_eq!(
        i["updated_at_ms"],
        updated_ms.to_string(),
        "the stored time is restored as it was, not replayed at start-up"
    );
    let level = i128::from(REFILL_LEVEL) * 1_000_000_000;
    let low = level + i128::from(t1 - 999 - (updated_ms * 1000 + 999)) * REFILL_NANOS_PER_US;
    let high = level + i128::from(t2 - updated_ms * 1000) * REFILL_NANOS_PER_US;
    let got = nanos(&i["tokens"]);
    assert!(
        (low..=high).contains(&got),
        "tokens {} not in [{low}, {high}] nano-tokens (TIME {t1}..{t2} µs, stored at {updated_ms} ms)",
        i["tokens"]
    );
    ((got - level) as f64 / 1e9, t1)
}

/// What the load clients saw.
#[derive(Default)]
struct Tally {
    /// Clients whose connection failed under them.
    interrupted: usize,
    /// Tokens acknowledged as granted, per load key.
    acked: [u64; LOAD_KEYS],
    /// Tokens of calls sent without a reply (at most one per client), per key.
    in_flight: [u64; LOAD_KEYS],
    /// Acknowledged calls.
    calls: u64,
}

/// Starts [`CLIENTS`] connections calling `TB.CONSUME load:k 0 LOAD_CAP n`
/// in a loop until `stop` is set or their connection fails, at most
/// `max_calls` calls each. `progress` counts acknowledged calls.
fn load<'s>(
    scope: &'s thread::Scope<'s, '_>,
    server: &Server,
    max_calls: u64,
    stop: &'s AtomicBool,
    progress: &'s AtomicU64,
) -> Vec<thread::ScopedJoinHandle<'s, Tally>> {
    (0..CLIENTS)
        .map(|client| {
            let mut c = server.conn();
            scope.spawn(move || {
                let mut t = Tally::default();
                for call in 0..max_calls {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let k = (client + call as usize) % LOAD_KEYS;
                    let n = 1 + call % 3;
                    let r: redis::RedisResult<Vec<i64>> = redis::cmd("TB.CONSUME")
                        .arg(load_key(k))
                        .arg(0)
                        .arg(LOAD_CAP)
                        .arg(n)
                        .query(&mut c);
                    match r {
                        Ok(r) => {
                            assert_eq!(r[0], 1, "the budget is never exhausted: {r:?}");
                            t.acked[k] += r[4] as u64;
                            t.calls += 1;
                            progress.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            assert!(!e.is_timeout(), "the server hung: {e}");
                            // Sent, maybe applied, never acknowledged.
                            t.in_flight[k] += n;
                            t.interrupted += 1;
                            break;
                        }
                    }
                }
                t
            })
        })
        .collect()
}

/// Sets the flag when dropped, so load threads stop even if the test
/// panics inside their scope.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn wait_progress(progress: &AtomicU64, at_least: u64, what: &str) {
    let end = Instant::now() + Duration::from_secs(60);
    while progress.load(Ordering::Relaxed) < at_least {
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}: {} calls acknowledged",
            progress.load(Ordering::Relaxed)
        );
        thread::sleep(Duration::from_millis(5));
    }
}

fn sum(tallies: &[Tally]) -> Tally {
    let mut all = Tally::default();
    for t in tallies {
        for k in 0..LOAD_KEYS {
            all.acked[k] += t.acked[k];
            all.in_flight[k] += t.in_flight[k];
        }
        all.calls += t.calls;
        all.interrupted += t.interrupted;
    }
    all
}

#[test]
fn kill9_under_load_with_aof_keeps_every_acknowledged_grant() {
    let mut s = Server::start_with(ServerConfig {
        args: ["--appendonly", "yes", "--appendfsync", "always"]
            .map(String::from)
            .to_vec(),
        ..ServerConfig::default()
    });
    let refill_updated = start_refilling(&mut s.conn());
    // Tokens taken from each load key, exactly, as of the last restart.
    let mut baseline = [0u64; LOAD_KEYS];
    for round in 1..=3 {
        let mut c = s.conn();
        if round == 3 {
            // The default fsync policy: the AOF is still written before each
            // reply, only fsynced later, so a dead process loses nothing.
            let ok: String = redis::cmd("CONFIG")
                .arg("SET")
                .arg("appendfsync")
                .arg("everysec")
                .query(&mut c)
                .unwrap();
            assert_eq!(ok, "OK");
        }
        let (stop, progress) = (AtomicBool::new(false), AtomicU64::new(0));
        let (tally, killed_at_us) = thread::scope(|scope| {
            let _stop = StopOnDrop(&stop);
            let handles = load(scope, &s, 1_000_000, &stop, &progress);
            wait_progress(&progress, 300, "the load to start");
            if round == 1 {
                // Rewrite the AOF in the middle of the load (a base file
                // plus increments), while calls keep coming.
                let _: String = redis::cmd("BGREWRITEAOF").query(&mut c).unwrap();
                s.wait_for("the AOF rewrite", Duration::from_secs(30), |c| {
                    aof_rewrite_done(c)
                });
                assert_eq!(
                    info_field(&mut c, "persistence", "aof_last_bgrewrite_status"),
                    "ok"
                );
                let now = progress.load(Ordering::Relaxed);
                wait_progress(&progress, now + 300, "calls after the rewrite");
            }
            let killed_at_us = server_time_us(&mut c);
            s.kill9();
            let tallies: Vec<Tally> = handles.into_iter().map(|h| h.join().unwrap()).collect();
            (sum(&tallies), killed_at_us)
        });
        assert_eq!(
            tally.interrupted, CLIENTS,
            "the kill interrupted every client's load"
        );
        assert!(
            tally.in_flight.iter().sum::<u64>() <= 3 * CLIENTS as u64,
            "at most one call of at most 3 tokens in flight per client"
        );
        // Down for a while: the refilling bucket's time passes.
        thread::sleep(DOWNTIME);
        s.restart();
        let mut c = s.conn();
        for (k, base) in baseline.iter_mut().enumerate() {
            let applied = taken(&mut c, k) - *base;
            // Every acknowledged grant is there; of the calls in flight at
            // the kill (at most one per connection), each may or may not
            // have been applied; nothing was applied twice.
            assert!(
                tally.acked[k] <= applied && applied <= tally.acked[k] + tally.in_flight[k],
                "round {round}, {}: {applied} tokens taken, {} acknowledged, {} in flight",
                load_key(k),
                tally.acked[k],
                tally.in_flight[k]
            );
            *base += applied;
        }
        let (refill, t1) = assert_refilled_by_clock(&mut c, refill_updated);
        let downtime_us = t1 - killed_at_us;
        assert!(downtime_us >= DOWNTIME.as_micros() as i64);
        eprintln!(
            "round {round}: {} calls acknowledged, {} in flight; down {downtime_us} µs; \
             refilled {refill} tokens since the bucket's stored time",
            tally.calls,
            tally.in_flight.iter().sum::<u64>()
        );
    }
}

#[test]
fn debug_reload_and_rdb_snapshots_restore_exact_state() {
    let mut s = Server::start();
    let mut c = s.conn();
    let refill_updated = start_refilling(&mut c);

    // DEBUG RELOAD (save an RDB, empty the dataset, load it back) several
    // times while clients consume: each call is served before or after a
    // reload, so every acknowledged grant is there exactly.
    let (stop, progress) = (AtomicBool::new(false), AtomicU64::new(0));
    let tally = thread::scope(|scope| {
        let _stop = StopOnDrop(&stop);
        let handles = load(scope, &s, 1000, &stop, &progress);
        for round in 1..=3 {
            wait_progress(&progress, round * 800, "the load");
            let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
            assert_eq!(ok, "OK");
        }
        let tallies: Vec<Tally> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        sum(&tallies)
    });
    assert_eq!(tally.calls, 1000 * CLIENTS as u64, "every call answered");
    for k in 0..LOAD_KEYS {
        assert_eq!(taken(&mut c, k), tally.acked[k], "{}", load_key(k));
    }
    assert_refilled_by_clock(&mut c, refill_updated);
    let mut keys: Vec<String> = (0..LOAD_KEYS).map(load_key).collect();
    keys.push(REFILL_KEY.into());
    let digests: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    let ok: String = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    let after: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    assert_eq!(after, digests, "DEBUG RELOAD keeps every value bit for bit");

    // An RDB snapshot, more grants, SIGKILL, restart from the snapshot: the
    // buckets are exactly as saved. (Grants after the last snapshot are
    // forgotten with RDB alone: that is what appendfsync always is for.)
    let ok: String = redis::cmd("SAVE").query(&mut c).unwrap();
    assert_eq!(ok, "OK");
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(load_key(0))
        .arg(0)
        .arg(LOAD_CAP)
        .arg(1000)
        .query(&mut c)
        .unwrap();
    assert_eq!(r[4], 1000);
    let killed_at_us = server_time_us(&mut c);
    s.kill9();
    thread::sleep(DOWNTIME);
    s.restart();
    let mut c = s.conn();
    let restored: Vec<String> = keys.iter().map(|k| digest(&mut c, k)).collect();
    assert_eq!(restored, digests, "the snapshot's values, bit for bit");
    assert_eq!(taken(&mut c, 0), tally.acked[0]);
    let (refill, t1) = assert_refilled_by_clock(&mut c, refill_updated);
    let downtime_us = t1 - killed_at_us;
    assert!(downtime_us >= DOWNTIME.as_micros() as i64);
    eprintln!("down {downtime_us} µs; refilled {refill} tokens since the bucket's stored time");
}
