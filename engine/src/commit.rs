//! The commit thread: takes the pending round whole, writes it to the
//! journal with one write, syncs it per the fsync policy (one fdatasync for
//! the round, however many groups it touched), applies it to the group logs
//! and the membership tables (`apply.rs`, the applier replay uses too; a
//! group's records go to its log as one run), then completes the round and
//! wakes whoever waits. Cursor flushes, retention and checkpoints run here too, between
//! rounds, so they always see a state that matches a journal position.
//!
//! A failed sync, or a write that failed for any reason but a full disk, is
//! never retried: the round and every later one fail with `WritesStopped`,
//! and reads go on. Reopening recovers. A write that found the disk full
//! (`NoSpace`) took nothing in, so the work is held and written again once
//! space returns: a round where it stopped, cursors at the next flush, a
//! checkpoint a little later.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::apply;
use crate::catalog::Catalog;
use crate::checkpointer;
use crate::config::FsyncPolicy;
use crate::cursors::CursorTable;
use crate::dedup::DedupBudget;
use crate::error::{Error, Result};
use crate::flusher::Flusher;
use crate::group::Group;
use crate::group_log::LogContext;
use crate::journal::{self, body, EntryKind, Journal, ENTRY_HEADER_BYTES};
use crate::trash;
use crate::warn_limit::RepeatedWarning;
use crate::worker::Worker;

struct Committer {
    shared: Arc<Shared>,
    journal: Journal,
    /// Journal bytes written but not yet synced (interval and never policies).
    unsynced_bytes: u64,
    last_sync: Instant,
    last_cursor_flush: Instant,
    last_retention_check: Instant,
    last_space_check: Instant,
    /// Reused buffers: the round taken from senders, per-group staging, cursor entries.
    round_buf: Vec<u8>,
    staging: Vec<u8>,
    cursor_buf: Vec<u8>,
    /// `cursor_buf` holds cursor entries a full disk kept out of the
    /// journal; the next flush writes them (with any newer ones).
    cursor_buf_unwritten: bool,
    /// A checkpoint that found the disk full is not tried again before this.
    checkpoint_not_before: Instant,
    /// What the round being applied appended, for commit listeners.
    appended: Vec<GroupAppend>,
    /// Background write-back between checkpoints.
    flusher: Flusher,
    /// The full-disk warning, rate limited while writes are retried.
    no_space_warning: RepeatedWarning,
}

/// How often free space is measured while it is low (and idle), and how
/// long work a full disk stopped waits before it is written again.
const DISK_LOW_RECHECK: Duration = Duration::from_millis(200);

/// While the disk stays full, its warning is repeated at most this often.
const NO_SPACE_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// How long a checkpoint that found the disk full is put off.
const CHECKPOINT_RETRY_AFTER_NO_SPACE: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub duplicates: AtomicU64,
    pub rounds: AtomicU64,
    pub round_records_max: AtomicU64,
    pub journal_syncs: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_syncs: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub acks: AtomicU64,
    pub membership_rows_listed: AtomicU64,
    /// Group logs the maintenance worker loaded.
    pub group_loads: AtomicU64,
}

/// One operation of the pending round: the journal entry at `entry` in the
/// round buffer, for `group`.
pub(crate) struct Op {
    pub group: Arc<Group>,
    pub kind: EntryKind,
    pub entry: std::ops::Range<usize>,
    /// Where the commit thread puts the outcome of a membership operation.
    pub reply: Option<Arc<Reply>>,
}

/// The outcome of one membership operation, filled in when it is applied.
#[derive(Default)]
pub(crate) struct Reply(Mutex<Option<Result<u64>>>);

impl Reply {
    pub fn set(&self, r: Result<u64>) {
        *self.0.lock() = Some(r);
    }
    pub fn take(&self) -> Option<Result<u64>> {
        self.0.lock().take()
    }
}

