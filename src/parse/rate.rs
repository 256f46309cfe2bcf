//! The refill rate: an exact decimal with an optional exponent and unit
//! (`100/m`), reduced to a fraction of tokens per second.

use super::ParseError;
use crate::bucket::Rate;
use crate::errors::{ERR_RATE, ERR_RATE_RANGE};

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
}
