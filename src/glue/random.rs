//! Unguessable numbers for lease ids, from the server's CSPRNG.

use std::cell::RefCell;

use redis_module::raw;

/// Numbers drawn per read of the system's generator: one `getrandom` call
/// for many numbers.
const POOL: usize = 32;

thread_local! {
    /// Numbers drawn and not handed out yet, and how many are left. Only the
    /// main thread grants leases.
    static DRAWN: RefCell<([u64; POOL], usize)> = const { RefCell::new(([0; POOL], 0)) };
}

/// A random 64-bit number from the operating system's CSPRNG (`getrandom`,
/// the `getrandom` crate), or, should that fail, from
/// `RedisModule_GetRandomBytes` (the server's, seeded from `/dev/urandom`,
/// which runs an HMAC-SHA256 per 32 bytes: ten times the instructions of a
/// whole TB.CONSUME per number), so nothing a client sees predicts it.
/// Each number is handed out once.
pub fn u64() -> u64 {
    DRAWN.with(|d| {
        let (pool, left) = &mut *d.borrow_mut();
        if *left == 0 {
            let mut bytes = [0u8; POOL * 8];
            if getrandom::fill(&mut bytes).is_err() {
                // SAFETY: the API pointers are set by RedisModule_Init; the
                // buffer is that many writable bytes.
                unsafe {
                    raw::RedisModule_GetRandomBytes.unwrap()(bytes.as_mut_ptr(), bytes.len())
                };
            }
            for (n, chunk) in pool.iter_mut().zip(bytes.chunks_exact(8)) {
                let mut eight = [0u8; 8];
                eight.copy_from_slice(chunk);
                *n = u64::from_ne_bytes(eight);
            }
            *left = POOL;
        }
        *left -= 1;
        let n = pool[*left];
        pool[*left] = 0;
        n
    })
}
