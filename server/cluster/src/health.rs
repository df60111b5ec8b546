//! A replica's health as an operator sees it (format-spec/protocol.md
//! 4.4.1, the `raft.*` names): this node's role, term, leader, commit and
//! applied index; on the leader, per follower, how far behind it is and
//! when it was last heard from; counters of elections, leaders, refused
//! proposals, snapshots and parked rounds.
//!
//! Who owns what: the driver thread owns a [`Tracker`]. It notes the
//! events it handles (a message from a peer, a refused proposal, a
//! snapshot stream started or ended, entries appended) and, once per
//! turn, observes raft-rs's state (role, term, vote, leader, the leader's
//! `ProgressTracker`) and publishes a [`Health`] in place under a leaf
//! mutex that the driver only *tries* to take: a reader that holds it
//! makes the driver skip that turn's publication (the next turn's comes),
//! so readers never hold the driver up. Readers ([`Replica::health`])
//! clone the small struct under that lock: O(members), no walk of the log.
//!
//! What is estimated: a follower's lag in bytes is its lag in entries
//! times the mean record bytes of the entries this node's Raft log took
//! since it started (exact walks of the log per turn would cost O(lag));
//! exact when entries are of one size. What is counted from observations
//! at the end of each turn rather than from raft-rs's internals, which
//! have no counters: an election started is a new term in which this node
//! voted for itself; an election won, a term this node was seen leading;
//! a leader change, a (term, leader) pair first seen. Each term has at
//! most one candidate per node and one leader, and a turn runs at most
//! one tick, so none is missed or counted twice.
//!
//! Log lines: leadership gained (`info`) and lost (`warn`), each with its
//! term.
//!
//! [`Replica::health`]: crate::Replica::health

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use raft::{ProgressState, RawNode, StateRole};

use crate::members::Role as MemberRole;
use crate::raft_log::RaftLog;

/// This node's part in its replica set now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeRole {
    Leader,
    /// Campaigning in an election (it started a new term).
    Candidate,
    /// Asking whether it could win before starting an election (pre-vote:
    /// no new term yet).
    PreCandidate,
    /// A voter following a leader (or waiting for one).
    Follower,
    /// A member that receives the log but does not vote yet (being added,
    /// cluster.md section 11.4).
    Learner,
    /// Started with `--cluster-join` and not added yet: it knows no
    /// membership (cluster.md section 11.2).
    Joining,
}

impl NodeRole {
    /// Every role, in the order of its STATS and metrics names.
    pub const ALL: [NodeRole; 6] = [
        NodeRole::Leader,
        NodeRole::Candidate,
        NodeRole::PreCandidate,
        NodeRole::Follower,
        NodeRole::Learner,
        NodeRole::Joining,
    ];

    /// The role's name: `leader`, `candidate`, `pre_candidate`,
    /// `follower`, `learner`, `joining`.
    pub fn name(self) -> &'static str {
        match self {
            NodeRole::Leader => "leader",
            NodeRole::Candidate => "candidate",
            NodeRole::PreCandidate => "pre_candidate",
            NodeRole::Follower => "follower",
            NodeRole::Learner => "learner",
            NodeRole::Joining => "joining",
        }
    }
}

/// How the leader sends a follower the log (raft-rs's `ProgressState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Finding where the follower's log matches: one message per
    /// heartbeat (after a restart, a rejection or a lost contact).
    Probe,
    /// Streaming entries optimistically: the follower keeps up.
    Replicate,
    /// The follower needs entries compacted away: it is sent a snapshot.
    Snapshot,
}

impl Progress {
    pub const ALL: [Progress; 3] = [Progress::Probe, Progress::Replicate, Progress::Snapshot];

    /// `probe`, `replicate`, `snapshot`.
    pub fn name(self) -> &'static str {
        match self {
            Progress::Probe => "probe",
            Progress::Replicate => "replicate",
            Progress::Snapshot => "snapshot",
        }
    }
}

/// A follower as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerHealth {
    pub id: u64,
    /// A voter (else a learner).
    pub voter: bool,
    /// The last entry the leader knows the follower holds.
    pub match_index: u64,
    /// The next entry the leader sends it.
    pub next_index: u64,
    /// The leader's last index minus `match_index`.
    pub lag_entries: u64,
    /// `lag_entries` times the mean record bytes of an entry (module
    /// docs): an estimate.
    pub lag_bytes: u64,
    /// When the last message from it arrived; the replica's start if none
    /// came since.
    pub last_contact: Instant,
    /// A snapshot stream to it is being written now.
    pub snapshot_sending: bool,
    pub progress: Progress,
}

