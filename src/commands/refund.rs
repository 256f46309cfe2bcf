//! `TB.REFUND key n`: give back `n` tokens, never above capacity (reserve an
//! estimate, refund the unused part). A missing key is a full bucket already,
//! so nothing happens.
//!
//! Reply: the whole tokens remaining, or nil for a missing key.

use crate::bucket;
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{clock, stats};
use crate::parse::{self, ERR_N};

/// Handler of `TB.REFUND`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if args.len() != 3 {
        return Err(CmdError::WrongArity);
    }
    let n = parse::amount(args.bytes(2), ERR_N)?;
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), true);
    let stored = key.get_at(now)?;
    let Some(b) = bucket::refund(stored.as_ref(), n, now) else {
        ctx.reply().null();
        return Ok(());
    };
    if n > 0 {
        store::commit(ctx.raw, &key, &b);
        stats::REFUNDS.add(1);
    }
    ctx.reply().int(b.whole_tokens(now) as i64);
    Ok(())
}
