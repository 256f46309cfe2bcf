//! The queue of calls waiting server-side (`BLOCK ms` with `LEASE` or
//! `FLOW`, and `TB.MCONSUME ... BLOCK ms`): one queue per bucket, weighted
//! fair across flows, first come first served within a flow.
//!
//! A waiting call is queued on one bucket: the one that makes it wait (or,
//! when it came, the first of its buckets that had calls waiting). Only
//! the first in a queue is tried, and a try is the whole call, all of its
//! buckets at once; a first in line that some other bucket of its call now
//! makes wait moves to that bucket's queue, keeping its place in its
//! flow's line. The order across flows is [`crate::fair`]'s: a call costs
//! the tokens it asks of the queue's bucket. Pure: no Redis types, no
//! clock; the glue (`glue::lease_wait`) asks it what to try and when.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

use crate::fair::{self, FairQueue, FlowStat};

/// A waiting call, as the queue knows it.
pub type WaiterId = u64;

/// Where a call waits.
#[derive(Debug)]
struct Place<K> {
    key: K,
    slot: fair::WaiterId,
    flow: Box<[u8]>,
    weight: u64,
}

/// The queues of waiting calls, one per bucket key `K`.
///
/// Invariant: `at` holds exactly the queued calls, each in the queue of its
/// `key` under `slot`; no queue is empty.
#[derive(Debug)]
pub struct WaitQueue<K> {
    queues: HashMap<K, FairQueue<WaiterId>>,
    at: HashMap<WaiterId, Place<K>>,
    next: WaiterId,
}

impl<K> Default for WaitQueue<K> {
    fn default() -> Self {
        WaitQueue {
            queues: HashMap::new(),
            at: HashMap::new(),
            next: 0,
        }
    }
}

impl<K: Hash + Eq + Clone> WaitQueue<K> {
    /// Whether a call is waiting on any of `keys`: a new call on them must
    /// then queue behind it rather than be tried at once.
    pub fn is_waited(&self, keys: &[K]) -> bool {
        keys.iter().any(|k| self.queues.contains_key(k))
    }

    /// The first of `keys` that has calls waiting.
    pub fn first_waited<'k>(&self, keys: &'k [K]) -> Option<&'k K> {
        keys.iter().find(|k| self.queues.contains_key(*k))
    }

    /// Queues a call on `key`, in `flow` of `weight`, asking `cost` tokens
    /// of it; returns its id (ids grow with arrival).
    pub fn push(&mut self, key: K, flow: &[u8], weight: u64, cost: u64) -> WaiterId {
        self.next += 1;
        let id = self.next;
        self.place(id, key, flow.into(), weight, cost);
        id
    }

    fn place(&mut self, id: WaiterId, key: K, flow: Box<[u8]>, weight: u64, cost: u64) {
        let q = self.queues.entry(key.clone()).or_default();
        let slot = q.push_in_order(&flow, weight, cost, id, id);
        self.at.insert(
            id,
            Place {
                key,
                slot,
                flow,
                weight,
            },
        );
    }

    /// Moves a queued call to the queue of `key`, where it asks `cost`
    /// tokens; it keeps its flow and its place in the flow's line. Returns
    /// the key it left.
    pub fn move_to(&mut self, id: WaiterId, key: K, cost: u64) -> Option<K> {
        let p = self.unplace(id, false)?;
        self.place(id, key, p.flow, p.weight, cost);
        Some(p.key)
    }

    fn unplace(&mut self, id: WaiterId, served: bool) -> Option<Place<K>> {
        let p = self.at.remove(&id)?;
        if let Some(q) = self.queues.get_mut(&p.key) {
            if served && q.peek().map(|(slot, _, _)| slot) == Some(p.slot) {
                q.pop();
            } else {
                q.remove(p.slot);
            }
            if q.is_empty() {
                self.queues.remove(&p.key);
            }
        }
        Some(p)
    }

    /// Takes a call out of its queue without a grant (timed out, gone, or
    /// answered an error); returns the key it waited on.
    pub fn remove(&mut self, id: WaiterId) -> Option<K> {
        self.unplace(id, false).map(|p| p.key)
    }

    /// Takes a granted call out of its queue: the first in line's grant
    /// counts for its flow's share. Returns the key it waited on.
    pub fn served(&mut self, id: WaiterId) -> Option<K> {
        self.unplace(id, true).map(|p| p.key)
    }

    /// The call to try next for `key`: the first in its queue.
    pub fn first(&self, key: &K) -> Option<WaiterId> {
        self.queues.get(key)?.peek().map(|(_, _, &id)| id)
    }

    /// Whether `id` is first in its queue: the only calls that are tried.
    pub fn is_first(&self, id: WaiterId) -> bool {
        self.key_of(id).is_some_and(|k| self.first(k) == Some(id))
    }

    /// The key `id` waits on.
    pub fn key_of(&self, id: WaiterId) -> Option<&K> {
        self.at.get(&id).map(|p| &p.key)
    }

    /// The flows waiting on `key`, in the order they are served next.
    pub fn flows(&self, key: &K) -> Vec<FlowStat<'_>> {
        self.queues
            .get(key)
            .map_or_else(Vec::new, |q| q.flows().collect())
    }

    /// Calls waiting on `key`.
    pub fn waiting(&self, key: &K) -> usize {
        self.queues.get(key).map_or(0, FairQueue::len)
    }

    /// Flows with a call waiting, summed over the buckets.
    pub fn flow_count(&self) -> usize {
        self.queues.values().map(|q| q.flows().count()).sum()
    }

    /// Number of waiting calls.
    pub fn len(&self) -> usize {
        self.at.len()
    }

    /// Whether no call waits.
    pub fn is_empty(&self) -> bool {
        self.at.is_empty()
    }
}

