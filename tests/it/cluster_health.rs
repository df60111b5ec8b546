//! A replica set's health as an operator sees it, on real `tidemark serve
//! --cluster-*` processes on loopback: `tidemark cluster status --json`
//! (role, term, leader, commit and applied index on every node; on the
//! leader each follower's match, lag and last contact), STATS' `raft.*`
//! names and the `/metrics` series of the leader; a follower SIGKILLed
//! falls behind on the leader's report (its lag and its time since its last
//! message grow); the leader that loses its quorum logs the loss with its
//! term. Then the operator's retries: `cluster remove` of a node removed
//! already and `cluster add` of a member with the same addresses succeed
//! and say the change was applied already; a `--cluster-join` node says it
//! waits to be added to its set (format-spec/protocol.md 4.4.1, 4.32,
//! 4.34).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use tidemark_client::{Client, ClientConfig};
use tidemark_protocol::JoinStart;

use crate::harness::{tidemark_bin, ReplicaMember};

const WAIT: Duration = Duration::from_secs(30);
const GROUP: u64 = 5;

/// (client, peer) ports of nodes 1-4.
type Ports = BTreeMap<u64, (u16, u16)>;

fn free_ports() -> Ports {
    let ls: Vec<TcpListener> = (0..8)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
        .collect();
    let port = |i: usize| ls[i].local_addr().expect("addr").port();
    (1..=4u64)
        .map(|id| (id, (port(2 * id as usize - 2), port(2 * id as usize - 1))))
        .collect()
}

fn client_addr(ports: &Ports, id: u64) -> String {
    format!("127.0.0.1:{}", ports[&id].0)
}

fn peer_addr(ports: &Ports, id: u64) -> String {
    format!("127.0.0.1:{}", ports[&id].1)
}

/// Node `id` with `peers` as its `--cluster-peer`s (and `--cluster-join`
/// if `join`), its metrics on a free loopback port.
fn member(id: u64, root: &Path, ports: &Ports, peers: &[u64], join: bool) -> ReplicaMember {
    let dir = root.join(format!("n{id}"));
    let mut args: Vec<String> = vec![
        "serve".into(),
        "--data".into(),
        dir.to_string_lossy().into_owned(),
        "--listen".into(),
        client_addr(ports, id),
        "--metrics-listen".into(),
        "127.0.0.1:0".into(),
        "--cluster-node-id".into(),
        id.to_string(),
        "--cluster-listen".into(),
        peer_addr(ports, id),
    ];
    for &p in peers {
        args.push("--cluster-peer".into());
        args.push(format!(
            "{p}={},{}",
            peer_addr(ports, p),
            client_addr(ports, p)
        ));
    }
    if join {
        args.push("--cluster-join".into());
    }
    ReplicaMember::start(id, dir, root.join(format!("n{id}.log")), args)
}

/// The set {1, 2, 3}.
fn start_set(root: &Path, ports: &Ports) -> BTreeMap<u64, ReplicaMember> {
    [1, 2, 3]
        .into_iter()
        .map(|id| {
            let peers: Vec<u64> = [1, 2, 3].into_iter().filter(|&p| p != id).collect();
            (id, member(id, root, ports, &peers, false))
        })
        .collect()
}

/// Runs `tidemark cluster ARGS`.
fn cluster_cli(args: &[&str]) -> Output {
    Command::new(tidemark_bin())
        .arg("cluster")
        .args(args)
        .output()
        .expect("run tidemark cluster")
}

/// `tidemark cluster status --json` of node `id`; `None` if it failed.
fn status(ports: &Ports, id: u64) -> Option<Value> {
    let addr = client_addr(ports, id);
    let out = cluster_cli(&["status", "--json", "--timeout-ms", "2000", "--addr", &addr]);
    if !out.status.success() {
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("one JSON object"))
}

