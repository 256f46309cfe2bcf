//! The `tb-bucket` RDB loader fed with truncated, corrupted and hand-built
//! payloads through `RESTORE`: every payload either loads as a state that
//! satisfies the bucket invariants or gets an error; the server never crashes
//! or aborts, and a failed `RESTORE ... REPLACE` leaves the old value alone.
//!
//! Payloads carry a valid DUMP footer (RDB version + CRC-64/Jones, computed
//! here and checked against the server's own DUMP output), so Redis hands
//! them to the module's loader instead of refusing them by checksum.
//!
//! Reproducible: the seed is printed; set `TB_FUZZ_SEED` to replay it, and
//! `TB_RESTORE_INPUTS` to try more payloads (default 20000).

mod common;

use common::rng::{seed, Rng};

use common::{digest, nanos, Server};
use redis::{Connection, Value};

/// CRC-64/Jones (reflected, polynomial 0xad93d23594c935a9), as Redis
/// computes the DUMP checksum.
fn crc64(data: &[u8]) -> u64 {
    let mut crc = 0u64;
    for &b in data {
        crc ^= u64::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x95ac_9329_ac4b_c9b5
            } else {
                crc >> 1
            };
        }
    }
    crc
}

/// An RDB length encoding, as module values use for each unsigned field.
fn rdb_len(v: u64) -> Vec<u8> {
    if v < 1 << 6 {
        vec![v as u8]
    } else if v < 1 << 14 {
        vec![0x40 | (v >> 8) as u8, v as u8]
    } else if v <= u64::from(u32::MAX) {
        let mut out = vec![0x80];
        out.extend((v as u32).to_be_bytes());
        out
    } else {
        let mut out = vec![0x81];
        out.extend(v.to_be_bytes());
        out
    }
}

/// Module value opcodes (rdb.h).
const OP_EOF: u8 = 0;
const OP_UINT: u8 = 2;
const OP_STRING: u8 = 5;

/// What a real DUMP of a bucket looks like, split into its parts.
struct Template {
    /// Object type byte and module id (type name + encoding version).
    header: Vec<u8>,
    /// The same with encoding version 1 (six integers), which still loads.
    header_v1: Vec<u8>,
    /// The RDB version of the footer.
    version: [u8; 2],
}

impl Template {
    /// `body` with the footer: RDB version and CRC of everything before.
    fn seal(&self, body: &[u8]) -> Vec<u8> {
        let mut out = body.to_vec();
        out.extend(self.version);
        out.extend(crc64(&out).to_le_bytes());
        out
    }

    /// A version 2 payload holding this string (the compact state).
    fn string(&self, s: &[u8]) -> Vec<u8> {
        let mut body = self.header.clone();
        body.push(OP_STRING);
        body.extend(rdb_len(s.len() as u64));
        body.extend(s);
        body.push(OP_EOF);
        self.seal(&body)
    }

    /// A payload holding exactly these six fields (`tokens` split in two
    /// 64-bit halves, as version 1 saves it).
    fn fields(&self, header: &[u8], f: &[u64]) -> Vec<u8> {
        let mut body = header.to_vec();
        for &v in f {
            body.push(OP_UINT);
            body.extend(rdb_len(v));
        }
        body.push(OP_EOF);
        self.seal(&body)
    }
}

fn dump(c: &mut Connection, key: &str) -> Vec<u8> {
    redis::cmd("DUMP").arg(key).query(c).unwrap()
}

/// RESTORE with REPLACE; the error text if refused.
fn restore(c: &mut Connection, key: &str, payload: &[u8]) -> Result<(), String> {
    redis::cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .arg("REPLACE")
        .query::<()>(c)
        .map_err(|e| e.to_string())
}

