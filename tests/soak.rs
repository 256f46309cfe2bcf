//! Soak: hours' worth of mixed load compressed into seconds, then proof that
//! nothing was lost or handed out.
//!
//! A master (AOF on) with a replica attached gets 100,000 buckets at once,
//! then `TB_SOAK_SECONDS` (default 20) of load: clients hammering audited
//! buckets in every mode (plain, ATMOST, RESERVE, BLOCK, TB.MCONSUME,
//! CL.THROTTLE), churn that creates and refunds short-lived buckets, clients
//! that connect, send BLOCK and vanish before the reply, and a BGSAVE or
//! BGREWRITEAOF every few seconds. Afterwards:
//! - master and replica hold identical data (`DEBUG DIGEST`);
//! - no client ever got a grant the exact bound forbids: for each audited
//!   bucket and every time window the clients can prove, the tokens granted
//!   in it are at most `capacity + rate * window`;
//! - once the buckets have expired, both servers hold no keys and their
//!   memory is back to the baseline measured before the load.
//!
//! `make soak` runs the long form (TB_SOAK_SECONDS=300).

mod common;

use common::rng::Rng;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    dataset_digest, info_field, replica_of, server_version, sync_replica, used_memory, Server,
    ServerConfig,
};
use redis::{Connection, Value};

/// Audited buckets: `(key, rate as TB.CONSUME takes it, count, period,
/// capacity)`, the rate being exactly `count / period` tokens per second.
const AUDITED: [(&str, &str, u64, u64, u64); 4] = [
    ("audit:a", "50", 50, 1, 20),
    ("audit:b", "5", 5, 1, 3),
    ("audit:c", "200", 200, 1, 50),
    ("audit:d", "2.5", 5, 2, 4),
];
/// Buckets created at once before the load.
const BULK: u64 = 100_000;
/// Threads hammering the audited buckets.
const AUDITORS: usize = 4;
/// `tb.max-blocked` for the soak: past it, BLOCK answers as RESERVE would.
const MAX_BLOCKED: usize = 64;

/// The module's clock may read up to this much earlier than a `TIME` reply
/// sent before the command: Redis 7.0 gives modules whole milliseconds.
const CLOCK_SLACK_US: i64 = 1000;

fn soak_seconds() -> u64 {
    std::env::var("TB_SOAK_SECONDS").map_or(20, |v| v.parse().expect("TB_SOAK_SECONDS"))
}

fn connected_clients(c: &mut Connection) -> i64 {
    info_field(c, "clients", "connected_clients")
        .parse()
        .unwrap()
}

fn dbsize(c: &mut Connection) -> i64 {
    redis::cmd("DBSIZE").query(c).unwrap()
}

/// Server time in µs from a `TIME` reply.
fn time_us(v: &Value) -> i64 {
    let t: Vec<String> = redis::from_redis_value(v).unwrap();
    t[0].parse::<i64>().unwrap() * 1_000_000 + t[1].parse::<i64>().unwrap()
}

/// One grant a client saw: `amount` tokens of audited bucket `bucket`,
/// taking effect (for a reservation: falling due) at a server time known to
/// lie in `[lo, hi]` microseconds.
#[derive(Clone, Copy, Debug)]
struct Grant {
    bucket: usize,
    amount: u64,
    lo: i64,
    hi: i64,
}

/// Sends `TIME, cmd, TIME` in one round trip; the command ran between the
/// two times. Returns `(t1, reply, t2)`.
fn timed(c: &mut Connection, cmd: &redis::Cmd) -> (i64, Value, i64) {
    let mut p = redis::pipe();
    p.cmd("TIME").add_command(cmd.clone()).cmd("TIME");
    let v: Vec<Value> = p.query(c).unwrap_or_else(|e| panic!("{e}"));
    (time_us(&v[0]), v[1].clone(), time_us(&v[2]))
}

/// When a grant takes effect: now, or when a reservation of `retry_ms` falls
/// due (the exact wait is in `((retry_ms - 1) ms, retry_ms ms]`).
fn window(t1: i64, t2: i64, retry_ms: i64) -> (i64, i64) {
    if retry_ms <= 0 {
        (t1 - CLOCK_SLACK_US, t2)
    } else {
        (
            t1 - CLOCK_SLACK_US + (retry_ms - 1) * 1000,
            t2 + retry_ms * 1000,
        )
    }
}

