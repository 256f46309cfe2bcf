//! Redis Cluster: three masters with one replica each, created with
//! `redis-cli --cluster create`, the module loaded on every node.
//!
//! Buckets live in every slot; cluster-aware clients (the `redis` crate's
//! cluster client and `redis-cli -c`) reach every command; plain clients get
//! MOVED and CROSSSLOT from the declared key positions; a limit holds exactly
//! whichever nodes the clients talk to; resharding (MIGRATE by hand, and
//! `redis-cli --cluster reshard`) carries bucket state across intact.

mod common;

use std::collections::HashMap;
use std::thread;
use std::time::Instant;

use common::cluster::{key_in_slot, redis_cli, slot_of, wait_replicated, Cluster, SLOTS};
use common::{consume, digest, error_of, fields, info, server_has_api, setuser, tokens, Server};
use redis::{ErrorKind, RedisError, Value};

/// The slot and port of a `MOVED slot 127.0.0.1:port` error.
fn moved_to(e: &RedisError) -> (u16, u16) {
    assert_eq!(e.kind(), ErrorKind::Moved, "{e}");
    let detail = e.detail().unwrap_or_default();
    let parsed = detail.split_once(' ').and_then(|(slot, addr)| {
        let port = addr.strip_prefix("127.0.0.1:")?;
        Some((slot.parse().ok()?, port.parse().ok()?))
    });
    parsed.unwrap_or_else(|| panic!("cannot parse MOVED {detail:?}"))
}

/// How much `TB.CONSUME` takes from the bucket in `slot` in [`fill_every_slot`].
fn taken_in_slot(slot: u16) -> u64 {
    u64::from(slot % 97) + 1
}

/// Creates one bucket in every slot (rate 0, capacity 1000), taking
/// [`taken_in_slot`] tokens from each, through a cluster pipeline.
fn fill_every_slot(cc: &mut redis::cluster::ClusterConnection) {
    let mut pipe = redis::cluster::cluster_pipe();
    for slot in 0..SLOTS {
        pipe.cmd("TB.CONSUME")
            .arg(key_in_slot(slot, "b"))
            .arg(0)
            .arg(1000)
            .arg(taken_in_slot(slot));
    }
    let replies: Vec<Vec<i64>> = pipe.query(cc).expect("the pipeline of 16384 TB.CONSUME");
    for (slot, r) in replies.iter().enumerate() {
        let n = taken_in_slot(slot as u16) as i64;
        assert_eq!(r, &vec![1, 1000 - n, 0, -1, n], "slot {slot}");
    }
}

/// Checks, through a cluster pipeline, that every slot's bucket still holds
/// exactly what [`fill_every_slot`] left.
fn check_every_slot(cc: &mut redis::cluster::ClusterConnection) {
    let mut pipe = redis::cluster::cluster_pipe();
    for slot in 0..SLOTS {
        pipe.cmd("TB.INFO").arg(key_in_slot(slot, "b"));
    }
    let replies: Vec<Vec<Value>> = pipe.query(cc).expect("the pipeline of 16384 TB.INFO");
    for (slot, r) in replies.into_iter().enumerate() {
        let slot = slot as u16;
        let f = fields(r);
        let want = 1000 - taken_in_slot(slot);
        assert_eq!(f["tokens"], want.to_string(), "slot {slot}: {f:?}");
        assert_eq!(f["capacity"], "1000", "slot {slot}");
    }
}

