//! The facade: create and delete groups, append (idempotent, group-committed),
//! read above an id, head. Owns the group registry, the pending commit round
//! and the commit thread.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use crate::catalog::{Found, UserGroups};
use crate::clock::now_ms;
use crate::commit::context::Context;
use crate::commit::dedup::{DedupBudget, Keyed, Sent, WindowDrop, WindowLimits};
use crate::commit::journal::{self, EntryKind};
pub use crate::commit::thread::{CommitListener, CommitNotice, GroupAppend};
use crate::commit::thread::{Counters, Op, Pending, Progress, Reply, Shared};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::group::{AssignState, Group, LogSlot};
use crate::io::{OsVfs, Vfs};
use crate::logs::group_log::{LogContext, ReadBatch, Scan};
use crate::logs::record::NewRecord;
use crate::sleep_lock::{SleepCondvar, SleepGuard, SleepMutex};
use crate::state::pins::Holds;
use crate::state::recovery::{self, RecoveryReport};
use crate::worker::Worker;

/// The outcome of an accepted append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub msg_id: u64,
    pub timestamp_ms: u64,
    /// True when `(sender, client_msg_id)` was already in the group's window:
    /// nothing new was stored and `msg_id` is the original one.
    pub duplicate: bool,
}

/// A submitted append or group operation, durable once its round completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub appended: Appended,
    /// The commit round that must complete before the append is acknowledged.
    pub round: u64,
}

/// A submitted group or membership operation (create, delete, join, leave,
/// retention). Its outcome is known once its commit round completes.
#[derive(Clone)]
pub struct OpTicket {
    round: u64,
    reply: Option<Arc<Reply>>,
    /// The outcome when it was known at submission (no round needed).
    immediate: Option<u64>,
}

impl OpTicket {
    /// The commit round the outcome waits for (0 when it was known at
    /// submission).
    pub fn round(&self) -> u64 {
        self.round
    }

    pub(crate) fn done(value: u64) -> OpTicket {
        OpTicket {
            round: 0,
            reply: None,
            immediate: Some(value),
        }
    }

    pub(crate) fn pending(round: u64, reply: Option<Arc<Reply>>) -> OpTicket {
        OpTicket {
            round,
            reply,
            immediate: None,
        }
    }
}

/// One append of a batch.
#[derive(Clone, Copy, Debug)]
pub struct AppendRequest<'a> {
    pub group_id: u64,
    pub sender_id: u64,
    pub client_msg_id: u64,
    pub payload: &'a [u8],
}

/// Counters of an engine since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// The checkpoint's groups and memberships are still loading in the
    /// background: `groups` and `memberships` count those registered so
    /// far.
    pub state_loading: bool,
    pub appends: u64,
    pub duplicates: u64,
    pub rounds: u64,
    pub round_records_max: u64,
    pub journal_syncs: u64,
    /// Checkpoints stored since open.
    pub checkpoints: u64,
    /// Checkpoints that failed since open (put off for want of space, or
    /// an I/O error that stopped writes).
    pub checkpoints_failed: u64,
    /// When the last checkpoint was stored, and when the last one failed,
    /// in ms since the Unix epoch; 0 if none was since open.
    pub last_checkpoint_unix_ms: u64,
    pub last_checkpoint_failed_unix_ms: u64,
    pub checkpoint_syncs: u64,
    /// Bytes checkpoints wrote (run parts, delta and merged, and
    /// manifests), and the most one checkpoint wrote.
    pub checkpoint_bytes: u64,
    pub checkpoint_bytes_max: u64,
    /// Time checkpoints took on the checkpointer thread (K2-K7), in total
    /// and the longest, in milliseconds.
    pub checkpoint_ms_total: u64,
    pub checkpoint_ms_max: u64,
    /// Small groups' record bytes copied out of old shared files into cold
    /// files (evacuation and compaction).
    pub reclaim_bytes_copied: u64,
    /// Journal files evacuated and cold files compacted.
    pub reclaim_files: u64,
    /// Background writes (evacuation, compaction, a run merge, a segment's
    /// erasure rewrite) put off because they would have taken the free
    /// space below `disk_free_min_bytes` (storage.md section 9).
    pub reserve_backoffs: u64,
    /// Bytes written to the journal (frames, and the header of each file a
    /// frame rolled to).
    pub journal_bytes: u64,
    pub bytes_appended: u64,
    /// ACKs that moved a cursor.
    pub acks: u64,
    /// Memberships walked by per-user listings (`unread`, `sync`): the work
    /// of requests whose cost grows with the groups of a user.
    pub membership_rows_listed: u64,
    pub groups: u64,
    pub open_segments: u64,
    /// Entries in all dedup windows now.
    pub dedup_entries: u64,
    /// Dedup windows dropped from memory for `dedup_entries_total_max`.
    pub dedup_windows_dropped: u64,
    /// Groups holding a send state or a loaded log now: the ones the idle
    /// sweep looks at (`Config::idle_evict_ms`); idle groups are not counted.
    pub groups_in_use: u64,
    /// Group logs loaded (verified) by the maintenance worker since open:
    /// first uses of groups recovery left unloaded or the idle sweep
    /// unloaded.
    pub group_loads: u64,
    /// Groups the periodic retention planning looked at: only the groups
    /// with a retention policy (the work of a walk that must not grow with
    /// the groups that keep everything).
    pub retention_groups_planned: u64,
    /// Memberships now (the cursor table's count).
    pub memberships: u64,
    /// Groups whose files failed verification and that answer
    /// `GroupDamaged` now.
    pub groups_damaged: u64,
    /// A write or fsync failed: writes are refused until the engine is
    /// reopened.
    pub writes_stopped: bool,
    /// Messages stored and readable now (`floor..=head` of every group
    /// that is not damaged).
    pub messages_stored: u64,
}

/// A tidemark storage engine over one data directory.
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
    commit_thread: Option<JoinHandle<()>>,
    checkpointer_thread: Option<JoinHandle<()>>,
    /// The maintenance worker (`worker.rs`, `commit/worker_jobs.rs`).
    worker_thread: Option<JoinHandle<()>>,
    /// The background load of the checkpoint's state (`state/lazy.rs`),
    /// while it runs.
    loader_thread: Option<JoinHandle<()>>,
    recovery: RecoveryReport,
    /// The snapshot holds (`state/pins.rs`): the checkpointer sets the
    /// newest stored manifest, the journal writer its end, snapshots hold.
    holds: Arc<Holds>,
    _lock: File,
}

impl Engine {
    /// Opens (or creates) the engine in `config.data_dir`, recovering from a
    /// crash if the last run did not shut down cleanly.
    pub fn open(config: Config) -> Result<Engine> {
        Engine::open_on(config, Arc::new(OsVfs), None)
    }

