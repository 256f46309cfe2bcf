//! Lines in the server's log, under the module's name (`<tb> ...`), from
//! anywhere (a command, a callback, start-up).
//!
//! The crate's logging passes the message as the printf format of
//! `RedisModule_Log`, so a `%` in it (a module argument, a panic message) is
//! read as a conversion; and it panics on a NUL byte. Here the message is
//! always an argument of a `"%s"` format.

use std::ffi::CString;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

/// A detached context of the module, made at load: RM_Log takes the
/// module's name from it. Null until [`init`] (lines then show `<module>`).
static CTX: AtomicPtr<raw::RedisModuleCtx> = AtomicPtr::new(std::ptr::null_mut());

/// Keeps a context bound to the module for logging. Call once from OnLoad.
pub fn init(ctx: *mut raw::RedisModuleCtx) {
    // SAFETY: ctx is the OnLoad context; the detached context is never freed
    // (a module with a data type is never unloaded).
    let detached = unsafe {
        raw::RedisModule_GetDetachedThreadSafeContext.map_or(std::ptr::null_mut(), |f| f(ctx))
    };
    CTX.store(detached, Ordering::Relaxed);
}

/// Logs `message` at the `warning` level (shown with the default
/// `loglevel notice`).
pub fn warning(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // SAFETY: RM_Log accepts a NULL or module context; the format is a
    // literal "%s" and its one argument a NUL-terminated string.
    unsafe {
        if let Some(log) = raw::RedisModule_Log {
            log(
                CTX.load(Ordering::Relaxed),
                c"warning".as_ptr(),
                c"%s".as_ptr(),
                text.as_ptr(),
            );
        }
    }
}
