//! The registry of groups: id -> group, and slot -> group. A slot is a dense
//! small integer given to each live group so the cursor table can name a
//! group in 4 bytes; slots of deleted groups are reused. It also indexes
//! the groups with a retention policy (anything but keep-everything), so
//! the checkpointer's periodic retention planning visits those only
//! (O(groups with a policy), not O(groups)).
//!
//! Invariant: `retained` holds exactly the slots of registered groups whose
//! policy is not keep-everything: a policy is set only through
//! [`Catalog::set_retention`] (applied entries, restored checkpoints), and
//! [`Catalog::remove`] drops the slot before it can be reused.
//!
//! Memory: `by_id` holds only slots (4 bytes and a control byte per
//! bucket, at a load of 7/16 to 7/8: 6 to 11 bytes per group), hashed by
//! their group's id, which it reads through `by_slot` (8 bytes per group);
//! a map from id to group would hold the id and a pointer (17 bytes per
//! bucket, 20 to 39 per group). Measured with the rest of a group by
//! `engine/tests/memory.rs`.
//!
//! Invariant: `by_id` holds exactly the slots whose `by_slot` entry is a
//! group, each once, under the hash of that group's id, in the shard that
//! hash picks (both are changed together, by `insert` and `remove` only).
//! The ids are hashed with std's randomly keyed SipHash: they come from
//! clients.
//!
//! `by_id` is [`ID_SHARDS`] tables, not one: a table that grows rehashes
//! every entry it holds, and each rehash reads the group through
//! `by_slot` (a cache miss). One table of 8 M groups would do that 8 M
//! times under the registry's write lock, seconds on a busy machine, while
//! every request waits; a shard does a 64th of it.

use std::collections::hash_map::RandomState;
use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;

use parking_lot::RwLock;

use crate::commit::context::Context;
use crate::error::Result;
use crate::group::{Group, LogSlot};
use crate::logs::retention::Retention;
use crate::members::cursors::CursorTable;

/// Tables of `by_id` (module docs).
const ID_SHARDS: usize = 64;

pub struct Catalog {
    /// Slots, by the hash of their group's id, in the shard that hash
    /// picks ([`shard_of`]; module invariant).
    by_id: Box<[HashTable<u32>]>,
    /// Slots in `by_id`: the registered groups.
    len: usize,
    hasher: RandomState,
    by_slot: Vec<Option<Arc<Group>>>,
    free: Vec<u32>,
    /// Slots of the groups with a retention policy (module invariant).
    retained: BTreeSet<u32>,
    /// The saved state not registered yet (`state/lazy.rs`): while it is
    /// here, a group missing from the catalog may still be in it.
    pending: Option<Arc<dyn Unregistered>>,
}

/// Saved groups not registered yet, which a lookup registers on demand
/// (`state/lazy.rs` implements it over a checkpoint's runs).
pub(crate) trait Unregistered: Send + Sync {
    /// The group `id`, registered now from the saved state unless someone
    /// did (then the catalog answers); `None`: there is no such group. The
    /// caller holds no catalog lock.
    fn take(
        &self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        cursors: &CursorTable,
        id: u64,
    ) -> Result<Option<Arc<Group>>>;

    /// The saved groups `user` may be a member of (a superset, from the
    /// user index: each is checked by [`Self::take`], whose member rows
    /// decide), or `None` when the saved state holds no complete index
    /// (then only the whole load tells a user's groups).
    fn groups_of_user(&self, ctx: &Context, user: u64) -> Result<Option<Vec<u64>>>;

    /// What [`Self::take`] answers for `id`, told without reading the
    /// saved state and without waiting for a lock the loader holds
    /// through a batch (the event loop asks it): `NeedsLookup` when only
    /// [`Self::take`] tells.
    fn try_take(&self, catalog: &RwLock<Catalog>, id: u64) -> Result<Found>;

    /// Whether every saved group of `user` is registered, told without
    /// reading the runs (one lookup in a set): `Err` once the load
    /// stopped at damage.
    fn user_groups(&self, user: u64) -> Result<UserGroups>;

    /// Every saved group the index names for `user` is registered now
    /// ([`Catalog::find_groups_of_user`] did it): [`Self::user_groups`]
    /// says `Registered` from now on.
    fn mark_user_registered(&self, user: u64);
}

/// What a lookup of a group finds without reading the saved state
/// ([`Catalog::try_find`]).
pub(crate) enum Found {
    /// [`Catalog::find`]'s answer: the group, or `None` (no such group).
    Final(Option<Arc<Group>>),
    /// The group is neither registered nor known absent: only a lookup in
    /// the saved state ([`Catalog::find`], which may read the disk) tells.
    NeedsLookup,
}

