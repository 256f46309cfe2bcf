//! `TB.CONSUME key rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST]
//! [LEASE ttl-ms]`: take `n` tokens (default 1) from the bucket under `key`,
//! refilled lazily at `rate` up to `capacity`. With `LEASE`, the tokens are
//! lent: `TB.RELEASE` gives them back, or they come back `ttl-ms` later
//! ([`crate::lease`]).
//!
//! Reply: `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`,
//! and with `LEASE` a sixth element, the lease id (0 when denied).

use crate::bucket::{self, Kind, Limits, Mode};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{blocking, clock, config, stats, top};
use crate::lease;
use crate::parse::{self, Wait, ERR_CAPACITY};

const ERR_CANNOT_BLOCK: &str =
    "ERR BLOCK cannot wait inside MULTI, a script, or on a client that cannot block: use RESERVE and wait on the client";

/// Handler of `TB.CONSUME`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if args.len() < 4 {
        return Err(CmdError::WrongArity);
    }
    let limits = Limits {
        rate: parse::rate(args.bytes(2))?,
        capacity: parse::amount(args.bytes(3), ERR_CAPACITY)?,
    };
    let rest: Vec<&[u8]> = (4..args.len()).map(|i| args.bytes(i)).collect();
    let (lease_ttl, rest) = parse::split_lease(&rest)?;
    let opts = parse::consume_options(rest.into_iter())?;
    if lease_ttl.is_some() {
        if opts.atmost || opts.wait != Wait::No {
            return Err(parse::ERR_LEASE_MODE.into());
        }
        if opts.n == 0 {
            return Err(parse::ERR_LEASE_N.into());
        }
    }
    let mode = match opts.wait {
        Wait::No if opts.atmost => Mode::AtMost,
        Wait::No => Mode::All,
        Wait::Reserve(ms) | Wait::Block(ms) => {
            let max = config::max_wait_ms();
            if ms > max {
                return Err(CmdError::Owned(parse::err_wait_exceeds(max)));
            }
            Mode::Reserve {
                max_wait_us: ms * 1000,
            }
        }
    };
    let block = matches!(opts.wait, Wait::Block(_));
    if block && !blocking::can_block(ctx.raw) {
        return Err(ERR_CANNOT_BLOCK.into());
    }
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), true);
    let stored = key.get_at(now)?;
    if lease_ttl.is_some() && !key.leases().has_room() {
        return Err(parse::ERR_LEASE_FULL.into());
    }
    let mut o = bucket::consume(stored.as_ref(), limits, opts.n, mode, now);
    let mut lease_id = 0;
    if let (Some(ttl), Kind::Allowed) = (lease_ttl, o.kind) {
        lease_id = key.leases().grant(opts.n, ttl, now).unwrap_or(0);
    }
    let target = if opts.n == 0 || opts.atmost {
        1
    } else {
        opts.n
    };
    lease::wait_with_leases(&mut o, &key.leases(), target, now);
    if o.dirty {
        store::commit(ctx.raw, &key, &o.bucket);
    }
    drop(key);
    stats::record(&o, opts.n);
    top::record(&o, now, || args.bytes(1));
    let reply = [
        i64::from(o.allowed()),
        o.remaining as i64,
        o.retry_after_ms,
        o.reset_after_ms,
        o.granted as i64,
    ];
    if block && o.kind == Kind::Reserved && blocking::has_room() {
        let due = [
            1,
            0,
            0,
            (o.reset_after_ms - o.retry_after_ms).max(0),
            o.granted as i64,
        ];
        if blocking::block_for(ctx.raw, o.retry_after_ms, due) {
            return Ok(());
        }
    }
    if lease_ttl.is_some() {
        let mut with_id = reply.to_vec();
        with_id.push(lease_id as i64);
        ctx.reply().ints(&with_id);
    } else {
        ctx.reply().ints(&reply);
    }
    Ok(())
}
