//! The commit thread: takes the pending round whole, writes it to the
//! journal with one write, syncs it per the fsync policy (one fdatasync for
//! the round, however many groups it touched), applies it to the group logs
//! and the membership tables (`apply.rs`, the applier replay uses too; a
//! group's records go to its log as one run), then completes the round and
//! wakes whoever waits. Cursor flushes run here too, between rounds, and
//! so does the *capture* of a checkpoint (K1: switch to a journal file the
//! checkpointer prepared, take the dirty lists, O(1)); the checkpoint
//! itself runs on the checkpointer thread (`checkpointer.rs`) while
//! rounds go on.
//!
//! A failed sync, or a write that failed for any reason but a full disk, is
//! never retried: the round and every later one fail with `WritesStopped`,
//! and reads go on. Reopening recovers. A write that found the disk full
//! (`NoSpace`) took nothing in, so the work is held and written again once
//! space returns: a round where it stopped, cursors at the next flush.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::apply;
use crate::catalog::Catalog;
use crate::checkpointer::{self, Capture};
use crate::config::FsyncPolicy;
use crate::cursors::CursorTable;
use crate::dedup::DedupBudget;
use crate::error::{Error, Result};
use crate::flusher::Flusher;
use crate::group::Group;
use crate::group_log::LogContext;
use crate::journal::{self, body, EntryKind, Journal, ENTRY_HEADER_BYTES, JOURNAL_HEADER_BYTES};
use crate::warn_limit::RepeatedWarning;

