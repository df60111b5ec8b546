//! The slow log: the last requests that took at least a threshold, kept
//! for SLOWLOG (format-spec/protocol.md 4.25) and `tidemark slowlog`.
//!
//! Representation: a ring of at most `entries_max` [`Entry`]s, oldest at
//! the front, each a fixed-size value: the request's opcode, its
//! [`Summary`] (the few numbers that say what it asked, never payload
//! bytes), the client's address, when it was handled and how long it
//! took. Text is made only when the log is read.
//!
//! Invariants: entry ids are dense from 1 in the order requests finished;
//! the ring holds the newest `min(recorded, entries_max)` of them (fewer
//! after a reset).
//!
//! Costs: [`SlowLog::finished`] is one comparison for a request under the
//! threshold and O(1) for a slow one (a clock read, a push and at most one
//! pop, no allocation once the ring is full), on the event loop; a read
//! formats at most `entries_max` entries.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tidemark_protocol::{Opcode, Request, Subscription};

/// Longest argument summary sent (longer ones are cut at a char boundary).
pub const ARGS_BYTES_MAX: usize = 128;

/// What a request asked, in a few numbers: enough to find it again
/// (group, user, ids, sizes), nothing of its payload. `Copy` and fixed
/// size, so that every request can carry one at no allocation; 48 bytes
/// (the names are one static list per kind of request), since every
/// request's summary moves with it from the connection to its answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// The fields' names, at most [`Summary::FIELDS_MAX`].
    names: &'static [&'static str],
    /// `values[i]` is the value of `names[i]`; the rest are 0.
    values: [u64; Summary::FIELDS_MAX],
}

impl Summary {
    /// Fields kept; a request's later ones are left out.
    const FIELDS_MAX: usize = 4;

