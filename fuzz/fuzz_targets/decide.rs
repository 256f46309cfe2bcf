//! Sequences of TB.CONSUME and TB.MCONSUME decisions (`tb::decide`) over
//! up to three keys with leases, from any valid starting states, the clock
//! moving anywhere, each call's state committed as the glue commits it (the
//! new bucket and leases when dirty, else the leases as found), and the
//! queue's dry tries in between.
//!
//! After every call: no panic; the stored state and the leases stay valid;
//! the reply has its length and agrees with the kind (allowed, waits, -1
//! only for never); a lease id is drawn exactly when a leased call is
//! granted, and is then held with the call's tokens; a denial takes
//! nothing and grants nothing; a held reply is a reservation; the lease-full
//! error only comes from a full table, and changes nothing; a dry try grants
//! nothing and answers a denial, whose exact wait (`wait_us`, what its
//! `retry_after_ms` rounds up) is when it fits: not a microsecond before.

#![no_main]

#[allow(dead_code)]
mod sim;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sim::{wait_ms, RawAmount, RawBucket, RawLimits, Step};
use tb::bucket::{ceil_ms, Bucket, Kind, Mode};
use tb::decide::{self, ConsumeRequest, Lend, MultiRequest, PartState};
use tb::errors::ERR_LEASE_FULL;
use tb::lease::{Leases, MAX_LEASES, MAX_TTL_MS};
use tb::parse::Request;