/// One auditor: requests in every mode on the audited buckets, recording
/// every grant it sees.
fn auditor(port: u16, seed: u64, stop: Arc<AtomicBool>, requests: Arc<AtomicU64>) -> Vec<Grant> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut c = client.get_connection().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rng = Rng(seed | 1);
    let mut grants = Vec::new();
    while !stop.load(Relaxed) {
        let i = rng.below(AUDITED.len() as u64) as usize;
        let (key, rate, count, period, cap) = AUDITED[i];
        let n = 1 + rng.below(cap.min(5));
        requests.fetch_add(1, Relaxed);
        match rng.below(7) {
            0..=1 => {
                let (t1, v, t2) = timed(
                    &mut c,
                    redis::cmd("TB.CONSUME").arg(key).arg(rate).arg(cap).arg(n),
                );
                let r: Vec<i64> = redis::from_redis_value(&v).unwrap();
                if r[0] == 1 {
                    let (lo, hi) = window(t1, t2, r[2]);
                    grants.push(Grant {
                        bucket: i,
                        amount: r[4] as u64,
                        lo,
                        hi,
                    });
                }
            }
            2 => {
                let (t1, v, t2) = timed(
                    &mut c,
                    redis::cmd("TB.CONSUME")
                        .arg(key)
                        .arg(rate)
                        .arg(cap)
                        .arg(n + 3)
                        .arg("ATMOST"),
                );
                let r: Vec<i64> = redis::from_redis_value(&v).unwrap();
                if r[0] == 1 {
                    let (lo, hi) = window(t1, t2, 0);
                    grants.push(Grant {
                        bucket: i,
                        amount: r[4] as u64,
                        lo,
                        hi,
                    });
                }
            }
            3 | 4 => {
                let mode = if rng.below(2) == 0 {
                    "RESERVE"
                } else {
                    "BLOCK"
                };
                let (t1, v, t2) = timed(
                    &mut c,
                    redis::cmd("TB.CONSUME")
                        .arg(key)
                        .arg(rate)
                        .arg(cap)
                        .arg(n)
                        .arg(mode)
                        .arg(rng.below(300)),
                );
                let r: Vec<i64> = redis::from_redis_value(&v).unwrap();
                if r[0] == 1 {
                    // A BLOCK reply comes when the reservation is due (retry
                    // 0, and the second TIME runs after it).
                    let (lo, hi) = window(t1, t2, r[2]);
                    grants.push(Grant {
                        bucket: i,
                        amount: r[4] as u64,
                        lo,
                        hi,
                    });
                }
            }
            5 => {
                let j = (i + 1 + rng.below(AUDITED.len() as u64 - 1) as usize) % AUDITED.len();
                let (key2, rate2, _, _, cap2) = AUDITED[j];
                let n2 = 1 + rng.below(cap2.min(3));
                let mut cmd = redis::cmd("TB.MCONSUME");
                cmd.arg(2).arg(key).arg(key2).arg(rate).arg(cap).arg(n);
                cmd.arg(rate2).arg(cap2).arg(n2);
                if rng.below(2) == 0 {
                    cmd.arg("RESERVE").arg(rng.below(300));
                }
                let (t1, v, t2) = timed(&mut c, &cmd);
                let r: Vec<i64> = redis::from_redis_value(&v).unwrap();
                if r[0] == 1 {
                    // Each bucket's own due time is at most the slowest's.
                    let (lo, _) = window(t1, t2, 0);
                    let hi = t2 + r[1].max(0) * 1000;
                    grants.push(Grant {
                        bucket: i,
                        amount: n,
                        lo,
                        hi,
                    });
                    grants.push(Grant {
                        bucket: j,
                        amount: n2,
                        lo,
                        hi,
                    });
                }
            }
            _ => {
                let (t1, v, t2) = timed(
                    &mut c,
                    redis::cmd("CL.THROTTLE")
                        .arg(key)
                        .arg(cap - 1)
                        .arg(count)
                        .arg(period)
                        .arg(n),
                );
                let r: Vec<i64> = redis::from_redis_value(&v).unwrap();
                if r[0] == 0 {
                    let (lo, hi) = window(t1, t2, 0);
                    grants.push(Grant {
                        bucket: i,
                        amount: n,
                        lo,
                        hi,
                    });
                }
            }
        }
    }
    grants
}

