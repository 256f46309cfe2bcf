//! A protocol fuzzer against a live server: random TB.* and CL.THROTTLE
//! commands with random, malformed and extreme arguments, on keys of every
//! type, alone, inside MULTI and inside scripts, from many connections at
//! once, plus clients that vanish mid-BLOCK or mid-command.
//!
//! After every batch the server answers PING, its log shows no panic or
//! crash, keys of other types are untouched, and every bucket satisfies the
//! invariants as TB.INFO shows them: tokens never above capacity, and for the
//! buckets always used with the same limits (`f:*`), the stored limits are
//! those and the debt never exceeds what the longest wait used allows.
//!
//! Reproducible: the seed is printed (replay with `TB_FUZZ_SEED`); the size
//! is `TB_HOSTILE_BATCHES` batches (default 16) of `TB_HOSTILE_COMMANDS`
//! commands per connection (default 600) on 8 connections.

mod common;

use common::rng::{seed, Rng};
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{nanos, resp, Server};
use redis::{Connection, Value};

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect("a count"))
}

/// Limits of the `f:*` buckets, each used only with its own limits:
/// `(rate as TB.CONSUME takes it, count, period (CL.THROTTLE's form of the
/// same rate), capacity, rate as TB.INFO shows it)`.
const FIXED: [(&str, u64, u64, u64, &str); 8] = [
    ("10", 10, 1, 5, "10"),
    ("1/m", 1, 60, 3, "0.016666666667"),
    ("2.5", 5, 2, 10, "2.5"),
    ("1000", 1000, 1, 100, "1000"),
    ("0", 0, 1, 7, "0"),
    ("0.001", 1, 1000, 2, "0.001"),
    (
        "9e15",
        9_000_000_000_000_000,
        1,
        1 << 53,
        "9000000000000000",
    ),
    ("1e-12", 1, 1_000_000_000_000, 1, "0.000000000001"),
];
/// `f:*` keys (each uses `FIXED[i % 8]`).
const FIXED_KEYS: u64 = 24;
/// `w:*` keys: anything goes, including TB.SETSTATE.
const WILD_KEYS: u64 = 24;
/// Longest RESERVE/BLOCK wait ever sent for an `f:*` key, in ms.
const FIXED_MAX_WAIT_MS: u64 = 2000;
/// Keys of other types, each created once and never meant to change.
const TYPED: [&str; 6] = ["t:str", "t:list", "t:hash", "t:set", "t:zset", "t:stream"];

/// Arguments that no parser accepts, whatever the position.
const INVALID: [&[u8]; 14] = [
    b"",
    b"-1",
    b"+1",
    b"nan",
    b"inf",
    b"-inf",
    b"1e999",
    b"0x10",
    b" 1",
    b"1 ",
    b"1/x",
    b"\xff\xfe",
    b"\xef\xbc\x91",
    b"99999999999999999999999999999999999999999",
];

fn fixed_key(rng: &mut Rng) -> (String, usize) {
    let i = rng.below(FIXED_KEYS);
    (format!("f:{i}"), (i % FIXED.len() as u64) as usize)
}

fn wild_key(rng: &mut Rng) -> Vec<u8> {
    match rng.below(8) {
        0 => {
            let mut k = b"w:bin:".to_vec();
            k.extend(rng.bytes(12));
            k
        }
        1 => TYPED[rng.below(TYPED.len() as u64) as usize]
            .as_bytes()
            .to_vec(),
        _ => format!("w:{}", rng.below(WILD_KEYS)).into_bytes(),
    }
}

/// An argument that is usually nonsense and sometimes extreme or valid.
fn wild_arg(rng: &mut Rng) -> Vec<u8> {
    match rng.below(10) {
        0 => rng.pick(&INVALID).to_vec(),
        1 => rng.bytes(40),
        2 => rng.below(1 << 20).to_string().into_bytes(),
        3 => rng.next().to_string().into_bytes(),
        4 => rng
            .pick(&[
                "0",
                "1",
                "9007199254740992",
                "9007199254740993",
                "18446744073709551615",
                "18446744073709551616",
                "86400000",
                "86400001",
                "-0",
            ])
            .as_bytes()
            .to_vec(),
        5 => rng
            .pick(&[
                "10", "0.5", "1e-3", "100/m", "9e15", "9.1e15", "1e-12", "1e-13", "1/d", "1E+2",
            ])
            .as_bytes()
            .to_vec(),
        6 => rng
            .pick(&[
                "RESERVE", "BLOCK", "ATMOST", "reserve", "block", "atmost", "RESERVEX", "MIN",
                "min", "LEASE", "lease", "USED",
            ])
            .as_bytes()
            .to_vec(),
        7 if rng.chance(20) => vec![b'9'; 1 << 20],
        _ => rng.below(100).to_string().into_bytes(),
    }
}

