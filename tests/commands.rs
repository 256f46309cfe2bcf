//! The command contract, pinned through a real redis-server with the module:
//! every reply field of TB.CONSUME, TB.INFO, TB.CONFIG, INFO tb, and every
//! error case.

mod common;

use common::{
    consume, digest, err, info, info_tb, repl_offset, server_time_us, until_server_time, Server,
    ServerConfig, DEFAULT_N,
};
use redis::{Connection, Value};

#[test]
fn consume_reply_fields() {
    let s = Server::start();
    let mut c = s.conn();
    // A missing key is a full bucket: capacity 5 at 10 tokens/s.
    assert_eq!(
        consume(&mut c, "k", "10", "5", DEFAULT_N),
        vec![1, 4, 0, 100, 1]
    );
    let r = consume(&mut c, "k", "10", "5", Some("4"));
    assert_eq!((r[0], r[1], r[2], r[4]), (1, 0, 0, 4));
    // Up to 500 ms to be full again; some time may have passed.
    assert!(r[3] > 400 && r[3] <= 500, "reset_after_ms {r:?}");
    // Denied: takes nothing; retry_after_ms is at most one token's 100 ms.
    let r = consume(&mut c, "k", "10", "5", Some("1"));
    assert_eq!((r[0], r[1], r[4]), (0, 0, 0));
    assert!(r[2] > 0 && r[2] <= 100, "retry_after_ms {r:?}");
    // n above capacity can never succeed.
    let r = consume(&mut c, "k", "10", "5", Some("6"));
    assert_eq!((r[0], r[2], r[4]), (0, -1, 0));
}

#[test]
fn retry_after_is_honest_and_sufficient() {
    let s = Server::start();
    let mut c = s.conn();
    // 2 tokens/s, capacity 1: after taking it, one token takes 500 ms.
    assert_eq!(consume(&mut c, "r", "2", "1", DEFAULT_N)[0], 1);
    let denied = consume(&mut c, "r", "2", "1", DEFAULT_N);
    assert_eq!(denied[0], 0);
    assert!(denied[2] > 0 && denied[2] <= 500);
    // The denial was computed at or before this server instant: wait on the
    // server's clock until retry_after_ms past it.
    let answered = server_time_us(&mut c);
    until_server_time(&mut c, answered + denied[2] * 1000);
    assert_eq!(
        consume(&mut c, "r", "2", "1", DEFAULT_N)[0],
        1,
        "retry at retry_after_ms succeeds"
    );
}

#[test]
fn fixed_budget_and_zero_capacity() {
    let s = Server::start();
    let mut c = s.conn();
    // rate 0: a fixed budget of 3 that never refills and never expires.
    assert_eq!(
        consume(&mut c, "quota", "0", "3", Some("2")),
        vec![1, 1, 0, -1, 2]
    );
    assert_eq!(
        consume(&mut c, "quota", "0", "3", Some("2")),
        vec![0, 1, -1, -1, 0]
    );
    assert_eq!(
        consume(&mut c, "quota", "0", "3", Some("1")),
        vec![1, 0, 0, -1, 1]
    );
    let ttl: i64 = redis::cmd("PTTL").arg("quota").query(&mut c).unwrap();
    assert_eq!(ttl, -1, "a fixed budget never expires");
    let i = info(&mut c, "quota").unwrap();
    assert_eq!(i["tokens"], "0");
    assert_eq!(i["rate"], "0");
    assert_eq!(i["reset_after_ms"], "-1");
    // capacity 0 denies everything, forever, and stores nothing; a peek
    // says so too.
    assert_eq!(
        consume(&mut c, "off", "10", "0", DEFAULT_N),
        vec![0, 0, -1, 0, 0]
    );
    assert_eq!(
        consume(&mut c, "off", "10", "0", Some("0")),
        vec![0, 0, -1, 0, 0]
    );
    assert!(info(&mut c, "off").is_none());
}

