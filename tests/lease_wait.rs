//! Server-side waiting for leases (`BLOCK ms` with `LEASE`, issue 18 item
//! 5): first come first served per bucket, one call per grant, the denial
//! at the deadline, nothing held by a client that left, the waiting-client
//! memory bounds, and replicas that agree, through real servers.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    answer, commandstats, config_set, dataset_digest, err, info_section, info_tb, ints, replica_of,
    sync_replica, Server, ServerConfig,
};

/// `TB.CONSUME key 0 cap 1 LEASE ttl BLOCK ms` (a fixed budget: only
/// give-backs and expiries free a slot).
fn slot_call<'a>(key: &'a str, cap: &'a str, ttl: &'a str, block: &'a str) -> Vec<&'a str> {
    vec![
        "TB.CONSUME",
        key,
        "0",
        cap,
        "1",
        "LEASE",
        ttl,
        "BLOCK",
        block,
    ]
}

/// Calls of `cmd` so far, from `INFO commandstats`.
fn calls(c: &mut redis::Connection, cmd: &str) -> i64 {
    let text = commandstats(c);
    let line = text
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
        .unwrap_or_else(|| panic!("no {cmd} in {text}"));
    let calls = line.split("calls=").nth(1).unwrap();
    calls.split(',').next().unwrap().parse().unwrap()
}

fn blocked(c: &mut redis::Connection) -> i64 {
    info_tb(c)["tb_blocked_now"]
}

/// 40 callers on an in-flight limit of 4: the first 4 are granted at once,
/// the other 36 wait; every release grants exactly the next caller in
/// arrival order, and each caller sent one command. Run against a master
/// with a replica and the AOF on (the propagation the Redis 7.0 crash of
/// finding F5 needed), whose datasets must agree at the end.
#[test]
fn forty_waiters_on_four_slots_are_served_in_arrival_order_one_call_each() {
    let m = Server::start_with(ServerConfig {
        args: vec!["--appendonly".into(), "yes".into()],
        ..ServerConfig::default()
    });
    let r = replica_of(&m, ServerConfig::default());
    let mut c = m.conn();
    let mut held = std::collections::VecDeque::new();
    for _ in 0..4 {
        let g = ints(&mut c, &slot_call("slots", "4", "60000", "10000"));
        assert_eq!(g[0], 1, "{g:?}");
        held.push_back(g[5]);
    }
    let (tx, rx) = mpsc::channel();
    let mut threads = Vec::new();
    for i in 4..40 {
        let (mut w, _) = m.send(&slot_call("slots", "4", "60000", "20000"));
        m.wait_for("the caller to wait", Duration::from_secs(10), |c| {
            blocked(c) == i - 3
        });
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            tx.send((i, answer(&mut w))).unwrap();
        }));
    }
    for want in 4..40 {
        let id = held.pop_front().unwrap();
        // A short hold, then give the slot back: exactly one caller (the
        // next in arrival order) gets it.
        thread::sleep(Duration::from_millis(5));
        let back = ints(&mut c, &["TB.RELEASE", "slots", &id.to_string()]);
        assert_eq!(back, vec![1]);
        let (i, reply) = rx.recv_timeout(Duration::from_secs(10)).expect("a grant");
        let reply = reply.unwrap();
        assert_eq!(i, want, "granted out of arrival order");
        assert_eq!((reply[0], reply[4]), (1, 1), "{reply:?}");
        assert!(reply[5] != 0, "a lease id: {reply:?}");
        held.push_back(reply[5]);
        assert!(rx.try_recv().is_err(), "one grant per slot given back");
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(blocked(&mut c), 0);
    assert_eq!(calls(&mut c, "tb.consume"), 40, "one call per grant");
    sync_replica(&mut c);
    assert_eq!(dataset_digest(&mut c), dataset_digest(&mut r.conn()));
    assert!(!m.log().contains("ASSERTION"), "{}", m.log());
}