/// One command to send, and what a correct module must answer.
struct Cmd {
    args: Vec<Vec<u8>>,
    expect: Expect,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    /// Anything but a dropped connection.
    Anything,
    /// An error reply (bad arguments, or a key of another type).
    Error,
    /// A well-formed request on an `f:*` bucket: a normal reply.
    Success,
}

fn cmd(args: Vec<Vec<u8>>, expect: Expect) -> Cmd {
    Cmd { args, expect }
}

fn s(v: &str) -> Vec<u8> {
    v.as_bytes().to_vec()
}

/// A well-formed request on an `f:*` key, with that key's limits; with
/// `spoil`, one argument is replaced by an invalid one (an error reply).
fn fixed_command(rng: &mut Rng, may_block: bool) -> Cmd {
    let (key, i) = fixed_key(rng);
    let (rate, count, period, cap, _) = FIXED[i];
    let n = match rng.below(4) {
        0 => rng.below(cap.min(1000) + 2),
        1 => 1,
        2 => 0,
        _ => (cap + rng.below(3)).min(1 << 53),
    };
    let mut args;
    let mut expect = Expect::Success;
    match rng.below(6) {
        0..=2 => {
            args = vec![
                s("TB.CONSUME"),
                s(&key),
                s(rate),
                cap.to_string().into_bytes(),
            ];
            if rng.chance(4) && n == 1 {
                // n omitted: 1.
            } else {
                args.push(n.to_string().into_bytes());
            }
            match rng.below(6) {
                0 => args.push(s(rng.pick(&["ATMOST", "atmost"]))),
                5 if cap > 0 => args.extend([
                    s("ATMOST"),
                    s(rng.pick(&["MIN", "min"])),
                    (1 + rng.below(cap)).to_string().into_bytes(),
                ]),
                1 => args.extend([
                    s(rng.pick(&["RESERVE", "reserve"])),
                    rng.below(FIXED_MAX_WAIT_MS + 1).to_string().into_bytes(),
                ]),
                2 if may_block => {
                    args.extend([s("BLOCK"), rng.below(150).to_string().into_bytes()])
                }
                _ => {}
            }
        }
        3 => {
            args = vec![
                s("CL.THROTTLE"),
                s(&key),
                (cap - 1).to_string().into_bytes(),
                count.to_string().into_bytes(),
                period.to_string().into_bytes(),
            ];
            if rng.chance(2) {
                args.push(n.to_string().into_bytes());
            }
        }
        4 => {
            args = vec![
                s("TB.REFUND"),
                s(&key),
                rng.below(cap.min(50) + 1).to_string().into_bytes(),
            ];
        }
        _ => {
            // TB.MCONSUME over distinct f:* keys, each with its own limits.
            let k = 1 + rng.below(3) as usize;
            let mut keys: Vec<(String, usize)> = Vec::new();
            while keys.len() < k {
                let kk = fixed_key(rng);
                if !keys.iter().any(|(name, _)| *name == kk.0) {
                    keys.push(kk);
                }
            }
            args = vec![s("TB.MCONSUME"), k.to_string().into_bytes()];
            args.extend(keys.iter().map(|(name, _)| s(name)));
            for (_, i) in &keys {
                let (rate, _, _, cap, _) = FIXED[*i];
                args.extend([
                    s(rate),
                    cap.to_string().into_bytes(),
                    rng.below(3).to_string().into_bytes(),
                ]);
            }
            if rng.chance(3) {
                args.extend([
                    s("RESERVE"),
                    rng.below(FIXED_MAX_WAIT_MS + 1).to_string().into_bytes(),
                ]);
            } else if rng.chance(3) {
                // A chunk of 1 fits every capacity (a larger one may not).
                args.extend([s("ATMOST"), s("MIN"), s("1")]);
            }
        }
    }
    if rng.chance(5) {
        // Spoil one argument that is not a key: the whole command must fail.
        let first = if args[0] == b"TB.MCONSUME" {
            // numkeys, then k keys, then 3 limits per key (and RESERVE ms).
            let k = (args.len() - 2) / 4;
            if rng.chance(3) {
                1
            } else {
                2 + k + rng.below((args.len() - 2 - k) as u64) as usize
            }
        } else {
            2 + rng.below(args.len() as u64 - 2) as usize
        };
        let at = first.min(args.len() - 1);
        args[at] = if rng.chance(2) {
            rng.pick(&INVALID).to_vec()
        } else {
            [&b"\xff"[..], &rng.bytes(8)].concat()
        };
        expect = Expect::Error;
    }
    cmd(args, expect)
}