struct Committer {
    shared: Arc<Shared>,
    journal: Journal,
    /// Journal bytes written but not yet synced (interval and never policies).
    unsynced_bytes: u64,
    last_sync: Instant,
    last_cursor_flush: Instant,
    last_space_check: Instant,
    /// When the last capture (K1) was taken.
    last_capture: Instant,
    /// A caller waits for a checkpoint (`Engine::checkpoint`).
    capture_wanted: bool,
    /// The last round completed.
    completed_round: u64,
    /// Offset in the journal file of the round being applied.
    round_at: u64,
    /// Reused buffers: the round taken from senders, per-group staging, cursor entries.
    round_buf: Vec<u8>,
    staging: Vec<u8>,
    cursor_buf: Vec<u8>,
    /// `cursor_buf` holds cursor entries a full disk kept out of the
    /// journal; the next flush writes them (with any newer ones).
    cursor_buf_unwritten: bool,
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

/// The position of the journal entry at `offset` of journal file
/// `journal_seq`: its *lsn*. Strictly increasing along the journal, since
/// files are numbered in order and a file never reaches 4 GiB (the commit
/// thread stops writes first, `commit_round`). The one place that says
/// what an lsn is (the journal's frames will give a dense one).
pub(crate) fn lsn(journal_seq: u64, offset: u64) -> u64 {
    debug_assert!(
        offset <= u32::MAX as u64,
        "journal offset {offset} beyond 4 GiB"
    );
    journal_seq << 32 | offset
}

/// Stops writes for a failure outside a round (the checkpointer's): the
/// next round and every later one fail with the reason.
pub(crate) fn stop_writes(shared: &Shared, e: &Error) {
    log::error!("writes stopped: {e}");
    shared.writes_stopped.store(true, Ordering::Release);
    let mut p = shared.progress.lock();
    let first = p.completed + 1;
    p.failed.get_or_insert((first, e.to_string()));
    let round = p.completed;
    drop(p);
    shared.progress_cv.notify_all();
    shared.pending_cv.notify_all();
    notify_listeners(shared, round, Vec::new());
}

#[derive(Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub duplicates: AtomicU64,
    pub rounds: AtomicU64,
    pub round_records_max: AtomicU64,
    pub journal_syncs: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_syncs: AtomicU64,
    pub checkpoint_bytes_written: AtomicU64,
    pub checkpoint_bytes_max: AtomicU64,
    pub checkpoint_ms_total: AtomicU64,
    pub checkpoint_ms_max: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub acks: AtomicU64,
    pub membership_rows_listed: AtomicU64,
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
/// nothing appended when writes stop or the commit thread ends: then every
/// parked operation has its outcome (an error) too.
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
    /// The commit thread's and the checkpointer's hand-over.
    pub ckpt: checkpointer::Coordination,
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

pub(crate) fn run(shared: Arc<Shared>, journal: Journal, flusher: Flusher) {
    let now = Instant::now();
    let mut c = Committer {
        shared: shared.clone(),
        journal,
        unsynced_bytes: 0,
        last_sync: now,
        last_cursor_flush: now,
        last_space_check: now,
        last_capture: now,
        capture_wanted: false,
        completed_round: 0,
        round_at: 0,
        round_buf: Vec::new(),
        staging: Vec::new(),
        cursor_buf: Vec::new(),
        cursor_buf_unwritten: false,
        appended: Vec::new(),
        flusher,
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
                    let result = self.commit_round(&ops, flush_cursors);
                    if result.is_ok() {
                        self.completed_round = round;
                        self.capture_wanted |= checkpoint;
                    }
                    self.finish_round(round, &ops, result);
                    self.flusher.journal_grew_to(self.journal.len());
                    self.measure_free_space();
                    // Under steady load the loop is never idle: run the
                    // timers (cursor flush, interval sync, capture) here too.
                    if Instant::now() >= self.next_deadline() {
                        if let Err(e) = self.timers() {
                            self.fail(round + 1, e);
                        }
                    }
                    if let Err(e) = self.maybe_capture(false) {
                        self.fail(round + 1, e);
                    }
                }
            }
        }
        let crash = self.shared.pending.lock().crash;
        if !self.failed() && !crash {
            // Everything accepted was committed by the loop above.
            if let Err(e) = self.final_checkpoint() {
                log::error!("final checkpoint failed: {e}");
                let mut p = self.shared.progress.lock();
                p.failed.get_or_insert((u64::MAX, e.to_string()));
            }
        }
    }

    /// Whether a capture is due: a caller or the checkpointer asked for
    /// one, or a trigger fired (journal bytes since the last one, dirty
    /// groups, interval with anything dirty).
    fn capture_due(&self) -> bool {
        let c = self.config();
        if self.capture_wanted
            || self.journal.len() >= c.checkpoint_journal_bytes
            || self.shared.ctx.dirty.groups() >= c.checkpoint_dirty_groups_max
        {
            return true;
        }
        {
            let st = self.shared.ckpt.status.lock();
            if st.wanted && st.wanted_at.is_none_or(|t| Instant::now() >= t) {
                return true;
            }
        }
        self.last_capture.elapsed() >= Duration::from_millis(c.checkpoint_interval_ms)
            && !self.shared.ctx.dirty.is_empty()
    }

    /// Whether the checkpointer can take a capture now: idle, with the
    /// next journal file ready.
    fn checkpointer_ready(&self) -> bool {
        let st = self.shared.ckpt.status.lock();
        st.job.is_none() && !st.busy && st.next_journal.is_some()
    }

    /// K1, if due and the checkpointer is ready (else it waits for a later
    /// round; nothing blocks). O(1): the journal switch (the old file's
    /// unsynced bytes synced first under `interval`, as its timer would),
    /// the dirty lists taken, the job handed over.
    fn maybe_capture(&mut self, clean: bool) -> Result<bool> {
        // Held-back cursor entries go to the journal before anything is
        // captured (they belong before later memberships' entries).
        if self.failed() || self.cursor_buf_unwritten || !(clean || self.capture_due()) {
            return Ok(false);
        }
        if !self.checkpointer_ready() {
            return Ok(false);
        }
        let co = &self.shared.ckpt;
        let mut st = co.status.lock();
        // Invariant: only this thread takes the journal or hands a job.
        let next = st.next_journal.take().expect("invariant: checked ready");
        let old = std::mem::replace(&mut self.journal, next);
        // Under `interval`, bytes of the old file not yet synced are synced
        // by the checkpointer (K3), as this thread's timer would have.
        let unsynced = self.unsynced_bytes > 0 && self.config().fsync != FsyncPolicy::Never;
        if clean {
            st.closing = true;
        }
        st.job = Some(Capture {
            old_journal: unsynced.then_some(old),
            taken: self.shared.ctx.dirty.take(),
            replay_journal_seq: self.journal.seq,
            replay_lsn: lsn(self.journal.seq, JOURNAL_HEADER_BYTES as u64),
            round: self.completed_round,
            clean,
            retention: self.capture_wanted,
        });
        st.wanted = false;
        st.wanted_at = None;
        drop(st);
        co.cv.notify_all();
        self.capture_wanted = false;
        self.last_capture = Instant::now();
        self.unsynced_bytes = 0;
        self.last_sync = Instant::now();
        self.flusher.journal_restarted();
        Ok(true)
    }

    /// The clean shutdown's checkpoint: waits for the checkpointer to be
    /// ready, captures everything (nothing follows in the journal), and
    /// waits until it is stored.
    fn final_checkpoint(&mut self) -> Result<()> {
        let shared = self.shared.clone();
        let co = &shared.ckpt;
        loop {
            if self.failed() {
                return Ok(());
            }
            let mut st = co.status.lock();
            if st.exited {
                return Err(Error::ShuttingDown);
            }
            if st.job.is_none() && !st.busy && st.next_journal.is_some() {
                break;
            }
            if let (None, false, Some(why)) = (&st.job, st.busy, &st.prepare_failed) {
                // The disk is full: shutting down does not wait for space.
                return Err(Error::NoSpace {
                    context: why.clone(),
                });
            }
            co.cv.wait_for(&mut st, Duration::from_millis(50));
        }
        let stored_before = self.shared.counters.checkpoints.load(Ordering::Acquire);
        if !self.maybe_capture(true)? {
            return Ok(()); // writes stopped meanwhile
        }
        let round = self.completed_round;
        let mut st = co.status.lock();
        while (st.job.is_some() || st.busy || st.attempted_through < round) && !st.exited {
            co.cv.wait_for(&mut st, Duration::from_millis(50));
        }
        drop(st);
        if self.failed()
            || self.shared.counters.checkpoints.load(Ordering::Acquire) == stored_before
        {
            return Err(Error::WritesStopped {
                reason: "the clean shutdown's checkpoint was not stored".into(),
            });
        }
        Ok(())
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
        // Capture deadlines count only while the checkpointer can take one
        // (it wakes this thread when it becomes ready).
        if self.checkpointer_ready() {
            if !self.shared.ctx.dirty.is_empty() {
                d = d.min(self.last_capture + Duration::from_millis(c.checkpoint_interval_ms));
            }
            if let Some(t) = self.shared.ckpt.status.lock().wanted_at {
                d = d.min(t);
            }
        }
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
            // A capture that waited for the checkpointer, which wakes us.
            if self.checkpointer_ready() && self.capture_due() {
                return Work::Timer;
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
            self.last_capture = Instant::now();
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
        if let FsyncPolicy::Interval(period) = c.fsync {
            if self.unsynced_bytes > 0 && now >= self.last_sync + period {
                self.sync_journal()?;
            }
        }
        // Due but the checkpointer busy: it wakes this thread when done.
        self.maybe_capture(false)?;
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
        if self.journal.len() > u32::MAX as u64 {
            // Entry positions (lsn) hold a file offset in 32 bits.
            return Err(Error::WritesStopped {
                reason: "the journal file reached 4 GiB before a checkpoint switched it".into(),
            });
        }
        // Where the round's bytes start in the journal file.
        self.round_at = self.journal.len() - self.round_buf.len() as u64;
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
            let at = lsn(
                self.journal.seq,
                self.round_at + ops[order[j - 1]].entry.start as u64,
            );
            let done = match apply::records(&st, &op.group, &self.staging, apply::Mode::Live, at)? {
                apply::Applied::Records(done) => done,
                // Live entries are never at or below a group's applied_lsn.
                other => unreachable!("live records gave {other:?}"),
            };
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
            lsn(self.journal.seq, self.round_at + op.entry.start as u64),
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
}
