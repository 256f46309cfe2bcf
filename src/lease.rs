//! Concurrency leases: pure arithmetic, no Redis types, injected clock.
//!
//! A lease takes `n` tokens from a bucket now. Its holder gives them back
//! by releasing it by its id (all of them, or what was not used). What its
//! expiry means is the lease's own: by default a lease whose TTL has passed
//! gives its tokens back (right for an in-flight slot: a holder that
//! vanished holds nothing any more); a lease granted with `KEEP` ([`Lease::keep`])
//! is forgotten at expiry with its tokens still used (right for an
//! estimate of tokens that were probably spent: the bucket never admits
//! more than it would have had the holder settled it).
//! There is no timer per lease: every command on the bucket first handles
//! the leases whose expiry is at or before its `now` ([`Leases::expire`]).
//! Returning them late changes nothing: the level at any later time is
//! `min(capacity, bare level + returned tokens)` whether they came back at
//! their expiry or at the next access.
//!
//! A pure concurrency limit is a bucket with rate 0 and capacity = the
//! limit; leases work on any bucket.
//!
//! Lease ids are drawn at random by the caller of [`Leases::grant`] (the
//! module from a CSPRNG) from 1 to [`MAX_ID`], redrawn while equal to an id
//! the bucket holds: nothing a client sees (the clock, its own ids) tells
//! another holder's id, and an id is not handed out twice for a key but
//! with a chance of 2^-53 per pair, across clock steps, restarts, failovers,
//! `RESTORE` and key recreation alike. A retried release of an old id thus
//! never releases somebody else's lease.

use std::collections::VecDeque;

use crate::bucket::{ceil_ms, Bucket, Expiry, Kind, Outcome, MAX_AMOUNT, MAX_EXPIRE_MS, NANOS};

/// Most leases a bucket holds at once. Each takes 32 bytes in memory (id,
/// tokens, expiry, what its expiry means), so a bucket's leases take at
/// most 32 KiB (64 KiB with the spare capacity of their list).
pub const MAX_LEASES: usize = 1024;
/// Longest lease TTL in ms (a day).
pub const MAX_TTL_MS: u64 = 86_400_000;
/// Largest lease id: 2^53 - 1, so that every client reads ids exactly
/// (JavaScript's Redis clients and Lua parse integer replies into doubles,
/// exact up to 2^53). 53 bits from a CSPRNG: one guess in 2^53 hits.
pub const MAX_ID: u64 = (1 << 53) - 1;

/// One lease held on a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    /// Its id, from 1 to [`MAX_ID`], unique within the bucket.
    pub id: u64,
    /// Tokens it holds (at least 1).
    pub n: u64,
    /// Server time in µs at and after which it has expired.
    pub expires_us: i64,
    /// What its expiry means: `false`, its tokens come back; `true`
    /// (`KEEP`), they stay used.
    pub keep: bool,
}

impl Lease {
    /// Nano-tokens its expiry gives back.
    fn back_at_expiry(&self) -> i128 {
        if self.keep {
            0
        } else {
            self.n as i128 * NANOS
        }
    }
}

/// The leases of one bucket, part of its state.
///
/// Invariants ([`Leases::is_valid`]): at most [`MAX_LEASES`] held, in the
/// order of their expiry (ties in the order they were granted, so that a
/// replica or AOF replaying the same grants holds them in the same order),
/// ids distinct and from 1 to [`MAX_ID`], every `n` from 1 to
/// [`MAX_AMOUNT`].
#[derive(Clone, Debug, Default)]
pub struct Leases {
    /// Leases held, by expiry (a ring: the oldest go, or are released,
    /// without moving the others).
    pub held: VecDeque<Lease>,
    /// What the command running now changed ([`Leases::delta`]); not part
    /// of the state.
    journal: Delta,
    /// The leases this command's [`Leases::expire`] dropped, kept until
    /// the change is written ([`Leases::clear_journal`]) or undone
    /// ([`Leases::undo_expiry`]).
    expired: Vec<Lease>,
    /// Nano-tokens the held leases give back at expiry (kept up to date,
    /// so the key's expiry costs no walk over them).
    back_nanos: i128,
}

