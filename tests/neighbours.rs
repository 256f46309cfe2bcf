//! Noisy neighbours: what one tenant can do to the server with the limiter
//! commands on its own keys. Each test pins one way a tenant could hurt the
//! others (the figures under load are `make bench`'s, BENCHMARKS.md).

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    answer, blocked_now, commandstats, config_set, consume, err, error_line, info_tb, ints, resp,
    tb_config_set, used_memory, Server,
};
use redis::Connection;

/// Server time spent in TB.MCONSUME so far, in µs (`INFO commandstats`).
fn mconsume_usec(c: &mut redis::Connection) -> u64 {
    let stats = commandstats(c);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_tb.mconsume:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .map_or(0, |v| v.parse().unwrap())
}

/// `TB.MCONSUME` over `keys` (rate 1, capacity 1, n 1 each).
fn mconsume_args(keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut args = vec![b"TB.MCONSUME".to_vec(), keys.len().to_string().into_bytes()];
    args.extend(keys.iter().cloned());
    for _ in keys {
        args.extend([b"1".to_vec(), b"1".to_vec(), b"1".to_vec()]);
    }
    args
}

#[test]
fn mconsume_checks_for_duplicate_keys_in_linear_time() {
    // The most keys TB.MCONSUME takes (16), of 1 MB each, the last two
    // equal, so that a check comparing pairs runs through all of them.
    // Comparing every pair of keys that share a 1 MB prefix reads 120 MB;
    // keys that differ in their first byte are told apart at once. In
    // linear time both cost the same: hashing 16 MB.
    const KEYS: usize = 16;
    const LEN: usize = 1 << 20;
    let s = Server::start();
    let mut c = s.conn();
    let key = |i: usize, shared_prefix: bool| -> Vec<u8> {
        let tag = format!("{i:05}").into_bytes();
        let mut k = vec![b'p'; LEN - tag.len()];
        if shared_prefix {
            k.extend(tag);
        } else {
            let mut t = tag;
            t.extend(k);
            k = t;
        }
        k
    };
    let mut time = |shared_prefix: bool| -> u64 {
        let mut keys: Vec<Vec<u8>> = (0..KEYS - 1).map(|i| key(i, shared_prefix)).collect();
        keys.push(keys[KEYS - 2].clone());
        let before = mconsume_usec(&mut c);
        let e = err(&mut c, &mconsume_args(&keys));
        assert_eq!(e, "ERR a key appears twice in TB.MCONSUME");
        mconsume_usec(&mut c) - before
    };
    let (mut shared, mut distinct) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        shared.push(time(true));
        distinct.push(time(false));
    }
    let (shared, distinct) = (shared.iter().min().unwrap(), distinct.iter().min().unwrap());
    println!(
        "duplicate check of {KEYS} keys of {LEN} bytes: shared prefix {shared} µs, distinct {distinct} µs"
    );
    assert!(
        *shared <= 3 * distinct + 2_000,
        "keys sharing a prefix take {shared} µs, distinct ones {distinct} µs: not linear"
    );
}

/// A connection waiting in `TB.CONSUME key rate 1 1 BLOCK 60000` (sent, not
/// yet answered), and its client id.
fn waiter(s: &Server, key: &str, rate: &str) -> (Connection, i64) {
    s.send(&["TB.CONSUME", key, rate, "1", "1", "BLOCK", "60000"])
}

