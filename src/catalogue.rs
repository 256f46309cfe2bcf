//! The protocol catalogue, `protocol/catalogue.json`: every command (name,
//! arity, flags, key spec, ACL categories, summary, arguments and syntax, as
//! the command specs in `commands/` declare them), every error line of
//! [`crate::errors`] (and, apart, its doc comment: when it is answered), the
//! limits below and the settings, read from the Rust that decides them.
//! `tools/catalogue.py` generates from it the Lua fallback's constants, the
//! clients' limits and error texts, and the manual's syntax lines and
//! tables of errors and settings; the agreement suites read it.
//!
//! Test-only: the test below fails when the committed file differs from the
//! source (run `make catalogue`), and writes it instead when
//! `TB_CATALOGUE_OUT` names a path (what `make catalogue` does).

use std::ffi::CStr;

use redis_module::raw;
use serde_json::{json, Map, Value};

use crate::glue::command::{Access, Arg, Arity, Keys, Spec};
use crate::{bucket, errors, fair, lease, parse, settings, topkeys};

/// Every limit a client or the Lua fallback needs, by name.
const LIMITS: &[(&str, u64)] = &[
    // Token counts, capacities, lease ids and amounts: 2^53 (exact doubles).
    ("MAX_AMOUNT", bucket::MAX_AMOUNT),
    ("MAX_RATE_NUM", bucket::MAX_RATE_NUM),
    ("MAX_RATE_DEN", bucket::MAX_RATE_DEN),
    ("MAX_WAIT_MS", parse::MAX_WAIT_MS),
    ("MAX_KEYS", parse::MAX_KEYS),
    ("MAX_LEASES", lease::MAX_LEASES as u64),
    ("MAX_TTL_MS", lease::MAX_TTL_MS),
    ("MAX_LEASE_ID", lease::MAX_ID),
    ("MAX_WEIGHT", fair::MAX_WEIGHT),
    ("MAX_FLOW_NAME", parse::MAX_FLOW_NAME as u64),
    ("TOP_CAPACITY", topkeys::TOP_CAPACITY as u64),
    ("MAX_BLOCKED_LIMIT", settings::MAX_BLOCKED_LIMIT),
];

/// A C string of the spec as UTF-8 (the specs are ASCII).
fn s(c: &CStr) -> String {
    c.to_string_lossy().into_owned()
}

/// The `COMMAND DOCS` type name of an argument.
fn arg_type(kind: raw::RedisModuleCommandArgType) -> &'static str {
    match kind {
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_KEY => "key",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_STRING => "string",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_INTEGER => "integer",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_DOUBLE => "double",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PATTERN => "pattern",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_UNIX_TIME => "unix-time",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_PURE_TOKEN => "pure-token",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_ONEOF => "oneof",
        raw::RedisModuleCommandArgType_REDISMODULE_ARG_TYPE_BLOCK => "block",
        _ => "unknown",
    }
}

fn optional(a: &Arg) -> bool {
    a.flags & raw::REDISMODULE_CMD_ARG_OPTIONAL != 0
}

fn multiple(a: &Arg) -> bool {
    a.flags & raw::REDISMODULE_CMD_ARG_MULTIPLE != 0
}

/// An argument as `COMMAND DOCS` shows it.
fn arg_json(a: &Arg) -> Value {
    let mut o = Map::new();
    o.insert("name".into(), s(a.name).into());
    o.insert("type".into(), arg_type(a.kind).into());
    if let Some(t) = a.token {
        o.insert("token".into(), s(t).into());
    }
    if optional(a) {
        o.insert("optional".into(), true.into());
    }
    if multiple(a) {
        o.insert("multiple".into(), true.into());
    }
    if !a.sub.is_empty() {
        o.insert(
            "arguments".into(),
            a.sub.iter().map(arg_json).collect::<Vec<_>>().into(),
        );
    }
    Value::Object(o)
}

/// An argument as the syntax line writes it, as Redis' docs do:
/// `[RESERVE reserve-ms | BLOCK block-ms]`, `key [key ...]`.
fn syntax(a: &Arg) -> String {
    let body = match arg_type(a.kind) {
        "pure-token" => String::new(),
        "oneof" => {
            let alts: Vec<_> = a.sub.iter().map(syntax).collect();
            let alts = alts.join(" | ");
            if optional(a) || a.token.is_some() {
                alts
            } else {
                format!("<{alts}>")
            }
        }
        "block" => a.sub.iter().map(syntax).collect::<Vec<_>>().join(" "),
        _ => s(a.name),
    };
    let one = match (a.token, body.is_empty()) {
        (Some(t), true) => s(t),
        (Some(t), false) => format!("{} {body}", s(t)),
        (None, _) => body,
    };
    let many = if multiple(a) {
        format!("{one} [{one} ...]")
    } else {
        one
    };
    if optional(a) {
        format!("[{many}]")
    } else {
        many
    }
}