/// Counters since the replica started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Elections this node started (as a candidate, in a new term).
    pub elections_started: u64,
    /// Terms this node led.
    pub elections_won: u64,
    /// Leaders this node learned of: a (term, leader) pair first seen.
    pub leader_changes: u64,
    /// Proposals of this node's commit thread (and membership changes)
    /// refused or dropped: not the leader (any more), the gate closed
    /// with the proposal in flight, or raft-rs refused it.
    pub proposals_refused: u64,
    /// Snapshot streams to followers started, written whole, and failed
    /// (or not started: the snapshot was no longer offered).
    pub snapshot_sends_started: u64,
    pub snapshot_sends_finished: u64,
    pub snapshot_sends_failed: u64,
    /// Snapshots this replica installed while it ran (not one its start
    /// finished: `snapshot::recover`).
    pub snapshots_installed: u64,
    /// Committed rounds the engine could not take yet (`NotReady`: a job
    /// of its maintenance worker first) and the driver parked until that
    /// job was done (cluster.md section 4); a round parked again when
    /// handed over again counts again.
    pub rounds_parked: u64,
}

/// What [`crate::Replica::health`] answers (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    pub id: u64,
    pub role: NodeRole,
    pub term: u64,
    /// The leader as this node knows it (itself included).
    pub leader: Option<u64>,
    /// The highest entry known committed.
    pub commit_index: u64,
    /// Every committed entry up to here is applied to the engine.
    pub applied_index: u64,
    /// The last entry of this node's Raft log.
    pub last_index: u64,
    /// On the leader, every other member by ascending id; empty otherwise.
    pub peers: Vec<PeerHealth>,
    pub counters: Counters,
}

/// The driver's side (module docs).
pub(crate) struct Tracker {
    id: u64,
    published: Arc<Mutex<Health>>,
    started: Instant,
    /// When each member was last heard from.
    contact: HashMap<u64, Instant>,
    /// Followers a snapshot stream is being written to, with the number
    /// of streams (a new one may start before the old one's end is seen).
    sending: HashMap<u64, u32>,
    counters: Counters,
    /// The last term in which this node voted for itself.
    voted_term: u64,
    /// The term this node led at the last observation.
    led_term: Option<u64>,
    /// The last (term, leader) seen with a known leader.
    leader_seen: (u64, u64),
    /// Entries this node's Raft log took since start, and their record
    /// bytes (for the lag estimate).
    entries_appended: u64,
    entry_bytes_appended: u64,
}

impl Tracker {
    /// A tracker for the node `raw` drives, whose log is open: the state
    /// it was started in (a term it voted for itself in before a restart)
    /// counts as no event, and the entries the log holds seed the mean
    /// entry size.
    pub(crate) fn new(raw: &RawNode<RaftLog>, applied: u64) -> Tracker {
        let store = raw.store();
        let hs = store.hard_state();
        let id = raw.raft.id;
        let first = store.start().0 + 1;
        let health = Health {
            id,
            role: role_of(raw),
            term: hs.term,
            leader: None,
            commit_index: hs.commit,
            applied_index: applied,
            last_index: store.last(),
            peers: Vec::new(),
            counters: Counters::default(),
        };
        Tracker {
            id,
            published: Arc::new(Mutex::new(health)),
            started: Instant::now(),
            contact: HashMap::new(),
            sending: HashMap::new(),
            counters: Counters::default(),
            voted_term: if hs.vote == id { hs.term } else { 0 },
            led_term: None,
            leader_seen: (0, 0),
            entries_appended: store.last().saturating_sub(first - 1),
            entry_bytes_appended: store.entry_bytes_from(first),
        }
    }

    /// Where readers find the published health.
    pub(crate) fn published(&self) -> Arc<Mutex<Health>> {
        self.published.clone()
    }

    /// A message from member `from` arrived (only members raft-rs tracks
    /// are noted: the map stays as small as the set).
    pub(crate) fn heard_from(&mut self, raw: &RawNode<RaftLog>, from: u64) {
        if raw.raft.prs().get(from).is_some() {
            self.contact.insert(from, Instant::now());
        }
    }

    pub(crate) fn proposal_refused(&mut self) {
        self.counters.proposals_refused += 1;
    }

    /// A committed round was parked (`Counters::rounds_parked`).
    pub(crate) fn round_parked(&mut self) {
        self.counters.rounds_parked += 1;
    }

