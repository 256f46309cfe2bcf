//! `parse::rate` on arbitrary bytes: never panics or overflows; it agrees
//! exactly with a slow reference (a hand-written grammar and big rational
//! arithmetic): the same syntax errors, the same reduced fraction for every
//! spelling of a value in range, a range error for every value outside; and
//! whatever it accepts survives a round trip through the decimal string
//! `TB.INFO` shows.

#![no_main]

use libfuzzer_sys::fuzz_target;
use num_bigint::BigUint;
use num_rational::Ratio;
use num_traits::{One, Zero};
use tb::bucket::{Rate, MAX_RATE_DEN, MAX_RATE_NUM};
use tb::errors::{ERR_RATE, ERR_RATE_RANGE};
use tb::parse;

/// What the reference makes of a rate argument.
#[derive(Debug, PartialEq)]
enum Expected {
    Rate(u64, u64),
    Syntax,
    Range,
}

/// The grammar `digits? ('.' digits?)? ([eE] [+-]? digits)? ('/' [smhdSMHD])?`
/// with at least one mantissa digit, evaluated exactly.
fn reference(data: &[u8]) -> Expected {
    let (number, unit) = match data {
        [head @ .., b'/', u] => match u {
            b's' | b'S' => (head, 1u32),
            b'm' | b'M' => (head, 60),
            b'h' | b'H' => (head, 3600),
            b'd' | b'D' => (head, 86_400),
            _ => return Expected::Syntax,
        },
        _ => (data, 1),
    };
    let mut i = 0;
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < number.len() && number[*i].is_ascii_digit() {
            *i += 1;
        }
        &number[start..*i]
    };
    let int = digits(&mut i);
    let mut frac: &[u8] = &[];
    if i < number.len() && number[i] == b'.' {
        i += 1;
        frac = digits(&mut i);
    }
    if int.is_empty() && frac.is_empty() {
        return Expected::Syntax;
    }
    let mut exp: i64 = 0;
    if i < number.len() && (number[i] == b'e' || number[i] == b'E') {
        i += 1;
        let neg = i < number.len() && number[i] == b'-';
        if i < number.len() && (number[i] == b'-' || number[i] == b'+') {
            i += 1;
        }
        let e = digits(&mut i);
        if e.is_empty() {
            return Expected::Syntax;
        }
        // Beyond what any input's digits can cancel: saturate.
        exp = e.iter().fold(0i64, |v, &c| (v * 10 + i64::from(c - b'0')).min(1 << 40));
        if neg {
            exp = -exp;
        }
    }
    if i != number.len() {
        return Expected::Syntax;
    }
    let mantissa = int
        .iter()
        .chain(frac)
        .fold(BigUint::zero(), |v, &c| v * 10u32 + u32::from(c - b'0'));
    if mantissa.is_zero() {
        return Expected::Rate(0, 1);
    }
    // value = mantissa * 10^exp with 1 <= mantissa < 10^len: far out of
    // range beyond these bounds (no need for huge powers of ten).
    let exp = exp - frac.len() as i64;
    if exp > 30 || exp < -(number.len() as i64) - 60 {
        return Expected::Range;
    }
    let ten = BigUint::from(10u32).pow(exp.unsigned_abs() as u32);
    let value = if exp >= 0 {
        Ratio::new(mantissa * ten, BigUint::from(unit))
    } else {
        Ratio::new(mantissa, ten * unit)
    };
    let (num, den) = (value.numer(), value.denom());
    if *num <= BigUint::from(MAX_RATE_NUM) && *den <= BigUint::from(MAX_RATE_DEN) {
        let small = |v: &BigUint| v.to_u64_digits().first().copied().unwrap_or(0);
        assert!(!den.is_zero() && (den.is_one() || !num.is_zero()));
        Expected::Rate(small(num), small(den))
    } else {
        Expected::Range
    }
}

fuzz_target!(|data: &[u8]| {
    let got = match parse::rate(data) {
        Ok(r) => Expected::Rate(r.num(), r.den()),
        Err(e) if e == ERR_RATE => Expected::Syntax,
        Err(e) if e == ERR_RATE_RANGE => Expected::Range,
        Err(e) => panic!("unexpected error {e:?}"),
    };
    assert_eq!(got, reference(data), "{:?}", String::from_utf8_lossy(data));
    let Ok(r) = parse::rate(data) else {
        return;
    };
    assert_eq!(
        Rate::new(r.num().into(), r.den().into()),
        Some(r),
        "not reduced"
    );

    // The rate as TB.INFO renders it: exact when it terminates within 12
    // decimals, else within half a unit of the 12th decimal.
    let shown = r.to_decimal();
    if 1_000_000_000_000 % r.den() == 0 {
        assert_eq!(parse::rate(shown.as_bytes()), Ok(r), "{shown:?}");
    } else if let Ok(back) = parse::rate(shown.as_bytes()) {
        // |r - back| <= 0.5e-12, by cross-multiplication (no overflow:
        // numerators < 2^54, denominators <= 2^40).
        let lhs = u128::from(r.num()) * u128::from(back.den());
        let rhs = u128::from(back.num()) * u128::from(r.den());
        let diff = lhs.abs_diff(rhs);
        let dens = u128::from(r.den()) * u128::from(back.den());
        assert!(
            diff.checked_mul(2_000_000_000_000)
                .is_some_and(|d| d <= dens),
            "{r:?} shown as {shown:?} reads back as {back:?}"
        );
    }
});