    /// Like [`Engine::open`], for a replica of a replica set: every Round
    /// frame this node writes as its own passes `gate` first and is
    /// written only once the gate says it is committed
    /// (format-spec/cluster.md section 4.1, `commit/gate.rs`), so the
    /// engine holds only committed rounds. Rounds taken with
    /// [`Engine::append_replicated`] do not pass it.
    pub fn open_gated(config: Config, gate: Arc<dyn crate::RoundGate>) -> Result<Engine> {
        Engine::open_on(
            config,
            Arc::new(OsVfs),
            Some(crate::commit::gate::Gate::new(gate)),
        )
    }

    /// Like [`Engine::open`], over a custom file layer (fault injection:
    /// `io::FaultyVfs`, `power_cut::PowerCutVfs`). Only with the `testing`
    /// feature: a release build opens the real file system only.
    #[cfg(any(test, feature = "testing"))]
    pub fn open_with_vfs(config: Config, vfs: Arc<dyn Vfs>) -> Result<Engine> {
        Engine::open_on(config, vfs, None)
    }

    fn open_on(
        config: Config,
        vfs: Arc<dyn Vfs>,
        gate: Option<crate::commit::gate::Gate>,
    ) -> Result<Engine> {
        config.validate()?;
        // Every file written from here on is noted for the flusher's next
        // pass (`io/written.rs`).
        let written = Arc::new(crate::io::written::WrittenFiles::default());
        let vfs: Arc<dyn Vfs> =
            Arc::new(crate::io::written::TrackWrites::new(vfs, written.clone()));
        // A directory of another storage format is refused before anything
        // (the lock file, a directory) is written to it; recovery checks
        // again under the lock and marks a new directory.
        crate::state::format::check(&*vfs, &config.data_dir)?;
        let lock = recovery::lock_data_dir(&*vfs, &config.data_dir)?;
        let mut config = config;
        config.open_segments_max = crate::io::fit_open_file_limit(config.open_segments_max);
        let holds: Arc<Holds> = Arc::default();
        let ctx = Context::new(LogContext::new(vfs, config, holds.clone()));
        let recovered = recovery::recover(&ctx).map_err(|e| no_space_at_open(&ctx, e))?;
        let (mut journal, report, on_disk) =
            (recovered.journal, recovered.report, recovered.on_disk);
        // A crash may have come between a recall and the deletion of the
        // journal files holding its payload (the erasure bound, storage.md
        // section 16 item 16): every file before the one this open writes
        // goes within the bound again.
        ctx.erase_journal_seq.store(
            journal.seq.saturating_sub(1),
            std::sync::atomic::Ordering::Relaxed,
        );
        journal.publish_to(holds.clone());
        // A group with recalled payloads still in its segments (its stored
        // erase list) gets the erasure pass, which runs after a stored
        // checkpoint, soon after open even on a quiet node: the bound of
        // storage.md section 16 item 16 counts from here.
        // (Groups a background load registers later with such a list ask
        // for it when the load ends, `state::lazy::start_loader`.)
        let needs_checkpoint = recovered.needs_checkpoint || !ctx.erase_groups.lock().is_empty();
        // Measured before the first send can arrive: starting from "plenty
        // free" would accept sends on a nearly full disk until the commit
        // thread's first measurement (a race seen as a flaky refusal test).
        let free_at_open = if ctx.config.disk_free_min_bytes == 0 {
            u64::MAX
        } else {
            ctx.vfs.free_bytes(&ctx.config.data_dir).unwrap_or(u64::MAX)
        };
        let shared = Arc::new(Shared {
            ctx,
            catalog: RwLock::new(recovered.catalog),
            cursors: recovered.cursors,
            pending: SleepMutex::new(Pending {
                round: 1,
                checkpoint: needs_checkpoint,
                ..Default::default()
            }),
            pending_cv: SleepCondvar::new(),
            progress: SleepMutex::new(Progress::default()),
            progress_cv: SleepCondvar::new(),
            writes_stopped: AtomicBool::new(false),
            disk_free_bytes: AtomicU64::new(free_at_open),
            held_for_space: AtomicBool::new(false),
            counters: Counters::default(),
            listeners: Mutex::new(Vec::new()),
            dedup: DedupBudget::new(),
            ckpt: Default::default(),
            worker: Worker::new(),
            ready_failures: Mutex::new(Default::default()),
            replicating: Mutex::new(()),
            load: Default::default(),
        });
        // Before any other thread: a failure here opens nothing.
        let loader_thread = crate::state::lazy::start_loader(&shared, recovered.pending)?;
        // Logs recovery loaded leave memory when idle, like any other.
        for id in recovered.loaded {
            shared.dedup.touch_used(id);
        }
        let flusher = crate::commit::flusher::Flusher::start(
            shared.ctx.vfs.clone(),
            written,
            shared.ctx.config.checkpoint_journal_bytes,
        );
        let checkpointer_thread = crate::state::checkpointer::start(
            shared.clone(),
            holds.clone(),
            flusher.checker(),
            on_disk,
        )?;
        let thread_shared = shared.clone();
        let commit_thread = match std::thread::Builder::new()
            .name("tidemark-commit".into())
            .spawn(move || crate::commit::thread::run(thread_shared, journal, flusher, gate))
        {
            Ok(t) => t,
            Err(e) => {
                stop_checkpointer(&shared, checkpointer_thread);
                return Err(Error::io("spawn commit thread", e));
            }
        };
        let worker_thread = match crate::commit::worker_jobs::start_worker(&shared) {
            Ok(handle) => handle,
            Err(e) => {
                shared.pending.lock().shutdown = true;
                shared.pending_cv.notify_all();
                let _ = commit_thread.join();
                stop_checkpointer(&shared, checkpointer_thread);
                return Err(e);
            }
        };
        log::info!(
            "engine open: {} groups, clean={}, journal entries replayed {}, bytes cut {}, \
             groups verified {}, not yet verified {}, damaged {}",
            report.groups,
            report.clean_shutdown,
            report.journal_entries_replayed,
            report.bytes_cut(),
            report.groups_verified,
            report.groups_unverified,
            report.damaged_groups.len()
        );
        Ok(Engine {
            shared,
            commit_thread: Some(commit_thread),
            checkpointer_thread: Some(checkpointer_thread),
            worker_thread: Some(worker_thread),
            loader_thread,
            recovery: report,
            holds,
            _lock: lock,
        })
    }

    pub fn config(&self) -> &Config {
        &self.shared.ctx.config
    }

    /// What recovery found and repaired when this engine was opened.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Registers a callback run on the commit thread after every completed
    /// round with its number. It must be quick and must not call the engine's
    /// write path (the server uses it to wake its event loop).
    pub fn add_commit_listener(&self, f: CommitListener) {
        self.shared.listeners.lock().push(f);
    }

