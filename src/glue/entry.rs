//! Entry points: the only place Redis calls into command code.
//!
//! Every command goes through [`run`], which catches unwinding so that no
//! panic ever crosses into Redis (that would abort the server), and turns
//! errors into error replies.

use std::os::raw::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};

use redis_module::raw;

use super::reply::Replier;

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

/// Result of a command handler: it has replied when `Ok`.
pub type CmdResult = Result<(), CmdError>;

/// A command's arguments, borrowed from Redis for the duration of one call.
pub struct Args<'a> {
    argv: &'a [*mut raw::RedisModuleString],
}

impl Args<'_> {
    /// Number of arguments, the command name included.
    pub fn len(&self) -> usize {
        self.argv.len()
    }

    /// Argument `i` as bytes (any bytes, not necessarily UTF-8).
    pub fn bytes(&self, i: usize) -> &[u8] {
        let mut len = 0;
        let ptr = raw::string_ptr_len(self.argv[i], &mut len);
        // SAFETY: Redis guarantees argv strings are valid for `len` bytes while
        // the command runs, and the returned slice does not outlive `self`.
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
    }

    /// Argument `i` as the Redis string object (for key names).
    pub fn raw(&self, i: usize) -> *mut raw::RedisModuleString {
        self.argv[i]
    }
}

/// The context a handler works in.
pub struct Ctx {
    /// Raw context pointer for this call.
    pub raw: *mut raw::RedisModuleCtx,
}

impl Ctx {
    /// The replier for this call.
    pub fn reply(&self) -> Replier {
        Replier(self.raw)
    }
}

/// A command implementation.
pub type Handler = fn(&Ctx, &Args) -> CmdResult;

/// Runs `handler` for one call from Redis, catching any panic.
pub fn run(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let argv = if argv.is_null() || argc <= 0 {
            &[][..]
        } else {
            // SAFETY: Redis passes `argc` valid string pointers in `argv` for
            // the duration of the call.
            unsafe { std::slice::from_raw_parts(argv, argc as usize) }
        };
        handler(&Ctx { raw: ctx }, &Args { argv })
    }));
    let replier = Replier(ctx);
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(CmdError::Msg(m))) => replier.error(m),
        Ok(Err(CmdError::Owned(m))) => replier.error(&m),
        Ok(Err(CmdError::WrongArity)) => {
            // SAFETY: ctx is the live context of this call.
            unsafe { raw::RedisModule_WrongArity.unwrap()(ctx) };
        }
        Ok(Err(CmdError::WrongType)) => {
            replier.error("WRONGTYPE Operation against a key holding the wrong kind of value")
        }
        Err(_) => replier.error("ERR tb: internal error; the command had no effect"),
    }
    raw::Status::Ok as c_int
}

/// Runs `f` for a Redis callback that has no client to reply to, catching any
/// panic; returns `fallback` if it panicked.
pub fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Declares an `extern "C"` command entry point that runs a handler through
/// [`run`].
#[macro_export]
macro_rules! command_entry {
    ($name:ident, $handler:path) => {
        /// Redis entry point (see [`crate::glue::entry::run`]).
        pub extern "C" fn $name(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            $crate::glue::entry::run(ctx, argv, argc, $handler)
        }
    };
}
