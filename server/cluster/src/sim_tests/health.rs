//! The health figures (`health.rs`) over the simulated network: what each
//! node reports of itself, what the leader reports of a follower cut off
//! (its match stays, its lag grows, it is not heard from), the snapshot
//! that brings it back, and the counters of an election.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Cluster, GROUPS, IDS, WAIT};
use crate::health::{Health, NodeRole, PeerHealth, Progress};

/// Waits until `f` holds for node `id`'s health; that health.
fn wait_health(c: &Cluster, id: u64, what: &str, f: impl Fn(&Health) -> bool) -> Health {
    let deadline = Instant::now() + WAIT;
    loop {
        let h = c.replicas.lock()[&id].health();
        if f(&h) {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "node {id}: {what} not within {WAIT:?}: {h:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn peer(h: &Health, id: u64) -> &PeerHealth {
    h.peers
        .iter()
        .find(|p| p.id == id)
        .unwrap_or_else(|| panic!("node {} reports no peer {id}: {h:?}", h.id))
}

/// Every follower of the leader `leader` holds its log: match at its last
/// index, replicating.
fn caught_up(h: &Health, leader: u64) -> bool {
    h.role == NodeRole::Leader
        && h.peers.len() == IDS.len() - 1
        && h.peers.iter().all(|p| {
            p.id != leader
                && p.voter
                && p.match_index == h.last_index
                && p.lag_entries == 0
                && p.progress == Progress::Replicate
        })
}

#[test]
fn the_leader_reports_a_cut_off_follower_falling_behind_and_its_snapshot_catch_up() {
    let c = Arc::new(Cluster::start(0x4ea1));
    c.raft_log_max_bytes
        .store(16 << 10, std::sync::atomic::Ordering::Release);
    for id in IDS {
        // Restarted with the small bound, so that the leader compacts past
        // the follower cut off.
        c.stop_node(id);
        c.start_node(id);
    }
    c.create_groups();
    c.settle();
    let leader = c.leader().id();
    let h = wait_health(&c, leader, "every follower caught up", |h| {
        caught_up(h, leader)
    });
    assert_eq!(h.leader, Some(leader));
    assert!(h.applied_index <= h.commit_index && h.commit_index <= h.last_index);
    assert!(h.commit_index > 0);
    // Every node names the same leader in the same term, and applies up
    // to the leader's commit point.
    for id in IDS.iter().filter(|&&id| id != leader) {
        let f = wait_health(&c, *id, "applied the leader's commit", |f| {
            f.applied_index >= h.commit_index
        });
        assert_eq!(f.role, NodeRole::Follower, "{f:?}");
        assert_eq!((f.term, f.leader), (h.term, Some(leader)), "{f:?}");
        assert!(f.peers.is_empty(), "a follower reports no peers: {f:?}");
        assert!(f.applied_index <= f.commit_index && f.commit_index <= f.last_index);
    }
    let cut = *IDS.iter().find(|&&id| id != leader).unwrap();
    let other = *IDS.iter().find(|&&id| id != leader && id != cut).unwrap();
    let before = peer(&h, cut).clone();
    c.net.isolate(cut, &IDS);
    // No message from `cut` is delivered after the cut (the network
    // checks links at delivery).
    let cut_at = Instant::now();
    let mut i = 0;
    let mut send = |c: &Cluster| {
        i += 1;
        let g = GROUPS[(i % GROUPS.len() as u64) as usize];
        c.send(g, 5000, i);
    };
    for _ in 0..20 {
        send(&c);
    }
    let h = wait_health(&c, leader, "the other follower heard after the cut", |h| {
        peer(h, other).last_contact > cut_at && peer(h, other).lag_entries == 0
    });
    let p = peer(&h, cut);
    assert!(p.last_contact <= cut_at, "{p:?} heard from after the cut");
    assert!(p.match_index <= before.match_index.max(h.last_index - 20));
    assert!(p.lag_entries >= 20, "20 rounds committed without it: {p:?}");
    assert_eq!(p.lag_entries, h.last_index - p.match_index);
    assert!(p.lag_bytes >= p.lag_entries, "an entry takes bytes: {p:?}");
    assert!(p.voter);
    // Until the leader's log starts past what `cut` holds.
    let deadline = Instant::now() + WAIT;
    while c.leader().log_first_index() <= p.match_index + 1 {
        assert!(Instant::now() < deadline, "the leader never compacted");
        send(&c);
    }
    let h = c.leader().health();
    assert_eq!(
        h.id, leader,
        "the leader changed while the follower was cut"
    );
    let p = peer(&h, cut);
    assert!(p.lag_entries > 20 && p.last_contact <= cut_at, "{p:?}");
    let installed = c.replicas.lock()[&cut]
        .health()
        .counters
        .snapshots_installed;
    c.net.heal();
    let h = wait_health(&c, leader, "the cut follower caught up", |h| {
        caught_up(h, leader) && h.counters.snapshot_sends_finished > 0
    });
    let p = peer(&h, cut);
    assert!(p.last_contact > cut_at && !p.snapshot_sending, "{p:?}");
    let k = h.counters;
    assert!(k.snapshot_sends_started >= k.snapshot_sends_finished + k.snapshot_sends_failed);
    wait_health(&c, cut, "the snapshot installed", |f| {
        f.counters.snapshots_installed > installed && f.role == NodeRole::Follower
    });
}

#[test]
fn an_election_is_counted_by_the_winner_and_seen_by_the_others() {
    let c = Arc::new(Cluster::start(0xe1ec));
    c.create_groups();
    c.settle();
    let old = c.leader();
    let first = old.id();
    let before: HashMap<u64, Health> = IDS
        .iter()
        .map(|&id| (id, c.replicas.lock()[&id].health()))
        .collect();
    let h = &before[&first];
    assert_eq!(h.role, NodeRole::Leader);
    assert!(h.counters.elections_won >= 1 && h.counters.leader_changes >= 1);
    assert!(h.counters.elections_started >= h.counters.elections_won);
    // Cut from the others, not from its clients: a send it takes is
    // proposed and never committed, and refused when it steps down.
    c.net.isolate(first, &IDS);
    let payload = b"to the cut leader".to_vec();
    let tried = old.write(|e| e.append(GROUPS[0], 2000, 1, &payload));
    let proposed = match tried {
        Ok(a) => panic!("a leader cut from its set acknowledged a send: {a:?}"),
        // Stepped down before the send reached the gate: none proposed.
        Err(crate::ClusterError::NotLeader { .. }) => false,
        Err(_) => true,
    };
    let deadline = Instant::now() + WAIT;
    let second = loop {
        let found = c
            .replicas
            .lock()
            .values()
            .find(|r| r.id() != first && r.is_writable())
            .map(|r| r.id());
        if let Some(id) = found {
            break id;
        }
        assert!(Instant::now() < deadline, "no new leader");
        std::thread::sleep(Duration::from_millis(5));
    };
    let won = wait_health(&c, second, "won the election", |h| {
        h.role == NodeRole::Leader && h.term > before[&first].term
    });
    let was = &before[&second].counters;
    assert_eq!(won.leader, Some(second));
    assert!(won.counters.elections_won > was.elections_won, "{won:?}");
    assert!(won.counters.elections_started > was.elections_started);
    assert!(won.counters.leader_changes > was.leader_changes);
    let third = *IDS.iter().find(|&&id| id != first && id != second).unwrap();
    let saw = wait_health(&c, third, "saw the new leader", |h| {
        h.leader == Some(second) && h.term == won.term
    });
    assert_eq!(saw.role, NodeRole::Follower);
    assert!(saw.counters.leader_changes > before[&third].counters.leader_changes);
    assert_eq!(
        saw.counters.elections_won, before[&third].counters.elections_won,
        "it won nothing"
    );
    // The old leader, healed, follows the new one: a leader seen, no
    // election won, its refused proposal counted.
    c.net.heal();
    let back = wait_health(&c, first, "follows the new leader", |h| {
        h.leader == Some(second) && h.role == NodeRole::Follower
    });
    let was = &before[&first].counters;
    assert!(
        back.counters.leader_changes > was.leader_changes,
        "{back:?}"
    );
    assert_eq!(back.counters.elections_won, was.elections_won);
    assert!(back.peers.is_empty());
    if proposed {
        assert!(
            back.counters.proposals_refused > was.proposals_refused,
            "the cut leader's proposal was refused: {back:?}"
        );
    }
}

/// A node waiting to be added says so from its start, before its driver's
/// first turn, and knows no leader, no term and no peer.
#[test]
fn a_node_waiting_to_be_added_reports_joining_from_its_start() {
    let c = Cluster::start(0x901);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = c.config(1);
    cfg.id = 4;
    cfg.dir = dir.path().to_path_buf();
    cfg.members = Vec::new();
    let r = crate::Replica::start(cfg, c.net.transport(4)).unwrap();
    let h = r.health();
    assert_eq!(h.role, NodeRole::Joining, "{h:?}");
    assert_eq!((h.id, h.term, h.leader), (4, 0, None));
    std::thread::sleep(Duration::from_millis(50));
    let h = r.health();
    assert_eq!(h.role, NodeRole::Joining, "after some turns: {h:?}");
    assert!(h.peers.is_empty());
    r.stop();
}
