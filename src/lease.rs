//! Concurrency leases: pure arithmetic, no Redis types, injected clock.
//!
//! A lease takes `n` tokens from a bucket now and gives them back when it is
//! released by its id, or, if its holder vanished, once its TTL has passed.
//! There is no timer per lease: every command on the bucket first returns
//! the tokens of the leases whose expiry is at or before its `now`
//! ([`Leases::expire`]). Returning them late changes nothing: the level at
//! any later time is `min(capacity, bare level + returned tokens)` whether
//! they came back at their expiry or at the next access.
//!
//! A pure concurrency limit is a bucket with rate 0 and capacity = the
//! limit; leases work on any bucket.
//!
//! Lease ids are `max(last_id + 1, now_us)`: increasing within a bucket, and
//! never reused after the key was deleted and made again, because a key
//! whose bucket handed out ids is only deleted once the clock has passed
//! its last id (see [`key_expiry`]). A retried release of an old id thus
//! never releases somebody else's lease.

use crate::bucket::{ceil_ms, Bucket, Expiry, Kind, Outcome, MAX_AMOUNT, MAX_EXPIRE_MS, NANOS};

/// Most leases a bucket holds at once. Each takes 24 bytes in memory (id,
/// tokens, expiry), so a bucket's leases take at most 24 KiB (48 KiB with the
/// spare capacity of their list).
pub const MAX_LEASES: usize = 1024;
/// Longest lease TTL in ms (a day).
pub const MAX_TTL_MS: u64 = 86_400_000;

/// One lease held on a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its id, unique within the bucket.
    pub id: u64,
    /// Tokens it holds (at least 1).
    pub n: u64,
    /// Server time in µs at and after which it has expired.
    pub expires_us: i64,
}

/// The leases of one bucket, part of its state.
///
/// Invariants ([`Leases::is_valid`]): at most [`MAX_LEASES`] held, ids
/// strictly increasing and at most `last_id`, every `n` from 1 to
/// [`MAX_AMOUNT`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leases {
    /// The last id handed out (0: none ever).
    pub last_id: u64,
    /// Leases held, in the order of their ids.
    pub held: Vec<Lease>,
}

/// Why a lease cannot be granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantError {
    /// The bucket holds [`MAX_LEASES`] already.
    Full,
}

impl Leases {
    /// True when the bucket never handed out a lease: its state is the
    /// bucket alone.
    pub fn is_blank(&self) -> bool {
        self.last_id == 0 && self.held.is_empty()
    }

    /// True when the fields satisfy the invariants (used to reject corrupt
    /// persisted or replicated state).
    pub fn is_valid(&self) -> bool {
        self.held.len() <= MAX_LEASES
            && self.held.windows(2).all(|w| w[0].id < w[1].id)
            && self.held.last().is_none_or(|l| l.id <= self.last_id)
            && self.held.iter().all(|l| (1..=MAX_AMOUNT).contains(&l.n))
    }

    /// Tokens the held leases hold, in nano-tokens.
    pub fn held_nanos(&self) -> i128 {
        self.held.iter().map(|l| l.n as i128 * NANOS).sum()
    }

    /// The earliest expiry among the held leases, in µs.
    pub fn next_expiry_us(&self) -> Option<i64> {
        self.held.iter().map(|l| l.expires_us).min()
    }

    /// Returns the tokens of every lease expired at `now_us` to `b` (never
    /// above capacity) and forgets those leases. Returns whether any had
    /// expired. `b` must be settled up to `now_us` or be the stored state.
    pub fn expire(&mut self, b: &mut Bucket, now_us: i64) -> bool {
        let before = self.held.len();
        let mut back = 0i128;
        self.held.retain(|l| {
            let alive = l.expires_us > now_us;
            if !alive {
                back += l.n as i128 * NANOS;
            }
            alive
        });
        if back > 0 {
            give_back(b, back, now_us);
        }
        self.held.len() != before
    }

    /// Records a lease of `n` tokens for `ttl_ms` at `now_us` (the caller
    /// has taken the tokens) and returns its id.
    pub fn grant(&mut self, n: u64, ttl_ms: u64, now_us: i64) -> Result<u64, GrantError> {
        if self.held.len() >= MAX_LEASES {
            return Err(GrantError::Full);
        }
        let id = self.last_id.saturating_add(1).max(now_us.max(0) as u64);
        self.last_id = id;
        self.held.push(Lease {
            id,
            n,
            expires_us: now_us.saturating_add(ttl_ms as i64 * 1000),
        });
        Ok(id)
    }

    /// Whether `grant` would succeed.
    pub fn has_room(&self) -> bool {
        self.held.len() < MAX_LEASES
    }

