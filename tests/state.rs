//! The stored value: 32 bytes for every realistic bucket, a wide form for
//! the extremes, chosen at each write; RDB encoding version 2, while values
//! saved by version 1 still load. (Memory per bucket against the Lua
//! script's hash is measured by `make bench` over a million keys: both take
//! a 48-byte allocation per value, and on Redis 8 the table resizes that
//! `serverCron` schedules move `used_memory` by more than the difference
//! over fewer keys.)

mod common;

use common::Server;
use redis::Connection;

/// `DUMP`s made by the module at encoding version 1 (commit 741e0d4, Redis
/// 7.0.15, so RDB version 10, which every later server restores), with the
/// `DEBUG DIGEST-VALUE` that server gave each key. Made with, in order:
/// `TB.SETSTATE v1:refill 2500000000 1795300000123456 5 3 10 0`,
/// `TB.SETSTATE v1:debt -7000000003 1795300000000000 1 86400 100 0`,
/// `TB.SETSTATE v1:fixed 7000000000 1795300000000000 0 1 9007199254740992 0`,
/// `TB.SETSTATE v1:huge -1267650600228229401496703205375
/// -9223372036854775808 9007199254740991 1099511627775 9007199254740992 0`.
const VERSION_1_DUMPS: [(&str, &str, &str); 4] = [
    (
        "v1:refill",
        "0781b5bf9bb9c91eb40102809502f90002000281000660d0dac5ca4002050203020a000a00f899d9074eafc2d6",
        "1e046d77defbc5c410f9b8fb0f79eb9f21103ea8",
    ),
    (
        "v1:debt",
        "0781b5bf9bb9c91eb4010281fffffffe5ec479fd0281ffffffffffffffff0281000660d0dac3e800020102\
         8000015180024064000a00fe2369939faa9be2",
        "b358832c597ea42dd901fc75ffde8e04cb36fed8",
    ),
    (
        "v1:fixed",
        "0781b5bf9bb9c91eb401028100000001a13b860002000281000660d0dac3e800020002010281002000000\
         0000000000a005892b0e2a980a7bd",
        "7e212f20860d07df4d10014b7989f2b1853fe935",
    ),
    (
        "v1:huge",
        "0781b5bf9bb9c91eb40102010281fffffff000000000028180000000000000000281001fffffffffffff02\
         81000000ffffffffff02810020000000000000000a00410acb5b1614b703",
        "6ad603de2e48de949e13d997d9e4aa2fe3a035f1",
    ),
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn digest(c: &mut Connection, key: &str) -> String {
    redis::cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query::<Vec<String>>(c)
        .unwrap()
        .remove(0)
}

fn memory(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("MEMORY").arg("USAGE").arg(key).query(c).unwrap()
}

/// TB.SETSTATE with an expiry in 2100, so that every state compared has one
/// (on Redis 8 a key's expiry is part of its object, and of MEMORY USAGE).
fn setstate(c: &mut Connection, key: &str, state: &[&str]) {
    let _: () = redis::cmd("TB.SETSTATE")
        .arg(key)
        .arg(state)
        .arg(4_102_444_800_000i64)
        .query(c)
        .unwrap();
}

#[test]
fn a_dump_from_encoding_version_1_still_restores() {
    let s = Server::start();
    let mut c = s.conn();
    for (key, dump, want) in VERSION_1_DUMPS {
        let _: () = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(hex(dump))
            .query(&mut c)
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(digest(&mut c, key), want, "{key} is the same bucket");
        // It works with every command, and saves again in version 2.
        let peek: Vec<i64> = redis::cmd("TB.CONSUME")
            .arg(key)
            .arg(1)
            .arg(5)
            .arg(0)
            .query(&mut c)
            .unwrap();
        assert_eq!(peek.len(), 5);
        let again: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut c).unwrap();
        assert_ne!(again, hex(dump), "{key} dumps in version 2");
        let _: () = redis::cmd("RESTORE")
            .arg(format!("{key}:again"))
            .arg(0)
            .arg(&again)
            .query(&mut c)
            .unwrap();
        assert_eq!(digest(&mut c, &format!("{key}:again")), want);
    }
    // Every form survives a reload from an RDB file (version 2).
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    for (key, _, want) in VERSION_1_DUMPS {
        assert_eq!(digest(&mut c, key), want, "{key} after DEBUG RELOAD");
    }
}

/// A write that no longer fits 32 bytes moves the value to the wide form,
/// and back when it fits again; both forms behave the same everywhere.
#[test]
fn values_move_between_the_packed_and_the_wide_form() {
    let s = Server::start();
    let mut c = s.conn();
    setstate(&mut c, "k", &["0", "1795300000000000", "1", "1", "10"]);
    let packed = memory(&mut c, "k");
    // A stored time before 1970 needs the wide form: a tag word and the
    // 48-byte bucket (16-byte aligned), 64 bytes, where the packed form is 32.
    setstate(&mut c, "k", &["0", "-5", "1", "1", "10"]);
    let wide = memory(&mut c, "k");
    assert_eq!(wide - packed, 32, "{wide} {packed}");
    let wide_digest = digest(&mut c, "k");
    let _: () = redis::cmd("COPY").arg("k").arg("k2").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "k2"), wide_digest);
    let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c, "k"), wide_digest);
    assert_eq!(memory(&mut c, "k"), wide);
    // A consume writes the state back at the current time: packed again.
    let r: Vec<i64> = redis::cmd("TB.CONSUME")
        .arg("k")
        .arg(1)
        .arg(10)
        .arg(1)
        .query(&mut c)
        .unwrap();
    assert_eq!(r[..3], [1, 9, 0]);
    assert_eq!(memory(&mut c, "k"), packed);
    // The deepest debt at the largest rate and capacity: wide, exact.
    let deep = [
        "-1267650600228229401496703205375",
        "1795300000000000",
        "9007199254740991",
        "1099511627775",
        "9007199254740992",
    ];
    setstate(&mut c, "k", &deep);
    assert_eq!(memory(&mut c, "k"), wide);
    let d = digest(&mut c, "k");
    let dump: Vec<u8> = redis::cmd("DUMP").arg("k").query(&mut c).unwrap();
    let _: () = redis::cmd("RESTORE")
        .arg("k3")
        .arg(4_102_444_800_000i64)
        .arg(dump)
        .arg("ABSTTL")
        .query(&mut c)
        .unwrap();
    assert_eq!(digest(&mut c, "k3"), d, "the digest covers the expiry too");
}
