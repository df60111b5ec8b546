//! One shard of the cursor table: its users and each user's list of
//! memberships, sorted by group slot. Every list of the shard lives in one
//! store (a `Vec<Membership>`); a user holds a range of it (`start`, `len`
//! and `cap`, 12 bytes), found through a [`UserIndex`].
//!
//! Why one store, not a `Vec` per user: a join burst grows millions of
//! small lists at once, each through the allocator's size classes, and
//! each growth frees the list's block in a smaller class. A class's page
//! goes back to the system only once every block in it is free, so the
//! blocks freed by lists that moved on stay resident among the lists that
//! stayed (about 3 bytes per membership after the population's joins,
//! above what the allocator counts). Here the lists are ranges of one
//! large block, and the room that lists leave behind when they move is
//! given back by compaction, not by the allocator.
//!
//! Growth: a list whose range is full moves to the end of the store with
//! a quarter of its length (at least one) as room to grow, and its old
//! range becomes waste; the list at the end of the store grows in place.
//! A leave leaves room at the end of its list's range. When the waste
//! (the store's length less the ranges' capacities) passes an eighth of
//! the store, the shard is compacted: every range is copied, with its
//! room, into a new store. A compaction copies the shard once for waste
//! of an eighth of it, which the moves that made it paid for (a move
//! copies its list and wastes its old range): amortised O(1) per
//! membership. The room stays, so a compaction in a burst does not make
//! every list move at its next join. [`Shard::compact_if_slack`]
//! compacts without room, for a caller that runs between bursts (the
//! checkpoint thread), so an idle table holds its memberships nearly
//! exactly.
//!
//! The store grows by an eighth: its unused capacity is at most an eighth
//! of it, and that part of a large block is never written, so it is not
//! resident. A compaction in a burst leaves it an eighth of room; one
//! between bursts makes it exactly as long as the memberships.
//!
//! A compaction holds the shard's write lock while it copies the shard
//! (16 bytes per membership: 2.7 MB, about a millisecond, per shard of a
//! node with 10.8 million memberships): moves of the shard's cursors wait
//! that long, during bursts of joins and leaves only.
//!
//! Invariants: the ranges of the users are disjoint and inside the store;
//! `live` is the sum of their lengths and `reserved` of their capacities; each range's first `len` entries
//! are the user's memberships, sorted by slot, with distinct slots; a user
//! in the index has at least one membership.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::members::user_index::UserIndex;

/// One membership, as the user's side holds it.
#[repr(C)]
pub(super) struct Membership {
    /// `cursor << 2 | checkpoint_dirty << 1 | flush_dirty`.
    pub(super) cursor: AtomicU64,
    /// The group's slot (dense small integer standing for the group id).
    pub(super) slot: u32,
    /// First msg_id this member may read in history, if it fits.
    pub(super) join_lo: u32,
}

impl Membership {
    /// A copy, for a move of the list it is in (the caller holds the shard
    /// exclusively: no cursor moves meanwhile).
    fn copied(&self) -> Membership {
        Membership {
            cursor: AtomicU64::new(self.cursor.load(Ordering::Relaxed)),
            slot: self.slot,
            join_lo: self.join_lo,
        }
    }

    /// What fills a range's room: never read (only a range's first `len`
    /// entries are memberships).
    fn room() -> Membership {
        Membership {
            cursor: AtomicU64::new(0),
            slot: 0,
            join_lo: 0,
        }
    }
}

/// A user's range of the store.
#[derive(Default, Clone, Copy)]
struct Range {
    start: u32,
    len: u32,
    cap: u32,
}

impl Range {
    fn of(self) -> std::ops::Range<usize> {
        self.start as usize..(self.start + self.len) as usize
    }

    fn end(self) -> usize {
        (self.start + self.cap) as usize
    }
}

/// Why a membership could not be added.
#[derive(Debug, PartialEq, Eq)]
pub enum InsertError {
    AlreadyMember,
    GroupsPerUserLimit { max: usize },
}

/// Waste (ranges that lists moved out of) of at most one eighth of the
/// store before a compaction.
const WASTE_SHARE: usize = 8;
/// Waste, room and unused capacity of at most one thirty-second of the
/// store's capacity after [`Shard::compact_if_slack`].
const IDLE_WASTE_SHARE: usize = 32;
/// No compaction for less waste than this (1 KiB: a tiny shard would
/// compact at every other move).
const WASTE_MIN: usize = 64;

#[derive(Default)]
pub(super) struct Shard {
    users: UserIndex<Range>,
    store: Vec<Membership>,
    /// Memberships in the store (module invariant).
    live: usize,
    /// Entries of the store in users' ranges (module invariant).
    reserved: usize,
}