/// The round being filled by senders and taken whole by the commit thread.
#[derive(Default)]
pub(crate) struct Pending {
    pub buf: Vec<u8>,
    pub ops: Vec<Op>,
    /// Number of the round being filled. Rounds complete in order.
    pub round: u64,
    pub shutdown: bool,
    /// A caller waits for moved cursors to be persisted with this round.
    pub flush_cursors: bool,
    /// A caller waits for a checkpoint after this round.
    pub checkpoint: bool,
    /// Shut down like a crash: no final checkpoint. Only
    /// `Engine::simulate_crash` (tests, `testing` feature) sets it.
    pub crash: bool,
}

/// Completion state of rounds.
#[derive(Default)]
pub(crate) struct Progress {
    pub completed: u64,
    /// The first round that failed, and why. No later round succeeds.
    pub failed: Option<(u64, String)>,
    pub commit_thread_exited: bool,
}

/// What a completed commit round changed, for listeners. Also sent with
/// nothing appended when writes stop or the commit thread ends (then every
/// parked operation has its outcome, an error, too), and when the
/// maintenance worker finished a job requests wait for (a request that got
/// `Error::NotReady` can run again once `Engine::settled_load` reached its
/// ticket).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitNotice {
    pub round: u64,
    /// Every group that got records in the round, with their id range.
    pub appended: Vec<GroupAppend>,
}

/// Records `first..=last` were appended to `group` (and are durable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupAppend {
    pub group: u64,
    pub first: u64,
    pub last: u64,
}

/// Called on the commit thread after each completed round.
pub type CommitListener = Arc<dyn Fn(&CommitNotice) + Send + Sync>;

pub(crate) struct Shared {
    pub ctx: LogContext,
    pub catalog: RwLock<Catalog>,
    pub cursors: CursorTable,
    pub pending: Mutex<Pending>,
    /// Wakes the commit thread (work arrived) and senders (room in the round).
    pub pending_cv: Condvar,
    pub progress: Mutex<Progress>,
    pub progress_cv: Condvar,
    pub writes_stopped: AtomicBool,
    /// Free disk space as last measured: at open, then by the commit thread.
    pub disk_free_bytes: AtomicU64,
    /// Set while the commit thread holds a round that a full disk stopped:
    /// new writes are refused with `DiskFull` whatever the reserve says.
    pub held_for_space: AtomicBool,
    pub counters: Counters,
    pub listeners: Mutex<Vec<CommitListener>>,
    /// Entries of all dedup windows, against `dedup_entries_total_max`.
    pub dedup: DedupBudget,
    /// The maintenance worker's queues (its thread is the engine's).
    pub worker: Worker<Shared>,
    /// Why the worker could not make a group's send path ready (its dedup
    /// window could not be rebuilt), for the next request that asks: that
    /// request gets the error instead of waiting for the same failure
    /// again. Taken by that request.
    pub ready_failures: Mutex<HashMap<u64, Error>>,
}

/// Called by the maintenance worker after each job a request waits for:
/// the commit listeners learn that parked requests may go on (a notice
/// with nothing appended, like the one after a failed round).
pub(crate) fn worker_settled(shared: &Shared) {
    let round = shared.progress.lock().completed;
    notify_listeners(shared, round, Vec::new());
}

/// What woke the commit thread.
enum Work {
    Round {
        ops: Vec<Op>,
        round: u64,
        flush_cursors: bool,
        checkpoint: bool,
    },
    Timer,
    Shutdown,
}

pub(crate) fn run(shared: Arc<Shared>, journal: Journal) {
    let now = Instant::now();
    let mut c = Committer {
        shared: shared.clone(),
        journal,
        unsynced_bytes: 0,
        last_sync: now,
        last_cursor_flush: now,
        last_retention_check: now,
        last_space_check: now,
        round_buf: Vec::new(),
        staging: Vec::new(),
        cursor_buf: Vec::new(),
        cursor_buf_unwritten: false,
        checkpoint_not_before: now,
        appended: Vec::new(),
        flusher: Flusher::start(
            shared.ctx.vfs.clone(),
            shared.ctx.config.data_dir.clone(),
            shared.ctx.config.journal_checkpoint_bytes,
        ),
        no_space_warning: RepeatedWarning::new(NO_SPACE_WARN_INTERVAL),
    };
    // Whatever ends this thread, a panic included, waiters must learn it.
    let _exit = ExitGuard(c.shared.clone());
    c.measure_free_space();
    c.main_loop();
}