/// Whether the cursor table holds every membership of a user while saved
/// state loads in the background ([`Unregistered::user_groups`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UserGroups {
    /// Every saved group the user index names for the user is registered:
    /// with the groups made since (registered when made), the cursor
    /// table holds every membership of the user, and keeps holding them
    /// (a registered group stays so until deleted, which removes its
    /// memberships), so a count of the user's groups is exact.
    Registered,
    /// Not yet: a lookup of the user index in the runs and of each group it
    /// names registers them ([`Catalog::find_groups_of_user`]).
    Unregistered,
    /// The saved state holds no complete user index: only the whole load
    /// registers every group of a user.
    Unindexed,
}

impl Default for Catalog {
    fn default() -> Self {
        Catalog {
            by_id: (0..ID_SHARDS).map(|_| HashTable::new()).collect(),
            len: 0,
            hasher: RandomState::default(),
            by_slot: Vec::new(),
            free: Vec::new(),
            retained: BTreeSet::new(),
            pending: None,
        }
    }
}

/// The shard of `by_id` an id's hash picks: bits the shard's own table
/// does not use for its buckets (the low ones) nor its tags (the top 7).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % ID_SHARDS
}

/// The group in `slot` of `by_slot`.
fn in_slot(by_slot: &[Option<Arc<Group>>], slot: u32) -> Option<&Arc<Group>> {
    by_slot.get(slot as usize)?.as_ref()
}

/// The hash of the id of the group in `slot`, which holds one (module
/// invariant: `by_id` names only such slots).
fn slot_hash(hasher: &RandomState, by_slot: &[Option<Arc<Group>>], slot: u32) -> u64 {
    // Invariant: by_id holds only slots that hold a group.
    let group = in_slot(by_slot, slot).expect("invariant: a slot of by_id holds a group");
    #[cfg(test)]
    tests::SLOT_HASHES.with(|n| n.set(n.get() + 1));
    hasher.hash_one(group.id)
}

impl Catalog {
    pub fn get(&self, id: u64) -> Option<&Arc<Group>> {
        let hash = self.hasher.hash_one(id);
        let slot = self.by_id[shard_of(hash)].find(hash, |&s| {
            in_slot(&self.by_slot, s).is_some_and(|g| g.id == id)
        })?;
        in_slot(&self.by_slot, *slot)
    }

    /// The saved state still loading in the background, if any.
    pub(crate) fn pending(&self) -> Option<&Arc<dyn Unregistered>> {
        self.pending.as_ref()
    }

    /// Starts (`Some`) or ends (`None`) a load in the background.
    pub(crate) fn set_pending(&mut self, pending: Option<Arc<dyn Unregistered>>) {
        self.pending = pending;
    }

    /// The group `id`: registered, or, while saved state loads in the
    /// background and no one registered it yet, registered now from it.
    /// `None`: no such group. The caller holds no catalog lock: every
    /// lookup of a group by id goes through here (or through [`Self::get`]
    /// once no load is pending).
    pub(crate) fn find(
        catalog: &RwLock<Catalog>,
        ctx: &Context,
        cursors: &CursorTable,
        id: u64,
    ) -> Result<Option<Arc<Group>>> {
        let pending = {
            let c = catalog.read();
            if let Some(g) = c.get(id) {
                return Ok(Some(g.clone()));
            }
            match c.pending() {
                Some(p) => p.clone(),
                None => return Ok(None),
            }
        };
        pending.take(ctx, catalog, cursors, id)
    }

    /// [`Self::find`] without reading the saved state: its answer when
    /// the catalog holds the group or the saved state tells that it is
    /// final (`Unregistered::try_take`), `NeedsLookup` otherwise (then
    /// [`Self::find`] on a thread that may wait for the disk: the
    /// maintenance worker's, `Engine::try_group`). Never waits for the
    /// loader.
    pub(crate) fn try_find(catalog: &RwLock<Catalog>, id: u64) -> Result<Found> {
        let pending = {
            let c = catalog.read();
            if let Some(g) = c.get(id) {
                return Ok(Found::Final(Some(g.clone())));
            }
            match c.pending() {
                Some(p) => p.clone(),
                None => return Ok(Found::Final(None)),
            }
        };
        pending.try_take(catalog, id)
    }

