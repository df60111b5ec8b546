//! The intake of edits and recalls among records a group takes from
//! outside its own appends: replayed or replicated rounds (`apply.rs`),
//! the records a promotion left that a small group adopts at open
//! (`small_log.rs`), and the segment records past its recorded head that
//! a big group's load adopts (`Group::load_if_unloaded`, called by
//! recovery, replay and the maintenance worker). Its own module so that
//! all of them call one function without importing each other.

use crate::commit::context::Context;
use crate::error::Result;
use crate::group::{Group, LogSlot};
use crate::logs::group_log::{GroupLog, ReadBatch};

/// Takes in the edits and recalls among the records of `log` past
/// `after`: the records a load adopted past the group's recorded head
/// (storage.md section 11, step 6), whose journal entries a power cut
/// took, so no replay takes them in. Called before the log is installed
/// (the slot still unloaded: recalled payloads go on the erase list, as
/// for a loaded group). The caller holds the group's checkpoint lock.
pub(crate) fn take_in_adopted(
    ctx: &Context,
    group: &Group,
    log: &GroupLog,
    after: u64,
) -> Result<()> {
    let adopted = log.read(ctx, after, usize::MAX, usize::MAX)?;
    take_in_read(ctx, group, &adopted);
    Ok(())
}

/// [`take_in_changes`] for every chunk of a read of records adopted from
/// segment files (verified, in no journal file the open writes to).
pub(crate) fn take_in_read(ctx: &Context, group: &Group, batch: &ReadBatch) {
    for chunk in &batch.chunks {
        take_in_changes(ctx, group, chunk.bytes(), true, None);
    }
}

/// Takes in the edits and recalls of a run of the group's records (its
/// quiet ids, `changes.rs`; `verify`: the run came from a file or another
/// node) and puts the recalled payloads on the erase lists. `journal_seq` is the
/// journal file the run lies in, if it does. The caller holds the group's
/// checkpoint lock (a capture takes it too).
pub(crate) fn take_in_changes(
    ctx: &Context,
    group: &Group,
    run: &[u8],
    verify: bool,
    journal_seq: Option<u64>,
) {
    if group.changes_applied(run, verify) {
        // The journal file holding the recall (and, in it or before
        // it, the recalled payload) must go within the erasure bound.
        if let Some(seq) = journal_seq {
            ctx.erase_journal_seq
                .fetch_max(seq, std::sync::atomic::Ordering::Relaxed);
        }
        // A group with segment files: the recalled payloads are in
        // them (or in the active segment's tail), so they go on the
        // erase list the checkpointer's erasure pass works through
        // (storage.md section 3, "Erasure"). A small group's are in
        // the journal (above; its evacuation and its promotion copy
        // them erased) or in a cold file: those go on the list too,
        // and the reclaimer compacts the file (`rewrite.rs`).
        let mut targets = Vec::new();
        crate::logs::record::for_each_change(run, |_, kind, target| {
            if kind == crate::logs::record::KIND_RECALL {
                targets.extend(target);
            }
        });
        match &*group.log.read() {
            LogSlot::Loaded(_) | LogSlot::Unloaded(_) => {}
            LogSlot::Small(list) => targets.retain(|&id| {
                list.pieces().any(|p| {
                    p.first_id <= id
                        && id < p.end_id()
                        && p.ext.file().kind() == crate::logs::extents::FileKind::Cold
                })
            }),
            _ => targets.clear(),
        }
        if !targets.is_empty() {
            group.add_erase(&targets);
            ctx.erase_groups.lock().insert(group.id);
        }
    }
}
