//! Merging runs: the streaming k-way merge that both compacts runs into
//! one (checkpoint step K5) and loads the state at open (all runs, the
//! oldest included), and the policy that says which runs to merge.
//!
//! Newest wins, with masking. Inputs are ordered newest first. For a group
//! `g`:
//!
//! | newest group item of `g` in the inputs | output group item | member rows of `g` |
//! |---|---|---|
//! | none | none | newest per key; with the oldest run in the merge, dropped (orphans) |
//! | `GroupPut` | `GroupPut`, `fresh` if any input holds a masking item of `g` (kept only while runs older than the output exist) | newest per key among runs no older than the newest masking item |
//! | `GroupDelete` | `GroupDelete` (dropped with the oldest run) | dropped |
//!
//! A *masking* item is a `GroupDelete` or a `fresh` `GroupPut`: it hides
//! every item of its group in older runs. The user index's entries
//! (`IndexPut`, `IndexDelete`, keyed by user) are never masked: the newest
//! per key wins, and an `IndexDelete` is dropped when the oldest run is in
//! the merge. A `MemberDelete` is kept only
//! while it can still hide something: not when the oldest run is in the
//! merge, nor when the output group record is `fresh` (which hides every
//! older row anyway).
//!
//! Cost: O(log k) per input item (a heap of the k run heads), memory O(k)
//! plus the items of one key.

use std::cmp::Reverse;
use std::collections::binary_heap::PeekMut;
use std::collections::BinaryHeap;

use super::{Item, Key, StopAtError};

/// The merge of `k` runs, yielding items in key order.
pub(crate) struct Merge<I: Iterator<Item = Result<Item, String>>> {
    runs: Vec<I>,
    heads: Vec<Option<Item>>,
    /// The last key each run yielded (runs must strictly increase).
    last_keys: Vec<Option<Key>>,
    heap: BinaryHeap<Reverse<(Key, usize)>>,
    /// The oldest run is an input: tombstones and `fresh` flags have
    /// nothing left to hide.
    includes_oldest: bool,
    group: Option<GroupState>,
    /// An input failed while the merge was set up; reported first.
    pending_error: Option<String>,
    failed: bool,
    /// The items of the key being resolved, `(run index, item)` newest
    /// first: one buffer for the whole merge, so a key costs no
    /// allocation (a load at open resolves one key per item).
    key_items: Vec<(usize, Item)>,
}

/// What the merge decided about the group whose items it is in.
struct GroupState {
    group: u64,
    /// Index of the newest input holding a masking item of the group.
    mask: Option<usize>,
    resolved: Resolved,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Resolved {
    /// No input holds a group item.
    Absent,
    Deleted,
    /// Present; the output record is `fresh`.
    Present {
        fresh: bool,
    },
}

impl<I: Iterator<Item = Result<Item, String>>> Merge<I> {
    /// `runs` newest first; `includes_oldest` when no run older than them
    /// exists (a load at open, or a merge of every run).
    pub fn new(runs: Vec<I>, includes_oldest: bool) -> Self {
        let n = runs.len();
        let mut m = Merge {
            runs,
            heads: (0..n).map(|_| None).collect(),
            last_keys: vec![None; n],
            heap: BinaryHeap::with_capacity(n),
            includes_oldest,
            group: None,
            pending_error: None,
            failed: false,
            key_items: Vec::with_capacity(n),
        };
        for i in 0..n {
            if let Err(e) = m.advance(i) {
                m.pending_error = Some(e);
                m.failed = true;
                break;
            }
        }
        m
    }

    /// Reads run `i`'s next item into its head and puts the run on the
    /// heap (not if it is done).
    fn advance(&mut self, i: usize) -> Result<(), String> {
        if let Some(key) = self.read_head(i)? {
            self.heap.push(Reverse((key, i)));
        }
        Ok(())
    }

    /// Reads run `i`'s next item into its head; returns its key, `None`
    /// when the run is done.
    fn read_head(&mut self, i: usize) -> Result<Option<Key>, String> {
        let prev = self.last_keys[i];
        match self.runs[i].next() {
            None => {
                self.heads[i] = None;
                Ok(None)
            }
            Some(Err(e)) => Err(e),
            Some(Ok(item)) => {
                let key = item.key();
                if prev.is_some_and(|p| key <= p) {
                    return Err(format!("run {i}: key {key:?} does not follow {prev:?}"));
                }
                self.last_keys[i] = Some(key);
                self.heads[i] = Some(item);
                Ok(Some(key))
            }
        }
    }

    /// Takes every head whose key is the smallest into `items` (emptied
    /// first): `(run index, item)`, newest run first (the heap orders equal
    /// keys by run index). Returns the key, or `None` once every run is
    /// done. Each run taken is read on and its heap entry replaced in
    /// place: one sift, not a pop and a push, per item.
    fn pop_key(&mut self, items: &mut Vec<(usize, Item)>) -> Result<Option<Key>, String> {
        items.clear();
        let Some(&Reverse((key, _))) = self.heap.peek() else {
            return Ok(None);
        };
        while let Some(&Reverse((k, i))) = self.heap.peek() {
            if k != key {
                break;
            }
            // Invariant: a run is in the heap exactly while its head is set.
            let item = self.heads[i]
                .take()
                .expect("invariant: heap entry has a head");
            let next = self.read_head(i)?;
            // Invariant: the top is still run `i`'s entry (read_head
            // leaves the heap alone).
            let mut top = self.heap.peek_mut().expect("invariant: the heap has a top");
            match next {
                Some(next) => *top = Reverse((next, i)),
                None => {
                    PeekMut::pop(top);
                }
            }
            items.push((i, item));
        }
        Ok(Some(key))
    }
}

impl<I: Iterator<Item = Result<Item, String>>> StopAtError for Merge<I> {
    fn failed(&mut self) -> &mut bool {
        &mut self.failed
    }