/// Clients that connect, send BLOCK on an audited bucket and vanish before
/// the reply; the tokens stay taken (unseen grants only make the audit of
/// seen grants stricter).
fn vanisher(port: u16, seed: u64, stop: Arc<AtomicBool>, count: Arc<AtomicU64>) {
    let mut rng = Rng(seed | 1);
    while !stop.load(Relaxed) {
        let (key, rate, _, _, cap) = AUDITED[rng.below(AUDITED.len() as u64) as usize];
        let cmd = format!(
            "*7\r\n$10\r\nTB.CONSUME\r\n${}\r\n{key}\r\n${}\r\n{rate}\r\n${}\r\n{cap}\r\n$1\r\n1\r\n$5\r\nBLOCK\r\n$3\r\n250\r\n",
            key.len(),
            rate.len(),
            cap.to_string().len()
        );
        let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
        sock.write_all(cmd.as_bytes()).unwrap();
        thread::sleep(Duration::from_millis(rng.below(30)));
        drop(sock);
        count.fetch_add(1, Relaxed);
    }
}

/// Churn: short-lived buckets created, drained, refunded, reserved, in
/// pipelines; every one is full (and expires) within 5 s.
fn churner(port: u16, seed: u64, stop: Arc<AtomicBool>, created: Arc<AtomicU64>) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut c = client.get_connection().unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut rng = Rng(seed | 1);
    let mut serial = 0u64;
    while !stop.load(Relaxed) {
        let mut p = redis::pipe();
        for _ in 0..200 {
            serial += 1;
            let key = format!("churn:{seed}:{serial}");
            let cap = 1 + rng.below(100);
            // Full again within 1 to 5 seconds.
            let rate = format!("{}/s", cap.div_ceil(1 + rng.below(5)));
            let n = 1 + rng.below(cap);
            match rng.below(6) {
                0 => p
                    .cmd("TB.CONSUME")
                    .arg(&key)
                    .arg(&rate)
                    .arg(cap)
                    .arg(n)
                    .arg("RESERVE")
                    .arg(100),
                1 => p
                    .cmd("TB.CONSUME")
                    .arg(&key)
                    .arg(&rate)
                    .arg(cap)
                    .arg(n)
                    .arg("ATMOST"),
                2 => p
                    .cmd("TB.MCONSUME")
                    .arg(2)
                    .arg(&key)
                    .arg(format!("{key}:b"))
                    .arg(&rate)
                    .arg(cap)
                    .arg(n)
                    .arg(&rate)
                    .arg(cap)
                    .arg(1),
                3 => p
                    .cmd("CL.THROTTLE")
                    .arg(&key)
                    .arg(cap - 1)
                    .arg(cap)
                    .arg(1)
                    .arg(n),
                _ => p.cmd("TB.CONSUME").arg(&key).arg(&rate).arg(cap).arg(n),
            };
            if rng.below(4) == 0 {
                p.cmd("TB.REFUND").arg(&key).arg(rng.below(cap + 1));
            }
        }
        let _: Vec<Value> = p.query(&mut c).unwrap();
        created.fetch_add(200, Relaxed);
    }
}

/// A BGSAVE or a BGREWRITEAOF every 2 seconds, alternately.
fn persister(port: u16, stop: Arc<AtomicBool>) -> (u64, u64) {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut c = client.get_connection().unwrap();
    let (mut saves, mut rewrites) = (0, 0);
    let mut turn = 0;
    while !stop.load(Relaxed) {
        thread::sleep(Duration::from_secs(2));
        turn += 1;
        let cmd = if turn % 2 == 0 {
            "BGSAVE"
        } else {
            "BGREWRITEAOF"
        };
        match redis::cmd(cmd).query::<Value>(&mut c) {
            Ok(_) if cmd == "BGSAVE" => saves += 1,
            Ok(_) => rewrites += 1,
            // Another fork still running: try again next time.
            Err(e) => assert!(
                e.to_string().contains("progress") || e.to_string().contains("child process"),
                "{cmd}: {e}"
            ),
        }
    }
    (saves, rewrites)
}

