//! A dead member is replaced (format-spec/cluster.md section 11,
//! protocol.md 4.34) with real `tidemark serve --cluster-*` processes on
//! loopback, while a client sends throughout: node 3 of {1, 2, 3} is
//! SIGKILLed for good; node 4 is started on an empty directory with
//! `--cluster-join`; `tidemark cluster add` makes it a member (it catches
//! up by a snapshot, restarting itself to install it) and `tidemark cluster
//! remove` removes node 3, both asked of node 1 whatever its role (a
//! follower's NOT_LEADER is followed). CLUSTER then lists {1, 2, 4}. The
//! leader is then SIGKILLed: {1, 2, 4} elects another (node 4 votes) and
//! serves; the killed one is restarted with its first command line (which
//! still names node 3: its Raft log's membership wins). Every acknowledged
//! send is stored once at its id, ids dense, and after a clean stop (exit
//! status 0) `ctl dump` of the three engines is identical.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::{replica_dump, tidemark_bin, ReplicaMember};

const GROUP: u64 = 9;
const SENDER: u64 = 77;
const WAIT: Duration = Duration::from_secs(30);

/// (client, peer) ports of nodes 1-4.
type Ports = BTreeMap<u64, (u16, u16)>;

/// Node `id` with `peers` as its `--cluster-peer`s (and `--cluster-join`
/// if `join`).
fn member(id: u64, root: &Path, ports: &Ports, peers: &[u64], join: bool) -> ReplicaMember {
    let dir = root.join(format!("n{id}"));
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--data".into(),
        dir.to_string_lossy().into_owned(),
        "--listen".into(),
        format!("127.0.0.1:{}", ports[&id].0),
        "--small-group-bytes-max".into(),
        "0".into(),
        "--cluster-node-id".into(),
        id.to_string(),
        "--cluster-listen".into(),
        format!("127.0.0.1:{}", ports[&id].1),
    ];
    for p in peers {
        let (client, peer) = ports[p];
        args.push("--cluster-peer".into());
        args.push(format!("{p}=127.0.0.1:{peer},127.0.0.1:{client}"));
    }
    if join {
        args.push("--cluster-join".into());
    }
    ReplicaMember::start(id, dir, root.join(format!("n{id}.log")), args)
}

fn free_ports() -> Ports {
    let ls: Vec<TcpListener> = (0..8)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let port = |i: usize| ls[i].local_addr().expect("addr").port();
    (1..=4u64)
        .map(|id| (id, (port(2 * id as usize - 2), port(2 * id as usize - 1))))
        .collect()
}

fn connect(ports: &Ports, id: u64) -> Option<Client> {
    let mut config = ClientConfig::new(format!("127.0.0.1:{}", ports[&id].0));
    config.io_timeout = Duration::from_secs(3);
    Client::connect(&config).ok()
}

