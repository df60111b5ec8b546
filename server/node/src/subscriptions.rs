//! Who gets pushes: connections subscribed to groups directly, or to users
//! (every group of the user). This is an index derived from the
//! connections' own lists (`Connection` owns what it is subscribed to and
//! changes this index only together with its list). The push path asks once per commit round for
//! each group the round touched, so the answer must not cost a walk of a
//! 100,000-member list every time: the connections reached through user
//! subscriptions are cached per group, keyed on the group's member-list
//! version. When a user subscription comes or goes, only the entries of
//! that user's groups are dropped (O(groups of the user)): no other group's
//! answer can change, since the user is a member of no other group at that
//! moment, and a later join changes the member-list version.
//!
//! Push is an optimisation; pull is the truth. A connection missing from a
//! push (it cannot be, by the invariant below, but if it were) loses
//! nothing: it pulls.
//!
//! Invariant: a cached entry lists exactly the connections subscribed to a
//! user who was a member of the group at member-list version
//! `members_version`, as subscribed when the entry was computed.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use tidemark_engine::Engine;

/// Cached groups at most; past this the cache starts over (a bound on its
/// memory, which otherwise grows with every group ever pushed).
const CACHED_GROUPS_MAX: usize = 65_536;

/// Subscriptions of all connections. `C` identifies a connection.
pub struct Subscriptions<C> {
    by_group: HashMap<u64, HashSet<C>>,
    by_user: HashMap<u64, HashSet<C>>,
    through_members: HashMap<u64, CachedConns<C>>,
}

struct CachedConns<C> {
    members_version: u64,
    conns: Vec<C>,
}

impl<C: Copy + Eq + Hash> Default for Subscriptions<C> {
    fn default() -> Self {
        Subscriptions {
            by_group: HashMap::new(),
            by_user: HashMap::new(),
            through_members: HashMap::new(),
        }
    }
}

impl<C: Copy + Eq + Hash> Subscriptions<C> {
    pub fn add_group(&mut self, conn: C, group: u64) {
        self.by_group.entry(group).or_default().insert(conn);
    }

    pub fn add_user(&mut self, engine: &Engine, conn: C, user: u64) {
        if self.by_user.entry(user).or_default().insert(conn) {
            self.forget_groups_of(engine, user);
        }
    }

    /// Drops the subscriptions of `conn` to these groups and users.
    pub fn remove(
        &mut self,
        engine: &Engine,
        conn: C,
        groups: impl IntoIterator<Item = u64>,
        users: impl IntoIterator<Item = u64>,
    ) {
        for g in groups {
            remove_from(&mut self.by_group, g, conn);
        }
        for u in users {
            if remove_from(&mut self.by_user, u, conn) {
                self.forget_groups_of(engine, u);
            }
        }
    }

    /// Drops the cached entries of the groups `user` is a member of: the
    /// only entries a change of the user's subscriptions can change. Sound
    /// against a concurrent join: the engine inserts a member's cursor (what
    /// `unread` lists) before it changes the member-list version, under the
    /// group's member lock, so an entry computed at the new version was
    /// computed after the user became visible here.
    fn forget_groups_of(&mut self, engine: &Engine, user: u64) {
        if self.through_members.is_empty() {
            return;
        }
        // While the engine's state loads, a user's groups are not known
        // yet (and never waited for here, on the event loop): every entry
        // goes, a superset of those that can change.
        match engine.try_unread(user) {
            Ok(groups) => {
                for g in groups {
                    self.through_members.remove(&g.group_id);
                }
            }
            Err(_) => self.through_members.clear(),
        }
    }

    /// Whether `group` has a cached through-members entry (for tests).
    #[cfg(test)]
    fn is_cached(&self, group: u64) -> bool {
        self.through_members.contains_key(&group)
    }

    /// Connections subscribed to `group`, directly or through a member, each
    /// once, in no particular order.
    pub fn targets(&mut self, engine: &Engine, group: u64) -> Vec<C> {
        self.refresh_through_members(engine, group);
        let direct = self.by_group.get(&group);
        let through = self
            .through_members
            .get(&group)
            .map_or(&[][..], |c| &c.conns[..]);
        match (direct, through) {
            (None, t) => t.to_vec(),
            (Some(d), []) => d.iter().copied().collect(),
            (Some(d), t) => {
                let mut all: HashSet<C> = d.clone();
                all.extend(t.iter().copied());
                all.into_iter().collect()
            }
        }
    }

    /// Makes the cached entry of `group` current: the connections
    /// subscribed to one of its members, or no entry when there are none to
    /// find.
    fn refresh_through_members(&mut self, engine: &Engine, group: u64) {
        if self.by_user.is_empty() {
            return;
        }
        let Ok(version) = engine.members_version(group) else {
            self.through_members.remove(&group);
            return;
        };
        let fresh = self
            .through_members
            .get(&group)
            .is_some_and(|c| c.members_version == version.version);
        if fresh {
            return;
        }
        let conns = self.compute_through_members(engine, group, version.count);
        if self.through_members.len() >= CACHED_GROUPS_MAX {
            self.through_members.clear();
        }
        self.through_members.insert(
            group,
            CachedConns {
                members_version: version.version,
                conns,
            },
        );
    }