#[test]
fn peek_writes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(
        consume(&mut c, "p", "1", "10", Some("0")),
        vec![1, 10, 0, 0, 0]
    );
    assert!(
        info(&mut c, "p").is_none(),
        "a peek on a missing key creates nothing"
    );
    consume(&mut c, "p", "0", "10", Some("4"));
    let before = digest(&mut c, "p");
    let offset_before = repl_offset(&mut c);
    assert_eq!(
        consume(&mut c, "p", "0", "10", Some("0")),
        vec![1, 6, 0, -1, 0]
    );
    // A peek with other limits reports them but stores nothing.
    assert_eq!(
        consume(&mut c, "p", "0", "3", Some("0")),
        vec![1, 3, 0, 0, 0]
    );
    assert_eq!(digest(&mut c, "p"), before);
    assert_eq!(
        repl_offset(&mut c),
        offset_before,
        "peeks propagate nothing"
    );
    // A peek answers for one token: on an empty bucket it is denied, with
    // the wait for one token (1000 s at 0.001/s), like a request for one.
    let time_ms = |c: &mut Connection| {
        let t: Vec<i64> = redis::cmd("TIME").query(c).unwrap();
        t[0] * 1000 + t[1] / 1000
    };
    let before = time_ms(&mut c);
    consume(&mut c, "e", "0.001", "3", Some("3"));
    let one = consume(&mut c, "e", "0.001", "3", Some("1"));
    let peek = consume(&mut c, "e", "0.001", "3", Some("0"));
    let between = time_ms(&mut c) - before + 1;
    assert_eq!(one[..2], [0, 0]);
    assert!(
        one[2] <= 1_000_000 && one[2] >= 1_000_000 - between,
        "{one:?}"
    );
    assert_eq!(
        [peek[0], peek[1], peek[4]],
        [0, 0, 0],
        "a peek on an empty bucket is no allowed request"
    );
    // Read after `one`: its wait is at most one's.
    assert!(
        peek[2] <= one[2] && peek[2] >= one[2] - between,
        "{peek:?} {one:?}"
    );
}

#[test]
fn denials_write_and_propagate_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "d", "0", "2", Some("2"));
    let before = digest(&mut c, "d");
    let offset = repl_offset(&mut c);
    for _ in 0..10 {
        assert_eq!(consume(&mut c, "d", "0", "2", DEFAULT_N)[0], 0);
    }
    assert_eq!(digest(&mut c, "d"), before);
    assert_eq!(repl_offset(&mut c), offset);
}

#[test]
fn limit_changes_settle_first_and_never_mint() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "L", "0", "10", Some("4"));
    // Capacity lowered below the balance: clamped to 3, then 1 taken.
    assert_eq!(consume(&mut c, "L", "0", "3", DEFAULT_N)[..2], [1, 2]);
    // Capacity raised again: no tokens appear from nowhere.
    assert_eq!(consume(&mut c, "L", "0", "10", Some("0"))[1], 2);
    assert_eq!(consume(&mut c, "L", "0", "10", DEFAULT_N)[..2], [1, 1]);
    // A denied request with new limits records them (rate 0 -> 1/d).
    assert_eq!(consume(&mut c, "L", "1/d", "10", Some("5"))[0], 0);
    let i = info(&mut c, "L").unwrap();
    assert_eq!(i["rate"], "0.000011574074");
    assert_eq!(i["capacity"], "10");
}

#[test]
fn rate_forms_are_exact() {
    let s = Server::start();
    let mut c = s.conn();
    for (rate, shown) in [
        ("10", "10"),
        ("0.5", "0.5"),
        ("1e-3", "0.001"),
        ("2.5e9", "2500000000"),
        ("100/m", "1.666666666667"),
        ("120/m", "2"),
        ("36/h", "0.01"),
        ("1e12", "1000000000000"),
    ] {
        consume(
            &mut c,
            rate,
            rate,
            "9007199254740992",
            Some("9007199254740992"),
        );
        assert_eq!(info(&mut c, rate).unwrap()["rate"], shown, "rate {rate}");
    }
}

