//! Heavy hitters in fixed memory: which keys are denied (or make callers
//! wait) the most, right now. Pure code: no Redis types, the clock is an
//! argument.
//!
//! # The sketch
//!
//! [`Sketch`] is Space-Saving (Metwally, Agrawal, El Abbadi, "Efficient
//! computation of frequent and top-k elements in data streams", 2005) over
//! weighted events: it monitors at most `capacity` keys; an event for an
//! unmonitored key, when the sketch is full, takes over the entry with the
//! smallest count and inherits that count as its possible error. With `W` the
//! total weight seen, every key's estimate `c` and error `e` satisfy
//!
//! - `c - e <= true weight <= c`, and `e <= min <= W / capacity`, where `min`
//!   is the smallest count monitored (0 while the sketch is not full);
//! - every key not monitored has a true weight of at most `min`, so every key
//!   heavier than `W / capacity` is monitored.
//!
//! # The window: exponential decay
//!
//! Recent traffic matters, not traffic since start. Each event is weighted by
//! `exp(-age / tau)`, so a steady rate `r` settles at `r * tau`: with
//! `tau` = 60 s a key's count reads as "about its events of the last minute".
//! Decay is done with *forward decay* (Cormode, Shkapenyuk, Srivastava, Xu,
//! "Forward decay: a practical time decay model for streaming systems",
//! 2009): an event at time `t` is added with the static weight
//! `w * exp((t - L) / tau)` for a landmark `L`, and every figure is divided
//! by `exp((now - L) / tau)` when read. The stream is then an ordinary
//! weighted stream, so Space-Saving's bounds hold unchanged (read in decayed
//! units), and an update touches one entry, never the whole sketch. When
//! `exp((now - L) / tau)` grows large, every count is rescaled once and the
//! landmark moves to now (heap order is kept: it is a common factor).
//!
//! Chosen over rotating sketches (one per sub-window, merged when read)
//! because it needs one sketch instead of several, has no cliff when a
//! sub-window rotates out, and reads directly as a rate (`count / tau`).
//!
//! # Memory
//!
//! Everything is allocated when the sketch is made and never grows: entries
//! keep key names inline (up to [`KEY_MAX`] bytes; longer names are counted
//! under their first [`KEY_MAX`] bytes), a min-heap of entry ids orders them by
//! count, and an open-addressing table with linear probing finds a key's entry.
//! [`Sketch::memory_bytes`] is the exact total.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// Bytes of a key name that the sketch keeps; longer names are counted under
/// their first `KEY_MAX` bytes.
pub const KEY_MAX: usize = 256;

/// Keys each `TB.TOP` sketch monitors, and so the largest `COUNT`: every
/// count is at most `total / TOP_CAPACITY` (0.4% of the total) too high.
pub const TOP_CAPACITY: usize = 256;

/// Rescale every count once `(now - landmark) / tau` passes this, so the
/// forward weights stay far from overflow (`e^32` is about `8e13`).
const RESCALE_AFTER: f64 = 32.0;

/// One monitored key (its count is in its heap node).
#[derive(Clone)]
struct Entry {
    /// How much of the count may belong to other keys (the count inherited
    /// when this key took the entry over).
    error: f64,
    /// Hash of the key name (as kept), for the index.
    hash: u64,
    /// This entry's position in the heap.
    heap_pos: u32,
    /// Length of the key name kept in `key`.
    len: u16,
    /// The key name (its first `len` bytes).
    key: [u8; KEY_MAX],
}

impl Entry {
    fn key(&self) -> &[u8] {
        &self.key[..self.len as usize]
    }
}

/// A heap node: an entry's count next to its id, so that ordering the heap
/// reads one array.
#[derive(Clone, Copy)]
struct Node {
    /// Forward-decayed weight: an overestimate of the key's true weight.
    count: f64,
    /// The entry counted.
    id: u32,
}

/// A monitored key as reported by [`Sketch::top`], in decayed units at the
/// time of the query.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    /// The key name (truncated to [`KEY_MAX`] bytes).
    pub key: Vec<u8>,
    /// Estimated decayed weight: never below the true one.
    pub count: f64,
    /// At most this much of `count` may belong to other keys.
    pub error: f64,
}

