//! One group in memory: the id-assignment state (send path) and the log
//! slot (commit and read paths), behind separate locks so senders, the
//! commit thread and readers rarely wait on each other.
//!
//! Lock order: `assign` before the engine's pending-round lock; `log` is
//! never held while taking `assign`.
//!
//! A group's head passes three stages, each with one owner:
//! - *assigned*: [`AssignState::last_id`], the last msg_id handed to a
//!   sender (its record is queued in a commit round, maybe not yet in the
//!   journal). Moved only by the send path, under `assign`.
//! - *applied*: [`GroupLog::head`], the last msg_id the log holds (in its
//!   files or its unwritten tail). Its record is in the journal (synced
//!   under `fsync=always`), so applied records are durable. Moved only by
//!   `apply` (commit thread, replay) and by loading, under `log` for writing.
//! - *visible*: [`Group::head`], a copy of the applied head that readers
//!   take without a lock. Written only by [`Group::publish_head`], from the
//!   log, under `log` for writing; for a log not loaded, it is the head its
//!   recorded state names.
//!
//! Invariant: visible == applied whenever `log` is not held for writing,
//! and visible <= assigned while `assign` holds a state (ids are assigned
//! before they are journaled, and journaled before they are applied).
//! Debug assertions check both where the heads move.
//!
//! **Memory** (design 3.3; `size_of` pinned by the tests below). A group
//! holds in place only what every group needs: ids, the visible head, the
//! member list (inline up to two members, see `membership.rs`) and the
//! slot of its log. What only a busy group needs is boxed and leaves memory
//! when the group goes idle ([`crate::commit::dedup::DedupBudget`] says which, the
//! commit thread evicts them, `commit.rs`):
//! - the send state with its dedup window ([`AssignState`], `assign` is
//!   `None` until the next send has the maintenance worker rebuild
//!   it from the log, as after a restart, `commit/worker_jobs.rs`);
//! - the loaded log ([`LogSlot::Loaded`]): a small quiet log goes back to
//!   [`LogSlot::Unloaded`], its recorded state (head and segment lengths),
//!   and is loaded again on its next use ([`Group::unload_if_quiet`]).
//!
//! A retention policy other than "keep everything" and the quiet ids of a
//! group with edits or recalls (`logs/changes.rs`) are boxed too, together
//! ([`GroupExtras`], rare).
//! Idle, a group costs about 218 bytes counted by the allocator (catalog
//! entries included), a two-member chat about 260 with its memberships;
//! the test `engine/tests/memory.rs` measures it, and `sizing.rs` sizes
//! `groups_max` on the resident figures.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::commit::dedup::DedupWindow;
use crate::commit::dirty::{CkptGuard, DirtyList};
use crate::logs::changes::QuietIds;
use crate::logs::extents::ExtentList;
use crate::logs::group_log::{GroupLog, LoadReport, LogContext, LogState};
use crate::logs::record;
use crate::logs::retention::Retention;
use crate::members::cursors::CursorTable;
use crate::members::membership::GroupMembers;

/// A log whose only segment is at most this long is unloaded when its group
/// goes idle: loading it again verifies (CRC-scans) at most this much. The
/// same bound as the design's small groups (`small_group_bytes_max`, which
/// will keep such logs in the shared journal instead).
pub const UNLOAD_LOG_BYTES_MAX: u64 = 64 << 10;

pub struct Group {
    pub id: u64,
    /// Dense small integer standing for the id in the cursor table.
    pub slot: u32,
    /// Set once a DELETE_GROUP of this group was accepted (queued), before
    /// its commit round removes the group from the registry. From then on
    /// the group is not found by any request ([`Group::is_deleting`]); only
    /// the commit thread still applies the entries queued before the delete.
    /// Written with the `assign` lock held, so a send that checks it under
    /// that lock is ordered before or after the delete, never across it.
    deleting: AtomicBool,
    /// The newest applied (readable) msg_id, readable without a lock: a
    /// copy of the log's head (see the module docs).
    visible_head: AtomicU64,
    /// Member list and read counts. Never locked while a cursor-table shard
    /// lock is held; held across every cursor move that the read counts
    /// follow (see `membership.rs`).
    pub members: Mutex<GroupMembers>,
    /// `None`: keep everything and no edit or recall (the default, and
    /// nearly every group).
    extras: Mutex<Option<Box<GroupExtras>>>,
    /// The send path's state, `None` until the first send since open or
    /// since the group went idle (module docs). A join reads only its
    /// `last_id`, or the log's head without one.
    pub assign: Mutex<Option<Box<AssignState>>>,
    pub log: RwLock<LogSlot>,
    /// The checkpoint lock (`dirty.rs`, [`Group::ckpt`]): one byte, in
    /// what would be padding. Taken before any other lock of the group,
    /// and before the catalog.
    ckpt_lock: Mutex<()>,
    /// Under `ckpt_lock`: the applied lsn and the dirty and captured-once
    /// flags (`dirty.rs`).
    pub(crate) ckpt_word: AtomicU64,
}

