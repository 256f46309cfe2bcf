//! `TB.RELEASE key lease-id [USED n]`: gives a lease's tokens back to the
//! bucket (never above its capacity). With `USED n` it settles the lease to
//! what was used: `lease tokens - n` come back, or, when `n` is more than
//! the lease, the overrun is charged, into debt if need be (later callers
//! wait for it). Idempotent: a lease is released once; releasing it again
//! (a retried call whose reply was lost), or after it expired, changes
//! nothing and replies nil.
//!
//! Not `deny-oom`: giving back takes no memory (the lease's state shrinks),
//! so a lease can be returned when a tenant has filled memory.
//!
//! Reply: the whole tokens that actually went back, the increase of the
//! bucket's level after the cap at capacity (0 when it was full already, so
//! summing replies never overcounts), or negative, the overrun charged; nil
//! when the key holds no such lease.

use crate::glue::command::{integer, key, Access, Arity, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::{clock, lease_wait, stats};
use crate::{lease, parse};

/// `TB.RELEASE`.
pub struct Release;

impl Command for Release {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.release",
        run,
        arity: Arity::AtLeast(3),
        flags: c"write fast",
        keys: Keys::One(Access::Update),
        acl: c"write fast",
        summary: c"Gives a lease's tokens back once, or settles it to the tokens used",
        args: &[
            key(c"key"),
            integer(c"lease-id"),
            integer(c"used").token(c"USED").optional(),
        ],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let (id, used) = parse::release_command(args)?;
    let now = clock::now_us();
    let key = ctx.open_bucket_to_shrink(args.key(1))?;
    let Some(mut b) = crate::decide::expire(key.stored(), &mut key.leases(), now) else {
        ctx.reply().null();
        return Ok(());
    };
    let released = lease::release(&mut b, &mut key.leases(), id, used, now);
    let Some(released) = released else {
        ctx.reply().null();
        return Ok(());
    };
    key.commit(&b);
    drop(key);
    // The tokens back go first to calls waiting for a lease on this key.
    lease_wait::after_give_back(ctx, args.bytes(1));
    stats::REFUNDS.add(1);
    ctx.reply()
        .int(released.returned.clamp(i64::MIN as i128, i64::MAX as i128) as i64);
    Ok(())
}