/// Runs `redis-cli -c -p <port> <args>` and returns its output.
fn cli_c(port: u16, args: &[&str]) -> String {
    let mut all: Vec<String> = ["-c", "-h", "127.0.0.1", "-p", &port.to_string()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    all.extend(args.iter().map(|s| s.to_string()));
    let (ok, out) = redis_cli(&all);
    assert!(ok, "redis-cli {all:?} failed: {out}");
    out
}

/// Every command of the catalogue (protocol/catalogue.json, generated from
/// the command specs: `make catalogue`): its name, arity and arguments.
fn catalogue_commands() -> Vec<(String, i64, Vec<String>)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/catalogue.json");
    let text = std::fs::read_to_string(path).expect("protocol/catalogue.json (make catalogue)");
    let cat: serde_json::Value = serde_json::from_str(&text).expect("the catalogue is JSON");
    let commands = cat["commands"].as_array().expect("catalogue commands");
    commands
        .iter()
        .map(|c| {
            let (min, max) = (
                c["arity"]["min"].as_i64().unwrap(),
                c["arity"]["max"].as_i64(),
            );
            let arity = if max == Some(min) { min } else { -min };
            let args = c["arguments"].as_array().unwrap();
            let args = args.iter().map(|a| a["name"].as_str().unwrap().to_owned());
            let name = c["name"].as_str().unwrap().to_lowercase();
            (name, arity, args.collect())
        })
        .collect()
}

#[test]
fn command_docs_describe_every_command() {
    let s = Server::start();
    let mut c = s.conn();
    let expected = catalogue_commands();
    assert!(expected.len() >= 9, "{expected:?}");
    for (name, arity, args) in &expected {
        let (name, arity) = (name.as_str(), *arity);
        let v: Vec<Value> = redis::cmd("COMMAND")
            .arg("DOCS")
            .arg(name)
            .query(&mut c)
            .unwrap();
        assert_eq!(v.len(), 2, "COMMAND DOCS {name}: {v:?}");
        let Value::Array(doc) = &v[1] else {
            panic!("COMMAND DOCS {name}: {v:?}")
        };
        let doc: HashMap<String, Value> = doc
            .chunks(2)
            .map(|p| {
                (
                    redis::from_redis_value::<String>(&p[0]).unwrap(),
                    p[1].clone(),
                )
            })
            .collect();
        let text = |k: &str| redis::from_redis_value::<String>(&doc[k]).unwrap();
        assert!(text("summary").len() > 20, "{name} summary: {doc:?}");
        assert_eq!(text("since"), "0.1.0", "{name}");
        assert_eq!(text("group"), "module", "{name}");
        assert_eq!(text("module"), "tb", "{name}");
        let Value::Array(arguments) = &doc["arguments"] else {
            panic!("{name} arguments: {doc:?}")
        };
        let names: Vec<String> = arguments
            .iter()
            .map(|a| {
                let Value::Array(a) = a else { panic!("{a:?}") };
                redis::from_redis_value(&a[1]).unwrap()
            })
            .collect();
        assert_eq!(&names, args, "{name} argument names");
        // COMMAND INFO shows the same arity, and Redis enforces it.
        let info: Vec<Vec<Value>> = redis::cmd("COMMAND")
            .arg("INFO")
            .arg(name)
            .query(&mut c)
            .unwrap();
        assert_eq!(info[0][1], Value::Int(arity), "{name} arity");
    }
    let summary: String = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("tb.consume")
        .query::<Vec<Value>>(&mut c)
        .map(|v| format!("{v:?}"))
        .unwrap();
    assert!(
        summary.contains("Takes n tokens (default 1) from a token bucket"),
        "{summary}"
    );
    let e = error_of(&mut c, redis::cmd("TB.INFO").arg("a").arg("b"));
    assert!(e.to_string().contains("wrong number of arguments"), "{e}");
}

