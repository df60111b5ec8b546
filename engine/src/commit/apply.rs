//! Applying a journal entry to the in-memory state: the group registry, the
//! cursor table and member lists, and the group logs. The commit thread
//! applies each round's frame here once it is in the journal; recovery's
//! replay applies each valid frame's entries here, in the same (frame)
//! order. One applier, so live and replay cannot drift apart on what an
//! entry means (raft-engine's `MemTableAccessor` is the model). Every entry
//! comes with the `lsn` of its frame (format-spec/storage.md section 5),
//! which names the frame in damage reports and is what a later step's
//! per-group `applied_lsn` gates replay on.
//!
//! What differs between the two is real, and is [`Mode`]:
//! - a failed group-log write stops every write live (there is no way to
//!   stop one group's writes, and a full disk holds the round for a retry),
//!   while replay marks that group damaged and opens the rest (a full
//!   disk fails the open instead: it is a reason to wait, not damage);
//! - record bytes are verified during replay (they come from a file) and
//!   trusted live (the commit thread encoded them this run);
//! - a sender's cursor follows its own message only live (see
//!   [`advance_caught_up_senders`]).
//!
//! A third mode, [`Mode::Replicated`], applies a round another node wrote
//! (a follower): like replay, except that a failed write stops writes as
//! live.
//!
//! Everything else is the same in both: a record the log already holds is
//! skipped (replay after a crash; live, the retry of a round a full disk
//! stopped part-way), a join is checked against the membership limits (so
//! a join refused live is refused again by replay, never resurrected: both
//! apply a frame's entries in frame order, which groups them by group id),
//! a cursor is never set above its group's head. Restoring a
//! checkpoint's memberships is not an apply: the snapshot holds what was
//! accepted, and no limit is checked again (recovery.rs).
//!
//! Every entry carries the lsn of its frame. An entry is applied to a
//! group under the group's `ckpt` lock, which also puts the group on the
//! dirty list (`dirty.rs`); after a group's last entry of a frame its
//! `applied_lsn` becomes the frame's ([`frame_done`]). A checkpoint
//! captures a group under the same lock, so its record reflects every
//! frame up to its `applied_lsn` (and maybe part of the next one); replay
//! therefore skips the frames at or below a group's `applied_lsn` and
//! applies the others whole (the fuzzy checkpoint made exact, storage.md
//! section 11).
//!
//! Cost: O(1) per entry plus the bytes it carries, except DeleteGroup
//! (O(members of the group) and, for a group with files, one rename of its
//! directory) and a group's first record (a mkdir and a file of its first
//! segment). CreateGroup touches no file.

use std::sync::Arc;

use parking_lot::RwLock;

use crate::catalog::Catalog;
use crate::commit::change_intake;
use crate::commit::context::Context;
use crate::commit::dirty::CkptGuard;
use crate::commit::journal::{body, Entry, EntryKind};
use crate::commit::small_log;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::logs::extents::{Extent, ExtentList, FileId};
use crate::logs::group_log::{GroupLog, LoadReport, LogContext};
use crate::logs::record;
use crate::logs::small_read;
use crate::members::cursors::{CursorTable, InsertError};

/// Where a Records entry's body lies in the journal: file `seq`, at byte
/// `offset` (a small group's extent points there, small_log.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BodyAt {
    pub seq: u64,
    pub offset: u64,
}

/// Who applies: see the module docs for what differs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The commit thread, after the round's journal write (and sync).
    Live,
    /// Recovery, for each valid entry of the journal after the checkpoint.
    Replay,
    /// The commit thread, for a round another node wrote
    /// (`Engine::append_replicated`), after its journal write (and sync).
    /// As `Replay` in what an entry means (bodies verified, groups created
    /// here, cursors raised from Cursors entries and never moved by a
    /// sender's own message: the leader persisted those moves in its own
    /// Cursors entries), as `Live` in what a failed write does.
    Replicated,
}

/// The state entries are applied to.
#[derive(Clone, Copy)]
pub(crate) struct State<'a> {
    pub ctx: &'a Context,
    pub catalog: &'a RwLock<Catalog>,
    pub cursors: &'a CursorTable,
}

impl State<'_> {
    /// The registered group `id` (taken from the runs first while a
    /// checkpoint loads in the background, `state::lazy`).
    pub(crate) fn group(&self, id: u64) -> Result<Option<Arc<Group>>> {
        Catalog::find(self.catalog, self.ctx, self.cursors, id)
    }
}

/// What applying one entry did.
#[derive(Debug)]
pub(crate) enum Applied {
    /// A group or membership operation (and Cursors): its value
    /// (a join's cursor, otherwise 0) or why it was refused (a limit, a
    /// leave of a non-member, a malformed body). Live, that is the caller's
    /// answer; replay ignores it.
    Op(Result<u64>),
    /// A Records entry.
    Records(RecordsApplied),
    /// The entry names a group that is not registered: one deleted later
    /// in the journal (replay only).
    Orphan,
    /// The group's checkpointed record already reflects the entry's frame
    /// (its lsn is at or below the group's `applied_lsn`; replay only).
    Reflected,
}

