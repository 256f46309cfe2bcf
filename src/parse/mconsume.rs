//! TB.MCONSUME: several buckets in one call, all or nothing, and the
//! linear-time check that no key appears twice.

use super::{
    amount, chunk, flow_at, integer, is_keyword, lease_ttl, nth, rate, ArgsError, Argv, Flow,
    MAX_WAIT_MS,
};
use crate::bucket::Limits;
use crate::errors::{
    ERR_CAPACITY, ERR_DUPLICATE, ERR_FLOW_BLOCK, ERR_LEASE_MODE, ERR_LEASE_N, ERR_LEASE_PART,
    ERR_LEASE_TWICE, ERR_MCONSUME_BLOCK, ERR_MCONSUME_OPTION, ERR_MIN, ERR_N, ERR_NUMKEYS,
    ERR_WAIT, ERR_WEIGHT,
};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::consume_args;

    fn argv(s: &str) -> Vec<&[u8]> {
        s.split(' ').map(str::as_bytes).collect()
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
}
