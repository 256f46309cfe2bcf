//! `TB.TOP`: the heavy-hitter sketches find known heavy keys (denials and
//! reservation waits, from every command that can deny or reserve), keep
//! their bounds, stay the same size with a million buckets and a million
//! distinct denied keys, answer on replicas and per cluster node, and stop
//! being fed when `tb.top-keys` is off.

mod common;

use common::cluster::{tag_for_slot, Cluster};
use common::{replica_of, Server, ServerConfig};
use redis::{Connection, Value};
use std::collections::HashMap;

/// Time constant of the sketches' decay (src/glue/top.rs).
const TAU_S: f64 = 60.0;
/// The coarsest clock the module reads (Redis 7.0's milliseconds), in s.
const CLOCK_TICK_S: f64 = 0.001;
/// Keys each sketch monitors.
const CAPACITY: f64 = 256.0;

/// One `TB.TOP` reply.
#[derive(Debug)]
struct Top {
    enabled: i64,
    tau_ms: i64,
    capacity: i64,
    memory_bytes: i64,
    total: f64,
    error_bound: f64,
    /// `(key, count, error)`, heaviest first.
    keys: Vec<(String, f64, f64)>,
}

impl Top {
    fn get(&self, key: &str) -> Option<(f64, f64)> {
        self.keys.iter().find(|k| k.0 == key).map(|k| (k.1, k.2))
    }

    fn names(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.0.as_str()).collect()
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
        Value::SimpleString(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn num(v: &Value) -> f64 {
    text(v).parse().unwrap()
}

fn top(c: &mut Connection, args: &[&str]) -> Top {
    let v: Value = redis::cmd("TB.TOP").arg(args).query(c).unwrap();
    let Value::Array(fields) = v else {
        panic!("TB.TOP replied {v:?}")
    };
    let f: HashMap<String, &Value> = fields.chunks(2).map(|kv| (text(&kv[0]), &kv[1])).collect();
    let names: Vec<String> = fields.chunks(2).map(|kv| text(&kv[0])).collect();
    assert_eq!(
        names,
        [
            "metric",
            "enabled",
            "tau_ms",
            "capacity",
            "memory_bytes",
            "total",
            "error_bound",
            "keys"
        ]
    );
    let want_metric = if args.iter().any(|a| a.eq_ignore_ascii_case("WAITS")) {
        "waits"
    } else {
        "denied"
    };
    assert_eq!(text(f["metric"]), want_metric);
    let Value::Array(keys) = f["keys"] else {
        panic!("keys: {:?}", f["keys"])
    };
    let keys = keys
        .iter()
        .map(|k| match k {
            Value::Array(e) if e.len() == 3 => (text(&e[0]), num(&e[1]), num(&e[2])),
            other => panic!("key entry {other:?}"),
        })
        .collect();
    Top {
        enabled: int(f["enabled"]),
        tau_ms: int(f["tau_ms"]),
        capacity: int(f["capacity"]),
        memory_bytes: int(f["memory_bytes"]),
        total: num(f["total"]),
        error_bound: num(f["error_bound"]),
        keys,
    }
}

/// Server time in seconds.
fn now_s(c: &mut Connection) -> f64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(c).unwrap();
    s as f64 + us as f64 / 1e6
}

/// Denies or reserves through a Lua loop (fast: no round trip per call):
/// `TB.CONSUME prefix..i rate capacity` for i in [from, to), and every
/// `every_j` iterations also on heavy key `j`. Returns the denials of the
/// light keys, then of each heavy key.
const LOOP: &str = r#"
local prefix, from, to = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local rate, cap = ARGV[4], ARGV[5]
local denied = {0}
for j = 6, #ARGV, 2 do denied[#denied + 1] = 0 end
for i = from, to - 1 do
  if redis.call('TB.CONSUME', prefix .. i, rate, cap)[1] == 0 then
    denied[1] = denied[1] + 1
  end
  for j = 6, #ARGV, 2 do
    if i % tonumber(ARGV[j + 1]) == 0 then
      if redis.call('TB.CONSUME', ARGV[j], rate, cap)[1] == 0 then
        local d = (j - 6) / 2 + 2
        denied[d] = denied[d] + 1
      end
    end
  end
end
return denied
"#;

fn run_loop(
    c: &mut Connection,
    prefix: &str,
    range: (u64, u64),
    limits: (&str, &str),
    heavy: &[(&str, u64)],
) -> Vec<i64> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(LOOP)
        .arg(0)
        .arg(prefix)
        .arg(range.0)
        .arg(range.1)
        .arg(limits.0)
        .arg(limits.1);
    for (k, every) in heavy {
        cmd.arg(*k).arg(*every);
    }
    cmd.query(c).unwrap()
}

