//! The intake of edits and recalls among records a group takes from
//! outside its own appends: replayed or replicated rounds (`apply.rs`) and
//! the records a promotion left that a small group adopts at open
//! (`small_log.rs`). Its own module so that both call one function
//! without importing each other.

use crate::commit::context::Context;
use crate::group::{Group, LogSlot};

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
