//! Receipts (the seeds' `ack:N`, format-spec/protocol.md 4.22, 5.3, 5.4):
//! which connections want to hear that members' cursors moved, what moved
//! since the last flush, and the frames a flush sends.
//!
//! Representation: per watched group, its receipt subscriptions (connection
//! → the sender ids it subscribed with), its mode for the current interval
//! and what is due. In **list** mode (the group has at most
//! `receipt_members_max` members) an ACK that moves a cursor records
//! `user → cursor` (the latest wins: one entry per member per interval); a
//! flush sends each subscribed connection one RECEIPT of the group (split
//! only where a frame would pass `frame_bytes_max`), every member once. In
//! **counts** mode (a larger group) an ACK only marks the group due; a
//! flush sends each (connection, sender) one RECEIPT_COUNTS: how many
//! members' cursors are at or above each of the sender's recent messages,
//! the last [`RECENT_SENDS_MAX`] ids the node accepted from that sender in
//! that group since a receipt subscription named the pair (a SEND records
//! its id when it is answered, so only durable messages are counted).
//!
//! Costs: an ACK of an unwatched group costs one hash lookup; of a watched
//! one, one more insert. A flush visits only the groups that are due, and
//! for each its subscribers: list mode, the members that moved (at most
//! `receipt_members_max`) once per subscriber; counts mode,
//! `RECENT_SENDS_MAX` read counts (the engine's tree: O(log) each) per
//! distinct sender. Never a walk over a group's members, nor over groups
//! nothing happened in. The mode is decided per interval from the member
//! count (O(1)) when the interval begins, by the first cursor move after
//! the previous flush: one look per interval, never one per ACK. (Deciding
//! it at the previous flush instead kept a mode the group had left: a group
//! that grew while nothing moved got a list of members for its next moves.)
//!
//! Invariants: a group has an entry iff some connection holds a receipt
//! subscription to it; `recent` has a `(group, sender)` entry iff some
//! connection subscribed to the group's receipts with that sender; `due`
//! lists each group at most once and exactly the groups whose entry is
//! marked due; `moved` is empty in counts mode.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::hash::Hash;
use std::time::{Duration, Instant};

use tidemark_engine::Engine;
use tidemark_protocol::{
    MemberEntry, ReceiptCount, RecordsLen, Response, MEMBER_ENTRY_BYTES, RECEIPT_FIXED_BYTES,
};

use crate::outgoing::{reply, Outgoing};

/// Recent messages of one sender in one group whose read counts a
/// RECEIPT_COUNTS reports (format-spec/protocol.md 5.4): bounded so that
/// a flush costs at most this many read counts per sender.
pub const RECENT_SENDS_MAX: usize = 16;

struct Watched<C> {
    /// Connection → the senders it subscribed with to this group.
    subs: HashMap<C, BTreeSet<u64>>,
    /// This interval's mode: the group had more than `receipt_members_max`
    /// members when it began (its first move). Meaningless while not due.
    counts_only: bool,
    /// List mode: members whose cursor moved this interval, latest cursor.
    moved: BTreeMap<u64, u64>,
    due: bool,
}

/// The node's receipt subscriptions and what moved since the last flush.
pub struct Receipts<C> {
    groups: HashMap<u64, Watched<C>>,
    /// Per (group, sender) of a subscription: the sender's recent msg ids,
    /// ascending, at most [`RECENT_SENDS_MAX`].
    recent: HashMap<(u64, u64), VecDeque<u64>>,
    /// Groups to flush, each once.
    due: Vec<u64>,
    /// When the due groups are flushed (set by the first mark of an interval).
    deadline: Option<Instant>,
    interval: Duration,
    members_max: usize,
    frame_bytes_max: usize,
}

/// One receipt frame and the connections it goes to.
pub struct ReceiptFrame<C> {
    pub to: Vec<C>,
    pub frame: Outgoing,
}

impl<C: Copy + Eq + Hash + Ord> Receipts<C> {
    /// `interval`: the coalescing interval (`receipt_interval_ms`);
    /// `members_max`: the list/counts threshold (`receipt_members_max`).
    pub fn new(interval: Duration, members_max: usize, frame_bytes_max: u32) -> Self {
        Receipts {
            groups: HashMap::new(),
            recent: HashMap::new(),
            due: Vec::new(),
            deadline: None,
            interval,
            members_max,
            frame_bytes_max: frame_bytes_max as usize,
        }
    }

