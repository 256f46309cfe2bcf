//! Several OS processes, each with its own connection, hammer one key; the
//! total granted obeys token conservation exactly.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{nanos, server_time_us, Server};

const RATE: i64 = 2000; // tokens per second
const CAPACITY: i64 = 1_000_000_000; // never reached, so no refill is clamped away
const WORKERS: usize = 4;
const RUN_MS: u64 = 3000;

#[test]
fn processes_hammering_one_key_never_exceed_the_bound() {
    let s = Server::start();
    let mut c = s.conn();
    // Start from an empty bucket at a known server time: every token granted
    // afterwards must have refilled since then.
    let t0 = server_time_us(&mut c);
    let _: () = redis::cmd("TB.SETSTATE")
        .arg("hot")
        .arg(0)
        .arg(t0)
        .arg(RATE)
        .arg(1)
        .arg(CAPACITY)
        .arg(0)
        .query(&mut c)
        .unwrap();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "hammer_worker",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TB_HAMMER_PORT", s.port.to_string())
                .env("TB_HAMMER_MS", RUN_MS.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn worker process")
        })
        .collect();
    let mut allowed: i64 = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "worker failed: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        let n: i64 = text
            .lines()
            .find_map(|l| l.split("ALLOWED=").nth(1))
            .unwrap_or_else(|| panic!("no count from worker: {text}"))
            .trim()
            .parse()
            .unwrap();
        assert!(n > 0, "every worker was served at least once");
        allowed += n;
    }
    let before = server_time_us(&mut c);
    let info: Vec<String> = redis::cmd("TB.INFO").arg("hot").query(&mut c).unwrap();
    let after = server_time_us(&mut c);
    let tokens = nanos(&info[1]);
    // Conservation: granted = refilled - left. Refill is rate * elapsed with
    // the module's clock read between `before` (less 1 ms: Redis 7.0 reads
    // milliseconds) and `after`; rounding can only withhold, never mint.
    let refill_nanos = |us: i64| RATE as i128 * us as i128 * 1000;
    let most = (refill_nanos(after - t0) - tokens) / 1_000_000_000;
    let least = (refill_nanos(before - 1000 - t0) - tokens) / 1_000_000_000 - 1;
    assert!(allowed <= most as i64, "granted {allowed} > bound {most}");
    assert!(
        allowed >= least as i64,
        "granted {allowed} < {least}: tokens lost"
    );
    assert!(
        allowed as u64 > RATE as u64 * RUN_MS / 1000 / 2,
        "the workers hammered: {allowed}"
    );
}

/// Worker body, run in a child process by the test above.
#[test]
#[ignore = "run as a child process by processes_hammering_one_key_never_exceed_the_bound"]
fn hammer_worker() {
    let port: u16 = std::env::var("TB_HAMMER_PORT")
        .expect("TB_HAMMER_PORT")
        .parse()
        .unwrap();
    let ms: u64 = std::env::var("TB_HAMMER_MS")
        .expect("TB_HAMMER_MS")
        .parse()
        .unwrap();
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut c = client.get_connection().unwrap();
    let deadline = Instant::now() + Duration::from_millis(ms);
    let mut allowed = 0u64;
    while Instant::now() < deadline {
        let r: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg("hot")
            .arg(RATE)
            .arg(CAPACITY)
            .query(&mut c)
            .unwrap();
        allowed += r[0] as u64;
    }
    println!("ALLOWED={allowed}");
}