    /// The group for a request: `GroupNotFound` if it does not exist or its
    /// deletion is pending ([`Group::is_deleting`]). Every request path
    /// finds its group here, so a pending delete looks the same to all.
    pub(crate) fn group(&self, group_id: u64) -> Result<Arc<Group>> {
        let s = &self.shared;
        // The error is made only when returned (it has drop glue: made
        // eagerly, it would be built and dropped on every found group).
        match crate::catalog::Catalog::find(&s.catalog, &s.ctx, &s.cursors, group_id)? {
            Some(g) if !g.is_deleting() => Ok(g),
            _ => Err(Error::GroupNotFound { group: group_id }),
        }
    }

    /// [`Self::group`] that never reads the disk (for the requests of an
    /// event loop): while the saved state loads in the background, a
    /// group neither registered nor known absent is looked up in the
    /// mapped runs by the maintenance worker, and the request gets
    /// `NotReady` with that job's ticket (one job per group, however many
    /// requests ask); run again after it, the request gets the group,
    /// `GroupNotFound`, or the load's error for a group whose items do not
    /// decode. Once the load ended: [`Self::group`] and one atomic load.
    pub(crate) fn try_group(&self, group_id: u64) -> Result<Arc<Group>> {
        match self.try_lookup(group_id)? {
            Some(g) if !g.is_deleting() => Ok(g),
            _ => Err(Error::GroupNotFound { group: group_id }),
        }
    }

    /// The registry's final answer for `group_id` (the group, also one
    /// whose deletion is pending, or `None`: no such group), told without
    /// reading the disk, as [`Self::try_group`] tells it: `NotReady` with
    /// the worker's ticket while only a lookup in the mapped runs tells.
    pub(crate) fn try_lookup(&self, group_id: u64) -> Result<Option<Arc<Group>>> {
        let s = &self.shared;
        if !s.load.loading() {
            return crate::catalog::Catalog::find(&s.catalog, &s.ctx, &s.cursors, group_id);
        }
        match crate::catalog::Catalog::try_find(&s.catalog, group_id)? {
            Found::Final(g) => Ok(g),
            Found::NeedsLookup => {
                match crate::commit::worker_jobs::request_group(&self.shared, group_id) {
                    Some(ticket) => Err(Error::NotReady {
                        group: group_id,
                        ticket,
                    }),
                    None => Err(Error::ShuttingDown),
                }
            }
        }
    }

    /// [`Self::try_lookup`] of every group `ids` names (once per group):
    /// their final answers, or `NotReady` while some must be looked up in
    /// the saved state still loading. Every such lookup is queued at once,
    /// and the ticket is the highest of theirs (every job up to a ticket is
    /// done when it is), so one worker hop serves the whole request. Cost:
    /// one registry lookup per group named.
    pub(crate) fn try_lookup_all(
        &self,
        ids: impl Iterator<Item = u64>,
    ) -> Result<HashMap<u64, Result<Option<Arc<Group>>>>> {
        let mut found = HashMap::new();
        let mut wait: Option<(u64, u64)> = None;
        for id in ids {
            if found.contains_key(&id) {
                continue;
            }
            match self.try_lookup(id) {
                Err(Error::NotReady { group, ticket }) => {
                    if wait.is_none_or(|(_, t)| ticket > t) {
                        wait = Some((group, ticket));
                    }
                }
                lookup => {
                    found.insert(id, lookup);
                }
            }
        }
        match wait {
            Some((group, ticket)) => Err(Error::NotReady { group, ticket }),
            None => Ok(found),
        }
    }

    /// The first of `groups` that does not exist (or is being deleted, or
    /// whose saved items do not decode), told without reading the disk:
    /// `NotReady` while one of them must be looked up in the saved state
    /// still loading ([`Self::try_lookup_all`]: one wait for all).
    pub fn try_missing_group(&self, groups: &[u64]) -> Result<Option<u64>> {
        let found = self.try_lookup_all(groups.iter().copied())?;
        Ok(groups
            .iter()
            .copied()
            .find(|g| !matches!(found.get(g), Some(Ok(Some(group))) if !group.is_deleting())))
    }

    /// `Ok` once every group and membership of the checkpoint is
    /// registered; before, `NotReady` with [`crate::STATE_TICKET`] (see
    /// `state/lazy.rs`): for the requests that need all of a user's groups
    /// or the number of groups.
    pub(crate) fn whole_state(&self) -> Result<()> {
        crate::commit::loading::whole_state(&self.shared.load)
    }

    /// `Ok` once the cursor table holds every membership of `user`: the
    /// state is whole, or every saved group the user index names for the
    /// user is registered ([`Self::try_user_groups`]); before, `NotReady`
    /// with the ticket of the worker's job that registers them, or as
    /// [`Self::whole_state`] (a saved state without a complete index tells
    /// a user's groups only once every group is loaded). Reads no file.
    pub(crate) fn user_state(&self, user: u64) -> Result<()> {
        match self.try_user_groups(user)? {
            UserGroups::Registered => Ok(()),
            UserGroups::Unregistered => Err(self.register_user_groups(user)),
            UserGroups::Unindexed => self.whole_state(),
        }
    }

    /// Whether every saved group of `user` is registered (`Registered`
    /// also once the state is whole), told without reading the runs; the
    /// load's error if it stopped at damage.
    pub(crate) fn try_user_groups(&self, user: u64) -> Result<UserGroups> {
        let s = &self.shared;
        if !s.load.loading() {
            return Ok(UserGroups::Registered);
        }
        if let Some(e) = s.load.failure() {
            return Err(e);
        }
        crate::catalog::Catalog::user_groups(&s.catalog, user)
    }

    /// `NotReady` with the ticket of the maintenance worker's job that
    /// registers every saved group of `user` (lookups in the mapped runs,
    /// never on a request's thread), queued now or found queued.
    pub(crate) fn register_user_groups(&self, user: u64) -> Error {
        match crate::commit::worker_jobs::request_user_groups(&self.shared, user) {
            Some(ticket) => Error::NotReady { group: 0, ticket },
            None => Error::ShuttingDown,
        }
    }

    /// Whether requests that got `NotReady` with [`crate::STATE_TICKET`]
    /// may run again: the background load ended (or stopped at damage,
    /// whose error they then get). One atomic load.
    pub fn state_load_settled(&self) -> bool {
        self.shared.load.settled()
    }

    /// Whether new writes are accepted now: `Err(DiskFull)` while the disk is
    /// (nearly) full, `Err(WritesStopped)` after a failed write or fsync.
    pub fn accepting_writes(&self) -> Result<()> {
        self.check_writable()
    }

    /// Refuses new writes when writes stopped or the disk is nearly full.
    pub(crate) fn check_writable(&self) -> Result<()> {
        self.check_not_stopped()?;
        let min = self.shared.ctx.config.disk_free_min_bytes;
        let free = self.shared.disk_free_bytes.load(Ordering::Acquire);
        if free < min || self.shared.held_for_space.load(Ordering::Acquire) {
            return Err(Error::DiskFull { free, min });
        }
        Ok(())
    }

