//! `TB.CONSUME key rate capacity [n]`: take `n` tokens (default 1) from the
//! bucket under `key`, refilled lazily at `rate` up to `capacity`.
//!
//! Reply: `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`.

use crate::bucket::{self, Limits, Mode};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{clock, stats};
use crate::parse::{self, ERR_CAPACITY, ERR_N};

/// Handler of `TB.CONSUME`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if !(4..=5).contains(&args.len()) {
        return Err(CmdError::WrongArity);
    }
    let limits = Limits {
        rate: parse::rate(args.bytes(2))?,
        capacity: parse::amount(args.bytes(3), ERR_CAPACITY)?,
    };
    let n = match args.len() {
        5 => parse::amount(args.bytes(4), ERR_N)?,
        _ => 1,
    };
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), true);
    let stored = key.get()?;
    let o = bucket::consume(stored.as_ref(), limits, n, Mode::All, now);
    if o.dirty {
        store::commit(ctx.raw, &key, &o.bucket);
    }
    stats::record(&o);
    ctx.reply().ints(&[
        i64::from(o.allowed()),
        o.remaining as i64,
        o.retry_after_ms,
        o.reset_after_ms,
        o.granted as i64,
    ]);
    Ok(())
}