/// The member whose reads are answered (the leader), among `ids`.
fn leader(ports: &Ports, ids: &[u64]) -> u64 {
    let deadline = Instant::now() + WAIT;
    loop {
        for &id in ids {
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

fn on_leader<T>(
    ports: &Ports,
    ids: &[u64],
    mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(mut c) = connect(ports, leader(ports, ids)) {
            match op(&mut c) {
                Ok(v) => return v,
                Err(e) => assert!(Instant::now() < deadline, "no answer: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `tidemark cluster ARGS`; its stdout (it must succeed).
fn cluster_cli(args: &[String]) -> String {
    let out = Command::new(tidemark_bin())
        .arg("cluster")
        .args(args)
        .output()
        .expect("run tidemark cluster");
    assert!(
        out.status.success(),
        "tidemark cluster {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn a_dead_member_is_replaced_under_load_and_the_new_set_elects_and_serves() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members: HashMap<u64, ReplicaMember> = [1, 2, 3]
        .iter()
        .map(|&id| {
            let peers: Vec<u64> = [1, 2, 3].into_iter().filter(|&p| p != id).collect();
            (id, member(id, root.path(), &ports, &peers, false))
        })
        .collect();
    let all = [1, 2, 3, 4];
    on_leader(&ports, &all, |c| c.create_group(GROUP));
    on_leader(&ports, &all, |c| c.join(GROUP, SENDER, JoinStart::Head));

    // The client: sends until told to stop, each until acknowledged (a
    // retransmit with the same client_msg_id returns the first id).
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let client = {
        let (stop, acked, ports) = (stop.clone(), acked.clone(), ports.clone());
        std::thread::spawn(move || {
            let mut cmid = 0;
            while !stop.load(Ordering::Acquire) {
                cmid += 1;
                let payload = format!("m{cmid}");
                let id = on_leader(&ports, &all, |c| {
                    c.send(GROUP, SENDER, cmid, payload.as_bytes())
                })
                .msg_id;
                acked.lock().expect("lock").push((cmid, id));
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // Node 3 dies for good.
    members.get_mut(&3).expect("member 3").kill();
    // Node 4: an empty directory, waiting to be added.
    members.insert(4, member(4, root.path(), &ports, &[1, 2, 3], true));
    std::thread::sleep(Duration::from_millis(300));

    let at_node_1 = vec!["--addr".to_string(), format!("127.0.0.1:{}", ports[&1].0)];
    let mut add = vec!["add".to_string()];
    add.extend(at_node_1.clone());
    add.extend([
        "--node-id".into(),
        "4".into(),
        "--cluster-listen".into(),
        format!("127.0.0.1:{}", ports[&4].1),
        "--client".into(),
        format!("127.0.0.1:{}", ports[&4].0),
    ]);
    let added = cluster_cli(&add);
    assert!(added.starts_with("node 4 added;"), "{added}");
    assert_eq!(added.matches("  member ").count(), 4, "{added}");
    let mut remove = vec!["remove".to_string()];
    remove.extend(at_node_1.clone());
    remove.extend(["--node-id".into(), "3".into()]);
    let removed = cluster_cli(&remove);
    assert!(removed.starts_with("node 3 removed;"), "{removed}");
    // CLUSTER at node 4 lists the new set once node 4 applied the removal
    // (a follower applies a heartbeat or so after the leader).
    let mut status = vec!["status".to_string()];
    status.extend(["--addr".into(), format!("127.0.0.1:{}", ports[&4].0)]);
    let deadline = Instant::now() + WAIT;
    loop {
        let listed = cluster_cli(&status);
        let ids: Vec<&str> = listed
            .lines()
            .filter_map(|l| l.trim().strip_prefix("member "))
            .map(|l| l.split(' ').next().unwrap_or(""))
            .collect();
        if ids == ["1", "2", "4"] {
            break;
        }
        assert!(Instant::now() < deadline, "{listed}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        members[&4]
            .log_text()
            .contains("to finish a snapshot's install"),
        "node 4 caught up by a snapshot"
    );

    // The leader dies: the other two of {1, 2, 4} elect one and serve.
    std::thread::sleep(Duration::from_millis(300));
    let survivors = [1, 2, 4];
    let old = leader(&ports, &survivors);
    members.get_mut(&old).expect("leader").kill();
    let others: Vec<u64> = survivors.into_iter().filter(|&i| i != old).collect();
    let new = leader(&ports, &others);
    assert_ne!(new, old);
    std::thread::sleep(Duration::from_millis(500));
    // Back with its first command line (node 4 restarts its own: it may
    // have been the leader).
    members.get_mut(&old).expect("old leader").spawn();
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Release);
    client.join().expect("client thread");
    let last = on_leader(&ports, &survivors, |c| {
        c.send(GROUP, SENDER, u64::MAX, b"last")
    })
    .msg_id;
    std::thread::sleep(Duration::from_secs(2));

    let records = on_leader(&ports, &survivors, |c| {
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
    let acked = acked.lock().expect("lock").clone();
    assert!(acked.len() > 20, "the client got answers: {}", acked.len());
    for (cmid, id) in &acked {
        assert_eq!(
            by_cmid.get(cmid),
            Some(id),
            "client_msg_id {cmid} acknowledged as {id}"
        );
    }

    for id in survivors {
        members.get_mut(&id).expect("member").terminate();
    }
    let dump = |id: u64| replica_dump(&members[&id].dir, GROUP, &format!("node {id}"));
    let first = dump(1);
    assert_eq!(
        first.lines().count() as u64,
        last,
        "every record in node 1's dump"
    );
    for id in [2, 4] {
        assert!(
            dump(id) == first,
            "node {id}'s records differ from node 1's"
        );
    }
}
