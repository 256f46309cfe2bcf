//! `TB.MCONSUME numkeys key [key ...] rate capacity n [rate capacity n ...]
//! [LEASE part ttl-ms ...] [RESERVE ms]`: all-or-nothing across several
//! buckets (requests and tokens per minute, requests in flight, per tenant
//! and per key): either every bucket gives its `n`, or none changes. All keys
//! must hash to one slot in a cluster (use hash tags).
//!
//! `LEASE part ttl-ms` lends part `part`'s tokens (1-based) instead of
//! taking them (see [`crate::lease`]). A lease is never reserved: with
//! `RESERVE`, leased parts must be available now while the other parts may
//! reserve; if a leased part is short, the whole call is denied with the
//! wait for the leased parts.
//!
//! Reply: `[allowed, retry_after_ms, remaining_1, ..., remaining_k]`, and
//! with any `LEASE` the lease id of every part after them (0 for a part
//! without a lease, or when denied).

use redis_module::raw;

use crate::bucket::{self, Kind, Limits, Mode, Part};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{clock, config, stats, top};
use crate::parse::{self, ERR_CAPACITY, ERR_N};

const ERR_NUMKEYS: &str = "ERR numkeys must be an integer from 1 to 1000 and match the arguments";
const ERR_DUPLICATE: &str = "ERR a key appears twice in TB.MCONSUME";
const ERR_OPTION: &str = "ERR unknown option: TB.MCONSUME takes RESERVE ms";

/// Largest numkeys accepted.
const MAX_KEYS: u64 = 1000;

/// Handler of `TB.MCONSUME`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if key_positions(ctx, args) {
        return Ok(());
    }
    if args.len() < 6 {
        return Err(CmdError::WrongArity);
    }
    let k = parse::integer(args.bytes(1), MAX_KEYS, ERR_NUMKEYS)? as usize;
    let triples = 2 + k;
    if k == 0 || args.len() < triples + 3 * k {
        return Err(ERR_NUMKEYS.into());
    }
    let mut mode = Mode::All;
    let mut leased: Vec<Option<u64>> = vec![None; k];
    let mut reserve = None;
    let mut at = triples + 3 * k;
    while at < args.len() {
        if parse::is_keyword(args.bytes(at), "LEASE") {
            if at + 2 >= args.len() {
                return Err(parse::ERR_LEASE_PART.into());
            }
            let part = parse::integer(args.bytes(at + 1), k as u64, parse::ERR_LEASE_PART)?;
            if part == 0 {
                return Err(parse::ERR_LEASE_PART.into());
            }
            let ttl = parse::lease_ttl(args.bytes(at + 2))?;
            if leased[part as usize - 1].replace(ttl).is_some() {
                return Err(parse::ERR_LEASE_TWICE.into());
            }
            at += 3;
        } else if parse::is_keyword(args.bytes(at), "RESERVE")
            && reserve.is_none()
            && at + 1 < args.len()
        {
            reserve = Some(parse::integer(
                args.bytes(at + 1),
                parse::MAX_WAIT_MS,
                parse::ERR_WAIT,
            )?);
            at += 2;
        } else {
            return Err(ERR_OPTION.into());
        }
    }
    if let Some(ms) = reserve {
        let max = config::max_wait_ms();
        if ms > max {
            return Err(CmdError::Owned(parse::err_wait_exceeds(max)));
        }
        mode = Mode::Reserve {
            max_wait_us: ms * 1000,
        };
    }
    let any_lease = leased.iter().any(Option::is_some);
    let mut parts = Vec::with_capacity(k);
    for i in 0..k {
        let at = triples + 3 * i;
        parts.push(Part {
            stored: None,
            limits: Limits {
                rate: parse::rate(args.bytes(at))?,
                capacity: parse::amount(args.bytes(at + 1), ERR_CAPACITY)?,
            },
            n: parse::amount(args.bytes(at + 2), ERR_N)?,
        });
    }
    for i in 0..k {
        for j in 0..i {
            if args.bytes(2 + i) == args.bytes(2 + j) {
                return Err(ERR_DUPLICATE.into());
            }
        }
    }
    if leased
        .iter()
        .zip(&parts)
        .any(|(l, p)| l.is_some() && p.n == 0)
    {
        return Err(parse::ERR_LEASE_N.into());
    }
    let now = clock::now_us();
    let keys: Vec<BucketKey> = (0..k)
        .map(|i| BucketKey::open(ctx.raw, args.raw(2 + i), true))
        .collect();
    for (part, key) in parts.iter_mut().zip(&keys) {
        part.stored = key.get_at(now)?;
    }
    for (l, key) in leased.iter().zip(&keys) {
        if l.is_some() && !key.leases().has_room() {
            return Err(parse::ERR_LEASE_FULL.into());
        }
    }
    // A lease is never reserved: a leased part short now denies the call.
    let short: Vec<usize> = (0..k)
        .filter(|&j| {
            leased[j].is_some() && {
                let p = &parts[j];
                let probe = bucket::consume(p.stored.as_ref(), p.limits, p.n, Mode::All, now);
                probe.kind != Kind::Allowed
            }
        })
        .collect();
    let mut o = if short.is_empty() {
        bucket::consume_all(&parts, mode, now)
    } else {
        bucket::consume_all(&parts, Mode::All, now)
    };
    if (!o.allowed && keys.iter().any(|key| !key.leases().held.is_empty())) || !short.is_empty() {
        o.retry_after_ms = wait_with_leases(&parts, &o.buckets, &keys, &short, now);
    }
    let mut ids = vec![0u64; k];
    if o.allowed {
        for j in 0..k {
            if let Some(ttl) = leased[j] {
                ids[j] = keys[j].leases().grant(parts[j].n, ttl, now).unwrap_or(0);
            }
        }
    }
    for ((key, b), dirty) in keys.iter().zip(&o.buckets).zip(&o.dirty) {
        if *dirty {
            store::commit(ctx.raw, key, b);
        }
    }
    let tokens = if o.allowed {
        parts.iter().map(|p| p.n).sum()
    } else {
        0
    };
    stats::record_multi(o.allowed, o.retry_after_ms, tokens);
    top::record_multi(&parts, &o, now, |i| args.bytes(2 + i));
    let r = ctx.reply();
    r.array(if any_lease { 2 + 2 * k } else { 2 + k });
    r.int(i64::from(o.allowed));
    r.int(o.retry_after_ms);
    for &left in &o.remaining {
        r.int(left as i64);
    }
    if any_lease {
        for &id in &ids {
            r.int(id as i64);
        }
    }
    Ok(())
}

