//! `TB.RELEASE key lease-id [USED n]`: gives a lease's tokens back to the
//! bucket (never above its capacity). With `USED n` it settles the lease to
//! what was used: `lease tokens - n` come back, or, when `n` is more than
//! the lease, the overrun is charged, into debt if need be (later callers
//! wait for it). Idempotent: a lease is released once; releasing it again
//! (a retried call whose reply was lost), or after it expired, changes
//! nothing and replies nil.
//!
//! Reply: the tokens given back (negative: the overrun charged), or nil
//! when the key holds no such lease.

use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{clock, stats};
use crate::{lease, parse};

/// Handler of `TB.RELEASE`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if args.len() != 3 && args.len() != 5 {
        return Err(CmdError::WrongArity);
    }
    let rest: Vec<&[u8]> = (2..args.len()).map(|i| args.bytes(i)).collect();
    let (id, used) = parse::release_args(&rest)?;
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), true);
    let Some(mut b) = key.get_at(now)? else {
        ctx.reply().null();
        return Ok(());
    };
    let released = lease::release(&mut b, &mut key.leases(), id, used, now);
    let Some(released) = released else {
        ctx.reply().null();
        return Ok(());
    };
    store::commit(ctx.raw, &key, &b);
    stats::REFUNDS.add(1);
    ctx.reply()
        .int(released.returned.clamp(i64::MIN as i128, i64::MAX as i128) as i64);
    Ok(())
}
