//! `TB.MCONSUME numkeys key [key ...] rate capacity n [rate capacity n ...]
//! [RESERVE ms | ATMOST [MIN chunk]] [LEASE part ttl-ms [KEEP] ...]`: all-or-nothing
//! across several buckets (requests and tokens per minute, requests in
//! flight, per tenant and per key): either every bucket gives its `n`, or
//! none changes. With `ATMOST`, the parts with the largest `n` share one
//! partial grant `g` (at least `min(chunk, n)`), taken from each of them (see
//! [`bucket::consume_all`]). All keys must hash to one slot in a cluster (use
//! hash tags).
//!
//! `LEASE part ttl-ms` lends part `part`'s tokens (1-based) instead of
//! taking them (see [`crate::lease`]); with `KEEP` its tokens stay used
//! when it expires. A lease is never reserved and never
//! partial: with `RESERVE`, leased parts must be available now while the
//! other parts may reserve; if a leased part is short, the whole call is
//! denied with the wait for the leased parts; `ATMOST` with `LEASE` is an
//! error.
//!
//! `BLOCK ms` (with a lease, instead of `RESERVE`) waits server-side for
//! the whole grant, first come first served on each bucket
//! (`glue::lease_wait`); when the wait runs out, the denial.
//!
//! Reply: `[allowed, retry_after_ms, remaining_1, ..., remaining_k]`; with
//! `ATMOST` one more element, `granted` (`g`, 0 when denied); with any `LEASE`
//! the lease id of every part after the remaining tokens (0 for a part
//! without a lease, or when denied).

use super::consume::{ATMOST_ARGS, ERR_CANNOT_BLOCK, FLOW_ARGS};
use crate::bucket::{self, Kind, Mode, Part};
use crate::glue::command::{
    block, integer, key, one_of, pure_token, string, Access, Arity, Command, Keys, Spec,
};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{BucketKey, Read, Write};
use crate::glue::{blocking, clock, config, lease_wait, random, stats, top};
use crate::{lease, parse};

/// `TB.MCONSUME`.
pub struct Mconsume;

impl Command for Mconsume {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.mconsume",
        run,
        arity: Arity::AtLeast(6),
        flags: c"write deny-oom getkeys-api",
        keys: Keys::Counted(Access::Update),
        acl: c"write",
        summary: c"Takes tokens from several buckets in one slot, all or nothing",
        args: &[
            integer(c"numkeys"),
            key(c"key").multiple(),
            block(
                c"limit",
                &[string(c"rate"), integer(c"capacity"), integer(c"n")],
            )
            .multiple(),
            one_of(
                c"mode",
                &[
                    integer(c"reserve-ms").token(c"RESERVE"),
                    integer(c"block-ms").token(c"BLOCK"),
                    block(c"atmost", ATMOST_ARGS),
                ],
            )
            .optional(),
            block(
                c"lease",
                &[
                    integer(c"part"),
                    integer(c"lease-ttl-ms"),
                    pure_token(c"keep", c"KEEP").optional(),
                ],
            )
            .token(c"LEASE")
            .optional()
            .multiple(),
            FLOW_ARGS,
        ],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::mconsume_args(args)?;
    let max = config::max_wait_ms();
    if let Some(ms) = a.block_ms {
        if ms > max {
            return Err(CmdError::Owned(parse::err_wait_exceeds(max)));
        }
        if !blocking::can_block(ctx) {
            return Err(ERR_CANNOT_BLOCK.into());
        }
        let now = |c: &Ctx| queued_now(c, args, &a);
        let asks = lease_wait::Queued {
            keys: 2..2 + a.requests.len(),
            costs: a.requests.iter().map(|r| r.n).collect(),
            flow: a.flow,
        };
        return lease_wait::wait(ctx, args, ms, asks, c"tb.mconsume", queued_try, &now);
    }
    let t = take(ctx, args, &a)?;
    ctx.reply().ints(&t.reply);
    Ok(())
}

