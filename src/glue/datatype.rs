//! The `tb-bucket` data type: the value Redis holds for a key, RDB save/load,
//! AOF rewrite, digest, memory usage, copy and free. Every callback is guarded
//! against panics.
//!
//! The value is one allocation in one of two forms, told apart by bit 0 of
//! its first word: the 32-byte packed form ([`packed`]) for every realistic
//! bucket, or the wide form (a tag word, the [`Bucket`] and its [`Leases`])
//! for states that do not fit or that handed out leases, chosen again at
//! every write.

use std::os::raw::{c_int, c_void};

use redis_module::native_types::RedisType;
use redis_module::raw;

use super::entry::guard;
use super::setstate::{self, State};
use crate::bucket::Bucket;
use crate::codec::{packed, rdb_v1, rdb_v2};
use crate::lease::Leases;

/// RDB encoding version of a bucket. Versions 2 and 3 save the [`rdb_v2`]
/// string (version 3 may hold leases in the wire tag 3, which a module
/// that only knows version 2 must refuse rather than misread); version 1
/// (six integers, [`rdb_v1`]) is still loaded. Bump it when the layout
/// changes and keep loading the older versions.
pub const ENCODING_VERSION: i32 = 3;

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

/// First word of the wide form (bit 0 set; the packed form has it clear).
const WIDE: u64 = 1;
/// Bit of the wide form's first word set while an open key holds its
/// leases ([`take_leases`]).
const LENT: u64 = 2;

/// The wide form of a value: 64 bytes, the leases' pointer in what would
/// be the padding before the 16-byte-aligned bucket, so a wide bucket that
/// never lent a token costs no more than it did before leases.
#[repr(C)]
struct Wide {
    /// Always [`WIDE`].
    tag: u64,
    /// The leases, if the bucket ever handed one out.
    leases: Option<Box<Leases>>,
    bucket: Bucket,
}

const _: () = assert!(
    std::mem::size_of::<Wide>() == 64,
    "the wide form stays 64 bytes"
);

/// The leases as the wide form holds them.
fn boxed(leases: &Leases) -> Option<Box<Leases>> {
    (!leases.is_blank()).then(|| Box::new(leases.clone()))
}

/// A value as Redis holds it: points to a packed form or a wide form.
type Value = *mut c_void;

/// The packed form of `b` with `leases`, if it takes that form: a bucket
/// that never handed out a lease and fits 256 bits.
fn packs(b: &Bucket, leases: &Leases) -> Option<[u64; packed::WORDS]> {
    if leases.is_blank() {
        packed::pack(b)
    } else {
        None
    }
}

/// A new value holding `b` and `leases`, in the smallest form that holds
/// them exactly. Redis owns it once it is set on a key, and frees it
/// through [`free`].
pub fn new_value(b: &Bucket, leases: &Leases) -> Value {
    match packs(b, leases) {
        Some(words) => Box::into_raw(Box::new(words)).cast(),
        None => Box::into_raw(Box::new(Wide {
            tag: WIDE,
            bucket: *b,
            leases: boxed(leases),
        }))
        .cast(),
    }
}

/// Whether `v` is the wide form.
///
/// # Safety
/// `v` was made by [`new_value`] and is live.
unsafe fn is_wide(v: Value) -> bool {
    // SAFETY: both forms start with an aligned u64 (repr(C) Wide, [u64; 4]).
    unsafe { *v.cast::<u64>() & 1 == WIDE }
}

/// The bucket in `v`.
///
/// # Safety
/// `v` was made by [`new_value`] and is live.
pub unsafe fn read_value(v: Value) -> Bucket {
    // SAFETY: the tag says which form `v` points to.
    unsafe {
        if is_wide(v) {
            (*v.cast::<Wide>()).bucket
        } else {
            packed::unpack(&*v.cast::<[u64; packed::WORDS]>())
        }
    }
}

/// The leases in `v` (blank for the packed form), a copy.
///
/// # Safety
/// `v` was made by [`new_value`] and is live.
pub unsafe fn read_leases(v: Value) -> Leases {
    // SAFETY: the tag says which form `v` points to.
    unsafe {
        if is_wide(v) {
            assert!(
                (*v.cast::<Wide>()).tag & LENT == 0,
                "a bucket's leases read while an open key holds them"
            );
            (*v.cast::<Wide>())
                .leases
                .as_deref()
                .cloned()
                .unwrap_or_default()
        } else {
            Leases::default()
        }
    }
}