/// Anything at all, on wild or typed keys.
fn wild_command(rng: &mut Rng) -> Cmd {
    let names = [
        "TB.CONSUME",
        "TB.MCONSUME",
        "TB.REFUND",
        "TB.INFO",
        "CL.THROTTLE",
        "TB.SETSTATE",
        "TB.RELEASE",
        "tb.consume",
        "Cl.Throttle",
    ];
    let name = s(rng.pick(&names));
    let mut args = vec![name.clone()];
    let key = wild_key(rng);
    let typed = TYPED.iter().any(|t| t.as_bytes() == key.as_slice());
    let upper = name.to_ascii_uppercase();
    if upper == b"TB.SETSTATE" && rng.chance(2) {
        // A valid-looking absolute state, often impossible.
        let cap = rng.below(1 << 20);
        let tokens: i128 = match rng.below(4) {
            0 => i128::from(cap) * 1_000_000_000,
            1 => -(i128::from(rng.below(1 << 40)) * 1_000_000_000),
            2 => -(1i128 << 100) + 1,
            _ => i128::from(rng.next() as i64),
        };
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as i64;
        let updated = now_us + (rng.below(20_000_000) as i64 - 10_000_000);
        args.extend([
            key,
            tokens.to_string().into_bytes(),
            updated.to_string().into_bytes(),
            rng.below(1 << 20).to_string().into_bytes(),
            (rng.below(1 << 20)).to_string().into_bytes(),
            cap.to_string().into_bytes(),
            rng.pick(&["0", "1", "99999999999999"]).as_bytes().to_vec(),
        ]);
        let expect = if typed {
            Expect::Error
        } else {
            Expect::Anything
        };
        return cmd(args, expect);
    }
    if upper == b"TB.MCONSUME" {
        let k = rng.below(4);
        args.push(if rng.chance(5) {
            wild_arg(rng)
        } else {
            k.to_string().into_bytes()
        });
        for _ in 0..k {
            args.push(wild_key(rng));
        }
    } else {
        args.push(key);
    }
    for _ in 0..rng.below(7) {
        args.push(wild_arg(rng));
    }
    let mentions_typed = args
        .iter()
        .any(|a| TYPED.iter().any(|t| t.as_bytes() == a.as_slice()));
    let expect =
        if (typed && upper != b"TB.MCONSUME") || (upper == b"TB.MCONSUME" && mentions_typed) {
            Expect::Error
        } else {
            Expect::Anything
        };
    cmd(args, expect)
}

