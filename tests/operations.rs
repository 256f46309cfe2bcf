//! What an operator relies on: module arguments and `tb.*` config lines that
//! are checked (a mistake refuses the load, with a log line that says what
//! is wrong), the real version in `MODULE LIST`, `INFO modules` and `COMMAND
//! DOCS`, the `INFO tb` section (settings, the granted-wait histogram,
//! RESETSTAT), and the eviction check that works without the `CONFIG`
//! command.

mod common;

use std::collections::HashMap;

use common::{Server, ServerConfig};
use redis::{Connection, Value};

/// The settings line every refusal lists.
const VALID: &str = "Valid module arguments: expire-idle yes|no, max-wait-ms 0..86400000, \
                     max-blocked 0..1000000, top-keys yes|no";

fn with_module_args(args: &[&str]) -> ServerConfig {
    ServerConfig {
        module_args: args.iter().map(|a| a.to_string()).collect(),
        ..ServerConfig::default()
    }
}

fn with_server_args(args: &[&str]) -> ServerConfig {
    ServerConfig {
        args: args.iter().map(|a| a.to_string()).collect(),
        ..ServerConfig::default()
    }
}

/// `INFO tb` as field -> value (every value is an integer).
fn info_tb(c: &mut Connection) -> HashMap<String, i64> {
    let text: String = redis::cmd("INFO").arg("tb").query(c).unwrap();
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| {
            let n = v
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("INFO tb field {k} is not an integer ({v:?}): {e}"));
            (k.to_string(), n)
        })
        .collect()
}

fn query<T: redis::FromRedisValue>(c: &mut Connection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(c)
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")))
}

