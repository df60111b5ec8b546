//! A follower catches up by snapshot (format-spec/cluster.md sections 3.5
//! and 8), with three real `tidemark serve --cluster-*` processes on
//! loopback and a small Raft log bound (`--raft-log-max-bytes`): a follower
//! is SIGKILLed, the others write until the leader's Raft log starts after
//! everything the follower had (read from the files, cluster.md section
//! 3), the follower is restarted, is sent a snapshot, restarts itself to
//! install it (section 8.4) and catches up. Then every acknowledged send
//! is stored once at its acknowledged id, ids dense, and after a clean
//! stop `ctl dump` of the three engines is identical; the follower's log
//! says it installed the snapshot, and its Raft log starts past what it had.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::{replica_dump, ReplicaMember};

pub(crate) const IDS: [u64; 3] = [1, 2, 3];
pub(crate) const GROUP: u64 = 9;
const SENDER: u64 = 77;
pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// The Raft log bound of every member: a few hundred sends pass it.
const LOG_MAX_BYTES: u64 = 32 << 10;

/// Member `id` of the set on `ports`, its data and log under `root`.
pub(crate) fn new_member(id: u64, root: &Path, ports: &HashMap<u64, (u16, u16)>) -> ReplicaMember {
    let dir = root.join(format!("n{id}"));
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--data".into(),
        dir.to_string_lossy().into_owned(),
        "--listen".into(),
        format!("127.0.0.1:{}", ports[&id].0),
        "--small-group-bytes-max".into(),
        "0".into(),
        "--raft-log-max-bytes".into(),
        LOG_MAX_BYTES.to_string(),
        "--cluster-node-id".into(),
        id.to_string(),
        "--cluster-listen".into(),
        format!("127.0.0.1:{}", ports[&id].1),
    ];
    for (&p, &(client, peer)) in ports.iter().filter(|(&p, _)| p != id) {
        args.push("--cluster-peer".into());
        args.push(format!("{p}=127.0.0.1:{peer},127.0.0.1:{client}"));
    }
    ReplicaMember::start(id, dir, root.join(format!("n{id}.log")), args)
}

/// (client, peer) ports per member.
pub(crate) fn free_ports() -> HashMap<u64, (u16, u16)> {
    let ls: Vec<TcpListener> = (0..IDS.len() * 2)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let port = |i: usize| ls[i].local_addr().expect("addr").port();
    IDS.iter()
        .enumerate()
        .map(|(i, &id)| (id, (port(2 * i), port(2 * i + 1))))
        .collect()
}

pub(crate) fn connect(ports: &HashMap<u64, (u16, u16)>, id: u64) -> Option<Client> {
    let mut config = ClientConfig::new(format!("127.0.0.1:{}", ports[&id].0));
    config.io_timeout = Duration::from_secs(3);
    Client::connect(&config).ok()
}