impl Shard {
    /// The user's memberships, sorted by slot.
    pub(super) fn list(&self, hash: u64, user: u64) -> Option<&[Membership]> {
        let range = self.users.get(hash, user)?;
        Some(&self.store[range.of()])
    }

    pub(super) fn list_mut(&mut self, hash: u64, user: u64) -> Option<&mut [Membership]> {
        let range = *self.users.get(hash, user)?;
        Some(&mut self.store[range.of()])
    }

    /// Memberships in the shard. O(1).
    pub(super) fn memberships(&self) -> usize {
        self.live
    }

    /// Every user and their memberships, in the order of the users' index
    /// (the store's order, but for lists moved since the last compaction).
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &[Membership])> {
        self.users
            .iter()
            .map(|(user, range)| (user, &self.store[range.of()]))
    }

    /// Adds `m` to `user`'s list, which holds at most `max` memberships;
    /// returns the list's length.
    pub(super) fn insert(
        &mut self,
        hash: u64,
        user: u64,
        rehash: impl Fn(u64) -> u64,
        m: Membership,
        max: Option<usize>,
    ) -> Result<usize, InsertError> {
        let range = self.users.get(hash, user).copied().unwrap_or_default();
        let at = match self.store[range.of()].binary_search_by_key(&m.slot, |m| m.slot) {
            Ok(_) => return Err(InsertError::AlreadyMember),
            Err(at) => at,
        };
        if let Some(max) = max.filter(|&max| range.len as usize >= max) {
            return Err(InsertError::GroupsPerUserLimit { max });
        }
        let range = if range.len < range.cap {
            range
        } else {
            self.give_room(range, 1)
        };
        let place = &mut self.store[range.start as usize..=(range.start + range.len) as usize];
        place[range.len as usize] = m;
        place[at..].rotate_right(1);
        let range = Range {
            len: range.len + 1,
            ..range
        };
        *self
            .users
            .get_or_insert_with(hash, user, rehash, Range::default) = range;
        self.live += 1;
        self.compact_if_waste_over(WASTE_SHARE);
        Ok(range.len as usize)
    }

    /// `range` (full, or empty for a new user) with room for `more`
    /// memberships: grown in place at the end of the store, or moved there
    /// with a quarter of its length more (module docs).
    fn give_room(&mut self, range: Range, more: u32) -> Range {
        let at_end = range.cap > 0 && range.end() == self.store.len();
        let (start, cap) = if at_end {
            (range.start, range.cap + more)
        } else {
            let cap = range.len + (range.len / 4).max(more);
            (to_u32(self.store.len()), cap)
        };
        self.reserve((start + cap) as usize - self.store.len());
        if !at_end {
            for i in range.of() {
                let m = self.store[i].copied();
                self.store.push(m);
            }
        }
        self.store
            .resize_with((start + cap) as usize, Membership::room);
        self.reserved += (cap - range.cap) as usize;
        Range {
            start,
            len: range.len,
            cap,
        }
    }

    /// Room for `more` entries at the end of the store, growing it by an
    /// eighth at least (module docs).
    fn reserve(&mut self, more: usize) {
        let free = self.store.capacity() - self.store.len();
        if free < more {
            self.store
                .reserve_exact(more.max(self.store.len() / 8).max(16));
        }
    }

    /// Removes `user`'s membership of `slot` and returns it.
    pub(super) fn remove(
        &mut self,
        hash: u64,
        user: u64,
        slot: u32,
        rehash: impl Fn(u64) -> u64,
    ) -> Option<Membership> {
        let range = self.users.get_mut(hash, user)?;
        let list = &mut self.store[range.of()];
        let at = list.binary_search_by_key(&slot, |m| m.slot).ok()?;
        list[at..].rotate_left(1);
        let m = list[list.len() - 1].copied();
        range.len -= 1;
        let range = *range;
        self.live -= 1;
        if range.len == 0 {
            self.users.remove(hash, user, rehash);
            self.reserved -= range.cap as usize;
            if range.end() == self.store.len() {
                self.store.truncate(range.start as usize);
            }
        }
        self.compact_if_waste_over(WASTE_SHARE);
        Some(m)
    }

    /// Room for `users` more users and `memberships` more memberships.
    pub(super) fn reserve_for(
        &mut self,
        users: usize,
        memberships: usize,
        rehash: impl Fn(u64) -> u64,
    ) {
        self.users.reserve(users, rehash);
        // By an eighth at least: a load in batches reserves once per batch,
        // and an exact reservation would copy the store every time.
        self.reserve(memberships);
    }

    /// Adds memberships the user does not have (a checkpoint's, restored),
    /// as `insert` does each, with no limit. The list takes no room beyond
    /// them. Returns the list's length.
    pub(super) fn extend(
        &mut self,
        hash: u64,
        user: u64,
        rehash: impl Fn(u64) -> u64,
        add: impl ExactSizeIterator<Item = Membership>,
    ) -> usize {
        let more = to_u32(add.len());
        let range = self.users.get(hash, user).copied().unwrap_or_default();
        if more == 0 {
            return range.len as usize;
        }
        let range = if range.cap - range.len >= more {
            range
        } else if range.cap == 0 {
            // A new user (all of a recovery's): exactly at the end.
            self.reserve(more as usize);
            self.reserved += more as usize;
            Range {
                start: to_u32(self.store.len()),
                len: 0,
                cap: 0,
            }
        } else {
            self.give_room(range, more)
        };
        let from = (range.start + range.len) as usize;
        for (i, m) in add.enumerate() {
            match self.store.get_mut(from + i) {
                Some(place) => *place = m,
                None => self.store.push(m),
            }
        }
        let range = Range {
            len: range.len + more,
            cap: range.cap.max(range.len + more),
            ..range
        };
        self.store[range.of()].sort_unstable_by_key(|m| m.slot);
        *self
            .users
            .get_or_insert_with(hash, user, rehash, Range::default) = range;
        self.live += more as usize;
        self.compact_if_waste_over(WASTE_SHARE);
        range.len as usize
    }

    /// Compacts the shard, keeping each list's room, if the ranges that
    /// lists moved out of (module docs) are more than `1 / share` of its
    /// store (and more than a few).
    fn compact_if_waste_over(&mut self, share: usize) {
        let waste = self.store.len() - self.reserved;
        if waste >= WASTE_MIN && waste * share > self.store.len() {
            // Room to grow by an eighth before the store is copied again.
            self.compact(true, self.reserved + self.reserved / 8);
        }
    }

    /// Every range copied into a new store of `capacity`, with its room if
    /// `keep_room`, else without (module docs).
    fn compact(&mut self, keep_room: bool, capacity: usize) {
        let mut store = Vec::with_capacity(capacity);
        for range in self.users.values_mut() {
            let start = to_u32(store.len());
            store.extend(self.store[range.of()].iter().map(Membership::copied));
            let cap = if keep_room { range.cap } else { range.len };
            store.resize_with(start as usize + cap as usize, Membership::room);
            *range = Range {
                start,
                len: range.len,
                cap,
            };
        }
        self.store = store;
        if !keep_room {
            self.reserved = self.live;
        }
    }

    /// Compacts the shard if its waste, room and unused capacity are more
    /// than a thirty-second of its store's capacity: for a caller between
    /// bursts (module docs), after which the store holds its memberships
    /// nearly exactly.
    pub(super) fn compact_if_slack(&mut self) {
        let slack = self.store.capacity() - self.live;
        if slack >= WASTE_MIN && slack * IDLE_WASTE_SHARE > self.store.capacity() {
            self.compact(false, self.live);
        }
    }

    /// Heap bytes of the index and the store.
    pub(super) fn heap_bytes(&self) -> usize {
        self.users.heap_bytes() + self.store.capacity() * std::mem::size_of::<Membership>()
    }

    #[cfg(test)]
    pub(super) fn waste(&self) -> usize {
        self.store.len() - self.reserved
    }

    #[cfg(test)]
    pub(super) fn store_len(&self) -> usize {
        self.store.len()
    }
}