/// What applying a run of records did to its group's log.
#[derive(Debug, Default)]
pub(crate) struct RecordsApplied {
    /// The group's log was loaded first (replay meets groups as the
    /// checkpoint left them), with what loading found.
    pub loaded: Option<LoadReport>,
    /// Records the log already held, skipped.
    pub already_present: u64,
    /// Records appended now.
    pub appended: u64,
    /// The run's first msg_id and the log's head after it, when the log
    /// (still) holds the run; `None` when the group is damaged or deleted.
    pub held: Option<(u64, u64)>,
}

/// Applies one journal entry of the frame numbered `lsn`. `group` is the
/// registered group the entry names (`None` if none is): the commit thread
/// passes the group the entry was queued for, replay looks the id up in
/// the registry.
///
/// An `Err` is an operating error that stops the caller: live, writes stop
/// (or, for a full disk, the round is held and applied again); in replay,
/// opening fails.
pub(crate) fn entry(
    st: &State<'_>,
    entry: &Entry<'_>,
    group: Option<&Arc<Group>>,
    mode: Mode,
    lsn: u64,
    at: Option<BodyAt>,
) -> Result<Applied> {
    let kind = entry.kind;
    if kind == EntryKind::CreateGroup {
        if let Some(g) = group {
            if reflected(st, g, mode, lsn) {
                return Ok(Applied::Reflected);
            }
        }
        create_group(st, entry.group_id, group, mode);
        let g = st.catalog.read().get(entry.group_id).cloned();
        if let Some(g) = g {
            let mut ck = g.ckpt(&st.ctx.dirty);
            st.ctx.dirty.mark(&g, &mut ck);
        }
        return Ok(Applied::Op(Ok(0)));
    }
    let Some(group) = group else {
        return Ok(Applied::Orphan);
    };
    if reflected(st, group, mode, lsn) {
        return Ok(Applied::Reflected);
    }
    if kind == EntryKind::Records {
        return records(st, group, entry.body, at, mode, lsn).map(Applied::Records);
    }
    let mut ck = group.ckpt(&st.ctx.dirty);
    let malformed = |what: &str| Error::InvalidConfig {
        reason: format!("malformed {what} entry"),
    };
    let outcome = match kind {
        EntryKind::DeleteGroup => {
            delete_group(st, group, mode)?;
            // Its next capture writes a tombstone; the group object itself
            // (maybe still on the dirty list) is skipped by captures, and
            // its slot's lists are forgotten (the slot may be reused).
            ck.forget_changes();
            st.ctx.dirty.deleted(group.id);
            return Ok(Applied::Op(Ok(0)));
        }
        EntryKind::Join => match body::decode_join(entry.body) {
            Some((user, cursor)) => {
                let r = join(st.cursors, &st.ctx.config, group, user, cursor);
                if r.is_ok() {
                    ck.member_changed(user);
                }
                r
            }
            None => Err(malformed("join")),
        },
        EntryKind::Leave => match body::decode_leave(entry.body) {
            Some(user) => {
                let r = leave(st.cursors, group, user);
                if r.is_ok() {
                    ck.member_changed(user);
                }
                r
            }
            None => Err(malformed("leave")),
        },
        EntryKind::SetRetention => match body::decode_set_retention(entry.body) {
            Some(r) => {
                st.catalog.write().set_retention(group, r);
                Ok(0)
            }
            None => Err(malformed("retention")),
        },
        EntryKind::ClearHistory => match body::decode_clear_history(entry.body) {
            Some((user, up_to)) => clear_history(st.cursors, group, &mut ck, user, up_to),
            None => Err(malformed("clear-history")),
        },
        EntryKind::Cursors => {
            // Live, cursors are written from memory and never applied.
            debug_assert_ne!(mode, Mode::Live, "cursor entries are not queued");
            restore_cursors(st.cursors, group, &mut ck, entry.body);
            Ok(0)
        }
        EntryKind::CreateGroup | EntryKind::Records => Ok(0),
    };
    st.ctx.dirty.mark(group, &mut ck);
    Ok(Applied::Op(outcome))
}

/// Replay: whether the group's checkpointed record already reflects the
/// frame numbered `lsn` (a capture records a group only between frames,
/// see [`frame_done`]). Live entries are never reflected.
fn reflected(st: &State<'_>, group: &Group, mode: Mode, lsn: u64) -> bool {
    mode == Mode::Replay && lsn <= group.ckpt(&st.ctx.dirty).applied_lsn()
}

