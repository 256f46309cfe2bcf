//! The one writer of `TB.SETSTATE`: the deterministic command that replicas
//! and the AOF receive instead of a client's clock-dependent one. Both of
//! its channels, replication of a write ([`replicate`]) and AOF rewrite
//! ([`emit_aof`]), build its argument here, from a [`State`].

use std::ffi::CStr;

use redis_module::raw;

use super::entry::{Ctx, KeyName};
use crate::bucket::Bucket;
use crate::codec::wire;
use crate::lease::{Delta, Leases};

/// The command's name as the module emits it. Its registration
/// (`commands::setstate`) checks at compile time that it names this
/// command.
pub const NAME: &CStr = c"TB.SETSTATE";

/// What one `TB.SETSTATE key state` carries.
pub enum State<'a> {
    /// The bucket with all of its leases, in the compact binary form
    /// ([`wire::encode_state`]); `expire_at_ms` 0 for no expiry.
    Whole {
        bucket: &'a Bucket,
        leases: &'a Leases,
        expire_at_ms: i64,
    },
    /// The bucket and only a change to its leases ([`wire::TAG_DELTA`]),
    /// so that its bytes do not grow with the leases held.
    Change {
        bucket: &'a Bucket,
        delta: &'a Delta,
        expire_at_ms: i64,
    },
    /// `key DEL`: the bucket is full and its key gone. Not as the `DEL`
    /// command, which `rename-command` can take away (and then
    /// `RedisModule_Replicate` sends nothing); this one cannot be renamed.
    Delete,
}

impl State<'_> {
    /// The `state` argument.
    fn argument(&self) -> Vec<u8> {
        match *self {
            State::Whole {
                bucket,
                leases,
                expire_at_ms,
            } => {
                let mut buf = Vec::with_capacity(wire::MAX_LEN);
                wire::encode_state(bucket, leases, expire_at_ms, &mut buf);
                buf
            }
            State::Change {
                bucket,
                delta,
                expire_at_ms,
            } => {
                let mut buf = Vec::with_capacity(wire::MAX_LEN);
                wire::encode_delta(bucket, delta, expire_at_ms, &mut buf);
                buf
            }
            State::Delete => b"DEL".to_vec(),
        }
    }
}

/// Replicates `TB.SETSTATE key state` as an effect of the running command
/// (to replicas and the AOF, in the command's `MULTI` with its other
/// effects).
pub fn replicate(ctx: &Ctx, key: &KeyName, state: &State) {
    let arg = state.argument();
    // SAFETY: ctx and the key name are live for this call; the format string
    // matches the arguments: s = RedisModuleString*, b = (char*, size_t).
    unsafe {
        raw::RedisModule_Replicate.unwrap()(
            ctx.as_ptr(),
            NAME.as_ptr(),
            c"sb".as_ptr(),
            key.as_ptr(),
            arg.as_ptr(),
            arg.len(),
        )
    };
}

/// Writes `TB.SETSTATE key state` into an AOF being rewritten.
///
/// # Safety
/// `aof` and `key` must be the live arguments of the data type's
/// `aof_rewrite` callback.
pub unsafe fn emit_aof(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    state: &State,
) {
    let arg = state.argument();
    // SAFETY: the caller passes live pointers; the format string matches the
    // arguments: s = RedisModuleString*, b = (char*, size_t).
    unsafe {
        raw::RedisModule_EmitAOF.unwrap()(
            aof,
            NAME.as_ptr(),
            c"sb".as_ptr(),
            key,
            arg.as_ptr(),
            arg.len(),
        )
    };
}
