//! Module settings. Each one is a native Redis module config (`CONFIG GET
//! tb.*`, `CONFIG SET`, redis.conf, `loadmodule` arguments) and is also served
//! by `TB.CONFIG GET/SET`; both read and write the same static.

use std::sync::atomic::{AtomicBool, Ordering};

/// `expire-idle`: a bucket's key expires when the bucket is full again.
pub static EXPIRE_IDLE: AtomicBool = AtomicBool::new(true);

/// Whether buckets' keys expire when full.
pub fn expire_idle() -> bool {
    EXPIRE_IDLE.load(Ordering::Relaxed)
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
pub const SETTINGS: &[Setting] = &[Setting {
    name: "expire-idle",
    get: || yes_no(expire_idle()),
    set: |v| parse_yes_no(v).map(|b| EXPIRE_IDLE.store(b, Ordering::Relaxed)),
}];
