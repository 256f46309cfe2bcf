//! Clock steps: the server's wall clock stepped forwards and back while it
//! runs, through the `LD_PRELOAD` shim in `tests/clockshift/` (libfaketime
//! hangs these servers). After a step back refill pauses until the clock
//! passes the stored time again, and every wait the module reports counts
//! that time too; a `BLOCK` is held the wait it was promised, in real time,
//! whichever way the clock steps meanwhile.

mod common;

use std::time::{Duration, Instant};

use common::clock::{self, Clock};
use common::{Server, ServerConfig};
use redis::Connection;

const SEC: i64 = 1_000_000;
/// A fixed instant (2026-11-22) the frozen clock starts from.
const T0: i64 = 1_795_300_000 * SEC;

/// A server with the module whose wall clock `clock` controls.
fn server() -> (Server, Clock, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a directory for the clock file");
    let clock = Clock::new(dir.path());
    let s = Server::start_with(ServerConfig {
        env: clock.env(),
        ..Default::default()
    });
    clock::no_active_expiry(&s);
    (s, clock, dir)
}

fn cmd(c: &mut Connection, args: &[&str]) -> Vec<i64> {
    let mut q = redis::cmd(args[0]);
    for a in &args[1..] {
        q.arg(*a);
    }
    q.query(c)
        .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

fn info(c: &mut Connection, key: &str) -> Vec<(String, String)> {
    let v: Vec<String> = redis::cmd("TB.INFO").arg(key).query(c).unwrap();
    v.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect()
}

fn field(info: &[(String, String)], name: &str) -> i64 {
    info.iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {info:?}"))
        .1
        .parse()
        .unwrap()
}

fn tokens(c: &mut Connection, key: &str) -> String {
    let i = info(c, key);
    i.into_iter().find(|(k, _)| k == "tokens").unwrap().1
}

fn server_time_us(c: &mut Connection) -> i64 {
    let t: Vec<i64> = redis::cmd("TIME").query(c).unwrap();
    t[0] * SEC + t[1]
}

#[test]
fn the_shim_steps_and_freezes_the_server_clock() {
    let (s, mut clock, _dir) = server();
    let mut c = s.conn();
    clock.freeze(T0);
    assert_eq!(server_time_us(&mut c), T0);
    clock.freeze(T0 - 20 * SEC);
    assert_eq!(server_time_us(&mut c), T0 - 20 * SEC);
    clock.shift(-3600 * SEC);
    let real = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64;
    let shifted = server_time_us(&mut c);
    assert!(
        (real - 3600 * SEC - shifted).abs() < 60 * SEC,
        "{shifted} is not an hour behind {real}"
    );
}

/// After a step back, every wait counts the time until the clock passes the
/// stored time again: TB.CONSUME (denied, RESERVE, peek), TB.INFO and
/// TB.MCONSUME, and a retry made exactly then succeeds.
#[test]
fn waits_after_a_step_back_count_from_now() {
    let (s, mut clock, _dir) = server();
    let mut c = s.conn();
    clock.freeze(T0);
    // 1 token/s, capacity 10: empty at T0.
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "10"]),
        [1, 0, 0, 10_000, 10]
    );
    clock.freeze(T0 - 20 * SEC);
    // Refill resumes at T0: one token 21 s from now, full in 30 s.
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "1"]),
        [0, 0, 21_000, 30_000, 0]
    );
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "0"]),
        [0, 0, 21_000, 30_000, 0]
    );
    let i = info(&mut c, "k");
    assert_eq!(field(&i, "reset_after_ms"), 30_000);
    assert_eq!(
        field(&i, "updated_at_ms"),
        T0 / 1000,
        "the stored time stays"
    );
    assert_eq!(field(&i, "ttl_ms"), 30_000, "the key expires when full");
    assert_eq!(
        cmd(
            &mut c,
            &["TB.CONSUME", "k", "1", "10", "1", "RESERVE", "20999"]
        ),
        [0, 0, 21_000, 30_000, 0],
        "a 21 s wait is beyond a 20.999 s RESERVE"
    );
    assert_eq!(
        cmd(
            &mut c,
            &[
                "TB.MCONSUME",
                "2",
                "k",
                "other",
                "1",
                "10",
                "1",
                "1",
                "10",
                "1"
            ]
        ),
        [0, 21_000, 0, 10]
    );
    // A reservation made during the step is due 21 s later, to the
    // microsecond; the next token is there one second after that.
    assert_eq!(
        cmd(
            &mut c,
            &["TB.CONSUME", "k", "1", "10", "1", "RESERVE", "21000"]
        ),
        [1, 0, 21_000, 31_000, 1]
    );
    // (Instants on whole milliseconds: Redis 7.0 gives modules a ms clock.)
    clock.freeze(T0 + SEC - 1000);
    assert_eq!(tokens(&mut c, "k"), "-0.001");
    clock.freeze(T0 + SEC);
    assert_eq!(tokens(&mut c, "k"), "0");
    clock.freeze(T0 + 2 * SEC - 1000);
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "1"])[..3],
        [0, 0, 1]
    );
    clock.freeze(T0 + 2 * SEC);
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "1"]),
        [1, 0, 0, 10_000, 1]
    );
}