/// Marks the commit thread gone (and writes stopped if it died early) when
/// dropped, also on unwinding.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        let mut p = self.0.progress.lock();
        p.commit_thread_exited = true;
        if std::thread::panicking() {
            self.0.writes_stopped.store(true, Ordering::Release);
            let round = self.0.pending.lock().round;
            let first_failed = round.min(p.completed + 1);
            p.failed
                .get_or_insert((first_failed, "commit thread panicked".into()));
        }
        let round = p.completed;
        drop(p);
        self.0.progress_cv.notify_all();
        notify_listeners(&self.0, round, Vec::new());
    }
}

/// Tells the commit listeners that round outcomes changed: `appended` for a
/// completed round, nothing when writes stopped or the thread ended.
fn notify_listeners(shared: &Shared, round: u64, appended: Vec<GroupAppend>) {
    let listeners = shared.listeners.lock().clone();
    if listeners.is_empty() {
        return;
    }
    let notice = CommitNotice { round, appended };
    for l in listeners {
        l(&notice);
    }
}

impl Committer {
    fn config(&self) -> &crate::config::Config {
        &self.shared.ctx.config
    }

    fn main_loop(&mut self) {
        loop {
            match self.next_work() {
                Work::Shutdown => break,
                Work::Timer => {
                    if let Err(e) = self.timers() {
                        let round = self.shared.pending.lock().round;
                        self.fail(round, e);
                    }
                }
                Work::Round {
                    ops,
                    round,
                    flush_cursors,
                    checkpoint,
                } => {
                    let mut result = self.commit_round(&ops, flush_cursors);
                    if result.is_ok() && checkpoint {
                        result = self.checkpoint(false);
                    }
                    self.finish_round(round, &ops, result);
                    self.flusher.journal_grew_to(self.journal.len());
                    self.measure_free_space();
                    // Under steady load the loop is never idle: run the
                    // timers (cursor flush, retention, interval sync) here too.
                    if Instant::now() >= self.next_deadline() {
                        if let Err(e) = self.timers() {
                            self.fail(round + 1, e);
                        }
                    }
                    if self.journal.len() >= self.config().journal_checkpoint_bytes
                        && !self.failed()
                        && Instant::now() >= self.checkpoint_not_before
                    {
                        if let Err(e) = self.checkpoint(false) {
                            self.fail(round + 1, e);
                        }
                    }
                }
            }
        }
        let crash = self.shared.pending.lock().crash;
        if !self.failed() && !crash {
            // Everything accepted was committed by the loop above.
            if let Err(e) = self.checkpoint(true) {
                log::error!("final checkpoint failed: {e}");
                let mut p = self.shared.progress.lock();
                p.failed.get_or_insert((u64::MAX, e.to_string()));
            }
        }
    }

    fn disk_low(&self) -> bool {
        self.shared.disk_free_bytes.load(Ordering::Acquire) < self.config().disk_free_min_bytes
    }

    /// Measures free space (one statvfs), so senders are refused before the
    /// disk is full and accepted again once space returns.
    fn measure_free_space(&mut self) {
        self.last_space_check = Instant::now();
        if self.config().disk_free_min_bytes == 0 {
            return;
        }
        match self
            .shared
            .ctx
            .vfs
            .free_bytes(&self.shared.ctx.config.data_dir)
        {
            Ok(free) => {
                let was_low = self.disk_low();
                self.shared.disk_free_bytes.store(free, Ordering::Release);
                match (was_low, self.disk_low()) {
                    (false, true) => {
                        log::warn!("disk nearly full ({free} bytes free): refusing writes")
                    }
                    (true, false) => {
                        log::info!("disk space back ({free} bytes free): accepting writes")
                    }
                    _ => {}
                }
            }
            Err(e) => log::warn!("statvfs: {e}"),
        }
    }