    /// The fields `names`, with `values` in the same order (as many).
    fn of(names: &'static [&'static str], values: &[u64]) -> Summary {
        debug_assert_eq!(names.len(), values.len());
        let kept = names.len().min(Self::FIELDS_MAX);
        let mut s = Summary {
            names: &names[..kept],
            values: [0; Self::FIELDS_MAX],
        };
        for (slot, v) in s.values.iter_mut().zip(values) {
            *slot = *v;
        }
        s
    }

    /// The summary of a decoded request. O(1): a list argument is
    /// summarised by its length.
    pub fn of_request(req: &Request<'_>) -> Summary {
        match req {
            Request::Hello {
                min_version,
                max_version,
                client_name,
            } => Summary::of(
                &["min_version", "max_version", "client_name_bytes"],
                &[
                    u64::from(*min_version),
                    u64::from(*max_version),
                    client_name.len() as u64,
                ],
            ),
            Request::Auth { token } => Summary::of(&["token_bytes"], &[token.len() as u64]),
            Request::Ping
            | Request::Cluster
            | Request::ClusterMap
            | Request::Stats
            | Request::Backup
            | Request::Info
            | Request::Unsubscribe => Summary::default(),
            Request::SlowLog { reset, max_count } => Summary::of(
                &["reset", "max_count"],
                &[u64::from(*reset), u64::from(*max_count)],
            ),
            Request::ClusterChange(c) => Summary::of(
                &["node_id"],
                &[match c {
                    tidemark_protocol::MemberChange::Add { node_id, .. }
                    | tidemark_protocol::MemberChange::Remove { node_id } => *node_id,
                }],
            ),
            Request::CreateGroup { group }
            | Request::DeleteGroup { group }
            | Request::GroupInfo { group } => Summary::of(&["group"], &[*group]),
            Request::Join { group, user, .. } | Request::Leave { group, user } => {
                Summary::of(&["group", "user"], &[*group, *user])
            }
            Request::SetRetention {
                group,
                by_cursor,
                max_age_ms,
                max_bytes,
            } => Summary::of(
                &["group", "by_cursor", "max_age_ms", "max_bytes"],
                &[*group, u64::from(*by_cursor), *max_age_ms, *max_bytes],
            ),
            Request::ClearHistory { group, user, up_to } => {
                Summary::of(&["group", "user", "up_to"], &[*group, *user, *up_to])
            }
            Request::Send {
                group,
                sender,
                client_msg_id,
                payload,
            } => Summary::of(
                &["group", "sender", "client_msg_id", "payload_bytes"],
                &[*group, *sender, *client_msg_id, payload.len() as u64],
            ),
            Request::HistoryLatest {
                group,
                user,
                before_msg_id,
                max_count,
            } => Summary::of(
                &["group", "user", "before_msg_id", "max_count"],
                &[*group, *user, *before_msg_id, u64::from(*max_count)],
            ),
            Request::Recall {
                group,
                sender,
                client_msg_id,
                target,
            } => Summary::of(
                &["group", "sender", "client_msg_id", "target"],
                &[*group, *sender, *client_msg_id, *target],
            ),
            Request::Edit {
                group,
                sender,
                client_msg_id,
                target,
                payload,
            } => Summary::of(
                &[
                    "group",
                    "sender",
                    "client_msg_id",
                    "target",
                    "payload_bytes",
                ],
                &[
                    *group,
                    *sender,
                    *client_msg_id,
                    *target,
                    payload.len() as u64,
                ],
            ),
            Request::Pull {
                group,
                user,
                max_count,
                wait_ms,
                ..
            } => Summary::of(
                &["group", "user", "max_count", "wait_ms"],
                &[*group, *user, u64::from(*max_count), u64::from(*wait_ms)],
            ),
            Request::Ack {
                group,
                user,
                msg_id,
            } => Summary::of(&["group", "user", "msg_id"], &[*group, *user, *msg_id]),
            Request::BatchAck { user, items } => {
                Summary::of(&["user", "items"], &[*user, items.len() as u64])
            }
            Request::Unread { user } => Summary::of(&["user"], &[*user]),
            Request::Sync {
                user,
                per_group_max,
                continuation,
                ..
            } => Summary::of(
                &["user", "per_group_max", "continuation"],
                &[*user, u64::from(*per_group_max), *continuation],
            ),
            Request::History {
                group,
                user,
                before_msg_id,
                max_count,
            } => Summary::of(
                &["group", "user", "before_msg_id", "max_count"],
                &[*group, *user, *before_msg_id, u64::from(*max_count)],
            ),
            Request::ReadCount { group, msg_id } => {
                Summary::of(&["group", "msg_id"], &[*group, *msg_id])
            }
            Request::Members {
                group,
                after_user,
                max_count,
            } => Summary::of(
                &["group", "after_user", "max_count"],
                &[*group, *after_user, u64::from(*max_count)],
            ),
            Request::Readers {
                group,
                msg_id,
                after_user,
                max_count,
            } => Summary::of(
                &["group", "msg_id", "after_user", "max_count"],
                &[*group, *msg_id, *after_user, u64::from(*max_count)],
            ),
            Request::SubscribeReceipts { sender, groups } => {
                Summary::of(&["sender", "groups"], &[*sender, groups.len() as u64])
            }
            Request::Subscribe(Subscription::User(user)) => Summary::of(&["user"], &[*user]),
            Request::Subscribe(Subscription::Groups(groups)) => {
                Summary::of(&["groups"], &[groups.len() as u64])
            }
        }
    }

    /// `name=value` pairs separated by spaces, at most [`ARGS_BYTES_MAX`]
    /// bytes.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (name, value) in self.names.iter().zip(self.values) {
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&format!("{name}={value}"));
        }
        if out.len() > ARGS_BYTES_MAX {
            let mut cut = ARGS_BYTES_MAX;
            while !out.is_char_boundary(cut) {
                cut -= 1;
            }
            out.truncate(cut);
        }
        out
    }
}

/// One slow request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub unix_ms: u64,
    pub duration: Duration,
    pub op: Opcode,
    pub client: SocketAddr,
    pub args: Summary,
}

/// The ring of slow requests. Owned by the event loop.
#[derive(Debug)]
pub struct SlowLog {
    threshold: Duration,
    entries_max: usize,
    ring: VecDeque<Entry>,
    /// Slow requests recorded since start (the last entry's id).
    recorded: u64,
}

impl SlowLog {
    pub fn new(threshold_us: u64, entries_max: usize) -> SlowLog {
        SlowLog {
            threshold: Duration::from_micros(threshold_us),
            entries_max,
            ring: VecDeque::new(),
            recorded: 0,
        }
    }

    /// New limits (SIGHUP): the threshold judges requests from now on; a
    /// smaller log drops its oldest entries. O(entries dropped).
    pub fn set_limits(&mut self, threshold_us: u64, entries_max: usize) {
        self.threshold = Duration::from_micros(threshold_us);
        self.entries_max = entries_max;
        while self.ring.len() > entries_max {
            self.ring.pop_front();
        }
    }

    /// A request finished after `took`: kept if it took at least the
    /// threshold (and the log keeps any entry). O(1).
    pub fn finished(&mut self, op: Opcode, took: Duration, client: SocketAddr, args: Summary) {
        if took < self.threshold || self.entries_max == 0 {
            return;
        }
        self.recorded += 1;
        if self.ring.len() >= self.entries_max {
            self.ring.pop_front();
        }
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.ring.push_back(Entry {
            id: self.recorded,
            unix_ms,
            duration: took,
            op,
            client,
            args,
        });
    }

