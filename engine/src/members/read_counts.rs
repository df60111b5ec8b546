//! Read receipts: for one group, how many members' cursors are at or above a
//! msg_id, in O(log range) — a Fenwick tree of cursor counts indexed by
//! cursor value.
//!
//! It costs 4 bytes per msg_id from the group's first id to the head (a
//! tenth of the smallest record a log stores for those ids; the tree does
//! not yet shrink when retention drops old ids), nothing per member.
//! Invariant: the counts sum to the number of members.

/// The largest tree: 2^26 entries, 256 MiB.
const TREE_ENTRIES_MAX: usize = 1 << 26;

#[derive(Default, Clone, Debug)]
pub struct ReadCounts {
    /// Cursor value of index 1 minus one; values below it are clamped to it.
    base: u64,
    /// 1-based Fenwick tree; `tree[0]` is unused.
    tree: Vec<u32>,
    members: u32,
}

impl ReadCounts {
    pub fn new(base: u64) -> Self {
        ReadCounts {
            base,
            tree: vec![0],
            members: 0,
        }
    }

    fn index(&self, value: u64) -> usize {
        // Values at or below base share index 1; values beyond the largest
        // tree share its last index (read counts for ids more than 2^26
        // above the base are then approximate, but memory stays bounded).
        (value
            .saturating_sub(self.base)
            .min(TREE_ENTRIES_MAX as u64 - 2) as usize)
            + 1
    }

    fn grow_to(&mut self, index: usize) {
        if index < self.tree.len() {
            return;
        }
        // Rebuild at double size: O(n) amortised over the growth.
        let mut counts = self.counts();
        let size = (index + 1).next_power_of_two().clamp(16, TREE_ENTRIES_MAX);
        counts.resize(size, 0);
        self.tree = Self::build(&counts);
    }

    /// Point counts `counts[i]` for i in 1.. (index 0 unused).
    fn counts(&self) -> Vec<u32> {
        let n = self.tree.len();
        let mut c = self.tree.clone();
        // Inverse of the O(n) build: subtract children from parents, top down.
        for i in (1..n).rev() {
            let parent = i + (i & i.wrapping_neg());
            if parent < n {
                c[parent] -= c[i];
            }
        }
        c
    }

    fn build(counts: &[u32]) -> Vec<u32> {
        let mut t = counts.to_vec();
        let n = t.len();
        for i in 1..n {
            let parent = i + (i & i.wrapping_neg());
            if parent < n {
                t[parent] += t[i];
            }
        }
        t
    }

    fn add(&mut self, value: u64, delta: i64) {
        let mut i = self.index(value);
        self.grow_to(i);
        while i < self.tree.len() {
            self.tree[i] = (self.tree[i] as i64 + delta) as u32;
            i += i & i.wrapping_neg();
        }
    }

    /// Members whose cursor is at or below `value`.
    fn at_most(&self, value: u64) -> u32 {
        let mut i = self.index(value).min(self.tree.len() - 1);
        let mut sum = 0;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }

    pub fn insert(&mut self, cursor: u64) {
        self.add(cursor, 1);
        self.members += 1;
    }

    pub fn remove(&mut self, cursor: u64) {
        self.add(cursor, -1);
        self.members -= 1;
    }

    /// A member's cursor moved from `old` to `new`.
    pub fn advance(&mut self, old: u64, new: u64) {
        if self.index(old) != self.index(new) {
            self.add(old, -1);
            self.add(new, 1);
        }
    }

    /// How many cursors are at or above `msg_id` (members who read it).
    pub fn read_count(&self, msg_id: u64) -> u32 {
        if msg_id == 0 {
            return self.members;
        }
        self.members - self.at_most(msg_id - 1)
    }

    /// The lowest cursor (None without members). O(log range).
    pub fn min_cursor(&self) -> Option<u64> {
        if self.members == 0 {
            return None;
        }
        // Binary lifting: the largest index with prefix sum 0, plus one.
        let mut pos = 0;
        let mut step = (self.tree.len()).next_power_of_two();
        while step > 0 {
            let next = pos + step;
            if next < self.tree.len() && self.tree[next] == 0 {
                pos = next;
            }
            step >>= 1;
        }
        // Index pos+1 holds the first member; index i is value base + i - 1.
        Some(self.base + pos as u64)
    }

    pub fn heap_bytes(&self) -> usize {
        self.tree.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_a_brute_force_model() {
        let mut rc = ReadCounts::new(0);
        let mut cursors: Vec<u64> = Vec::new();
        let mut x: u64 = 12345;
        for step in 0..3000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            match x % 4 {
                0 | 1 if !cursors.is_empty() => {
                    let i = (x as usize / 7) % cursors.len();
                    let old = cursors[i];
                    let new = old + x % 50;
                    rc.advance(old, new);
                    cursors[i] = new;
                }
                2 if !cursors.is_empty() => {
                    let i = (x as usize / 7) % cursors.len();
                    rc.remove(cursors.swap_remove(i));
                }
                _ => {
                    let c = x % 300;
                    rc.insert(c);
                    cursors.push(c);
                }
            }
            if step % 37 == 0 {
                for m in [0u64, 1, 5, 50, 150, 299, 400, 5000] {
                    let expected = cursors.iter().filter(|&&c| c >= m).count() as u32;
                    assert_eq!(rc.read_count(m), expected, "step {step} msg {m}");
                }
                assert_eq!(rc.min_cursor(), cursors.iter().min().copied());
            }
        }
    }
}
