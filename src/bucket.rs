//! Pure token-bucket arithmetic: no Redis types, no clock of its own.
//!
//! Every function takes the current time as an argument, so the whole
//! behaviour is deterministic and unit-tested with an injected clock.
//!
//! Representation (chosen for exactness, see docs/design/exactness.md):
//! - tokens are a signed fixed-point number of nano-tokens (`1e-9` token),
//!   negative only while reservations hold the bucket in debt;
//! - time is integer microseconds of the server clock;
//! - the refill rate is an exact reduced fraction `num / den` tokens per second,
//!   so `100/m` is exactly 5/3 tokens per second.
//!
//! Refill over `e` microseconds is `e * num * 1000 / den` nano-tokens, a whole
//! number exactly when `e` is a multiple of the rate's exact period
//! ([`Rate::exact_period_us`]). A stored state `(tokens, updated_us)` is always
//! exact: writes settle refill only up to the latest instant at which it is
//! whole, and leave the rest of the elapsed time for later. So no write ever
//! loses a fraction, and the level at any time `t` is exactly
//! `min(capacity, tokens + (t - updated_us) * rate)`; decisions compare its
//! floor in nano-tokens with whole amounts, which is the same as comparing
//! the exact value. The one rounding left: a change of rate fixes the level
//! at the instant of the change, dropping less than one nano-token.

/// Nano-tokens in one token.
pub const NANOS: i128 = 1_000_000_000;
/// Largest capacity and largest `n` accepted: 2^53.
pub const MAX_AMOUNT: u64 = 1 << 53;
/// Largest numerator of a reduced rate.
pub const MAX_RATE_NUM: u64 = 1 << 53;
/// Latest absolute expiry set on a key, in ms; later means no expiry.
pub const MAX_EXPIRE_MS: i64 = 1 << 53;
/// Largest denominator of a reduced rate (finest rate: about 1e-12 token/s).
pub const MAX_RATE_DEN: u64 = 1 << 40;
/// Deepest debt a valid state may hold, in nano-tokens (exclusive): far
/// beyond what any reservation can make (2^53 tokens a request, waits of at
/// most a day at 9e15 tokens/s), and small enough that no sum overflows.
pub const MAX_DEBT_NANOS: i128 = 1 << 100;

/// Refill rate of exactly `num / den` tokens per second, kept reduced so that
/// equal rates compare equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    num: u64,
    den: u64,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `floor(a * b / c)`, saturating at `u128::MAX`. Exact whenever `b * c` fits in
/// a `u128`, which every caller guarantees through the rate bounds.
fn mul_div_floor(a: u128, b: u128, c: u128) -> u128 {
    match a.checked_mul(b) {
        Some(p) => p / c,
        None => (a / c).saturating_mul(b).saturating_add((a % c) * b / c),
    }
}

/// `ceil(a * b / c)`, saturating; same preconditions as [`mul_div_floor`].
fn mul_div_ceil(a: u128, b: u128, c: u128) -> u128 {
    match a.checked_mul(b) {
        Some(p) => p.div_ceil(c),
        None => (a / c)
            .saturating_mul(b)
            .saturating_add(((a % c) * b).div_ceil(c)),
    }
}

/// Microseconds to whole milliseconds, rounded up (never optimistic).
pub fn ceil_ms(us: u64) -> i64 {
    us.div_ceil(1000).min(i64::MAX as u64) as i64
}

impl Rate {
    /// No refill: a fixed budget.
    pub const ZERO: Rate = Rate { num: 0, den: 1 };

    /// The rate `num / den` tokens per second, reduced; `None` when `den` is 0
    /// or the reduced fraction is outside the supported bounds.
    pub fn new(num: u128, den: u128) -> Option<Rate> {
        if den == 0 {
            return None;
        }
        if num == 0 {
            return Some(Rate::ZERO);
        }
        let g = gcd(num, den);
        let (num, den) = (num / g, den / g);
        if num > MAX_RATE_NUM as u128 || den > MAX_RATE_DEN as u128 {
            return None;
        }
        Some(Rate {
            num: num as u64,
            den: den as u64,
        })
    }

    /// The rate `num / den` as it is, for a fraction known to be reduced and
    /// in bounds (read back from this module's own packed form): no check,
    /// no gcd on the hot path.
    pub(crate) fn from_reduced(num: u64, den: u64) -> Rate {
        Rate { num, den }
    }

    /// Numerator of the reduced fraction.
    pub fn num(self) -> u64 {
        self.num
    }

    /// Denominator of the reduced fraction (never 0).
    pub fn den(self) -> u64 {
        self.den
    }

    /// True for a fixed budget that never refills.
    pub fn is_zero(self) -> bool {
        self.num == 0
    }

    /// The shortest time, in microseconds, over which refill is a whole
    /// number of nano-tokens: refill over `e` µs (`e * num * 1000 / den`) is
    /// whole exactly when `e` is a multiple of `den / gcd(num * 1000, den)`.
    /// At most `den` (2^40 µs, about 12.7 days); 1 for rate 0 and for every
    /// rate whose denominator divides `num * 1000` (`10`, `0.5`, `1e-3`).
    pub fn exact_period_us(self) -> u64 {
        // gcd(x mod den, den) = gcd(x, den), and gcd(0, den) = den; every
        // step fits a u64 (den <= 2^40).
        let (mut a, mut b) = (self.den, self.num % self.den * 1000 % self.den);
        while b != 0 {
            (a, b) = (b, a % b);
        }
        self.den / a
    }

    /// Nano-tokens refilled over `us` microseconds, rounded down (exact
    /// when `us` is a multiple of [`Rate::exact_period_us`]).
    /// `us < 2^64` and `num * 1000 < 2^63` so the product cannot overflow.
    pub fn refill_nanos(self, us: u64) -> u128 {
        mul_div_floor(us as u128, self.num as u128 * 1000, self.den as u128)
    }

    /// Microseconds until `nanos` nano-tokens have refilled, rounded up;
    /// `None` when the rate is zero.
    pub fn micros_for(self, nanos: u128) -> Option<u128> {
        if self.is_zero() {
            return None;
        }
        Some(mul_div_ceil(
            nanos,
            self.den as u128,
            self.num as u128 * 1000,
        ))
    }

    /// The rate as a decimal string: exact when the fraction terminates within
    /// 12 decimal places, otherwise rounded to 12 places.
    pub fn to_decimal(self) -> String {
        let whole = self.num / self.den;
        let mut rem = (self.num % self.den) as u128;
        if rem == 0 {
            return whole.to_string();
        }
        let mut s = format!("{whole}.");
        let den = self.den as u128;
        let mut digits = Vec::with_capacity(12);
        for _ in 0..12 {
            rem *= 10;
            digits.push((rem / den) as u8);
            rem %= den;
            if rem == 0 {
                break;
            }
        }
        if rem * 2 >= den {
            // Round half up, carrying through the digits.
            let mut i = digits.len();
            loop {
                if i == 0 {
                    return format!("{}", whole + 1);
                }
                i -= 1;
                if digits[i] == 9 {
                    digits[i] = 0;
                } else {
                    digits[i] += 1;
                    break;
                }
            }
        }
        while digits.last() == Some(&0) {
            digits.pop();
        }
        if digits.is_empty() {
            return whole.to_string();
        }
        s.extend(digits.iter().map(|d| char::from(b'0' + d)));
        s
    }
}

/// The limits a caller passes with every request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Refill rate.
    pub rate: Rate,
    /// Burst size, and the level a new bucket starts at (at most [`MAX_AMOUNT`]).
    pub capacity: u64,
}

