//! One place decides what a consume call does: pure, no Redis types, the
//! clock (`now_us`) and the lease ids' randomness (`rng`) injected.
//!
//! Given the stored state of each bucket as it was read (the bucket and its
//! leases, nothing expired yet) and the request, [`consume`] and
//! [`mconsume`] expire the leases that are due, check the room for a new
//! lease, take (or reserve, or lend) the tokens, draw the lease ids, work out
//! what a denial waits for counting the leases' expiry, and return the new
//! state, the reply, the kind of outcome (for statistics and `TB.TOP`) and
//! what the wait queue needs. [`consume_dry`] and [`mconsume_dry`] answer
//! the denial a queued call would get, writing nothing. The handlers in
//! `commands/` only open the keys, call these, commit and reply.

use std::ops::{Deref, DerefMut};

use crate::bucket::{self, Bucket, Kind, Limits, Mode, MultiOutcome, Outcome, Part, NANOS};
use crate::errors;
use crate::lease::{self, Leases, Terms};
use crate::parse::{ConsumeArgs, MconsumeArgs, Request, Wait};

/// How a call is served, besides what it decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Serve {
    /// Answered at once.
    Now,
    /// `TB.CONSUME ... BLOCK ms` without `LEASE` or `FLOW`: a reservation
    /// made now whose reply the server holds until it is due.
    Hold,
    /// Waits in the queue of a bucket for at most this many ms (`BLOCK`
    /// with `LEASE` or `FLOW`, `TB.MCONSUME ... BLOCK`), tried as if
    /// without `BLOCK`.
    Queue(u64),
}

/// `LEASE ttl-ms [KEEP]`: the tokens granted are lent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lend {
    /// How long until the lease expires, in ms.
    pub ttl_ms: u64,
    /// Its tokens stay used when it expires.
    pub keep: bool,
}

/// What a `TB.CONSUME` asks of its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeRequest {
    /// The bucket's limits.
    pub limits: Limits,
    /// Tokens asked (0: a peek).
    pub n: u64,
    /// How a shortfall is treated.
    pub mode: Mode,
    /// The lease asked for, if any.
    pub lease: Option<Lend>,
    /// A reservation's reply is held server-side until due ([`Serve::Hold`]).
    pub hold: bool,
}

/// The wait in ms a `RESERVE ms` or `BLOCK ms` asks for, if any.
pub fn wait_ms(wait: Wait) -> Option<u64> {
    match wait {
        Wait::No => None,
        Wait::Reserve(ms) | Wait::Block(ms) => Some(ms),
    }
}

/// Refuses a wait longer than `max_wait_ms` (the `tb.max-wait-ms` setting).
pub fn check_wait(ms: Option<u64>, max_wait_ms: u64) -> Result<(), String> {
    match ms {
        Some(ms) if ms > max_wait_ms => Err(errors::wait_exceeds(max_wait_ms)),
        _ => Ok(()),
    }
}

impl ConsumeRequest {
    /// The request `TB.CONSUME`'s arguments make, and how it is served. A
    /// queued call is tried as without `BLOCK` ([`Mode::All`]).
    pub fn of(a: &ConsumeArgs) -> (ConsumeRequest, Serve) {
        let o = a.options;
        let lease = a.lease_ttl_ms.map(|ttl_ms| Lend {
            ttl_ms,
            keep: a.lease_keep,
        });
        let (mode, serve) = match o.wait {
            Wait::Block(ms) if lease.is_some() || a.flow.is_some() => (Mode::All, Serve::Queue(ms)),
            Wait::Block(ms) => (reserve(ms), Serve::Hold),
            Wait::Reserve(ms) => (reserve(ms), Serve::Now),
            Wait::No if o.atmost => (
                Mode::AtMost {
                    min: o.min.unwrap_or(1),
                },
                Serve::Now,
            ),
            Wait::No => (Mode::All, Serve::Now),
        };
        let req = ConsumeRequest {
            limits: a.limits,
            n: o.n,
            mode,
            lease,
            hold: serve == Serve::Hold,
        };
        (req, serve)
    }

    /// The whole tokens a denial waits for: one for a peek, the chunk (at
    /// most `n`) for `ATMOST`, else all `n`.
    pub fn target(&self) -> u64 {
        match (self.n, self.mode) {
            (0, _) => 1,
            (n, Mode::AtMost { min }) => min.min(n),
            (n, _) => n,
        }
    }

    /// It asks more than the bucket's capacity: it can never fit.
    pub fn never(&self) -> bool {
        self.n > self.limits.capacity
    }
}

fn reserve(ms: u64) -> Mode {
    Mode::Reserve {
        max_wait_us: ms * 1000,
    }
}

/// What one try of a call tells the wait queue, with its reply (the
/// queue's `Try`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Granted (and to be written).
    pub granted: bool,
    /// The denial's wait in ms (-1: no refill or lease expiry makes it fit).
    pub retry_after_ms: i64,
    /// The same wait in µs, exact: when the wait queue tries it again (a
    /// wait rounded up to a millisecond would grant it late, and a bucket
    /// full by then would lose the refill in between).
    pub wait_us: i64,
    /// It asks more of a bucket than its capacity.
    pub never: bool,
    /// The part (index into the call's keys) that makes a denial wait.
    pub blocking: usize,
    /// The reply, as the call's non-blocking form answers.
    pub reply: Vec<i64>,
}

/// The integers of a `TB.CONSUME` reply: five, or six with `LEASE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ints {
    ints: [i64; 6],
    len: usize,
}

impl Deref for Ints {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        &self.ints[..self.len]
    }
}

/// What a `TB.CONSUME` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The kind, the reply's fields, the new bucket and whether it must be
    /// written (`dirty`); what statistics and `TB.TOP` record.
    pub outcome: Outcome,
    /// With `LEASE`: the lease's id, 0 when denied.
    pub lease_id: Option<u64>,
    /// The reply waits server-side until the reservation is due.
    pub hold: bool,
    /// The request can never fit (n > capacity).
    pub never: bool,
}