    /// Walks the smaller side: the subscribed users, or the group's members.
    fn compute_through_members(&self, engine: &Engine, group: u64, members: usize) -> Vec<C> {
        let mut conns: HashSet<C> = HashSet::new();
        if self.by_user.len() <= members {
            for (&user, c) in &self.by_user {
                if engine.is_member(group, user) {
                    conns.extend(c);
                }
            }
        } else if let Ok(members) = engine.members(group) {
            for user in members {
                if let Some(c) = self.by_user.get(&user) {
                    conns.extend(c);
                }
            }
        }
        conns.into_iter().collect()
    }
}

/// Removes `conn` from the set under `key` (dropping an emptied set);
/// true if it was there.
fn remove_from<C: Eq + Hash>(map: &mut HashMap<u64, HashSet<C>>, key: u64, conn: C) -> bool {
    let Some(set) = map.get_mut(&key) else {
        return false;
    };
    let removed = set.remove(&conn);
    if set.is_empty() {
        map.remove(&key);
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_engine::{Config, FsyncPolicy, JoinStart};

    fn engine(dir: &std::path::Path) -> Engine {
        let mut c = Config::new(dir);
        c.fsync = FsyncPolicy::Never;
        Engine::open(c).unwrap()
    }

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort_unstable();
        v
    }

    #[test]
    fn targets_follow_joins_leaves_and_subscriptions() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        e.create_group(1).unwrap();
        e.create_group(2).unwrap();
        for user in [10, 11] {
            e.join(1, user, JoinStart::Head).unwrap();
        }
        let mut s: Subscriptions<u32> = Subscriptions::default();
        s.add_user(&e, 100, 10);
        s.add_user(&e, 101, 11);
        s.add_user(&e, 102, 12); // not a member
        s.add_group(103, 1);
        s.add_group(100, 1); // also through user 10: listed once
        assert_eq!(sorted(s.targets(&e, 1)), [100, 101, 103]);
        assert_eq!(s.targets(&e, 2), Vec::<u32>::new());
        // A join after the answer was cached is seen.
        e.join(1, 12, JoinStart::Head).unwrap();
        assert_eq!(sorted(s.targets(&e, 1)), [100, 101, 102, 103]);
        // So is a leave, and a subscription that goes away.
        e.leave(1, 11).unwrap();
        s.remove(&e, 103, [1], []);
        assert_eq!(sorted(s.targets(&e, 1)), [100, 102]);
        s.remove(&e, 102, [], [12]);
        assert_eq!(sorted(s.targets(&e, 1)), [100]);
        // A new user subscription is seen by a cached group.
        e.join(1, 13, JoinStart::Head).unwrap();
        assert_eq!(sorted(s.targets(&e, 1)), [100]);
        s.add_user(&e, 104, 13);
        assert_eq!(sorted(s.targets(&e, 1)), [100, 104]);
        // A group deleted and created again starts with no members (100's
        // direct subscription to the group id stays).
        e.delete_group(1).unwrap();
        assert_eq!(s.targets(&e, 1), [100]);
        e.create_group(1).unwrap();
        assert_eq!(s.targets(&e, 1), [100]);
        e.join(1, 13, JoinStart::Head).unwrap();
        assert_eq!(sorted(s.targets(&e, 1)), [100, 104]);
    }

    #[test]
    fn both_walks_agree_on_a_big_group() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        e.create_group(1).unwrap();
        for user in 0..3_000u64 {
            e.join(1, user, JoinStart::Head).unwrap();
        }
        // Few subscribed users: walk them. Many: walk the members.
        let mut few: Subscriptions<u32> = Subscriptions::default();
        let mut many: Subscriptions<u32> = Subscriptions::default();
        for user in (0..6_000u64).step_by(7) {
            few.add_user(&e, user as u32, user);
        }
        for user in 0..6_000u64 {
            many.add_user(&e, user as u32, user);
        }
        let want: Vec<u32> = (0..3_000u32).step_by(7).collect();
        assert_eq!(sorted(few.targets(&e, 1)), want);
        assert_eq!(sorted(many.targets(&e, 1)), (0..3_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_user_subscription_forgets_only_that_users_groups() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        for g in 1..=3 {
            e.create_group(g).unwrap();
        }
        e.join(1, 10, JoinStart::Head).unwrap();
        e.join(2, 20, JoinStart::Head).unwrap();
        e.join(3, 10, JoinStart::Head).unwrap();
        let mut s: Subscriptions<u32> = Subscriptions::default();
        s.add_user(&e, 100, 10);
        assert_eq!(s.targets(&e, 1), [100]);
        assert_eq!(s.targets(&e, 2), Vec::<u32>::new());
        assert_eq!(s.targets(&e, 3), [100]);
        assert!(s.is_cached(1) && s.is_cached(2) && s.is_cached(3));
        // User 20 is a member of group 2 only: the entries of 1 and 3 stay.
        s.add_user(&e, 101, 20);
        assert!(s.is_cached(1) && s.is_cached(3));
        assert!(!s.is_cached(2));
        assert_eq!(s.targets(&e, 2), [101]);
        s.remove(&e, 101, [], [20]);
        assert!(s.is_cached(1) && s.is_cached(3) && !s.is_cached(2));
        assert_eq!(s.targets(&e, 2), Vec::<u32>::new());
        assert_eq!(s.targets(&e, 1), [100]);
    }
}
