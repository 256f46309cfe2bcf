//! Key access and the write path: open a bucket's key (checking its type),
//! store a bucket, set its expiry, replicate the resulting state.
//!
//! Safe by construction: a [`BucketKey`] exists only after its key was
//! found to hold a bucket or nothing ([`Ctx::open_bucket`],
//! [`Ctx::read_bucket`]), and only a `BucketKey<Write>` has the methods
//! that change it, so writing a key whose type was not checked, or one
//! opened for reading, does not compile.

use std::cell::{Cell, RefCell, RefMut};
use std::marker::PhantomData;
use std::os::raw::{c_longlong, c_void};

use redis_module::raw;

use super::config;
use super::datatype::{self, tb_type};
use super::entry::{CmdError, Ctx, KeyName};
use super::setstate::{self, State};
use crate::bucket::{Bucket, Expiry};
use crate::errors::{self, ERR_OOM};
use crate::lease::{self, Delta, Leases};
use crate::waitq;

/// Marker of a key opened for reading only.
pub enum Read {}
/// Marker of a key opened for reading and writing.
pub enum Write {}

/// An open key holding a bucket or nothing (checked when it was opened),
/// closed on drop. One lookup serves the whole command.
pub struct BucketKey<'c, M> {
    ctx: &'c Ctx<'c>,
    /// The open key; NULL for a missing key opened read-only (which Redis
    /// treats as an empty key everywhere below).
    key: *mut raw::RedisModuleKey,
    name: KeyName<'c>,
    /// The bucket found when the key was opened.
    stored: Cell<Option<Bucket>>,
    /// The stored value found when the key was opened (null if none), so
    /// that [`BucketKey::put`] writes it in place without asking Redis again.
    value: Cell<*mut c_void>,
    /// The stored bucket's leases, as the command changes them. A key
    /// opened for writing moves them out of the value (no copy, whatever
    /// their number) and gives them back when it is dropped: as the
    /// command left them once it wrote ([`BucketKey::commit`]), else as it
    /// found them. So a bucket has one key open for writing at a time (a
    /// second open of it panics rather than read no leases).
    leases: RefCell<Leases>,
    /// Opened for writing: the leases are the value's own, moved out.
    write: bool,
    /// The command wrote the key: its leases are the state to give back.
    written: Cell<bool>,
    _mode: PhantomData<M>,
}

impl<'a> Ctx<'a> {
    /// Opens `name` for writing. WRONGTYPE if it holds something other than
    /// a bucket; OOM if it holds nothing and the server is past `maxmemory`
    /// (see [`Ctx::refuses_new_buckets`]); nothing has changed then.
    #[inline]
    pub fn open_bucket<'c>(&'c self, name: KeyName<'c>) -> Result<BucketKey<'c, Write>, CmdError> {
        let key = BucketKey::open(self, name, true)?;
        if key.stored.get().is_none() && self.refuses_new_buckets() {
            return Err(ERR_OOM.into());
        }
        Ok(key)
    }

