//! Pure argument parsing: bytes in, typed values or a clear error out.
//!
//! Arguments arrive as raw bytes (they may hold anything, including invalid
//! UTF-8). Every parser is strict: no signs, spaces, NaN or infinities, and
//! every number is range-checked, so a bad argument is rejected before any key
//! is touched. Error messages never echo the argument back.

use crate::bucket::{Bucket, Limits, Rate, MAX_AMOUNT};
use crate::codec::wire;
use crate::errors::{
    ERR_ATMOST_WAIT, ERR_BURST, ERR_CAPACITY, ERR_COUNT, ERR_DUPLICATE, ERR_FLOW_BLOCK,
    ERR_FLOW_NAME, ERR_LEASE_ID, ERR_LEASE_MODE, ERR_LEASE_N, ERR_LEASE_PART, ERR_LEASE_TTL,
    ERR_LEASE_TWICE, ERR_MCONSUME_BLOCK, ERR_MCONSUME_OPTION, ERR_MIN, ERR_MIN_ATMOST, ERR_N,
    ERR_NUMKEYS, ERR_OPTION, ERR_PERIOD, ERR_QUANTITY, ERR_RATE, ERR_RATE_RANGE,
    ERR_RELEASE_OPTION, ERR_STATE, ERR_SUBCOMMAND, ERR_TOP_OPTION, ERR_USED, ERR_WAIT, ERR_WEIGHT,
};
use crate::lease::Leases;

/// A parse failure, as the full error line sent to the client.
pub type ParseError = &'static str;

/// Parses an unsigned decimal integer of at most 2^53.
pub fn amount(arg: &[u8], err: ParseError) -> Result<u64, ParseError> {
    integer(arg, MAX_AMOUNT, err)
}

/// Parses an unsigned decimal integer of at most `max`: ASCII digits only.
pub fn integer(arg: &[u8], max: u64, err: ParseError) -> Result<u64, ParseError> {
    if arg.is_empty() || arg.len() > 20 {
        return Err(err);
    }
    let mut v: u64 = 0;
    for &c in arg {
        if !c.is_ascii_digit() {
            return Err(err);
        }
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add(u64::from(c - b'0')))
            .ok_or(err)?;
    }
    if v > max {
        return Err(err);
    }
    Ok(v)
}

/// Parses a signed decimal integer (an optional leading `-`), for internal
/// state fields such as timestamps.
pub fn signed(arg: &[u8], err: ParseError) -> Result<i128, ParseError> {
    let (neg, digits) = match arg.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, arg),
    };
    if digits.is_empty() || digits.len() > 38 {
        return Err(err);
    }
    let mut v: i128 = 0;
    for &c in digits {
        if !c.is_ascii_digit() {
            return Err(err);
        }
        v = v * 10 + i128::from(c - b'0');
    }
    Ok(if neg { -v } else { v })
}

/// Parses a refill rate in tokens per second: a non-negative decimal with an
/// optional exponent (`10`, `0.5`, `1e-3`, `2.5e9`), optionally followed by
/// `/s`, `/m`, `/h` or `/d` (per second, minute, hour, day). The result is
/// exact: `100/m` is 5/3 tokens per second. Every spelling of a value in
/// range is accepted (`1e0001`, `1000000000000000000000000000000e-30`), and
/// the work is linear in the argument's length.
pub fn rate(arg: &[u8]) -> Result<Rate, ParseError> {
    let (number, unit_secs) = match arg {
        [head @ .., b'/', u] => {
            let secs = match u.to_ascii_lowercase() {
                b's' => 1u128,
                b'm' => 60,
                b'h' => 3600,
                b'd' => 86_400,
                _ => return Err(ERR_RATE),
            };
            (head, secs)
        }
        _ => (arg, 1),
    };
    let Some((digits, exp10)) = decimal(number)? else {
        return Ok(Rate::ZERO);
    };
    reduce(digits, exp10, unit_secs).ok_or(ERR_RATE_RANGE)
}

/// Most significant digits a rate in range can have. The per-unit value is
/// `D * 10^e` with `D` free of trailing zeros, and it equals `unit * num /
/// den` with `num <= 2^53`, `den <= 2^40`, `unit <= 86400`. For `e >= 0`,
/// `D <= unit * num < 10^21`. For `e = -k < 0`, `D = unit * num * 10^k / den`
/// lacks a factor 2 or a factor 5, so `den` holds all the 2s (then `k <=
/// 40`) or all the 5s (`k <= 17`) of `10^k` beyond those of `unit * num`:
/// `D < 86400 * 2^53 * 10^40 < 10^61`. Longer `D`s are out of range.
const MAX_SIGNIFICANT: usize = 64;
/// Exponents (of the value without trailing zeros) outside this range are
/// out of range, by the same argument: `e <= 20` since `10^e <= unit * num`,
/// and `k <= 40`.
const EXP_RANGE: std::ops::RangeInclusive<i64> = -40..=20;
/// Exponent digits (after leading zeros) beyond which the exponent exceeds
/// any argument's length, so that no digits can cancel it.
const EXP_DIGITS: usize = 15;

/// The significant digits of a decimal (values 0 to 9, most significant
/// first): no leading or trailing zeros, at most [`MAX_SIGNIFICANT`].
struct Digits {
    buf: [u8; MAX_SIGNIFICANT],
    start: usize,
    end: usize,
}

impl Digits {
    fn last(&self) -> u8 {
        self.buf[self.end - 1]
    }

    /// Divides by `d` (2 or 5), which must divide it exactly.
    fn divide(&mut self, d: u8) {
        let mut rem = 0u8;
        for x in &mut self.buf[self.start..self.end] {
            let cur = rem * 10 + *x;
            *x = cur / d;
            rem = cur % d;
        }
        debug_assert_eq!(rem, 0);
        while self.start + 1 < self.end && self.buf[self.start] == 0 {
            self.start += 1;
        }
    }

    /// The value, if it has at most 18 digits.
    fn small(&self) -> Option<u64> {
        let d = &self.buf[self.start..self.end];
        (d.len() <= 18).then(|| d.iter().fold(0u64, |v, &x| v * 10 + u64::from(x)))
    }
}

/// `digits * 10^exp10 / unit_secs` as a reduced rate, `None` if out of range.
/// The factors 2 and 5 are divided out of the digits first (a few hundred
/// steps over at most 64 digits), leaving a small part that any rate in
/// range has (it divides `unit * num`).
fn reduce(mut d: Digits, exp10: i64, unit_secs: u128) -> Option<Rate> {
    let (mut twos, mut fives) = (exp10, exp10);
    while d.last().is_multiple_of(2) {
        d.divide(2);
        twos += 1;
    }
    while d.last() == 5 {
        d.divide(5);
        fives += 1;
    }
    let pow = |base: u128, exp: i64| base.checked_pow(u32::try_from(exp.max(0)).ok()?);
    let num = u128::from(d.small()?)
        .checked_mul(pow(2, twos)?)?
        .checked_mul(pow(5, fives)?)?;
    let den = unit_secs
        .checked_mul(pow(2, -twos)?)?
        .checked_mul(pow(5, -fives)?)?;
    Rate::new(num, den)
}

