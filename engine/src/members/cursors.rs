//! The cursor table: every membership's tidemark (`last_ack_msg_id`), held on
//! the user's side so that "all groups of user U" is one lookup.
//!
//! Memory: a membership is 16 bytes here (cursor, group slot, join point)
//! plus the 8-byte user id in the group's member list; see the bench
//! `memberships` for the measured total. A shard's users' lists are
//! ranges of one store, compacted when the room that moves and leaves
//! left behind passes a bound ([`Shard`], `user_lists.rs`): not a block
//! per user, whose growth through the allocator's size classes left
//! freed blocks resident among live ones. A shard's users
//! are a [`UserIndex`] (a dense list and a table of 4-byte indexes, not a
//! map whose empty buckets hold whole entries). An ACK is a hash lookup, a binary
//! search over the user's groups and one atomic compare-and-swap, plus a
//! push onto its shard's flush queue when the move raises the flush bit
//! (the only allocation, amortised; no hashing beyond the one that picks
//! the shard): no system call, no exclusive lock.
//!
//! Each cursor word is `cursor << 2 | checkpoint_dirty << 1 | flush_dirty`
//! (msg_ids stay below 2^62). The *flush* bit makes the commit thread's
//! cursor flush write only cursors that moved since it last wrote them:
//! the move that raises it queues `(user, slot)` on its shard's flush
//! queue, so a flush visits the moved cursors only, never every user (it
//! runs on the commit thread, between rounds); the
//! *checkpoint* bit makes each moved membership reach the next checkpoint's
//! delta run once: the move that sets it (an ACK, a caught-up sender, a
//! replayed Cursors entry) reports it, and the caller queues the user on its
//! group's checkpoint state (`dirty.rs`), so a checkpoint reads only the
//! cursors that moved, never the whole table.
//!
//! A flush that finds a quarter or more of a shard's memberships queued
//! reads the whole shard in its order instead of looking each entry up
//! (`take_dirty_pausing`): an entry's lookup is three dependent cache misses (the
//! index's control byte, the user's entry, the list), in the order the
//! ACKs came, while the shard read in order streams through memory, so
//! the flush of a busy table (W3: every member moves every second) costs
//! a fraction, and no more than four sequential visits per queued entry.
//! The queue's buffer is kept from one flush to the next while flushes
//! use a quarter of it or more, and a flush that takes a queue larger
//! than the buffer it leaves in its place leaves one of the queue's size
//! and a quarter more instead, its pages written by the flush on the
//! commit thread (`take_queue`): the moves after a flush neither grow the
//! queue again from nothing nor take its first-touch page faults on the
//! event loop. A flush pauses between shards every thousand or so
//! entries it visits, holding no lock
//! ([`CursorTable::take_dirty_pausing`]): the commit thread yields its CPU
//! there, so a busy table's flush runs in short slices between the ACKs.
//!
//! Invariants: a flush bit is cleared only atomically with reading the
//! value it covers (the flush keeps the entries until written); every
//! membership whose flush bit is set is on its shard's flush queue
//! (queued by the move that raises it, taken by the flush that clears
//! it). The queue is a list with one entry per raise of a bit from 0 to
//! 1: a bit stays up until a flush clears it, so a membership has at most
//! one entry per flush, plus one per leave since that flush (a leave
//! leaves its entry, as finding it in a list would cost a walk), plus one
//! if a flush that read its shard in order cleared a bit raised after it
//! took the queue (that move's entry is on the next queue).
//! The flush reads each bit as it clears it and writes only the
//! values whose bit it found up, so an entry of a membership that left
//! (gone, or joined again clean), or a second entry after a leave and a
//! rejoin, writes nothing: every moved cursor is written once. A
//! checkpoint bit is set only by a move that reports it (so every set bit
//! has its user queued) and cleared only atomically with the read of the
//! value the checkpoint stores.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

pub use crate::members::user_lists::InsertError;
use crate::members::user_lists::{Membership, Shard};

const SHARDS: usize = 64;
/// `join_lo` value meaning "the join point is in the overflow map".
const JOIN_OVERFLOW: u32 = u32::MAX;

/// The memberships of a user's list with `slot`.
fn find(list: &[Membership], slot: u32) -> Option<&Membership> {
    let i = list.binary_search_by_key(&slot, |m| m.slot).ok()?;
    Some(&list[i])
}

/// Clears `m`'s flush bit and, if it was up, gives `f` the cursor read
/// with the clearing.
fn take_flush_bit(m: &Membership, f: impl FnOnce(u64)) {
    let v = m.cursor.fetch_and(!FLUSH_DIRTY, Ordering::AcqRel);
    if v & FLUSH_DIRTY != 0 {
        f(v >> SHIFT);
    }
}

/// Whether a flush's buffer of `capacity` entries, of which it used
/// `used`, is kept for the next flush: if it used at least one in
/// [`KEEP_SHARE`] of it, so that what is kept stays proportional to what
/// the flushes use (the flush queues here, the commit thread's rows).
pub(crate) fn worth_keeping(used: usize, capacity: usize) -> bool {
    capacity > 0 && used * KEEP_SHARE >= capacity
}

/// Gives a flushed queue's buffer back for the next flush to swap in, if
/// [`worth_keeping`]; else it is freed (the moves slowed down: the next
/// queue grows to what they need).
fn keep_for_next_flush(queue: &Mutex<FlushQueue>, mut taken: Vec<(u64, u32)>) {
    if worth_keeping(taken.len(), taken.capacity()) {
        taken.clear();
        queue.lock().spare = taken;
    }
}

/// Takes a shard's flush queue, leaving the spare buffer in its place. A
/// spare that could not hold as many entries as the queue taken (the
/// first flushes of a busy table, or moves that sped up) is first
/// replaced by one that can, with a [`QUEUE_HEADROOM`] share more, whose
/// pages this thread writes once: the moves that fill it (on the event
/// loop) then neither grow it nor take its first-touch page faults, and
/// a next second with a few more moves than this one still fits (no new
/// buffer every flush). The fresh buffer is made with no lock held; a
/// move that queues meanwhile is taken with the rest.
fn take_queue(queue: &Mutex<FlushQueue>) -> Vec<(u64, u32)> {
    let (queued, spare) = {
        let queue = queue.lock();
        (queue.queued.len(), queue.spare.capacity())
    };
    let fresh = (queued > spare).then(|| {
        let room = queued + queued / QUEUE_HEADROOM;
        let mut fresh = Vec::with_capacity(room);
        // Writes every page of the buffer; `clear` keeps them.
        fresh.resize(room, (0, 0));
        fresh.clear();
        fresh
    });
    let mut queue = queue.lock();
    if let Some(fresh) = fresh {
        if fresh.capacity() > queue.spare.capacity() {
            queue.spare = fresh;
        }
    }
    let spare = std::mem::take(&mut queue.spare);
    std::mem::replace(&mut queue.queued, spare)
}