    /// Opens `name` for a write that never creates a bucket and never grows
    /// one (TB.RELEASE): no OOM refusal, even past `maxmemory`. WRONGTYPE
    /// if it holds something other than a bucket.
    pub fn open_bucket_to_shrink<'c>(
        &'c self,
        name: KeyName<'c>,
    ) -> Result<BucketKey<'c, Write>, CmdError> {
        BucketKey::open(self, name, true)
    }

    /// Whether a new bucket would take memory past `maxmemory`. Redis
    /// refuses TB writes (`deny-oom`) then, but lets scripts and functions
    /// flagged `allow-oom` run them; this keeps those from creating buckets
    /// too, so no client path grows the buckets past `maxmemory`. Writes
    /// from the master and AOF loading are exempt, as Redis exempts them
    /// (`replica-ignore-maxmemory`). Asked only when a key is missing.
    fn refuses_new_buckets(&self) -> bool {
        // The cheap question first: used / maxmemory (0 without a limit)
        // rounds to at least 1 whenever used memory is at or past the limit.
        // SAFETY: the API pointers are set by RedisModule_Init; ctx is live.
        if unsafe { raw::RedisModule_GetUsedMemoryRatio.unwrap()() } < 1.0 {
            return false;
        }
        // SAFETY: ctx is the live context of this call.
        let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(self.as_ptr()) } as u32;
        let exempt = raw::REDISMODULE_CTX_FLAGS_REPLICATED
            | raw::REDISMODULE_CTX_FLAGS_LOADING
            | raw::REDISMODULE_CTX_FLAGS_ASYNC_LOADING;
        flags & raw::REDISMODULE_CTX_FLAGS_OOM != 0 && flags & exempt == 0
    }

    /// Opens `name` for reading. WRONGTYPE if it holds something other than
    /// a bucket.
    pub fn read_bucket<'c>(&'c self, name: KeyName<'c>) -> Result<BucketKey<'c, Read>, CmdError> {
        BucketKey::open(self, name, false)
    }

    /// Opens `name` for reading from a callback, without touching it: no
    /// LRU/LFU update and, where the server has the flag (7.2+), no lazy
    /// deletion of an expired key (an expired bucket reads as what it is
    /// then, a full one), so such a read changes and propagates nothing.
    pub(super) fn peek_bucket<'c>(
        &'c self,
        name: KeyName<'c>,
    ) -> Result<BucketKey<'c, Read>, CmdError> {
        // SAFETY: the API pointers are set by RedisModule_Init; main thread;
        // GetOpenKeyModesAll takes no argument.
        let supported = unsafe { raw::RedisModule_GetOpenKeyModesAll.map_or(0, |all| all()) };
        let quiet = (raw::REDISMODULE_OPEN_KEY_NOTOUCH | raw::REDISMODULE_OPEN_KEY_NOEXPIRE) as i32;
        BucketKey::open_with(self, name, raw::KeyMode::READ.bits() | (quiet & supported))
    }
}

impl<'c, M> BucketKey<'c, M> {
    /// Opens the key and checks its type (closing it again on WRONGTYPE).
    #[inline]
    fn open(ctx: &'c Ctx<'c>, name: KeyName<'c>, write: bool) -> Result<Self, CmdError> {
        let mode = if write {
            raw::KeyMode::READ | raw::KeyMode::WRITE
        } else {
            raw::KeyMode::READ
        };
        Self::open_with(ctx, name, mode.bits())
    }

    /// [`BucketKey::open`] with RedisModule_OpenKey's mode bits.
    #[inline]
    fn open_with(ctx: &'c Ctx<'c>, name: KeyName<'c>, mode: i32) -> Result<Self, CmdError> {
        // SAFETY: ctx and name are live for this call; the key is closed in Drop.
        let key =
            unsafe { raw::RedisModule_OpenKey.unwrap()(ctx.as_ptr(), name.as_ptr(), mode) }.cast();
        let k = BucketKey {
            ctx,
            key,
            name,
            stored: Cell::new(None),
            value: Cell::new(std::ptr::null_mut()),
            leases: RefCell::new(Leases::default()),
            write: mode & raw::KeyMode::WRITE.bits() != 0,
            written: Cell::new(false),
            _mode: PhantomData,
        };
        k.stored.set(k.get()?);
        Ok(k)
    }

    /// The bucket as stored when the key was opened, nothing expired: with
    /// [`BucketKey::leases`], the state [`crate::decide`] decides on (its
    /// [`crate::decide::expire`] brings both to now, together).
    pub fn stored(&self) -> Option<Bucket> {
        self.stored.get()
    }

    /// The leases held on this key: as stored until a command expires,
    /// grants or releases some (the write then stores them; a command that
    /// writes nothing leaves them as found).
    pub fn leases(&self) -> RefMut<'_, Leases> {
        self.leases.borrow_mut()
    }

    /// Milliseconds until the key expires, or -1 without expiry.
    pub fn ttl_ms(&self) -> i64 {
        // SAFETY: self.key is an open key (or NULL, which Redis accepts).
        let ttl = unsafe { raw::RedisModule_GetExpire.unwrap()(self.key) };
        if ttl == raw::REDISMODULE_NO_EXPIRE as c_longlong {
            -1
        } else {
            ttl
        }
    }

    /// The bucket stored under this key: `None` for a missing key, WRONGTYPE
    /// for a key of another type.
    fn get(&self) -> Result<Option<Bucket>, CmdError> {
        let found = self.value_ptr()?;
        self.value.set(found.unwrap_or(std::ptr::null_mut()));
        // SAFETY: a non-null value of our type is a live value of
        // datatype.rs, which this open key alone refers to while open; the
        // leases taken are given back in Drop.
        *self.leases.borrow_mut() = found.map_or_else(Leases::default, |p| unsafe {
            if self.write {
                datatype::take_leases(p)
            } else {
                datatype::read_leases(p)
            }
        });
        // SAFETY: as above.
        Ok(found.map(|p| unsafe { datatype::read_value(p) }))
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
}