/// Grants made by a timer (a lease expiring frees the slot, nobody
/// releases) and by TB.REFUND, on a master with a replica and the AOF; a
/// multi-key call is granted all at once.
#[test]
fn grants_from_expiry_refund_and_several_keys_replicate() {
    let m = Server::start_with(ServerConfig {
        args: vec!["--appendonly".into(), "yes".into()],
        ..ServerConfig::default()
    });
    let r = replica_of(&m, ServerConfig::default());
    let mut c = m.conn();
    // In flight 1, leases of 100 ms nobody releases: each waiter gets the
    // slot when the previous lease expires.
    // Timed from before the first grant: the third waiter's grant comes at
    // least three lease TTLs after it.
    let t = Instant::now();
    let first = ints(&mut c, &slot_call("exp", "1", "100", "5000"));
    assert_eq!(first[0], 1);
    let waiters: Vec<_> = (0..3)
        .map(|i| {
            let (w, _) = m.send(&slot_call("exp", "1", "100", "5000"));
            m.wait_for("the caller to wait", Duration::from_secs(10), |c| {
                blocked(c) == i + 1
            });
            w
        })
        .collect();
    for mut w in waiters {
        let reply = answer(&mut w).unwrap();
        assert_eq!(reply[0], 1, "{reply:?}");
    }
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // Two keys: 1 request token (no refill) and 1 slot; the slot is held.
    let two = [
        "TB.MCONSUME",
        "2",
        "{t}rpm",
        "{t}slot",
        "0",
        "5",
        "1",
        "0",
        "1",
        "1",
        "LEASE",
        "2",
        "60000",
        "BLOCK",
        "5000",
    ];
    let g = ints(&mut c, &two);
    assert_eq!(g[0], 1, "{g:?}");
    let (mut w, _) = m.send(&two);
    m.wait_for("the caller to wait", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    // Giving back a request token is not enough: the slot is still held.
    assert_eq!(ints(&mut c, &["TB.REFUND", "{t}rpm", "1"]), vec![5]);
    thread::sleep(Duration::from_millis(50));
    assert_eq!(blocked(&mut c), 1);
    let back = ints(&mut c, &["TB.RELEASE", "{t}slot", &g[5].to_string()]);
    assert_eq!(back, vec![1]);
    let reply = answer(&mut w).unwrap();
    assert_eq!((reply[0], reply[2], reply[3]), (1, 4, 0), "{reply:?}");
    assert!(reply[5] != 0 && reply[4] == 0, "{reply:?}");
    sync_replica(&mut c);
    assert_eq!(dataset_digest(&mut c), dataset_digest(&mut r.conn()));
    assert!(!m.log().contains("ASSERTION"), "{}", m.log());
}

#[test]
fn a_waiter_whose_wait_runs_out_gets_the_denial() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(ints(&mut c, &slot_call("one", "1", "60000", "0"))[0], 1);
    let t = Instant::now();
    let reply = ints(&mut c, &slot_call("one", "1", "60000", "300"));
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    // Denied: allowed 0, nothing granted, lease id 0, and the wait for the
    // held lease to expire.
    assert_eq!(
        (reply[0], reply[1], reply[4], reply[5]),
        (0, 0, 0, 0),
        "{reply:?}"
    );
    assert!(reply[2] > 59_000 && reply[2] <= 60_000, "{reply:?}");
    assert_eq!(blocked(&mut c), 0);
    // BLOCK 0 does not wait.
    let t = Instant::now();
    let reply = ints(&mut c, &slot_call("one", "1", "60000", "0"));
    assert_eq!(reply[0], 0);
    assert!(t.elapsed() < Duration::from_millis(200));
}