/// The cursor table. Its shards are keyed by user id with std's randomly
/// keyed SipHash (user ids come from clients).
pub struct CursorTable {
    shards: Vec<RwLock<Shard>>,
    /// By shard: the `(user, slot)` of every membership of the shard's
    /// users whose flush bit is set, one entry per raise of the bit, and
    /// of memberships that left since the last flush (module invariants).
    /// Its own lock, as a move holds its shard only shared; taken after
    /// the shard's.
    flush_queues: Vec<Mutex<FlushQueue>>,
    hasher: std::collections::hash_map::RandomState,
    /// Join points that do not fit 32 bits, by (slot, user).
    join_overflow: Mutex<HashMap<(u32, u64), u64>>,
    /// Memberships in the table: changed with them (under their shard's
    /// write lock) by `insert`, `remove` and the bulk [`Loader`], the only
    /// three that add or drop one, so [`CursorTable::memberships`] is O(1)
    /// (STATS `storage.memberships`).
    len: AtomicU64,
    /// At least as many as any user's memberships in the table, at any
    /// time: raised to a user's count by every `insert` and [`Loader`]
    /// that adds to it, never lowered (a removal only lowers a count), so
    /// it is the most any user held since the table was made. Checkpoints
    /// store it (format-spec/storage.md section 6.3,
    /// `groups_per_user_bound`) so that a join can be decided before every
    /// group of its user is loaded.
    groups_per_user_high: AtomicU64,
}

const FLUSH_DIRTY: u64 = 1;
const CKPT_DIRTY: u64 = 2;
const SHIFT: u32 = 2;

/// A flush reads a shard in order, not entry by entry, once at least one
/// in this many of its memberships are queued (module docs).
const SCAN_SHARE: usize = 4;
/// A flush keeps a queue's buffer for the next one if it used at least
/// one in this many of its entries (module docs).
const KEEP_SHARE: usize = 4;
/// A buffer a flush makes for a queue ([`take_queue`]) holds the
/// entries it took and one in this many more.
const QUEUE_HEADROOM: usize = 4;
/// A pausing flush ([`CursorTable::take_dirty_pausing`]) pauses between
/// shards after this many queued entries looked up or memberships read in
/// order since its last pause: about a tenth of a millisecond of work on
/// the machines of BENCHMARKS.md ("W3's p99: the cursor flush in
/// slices"), and a pause is one system call.
const PAUSE_EVERY_VISITS: usize = 1_024;

/// One shard's flush queue (module invariants) and the buffer the next
/// flush swaps in for it.
#[derive(Default)]
struct FlushQueue {
    queued: Vec<(u64, u32)>,
    spare: Vec<(u64, u32)>,
}

/// What a flush ([`CursorTable::take_dirty_pausing`]) visited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlushVisit {
    /// Queued entries it took.
    pub queued: usize,
    /// Shards it read in order instead of looking their entries up.
    pub shards_read_in_order: usize,
    /// Times it paused between shards
    /// ([`CursorTable::take_dirty_pausing`]).
    pub pauses: usize,
}