    /// Whether some connection wants receipts of `group` (an ACK handler
    /// asks before it looks up the cursor an ACK starts from).
    pub fn watches(&self, group: u64) -> bool {
        self.groups.contains_key(&group)
    }

    /// When the due receipts are to be flushed, if any are.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Adds `conn`'s subscription to the receipts of `group` with `sender`.
    /// True if it is new.
    pub fn add(&mut self, conn: C, sender: u64, group: u64) -> bool {
        let w = self.groups.entry(group).or_insert_with(|| Watched {
            subs: HashMap::new(),
            counts_only: false,
            moved: BTreeMap::new(),
            due: false,
        });
        let added = w.subs.entry(conn).or_default().insert(sender);
        self.recent.entry((group, sender)).or_default();
        added
    }

    /// Drops `conn`'s receipt subscriptions `pairs` of (group, sender).
    pub fn remove(&mut self, conn: C, pairs: impl IntoIterator<Item = (u64, u64)>) {
        for (group, sender) in pairs {
            let Some(w) = self.groups.get_mut(&group) else {
                continue;
            };
            if let Some(senders) = w.subs.get_mut(&conn) {
                senders.remove(&sender);
                if senders.is_empty() {
                    w.subs.remove(&conn);
                }
            }
            // Costs the group's subscribers: what the connection held.
            if !w.subs.values().any(|s| s.contains(&sender)) {
                self.recent.remove(&(group, sender));
            }
            if w.subs.is_empty() {
                self.groups.remove(&group);
                // A stale entry in `due` is skipped by the flush.
            }
        }
    }

    /// A member's cursor in `group` moved to `cursor` (an ACK, a BATCH_ACK
    /// item or a PULL's `ack_up_to` that moved it). The first move after a
    /// flush begins the group's interval and decides its mode.
    pub fn moved(&mut self, engine: &Engine, group: u64, user: u64, cursor: u64) {
        let Some(w) = self.groups.get_mut(&group) else {
            return;
        };
        if !w.due {
            w.due = true;
            w.counts_only = counts_only(engine, group, self.members_max);
            self.due.push(group);
            if self.deadline.is_none() {
                self.deadline = Some(Instant::now() + self.interval);
            }
        }
        if !w.counts_only {
            let c = w.moved.entry(user).or_insert(cursor);
            *c = (*c).max(cursor);
        }
    }

    /// The node accepted (made durable) `msg_id` of `sender` in `group`.
    pub fn sent(&mut self, group: u64, sender: u64, msg_id: u64) {
        let Some(ids) = self.recent.get_mut(&(group, sender)) else {
            return;
        };
        // A retransmit answers an id already listed; ids ascend otherwise.
        if ids.back().is_some_and(|&last| last >= msg_id) {
            return;
        }
        if ids.len() == RECENT_SENDS_MAX {
            ids.pop_front();
        }
        ids.push_back(msg_id);
    }

