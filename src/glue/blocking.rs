//! Server-side waiting for `TB.CONSUME ... BLOCK ms`.
//!
//! The tokens are reserved (taken into debt, and replicated) by the command
//! itself, before the client blocks; blocking only delays the reply. So no
//! callback here writes a bucket or replicates (which keeps clear of the
//! Redis 7.0.15 crash with writes in blocked-client callbacks), and FIFO
//! order is the order of the reservations. A timer unblocks the client when
//! its reservation is due, after the promised wait in real time whatever the
//! wall clock does meanwhile (a monotonic timer, [`super::waker`]); the
//! reply is then read from the bucket; other clients are never delayed.
//!
//! Every waiter is in [`WAITING`] from the moment it blocks until its
//! blocked-client handle goes back to Redis (`RedisModule_UnblockClient`),
//! whichever way it ends:
//! - its timer fires: it is unblocked, and its reply callback reads the
//!   bucket (never writing it) to answer;
//! - it disconnects or is killed (`CLIENT KILL`), or Redis unblocks it
//!   with an error (`CLIENT UNBLOCK ... ERROR`, a master turning replica):
//!   the disconnect callback stops its timer and hands the handle back at
//!   once, so an abandoned waiter holds nothing (a handle carries two
//!   module reply buffers, tens of KB: BENCHMARKS.md);
//! - `CLIENT UNBLOCK` (timeout): it gets at once the answer RESERVE would
//!   give (granted, with the wait still to go), and the handle goes back;
//! - the server turns replica: it gets Redis' `-UNBLOCKED` error at once
//!   ([`role_changed`]), as Redis 7.0 and 8.2 and Valkey 8 answer it
//!   themselves. (Valkey 9 keeps a module's waiter blocked across a cluster
//!   failover: it would be told to go, when due, by a replica whose state
//!   may lack its reservation.)
//!
//! So [`WAITING`] holds exactly the handles the module keeps, and
//! `tb.max-blocked` bounds them (and no client blocks when memory is
//! short). The reservation stands in every case: the tokens stay taken (the
//! server cannot know whether the client went on).

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis_module::server_events::ServerRole;
use redis_module::{raw, Context};
use redis_module_macros::role_changed_event_handler;

use super::entry::{guard, Ctx, KeyName};
use super::reply::Replier;
use super::{clock, config, stats, waker};
use crate::bucket::{Bucket, Limits};
use crate::errors::{ERR_LOST_REPLY, ERR_UNBLOCKED};
use crate::lease;

/// The reply a blocked client gets: `[allowed, remaining, retry_after_ms,
/// reset_after_ms, granted]`, as TB.CONSUME answers.
type Due = [i64; 5];

/// A blocked client's handle, as Redis gives it.
type Handle = *mut raw::RedisModuleBlockedClient;

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

/// A client waiting for its timer.
struct Waiter {
    /// The timer that unblocks it.
    timer: waker::TimerId,
    /// The bucket's key (a reference the waiter holds, released on drop):
    /// its reply describes the bucket as it is when sent.
    key: NonNull<raw::RedisModuleString>,
    /// The limits it asked for: a missing key is a full bucket of these.
    limits: Limits,
    /// Tokens it reserved.
    granted: u64,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // SAFETY: `block_for` took one reference to the key; this gives it
        // back, once.
        unsafe { raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), self.key.as_ptr()) };
    }
}

