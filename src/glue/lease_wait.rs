//! Server-side waiting for leases: `TB.CONSUME ... BLOCK ms LEASE ttl` and
//! `TB.MCONSUME ... BLOCK ms LEASE part ttl`.
//!
//! A call whose leases cannot all be granted now (or that finds calls
//! already waiting on one of its buckets) is queued, first come first
//! served per bucket ([`crate::waitq`]), and its client blocked. No reply
//! callback ever writes: a waiting call is granted by running the
//! command's own non-blocking path ([`Attempt`]) in a context where
//! writing and replicating are ordinary, and the client is then unblocked
//! with the reply already made. Those contexts are:
//! - the command that gives tokens back (`TB.RELEASE`, `TB.REFUND`), right
//!   after its own write ([`after_give_back`]): the freed tokens go to the
//!   first in line before any other client runs;
//! - a module timer at the next time the first in line could fit (its
//!   denial's `retry_after_ms`: the refill, or a lease's expiry), set off
//!   by a monotonic timer ([`waker`]);
//! - a module timer at the call's own deadline (kept on the monotonic clock,
//!   [`waker`], so the wait lasts the real time asked), which tries it a
//!   last time and otherwise answers the denial (nothing written);
//! - a module timer at once after a first-in-line call left (gone or timed
//!   out), so the next in line is tried; unless the next asks the same,
//!   which then takes over the readiness timer of the one that left (a
//!   flood of waiters that hang up costs no try and no module timer).
//!
//! A client that disconnects (or is killed, or unblocked with an error as
//! on a failover: `-UNBLOCKED`) leaves the queue at once and holds
//! nothing.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::ops::Range;
use std::os::raw::{c_int, c_void};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis_module::raw;

use super::entry::{guard, Args, CmdError, CmdResult, Ctx};
use super::reply::Replier;
use super::{blocking, stats, waker};
use crate::errors;
use crate::waitq::{self, WaitQueue, WaiterId};

/// What one try at a waiting call's leases gave.
pub struct Try {
    /// The leases were granted (and written).
    pub granted: bool,
    /// The denial's `retry_after_ms` (-1: cannot fit as asked).
    pub retry_after_ms: i64,
    /// The reply the call sends, as its non-blocking form answers.
    pub reply: Vec<i64>,
}

/// One try of a waiting call with its own arguments: grants (and writes)
/// if everything fits; with `dry`, writes nothing and answers the denial.
pub type Attempt = for<'a> fn(&Ctx<'a>, &Args<'a>, bool) -> Result<Try, CmdError>;

/// A bucket as the queue knows it: database and key name.
type QKey = (c_int, Vec<u8>);

/// A blocked client's handle, as Redis gives it.
type Handle = *mut raw::RedisModuleBlockedClient;

/// A waiting call.
struct Waiter {
    bc: Handle,
    db: c_int,
    /// The call's arguments, one reference each (released on drop).
    argv: Vec<NonNull<raw::RedisModuleString>>,
    event: &'static CStr,
    attempt: Attempt,
    /// The deadline, on the monotonic clock ([`waker`]): a call waits the
    /// real time it asked for; `None` once it came. A monotonic timer costs
    /// far less than a module timer, and most waits end before it.
    timeout: Option<waker::TimerId>,
    /// The timer that tries it again when it may fit, if any, and its
    /// ticket (what the timer carries: a first in line that leaves hands
    /// its timer to the next one when they ask the same).
    ready: Option<(waker::TimerId, u64)>,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        for s in &self.argv {
            // SAFETY: `block` took one reference to each argument; this
            // gives it back, once.
            unsafe { raw::RedisModule_FreeString.unwrap()(std::ptr::null_mut(), s.as_ptr()) };
        }
    }
}

#[derive(Default)]
struct State {
    queue: WaitQueue<QKey>,
    waiters: HashMap<WaiterId, Waiter>,
    by_handle: HashMap<usize, WaiterId>,
    /// Ready timers' tickets, to the call each tries.
    tickets: HashMap<u64, WaiterId>,
    next_ticket: u64,
}