/// Records that every entry of the frame numbered `lsn` for `group` was
/// applied: its `applied_lsn`, and the dirty list. Called by the commit
/// thread and replay after a group's last entry of a frame, never between
/// two of them: a capture taken between two entries of one frame sees the
/// older lsn, so replay applies the whole frame to it again, which every
/// entry kind tolerates (joins, leaves, retention and cursors are
/// idempotent, records at or below the head are skipped).
pub(crate) fn frame_done(st: &State<'_>, group: &Arc<Group>, lsn: u64) {
    let mut ck = group.ckpt(&st.ctx.dirty);
    let applied = ck.applied_lsn().max(lsn);
    ck.set_applied_lsn(applied);
    st.ctx.dirty.mark(group, &mut ck);
}

/// CreateGroup: memory only, no file-system call (storage v2 S5). Live,
/// the group is registered already (`submit_create_group` registered it
/// in memory, so appends may follow at once); in replay (and for a
/// replicated round) it is registered here unless it is. A new group's
/// slot is a [`LogSlot::Small`] without records: its files are made when its first record
/// is applied ([`records`]). A registered group is left as it is.
fn create_group(st: &State<'_>, id: u64, group: Option<&Arc<Group>>, mode: Mode) {
    if group.is_some() {
        // Live: registered by the request. Replay: a creation the
        // checkpoint (or an earlier entry) already holds.
        return;
    }
    debug_assert_ne!(mode, Mode::Live, "a queued creation is registered");
    st.catalog.write().insert(id, LogSlot::new_small());
}

/// Appends `run` (a Records body: whole records of `group`, consecutive
/// ids) of the frame numbered `lsn` to the group's log, skipping those it
/// already holds. In replay the body is checked first: it must be valid
/// records with consecutive ids, else the group is damaged. `at` is where
/// the body lies in the journal (`None`: nowhere a small group can point
/// to, so a small group is promoted).
pub(crate) fn records(
    st: &State<'_>,
    group: &Arc<Group>,
    run: &[u8],
    at: Option<BodyAt>,
    mode: Mode,
    lsn: u64,
) -> Result<RecordsApplied> {
    // The count of stored messages follows whatever this did to the slot
    // (records appended, a promotion, damage). Nothing else changes the
    // count meanwhile: retention holds the group's checkpoint lock, which
    // this holds too, and a load happens here or before (live, the send
    // path loaded the group).
    let before = group.log.read().stored_messages();
    {
        // Quiet ids first (edits, recalls: not unread), under the
        // checkpoint lock a capture takes too (`changes.rs`).
        let _ck = group.ckpt(&st.ctx.dirty);
        change_intake::take_in_changes(st.ctx, group, run, mode != Mode::Live, at.map(|a| a.seq));
    }
    let done = records_into_slot(st, group, run, at, mode, lsn);
    st.ctx
        .stored_changed(before, group.log.read().stored_messages());
    done
}

fn records_into_slot(
    st: &State<'_>,
    group: &Arc<Group>,
    run: &[u8],
    at: Option<BodyAt>,
    mode: Mode,
    lsn: u64,
) -> Result<RecordsApplied> {
    let ctx = st.ctx;
    let mut ck = group.ckpt(&st.ctx.dirty);
    st.ctx.dirty.mark(group, &mut ck);
    // A small group: its extent list, or its promotion (`small_records`).
    if let Some(done) = small_records(st, group, &mut ck, run, at, mode, lsn)? {
        return Ok(done);
    }
    let mut done = RecordsApplied {
        // Live, the send path loaded the group before assigning an id.
        // Under the checkpoint lock (`ck`): the load takes in the changes
        // among the segment records it adopts past the recorded head.
        loaded: group.load_if_unloaded(ctx, &ctx.dirty, |log, after| {
            change_intake::take_in_adopted(ctx, group, log, after)
        }),
        ..RecordsApplied::default()
    };
    let mut slot = group.log.write();
    // A damaged group's records are not applied (its journal files are
    // kept); a group cannot be unloaded here, nor deleted before its
    // DeleteGroup entry.
    let LogSlot::Loaded(log) = &mut *slot else {
        if let LogSlot::Damaged { state, .. } = &mut *slot {
            keep_skipped_ids(group, state, run);
        }
        return Ok(done);
    };
    if mode != Mode::Live && body::decode_records(run).is_none() {
        let reason = format!("journal frame lsn {lsn} holds an invalid Records entry");
        *slot = damage(ctx, log, reason);
        return Ok(done);
    }
    let head = log.head();
    let first = record::peek_msg_id(run);
    let above = record::records_above(run, head);
    done.already_present = count_records(&run[..run.len() - above.len()]);
    if let Some(next) = (!above.is_empty()).then(|| record::peek_msg_id(above)) {
        if next != head + 1 {
            // Live, ids are assigned densely and applied in journal order;
            // a replicated round was checked against the send state.
            debug_assert_eq!(mode, Mode::Replay, "live records continue the head");
            let reason =
                format!("journal frame lsn {lsn} holds msg_id {next} but the log ends at {head}");
            *slot = damage(ctx, log, reason);
            return Ok(done);
        }
    }
    // Called also with nothing new: live, the retry of a round a full disk
    // stopped retries the tail flush that failed.
    let taken = log.append(ctx, above);
    // What the log took in is readable (the journal has it), also when a
    // write for it failed and the round is held.
    group.publish_head(log.head());
    done.appended = log.head() - head;
    match taken {
        Ok(()) => done.held = Some((first, log.head())),
        // Replay: a full disk fails the open with nothing marked (the next
        // open replays the frame again), as in a promotion (`promote`).
        Err(e) if mode != Mode::Replay || e.found_no_space() => return Err(e),
        Err(e) => {
            done.appended = 0;
            *slot = damage(ctx, log, format!("replay of frame lsn {lsn} failed: {e}"));
            return Ok(done);
        }
    }
    drop(slot);
    if mode == Mode::Live {
        advance_caught_up_senders(st.cursors, group, &mut ck, run);
    }
    Ok(done)
}

