//! ACL: users restricted by key pattern cannot read or change other tenants'
//! buckets through any TB.* command (alone, in MULTI, in scripts), read-only
//! key permissions allow no writes, the internal TB.SETSTATE can
//! be denied to every user without breaking replication or AOF loading, and
//! the least-privilege line documented in docs/security.md ("ACL") works as stated.

mod common;

use std::time::Duration;

use common::{
    aof_rewrite_done, call, commandstats, digest, replica_of, server_has_api, setuser, state,
    sync_replica, Server, ServerConfig,
};
use redis::{Connection, Value};

/// The least-privilege ACL rule for an application that only rate-limits
/// (docs/security.md, "ACL"): the limiter commands on `rl:*` keys, nothing else.
const LEAST_PRIVILEGE: &str = "on >s3cret resetkeys ~rl:* resetchannels -@all \
     +tb.consume +tb.mconsume +tb.refund +tb.info +cl.throttle";

fn assert_noperm(c: &mut Connection, args: &[&str]) {
    match call(c, args) {
        Err(e) => assert_eq!(e.code(), Some("NOPERM"), "{args:?}: {e}"),
        Ok(v) => panic!("{args:?} was allowed: {v:?}"),
    }
}

fn assert_allowed(c: &mut Connection, args: &[&str]) -> Value {
    call(c, args).unwrap_or_else(|e| panic!("{args:?} was refused: {e}"))
}