    /// Registers every saved group `user` is a member of, so that the
    /// cursor table holds all of the user's memberships: `true` when done
    /// (or no load is pending), `false` when the saved state holds no
    /// complete user index (then only the whole load does it). Each group
    /// the index names goes through [`Self::find`]: a stale entry costs a
    /// lookup and registers nothing of the user.
    ///
    /// Done once per user and load: the user is marked then, and later
    /// calls cost one lookup in a set. Reads the mapped runs: never on the
    /// event loop (the maintenance worker does it for requests,
    /// `Engine::try_user_groups`).
    pub(crate) fn find_groups_of_user(
        catalog: &RwLock<Catalog>,
        ctx: &Context,
        cursors: &CursorTable,
        user: u64,
    ) -> Result<bool> {
        let Some(pending) = catalog.read().pending().cloned() else {
            return Ok(true);
        };
        match pending.user_groups(user)? {
            UserGroups::Registered => return Ok(true),
            UserGroups::Unindexed => return Ok(false),
            UserGroups::Unregistered => {}
        }
        let Some(groups) = pending.groups_of_user(ctx, user)? else {
            return Ok(false);
        };
        for id in groups {
            Self::find(catalog, ctx, cursors, id)?;
        }
        pending.mark_user_registered(user);
        Ok(true)
    }

    /// What [`Self::find_groups_of_user`] would find for `user` without
    /// reading the runs: `Registered` too when no load is pending.
    pub(crate) fn user_groups(catalog: &RwLock<Catalog>, user: u64) -> Result<UserGroups> {
        match catalog.read().pending() {
            Some(pending) => pending.user_groups(user),
            None => Ok(UserGroups::Registered),
        }
    }

    pub fn by_slot(&self, slot: u32) -> Option<&Arc<Group>> {
        in_slot(&self.by_slot, slot)
    }

