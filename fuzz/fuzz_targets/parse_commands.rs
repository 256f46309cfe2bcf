//! Every command's argument parser in `parse/` on arbitrary argument lists
//! (the input split at NUL bytes; the first byte picks the command): never
//! panics, and every accepted call is in range and self-consistent:
//! - TB.CONSUME: the same options as `consume_options` on the arguments
//!   after `capacity`;
//! - TB.MCONSUME: one request per key, `numkeys` keys, no key twice, and a
//!   duplicate refusal only when two keys are equal (checked pairwise);
//!   `RESERVE` or `ATMOST [MIN chunk]`, never both, the chunk within the
//!   capacity of every part asking for the largest n;
//! - CL.THROTTLE: capacity `max_burst + 1` and quantity within 2^53;
//! - TB.SETSTATE: a valid bucket that reads back the same from its compact
//!   form, or the deletion form `key DEL`;
//! - TB.CONFIG, TB.REFUND, TB.INFO: the argument counts they accept;
//! - TB.RELEASE: `lease-id [USED n]`, both within 2^53;
//! - LEASE (TB.CONSUME, TB.MCONSUME): a TTL from 1 ms to a day, never with
//!   a wait or ATMOST, never on n = 0.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tb::bucket::MAX_AMOUNT;
use tb::codec::wire;
use tb::errors::{ERR_DUPLICATE, ERR_OPTION};
use tb::fair::MAX_WEIGHT;
use tb::lease::MAX_TTL_MS;
use tb::parse::{self, ArgsError, ConfigArgs, SetStateArgs, MAX_FLOW_NAME, MAX_KEYS, MAX_WAIT_MS};

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let mut args: Vec<&[u8]> = vec![b"CMD"];
    if !rest.is_empty() {
        args.extend(rest.split(|&b| b == 0));
    }
    let a = &args[..];
    match which % 8 {
        0 => {
            if let Ok(c) = parse::consume_args(a) {
                assert!(a.len() >= 4 && c.limits.capacity <= MAX_AMOUNT);
                assert!(c.options.min.is_none_or(|m| m >= 1 && m <= c.limits.capacity));
                let (flow, rest) = parse::split_flow(a[4..].to_vec(), ERR_OPTION).expect("FLOW was valid");
                assert_eq!(flow, c.flow, "{a:?}");
                if let Some(f) = flow {
                    assert!(matches!(c.options.wait, parse::Wait::Block(_)), "{a:?}");
                    assert!((1..=MAX_FLOW_NAME).contains(&f.name.len()), "{a:?}");
                    assert!((1..=MAX_WEIGHT).contains(&f.weight), "{a:?}");
                }
                let (lease, rest) = parse::split_lease(&rest).expect("LEASE was valid");
                assert_eq!(lease.map(|(ttl, _)| ttl), c.lease_ttl_ms, "{a:?}");
                assert_eq!(lease.is_some_and(|(_, keep)| keep), c.lease_keep, "{a:?}");
                let opts = parse::consume_options(rest.into_iter());
                assert_eq!(opts, Ok(c.options), "{a:?}");
                if let Some((ttl, _)) = lease {
                    assert!((1..=MAX_TTL_MS).contains(&ttl) && c.options.n >= 1, "{a:?}");
                    assert!(!c.options.atmost, "{a:?}");
                    assert!(!matches!(c.options.wait, parse::Wait::Reserve(_)), "{a:?}");
                }
            }
        }
        1 => match parse::mconsume_args(a) {
            Ok(m) => {
                let k = m.requests.len();
                assert!(k >= 1 && k as u64 <= MAX_KEYS, "{a:?}");
                let leased = m.leases.iter().flatten().count();
                // KEEP follows a part's LEASE, one more argument.
                let kept = m.keep.iter().filter(|&&k| k).count();
                assert!(
                    m.keep.iter().zip(&m.leases).all(|(k, l)| !k || l.is_some()),
                    "{a:?}"
                );
                for (l, r) in m.leases.iter().zip(&m.requests) {
                    assert!(l.is_none_or(|ttl| (1..=MAX_TTL_MS).contains(&ttl) && r.n >= 1));
                }
                assert!(leased == 0 || m.atmost.is_none(), "LEASE with ATMOST: {a:?}");
                let reserve = if m.reserve_ms.is_some() { 2 } else { 0 };
                let block = if m.block_ms.is_some() { 2 } else { 0 };
                // FLOW name [WEIGHT w]: the first FLOW among the options is
                // the keyword (no other option's value can spell it).
                let flow = m.flow.map_or(0, |_| {
                    let at = (2 + 4 * k..a.len())
                        .find(|&i| a[i].eq_ignore_ascii_case(b"FLOW"))
                        .expect("a FLOW keyword");
                    if a.get(at + 2).is_some_and(|w| w.eq_ignore_ascii_case(b"WEIGHT")) {
                        4
                    } else {
                        2
                    }
                });
                assert!(m.flow.is_none() || m.block_ms.is_some(), "FLOW without BLOCK: {a:?}");
                let options = reserve + block + flow;
                let rest = a.len() - (2 + 4 * k) - options - 3 * leased - kept;
                let extra = match (m.reserve_ms, m.atmost) {
                    (Some(_), Some(_)) => panic!("RESERVE with ATMOST: {a:?}"),
                    (_, Some(_)) => {
                        assert!(rest == 1 || rest == 3, "{a:?}");
                        rest
                    }
                    (_, None) => {
                        assert_eq!(rest, 0, "{a:?}");
                        0
                    }
                };
                assert_eq!(
                    a.len(),
                    2 + 4 * k + options + 3 * leased + kept + extra,
                    "{a:?}"
                );
                if let (Some(c), 3) = (m.atmost, extra) {
                    let big = m.requests.iter().map(|r| r.n).max().unwrap_or(0);
                    assert!(c >= 1, "{a:?}");
                    for r in m.requests.iter().filter(|r| r.n == big) {
                        assert!(c <= r.limits.capacity, "{a:?}");
                    }
                }
                assert!(m.reserve_ms.is_none_or(|ms| ms <= MAX_WAIT_MS));
                let keys = &a[2..2 + k];
                for i in 0..k {
                    assert!(!keys[..i].contains(&keys[i]), "duplicate accepted: {a:?}");
                }
            }
            Err(ArgsError::Invalid(e)) if e == ERR_DUPLICATE => {
                let k = parse::numkeys(a[1]).expect("numkeys was valid");
                let keys = &a[2..2 + k];
                let dup = (0..k).any(|i| keys[..i].contains(&keys[i]));
                assert!(dup, "duplicate reported without one: {a:?}");
            }
            Err(_) => {}
        },
        2 => {
            if let Ok(t) = parse::throttle_args(a) {
                assert!((5..=6).contains(&a.len()), "{a:?}");
                assert!((1..=MAX_AMOUNT).contains(&t.limits.capacity), "{t:?}");
                assert!(t.quantity <= MAX_AMOUNT, "{t:?}");
            }
        }
        3 => match parse::setstate_args(a) {
            Ok(
                ref s @ SetStateArgs::State {
                    bucket,
                    ref leases,
                    expire_at_ms,
                },
            ) => {
                assert!(bucket.is_valid() && leases.is_valid() && expire_at_ms >= 0, "{s:?}");
                let mut buf = Vec::new();
                wire::encode_state(&bucket, leases, expire_at_ms, &mut buf);
                let compact: [&[u8]; 3] = [b"CMD", a[1], &buf];
                assert_eq!(parse::setstate_args(&compact[..]).as_ref(), Ok(s), "{a:?}");
            }
            Ok(
                ref s @ SetStateArgs::Delta {
                    bucket,
                    ref delta,
                    expire_at_ms,
                },
            ) => {
                assert!(bucket.is_valid() && expire_at_ms >= 0, "{s:?}");
                let mut buf = Vec::new();
                wire::encode_delta(&bucket, delta, expire_at_ms, &mut buf);
                assert_eq!(buf, a[2], "{a:?}");
            }
            Ok(SetStateArgs::Delete) => {
                assert!(a.len() == 3 && a[2].eq_ignore_ascii_case(b"DEL"), "{a:?}")
            }
            Err(_) => {}
        },
        4 => match parse::config_args(a) {
            Ok(ConfigArgs::Get(_)) => assert_eq!(a.len(), 3),
            Ok(ConfigArgs::Set(..)) => assert_eq!(a.len(), 4),
            Ok(ConfigArgs::ResetStat) => assert_eq!(a.len(), 2),
            Err(_) => {}
        },
        5 => {
            if let Ok(n) = parse::refund_args(a) {
                assert!(a.len() == 3 && n <= MAX_AMOUNT);
            }
        }
        6 => {
            if let Ok((id, used)) = parse::release_command(a) {
                assert!(a.len() == 3 || a.len() == 5, "{a:?}");
                assert!(id <= MAX_AMOUNT && used.is_none_or(|u| u <= MAX_AMOUNT));
            }
        }
        _ => assert_eq!(parse::info_args(a).is_ok(), a.len() == 2),
    }
});
