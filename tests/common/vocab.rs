//! The tests' shared vocabulary: calling the module's commands and reading
//! what they left behind, on plain and cluster connections alike
//! (`&mut dyn ConnectionLike`). Every helper panics with the command and the
//! server's answer when it does not get what it expects.

use std::collections::HashMap;
use std::thread;
use std::time::{Duration, Instant};

use redis::{ConnectionLike, RedisError, RedisResult, ToRedisArgs, Value};

/// The command `args[0] args[1..]`.
pub fn cmd<A: ToRedisArgs>(args: &[A]) -> redis::Cmd {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(a);
    }
    c
}

/// Runs `args` and returns whatever the server answered.
pub fn call<A: ToRedisArgs>(c: &mut dyn ConnectionLike, args: &[A]) -> RedisResult<Value> {
    cmd(args).query(c)
}

/// Runs `args`, which must answer an array of integers (or one integer,
/// returned as an array of one).
pub fn ints(c: &mut dyn ConnectionLike, args: &[&str]) -> Vec<i64> {
    match call(c, args) {
        Ok(Value::Int(n)) => vec![n],
        Ok(v) => redis::from_redis_value(&v).unwrap_or_else(|e| panic!("{args:?}: {e}")),
        Err(e) => panic!("{args:?}: {e}"),
    }
}

/// Runs `args`, which must answer `+OK`.
pub fn ok(c: &mut dyn ConnectionLike, args: &[&str]) {
    let r: String = cmd(args)
        .query(c)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(r, "OK", "{args:?}");
}

/// The error `cmd` must get.
pub fn error_of(c: &mut dyn ConnectionLike, cmd: &redis::Cmd) -> RedisError {
    match cmd.query::<Value>(c) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

/// An error as the server sent it: `CODE message`.
pub fn error_line(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => e.to_string(),
    }
}

/// The error line `args` must get (arguments as any bytes).
pub fn err<A: ToRedisArgs + std::fmt::Debug>(c: &mut dyn ConnectionLike, args: &[A]) -> String {
    match call(c, args) {
        Err(e) => error_line(&e),
        Ok(v) => panic!("{args:?}: expected an error, got {v:?}"),
    }
}

/// Pass as `n` to leave it out of TB.CONSUME (the command's default, 1).
pub const DEFAULT_N: Option<u64> = None;

/// `TB.CONSUME key rate cap [n]` (`n` may be [`DEFAULT_N`]).
pub fn consume(
    c: &mut dyn ConnectionLike,
    key: &str,
    rate: &str,
    cap: impl ToRedisArgs,
    n: impl ToRedisArgs,
) -> Vec<i64> {
    redis::cmd("TB.CONSUME")
        .arg(key)
        .arg(rate)
        .arg(cap)
        .arg(n)
        .query(c)
        .unwrap_or_else(|e| panic!("TB.CONSUME {key}: {e}"))
}

/// A flat field/value array (TB.INFO, COMMAND DOCS) as strings.
pub fn fields(v: Vec<Value>) -> HashMap<String, String> {
    let s = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(n) => n.to_string(),
        other => format!("{other:?}"),
    };
    v.chunks(2).map(|p| (s(&p[0]), s(&p[1]))).collect()
}

/// `TB.INFO key` as a map, or `None` for a missing key.
pub fn info(c: &mut dyn ConnectionLike, key: &str) -> Option<HashMap<String, String>> {
    let v: Option<Vec<Value>> = redis::cmd("TB.INFO")
        .arg(key)
        .query(c)
        .unwrap_or_else(|e| panic!("TB.INFO {key}: {e}"));
    v.map(fields)
}

/// `TB.INFO key` of a bucket that must exist.
pub fn state(c: &mut dyn ConnectionLike, key: &str) -> HashMap<String, String> {
    info(c, key).unwrap_or_else(|| panic!("bucket {key} is missing"))
}

/// The `tokens` field of a bucket that must exist.
pub fn tokens(c: &mut dyn ConnectionLike, key: &str) -> String {
    state(c, key)["tokens"].clone()
}

/// `DEBUG DIGEST-VALUE key`.
pub fn digest(c: &mut dyn ConnectionLike, key: &str) -> String {
    let v: Vec<String> = redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(c)
        .unwrap_or_else(|e| panic!("DEBUG DIGEST-VALUE {key}: {e}"));
    v[0].clone()
}

/// `DEBUG DIGEST`: the whole dataset.
pub fn dataset_digest(c: &mut dyn ConnectionLike) -> String {
    redis::cmd("DEBUG").arg("DIGEST").query(c).unwrap()
}