/// Generic Redis commands on bucket keys (and settings changes).
fn generic_command(rng: &mut Rng) -> Cmd {
    let w = format!("w:{}", rng.below(WILD_KEYS));
    let w2 = format!("w:{}", rng.below(WILD_KEYS));
    let (f, _) = fixed_key(rng);
    let any = if rng.chance(2) { w.clone() } else { f.clone() };
    let args: Vec<&str> = match rng.below(22) {
        0 => vec!["TYPE", &any],
        1 => vec!["PTTL", &any],
        2 => vec!["PERSIST", &any],
        3 => vec!["PEXPIRE", &any, "50"],
        4 => vec!["COPY", &any, &w2, "REPLACE"],
        5 => vec!["RENAME", &w, &w2],
        6 => vec!["DEBUG", "DIGEST-VALUE", &any],
        7 => vec!["MEMORY", "USAGE", &any],
        8 => vec!["OBJECT", "ENCODING", &any],
        9 => vec!["GET", &any],
        10 => vec!["APPEND", &w, "x"],
        11 => vec!["LPUSH", &w, "x"],
        12 => vec!["DEL", &w],
        13 => vec!["UNLINK", &w],
        14 => vec!["MOVE", &w, "1"],
        15 => vec!["SET", &w, "not a bucket"],
        16 => vec![
            "TB.CONFIG",
            "GET",
            rng.pick(&["*", "max-*", "?xpire*", "", "\u{0}"]),
        ],
        17 => vec![
            "TB.CONFIG",
            "SET",
            "max-blocked",
            rng.pick(&["0", "1", "3", "10000", "-1", "1000001", "x"]),
        ],
        18 => vec![
            "TB.CONFIG",
            "SET",
            "max-wait-ms",
            rng.pick(&["2000", "60000", "86400000", "86400001", "-5", ""]),
        ],
        19 => vec![
            "TB.CONFIG",
            "SET",
            "expire-idle",
            rng.pick(&["yes", "no", "maybe"]),
        ],
        20 => vec!["TB.CONFIG", rng.pick(&["RESETSTAT", "FROB", "GET"])],
        _ => vec!["DUMP", &any],
    };
    cmd(args.into_iter().map(s).collect(), Expect::Anything)
}

fn generate(rng: &mut Rng, may_block: bool) -> Cmd {
    match rng.below(10) {
        0..=3 => fixed_command(rng, may_block),
        4..=7 => wild_command(rng),
        _ => generic_command(rng),
    }
}

/// What one connection saw.
#[derive(Default)]
struct Tally {
    commands: usize,
    errors: usize,
    in_multi: usize,
    in_scripts: usize,
    dropped_clients: usize,
}

fn to_cmd(args: &[Vec<u8>]) -> redis::Cmd {
    let mut c = redis::cmd(std::str::from_utf8(&args[0]).unwrap_or("TB.INFO"));
    for a in &args[1..] {
        c.arg(a.as_slice());
    }
    c
}

/// Checks one reply against what was expected.
fn judge(c: &Cmd, r: &redis::RedisResult<Value>, t: &mut Tally, context: &str) {
    let shown = || {
        c.args
            .iter()
            .map(|a| String::from_utf8_lossy(&a[..a.len().min(60)]).into_owned())
            .collect::<Vec<_>>()
            .join(" ")
    };
    match r {
        Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
            panic!("connection lost after `{}` ({context}): {e}", shown())
        }
        Err(e) => {
            t.errors += 1;
            assert_ne!(
                c.expect,
                Expect::Success,
                "`{}` ({context}) failed: {e}",
                shown()
            );
        }
        Ok(v) => {
            assert_ne!(
                c.expect,
                Expect::Error,
                "`{}` ({context}) succeeded: {v:?}",
                shown()
            );
            if c.expect == Expect::Success && c.args[0].eq_ignore_ascii_case(b"TB.CONSUME") {
                let r: Vec<i64> = redis::from_redis_value(v).unwrap();
                assert_eq!(r.len(), 5, "{r:?}");
                assert!(r[4] >= 0 && r[1] >= 0, "`{}`: {r:?}", shown());
            }
        }
    }
}

/// One connection's share of a batch.
fn worker(port: u16, mut rng: Rng, commands: usize) -> Tally {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut c = client
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut t = Tally::default();
    while t.commands < commands {
        match rng.below(20) {
            0 => multi(&mut c, &mut rng, &mut t),
            1 => script(&mut c, &mut rng, &mut t),
            2 => vanish(port, &mut rng, &mut t),
            _ => {
                let x = generate(&mut rng, true);
                let r = to_cmd(&x.args).query::<Value>(&mut c);
                t.commands += 1;
                judge(&x, &r, &mut t, "alone");
            }
        }
    }
    t
}