/// The invariants of a bucket that RESTORE accepted, checked through the
/// commands that read it; returns its capacity and rate as TB.INFO shows them.
fn check_loaded(c: &mut Connection, key: &str) -> Option<(i64, String)> {
    let kind: String = redis::cmd("TYPE").arg(key).query(c).unwrap();
    if kind != "tb-bucket" {
        // A corrupted type byte can make a valid value of another type.
        return None;
    }
    let info: Vec<Value> = redis::cmd("TB.INFO").arg(key).query(c).unwrap();
    let text = |v: &Value| -> String { redis::from_redis_value(v).unwrap() };
    let tokens = nanos(&text(&info[1]));
    let capacity: i64 = redis::from_redis_value(&info[3]).unwrap();
    assert!((0..=1 << 53).contains(&capacity), "capacity {capacity}");
    assert!(
        tokens <= i128::from(capacity) * 1_000_000_000,
        "tokens {tokens} > capacity {capacity}"
    );
    assert!(tokens > -(1i128 << 100), "tokens {tokens}");
    let rate = text(&info[5]);
    assert!(
        rate.bytes().all(|b| b.is_ascii_digit() || b == b'.'),
        "rate {rate:?}"
    );
    let reset: i64 = redis::from_redis_value(&info[9]).unwrap();
    assert!(reset >= -1);
    // Every other reader and writer copes with it too.
    digest(c, key);
    let _: i64 = redis::cmd("MEMORY").arg("USAGE").arg(key).query(c).unwrap();
    let copy = dump(c, key);
    restore(c, "copy", &copy).expect("a loaded bucket dumps and restores again");
    let peek: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg(key)
        .arg(1)
        .arg(1)
        .arg(0)
        .query(c)
        .unwrap();
    assert_eq!(peek.len(), 5);
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("copy")
        .arg(1000)
        .arg(10)
        .query(c)
        .unwrap();
    assert_eq!(r.len(), 5);
    let _: Value = redis::cmd("TB.REFUND").arg("copy").arg(3).query(c).unwrap();
    Some((capacity, rate))
}

