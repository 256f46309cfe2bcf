//! Allocation-free replies written straight to the client.

use std::ffi::CString;
use std::os::raw::c_long;

use redis_module::raw;

/// A raw context pointer for replying; valid for one command invocation.
#[derive(Clone, Copy)]
pub struct Replier(pub *mut raw::RedisModuleCtx);

impl Replier {
    /// An array of integers.
    pub fn ints(self, values: &[i64]) {
        self.array(values.len());
        for &v in values {
            self.int(v);
        }
    }

    /// The header of an array of `len` elements that follow.
    pub fn array(self, len: usize) {
        raw::reply_with_array(self.0, len as c_long);
    }

    /// One integer.
    pub fn int(self, v: i64) {
        raw::reply_with_long_long(self.0, v);
    }

    /// A bulk string.
    pub fn bulk(self, s: &[u8]) {
        raw::reply_with_string_buffer(self.0, s.as_ptr().cast(), s.len());
    }

    /// A nil reply.
    pub fn null(self) {
        raw::reply_with_null(self.0);
    }

    /// `+OK`.
    pub fn ok(self) {
        raw::reply_with_simple_string(self.0, c"OK".as_ptr());
    }

    /// An error line; `msg` starts with its error code (`ERR ...`).
    pub fn error(self, msg: &str) {
        let line = CString::new(msg.replace(['\0', '\r', '\n'], " "))
            .unwrap_or_else(|_| CString::from(c"ERR tb: error"));
        raw::reply_with_error(self.0, line.as_ptr());
    }
}
