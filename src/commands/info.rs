//! `TB.INFO key`: the bucket's state as of now, read-only (runs on replicas,
//! and for ACL users with read-only key patterns).
//!
//! Reply: a flat field/value array (`tokens`, `capacity`, `rate`,
//! `updated_at_ms`, `reset_after_ms`, `ttl_ms`), or nil for a missing key.
//! A bucket that handed out leases adds `leases` (how many are held now)
//! and `next_lease_expiry_ms` (ms until the first expires, -1: none held).
//! While calls wait in the bucket's queue: `waiting` (how many) and
//! `waiting_flows` (`[name, weight, waiting, ...]`, in the order the flows
//! are served next).

use crate::glue::command::{key, Access, Arity, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::{clock, lease_wait};
use crate::{lease, parse};

/// `TB.INFO`.
pub struct Info;

impl Command for Info {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.info",
        run,
        arity: Arity::Exactly(2),
        flags: c"readonly fast",
        keys: Keys::One(Access::Read),
        acl: c"read fast",
        summary: c"Shows a bucket's tokens, limits and expiry as of now, without writing",
        args: &[key(c"key")],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    parse::info_args(args)?;
    let now = clock::now_us();
    let key = ctx.read_bucket(args.key(1))?;
    let r = ctx.reply();
    let Some(stored) = crate::decide::expire(key.stored(), &mut key.leases(), now) else {
        r.null();
        return Ok(());
    };
    let leases = key.leases().clone();
    let (waiting, flows) = lease_wait::waiting_on(ctx, args.bytes(1));
    let fields = 6 + if leases.is_blank() { 0 } else { 2 } + if waiting > 0 { 2 } else { 0 };
    r.array(2 * fields);
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
    if waiting > 0 {
        r.bulk(b"waiting");
        r.int(waiting as i64);
        r.bulk(b"waiting_flows");
        r.array(3 * flows.len());
        for (name, weight, n) in &flows {
            r.bulk(name);
            r.int(*weight as i64);
            r.int(*n as i64);
        }
    }
    Ok(())
}