fn consume(c: &mut Connection, args: &[&str]) -> Vec<i64> {
    redis::cmd("TB.CONSUME").arg(args).query(c).unwrap()
}

/// Checks a listed count against the exact number of events `exact` that
/// all happened within `[t0, t1]` (server time, s), queried by `t1`:
/// the true decayed weight lies in `[exact * e^(-(t1 - t0) / tau), exact]`.
/// On Redis 7.0 the module stamps events with the millisecond clock
/// (`RedisModule_Milliseconds`, truncated), up to 1 ms before the
/// microsecond `TIME` read as `t0`: the window starts a tick earlier.
fn assert_count(top: &Top, key: &str, exact: f64, t0: f64, t1: f64) {
    let (count, error) = top
        .get(key)
        .unwrap_or_else(|| panic!("{key} not listed: {:?}", top.names()));
    let decayed_low = exact * (-(t1 - (t0 - CLOCK_TICK_S)) / TAU_S).exp();
    // Figures are rounded to three decimals.
    assert!(
        count + 0.001 >= decayed_low,
        "{key}: count {count} below the true decayed weight (>= {decayed_low})"
    );
    assert!(
        count - error <= exact + 0.001,
        "{key}: lower bound {} above the true weight (<= {exact})",
        count - error
    );
    assert!(error <= top.error_bound + 0.001);
}

#[test]
fn finds_known_heavy_keys_and_keeps_its_bounds() {
    let s = Server::start();
    let mut c = s.conn();
    let t0 = now_s(&mut c);
    // 20,000 light keys denied once each (capacity 0: never satisfiable,
    // which writes nothing), and three heavy keys at known multiples.
    let heavy = [("rl:heavy:a", 10), ("rl:heavy:b", 25), ("rl:heavy:c", 50)];
    let mut denied = vec![0i64; 4];
    for batch in 0..4 {
        let d = run_loop(
            &mut c,
            "rl:light:",
            (batch * 5000, (batch + 1) * 5000),
            ("1/h", "0"),
            &heavy,
        );
        for (a, b) in denied.iter_mut().zip(d) {
            *a += b;
        }
    }
    assert_eq!(denied, [20_000, 2000, 800, 400]);
    // Allowed requests and peeks are not counted.
    for _ in 0..50 {
        consume(&mut c, &["rl:allowed", "1000", "1000"]);
        consume(&mut c, &["rl:light:1", "1/h", "0", "0"]);
    }
    let t = top(&mut c, &["DENIED", "COUNT", "5"]);
    // Read after the query: a count only decays, so the query's is at least
    // what it would be at t1.
    let t1 = now_s(&mut c);
    assert_eq!((t.enabled, t.tau_ms, t.capacity), (1, 60_000, 256));
    assert_eq!(t.keys.len(), 5);
    assert_eq!(&t.names()[..3], ["rl:heavy:a", "rl:heavy:b", "rl:heavy:c"]);
    assert!(t.get("rl:allowed").is_none());
    let total = 23_200.0;
    assert!(t.total <= total + 0.001 && t.total + 0.001 >= total * (-(t1 - t0) / TAU_S).exp());
    assert!(
        t.error_bound > 0.0 && t.error_bound <= t.total / CAPACITY + 0.001,
        "bound {} vs total / capacity {}",
        t.error_bound,
        t.total / CAPACITY
    );
    for ((k, _), exact) in heavy.iter().zip([2000.0, 800.0, 400.0]) {
        assert_count(&t, k, exact, t0, t1);
    }
    // No reservation happened: the other list is empty.
    let w = top(&mut c, &["WAITS"]);
    assert!(w.keys.is_empty() && w.total == 0.0, "{w:?}");
}

