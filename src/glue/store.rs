//! Key access and the write path: store a bucket, set its expiry, replicate
//! the resulting state.

use std::cell::{Cell, RefCell};
use std::os::raw::{c_longlong, c_void};

use redis_module::raw;

use super::config;
use super::datatype::{self, tb_type};
use super::entry::CmdError;
use crate::bucket::{Bucket, Expiry};
use crate::codec::wire;
use crate::lease::{self, Leases};

/// Name of the internal command that sets a bucket's absolute state; it is
/// what replicas and the AOF receive instead of the client's command.
pub const SETSTATE: &std::ffi::CStr = c"TB.SETSTATE";

/// An open key, closed on drop. One lookup serves the whole command.
pub struct BucketKey {
    key: *mut raw::RedisModuleKey,
    name: *mut raw::RedisModuleString,
    /// The stored value found by [`BucketKey::get`] (null if none), so that
    /// [`BucketKey::put`] writes it in place without asking Redis again.
    value: Cell<*mut c_void>,
    /// The leases of the stored bucket as [`BucketKey::get`] read them,
    /// changed by the command and written back by [`BucketKey::put`].
    leases: RefCell<Leases>,
}

impl BucketKey {
    /// Opens `name` for reading, or for reading and writing.
    pub fn open(
        ctx: *mut raw::RedisModuleCtx,
        name: *mut raw::RedisModuleString,
        write: bool,
    ) -> Self {
        let mode = if write {
            raw::KeyMode::READ | raw::KeyMode::WRITE
        } else {
            raw::KeyMode::READ
        };
        // SAFETY: ctx and name are live for this command; the key is closed in Drop.
        let key = unsafe { raw::RedisModule_OpenKey.unwrap()(ctx, name, mode.bits()) }.cast();
        BucketKey {
            key,
            name,
            value: Cell::new(std::ptr::null_mut()),
            leases: RefCell::new(Leases::default()),
        }
    }

    /// The key's name.
    pub fn name(&self) -> *mut raw::RedisModuleString {
        self.name
    }

    /// The bucket stored under this key: `None` for a missing key, WRONGTYPE
    /// for a key of another type.
    pub fn get(&self) -> Result<Option<Bucket>, CmdError> {
        let found = self.value_ptr()?;
        self.value.set(found.unwrap_or(std::ptr::null_mut()));
        // SAFETY: a non-null value of our type is a live value of datatype.rs.
        *self.leases.borrow_mut() =
            found.map_or_else(Leases::default, |p| unsafe { datatype::read_leases(p) });
        // SAFETY: as above.
        Ok(found.map(|p| unsafe { datatype::read_value(p) }))
    }

    /// [`BucketKey::get`] as of `now_us`: the tokens of leases expired by
    /// then are back in the bucket, and those leases are gone from
    /// [`BucketKey::leases`] (written with the next [`commit`]; until then
    /// the stored state still has them, which reads the same).
    pub fn get_at(&self, now_us: i64) -> Result<Option<Bucket>, CmdError> {
        let stored = self.get()?;
        Ok(stored.map(|mut b| {
            self.leases.borrow_mut().expire(&mut b, now_us);
            b
        }))
    }

