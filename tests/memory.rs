//! Memory pressure: what each `maxmemory-policy` does to rate-limit buckets.
//!
//! An evicted bucket reads as a missing key, which is a full bucket, so
//! eviction hands out tokens. These tests pin, on a real server under
//! `maxmemory`, which policies evict buckets (every `allkeys-*`, and every
//! `volatile-*` while buckets carry a TTL), which do not (`noeviction`, and
//! `volatile-*` with `tb.expire-idle no`), that the module warns about the
//! former at load and in `INFO tb`, and that `deny-oom` refuses to create
//! buckets past the limit with Redis' OOM error. The pressure test prints one
//! line per policy (the table in docs/security.md, "Memory pressure and eviction").

mod common;

use common::{config_set, digest, info_field, replica_of, sync_replica, Server, ServerConfig};
use redis::{Connection, Value};

/// Every eviction policy Redis 7.0 and 8.2 accept.
const POLICIES: [&str; 8] = [
    "noeviction",
    "allkeys-lru",
    "allkeys-lfu",
    "allkeys-random",
    "volatile-lru",
    "volatile-lfu",
    "volatile-random",
    "volatile-ttl",
];

/// The start of Redis' reply to a deny-oom command past `maxmemory`.
const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'";

/// Drained buckets created before the pressure starts.
const BUCKETS: usize = 200;
/// Size of each filler value.
const FILLER_BYTES: usize = 4000;
/// Room above the empty server's memory given to `maxmemory`.
const HEADROOM: u64 = 2 << 20;

fn can_evict(c: &mut Connection) -> String {
    info_field(c, "tb", "tb_eviction_policy_can_evict_buckets")
}

