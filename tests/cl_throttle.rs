//! `CL.THROTTLE` answers as redis-cell does, reply for reply.
//!
//! `tests/fixtures/cl_throttle_redis_cell.txt` holds replies recorded from a
//! build of brandur/redis-cell (the drop-in's contract), one call a line:
//! `time_us key max_burst count period quantity => limited limit remaining
//! retry_after reset_after`, on a frozen server clock (the shim of
//! `tests/clockshift/`) so that every call happens at the recorded instant.
//! [`replays_redis_cell`] makes the same calls at the same instants against
//! the module and compares every reply.
//!
//! One known difference, by construction: redis-cell keeps its rate as an
//! emission interval of whole nanoseconds, `period / count` rounded down, so
//! for a rate like 13 per second it refills a little faster than the exact
//! rate tb keeps. At the edge of a token the two can then differ by one in
//! one field (`remaining`, or a wait in seconds). Only such a difference,
//! and only for such a rate, is tolerated; the test prints each one.
//!
//! To record it again (after changing [`calls`]): build redis-cell, then
//! `TB_CELL_MODULE=/path/to/libredis_cell.so cargo test --release --test
//! cl_throttle -- --ignored record`.

mod common;

use std::fmt::Write as _;
use std::path::PathBuf;

use common::clock::{self, Clock};
use common::rng::Rng;
use common::{Server, ServerConfig};

/// A fixed instant (2026-11-22) the frozen clock counts from.
const T0: i64 = 1_795_300_000_000_000;
/// The fixed seed of the recorded calls.
const SEED: u64 = 0x2545_f491_4f6c_dd1d;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cl_throttle_redis_cell.txt")
}

/// One call: the frozen instant and the command's arguments after its name.
#[derive(Debug, PartialEq)]
struct Call {
    at_us: i64,
    args: [String; 5],
}

/// The recorded calls: buckets of random limits, each hit by a burst of
/// calls at random instants (many in the same microsecond, some a period
/// apart), with quantities of 0, 1, around the burst and above the limit.
fn calls() -> Vec<Call> {
    let mut rng = Rng(SEED);
    let mut at = T0;
    let mut out = Vec::new();
    for case in 0..400 {
        let burst = rng.below(9);
        let count = 1 + rng.below(20);
        let period = rng.pick(&[1u64, 2, 3, 7, 10, 60]);
        let key = format!("cell:{case}");
        for _ in 0..1 + rng.below(14) {
            at += match rng.below(4) {
                0 => 0,
                1 => rng.below(1_000) as i64,
                2 => rng.below(1_000_000 * period / count) as i64,
                _ => rng.below(2_000_000 * period) as i64,
            };
            let quantity = match rng.below(8) {
                0 | 1 => 0,
                2..=5 => 1,
                _ => rng.below(burst + 4),
            };
            out.push(Call {
                at_us: at,
                args: [
                    key.clone(),
                    burst.to_string(),
                    count.to_string(),
                    period.to_string(),
                    quantity.to_string(),
                ],
            });
        }
        at += 1_000_000 * period as i64 * (burst as i64 + 2);
    }
    out
}

/// Runs `calls` on `server` (whose clock `clock` controls), one reply each.
fn run(server: &Server, clock: &mut Clock, calls: &[Call]) -> Vec<[i64; 5]> {
    let mut c = server.conn();
    calls
        .iter()
        .map(|call| {
            clock.freeze(call.at_us);
            let reply: Vec<i64> = redis::cmd("CL.THROTTLE")
                .arg(&call.args[..])
                .query(&mut c)
                .unwrap_or_else(|e| panic!("CL.THROTTLE {:?}: {e}", call.args));
            reply.try_into().expect("a five-integer reply")
        })
        .collect()
}

/// A server whose clock is frozen at `T0`: with the tb module, or with the
/// module at `module` instead.
fn frozen_server(module: Option<&str>) -> (Server, Clock, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a directory for the clock file");
    let mut clock = Clock::new(dir.path());
    clock.freeze(T0);
    let mut cfg = ServerConfig {
        env: clock.env(),
        ..Default::default()
    };
    if let Some(m) = module {
        cfg.load_module = false;
        cfg.args = vec!["--loadmodule".into(), m.into()];
    }
    let s = Server::start_with(cfg);
    clock::no_active_expiry(&s);
    (s, clock, dir)
}