/// Splits a non-negative decimal into its significant digits and exponent,
/// `value = digits * 10^exp10`; `None` for zero. Out of range when there
/// are more significant digits or a larger exponent than any rate in range
/// has.
fn decimal(s: &[u8]) -> Result<Option<(Digits, i64)>, ParseError> {
    let (body, exp) = match s.iter().position(|&c| c == b'e' || c == b'E') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    let (int, frac) = match body.iter().position(|&c| c == b'.') {
        Some(i) => (&body[..i], &body[i + 1..]),
        None => (body, &body[body.len()..]),
    };
    if int.is_empty() && frac.is_empty() {
        return Err(ERR_RATE);
    }
    if !int.iter().chain(frac).all(u8::is_ascii_digit) {
        return Err(ERR_RATE);
    }
    let exp = match exp {
        Some(e) => exponent(e)?,
        None => 0,
    };
    // All digits as one run (the dot removed): value = run * 10^(exp - frac.len()).
    let run = || int.iter().chain(frac);
    let total = int.len() + frac.len();
    let Some(lead) = run().position(|&c| c != b'0') else {
        return Ok(None);
    };
    let trail = run().rev().position(|&c| c != b'0').unwrap_or(0);
    let count = total - lead - trail;
    if count > MAX_SIGNIFICANT {
        return Err(ERR_RATE_RANGE);
    }
    let exp10 = exp
        .saturating_sub(frac.len() as i64)
        .saturating_add(trail as i64);
    if !EXP_RANGE.contains(&exp10) {
        return Err(ERR_RATE_RANGE);
    }
    let mut digits = Digits {
        buf: [0; MAX_SIGNIFICANT],
        start: 0,
        end: count,
    };
    for (slot, &c) in digits.buf.iter_mut().zip(run().skip(lead)) {
        *slot = c - b'0';
    }
    Ok(Some((digits, exp10)))
}

/// The exponent after `e`: an optional sign and at least one ASCII digit, any
/// number of them; saturated at `10^EXP_DIGITS` (no argument is that long).
fn exponent(s: &[u8]) -> Result<i64, ParseError> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ERR_RATE);
    }
    let digits = &digits[digits.iter().take_while(|&&c| c == b'0').count()..];
    let v = if digits.len() > EXP_DIGITS {
        10i64.pow(EXP_DIGITS as u32)
    } else {
        digits
            .iter()
            .fold(0i64, |v, &c| v * 10 + i64::from(c - b'0'))
    };
    Ok(if neg { -v } else { v })
}

/// Longest wait a RESERVE or BLOCK option may name, in ms (one day); the
/// `max-wait-ms` setting lowers it.
pub const MAX_WAIT_MS: u64 = 86_400_000;

/// How a TB.CONSUME request may wait for tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Answer now: granted or denied.
    No,
    /// `RESERVE ms`: take the tokens into debt if they refill within `ms`;
    /// the caller waits the returned `retry_after_ms`.
    Reserve(u64),
    /// `BLOCK ms`: like `RESERVE`, but the server holds the reply until due.
    Block(u64),
}

/// What follows `capacity` in TB.CONSUME:
/// `[n] [RESERVE ms | BLOCK ms] [ATMOST [MIN chunk]]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeOptions {
    /// Tokens to take (default 1).
    pub n: u64,
    /// `ATMOST`: grant what is there, between 1 and `n`.
    pub atmost: bool,
    /// `MIN chunk` (only with ATMOST): the smallest grant worth having, at
    /// least 1. The handler checks it against the capacity.
    pub min: Option<u64>,
    /// Waiting mode.
    pub wait: Wait,
}

/// Parses the arguments after `capacity` of TB.CONSUME.
pub fn consume_options<'a>(
    mut args: impl Iterator<Item = &'a [u8]>,
) -> Result<ConsumeOptions, ParseError> {
    let mut o = ConsumeOptions {
        n: 1,
        atmost: false,
        min: None,
        wait: Wait::No,
    };
    let mut next = args.next();
    if let Some(first) = next {
        let keyword = ["ATMOST", "MIN", "RESERVE", "BLOCK"]
            .iter()
            .any(|k| is_keyword(first, k));
        if !keyword {
            o.n = amount(first, ERR_N)?;
            next = args.next();
        }
    }
    while let Some(opt) = next {
        if is_keyword(opt, "ATMOST") && !o.atmost {
            o.atmost = true;
        } else if is_keyword(opt, "MIN") && o.min.is_none() {
            o.min = Some(chunk(args.next().unwrap_or_default())?);
        } else if (is_keyword(opt, "RESERVE") || is_keyword(opt, "BLOCK")) && o.wait == Wait::No {
            let ms = integer(args.next().unwrap_or_default(), MAX_WAIT_MS, ERR_WAIT)?;
            o.wait = if is_keyword(opt, "BLOCK") {
                Wait::Block(ms)
            } else {
                Wait::Reserve(ms)
            };
        } else {
            return Err(ERR_OPTION);
        }
        next = args.next();
    }
    if o.atmost && o.wait != Wait::No {
        return Err(ERR_ATMOST_WAIT);
    }
    if o.min.is_some() && !o.atmost {
        return Err(ERR_MIN_ATMOST);
    }
    Ok(o)
}

/// Parses the chunk after `MIN`: an integer from 1 to 2^53 (the handler
/// then refuses one above the capacity with the same error).
pub fn chunk(arg: &[u8]) -> Result<u64, ParseError> {
    match amount(arg, ERR_MIN)? {
        0 => Err(ERR_MIN),
        c => Ok(c),
    }
}

/// Case-insensitive ASCII comparison of an argument with a keyword.
pub fn is_keyword(arg: &[u8], keyword: &str) -> bool {
    arg.eq_ignore_ascii_case(keyword.as_bytes())
}

/// Glob matching as Redis does for CONFIG GET patterns: `*` any run, `?` any
/// one byte, everything else literal (case-insensitive).
pub fn glob(pattern: &[u8], name: &[u8]) -> bool {
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, n));
            p += 1;
        } else if p < pattern.len()
            && (pattern[p] == b'?' || pattern[p].eq_ignore_ascii_case(&name[n]))
        {
            p += 1;
            n += 1;
        } else if let Some((sp, sn)) = star {
            p = sp + 1;
            n = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

// ---------------------------------------------------------------------------
// Whole commands. Each parser reads one command's arguments (the command
// name at index 0) and returns typed values or the error to reply with; the
// handlers in `commands/` parse nothing themselves. Redis checks each
// command's arity before the handler runs; these parsers still accept any
// argument count (they are fuzzed) and answer a wrong one with `WrongArity`.

/// One call's arguments as the parsers read them, the command name at 0.
/// The Redis glue implements it over the call's argv; tests and the fuzzer
/// use slices.
pub trait Argv<'a> {
    /// Number of arguments, the command name included.
    fn count(&self) -> usize;
    /// Argument `i` (`i < count()`), as bytes.
    fn arg(&self, i: usize) -> &'a [u8];
}

impl<'a> Argv<'a> for [&'a [u8]] {
    fn count(&self) -> usize {
        self.len()
    }

    fn arg(&self, i: usize) -> &'a [u8] {
        self[i]
    }
}

/// Why a command's arguments were refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// An argument is invalid: the full error line.
    Invalid(ParseError),
    /// Too few or too many arguments.
    WrongArity,
}

impl From<ParseError> for ArgsError {
    fn from(e: ParseError) -> Self {
        ArgsError::Invalid(e)
    }
}

/// Argument `i`, or `WrongArity` when there are not that many.
fn nth<'a>(a: &(impl Argv<'a> + ?Sized), i: usize) -> Result<&'a [u8], ArgsError> {
    if i < a.count() {
        Ok(a.arg(i))
    } else {
        Err(ArgsError::WrongArity)
    }
}

