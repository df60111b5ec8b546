//! A membership change over loopback TCP (cluster.md sections 7 and 11):
//! the leader's transport learns the added node's address from the
//! change, the new node (which knows the set's addresses from its flags)
//! catches up by a snapshot streamed on its own connection.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_engine::JoinStart;

use super::{leader, secret, write, Node};
use crate::members::{Change, ChangeRefused, Member, Members, Role};
use crate::sim_tests::{check_acknowledged, state_of, Acked};
use crate::tcp::{BoundListener, ListenerLimits, TcpTransport};
use crate::{Replica, ReplicaConfig};

const WAIT: Duration = Duration::from_secs(20);

fn members(addrs: &HashMap<u64, SocketAddr>, ids: &[u64]) -> Vec<Member> {
    ids.iter()
        .map(|&id| Member {
            id,
            role: Role::Voter,
            cluster_addr: addrs[&id].to_string(),
            client_addr: format!("127.0.0.1:{}", 9000 + id),
        })
        .collect()
}

/// Node `id` with `members` as its first membership (none: it waits to be
/// added), sending to every other address of `addrs`.
fn start_member(
    id: u64,
    dir: &std::path::Path,
    addrs: &HashMap<u64, SocketAddr>,
    bound: BoundListener,
    members: Vec<Member>,
) -> Node {
    let mut cfg = ReplicaConfig::new(id, &[], dir.join(format!("node{id}")));
    cfg.members = members;
    cfg.engine.payload_bytes_max = 1024;
    cfg.engine.commit_round_bytes_max = 256 << 10;
    let peers: HashMap<u64, SocketAddr> = addrs
        .iter()
        .filter(|(&p, _)| p != id)
        .map(|(&p, &a)| (p, a))
        .collect();
    let transport = TcpTransport::new(id, &peers, secret()).unwrap();
    let replica = Replica::start(cfg, transport).unwrap();
    let listener = bound
        .start(id, replica.mailbox(), secret(), ListenerLimits::default())
        .unwrap();
    Node {
        replica: Arc::new(replica),
        _listener: listener,
    }
}

fn change(nodes: &HashMap<u64, Node>, change: Change) -> Members {
    let deadline = Instant::now() + WAIT;
    loop {
        let (tx, rx) = channel();
        leader(nodes).change_members(
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

fn converged(nodes: &HashMap<u64, Node>) -> Vec<crate::sim_tests::GroupState> {
    let deadline = Instant::now() + WAIT;
    loop {
        let states: Vec<_> = nodes
            .values()
            .map(|n| n.replica.read(state_of).unwrap())
            .collect();
        if states.iter().all(|s| *s == states[0]) {
            return states[0].clone();
        }
        assert!(Instant::now() < deadline, "the replicas did not converge");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_node_added_over_tcp_is_reached_at_the_address_its_change_names() {
    let root = tempfile::tempdir().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut bound: HashMap<u64, BoundListener> = [1, 2, 3, 4]
        .iter()
        .map(|&id| (id, BoundListener::bind(any).unwrap()))
        .collect();
    let addrs: HashMap<u64, SocketAddr> = bound
        .iter()
        .map(|(&id, b)| (id, b.local_addr().unwrap()))
        .collect();
    // The set's first three know one another, not node 4.
    let first: HashMap<u64, SocketAddr> = addrs
        .iter()
        .filter(|(&id, _)| id != 4)
        .map(|(&i, &a)| (i, a))
        .collect();
    let mut nodes: HashMap<u64, Node> = [1, 2, 3]
        .iter()
        .map(|&id| {
            let b = bound.remove(&id).unwrap();
            (
                id,
                start_member(id, root.path(), &first, b, members(&addrs, &[1, 2, 3])),
            )
        })
        .collect();
    write(&nodes, |e| e.create_group(7));
    write(&nodes, |e| e.join(7, 1, JoinStart::Head));
    let mut acked = Acked::new();
    let mut send = |nodes: &HashMap<u64, Node>, i: u64| {
        let payload = format!("m{i}");
        let id = write(nodes, |e| e.append(7, 500, i, payload.as_bytes())).msg_id;
        acked.insert((7, 500, i), id);
    };
    for i in 1..=20 {
        send(&nodes, i);
    }
    // Node 3 dies for good (its leadership, if it led, goes to another).
    drop(nodes.remove(&3));
    let joiner = start_member(4, root.path(), &addrs, bound.remove(&4).unwrap(), vec![]);
    nodes.insert(4, joiner);
    let added = change(
        &nodes,
        Change::Add {
            id: 4,
            cluster_addr: addrs[&4].to_string(),
            client_addr: "127.0.0.1:9004".into(),
        },
    );
    assert_eq!(added.conf_state().voters, vec![1, 2, 3, 4]);
    let removed = change(&nodes, Change::Remove { id: 3 });
    assert_eq!(removed.conf_state().voters, vec![1, 2, 4]);
    assert!(nodes[&4].replica.snapshots_installed() >= 1);
    for i in 21..=40 {
        send(&nodes, i);
    }
    // The leader stops: the other two of {1, 2, 4} elect one and serve.
    let old = leader(&nodes).id();
    drop(nodes.remove(&old));
    for i in 41..=60 {
        send(&nodes, i);
    }
    // Back with its first flags: its Raft log's membership is used.
    let rebound = BoundListener::bind(addrs[&old]).unwrap();
    nodes.insert(
        old,
        start_member(
            old,
            root.path(),
            &first,
            rebound,
            members(&addrs, &[1, 2, 3]),
        ),
    );
    let state = converged(&nodes);
    check_acknowledged(&state, &acked);
    assert_eq!(state[0].1, 60);
    for n in nodes.values() {
        assert_eq!(n.replica.members().conf_state().voters, vec![1, 2, 4]);
        n.replica.stop();
    }
}