/// What few groups have, boxed so that the others pay one word
/// (`Group::extras`): never both fields at their default.
#[derive(Default)]
struct GroupExtras {
    retention: Retention,
    quiet: QuietIds,
    /// Recalled messages whose payload may still be in one of the group's
    /// segment files, ascending (storage.md section 3, "Erasure"; GroupPut
    /// bit 6): set by `apply::records` under the checkpoint lock, cleared
    /// by the checkpointer's erasure pass once the rewritten segments are
    /// durable, trimmed by retention like the quiet ids. Each id is also
    /// quiet.
    erase: Vec<u64>,
}

/// Where the group's log is.
pub enum LogSlot {
    /// A small group: no file and no directory of its own, its records
    /// (storage v2 step S5, design section 3.1) in the shared journal
    /// files, named by its extent list (none for a group without records).
    /// Its creation is one journal entry and nothing else (design section
    /// 9). The applying thread (commit thread, replay) appends its records'
    /// extents while it stays within `small_group_bytes_max`, and promotes
    /// it to `Loaded` (its own segment files) when a round would take it
    /// past (`commit/apply.rs`). Deleting it touches no file. A checkpoint
    /// records it with its extents and no segment (format-spec/storage.md
    /// section 6.1).
    Small(ExtentList),
    /// Known from the checkpoint (or unloaded while idle); opened and
    /// verified on first use.
    Unloaded(LogState),
    Loaded(Box<GroupLog>),
    /// Failed verification. Kept with its last known state so a checkpoint
    /// does not forget the group; answers `GroupDamaged` until repaired.
    Damaged {
        state: LogState,
        reason: String,
    },
    /// Deleted; the registry no longer lists it.
    Deleted,
}

/// What [`Group::unload_if_quiet`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unload {
    Done,
    /// Not now (a lock held, writes not yet synced): try again later.
    Later,
    /// Not loaded, or a log that stays loaded (too big, a retention policy).
    Never,
}

/// The send path's view of a group, built on its first send (the
/// dedup window rebuilt from the log) and dropped when it goes idle.
#[derive(Default)]
pub struct AssignState {
    /// The last msg_id handed out: the *assigned* head, >= the visible
    /// head (see the module docs).
    pub last_id: u64,
    pub last_timestamp_ms: u64,
    /// The commit round that holds `last_id`.
    pub last_round: u64,
    pub dedup: DedupWindow,
}

impl Group {
    /// A group whose visible head is the one its log slot names.
    pub fn new(id: u64, slot: u32, log: LogSlot) -> Group {
        let head = log.head();
        Group {
            id,
            slot,
            deleting: AtomicBool::new(false),
            visible_head: AtomicU64::new(head),
            members: Mutex::new(GroupMembers::new()),
            extras: Mutex::new(None),
            assign: Mutex::new(None),
            log: RwLock::new(log),
            ckpt_lock: Mutex::new(()),
            ckpt_word: AtomicU64::new(0),
        }
    }