    /// The receipts due by `now`: the frames to send, or nothing if the
    /// interval has not ended. Each group's frames are in the mode its
    /// interval began with.
    pub fn flush(&mut self, engine: &Engine, now: Instant) -> Vec<ReceiptFrame<C>> {
        if self.deadline.is_none_or(|d| d > now) {
            return Vec::new();
        }
        self.deadline = None;
        let mut out = Vec::new();
        let per_frame =
            (self.frame_bytes_max.saturating_sub(RECEIPT_FIXED_BYTES) / MEMBER_ENTRY_BYTES).max(1);
        for group in std::mem::take(&mut self.due) {
            let Some(w) = self.groups.get_mut(&group) else {
                continue;
            };
            w.due = false;
            let moved = std::mem::take(&mut w.moved);
            let alive = engine.members_version(group).is_ok();
            if alive && !w.counts_only && !moved.is_empty() {
                let mut to: Vec<C> = w.subs.keys().copied().collect();
                to.sort_unstable();
                let entries: Vec<MemberEntry> = moved
                    .into_iter()
                    .map(|(user, cursor)| MemberEntry { user, cursor })
                    .collect();
                for chunk in entries.chunks(per_frame) {
                    let resp: Response<'_, RecordsLen> = Response::Receipt {
                        group,
                        receipts: chunk.to_vec(),
                    };
                    out.push(ReceiptFrame {
                        to: to.clone(),
                        frame: reply(0, &resp, Vec::new(), 0),
                    });
                }
            } else if alive && w.counts_only {
                // One frame per sender, to every connection that named it.
                let mut by_sender: BTreeMap<u64, Vec<C>> = BTreeMap::new();
                for (&conn, senders) in &w.subs {
                    for &s in senders {
                        by_sender.entry(s).or_default().push(conn);
                    }
                }
                for (sender, mut to) in by_sender {
                    let ids = self.recent.get(&(group, sender));
                    let counts: Vec<ReceiptCount> = ids
                        .into_iter()
                        .flatten()
                        .filter_map(|&msg_id| {
                            let count = engine.try_read_count(group, msg_id).ok()?;
                            Some(ReceiptCount {
                                msg_id,
                                count: u64::from(count),
                            })
                        })
                        .collect();
                    if counts.is_empty() {
                        continue;
                    }
                    to.sort_unstable();
                    let resp: Response<'_, RecordsLen> = Response::ReceiptCounts {
                        group,
                        sender,
                        counts,
                    };
                    out.push(ReceiptFrame {
                        to,
                        frame: reply(0, &resp, Vec::new(), 0),
                    });
                }
            }
        }
        out
    }
}

