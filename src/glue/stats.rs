//! The `INFO tb` section: counters since start (zeroed by `TB.CONFIG
//! RESETSTAT`, not by `CONFIG RESETSTAT`, which modules cannot see), the
//! histogram of granted waits, gauges, and the current settings (so that a
//! user allowed `INFO` but not `CONFIG` or `TB.CONFIG` can read them).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use redis_module::{InfoContext, RedisResult};
use redis_module_macros::info_command_handler;

use super::entry::guard;
use crate::bucket::{Kind, Outcome};
use crate::settings;

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

/// Upper bounds (inclusive, in ms) of the buckets of the granted-wait
/// histogram: how long a granted request was told to wait before using its
/// tokens (0 when granted at once, `retry_after_ms` of a reservation). Waits
/// above the last bound count only in the `+Inf` bucket.
pub const WAIT_BOUNDS_MS: [u64; 16] = [
    0, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000,
];

/// Granted waits per bucket (not cumulative; the last one is above every
/// bound), their sum in ms.
static WAITS: [AtomicU64; WAIT_BOUNDS_MS.len() + 1] =
    [const { AtomicU64::new(0) }; WAIT_BOUNDS_MS.len() + 1];
static WAIT_SUM_MS: AtomicU64 = AtomicU64::new(0);

/// Records one granted request told to wait `wait_ms` (0: served at once).
/// A binary search over 16 bounds and two relaxed additions.
fn record_wait(wait_ms: i64) {
    let ms = wait_ms.max(0) as u64;
    let i = WAIT_BOUNDS_MS.partition_point(|&bound| bound < ms);
    WAITS[i].fetch_add(1, Ordering::Relaxed);
    WAIT_SUM_MS.fetch_add(ms, Ordering::Relaxed);
}

/// Records one consume outcome for a request of `n` tokens.
pub fn record(o: &Outcome, n: u64) {
    CALLS.add(1);
    match o.kind {
        Kind::Allowed | Kind::Reserved => {
            ALLOWED.add(1);
            TOKENS_GRANTED.add(o.granted);
            if o.kind == Kind::Reserved {
                RESERVATIONS.add(1);
                record_wait(o.retry_after_ms);
            } else {
                record_wait(0);
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

/// Records one multi-bucket request of kind `kind` (never a peek) that
/// took `tokens` and waits `retry_after_ms`; `partial`: an `ATMOST`
/// request granted less than it asked.
pub fn record_multi(kind: Kind, retry_after_ms: i64, tokens: u64, partial: bool) {
    CALLS.add(1);
    match kind {
        Kind::Allowed | Kind::Reserved => {
            ALLOWED.add(1);
            if partial {
                PARTIAL_GRANTS.add(1);
            }
            TOKENS_GRANTED.add(tokens);
            if kind == Kind::Reserved {
                RESERVATIONS.add(1);
                record_wait(retry_after_ms);
            } else {
                record_wait(0);
            }
        }
        Kind::Denied | Kind::Peek => DENIED.add(1),
        Kind::Never => {
            DENIED.add(1);
            NEVER.add(1);
        }
    }
}

/// Zeroes every counter and the wait histogram.
pub fn reset() {
    for c in ALL {
        c.value.store(0, Ordering::Relaxed);
    }
    for w in &WAITS {
        w.store(0, Ordering::Relaxed);
    }
    WAIT_SUM_MS.store(0, Ordering::Relaxed);
    super::top::reset();
}

/// The `INFO tb` section (header `# tb`; Redis prefixes each field with
/// `tb_`). Every value is an integer, so any INFO reader or the Prometheus
/// exporter script can take them all. docs/operations/metrics.md lists the fields.
#[info_command_handler]
fn info(ctx: &InfoContext, _for_crash_report: bool) -> RedisResult<()> {
    guard(Ok(()), || {
        // The empty name is the module's own section, `# tb`.
        let mut section = ctx.builder().add_section("");
        for c in ALL {
            section = section.field(c.name, c.get().to_string())?;
        }
        let mut cumulative = 0;
        for (i, w) in WAITS.iter().enumerate() {
            cumulative += w.load(Ordering::Relaxed);
            let name = match WAIT_BOUNDS_MS.get(i) {
                Some(bound) => format!("wait_ms_le_{bound}"),
                None => "wait_ms_le_inf".to_string(),
            };
            section = section.field(&name, cumulative.to_string())?;
        }
        section = section.field(
            "wait_ms_sum",
            WAIT_SUM_MS.load(Ordering::Relaxed).to_string(),
        )?;
        section = section.field("wait_ms_count", cumulative.to_string())?;
        section = section.field(
            "blocked_now",
            BLOCKED_NOW.load(Ordering::Relaxed).to_string(),
        )?;
        section = section.field("waiting_calls", super::lease_wait::count().to_string())?;
        section = section.field("waiting_flows", super::lease_wait::flow_count().to_string())?;
        section = section.field(
            "eviction_policy_can_evict_buckets",
            u8::from(super::eviction::can_evict_buckets()).to_string(),
        )?;
        for s in settings::ALL {
            section = section.field(&s.name.replace('-', "_"), s.get().to_string())?;
        }
        section.build_section()?.build_info()?;
        Ok(())
    })
}