impl Decision {
    /// `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`,
    /// and the lease id with `LEASE`.
    pub fn reply(&self) -> Ints {
        let o = &self.outcome;
        let ints = [
            i64::from(o.allowed()),
            o.remaining as i64,
            o.retry_after_ms,
            o.reset_after_ms,
            o.granted as i64,
            self.lease_id.unwrap_or(0) as i64,
        ];
        let len = if self.lease_id.is_some() { 6 } else { 5 };
        Ints { ints, len }
    }

    /// What the wait queue needs of it.
    pub fn answer(&self) -> Answer {
        Answer {
            granted: self.outcome.allowed(),
            retry_after_ms: self.outcome.retry_after_ms,
            wait_us: self.outcome.wait_us,
            never: self.never,
            blocking: 0,
            reply: self.reply().to_vec(),
        }
    }
}

/// The stored bucket as of `now_us`: the leases expired by then are dropped
/// from `leases` and the tokens of those without `KEEP` are back in it.
pub fn expire(stored: Option<Bucket>, leases: &mut Leases, now_us: i64) -> Option<Bucket> {
    stored.map(|mut b| {
        leases.expire(&mut b, now_us);
        b
    })
}

/// Decides a `TB.CONSUME` on the bucket `stored` (as read) and its
/// `leases` (changed in place: expired, granted): takes, reserves or lends
/// the tokens, or denies with the wait counting the leases' expiry. With
/// `LEASE` on a bucket that holds [`lease::MAX_LEASES`], the error line,
/// and nothing to write.
pub fn consume(
    stored: Option<Bucket>,
    leases: &mut Leases,
    req: &ConsumeRequest,
    now_us: i64,
    rng: impl FnMut() -> u64,
) -> Result<Decision, &'static str> {
    let stored = expire(stored, leases, now_us);
    if req.lease.is_some() && !leases.has_room() {
        return Err(errors::ERR_LEASE_FULL);
    }
    let mut o = bucket::consume(stored.as_ref(), req.limits, req.n, req.mode, now_us);
    let lease_id = req.lease.map(|l| match o.kind {
        Kind::Allowed => {
            let terms = Terms {
                n: req.n,
                ttl_ms: l.ttl_ms,
                keep: l.keep,
            };
            leases.grant(terms, now_us, rng).unwrap_or(0)
        }
        _ => 0,
    });
    lease::wait_with_leases(&mut o, leases, req.target(), now_us);
    Ok(Decision {
        outcome: o,
        lease_id,
        hold: req.hold && o.kind == Kind::Reserved,
        never: req.never(),
    })
}

/// The denial a queued `TB.CONSUME` would get now, writing nothing: `[0,
/// tokens, wait, reset_after_ms, 0]` (and a lease id of 0 with `LEASE`),
/// the wait counting the leases' expiry (0 if it would fit now).
pub fn consume_dry(
    stored: Option<Bucket>,
    leases: &mut Leases,
    req: &ConsumeRequest,
    now_us: i64,
) -> Answer {
    let stored = expire(stored, leases, now_us);
    let left = stored.map_or(req.limits.capacity, |b| b.whole_tokens(now_us));
    let mut o = bucket::consume(stored.as_ref(), req.limits, req.n, Mode::All, now_us);
    lease::wait_with_leases(&mut o, leases, req.n.max(1), now_us);
    let (retry, wait_us) = if o.kind == Kind::Allowed {
        (0, 0)
    } else {
        (o.retry_after_ms, o.wait_us)
    };
    let mut reply = vec![0, left as i64, retry, o.reset_after_ms, 0];
    if req.lease.is_some() {
        reply.push(0);
    }
    Answer {
        granted: false,
        retry_after_ms: retry,
        wait_us,
        never: req.never(),
        blocking: 0,
        reply,
    }
}

/// What a `TB.MCONSUME` asks: a request and a lease (its TTL, and `KEEP`)
/// per key, in key order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultiRequest<'a> {
    /// Each key's limits and `n`.
    pub requests: &'a [Request],
    /// Each key's lease TTL in ms, if it is leased.
    pub leases: &'a [Option<u64>],
    /// Whether each key's lease keeps its tokens used when it expires.
    pub keep: &'a [bool],
    /// How a shortfall is treated.
    pub mode: Mode,
    /// The call waits in a queue (`BLOCK`): a denial names the part that
    /// makes it wait.
    pub queued: bool,
}

impl<'a> MultiRequest<'a> {
    /// The request `TB.MCONSUME`'s arguments make, and how it is served.
    pub fn of(a: &'a MconsumeArgs) -> (MultiRequest<'a>, Serve) {
        let (mode, serve) = match (a.block_ms, a.reserve_ms, a.atmost) {
            (Some(ms), _, _) => (Mode::All, Serve::Queue(ms)),
            (None, Some(ms), _) => (reserve(ms), Serve::Now),
            (None, None, Some(min)) => (Mode::AtMost { min }, Serve::Now),
            (None, None, None) => (Mode::All, Serve::Now),
        };
        let req = MultiRequest {
            requests: &a.requests,
            leases: &a.leases,
            keep: &a.keep,
            mode,
            queued: a.block_ms.is_some(),
        };
        (req, serve)
    }

    fn any_lease(&self) -> bool {
        self.leases.iter().any(Option::is_some)
    }

    /// Some part asks more than its bucket's capacity.
    fn never(&self) -> bool {
        self.requests.iter().any(|r| r.n > r.limits.capacity)
    }
}

/// One bucket of a multi-bucket call as read: its stored bucket, nothing
/// expired yet, and its leases, which the decision changes in place. The
/// glue's open keys are such states (without a copy); [`PartState`] is the
/// plain one.
pub trait BucketState {
    /// The stored bucket (`None` for a missing key).
    fn stored(&self) -> Option<Bucket>;
    /// Its leases.
    fn leases(&mut self) -> &mut Leases;
}