    fn failed(&self) -> bool {
        self.shared.writes_stopped.load(Ordering::Acquire)
    }

    /// The earliest timer deadline: the interval sync, the cursor flush, the
    /// retention check.
    fn next_deadline(&self) -> Instant {
        let c = self.config();
        let mut d = self.last_cursor_flush + Duration::from_millis(c.cursor_flush_ms);
        if self.disk_low() {
            d = d.min(self.last_space_check + DISK_LOW_RECHECK);
        }
        d = d.min(self.last_retention_check + Duration::from_millis(c.retention_check_ms));
        if let FsyncPolicy::Interval(period) = c.fsync {
            if self.unsynced_bytes > 0 {
                d = d.min(self.last_sync + period);
            }
        }
        d
    }

    fn next_work(&mut self) -> Work {
        let mut p = self.shared.pending.lock();
        loop {
            if !p.ops.is_empty() || p.flush_cursors || p.checkpoint {
                break;
            }
            if p.shutdown {
                return Work::Shutdown;
            }
            let deadline = self.next_deadline();
            if Instant::now() >= deadline {
                return Work::Timer;
            }
            self.shared.pending_cv.wait_until(&mut p, deadline);
        }
        std::mem::swap(&mut p.buf, &mut self.round_buf);
        p.buf.clear();
        let ops = std::mem::take(&mut p.ops);
        let flush_cursors = std::mem::take(&mut p.flush_cursors);
        let checkpoint = std::mem::take(&mut p.checkpoint);
        let round = p.round;
        p.round += 1;
        drop(p);
        // Senders blocked on a full round may go on.
        self.shared.pending_cv.notify_all();
        Work::Round {
            ops,
            round,
            flush_cursors,
            checkpoint,
        }
    }

    fn timers(&mut self) -> Result<()> {
        self.measure_free_space();
        if self.failed() {
            // Nothing can be written; wait for shutdown without spinning.
            self.last_cursor_flush = Instant::now();
            self.last_retention_check = Instant::now();
            return Ok(());
        }
        let now = Instant::now();
        let c = self.config().clone();
        if now >= self.last_cursor_flush + Duration::from_millis(c.cursor_flush_ms) {
            // Cursors a full disk kept out stay in `cursor_buf` for the next
            // flush; until then a crash may take them back to their last
            // persisted value, which is allowed.
            let written = match self.write_dirty_cursors() {
                Err(e @ Error::NoSpace { .. }) => {
                    self.note_no_space(&e);
                    false
                }
                other => other?,
            };
            if written {
                self.note_writes_resumed();
            }
            if written && c.fsync != FsyncPolicy::Never {
                self.sync_journal()?;
            }
        }
        if now >= self.last_retention_check + Duration::from_millis(c.retention_check_ms) {
            self.last_retention_check = now;
            if self.retention_due()? {
                self.checkpoint(false)?;
            }
        }
        if let FsyncPolicy::Interval(period) = c.fsync {
            if self.unsynced_bytes > 0 && now >= self.last_sync + period {
                self.sync_journal()?;
            }
        }
        Ok(())
    }

    fn sync_journal(&mut self) -> Result<()> {
        self.journal.sync()?;
        self.shared
            .counters
            .journal_syncs
            .fetch_add(1, Ordering::Relaxed);
        self.unsynced_bytes = 0;
        self.last_sync = Instant::now();
        Ok(())
    }

