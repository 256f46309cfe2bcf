//! Shared by the bucket fuzz targets: arbitrary values mapped into the ranges
//! the commands accept, and a model of one Redis key as the glue treats it
//! (commit, expiry, deletion), with a token ledger that proves nothing is
//! ever minted.
//!
//! The ledger: every token a client holds or ever held came from a bucket's
//! creation (a missing key is a full bucket), from refill, or from a refund:
//!
//! `granted - refunded + tokens_now + forgotten <= created + refill`
//!
//! where `forgotten` counts the tokens of buckets whose key was deleted (they
//! were full), and `refill` is summed over the intervals the module settles
//! (from the stored time to each write), rounded up, so it is at least the
//! module's own rounded-down refill. With
//! constant limits this is the README's bound: over any window `T` the tokens
//! admitted never exceed `capacity + rate * T`.

use arbitrary::Arbitrary;
use tb::bucket::{Bucket, Expiry, Limits, Rate, MAX_AMOUNT, MAX_RATE_DEN, MAX_RATE_NUM, NANOS};
use tb::parse::MAX_WAIT_MS;

/// Limits chosen log-uniformly over the accepted range.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct RawLimits {
    num: u64,
    num_shift: u8,
    den: u64,
    den_shift: u8,
    capacity: u64,
    cap_shift: u8,
}

impl RawLimits {
    /// The limits, always inside what the parsers accept.
    pub fn get(self) -> Limits {
        let num = (self.num % (MAX_RATE_NUM + 1)) >> (self.num_shift % 54);
        let den = ((self.den % MAX_RATE_DEN) >> (self.den_shift % 41)) + 1;
        Limits {
            rate: Rate::new(num.into(), den.into()).expect("in bounds before reduction"),
            capacity: (self.capacity % (MAX_AMOUNT + 1)) >> (self.cap_shift % 54),
        }
    }
}

/// A token count: small, relative to a capacity, or anything accepted.
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum RawAmount {
    /// 0 to 255.
    Small(u8),
    /// Anything from 0 to 2^53, log-uniform.
    Any(u64, u8),
}

impl RawAmount {
    /// The amount, at most 2^53.
    pub fn get(self) -> u64 {
        match self {
            RawAmount::Small(v) => v.into(),
            RawAmount::Any(v, s) => (v % (MAX_AMOUNT + 1)) >> (s % 54),
        }
    }
}

/// A wait as `RESERVE ms` accepts it.
pub fn wait_ms(raw: u32) -> u64 {
    u64::from(raw) % (MAX_WAIT_MS + 1)
}

/// How the clock moves before an operation (it may step back).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub enum Step {
    /// No time passes (same cached instant).
    Same,
    /// A few microseconds.
    Micros(u16),
    /// Milliseconds.
    Millis(u16),
    /// Seconds, up to about 136 years.
    Seconds(u32),
    /// A step backwards, in ms.
    Back(u32),
    /// Anywhere.
    Jump(i64),
}

impl Step {
    /// The clock after this step from `now`.
    pub fn apply(self, now: i64) -> i64 {
        match self {
            Step::Same => now,
            Step::Micros(us) => now.saturating_add(us.into()),
            Step::Millis(ms) => now.saturating_add(i64::from(ms) * 1000),
            Step::Seconds(s) => now.saturating_add(i64::from(s) * 1_000_000),
            Step::Back(ms) => now.saturating_sub(i64::from(ms) * 1000),
            Step::Jump(t) => t,
        }
    }
}

/// A stored state as TB.SETSTATE or an RDB file could set it (any valid one).
#[derive(Arbitrary, Debug, Clone, Copy)]
pub struct RawBucket {
    tokens: i128,
    tokens_shift: u8,
    updated_us: i64,
    limits: RawLimits,
}

impl RawBucket {
    /// The bucket, or `None` if it is not a valid state (then the module
    /// refuses it too).
    pub fn get(self) -> Option<Bucket> {
        let l = self.limits.get();
        let b = Bucket {
            tokens: self.tokens >> (self.tokens_shift % 128),
            updated_us: self.updated_us,
            rate: l.rate,
            capacity: l.capacity,
        };
        b.is_valid().then_some(b)
    }
}

/// Nano-tokens refilled at `rate` over `us` microseconds, rounded up.
fn refill_ceil(rate: Rate, us: u64) -> i128 {
    let p = u128::from(us) * u128::from(rate.num()) * 1000;
    i128::try_from(p.div_ceil(u128::from(rate.den()))).unwrap_or(i128::MAX)
}

/// Refill, rounded up, over the time from `b`'s stored time to `to`.
fn pending(b: &Bucket, to: i64) -> i128 {
    if to > b.updated_us {
        refill_ceil(b.rate, to.abs_diff(b.updated_us))
    } else {
        0
    }
}

/// One key as the Redis glue handles it, and its ledger.
#[derive(Debug)]
pub struct Key {
    /// The stored bucket, `None` when the key is missing.
    pub stored: Option<Bucket>,
    /// Absolute expiry in ms, if any.
    expire_at_ms: Option<i64>,
    /// Setting `expire-idle`.
    expire_idle: bool,
    granted: i128,
    refunded: i128,
    created: i128,
    forgotten: i128,
    refill: i128,
    /// Deepest debt any reservation could have made, in nano-tokens.
    debt_bound: i128,
}