    fn next_inner(&mut self) -> Result<Option<Item>, String> {
        let mut items = std::mem::take(&mut self.key_items);
        let next = self.resolve_next(&mut items);
        self.key_items = items;
        next
    }
}

impl<I: Iterator<Item = Result<Item, String>>> Merge<I> {
    /// The next item of the output (the table in the module docs), with
    /// `items` as the buffer of each key's items.
    fn resolve_next(&mut self, items: &mut Vec<(usize, Item)>) -> Result<Option<Item>, String> {
        while let Some(key) = self.pop_key(items)? {
            if key.index {
                // The user index: newest wins, never masked (a group item
                // of the id its user has hides nothing of it); a delete
                // is kept while an older run may hold the entry.
                // Invariant: `items` is non-empty and newest first.
                let (_, newest) = items
                    .drain(..)
                    .next()
                    .expect("invariant: a popped key has an item");
                if !(self.includes_oldest && matches!(newest, Item::IndexDelete { .. })) {
                    return Ok(Some(newest));
                }
                continue;
            }
            if key.user.is_none() {
                let masking = |it: &Item| match it {
                    Item::GroupDelete { .. } => true,
                    Item::GroupPut(g) => g.fresh,
                    _ => false,
                };
                let mask = items.iter().find(|(_, it)| masking(it)).map(|&(i, _)| i);
                // Invariant: `items` is non-empty and newest first.
                let (_, newest) = items
                    .drain(..)
                    .next()
                    .expect("invariant: a popped key has an item");
                let (resolved, out) = match newest {
                    Item::GroupDelete { group } => (
                        Resolved::Deleted,
                        (!self.includes_oldest).then_some(Item::GroupDelete { group }),
                    ),
                    Item::GroupPut(mut g) => {
                        g.fresh = mask.is_some() && !self.includes_oldest;
                        (
                            Resolved::Present { fresh: g.fresh },
                            Some(Item::GroupPut(g)),
                        )
                    }
                    // Invariant: group keys hold group items.
                    other => unreachable!("member item {other:?} under a group key"),
                };
                self.group = Some(GroupState {
                    group: key.group,
                    mask,
                    resolved,
                });
                if let Some(out) = out {
                    return Ok(Some(out));
                }
                continue;
            }
            if self.group.as_ref().is_none_or(|s| s.group != key.group) {
                self.group = Some(GroupState {
                    group: key.group,
                    mask: None,
                    resolved: Resolved::Absent,
                });
            }
            // Invariant: set just above.
            let st = self.group.as_ref().expect("invariant: group state set");
            let Some((_, newest)) = items
                .drain(..)
                .find(|&(i, _)| st.mask.is_none_or(|m| i <= m))
            else {
                continue; // every row of this key is hidden
            };
            let tombstone = matches!(newest, Item::MemberDelete { .. });
            let keep = match st.resolved {
                Resolved::Deleted => false,
                Resolved::Absent => !self.includes_oldest,
                Resolved::Present { fresh } => !tombstone || !(fresh || self.includes_oldest),
            };
            if keep {
                return Ok(Some(newest));
            }
        }
        Ok(None)
    }
}

impl<I: Iterator<Item = Result<Item, String>>> Iterator for Merge<I> {
    type Item = Result<Item, String>;

    /// The next item of the merge; an error of an input (or keys that do
    /// not increase within a run) ends it.
    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.pending_error.take() {
            return Some(Err(e));
        }
        self.next_or_first_error()
    }
}

/// The merge policy, applied after each delta run is added: how many of
/// the newest runs to merge into one (0: none). `sizes` are the runs'
/// bytes, newest first.
///
/// It merges the newest `i + 1` runs for the largest `i >= 1` with
/// `sizes[i] <= sizes[0] + ... + sizes[i - 1]`, which restores the
/// invariant **every run is larger than all newer runs together**. Hence:
/// - read amplification: with `n` runs the total `S` is more than
///   `2^(n-1)` times the newest run, so `n <= 1 + log2(S / newest)`;
///   loading reads each run once;
/// - write amplification: a merge puts an item's run together with at
///   least as many bytes as it held (the run it was in is at most the
///   sum of the newer ones it joins), so counting bytes before
///   duplicates are dropped, each merge at least doubles the run holding
///   an item: an item is rewritten at most `log2(S / delta)` times;
/// - only adjacent runs (by age) are merged, which newest-wins needs.
///
/// A single merge can cover every run (as a tier merge of the design
/// can); it runs on the checkpointer thread, off the commit path.
pub(crate) fn plan(sizes: &[u64]) -> usize {
    let mut sum = 0u64;
    let mut last = 0;
    for (i, &s) in sizes.iter().enumerate() {
        if i >= 1 && s <= sum {
            last = i;
        }
        sum = sum.saturating_add(s);
    }
    if last >= 1 {
        last + 1
    } else {
        0
    }
}