/// A reply's `retry_after_ms` is its exact wait `wait_us` rounded up (both
/// -1 for never; `wait_us` saturates at `i64::MAX`).
fn same_wait(ms: i64, us: i64) -> bool {
    match us {
        -1 => ms == -1,
        i64::MAX => ms >= ceil_ms(i64::MAX as u64),
        us => us >= 0 && ms == ceil_ms(us as u64),
    }
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum RawMode {
    All,
    Reserve(u32),
    Block(u32),
    /// `ATMOST MIN chunk`.
    AtMost(u8),
    /// Queued (BLOCK with LEASE or FLOW): tried as All.
    Queued,
}

#[derive(Arbitrary, Debug)]
struct RawLease {
    ttl_ms: u32,
    keep: bool,
}

#[derive(Arbitrary, Debug)]
struct RawPart {
    key: u8,
    limits: u8,
    n: RawAmount,
    lease: Option<RawLease>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Consume { part: RawPart, mode: RawMode },
    Multi { parts: Vec<RawPart>, mode: RawMode },
    DryConsume { part: RawPart },
    DryMulti { parts: Vec<RawPart> },
}

#[derive(Arbitrary, Debug)]
struct Input {
    starts: [Option<RawBucket>; KEYS],
    limits: [RawLimits; 3],
    now: i64,
    seed: u64,
    ops: Vec<(Step, Op)>,
}

const KEYS: usize = 3;

/// One key: its bucket and leases as stored.
#[derive(Clone, Default)]
struct Key {
    stored: Option<Bucket>,
    leases: Leases,
}

fn lend(l: &Option<RawLease>, n: u64) -> Option<Lend> {
    l.as_ref().filter(|_| n > 0).map(|l| Lend {
        ttl_ms: u64::from(l.ttl_ms) % (MAX_TTL_MS + 1),
        keep: l.keep,
    })
}

fn mode_of(m: RawMode, atmost_ok: bool) -> (Mode, bool) {
    match m {
        RawMode::All | RawMode::Queued => (Mode::All, false),
        RawMode::AtMost(_) if !atmost_ok => (Mode::All, false),
        RawMode::AtMost(min) => (
            Mode::AtMost {
                min: u64::from(min).max(1),
            },
            false,
        ),
        RawMode::Reserve(ms) | RawMode::Block(ms) => (
            Mode::Reserve {
                max_wait_us: wait_ms(ms) * 1000,
            },
            matches!(m, RawMode::Block(_)),
        ),
    }
}

/// Writes what a call decided, as the glue does: the bucket and its leases
/// when dirty, else the leases as they were found (the expiry undone).
fn commit(key: &mut Key, dirty: bool, bucket: Bucket) {
    if dirty {
        key.stored = Some(bucket);
        key.leases.clear_journal();
    } else {
        key.leases.undo_expiry();
    }
    assert!(key.leases.is_valid(), "invalid leases");
    if let Some(b) = key.stored {
        assert!(b.is_valid() && b.tokens <= b.cap_nanos(), "invalid {b:?}");
    }
}

/// Whether the table is full once the leases due at `now` are gone.
fn full_at(leases: &Leases, now: i64) -> bool {
    leases.held.iter().filter(|l| l.expires_us > now).count() >= MAX_LEASES
}

fuzz_target!(|input: Input| {
    let limits = input.limits.map(RawLimits::get);
    let mut keys: Vec<Key> = input
        .starts
        .iter()
        .map(|s| Key {
            stored: s.and_then(RawBucket::get),
            leases: Leases::default(),
        })
        .collect();
    let mut x = input.seed;
    let mut rng = move || {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x ^ (x >> 29)
    };
    let mut now = input.now;
    for (step, op) in input.ops.iter().take(32) {
        now = step.apply(now);
        match op {
            Op::Consume { part, mode: _ } | Op::DryConsume { part } => {
                let k = usize::from(part.key) % KEYS;
                let l = limits[usize::from(part.limits) % limits.len()];
                let n = part.n.get();
                let raw = match op {
                    Op::Consume { mode, .. } => *mode,
                    _ => RawMode::Queued,
                };
                let lease = lend(&part.lease, n);
                let atmost_ok = lease.is_none();
                let (mut mode, hold) = mode_of(raw, atmost_ok);
                if lease.is_some() {
                    mode = Mode::All;
                }
                if let Mode::AtMost { min } = mode {
                    if min > l.capacity {
                        mode = Mode::All;
                    }
                }
                let req = ConsumeRequest {
                    limits: l,
                    n,
                    mode,
                    lease,
                    hold: hold && lease.is_none(),
                };
                let key = &mut keys[k];
                let found = key.leases.clone();
                if let Op::DryConsume { .. } = op {
                    let mut copy = found.clone();
                    let a = decide::consume_dry(key.stored, &mut copy, &req, now);
                    assert!(!a.granted && a.reply[0] == 0 && a.reply[4] == 0);
                    assert_eq!(a.reply.len(), 5 + usize::from(lease.is_some()));
                    assert_eq!(a.never, n > l.capacity);
                    assert!(a.retry_after_ms >= -1);
                    assert!(same_wait(a.retry_after_ms, a.wait_us));
                    // The queue tries a denied call again after exactly
                    // `wait_us`: it must fit then, and not a µs before. But
                    // for a wait too long for an i64 (saturated), and for a
                    // bucket stored with other limits: the try that changes
                    // them writes the change, so the next try's wait counts
                    // from it, not this one.
                    let same = key.stored.is_none_or(|b| b.limits() == l);
                    if let Some(due) = (same && 0 < a.wait_us && a.wait_us < i64::MAX)
                        .then(|| now.checked_add(a.wait_us))
                        .flatten()
                    {
                        let fits = |at: i64| {
                            let mut copy = found.clone();
                            decide::consume_dry(key.stored, &mut copy, &req, at).wait_us == 0
                        };
                        assert!(fits(due), "not due after its wait_us {}", a.wait_us);
                        assert!(!fits(due - 1), "due before its wait_us {}", a.wait_us);
                    }
                    continue;
                }
                let d = match decide::consume(key.stored, &mut key.leases, &req, now, &mut rng) {
                    Ok(d) => d,
                    Err(e) => {
                        assert_eq!(e, ERR_LEASE_FULL);
                        assert!(lease.is_some() && full_at(&found, now));
                        key.leases = found;
                        continue;
                    }
                };
                let o = d.outcome;
                let reply = d.reply();
                assert_eq!(reply.len(), 5 + usize::from(lease.is_some()));
                assert_eq!(reply[0], i64::from(o.allowed()));
                assert!(same_wait(o.retry_after_ms, o.wait_us));
                assert_eq!(d.never, n > l.capacity);
                match o.kind {
                    Kind::Allowed => assert_eq!(o.retry_after_ms, 0),
                    Kind::Reserved => assert!(o.retry_after_ms >= 0 && o.granted == n),
                    Kind::Denied => assert!(o.retry_after_ms >= 0 && o.granted == 0),
                    Kind::Never => assert!(o.retry_after_ms == -1 && o.granted == 0),
                    Kind::Peek => assert!(n == 0 && !o.dirty),
                }
                if d.never && !matches!(mode, Mode::AtMost { .. }) {
                    assert_eq!(o.kind, Kind::Never);
                }
                assert!(!d.hold || o.kind == Kind::Reserved);
                match (lease, d.lease_id) {
                    (None, None) => {}
                    (Some(_), Some(0)) => assert!(o.kind != Kind::Allowed),
                    (Some(_), Some(id)) => {
                        assert_eq!(o.kind, Kind::Allowed);
                        assert!(key.leases.held.iter().any(|h| h.id == id && h.n == n));
                        assert!(o.dirty);
                    }
                    other => panic!("lease id without a lease: {other:?}"),
                }
                commit(key, o.dirty, o.bucket);
            }
            Op::Multi { parts, mode: _ } | Op::DryMulti { parts } => {
                let mut which: Vec<usize> = Vec::new();
                let mut requests = Vec::new();
                let mut leases = Vec::new();
                let mut keep = Vec::new();
                for p in parts.iter().take(KEYS) {
                    let k = usize::from(p.key) % KEYS;
                    if which.contains(&k) {
                        continue;
                    }
                    which.push(k);
                    let r = Request {
                        limits: limits[usize::from(p.limits) % limits.len()],
                        n: p.n.get(),
                    };
                    let l = lend(&p.lease, r.n);
                    leases.push(l.map(|l| l.ttl_ms));
                    keep.push(l.is_some_and(|l| l.keep));
                    requests.push(r);
                }
                if requests.is_empty() {
                    continue;
                }
                let any_lease = leases.iter().any(Option::is_some);
                let raw = match op {
                    Op::Multi { mode, .. } => *mode,
                    _ => RawMode::Queued,
                };
                let (mut mode, _) = mode_of(raw, !any_lease);
                let big = requests.iter().map(|r| r.n).max().unwrap_or(0);
                if let Mode::AtMost { min } = mode {
                    if requests
                        .iter()
                        .any(|r| r.n == big && min > r.limits.capacity)
                    {
                        mode = Mode::All;
                    }
                }
                let req = MultiRequest {
                    requests: &requests,
                    leases: &leases,
                    keep: &keep,
                    mode,
                    queued: matches!(raw, RawMode::Queued | RawMode::Block(_)),
                };
                let found: Vec<Leases> = which.iter().map(|&k| keys[k].leases.clone()).collect();
                let k = requests.len();
                let atmost = matches!(mode, Mode::AtMost { .. });
                if let Op::DryMulti { .. } = op {
                    let mut copies = found.clone();
                    let mut states: Vec<PartState<&mut Leases>> = which
                        .iter()
                        .zip(copies.iter_mut())
                        .map(|(&j, leases)| PartState {
                            stored: keys[j].stored,
                            leases,
                        })
                        .collect();
                    let a = decide::mconsume_dry(&mut states, &req, now);
                    assert!(!a.granted && a.reply[0] == 0 && a.blocking < k);
                    assert_eq!(a.reply.len(), 2 + k + if any_lease { k } else { 0 });
                    assert!(same_wait(a.retry_after_ms, a.wait_us));
                    // As for one bucket, above.
                    let same = which
                        .iter()
                        .zip(&requests)
                        .all(|(&j, r)| keys[j].stored.is_none_or(|b| b.limits() == r.limits));
                    if let Some(due) = (same && 0 < a.wait_us && a.wait_us < i64::MAX)
                        .then(|| now.checked_add(a.wait_us))
                        .flatten()
                    {
                        let fits = |at: i64| {
                            let mut copies = found.clone();
                            let mut states: Vec<PartState<&mut Leases>> = which
                                .iter()
                                .zip(copies.iter_mut())
                                .map(|(&j, leases)| PartState {
                                    stored: keys[j].stored,
                                    leases,
                                })
                                .collect();
                            decide::mconsume_dry(&mut states, &req, at).wait_us == 0
                        };
                        assert!(fits(due), "not due after its wait_us {}", a.wait_us);
                        assert!(!fits(due - 1), "due before its wait_us {}", a.wait_us);
                    }
                    continue;
                }
                let mut owned: Vec<Leases> = which
                    .iter()
                    .map(|&j| std::mem::take(&mut keys[j].leases))
                    .collect();
                let result = {
                    let mut states: Vec<PartState<&mut Leases>> = which
                        .iter()
                        .zip(owned.iter_mut())
                        .map(|(&j, leases)| PartState {
                            stored: keys[j].stored,
                            leases,
                        })
                        .collect();
                    decide::mconsume(&mut states, &req, now, &mut rng)
                };
                let d = match result {
                    Ok(d) => d,
                    Err(e) => {
                        assert_eq!(e, ERR_LEASE_FULL);
                        assert!(leases
                            .iter()
                            .zip(&found)
                            .any(|(l, f)| l.is_some() && full_at(f, now)));
                        for (&j, f) in which.iter().zip(found) {
                            keys[j].leases = f;
                        }
                        continue;
                    }
                };
                let o = &d.outcome;
                assert_eq!(
                    d.reply.len(),
                    2 + k + usize::from(atmost) + if any_lease { k } else { 0 }
                );
                assert_eq!(d.reply[0], i64::from(o.allowed));
                assert_eq!(d.reply[1], o.retry_after_ms);
                assert!(same_wait(o.retry_after_ms, o.wait_us));
                assert!(d.blocking < k);
                assert_eq!(d.never, requests.iter().any(|r| r.n > r.limits.capacity));
                let kind = match (o.allowed, o.retry_after_ms) {
                    (true, 0) => Kind::Allowed,
                    (true, _) => Kind::Reserved,
                    (false, -1) => Kind::Never,
                    (false, _) => Kind::Denied,
                };
                assert_eq!(o.kind, kind, "{o:?}");
                assert!(o.retry_after_ms >= -1);
                if !o.allowed {
                    assert!(o.taken.iter().all(|&t| t == 0) && d.tokens == 0);
                }
                assert_eq!(d.tokens, o.taken.iter().sum::<u64>());
                for (i, id) in d.ids.iter().enumerate() {
                    let granted = o.allowed && leases[i].is_some();
                    assert_eq!(*id != 0, granted, "an id exactly for a granted lease");
                    if granted {
                        let n = requests[i].n;
                        assert!(owned[i].held.iter().any(|h| h.id == *id && h.n == n));
                    }
                }
                for (i, &j) in which.iter().enumerate() {
                    keys[j].leases = std::mem::take(&mut owned[i]);
                    let b = o.buckets[i];
                    commit(&mut keys[j], o.dirty[i], b);
                    if o.dirty[i] {
                        assert_eq!(b.limits(), requests[i].limits);
                    }
                }
            }
        }
    }
});
