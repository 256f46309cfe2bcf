//! The server clock, read once per command.

use redis_module::raw;

/// Server time in microseconds since the Unix epoch.
///
/// Uses the cached microsecond clock on Redis 7.2+ (stable for a whole
/// command, MULTI/EXEC or script) and the millisecond clock on 7.0, where no
/// cached clock is exposed to modules. Callers read it once per command and
/// pass the value down, so every key in one command sees the same instant.
pub fn now_us() -> i64 {
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