/// The ACL rules of the production guide (docs/security.md, "ACL").
#[test]
fn acl_rules_keep_the_internal_commands_from_applications() {
    let s = Server::start();
    let mut admin = s.conn();
    let users: [(&str, &[&str]); 3] = [
        ("named", &["~*", "+@all", "-tb.setstate", "-tb.config"]),
        (
            "prefix",
            &[
                "~rl:*",
                "+tb.consume",
                "+tb.mconsume",
                "+tb.refund",
                "+tb.info",
                "+cl.throttle",
            ],
        ),
        ("category", &["~*", "+@all", "-@dangerous"]),
    ];
    for (name, rules) in users {
        setuser(&mut admin, name, &format!("on >pw {}", rules.join(" ")));
    }
    let setstate = redis::cmd("TB.SETSTATE")
        .arg("rl:1")
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(1)
        .arg(10)
        .arg(0)
        .clone();
    let config = redis::cmd("TB.CONFIG").arg("GET").arg("*").clone();
    let categories = server_has_api("SetCommandACLCategories");
    for user in ["named", "prefix", "category"] {
        let mut c = s.login(user, "pw");
        assert_eq!(consume(&mut c, "rl:1", "0", 10, 1)[0], 1, "{user}");
        assert_eq!(tokens(&mut c, "rl:1"), "9", "{user}");
        let refunded: i64 = redis::cmd("TB.REFUND")
            .arg("rl:1")
            .arg(1)
            .query(&mut c)
            .unwrap();
        assert_eq!(refunded, 10, "{user}");
        if user == "category" && !categories {
            // Redis 7.0: module commands are in no category but @all.
            assert!(setstate.query::<String>(&mut c).is_ok());
            assert!(config.query::<Value>(&mut c).is_ok());
            continue;
        }
        for cmd in [&setstate, &config] {
            let e = error_of(&mut c, cmd);
            assert_eq!(e.code(), Some("NOPERM"), "{user}: {e}");
        }
    }
    let mut c = s.login("prefix", "pw");
    let e = error_of(&mut c, redis::cmd("TB.CONSUME").arg("other").arg(0).arg(10));
    assert_eq!(e.code(), Some("NOPERM"), "{e}");
}

