//! Weighted fair share of a saturated bucket among the flows waiting on it:
//! pure, no Redis types, no clock.
//!
//! Waiters name a flow (a tenant, a priority class) and its weight. While
//! several flows wait, grants go to flows in proportion to their weights;
//! within a flow, first come first served; a flow alone gets everything
//! (work-conserving). The scheduler is start-time fair queueing over flows,
//! counted in tokens: each flow that waits is keyed by the start tag of its
//! head waiter, `S = max(V, F)`, where `V` is the virtual time (the start
//! tag of the last waiter served) and `F` the finish tag of the flow's last
//! served waiter, `F = S + cost / weight`. The next waiter is the head of the
//! flow with the smallest start tag (ties: the flow that started waiting
//! first). Choosing it, adding and removing a waiter cost `O(log flows)`.
//!
//! Bound: while flows `i` of weights `w_i` all wait with costs of at most
//! `c`, the tokens served to any two of them over any interval differ from
//! their weights' ratio by at most `c / w_i + c / w_j` in virtual time, so a
//! flow of weight `w` among flows of total weight `W` (all costs 1) is
//! served at least once in every `ceil(W / w) + 1` grants: a strict priority
//! class (weight [`MAX_WEIGHT`] over weight 1) still lets the other through
//! at least once in `MAX_WEIGHT + 2` grants.
//!
//! A flow that empties keeps its finish tag while it is ahead of `V`, so a
//! flow cannot gain by leaving and coming straight back; after that nothing
//! of it is kept.

use std::collections::{BTreeSet, HashMap, VecDeque};

/// Largest weight a flow may have (the smallest is 1).
pub const MAX_WEIGHT: u64 = 1_000_000;

/// Virtual time per token served at weight 1: a cost of `c` tokens at weight
/// `w` advances a flow's tag by `c * SCALE / w`, exact to 1 / `MAX_WEIGHT`
/// of a token.
const SCALE: u128 = MAX_WEIGHT as u128;

/// A waiter's handle, unique within its queue.
pub type WaiterId = u64;

#[derive(Debug)]
struct Waiter<W> {
    id: WaiterId,
    /// Place in its flow's line: first come first served by this number.
    order: u64,
    cost: u64,
    item: W,
}

#[derive(Debug)]
struct Flow<W> {
    name: Box<[u8]>,
    weight: u64,
    /// Finish tag of the flow's last served waiter.
    finish: u128,
    /// Start tag of the head waiter (meaningful while `waiting` is not empty).
    start: u128,
    /// When the flow last started waiting: breaks ties between equal tags.
    since: u64,
    waiting: VecDeque<Waiter<W>>,
}

/// One flow's share of the queue, for `TB.INFO` and `INFO tb`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowStat<'a> {
    /// The flow's name.
    pub name: &'a [u8],
    /// Its weight.
    pub weight: u64,
    /// Waiters it has in the queue.
    pub waiting: usize,
}

/// The waiters of one bucket, by flow.
///
/// Invariants: `order` holds `(start, since, flow)` for exactly the flows
/// with waiters; `idle` holds `(finish, flow)` for exactly the flows without
/// waiters (kept only while `finish > virtual_time`); `by_id` maps every
/// queued waiter to its flow.
#[derive(Debug)]
pub struct FairQueue<W> {
    flows: HashMap<u64, Flow<W>>,
    names: HashMap<Box<[u8]>, u64>,
    order: BTreeSet<(u128, u64, u64)>,
    idle: BTreeSet<(u128, u64)>,
    by_id: HashMap<WaiterId, u64>,
    virtual_time: u128,
    next_flow: u64,
    next_id: WaiterId,
    ticks: u64,
    len: usize,
}

impl<W> Default for FairQueue<W> {
    fn default() -> Self {
        FairQueue {
            flows: HashMap::new(),
            names: HashMap::new(),
            order: BTreeSet::new(),
            idle: BTreeSet::new(),
            by_id: HashMap::new(),
            virtual_time: 0,
            next_flow: 0,
            next_id: 1,
            ticks: 0,
            len: 0,
        }
    }
}

impl<W> FairQueue<W> {
    /// Waiters queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queues `item`, which needs `cost` tokens, at the end of `flow`, whose
    /// weight becomes `weight` (clamped to 1..=[`MAX_WEIGHT`]). Returns its id.
    pub fn push(&mut self, flow: &[u8], weight: u64, cost: u64, item: W) -> WaiterId {
        let order = self.next_id;
        self.push_in_order(flow, weight, cost, order, item)
    }

