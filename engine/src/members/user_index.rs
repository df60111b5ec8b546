//! Users and a value each, for one shard of the cursor table: the entries
//! `(user, value)` in a dense list, found through a hash table of 4-byte
//! indexes into it.
//!
//! Why not a `HashMap<u64, V>`: its buckets hold whole entries, and a
//! table sits between 7/16 and 7/8 full (it doubles when 7/8 full), so a
//! 32-byte entry costs 38-75 bytes per user, by the luck of the user
//! count (at 1,000,000 users in 64 shards every shard had just doubled:
//! 69 bytes). Here an empty bucket costs 5 bytes (index and control byte)
//! and the list grows by an eighth: 38-46 bytes per user.
//!
//! The caller hashes the user and passes the hash (the cursor table hashes
//! a user once, for its shard and for this index); `rehash` is the same
//! function, for the entries the table moves when it grows.
//!
//! Invariant: the index holds one bucket per entry, with the entry's
//! position in the list, under the hash of the entry's user.

use hashbrown::HashTable;

pub struct UserIndex<V> {
    /// Positions in `entries`, by the hash of their user (module invariant).
    index: HashTable<u32>,
    entries: Vec<(u64, V)>,
}

impl<V> Default for UserIndex<V> {
    fn default() -> Self {
        UserIndex {
            index: HashTable::new(),
            entries: Vec::new(),
        }
    }
}

