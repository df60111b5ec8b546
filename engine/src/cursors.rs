//! The cursor table: every membership's tidemark (`last_ack_msg_id`), held on
//! the user's side so that "all groups of user U" is one lookup.
//!
//! Memory: a membership is 16 bytes here (cursor, group slot, join point)
//! plus the 8-byte user id in the group's member list; see the bench
//! `memberships` for the measured total. An ACK is a hash lookup, a binary
//! search over the user's groups and one atomic `fetch_max`: no system call,
//! no allocation, no exclusive lock.
//!
//! Each cursor carries a dirty bit (bit 0; the value is `cursor << 1`), so
//! the commit thread persists only cursors that moved since they were last
//! written. Invariant: a dirty bit is cleared only when the value read with
//! it is durable or held by someone who will make it durable: a flush
//! clears it atomically with reading the value (and keeps the entries until
//! written); a checkpoint clears it only after it is stored, and only if
//! the cursor did not move since its snapshot.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

const SHARDS: usize = 64;
/// `join_lo` value meaning "the join point is in the overflow map".
const JOIN_OVERFLOW: u32 = u32::MAX;

/// One membership, as the user's side holds it.
#[repr(C)]
struct Membership {
    /// `cursor << 1 | dirty`.
    cursor: AtomicU64,
    /// The group's slot (dense small integer standing for the group id).
    slot: u32,
    /// First msg_id this member may read in history, if it fits.
    join_lo: u32,
}

#[derive(Default)]
struct UserEntry {
    /// Sorted by slot.
    memberships: Vec<Membership>,
    dirty: AtomicBool,
}

impl UserEntry {
    fn find(&self, slot: u32) -> Option<&Membership> {
        let i = self
            .memberships
            .binary_search_by_key(&slot, |m| m.slot)
            .ok()?;
        Some(&self.memberships[i])
    }
}

/// Why a membership could not be added.
#[derive(Debug, PartialEq, Eq)]
pub enum InsertError {
    AlreadyMember,
    GroupsPerUserLimit { max: usize },
}

/// The cursor table. Its shards are keyed by user id with std's randomly
/// keyed SipHash (user ids come from clients).
pub struct CursorTable {
    shards: Vec<RwLock<HashMap<u64, UserEntry>>>,
    hasher: std::collections::hash_map::RandomState,
    /// Join points that do not fit 32 bits, by (slot, user).
    join_overflow: Mutex<HashMap<(u32, u64), u64>>,
}

/// A cursor that was dirty when a snapshot read it, with the value read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirtyCursor {
    pub user: u64,
    pub slot: u32,
    pub cursor: u64,
}

/// A membership as read from the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberCursor {
    pub slot: u32,
    pub cursor: u64,
    pub join_point: u64,
}

impl CursorTable {
    pub fn new() -> Self {
        CursorTable {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            join_overflow: Mutex::new(HashMap::new()),
        }
    }

    fn shard(&self, user: u64) -> &RwLock<HashMap<u64, UserEntry>> {
        let mut h = self.hasher.build_hasher();
        h.write_u64(user);
        &self.shards[(h.finish() as usize) % SHARDS]
    }

    fn join_point(&self, user: u64, m: &Membership) -> u64 {
        if m.join_lo == JOIN_OVERFLOW {
            // Invariant: JOIN_OVERFLOW entries always have an overflow record.
            *self
                .join_overflow
                .lock()
                .get(&(m.slot, user))
                .expect("invariant: overflow join point recorded")
        } else {
            m.join_lo as u64
        }
    }

    /// Adds a membership with its starting cursor and join point (the first
    /// msg_id history may show). The new cursor is clean: whatever added it
    /// (a join entry, a snapshot) already persisted it.
    pub fn insert(
        &self,
        user: u64,
        slot: u32,
        cursor: u64,
        join_point: u64,
        groups_per_user_max: Option<usize>,
    ) -> Result<(), InsertError> {
        let mut shard = self.shard(user).write();
        let entry = shard.entry(user).or_default();
        let at = match entry.memberships.binary_search_by_key(&slot, |m| m.slot) {
            Ok(_) => return Err(InsertError::AlreadyMember),
            Err(at) => at,
        };
        if let Some(max) = groups_per_user_max.filter(|&max| entry.memberships.len() >= max) {
            return Err(InsertError::GroupsPerUserLimit { max });
        }
        let join_lo = match u32::try_from(join_point) {
            Ok(j) if j != JOIN_OVERFLOW => j,
            _ => {
                self.join_overflow.lock().insert((slot, user), join_point);
                JOIN_OVERFLOW
            }
        };
        // Grow by a quarter, not double: bounds the slack per membership.
        let v = &mut entry.memberships;
        if v.len() == v.capacity() {
            v.reserve_exact((v.len() / 4).max(2));
        }
        v.insert(
            at,
            Membership {
                // Clean: the join entry (or the snapshot) already holds it.
                cursor: AtomicU64::new(cursor << 1),
                slot,
                join_lo,
            },
        );
        Ok(())
    }

