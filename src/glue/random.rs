//! Unguessable numbers for lease ids, from the server's CSPRNG.

use redis_module::raw;

/// A random 64-bit number from `RedisModule_GetRandomBytes`: the server's
/// cryptographically secure generator (seeded from `/dev/urandom`), so
/// nothing a client sees predicts it.
pub fn u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: the API pointers are set by RedisModule_Init; the buffer is
    // 8 writable bytes, the length given.
    unsafe { raw::RedisModule_GetRandomBytes.unwrap()(bytes.as_mut_ptr(), bytes.len()) };
    u64::from_ne_bytes(bytes)
}
