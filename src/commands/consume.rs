//! `TB.CONSUME key rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST [MIN
//! chunk]] [LEASE ttl-ms [KEEP]] [FLOW name [WEIGHT w]]`: take `n` tokens (default 1) from the bucket under
//! `key`, refilled lazily at `rate` up to `capacity`. `ATMOST MIN chunk`
//! grants at least `min(chunk, n)` tokens or nothing (a denial waits for that
//! many). With `LEASE`, the tokens are lent: `TB.RELEASE` gives them back, or
//! they come back `ttl-ms` later, or with `KEEP` stay used then
//! ([`crate::lease`]). `FLOW name [WEIGHT w]` (with `BLOCK ms`) names the
//! flow the call waits in. With `BLOCK ms` and `LEASE` or `FLOW`, a call
//! that cannot be granted now waits server-side in the bucket's queue, fair
//! across flows and first come first served within one
//! (`glue::lease_wait`); plain `BLOCK` reserves at once and replies when
//! its tokens are due.
//!
//! Reply: `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`,
//! and with `LEASE` a sixth element, the lease id (0 when denied).

use crate::decide::{self, ConsumeRequest, Decision, Serve};
use crate::errors::ERR_CANNOT_BLOCK;
use crate::glue::command::{block, integer, key, one_of, pure_token, string, Access, Arity};
use crate::glue::command::{Arg, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::{blocking, clock, config, lease_wait, random, stats, top};
use crate::parse;

/// `TB.CONSUME`.
pub struct Consume;

impl Command for Consume {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.consume",
        run,
        arity: Arity::AtLeast(4),
        flags: c"write deny-oom fast",
        keys: Keys::One(Access::Update),
        acl: c"write fast",
        summary: c"Takes n tokens (default 1) from a token bucket refilled at rate up to capacity",
        args: &[
            key(c"key"),
            string(c"rate"),
            integer(c"capacity"),
            integer(c"n").optional(),
            one_of(
                c"wait",
                &[
                    integer(c"reserve-ms").token(c"RESERVE"),
                    integer(c"block-ms").token(c"BLOCK"),
                ],
            )
            .optional(),
            block(c"atmost", ATMOST_ARGS).optional(),
            block(
                c"lease",
                &[
                    integer(c"lease-ttl-ms"),
                    pure_token(c"keep", c"KEEP").optional(),
                ],
            )
            .token(c"LEASE")
            .optional(),
            FLOW_ARGS,
        ],
    };
}

/// `FLOW name [WEIGHT w]` in the docs of both consume commands: the flow
/// a queued call waits in.
pub const FLOW_ARGS: Arg = block(
    c"flow",
    &[
        string(c"name"),
        integer(c"weight").token(c"WEIGHT").optional(),
    ],
)
.token(c"FLOW")
.optional();

/// `ATMOST [MIN chunk]` in the docs of both consume commands: a partial
/// grant, of at least `chunk` tokens.
pub const ATMOST_ARGS: &[Arg] = &[
    pure_token(c"atmost", c"ATMOST"),
    integer(c"chunk").token(c"MIN").optional(),
];

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::consume_args(args)?;
    let (req, serve) = ConsumeRequest::of(&a);
    decide::check_wait(decide::wait_ms(a.options.wait), config::max_wait_ms())
        .map_err(CmdError::Owned)?;
    if serve != Serve::Now && !blocking::can_block(ctx) {
        return Err(ERR_CANNOT_BLOCK.into());
    }
    if let Serve::Queue(ms) = serve {
        let now = |c: &Ctx| Ok(queue_try(take(c, args, &req)?.answer()));
        let asks = lease_wait::Queued {
            keys: 1..2,
            costs: vec![req.n],
            flow: a.flow,
        };
        return lease_wait::wait(ctx, args, ms, asks, c"tb.consume", queued_try, &now);
    }
    let d = take(ctx, args, &req)?;
    let o = &d.outcome;
    if d.hold
        && blocking::has_room(ctx)
        && blocking::block_for(ctx, o.retry_after_ms, args.key(1), req.limits, o.granted)
    {
        return Ok(());
    }
    ctx.reply().ints(&d.reply());
    Ok(())
}

/// The call's write: decides on the bucket as stored, commits, records.
fn take(ctx: &Ctx, args: &Args, req: &ConsumeRequest) -> Result<Decision, CmdError> {
    let now = clock::now_us();
    let key = ctx.open_bucket(args.key(1))?;
    let d = decide::consume(key.stored(), &mut key.leases(), req, now, random::u64)?;
    if d.outcome.dirty {
        key.commit(&d.outcome.bucket);
    }
    drop(key);
    stats::record(&d.outcome, req.n);
    top::record(&d.outcome, now, || args.bytes(1));
    Ok(d)
}

/// One try of a queued `TB.CONSUME ... BLOCK ms` (with `LEASE` or
/// `FLOW`) for the wait queue: the call as without BLOCK; with `dry`, the
/// denial, nothing written.
fn queued_try(ctx: &Ctx, args: &Args, dry: bool) -> Result<lease_wait::Try, CmdError> {
    let a = parse::consume_args(args)?;
    let (req, _) = ConsumeRequest::of(&a);
    if !dry {
        return Ok(queue_try(take(ctx, args, &req)?.answer()));
    }
    let now = clock::now_us();
    let key = ctx.read_bucket(args.key(1))?;
    let answer = decide::consume_dry(key.stored(), &mut key.leases(), &req, now);
    Ok(queue_try(answer))
}

/// The wait queue's view of a decision.
pub(super) fn queue_try(a: decide::Answer) -> lease_wait::Try {
    lease_wait::Try {
        granted: a.granted,
        wait_us: a.wait_us,
        never: a.never,
        blocking: a.blocking,
        reply: a.reply,
    }
}
