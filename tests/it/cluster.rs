//! A replica set of three real `tidemark serve --cluster-*` processes on
//! loopback (format-spec/cluster.md, protocol.md 4.31): followers refuse
//! requests with NOT_LEADER naming the leader; a client sends through the
//! leader while the leader is SIGKILLed a few times (and restarted); every
//! acknowledged send is then stored exactly once, at the id it was
//! acknowledged with, ids dense; and after a clean stop the three group
//! logs are byte-identical (`ctl dump` of each, and the segment files
//! past their headers, whose `created_ms` is each replica's clock).
//!
//! Environment: `TIDEMARK_CLUSTER_KILLS=N` leader kills (default 3).

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::{file_tree, replica_dump, tidemark_bin, ReplicaMember};

const IDS: [u64; 3] = [1, 2, 3];
const GROUP: u64 = 7;
const SENDER: u64 = 42;
/// Longest a step may wait for a leader (an election takes 1-2 s).
const LEADER_WAIT: Duration = Duration::from_secs(20);

/// One member's addresses.
#[derive(Clone, Copy)]
pub(crate) struct Ports {
    client: u16,
    peer: u16,
}

/// Member `id` of the set on `ports`, its data and log under `root`.
pub(crate) fn start_member(id: u64, root: &Path, ports: &HashMap<u64, Ports>) -> ReplicaMember {
    let dir = root.join(format!("n{id}"));
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--data".into(),
        dir.to_string_lossy().into_owned(),
        "--listen".into(),
        format!("127.0.0.1:{}", ports[&id].client),
        // Every group in files of its own, to compare them.
        "--small-group-bytes-max".into(),
        "0".into(),
        "--cluster-node-id".into(),
        id.to_string(),
        "--cluster-listen".into(),
        format!("127.0.0.1:{}", ports[&id].peer),
    ];
    for (&p, ports) in ports.iter().filter(|(&p, _)| p != id) {
        args.push("--cluster-peer".into());
        args.push(format!(
            "{p}=127.0.0.1:{},127.0.0.1:{}",
            ports.peer, ports.client
        ));
    }
    ReplicaMember::start(id, dir, root.join(format!("n{id}.log")), args)
}

/// Six free loopback ports (bound together, then released).
pub(crate) fn free_ports() -> HashMap<u64, Ports> {
    let listeners: Vec<TcpListener> = (0..IDS.len() * 2)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let port = |i: usize| listeners[i].local_addr().expect("addr").port();
    IDS.iter()
        .enumerate()
        .map(|(i, &id)| {
            (
                id,
                Ports {
                    client: port(2 * i),
                    peer: port(2 * i + 1),
                },
            )
        })
        .collect()
}

/// Member `id`'s client address.
pub(crate) fn client_addr(ports: &HashMap<u64, Ports>, id: u64) -> String {
    format!("127.0.0.1:{}", ports[&id].client)
}

fn connect(ports: &HashMap<u64, Ports>, id: u64) -> Option<Client> {
    let mut config = ClientConfig::new(client_addr(ports, id));
    config.io_timeout = Duration::from_secs(3);
    Client::connect(&config).ok()
}