/// Whether two waiting calls ask the same (their arguments equal but for
/// the value after `BLOCK`, how long each waits): the second may then fit
/// exactly when the first would have.
pub fn same_request(a: &[&[u8]], b: &[&[u8]]) -> bool {
    a.len() == b.len()
        && (0..a.len()).all(|i| {
            a[i] == b[i]
                || (i > 0 && a[i - 1].eq_ignore_ascii_case(b"BLOCK") && b[i - 1] == a[i - 1])
        })
}

/// How long past its expiry (the instant its bucket fills up, or its last
/// lease ends) the key of a bucket written by a grant of the queue is kept.
/// The next call in line is due when the bucket can serve it, which for a
/// call asking the whole capacity is the instant it fills: a timer that
/// runs late (a busy main thread, a loaded machine) then still finds the
/// key, and the call is granted as of that instant. Without the key it is
/// granted as of the late reading (a missing key is a full bucket as of
/// now only), and the refill in between is lost. A full bucket reads the
/// same with its key as without.
pub const KEEP_KEY_MS: i64 = 100;

/// The absolute expiry (ms; 0: none) stored with a key written by a grant
/// of the queue, for a key that would expire at `at_ms`.
pub fn kept_expiry_ms(at_ms: i64) -> i64 {
    if at_ms > 0 {
        at_ms.saturating_add(KEEP_KEY_MS)
    } else {
        at_ms
    }
}

/// The wait before a timer that tries a waiting call again at `due_us`,
/// set at `now_us` (µs of the server's clock, read to the microsecond, whose
/// readings step by `tick_us`): until the first step at or after `due_us`,
/// to the microsecond, when the server's clock first reads `due_us` or
/// later (the call is then tried as of `due_us`). A wait rounded up to
/// whole milliseconds from a millisecond reading (Redis 7.0) ran up to
/// 1 ms late, each grant's timer later than the last.
pub fn ready_in(due_us: i64, now_us: i64, tick_us: i64) -> Duration {
    let tick = tick_us.max(1);
    let at = due_us
        .div_euclid(tick)
        .saturating_add(i64::from(due_us.rem_euclid(tick) > 0))
        * tick;
    Duration::from_micros(at.saturating_sub(now_us).max(0) as u64)
}