/// A step forward refills for the time stepped over (the clock is the only
/// time the server has), and a step back afterwards takes nothing away.
#[test]
fn a_step_forward_refills_and_a_step_back_keeps_it() {
    let (s, mut clock, _dir) = server();
    let mut c = s.conn();
    clock.freeze(T0);
    cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "10"]);
    clock.freeze(T0 + 4 * SEC);
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "1"]),
        [1, 3, 0, 7_000, 1]
    );
    clock.freeze(T0 + SEC);
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "3"]),
        [1, 0, 0, 13_000, 3]
    );
    assert_eq!(
        cmd(&mut c, &["TB.CONSUME", "k", "1", "10", "1"]),
        [0, 0, 4_000, 13_000, 0]
    );
}

/// Time from emptying a bucket of capacity 1 at `rate` to the answer of a
/// BLOCK for its next token, while the clock steps by `step_us` once the
/// client is waiting, and the answer. The server must hold the reply the
/// wait it promised, in real time: not less, and not the step more. The
/// answer grants the token, due now, and reads the bucket as the stepped
/// clock has it when sent (`remaining`: the caller checks).
fn block_across_a_step(rate: &str, step_us: i64) -> (Duration, Vec<i64>) {
    let (s, mut clock, _dir) = server();
    let mut c = s.conn();
    let mut waiter = s.conn();
    waiter
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let block = redis::cmd("TB.CONSUME")
        .arg("b")
        .arg(rate)
        .arg(1)
        .arg(1)
        .arg("BLOCK")
        .arg(60_000)
        .get_packed_command();
    let start = Instant::now();
    cmd(&mut c, &["TB.CONSUME", "b", rate, "1", "1"]);
    waiter.send_packed_command(&block).unwrap();
    s.wait_for("the client to wait", Duration::from_secs(10), |c| {
        let text: String = redis::cmd("INFO").arg("tb").query(c).unwrap();
        text.contains("tb_blocked_now:1")
    });
    clock.shift(step_us);
    let reply: Vec<i64> = redis::from_redis_value(&waiter.recv_response().unwrap()).unwrap();
    let held = start.elapsed();
    assert_eq!((reply[0], reply[2], reply[4]), (1, 0, 1), "{reply:?}");
    (held, reply)
}

/// The least time from emptying the bucket to the answer, for a token
/// `wait_ms` away: the module's clock on Redis 7.0 counts whole
/// milliseconds, so the bucket may have emptied up to 1 ms before the
/// real instant (the token is then due up to 1 ms earlier, never later).
fn at_least(wait_ms: u64) -> Duration {
    Duration::from_millis(wait_ms - 1)
}

#[test]
fn block_is_held_its_wait_across_a_step_back() {
    let (held, reply) = block_across_a_step("1", -20 * SEC);
    assert!(held >= at_least(1000), "{held:?}");
    // Refill paused: the clock has not passed the stored time again.
    assert_eq!(reply[1], 0, "{reply:?}");
    assert!(
        held < Duration::from_secs(10),
        "held {held:?}: the 20 s step back delayed the reply"
    );
}

#[test]
fn block_is_held_its_wait_across_a_step_forward() {
    let (held, reply) = block_across_a_step("20/m", 20 * SEC);
    // The 20 s stepped over refilled the bucket (as for any command) before
    // the reply read it: full again, its token back.
    assert_eq!(reply[1], 1, "{reply:?}");
    assert!(
        held >= at_least(3000),
        "answered after {held:?}, before the promised 3 s"
    );
    assert!(held < Duration::from_secs(12), "{held:?}");
}

#[test]
fn lease_ids_are_not_handed_out_again_after_a_clock_step_back() {
    let (s, mut clock, _dir) = server();
    let mut c = s.conn();
    let lease = |c: &mut Connection| -> i64 {
        let r = cmd(c, &["TB.CONSUME", "k", "0", "5", "1", "LEASE", "60000"]);
        assert_eq!(r[0], 1, "{r:?}");
        r[5]
    };
    // Ids taken at one instant, the key deleted, the clock stepped back
    // (NTP, a failover to a lagging node) and forward to that instant again,
    // and the key made again each time: every id is new.
    clock.freeze(T0);
    let mut seen = vec![lease(&mut c), lease(&mut c)];
    for at in [T0, T0 - 10 * SEC, T0, T0 - 1] {
        let _: i64 = redis::cmd("DEL").arg("k").query(&mut c).unwrap();
        clock.freeze(at);
        seen.push(lease(&mut c));
        seen.push(lease(&mut c));
    }
    let count = seen.len();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), count, "an id was handed out twice: {seen:?}");
}
