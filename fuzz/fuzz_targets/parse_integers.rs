//! `parse::integer`, `parse::amount` and `parse::signed` on arbitrary bytes,
//! compared with a reference built on the standard library: they accept
//! exactly the plain ASCII decimals in range and return the same value.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb::bucket::MAX_AMOUNT;
use tb::errors::ERR_N;
use tb::parse;

/// The value of a non-empty run of ASCII digits, if it fits in a u128.
fn digits_value(s: &[u8]) -> Option<u128> {
    if s.is_empty() || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(s).ok()?.parse::<u128>().ok()
}

fuzz_target!(|data: &[u8]| {
    // The first 8 bytes choose `max`, the rest is the argument.
    let (max, arg) = match data.split_first_chunk::<8>() {
        Some((m, rest)) => (u64::from_le_bytes(*m), rest),
        None => (u64::MAX, data),
    };

    let want = if arg.len() <= 20 {
        digits_value(arg).filter(|&v| v <= u128::from(max))
    } else {
        None
    };
    let got = parse::integer(arg, max, ERR_N);
    assert_eq!(got.ok().map(u128::from), want, "integer({arg:?}, {max})");
    if let Err(e) = got {
        assert_eq!(e, ERR_N, "the caller's error comes back");
    }

    let want = if arg.len() <= 20 {
        digits_value(arg).filter(|&v| v <= u128::from(MAX_AMOUNT))
    } else {
        None
    };
    assert_eq!(
        parse::amount(arg, ERR_N).ok().map(u128::from),
        want,
        "amount({arg:?})"
    );

    let (neg, digits) = match arg.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, arg),
    };
    let want = if digits.len() <= 38 {
        digits_value(digits).map(|v| {
            let v = i128::try_from(v).expect("38 digits fit in an i128");
            if neg {
                -v
            } else {
                v
            }
        })
    } else {
        None
    };
    assert_eq!(parse::signed(arg, ERR_N).ok(), want, "signed({arg:?})");
});