#[test]
fn cluster_clients_reach_every_command() {
    let cl = Cluster::start();
    let mut cc = cl.conn();

    // One bucket in each of the 16384 slots, through the cluster client.
    fill_every_slot(&mut cc);
    let masters = cl.masters();
    assert_eq!(masters.len(), 3);
    let map = cl.slot_map();
    let mut total = 0;
    for &m in &masters {
        let keys: i64 = redis::cmd("DBSIZE").query(&mut cl.node_conn(m)).unwrap();
        let owned = map.iter().filter(|&&o| o == m).count() as i64;
        assert_eq!(keys, owned, "master {m} holds one bucket per slot it owns");
        assert!(owned > 5000, "slots are spread over the masters");
        total += keys;
    }
    assert_eq!(total, i64::from(SLOTS));
    check_every_slot(&mut cc);

    // Every command through the cluster client (which follows MOVED).
    let k = "user:42";
    let owner = cl.node_for_key(k);
    assert_eq!(consume(&mut cc, k, "0", 10, 3), [1, 7, 0, -1, 3]);
    let i = info(&mut cc, k).unwrap();
    assert_eq!((i["tokens"].as_str(), i["capacity"].as_str()), ("7", "10"));
    let refunded: i64 = redis::cmd("TB.REFUND")
        .arg(k)
        .arg(2)
        .query(&mut cc)
        .unwrap();
    assert_eq!(refunded, 9);
    let throttle: Vec<i64> = redis::cmd("CL.THROTTLE")
        .arg("cell:1")
        .arg(4)
        .arg(0)
        .arg(60)
        .arg(2)
        .query(&mut cc)
        .unwrap();
    assert_eq!(throttle, [0, 5, 3, -1, -1]);
    // MCONSUME is routed by its first argument (numkeys) by a generic
    // client, so the first node it asks usually answers MOVED.
    let mc: Vec<i64> = redis::cmd("TB.MCONSUME")
        .arg(2)
        .arg("{tenant7}:rpm")
        .arg("{tenant7}:tpm")
        .arg(0)
        .arg(10)
        .arg(1)
        .arg(0)
        .arg(1000)
        .arg(300)
        .query(&mut cc)
        .unwrap();
    assert_eq!(mc, [1, 0, 9, 700]);
    // The partial form, a per-user and a global byte cap in one slot: both
    // give the same grant (700 is all the second holds), at least the chunk.
    let mc: Vec<i64> = redis::cmd("TB.MCONSUME")
        .arg(2)
        .arg("{tenant7}:user-bytes")
        .arg("{tenant7}:global-bytes")
        .arg(0)
        .arg(5000)
        .arg(1000)
        .arg(0)
        .arg(700)
        .arg(1000)
        .arg("ATMOST")
        .arg("MIN")
        .arg(500)
        .query(&mut cc)
        .unwrap();
    assert_eq!(mc, [1, 0, 4300, 0, 700]);
    let ok: String = redis::cmd("TB.SETSTATE")
        .arg("state:1")
        .arg(5_000_000_000i64)
        .arg(1_000_000)
        .arg(0)
        .arg(1)
        .arg(10)
        .arg(0)
        .query(&mut cc)
        .unwrap();
    assert_eq!(ok, "OK");
    assert_eq!(tokens(&mut cc, "state:1"), "5");
    let cfg: Vec<String> = redis::cmd("TB.CONFIG")
        .arg("GET")
        .arg("max-wait-ms")
        .query(&mut cc)
        .unwrap();
    assert_eq!(cfg, ["max-wait-ms", "60000"]);

    // Multi-key commands need one slot: CROSSSLOT otherwise, even for a
    // cluster client, and nothing changes.
    let e = error_of(
        &mut cc,
        redis::cmd("TB.MCONSUME")
            .arg(2)
            .arg("tenant7:rpm")
            .arg("tenant8:rpm")
            .arg(0)
            .arg(10)
            .arg(1)
            .arg(0)
            .arg(10)
            .arg(1),
    );
    assert_eq!(e.kind(), ErrorKind::CrossSlot, "{e}");
    assert!(info(&mut cc, "tenant7:rpm").is_none() && info(&mut cc, "tenant8:rpm").is_none());

    // A plain client on a node that does not own the key gets MOVED to the
    // owner, for every keyed command: the key positions are declared.
    let other = *masters.iter().find(|&&m| m != owner).unwrap();
    let mut plain = cl.node_conn(other);
    let keyed: Vec<redis::Cmd> = vec![
        redis::cmd("TB.CONSUME").arg(k).arg(0).arg(10).clone(),
        redis::cmd("TB.INFO").arg(k).clone(),
        redis::cmd("TB.REFUND").arg(k).arg(1).clone(),
        redis::cmd("CL.THROTTLE")
            .arg(k)
            .arg(1)
            .arg(1)
            .arg(1)
            .clone(),
        redis::cmd("TB.MCONSUME")
            .arg(1)
            .arg(k)
            .arg(0)
            .arg(10)
            .arg(1)
            .clone(),
        redis::cmd("TB.SETSTATE")
            .arg(k)
            .arg(0)
            .arg(0)
            .arg(0)
            .arg(1)
            .arg(10)
            .arg(0)
            .clone(),
    ];
    for cmd in &keyed {
        let e = error_of(&mut plain, cmd);
        assert_eq!(moved_to(&e), (slot_of(k), cl.nodes[owner].port), "{e}");
    }
    let e = error_of(
        &mut plain,
        redis::cmd("TB.MCONSUME")
            .arg(2)
            .arg("a")
            .arg("b")
            .arg(0)
            .arg(1)
            .arg(1)
            .arg(0)
            .arg(1)
            .arg(1),
    );
    assert_eq!(e.kind(), ErrorKind::CrossSlot, "{e}");
    // None of those changed the bucket.
    assert_eq!(tokens(&mut cc, k), "9");

    // redis-cli -c started on a node that does not own the key follows the
    // MOVED redirects for every command.
    let port = cl.nodes[other].port;
    assert_eq!(
        cli_c(port, &["TB.CONSUME", k, "0", "10", "4"]),
        "1\n5\n0\n-1\n4\n"
    );
    let out = cli_c(port, &["TB.INFO", k]);
    assert!(
        out.starts_with("tokens\n5\ncapacity\n10\nrate\n0\n"),
        "{out}"
    );
    assert_eq!(cli_c(port, &["TB.REFUND", k, "1"]), "6\n");
    assert_eq!(
        cli_c(port, &["CL.THROTTLE", "cell:1", "4", "0", "60", "1"]),
        "0\n5\n2\n-1\n-1\n"
    );
    assert_eq!(
        cli_c(
            port,
            &[
                "TB.MCONSUME",
                "2",
                "{tenant7}:rpm",
                "{tenant7}:tpm",
                "0",
                "10",
                "1",
                "0",
                "1000",
                "300"
            ]
        ),
        "1\n0\n8\n400\n"
    );
    assert_eq!(
        cli_c(
            port,
            &[
                "TB.SETSTATE",
                "state:1",
                "3000000000",
                "1000000",
                "0",
                "1",
                "10",
                "0"
            ]
        ),
        "OK\n"
    );
    assert_eq!(tokens(&mut cc, "state:1"), "3");
    assert!(cli_c(port, &["TB.CONFIG", "GET", "*"]).contains("max-blocked"));

    // TB.INFO is read-only: a replica serves it after READONLY, with the
    // same state as its master; without READONLY it redirects.
    let replica = cl.replica_of(owner);
    wait_replicated(&cl.nodes[owner], &cl.nodes[replica]);
    let mut rc = cl.node_conn(replica);
    let e = error_of(&mut rc, redis::cmd("TB.INFO").arg(k));
    assert_eq!(e.kind(), ErrorKind::Moved, "{e}");
    let _: String = redis::cmd("READONLY").query(&mut rc).unwrap();
    assert_eq!(tokens(&mut rc, k), "6");
    assert_eq!(
        digest(&mut rc, k),
        digest(&mut cl.node_conn(owner), k),
        "replica and master hold the same value"
    );
    // Writes still go to the master, even after READONLY.
    let e = error_of(&mut rc, redis::cmd("TB.CONSUME").arg(k).arg(0).arg(10));
    assert_eq!(e.kind(), ErrorKind::Moved, "{e}");
}