/// Whether the module must accept these six saved fields: the rules of
/// `Bucket::is_valid` after `Rate::new` reduces the fraction.
fn valid_state(f: &[u64; 6]) -> bool {
    let tokens = ((u128::from(f[1]) << 64) | u128::from(f[0])) as i128;
    let (num, den, cap) = (u128::from(f[3]), u128::from(f[4]), f[5]);
    if den == 0 {
        return false;
    }
    let g = if num == 0 { den } else { gcd(num, den) };
    let (num, den) = (num / g, den / g);
    num <= 1 << 53
        && den <= 1 << 40
        && cap <= 1 << 53
        && tokens <= i128::from(cap) * 1_000_000_000
        && tokens > -(1i128 << 100)
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The compact state (docs/commands/tb.setstate.md) of six version 1 fields that
/// make a valid state, with the rate reduced: the tag byte 1, then LEB128
/// varints of zigzag(tokens), zigzag(updated_us), numerator, denominator,
/// capacity, and `expiry` (0: none).
fn compact_state(f: &[u64; 6], expiry: u64) -> Vec<u8> {
    let zigzag = |v: i128| ((v << 1) ^ (v >> 127)) as u128;
    let tokens = ((u128::from(f[1]) << 64) | u128::from(f[0])) as i128;
    let (num, den) = (u128::from(f[3]), u128::from(f[4]));
    let g = if num == 0 { den } else { gcd(num, den) };
    let mut out = vec![1u8];
    for mut v in [
        zigzag(tokens),
        zigzag(i128::from(f[2] as i64)),
        num / g,
        den / g,
        u128::from(f[5]),
        u128::from(expiry),
    ] {
        while v >= 0x80 {
            out.push(v as u8 | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    out
}

/// Six fields around the interesting boundaries.
fn random_fields(rng: &mut Rng) -> [u64; 6] {
    let tokens: i128 = match rng.below(5) {
        0 => i128::from(rng.any() as i64),
        1 => -(i128::from(rng.any())),
        2 => i128::from(rng.below(1 << 53)) * 1_000_000_000,
        3 => -(1i128 << 100) + i128::from(rng.below(3)),
        _ => ((u128::from(rng.next()) << 64) | u128::from(rng.next())) as i128,
    };
    let pick = |rng: &mut Rng, edge: u64| match rng.below(4) {
        0 => edge,
        1 => edge + 1,
        2 => rng.below(edge + 2),
        _ => rng.any(),
    };
    let t = tokens as u128;
    [
        t as u64,
        (t >> 64) as u64,
        rng.any(),
        pick(rng, 1 << 53),
        pick(rng, 1 << 40),
        pick(rng, 1 << 53),
    ]
}

#[test]
fn restore_never_crashes_on_corrupt_payloads() {
    let seed = seed();
    let budget: usize = std::env::var("TB_RESTORE_INPUTS")
        .map(|v| v.parse().expect("TB_RESTORE_INPUTS is a count"))
        .unwrap_or(20_000);
    println!("restore_fuzz: seed {seed} (replay with TB_FUZZ_SEED={seed})");
    let mut rng = Rng(seed);
    let s = Server::start();
    let mut c = s.conn();

    // Real payloads of varied states: full-ish, in debt, fixed budget, huge.
    let setups: [&[&str]; 5] = [
        &["TB.CONSUME", "a", "1/d", "5", "3"],
        &["TB.CONSUME", "b", "1000", "100", "100", "RESERVE", "50"],
        &["TB.CONSUME", "c", "0", "9007199254740992", "7"],
        &[
            "TB.CONSUME",
            "d",
            "9e15",
            "9007199254740992",
            "9007199254740992",
        ],
        &["TB.CONSUME", "e", "1e-12", "1", "1"],
    ];
    let mut payloads = Vec::new();
    for cmd in setups {
        let mut r = redis::cmd(cmd[0]);
        for a in &cmd[1..] {
            r.arg(*a);
        }
        let _: Vec<i64> = r.query(&mut c).unwrap();
        let key = cmd[1];
        let p = dump(&mut c, key);
        assert!(p.len() > 12, "{key} holds a bucket to dump");
        payloads.push(p);
    }
    let first = &payloads[0];
    assert_eq!(first[0], 7, "module values are RDB type 7 (module, v2)");
    let with_version = |encver: u64| {
        let mut header = first[..10].to_vec();
        let id = u64::from_be_bytes(header[2..10].try_into().unwrap());
        header[2..10].copy_from_slice(&((id & !1023) | encver).to_be_bytes());
        header
    };
    assert_eq!(
        with_version(3),
        first[..10],
        "buckets are saved in version 3"
    );
    let template = Template {
        header: first[..10].to_vec(),
        header_v1: with_version(1),
        version: [first[first.len() - 10], first[first.len() - 9]],
    };
    for p in &payloads {
        assert_eq!(&p[..10], &template.header[..], "same type and id");
        let (body, crc) = p.split_at(p.len() - 8);
        assert_eq!(
            crc64(body).to_le_bytes(),
            crc,
            "our CRC-64 agrees with the server's"
        );
        assert_eq!(template.seal(&body[..body.len() - 2]), *p);
    }

    // The value a failed RESTORE ... REPLACE must leave alone.
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("victim")
        .arg("1/d")
        .arg(9)
        .arg(4)
        .query(&mut c)
        .unwrap();
    let victim = digest(&mut c, "victim");

    let victim_dump = dump(&mut c, "victim");
    let (mut tried, mut accepted, mut refused) = (0usize, 0usize, 0usize);
    let mut try_payload = |c: &mut Connection, payload: &[u8], expect: Option<bool>| {
        tried += 1;
        let key = if tried % 7 == 0 { "victim" } else { "x" };
        match restore(c, key, payload) {
            Ok(()) => {
                accepted += 1;
                assert_ne!(
                    expect,
                    Some(false),
                    "an invalid state was loaded: {payload:?}"
                );
                check_loaded(c, key);
                if key == "victim" {
                    // Put the original back (with an expiry, as it had one:
                    // the digest covers whether a key expires).
                    let _: () = redis::cmd("RESTORE")
                        .arg("victim")
                        .arg(86_400_000)
                        .arg(&victim_dump)
                        .arg("REPLACE")
                        .query(c)
                        .unwrap();
                }
            }
            Err(e) => {
                refused += 1;
                assert_ne!(
                    expect,
                    Some(true),
                    "a valid state was refused ({e}): {payload:?}"
                );
                assert!(
                    e.contains("Bad data format") || e.contains("payload version or checksum"),
                    "unexpected error {e}"
                );
            }
        }
        if tried % 100 == 0 {
            let pong: String = redis::cmd("PING").query(c).unwrap();
            assert_eq!(pong, "PONG");
        }
    };

    // 1. Every truncation of every real payload (footer recomputed). Redis
    // reads the value on into the footer, so a cut near the end can decode
    // the footer's bytes as the last fields: any outcome, never a crash.
    for p in &payloads {
        let body = &p[..p.len() - 10];
        for len in 0..body.len() {
            try_payload(&mut c, &template.seal(&body[..len]), None);
        }
    }
    // The failed RESTOREs into "victim" did not touch it.
    let now = digest(&mut c, "victim");
    assert_eq!(now, victim, "a refused RESTORE REPLACE kept the old value");

    // 2. Hand-built states around every validity boundary, in version 1
    // (six integers) and version 2 (the compact state as one string).
    for _ in 0..budget / 3 {
        let f = random_fields(&mut rng);
        try_payload(
            &mut c,
            &template.fields(&template.header_v1, &f),
            Some(valid_state(&f)),
        );
        if valid_state(&f) {
            let state = compact_state(&f, 0);
            try_payload(&mut c, &template.string(&state), Some(true));
            // With an expiry, or one byte less or more: never a bucket.
            let expiring = compact_state(&f, 1 + rng.below(1 << 40));
            try_payload(&mut c, &template.string(&expiring), Some(false));
            try_payload(
                &mut c,
                &template.string(&state[..state.len() - 1]),
                Some(false),
            );
            let mut longer = state.clone();
            longer.push(rng.next() as u8);
            try_payload(&mut c, &template.string(&longer), Some(false));
        }
    }
    // 3. Structural damage: wrong opcodes, missing or extra fields, another
    // encoding version, a bad checksum (version 1 layouts).
    for i in 0..budget / 6 {
        let f = random_fields(&mut rng);
        let mut body = template.header_v1.clone();
        let n = [5usize, 6, 7][i % 3];
        for k in 0..n {
            if rng.below(8) == 0 {
                body.push(OP_STRING);
                body.extend(rdb_len(3));
                body.extend(b"abc");
            } else {
                body.push(OP_UINT);
                body.extend(rdb_len(f.get(k).copied().unwrap_or_else(|| rng.any())));
            }
        }
        body.push(OP_EOF);
        let mut payload = template.seal(&body);
        let expect = match i % 4 {
            // Another encoding version in the module id's low 10 bits.
            0 => {
                let encver = rng.below(1024);
                let mut header = template.header.clone();
                let id = u64::from_be_bytes(header[2..10].try_into().unwrap());
                header[2..10].copy_from_slice(&((id & !1023) | encver).to_be_bytes());
                payload = template.seal(&[&header[..], &body[10..]].concat());
                (encver != 1 || n != 6).then_some(false)
            }
            // A checksum off by one bit.
            1 => {
                let last = payload.len() - 1;
                payload[last] ^= 1;
                Some(false)
            }
            _ => (n != 6).then_some(false),
        };
        try_payload(&mut c, &payload, expect);
    }
    // 4. Random byte damage to real payloads (any outcome, never a crash).
    for _ in 0..budget / 3 {
        let p = &payloads[rng.below(payloads.len() as u64) as usize];
        let mut body = p[..p.len() - 10].to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(body.len() as u64) as usize;
            match rng.below(3) {
                0 => body[at] = rng.next() as u8,
                1 => body[at] ^= 1 << rng.below(8),
                _ => body.insert(at, rng.next() as u8),
            }
        }
        try_payload(&mut c, &template.seal(&body), None);
    }
    // 5. Garbage after a valid header.
    for _ in 0..budget / 6 {
        let mut body = template.header.clone();
        for _ in 0..rng.below(80) {
            body.push(rng.next() as u8);
        }
        try_payload(&mut c, &template.seal(&body), None);
    }

    let pong: String = redis::cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    let log = s.log();
    for bad in ["panic", "ASSERTION", "crashed", "Guru Meditation"] {
        assert!(!log.contains(bad), "the log mentions {bad:?}:\n{log}");
    }
    assert!(
        log.contains("tb: rejected a corrupt or truncated tb-bucket value"),
        "the module logged its rejections"
    );
    println!(
        "restore_fuzz: {tried} payloads tried ({accepted} loaded, {refused} refused), crashes found: 0"
    );
    assert!(accepted > 0 && refused > 0, "both outcomes were exercised");
}

#[test]
fn a_value_from_a_newer_tb_says_so() {
    let s = Server::start();
    let mut c = s.conn();
    let _: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("k")
        .arg(1)
        .arg(5)
        .query(&mut c)
        .unwrap();
    let p = dump(&mut c, "k");
    let id = u64::from_be_bytes(p[2..10].try_into().unwrap());
    let newer = (id & 1023) + 1;
    let mut body = p[..p.len() - 10].to_vec();
    body[2..10].copy_from_slice(&((id & !1023) | newer).to_be_bytes());
    let template = Template {
        header: body[..10].to_vec(),
        header_v1: Vec::new(),
        version: [p[p.len() - 10], p[p.len() - 9]],
    };
    let err = restore(&mut c, "k", &template.seal(&body)).expect_err("a newer encoding is refused");
    assert!(err.contains("Bad data format"), "{err}");
    let log = s.log();
    assert!(
        log.contains(&format!(
            "written by a newer tb (encoding version {newer}; this build reads 1 to {})",
            newer - 1
        )),
        "the log names the newer version:\n{log}"
    );
    assert!(!log.contains("corrupt or truncated"), "{log}");
}
