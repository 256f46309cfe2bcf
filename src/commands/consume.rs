//! `TB.CONSUME key rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST [MIN
//! chunk]]`: take `n` tokens (default 1) from the bucket under `key`,
//! refilled lazily at `rate` up to `capacity`. `ATMOST MIN chunk` grants at
//! least `min(chunk, n)` tokens or nothing (a denial waits for that many).
//!
//! Reply: `[allowed, remaining, retry_after_ms, reset_after_ms, granted]`.

use crate::bucket::{self, Kind, Mode};
use crate::glue::command::{block, integer, key, one_of, pure_token, string, Access, Arity};
use crate::glue::command::{Arg, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::{blocking, clock, config, stats, top};
use crate::parse::{self, Wait};

/// `TB.CONSUME`.
pub struct Consume;

impl Command for Consume {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.consume",
        run,
        arity: Arity::AtLeast(4),
        flags: c"write deny-oom fast",
        keys: Keys::One(Access::Update),
        acl: c"write fast",
        summary: c"Takes n tokens (default 1) from a token bucket refilled at rate up to capacity",
        args: &[
            key(c"key"),
            string(c"rate"),
            integer(c"capacity"),
            integer(c"n").optional(),
            one_of(
                c"wait",
                &[
                    integer(c"reserve-ms").token(c"RESERVE"),
                    integer(c"block-ms").token(c"BLOCK"),
                ],
            )
            .optional(),
            block(c"atmost", ATMOST_ARGS).optional(),
        ],
    };
}

/// `ATMOST [MIN chunk]` in the docs of both consume commands: a partial
/// grant, of at least `chunk` tokens.
pub const ATMOST_ARGS: &[Arg] = &[
    pure_token(c"atmost", c"ATMOST"),
    integer(c"chunk").token(c"MIN").optional(),
];

const ERR_CANNOT_BLOCK: &str =
    "ERR BLOCK cannot wait inside MULTI, a script, or on a client that cannot block: use RESERVE and wait on the client";

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::consume_args(args)?;
    let opts = a.options;
    let mode = match opts.wait {
        Wait::No if opts.atmost => Mode::AtMost {
            min: opts.min.unwrap_or(1),
        },
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
    if block && !blocking::can_block(ctx) {
        return Err(ERR_CANNOT_BLOCK.into());
    }
    let now = clock::now_us();
    let key = ctx.open_bucket(args.key(1))?;
    let o = bucket::consume(key.stored().as_ref(), a.limits, opts.n, mode, now);
    if o.dirty {
        key.commit(&o.bucket);
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
    if block
        && o.kind == Kind::Reserved
        && blocking::has_room(ctx)
        && blocking::block_for(ctx, o.retry_after_ms, args.key(1), a.limits, o.granted)
    {
        return Ok(());
    }
    ctx.reply().ints(&reply);
    Ok(())
}
