//! The rows of one cursor flush, by group: what the commit thread takes
//! from the cursor table (`CursorTable::take_dirty_pausing`) and writes as
//! `Cursors` entries, one list of `(user, cursor)` per group slot, handed
//! out in group id order (format-spec/storage.md section 5: a frame's
//! entries are in group id order).
//!
//! Its buffers are kept from one flush to the next, as the flush queues
//! keep theirs (`cursors.rs`): a busy table's flush (W3: 100,000 rows of
//! one group every second) fills lists it already has instead of growing
//! new ones from nothing, page by page, and handing them back to the
//! allocator, which returns their pages to the system, to be faulted in
//! again by the next flush: that was half the commit thread's CPU per
//! flush (BENCHMARKS.md, "W3's p99: the flush's row lists kept").
//! A buffer is kept only while flushes use at least one in
//! `KEEP_SHARE` of it (`cursors::worth_keeping`), so what is held stays
//! proportional to the last flush: a quiet flush frees what a busy one
//! grew, and an idle table's flush holds nothing after one flush.
//!
//! Invariants: `lists[..used]` are this flush's slots, each once, in the
//! order of their first row, and `index` maps each of them to its list;
//! `lists[used..]` and every list after [`CursorRows::finish`] are empty.

use std::collections::HashMap;

use crate::members::cursors::worth_keeping;

/// The moved cursors of one flush by group slot (module docs).
#[derive(Default)]
pub(crate) struct CursorRows {
    /// `lists[..used]`: a slot and its rows, by first appearance; past
    /// `used`, empty buffers kept for the next slots.
    lists: Vec<(u32, Vec<(u64, u64)>)>,
    used: usize,
    /// Slot -> its list in `lists[..used]`.
    index: HashMap<u32, usize>,
    /// The slot of the row before and its list: a busy group's rows come
    /// in runs (its members' memberships are read shard by shard), and a
    /// row of the same slot as the one before goes to its list without
    /// hashing the slot again.
    last: Option<(u32, usize)>,
    /// `(group id, list)` of the slots whose group exists, sorted by group
    /// id ([`CursorRows::order_by_group`]).
    order: Vec<(u64, usize)>,
    /// Rows pushed since the last [`CursorRows::finish`].
    rows: usize,
    /// Rows the flush expects ([`CursorRows::expect`]).
    expected: usize,
}

impl CursorRows {
    /// The flush is about to take about `rows` rows (the flush queues'
    /// entries, `CursorTable::queued`): the first list it opens gets room
    /// for them at once, one allocation whose pages are touched once,
    /// where a list grown from nothing by doublings copies its rows and
    /// touches about twice as many pages (the flush of an ACK storm in
    /// one group: 100,000 rows). Rooms no list fills are given back by
    /// [`CursorRows::finish`]'s rule; room never written costs no memory.
    pub(crate) fn expect(&mut self, rows: usize) {
        self.expected = rows;
    }

    /// Adds `user`'s cursor in the group of `slot`.
    pub(crate) fn push(&mut self, slot: u32, user: u64, cursor: u64) {
        self.rows += 1;
        let at = match self.last {
            Some((run, at)) if run == slot => at,
            _ => {
                let at = match self.index.get(&slot) {
                    Some(&at) => at,
                    None => self.open(slot),
                };
                self.last = Some((slot, at));
                at
            }
        };
        self.lists[at].1.push((user, cursor));
    }

    /// Gives `slot` the next list (a kept buffer if there is one).
    fn open(&mut self, slot: u32) -> usize {
        let at = self.used;
        if at == self.lists.len() {
            self.lists.push((slot, Vec::new()));
        } else {
            self.lists[at].0 = slot;
        }
        if at == 0 {
            self.lists[at].1.reserve(self.expected);
        }
        self.used += 1;
        self.index.insert(slot, at);
        at
    }

    /// No row since the last [`CursorRows::finish`].
    pub(crate) fn is_empty(&self) -> bool {
        self.used == 0
    }

    /// Rows since the last [`CursorRows::finish`].
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Slots with rows since the last [`CursorRows::finish`].
    pub(crate) fn slots(&self) -> usize {
        self.used
    }

    /// Orders the slots with rows by their group's id, as `group_of`
    /// finds it (under the catalog's lock: nothing else is done there); a
    /// slot whose group is gone is left out. O(k log k) for the k slots of
    /// the flush.
    pub(crate) fn order_by_group(&mut self, mut group_of: impl FnMut(u32) -> Option<u64>) {
        self.order.clear();
        for (at, (slot, _)) in self.lists[..self.used].iter().enumerate() {
            if let Some(id) = group_of(*slot) {
                self.order.push((id, at));
            }
        }
        self.order.sort_unstable_by_key(|&(id, _)| id);
    }