/// `WrongArity` unless there are exactly `n` arguments.
fn exactly<'a>(a: &(impl Argv<'a> + ?Sized), n: usize) -> Result<(), ArgsError> {
    if a.count() == n {
        Ok(())
    } else {
        Err(ArgsError::WrongArity)
    }
}

/// `TB.CONSUME key rate capacity [n] [RESERVE ms | BLOCK ms] [ATMOST]
/// [LEASE ttl-ms]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeArgs<'a> {
    /// The bucket's limits.
    pub limits: Limits,
    /// What follows `capacity`.
    pub options: ConsumeOptions,
    /// `LEASE ttl-ms`: lend the tokens for at most this long.
    pub lease_ttl_ms: Option<u64>,
    /// `LEASE ttl-ms KEEP`: the lease's tokens stay used when it expires.
    pub lease_keep: bool,
    /// `FLOW name [WEIGHT w]` (only with `BLOCK`): wait in the bucket's
    /// queue, in this flow.
    pub flow: Option<Flow<'a>>,
}

/// Parses `TB.CONSUME` (the key is argument 1).
pub fn consume_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<ConsumeArgs<'a>, ArgsError> {
    let limits = Limits {
        rate: rate(nth(a, 2)?)?,
        capacity: amount(nth(a, 3)?, ERR_CAPACITY)?,
    };
    let rest: Vec<&[u8]> = (4..a.count()).map(|i| a.arg(i)).collect();
    let (flow, rest) = split_flow(&rest, ERR_OPTION)?;
    let (lease, rest) = split_lease(&rest)?;
    let lease_ttl_ms = lease.map(|(ttl, _)| ttl);
    let options = consume_options(rest.into_iter())?;
    if options.min.is_some_and(|c| c > limits.capacity) {
        return Err(ERR_MIN.into());
    }
    if lease_ttl_ms.is_some() {
        if options.atmost || matches!(options.wait, Wait::Reserve(_)) {
            return Err(ERR_LEASE_MODE.into());
        }
        if options.n == 0 {
            return Err(ERR_LEASE_N.into());
        }
    }
    if flow.is_some() && !matches!(options.wait, Wait::Block(_)) {
        return Err(ERR_FLOW_BLOCK.into());
    }
    Ok(ConsumeArgs {
        limits,
        options,
        lease_ttl_ms,
        lease_keep: lease.is_some_and(|(_, keep)| keep),
        flow,
    })
}

/// Longest flow name `FLOW` takes, in bytes.
pub const MAX_FLOW_NAME: usize = 128;

/// `FLOW name [WEIGHT w]`: the flow a queued call waits in, and its weight
/// (see [`crate::fair`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow<'a> {
    /// The flow's name: 1 to [`MAX_FLOW_NAME`] bytes.
    pub name: &'a [u8],
    /// Its weight, 1 to [`crate::fair::MAX_WEIGHT`] (default 1).
    pub weight: u64,
}

/// Parses `FLOW name [WEIGHT w]` starting at `args[0]` (the `FLOW`
/// keyword): the flow and how many arguments it took.
pub fn flow_at<'a>(args: &[&'a [u8]]) -> Result<(Flow<'a>, usize), ParseError> {
    let name = *args.get(1).ok_or(ERR_FLOW_NAME)?;
    if name.is_empty() || name.len() > MAX_FLOW_NAME {
        return Err(ERR_FLOW_NAME);
    }
    if args.get(2).is_some_and(|a| is_keyword(a, "WEIGHT")) {
        let w = integer(
            args.get(3).copied().unwrap_or_default(),
            crate::fair::MAX_WEIGHT,
            ERR_WEIGHT,
        )?;
        if w == 0 {
            return Err(ERR_WEIGHT);
        }
        return Ok((Flow { name, weight: w }, 4));
    }
    Ok((Flow { name, weight: 1 }, 2))
}

/// Takes `FLOW name [WEIGHT w]` out of `args` (the name is taken as it is,
/// whatever keyword it spells); `repeated` is the error for a second FLOW.
/// A WEIGHT elsewhere is [`ERR_WEIGHT`].
pub fn split_flow<'a>(
    args: &[&'a [u8]],
    repeated: ParseError,
) -> Result<(Option<Flow<'a>>, Vec<&'a [u8]>), ParseError> {
    let mut flow = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        if is_keyword(args[i], "FLOW") {
            if flow.is_some() {
                return Err(repeated);
            }
            let (f, used) = flow_at(&args[i..])?;
            flow = Some(f);
            i += used;
        } else if is_keyword(args[i], "WEIGHT") {
            return Err(ERR_WEIGHT);
        } else {
            rest.push(args[i]);
            i += 1;
        }
    }
    Ok((flow, rest))
}

/// Most keys one TB.MCONSUME may name. Every key costs about what one
/// TB.CONSUME costs (Redis hashes the name a few times to look it up, write
/// it and set its expiry), and Redis runs one command at a time, so this
/// bounds how long one call keeps every other client waiting: 16 buckets,
/// more than any one request checks (per user, per tenant, per minute, per
/// day...), take about as long as 16 single-bucket calls (BENCHMARKS.md,
/// "Noisy neighbours").
pub const MAX_KEYS: u64 = 16;

/// One bucket's request in TB.MCONSUME.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// The bucket's limits.
    pub limits: Limits,
    /// Tokens to take from it.
    pub n: u64,
}

/// `TB.MCONSUME numkeys key [key ...] rate capacity n [...] [LEASE part
/// ttl-ms ...] [RESERVE ms]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MconsumeArgs<'a> {
    /// One request per key, in key order; the keys are arguments
    /// `2..2 + requests.len()`.
    pub requests: Vec<Request>,
    /// `RESERVE ms`.
    pub reserve_ms: Option<u64>,
    /// `BLOCK ms`: wait server-side, queued, for the whole grant.
    pub block_ms: Option<u64>,
    /// `ATMOST [MIN chunk]`: the chunk (1 for plain `ATMOST`).
    pub atmost: Option<u64>,
    /// `LEASE part ttl-ms`: the TTL of each leased part, in key order.
    pub leases: Vec<Option<u64>>,
    /// `LEASE part ttl-ms KEEP`: whether each part's lease keeps its tokens
    /// used when it expires, in key order.
    pub keep: Vec<bool>,
    /// `FLOW name [WEIGHT w]` (only with `BLOCK`).
    pub flow: Option<Flow<'a>>,
}

/// `numkeys` of TB.MCONSUME (argument 1): `None` unless it is an integer from
/// 1 to [`MAX_KEYS`]. Also answers Redis' "where are the keys" question.
pub fn numkeys(arg: &[u8]) -> Option<usize> {
    match integer(arg, MAX_KEYS, ERR_NUMKEYS) {
        Ok(0) | Err(_) => None,
        Ok(k) => Some(k as usize),
    }
}