/// Moves the leases out of `v` (O(1): the list is not copied) for an open
/// key to change, marking `v` until [`return_leases`] gives them back; a
/// copy read meanwhile would be wrong, so it panics instead.
///
/// # Safety
/// `v` was made by [`new_value`], is live, and nothing else refers to it.
pub unsafe fn take_leases(v: Value) -> Leases {
    // SAFETY: the tag says which form `v` points to; it is not shared.
    unsafe {
        if !is_wide(v) {
            return Leases::default();
        }
        let w = &mut *v.cast::<Wide>();
        assert!(w.tag & LENT == 0, "a bucket's leases taken twice");
        w.tag |= LENT;
        w.leases
            .as_deref_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }
}

/// Gives `leases` to `v`, the value an open key's leases belong to now
/// (taken by [`take_leases`] from it, or from the value it replaced);
/// reuses the list's box when there is one.
///
/// # Safety
/// `v` was made by [`new_value`] or [`new_shell`], is live, nothing else
/// refers to it, and its form is the one `leases` take (see [`packs`]).
pub unsafe fn return_leases(v: Value, leases: Leases) {
    // SAFETY: the tag says which form `v` points to; it is not shared.
    unsafe {
        if !is_wide(v) {
            debug_assert!(leases.is_blank(), "the packed form holds no lease");
            return;
        }
        let w = &mut *v.cast::<Wide>();
        w.tag &= !LENT;
        match (&mut w.leases, leases.is_blank()) {
            (_, true) => w.leases = None,
            (Some(held), false) => **held = leases,
            (None, false) => w.leases = Some(Box::new(leases)),
        }
    }
}

/// A new value for `b` in the form `b` with `leases` takes, without the
/// leases: an open key gives them with [`return_leases`].
pub fn new_shell(b: &Bucket, leases: &Leases) -> Value {
    match packs(b, leases) {
        Some(words) => Box::into_raw(Box::new(words)).cast(),
        None => Box::into_raw(Box::new(Wide {
            tag: WIDE | LENT,
            bucket: *b,
            leases: None,
        }))
        .cast(),
    }
}

/// Writes `b` into `v` when `v`'s form is the one `b` with `leases` takes;
/// false if the form changes (the caller then replaces the value with
/// [`new_shell`]). The leases themselves are given by [`return_leases`].
///
/// # Safety
/// `v` was made by [`new_value`] or [`new_shell`], is live, and nothing
/// else refers to it.
pub unsafe fn write_value(v: Value, b: &Bucket, leases: &Leases) -> bool {
    // SAFETY: the tag says which form `v` points to; it is not shared.
    unsafe {
        match (is_wide(v), packs(b, leases)) {
            (false, Some(words)) => *v.cast::<[u64; packed::WORDS]>() = words,
            (true, None) => (*v.cast::<Wide>()).bucket = *b,
            _ => return false,
        }
    }
    true
}

/// Frees a value made by [`new_value`].
///
/// # Safety
/// `v` was made by [`new_value`], is live, and is freed once.
pub unsafe fn free_value(v: Value) {
    // SAFETY: the tag says which Box `v` came from.
    unsafe {
        if is_wide(v) {
            drop(Box::from_raw(v.cast::<Wide>()));
        } else {
            drop(Box::from_raw(v.cast::<[u64; packed::WORDS]>()));
        }
    }
}

extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let loaded = match encver {
            1 => load_v1(rdb).map(|b| (b, Leases::default())),
            2 | 3 => load_v2(rdb),
            v if v > ENCODING_VERSION => {
                redis_module::logging::log_warning(format!(
                    "tb: a tb-bucket value was written by a newer tb (encoding version {v}; \
                     this build reads 1 to {ENCODING_VERSION}): load this data with that \
                     version of tb or newer"
                ));
                return std::ptr::null_mut();
            }
            _ => None,
        };
        match loaded {
            Some((b, leases)) => new_value(&b, &leases),
            None => {
                redis_module::logging::log_warning(
                    "tb: rejected a corrupt or truncated tb-bucket value",
                );
                std::ptr::null_mut()
            }
        }
    })
}