    /// Writes that free space (deletes, checkpoints) only need this.
    pub(crate) fn check_not_stopped(&self) -> Result<()> {
        if self.shared.writes_stopped.load(Ordering::Acquire) {
            let reason = self
                .shared
                .progress
                .lock()
                .failed
                .as_ref()
                .map(|f| f.1.clone())
                .unwrap_or_default();
            return Err(Error::WritesStopped { reason });
        }
        Ok(())
    }

    /// Creates an empty group; returns when its creation is durable.
    pub fn create_group(&self, group_id: u64) -> Result<()> {
        // It may wait for a background load of the saved state
        // ([`Engine::try_submit_create_group`] answers `NotReady` meanwhile).
        let ticket = self.submit_create_group(group_id)?;
        self.wait_op(ticket).map(|_| ())
    }

    /// Registers the group and queues its creation; durable once the
    /// ticket's round completes. It may wait for a background load of the
    /// saved state (see [`Engine::try_submit_create_group`]).
    pub fn submit_create_group(&self, group_id: u64) -> Result<OpTicket> {
        self.blocking(|| self.try_submit_create_group(group_id))
    }

    /// Registers the group (memory only: no file-system call here, and
    /// none under the registry lock) and queues its creation; durable once
    /// the ticket's round completes. The creation itself makes no file:
    /// the commit thread makes the group's files when it applies its first
    /// record. Appends may follow at once. While the saved state loads in
    /// the background: `NotReady` with the worker's ticket while the
    /// saved state is searched for the id (`Engine::try_lookup`), and with
    /// [`crate::STATE_TICKET`] if the groups may be near `groups_max`
    /// (`commit/loading.rs`).
    pub fn try_submit_create_group(&self, group_id: u64) -> Result<OpTicket> {
        self.check_writable()?;
        let s = &self.shared;
        if s.load.loading() {
            // The saved state may hold it: taken from the runs first, by
            // the worker (once the lookup's answer is final, the catalog's
            // is, so the check below sees every group of that id).
            self.try_lookup(group_id)?;
        }
        let mut catalog = s.catalog.write();
        if catalog.contains(group_id) {
            return Err(Error::GroupExists { group: group_id });
        }
        let max = s.ctx.config.groups_max;
        // `groups_max` counts every group: while the state loads, the
        // creation waits unless the load's bound decides it already.
        if !s.load.admits_create(catalog.len(), max) {
            drop(catalog);
            return self
                .whole_state()
                .and_then(|()| self.try_submit_create_group(group_id));
        }
        if catalog.len() >= max {
            return Err(Error::LimitExceeded {
                what: "groups_max",
                max,
            });
        }
        // No file and no directory: they are made when its first record
        // is applied (`LogSlot::Small`). Its send state is made on the
        // first send, in memory (an empty window, `empty_send_state`).
        let group = catalog.insert(group_id, LogSlot::new_small());
        self.shared.dedup.touch_used(group_id);
        // The create entry is queued under the registry lock, so no append to
        // this group can reach the journal before it.
        let round = self.push_entry(&group, EntryKind::CreateGroup, |_| {})?;
        // The node's default policy is stored with the group: one
        // SetRetention entry right behind its creation, queued under the
        // same registry lock, so in the same round (a round ends only with
        // that lock) and applied before any record of the group.
        let policy = self.shared.ctx.config.retention_default;
        if policy.keeps_everything() {
            return Ok(OpTicket::pending(round, None));
        }
        let with_policy = self.push_entry(&group, EntryKind::SetRetention, |b| {
            journal::body::encode_set_retention(b, &policy)
        })?;
        Ok(OpTicket::pending(round.max(with_policy), None))
    }

    /// Deletes a group and its files; returns when the deletion is durable.
    /// Appends already accepted are committed first; later ones fail.
    pub fn delete_group(&self, group_id: u64) -> Result<()> {
        let ticket = self.submit_delete_group(group_id)?;
        self.wait_op(ticket).map(|_| ())
    }

    /// Queues the deletion of a group; see [`Engine::delete_group`].
    pub fn submit_delete_group(&self, group_id: u64) -> Result<OpTicket> {
        self.blocking(|| self.try_submit_delete_group(group_id))
    }

    /// [`Engine::submit_delete_group`] that never reads the disk:
    /// `NotReady` while the group is looked up in the saved state still
    /// loading (`Engine::try_group`).
    pub fn try_submit_delete_group(&self, group_id: u64) -> Result<OpTicket> {
        self.check_not_stopped()?;
        let group = self.try_group(group_id)?;
        let mut assign = group.assign.lock();
        // Checked again under the lock: another thread may have won the race.
        if group.is_deleting() {
            return Err(Error::GroupNotFound { group: group_id });
        }
        group.mark_deleting(&assign);
        // No send is assigned to a deleted group: its window is not needed.
        let window_len = assign.take().map_or(0, |a| a.dedup.len());
        self.shared.dedup.forget(group_id, window_len);
        let round = self.push_entry(&group, EntryKind::DeleteGroup, |_| {})?;
        Ok(OpTicket::pending(round, None))
    }

    /// Waits for a group or membership operation; returns its value (the
    /// cursor for a join, 0 otherwise).
    pub fn wait_op(&self, ticket: OpTicket) -> Result<u64> {
        self.wait_round(ticket.round)?;
        op_outcome(&ticket)
    }

    /// Non-blocking: `Some` once the operation completed or failed.
    /// Every round up to this one has a known outcome ([`Self::poll`]
    /// answers `Some` for its tickets): the last completed round, or
    /// `u64::MAX` once writes failed or the commit thread ended (then every
    /// later round has its error). One lock, so a caller holding many
    /// tickets polls only those that can be answered.
    pub fn settled_round(&self) -> u64 {
        let p = self.shared.progress.lock();
        if p.failed.is_some() || p.commit_thread_exited {
            u64::MAX
        } else {
            p.completed
        }
    }

    pub fn poll_op(&self, ticket: &OpTicket) -> Option<Result<u64>> {
        let p = self.shared.progress.lock();
        let r = round_outcome(&p, ticket.round)?;
        drop(p);
        Some(r.and_then(|()| op_outcome(ticket)))
    }

    /// Queues one journal entry in the pending round; returns the round.
    /// Record entries wait while the round is full (back-pressure); group
    /// entries never do, since their callers may hold the registry lock that
    /// the commit thread needs to finish the round.
    fn push_entry(
        &self,
        group: &Arc<Group>,
        kind: EntryKind,
        body: impl FnOnce(&mut Vec<u8>),
    ) -> Result<u64> {
        self.push_entry_with_reply(group, kind, body, None)
    }

    pub(crate) fn push_entry_with_reply(
        &self,
        group: &Arc<Group>,
        kind: EntryKind,
        body: impl FnOnce(&mut Vec<u8>),
        reply: Option<Arc<Reply>>,
    ) -> Result<u64> {
        self.push_entry_inner(group, kind, body, reply, true)
    }