/// Parses `TB.MCONSUME`, including the check that no key appears twice.
pub fn mconsume_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<MconsumeArgs<'a>, ArgsError> {
    let k = numkeys(nth(a, 1)?).ok_or(ERR_NUMKEYS)?;
    let limits_at = 2 + k;
    let end = limits_at + 3 * k;
    if a.count() < end {
        return Err(ERR_NUMKEYS.into());
    }
    let (mut reserve_ms, mut atmost, mut min) = (None, None, None);
    let mut block_ms = None;
    let mut leases = vec![None; k];
    let mut keep = vec![false; k];
    let mut flow = None;
    let mut at = end;
    while at < a.count() {
        if is_keyword(a.arg(at), "FLOW") && flow.is_none() {
            let tail: Vec<&[u8]> = (at..a.count().min(at + 4)).map(|i| a.arg(i)).collect();
            let (f, used) = flow_at(&tail)?;
            flow = Some(f);
            at += used;
        } else if is_keyword(a.arg(at), "WEIGHT") {
            return Err(ERR_WEIGHT.into());
        } else if is_keyword(a.arg(at), "LEASE") {
            if at + 2 >= a.count() {
                return Err(ERR_LEASE_PART.into());
            }
            let part = integer(a.arg(at + 1), k as u64, ERR_LEASE_PART)?;
            if part == 0 {
                return Err(ERR_LEASE_PART.into());
            }
            let ttl = lease_ttl(a.arg(at + 2))?;
            if leases[part as usize - 1].replace(ttl).is_some() {
                return Err(ERR_LEASE_TWICE.into());
            }
            at += 3;
            if at < a.count() && is_keyword(a.arg(at), "KEEP") {
                keep[part as usize - 1] = true;
                at += 1;
            }
        } else if is_keyword(a.arg(at), "RESERVE") && reserve_ms.is_none() && at + 1 < a.count() {
            reserve_ms = Some(integer(a.arg(at + 1), MAX_WAIT_MS, ERR_WAIT)?);
            at += 2;
        } else if is_keyword(a.arg(at), "BLOCK") && block_ms.is_none() && at + 1 < a.count() {
            block_ms = Some(integer(a.arg(at + 1), MAX_WAIT_MS, ERR_WAIT)?);
            at += 2;
        } else if is_keyword(a.arg(at), "ATMOST") && atmost.is_none() {
            if at + 1 < a.count() && is_keyword(a.arg(at + 1), "MIN") {
                if at + 2 >= a.count() {
                    return Err(ERR_MCONSUME_OPTION.into());
                }
                min = Some(chunk(a.arg(at + 2))?);
                atmost = min;
                at += 3;
            } else {
                atmost = Some(1);
                at += 1;
            }
        } else {
            return Err(ERR_MCONSUME_OPTION.into());
        }
    }
    // ATMOST grants what is there now: it does not wait, and a lease is
    // never partial.
    if atmost.is_some() && reserve_ms.is_some() {
        return Err(ERR_MCONSUME_OPTION.into());
    }
    if atmost.is_some() && leases.iter().any(Option::is_some) {
        return Err(ERR_LEASE_MODE.into());
    }
    if block_ms.is_some() && (reserve_ms.is_some() || atmost.is_some()) {
        return Err(ERR_MCONSUME_BLOCK.into());
    }
    if flow.is_some() && block_ms.is_none() {
        return Err(ERR_FLOW_BLOCK.into());
    }
    let mut requests = Vec::with_capacity(k);
    for i in 0..k {
        let at = limits_at + 3 * i;
        requests.push(Request {
            limits: Limits {
                rate: rate(a.arg(at))?,
                capacity: amount(a.arg(at + 1), ERR_CAPACITY)?,
            },
            n: amount(a.arg(at + 2), ERR_N)?,
        });
    }
    // MIN is checked against the capacity of every part asking for the
    // largest n (the parts that share the grant); plain ATMOST is not (a
    // part of capacity 0 then never succeeds, as without ATMOST).
    let big = requests.iter().map(|r| r.n).max().unwrap_or(0);
    if let Some(c) = min {
        if requests.iter().any(|r| r.n == big && c > r.limits.capacity) {
            return Err(ERR_MIN.into());
        }
    }
    if has_duplicate((2..limits_at).map(|i| a.arg(i))) {
        return Err(ERR_DUPLICATE.into());
    }
    if leases
        .iter()
        .zip(&requests)
        .any(|(l, r)| l.is_some() && r.n == 0)
    {
        return Err(ERR_LEASE_N.into());
    }
    Ok(MconsumeArgs {
        requests,
        reserve_ms,
        block_ms,
        atmost,
        leases,
        keep,
        flow,
    })
}

/// Whether two of `keys` are equal, in time linear in their total length
/// whatever they hold: comparing every pair would be quadratic, and keys
/// sharing a long prefix make each comparison as long as the keys (1,000
/// keys of 64 KB stalled the server for seconds). Up to
/// [`PAIRWISE_KEYS`] keys are compared pairwise (at most six comparisons,
/// no allocation); more go through a hash set with a randomly keyed hash,
/// so that chosen names cannot collide on purpose.
pub fn has_duplicate<'a>(keys: impl ExactSizeIterator<Item = &'a [u8]> + Clone) -> bool {
    if keys.len() <= PAIRWISE_KEYS {
        let mut rest = keys;
        while let Some(k) = rest.next() {
            if rest.clone().any(|other| other == k) {
                return true;
            }
        }
        return false;
    }
    let mut seen = std::collections::HashSet::with_capacity(keys.len());
    keys.into_iter().any(|k| !seen.insert(k))
}

/// Most keys [`has_duplicate`] compares pairwise.
const PAIRWISE_KEYS: usize = 4;

/// `CL.THROTTLE key max_burst count period [quantity]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThrottleArgs {
    /// Capacity `max_burst + 1`, rate `count / period` tokens per second.
    pub limits: Limits,
    /// Tokens to take (default 1).
    pub quantity: u64,
}

/// Parses `CL.THROTTLE`.
pub fn throttle_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<ThrottleArgs, ArgsError> {
    let burst = integer(nth(a, 2)?, MAX_AMOUNT - 1, ERR_BURST)?;
    let count = amount(nth(a, 3)?, ERR_COUNT)?;
    let period = amount(nth(a, 4)?, ERR_PERIOD)?;
    if period == 0 {
        return Err(ERR_PERIOD.into());
    }
    let quantity = match a.count() {
        5 => 1,
        6 => amount(a.arg(5), ERR_QUANTITY)?,
        _ => return Err(ArgsError::WrongArity),
    };
    let rate = Rate::new(u128::from(count), u128::from(period)).ok_or(ERR_RATE_RANGE)?;
    Ok(ThrottleArgs {
        limits: Limits {
            rate,
            capacity: burst + 1,
        },
        quantity,
    })
}

/// Parses `TB.REFUND key n`: the tokens to give back.
pub fn refund_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<u64, ArgsError> {
    exactly(a, 3)?;
    Ok(amount(a.arg(2), ERR_N)?)
}

/// Parses `TB.INFO key`.
pub fn info_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<(), ArgsError> {
    exactly(a, 2)
}

/// `TB.SETSTATE`: set a bucket's absolute state, or delete it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetStateArgs {
    /// `TB.SETSTATE key state` (compact) or `TB.SETSTATE key tokens_nanos
    /// updated_us rate_num rate_den capacity expire_at_ms` (decimal): store
    /// `bucket`, with the key's absolute expiry in ms (0: none).
    State {
        /// The state to store.
        bucket: Bucket,
        /// Its leases (none in the decimal form).
        leases: Leases,
        /// The key's absolute expiry in ms, 0 for none.
        expire_at_ms: i64,
    },
    /// `TB.SETSTATE key change` ([`wire::TAG_DELTA`]): store `bucket` and
    /// apply `delta` to the leases the key holds.
    Delta {
        /// The state to store.
        bucket: Bucket,
        /// The change to the key's leases.
        delta: crate::lease::Delta,
        /// The key's absolute expiry in ms, 0 for none.
        expire_at_ms: i64,
    },
    /// `TB.SETSTATE key DEL`: delete the bucket (a full bucket, whose key
    /// a write removed). The word `DEL` cannot be a compact state: those
    /// begin with a version tag byte below 0x20.
    Delete,
}