/// A [`BucketState`] of its own: the stored bucket (`None` for a missing
/// key) and its leases (`Leases` behind any mutable pointer).
pub struct PartState<L> {
    /// The stored bucket, nothing expired yet.
    pub stored: Option<Bucket>,
    /// Its leases.
    pub leases: L,
}

impl<L: DerefMut<Target = Leases>> BucketState for PartState<L> {
    fn stored(&self) -> Option<Bucket> {
        self.stored
    }

    fn leases(&mut self) -> &mut Leases {
        &mut self.leases
    }
}

/// What a `TB.MCONSUME` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiDecision {
    /// The kind, the new buckets and which to write, what `TB.TOP` records.
    pub outcome: MultiOutcome,
    /// Each part's lease id (0 without a lease or when denied).
    pub ids: Vec<u64>,
    /// The part that makes a denial wait.
    pub blocking: usize,
    /// Some part can never fit (n > capacity).
    pub never: bool,
    /// An `ATMOST` call granted, but less than it asked.
    pub partial: bool,
    /// Tokens taken, over every part.
    pub tokens: u64,
    /// `[allowed, retry_after_ms, remaining...]`, `granted` with `ATMOST`,
    /// then the lease ids with any `LEASE`.
    pub reply: Vec<i64>,
}

impl MultiDecision {
    /// What the wait queue needs of it.
    pub fn into_answer(self) -> Answer {
        Answer {
            granted: self.outcome.allowed,
            retry_after_ms: self.outcome.retry_after_ms,
            wait_us: self.outcome.wait_us,
            never: self.never,
            blocking: self.blocking,
            reply: self.reply,
        }
    }
}

/// Each part's bucket as of `now_us` (its leases expired) with what the
/// call asks of it.
fn expire_parts<S: BucketState>(parts: &mut [S], req: &MultiRequest, now_us: i64) -> Vec<Part> {
    parts
        .iter_mut()
        .zip(req.requests)
        .map(|(p, r)| Part {
            stored: expire(p.stored(), p.leases(), now_us),
            limits: r.limits,
            n: r.n,
        })
        .collect()
}

/// Decides a `TB.MCONSUME`, all or nothing, on the buckets of `parts` (as
/// read; their leases changed in place). A lease is never reserved: a
/// leased part short now denies the whole call, with the wait for the
/// leased parts. With a lease asked of a bucket that holds
/// [`lease::MAX_LEASES`], the error line, and nothing to write.
pub fn mconsume<S: BucketState>(
    parts: &mut [S],
    req: &MultiRequest,
    now_us: i64,
    mut rng: impl FnMut() -> u64,
) -> Result<MultiDecision, &'static str> {
    let bparts = expire_parts(parts, req, now_us);
    let leased = req.leases;
    if leased
        .iter()
        .zip(parts.iter_mut())
        .any(|(l, p)| l.is_some() && !p.leases().has_room())
    {
        return Err(errors::ERR_LEASE_FULL);
    }
    let short: Vec<usize> = (0..bparts.len())
        .filter(|&j| leased[j].is_some() && !fits_now(&bparts[j], now_us))
        .collect();
    let mode = if short.is_empty() {
        req.mode
    } else {
        Mode::All
    };
    let mut o = bucket::consume_all(&bparts, mode, now_us);
    let any_held = parts.iter_mut().any(|p| !p.leases().is_blank());
    let mut blocking = 0;
    if (!o.allowed && any_held) || !short.is_empty() {
        let wait;
        (wait, blocking) = wait_with_leases(&o, parts, &short, now_us);
        (o.retry_after_ms, o.wait_us) = bucket::waits(wait);
        if !o.allowed {
            o.kind = if o.retry_after_ms < 0 {
                Kind::Never
            } else {
                Kind::Denied
            };
        }
    } else if !o.allowed && req.queued {
        blocking = wait_with_leases(&o, parts, &[], now_us).1;
    }
    let mut ids = vec![0u64; bparts.len()];
    if o.allowed {
        for (j, ttl) in leased.iter().enumerate() {
            if let Some(ttl) = *ttl {
                let terms = Terms {
                    n: bparts[j].n,
                    ttl_ms: ttl,
                    keep: req.keep[j],
                };
                ids[j] = parts[j]
                    .leases()
                    .grant(terms, now_us, &mut rng)
                    .unwrap_or(0);
            }
        }
    }
    let atmost = matches!(req.mode, Mode::AtMost { .. });
    let asked = bparts.iter().map(|p| p.n).max().unwrap_or(0);
    let k = o.remaining.len();
    let lease_ids = if req.any_lease() { k } else { 0 };
    let mut reply = Vec::with_capacity(2 + k + usize::from(atmost) + lease_ids);
    reply.push(i64::from(o.allowed));
    reply.push(o.retry_after_ms);
    reply.extend(o.remaining.iter().map(|&left| left as i64));
    if atmost {
        reply.push(o.granted as i64);
    }
    if lease_ids > 0 {
        reply.extend(ids.iter().map(|&id| id as i64));
    }
    Ok(MultiDecision {
        partial: atmost && o.allowed && o.granted < asked,
        tokens: o.taken.iter().sum(),
        never: req.never(),
        outcome: o,
        ids,
        blocking,
        reply,
    })
}

/// Whether part `p` alone would give its `n` now.
fn fits_now(p: &Part, now_us: i64) -> bool {
    bucket::consume(p.stored.as_ref(), p.limits, p.n, Mode::All, now_us).kind == Kind::Allowed
}

/// The denial a queued `TB.MCONSUME` would get now, writing nothing:
/// `[0, wait, tokens...]` (and a 0 per part with any `LEASE`), the wait
/// counting the leases' expiry (0 if it would fit now).
pub fn mconsume_dry<S: BucketState>(parts: &mut [S], req: &MultiRequest, now_us: i64) -> Answer {
    let bparts = expire_parts(parts, req, now_us);
    let o = bucket::consume_all(&bparts, Mode::All, now_us);
    let (wait, blocking) = if o.allowed {
        (Some(0), 0)
    } else {
        wait_with_leases(&o, parts, &[], now_us)
    };
    let (retry, wait_us) = bucket::waits(wait);
    let mut reply = vec![0, retry];
    reply.extend(bparts.iter().map(|p| {
        p.stored
            .map_or(p.limits.capacity, |b| b.whole_tokens(now_us)) as i64
    }));
    if req.any_lease() {
        reply.extend(bparts.iter().map(|_| 0));
    }
    Answer {
        granted: false,
        retry_after_ms: retry,
        wait_us,
        never: req.never(),
        blocking,
        reply,
    }
}