/// Two sets of leases are equal when they hold the same leases, whatever
/// their journal.
impl PartialEq for Leases {
    fn eq(&self, other: &Self) -> bool {
        self.held == other.held
    }
}

impl Eq for Leases {}

/// The changes one command made to a bucket's leases, in the order they
/// are applied: the leases expired at or before `expired_through` dropped,
/// then those `released`, then those `granted` (each where its expiry puts
/// it). Replicas and the AOF receive this instead of every held lease, so
/// a write replicates a few bytes however many leases the bucket holds;
/// applying it to the leases the command found gives exactly the leases
/// it left ([`Leases::apply`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Leases expired at or before this time (µs) were dropped.
    pub expired_through: Option<i64>,
    /// Ids of the leases released.
    pub released: Vec<u64>,
    /// Leases granted.
    pub granted: Vec<Lease>,
    /// How many leases are held after (a check on the replica).
    pub held_after: usize,
}

/// Why a lease cannot be granted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantError {
    /// The bucket holds [`MAX_LEASES`] already.
    Full,
}

/// What a grant asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    /// Tokens lent (the caller has taken them).
    pub n: u64,
    /// How long until the lease expires, in ms.
    pub ttl_ms: u64,
    /// Whether its tokens stay used when it expires (`KEEP`).
    pub keep: bool,
}

impl Leases {
    /// True when the bucket holds no lease: its state is the bucket alone.
    pub fn is_blank(&self) -> bool {
        self.held.is_empty()
    }

    /// Leases holding `held` (in expiry order), with an empty journal.
    pub fn new(held: Vec<Lease>) -> Leases {
        Leases {
            back_nanos: held.iter().map(Lease::back_at_expiry).sum(),
            held: held.into(),
            journal: Delta::default(),
            expired: Vec::new(),
        }
    }

    /// Bytes the leases take on the heap (their lists' capacity).
    pub fn heap_bytes(&self) -> usize {
        self.held.capacity() * std::mem::size_of::<Lease>()
            + self.expired.capacity() * std::mem::size_of::<Lease>()
    }

    /// Whether a lease of id `id` is held.
    fn holds(&self, id: u64) -> bool {
        self.held.iter().any(|l| l.id == id)
    }

    /// Where lease `id` is in `held`: a scan of the ids (no index, which
    /// would double the leases' memory: a scan of 1,024 costs about what a
    /// call costs Redis besides, and a release usually finds the oldest
    /// first).
    fn position(&self, id: u64) -> Option<usize> {
        self.held.iter().position(|l| l.id == id)
    }

    /// Removes the lease at `at` of `held` and returns it.
    fn remove_at(&mut self, at: usize) -> Lease {
        let lease = self.held.remove(at).expect("a position in held");
        self.back_nanos -= lease.back_at_expiry();
        lease
    }

    /// Drops the first `due` leases of `held` (those expired) into
    /// `self.expired`, and returns the nano-tokens they give back.
    fn drop_first(&mut self, due: usize) -> i128 {
        let back: i128 = self.held.range(..due).map(Lease::back_at_expiry).sum();
        self.expired.extend(self.held.drain(..due));
        self.back_nanos -= back;
        back
    }

    /// What changed since the journal was last cleared, with the number
    /// held now.
    pub fn delta(&self) -> Delta {
        Delta {
            held_after: self.held.len(),
            ..self.journal.clone()
        }
    }

    /// Whether anything changed since the journal was last cleared.
    pub fn changed(&self) -> bool {
        self.journal != Delta::default()
    }

    /// Forgets the journal (the changes are written).
    pub fn clear_journal(&mut self) {
        self.journal = Delta::default();
        self.expired.clear();
    }

    /// Puts back the leases this command's [`Leases::expire`] dropped (the
    /// command wrote nothing, so the stored state keeps them: it reads the
    /// same) and forgets the journal. Only for a command that granted and
    /// released nothing.
    pub fn undo_expiry(&mut self) {
        debug_assert!(self.journal.granted.is_empty() && self.journal.released.is_empty());
        let expired = std::mem::take(&mut self.expired);
        for l in expired.into_iter().rev() {
            self.back_nanos += l.back_at_expiry();
            self.held.push_front(l);
        }
        self.journal = Delta::default();
    }