/// The error text of a command that must fail.
fn error_line(r: redis::RedisResult<Value>) -> String {
    match r {
        Err(e) => format!("{} {}", e.code().unwrap_or(""), e.detail().unwrap_or("")),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

fn consume(c: &mut Connection, key: &str, n: u64) -> redis::RedisResult<Value> {
    redis::cmd("TB.CONSUME")
        .arg(key)
        .arg("1/d")
        .arg(10)
        .arg(n)
        .query(c)
}

/// The warning logged when the policy can evict buckets.
const WARNING: &str = "can evict rate-limit buckets";

#[test]
fn the_module_warns_when_the_policy_can_evict_buckets() {
    // At load: the default policy is safe and nothing is logged.
    let s = Server::start();
    let mut c = s.conn();
    assert_eq!(can_evict(&mut c), "0");
    assert!(!s.log().contains(WARNING), "{}", s.log());
    // On every CONFIG SET of the policy: INFO follows, the log warns.
    for p in POLICIES {
        config_set(&mut c, "maxmemory-policy", p);
        let expected = if p == "noeviction" { "0" } else { "1" };
        assert_eq!(can_evict(&mut c), expected, "{p}");
        let warned = s.log().contains(&format!("maxmemory-policy {p} {WARNING}"));
        assert_eq!(warned, p != "noeviction", "log warning for {p}");
    }
    // volatile-* no longer reaches buckets once they carry no TTL.
    config_set(&mut c, "maxmemory-policy", "volatile-lru");
    config_set(&mut c, "tb.expire-idle", "no");
    assert_eq!(can_evict(&mut c), "0");
    config_set(&mut c, "maxmemory-policy", "allkeys-lru");
    assert_eq!(
        can_evict(&mut c),
        "1",
        "allkeys-* evicts buckets regardless"
    );
    drop(c);

    // At load, from the command line, for an evicting and a safe setup.
    let s = Server::start_with(ServerConfig {
        args: vec!["--maxmemory-policy".into(), "allkeys-lfu".into()],
        ..ServerConfig::default()
    });
    assert_eq!(can_evict(&mut s.conn()), "1");
    assert!(
        s.log()
            .contains(&format!("maxmemory-policy allkeys-lfu {WARNING}")),
        "{}",
        s.log()
    );
    let s = Server::start_with(ServerConfig {
        args: vec!["--maxmemory-policy".into(), "volatile-ttl".into()],
        module_args: vec!["expire-idle".into(), "no".into()],
        ..ServerConfig::default()
    });
    assert_eq!(can_evict(&mut s.conn()), "0");
    assert!(!s.log().contains(WARNING), "{}", s.log());
}

/// The keys among `keys` that do not exist.
fn missing(c: &mut Connection, keys: impl Iterator<Item = String>) -> Vec<String> {
    let keys: Vec<String> = keys.collect();
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("EXISTS").arg(k);
    }
    let found: Vec<i64> = pipe.query(c).unwrap();
    keys.into_iter()
        .zip(found)
        .filter(|(_, f)| *f == 0)
        .map(|(k, _)| k)
        .collect()
}

/// What one policy did under pressure.
struct Pressure {
    buckets_evicted: usize,
    volatile_fillers_evicted: usize,
    other_fillers_evicted: usize,
    fillers_refused: usize,
}

/// Creates drained buckets, then writes filler strings (half with a TTL)
/// worth four times `maxmemory`, and counts what was evicted.
fn pressure(policy: &str, expire_idle: bool) -> Pressure {
    let mut module_args = Vec::new();
    if !expire_idle {
        module_args = vec!["expire-idle".to_string(), "no".to_string()];
    }
    let s = Server::start_with(ServerConfig {
        module_args,
        ..ServerConfig::default()
    });
    let mut c = s.conn();
    for i in 0..BUCKETS {
        let r: Vec<i64> =
            redis::from_redis_value(&consume(&mut c, &format!("rl:{i}"), 10).unwrap()).unwrap();
        assert_eq!(r[..2], [1, 0], "drained rl:{i}");
    }
    let ttl: i64 = redis::cmd("PTTL").arg("rl:0").query(&mut c).unwrap();
    assert_eq!(
        ttl > 0,
        expire_idle,
        "a bucket carries a TTL iff expire-idle: {ttl}"
    );

    let used: u64 = info_field(&mut c, "memory", "used_memory").parse().unwrap();
    let limit = used + HEADROOM;
    config_set(&mut c, "maxmemory-policy", policy);
    config_set(&mut c, "maxmemory", &limit.to_string());
    let expected = policy != "noeviction" && (policy.starts_with("allkeys-") || expire_idle);
    assert_eq!(
        can_evict(&mut c),
        if expected { "1" } else { "0" },
        "{policy}"
    );

    let value = "x".repeat(FILLER_BYTES);
    let fillers = (4 * limit as usize) / FILLER_BYTES;
    let filler = |i: usize| {
        if i.is_multiple_of(2) {
            format!("f:ttl:{i}")
        } else {
            format!("f:keep:{i}")
        }
    };
    let mut written = Vec::new();
    let mut refused = 0;
    for i in 0..fillers {
        let mut cmd = redis::cmd("SET");
        cmd.arg(filler(i)).arg(&value);
        if i.is_multiple_of(2) {
            cmd.arg("EX").arg(3600);
        }
        match cmd.query::<Value>(&mut c) {
            Ok(_) => written.push(i),
            Err(e) => {
                assert_eq!(e.code(), Some("OOM"), "{e}");
                refused += 1;
            }
        }
    }
    // The limit is lifted before anything is counted: past maxmemory every
    // command (the EXISTS below too) first evicts, so a bucket seen here
    // could otherwise be evicted before the consume that checks it. Lifted,
    // nothing is evicted any more, and the consume cannot be refused.
    config_set(&mut c, "maxmemory", "0");
    let evicted_buckets = missing(&mut c, (0..BUCKETS).map(|i| format!("rl:{i}")));
    let missing_before = |i: usize| evicted_buckets.contains(&format!("rl:{i}"));
    let evicted = missing(&mut c, written.iter().map(|&i| filler(i)));
    let volatile_fillers_evicted = evicted.iter().filter(|k| k.starts_with("f:ttl:")).count();
    let other_fillers_evicted = evicted.len() - volatile_fillers_evicted;
    // A drained bucket that was evicted comes back full: the hazard; one
    // that survived still denies.
    if let Some(i) = (0..BUCKETS).find(|i| !missing_before(*i)) {
        let r: Vec<i64> =
            redis::from_redis_value(&consume(&mut c, &format!("rl:{i}"), 10).unwrap()).unwrap();
        assert_eq!(
            r[0], 0,
            "a surviving drained bucket still denies: rl:{i} {r:?}"
        );
    }
    if let Some(key) = evicted_buckets.first() {
        let r: Vec<i64> = redis::from_redis_value(&consume(&mut c, key, 10).unwrap()).unwrap();
        assert_eq!(
            r[0], 1,
            "an evicted drained bucket grants its whole capacity again"
        );
    }
    assert!(!s.log().contains("panic"), "{}", s.log());
    Pressure {
        buckets_evicted: evicted_buckets.len(),
        volatile_fillers_evicted,
        other_fillers_evicted,
        fillers_refused: refused,
    }
}

#[test]
fn each_policy_under_pressure() {
    println!("policy            expire-idle  buckets evicted  TTL fillers evicted  other fillers evicted  fillers refused (OOM)");
    let mut runs: Vec<(&str, bool)> = POLICIES.iter().map(|&p| (p, true)).collect();
    runs.extend(
        POLICIES
            .iter()
            .filter(|p| p.starts_with("volatile-"))
            .map(|&p| (p, false)),
    );
    for (policy, expire_idle) in runs {
        let r = pressure(policy, expire_idle);
        println!(
            "{policy:<17} {:<12} {:>8}/{BUCKETS:<7} {:>19} {:>22} {:>22}",
            if expire_idle { "yes" } else { "no" },
            r.buckets_evicted,
            r.volatile_fillers_evicted,
            r.other_fillers_evicted,
            r.fillers_refused
        );
        if policy == "noeviction" {
            assert_eq!(r.buckets_evicted, 0, "{policy}");
            assert!(r.fillers_refused > 0, "{policy}: the limit was reached");
        } else if policy.starts_with("allkeys-") {
            assert!(r.buckets_evicted > 0, "{policy} evicts buckets");
            assert_eq!(r.fillers_refused, 0, "{policy} always finds a key to evict");
        } else if expire_idle {
            assert!(r.buckets_evicted > 0, "{policy} evicts buckets with a TTL");
            assert_eq!(
                r.other_fillers_evicted, 0,
                "{policy} spares keys without TTL"
            );
        } else {
            assert_eq!(
                r.buckets_evicted, 0,
                "{policy}: buckets without TTL are safe"
            );
            assert_eq!(
                r.other_fillers_evicted, 0,
                "{policy} spares keys without TTL"
            );
            assert!(
                r.volatile_fillers_evicted > 0,
                "{policy} evicted the TTL keys"
            );
        }
    }
}

/// Fills a `noeviction` server with strings until Redis refuses a write.
fn fill_to_the_limit(c: &mut Connection) {
    let used: u64 = info_field(c, "memory", "used_memory").parse().unwrap();
    config_set(c, "maxmemory", &(used + HEADROOM).to_string());
    let value = "x".repeat(FILLER_BYTES);
    for i in 0.. {
        let r: redis::RedisResult<Value> =
            redis::cmd("SET").arg(format!("f:{i}")).arg(&value).query(c);
        if let Err(e) = r {
            assert_eq!(e.code(), Some("OOM"), "{e}");
            return;
        }
        assert!(i < 100_000, "maxmemory was never reached");
    }
}

#[test]
fn deny_oom_refuses_new_buckets_with_a_clear_error() {
    let s = Server::start();
    let mut c = s.conn();
    let r: Vec<i64> = redis::from_redis_value(&consume(&mut c, "old", 4).unwrap()).unwrap();
    assert_eq!(r[..2], [1, 6]);
    fill_to_the_limit(&mut c);
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();

    // Every command that can create or change a bucket is refused whole.
    let refused = [
        consume(&mut c, "new", 1),
        consume(&mut c, "old", 1),
        redis::cmd("TB.MCONSUME")
            .arg(2)
            .arg("new")
            .arg("old")
            .arg("1/d")
            .arg(10)
            .arg(1)
            .arg("1/d")
            .arg(10)
            .arg(1)
            .query(&mut c),
        redis::cmd("CL.THROTTLE")
            .arg("new")
            .arg(9)
            .arg(1)
            .arg(86400)
            .query(&mut c),
        redis::cmd("TB.REFUND").arg("old").arg(1).query(&mut c),
        redis::cmd("TB.SETSTATE")
            .arg("new")
            .arg(0)
            .arg(0)
            .arg(1)
            .arg(1)
            .arg(1)
            .arg(0)
            .query(&mut c),
    ];
    for r in refused {
        let e = error_line(r);
        assert!(e.starts_with(OOM), "{e}");
    }
    // Inside a script the same error reaches the script.
    let e = error_line(
        redis::cmd("EVAL")
            .arg("return redis.pcall('TB.CONSUME', KEYS[1], '1/d', '10')")
            .arg(1)
            .arg("new")
            .query(&mut c),
    );
    assert!(e.starts_with(OOM), "{e}");
    // MULTI: the command is refused when queued, and EXEC aborts.
    let _: () = redis::cmd("MULTI").query(&mut c).unwrap();
    let queued = error_line(consume(&mut c, "new", 1));
    assert!(queued.starts_with(OOM), "{queued}");
    let exec = error_line(redis::cmd("EXEC").query(&mut c));
    assert!(exec.starts_with("EXECABORT"), "{exec}");

    // Nothing was created or changed; reads still work.
    let after: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(after, keys, "no key was created");
    let info: Vec<String> = redis::cmd("TB.INFO").arg("old").query(&mut c).unwrap();
    assert!(
        info[1].starts_with('6'),
        "old still holds 6 tokens: {info:?}"
    );
    let none: Value = redis::cmd("TB.INFO").arg("new").query(&mut c).unwrap();
    assert_eq!(none, Value::Nil);

    // Once memory is freed, buckets work again.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut c)
        .unwrap();
    let r: Vec<i64> = redis::from_redis_value(&consume(&mut c, "new", 1).unwrap()).unwrap();
    assert_eq!(r[..2], [1, 9]);
    assert!(!s.log().contains("panic"), "{}", s.log());
}

#[test]
fn scripts_flagged_allow_oom_create_no_bucket_past_maxmemory() {
    // A script or function flagged allow-oom may run deny-oom commands past
    // maxmemory (Redis' rule for every command). The module still creates
    // no bucket there: the memory a tenant's limiter calls take stays
    // bounded by maxmemory whatever path they come through. Changing an
    // existing bucket takes no memory and follows Redis' rule.
    let s = Server::start();
    let mut c = s.conn();
    let r: Vec<i64> = redis::from_redis_value(&consume(&mut c, "old", 4).unwrap()).unwrap();
    assert_eq!(r[..2], [1, 6]);
    let lib = "#!lua name=limiter\n\
               redis.register_function{function_name='take', flags={'allow-oom'}, \
               callback=function(keys) return redis.call('TB.CONSUME', keys[1], '1/d', '10') end}";
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(lib)
        .query(&mut c)
        .unwrap();
    fill_to_the_limit(&mut c);
    let keys: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    let script = "#!lua flags=allow-oom\nreturn redis.call('TB.CONSUME', KEYS[1], '1/d', '10')";
    let eval = |c: &mut Connection, key: &str| -> redis::RedisResult<Value> {
        redis::cmd("EVAL").arg(script).arg(1).arg(key).query(c)
    };
    let fcall = |c: &mut Connection, key: &str| -> redis::RedisResult<Value> {
        redis::cmd("FCALL").arg("take").arg(1).arg(key).query(c)
    };
    for r in [eval(&mut c, "new"), fcall(&mut c, "new2")] {
        let e = error_line(r);
        assert!(e.contains(OOM), "{e}");
    }
    let after: i64 = redis::cmd("DBSIZE").query(&mut c).unwrap();
    assert_eq!(after, keys, "no bucket was created");
    // An existing bucket still works there.
    for r in [eval(&mut c, "old"), fcall(&mut c, "old")] {
        let r: Vec<i64> = redis::from_redis_value(&r.unwrap()).unwrap();
        assert_eq!(r[0], 1, "{r:?}");
    }
    let info: Vec<String> = redis::cmd("TB.INFO").arg("old").query(&mut c).unwrap();
    assert!(
        info[1].starts_with('4'),
        "old gave two more tokens: {info:?}"
    );
}

#[test]
fn a_replica_past_maxmemory_still_applies_the_masters_state() {
    let m = Server::start();
    let r = replica_of(&m, ServerConfig::default());
    let mut rc = r.conn();
    // Far past its limit: one byte.
    config_set(&mut rc, "maxmemory", "1");
    // The replica ignores maxmemory for the replication stream (Redis'
    // default replica-ignore-maxmemory yes), so state still arrives.
    let mut mc = m.conn();
    let r1: Vec<i64> = redis::from_redis_value(&consume(&mut mc, "k", 3).unwrap()).unwrap();
    assert_eq!(r1[..2], [1, 7]);
    sync_replica(&mut mc);
    let on_master: Vec<String> = redis::cmd("TB.INFO").arg("k").query(&mut mc).unwrap();
    let on_replica: Vec<String> = redis::cmd("TB.INFO").arg("k").query(&mut rc).unwrap();
    assert_eq!(
        on_master[2..8],
        on_replica[2..8],
        "same capacity, rate and time"
    );
    assert_eq!(
        digest(&mut mc, "k"),
        digest(&mut rc, "k"),
        "identical state"
    );
}
