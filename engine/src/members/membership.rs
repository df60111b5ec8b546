//! The members of one group: their user ids, sorted, and the group's read
//! counts. The cursors themselves live in the cursor table (user side);
//! this side answers "who is in group G" and "how many read m".
//!
//! Representation, by size (most groups are one-to-one chats):
//! - up to 2 members: inline, no allocation (24 bytes in the group);
//! - up to [`READ_COUNTS_MEMBERS_MIN`] members: a boxed slice of the ids at
//!   its exact size, 8 bytes per member and nothing else (most groups
//!   above two members are this small: a list header and a tree slot of
//!   their own, 96 bytes, cost them more than their ids);
//! - more: a boxed list with its read-count tree. Inserts go to a small
//!   sorted buffer merged into the main list when it grows past 1/16 of
//!   it, so bulk joins cost O(n log n), not O(n^2), and the main list is
//!   reallocated at its exact size on every merge. Below 1,024 members a
//!   join inserts in place, at exact size (no buffer, no slack).
//!
//! Read counts ("how many cursors are >= m", "the lowest cursor"): above
//! [`READ_COUNTS_MEMBERS_MIN`] members a Fenwick tree answers in O(log
//! range) ([`ReadCounts`]); it is built from the members' cursors when a
//! join crosses that size and dropped (the list going back to a boxed
//! slice) when leaves bring the group down to half of it. Without a tree the answer is computed from the members'
//! cursors (at most [`READ_COUNTS_MEMBERS_MIN`] lookups): a small group pays
//! no tree (0.1 paid at least 256 bytes each) and an ACK in it does not
//! touch one.
//!
//! Invariant: while the group's `members` lock is held, the list names
//! exactly the users with a membership of the group in the cursor table,
//! and the tree (if built) counts exactly their cursors. So whoever moves a
//! cursor of the group holds that lock from the move until it told
//! [`GroupMembers::advance`] (a tree built in between would count the move
//! twice).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::members::read_counts::ReadCounts;

/// Source of member-list versions: unique in the process, so a version
/// never repeats, not even for a group deleted and created again.
static NEXT_VERSION: AtomicU64 = AtomicU64::new(1);

fn next_version() -> u64 {
    NEXT_VERSION.fetch_add(1, Ordering::Relaxed)
}

/// Above this many members a group keeps a read-count tree.
pub const READ_COUNTS_MEMBERS_MIN: usize = 64;
/// Up to this many members, a join inserts into the main list directly.
const DIRECT_INSERT_MAX: usize = 1024;

pub struct GroupMembers {
    /// Changes whenever the member list does (see [`Self::version`]).
    version: u64,
    users: Users,
}

enum Users {
    /// Up to two members, `ids[..len]` sorted.
    Inline { len: u8, ids: [u64; 2] },
    /// 3 to [`READ_COUNTS_MEMBERS_MIN`] members (down to 2 after leaves
    /// from a larger list), sorted, at exact size.
    Few(Box<[u64]>),
    /// More: above [`READ_COUNTS_MEMBERS_MIN`] members, or above half of it
    /// after leaves.
    Many(Box<Many>),
}

impl Users {
    /// `ids` (sorted) in the smallest form without a tree.
    fn without_tree(ids: Vec<u64>) -> Users {
        if ids.len() <= 2 {
            let mut inline = [0; 2];
            inline[..ids.len()].copy_from_slice(&ids);
            Users::Inline {
                len: ids.len() as u8,
                ids: inline,
            }
        } else {
            Users::Few(ids.into_boxed_slice())
        }
    }
}

struct Many {
    sorted: Vec<u64>,
    recent: Vec<u64>,
    /// Built above [`READ_COUNTS_MEMBERS_MIN`] members (module docs).
    read_counts: Option<ReadCounts>,
}

impl Many {
    fn len(&self) -> usize {
        self.sorted.len() + self.recent.len()
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
}

impl Default for GroupMembers {
    fn default() -> Self {
        GroupMembers::new()
    }
}

impl GroupMembers {
    pub fn new() -> Self {
        GroupMembers {
            version: next_version(),
            users: Users::Inline {
                len: 0,
                ids: [0; 2],
            },
        }
    }

