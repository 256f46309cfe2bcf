//! `CL.THROTTLE key max_burst count period [quantity]`: a drop-in for
//! redis-cell and Dragonfly, with their exact reply, on the same data type:
//! capacity = max_burst + 1, rate = count / period tokens per second.
//!
//! Reply: `[limited, max_burst + 1, remaining, retry_after_s (-1 when
//! allowed or never), reset_after_s]`, seconds rounded up.

use crate::bucket::{self, Mode};
use crate::glue::command::{integer, key, Access, Arity, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::{clock, stats, top};
use crate::parse;

/// `CL.THROTTLE`.
pub struct Throttle;

impl Command for Throttle {
    const SPEC: &'static Spec = &Spec {
        name: c"cl.throttle",
        run,
        arity: Arity::Between(5, 6),
        flags: c"write deny-oom fast",
        keys: Keys::One(Access::Update),
        acl: c"write fast",
        summary: c"redis-cell compatible throttle: count per period with a burst of max_burst + 1",
        args: &[
            key(c"key"),
            integer(c"max_burst"),
            integer(c"count"),
            integer(c"period"),
            integer(c"quantity").optional(),
        ],
    };
}

fn ceil_secs(ms: i64) -> i64 {
    if ms < 0 {
        -1
    } else {
        (ms + 999) / 1000
    }
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::throttle_args(args)?;
    let now = clock::now_us();
    let key = ctx.open_bucket(args.key(1))?;
    let o = bucket::consume(
        key.stored_at(now).as_ref(),
        a.limits,
        a.quantity,
        Mode::All,
        now,
    );
    if o.dirty {
        key.commit(&o.bucket);
    }
    stats::record(&o, a.quantity);
    top::record(&o, now, || args.bytes(1));
    let retry = if o.allowed() {
        -1
    } else {
        ceil_secs(o.retry_after_ms)
    };
    ctx.reply().ints(&[
        i64::from(!o.allowed()),
        a.limits.capacity as i64,
        o.remaining as i64,
        retry,
        ceil_secs(o.reset_after_ms),
    ]);
    Ok(())
}
