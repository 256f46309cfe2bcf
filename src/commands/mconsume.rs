//! `TB.MCONSUME numkeys key [key ...] rate capacity n [rate capacity n ...]
//! [RESERVE ms | ATMOST [MIN chunk]]`: all-or-nothing across several buckets
//! (requests and tokens per minute, per tenant and per key): either every
//! bucket gives its `n`, or none changes. With `ATMOST`, the parts with the
//! largest `n` share one partial grant `g` (at least `min(chunk, n)`), taken
//! from each of them (see [`bucket::consume_all`]). All keys must hash to
//! one slot in a cluster (use hash tags).
//!
//! Reply: `[allowed, retry_after_ms, remaining_1, ..., remaining_k]`, and
//! with `ATMOST` one more element, `granted` (`g`, 0 when denied).

use super::consume::ATMOST_ARGS;
use crate::bucket::{self, Mode, Part};
use crate::glue::command::{
    block, integer, key, one_of, string, Access, Arity, Command, Keys, Spec,
};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{BucketKey, Write};
use crate::glue::{clock, config, stats, top};
use crate::parse;

/// `TB.MCONSUME`.
pub struct Mconsume;

impl Command for Mconsume {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.mconsume",
        run,
        arity: Arity::AtLeast(6),
        flags: c"write deny-oom getkeys-api",
        keys: Keys::Counted(Access::Update),
        acl: c"write",
        summary: c"Takes tokens from several buckets in one slot, all or nothing",
        args: &[
            integer(c"numkeys"),
            key(c"key").multiple(),
            block(
                c"limit",
                &[string(c"rate"), integer(c"capacity"), integer(c"n")],
            )
            .multiple(),
            one_of(
                c"mode",
                &[
                    integer(c"reserve-ms").token(c"RESERVE"),
                    block(c"atmost", ATMOST_ARGS),
                ],
            )
            .optional(),
        ],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let a = parse::mconsume_args(args)?;
    let max = config::max_wait_ms();
    let mode = match (a.reserve_ms, a.atmost) {
        (None, Some(min)) => Mode::AtMost { min },
        (None, None) => Mode::All,
        (Some(ms), _) if ms > max => return Err(CmdError::Owned(parse::err_wait_exceeds(max))),
        (Some(ms), _) => Mode::Reserve {
            max_wait_us: ms * 1000,
        },
    };
    let now = clock::now_us();
    let keys = (0..a.requests.len())
        .map(|i| ctx.open_bucket(args.key(2 + i)))
        .collect::<Result<Vec<BucketKey<Write>>, _>>()?;
    let parts: Vec<Part> = a
        .requests
        .iter()
        .zip(&keys)
        .map(|(r, key)| Part {
            stored: key.stored(),
            limits: r.limits,
            n: r.n,
        })
        .collect();
    let o = bucket::consume_all(&parts, mode, now);
    for ((key, b), dirty) in keys.iter().zip(&o.buckets).zip(&o.dirty) {
        if *dirty {
            key.commit(b);
        }
    }
    let asked = parts.iter().map(|p| p.n).max().unwrap_or(0);
    let partial = a.atmost.is_some() && o.granted < asked;
    stats::record_multi(o.allowed, o.retry_after_ms, o.taken.iter().sum(), partial);
    top::record_multi(&o, now, |i| args.bytes(2 + i));
    let r = ctx.reply();
    r.array(2 + o.remaining.len() + usize::from(a.atmost.is_some()));
    r.int(i64::from(o.allowed));
    r.int(o.retry_after_ms);
    for &left in &o.remaining {
        r.int(left as i64);
    }
    if a.atmost.is_some() {
        r.int(o.granted as i64);
    }
    Ok(())
}
