//! Server-side waiting in a queue: `TB.CONSUME ... BLOCK ms` with `LEASE`
//! or `FLOW`, and `TB.MCONSUME ... BLOCK ms`.
//!
//! A call that cannot be granted now (or that finds calls already waiting
//! on one of its buckets) is queued on one bucket, weighted fair across
//! flows and first come first served within a flow ([`crate::waitq`]), and
//! its client blocked. No reply
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
use super::{blocking, clock, stats, store, waker};
use crate::errors;
use crate::parse::Flow;
use crate::waitq::{self, WaitQueue, WaiterId};

/// What one try at a waiting call's leases gave.
pub struct Try {
    /// The leases were granted (and written).
    pub granted: bool,
    /// The denial's wait in µs, exact (what its `retry_after_ms` rounds up;
    /// -1: no refill or lease expiry will make it fit, only a give-back can).
    pub wait_us: i64,
    /// The call asks more of a bucket than its capacity: it can never fit.
    pub never: bool,
    /// Which of the call's buckets makes a denial wait (an index into its
    /// keys): the call waits in that bucket's queue.
    pub blocking: usize,
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

/// What a queued call asks: its keys (argument indices), the tokens it
/// asks of each, in key order, and its flow (`None`: the default flow).
pub struct Queued<'a> {
    /// The arguments that are its keys.
    pub keys: Range<usize>,
    /// Tokens asked of each key, in key order: its cost in a key's queue.
    pub costs: Vec<u64>,
    /// `FLOW name [WEIGHT w]`.
    pub flow: Option<Flow<'a>>,
}

/// The flow of calls that wait without naming one (no name can be empty).
const DEFAULT_FLOW: Flow<'static> = Flow {
    name: b"",
    weight: 1,
};

/// A waiting call.
struct Waiter {
    bc: Handle,
    db: c_int,
    /// Its buckets and the tokens it asks of each, in key order: it moves
    /// to the queue of the one that makes it wait.
    keys: Vec<QKey>,
    costs: Vec<u64>,
    /// The arguments that are its keys.
    key_args: Range<usize>,
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
    /// Ready timers' tickets, to the call each tries and the instant it may
    /// fit, on the server's clock (a late timer grants as of then).
    tickets: HashMap<u64, (WaiterId, i64)>,
    next_ticket: u64,
}

thread_local! {
    /// Every waiting call. Main thread only.
    static STATE: RefCell<State> = RefCell::new(State::default());
    /// A detached context that owns this module's timers.
    static TIMER_CTX: Cell<*mut raw::RedisModuleCtx> = const { Cell::new(std::ptr::null_mut()) };
}

/// Number of calls waiting in a queue.
pub fn count() -> usize {
    STATE.with(|s| s.borrow().waiters.len())
}

/// Flows with a call waiting, summed over the buckets.
pub fn flow_count() -> usize {
    STATE.with(|s| s.borrow().queue.flow_count())
}