/// A store position. Invariant: a shard holds far fewer than 2^32
/// memberships (memory bounds them: 64 GiB of them per shard).
fn to_u32(n: usize) -> u32 {
    u32::try_from(n).expect("invariant: memberships per shard fit u32")
}

#[cfg(test)]
mod tests {
    use std::collections::btree_map::Entry;
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;

    fn membership(slot: u32, cursor: u64) -> Membership {
        Membership {
            cursor: AtomicU64::new(cursor),
            slot,
            join_lo: slot ^ 7,
        }
    }

    fn hash(user: u64) -> u64 {
        // Few distinct hashes: the index tells users apart by id.
        user % 5
    }

    fn contents(shard: &Shard) -> BTreeMap<u64, Vec<(u32, u64, u32)>> {
        shard
            .iter()
            .map(|(user, list)| {
                let list = list
                    .iter()
                    .map(|m| (m.slot, m.cursor.load(Ordering::Relaxed), m.join_lo))
                    .collect();
                (user, list)
            })
            .collect()
    }

    /// Any sequence of joins, leaves and restored lists leaves every user
    /// with what a map of sorted lists holds (cursors kept through moves
    /// and compactions), and the waste within its bound.
    #[test]
    fn the_lists_hold_what_a_map_holds_through_moves_and_compactions() {
        let op = (0u8..10, 0u64..40, 0u32..64);
        let ops = proptest::collection::vec(op, 0..3_000);
        proptest!(ProptestConfig::with_cases(48), |(ops in ops)| {
            let mut shard = Shard::default();
            let mut model: BTreeMap<u64, BTreeMap<u32, u64>> = BTreeMap::new();
            for (n, &(kind, user, slot)) in ops.iter().enumerate() {
                let cursor = n as u64;
                let had = model.get(&user).map_or(0, BTreeMap::len);
                match kind {
                    0..=5 => {
                        let max = if kind == 0 { Some(3) } else { None };
                        let got = shard.insert(hash(user), user, hash, membership(slot, cursor), max);
                        let list = model.entry(user).or_default();
                        let want = match list.entry(slot) {
                            Entry::Occupied(_) => Err(InsertError::AlreadyMember),
                            Entry::Vacant(_) if max.is_some_and(|max| had >= max) => {
                                Err(InsertError::GroupsPerUserLimit { max: 3 })
                            }
                            Entry::Vacant(place) => {
                                place.insert(cursor);
                                Ok(had + 1)
                            }
                        };
                        prop_assert_eq!(got, want);
                    }
                    6..=8 => {
                        let got = shard.remove(hash(user), user, slot, hash);
                        let want = model.get_mut(&user).and_then(|l| l.remove(&slot));
                        prop_assert_eq!(got.map(|m| m.cursor.load(Ordering::Relaxed)), want);
                    }
                    _ => {
                        // A restore of slots the user does not have.
                        let list = model.entry(user).or_default();
                        let add: BTreeSet<u32> = (slot..slot + 5)
                            .map(|s| s * 3 % 97)
                            .filter(|s| !list.contains_key(s))
                            .collect();
                        for &s in &add {
                            list.insert(s, cursor);
                        }
                        let add: Vec<_> = add.iter().map(|&s| membership(s, cursor)).collect();
                        shard.extend(hash(user), user, hash, add.into_iter());
                    }
                }
                model.retain(|_, l| !l.is_empty());
                prop_assert!(
                    shard.waste() < WASTE_MIN || shard.waste() * WASTE_SHARE <= shard.store_len(),
                    "waste {} of {}", shard.waste(), shard.store_len()
                );
            }
            let want: BTreeMap<u64, Vec<(u32, u64, u32)>> = model
                .iter()
                .map(|(&u, l)| (u, l.iter().map(|(&s, &c)| (s, c, s ^ 7)).collect()))
                .collect();
            prop_assert_eq!(contents(&shard), want.clone());
            let live = want.values().map(Vec::len).sum::<usize>();
            prop_assert_eq!(shard.live, live);
            let reserved: usize = shard.users.values().map(|r| r.cap as usize).sum();
            prop_assert_eq!(shard.reserved, reserved);
            shard.compact(true, 0);
            prop_assert_eq!(shard.waste(), 0);
            prop_assert_eq!(contents(&shard), want.clone());
            shard.compact(false, 0);
            prop_assert_eq!(shard.store_len(), live);
            prop_assert_eq!(contents(&shard), want);
        });
    }