/// The wait in µs of a multi-bucket denial counting the held leases'
/// expiry (each part waits for what it needs, `o.need`): the longest over
/// the parts in `only` (the leased parts short now), or over every part
/// when `only` is empty; `None` if one of them can never succeed. With it, the
/// part that makes the call wait (the first with the longest wait, or the
/// one that never succeeds).
fn wait_with_leases<S: BucketState>(
    o: &MultiOutcome,
    parts: &mut [S],
    only: &[usize],
    now_us: i64,
) -> (Option<u64>, usize) {
    let mut every = 0..o.need.len();
    let mut listed = only.iter().copied();
    let which: &mut dyn Iterator<Item = usize> = if only.is_empty() {
        &mut every
    } else {
        &mut listed
    };
    let (mut wait, mut part) = (0u64, only.first().copied().unwrap_or(0));
    for j in which {
        let b = &o.buckets[j];
        if o.need[j] > b.capacity {
            return (None, j);
        }
        let level = o.need[j] as i128 * NANOS;
        match parts[j].leases().micros_until(b, level, now_us) {
            Some(us) if us > wait => (wait, part) = (us, j),
            Some(_) => {}
            None => return (None, j),
        }
    }
    (Some(wait), part)
}

#[cfg(test)]
mod tests {
    //! Every branch of the decision on a virtual clock (`T0` plus offsets),
    //! ids from a seeded generator, as `x/time/rate`'s tests drive
    //! `reserveN`: each step states the time, the request and the answer.

    use super::*;
    use crate::bucket::Rate;
    use crate::lease::MAX_LEASES;
    use crate::parse;

    const SEC: i64 = 1_000_000;
    const MS: i64 = 1_000;
    const T0: i64 = 1_700_000_000 * SEC;

    /// A deterministic stand-in for the CSPRNG (splitmix64).
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

    fn words(line: &str) -> Vec<&[u8]> {
        line.split_whitespace().map(str::as_bytes).collect()
    }

    /// The request of `TB.CONSUME <line>` (the key included).
    fn req(line: &str) -> (ConsumeRequest, Serve) {
        let line = format!("tb.consume {line}");
        let argv = words(&line);
        ConsumeRequest::of(&parse::consume_args(&argv[..]).unwrap())
    }

    /// A bucket of `limits` holding `tokens` whole tokens at `at`.
    fn holding(rate: u128, cap: u64, tokens: i128, at: i64) -> Bucket {
        let limits = Limits {
            rate: Rate::new(rate, 1).unwrap(),
            capacity: cap,
        };
        Bucket {
            tokens: tokens * NANOS,
            ..Bucket::full(limits, at)
        }
    }

