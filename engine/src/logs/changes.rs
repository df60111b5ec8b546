//! A group's *quiet ids*: the msg_ids of its log that never count as
//! unread (format-spec/storage.md section 3 "Edits and recalls", protocol.md
//! 4.28): every Edit and Recall record's own id, and every message a Recall
//! names (recalling a message a member has not read lowers that member's
//! unread count).
//!
//! Representation: a sorted `Vec<u64>` without duplicates, boxed in the
//! group's rarely used extras (`group.rs`), so only a group that ever had
//! an edit or a recall pays memory (8 bytes an id). Unread of a member is
//! `(head - cursor) - |{ q : cursor < q <= head }|`: two binary searches,
//! so UNREAD stays O(groups of the user) (times a log of the set for the
//! groups that have one).
//!
//! Invariants:
//! - the set is exactly the quiet ids of the records `apply` applied above
//!   the trim point (below, see [`QuietIds::trim`]); inserting is
//!   idempotent, so a frame applied again (replay of a fuzzy capture, a
//!   round retried after a full disk) changes nothing;
//! - it is changed only by `apply` (commit thread, replay), by retention
//!   (the checkpointer, under the group's checkpoint lock) and by recovery
//!   (from the checkpoint), so a capture under that lock sees the set that
//!   matches its `applied_lsn`.
//!
//! Persistence: a checkpoint stores the set in the group record (storage.md
//! 6.1, GroupPut bit 4); replay of the journal after it adds the ids of the
//! records it applies. Nothing else is read at open.
//!
//! Trimming: retention drops ids that can no longer count for anyone:
//! those at or below both the lowest cursor of the group's members and the
//! new floor minus one (a member that joins later starts at or above
//! `floor - 1`). Exact: an id at or below every cursor is above none.
//!
//! Beside them, the group's **latest edits**: for every message an Edit
//! names (and no Recall does), the id of its newest Edit, sorted by the
//! message's id: what HISTORY_LATEST (protocol.md 4.30) shows a message
//! with, found by one binary search. Stored with the quiet ids (GroupPut
//! bit 5), rebuilt the same way, trimmed by retention below the floor (a
//! message retention dropped is shown to no one).
//!
//! Costs: an insert is a binary search and a shift (recalls name older ids,
//! edits are appended); a count is two binary searches.

use crate::logs::record::{KIND_EDIT, KIND_RECALL};

/// See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuietIds {
    ids: Vec<u64>,
    /// `(message, its newest Edit)`, ascending by message; no recalled
    /// message.
    edits: Vec<(u64, u64)>,
}

impl QuietIds {
    /// From ids stored by a checkpoint (sorted, distinct: checked by the
    /// run decoder).
    pub fn from_sorted(ids: Vec<u64>, edits: Vec<(u64, u64)>) -> QuietIds {
        debug_assert!(ids.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(edits.windows(2).all(|w| w[0].0 < w[1].0));
        QuietIds { ids, edits }
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.edits.is_empty()
    }

    pub fn edits(&self) -> &[(u64, u64)] {
        &self.edits
    }

    /// The newest Edit of message `id`, unless it was recalled.
    pub fn latest_edit(&self, id: u64) -> Option<u64> {
        let at = self.edits.binary_search_by_key(&id, |e| e.0).ok()?;
        Some(self.edits[at].1)
    }

    pub fn ids(&self) -> &[u64] {
        &self.ids
    }

    pub fn contains(&self, id: u64) -> bool {
        self.ids.binary_search(&id).is_ok()
    }

    fn insert(&mut self, id: u64) {
        if let Err(at) = self.ids.binary_search(&id) {
            self.ids.insert(at, id);
        }
    }

    /// A record of kind `kind` (not a message) with id `msg_id` was
    /// applied: it is quiet, and a recall's target too.
    pub fn applied(&mut self, msg_id: u64, kind: u8, target: Option<u64>) {
        self.insert(msg_id);
        let Some(t) = target else { return };
        let at = self.edits.binary_search_by_key(&t, |e| e.0);
        if kind == KIND_RECALL {
            self.insert(t);
            // A recall is final: the message's edits no longer matter.
            if let Ok(at) = at {
                self.edits.remove(at);
            }
        } else if kind == KIND_EDIT && !self.contains(t) {
            match at {
                Ok(at) => self.edits[at].1 = self.edits[at].1.max(msg_id),
                Err(at) => self.edits.insert(at, (t, msg_id)),
            }
        }
    }

    /// Quiet ids in `cursor + 1 ..= head`: what a member at `cursor` does
    /// not count as unread.
    pub fn count_in(&self, cursor: u64, head: u64) -> u64 {
        if head <= cursor {
            return 0;
        }
        let hi = self.ids.partition_point(|&q| q <= head);
        let lo = self.ids.partition_point(|&q| q <= cursor);
        (hi - lo) as u64
    }

    /// Drops the ids at or below `up_to` (module docs say which bound the
    /// caller passes). Returns how many went.
    /// Also drops the latest edits of the messages below `floor`.
    pub fn trim(&mut self, up_to: u64, floor: u64) -> usize {
        let n = self.ids.partition_point(|&q| q <= up_to);
        self.ids.drain(..n);
        let e = self.edits.partition_point(|&(t, _)| t < floor);
        self.edits.drain(..e);
        n + e
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_cursor_and_head_and_inserts_are_idempotent() {
        let mut q = QuietIds::default();
        q.applied(5, KIND_EDIT, Some(2));
        q.applied(7, KIND_RECALL, Some(3));
        q.applied(7, KIND_RECALL, Some(3));
        assert_eq!(q.ids(), &[3, 5, 7]);
        assert_eq!(q.count_in(0, 10), 3);
        assert_eq!(q.count_in(3, 10), 2);
        assert_eq!(q.count_in(0, 6), 2);
        assert_eq!(q.count_in(7, 10), 0);
        assert_eq!(q.count_in(9, 4), 0);
        // 5 edited 2 (kept); 7 recalled 3.
        assert_eq!(q.latest_edit(2), Some(5));
        q.applied(8, KIND_EDIT, Some(2));
        q.applied(9, KIND_EDIT, Some(3));
        assert_eq!((q.latest_edit(2), q.latest_edit(3)), (Some(8), None));
        q.applied(10, KIND_RECALL, Some(2));
        assert_eq!(q.latest_edit(2), None, "a recall is final");
        assert_eq!(q.trim(4, 3), 2);
        assert_eq!(q.ids(), &[5, 7, 8, 9, 10]);
    }
}
