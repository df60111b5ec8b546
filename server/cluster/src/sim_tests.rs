//! A 3-replica set in one process over the simulated network (`sim.rs`):
//! loss, duplication, delay, partitions, and crash-restart of a replica
//! from its files. What every test checks at the end, once the replicas
//! settled: the same rounds on every replica, byte-identical group logs,
//! the same members at the same join points; every send a client was told
//! was acknowledged is in the log exactly once, at the msg_id it was
//! given, and ids are dense.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tidemark_engine::{Engine, Error as EngineError, JoinStart};

use crate::raft_log::RaftLog;
use crate::sim::{self, Net, Rng};
use crate::{ClusterError, Replica, ReplicaConfig};

mod health;
mod membership;
mod parked;

const IDS: [u64; 3] = [1, 2, 3];
const GROUPS: [u64; 3] = [11, 12, 13];
/// Members join at the head and never send or ACK: their cursors stay at
/// their join points on every replica. Senders are not members.
const MEMBERS: [u64; 2] = [1, 2];
const WAIT: Duration = Duration::from_secs(20);

struct Cluster {
    _root: tempfile::TempDir,
    dirs: HashMap<u64, PathBuf>,
    net: Arc<Net>,
    replicas: Mutex<HashMap<u64, Arc<Replica>>>,
    /// Every replica's `raft_log_max_bytes`.
    raft_log_max_bytes: std::sync::atomic::AtomicU64,
    /// Every replica's engine's `load_in_background` (off: the engine's
    /// default).
    load_in_background: std::sync::atomic::AtomicBool,
}

