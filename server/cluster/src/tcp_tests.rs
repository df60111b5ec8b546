//! Tests of the TCP transport (`tcp.rs`, cluster.md section 7): the frame
//! against the spec's vector and bad frames refused; the frame reader's
//! buffer bounded by the bytes that arrived; the listener's bounds (a
//! forged `from` dropped and counted, idle and silent connections closed,
//! the caps), a snapshot stream from a stranger or under another's name
//! refused; a 3-replica set over loopback TCP, authenticated, a follower
//! stopped and restarted on its address.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use raft::eraftpb::{Message, MessageType};
use tidemark_engine::JoinStart;

use crate::peer_auth::ClusterSecret;
use crate::sim_tests::{check_acknowledged, state_of, Acked};
use crate::tcp::{
    decode_frame, encode_frame, frame_len, BoundListener, FrameError, ListenerLimits,
    TcpListenerHandle, TcpTransport, FRAME_BYTES_MAX_DEFAULT,
};
use crate::{Replica, ReplicaConfig};

/// cluster.md section 7's vector: MsgHeartbeat from 1 to 2, term 3,
/// commit 5.
const VECTOR_HEX: &str = "1e00000063b28cfe0100000000000000020000000000000008081002180120034005";

fn heartbeat() -> Message {
    Message {
        msg_type: MessageType::MsgHeartbeat,
        from: 1,
        to: 2,
        term: 3,
        commit: 5,
        ..Default::default()
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn a_frame_is_the_spec_vector_and_bad_frames_are_refused() {
    let mut f = Vec::new();
    encode_frame(&mut f, &heartbeat());
    assert_eq!(hex(&f), VECTOR_HEX);
    assert_eq!(decode_frame(&f).unwrap(), heartbeat());
    let head: [u8; 4] = f[..4].try_into().unwrap();
    assert_eq!(frame_len(head, FRAME_BYTES_MAX_DEFAULT).unwrap(), f.len());
    assert!(matches!(
        frame_len(head, f.len() - 1),
        Err(FrameError::Length { .. })
    ));
    assert!(matches!(
        frame_len([2, 0, 0, 0], 1 << 20),
        Err(FrameError::Length { .. })
    ));
    let mut bad = f.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(matches!(decode_frame(&bad), Err(FrameError::Crc { .. })));
    assert!(matches!(
        decode_frame(&f[..f.len() - 1]),
        Err(FrameError::Length { .. })
    ));
    // A CRC that matches bytes that are not a message.
    let mut junk = f[..24].to_vec();
    junk.extend_from_slice(&[0xff; 5]);
    let len = (junk.len() - 4) as u32;
    junk[..4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&junk[8..]);
    junk[4..8].copy_from_slice(&crc.to_le_bytes());
    assert!(matches!(decode_frame(&junk), Err(FrameError::Message(_))));
}

mod limits;
mod membership;

/// The secret of the sets these tests run.
pub(crate) fn secret() -> ClusterSecret {
    ClusterSecret::new(b"tcp_tests cluster secret".to_vec()).unwrap()
}

const IDS: [u64; 3] = [1, 2, 3];

struct Node {
    replica: Arc<Replica>,
    _listener: TcpListenerHandle,
}

fn start(
    id: u64,
    dir: &std::path::Path,
    addrs: &HashMap<u64, SocketAddr>,
    bound: BoundListener,
) -> Node {
    start_bounded(id, dir, addrs, bound, crate::RAFT_LOG_MAX_BYTES_DEFAULT)
}

fn start_bounded(
    id: u64,
    dir: &std::path::Path,
    addrs: &HashMap<u64, SocketAddr>,
    bound: BoundListener,
    raft_log_max_bytes: u64,
) -> Node {
    let mut cfg = ReplicaConfig::new(id, &IDS, dir.join(format!("node{id}")));
    // Elections after 100-200 ms: the tests kill and cut leaders.
    cfg.election_ticks = 10;
    cfg.raft_log_max_bytes = raft_log_max_bytes;
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

fn leader(nodes: &HashMap<u64, Node>) -> Arc<Replica> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(n) = nodes.values().find(|n| n.replica.is_writable()) {
            return n.replica.clone();
        }
        assert!(Instant::now() < deadline, "no leader");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn write<T>(
    nodes: &HashMap<u64, Node>,
    op: impl Fn(&tidemark_engine::Engine) -> tidemark_engine::Result<T>,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match leader(nodes).write(&op) {
            Ok(v) => return v,
            Err(e) => {
                assert!(Instant::now() < deadline, "no answer: {e}");
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

#[test]
fn three_replicas_over_loopback_tcp_hold_identical_logs_across_a_follower_restart() {
    let root = tempfile::tempdir().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut bound: HashMap<u64, BoundListener> = IDS
        .iter()
        .map(|&id| (id, BoundListener::bind(any).unwrap()))
        .collect();
    let addrs: HashMap<u64, SocketAddr> = bound
        .iter()
        .map(|(&id, b)| (id, b.local_addr().unwrap()))
        .collect();
    let mut nodes: HashMap<u64, Node> = IDS
        .iter()
        .map(|&id| {
            (
                id,
                start(id, root.path(), &addrs, bound.remove(&id).unwrap()),
            )
        })
        .collect();
    write(&nodes, |e| e.create_group(7));
    write(&nodes, |e| e.join(7, 1, JoinStart::Head));
    let mut acked = Acked::new();
    for i in 1..=40u64 {
        let id = write(&nodes, |e| e.append(7, 500, i, format!("m{i}").as_bytes())).msg_id;
        acked.insert((7, 500, i), id);
    }
    // A follower stops; the others go on; it comes back on its address.
    let follower = *IDS
        .iter()
        .find(|&&id| !nodes[&id].replica.is_writable())
        .unwrap();
    let gone = nodes.remove(&follower).unwrap();
    gone.replica.stop();
    drop(gone);
    for i in 41..=60u64 {
        let id = write(&nodes, |e| e.append(7, 500, i, format!("m{i}").as_bytes())).msg_id;
        acked.insert((7, 500, i), id);
    }
    let rebound = BoundListener::bind(addrs[&follower]).unwrap();
    nodes.insert(follower, start(follower, root.path(), &addrs, rebound));
    let deadline = Instant::now() + Duration::from_secs(20);
    let state = loop {
        let states: Vec<_> = nodes
            .values()
            .map(|n| n.replica.read(state_of).unwrap())
            .collect();
        if states.iter().all(|s| *s == states[0]) {
            break states[0].clone();
        }
        assert!(Instant::now() < deadline, "the replicas did not converge");
        std::thread::sleep(Duration::from_millis(10));
    };
    check_acknowledged(&state, &acked);
    assert_eq!(state[0].1, 60);
    for n in nodes.values() {
        n.replica.stop();
    }
}

/// cluster.md sections 7 and 8.2 over real sockets: a follower stopped
/// while the others write past an 8 KiB Raft log bound catches up by a
/// snapshot streamed on a connection of its own.
#[test]
fn a_follower_catches_up_by_a_snapshot_streamed_over_loopback_tcp() {
    const BOUND: u64 = 8 << 10;
    let root = tempfile::tempdir().unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut bound: HashMap<u64, BoundListener> = IDS
        .iter()
        .map(|&id| (id, BoundListener::bind(any).unwrap()))
        .collect();
    let addrs: HashMap<u64, SocketAddr> = bound
        .iter()
        .map(|(&id, b)| (id, b.local_addr().unwrap()))
        .collect();
    let mut nodes: HashMap<u64, Node> = IDS
        .iter()
        .map(|&id| {
            let b = bound.remove(&id).unwrap();
            (id, start_bounded(id, root.path(), &addrs, b, BOUND))
        })
        .collect();
    write(&nodes, |e| e.create_group(7));
    write(&nodes, |e| e.join(7, 1, JoinStart::Head));
    let follower = *IDS
        .iter()
        .find(|&&id| !nodes[&id].replica.is_writable())
        .unwrap();
    let gone = nodes.remove(&follower).unwrap();
    gone.replica.stop();
    drop(gone);
    let mut acked = Acked::new();
    let mut i = 0u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    while leader(&nodes).log_first_index() < 10 {
        assert!(
            Instant::now() < deadline,
            "the leader's log was never compacted"
        );
        i += 1;
        let payload = format!("m{i} {}", "y".repeat(100));
        let id = write(&nodes, |e| e.append(7, 500, i, payload.as_bytes())).msg_id;
        acked.insert((7, 500, i), id);
    }
    let rebound = BoundListener::bind(addrs[&follower]).unwrap();
    nodes.insert(
        follower,
        start_bounded(follower, root.path(), &addrs, rebound, BOUND),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let state = loop {
        let states: Vec<_> = nodes
            .values()
            .map(|n| n.replica.read(state_of).unwrap())
            .collect();
        if states.iter().all(|s| *s == states[0]) {
            break states[0].clone();
        }
        assert!(Instant::now() < deadline, "the replicas did not converge");
        std::thread::sleep(Duration::from_millis(10));
    };
    check_acknowledged(&state, &acked);
    assert_eq!(state[0].1, i);
    assert!(
        nodes[&follower].replica.snapshots_installed() >= 1,
        "the follower caught up without a snapshot"
    );
    for n in nodes.values() {
        n.replica.stop();
    }
}