    /// The member list of `members` (user, cursor), ascending user ids
    /// without repeats, built at once (recovery): the list at its exact
    /// size and, above [`READ_COUNTS_MEMBERS_MIN`] members, the tree from
    /// the given cursors, with no lookup in the cursor table.
    pub fn from_sorted(members: &[(u64, u64)]) -> Self {
        debug_assert!(members.windows(2).all(|w| w[0].0 < w[1].0));
        let ids: Vec<u64> = members.iter().map(|&(u, _)| u).collect();
        let users = if members.len() <= READ_COUNTS_MEMBERS_MIN {
            Users::without_tree(ids)
        } else {
            let mut rc = ReadCounts::new(0);
            for &(_, cursor) in members {
                rc.insert(cursor);
            }
            Users::Many(Box::new(Many {
                sorted: ids,
                recent: Vec::new(),
                read_counts: Some(rc),
            }))
        };
        GroupMembers {
            version: next_version(),
            users,
        }
    }

    /// A value that changes whenever a member joins or leaves and is never
    /// shared with another member list: what a cache of "who is in this
    /// group" keys on.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The members as two sorted, disjoint parts: the main list and the
    /// buffer of recent joins (empty but in a large list).
    fn parts(&self) -> (&[u64], &[u64]) {
        match &self.users {
            Users::Inline { len, ids } => (&ids[..*len as usize], &[]),
            Users::Few(ids) => (ids, &[]),
            Users::Many(m) => (&m.sorted, &m.recent),
        }
    }

    #[cfg(test)]
    fn contains(&self, user: u64) -> bool {
        let (a, b) = self.parts();
        a.binary_search(&user).is_ok() || b.binary_search(&user).is_ok()
    }

    pub fn len(&self) -> usize {
        let (a, b) = self.parts();
        a.len() + b.len()
    }

    /// Adds `user` with cursor `cursor`; false if already a member.
    /// `cursor_of` gives the cursor of any member, `user` included (the
    /// cursor table already holds the new membership): a join that takes
    /// the group past [`READ_COUNTS_MEMBERS_MIN`] builds the tree from them.
    pub fn insert(&mut self, user: u64, cursor: u64, cursor_of: impl Fn(u64) -> u64) -> bool {
        match &mut self.users {
            Users::Inline { len, ids } => {
                let n = *len as usize;
                let Err(at) = ids[..n].binary_search(&user) else {
                    return false;
                };
                if n < ids.len() {
                    ids.copy_within(at..n, at + 1);
                    ids[at] = user;
                    *len += 1;
                } else {
                    let mut sorted = Vec::with_capacity(n + 1);
                    sorted.extend_from_slice(&ids[..at]);
                    sorted.push(user);
                    sorted.extend_from_slice(&ids[at..]);
                    self.users = Users::Few(sorted.into_boxed_slice());
                }
            }
            Users::Few(ids) => {
                let Err(at) = ids.binary_search(&user) else {
                    return false;
                };
                // The slice as a vector of capacity == length: one more
                // at exact size (the allocator grows it in place while its
                // size class has room).
                let mut sorted = std::mem::take(ids).into_vec();
                sorted.reserve_exact(1);
                sorted.insert(at, user);
                if sorted.len() <= READ_COUNTS_MEMBERS_MIN {
                    *ids = sorted.into_boxed_slice();
                } else {
                    let mut rc = ReadCounts::new(0);
                    for &u in &sorted {
                        rc.insert(cursor_of(u));
                    }
                    self.users = Users::Many(Box::new(Many {
                        sorted,
                        recent: Vec::new(),
                        read_counts: Some(rc),
                    }));
                }
            }
            Users::Many(m) => {
                let in_sorted = m.sorted.binary_search(&user);
                if in_sorted.is_ok() || m.recent.binary_search(&user).is_ok() {
                    return false;
                }
                match in_sorted {
                    // Small lists take the id in place, at exact size (a
                    // move of at most 8 KiB): no buffer, no slack.
                    Err(at) if m.sorted.len() < DIRECT_INSERT_MAX && m.recent.is_empty() => {
                        m.sorted.reserve_exact(1);
                        m.sorted.insert(at, user);
                    }
                    _ => {
                        let Err(at) = m.recent.binary_search(&user) else {
                            return false;
                        };
                        m.recent.insert(at, user);
                        if m.recent.len() > 64.max(m.sorted.len() / 16) {
                            m.merge();
                        }
                    }
                }
                let len = m.len();
                match &mut m.read_counts {
                    Some(rc) => rc.insert(cursor),
                    None if len > READ_COUNTS_MEMBERS_MIN => {
                        let mut rc = ReadCounts::new(0);
                        for &u in m.sorted.iter().chain(&m.recent) {
                            rc.insert(cursor_of(u));
                        }
                        m.read_counts = Some(rc);
                    }
                    None => {}
                }
            }
        }
        self.version = next_version();
        true
    }