    /// One `TB.CONSUME` decision on `stored` and `leases` at `now`.
    fn run(
        stored: Option<Bucket>,
        leases: &mut Leases,
        line: &str,
        now: i64,
    ) -> Result<Decision, &'static str> {
        consume(stored, leases, &req(line).0, now, rng(1))
    }

    /// `leases` holding one lease of `n` tokens, `ttl_ms` long from `at`.
    fn lent(leases: &mut Leases, n: u64, ttl_ms: u64, keep: bool, at: i64) -> u64 {
        let terms = Terms { n, ttl_ms, keep };
        let id = leases.grant(terms, at, rng(9)).unwrap();
        leases.clear_journal();
        id
    }

    #[test]
    fn requests_map_the_arguments_to_a_mode_and_a_way_to_serve() {
        let (r, s) = req("k 1 10");
        assert_eq!(
            (r.n, r.mode, r.lease, r.hold, s),
            (1, Mode::All, None, false, Serve::Now)
        );
        let (r, s) = req("k 1 10 3 RESERVE 250");
        assert_eq!(
            r.mode,
            Mode::Reserve {
                max_wait_us: 250_000
            }
        );
        assert_eq!((r.hold, s), (false, Serve::Now));
        let (r, s) = req("k 1 10 3 BLOCK 250");
        assert_eq!(
            r.mode,
            Mode::Reserve {
                max_wait_us: 250_000
            }
        );
        assert_eq!((r.hold, s), (true, Serve::Hold));
        // A lease or a flow with BLOCK waits in the queue, tried as All.
        let (r, s) = req("k 1 10 3 BLOCK 250 LEASE 1000 KEEP");
        let lend = Lend {
            ttl_ms: 1000,
            keep: true,
        };
        assert_eq!((r.mode, r.lease, r.hold), (Mode::All, Some(lend), false));
        assert_eq!(s, Serve::Queue(250));
        assert_eq!(req("k 1 10 3 BLOCK 0 FLOW t").1, Serve::Queue(0));
        // What a denial waits for: all n, the chunk for ATMOST, 1 for a peek.
        assert_eq!(req("k 1 10 3 ATMOST").0.mode, Mode::AtMost { min: 1 });
        assert_eq!(req("k 1 10 5 ATMOST MIN 4").0.target(), 4);
        assert_eq!(req("k 1 10 3 ATMOST MIN 4").0.target(), 3);
        assert_eq!(req("k 1 10 0").0.target(), 1);
        assert_eq!(req("k 1 10 7").0.target(), 7);
        assert!(req("k 1 10 11").0.never() && !req("k 1 10 10").0.never());
        // The longest wait the setting allows.
        assert_eq!(wait_ms(Wait::No), None);
        assert_eq!(check_wait(Some(500), 500), Ok(()));
        assert_eq!(check_wait(None, 0), Ok(()));
        assert_eq!(
            check_wait(Some(501), 500),
            Err("ERR wait exceeds tb.max-wait-ms (500)".to_string())
        );
    }

    #[test]
    fn grant_then_deny_then_grant_after_the_refill() {
        let mut leases = Leases::default();
        // T0: a missing key is a full bucket of 10 (1 token/s).
        let d = run(None, &mut leases, "k 1 10 4", T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Allowed);
        assert!(d.outcome.dirty && !d.hold && !d.never);
        assert_eq!(&*d.reply(), &[1, 6, 0, 4000, 4]);
        let b = d.outcome.bucket;
        // T0 + 0.5 s: 6.5 tokens; 7 are 500 ms away; nothing written.
        let d = run(Some(b), &mut leases, "k 1 10 7", T0 + 500 * MS).unwrap();
        assert_eq!(d.outcome.kind, Kind::Denied);
        assert!(!d.outcome.dirty);
        assert_eq!(&*d.reply(), &[0, 6, 500, 3500, 0]);
        // T0 + 1 s: 7 tokens.
        let d = run(Some(b), &mut leases, "k 1 10 7", T0 + SEC).unwrap();
        assert_eq!(&*d.reply(), &[1, 0, 0, 10_000, 7]);
        let a = d.answer();
        assert_eq!(
            (a.granted, a.retry_after_ms, a.never, a.blocking),
            (true, 0, false, 0)
        );
        assert_eq!(a.reply, vec![1, 0, 0, 10_000, 7]);
    }

    #[test]
    fn never_fits_when_n_exceeds_the_capacity() {
        let mut leases = Leases::default();
        let d = run(None, &mut leases, "k 1 10 11", T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Never);
        assert!(d.never && !d.outcome.dirty);
        assert_eq!(&*d.reply(), &[0, 10, -1, 0, 0]);
        // Rate 0 and too few tokens: never, too.
        let d = run(Some(holding(0, 10, 2, T0)), &mut leases, "k 0 10 3", T0).unwrap();
        assert_eq!(
            (d.outcome.kind, d.outcome.retry_after_ms, d.never),
            (Kind::Never, -1, false)
        );
    }

    #[test]
    fn a_reservation_goes_into_debt_within_the_wait_and_holds_with_block() {
        let mut leases = Leases::default();
        let empty = holding(1, 10, 0, T0);
        let d = run(Some(empty), &mut leases, "k 1 10 2 RESERVE 2000", T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Reserved);
        assert!(d.outcome.dirty && !d.hold);
        assert_eq!(&*d.reply(), &[1, 0, 2000, 12_000, 2]);
        assert_eq!(d.outcome.bucket.tokens, -2 * NANOS);
        // Further than the wait: denied, nothing taken.
        let d = run(Some(empty), &mut leases, "k 1 10 3 RESERVE 2000", T0).unwrap();
        assert_eq!((d.outcome.kind, d.outcome.dirty), (Kind::Denied, false));
        assert_eq!(&*d.reply(), &[0, 0, 3000, 10_000, 0]);
        // BLOCK: a reservation's reply is held; an immediate grant's is not.
        let d = run(Some(empty), &mut leases, "k 1 10 2 BLOCK 2000", T0).unwrap();
        assert!(d.hold);
        let d = run(None, &mut leases, "k 1 10 2 BLOCK 2000", T0).unwrap();
        assert_eq!((d.outcome.kind, d.hold), (Kind::Allowed, false));
    }

    #[test]
    fn atmost_grants_what_is_there_down_to_the_chunk_and_waits_for_the_chunk() {
        let mut leases = Leases::default();
        let four = holding(1, 10, 4, T0);
        let d = run(Some(four), &mut leases, "k 1 10 8 ATMOST MIN 3", T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Allowed);
        assert_eq!(&*d.reply(), &[1, 0, 0, 10_000, 4]);
        let two = holding(1, 10, 2, T0);
        let d = run(Some(two), &mut leases, "k 1 10 8 ATMOST MIN 3", T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Denied);
        assert_eq!(&*d.reply(), &[0, 2, 1000, 8000, 0]);
        // Plain ATMOST waits for one token.
        let none = holding(1, 10, 0, T0);
        let d = run(Some(none), &mut leases, "k 1 10 8 ATMOST", T0 + 250 * MS).unwrap();
        assert_eq!(&*d.reply(), &[0, 0, 750, 9750, 0]);
    }

    #[test]
    fn a_peek_writes_nothing_and_says_when_one_token_is_there() {
        let mut leases = Leases::default();
        let d = run(Some(holding(1, 10, 3, T0)), &mut leases, "k 1 10 0", T0).unwrap();
        assert_eq!((d.outcome.kind, d.outcome.dirty), (Kind::Peek, false));
        assert_eq!(&*d.reply(), &[1, 3, 0, 7000, 0]);
        let d = run(Some(holding(1, 10, 0, T0)), &mut leases, "k 1 10 0", T0).unwrap();
        assert_eq!(&*d.reply(), &[0, 0, 1000, 10_000, 0]);
        let a = d.answer();
        assert_eq!((a.granted, a.retry_after_ms), (false, 1000));
    }

    #[test]
    fn a_lease_is_granted_with_a_drawn_id_and_counted_in_the_reset() {
        let mut leases = Leases::default();
        // A concurrency limit: rate 0, 2 slots.
        let d = run(None, &mut leases, "k 0 2 1 LEASE 1000", T0).unwrap();
        let id = d.lease_id.unwrap();
        assert!((1..=lease::MAX_ID).contains(&id));
        assert_eq!(leases.held.len(), 1);
        assert_eq!(leases.held[0].expires_us, T0 + SEC);
        // Full again when the lease is back: 1 s, not never.
        assert_eq!(&*d.reply(), &[1, 1, 0, 1000, 1, id as i64]);
        assert_eq!(d.reply().len(), 6);
        // The same draw gives the same id: the randomness is the caller's.
        let mut again = Leases::default();
        let d2 = run(None, &mut again, "k 0 2 1 LEASE 1000", T0).unwrap();
        assert_eq!(d2.lease_id, Some(id));
        // KEEP: its tokens stay used at expiry, so a bucket that does not
        // refill is never full again.
        let mut kept = Leases::default();
        let d = run(None, &mut kept, "k 0 2 1 LEASE 1000 KEEP", T0).unwrap();
        assert!(kept.held[0].keep);
        assert_eq!(d.outcome.reset_after_ms, -1);
    }

    #[test]
    fn a_denied_lease_waits_for_the_first_lease_that_frees_enough() {
        let mut leases = Leases::default();
        lent(&mut leases, 1, 300, false, T0);
        lent(&mut leases, 1, 800, false, T0);
        let out = holding(0, 2, 0, T0);
        // Rate 0, both slots lent: not never, but when the first comes back.
        let d = run(Some(out), &mut leases, "k 0 2 1 LEASE 1000", T0 + 100 * MS).unwrap();
        assert_eq!(d.outcome.kind, Kind::Denied);
        assert_eq!(d.lease_id, Some(0));
        assert_eq!(&*d.reply(), &[0, 0, 200, 700, 0, 0]);
        assert_eq!(leases.held.len(), 2, "nothing granted");
        // Two slots: until the second is back.
        let d = run(Some(out), &mut leases, "k 0 2 2 LEASE 1000", T0 + 100 * MS).unwrap();
        assert_eq!(d.outcome.retry_after_ms, 700);
        // A KEEP lease never comes back by itself: never.
        let mut kept = Leases::default();
        lent(&mut kept, 2, 300, true, T0);
        let d = run(Some(out), &mut kept, "k 0 2 1", T0).unwrap();
        assert_eq!(
            (d.outcome.kind, d.outcome.retry_after_ms),
            (Kind::Never, -1)
        );
        // A lease-aware wait can be shorter than the refill.
        let mut slow = Leases::default();
        lent(&mut slow, 5, 2000, false, T0);
        let d = run(Some(holding(1, 10, 0, T0)), &mut slow, "k 1 10 5", T0).unwrap();
        assert_eq!(d.outcome.retry_after_ms, 2000);
    }

    #[test]
    fn a_full_lease_table_is_an_error_that_changes_nothing() {
        let mut leases = Leases::default();
        let mut draw = rng(3);
        for i in 0..MAX_LEASES as i64 {
            let terms = Terms {
                n: 1,
                ttl_ms: 1000,
                keep: false,
            };
            leases.grant(terms, T0 + i, &mut draw).unwrap();
        }
        leases.clear_journal();
        let b = holding(0, 2000, 976, T0);
        let before = leases.clone();
        let full = run(Some(b), &mut leases, "k 0 2000 1 LEASE 1000", T0);
        assert_eq!(full, Err(errors::ERR_LEASE_FULL));
        assert_eq!(leases, before);
        // Without LEASE the table does not matter.
        assert!(run(Some(b), &mut leases, "k 0 2000 1", T0).is_ok());
        // Once the first lease expired there is room again.
        let d = run(Some(b), &mut leases, "k 0 2000 1 LEASE 1000", T0 + SEC).unwrap();
        assert_ne!(d.lease_id, Some(0));
        assert_eq!(leases.held.len(), MAX_LEASES);
    }

    #[test]
    fn expired_leases_give_their_tokens_back_unless_kept() {
        let mut leases = Leases::default();
        lent(&mut leases, 2, 1000, false, T0);
        lent(&mut leases, 3, 1000, true, T0);
        let out = holding(0, 5, 0, T0);
        // At expiry both are dropped; the slot's 2 come back, the KEEP's 3 not.
        let d = run(Some(out), &mut leases, "k 0 5 2", T0 + SEC).unwrap();
        assert!(leases.is_blank());
        assert_eq!(leases.delta().expired_through, Some(T0 + SEC));
        assert_eq!(d.outcome.kind, Kind::Allowed);
        assert_eq!(d.outcome.bucket.tokens, 0);
        assert!(d.outcome.dirty);
        // A peek right at expiry writes nothing (the stored state keeps the
        // leases, which reads the same) but sees the tokens.
        let mut leases = Leases::default();
        lent(&mut leases, 2, 1000, false, T0);
        let d = run(Some(out), &mut leases, "k 0 5 0", T0 + SEC).unwrap();
        assert_eq!((d.outcome.dirty, d.outcome.remaining), (false, 2));
        assert_eq!(expire(None, &mut leases, T0), None);
    }

    #[test]
    fn the_dry_form_answers_the_denial_and_grants_nothing() {
        let mut leases = Leases::default();
        lent(&mut leases, 2, 400, false, T0);
        let (r, _) = req("k 0 2 2 BLOCK 1000 LEASE 5000");
        let a = consume_dry(Some(holding(0, 2, 0, T0)), &mut leases, &r, T0);
        assert_eq!(
            a,
            Answer {
                granted: false,
                retry_after_ms: 400,
                wait_us: 400_000,
                never: false,
                blocking: 0,
                reply: vec![0, 0, 400, 400, 0, 0],
            }
        );
        assert_eq!(leases.held.len(), 1);
        // It would fit now: the wait is 0, still no grant.
        let (r, _) = req("k 1 10 3 BLOCK 1000 FLOW a");
        let a = consume_dry(None, &mut Leases::default(), &r, T0);
        assert_eq!((a.granted, a.retry_after_ms), (false, 0));
        assert_eq!(a.reply, vec![0, 10, 0, 3000, 0]);
        // Tokens as stored (old limits), the wait on the new ones.
        let (r, _) = req("k 1 20 25 BLOCK 1000 FLOW a");
        let a = consume_dry(Some(holding(1, 10, 4, T0)), &mut Leases::default(), &r, T0);
        assert!(a.never);
        assert_eq!(a.reply, vec![0, 4, -1, 16_000, 0]);
    }

    fn parts_of(
        buckets: Vec<Option<Bucket>>,
        leases: &mut [Leases],
    ) -> Vec<PartState<&mut Leases>> {
        buckets
            .into_iter()
            .zip(leases.iter_mut())
            .map(|(stored, leases)| PartState { stored, leases })
            .collect()
    }

    /// A `TB.MCONSUME <line>` request's arguments (numkeys included).
    fn margs(line: &str) -> Vec<&[u8]> {
        words(line)
    }

    fn mrun(
        line: &str,
        buckets: Vec<Option<Bucket>>,
        leases: &mut [Leases],
        now: i64,
    ) -> Result<MultiDecision, &'static str> {
        let argv = [&[b"tb.mconsume".as_slice()][..], &margs(line)].concat();
        let a = parse::mconsume_args(&argv[..]).unwrap();
        let (r, _) = MultiRequest::of(&a);
        mconsume(&mut parts_of(buckets, leases), &r, now, rng(2))
    }

    fn fresh(k: usize) -> Vec<Leases> {
        vec![Leases::default(); k]
    }

    #[test]
    fn multi_requests_map_the_arguments() {
        let argv = words("tb.mconsume 2 a b 1 10 1 1 10 2 BLOCK 300 LEASE 2 1000 KEEP");
        let a = parse::mconsume_args(&argv[..]).unwrap();
        let (r, s) = MultiRequest::of(&a);
        assert_eq!((r.mode, r.queued, s), (Mode::All, true, Serve::Queue(300)));
        assert_eq!(
            (r.leases, r.keep),
            (&[None, Some(1000)][..], &[false, true][..])
        );
        let argv = words("tb.mconsume 1 a 1 10 1 RESERVE 300");
        let a = parse::mconsume_args(&argv[..]).unwrap();
        let (r, s) = MultiRequest::of(&a);
        assert_eq!(
            (r.mode, r.queued, s),
            (
                Mode::Reserve {
                    max_wait_us: 300_000
                },
                false,
                Serve::Now
            )
        );
        let argv = words("tb.mconsume 1 a 1 10 5 ATMOST MIN 2");
        let a = parse::mconsume_args(&argv[..]).unwrap();
        assert_eq!(MultiRequest::of(&a).0.mode, Mode::AtMost { min: 2 });
    }

    #[test]
    fn multi_grants_all_or_nothing() {
        let mut l = fresh(2);
        let d = mrun("2 a b 1 10 1 1 100 40", vec![None, None], &mut l, T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Allowed);
        assert_eq!(d.reply, vec![1, 0, 9, 60]);
        assert_eq!((d.tokens, d.partial, d.never), (41, false, false));
        assert_eq!(d.outcome.dirty, vec![true, true]);
        // The second bucket is short: nothing taken from either.
        let b = vec![None, Some(holding(1, 100, 30, T0))];
        let d = mrun("2 a b 1 10 1 1 100 40", b, &mut l, T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Denied);
        assert_eq!(d.reply, vec![0, 10_000, 10, 30]);
        assert_eq!((d.tokens, d.outcome.dirty.clone()), (0, vec![false, false]));
        let a = d.into_answer();
        assert_eq!(
            (a.granted, a.retry_after_ms, a.blocking),
            (false, 10_000, 0)
        );
    }

    #[test]
    fn multi_never_reserve_and_atmost() {
        let mut l = fresh(2);
        let d = mrun("2 a b 1 10 1 1 10 11", vec![None, None], &mut l, T0).unwrap();
        assert_eq!((d.outcome.kind, d.never), (Kind::Never, true));
        assert_eq!(d.reply, vec![0, -1, 10, 10]);
        let b = vec![Some(holding(1, 10, 0, T0)), None];
        let d = mrun("2 a b 1 10 2 1 10 1 RESERVE 5000", b, &mut l, T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Reserved);
        assert_eq!(d.reply, vec![1, 2000, 0, 9]);
        assert_eq!(d.tokens, 3);
        // ATMOST: the largest n shares the grant; the reply ends with it.
        let b = vec![Some(holding(1, 100, 30, T0)), None];
        let d = mrun("2 a b 1 100 50 1 10 1 ATMOST MIN 20", b, &mut l, T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Allowed);
        assert_eq!(d.reply, vec![1, 0, 0, 9, 30]);
        assert_eq!((d.partial, d.tokens), (true, 31));
        let b = vec![Some(holding(1, 100, 10, T0)), None];
        let d = mrun("2 a b 1 100 50 1 10 1 ATMOST MIN 20", b, &mut l, T0).unwrap();
        assert_eq!(d.reply, vec![0, 10_000, 10, 10, 0]);
        assert!(!d.partial);
    }

    #[test]
    fn a_short_leased_part_denies_the_call_with_its_own_wait() {
        // Part 1 is leased and short by 1 token (1 s); part 2 is not leased
        // and short by 5 (5 s), which RESERVE alone would wait for.
        let b = vec![Some(holding(1, 5, 0, T0)), Some(holding(1, 10, 0, T0))];
        let mut l = fresh(2);
        let d = mrun("2 a b 1 5 1 1 10 5 RESERVE 10000", b.clone(), &mut l, T0).unwrap();
        assert_eq!(
            (d.outcome.kind, d.outcome.retry_after_ms),
            (Kind::Reserved, 5000)
        );
        let line = "2 a b 1 5 1 1 10 5 RESERVE 10000 LEASE 1 60000";
        let d = mrun(line, b.clone(), &mut l, T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Denied);
        assert_eq!(d.reply, vec![0, 1000, 0, 0, 0, 0]);
        assert_eq!((d.blocking, d.tokens), (0, 0));
        assert!(l.iter().all(Leases::is_blank));
        // The leased part fits now: granted, the other reserved, an id for
        // the leased part only.
        let b = vec![Some(holding(1, 5, 1, T0)), Some(holding(1, 10, 0, T0))];
        let d = mrun(line, b, &mut l, T0).unwrap();
        assert_eq!(d.outcome.kind, Kind::Reserved);
        assert!(d.ids[0] != 0 && d.ids[1] == 0);
        assert_eq!(d.reply, vec![1, 5000, 0, 0, d.ids[0] as i64, 0]);
        assert_eq!(l[0].held.len(), 1);
        // A leased part that never fits: -1, and it is the blocking part.
        let b = vec![None, Some(holding(0, 10, 0, T0))];
        let d = mrun("2 a b 1 5 1 0 10 5 LEASE 2 1000", b, &mut fresh(2), T0).unwrap();
        assert_eq!(
            (d.outcome.kind, d.outcome.retry_after_ms, d.blocking),
            (Kind::Never, -1, 1)
        );
    }

    #[test]
    fn the_blocking_part_is_the_first_with_the_longest_wait() {
        let b = vec![
            Some(holding(1, 10, 0, T0)),
            Some(holding(1, 10, 0, T0)),
            Some(holding(1, 10, 0, T0)),
        ];
        let line = "3 a b c 1 10 1 1 10 3 1 10 3 BLOCK 100";
        let d = mrun(line, b.clone(), &mut fresh(3), T0).unwrap();
        assert_eq!((d.outcome.retry_after_ms, d.blocking), (3000, 1));
        // A part that asks more than its capacity blocks for ever.
        let d = mrun(
            "2 a b 1 10 1 1 10 11 BLOCK 100",
            vec![None, None],
            &mut fresh(2),
            T0,
        );
        let d = d.unwrap();
        assert_eq!(
            (d.outcome.retry_after_ms, d.blocking, d.never),
            (-1, 1, true)
        );
        let b = vec![
            Some(holding(1, 10, 0, T0)),
            Some(holding(1, 10, 0, T0)),
            Some(holding(1, 10, 0, T0)),
        ];
        // Not queued and no lease held: not worked out.
        let d = mrun("3 a b c 1 10 1 1 10 3 1 10 3", b, &mut fresh(3), T0).unwrap();
        assert_eq!((d.outcome.retry_after_ms, d.blocking), (3000, 0));
    }

    #[test]
    fn multi_waits_count_the_leases_expiry_per_part() {
        // Part 2 has rate 0, its slots lent until T0 + 700 ms: not never.
        let mut l = fresh(2);
        lent(&mut l[1], 2, 700, false, T0);
        let b = vec![None, Some(holding(0, 2, 0, T0))];
        let d = mrun("2 a b 1 10 1 0 2 1", b.clone(), &mut l, T0 + 200 * MS).unwrap();
        assert_eq!(d.outcome.kind, Kind::Denied);
        assert_eq!((d.outcome.retry_after_ms, d.blocking), (500, 1));
        assert_eq!(d.reply, vec![0, 500, 10, 0]);
        // At T0 + 700 ms the slots are back: granted, with a lease.
        let line = "2 a b 1 10 1 0 2 2 LEASE 2 1000";
        let d = mrun(line, b.clone(), &mut l, T0 + 700 * MS).unwrap();
        assert_eq!(d.outcome.kind, Kind::Allowed);
        assert_eq!(d.outcome.buckets[1].tokens, 0);
        assert_eq!(l[1].held.len(), 1);
        assert_eq!(l[1].held[0].expires_us, T0 + 1700 * MS);
        assert!(!l[1].held[0].keep);
        let mut k = fresh(2);
        let d = mrun(
            "2 a b 1 10 1 0 2 2 LEASE 2 1000 KEEP",
            vec![None, None],
            &mut k,
            T0,
        );
        assert!(d.unwrap().ids[1] != 0 && k[1].held[0].keep);
        // A KEEP lease does not come back: never.
        let mut kept = fresh(2);
        lent(&mut kept[1], 2, 700, true, T0);
        let d = mrun("2 a b 1 10 1 0 2 1", b, &mut kept, T0).unwrap();
        assert_eq!(
            (d.outcome.kind, d.outcome.retry_after_ms),
            (Kind::Never, -1)
        );
    }

    #[test]
    fn multi_lease_room_is_checked_after_expiry() {
        let mut l = fresh(1);
        let mut draw = rng(4);
        for i in 0..MAX_LEASES as i64 {
            let terms = Terms {
                n: 1,
                ttl_ms: 1000,
                keep: false,
            };
            l[0].grant(terms, T0 + i, &mut draw).unwrap();
        }
        l[0].clear_journal();
        let b = vec![Some(holding(0, 2000, 976, T0))];
        let full = mrun("1 a 0 2000 1 LEASE 1 1000", b.clone(), &mut l, T0);
        assert_eq!(full, Err(errors::ERR_LEASE_FULL));
        let d = mrun("1 a 0 2000 1 LEASE 1 1000", b, &mut l, T0 + SEC).unwrap();
        assert!(d.outcome.allowed && d.ids[0] != 0);
    }

    #[test]
    fn the_multi_dry_form_answers_the_denial_and_writes_nothing() {
        let argv = words("tb.mconsume 2 a b 1 10 1 0 2 2 BLOCK 1000 LEASE 2 5000");
        let a = parse::mconsume_args(&argv[..]).unwrap();
        let (r, _) = MultiRequest::of(&a);
        let mut l = fresh(2);
        lent(&mut l[1], 2, 400, false, T0);
        let b = vec![Some(holding(1, 10, 6, T0)), Some(holding(0, 2, 0, T0))];
        let answer = mconsume_dry(&mut parts_of(b.clone(), &mut l), &r, T0);
        assert_eq!(
            answer,
            Answer {
                granted: false,
                retry_after_ms: 400,
                wait_us: 400_000,
                never: false,
                blocking: 1,
                reply: vec![0, 400, 6, 0, 0, 0],
            }
        );
        // It would fit now: wait 0, and still nothing granted.
        let answer = mconsume_dry(&mut parts_of(b, &mut l), &r, T0 + 400 * MS);
        assert_eq!((answer.granted, answer.retry_after_ms), (false, 0));
        assert_eq!(answer.reply, vec![0, 0, 6, 2, 0, 0]);
        assert!(l[1].is_blank(), "expired in the copy it was handed");
    }
}