    /// Microseconds from `now_us` until `b` holds `level` nano-tokens,
    /// counting the tokens of held leases as back at their expiry (a
    /// release can only make it sooner); `None` if it never will.
    pub fn micros_until(&self, b: &Bucket, level: i128, now_us: i64) -> Option<u64> {
        let mut best = b.micros_until(level, now_us);
        let mut by_expiry: Vec<&Lease> = self.held.iter().collect();
        by_expiry.sort_by_key(|l| l.expires_us);
        let mut back = 0i128;
        for l in by_expiry {
            back += l.n as i128 * NANOS;
            let Some(refill) = b.micros_until(level - back, now_us) else {
                continue;
            };
            let wait = refill.max(l.expires_us.saturating_sub(now_us).max(0) as u64);
            best = Some(best.map_or(wait, |w| w.min(wait)));
        }
        best
    }
}

/// Adds `nanos` to `b` at `now_us`, never above capacity.
fn give_back(b: &mut Bucket, nanos: i128, now_us: i64) {
    b.settle(now_us);
    let cap = b.cap_nanos();
    b.tokens = (b.tokens + nanos).min(cap);
    if b.tokens >= cap {
        b.updated_us = b.updated_us.max(now_us);
    }
}

/// The result of [`release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Released {
    /// Tokens given back: the lease's `n`, or `n - used`; negative when
    /// `used` exceeded the lease and the rest was charged, into debt if
    /// need be.
    pub returned: i128,
}

/// Releases lease `id` of the bucket at `now_us` (expired leases returned
/// first). With `used`, settles it: the lease's tokens minus `used` come
/// back (at most capacity), or the overrun `used - n` is taken, even into
/// debt. `None` when no such lease is held: released already, expired, or
/// never granted; nothing changes then.
pub fn release(
    b: &mut Bucket,
    leases: &mut Leases,
    id: u64,
    used: Option<u64>,
    now_us: i64,
) -> Option<Released> {
    let at = leases.held.iter().position(|l| l.id == id)?;
    let lease = leases.held.remove(at);
    let returned = lease.n as i128 - used.map_or(0, i128::from);
    if returned >= 0 {
        give_back(b, returned * NANOS, now_us);
    } else {
        b.settle(now_us);
        b.tokens += returned * NANOS;
    }
    Some(Released { returned })
}

/// When the key holding `b` with `leases` may expire: once the bucket is
/// full with every held lease back (at the latest expiry of the leases),
/// and not before the clock has passed the last id handed out. A missing
/// key reads as a full bucket, so an earlier expiry would mint tokens.
pub fn key_expiry(b: &Bucket, leases: &Leases) -> Expiry {
    if leases.is_blank() {
        return b.expiry();
    }
    let cap = b.cap_nanos();
    let last_id = i64::try_from(leases.last_id).unwrap_or(i64::MAX);
    if leases.held.is_empty() && b.tokens >= cap && last_id < b.updated_us {
        return Expiry::Now;
    }
    let target = cap - leases.held_nanos();
    let full_us: i128 = if b.tokens >= target {
        b.updated_us as i128
    } else {
        match b.rate.micros_for((target - b.tokens) as u128) {
            Some(us) => b.updated_us as i128 + us.min(i128::MAX as u128 / 4) as i128,
            None => return Expiry::Never,
        }
    };
    let last_expiry = leases.held.iter().map(|l| l.expires_us).max();
    let at_us = full_us
        .max(last_expiry.map_or(i128::MIN, i128::from))
        .max(i128::from(last_id) + 1);
    let at_ms = (at_us + 999).div_euclid(1000);
    if at_ms > MAX_EXPIRE_MS as i128 {
        Expiry::Never
    } else {
        Expiry::AtMs(at_ms.max(1) as i64)
    }
}

/// Milliseconds from `now_us` until `b` is full with the held leases back
/// at their expiry at the latest; -1 for never.
pub fn reset_after_ms(b: &Bucket, leases: &Leases, now_us: i64) -> i64 {
    leases
        .micros_until(b, b.cap_nanos(), now_us)
        .map_or(-1, ceil_ms)
}

/// Makes the reset and the wait of a denial (or a peek) of `o` count the
/// held leases' expiry: a bucket with no refill whose tokens are leased out is not
/// "never" but "when the first of enough leases expires". `target` is the
/// whole tokens the request waits for (1 for a peek or `ATMOST`).
pub fn wait_with_leases(o: &mut Outcome, leases: &Leases, target: u64, now_us: i64) {
    let waiting = match o.kind {
        Kind::Denied | Kind::Never => true,
        Kind::Peek => o.retry_after_ms != 0,
        Kind::Allowed | Kind::Reserved => false,
    };
    if leases.held.is_empty() {
        return;
    }
    o.reset_after_ms = reset_after_ms(&o.bucket, leases, now_us);
    if !waiting || target > o.bucket.capacity {
        return;
    }
    if let Some(us) = leases.micros_until(&o.bucket, target as i128 * NANOS, now_us) {
        o.retry_after_ms = ceil_ms(us);
        if o.kind == Kind::Never {
            o.kind = Kind::Denied;
        }
    }
}

