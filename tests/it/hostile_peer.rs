//! Strangers at a replica set's Raft port (format-spec/cluster.md section
//! 7): a real 3-node set, its cluster secret configured, serves a few
//! sends; then the test process, which does not hold the secret, talks to
//! every member's `--cluster-listen` over plain TCP:
//!
//! - forged Raft frames whose `from` claims another member: a heartbeat at
//!   term 1,000,000, an append at a term far ahead, a `MsgTimeoutNow` to
//!   each follower (at term 0, a local message to raft-rs, and at a high
//!   term);
//! - length prefixes announcing 80 MiB frames, 4 bytes each, on 12
//!   connections held open;
//! - 1,000 connections that never send a byte;
//! - a snapshot stream (preamble, Begin claiming the leader, a file, End)
//!   at a new (index, term).
//!
//! Afterwards: no election happened (the "leads and accepts writes" lines
//! of the three logs are as many as before, and every member names the
//! same leader), sends are still acknowledged and read back, each member's
//! resident memory grew by less than [`RSS_GROWTH_MAX`], nothing was
//! staged under any member's `snap-in/`, the idle connections were closed
//! by the members within the handshake deadline, and once the members
//! stopped, each one's Raft log holds a term below [`TERM_MAX`].
//!
//! The violations are collected and reported together, so that a run
//! against a transport that trusts its peers lists every finding.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use raft::eraftpb::{Entry, Message, MessageType};
use tidemark_client::{Client, ClientConfig};
use tidemark_protocol::JoinStart;

use crate::harness::ReplicaMember;

const IDS: [u64; 3] = [1, 2, 3];
const GROUP: u64 = 7;
const SENDER: u64 = 42;
const WAIT: Duration = Duration::from_secs(20);
/// Resident memory a member may gain under the attack. The attack's bytes
/// are a few hundred KiB; what a member may allocate for them is bounded
/// by its limits (at most `HANDSHAKES_MAX_DEFAULT` connections in their
/// handshake, each a few hundred bytes and a thread's stack pages, the
/// others refused at accept). 64 MiB leaves room for the allocator and for
/// the sends' own work, and is far below what one claimed 80 MiB frame
/// buffered in advance would take.
const RSS_GROWTH_MAX: u64 = 64 << 20;
/// A term no honest election of this test reaches; the forged frames
/// carry terms from 1,000,000 up.
const TERM_MAX: u64 = 1000;
/// Connections that send nothing, spread over the members.
const IDLE_CONNECTIONS: usize = 1000;
/// Connections announcing an 80 MiB frame, spread over the members.
const OVERSIZED_CONNECTIONS: usize = 12;

/// One member's client and Raft ports.
#[derive(Clone, Copy)]
struct Ports {
    client: u16,
    raft: u16,
}

fn free_ports() -> HashMap<u64, Ports> {
    let listeners: Vec<TcpListener> = (0..IDS.len() * 2)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let port = |i: usize| listeners[i].local_addr().expect("addr").port();
    IDS.iter()
        .enumerate()
        .map(|(i, &id)| {
            let ports = Ports {
                client: port(2 * i),
                raft: port(2 * i + 1),
            };
            (id, ports)
        })
        .collect()
}

fn start_member(id: u64, root: &Path, ports: &HashMap<u64, Ports>) -> ReplicaMember {
    let dir = root.join(format!("n{id}"));
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--data".into(),
        dir.to_string_lossy().into_owned(),
        "--listen".into(),
        format!("127.0.0.1:{}", ports[&id].client),
        "--cluster-node-id".into(),
        id.to_string(),
        "--cluster-listen".into(),
        format!("127.0.0.1:{}", ports[&id].raft),
    ];
    for (&p, ports) in ports.iter().filter(|(&p, _)| p != id) {
        args.push("--cluster-peer".into());
        args.push(format!(
            "{p}=127.0.0.1:{},127.0.0.1:{}",
            ports.raft, ports.client
        ));
    }
    ReplicaMember::start(id, dir, root.join(format!("n{id}.log")), args)
}

fn client(ports: &HashMap<u64, Ports>, id: u64) -> Option<Client> {
    let mut config = ClientConfig::new(format!("127.0.0.1:{}", ports[&id].client));
    config.io_timeout = Duration::from_secs(3);
    Client::connect(&config).ok()
}

/// The leader every member names (CLUSTER), once they all agree.
fn agreed_leader(ports: &HashMap<u64, Ports>) -> Option<u64> {
    let named: Vec<Option<u64>> = IDS
        .iter()
        .map(|&id| client(ports, id).and_then(|mut c| c.cluster().ok()?.leader_id))
        .collect();
    named[0].filter(|_| named.iter().all(|n| *n == named[0]))
}