    /// Applies `d` (made by [`Leases::delta`] on these same leases) and
    /// returns true; or returns false and changes nothing when `d` does not
    /// fit them (a released id not held, a granted id held already, or
    /// another count after).
    pub fn apply(&mut self, d: &Delta) -> bool {
        let due = d
            .expired_through
            .map_or(0, |t| self.held.partition_point(|l| l.expires_us <= t));
        let live = self.held.len() - due;
        let expired_at = |id: &u64| self.held.range(..due).any(|l| l.id == *id);
        let mut distinct = d.released.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let fits = distinct.len() == d.released.len()
            && d.released
                .iter()
                .all(|id| self.holds(*id) && !expired_at(id))
            && d.granted
                .iter()
                .all(|g| !self.holds(g.id) || expired_at(&g.id))
            && live + d.granted.len() == d.held_after + d.released.len()
            && d.held_after <= MAX_LEASES;
        if !fits {
            return false;
        }
        self.drop_first(due);
        for &id in &d.released {
            if let Some(at) = self.position(id) {
                self.remove_at(at);
            }
        }
        for g in &d.granted {
            self.insert(*g);
        }
        self.expired.clear();
        true
    }

    /// Inserts `lease` after every lease expiring at or before it.
    fn insert(&mut self, lease: Lease) {
        let at = self
            .held
            .partition_point(|l| l.expires_us <= lease.expires_us);
        self.held.insert(at, lease);
        self.back_nanos += lease.back_at_expiry();
    }

    /// True when the fields satisfy the invariants (used to reject corrupt
    /// persisted or replicated state).
    pub fn is_valid(&self) -> bool {
        if self.held.len() > MAX_LEASES
            || !self
                .held
                .iter()
                .zip(self.held.iter().skip(1))
                .all(|(a, b)| a.expires_us <= b.expires_us)
            || !self
                .held
                .iter()
                .all(|l| (1..=MAX_AMOUNT).contains(&l.n) && (1..=MAX_ID).contains(&l.id))
        {
            return false;
        }
        let mut ids: Vec<u64> = self.held.iter().map(|l| l.id).collect();
        ids.sort_unstable();
        ids.windows(2).all(|w| w[0] < w[1])
    }

    /// Tokens the held leases give back at their expiry, in nano-tokens.
    pub fn held_nanos(&self) -> i128 {
        self.back_nanos
    }

    /// The earliest expiry among the held leases, in µs.
    pub fn next_expiry_us(&self) -> Option<i64> {
        self.held.front().map(|l| l.expires_us)
    }

    /// Handles every lease expired at `now_us`: returns the tokens of those
    /// without `keep` to `b` (never above capacity) and forgets them all.
    /// Returns whether any had expired. `b` must be settled up to `now_us`
    /// or be the stored state. Costs a binary search when none expired.
    pub fn expire(&mut self, b: &mut Bucket, now_us: i64) -> bool {
        let due = self.held.partition_point(|l| l.expires_us <= now_us);
        if due == 0 {
            return false;
        }
        let back = self.drop_first(due);
        self.journal.expired_through = Some(now_us);
        if back > 0 {
            give_back(b, back, now_us);
        }
        true
    }

    /// Records a lease on `terms` at `now_us` (the caller has taken the
    /// tokens) and returns its id: the first value of `draw` (masked to 53
    /// bits, [`MAX_ID`]) that is neither 0 nor held already.
    pub fn grant(
        &mut self,
        terms: Terms,
        now_us: i64,
        mut draw: impl FnMut() -> u64,
    ) -> Result<u64, GrantError> {
        if self.held.len() >= MAX_LEASES {
            return Err(GrantError::Full);
        }
        let id = loop {
            let id = draw() & MAX_ID;
            if id != 0 && !self.holds(id) {
                break id;
            }
        };
        let lease = Lease {
            id,
            n: terms.n,
            expires_us: now_us.saturating_add(terms.ttl_ms as i64 * 1000),
            keep: terms.keep,
        };
        self.insert(lease);
        self.journal.granted.push(lease);
        Ok(id)
    }

