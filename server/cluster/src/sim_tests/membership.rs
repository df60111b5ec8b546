//! Membership changes over the simulated network (cluster.md section 11):
//! a node is replaced while clients send.

use std::collections::HashMap;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{check_acknowledged, run_clients, Cluster, WAIT};
use crate::members::{Change, ChangeRefused, Members};
use crate::{Replica, ReplicaConfig};

/// Asks whichever node leads for `change` until it is answered with the
/// membership (a refusal other than "not the leader" or "interrupted" fails
/// the test).
fn change(c: &Cluster, change: Change) -> Members {
    let deadline = Instant::now() + WAIT;
    loop {
        let (tx, rx) = channel();
        c.leader().change_members(
            change.clone(),
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        match rx.recv_timeout(WAIT) {
            Ok(Ok(m)) => return m,
            Ok(Err(ChangeRefused::NotLeader { .. } | ChangeRefused::Interrupted { .. })) => {}
            other => panic!("{change:?}: {other:?}"),
        }
        assert!(Instant::now() < deadline, "{change:?} not made");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A node with an empty directory and no members: it waits to be added.
fn start_joiner(c: &Cluster, id: u64, dir: &std::path::Path) {
    let mut cfg: ReplicaConfig = c.config(1);
    cfg.id = id;
    cfg.dir = dir.to_path_buf();
    cfg.members = Vec::new();
    let r = Replica::start(cfg, c.net.transport(id)).unwrap();
    c.net.attach(id, r.mailbox());
    c.replicas.lock().insert(id, Arc::new(r));
}

/// Node 3 dies for good; node 4 joins with an empty directory (it catches
/// up by a snapshot: a bootstrapped log never holds entry 1), is added,
/// node 3 removed, all under clients' sends; then the leader crashes and
/// the set {1, 2, 4} elects and serves; every member restarted comes back
/// with the new membership.
#[test]
fn a_dead_node_is_replaced_under_load_and_the_new_set_elects_without_it() {
    let c = Arc::new(Cluster::start(0x3e3b));
    c.net.set_faults(5, 2, 3);
    c.create_groups();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients = run_clients(&c, 2, u64::MAX, &stop);
    std::thread::sleep(Duration::from_millis(200));
    if c.leader().id() == 3 {
        c.crash_node(3);
        c.leader();
    } else {
        c.crash_node(3);
    }
    let dir4 = c._root.path().join("node4");
    start_joiner(&c, 4, &dir4);
    // Not a member yet: it elects nothing and serves nothing.
    assert!(c.replicas.lock()[&4].members().list.is_empty());
    let added = change(
        &c,
        Change::Add {
            id: 4,
            cluster_addr: "10.0.0.4:7104".into(),
            client_addr: "10.0.0.4:7004".into(),
        },
    );
    assert_eq!(added.conf_state().voters, vec![1, 2, 3, 4]);
    assert_eq!(added.get(4).unwrap().client_addr, "10.0.0.4:7004");
    let removed = change(&c, Change::Remove { id: 3 });
    assert_eq!(removed.conf_state().voters, vec![1, 2, 4]);
    assert!(c.replicas.lock()[&4].snapshots_installed() >= 1);
    // Refusals: unknown id, an id already a member with other addresses.
    for (bad, want) in [
        (
            Change::Remove { id: 3 },
            ChangeRefused::UnknownMember { id: 3 },
        ),
        (
            Change::Add {
                id: 2,
                cluster_addr: "x".into(),
                client_addr: "y".into(),
            },
            ChangeRefused::AlreadyMember { id: 2 },
        ),
    ] {
        let (tx, rx) = channel();
        c.leader()
            .change_members(bad, Box::new(move |r| tx.send(r).unwrap()));
        assert_eq!(rx.recv_timeout(WAIT).unwrap(), Err(want));
    }
    std::thread::sleep(Duration::from_millis(200));
    // The leader dies: two of {1, 2, 4} elect one (node 4 votes).
    let old = c.leader().id();
    c.crash_node(old);
    let new = c.leader().id();
    assert_ne!(new, old);
    std::thread::sleep(Duration::from_millis(200));
    c.start_node(old);
    stop.store(true, std::sync::atomic::Ordering::Release);
    let mut acked = HashMap::new();
    for h in clients {
        acked.extend(h.join().unwrap());
    }
    assert!(acked.len() > 20, "the clients got answers: {}", acked.len());
    c.net.set_faults(0, 0, 0);
    c.settle();
    check_acknowledged(&c.identical_state(), &acked);
    // Every member restarted: the membership is the Raft log's, not the
    // configured {1, 2, 3}, as soon as it starts.
    for id in [1, 2] {
        c.stop_node(id);
        c.start_node(id);
        assert_eq!(c.replicas.lock()[&id].members(), removed, "node {id}");
    }
    c.stop_node(4);
    start_joiner(&c, 4, &dir4);
    assert_eq!(c.replicas.lock()[&4].members(), removed, "node 4");
    c.settle();
    check_acknowledged(&c.identical_state(), &acked);
}