/// The crate version as Redis encodes module versions.
fn encoded_crate_version() -> i64 {
    let part = |s: &str| s.parse::<i64>().unwrap();
    part(env!("CARGO_PKG_VERSION_MAJOR")) * 10_000
        + part(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + part(env!("CARGO_PKG_VERSION_PATCH"))
}

#[test]
fn each_malformed_module_argument_refuses_the_load_and_says_why() {
    let cases: [(&[&str], &str); 7] = [
        (
            &["max-wait", "10000"],
            "unknown module argument 'max-wait'.",
        ),
        (
            &["tb.max-wait-ms", "10000"],
            "unknown module argument 'tb.max-wait-ms' (module arguments take the name without \
             'tb.': 'max-wait-ms'",
        ),
        (
            &["EXPIRE-IDLE", "NO"],
            "unknown module argument 'EXPIRE-IDLE' (names are lower case: 'expire-idle')",
        ),
        (
            &["max-wait-ms"],
            "module argument 'max-wait-ms' has no value",
        ),
        (
            &["max-wait-ms", "ten"],
            "bad value 'ten' for module argument 'max-wait-ms': max-wait-ms must be an integer \
             from 0 to 86400000",
        ),
        (
            &["expire-idle", "false"],
            "bad value 'false' for module argument 'expire-idle': expire-idle must be yes or no",
        ),
        (
            &["max-blocked", "1000001"],
            "bad value '1000001' for module argument 'max-blocked'",
        ),
    ];
    for (args, expected) in cases {
        let log = Server::start_refused(with_module_args(args));
        let line = log
            .lines()
            .find(|l| l.contains("tb: refusing to load: "))
            .unwrap_or_else(|| panic!("{args:?}: no refusal line in the log:\n{log}"));
        assert!(line.contains(expected), "{args:?}: {line}");
        assert!(line.contains(VALID), "{args:?}: {line}");
    }
}

#[test]
fn a_percent_sign_in_an_argument_is_logged_as_text() {
    let log = Server::start_refused(with_module_args(&["max-wait-ms", "%s%s%s%n"]));
    assert!(
        log.contains("bad value '%s%s%s%n' for module argument 'max-wait-ms'"),
        "{log}"
    );
}

#[test]
fn a_bad_tb_config_line_refuses_the_load() {
    let log = Server::start_refused(with_server_args(&["--tb.max-wait-ms", "ten"]));
    assert!(
        log.contains(
            "tb: refusing to load: a tb.* config line or MODULE LOADEX config has a bad value"
        ),
        "{log}"
    );
}

#[test]
fn a_misspelled_setting_in_redis_conf_is_named_with_its_line() {
    let dir = tempfile::tempdir().expect("a directory for redis.conf");
    let conf = dir.path().join("redis.conf");
    std::fs::write(
        &conf,
        "# rate limits\ntb.expire-idle yes\ntb.max-wait 10000\n",
    )
    .expect("write redis.conf");
    let log = Server::start_refused(ServerConfig {
        config_file: Some(conf.clone()),
        ..Default::default()
    });
    let expected = format!(
        "tb: refusing to load: {} line 3: unknown setting 'tb.max-wait' (did you mean \
         'tb.max-wait-ms'?)",
        conf.display()
    );
    assert!(log.contains(&expected), "{log}");
}

#[test]
fn module_arguments_are_defaults_and_config_lines_override_them() {
    let s = Server::start_with(ServerConfig {
        module_args: [
            "expire-idle",
            "no",
            "max-wait-ms",
            "10000",
            "max-blocked",
            "7",
        ]
        .map(String::from)
        .to_vec(),
        args: ["--tb.max-wait-ms", "5000"].map(String::from).to_vec(),
        ..ServerConfig::default()
    });
    let mut c = s.conn();
    let got: Vec<String> = query(&mut c, &["CONFIG", "GET", "tb.*"]);
    let got: HashMap<_, _> = got
        .chunks(2)
        .map(|p| (p[0].clone(), p[1].clone()))
        .collect();
    let want: HashMap<_, _> = [
        ("tb.expire-idle", "no"),
        ("tb.max-wait-ms", "5000"),
        ("tb.max-blocked", "7"),
        ("tb.top-keys", "yes"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .into();
    assert_eq!(got, want);
    // Redis checks native values against the same bounds.
    let e = redis::cmd("CONFIG")
        .arg("SET")
        .arg("tb.max-wait-ms")
        .arg("86400001")
        .query::<()>(&mut c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("86400000"), "{e}");
    let e = redis::cmd("TB.CONFIG")
        .arg("SET")
        .arg("max-wait-ms")
        .arg("86400001")
        .query::<()>(&mut c)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("max-wait-ms must be an integer from 0 to 86400000"),
        "{e}"
    );
}

#[test]
fn module_list_info_modules_and_command_docs_show_the_crate_version() {
    let s = Server::start();
    let mut c = s.conn();
    let modules: Vec<HashMap<String, Value>> = query(&mut c, &["MODULE", "LIST"]);
    let tb = modules
        .iter()
        .find(|m| m.get("name") == Some(&Value::BulkString(b"tb".to_vec())))
        .expect("tb in MODULE LIST");
    let ver: i64 = redis::from_redis_value(&tb["ver"]).unwrap();
    assert_eq!(ver, encoded_crate_version());
    let info: String = query(&mut c, &["INFO", "modules"]);
    assert!(
        info.contains(&format!("module:name=tb,ver={},", encoded_crate_version())),
        "{info}"
    );
    // COMMAND DOCS: every command's `since` is a released version not after
    // this one (0.1.0, the first release).
    let names = [
        "tb.consume",
        "tb.mconsume",
        "tb.refund",
        "tb.info",
        "tb.config",
        "tb.setstate",
        "cl.throttle",
    ];
    for name in names {
        let docs: HashMap<String, HashMap<String, Value>> =
            query(&mut c, &["COMMAND", "DOCS", name]);
        let doc = &docs[name];
        let since: String = redis::from_redis_value(&doc["since"]).unwrap();
        assert_eq!(since, "0.1.0", "{name}");
        let module: String = redis::from_redis_value(&doc["module"]).unwrap();
        assert_eq!(module, "tb", "{name}");
    }
    assert!(encoded_crate_version() >= 100);
}

#[test]
fn info_tb_is_one_section_named_tb_with_the_settings() {
    let s = Server::start_with(with_module_args(&[
        "expire-idle",
        "no",
        "max-wait-ms",
        "10000",
    ]));
    let mut c = s.conn();
    let text: String = query(&mut c, &["INFO", "tb"]);
    let headers: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(headers, ["# tb"], "{text}");
    let i = info_tb(&mut c);
    assert_eq!(i["tb_expire_idle"], 0);
    assert_eq!(i["tb_max_wait_ms"], 10_000);
    assert_eq!(i["tb_max_blocked"], 10_000);
    let _: () = query(&mut c, &["TB.CONFIG", "SET", "max-blocked", "3"]);
    let _: () = query(&mut c, &["CONFIG", "SET", "tb.expire-idle", "yes"]);
    let i = info_tb(&mut c);
    assert_eq!((i["tb_max_blocked"], i["tb_expire_idle"]), (3, 1));
    // The section is also in INFO everything and INFO modules, not plain INFO.
    let everything: String = query(&mut c, &["INFO", "everything"]);
    assert!(everything.contains("# tb\r\n"), "{everything}");
    let plain: String = query(&mut c, &["INFO"]);
    assert!(!plain.contains("tb_calls"), "{plain}");
}

/// The histogram fields of `INFO tb` for the waits in `waits`, as docs/operations/metrics.md
/// defines them: cumulative buckets, the `+Inf` one, sum and count.
fn expected_histogram(waits: &[i64]) -> HashMap<String, i64> {
    let bounds = [
        0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000,
    ];
    let mut out: HashMap<String, i64> = bounds
        .iter()
        .map(|b| {
            let n = waits.iter().filter(|&&w| w <= *b).count() as i64;
            (format!("tb_wait_ms_le_{b}"), n)
        })
        .collect();
    out.insert("tb_wait_ms_le_inf".into(), waits.len() as i64);
    out.insert("tb_wait_ms_count".into(), waits.len() as i64);
    out.insert("tb_wait_ms_sum".into(), waits.iter().sum());
    out
}

#[test]
fn granted_waits_fill_the_histogram_and_only_tb_config_resetstat_zeroes_it() {
    let s = Server::start_with(with_module_args(&["max-wait-ms", "600000"]));
    let mut c = s.conn();
    let mut waits = Vec::new();
    // The wait the reply of a granted request told its caller.
    let grant = |c: &mut Connection, args: &[&str], wait_at: usize| -> i64 {
        let r: Vec<i64> = query(c, args);
        assert_eq!(r[0], 1, "{args:?} granted: {r:?}");
        r[wait_at]
    };
    // Served at once (wait 0), by each command that grants.
    waits.push(grant(&mut c, &["TB.CONSUME", "h", "1", "3"], 2));
    let throttle: Vec<i64> = query(&mut c, &["CL.THROTTLE", "cl", "1", "1", "1"]);
    assert_eq!(throttle[0], 0, "CL.THROTTLE not limited: {throttle:?}");
    waits.push(0);
    // Reservations on an empty bucket at 1 token/s: about 1 s, 2 s, 3 s
    // (each wait is the one the reply told the caller).
    waits.push(grant(&mut c, &["TB.CONSUME", "h", "1", "3", "2"], 2));
    for _ in 0..3 {
        waits.push(grant(
            &mut c,
            &["TB.CONSUME", "h", "1", "3", "1", "RESERVE", "600000"],
            2,
        ));
    }
    waits.push(grant(
        &mut c,
        &["TB.MCONSUME", "1", "m", "0.01", "1", "1"],
        1,
    ));
    let reserve_multi = [
        "TB.MCONSUME",
        "1",
        "m",
        "0.01",
        "1",
        "1",
        "RESERVE",
        "600000",
    ];
    waits.push(grant(&mut c, &reserve_multi, 1));
    // Denials and peeks are not grants.
    let denied: Vec<i64> = query(&mut c, &["TB.CONSUME", "h", "1", "3", "1"]);
    assert_eq!(denied[0], 0);
    let _: Vec<i64> = query(&mut c, &["TB.CONSUME", "h", "1", "3", "0"]);
    assert!(waits[3..6].iter().all(|&w| w > 0), "{waits:?}");
    assert!(waits[7] > 60_000, "{waits:?}");

    let i = info_tb(&mut c);
    for (field, want) in expected_histogram(&waits) {
        assert_eq!(i[&field], want, "{field} for waits {waits:?}");
    }
    assert_eq!(i["tb_allowed"], waits.len() as i64);

    // CONFIG RESETSTAT cannot reach a module's counters; TB.CONFIG RESETSTAT
    // zeroes them all, the histogram included.
    let _: () = query(&mut c, &["CONFIG", "RESETSTAT"]);
    assert_eq!(info_tb(&mut c)["tb_wait_ms_count"], waits.len() as i64);
    let _: () = query(&mut c, &["TB.CONFIG", "RESETSTAT"]);
    let i = info_tb(&mut c);
    for (field, _) in expected_histogram(&waits) {
        assert_eq!(i[&field], 0, "{field}");
    }
    assert_eq!((i["tb_calls"], i["tb_allowed"]), (0, 0));
}

#[test]
fn a_renamed_config_command_does_not_hide_the_eviction_policy() {
    for rename in ["", "secret-config"] {
        let s = Server::start_with(with_server_args(&[
            "--rename-command",
            "CONFIG",
            rename,
            "--maxmemory-policy",
            "noeviction",
        ]));
        let mut c = s.conn();
        assert_eq!(
            info_tb(&mut c)["tb_eviction_policy_can_evict_buckets"],
            0,
            "CONFIG renamed to {rename:?}"
        );
        assert!(
            !s.log().contains("can evict rate-limit buckets"),
            "{}",
            s.log()
        );
        if !rename.is_empty() {
            // A change through the renamed command is still seen.
            let _: () = query(&mut c, &[rename, "SET", "maxmemory-policy", "allkeys-lru"]);
            assert_eq!(info_tb(&mut c)["tb_eviction_policy_can_evict_buckets"], 1);
            assert!(
                s.log().contains("maxmemory-policy allkeys-lru can evict"),
                "{}",
                s.log()
            );
        }
    }
}

#[test]
fn tb_config_set_expire_idle_warns_like_config_set() {
    const WARNING: &str = "maxmemory-policy volatile-lru can evict rate-limit buckets";
    let s = Server::start_with(ServerConfig {
        module_args: vec!["expire-idle".into(), "no".into()],
        args: vec!["--maxmemory-policy".into(), "volatile-lru".into()],
        ..ServerConfig::default()
    });
    let mut c = s.conn();
    let warnings = |s: &Server| s.log().matches(WARNING).count();
    assert_eq!(warnings(&s), 0, "{}", s.log());
    assert_eq!(info_tb(&mut c)["tb_eviction_policy_can_evict_buckets"], 0);
    let _: () = query(&mut c, &["TB.CONFIG", "SET", "expire-idle", "yes"]);
    assert_eq!(info_tb(&mut c)["tb_eviction_policy_can_evict_buckets"], 1);
    assert_eq!(warnings(&s), 1, "{}", s.log());
    // The native path warns the same way.
    let _: () = query(&mut c, &["CONFIG", "SET", "tb.expire-idle", "no"]);
    let _: () = query(&mut c, &["CONFIG", "SET", "tb.expire-idle", "yes"]);
    assert_eq!(warnings(&s), 2, "{}", s.log());
}

#[test]
fn the_api_probe_finds_what_the_server_has() {
    // Every supported server has these (Redis 7.0's API and older).
    for f in ["CreateCommand", "RegisterNumericConfig", "GetServerInfo"] {
        assert!(common::server_has_api(f), "{f}");
    }
    assert!(!common::server_has_api("NoSuchFunction"));
    // A 7.2 function is there exactly when the server applies the ACL
    // categories the module declares (COMMAND INFO's categories).
    let s = Server::start();
    let mut c = s.conn();
    let info: Vec<Value> = query(&mut c, &["COMMAND", "INFO", "tb.consume"]);
    let categories = format!("{info:?}").contains("@write");
    assert_eq!(
        common::server_has_api("SetCommandACLCategories"),
        categories,
        "{info:?}"
    );
}