    /// Removes `user` whose cursor was `cursor`; false if not a member.
    pub fn remove(&mut self, user: u64, cursor: u64) -> bool {
        match &mut self.users {
            Users::Inline { len, ids } => {
                let n = *len as usize;
                let Ok(at) = ids[..n].binary_search(&user) else {
                    return false;
                };
                ids.copy_within(at + 1..n, at);
                *len -= 1;
            }
            Users::Few(ids) => {
                let Ok(at) = ids.binary_search(&user) else {
                    return false;
                };
                let mut sorted = std::mem::take(ids).into_vec();
                sorted.remove(at);
                self.users = Users::without_tree(sorted);
            }
            Users::Many(m) => {
                if let Ok(i) = m.sorted.binary_search(&user) {
                    m.sorted.remove(i);
                } else if let Ok(i) = m.recent.binary_search(&user) {
                    m.recent.remove(i);
                } else {
                    return false;
                }
                if let Some(rc) = &mut m.read_counts {
                    rc.remove(cursor);
                }
                if m.len() <= READ_COUNTS_MEMBERS_MIN / 2 {
                    self.users = Users::without_tree(self.users());
                }
            }
        }
        self.version = next_version();
        true
    }

    /// A member's cursor moved from `old` to `new` (the caller held this
    /// list's lock across the move, module docs).
    pub fn advance(&mut self, old: u64, new: u64) {
        if let Users::Many(m) = &mut self.users {
            if let Some(rc) = &mut m.read_counts {
                rc.advance(old, new);
            }
        }
    }

    /// How many members' cursors are at or above `msg_id` (members who
    /// read it). O(log range) with a tree, else one `cursor_of` per member.
    pub fn read_count(&self, msg_id: u64, cursor_of: impl Fn(u64) -> u64) -> u32 {
        if let Users::Many(m) = &self.users {
            if let Some(rc) = &m.read_counts {
                return rc.read_count(msg_id);
            }
        }
        let n = self.for_each_cursor(cursor_of, |c| c >= msg_id);
        // Invariant: members_per_group_max keeps a list far below 2^32.
        u32::try_from(n).expect("invariant: member count fits u32")
    }

    /// The lowest cursor (None without members).
    pub fn min_cursor(&self, cursor_of: impl Fn(u64) -> u64) -> Option<u64> {
        if let Users::Many(m) = &self.users {
            if let Some(rc) = &m.read_counts {
                return rc.min_cursor();
            }
        }
        let mut min = None;
        self.for_each_cursor(cursor_of, |c| {
            min = Some(min.map_or(c, |m: u64| m.min(c)));
            false
        });
        min
    }

    /// Calls `f` on every member's cursor (small groups only: callers use
    /// the tree above the threshold); returns how many calls said true.
    fn for_each_cursor(
        &self,
        cursor_of: impl Fn(u64) -> u64,
        mut f: impl FnMut(u64) -> bool,
    ) -> usize {
        let (a, b) = self.parts();
        a.iter().chain(b).filter(|&&u| f(cursor_of(u))).count()
    }

    /// Members in ascending user id order.
    pub fn users(&self) -> Vec<u64> {
        let (a, b) = self.parts();
        let mut all = Vec::with_capacity(a.len() + b.len());
        all.extend_from_slice(a);
        if !b.is_empty() {
            all.extend_from_slice(b);
            all.sort_unstable();
        }
        all
    }

