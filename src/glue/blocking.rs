//! Server-side waiting for `TB.CONSUME ... BLOCK ms`.
//!
//! The tokens are reserved (taken into debt, and replicated) by the command
//! itself, before the client blocks; blocking only delays the reply. So the
//! reply callback never writes or replicates, which keeps clear of the Redis
//! 7.0.15 crash with writes in blocked-client callbacks, and FIFO order is the
//! order of the reservations. A timer unblocks the client when its
//! reservation is due; other clients are never delayed. A client that
//! disconnects while waiting (or that Redis unblocks, as when a master turns
//! replica) keeps its reservation: the tokens stay taken; it stops counting
//! as blocked at once.

use std::cell::RefCell;
use std::collections::HashSet;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis_module::{raw, Context};

use super::entry::{guard, Ctx};
use super::reply::Replier;
use super::{config, stats};

/// The reply a blocked client gets when its reservation is due.
type Due = [i64; 5];

/// Whether the calling context may block (not inside MULTI, a script, or a
/// client that cannot block).
pub fn can_block(ctx: &Ctx<'_>) -> bool {
    // SAFETY: ctx is the live context of the current command.
    let flags = unsafe { raw::RedisModule_GetContextFlags.unwrap()(ctx.as_ptr()) } as u32;
    let deny = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING;
    flags & deny == 0
}

thread_local! {
    /// Blocked clients still waiting for their timer, by handle address.
    /// Only the main thread blocks and unblocks clients. A handle stays
    /// allocated until `unblock` hands it back to Redis, so an address cannot
    /// be reused while it is in this set.
    static WAITING: RefCell<HashSet<usize>> = RefCell::new(HashSet::new());
}

/// Stops counting `bc` as blocked; returns false if it was not counted.
fn release(bc: *mut raw::RedisModuleBlockedClient) -> bool {
    let released = WAITING.with(|w| w.borrow_mut().remove(&(bc as usize)));
    if released {
        stats::BLOCKED_NOW.fetch_sub(1, Ordering::Relaxed);
    }
    released
}

/// Whether another client may block now (`max-blocked`).
pub fn has_room() -> bool {
    stats::BLOCKED_NOW.load(Ordering::Relaxed) < config::max_blocked()
}

/// Blocks the calling client for `wait_ms`, then replies `due`. Returns false
/// if Redis refused to block the client (the caller then replies itself).
pub fn block_for(ctx: &Ctx<'_>, wait_ms: i64, due: Due) -> bool {
    // SAFETY: ctx is the live context of the current command; the callbacks
    // match the signatures Redis expects; no timeout (the timer unblocks).
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.as_ptr(),
            Some(reply_due),
            None,
            Some(free_due),
            0,
        )
    };
    if bc.is_null() {
        return false;
    }
    // SAFETY: bc is the handle just returned by RedisModule_BlockClient.
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(bc, Some(disconnected)) };
    WAITING.with(|w| w.borrow_mut().insert(bc as usize));
    stats::BLOCKED_NOW.fetch_add(1, Ordering::Relaxed);
    stats::BLOCKED_TOTAL.add(1);
    let context = Context::new(ctx.as_ptr());
    context.create_timer(
        Duration::from_millis(wait_ms.max(0) as u64),
        unblock,
        Waiter { bc, due },
    );
    true
}

/// A blocked client waiting for its timer.
struct Waiter {
    bc: *mut raw::RedisModuleBlockedClient,
    due: Due,
}

fn unblock(_ctx: &Context, w: Waiter) {
    guard((), || {
        let privdata = Box::into_raw(Box::new(w.due));
        release(w.bc);
        // SAFETY: bc came from RedisModule_BlockClient and is unblocked exactly
        // once, here; Redis passes privdata to reply_due and then free_due,
        // even if the client disconnected meanwhile.
        unsafe { raw::RedisModule_UnblockClient.unwrap()(w.bc, privdata.cast()) };
    })
}

/// Redis released the client before its reservation was due (it
/// disconnected, or was unblocked by a role change). The timer still calls
/// `unblock` later, as Redis requires.
extern "C" fn disconnected(_ctx: *mut raw::RedisModuleCtx, bc: *mut raw::RedisModuleBlockedClient) {
    guard((), || {
        release(bc);
    })
}

extern "C" fn reply_due(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard((), || {
        // SAFETY: ctx is the reply context of a client blocked by `block_for`;
        // its private data is the Due set by `unblock` (or NULL), alive until
        // free_due runs after this callback.
        let due = unsafe {
            raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx)
                .cast::<Due>()
                .as_ref()
        };
        // SAFETY: ctx is the reply context of the blocked client.
        let r = unsafe { Replier::from_raw(ctx) };
        match due {
            Some(d) => r.ints(d),
            None => r.error("ERR tb: lost the reservation reply"),
        }
    });
    raw::Status::Ok as c_int
}

extern "C" fn free_due(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    guard((), || {
        if !privdata.is_null() {
            // SAFETY: privdata is the Box<Due> leaked in `unblock`, freed once.
            drop(unsafe { Box::from_raw(privdata.cast::<Due>()) });
        }
    })
}