/// A summary of the sketch at one instant, in decayed units.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// Decayed total weight of every event seen (all keys).
    pub total: f64,
    /// The guaranteed bound: every listed count is at most this much too
    /// high, and every key not listed has at most this weight. It is the
    /// smallest monitored count when the sketch is full (else 0), never more
    /// than `total / capacity`.
    pub error_bound: f64,
    /// The heaviest keys, heaviest first (ties by key name).
    pub hits: Vec<Hit>,
}

/// Space-Saving over exponentially decayed weights, in fixed memory.
pub struct Sketch {
    entries: Vec<Entry>,
    /// A min-heap by `count`, one node per entry.
    heap: Vec<Node>,
    /// Open addressing: `id + 1` of the entry whose key hashes here, 0 = empty.
    /// At most half full, so probes stay short.
    table: Vec<u32>,
    capacity: usize,
    tau_us: f64,
    landmark_us: i64,
    /// Latest time seen: time never goes backwards inside the sketch.
    last_us: i64,
    /// Sum of every forward weight added (equals the sum of counts).
    total: f64,
    /// The forward weight at `last_us` (computed once per instant).
    last_forward: f64,
    /// The entry updated last: a key denied over and over (the usual flood)
    /// is found by one comparison, without hashing.
    last_id: usize,
    hasher: RandomState,
}

impl Sketch {
    /// An empty sketch that monitors up to `capacity` keys (at least 1, at
    /// most 2^20), decaying with time constant `tau_us` microseconds, with
    /// its clock starting at `now_us`.
    pub fn new(capacity: usize, tau_us: i64, now_us: i64) -> Sketch {
        let capacity = capacity.clamp(1, 1 << 20);
        let slots = (2 * capacity).next_power_of_two();
        Sketch {
            entries: Vec::with_capacity(capacity),
            heap: Vec::with_capacity(capacity),
            table: vec![0; slots],
            capacity,
            tau_us: tau_us.max(1) as f64,
            landmark_us: now_us,
            last_us: now_us,
            total: 0.0,
            last_forward: 1.0,
            last_id: 0,
            hasher: RandomState::new(),
        }
    }

