//! A small group's log in the shared journal (storage v2 step S5, design
//! sections 3.1 and 4): its reads, its damage, and the live bytes of its
//! extents. Applying a round's records to it and its promotion to segment
//! files are the applier's (`apply.rs`, `small_records`); its form in a
//! checkpoint is `state::SmallRecord`.
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
//! back small; replay promotes it again at the same entry, and the
//! promotion moves the stale directory to the trash first. When a power
//! cut took that entry (fsync `never` or `interval`) while the segment's
//! pages reached the disk, the segment holds acknowledged ids past the
//! group's head: recovery judges the files (`logs/promotion_left.rs`) and
//! the group adopts them ([`take_in_promotion_left`]), so no id is given
//! twice.
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

use crate::commit::context::Context;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::logs::extents::{Extent, ExtentList};
use crate::logs::group_log::{LoadReport, LogContext, LogState, ReadBatch};
use crate::logs::promotion_left::{self, Left};
use crate::logs::small_read;

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
pub(crate) fn damage(ctx: &Context, group: &Group, reason: String) {
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

/// Accounts the extents of a small group restored from a checkpoint.
pub(crate) fn restore_live(ctx: &LogContext, list: &ExtentList) {
    let mut live = ctx.live.lock();
    for ext in list.extents() {
        live.add(ext);
    }
}

/// [`cut_past_journal_ends`] under the group's checkpoint lock, marking it
/// dirty when something was cut: why its records were cut, if they were.
/// Recovery calls it for every registered group; a background load
/// (`state/lazy.rs`) for each group it registers.
pub(crate) fn cut_and_mark_past_journal_ends(
    ctx: &Context,
    g: &Arc<Group>,
    ends: &[(u64, u64)],
) -> Option<String> {
    let mut ck = g.ckpt(&ctx.dirty);
    let lost = cut_past_journal_ends(ctx, g, ends)?;
    ctx.dirty.mark(g, &mut ck);
    Some(format!(
        "records {}..={} were in journal bytes a power cut lost (fsync policy never or \
         interval)",
        lost.start(),
        lost.end()
    ))
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

/// Recovery, for a small group whose directory exists (after replay, and
/// when replay meets a gap in its ids): the segment files a promotion left
/// (storage.md section 10, S1) are judged against the group's records
/// (`promotion_left::judge`). Files that hold the group's records up to
/// its head and more after it become its log (their torn tails cut, the
/// directory to be synced by the next checkpoint with its parents, the
/// quiet ids of the records taken in), replacing its extents: returns what
/// loading them found. Files that prove nothing past the head go to the
/// trash; files that are not its promotion's (a deleted incarnation's)
/// are left to its next promotion. Each is logged. Damage found in the
/// group's own records while comparing damages it, as its first read
/// would. `journal_lost`: the journal may have lost records
/// (`promotion_left::judge`). The caller holds the group's checkpoint lock
/// and marks it dirty when something was adopted.
pub(crate) fn take_in_promotion_left(
    ctx: &Context,
    group: &Group,
    journal_lost: bool,
) -> Result<Option<LoadReport>> {
    let list = match &*group.log.read() {
        LogSlot::Small(list) => list.clone(),
        _ => return Ok(None),
    };
    let left = match promotion_left::judge(ctx, group.id, &list, journal_lost) {
        Ok(Some(left)) => left,
        Ok(None) => return Ok(None),
        Err(e @ Error::Corrupt { .. }) => {
            let reason = format!(
                "its records could not be compared with the segment files a promotion left: {e}"
            );
            damage(ctx, group, reason);
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let (path, offset) = left.place();
    let finding = format!("{} offset {offset}: {}", path.display(), left.describe());
    log::warn!("group {}: {finding}", group.id);
    let Left::Leads {
        mut log,
        load,
        head,
        ..
    } = left
    else {
        if let Left::Moot { dir } = &left {
            ctx.trash.put(&*ctx.vfs, group.id, dir)?;
        }
        return Ok(None);
    };
    log.cut_tails(ctx, &load.cuts)?;
    log.files_not_known_durable();
    let adopted = log.read(ctx, head, usize::MAX, usize::MAX)?;
    {
        let mut slot = group.log.write();
        let before = slot.stored_messages();
        if let LogSlot::Small(now) = &*slot {
            forget_extents(ctx, now);
        }
        group.publish_head(log.head());
        *slot = LogSlot::Loaded(log);
        ctx.stored_changed(before, slot.stored_messages());
    }
    // Nothing is served yet: the edits and recalls among the adopted
    // records count as quiet, and recalled payloads in the segments go on
    // the erase list, as if the lost entries had been replayed.
    crate::commit::change_intake::take_in_read(ctx, group, &adopted);
    Ok(Some(load))
}