    /// Calls `f(group id, rows)` for every slot that
    /// [`CursorRows::order_by_group`] ordered, in that order.
    pub(crate) fn for_each_group(&self, mut f: impl FnMut(u64, &[(u64, u64)])) {
        for &(id, at) in &self.order {
            f(id, &self.lists[at].1);
        }
    }

    /// Ends the flush: every list emptied, each buffer kept for the next
    /// flush only if this one used at least one in `KEEP_SHARE` of it
    /// (module docs); the buffers this flush did not use are freed.
    pub(crate) fn finish(&mut self) {
        self.lists.truncate(self.used);
        for (_, rows) in &mut self.lists {
            if worth_keeping(rows.len(), rows.capacity()) {
                rows.clear();
            } else {
                *rows = Vec::new();
            }
        }
        if !worth_keeping(self.used, self.lists.capacity()) {
            self.lists = Vec::new();
        }
        if !worth_keeping(self.index.len(), self.index.capacity()) {
            self.index = HashMap::new();
        }
        self.index.clear();
        if !worth_keeping(self.order.len(), self.order.capacity()) {
            self.order = Vec::new();
        }
        self.order.clear();
        self.used = 0;
        self.last = None;
        self.rows = 0;
        self.expected = 0;
    }

    /// Rows the kept buffers can hold without growing (tests).
    #[cfg(test)]
    fn kept_rows(&self) -> usize {
        self.lists.iter().map(|(_, rows)| rows.capacity()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(r: &mut CursorRows) -> Vec<(u64, Vec<(u64, u64)>)> {
        let mut out = Vec::new();
        r.order_by_group(|slot| (slot != 7).then_some(100 - slot as u64));
        r.for_each_group(|id, rows| out.push((id, rows.to_vec())));
        out
    }

    #[test]
    fn rows_come_back_by_group_id_each_group_once_and_a_gone_group_left_out() {
        let mut r = CursorRows::default();
        assert!(r.is_empty());
        r.push(3, 1, 10);
        r.push(3, 2, 20);
        r.push(5, 1, 11);
        r.push(7, 9, 99); // its group is gone
        r.push(3, 4, 40); // a slot seen before, not the one of the row before
        assert!(!r.is_empty());
        assert_eq!((r.rows(), r.slots()), (5, 3));
        assert_eq!(
            rows_of(&mut r),
            vec![(95, vec![(1, 11)]), (97, vec![(1, 10), (2, 20), (4, 40)]),]
        );
        r.finish();
        assert!(r.is_empty());
        assert_eq!((r.rows(), r.slots()), (0, 0));
        assert_eq!(rows_of(&mut r), vec![]);
        // The next flush's slots get the kept lists, clean.
        r.push(5, 8, 80);
        assert_eq!(rows_of(&mut r), vec![(95, vec![(8, 80)])]);
    }

    #[test]
    fn the_row_buffers_are_kept_while_the_flushes_stay_busy_and_freed_by_a_quiet_one() {
        let mut r = CursorRows::default();
        let busy = |r: &mut CursorRows| {
            for user in 0..10_000 {
                r.push(1, user, user + 1);
            }
        };
        busy(&mut r);
        r.finish();
        let kept = r.kept_rows();
        assert!(
            kept >= 10_000,
            "the busy flush's buffer is kept: {kept} rows"
        );
        let at = r.lists[0].1.as_ptr();
        // The next busy flush fills the same buffer: no growth, no new pages.
        busy(&mut r);
        assert_eq!(r.lists[0].1.as_ptr(), at, "the kept buffer is filled again");
        assert_eq!(r.kept_rows(), kept);
        r.finish();
        // A quiet flush (under a quarter of the buffer) frees it; an idle
        // one holds nothing.
        r.push(1, 1, 2);
        r.finish();
        assert_eq!(r.kept_rows(), 0);
        r.finish();
        assert_eq!(r.lists.len(), 0);
        assert_eq!(r.index.capacity(), 0);
    }

    #[test]
    fn a_flush_that_expects_its_rows_fills_one_buffer_from_its_first_row() {
        let mut r = CursorRows::default();
        r.expect(10_000);
        r.push(1, 0, 1);
        let at = r.lists[0].1.as_ptr();
        for user in 1..10_000 {
            r.push(1, user, user + 1);
        }
        assert_eq!(
            r.lists[0].1.as_ptr(),
            at,
            "the list never grew (no copy, no page touched twice)"
        );
        assert_eq!(r.rows(), 10_000);
        r.finish();
        assert!(r.kept_rows() >= 10_000);
    }
}