    fn push_entry_inner(
        &self,
        group: &Arc<Group>,
        kind: EntryKind,
        body: impl FnOnce(&mut Vec<u8>),
        reply: Option<Arc<Reply>>,
        wait_for_room: bool,
    ) -> Result<u64> {
        let mut p = self.lock_pending(
            kind == EntryKind::Records && wait_for_room,
            kind == EntryKind::Records,
        )?;
        let round = push_locked(&mut p, group, kind, body, reply);
        drop(p);
        self.shared.pending_cv.notify_all();
        Ok(round)
    }

    /// Locks the pending round. When `full_matters`, a full round makes the
    /// caller wait for the commit thread to take it (`wait`) or fail with
    /// `Overloaded`.
    pub(crate) fn lock_pending(
        &self,
        wait: bool,
        full_matters: bool,
    ) -> Result<SleepGuard<'_, Pending>> {
        let mut p = self.shared.pending.lock();
        while full_matters
            && !p.ops.is_empty()
            && p.buf.len() >= self.shared.ctx.config.commit_round_bytes_max
            && !p.shutdown
        {
            if !wait {
                return Err(Error::Overloaded);
            }
            p = self.shared.pending_cv.wait(p);
        }
        if p.shutdown {
            return Err(Error::ShuttingDown);
        }
        Ok(p)
    }

    /// Appends a message and waits until it is acknowledged under the fsync
    /// policy. A retransmit (same group, sender and client_msg_id within the
    /// window) returns the original id and stores nothing.
    pub fn append(
        &self,
        group_id: u64,
        sender_id: u64,
        client_msg_id: u64,
        payload: &[u8],
    ) -> Result<Appended> {
        let ticket = self.submit(&AppendRequest {
            group_id,
            sender_id,
            client_msg_id,
            payload,
        })?;
        self.wait(ticket)
    }

    /// Appends many messages in one commit round and waits once for all of
    /// them. Results are in request order. All or nothing: an invalid request
    /// (unknown group, payload too large) fails the batch before anything is
    /// queued.
    pub fn append_batch(&self, requests: &[AppendRequest<'_>]) -> Result<Vec<Appended>> {
        let tickets = self.submit_batch(requests)?;
        let Some(last) = tickets.iter().map(|t| t.round).max() else {
            return Ok(Vec::new());
        };
        self.wait_round(last)?;
        Ok(tickets.into_iter().map(|t| t.appended).collect())
    }

    /// Assigns the next id of the group (or finds the original of a
    /// retransmit) and queues the record; does not wait for the round. The
    /// append is acknowledged once [`Engine::wait`] or [`Engine::poll`]
    /// says so. Waits while the pending round is full, and for the group's
    /// first load and dedup window after open.
    pub fn submit(&self, req: &AppendRequest<'_>) -> Result<Ticket> {
        self.blocking(|| self.submit_inner(req, true))
    }

    /// Like [`Engine::submit`], but never waits (for an event loop that
    /// must not block): when the pending round is full it fails with
    /// `Overloaded`, and when the group's send path needs the disk first
    /// (its first send after open: load and dedup window) with `NotReady`,
    /// the maintenance worker doing that meanwhile.
    pub fn try_submit(&self, req: &AppendRequest<'_>) -> Result<Ticket> {
        self.submit_inner(req, false)
    }

    fn submit_inner(&self, req: &AppendRequest<'_>, wait_for_room: bool) -> Result<Ticket> {
        self.check_request(req)?;
        let group = self.try_group(req.group_id)?;
        let mut slot = group.assign.lock();
        let assign = self.ready_to_assign(&group, &mut slot)?;
        if let Some(dup) = self.duplicate_of(assign, req, Keyed::Message)? {
            drop(slot);
            // The window may just have been rebuilt.
            self.fit_dedup_budget(req.group_id);
            return Ok(dup);
        }
        let mut p = self.lock_pending(wait_for_room, true)?;
        let ticket = self.assign_one(&group, assign, req, Keyed::Message, &mut p);
        drop(p);
        drop(slot);
        self.shared.pending_cv.notify_all();
        self.fit_dedup_budget(req.group_id);
        Ok(ticket)
    }

    /// Queues many appends in one pending round: every group involved is
    /// locked (in id order, so batches never deadlock), then the round once.
    /// One thread fills a whole commit round this way.
    pub fn submit_batch(&self, requests: &[AppendRequest<'_>]) -> Result<Vec<Ticket>> {
        self.blocking(|| self.submit_batch_once(requests))
    }

    /// One try of [`Engine::submit_batch`]: `NotReady` (nothing assigned)
    /// if a group's send path is not ready. Every such group's job is asked
    /// for before it returns, with the last ticket: tickets settle in
    /// order, so one wait covers them all (idle groups lose their send
    /// state, so a batch may meet many at once).
    fn submit_batch_once(&self, requests: &[AppendRequest<'_>]) -> Result<Vec<Ticket>> {
        for req in requests {
            self.check_request(req)?;
        }
        let mut ids: Vec<u64> = requests.iter().map(|r| r.group_id).collect();
        ids.sort_unstable();
        ids.dedup();
        let groups = ids
            .iter()
            .map(|&g| self.group(g))
            .collect::<Result<Vec<_>>>()?;
        let mut assigns: Vec<_> = groups.iter().map(|g| g.assign.lock()).collect();
        let mut not_ready = None;
        for (group, slot) in groups.iter().zip(assigns.iter_mut()) {
            match self.ready_to_assign(group, slot) {
                Ok(_) => {}
                Err(e @ Error::NotReady { .. }) => {
                    crate::commit::worker_jobs::keep_latest(&mut not_ready, e)
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(e) = not_ready {
            return Err(e);
        }
        // A key of the batch that names an earlier change refuses the
        // whole batch before anything is assigned (the batch assigns only
        // messages, so no key can come to name a change on the way).
        for req in requests {
            let i = ids
                .binary_search(&req.group_id)
                .expect("invariant: group of the batch");
            let assign = assigns[i]
                .as_deref()
                .expect("invariant: send state built above");
            self.duplicate_of(assign, req, Keyed::Message)?;
        }
        let mut p = self.lock_pending(true, true)?;
        let mut tickets = Vec::with_capacity(requests.len());
        for req in requests {
            // Invariant: ids holds every request's group.
            let i = ids
                .binary_search(&req.group_id)
                .expect("invariant: group of the batch");
            // Invariant: ready_to_assign filled every slot above.
            let assign = assigns[i]
                .as_deref_mut()
                .expect("invariant: send state built above");
            // Checked above: a key names at most an earlier message here.
            let ticket = match self
                .duplicate_of(assign, req, Keyed::Message)
                .ok()
                .flatten()
            {
                Some(dup) => dup,
                None => self.assign_one(&groups[i], assign, req, Keyed::Message, &mut p),
            };
            tickets.push(ticket);
        }
        drop(p);
        drop(assigns);
        self.shared.pending_cv.notify_all();
        if let Some(&first) = ids.first() {
            self.fit_dedup_budget(first);
        }
        Ok(tickets)
    }

    fn check_request(&self, req: &AppendRequest<'_>) -> Result<()> {
        let max = self.shared.ctx.config.payload_bytes_max;
        if req.payload.len() > max {
            return Err(Error::PayloadTooLarge {
                len: req.payload.len(),
                max,
            });
        }
        self.check_writable()
    }

    /// The group's send state. When it is not in memory (first send since
    /// open, or since it was dropped: idle, or for the dedup
    /// budget), `NotReady`: the maintenance worker loads the log, rebuilds
    /// the window and installs the state (`commit/worker_jobs.rs`); only a loaded log
    /// holding no record gets its state here, an empty window needing no
    /// disk. The caller holds `assign`.
    pub(crate) fn ready_to_assign<'a>(
        &self,
        group: &Arc<Group>,
        slot: &'a mut Option<Box<AssignState>>,
    ) -> Result<&'a mut AssignState> {
        if group.is_deleting() {
            return Err(Error::GroupNotFound { group: group.id });
        }
        let assign = match slot {
            Some(a) => a,
            None => match crate::commit::worker_jobs::empty_send_state(group) {
                Some(state) => slot.insert(Box::new(state)),
                None => return Err(self.assign_not_ready(group)),
            },
        };
        self.shared.dedup.touch(group.id);
        Ok(assign)
    }

    /// While the windows of all groups hold more than
    /// `dedup_entries_total_max` entries, drops the send states (windows
    /// included) of the groups sent to least recently (not `current`'s,
    /// not one whose lock is held, not one with records still in a commit
    /// round: a rebuild would not find them in the log yet). Called with no
    /// lock held. Costs the windows it looks at; each dropped one costs its
    /// group one rebuild, exactly as after a restart.
    pub(crate) fn fit_dedup_budget(&self, current: u64) {
        let max = self.shared.ctx.config.dedup_entries_total_max;
        if self.shared.dedup.entries() <= max {
            return;
        }
        let completed = self.shared.progress.lock().completed;
        self.shared.dedup.fit(max, |id| {
            let Ok(group) = self.group(id) else {
                return WindowDrop::Gone; // deleted: its entries were given back then
            };
            let Some(mut slot) = (id != current).then(|| group.assign.try_lock()).flatten() else {
                return WindowDrop::Busy;
            };
            let Some(assign) = slot.as_deref() else {
                return WindowDrop::Gone; // dropped meanwhile (idle)
            };
            if assign.last_round > completed {
                return WindowDrop::Busy;
            }
            let len = assign.dedup.len();
            *slot = None;
            WindowDrop::Dropped { len }
        });
    }

    /// The original of a retransmit, if the window remembers it; `keyed`
    /// is what `req` asks for. A key the window remembers for another
    /// request (a message's key on a recall, a recall of another target)
    /// is `KeyReused` (storage.md section 12, "One key space"): answering
    /// the earlier request would report a success that did not happen.
    pub(crate) fn duplicate_of(
        &self,
        assign: &AssignState,
        req: &AppendRequest<'_>,
        keyed: Keyed,
    ) -> Result<Option<Ticket>> {
        let Some(original) = assign.dedup.lookup(req.sender_id, req.client_msg_id) else {
            return Ok(None);
        };
        if original.keyed != keyed {
            return Err(Error::KeyReused {
                group: req.group_id,
                sender_id: req.sender_id,
                client_msg_id: req.client_msg_id,
                msg_id: original.msg_id,
            });
        }
        let (msg_id, timestamp_ms) = (original.msg_id, original.timestamp_ms);
        self.shared
            .counters
            .duplicates
            .fetch_add(1, Ordering::Relaxed);
        Ok(Some(Ticket {
            appended: Appended {
                msg_id,
                timestamp_ms,
                duplicate: true,
            },
            // The round that holds the original is at most this one.
            round: assign.last_round,
        }))
    }

    /// Gives `req` the group's next id and queues its record in the pending
    /// round. The caller holds the group's assign lock and the pending lock,
    /// so per-group journal order is id order. `keyed`: a message, or an
    /// edit or a recall whose payload starts with its target (`edits.rs`).
    pub(crate) fn assign_one(
        &self,
        group: &Arc<Group>,
        assign: &mut AssignState,
        req: &AppendRequest<'_>,
        keyed: Keyed,
        p: &mut Pending,
    ) -> Ticket {
        let kind = keyed.kind();
        // Stages of the head (group.rs): visible <= assigned.
        debug_assert!(
            group.head() <= assign.last_id,
            "group {}: visible head {} above the assigned {}",
            group.id,
            group.head(),
            assign.last_id
        );
        let msg_id = assign.last_id + 1;
        // Timestamps never go backwards within a group, whatever the clock does.
        let timestamp_ms = now_ms().max(assign.last_timestamp_ms);
        let rec = NewRecord {
            msg_id,
            timestamp_ms,
            sender_id: req.sender_id,
            client_msg_id: req.client_msg_id,
            payload: req.payload,
        };
        let round = push_locked(
            p,
            group,
            EntryKind::Records,
            |buf| journal::body::encode_record_kind(buf, &rec, kind),
            None,
        );
        assign.last_id = msg_id;
        assign.last_timestamp_ms = timestamp_ms;
        assign.last_round = round;
        let config = &self.shared.ctx.config;
        self.shared.dedup.remember_sent(
            &mut assign.dedup,
            &Sent {
                msg_id,
                sender_id: req.sender_id,
                client_msg_id: req.client_msg_id,
                timestamp_ms,
                keyed,
            },
            WindowLimits::from_config(config),
            config.dedup_entries_total_max,
        );
        let c = &self.shared.counters;
        c.appends.fetch_add(1, Ordering::Relaxed);
        c.bytes_appended
            .fetch_add(req.payload.len() as u64, Ordering::Relaxed);
        Ticket {
            appended: Appended {
                msg_id,
                timestamp_ms,
                duplicate: false,
            },
            round,
        }
    }

    /// Waits until the ticket's round is durable (or failed).
    pub fn wait(&self, ticket: Ticket) -> Result<Appended> {
        self.wait_round(ticket.round)?;
        Ok(ticket.appended)
    }

    /// Asks the commit thread to persist moved cursors with the next round;
    /// returns that round.
    pub(crate) fn request_cursor_flush(&self) -> Result<u64> {
        self.request_round(|p| {
            p.flush_cursors = true;
            p.cursor_round = p.round;
        })
    }

    /// Asks the commit thread to persist every moved cursor with the next
    /// round, now (not after `cursor_flush_ms`), and returns that round:
    /// once it completed ([`Self::poll_round`]), every cursor moved before
    /// this call is in a Cursors frame of the journal, which on a replica
    /// set means a committed Raft entry (format-spec/cluster.md section 5).
    /// Callers that ask while a round is being written share the next
    /// one: one frame carries every cursor moved meanwhile. Non-blocking
    /// (one leaf lock).
    pub fn cursor_round(&self) -> Result<u64> {
        self.request_cursor_flush()
    }

    /// The newest round asked for by [`Self::cursor_round`] while it has
    /// not completed yet, else `None`: a cursor a reader finds in memory
    /// now may be one that round persists. `None` too once writes failed
    /// (no round completes then; the caller's own rounds say so).
    /// Non-blocking (two leaf locks).
    pub fn cursor_round_unsettled(&self) -> Option<u64> {
        let wanted = self.shared.pending.lock().cursor_round;
        (wanted > self.settled_round()).then_some(wanted)
    }

    /// Non-blocking: `Some` once `round` completed (`Ok`) or failed.
    pub fn poll_round(&self, round: u64) -> Option<Result<()>> {
        round_outcome(&self.shared.progress.lock(), round)
    }

    /// Begins a consistent snapshot of the node (`snapshot.rs`,
    /// format-spec/storage.md section 18): the newest stored checkpoint and
    /// the journal up to its end now, so every round completed before this
    /// returns is in it. O(1) under one leaf lock (no round waits for
    /// more than that); the copy ([`Snapshot::files`], [`Snapshot::open`])
    /// runs on the caller's thread while rounds go on, and deletions wait
    /// until the snapshot is dropped.
    ///
    /// While the checkpoint's state loads in the background it is refused
    /// with `NotReady` and [`crate::STATE_TICKET`] (it never waits: the
    /// server's event loop and a replica's driver call it): the newest
    /// stored checkpoint must cover every group it holds, and no capture
    /// is taken before the load ends.
    pub fn snapshot(&self) -> Result<crate::Snapshot> {
        self.whole_state()?;
        crate::state::snapshot::Snapshot::begin(self.shared.clone(), self.holds.clone())
    }

    /// Takes a checkpoint of everything committed so far and returns when
    /// it is stored. The engine also takes them on its own (every
    /// `checkpoint_journal_bytes` of journal, `checkpoint_dirty_groups_max`
    /// changed groups or `checkpoint_interval_ms`), on the checkpointer
    /// thread while rounds go on. A checkpoint whose write finds the disk
    /// full changes nothing (the journal keeps everything it would have
    /// covered) and is put off: this returns `Ok` and it is tried again
    /// about a second later.
    pub fn checkpoint(&self) -> Result<()> {
        self.shared.load.wait_settled();
        let round = self.request_round(|p| p.checkpoint = true)?;
        self.wait_round(round)?;
        let co = &self.shared.ckpt;
        let mut st = co.status.lock();
        while st.attempted_through < round && !st.exited {
            if self.shared.writes_stopped.load(Ordering::Acquire) {
                break;
            }
            co.cv
                .wait_for(&mut st, std::time::Duration::from_millis(50));
        }
        let missed = st.attempted_through < round;
        drop(st);
        self.check_not_stopped()?;
        if missed {
            return Err(Error::ShuttingDown);
        }
        Ok(())
    }

    fn request_round(&self, set: impl FnOnce(&mut Pending)) -> Result<u64> {
        self.check_not_stopped()?;
        let mut p = self.shared.pending.lock();
        if p.shutdown {
            return Err(Error::ShuttingDown);
        }
        set(&mut p);
        let round = p.round;
        drop(p);
        self.shared.pending_cv.notify_all();
        Ok(round)
    }

    pub(crate) fn wait_round(&self, round: u64) -> Result<()> {
        let mut p = self.shared.progress.lock();
        loop {
            if let Some(r) = round_outcome(&p, round) {
                return r;
            }
            p = self.shared.progress_cv.wait(p);
        }
    }

    /// Non-blocking: `Some` once the round has completed or failed.
    pub fn poll(&self, ticket: &Ticket) -> Option<Result<Appended>> {
        let p = self.shared.progress.lock();
        round_outcome(&p, ticket.round).map(|r| r.map(|()| ticket.appended))
    }

    /// Records above `after_msg_id`, in id order, as borrowed segment bytes:
    /// at most `max_count` records and `max_bytes` bytes, but always at least
    /// one record if any exists.
    pub fn read(
        &self,
        group_id: u64,
        after_msg_id: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<ReadBatch> {
        self.blocking(|| self.try_read(group_id, after_msg_id, max_count, max_bytes))
    }

    /// [`Engine::read`] that never waits for the disk: `NotReady` when the
    /// group's log or a sealed segment's index must be read first.
    pub fn try_read(
        &self,
        group_id: u64,
        after_msg_id: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<ReadBatch> {
        let group = self.try_group(group_id)?;
        if after_msg_id >= group.head() {
            return Ok(ReadBatch {
                last_id: after_msg_id,
                ..Default::default()
            });
        }
        self.with_log(&group, |log| {
            log.read_with(
                &self.shared.ctx,
                Scan::Refused,
                after_msg_id,
                max_count,
                max_bytes,
            )
        })
    }

    /// The group's newest readable msg_id, in O(1) without locks.
    pub fn head(&self, group_id: u64) -> Result<u64> {
        Ok(self.group(group_id)?.head())
    }

    /// [`Engine::head`] that never reads the disk: `NotReady` while the
    /// group is looked up in the saved state still loading
    /// (`Engine::try_group`).
    pub fn try_head(&self, group_id: u64) -> Result<u64> {
        Ok(self.try_group(group_id)?.head())
    }

    /// Ids of all groups (unordered).
    pub fn group_ids(&self) -> Vec<u64> {
        self.shared.load.wait_settled();
        self.shared.catalog.read().ids()
    }

    pub fn stats(&self) -> EngineStats {
        let c = &self.shared.counters;
        EngineStats {
            appends: c.appends.load(Ordering::Relaxed),
            duplicates: c.duplicates.load(Ordering::Relaxed),
            rounds: c.rounds.load(Ordering::Relaxed),
            round_records_max: c.round_records_max.load(Ordering::Relaxed),
            journal_syncs: c.journal_syncs.load(Ordering::Relaxed),
            checkpoints: c.checkpoints.load(Ordering::Relaxed),
            checkpoints_failed: c.checkpoints_failed.load(Ordering::Relaxed),
            last_checkpoint_unix_ms: c.last_checkpoint_unix_ms.load(Ordering::Relaxed),
            last_checkpoint_failed_unix_ms: c
                .last_checkpoint_failed_unix_ms
                .load(Ordering::Relaxed),
            checkpoint_syncs: c.checkpoint_syncs.load(Ordering::Relaxed),
            checkpoint_bytes: c.checkpoint_bytes.load(Ordering::Relaxed),
            checkpoint_bytes_max: c.checkpoint_bytes_max.load(Ordering::Relaxed),
            checkpoint_ms_total: c.checkpoint_ms_total.load(Ordering::Relaxed),
            checkpoint_ms_max: c.checkpoint_ms_max.load(Ordering::Relaxed),
            reclaim_bytes_copied: c.reclaim_bytes_copied.load(Ordering::Relaxed),
            reclaim_files: c.reclaim_files.load(Ordering::Relaxed),
            reserve_backoffs: self.shared.ctx.reserve.backoffs(),
            journal_bytes: c.journal_bytes.load(Ordering::Relaxed),
            bytes_appended: c.bytes_appended.load(Ordering::Relaxed),
            acks: c.acks.load(Ordering::Relaxed),
            membership_rows_listed: c.membership_rows_listed.load(Ordering::Relaxed),
            groups: self.shared.catalog.read().len() as u64,
            state_loading: self.shared.load.loading(),
            open_segments: self.shared.ctx.cache.len() as u64,
            dedup_entries: self.shared.dedup.entries() as u64,
            dedup_windows_dropped: self.shared.dedup.dropped(),
            groups_in_use: self.shared.dedup.used_len() as u64,
            group_loads: c.group_loads.load(Ordering::Relaxed),
            retention_groups_planned: c.retention_groups_planned.load(Ordering::Relaxed),
            memberships: self.shared.cursors.memberships(),
            groups_damaged: self.shared.ctx.damaged_groups.load(Ordering::Relaxed),
            writes_stopped: self.shared.writes_stopped.load(Ordering::Acquire),
            messages_stored: self.shared.ctx.messages_stored.load(Ordering::Relaxed),
        }
    }

    /// Memberships and the heap bytes of the tables that hold them (cursor
    /// table, member lists, read counts).
    pub fn membership_memory(&self) -> (u64, usize) {
        self.shared.load.wait_settled();
        let catalog = self.shared.catalog.read();
        let mut count = 0;
        let mut bytes = self.shared.cursors.heap_bytes();
        for g in catalog.groups() {
            let m = g.members.lock();
            count += m.len() as u64;
            bytes += m.heap_bytes();
        }
        (count, bytes)
    }

    /// Stops accepting writes, commits what was accepted, writes a clean
    /// checkpoint and joins the commit thread. Called by `Drop` too.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Stops the engine the way a crash would, between two commit rounds:
    /// accepted appends are committed, but no clean checkpoint is written, so
    /// the next open recovers from the journal. For crash tests: only with
    /// the `testing` feature.
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn simulate_crash(mut self) {
        self.shared.pending.lock().crash = true;
        let _ = self.shutdown();
    }

    /// Holds the background load of the engine that opens on `data_dir`
    /// (`Config::load_in_background`) before its first batch, until
    /// [`Engine::release_load`]: the groups its open did not register stay
    /// to be looked up, so that a test acts while the load is pending. A
    /// clean stop of a held engine waits for the release (it lets the
    /// load finish). Only with the `testing` feature.
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn hold_load(data_dir: &std::path::Path) {
        crate::state::lazy::hold::hold(data_dir);
    }

    /// Ends [`Engine::hold_load`]'s hold on `data_dir`.
    #[cfg(any(test, feature = "testing"))]
    #[doc(hidden)]
    pub fn release_load(data_dir: &std::path::Path) {
        crate::state::lazy::hold::release(data_dir);
    }

    fn shutdown(&mut self) -> Result<()> {
        // A clean stop lets the load finish (the final checkpoint covers
        // every group); a crash, or a drop while the thread panics, stops
        // it between batches.
        if let Some(loader) = self.loader_thread.take() {
            if self.shared.pending.lock().crash || std::thread::panicking() {
                self.shared.load.stop();
            }
            let _ = loader.join();
        }
        let Some(handle) = self.commit_thread.take() else {
            return Ok(());
        };
        self.shared.pending.lock().shutdown = true;
        self.shared.pending_cv.notify_all();
        let _ = handle.join();
        if let Some(t) = self.checkpointer_thread.take() {
            stop_checkpointer(&self.shared, t);
        }
        // After the commit thread: its last rounds may queue trash
        // removals, which the worker drops (the next open sweeps the trash).
        self.shared.worker.stop();
        if let Some(worker) = self.worker_thread.take() {
            let _ = worker.join();
        }
        match &self.shared.progress.lock().failed {
            Some((_, reason)) => Err(Error::WritesStopped {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }
}

/// Tells the checkpointer thread to end (after the checkpoint it is
/// writing, if any) and joins it.
/// An open whose write (a promotion in replay, above all) found the disk
/// full: the typed error says how much is free under the data directory
/// and to retry. Nothing was marked damaged, and recovery changes files
/// only in ways the next recovery repeats or tolerates (storage.md
/// section 10, item 7), so the same open succeeds once space returns.
fn no_space_at_open(ctx: &LogContext, e: Error) -> Error {
    if !e.found_no_space() {
        return e;
    }
    let dir = &ctx.config.data_dir;
    let free = match ctx.vfs.free_bytes(dir) {
        Ok(n) => n.to_string(),
        Err(_) => "an unknown number of".into(),
    };
    let what = match e {
        Error::NoSpace { context } => context,
        other => other.to_string(),
    };
    Error::NoSpace {
        context: format!(
            "opening {}: {what}; {free} bytes free under {}, nothing marked damaged",
            dir.display(),
            dir.display()
        ),
    }
}

fn stop_checkpointer(shared: &Shared, thread: JoinHandle<()>) {
    shared.ckpt.status.lock().shutdown = true;
    shared.ckpt.cv.notify_all();
    let _ = thread.join();
}

/// Appends one journal entry to the pending round; returns the round.
fn push_locked(
    p: &mut Pending,
    group: &Arc<Group>,
    kind: EntryKind,
    body: impl FnOnce(&mut Vec<u8>),
    reply: Option<Arc<Reply>>,
) -> u64 {
    let entry = journal::encode_entry(&mut p.buf, kind, group.id, body);
    p.ops.push(Op {
        group: group.clone(),
        kind,
        entry,
        reply,
    });
    p.round
}

fn op_outcome(ticket: &OpTicket) -> Result<u64> {
    if let Some(v) = ticket.immediate {
        return Ok(v);
    }
    match &ticket.reply {
        // The reply is set when the round is applied; taken by one waiter.
        Some(reply) => reply.take().unwrap_or(Err(Error::ShuttingDown)),
        None => Ok(0),
    }
}

fn round_outcome(p: &Progress, round: u64) -> Option<Result<()>> {
    if p.completed >= round {
        return Some(Ok(()));
    }
    if let Some((failed, reason)) = &p.failed {
        if round >= *failed {
            return Some(Err(Error::WritesStopped {
                reason: reason.clone(),
            }));
        }
    }
    if p.commit_thread_exited {
        return Some(Err(Error::ShuttingDown));
    }
    None
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::error!("engine shutdown: {e}");
        }
    }
}
