//! Pure argument parsing: bytes in, typed values or a clear error out.
//!
//! Arguments arrive as raw bytes (they may hold anything, including invalid
//! UTF-8). Every parser is strict: no signs, spaces, NaN or infinities, and
//! every number is range-checked, so a bad argument is rejected before any key
//! is touched. Error messages never echo the argument back.

use crate::bucket::{Rate, MAX_AMOUNT};

/// A parse failure, as the full error line sent to the client.
pub type ParseError = &'static str;

/// Error for an unparsable rate.
pub const ERR_RATE: ParseError =
    "ERR rate must be a non-negative decimal (10, 0.5, 1e-3) or N/s, N/m, N/h, N/d";
/// Error for a rate outside the supported range or precision.
pub const ERR_RATE_RANGE: ParseError =
    "ERR rate out of range or too precise: supported from about 1e-12 to 9e15 tokens per second";
/// Error for an unparsable capacity.
pub const ERR_CAPACITY: ParseError = "ERR capacity must be an integer from 0 to 9007199254740992";
/// Error for an unparsable token count.
pub const ERR_N: ParseError = "ERR n must be an integer from 0 to 9007199254740992";

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
/// exact: `100/m` is 5/3 tokens per second.
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
    let (mantissa, exp10) = decimal(number)?;
    if mantissa == 0 {
        return Ok(Rate::ZERO);
    }
    // value = mantissa * 10^exp10 / unit_secs
    let (num, den) = if exp10 >= 0 {
        let scale = 10u128.checked_pow(exp10 as u32).ok_or(ERR_RATE_RANGE)?;
        (
            mantissa.checked_mul(scale).ok_or(ERR_RATE_RANGE)?,
            unit_secs,
        )
    } else {
        let scale = 10u128
            .checked_pow(exp10.unsigned_abs())
            .ok_or(ERR_RATE_RANGE)?;
        (
            mantissa,
            scale.checked_mul(unit_secs).ok_or(ERR_RATE_RANGE)?,
        )
    };
    Rate::new(num, den).ok_or(ERR_RATE_RANGE)
}

/// Splits a non-negative decimal into `(mantissa, exponent)` with
/// `value = mantissa * 10^exponent` and no trailing zeros in the mantissa.
fn decimal(s: &[u8]) -> Result<(u128, i32), ParseError> {
    let (body, exp) = match s.iter().position(|&c| c == b'e' || c == b'E') {
        Some(i) => (&s[..i], exponent(&s[i + 1..])?),
        None => (s, 0),
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
    let frac = trim_end(frac, b'0');
    let digits = int.iter().chain(frac).skip_while(|&&c| c == b'0');
    let mut mantissa: u128 = 0;
    let mut count = 0;
    for &c in digits {
        count += 1;
        if count > 30 {
            return Err(ERR_RATE_RANGE);
        }
        mantissa = mantissa * 10 + u128::from(c - b'0');
    }
    if mantissa == 0 {
        return Ok((0, 0));
    }
    let mut exp = exp - frac.len() as i32;
    while mantissa.is_multiple_of(10) {
        mantissa /= 10;
        exp += 1;
    }
    Ok((mantissa, exp))
}

fn exponent(s: &[u8]) -> Result<i32, ParseError> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 3 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(ERR_RATE);
    }
    let v = digits
        .iter()
        .fold(0i32, |v, &c| v * 10 + i32::from(c - b'0'));
    Ok(if neg { -v } else { v })
}

fn trim_end(s: &[u8], c: u8) -> &[u8] {
    let end = s.iter().rposition(|&x| x != c).map_or(0, |i| i + 1);
    &s[..end]
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

/// What follows `capacity` in TB.CONSUME: `[n] [RESERVE ms | BLOCK ms] [ATMOST]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumeOptions {
    /// Tokens to take (default 1).
    pub n: u64,
    /// `ATMOST`: grant what is there, between 1 and `n`.
    pub atmost: bool,
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
        wait: Wait::No,
    };
    let mut next = args.next();
    if let Some(first) = next {
        let keyword = ["ATMOST", "RESERVE", "BLOCK"]
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
    Ok(o)
}

/// Error for a bad RESERVE/BLOCK wait.
pub const ERR_WAIT: ParseError =
    "ERR RESERVE and BLOCK take a wait in milliseconds, an integer from 0 to 86400000";
/// Error for an unknown or repeated option.
pub const ERR_OPTION: ParseError =
    "ERR unknown or repeated option: after n, use RESERVE ms, BLOCK ms or ATMOST";
/// Error for ATMOST combined with waiting.
pub const ERR_ATMOST_WAIT: ParseError = "ERR ATMOST cannot be combined with RESERVE or BLOCK";

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

/// Error for a bad `TB.TOP` argument.
pub const ERR_TOP_OPTION: ParseError =
    "ERR unknown or repeated option: TB.TOP takes DENIED or WAITS, and COUNT n";

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
}
