//! Noisy neighbours: what one tenant can do to the server with the limiter
//! commands on its own keys. Each test pins one way a tenant could hurt the
//! others (the figures under load are `make bench`'s, BENCHMARKS.md).

mod common;

use common::{commandstats, err, Server};

/// Server time spent in TB.MCONSUME so far, in µs (`INFO commandstats`).
fn mconsume_usec(c: &mut redis::Connection) -> u64 {
    let stats = commandstats(c);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_tb.mconsume:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .map_or(0, |v| v.parse().unwrap())
}

/// `TB.MCONSUME` over `keys` (rate 1, capacity 1, n 1 each).
fn mconsume_args(keys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut args = vec![b"TB.MCONSUME".to_vec(), keys.len().to_string().into_bytes()];
    args.extend(keys.iter().cloned());
    for _ in keys {
        args.extend([b"1".to_vec(), b"1".to_vec(), b"1".to_vec()]);
    }
    args
}

#[test]
fn mconsume_checks_for_duplicate_keys_in_linear_time() {
    // 1,000 keys of 16 KB, the last two equal, so that a check comparing
    // pairs runs through all of them. Comparing every pair of keys that share a 16 KB
    // prefix reads 8 GB; keys that differ in their first byte are told apart
    // at once. In linear time both cost the same.
    const KEYS: usize = 1000;
    const LEN: usize = 16 << 10;
    let s = Server::start();
    let mut c = s.conn();
    let key = |i: usize, shared_prefix: bool| -> Vec<u8> {
        let tag = format!("{i:05}").into_bytes();
        let mut k = vec![b'p'; LEN - tag.len()];
        if shared_prefix {
            k.extend(tag);
        } else {
            let mut t = tag;
            t.extend(k);
            k = t;
        }
        k
    };
    let mut time = |shared_prefix: bool| -> u64 {
        let mut keys: Vec<Vec<u8>> = (0..KEYS - 1).map(|i| key(i, shared_prefix)).collect();
        keys.push(keys[KEYS - 2].clone());
        let before = mconsume_usec(&mut c);
        let e = err(&mut c, &mconsume_args(&keys));
        assert_eq!(e, "ERR a key appears twice in TB.MCONSUME");
        mconsume_usec(&mut c) - before
    };
    let (mut shared, mut distinct) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        shared.push(time(true));
        distinct.push(time(false));
    }
    let (shared, distinct) = (shared.iter().min().unwrap(), distinct.iter().min().unwrap());
    println!("duplicate check of {KEYS} keys of {LEN} bytes: shared prefix {shared} µs, distinct {distinct} µs");
    assert!(
        *shared <= 3 * distinct + 2_000,
        "keys sharing a prefix take {shared} µs, distinct ones {distinct} µs: not linear"
    );
}