    pub fn contains(&self, id: u64) -> bool {
        self.get(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Room for `n` slots in all, so that registering that many groups
    /// copies no slot list.
    pub fn reserve_slots(&mut self, n: usize) {
        self.by_slot.reserve(n.saturating_sub(self.by_slot.len()));
    }

    /// At least as many as the groups registered at any time since the
    /// catalog was made: its slots, which are reused but never dropped.
    pub fn len_high(&self) -> usize {
        self.by_slot.len()
    }

    /// Registers a new group in a free slot and returns it. The caller
    /// checked that `id` is not registered.
    pub fn insert(&mut self, id: u64, log: LogSlot) -> Arc<Group> {
        let slot = self.reserve_slot();
        let group = Arc::new(Group::new(id, slot, log));
        self.publish(group.clone());
        group
    }

    /// Takes a free slot for a group made without the catalog's lock
    /// (the background load builds a batch's groups and their cursor rows
    /// first): no other group gets it until [`Self::publish`] registers
    /// its group or [`Self::release_slot`] gives it back. A reserved slot
    /// holds no group: nothing finds it by id or by slot.
    pub(crate) fn reserve_slot(&mut self) -> u32 {
        match self.free.pop() {
            Some(s) => s,
            None => {
                self.by_slot.push(None);
                // Invariant: groups_max (validated) keeps slots below u32::MAX.
                u32::try_from(self.by_slot.len() - 1).expect("invariant: slot fits u32")
            }
        }
    }

    /// Registers the group `make` builds in a slot reserved for it
    /// ([`Self::reserve_slot`]); the slot is given back if `make` fails.
    pub(crate) fn register_made<E>(
        &mut self,
        make: impl FnOnce(u32) -> std::result::Result<Arc<Group>, E>,
    ) -> std::result::Result<Arc<Group>, E> {
        let slot = self.reserve_slot();
        match make(slot) {
            Ok(g) => {
                self.publish(g.clone());
                Ok(g)
            }
            Err(e) => {
                self.release_slot(slot);
                Err(e)
            }
        }
    }

    /// Gives back a reserved slot whose group was not published.
    pub(crate) fn release_slot(&mut self, slot: u32) {
        debug_assert!(self.by_slot(slot).is_none(), "slot {slot} holds a group");
        self.free.push(slot);
    }

    /// Registers a group made in a slot [`Self::reserve_slot`] gave, with
    /// the retention policy it holds. The caller checked that its id is
    /// not registered.
    pub(crate) fn publish(&mut self, group: Arc<Group>) {
        let (id, slot) = (group.id, group.slot);
        debug_assert!(!self.contains(id), "group {id} registered twice");
        debug_assert!(self.by_slot(slot).is_none(), "slot {slot} taken");
        if !group.retention().keeps_everything() {
            self.retained.insert(slot);
        }
        self.by_slot[slot as usize] = Some(group);
        let (hasher, by_slot) = (&self.hasher, &self.by_slot);
        let hash = hasher.hash_one(id);
        self.by_id[shard_of(hash)].insert_unique(hash, slot, |&s| slot_hash(hasher, by_slot, s));
        self.len += 1;
    }

    /// Room in the index by id for `additional` more groups without
    /// growing: a growth rehashes the ids of its shard (reading each
    /// group), under the catalog's write lock. (`by_slot` grows by copying
    /// pointers, which costs little.)
    pub(crate) fn reserve(&mut self, additional: usize) {
        let (hasher, by_slot) = (&self.hasher, &self.by_slot);
        // The ids spread evenly over the shards; an eighth more for the
        // spread.
        let per_shard = additional / ID_SHARDS + additional / ID_SHARDS / 8 + 1;
        for shard in self.by_id.iter_mut() {
            shard.reserve(per_shard, |&s| slot_hash(hasher, by_slot, s));
        }
    }

    /// Unregisters a group; its slot becomes free once the caller removed
    /// every membership naming it (done before calling this).
    pub fn remove(&mut self, id: u64) -> Option<Arc<Group>> {
        let by_slot = &self.by_slot;
        let hash = self.hasher.hash_one(id);
        let entry = self.by_id[shard_of(hash)]
            .find_entry(hash, |&s| in_slot(by_slot, s).is_some_and(|g| g.id == id))
            .ok()?;
        let (slot, _) = entry.remove();
        self.len -= 1;
        let g = self.by_slot[slot as usize].take()?;
        self.retained.remove(&g.slot);
        self.free.push(g.slot);
        Some(g)
    }

    /// Sets a registered group's retention policy and keeps the index of
    /// groups with one; a group not (or no longer) registered is left alone.
    pub fn set_retention(&mut self, group: &Arc<Group>, policy: Retention) {
        if !self
            .by_slot(group.slot)
            .is_some_and(|g| Arc::ptr_eq(g, group))
        {
            return;
        }
        group.set_retention(policy);
        if policy.keeps_everything() {
            self.retained.remove(&group.slot);
        } else {
            self.retained.insert(group.slot);
        }
    }

    /// Up to `max` groups with a retention policy, from slot `from` on in
    /// slot order (a walk in chunks resumes after the last slot it got).
    /// O(log n + max).
    pub fn retained_from(&self, from: u32, max: usize) -> Vec<Arc<Group>> {
        self.retained
            .range(from..)
            .take(max)
            .filter_map(|&s| self.by_slot(s).cloned())
            .collect()
    }

    pub fn groups(&self) -> impl Iterator<Item = &Arc<Group>> {
        self.by_slot.iter().flatten()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.groups().map(|g| g.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Rehashes of a slot (its group read through `by_slot`) on this
        /// thread.
        pub(super) static SLOT_HASHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    /// A registration costs what it adds: the largest rehash one insert
    /// causes stays near a shard's share of the groups, not all of them
    /// (one table of 200,000 groups rehashed 114,688 slots in one insert,
    /// under the registry's write lock).
    #[test]
    fn a_growing_catalog_rehashes_one_shard_at_a_time() {
        const GROUPS: u64 = 200_000;
        let mut c = Catalog::default();
        let mut worst = 0;
        for id in 1..=GROUPS {
            let before = SLOT_HASHES.with(|n| n.get());
            c.insert(id, LogSlot::new_small());
            worst = worst.max(SLOT_HASHES.with(|n| n.get()) - before);
        }
        assert_eq!(c.len(), GROUPS as usize);
        // A 64th of the groups: fixed here, not read from ID_SHARDS, so
        // that fewer shards fail the test.
        let share = GROUPS / 64;
        assert!(
            worst <= 2 * share,
            "one insert rehashed {worst} slots (a shard holds about {share})"
        );
        // Every group is found by its id, and removals count.
        assert!((1..=GROUPS).all(|id| c.get(id).is_some_and(|g| g.id == id)));
        for id in (1..=GROUPS).step_by(2) {
            assert!(c.remove(id).is_some());
        }
        assert_eq!(c.len(), GROUPS as usize / 2);
        assert!(c.get(1).is_none() && c.get(2).is_some());
        assert_eq!(c.len_high(), GROUPS as usize);
    }

    /// A reserved slot holds no group and goes to no other group until its
    /// group is published there (then found by id and by slot) or it is
    /// given back (then the next group may take it).
    #[test]
    fn a_reserved_slot_is_nobodys_until_published_or_released() {
        let mut c = Catalog::default();
        let a = c.reserve_slot();
        let b = c.reserve_slot();
        assert_ne!(a, b);
        assert!(c.by_slot(a).is_none() && c.by_slot(b).is_none());
        let other = c.insert(7, LogSlot::new_small());
        assert!(other.slot != a && other.slot != b);
        assert_eq!(c.len(), 1);
        let g = Arc::new(Group::new(5, a, LogSlot::new_small()));
        g.set_retention(Retention {
            max_bytes: 1 << 20,
            ..Retention::default()
        });
        c.publish(g.clone());
        assert!(Arc::ptr_eq(c.get(5).unwrap(), &g));
        assert!(Arc::ptr_eq(c.by_slot(a).unwrap(), &g));
        // Its retention policy is indexed, as set_retention indexes one.
        assert_eq!(c.retained_from(0, 10).len(), 1);
        c.release_slot(b);
        assert_eq!(c.insert(8, LogSlot::new_small()).slot, b);
        assert_eq!(c.len(), 3);
    }
}