#[test]
fn counts_waits_and_every_command_that_denies_or_reserves() {
    let s = Server::start();
    let mut c = s.conn();
    let t0 = now_s(&mut c);
    // Reservations: the waits granted add up per key.
    let mut waited = HashMap::new();
    for (key, rate, calls) in [("rl:slow", "1", 10), ("rl:quick", "10", 4)] {
        for _ in 0..calls {
            let r = consume(&mut c, &[key, rate, "1", "1", "RESERVE", "60000"]);
            assert_eq!(r[0], 1);
            *waited.entry(key).or_insert(0.0) += r[2] as f64;
        }
    }
    // TB.MCONSUME: a denial counts for the bucket that lacked its tokens
    // only; a reservation for the bucket in debt only.
    let m: Vec<i64> = redis::cmd("TB.MCONSUME")
        .arg(&[
            "2",
            "{t}plenty",
            "{t}short",
            "1/h",
            "10",
            "1",
            "1/h",
            "1",
            "5",
        ])
        .query(&mut c)
        .unwrap();
    assert_eq!(m[0], 0);
    let mcons = [
        "2", "{t}debt", "{t}free", "1", "1", "1", "1000", "1000", "1",
    ];
    for _ in 0..2 {
        let m: Vec<i64> = redis::cmd("TB.MCONSUME")
            .arg(&mcons)
            .arg(&["RESERVE", "5000"])
            .query(&mut c)
            .unwrap();
        assert_eq!(m[0], 1);
        *waited.entry("{t}debt").or_insert(0.0) += m[1] as f64;
    }
    // CL.THROTTLE: the second call within the hour is denied.
    for _ in 0..2 {
        let _: Vec<i64> = redis::cmd("CL.THROTTLE")
            .arg(&["rl:throttled", "0", "1", "3600"])
            .query(&mut c)
            .unwrap();
    }
    let d = top(&mut c, &["COUNT", "256"]);
    let w = top(&mut c, &["waits", "count", "10"]);
    // Read after both queries: a count only decays, so each query's is at
    // least what it would be at t1 (read before them, a query a millisecond
    // later read 0.3 below the bound of a weight of 45,000 on a loaded
    // machine).
    let t1 = now_s(&mut c);
    assert_eq!(d.names(), ["rl:throttled", "{t}short"], "{d:?}");
    assert_count(&d, "{t}short", 1.0, t0, t1);
    assert_count(&d, "rl:throttled", 1.0, t0, t1);
    assert_eq!(w.names(), ["rl:slow", "{t}debt", "rl:quick"], "{w:?}");
    assert!(waited["rl:slow"] >= 9.0 * 950.0, "{waited:?}");
    for (k, exact) in &waited {
        assert_count(&w, k, *exact, t0, t1);
    }
    assert_eq!(w.error_bound, 0.0, "fewer keys than capacity: exact");
}