fn arity_json(a: Arity) -> Value {
    let (min, max) = match a {
        Arity::Exactly(n) => (n, Some(n)),
        Arity::AtLeast(n) => (n, None),
        Arity::Between(lo, hi) => (lo, Some(hi)),
    };
    json!({ "min": min, "max": max })
}

fn keys_json(k: Keys) -> Value {
    let access = |a: Access| match a {
        Access::Read => "read",
        Access::Update => "update",
        Access::Overwrite => "overwrite",
    };
    match k {
        Keys::None => Value::Null,
        Keys::One(a) => json!({ "find": "argument 1", "access": access(a) }),
        Keys::Counted(a) => json!({
            "find": "numkeys at argument 1, then that many keys",
            "access": access(a),
        }),
    }
}

fn words(c: &CStr) -> Vec<String> {
    s(c).split_whitespace().map(str::to_owned).collect()
}

fn command_json(spec: &Spec) -> Value {
    let name = s(spec.name).to_uppercase();
    let args: Vec<String> = spec.args.iter().map(syntax).collect();
    json!({
        "name": name,
        "syntax": format!("{name} {}", args.join(" ")).trim_end(),
        "summary": s(spec.summary),
        "arity": arity_json(spec.arity),
        "flags": words(spec.flags),
        "acl_categories": words(spec.acl),
        "keys": keys_json(spec.keys),
        "arguments": spec.args.iter().map(arg_json).collect::<Vec<_>>(),
    })
}

/// The whole catalogue, as the committed file holds it.
pub fn render() -> String {
    let commands: Vec<_> = crate::commands::ALL
        .iter()
        .map(|r| command_json(r.spec()))
        .collect();
    let errors: Map<_, _> = errors::ALL
        .iter()
        .map(|e| (e.name.to_owned(), Value::from(e.text)))
        .collect();
    let error_docs: Map<_, _> = errors::ALL
        .iter()
        .map(|e| {
            let doc = e.doc.split_whitespace().collect::<Vec<_>>().join(" ");
            (e.name.to_owned(), Value::from(doc))
        })
        .collect();
    let limits: Map<_, _> = LIMITS
        .iter()
        .map(|&(n, v)| (n.to_owned(), Value::from(v)))
        .collect();
    let settings: Map<_, _> = settings::ALL
        .iter()
        .map(|st| {
            let (kind, max) = match st.kind {
                settings::Kind::Bool => ("bool", None),
                settings::Kind::Int { max } => ("int", Some(max)),
            };
            let v = json!({
                "kind": kind,
                "default": st.default,
                "max": max,
                "summary": st.summary,
            });
            (st.name.to_owned(), v)
        })
        .collect();
    let all = json!({
        "generated": "by make catalogue from the Rust source (src/catalogue.rs); do not edit",
        "commands": commands,
        "errors": errors,
        "error_docs": error_docs,
        "limits": limits,
        "settings": settings,
    });
    let mut out = serde_json::to_string_pretty(&all).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed catalogue is the one the source gives; with
    /// `TB_CATALOGUE_OUT=path`, writes it there instead.
    #[test]
    fn catalogue_is_current() {
        let text = render();
        if let Some(out) = std::env::var_os("TB_CATALOGUE_OUT") {
            std::fs::write(&out, &text).expect("write the catalogue");
            return;
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/protocol/catalogue.json");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == text,
            "protocol/catalogue.json is stale (or missing): run `make catalogue`, \
             then commit what it regenerates"
        );
    }

    #[test]
    fn syntax_lines_read_as_the_docs_write_them() {
        use crate::glue::command::{block, integer, key, one_of, pure_token, string};
        let wait = [
            integer(c"reserve-ms").token(c"RESERVE"),
            integer(c"block-ms").token(c"BLOCK"),
        ];
        let wait = Box::leak(Box::new(wait));
        let limit = Box::leak(Box::new([string(c"rate"), integer(c"n")]));
        let lease = [integer(c"ttl-ms"), pure_token(c"keep", c"KEEP").optional()];
        let lease = Box::leak(Box::new(lease));
        let metric = [
            pure_token(c"denied", c"DENIED"),
            pure_token(c"waits", c"WAITS"),
        ];
        let metric = Box::leak(Box::new(metric));
        let cases = [
            (key(c"key").multiple(), "key [key ...]"),
            (integer(c"n").optional(), "[n]"),
            (
                one_of(c"wait", wait).optional(),
                "[RESERVE reserve-ms | BLOCK block-ms]",
            ),
            (one_of(c"metric", metric), "<DENIED | WAITS>"),
            (block(c"limit", limit).multiple(), "rate n [rate n ...]"),
            (
                block(c"lease", lease).token(c"LEASE").optional(),
                "[LEASE ttl-ms [KEEP]]",
            ),
            (
                integer(c"count").token(c"COUNT").optional(),
                "[COUNT count]",
            ),
        ];
        for (arg, want) in cases {
            assert_eq!(syntax(&arg), want);
        }
    }
}