/// Checks every window `[lo_a, hi_b]` the grants of one bucket define: the
/// grants that certainly took effect inside it total at most
/// `capacity + rate * (hi_b - lo_a)`. Returns the number of windows checked,
/// or the first window that breaks the bound.
fn audit(bucket: usize, grants: &[Grant]) -> Result<u64, String> {
    let (key, _, count, period, cap) = AUDITED[bucket];
    let mut g: Vec<Grant> = grants
        .iter()
        .copied()
        .filter(|g| g.bucket == bucket)
        .collect();
    g.sort_by_key(|g| g.lo);
    let mut windows = 0;
    // Sweep the window's start down through the grants' starts, keeping the
    // grants that start at or after it sorted by end.
    let mut by_end: Vec<(i64, u64)> = Vec::new();
    for a in (0..g.len()).rev() {
        let pos = by_end.partition_point(|&(hi, _)| hi < g[a].hi);
        by_end.insert(pos, (g[a].hi, g[a].amount));
        if a > 0 && g[a - 1].lo == g[a].lo {
            continue;
        }
        let start = g[a].lo;
        let mut sum: u128 = 0;
        for &(end, amount) in &by_end {
            sum += u128::from(amount);
            let span = u128::try_from(end - start).unwrap_or(0);
            // sum <= cap + count/period * span/1e6, in integers.
            let lhs = sum * u128::from(period) * 1_000_000;
            let rhs = u128::from(cap) * u128::from(period) * 1_000_000 + u128::from(count) * span;
            if lhs > rhs {
                return Err(format!(
                    "{key}: {sum} tokens granted within {span} µs, more than {cap} + \
                     {count}/{period} per s allows"
                ));
            }
            windows += 1;
        }
    }
    Ok(windows)
}