    /// A join burst (many users' lists growing at once, interleaved: what
    /// left freed blocks of every size class resident when each list was
    /// a block of its own) leaves at most an eighth of the store as room
    /// and waste, and a thirty-second once compacted between bursts.
    #[test]
    fn a_burst_of_interleaved_growth_leaves_little_room() {
        let mut shard = Shard::default();
        let (users, rounds) = (5_000u64, 20u32);
        for slot in 0..rounds {
            for user in 0..users {
                // Not every user in every round: lists of different lengths.
                if (user + u64::from(slot)) % 3 != 0 {
                    let m = membership(slot, 0);
                    shard.insert(hash(user), user, hash, m, None).unwrap();
                }
            }
        }
        let live = shard.live;
        assert!(
            shard.waste() * WASTE_SHARE <= shard.store_len(),
            "waste {} of {}",
            shard.waste(),
            shard.store_len()
        );
        shard.compact_if_slack();
        let slack = shard.store.capacity() - live;
        assert!(
            slack * IDLE_WASTE_SHARE <= shard.store.capacity(),
            "{slack} of {} unused after a compaction between bursts",
            shard.store.capacity()
        );
        // The store's capacity: at most an eighth above what it holds, and
        // 12 bytes of range per user besides the index.
        let per_membership = shard.heap_bytes() as f64 / live as f64;
        assert!(per_membership < 16.0 * 1.2 + 48.0 * users as f64 / live as f64);
    }
}
