//! The receiver's duplicate filter: one high-water mark per group.
//!
//! A message can reach a client more than once: pushed, then pulled again
//! because the cursor had not moved yet; pushed again on a new connection
//! after a reconnect; pulled again because the ACK of an earlier page was
//! lost with its connection, or forgotten by a node crash. The filter makes
//! each `msg_id` reach the application once.
//!
//! Why one number per group is enough: a group's ids are dense (1, 2, 3, …)
//! and the node delivers them in ascending order per group (a PULL returns
//! consecutive ids from `cursor + 1`; PUSHes of a group arrive in `msg_id`
//! order). The filter only accepts a message that extends what it accepted
//! before by exactly one id (or, from a pull, continues from the cursor), so
//! the accepted ids of a group are always the range `(start, mark]`: "seen"
//! is `msg_id <= mark`. A push that does not extend the mark (a gap: pushes
//! were dropped, or this is the first contact with the group) is not
//! accepted; the caller pulls the group, and pull is the truth.
//!
//! The marks are the whole dedup state: an application that restarts and
//! wants exactly-once across the restart persists [`DedupFilter::marks`]
//! with what it processed and starts again with [`DedupFilter::with_marks`].

use std::collections::{BTreeMap, HashMap};

/// What to do with a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not seen before: deliver it (the mark has moved to it).
    New,
    /// At or below the mark: drop it.
    Duplicate,
    /// A pushed message that does not follow the mark (or the group has no
    /// mark yet): not accepted; pull the group from its cursor.
    Gap,
}

#[derive(Clone, Debug, Default)]
pub struct DedupFilter {
    marks: HashMap<u64, u64>,
}

impl DedupFilter {
    pub fn new() -> DedupFilter {
        DedupFilter::default()
    }

    /// A filter that has already seen, per group, every id up to the mark.
    pub fn with_marks(marks: impl IntoIterator<Item = (u64, u64)>) -> DedupFilter {
        DedupFilter {
            marks: marks.into_iter().collect(),
        }
    }

    /// The highest id accepted in `group`, if any contact happened.
    pub fn mark(&self, group: u64) -> Option<u64> {
        self.marks.get(&group).copied()
    }

    /// Every group's mark, ascending by group (what an application persists).
    pub fn marks(&self) -> BTreeMap<u64, u64> {
        self.marks.iter().map(|(&g, &m)| (g, m)).collect()
    }

    /// A PULL (or UNREAD) reported the member's cursor: every id at or below
    /// it was acknowledged (by this client, an earlier run, or another
    /// device) and is never delivered again. Raises the mark to it.
    pub fn observe_cursor(&mut self, group: u64, cursor: u64) {
        let mark = self.marks.entry(group).or_insert(cursor);
        *mark = (*mark).max(cursor);
    }

    /// A message from a PULL page (consecutive ids from `cursor + 1`; call
    /// [`observe_cursor`](Self::observe_cursor) with the page's cursor first).
    pub fn pulled(&mut self, group: u64, msg_id: u64) -> Verdict {
        let mark = self.marks.entry(group).or_insert(0);
        if msg_id <= *mark {
            Verdict::Duplicate
        } else {
            // Pull is the truth: the node returns what is above the cursor,
            // which is at most `mark + 1` once the cursor was observed.
            *mark = msg_id;
            Verdict::New
        }
    }

    /// A message from a PUSH.
    pub fn pushed(&mut self, group: u64, msg_id: u64) -> Verdict {
        match self.marks.get_mut(&group) {
            None => Verdict::Gap,
            Some(mark) if msg_id <= *mark => Verdict::Duplicate,
            Some(mark) if msg_id == *mark + 1 => {
                *mark = msg_id;
                Verdict::New
            }
            Some(_) => Verdict::Gap,
        }
    }

    /// Forgets a group (the member left it, or it was deleted).
    pub fn forget(&mut self, group: u64) {
        self.marks.remove(&group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_then_pull_of_the_same_ids_delivers_once() {
        let mut f = DedupFilter::new();
        f.observe_cursor(7, 0);
        assert_eq!(f.pushed(7, 1), Verdict::New);
        assert_eq!(f.pushed(7, 2), Verdict::New);
        // The cursor has not moved: the pull returns 1..=3.
        f.observe_cursor(7, 0);
        let v: Vec<_> = (1..=3).map(|id| f.pulled(7, id)).collect();
        assert_eq!(v, [Verdict::Duplicate, Verdict::Duplicate, Verdict::New]);
        // A push of 3 arriving after the pull (same message) is dropped.
        assert_eq!(f.pushed(7, 3), Verdict::Duplicate);
        assert_eq!(f.mark(7), Some(3));
    }

    #[test]
    fn a_push_that_skips_ids_or_opens_a_group_asks_for_a_pull() {
        let mut f = DedupFilter::new();
        assert_eq!(f.pushed(1, 5), Verdict::Gap, "no mark yet");
        assert_eq!(f.mark(1), None, "a gap accepts nothing");
        f.observe_cursor(1, 4);
        assert_eq!(f.pushed(1, 5), Verdict::New);
        assert_eq!(f.pushed(1, 7), Verdict::Gap, "6 was dropped");
        assert_eq!(f.mark(1), Some(5));
    }

    #[test]
    fn a_cursor_moved_by_another_device_raises_the_mark_never_lowers_it() {
        let mut f = DedupFilter::with_marks([(2, 10)]);
        f.observe_cursor(2, 4);
        assert_eq!(f.mark(2), Some(10));
        f.observe_cursor(2, 20);
        assert_eq!(f.mark(2), Some(20));
        assert_eq!(f.pulled(2, 20), Verdict::Duplicate);
        assert_eq!(f.pulled(2, 21), Verdict::New);
    }

    #[test]
    fn marks_round_trip_for_a_restarting_application() {
        let mut f = DedupFilter::new();
        f.observe_cursor(3, 0);
        for id in 1..=4 {
            f.pulled(3, id);
        }
        let mut g = DedupFilter::with_marks(f.marks());
        g.observe_cursor(3, 2); // the last ACK was lost: the node re-sends 3, 4
        assert_eq!(g.pulled(3, 3), Verdict::Duplicate);
        assert_eq!(g.pulled(3, 4), Verdict::Duplicate);
        assert_eq!(g.pulled(3, 5), Verdict::New);
    }
}