/// An open key is the state a multi-bucket decision reads and changes in
/// place: its stored bucket and its leases (no copy, no runtime borrow).
impl<M> crate::decide::BucketState for BucketKey<'_, M> {
    fn stored(&self) -> Option<Bucket> {
        self.stored.get()
    }

    fn leases(&mut self) -> &mut Leases {
        self.leases.get_mut()
    }
}

impl<'c> BucketKey<'c, Write> {
    /// Writes `b` and replicates the resulting absolute state, so replicas
    /// and the AOF never re-run a clock-dependent command. A bucket that is
    /// full is deleted instead (a missing key reads as a full bucket).
    pub fn commit(&self, b: &Bucket) {
        self.ctx.mark_effects();
        self.written.set(true);
        let at = expire_at_ms(b, &self.leases.borrow()).map(|ms| {
            if FOR_QUEUE.get() {
                waitq::kept_expiry_ms(ms)
            } else {
                ms
            }
        });
        let deleted = match at {
            None => {
                self.leases.borrow_mut().clear_journal();
                self.delete();
                setstate::replicate(self.ctx, &self.name, &State::Delete);
                true
            }
            Some(at_ms) => {
                // A bucket that holds or held leases replicates the change
                // to them, not all of them.
                let delta = {
                    let mut leases = self.leases.borrow_mut();
                    let d = (leases.changed() || !leases.is_blank()).then(|| leases.delta());
                    leases.clear_journal();
                    d
                };
                self.put(b);
                self.set_expire_at(at_ms);
                self.replicate_state(b, at_ms, delta.as_ref());
                false
            }
        };
        self.signal_modified();
        self.notify_written(deleted && self.stored.get().is_some());
    }