    /// Whether `grant` would succeed.
    pub fn has_room(&self) -> bool {
        self.held.len() < MAX_LEASES
    }

    /// Microseconds from `now_us` until `b` holds `level` nano-tokens,
    /// counting the tokens of held leases without `keep` as back at their
    /// expiry (a release can only make it sooner); `None` if it never will.
    /// Walks the leases by expiry and stops at the first that expires after
    /// the best wait found.
    pub fn micros_until(&self, b: &Bucket, level: i128, now_us: i64) -> Option<u64> {
        let mut best = b.micros_until(level, now_us);
        let mut back = 0i128;
        for l in &self.held {
            let until = l.expires_us.saturating_sub(now_us).max(0) as u64;
            if best.is_some_and(|w| until >= w) {
                break;
            }
            if l.keep {
                continue;
            }
            back += l.n as i128 * NANOS;
            let Some(refill) = b.micros_until(level - back, now_us) else {
                continue;
            };
            let wait = refill.max(until);
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
    /// Whole tokens that went back to the bucket: the increase of its
    /// level, which the cap at capacity may make less than the lease's `n`
    /// (or `n - used`), rounded down (0 when the bucket was full already);
    /// negative when `used` exceeded the lease and the overrun was charged,
    /// into debt if need be.
    pub returned: i128,
}

/// Releases lease `id` of the bucket at `now_us` (expired leases handled
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
    let at = leases.position(id)?;
    let lease = leases.remove_at(at);
    leases.journal.released.push(id);
    let nominal = lease.n as i128 - used.map_or(0, i128::from);
    b.settle(now_us);
    let returned = if nominal >= 0 {
        let before = b.tokens;
        give_back(b, nominal * NANOS, now_us);
        (b.tokens - before).div_euclid(NANOS)
    } else {
        b.tokens += nominal * NANOS;
        nominal
    };
    Some(Released { returned })
}

/// When the key holding `b` with `leases` may expire: once the bucket is
/// full with every held lease without `keep` back, and not before the
/// latest expiry of the leases (a release must find its lease until then).
/// A missing key reads as a full bucket, so an earlier expiry would mint
/// tokens. The leases are in expiry order, so the latest is the last.
pub fn key_expiry(b: &Bucket, leases: &Leases) -> Expiry {
    let Some(last) = leases.held.back() else {
        return b.expiry();
    };
    let cap = b.cap_nanos();
    let target = cap - leases.held_nanos();
    let full_us: i128 = if b.tokens >= target {
        b.updated_us as i128
    } else {
        match b.rate.micros_for((target - b.tokens) as u128) {
            Some(us) => b.updated_us as i128 + us.min(i128::MAX as u128 / 4) as i128,
            None => return Expiry::Never,
        }
    };
    let at_us = full_us.max(i128::from(last.expires_us));
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
        (o.retry_after_ms, o.wait_us) = crate::bucket::waits(Some(us));
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

    /// A deterministic stand-in for the CSPRNG: a splitmix64 sequence.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed;
        move || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
    }

    fn slot(n: u64, ttl_ms: u64) -> Terms {
        Terms {
            n,
            ttl_ms,
            keep: false,
        }
    }

    #[test]
    fn leases_come_back_on_release_once() {
        let l = lim(0, 1, 2);
        let mut leases = Leases::default();
        let o = consume(None, l, 2, Mode::All, T0);
        let mut b = o.bucket;
        let id = leases.grant(slot(2, 1000), T0, rng(1)).unwrap();
        assert!((1..=MAX_ID).contains(&id));
        assert_eq!(b.whole_tokens(T0), 0);
        let r = release(&mut b, &mut leases, id, None, T0 + 1);
        assert_eq!(r, Some(Released { returned: 2 }));
        assert_eq!(b.whole_tokens(T0 + 1), 2);
        assert_eq!(release(&mut b, &mut leases, id, None, T0 + 2), None);
        assert_eq!(b.whole_tokens(T0 + 2), 2);
    }