    /// A page of the members in ascending user id order: at most `max`
    /// user ids above `after` (0: from the first), and whether members
    /// above the last one returned remain. O(log n + page): both sorted
    /// parts (the main list and the buffer of recent joins) are searched
    /// for `after` and merged from there, never walked from the start.
    pub fn page_after(&self, after: u64, max: usize) -> (Vec<u64>, bool) {
        let (a, b) = self.parts();
        let (mut a, mut b) = (
            &a[a.partition_point(|&u| u <= after)..],
            &b[b.partition_point(|&u| u <= after)..],
        );
        let mut page = Vec::with_capacity(max.min(a.len() + b.len()));
        while page.len() < max {
            // The two parts are disjoint (a user is in one of them).
            let next = match (a.first(), b.first()) {
                (Some(&x), Some(&y)) if x < y => {
                    a = &a[1..];
                    x
                }
                (_, Some(&y)) => {
                    b = &b[1..];
                    y
                }
                (Some(&x), None) => {
                    a = &a[1..];
                    x
                }
                (None, None) => break,
            };
            page.push(next);
        }
        (page, !a.is_empty() || !b.is_empty())
    }

    /// Heap bytes (the list in place is part of the group).
    pub fn heap_bytes(&self) -> usize {
        match &self.users {
            Users::Inline { .. } => 0,
            Users::Few(ids) => ids.len() * 8,
            Users::Many(m) => {
                std::mem::size_of::<Many>()
                    + (m.sorted.capacity() + m.recent.capacity()) * 8
                    + m.read_counts.as_ref().map_or(0, |rc| rc.heap_bytes())
            }
        }
    }

    /// True if the read-count tree is built (tests of the threshold).
    #[cfg(test)]
    fn has_tree(&self) -> bool {
        matches!(&self.users, Users::Many(m) if m.read_counts.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_changes_with_the_member_list_and_never_repeats() {
        let mut a = GroupMembers::new();
        let b = GroupMembers::new();
        assert_ne!(a.version(), b.version(), "two lists never share a version");
        let v0 = a.version();
        assert!(a.insert(5, 0, |_| 0));
        let v1 = a.version();
        assert_ne!(v1, v0);
        assert!(!a.insert(5, 0, |_| 0));
        assert!(!a.remove(6, 0));
        assert_eq!(a.version(), v1, "no change, same version");
        assert!(a.remove(5, 0));
        assert!(a.version() != v1 && a.version() != v0);
    }

    #[test]
    fn bulk_inserts_stay_sorted_and_compact() {
        let mut m = GroupMembers::new();
        let mut x: u64 = 99;
        let mut model = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = x >> 40;
            assert_eq!(m.insert(u, 0, |_| 0), model.insert(u));
        }
        assert_eq!(m.len(), model.len());
        assert_eq!(m.users(), model.iter().copied().collect::<Vec<_>>());
        for u in model.iter().step_by(3) {
            assert!(m.contains(*u));
        }
        // Main list exact, buffer at most 1/16: under 8 * (1 + 1/16) bytes per member plus slack of the buffer.
        let Users::Many(many) = &m.users else {
            panic!("20,000 members are not inline")
        };
        assert!(many.sorted.capacity() == many.sorted.len());
        let first = *model.iter().next().unwrap();
        assert!(m.remove(first, 0));
        assert!(!m.contains(first));
        assert!(!m.remove(first, 0));
        assert_eq!(m.read_count(0, |_| 0), (model.len() - 1) as u32);
    }

    /// Up to [`READ_COUNTS_MEMBERS_MIN`] members a group's list costs its
    /// ids and nothing else, built by joins, left or at once: a list
    /// header and a tree slot of its own (96 bytes) were more than the
    /// ids of a group of 3-12 members.
    #[test]
    fn a_small_list_holds_its_ids_only() {
        let mut m = GroupMembers::new();
        for n in 1..=READ_COUNTS_MEMBERS_MIN as u64 {
            assert!(m.insert(n * 5, 0, |_| 0));
            let ids = if n <= 2 { 0 } else { n as usize * 8 };
            assert_eq!(m.heap_bytes(), ids, "{n} members");
        }
        assert!(m.insert(1, 0, |_| 0));
        assert!(m.has_tree(), "a tree above the threshold");
        for n in (3..=READ_COUNTS_MEMBERS_MIN as u64).rev() {
            assert!(m.remove(n * 5, 0));
        }
        assert!(!m.has_tree());
        assert_eq!(m.users(), [1, 5, 10]);
        assert_eq!(m.heap_bytes(), 3 * 8, "back to the ids alone");
        let built = GroupMembers::from_sorted(&[(1, 0), (5, 0), (10, 0)]);
        assert_eq!(built.heap_bytes(), 3 * 8);
    }

    /// A list built at once answers what one built by inserts answers:
    /// members, and read counts below and above the tree's threshold.
    #[test]
    fn a_list_built_at_once_is_the_list_inserts_build() {
        for n in [0usize, 1, 2, 3, 64, 65, 300] {
            let members: Vec<(u64, u64)> =
                (0..n as u64).map(|i| (i * 3 + 1, (i * 7) % 50)).collect();
            let cursor_of = |u: u64| members.iter().find(|m| m.0 == u).map_or(0, |m| m.1);
            let mut inserted = GroupMembers::new();
            for &(u, c) in members.iter().rev() {
                assert!(inserted.insert(u, c, cursor_of));
            }
            let built = GroupMembers::from_sorted(&members);
            assert_eq!(built.users(), inserted.users(), "{n} members");
            for m in 0..52 {
                assert_eq!(
                    built.read_count(m, cursor_of),
                    inserted.read_count(m, cursor_of),
                    "{n} members, read count of {m}"
                );
            }
        }
    }
}

/// Pages by user id (MEMBERS): every member once, in order, whatever the
/// split between the main list and the buffer of recent joins.
#[cfg(test)]
mod page_tests {
    use std::collections::BTreeSet;

