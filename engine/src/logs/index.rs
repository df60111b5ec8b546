//! The sparse `msg_id -> byte position` index of one segment.
//!
//! One entry per `index_interval_bytes` of log, in memory only: 8 bytes per
//! entry (id relative to the segment's base id, position in the file), as in
//! Kafka's offset index. It is always rebuilt from the verified log, never
//! read from disk, so it can never disagree with the records it points to.
//!
//! Invariant: entries are strictly increasing in both fields, the first entry
//! (if any) is the segment's first record, and consecutive entries are at
//! most one interval plus one record apart. So a seek is a binary search plus
//! a forward scan of at most one interval.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IndexEntry {
    relative_id: u32,
    position: u32,
}

/// The sparse index of one segment.
#[derive(Clone, Debug)]
pub struct SparseIndex {
    base_id: u64,
    interval_bytes: u32,
    entries: Vec<IndexEntry>,
}

impl SparseIndex {
    pub fn new(base_id: u64, interval_bytes: u32) -> Self {
        SparseIndex {
            base_id,
            interval_bytes,
            entries: Vec::new(),
        }
    }

    /// Records that the record `msg_id` starts at `position`. Must be called
    /// for every record of the segment, in order.
    pub fn observe(&mut self, msg_id: u64, position: u32) {
        let due = match self.entries.last() {
            None => true,
            Some(last) => position - last.position >= self.interval_bytes,
        };
        if due {
            debug_assert!(msg_id >= self.base_id);
            // Invariant: a segment holds fewer than 2^32 records (its size fits u32).
            let relative_id =
                u32::try_from(msg_id - self.base_id).expect("invariant: relative id fits u32");
            self.entries.push(IndexEntry {
                relative_id,
                position,
            });
        }
    }

    /// The indexed record with the greatest id not above `msg_id`, as
    /// `(msg_id, position)`; `None` if `msg_id` precedes the first entry.
    pub fn floor(&self, msg_id: u64) -> Option<(u64, u32)> {
        let rel = msg_id.checked_sub(self.base_id)?;
        let rel = u32::try_from(rel).unwrap_or(u32::MAX);
        let i = self.entries.partition_point(|e| e.relative_id <= rel);
        let e = self.entries.get(i.checked_sub(1)?)?;
        Some((self.base_id + e.relative_id as u64, e.position))
    }

    /// The indexed record with the greatest position not above `position`,
    /// as `(msg_id, position)`; `None` if `position` precedes the first
    /// entry. Positions rise with ids, so this is the same binary search.
    pub fn floor_by_position(&self, position: u64) -> Option<(u64, u32)> {
        let i = self
            .entries
            .partition_point(|e| e.position as u64 <= position);
        let e = self.entries.get(i.checked_sub(1)?)?;
        Some((self.base_id + e.relative_id as u64, e.position))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_eight_bytes() {
        assert_eq!(std::mem::size_of::<IndexEntry>(), 8);
    }

    #[test]
    fn floor_finds_the_nearest_entry_at_or_below() {
        let mut idx = SparseIndex::new(100, 1000);
        // records of 300 bytes starting at 64
        for i in 0..20u64 {
            idx.observe(100 + i, 64 + 300 * i as u32);
        }
        // entries at ids 100 (64), 104 (1264), 108 (2464), ...
        assert_eq!(idx.floor(99), None);
        assert_eq!(idx.floor(100), Some((100, 64)));
        assert_eq!(idx.floor(103), Some((100, 64)));
        assert_eq!(idx.floor(104), Some((104, 1264)));
        assert_eq!(idx.floor(10_000), Some((116, 64 + 300 * 16)));
        assert_eq!(idx.floor_by_position(63), None);
        assert_eq!(idx.floor_by_position(64), Some((100, 64)));
        assert_eq!(idx.floor_by_position(1263), Some((100, 64)));
        assert_eq!(idx.floor_by_position(1264), Some((104, 1264)));
        assert_eq!(idx.floor_by_position(u64::MAX), Some((116, 64 + 300 * 16)));
    }
}