/// A few commands inside MULTI/EXEC (or DISCARD): BLOCK must refuse there.
fn multi(c: &mut Connection, rng: &mut Rng, t: &mut Tally) {
    let _: () = redis::cmd("MULTI").query(c).unwrap();
    let cmds: Vec<Cmd> = (0..1 + rng.below(6))
        .map(|_| generate(rng, false))
        .collect();
    let mut queued = 0;
    for x in &cmds {
        match to_cmd(&x.args).query::<Value>(c) {
            Ok(_) => queued += 1,
            Err(e) => assert!(!e.is_io_error(), "{e}"),
        }
    }
    t.commands += cmds.len();
    t.in_multi += cmds.len();
    if rng.chance(5) {
        let _: () = redis::cmd("DISCARD").query(c).unwrap();
        return;
    }
    match redis::cmd("EXEC").query::<Value>(c) {
        // Each queued command's reply, judged as if it ran alone.
        Ok(Value::Array(replies)) if queued == cmds.len() => {
            assert_eq!(replies.len(), cmds.len());
            for (x, v) in cmds.iter().zip(replies) {
                let r = match v {
                    Value::ServerError(e) => Err(redis::RedisError::from(e)),
                    v => Ok(v),
                };
                judge(x, &r, t, "in MULTI");
            }
        }
        Ok(_) => {}
        Err(e) => assert!(!e.is_io_error(), "{e}"),
    }
    let pong: String = redis::cmd("PING").query(c).unwrap();
    assert_eq!(pong, "PONG");
}

/// One command run from a Lua script (errors caught by pcall).
fn script(c: &mut Connection, rng: &mut Rng, t: &mut Tally) {
    let mut x = generate(rng, false);
    let mut e = redis::cmd("EVAL");
    e.arg("return redis.pcall(unpack(ARGV))").arg(0);
    for a in &x.args {
        e.arg(a.as_slice());
    }
    let blocks = x.args.iter().any(|a| a.eq_ignore_ascii_case(b"BLOCK"));
    if blocks || x.args[0].eq_ignore_ascii_case(b"TB.CONFIG") {
        // BLOCK cannot wait in a script; TB.CONFIG is denied in scripts.
        x.expect = Expect::Anything;
    }
    let r = e.query::<Value>(c);
    t.commands += 1;
    t.in_scripts += 1;
    judge(&x, &r, t, "in a script");
}

/// A client that sends a command and vanishes: mid-BLOCK, mid-argument,
/// or after a pipeline it never reads.
fn vanish(port: u16, rng: &mut Rng, t: &mut Tally) {
    let mut sock = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (key, i) = fixed_key(rng);
    let (rate, _, _, cap, _) = FIXED[i];
    let cap = cap.to_string();
    let block = resp(&["TB.CONSUME", &key, rate, &cap, "1", "BLOCK", "500"]);
    let bytes: Vec<u8> = match rng.below(3) {
        0 => block,
        1 => block[..rng.below(block.len() as u64) as usize].to_vec(),
        _ => block.repeat(1 + rng.below(20) as usize),
    };
    let _ = sock.write_all(&bytes);
    if rng.chance(2) {
        thread::sleep(Duration::from_millis(rng.below(20)));
    }
    drop(sock);
    t.dropped_clients += 1;
}

/// Every bucket in db 0 and 1 satisfies the invariants; returns how many
/// were checked.
fn check_buckets(s: &Server) -> usize {
    let mut checked = 0;
    for db in [0, 1] {
        let mut c = s.conn();
        let _: () = redis::cmd("SELECT").arg(db).query(&mut c).unwrap();
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
        for key in keys {
            let kind: String = redis::cmd("TYPE").arg(&key).query(&mut c).unwrap();
            if kind != "tb-bucket" {
                continue;
            }
            let info: Value = redis::cmd("TB.INFO").arg(&key).query(&mut c).unwrap();
            if info == Value::Nil {
                continue; // expired between the two commands
            }
            let f: Vec<Value> = redis::from_redis_value(&info).unwrap();
            let text = |v: &Value| -> String { redis::from_redis_value(v).unwrap() };
            let name = String::from_utf8_lossy(&key).into_owned();
            let tokens = nanos(&text(&f[1]));
            let cap: i64 = redis::from_redis_value(&f[3]).unwrap();
            let rate = text(&f[5]);
            assert!((0..=1 << 53).contains(&cap), "{name}: capacity {cap}");
            assert!(
                tokens <= i128::from(cap) * 1_000_000_000,
                "{name}: {tokens} above {cap}"
            );
            assert!(tokens > -(1i128 << 100), "{name}: {tokens}");
            if let Some(i) = name
                .strip_prefix("f:")
                .and_then(|i| i.parse::<usize>().ok())
            {
                assert_eq!(db, 0, "f:* keys never move");
                let (_, count, period, fcap, shown) = FIXED[i % FIXED.len()];
                assert_eq!(
                    (cap as u64, rate.as_str()),
                    (fcap, shown),
                    "{name}: limits changed"
                );
                // Debt is at most the refill over the longest wait used.
                let bound = i128::from(count) * i128::from(FIXED_MAX_WAIT_MS) * 1_000_000
                    / i128::from(period);
                assert!(tokens >= -bound, "{name}: debt {tokens} beyond {bound}");
            }
            checked += 1;
        }
    }
    checked
}