/// Polls `f` every 100 ms until it holds, for at most `deadline`.
fn eventually(what: &str, deadline: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !f() {
        assert!(
            Instant::now() < end,
            "timed out after {deadline:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// What one round of load did.
struct Round {
    grants: Vec<Grant>,
    requests: u64,
    vanished: u64,
    churned: u64,
    saves: u64,
    rewrites: u64,
    bulk_keys: i64,
    peak_memory: i64,
}

/// Creates `BULK` buckets at once (each full again, and expired, between a
/// third and two thirds of the way through, or after 4 to 5 s in a short
/// round), then runs every kind of load
/// on the master for `secs` seconds.
fn load(m: &Server, secs: u64, seed: u64) -> Round {
    let mut mc = m.conn();
    // (At least 4 s, so that none expires while the rest are being created.)
    let first = (secs * 1000 / 3).max(4000);
    let fill_ms = |i: u64| first + i * 7 % (secs * 1000 / 3).max(1000);
    for chunk in 0..BULK / 2000 {
        let mut p = redis::pipe();
        for i in chunk * 2000..(chunk + 1) * 2000 {
            // 10 tokens refilled in about fill_ms: the rate in milli-tokens/s.
            let milli = 10_000_000 / fill_ms(i);
            let rate = format!("{}.{:03}", milli / 1000, milli % 1000);
            p.cmd("TB.CONSUME")
                .arg(format!("bulk:{seed}:{i}"))
                .arg(rate)
                .arg(10)
                .arg(10)
                .ignore();
        }
        let _: () = p.query(&mut mc).unwrap();
    }
    let bulk_keys = dbsize(&mut mc);
    assert!(bulk_keys >= BULK as i64, "100k buckets exist");

    let connections_before = connected_clients(&mut mc);
    let stop = Arc::new(AtomicBool::new(false));
    let requests = Arc::new(AtomicU64::new(0));
    let vanished = Arc::new(AtomicU64::new(0));
    let churned = Arc::new(AtomicU64::new(0));
    let auditors: Vec<_> = (0..AUDITORS)
        .map(|i| {
            let (stop, requests, port) = (stop.clone(), requests.clone(), m.port);
            thread::spawn(move || auditor(port, seed + 10 + i as u64, stop, requests))
        })
        .collect();
    let vanishers: Vec<_> = (0..2)
        .map(|i| {
            let (stop, count, port) = (stop.clone(), vanished.clone(), m.port);
            thread::spawn(move || vanisher(port, seed + 20 + i, stop, count))
        })
        .collect();
    let churners: Vec<_> = (0..2)
        .map(|i| {
            let (stop, count, port) = (stop.clone(), churned.clone(), m.port);
            thread::spawn(move || churner(port, seed + 30 + i, stop, count))
        })
        .collect();
    let persister = {
        let (stop, port) = (stop.clone(), m.port);
        thread::spawn(move || persister(port, stop))
    };
    let mut peak_memory = used_memory(&mut mc);
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        thread::sleep(Duration::from_millis(500));
        peak_memory = peak_memory.max(used_memory(&mut mc));
    }
    stop.store(true, Relaxed);
    let grants = auditors
        .into_iter()
        .flat_map(|h| h.join().expect("auditor"))
        .collect();
    for h in vanishers.into_iter().chain(churners) {
        h.join().expect("load thread");
    }
    let (saves, rewrites) = persister.join().expect("persister");
    // A vanished client's command may still wait in the server's input when
    // its thread ends; the server handles a connection's last command before
    // it notices the close, so once every load connection is gone, every
    // write of the load is done (and the replica can be compared).
    eventually(
        "the server to see every load connection close",
        Duration::from_secs(30),
        || connected_clients(&mut mc) <= connections_before,
    );
    Round {
        grants,
        requests: requests.load(Relaxed),
        vanished: vanished.load(Relaxed),
        churned: churned.load(Relaxed),
        saves,
        rewrites,
        bulk_keys,
        peak_memory,
    }
}

/// Waits until every bucket has expired on both servers and no fork runs,
/// then returns their `used_memory` once it has stopped moving, the memory
/// fields of INFO, and how long memory took to stop moving.
fn settle(m: &Server, r: &Server) -> (i64, i64, String, Duration) {
    let (mut mc, mut rc) = (m.conn(), r.conn());
    eventually("every bucket to expire", Duration::from_secs(90), || {
        dbsize(&mut mc) == 0
    });
    eventually(
        "the replica to drop every key",
        Duration::from_secs(30),
        || dbsize(&mut rc) == 0,
    );
    eventually("forks to finish", Duration::from_secs(60), || {
        let p: String = redis::cmd("INFO")
            .arg("persistence")
            .query(&mut mc)
            .unwrap();
        p.contains("rdb_bgsave_in_progress:0") && p.contains("aof_rewrite_in_progress:0")
    });
    assert_eq!(
        info_field(&mut mc, "tb", "tb_blocked_now"),
        "0",
        "no client is left waiting"
    );
    // What still moves once the keys are gone is serverCron's work (10 times
    // a second): shrinking the emptied hash tables takes a few ticks (the
    // first two readings, 0.5 s apart, were equal on Redis 7.0 and Valkey
    // 9.1); 10 s is 100 ticks. This holds with reply buffers of a fixed size
    // only (see fixed_reply_buffers): else the polling below grows its own.
    let mut last = (0, 0);
    let still_from = Instant::now();
    eventually("memory to stop moving", Duration::from_secs(10), || {
        thread::sleep(Duration::from_millis(400));
        let now = (used_memory(&mut mc), used_memory(&mut rc));
        let still = now == last;
        last = now;
        still
    });
    let took = still_from.elapsed();
    let summary = [&mut mc, &mut rc].map(memory_summary).join("\n  replica: ");
    (last.0, last.1, format!("  master: {summary}"), took)
}

/// Stops the server from resizing client reply buffers (`DEBUG REPLYBUFFER
/// RESIZING 0`), so that a client polling `INFO` does not move `used_memory`.
///
/// `clientsCronResizeOutputBuffer` (src/server.c of Redis 7.0+ and Valkey)
/// doubles a reply buffer that a reply filled, and a tick later shrinks it
/// to its peak + 1 byte: a client whose replies outgrow its buffer (`INFO
/// memory` is about 1.5 KB, an idle client's buffer 1 KB) grows it by one
/// allocator size class per reply. jemalloc's classes (256 bytes there)
/// reach the reply in 2 replies; the libc malloc of Valkey 9.1 from PyPI
/// (`mem_allocator:libc`) steps by 16 bytes: about 30 replies, 15 s of
/// polling. And the 5 s peak reset, when it falls between a doubling and
/// its shrink, sends the buffer back to 1 KB; at a steady polling pace it
/// falls there again and again. Without the module, a Valkey 9.1 client
/// sending `INFO memory` every 0.4 s moved `used_memory` by 16 bytes a
/// reply: it was still after 13 s in one run, after 33 s in two (the buffer
/// back to 1 KB at 10, 20, 30 s) and never within 40 s in a fourth; here the
/// polling of `settle` kept it moving for 14 s to over 90 s.
fn fixed_reply_buffers(c: &mut Connection) {
    let () = redis::cmd("DEBUG")
        .arg("REPLYBUFFER")
        .arg("RESIZING")
        .arg(0)
        .query(c)
        .unwrap_or_else(|e| panic!("DEBUG REPLYBUFFER RESIZING 0: {e}"));
}

/// The memory fields of INFO, for failure messages.
fn memory_summary(c: &mut Connection) -> String {
    let text: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    text.lines()
        .filter(|l| {
            l.starts_with("used_memory:")
                || l.starts_with("used_memory_overhead:")
                || l.starts_with("used_memory_dataset:")
                || (l.starts_with("mem_") && !l.starts_with("mem_fragmentation"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Makes `n` clients wait in BLOCK at the same time, then lets them finish:
/// Redis keeps the structures of the most clients ever blocked at once for
/// reuse, so the baseline is taken after this peak (`tb.max-blocked` caps it).
fn block_burst(m: &Server, n: usize) {
    let mut c = m.conn();
    // Connect first: on a loaded machine, n connection set-ups can take
    // longer than the buckets below take to refill.
    let mut waiting: Vec<Connection> = (0..n).map(|_| m.conn()).collect();
    // Drained buckets that refill in 2 s (one round trip, so that the
    // first does not refill before the last waiter blocks).
    let mut drain = redis::pipe();
    for i in 0..n {
        drain
            .cmd("TB.CONSUME")
            .arg(format!("burst:{i}"))
            .arg("0.5")
            .arg(1)
            .ignore();
    }
    let () = drain.query(&mut c).unwrap();
    for (i, w) in waiting.iter_mut().enumerate() {
        let cmd = redis::cmd("TB.CONSUME")
            .arg(format!("burst:{i}"))
            .arg("0.5")
            .arg(1)
            .arg(1)
            .arg("BLOCK")
            .arg(3000)
            .get_packed_command();
        w.send_packed_command(&cmd).unwrap();
    }
    eventually(
        &format!("{n} clients to wait at once"),
        Duration::from_secs(2),
        || info_field(&mut c, "tb", "tb_blocked_now") == n.to_string(),
    );
    for w in &mut waiting {
        let r: Vec<i64> = redis::from_redis_value(&w.recv_response().unwrap()).unwrap();
        assert_eq!(r[0], 1);
    }
}

/// Stops active expiry on the master so that both servers look at the same
/// keys, lets the replica catch up, and checks that the two hold identical
/// data; returns the number of keys compared.
fn same_data(mc: &mut Connection, rc: &mut Connection) -> i64 {
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(0)
        .query(mc)
        .unwrap();
    sync_replica(mc);
    let keys = dbsize(mc);
    let (dm, dr) = (dataset_digest(mc), dataset_digest(rc));
    assert_eq!(dm, dr, "master and replica digests differ after the load");
    let _: () = redis::cmd("DEBUG")
        .arg("SET-ACTIVE-EXPIRE")
        .arg(1)
        .query(mc)
        .unwrap();
    keys
}

#[test]
fn soak_loses_nothing_and_grants_nothing_extra() {
    let secs = soak_seconds();
    let started = Instant::now();
    // No per-command latency histograms: Redis allocates one the first time
    // each command runs, which would blur the memory comparison.
    let m = Server::start_with(ServerConfig {
        args: [
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--latency-tracking",
            "no",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect(),
        module_args: vec!["max-blocked".into(), MAX_BLOCKED.to_string()],
        ..ServerConfig::default()
    });
    let r = replica_of(
        &m,
        ServerConfig {
            args: vec!["--latency-tracking".into(), "no".into()],
            ..ServerConfig::default()
        },
    );
    let mut mc = m.conn();
    let mut rc = r.conn();
    fixed_reply_buffers(&mut mc);
    fixed_reply_buffers(&mut rc);

    // Warm-up: a short round of the same load, and the most clients that can
    // wait at once, so that Redis' reusable structures (replication backlog,
    // hash tables, blocked-client pools) have reached their peak; then the
    // baseline, with no key left.
    let _ = load(&m, 3, 1);
    same_data(&mut mc, &mut rc);
    block_burst(&m, MAX_BLOCKED);
    let (base_m, base_r, base_info, base_still) = settle(&m, &r);

    let round = load(&m, secs, 2);

    // Master and replica hold the same data.
    let keys_at_end = same_data(&mut mc, &mut rc);

    // No client got a grant the exact bound forbids.
    let mut windows = 0;
    for b in 0..AUDITED.len() {
        windows += audit(b, &round.grants).unwrap_or_else(|e| panic!("{e}"));
    }
    let granted: u64 = round.grants.iter().map(|g| g.amount).sum();

    // Persistence ran and succeeded throughout.
    assert!(
        round.saves >= 1 && round.rewrites >= 1,
        "BGSAVE {}, BGREWRITEAOF {}",
        round.saves,
        round.rewrites
    );
    let (final_m, final_r, final_info, final_still) = settle(&m, &r);
    assert_eq!(
        info_field(&mut mc, "persistence", "rdb_last_bgsave_status"),
        "ok"
    );
    assert_eq!(
        info_field(&mut mc, "persistence", "aof_last_bgrewrite_status"),
        "ok"
    );

    // Every bucket expired; memory is back to the baseline on both servers.
    // The margin is what Redis keeps between bursts in its replication-stream
    // and client buffers (measured up to about 80 KB, on the replica); one
    // 8-byte allocation kept per bucket would be over 10 MB here.
    let margin = 128 * 1024;
    let created = round.bulk_keys + round.churned as i64;
    for (name, base, now) in [("master", base_m, final_m), ("replica", base_r, final_r)] {
        assert!(
            now - base <= margin,
            "{name} memory {base} -> {now} bytes after all {created} buckets expired\n\
             before:\n{base_info}\nafter:\n{final_info}"
        );
    }
    for s in [&m, &r] {
        let log = s.log();
        for bad in ["panic", "ASSERTION", "crashed by signal"] {
            assert!(!log.contains(bad), "log mentions {bad:?}:\n{log}");
        }
    }
    println!(
        "soak ({:?}): {secs} s of load, {} s in all; {} buckets at once, {} churn buckets, {} \
         audited requests, {} grants ({granted} tokens) within the exact bound over {windows} \
         windows, {} clients vanished mid-BLOCK, {} BGSAVE, {} BGREWRITEAOF; digests equal over \
         {keys_at_end} keys; memory {base_m} -> peak {} -> {final_m} bytes (replica {base_r} -> \
         {final_r}) after {created} buckets, memory still after {base_still:.1?} \
         and {final_still:.1?} of waiting",
        server_version(),
        started.elapsed().as_secs(),
        round.bulk_keys,
        round.churned,
        round.requests,
        round.grants.len(),
        round.vanished,
        round.saves,
        round.rewrites,
        round.peak_memory,
    );
}

#[test]
fn the_audit_catches_a_single_extra_token() {
    // audit:a: capacity 20, 50 tokens/s. A full bucket, then one token
    // exactly when it has refilled (20 ms later): allowed.
    let at = |amount, t| Grant {
        bucket: 0,
        amount,
        lo: t,
        hi: t,
    };
    assert!(audit(0, &[at(20, 0), at(1, 20_000)]).is_ok());
    // The same token 1 ms early is one token too many.
    let early = audit(0, &[at(20, 0), at(1, 19_000)]);
    assert!(early.is_err(), "the audit missed an extra token");
}