/// Bytes the server has allocated, with the Lua interpreter reset first so
/// that its garbage is not counted (on servers that count it).
fn used_memory(c: &mut Connection) -> i64 {
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(c).unwrap();
    let info: String = redis::cmd("INFO").arg("memory").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn memory_stays_fixed_with_a_million_buckets() {
    let s = Server::start();
    let mut c = s.conn();
    // Heavy means above total / capacity (about 4,000 here): only such keys
    // are sure to be listed.
    let heavy = [("b:heavy:1", 50), ("b:heavy:2", 100)];
    let fixed = top(&mut c, &[]).memory_bytes;
    // Two sketches of 256 entries with key names inline (256 bytes each),
    // all allocated up front.
    assert!(
        (2 * 256 * 256..=256 * 1024).contains(&fixed),
        "the sketches take {fixed} bytes"
    );
    // A million buckets (one token an hour, the first call takes it).
    for b in 0..10 {
        let d = run_loop(
            &mut c,
            "b:",
            (b * 100_000, (b + 1) * 100_000),
            ("1/h", "1"),
            &[],
        );
        assert_eq!(d, [0]);
    }
    for (k, _) in heavy {
        consume(&mut c, &[k, "1/h", "1"]);
    }
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, 1_000_002);
    let before = used_memory(&mut c);
    // Now deny every one of them once (a million distinct keys through the
    // sketch), and the two heavy keys repeatedly. Denials write nothing, so
    // any growth would be the sketch's.
    let mut denied = vec![0i64; 3];
    for b in 0..10 {
        let d = run_loop(
            &mut c,
            "b:",
            (b * 100_000, (b + 1) * 100_000),
            ("1/h", "1"),
            &heavy,
        );
        for (a, x) in denied.iter_mut().zip(d) {
            *a += x;
        }
    }
    assert_eq!(denied, [1_000_000, 20_000, 10_000]);
    let after = used_memory(&mut c);
    let t = top(&mut c, &["COUNT", "2"]);
    assert_eq!(t.memory_bytes, fixed);
    assert_eq!(t.names(), ["b:heavy:1", "b:heavy:2"]);
    // Anything kept per key would need more than 8 MB here (a million names
    // of 8 bytes and more). The server's own bookkeeping moves by tens of KB
    // across such a run whether the sketches are fed or not (seen: +3 KB to
    // +33 KB with `tb.top-keys` on or off), hence the 256 KB margin.
    let grew = after - before;
    println!("used_memory before {before}, after {after}: {grew:+} bytes; sketches {fixed} bytes");
    assert!(
        grew.abs() < 256 * 1024,
        "used_memory moved by {grew} bytes over a million denied keys"
    );
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(dbsize, 1_000_002);
}

#[test]
fn replicas_answer_for_the_traffic_they_served() {
    let m = Server::start();
    let r = replica_of(&m, ServerConfig::default());
    let mut mc = m.conn();
    for _ in 0..3 {
        consume(&mut mc, &["rl:k", "1/h", "1"]);
    }
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(15_000)
        .query(&mut mc)
        .unwrap();
    assert_eq!(acked, 1);
    assert_eq!(top(&mut mc, &[]).names(), ["rl:k"]);
    let mut rc = r.conn();
    let on_replica = top(&mut rc, &[]);
    assert!(on_replica.keys.is_empty() && on_replica.total == 0.0);
    // The bucket itself did reach the replica: only denials stay local.
    let info: Value = redis::cmd("TB.INFO").arg("rl:k").query(&mut rc).unwrap();
    assert!(matches!(info, Value::Array(_)));
    let e = redis::cmd("TB.CONSUME")
        .arg(&["rl:k", "1/h", "1"])
        .query::<Value>(&mut rc)
        .unwrap_err();
    assert_eq!(e.kind(), redis::ErrorKind::ReadOnly, "{e}");
}

