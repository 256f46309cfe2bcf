//! Sequences of TB.MCONSUME (`bucket::consume_all`) over up to four keys,
//! from any valid starting states, with the clock moving anywhere and limits
//! changing between calls, all or nothing, with RESERVE, or with `ATMOST MIN
//! chunk` (the parts with the largest `n` share one grant).
//!
//! After every call: all or nothing (either every bucket gave its `n` or no
//! bucket's tokens changed); the decision agrees with asking each bucket
//! alone (a part with `n = 0` asks for one token and takes none); a
//! denial's `retry_after_ms` is honest, also after a clock step back;
//! the kind agrees with the reply; tokens never exceed capacity, debt
//! never exceeds what the wait allows,
//! and every key's ledger (see `sim.rs`) shows nothing minted.

#![no_main]

// Shared with bucket_ops, which also uses the refund side.
#[allow(dead_code)]
mod sim;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sim::{wait_ms, Key, RawAmount, RawBucket, RawLimits, Step};
use tb::bucket::{self, Bucket, Kind, Mode, Part, NANOS};

#[derive(Arbitrary, Debug)]
struct RawPart {
    key: u8,
    limits: u8,
    n: RawAmount,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RawMode {
    All,
    Reserve(u32),
    /// `ATMOST MIN chunk`.
    AtMost(u8),
}

#[derive(Arbitrary, Debug)]
struct Op {
    parts: Vec<RawPart>,
    mode: RawMode,
    step: Step,
}

#[derive(Arbitrary, Debug)]
struct Input {
    starts: [Option<RawBucket>; 4],
    now: i64,
    expire_idle: bool,
    limits: [RawLimits; 4],
    ops: Vec<Op>,
}

const KEYS: usize = 4;

fuzz_target!(|input: Input| {
    let limits = input.limits.map(RawLimits::get);
    let mut keys: Vec<Key> = input
        .starts
        .iter()
        .map(|s| Key::new(s.and_then(RawBucket::get), input.expire_idle))
        .collect();
    let mut now = input.now;
    for op in input.ops.iter().take(32) {
        now = op.step.apply(now);
        for k in &mut keys {
            k.advance(now);
        }
        // Distinct keys, as TB.MCONSUME requires.
        let mut which: Vec<usize> = Vec::new();
        let mut parts: Vec<Part> = Vec::new();
        for p in &op.parts {
            let k = usize::from(p.key) % KEYS;
            if which.contains(&k) {
                continue;
            }
            which.push(k);
            parts.push(Part {
                stored: keys[k].stored,
                limits: limits[usize::from(p.limits) % limits.len()],
                n: p.n.get(),
            });
        }
        if parts.is_empty() {
            continue;
        }
        let (mode, max_wait_us) = match op.mode {
            RawMode::All => (Mode::All, 0),
            RawMode::Reserve(ms) => {
                let us = wait_ms(ms) * 1000;
                (Mode::Reserve { max_wait_us: us }, us)
            }
            RawMode::AtMost(min) => (
                Mode::AtMost {
                    min: u64::from(min).max(1),
                },
                0,
            ),
        };
        let o = bucket::consume_all(&parts, mode, now);
        assert_eq!(o.buckets.len(), parts.len());
        let big = parts.iter().map(|p| p.n).max().unwrap_or(0);
        // With ATMOST, the parts asking for the largest n share the grant.
        let least = match mode {
            Mode::AtMost { min } if big > 0 => Some(min.min(big)),
            _ => None,
        };
        let quantity = |p: &Part| least.is_some() && p.n == big;
        let mut share = big;

        // What each bucket holds before taking anything, and how long each
        // part would wait on its own.
        let mut waits = Vec::new();
        for (i, p) in parts.iter().enumerate() {
            let pre = match keys[which[i]].current(now) {
                Some(mut b) => {
                    b.reconfigure(p.limits, now);
                    b
                }
                None => Bucket::full(p.limits, now),
            };
            let taken = match (o.allowed, quantity(p)) {
                (false, _) => 0,
                (true, true) => o.granted,
                (true, false) => p.n,
            };
            assert_eq!(o.taken[i], taken, "{o:?}");
            assert_eq!(
                o.buckets[i].tokens,
                pre.tokens - i128::from(taken) * NANOS,
                "all or nothing"
            );
            assert_eq!(o.buckets[i].limits(), p.limits);
            let changed = p.stored.is_some_and(|s| s.limits() != p.limits);
            assert_eq!(o.dirty[i], changed || taken > 0);
            assert_eq!(o.remaining[i], o.buckets[i].whole_tokens(now));
            waits.push(match least {
                Some(m) if quantity(p) => {
                    share = share.min(pre.whole_tokens(now));
                    pre.micros_until(i128::from(m) * NANOS, now)
                }
                _ if p.n > pre.capacity => None,
                _ => pre.micros_until(i128::from(p.n.max(1)) * NANOS, now),
            });
        }
        if let (Some(m), true) = (least, o.allowed) {
            assert_eq!(
                o.granted, share,
                "the grant is what every quantity part has"
            );
            assert!(o.granted >= m && o.granted <= big, "{o:?}");
        }
        let slowest = waits.iter().try_fold(0u64, |a, w| w.map(|w| a.max(w)));
        let expect_allowed = slowest.is_some_and(|w| w == 0 || w <= max_wait_us);
        assert_eq!(o.allowed, expect_allowed, "{waits:?} -> {o:?}");
        let kind = match (o.allowed, slowest) {
            (true, Some(0)) => Kind::Allowed,
            (true, _) => Kind::Reserved,
            (false, None) => Kind::Never,
            (false, Some(_)) => Kind::Denied,
        };
        assert_eq!(o.kind, kind, "the kind says what the reply says");
        match slowest {
            None => assert_eq!(o.retry_after_ms, -1),
            Some(w) => assert_eq!(o.retry_after_ms, bucket::ceil_ms(w)),
        }
        // A denial's wait is honest: retrying the same request then succeeds.
        if !o.allowed && o.retry_after_ms >= 0 {
            let t = o
                .retry_after_ms
                .checked_mul(1000)
                .and_then(|d| now.checked_add(d));
            if let Some(t) = t {
                let again: Vec<Part> = parts
                    .iter()
                    .zip(&o.buckets)
                    .map(|(p, b)| Part {
                        stored: Some(*b),
                        ..*p
                    })
                    .collect();
                let retry = if least.is_some() { mode } else { Mode::All };
                assert!(
                    bucket::consume_all(&again, retry, t).allowed,
                    "optimistic retry"
                );
            }
        }
        for (i, p) in parts.iter().enumerate() {
            let key = &mut keys[which[i]];
            if o.dirty[i] {
                if o.allowed {
                    key.grant(o.taken[i]);
                    if o.retry_after_ms > 0 {
                        key.reserve_allowed(p.limits.rate, max_wait_us);
                    }
                }
                key.commit(o.buckets[i], now);
            }
        }
        for k in &keys {
            k.check(now);
        }
    }
});
