//! What an operator relies on: the real version in `MODULE LIST`, `INFO
//! modules` and `COMMAND DOCS`.

mod common;

use std::collections::HashMap;

use common::Server;
use redis::{Connection, Value};

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