thread_local! {
    /// Every waiting call. Main thread only.
    static STATE: RefCell<State> = RefCell::new(State::default());
    /// A detached context that owns this module's timers.
    static TIMER_CTX: Cell<*mut raw::RedisModuleCtx> = const { Cell::new(std::ptr::null_mut()) };
}

/// Number of calls waiting for leases.
pub fn count() -> usize {
    STATE.with(|s| s.borrow().waiters.len())
}

fn recount() {
    let n = blocking::count() + count();
    stats::BLOCKED_NOW.store(n as i64, Ordering::Relaxed);
}

/// The context timers are created and stopped with (made once, from a
/// command's context).
fn timer_ctx(ctx: *mut raw::RedisModuleCtx) -> *mut raw::RedisModuleCtx {
    TIMER_CTX.with(|t| {
        if t.get().is_null() {
            // SAFETY: ctx is a live context of this module; the detached
            // context lives as long as the module.
            t.set(unsafe { raw::RedisModule_GetDetachedThreadSafeContext.unwrap()(ctx) });
        }
        t.get()
    })
}

fn create_timer(ms: u64, cb: raw::RedisModuleTimerProc, data: u64) -> raw::RedisModuleTimerID {
    let ctx = TIMER_CTX.with(Cell::get);
    // SAFETY: main thread; ctx is the module's detached context; data is an
    // integer carried as a pointer, never dereferenced.
    unsafe {
        raw::RedisModule_CreateTimer.unwrap()(
            ctx,
            ms.min(i64::MAX as u64) as raw::mstime_t,
            cb,
            data as usize as *mut c_void,
        )
    }
}

fn selected_db(ctx: *mut raw::RedisModuleCtx) -> c_int {
    // SAFETY: ctx is live.
    unsafe { raw::RedisModule_GetSelectedDb.unwrap()(ctx) }
}

/// Runs a `BLOCK ms` + `LEASE` call whose keys are arguments `keys`: granted
/// now when nobody waits on its buckets and everything fits, else queued
/// and blocked for at most `wait_ms` (answered at once when it can never
/// fit, when `wait_ms` is 0, or when no more clients may block). `now` is
/// `attempt` with the arguments the command parsed already.
pub fn wait(
    ctx: &Ctx<'_>,
    args: &Args<'_>,
    wait_ms: u64,
    keys: Range<usize>,
    event: &'static CStr,
    attempt: Attempt,
    now: &dyn Fn(&Ctx<'_>) -> Result<Try, CmdError>,
) -> CmdResult {
    let db = selected_db(ctx.as_ptr());
    let qkeys: Vec<QKey> = keys.map(|i| (db, args.bytes(i).to_vec())).collect();
    let queued = STATE.with(|s| s.borrow().queue.is_waited(&qkeys));
    let room = wait_ms > 0 && blocking::has_room(ctx);
    let mut retry = None;
    if !queued || !room {
        let t = now(ctx)?;
        if t.granted || t.retry_after_ms < 0 || !room {
            ctx.reply().ints(&t.reply);
            return Ok(());
        }
        retry = Some(t.retry_after_ms);
    }
    match block(ctx, args, wait_ms, qkeys, event, attempt) {
        // First in line: tried again when it may fit.
        Some(id) => retry.into_iter().for_each(|ms| schedule_ready(id, ms)),
        None => {
            let t = attempt(ctx, args, true)?;
            ctx.reply().ints(&t.reply);
        }
    }
    Ok(())
}

fn block(
    ctx: &Ctx<'_>,
    args: &Args<'_>,
    wait_ms: u64,
    qkeys: Vec<QKey>,
    event: &'static CStr,
    attempt: Attempt,
) -> Option<WaiterId> {
    timer_ctx(ctx.as_ptr());
    if !waker::start() {
        return None;
    }
    // SAFETY: ctx is the live context of the current command; the callbacks
    // match the signatures Redis expects; no timeout of Redis' own (the
    // waker ends the wait), but a timeout callback for CLIENT UNBLOCK.
    let bc = unsafe {
        raw::RedisModule_BlockClient.unwrap()(
            ctx.as_ptr(),
            Some(reply_cb),
            Some(unblocked_early),
            Some(free_cb),
            0,
        )
    };
    if bc.is_null() {
        return None;
    }
    let argv = (0..args.len())
        .map(|i| {
            let s = args.key(i).as_ptr();
            // SAFETY: s is a live argument of this call; the reference
            // taken keeps it alive until the Waiter is dropped.
            unsafe {
                raw::RedisModule_RetainString.unwrap()(std::ptr::null_mut(), s);
                NonNull::new_unchecked(s)
            }
        })
        .collect();
    // SAFETY: bc is the handle just returned.
    unsafe { raw::RedisModule_SetDisconnectCallback.unwrap()(bc, Some(disconnected)) };
    let db = qkeys[0].0;
    let id = STATE.with(|s| s.borrow_mut().queue.push(qkeys));
    let timeout = Some(waker::create(
        Duration::from_millis(wait_ms),
        deadline_came,
        id as usize as *mut c_void,
    ));
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.by_handle.insert(bc as usize, id);
        s.waiters.insert(
            id,
            Waiter {
                bc,
                db,
                argv,
                event,
                attempt,
                timeout,
                ready: None,
            },
        );
    });
    recount();
    stats::BLOCKED_TOTAL.add(1);
    Some(id)
}