#[test]
fn hostile_clients_cannot_crash_or_corrupt() {
    let seed = seed();
    let batches = env_count("TB_HOSTILE_BATCHES", 16);
    let per_conn = env_count("TB_HOSTILE_COMMANDS", 600);
    let conns = 8;
    println!("hostile: seed {seed} (replay with TB_FUZZ_SEED={seed})");
    let s = Server::start();
    let mut c = s.conn();
    // Keys of other types, and their digests.
    let _: () = redis::cmd("SET")
        .arg("t:str")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("RPUSH")
        .arg("t:list")
        .arg("a")
        .arg("b")
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("HSET")
        .arg("t:hash")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("SADD")
        .arg("t:set")
        .arg("m")
        .query(&mut c)
        .unwrap();
    let _: i64 = redis::cmd("ZADD")
        .arg("t:zset")
        .arg(1)
        .arg("m")
        .query(&mut c)
        .unwrap();
    let _: String = redis::cmd("XADD")
        .arg("t:stream")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let digests = |c: &mut Connection| -> Vec<String> {
        let mut d = redis::cmd("DEBUG");
        d.arg("DIGEST-VALUE");
        for t in TYPED {
            d.arg(t);
        }
        d.query(c).unwrap()
    };
    let typed_before = digests(&mut c);

    let mut rng = Rng(seed);
    let total = Arc::new(AtomicUsize::new(0));
    let (mut errors, mut in_multi, mut in_scripts, mut dropped, mut checks) = (0, 0, 0, 0, 0);
    for batch in 0..batches {
        let handles: Vec<_> = (0..conns)
            .map(|_| {
                let r = Rng(rng.next() | 1);
                let port = s.port;
                thread::spawn(move || worker(port, r, per_conn))
            })
            .collect();
        for h in handles {
            let t = h
                .join()
                .unwrap_or_else(|_| panic!("batch {batch} failed (seed {seed})\n{}", s.log()));
            total.fetch_add(t.commands, Relaxed);
            errors += t.errors;
            in_multi += t.in_multi;
            in_scripts += t.in_scripts;
            dropped += t.dropped_clients;
        }
        let pong: String = redis::cmd("PING").query(&mut s.conn()).unwrap();
        assert_eq!(pong, "PONG", "batch {batch}");
        let log = s.log();
        for bad in ["panic", "ASSERTION", "crashed by signal", "Guru Meditation"] {
            assert!(
                !log.contains(bad),
                "batch {batch} (seed {seed}): log mentions {bad:?}\n{log}"
            );
        }
        checks += check_buckets(&s);
        assert_eq!(
            digests(&mut c),
            typed_before,
            "keys of other types were changed"
        );
    }
    // Every state the fuzzer left survives a save and reload.
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    checks += check_buckets(&s);
    let total = total.load(Relaxed);
    println!(
        "hostile: {total} commands ({in_multi} in MULTI, {in_scripts} in scripts) on {conns} \
         connections in {batches} batches, {errors} error replies, {dropped} clients dropped \
         mid-command; {checks} bucket states checked; crashes found: 0"
    );
    assert!(total >= batches * conns * per_conn);
    assert!(errors > 0 && errors < total, "both outcomes were exercised");
}
