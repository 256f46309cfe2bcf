//! The server clock, read once per command.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::raw;

/// Server time in microseconds since the Unix epoch.
///
/// Uses the cached microsecond clock on Redis 7.2+ (stable for a whole
/// command, MULTI/EXEC or script) and the millisecond clock on 7.0, where no
/// cached clock is exposed to modules. Callers read it once per command and
/// pass the value down, so every key in one command sees the same instant.
/// Inside [`as_of`], the earlier of that instant and the clock.
pub fn now_us() -> i64 {
    let now = server_now_us();
    AS_OF.with(Cell::get).map_or(now, |at| at.min(now))
}

/// The server's clock, whatever [`as_of`] says.
pub fn server_now_us() -> i64 {
    // SAFETY: the API pointers are written once by RedisModule_Init before any
    // command runs and only read afterwards, all on the main thread.
    unsafe {
        match raw::RedisModule_CachedMicroseconds {
            Some(cached) => cached(),
            None => match raw::RedisModule_Milliseconds {
                Some(ms) => ms() * 1000,
                None => 0,
            },
        }
    }
}

/// The server's clock read to the microsecond, for timers that must run at
/// an instant of it: the cached clock on Redis 7.2+, and on 7.0 the wall
/// clock whose whole milliseconds [`server_now_us`] reads there
/// (`gettimeofday`, which `RM_Milliseconds` truncates). A timer set from
/// the truncated reading ran up to 1 ms after its instant.
pub fn fine_now_us() -> i64 {
    // SAFETY: as in `server_now_us`.
    if let Some(cached) = unsafe { raw::RedisModule_CachedMicroseconds } {
        // SAFETY: as in `server_now_us`.
        return unsafe { cached() };
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_micros()).ok())
        .unwrap_or_else(server_now_us)
}

/// The step of the server's clock in µs: 1,000 on Redis 7.0 (whole
/// milliseconds), else 1. A timer for an instant runs at the first step at
/// or after it, when the server's clock reads it.
pub fn tick_us() -> i64 {
    // SAFETY: as in `server_now_us`.
    if unsafe { raw::RedisModule_CachedMicroseconds }.is_some() {
        1
    } else {
        1000
    }
}

thread_local! {
    /// The instant [`as_of`] reads the clock at, while it runs. Main thread.
    static AS_OF: Cell<Option<i64>> = const { Cell::new(None) };
}

/// Runs `f` with [`now_us`] reading `at_us` (when that is earlier than the
/// clock): a waiting call whose timer ran late is granted as of the moment
/// it could first fit (`glue::lease_wait`), so a late timer wastes no
/// refill. Safe for the admission bound: the tokens existed then, and a
/// bucket's stored time never moves backwards (a read before it counts no
/// refill, as after a clock step back).
pub fn as_of<T>(at_us: i64, f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            AS_OF.with(|a| a.set(None));
        }
    }
    AS_OF.with(|a| a.set(Some(at_us)));
    let _reset = Reset;
    f()
}