#[test]
fn info_fields() {
    let s = Server::start();
    let mut c = s.conn();
    assert!(info(&mut c, "missing").is_none());
    let t0: i64 = {
        let t: Vec<String> = redis::cmd("TIME").query(&mut c).unwrap();
        t[0].parse::<i64>().unwrap() * 1000 + t[1].parse::<i64>().unwrap() / 1000
    };
    consume(&mut c, "i", "1e-3", "7", Some("3"));
    let i = info(&mut c, "i").unwrap();
    let keys: Vec<&str> = {
        let v: Vec<String> = redis::cmd("TB.INFO").arg("i").query(&mut c).unwrap();
        v.into_iter()
            .step_by(2)
            .map(|s| Box::leak(s.into_boxed_str()) as &str)
            .collect()
    };
    assert_eq!(
        keys,
        [
            "tokens",
            "capacity",
            "rate",
            "updated_at_ms",
            "reset_after_ms",
            "ttl_ms"
        ]
    );
    // 1e-3 tokens/s refills 1e-6 token per ms: tokens is exact, e.g. "4.000012".
    let tokens: f64 = i["tokens"].parse().unwrap();
    assert!((4.0..4.001).contains(&tokens), "{i:?}");
    assert!(i["tokens"].len() <= "4.000000001".len());
    assert_eq!(i["capacity"], "7");
    assert_eq!(i["rate"], "0.001");
    let updated: i64 = i["updated_at_ms"].parse().unwrap();
    assert!(
        updated >= t0 - 5 && updated <= t0 + 5000,
        "{updated} vs {t0}"
    );
    let reset: i64 = i["reset_after_ms"].parse().unwrap();
    let ttl: i64 = i["ttl_ms"].parse().unwrap();
    assert!(
        reset <= 3_000_000 && reset > 2_990_000,
        "3 tokens at 0.001/s: {reset}"
    );
    assert!(
        (ttl - reset).abs() <= 5,
        "the key expires when full: ttl {ttl} reset {reset}"
    );
}

#[test]
fn info_is_readonly_and_runs_on_replicas() {
    let s = Server::start();
    let mut c = s.conn();
    let flags: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("TB.INFO")
        .query(&mut c)
        .unwrap();
    let text = format!("{flags:?}");
    assert!(text.contains("readonly"), "{text}");
    let r = common::replica_of(&s, ServerConfig::default());
    consume(&mut c, "x", "1", "5", Some("2"));
    let mut rc = r.conn();
    r.wait_for("replica sees x", std::time::Duration::from_secs(10), |rc| {
        redis::cmd("EXISTS").arg("x").query::<i64>(rc).unwrap() == 1
    });
    assert_eq!(info(&mut rc, "x").unwrap()["capacity"], "5");
    let e = err(&mut rc, &["TB.CONSUME", "x", "1", "5"]);
    assert!(e.contains("read only replica"), "{e}");
}

#[test]
fn expiry_when_full() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "e", "20", "1", DEFAULT_N);
    let ttl: i64 = redis::cmd("PTTL").arg("e").query(&mut c).unwrap();
    assert!(
        ttl > 0 && ttl <= 51,
        "expires when full again (50 ms): {ttl}"
    );
    s.wait_for("key expires", std::time::Duration::from_secs(5), |c| {
        redis::cmd("EXISTS").arg("e").query::<i64>(c).unwrap() == 0
    });
    assert_eq!(
        consume(&mut c, "e", "20", "1", Some("0"))[1],
        1,
        "and reads as full"
    );
    // expire-idle no: buckets keep no TTL.
    let _: () = redis::cmd("TB.CONFIG")
        .arg("SET")
        .arg("expire-idle")
        .arg("no")
        .query(&mut c)
        .unwrap();
    consume(&mut c, "e2", "20", "1", DEFAULT_N);
    let ttl: i64 = redis::cmd("PTTL").arg("e2").query(&mut c).unwrap();
    assert_eq!(ttl, -1);
}

#[test]
fn expire_idle_from_module_arguments_and_native_config() {
    let s = Server::start_with(ServerConfig {
        module_args: vec!["expire-idle".into(), "no".into()],
        ..ServerConfig::default()
    });
    let mut c = s.conn();
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("tb.expire-idle")
        .query(&mut c)
        .unwrap();
    assert_eq!(v, ["tb.expire-idle", "no"]);
    let v: Vec<String> = redis::cmd("TB.CONFIG")
        .arg("GET")
        .arg("*")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        v,
        [
            "expire-idle",
            "no",
            "max-wait-ms",
            "60000",
            "max-blocked",
            "10000",
            "top-keys",
            "yes"
        ]
    );
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("tb.expire-idle")
        .arg("yes")
        .query(&mut c)
        .unwrap();
    let v: Vec<String> = redis::cmd("TB.CONFIG")
        .arg("GET")
        .arg("expire-*")
        .query(&mut c)
        .unwrap();
    assert_eq!(v, ["expire-idle", "yes"]);
    let v: Vec<String> = redis::cmd("TB.CONFIG")
        .arg("GET")
        .arg("nothing*")
        .query(&mut c)
        .unwrap();
    assert!(v.is_empty());
    let e = err(&mut c, &["TB.CONFIG", "SET", "expire-idle", "maybe"]);
    assert!(e.contains("yes or no"), "{e}");
    let e = err(&mut c, &["TB.CONFIG", "SET", "nope", "1"]);
    assert!(e.contains("unknown setting"), "{e}");
    let e = err(&mut c, &["TB.CONFIG", "FROB"]);
    assert!(e.contains("unknown subcommand"), "{e}");
    let s2 = Server::start_with(ServerConfig {
        args: vec!["--tb.expire-idle".into(), "no".into()],
        ..ServerConfig::default()
    });
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("tb.expire-idle")
        .query(&mut s2.conn())
        .unwrap();
    assert_eq!(
        v,
        ["tb.expire-idle", "no"],
        "a redis.conf line / command-line config"
    );
}