/// Parses `TB.SETSTATE`, in its compact, decimal or deletion form.
pub fn setstate_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<SetStateArgs, ArgsError> {
    let (bucket, leases, expire_at_ms) = match a.count() {
        3 if is_keyword(a.arg(2), "DEL") => return Ok(SetStateArgs::Delete),
        3 if a.arg(2).first() == Some(&wire::TAG_DELTA) => {
            let (bucket, delta, expire_at_ms) = wire::decode_delta(a.arg(2)).ok_or(ERR_STATE)?;
            return Ok(SetStateArgs::Delta {
                bucket,
                delta,
                expire_at_ms,
            });
        }
        3 => wire::decode_state(a.arg(2)).ok_or(ERR_STATE)?,
        8 => {
            let (b, at) = decimal_state(a)?;
            (b, Leases::default(), at)
        }
        _ => return Err(ArgsError::WrongArity),
    };
    Ok(SetStateArgs::State {
        bucket,
        leases,
        expire_at_ms,
    })
}

/// The bucket and absolute expiry of TB.SETSTATE's decimal form.
fn decimal_state<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<(Bucket, i64), ParseError> {
    let num = |i: usize| signed(a.arg(i), ERR_STATE);
    let (tokens, updated, rnum, rden, cap, at) =
        (num(2)?, num(3)?, num(4)?, num(5)?, num(6)?, num(7)?);
    let in_i64 = |v: i128| i64::try_from(v).map_err(|_| ERR_STATE);
    let in_u64 = |v: i128| u64::try_from(v).map_err(|_| ERR_STATE);
    let rate = Rate::new(in_u64(rnum)? as u128, in_u64(rden)? as u128).ok_or(ERR_STATE)?;
    let b = Bucket {
        tokens,
        updated_us: in_i64(updated)?,
        rate,
        capacity: in_u64(cap)?,
    };
    let at_ms = in_i64(at)?;
    if !b.is_valid() || at_ms < 0 {
        return Err(ERR_STATE);
    }
    Ok((b, at_ms))
}

/// `TB.CONFIG GET pattern | SET name value | RESETSTAT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigArgs<'a> {
    /// `GET pattern`.
    Get(&'a [u8]),
    /// `SET name value`.
    Set(&'a [u8], &'a [u8]),
    /// `RESETSTAT`.
    ResetStat,
}

/// Parses `TB.CONFIG`.
pub fn config_args<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<ConfigArgs<'a>, ArgsError> {
    let sub = nth(a, 1)?;
    if is_keyword(sub, "GET") {
        exactly(a, 3)?;
        Ok(ConfigArgs::Get(a.arg(2)))
    } else if is_keyword(sub, "SET") {
        exactly(a, 4)?;
        Ok(ConfigArgs::Set(a.arg(2), a.arg(3)))
    } else if is_keyword(sub, "RESETSTAT") {
        exactly(a, 2)?;
        Ok(ConfigArgs::ResetStat)
    } else {
        Err(ERR_SUBCOMMAND.into())
    }
}

/// Which heavy-hitter list `TB.TOP` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopMetric {
    /// Denied requests per key.
    Denied,
    /// Milliseconds of reservation wait granted per key.
    Waits,
}

/// The arguments of `TB.TOP [DENIED | WAITS] [COUNT n]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopOptions {
    /// The list to read (default: denials).
    pub metric: TopMetric,
    /// How many keys to list (default 10).
    pub count: u64,
}

/// Parses the arguments after `TB.TOP`, with `COUNT` at most `max_count`
/// (the sketch's capacity).
pub fn top_options<'a>(
    mut args: impl Iterator<Item = &'a [u8]>,
    max_count: u64,
    err_count: ParseError,
) -> Result<TopOptions, ParseError> {
    let mut o = TopOptions {
        metric: TopMetric::Denied,
        count: 10.min(max_count),
    };
    let (mut metric_seen, mut count_seen) = (false, false);
    while let Some(arg) = args.next() {
        let metric = if is_keyword(arg, "DENIED") {
            Some(TopMetric::Denied)
        } else if is_keyword(arg, "WAITS") {
            Some(TopMetric::Waits)
        } else {
            None
        };
        match metric {
            Some(m) if !metric_seen => {
                o.metric = m;
                metric_seen = true;
            }
            None if is_keyword(arg, "COUNT") && !count_seen => {
                o.count = integer(args.next().unwrap_or_default(), max_count, err_count)?;
                count_seen = true;
            }
            _ => return Err(ERR_TOP_OPTION),
        }
    }
    Ok(o)
}

// ---------------------------------------------------------------------------
// Leases and their release (issue 13, parts 1 and 2).
// ---------------------------------------------------------------------------

/// A lease's TTL in ms and whether it keeps its tokens at expiry (`KEEP`).
pub type LeaseTerms = (u64, bool);

/// Takes `LEASE ttl-ms [KEEP]` out of TB.CONSUME's arguments after
/// `capacity`: the lease's terms (if given) and the other arguments, in
/// order, for [`consume_options`].
#[allow(clippy::type_complexity)]
pub fn split_lease<'a>(
    args: &[&'a [u8]],
) -> Result<(Option<LeaseTerms>, Vec<&'a [u8]>), ParseError> {
    let mut ttl = None;
    let mut rest = Vec::with_capacity(args.len());
    let mut i = 0;
    while i < args.len() {
        if is_keyword(args[i], "LEASE") {
            if ttl.is_some() {
                return Err(ERR_LEASE_TWICE);
            }
            let ms = lease_ttl(args.get(i + 1).copied().unwrap_or_default())?;
            i += 2;
            let keep = args.get(i).is_some_and(|a| is_keyword(a, "KEEP"));
            i += usize::from(keep);
            ttl = Some((ms, keep));
        } else {
            rest.push(args[i]);
            i += 1;
        }
    }
    Ok((ttl, rest))
}

/// Parses a lease TTL in ms: 1 to [`crate::lease::MAX_TTL_MS`].
pub fn lease_ttl(arg: &[u8]) -> Result<u64, ParseError> {
    match integer(arg, crate::lease::MAX_TTL_MS, ERR_LEASE_TTL)? {
        0 => Err(ERR_LEASE_TTL),
        ms => Ok(ms),
    }
}

/// Parses `TB.RELEASE key lease-id [USED n]`: the id and the tokens used.
pub fn release_command<'a>(a: &(impl Argv<'a> + ?Sized)) -> Result<(u64, Option<u64>), ArgsError> {
    if a.count() != 3 && a.count() != 5 {
        return Err(ArgsError::WrongArity);
    }
    let rest: Vec<&[u8]> = (2..a.count()).map(|i| a.arg(i)).collect();
    Ok(release_args(&rest)?)
}

/// Parses TB.RELEASE's arguments after the key: `lease-id [USED n]`.
pub fn release_args(args: &[&[u8]]) -> Result<(u64, Option<u64>), ParseError> {
    let id = integer(
        args.first().copied().unwrap_or_default(),
        MAX_AMOUNT,
        ERR_LEASE_ID,
    )?;
    match args.get(1..).unwrap_or_default() {
        [] => Ok((id, None)),
        [kw, n] if is_keyword(kw, "USED") => Ok((id, Some(amount(n, ERR_USED)?))),
        _ => Err(ERR_RELEASE_OPTION),
    }
}