/// A damaged group skips a Records entry (replay applies none to it), but
/// the entry's ids were given out: its head moves over them. So a read
/// after its old head answers `GroupDamaged`, not "nothing new"; the
/// checkpoint records a head at or above every quiet id the entry's
/// changes added (a record its reader accepts, storage.md section 6.1);
/// and repair makes them gap records (`offline/repair.rs`), never ids given
/// again. Only a valid body (records verified, ids consecutive) moves it.
fn keep_skipped_ids(group: &Group, state: &mut crate::logs::group_log::LogState, run: &[u8]) {
    if let Some((first, count)) = body::decode_records(run) {
        let last = first.saturating_add(count - 1);
        if last > state.head {
            state.head = last;
            group.publish_head(last);
        }
    }
}

/// Number of whole records at the front of `buf`.
pub(crate) fn count_records(mut buf: &[u8]) -> u64 {
    let mut n = 0;
    while let Some(len) = record::peek_len(buf).filter(|&l| l > 0 && l <= buf.len()) {
        n += 1;
        buf = &buf[len..];
    }
    n
}

/// The slot of a group found damaged while applying. Its recorded state
/// must name only bytes in its files, so the log's unwritten tail is
/// written first (if that fails too, the journals, kept while a group is
/// damaged, still hold it).
fn damage(ctx: &Context, log: &mut GroupLog, reason: String) -> LogSlot {
    if let Err(e) = log.flush_tail(ctx) {
        log::warn!("damaged group: its unwritten records stay in the journal: {e}");
    }
    ctx.damaged_groups
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    LogSlot::Damaged {
        state: log.state(),
        reason,
    }
}

/// A sender who had read everything before its own message has read that
/// message too: its cursor follows (so own messages are not unread). Live
/// only: replay sees cursors as they were persisted, not as they stood when
/// the message was applied, and a crash may take a cursor back to its last
/// persisted value anyway.
pub(crate) fn advance_caught_up_senders(
    cursors: &CursorTable,
    group: &Group,
    ck: &mut CkptGuard<'_>,
    mut run: &[u8],
) {
    while let Some(len) = record::peek_len(run) {
        // Invariant: live runs hold whole records encoded by the engine.
        let h = record::decode_header(run, usize::MAX).expect("invariant: staged record");
        // The members lock spans the move (membership.rs invariant).
        let mut members = group.members.lock();
        if let Some(newly) = cursors.advance_if_at(h.sender_id, group.slot, h.msg_id - 1, h.msg_id)
        {
            members.advance(h.msg_id - 1, h.msg_id);
            if newly {
                ck.cursor_moved(h.sender_id);
            }
        }
        run = &run[len..];
    }
}

/// Cursors: raises each member's cursor to the row's value (never lowers
/// it, never above the head); rows of non-members are ignored. Entries
/// written twice or out of order are therefore harmless.
fn restore_cursors(cursors: &CursorTable, group: &Group, ck: &mut CkptGuard<'_>, body: &[u8]) {
    let head = group.head();
    for (user, cursor) in body::decode_cursors(body) {
        // The members lock spans the move (membership.rs invariant).
        let mut members = group.members.lock();
        if let Some(m) = cursors.restore(user, group.slot, cursor.min(head)) {
            if m.new != m.old {
                members.advance(m.old, m.new);
            }
            if m.newly_checkpoint_dirty {
                ck.cursor_moved(user);
            }
        }
    }
}

/// ClearHistory: raises the member's join point to `up_to + 1` and its
/// cursor to `up_to` (neither ever falls), so history, pull and sync start
/// after `up_to` and its unread count counts only what it can still read;
/// returns the join point. `up_to` is kept at or below the head (it was
/// resolved against the assigned head when queued; entries apply in
/// journal order, so the records it covers are applied). Idempotent (both
/// are maxima), so replaying a frame again is harmless. `NotMember` when
/// the user left between the request and its round (or in the journal).
fn clear_history(
    cursors: &CursorTable,
    group: &Group,
    ck: &mut CkptGuard<'_>,
    user: u64,
    up_to: u64,
) -> Result<u64> {
    let up_to = up_to.min(group.head());
    // The members lock spans the cursor move (membership.rs invariant).
    let mut members = group.members.lock();
    let not_member = Error::NotMember {
        group: group.id,
        user,
    };
    let join_point = cursors
        .raise_join_point(user, group.slot, up_to.saturating_add(1))
        .ok_or(not_member)?;
    if let Some(m) = cursors.restore(user, group.slot, up_to) {
        if m.new != m.old {
            members.advance(m.old, m.new);
        }
    }
    drop(members);
    // The member row (cursor and join point) goes to the next checkpoint.
    ck.member_changed(user);
    Ok(join_point)
}

