//! What changed since the last checkpoint capture, tracked as it changes,
//! so a checkpoint visits only what changed (format-spec/storage.md
//! section 9, "Checkpoint", step K2), never every group or membership.
//!
//! Representation: per group one word (the lsn of the last journal frame
//! applied to it, a dirty flag, a captured-once flag) and a one-byte lock
//! ([`Group::ckpt`] gives a [`CkptGuard`]); node-wide, a [`DirtyList`] of
//! the groups whose flag went up, of the ids of deleted groups, and by
//! slot the users whose membership changed (join, leave) or whose cursor
//! moved since the last capture (present only while non-empty, so an idle
//! group pays 9 bytes).
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
//!
//! The list is generic over what it lists (`Group`, `group.rs`), which
//! keeps its word and lock and takes a [`CkptGuard`] through
//! [`DirtyList::guard`]: the applier marks groups here and the
//! checkpointer (`state/`) takes them, and this module imports neither.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};

/// Users whose membership changed (join, leave) or whose cursor's
/// checkpoint bit went up since the last capture (duplicates allowed).
#[derive(Debug, Default)]
struct Changed {
    members: Vec<u64>,
    cursors: Vec<u64>,
}

const LSN_MASK: u64 = crate::commit::journal::LSN_MAX;
const DIRTY: u64 = 1 << 62;
const CAPTURED_ONCE: u64 = 1 << 63;

/// A group's checkpoint bookkeeping, held while the group's checkpoint
/// lock is (`Group::ckpt`). In the group itself: one word (the applied
/// lsn, below 2^62, and two flags) and a one-byte lock; the lists of
/// changed users live in the [`DirtyList`]'s map by slot while non-empty.
pub struct CkptGuard<'a> {
    /// The group's word.
    word: &'a AtomicU64,
    /// The group's slot: the key of its changed users.
    slot: u32,
    /// The group's address, to check that a mark names this group.
    owner: usize,
    changed: &'a Mutex<HashMap<u32, Changed>>,
    _lock: MutexGuard<'a, ()>,
}

impl CkptGuard<'_> {
    fn word(&self) -> u64 {
        self.word.load(Ordering::Relaxed)
    }

    fn set_word(&self, w: u64) {
        self.word.store(w, Ordering::Relaxed);
    }

    /// The lsn of the last journal frame whose entries for this group were
    /// all applied: what its next captured record reflects.
    pub fn applied_lsn(&self) -> u64 {
        self.word() & LSN_MASK
    }

    pub fn set_applied_lsn(&mut self, lsn: u64) {
        debug_assert!(lsn <= LSN_MASK, "lsn {lsn} beyond 2^62");
        self.set_word(self.word() & !LSN_MASK | lsn.min(LSN_MASK));
    }

    /// On the dirty list since the last capture.
    pub fn is_dirty(&self) -> bool {
        self.word() & DIRTY != 0
    }

    fn set_dirty(&mut self) {
        self.set_word(self.word() | DIRTY);
    }

    /// A capture took the group: off the dirty list.
    pub fn clear_dirty(&mut self) {
        self.set_word(self.word() & !DIRTY);
    }

    /// Marks this incarnation recorded; returns whether it was before (its
    /// first record is written `fresh`).
    pub fn capture_once(&mut self) -> bool {
        let w = self.word();
        self.set_word(w | CAPTURED_ONCE);
        w & CAPTURED_ONCE != 0
    }

    pub fn member_changed(&mut self, user: u64) {
        let mut m = self.changed.lock();
        m.entry(self.slot).or_default().members.push(user);
    }

    pub fn cursor_moved(&mut self, user: u64) {
        let mut m = self.changed.lock();
        m.entry(self.slot).or_default().cursors.push(user);
    }

    /// Whether `user`'s membership changed since the last capture.
    pub fn member_changed_since(&self, user: u64) -> bool {
        let m = self.changed.lock();
        m.get(&self.slot).is_some_and(|c| c.members.contains(&user))
    }

    pub fn take_members_changed(&mut self) -> Vec<u64> {
        self.take(|c| &mut c.members)
    }

    pub fn take_cursors_moved(&mut self) -> Vec<u64> {
        self.take(|c| &mut c.cursors)
    }

    /// Forgets the lists (the group is deleted; its slot may be reused).
    pub fn forget_changes(&mut self) {
        self.changed.lock().remove(&self.slot);
    }

    fn take(&mut self, list: impl Fn(&mut Changed) -> &mut Vec<u64>) -> Vec<u64> {
        let mut m = self.changed.lock();
        let Some(c) = m.get_mut(&self.slot) else {
            return Vec::new();
        };
        let v = std::mem::take(list(c));
        if c.members.is_empty() && c.cursors.is_empty() {
            m.remove(&self.slot);
            // Given back after a capture of many groups.
            if m.is_empty() && m.capacity() > 1024 {
                *m = HashMap::new();
            }
        }
        v
    }
}