#[test]
fn an_abandoned_waiter_holds_nothing_once_gone() {
    // The attack of the issue: connect, BLOCK, hang up, many times over.
    // Each waiter's blocked-client handle carries two reply buffers (about
    // 35 KB on Redis 7.0); they must go when the client goes, not when the
    // reservation falls due.
    const WAITERS: usize = 2000;
    const THREADS: usize = 4;
    let s = Server::start();
    let mut c = s.conn();
    // 40 tokens/s, capacity 1: the first call is served, every later one
    // reserves and waits, the last one about 50 s.
    let block = resp(&["TB.CONSUME", "rl:x", "40", "1", "1", "BLOCK", "60000"]);
    assert_eq!(ints(&mut c, &["TB.CONSUME", "rl:x", "40", "1"])[0], 1);
    let before = used_memory(&mut c);
    thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                for _ in 0..WAITERS / THREADS {
                    let mut sock = TcpStream::connect(s.addr()).unwrap();
                    sock.write_all(&block).unwrap();
                }
            });
        }
    });
    s.wait_for(
        "the server to serve every call and release every waiter",
        Duration::from_secs(60),
        |c| {
            let i = info_tb(c);
            i["tb_calls"] == 1 + WAITERS as i64 && i["tb_blocked_now"] == 0
        },
    );
    let blocked = info_tb(&mut c)["tb_blocked_total"];
    // (The first call or two may find a token refilled meanwhile.)
    assert!(blocked >= WAITERS as i64 - 2, "{blocked} blocked");
    // Redis keeps the reply buffers of released handles in a pool for
    // reuse, sized by the most handles alive at once (a few hundred when
    // connections arrive faster than their hang-ups), and frees the unused
    // ones 500 a second. So memory returns within seconds; had the handles
    // stayed until their reservations fell due, most would still be held
    // 20 s later.
    let peak = used_memory(&mut c) - before;
    let started = Instant::now();
    s.wait_for(
        "the memory of the abandoned waiters to be freed",
        Duration::from_secs(20),
        |c| used_memory(c) - before < (WAITERS as i64) << 10,
    );
    let grown = used_memory(&mut c) - before;
    println!(
        "{blocked} abandoned BLOCKs: used_memory {peak} bytes above the start when the last \
         left, {grown} after {:?}",
        started.elapsed()
    );
}

#[test]
fn every_way_a_waiter_ends_releases_it_and_max_blocked_holds() {
    let s = Server::start();
    let mut c = s.conn();
    tb_config_set(&mut c, "max-blocked", "2");
    // One token every 10 s, taken: each reservation waits 10 s more.
    assert_eq!(consume(&mut c, "w", "0.1", 1, 1)[0], 1);
    let (mut a, a_id) = waiter(&s, "w", "0.1");
    s.wait_for("a to block", Duration::from_secs(10), |c| {
        blocked_now(c) == 1
    });
    let (mut b, b_id) = waiter(&s, "w", "0.1");
    s.wait_for("b to block", Duration::from_secs(10), |c| {
        blocked_now(c) == 2
    });
    // At the limit, BLOCK answers at once as RESERVE would.
    let r = ints(
        &mut c,
        &["TB.CONSUME", "w", "0.1", "1", "1", "BLOCK", "60000"],
    );
    assert_eq!((r[0], r[4]), (1, 1), "reserved: {r:?}");
    assert!(r[2] > 20_000, "the caller waits itself: {r:?}");
    assert_eq!(blocked_now(&mut c), 2);

    // CLIENT KILL: the waiter is released at once.
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(a_id)
        .query(&mut c)
        .unwrap();
    assert_eq!(killed, 1);
    assert!(
        answer(&mut a).is_err(),
        "the killed waiter's connection closed"
    );
    assert_eq!(blocked_now(&mut c), 1);
    // ...which makes room for another.
    let (mut d, d_id) = waiter(&s, "w", "0.1");
    s.wait_for("d to block", Duration::from_secs(10), |c| {
        blocked_now(c) == 2
    });

    // CLIENT UNBLOCK: the waiter gets what RESERVE would have answered,
    // with the wait still to go, and is released.
    let n: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(b_id)
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1, "CLIENT UNBLOCK reaches the waiter");
    let r = answer(&mut b).unwrap();
    assert_eq!((r[0], r[4]), (1, 1), "granted, to be waited for: {r:?}");
    assert!(r[2] > 0 && r[2] <= 20_000, "the wait still to go: {r:?}");
    assert!(r[3] >= r[2], "full again after the wait: {r:?}");
    assert_eq!(blocked_now(&mut c), 1);

    // CLIENT UNBLOCK ... ERROR: the waiter gets the error, and is released.
    let n: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(d_id)
        .arg("ERROR")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1);
    let e = answer(&mut d).unwrap_err();
    assert!(error_line(&e).starts_with("UNBLOCKED"), "{e}");
    assert_eq!(blocked_now(&mut c), 0);

    // FLUSHALL takes the bucket, not the waiter: it is answered when due.
    assert_eq!(consume(&mut c, "f", "10", 1, 1)[0], 1);
    let (mut e, _) = waiter(&s, "f", "10");
    s.wait_for("e to block", Duration::from_secs(10), |c| {
        blocked_now(c) == 1
    });
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    assert_eq!(answer(&mut e).unwrap()[0], 1);
    assert_eq!(blocked_now(&mut c), 0);
    assert_eq!(info_tb(&mut c)["tb_blocked_total"], 4);
}