/// The calls waiting on bucket `key` of the selected database, and its
/// flows as `(name, weight, waiting)` in the order they are served next.
pub fn waiting_on(ctx: &Ctx<'_>, key: &[u8]) -> (usize, Vec<(Vec<u8>, u64, usize)>) {
    let k = (selected_db(ctx.as_ptr()), key.to_vec());
    STATE.with(|s| {
        let s = s.borrow();
        let flows = s.queue.flows(&k);
        let flows = flows
            .iter()
            .map(|f| (f.name.to_vec(), f.weight, f.waiting))
            .collect();
        (s.queue.waiting(&k), flows)
    })
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

/// Runs a call that waits in a queue (`BLOCK ms` with `LEASE` or `FLOW`,
/// or `TB.MCONSUME ... BLOCK ms`): granted now when nobody waits on its
/// buckets and everything fits, else queued and blocked for at most
/// `wait_ms` (answered at once when it asks more than a bucket holds, when
/// `wait_ms` is 0, or when no more clients may block). A call that only a
/// give-back can serve (a bucket of rate 0) waits for one. `now` is `attempt` with the
/// arguments the command parsed already.
pub fn wait(
    ctx: &Ctx<'_>,
    args: &Args<'_>,
    wait_ms: u64,
    asks: Queued<'_>,
    event: &'static CStr,
    attempt: Attempt,
    now: &dyn Fn(&Ctx<'_>) -> Result<Try, CmdError>,
) -> CmdResult {
    let db = selected_db(ctx.as_ptr());
    let key_args = asks.keys.clone();
    let qkeys: Vec<QKey> = asks.keys.map(|i| (db, args.bytes(i).to_vec())).collect();
    let waited = STATE.with(|s| {
        let s = s.borrow();
        let first = s.queue.first_waited(&qkeys);
        first.and_then(|k| qkeys.iter().position(|q| q == k))
    });
    let room = wait_ms > 0 && blocking::has_room(ctx);
    let mut retry = None;
    let mut on = waited.unwrap_or(0);
    if waited.is_none() || !room {
        // One instant for the decision and the wait counted from it (the
        // clock of Redis 7.0 moves within a command).
        let at = clock::server_now_us();
        let t = clock::as_of(at, || now(ctx))?;
        if t.granted || t.never || !room {
            ctx.reply().ints(&t.reply);
            return Ok(());
        }
        retry = Some(waitq::due_at(at, t.wait_us));
        on = t.blocking;
    }
    let flow = asks.flow.unwrap_or(DEFAULT_FLOW);
    let queued = Queue {
        keys: qkeys,
        key_args,
        costs: asks.costs,
        on,
        flow,
    };
    match block(ctx, args, wait_ms, queued, event, attempt) {
        Some(id) => match retry {
            // Alone in its queue: tried again when it may fit.
            Some(due) => schedule_ready(id, due),
            // Behind others, unless its flow puts it first in line: then it
            // is tried at once (from a timer, where writing is ordinary).
            None => {
                let first = STATE.with(|s| {
                    let s = s.borrow();
                    s.queue.is_first(id).then(|| s.queue.key_of(id).cloned())
                });
                if let Some(Some(k)) = first {
                    next_in_line(k);
                }
            }
        },
        None => {
            let t = attempt(ctx, args, true)?;
            ctx.reply().ints(&t.reply);
        }
    }
    Ok(())
}

/// Where a call is queued: its keys, costs, the index of the key whose
/// queue it joins, and its flow.
struct Queue<'a> {
    keys: Vec<QKey>,
    key_args: Range<usize>,
    costs: Vec<u64>,
    on: usize,
    flow: Flow<'a>,
}

fn block(
    ctx: &Ctx<'_>,
    args: &Args<'_>,
    wait_ms: u64,
    q: Queue<'_>,
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
    let db = q.keys[0].0;
    let (key, cost) = (q.keys[q.on].clone(), q.costs[q.on]);
    let id = STATE.with(|s| {
        let queue = &mut s.borrow_mut().queue;
        queue.push(key, q.flow.name, q.flow.weight, cost)
    });
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
                keys: q.keys,
                key_args: q.key_args,
                costs: q.costs,
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
    serve(ctx.as_ptr(), k, None);
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

/// Takes a waiter out of everything (queue, tables, timers); `served`
/// when it was granted (its grant counts for its flow's share). With
/// `hand_over` (it leaves without a grant), its ready timer goes to the
/// next in line if that one asks the same and has none: it may fit at the
/// same time, and nothing else need run now. Returns the waiter, the key it
/// waited on, and whether its timer was handed over.
fn take(id: WaiterId, hand_over: bool, served: bool) -> Option<(Waiter, QKey, bool)> {
    let (mut w, key, handed) = STATE.with(|s| {
        let s = &mut *s.borrow_mut();
        let mut w = s.waiters.remove(&id)?;
        s.by_handle.remove(&(w.bc as usize));
        let key = if served {
            s.queue.served(id)
        } else {
            s.queue.remove(id)
        }?;
        let mut handed = false;
        if let (true, Some((timer, ticket))) = (hand_over, w.ready) {
            let next = s.queue.first(&key);
            if let Some((n, nw)) = next.and_then(|n| s.waiters.get_mut(&n).map(|nw| (n, nw))) {
                if waitq::same_request(&arg_bytes(&w.argv), &arg_bytes(&nw.argv))
                    && nw.ready.is_none()
                {
                    nw.ready = Some((timer, ticket));
                    if let Some(t) = s.tickets.get_mut(&ticket) {
                        t.0 = n;
                    }
                    w.ready = None;
                    handed = true;
                }
            }
        }
        Some((w, key, handed))
    })?;
    if let Some(t) = w.timeout.take() {
        waker::stop(t);
    }
    if let Some((timer, ticket)) = w.ready.take() {
        waker::stop(timer);
        STATE.with(|s| s.borrow_mut().tickets.remove(&ticket));
    }
    recount();
    Some((w, key, handed))
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

/// Runs a waiter's attempt on `ctx` (in its database); with `as_of`, as
/// of that instant ([`clock::as_of`]) if every one of its buckets has its
/// key, else as of now (a missing key is a full bucket as of now only: as
/// of an earlier instant it would be read as full then, and a bucket that
/// filled up since would hand out its tokens again). Returns the outcome,
/// the instant it was tried as of (one reading of the clock, so that a
/// denial's wait counts from the instant it was decided at), and whether
/// that is `as_of`.
fn try_waiter(
    ctx: NonNull<raw::RedisModuleCtx>,
    id: WaiterId,
    dry: bool,
    as_of: Option<i64>,
) -> Option<(Result<Try, CmdError>, i64, bool)> {
    let (db, argv, event, attempt, key_args) = STATE.with(|s| {
        let s = s.borrow();
        let w = s.waiters.get(&id)?;
        Some((w.db, w.argv.clone(), w.event, w.attempt, w.key_args.clone()))
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
    let as_of = as_of.filter(|_| {
        key_args.clone().all(|i| {
            c.read_bucket(a.key(i))
                .map_or(true, |k| k.stored().is_some())
        })
    });
    let at = as_of.unwrap_or_else(clock::server_now_us);
    Some((
        clock::as_of(at, || store::for_queue(|| attempt(&c, &a, dry))),
        at,
        as_of.is_some(),
    ))
}

/// Tries the first in line of `key`'s queue, granting while they fit. A
/// first in line that does not fit waits in the queue of the bucket that
/// makes it wait (it moves there if that is another of its buckets) with a
/// timer for when it may fit. With `as_of` (a timer that ran late), the
/// tries are made as of that instant and then as of each instant the next
/// one could fit, up to now ([`clock::as_of`]): grants come when the
/// tokens did, and a late timer wastes no refill.
fn serve(ctx: *mut raw::RedisModuleCtx, key: QKey, as_of: Option<i64>) {
    let Some(ctx) = NonNull::new(ctx) else { return };
    let db = selected_db(ctx.as_ptr());
    let mut denied = HashSet::new();
    let mut at = as_of.filter(|&t| t < clock::server_now_us());
    let mut work = vec![key];
    while let Some(k) = work.pop() {
        while let Some(id) = STATE.with(|s| s.borrow().queue.first(&k)) {
            if denied.contains(&id) {
                break;
            }
            let Some((outcome, tried_at, backdated)) = try_waiter(ctx, id, false, at) else {
                break;
            };
            at = at.filter(|_| backdated);
            match outcome {
                Ok(t) if !t.granted => {
                    let due = waitq::due_at(tried_at, t.wait_us);
                    let to = STATE.with(|s| {
                        let s = s.borrow();
                        let w = s.waiters.get(&id)?;
                        Some((w.keys.get(t.blocking)?.clone(), w.costs[t.blocking]))
                    });
                    let Some((to, cost)) = to else { break };
                    // Its bucket would have had room before now: try it then.
                    if let (true, Some(_), Some(d)) = (to == k, at, due) {
                        if d < clock::server_now_us() {
                            at = Some(d);
                            continue;
                        }
                    }
                    denied.insert(id);
                    let moved = to != k;
                    if moved {
                        STATE.with(|s| s.borrow_mut().queue.move_to(id, to.clone(), cost));
                    }
                    if STATE.with(|s| s.borrow().queue.is_first(id)) {
                        schedule_ready(id, due);
                    }
                    if moved {
                        // The next in line here may fit.
                        work.push(to);
                    } else {
                        break;
                    }
                }
                outcome => {
                    if let Some((w, _, _)) = take(id, false, true) {
                        let reply = match outcome {
                            Ok(t) => Reply::Ints(t.reply),
                            Err(e) => e.into(),
                        };
                        hand_back(w.bc, Some(reply));
                    }
                }
            }
        }
    }
    if selected_db(ctx.as_ptr()) != db {
        // SAFETY: ctx is live; db is the database it had.
        unsafe { raw::RedisModule_SelectDb.unwrap()(ctx.as_ptr(), db) };
    }
}

/// Sets (or moves) the timer that tries `id` again at `due` (the server's
/// clock, µs; `None`: no timer, it waits for a give-back or its deadline).
fn schedule_ready(id: WaiterId, due: Option<i64>) {
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
    if let Some(due) = due {
        let ticket = STATE.with(|s| {
            let s = &mut *s.borrow_mut();
            s.next_ticket += 1;
            s.tickets.insert(s.next_ticket, (id, due));
            s.next_ticket
        });
        let timer = waker::create(
            waitq::ready_in(due, clock::fine_now_us(), clock::tick_us()),
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
        let found = STATE.with(|s| {
            let s = &mut *s.borrow_mut();
            let (id, due) = s.tickets.remove(&ticket)?;
            if let Some(w) = s.waiters.get_mut(&id) {
                w.ready = None;
            }
            s.queue.key_of(id).cloned().map(|k| (k, due))
        });
        if let Some((key, due)) = found {
            serve(ctx, key, Some(due));
        }
    })
}

/// Tries the queue of a bucket whose first in line changed (data: a
/// `Box<QKey>`).
extern "C" fn serve_later(ctx: *mut raw::RedisModuleCtx, data: *mut c_void) {
    guard((), || {
        // SAFETY: data is the box leaked in `next_in_line`, used once.
        let key = unsafe { Box::from_raw(data.cast::<QKey>()) };
        serve(ctx, *key, None);
    })
}

/// After the first in line of `key` changed without a grant (it left, or
/// a newcomer's flow put it first): a timer tries the new first in line at
/// once (from a context where writing is ordinary).
fn next_in_line(key: QKey) {
    if STATE.with(|s| s.borrow().queue.is_waited(std::slice::from_ref(&key))) {
        let data = Box::into_raw(Box::new(key));
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
        let key = STATE.with(|s| s.borrow().queue.key_of(id).cloned());
        let Some(key) = key else { return };
        serve(ctx, key, None);
        let Some(nn) = NonNull::new(ctx) else { return };
        if let Some(Some(outcome)) = STATE
            .with(|s| s.borrow().waiters.contains_key(&id))
            .then(|| try_waiter(nn, id, true, None).map(|(o, _, _)| o))
        {
            if let Some((w, key, handed)) = take(id, true, false) {
                let reply = match outcome {
                    Ok(t) => Reply::Ints(t.reply),
                    Err(e) => e.into(),
                };
                hand_back(w.bc, Some(reply));
                if !handed {
                    serve(ctx, key, None);
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
        if let Some((w, _, _)) = take(id, false, false) {
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
        if let Some((w, key, handed)) = take(id, true, false) {
            hand_back(w.bc, None);
            if first && !handed {
                next_in_line(key);
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
                let outcome = try_waiter(nn, id, true, None).map(|(o, _, _)| o);
                if let Some((w, key, handed)) = take(id, true, false) {
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
                        next_in_line(key);
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