struct Lists<G> {
    groups: Vec<Arc<G>>,
    deleted: Vec<u64>,
    damaged: Vec<u64>,
}

impl<G> Default for Lists<G> {
    fn default() -> Self {
        Lists {
            groups: Vec::new(),
            deleted: Vec::new(),
            damaged: Vec::new(),
        }
    }
}

/// The groups that changed and the groups deleted since the last capture,
/// and the changed users of each group by slot.
pub struct DirtyList<G> {
    lists: Mutex<Lists<G>>,
    changed: Mutex<HashMap<u32, Changed>>,
}

impl<G> Default for DirtyList<G> {
    fn default() -> Self {
        DirtyList {
            lists: Mutex::default(),
            changed: Mutex::default(),
        }
    }
}

/// What one capture takes.
pub struct Taken<G> {
    pub groups: Vec<Arc<G>>,
    pub deleted: Vec<u64>,
    /// Groups found damaged when first loaded (no entry changed them).
    pub damaged: Vec<u64>,
}

impl<G> DirtyList<G> {
    /// The checkpoint state of `group`, whose word, slot and held `ckpt`
    /// lock these are.
    pub fn guard<'a>(
        &'a self,
        group: &'a G,
        word: &'a AtomicU64,
        slot: u32,
        lock: MutexGuard<'a, ()>,
    ) -> CkptGuard<'a> {
        CkptGuard {
            word,
            slot,
            owner: group as *const G as usize,
            changed: &self.changed,
            _lock: lock,
        }
    }

    /// Puts `group` on the list unless it is there; `st` is its locked
    /// `ckpt` state.
    pub fn mark(&self, group: &Arc<G>, st: &mut CkptGuard<'_>) {
        debug_assert_eq!(
            Arc::as_ptr(group) as usize,
            st.owner,
            "the guard of another group"
        );
        if !st.is_dirty() {
            st.set_dirty();
            self.lists.lock().groups.push(group.clone());
        }
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
    pub fn take(&self) -> Taken<G> {
        let mut l = self.lists.lock();
        Taken {
            groups: std::mem::take(&mut l.groups),
            deleted: std::mem::take(&mut l.deleted),
            damaged: std::mem::take(&mut l.damaged),
        }
    }

    /// Puts groups a capture could not take back on the list (their flags
    /// are still set).
    pub fn put_back(&self, groups: Vec<Arc<G>>) {
        self.lists.lock().groups.extend(groups);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{Group, LogSlot};

    #[test]
    fn the_lists_live_only_while_a_group_has_changes() {
        let dirty = DirtyList::<Group>::default();
        let g = Arc::new(Group::new(5, 3, LogSlot::damaged("x".into())));
        let mut st = g.ckpt(&dirty);
        st.member_changed(3);
        st.cursor_moved(4);
        assert!(st.member_changed_since(3) && !st.member_changed_since(4));
        assert_eq!(st.take_members_changed(), vec![3]);
        assert_eq!(st.take_cursors_moved(), vec![4]);
        assert!(dirty.changed.lock().is_empty(), "freed once empty");
        assert!(!st.capture_once());
        assert!(st.capture_once());
        st.set_applied_lsn(77);
        dirty.mark(&g, &mut st);
        dirty.mark(&g, &mut st);
        assert!(st.is_dirty());
        assert_eq!(st.applied_lsn(), 77);
        drop(st);
        assert_eq!(dirty.take().groups.len(), 1, "listed once");
    }
}
