//! `TB.INFO key`: the bucket's state as of now, read-only (runs on replicas).
//!
//! Reply: a flat field/value array (`tokens`, `capacity`, `rate`,
//! `updated_at_ms`, `reset_after_ms`, `ttl_ms`), or nil for a missing key.
//! A bucket that handed out leases adds `leases` (how many are held now)
//! and `next_lease_expiry_ms` (ms until the first expires, -1: none held).

use crate::glue::clock;
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::BucketKey;
use crate::lease;

/// Handler of `TB.INFO`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if args.len() != 2 {
        return Err(CmdError::WrongArity);
    }
    let now = clock::now_us();
    let key = BucketKey::open(ctx.raw, args.raw(1), false);
    let r = ctx.reply();
    let Some(stored) = key.get_at(now)? else {
        r.null();
        return Ok(());
    };
    let leases = key.leases().clone();
    r.array(if leases.is_blank() { 12 } else { 16 });
    r.bulk(b"tokens");
    r.bulk(stored.tokens_decimal(now).as_bytes());
    r.bulk(b"capacity");
    r.int(stored.capacity as i64);
    r.bulk(b"rate");
    r.bulk(stored.rate.to_decimal().as_bytes());
    r.bulk(b"updated_at_ms");
    r.int(stored.updated_us.div_euclid(1000));
    r.bulk(b"reset_after_ms");
    r.int(lease::reset_after_ms(&stored, &leases, now));
    r.bulk(b"ttl_ms");
    r.int(key.ttl_ms());
    if !leases.is_blank() {
        r.bulk(b"leases");
        r.int(leases.held.len() as i64);
        r.bulk(b"next_lease_expiry_ms");
        r.int(lease::next_expiry_ms(&leases, now));
    }
    Ok(())
}
