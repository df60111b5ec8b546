//! Parked long polls (PULLs with `wait_ms > 0` that found nothing), indexed
//! so that every operation costs what it touches, never a walk of every
//! parked poll:
//!
//! - by group: a commit that appended to group `g` looks at the waiters of
//!   `g` only;
//! - by deadline: a min-heap, so the loop's next timeout is a peek and the
//!   expired polls are listed in deadline order (`due`), then answered and
//!   removed like woken ones;
//! - by key: a poll leaves (answered, expired, or its connection closed) in
//!   O(1) plus a heap entry left behind.
//!
//! The heap is cleaned lazily: a poll that leaves before its deadline leaves
//! a stale heap entry, skipped when it reaches the top. The heap is rebuilt
//! from the live polls when stale entries outnumber them, so its size stays
//! within a constant factor of the polls parked.
//!
//! Invariant: every key in `by_group` and every non-stale heap entry names a
//! poll in `polls`, and every poll in `polls` is in `by_group` under its
//! group and has exactly one heap entry with its deadline.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::time::Instant;

/// Identifies one parked poll.
pub type PollKey = u64;

struct Parked<T> {
    group: u64,
    deadline: Instant,
    item: T,
}

/// Parked long polls carrying `T` (what is needed to answer them).
pub struct LongPolls<T> {
    next_key: PollKey,
    polls: HashMap<PollKey, Parked<T>>,
    by_group: HashMap<u64, HashSet<PollKey>>,
    deadlines: BinaryHeap<Reverse<(Instant, PollKey)>>,
    /// Polls and heap entries examined so far: the cost of the operations,
    /// which tests compare with the work they should touch.
    pub examined: u64,
}

impl<T> Default for LongPolls<T> {
    fn default() -> Self {
        LongPolls {
            next_key: 0,
            polls: HashMap::new(),
            by_group: HashMap::new(),
            deadlines: BinaryHeap::new(),
            examined: 0,
        }
    }
}

/// Stale heap entries tolerated before a rebuild, besides one per live poll.
const STALE_SLACK: usize = 64;

impl<T> LongPolls<T> {
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.polls.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.polls.is_empty()
    }

    /// Parks a poll on `group` until `deadline`.
    pub fn insert(&mut self, group: u64, deadline: Instant, item: T) -> PollKey {
        self.next_key += 1;
        let key = self.next_key;
        self.polls.insert(
            key,
            Parked {
                group,
                deadline,
                item,
            },
        );
        self.by_group.entry(group).or_default().insert(key);
        self.deadlines.push(Reverse((deadline, key)));
        key
    }

    /// Takes a poll out (answered, or its connection closed).
    pub fn remove(&mut self, key: PollKey) -> Option<T> {
        let p = self.polls.remove(&key)?;
        self.examined += 1;
        if let Some(set) = self.by_group.get_mut(&p.group) {
            set.remove(&key);
            if set.is_empty() {
                self.by_group.remove(&p.group);
            }
        }
        // Its heap entry is now stale; rebuild when stale ones dominate.
        if self.deadlines.len() > 2 * self.polls.len() + STALE_SLACK {
            self.deadlines = self
                .polls
                .iter()
                .map(|(k, p)| Reverse((p.deadline, *k)))
                .collect();
        }
        Some(p.item)
    }

    /// The keys of the polls waiting on `group` (only those).
    pub fn waiters(&mut self, group: u64) -> Vec<PollKey> {
        let keys: Vec<PollKey> = self
            .by_group
            .get(&group)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        self.examined += keys.len() as u64;
        keys
    }

    /// The poll parked under `key`, if it still is.
    pub fn get(&self, key: PollKey) -> Option<&T> {
        self.polls.get(&key).map(|p| &p.item)
    }

    /// The earliest deadline of a parked poll. Drops stale heap entries on
    /// top, so it costs O(log n) amortised over the polls that left.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((deadline, key))) = self.deadlines.peek().copied() {
            self.examined += 1;
            if self.polls.get(&key).is_some_and(|p| p.deadline == deadline) {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The keys of the polls whose deadline is at or before `now`, earliest
    /// first. They stay parked (each keeps its heap entry) until the caller
    /// removes them: it answers an expired poll the way it answers a woken
    /// one. Costs the due polls and the stale entries on top.
    pub fn due(&mut self, now: Instant) -> Vec<PollKey> {
        let mut due = Vec::new();
        while let Some(deadline) = self.next_deadline() {
            if deadline > now {
                break;
            }
            // Invariant: next_deadline returned the live entry on top.
            let Some(Reverse((_, key))) = self.deadlines.pop() else {
                break;
            };
            due.push((deadline, key));
        }
        for &(deadline, key) in &due {
            self.deadlines.push(Reverse((deadline, key)));
        }
        due.into_iter().map(|(_, key)| key).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_wake_up_touches_only_the_waiters_of_the_appended_group() {
        let now = Instant::now();
        let mut p: LongPolls<u32> = LongPolls::default();
        for i in 0..10_000u32 {
            p.insert(1, now + Duration::from_secs(60), i);
        }
        let a = p.insert(2, now + Duration::from_secs(60), 7);
        let b = p.insert(2, now + Duration::from_secs(30), 8);
        let before = p.examined;
        let mut keys = p.waiters(2);
        keys.sort_unstable();
        assert_eq!(keys, [a, b]);
        assert_eq!(p.get(a), Some(&7));
        assert_eq!(p.remove(a), Some(7));
        // Two waiters listed, one removed: three entries examined, not 10,002.
        assert_eq!(p.examined - before, 3);
        assert!(p.waiters(3).is_empty());
        assert_eq!(p.len(), 10_001);
    }

    #[test]
    fn deadlines_come_out_in_order_without_walking_every_poll() {
        let now = Instant::now();
        let mut p: LongPolls<u32> = LongPolls::default();
        for i in 0..10_000u32 {
            p.insert(
                u64::from(i % 7),
                now + Duration::from_secs(100 + u64::from(i)),
                i,
            );
        }
        p.insert(9, now + Duration::from_millis(5), 1);
        p.insert(9, now + Duration::from_millis(1), 2);
        let before = p.examined;
        assert_eq!(p.next_deadline(), Some(now + Duration::from_millis(1)));
        let due: Vec<u32> = p
            .due(now + Duration::from_millis(10))
            .into_iter()
            .map(|k| p.remove(k).unwrap())
            .collect();
        assert_eq!(due, [2, 1]);
        assert_eq!(p.next_deadline(), Some(now + Duration::from_secs(100)));
        assert!(
            p.examined - before < 20,
            "examined {} entries",
            p.examined - before
        );
        assert!(p.waiters(9).is_empty());
    }

    #[test]
    fn removed_polls_leave_no_trace_and_the_heap_stays_bounded() {
        let now = Instant::now();
        let mut p: LongPolls<u32> = LongPolls::default();
        for round in 0..100u32 {
            let keys: Vec<PollKey> = (0..100u32)
                .map(|i| p.insert(1, now + Duration::from_secs(u64::from(round * 100 + i)), i))
                .collect();
            for k in keys {
                assert!(p.remove(k).is_some());
            }
        }
        assert!(p.is_empty());
        assert!(p.deadlines.len() <= STALE_SLACK + 1);
        assert_eq!(p.next_deadline(), None);
        assert!(p.by_group.is_empty());
    }
}
