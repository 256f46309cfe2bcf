//! Timers on the monotonic clock, for waits that must last a given real time
//! (a `BLOCK` holds its reply the wait it was promised).
//!
//! Redis' module timers follow the wall clock (`moduleTimerHandler` compares
//! each timer with `ustime()`), so a step of the server clock back holds a
//! pending timer for the length of the step: a 1 s `BLOCK` across a 20 s
//! step back was answered after 21 s. These timers have the same shape
//! ([`create`], [`stop`] with the time left) but one thread keeps the time:
//! it sleeps until the earliest due instant (`Condvar::wait_timeout` and
//! `Instant` both use `CLOCK_MONOTONIC`), then asks the main thread to run
//! what is due through `RedisModule_EventLoopAddOneShot` (callable from any
//! thread, Redis 7.0+). Callbacks run on the main thread, like Redis timer
//! callbacks, so they may use the module API freely.
//!
//! A timer runs its callback exactly once unless [`stop`]ped first: both
//! take it out of the table under its lock, on the main thread.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::os::raw::c_void;
use std::sync::{Condvar, LazyLock, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use redis_module::raw;

use super::entry::guard;

/// What a timer runs, on the main thread, with its data.
pub type Callback = fn(*mut c_void);

/// A pending timer, for [`stop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

struct Timer {
    due: Instant,
    callback: Callback,
    /// The callback's data (a pointer kept as an address: it is only ever
    /// dereferenced by the callback, on the main thread).
    data: usize,
}

#[derive(Default)]
struct Table {
    timers: HashMap<u64, Timer>,
    /// Due instants of the timers, earliest first; may still hold stopped ones.
    order: BinaryHeap<Reverse<(Instant, u64)>>,
    next_id: u64,
    /// A drain is queued on the main thread and has not run yet.
    drain_queued: bool,
}

static TABLE: LazyLock<Mutex<Table>> = LazyLock::new(Mutex::default);
static CHANGED: Condvar = Condvar::new();
static THREAD: OnceLock<bool> = OnceLock::new();

fn table() -> MutexGuard<'static, Table> {
    // Nothing panics while holding the lock; if something did, the table
    // itself is still consistent.
    TABLE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts the clock thread if it is not running; false if it cannot be
/// started (then [`create`] must not be relied on: the caller must not wait).
pub fn start() -> bool {
    *THREAD.get_or_init(|| {
        std::thread::Builder::new()
            .name("tb-timers".into())
            .spawn(keep_time)
            .is_ok()
    })
}

/// Runs `callback(data)` on the main thread `after` from now (call [`start`]
/// first). Main thread only.
pub fn create(after: Duration, callback: Callback, data: *mut c_void) -> TimerId {
    let due = Instant::now() + after;
    let mut t = table();
    t.next_id += 1;
    let id = t.next_id;
    t.timers.insert(
        id,
        Timer {
            due,
            callback,
            data: data as usize,
        },
    );
    t.order.push(Reverse((due, id)));
    let earliest = t.order.peek() == Some(&Reverse((due, id)));
    drop(t);
    if earliest {
        CHANGED.notify_one();
    }
    TimerId(id)
}

/// Stops a timer that has not run: returns the time it had left and its
/// data, or `None` if it has run already. Main thread only.
pub fn stop(id: TimerId) -> Option<(Duration, *mut c_void)> {
    let timer = table().timers.remove(&id.0)?;
    let left = timer.due.saturating_duration_since(Instant::now());
    Some((left, timer.data as *mut c_void))
}

/// `d` in whole milliseconds, rounded up: a wait reported from it is never
/// shorter than the time actually left (a client told 0 may go now).
pub fn ceil_ms(d: Duration) -> i64 {
    d.as_nanos().div_ceil(1_000_000).min(i64::MAX as u128) as i64
}

/// The clock thread: sleeps until the earliest timer is due, then queues a
/// drain on the main thread and waits for it to have run.
fn keep_time() {
    let mut t = table();
    loop {
        while let Some(&Reverse((_, id))) = t.order.peek() {
            if t.timers.contains_key(&id) {
                break;
            }
            t.order.pop();
        }
        let now = Instant::now();
        let wait = match t.order.peek() {
            _ if t.drain_queued => None,
            None => None,
            Some(&Reverse((due, _))) if due > now => Some(due - now),
            Some(_) => {
                // SAFETY: the API pointers are set at module load; this
                // function may be called from any thread.
                let queued = unsafe {
                    raw::RedisModule_EventLoopAddOneShot.unwrap()(Some(drain), std::ptr::null_mut())
                };
                t.drain_queued = queued == raw::Status::Ok as i32;
                // If Redis refused, try again shortly rather than spin.
                (!t.drain_queued).then_some(Duration::from_millis(1))
            }
        };
        t = match wait {
            Some(d) => {
                CHANGED
                    .wait_timeout(t, d)
                    .unwrap_or_else(|e| e.into_inner())
                    .0
            }
            None => CHANGED.wait(t).unwrap_or_else(|e| e.into_inner()),
        };
    }
}

/// On the main thread: runs every timer that is due, in due order.
extern "C" fn drain(_data: *mut c_void) {
    guard((), run_due)
}

fn run_due() {
    let now = Instant::now();
    let mut due = Vec::new();
    {
        let mut t = table();
        t.drain_queued = false;
        while let Some(&Reverse((at, id))) = t.order.peek() {
            if at > now {
                break;
            }
            t.order.pop();
            if let Some(timer) = t.timers.remove(&id) {
                due.push(timer);
            }
        }
    }
    CHANGED.notify_one();
    for timer in due {
        guard((), || (timer.callback)(timer.data as *mut c_void));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_ms_never_reports_less_than_is_left() {
        assert_eq!(ceil_ms(Duration::ZERO), 0);
        // Under a millisecond left is not "due now".
        assert_eq!(ceil_ms(Duration::from_nanos(1)), 1);
        assert_eq!(ceil_ms(Duration::from_micros(400)), 1);
        assert_eq!(ceil_ms(Duration::from_millis(2)), 2);
        assert_eq!(ceil_ms(Duration::from_micros(2001)), 3);
        assert_eq!(ceil_ms(Duration::MAX), i64::MAX);
    }
}