#[test]
fn a_waiter_that_hangs_up_frees_its_place_and_holds_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    let g = ints(&mut c, &slot_call("hang", "1", "60000", "0"));
    let (gone, _) = s.send(&slot_call("hang", "1", "60000", "10000"));
    s.wait_for("the first to wait", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    let (mut next, _) = s.send(&slot_call("hang", "1", "60000", "10000"));
    s.wait_for("the second to wait", Duration::from_secs(10), |c| {
        blocked(c) == 2
    });
    drop(gone);
    s.wait_for("the first to leave", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    // The slot given back goes to the one still waiting, not to the one
    // that left (which would hold it until its TTL).
    ints(&mut c, &["TB.RELEASE", "hang", &g[5].to_string()]);
    let reply = answer(&mut next).unwrap();
    assert_eq!(reply[0], 1, "{reply:?}");
    assert_eq!(blocked(&mut c), 0);
    let back = ints(&mut c, &["TB.RELEASE", "hang", &reply[5].to_string()]);
    assert_eq!(
        back,
        vec![1],
        "the bucket held one lease: the second caller's"
    );
}

#[test]
fn waiting_for_leases_keeps_the_blocked_client_bounds() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("TB.CONFIG")
        .arg("SET")
        .arg("max-blocked")
        .arg("1")
        .query(&mut c)
        .unwrap();
    ints(&mut c, &slot_call("b", "1", "60000", "0"));
    let (mut w, _) = s.send(&slot_call("b", "1", "60000", "10000"));
    s.wait_for("one to wait", Duration::from_secs(10), |c| blocked(c) == 1);
    // No room for another waiter: answered at once, denied.
    let t = Instant::now();
    let reply = ints(&mut c, &slot_call("b", "1", "60000", "10000"));
    assert!(t.elapsed() < Duration::from_millis(200));
    assert_eq!((reply[0], reply[5]), (0, 0), "{reply:?}");
    // Memory: with waiting clients' share of maxmemory used up, no wait.
    let _: () = redis::cmd("TB.CONFIG")
        .arg("SET")
        .arg("max-blocked")
        .arg("1000")
        .query(&mut c)
        .unwrap();
    // Used memory past 75% of maxmemory: no wait either.
    let used: i64 = info_section(&mut c, "memory")["used_memory"]
        .parse()
        .unwrap();
    config_set(&mut c, "maxmemory", &(used * 6 / 5).to_string());
    let t = Instant::now();
    let reply = ints(&mut c, &slot_call("b", "1", "60000", "10000"));
    assert!(t.elapsed() < Duration::from_millis(200));
    assert_eq!((reply[0], reply[5]), (0, 0), "{reply:?}");
    config_set(&mut c, "maxmemory", "0");
    // CLIENT UNBLOCK ... ERROR (as a failover does): -UNBLOCKED, and the
    // waiter is gone.
    let id: i64 = redis::cmd("CLIENT")
        .arg("LIST")
        .query::<String>(&mut c)
        .map(|l| {
            l.lines()
                .find(|l| l.contains("cmd=tb.consume") && l.contains("flags=b"))
                .and_then(|l| l.split_whitespace().next())
                .and_then(|f| f.strip_prefix("id="))
                .unwrap()
                .parse()
                .unwrap()
        })
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id)
        .arg("ERROR")
        .query(&mut c)
        .unwrap();
    let e = answer(&mut w).unwrap_err();
    assert_eq!(e.code(), Some("UNBLOCKED"), "{e:?}");
    assert_eq!(blocked(&mut c), 0);
}

#[test]
fn block_with_lease_grammar() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        err(
            &mut c,
            &[
                "TB.CONSUME",
                "g",
                "1",
                "1",
                "1",
                "RESERVE",
                "10",
                "LEASE",
                "10"
            ]
        ),
        "ERR LEASE cannot be combined with RESERVE or ATMOST"
    );
    let e = "ERR BLOCK cannot be combined with RESERVE or ATMOST";
    // Without a lease, TB.MCONSUME's BLOCK waits in the queue too.
    assert_eq!(
        ints(
            &mut c,
            &["TB.MCONSUME", "1", "g", "1", "1", "1", "BLOCK", "10"]
        ),
        [1, 0, 0]
    );
    assert_eq!(
        err(
            &mut c,
            &[
                "TB.MCONSUME",
                "1",
                "g",
                "1",
                "1",
                "1",
                "BLOCK",
                "10",
                "RESERVE",
                "10",
                "LEASE",
                "1",
                "10"
            ]
        ),
        e
    );
    let multi = redis::pipe()
        .atomic()
        .cmd("TB.CONSUME")
        .arg(&["g", "1", "1", "1", "LEASE", "10", "BLOCK", "10"])
        .query::<redis::Value>(&mut c);
    assert!(
        format!("{multi:?}").contains("BLOCK cannot wait inside MULTI"),
        "{multi:?}"
    );
}

