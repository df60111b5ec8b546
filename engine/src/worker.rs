//! The maintenance worker: one background thread for the disk work that no
//! request may wait for on the event loop or under a lock a request needs
//! (ARCHITECTURE.md, "Threads and locks"). Today: a group's first load
//! after open (the verifying scan of its active segment, up to
//! `segment_bytes_max`), the index of a sealed segment on its first read, a
//! dedup window rebuilt from the log, a user's or a group's lookup in the
//! mapped runs while the saved state loads, and the removal of deleted
//! groups' directories. Later steps of storage v2 add promotions and reclamation.
//!
//! Representation: two FIFO queues behind one mutex (memory only; a job
//! never runs under it).
//! - *Request jobs* are the ones a request waits for. Each gets a ticket;
//!   tickets are handed out and completed in order, so "every ticket up to
//!   [`Worker::settled`] is done" (the shape of commit rounds): a waiter
//!   with many parked requests asks one number. A request job queued again
//!   under the same key while the first is still queued gets the first's
//!   ticket (a thousand PULLs of one unloaded group queue one load).
//! - *Background jobs* are the ones nobody waits for (a trash removal).
//!   They run only while no request job is queued, and each is one bounded
//!   step (it queues its own continuation), so a request job waits behind
//!   at most one step of background work.
//!
//! After every request job the worker calls its `on_settled` hook (the
//! engine's commit listeners: the server's event loop is woken the same way
//! as after a commit round and finishes what it parked).
//!
//! Invariant: a job holds no engine lock while it does I/O; it takes locks
//! only to copy what it needs and to install what it built.
//! Cost: O(1) per queue operation; the jobs cost what their I/O costs.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

/// A job: runs once on the worker thread with the engine state `C`.
pub(crate) type Job<C> = Box<dyn FnOnce(&Worker<C>, &C) + Send>;

/// The queues of a worker, shared between its thread and its users.
pub(crate) struct Worker<C> {
    state: Mutex<Queues<C>>,
    /// Wakes the worker (work arrived, or stop).
    work_cv: Condvar,
    /// Wakes waiters of tickets.
    settled_cv: Condvar,
}

/// Identifies a request job for coalescing: the group (a user for
/// [`Need::UserGroups`]) and what it needs.
pub(crate) type Key = (u64, Need);

/// What a request job makes ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Need {
    /// The group's log is loaded (its active segment verified).
    Log,
    /// The sealed segment with this base msg_id has its verified index.
    Index(u64),
    /// The group's send path is ready: log loaded, dedup window in memory.
    Assign,
    /// While saved state loads in the background: every saved group of
    /// the user (the key's id) is registered, from the user index in the
    /// mapped runs.
    UserGroups,
    /// While saved state loads in the background: the group (the key's
    /// id) is registered from the mapped runs, or known absent there.
    Registered,
}

struct Queues<C> {
    requests: VecDeque<(u64, Key, Job<C>)>,
    background: VecDeque<Job<C>>,
    /// Ticket of each queued (not yet started) request job, by key.
    queued: HashMap<Key, u64>,
    /// The last ticket handed out.
    last_ticket: u64,
    /// Every ticket up to this one is done.
    settled: u64,
    /// A job is running on the thread.
    running: bool,
    stopping: bool,
    /// The thread ended: no job runs any more.
    exited: bool,
}