/// One `INFO` section as a map of strings.
pub fn info_section(c: &mut dyn ConnectionLike, section: &str) -> HashMap<String, String> {
    let text: String = redis::cmd("INFO")
        .arg(section)
        .query(c)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// One `INFO` field, which must be there.
pub fn info_field(c: &mut dyn ConnectionLike, section: &str, field: &str) -> String {
    let mut all = info_section(c, section);
    all.remove(field)
        .unwrap_or_else(|| panic!("no {field} in INFO {section}: {all:?}"))
}

/// `INFO tb`: the module's counters and gauges.
pub fn info_tb(c: &mut dyn ConnectionLike) -> HashMap<String, i64> {
    info_section(c, "tb")
        .into_iter()
        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
        .collect()
}

/// `tb_blocked_now`: clients waiting in BLOCK.
pub fn blocked_now(c: &mut dyn ConnectionLike) -> i64 {
    info_tb(c)["tb_blocked_now"]
}

/// `used_memory` in bytes.
pub fn used_memory(c: &mut dyn ConnectionLike) -> i64 {
    info_field(c, "memory", "used_memory").parse().unwrap()
}

/// `master_repl_offset`.
pub fn repl_offset(c: &mut dyn ConnectionLike) -> i64 {
    info_field(c, "replication", "master_repl_offset")
        .parse()
        .unwrap()
}

/// The server's clock (`TIME`) in microseconds.
pub fn server_time_us(c: &mut dyn ConnectionLike) -> i64 {
    let t: Vec<String> = redis::cmd("TIME").query(c).unwrap();
    t[0].parse::<i64>().unwrap() * 1_000_000 + t[1].parse::<i64>().unwrap()
}

/// Polls the server's clock until it reads at least `t_us` (a deadline of
/// the wait plus 10 s guards against a stuck clock).
pub fn until_server_time(c: &mut dyn ConnectionLike, t_us: i64) {
    let now = server_time_us(c);
    let end = Instant::now() + Duration::from_micros((t_us - now).max(0) as u64 + 10_000_000);
    while server_time_us(c) < t_us {
        assert!(
            Instant::now() < end,
            "the server clock did not reach {t_us}"
        );
        thread::sleep(Duration::from_millis(1));
    }
}

/// A decimal token count (`"4.012"`, `"-1"`) in nano-tokens, exactly.
pub fn nanos(decimal: &str) -> i128 {
    let (neg, abs) = match decimal.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, decimal),
    };
    let (whole, frac) = abs.split_once('.').unwrap_or((abs, ""));
    assert!(frac.len() <= 9, "more than nano-token digits: {decimal}");
    let frac = format!("{frac:0<9}");
    let v = whole.parse::<i128>().unwrap() * 1_000_000_000 + frac.parse::<i128>().unwrap();
    if neg {
        -v
    } else {
        v
    }
}

/// `CONFIG SET name value`.
pub fn config_set(c: &mut dyn ConnectionLike, name: &str, value: &str) {
    ok(c, &["CONFIG", "SET", name, value]);
}

/// `TB.CONFIG SET name value`.
pub fn tb_config_set(c: &mut dyn ConnectionLike, name: &str, value: &str) {
    ok(c, &["TB.CONFIG", "SET", name, value]);
}

/// `args` in the RESP wire format, for raw sockets.
pub fn resp<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut wire = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        wire.extend(format!("${}\r\n", a.len()).as_bytes());
        wire.extend(a);
        wire.extend(b"\r\n");
    }
    wire
}

/// `WAIT 1 30000`: returns once the one replica has acknowledged every
/// write made on this connection.
pub fn sync_replica(c: &mut dyn ConnectionLike) {
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(30_000)
        .query(c)
        .unwrap_or_else(|e| panic!("WAIT: {e}"));
    assert_eq!(acked, 1, "the replica acknowledged the stream");
}

/// Whether no AOF rewrite is running or scheduled (a condition for
/// [`crate::common::Server::wait_for`]).
pub fn aof_rewrite_done(c: &mut dyn ConnectionLike) -> bool {
    let p = info_section(c, "persistence");
    p["aof_rewrite_in_progress"] == "0" && p["aof_rewrite_scheduled"] == "0"
}

/// `INFO commandstats` as text.
pub fn commandstats(c: &mut dyn ConnectionLike) -> String {
    redis::cmd("INFO").arg("commandstats").query(c).unwrap()
}

/// `ACL SETUSER name <rules>`, the rules as one space-separated string.
pub fn setuser(c: &mut dyn ConnectionLike, name: &str, rules: &str) {
    let mut args = vec!["ACL", "SETUSER", name];
    args.extend(rules.split_whitespace());
    ok(c, &args);
}

/// The reply to a command sent with [`crate::common::Server::send`], as
/// integers (an error reply is an `Err`).
pub fn answer(c: &mut redis::Connection) -> RedisResult<Vec<i64>> {
    c.recv_response()
        .and_then(|v| v.extract_error())
        .and_then(|v| redis::from_redis_value(&v))
}
