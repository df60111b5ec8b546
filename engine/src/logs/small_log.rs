//! A small group's log in the shared journal (storage v2 step S5, design
//! sections 3.1 and 4): applying a round's records to it, its promotion to
//! segment files, its reads, and its form in a checkpoint.
//!
//! A group starts small ([`LogSlot::Small`]): its records stay where the
//! commit thread wrote them, inside the Records entries of the journal
//! files, and its [`ExtentList`] says where. The commit thread (or replay)
//! applying a Records entry appends one extent per entry (merged with the
//! previous one when adjacent) while the group's bytes stay within
//! `small_group_bytes_max`. The entry that would take it past the
//! threshold *promotes* it instead: the group's records so far, read back
//! from the journal (every CRC checked), and the entry's records go to a
//! new segment file through [`GroupLog::append`], and the slot becomes
//! `Loaded`. A threshold of 0 promotes at the first record (0.1's layout
//! for every group that holds a record).
//!
//! The promotion runs on the applying thread, synchronously, unlike the
//! worker job design section 4 proposed: it costs one mkdir, one file
//! creation and at most `small_group_bytes_max` plus one round of the
//! group's records read from the page cache and written (no fsync: the
//! checkpoint that first records the group segmented syncs the file and
//! its directories, K3), once per group. Doing it in place needs no
//! catch-up loop and no switch between rounds (design P4, P5), and no
//! group is ever half promoted. The switch is durable only through a
//! checkpoint (design 4.1): until a stored manifest records the group
//! segmented, every kept manifest records it small, the journal files its
//! extents name stay (they are pinned, `pins.rs`), and a crash brings it
//! back small; the next promotion moves the stale directory to the trash.
//!
//! Invariants:
//! - only the applying thread appends to a small slot, promotes it or
//!   deletes it (deletion is applied there too); a rewrite (`rewrite.rs`,
//!   checkpointer thread) only moves extents, gated; readers copy the list
//!   under the slot's read lock and read the files after it;
//! - every extent of every small slot is counted in `LogContext::live`
//!   (A1 of `reclaim.rs`), and nothing else is;
//! - a small group's bytes stay at most `small_group_bytes_max`.
//!
//! Costs: an append is O(extents of the group) in memory; a read walks the
//! extents it serves (`small_read.rs`); a promotion is bounded as above.

use std::sync::Arc;

use crate::commit::apply::{self, BodyAt, Mode, RecordsApplied};
use crate::commit::dirty::CkptGuard;
use crate::commit::journal::body;
use crate::error::Result;
use crate::group::{Group, LogSlot};
use crate::logs::extents::{Extent, ExtentList, FileId};
use crate::logs::group_log::{GroupLog, LogContext, LogState, ReadBatch};
use crate::logs::record;
use crate::logs::small_read;
use crate::state::SmallRecord;

/// Applies a Records body (`run`, whose bytes lie at `at` in the journal,
/// if they do) to `group`, whose `ckpt` lock the caller holds, if its slot
/// is small: the records go into its
/// extent list, or the group is promoted. `None` if the slot is not small
/// (the caller appends to the segment log).
pub(crate) fn apply_records(
    st: &apply::State<'_>,
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
        damage(st.ctx, group, reason);
        return Ok(Some(done));
    }
    let first = record::peek_msg_id(run);
    let above = record::records_above(run, head);
    done.already_present = apply::count_records(&run[..run.len() - above.len()]);
    if above.is_empty() {
        done.held = Some((first, head));
        return Ok(Some(done));
    }
    let next = record::peek_msg_id(above);
    if next != head + 1 {
        debug_assert_eq!(mode, Mode::Replay, "live records continue the head");
        let reason =
            format!("journal frame lsn {lsn} holds msg_id {next} but the log ends at {head}");
        damage(st.ctx, group, reason);
        return Ok(Some(done));
    }
    let count = apply::count_records(above);
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
                    forget_extents(ctx, now);
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
                damage(st.ctx, group, format!("its promotion failed: {e}"));
                return Ok(Some(done));
            }
        }
    }
    if mode == Mode::Live {
        apply::advance_caught_up_senders(st.cursors, group, ck, run);
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
    // taken in before (`apply::records`), so a recall in `more` counts.
    // A copy of the records only in a group with quiet ids.
    let erase = !group.quiet_between(floor, u64::MAX).is_empty();
    for bytes in old.batch.chunks.iter().map(|c| c.bytes()).chain([more]) {
        if erase {
            let mut copy = bytes.to_vec();
            crate::logs::rewrite::erase_recalled(group, &mut copy);
            log.append(ctx, &copy)?;
        } else {
            log.append(ctx, bytes)?;
        }
    }
    Ok(log)
}

/// Takes the extents of `list` out of the live-byte accounting (a group
/// promoted or deleted).
pub(crate) fn forget_extents(ctx: &LogContext, list: &ExtentList) {
    let mut live = ctx.live.lock();
    for ext in list.extents() {
        live.remove(ext);
    }
}

