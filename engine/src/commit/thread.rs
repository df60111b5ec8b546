//! The commit thread: takes the pending round whole, builds its journal
//! frame (a stable sort of the round's entries by group id and one copy,
//! each group's consecutive records merged into one Records entry), writes
//! it with one write, syncs it per the fsync policy (one fdatasync for the
//! round, however many groups it touched), applies the frame's entries in
//! frame order to the group logs and the membership tables (`apply.rs`,
//! the applier replay uses too), then completes the round and wakes
//! whoever waits. Cursor flushes run here too, between rounds, and so does
//! the *capture* of a checkpoint (K1: take the dirty lists and note the
//! journal's next position, O(1)); the checkpoint itself runs on the
//! checkpointer thread (`checkpointer.rs`) while rounds go on.
//!
//! The idle sweep runs here too, between rounds: groups unused for
//! `idle_evict_ms` give back their send state (dedup window) and their
//! small loaded log (`group.rs`, "Memory"), at most
//! [`IDLE_EVICTIONS_PER_SWEEP`] per sweep so a round never waits long
//! behind one; a sweep that stopped at that bound, or found the dedup
//! lists' lock held by a send (it never waits for it), runs again a
//! millisecond later. It costs the groups that went idle, nothing per
//! idle group.
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

use parking_lot::{Mutex, RwLock};

use crate::catalog::Catalog;
use crate::commit::apply;
use crate::commit::capture::{Capture, Coordination};
use crate::commit::context::Context;
use crate::commit::cursor_rows::CursorRows;
use crate::commit::dedup::{DedupBudget, SweepEnd, SweepStep};
use crate::commit::flusher::Flusher;
use crate::commit::gate::Gate;
use crate::commit::journal::{
    self, body, EntryKind, FrameBuf, FrameKind, FrameWritten, Journal, ENTRY_HEADER_BYTES,
};
use crate::commit::warn_limit::RepeatedWarning;
use crate::config::FsyncPolicy;
use crate::error::{Error, Result};
use crate::group::{Group, Unload};
use crate::logs::trash;
use crate::members::cursors::CursorTable;
use crate::sleep_lock::{SleepCondvar, SleepMutex};
use crate::worker::Worker;

struct Committer {
    shared: Arc<Shared>,
    journal: Journal,
    /// With a Raft layer: every Round frame of this node's own passes it
    /// before it is written (`gate.rs`).
    gate: Option<Gate>,
    /// Journal bytes written but not yet synced (interval and never policies).
    unsynced_bytes: u64,
    last_sync: Instant,
    last_cursor_flush: Instant,
    last_space_check: Instant,
    /// When the last capture (K1) was taken, and the journal's
    /// `bytes_since_start` then (the trigger counts journal bytes since).
    last_capture: Instant,
    journal_at_capture: u64,
    /// A caller waits for a checkpoint (`Engine::checkpoint`).
    capture_wanted: bool,
    /// The last round completed.
    completed_round: u64,
    /// Reused buffers: the round taken from senders (its entries in
    /// submission order), the round's frame, cursor entries.
    round_buf: Vec<u8>,
    frame: FrameBuf,
    /// Where `frame` was last written: journal file and offset (the
    /// extents of small groups point into it).
    frame_at: Option<(u64, u64)>,
    cursor_frame: FrameBuf,
    /// The rows of a cursor flush, its buffers kept between flushes.
    cursor_rows: CursorRows,
    /// The round's ops in frame order (a stable sort by group id), and
    /// the frame's entries with the ops each came from.
    order: Vec<usize>,
    spans: Vec<Span>,
    /// `cursor_frame` holds cursor entries a full disk kept out of the
    /// journal; the next flush writes them (with any newer ones).
    cursor_buf_unwritten: bool,
    /// What the round being applied appended, for commit listeners.
    appended: Vec<GroupAppend>,
    /// Background write-back between checkpoints.
    flusher: Flusher,
    /// The full-disk warning, rate limited while writes are retried.
    no_space_warning: RepeatedWarning,
    /// When the idle sweep runs next.
    idle_sweep_at: Instant,
}

/// Groups the idle sweep evicts at most in one go (about a microsecond each).
pub(crate) const IDLE_EVICTIONS_PER_SWEEP: usize = 1024;
/// The idle sweep runs this often when it has no backlog.
const IDLE_SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// How often free space is measured while it is low (and idle), and how
/// long work a full disk stopped waits before it is written again.
const DISK_LOW_RECHECK: Duration = Duration::from_millis(200);

/// While the disk stays full, its warning is repeated at most this often.
const NO_SPACE_WARN_INTERVAL: Duration = Duration::from_secs(60);