/// Milliseconds from `now_us` until the next lease expires (-1: none held).
pub fn next_expiry_ms(leases: &Leases, now_us: i64) -> i64 {
    leases
        .next_expiry_us()
        .map_or(-1, |at| ceil_ms(at.saturating_sub(now_us).max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{consume, Limits, Mode, Rate};

    const SEC: i64 = 1_000_000;
    const T0: i64 = 1_700_000_000 * SEC;

    fn lim(num: u128, den: u128, cap: u64) -> Limits {
        Limits {
            rate: Rate::new(num, den).unwrap(),
            capacity: cap,
        }
    }

    #[test]
    fn leases_come_back_on_release_once() {
        let l = lim(0, 1, 2);
        let mut leases = Leases::default();
        let o = consume(None, l, 2, Mode::All, T0);
        let mut b = o.bucket;
        let id = leases.grant(2, 1000, T0).unwrap();
        assert_eq!(id, T0 as u64);
        assert_eq!(b.whole_tokens(T0), 0);
        let r = release(&mut b, &mut leases, id, None, T0 + 1);
        assert_eq!(r, Some(Released { returned: 2 }));
        assert_eq!(b.whole_tokens(T0 + 1), 2);
        assert_eq!(release(&mut b, &mut leases, id, None, T0 + 2), None);
        assert_eq!(b.whole_tokens(T0 + 2), 2);
    }

    #[test]
    fn expired_leases_return_lazily_and_ids_increase() {
        let l = lim(0, 1, 3);
        let mut leases = Leases::default();
        let mut b = consume(None, l, 3, Mode::All, T0).bucket;
        let a = leases.grant(1, 100, T0).unwrap();
        let c = leases.grant(2, 200, T0).unwrap();
        assert!(c > a);
        assert!(!leases.expire(&mut b, T0 + 99_999));
        assert_eq!(leases.micros_until(&b, NANOS, T0), Some(100_000));
        assert_eq!(leases.micros_until(&b, 3 * NANOS, T0), Some(200_000));
        assert_eq!(leases.micros_until(&b, 4 * NANOS, T0), None);
        assert!(leases.expire(&mut b, T0 + 100_000));
        assert_eq!(b.whole_tokens(T0 + 100_000), 1);
        assert_eq!(release(&mut b, &mut leases, a, None, T0 + 100_000), None);
        assert_eq!(key_expiry(&b, &leases), Expiry::AtMs((T0 + 200_000) / 1000));
    }

    #[test]
    fn settling_charges_overruns_into_debt_and_refunds_below_capacity() {
        let l = lim(10, 1, 100);
        let mut leases = Leases::default();
        let mut b = consume(None, l, 50, Mode::All, T0).bucket;
        let id = leases.grant(50, 60_000, T0).unwrap();
        let r = release(&mut b, &mut leases, id, Some(170), T0).unwrap();
        assert_eq!(r.returned, -120);
        assert_eq!(b.tokens, -70 * NANOS);
        let o = consume(Some(&b), l, 1, Mode::All, T0);
        assert_eq!(o.retry_after_ms, 7_100);
        let mut b = consume(None, l, 50, Mode::All, T0).bucket;
        let id = leases.grant(50, 60_000, T0).unwrap();
        // Refill brings it back to capacity; the refund cannot go above it.
        let r = release(&mut b, &mut leases, id, Some(10), T0 + 10 * SEC).unwrap();
        assert_eq!(r.returned, 40);
        assert_eq!(b.tokens, 100 * NANOS);
    }

    #[test]
    fn a_full_table_refuses_and_the_key_outlives_its_leases() {
        let mut leases = Leases::default();
        for i in 0..MAX_LEASES {
            leases.grant(1, 1000, T0 + i as i64).unwrap();
        }
        assert_eq!(leases.grant(1, 1000, T0), Err(GrantError::Full));
        assert!(leases.is_valid());
        let b = Bucket {
            tokens: 0,
            ..Bucket::full(lim(0, 1, MAX_LEASES as u64), T0)
        };
        // Full again when the last lease is back: no earlier.
        let last = T0 + MAX_LEASES as i64 - 1 + 1_000_000;
        assert_eq!(key_expiry(&b, &leases), Expiry::AtMs((last + 999) / 1000));
        // A full bucket whose last id is ahead of its time is kept until then.
        let full = Bucket::full(lim(0, 1, 1), T0);
        let ids = Leases {
            last_id: T0 as u64 + 5_000,
            held: vec![],
        };
        assert_eq!(
            key_expiry(&full, &ids),
            Expiry::AtMs((T0 + 5_001 + 999) / 1000)
        );
        let past = Leases {
            last_id: T0 as u64 - 1,
            held: vec![],
        };
        assert_eq!(key_expiry(&full, &past), Expiry::Now);
    }
}
