//! TB.CONSUME: its options after `capacity` (`n`, RESERVE, BLOCK, ATMOST,
//! MIN), and the LEASE and FLOW options taken out of them first (FLOW is
//! shared with TB.MCONSUME).

use super::{amount, integer, is_keyword, nth, rate, ArgsError, Argv, ParseError};
use crate::bucket::Limits;
use crate::errors::{
    ERR_ATMOST_WAIT, ERR_CAPACITY, ERR_FLOW_BLOCK, ERR_FLOW_NAME, ERR_LEASE_MODE, ERR_LEASE_N,
    ERR_LEASE_TTL, ERR_LEASE_TWICE, ERR_MIN, ERR_MIN_ATMOST, ERR_N, ERR_OPTION, ERR_WAIT,
    ERR_WEIGHT,
};

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
    let (flow, rest) = split_flow(rest, ERR_OPTION)?;
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
    mut args: Vec<&'a [u8]>,
    repeated: ParseError,
) -> Result<(Option<Flow<'a>>, Vec<&'a [u8]>), ParseError> {
    let mut flow = None;
    // In place: a call without FLOW (every TB.CONSUME of the hot path)
    // allocates nothing here.
    let mut kept = 0;
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
            args[kept] = args[i];
            kept += 1;
            i += 1;
        }
    }
    args.truncate(kept);
    Ok((flow, args))
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::ERR_RATE;

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
    }
}