/// Reads a version 1 value; `None` on a short read (I/O errors are handled
/// by the module, see `HANDLE_IO_ERRORS` at load) or an invalid state.
fn load_v1(rdb: *mut raw::RedisModuleIO) -> Option<Bucket> {
    let mut fields = [0u64; 6];
    for (i, f) in fields.iter_mut().enumerate() {
        *f = if i == 2 {
            raw::load_signed(rdb).ok()? as u64
        } else {
            raw::load_unsigned(rdb).ok()?
        };
    }
    rdb_v1::decode(fields)
}

/// Reads a version 2 value: one string, longer than any valid one refused.
fn load_v2(rdb: *mut raw::RedisModuleIO) -> Option<(Bucket, Leases)> {
    let mut len = 0;
    // SAFETY: rdb is the live I/O handle of this load; Redis returns a buffer
    // of `len` bytes it allocated (or NULL on an I/O error), freed below.
    let buf = unsafe { raw::RedisModule_LoadStringBuffer.unwrap()(rdb, &mut len) };
    if buf.is_null() || raw::is_io_error(rdb) {
        return None;
    }
    let b = if len <= rdb_v2::MAX_LEN_LEASES {
        // SAFETY: Redis guarantees `len` readable bytes at `buf`.
        rdb_v2::decode_state(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
    } else {
        None
    };
    // SAFETY: buf was allocated by Redis for this call and is freed once.
    unsafe { raw::RedisModule_Free.unwrap()(buf.cast()) };
    b
}

extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value created by this type.
        let (b, leases) = unsafe { (read_value(value), read_leases(value)) };
        let mut buf = Vec::with_capacity(rdb_v2::MAX_LEN);
        rdb_v2::encode_state(&b, &leases, &mut buf);
        raw::save_slice(rdb, &buf);
    })
}

/// Emits `TB.SETSTATE key state` with the compact state and no expiry
/// ([`crate::codec::wire`]); Redis itself appends `PEXPIREAT` for keys with an expiry.
extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    guard((), || {
        // SAFETY: Redis passes a value created by this type.
        let (b, leases) = unsafe { (read_value(value), read_leases(value)) };
        let state = State::Whole {
            bucket: &b,
            leases: &leases,
            expire_at_ms: 0,
        };
        // SAFETY: aof and key are this callback's live arguments.
        unsafe { setstate::emit_aof(aof, key, &state) };
    })
}

extern "C" fn mem_usage(value: *const c_void) -> usize {
    // SAFETY: Redis passes a value created by this type.
    if unsafe { is_wide(value.cast_mut()) } {
        // SAFETY: the tag says it is the wide form.
        let leases = unsafe { (*value.cast::<Wide>()).leases.as_deref() };
        std::mem::size_of::<Wide>()
            + leases.map_or(0, |l| std::mem::size_of::<Leases>() + l.heap_bytes())
    } else {
        std::mem::size_of::<[u64; packed::WORDS]>()
    }
}

/// The digest covers the bucket's fields and its leases, whatever its form
/// (the form follows from them, so master and replica always agree on it).
extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    guard((), || {
        // SAFETY: Redis passes a value created by this type and a live digest.
        unsafe {
            let b = read_value(value);
            let add = raw::RedisModule_DigestAddLongLong.unwrap();
            let t = b.tokens as u128;
            add(md, t as u64 as i64);
            add(md, (t >> 64) as u64 as i64);
            add(md, b.updated_us);
            add(md, b.rate.num() as i64);
            add(md, b.rate.den() as i64);
            add(md, b.capacity as i64);
            let leases = read_leases(value);
            for l in &leases.held {
                add(md, l.id as i64);
                add(md, (l.n << 1 | u64::from(l.keep)) as i64);
                add(md, l.expires_us);
            }
            raw::RedisModule_DigestEndSequence.unwrap()(md);
        }
    })
}

extern "C" fn free(value: *mut c_void) {
    guard((), || {
        // SAFETY: the value was made by new_value and Redis frees it exactly once.
        unsafe { free_value(value) };
    })
}

extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        // SAFETY: Redis passes a value created by this type.
        let (b, leases) = unsafe { (read_value(value.cast_mut()), read_leases(value.cast_mut())) };
        new_value(&b, &leases)
    })
}