/// A small group found damaged (while applying, or by the cold-file
/// erasure, `rewrite.rs`): its slot says why, the next capture records it
/// damaged and STATS counts it (`groups_damaged`). Its extents leave the
/// accounting (no journal or cold file is deleted while a group is
/// damaged, checkpointer K7, and deleting it then names no extent). A
/// slot that is not small any more is left as it is.
pub(crate) fn damage(ctx: &LogContext, group: &Group, reason: String) {
    let mut slot = group.log.write();
    let LogSlot::Small(list) = &*slot else {
        return;
    };
    forget_extents(ctx, list);
    ctx.dirty.damaged(group.id);
    ctx.damaged_groups
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let head = slot.head();
    *slot = LogSlot::Damaged {
        state: LogState {
            head,
            segments: Vec::new(),
        },
        reason,
    };
}

/// The records of a small group above `after` (a page, as
/// `GroupLog::read`), read from its extents (copied under the slot's lock,
/// read after it); the extents the read verified are marked.
pub(crate) fn read_above(
    ctx: &LogContext,
    group: &Group,
    list: &ExtentList,
    after: u64,
    max_count: usize,
    max_bytes: usize,
) -> Result<ReadBatch> {
    let read = small_read::read_above(
        &ctx.shared_files,
        group.id,
        list,
        after,
        max_count as u64,
        max_bytes,
    )?;
    mark_verified(group, &read.verified);
    Ok(read.batch)
}

/// The newest records of a small group below `before` and not below
/// `lowest` (as `GroupLog::read_before`).
pub(crate) fn read_before(
    ctx: &LogContext,
    group: &Group,
    list: &ExtentList,
    before: u64,
    lowest: u64,
    max_count: usize,
    max_bytes: usize,
) -> Result<ReadBatch> {
    let read = small_read::read_before(
        &ctx.shared_files,
        group.id,
        list,
        before,
        lowest,
        max_count,
        max_bytes,
    )?;
    mark_verified(group, &read.verified);
    Ok(read.batch)
}

fn mark_verified(group: &Group, verified: &[Extent]) {
    if verified.is_empty() {
        return;
    }
    if let LogSlot::Small(list) = &mut *group.log.write() {
        for ext in verified {
            list.mark_verified(ext);
        }
    }
}

/// A small group's extents as a checkpoint records them.
pub(crate) fn to_record(list: &ExtentList) -> SmallRecord {
    SmallRecord {
        first_id: list.first_id(),
        floor: list.floor(),
        extents: list
            .extents()
            .iter()
            .map(|e| (e.file().raw(), e.offset(), e.bytes(), e.count()))
            .collect(),
    }
}

/// The extent list a checkpoint recorded, or why it cannot be one. The
/// extents are not verified: the first read of each checks its records.
pub(crate) fn from_record(rec: &SmallRecord, head: u64) -> Result<ExtentList, String> {
    let mut list = ExtentList::new(rec.first_id);
    for &(file, offset, bytes, count) in &rec.extents {
        let ext = Extent::new(FileId::from_raw(file), offset, bytes, count)
            .ok_or_else(|| format!("extent ({file}, {offset}, {bytes}, {count}) is invalid"))?;
        list.append(list.next_id(), ext);
    }
    if list.next_id() - 1 != head {
        return Err(format!(
            "extents end at msg_id {} but the head is {head}",
            list.next_id() - 1
        ));
    }
    if rec.floor < rec.first_id || rec.floor > head + 1 {
        return Err(format!("floor {} outside the extents", rec.floor));
    }
    list.trim(rec.floor, |_| {});
    Ok(list)
}

/// Accounts the extents of a small group restored from a checkpoint.
pub(crate) fn restore_live(ctx: &LogContext, list: &ExtentList) {
    let mut live = ctx.live.lock();
    for ext in list.extents() {
        live.add(ext);
    }
}

/// Recovery, after the journal's torn tails were cut: the extents a
/// checkpoint recorded for a small group may reach past the valid end of
/// a journal file written under `never` or `interval` (`ends`: each such
/// file's seq and valid length), when the power went before the file's
/// bytes were synced (a checkpoint stored by this build syncs them first,
/// checkpointer K3; an older one did not). Those records were never
/// durable under that policy, and the group's later records are lost with
/// them (the journal keeps order). The list is cut before the first such
/// extent and the head lowered to the records that remain, instead of
/// damaging the group; their ids will be given again, as for any append
/// such a power cut loses (storage.md section 1). Returns the ids lost,
/// `None` if nothing was cut. The caller holds the group's checkpoint lock
/// and marks it dirty.
pub(crate) fn cut_past_journal_ends(
    ctx: &LogContext,
    group: &Group,
    ends: &[(u64, u64)],
) -> Option<std::ops::RangeInclusive<u64>> {
    let mut slot = group.log.write();
    let LogSlot::Small(list) = &mut *slot else {
        return None;
    };
    let lost_from = list.extents().iter().position(|e| {
        e.file().kind() == crate::logs::extents::FileKind::Journal
            && ends
                .iter()
                .any(|&(seq, valid)| e.file().seq() == seq && e.end() > valid)
    })?;
    let head = list.next_id() - 1;
    let mut live = ctx.live.lock();
    if !list.truncate(lost_from, |e| live.remove(e)) {
        return None;
    }
    drop(live);
    let new_head = list.next_id() - 1;
    group.recover_head(new_head);
    Some(new_head + 1..=head)
}