/// When a call denied at `at_us` with a wait of `wait_us` (exact; -1: no
/// refill or lease expiry will make it fit) may fit: counted from the
/// instant the denial was decided at, not from a later reading of the
/// clock (on Redis 7.0, whose clock moves within a command, that was up to
/// 1 ms later), and to the microsecond (a wait rounded up to a millisecond
/// granted a call asking a bucket's whole capacity after the bucket had
/// filled, losing the refill in between: 2% of a rate of 30/s).
pub fn due_at(at_us: i64, wait_us: i64) -> Option<i64> {
    (wait_us >= 0).then(|| at_us.saturating_add(wait_us.max(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEFAULT: &[u8] = b"";

    #[test]
    fn first_come_first_served_in_one_flow() {
        let mut q = WaitQueue::default();
        let a = q.push("k", DEFAULT, 1, 1);
        let b = q.push("k", DEFAULT, 1, 1);
        assert!(q.is_waited(&["k"]) && !q.is_waited(&["other"]));
        assert_eq!(q.first(&"k"), Some(a));
        assert!(q.is_first(a) && !q.is_first(b));
        assert_eq!(q.served(a), Some("k"));
        assert_eq!(q.first(&"k"), Some(b));
        assert_eq!(q.remove(b), Some("k"));
        assert!(q.is_empty() && !q.is_waited(&["k"]));
        assert_eq!(q.remove(b), None);
    }

    #[test]
    fn flows_share_a_bucket_by_weight() {
        let mut q = WaitQueue::default();
        for _ in 0..30 {
            q.push("k", b"a", 3, 1);
        }
        for _ in 0..10 {
            q.push("k", b"b", 1, 1);
        }
        let flows = q.flows(&"k");
        assert_eq!((flows.len(), q.waiting(&"k"), q.flow_count()), (2, 40, 2));
        let mut b_served = 0;
        for _ in 0..20 {
            let id = q.first(&"k").unwrap();
            b_served += usize::from(id > 30);
            q.served(id);
        }
        assert_eq!(b_served, 5, "3:1 over 20 grants");
    }

    #[test]
    fn a_timed_out_head_costs_its_flow_nothing() {
        let mut q = WaitQueue::default();
        let a0 = q.push("k", b"a", 1, 1);
        let a1 = q.push("k", b"a", 1, 1);
        let b0 = q.push("k", b"b", 1, 1);
        q.remove(a0);
        // a was not served: it stays first.
        assert_eq!(q.first(&"k"), Some(a1));
        q.served(a1);
        assert_eq!(q.first(&"k"), Some(b0));
    }

    #[test]
    fn a_moved_call_keeps_its_place_in_its_flow() {
        let mut q = WaitQueue::default();
        let x = q.push("rpm", b"a", 1, 1);
        let y = q.push("tpm", b"a", 1, 100);
        let z = q.push("tpm", b"a", 1, 100);
        assert_eq!(q.first_waited(&["slots", "tpm"]), Some(&"tpm"));
        // x is first on rpm, but tpm makes it wait: it moves there, ahead
        // of the later calls of its flow.
        assert_eq!(q.move_to(x, "tpm", 100), Some("rpm"));
        assert!(!q.is_waited(&["rpm"]));
        assert_eq!(q.key_of(x), Some(&"tpm"));
        assert_eq!(q.first(&"tpm"), Some(x));
        q.served(x);
        assert_eq!(q.first(&"tpm"), Some(y));
        q.served(y);
        assert_eq!(q.first(&"tpm"), Some(z));
    }

    #[test]
    fn the_same_request_may_differ_in_its_wait_only() {
        let a: [&[u8]; 5] = [b"TB.CONSUME", b"k", b"0", b"BLOCK", b"100"];
        let b: [&[u8]; 5] = [b"TB.CONSUME", b"k", b"0", b"BLOCK", b"9000"];
        let c: [&[u8]; 5] = [b"TB.CONSUME", b"k", b"1", b"BLOCK", b"100"];
        assert!(same_request(&a, &b));
        assert!(!same_request(&a, &c));
        assert!(!same_request(&a, &a[..4]));
    }

    /// A virtual clock: 40 calls wait on an in-flight limit of 4, each
    /// holds its slot 200 ms; serving the first in line whenever a slot
    /// comes back serves all 40, in arrival order, 4 at a time.
    #[test]
    fn forty_waiters_on_four_slots_are_served_in_order() {
        let mut q = WaitQueue::default();
        let ids: Vec<_> = (0..40).map(|_| q.push("slots", DEFAULT, 1, 1)).collect();
        let mut free = 4u32;
        let mut releases: Vec<u64> = Vec::new(); // virtual ms of each release
        let mut served = Vec::new();
        let mut now = 0u64;
        loop {
            releases.retain(|&at| {
                if at <= now {
                    free += 1;
                    false
                } else {
                    true
                }
            });
            while free > 0 {
                let Some(id) = q.first(&"slots") else { break };
                q.served(id);
                free -= 1;
                served.push((id, now));
                releases.push(now + 200);
            }
            if q.is_empty() {
                break;
            }
            now = *releases.iter().min().unwrap();
        }
        assert_eq!(served.iter().map(|s| s.0).collect::<Vec<_>>(), ids);
        assert_eq!(served.last().unwrap().1, 9 * 200);
    }

    /// A virtual clock: a bucket of 100/s, capacity 1, saturated by flow a
    /// (200 waiting calls, each asking again when served) while flow b
    /// brings 10: b gets every other grant while both wait.
    #[test]
    fn a_saturated_bucket_alternates_two_flows_on_a_virtual_clock() {
        let mut q = WaitQueue::default();
        let mut flow_of = HashMap::new();
        for _ in 0..200 {
            flow_of.insert(q.push("k", b"a", 1, 1), 'a');
        }
        for _ in 0..10 {
            flow_of.insert(q.push("k", b"b", 1, 1), 'b');
        }
        let mut grants = Vec::new();
        // One token every 10 ms: the first in line is granted then.
        for _tick in 0..20 {
            let id = q.first(&"k").unwrap();
            q.served(id);
            let f = flow_of[&id];
            grants.push(f);
            if f == 'a' {
                flow_of.insert(q.push("k", b"a", 1, 1), 'a');
            }
        }
        assert_eq!(
            grants.iter().filter(|&&f| f == 'b').count(),
            10,
            "{grants:?}"
        );
    }

    /// A virtual clock as on Redis 7.0: the server's clock reads whole
    /// milliseconds of a real time kept in microseconds, and each timer
    /// runs `LATE` µs after it is due (the event loop). Calls always wait
    /// on a bucket of capacity 1 (100/s, a token every 10 ms, and 30/s,
    /// every 33,334 µs rounded up): after each grant, made as of its due
    /// instant, the next call is denied (its token is due a refill interval
    /// after the grant) and a timer set for then. Every timer must run
    /// within `LATE` of the first millisecond at or after its due instant
    /// (when the server's clock reads it), and 1,000 grants take exactly
    /// 999 refill intervals of bucket time. Before: the wait was rounded up
    /// to whole milliseconds from the millisecond reading, so the timer ran
    /// late by the part of a millisecond the reading dropped (each grant's
    /// later than the last), and at 30/s each grant came 34 ms after the
    /// one before instead of 33.334.
    #[test]
    fn ready_timers_on_a_millisecond_clock_run_when_the_token_comes() {
        const LATE: i64 = 150;
        const WORK: i64 = 40; // µs from a grant to the next call's denial
        let reading = |real: i64| real / 1000 * 1000;
        for interval in [10_000, 33_334] {
            for start in (0..1000).step_by(7) {
                let mut real = 1_700_000_000_000_000 + start;
                let first = reading(real);
                let mut granted_at = first;
                for i in 1..1000 {
                    real += WORK;
                    let denied_at = reading(real);
                    let due = due_at(denied_at, granted_at + interval - denied_at).unwrap();
                    real += i64::try_from(ready_in(due, real, 1000).as_micros()).unwrap() + LATE;
                    let tick = (due + 999) / 1000 * 1000;
                    assert!(
                        (tick..=tick + LATE).contains(&real),
                        "grant {i} at {interval} µs from {start} µs into a millisecond: \
                         timer {} µs after its tick",
                        real - tick
                    );
                    granted_at = due;
                }
                assert_eq!(granted_at - first, 999 * interval, "from {start} µs");
            }
        }
    }

    /// A virtual clock as on Redis 7.0 (whole milliseconds), calls always
    /// waiting on a bucket of 100/s, capacity 1, and timers late by up to
    /// 90 ms (a loaded machine). Each grant leaves the bucket empty, full
    /// again (its key expiring) at the instant the next call is due; a
    /// timer that runs while the key is there grants as of that instant, a
    /// later one as of its own reading (the refill in between is lost).
    /// With the key kept [`KEEP_KEY_MS`] past that instant, 1,000 grants
    /// take exactly 999 refill intervals whatever the timers' delays.
    #[test]
    fn late_timers_lose_no_refill_while_the_queue_keeps_the_key() {
        let mut late = 0x2545_f491_4f6c_dd1d_u64; // xorshift: each timer's delay
        let first = 1_700_000_000_000_000;
        let mut granted_at = first;
        for _ in 1..1000 {
            let due = granted_at + 10_000;
            late ^= late << 13;
            late ^= late >> 7;
            late ^= late << 17;
            let now = (due + (late % 90_000) as i64) / 1000 * 1000;
            let expiry_ms = kept_expiry_ms(due / 1000);
            granted_at = if now / 1000 <= expiry_ms { due } else { now };
        }
        assert_eq!(granted_at - first, 999 * 10_000);
    }
}
