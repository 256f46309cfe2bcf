//! The encodings of a bucket's state (`tb::codec`): every valid state
//! round-trips exactly through the packed form Redis holds (when it fits),
//! the compact wire form (TB.SETSTATE, AOF, RDB version 2) and the RDB
//! version 1 fields; and arbitrary bytes, words or fields either decode to a
//! valid state that encodes back to exactly them, or are refused, without a
//! panic or an overflow.

#![no_main]

// Shared with the bucket targets, which use the rest.
#[allow(dead_code)]
mod sim;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use sim::RawBucket;
use tb::codec::{packed, rdb_v1, rdb_v2, wire};

#[derive(Arbitrary, Debug)]
struct Input {
    state: RawBucket,
    expire_at_ms: i64,
    words: [u64; packed::WORDS],
    fields: [u64; 6],
    bytes: Vec<u8>,
}

fuzz_target!(|input: Input| {
    if let Some(b) = input.state.get() {
        if let Some(words) = packed::pack(&b) {
            assert_eq!(packed::unpack(&words), b);
            assert_eq!(packed::unpack_checked(&words), Some(b));
        }
        let at = input.expire_at_ms.max(0);
        let mut buf = [0u8; wire::MAX_LEN];
        let len = wire::encode(&b, at, &mut buf);
        assert_eq!(wire::decode(&buf[..len]), Some((b, at)));
        let mut rdb = [0u8; rdb_v2::MAX_LEN];
        let len = rdb_v2::encode(&b, &mut rdb);
        assert_eq!(rdb_v2::decode(&rdb[..len]), Some(b));
        assert_eq!(rdb_v1::decode(rdb_v1::encode(&b)), Some(b));
    }
    let _ = packed::unpack(&input.words);
    if let Some(b) = packed::unpack_checked(&input.words) {
        assert!(b.is_valid());
        assert_eq!(packed::pack(&b), Some(input.words));
    }
    if let Some(b) = rdb_v1::decode(input.fields) {
        assert!(b.is_valid());
    }
    let mut bytes = input.bytes;
    bytes.insert(0, wire::TAG);
    if let Some((b, at)) = wire::decode(&bytes) {
        assert!(b.is_valid());
        let mut buf = [0u8; wire::MAX_LEN];
        let len = wire::encode(&b, at, &mut buf);
        assert_eq!(&buf[..len], &bytes[..], "decoding is canonical");
    }
});