#[test]
fn the_setting_turns_feeding_off_and_resetstat_clears() {
    let s = Server::start_with(ServerConfig {
        module_args: vec!["top-keys".into(), "no".into()],
        ..ServerConfig::default()
    });
    let mut c = s.conn();
    for _ in 0..3 {
        consume(&mut c, &["rl:k", "1/h", "1"]);
    }
    let t = top(&mut c, &[]);
    assert_eq!(t.enabled, 0);
    assert!(t.keys.is_empty());
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "tb.top-keys", "yes"])
        .query(&mut c)
        .unwrap();
    consume(&mut c, &["rl:k", "1/h", "1"]);
    let t = top(&mut c, &[]);
    assert_eq!((t.enabled, t.names()), (1, vec!["rl:k"]));
    let v: Vec<String> = redis::cmd("TB.CONFIG")
        .arg(&["GET", "top-keys"])
        .query(&mut c)
        .unwrap();
    assert_eq!(v, ["top-keys", "yes"]);
    let _: () = redis::cmd("TB.CONFIG")
        .arg(&["SET", "top-keys", "no"])
        .query(&mut c)
        .unwrap();
    consume(&mut c, &["rl:other", "1/h", "0"]);
    assert_eq!(top(&mut c, &[]).names(), ["rl:k"], "not fed while off");
    let _: () = redis::cmd("TB.CONFIG")
        .arg("RESETSTAT")
        .query(&mut c)
        .unwrap();
    let t = top(&mut c, &[]);
    assert!(t.keys.is_empty() && t.total == 0.0);
}

#[test]
fn refuses_bad_arguments_and_is_read_only() {
    let s = Server::start();
    let mut c = s.conn();
    for (args, err) in [
        (
            vec!["COUNT", "257"],
            "COUNT must be an integer from 0 to 256",
        ),
        (vec!["COUNT", "x"], "COUNT must be an integer from 0 to 256"),
        (vec!["COUNT"], "COUNT must be an integer from 0 to 256"),
        (vec!["DENIED", "WAITS"], "unknown or repeated option"),
        (vec!["key"], "unknown or repeated option"),
    ] {
        let e = redis::cmd("TB.TOP")
            .arg(&args)
            .query::<Value>(&mut c)
            .unwrap_err();
        assert!(e.to_string().contains(err), "{args:?}: {e}");
    }
    let info = |c: &mut Connection, name: &str| {
        let v: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(c)
            .unwrap();
        format!("{v:?}")
    };
    let flags = info(&mut c, "tb.top");
    assert!(
        flags.contains("readonly") && !flags.contains("\"write\""),
        "{flags}"
    );
    // Where the server takes ACL categories for module commands (7.2 and
    // later, Valkey), TB.TOP is in @read like TB.INFO.
    if info(&mut c, "tb.info").contains("@read") {
        assert!(
            flags.contains("@read") && flags.contains("@slow"),
            "{flags}"
        );
    }
    // A user limited to its own keys plus TB.TOP can run it: it takes no key.
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "ops",
            "on",
            ">pw",
            "resetkeys",
            "~rl:*",
            "-@all",
            "+tb.top",
        ])
        .query(&mut c)
        .unwrap();
    let mut ops = s.conn();
    let _: () = redis::cmd("AUTH")
        .arg(&["ops", "pw"])
        .query(&mut ops)
        .unwrap();
    assert_eq!(top(&mut ops, &[]).enabled, 1);
}

#[test]
fn each_cluster_node_answers_for_its_own_keys() {
    let cluster = Cluster::start();
    let mut cc = cluster.conn();
    let masters = cluster.masters();
    // One heavy key per master, by hash tag.
    let mut expected = HashMap::new();
    for &m in &masters {
        let slot = cluster.slot_map().iter().position(|&o| o == m).unwrap() as u16;
        let key = format!("{{{}}}:user", tag_for_slot(slot));
        for _ in 0..(2 + m) {
            let _: Vec<i64> = redis::cmd("TB.CONSUME")
                .arg(&[key.as_str(), "1/h", "1"])
                .query(&mut cc)
                .unwrap();
        }
        expected.insert(m, key);
    }
    for i in 0..cluster.nodes.len() {
        let mut c = cluster.node_conn(i);
        let t = top(&mut c, &[]);
        match expected.get(&i) {
            Some(key) => {
                assert_eq!(t.names(), [key.as_str()], "master {i}");
                let (count, _) = t.get(key).unwrap();
                assert!(
                    count <= (1 + i) as f64 + 0.001 && count > i as f64,
                    "{count}"
                );
            }
            None => assert!(t.keys.is_empty(), "replica {i} saw no traffic: {t:?}"),
        }
    }
}
