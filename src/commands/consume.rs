//! `TB.CONSUME key rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST [MIN
//! chunk]]`: take `n` tokens (default 1) from the bucket under `key`,
//! refilled lazily at `rate` up to `capacity`. `ATMOST MIN chunk` grants at
//! least `min(chunk, n)` tokens or nothing (a denial waits for that many).
//!
//! Reply: `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`.

use crate::bucket::{self, Kind, Limits, Mode};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{blocking, clock, config, stats, top};
use crate::parse::{self, Wait, ERR_CAPACITY, ERR_MIN};

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
    let opts = parse::consume_options((4..args.len()).map(|i| args.bytes(i)))?;
    let min = opts.min.unwrap_or(1);
    if opts.min.is_some_and(|c| c > limits.capacity) {
        return Err(ERR_MIN.into());
    }
    let mode = match opts.wait {
        Wait::No if opts.atmost => Mode::AtMost { min },
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
    let stored = key.get()?;
    let o = bucket::consume(stored.as_ref(), limits, opts.n, mode, now);
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
    ctx.reply().ints(&reply);
    Ok(())
}
