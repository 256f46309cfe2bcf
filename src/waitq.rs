//! The queue of calls waiting server-side for leases (`BLOCK ms` with
//! `LEASE`): first come, first served per bucket.
//!
//! A waiting call is queued on every bucket it asks of, in arrival order.
//! It may be tried (granted if all its parts fit) only when it is first in
//! the queue of every one of its buckets, so a later call never overtakes an
//! earlier one on a bucket they share, and a call asking several buckets is
//! granted all at once or not at all. Pure: no Redis types, no clock; the
//! glue (`glue::lease_wait`) asks it what to try and when.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;

/// A waiting call, as the queue knows it.
pub type WaiterId = u64;

/// FIFO queues of waiting calls, one per bucket key `K`.
#[derive(Debug)]
pub struct WaitQueue<K> {
    queues: HashMap<K, VecDeque<WaiterId>>,
    keys: HashMap<WaiterId, Vec<K>>,
    next: WaiterId,
}

impl<K> Default for WaitQueue<K> {
    fn default() -> Self {
        WaitQueue {
            queues: HashMap::new(),
            keys: HashMap::new(),
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

    /// Queues a call on `keys` (distinct), last on each; returns its id.
    pub fn push(&mut self, keys: Vec<K>) -> WaiterId {
        self.next += 1;
        let id = self.next;
        for k in &keys {
            self.queues.entry(k.clone()).or_default().push_back(id);
        }
        self.keys.insert(id, keys);
        id
    }

    /// Takes a call out of every queue it is in (granted, timed out, or
    /// gone); returns its keys, or `None` if it was not queued.
    pub fn remove(&mut self, id: WaiterId) -> Option<Vec<K>> {
        let keys = self.keys.remove(&id)?;
        for k in &keys {
            if let Some(q) = self.queues.get_mut(k) {
                if q.front() == Some(&id) {
                    q.pop_front();
                } else {
                    q.retain(|&w| w != id);
                }
                if q.is_empty() {
                    self.queues.remove(k);
                }
            }
        }
        Some(keys)
    }

    /// Whether `id` is first in the queue of each of its keys: the only
    /// calls that may be tried.
    pub fn is_first(&self, id: WaiterId) -> bool {
        self.keys.get(&id).is_some_and(|keys| {
            keys.iter()
                .all(|k| self.queues.get(k).and_then(|q| q.front()) == Some(&id))
        })
    }

    /// The call to try next for `key`: the first in its queue, if it is
    /// first on all of its keys too.
    pub fn first(&self, key: &K) -> Option<WaiterId> {
        let id = *self.queues.get(key)?.front()?;
        self.is_first(id).then_some(id)
    }

    /// The keys `id` waits on.
    pub fn keys_of(&self, id: WaiterId) -> Option<&[K]> {
        self.keys.get(&id).map(Vec::as_slice)
    }

    /// Number of waiting calls.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no call waits.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// When a first-in-line call that was just denied should be tried again,
/// in ms from now: its reply's `retry_after_ms` (the refill or a lease's
/// expiry, whichever comes first), at least 1 ms; `None` when it can never
/// fit (-1): it then waits for a give-back or its own timeout.
pub fn retry_in_ms(retry_after_ms: i64) -> Option<u64> {
    (retry_after_ms >= 0).then(|| retry_after_ms.max(1) as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_come_first_served_on_one_key() {
        let mut q = WaitQueue::default();
        let a = q.push(vec!["k"]);
        let b = q.push(vec!["k"]);
        assert!(q.is_waited(&["k"]) && !q.is_waited(&["other"]));
        assert_eq!(q.first(&"k"), Some(a));
        assert!(!q.is_first(b));
        assert_eq!(q.remove(a), Some(vec!["k"]));
        assert_eq!(q.first(&"k"), Some(b));
        q.remove(b);
        assert!(q.is_empty() && !q.is_waited(&["k"]));
        assert_eq!(q.remove(b), None);
    }

    #[test]
    fn a_multi_key_call_is_tried_only_when_first_everywhere() {
        let mut q = WaitQueue::default();
        let a = q.push(vec!["rpm"]);
        let b = q.push(vec!["rpm", "slots"]);
        let c = q.push(vec!["slots"]);
        // b is first on slots but not on rpm: nobody on slots may be tried,
        // so c (later) never overtakes b on the bucket they share.
        assert_eq!(q.first(&"slots"), None);
        assert_eq!(q.first(&"rpm"), Some(a));
        q.remove(a);
        assert_eq!(q.first(&"slots"), Some(b));
        assert_eq!(q.first(&"rpm"), Some(b));
        q.remove(b);
        assert_eq!(q.first(&"slots"), Some(c));
        assert_eq!(q.keys_of(c), Some(&["slots"][..]));
    }

    #[test]
    fn leaving_from_the_middle_keeps_the_order() {
        let mut q = WaitQueue::default();
        let ids: Vec<_> = (0..5).map(|_| q.push(vec![1u8])).collect();
        q.remove(ids[2]);
        q.remove(ids[0]);
        let mut served = Vec::new();
        while let Some(id) = q.first(&1) {
            served.push(id);
            q.remove(id);
        }
        assert_eq!(served, vec![ids[1], ids[3], ids[4]]);
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

    #[test]
    fn retry_time_follows_the_denial() {
        assert_eq!(retry_in_ms(-1), None);
        assert_eq!(retry_in_ms(0), Some(1));
        assert_eq!(retry_in_ms(250), Some(250));
    }

    /// A virtual clock: 40 calls wait on an in-flight limit of 4, each
    /// holds its slot 200 ms; serving the first in line whenever a slot
    /// comes back serves all 40, in arrival order, one try each when a slot
    /// is free, 4 at a time.
    #[test]
    fn forty_waiters_on_four_slots_are_served_in_order() {
        let mut q = WaitQueue::default();
        let ids: Vec<_> = (0..40).map(|_| q.push(vec!["slots"])).collect();
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
                q.remove(id);
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
}
