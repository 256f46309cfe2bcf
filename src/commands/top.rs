//! `TB.TOP [DENIED | WAITS] [COUNT n]`: the keys this node denied most (or
//! made callers wait longest for) recently, from the fixed-size sketches of
//! [`crate::glue::top`]. Read-only and key-less: it runs on replicas (which
//! report only traffic they served themselves) and on any cluster node (each
//! answers for its own keys; clients merge the nodes' lists).
//!
//! Counts decay with a time constant of 60 s: a steady rate `r` reads as
//! `r * 60`, "about the events of the last minute"; `WAITS` counts
//! milliseconds of reservation wait granted.
//!
//! Reply: a flat field/value array: `metric`, `enabled`, `tau_ms`,
//! `capacity`, `memory_bytes`, `total`, `error_bound`, then `keys`: an array
//! of `[key, count, error]`, heaviest first. Every count is at most its
//! `error` too high (`count - error` is a guaranteed lower bound), every
//! `error` is at most `error_bound`, and a key not listed has at most
//! `error_bound`. Decimal figures are strings rounded to three decimals.

use crate::errors;
use crate::glue::command::{integer, one_of, pure_token, Arity, Command, Keys, Spec};
use crate::glue::entry::{Args, CmdResult, Ctx};
use crate::glue::{clock, top};
use crate::parse::{self, TopMetric};

/// `TB.TOP`.
pub struct Top;

impl Command for Top {
    const SPEC: &'static Spec = &Spec {
        name: c"tb.top",
        run,
        arity: Arity::AtLeast(1),
        flags: c"readonly allow-stale allow-loading",
        keys: Keys::None,
        acl: c"read slow",
        summary: c"Lists the keys this node denied most, or made wait longest, recently",
        args: &[
            one_of(
                c"metric",
                &[
                    pure_token(c"denied", c"DENIED"),
                    pure_token(c"waits", c"WAITS"),
                ],
            )
            .optional(),
            integer(c"count").token(c"COUNT").optional(),
        ],
    };
}

fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    let opts = parse::top_options(
        (1..args.len()).map(|i| args.bytes(i)),
        top::CAPACITY as u64,
        errors::ERR_TOP_COUNT,
    )?;
    let now = clock::now_us();
    let (s, memory) = top::summary(opts.metric, opts.count as usize, now);
    let r = ctx.reply();
    r.array(16);
    r.bulk(b"metric");
    r.bulk(match opts.metric {
        TopMetric::Denied => b"denied",
        TopMetric::Waits => b"waits",
    });
    r.bulk(b"enabled");
    r.int(i64::from(top::enabled()));
    r.bulk(b"tau_ms");
    r.int(top::TAU_US / 1000);
    r.bulk(b"capacity");
    r.int(top::CAPACITY as i64);
    r.bulk(b"memory_bytes");
    r.int(memory as i64);
    r.bulk(b"total");
    r.bulk(decimal(s.total).as_bytes());
    r.bulk(b"error_bound");
    r.bulk(decimal(s.error_bound).as_bytes());
    r.bulk(b"keys");
    r.array(s.hits.len());
    for h in &s.hits {
        r.array(3);
        r.bulk(&h.key);
        r.bulk(decimal(h.count).as_bytes());
        r.bulk(decimal(h.error).as_bytes());
    }
    Ok(())
}

/// Three decimals (the bounds above hold to within this rounding).
fn decimal(x: f64) -> String {
    format!("{x:.3}")
}
