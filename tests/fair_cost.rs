//! The cost of choosing the next waiter with many flows (issue 22): one
//! grant of `FairQueue` (pop the next waiter, push its flow's next call) at
//! 1, 100, 10,000 and 100,000 flows waiting, in nanoseconds, printed as one
//! line of JSON for `bench/fair.py` (`make bench-fair`):
//!
//! `cargo test --release --test fair_cost -- --ignored --nocapture`
//!
//! Without `--ignored` (as in `make test`) it only checks, in a millisecond,
//! that the measuring loop serves every flow in turn.
//!
//! `src/fair.rs` is compiled into this binary (`#[path]`) rather than linked
//! from the `tb` library: the library built with the `module` feature
//! allocates through Redis (`RedisAlloc`), which a program outside Redis
//! cannot do. The code measured is the same source, with the same release
//! profile. Without the test harness (`harness = false` in Cargo.toml)
//! `fair.rs`'s own unit tests are not compiled in again.

#[allow(dead_code)]
#[path = "../src/fair.rs"]
mod fair;

use std::hint::black_box;
use std::time::Instant;

use fair::FairQueue;

/// Flow counts measured.
const FLOWS: [usize; 4] = [1, 100, 10_000, 100_000];
/// Grants per flow count and round, and rounds (medians are kept).
const GRANTS: usize = 1_000_000;
const ROUNDS: usize = 5;
/// Calls each flow keeps waiting.
const DEPTH: usize = 2;

fn names(flows: usize) -> Vec<Vec<u8>> {
    (0..flows)
        .map(|i| format!("tenant-{i:06}").into_bytes())
        .collect()
}

/// A queue where each of `flows` flows has `DEPTH` calls waiting (the call's
/// item is its flow's index).
fn filled(names: &[Vec<u8>]) -> FairQueue<usize> {
    let mut q = FairQueue::default();
    for _ in 0..DEPTH {
        for (i, n) in names.iter().enumerate() {
            q.push(n, 1, 1, i);
        }
    }
    q
}

/// `grants` grants: the next waiter out, and its flow's next call in, as a
/// saturated bucket with every flow looping does. Returns the flows served.
fn grant(q: &mut FairQueue<usize>, names: &[Vec<u8>], grants: usize) -> Vec<usize> {
    let mut served = Vec::with_capacity(grants.min(1 << 16));
    for g in 0..grants {
        let (_, flow) = q.pop().expect("every flow keeps waiting");
        q.push(&names[flow], 1, 1, flow);
        if g < served.capacity() {
            served.push(flow);
        }
    }
    served
}

/// Nanoseconds per grant at each of [`FLOWS`], round by round: every round
/// times each flow count once, so that other load on the machine weighs on
/// all of them alike (and their ratios are taken within a round).
fn ns_per_grant() -> Vec<Vec<f64>> {
    let mut queues: Vec<(Vec<Vec<u8>>, FairQueue<usize>)> = FLOWS
        .iter()
        .map(|&flows| {
            let names = names(flows);
            let mut q = filled(&names);
            grant(&mut q, &names, GRANTS / 10); // warm up: every flow served
            (names, q)
        })
        .collect();
    (0..ROUNDS)
        .map(|_| {
            queues
                .iter_mut()
                .map(|(names, q)| {
                    let start = Instant::now();
                    black_box(grant(q, names, GRANTS));
                    start.elapsed().as_nanos() as f64 / GRANTS as f64
                })
                .collect()
        })
        .collect()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The loop serves flows in turn (equal weights, every flow waiting).
fn smoke() {
    let names = names(100);
    let mut q = filled(&names);
    let served = grant(&mut q, &names, 1_000);
    for (g, flow) in served.iter().enumerate() {
        assert_eq!(*flow, g % 100, "grant {g}");
    }
    assert_eq!(q.len(), 100 * DEPTH);
    println!("fair_cost: the measuring loop serves every flow in turn (smoke; --ignored measures)");
}

fn main() {
    if !std::env::args().any(|a| a == "--ignored") {
        smoke();
        return;
    }
    smoke();
    let rounds = ns_per_grant();
    let rows: Vec<String> = FLOWS
        .iter()
        .enumerate()
        .map(|(i, &flows)| {
            let ns: Vec<f64> = rounds.iter().map(|r| r[i]).collect();
            let m = median(ns.clone());
            eprintln!("fair_cost: {flows} flows: {m:.1} ns per grant (rounds {ns:.1?})");
            format!(
                "{{\"flows\": {flows}, \"ns_per_grant\": {m:.2}, \"rounds_ns\": [{}]}}",
                ns.iter()
                    .map(|r| format!("{r:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
        .collect();
    let at = |flows: usize| FLOWS.iter().position(|&f| f == flows).expect("measured");
    let ratio = median(rounds.iter().map(|r| r[at(10_000)] / r[at(100)]).collect());
    println!(
        "{{\"grants_per_round\": {GRANTS}, \"rounds\": {ROUNDS}, \"depth\": {DEPTH}, \
         \"ratio_10000_100\": {ratio:.4}, \"rows\": [{}]}}",
        rows.join(", ")
    );
}