/// Join. Idempotent: joining again returns the current cursor. Checked
/// against the membership limits in both modes, in journal order.
pub(crate) fn join(
    cursors: &CursorTable,
    config: &Config,
    group: &Group,
    user: u64,
    cursor: u64,
) -> Result<u64> {
    // Never above the head, whatever a journal entry says.
    let cursor = cursor.min(group.head());
    let mut members = group.members.lock();
    if let Some(c) = cursors.get(user, group.slot) {
        return Ok(c.cursor);
    }
    if members.len() >= config.members_per_group_max {
        return Err(Error::LimitExceeded {
            what: "members_per_group_max",
            max: config.members_per_group_max,
        });
    }
    match cursors.insert(
        user,
        group.slot,
        cursor,
        cursor.saturating_add(1),
        Some(config.groups_per_user_max),
    ) {
        Ok(()) => {}
        Err(InsertError::AlreadyMember) => return Ok(cursor),
        Err(InsertError::GroupsPerUserLimit { max }) => {
            return Err(Error::LimitExceeded {
                what: "groups_per_user_max",
                max,
            })
        }
    }
    members.insert(user, cursor, group.cursor_of(cursors));
    Ok(cursor)
}

/// Leave. Returns the cursor the member had.
pub(crate) fn leave(cursors: &CursorTable, group: &Group, user: u64) -> Result<u64> {
    let mut members = group.members.lock();
    let cursor = cursors.remove(user, group.slot).ok_or(Error::NotMember {
        group: group.id,
        user,
    })?;
    members.remove(user, cursor);
    Ok(cursor)
}