    /// The cursor of a member of this group, as the member list's read
    /// counts ask for it (0 for a user without a membership: the member
    /// list and the cursor table agree under the `members` lock, so that is
    /// never asked).
    pub fn cursor_of<'a>(&self, cursors: &'a CursorTable) -> impl Fn(u64) -> u64 + 'a {
        let slot = self.slot;
        move |user| cursors.get(user, slot).map_or(0, |c| c.cursor)
    }

    /// How many members' cursors are at or above `msg_id` (read receipts).
    pub fn read_count(&self, cursors: &CursorTable, msg_id: u64) -> u32 {
        self.members
            .lock()
            .read_count(msg_id, self.cursor_of(cursors))
    }

    /// The lowest cursor of a member (None without members).
    pub fn min_cursor(&self, cursors: &CursorTable) -> Option<u64> {
        self.members.lock().min_cursor(self.cursor_of(cursors))
    }

    /// The group's retention policy.
    pub fn retention(&self) -> Retention {
        self.extras
            .lock()
            .as_deref()
            .map(|x| x.retention)
            .unwrap_or_default()
    }

    /// Only through [`crate::catalog::Catalog::set_retention`], which keeps
    /// the index of groups with a policy that retention planning walks, or
    /// on a group not yet registered (`Catalog::publish` indexes it).
    pub(crate) fn set_retention(&self, policy: Retention) {
        self.with_extras(|x| x.retention = policy);
    }

    /// Changes the extras, boxing them on first use and dropping the box
    /// when they are back at their defaults.
    fn with_extras<R>(&self, f: impl FnOnce(&mut GroupExtras) -> R) -> R {
        let mut slot = self.extras.lock();
        let x = slot.get_or_insert_with(Box::default);
        let r = f(x);
        if x.retention.keeps_everything() && x.quiet.is_empty() && x.erase.is_empty() {
            *slot = None;
        }
        r
    }

    /// Quiet ids (`logs/changes.rs`) in `cursor + 1 ..= head`: what a
    /// member at `cursor` does not count as unread. One uncontended lock
    /// and, for a group with edits or recalls, two binary searches.
    pub fn quiet_in(&self, cursor: u64, head: u64) -> u64 {
        self.extras
            .lock()
            .as_deref()
            .map_or(0, |x| x.quiet.count_in(cursor, head))
    }

    /// Unread of a member at `cursor` when the head is `head`: the ids
    /// above the cursor that are not quiet.
    pub fn unread_of(&self, cursor: u64, head: u64) -> u64 {
        head.saturating_sub(cursor) - self.quiet_in(cursor, head)
    }

    /// Whether `id` is quiet: for a message (kind 0), whether it was
    /// recalled.
    pub fn is_quiet(&self, id: u64) -> bool {
        self.extras
            .lock()
            .as_deref()
            .is_some_and(|x| x.quiet.contains(id))
    }

    /// Puts the recalled messages among `records` (the copy of a run of
    /// this group's records, ids rising) in erased form
    /// (`record::erase_in_place`; storage.md section 3, "Erasure"), so the
    /// copy holds none of their payload bytes. A recalled message is a message
    /// (kind 0) whose id is quiet; the ids come from the group's quiet list
    /// once per run (one lock, a binary search per record of the run's range).
    /// A run whose lengths do not walk is left as it is: the cold writer
    /// refuses it whole. Also used by a small group's promotion, which copies
    /// its records into its first segment (`apply.rs`, `promote`).
    pub(crate) fn erase_recalled(&self, records: &mut [u8]) {
        let walk = record::records_walk(records);
        let (Some(&(first_id, _, _)), Some(&(last_id, _, _))) = (walk.first(), walk.last()) else {
            return;
        };
        let quiet = self.quiet_between(first_id, last_id);
        if quiet.is_empty() {
            return;
        }
        for (id, at, len) in walk {
            let rec = &mut records[at..at + len];
            if record::peek_kind(rec) == record::KIND_MESSAGE
                && !record::peek_erased(rec)
                && quiet.binary_search(&id).is_ok()
            {
                record::erase_in_place(rec);
            }
        }
    }

    /// The first quiet record of `records` (a run of this group's records, ids
    /// rising: recalled messages among them) that does not check out, with
    /// why. Erasing a recalled message writes a new CRC over its header, which
    /// would make damage there look valid; so a copy leaves a run holding one
    /// where it is (`rewrite.rs`, `copy_run`), as the cold writer does a run with any
    /// record that fails.
    pub(crate) fn damaged_recalled(&self, records: &[u8]) -> Option<(u64, record::RecordError)> {
        let walk = record::records_walk(records);
        let (Some(&(first_id, _, _)), Some(&(last_id, _, _))) = (walk.first(), walk.last()) else {
            return None;
        };
        let quiet = self.quiet_between(first_id, last_id);
        walk.into_iter()
            .filter(|(id, _, _)| quiet.binary_search(id).is_ok())
            .find_map(|(id, at, len)| {
                record::decode_verified(&records[at..at + len], record::RECORD_BYTES_STORED_MAX)
                    .err()
                    .map(|e| (id, e))
            })
    }

    /// The quiet ids in `lo ..= hi` (a read's range: what its presentation
    /// needs, `Engine::present`); empty for a group without any.
    pub fn quiet_between(&self, lo: u64, hi: u64) -> Vec<u64> {
        self.extras.lock().as_deref().map_or_else(Vec::new, |x| {
            let ids = x.quiet.ids();
            let a = ids.partition_point(|&q| q < lo);
            let b = ids.partition_point(|&q| q <= hi);
            ids[a..b.max(a)].to_vec()
        })
    }

    /// `apply` only, under the checkpoint lock, before the run's records
    /// become visible (so no reader sees the head past an edit whose id is
    /// not quiet yet): the non-message records of a run of records
    /// (`record::for_each_change`). `verify`: the run came from a file or
    /// another node and is checked first when it holds such a record (an
    /// invalid run damages the group, `apply` says so; its ids are not
    /// taken).
    /// Returns whether the run holds a Recall that was taken in.
    pub(crate) fn changes_applied(&self, run: &[u8], verify: bool) -> bool {
        let mut found = false;
        crate::logs::record::for_each_change(run, |_, _, _| found = true);
        let mut recalls = false;
        if found && (!verify || crate::commit::journal::body::decode_records(run).is_some()) {
            self.with_extras(|x| {
                crate::logs::record::for_each_change(run, |id, kind, target| {
                    recalls |= kind == crate::logs::record::KIND_RECALL;
                    x.quiet.applied(id, kind, target)
                })
            });
        }
        recalls
    }

    /// The quiet ids, as a checkpoint stores them (under the checkpoint
    /// lock).
    pub(crate) fn quiet_ids(&self) -> Vec<u64> {
        self.extras
            .lock()
            .as_deref()
            .map_or_else(Vec::new, |x| x.quiet.ids().to_vec())
    }

    /// The latest edits (`changes.rs`), as a checkpoint stores them.
    pub(crate) fn latest_edits(&self) -> Vec<(u64, u64)> {
        self.extras
            .lock()
            .as_deref()
            .map_or_else(Vec::new, |x| x.quiet.edits().to_vec())
    }

    /// The newest Edit of message `id` (`None`: never edited, or recalled).
    pub fn latest_edit(&self, id: u64) -> Option<u64> {
        self.extras
            .lock()
            .as_deref()
            .and_then(|x| x.quiet.latest_edit(id))
    }

    /// Recovery: the quiet ids and latest edits a checkpoint stored.
    pub(crate) fn restore_quiet(&self, ids: Vec<u64>, edits: Vec<(u64, u64)>) {
        self.with_extras(|x| x.quiet = QuietIds::from_sorted(ids, edits));
    }

    /// The erase list (`GroupExtras::erase`), as a checkpoint stores it and
    /// the erasure pass reads it (under the checkpoint lock).
    pub(crate) fn erase_ids(&self) -> Vec<u64> {
        self.extras
            .lock()
            .as_deref()
            .map_or_else(Vec::new, |x| x.erase.clone())
    }

    /// Under the checkpoint lock: adds recalled messages to the erase list
    /// (`apply::records`), or restores the list a checkpoint stored.
    pub(crate) fn add_erase(&self, ids: &[u64]) {
        if ids.is_empty() {
            return;
        }
        self.with_extras(|x| {
            x.erase.extend_from_slice(ids);
            x.erase.sort_unstable();
            x.erase.dedup();
        });
    }

    /// Under the checkpoint lock, after the segments holding them were
    /// rewritten durably: takes `ids` off the erase list.
    pub(crate) fn clear_erase(&self, ids: &[u64]) {
        if self.extras.lock().is_none() {
            return;
        }
        self.with_extras(|x| x.erase.retain(|id| ids.binary_search(id).is_err()));
    }

    /// Retention, under the checkpoint lock: drops the quiet ids at or
    /// below `up_to` and the latest edits of messages below `floor`
    /// (`changes.rs` says which bounds are exact).
    pub(crate) fn trim_quiet(&self, up_to: u64, floor: u64) -> usize {
        if self.extras.lock().is_none() {
            return 0;
        }
        self.with_extras(|x| {
            // A message below the floor is in no segment left to rewrite
            // (retention deletes the segments holding it).
            x.erase.retain(|&id| id >= floor);
            x.quiet.trim(up_to, floor)
        })
    }

    /// Takes the group's checkpoint lock (`dirty.rs`): what a capture reads
    /// and an applied entry changes, atomically with each other.
    pub fn ckpt<'a>(&'a self, dirty: &'a DirtyList<Group>) -> CkptGuard<'a> {
        dirty.guard(self, &self.ckpt_word, self.slot, self.ckpt_lock.lock())
    }

    /// A queued cursor move of `user` (its checkpoint bit went up): takes
    /// the group's `ckpt` lock and puts it on the dirty list.
    pub fn cursor_moved(self: &Arc<Self>, dirty: &DirtyList<Group>, user: u64) {
        let mut st = self.ckpt(dirty);
        st.cursor_moved(user);
        dirty.mark(self, &mut st);
    }

    /// True once the group's deletion was accepted: every request treats the
    /// group as not found from then on, also while the deletion waits for
    /// its commit round (format-spec/protocol.md section 4.6). The one
    /// predicate behind `Engine::group` and the per-user listings.
    pub fn is_deleting(&self) -> bool {
        self.deleting.load(Ordering::Acquire)
    }

    /// Marks the group as being deleted. The caller holds `assign`.
    pub fn mark_deleting(&self, _assign: &Option<Box<AssignState>>) {
        self.deleting.store(true, Ordering::Release);
    }

    /// The visible head: the newest msg_id a reader may ask for.
    pub fn head(&self) -> u64 {
        self.visible_head.load(Ordering::Acquire)
    }

    /// Makes `head`, the head of the group's log, visible. The caller holds
    /// the log slot for writing (the head comes from what it holds), so
    /// publishers never race. The visible head never moves backward: a
    /// log only grows at its head.
    pub fn publish_head(&self, head: u64) {
        let old = self.visible_head.swap(head, Ordering::AcqRel);
        debug_assert!(
            old <= head,
            "group {}: visible head {old} would move back to {head}",
            self.id,
        );
    }

    /// Recovery only, before any reader or sender can see the group: sets
    /// the visible head also below the one restored, when the records
    /// above it were lost with journal bytes a power cut took back
    /// (`small_log::cut_past_journal_ends`).
    pub(crate) fn recover_head(&self, head: u64) {
        self.visible_head.store(head, Ordering::Release);
    }

    /// Checks (debug builds) that the visible head is the slot's head. The
    /// caller holds `log` (for reading or writing), so no publish is under
    /// way.
    pub fn debug_check_head(&self, slot: &LogSlot) {
        debug_assert!(
            matches!(slot, LogSlot::Deleted) || self.head() == slot.head(),
            "group {}: visible head {} but the log's head is {}",
            self.id,
            self.head(),
            slot.head()
        );
    }

    // --- loading (the maintenance worker, recovery) -------------------

    /// Loads the group's log if it is still as its recorded state left it
    /// (first use after open or after the idle sweep unloaded it, or replay
    /// meeting the group). Returns what
    /// loading found, `None` if it was loaded already or was found damaged
    /// (then the slot says why).
    ///
    /// The verifying scan runs with no lock held (requests to the group
    /// take `log` and must not wait for the disk; neither may a checkpoint,
    /// which takes every group's `log`). The result is installed under
    /// `log` only if the slot is still the one scanned: a deletion
    /// meanwhile discards it. Cutting a torn tail is the one write, done at
    /// install under `log` for that reason (a deleted group's id may be
    /// reused by a new group at the same path).
    ///
    /// Records the load finds past the recorded head (segment records a
    /// power cut kept while it took their journal entries: no replay
    /// brings them) are handed to `adopted` with that head before the log
    /// is installed, while no reader can see them: the caller takes in
    /// the edits and recalls among them (`commit/change_intake.rs`, which
    /// this file cannot import: it imports this one). An error there is
    /// the load's.
    ///
    /// At run time only the maintenance worker calls this (one thread, so
    /// two loads of a group never overlap); recovery calls it before the
    /// worker starts.
    pub fn load_if_unloaded(
        &self,
        ctx: &LogContext,
        dirty: &DirtyList<Group>,
        adopted: impl FnOnce(&GroupLog, u64) -> crate::Result<()>,
    ) -> Option<LoadReport> {
        let state = match &*self.log.read() {
            LogSlot::Unloaded(state) => state.clone(),
            _ => return None,
        };
        let loaded = GroupLog::load(ctx, self.id, &state).and_then(|(log, load)| {
            if log.head() > state.head {
                adopted(&log, state.head)?;
            }
            Ok((log, load))
        });
        let mut slot = self.log.write();
        if !matches!(&*slot, LogSlot::Unloaded(s) if *s == state) {
            // Deleted meanwhile: nothing is installed.
            return None;
        }
        let before = state.stored_messages();
        let installed = self.install_load(ctx, dirty, &mut slot, state, loaded);
        if !self.erase_ids().is_empty() {
            // Its active segment can be rolled now (`erase_segments.rs`).
            ctx.erase_groups.lock().insert(self.id);
        }
        ctx.stored_changed(before, slot.stored_messages());
        installed
    }

    /// The second half of [`Group::load_if_unloaded`], under `log`: the
    /// loaded log, or the damage found, goes into the slot.
    fn install_load(
        &self,
        ctx: &LogContext,
        dirty: &DirtyList<Group>,
        slot: &mut LogSlot,
        state: LogState,
        loaded: crate::Result<(GroupLog, LoadReport)>,
    ) -> Option<LoadReport> {
        let loaded = loaded.and_then(|(log, load)| {
            log.cut_tails(ctx, &load.cuts)?;
            Ok((log, load))
        });
        match loaded {
            Ok((log, load)) => {
                // Loading keeps the recorded head or finds records past it.
                self.publish_head(log.head());
                *slot = LogSlot::Loaded(Box::new(log));
                Some(load)
            }
            Err(e) => {
                log::error!("group {} is damaged: {e}", self.id);
                dirty.damaged(self.id);
                ctx.damaged_groups
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                *slot = LogSlot::Damaged {
                    state,
                    reason: e.to_string(),
                };
                None
            }
        }
    }

    /// Puts a small quiet log back to its recorded state, to be loaded (and
    /// verified) again on its next use: a log of one segment of at most
    /// [`UNLOAD_LOG_BYTES_MAX`] bytes, with nothing unwritten or unsynced
    /// (its recorded state then names exactly what its file durably holds,
    /// as a checkpoint's would), under the default retention (retention runs
    /// only on loaded logs). Its open segment file leaves the cache too.
    /// Commit thread only, under `assign` holding no send state (the
    /// maintenance worker installs a send state only over a loaded log, so
    /// a group with one keeps its log loaded, and a record is never applied
    /// to an unloaded log); a request that finds the log unloaded gets
    /// `NotReady` and the worker loads it again (`ready.rs`,
    /// `commit/worker_jobs.rs`). Does not wait
    /// for the lock.
    pub fn unload_if_quiet(&self, ctx: &LogContext) -> Unload {
        if !self.retention().keeps_everything() {
            return Unload::Never;
        }
        // Recalled messages the erasure pass has yet to take out of the
        // active segment: it rolls only a loaded log (`erase_segments.rs`).
        if !self.erase_ids().is_empty() {
            return Unload::Later;
        }
        let Some(mut slot) = self.log.try_write() else {
            return Unload::Later;
        };
        let LogSlot::Loaded(log) = &*slot else {
            return Unload::Never;
        };
        let too_big = match log.state().segments[..] {
            [(_, len)] => len > UNLOAD_LOG_BYTES_MAX,
            _ => true,
        };
        if too_big {
            return Unload::Never;
        }
        if log.needs_sync() || log.has_unwritten_tail() {
            return Unload::Later; // until the next checkpoint
        }
        let state = log.state();
        debug_assert_eq!(state.head, self.head(), "group {}: heads", self.id);
        let base = state.segments[0].0;
        *slot = LogSlot::Unloaded(state);
        drop(slot);
        ctx.cache.forget(self.id, base);
        Unload::Done
    }
}