fn wait_for_leader(ports: &HashMap<u64, Ports>) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(l) = agreed_leader(ports) {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no agreed leader within {WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends `ids` through `leader`; the ids acknowledged.
fn send_all(ports: &HashMap<u64, Ports>, leader: u64, ids: std::ops::Range<u64>) -> Vec<u64> {
    let Some(mut c) = client(ports, leader) else {
        return Vec::new();
    };
    ids.filter_map(|i| {
        c.send(GROUP, SENDER, i, format!("m{i}").as_bytes())
            .ok()
            .map(|s| s.msg_id)
    })
    .collect()
}

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// "node N leads and accepts writes" lines in every member's log: one per
/// leader per term, so a term that moved shows as a new line.
fn leads_lines(members: &[ReplicaMember]) -> usize {
    members
        .iter()
        .map(|m| m.log_text().matches("leads and accepts writes").count())
        .sum()
}

/// A connection to `addr` that writes `bytes` and stays open; `None` if
/// the member refused it at once.
fn connect_and_write(addr: SocketAddr, bytes: &[u8]) -> Option<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    // A member that closes on the first bad byte may reset the rest.
    let _ = s.write_all(bytes);
    Some(s)
}

fn frame(msg: &Message) -> Vec<u8> {
    let mut f = Vec::new();
    tidemark_cluster::tcp::encode_frame(&mut f, msg);
    f
}

/// Forged frames to member `to`: each claims to come from another member.
fn forged_frames(to: u64, leader: u64) -> Vec<u8> {
    let other = IDS.iter().copied().find(|&i| i != to).unwrap_or(1);
    let claimed_leader = if leader == to { other } else { leader };
    let heartbeat = Message {
        msg_type: MessageType::MsgHeartbeat,
        from: other,
        to,
        term: 1_000_000,
        ..Default::default()
    };
    let append = Message {
        msg_type: MessageType::MsgAppend,
        from: claimed_leader,
        to,
        term: 2_000_000,
        log_term: 1,
        index: 1,
        entries: vec![Entry {
            term: 2_000_000,
            index: 2,
            ..Default::default()
        }]
        .into(),
        ..Default::default()
    };
    let timeout_now = |term| Message {
        msg_type: MessageType::MsgTimeoutNow,
        from: claimed_leader,
        to,
        term,
        ..Default::default()
    };
    [
        frame(&heartbeat),
        frame(&append),
        frame(&timeout_now(0)),
        frame(&timeout_now(3_000_000)),
    ]
    .concat()
}

/// One stream record (cluster.md section 8.2): `{ len | crc | kind |
/// reserved | body }`.
fn record(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![0u8; 16];
    r.extend_from_slice(body);
    let len = r.len() as u32;
    r[..4].copy_from_slice(&len.to_le_bytes());
    r[8] = kind;
    let crc = crc32fast::hash(&r[8..]);
    r[4..8].copy_from_slice(&crc.to_le_bytes());
    r
}

/// A whole snapshot stream to `to` claiming to come from `leader`, at a
/// new (index, term): one file, then End with its `MsgSnapshot`.
fn forged_snapshot(to: u64, leader: u64) -> Vec<u8> {
    let (index, term) = (1_000_000u64, 1_000_000u64);
    let mut s = tidemark_cluster::snapshot::PREAMBLE.to_vec();
    let mut begin = Vec::new();
    for x in [leader, to, index, term, 0] {
        begin.extend_from_slice(&x.to_le_bytes());
    }
    s.extend(record(1, &begin));
    let name = b"FORMAT";
    let mut file = Vec::new();
    file.extend_from_slice(&5u64.to_le_bytes());
    file.extend_from_slice(&(name.len() as u16).to_le_bytes());
    file.extend_from_slice(&[0; 6]);
    file.extend_from_slice(name);
    s.extend(record(2, &file));
    s.extend(record(3, b"owned"));
    let mut msg = Message {
        msg_type: MessageType::MsgSnapshot,
        from: leader,
        to,
        term,
        ..Default::default()
    };
    let meta = msg.mut_snapshot().mut_metadata();
    meta.index = index;
    meta.term = term;
    msg.mut_snapshot().data = tidemark_cluster::snapshot::descriptor(0).into();
    let mut end = Vec::new();
    end.extend_from_slice(&1u32.to_le_bytes());
    end.extend_from_slice(&[0; 4]);
    end.extend_from_slice(&5u64.to_le_bytes());
    protobuf::Message::write_to_vec(&msg, &mut end).expect("a message encodes");
    s.extend(record(4, &end));
    s
}

/// Whether the member closed `s` (EOF or reset) within `wait`.
fn closed_by_peer(s: &mut TcpStream, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 256];
    while Instant::now() < deadline {
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

#[test]
fn strangers_at_the_raft_port_change_nothing_and_allocate_little() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let members: Vec<ReplicaMember> = IDS
        .iter()
        .map(|&id| start_member(id, root.path(), &ports))
        .collect();
    let raft_addr = |id: u64| -> SocketAddr {
        format!("127.0.0.1:{}", ports[&id].raft)
            .parse()
            .expect("an address")
    };
    let leader = wait_for_leader(&ports);
    let mut c = client(&ports, leader).expect("connect the leader");
    c.create_group(GROUP).expect("create the group");
    c.join(GROUP, SENDER, JoinStart::Head).expect("join");
    drop(c);
    let before = send_all(&ports, leader, 1..21);
    assert_eq!(before.len(), 20, "sends before the attack");
    // Settle, then take the baseline.
    std::thread::sleep(Duration::from_millis(500));
    let leads_before = leads_lines(&members);
    let rss_before: Vec<u64> = members
        .iter()
        .map(|m| rss_bytes(m.pid().expect("running")))
        .collect();

    let mut held = Vec::new();
    for &to in &IDS {
        if let Some(s) = connect_and_write(raft_addr(to), &forged_frames(to, leader)) {
            held.push(s);
        }
    }
    let oversized = (80u32 << 20) - 4;
    for i in 0..OVERSIZED_CONNECTIONS {
        let to = IDS[i % IDS.len()];
        if let Some(s) = connect_and_write(raft_addr(to), &oversized.to_le_bytes()) {
            held.push(s);
        }
    }
    let mut idle: Vec<TcpStream> = (0..IDLE_CONNECTIONS)
        .filter_map(|i| {
            TcpStream::connect_timeout(&raft_addr(IDS[i % IDS.len()]), Duration::from_secs(2)).ok()
        })
        .collect();
    for &to in IDS.iter().filter(|&&i| i != leader) {
        if let Some(s) = connect_and_write(raft_addr(to), &forged_snapshot(to, leader)) {
            held.push(s);
        }
    }
    // Longer than an election timeout (100-200 ms) many times over: a
    // forged term would have made a new leader by now.
    std::thread::sleep(Duration::from_secs(2));

    let mut findings = Vec::new();
    for (m, before) in members.iter().zip(&rss_before) {
        let now = rss_bytes(m.pid().expect("running"));
        eprintln!(
            "resident memory: {} KiB before, {} KiB after",
            before >> 10,
            now >> 10
        );
        if now.saturating_sub(*before) >= RSS_GROWTH_MAX {
            findings.push(format!(
                "a member's resident memory grew from {} MiB to {} MiB",
                before >> 20,
                now >> 20
            ));
        }
    }
    let leads_after = leads_lines(&members);
    if leads_after != leads_before {
        findings.push(format!(
            "{} new leaderships after the attack (a term moved)",
            leads_after - leads_before
        ));
    }
    match agreed_leader(&ports) {
        Some(l) if l == leader => {}
        other => findings.push(format!(
            "the members name leader {other:?} (agreed), node {leader} led before"
        )),
    }
    for (id, m) in IDS.iter().zip(&members) {
        let snap_in = m.dir.join("snap-in");
        if snap_in.exists() {
            findings.push(format!(
                "member {id}: {} exists after a stranger's snapshot stream",
                snap_in.display()
            ));
        }
    }
    // Sends still acknowledged and read back, through whoever leads now.
    let lead_now = wait_for_leader(&ports);
    let after = send_all(&ports, lead_now, 21..31);
    if after.len() != 10 {
        findings.push(format!(
            "{} of 10 sends acknowledged after the attack",
            after.len()
        ));
    }
    let read: Vec<u64> = client(&ports, lead_now)
        .and_then(|mut c| c.history(GROUP, SENDER, 0, 100).ok())
        .map(|(page, _)| page.iter().map(|m| m.msg_id).collect())
        .unwrap_or_default();
    for id in before.iter().chain(&after) {
        if !read.contains(id) {
            findings.push(format!("acknowledged msg_id {id} not read back"));
            break;
        }
    }
    // Connections that never authenticate are closed: at accept beyond
    // the handshake cap, else at the handshake deadline.
    let deadline = Instant::now() + Duration::from_secs(10);
    let open = idle
        .iter_mut()
        .take(30)
        .map(|s| closed_by_peer(s, deadline.saturating_duration_since(Instant::now())))
        .filter(|closed| !closed)
        .count();
    if open > 0 {
        findings.push(format!(
            "{open} of 30 idle connections still open after 10 s"
        ));
    }
    drop(held);
    // The terms the members hold, from their Raft logs' hard state once
    // stopped: a few elections at most, nowhere near a forged term.
    let mut members = members;
    for (id, m) in IDS.iter().zip(&mut members) {
        m.terminate();
        let term = tidemark_cluster::raft_log::RaftLog::open(&m.dir.join("raft"), &IDS)
            .map(|log| log.hard_state().term)
            .unwrap_or_else(|e| panic!("member {id}'s Raft log: {e}"));
        if term >= TERM_MAX {
            findings.push(format!("member {id} is at term {term}"));
        }
    }
    assert!(findings.is_empty(), "findings:\n{}", findings.join("\n"));
}