    /// The leases held on this key (as of [`BucketKey::get_at`]'s time).
    pub fn leases(&self) -> std::cell::RefMut<'_, Leases> {
        self.leases.borrow_mut()
    }

    fn value_ptr(&self) -> Result<Option<*mut c_void>, CmdError> {
        // SAFETY: self.key is an open key (NULL for a missing key opened
        // read-only, which KeyType reports as empty).
        unsafe {
            let kind = raw::RedisModule_KeyType.unwrap()(self.key);
            if kind == raw::REDISMODULE_KEYTYPE_EMPTY as i32 {
                return Ok(None);
            }
            if kind != raw::REDISMODULE_KEYTYPE_MODULE as i32
                || raw::RedisModule_ModuleTypeGetType.unwrap()(self.key) != tb_type()
            {
                return Err(CmdError::WrongType);
            }
            let value = raw::RedisModule_ModuleTypeGetValue.unwrap()(self.key);
            Ok((!value.is_null()).then_some(value))
        }
    }

    /// Stores `b`, in place when [`BucketKey::get`] found a bucket whose
    /// value has the form `b` takes (packed or wide), else as a new value
    /// that replaces the old one (keeping the key's expiry). The caller has
    /// checked the key's type with `get` first.
    pub fn put(&self, b: &Bucket) {
        let existing = self.value.get();
        let leases = self.leases.borrow();
        // SAFETY: `get` found this live value under the still-open key, and
        // no reference to it is held.
        if !existing.is_null() && unsafe { datatype::write_value(existing, b, &leases) } {
            return;
        }
        let value = datatype::new_value(b, &leases);
        // SAFETY: the key is open for writing and holds our type's `existing`
        // value, or nothing; Redis owns `value` from here on and frees it
        // through the type's free callback; the replaced value is ours to free.
        let status = unsafe {
            if existing.is_null() {
                raw::RedisModule_ModuleTypeSetValue.unwrap()(self.key, tb_type(), value)
            } else {
                let mut old = std::ptr::null_mut();
                let status = raw::RedisModule_ModuleTypeReplaceValue.unwrap()(
                    self.key,
                    tb_type(),
                    value,
                    &mut old,
                );
                if status == raw::Status::Ok as i32 && !old.is_null() {
                    datatype::free_value(old);
                }
                status
            }
        };
        if status == raw::Status::Ok as i32 {
            self.value.set(value);
        } else {
            // SAFETY: Redis did not take ownership, so the value is still ours.
            unsafe { datatype::free_value(value) };
        }
    }

    /// Milliseconds until the key expires, or -1 without expiry.
    pub fn ttl_ms(&self) -> i64 {
        // SAFETY: self.key is an open key.
        let ttl = unsafe { raw::RedisModule_GetExpire.unwrap()(self.key) };
        if ttl == raw::REDISMODULE_NO_EXPIRE as c_longlong {
            -1
        } else {
            ttl
        }
    }

    /// Sets the absolute expiry in ms, or removes it for 0.
    pub fn set_expire_at(&self, at_ms: i64) {
        // SAFETY: self.key is open for writing and holds a value.
        unsafe {
            if at_ms > 0 {
                raw::RedisModule_SetAbsExpire.unwrap()(self.key, at_ms);
            } else {
                raw::RedisModule_SetExpire.unwrap()(
                    self.key,
                    raw::REDISMODULE_NO_EXPIRE as c_longlong,
                );
            }
        }
    }

    /// Replaces the leases [`BucketKey::put`] writes.
    pub fn set_leases(&self, leases: Leases) {
        *self.leases.borrow_mut() = leases;
    }

    /// Deletes the key.
    fn delete(&self) {
        self.value.set(std::ptr::null_mut());
        // SAFETY: self.key is open for writing.
        unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key) };
    }
}

impl Drop for BucketKey {
    fn drop(&mut self) {
        // SAFETY: the key was opened in `open` and is closed exactly once.
        unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
    }
}

/// The absolute expiry to store with `b` and its leases in ms (0: none), or
/// `None` when the bucket is full, holds no lease, and its key can simply
/// be deleted.
pub fn expire_at_ms(b: &Bucket, leases: &Leases) -> Option<i64> {
    if !config::expire_idle() {
        return Some(0);
    }
    match lease::key_expiry(b, leases) {
        Expiry::Now => None,
        Expiry::AtMs(ms) => Some(ms),
        Expiry::Never => Some(0),
    }
}

/// Writes `b` under `key` and replicates the resulting absolute state, so
/// replicas and the AOF never re-run a clock-dependent command.
pub fn commit(ctx: *mut raw::RedisModuleCtx, key: &BucketKey, b: &Bucket) {
    let at = expire_at_ms(b, &key.leases.borrow());
    match at {
        None => {
            key.delete();
            // SAFETY: ctx and the key name are live; format "s" = one RedisModuleString.
            unsafe {
                raw::RedisModule_Replicate.unwrap()(ctx, c"DEL".as_ptr(), c"s".as_ptr(), key.name())
            };
        }
        Some(at_ms) => {
            key.put(b);
            key.set_expire_at(at_ms);
            replicate_state(ctx, key.name(), b, &key.leases.borrow(), at_ms);
        }
    }
    // SAFETY: ctx and the key name are live for this command.
    unsafe { raw::RedisModule_SignalModifiedKey.unwrap()(ctx, key.name()) };
}

/// Replicates `TB.SETSTATE key state`, with the state in its compact binary
/// form ([`wire`]): about a third of the bytes of the decimal form, and one
/// string object for Redis to build instead of six.
fn replicate_state(
    ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    b: &Bucket,
    leases: &Leases,
    at_ms: i64,
) {
    let mut buf = Vec::with_capacity(wire::MAX_LEN);
    wire::encode_state(b, leases, at_ms, &mut buf);
    let len = buf.len();
    // SAFETY: ctx and name are live; the format string matches the arguments:
    // s = RedisModuleString*, b = (char*, size_t).
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx,
            SETSTATE.as_ptr(),
            c"sb".as_ptr(),
            name,
            buf.as_ptr(),
            len,
        )
    };
}