/// Node `id`'s status once `f` holds for it.
fn status_when(ports: &Ports, id: u64, what: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let s = status(ports, id);
        if let Some(s) = s.as_ref().filter(|s| f(s)) {
            return s.clone();
        }
        assert!(
            Instant::now() < deadline,
            "node {id}: {what} not within {WAIT:?}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The follower `id` in a leader's status.
fn follower(s: &Value, id: u64) -> &Value {
    s["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["node_id"] == id))
        .map(|m| &m["follower"])
        .filter(|f| f.is_object())
        .unwrap_or_else(|| panic!("no follower {id} in {s}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The leader of {1, 2, 3} once every node names it and it reports both
/// followers caught up.
fn settled_leader(ports: &Ports) -> u64 {
    let s = status_when(ports, 1, "a leader known", |s| s["leader_id"].is_u64());
    let leader = u(&s["leader_id"]);
    status_when(ports, leader, "the followers caught up", |s| {
        s["role"] == "leader"
            && [1, 2, 3].iter().filter(|&&id| id != leader).all(|&id| {
                let f = &s["members"]
                    .as_array()
                    .and_then(|m| m.iter().find(|m| m["node_id"] == id).cloned())
                    .unwrap_or_default()["follower"];
                f["lag_entries"] == 0 && f["progress"] == "replicate"
            })
    });
    leader
}

fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header and a body");
    assert!(head.contains(" 200 "), "{head}");
    body.to_string()
}

/// `family{labels}` -> value of every sample of a text exposition.
fn samples(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("series value");
            let value = value.parse().unwrap_or_else(|_| panic!("a number: {l}"));
            (series.to_string(), value)
        })
        .collect()
}

fn connect(ports: &Ports, id: u64) -> Client {
    let mut config = ClientConfig::new(client_addr(ports, id));
    config.io_timeout = Duration::from_secs(5);
    Client::connect(&config).expect("connect")
}

#[test]
fn cluster_status_stats_and_metrics_report_every_node_and_a_dead_followers_growing_lag() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members = start_set(root.path(), &ports);
    let leader = settled_leader(&ports);
    let mut c = connect(&ports, leader);
    c.create_group(GROUP).expect("create a group");
    c.join(GROUP, 1, JoinStart::Head).expect("join");
    for i in 1..=5 {
        c.send(GROUP, 42, i, b"before").expect("send");
    }
    let l = status_when(&ports, leader, "the sends replicated", |s| {
        [1, 2, 3]
            .iter()
            .filter(|&&id| id != leader)
            .all(|&id| follower(s, id)["match_index"] == s["last_index"])
    });
    let term = u(&l["term"]);
    assert_eq!(l["role"], "leader", "{l}");
    assert_eq!(l["leader_id"], leader);
    assert_eq!(l["node_id"], leader);
    assert!(term >= 1);
    assert!(u(&l["applied_index"]) <= u(&l["commit_index"]));
    assert!(u(&l["commit_index"]) <= u(&l["last_index"]));
    assert!(u(&l["counters"]["elections_won"]) >= 1, "{l}");
    assert!(u(&l["counters"]["leader_changes"]) >= 1, "{l}");
    for id in [1, 2, 3].into_iter().filter(|&id| id != leader) {
        let f = follower(&l, id);
        assert_eq!(f["voter"], true);
        assert_eq!(f["lag_entries"], 0);
        assert_eq!(f["lag_bytes_estimate"], 0);
        assert_eq!(u(&f["next_index"]), u(&l["last_index"]) + 1, "{f}");
        // Its own view: a follower of the same leader in the same term,
        // applying up to the leader's commit point.
        let s = status_when(&ports, id, "applied the leader's commit", |s| {
            u(&s["applied_index"]) >= u(&l["commit_index"])
        });
        assert_eq!(s["role"], "follower", "{s}");
        assert_eq!((u(&s["term"]), u(&s["leader_id"])), (term, leader), "{s}");
        assert!(u(&s["applied_index"]) <= u(&s["commit_index"]));
        assert!(
            s["members"]
                .as_array()
                .unwrap()
                .iter()
                .all(|m| m.get("follower").is_none()),
            "a follower reports no one's progress: {s}"
        );
    }

    // A follower dies: the leader's report shows it falling behind.
    let dead = [1, 2, 3].into_iter().find(|&id| id != leader).unwrap();
    let alive = [1, 2, 3]
        .into_iter()
        .find(|&id| id != leader && id != dead)
        .unwrap();
    members.get_mut(&dead).unwrap().kill();
    let matched = u(&follower(&l, dead)["match_index"]);
    for i in 6..=25 {
        c.send(GROUP, 42, i, b"after the kill").expect("send");
    }
    let first = status_when(&ports, leader, "the live follower caught up", |s| {
        follower(s, alive)["lag_entries"] == 0
    });
    let f = follower(&first, dead);
    assert_eq!(u(&f["match_index"]), matched, "a dead node matched more");
    assert!(u(&f["lag_entries"]) >= 20, "{f}");
    assert!(u(&f["lag_bytes_estimate"]) >= u(&f["lag_entries"]), "{f}");
    let contact = u(&f["last_contact_ms"]);
    let second = status_when(&ports, leader, "the dead follower's silence grew", |s| {
        u(&follower(s, dead)["last_contact_ms"]) > contact
    });
    assert_eq!(u(&follower(&second, dead)["match_index"]), matched);
    assert_eq!(second["term"], term, "the leader held its term");

    // STATS and /metrics of the leader carry the same figures.
    let stats: BTreeMap<String, u64> = c.stats().expect("STATS").into_iter().collect();
    let get = |n: &str| stats.get(n).copied().unwrap_or_else(|| panic!("no {n}"));
    assert_eq!(get("raft.role.leader"), 1);
    assert_eq!(get("raft.role.follower"), 0);
    assert_eq!(get("raft.term"), term);
    assert_eq!(get("raft.leader_id"), leader);
    assert!(get("raft.applied_index") <= get("raft.commit_index"));
    assert!(get(&format!("raft.peer_{dead}.lag_entries")) >= 20);
    assert_eq!(get(&format!("raft.peer_{dead}.match_index")), matched);
    assert_eq!(get(&format!("raft.peer_{alive}.progress.replicate")), 1);
    assert!(get("raft.elections_won") >= 1);
    let info: BTreeMap<String, String> = c.info().expect("INFO").into_iter().collect();
    let body = http_get(&info["server.metrics_listen"], "/metrics");
    let m = samples(&body);
    let metric = |series: &str| {
        m.get(series)
            .copied()
            .unwrap_or_else(|| panic!("no {series} in the scrape"))
    };
    assert_eq!(metric("tidemark_raft_role{role=\"leader\"}"), 1.0);
    assert_eq!(metric("tidemark_raft_term"), term as f64);
    assert!(metric("tidemark_raft_elections_won_total") >= 1.0);
    assert!(
        metric(&format!(
            "tidemark_raft_peer_lag_entries{{peer=\"{dead}\"}}"
        )) >= 20.0
    );
    let silent = metric(&format!(
        "tidemark_raft_peer_last_contact_seconds{{peer=\"{dead}\"}}"
    ));
    assert!(silent * 1000.0 >= contact as f64, "{silent} s");
    for family in [
        "# TYPE tidemark_raft_elections_started_total counter",
        "# TYPE tidemark_raft_peer_last_contact_seconds gauge",
        "# TYPE tidemark_raft_peer_lag_bytes gauge",
    ] {
        assert!(body.contains(family), "{family} not in the scrape");
    }
    let log = members[&leader].log_text();
    assert!(
        log.contains(&format!("node {leader}: leader of term {term}")),
        "the leader's log has no line for its leadership gained"
    );

    // The last follower dies: the leader, cut from its quorum, steps down
    // and says so with its term.
    members.get_mut(&alive).unwrap().kill();
    let lost = format!("node {leader}: lost the leadership of term {term}");
    let deadline = Instant::now() + WAIT;
    while !members[&leader].log_text().contains(&lost) {
        assert!(Instant::now() < deadline, "no {lost:?} in the log");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = status(&ports, leader).expect("the old leader answers");
    assert_ne!(s["role"], "leader", "{s}");
}

#[test]
fn retried_membership_changes_that_applied_succeed_and_a_joining_node_says_it_waits() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members = start_set(root.path(), &ports);
    // The leader is the one killed and removed: the remove is asked while
    // the other two elect a new leader (NOT_LEADER, no leader known), which
    // the command waits out instead of giving up.
    let gone = settled_leader(&ports);
    let [a, b] = match [1, 2, 3].map(|id| (id != gone).then_some(id)) {
        [None, Some(a), Some(b)] | [Some(a), None, Some(b)] | [Some(a), Some(b), None] => [a, b],
        other => unreachable!("one leader among three: {other:?}"),
    };
    let at = client_addr(&ports, a);
    members.get_mut(&gone).unwrap().kill();
    let gone_id = gone.to_string();
    let remove = ["remove", "--node-id", &gone_id, "--addr", &at];
    let out = cluster_cli(&remove);
    assert!(out.status.success(), "first remove: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("node {gone} removed")), "{text}");
    // Asked again (as after an interruption or a lost answer): done.
    let out = cluster_cli(&remove);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a retried remove failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("already applied"), "{text}");
    let out = cluster_cli(&["remove", "--json", "--node-id", &gone_id, "--addr", &at]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["already_applied"], true, "{v}");
    assert_eq!(v["members"].as_array().map(Vec::len), Some(2), "{v}");

    // An add of a member with its own addresses: applied already.
    let (raft, client) = (peer_addr(&ports, b), client_addr(&ports, b));
    let b_id = b.to_string();
    let add = [
        "add",
        "--node-id",
        &b_id,
        "--raft",
        &raft,
        "--client",
        &client,
        "--addr",
        &at,
    ];
    let out = cluster_cli(&add);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("already applied"), "{text}");
    // Other addresses are still refused.
    let other = client_addr(&ports, 4);
    let out = cluster_cli(&[
        "add",
        "--node-id",
        &b_id,
        "--raft",
        &raft,
        "--client",
        &other,
        "--addr",
        &at,
    ]);
    assert!(
        !out.status.success(),
        "an add with other addresses: {out:?}"
    );

    // A node started to join the two and not added yet says so.
    let _joiner = member(4, root.path(), &ports, &[a, b], true);
    let addr4 = client_addr(&ports, 4);
    let out = cluster_cli(&["status", "--addr", &addr4]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let set = format!("{}, {}", client_addr(&ports, a), client_addr(&ports, b));
    assert!(
        text.contains(&format!(
            "node 4 ({addr4}): waiting to be added to the set at {set}"
        )),
        "{text}"
    );
    let s = status(&ports, 4).expect("status of the joining node");
    assert_eq!(s["role"], "joining", "{s}");
    assert_eq!(
        s["waiting_for_set"].as_array().map(Vec::len),
        Some(2),
        "{s}"
    );
    let stats: BTreeMap<String, u64> = connect(&ports, 4)
        .stats()
        .expect("STATS")
        .into_iter()
        .collect();
    assert_eq!(stats.get("raft.role.joining"), Some(&1));
    assert_eq!(stats.get("server.cluster_node_id"), Some(&4));
}

/// A peer that passed the handshake with the set's secret and then sends a
/// frame claiming to come from another member is refused, its connection
/// closed, and the member's STATS and `/metrics` count the frame
/// (`raft.inbound.frames_forged`, format-spec/protocol.md 4.4.1,
/// cluster.md section 7); the set keeps serving.
#[test]
fn a_forged_frame_from_an_authenticated_peer_is_counted_in_stats_and_metrics() {
    use raft::eraftpb::{Message, MessageType};
    use tidemark_cluster::peer_auth::{self, ClusterSecret};

    let root = tempfile::tempdir().unwrap();
    let ports = free_ports();
    let _set = start_set(root.path(), &ports);
    settled_leader(&ports);
    let forged = |c: &mut Client| -> u64 {
        let stats: BTreeMap<String, u64> = c.stats().expect("STATS").into_iter().collect();
        *stats
            .get("raft.inbound.frames_forged")
            .expect("STATS reports raft.inbound.frames_forged")
    };
    // Member 1's count before: no member forges.
    assert_eq!(forged(&mut connect(&ports, 1)), 0);

    // Authenticated as member 2, a heartbeat that claims member 3.
    let secret = ClusterSecret::new(crate::harness::CLUSTER_SECRET.as_bytes().to_vec()).unwrap();
    let mut s = TcpStream::connect(peer_addr(&ports, 1)).unwrap();
    peer_auth::dial(&mut s, &secret, 2, 1, Duration::from_secs(5)).expect("the handshake");
    let heartbeat = Message {
        msg_type: MessageType::MsgHeartbeat,
        from: 3,
        to: 1,
        term: 1,
        ..Default::default()
    };
    let mut frame = Vec::new();
    tidemark_cluster::tcp::encode_frame(&mut frame, &heartbeat);
    s.write_all(&frame).unwrap();
    // The member closes the connection with the frame.
    s.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(s.read(&mut [0u8; 16]).unwrap_or(0), 0, "connection closed");

    let deadline = Instant::now() + WAIT;
    let mut c = connect(&ports, 1);
    while forged(&mut c) != 1 {
        assert!(
            Instant::now() < deadline,
            "STATS never counted the forged frame"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stats: BTreeMap<String, u64> = c.stats().expect("STATS").into_iter().collect();
    // This test's own connection at least; the set's other members
    // connect to member 1 only when they have something to send it (the
    // leader always, a follower when it campaigns).
    assert!(stats["raft.inbound.authenticated"] >= 2, "{stats:?}");
    let info: BTreeMap<String, String> = c.info().expect("INFO").into_iter().collect();
    let metrics = samples(&http_get(&info["server.metrics_listen"], "/metrics"));
    assert_eq!(
        metrics.get("tidemark_raft_inbound_frames_forged_total"),
        Some(&1.0)
    );
    // The set still serves.
    let lead = settled_leader(&ports);
    let mut c = connect(&ports, lead);
    c.create_group(GROUP).unwrap();
}
