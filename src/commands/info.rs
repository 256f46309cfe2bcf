//! `TB.INFO key`: the bucket's state as of now, read-only (runs on replicas).
//!
//! Reply: a flat field/value array (`tokens`, `capacity`, `rate`,
//! `updated_at_ms`, `reset_after_ms`, `ttl_ms`), or nil for a missing key.

use crate::glue::clock;
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::BucketKey;

/// Handler of `TB.INFO`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if args.len() != 2 {
        return Err(CmdError::WrongArity);
    }
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), false);
    let r = ctx.reply();
    let Some(stored) = key.get()? else {
        r.null();
        return Ok(());
    };
    r.array(12);
    r.bulk(b"tokens");
    r.bulk(stored.tokens_decimal(now).as_bytes());
    r.bulk(b"capacity");
    r.int(stored.capacity as i64);
    r.bulk(b"rate");
    r.bulk(stored.rate.to_decimal().as_bytes());
    r.bulk(b"updated_at_ms");
    r.int(stored.updated_us.div_euclid(1000));
    r.bulk(b"reset_after_ms");
    r.int(stored.reset_after_ms(now));
    r.bulk(b"ttl_ms");
    r.int(key.ttl_ms());
    Ok(())
}
