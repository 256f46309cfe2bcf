//! The `tb-bucket` data type: RDB save/load, AOF rewrite, digest, memory
//! usage, copy and free. Every callback is guarded against panics.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use super::entry::guard;
use super::store::SETSTATE;
use crate::bucket::{wire, Bucket, Rate};

/// RDB encoding version of a bucket. Bump it when the layout changes and keep
/// loading the older versions.
pub const ENCODING_VERSION: i32 = 1;

/// The module's data type (name exactly 9 characters, as Redis requires).
pub static TB_TYPE: RedisType = RedisType::new(
    "tb-bucket",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    },
);

/// The registered type pointer, for type checks on open keys.
pub fn tb_type() -> *mut raw::RedisModuleType {
    *TB_TYPE.raw_type.borrow()
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        if encver != ENCODING_VERSION {
            return std::ptr::null_mut();
        }
        match load_fields(rdb) {
            Some(b) if b.is_valid() => Box::into_raw(Box::new(b)).cast(),
            _ => {
                redis_module::logging::log_warning(
                    "tb: rejected a corrupt or truncated tb-bucket value",
                );
                std::ptr::null_mut()
            }
        }
    })
}

/// Reads one bucket; `None` on a short read (I/O errors are handled by the
/// module, see `HANDLE_IO_ERRORS` at load) or an impossible rate.
fn load_fields(rdb: *mut raw::RedisModuleIO) -> Option<Bucket> {
    let lo = raw::load_unsigned(rdb).ok()?;
    let hi = raw::load_unsigned(rdb).ok()?;
    let updated_us = raw::load_signed(rdb).ok()?;
    let num = raw::load_unsigned(rdb).ok()?;
    let den = raw::load_unsigned(rdb).ok()?;
    let capacity = raw::load_unsigned(rdb).ok()?;
    Some(Bucket {
        tokens: ((u128::from(hi) << 64) | u128::from(lo)) as i128,
        updated_us,
        rate: Rate::new(u128::from(num), u128::from(den))?,
        capacity,
    })
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value created by this type.
        let b = unsafe { &*value.cast::<Bucket>() };
        let t = b.tokens as u128;
        raw::save_unsigned(rdb, t as u64);
        raw::save_unsigned(rdb, (t >> 64) as u64);
        raw::save_signed(rdb, b.updated_us);
        raw::save_unsigned(rdb, b.rate.num());
        raw::save_unsigned(rdb, b.rate.den());
        raw::save_unsigned(rdb, b.capacity);
    })
}

/// Emits `TB.SETSTATE key state` with the compact state and no expiry
/// ([`wire`]); Redis itself appends `PEXPIREAT` for keys with an expiry.
extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard((), || {
        // SAFETY: Redis passes a value created by this type.
        let b = unsafe { &*value.cast::<Bucket>() };
        let mut buf = [0u8; wire::MAX_LEN];
        let len = wire::encode(b, 0, &mut buf);
        // SAFETY: the format string matches the arguments: s = RedisModuleString*,
        // b = (char*, size_t).
        unsafe {
            raw::RedisModule_EmitAOF.unwrap()(
                aof,
                SETSTATE.as_ptr(),
                c"sb".as_ptr(),
                key,
                buf.as_ptr(),
                len,
            )
        };
    })
}

extern "C" fn mem_usage(_value: *const c_void) -> usize {
    std::mem::size_of::<Bucket>()
}

extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value created by this type and a live digest.
        unsafe {
            let b = &*value.cast::<Bucket>();
            let add = raw::RedisModule_DigestAddLongLong.unwrap();
            let t = b.tokens as u128;
            add(md, t as u64 as i64);
            add(md, (t >> 64) as u64 as i64);
            add(md, b.updated_us);
            add(md, b.rate.num() as i64);
            add(md, b.rate.den() as i64);
            add(md, b.capacity as i64);
            raw::RedisModule_DigestEndSequence.unwrap()(md);
        }
    })
}

extern "C" fn free(value: *mut c_void) {
    guard((), || {
        // SAFETY: the value was created by Box::into_raw in this module and
        // Redis frees it exactly once.
        drop(unsafe { Box::from_raw(value.cast::<Bucket>()) });
    })
}

extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        // SAFETY: Redis passes a value created by this type.
        let b = unsafe { *value.cast::<Bucket>() };
        Box::into_raw(Box::new(b)).cast()
    })
}