    /// Queues a waiter in `flow` at its place by `order` (first come first
    /// served within a flow by `order`, not by the time of this call: a
    /// waiter moved from another queue keeps its place in its flow's line);
    /// the flow's weight becomes `weight`.
    pub fn push_in_order(
        &mut self,
        flow: &[u8],
        weight: u64,
        cost: u64,
        order: u64,
        item: W,
    ) -> WaiterId {
        let id = self.next_id;
        self.next_id += 1;
        self.ticks += 1;
        let fid = match self.names.get(flow) {
            Some(&f) => f,
            None => {
                let f = self.next_flow;
                self.next_flow += 1;
                self.names.insert(flow.into(), f);
                self.flows.insert(
                    f,
                    Flow {
                        name: flow.into(),
                        weight: 1,
                        finish: 0,
                        start: 0,
                        since: 0,
                        waiting: VecDeque::new(),
                    },
                );
                f
            }
        };
        let v = self.virtual_time;
        let ticks = self.ticks;
        let f = self.flows.get_mut(&fid).expect("every name has its flow");
        f.weight = weight.clamp(1, MAX_WEIGHT);
        if f.waiting.is_empty() {
            self.idle.remove(&(f.finish, fid));
            f.start = f.finish.max(v);
            f.since = ticks;
            self.order.insert((f.start, f.since, fid));
        }
        let at = f.waiting.partition_point(|w| w.order <= order);
        f.waiting.insert(
            at,
            Waiter {
                id,
                order,
                cost,
                item,
            },
        );
        self.by_id.insert(id, fid);
        self.len += 1;
        id
    }

    /// The waiter to serve next and its cost, without removing it.
    pub fn peek(&self) -> Option<(WaiterId, u64, &W)> {
        let &(_, _, fid) = self.order.first()?;
        let w = self.flows[&fid].waiting.front()?;
        Some((w.id, w.cost, &w.item))
    }

    /// Removes and returns the waiter to serve next (see [`FairQueue::peek`]),
    /// advancing the virtual time to its start tag.
    pub fn pop(&mut self) -> Option<(WaiterId, W)> {
        let (start, since, fid) = self.order.pop_first()?;
        let f = self.flows.get_mut(&fid).expect("ordered flows exist");
        let w = f.waiting.pop_front().expect("ordered flows have waiters");
        self.virtual_time = start;
        f.finish = start + u128::from(w.cost) * SCALE / u128::from(f.weight);
        if f.waiting.is_empty() {
            self.idle.insert((f.finish, fid));
        } else {
            f.start = f.finish;
            self.order.insert((f.start, since, fid));
        }
        self.by_id.remove(&w.id);
        self.len -= 1;
        self.forget_idle();
        Some((w.id, w.item))
    }

    /// Removes waiter `id` wherever it is (a waiter that timed out or left);
    /// `None` if it is not queued. The flow keeps its place: the next waiter
    /// of the flow inherits the start tag of a head that left unserved.
    pub fn remove(&mut self, id: WaiterId) -> Option<W> {
        let fid = self.by_id.remove(&id)?;
        let f = self
            .flows
            .get_mut(&fid)
            .expect("queued waiters' flows exist");
        let at = f.waiting.iter().position(|w| w.id == id)?;
        let w = f.waiting.remove(at).expect("the position is in range");
        self.len -= 1;
        if f.waiting.is_empty() {
            self.order.remove(&(f.start, f.since, fid));
            self.idle.insert((f.finish, fid));
            self.forget_idle();
        }
        Some(w.item)
    }