/// Sends `cmd` to `entry`; on MOVED, sends it to the node named in the
/// redirect (a minimal cluster client). Returns the reply and whether it
/// was redirected.
fn via_node(
    cl: &Cluster,
    entry: &mut redis::Connection,
    others: &mut HashMap<u16, redis::Connection>,
    cmd: &redis::Cmd,
) -> (Vec<i64>, bool) {
    match cmd.query::<Vec<i64>>(entry) {
        Ok(r) => (r, false),
        Err(e) if e.kind() == ErrorKind::Moved => {
            let (_, port) = moved_to(&e);
            let c = others
                .entry(port)
                .or_insert_with(|| cl.node_conn(cl.index_of_port(port)));
            (cmd.query(c).expect("the owner answers"), true)
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn a_limit_holds_exactly_whichever_node_clients_hit() {
    const CAP: u64 = 100;
    const ROUNDS: usize = 150;
    let cl = Cluster::start();
    // One limited key on each master.
    let map = cl.slot_map();
    let keys: Vec<String> = cl
        .masters()
        .iter()
        .map(|&m| key_in_slot(map.iter().position(|&o| o == m).unwrap() as u16, "limit"))
        .collect();
    let started = Instant::now();
    let granted_and_moved: Vec<(Vec<u64>, usize)> = thread::scope(|s| {
        let mut handles = Vec::new();
        // One plain client per node, replicas included: each request goes to
        // that node first and follows MOVED from there.
        for i in 0..cl.nodes.len() {
            let (cl, keys) = (&cl, &keys);
            handles.push(s.spawn(move || {
                let mut entry = cl.node_conn(i);
                let mut others = HashMap::new();
                let mut granted = vec![0u64; keys.len()];
                let mut moved = 0;
                for _ in 0..ROUNDS {
                    for (j, k) in keys.iter().enumerate() {
                        let cmd = redis::cmd("TB.CONSUME").arg(k).arg(0).arg(CAP).clone();
                        let (r, redirected) = via_node(cl, &mut entry, &mut others, &cmd);
                        granted[j] += r[4] as u64;
                        moved += usize::from(redirected);
                    }
                }
                (granted, moved)
            }));
        }
        // And two cluster-aware clients.
        for _ in 0..2 {
            let (cl, keys) = (&cl, &keys);
            handles.push(s.spawn(move || {
                let mut cc = cl.conn();
                let mut granted = vec![0u64; keys.len()];
                for _ in 0..ROUNDS {
                    for (j, k) in keys.iter().enumerate() {
                        granted[j] += consume(&mut cc, k, "0", CAP, 1)[4] as u64;
                    }
                }
                (granted, 0)
            }));
        }
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    eprintln!(
        "{} requests in {:?}",
        8 * ROUNDS * keys.len(),
        started.elapsed()
    );
    for (i, (_, moved)) in granted_and_moved.iter().take(cl.nodes.len()).enumerate() {
        // Every node owns at most one of the three keys.
        assert!(
            *moved >= 2 * ROUNDS,
            "client of node {i} was redirected {moved} times"
        );
    }
    let mut cc = cl.conn();
    for (j, k) in keys.iter().enumerate() {
        let total: u64 = granted_and_moved.iter().map(|(g, _)| g[j]).sum();
        assert_eq!(total, CAP, "{k}: exactly the capacity was granted");
        assert_eq!(tokens(&mut cc, k), "0", "{k}");
    }
}

#[test]
fn resharding_carries_bucket_state_across() {
    let cl = Cluster::start();
    let mut cc = cl.conn();
    fill_every_slot(&mut cc);
    let masters = cl.masters();
    let (src, dst) = (masters[0], masters[1]);

    // 1. One slot by hand: SETSLOT IMPORTING/MIGRATING, MIGRATE (DUMP and
    //    RESTORE of the data type), SETSLOT NODE.
    let slot = cl.slot_map().iter().rposition(|&o| o == src).unwrap() as u16;
    let keys: Vec<String> = (1..=5)
        .map(|i| key_in_slot(slot, &format!("m{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        consume(&mut cc, k, "0", 50, i as u64 + 1);
    }
    // A refilling bucket: its state (tokens, time, rate) must move as is.
    let refilling = key_in_slot(slot, "refill");
    consume(&mut cc, &refilling, "1/h", 1_000_000, 400_000);
    let mut sc = cl.node_conn(src);
    let mut dc = cl.node_conn(dst);
    let before: Vec<String> = keys
        .iter()
        .chain([&refilling])
        .map(|k| digest(&mut sc, k))
        .collect();
    let refill_info = info(&mut cc, &refilling).unwrap();
    let pexpiretime = |c: &mut redis::Connection, k: &str| -> i64 {
        redis::cmd("PEXPIRETIME").arg(k).query(c).unwrap()
    };
    let expire_before = pexpiretime(&mut sc, &refilling);
    assert!(expire_before > 0, "a refilling bucket expires when full");

    let setslot = |c: &mut redis::Connection, how: &str, id: &str| {
        let _: String = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(id)
            .query(c)
            .unwrap();
    };
    setslot(&mut dc, "IMPORTING", cl.id(src));
    setslot(&mut sc, "MIGRATING", cl.id(dst));
    let migrate = |sc: &mut redis::Connection, ks: &[&String]| {
        let r: String = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(cl.nodes[dst].port)
            .arg("")
            .arg(0)
            .arg(10_000)
            .arg("KEYS")
            .arg(ks)
            .query(sc)
            .unwrap();
        assert_eq!(r, "OK");
    };
    let migrate_started = Instant::now();
    migrate(&mut sc, &[&keys[0]]);
    // Mid-migration, the cluster client follows ASK to the migrated key and
    // is served by the source for the others: both continue from their state.
    assert_eq!(consume(&mut cc, &keys[0], "0", 50, 1), [1, 48, 0, -1, 1]);
    assert_eq!(consume(&mut cc, &keys[1], "0", 50, 1), [1, 47, 0, -1, 1]);
    let rest: Vec<String> = redis::cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(100)
        .query(&mut sc)
        .unwrap();
    assert_eq!(
        rest.len(),
        6,
        "the fill's bucket, four of five and the refilling one"
    );
    migrate(&mut sc, &rest.iter().collect::<Vec<_>>());
    let migrate_took = migrate_started.elapsed();
    for &m in &masters {
        setslot(&mut cl.node_conn(m), "NODE", cl.id(dst));
    }
    cl.wait_stable();
    assert_eq!(cl.owner_of_slot(slot), dst);
    let count: i64 = redis::cmd("CLUSTER")
        .arg("COUNTKEYSINSLOT")
        .arg(slot)
        .query(&mut dc)
        .unwrap();
    assert_eq!(
        count, 7,
        "the slot's bucket from the fill, five and the refilling one"
    );
    let after: Vec<String> = keys
        .iter()
        .chain([&refilling])
        .map(|k| digest(&mut dc, k))
        .collect();
    // The two buckets consumed mid-migration changed; the others are identical.
    assert_eq!(
        after[2..],
        before[2..],
        "migrated buckets are bit-identical"
    );
    for (i, k) in keys.iter().enumerate() {
        let taken = i as u64 + 1 + u64::from(i < 2);
        assert_eq!(tokens(&mut cc, k), (50 - taken).to_string(), "{k}");
    }
    let moved_info = info(&mut cc, &refilling).unwrap();
    assert_eq!(moved_info["updated_at_ms"], refill_info["updated_at_ms"]);
    assert_eq!(moved_info["rate"], refill_info["rate"]);
    // MIGRATE sends the remaining TTL, so the expiry can only move later, by
    // at most the time the migration took.
    let expire_after = pexpiretime(&mut dc, &refilling);
    assert!(
        expire_after >= expire_before
            && expire_after <= expire_before + migrate_took.as_millis() as i64 + 1,
        "expiry {expire_before} -> {expire_after} (migration took {migrate_took:?})"
    );

    // 2. redis-cli --cluster reshard: 64 slots from src to dst.
    let map = cl.slot_map();
    let src_slots_before: Vec<u16> = (0..SLOTS).filter(|&s| map[usize::from(s)] == src).collect();
    let digests_before: HashMap<u16, String> = src_slots_before
        .iter()
        .map(|&s| (s, digest(&mut sc, &key_in_slot(s, "b"))))
        .collect();
    let (ok, out) = redis_cli(&[
        "--cluster".into(),
        "reshard".into(),
        cl.nodes[src].addr(),
        "--cluster-from".into(),
        cl.id(src).into(),
        "--cluster-to".into(),
        cl.id(dst).into(),
        "--cluster-slots".into(),
        "64".into(),
        "--cluster-yes".into(),
    ]);
    assert!(ok, "redis-cli --cluster reshard failed:\n{out}");
    cl.wait_stable();
    let map = cl.slot_map();
    let moved: Vec<u16> = src_slots_before
        .iter()
        .copied()
        .filter(|&s| map[usize::from(s)] == dst)
        .collect();
    assert_eq!(moved.len(), 64, "64 slots moved");
    for &s in &moved {
        let k = key_in_slot(s, "b");
        let left: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(s)
            .query(&mut sc)
            .unwrap();
        assert_eq!(left, 0, "{k} left the source");
        assert_eq!(digest(&mut dc, &k), digests_before[&s], "{k} is intact");
    }
    // Every bucket in the cluster holds exactly its tokens (a new connection:
    // the crate's cluster pipelines do not follow MOVED), and the old cluster
    // connection, following MOVED, continues from them.
    check_every_slot(&mut cl.conn());
    for &s in moved.iter().take(8) {
        let k = key_in_slot(s, "b");
        let left = 1000 - taken_in_slot(s) as i64;
        assert_eq!(consume(&mut cc, &k, "0", 1000, 1), [1, left - 1, 0, -1, 1]);
    }
}