impl Waiter {
    /// The reply as of now: granted, `retry_after_ms` = `left_ms`, and the
    /// bucket's tokens and time until full read now (a read, never a
    /// write: reservations made while it waited count).
    fn reply(&self, ctx: NonNull<raw::RedisModuleCtx>, left_ms: i64) -> Due {
        // SAFETY: ctx is the live context of a callback of the waiter's
        // client (reply or timeout), on its database; the key is held until
        // self is dropped.
        let (ctx, key) = unsafe { (Ctx::new(ctx, c"tb.consume"), KeyName::from_raw(self.key)) };
        let now = clock::now_us();
        // A key that holds something else now holds no bucket either.
        let found = ctx.peek_bucket(key).ok();
        // As of now: the tokens of leases that expired while it waited are
        // back (in this reply only; the next write stores them).
        let stored = found
            .as_ref()
            .and_then(|k| crate::decide::expire(k.stored(), &mut k.leases(), now));
        let (b, reset) = match (stored, &found) {
            (Some(b), Some(k)) => (b, lease::reset_after_ms(&b, &k.leases(), now)),
            _ => {
                let b = Bucket::full(self.limits, now);
                (b, b.reset_after_ms(now))
            }
        };
        [
            1,
            b.whole_tokens(now) as i64,
            left_ms,
            reset,
            self.granted as i64,
        ]
    }
}

thread_local! {
    /// Every waiter whose handle the module still holds, by handle address.
    /// Only the main thread blocks and unblocks clients. A handle stays
    /// allocated until it is handed back with RedisModule_UnblockClient
    /// (which removes it from here first), so an address cannot be reused
    /// while it is a key here.
    static WAITING: RefCell<HashMap<usize, Waiter>> = RefCell::new(HashMap::new());
}

/// Adds a waiter; keeps `tb_blocked_now` equal to the number of waiters.
fn insert(bc: Handle, w: Waiter) {
    WAITING.with(|all| {
        let mut all = all.borrow_mut();
        all.insert(bc as usize, w);
        let n = all.len() + super::lease_wait::count();
        stats::BLOCKED_NOW.store(n as i64, Ordering::Relaxed);
    })
}

/// Takes `bc` out of the waiters; `None` if its handle was already handed
/// back (the caller then must not touch it).
fn remove(bc: Handle) -> Option<Waiter> {
    WAITING.with(|all| {
        let mut all = all.borrow_mut();
        let w = all.remove(&(bc as usize));
        let n = all.len() + super::lease_wait::count();
        stats::BLOCKED_NOW.store(n as i64, Ordering::Relaxed);
        w
    })
}

/// Number of clients waiting for a reservation (not for a lease).
pub fn count() -> usize {
    WAITING.with(|all| all.borrow().len())
}

/// Used memory, as a fraction of `maxmemory`, past which no client blocks:
/// Redis' own "short of memory" threshold (its OOM-warning context flag).
const MEMORY_SHORT: f32 = 0.75;

/// What one waiting client holds on the server, at most, as measured on
/// the servers tested (BENCHMARKS.md, "Noisy neighbours"), rounded up.
const WAITER_BYTES: u64 = 64 << 10;

/// The share of `maxmemory` that waiting clients may hold together.
const WAITERS_SHARE: u64 = 10;

/// How long a reading of `maxmemory` is reused, in microseconds.
const MAXMEMORY_TTL_US: i64 = 1_000_000;

thread_local! {
    /// The last reading of `maxmemory` (0: none) and its time.
    static MAXMEMORY: std::cell::Cell<(u64, i64)> = const { std::cell::Cell::new((0, i64::MIN)) };
}

/// `maxmemory` in bytes (0: no limit), read with RedisModule_GetServerInfo
/// at most once a second (CONFIG may be renamed; INFO cannot be).
fn maxmemory(ctx: &Ctx<'_>) -> u64 {
    let now = clock::now_us();
    let (cached, at) = MAXMEMORY.with(|m| m.get());
    if now.saturating_sub(at) < MAXMEMORY_TTL_US {
        return cached;
    }
    // SAFETY: ctx is the live context of the current command; the info
    // data is freed before returning; the field name is NUL-terminated.
    let value = unsafe {
        let info = raw::RedisModule_GetServerInfo.unwrap()(ctx.as_ptr(), c"memory".as_ptr());
        if info.is_null() {
            0
        } else {
            let mut err = 0;
            let v = raw::RedisModule_ServerInfoGetFieldUnsigned.unwrap()(
                info,
                c"maxmemory".as_ptr(),
                &mut err,
            );
            raw::RedisModule_FreeServerInfo.unwrap()(ctx.as_ptr(), info);
            if err == 0 {
                v
            } else {
                0
            }
        }
    };
    MAXMEMORY.with(|m| m.set((value, now)));
    value
}