/// The member that serves requests now (a read answered), found by
/// following NOT_LEADER's detail or trying each member in turn.
pub(crate) fn leader(ports: &HashMap<u64, Ports>) -> u64 {
    let deadline = Instant::now() + LEADER_WAIT;
    let mut next = IDS[0];
    loop {
        if let Some(mut c) = connect(ports, next) {
            match c.history(GROUP, SENDER, 0, 1) {
                Ok(_)
                | Err(ClientError::Server {
                    code: ErrorCode::GroupNotFound | ErrorCode::NotMember,
                    ..
                }) => return next,
                Err(ClientError::Server {
                    code: ErrorCode::NotLeader,
                    detail: Some(l),
                    ..
                }) if l != next => {
                    next = l;
                    continue;
                }
                Err(_) => {}
            }
        }
        assert!(
            Instant::now() < deadline,
            "no leader within {LEADER_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
        next = IDS[(IDS.iter().position(|&i| i == next).unwrap_or(0) + 1) % IDS.len()];
    }
}

/// Runs `op` on the leader until it answers (any failure: find the leader
/// again and retry, as a client with an idempotent request does).
pub(crate) fn on_leader<T>(
    ports: &HashMap<u64, Ports>,
    mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
) -> T {
    let deadline = Instant::now() + LEADER_WAIT;
    loop {
        if let Some(mut c) = connect(ports, leader(ports)) {
            match op(&mut c) {
                Ok(v) => return v,
                Err(e) => assert!(Instant::now() < deadline, "no answer: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every record of the group, read through the leader (oldest first).
fn read_all(ports: &HashMap<u64, Ports>) -> Vec<tidemark_client::Message> {
    on_leader(ports, |c| {
        let mut out = Vec::new();
        let mut before = 0;
        loop {
            let (page, more) = c.history(GROUP, SENDER, before, 1000)?;
            before = page.last().map_or(0, |m| m.msg_id);
            out.extend(page);
            if !more || before <= 1 {
                break;
            }
        }
        out.reverse();
        Ok(out)
    })
}

#[test]
fn followers_refuse_with_not_leader_naming_the_leader() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let _members: Vec<ReplicaMember> = IDS
        .iter()
        .map(|&id| start_member(id, root.path(), &ports))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    let lead = leader(&ports);
    for &id in IDS.iter().filter(|&&i| i != lead) {
        let mut c = connect(&ports, id).expect("connect a follower");
        // The node's own requests are served by every member.
        c.ping().expect("a follower answers PING");
        let refused = |r: Result<(), ClientError>, what: &str| match r {
            Err(ClientError::Server {
                code: ErrorCode::NotLeader,
                detail,
                message,
            }) => {
                assert_eq!(detail, Some(lead), "{what}: the leader's id");
                let addr = format!("127.0.0.1:{}", ports[&lead].client);
                assert!(message.contains(&addr), "{what}: {message:?} names {addr}");
            }
            other => panic!("{what} on follower {id}: {other:?}"),
        };
        refused(c.send(GROUP, SENDER, 1, b"x").map(drop), "SEND");
        refused(c.create_group(GROUP + 1), "CREATE_GROUP");
        // Reads too: a follower may be behind its leader.
        refused(c.history(GROUP, SENDER, 0, 10).map(drop), "HISTORY");
    }
    // Nothing a follower refused was stored.
    on_leader(&ports, |c| c.join(GROUP, SENDER, JoinStart::Head));
    assert!(read_all(&ports).is_empty());
}

#[test]
fn acknowledged_sends_survive_leader_kills_exactly_once_and_replicas_agree() {
    let kills: usize = std::env::var("TIDEMARK_CLUSTER_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let root = tempfile::tempdir().expect("temp dir");
    let ports = Arc::new(free_ports());
    let mut members: HashMap<u64, ReplicaMember> = IDS
        .iter()
        .map(|&id| (id, start_member(id, root.path(), &ports)))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    on_leader(&ports, |c| c.join(GROUP, SENDER, JoinStart::Head));

    // The writer: client_msg_id 1, 2, ...; each retried (same id, through
    // whichever member leads) until acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let writer = {
        let (ports, stop, acked) = (ports.clone(), stop.clone(), acked.clone());
        std::thread::spawn(move || {
            let mut cmid = 0;
            while !stop.load(Ordering::Acquire) {
                cmid += 1;
                let payload = format!("m{cmid}");
                let sent = on_leader(&ports, |c| c.send(GROUP, SENDER, cmid, payload.as_bytes()));
                acked.lock().expect("acked").push((cmid, sent.msg_id));
            }
        })
    };
    let acked_count = || acked.lock().expect("acked").len();
    for _ in 0..kills {
        // Some sends through this leader, then its SIGKILL.
        let before = acked_count();
        let deadline = Instant::now() + LEADER_WAIT;
        while acked_count() < before + 20 {
            assert!(Instant::now() < deadline, "the writer made no progress");
            std::thread::sleep(Duration::from_millis(10));
        }
        let lead = leader(&ports);
        let m = members.get_mut(&lead).expect("a member");
        m.kill();
        // A new leader takes sends; then the old one comes back.
        let after = acked_count();
        let deadline = Instant::now() + LEADER_WAIT;
        while acked_count() < after + 5 {
            assert!(Instant::now() < deadline, "no progress after the kill");
            std::thread::sleep(Duration::from_millis(10));
        }
        m.spawn();
    }
    stop.store(true, Ordering::Release);
    writer.join().expect("writer");

    let acked = acked.lock().expect("acked").clone();
    let records = read_all(&ports);
    // Dense ids from 1, each client_msg_id once, at its acknowledged id.
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.msg_id, i as u64 + 1, "ids are dense");
        assert_eq!(r.payload, format!("m{}", r.client_msg_id).as_bytes());
    }
    let by_cmid: HashMap<u64, u64> = records
        .iter()
        .map(|r| (r.client_msg_id, r.msg_id))
        .collect();
    assert_eq!(by_cmid.len(), records.len(), "a client_msg_id stored twice");
    for (cmid, msg_id) in &acked {
        assert_eq!(
            by_cmid.get(cmid),
            Some(msg_id),
            "client_msg_id {cmid} acknowledged as {msg_id}"
        );
    }
    assert!(acked.len() >= kills * 25, "{} sends", acked.len());

    // One more round, then time for the followers to apply it: the
    // leader's heartbeats carry its commit index every 20 ms.
    let last = on_leader(&ports, |c| c.send(GROUP, SENDER, u64::MAX, b"last")).msg_id;
    std::thread::sleep(Duration::from_secs(1));
    for m in members.values_mut() {
        m.terminate();
    }
    let dump = |id: u64| replica_dump(&members[&id].dir, GROUP, &format!("node {id}"));
    let first = dump(IDS[0]);
    assert_eq!(
        first.lines().count() as u64,
        last,
        "every record in node {}'s dump",
        IDS[0]
    );
    let groups = |id: u64| file_tree(&members[&id].dir.join("engine").join("groups"));
    let files = groups(IDS[0]);
    assert!(!files.is_empty(), "the group has files of its own");
    for &id in &IDS[1..] {
        let theirs = dump(id);
        if theirs != first {
            let (a, b) = (&first, &theirs);
            let diff = a.lines().zip(b.lines()).find(|(x, y)| x != y);
            panic!(
                "node {id}'s records differ from node {}'s: {} and {} lines, first difference {diff:?}",
                IDS[0],
                a.lines().count(),
                b.lines().count()
            );
        }
        let other = groups(id);
        assert_eq!(
            other.keys().collect::<Vec<_>>(),
            files.keys().collect::<Vec<_>>(),
            "node {id}'s group files"
        );
        // Past the 64-byte header, whose `created_ms` is each replica's
        // own clock (storage.md section 4): the records, byte for byte.
        for (path, bytes) in &files {
            assert_eq!(
                other[path].len(),
                bytes.len(),
                "node {id}: {}",
                path.display()
            );
            assert!(
                other[path][64..] == bytes[64..],
                "node {id}: {} differs",
                path.display()
            );
        }
    }
}

/// CLUSTER (protocol.md 4.32) on every member names the same members and
/// leader; a single node answers node id 0 and no members.
#[test]
fn every_member_answers_the_cluster_map() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let _members: Vec<ReplicaMember> = IDS
        .iter()
        .map(|&id| start_member(id, root.path(), &ports))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    let lead = leader(&ports);
    let expected: Vec<(u64, String)> = IDS
        .iter()
        .map(|&id| (id, format!("127.0.0.1:{}", ports[&id].client)))
        .collect();
    for &id in &IDS {
        let map = connect(&ports, id)
            .expect("connect")
            .cluster()
            .expect("CLUSTER");
        assert_eq!(map.node_id, id);
        assert_eq!(map.leader_id, Some(lead), "node {id}'s leader");
        assert_eq!(map.members, expected);
        assert_eq!(
            map.leader_addr(),
            Some(expected[lead as usize - 1].1.as_str())
        );
    }
    // `tidemark cluster status` on a follower says the same.
    let follower = IDS
        .iter()
        .copied()
        .find(|&id| id != lead)
        .expect("a follower");
    let out = cluster_status(&format!("127.0.0.1:{}", ports[&follower].client), true);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["node_id"], follower);
    assert_eq!(v["leader_id"], lead);
    assert_eq!(v["members"].as_array().map(Vec::len), Some(3));
    let single = crate::harness::Node::start(&root.path().join("single"), &[]);
    let map = single.client().cluster().expect("CLUSTER of a single node");
    assert_eq!(
        (map.node_id, map.leader_id, map.members.len()),
        (0, None, 0)
    );
    assert!(cluster_status(&single.addr, false).contains("a single node"));
}

/// `tidemark cluster status --addr ADDR` (with `--json`): its stdout;
/// the command must succeed.
fn cluster_status(addr: &str, json: bool) -> String {
    let mut cmd = Command::new(tidemark_bin());
    cmd.args(["cluster", "status", "--addr", addr]);
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("run tidemark cluster status");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// The reliable client, pointed at one member (a follower) and told the
/// others, follows NOT_LEADER to the leader and finds the next leader after
/// the leader's SIGKILL: every send acknowledged, each stored once.
#[test]
fn the_reliable_client_follows_the_leader_across_kills() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members: HashMap<u64, ReplicaMember> = IDS
        .iter()
        .map(|&id| (id, start_member(id, root.path(), &ports)))
        .collect();
    let lead = leader(&ports);
    let follower = IDS.into_iter().find(|&i| i != lead).expect("a follower");
    let addr = |id: u64| format!("127.0.0.1:{}", ports[&id].client);
    let mut config = tidemark_client::ReliableConfig::new(addr(follower));
    config.members = IDS.iter().map(|&id| addr(id)).collect();
    config.give_up_after_ms = 20_000;
    let mut client = tidemark_client::ReliableClient::new(config);
    client
        .create_group(GROUP)
        .expect("create through a follower");
    client
        .join(GROUP, SENDER, JoinStart::Head)
        .expect("join through a follower");
    let mut ids = Vec::new();
    for round in 0..3u64 {
        for i in 0..10u64 {
            let payload = format!("r{round} m{i}");
            ids.push(
                client
                    .send(GROUP, SENDER, payload.as_bytes())
                    .expect("send")
                    .msg_id,
            );
        }
        let lead = leader(&ports);
        let m = members.get_mut(&lead).expect("a member");
        m.kill();
        ids.push(
            client
                .send(GROUP, SENDER, b"after a kill")
                .expect("send")
                .msg_id,
        );
        m.spawn();
    }
    assert!(
        client.stats().link.redirects > 0,
        "no NOT_LEADER was followed"
    );
    let stored: Vec<u64> = read_all(&ports).iter().map(|r| r.msg_id).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as u64).collect::<Vec<_>>(),
        "acknowledged ids"
    );
    assert_eq!(stored, ids, "each send stored once");
}