    /// Stores `b` with the absolute expiry `at_ms` (0: none) exactly as
    /// given (TB.SETSTATE), and replicates the command as it came: it is
    /// deterministic.
    pub fn set_state(&self, b: &Bucket, leases: Leases, at_ms: i64) {
        self.ctx.mark_effects();
        self.written.set(true);
        *self.leases.borrow_mut() = leases;
        self.put(b);
        self.set_expire_at(at_ms);
        self.signal_modified();
        self.notify_written(false);
        // SAFETY: ctx is the live context of this call.
        unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(self.ctx.as_ptr()) };
    }

    /// Stores `b` with the absolute expiry `at_ms` (0: none) and applies
    /// the change `d` to the key's leases (TB.SETSTATE's tag 4), replicating
    /// the command as it came; refused, changing nothing, when `d` does not
    /// fit the leases the key holds.
    pub fn apply_delta(&self, b: &Bucket, d: &Delta, at_ms: i64) -> Result<(), CmdError> {
        if !self.leases.borrow_mut().apply(d) {
            return Err(errors::ERR_DELTA.into());
        }
        self.ctx.mark_effects();
        self.written.set(true);
        self.put(b);
        self.set_expire_at(at_ms);
        self.signal_modified();
        self.notify_written(false);
        // SAFETY: ctx is the live context of this call.
        unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(self.ctx.as_ptr()) };
        Ok(())
    }

    /// Deletes the bucket (TB.SETSTATE's deletion form; nothing if there is
    /// none), and replicates the command as it came.
    pub fn delete_state(&self) {
        self.ctx.mark_effects();
        self.written.set(true);
        if self.stored.get().is_some() {
            self.delete();
            self.signal_modified();
            self.notify_written(true);
        }
        // SAFETY: ctx is the live context of this call.
        unsafe { raw::RedisModule_ReplicateVerbatim.unwrap()(self.ctx.as_ptr()) };
    }

    /// Stores `b`, in place when the key held a bucket whose value has the
    /// form `b` takes with the key's leases (packed or wide), else as a new
    /// value that replaces the old one (keeping the key's expiry). The
    /// leases go to the value when the key is dropped.
    fn put(&self, b: &Bucket) {
        let existing = self.value.get();
        let leases = self.leases.borrow();
        // SAFETY: the key was opened with this value under it, still open,
        // and no reference to the value is held.
        if !existing.is_null() && unsafe { datatype::write_value(existing, b, &leases) } {
            return;
        }
        let value = datatype::new_shell(b, &leases);
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

    /// Sets the absolute expiry in ms, or removes it for 0.
    fn set_expire_at(&self, at_ms: i64) {
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

    /// Deletes the key.
    fn delete(&self) {
        self.value.set(std::ptr::null_mut());
        // SAFETY: self.key is open for writing.
        unsafe { raw::RedisModule_DeleteKey.unwrap()(self.key) };
    }

    /// Tells Redis the key changed (WATCH, client-side caching).
    fn signal_modified(&self) {
        // SAFETY: ctx and the key name are live for this call.
        unsafe {
            raw::RedisModule_SignalModifiedKey.unwrap()(self.ctx.as_ptr(), self.name.as_ptr())
        };
    }

    /// Publishes the keyspace notifications of a write: the command's own
    /// event (module class, `d`), and `del` (generic class, `g`) when the
    /// write deleted the key, as Redis' own commands do when they remove a
    /// key. Costs a function call and a flag test when notifications are
    /// off. (Redis publishes `expired` itself when a bucket's key expires.)
    fn notify_written(&self, deleted: bool) {
        // SAFETY: ctx and the key name are live; the event names are
        // NUL-terminated.
        unsafe {
            let notify = raw::RedisModule_NotifyKeyspaceEvent.unwrap();
            let (ctx, key) = (self.ctx.as_ptr(), self.name.as_ptr());
            notify(
                ctx,
                raw::REDISMODULE_NOTIFY_MODULE,
                self.ctx.event().as_ptr(),
                key,
            );
            if deleted {
                notify(ctx, raw::REDISMODULE_NOTIFY_GENERIC, c"del".as_ptr(), key);
            }
        }
    }

    /// Replicates `TB.SETSTATE key state`, with the state in its compact
    /// binary form ([`crate::codec::wire`]): about a third of the bytes of
    /// the decimal form, and one string object for Redis to build instead
    /// of six. With `delta`, the bucket and only that change to its leases.
    fn replicate_state(&self, b: &Bucket, at_ms: i64, delta: Option<&Delta>) {
        let state = match delta {
            Some(d) => State::Change {
                bucket: b,
                delta: d,
                expire_at_ms: at_ms,
            },
            None => State::Whole {
                bucket: b,
                leases: &Leases::default(),
                expire_at_ms: at_ms,
            },
        };
        setstate::replicate(self.ctx, &self.name, &state);
    }
}

impl<M> Drop for BucketKey<'_, M> {
    fn drop(&mut self) {
        if self.write {
            let mut leases = std::mem::take(self.leases.get_mut());
            if !self.written.get() {
                leases.undo_expiry();
            }
            let value = self.value.get();
            if !value.is_null() {
                // SAFETY: the value is the one the leases were taken from,
                // or the one `put` made for them, live under the open key.
                unsafe { datatype::return_leases(value, leases) };
            }
        }
        // SAFETY: the key was opened in `open` and is closed exactly once
        // (RedisModule_CloseKey accepts NULL).
        unsafe { raw::RedisModule_CloseKey.unwrap()(self.key) };
    }
}

thread_local! {
    /// Set while the wait queue tries a waiting call ([`for_queue`]).
    /// Main thread only.
    static FOR_QUEUE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, a waiting call's try by the wait queue: a key its grant writes
/// is kept [`waitq::KEEP_KEY_MS`] past its expiry, so the next in line is
/// granted as of the instant it could fit even when its timer runs late.
pub fn for_queue<T>(f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            FOR_QUEUE.set(false);
        }
    }
    FOR_QUEUE.set(true);
    let _reset = Reset;
    f()
}

/// The absolute expiry to store with `b` and its leases in ms (0: none), or
/// `None` when the bucket is full, holds no lease, and its key can simply
/// be deleted (see [`lease::key_expiry`]).
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
