//! `CL.THROTTLE key max_burst count period [quantity]`: a drop-in for
//! redis-cell and Dragonfly, with their exact reply, on the same data type:
//! capacity = max_burst + 1, rate = count / period tokens per second.
//!
//! Reply: `[limited, max_burst + 1, remaining, retry_after_s (-1 when
//! allowed or never), reset_after_s]`, seconds rounded up.

use crate::bucket::{self, Limits, Mode, Rate, MAX_AMOUNT};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{clock, stats, top};
use crate::parse;

const ERR_BURST: &str = "ERR max_burst must be an integer from 0 to 9007199254740991";
const ERR_COUNT: &str = "ERR count must be an integer from 0 to 9007199254740992";
const ERR_PERIOD: &str =
    "ERR period must be an integer number of seconds from 1 to 9007199254740992";
const ERR_QUANTITY: &str = "ERR quantity must be an integer from 0 to 9007199254740992";

fn ceil_secs(ms: i64) -> i64 {
    if ms < 0 {
        -1
    } else {
        (ms + 999) / 1000
    }
}

/// Handler of `CL.THROTTLE`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if !(5..=6).contains(&args.len()) {
        return Err(CmdError::WrongArity);
    }
    let burst = parse::integer(args.bytes(2), MAX_AMOUNT - 1, ERR_BURST)?;
    let count = parse::amount(args.bytes(3), ERR_COUNT)?;
    let period = parse::amount(args.bytes(4), ERR_PERIOD)?;
    if period == 0 {
        return Err(ERR_PERIOD.into());
    }
    let quantity = match args.len() {
        6 => parse::amount(args.bytes(5), ERR_QUANTITY)?,
        _ => 1,
    };
    let rate = Rate::new(u128::from(count), u128::from(period)).ok_or(parse::ERR_RATE_RANGE)?;
    let limits = Limits {
        rate,
        capacity: burst + 1,
    };
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), true);
    let stored = key.get_at(now)?;
    let o = bucket::consume(stored.as_ref(), limits, quantity, Mode::All, now);
    if o.dirty {
        store::commit(ctx.raw, &key, &o.bucket);
    }
    stats::record(&o, quantity);
    top::record(&o, now, || args.bytes(1));
    let retry = if o.allowed() {
        -1
    } else {
        ceil_secs(o.retry_after_ms)
    };
    ctx.reply().ints(&[
        i64::from(!o.allowed()),
        (burst + 1) as i64,
        o.remaining as i64,
        retry,
        ceil_secs(o.reset_after_ms),
    ]);
    Ok(())
}
