//! Whether the server's eviction policy can evict rate-limit buckets.
//!
//! An evicted bucket reads as a missing key, which is a full bucket: eviction
//! hands out tokens. `allkeys-*` policies can evict any bucket; `volatile-*`
//! policies evict keys with a TTL, and buckets carry one while `expire-idle`
//! is on. Safe: `noeviction`, or `volatile-*` with `tb.expire-idle no`.
//!
//! The policy is read from `INFO memory` through the module API (not the
//! `CONFIG` command, which `rename-command` can rename or remove) at load,
//! whenever `CONFIG SET` changes it or `tb.expire-idle` (config change
//! event), and when `TB.CONFIG SET` changes `expire-idle`. A warning goes to
//! the log when the combination can evict buckets, and `INFO tb` shows it as
//! `eviction_policy_can_evict_buckets`.

use std::ffi::CStr;
use std::sync::atomic::{AtomicU8, Ordering};

use redis_module::{raw, Context};
use redis_module_macros::config_changed_event_handler;

use super::entry::guard;
use super::{config, log};

/// The policy could not be read (treated as able to evict).
const UNKNOWN: u8 = 0;
/// `noeviction`.
const NO_EVICTION: u8 = 1;
/// `allkeys-*`: any key can be evicted.
const ALL_KEYS: u8 = 2;
/// `volatile-*`: keys with a TTL can be evicted.
const VOLATILE: u8 = 3;

/// The last policy read, as one of the constants above.
static POLICY: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Whether the current policy (with the current `expire-idle`) can evict
/// buckets.
pub fn can_evict_buckets() -> bool {
    match POLICY.load(Ordering::Relaxed) {
        NO_EVICTION => false,
        VOLATILE => config::expire_idle(),
        _ => true,
    }
}

/// The class of a `maxmemory-policy` value.
fn classify(policy: &str) -> u8 {
    if policy.eq_ignore_ascii_case("noeviction") {
        NO_EVICTION
    } else if policy.starts_with("allkeys-") {
        ALL_KEYS
    } else if policy.starts_with("volatile-") {
        VOLATILE
    } else {
        UNKNOWN
    }
}

/// `maxmemory-policy`, from the `maxmemory_policy` field of `INFO memory`.
fn read_policy() -> Option<String> {
    server_info_field(c"memory", c"maxmemory_policy")
}

/// One field of an `INFO` section, read through the module API.
pub fn server_info_field(section: &CStr, field: &CStr) -> Option<String> {
    // SAFETY: the API pointers are filled by RedisModule_Init. A NULL context
    // is allowed for GetServerInfo and FreeServerInfo (no automatic memory);
    // the field's C string lives until FreeServerInfo, and is copied first.
    unsafe {
        let (get, get_field, free) = (
            raw::RedisModule_GetServerInfo?,
            raw::RedisModule_ServerInfoGetFieldC?,
            raw::RedisModule_FreeServerInfo?,
        );
        let info = get(std::ptr::null_mut(), section.as_ptr());
        if info.is_null() {
            return None;
        }
        let value = get_field(info, field.as_ptr());
        let text = (!value.is_null()).then(|| CStr::from_ptr(value).to_string_lossy().into_owned());
        free(std::ptr::null_mut(), info);
        text
    }
}

/// Reads the policy again and logs a warning if it can evict buckets.
/// Never panics (a panic is caught and leaves the policy unknown).
pub fn refresh() {
    guard((), || {
        let policy = read_policy();
        let class = policy.as_deref().map_or(UNKNOWN, classify);
        POLICY.store(class, Ordering::Relaxed);
        if !can_evict_buckets() {
            return;
        }
        let shown = policy.as_deref().unwrap_or("(unreadable)");
        log::warning(&format!(
            "tb: maxmemory-policy {shown} can evict rate-limit buckets under maxmemory, and an \
             evicted bucket comes back full (it hands out tokens). Use noeviction, or a \
             volatile-* policy with tb.expire-idle no."
        ));
    })
}

/// Re-reads the policy when `CONFIG SET` changes it or `tb.expire-idle`.
#[config_changed_event_handler]
fn config_changed(_ctx: &Context, names: &[&str]) {
    guard((), || {
        let relevant = names.iter().any(|n| {
            n.eq_ignore_ascii_case("maxmemory-policy") || n.eq_ignore_ascii_case("tb.expire-idle")
        });
        if relevant {
            refresh();
        }
    })
}