/// One bucket's whole state: what is stored under a key and replicated.
///
/// `tokens` is the bucket's exact level at `updated_us`; at any later time
/// `t` the level is exactly `min(capacity, tokens + (t - updated_us) *
/// rate)`, and before `updated_us` (a clock stepped back) it is `tokens`.
/// `updated_us` is the last write's time, or up to one exact period
/// ([`Rate::exact_period_us`]) before it.
///
/// Invariants: `tokens <= capacity * NANOS`; `tokens < 0` only as reservation
/// debt (deeper than [`MAX_DEBT_NANOS`] is invalid); `updated_us` never
/// decreases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Tokens at `updated_us`, in nano-tokens (exact).
    pub tokens: i128,
    /// Server time, in microseconds, at which `tokens` is the exact level.
    pub updated_us: i64,
    /// Refill rate.
    pub rate: Rate,
    /// Burst size.
    pub capacity: u64,
}

/// Expiry of a bucket's key: it may expire once the bucket is full again,
/// because a missing key reads as a full bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// The bucket is full now: the key can be deleted.
    Now,
    /// Full at this absolute server time in milliseconds (rounded up).
    AtMs(i64),
    /// Never full again by itself (rate 0 and not full).
    Never,
}

impl Bucket {
    /// A full bucket created at `now_us`: what a missing key means.
    pub fn full(limits: Limits, now_us: i64) -> Bucket {
        Bucket {
            tokens: limits.capacity as i128 * NANOS,
            updated_us: now_us,
            rate: limits.rate,
            capacity: limits.capacity,
        }
    }

    /// The limits this bucket holds.
    pub fn limits(&self) -> Limits {
        Limits {
            rate: self.rate,
            capacity: self.capacity,
        }
    }

    /// Capacity in nano-tokens.
    pub fn cap_nanos(&self) -> i128 {
        self.capacity as i128 * NANOS
    }

    /// True when the stored fields satisfy the invariants (used to reject
    /// corrupt persisted or replicated state).
    pub fn is_valid(&self) -> bool {
        self.capacity <= MAX_AMOUNT
            && self.tokens <= self.cap_nanos()
            && self.tokens > -MAX_DEBT_NANOS
            && self.rate.den != 0
            && self.rate.num <= MAX_RATE_NUM
            && self.rate.den <= MAX_RATE_DEN
            && Rate::new(self.rate.num as u128, self.rate.den as u128) == Some(self.rate)
    }

    /// The level at `now_us` in nano-tokens, rounded down: the exact level
    /// is at least this and less than one nano-token more. Comparing it with
    /// a whole number of nano-tokens is comparing the exact level.
    pub fn nanos_at(&self, now_us: i64) -> i128 {
        let cap = self.cap_nanos();
        if now_us <= self.updated_us || self.tokens >= cap {
            return self.tokens;
        }
        let add = self.rate.refill_nanos(now_us.abs_diff(self.updated_us));
        if add >= (cap - self.tokens) as u128 {
            cap
        } else {
            self.tokens + add as i128
        }
    }

    /// Counts refill up to `now_us` into the stored state without losing
    /// anything: a bucket full by then becomes `(capacity, now_us)`; otherwise
    /// the stored time advances to the latest instant at or before `now_us`
    /// at which the refill since the stored time is a whole number of
    /// nano-tokens, and the tokens by exactly that refill. Elapsed time below
    /// zero counts as zero: `updated_us` never moves backwards.
    pub fn settle(&mut self, now_us: i64) {
        if now_us <= self.updated_us {
            return;
        }
        let elapsed = now_us.abs_diff(self.updated_us);
        let cap = self.cap_nanos();
        // elapsed * num * 1000 < 2^127: no overflow.
        let product = u128::from(elapsed) * u128::from(self.rate.num) * 1000;
        let den = u128::from(self.rate.den);
        let add = product / den;
        if add >= (cap - self.tokens) as u128 {
            self.tokens = cap;
            self.updated_us = now_us;
            return;
        }
        if product % den == 0 {
            // Whole already (always so when den divides num * 1000).
            self.tokens += add as i128;
            self.updated_us = now_us;
            return;
        }
        let rest = elapsed % self.rate.exact_period_us();
        // Exact: `elapsed - rest` is a multiple of the exact period.
        self.tokens += self.rate.refill_nanos(elapsed - rest) as i128;
        // `rest < elapsed`, so this stays between the old time and now.
        self.updated_us = now_us - rest as i64;
    }

    /// Switches to `limits` at `now_us` (call [`Bucket::settle`] first).
    /// A new rate applies from `now_us` on: the level is fixed at `now_us`
    /// first (rounded down to a nano-token, the one rounding of the whole
    /// arithmetic). Tokens are clamped to the new capacity: changing a limit
    /// never mints tokens. Returns whether anything changed.
    pub fn reconfigure(&mut self, limits: Limits, now_us: i64) -> bool {
        if self.limits() == limits {
            return false;
        }
        if self.rate != limits.rate {
            self.tokens = self.nanos_at(now_us);
            self.updated_us = self.updated_us.max(now_us);
        }
        self.rate = limits.rate;
        self.capacity = limits.capacity;
        self.clamp_full(now_us);
        true
    }

    /// Makes a bucket that is full at `now_us` exactly `(capacity, now_us)`
    /// (its stored time not moving backwards).
    fn clamp_full(&mut self, now_us: i64) {
        let cap = self.cap_nanos();
        if self.nanos_at(now_us) >= cap {
            self.tokens = cap;
            self.updated_us = self.updated_us.max(now_us);
        }
    }

    /// Takes `nanos` from the level at every instant from `updated_us` on.
    /// Exact after [`Bucket::settle`]: a bucket settled to `now_us` either
    /// has `updated_us >= now_us`, or is below capacity all the way from
    /// `updated_us` to `now_us`, so the level then is the level at `now_us`
    /// minus `nanos` and no capacity clamp is skipped.
    fn take(&mut self, nanos: i128) {
        self.tokens -= nanos;
    }

    /// Microseconds from `now_us` until the bucket holds `level` nano-tokens:
    /// 0 if it already does, `None` if it never will (rate 0, or `level`
    /// above capacity). Exact, rounded up; if the clock stepped back behind
    /// `updated_us`, refill resumes only once it passes `updated_us` again,
    /// and that time counts too.
    pub fn micros_until(&self, level: i128, now_us: i64) -> Option<u64> {
        if level > self.cap_nanos() {
            return None;
        }
        if self.nanos_at(now_us) >= level {
            return Some(0);
        }
        // The level at t >= updated_us is tokens + (t - updated_us) * rate.
        let from_updated = self.rate.micros_for((level - self.tokens) as u128)?;
        let wait =
            from_updated.min(u64::MAX as u128) as i128 + self.updated_us as i128 - now_us as i128;
        Some(wait.clamp(0, u64::MAX as i128) as u64)
    }

    /// Whole tokens available at `now_us` (0 while in debt).
    pub fn whole_tokens(&self, now_us: i64) -> u64 {
        let t = self.nanos_at(now_us);
        if t <= 0 {
            0
        } else {
            (t / NANOS) as u64
        }
    }

    /// Milliseconds from `now_us` until full, rounded up; -1 for never.
    pub fn reset_after_ms(&self, now_us: i64) -> i64 {
        self.micros_until(self.cap_nanos(), now_us)
            .map_or(-1, ceil_ms)
    }

