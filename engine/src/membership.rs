//! The members of one group: a sorted list of user ids (8 bytes each) and
//! the group's read counts. The cursors themselves live in the cursor table
//! (user side); this side answers "who is in group G" and "how many read m".
//!
//! Inserts go to a small sorted buffer merged into the main list when it
//! grows past 1/16 of it, so bulk joins cost O(n log n), not O(n^2), and the
//! main list is reallocated at its exact size on every merge.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::read_counts::ReadCounts;

/// Source of member-list versions: unique in the process, so a version
/// never repeats, not even for a group deleted and created again.
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

fn next_version() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

pub struct GroupMembers {
    sorted: Vec<u64>,
    recent: Vec<u64>,
    /// Changes whenever the member list does (see [`Self::version`]).
    version: u64,
    pub read_counts: ReadCounts,
}

impl GroupMembers {
    pub fn new(base: u64) -> Self {
        GroupMembers {
            sorted: Vec::new(),
            recent: Vec::new(),
            version: next_version(),
            read_counts: ReadCounts::new(base),
        }
    }

    /// A value that changes whenever a member joins or leaves and is never
    /// shared with another member list: what a cache of "who is in this
    /// group" keys on.
    pub fn version(&self) -> u64 {
        self.version
    }

    #[cfg(test)]
    fn contains(&self, user: u64) -> bool {
        self.sorted.binary_search(&user).is_ok() || self.recent.binary_search(&user).is_ok()
    }

    pub fn len(&self) -> usize {
        self.sorted.len() + self.recent.len()
    }

    /// Adds `user` with cursor `cursor`; false if already a member.
    pub fn insert(&mut self, user: u64, cursor: u64) -> bool {
        if self.sorted.binary_search(&user).is_ok() {
            return false;
        }
        let Err(at) = self.recent.binary_search(&user) else {
            return false;
        };
        self.recent.insert(at, user);
        self.version = next_version();
        self.read_counts.insert(cursor);
        if self.recent.len() > 64.max(self.sorted.len() / 16) {
            self.merge();
        }
        true
    }

    fn merge(&mut self) {
        let mut merged = Vec::with_capacity(self.sorted.len() + self.recent.len());
        let (mut a, mut b) = (self.sorted.iter().peekable(), self.recent.iter().peekable());
        while let (Some(&&x), Some(&&y)) = (a.peek(), b.peek()) {
            if x < y {
                merged.push(x);
                a.next();
            } else {
                merged.push(y);
                b.next();
            }
        }
        merged.extend(a);
        merged.extend(b);
        self.sorted = merged;
        self.recent = Vec::new();
    }

    /// Removes `user` whose cursor was `cursor`; false if not a member.
    pub fn remove(&mut self, user: u64, cursor: u64) -> bool {
        let removed = if let Ok(i) = self.sorted.binary_search(&user) {
            self.sorted.remove(i);
            true
        } else if let Ok(i) = self.recent.binary_search(&user) {
            self.recent.remove(i);
            true
        } else {
            false
        };
        if removed {
            self.version = next_version();
            self.read_counts.remove(cursor);
        }
        removed
    }

    /// Members in ascending user id order.
    pub fn users(&self) -> Vec<u64> {
        let mut all = Vec::with_capacity(self.len());
        all.extend_from_slice(&self.sorted);
        all.extend_from_slice(&self.recent);
        all.sort_unstable();
        all
    }

    pub fn heap_bytes(&self) -> usize {
        (self.sorted.capacity() + self.recent.capacity()) * 8 + self.read_counts.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_changes_with_the_member_list_and_never_repeats() {
        let mut a = GroupMembers::new(0);
        let b = GroupMembers::new(0);
        assert_ne!(a.version(), b.version(), "two lists never share a version");
        let v0 = a.version();
        assert!(a.insert(5, 0));
        let v1 = a.version();
        assert_ne!(v1, v0);
        assert!(!a.insert(5, 0));
        assert!(!a.remove(6, 0));
        assert_eq!(a.version(), v1, "no change, same version");
        assert!(a.remove(5, 0));
        assert!(a.version() != v1 && a.version() != v0);
    }

    #[test]
    fn bulk_inserts_stay_sorted_and_compact() {
        let mut m = GroupMembers::new(0);
        let mut x: u64 = 99;
        let mut model = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = x >> 40;
            assert_eq!(m.insert(u, 0), model.insert(u));
        }
        assert_eq!(m.len(), model.len());
        assert_eq!(m.users(), model.iter().copied().collect::<Vec<_>>());
        for u in model.iter().step_by(3) {
            assert!(m.contains(*u));
        }
        // Main list exact, buffer at most 1/16: under 8 * (1 + 1/16) bytes per member plus slack of the buffer.
        assert!(m.sorted.capacity() == m.sorted.len());
        let first = *model.iter().next().unwrap();
        assert!(m.remove(first, 0));
        assert!(!m.contains(first));
        assert!(!m.remove(first, 0));
        assert_eq!(m.read_counts.read_count(0), (model.len() - 1) as u32);
    }
}