/// Whether another client may block now. A waiting client holds two module
/// reply buffers (tens of KB), and a flood of clients that block and hang
/// up can have hundreds alive at once between two turns of the event loop,
/// whose buffers Redis then keeps in a pool for reuse. So a client blocks
/// only while fewer than `max-blocked` wait, while the waiting clients
/// together hold at most a tenth of `maxmemory` (at [`WAITER_BYTES`] each),
/// and while used memory is under 75% of `maxmemory`; otherwise BLOCK
/// answers as RESERVE would, and waiting clients never push other tenants'
/// writes past `maxmemory`.
pub fn has_room(ctx: &Ctx<'_>) -> bool {
    let waiting = stats::BLOCKED_NOW.load(Ordering::Relaxed);
    if waiting >= config::max_blocked() {
        return false;
    }
    // SAFETY: the API pointer is set by RedisModule_Init; main thread.
    if unsafe { raw::RedisModule_GetUsedMemoryRatio.unwrap()() } > MEMORY_SHORT {
        return false;
    }
    let limit = maxmemory(ctx);
    limit == 0 || (waiting as u64 + 1) * WAITER_BYTES <= limit / WAITERS_SHARE
}

/// Blocks the calling client for `wait_ms`, until its reservation of
/// `granted` tokens from the bucket under `key` (with `limits`) is due.
/// Returns false if Redis refused to block the client (the caller then
/// replies itself).
pub fn block_for(
    ctx: &Ctx<'_>,
    wait_ms: i64,
    key: KeyName<'_>,
    limits: Limits,
    granted: u64,
) -> bool {
    if !waker::start() {
        return false;
    }
    // SAFETY: ctx is the live context of the current command; the callbacks
    // match the signatures Redis expects; no timeout of Redis' own (the
    // timer unblocks), but a timeout callback, which CLIENT UNBLOCK uses.
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.as_ptr(),
            Some(reply_due),
            Some(unblocked_early),
            Some(free_due),
            0,
        )
    };
    if bc.is_null() {
        return false;
    }
    // SAFETY: bc is the handle just returned; ctx and the key string are
    // live for this call, and the reference taken here keeps the string
    // alive until the Waiter is dropped.
    let key = unsafe {
        raw::RedisModule_SetDisconnectCallback.unwrap()(bc, Some(disconnected));
        raw::RedisModule_RetainString.unwrap()(std::ptr::null_mut(), key.as_ptr());
        NonNull::new_unchecked(key.as_ptr())
    };
    // The timer's data is the handle's address, looked up in WAITING when
    // it fires.
    let timer = waker::create(
        Duration::from_millis(wait_ms.max(0) as u64),
        timer_fired,
        bc.cast(),
    );
    insert(
        bc,
        Waiter {
            timer,
            key,
            limits,
            granted,
        },
    );
    stats::BLOCKED_TOTAL.add(1);
    true
}

/// What the reply callback of a handed-back handle answers.
enum Answer {
    /// The waiter's reservation is due: its reply.
    Due(Waiter),
    /// The server turned replica: Redis' own error for that.
    Unblocked,
}

/// Hands `bc` back to Redis, with what its reply callback answers (or
/// nothing: the client is gone, or was answered already); Redis frees the
/// handle before the event loop next sleeps.
fn hand_back(bc: Handle, reply: Option<Answer>) {
    let privdata = reply.map_or(std::ptr::null_mut(), |a| Box::into_raw(Box::new(a)));
    // SAFETY: bc came from RedisModule_BlockClient and was in WAITING, from
    // which every caller removed it: it is handed back exactly once. Redis
    // passes privdata to reply_due (if the client is still there) and then
    // to free_due.
    unsafe { raw::RedisModule_UnblockClient.unwrap()(bc, privdata.cast()) };
}