#[test]
fn block_answers_as_reserve_when_memory_is_short() {
    // Each waiter holds tens of KB; past 75% of maxmemory BLOCK answers at
    // once, as RESERVE would, so waiting clients cannot push other tenants'
    // writes past maxmemory.
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(consume(&mut c, "w", "0.1", 1, 1)[0], 1);
    let used = used_memory(&mut c);
    config_set(&mut c, "maxmemory", &(used * 6 / 5).to_string());
    let r = ints(
        &mut c,
        &["TB.CONSUME", "w", "0.1", "1", "1", "BLOCK", "60000"],
    );
    assert_eq!((r[0], r[4]), (1, 1), "reserved: {r:?}");
    assert!(
        r[2] > 5_000,
        "answered at once, the wait left to the caller: {r:?}"
    );
    assert_eq!(info_tb(&mut c)["tb_blocked_total"], 0);
    // With memory to spare the next one waits.
    config_set(&mut c, "maxmemory", "0");
    let (_w, _) = waiter(&s, "w", "0.1");
    s.wait_for("the waiter to block", Duration::from_secs(10), |c| {
        blocked_now(c) == 1
    });
}

#[test]
fn waiting_clients_hold_at_most_a_tenth_of_maxmemory() {
    // At 64 KB a waiter (more than one holds on the servers tested), a
    // tenth of this maxmemory is room for exactly 10: the 11th client
    // answers as RESERVE would, whatever max-blocked says.
    let s = Server::start();
    let mut c = s.conn();
    config_set(&mut c, "maxmemory", &(10 * (64 << 10) * 10).to_string());
    assert!(
        used_memory(&mut c) < 4 << 20,
        "far from maxmemory at the start"
    );
    assert_eq!(consume(&mut c, "w", "0.2", 1, 1)[0], 1);
    let waiters: Vec<_> = (0..10)
        .map(|i| {
            let w = waiter(&s, "w", "0.2");
            s.wait_for("the waiter to block", Duration::from_secs(10), |c| {
                blocked_now(c) == i + 1
            });
            w
        })
        .collect();
    let r = ints(
        &mut c,
        &["TB.CONSUME", "w", "0.2", "1", "1", "BLOCK", "60000"],
    );
    assert_eq!((r[0], r[4]), (1, 1), "reserved: {r:?}");
    // One token every 5 s: the 11th reservation is due in about 55 s.
    assert!(
        r[2] > 50_000,
        "answered at once, the wait left to the caller: {r:?}"
    );
    assert_eq!(blocked_now(&mut c), 10);
    drop(waiters);
}

#[test]
fn a_server_with_waiters_shuts_down_cleanly() {
    let mut s = Server::start();
    let mut c = s.conn();
    assert_eq!(consume(&mut c, "w", "0.1", 1, 1)[0], 1);
    let waiters: Vec<_> = (0..3).map(|_| waiter(&s, "w", "0.1")).collect();
    s.wait_for("3 waiters", Duration::from_secs(10), |c| {
        blocked_now(c) == 3
    });
    drop(c);
    s.stop();
    for (mut w, _) in waiters {
        assert!(answer(&mut w).is_err(), "the connection closed");
    }
    let log = s.log();
    assert!(log.contains("ready to exit"), "{log}");
    for bad in ["ASSERTION", "crashed by signal", "panic"] {
        assert!(!log.contains(bad), "{bad}: {log}");
    }
}