impl<C: Send + Sync + 'static> Worker<C> {
    pub(crate) fn new() -> Self {
        Worker {
            state: Mutex::new(Queues {
                requests: VecDeque::new(),
                background: VecDeque::new(),
                queued: HashMap::new(),
                last_ticket: 0,
                settled: 0,
                running: false,
                stopping: false,
                exited: false,
            }),
            work_cv: Condvar::new(),
            settled_cv: Condvar::new(),
        }
    }

    /// Queues a request job (or finds the queued one with the same key) and
    /// returns its ticket; `None` once the worker stopped (shutting down).
    pub(crate) fn request(
        &self,
        key: Key,
        job: impl FnOnce(&Worker<C>, &C) + Send + 'static,
    ) -> Option<u64> {
        let mut q = self.state.lock();
        if q.stopping || q.exited {
            return None;
        }
        if let Some(&ticket) = q.queued.get(&key) {
            return Some(ticket);
        }
        q.last_ticket += 1;
        let ticket = q.last_ticket;
        q.queued.insert(key, ticket);
        q.requests.push_back((ticket, key, Box::new(job)));
        drop(q);
        self.work_cv.notify_one();
        Some(ticket)
    }

    /// Queues a background step; dropped if the worker stopped (what it
    /// would have done is redone at the next open).
    pub(crate) fn background(&self, job: impl FnOnce(&Worker<C>, &C) + Send + 'static) {
        let mut q = self.state.lock();
        if q.stopping || q.exited {
            return;
        }
        q.background.push_back(Box::new(job));
        drop(q);
        self.work_cv.notify_one();
    }

    /// Every request ticket up to this one is done; `u64::MAX` once the
    /// worker stopped (no ticket will be done by it any more: waiters find
    /// out by trying again, which then fails with `ShuttingDown`).
    pub(crate) fn settled(&self) -> u64 {
        let q = self.state.lock();
        if q.exited || q.stopping {
            u64::MAX
        } else {
            q.settled
        }
    }

    /// Blocks until `ticket` is done; `ShuttingDown` if the worker stopped
    /// first.
    pub(crate) fn wait(&self, ticket: u64) -> Result<()> {
        let mut q = self.state.lock();
        loop {
            if q.settled >= ticket {
                return Ok(());
            }
            if q.exited || q.stopping {
                return Err(Error::ShuttingDown);
            }
            self.settled_cv.wait(&mut q);
        }
    }

    /// Starts the worker thread over `ctx`, which owns this worker
    /// (`queues` finds it there). `on_settled` runs on the worker thread
    /// after every request job and when the thread ends.
    pub(crate) fn spawn(
        ctx: Arc<C>,
        queues: fn(&C) -> &Worker<C>,
        on_settled: fn(&C),
    ) -> Result<JoinHandle<()>> {
        std::thread::Builder::new()
            .name("tidemark-worker".into())
            .spawn(move || run(&*ctx, queues(&ctx), on_settled))
            .map_err(|e| Error::io("spawn maintenance worker", e))
    }

    /// Asks the thread to stop after the job it is running; queued jobs are
    /// dropped. The caller joins the thread.
    pub(crate) fn stop(&self) {
        let mut q = self.state.lock();
        q.stopping = true;
        q.requests.clear();
        q.background.clear();
        q.queued.clear();
        drop(q);
        self.work_cv.notify_all();
        self.settled_cv.notify_all();
    }

    /// Blocks until no job is queued or running (tests: a deterministic
    /// point after background work, such as a trash removal).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn wait_idle(&self) {
        let mut q = self.state.lock();
        while (q.running || !q.requests.is_empty() || !q.background.is_empty()) && !q.exited {
            self.settled_cv.wait(&mut q);
        }
    }
}

/// Marks the worker gone when dropped, also on unwinding, so waiters learn.
struct Exited<'a, C: Send + Sync + 'static> {
    worker: &'a Worker<C>,
    ctx: &'a C,
    on_settled: fn(&C),
}

impl<C: Send + Sync + 'static> Drop for Exited<'_, C> {
    fn drop(&mut self) {
        let mut q = self.worker.state.lock();
        q.exited = true;
        q.requests.clear();
        q.background.clear();
        q.queued.clear();
        drop(q);
        self.worker.settled_cv.notify_all();
        (self.on_settled)(self.ctx);
    }
}

fn run<C: Send + Sync + 'static>(ctx: &C, worker: &Worker<C>, on_settled: fn(&C)) {
    let _exited = Exited {
        worker,
        ctx,
        on_settled,
    };
    loop {
        let mut q = worker.state.lock();
        // Ticket 0: a background step (nobody waits for it).
        let (ticket, job) = loop {
            if q.stopping {
                return;
            }
            if let Some((ticket, key, job)) = q.requests.pop_front() {
                q.queued.remove(&key);
                break (ticket, job);
            }
            if let Some(job) = q.background.pop_front() {
                break (0, job);
            }
            worker.work_cv.wait(&mut q);
        };
        q.running = true;
        drop(q);
        job(worker, ctx);
        let mut q = worker.state.lock();
        q.running = false;
        if ticket > 0 {
            q.settled = ticket;
        }
        drop(q);
        worker.settled_cv.notify_all();
        if ticket > 0 {
            on_settled(ctx);
        }
    }
}