/// Serves the calls waiting on `key` after a command gave tokens back to
/// it: the first in line get the tokens before any other client runs.
pub fn after_give_back(ctx: &Ctx<'_>, key: &[u8]) {
    if STATE.with(|s| s.borrow().queue.is_empty()) {
        return;
    }
    let k = (selected_db(ctx.as_ptr()), key.to_vec());
    serve(ctx.as_ptr(), vec![k]);
}

/// What a blocked client is answered.
enum Reply {
    Ints(Vec<i64>),
    Error(String),
}

impl From<CmdError> for Reply {
    fn from(e: CmdError) -> Self {
        Reply::Error(match e {
            CmdError::Msg(m) => m.to_owned(),
            CmdError::Owned(m) => m,
            CmdError::WrongArity => errors::ERR_WRONG_ARITY.to_owned(),
            CmdError::WrongType => errors::ERR_WRONGTYPE.to_owned(),
        })
    }
}

/// Takes a waiter out of everything (queue, tables, timers). With
/// `hand_over` (it leaves without a grant), its ready timer goes to the
/// next in line if that one asks the same and has none: it may fit at the
/// same time, and nothing else need run now. Returns the waiter, its keys,
/// and whether its timer was handed over.
fn take(id: WaiterId, hand_over: bool) -> Option<(Waiter, Vec<QKey>, bool)> {
    let (mut w, keys, handed) = STATE.with(|s| {
        let s = &mut *s.borrow_mut();
        let mut w = s.waiters.remove(&id)?;
        s.by_handle.remove(&(w.bc as usize));
        let keys = s.queue.remove(id).unwrap_or_default();
        let mut handed = false;
        if let (true, Some((timer, ticket))) = (hand_over, w.ready) {
            let next = keys.first().and_then(|k| s.queue.first(k));
            if let Some(n) = next.and_then(|n| s.waiters.get_mut(&n).map(|nw| (n, nw))) {
                let (n, nw) = n;
                let same = s.queue.keys_of(n) == Some(&keys[..])
                    && waitq::same_request(&arg_bytes(&w.argv), &arg_bytes(&nw.argv));
                if same && nw.ready.is_none() {
                    nw.ready = Some((timer, ticket));
                    s.tickets.insert(ticket, n);
                    w.ready = None;
                    handed = true;
                }
            }
        }
        Some((w, keys, handed))
    })?;
    if let Some(t) = w.timeout.take() {
        waker::stop(t);
    }
    if let Some((timer, ticket)) = w.ready.take() {
        waker::stop(timer);
        STATE.with(|s| s.borrow_mut().tickets.remove(&ticket));
    }
    recount();
    Some((w, keys, handed))
}

