//! Leases (`tb::lease`) and their encoding: a bucket's state with leases
//! round-trips exactly through the wire form (TB.SETSTATE, AOF) and RDB
//! version 2; arbitrary bytes after tag 3 either decode to valid leases
//! that encode back to exactly them, or are refused (after the older tag 2,
//! to valid leases or nothing), and likewise after tag 4 (a change); and
//! any sequence of grants (random ids, with or without KEEP), expiries and
//! releases keeps the invariants, and each step's change, through its wire
//! form, brings a replica to exactly the same leases:
//! leases valid, tokens never above capacity, a lease released at most
//! once, no panic.

#![no_main]

// Shared with the bucket targets, which use the rest.
#[allow(dead_code)]
mod sim;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sim::RawBucket;
use tb::codec::{rdb_v2, wire};
use tb::lease::{self, Lease, Leases, Terms, MAX_TTL_MS};

#[derive(Arbitrary, Debug)]
enum Op {
    Grant {
        n: u64,
        ttl_ms: u64,
        keep: bool,
        id: u64,
    },
    Release {
        pick: u16,
        used: Option<u64>,
    },
    Expire,
    Advance {
        us: u32,
    },
}

#[derive(Arbitrary, Debug)]
struct Input {
    state: RawBucket,
    held: Vec<(u64, u64, i64, bool)>,
    expire_at_ms: i64,
    ops: Vec<Op>,
    bytes: Vec<u8>,
}

fuzz_target!(|input: Input| {
    let leases = Leases::new(
        input
            .held
            .iter()
            .map(|&(id, n, expires_us, keep)| Lease {
                id,
                n,
                expires_us,
                keep,
            })
            .collect(),
    );
    if let Some(b) = input.state.get() {
        if leases.is_valid() {
            let at = input.expire_at_ms.max(0);
            let mut buf = Vec::new();
            wire::encode_state(&b, &leases, at, &mut buf);
            assert_eq!(wire::decode_state(&buf), Some((b, leases.clone(), at)));
            rdb_v2::encode_state(&b, &leases, &mut buf);
            assert_eq!(rdb_v2::decode_state(&buf), Some((b, leases.clone())));
            let _ = lease::key_expiry(&b, &leases);
        }
        let (mut b, mut l, mut now) = (b, Leases::default(), b.updated_us);
        // What a replica holds: every step's change applied to it.
        let mut replica = Leases::default();
        let mut released = Vec::new();
        for op in input.ops.iter().take(64) {
            match *op {
                Op::Grant {
                    n,
                    ttl_ms,
                    keep,
                    id,
                } => {
                    let n = n % (b.capacity + 1);
                    if n > 0 && b.nanos_at(now) >= n as i128 * tb::bucket::NANOS {
                        b.settle(now);
                        b.tokens -= n as i128 * tb::bucket::NANOS;
                        let terms = Terms {
                            n,
                            ttl_ms: 1 + ttl_ms % MAX_TTL_MS,
                            keep,
                        };
                        // A draw that repeats held ids before a fresh one.
                        let held: Vec<u64> = l.held.iter().map(|x| x.id).take(2).collect();
                        let mut draws = held.into_iter().chain(
                            (0u64..)
                                .map(|i| id.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))),
                        );
                        // An id drawn again after its lease was released
                        // names a new lease, which may be released once too.
                        if let Ok(id) = l.grant(terms, now, || draws.next().unwrap_or(1)) {
                            released.retain(|&x| x != id);
                        }
                    }
                }
                Op::Release { pick, used } => {
                    let id = l
                        .held
                        .get(usize::from(pick) % l.held.len().max(1))
                        .map_or(u64::from(pick), |x| x.id);
                    let used = used.map(|u| u % (1 << 53));
                    let r = lease::release(&mut b, &mut l, id, used, now);
                    if r.is_some() {
                        assert!(!released.contains(&id), "lease {id} released twice");
                        released.push(id);
                    }
                }
                Op::Expire => {
                    l.expire(&mut b, now);
                }
                Op::Advance { us } => now = now.saturating_add(i64::from(us)),
            }
            assert!(l.is_valid(), "{l:?}");
            assert!(b.tokens <= b.cap_nanos(), "{b:?}");
            // The change replicated goes through its wire form and brings
            // the replica to exactly the same leases.
            let mut buf = Vec::new();
            wire::encode_delta(&b, &l.delta(), 0, &mut buf);
            let (_, d, _) = wire::decode_delta(&buf).expect("a change decodes");
            assert_eq!(d, l.delta());
            assert!(replica.apply(&d), "{d:?} does not fit {replica:?}");
            assert_eq!(replica, l);
            l.clear_journal();
            let _ = lease::key_expiry(&b, &l);
            let _ = l.micros_until(&b, b.cap_nanos(), now);
        }
    }
    let mut bytes = input.bytes;
    bytes.insert(0, wire::TAG_LEASES);
    if let Some((b, l, at)) = wire::decode_state(&bytes) {
        assert!(b.is_valid() && l.is_valid());
        let mut buf = Vec::new();
        wire::encode_state(&b, &l, at, &mut buf);
        assert_eq!(buf, bytes, "decoding is canonical");
    }
    bytes[0] = wire::TAG_LEASES_V2;
    if let Some((b, l, _)) = wire::decode_state(&bytes) {
        assert!(b.is_valid() && l.is_valid());
    }
    bytes[0] = wire::TAG_DELTA;
    if let Some((b, d, at)) = wire::decode_delta(&bytes) {
        let mut buf = Vec::new();
        wire::encode_delta(&b, &d, at, &mut buf);
        assert_eq!(buf, bytes, "decoding a change is canonical");
    }
});