/// The call's write, as its queue try sees it: whether it was granted,
/// the denial's wait, the part that makes it wait, and the reply.
fn take(ctx: &Ctx, args: &Args, a: &parse::MconsumeArgs) -> Result<lease_wait::Try, CmdError> {
    let max = config::max_wait_ms();
    let mode = match (a.reserve_ms, a.atmost) {
        (None, Some(min)) => Mode::AtMost { min },
        (None, None) => Mode::All,
        (Some(ms), _) if ms > max => return Err(CmdError::Owned(parse::err_wait_exceeds(max))),
        (Some(ms), _) => Mode::Reserve {
            max_wait_us: ms * 1000,
        },
    };
    let now = clock::now_us();
    let keys = (0..a.requests.len())
        .map(|i| ctx.open_bucket(args.key(2 + i)))
        .collect::<Result<Vec<BucketKey<Write>>, _>>()?;
    let parts = parts_of(&a.requests, &keys, now);
    let leased = &a.leases;
    for (l, key) in leased.iter().zip(&keys) {
        if l.is_some() && !key.leases().has_room() {
            return Err(parse::ERR_LEASE_FULL.into());
        }
    }
    // A lease is never reserved: a leased part short now denies the call.
    let short: Vec<usize> = (0..parts.len())
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
    let any_held = keys.iter().any(|key| !key.leases().held.is_empty());
    let mut blocking = 0;
    if (!o.allowed && any_held) || !short.is_empty() {
        (o.retry_after_ms, blocking) = wait_with_leases(&o.need, &o.buckets, &keys, &short, now);
    } else if !o.allowed && a.block_ms.is_some() {
        blocking = wait_with_leases(&o.need, &o.buckets, &keys, &[], now).1;
    }
    let mut ids = vec![0u64; parts.len()];
    if o.allowed {
        for (j, ttl) in leased.iter().enumerate() {
            if let Some(ttl) = *ttl {
                let terms = lease::Terms {
                    n: parts[j].n,
                    ttl_ms: ttl,
                    keep: a.keep[j],
                };
                ids[j] = keys[j].leases().grant(terms, now, random::u64).unwrap_or(0);
            }
        }
    }
    let any_lease = leased.iter().any(Option::is_some);
    for ((key, b), dirty) in keys.iter().zip(&o.buckets).zip(&o.dirty) {
        if *dirty {
            key.commit(b);
        }
    }
    let asked = parts.iter().map(|p| p.n).max().unwrap_or(0);
    let partial = a.atmost.is_some() && o.granted < asked;
    stats::record_multi(o.allowed, o.retry_after_ms, o.taken.iter().sum(), partial);
    top::record_multi(&o, now, |i| args.bytes(2 + i));
    let k = o.remaining.len();
    let mut reply =
        Vec::with_capacity(2 + k + usize::from(a.atmost.is_some()) + if any_lease { k } else { 0 });
    reply.push(i64::from(o.allowed));
    reply.push(o.retry_after_ms);
    reply.extend(o.remaining.iter().map(|&left| left as i64));
    if a.atmost.is_some() {
        reply.push(o.granted as i64);
    }
    if any_lease {
        reply.extend(ids.iter().map(|&id| id as i64));
    }
    Ok(lease_wait::Try {
        granted: o.allowed,
        retry_after_ms: o.retry_after_ms,
        never: a.requests.iter().any(|r| r.n > r.limits.capacity),
        blocking,
        reply,
    })
}

/// The call as without BLOCK, for the wait queue.
fn queued_now(
    ctx: &Ctx,
    args: &Args,
    a: &parse::MconsumeArgs,
) -> Result<lease_wait::Try, CmdError> {
    take(ctx, args, a)
}

/// One try of `TB.MCONSUME ... BLOCK ms` for the wait queue: the call as
/// without BLOCK; with `dry`, the denial, nothing written.
fn queued_try(ctx: &Ctx, args: &Args, dry: bool) -> Result<lease_wait::Try, CmdError> {
    let a = parse::mconsume_args(args)?;
    if !dry {
        return take(ctx, args, &a);
    }
    let now = clock::now_us();
    let keys = (0..a.requests.len())
        .map(|i| ctx.read_bucket(args.key(2 + i)))
        .collect::<Result<Vec<BucketKey<Read>>, _>>()?;
    let parts = parts_of(&a.requests, &keys, now);
    let o = bucket::consume_all(&parts, Mode::All, now);
    let (retry, blocking) = if o.allowed {
        (0, 0)
    } else {
        wait_with_leases(&o.need, &o.buckets, &keys, &[], now)
    };
    let mut reply = vec![0, retry];
    reply.extend(
        parts
            .iter()
            .map(|p| p.stored.map_or(p.limits.capacity, |b| b.whole_tokens(now)) as i64),
    );
    if a.leases.iter().any(Option::is_some) {
        reply.extend(parts.iter().map(|_| 0));
    }
    Ok(lease_wait::Try {
        granted: false,
        retry_after_ms: retry,
        never: a.requests.iter().any(|r| r.n > r.limits.capacity),
        blocking,
        reply,
    })
}

/// The wait of a denial counting the held leases' expiry (each part waits
/// for what it `need`s): the longest over the parts in `only` (the leased
/// parts short now), or over every part when `only` is empty; -1 if one of
/// them can never succeed. With it, the part that makes the call wait (the
/// first with the longest wait).
fn wait_with_leases<M>(
    need: &[u64],
    buckets: &[bucket::Bucket],
    keys: &[BucketKey<M>],
    only: &[usize],
    now: i64,
) -> (i64, usize) {
    let all: Vec<usize> = (0..need.len()).collect();
    let which = if only.is_empty() { &all[..] } else { only };
    let (mut wait, mut part) = (0u64, which.first().copied().unwrap_or(0));
    for &j in which {
        let b = &buckets[j];
        if need[j] > b.capacity {
            return (-1, j);
        }
        let level = need[j] as i128 * bucket::NANOS;
        match keys[j].leases().micros_until(b, level, now) {
            Some(us) if us > wait => (wait, part) = (us, j),
            Some(_) => {}
            None => return (-1, j),
        }
    }
    (bucket::ceil_ms(wait), part)
}

/// Each key's stored bucket with the limits and `n` the call asks of it.
fn parts_of<M>(requests: &[parse::Request], keys: &[BucketKey<M>], now: i64) -> Vec<Part> {
    requests
        .iter()
        .zip(keys)
        .map(|(r, key)| Part {
            stored: key.stored_at(now),
            limits: r.limits,
            n: r.n,
        })
        .collect()
}