/// The bytes of retained arguments.
fn arg_bytes(argv: &[NonNull<raw::RedisModuleString>]) -> Vec<&[u8]> {
    argv.iter()
        .map(|&s| {
            let mut len = 0;
            let ptr = raw::string_ptr_len(s.as_ptr(), &mut len);
            if ptr.is_null() || len == 0 {
                return &[][..];
            }
            // SAFETY: a waiter holds a reference to each of its arguments,
            // so the buffer stays alive and unchanged while the waiter (and
            // so the borrow of `argv`) lives.
            unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }
        })
        .collect()
}

/// Hands `bc` back to Redis with the reply its reply callback sends (none:
/// the client is gone or was answered already).
fn hand_back(bc: Handle, reply: Option<Reply>) {
    let privdata = reply.map_or(std::ptr::null_mut(), |r| Box::into_raw(Box::new(r)));
    // SAFETY: bc came from RedisModule_BlockClient and was just taken out
    // of the tables: it is handed back exactly once.
    unsafe { raw::RedisModule_UnblockClient.unwrap()(bc, privdata.cast()) };
}

/// Runs a waiter's attempt on `ctx` (in its database).
fn try_waiter(
    ctx: NonNull<raw::RedisModuleCtx>,
    id: WaiterId,
    dry: bool,
) -> Option<Result<Try, CmdError>> {
    let (db, argv, event, attempt) = STATE.with(|s| {
        let s = s.borrow();
        let w = s.waiters.get(&id)?;
        Some((w.db, w.argv.clone(), w.event, w.attempt))
    })?;
    if selected_db(ctx.as_ptr()) != db {
        // SAFETY: ctx is live; db was a valid database when the call came.
        unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.as_ptr(), db) };
    }
    // SAFETY: ctx is a live context in which writing and replicating are
    // ordinary (a command's, or a timer's); the waiter holds a reference to
    // each argument until it is dropped, which nothing does during this call.
    let (c, a) = unsafe {
        (
            Ctx::new(ctx, event),
            Args::new(argv.as_ptr() as *mut _, argv.len() as c_int),
        )
    };
    Some(attempt(&c, &a, dry))
}

/// Tries the first in line on each bucket of `work`, granting while they
/// fit; a first in line that does not fit gets a timer for when it may.
fn serve(ctx: *mut raw::RedisModuleCtx, mut work: Vec<QKey>) {
    let Some(ctx) = NonNull::new(ctx) else { return };
    let db = selected_db(ctx.as_ptr());
    let mut denied = HashSet::new();
    while let Some(k) = work.pop() {
        while let Some(id) = STATE.with(|s| s.borrow().queue.first(&k)) {
            if denied.contains(&id) {
                break;
            }
            match try_waiter(ctx, id, false) {
                Some(Ok(t)) if !t.granted => {
                    schedule_ready(id, t.retry_after_ms);
                    denied.insert(id);
                    break;
                }
                Some(outcome) => {
                    if let Some((w, keys, _)) = take(id, false) {
                        let reply = match outcome {
                            Ok(t) => Reply::Ints(t.reply),
                            Err(e) => e.into(),
                        };
                        hand_back(w.bc, Some(reply));
                        work.extend(keys.into_iter().filter(|x| *x != k));
                    }
                }
                None => break,
            }
        }
    }
    if selected_db(ctx.as_ptr()) != db {
        // SAFETY: ctx is live; db is the database it had.
        unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.as_ptr(), db) };
    }
}