    #[test]
    fn expired_leases_return_lazily_in_expiry_order() {
        let l = lim(0, 1, 3);
        let mut leases = Leases::default();
        let mut draw = rng(2);
        let mut b = consume(None, l, 3, Mode::All, T0).bucket;
        let c = leases.grant(slot(2, 200), T0, &mut draw).unwrap();
        let a = leases.grant(slot(1, 100), T0, &mut draw).unwrap();
        assert_ne!(a, c);
        assert_eq!(leases.held[0].id, a, "held by expiry, not by grant");
        assert!(leases.is_valid());
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
    fn a_kept_lease_stays_used_at_expiry_and_a_slot_comes_back() {
        // An estimate (KEEP) and a slot, 5 tokens each, on a bucket of 10
        // that refills 1 token/s.
        let l = lim(1, 1, 10);
        let mut leases = Leases::default();
        let mut draw = rng(3);
        let mut b = consume(None, l, 10, Mode::All, T0).bucket;
        let estimate = Terms {
            n: 5,
            ttl_ms: 2_000,
            keep: true,
        };
        let kept = leases.grant(estimate, T0, &mut draw).unwrap();
        leases.grant(slot(5, 2_000), T0, &mut draw).unwrap();
        // Full with the slot back and 5 s of refill: the estimate is spent.
        assert_eq!(reset_after_ms(&b, &leases, T0), 5_000);
        assert_eq!(key_expiry(&b, &leases), Expiry::AtMs((T0 + 5 * SEC) / 1000));
        // At expiry: the slot's 5 come back, the estimate's do not.
        assert!(leases.expire(&mut b, T0 + 2 * SEC));
        assert!(leases.is_blank());
        assert_eq!(b.whole_tokens(T0 + 2 * SEC), 5 + 2);
        // Released before its expiry, a kept lease gives back what was not
        // used, as any lease does.
        let mut b = consume(None, l, 10, Mode::All, T0).bucket;
        let id = leases.grant(estimate, T0, &mut draw).unwrap();
        assert_ne!(id, kept);
        let r = release(&mut b, &mut leases, id, Some(2), T0).unwrap();
        assert_eq!(r.returned, 3);
    }

    #[test]
    fn the_release_reply_is_what_went_back_after_the_cap() {
        let l = lim(0, 1, 10);
        let mut leases = Leases::default();
        let mut draw = rng(4);
        let mut b = consume(None, l, 4, Mode::All, T0).bucket;
        let id = leases.grant(slot(4, 60_000), T0, &mut draw).unwrap();
        // Somebody refunded 3 meanwhile: only 1 of the 4 fits.
        b.tokens += 3 * NANOS;
        let r = release(&mut b, &mut leases, id, None, T0).unwrap();
        assert_eq!(r.returned, 1);
        assert_eq!(b.tokens, 10 * NANOS);
        // Full already: nothing went back.
        let id = leases.grant(slot(4, 60_000), T0, &mut draw).unwrap();
        assert_eq!(
            release(&mut b, &mut leases, id, None, T0).unwrap().returned,
            0
        );
        // Half a token short of full: 0 whole tokens went back (rounded down).
        b.tokens -= NANOS / 2;
        let id = leases.grant(slot(4, 60_000), T0, &mut draw).unwrap();
        assert_eq!(
            release(&mut b, &mut leases, id, None, T0).unwrap().returned,
            0
        );
    }

    #[test]
    fn ids_are_drawn_redrawn_on_a_held_id_and_never_zero() {
        let mut leases = Leases::default();
        let first = leases.grant(slot(1, 1000), T0, || 42).unwrap();
        assert_eq!(first, 42);
        let mut seq = [0u64, 42, 1 << 63 | 42, 43].into_iter();
        let id = leases
            .grant(slot(1, 1000), T0, || seq.next().unwrap())
            .unwrap();
        assert_eq!(
            id, 43,
            "0 and the held 42 (also with high bits set) redrawn"
        );
        let top = leases.grant(slot(1, 1000), T0, || u64::MAX).unwrap();
        assert_eq!(top, MAX_ID);
    }

    #[test]
    fn a_delta_brings_a_copy_to_exactly_the_same_leases() {
        let l = lim(0, 1, 100);
        let mut draw = rng(7);
        let mut master = Leases::default();
        let mut b = consume(None, l, 50, Mode::All, T0).bucket;
        for i in 0..6 {
            let keep = i % 2 == 0;
            let terms = Terms {
                n: 1 + i,
                ttl_ms: 1000 * (1 + i % 3),
                keep,
            };
            master.grant(terms, T0, &mut draw).unwrap();
        }
        master.clear_journal();
        let mut replica = master.clone();
        // One command: two leases expire, one is released, one granted.
        assert!(master.expire(&mut b, T0 + 1_000_000));
        let gone = master.held[1].id;
        release(&mut b, &mut master, gone, Some(1), T0 + 1_000_000).unwrap();
        master
            .grant(slot(3, 1000), T0 + 1_000_000, &mut draw)
            .unwrap();
        let d = master.delta();
        assert_eq!(d.expired_through, Some(T0 + 1_000_000));
        assert_eq!((d.released.len(), d.granted.len()), (1, 1));
        assert!(replica.apply(&d));
        assert_eq!(replica, master);
        for l in [&master, &replica] {
            let rebuilt = Leases::new(l.held.iter().copied().collect());
            assert_eq!(l.back_nanos, rebuilt.back_nanos);
        }
        // A command that dropped expired leases but wrote nothing puts them
        // back exactly.
        let mut undone = master.clone();
        undone.clear_journal();
        let before = undone.clone();
        assert!(undone.expire(&mut b, T0 + 3_000_000));
        undone.undo_expiry();
        assert_eq!(undone.held, before.held);
        assert_eq!(undone.back_nanos, before.back_nanos);
        // Applied again (or to other leases), it does not fit: refused.
        let before = replica.clone();
        assert!(!replica.apply(&d));
        assert_eq!(replica.held, before.held);
    }

    #[test]
    fn settling_charges_overruns_into_debt_and_refunds_below_capacity() {
        let l = lim(10, 1, 100);
        let mut leases = Leases::default();
        let mut draw = rng(5);
        let mut b = consume(None, l, 50, Mode::All, T0).bucket;
        let id = leases.grant(slot(50, 60_000), T0, &mut draw).unwrap();
        let r = release(&mut b, &mut leases, id, Some(170), T0).unwrap();
        assert_eq!(r.returned, -120);
        assert_eq!(b.tokens, -70 * NANOS);
        let o = consume(Some(&b), l, 1, Mode::All, T0);
        assert_eq!(o.retry_after_ms, 7_100);
        let mut b = consume(None, l, 50, Mode::All, T0).bucket;
        let id = leases.grant(slot(50, 60_000), T0, &mut draw).unwrap();
        // Refill brings it back to capacity: the refund cannot go above it,
        // and the reply says nothing went back.
        let r = release(&mut b, &mut leases, id, Some(10), T0 + 10 * SEC).unwrap();
        assert_eq!(r.returned, 0);
        assert_eq!(b.tokens, 100 * NANOS);
    }

    #[test]
    fn a_full_table_refuses_and_the_key_outlives_its_leases() {
        let mut leases = Leases::default();
        let mut draw = rng(6);
        for i in 0..MAX_LEASES {
            leases
                .grant(slot(1, 1000), T0 + i as i64, &mut draw)
                .unwrap();
        }
        assert_eq!(
            leases.grant(slot(1, 1000), T0, &mut draw),
            Err(GrantError::Full)
        );
        assert!(leases.is_valid());
        let b = Bucket {
            tokens: 0,
            ..Bucket::full(lim(0, 1, MAX_LEASES as u64), T0)
        };
        // Full again when the last lease is back: no earlier.
        let last = T0 + MAX_LEASES as i64 - 1 + 1_000_000;
        assert_eq!(key_expiry(&b, &leases), Expiry::AtMs((last + 999) / 1000));
        // A full bucket that holds no lease goes at once: ids no longer
        // keep a key.
        let full = Bucket::full(lim(0, 1, 1), T0);
        assert_eq!(key_expiry(&full, &Leases::default()), Expiry::Now);
    }
}
