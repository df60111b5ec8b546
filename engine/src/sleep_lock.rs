//! The locks the commit thread shares with the senders (the server's event
//! loop) and the checkpointer: the pending round, the rounds' progress,
//! the dedup budget's lists, the live bytes of the shared files. A waiter for one of them sleeps in the kernel (a futex) once a
//! short busy spin did not get it, and the thread that unlocks wakes it.
//!
//! Why not `parking_lot` here, as elsewhere: its waiter calls
//! `sched_yield` several times before it sleeps. On a busy machine each
//! yield hands the CPU to every other runnable thread first (a compiler's,
//! another process's), so a lock held for a microsecond cost the commit
//! thread hundreds of milliseconds off the CPU, and every send in the
//! round waited with it (BENCHMARKS.md, "Send latency through
//! checkpoints: locks that sleep instead of yielding"). std's futex mutex
//! spins without yielding, then sleeps, and its waiter is woken on unlock.
//!
//! Like `parking_lot`'s, these locks are not poisoned: a panic while one
//! is held leaves its state as it was (the commit thread's exit guard
//! stops writes then).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Instant;

/// A mutex whose waiters sleep instead of yielding (module docs).
#[derive(Default)]
pub(crate) struct SleepMutex<T>(Mutex<T>);

/// What [`SleepMutex::lock`] gives: the lock is held until it is dropped.
pub(crate) type SleepGuard<'a, T> = MutexGuard<'a, T>;

impl<T> SleepMutex<T> {
    pub fn new(value: T) -> Self {
        SleepMutex(Mutex::new(value))
    }

    pub fn lock(&self) -> SleepGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock if no other thread holds it now; never waits.
    pub fn try_lock(&self) -> Option<SleepGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// A condition variable for [`SleepMutex`]: `wait` gives the guard back.
/// It counts its waiters, so a notify with none waiting (every send
/// notifies) costs no system call, as with `parking_lot`'s: a waiter is
/// counted while it holds the mutex, before it sleeps, so a notifier that
/// changed the state under the mutex after that sees it.
#[derive(Default)]
pub(crate) struct SleepCondvar {
    cv: Condvar,
    waiters: AtomicUsize,
}

impl SleepCondvar {
    pub fn new() -> Self {
        SleepCondvar::default()
    }

    pub fn wait<'a, T>(&self, guard: SleepGuard<'a, T>) -> SleepGuard<'a, T> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let guard = self.cv.wait(guard).unwrap_or_else(PoisonError::into_inner);
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    /// Waits until notified or until `deadline` (a spurious wake-up
    /// returns too: callers check their condition in a loop).
    pub fn wait_until<'a, T>(
        &self,
        guard: SleepGuard<'a, T>,
        deadline: Instant,
    ) -> SleepGuard<'a, T> {
        let timeout = deadline.saturating_duration_since(Instant::now());
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let guard = match self.cv.wait_timeout(guard, timeout) {
            Ok((guard, _)) => guard,
            Err(p) => p.into_inner().0,
        };
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        guard
    }

    pub fn notify_all(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.cv.notify_all();
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    /// Involuntary context switches of the calling thread so far: a
    /// `sched_yield` that let another thread run counts one.
    fn involuntary_switches() -> i64 {
        // SAFETY: getrusage writes the struct it is given, nothing else.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
        assert_eq!(rc, 0, "getrusage");
        usage.ru_nivcsw
    }

    /// The first CPU this process may run on.
    fn first_allowed_cpu() -> usize {
        // SAFETY: sched_getaffinity writes the set given; CPU_ISSET reads it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            let rc = libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set);
            assert_eq!(rc, 0, "sched_getaffinity");
            (0..libc::CPU_SETSIZE as usize)
                .find(|&cpu| libc::CPU_ISSET(cpu, &set))
                .expect("some CPU is allowed")
        }
    }

    /// Runs the calling thread on `cpu` only.
    fn pin_to(cpu: usize) {
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
        // sched_setaffinity read and write only the set given.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            let rc = libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
            assert_eq!(rc, 0, "sched_setaffinity");
        }
    }

    /// A thread waiting for a held lock while another thread wants its CPU
    /// (a busy loop pinned to the same CPU, as a build on a loaded
    /// machine) sleeps until the lock is free: it does not hand its CPU
    /// over again and again by yielding, which is what kept the commit
    /// thread off the CPU for hundreds of milliseconds behind a lock held
    /// for microseconds. Counted in context switches over several waits,
    /// not in time.
    #[test]
    fn a_waiter_sleeps_instead_of_yielding_its_cpu_to_busy_threads() {
        const WAITS: u64 = 8;
        let lock = Arc::new(SleepMutex::new(0u64));
        let stop = Arc::new(AtomicBool::new(false));
        let cpu = first_allowed_cpu();
        let hog = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                pin_to(cpu);
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        };
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (done, done_rx) = std::sync::mpsc::channel::<()>();
        let waiter = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                pin_to(cpu);
                let mut switches = 0;
                while go_rx.recv().is_ok() {
                    let before = involuntary_switches();
                    *lock.lock() += 1;
                    switches += involuntary_switches() - before;
                    let _ = done.send(());
                }
                switches
            })
        };
        for _ in 0..WAITS {
            let held = lock.lock();
            go.send(()).unwrap();
            // Long enough for the waiter to reach the lock and give up
            // spinning (a yielding waiter yields within microseconds),
            // short enough that the busy loop slows the tests that run
            // beside this one for a fraction of a second only.
            std::thread::sleep(Duration::from_millis(10));
            drop(held);
            done_rx.recv().unwrap();
        }
        drop(go);
        let switches = waiter.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        hog.join().unwrap();
        assert_eq!(*lock.lock(), WAITS);
        assert!(
            switches <= 3,
            "the waiter gave its CPU away {switches} times in {WAITS} waits"
        );
    }
}