/// Sets (or moves) the timer that tries `id` again when it may fit.
fn schedule_ready(id: WaiterId, retry_after_ms: i64) {
    let old = STATE.with(|s| {
        let s = &mut *s.borrow_mut();
        let old = s.waiters.get_mut(&id).and_then(|w| w.ready.take());
        if let Some((_, ticket)) = old {
            s.tickets.remove(&ticket);
        }
        old
    });
    if let Some((timer, _)) = old {
        waker::stop(timer);
    }
    if let Some(ms) = waitq::retry_in_ms(retry_after_ms) {
        let ticket = STATE.with(|s| {
            let s = &mut *s.borrow_mut();
            s.next_ticket += 1;
            s.tickets.insert(s.next_ticket, id);
            s.next_ticket
        });
        let timer = waker::create(
            Duration::from_millis(ms),
            ready_due,
            ticket as usize as *mut c_void,
        );
        STATE.with(|s| {
            if let Some(w) = s.borrow_mut().waiters.get_mut(&id) {
                w.ready = Some((timer, ticket));
            }
        });
    }
}

/// The time a first in line waited for came (on the main thread, with no
/// context): a module timer at once tries it from a context where writing
/// is ordinary. (A monotonic timer costs far less than a module timer, and
/// a first in line that hangs up never needs one.)
fn ready_due(data: *mut c_void) {
    let ticket = data as usize as u64;
    if STATE.with(|s| s.borrow().tickets.contains_key(&ticket)) {
        create_timer(0, Some(ready_fired), ticket);
    }
}

/// Tries again the buckets of the first in line whose time came.
extern "C" fn ready_fired(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard((), || {
        let ticket = data as usize as u64;
        let keys = STATE.with(|s| {
            let s = &mut *s.borrow_mut();
            let id = s.tickets.remove(&ticket)?;
            if let Some(w) = s.waiters.get_mut(&id) {
                w.ready = None;
            }
            s.queue.keys_of(id).map(<[QKey]>::to_vec)
        });
        if let Some(keys) = keys {
            serve(ctx, keys);
        }
    })
}

/// Tries the buckets a first in line left (data: a `Box<Vec<QKey>>`).
extern "C" fn serve_later(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard((), || {
        // SAFETY: data is the box leaked in `next_in_line`, used once.
        let keys = unsafe { Box::from_raw(data.cast::<Vec<QKey>>()) };
        serve(ctx, *keys);
    })
}

/// After a first in line left without a grant: a timer tries the next in
/// line on its buckets at once (from a context where writing is ordinary).
fn next_in_line(keys: Vec<QKey>) {
    if STATE.with(|s| s.borrow().queue.is_waited(&keys)) {
        let data = Box::into_raw(Box::new(keys));
        let ctx = TIMER_CTX.with(Cell::get);
        // SAFETY: main thread; ctx is the module's detached context; the
        // box is taken back by serve_later, the one place that frees it
        // (a timer of this module is never stopped unless a Waiter holds it).
        unsafe { raw::RedisModule_CreateTimer.unwrap()(ctx, 0, Some(serve_later), data.cast()) };
    }
}

/// A call's deadline came (on the main thread, with no context): a module
/// timer at once answers it from a context where writing is ordinary.
fn deadline_came(data: *mut c_void) {
    let id = data as usize as WaiterId;
    let waiting = STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.waiters.get_mut(&id).map(|w| w.timeout = None).is_some()
    });
    if waiting {
        create_timer(0, Some(timed_out), id);
    }
}

/// A call's deadline came: a last try if it is first in line, else (or if
/// it does not fit) the denial, and the next in line is tried.
extern "C" fn timed_out(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard((), || {
        let id = data as usize as WaiterId;
        let keys = STATE.with(|s| s.borrow().queue.keys_of(id).map(<[QKey]>::to_vec));
        let Some(keys) = keys else { return };
        serve(ctx, keys);
        let Some(nn) = NonNull::new(ctx) else { return };
        if let Some(Some(outcome)) = STATE
            .with(|s| s.borrow().waiters.contains_key(&id))
            .then(|| try_waiter(nn, id, true))
        {
            if let Some((w, keys, handed)) = take(id, true) {
                let reply = match outcome {
                    Ok(t) => Reply::Ints(t.reply),
                    Err(e) => e.into(),
                };
                hand_back(w.bc, Some(reply));
                if !handed {
                    serve(ctx, keys);
                }
            }
        }
    })
}