/// The timer of a waiter fired: its reservation is due.
fn timer_fired(data: *mut c_void) {
    let bc: Handle = data.cast();
    if let Some(w) = remove(bc) {
        hand_back(bc, Some(Answer::Due(w)));
    }
}

/// The server turned replica: every waiter is answered `-UNBLOCKED` now,
/// never told to go by a replica (its reservation stands where it was
/// replicated to).
#[role_changed_event_handler]
fn role_changed(_ctx: &Context, role: ServerRole) {
    guard((), || {
        if !matches!(role, ServerRole::Replica) {
            return;
        }
        let all: Vec<(usize, Waiter)> = WAITING.with(|all| all.borrow_mut().drain().collect());
        let n = super::lease_wait::count();
        stats::BLOCKED_NOW.store(n as i64, Ordering::Relaxed);
        for (bc, w) in all {
            waker::stop(w.timer);
            hand_back(bc as Handle, Some(Answer::Unblocked));
        }
        super::lease_wait::unblock_all(ERR_UNBLOCKED);
    })
}

/// Redis released the client before its reservation was due: it
/// disconnected, was killed, or was unblocked with an error. Its timer is
/// stopped and its handle handed back now.
extern "C" fn disconnected(_ctx: *mut raw::RedisModuleCtx, bc: Handle) {
    guard((), || {
        if let Some(w) = remove(bc) {
            waker::stop(w.timer);
            hand_back(bc, None);
        }
    })
}

/// `CLIENT UNBLOCK` (without ERROR) ended the wait early: the client gets
/// what RESERVE would have answered (granted, with the wait still to go),
/// and the handle goes back.
extern "C" fn unblocked_early(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard((), || {
        let Some(ctx) = NonNull::new(ctx) else {
            return;
        };
        // SAFETY: ctx is the timeout context of a client blocked by
        // `block_for`: it has the handle and a client to reply to.
        let (bc, r) = unsafe {
            (
                raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx.as_ptr()),
                Replier::from_raw(ctx.as_ptr()),
            )
        };
        match remove(bc) {
            Some(w) => {
                let left_ms = waker::stop(w.timer).map_or(0, |(left, _)| waker::ceil_ms(left));
                r.ints(&w.reply(ctx, left_ms));
                hand_back(bc, None);
            }
            // The timer fired in this same event-loop turn: the handle went
            // back with its waiter, which Redis now passes here.
            None => reply_from_privdata(ctx),
        }
    });
    raw::Status::Ok as c_int
}

/// Replies for the waiter attached to a handed-back handle.
fn reply_from_privdata(ctx: NonNull<raw::RedisModuleCtx>) {
    // SAFETY: ctx is a reply or timeout context of a client blocked by
    // `block_for`; its private data is the Answer set by `hand_back` (or
    // NULL), alive until free_due runs after this callback.
    let (a, r) = unsafe {
        (
            raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx.as_ptr())
                .cast::<Answer>()
                .as_ref(),
            Replier::from_raw(ctx.as_ptr()),
        )
    };
    match a {
        Some(Answer::Due(w)) => r.ints(&w.reply(ctx, 0)),
        Some(Answer::Unblocked) => r.error(ERR_UNBLOCKED),
        None => r.error(ERR_LOST_REPLY),
    }
}

extern "C" fn reply_due(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard((), || {
        if let Some(ctx) = NonNull::new(ctx) {
            reply_from_privdata(ctx);
        }
    });
    raw::Status::Ok as c_int
}

extern "C" fn free_due(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    guard((), || {
        if !privdata.is_null() {
            // SAFETY: privdata is the Box<Answer> leaked in `hand_back`,
            // freed once (which releases a waiter's key).
            drop(unsafe { Box::from_raw(privdata.cast::<Answer>()) });
        }
    })
}