    /// Writes every moved cursor to the journal as `Cursors` entries (not
    /// synced here), after any a full disk kept out last time. Returns
    /// whether anything was written.
    fn write_dirty_cursors(&mut self) -> Result<bool> {
        self.last_cursor_flush = Instant::now();
        let mut by_slot: HashMap<u32, Vec<(u64, u64)>> = HashMap::new();
        self.shared
            .cursors
            .take_dirty(|user, slot, cursor| by_slot.entry(slot).or_default().push((user, cursor)));
        if by_slot.is_empty() && !self.cursor_buf_unwritten {
            return Ok(false);
        }
        if !self.cursor_buf_unwritten {
            self.cursor_buf.clear();
        }
        let per_entry = self.config().record_bytes_max() / 16;
        let catalog = self.shared.catalog.read();
        for (slot, rows) in by_slot {
            let Some(group) = catalog.by_slot(slot) else {
                continue;
            };
            for chunk in rows.chunks(per_entry) {
                journal::encode_entry(&mut self.cursor_buf, EntryKind::Cursors, group.id, |b| {
                    body::encode_cursors(b, chunk)
                });
            }
        }
        drop(catalog);
        // Replay raises cursors with max(), so entries written twice or out
        // of order are harmless.
        self.cursor_buf_unwritten = true;
        self.journal.append(&self.cursor_buf)?;
        self.cursor_buf_unwritten = false;
        self.unsynced_bytes += self.cursor_buf.len() as u64;
        Ok(true)
    }

    fn commit_round(&mut self, ops: &[Op], flush_cursors: bool) -> Result<()> {
        if self.failed() {
            return Err(Error::WritesStopped {
                reason: "an earlier round failed".into(),
            });
        }
        self.appended.clear();
        // A full disk at the journal write: nothing of the round is in the
        // journal (the write was cut back) and nothing was applied, so the
        // round waits and is written again once space returns.
        let mut result = self.write_round(flush_cursors);
        while let Err(e @ Error::NoSpace { .. }) = &result {
            if !self.hold_for_space(e) {
                break;
            }
            result = self.write_round(flush_cursors);
        }
        self.end_hold();
        result?;
        // A full disk at a segment write: the round is in the journal, so it
        // is durable; the groups before the one that failed are applied, and
        // `apply` goes on from that group once space returns (see there).
        let mut order: Vec<usize> = (0..ops.len()).collect();
        // Stable sort: per-group order (= journal order) is kept.
        order.sort_by_key(|&i| ops[i].group.id);
        let mut next = 0;
        let mut result = self.apply(ops, &order, &mut next);
        while let Err(e @ Error::NoSpace { .. }) = &result {
            if !self.hold_for_space(e) {
                break;
            }
            result = self.apply(ops, &order, &mut next);
        }
        self.end_hold();
        if result.is_ok() {
            self.note_writes_resumed();
        }
        result
    }

    /// Notes a write that found the disk full: new writes are refused with
    /// `DiskFull` until a measurement finds space again.
    /// The warning is rate limited: held work is retried every
    /// `DISK_LOW_RECHECK`, and a line per retry says nothing new.
    fn note_no_space(&mut self, e: &Error) {
        match self.no_space_warning.occurred(Instant::now()) {
            Some(0) => {
                log::warn!("{e} (repeats are logged once a minute)")
            }
            Some(n) => log::warn!("{e} (and {n} more times since the last warning)"),
            None => {}
        }
        self.shared.disk_free_bytes.store(0, Ordering::Release);
    }

    /// A write went through: if a full disk had stopped writes, say that
    /// they resumed and after how long.
    fn note_writes_resumed(&mut self) {
        if let Some(end) = self.no_space_warning.ended(Instant::now()) {
            log::info!(
                "writes resumed after {:.1} s of a full disk ({} repeated warnings not logged)",
                end.lasted.as_secs_f64(),
                end.suppressed_total
            );
        }
    }

    /// New writes are refused by measurement only again (the round that
    /// was held is written, or failed).
    fn end_hold(&self) {
        self.shared.held_for_space.store(false, Ordering::Release);
    }