/// A cursor that moved: its old and new value, and whether this move set
/// its checkpoint bit (then the caller queues the user for the next
/// checkpoint).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moved {
    pub old: u64,
    pub new: u64,
    pub newly_checkpoint_dirty: bool,
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
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
            flush_queues: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
            join_overflow: Mutex::new(HashMap::new()),
            len: AtomicU64::new(0),
            groups_per_user_high: AtomicU64::new(0),
        }
    }

    /// No user has, or had since the table was made, more memberships in
    /// the table than this.
    pub fn groups_per_user_high(&self) -> u64 {
        self.groups_per_user_high.load(Ordering::Acquire)
    }

    /// The user's memberships in the table now.
    pub fn groups_of(&self, user: u64) -> usize {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        shard.list(hash, user).map_or(0, <[Membership]>::len)
    }

    /// A user's list grew to `len`: the high mark covers it. Called under
    /// the user's shard lock, so a reader that sees the count through the
    /// shard later sees the mark too.
    fn raise_high(&self, len: usize) {
        self.groups_per_user_high
            .fetch_max(len as u64, Ordering::AcqRel);
    }

    /// Memberships in the table now. O(1).
    pub fn memberships(&self) -> u64 {
        self.len.load(Ordering::Relaxed)
    }

    /// The user's hash: its shard is taken from bits 32 and up, its
    /// bucket in the shard's index from the low bits and the top 7
    /// (hashbrown's), so the two stay independent.
    fn hash(&self, user: u64) -> u64 {
        self.hasher.hash_one(user)
    }

    fn shard_of_hash(hash: u64) -> usize {
        (hash >> 32) as usize % SHARDS
    }

    /// The user's shard and hash.
    fn locate(&self, user: u64) -> (usize, u64) {
        let hash = self.hash(user);
        (Self::shard_of_hash(hash), hash)
    }

    /// The shard a user's memberships are in, for [`Loader::push_in_shard`].
    pub fn shard_of(&self, user: u64) -> usize {
        self.locate(user).0
    }

    /// Queues a membership whose flush bit this caller raised (0 -> 1);
    /// the caller holds its shard, number `shard` (the index it already
    /// hashed the user to: a move hashes the user once for both).
    fn queue_flush(&self, shard: usize, user: u64, slot: u32) {
        self.flush_queues[shard].lock().queued.push((user, slot));
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

    /// A bulk loader of the memberships a checkpoint restores: what
    /// [`CursorTable::insert`] does for each, at a fraction of the cost
    /// (see [`Loader`]). `expected` sizes its buffers (the memberships the
    /// manifest's runs hold at most).
    pub fn loader(&self, expected: usize) -> Loader<'_> {
        let per_shard = expected / SHARDS + expected / SHARDS / 8 + 1;
        Loader {
            table: self,
            by_shard: (0..SHARDS).map(|_| Vec::with_capacity(per_shard)).collect(),
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
        let (index, hash) = self.locate(user);
        let mut shard = self.shards[index].write();
        let join_lo = match u32::try_from(join_point) {
            Ok(j) if j != JOIN_OVERFLOW => j,
            _ => JOIN_OVERFLOW,
        };
        let m = Membership {
            // Clean: the join entry (or the checkpoint) already holds it.
            cursor: AtomicU64::new(cursor << SHIFT),
            slot,
            join_lo,
        };
        let len = shard.insert(hash, user, |u| self.hash(u), m, groups_per_user_max)?;
        if join_lo == JOIN_OVERFLOW {
            // Under the shard's write lock: no reader sees the membership
            // before its record.
            self.join_overflow.lock().insert((slot, user), join_point);
        }
        self.raise_high(len);
        self.len.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Removes a membership; returns its cursor.
    pub fn remove(&self, user: u64, slot: u32) -> Option<u64> {
        let (index, hash) = self.locate(user);
        let mut shard = self.shards[index].write();
        // A queued flush entry stays: the flush finds no membership (or a
        // clean one, joined again) and writes nothing for it.
        let m = shard.remove(hash, user, slot, |u| self.hash(u))?;
        self.len.fetch_sub(1, Ordering::Relaxed);
        if m.join_lo == JOIN_OVERFLOW {
            self.join_overflow.lock().remove(&(slot, user));
        }
        Some(m.cursor.load(Ordering::Acquire) >> SHIFT)
    }

    pub fn get(&self, user: u64, slot: u32) -> Option<MemberCursor> {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        let m = find(shard.list(hash, user)?, slot)?;
        Some(MemberCursor {
            slot,
            cursor: m.cursor.load(Ordering::Acquire) >> SHIFT,
            join_point: self.join_point(user, m),
        })
    }

    /// Raises a membership's join point to `join_point` (never lowers it);
    /// returns the join point it has now, `None` if `user` is not a
    /// member. Takes the shard for writing (the join point is no atomic):
    /// a history clear is rare, never on an ACK's path. The caller queues
    /// the membership for the next checkpoint, which stores the join point.
    pub fn raise_join_point(&self, user: u64, slot: u32, join_point: u64) -> Option<u64> {
        let (index, hash) = self.locate(user);
        let mut shard = self.shards[index].write();
        let list = shard.list_mut(hash, user)?;
        let at = list.binary_search_by_key(&slot, |m| m.slot).ok()?;
        let old = self.join_point(user, &list[at]);
        if join_point <= old {
            return Some(old);
        }
        let m = &mut list[at];
        let mut overflow = self.join_overflow.lock();
        match u32::try_from(join_point) {
            Ok(j) if j != JOIN_OVERFLOW => {
                m.join_lo = j;
            }
            _ => {
                overflow.insert((slot, user), join_point);
                m.join_lo = JOIN_OVERFLOW;
            }
        }
        Some(join_point)
    }

    /// Reads a membership for a checkpoint and clears its checkpoint bit
    /// with the read: a move after it sets the bit again (and is queued
    /// again).
    pub fn take_for_checkpoint(&self, user: u64, slot: u32) -> Option<MemberCursor> {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        let m = find(shard.list(hash, user)?, slot)?;
        let v = m.cursor.fetch_and(!CKPT_DIRTY, Ordering::AcqRel);
        Some(MemberCursor {
            slot,
            cursor: v >> SHIFT,
            join_point: self.join_point(user, m),
        })
    }

    /// Moves the cursor forward to `msg_id` (never backward), setting both
    /// dirty bits. `None` if `user` is not a member. The caller checks
    /// `msg_id` against the head first.
    pub fn advance(&self, user: u64, slot: u32, msg_id: u64) -> Option<Moved> {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        let m = find(shard.list(hash, user)?, slot)?;
        let seen = m.cursor.load(Ordering::Acquire);
        Some(self.raise(index, user, slot, m, seen, msg_id))
    }

    /// Moves `m` to `msg_id` if that is forward of what it holds, setting
    /// both dirty bits; `seen` is a value of its word read before. A
    /// compare-and-swap from the value the decision was made on: a move
    /// that found the cursor already at `msg_id` (a racing ACK of the same
    /// id got there first, maybe read by a flush or a checkpoint since)
    /// writes nothing, so a bit is only ever raised together with the
    /// report (and the queueing) of its raise.
    fn raise(
        &self,
        shard: usize,
        user: u64,
        slot: u32,
        m: &Membership,
        seen: u64,
        msg_id: u64,
    ) -> Moved {
        let mut current = seen;
        loop {
            let old = current >> SHIFT;
            if msg_id <= old {
                return Moved {
                    old,
                    new: old,
                    newly_checkpoint_dirty: false,
                };
            }
            let next = msg_id << SHIFT | CKPT_DIRTY | FLUSH_DIRTY;
            match m
                .cursor
                .compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if current & FLUSH_DIRTY == 0 {
                        self.queue_flush(shard, user, slot);
                    }
                    return Moved {
                        old,
                        new: msg_id,
                        newly_checkpoint_dirty: current & CKPT_DIRTY == 0,
                    };
                }
                Err(now) => current = now,
            }
        }
    }

    /// Moves the cursor from exactly `expected` to `msg_id` (a caught-up
    /// sender's own message). `Some(newly checkpoint dirty)` if it moved.
    pub fn advance_if_at(&self, user: u64, slot: u32, expected: u64, msg_id: u64) -> Option<bool> {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        let m = find(shard.list(hash, user)?, slot)?;
        let current = m.cursor.load(Ordering::Acquire);
        if current >> SHIFT != expected {
            return None;
        }
        m.cursor
            .compare_exchange(
                current,
                msg_id << SHIFT | CKPT_DIRTY | FLUSH_DIRTY,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .ok()?;
        if current & FLUSH_DIRTY == 0 {
            self.queue_flush(index, user, slot);
        }
        Some(current & CKPT_DIRTY == 0)
    }

    /// Calls `f(slot, cursor)` for every group of `user`, in slot order.
    pub fn for_each_of_user(&self, user: u64, mut f: impl FnMut(u32, u64)) {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        if let Some(list) = shard.list(hash, user) {
            for m in list {
                f(m.slot, m.cursor.load(Ordering::Acquire) >> SHIFT);
            }
        }
    }

    /// Entries on the flush queues now: about as many cursors as the next
    /// flush takes (fewer if leaves left entries, more if moves queue
    /// meanwhile), so its buffers can be sized once. O(shards).
    pub fn queued(&self) -> usize {
        self.flush_queues
            .iter()
            .map(|q| q.lock().queued.len())
            .sum()
    }

    /// [`CursorTable::take_dirty_pausing`] without pauses.
    #[cfg(test)]
    pub fn take_dirty(&self, f: impl FnMut(u64, u32, u64)) -> FlushVisit {
        self.take_dirty_pausing(f, || {})
    }

    /// Takes every cursor that moved since it was last taken: calls
    /// `f(user, slot, cursor)` and clears its flush bit atomically with the
    /// read, so an ACK racing with this is taken next time (its move either
    /// finds the bit still set, and this read takes its value, or raises it
    /// again and queues the membership again). Visits the flush queues'
    /// entries, or, for a shard with at least one in [`SCAN_SHARE`] of its
    /// memberships queued, the shard in order (module docs): O(moved
    /// cursors + leaves since the last take + shards), whatever the table
    /// holds.
    ///
    /// Calls `pause` between two shards
    /// once the flush has visited [`PAUSE_EVERY_VISITS`] entries or
    /// memberships since its last pause, with no lock of the table held:
    /// the commit thread gives the CPU to whoever waits for it there
    /// (`std::thread::yield_now`), so a flush of a busy table (W3:
    /// 100,000 moved cursors, milliseconds of one CPU) runs in slices of
    /// a fraction of a millisecond between the ACKs' turns instead of in
    /// one piece that delays every ACK in flight. A small flush never
    /// pauses.
    pub fn take_dirty_pausing(
        &self,
        mut f: impl FnMut(u64, u32, u64),
        mut pause: impl FnMut(),
    ) -> FlushVisit {
        let mut visit = FlushVisit::default();
        let mut since_pause = 0;
        for (queue, shard) in self.flush_queues.iter().zip(&self.shards) {
            if since_pause >= PAUSE_EVERY_VISITS {
                pause();
                visit.pauses += 1;
                since_pause = 0;
            }
            // Taken before the shard is read: a move queues after raising
            // the bit, so every entry taken has its bit raised by now (or
            // cleared by a flush that read the shard in order since).
            let queued = take_queue(queue);
            if !queued.is_empty() {
                visit.queued += queued.len();
                let shard = shard.read();
                if queued.len() * SCAN_SHARE >= shard.memberships() {
                    visit.shards_read_in_order += 1;
                    since_pause += shard.memberships();
                    for (user, list) in shard.iter() {
                        for m in list {
                            // A plain read first: most bits are down in a
                            // shard where a quarter moved, and a cleared
                            // bit needs no locked write.
                            if m.cursor.load(Ordering::Acquire) & FLUSH_DIRTY != 0 {
                                take_flush_bit(m, |cursor| f(user, m.slot, cursor));
                            }
                        }
                    }
                } else {
                    since_pause += queued.len();
                    for &(user, slot) in &queued {
                        // A membership that left since its move is gone
                        // (or, joined again, clean: its bit is down and
                        // nothing is written).
                        let found = shard.list(self.hash(user), user);
                        if let Some(m) = found.and_then(|list| find(list, slot)) {
                            take_flush_bit(m, |cursor| f(user, slot, cursor));
                        }
                    }
                }
            }
            keep_for_next_flush(queue, queued);
        }
        visit
    }

    /// Raises a cursor to a value read from the journal (never lowers it);
    /// a raise sets the checkpoint bit (the journal entry goes away with
    /// the next checkpoints, the value must not). `None` if the membership
    /// does not exist.
    pub fn restore(&self, user: u64, slot: u32, cursor: u64) -> Option<Moved> {
        let (index, hash) = self.locate(user);
        let shard = self.shards[index].read();
        let m = find(shard.list(hash, user)?, slot)?;
        let mut current = m.cursor.load(Ordering::Acquire);
        loop {
            let old = current >> SHIFT;
            if cursor <= old {
                return Some(Moved {
                    old,
                    new: old,
                    newly_checkpoint_dirty: false,
                });
            }
            let next = cursor << SHIFT | (current & FLUSH_DIRTY) | CKPT_DIRTY;
            match m
                .cursor
                .compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    return Some(Moved {
                        old,
                        new: cursor,
                        newly_checkpoint_dirty: current & CKPT_DIRTY == 0,
                    })
                }
                Err(now) => current = now,
            }
        }
    }

    /// Lowers every cursor above its group's head to the head (recovery:
    /// never beyond the head). `head_of(slot)` gives the head; `moved` is
    /// called with `(slot, old, new)` for each lowered cursor. The flush
    /// bit is set (the lowered value is written with the next flush); the
    /// checkpoint bit is left as it was, since only a reported move may set
    /// it (every later open clamps again whatever a checkpoint holds).
    pub fn clamp_all(&self, head_of: impl Fn(u32) -> u64, mut moved: impl FnMut(u32, u64, u64)) {
        for (index, shard) in self.shards.iter().enumerate() {
            let shard = shard.read();
            for (user, list) in shard.iter() {
                for m in list {
                    let head = head_of(m.slot);
                    let v = m.cursor.load(Ordering::Acquire);
                    if v >> SHIFT > head {
                        // Recovery is single-threaded: nothing races this store.
                        m.cursor.store(
                            head << SHIFT | FLUSH_DIRTY | (v & CKPT_DIRTY),
                            Ordering::Release,
                        );
                        if v & FLUSH_DIRTY == 0 {
                            self.queue_flush(index, user, m.slot);
                        }
                        moved(m.slot, v >> SHIFT, head);
                    }
                }
            }
        }
    }

    /// Heap bytes held (the shards' indexes and the membership vectors).
    pub fn heap_bytes(&self) -> usize {
        let per_queued = std::mem::size_of::<(u64, u32)>();
        let queues: usize = self
            .flush_queues
            .iter()
            .map(|q| {
                let q = q.lock();
                (q.queued.capacity() + q.spare.capacity()) * per_queued
            })
            .sum();
        queues
            + self
                .shards
                .iter()
                .map(|s| s.read().heap_bytes())
                .sum::<usize>()
    }

    /// Compacts the shards whose lists hold more than a little room (a
    /// thirty-second of their store, `user_lists.rs`), one shard at a
    /// time: for the checkpoint thread, after the bursts it stores, so an
    /// idle table holds its memberships nearly without room. A shard in
    /// use (its lock taken) is left to the next call: this never waits.
    /// Amortised O(1) per join and leave since the last compaction.
    pub fn compact_lists(&self) {
        for shard in &self.shards {
            if let Some(mut shard) = shard.try_write() {
                shard.compact_if_slack();
            }
        }
    }
}

