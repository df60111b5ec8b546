//! What changed since the last checkpoint capture, tracked as it changes,
//! so a checkpoint visits only what changed (format-spec/storage.md
//! section 9, "Checkpoint", step K2), never every group or membership.
//!
//! Representation: per group a [`CkptState`] behind the group's `ckpt`
//! mutex: the lsn of the last journal entry applied to it, a dirty flag,
//! and the users whose membership changed (join, leave) or whose cursor
//! moved since the last capture. Node-wide, a [`DirtyList`] of the groups
//! whose flag went up and of the ids of deleted groups.
//!
//! Invariants:
//! - a group is on the dirty list exactly while its flag is set (pushed
//!   when the flag goes up, both under its `ckpt` lock; the capture takes
//!   the list and clears each flag under that lock);
//! - every change to a group's state that a checkpoint records is made
//!   under its `ckpt` lock, together with `applied_lsn` (the applier), or
//!   only moves a cursor (an ACK, which queues the user when the cursor's
//!   checkpoint bit goes up, `cursors.rs`), so a capture under that lock
//!   sees the group exactly as of `applied_lsn` and a fuzzy checkpoint is
//!   made exact at replay by skipping entries at or below it.
//!
//! Lock order: `group.ckpt` -> `catalog` -> the group's other locks ->
//! cursor-table shard -> the dirty list. Costs: O(1) per change (a flag
//! test, at most one push per group and per membership per capture).

use std::sync::Arc;

use parking_lot::Mutex;

use crate::group::Group;

/// A group's checkpoint bookkeeping; behind `Group::ckpt`.
#[derive(Debug, Default)]
pub struct CkptState {
    /// Position (`commit::lsn`) of the last journal entry applied to the
    /// group: what its next captured record reflects.
    pub applied_lsn: u64,
    /// On the dirty list since the last capture.
    pub dirty: bool,
    /// A capture recorded this incarnation of the group already (its
    /// first record is written `fresh`).
    pub captured_once: bool,
    /// Users who joined or left since the last capture (duplicates allowed).
    pub members_changed: Vec<u64>,
    /// Users whose cursor's checkpoint bit went up since the last capture.
    pub cursors_moved: Vec<u64>,
}

#[derive(Default)]
struct Lists {
    groups: Vec<Arc<Group>>,
    deleted: Vec<u64>,
    damaged: Vec<u64>,
}

/// The groups that changed and the groups deleted since the last capture.
#[derive(Default)]
pub struct DirtyList {
    lists: Mutex<Lists>,
}

/// What one capture takes.
#[derive(Default)]
pub struct Taken {
    pub groups: Vec<Arc<Group>>,
    pub deleted: Vec<u64>,
    /// Groups found damaged when first loaded (no entry changed them).
    pub damaged: Vec<u64>,
}

impl DirtyList {
    /// Puts `group` on the list unless it is there; `st` is its locked
    /// `ckpt` state.
    pub fn mark(&self, group: &Arc<Group>, st: &mut CkptState) {
        if !st.dirty {
            st.dirty = true;
            self.lists.lock().groups.push(group.clone());
        }
    }

    /// A queued cursor move of `user` in `group` (its checkpoint bit went
    /// up): takes the group's `ckpt` lock.
    pub fn cursor_moved(&self, group: &Arc<Group>, user: u64) {
        let mut st = group.ckpt.lock();
        st.cursors_moved.push(user);
        self.mark(group, &mut st);
    }

    /// A group was deleted: its next capture writes a tombstone.
    pub fn deleted(&self, id: u64) {
        self.lists.lock().deleted.push(id);
    }

    /// A group was found damaged when its log was loaded: the next capture
    /// records it (the caller may hold any of the group's locks).
    pub fn damaged(&self, id: u64) {
        self.lists.lock().damaged.push(id);
    }

    /// Groups on the list now (for the checkpoint trigger).
    pub fn groups(&self) -> usize {
        self.lists.lock().groups.len()
    }

    /// Whether anything changed since the last capture.
    pub fn is_empty(&self) -> bool {
        let l = self.lists.lock();
        l.groups.is_empty() && l.deleted.is_empty() && l.damaged.is_empty()
    }

    /// Takes both lists (checkpoint step K1): O(1).
    pub fn take(&self) -> Taken {
        let mut l = self.lists.lock();
        Taken {
            groups: std::mem::take(&mut l.groups),
            deleted: std::mem::take(&mut l.deleted),
            damaged: std::mem::take(&mut l.damaged),
        }
    }

    /// Puts groups a capture could not take back on the list (their flags
    /// are still set).
    pub fn put_back(&self, groups: Vec<Arc<Group>>) {
        self.lists.lock().groups.extend(groups);
    }
}
