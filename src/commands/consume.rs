//! `TB.CONSUME key rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST [MIN
//! chunk]] [LEASE ttl-ms [KEEP]]`: take `n` tokens (default 1) from the bucket under
//! `key`, refilled lazily at `rate` up to `capacity`. `ATMOST MIN chunk`
//! grants at least `min(chunk, n)` tokens or nothing (a denial waits for that
//! many). With `LEASE`, the tokens are lent: `TB.RELEASE` gives them back, or
//! they come back `ttl-ms` later, or with `KEEP` stay used then
//! ([`crate::lease`]); with `BLOCK ms` too, a lease that cannot be granted
//! now is waited for server-side, first come first served
//! (`glue::lease_wait`).
//!
//! Reply: `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`,
//! and with `LEASE` a sixth element, the lease id (0 when denied).

use crate::bucket::{self, Kind, Mode};
use crate::glue::command::{block, integer, key, one_of, pure_token, string, Access, Arity};
use crate::glue::command::{Arg, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::{blocking, clock, config, lease_wait, random, stats, top};
use crate::lease;
use crate::parse::{self, Wait};

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

pub(crate) const ERR_CANNOT_BLOCK: &str =
    "ERR BLOCK cannot wait inside MULTI, a script, or on a client that cannot block: use RESERVE and wait on the client";

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::consume_args(args)?;
    let opts = a.options;
    if let (true, Wait::Block(ms)) = (a.lease_ttl_ms.is_some() || a.flow.is_some(), opts.wait) {
        check_block(ctx, ms)?;
        let now = |c: &Ctx| queued_now(c, args, &a);
        let asks = lease_wait::Queued {
            keys: 1..2,
            costs: vec![opts.n],
            flow: a.flow,
        };
        return lease_wait::wait(ctx, args, ms, asks, c"tb.consume", queued_try, &now);
    }
    let mode = match opts.wait {
        Wait::No if opts.atmost => Mode::AtMost {
            min: opts.min.unwrap_or(1),
        },
        Wait::No => Mode::All,
        Wait::Reserve(ms) | Wait::Block(ms) => Mode::Reserve {
            max_wait_us: ms * 1000,
        },
    };
    let block = match opts.wait {
        Wait::Reserve(ms) => check_wait(ms).map(|()| false)?,
        Wait::Block(ms) => check_block(ctx, ms).map(|()| true)?,
        Wait::No => false,
    };
    let (o, lease_id) = take(ctx, args, &a, mode)?;
    let reply = [
        i64::from(o.allowed()),
        o.remaining as i64,
        o.retry_after_ms,
        o.reset_after_ms,
        o.granted as i64,
    ];
    if block
        && o.kind == Kind::Reserved
        && blocking::has_room(ctx)
        && blocking::block_for(ctx, o.retry_after_ms, args.key(1), a.limits, o.granted)
    {
        return Ok(());
    }
    if a.lease_ttl_ms.is_some() {
        let mut with_id = reply.to_vec();
        with_id.push(lease_id as i64);
        ctx.reply().ints(&with_id);
    } else {
        ctx.reply().ints(&reply);
    }
    Ok(())
}

/// Refuses a wait longer than `tb.max-wait-ms`.
fn check_wait(ms: u64) -> Result<(), CmdError> {
    let max = config::max_wait_ms();
    if ms > max {
        return Err(CmdError::Owned(parse::err_wait_exceeds(max)));
    }
    Ok(())
}

/// Refuses a BLOCK that is too long or cannot block here.
fn check_block(ctx: &Ctx, ms: u64) -> Result<(), CmdError> {
    check_wait(ms)?;
    if !blocking::can_block(ctx) {
        return Err(ERR_CANNOT_BLOCK.into());
    }
    Ok(())
}

/// The call's write: takes (or lends) the tokens, commits, records; the
/// outcome and the lease id (0: none).
fn take(
    ctx: &Ctx,
    args: &Args,
    a: &parse::ConsumeArgs,
    mode: Mode,
) -> Result<(bucket::Outcome, u64), CmdError> {
    let opts = a.options;
    let now = clock::now_us();
    let key = ctx.open_bucket(args.key(1))?;
    let stored = key.stored_at(now);
    if a.lease_ttl_ms.is_some() && !key.leases().has_room() {
        return Err(parse::ERR_LEASE_FULL.into());
    }
    let mut o = bucket::consume(stored.as_ref(), a.limits, opts.n, mode, now);
    let mut lease_id = 0;
    if let (Some(ttl), Kind::Allowed) = (a.lease_ttl_ms, o.kind) {
        let terms = lease::Terms {
            n: opts.n,
            ttl_ms: ttl,
            keep: a.lease_keep,
        };
        lease_id = key.leases().grant(terms, now, random::u64).unwrap_or(0);
    }
    // What a denial waits for: one token for a peek, the chunk (at most n)
    // for ATMOST, else all n.
    let target = match (opts.n, opts.atmost) {
        (0, _) => 1,
        (n, true) => opts.min.unwrap_or(1).min(n),
        (n, false) => n,
    };
    lease::wait_with_leases(&mut o, &key.leases(), target, now);
    if o.dirty {
        key.commit(&o.bucket);
    }
    drop(key);
    stats::record(&o, opts.n);
    top::record(&o, now, || args.bytes(1));
    Ok((o, lease_id))
}

/// One try of a queued `TB.CONSUME ... BLOCK ms` (with `LEASE` or
/// `FLOW`) for the wait queue: the call as without BLOCK; with `dry`, the
/// denial, nothing written.
fn queued_try(ctx: &Ctx, args: &Args, dry: bool) -> Result<lease_wait::Try, CmdError> {
    let a = parse::consume_args(args)?;
    let n = a.options.n;
    if dry {
        let now = clock::now_us();
        let key = ctx.read_bucket(args.key(1))?;
        let stored = key.stored_at(now);
        let left = stored.map_or(a.limits.capacity, |b| b.whole_tokens(now));
        let mut o = bucket::consume(stored.as_ref(), a.limits, n, Mode::All, now);
        lease::wait_with_leases(&mut o, &key.leases(), n.max(1), now);
        let retry = if o.kind == Kind::Allowed {
            0
        } else {
            o.retry_after_ms
        };
        let mut reply = vec![0, left as i64, retry, o.reset_after_ms, 0];
        if a.lease_ttl_ms.is_some() {
            reply.push(0);
        }
        return Ok(lease_wait::Try {
            granted: false,
            retry_after_ms: retry,
            never: n > a.limits.capacity,
            blocking: 0,
            reply,
        });
    }
    queued_now(ctx, args, &a)
}

/// The call as without BLOCK, for the wait queue.
fn queued_now(ctx: &Ctx, args: &Args, a: &parse::ConsumeArgs) -> Result<lease_wait::Try, CmdError> {
    let (o, lease_id) = take(ctx, args, a, Mode::All)?;
    let mut reply = vec![
        i64::from(o.allowed()),
        o.remaining as i64,
        o.retry_after_ms,
        o.reset_after_ms,
        o.granted as i64,
    ];
    if a.lease_ttl_ms.is_some() {
        reply.push(lease_id as i64);
    }
    Ok(lease_wait::Try {
        granted: o.allowed(),
        retry_after_ms: o.retry_after_ms,
        never: a.options.n > a.limits.capacity,
        blocking: 0,
        reply,
    })
}