/// One membership waiting in a [`Loader`] (24 bytes).
struct LoadRow {
    user: u64,
    cursor: u64,
    slot: u32,
    join_lo: u32,
}

/// Restores many memberships at once (recovery, from a checkpoint's runs;
/// the background load, one batch of groups at a time, adding to the
/// users earlier batches built).
///
/// Why: inserting one membership at a time costs a hash-bucket miss and a
/// miss in the user's list per membership, in random order (a checkpoint's
/// rows come by group, the table is by user), plus the list's growth:
/// about 60% of a clean restart with 1.8 M memberships, measured with
/// `perf`. The loader appends rows to per-shard buffers (sequential
/// writes), then sorts each shard's rows by user and slot (a shard's rows
/// fit the caches) and builds each user's list at its size class with one
/// index insert per user. The two cores each build half of the shards.
/// Cost: 24 bytes per membership while loading, freed at the end.
pub struct Loader<'a> {
    table: &'a CursorTable,
    by_shard: Vec<Vec<LoadRow>>,
}

impl Loader<'_> {
    /// Queues a membership (as [`CursorTable::insert`] without a limit;
    /// the caller never queues one twice: a checkpoint's keys are unique).
    /// `shard` is the user's ([`CursorTable::shard_of`]), which the caller
    /// computes, on another thread if it likes: it is a keyed hash, a fair
    /// share of a load's cost.
    pub fn push_in_shard(
        &mut self,
        shard: usize,
        user: u64,
        slot: u32,
        cursor: u64,
        join_point: u64,
    ) {
        debug_assert_eq!(shard, self.table.shard_of(user));
        let join_lo = match u32::try_from(join_point) {
            Ok(j) if j != JOIN_OVERFLOW => j,
            _ => {
                self.table
                    .join_overflow
                    .lock()
                    .insert((slot, user), join_point);
                JOIN_OVERFLOW
            }
        };
        self.by_shard[shard].push(LoadRow {
            user,
            cursor,
            slot,
            join_lo,
        });
    }

    /// Builds the queued memberships into the table on this thread alone
    /// (the background load's batches: its decoder thread keeps the other
    /// core busy, and a helper thread per batch only waited to be
    /// scheduled).
    pub fn finish_here(self) {
        self.table
            .build_shards(self.by_shard.into_iter().enumerate().collect());
    }

    /// Builds the queued memberships into the table, half of the shards
    /// on a second thread.
    pub fn finish(self) {
        let table = self.table;
        let mut shards: Vec<(usize, Vec<LoadRow>)> =
            self.by_shard.into_iter().enumerate().collect();
        let half = shards.len() / 2;
        let second = shards.split_off(half);
        std::thread::scope(|s| {
            s.spawn(|| table.build_shards(second));
            table.build_shards(shards);
        });
    }
}

