//! `TB.SETSTATE key state` or `TB.SETSTATE key tokens updated_us rate_num
//! rate_den capacity expire_at_ms`: internal. Sets a bucket's absolute state;
//! this is what replicas and the AOF receive instead of `TB.CONSUME`, so they
//! never re-run a clock-dependent command. Deterministic: it reads no clock.
//!
//! Replication and AOF rewrite send the compact binary `state`
//! ([`crate::bucket::wire`], recognised by its first byte); the decimal form,
//! with `expire_at_ms` 0 for no expiry, is accepted too, for people and tools.

use crate::glue::command::{block, integer, key, one_of, string, Access, Arity, Command};
use crate::glue::command::{Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::parse;

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

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::setstate_args(args)?;
    let key = ctx.open_bucket(args.key(1))?;
    key.set_state(&a.bucket, a.expire_at_ms);
    ctx.reply().ok();
    Ok(())
}
