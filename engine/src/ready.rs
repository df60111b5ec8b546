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

use std::sync::Arc;

use crate::commit::small_log;
use crate::commit::worker_jobs;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::logs::extents::ExtentList;
use crate::logs::group_log::{GroupLog, LogContext, NeedsIndex, ReadBatch, Scan, Scanned};
use crate::worker::Need;

impl Engine {
    /// The error for a request whose group does not meet `need` yet: the
    /// job that meets it is queued (or found queued) on the worker.
    pub(crate) fn not_ready(&self, group: &Arc<Group>, need: Need) -> Error {
        let queued = worker_jobs::request(&self.shared, group, need);
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
                Err(Error::NotReady { ticket, .. }) => self.wait_ready(ticket)?,
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
        if ticket == crate::STATE_TICKET {
            self.shared.load.wait_settled();
            return Ok(());
        }
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