impl CursorTable {
    fn build_shards(&self, shards: Vec<(usize, Vec<LoadRow>)>) {
        for (index, mut rows) in shards {
            if rows.is_empty() {
                continue;
            }
            rows.sort_unstable_by_key(|r| (r.user, r.slot));
            let users: Vec<&[LoadRow]> = rows.chunk_by(|a, b| a.user == b.user).collect();
            let hashes: Vec<u64> = users.iter().map(|run| self.hash(run[0].user)).collect();
            let rehash = |u| self.hash(u);
            let mut map = self.shards[index].write();
            // Every user's entry first, then the lists: the lookups do not
            // depend on each other, so the core overlaps their cache
            // misses, which the list work between them kept apart (a load
            // in batches makes a lookup per row in a table far larger than
            // the caches: a user's memberships come in many batches). The
            // lookup `extend` makes again then finds them in the cache.
            for (run, &hash) in users.iter().zip(&hashes) {
                std::hint::black_box(map.list(hash, run[0].user));
            }
            // Exactly the users to come: a guess from the rows alone would
            // over-reserve buckets that the inserts then touch, page by page.
            map.reserve_for(users.len(), rows.len(), rehash);
            for (run, &hash) in users.iter().zip(&hashes) {
                let user = run[0].user;
                // A user who had memberships before the load (none in
                // recovery) keeps one sorted list.
                let add = run.iter().map(|r| Membership {
                    // Clean: the checkpoint holds it.
                    cursor: AtomicU64::new(r.cursor << SHIFT),
                    slot: r.slot,
                    join_lo: r.join_lo,
                });
                let len = map.extend(hash, user, rehash, add);
                self.raise_high(len);
            }
            // Counted with them, under the shard's write lock (as `insert`).
            self.len.fetch_add(rows.len() as u64, Ordering::Relaxed);
            // The rows' memory goes now, shard by shard.
            drop(map);
            drop(users);
            drop(rows);
        }
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
        let moved = |old, new, newly_checkpoint_dirty| {
            Some(Moved {
                old,
                new,
                newly_checkpoint_dirty,
            })
        };
        assert_eq!(t.advance(7, 1, 9), moved(5, 9, true));
        assert_eq!(t.advance(7, 1, 3), moved(9, 9, false));
        assert_eq!(t.get(7, 1).unwrap().cursor, 9);
        assert_eq!(t.advance(7, 2, 3), None);
        assert_eq!(t.advance(8, 1, 3), None);
        assert_eq!(t.restore(7, 1, 4), moved(9, 9, false));
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
    fn a_flush_visits_the_moved_cursors_only() {
        let t = CursorTable::new();
        for user in 0..100_000 {
            t.insert(user, (user % 7) as u32, 0, 1, None).unwrap();
        }
        t.insert(42, 9, 0, 1, None).unwrap();
        let mut seen = Vec::new();
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 0);
        t.advance(42, 9, 5);
        t.advance(42, 9, 6);
        assert!(t.advance_if_at(42, 9, 6, 7).is_some());
        assert_eq!(
            t.take_dirty(|u, s, c| seen.push((u, s, c))),
            FlushVisit {
                queued: 1,
                shards_read_in_order: 0,
                pauses: 0
            },
            "one moved cursor among 100,000 users: one entry visited, queued once"
        );
        assert_eq!(seen, vec![(42, 9, 7)]);
        // A leave leaves its queued entry, which writes nothing; a rejoin
        // starts clean.
        t.advance(42, 9, 8);
        t.advance(7, 0, 3);
        t.remove(42, 9);
        t.insert(42, 9, 8, 1, None).unwrap();
        seen.clear();
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 2);
        assert_eq!(seen, vec![(7, 0, 3)]);
        // Recovery's clamp queues what it lowers.
        t.clamp_all(|slot| if slot == 0 { 2 } else { u64::MAX }, |_, _, _| {});
        seen.clear();
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 1);
        assert_eq!(seen, vec![(7, 0, 2)]);
    }

    #[test]
    fn a_flush_reads_in_order_a_shard_whose_memberships_moved_by_a_quarter_or_more() {
        // Two memberships per user, one of them moved: half of every
        // shard's memberships are queued, so every shard is read in
        // order, and every moved cursor is written once, with its value.
        let t = CursorTable::new();
        let users = 20_000u64;
        for user in 0..users {
            t.insert(user, 1, 0, 1, None).unwrap();
            t.insert(user, 2, 0, 1, None).unwrap();
        }
        for user in 0..users {
            t.advance(user, 1, user % 50 + 1);
        }
        let mut seen = Vec::new();
        let visit = t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(
            (visit.queued, visit.shards_read_in_order),
            (users as usize, SHARDS)
        );
        seen.sort_unstable();
        let moved: Vec<_> = (0..users).map(|u| (u, 1, u % 50 + 1)).collect();
        assert_eq!(seen, moved);
        // One move among 40,000 memberships is looked up.
        t.advance(7, 2, 3);
        seen.clear();
        let visit = t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(
            visit,
            FlushVisit {
                queued: 1,
                shards_read_in_order: 0,
                pauses: 0
            }
        );
        assert_eq!(seen, vec![(7, 2, 3)]);
    }

    #[test]
    fn a_move_behind_a_flush_that_reads_the_shard_in_order_is_written_once() {
        // Users a and b in one shard, a first in its order; a moved. While
        // the flush reads the shard it meets a, then b moves (queued on
        // the next queue): the flush meets b's raised bit and writes its
        // value, and the next flush finds b's entry with its bit down
        // and writes nothing more.
        let t = CursorTable::new();
        let a = 1;
        let b = (2..).find(|&u| t.shard_of(u) == t.shard_of(a)).unwrap();
        t.insert(a, 1, 0, 1, None).unwrap();
        t.insert(b, 1, 0, 1, None).unwrap();
        t.advance(a, 1, 4);
        let mut seen = Vec::new();
        let visit = t.take_dirty(|u, s, c| {
            if u == a {
                t.advance(b, 1, 9);
            }
            seen.push((u, s, c));
        });
        assert_eq!(
            visit,
            FlushVisit {
                queued: 1,
                shards_read_in_order: 1,
                pauses: 0
            }
        );
        assert_eq!(seen, vec![(a, 1, 4), (b, 1, 9)]);
        seen.clear();
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 1);
        assert!(seen.is_empty(), "b's value was written once");
        // Its next move is queued and written as any.
        t.advance(b, 1, 10);
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 1);
        assert_eq!(seen, vec![(b, 1, 10)]);
    }

    #[test]
    fn a_flush_queue_keeps_its_buffer_while_the_cursors_keep_moving() {
        // After two busy flushes each shard has two buffers (the queue and
        // the one the next flush swaps in): the moves that follow allocate
        // nothing, where a queue made anew after each flush grew again,
        // page by page, on the thread that ACKs. Flushes that use under a
        // quarter of a buffer give it back.
        let t = CursorTable::new();
        let users = 20_000u64;
        for user in 0..users {
            t.insert(user, 1, 0, 1, None).unwrap();
        }
        let idle = t.heap_bytes();
        let move_all = |to| {
            for user in 0..users {
                t.advance(user, 1, to);
            }
        };
        move_all(1);
        t.take_dirty(|_, _, _| {});
        move_all(2);
        t.take_dirty(|_, _, _| {});
        let kept = t.heap_bytes();
        let per_entry = std::mem::size_of::<(u64, u32)>();
        assert!(
            kept - idle >= 2 * users as usize * per_entry,
            "two buffers of {users} entries kept: {} bytes",
            kept - idle
        );
        move_all(3);
        assert_eq!(t.heap_bytes(), kept, "the moves filled a kept buffer");
        t.take_dirty(|_, _, _| {});
        assert_eq!(t.heap_bytes(), kept);
        // Few moves, then none: both buffers go.
        t.advance(5, 1, 4);
        t.take_dirty(|_, _, _| {});
        t.take_dirty(|_, _, _| {});
        assert_eq!(t.heap_bytes(), idle);
    }

    #[test]
    fn a_flush_leaves_each_queue_room_for_as_many_moves_as_it_took() {
        // The first busy flush already leaves every shard a queue that
        // holds what it took and a little more: the same moves after it,
        // and those of a few more members, grow nothing (on the event
        // loop, a queue that grows takes the first-touch page faults of
        // its new pages), where the queue it left was the empty spare.
        let t = CursorTable::new();
        let users = 20_000u64;
        let all = users + users / 16;
        for user in 0..all {
            t.insert(user, 1, 0, 1, None).unwrap();
        }
        let move_up_to = |last, to| {
            for user in 0..last {
                t.advance(user, 1, to);
            }
        };
        move_up_to(users, 1);
        assert_eq!(t.queued(), users as usize);
        let mut taken = 0;
        t.take_dirty(|_, _, _| taken += 1);
        assert_eq!(taken, users);
        assert_eq!(t.queued(), 0);
        let after_flush = t.heap_bytes();
        move_up_to(all, 2);
        assert_eq!(
            t.heap_bytes(),
            after_flush,
            "the moves after the first flush filled a queue that held them"
        );
        let mut taken = Vec::new();
        t.take_dirty(|u, _, c| taken.push((u, c)));
        taken.sort_unstable();
        assert_eq!(taken, (0..all).map(|u| (u, 2)).collect::<Vec<_>>());
    }

    #[test]
    fn a_busy_flush_pauses_between_shards_with_no_lock_held_and_a_small_one_never() {
        // 20,000 moved cursors: the flush pauses after each 1,024 or so
        // entries visited, between two shards, with every shard free (a
        // move can go on during the pause), and still writes every moved
        // cursor once, with its value.
        let t = CursorTable::new();
        let users = 20_000u64;
        for user in 0..users {
            t.insert(user, 1, 0, 1, None).unwrap();
        }
        for user in 0..users {
            t.advance(user, 1, user % 50 + 1);
        }
        let seen = std::cell::RefCell::new(Vec::new());
        let mut at_pauses = Vec::new();
        let visit = t.take_dirty_pausing(
            |u, s, c| seen.borrow_mut().push((u, s, c)),
            || {
                assert!(
                    t.shards.iter().all(|shard| shard.try_write().is_some()),
                    "a pause holds no shard"
                );
                assert!(t.flush_queues.iter().all(|q| q.try_lock().is_some()));
                at_pauses.push(seen.borrow().len());
            },
        );
        let most = users as usize / PAUSE_EVERY_VISITS;
        assert!(
            (most / 2..=most).contains(&visit.pauses),
            "{} pauses for {users} moved cursors",
            visit.pauses
        );
        assert_eq!(at_pauses.len(), visit.pauses);
        for pair in at_pauses.windows(2) {
            assert!(pair[1] - pair[0] >= PAUSE_EVERY_VISITS, "{at_pauses:?}");
        }
        let mut seen = seen.into_inner();
        seen.sort_unstable();
        let moved: Vec<_> = (0..users).map(|u| (u, 1, u % 50 + 1)).collect();
        assert_eq!(seen, moved);
        // A flush of a few moves does not pause.
        for user in 0..100 {
            t.advance(user, 1, 60);
        }
        let visit = t.take_dirty_pausing(|_, _, _| {}, || panic!("paused"));
        assert_eq!((visit.queued, visit.pauses), (100, 0));
    }

    #[test]
    fn a_cursor_that_left_and_joined_again_between_flushes_is_written_once_with_its_new_value() {
        // Queued, left, joined again and moved again before one flush: the
        // membership has two entries on its flush queue (the leave leaves
        // the first), and the flush writes its cursor once, as it is now.
        let t = CursorTable::new();
        t.insert(5, 3, 0, 1, None).unwrap();
        t.advance(5, 3, 4);
        assert_eq!(t.remove(5, 3), Some(4));
        t.insert(5, 3, 2, 3, None).unwrap();
        t.advance(5, 3, 6);
        // A leave without a rejoin: its entry finds no membership.
        t.insert(6, 3, 0, 1, None).unwrap();
        t.advance(6, 3, 1);
        t.remove(6, 3);
        let mut seen = Vec::new();
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 3);
        assert_eq!(seen, vec![(5, 3, 6)]);
        seen.clear();
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 0);
        assert!(seen.is_empty(), "nothing left queued");
        // The next move is queued again.
        t.advance(5, 3, 7);
        assert_eq!(t.take_dirty(|u, s, c| seen.push((u, s, c))).queued, 1);
        assert_eq!(seen, vec![(5, 3, 7)]);
    }

    #[test]
    fn a_move_that_read_the_cursor_before_a_racing_equal_move_raises_no_bit_unqueued() {
        // Two ACKs of msg_id 5 race: the second read the cursor at 0, then
        // the first moved it to 5 and a flush and a checkpoint read it
        // (clearing both bits) before the second's write. The second must
        // change nothing: a bit it raised without queueing the membership
        // would hide every later move from flushes and checkpoints.
        let t = CursorTable::new();
        t.insert(1, 1, 0, 1, None).unwrap();
        let raise_from_stale = |seen: u64, msg_id: u64| {
            let (index, hash) = t.locate(1);
            let shard = t.shards[index].read();
            let m = find(shard.list(hash, 1).unwrap(), 1).unwrap();
            t.raise(index, 1, 1, m, seen, msg_id)
        };
        let stale = 0;
        assert!(t.advance(1, 1, 5).unwrap().newly_checkpoint_dirty);
        let mut seen = Vec::new();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(t.take_for_checkpoint(1, 1).unwrap().cursor, 5);
        let moved = raise_from_stale(stale, 5);
        assert_eq!((moved.old, moved.new), (5, 5));
        assert!(!moved.newly_checkpoint_dirty);
        // The next move is queued for both.
        assert!(t.advance(1, 1, 6).unwrap().newly_checkpoint_dirty);
        seen.clear();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(seen, vec![(1, 1, 6)]);
    }

    #[test]
    fn a_move_reports_the_checkpoint_bit_once_until_a_checkpoint_reads_it() {
        let t = CursorTable::new();
        t.insert(1, 1, 0, 1, None).unwrap();
        assert!(t.advance(1, 1, 5).unwrap().newly_checkpoint_dirty);
        assert!(
            !t.advance(1, 1, 6).unwrap().newly_checkpoint_dirty,
            "already queued"
        );
        assert_eq!(t.advance_if_at(1, 1, 6, 7), Some(false));
        // The flush takes the flush bit only.
        let mut seen = Vec::new();
        t.take_dirty(|u, s, c| seen.push((u, s, c)));
        assert_eq!(seen, vec![(1, 1, 7)]);
        assert!(!t.advance(1, 1, 8).unwrap().newly_checkpoint_dirty);
        // The checkpoint reads the value and clears its bit with the read.
        assert_eq!(t.take_for_checkpoint(1, 1).unwrap().cursor, 8);
        assert!(t.advance(1, 1, 9).unwrap().newly_checkpoint_dirty);
        assert_eq!(t.take_for_checkpoint(1, 1).unwrap().cursor, 9);
        assert_eq!(t.advance_if_at(1, 1, 9, 10), Some(true));
        t.take_for_checkpoint(1, 1);
        // A replayed raise sets it too; one that does not raise does not.
        assert!(t.restore(1, 1, 12).unwrap().newly_checkpoint_dirty);
        t.take_for_checkpoint(1, 1);
        assert!(!t.restore(1, 1, 11).unwrap().newly_checkpoint_dirty);
        // Clamping (recovery) leaves the checkpoint bit alone.
        t.clamp_all(|_| 3, |_, _, _| {});
        assert!(t.advance(1, 1, 3).unwrap().old == 3);
        assert!(t.advance(1, 1, 4).unwrap().newly_checkpoint_dirty);
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
    fn a_join_point_only_rises_and_may_cross_32_bits() {
        let t = CursorTable::new();
        t.insert(1, 1, 4, 5, None).unwrap();
        assert_eq!(t.raise_join_point(1, 1, 3), Some(5), "never lowered");
        assert_eq!(t.raise_join_point(1, 1, 9), Some(9));
        let big = (u32::MAX as u64) + 7;
        assert_eq!(t.raise_join_point(1, 1, big), Some(big));
        assert_eq!(t.get(1, 1).unwrap().join_point, big);
        assert_eq!(t.raise_join_point(1, 1, big + 1), Some(big + 1));
        assert_eq!(t.get(1, 1).unwrap().join_point, big + 1);
        // The cursor is not the join point's business.
        assert_eq!(t.get(1, 1).unwrap().cursor, 4);
        assert_eq!(t.raise_join_point(2, 1, 9), None);
        assert_eq!(t.raise_join_point(1, 2, 9), None);
        // A removed overflowed membership leaves nothing behind.
        t.remove(1, 1);
        assert!(t.join_overflow.lock().is_empty());
    }

    #[test]
    fn join_points_beyond_32_bits_are_kept_exactly() {
        let t = CursorTable::new();
        let big = (1u64 << 40) + 3;
        t.insert(1, 1, big - 1, big, Some(2)).unwrap();
        assert_eq!(t.get(1, 1).unwrap().join_point, big);
        let m = t.take_for_checkpoint(1, 1).unwrap();
        assert_eq!((m.cursor, m.join_point), (big - 1, big));
        t.remove(1, 1);
        assert!(t.join_overflow.lock().is_empty());
    }

    #[test]
    fn the_membership_count_follows_inserts_and_removes_only() {
        let t = CursorTable::new();
        assert_eq!(t.memberships(), 0);
        t.insert(7, 1, 0, 1, None).unwrap();
        t.insert(7, 2, 0, 1, None).unwrap();
        t.insert(8, 1, 0, 1, None).unwrap();
        // Refused inserts and removes of nothing change no count.
        assert!(t.insert(7, 1, 0, 1, None).is_err());
        assert!(t.insert(9, 1, 0, 1, Some(0)).is_err());
        assert_eq!(t.remove(9, 1), None);
        assert_eq!(t.memberships(), 3);
        assert_eq!(t.remove(7, 1), Some(0));
        assert_eq!(t.remove(7, 1), None);
        assert_eq!(t.memberships(), 2);
    }

    /// The bulk loader builds the table that one insert per membership
    /// builds: the same memberships, cursors and join points (some past 32
    /// bits), each user's list sorted by slot, every cursor clean.
    #[test]
    fn the_loader_builds_what_inserts_build() {
        use proptest::prelude::*;
        let rows = proptest::collection::btree_map(
            (0u64..200, 0u32..300),
            (
                0u64..1_000,
                prop_oneof![0u64..1_000, (1u64 << 32) - 2..(1u64 << 33)],
            ),
            0..600,
        );
        proptest!(ProptestConfig::with_cases(64), |(rows in rows)| {
            let one_by_one = CursorTable::new();
            let bulk = CursorTable::new();
            let mut loader = bulk.loader(rows.len() / 2);
            // A checkpoint's rows come by group (slot), then user.
            let mut by_group: Vec<_> = rows.iter().collect();
            by_group.sort_by_key(|((user, slot), _)| (*slot, *user));
            for (&(user, slot), &(cursor, join)) in by_group {
                one_by_one.insert(user, slot, cursor, join, None).unwrap();
                loader.push_in_shard(bulk.shard_of(user), user, slot, cursor, join);
            }
            loader.finish();
            for (&(user, slot), &(cursor, join)) in &rows {
                prop_assert_eq!(bulk.get(user, slot), one_by_one.get(user, slot));
                prop_assert_eq!(bulk.get(user, slot).map(|m| (m.cursor, m.join_point)), Some((cursor, join)));
            }
            for user in 0..200u64 {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                bulk.for_each_of_user(user, |slot, c| a.push((slot, c)));
                one_by_one.for_each_of_user(user, |slot, c| b.push((slot, c)));
                prop_assert_eq!(a, b);
            }
            prop_assert_eq!(bulk.take_dirty(|_, _, _| {}).queued, 0);
            prop_assert_eq!(bulk.memberships(), one_by_one.memberships());
            prop_assert_eq!(bulk.memberships(), rows.len() as u64);
        });
    }

    /// Loads in batches (the background load's: each adds to the users
    /// that earlier batches and inserts built) build what one insert per
    /// membership builds: each user's list sorted by slot, whether a
    /// batch's slots come above the user's others (the usual case) or
    /// below them.
    #[test]
    fn loads_in_batches_build_what_inserts_build() {
        use proptest::prelude::*;
        let rows = proptest::collection::btree_map(
            (0u64..50, 0u32..300),
            (0u64..1_000, 0u64..1_000, 0usize..4),
            0..400,
        );
        proptest!(ProptestConfig::with_cases(64), |(rows in rows)| {
            let one_by_one = CursorTable::new();
            let bulk = CursorTable::new();
            // Batch b holds the rows drawn b; batch 3 is inserted one by one.
            for batch in 0..4 {
                let mut loader = bulk.loader(0);
                for (&(user, slot), &(cursor, join, b)) in &rows {
                    if b != batch {
                        continue;
                    }
                    one_by_one.insert(user, slot, cursor, join, None).unwrap();
                    if batch == 3 {
                        bulk.insert(user, slot, cursor, join, None).unwrap();
                    } else {
                        loader.push_in_shard(bulk.shard_of(user), user, slot, cursor, join);
                    }
                }
                loader.finish_here();
            }
            for user in 0..50u64 {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                bulk.for_each_of_user(user, |slot, c| a.push((slot, c)));
                one_by_one.for_each_of_user(user, |slot, c| b.push((slot, c)));
                prop_assert_eq!(a, b);
            }
            for &(user, slot) in rows.keys() {
                prop_assert_eq!(bulk.get(user, slot), one_by_one.get(user, slot));
            }
            prop_assert_eq!(bulk.memberships(), rows.len() as u64);
        });
    }

    /// A load reserves index buckets for the users it builds, not for its
    /// rows: reserved buckets are touched by the inserts, so an
    /// over-reservation (half the rows, for users with ten memberships
    /// each) cost memory and page faults at every restart. The bulk table
    /// holds no more than the one built by inserts (whose maps and lists
    /// grow as needed).
    #[test]
    fn a_load_reserves_buckets_for_its_users_not_for_its_rows() {
        let one_by_one = CursorTable::new();
        let bulk = CursorTable::new();
        let (users, per_user) = (4_000u64, 10u32);
        let mut loader = bulk.loader((users * u64::from(per_user)) as usize);
        // By group (slot), then user: as a checkpoint's rows come.
        for slot in 0..per_user {
            for user in 0..users {
                one_by_one.insert(user, slot, 0, 1, None).unwrap();
                loader.push_in_shard(bulk.shard_of(user), user, slot, 0, 1);
            }
        }
        loader.finish();
        assert_eq!(bulk.memberships(), one_by_one.memberships());
        assert!(
            bulk.heap_bytes() <= one_by_one.heap_bytes(),
            "bulk {} bytes, one by one {}",
            bulk.heap_bytes(),
            one_by_one.heap_bytes()
        );
    }
}