    /// Every flow with waiters, with its weight and how many wait.
    pub fn flows(&self) -> impl Iterator<Item = FlowStat<'_>> {
        self.order.iter().map(|&(_, _, fid)| {
            let f = &self.flows[&fid];
            FlowStat {
                name: &f.name,
                weight: f.weight,
                waiting: f.waiting.len(),
            }
        })
    }

    /// Forgets the flows without waiters whose finish tag the virtual time
    /// has reached (they would start at `V` anyway), and every flow once
    /// nobody waits: then the next waiter is alone and served at once.
    fn forget_idle(&mut self) {
        if self.len == 0 {
            self.flows.clear();
            self.names.clear();
            self.idle.clear();
            self.virtual_time = 0;
            return;
        }
        while let Some(&(finish, fid)) = self.idle.first() {
            if finish > self.virtual_time {
                break;
            }
            self.idle.pop_first();
            self.drop_flow(fid);
        }
    }

    fn drop_flow(&mut self, fid: u64) {
        if let Some(f) = self.flows.remove(&fid) {
            self.names.remove(&f.name);
        }
    }

    /// Flows remembered, waiting or not (for tests of the memory bound).
    #[cfg(test)]
    fn remembered(&self) -> usize {
        self.flows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serves `n` waiters and returns the flow names served, in order.
    fn serve(q: &mut FairQueue<&'static str>, n: usize) -> Vec<&'static str> {
        (0..n).map_while(|_| q.pop().map(|(_, w)| w)).collect()
    }

    #[test]
    fn equal_weights_share_half_and_half_while_both_wait() {
        let mut q = FairQueue::default();
        for _ in 0..200 {
            q.push(b"a", 1, 1, "a");
        }
        for _ in 0..10 {
            q.push(b"b", 1, 1, "b");
        }
        let first = serve(&mut q, 20);
        assert_eq!(first.iter().filter(|&&f| f == "b").count(), 10, "{first:?}");
        // Then a is alone and gets everything.
        assert!(serve(&mut q, 190).iter().all(|&f| f == "a"));
        assert!(q.is_empty());
    }

    #[test]
    fn weights_three_to_one() {
        let mut q = FairQueue::default();
        for _ in 0..400 {
            q.push(b"a", 3, 1, "a");
            q.push(b"b", 1, 1, "b");
        }
        let served = serve(&mut q, 400);
        let a = served.iter().filter(|&&f| f == "a").count();
        assert_eq!((a, 400 - a), (300, 100));
        // Any 4 consecutive grants hold exactly one of b's.
        for w in served.chunks(4) {
            assert_eq!(w.iter().filter(|&&f| f == "b").count(), 1, "{w:?}");
        }
    }

    #[test]
    fn fairness_is_counted_in_tokens() {
        let mut q = FairQueue::default();
        for _ in 0..100 {
            q.push(b"big", 1, 4, "big");
            q.push(b"small", 1, 1, "small");
        }
        let served = serve(&mut q, 100);
        let big = served.iter().filter(|&&f| f == "big").count();
        let small = 100 - big;
        // Tokens served to each differ by at most one request's cost.
        assert!((big as i64 * 4 - small as i64).abs() <= 4, "{big} {small}");
    }

    #[test]
    fn within_a_flow_first_come_first_served() {
        let mut q = FairQueue::default();
        for i in 0..5 {
            q.push(b"a", 1, 1, ["0", "1", "2", "3", "4"][i]);
        }
        assert_eq!(serve(&mut q, 5), ["0", "1", "2", "3", "4"]);
    }

    #[test]
    fn a_newcomer_gets_no_catch_up_burst() {
        let mut q = FairQueue::default();
        for _ in 0..100 {
            q.push(b"a", 1, 1, "a");
        }
        serve(&mut q, 50);
        for _ in 0..10 {
            q.push(b"b", 1, 1, "b");
        }
        // b shares from now on: never more than one grant ahead of a.
        let served = serve(&mut q, 20);
        for w in served.chunks(2) {
            assert_eq!(w.iter().filter(|&&f| f == "b").count(), 1, "{served:?}");
        }
    }

    #[test]
    fn leaving_and_coming_back_gains_nothing() {
        let mut q = FairQueue::default();
        for _ in 0..10 {
            q.push(b"a", 1, 1, "a");
        }
        q.push(b"b", 1, 1, "b");
        assert_eq!(serve(&mut q, 2), ["a", "b"]);
        // b comes back at once: it is behind a's head, as if it had stayed.
        q.push(b"b", 1, 1, "b");
        assert_eq!(serve(&mut q, 2), ["a", "b"]);
    }

    #[test]
    fn a_strict_priority_class_still_lets_the_other_through() {
        let mut q = FairQueue::default();
        let w = 1000;
        for _ in 0..3 * w {
            q.push(b"interactive", w, 1, "i");
        }
        for _ in 0..3 {
            q.push(b"batch", 1, 1, "b");
        }
        let served = serve(&mut q, 3 * (w as usize + 1));
        // The bound: one grant in every ceil(W / w) + 1 = w + 2.
        let mut gap = 0;
        for &f in &served {
            gap = if f == "b" { 0 } else { gap + 1 };
            assert!(gap <= w as usize + 2);
        }
        assert_eq!(served.iter().filter(|&&f| f == "b").count(), 3);
    }

    #[test]
    fn removed_waiters_leave_no_trace() {
        let mut q = FairQueue::default();
        let a0 = q.push(b"a", 1, 1, "a0");
        let a1 = q.push(b"a", 1, 1, "a1");
        let b0 = q.push(b"b", 1, 1, "b0");
        assert_eq!(q.remove(a0), Some("a0"));
        assert_eq!(q.remove(a0), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.peek().map(|(id, _, _)| id), Some(a1));
        assert_eq!(q.remove(b0), Some("b0"));
        let stats: Vec<FlowStat> = q.flows().collect();
        assert_eq!(
            stats,
            [FlowStat {
                name: b"a",
                weight: 1,
                waiting: 1
            }]
        );
        assert_eq!(q.pop(), Some((a1, "a1")));
        assert!(q.is_empty() && q.peek().is_none());
    }

    #[test]
    fn idle_flows_are_forgotten_once_virtual_time_passes_them() {
        let mut q = FairQueue::default();
        for i in 0..10_000u32 {
            q.push(&i.to_be_bytes(), 1, 1, "x");
        }
        serve(&mut q, 9_999);
        // The flows served are remembered while the last one waits...
        assert_eq!(q.remembered(), 10_000);
        serve(&mut q, 1);
        // ...and forgotten once nobody waits.
        assert!(q.is_empty());
        assert_eq!(q.remembered(), 0);
        // Under load, a flow is forgotten once the virtual time passes it.
        q.push(b"long", 1, 1, "x");
        q.push(b"long", 1, 1, "x");
        q.push(b"short", 1, 1, "x");
        serve(&mut q, 2);
        assert_eq!(q.remembered(), 2);
        q.push(b"long", 1, 1, "x");
        serve(&mut q, 1);
        assert_eq!(q.remembered(), 1, "short's finish tag is behind V");
    }

    #[test]
    fn ten_thousand_flows_interleave_in_arrival_order() {
        let mut q = FairQueue::default();
        for round in 0..3 {
            for i in 0..10_000u32 {
                q.push(&i.to_be_bytes(), 1, 1, ["r0", "r1", "r2"][round]);
            }
        }
        let served = serve(&mut q, 30_000);
        // Every flow's first waiter before any flow's second.
        assert!(served[..10_000].iter().all(|&r| r == "r0"));
        assert!(served[10_000..20_000].iter().all(|&r| r == "r1"));
    }

    proptest::proptest! {
        /// Whatever the pushes, pops and removals: every waiter comes out
        /// exactly once, in its flow's order, and `len` counts the rest.
        #[test]
        fn every_waiter_comes_out_once_in_flow_order(
            ops in proptest::collection::vec((0u8..4, 0u8..5, 1u64..5, 1u64..4), 0..300)
        ) {
            let mut q = FairQueue::default();
            let mut queued: Vec<(WaiterId, u8, u32)> = Vec::new();
            let mut next_seq = [0u32; 5];
            let mut last_out = [None::<u32>; 5];
            for (op, flow, weight, cost) in ops {
                match op {
                    0 | 1 => {
                        let seq = next_seq[flow as usize];
                        next_seq[flow as usize] += 1;
                        let id = q.push(&[flow], weight, cost, (flow, seq));
                        queued.push((id, flow, seq));
                    }
                    2 => {
                        if let Some((id, (f, seq))) = q.pop() {
                            let at = queued.iter().position(|w| w.0 == id).unwrap();
                            proptest::prop_assert_eq!(queued.remove(at), (id, f, seq));
                            proptest::prop_assert!(last_out[f as usize] < Some(seq));
                            // Nothing older of the same flow is still queued.
                            proptest::prop_assert!(!queued.iter().any(|w| w.1 == f && w.2 < seq));
                            last_out[f as usize] = Some(seq);
                        } else {
                            proptest::prop_assert!(queued.is_empty());
                        }
                    }
                    _ => {
                        if !queued.is_empty() {
                            let (id, f, seq) = queued.remove(cost as usize % queued.len());
                            proptest::prop_assert_eq!(q.remove(id), Some((f, seq)));
                        }
                    }
                }
                proptest::prop_assert_eq!(q.len(), queued.len());
            }
        }
    }
}