#[cfg(test)]
mod top_options_tests {
    use super::*;
    use proptest::strategy::Strategy;

    const ERR_COUNT: ParseError = "ERR count";

    fn top(args: &[&str]) -> Result<TopOptions, ParseError> {
        top_options(args.iter().map(|a| a.as_bytes()), 256, ERR_COUNT)
    }

    #[test]
    fn defaults_and_every_form() {
        let t = |metric, count| Ok(TopOptions { metric, count });
        assert_eq!(top(&[]), t(TopMetric::Denied, 10));
        assert_eq!(top(&["waits"]), t(TopMetric::Waits, 10));
        assert_eq!(top(&["DENIED", "COUNT", "3"]), t(TopMetric::Denied, 3));
        assert_eq!(top(&["count", "256", "Waits"]), t(TopMetric::Waits, 256));
        assert_eq!(top(&["COUNT", "0"]), t(TopMetric::Denied, 0));
        assert_eq!(
            top_options(std::iter::empty(), 4, ERR_COUNT),
            t(TopMetric::Denied, 4),
            "the default count never exceeds the capacity"
        );
    }

    #[test]
    fn refusals() {
        assert_eq!(top(&["COUNT", "257"]), Err(ERR_COUNT));
        assert_eq!(top(&["COUNT", "-1"]), Err(ERR_COUNT));
        assert_eq!(top(&["COUNT"]), Err(ERR_COUNT));
        assert_eq!(top(&["COUNT", "1", "COUNT", "2"]), Err(ERR_TOP_OPTION));
        assert_eq!(top(&["DENIED", "WAITS"]), Err(ERR_TOP_OPTION));
        assert_eq!(top(&["WAITED"]), Err(ERR_TOP_OPTION));
        assert_eq!(top(&["3"]), Err(ERR_TOP_OPTION));
    }