/// Every way a TB.* command can name `key` of another tenant.
fn attacks(key: &'static str) -> Vec<Vec<&'static str>> {
    vec![
        vec!["TB.CONSUME", key, "10", "5"],
        vec!["TB.CONSUME", key, "10", "5", "0"],
        vec!["TB.CONSUME", key, "10", "5", "1", "RESERVE", "1000"],
        vec!["TB.CONSUME", key, "10", "5", "1", "BLOCK", "10"],
        vec!["TB.INFO", key],
        vec!["TB.REFUND", key, "5"],
        vec!["CL.THROTTLE", key, "4", "10", "1"],
        vec!["TB.MCONSUME", "1", key, "10", "5", "1"],
        vec![
            "TB.MCONSUME",
            "2",
            "tenant:a:1",
            key,
            "10",
            "5",
            "1",
            "10",
            "5",
            "1",
        ],
        vec!["TB.SETSTATE", key, "0", "0", "1", "1", "5", "0"],
    ]
}

#[test]
fn tenants_cannot_touch_each_others_buckets() {
    let s = Server::start();
    let mut admin = s.conn();
    let tools = "+tb.consume +tb.mconsume +tb.refund +tb.info +cl.throttle \
                 +tb.setstate +eval +multi +exec +discard +ping";
    setuser(
        &mut admin,
        "alice",
        &format!("on >pa resetkeys ~tenant:a:* resetchannels -@all {tools}"),
    );
    // carol may read tenant b's buckets but not change them.
    setuser(
        &mut admin,
        "carol",
        &format!("on >pc resetkeys ~tenant:c:* %R~tenant:b:* resetchannels -@all {tools}"),
    );
    assert_allowed(&mut admin, &["TB.CONSUME", "tenant:b:x", "1/d", "5", "2"]);
    let before = digest(&mut admin, "tenant:b:x");

    let mut alice = s.login("alice", "pa");
    for a in attacks("tenant:b:x") {
        assert_noperm(&mut alice, &a);
    }
    // A key named only inside a script is checked when the script calls it.
    let e = call(
        &mut alice,
        &[
            "EVAL",
            "return redis.call('TB.CONSUME', 'tenant:b:x', '10', '5')",
            "0",
        ],
    )
    .unwrap_err();
    // (7.0: "can't access at least one of the keys", 8.2: "No permissions to
    // access a key".)
    assert!(e.to_string().contains("access"), "{e}");
    // A key declared to the script is checked before it runs.
    assert_noperm(
        &mut alice,
        &[
            "EVAL",
            "return redis.call('TB.CONSUME', KEYS[1], '10', '5')",
            "1",
            "tenant:b:x",
        ],
    );
    // In MULTI the command is refused when queued and EXEC aborts.
    let _: () = redis::cmd("MULTI").query(&mut alice).unwrap();
    assert_noperm(&mut alice, &["TB.CONSUME", "tenant:b:x", "10", "5"]);
    let e = call(&mut alice, &["EXEC"]).unwrap_err();
    assert_eq!(e.code(), Some("EXECABORT"), "{e}");
    // numkeys cannot smuggle a key past the check: a foreign name in a
    // non-key position is an argument, and the command fails.
    let r = call(
        &mut alice,
        &["TB.MCONSUME", "1", "tenant:a:1", "tenant:b:x", "5", "1"],
    );
    assert!(r.is_err(), "{r:?}");

    // carol may only read tenant b's keys: every change is refused, and
    // TB.INFO, which only reads, is allowed.
    let mut carol = s.login("carol", "pc");
    for a in attacks("tenant:b:x") {
        if a[0] == "TB.INFO" {
            assert_allowed(&mut carol, &a);
        } else {
            assert_noperm(&mut carol, &a);
        }
    }
    assert_eq!(
        digest(&mut admin, "tenant:b:x"),
        before,
        "tenant b's bucket is unchanged"
    );

    // Each tenant still uses its own buckets.
    let r: Vec<i64> = redis::from_redis_value(&assert_allowed(
        &mut alice,
        &["TB.CONSUME", "tenant:a:1", "10", "5"],
    ))
    .unwrap();
    assert_eq!(r[..2], [1, 4]);
    assert_allowed(
        &mut alice,
        &[
            "TB.MCONSUME",
            "2",
            "tenant:a:1",
            "tenant:a:2",
            "10",
            "5",
            "1",
            "10",
            "5",
            "1",
        ],
    );
    assert_allowed(&mut alice, &["CL.THROTTLE", "tenant:a:3", "4", "10", "1"]);
    assert_allowed(&mut carol, &["TB.CONSUME", "tenant:c:1", "10", "5"]);
    let log: Vec<Value> = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    assert!(!log.is_empty(), "the refusals are in ACL LOG");
}

#[test]
fn key_permissions_follow_what_each_command_does_with_the_key() {
    let s = Server::start();
    let mut admin = s.conn();
    for key in ["ro:x", "wo:x"] {
        assert_allowed(&mut admin, &["TB.CONSUME", key, "0", "5", "2"]);
    }
    let cmds = "+tb.consume +tb.mconsume +tb.refund +tb.info +cl.throttle +tb.setstate";
    setuser(
        &mut admin,
        "reader",
        &format!("on >pr resetkeys %R~ro:* resetchannels -@all {cmds}"),
    );
    setuser(
        &mut admin,
        "writer",
        &format!("on >pw resetkeys %W~wo:* resetchannels -@all {cmds}"),
    );
    // A read-only key pattern runs the one command that only reads...
    let mut reader = s.login("reader", "pr");
    let v = assert_allowed(&mut reader, &["TB.INFO", "ro:x"]);
    assert_eq!(
        common::fields(redis::from_redis_value(&v).unwrap())["tokens"],
        "3"
    );
    // ...and none that writes.
    for a in attacks("ro:x") {
        if a[0] != "TB.INFO" {
            assert_noperm(&mut reader, &a);
        }
    }
    // A write-only pattern may overwrite a bucket with TB.SETSTATE, which
    // reads nothing, but run nothing that reads the bucket: every other
    // command replies with what the bucket holds.
    let mut writer = s.login("writer", "pw");
    for a in attacks("wo:x") {
        if a[0] == "TB.SETSTATE" {
            assert_allowed(&mut writer, &a);
        } else {
            assert_noperm(&mut writer, &a);
        }
    }
}

#[test]
fn the_least_privilege_line_allows_exactly_the_limiter() {
    let s = Server::start();
    let mut admin = s.conn();
    setuser(&mut admin, "limiter", LEAST_PRIVILEGE);
    let mut app = s.login("limiter", "s3cret");
    for ok in [
        &["TB.CONSUME", "rl:user:1", "10", "5"][..],
        &["TB.CONSUME", "rl:user:1", "10", "5", "1", "RESERVE", "500"],
        &["TB.CONSUME", "rl:user:1", "10", "5", "1", "BLOCK", "500"],
        &[
            "TB.MCONSUME",
            "2",
            "rl:{t}:rpm",
            "rl:{t}:tpm",
            "1",
            "9",
            "1",
            "100",
            "999",
            "50",
        ],
        &["TB.REFUND", "rl:{t}:tpm", "20"],
        &["TB.INFO", "rl:user:1"],
        &["CL.THROTTLE", "rl:cell", "4", "10", "60"],
    ] {
        assert_allowed(&mut app, ok);
    }
    for denied in [
        &["TB.CONSUME", "other:1", "10", "5"][..],
        &["TB.INFO", "other:1"],
        &["TB.SETSTATE", "rl:user:1", "0", "0", "1", "1", "5", "0"],
        &["TB.CONFIG", "SET", "max-wait-ms", "1"],
        &["TB.CONFIG", "GET", "*"],
        &["GET", "rl:user:1"],
        &["DEL", "rl:user:1"],
        &["RESTORE", "rl:x", "0", "x"],
        &["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"],
        &["FLUSHALL"],
        &["EVAL", "return 1", "0"],
        &["SUBSCRIBE", "x"],
    ] {
        assert_noperm(&mut app, denied);
    }
}

#[test]
fn acl_categories_cover_the_internal_command_from_redis_7_2() {
    let s = Server::start();
    let mut admin = s.conn();
    setuser(&mut admin, "app", "on >pw ~* &* +@all -@dangerous");
    let mut app = s.login("app", "pw");
    assert_allowed(&mut app, &["TB.CONSUME", "k", "10", "5"]);
    let setstate = ["TB.SETSTATE", "k", "0", "0", "1", "1", "5", "0"];
    if server_has_api("SetCommandACLCategories") {
        // TB.SETSTATE and TB.CONFIG are in @dangerous.
        assert_noperm(&mut app, &setstate);
        assert_noperm(&mut app, &["TB.CONFIG", "GET", "*"]);
    } else {
        // Redis 7.0 has no ACL categories for module commands: a category
        // rule does not reach them, which is why the documented line names
        // commands one by one.
        assert_allowed(&mut app, &setstate);
    }
}

/// A server whose every user (default included) is denied TB.SETSTATE,
/// from its configuration, with the given extra arguments.
fn setstate_denied(extra: &[&str]) -> ServerConfig {
    let mut args: Vec<String> = [
        "--user",
        "default",
        "on",
        "nopass",
        "~*",
        "&*",
        "+@all",
        "-tb.setstate",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    args.extend(extra.iter().map(|a| a.to_string()));
    ServerConfig {
        args,
        ..ServerConfig::default()
    }
}

#[test]
fn denying_setstate_breaks_neither_replication_nor_aof() {
    let aof = [
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        "no",
    ];
    let mut m = Server::start_with(setstate_denied(&aof));
    let r = replica_of(&m, setstate_denied(&[]));
    let mut mc = m.conn();
    let mut rc = r.conn();
    assert_noperm(&mut mc, &["TB.SETSTATE", "k", "0", "0", "1", "1", "5", "0"]);

    // Writes reach the replica as TB.SETSTATE, which ACL does not stop.
    for key in ["a", "b", "c"] {
        assert_allowed(&mut mc, &["TB.CONSUME", key, "1/d", "10", "3"]);
    }
    assert_allowed(
        &mut mc,
        &["TB.CONSUME", "a", "1/d", "10", "1", "RESERVE", "1000"],
    );
    sync_replica(&mut mc);
    for key in ["a", "b", "c"] {
        assert_eq!(
            digest(&mut mc, key),
            digest(&mut rc, key),
            "{key} replicated"
        );
    }
    let stats = commandstats(&mut rc);
    assert!(
        stats.contains("cmdstat_tb.setstate:calls=4"),
        "the replica applied 4 states: {stats}"
    );

    // The AOF replays TB.SETSTATE at start-up, also not subject to ACL.
    let before: Vec<_> = ["a", "b", "c"].iter().map(|k| state(&mut mc, k)).collect();
    let digests: Vec<String> = ["a", "b", "c"].iter().map(|k| digest(&mut mc, k)).collect();
    drop(mc);
    m.restart();
    let mut mc = m.conn();
    let after: Vec<String> = ["a", "b", "c"].iter().map(|k| digest(&mut mc, k)).collect();
    assert_eq!(after, digests, "the AOF restored every bucket");
    // And so does a rewritten AOF, made of TB.SETSTATE commands.
    let _: String = redis::cmd("BGREWRITEAOF").query(&mut mc).unwrap();
    m.wait_for("the AOF rewrite to finish", Duration::from_secs(20), |c| {
        aof_rewrite_done(c)
    });
    drop(mc);
    m.restart();
    let mut mc = m.conn();
    let again: Vec<String> = ["a", "b", "c"].iter().map(|k| digest(&mut mc, k)).collect();
    assert_eq!(again, digests, "the rewritten AOF restored every bucket");
    let now: Vec<_> = ["a", "b", "c"].iter().map(|k| state(&mut mc, k)).collect();
    for (b, n) in before.iter().zip(&now) {
        assert_eq!(b["capacity"], n["capacity"], "same capacity");
        assert_eq!(b["updated_at_ms"], n["updated_at_ms"], "same stored time");
    }
    assert_noperm(&mut mc, &["TB.SETSTATE", "k", "0", "0", "1", "1", "5", "0"]);
    for s in [&m, &r] {
        assert!(!s.log().contains("panic"), "{}", s.log());
    }
}
