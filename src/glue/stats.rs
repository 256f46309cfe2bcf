//! Counters since start, shown by `INFO tb` and zeroed by `TB.CONFIG RESETSTAT`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use super::entry::guard;
use crate::bucket::{Kind, Outcome};

/// One named counter.
pub struct Counter {
    /// Field name in `INFO tb` (prefixed `tb_` by Redis).
    pub name: &'static str,
    value: AtomicU64,
}

impl Counter {
    const fn new(name: &'static str) -> Self {
        Counter {
            name,
            value: AtomicU64::new(0),
        }
    }

    /// Adds `n`.
    pub fn add(&self, n: u64) {
        self.value.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value.
    pub fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// Consume requests answered.
pub static CALLS: Counter = Counter::new("calls");
/// Requests granted (now or reserved).
pub static ALLOWED: Counter = Counter::new("allowed");
/// Requests denied (including never-satisfiable ones).
pub static DENIED: Counter = Counter::new("denied");
/// Requests with n = 0.
pub static PEEKS: Counter = Counter::new("peeks");
/// Requests that can never succeed.
pub static NEVER: Counter = Counter::new("never_satisfiable");
/// Tokens granted in total.
pub static TOKENS_GRANTED: Counter = Counter::new("tokens_granted");

/// Requests granted into debt (RESERVE, BLOCK, MCONSUME with RESERVE).
pub static RESERVATIONS: Counter = Counter::new("reservations");
/// ATMOST requests granted fewer tokens than asked.
pub static PARTIAL_GRANTS: Counter = Counter::new("partial_grants");
/// Clients ever blocked by BLOCK.
pub static BLOCKED_TOTAL: Counter = Counter::new("blocked_total");
/// TB.REFUND calls that gave tokens back.
pub static REFUNDS: Counter = Counter::new("refunds");

/// Every counter, in `INFO tb` order.
pub static ALL: [&Counter; 10] = [
    &CALLS,
    &ALLOWED,
    &DENIED,
    &PEEKS,
    &NEVER,
    &TOKENS_GRANTED,
    &RESERVATIONS,
    &PARTIAL_GRANTS,
    &BLOCKED_TOTAL,
    &REFUNDS,
];

/// Clients blocked right now (a gauge, not reset by RESETSTAT).
pub static BLOCKED_NOW: AtomicI64 = AtomicI64::new(0);

/// Records one consume outcome for a request of `n` tokens.
pub fn record(o: &Outcome, n: u64) {
    CALLS.add(1);
    match o.kind {
        Kind::Allowed | Kind::Reserved => {
            ALLOWED.add(1);
            TOKENS_GRANTED.add(o.granted);
            if o.kind == Kind::Reserved {
                RESERVATIONS.add(1);
            }
            if o.granted < n {
                PARTIAL_GRANTS.add(1);
            }
        }
        Kind::Denied => DENIED.add(1),
        Kind::Never => {
            DENIED.add(1);
            NEVER.add(1);
        }
        Kind::Peek => PEEKS.add(1),
    }
}

/// Records one multi-bucket request.
pub fn record_multi(allowed: bool, retry_after_ms: i64, tokens: u64) {
    CALLS.add(1);
    if allowed {
        ALLOWED.add(1);
        TOKENS_GRANTED.add(tokens);
        if retry_after_ms > 0 {
            RESERVATIONS.add(1);
        }
    } else {
        DENIED.add(1);
        if retry_after_ms < 0 {
            NEVER.add(1);
        }
    }
}

/// Zeroes every counter.
pub fn reset() {
    for c in ALL {
        c.value.store(0, Ordering::Relaxed);
    }
    super::top::reset();
}

#[info_command_handler]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    guard(Ok(()), || {
        let mut section = ctx.builder().add_section("stats");
        for c in ALL {
            section = section.field(c.name, c.get().to_string())?;
        }
        section = section.field(
            "blocked_now",
            BLOCKED_NOW.load(Ordering::Relaxed).to_string(),
        )?;
        section = section.field(
            "eviction_policy_can_evict_buckets",
            u8::from(super::eviction::can_evict_buckets()).to_string(),
        )?;
        section.build_section()?.build_info()?;
        Ok(())
    })
}
