//! Module settings. Each one is a native Redis module config (`CONFIG GET
//! tb.*`, `CONFIG SET`, redis.conf, `loadmodule` arguments) and is also served
//! by `TB.CONFIG GET/SET`; both read and write the same static.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::parse::{self, MAX_WAIT_MS};

/// `expire-idle`: a bucket's key expires when the bucket is full again.
pub static EXPIRE_IDLE: AtomicBool = AtomicBool::new(true);

/// Whether buckets' keys expire when full.
pub fn expire_idle() -> bool {
    EXPIRE_IDLE.load(Ordering::Relaxed)
}

/// `max-wait-ms`: the longest RESERVE or BLOCK wait accepted.
pub static MAX_WAIT: AtomicI64 = AtomicI64::new(DEFAULT_MAX_WAIT_MS);
/// Default of `max-wait-ms`: one minute.
pub const DEFAULT_MAX_WAIT_MS: i64 = 60_000;

/// `max-blocked`: clients blocked by BLOCK at most; past it, BLOCK requests
/// are answered at once, as RESERVE would answer them.
pub static MAX_BLOCKED: AtomicI64 = AtomicI64::new(DEFAULT_MAX_BLOCKED);
/// Default of `max-blocked`.
pub const DEFAULT_MAX_BLOCKED: i64 = 10_000;
/// Upper bound of `max-blocked`.
pub const MAX_MAX_BLOCKED: i64 = 1_000_000;

/// The `max-wait-ms` setting.
pub fn max_wait_ms() -> u64 {
    MAX_WAIT
        .load(Ordering::Relaxed)
        .clamp(0, MAX_WAIT_MS as i64) as u64
}

/// The `max-blocked` setting.
pub fn max_blocked() -> i64 {
    MAX_BLOCKED.load(Ordering::Relaxed)
}

/// One setting as `TB.CONFIG` sees it.
pub struct Setting {
    /// Name without the `tb.` prefix.
    pub name: &'static str,
    /// Current value as text.
    pub get: fn() -> String,
    /// Validates and applies a new value.
    pub set: fn(&[u8]) -> Result<(), &'static str>,
}

fn yes_no(v: bool) -> String {
    if v { "yes" } else { "no" }.to_string()
}

fn parse_yes_no(v: &[u8]) -> Result<bool, &'static str> {
    if v.eq_ignore_ascii_case(b"yes") {
        Ok(true)
    } else if v.eq_ignore_ascii_case(b"no") {
        Ok(false)
    } else {
        Err("ERR value must be yes or no")
    }
}

/// Every setting, in the order `TB.CONFIG GET *` lists them.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "expire-idle",
        get: || yes_no(expire_idle()),
        set: |v| parse_yes_no(v).map(|b| EXPIRE_IDLE.store(b, Ordering::Relaxed)),
    },
    Setting {
        name: "max-wait-ms",
        get: || max_wait_ms().to_string(),
        set: |v| {
            let ms = parse::integer(
                v,
                MAX_WAIT_MS,
                "ERR max-wait-ms must be an integer from 0 to 86400000",
            )?;
            MAX_WAIT.store(ms as i64, Ordering::Relaxed);
            Ok(())
        },
    },
    Setting {
        name: "max-blocked",
        get: || max_blocked().to_string(),
        set: |v| {
            let n = parse::integer(
                v,
                MAX_MAX_BLOCKED as u64,
                "ERR max-blocked must be an integer from 0 to 1000000",
            )?;
            MAX_BLOCKED.store(n as i64, Ordering::Relaxed);
            Ok(())
        },
    },
    Setting {
        name: "top-keys",
        get: || yes_no(super::top::enabled()),
        set: |v| parse_yes_no(v).map(|b| super::top::TOP_KEYS.store(b, Ordering::Relaxed)),
    },
];