    /// Waits a little before work a full disk stopped is written again.
    /// False if the engine is shutting down instead (the caller gives up;
    /// whatever of the round reached the journal is replayed at the next
    /// open).
    fn hold_for_space(&mut self, e: &Error) -> bool {
        self.note_no_space(e);
        self.shared.held_for_space.store(true, Ordering::Release);
        if self.shared.pending.lock().shutdown {
            return false;
        }
        std::thread::sleep(DISK_LOW_RECHECK);
        true
    }

    /// Writes the round (and moved cursors) to the journal and syncs it per
    /// the policy. A write that found the disk full is `NoSpace`, with the
    /// journal cut back to where it was.
    ///
    /// Cursor entries a full disk held back go first whenever there are
    /// any: they belong to memberships as they were before this round, and
    /// written after a round that ends one (a Leave, a DeleteGroup) they
    /// would land on the next membership of that user and group.
    fn write_round(&mut self, flush_cursors: bool) -> Result<()> {
        if flush_cursors || self.cursor_buf_unwritten {
            self.write_dirty_cursors()?;
        }
        self.journal.append(&self.round_buf)?;
        self.unsynced_bytes += self.round_buf.len() as u64;
        let sync_now = match self.config().fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval(period) => self.last_sync.elapsed() >= period,
            FsyncPolicy::Never => false,
        };
        if sync_now || (flush_cursors && self.config().fsync != FsyncPolicy::Never) {
            self.sync_journal()?;
        }
        Ok(())
    }

    /// Applies the round's entries in `order` (grouped by group id), from
    /// `order[*next]` on, through `apply`: records of one group go out in
    /// one write (its entries are staged contiguously first and applied as
    /// one run); membership operations change the tables and fill in their
    /// replies.
    ///
    /// Resumable: `*next` only moves past an entry once it is fully applied,
    /// and a group's records at or below its head (written before a failure
    /// part-way through a run that crossed segments) are not written again.
    /// So after a `NoSpace` error the call can simply be repeated.
    fn apply(&mut self, ops: &[Op], order: &[usize], next: &mut usize) -> Result<()> {
        while *next < order.len() {
            let i = *next;
            let op = &ops[order[i]];
            if op.kind != EntryKind::Record {
                self.apply_other(op)?;
                *next += 1;
                continue;
            }
            self.staging.clear();
            let mut j = i;
            while j < order.len()
                && ops[order[j]].group.id == op.group.id
                && ops[order[j]].kind == EntryKind::Record
            {
                let e = &ops[order[j]].entry;
                self.staging
                    .extend_from_slice(&self.round_buf[e.start + ENTRY_HEADER_BYTES..e.end]);
                j += 1;
            }
            let st = self.apply_state();
            let done = apply::records(&st, &op.group, &self.staging, apply::Mode::Live)?;
            if let Some((first, last)) = done.held {
                self.appended.push(GroupAppend {
                    group: op.group.id,
                    first,
                    last,
                });
            }
            *next = j;
        }
        Ok(())
    }

    fn apply_state(&self) -> apply::State<'_> {
        apply::State {
            ctx: &self.shared.ctx,
            catalog: &self.shared.catalog,
            cursors: &self.shared.cursors,
        }
    }

    /// Applies a group or membership operation and puts its outcome where
    /// its caller waits.
    fn apply_other(&mut self, op: &Op) -> Result<()> {
        // Invariant: `write_round` wrote any held-back cursor entries before
        // this round's entries, so none of a deleted group's can land on a
        // group created again under the same id.
        debug_assert!(
            op.kind != EntryKind::DeleteGroup || !self.cursor_buf_unwritten,
            "held cursors written first"
        );
        let entry = journal::Entry {
            kind: op.kind,
            group_id: op.group.id,
            body: &self.round_buf[op.entry.start + ENTRY_HEADER_BYTES..op.entry.end],
        };
        let applied = apply::entry(
            &self.apply_state(),
            &entry,
            Some(&op.group),
            apply::Mode::Live,
        )?;
        let outcome = match applied {
            apply::Applied::Op(outcome) => outcome,
            // Record entries are applied by runs, and a queued entry's
            // group is registered until its DeleteGroup is applied.
            other => unreachable!("live apply of a {:?} entry gave {other:?}", op.kind),
        };
        if let Some(reply) = &op.reply {
            reply.set(outcome);
        }
        Ok(())
    }

    fn finish_round(&mut self, round: u64, ops: &[Op], result: Result<()>) {
        match result {
            Ok(()) => {
                self.queue_trash_removals();
                let c = &self.shared.counters;
                c.rounds.fetch_add(1, Ordering::Relaxed);
                c.round_records_max
                    .fetch_max(ops.len() as u64, Ordering::Relaxed);
                self.shared.progress.lock().completed = round;
                self.shared.progress_cv.notify_all();
                let appended = std::mem::take(&mut self.appended);
                notify_listeners(&self.shared, round, appended);
            }
            Err(e) => self.fail(round, e),
        }
    }

    /// Directories the round moved to the trash (deleted groups) are
    /// removed by the maintenance worker, in the background.
    fn queue_trash_removals(&self) {
        for entry in self.shared.ctx.trash.take_moved() {
            trash::remove_in_background(
                &self.shared.worker,
                self.shared.ctx.vfs.clone(),
                trash::Removal::new(entry),
            );
        }
    }

    /// Stops writes: `round` and every later one fail with the reason.
    fn fail(&self, round: u64, e: Error) {
        log::error!("commit round {round} failed, writes stopped: {e}");
        self.shared.writes_stopped.store(true, Ordering::Release);
        let mut p = self.shared.progress.lock();
        if p.failed.is_none() {
            p.failed = Some((round, e.to_string()));
        }
        drop(p);
        self.shared.progress_cv.notify_all();
        // Whoever waits through a listener (the server's event loop) must
        // learn that parked operations now have their outcome.
        notify_listeners(&self.shared, round, Vec::new());
    }

    /// True if some group's retention policy would drop a segment now.
    fn retention_due(&self) -> Result<bool> {
        let catalog = self.shared.catalog.read();
        for g in catalog.groups() {
            // A group whose segments cannot be planned (damage) is skipped.
            if let Ok(Some(_)) = checkpointer::plan_retention(&self.shared.ctx, g) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Writes a checkpoint. One that found the disk full changed nothing
    /// (the current checkpoint and journal stay in force and hold
    /// everything), so it is put off and tried again a little later; only
    /// the final one at shutdown reports it.
    fn checkpoint(&mut self, clean_shutdown: bool) -> Result<()> {
        match self.write_checkpoint(clean_shutdown) {
            Err(e @ Error::NoSpace { .. }) if !clean_shutdown => {
                self.note_no_space(&e);
                self.checkpoint_not_before = Instant::now() + CHECKPOINT_RETRY_AFTER_NO_SPACE;
                Ok(())
            }
            Ok(()) => {
                self.note_writes_resumed();
                Ok(())
            }
            other => other,
        }
    }

    fn write_checkpoint(&mut self, clean_shutdown: bool) -> Result<()> {
        self.flusher.check()?;
        let catalog = self.shared.catalog.read();
        let next = checkpointer::write_checkpoint(
            &self.shared.ctx,
            &catalog,
            &self.shared.cursors,
            self.journal
                .seq
                .checked_add(1)
                .ok_or_else(|| Error::WritesStopped {
                    reason: "journal sequence numbers exhausted".into(),
                })?,
            clean_shutdown,
        )?;
        drop(catalog);
        self.journal = next.journal;
        self.flusher.journal_restarted();
        self.unsynced_bytes = 0;
        let c = &self.shared.counters;
        c.checkpoints.fetch_add(1, Ordering::Relaxed);
        c.checkpoint_syncs.fetch_add(next.syncs, Ordering::Relaxed);
        Ok(())
    }
}