    use super::*;

    fn all_pages(m: &GroupMembers, max: usize) -> Vec<u64> {
        let (mut out, mut after) = (Vec::new(), 0);
        loop {
            let (page, more) = m.page_after(after, max);
            assert!(page.len() <= max);
            if let (false, Some(&last)) = (more, page.last()) {
                assert!(
                    m.page_after(last, 1).0.is_empty(),
                    "no member above the end"
                );
            }
            out.extend(&page);
            match (more, page.last()) {
                (true, Some(&last)) => after = last,
                _ => return out,
            }
        }
    }

    #[test]
    fn pages_cover_every_member_once_in_order() {
        let mut m = GroupMembers::new();
        let mut model = BTreeSet::new();
        assert_eq!(m.page_after(0, 10), (vec![], false));
        let mut x: u64 = 7;
        // Inline, small list, then past DIRECT_INSERT_MAX so that recent
        // joins sit in the buffer beside the main list.
        for n in [1usize, 2, 3, 500, 3_000] {
            while model.len() < n {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 44) + 1;
                assert_eq!(m.insert(u, 0, |_| 0), model.insert(u));
            }
            let want: Vec<u64> = model.iter().copied().collect();
            for max in [1, 2, 7, 64, 10_000] {
                assert_eq!(all_pages(&m, max), want, "{n} members, pages of {max}");
            }
            // A page starts after any id, member or not.
            let mid = want[want.len() / 2];
            let (page, _) = m.page_after(mid, 3);
            let expect: Vec<u64> = model.range(mid + 1..).take(3).copied().collect();
            assert_eq!(page, expect);
            let (page, more) = m.page_after(mid - 1, 0);
            assert!(page.is_empty() && more, "max 0 says whether members remain");
        }
        // One more join after a merge leaves the buffer non-empty.
        let buffered =
            |m: &GroupMembers| matches!(&m.users, Users::Many(b) if !b.recent.is_empty());
        while !buffered(&m) {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = (x >> 44) + 1;
            assert_eq!(m.insert(u, 0, |_| 0), model.insert(u));
        }
        let want: Vec<u64> = model.iter().copied().collect();
        assert_eq!(all_pages(&m, 100), want, "main list and buffer merged");
        let last = *model.iter().next_back().unwrap();
        assert_eq!(m.page_after(last, 5), (vec![], false));
    }
}

/// Read counts across the lazy tree's threshold: a list grown past
/// [`READ_COUNTS_MEMBERS_MIN`] and shrunk below half of it, with cursors
/// moving all along, answers exactly what the 0.1 representation (a tree
/// kept for every group, [`ReadCounts`]) and a brute-force count answer.
#[cfg(test)]
mod lazy_read_count_tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Join(u64, u64),
        Leave(usize),
        Ack(usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..400u64, 0..200u64).prop_map(|(u, c)| Op::Join(u, c)),
            2 => any::<usize>().prop_map(Op::Leave),
            3 => (any::<usize>(), 0..60u64).prop_map(|(i, d)| Op::Ack(i, d)),
        ]
    }

    /// Every answer of `m` against the old tree and the model.
    fn check(m: &GroupMembers, old: &ReadCounts, model: &BTreeMap<u64, u64>) {
        let cursor_of = |u: u64| model[&u];
        for msg_id in [0u64, 1, 2, 37, 100, 199, 250, 400] {
            let brute = model.values().filter(|&&c| c >= msg_id).count() as u32;
            assert_eq!(m.read_count(msg_id, cursor_of), brute, "msg {msg_id}");
            assert_eq!(old.read_count(msg_id), brute, "0.1 tree, msg {msg_id}");
        }
        let min = model.values().min().copied();
        assert_eq!(m.min_cursor(cursor_of), min);
        assert_eq!(old.min_cursor(), min);
        assert_eq!(m.len(), model.len());
        assert_eq!(m.users(), model.keys().copied().collect::<Vec<_>>());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

        #[test]
        fn answers_match_the_eager_tree_and_a_model(
            ops in proptest::collection::vec(op(), 1..600),
            bulk in 0..150usize,
        ) {
            let mut m = GroupMembers::new();
            let mut old = ReadCounts::new(0);
            let mut model: BTreeMap<u64, u64> = BTreeMap::new();
            // A bulk of joins first, so most cases cross the threshold.
            let bulk_ops = (0..bulk as u64).map(|u| Op::Join(1000 + u, u % 7));
            for op in bulk_ops.chain(ops) {
                let had_tree = m.has_tree();
                match op {
                    Op::Join(u, c) => {
                        // The cursor table holds the membership first.
                        let fresh = !model.contains_key(&u);
                        if fresh {
                            model.insert(u, c);
                            old.insert(c);
                        }
                        let cursors = model.clone();
                        prop_assert_eq!(m.insert(u, c, |x| cursors[&x]), fresh);
                    }
                    Op::Leave(i) if !model.is_empty() => {
                        let u = *model.keys().nth(i % model.len()).unwrap();
                        let c = model.remove(&u).unwrap();
                        old.remove(c);
                        prop_assert!(m.remove(u, c));
                        prop_assert!(!m.remove(u, c));
                    }
                    Op::Ack(i, d) if !model.is_empty() => {
                        let u = *model.keys().nth(i % model.len()).unwrap();
                        let c = model[&u];
                        model.insert(u, c + d);
                        old.advance(c, c + d);
                        m.advance(c, c + d);
                    }
                    _ => {}
                }
                // Built past the threshold, dropped at half of it.
                let expected = m.len() > READ_COUNTS_MEMBERS_MIN / 2
                    && (had_tree || m.len() > READ_COUNTS_MEMBERS_MIN);
                prop_assert_eq!(m.has_tree(), expected);
                check(&m, &old, &model);
            }
        }
    }

    #[test]
    fn small_lists_are_inline_and_a_tree_exists_only_above_the_threshold() {
        let mut m = GroupMembers::new();
        let mut model = BTreeMap::new();
        for u in 1..=2u64 {
            model.insert(u, 0);
            assert!(m.insert(u, 0, |x| model[&x]));
        }
        assert_eq!(m.heap_bytes(), 0, "two members live in the group itself");
        for u in 3..=READ_COUNTS_MEMBERS_MIN as u64 {
            model.insert(u, u);
            assert!(m.insert(u, u, |x| model[&x]));
        }
        assert!(!m.has_tree(), "{READ_COUNTS_MEMBERS_MIN} members: no tree");
        model.insert(999, 5);
        assert!(m.insert(999, 5, |x| model[&x]));
        assert!(m.has_tree(), "one more: the tree is built from the cursors");
        assert_eq!(
            m.read_count(10, |x| model[&x]),
            model.values().filter(|&&c| c >= 10).count() as u32
        );
        for u in 1..=(READ_COUNTS_MEMBERS_MIN as u64 / 2 + 1) {
            assert!(m.remove(u, model.remove(&u).unwrap()));
        }
        assert!(!m.has_tree(), "half the threshold: the tree is dropped");
        while model.len() > 2 {
            let (&u, &c) = model.iter().next().unwrap();
            model.remove(&u);
            assert!(m.remove(u, c));
        }
        assert_eq!(m.heap_bytes(), 0, "back inline");
        assert_eq!(m.users(), model.keys().copied().collect::<Vec<_>>());
    }
}
