//! `TB.SETSTATE key state`, `TB.SETSTATE key tokens updated_us rate_num
//! rate_den capacity expire_at_ms` or `TB.SETSTATE key DEL`: internal. Sets
//! a bucket's absolute state, or deletes it; this is what replicas and the
//! AOF receive instead of `TB.CONSUME`, so they never re-run a
//! clock-dependent command. Deterministic: it reads no clock.
//!
//! Replication and AOF rewrite send the compact binary `state`
//! ([`crate::codec::wire`], recognised by its first byte); the decimal form,
//! with `expire_at_ms` 0 for no expiry, is accepted too, for people and tools
//! (the compact state's tag 3 carries the bucket's leases; the decimal form
//! has none). A write to a bucket with leases replicates the tag 4 form
//! instead: the bucket and only the change to its leases (those expired,
//! released and granted), so its bytes do not grow with the leases held;
//! it is refused, changing nothing, when it does not fit the leases the key
//! holds.
//! A write that leaves a bucket full deletes its key and replicates `key
//! DEL`: the module's own command, which `rename-command` cannot take away
//! as it can `DEL`. The deletion form removes a bucket, never other data
//! (WRONGTYPE), and does nothing to a missing key.

use crate::glue::command::{
    block, integer, key, one_of, pure_token, string, Access, Arity, Command,
};
use crate::glue::command::{Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::setstate;
use crate::parse::{self, SetStateArgs};

/// `TB.SETSTATE`.
pub struct SetState;

impl Command for SetState {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.setstate",
        run,
        arity: Arity::AtLeast(3),
        flags: c"write deny-oom fast",
        keys: Keys::One(Access::Overwrite),
        acl: c"write fast dangerous",
        summary: c"Internal: sets a bucket's absolute state (what replicas and the AOF receive)",
        args: &[
            key(c"key"),
            one_of(
                c"state",
                &[
                    pure_token(c"delete", c"DEL"),
                    string(c"compact_state"),
                    block(
                        c"decimal_state",
                        &[
                            integer(c"tokens_nanos"),
                            integer(c"updated_us"),
                            integer(c"rate_num"),
                            integer(c"rate_den"),
                            integer(c"capacity"),
                            integer(c"expire_at_ms"),
                        ],
                    ),
                ],
            ),
        ],
    };
}

// The name registered is the name the glue replicates and writes to the AOF.
const _: () = assert!(
    same_name(SetState::SPEC.name.to_bytes(), setstate::NAME.to_bytes()),
    "TB.SETSTATE is registered under another name than the one emitted"
);

/// Whether two command names are equal, ignoring ASCII case (as Redis
/// does), at compile time.
const fn same_name(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if !a[i].eq_ignore_ascii_case(&b[i]) {
            return false;
        }
        i += 1;
    }
    true
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::setstate_args(args)?;
    let key = ctx.open_bucket(args.key(1))?;
    match a {
        SetStateArgs::State {
            bucket,
            leases,
            expire_at_ms,
        } => key.set_state(&bucket, leases, expire_at_ms),
        SetStateArgs::Delta {
            bucket,
            delta,
            expire_at_ms,
        } => key.apply_delta(&bucket, &delta, expire_at_ms)?,
        SetStateArgs::Delete => key.delete_state(),
    }
    ctx.reply().ok();
    Ok(())
}
