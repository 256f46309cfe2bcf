//! `CL.THROTTLE key max_burst count period [quantity]`: a drop-in for
//! redis-cell and Dragonfly, with their exact reply, on the same data type:
//! capacity = max_burst + 1, rate = count / period tokens per second.
//!
//! Reply: `[limited, max_burst + 1, remaining, retry_after_s (-1 when
//! allowed or never), reset_after_s]`, seconds rounded up ([`crate::cell`]:
//! a quantity of 0 is always allowed, as in redis-cell).

use crate::bucket::{self, Mode};
use crate::glue::command::{integer, key, Access, Arity, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::{clock, stats, top};
use crate::{cell, parse};

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

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::throttle_args(args)?;
    let now = clock::now_us();
    let key = ctx.open_bucket(args.key(1))?;
    let o = bucket::consume(
        crate::decide::expire(key.stored(), &mut key.leases(), now).as_ref(),
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
    ctx.reply()
        .ints(&cell::reply(&o, a.quantity, a.limits.capacity, now));
    Ok(())
}