/// Whether `group` gets counts-only receipts: more members than the
/// threshold (a group that does not exist gets none at all).
fn counts_only(engine: &Engine, group: u64, members_max: usize) -> bool {
    engine
        .members_version(group)
        .is_ok_and(|v| v.count > members_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidemark_engine::{Config, FsyncPolicy, JoinStart};
    use tidemark_protocol::{decode_response, Frame};

    fn engine(dir: &std::path::Path) -> Engine {
        let mut c = Config::new(dir);
        c.fsync = FsyncPolicy::Never;
        Engine::open(c).unwrap()
    }

    fn decoded(f: &Outgoing) -> Response<'_> {
        decode_response(&Frame::parse(&f.head).unwrap()).unwrap()
    }

    #[test]
    fn a_flush_lists_each_moved_member_once_with_its_latest_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        e.create_group(1).unwrap();
        for u in [10, 11, 12] {
            e.join(1, u, JoinStart::Head).unwrap();
        }
        let mut r: Receipts<u32> = Receipts::new(Duration::ZERO, 5, 1 << 20);
        assert!(r.add(7, 10, 1));
        assert!(r.add(8, 10, 1));
        assert!(!r.add(8, 10, 1));
        r.moved(&e, 1, 11, 3);
        r.moved(&e, 1, 11, 5);
        r.moved(&e, 1, 12, 2);
        r.moved(&e, 2, 12, 2); // not watched
        let frames = r.flush(&e, Instant::now());
        assert_eq!(frames.len(), 1);
        assert_eq!(frames[0].to, [7, 8]);
        assert_eq!(
            decoded(&frames[0].frame),
            Response::Receipt {
                group: 1,
                receipts: vec![
                    MemberEntry {
                        user: 11,
                        cursor: 5
                    },
                    MemberEntry {
                        user: 12,
                        cursor: 2
                    },
                ],
            }
        );
        // Nothing moved since: nothing to send.
        assert!(r.flush(&e, Instant::now()).is_empty());
        // The last subscription gone, the group is not watched.
        r.remove(7, [(1, 10)]);
        assert!(r.watches(1));
        r.remove(8, [(1, 10)]);
        assert!(!r.watches(1));
        r.moved(&e, 1, 11, 6);
        assert!(r.flush(&e, Instant::now()).is_empty());
    }

    #[test]
    fn a_large_group_gets_counts_of_the_senders_recent_messages_only() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        e.create_group(1).unwrap();
        for u in 1..=4 {
            e.join(1, u, JoinStart::Head).unwrap();
        }
        let mut r: Receipts<u32> = Receipts::new(Duration::ZERO, 3, 1 << 20);
        r.add(7, 1, 1);
        let mut ids = Vec::new();
        for i in 0..(RECENT_SENDS_MAX as u64 + 2) {
            let id = e.append(1, 9, i + 1, b"x").unwrap().msg_id;
            r.sent(1, 1, id);
            ids.push(id);
        }
        r.sent(1, 2, ids[0]); // no subscription names sender 2
        r.sent(1, 1, ids[3]); // a retransmit's answer: already listed
        e.ack(1, 2, ids[5]).unwrap();
        r.moved(&e, 1, 2, ids[5]);
        let frames = r.flush(&e, Instant::now());
        assert_eq!(frames.len(), 1);
        let Response::ReceiptCounts {
            group,
            sender,
            counts,
        } = decoded(&frames[0].frame)
        else {
            panic!("counts expected");
        };
        assert_eq!((group, sender), (1, 1));
        // The last RECENT_SENDS_MAX ids: the first two fell out.
        let want: Vec<ReceiptCount> = ids[2..]
            .iter()
            .map(|&msg_id| ReceiptCount {
                msg_id,
                count: u64::from(msg_id <= ids[5]),
            })
            .collect();
        assert_eq!(counts, want);
    }

    /// Each interval's mode is the member count's when the interval
    /// begins (its first move), both ways; members who joined or left
    /// while nothing moved count at once. Before, the mode decided at the
    /// previous flush stayed: a group that grew while nothing moved got a
    /// RECEIPT for its next move.
    #[test]
    fn the_mode_is_the_member_count_when_the_interval_begins() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        e.create_group(1).unwrap();
        e.join(1, 1, JoinStart::Earliest).unwrap();
        let id = e.append(1, 9, 1, b"x").unwrap().msg_id;
        let mut r: Receipts<u32> = Receipts::new(Duration::ZERO, 1, 1 << 20);
        r.add(7, 9, 1);
        r.sent(1, 9, id);
        let is_list = |f: &[ReceiptFrame<u32>]| match decoded(&f[0].frame) {
            Response::Receipt { .. } => true,
            Response::ReceiptCounts { .. } => false,
            other => panic!("{other:?}"),
        };
        e.ack(1, 1, id).unwrap();
        r.moved(&e, 1, 1, id);
        assert!(is_list(&r.flush(&e, Instant::now())), "1 member: list");
        // A member joins while nothing moves: the next interval counts.
        e.join(1, 2, JoinStart::Earliest).unwrap();
        e.ack(1, 2, id).unwrap();
        r.moved(&e, 1, 2, id);
        assert!(!is_list(&r.flush(&e, Instant::now())), "2 members: counts");
        // A member leaves while nothing moves: the next interval lists.
        e.leave(1, 1).unwrap();
        let id2 = e.append(1, 9, 2, b"y").unwrap().msg_id;
        e.ack(1, 2, id2).unwrap();
        r.moved(&e, 1, 2, id2);
        assert!(is_list(&r.flush(&e, Instant::now())), "1 member: list");
        // A join inside an interval does not change it.
        let id3 = e.append(1, 9, 3, b"z").unwrap().msg_id;
        e.ack(1, 2, id3).unwrap();
        r.moved(&e, 1, 2, id3);
        e.join(1, 3, JoinStart::Earliest).unwrap();
        e.ack(1, 3, id).unwrap();
        r.moved(&e, 1, 3, id);
        assert!(is_list(&r.flush(&e, Instant::now())), "began with 1");
    }

    #[test]
    fn receipts_wait_for_the_interval_and_split_to_fit_the_frame() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        e.create_group(1).unwrap();
        let per_frame = (4096 - RECEIPT_FIXED_BYTES) / MEMBER_ENTRY_BYTES;
        let mut r: Receipts<u32> = Receipts::new(Duration::from_secs(3600), 1 << 20, 4096);
        r.add(7, 1, 1);
        for u in 0..(per_frame as u64 + 1) {
            r.moved(&e, 1, u + 1, 1);
        }
        assert!(r.flush(&e, Instant::now()).is_empty());
        let deadline = r.deadline().unwrap();
        let frames = r.flush(&e, deadline);
        assert_eq!(frames.len(), 2);
        let lens: Vec<usize> = frames
            .iter()
            .map(|f| match decoded(&f.frame) {
                Response::Receipt { receipts, .. } => receipts.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(lens, [per_frame, 1]);
        assert!(frames.iter().all(|f| f.frame.head.len() <= 4096 + 4));
    }
}