#[test]
fn info_counters_and_resetstat() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "s", "0", "5", Some("3")); // allowed, 3 tokens
    consume(&mut c, "s", "0", "5", Some("3")); // denied, never (rate 0)
    consume(&mut c, "s", "0", "5", Some("9")); // never (n > capacity)
    consume(&mut c, "s", "0", "5", Some("0")); // peek
    consume(&mut c, "t", "1", "5", Some("5"));
    consume(&mut c, "t", "1", "5", Some("5")); // denied, can retry
    let i = info_tb(&mut c);
    assert_eq!(i["tb_calls"], 6);
    assert_eq!(i["tb_allowed"], 2);
    assert_eq!(i["tb_denied"], 3);
    assert_eq!(i["tb_peeks"], 1);
    assert_eq!(i["tb_never_satisfiable"], 2);
    assert_eq!(i["tb_tokens_granted"], 8);
    // A shared ATMOST grant: 7 from each byte bucket and the counter's 1.
    let mc: Vec<i64> = redis::cmd("TB.MCONSUME")
        .arg(3)
        .arg("{m}a")
        .arg("{m}b")
        .arg("{m}c")
        .arg(
            &[
                "0", "7", "20", "0", "9", "20", "0", "3", "1", "ATMOST", "MIN", "5",
            ][..],
        )
        .query(&mut c)
        .unwrap();
    assert_eq!(mc, [1, 0, 0, 2, 2, 7]);
    let i = info_tb(&mut c);
    assert_eq!(i["tb_partial_grants"], 1);
    assert_eq!(i["tb_tokens_granted"], 8 + 15);
    assert_eq!(i["tb_calls"], 7);
    let _: () = redis::cmd("TB.CONFIG")
        .arg("RESETSTAT")
        .query(&mut c)
        .unwrap();
    // Every counter is back to 0; the settings stay.
    let mut after = info_tb(&mut c);
    for setting in [
        "tb_expire_idle",
        "tb_max_wait_ms",
        "tb_max_blocked",
        "tb_top_keys",
    ] {
        assert!(after.remove(setting).is_some(), "{setting}");
    }
    assert!(after.values().all(|&v| v == 0), "{after:?}");
}