/// The member whose reads are answered (the leader).
pub(crate) fn leader(ports: &HashMap<u64, (u16, u16)>) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        for id in IDS {
            if let Some(mut c) = connect(ports, id) {
                match c.history(GROUP, SENDER, 0, 1) {
                    Ok(_)
                    | Err(ClientError::Server {
                        code: ErrorCode::GroupNotFound | ErrorCode::NotMember,
                        ..
                    }) => return id,
                    Err(_) => {}
                }
            }
        }
        assert!(Instant::now() < deadline, "no leader within {WAIT:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn on_leader<T>(
    ports: &HashMap<u64, (u16, u16)>,
    mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
) -> T {
    let deadline = Instant::now() + WAIT;
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

/// (start index, last index) of a Raft log file, as the reader an open
/// uses reads it (cluster.md section 3.3); a torn tail (a file being
/// written) ends the walk.
pub(crate) fn raft_log_span(member_dir: &Path) -> (u64, u64) {
    let bytes = std::fs::read(member_dir.join("raft").join("log")).expect("read the raft log");
    let r = tidemark_cluster::raft_log_format::read(&bytes);
    (r.state.start.0, r.state.last())
}

#[test]
fn a_follower_killed_while_the_log_moves_on_catches_up_by_a_snapshot() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members: HashMap<u64, ReplicaMember> = IDS
        .iter()
        .map(|&id| (id, new_member(id, root.path(), &ports)))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    on_leader(&ports, |c| c.join(GROUP, SENDER, JoinStart::Head));
    let mut acked: Vec<(u64, u64)> = Vec::new();
    let mut cmid = 0;
    let mut send = |acked: &mut Vec<(u64, u64)>| {
        cmid += 1;
        let payload = format!("m{cmid} {}", "x".repeat(200));
        let id = on_leader(&ports, |c| c.send(GROUP, SENDER, cmid, payload.as_bytes())).msg_id;
        acked.push((cmid, id));
    };
    for _ in 0..20 {
        send(&mut acked);
    }
    let lead = leader(&ports);
    let down = *IDS.iter().find(|&&id| id != lead).expect("a follower");
    members.get_mut(&down).expect("member").kill();
    let (_, had) = raft_log_span(&members[&down].dir);
    assert!(had > 20, "the follower had the first sends: {had}");

    // Until the leader's log starts after everything the follower had: it
    // can only catch up by a snapshot.
    let deadline = Instant::now() + WAIT;
    while raft_log_span(&members[&lead].dir).0 <= had {
        assert!(
            Instant::now() < deadline,
            "the leader's Raft log was never compacted"
        );
        for _ in 0..10 {
            send(&mut acked);
        }
    }
    assert_eq!(leader(&ports), lead, "the leader did not change");
    members.get_mut(&down).expect("member").spawn();
    // It is sent a snapshot and restarts itself to install it.
    let deadline = Instant::now() + WAIT;
    while !members[&down]
        .log_text()
        .contains("to finish a snapshot's install")
    {
        assert!(
            Instant::now() < deadline,
            "the follower never installed a snapshot"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..10 {
        send(&mut acked);
    }
    // Time for the follower to be back and apply the last rounds (the
    // leader's heartbeats carry its commit index every 20 ms).
    let deadline = Instant::now() + WAIT;
    while connect(&ports, down).is_none() {
        assert!(Instant::now() < deadline, "the follower did not come back");
        std::thread::sleep(Duration::from_millis(50));
    }
    let last = on_leader(&ports, |c| c.send(GROUP, SENDER, u64::MAX, b"last")).msg_id;
    std::thread::sleep(Duration::from_secs(2));

    // Every acknowledged send once, at its id; ids dense.
    let records = on_leader(&ports, |c| {
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
    });
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.msg_id, i as u64 + 1, "ids are dense");
    }
    let by_cmid: HashMap<u64, u64> = records
        .iter()
        .map(|r| (r.client_msg_id, r.msg_id))
        .collect();
    assert_eq!(by_cmid.len(), records.len(), "a client_msg_id stored twice");
    for (cmid, id) in &acked {
        assert_eq!(
            by_cmid.get(cmid),
            Some(id),
            "client_msg_id {cmid} acknowledged as {id}"
        );
    }

    for m in members.values_mut() {
        m.terminate();
    }
    let text = members[&down].log_text();
    assert!(
        text.contains("finishing the install of the snapshot"),
        "the restart finished the install"
    );
    let (start, _) = raft_log_span(&members[&down].dir);
    assert!(
        start > had,
        "the follower's Raft log starts at {start}, after its {had}"
    );
    let dump = |id: u64| replica_dump(&members[&id].dir, GROUP, &format!("node {id}"));
    let first = dump(lead);
    assert_eq!(
        first.lines().count() as u64,
        last,
        "every record in the leader's dump"
    );
    for &id in IDS.iter().filter(|&&id| id != lead) {
        let theirs = dump(id);
        if theirs != first {
            let diff = first.lines().zip(theirs.lines()).find(|(x, y)| x != y);
            panic!(
                "node {id}'s records differ from the leader's: {} and {} lines, first difference {diff:?}",
                first.lines().count(),
                theirs.lines().count()
            );
        }
    }
}