/// How long a capture that found the disk full is put off.
const CAPTURE_RETRY_AFTER_NO_SPACE: Duration = Duration::from_secs(1);

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
    /// Checkpoints that ended in an error, and when the last one stored
    /// and the last one failed (ms since the Unix epoch, 0: none yet):
    /// written by the checkpointer thread once per checkpoint.
    pub checkpoints_failed: AtomicU64,
    pub last_checkpoint_unix_ms: AtomicU64,
    pub last_checkpoint_failed_unix_ms: AtomicU64,
    pub checkpoint_syncs: AtomicU64,
    /// Bytes of checkpoint files written, and the largest one: with
    /// `journal_bytes`, what a checkpoint costs per byte of work.
    pub checkpoint_bytes: AtomicU64,
    pub checkpoint_bytes_max: AtomicU64,
    /// Time checkpoints took on the checkpointer thread (ms).
    pub checkpoint_ms_total: AtomicU64,
    pub checkpoint_ms_max: AtomicU64,
    /// Small groups' record bytes copied into cold files (rewrite.rs).
    pub reclaim_bytes_copied: AtomicU64,
    /// Journal files evacuated and cold files compacted.
    pub reclaim_files: AtomicU64,
    /// Bytes written to the journal (frames, and the header of each file a
    /// frame rolled to).
    pub journal_bytes: AtomicU64,
    pub bytes_appended: AtomicU64,
    pub acks: AtomicU64,
    pub membership_rows_listed: AtomicU64,
    /// Group logs the maintenance worker loaded.
    pub group_loads: AtomicU64,
    pub retention_groups_planned: AtomicU64,
}

impl Counters {
    /// Notes a checkpoint's outcome and its time (`EngineStats`): stored,
    /// or failed at its capture (commit thread) or while it was written
    /// (checkpointer). What an operator alerts on when checkpoints stop
    /// being stored.
    pub fn checkpoint_ended(&self, stored: bool) {
        let now = crate::clock::now_ms();
        if stored {
            self.last_checkpoint_unix_ms.store(now, Ordering::Relaxed);
        } else {
            self.checkpoints_failed.fetch_add(1, Ordering::Relaxed);
            self.last_checkpoint_failed_unix_ms
                .store(now, Ordering::Relaxed);
        }
    }
}

/// One entry of a round's frame: where it lies in the frame, and the
/// range of the round's ops (positions in frame order) it holds: several
/// record submissions of one group, or one other operation.
struct Span {
    entry: std::ops::Range<usize>,
    ops: std::ops::Range<usize>,
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
    /// The newest round a caller asked to persist moved cursors with
    /// (`Engine::cursor_round`): a cursor a reader sees in memory is in a
    /// Cursors frame once this round completed (0: none asked).
    pub cursor_round: u64,
    /// A caller waits for a checkpoint after this round.
    pub checkpoint: bool,
    /// Shut down like a crash: no final checkpoint. Only
    /// `Engine::simulate_crash` (tests, `testing` feature) sets it.
    pub crash: bool,
    /// Rounds another node wrote (`Engine::append_replicated`), written
    /// and applied before this round's own entries.
    pub replicated: Vec<ReplicatedRound>,
}

/// A round another node wrote, checked by `replicate.rs` and queued for
/// the commit thread.
pub(crate) struct ReplicatedRound {
    /// The whole payload (format-spec/storage.md section 5).
    pub payload: Vec<u8>,
    pub round_index: u64,
    /// Set to `Ok(round_index)` once the round is written and applied.
    pub reply: Arc<Reply>,
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

/// Takes up to `max` groups idle at `now_ms` off the used list and drops
/// their send state (with its window) and, if small and quiet, their loaded
/// log; one that cannot give them back yet (a lock held, records in an
/// uncompleted round, writes not yet synced) is listed again as used now,
/// once the sweep is over: listed at once, it would be idle again at once
/// under a short `idle_evict_ms` and taken again by this same sweep.
/// Returns true if it should run again soon: it stopped at `max`, or a
/// send held the dedup lists' lock, which the sweep never waits for
/// ([`DedupBudget::try_sweep`]). On the commit thread, between rounds (so
/// `completed` is every round applied), holding no lock.
pub(crate) fn evict_idle(shared: &Shared, now_ms: u64, max: usize) -> bool {
    let idle_ms = shared.ctx.config.idle_evict_ms;
    let completed = shared.progress.lock().completed;
    let end = shared.dedup.try_sweep(
        now_ms,
        idle_ms,
        max,
        |id| evict_one(shared, id, completed),
        || {
            shared
                .worker
                .background(|_, shared: &Shared| shared.dedup.shrink_if_sparse())
        },
    );
    end == SweepEnd::Again
}

/// Drops what idle group `id` holds (its send state, its small quiet
/// loaded log), with no lock of the dedup budget held.
fn evict_one(shared: &Shared, id: u64, completed: u64) -> SweepStep {
    let mut done = SweepStep::default();
    let Some(group) = shared.catalog.read().get(id).cloned() else {
        return done; // deleted
    };
    let Some(mut slot) = group.assign.try_lock() else {
        done.later = true;
        return done;
    };
    if group.is_deleting() {
        return done; // its window was given back with the delete
    }
    if let Some(assign) = slot.as_deref() {
        if assign.last_round > completed {
            done.later = true;
            return done;
        }
        done.window_dropped = Some(assign.dedup.len());
        *slot = None;
    }
    // Under `assign`: no send can load the log again meanwhile.
    if group.unload_if_quiet(&shared.ctx) == Unload::Later {
        done.later = true;
    }
    done
}

/// Called on the commit thread after each completed round.
pub type CommitListener = Arc<dyn Fn(&CommitNotice) + Send + Sync>;

pub(crate) struct Shared {
    pub ctx: Context,
    pub catalog: RwLock<Catalog>,
    pub cursors: CursorTable,
    /// The pending round and the rounds' progress: locks the senders and
    /// the commit thread share, so their waiters sleep (`sleep_lock.rs`).
    pub pending: SleepMutex<Pending>,
    /// Wakes the commit thread (work arrived) and senders (room in the round).
    pub pending_cv: SleepCondvar,
    pub progress: SleepMutex<Progress>,
    pub progress_cv: SleepCondvar,
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
    pub ckpt: Coordination,
    /// Held by `Engine::append_replicated` while its payload is checked,
    /// queued and committed: one replicated round in flight.
    pub replicating: Mutex<()>,
    /// The maintenance worker's queues (its thread is the engine's).
    pub worker: Worker<Shared>,
    /// Why the worker could not make a group's send path ready (its dedup
    /// window could not be rebuilt), for the next request that asks: that
    /// request gets the error instead of waiting for the same failure
    /// again. Taken by that request.
    pub ready_failures: Mutex<HashMap<u64, Error>>,
    /// The load of the checkpoint's state in the background
    /// (`state::lazy`).
    pub load: crate::commit::loading::LoadStatus,
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
        replicated: Vec<ReplicatedRound>,
        round: u64,
        flush_cursors: bool,
        checkpoint: bool,
    },
    Timer,
    Shutdown,
}

