//! The small commands: TB.REFUND, TB.RELEASE, TB.INFO, TB.TOP, TB.CONFIG,
//! TB.SETSTATE and CL.THROTTLE.

use super::{amount, exactly, integer, is_keyword, nth, signed, ArgsError, Argv, ParseError};
use crate::bucket::{Bucket, Limits, Rate, MAX_AMOUNT};
use crate::codec::wire;
use crate::errors::{
    ERR_BURST, ERR_COUNT, ERR_LEASE_ID, ERR_N, ERR_PERIOD, ERR_QUANTITY, ERR_RATE_RANGE,
    ERR_RELEASE_OPTION, ERR_STATE, ERR_SUBCOMMAND, ERR_TOP_OPTION, ERR_USED,
};
use crate::lease::Leases;

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
mod tests {
    use super::*;

    #[test]
    fn release_arguments() {
        let a = |v: &[&'static str]| v.iter().map(|s| s.as_bytes()).collect::<Vec<_>>();
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

    fn argv(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
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