    proptest::proptest! {
        #[test]
        fn never_panics_and_stays_in_range(
            args in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(vec!["DENIED", "waits", "COUNT", "count", "0", "256", "257", "-1", ""])
                        .prop_map(String::from),
                    "\\PC{0,4}".prop_map(String::from)
                ],
                0..6,
            ),
        ) {
            if let Ok(o) = top_options(args.iter().map(|a| a.as_bytes()), 256, ERR_COUNT) {
                proptest::prop_assert!(o.count <= 256);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lease_options_parse_strictly() {
        let a = |v: &[&'static str]| v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>();
        let (ttl, rest) = split_lease(&a(&["5", "lease", "100"])).unwrap();
        assert_eq!((ttl, rest), (Some((100, false)), a(&["5"])));
        assert_eq!(split_lease(&a(&["LEASE", "0"])), Err(ERR_LEASE_TTL));
        assert_eq!(split_lease(&a(&["LEASE"])), Err(ERR_LEASE_TTL));
        assert_eq!(split_lease(&a(&["LEASE", "86400001"])), Err(ERR_LEASE_TTL));
        assert_eq!(
            split_lease(&a(&["LEASE", "1", "LEASE", "1"])),
            Err(ERR_LEASE_TWICE)
        );
        assert_eq!(
            split_lease(&a(&["2", "ATMOST"])).unwrap(),
            (None, a(&["2", "ATMOST"]))
        );
        assert_eq!(
            split_lease(&a(&["2", "LEASE", "5", "keep", "ATMOST"])).unwrap(),
            (Some((5, true)), a(&["2", "ATMOST"]))
        );
        assert_eq!(
            split_lease(&a(&["LEASE", "5", "2"])).unwrap(),
            (Some((5, false)), a(&["2"]))
        );
        assert_eq!(
            release_args(&a(&["9007199254740991"])),
            Ok((crate::lease::MAX_ID, None))
        );
        assert_eq!(release_args(&a(&["7"])), Ok((7, None)));
        assert_eq!(release_args(&a(&["7", "used", "3"])), Ok((7, Some(3))));
        assert_eq!(release_args(&a(&["-1"])), Err(ERR_LEASE_ID));
        assert_eq!(release_args(&a(&["7", "USED"])), Err(ERR_RELEASE_OPTION));
        assert_eq!(release_args(&a(&["7", "USED", "x"])), Err(ERR_USED));
        assert_eq!(
            release_args(&a(&["7", "KEEP", "1"])),
            Err(ERR_RELEASE_OPTION)
        );
    }

    use super::*;

    fn r(s: &str) -> Result<(u64, u64), ParseError> {
        rate(s.as_bytes()).map(|r| (r.num(), r.den()))
    }

    #[test]
    fn rates_parse_exactly() {
        assert_eq!(r("10"), Ok((10, 1)));
        assert_eq!(r("0.5"), Ok((1, 2)));
        assert_eq!(r(".5"), Ok((1, 2)));
        assert_eq!(r("5."), Ok((5, 1)));
        assert_eq!(r("1e-3"), Ok((1, 1000)));
        assert_eq!(r("1E-3"), Ok((1, 1000)));
        assert_eq!(r("2.5e9"), Ok((2_500_000_000, 1)));
        assert_eq!(r("1e12"), Ok((1_000_000_000_000, 1)));
        assert_eq!(r("100/m"), Ok((5, 3)));
        assert_eq!(r("100/M"), Ok((5, 3)));
        assert_eq!(r("10/s"), Ok((10, 1)));
        assert_eq!(r("1/h"), Ok((1, 3600)));
        assert_eq!(r("1/d"), Ok((1, 86_400)));
        assert_eq!(r("0.5/d"), Ok((1, 172_800)));
        assert_eq!(r("0"), Ok((0, 1)));
        assert_eq!(r("0.000"), Ok((0, 1)));
        assert_eq!(r("0e99"), Ok((0, 1)));
        assert_eq!(r("000120.5000"), Ok((241, 2)));
        assert_eq!(r("1e+2"), Ok((100, 1)));
    }

    #[test]
    fn bad_rates_are_rejected() {
        for bad in [
            "", "-1", "+1", "nan", "NaN", "inf", "-inf", "1e", "e5", ".", "1.2.3", "1/x", "/m",
            "1 ", " 1", "1/", "0x10", "1e1000", "１",
        ] {
            assert!(rate(bad.as_bytes()).is_err(), "{bad:?} must be rejected");
        }
        assert!(rate(&[0xff, 0xfe]).is_err());
        assert_eq!(rate(b"1e20"), Err(ERR_RATE_RANGE));
        assert_eq!(rate(b"1e-13"), Err(ERR_RATE_RANGE));
        assert_eq!(
            rate(b"1234567890123456789012345678901"),
            Err(ERR_RATE_RANGE)
        );
    }

    #[test]
    fn every_spelling_of_a_rate_in_range_is_accepted() {
        assert_eq!(r("1e0001"), Ok((10, 1)));
        assert_eq!(r("1E+0001"), Ok((10, 1)));
        assert_eq!(r("5e-0000000000000000000000000000003"), Ok((1, 200)));
        assert_eq!(r("1000000000000000000000000000000e-30"), Ok((1, 1)));
        assert_eq!(r("0.000000000000000000000000000001e30"), Ok((1, 1)));
        let long_one = format!("1{}e-100000", "0".repeat(100_000));
        assert_eq!(r(&long_one), Ok((1, 1)));
        let long_tenth = format!("0.{}1e100000", "0".repeat(100_000));
        assert_eq!(r(&long_tenth), Ok((1, 10)));
        // (2^53 - 1) / 2^40 per second (44 significant digits), 2^53 a day.
        assert_eq!(
            r("8191.99999999999909050529822707176208496093750000"),
            Ok(((1 << 53) - 1, 1 << 40))
        );
        assert_eq!(r("9007199254740992e-0/d"), Ok((1 << 46, 675)));
        assert_eq!(r("0e99999999999999999999999999"), Ok((0, 1)));
        assert_eq!(r("0.0e-99999999999999999999999999"), Ok((0, 1)));
        assert_eq!(r("1e99999999999999999999999"), Err(ERR_RATE_RANGE));
        assert_eq!(r("1e-99999999999999999999999"), Err(ERR_RATE_RANGE));
        assert_eq!(r("9007199254740992"), Ok((1 << 53, 1)));
        assert_eq!(r("9007199254740993"), Err(ERR_RATE_RANGE));
        assert_eq!(
            r("0.0000000000009094947017729282379150390625"),
            Ok((1, 1 << 40))
        );
        assert_eq!(
            r("0.00000000000045474735088646411895751953125"),
            Err(ERR_RATE_RANGE)
        );
    }

    #[test]
    fn long_arguments_are_bounded_work() {
        let mb = 1 << 20;
        for (text, want) in [
            ("1".repeat(mb), Err(ERR_RATE_RANGE)),
            (format!("0.{}1", "0".repeat(mb)), Err(ERR_RATE_RANGE)),
            (format!("1{}", "0".repeat(mb)), Err(ERR_RATE_RANGE)),
            (
                format!("{}5e-{}", "0".repeat(mb), "0".repeat(mb)),
                Ok((5, 1)),
            ),
            (format!("1e{}", "9".repeat(mb)), Err(ERR_RATE_RANGE)),
            (format!("{}x", "1".repeat(mb)), Err(ERR_RATE)),
        ] {
            assert_eq!(r(&text), want, "{}...", &text[..20]);
        }
    }

    #[test]
    fn amounts() {
        assert_eq!(amount(b"0", ERR_N), Ok(0));
        assert_eq!(amount(b"9007199254740992", ERR_N), Ok(1 << 53));
        assert_eq!(amount(b"9007199254740993", ERR_N), Err(ERR_N));
        assert_eq!(amount(b"99999999999999999999999", ERR_N), Err(ERR_N));
        for bad in ["", "-1", "+1", "1.0", "1e3", " 1", "abc"] {
            assert_eq!(amount(bad.as_bytes(), ERR_N), Err(ERR_N), "{bad:?}");
        }
        assert_eq!(amount(&[0xc3, 0x28], ERR_N), Err(ERR_N));
    }

    #[test]
    fn signed_integers() {
        assert_eq!(signed(b"-12", ERR_N), Ok(-12));
        assert_eq!(signed(b"12", ERR_N), Ok(12));
        assert!(signed(b"-", ERR_N).is_err());
        assert!(signed(b"1-2", ERR_N).is_err());
    }

    fn opts(args: &[&str]) -> Result<ConsumeOptions, ParseError> {
        consume_options(args.iter().map(|a| a.as_bytes()))
    }

    #[test]
    fn consume_options_parse() {
        let plain = ConsumeOptions {
            n: 1,
            atmost: false,
            min: None,
            wait: Wait::No,
        };
        assert_eq!(opts(&[]), Ok(plain));
        assert_eq!(opts(&["5"]), Ok(ConsumeOptions { n: 5, ..plain }));
        assert_eq!(
            opts(&["5", "atmost"]),
            Ok(ConsumeOptions {
                n: 5,
                atmost: true,
                ..plain
            })
        );
        assert_eq!(
            opts(&["RESERVE", "100"]),
            Ok(ConsumeOptions {
                wait: Wait::Reserve(100),
                ..plain
            })
        );
        assert_eq!(
            opts(&["3", "BLOCK", "0"]),
            Ok(ConsumeOptions {
                n: 3,
                wait: Wait::Block(0),
                ..plain
            })
        );
        assert_eq!(opts(&["-1"]), Err(ERR_N));
        assert_eq!(opts(&["RESERVE"]), Err(ERR_WAIT));
        assert_eq!(opts(&["RESERVE", "-5"]), Err(ERR_WAIT));
        assert_eq!(opts(&["RESERVE", "86400001"]), Err(ERR_WAIT));
        assert_eq!(opts(&["RESERVE", "1", "BLOCK", "1"]), Err(ERR_OPTION));
        assert_eq!(opts(&["ATMOST", "ATMOST"]), Err(ERR_OPTION));
        assert_eq!(opts(&["ATMOST", "RESERVE", "5"]), Err(ERR_ATMOST_WAIT));
        assert_eq!(opts(&["1", "2"]), Err(ERR_OPTION));
        assert_eq!(
            opts(&["FROB"]),
            Err(ERR_N),
            "a first word that is no option is n"
        );
        assert_eq!(opts(&["1", "FROB"]), Err(ERR_OPTION));
    }

    #[test]
    fn min_chunk_options() {
        let atmost = |n, min| {
            Ok(ConsumeOptions {
                n,
                atmost: true,
                min,
                wait: Wait::No,
            })
        };
        assert_eq!(opts(&["100", "ATMOST", "MIN", "10"]), atmost(100, Some(10)));
        assert_eq!(opts(&["100", "min", "10", "atmost"]), atmost(100, Some(10)));
        assert_eq!(opts(&["5", "ATMOST", "MIN", "50"]), atmost(5, Some(50)));
        assert_eq!(opts(&["ATMOST", "MIN", "1"]), atmost(1, Some(1)));
        assert_eq!(opts(&["5", "ATMOST", "MIN", "0"]), Err(ERR_MIN));
        assert_eq!(opts(&["5", "ATMOST", "MIN"]), Err(ERR_MIN));
        assert_eq!(opts(&["5", "ATMOST", "MIN", "-1"]), Err(ERR_MIN));
        assert_eq!(
            opts(&["5", "ATMOST", "MIN", "9007199254740993"]),
            Err(ERR_MIN)
        );
        assert_eq!(opts(&["5", "MIN", "2"]), Err(ERR_MIN_ATMOST));
        assert_eq!(
            opts(&["5", "MIN", "2", "RESERVE", "10"]),
            Err(ERR_MIN_ATMOST)
        );
        assert_eq!(
            opts(&["5", "ATMOST", "MIN", "2", "BLOCK", "10"]),
            Err(ERR_ATMOST_WAIT)
        );
        assert_eq!(
            opts(&["5", "ATMOST", "MIN", "2", "MIN", "3"]),
            Err(ERR_OPTION)
        );
        assert_eq!(opts(&["MIN", "2", "ATMOST"]), atmost(1, Some(2)));
        assert_eq!(opts(&["MIN", "2"]), Err(ERR_MIN_ATMOST));
    }

    #[test]
    fn globs() {
        assert!(glob(b"*", b"expire-idle"));
        assert!(glob(b"expire-*", b"expire-idle"));
        assert!(glob(b"EXPIRE-IDLE", b"expire-idle"));
        assert!(glob(b"*idle", b"expire-idle"));
        assert!(glob(b"?xpire*e", b"expire-idle"));
        assert!(!glob(b"max-*", b"expire-idle"));
        assert!(!glob(b"", b"expire-idle"));
        assert!(
            glob(b"a*c", b"a*bc"),
            "a * in the pattern is a wildcard, even facing a *"
        );
        assert!(glob(b"*", b"*"));
    }

    fn argv(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
    }

    #[test]
    fn consume_commands() {
        let a = consume_args(&argv("TB.CONSUME k 100/m 5 2 RESERVE 10")[..]).unwrap();
        assert_eq!(a.limits.capacity, 5);
        assert_eq!((a.limits.rate.num(), a.limits.rate.den()), (5, 3));
        assert_eq!(a.options.n, 2);
        assert_eq!(a.options.wait, Wait::Reserve(10));
        assert_eq!(
            consume_args(&argv("TB.CONSUME k 1")[..]),
            Err(ArgsError::WrongArity)
        );
        assert_eq!(
            consume_args(&argv("TB.CONSUME k x 5")[..]),
            Err(ArgsError::Invalid(ERR_RATE))
        );
    }

    #[test]
    fn mconsume_commands() {
        let a = mconsume_args(&argv("TB.MCONSUME 2 a b 1 5 1 0 3 2 RESERVE 7")[..]).unwrap();
        assert_eq!(a.requests.len(), 2);
        assert_eq!((a.requests[1].limits.capacity, a.requests[1].n), (3, 2));
        assert_eq!(a.reserve_ms, Some(7));
        let err = |s: &str| mconsume_args(&argv(s)[..]).unwrap_err();
        assert_eq!(err("TB.MCONSUME"), ArgsError::WrongArity);
        assert_eq!(err("TB.MCONSUME 0 a 1 5 1"), ERR_NUMKEYS.into());
        assert_eq!(err("TB.MCONSUME 17 a 1 5 1"), ERR_NUMKEYS.into());
        assert!(ERR_NUMKEYS.contains(&format!("from 1 to {MAX_KEYS} ")));
        assert_eq!(err("TB.MCONSUME 2 a b 1 5 1"), ERR_NUMKEYS.into());
        assert_eq!(
            err("TB.MCONSUME 1 a 1 5 1 FROB"),
            ERR_MCONSUME_OPTION.into()
        );
        assert_eq!(err("TB.MCONSUME 1 a 1 5 1 RESERVE x"), ERR_WAIT.into());
        assert_eq!(err("TB.MCONSUME 2 a a 1 5 1 1 5 1"), ERR_DUPLICATE.into());
        let a =
            mconsume_args(&argv("TB.MCONSUME 2 a b 1 50 40 1 30 40 atmost min 30")[..]).unwrap();
        assert_eq!((a.reserve_ms, a.atmost), (None, Some(30)));
        let a = mconsume_args(&argv("TB.MCONSUME 2 a b 1 50 40 1 3 1 ATMOST MIN 40")[..]).unwrap();
        assert_eq!(
            a.atmost,
            Some(40),
            "the chunk is checked against the largest n's parts"
        );
        let a = mconsume_args(&argv("TB.MCONSUME 1 a 1 5 1 ATMOST")[..]).unwrap();
        assert_eq!(a.atmost, Some(1));
        let a = mconsume_args(&argv("TB.MCONSUME 1 a 1 0 1 ATMOST")[..]).unwrap();
        assert_eq!(
            a.atmost,
            Some(1),
            "plain ATMOST on capacity 0: no MIN to check"
        );
        assert_eq!(
            err("TB.MCONSUME 2 a b 1 50 40 1 30 40 ATMOST MIN 31"),
            ERR_MIN.into()
        );
        assert_eq!(err("TB.MCONSUME 1 a 1 5 1 ATMOST MIN 0"), ERR_MIN.into());
        assert_eq!(
            err("TB.MCONSUME 1 a 1 5 1 ATMOST MIN"),
            ERR_MCONSUME_OPTION.into()
        );
        assert_eq!(
            err("TB.MCONSUME 1 a 1 5 1 ATMOST RESERVE 5"),
            ERR_MCONSUME_OPTION.into()
        );
        assert_eq!(
            consume_args(&argv("TB.CONSUME k 1 5 9 ATMOST MIN 6")[..]),
            Err(ArgsError::Invalid(ERR_MIN))
        );
        assert_eq!(numkeys(b"3"), Some(3));
        assert_eq!(numkeys(b"0"), None);
    }

    proptest::proptest! {
        #[test]
        fn has_duplicate_is_the_pairwise_check(
            keys in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..3), 0..12)
        ) {
            let naive = (0..keys.len()).any(|i| (0..i).any(|j| keys[i] == keys[j]));
            proptest::prop_assert_eq!(has_duplicate(keys.iter().map(Vec::as_slice)), naive);
        }
    }

    #[test]
    fn throttle_refund_info_config() {
        let t = throttle_args(&argv("CL.THROTTLE k 4 10 60")[..]).unwrap();
        assert_eq!((t.limits.capacity, t.quantity), (5, 1));
        assert_eq!((t.limits.rate.num(), t.limits.rate.den()), (1, 6));
        assert_eq!(
            throttle_args(&argv("CL.THROTTLE k 4 10 0")[..]),
            Err(ERR_PERIOD.into())
        );
        assert_eq!(
            throttle_args(&argv("CL.THROTTLE k 4 10 1 1 1")[..]),
            Err(ArgsError::WrongArity)
        );
        assert_eq!(refund_args(&argv("TB.REFUND k 3")[..]), Ok(3));
        assert_eq!(
            refund_args(&argv("TB.REFUND k")[..]),
            Err(ArgsError::WrongArity)
        );
        assert_eq!(info_args(&argv("TB.INFO k")[..]), Ok(()));
        assert_eq!(
            config_args(&argv("TB.CONFIG set a b")[..]),
            Ok(ConfigArgs::Set(b"a", b"b"))
        );
        assert_eq!(
            config_args(&argv("TB.CONFIG GET")[..]),
            Err(ArgsError::WrongArity)
        );
        assert_eq!(
            config_args(&argv("TB.CONFIG FROB")[..]),
            Err(ERR_SUBCOMMAND.into())
        );
    }

    #[test]
    fn setstate_forms() {
        let a = setstate_args(&argv("TB.SETSTATE k 5 1000 1 2 10 99")[..]).unwrap();
        let SetStateArgs::State {
            bucket,
            leases,
            expire_at_ms,
        } = a.clone()
        else {
            panic!("{a:?}")
        };
        assert_eq!((bucket.tokens, bucket.updated_us), (5, 1000));
        assert_eq!(expire_at_ms, 99);
        assert!(leases.is_blank(), "the decimal form has no leases");
        let mut buf = [0u8; wire::MAX_LEN];
        let len = wire::encode(&bucket, 99, &mut buf);
        let compact = [&b"TB.SETSTATE"[..], b"k", &buf[..len]];
        assert_eq!(setstate_args(&compact[..]), Ok(a));
        for del in ["DEL", "del"] {
            let args = [&b"TB.SETSTATE"[..], b"k", del.as_bytes()];
            assert_eq!(setstate_args(&args[..]), Ok(SetStateArgs::Delete));
        }
        // The deletion form's word is not a compact state: those start
        // with a version tag that is no printable character.
        assert!(buf[0] < 0x20 && b'D' >= 0x20);
        let bad = |s: &str| setstate_args(&argv(s)[..]).unwrap_err();
        assert_eq!(bad("TB.SETSTATE k 1"), ERR_STATE.into());
        assert_eq!(bad("TB.SETSTATE k 1 2"), ArgsError::WrongArity);
        assert_eq!(bad("TB.SETSTATE k 1 1 1 0 5 0"), ERR_STATE.into());
    }
}