    /// How many keys it monitors at most.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes this sketch occupies, all allocated by [`Sketch::new`]: the same
    /// whatever the keys and however many were seen.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Sketch>()
            + self.entries.capacity() * std::mem::size_of::<Entry>()
            + self.heap.capacity() * std::mem::size_of::<Node>()
            + self.table.capacity() * std::mem::size_of::<u32>()
    }

    /// Records `weight` (> 0; others are ignored) for `key` at `now_us`.
    pub fn add(&mut self, key: &[u8], weight: f64, now_us: i64) {
        if !(weight > 0.0 && weight.is_finite()) {
            return;
        }
        let w = weight * self.advance(now_us);
        self.total += w;
        let key = &key[..key.len().min(KEY_MAX)];
        if let Some(e) = self.entries.get(self.last_id) {
            if e.key() == key {
                self.bump(e.heap_pos as usize, w);
                return;
            }
        }
        let hash = self.hasher.hash_one(key);
        match self.find(key, hash) {
            Some((_, id)) => {
                self.last_id = id;
                self.bump(self.entries[id].heap_pos as usize, w);
            }
            None if self.entries.len() < self.capacity => {
                let id = self.entries.len();
                let mut e = Entry {
                    error: 0.0,
                    hash,
                    heap_pos: id as u32,
                    len: 0,
                    key: [0; KEY_MAX],
                };
                e.len = key.len() as u16;
                e.key[..key.len()].copy_from_slice(key);
                self.entries.push(e);
                self.heap.push(Node {
                    count: w,
                    id: id as u32,
                });
                self.last_id = id;
                self.insert_slot(id, hash);
                self.sift_up(id);
            }
            None => {
                // Take over the entry with the smallest count.
                let Node { count: min, id } = self.heap[0];
                let id = id as usize;
                let old_key_hash = self.entries[id].hash;
                let Some(slot) = self.find_slot_of(id, old_key_hash) else {
                    // Unreachable (every monitored entry is indexed); if it
                    // ever were, start afresh rather than corrupt the index.
                    self.clear();
                    return;
                };
                self.remove_slot(slot);
                let e = &mut self.entries[id];
                e.error = min;
                e.hash = hash;
                e.len = key.len() as u16;
                e.key[..key.len()].copy_from_slice(key);
                self.insert_slot(id, hash);
                self.last_id = id;
                self.bump(0, w);
            }
        }
    }

    /// The `n` heaviest keys and the bounds, in decayed units at `now_us`.
    pub fn top(&self, n: usize, now_us: i64) -> Summary {
        let scale = 1.0 / self.forward(now_us.max(self.last_us));
        let mut nodes = self.heap.clone();
        nodes.sort_unstable_by(|a, b| {
            let (ka, kb) = (
                self.entries[a.id as usize].key(),
                self.entries[b.id as usize].key(),
            );
            b.count.total_cmp(&a.count).then_with(|| ka.cmp(kb))
        });
        let hits = nodes
            .into_iter()
            .take(n)
            .map(|node| {
                let e = &self.entries[node.id as usize];
                Hit {
                    key: e.key().to_vec(),
                    count: node.count * scale,
                    error: e.error * scale,
                }
            })
            .collect();
        Summary {
            total: self.total * scale,
            error_bound: self.min_count() * scale,
            hits,
        }
    }

    /// Forgets everything (the memory stays allocated).
    pub fn clear(&mut self) {
        self.last_id = 0;
        self.entries.clear();
        self.heap.clear();
        self.table.fill(0);
        self.total = 0.0;
    }

    /// The smallest monitored count when full (a key not monitored has at
    /// most this much), else 0; forward units.
    fn min_count(&self) -> f64 {
        if self.entries.len() < self.capacity {
            0.0
        } else {
            self.heap[0].count
        }
    }

    /// Moves the sketch's clock to `now_us` (never backwards), rescaling
    /// every count when the forward weights have grown large; returns the
    /// forward weight of an event now.
    fn advance(&mut self, now_us: i64) -> f64 {
        if now_us <= self.last_us {
            return self.last_forward;
        }
        self.last_us = now_us;
        if (now_us - self.landmark_us) as f64 / self.tau_us > RESCALE_AFTER {
            let f = 1.0 / self.forward(now_us);
            for node in &mut self.heap {
                node.count *= f;
            }
            for e in &mut self.entries {
                e.error *= f;
            }
            self.total *= f;
            self.landmark_us = now_us;
        }
        self.last_forward = self.forward(now_us);
        self.last_forward
    }

    /// `exp((t - landmark) / tau)`: the forward weight of an event at `t`.
    fn forward(&self, t: i64) -> f64 {
        ((t - self.landmark_us) as f64 / self.tau_us).exp()
    }

    fn mask(&self) -> usize {
        self.table.len() - 1
    }

    /// The table slot and entry id holding `key`, if monitored.
    fn find(&self, key: &[u8], hash: u64) -> Option<(usize, usize)> {
        let mut i = hash as usize & self.mask();
        loop {
            let s = self.table[i];
            if s == 0 {
                return None;
            }
            let id = s as usize - 1;
            let e = &self.entries[id];
            if e.hash == hash && e.key() == key {
                return Some((i, id));
            }
            i = (i + 1) & self.mask();
        }
    }

    /// The table slot that points at entry `id`.
    fn find_slot_of(&self, id: usize, hash: u64) -> Option<usize> {
        let mut i = hash as usize & self.mask();
        loop {
            match self.table[i] {
                0 => return None,
                s if s as usize - 1 == id => return Some(i),
                _ => i = (i + 1) & self.mask(),
            }
        }
    }

    fn insert_slot(&mut self, id: usize, hash: u64) {
        let mut i = hash as usize & self.mask();
        while self.table[i] != 0 {
            i = (i + 1) & self.mask();
        }
        self.table[i] = id as u32 + 1;
    }

    /// Empties slot `i`, shifting later entries of the same probe run back so
    /// that every lookup still finds them (no tombstones).
    fn remove_slot(&mut self, mut i: usize) {
        let mask = self.mask();
        self.table[i] = 0;
        let mut j = i;
        loop {
            j = (j + 1) & mask;
            let s = self.table[j];
            if s == 0 {
                return;
            }
            let home = self.entries[s as usize - 1].hash as usize & mask;
            // The entry at j may move to i unless its home lies cyclically
            // in (i, j]: then i is before its home and lookups would miss it.
            let home_in_range = if i <= j {
                i < home && home <= j
            } else {
                i < home || home <= j
            };
            if !home_in_range {
                self.table[i] = s;
                self.table[j] = 0;
                i = j;
            }
        }
    }

    #[cfg(test)]
    fn count_at(&self, pos: usize) -> f64 {
        self.heap[pos].count
    }

    /// Puts `node` at heap position `pos` and tells its entry.
    fn place(&mut self, pos: usize, node: Node) {
        self.heap[pos] = node;
        self.entries[node.id as usize].heap_pos = pos as u32;
    }

    /// Adds `w` to the count at heap position `pos` and restores the order
    /// (a count only grows, so it can only move down).
    fn bump(&mut self, pos: usize, w: f64) {
        self.heap[pos].count += w;
        self.sift_down(pos);
    }

    /// Moves the node at `pos` up while it is smaller than its parent,
    /// shifting the parents down into the hole.
    fn sift_up(&mut self, mut pos: usize) {
        let node = self.heap[pos];
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if node.count >= self.heap[parent].count {
                break;
            }
            self.place(pos, self.heap[parent]);
            pos = parent;
        }
        self.place(pos, node);
    }

    /// Moves the node at `pos` down while a child is smaller, shifting the
    /// smaller child up into the hole.
    fn sift_down(&mut self, mut pos: usize) {
        let n = self.heap.len();
        let node = self.heap[pos];
        loop {
            let l = 2 * pos + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let child = if r < n && self.heap[r].count < self.heap[l].count {
                r
            } else {
                l
            };
            if self.heap[child].count >= node.count {
                break;
            }
            self.place(pos, self.heap[child]);
            pos = child;
        }
        self.place(pos, node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const TAU: i64 = 60_000_000;

    /// Exact decayed weights at `now`, computed directly.
    fn exact(events: &[(Vec<u8>, f64, i64)], now: i64) -> HashMap<Vec<u8>, f64> {
        let mut m = HashMap::new();
        for (k, w, t) in events {
            let k = k[..k.len().min(KEY_MAX)].to_vec();
            *m.entry(k).or_insert(0.0) += w * (-((now - t) as f64) / TAU as f64).exp();
        }
        m
    }

    /// Checks every Space-Saving guarantee against the exact weights.
    fn check(s: &Sketch, events: &[(Vec<u8>, f64, i64)], now: i64) {
        let truth = exact(events, now);
        let sum: f64 = truth.values().sum();
        let all = s.top(usize::MAX, now);
        let tol = 1e-9 * sum.max(1.0);
        assert!(
            (all.total - sum).abs() <= tol,
            "total {} vs {}",
            all.total,
            sum
        );
        let listed: f64 = all.hits.iter().map(|h| h.count).sum();
        assert!((listed - sum).abs() <= tol, "counts sum to the total");
        assert!(all.error_bound <= sum / s.capacity() as f64 + tol);
        for h in &all.hits {
            let t = truth.get(&h.key).copied().unwrap_or(0.0);
            assert!(h.count + tol >= t, "underestimate: {} < {}", h.count, t);
            assert!(h.count - h.error <= t + tol, "lower bound above truth");
            assert!(h.error <= all.error_bound + tol);
        }
        for (k, t) in &truth {
            if !all.hits.iter().any(|h| &h.key == k) {
                assert!(
                    *t <= all.error_bound + tol,
                    "unlisted key heavier than the bound"
                );
            }
        }
        assert!(all.hits.len() <= s.capacity());
    }

    #[test]
    fn counts_exactly_below_capacity() {
        let mut s = Sketch::new(4, TAU, 0);
        for (k, n) in [(b"a", 3), (b"b", 1), (b"c", 2)] {
            for _ in 0..n {
                s.add(k, 1.0, 0);
            }
        }
        let top = s.top(10, 0);
        let got: Vec<(&[u8], f64, f64)> = top
            .hits
            .iter()
            .map(|h| (&h.key[..], h.count, h.error))
            .collect();
        let want: [(&[u8], f64, f64); 3] = [(b"a", 3.0, 0.0), (b"c", 2.0, 0.0), (b"b", 1.0, 0.0)];
        assert_eq!(got, want);
        assert_eq!(top.error_bound, 0.0);
        assert_eq!(top.total, 6.0);
    }

    #[test]
    fn takeover_inherits_the_minimum_as_error() {
        let mut s = Sketch::new(2, TAU, 0);
        s.add(b"a", 5.0, 0);
        s.add(b"b", 2.0, 0);
        s.add(b"c", 1.0, 0); // replaces b (count 2): c = 3, error 2
        let top = s.top(10, 0);
        assert_eq!(top.hits[0].key, b"a");
        assert_eq!(top.hits[1].key, b"c");
        assert_eq!((top.hits[1].count, top.hits[1].error), (3.0, 2.0));
        assert_eq!(top.error_bound, 3.0);
    }

    #[test]
    fn decays_with_time_constant_tau() {
        let mut s = Sketch::new(8, TAU, 0);
        s.add(b"k", 100.0, 0);
        let later = s.top(1, TAU);
        assert!((later.hits[0].count - 100.0 / std::f64::consts::E).abs() < 1e-9);
        // A steady rate r settles at r * tau: 10 events/s for 10 minutes.
        let mut s = Sketch::new(8, TAU, 0);
        for i in 0..6000 {
            s.add(b"k", 1.0, i * 100_000);
        }
        let c = s.top(1, 600_000_000).hits[0].count;
        assert!(
            (c - 600.0).abs() < 6.0,
            "steady 10/s reads {c}, not about 600"
        );
    }

    #[test]
    fn rescaling_keeps_counts_and_order() {
        let mut s = Sketch::new(3, 1_000, 0);
        s.add(b"a", 1.0, 0);
        s.add(b"b", 2.0, 0);
        // Far beyond RESCALE_AFTER time constants: a rescale happens here.
        let t = 100 * 1_000;
        s.add(b"c", 4.0, t);
        s.add(b"b", 1.0, t);
        let top = s.top(3, t);
        assert_eq!(top.hits[0].key, b"c");
        assert!((top.hits[0].count - 4.0).abs() < 1e-9);
        assert!(
            (top.hits[1].count - 1.0).abs() < 1e-9,
            "b's old weight decayed away"
        );
        assert!(top.total.is_finite() && (top.total - 5.0).abs() < 1e-9);
        assert_eq!(s.landmark_us, t);
    }

    #[test]
    fn time_never_goes_backwards() {
        let mut s = Sketch::new(4, TAU, 1_000_000);
        s.add(b"a", 1.0, 1_000_000);
        s.add(b"a", 1.0, 0); // a clock step back counts as the latest time
        let top = s.top(1, 0);
        assert_eq!(top.hits[0].count, 2.0);
    }

    #[test]
    fn long_keys_are_kept_truncated() {
        let mut s = Sketch::new(4, TAU, 0);
        let long = vec![b'x'; KEY_MAX + 10];
        let mut other = long.clone();
        other[KEY_MAX + 5] = b'y';
        s.add(&long, 1.0, 0);
        s.add(&other, 1.0, 0);
        let top = s.top(10, 0);
        assert_eq!(top.hits.len(), 1);
        assert_eq!(top.hits[0].key.len(), KEY_MAX);
        assert_eq!(top.hits[0].count, 2.0);
    }

    #[test]
    fn ignores_weights_that_are_not_positive() {
        let mut s = Sketch::new(4, TAU, 0);
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            s.add(b"a", w, 0);
        }
        assert!(s.top(10, 0).hits.is_empty());
    }

    #[test]
    fn memory_is_fixed_whatever_is_added() {
        let mut s = Sketch::new(256, TAU, 0);
        let before = s.memory_bytes();
        assert!(before >= 256 * KEY_MAX, "entries are preallocated");
        for i in 0..1_000_000u64 {
            s.add(format!("user:{i}").as_bytes(), 1.0, i as i64);
        }
        s.add(&vec![b'z'; 100_000], 1.0, 2_000_000);
        assert_eq!(s.memory_bytes(), before);
        assert_eq!(s.entries.capacity(), 256);
        assert_eq!(s.heap.capacity(), 256);
        assert_eq!(s.table.capacity(), 512);
    }

    #[test]
    fn finds_known_heavy_keys_among_a_million_light_ones() {
        // Heavy keys at 5%, 2% and 1% of the traffic; 1M distinct light keys
        // share the rest. Error bound: total / 256, about 0.4%.
        let mut s = Sketch::new(256, TAU, 0);
        let heavy: [(&[u8], u64); 3] = [(b"tenant:a", 20), (b"tenant:b", 50), (b"tenant:c", 100)];
        // Exact decayed weights of the heavy keys, as sum of exp(t / tau),
        // scaled by exp(-now / tau) at the end.
        let mut forward = [0f64; 3];
        for i in 0..1_000_000u64 {
            let t = i as i64; // 1 µs apart: a second in all
            s.add(format!("light:{i}").as_bytes(), 1.0, t);
            for (j, (k, every)) in heavy.iter().enumerate() {
                if i % every == 0 {
                    s.add(k, 1.0, t);
                    forward[j] += (t as f64 / TAU as f64).exp();
                }
            }
        }
        let now = 1_000_000;
        let top = s.top(3, now);
        let keys: Vec<&[u8]> = top.hits.iter().map(|h| &h.key[..]).collect();
        assert_eq!(keys, vec![&b"tenant:a"[..], b"tenant:b", b"tenant:c"]);
        assert!(top.error_bound <= top.total / 256.0);
        for (h, f) in top.hits.iter().zip(forward) {
            let exact = f * (-(now as f64) / TAU as f64).exp();
            assert!(h.count >= exact - 1e-6, "never an underestimate");
            assert!(h.count - h.error <= exact + 1e-6, "the lower bound holds");
            assert!(h.count - exact <= top.error_bound + 1e-6);
        }
    }

    #[test]
    fn clear_forgets_everything() {
        let mut s = Sketch::new(2, TAU, 0);
        s.add(b"a", 1.0, 0);
        s.add(b"b", 1.0, 0);
        s.add(b"c", 1.0, 0);
        s.clear();
        let top = s.top(10, 0);
        assert!(top.hits.is_empty());
        assert_eq!(top.total, 0.0);
        s.add(b"d", 1.0, 0);
        assert_eq!(s.top(10, 0).hits[0].key, b"d");
    }

    fn events() -> impl Strategy<Value = Vec<(Vec<u8>, f64, i64)>> {
        // Few distinct keys (so some repeat a lot) with skewed weights, at
        // increasing times spanning several time constants.
        prop::collection::vec((0u8..40, 1u32..1000, 0i64..20_000_000), 1..600).prop_map(|v| {
            let mut t = 0;
            v.into_iter()
                .map(|(k, w, dt)| {
                    t += dt;
                    let key = format!("k{}", k % 7 * (k / 7) + k / 3).into_bytes();
                    (key, f64::from(w), t)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn space_saving_bounds_hold(evs in events(), cap in 1usize..12, extra in 0i64..200_000_000) {
            let mut s = Sketch::new(cap, TAU, 0);
            for (i, (k, w, t)) in evs.iter().enumerate() {
                s.add(k, *w, *t);
                if i % 50 == 0 {
                    check(&s, &evs[..=i], *t);
                }
            }
            let now = evs.last().unwrap().2 + extra;
            check(&s, &evs, now);
        }

        #[test]
        fn index_finds_every_monitored_key(keys in prop::collection::vec(0u16..300, 1..2000), cap in 1usize..64) {
            let mut s = Sketch::new(cap, TAU, 0);
            for k in &keys {
                s.add(format!("{k}").as_bytes(), 1.0, 0);
                let n = s.entries.len();
                prop_assert_eq!(s.table.iter().filter(|&&x| x != 0).count(), n);
                for id in 0..n {
                    let e = &s.entries[id];
                    prop_assert_eq!(s.find(e.key(), e.hash).map(|x| x.1), Some(id));
                    prop_assert_eq!(s.heap[e.heap_pos as usize].id as usize, id);
                }
                for p in 1..s.heap.len() {
                    prop_assert!(s.count_at((p - 1) / 2) <= s.count_at(p), "heap order");
                }
            }
        }
    }
}
