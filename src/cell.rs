//! `CL.THROTTLE`'s reply, as redis-cell gives it: pure, no Redis types.
//!
//! The contract is redis-cell's, not `TB.CONSUME`'s: `tests/cl_throttle.rs`
//! replays replies recorded from a build of brandur/redis-cell. Where the two
//! differ, this module follows redis-cell:
//! - a quantity of 0 adds nothing to the bucket and is always allowed
//!   (`TB.CONSUME` with `n = 0` is a peek that answers whether one token is
//!   there);
//! - times are whole seconds, rounded up from whole milliseconds (a wait
//!   of 1.0004 s is 1 s), `-1` for "allowed" or "never".

use crate::bucket::{Outcome, NANOS};

/// The five integers of a `CL.THROTTLE` reply for the consume outcome `o` of
/// `quantity` tokens at `now_us` from a bucket of `capacity` (`max_burst +
/// 1`): `[limited, limit, remaining, retry_after_s, reset_after_s]`.
pub fn reply(o: &Outcome, quantity: u64, capacity: u64, now_us: i64) -> [i64; 5] {
    let limited = quantity > 0 && !o.allowed();
    let b = &o.bucket;
    let retry = match limited {
        true => b.micros_until(quantity as i128 * NANOS, now_us),
        false => None,
    };
    [
        i64::from(limited),
        capacity as i64,
        o.remaining as i64,
        retry.map_or(-1, secs),
        b.micros_until(b.cap_nanos(), now_us).map_or(-1, secs),
    ]
}

/// A wait in µs as redis-cell rounds it: whole seconds, plus one when the
/// rest holds at least a whole millisecond.
fn secs(us: u64) -> i64 {
    (us / 1_000_000 + u64::from(us % 1_000_000 >= 1_000)).min(i64::MAX as u64) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{consume, Limits, Mode, Rate};

    const T0: i64 = 1_700_000_000_000_000;

    #[test]
    fn quantity_zero_is_allowed_on_an_empty_bucket() {
        // CL.THROTTLE k 4 1 1 1 six times, then CL.THROTTLE k 4 1 1 0.
        let lim = Limits {
            rate: Rate::new(1, 1).unwrap(),
            capacity: 5,
        };
        let mut b = None;
        let mut last = [0; 5];
        for _ in 0..6 {
            let o = consume(b.as_ref(), lim, 1, Mode::All, T0);
            last = reply(&o, 1, 5, T0);
            if o.dirty {
                b = Some(o.bucket);
            }
        }
        assert_eq!(last, [1, 5, 0, 1, 5]);
        let o = consume(b.as_ref(), lim, 0, Mode::All, T0);
        assert!(!o.dirty);
        assert_eq!(reply(&o, 0, 5, T0), [0, 5, 0, -1, 5]);
    }

    #[test]
    fn a_quantity_above_the_limit_never_gets_a_retry() {
        let lim = Limits {
            rate: Rate::new(1, 1).unwrap(),
            capacity: 5,
        };
        let o = consume(None, lim, 6, Mode::All, T0);
        assert_eq!(reply(&o, 6, 5, T0), [1, 5, 5, -1, 0]);
    }

    #[test]
    fn waits_round_up_from_whole_milliseconds() {
        assert_eq!(secs(0), 0);
        assert_eq!(secs(999), 0);
        assert_eq!(secs(1_000), 1);
        assert_eq!(secs(1_000_999), 1);
        assert_eq!(secs(1_001_000), 2);
    }
}