impl LogSlot {
    /// The slot of a new group: small, without a record, its first record
    /// to be id 1.
    pub fn new_small() -> LogSlot {
        LogSlot::Small(ExtentList::new(1))
    }

    /// Whether this is a small group without any record.
    #[cfg(test)]
    pub fn is_small_without_records(&self) -> bool {
        matches!(self, LogSlot::Small(list) if list.extents().is_empty())
    }
}

impl LogSlot {
    /// A damaged group with a placeholder state (head 0, an empty segment
    /// 1), for tests.
    #[cfg(test)]
    pub fn damaged(reason: String) -> LogSlot {
        LogSlot::Damaged {
            state: LogState {
                head: 0,
                segments: vec![(1, crate::logs::segment::SEGMENT_HEADER_BYTES as u64)],
            },
            reason,
        }
    }

    /// The state a checkpoint records for this slot (None once deleted).
    pub fn state(&self) -> Option<LogState> {
        match self {
            LogSlot::Small(list) => Some(LogState {
                head: list.next_id() - 1,
                segments: Vec::new(),
            }),
            LogSlot::Unloaded(s) | LogSlot::Damaged { state: s, .. } => Some(s.clone()),
            LogSlot::Loaded(l) => Some(l.state()),
            LogSlot::Deleted => None,
        }
    }

