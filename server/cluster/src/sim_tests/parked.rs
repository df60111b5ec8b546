//! A follower whose saved state loads in the background (cluster.md
//! section 4, "A parked round"; storage.md section 11): the rounds its
//! leader commits name groups its engine has not registered yet, so the
//! driver parks them until the maintenance worker looked the groups up,
//! and hands them over again, in order, each once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_engine::{Engine, JoinStart};

use super::{check_acknowledged, Acked, Cluster, IDS, MEMBERS, WAIT};

/// Groups with records and members, none of them with a directory (a
/// few small records each: small groups keep theirs in journal files), so
/// that a restarted follower's open registers none of them.
const SAVED: std::ops::Range<u64> = 200..230;
/// Records each saved group holds before the restart.
const SAVED_RECORDS: u64 = 2;
/// The user who joins some saved groups after the restart.
const JOINER: u64 = 3;
const SENDER: u64 = 900;

/// Holds the background load of the engine on a directory for as long as
/// it lives: a test that fails while it holds must not leave a clean stop
/// waiting for the load.
struct HeldLoad(PathBuf);

impl HeldLoad {
    fn new(dir: PathBuf) -> HeldLoad {
        Engine::hold_load(&dir);
        HeldLoad(dir)
    }
}

impl Drop for HeldLoad {
    fn drop(&mut self) {
        Engine::release_load(&self.0);
    }
}

/// Node `id`'s last applied round and whether its saved state still
/// loads; an error while its engine is being reopened. Fails the test if
/// the replica stopped.
fn progress(c: &Cluster, id: u64) -> Result<(u64, bool), String> {
    let r = c.replicas.lock()[&id].clone();
    if let Some(why) = r.stopped_reason() {
        panic!("node {id} stopped: {why}");
    }
    r.read(|e| (e.last_round(), e.stats().state_loading))
        .map_err(|e| e.to_string())
}

/// Waits until `f` holds for node `id`'s progress; that progress.
fn wait_progress(c: &Cluster, id: u64, what: &str, f: impl Fn((u64, bool)) -> bool) -> (u64, bool) {
    let deadline = Instant::now() + WAIT;
    loop {
        let p = progress(c, id);
        if let Ok(p) = p {
            if f(p) {
                return p;
            }
        }
        assert!(
            Instant::now() < deadline,
            "node {id}: {what} not within {WAIT:?}: (last round, loading) {p:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A follower restarted onto its saved state with its load held: the
/// leader's SENDs, JOINs and ACKs to saved groups the follower has not
/// registered are parked (counted in its health) and applied once the
/// worker's lookups are done, while the load is still held; after the
/// load ends the follower holds exactly the leader's heads, logs, members
/// and cursors, every acknowledged send once at its id, ids dense.
#[test]
fn a_loading_follower_parks_rounds_naming_unregistered_groups_and_applies_each_once_in_order() {
    let c = Arc::new(Cluster::start(0x9a4c3d));
    c.load_in_background.store(true, Ordering::Release);
    c.create_groups();
    let mut acked: Acked = HashMap::new();
    c.create_groups_of(SAVED);
    for g in SAVED {
        for i in 1..=SAVED_RECORDS {
            acked.insert((g, SENDER, i), c.send(g, SENDER, i));
        }
    }
    c.settle();
    let leader = c.leader().id();
    let follower = *IDS.iter().find(|&&id| id != leader).unwrap();
    // A clean stop: the final checkpoint holds every saved group, and
    // the journal tail its next open replays names none.
    c.stop_node(follower);
    let held = HeldLoad::new(c.dirs[&follower].join("engine"));
    c.start_node(follower);
    let parked_before = c.replicas.lock()[&follower].health().counters.rounds_parked;
    assert_eq!(parked_before, 0, "parked before any round came");
    assert_eq!(
        progress(&c, follower).map(|p| p.1),
        Ok(true),
        "the follower's state loads"
    );

    // The first write to each saved group after the restart: a SEND, a
    // JOIN or an ACK, in turn; then a SEND to every one.
    let groups: Vec<u64> = SAVED.collect();
    for (i, &g) in groups.iter().enumerate() {
        match i % 3 {
            0 => {
                acked.insert((g, SENDER, 10), c.send(g, SENDER, 10));
            }
            1 => {
                c.write(|e| e.join(g, JOINER, JoinStart::Head));
            }
            _ => {
                c.write(|e| e.ack(g, MEMBERS[0], SAVED_RECORDS));
            }
        }
    }
    for &g in &groups {
        acked.insert((g, SENDER, 11), c.send(g, SENDER, 11));
    }

    // Every round applies while the load is held: a parked round waits
    // for the worker's lookup, not for the whole load.
    let last = c.leader().read(Engine::last_round).unwrap();
    let applied = wait_progress(&c, follower, "caught up while held", |(r, _)| r >= last);
    assert_eq!(
        applied,
        (last, true),
        "applied every round with its load held"
    );
    let parked = c.replicas.lock()[&follower].health().counters.rounds_parked;
    // Each saved group's first round after the restart named a group
    // not registered, looked up by the worker once asked.
    assert!(
        parked >= groups.len() as u64,
        "the follower parked {parked} rounds, fewer than the {} groups it had to look up",
        groups.len()
    );
    drop(held);
    wait_progress(&c, follower, "the load's end", |(_, loading)| !loading);

    c.settle();
    let state = c.identical_state();
    check_acknowledged(&state, &acked);
    for (i, &g) in groups.iter().enumerate() {
        let Some((_, head, _, members)) = state.iter().find(|s| s.0 == g) else {
            panic!("group {g} missing");
        };
        assert_eq!(
            *head,
            SAVED_RECORDS + 1 + u64::from(i % 3 == 0),
            "group {g}: head"
        );
        let mut expected: Vec<(u64, u64)> = MEMBERS.iter().map(|&u| (u, 0)).collect();
        match i % 3 {
            1 => expected.push((JOINER, SAVED_RECORDS)),
            2 => expected[0].1 = SAVED_RECORDS,
            _ => {}
        }
        assert_eq!(members, &expected, "group {g}: members and cursors");
    }
}