/// The wait of a denial counting the held leases' expiry: the longest over
/// the parts in `only` (the leased parts short now), or over every part when
/// `only` is empty; -1 if one of them can never succeed.
fn wait_with_leases(
    parts: &[Part],
    buckets: &[bucket::Bucket],
    keys: &[BucketKey],
    only: &[usize],
    now: i64,
) -> i64 {
    let all: Vec<usize> = (0..parts.len()).collect();
    let which = if only.is_empty() { &all[..] } else { only };
    let mut wait = 0u64;
    for &j in which {
        let (p, b) = (&parts[j], &buckets[j]);
        if p.n > b.capacity {
            return -1;
        }
        let level = p.n.max(1) as i128 * bucket::NANOS;
        match keys[j].leases().micros_until(b, level, now) {
            Some(us) => wait = wait.max(us),
            None => return -1,
        }
    }
    bucket::ceil_ms(wait)
}

/// Answers Redis' question "where are the keys?" (COMMAND GETKEYS, cluster
/// routing, ACL checks): arguments 2 to 1 + numkeys. Returns true if this
/// call was such a question.
fn key_positions(ctx: &Ctx, args: &Args) -> bool {
    // SAFETY: ctx is the live context of this call.
    unsafe {
        if raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx.raw) == 0 {
            return false;
        }
        if args.len() >= 2 {
            if let Ok(k) = parse::integer(args.bytes(1), MAX_KEYS, ERR_NUMKEYS) {
                for i in 0..(k as usize).min(args.len() - 2) {
                    raw::RedisModule_KeyAtPos.unwrap()(ctx.raw, (2 + i) as i32);
                }
            }
        }
    }
    true
}