    /// Messages this slot stores and can serve: `floor..=head`; none for a
    /// damaged or deleted group. O(1).
    pub fn stored_messages(&self) -> u64 {
        match self {
            LogSlot::Small(list) => list.next_id().saturating_sub(list.floor()),
            LogSlot::Loaded(l) => (l.head() + 1).saturating_sub(l.floor()),
            LogSlot::Unloaded(s) => s.stored_messages(),
            LogSlot::Damaged { .. } | LogSlot::Deleted => 0,
        }
    }

    /// The head of the log this slot holds or names (0 once deleted).
    pub fn head(&self) -> u64 {
        match self {
            LogSlot::Loaded(l) => l.head(),
            LogSlot::Unloaded(s) | LogSlot::Damaged { state: s, .. } => s.head,
            LogSlot::Small(list) => list.next_id() - 1,
            LogSlot::Deleted => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::size_of;
    use std::sync::Arc;

    use super::*;
    use crate::commit::thread::evict_idle;
    use crate::{Config, Engine, FsyncPolicy};

    /// What a group holds in place, pinned: every byte here is paid by every
    /// group, idle or not (module docs; design 3.3).
    #[test]
    fn a_group_holds_little_in_place() {
        assert_eq!(size_of::<GroupMembers>(), 32, "version + 2 inline ids");
        assert_eq!(size_of::<Mutex<GroupMembers>>(), 40);
        assert_eq!(size_of::<Mutex<Option<Box<AssignState>>>>(), 16);
        assert_eq!(size_of::<Mutex<Option<Box<GroupExtras>>>>(), 16);
        // A small group's extent list is held in place (design 3.3).
        assert_eq!(size_of::<ExtentList>(), 40);
        assert_eq!(
            size_of::<LogSlot>(),
            56,
            "a recorded state, a damage reason or a small group's extent list"
        );
        assert_eq!(size_of::<RwLock<LogSlot>>(), 64);
        assert_eq!(size_of::<Mutex<()>>(), 1);
        assert_eq!(
            size_of::<Group>(),
            168,
            "checkpoint state: 8 bytes + a lock in padding"
        );
        // Only while busy: the send state, the loaded log. (The dedup
        // window's note of its changes is one pointer until it holds one.)
        assert_eq!(size_of::<AssignState>(), 120);
        assert!(size_of::<GroupLog>() <= 128);
    }

    /// The idle time of [`idle_engine`]: long enough that the commit
    /// thread's own sweep never evicts during a test, so only the test's
    /// [`sweep`] (which looks this far ahead) does, at known points.
    const IDLE_MS: u64 = 3_600_000;

    fn idle_engine() -> (tempfile::TempDir, Engine) {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Config::segmented(dir.path());
        c.fsync = FsyncPolicy::Never;
        c.idle_evict_ms = IDLE_MS;
        let e = Engine::open(c).unwrap();
        (dir, e)
    }

    /// Runs the commit thread's idle sweep to the end, as if every group
    /// had been idle for [`IDLE_MS`].
    fn sweep(e: &Engine) {
        while evict_idle(&e.shared, crate::clock::now_ms() + IDLE_MS, usize::MAX) {}
    }

    fn group(e: &Engine, id: u64) -> Arc<Group> {
        e.shared.catalog.read().get(id).cloned().unwrap()
    }

    #[test]
    fn a_retransmit_after_idle_eviction_is_still_a_duplicate() {
        let (_dir, e) = idle_engine();
        e.create_group(1).unwrap();
        let first: Vec<_> = (1..=3u64)
            .map(|m| e.append(1, 7, 100 + m, b"x").unwrap())
            .collect();
        // Synced, so the log may leave memory too.
        e.checkpoint().unwrap();
        sweep(&e);
        let g = group(&e, 1);
        assert!(g.assign.lock().is_none(), "send state evicted");
        assert!(matches!(&*g.log.read(), LogSlot::Unloaded(s) if s.head == 3));
        assert_eq!(e.stats().dedup_entries, 0);
        assert_eq!(g.head(), 3, "the visible head stays");
        for (m, a) in (1..=3u64).zip(&first) {
            let again = e.append(1, 7, 100 + m, b"x").unwrap();
            assert!(again.duplicate, "send {m} forgotten after eviction");
            assert_eq!(
                (again.msg_id, again.timestamp_ms),
                (a.msg_id, a.timestamp_ms)
            );
        }
        assert_eq!(e.head(1).unwrap(), 3, "nothing stored twice");
        assert_eq!(e.append(1, 7, 104, b"y").unwrap().msg_id, 4);
        let batch = e.read(1, 0, 10, usize::MAX).unwrap();
        assert_eq!(batch.count, 4);
    }

    #[test]
    fn an_unloaded_log_is_loaded_again_by_a_read_and_a_join() {
        let (_dir, e) = idle_engine();
        e.create_group(1).unwrap();
        e.append(1, 7, 1, b"a").unwrap();
        e.append(1, 7, 2, b"b").unwrap();
        e.checkpoint().unwrap();
        sweep(&e);
        let g = group(&e, 1);
        assert!(matches!(&*g.log.read(), LogSlot::Unloaded(_)));
        let batch = e.read(1, 1, 10, usize::MAX).unwrap();
        assert_eq!((batch.count, batch.last_id), (1, 2));
        assert!(matches!(&*g.log.read(), LogSlot::Loaded(_)));
        e.checkpoint().unwrap();
        sweep(&e);
        assert!(matches!(&*g.log.read(), LogSlot::Unloaded(_)));
        assert_eq!(e.join(1, 9, crate::JoinStart::Head).unwrap(), 2);
        assert_eq!(e.read_count(1, 2).unwrap(), 1);
    }

    /// A group the sweep must leave for later (its log not synced yet) is
    /// listed again only after the sweep: one sweep takes it once, instead
    /// of taking it again and again until its bound (a busy commit thread
    /// under a short `idle_evict_ms`).
    #[test]
    fn a_sweep_takes_a_group_it_leaves_for_later_once() {
        let (_dir, e) = idle_engine();
        e.create_group(1).unwrap();
        e.append(1, 7, 1, b"a").unwrap();
        let later = crate::clock::now_ms() + IDLE_MS;
        assert!(
            !evict_idle(&e.shared, later, 8),
            "the sweep ended with its list, not at its bound"
        );
        assert!(matches!(&*group(&e, 1).log.read(), LogSlot::Loaded(_)));
    }

    /// Every send takes the dedup lists' lock; the idle sweep runs on the
    /// commit thread, so it never waits for that lock: held by another
    /// thread, the sweep returns at once, asking to run again, and the
    /// next sweep once the lock is free evicts.
    #[test]
    fn the_idle_sweep_does_not_wait_for_the_lock_a_send_holds() {
        let (_dir, e) = idle_engine();
        e.create_group(1).unwrap();
        e.append(1, 7, 1, b"a").unwrap();
        e.checkpoint().unwrap();
        let held = e.shared.dedup.hold_lists();
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = e.shared.clone();
        let sweeper = std::thread::spawn(move || {
            let again = evict_idle(&shared, crate::clock::now_ms() + IDLE_MS, usize::MAX);
            let _ = tx.send(again);
        });
        // A deadline for liveness only: the sweep returns in microseconds.
        let swept = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(held);
        sweeper.join().unwrap();
        assert_eq!(
            swept,
            Ok(true),
            "the sweep waited for the dedup lists' lock another thread held"
        );
        let g = group(&e, 1);
        assert!(
            g.assign.lock().is_some(),
            "nothing taken while the lock was held"
        );
        sweep(&e);
        assert!(g.assign.lock().is_none(), "evicted by the next sweep");
        assert!(matches!(&*g.log.read(), LogSlot::Unloaded(_)));
        assert_eq!(e.stats().dedup_entries, 0);
    }

    #[test]
    fn unsynced_logs_and_logs_with_a_policy_stay_loaded() {
        let (_dir, e) = idle_engine();
        e.create_group(1).unwrap();
        e.create_group(2).unwrap();
        e.set_retention(
            2,
            Retention {
                max_bytes: 1 << 30,
                ..Default::default()
            },
        )
        .unwrap();
        e.append(1, 7, 1, b"a").unwrap();
        e.append(2, 7, 1, b"a").unwrap();
        sweep(&e);
        let (g1, g2) = (group(&e, 1), group(&e, 2));
        assert!(g1.assign.lock().is_none() && g2.assign.lock().is_none());
        assert!(
            matches!(&*g1.log.read(), LogSlot::Loaded(_)),
            "not synced yet: stays until a checkpoint"
        );
        e.checkpoint().unwrap();
        sweep(&e);
        assert!(matches!(&*g1.log.read(), LogSlot::Unloaded(_)));
        assert!(
            matches!(&*g2.log.read(), LogSlot::Loaded(_)),
            "retention runs on loaded logs"
        );
    }

    #[test]
    fn a_group_used_recently_is_not_idle() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Config::segmented(dir.path());
        c.fsync = FsyncPolicy::Never;
        c.idle_evict_ms = 60_000;
        let e = Engine::open(c).unwrap();
        e.create_group(1).unwrap();
        e.append(1, 7, 1, b"a").unwrap();
        e.checkpoint().unwrap();
        while evict_idle(&e.shared, crate::clock::now_ms(), usize::MAX) {}
        let g = group(&e, 1);
        assert!(g.assign.lock().is_some());
        assert!(matches!(&*g.log.read(), LogSlot::Loaded(_)));
        while evict_idle(&e.shared, crate::clock::now_ms() + 60_000, usize::MAX) {}
        assert!(g.assign.lock().is_none(), "idle a minute later: evicted");
        assert!(matches!(&*g.log.read(), LogSlot::Unloaded(_)));
    }
}