/// The server turned replica: every waiting call is answered `msg` now, so
/// no replica ever grants one (Valkey 9 leaves them blocked across a
/// cluster failover; the other servers answer them `-UNBLOCKED` first).
pub fn unblock_all(msg: &str) {
    let ids: Vec<WaiterId> = STATE.with(|s| s.borrow().waiters.keys().copied().collect());
    for id in ids {
        if let Some((w, _, _)) = take(id, false) {
            hand_back(w.bc, Some(Reply::Error(msg.to_string())));
        }
    }
}

/// The client left while waiting (disconnected, killed, or unblocked with
/// an error, as on a failover): it leaves the queue and holds nothing.
extern "C" fn disconnected(_ctx: *mut raw::RedisModuleCtx, bc: Handle) {
    guard((), || {
        let Some(id) = STATE.with(|s| s.borrow().by_handle.get(&(bc as usize)).copied()) else {
            return;
        };
        let first = STATE.with(|s| s.borrow().queue.is_first(id));
        if let Some((w, keys, handed)) = take(id, true) {
            hand_back(w.bc, None);
            if first && !handed {
                next_in_line(keys);
            }
        }
    })
}

/// `CLIENT UNBLOCK` (without ERROR): the denial now, as at the deadline.
extern "C" fn unblocked_early(
    ctx: *mut raw::RedisModuleCtx,
    _argv: *mut *mut raw::RedisModuleString,
    _argc: c_int,
) -> c_int {
    guard((), || {
        let Some(nn) = NonNull::new(ctx) else { return };
        // SAFETY: ctx is the timeout context of a client blocked by `block`.
        let (bc, r) = unsafe {
            (
                raw::RedisModule_GetBlockedClientHandle.unwrap()(ctx),
                Replier::from_raw(ctx),
            )
        };
        let id = STATE.with(|s| s.borrow().by_handle.get(&(bc as usize)).copied());
        match id {
            Some(id) => {
                let first = STATE.with(|s| s.borrow().queue.is_first(id));
                let outcome = try_waiter(nn, id, true);
                if let Some((w, keys, handed)) = take(id, true) {
                    send(
                        r,
                        outcome.map_or_else(
                            || Reply::Ints(Vec::new()),
                            |o| match o {
                                Ok(t) => Reply::Ints(t.reply),
                                Err(e) => e.into(),
                            },
                        ),
                    );
                    hand_back(w.bc, None);
                    if first && !handed {
                        next_in_line(keys);
                    }
                }
            }
            None => reply_from_privdata(nn),
        }
    });
    raw::Status::Ok as c_int
}

fn send(r: Replier<'_>, reply: Reply) {
    match reply {
        Reply::Ints(v) => r.ints(&v),
        Reply::Error(e) => r.error(&e),
    }
}

fn reply_from_privdata(ctx: NonNull<raw::RedisModuleCtx>) {
    // SAFETY: ctx is a reply or timeout context of a client blocked by
    // `block`; its private data is the Reply set by `hand_back` (or NULL),
    // alive until free_cb runs after this callback.
    let (reply, r) = unsafe {
        (
            raw::RedisModule_GetBlockedClientPrivateData.unwrap()(ctx.as_ptr())
                .cast::<Reply>()
                .as_ref(),
            Replier::from_raw(ctx.as_ptr()),
        )
    };
    match reply {
        Some(Reply::Ints(v)) => r.ints(v),
        Some(Reply::Error(e)) => r.error(e),
        None => r.error(errors::ERR_LOST_REPLY),
    }
}

extern "C" fn reply_cb(
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

extern "C" fn free_cb(_ctx: *mut raw::RedisModuleCtx, privdata: *mut c_void) {
    guard((), || {
        if !privdata.is_null() {
            // SAFETY: privdata is the Box<Reply> leaked in `hand_back`, freed once.
            drop(unsafe { Box::from_raw(privdata.cast::<Reply>()) });
        }
    })
}
