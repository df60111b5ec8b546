//! A group's first use after open, off the requests' path: what a request
//! does when its group's files must be read first, and the maintenance
//! worker's jobs that read them.
//!
//! After open most groups are as the checkpoint left them (`LogSlot::
//! Unloaded`): loading one scans its active segment (up to
//! `segment_bytes_max`, CRC checked), a sealed segment's index is built by
//! a scan on its first read, and the first send builds the group's
//! send state (`Group::assign`, `None` until then) by rebuilding the dedup
//! window from the log. The same holds after the idle sweep (`commit.rs`)
//! dropped an idle group's send state and unloaded its small log, and
//! after a send state left memory for the node's dedup budget. A request
//! never does that work itself: the `try_`
//! requests (the server's event loop) get `Error::NotReady` with a ticket
//! and the worker does the work ([`Need`]); the blocking requests (CLI,
//! tests, benches) wait for the ticket and run again ([`Engine::blocking`]).
//! The result is the one 0.1 gave: verified data only; damage found by a
//! load or a scan makes the group (or the reads of that segment)
//! `GroupDamaged`. (One exception needs no disk: a loaded log holding no
//! record, a group just created, gets its empty send state on the
//! request's thread, [`empty_send_state`].)
//!
//! The idle sweep may unload a log between a job and the request it
//! serves: the request then gets `NotReady` again with a new job (nothing
//! is lost: every ticket is settled, and a job queued after another has a
//! later ticket). Each repeat needs the sweep to find the group unused for
//! `idle_evict_ms` since the job loaded it, which a request that runs
//! again within that time never meets.
//!
//! Invariant: the jobs read files with no lock held; they take a group's
//! locks only to copy what the scan needs and to install what it built,
//! and install only if the group is still in the state they scanned.
//! Cost on the request's path: one lock and a queue push (a second request
//! for the same work gets the queued job's ticket).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::clock::now_ms;
use crate::commit::dedup::{DedupWindow, WindowLimits};
use crate::commit::thread::Shared;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::group::{AssignState, Group, LogSlot};
use crate::logs::extents::ExtentList;
use crate::logs::group_log::{GroupLog, LogContext, NeedsIndex, ReadBatch, Scan, Scanned};
use crate::logs::small_log;
use crate::worker::{Need, Worker};

impl Engine {
    /// The error for a request whose group does not meet `need` yet: the
    /// job that meets it is queued (or found queued) on the worker.
    pub(crate) fn not_ready(&self, group: &Arc<Group>, need: Need) -> Error {
        let g = group.clone();
        let queued = self
            .shared
            .worker
            .request((group.id, need), move |_, shared| run(shared, &g, need));
        match queued {
            Some(ticket) => Error::NotReady {
                group: group.id,
                ticket,
            },
            None => Error::ShuttingDown,
        }
    }

    /// Runs `request` (a deferring request) until it is not `NotReady`,
    /// waiting for the worker's job in between: the blocking form of the
    /// `try_` requests. `request` holds no lock when it returns, so none is
    /// held while this waits.
    pub(crate) fn blocking<R>(&self, mut request: impl FnMut() -> Result<R>) -> Result<R> {
        loop {
            match request() {
                Err(Error::NotReady { ticket, .. }) => self.shared.worker.wait(ticket)?,
                other => return other,
            }
        }
    }

    /// Every job a `NotReady` named with a ticket up to this one is done
    /// (`u64::MAX` once the engine is shutting down: requests run again
    /// then fail with `ShuttingDown`). One lock; the server compares it
    /// with the tickets of the requests it parked, after the commit
    /// listener woke it.
    pub fn settled_load(&self) -> u64 {
        self.shared.worker.settled()
    }

    /// Blocks until the job of `ticket` (from `Error::NotReady`) is done.
    pub fn wait_ready(&self, ticket: u64) -> Result<()> {
        self.shared.worker.wait(ticket)
    }

