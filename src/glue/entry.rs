//! What a command handler sees of one call: its context ([`Ctx`]), its
//! arguments ([`Args`], [`KeyName`]) and its error type ([`CmdError`]).
//!
//! Each borrows Redis' objects for the call only (the lifetime `'a`) and
//! keeps the raw pointer private to the glue, so `commands/` holds no raw
//! pointer and needs no `unsafe`. [`super::command`] creates them, runs the
//! handler and turns its errors (and panics) into error replies.

use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use redis_module::raw;

use super::reply::Replier;
use crate::parse::{self, ArgsError};

/// A command failure, sent to the client as an error reply. Handlers return
/// it before changing anything.
#[derive(Debug)]
pub enum CmdError {
    /// A fixed message, including its error code.
    Msg(&'static str),
    /// A formatted message, including its error code.
    Owned(String),
    /// Wrong number of arguments for the command.
    WrongArity,
    /// The key holds another type.
    WrongType,
}

impl From<&'static str> for CmdError {
    fn from(m: &'static str) -> Self {
        CmdError::Msg(m)
    }
}

impl From<ArgsError> for CmdError {
    fn from(e: ArgsError) -> Self {
        match e {
            ArgsError::Invalid(m) => CmdError::Msg(m),
            ArgsError::WrongArity => CmdError::WrongArity,
        }
    }
}

/// Result of a command handler: it has replied when `Ok`.
pub type CmdResult = Result<(), CmdError>;

/// A key name among a call's arguments.
#[derive(Clone, Copy)]
pub struct KeyName<'a> {
    ptr: NonNull<raw::RedisModuleString>,
    _call: PhantomData<&'a raw::RedisModuleString>,
}

impl KeyName<'_> {
    /// A key name held by the glue beyond a call (see `blocking`).
    ///
    /// # Safety
    /// `ptr` must stay a live string for the lifetime of the result.
    pub(super) unsafe fn from_raw(ptr: NonNull<raw::RedisModuleString>) -> Self {
        KeyName {
            ptr,
            _call: PhantomData,
        }
    }

    /// The Redis string, for the glue's API calls.
    pub(super) fn as_ptr(&self) -> *mut raw::RedisModuleString {
        self.ptr.as_ptr()
    }
}

/// The bytes of a live Redis string.
#[inline]
fn string_bytes<'a>(s: NonNull<raw::RedisModuleString>) -> &'a [u8] {
    let mut len = 0;
    let ptr = raw::string_ptr_len(s.as_ptr(), &mut len);
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: Redis keeps the string, and so its buffer of `len` bytes,
    // alive and unchanged for the whole call; callers tie `'a` to the call.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
}

/// A call's arguments, the command name at 0.
pub struct Args<'a> {
    argv: &'a [NonNull<raw::RedisModuleString>],
}

impl<'a> Args<'a> {
    /// Wraps the argv Redis passed to a command.
    ///
    /// # Safety
    /// `argv` must point to `argc` live strings that outlive `'a`.
    pub(super) unsafe fn new(argv: *mut *mut raw::RedisModuleString, argc: i32) -> Args<'a> {
        let argv = if argv.is_null() || argc <= 0 {
            &[][..]
        } else {
            // SAFETY: the caller guarantees `argc` valid string pointers;
            // NonNull has the layout of a raw pointer, and Redis never
            // passes a null argument.
            unsafe { std::slice::from_raw_parts(argv.cast(), argc as usize) }
        };
        Args { argv }
    }

    /// Number of arguments, the command name included.
    pub fn len(&self) -> usize {
        self.argv.len()
    }

    /// Argument `i` as bytes (any bytes, not necessarily UTF-8).
    #[inline]
    pub fn bytes(&self, i: usize) -> &'a [u8] {
        string_bytes(self.argv[i])
    }

    /// Argument `i` as a key name.
    pub fn key(&self, i: usize) -> KeyName<'a> {
        KeyName {
            ptr: self.argv[i],
            _call: PhantomData,
        }
    }
}

impl<'a> parse::Argv<'a> for Args<'a> {
    #[inline]
    fn count(&self) -> usize {
        self.len()
    }

    #[inline]
    fn arg(&self, i: usize) -> &'a [u8] {
        self.bytes(i)
    }
}

/// The context of one call: what a handler may do with Redis.
pub struct Ctx<'a> {
    ptr: NonNull<raw::RedisModuleCtx>,
    /// The command's name: the event of its keyspace notifications.
    event: &'static CStr,
    /// Set before the call changes anything (see [`Ctx::may_have_effects`]).
    effects: Cell<bool>,
    _call: PhantomData<&'a mut raw::RedisModuleCtx>,
}

impl<'a> Ctx<'a> {
    /// Wraps the context Redis passed to the command named `event` (or to a
    /// callback on that command's behalf).
    ///
    /// # Safety
    /// `ptr` must be the live context of the current call, valid for `'a`.
    pub(super) unsafe fn new(ptr: NonNull<raw::RedisModuleCtx>, event: &'static CStr) -> Self {
        Ctx {
            ptr,
            event,
            effects: Cell::new(false),
            _call: PhantomData,
        }
    }

    /// The raw context, for the glue's API calls.
    pub(super) fn as_ptr(&self) -> *mut raw::RedisModuleCtx {
        self.ptr.as_ptr()
    }

    /// The event name of the call's keyspace notifications: its command's
    /// name.
    pub(super) fn event(&self) -> &'static CStr {
        self.event
    }

    /// Records that the call is about to change data (or replicate); glue
    /// calls it before every write.
    pub(super) fn mark_effects(&self) {
        self.effects.set(true);
    }

    /// Whether the call may have changed data.
    pub(super) fn may_have_effects(&self) -> bool {
        self.effects.get()
    }

    /// Replies to the caller.
    pub fn reply(&self) -> Replier<'_> {
        Replier::new(self)
    }
}

/// Runs `f` for a Redis callback that has no client to reply to, catching any
/// panic; returns `fallback` if it panicked.
pub fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}
