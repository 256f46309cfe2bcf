//! Allocation-free replies written straight to the client.

use std::ffi::CString;
use std::marker::PhantomData;
use std::os::raw::c_long;

use redis_module::raw;

use super::entry::Ctx;
use crate::errors;

/// Writes the reply of one call (or of one blocked client's callback).
#[derive(Clone, Copy)]
pub struct Replier<'a> {
    ctx: *mut raw::RedisModuleCtx,
    _call: PhantomData<&'a raw::RedisModuleCtx>,
}

impl<'a> Replier<'a> {
    /// The replier of a command call.
    pub(super) fn new(ctx: &'a Ctx<'_>) -> Self {
        Replier {
            ctx: ctx.as_ptr(),
            _call: PhantomData,
        }
    }

    /// The replier of a callback's context.
    ///
    /// # Safety
    /// `ctx` must be a live context with a client to reply to, valid for `'a`.
    pub(super) unsafe fn from_raw(ctx: *mut raw::RedisModuleCtx) -> Self {
        Replier {
            ctx,
            _call: PhantomData,
        }
    }

    /// An array of integers.
    pub fn ints(self, values: &[i64]) {
        self.array(values.len());
        for &v in values {
            self.int(v);
        }
    }

    /// The header of an array of `len` elements that follow.
    pub fn array(self, len: usize) {
        raw::reply_with_array(self.ctx, len as c_long);
    }

    /// One integer.
    pub fn int(self, v: i64) {
        raw::reply_with_long_long(self.ctx, v);
    }

    /// A bulk string.
    pub fn bulk(self, s: &[u8]) {
        raw::reply_with_string_buffer(self.ctx, s.as_ptr().cast(), s.len());
    }

    /// A nil reply.
    pub fn null(self) {
        raw::reply_with_null(self.ctx);
    }

    /// `+OK`.
    pub fn ok(self) {
        raw::reply_with_simple_string(self.ctx, c"OK".as_ptr());
    }

    /// An error line; `msg` starts with its error code (`ERR ...`).
    pub fn error(self, msg: &str) {
        let line = CString::new(msg.replace(['\0', '\r', '\n'], " "))
            .or_else(|_| CString::new(errors::ERR_UNSENDABLE))
            .unwrap_or_default();
        raw::reply_with_error(self.ctx, line.as_ptr());
    }

    /// Redis' own wrong-arity error for the current command.
    pub(super) fn wrong_arity(self) {
        // SAFETY: ctx is the live context of a command call.
        unsafe { raw::RedisModule_WrongArity.unwrap()(self.ctx) };
    }
}