/// DeleteGroup: the group's memberships and registry entry (memory, under
/// the registry lock), then its files: moved to the trash with one rename,
/// outside every lock (the maintenance worker removes them, see
/// `trash.rs`). Live and replicated, the move waits until the commit
/// thread knows the journal durable through this entry (under `fsync
/// always` at the end of its round): a power cut may take back a deletion
/// whose frame was not durable, and the group must then come back whole.
/// Replayed, the entry is already in the journal file and moves at once.
/// Repeatable: live, a round a full disk held applies it again (the group
/// is then unregistered already, and only the move is redone).
pub(crate) fn delete_group(st: &State<'_>, group: &Arc<Group>, mode: Mode) -> Result<()> {
    let id = group.id;
    {
        let mut catalog = st.catalog.write();
        if catalog.get(id).is_some_and(|g| Arc::ptr_eq(g, group)) {
            remove_all_members(st.cursors, group);
            catalog.remove(id);
        }
    }
    let old = std::mem::replace(&mut *group.log.write(), LogSlot::Deleted);
    st.ctx.stored_changed(old.stored_messages(), 0);
    if matches!(old, LogSlot::Damaged { .. }) {
        // Once: a repeated delete finds the slot `Deleted`.
        st.ctx
            .damaged_groups
            .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
    if let LogSlot::Small(list) = &old {
        // No file of its own: its records leave the shared files' counts.
        small_log::forget_extents(st.ctx, list);
        return Ok(());
    }
    if let Some(state) = old.state() {
        for (base, _) in state.segments {
            st.ctx.cache.forget(id, base);
        }
    }
    drop(old);
    if mode == Mode::Replay {
        st.ctx.trash.put(&*st.ctx.vfs, id, &st.ctx.group_dir(id))
    } else {
        st.ctx.trash.put_when_durable(id, st.ctx.group_dir(id));
        Ok(())
    }
}

/// Removes every membership of a group being deleted.
fn remove_all_members(cursors: &CursorTable, group: &Group) {
    let mut members = group.members.lock();
    for user in members.users() {
        if let Some(c) = cursors.remove(user, group.slot) {
            members.remove(user, c);
        }
    }
}

/// Applies a Records body (`run`, whose bytes lie at `at` in the journal,
/// if they do) to `group`, whose `ckpt` lock the caller holds, if its slot
/// is small: the records go into its
/// extent list, or the group is promoted. `None` if the slot is not small
/// (the caller appends to the segment log).
fn small_records(
    st: &State<'_>,
    group: &Arc<Group>,
    ck: &mut CkptGuard<'_>,
    run: &[u8],
    at: Option<BodyAt>,
    mode: Mode,
    lsn: u64,
) -> Result<Option<RecordsApplied>> {
    let ctx = st.ctx;
    // What the decision needs, without copying the list: only a
    // promotion reads it. This thread alone appends to a small slot or
    // turns it into another kind, so head and bytes stay as read (a
    // rewrite moves extents, never records).
    let (head, bytes) = match &*group.log.read() {
        LogSlot::Small(list) => (list.next_id() - 1, list.bytes()),
        _ => return Ok(None),
    };
    let mut done = RecordsApplied::default();
    if mode != Mode::Live && body::decode_records(run).is_none() {
        let reason = format!("journal frame lsn {lsn} holds an invalid Records entry");
        small_log::damage(st.ctx, group, reason);
        return Ok(Some(done));
    }
    let first = record::peek_msg_id(run);
    let above = record::records_above(run, head);
    done.already_present = count_records(&run[..run.len() - above.len()]);
    if above.is_empty() {
        done.held = Some((first, head));
        return Ok(Some(done));
    }
    let next = record::peek_msg_id(above);
    if next != head + 1 {
        debug_assert_eq!(mode, Mode::Replay, "live records continue the head");
        // The ids between may be in the segment files of a promotion whose
        // entries a power cut took, adopted by an open that crashed before
        // its checkpoint recorded them (storage.md section 10, S1): the
        // group takes them in, and this entry goes to its segment log.
        let adopted = match mode {
            Mode::Replay => small_log::take_in_promotion_left(ctx, group, true)?,
            _ => None,
        };
        if let Some(load) = adopted {
            if load.bytes_cut > 0 {
                log::warn!(
                    "group {}: cut {} bytes from the segments a promotion left",
                    group.id,
                    load.bytes_cut
                );
            }
            return Ok(None);
        }
        if !matches!(&*group.log.read(), LogSlot::Small(_)) {
            return Ok(Some(done)); // damaged: its records failed their checks
        }
        let reason =
            format!("journal frame lsn {lsn} holds msg_id {next} but the log ends at {head}");
        small_log::damage(st.ctx, group, reason);
        return Ok(Some(done));
    }
    let count = count_records(above);
    let threshold = ctx.config.small_group_bytes_max;
    let extent = at
        .filter(|_| bytes + above.len() as u64 <= threshold)
        .and_then(|at| extent_of(at, run.len() - above.len(), above.len(), count));
    if let Some(ext) = extent {
        let mut slot = group.log.write();
        // Invariant: only this thread turns a small slot into another kind
        // (a rewrite only moves its extents; module docs), but for the
        // cold-file erasure's damage, which holds the `ckpt` lock this
        // caller holds (`rewrite.rs`).
        let LogSlot::Small(list) = &mut *slot else {
            unreachable!("a small slot changed under its applier");
        };
        list.append(next, ext);
        ctx.live.lock().add(&ext);
        group.publish_head(list.next_id() - 1);
        done.appended = count;
        done.held = Some((first, list.next_id() - 1));
    } else {
        // Outside every lock: the files, the copy.
        let list = match &*group.log.read() {
            LogSlot::Small(list) => list.clone(),
            _ => unreachable!("a small slot changed under its applier"),
        };
        match promote(ctx, group, &list, above) {
            Ok(log) => {
                let mut slot = group.log.write();
                let new_head = log.head();
                // The list as it is now: a rewrite (rewrite.rs) may have
                // moved extents since the copy (same records, new places).
                let old = std::mem::replace(&mut *slot, LogSlot::Loaded(Box::new(log)));
                group.publish_head(new_head);
                drop(slot);
                if let LogSlot::Small(now) = &old {
                    small_log::forget_extents(ctx, now);
                }
                done.appended = count;
                done.held = Some((first, new_head));
            }
            // Live: writes stop, or a full disk holds the round and this
            // runs again from the same list (the half-made directory goes
            // to the trash first). Replay: a full disk is a reason to
            // wait, never damage: the open fails with it, nothing marked,
            // and the next open replays the same frames and promotes
            // again (the half-made directory goes to the trash then).
            Err(e) if mode != Mode::Replay || e.found_no_space() => return Err(e),
            Err(e) => {
                small_log::damage(st.ctx, group, format!("its promotion failed: {e}"));
                return Ok(Some(done));
            }
        }
    }
    if mode == Mode::Live {
        advance_caught_up_senders(st.cursors, group, ck, run);
    }
    Ok(Some(done))
}

/// The extent of `bytes` bytes holding `count` records at `skip` bytes into
/// the body at `at`; `None` if it cannot be one (an offset past 4 GiB, a
/// journal sequence past 2^31: the group is promoted instead).
fn extent_of(at: BodyAt, skip: usize, bytes: usize, count: u64) -> Option<Extent> {
    let offset = u32::try_from(at.offset.checked_add(skip as u64)?).ok()?;
    Extent::new(
        FileId::journal(at.seq)?,
        offset,
        u32::try_from(bytes).ok()?,
        u32::try_from(count).ok()?,
    )
}

/// The segment log of a group being promoted: its files made (a directory
/// at its path first moves to the trash), its records so far read from the
/// shared files (CRC checked) and appended, then `more`. Nothing of the
/// group's state changes here.
fn promote(ctx: &LogContext, group: &Group, list: &ExtentList, more: &[u8]) -> Result<GroupLog> {
    let floor = list.floor();
    let old = small_read::read_above(
        &ctx.shared_files,
        group.id,
        list,
        floor - 1,
        u64::MAX,
        usize::MAX,
    )?;
    GroupLog::create_files(ctx, group.id, floor)?;
    let mut log = GroupLog::empty_at(ctx, group.id, floor);
    // Recalled messages go into the segment erased (storage.md section 3,
    // "Erasure"): the segment is a new file, and the journal copies go
    // within the erasure bound. The quiet ids of this entry's records were
    // taken in before (`records`), so a recall in `more` counts.
    // A copy of the records only in a group with quiet ids.
    let erase = !group.quiet_between(floor, u64::MAX).is_empty();
    for bytes in old.batch.chunks.iter().map(|c| c.bytes()).chain([more]) {
        if erase {
            let mut copy = bytes.to_vec();
            group.erase_recalled(&mut copy);
            log.append(ctx, &copy)?;
        } else {
            log.append(ctx, bytes)?;
        }
    }
    Ok(log)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;
    use crate::logs::group_log::LogContext;
    use crate::logs::record::NewRecord;

    struct Fixture {
        _dir: tempfile::TempDir,
        ctx: Context,
        catalog: RwLock<Catalog>,
        cursors: CursorTable,
    }

    impl Fixture {
        fn new(members_per_group_max: usize) -> Fixture {
            let dir = tempfile::tempdir().unwrap();
            let mut config = Config::new(dir.path());
            config.members_per_group_max = members_per_group_max;
            Fixture {
                ctx: Context::new(LogContext::new(
                    Arc::new(OsVfs),
                    config,
                    Arc::new(crate::state::pins::Holds::default()),
                )),
                _dir: dir,
                catalog: RwLock::new(Catalog::default()),
                cursors: CursorTable::new(),
            }
        }

        fn st(&self) -> State<'_> {
            State {
                ctx: &self.ctx,
                catalog: &self.catalog,
                cursors: &self.cursors,
            }
        }

        fn group(&self, id: u64) -> Option<Arc<Group>> {
            self.catalog.read().get(id).cloned()
        }

        /// Applies an entry as replay does: the group looked up by id.
        fn replay(&self, kind: EntryKind, group_id: u64, body: &[u8]) -> Applied {
            let group = self.group(group_id);
            let e = Entry {
                kind,
                group_id,
                body,
            };
            entry(&self.st(), &e, group.as_ref(), Mode::Replay, 1, None).unwrap()
        }
    }

    fn rec(msg_id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        body::encode_record(
            &mut out,
            &NewRecord {
                msg_id,
                timestamp_ms: 1,
                sender_id: 7,
                client_msg_id: msg_id,
                payload: b"hello",
            },
        );
        out
    }

    fn records(a: &Applied) -> (u64, u64) {
        match a {
            Applied::Records(r) => (r.appended, r.already_present),
            other => panic!("not a records outcome: {other:?}"),
        }
    }

    #[test]
    fn replay_creates_appends_skips_what_the_log_holds_and_damages_on_a_gap() {
        let f = Fixture::new(10);
        assert!(matches!(
            f.replay(EntryKind::Records, 5, &rec(1)),
            Applied::Orphan
        ));
        f.replay(EntryKind::CreateGroup, 5, &[]);
        let g = f.group(5).expect("created by replay");
        assert_eq!(records(&f.replay(EntryKind::Records, 5, &rec(1))), (1, 0));
        assert_eq!(records(&f.replay(EntryKind::Records, 5, &rec(1))), (0, 1));
        assert_eq!(g.head(), 1);
        assert_eq!(records(&f.replay(EntryKind::Records, 5, &rec(3))), (0, 0));
        assert!(matches!(&*g.log.read(), LogSlot::Damaged { state, .. } if state.head == 1));
        assert_eq!(g.head(), 1, "a damaged group keeps its head");
    }

    #[test]
    fn replay_damages_a_group_whose_record_is_invalid() {
        let f = Fixture::new(10);
        f.replay(EntryKind::CreateGroup, 5, &[]);
        let mut bad = rec(1);
        let last = bad.len() - 1;
        bad[last] ^= 1;
        f.replay(EntryKind::Records, 5, &bad);
        let g = f.group(5).unwrap();
        assert!(matches!(&*g.log.read(), LogSlot::Damaged { .. }));
        assert_eq!(g.head(), 0);
    }

    #[test]
    fn live_appends_a_run_and_a_retry_writes_nothing_twice() {
        let f = Fixture::new(10);
        f.replay(EntryKind::CreateGroup, 5, &[]);
        let g = f.group(5).unwrap();
        let run: Vec<u8> = [rec(1), rec(2), rec(3)].concat();
        let done = super::records(&f.st(), &g, &run, None, Mode::Live, 1).unwrap();
        assert_eq!((done.appended, done.already_present), (3, 0));
        assert_eq!(done.held, Some((1, 3)));
        let again = super::records(&f.st(), &g, &run, None, Mode::Live, 1).unwrap();
        assert_eq!((again.appended, again.already_present), (0, 3));
        assert_eq!(g.head(), 3);
    }

    #[test]
    fn a_join_over_a_limit_is_refused_live_and_in_replay_alike() {
        let f = Fixture::new(1);
        f.replay(EntryKind::CreateGroup, 5, &[]);
        let g = f.group(5).unwrap();
        let join = |user, mode| {
            let mut b = Vec::new();
            body::encode_join(&mut b, user, 0);
            let e = Entry {
                kind: EntryKind::Join,
                group_id: 5,
                body: &b,
            };
            match entry(&f.st(), &e, Some(&g), mode, 1, None).unwrap() {
                Applied::Op(r) => r,
                other => panic!("{other:?}"),
            }
        };
        for mode in [Mode::Live, Mode::Replay] {
            assert_eq!(join(1, mode).unwrap(), 0, "{mode:?}");
            let refused = join(2, mode).unwrap_err();
            assert!(
                matches!(
                    refused,
                    Error::LimitExceeded {
                        what: "members_per_group_max",
                        ..
                    }
                ),
                "{mode:?}: {refused}"
            );
            leave(&f.cursors, &g, 1).unwrap();
        }
    }

    #[test]
    fn a_cursor_row_never_lowers_a_cursor_nor_lifts_it_above_the_head() {
        let f = Fixture::new(10);
        f.replay(EntryKind::CreateGroup, 5, &[]);
        for id in 1..=4 {
            f.replay(EntryKind::Records, 5, &rec(id));
        }
        let mut b = Vec::new();
        body::encode_join(&mut b, 9, 2);
        f.replay(EntryKind::Join, 5, &b);
        let g = f.group(5).unwrap();
        let cursor = || f.cursors.get(9, g.slot).unwrap().cursor;
        let mut rows = Vec::new();
        body::encode_cursors(&mut rows, &[(9, 1)]);
        f.replay(EntryKind::Cursors, 5, &rows);
        assert_eq!(cursor(), 2);
        rows.clear();
        body::encode_cursors(&mut rows, &[(9, 99)]);
        f.replay(EntryKind::Cursors, 5, &rows);
        assert_eq!(cursor(), 4);
    }

    #[test]
    fn replay_skips_the_frames_a_checkpointed_record_reflects_and_tracks_what_changed() {
        let f = Fixture::new(10);
        f.replay(EntryKind::CreateGroup, 5, &[]);
        let g = f.group(5).unwrap();
        let at = |lsn, kind, body: &[u8]| {
            let e = Entry {
                kind,
                group_id: 5,
                body,
            };
            entry(&f.st(), &e, Some(&g), Mode::Replay, lsn, None).unwrap()
        };
        let mut join9 = Vec::new();
        body::encode_join(&mut join9, 9, 0);
        // Frame 10: a record and a join, both applied, then the frame is done.
        assert!(matches!(
            at(10, EntryKind::Records, &rec(1)),
            Applied::Records(_)
        ));
        assert!(matches!(
            at(10, EntryKind::Join, &join9),
            Applied::Op(Ok(0))
        ));
        frame_done(&f.st(), &g, 10);
        assert_eq!(g.ckpt(&f.ctx.dirty).applied_lsn(), 10);
        // Frames at or below the group's applied_lsn are reflected already.
        assert!(matches!(
            at(10, EntryKind::Records, &rec(2)),
            Applied::Reflected
        ));
        assert!(matches!(
            at(7, EntryKind::Leave, &9u64.to_le_bytes()),
            Applied::Reflected
        ));
        assert!(f.cursors.get(9, g.slot).is_some());
        assert_eq!(g.head(), 1);
        assert!(matches!(
            at(11, EntryKind::Records, &rec(2)),
            Applied::Records(_)
        ));
        let mut ck = g.ckpt(&f.ctx.dirty);
        assert!(ck.is_dirty());
        assert_eq!(ck.take_members_changed(), vec![9]);
        drop(ck);
        assert_eq!(f.ctx.dirty.take().groups.len(), 1, "on the dirty list once");
    }

    #[test]
    fn delete_removes_the_group_and_its_memberships() {
        let f = Fixture::new(10);
        f.replay(EntryKind::CreateGroup, 5, &[]);
        let mut b = Vec::new();
        body::encode_join(&mut b, 9, 0);
        f.replay(EntryKind::Join, 5, &b);
        let slot = f.group(5).unwrap().slot;
        f.replay(EntryKind::DeleteGroup, 5, &[]);
        assert!(f.group(5).is_none());
        assert!(f.cursors.get(9, slot).is_none());
        assert!(!f.ctx.vfs.exists(&f.ctx.group_dir(5)));
        assert!(matches!(
            f.replay(EntryKind::Leave, 5, &9u64.to_le_bytes()),
            Applied::Orphan
        ));
    }
}