impl<V> UserIndex<V> {
    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }

    /// Where `user`'s entry is.
    fn position(&self, hash: u64, user: u64) -> Option<usize> {
        let entries = &self.entries;
        let at = self.index.find(hash, |&i| entries[i as usize].0 == user)?;
        Some(*at as usize)
    }

    pub fn get(&self, hash: u64, user: u64) -> Option<&V> {
        let at = self.position(hash, user)?;
        Some(&self.entries[at].1)
    }

    pub fn get_mut(&mut self, hash: u64, user: u64) -> Option<&mut V> {
        let at = self.position(hash, user)?;
        Some(&mut self.entries[at].1)
    }

    /// The value of `user`, made by `make` if it has none.
    pub fn get_or_insert_with(
        &mut self,
        hash: u64,
        user: u64,
        rehash: impl Fn(u64) -> u64,
        make: impl FnOnce() -> V,
    ) -> &mut V {
        let at = match self.position(hash, user) {
            Some(at) => at,
            None => {
                let at = self.entries.len();
                // Invariant: a shard holds far fewer than 2^32 users (each
                // has a membership, and memory bounds those).
                let position = u32::try_from(at).expect("invariant: users per shard fit u32");
                if self.entries.len() == self.entries.capacity() {
                    // By an eighth: amortised O(1), at most 1/8 unused.
                    self.entries.reserve_exact((at / 8).max(4));
                }
                self.entries.push((user, make()));
                let entries = &self.entries;
                self.index
                    .insert_unique(hash, position, |&i| rehash(entries[i as usize].0));
                at
            }
        };
        &mut self.entries[at].1
    }

    /// Removes `user`'s entry and returns its value. The last entry moves
    /// into its place: O(1).
    pub fn remove(&mut self, hash: u64, user: u64, rehash: impl Fn(u64) -> u64) -> Option<V> {
        let entries = &self.entries;
        let found = self
            .index
            .find_entry(hash, |&i| entries[i as usize].0 == user)
            .ok()?;
        let (at, _) = found.remove();
        let (at, last) = (at as usize, self.entries.len() - 1);
        let (_, value) = self.entries.swap_remove(at);
        if at != last {
            let moved = self.entries[at].0;
            // Invariant: every entry is indexed under its user's hash.
            let slot = self
                .index
                .find_mut(rehash(moved), |&i| i as usize == last)
                .expect("invariant: every entry is indexed");
            *slot = at as u32;
        }
        if self.entries.capacity() > 2 * self.entries.len() + 16 {
            self.entries
                .shrink_to(self.entries.len() + self.entries.len() / 8);
        }
        Some(value)
    }

    /// Room for `additional` more users without growing. The list takes
    /// exactly that when empty (a load knows its users), and grows by at
    /// least an eighth otherwise: a load in batches reserves for each
    /// batch's new users, and an exact reservation copied the whole list
    /// at every batch.
    pub fn reserve(&mut self, additional: usize, rehash: impl Fn(u64) -> u64) {
        let len = self.entries.len();
        if self.entries.capacity() - len < additional {
            self.entries.reserve_exact(additional.max(len / 8));
        }
        let entries = &self.entries;
        self.index
            .reserve(additional, |&i| rehash(entries[i as usize].0));
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> {
        self.entries.iter().map(|(user, value)| (*user, value))
    }

    #[cfg(test)]
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.entries.iter().map(|(_, value)| value)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries.iter_mut().map(|(_, value)| value)
    }

    /// Heap bytes of the index and the list (not what the values hold).
    pub fn heap_bytes(&self) -> usize {
        // A bucket: its index and one control byte.
        self.index.capacity() * (std::mem::size_of::<u32>() + 1)
            + self.entries.capacity() * std::mem::size_of::<(u64, V)>()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::hash::BuildHasher;

    use proptest::prelude::*;

    use super::*;

    /// Any sequence of inserts and removes leaves the index answering what
    /// a `HashMap` answers, with colliding hashes too.
    #[test]
    fn the_index_answers_what_a_map_answers() {
        let ops = proptest::collection::vec((any::<bool>(), 0u64..300), 0..2_000);
        proptest!(ProptestConfig::with_cases(64), |(ops in ops, collide in any::<bool>())| {
            let hasher = std::collections::hash_map::RandomState::new();
            // Few distinct hashes: the index must tell users apart by id.
            let hash = |u: u64| if collide { u % 7 } else { hasher.hash_one(u) };
            let mut index = UserIndex::default();
            let mut model = HashMap::new();
            for (n, &(insert, user)) in ops.iter().enumerate() {
                if insert {
                    *index.get_or_insert_with(hash(user), user, hash, || 0) += n;
                    *model.entry(user).or_insert(0) += n;
                } else {
                    prop_assert_eq!(index.remove(hash(user), user, hash), model.remove(&user));
                }
                prop_assert_eq!(index.len(), model.len());
            }
            for user in 0..300 {
                prop_assert_eq!(index.get(hash(user), user), model.get(&user));
            }
            let mut all: Vec<(u64, usize)> = index.iter().map(|(u, v)| (u, *v)).collect();
            all.sort_unstable();
            let mut want: Vec<(u64, usize)> = model.into_iter().collect();
            want.sort_unstable();
            prop_assert_eq!(all, want);
        });
    }

    /// Reservations for a few new users at a time (a load in batches)
    /// grow the list geometrically: an exact reservation each time copied
    /// the whole list at every batch. A first reservation takes exactly
    /// what it asks for (a load at open knows its users).
    #[test]
    fn reservations_in_batches_grow_the_list_geometrically() {
        let hasher = std::collections::hash_map::RandomState::new();
        let hash = |u: u64| hasher.hash_one(u);
        let mut index = UserIndex::default();
        index.reserve(1_000, hash);
        assert_eq!(index.entries.capacity(), 1_000);
        let mut grown = 0;
        for batch in 0..1_000u64 {
            let before = index.entries.capacity();
            index.reserve(10, hash);
            for user in batch * 10..batch * 10 + 10 {
                index.get_or_insert_with(hash(user), user, hash, || ());
            }
            grown += usize::from(index.entries.capacity() != before);
        }
        assert_eq!(index.len(), 10_000);
        // From 1,000 to 10,000 by an eighth at least: 19 growths at most.
        assert!(grown <= 20, "the list grew {grown} times in 1,000 batches");
    }

    /// Per user, the index costs what its entry costs plus a few bytes:
    /// the list is at most an eighth too long and an empty bucket holds 5
    /// bytes, where a map's empty bucket holds a whole entry.
    #[test]
    fn a_user_costs_its_entry_and_a_few_bytes() {
        let hasher = std::collections::hash_map::RandomState::new();
        let hash = |u: u64| hasher.hash_one(u);
        // Just past a power-of-two table's 7/8: a map doubled here.
        let users = 15_000u64;
        let mut index = UserIndex::default();
        for user in 0..users {
            index.get_or_insert_with(hash(user), user, hash, || [0u64; 3]);
        }
        let per_user = index.heap_bytes() as f64 / users as f64;
        // A 32-byte entry; 16,384 buckets of 5 bytes at most, and at most an
        // eighth of the list (and its first 4 entries) unused.
        assert!(
            per_user < 32.0 * 1.125 + 32768.0 * 5.0 / users as f64,
            "{per_user:.1} bytes per user"
        );
    }
}