    /// When the key holding this bucket may expire.
    pub fn expiry(&self) -> Expiry {
        let cap = self.cap_nanos();
        if self.tokens >= cap {
            return Expiry::Now;
        }
        let Some(us) = self.rate.micros_for((cap - self.tokens) as u128) else {
            return Expiry::Never;
        };
        let at_ms = (self.updated_us as i128 + us.min(i128::MAX as u128 / 2) as i128 + 999)
            .div_euclid(1000);
        // Beyond any date worth setting (about 285,000 years): never expires.
        if at_ms > MAX_EXPIRE_MS as i128 {
            Expiry::Never
        } else {
            Expiry::AtMs(at_ms as i64)
        }
    }

    /// Tokens at `now_us` as a decimal string, rounded down to a nano-token
    /// ("2.5", "-0.000000001", "7").
    pub fn tokens_decimal(&self, now_us: i64) -> String {
        let tokens = self.nanos_at(now_us);
        let sign = if tokens < 0 { "-" } else { "" };
        let abs = tokens.unsigned_abs();
        let (whole, frac) = (abs / NANOS as u128, abs % NANOS as u128);
        if frac == 0 {
            return format!("{sign}{whole}");
        }
        let frac = format!("{frac:09}");
        format!("{sign}{whole}.{}", frac.trim_end_matches('0'))
    }
}

/// How a consume request treats a shortfall.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// All `n` tokens or nothing.
    All,
    /// Grant `min(n, whole tokens available)` when that is at least
    /// `min(min, n)` (`ATMOST MIN chunk`; plain `ATMOST` is `min = 1`);
    /// a denial waits for `min(min, n)` tokens.
    AtMost {
        /// The smallest grant worth having, at least 1.
        min: u64,
    },
    /// Take all `n` now, into debt, if they will have refilled within
    /// `max_wait_us`; the caller waits `retry_after_ms` before proceeding.
    Reserve {
        /// Longest wait the caller accepts, in microseconds.
        max_wait_us: u64,
    },
}

/// What kind of answer a consume gave (for statistics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Tokens were granted with no wait.
    Allowed,
    /// Tokens were granted into debt: the caller must wait.
    Reserved,
    /// Denied: would succeed later.
    Denied,
    /// Denied: can never succeed (n > capacity, or rate 0 and too few tokens).
    Never,
    /// `n = 0`: a look that changes nothing.
    Peek,
}

/// The result of [`consume`]: the reply fields and the state to store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// What happened.
    pub kind: Kind,
    /// Tokens taken: `n` when allowed (or fewer with [`Mode::AtMost`]), else 0.
    pub granted: u64,
    /// Whole tokens left after the call, never negative.
    pub remaining: u64,
    /// 0 when allowed now; the wait in ms (rounded up) when denied or
    /// reserved; -1 when the request can never succeed. For a peek, the
    /// wait for one token.
    pub retry_after_ms: i64,
    /// The same wait in microseconds, exact (rounded up to a microsecond):
    /// when the wait queue tries a denied call again.
    pub wait_us: i64,
    /// Milliseconds until the bucket is full again, rounded up; -1 for never.
    pub reset_after_ms: i64,
    /// The bucket after the call, settled up to now (see [`Bucket::settle`]).
    pub bucket: Bucket,
    /// True when `bucket` must be written: tokens were taken or the limits
    /// changed. Denials with unchanged limits and peeks write nothing.
    pub dirty: bool,
}

impl Outcome {
    /// True when tokens were granted (possibly with a wait), or, for a
    /// peek, when a request for one token would be served now.
    pub fn allowed(&self) -> bool {
        match self.kind {
            Kind::Allowed | Kind::Reserved => true,
            Kind::Peek => self.retry_after_ms == 0,
            Kind::Denied | Kind::Never => false,
        }
    }
}

/// The stored bucket brought to `now_us` with the caller's limits: settled,
/// then switched to `limits` if they differ. Returns it and whether the
/// limits changed (a change must be written).
fn current(stored: Option<&Bucket>, limits: Limits, now_us: i64) -> (Bucket, bool) {
    match stored {
        Some(s) => {
            let mut b = *s;
            b.settle(now_us);
            let changed = b.reconfigure(limits, now_us);
            (b, changed)
        }
        None => (Bucket::full(limits, now_us), false),
    }
}

/// Applies one request for `n` tokens at time `now_us` to the bucket stored
/// under a key (`None` for a missing key, which is a full bucket).
///
/// If the stored limits differ from `limits`, refill is first settled up to
/// now at the stored rate, then the limits switch; that change is written even
/// when the request is denied, so that the old rate never applies to time after
/// the change.
///
/// `n = 0` is a peek: it answers whether a request for one token would be
/// served now (and the wait for one), and never writes.
pub fn consume(
    stored: Option<&Bucket>,
    limits: Limits,
    n: u64,
    mode: Mode,
    now_us: i64,
) -> Outcome {
    let (mut b, mut dirty) = current(stored, limits, now_us);
    let have = b.nanos_at(now_us);
    let want = n as i128 * NANOS;
    let (kind, granted, wait) = if n == 0 {
        dirty = false;
        (Kind::Peek, 0, b.micros_until(NANOS, now_us))
    } else if n > b.capacity && !matches!(mode, Mode::AtMost { .. }) {
        (Kind::Never, 0, None)
    } else if have >= want {
        b.take(want);
        dirty = true;
        (Kind::Allowed, n, Some(0))
    } else if matches!(mode, Mode::AtMost { .. }) && have >= least(mode, n) {
        // Partial grant: everything whole that is there (less than n, at
        // least min(min, n)).
        let avail = (have / NANOS) as u64;
        b.take(avail as i128 * NANOS);
        dirty = true;
        (Kind::Allowed, avail, Some(0))
    } else {
        // ATMOST waits for its smallest grant; the others for all n.
        let target = least(mode, n);
        match (mode, b.micros_until(target, now_us)) {
            (_, None) => (Kind::Never, 0, None),
            (Mode::Reserve { max_wait_us }, Some(us)) if us <= max_wait_us => {
                b.take(want);
                dirty = true;
                (Kind::Reserved, n, Some(us))
            }
            (_, Some(us)) => (Kind::Denied, 0, Some(us)),
        }
    };
    let (retry_after_ms, wait_us) = waits(wait);
    Outcome {
        kind,
        granted,
        remaining: b.whole_tokens(now_us),
        retry_after_ms,
        wait_us,
        reset_after_ms: b.reset_after_ms(now_us),
        bucket: b,
        dirty,
    }
}

/// A wait in µs (`None`: never) as the replies give it and as the wait
/// queue uses it: `(retry_after_ms, wait_us)`, the first rounded up to a
/// whole ms, both -1 for never. (Beyond `i64::MAX` µs, some 292,000 years,
/// `wait_us` saturates while the ms stay exact.)
pub fn waits(wait: Option<u64>) -> (i64, i64) {
    wait.map_or((-1, -1), |us| (ceil_ms(us), us.min(i64::MAX as u64) as i64))
}

/// The level (nano-tokens) a request for `n` needs before anything is
/// granted: `min(min, n)` tokens with [`Mode::AtMost`], else all `n`.
fn least(mode: Mode, n: u64) -> i128 {
    let tokens = match mode {
        Mode::AtMost { min } => min.clamp(1, n.max(1)),
        _ => n,
    };
    tokens as i128 * NANOS
}

/// One bucket's part in a [`consume_all`] request.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    /// The stored bucket (`None` for a missing key).
    pub stored: Option<Bucket>,
    /// The limits the caller passes for it.
    pub limits: Limits,
    /// Tokens to take from it; 0 makes this part a peek (it needs one whole
    /// token, and takes none).
    pub n: u64,
}