    /// Blocks until the maintenance worker has nothing queued or running
    /// (tests: after a deletion, the trash is empty then).
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn wait_worker_idle(&self) {
        self.shared.worker.wait_idle();
    }

    /// Runs `f` on the group's log: its loaded segment log, or a small
    /// group's extent list (copied under the slot's lock, read after it);
    /// `NotReady` if the log is not loaded yet or `f` needs a sealed
    /// segment's index (the job is queued). `f` reads with `Scan::Refused`.
    pub(crate) fn with_log<R>(
        &self,
        group: &Arc<Group>,
        f: impl FnOnce(&LogView<'_>) -> Result<Scanned<R>>,
    ) -> Result<R> {
        let slot = group.log.read();
        group.debug_check_head(&slot);
        let need = match &*slot {
            LogSlot::Loaded(log) => match f(&LogView::Segmented(log))? {
                Ok(r) => return Ok(r),
                Err(NeedsIndex { base }) => Need::Index(base),
            },
            LogSlot::Unloaded(_) => Need::Log,
            LogSlot::Small(list) => {
                let view = LogView::Small {
                    group,
                    list: list.clone(),
                };
                // Reading marks verified extents under the slot's lock.
                drop(slot);
                match f(&view)? {
                    Ok(r) => return Ok(r),
                    Err(NeedsIndex { base }) => Need::Index(base),
                }
            }
            LogSlot::Damaged { reason, .. } => {
                return Err(Error::GroupDamaged {
                    group: group.id,
                    reason: reason.clone(),
                })
            }
            LogSlot::Deleted => return Err(Error::GroupNotFound { group: group.id }),
        };
        Err(self.not_ready(group, need))
    }

    /// `NotReady` for a group whose log is not loaded (the load is queued).
    pub(crate) fn ensure_loaded(&self, group: &Arc<Group>) -> Result<()> {
        let unloaded = matches!(&*group.log.read(), LogSlot::Unloaded(_));
        if unloaded {
            return Err(self.not_ready(group, Need::Log));
        }
        Ok(())
    }

    /// The error for a send whose group has no send state in
    /// memory: why the worker could not make
    /// it ready last time, or why it cannot be (a damaged group), or
    /// `NotReady` with the job that makes it ready. The caller holds the
    /// group's `assign` lock.
    pub(crate) fn assign_not_ready(&self, group: &Arc<Group>) -> Error {
        if let Some(e) = self.shared.ready_failures.lock().remove(&group.id) {
            return e;
        }
        match &*group.log.read() {
            LogSlot::Damaged { reason, .. } => {
                return Error::GroupDamaged {
                    group: group.id,
                    reason: reason.clone(),
                }
            }
            LogSlot::Deleted => return Error::GroupNotFound { group: group.id },
            LogSlot::Loaded(_) | LogSlot::Unloaded(_) | LogSlot::Small(_) => {}
        }
        self.not_ready(group, Need::Assign)
    }
}

/// A group's log as a read sees it ([`Engine::with_log`]): a loaded
/// segment log, or a small group's extents in the shared journal files.
pub(crate) enum LogView<'a> {
    Segmented(&'a GroupLog),
    Small { group: &'a Group, list: ExtentList },
}

impl LogView<'_> {
    /// The oldest id a read may return.
    pub fn floor(&self) -> u64 {
        match self {
            LogView::Segmented(log) => log.floor(),
            LogView::Small { list, .. } => list.floor(),
        }
    }

    /// As `GroupLog::read_with`.
    pub fn read_with(
        &self,
        ctx: &LogContext,
        scan: Scan,
        after: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Scanned<ReadBatch>> {
        match self {
            LogView::Segmented(log) => log.read_with(ctx, scan, after, max_count, max_bytes),
            LogView::Small { group, list } => {
                small_log::read_above(ctx, group, list, after, max_count, max_bytes).map(Ok)
            }
        }
    }

    /// As `GroupLog::read_before`.
    pub fn read_before(
        &self,
        ctx: &LogContext,
        scan: Scan,
        before: u64,
        lowest: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Scanned<ReadBatch>> {
        match self {
            LogView::Segmented(log) => {
                log.read_before(ctx, scan, before, lowest, max_count, max_bytes)
            }
            LogView::Small { group, list } => {
                small_log::read_before(ctx, group, list, before, lowest, max_count, max_bytes)
                    .map(Ok)
            }
        }
    }
}

/// Keeps in `acc` the `NotReady` with the latest ticket (`e` is one): a
/// request that needs several jobs asks for all of them, then waits once,
/// for the last (tickets settle in order).
pub(crate) fn keep_latest(acc: &mut Option<Error>, e: Error) {
    let ticket_of = |e: &Error| match e {
        Error::NotReady { ticket, .. } => *ticket,
        _ => 0,
    };
    if acc.as_ref().is_none_or(|a| ticket_of(a) < ticket_of(&e)) {
        *acc = Some(e);
    }
}

/// Queues the load of `group`'s log with no request waiting for it: the
/// segment erasure pass's, for an unloaded group whose active segment
/// holds a recalled payload (`erase_segments.rs`). The same job (and key)
/// a request's first use queues, so either coalesces with the other;
/// dropped if the worker stopped (the next open's pass queues it again).
pub(crate) fn queue_load(shared: &Shared, group: &Arc<Group>) {
    let g = group.clone();
    let _ticket = shared
        .worker
        .request((group.id, Need::Log), move |_, shared| {
            run(shared, &g, Need::Log)
        });
}

/// A worker job: makes `group` meet `need`.
fn run(shared: &Shared, group: &Arc<Group>, need: Need) {
    match need {
        Need::Log => load(shared, group),
        Need::Index(base) => build_index(shared, group, base),
        Need::Assign => {
            if let Err(e) = prepare_assign(shared, group) {
                log::warn!("group {}: send path not ready: {e}", group.id);
                shared.ready_failures.lock().insert(group.id, e);
            }
        }
    }
}

/// Loads the group's log if it is unloaded (the verifying scan without a
/// lock: `Group::load_if_unloaded`), and lists the group for the idle
/// sweep, which unloads a small log again once it is idle (`commit.rs`).
fn load(shared: &Shared, group: &Group) {
    if let Some(load) = group.load_if_unloaded(&shared.ctx) {
        shared.dedup.touch_used(group.id);
        shared.counters.group_loads.fetch_add(1, Ordering::Relaxed);
        if load.bytes_cut > 0 {
            log::warn!(
                "group {}: cut {} bytes written after the last checkpoint",
                group.id,
                load.bytes_cut
            );
        }
    }
}

/// Builds the index of sealed segment `base`: copies what the scan needs
/// under the log's lock, scans without it, installs under it.
fn build_index(shared: &Shared, group: &Group, base: u64) {
    let job = match &*group.log.read() {
        LogSlot::Loaded(log) => log.index_job(base),
        _ => None,
    };
    let Some(job) = job else { return };
    let Some(built) = job.build(&shared.ctx) else {
        return;
    };
    if let LogSlot::Loaded(log) = &*group.log.read() {
        log.install_index(&job, built);
    }
}

/// Makes the group's send path ready: its log loaded, its dedup window
/// rebuilt from the log (each sealed segment the rebuild reaches gets its
/// index first, without the lock), then its send state installed under
/// `assign` if it still has none.
///
/// Nothing is assigned to a group without a send state (a state is dropped
/// only once its last round completed), so no record of it is applied
/// meanwhile: the log's head read with the window is still its head at
/// install (checked there all the same). The idle sweep may unload the log between any two of these
/// steps (it unloads only a group without a send state, under `assign`):
/// the job then loads it again. The state is installed only over a loaded
/// log, checked under `assign`, so a group with a send state always has
/// its log loaded and the commit thread never loads one to apply a record.
/// Each round of the loop needs the sweep to have found the group idle
/// since this job loaded it (`idle_evict_ms`), so it ends.
fn prepare_assign(shared: &Shared, group: &Group) -> Result<()> {
    let ctx = &shared.ctx;
    let limits = WindowLimits::from_config(&ctx.config);
    loop {
        load(shared, group);
        // A small group: its window from its records (at most
        // `small_group_bytes_max`), read from the journal files with no
        // lock held (the read marks what it verified under the slot's).
        let small = match &*group.log.read() {
            LogSlot::Small(list) => Some(list.clone()),
            _ => None,
        };
        let rebuilt = match small {
            Some(list) => {
                let (w, last_ts) = DedupWindow::rebuild_small(ctx, group, &list, now_ms(), limits)?;
                Ok((w, list.next_id() - 1, last_ts))
            }
            None => match &*group.log.read() {
                LogSlot::Loaded(log) => {
                    DedupWindow::rebuild(log, ctx, Scan::Refused, now_ms(), limits)?
                        .map(|w| (w, log.head(), log.last_timestamp_ms()))
                }
                // Unloaded again by the idle sweep since `load`, or just
                // promoted.
                LogSlot::Unloaded(_) | LogSlot::Small(_) => continue,
                // Damaged or deleted: the request finds out from the slot.
                LogSlot::Damaged { .. } | LogSlot::Deleted => return Ok(()),
            },
        };
        let (dedup, head, last_timestamp_ms) = match rebuilt {
            Ok(done) => done,
            Err(NeedsIndex { base }) => {
                build_index(shared, group, base);
                continue;
            }
        };
        let mut slot = group.assign.lock();
        if group.is_deleting() || slot.is_some() {
            return Ok(()); // no longer needed
        }
        // Unloaded by the idle sweep since the rebuild, or (a request made
        // an empty log's state meanwhile, sent, and that state went idle)
        // moved on: start over.
        let still = match &*group.log.read() {
            LogSlot::Loaded(log) => log.head() == head,
            LogSlot::Small(list) => list.next_id() - 1 == head,
            _ => false,
        };
        if !still {
            continue;
        }
        shared.dedup.resized(0, dedup.len());
        // The assigned head starts at the applied one (see above).
        *slot = Some(Box::new(AssignState {
            last_id: head,
            last_timestamp_ms,
            last_round: 0,
            dedup,
        }));
        // Listed for the dedup budget and the idle sweep, as a send does.
        shared.dedup.touch(group.id);
        return Ok(());
    }
}

/// The send state of a group whose log is loaded and holds no record (a
/// group just created, or one whose records retention removed): an empty
/// window, made with no disk work, so a send needs no worker job. `None`
/// otherwise. The caller holds `assign` (which holds no state), so no
/// record of the group is queued and the log's head is the one to start
/// from.
pub(crate) fn empty_send_state(group: &Group) -> Option<AssignState> {
    let slot = group.log.read();
    let log = match &*slot {
        LogSlot::Loaded(log) => log,
        // A small group without records (with records, its window is
        // rebuilt from them by the worker).
        LogSlot::Small(list) => {
            return (list.next_id() == list.floor()).then(|| AssignState {
                last_id: list.next_id() - 1,
                ..AssignState::default()
            })
        }
        _ => return None,
    };
    (log.head() < log.floor()).then(|| AssignState {
        last_id: log.head(),
        last_timestamp_ms: log.last_timestamp_ms(),
        last_round: 0,
        dedup: DedupWindow::default(),
    })
}

/// Starts the maintenance worker of an engine whose shared state is
/// `shared`, and queues the trash sweep every open does.
pub(crate) fn start_worker(shared: &Arc<Shared>) -> Result<std::thread::JoinHandle<()>> {
    let handle = Worker::spawn(
        shared.clone(),
        |s: &Shared| &s.worker,
        crate::commit::thread::worker_settled,
    )?;
    // Whatever recovery moved to the trash is in the listing below.
    drop(shared.ctx.trash.take_moved());
    crate::logs::trash::sweep_in_background(
        &shared.worker,
        shared.ctx.vfs.clone(),
        shared.ctx.trash.dir().to_owned(),
    );
    Ok(handle)
}