impl Key {
    /// A key holding `stored` (or missing).
    pub fn new(stored: Option<Bucket>, expire_idle: bool) -> Key {
        let mut k = Key {
            stored: None,
            expire_at_ms: None,
            expire_idle,
            granted: 0,
            refunded: 0,
            created: 0,
            forgotten: 0,
            refill: 0,
            debt_bound: 0,
        };
        if let Some(b) = stored {
            k.created = b.tokens;
            k.debt_bound = (-b.tokens).max(0);
            k.stored = Some(b);
        }
        k
    }

    /// Brings the key to time `now`: Redis deletes it once its expiry has
    /// passed, which loses nothing (the bucket is full by then).
    pub fn advance(&mut self, now: i64) {
        let (Some(b), Some(at)) = (self.stored, self.expire_at_ms) else {
            return;
        };
        if now.div_euclid(1000) > at {
            let full = self.current(now).unwrap();
            assert_eq!(full.tokens, full.cap_nanos(), "expired before full: {b:?}");
            self.credit(&b, full.updated_us);
            self.forgotten += full.tokens;
            self.stored = None;
            self.expire_at_ms = None;
        }
    }

    /// Credits the ledger with the refill the module counts when it settles
    /// `b` to `to`: from the stored time, at the stored rate (rounded up here,
    /// down in the module).
    fn credit(&mut self, b: &Bucket, to: i64) {
        self.refill = self.refill.saturating_add(pending(b, to));
    }

    /// The stored bucket settled to `now` (its level at `now` is
    /// `nanos_at(now)`).
    pub fn current(&self, now: i64) -> Option<Bucket> {
        self.stored.map(|mut b| {
            b.settle(now);
            b
        })
    }

    /// Writes `b` as `store::commit` does: delete a full bucket (when
    /// `expire-idle` is on), else store it with its expiry.
    pub fn commit(&mut self, b: Bucket, now: i64) {
        match self.stored {
            Some(old) => {
                self.credit(&old, b.updated_us);
                if old.rate != b.rate {
                    // A rate change fixes the level at `now` under the old
                    // rate. If the clock is within one exact period after
                    // (or behind) the old stored time, that level may be
                    // below what the last write left (the refill the stored
                    // time deferred is dropped, never minted), and it now
                    // refills at the new rate: a debt no reservation made.
                    self.debt_bound = self.debt_bound.max(-old.nanos_at(now));
                }
            }
            None => {
                self.created += b.cap_nanos();
                assert!(b.updated_us == now, "a new bucket starts now");
            }
        }
        if !self.expire_idle {
            self.stored = Some(b);
            self.expire_at_ms = None;
            return;
        }
        match b.expiry() {
            Expiry::Now => {
                assert_eq!(b.tokens, b.cap_nanos(), "deleted while not full");
                self.forgotten += b.tokens;
                self.stored = None;
                self.expire_at_ms = None;
            }
            Expiry::AtMs(ms) => {
                self.stored = Some(b);
                self.expire_at_ms = Some(ms);
            }
            Expiry::Never => {
                self.stored = Some(b);
                self.expire_at_ms = None;
            }
        }
    }

    /// Records `n` tokens granted.
    pub fn grant(&mut self, n: u64) {
        self.granted += i128::from(n) * NANOS;
    }

    /// Records a refund that raised the tokens by `nanos`.
    pub fn refund(&mut self, nanos: i128) {
        assert!(nanos >= 0, "a refund lowered the tokens");
        self.refunded += nanos;
    }

    /// Records a reservation at `rate` with a wait of at most `max_wait_us`:
    /// the debt it may leave is the refill over that wait.
    pub fn reserve_allowed(&mut self, rate: Rate, max_wait_us: u64) {
        self.debt_bound = self
            .debt_bound
            .max(i128::try_from(rate.refill_nanos(max_wait_us)).unwrap());
    }

    /// The invariants every stored state and the ledger satisfy at `now`.
    pub fn check(&self, now: i64) {
        let Some(b) = self.stored else {
            let lhs = self.granted - self.refunded + self.forgotten;
            assert!(
                lhs <= self.created.saturating_add(self.refill),
                "minted: {self:?}"
            );
            return;
        };
        assert!(b.is_valid(), "invalid state {b:?}");
        assert!(b.tokens <= b.cap_nanos(), "above capacity: {b:?}");
        // The stored time may be up to one exact period before the write
        // that made the state; by a period after it the level is at least
        // what it was at that write.
        let period = b.rate.exact_period_us() as i64;
        assert!(
            b.nanos_at(b.updated_us.saturating_add(period)) >= -self.debt_bound,
            "debt beyond any reservation's wait: {b:?}, bound {}",
            self.debt_bound
        );
        let now_tokens = b.nanos_at(now);
        let lhs = self.granted - self.refunded + now_tokens + self.forgotten;
        let rhs = self
            .created
            .saturating_add(self.refill)
            .saturating_add(pending(&b, now));
        assert!(lhs <= rhs, "minted {} nano-tokens: {self:?}", lhs - rhs);
    }
}