impl Cluster {
    fn start(seed: u64) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let dirs = IDS
            .iter()
            .map(|&id| (id, root.path().join(format!("node{id}"))))
            .collect();
        let c = Cluster {
            _root: root,
            dirs,
            net: Net::new(seed),
            replicas: Mutex::new(HashMap::new()),
            raft_log_max_bytes: crate::replica::RAFT_LOG_MAX_BYTES_DEFAULT.into(),
            load_in_background: false.into(),
        };
        for id in IDS {
            c.start_node(id);
        }
        c
    }

    fn config(&self, id: u64) -> ReplicaConfig {
        let mut cfg = ReplicaConfig::new(id, &IDS, self.dirs[&id].clone());
        // Elections after 100-200 ms: the tests pause and cut leaders.
        cfg.election_ticks = 10;
        // Small limits and files (as the engine's replication tests use):
        // rounds cross journal files, checkpoints run, segments roll.
        cfg.engine.payload_bytes_max = 1024;
        cfg.engine.segment_bytes_max = 8192;
        cfg.engine.index_interval_bytes = 512;
        cfg.engine.commit_round_bytes_max = 256 << 10;
        cfg.engine.journal_file_bytes = 4096;
        cfg.engine.checkpoint_journal_bytes = 64 << 10;
        cfg.raft_log_max_bytes = self
            .raft_log_max_bytes
            .load(std::sync::atomic::Ordering::Acquire);
        cfg.engine.load_in_background = self
            .load_in_background
            .load(std::sync::atomic::Ordering::Acquire);
        cfg
    }

    fn start_node(&self, id: u64) {
        let r = Replica::start(self.config(id), self.net.transport(id)).unwrap();
        self.net.attach(id, r.mailbox());
        self.replicas.lock().insert(id, Arc::new(r));
    }

    /// Crashes a node: its engine dropped as in a crash, its Raft driver
    /// gone; its files stay.
    fn crash_node(&self, id: u64) {
        let r = self.replicas.lock().remove(&id).unwrap();
        self.net.detach(id);
        r.crash();
    }

    fn stop_node(&self, id: u64) {
        let r = self.replicas.lock().remove(&id).unwrap();
        self.net.detach(id);
        r.stop();
    }

    /// The node that accepts writes, waiting for one.
    fn leader(&self) -> Arc<Replica> {
        let deadline = Instant::now() + WAIT;
        loop {
            let found = self
                .replicas
                .lock()
                .values()
                .find(|r| r.is_writable())
                .cloned();
            if let Some(r) = found {
                return r;
            }
            assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Runs a write on whichever node leads, again on any error but the
    /// ones `done` accepts, until it succeeds (a client that retransmits
    /// with the same ids until it has an answer).
    fn write<T>(&self, op: impl Fn(&Engine) -> tidemark_engine::Result<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.leader().write(&op) {
                Ok(v) => return v,
                Err(e) => {
                    assert!(Instant::now() < deadline, "no answer within {WAIT:?}: {e}");
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    fn create_groups(&self) {
        self.create_groups_of(GROUPS);
    }

    /// Creates each group with MEMBERS joined at its head.
    fn create_groups_of(&self, groups: impl IntoIterator<Item = u64>) {
        for g in groups {
            // A retry of a creation that was committed finds the group.
            self.write(|e| match e.create_group(g) {
                Err(EngineError::GroupExists { .. }) => Ok(()),
                other => other,
            });
            for u in MEMBERS {
                self.write(|e| e.join(g, u, JoinStart::Head));
            }
        }
    }

    /// Sends one message until acknowledged; its msg_id.
    fn send(&self, g: u64, sender: u64, client_msg_id: u64) -> u64 {
        let payload = format!("{g}/{sender}/{client_msg_id}").into_bytes();
        self.write(|e| e.append(g, sender, client_msg_id, &payload))
            .msg_id
    }

    /// Waits until every running replica has applied the same rounds as the
    /// leader, and for a round more: a write through the leader commits
    /// everything before it.
    fn settle(&self) -> u64 {
        self.write(|e| e.join(GROUPS[0], MEMBERS[0], JoinStart::Head));
        let deadline = Instant::now() + WAIT;
        loop {
            let rounds: Vec<u64> = self
                .replicas
                .lock()
                .values()
                .map(|r| r.read(|e| e.last_round()).unwrap_or(0))
                .collect();
            if rounds.iter().all(|&r| r == rounds[0]) && rounds.len() == IDS.len() {
                return rounds[0];
            }
            assert!(
                Instant::now() < deadline,
                "replicas did not settle: rounds {rounds:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Every replica's state (module docs), once they are all equal
    /// (followers apply what is committed a little after the leader, and
    /// an engine counts a round as soon as it is journaled, before its
    /// apply ends); fails if they are not equal within `WAIT`.
    fn identical_state(&self) -> Vec<GroupState> {
        let deadline = Instant::now() + WAIT;
        loop {
            let states: Vec<(u64, Vec<GroupState>)> = self
                .replicas
                .lock()
                .iter()
                .map(|(&id, r)| (id, r.read(state_of).unwrap()))
                .collect();
            let differs = states[1..].iter().find(|(_, s)| *s != states[0].1);
            let Some((id, s)) = differs else {
                return states[0].1.clone();
            };
            if Instant::now() >= deadline {
                let brief = |st: &[GroupState]| -> Vec<(u64, u64, usize)> {
                    st.iter().map(|(g, h, b, _)| (*g, *h, b.len())).collect()
                };
                panic!(
                    "replica {id} differs from replica {}: {:?} vs {:?}",
                    states[0].0,
                    brief(s),
                    brief(&states[0].1)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.replicas.lock().keys().copied().collect();
        for id in ids {
            self.stop_node(id);
        }
        sim::stop(&self.net);
    }
}

/// A group as compared: id, head, record bytes, (member, cursor).
pub(crate) type GroupState = (u64, u64, Vec<u8>, Vec<(u64, u64)>);

pub(crate) fn state_of(e: &Engine) -> Vec<GroupState> {
    let mut ids = e.group_ids();
    ids.sort_unstable();
    ids.into_iter()
        .map(|g| {
            let mut bytes = Vec::new();
            let mut after = 0;
            loop {
                let batch = e.read(g, after, usize::MAX, usize::MAX).unwrap();
                for c in &batch.chunks {
                    bytes.extend_from_slice(c.bytes());
                }
                if batch.count == 0 || !batch.has_more {
                    break;
                }
                after = batch.last_id;
            }
            let mut members: Vec<(u64, u64)> = e
                .members(g)
                .unwrap()
                .into_iter()
                .map(|u| (u, e.cursor(g, u).unwrap()))
                .collect();
            members.sort_unstable();
            (g, e.head(g).unwrap(), bytes, members)
        })
        .collect()
}

/// (msg_id, sender, client_msg_id) of every record in `bytes`.
pub(crate) fn records(bytes: &[u8]) -> Vec<(u64, u64, u64)> {
    let mut out = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let h = tidemark_engine::record::decode_header(rest, usize::MAX).unwrap();
        out.push((h.msg_id, h.sender_id, h.client_msg_id));
        rest = &rest[h.record_len as usize..];
    }
    out
}

/// Acknowledged sends: (group, sender, client_msg_id) to the msg_id given.
pub(crate) type Acked = HashMap<(u64, u64, u64), u64>;

/// Every acknowledged send is in its group's log once, at the id it was
/// given; every (sender, client_msg_id) is there at most once; ids dense.
pub(crate) fn check_acknowledged(state: &[GroupState], acked: &Acked) {
    let mut found: HashMap<(u64, u64, u64), u64> = HashMap::new();
    for (g, head, bytes, _) in state {
        let recs = records(bytes);
        let ids: Vec<u64> = recs.iter().map(|r| r.0).collect();
        let dense: Vec<u64> = (1..=*head).collect();
        assert_eq!(ids, dense, "group {g}: ids dense from 1 to the head");
        for (id, sender, cmid) in recs {
            assert!(
                found.insert((*g, sender, cmid), id).is_none(),
                "group {g}: ({sender}, {cmid}) stored twice"
            );
        }
    }
    for (key, id) in acked {
        assert_eq!(found.get(key), Some(id), "acknowledged send {key:?} lost");
    }
}

/// Clients on `threads` threads send `per_thread` messages each, round
/// robin over the groups; the acknowledged ones with their ids.
fn run_clients(
    c: &Arc<Cluster>,
    threads: u64,
    per_thread: u64,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<Acked>> {
    (0..threads)
        .map(|t| {
            let c = c.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut acked = HashMap::new();
                for i in 1..=per_thread {
                    if stop.load(std::sync::atomic::Ordering::Acquire) {
                        break;
                    }
                    let g = GROUPS[(i % GROUPS.len() as u64) as usize];
                    let sender = 1000 + t;
                    let id = c.send(g, sender, i);
                    acked.insert((g, sender, i), id);
                }
                acked
            })
        })
        .collect()
}

#[test]
fn a_replica_set_over_a_lossy_network_holds_identical_logs_and_every_acknowledged_send() {
    let c = Arc::new(Cluster::start(0x5eed));
    c.net.set_faults(10, 5, 5);
    c.create_groups();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut acked = HashMap::new();
    for h in run_clients(&c, 3, 60, &stop) {
        acked.extend(h.join().unwrap());
    }
    assert_eq!(acked.len(), 180);
    c.net.set_faults(0, 0, 0);
    let rounds = c.settle();
    assert!(rounds > GROUPS.len() as u64);
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
    for (g, _, _, members) in &state {
        assert_eq!(members.len(), MEMBERS.len(), "group {g}: members");
    }
}

#[test]
fn acknowledged_sends_survive_leader_crashes_and_the_restarted_replicas_catch_up() {
    let c = Arc::new(Cluster::start(0xc0ffee));
    c.net.set_faults(2, 2, 3);
    c.create_groups();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = run_clients(&c, 2, u64::MAX, &stop);
    let mut rng = Rng(7);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(150 + rng.below(150)));
        let leader = c.leader().id();
        c.crash_node(leader);
        // The others elect a leader and go on while it is down.
        std::thread::sleep(Duration::from_millis(200 + rng.below(200)));
        c.leader();
        c.start_node(leader);
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut acked = HashMap::new();
    for h in clients {
        acked.extend(h.join().unwrap());
    }
    assert!(acked.len() > 20, "the clients got answers: {}", acked.len());
    c.net.set_faults(0, 0, 0);
    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
}

#[test]
fn a_partitioned_leader_acknowledges_nothing_and_its_uncommitted_entry_is_discarded_on_rejoin() {
    let c = Arc::new(Cluster::start(0xbadc0de));
    c.create_groups();
    c.settle();
    let old = c.leader();
    let old_id = old.id();
    let g = GROUPS[0];

    // Cut the leader from the other replicas, not from its clients.
    c.net.isolate(old_id, &IDS);
    let tries: Vec<_> = (1..=3u64)
        .map(|i| {
            let old = old.clone();
            std::thread::spawn(move || {
                let payload = format!("to the cut leader {i}").into_bytes();
                old.write(|e| e.append(g, 2000, i, &payload))
            })
        })
        .collect();
    // The others elect a new leader, which acknowledges sends.
    let deadline = Instant::now() + WAIT;
    let new = loop {
        let found = c
            .replicas
            .lock()
            .values()
            .find(|r| r.id() != old_id && r.is_writable())
            .cloned();
        if let Some(r) = found {
            break r;
        }
        assert!(Instant::now() < deadline, "no new leader");
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut acked = HashMap::new();
    for i in 1..=5 {
        let payload = format!("to the new leader {i}").into_bytes();
        let id = loop {
            match new.write(|e| e.append(g, 3000, i, &payload)) {
                Ok(a) => break a.msg_id,
                Err(ClusterError::NotLeader { .. }) => panic!("the new leader lost its place"),
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        };
        acked.insert((g, 3000, i), id);
    }
    for t in tries {
        let result = t.join().unwrap();
        assert!(
            result.is_err(),
            "a leader cut from its replica set acknowledged a send: {result:?}"
        );
    }

    // Its proposal stayed in its own Raft log only: the last data entry
    // there, of the term it led in.
    c.stop_node(old_id);
    let raft_dir = c.dirs[&old_id].join("raft");
    let (index, term) = {
        let log = RaftLog::open(&raft_dir, &IDS).unwrap();
        let e = (1..=log.last())
            .rev()
            .filter_map(|i| log.entry(i))
            .find(|e| !e.data.is_empty())
            .unwrap();
        (e.index, e.term)
    };

    // Back and healed: it follows, its entry is overwritten, and the
    // replicas match.
    c.start_node(old_id);
    c.net.heal();
    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
    let cut: HashSet<u64> = records(&state[0].2)
        .iter()
        .filter(|r| r.1 == 2000)
        .map(|r| r.2)
        .collect();
    assert!(
        cut.is_empty(),
        "a send to the cut leader was applied: {cut:?}"
    );
    c.stop_node(old_id);
    let log = RaftLog::open(&raft_dir, &IDS).unwrap();
    let now = log.entry(index).map(|e| e.term);
    assert!(
        now.is_some_and(|t| t != term),
        "entry {index} of term {term} still there (now {now:?})"
    );
}

#[test]
fn acknowledged_sends_survive_a_crash_of_every_replica_at_once() {
    let c = Arc::new(Cluster::start(0xfeed));
    c.net.set_faults(2, 2, 3);
    c.create_groups();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = run_clients(&c, 2, u64::MAX, &stop);
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(250));
        for id in IDS {
            c.crash_node(id);
        }
        for id in IDS {
            c.start_node(id);
        }
    }
    std::thread::sleep(Duration::from_millis(250));
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut acked = HashMap::new();
    for h in clients {
        acked.extend(h.join().unwrap());
    }
    assert!(acked.len() > 20, "the clients got answers: {}", acked.len());
    c.net.set_faults(0, 0, 0);
    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
}

#[test]
fn a_leader_paused_past_the_election_timeout_steps_down_on_resume_and_nothing_acknowledged_is_lost()
{
    let c = Arc::new(Cluster::start(0x57091));
    c.net.set_faults(2, 2, 3);
    c.create_groups();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = run_clients(&c, 2, u64::MAX, &stop);
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(150));
        let paused = c.leader();
        // Three to six election timeouts: the others elect a leader.
        paused.pause(Duration::from_millis(600));
        let deadline = Instant::now() + WAIT;
        loop {
            let other = c
                .replicas
                .lock()
                .values()
                .any(|r| r.id() != paused.id() && r.is_writable());
            if other {
                break;
            }
            assert!(Instant::now() < deadline, "no leader while one is paused");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut acked = HashMap::new();
    for h in clients {
        acked.extend(h.join().unwrap());
    }
    assert!(acked.len() > 20, "the clients got answers: {}", acked.len());
    c.net.set_faults(0, 0, 0);
    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
}

/// cluster.md section 5.1: a leader paused (as by SIGSTOP) with a send's
/// round at its gate while the others elect a leader that commits a send
/// to the same group. On resume the deposed leader takes in one turn its
/// round's proposal, the new leader's entries and their commit: it steps
/// down, refuses its round, and must reopen its engine before it applies
/// the new leader's round (its send states still count the refused
/// round's msg_ids, which that round uses too). It goes on as a follower.
/// Its commit thread is slow to mark the refusal itself (descheduled), so
/// that the driver meets the new leader's round before that mark.
#[test]
fn a_deposed_leader_reopens_its_engine_before_it_applies_the_new_leaders_round() {
    let c = Arc::new(Cluster::start(0xde905ed));
    c.create_groups();
    c.settle();
    let g = GROUPS[0];
    let mut acked = HashMap::new();
    for round in 1..=3u64 {
        let old = c.leader();
        old.delay_refusals(Duration::from_millis(500));
        old.pause(Duration::from_millis(800));
        let refused = {
            let old = old.clone();
            std::thread::spawn(move || {
                let payload = format!("to the paused leader {round}").into_bytes();
                old.write(|e| e.append(g, 5000, round, &payload))
            })
        };
        let deadline = Instant::now() + WAIT;
        let new = loop {
            let found = c
                .replicas
                .lock()
                .values()
                .find(|r| r.id() != old.id() && r.is_writable())
                .cloned();
            if let Some(r) = found {
                break r;
            }
            assert!(Instant::now() < deadline, "no leader while one is paused");
            std::thread::sleep(Duration::from_millis(5));
        };
        let payload = format!("to the new leader {round}").into_bytes();
        let id = loop {
            match new.write(|e| e.append(g, 5001, round, &payload)) {
                Ok(a) => break a.msg_id,
                Err(e) => {
                    assert!(Instant::now() < deadline, "the new leader: {e}");
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        };
        acked.insert((g, 5001, round), id);
        // Its outcome is unknown to its client (refused, or committed by
        // the new leader): either way it is stored at most once.
        let _ = refused.join().unwrap();
        // The deposed leader applies the new leader's round.
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(why) = old.stopped_reason() {
                panic!("the deposed leader stopped: {why}");
            }
            let theirs = new.read(|e| e.last_round()).unwrap_or(0);
            if old.read(|e| e.last_round()).is_ok_and(|r| r >= theirs) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the deposed leader never caught up"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        old.delay_refusals(Duration::ZERO);
    }
    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
}

#[test]
fn a_replica_refuses_an_engine_without_fsync_always() {
    let dir = tempfile::tempdir().unwrap();
    let net = Net::new(1);
    let mut cfg = ReplicaConfig::new(1, &IDS, dir.path());
    cfg.engine.fsync = tidemark_engine::FsyncPolicy::Never;
    let r = Replica::start(cfg, net.transport(1));
    assert!(matches!(r, Err(ClusterError::Stopped { .. })));
    assert!(!dir.path().join("raft").exists(), "nothing written");
    sim::stop(&net);
}

/// cluster.md section 8: a follower down while the others write past the
/// Raft log's bound comes back, finds the entries it lacks compacted on
/// the leader, and catches up by a snapshot; after a crash right after the
/// install it comes back from the installed engine and its Raft log.
#[test]
fn a_follower_back_after_the_log_was_compacted_catches_up_by_a_snapshot() {
    let c = Arc::new(Cluster::start(0x5a9));
    c.raft_log_max_bytes
        .store(16 << 10, std::sync::atomic::Ordering::Release);
    for id in IDS {
        // Restarted with the small bound.
        c.stop_node(id);
        c.start_node(id);
    }
    c.create_groups();
    c.settle();
    let down = *IDS.iter().find(|&&id| id != c.leader().id()).unwrap();
    c.crash_node(down);
    let behind = RaftLog::open(&c.dirs[&down].join("raft"), &IDS)
        .unwrap()
        .last();
    let mut acked = HashMap::new();
    // Until the leader compacted past what the follower has (the leader
    // keeps at most half its bound for a lagging follower).
    let deadline = Instant::now() + WAIT;
    let mut i = 0;
    while c.leader().log_first_index() <= behind + 1 {
        assert!(
            Instant::now() < deadline,
            "the leader's log was never compacted"
        );
        i += 1;
        let g = GROUPS[(i % GROUPS.len() as u64) as usize];
        acked.insert((g, 4000, i), c.send(g, 4000, i));
    }
    let streams = c.net.snapshots.load(std::sync::atomic::Ordering::Acquire);
    c.start_node(down);
    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
    let follower = c.replicas.lock()[&down].clone();
    assert!(
        follower.snapshots_installed() >= 1,
        "the follower caught up without a snapshot"
    );
    assert!(c.net.snapshots.load(std::sync::atomic::Ordering::Acquire) > streams);
    assert!(follower.log_first_index() > behind + 1);
    // A crash right after: the installed engine and the reset log reopen,
    // and the follower goes on from them.
    c.crash_node(down);
    c.start_node(down);
    for j in 1..=20 {
        let g = GROUPS[(j % GROUPS.len() as u64) as usize];
        acked.insert((g, 4001, j), c.send(g, 4001, j));
    }
    c.settle();
    check_acknowledged(&c.identical_state(), &acked);
}