#[test]
fn bad_input_is_rejected_and_changes_nothing() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "b", "1", "5", Some("2"));
    let before = digest(&mut c, "b");
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (vec![b"TB.CONSUME", b"b", b"1"], "wrong number of arguments"),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"5", b"1", b"2"],
            "unknown or repeated option",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"5", b"RESERVE", b"86400001"],
            "RESERVE and BLOCK take",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"5", b"RESERVE", b"60001"],
            "ERR wait exceeds tb.max-wait-ms (60000)",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"5", b"ATMOST", b"BLOCK", b"5"],
            "ATMOST cannot be combined",
        ),
        (
            vec![
                b"TB.CONSUME",
                b"b",
                b"1",
                b"5",
                b"9",
                b"ATMOST",
                b"MIN",
                b"6",
            ],
            "ERR MIN takes a chunk, an integer from 1 to capacity",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"5", b"9", b"MIN", b"2"],
            "ERR MIN needs ATMOST",
        ),
        (
            vec![
                b"TB.MCONSUME",
                b"2",
                b"{b}1",
                b"{b}2",
                b"1",
                b"5",
                b"9",
                b"1",
                b"3",
                b"9",
                b"ATMOST",
                b"MIN",
                b"4",
            ],
            "ERR MIN takes a chunk",
        ),
        (
            vec![
                b"TB.MCONSUME",
                b"1",
                b"b",
                b"1",
                b"5",
                b"9",
                b"ATMOST",
                b"RESERVE",
                b"5",
            ],
            "TB.MCONSUME takes RESERVE ms, or ATMOST [MIN chunk]",
        ),
        (vec![b"TB.CONSUME"], "wrong number of arguments"),
        (vec![b"TB.CONSUME", b"b", b"-1", b"5"], "rate must be"),
        (vec![b"TB.CONSUME", b"b", b"nan", b"5"], "rate must be"),
        (vec![b"TB.CONSUME", b"b", b"inf", b"5"], "rate must be"),
        (
            vec![b"TB.CONSUME", b"b", b"1e400", b"5"],
            "rate out of range",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1e30", b"5"],
            "rate out of range",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1e-20", b"5"],
            "rate out of range",
        ),
        (vec![b"TB.CONSUME", b"b", b"10/x", b"5"], "rate must be"),
        (vec![b"TB.CONSUME", b"b", b"\xff\xfe", b"5"], "rate must be"),
        (vec![b"TB.CONSUME", b"b", b"1", b"-5"], "capacity must be"),
        (vec![b"TB.CONSUME", b"b", b"1", b"5.5"], "capacity must be"),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"9007199254740993"],
            "capacity must be",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"99999999999999999999999"],
            "capacity must be",
        ),
        (
            vec![b"TB.CONSUME", b"b", b"1", b"\xc3\x28"],
            "capacity must be",
        ),
        (vec![b"TB.CONSUME", b"b", b"1", b"5", b"-1"], "n must be"),
        (vec![b"TB.CONSUME", b"b", b"1", b"5", b"1.5"], "n must be"),
        (vec![b"TB.CONSUME", b"b", b"1", b"5", b"\x80"], "n must be"),
        (vec![b"TB.CONSUME", b"str", b"1", b"5"], "WRONGTYPE"),
        (vec![b"TB.INFO", b"str"], "WRONGTYPE"),
        (vec![b"TB.INFO"], "wrong number of arguments"),
        (vec![b"TB.SETSTATE", b"b", b"1"], "invalid bucket state"),
        (
            vec![b"TB.SETSTATE", b"b", b"1", b"2"],
            "wrong number of arguments",
        ),
        (
            vec![
                b"TB.SETSTATE",
                b"b",
                b"99000000000",
                b"1",
                b"1",
                b"1",
                b"5",
                b"0",
            ],
            "invalid bucket state",
        ),
        (
            vec![b"TB.SETSTATE", b"b", b"1", b"1", b"1", b"0", b"5", b"0"],
            "invalid bucket state",
        ),
        (
            vec![b"TB.SETSTATE", b"str", b"1", b"1", b"1", b"1", b"5", b"0"],
            "WRONGTYPE",
        ),
        (vec![b"TB.CONFIG"], "wrong number of arguments"),
        (vec![b"TB.SETSTATE", b"str", b"DEL"], "WRONGTYPE"),
    ];
    for (args, want) in &cases {
        let e = err(&mut c, &args[..]);
        assert!(e.contains(want), "{args:?}: got {e:?}, want {want:?}");
    }
    assert_eq!(digest(&mut c, "b"), before, "no error changed the bucket");
    let t: String = redis::cmd("TYPE").arg("str").query(&mut c).unwrap();
    assert_eq!(t, "string");
}

