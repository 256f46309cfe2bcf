//! Unblocks clients waiting in `BLOCK` when their wait is over, measured on
//! the monotonic clock.
//!
//! Redis' module timers follow the wall clock (`moduleTimerHandler` compares
//! each timer with `ustime()`), so a step of the server clock back holds a
//! pending timer for the length of the step: a 1 s `BLOCK` across a 20 s
//! step back was answered after 21 s. Instead, one thread sleeps until the
//! earliest due instant (`Condvar::wait_timeout` and `Instant` both use
//! `CLOCK_MONOTONIC`) and unblocks the client itself:
//! `RedisModule_UnblockClient` may be called from any thread (it queues the
//! client under Redis' own mutex and wakes the event loop), and the reply
//! callback then runs on the main thread.
//!
//! Every scheduled client is unblocked exactly once, by the thread when it
//! is due. (To unblock one earlier, take it out of `Queue::pending` under
//! the lock first: the thread skips handles that are no longer pending.)

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::raw::c_void;
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use redis_module::raw;

use super::entry::guard;

/// Clients waiting to be unblocked: by due instant, and the private data
/// each one's reply callback gets, by handle address.
#[derive(Default)]
struct Queue {
    due: BinaryHeap<Reverse<(Instant, usize)>>,
    pending: HashMap<usize, usize>,
}

static QUEUE: LazyLock<Mutex<Queue>> = LazyLock::new(Mutex::default);
static CHANGED: Condvar = Condvar::new();
static THREAD: OnceLock<bool> = OnceLock::new();

fn queue() -> MutexGuard<'static, Queue> {
    // Nothing panics while holding the lock; if something did, the queue
    // itself is still consistent.
    QUEUE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the waker thread if it is not running; false if it cannot be
/// started (then nothing may be scheduled: the caller must not block).
pub fn start() -> bool {
    *THREAD.get_or_init(|| {
        std::thread::Builder::new()
            .name("tb-waker".into())
            .spawn(run)
            .is_ok()
    })
}

/// Unblocks `bc` with `privdata` at `due` (call [`start`] first).
pub fn schedule(bc: *mut raw::RedisModuleBlockedClient, due: Instant, privdata: *mut c_void) {
    let mut q = queue();
    q.pending.insert(bc as usize, privdata as usize);
    q.due.push(Reverse((due, bc as usize)));
    drop(q);
    CHANGED.notify_one();
}

/// The thread: sleeps until the earliest due instant, then unblocks every
/// client that is due and still scheduled.
fn run() {
    let mut q = queue();
    loop {
        let now = Instant::now();
        match q.due.peek() {
            None => q = CHANGED.wait(q).unwrap_or_else(|e| e.into_inner()),
            Some(&Reverse((at, _))) if at > now => {
                q = CHANGED
                    .wait_timeout(q, at - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            Some(&Reverse((_, bc))) => {
                q.due.pop();
                if let Some(privdata) = q.pending.remove(&bc) {
                    guard((), || {
                        // SAFETY: `bc` came from RedisModule_BlockClient and is
                        // unblocked exactly once (it was still pending, under
                        // the lock every unblocker takes); Redis allows this
                        // call from any thread and hands `privdata` to the
                        // reply and free callbacks.
                        unsafe {
                            raw::RedisModule_UnblockClient.unwrap()(
                                bc as *mut _,
                                privdata as *mut _,
                            )
                        };
                    });
                }
            }
        }
    }
}