/// A call on several buckets waits in the queue of the one that makes it
/// wait; when that one frees and another of its buckets makes it wait, it
/// moves to that bucket's queue, ahead of the calls that came after it.
/// (Queued on every bucket at once, calls whose flows order them
/// differently on two buckets would each wait for the other.)
#[test]
fn a_multi_key_call_waits_on_the_bucket_that_makes_it_wait() {
    let s = Server::start();
    let mut c = s.conn();
    // {f}a: one slot, held. {f}b: one slot, free.
    let held = ints(&mut c, &slot_call("{f}a", "1", "60000", "0"));
    let both = [
        "TB.MCONSUME",
        "2",
        "{f}a",
        "{f}b",
        "0",
        "1",
        "1",
        "0",
        "1",
        "1",
        "LEASE",
        "1",
        "60000",
        "LEASE",
        "2",
        "60000",
        "BLOCK",
        "10000",
    ];
    let (mut first, _) = s.send(&both);
    s.wait_for("the two-key call to wait", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    let waiting = |c: &mut redis::Connection, key: &str| -> i64 {
        let info: Vec<redis::Value> = redis::cmd("TB.INFO").arg(key).query(c).unwrap();
        let at = info
            .iter()
            .position(|v| *v == redis::Value::BulkString(b"waiting".to_vec()));
        at.map_or(0, |i| match &info[i + 1] {
            redis::Value::Int(n) => *n,
            v => panic!("{v:?}"),
        })
    };
    assert_eq!((waiting(&mut c, "{f}a"), waiting(&mut c, "{f}b")), (1, 0));
    // Nobody waits on {f}b: a call for it alone is granted at once.
    let b = ints(&mut c, &slot_call("{f}b", "1", "60000", "10000"));
    assert_eq!(b[0], 1, "{b:?}");
    // {f}a frees; {f}b now makes the two-key call wait: it moves there.
    ints(&mut c, &["TB.RELEASE", "{f}a", &held[5].to_string()]);
    s.wait_for("the call to move", Duration::from_secs(10), |c| {
        waiting(c, "{f}b") == 1
    });
    assert_eq!(waiting(&mut c, "{f}a"), 0);
    // A later call for {f}b queues behind it.
    let (mut later, _) = s.send(&slot_call("{f}b", "1", "60000", "10000"));
    s.wait_for("the later call to queue", Duration::from_secs(10), |c| {
        waiting(c, "{f}b") == 2
    });
    ints(&mut c, &["TB.RELEASE", "{f}b", &b[5].to_string()]);
    let r = answer(&mut first).unwrap();
    assert_eq!(r[0], 1, "the earlier call gets both slots: {r:?}");
    assert_eq!(waiting(&mut c, "{f}b"), 1, "the later one still waits");
    ints(&mut c, &["TB.RELEASE", "{f}b", &r[5].to_string()]);
    let r = answer(&mut later).unwrap();
    assert_eq!(r[0], 1, "{r:?}");
}

/// A master that turns replica answers its waiting calls -UNBLOCKED, as for
/// BLOCK, and keeps none.
#[test]
fn a_role_change_answers_unblocked() {
    let m = Server::start();
    let other = Server::start();
    let mut c = m.conn();
    ints(&mut c, &slot_call("r", "1", "60000", "0"));
    let (mut w, _) = m.send(&slot_call("r", "1", "60000", "10000"));
    m.wait_for("the call to wait", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut c)
        .unwrap();
    let e = answer(&mut w).unwrap_err();
    assert_eq!(e.code(), Some("UNBLOCKED"), "{e:?}");
    assert_eq!(blocked(&mut c), 0);
}

/// The first in line hangs up while the slot is held by a lease that
/// expires: the next in line gets the slot at that expiry, nobody releasing.
#[test]
fn the_next_in_line_is_served_at_the_expiry_the_first_waited_for() {
    let s = Server::start();
    let mut c = s.conn();
    let t = Instant::now();
    assert_eq!(ints(&mut c, &slot_call("e", "1", "400", "0"))[0], 1);
    let (first, _) = s.send(&slot_call("e", "1", "400", "10000"));
    s.wait_for("the first to wait", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    let (mut next, _) = s.send(&slot_call("e", "1", "400", "10000"));
    s.wait_for("the next to wait", Duration::from_secs(10), |c| {
        blocked(c) == 2
    });
    drop(first);
    s.wait_for("the first to leave", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    let r = answer(&mut next).unwrap();
    assert_eq!(r[0], 1, "{r:?}");
    let waited = t.elapsed();
    assert!(waited >= Duration::from_millis(400), "{waited:?}");
    assert!(
        waited < Duration::from_secs(5),
        "granted at the expiry, not at its deadline: {waited:?}"
    );
}

/// `CLIENT UNBLOCK` (without ERROR) ends the wait with the denial.
#[test]
fn client_unblock_answers_the_denial() {
    let s = Server::start();
    let mut c = s.conn();
    ints(&mut c, &slot_call("u", "1", "60000", "0"));
    let (mut w, id) = s.send(&slot_call("u", "1", "60000", "10000"));
    s.wait_for("the call to wait", Duration::from_secs(10), |c| {
        blocked(c) == 1
    });
    let unblocked: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id)
        .query(&mut c)
        .unwrap();
    assert_eq!(unblocked, 1);
    let r = answer(&mut w).unwrap();
    assert_eq!((r[0], r[4], r[5]), (0, 0, 0), "{r:?}");
    assert!(r[2] > 59_000, "{r:?}");
    assert_eq!(blocked(&mut c), 0);
}