fn parse_fixture() -> Vec<(Call, [i64; 5])> {
    let text = std::fs::read_to_string(fixture()).expect("read the redis-cell fixture");
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (call, reply) = line.split_once(" => ").expect("`call => reply`");
            let f: Vec<&str> = call.split(' ').collect();
            let r: Vec<i64> = reply.split(' ').map(|x| x.parse().unwrap()).collect();
            let args = [f[1], f[2], f[3], f[4], f[5]].map(String::from);
            let call = Call {
                at_us: f[0].parse().unwrap(),
                args,
            };
            (call, r.try_into().expect("five integers"))
        })
        .collect()
}

#[test]
fn the_fixture_holds_the_calls_of_this_file() {
    let recorded: Vec<Call> = parse_fixture().into_iter().map(|(c, _)| c).collect();
    assert_eq!(
        recorded,
        calls(),
        "the fixture was recorded from other calls: record it again (see the top of this file)"
    );
}

#[test]
fn replays_redis_cell() {
    let recorded = parse_fixture();
    let calls: Vec<Call> = recorded
        .iter()
        .map(|(c, _)| Call {
            at_us: c.at_us,
            args: c.args.clone(),
        })
        .collect();
    let (server, mut clock, _dir) = frozen_server(None);
    let got = run(&server, &mut clock, &calls);
    let mut diffs = String::new();
    let mut n = 0;
    for ((call, want), got) in recorded.iter().zip(&got) {
        if want == got {
            continue;
        }
        let line = format!(
            "at T0+{}us CL.THROTTLE {}: redis-cell {want:?}, tb {got:?}",
            call.at_us - T0,
            call.args.join(" ")
        );
        if rounds_its_interval(call) && one_field_off_by_one(want, got) {
            println!("redis-cell's rounded interval: {line}");
            continue;
        }
        n += 1;
        if n <= 20 {
            let _ = writeln!(diffs, "  {line}");
        }
    }
    assert_eq!(
        n,
        0,
        "{n} of {} replies differ from redis-cell's:\n{diffs}",
        recorded.len()
    );
}

/// True when redis-cell's emission interval for the call's rate, `period /
/// count` seconds in whole nanoseconds, is rounded.
fn rounds_its_interval(call: &Call) -> bool {
    let count: u64 = call.args[2].parse().unwrap();
    let period: u64 = call.args[3].parse().unwrap();
    !(period * 1_000_000_000).is_multiple_of(count)
}

/// True when the replies differ in exactly one field, by one.
fn one_field_off_by_one(a: &[i64; 5], b: &[i64; 5]) -> bool {
    let off: Vec<i64> = a.iter().zip(b).map(|(x, y)| (x - y).abs()).collect();
    off.iter().filter(|&&d| d != 0).count() == 1 && off.iter().all(|&d| d <= 1)
}

/// Records the fixture from redis-cell (see the top of this file).
#[test]
#[ignore = "needs a build of redis-cell in TB_CELL_MODULE"]
fn record() {
    let module = std::env::var("TB_CELL_MODULE")
        .expect("TB_CELL_MODULE: the path of a redis-cell build (libredis_cell.so)");
    let calls = calls();
    let (server, mut clock, _dir) = frozen_server(Some(&module));
    let replies = run(&server, &mut clock, &calls);
    let mut out = String::from(
        "# CL.THROTTLE replies recorded from brandur/redis-cell on a frozen clock\n\
         # (tests/cl_throttle.rs): time_us key max_burst count period quantity =>\n\
         # limited limit remaining retry_after reset_after\n",
    );
    for (call, r) in calls.iter().zip(&replies) {
        let r: Vec<String> = r.iter().map(i64::to_string).collect();
        let _ = writeln!(
            out,
            "{} {} => {}",
            call.at_us,
            call.args.join(" "),
            r.join(" ")
        );
    }
    std::fs::write(fixture(), out).expect("write the fixture");
}