/// The result of [`consume_all`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiOutcome {
    /// What happened: [`Kind::Allowed`] (every share now),
    /// [`Kind::Reserved`] (into debt, with a wait), [`Kind::Denied`] (would
    /// succeed later) or [`Kind::Never`]. A multi-bucket call is never a
    /// [`Kind::Peek`], even when every part is one.
    pub kind: Kind,
    /// Whether every bucket gave its share (now or, with a reservation, later).
    pub allowed: bool,
    /// 0 when allowed now; otherwise the wait in ms until all would succeed
    /// (rounded up); -1 when any part can never succeed.
    pub retry_after_ms: i64,
    /// The same wait in microseconds, exact (rounded up to a microsecond).
    pub wait_us: i64,
    /// With [`Mode::AtMost`]: the grant `g` each quantity part gave (0 when
    /// denied). Otherwise the largest `n` when allowed, else 0.
    pub granted: u64,
    /// Tokens taken from each bucket (0 for all of them when denied).
    pub taken: Vec<u64>,
    /// Whole tokens each bucket needed for the request to succeed: its `n`
    /// (1 for a peek), or `min(chunk, N)` for a part sharing an `ATMOST`
    /// grant.
    pub need: Vec<u64>,
    /// Each bucket after the call, settled up to now.
    pub buckets: Vec<Bucket>,
    /// Whole tokens left in each bucket after the call, never negative.
    pub remaining: Vec<u64>,
    /// Which buckets must be written (tokens taken or limits changed).
    pub dirty: Vec<bool>,
}

/// All-or-nothing consume across several buckets: either every bucket gives
/// its share, or no bucket's tokens change. A part with `n = 0` is a peek on
/// its bucket, as in [`consume`]: it needs one whole token there and takes
/// none.
///
/// - [`Mode::All`]: every bucket gives its `n` now.
/// - [`Mode::Reserve`]: every bucket goes into debt for its `n` and the
///   caller waits for the slowest one.
/// - [`Mode::AtMost`] (`ATMOST [MIN chunk]`): the request is `N`, the largest
///   `n`. The parts whose `n` is `N` are its *quantity* parts (a per-user and
///   a global byte cap): each gives the same grant
///   `g = min(N, whole tokens of each)`, granted only if `g >= min(chunk, N)`.
///   Parts with a smaller `n` (a request counter with `n = 1`) give all of it,
///   and peeks need one token, as without ATMOST. A denial waits until every
///   quantity part has `min(chunk, N)` and every other part its `n`.
pub fn consume_all(parts: &[Part], mode: Mode, now_us: i64) -> MultiOutcome {
    let big = parts.iter().map(|p| p.n).max().unwrap_or(0);
    let mut buckets = Vec::with_capacity(parts.len());
    let mut dirty = Vec::with_capacity(parts.len());
    let mut need = Vec::with_capacity(parts.len());
    let mut wait: Option<u64> = Some(0);
    // The grant every quantity part can give now (ATMOST only).
    let mut share = big;
    for p in parts {
        let (b, changed) = current(p.stored.as_ref(), p.limits, now_us);
        let quantity = matches!(mode, Mode::AtMost { .. }) && p.n == big && big > 0;
        let level = if quantity {
            share = share.min(b.whole_tokens(now_us));
            least(mode, p.n)
        } else {
            p.n.max(1) as i128 * NANOS
        };
        need.push((level / NANOS) as u64);
        let this = if !quantity && p.n > b.capacity {
            None
        } else {
            b.micros_until(level, now_us)
        };
        wait = match (wait, this) {
            (Some(a), Some(b)) => Some(a.max(b)),
            _ => None,
        };
        buckets.push(b);
        dirty.push(changed);
    }
    let kind = match (wait, mode) {
        (None, _) => Kind::Never,
        (Some(0), _) => Kind::Allowed,
        (Some(w), Mode::Reserve { max_wait_us }) if w <= max_wait_us => Kind::Reserved,
        (Some(_), _) => Kind::Denied,
    };
    let (retry_after_ms, wait_us) = waits(wait);
    let allowed = matches!(kind, Kind::Allowed | Kind::Reserved);
    let granted = match (allowed, mode) {
        (false, _) => 0,
        (true, Mode::AtMost { .. }) => share,
        (true, _) => big,
    };
    let taken: Vec<u64> = parts
        .iter()
        .map(|p| match (allowed, mode) {
            (false, _) => 0,
            (true, Mode::AtMost { .. }) if p.n == big => granted,
            (true, _) => p.n,
        })
        .collect();
    for ((b, d), &t) in buckets.iter_mut().zip(dirty.iter_mut()).zip(&taken) {
        if t > 0 {
            b.take(t as i128 * NANOS);
            *d = true;
        }
    }
    let remaining = buckets.iter().map(|b| b.whole_tokens(now_us)).collect();
    MultiOutcome {
        kind,
        allowed,
        retry_after_ms,
        wait_us,
        granted,
        taken,
        need,
        buckets,
        remaining,
        dirty,
    }
}

