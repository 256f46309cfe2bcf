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

use redis_module::raw;

use crate::bucket::{self, Limits, Mode, Part};
use crate::glue::entry::{Args, CmdError, CmdResult, Ctx};
use crate::glue::store::{self, BucketKey};
use crate::glue::{clock, config, stats, top};
use crate::parse::{self, ERR_CAPACITY, ERR_MIN, ERR_N};

const ERR_NUMKEYS: &str = "ERR numkeys must be an integer from 1 to 1000 and match the arguments";
const ERR_DUPLICATE: &str = "ERR a key appears twice in TB.MCONSUME";
const ERR_OPTION: &str = "ERR unknown option: TB.MCONSUME takes RESERVE ms, or ATMOST [MIN chunk]";

/// Largest numkeys accepted.
const MAX_KEYS: u64 = 1000;

/// Handler of `TB.MCONSUME`.
pub fn run(ctx: &Ctx, args: &Args) -> CmdResult {
    if key_positions(ctx, args) {
        return Ok(());
    }
    if args.len() < 6 {
        return Err(CmdError::WrongArity);
    }
    let k = parse::integer(args.bytes(1), MAX_KEYS, ERR_NUMKEYS)? as usize;
    let triples = 2 + k;
    if k == 0 || args.len() < triples + 3 * k {
        return Err(ERR_NUMKEYS.into());
    }
    let mut mode = Mode::All;
    let opt = |i: usize| args.bytes(triples + 3 * k + i);
    let mut chunk = None;
    match args.len() - (triples + 3 * k) {
        0 => {}
        1 if parse::is_keyword(opt(0), "ATMOST") => mode = Mode::AtMost { min: 1 },
        3 if parse::is_keyword(opt(0), "ATMOST") && parse::is_keyword(opt(1), "MIN") => {
            let c = parse::chunk(opt(2))?;
            chunk = Some(c);
            mode = Mode::AtMost { min: c };
        }
        2 if parse::is_keyword(args.bytes(triples + 3 * k), "RESERVE") => {
            let ms = parse::integer(
                args.bytes(triples + 3 * k + 1),
                parse::MAX_WAIT_MS,
                parse::ERR_WAIT,
            )?;
            let max = config::max_wait_ms();
            if ms > max {
                return Err(CmdError::Owned(parse::err_wait_exceeds(max)));
            }
            mode = Mode::Reserve {
                max_wait_us: ms * 1000,
            };
        }
        _ => return Err(ERR_OPTION.into()),
    }
    let mut parts = Vec::with_capacity(k);
    for i in 0..k {
        let at = triples + 3 * i;
        parts.push(Part {
            stored: None,
            limits: Limits {
                rate: parse::rate(args.bytes(at))?,
                capacity: parse::amount(args.bytes(at + 1), ERR_CAPACITY)?,
            },
            n: parse::amount(args.bytes(at + 2), ERR_N)?,
        });
    }
    if let Some(c) = chunk {
        // MIN is checked against the capacity of every quantity part.
        let big = parts.iter().map(|p| p.n).max().unwrap_or(0);
        if parts.iter().any(|p| p.n == big && c > p.limits.capacity) {
            return Err(ERR_MIN.into());
        }
    }
    for i in 0..k {
        for j in 0..i {
            if args.bytes(2 + i) == args.bytes(2 + j) {
                return Err(ERR_DUPLICATE.into());
            }
        }
    }
    let now = clock::now_us();
    let keys: Vec<BucketKey> = (0..k)
        .map(|i| BucketKey::open(ctx.raw, args.raw(2 + i), true))
        .collect();
    for (part, key) in parts.iter_mut().zip(&keys) {
        part.stored = key.get()?;
    }
    let o = bucket::consume_all(&parts, mode, now);
    for ((key, b), dirty) in keys.iter().zip(&o.buckets).zip(&o.dirty) {
        if *dirty {
            store::commit(ctx.raw, key, b);
        }
    }
    let atmost = matches!(mode, Mode::AtMost { .. });
    stats::record_multi(o.allowed, o.retry_after_ms, o.taken.iter().sum());
    top::record_multi(&parts, &o, now, |i| args.bytes(2 + i));
    let r = ctx.reply();
    r.array(2 + k + usize::from(atmost));
    r.int(i64::from(o.allowed));
    r.int(o.retry_after_ms);
    for &left in &o.remaining {
        r.int(left as i64);
    }
    if atmost {
        r.int(o.granted as i64);
    }
    Ok(())
}

/// Answers Redis' question "where are the keys?" (COMMAND GETKEYS, cluster
/// routing, ACL checks): arguments 2 to 1 + numkeys. Returns true if this
/// call was such a question.
fn key_positions(ctx: &Ctx, args: &Args) -> bool {
    // SAFETY: ctx is the live context of this call.
    unsafe {
        if raw::RedisModule_IsKeysPositionRequest.unwrap()(ctx.raw) == 0 {
            return false;
        }
        if args.len() >= 2 {
            if let Ok(k) = parse::integer(args.bytes(1), MAX_KEYS, ERR_NUMKEYS) {
                for i in 0..(k as usize).min(args.len() - 2) {
                    raw::RedisModule_KeyAtPos.unwrap()(ctx.raw, (2 + i) as i32);
                }
            }
        }
    }
    true
}
