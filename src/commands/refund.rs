//! `TB.REFUND key n`: give back `n` tokens, never above capacity (reserve an
//! estimate, refund the unused part). A missing key is a full bucket already,
//! so nothing happens.
//!
//! Reply: the whole tokens remaining, or nil for a missing key.

use crate::bucket;
use crate::glue::command::{integer, key, Access, Arity, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::{clock, lease_wait, stats};
use crate::parse;

/// `TB.REFUND`.
pub struct Refund;

impl Command for Refund {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.refund",
        run,
        arity: Arity::Exactly(3),
        flags: c"write deny-oom fast",
        keys: Keys::One(Access::Update),
        acl: c"write fast",
        summary: c"Gives n tokens back to a bucket, never above its capacity",
        args: &[key(c"key"), integer(c"n")],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let n = parse::refund_args(args)?;
    let now = clock::now_us();
    let key = ctx.open_bucket(args.key(1))?;
    let Some(b) = bucket::refund(
        crate::decide::expire(key.stored(), &mut key.leases(), now).as_ref(),
        n,
        now,
    ) else {
        ctx.reply().null();
        return Ok(());
    };
    if n > 0 {
        key.commit(&b);
        drop(key);
        // The tokens back go first to calls waiting for a lease on this key.
        lease_wait::after_give_back(ctx, args.bytes(1));
        stats::REFUNDS.add(1);
    }
    ctx.reply().int(b.whole_tokens(now) as i64);
    Ok(())
}