/// Gives back `n` tokens, never above capacity. A missing key is a full bucket
/// already, so it stays missing (`None`).
pub fn refund(stored: Option<&Bucket>, n: u64, now_us: i64) -> Option<Bucket> {
    let mut b = *stored?;
    b.settle(now_us);
    b.take(-(n as i128 * NANOS));
    b.clamp_full(now_us);
    Some(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SEC: i64 = 1_000_000;
    const T0: i64 = 1_700_000_000 * SEC;

    fn lim(num: u128, den: u128, cap: u64) -> Limits {
        Limits {
            rate: Rate::new(num, den).unwrap(),
            capacity: cap,
        }
    }

    fn empty(l: Limits, now: i64) -> Bucket {
        Bucket {
            tokens: 0,
            ..Bucket::full(l, now)
        }
    }

    #[test]
    fn rate_reduces_and_bounds() {
        assert_eq!(Rate::new(100, 60), Rate::new(5, 3));
        assert_eq!(Rate::new(0, 7), Some(Rate::ZERO));
        assert_eq!(Rate::new(1, 0), None);
        assert!(Rate::new(MAX_RATE_NUM as u128 + 1, 1).is_none());
        assert!(Rate::new(1, MAX_RATE_DEN as u128 + 1).is_none());
        assert!(Rate::new(2, 2 * MAX_RATE_DEN as u128).is_some());
    }

    #[test]
    fn exact_periods() {
        let period = |num, den| Rate::new(num, den).unwrap().exact_period_us();
        assert_eq!(period(10, 1), 1);
        assert_eq!(period(1, 1000), 1, "1e-3/s: a nano-token a microsecond");
        assert_eq!(period(5, 3), 3, "100/m: 5000/3 nano-tokens a microsecond");
        assert_eq!(period(1, 3600), 18, "1/h");
        assert_eq!(period(7, 86_400), 432, "7/d");
        assert_eq!(
            period(1, 1_000_000_000_000),
            1_000_000_000,
            "1e-12/s: 1000 s"
        );
        assert_eq!(period(1, MAX_RATE_DEN as u128), 1 << 37);
        assert_eq!(Rate::ZERO.exact_period_us(), 1);
        // The refill over one period is whole, over less it is not.
        for (num, den) in [(5u128, 3u128), (7, 86_400), (123_456_789, 1_000_000)] {
            let r = Rate::new(num, den).unwrap();
            let p = r.exact_period_us() as u128;
            assert_eq!(p * num * 1000 % den, 0);
            assert!((1..p).all(|e| e * num * 1000 % den != 0));
        }
    }

    #[test]
    fn rate_decimal_rendering() {
        assert_eq!(Rate::new(10, 1).unwrap().to_decimal(), "10");
        assert_eq!(Rate::new(1, 2).unwrap().to_decimal(), "0.5");
        assert_eq!(Rate::new(1, 1000).unwrap().to_decimal(), "0.001");
        assert_eq!(Rate::new(5, 3).unwrap().to_decimal(), "1.666666666667");
        assert_eq!(Rate::new(1, 3).unwrap().to_decimal(), "0.333333333333");
        assert_eq!(Rate::ZERO.to_decimal(), "0");
        assert_eq!(Rate::new(2, 3).unwrap().to_decimal(), "0.666666666667");
    }

    #[test]
    fn tokens_decimal_is_exact() {
        let mut b = Bucket::full(lim(1, 1, 10), T0);
        assert_eq!(b.tokens_decimal(T0), "10");
        b.tokens = 2_500_000_000;
        assert_eq!(b.tokens_decimal(T0), "2.5");
        b.tokens = -1;
        assert_eq!(b.tokens_decimal(T0), "-0.000000001");
        b.tokens = 0;
        assert_eq!(b.tokens_decimal(T0), "0");
        // 1/3 token/s for 1 ms: 333333.33... nano-tokens, shown rounded down.
        let b = empty(lim(1, 3, 10), T0);
        assert_eq!(b.tokens_decimal(T0 + 1000), "0.000333333");
    }

    /// An empty bucket at rate r has n tokens after exactly n/r seconds, across
    /// the whole supported range of rates.
    #[test]
    fn refill_is_exact_across_rates() {
        // (num, den, n): n/r is a whole number of microseconds in each case.
        let cases: &[(u128, u128, u64)] = &[
            (1, 1000, 1),                                  // 0.001/s: 1000 s
            (1, 1000, 7),                                  // 7000 s
            (5, 3, 100),                                   // 100/m: 60 s
            (1, 86_400, 30),                               // 1/d: 30 days
            (10, 1, 1),                                    // 100 ms
            (1_000_000_000_000, 1, 9_000_000_000_000_000), // 1e12/s of bytes: 9000 s
            (25, 10_000_000_000, 5),                       // 2.5e-9/s: 2e9 s (63 years)
        ];
        for &(num, den, n) in cases {
            let l = lim(num, den, n);
            let us = (n as u128 * den * 1_000_000) / num;
            assert_eq!((n as u128 * den * 1_000_000) % num, 0, "case is exact");
            let b = empty(l, T0);
            let at = T0 + us as i64;
            assert!(
                b.nanos_at(at - 1) < n as i128 * NANOS,
                "not before n/r: {num}/{den}"
            );
            assert_eq!(
                b.nanos_at(at),
                n as i128 * NANOS,
                "exactly at n/r: {num}/{den}"
            );
            assert_eq!(b.micros_until(n as i128 * NANOS, T0), Some(us as u64));
            let mut settled = b;
            settled.settle(at);
            assert_eq!(
                (settled.tokens, settled.updated_us),
                (n as i128 * NANOS, at)
            );
        }
    }

    #[test]
    fn missing_key_is_full_and_consume_counts_down() {
        let l = lim(10, 1, 5);
        let o = consume(None, l, 1, Mode::All, T0);
        assert_eq!(o.kind, Kind::Allowed);
        assert_eq!((o.granted, o.remaining, o.retry_after_ms), (1, 4, 0));
        assert_eq!(o.reset_after_ms, 100);
        assert!(o.dirty);
        let o = consume(Some(&o.bucket), l, 4, Mode::All, T0);
        assert_eq!((o.granted, o.remaining), (4, 0));
        let o = consume(Some(&o.bucket), l, 1, Mode::All, T0);
        assert_eq!(o.kind, Kind::Denied);
        assert_eq!((o.granted, o.remaining, o.retry_after_ms), (0, 0, 100));
        assert!(!o.dirty, "a denial writes nothing");
    }

    #[test]
    fn retry_after_is_never_optimistic_and_sufficient() {
        // 3 tokens/s: one token takes 333333.33 us, so 334 ms is the honest answer.
        let l = lim(3, 1, 3);
        let b = empty(l, T0);
        let o = consume(Some(&b), l, 1, Mode::All, T0);
        assert_eq!(o.retry_after_ms, 334);
        let early = consume(Some(&b), l, 1, Mode::All, T0 + 333_333);
        assert_eq!(early.kind, Kind::Denied);
        let on_time = consume(Some(&b), l, 1, Mode::All, T0 + 334_000);
        assert_eq!(on_time.kind, Kind::Allowed);
    }

    #[test]
    fn never_cases() {
        let l = lim(1, 1, 5);
        let o = consume(None, l, 6, Mode::All, T0);
        assert_eq!((o.kind, o.retry_after_ms, o.granted), (Kind::Never, -1, 0));
        let fixed = lim(0, 1, 2);
        let o = consume(None, fixed, 2, Mode::All, T0);
        assert_eq!(o.kind, Kind::Allowed);
        assert_eq!(o.reset_after_ms, -1, "rate 0 never refills");
        assert_eq!(o.bucket.expiry(), Expiry::Never);
        let o = consume(Some(&o.bucket), fixed, 1, Mode::All, T0 + 1000 * SEC);
        assert_eq!((o.kind, o.retry_after_ms), (Kind::Never, -1));
        let zero_cap = lim(1, 1, 0);
        let o = consume(None, zero_cap, 1, Mode::All, T0);
        assert_eq!((o.kind, o.remaining, o.reset_after_ms), (Kind::Never, 0, 0));
        let o = consume(None, zero_cap, 0, Mode::All, T0);
        assert_eq!((o.kind, o.retry_after_ms), (Kind::Peek, -1));
    }

    #[test]
    fn peek_never_writes() {
        let l = lim(1, 1, 5);
        let b = empty(l, T0);
        let o = consume(Some(&b), lim(2, 1, 9), 0, Mode::All, T0 + SEC);
        assert_eq!(o.kind, Kind::Peek);
        assert!(!o.dirty);
        assert!(
            o.allowed(),
            "a peek is allowed when a request would be served"
        );
        assert_eq!(o.remaining, 1, "settled at the old rate");
    }

    #[test]
    fn limit_change_settles_first_and_never_mints() {
        let old = lim(10, 1, 100);
        let b = empty(old, T0);
        // One second at the old rate (10 tokens), then switch to 1/s, cap 5.
        let o = consume(Some(&b), lim(1, 1, 5), 1, Mode::All, T0 + SEC);
        assert_eq!(
            o.bucket.tokens,
            4 * NANOS,
            "10 refilled, clamped to 5, 1 taken"
        );
        // A denied request with changed limits records the change.
        let b = empty(old, T0);
        let o = consume(Some(&b), lim(1, 1000, 50), 20, Mode::All, T0 + SEC);
        assert_eq!(o.kind, Kind::Denied);
        assert!(
            o.dirty,
            "the switch is written so the old rate stops applying"
        );
        assert_eq!(o.bucket.tokens, 10 * NANOS);
        assert_eq!(o.bucket.updated_us, T0 + SEC);
    }

    #[test]
    fn clock_going_backwards_counts_as_zero() {
        let l = lim(1, 1, 10);
        let mut b = empty(l, T0);
        b.settle(T0 - 5 * SEC);
        assert_eq!((b.tokens, b.updated_us), (0, T0));
        assert_eq!(b.nanos_at(T0 - 5 * SEC), 0);
        // A write during the step keeps the stored time.
        let o = consume(
            Some(&b),
            l,
            1,
            Mode::Reserve {
                max_wait_us: 10 * SEC as u64,
            },
            T0 - SEC,
        );
        assert_eq!(o.kind, Kind::Reserved);
        assert_eq!((o.bucket.tokens, o.bucket.updated_us), (-NANOS, T0));
        let r = refund(Some(&o.bucket), 20, T0 - SEC).unwrap();
        assert_eq!((r.tokens, r.updated_us), (10 * NANOS, T0));
    }

    #[test]
    fn idle_for_years_is_bounded() {
        let l = lim(1_000_000_000_000, 1, MAX_AMOUNT);
        let mut b = empty(l, T0);
        b.settle(T0 + 50 * 365 * 86_400 * SEC);
        assert_eq!(b.tokens, b.cap_nanos());
        let slow = lim(1, 1000, MAX_AMOUNT);
        let mut b = empty(slow, i64::MIN / 2);
        b.settle(i64::MAX / 2);
        // 0.001 token/s is one nano-token per microsecond.
        assert_eq!(b.tokens, (i64::MAX / 2) as i128 - (i64::MIN / 2) as i128);
        assert_eq!(b.expiry(), Expiry::Never, "9e18 s to full: beyond any date");
        let mut b = empty(lim(1, MAX_RATE_DEN as u128, MAX_AMOUNT), T0);
        assert_eq!(
            b.expiry(),
            Expiry::Never,
            "2^53 tokens at 2^-40/s: beyond any date"
        );
        b.settle(T0 + 100 * 365 * 86_400 * SEC);
        assert!(b.tokens > 0);
        assert!(T0 + 100 * 365 * 86_400 * SEC - b.updated_us < (1 << 37));
    }

    #[test]
    fn expiry_is_when_full() {
        let l = lim(10, 1, 5);
        let o = consume(None, l, 1, Mode::All, T0 + 1);
        // 1 token at 10/s = 100 ms; T0+1us+100ms rounds up to the next ms.
        assert_eq!(o.bucket.expiry(), Expiry::AtMs(T0 / 1000 + 101));
        assert_eq!(Bucket::full(l, T0).expiry(), Expiry::Now);
    }

    #[test]
    fn many_writes_lose_nothing() {
        // 1/3 token per second on a millisecond clock (Redis 7.0): each
        // millisecond refills 333333.33... nano-tokens, not a whole number.
        let l = lim(1, 3, 200);
        let mut b = consume(None, l, 200, Mode::All, T0).bucket;
        let reserve = Mode::Reserve {
            max_wait_us: 3600 * SEC as u64,
        };
        for k in 1..=15 {
            let o = consume(Some(&b), l, 1, reserve, T0 + k * 1000);
            assert!(o.dirty);
            b = o.bucket;
        }
        // 264 s refill 88 tokens; 15 were taken: exactly 73 are there.
        let at = T0 + 264 * SEC;
        assert_eq!(b.tokens_decimal(at), "73", "not 72.999999995");
        let o = consume(Some(&b), l, 73, Mode::All, at);
        assert_eq!(
            (o.kind, o.retry_after_ms),
            (Kind::Allowed, 0),
            "a request made exactly on time is served"
        );
    }

    #[test]
    fn waits_after_a_clock_step_back_count_from_now() {
        let l = lim(1, 1, 10);
        let b = empty(l, T0);
        // The clock stepped back 1 s: refill resumes once it passes T0 again.
        let o = consume(Some(&b), l, 1, Mode::All, T0 - SEC);
        assert_eq!(o.kind, Kind::Denied);
        assert_eq!(
            (o.retry_after_ms, o.reset_after_ms),
            (2000, 11000),
            "1 s until the clock passes the stored time, then 1 s (10 s to full)"
        );
        let reserve = |ms: u64| Mode::Reserve {
            max_wait_us: ms * 1000,
        };
        let o = consume(Some(&b), l, 1, reserve(1500), T0 - SEC);
        assert_eq!(o.kind, Kind::Denied, "a 2 s wait is beyond a 1.5 s RESERVE");
        let o = consume(Some(&b), l, 1, reserve(2000), T0 - SEC);
        assert_eq!((o.kind, o.retry_after_ms), (Kind::Reserved, 2000));
        let peek = consume(Some(&b), l, 0, Mode::All, T0 - SEC);
        assert_eq!(peek.retry_after_ms, 2000);
    }

    #[test]
    fn a_peek_asks_for_one_whole_token() {
        let l = lim(1, 1000, 3);
        let b = consume(None, l, 3, Mode::All, T0).bucket;
        let peek = consume(Some(&b), l, 0, Mode::All, T0 + 500);
        let one = consume(Some(&b), l, 1, Mode::All, T0 + 500);
        assert_eq!(one.kind, Kind::Denied);
        assert!(!peek.allowed(), "an empty bucket serves no request");
        assert_eq!(
            peek.retry_after_ms, one.retry_after_ms,
            "the wait for one token"
        );
        assert_eq!(peek.retry_after_ms, 1_000_000);
        assert!(!peek.dirty);
        // Half a token: still not one.
        let half = Bucket {
            tokens: NANOS / 2,
            ..b
        };
        let peek = consume(Some(&half), l, 0, Mode::All, T0);
        assert_eq!((peek.allowed(), peek.retry_after_ms), (false, 500_000));
        // Capacity 0, or rate 0 below one token: never.
        let zero_cap = consume(None, lim(1, 1, 0), 0, Mode::All, T0);
        assert_eq!((zero_cap.allowed(), zero_cap.retry_after_ms), (false, -1));
        let fixed = Bucket {
            tokens: NANOS - 1,
            ..Bucket::full(lim(0, 1, 5), T0)
        };
        let peek = consume(Some(&fixed), fixed.limits(), 0, Mode::All, T0);
        assert_eq!((peek.allowed(), peek.retry_after_ms), (false, -1));
        // One token there: allowed, nothing written.
        let peek = consume(None, l, 0, Mode::All, T0);
        assert_eq!(
            (peek.allowed(), peek.retry_after_ms, peek.dirty),
            (true, 0, false)
        );
    }

    #[test]
    fn atmost_grants_what_is_there() {
        let l = lim(1, 1, 10);
        let b = Bucket {
            tokens: 3 * NANOS + 500_000_000,
            ..empty(l, T0)
        };
        let o = consume(Some(&b), l, 8, Mode::AtMost { min: 1 }, T0);
        assert_eq!((o.kind, o.granted, o.remaining), (Kind::Allowed, 3, 0));
        assert_eq!(o.bucket.tokens, 500_000_000);
        let o = consume(Some(&o.bucket), l, 8, Mode::AtMost { min: 1 }, T0);
        assert_eq!(
            (o.kind, o.granted, o.retry_after_ms),
            (Kind::Denied, 0, 500)
        );
        let o = consume(Some(&b), l, 2, Mode::AtMost { min: 1 }, T0);
        assert_eq!((o.kind, o.granted), (Kind::Allowed, 2));
        let o = consume(Some(&b), l, 11, Mode::AtMost { min: 1 }, T0);
        assert_eq!(
            (o.kind, o.granted),
            (Kind::Allowed, 3),
            "n above capacity: send what you may"
        );
        let fixed = lim(0, 1, 10);
        let empty_fixed = Bucket {
            tokens: 0,
            ..Bucket::full(fixed, T0)
        };
        let o = consume(Some(&empty_fixed), fixed, 5, Mode::AtMost { min: 1 }, T0);
        assert_eq!((o.kind, o.retry_after_ms), (Kind::Never, -1));
    }

    #[test]
    fn atmost_min_grants_a_chunk_or_nothing() {
        let l = lim(10, 1, 100);
        let b = Bucket {
            tokens: 7 * NANOS + 500_000_000,
            ..empty(l, T0)
        };
        let at = |min| Mode::AtMost { min };
        let o = consume(Some(&b), l, 50, at(10), T0);
        assert_eq!(
            (o.kind, o.granted, o.retry_after_ms, o.dirty),
            (Kind::Denied, 0, 250, false),
            "the wait is for the chunk (2.5 tokens at 10/s), not one token"
        );
        let o = consume(Some(&b), l, 50, at(7), T0);
        assert_eq!((o.kind, o.granted, o.remaining), (Kind::Allowed, 7, 0));
        let o = consume(Some(&b), l, 5, at(10), T0);
        assert_eq!(
            (o.kind, o.granted),
            (Kind::Allowed, 5),
            "a chunk above n means all of n"
        );
        let o = consume(Some(&b), l, 9, at(10), T0);
        assert_eq!(
            (o.kind, o.granted, o.retry_after_ms),
            (Kind::Denied, 0, 150)
        );
        let o = consume(Some(&b), l, 50, at(10), T0 + 250_000);
        assert_eq!((o.kind, o.granted), (Kind::Allowed, 10));
        let o = consume(Some(&b), l, 500, at(100), T0);
        assert_eq!(
            (o.kind, o.retry_after_ms),
            (Kind::Denied, 9250),
            "n above capacity: waits for the chunk"
        );
    }

    #[test]
    fn consume_all_atmost_shares_one_grant() {
        let user = lim(10, 1, 100);
        let global = lim(10, 1, 100);
        let reqs = lim(1, 1, 10);
        let part = |l: Limits, tokens: i128, n| Part {
            stored: Some(Bucket {
                tokens,
                ..empty(l, T0)
            }),
            limits: l,
            n,
        };
        let parts = [
            part(user, 40 * NANOS, 60),
            part(global, 25 * NANOS + 1, 60),
            part(reqs, NANOS, 1),
        ];
        let o = consume_all(&parts, Mode::AtMost { min: 20 }, T0);
        assert_eq!((o.allowed, o.granted), (true, 25));
        assert_eq!(o.taken, vec![25, 25, 1]);
        assert_eq!(o.need, vec![20, 20, 1], "the chunk, and the counter's n");
        assert_eq!(o.remaining, vec![15, 0, 0]);
        let o = consume_all(&parts, Mode::AtMost { min: 30 }, T0);
        assert_eq!(
            (o.allowed, o.granted, o.retry_after_ms, &o.taken[..]),
            (false, 0, 500, &[0, 0, 0][..]),
            "the global part needs 5 more tokens at 10/s"
        );
        assert!(o.dirty.iter().all(|d| !d));
        let short_reqs = [parts[0], parts[1], part(reqs, 0, 1)];
        let o = consume_all(&short_reqs, Mode::AtMost { min: 1 }, T0);
        assert_eq!(
            (o.allowed, o.retry_after_ms),
            (false, 1000),
            "a fixed part is all or nothing"
        );
        let o = consume_all(&parts, Mode::All, T0);
        assert_eq!((o.allowed, o.granted), (false, 0));
        let never = [parts[0], part(lim(0, 1, 100), 0, 60)];
        let o = consume_all(&never, Mode::AtMost { min: 1 }, T0);
        assert_eq!((o.allowed, o.retry_after_ms), (false, -1));
    }

    #[test]
    fn reservations_queue_first_come_first_served() {
        let l = lim(10, 1, 1);
        let mode = Mode::Reserve {
            max_wait_us: SEC as u64,
        };
        let o1 = consume(None, l, 1, mode, T0);
        assert_eq!((o1.kind, o1.retry_after_ms), (Kind::Allowed, 0));
        let o2 = consume(Some(&o1.bucket), l, 1, mode, T0);
        assert_eq!(
            (o2.kind, o2.retry_after_ms, o2.granted),
            (Kind::Reserved, 100, 1)
        );
        let o3 = consume(Some(&o2.bucket), l, 1, mode, T0);
        assert_eq!((o3.kind, o3.retry_after_ms), (Kind::Reserved, 200));
        assert_eq!(o3.remaining, 0, "debt shows as zero remaining");
        let late = consume(
            Some(&o3.bucket),
            l,
            1,
            Mode::Reserve {
                max_wait_us: 250_000,
            },
            T0,
        );
        assert_eq!((late.kind, late.retry_after_ms), (Kind::Denied, 300));
        assert!(!late.dirty);
        let peek = consume(Some(&o3.bucket), l, 0, Mode::All, T0);
        assert_eq!(
            peek.retry_after_ms, 300,
            "a peek waits for one token, behind the debt"
        );
    }

    #[test]
    fn consume_all_is_all_or_nothing() {
        let rpm = lim(1, 1, 3);
        let tpm = lim(100, 1, 1000);
        let part = |stored, limits, n| Part { stored, limits, n };
        let o = consume_all(&[part(None, rpm, 1), part(None, tpm, 600)], Mode::All, T0);
        assert!(o.allowed);
        assert_eq!(o.retry_after_ms, 0);
        assert_eq!(o.buckets[0].tokens, 2 * NANOS);
        assert_eq!(o.buckets[1].tokens, 400 * NANOS);
        // The second limit is short: nothing is taken from either.
        let (r, t) = (o.buckets[0], o.buckets[1]);
        let o2 = consume_all(
            &[part(Some(r), rpm, 1), part(Some(t), tpm, 600)],
            Mode::All,
            T0,
        );
        assert!(!o2.allowed);
        assert_eq!(o2.retry_after_ms, 2000, "200 tokens at 100/s");
        assert_eq!(o2.dirty, vec![false, false]);
        assert_eq!(
            (o2.buckets[0].tokens, o2.buckets[1].tokens),
            (r.tokens, t.tokens)
        );
        // Never when one part exceeds its capacity.
        let o3 = consume_all(
            &[part(Some(r), rpm, 1), part(Some(t), tpm, 1001)],
            Mode::All,
            T0,
        );
        assert_eq!((o3.allowed, o3.retry_after_ms), (false, -1));
        // With a reservation both go into debt and the wait is the slowest.
        let o4 = consume_all(
            &[part(Some(r), rpm, 1), part(Some(t), tpm, 600)],
            Mode::Reserve {
                max_wait_us: 5_000_000,
            },
            T0,
        );
        assert!(o4.allowed);
        assert_eq!(o4.retry_after_ms, 2000);
        assert_eq!(o4.buckets[1].tokens, -200 * NANOS);
        assert_eq!(o4.dirty, vec![true, true]);
    }

    #[test]
    fn refund_clamps_and_ignores_missing() {
        let l = lim(1, 1, 5);
        assert_eq!(refund(None, 3, T0), None);
        let b = empty(l, T0);
        assert_eq!(refund(Some(&b), 3, T0).unwrap().tokens, 3 * NANOS);
        assert_eq!(refund(Some(&b), 30, T0).unwrap().tokens, 5 * NANOS);
    }

    #[test]
    fn validity_check_rejects_corruption() {
        let l = lim(1, 1, 5);
        assert!(Bucket::full(l, T0).is_valid());
        let mut b = Bucket::full(l, T0);
        b.tokens += 1;
        assert!(!b.is_valid());
        let b = Bucket {
            rate: Rate { num: 2, den: 4 },
            ..Bucket::full(l, T0)
        };
        assert!(!b.is_valid(), "unreduced rate");
    }

    fn arb_limits() -> impl Strategy<Value = Limits> {
        (
            prop_oneof![Just(0u128), 1u128..1_000_000_000_000, 1u128..100],
            prop_oneof![Just(1u128), 1u128..100_000, Just(86_400u128)],
            prop_oneof![0u64..20, 1u64..1_000_000, Just(MAX_AMOUNT)],
        )
            .prop_map(|(num, den, capacity)| Limits {
                rate: Rate::new(num, den).unwrap(),
                capacity,
            })
    }

    fn arb_mode() -> impl Strategy<Value = Mode> {
        prop_oneof![
            Just(Mode::All),
            (1u64..20).prop_map(|min| Mode::AtMost { min }),
            (0u64..5_000_000).prop_map(|w| Mode::Reserve { max_wait_us: w }),
        ]
    }

    proptest! {
        /// Over any window T, the tokens granted without waiting never exceed
        /// capacity + rate * T, and reserved tokens never exceed what refills
        /// by the time the caller was told to proceed.
        #[test]
        fn admitted_never_exceeds_capacity_plus_rate_times_t(
            l in arb_limits(),
            steps in proptest::collection::vec((0i64..3_000_000, 0u64..40, arb_mode()), 1..60),
        ) {
            let mut stored: Option<Bucket> = None;
            let mut now = T0;
            let mut admitted: u128 = 0;
            let mut latest_proceed = T0;
            let period = l.rate.exact_period_us() as i64;
            for (dt, n, mode) in steps {
                now += dt;
                let o = consume(stored.as_ref(), l, n, mode, now);
                prop_assert!(o.bucket.tokens <= o.bucket.cap_nanos());
                prop_assert!(o.bucket.updated_us <= now && now - o.bucket.updated_us < period);
                // The exact wait is what the reply's wait rounds up.
                prop_assert_eq!(
                    o.retry_after_ms,
                    if o.wait_us < 0 { -1 } else { ceil_ms(o.wait_us as u64) }
                );
                prop_assert!(o.wait_us >= -1);
                if o.allowed() && o.kind != Kind::Peek {
                    admitted += o.granted as u128;
                    latest_proceed = latest_proceed.max(now + o.retry_after_ms * 1000);
                } else {
                    prop_assert_eq!(o.granted, 0);
                    prop_assert!(o.retry_after_ms != 0 || o.kind == Kind::Peek);
                }
                if o.dirty { stored = Some(o.bucket); }
                let window_us = (latest_proceed.max(now) - T0) as u128;
                let bound_nanos = l.capacity as u128 * NANOS as u128
                    + l.rate.refill_nanos(window_us as u64);
                prop_assert!(admitted * NANOS as u128 <= bound_nanos,
                    "admitted {} over {} us", admitted, window_us);
            }
        }

        /// No write loses anything: after any sequence of consumes (every
        /// mode), peeks and refunds at any times (the clock moving forwards
        /// or standing still), the level is exactly what continuous rational
        /// arithmetic gives. The model is the level times the rate's
        /// denominator, in integers. (Clock steps back are checked against
        /// the token ledger of the `bucket_ops` fuzz target.)
        #[test]
        fn no_write_loses_anything(
            l in arb_limits(),
            steps in proptest::collection::vec(
                (0i64..3_000_000, 0u64..40, arb_mode(), any::<bool>()), 1..60),
        ) {
            let den = l.rate.den() as i128;
            let per_us = l.rate.num() as i128 * 1000;
            let cap = l.capacity as i128 * NANOS * den;
            let mut level = cap;
            let mut stored: Option<Bucket> = None;
            let mut now = T0;
            for (dt, n, mode, is_refund) in steps {
                now += dt;
                level = if stored.is_none() { cap } else { cap.min(level + dt as i128 * per_us) };
                let seen = stored.map_or(l.capacity as i128 * NANOS, |b| b.nanos_at(now));
                prop_assert_eq!(seen, level.div_euclid(den), "level at {}", now - T0);
                if is_refund {
                    if let Some(b) = refund(stored.as_ref(), n, now) {
                        level = cap.min(level + n as i128 * NANOS * den);
                        prop_assert_eq!(b.nanos_at(now), level.div_euclid(den));
                        stored = Some(b);
                    }
                    continue;
                }
                let o = consume(stored.as_ref(), l, n, mode, now);
                level -= o.granted as i128 * NANOS * den;
                prop_assert_eq!(o.remaining as i128, level.div_euclid(den).max(0) / NANOS);
                if o.dirty {
                    stored = Some(o.bucket);
                }
            }
        }

        /// A retry made exactly retry_after_ms later succeeds when nobody else
        /// consumed in between, and one millisecond earlier it does not; a
        /// reservation's debt is paid off exactly when it is due. Also after
        /// a clock step back (the stored time ahead of now).
        #[test]
        fn retry_after_is_exact(
            l in arb_limits(),
            start in 0i128..(1i128 << 60),
            n in 1u64..1000,
            offset in -2_000_000i64..1_000_000,
        ) {
            let mut b = Bucket::full(l, T0);
            b.tokens = start.min(b.cap_nanos());
            let now = T0 + offset;
            let o = consume(Some(&b), l, n, Mode::All, now);
            if o.kind == Kind::Denied {
                let at = |ms: i64| consume(Some(&b), l, n, Mode::All, now + ms * 1000).kind;
                prop_assert_eq!(at(o.retry_after_ms), Kind::Allowed);
                prop_assert_eq!(at(o.retry_after_ms - 1), Kind::Denied);
                let reserve = Mode::Reserve { max_wait_us: u64::MAX };
                let r = consume(Some(&b), l, n, reserve, now);
                prop_assert_eq!((r.kind, r.retry_after_ms), (Kind::Reserved, o.retry_after_ms));
                prop_assert!(r.bucket.nanos_at(now + r.retry_after_ms * 1000) >= 0);
                prop_assert!(r.bucket.nanos_at(now + (r.retry_after_ms - 1) * 1000) < 0);
            }
        }

        /// Settling in many small steps gives exactly what one big step gives.
        #[test]
        fn piecewise_refill_equals_one_step(
            l in arb_limits(),
            steps in proptest::collection::vec(0i64..10_000_000, 1..50),
        ) {
            let mut piecewise = Bucket { tokens: 0, ..Bucket::full(l, T0) };
            let mut total = 0;
            for dt in steps { total += dt; piecewise.settle(T0 + total); }
            let once = Bucket { tokens: 0, ..Bucket::full(l, T0) };
            let end = T0 + total;
            prop_assert_eq!(piecewise.nanos_at(end), once.nanos_at(end));
            prop_assert_eq!(piecewise.nanos_at(end + 12_345_678), once.nanos_at(end + 12_345_678));
            prop_assert!(end - piecewise.updated_us < l.rate.exact_period_us() as i64);
        }

        /// The key's expiry is the first millisecond at which the bucket is full.
        #[test]
        fn expiry_matches_refill(l in arb_limits(), tokens in 0i128..(1i128 << 70), now in 0i64..(1i64 << 52)) {
            let mut b = Bucket::full(l, now);
            b.tokens = tokens.min(b.cap_nanos());
            if let Expiry::AtMs(ms) = b.expiry() {
                prop_assume!(ms < i64::MAX / 1000);
                prop_assert_eq!(b.nanos_at(ms * 1000), b.cap_nanos());
                prop_assert!(b.nanos_at(ms * 1000 - 1000) < b.cap_nanos() || ms * 1000 - 1000 < now);
            }
        }
    }
}