pub(crate) fn run(shared: Arc<Shared>, journal: Journal, flusher: Flusher, gate: Option<Gate>) {
    let now = Instant::now();
    let mut c = Committer {
        shared: shared.clone(),
        journal,
        gate,
        unsynced_bytes: 0,
        last_sync: now,
        last_cursor_flush: now,
        last_space_check: now,
        last_capture: now,
        journal_at_capture: 0,
        capture_wanted: false,
        completed_round: 0,
        round_buf: Vec::new(),
        frame: FrameBuf::default(),
        frame_at: None,
        cursor_frame: FrameBuf::default(),
        cursor_rows: CursorRows::default(),
        order: Vec::new(),
        spans: Vec::new(),
        cursor_buf_unwritten: false,
        appended: Vec::new(),
        flusher,
        no_space_warning: RepeatedWarning::new(NO_SPACE_WARN_INTERVAL),
        idle_sweep_at: now,
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
                    replicated,
                    round,
                    flush_cursors,
                    checkpoint,
                } => {
                    self.appended.clear();
                    let mut result = self.commit_replicated(&replicated);
                    if result.is_ok() {
                        result = self.commit_round(&ops, flush_cursors);
                    }
                    if result.is_ok() {
                        self.completed_round = round;
                        self.capture_wanted |= checkpoint;
                    }
                    self.finish_round(round, &ops, result);
                    self.flusher.journal_grew_to(self.journal_since_capture());
                    self.measure_free_space();
                    // Under steady load the loop is never idle: run the
                    // timers (cursor flush, interval sync, idle sweep,
                    // capture) here too.
                    if Instant::now() >= self.next_deadline() {
                        if let Err(e) = self.timers() {
                            self.fail(round + 1, e);
                        }
                    }
                    self.maybe_capture(false);
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

    fn journal_since_capture(&self) -> u64 {
        self.journal.bytes_since_start() - self.journal_at_capture
    }

    /// Whether a capture is due: a caller or the checkpointer asked for
    /// one, or a trigger fired (journal bytes since the last one, dirty
    /// groups, interval with anything dirty).
    fn capture_due(&self) -> bool {
        let c = self.config();
        if self.capture_wanted
            || self.journal_since_capture() >= c.checkpoint_journal_bytes
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

    /// Whether the checkpointer can take a capture now.
    fn checkpointer_ready(&self) -> bool {
        // A capture's pinned files and dirty lists cover the registered
        // groups only: none is taken before every group is.
        if self.shared.load.loading() {
            return false;
        }
        let st = self.shared.ckpt.status.lock();
        st.job.is_none() && !st.busy && !st.exited
    }

    /// K1, if due and the checkpointer is idle (else a later round takes
    /// it; nothing blocks): the dirty lists taken and the journal's next
    /// position noted as the replay position P. O(1), no system call.
    fn maybe_capture(&mut self, clean: bool) -> bool {
        // Held-back cursor entries go to the journal before anything is
        // captured (they belong before later memberships' entries).
        if self.failed() || self.cursor_buf_unwritten || !(clean || self.capture_due()) {
            return false;
        }
        if !self.checkpointer_ready() {
            return false;
        }
        // Moved cursors go to the journal first, as a Cursors round: the
        // runs persist them too, but only on this node, and a round is
        // what replication ships (replicate.rs).
        if let Err(e) = self.write_dirty_cursors() {
            self.capture_step_failed(&e);
            return false;
        }
        // The capture starts a new journal file, as a roll does (the file
        // left is synced to its end first, whatever the policy; under
        // `fsync always` the last round already did): P is the new file's
        // start, so journal files go whole once neither kept manifest
        // needs them, and a fallback to the older manifest replays synced
        // files.
        if self.journal.holds_frames() {
            let syncs = match self.journal.roll() {
                Ok(syncs) => syncs,
                Err(e) => {
                    self.capture_step_failed(&e);
                    return false;
                }
            };
            let c = &self.shared.counters;
            c.journal_syncs.fetch_add(syncs, Ordering::Relaxed);
            c.journal_bytes
                .fetch_add(journal::JOURNAL_HEADER_BYTES as u64, Ordering::Relaxed);
            self.unsynced_bytes = 0;
            self.move_deleted_if_durable();
        }
        let Ok(next) = self.journal.next_start() else {
            return false; // sequence numbers exhausted: writes stop on the next roll
        };
        // Frames before P are all applied (this thread applies a round
        // before it takes the next), so every group they changed is dirty
        // or was captured with them.
        let replay = journal::JournalStart {
            seq: self.journal.seq,
            ..next
        };
        // The files small groups' records are in: those at or after P are
        // kept by the replay window anyway.
        let pinned = crate::logs::reclaim::pinned(&self.shared.ctx.live.lock(), replay.seq);
        let co = &self.shared.ckpt;
        let mut st = co.status.lock();
        if st.job.is_some() || st.busy || st.exited {
            return false;
        }
        st.job = Some(Capture {
            taken: self.shared.ctx.dirty.take(),
            replay,
            round: self.completed_round,
            clean,
            retention: self.capture_wanted,
            pinned,
        });
        st.wanted = false;
        st.wanted_at = None;
        drop(st);
        co.cv.notify_all();
        self.capture_wanted = false;
        self.last_capture = Instant::now();
        self.journal_at_capture = self.journal.bytes_since_start();
        self.flusher.journal_restarted();
        true
    }

    /// A step of a capture (its cursor round, its roll) failed: a full disk
    /// puts the capture off, any other failure stops writes.
    fn capture_step_failed(&mut self, e: &Error) {
        self.shared.counters.checkpoint_ended(false);
        if matches!(e, Error::NoSpace { .. }) {
            self.capture_put_off(e);
        } else {
            stop_writes(&self.shared, e);
        }
    }

    /// A capture that found the disk full (its cursor round or its roll)
    /// is put off like a checkpoint that did: it counts as attempted (a
    /// caller of `Engine::checkpoint` gets `Ok`) and is asked for again a
    /// second later.
    fn capture_put_off(&mut self, e: &Error) {
        self.note_no_space(e);
        self.capture_wanted = false;
        let co = &self.shared.ckpt;
        let mut st = co.status.lock();
        st.attempted_through = st.attempted_through.max(self.completed_round);
        st.wanted = true;
        st.wanted_at = Some(Instant::now() + CAPTURE_RETRY_AFTER_NO_SPACE);
        drop(st);
        co.cv.notify_all();
    }

    /// The clean shutdown's checkpoint: waits for the checkpointer to be
    /// idle, captures everything (nothing follows in the journal), and
    /// waits until it is stored.
    fn final_checkpoint(&mut self) -> Result<()> {
        let shared = self.shared.clone();
        let co = &shared.ckpt;
        let stored_before = shared.counters.checkpoints.load(Ordering::Acquire);
        loop {
            // A background load that did not end (stopped, or at damage)
            // leaves no clean checkpoint: the next open replays the
            // journal.
            if self.failed() || self.shared.load.loading() {
                return Ok(());
            }
            if self.maybe_capture(true) {
                break;
            }
            let mut st = co.status.lock();
            if st.exited {
                return Err(Error::ShuttingDown);
            }
            co.cv.wait_for(&mut st, Duration::from_millis(50));
        }
        let round = self.completed_round;
        let mut st = co.status.lock();
        while (st.job.is_some() || st.busy || st.attempted_through < round) && !st.exited {
            co.cv.wait_for(&mut st, Duration::from_millis(50));
        }
        drop(st);
        let stored = shared.counters.checkpoints.load(Ordering::Acquire);
        if self.failed() || stored == stored_before {
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
    /// idle sweep, a capture.
    fn next_deadline(&self) -> Instant {
        let c = self.config();
        let mut d = self.last_cursor_flush + Duration::from_millis(c.cursor_flush_ms);
        if self.disk_low() {
            d = d.min(self.last_space_check + DISK_LOW_RECHECK);
        }
        d = d.min(self.idle_sweep_at);
        // Capture deadlines count only while the checkpointer can take one
        // (it wakes this thread when it becomes idle).
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
            if !p.ops.is_empty() || !p.replicated.is_empty() || p.flush_cursors || p.checkpoint {
                break;
            }
            if p.shutdown {
                return Work::Shutdown;
            }
            // A capture that waited for the checkpointer, which wakes us.
            if self.checkpointer_ready() && self.capture_due() && !self.failed() {
                return Work::Timer;
            }
            let deadline = self.next_deadline();
            if Instant::now() >= deadline {
                return Work::Timer;
            }
            p = self.shared.pending_cv.wait_until(p, deadline);
        }
        std::mem::swap(&mut p.buf, &mut self.round_buf);
        p.buf.clear();
        let ops = std::mem::take(&mut p.ops);
        let replicated = std::mem::take(&mut p.replicated);
        let flush_cursors = std::mem::take(&mut p.flush_cursors);
        let checkpoint = std::mem::take(&mut p.checkpoint);
        let round = p.round;
        p.round += 1;
        drop(p);
        // Senders blocked on a full round may go on.
        self.shared.pending_cv.notify_all();
        Work::Round {
            ops,
            replicated,
            round,
            flush_cursors,
            checkpoint,
        }
    }

    fn timers(&mut self) -> Result<()> {
        self.measure_free_space();
        if Instant::now() >= self.idle_sweep_at {
            self.idle_sweep();
        }
        if self.failed() {
            // Nothing can be written; wait for shutdown without spinning.
            self.last_cursor_flush = Instant::now();
            self.last_capture = Instant::now();
            return Ok(());
        }
        let now = Instant::now();
        let c = self.config().clone();
        if now >= self.last_cursor_flush + Duration::from_millis(c.cursor_flush_ms) {
            // Cursors a full disk kept out stay in `cursor_frame` for the next
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
        self.maybe_capture(false);
        Ok(())
    }

    /// Counts what a frame write did: the journal bytes it wrote (the
    /// frame, and a new file's header if it rolled) and the fdatasyncs of
    /// its roll.
    fn note_written(&self, written: FrameWritten, frame_len: usize) {
        let counters = &self.shared.counters;
        counters
            .journal_syncs
            .fetch_add(written.roll_syncs, Ordering::Relaxed);
        let header = if written.roll_syncs > 0 {
            journal::JOURNAL_HEADER_BYTES as u64
        } else {
            0
        };
        counters
            .journal_bytes
            .fetch_add(frame_len as u64 + header, Ordering::Relaxed);
    }

    /// Evicts what groups idle for `idle_evict_ms` hold (module docs) and
    /// sets when the sweep runs next: soon if it stopped at its bound.
    fn idle_sweep(&mut self) {
        let more = evict_idle(
            &self.shared,
            crate::clock::now_ms(),
            IDLE_EVICTIONS_PER_SWEEP,
        );
        let wait = if more {
            Duration::from_millis(1)
        } else {
            IDLE_SWEEP_PERIOD
        };
        self.idle_sweep_at = Instant::now() + wait;
    }

    fn sync_journal(&mut self) -> Result<()> {
        self.journal.sync()?;
        self.shared
            .counters
            .journal_syncs
            .fetch_add(1, Ordering::Relaxed);
        self.unsynced_bytes = 0;
        self.last_sync = Instant::now();
        self.move_deleted_if_durable();
        self.queue_trash_removals();
        Ok(())
    }

    /// Writes every moved cursor to the journal as `Cursors` entries, one
    /// frame (not synced here), after any a full disk kept out last time.
    /// Returns whether anything was written.
    fn write_dirty_cursors(&mut self) -> Result<bool> {
        self.last_cursor_flush = Instant::now();
        // A frame held back by a full disk goes first, as it was built:
        // the cursors moved since go into a frame of their own, so every
        // frame's entries stay in group id order (storage.md section 5).
        // Nothing is taken from the table before it is written, so a
        // failure here loses no dirty mark.
        let held_written = self.cursor_buf_unwritten;
        if held_written {
            self.append_cursor_frame()?;
        }
        // The moved cursors by group slot, in buffers kept from one flush
        // to the next (`cursor_rows.rs`). Between shards, after every
        // thousand or so cursors, the thread yields its CPU to whoever
        // waits for it (an ACK storm's event loop and clients on a small
        // machine): a flush of a busy table runs in slices of a fraction
        // of a millisecond, not in one piece of several that delays every
        // ACK in flight (`take_dirty_pausing`).
        let rows = &mut self.cursor_rows;
        rows.expect(self.shared.cursors.queued());
        self.shared.cursors.take_dirty_pausing(
            |user, slot, cursor| rows.push(slot, user, cursor),
            std::thread::yield_now,
        );
        if self.cursor_rows.is_empty() {
            self.cursor_rows.finish();
            return Ok(held_written);
        }
        self.cursor_frame.clear();
        let per_entry = self.config().record_bytes_max() / body::CURSOR_ROW_BYTES;
        // The frame's size is known: each row, and an entry header per
        // `per_entry` rows of a group (one frame growth, not doublings).
        let rows = self.cursor_rows.rows();
        let entries = rows / per_entry.max(1) + self.cursor_rows.slots();
        self.cursor_frame
            .reserve(rows * body::CURSOR_ROW_BYTES + entries * ENTRY_HEADER_BYTES);
        // A frame's entries are in group id order (format-spec/storage.md
        // section 5); cost O(k log k) for the k groups with moved cursors.
        // The catalog is held for the ids only, not while the frame is
        // encoded.
        {
            let catalog = self.shared.catalog.read();
            self.cursor_rows
                .order_by_group(|slot| Some(catalog.by_slot(slot)?.id));
        }
        let frame = &mut self.cursor_frame;
        self.cursor_rows.for_each_group(|group_id, rows| {
            for chunk in rows.chunks(per_entry) {
                frame.push_entry(EntryKind::Cursors, group_id, |b| {
                    body::encode_cursors(b, chunk)
                });
            }
        });
        self.cursor_rows.finish();
        if self.cursor_frame.entry_count() == 0 {
            // Every moved cursor's group is gone.
            return Ok(held_written);
        }
        // Held until written: the rows were taken from the table, and a
        // write that finds the disk full is retried with this frame.
        self.cursor_buf_unwritten = true;
        self.append_cursor_frame()?;
        Ok(true)
    }

    /// Appends the cursor frame (built, or held back by a full disk) and
    /// marks it written. Replay raises cursors with max(), so a frame
    /// written after newer ones is harmless.
    fn append_cursor_frame(&mut self) -> Result<()> {
        if let Some(gate) = &mut self.gate {
            gate.pass(&self.journal, &mut self.cursor_frame)?;
        }
        let written = self
            .journal
            .append(&mut self.cursor_frame, FrameKind::Round)?;
        self.note_round_written(&written);
        self.note_written(written, self.cursor_frame.len());
        self.cursor_buf_unwritten = false;
        self.unsynced_bytes += self.cursor_frame.len() as u64;
        Ok(())
    }

    fn commit_round(&mut self, ops: &[Op], flush_cursors: bool) -> Result<()> {
        if self.failed() {
            return Err(Error::WritesStopped {
                reason: "an earlier round failed".into(),
            });
        }
        build_frame(
            &self.round_buf,
            ops,
            &mut self.order,
            &mut self.frame,
            &mut self.spans,
        );
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
        let lsn = result?;
        self.make_deletions_durable_before(ops.iter().map(|op| op.group.id))?;
        // A full disk at a segment write: the round is in the journal, so it
        // is durable; the groups before the one that failed are applied, and
        // `apply` goes on from that group once space returns (see there).
        let mut next = 0;
        let mut result = self.apply(ops, lsn, &mut next);
        while let Err(e @ Error::NoSpace { .. }) = &result {
            if !self.hold_for_space(e) {
                break;
            }
            result = self.apply(ops, lsn, &mut next);
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

    /// Writes the round's frame (after a frame of moved cursors) to the
    /// journal and syncs it per the policy; returns the round frame's lsn
    /// (0 when the round holds no entry and nothing was written). A write
    /// that found the disk full is `NoSpace`, with the journal cut back to
    /// where it was.
    ///
    /// Cursor entries a full disk held back go first whenever there are
    /// any: they belong to memberships as they were before this round, and
    /// written after a round that ends one (a Leave, a DeleteGroup) they
    /// would land on the next membership of that user and group.
    fn write_round(&mut self, flush_cursors: bool) -> Result<u64> {
        if flush_cursors || self.cursor_buf_unwritten {
            self.write_dirty_cursors()?;
        }
        let mut lsn = 0;
        self.frame_at = None;
        if self.frame.entry_count() > 0 {
            if let Some(gate) = &mut self.gate {
                gate.pass(&self.journal, &mut self.frame)?;
            }
            let written = self.journal.append(&mut self.frame, FrameKind::Round)?;
            self.frame_at = Some((written.seq, written.offset));
            self.note_round_written(&written);
            self.note_written(written, self.frame.len());
            self.unsynced_bytes += self.frame.len() as u64;
            lsn = written.lsn;
        }
        let sync_now = match self.config().fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval(period) => self.last_sync.elapsed() >= period,
            FsyncPolicy::Never => false,
        };
        if sync_now || (flush_cursors && self.config().fsync != FsyncPolicy::Never) {
            self.sync_journal()?;
        }
        Ok(lsn)
    }

    /// Applies the entries of the round's frame (numbered `lsn`) in frame
    /// order, from `spans[*next]` on, through `apply`: a Records entry (all
    /// of a group's records of the round) goes to its log as one run;
    /// membership operations change the tables and fill in their replies.
    ///
    /// Resumable: `*next` only moves past an entry once it is fully applied,
    /// and a group's records at or below its head (written before a failure
    /// part-way through a run that crossed segments) are not written again.
    /// So after a `NoSpace` error the call can simply be repeated.
    fn apply(&mut self, ops: &[Op], lsn: u64, next: &mut usize) -> Result<()> {
        let st = apply::State {
            ctx: &self.shared.ctx,
            catalog: &self.shared.catalog,
            cursors: &self.shared.cursors,
        };
        while *next < self.spans.len() {
            let span = &self.spans[*next];
            let op = &ops[self.order[span.ops.start]];
            let entry = self.frame.entry(span.entry.clone());
            if entry.kind == EntryKind::Records {
                // The frame's bytes start with its envelope, as in the file.
                let at = self.frame_at.map(|(seq, offset)| apply::BodyAt {
                    seq,
                    offset: offset + (span.entry.start + ENTRY_HEADER_BYTES) as u64,
                });
                let done = apply::records(&st, &op.group, entry.body, at, apply::Mode::Live, lsn)?;
                if let Some((first, last)) = done.held {
                    self.appended.push(GroupAppend {
                        group: op.group.id,
                        first,
                        last,
                    });
                }
            } else {
                // Invariant: `write_round` wrote any held-back cursor
                // entries before this round's frame, so none of a deleted
                // group's can land on a group created again under the same id.
                debug_assert!(
                    entry.kind != EntryKind::DeleteGroup || !self.cursor_buf_unwritten,
                    "held cursors written first"
                );
                let applied =
                    apply::entry(&st, &entry, Some(&op.group), apply::Mode::Live, lsn, None)?;
                let outcome = match applied {
                    apply::Applied::Op(outcome) => outcome,
                    // Records entries are applied above, and a queued entry's
                    // group is registered until its DeleteGroup is applied.
                    other => unreachable!("live apply of a {:?} entry gave {other:?}", op.kind),
                };
                if let Some(reply) = &op.reply {
                    reply.set(outcome);
                }
            }
            // After a group's last entry of the frame (frames list a
            // group's entries together): its record now reflects the frame.
            let last_of_group = self
                .spans
                .get(*next + 1)
                .is_none_or(|s| ops[self.order[s.ops.start]].group.id != op.group.id);
            if last_of_group {
                apply::frame_done(&st, &op.group, lsn);
            }
            *next += 1;
        }
        Ok(())
    }

    /// Where a Round frame went, for `read_rounds` (journal/rounds.rs).
    fn note_round_written(&self, w: &crate::commit::journal::FrameWritten) {
        self.shared.ctx.rounds.record(w.seq, w.offset, w.round);
    }

    /// Writes and applies rounds another node wrote (`replicate.rs`, which
    /// checked each payload and already counted its records in the send
    /// states of their groups), in queue order: each payload unchanged in
    /// this node's envelope, synced per the fsync policy like a local
    /// round, then applied through `apply` (`Mode::Replicated`). A full
    /// disk holds the round and retries, as for a local round. Any other
    /// failure stops writes, also a payload whose round a frame of this
    /// node took meanwhile (local writes while following, which the replica
    /// layer refuses): its records are counted in the send states, so
    /// going on would give their ids out twice.
    fn commit_replicated(&mut self, rounds: &[ReplicatedRound]) -> Result<()> {
        for r in rounds {
            if self.failed() {
                return Err(Error::WritesStopped {
                    reason: "an earlier round failed".into(),
                });
            }
            self.frame.load_payload(&r.payload);
            let mut result = self.write_replicated(r.round_index);
            while let Err(e @ Error::NoSpace { .. }) = &result {
                if !self.hold_for_space(e) {
                    break;
                }
                result = self.write_replicated(r.round_index);
            }
            self.end_hold();
            let lsn = match result {
                Err(e @ Error::RoundOutOfOrder { .. }) => {
                    return Err(Error::WritesStopped {
                        reason: format!("{e}: this node wrote rounds of its own meanwhile"),
                    })
                }
                other => other?,
            };
            // The payload's groups are known only by decoding it: any
            // deletion waiting for durability is made durable first.
            if self.shared.ctx.trash.any_awaiting() {
                self.sync_journal()?;
            }
            let mut next = 0;
            let mut result = self.apply_replicated(&r.payload, lsn, &mut next);
            while let Err(e @ Error::NoSpace { .. }) = &result {
                if !self.hold_for_space(e) {
                    break;
                }
                result = self.apply_replicated(&r.payload, lsn, &mut next);
            }
            self.end_hold();
            result?;
            self.move_deleted_if_durable();
            self.queue_trash_removals();
            self.note_writes_resumed();
            r.reply.set(Ok(r.round_index));
        }
        Ok(())
    }

    /// Writes the replicated payload loaded in `self.frame` as round
    /// `round`, synced per the policy; returns its lsn.
    fn write_replicated(&mut self, round: u64) -> Result<u64> {
        let written = self.journal.append_replicated(&mut self.frame, round)?;
        self.frame_at = Some((written.seq, written.offset));
        self.note_round_written(&written);
        self.note_written(written, self.frame.len());
        self.unsynced_bytes += self.frame.len() as u64;
        let sync_now = match self.config().fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval(period) => self.last_sync.elapsed() >= period,
            FsyncPolicy::Never => false,
        };
        if sync_now {
            self.sync_journal()?;
        }
        Ok(written.lsn)
    }

    /// Applies the entries of a replicated payload (frame `lsn`) from the
    /// `*next`-th on; resumable like [`Committer::apply`]. Each entry's
    /// group is looked up by id, as in replay: the payload was checked
    /// against the registry before it was queued.
    fn apply_replicated(&mut self, payload: &[u8], lsn: u64, next: &mut usize) -> Result<()> {
        let st = apply::State {
            ctx: &self.shared.ctx,
            catalog: &self.shared.catalog,
            cursors: &self.shared.cursors,
        };
        let entries = crate::commit::journal::EntryIter::new(
            &payload[crate::commit::journal::frame::PAYLOAD_HEADER_BYTES..],
            FrameKind::Round,
        );
        let mut entries = entries.skip(*next).peekable();
        while let Some(entry) = entries.next() {
            let group = st.group(entry.group_id)?;
            if matches!(entry.kind, EntryKind::CreateGroup | EntryKind::Records) {
                // Listed for the idle sweep, as a local create or send does.
                self.shared.dedup.touch_used(entry.group_id);
            }
            // The payload follows this node's envelope in the file.
            let at = self.frame_at.map(|(seq, offset)| apply::BodyAt {
                seq,
                offset: offset
                    + (crate::commit::journal::frame::ENVELOPE_BYTES
                        + offset_in(payload, entry.body)) as u64,
            });
            let applied = apply::entry(
                &st,
                &entry,
                group.as_ref(),
                apply::Mode::Replicated,
                lsn,
                at,
            )?;
            if let apply::Applied::Records(done) = applied {
                if let Some((first, last)) = done.held {
                    self.appended.push(GroupAppend {
                        group: entry.group_id,
                        first,
                        last,
                    });
                }
            }
            *next += 1;
            // After a group's last entry of the frame: its record now
            // reflects the frame (as for a local round).
            let last_of_group = entries.peek().is_none_or(|e| e.group_id != entry.group_id);
            if last_of_group {
                if let Some(g) = st.group(entry.group_id)? {
                    apply::frame_done(&st, &g, lsn);
                }
            }
        }
        Ok(())
    }

    fn finish_round(&mut self, round: u64, ops: &[Op], result: Result<()>) {
        match result {
            Ok(()) => {
                self.move_deleted_if_durable();
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

    /// Moves deleted groups' directories into the trash once every frame
    /// written is durable (`trash.rs`: a deletion a power cut may take
    /// back leaves its files alone).
    fn move_deleted_if_durable(&self) {
        if self.unsynced_bytes == 0 {
            self.shared.ctx.trash.move_awaiting(&*self.shared.ctx.vfs);
        }
    }

    /// A round that names a group whose deletion is not durable yet (the
    /// id created again, whose first record makes files at the same path)
    /// first syncs the journal, which holds the deletion, so the old
    /// directory moves away first.
    fn make_deletions_durable_before(&mut self, groups: impl Iterator<Item = u64>) -> Result<()> {
        if self.shared.ctx.trash.awaits_any(groups) {
            self.sync_journal()?;
        }
        Ok(())
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
}

/// Where `inner`, a slice borrowed from `outer`, starts in it.
pub(crate) fn offset_in(outer: &[u8], inner: &[u8]) -> usize {
    let at = (inner.as_ptr() as usize).wrapping_sub(outer.as_ptr() as usize);
    debug_assert!(at + inner.len() <= outer.len(), "a slice of the buffer");
    at
}

/// Builds a round's frame from the pending round's entries (`round_buf`,
/// in submission order, one per op): `order` becomes the ops stably sorted
/// by group id (so a group's entries keep submission order, which is id
/// order for its records), each run of one group's consecutive record
/// submissions becomes one Records entry, every other op is copied as it
/// is, and `spans` says which ops each frame entry holds. Cost: the sort
/// of the round's op indices and one copy of its bytes.
fn build_frame(
    round_buf: &[u8],
    ops: &[Op],
    order: &mut Vec<usize>,
    frame: &mut FrameBuf,
    spans: &mut Vec<Span>,
) {
    order.clear();
    order.extend(0..ops.len());
    order.sort_by_key(|&i| ops[i].group.id);
    frame.clear();
    spans.clear();
    let mut i = 0;
    while i < order.len() {
        let op = &ops[order[i]];
        let mut j = i + 1;
        let entry = if op.kind == EntryKind::Records {
            let start = frame.begin_records(op.group.id);
            for k in i..order.len() {
                let next = &ops[order[k]];
                if next.group.id != op.group.id || next.kind != EntryKind::Records {
                    break;
                }
                frame
                    .extend_body(&round_buf[next.entry.start + ENTRY_HEADER_BYTES..next.entry.end]);
                j = k + 1;
            }
            frame.finish_entry(start)
        } else {
            frame.push_encoded(&round_buf[op.entry.clone()])
        };
        spans.push(Span { entry, ops: i..j });
        i = j;
    }
}

#[cfg(test)]
mod frame_layout_tests {
    use crate::commit::journal::{self, EntryKind};
    use crate::tests::{batch_of, newest_file, requests, small_config};
    use crate::Engine;

    /// A round's submissions, interleaved over groups, become one frame
    /// whose entries are sorted by group id with each group's records
    /// merged into one Records entry in id order (storage.md section 5,
    /// "How the writer lays out a round"); replay reads them back.
    #[test]
    fn a_round_is_one_frame_sorted_by_group_with_one_records_entry_per_group() {
        let dir = tempfile::tempdir().unwrap();
        let c = small_config(dir.path());
        let e = Engine::open(c.clone()).unwrap();
        for g in [1, 2, 3] {
            e.create_group(g).unwrap();
        }
        let msgs = [(3, 1), (1, 1), (2, 1), (1, 2), (3, 2), (1, 3)];
        let payloads = batch_of(&msgs);
        e.append_batch(&requests(&msgs, &payloads)).unwrap();
        e.simulate_crash();
        let path = newest_file(&dir.path().join("journal"), ".tmj");
        let bytes = std::fs::read(path).unwrap();
        let frames = journal::frames_of_file(&bytes);
        let last = frames.last().unwrap();
        let layout: Vec<_> = last
            .entries
            .iter()
            .map(|&(at, len, kind, group)| {
                let body = &bytes[at + journal::ENTRY_HEADER_BYTES..at + len];
                (kind, group, journal::body::decode_records(body))
            })
            .collect();
        assert_eq!(
            layout,
            vec![
                (EntryKind::Records, 1, Some((1, 3))),
                (EntryKind::Records, 2, Some((1, 1))),
                (EntryKind::Records, 3, Some((1, 2))),
            ]
        );
        // The frames before it: the three creations, one per round.
        assert_eq!(frames.len(), 4);
        let e = Engine::open(c).unwrap();
        for (g, n) in [(1, 3), (2, 1), (3, 2)] {
            crate::tests::assert_dense_and_exact(&e, g, n);
        }
    }
}