    /// Removes a membership; returns its cursor.
    pub fn remove(&self, user: u64, slot: u32) -> Option<u64> {
        let mut shard = self.shard(user).write();
        let entry = shard.get_mut(&user)?;
        let at = entry
            .memberships
            .binary_search_by_key(&slot, |m| m.slot)
            .ok()?;
        let m = entry.memberships.remove(at);
        if m.join_lo == JOIN_OVERFLOW {
            self.join_overflow.lock().remove(&(slot, user));
        }
        if entry.memberships.is_empty() {
            shard.remove(&user);
        } else if entry.memberships.capacity() > entry.memberships.len() * 2 {
            entry.memberships.shrink_to_fit();
        }
        Some(m.cursor.load(Ordering::Acquire) >> 1)
    }

    pub fn get(&self, user: u64, slot: u32) -> Option<MemberCursor> {
        let shard = self.shard(user).read();
        let entry = shard.get(&user)?;
        let m = entry.find(slot)?;
        Some(MemberCursor {
            slot,
            cursor: m.cursor.load(Ordering::Acquire) >> 1,
            join_point: self.join_point(user, m),
        })
    }

    /// Moves the cursor forward to `msg_id` (never backward). Returns
    /// `(old, new)`, or `None` if `user` is not a member. The caller checks
    /// `msg_id` against the head first.
    pub fn advance(&self, user: u64, slot: u32, msg_id: u64) -> Option<(u64, u64)> {
        let shard = self.shard(user).read();
        let entry = shard.get(&user)?;
        let m = entry.find(slot)?;
        let current = m.cursor.load(Ordering::Acquire);
        if msg_id <= current >> 1 {
            return Some((current >> 1, current >> 1));
        }
        // fetch_max on the encoded value sets both the cursor and the dirty bit.
        let old = m.cursor.fetch_max(msg_id << 1 | 1, Ordering::AcqRel) >> 1;
        if !entry.dirty.load(Ordering::Relaxed) {
            entry.dirty.store(true, Ordering::Release);
        }
        Some((old, old.max(msg_id)))
    }