    /// The newest entries first.
    pub fn newest_first(&self) -> impl Iterator<Item = &Entry> {
        self.ring.iter().rev()
    }

    /// Empties the log (the ids go on from where they were).
    pub fn reset(&mut self) {
        self.ring.clear();
    }

    pub fn len(&self) -> usize {
        self.ring.len()
    }

    pub fn recorded(&self) -> u64 {
        self.recorded
    }

    pub fn threshold_us(&self) -> u64 {
        self.threshold.as_micros() as u64
    }

    pub fn entries_max(&self) -> usize {
        self.entries_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:5000".parse().unwrap()
    }

    #[test]
    fn keeps_the_newest_slow_requests_up_to_its_size() {
        let mut log = SlowLog::new(1_000, 3);
        let fast = Duration::from_micros(999);
        let slow = Duration::from_micros(1_000);
        log.finished(Opcode::Ping, fast, addr(), Summary::default());
        assert_eq!(log.len(), 0, "under the threshold: not kept");
        for group in 1..=5 {
            let args = Summary::of_request(&Request::CreateGroup { group });
            log.finished(Opcode::CreateGroup, slow, addr(), args);
        }
        assert_eq!((log.len(), log.recorded()), (3, 5));
        let ids: Vec<u64> = log.newest_first().map(|e| e.id).collect();
        assert_eq!(ids, vec![5, 4, 3]);
        let newest = log.newest_first().next().unwrap();
        assert_eq!(newest.args.text(), "group=5");
        assert_eq!(newest.client, addr());
        log.reset();
        assert_eq!(log.len(), 0);
        log.finished(Opcode::Ping, slow, addr(), Summary::default());
        assert_eq!(log.newest_first().next().unwrap().id, 6, "ids go on");
        // A log of no entries keeps nothing, and counts nothing.
        let mut off = SlowLog::new(0, 0);
        off.finished(Opcode::Ping, slow, addr(), Summary::default());
        assert_eq!((off.len(), off.recorded()), (0, 0));
    }

    /// New limits: the threshold judges the next requests, and a smaller
    /// log keeps its newest entries.
    #[test]
    fn new_limits_apply_to_the_next_request_and_shrink_the_log() {
        let mut log = SlowLog::new(1_000, 4);
        let slow = Duration::from_micros(1_000);
        for _ in 0..4 {
            log.finished(Opcode::Ping, slow, addr(), Summary::default());
        }
        log.set_limits(2_000, 2);
        assert_eq!((log.threshold_us(), log.entries_max()), (2_000, 2));
        let ids: Vec<u64> = log.newest_first().map(|e| e.id).collect();
        assert_eq!(ids, vec![4, 3]);
        log.finished(Opcode::Ping, slow, addr(), Summary::default());
        assert_eq!(log.recorded(), 4, "under the new threshold");
        log.set_limits(0, 3);
        log.finished(Opcode::Ping, slow, addr(), Summary::default());
        let ids: Vec<u64> = log.newest_first().map(|e| e.id).collect();
        assert_eq!(ids, vec![5, 4, 3]);
    }

    #[test]
    fn a_summary_names_the_arguments_never_the_payload() {
        let send = Request::Send {
            group: 7,
            sender: 42,
            client_msg_id: 9,
            payload: b"secret words",
        };
        let text = Summary::of_request(&send).text();
        assert_eq!(text, "group=7 sender=42 client_msg_id=9 payload_bytes=12");
        assert!(!text.contains("secret"));
        let auth = Summary::of_request(&Request::Auth { token: b"s3cret" }).text();
        assert_eq!(auth, "token_bytes=6");
        // The longest summary fits the wire bound with room to spare.
        let max = Summary::of(&["a_long_field_name"; 4], &[u64::MAX; 4]).text();
        assert!(max.len() <= ARGS_BYTES_MAX, "{}", max.len());
    }

    #[test]
    fn a_summary_keeps_the_first_four_fields_in_48_bytes() {
        let edit = Request::Edit {
            group: 7,
            sender: 42,
            client_msg_id: 9,
            target: 3,
            payload: b"new words",
        };
        let text = Summary::of_request(&edit).text();
        assert_eq!(text, "group=7 sender=42 client_msg_id=9 target=3");
        let ack = Request::Ack {
            group: 7,
            user: 8,
            msg_id: 0,
        };
        assert_eq!(Summary::of_request(&ack).text(), "group=7 user=8 msg_id=0");
        assert_eq!(Summary::default().text(), "");
        assert_eq!(std::mem::size_of::<Summary>(), 48);
    }
}
