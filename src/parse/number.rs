//! Integers: unsigned amounts (at most 2^53) and bounded integers, and the
//! signed integers of internal state fields. ASCII digits only.

use super::ParseError;
use crate::bucket::MAX_AMOUNT;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::errors::ERR_N;

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
}