    /// Moves the cursor from exactly `expected` to `msg_id` (a caught-up
    /// sender's own message). Returns true if it moved.
    pub fn advance_if_at(&self, user: u64, slot: u32, expected: u64, msg_id: u64) -> bool {
        let shard = self.shard(user).read();
        let Some(entry) = shard.get(&user) else {
            return false;
        };
        let Ok(i) = entry.memberships.binary_search_by_key(&slot, |m| m.slot) else {
            return false;
        };
        let m = &entry.memberships[i];
        let current = m.cursor.load(Ordering::Acquire);
        if current >> 1 != expected {
            return false;
        }
        let moved = m
            .cursor
            .compare_exchange(
                current,
                msg_id << 1 | 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok();
        if moved {
            entry.dirty.store(true, Ordering::Release);
        }
        moved
    }

    /// Calls `f(slot, cursor)` for every group of `user`, in slot order.
    pub fn for_each_of_user(&self, user: u64, mut f: impl FnMut(u32, u64)) {
        let shard = self.shard(user).read();
        if let Some(entry) = shard.get(&user) {
            for m in &entry.memberships {
                f(m.slot, m.cursor.load(Ordering::Acquire) >> 1);
            }
        }
    }

    /// Takes every cursor that moved since it was last taken: calls
    /// `f(user, slot, cursor)` and clears its dirty bit atomically with the
    /// read, so an ACK racing with this is taken next time.
    pub fn take_dirty(&self, mut f: impl FnMut(u64, u32, u64)) {
        for shard in &self.shards {
            let shard = shard.read();
            for (&user, entry) in shard.iter() {
                if !entry.dirty.swap(false, Ordering::AcqRel) {
                    continue;
                }
                for m in &entry.memberships {
                    let v = m.cursor.fetch_and(!1, Ordering::AcqRel);
                    if v & 1 == 1 {
                        f(user, m.slot, v >> 1);
                    }
                }
            }
        }
    }

    /// Every membership, user by user: `f(user, memberships in slot order)`.
    ///
    /// Leaves every dirty bit set: the snapshot is not durable yet (the
    /// checkpoint holding it may still fail, for instance on a full disk, and
    /// then the next cursor flush must still find these cursors). Returns
    /// the dirty cursors it saw, to hand to [`Self::mark_persisted`] once
    /// the snapshot is durable.
    pub fn snapshot(&self, mut f: impl FnMut(u64, &[MemberCursor])) -> Vec<DirtyCursor> {
        let mut buf = Vec::new();
        let mut dirty = Vec::new();
        for shard in &self.shards {
            let shard = shard.read();
            for (&user, entry) in shard.iter() {
                buf.clear();
                for m in &entry.memberships {
                    let v = m.cursor.load(Ordering::Acquire);
                    if v & 1 == 1 {
                        dirty.push(DirtyCursor {
                            user,
                            slot: m.slot,
                            cursor: v >> 1,
                        });
                    }
                    buf.push(MemberCursor {
                        slot: m.slot,
                        cursor: v >> 1,
                        join_point: self.join_point(user, m),
                    });
                }
                f(user, &buf);
            }
        }
        dirty
    }

    /// Clears the dirty bit of each cursor `persisted` names, but only if
    /// the cursor still has the value that was persisted: one that an ACK
    /// moved after the snapshot stays dirty for the next flush. (The
    /// per-user hint bit is left set; the next `take_dirty` clears it.)
    pub fn mark_persisted(&self, persisted: &[DirtyCursor]) {
        for d in persisted {
            let shard = self.shard(d.user).read();
            let Some(m) = shard.get(&d.user).and_then(|e| e.find(d.slot)) else {
                continue; // left since: nothing to persist
            };
            let _ = m.cursor.compare_exchange(
                d.cursor << 1 | 1,
                d.cursor << 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
    }

    /// Raises a cursor to a value loaded from disk (never lowers it).
    /// Returns `(old, new)` if the membership exists.
    pub fn restore(&self, user: u64, slot: u32, cursor: u64) -> Option<(u64, u64)> {
        let shard = self.shard(user).read();
        let entry = shard.get(&user)?;
        let i = entry
            .memberships
            .binary_search_by_key(&slot, |m| m.slot)
            .ok()?;
        let old = entry.memberships[i]
            .cursor
            .fetch_max(cursor << 1, Ordering::AcqRel)
            >> 1;
        Some((old, old.max(cursor)))
    }

    /// Lowers every cursor above its group's head to the head (recovery:
    /// never beyond the head). `head_of(slot)` gives the head; `moved` is
    /// called with `(slot, old, new)` for each lowered cursor.
    pub fn clamp_all(&self, head_of: impl Fn(u32) -> u64, mut moved: impl FnMut(u32, u64, u64)) {
        for shard in &self.shards {
            let shard = shard.read();
            for entry in shard.values() {
                for m in &entry.memberships {
                    let head = head_of(m.slot);
                    let old = m.cursor.fetch_min(head << 1 | 1, Ordering::AcqRel) >> 1;
                    if old > head {
                        entry.dirty.store(true, Ordering::Release);
                        moved(m.slot, old, head);
                    }
                }
            }
        }
    }

    /// Heap bytes held (the shard maps' buckets and the membership vectors).
    pub fn heap_bytes(&self) -> usize {
        let per_bucket = std::mem::size_of::<(u64, UserEntry)>() + 1;
        self.shards
            .iter()
            .map(|s| {
                let s = s.read();
                s.capacity() * per_bucket
                    + s.values()
                        .map(|e| e.memberships.capacity() * std::mem::size_of::<Membership>())
                        .sum::<usize>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn membership_is_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Membership>(), 16);
    }

    #[test]
    fn cursors_only_move_forward() {
        let t = CursorTable::new();
        t.insert(7, 1, 5, 6, Some(2)).unwrap();
        assert_eq!(t.advance(7, 1, 9), Some((5, 9)));
        assert_eq!(t.advance(7, 1, 3), Some((9, 9)));
        assert_eq!(t.get(7, 1).unwrap().cursor, 9);
        assert_eq!(t.advance(7, 2, 3), None);
        assert_eq!(t.advance(8, 1, 3), None);
        assert_eq!(t.restore(7, 1, 4), Some((9, 9)));
        assert_eq!(t.get(7, 1).unwrap().cursor, 9);
        let mut moved = Vec::new();
        t.clamp_all(|_| 8, |s, o, n| moved.push((s, o, n)));
        assert_eq!(moved, vec![(1, 9, 8)]);
        assert_eq!(t.get(7, 1).unwrap().cursor, 8);
    }

    #[test]
    fn dirty_cursors_are_taken_once() {
        let t = CursorTable::new();
        t.insert(1, 1, 0, 1, Some(2)).unwrap();
        t.insert(1, 2, 0, 1, Some(2)).unwrap();
        t.insert(2, 1, 0, 1, Some(2)).unwrap();
        let mut seen = Vec::new();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert!(
            seen.is_empty(),
            "new memberships are persisted by their join"
        );
        t.advance(1, 2, 5);
        t.advance(2, 1, 3);
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        seen.sort_unstable();
        assert_eq!(seen, vec![(1, 2, 5), (2, 1, 3)]);
        seen.clear();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert!(seen.is_empty(), "taken once");
        t.advance(1, 2, 6);
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(seen, vec![(1, 2, 6)]);
    }

    #[test]
    fn a_snapshot_clears_dirty_bits_only_once_persisted_and_only_if_unmoved() {
        let t = CursorTable::new();
        t.insert(1, 1, 0, 1, None).unwrap();
        t.insert(1, 2, 0, 1, None).unwrap();
        t.advance(1, 1, 5);
        t.advance(1, 2, 6);
        let dirty = t.snapshot(|_, _| {});
        assert_eq!(dirty.len(), 2);
        // Not persisted yet (the checkpoint may fail): still dirty.
        let mut seen = Vec::new();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        seen.sort_unstable();
        assert_eq!(seen, vec![(1, 1, 5), (1, 2, 6)]);
        // Persisted, while an ACK moved slot 1 after the snapshot.
        t.advance(1, 1, 7);
        t.advance(1, 2, 9);
        let dirty = t.snapshot(|_, _| {});
        t.advance(1, 1, 8);
        t.mark_persisted(&dirty);
        seen.clear();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(
            seen,
            vec![(1, 1, 8)],
            "moved after the snapshot: still dirty"
        );
        t.advance(1, 1, 10);
        let dirty = t.snapshot(|_, _| {});
        t.mark_persisted(&dirty);
        seen.clear();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert!(seen.is_empty(), "persisted and unmoved: clean");
    }

    #[test]
    fn limits_and_duplicates_are_refused() {
        let t = CursorTable::new();
        t.insert(1, 1, 0, 1, Some(2)).unwrap();
        assert_eq!(
            t.insert(1, 1, 0, 1, Some(2)),
            Err(InsertError::AlreadyMember)
        );
        t.insert(1, 2, 0, 1, Some(2)).unwrap();
        assert_eq!(
            t.insert(1, 3, 0, 1, Some(2)),
            Err(InsertError::GroupsPerUserLimit { max: 2 })
        );
        assert_eq!(t.remove(1, 1), Some(0));
        assert!(t.get(1, 1).is_none() && t.get(1, 2).is_some());
    }

    #[test]
    fn join_points_beyond_32_bits_are_kept_exactly() {
        let t = CursorTable::new();
        let big = (1u64 << 40) + 3;
        t.insert(1, 1, big - 1, big, Some(2)).unwrap();
        assert_eq!(t.get(1, 1).unwrap().join_point, big);
        let mut seen = Vec::new();
        t.snapshot(|u, ms| seen.extend(ms.iter().map(|m| (u, m.slot, m.cursor, m.join_point))));
        assert_eq!(seen, vec![(1, 1, big - 1, big)]);
        t.remove(1, 1);
        assert!(t.join_overflow.lock().is_empty());
    }
}