#[test]
fn setstate_del_deletes_a_bucket_and_nothing_else() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "b", "1/d", "5", Some("2"));
    let ok: String = redis::cmd("TB.SETSTATE")
        .arg(&["b", "DEL"])
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK");
    assert!(info(&mut c, "b").is_none(), "the bucket is gone");
    let ok: String = redis::cmd("TB.SETSTATE")
        .arg(&["b", "del"])
        .query(&mut c)
        .unwrap();
    assert_eq!(ok, "OK", "a missing key stays missing");
    let _: () = redis::cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    let e = err(&mut c, &["TB.SETSTATE", "str", "DEL"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    let v: String = redis::cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(v, "x", "other data is never deleted");
}

#[test]
fn malformed_burst_leaves_the_server_up() {
    let s = Server::start();
    let mut c = s.conn();
    let junk: &[&[u8]] = &[
        b"",
        b"-",
        b"1e",
        b"\x00",
        b"\xff",
        b"18446744073709551616",
        b"-9223372036854775808",
        b"NaN",
        b"+inf",
        b"1/",
        b"/",
        b"0x1",
        b"1e-400",
        b"9".repeat(400).leak(),
    ];
    let mut sent = 0;
    for cmd in ["TB.CONSUME", "TB.INFO", "TB.CONFIG", "TB.SETSTATE"] {
        for a in junk {
            for b in junk {
                for argc in 0..8 {
                    let mut q = redis::cmd(cmd);
                    for i in 0..argc {
                        q.arg(if i % 2 == 0 { *a } else { *b });
                    }
                    let _ = q.query::<Value>(&mut c);
                    sent += 1;
                }
            }
        }
    }
    assert!(sent > 6000);
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    assert!(
        !s.log().contains("panic"),
        "no panic was caught: {}",
        s.log()
    );
}

#[test]
fn command_flags_and_key_positions() {
    let s = Server::start();
    let mut c = s.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.CONSUME")
        .arg("k1")
        .arg("1")
        .arg("2")
        .query(&mut c)
        .unwrap();
    assert_eq!(keys, ["k1"]);
    let text = format!(
        "{:?}",
        redis::cmd("COMMAND")
            .arg("INFO")
            .arg("TB.CONSUME")
            .query::<Value>(&mut c)
            .unwrap()
    );
    for flag in ["write", "denyoom", "fast"] {
        assert!(text.contains(flag), "{flag} in {text}");
    }
    // Each key's flags say what the command does with it (ACL checks read
    // and write permission from them).
    let keys_and_flags = |c: &mut redis::Connection, args: &[&str]| -> Vec<(String, Vec<String>)> {
        redis::cmd("COMMAND")
            .arg("GETKEYSANDFLAGS")
            .arg(args)
            .query(c)
            .unwrap_or_else(|e| panic!("GETKEYSANDFLAGS {args:?}: {e}"))
    };
    let flags = |f: &[&str]| f.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let read = flags(&["RO", "access"]);
    let update = flags(&["RW", "access", "update"]);
    for (args, want) in [
        (&["TB.INFO", "k"][..], vec![("k", &read)]),
        (&["TB.CONSUME", "k", "1", "2"], vec![("k", &update)]),
        (&["TB.REFUND", "k", "1"], vec![("k", &update)]),
        (&["CL.THROTTLE", "k", "1", "1", "1"], vec![("k", &update)]),
        (
            &["TB.SETSTATE", "k", "x"],
            vec![("k", &flags(&["OW", "update"]))],
        ),
        (
            &["TB.MCONSUME", "2", "a", "b", "1", "1", "1", "1", "1", "1"],
            vec![("a", &update), ("b", &update)],
        ),
    ] {
        let want: Vec<(String, Vec<String>)> = want
            .into_iter()
            .map(|(k, f)| (k.to_string(), f.clone()))
            .collect();
        assert_eq!(keys_and_flags(&mut c, args), want, "{args:?}");
    }
    // In MULTI the command sees one clock and replicates effects only.
    let r: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("TB.CONSUME")
        .arg("m")
        .arg("0")
        .arg("2")
        .cmd("TB.CONSUME")
        .arg("m")
        .arg("0")
        .arg("2")
        .cmd("TB.CONSUME")
        .arg("m")
        .arg("0")
        .arg("2")
        .query(&mut c)
        .unwrap();
    assert_eq!(
        r,
        vec![
            vec![1, 1, 0, -1, 1],
            vec![1, 0, 0, -1, 1],
            vec![0, 0, -1, -1, 0]
        ]
    );
}

#[test]
fn dump_restore_copy_and_digest() {
    let s = Server::start();
    let mut c = s.conn();
    consume(&mut c, "src", "1e-3", "100", Some("37"));
    let d = digest(&mut c, "src");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("src").query(&mut c).unwrap();
    let expire_at: i64 = redis::cmd("PEXPIRETIME").arg("src").query(&mut c).unwrap();
    // The digest covers the expiry too, so restore it with the same absolute TTL.
    let _: () = redis::cmd("RESTORE")
        .arg("dst")
        .arg(expire_at)
        .arg(&dump)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "dst"), d);
    let _: i64 = redis::cmd("COPY")
        .arg("src")
        .arg("cp")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "cp"), d);
    assert_eq!(info(&mut c, "dst").unwrap()["capacity"], "100");
    let t: String = redis::cmd("TYPE").arg("dst").query(&mut c).unwrap();
    assert_eq!(t, "tb-bucket");
    let mem: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg("src")
        .query(&mut c)
        .unwrap();
    assert!(mem > 48 && mem < 200, "{mem}");
    // A truncated or corrupted payload is refused, never a crash.
    let mut bad = dump.clone();
    bad.truncate(dump.len() / 2);
    let e = redis::cmd("RESTORE")
        .arg("bad")
        .arg(0)
        .arg(&bad)
        .query::<()>(&mut c);
    assert!(e.is_err());
    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}
