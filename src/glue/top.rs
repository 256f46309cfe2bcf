//! The heavy-hitter sketches behind `TB.TOP` ([`crate::topkeys`]), fed by
//! the consume commands through [`record`] and [`record_multi`].
//!
//! Only denials and reservations reach the sketches: for an allowed request
//! the hook is one match on the outcome's kind (no clock read, no hashing,
//! no allocation, not even the setting's load). Denials and reservations are
//! not replicated, so each node's sketches hold the traffic that node served:
//! a replica's stay empty unless it served as a master before.

use std::cell::RefCell;

use super::entry::guard;
use crate::bucket::{ceil_ms, Kind, MultiOutcome, Outcome, NANOS};
use crate::parse::TopMetric;
use crate::topkeys::{Sketch, Summary};

/// Keys each sketch monitors ([`crate::topkeys::TOP_CAPACITY`]).
pub const CAPACITY: usize = crate::topkeys::TOP_CAPACITY;

/// Time constant of the decay: a steady rate `r` reads as `r * 60 s`.
pub const TAU_US: i64 = 60_000_000;

/// Whether the sketches are fed (the `top-keys` setting).
pub fn enabled() -> bool {
    crate::settings::TOP_KEYS.get() != 0
}

/// The two sketches: denials per key, and reservation wait (ms) per key.
struct Tops {
    denied: Sketch,
    waits: Sketch,
}

impl Tops {
    fn new(now_us: i64) -> Tops {
        Tops {
            denied: Sketch::new(CAPACITY, TAU_US, now_us),
            waits: Sketch::new(CAPACITY, TAU_US, now_us),
        }
    }

    fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Tops>() + self.denied.memory_bytes() + self.waits.memory_bytes()
    }
}

thread_local! {
    /// Made on first use, then never grows. Commands run on Redis' main
    /// thread only, so one thread-local instance is the module's.
    static TOPS: RefCell<Option<Tops>> = const { RefCell::new(None) };
}

fn with_tops<T>(now_us: i64, f: impl FnOnce(&mut Tops) -> T) -> T {
    TOPS.with(|t| {
        let mut t = t.borrow_mut();
        f(t.get_or_insert_with(|| Tops::new(now_us)))
    })
}

/// Records one `TB.CONSUME`/`CL.THROTTLE` outcome for `key` (read only on a
/// denial or reservation).
#[inline]
pub fn record<'a>(o: &Outcome, now_us: i64, key: impl FnOnce() -> &'a [u8]) {
    match o.kind {
        Kind::Denied | Kind::Never => add(TopMetric::Denied, key(), 1, now_us),
        Kind::Reserved => add(TopMetric::Waits, key(), o.retry_after_ms, now_us),
        Kind::Allowed | Kind::Peek => {}
    }
}

/// Records one `TB.MCONSUME` outcome: a denial counts for each bucket that
/// lacked what it needed (its `n`, or the chunk of a shared `ATMOST` grant);
/// a reservation adds to each bucket in debt the wait until
/// that bucket is out of it. `key(i)` names part `i`.
#[inline]
pub fn record_multi<'a>(o: &MultiOutcome, now_us: i64, key: impl Fn(usize) -> &'a [u8]) {
    if o.kind != Kind::Allowed {
        record_multi_slow(o, now_us, key);
    }
}

#[cold]
fn record_multi_slow<'a>(o: &MultiOutcome, now_us: i64, key: impl Fn(usize) -> &'a [u8]) {
    for (i, b) in o.buckets.iter().enumerate() {
        if o.allowed {
            if let Some(us @ 1..) = b.micros_until(0, now_us) {
                add(TopMetric::Waits, key(i), ceil_ms(us), now_us);
            }
        } else if b.micros_until(o.need[i] as i128 * NANOS, now_us) != Some(0) {
            // Short of what it needed: its n (a peek, one token), or the
            // chunk of a shared ATMOST grant.
            add(TopMetric::Denied, key(i), 1, now_us);
        }
    }
}

#[cold]
#[inline(never)]
fn add(metric: TopMetric, key: &[u8], weight: i64, now_us: i64) {
    if !enabled() || weight <= 0 {
        return;
    }
    // The request's own effects are done: a panic here must not turn into
    // an error reply that says it had none.
    guard((), || {
        with_tops(now_us, |t| match metric {
            TopMetric::Denied => t.denied.add(key, weight as f64, now_us),
            TopMetric::Waits => t.waits.add(key, weight as f64, now_us),
        })
    })
}

/// The `count` heaviest keys of `metric` as of `now_us`, and the memory
/// the sketches take in all.
pub fn summary(metric: TopMetric, count: usize, now_us: i64) -> (Summary, usize) {
    with_tops(now_us, |t| {
        let s = match metric {
            TopMetric::Denied => &t.denied,
            TopMetric::Waits => &t.waits,
        };
        (s.top(count, now_us), t.memory_bytes())
    })
}

/// Forgets every key (`TB.CONFIG RESETSTAT`); the memory stays allocated.
pub fn reset() {
    TOPS.with(|t| {
        if let Some(t) = t.borrow_mut().as_mut() {
            t.denied.clear();
            t.waits.clear();
        }
    })
}