    /// A snapshot stream to `to` was handed to the transport (or, if the
    /// snapshot was no longer offered, failed at once: its end follows).
    pub(crate) fn snapshot_send_started(&mut self, to: u64) {
        self.counters.snapshot_sends_started += 1;
        *self.sending.entry(to).or_default() += 1;
    }

    /// A snapshot stream to `to` ended, written whole or not.
    pub(crate) fn snapshot_send_ended(&mut self, to: u64, ok: bool) {
        match ok {
            true => self.counters.snapshot_sends_finished += 1,
            false => self.counters.snapshot_sends_failed += 1,
        }
        if let Some(n) = self.sending.get_mut(&to) {
            *n -= 1;
            if *n == 0 {
                self.sending.remove(&to);
            }
        }
    }

    /// This node's Raft log took `count` entries of `bytes` record bytes.
    pub(crate) fn appended(&mut self, count: u64, bytes: u64) {
        self.entries_appended += count;
        self.entry_bytes_appended += bytes;
    }

    /// The end of a driver turn: counts what changed since the last one,
    /// logs a leadership gained or lost, and publishes the health unless a
    /// reader holds it now. `snapshots_installed` is the replica's count.
    pub(crate) fn turn(&mut self, raw: &RawNode<RaftLog>, applied: u64, snapshots_installed: u64) {
        let r = &raw.raft;
        let (me, term, state) = (self.id, r.term, r.state);
        if r.vote == me && term != self.voted_term {
            self.voted_term = term;
            self.counters.elections_started += 1;
        }
        if let Some(led) = self.led_term {
            if state != StateRole::Leader || led != term {
                self.led_term = None;
                log::warn!(
                    "node {me}: lost the leadership of term {led}: now {} in term {term}, \
                     leader {}",
                    role_of(raw).name(),
                    match r.leader_id {
                        0 => "unknown".to_string(),
                        l => format!("node {l}"),
                    }
                );
            }
        }
        if state == StateRole::Leader && self.led_term.is_none() {
            self.led_term = Some(term);
            self.counters.elections_won += 1;
            log::info!("node {me}: leader of term {term}");
        }
        if r.leader_id != 0 && (term, r.leader_id) != self.leader_seen {
            self.leader_seen = (term, r.leader_id);
            self.counters.leader_changes += 1;
        }
        self.counters.snapshots_installed = snapshots_installed;
        let Some(mut h) = self.published.try_lock() else {
            return;
        };
        let last_index = r.raft_log.last_index();
        h.role = role_of(raw);
        h.term = term;
        h.leader = (r.leader_id != 0).then_some(r.leader_id);
        h.commit_index = r.raft_log.committed;
        h.applied_index = applied;
        h.last_index = last_index;
        h.counters = self.counters;
        h.peers.clear();
        if state != StateRole::Leader {
            return;
        }
        let mean_entry_bytes = self
            .entry_bytes_appended
            .checked_div(self.entries_appended)
            .unwrap_or(0);
        let members = raw.store().members();
        for (&id, pr) in r.prs().iter().filter(|(&id, _)| id != me) {
            let lag_entries = last_index.saturating_sub(pr.matched);
            h.peers.push(PeerHealth {
                id,
                voter: members.get(id).is_none_or(|m| m.role == MemberRole::Voter),
                match_index: pr.matched,
                next_index: pr.next_idx,
                lag_entries,
                lag_bytes: lag_entries.saturating_mul(mean_entry_bytes),
                last_contact: self.contact.get(&id).copied().unwrap_or(self.started),
                snapshot_sending: self.sending.contains_key(&id),
                progress: match pr.state {
                    ProgressState::Probe => Progress::Probe,
                    ProgressState::Replicate => Progress::Replicate,
                    ProgressState::Snapshot => Progress::Snapshot,
                },
            });
        }
        h.peers.sort_by_key(|p| p.id);
    }
}

/// The role of the node `raw` drives: raft-rs's, told apart for a
/// learner (raft-rs calls it a follower) and a node waiting to be added
/// (no membership yet).
fn role_of(raw: &RawNode<RaftLog>) -> NodeRole {
    let members = raw.store().members();
    if members.list.is_empty() {
        return NodeRole::Joining;
    }
    match raw.raft.state {
        StateRole::Leader => NodeRole::Leader,
        StateRole::Candidate => NodeRole::Candidate,
        StateRole::PreCandidate => NodeRole::PreCandidate,
        StateRole::Follower => match members.get(raw.raft.id).map(|m| m.role) {
            Some(MemberRole::Learner) => NodeRole::Learner,
            _ => NodeRole::Follower,
        },
    }
}
