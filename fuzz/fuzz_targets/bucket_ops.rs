//! Sequences of TB.CONSUME (every mode) and TB.REFUND on one key, from any
//! valid starting state, with the clock moving forwards, standing still,
//! stepping back or jumping, and limits changing between calls. Built with
//! overflow checks, so any arithmetic overflow is a crash.
//!
//! After every call: the reply fields agree with the stored state; tokens
//! never exceed capacity; debt never exceeds what a reservation's wait
//! allows; every wait is exact, also after the clock stepped back (a denied
//! request succeeds exactly `retry_after_ms` later and not a millisecond
//! earlier, a reservation's debt is paid off exactly when it is due, a peek's
//! wait is the wait for one token); changing limits never mints; and the
//! ledger in `sim.rs` shows no token was ever created from nothing.

#![no_main]

mod sim;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sim::{wait_ms, Key, RawAmount, RawBucket, RawLimits, Step};
use tb::bucket::{self, Bucket, Kind, Limits, Mode, NANOS};

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RawMode {
    All,
    /// `ATMOST MIN chunk` (`chunk` 1 is plain ATMOST).
    AtMost(u8),
    Reserve(u32),
}

#[derive(Arbitrary, Debug)]
enum Op {
    Consume {
        limits: u8,
        n: RawAmount,
        mode: RawMode,
        step: Step,
    },
    Refund {
        n: RawAmount,
        step: Step,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    start: Option<RawBucket>,
    now: i64,
    expire_idle: bool,
    limits: [RawLimits; 3],
    ops: Vec<Op>,
}

/// The time `ms` milliseconds after `now`, if representable.
fn later(now: i64, ms: i64) -> Option<i64> {
    now.checked_add(ms.checked_mul(1000)?)
}

fn consume(key: &mut Key, l: Limits, n: u64, raw: RawMode, now: i64) {
    let (mode, max_wait_us) = match raw {
        RawMode::All => (Mode::All, 0),
        RawMode::AtMost(min) => (
            Mode::AtMost {
                min: u64::from(min).clamp(1, l.capacity.max(1)),
            },
            0,
        ),
        RawMode::Reserve(ms) => {
            let us = wait_ms(ms) * 1000;
            (Mode::Reserve { max_wait_us: us }, us)
        }
    };
    let before = key.current(now);
    let pre = match before {
        Some(mut b) => {
            b.reconfigure(l, now);
            b
        }
        None => Bucket::full(l, now),
    };
    let o = bucket::consume(key.stored.as_ref(), l, n, mode, now);

    assert!(o.granted <= n, "{o:?}");
    assert_eq!(o.remaining, o.bucket.whole_tokens(now));
    assert_eq!(o.reset_after_ms, o.bucket.reset_after_ms(now));
    assert!(o.retry_after_ms >= -1 && o.reset_after_ms >= -1, "{o:?}");
    assert_eq!(o.bucket.limits(), l, "the request's limits apply");
    let taken = i128::from(o.granted) * NANOS;
    assert_eq!(
        o.bucket.tokens,
        pre.tokens - taken,
        "only the grant is taken"
    );
    match o.kind {
        Kind::Peek => {
            assert_eq!(n, 0);
            assert!(!o.dirty, "a peek writes nothing");
            // A peek answers for one token, like a request for one.
            let one = bucket::consume(Some(&o.bucket), l, 1, Mode::All, now);
            assert_eq!(o.allowed(), one.kind == Kind::Allowed, "{o:?} {one:?}");
            let retry = o.retry_after_ms;
            match one.kind {
                Kind::Allowed => assert_eq!(retry, 0),
                Kind::Never => assert_eq!(retry, -1),
                _ => assert_eq!(retry, one.retry_after_ms),
            }
        }
        Kind::Allowed => {
            assert!(n > 0 && o.retry_after_ms == 0, "{o:?}");
            if let Mode::AtMost { min } = mode {
                assert!(o.granted >= min.min(n), "a grant below the chunk: {o:?}");
            } else {
                assert_eq!(o.granted, n);
            }
            assert!(
                o.bucket.nanos_at(now) >= 0,
                "granted into debt without RESERVE"
            );
        }
        Kind::Reserved => {
            assert!(matches!(mode, Mode::Reserve { .. }) && o.granted == n);
            let wait = o.retry_after_ms;
            assert!(wait >= 1 && wait as u64 <= max_wait_us / 1000, "{o:?}");
            // When the wait is over, the debt is paid off, and not before.
            if let Some(t) = later(now, wait) {
                assert!(o.bucket.nanos_at(t) >= 0, "still in debt when due: {o:?}");
            }
            if let Some(t) = later(now, wait - 1) {
                assert!(o.bucket.nanos_at(t) < 0, "wait 1 ms too long: {o:?}");
            }
        }
        Kind::Denied => {
            assert_eq!(o.granted, 0);
            let retry = o.retry_after_ms;
            assert!(retry >= 1, "{o:?}");
            // AtMost waits for its chunk (or n), the others for all n.
            let want = match mode {
                Mode::AtMost { min } => min.min(n),
                _ => n,
            };
            if let Some(t) = later(now, retry) {
                let again = bucket::consume(Some(&o.bucket), l, want, Mode::All, t);
                assert_eq!(again.kind, Kind::Allowed, "retry_after_ms was optimistic");
            }
            if let Some(t) = later(now, retry - 1) {
                let early = bucket::consume(Some(&o.bucket), l, want, Mode::All, t);
                assert_eq!(early.kind, Kind::Denied, "retry_after_ms was 1 ms too late");
            }
        }
        Kind::Never => {
            assert!(o.granted == 0 && o.retry_after_ms == -1);
            assert!(n > l.capacity || l.rate.is_zero(), "{o:?}");
        }
    }
    let changed = key.stored.is_some_and(|s| s.limits() != l);
    assert_eq!(o.dirty, o.granted > 0 || (n > 0 && changed), "{o:?}");
    if let Some(b) = before {
        assert!(
            o.bucket.nanos_at(now) <= b.nanos_at(now),
            "changing limits minted tokens"
        );
    }
    if let Some(s) = key.stored {
        assert!(o.bucket.updated_us >= s.updated_us, "time moved backwards");
    }
    if o.dirty {
        key.grant(o.granted);
        if o.kind == Kind::Reserved {
            key.reserve_allowed(l.rate, max_wait_us);
        }
        key.commit(o.bucket, now);
    }
}

fn refund(key: &mut Key, n: u64, now: i64) {
    let before = key.current(now);
    match (before, bucket::refund(key.stored.as_ref(), n, now)) {
        (None, None) => {}
        (Some(b), Some(a)) => {
            let (was, is) = (b.nanos_at(now), a.nanos_at(now));
            let want = (was + i128::from(n) * NANOS).min(b.cap_nanos());
            assert_eq!(is, want, "refund never goes above capacity");
            assert_eq!(a.limits(), b.limits());
            if n > 0 {
                key.refund(is - was);
                key.commit(a, now);
            }
        }
        (b, a) => panic!("refund of {b:?} gave {a:?}"),
    }
}

fuzz_target!(|input: Input| {
    let limits = input.limits.map(RawLimits::get);
    let mut key = Key::new(input.start.and_then(RawBucket::get), input.expire_idle);
    let mut now = input.now;
    key.advance(now);
    key.check(now);
    for op in input.ops.iter().take(64) {
        match *op {
            Op::Consume {
                limits: i,
                n,
                mode,
                step,
            } => {
                now = step.apply(now);
                key.advance(now);
                consume(&mut key, limits[usize::from(i) % 3], n.get(), mode, now);
            }
            Op::Refund { n, step } => {
                now = step.apply(now);
                key.advance(now);
                refund(&mut key, n.get(), now);
            }
        }
        key.check(now);
    }
});
