//! `TB.SETSTATE key state` or `TB.SETSTATE key tokens updated_us rate_num
//! rate_den capacity expire_at_ms`: internal. Sets a bucket's absolute state;
//! this is what replicas and the AOF receive instead of `TB.CONSUME`, so they
//! never re-run a clock-dependent command. Deterministic: it reads no clock.
//!
//! Replication and AOF rewrite send the compact binary `state`
//! ([`crate::codec::wire`], recognised by its first byte; tag 2 carries the
//! bucket's leases); the decimal form, which has no leases,
//! with `expire_at_ms` 0 for no expiry, is accepted too, for people and tools.

use redis_module::raw;

use crate::bucket::{Bucket, Rate};
use crate::codec::wire;
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::BucketKey;
use crate::lease::Leases;
use crate::parse;

const ERR_STATE: &str = "ERR invalid bucket state for TB.SETSTATE";

/// Handler of `TB.SETSTATE`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let (b, leases, at_ms) = match args.len() {
        3 => wire::decode_state(args.bytes(2)).ok_or(ERR_STATE)?,
        8 => {
            let (b, at_ms) = decimal_state(args)?;
            (b, Leases::default(), at_ms)
        }
        _ => return Err(CmdError::WrongArity),
    };
    let key = BucketKey::open(ctx.raw, args.raw(1), true);
    key.get()?;
    key.set_leases(leases);
    key.put(&b);
    key.set_expire_at(at_ms);
    // SAFETY: ctx and the key name are live for this command.
    unsafe {
        raw::RedisModule_SignalModifiedKey.unwrap()(ctx.raw, args.raw(1));
        raw::RedisModule_ReplicateVerbatim.unwrap()(ctx.raw);
    }
    ctx.reply().ok();
    Ok(())
}

/// The bucket and absolute expiry of the decimal form.
fn decimal_state(args: &Args) -> Result<(Bucket, i64), CmdError> {
    let num = |i: usize| parse::signed(args.bytes(i), ERR_STATE);
    let (tokens, updated, rnum, rden, cap, at) =
        (num(2)?, num(3)?, num(4)?, num(5)?, num(6)?, num(7)?);
    let in_i64 = |v: i128| i64::try_from(v).map_err(|_| ERR_STATE);
    let in_u64 = |v: i128| u64::try_from(v).map_err(|_| ERR_STATE);
    let rate = Rate::new(in_u64(rnum)? as u128, in_u64(rden)? as u128).ok_or(ERR_STATE)?;
    let b = Bucket {
        tokens,
        updated_us: in_i64(updated)?,
        rate,
        capacity: in_u64(cap)?,
    };
    let at_ms = in_i64(at)?;
    if !b.is_valid() || at_ms < 0 {
        return Err(ERR_STATE.into());
    }
    Ok((b, at_ms))
}
