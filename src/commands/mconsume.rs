//! `TB.MCONSUME numkeys key [key ...] rate capacity n [rate capacity n ...]
//! [RESERVE ms | BLOCK ms | ATMOST [MIN chunk]] [LEASE part ttl-ms [KEEP] ...]
//! [FLOW name [WEIGHT w]]`: all-or-nothing
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
//! `BLOCK ms` (instead of `RESERVE`) waits server-side for the whole grant
//! in the queue of the bucket that makes the call wait, fair across flows
//! (`FLOW name [WEIGHT w]`) and first come first served within one
//! (`glue::lease_wait`); when the wait runs out, the denial.
//!
//! Reply: `[allowed, retry_after_ms, remaining_1, ..., remaining_k]`; with
//! `ATMOST` one more element, `granted` (`g`, 0 when denied); with any `LEASE`
//! the lease id of every part after the remaining tokens (0 for a part
//! without a lease, or when denied).

use super::consume::{queue_try, ATMOST_ARGS, FLOW_ARGS};
use crate::decide::{self, MultiDecision, MultiRequest, Serve};
use crate::errors::ERR_CANNOT_BLOCK;
use crate::glue::command::{
    block, integer, key, one_of, pure_token, string, Access, Arity, Command, Keys, Spec,
};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{BucketKey, Read, Write};
use crate::glue::{blocking, clock, config, lease_wait, random, stats, top};
use crate::parse;

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
    let (req, serve) = MultiRequest::of(&a);
    decide::check_wait(a.block_ms.or(a.reserve_ms), config::max_wait_ms())
        .map_err(CmdError::Owned)?;
    if let Serve::Queue(ms) = serve {
        if !blocking::can_block(ctx) {
            return Err(ERR_CANNOT_BLOCK.into());
        }
        let now = |c: &Ctx| Ok(queue_try(take(c, args, &req)?.into_answer()));
        let asks = lease_wait::Queued {
            keys: 2..2 + a.requests.len(),
            costs: a.requests.iter().map(|r| r.n).collect(),
            flow: a.flow,
        };
        return lease_wait::wait(ctx, args, ms, asks, c"tb.mconsume", queued_try, &now);
    }
    ctx.reply().ints(&take(ctx, args, &req)?.reply);
    Ok(())
}

/// The call's write: decides on the buckets as stored, commits, records.
fn take(ctx: &Ctx, args: &Args, req: &MultiRequest) -> Result<MultiDecision, CmdError> {
    let now = clock::now_us();
    let mut keys = (0..req.requests.len())
        .map(|i| ctx.open_bucket(args.key(2 + i)))
        .collect::<Result<Vec<BucketKey<Write>>, _>>()?;
    let d = decide::mconsume(&mut keys, req, now, random::u64)?;
    let o = &d.outcome;
    for ((key, b), dirty) in keys.iter().zip(&o.buckets).zip(&o.dirty) {
        if *dirty {
            key.commit(b);
        }
    }
    stats::record_multi(o.kind, o.retry_after_ms, d.tokens, d.partial);
    top::record_multi(o, now, |i| args.bytes(2 + i));
    Ok(d)
}

/// One try of `TB.MCONSUME ... BLOCK ms` for the wait queue: the call as
/// without BLOCK; with `dry`, the denial, nothing written.
fn queued_try(ctx: &Ctx, args: &Args, dry: bool) -> Result<lease_wait::Try, CmdError> {
    let a = parse::mconsume_args(args)?;
    let (req, _) = MultiRequest::of(&a);
    if !dry {
        return Ok(queue_try(take(ctx, args, &req)?.into_answer()));
    }
    let now = clock::now_us();
    let mut keys = (0..req.requests.len())
        .map(|i| ctx.read_bucket(args.key(2 + i)))
        .collect::<Result<Vec<BucketKey<Read>>, _>>()?;
    let answer = decide::mconsume_dry(&mut keys, &req, now);
    Ok(queue_try(answer))
}
