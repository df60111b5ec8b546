//! A cluster of two replica sets of real `tidemark serve` processes on
//! loopback, started from one map file (`--cluster-map`,
//! format-spec/cluster.md section 9, protocol.md 4.33): set 1 is nodes 1-3,
//! set 2 is node 4 alone; shards 0-511 are set 1's, 512-1023 set 2's.
//!
//! - Every node answers CLUSTER_MAP with the same map (its own set's
//!   leader filled in), a follower too; `tidemark cluster map` prints it.
//!   A request for a group of the other set gets WRONG_SET naming that set
//!   and its members' addresses, on a leader and on a follower, and a
//!   BATCH_ACK spanning both sets is refused whole (no cursor moved).
//! - A `ReliableClient` given only node 4's address creates groups in both
//!   sets, joins, sends, pulls and acknowledges (a BATCH_ACK across both
//!   sets), and its UNREAD and SYNC, fanned out over the sets and merged,
//!   equal the truth; then it keeps sending to a group of each set while
//!   set 1's leader is SIGKILLed and restarted: every acknowledged send is
//!   stored exactly once, at its acknowledged id, ids dense, in both sets.
//! - An `Inbox` given only node 4's address catches up on and then gets
//!   pushes of a group of each set, each message once and in order, and
//!   its close acknowledges on both sets.
//! - `Receipts` given only node 4's address follow a message of each set
//!   to its reader's ACK.
//! - A single node answers a map of one set (id 0) owning every shard.
//!
//! Checked by breaking the code: a client that routes every group to its
//! configured node fails the second test (WRONG_SET after its hops), one
//! that fans UNREAD out to one set fails it on the merged counts, and one
//! that does not re-transmit a set's sends after that set's reconnection
//! fails it after the first kill. An inbox that subscribes on one set
//! only, or sends one BATCH_ACK for all sets, fails the inbox test;
//! receipts that wait on one set's connection only fail theirs.
//!
//! Environment: `TIDEMARK_SHARDS_KILLS=N` leader kills (default 2).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::protocol::{shard, ErrorCode, JoinStart};
use tidemark_client::{Client, ClientConfig, ClientError, ReliableClient, ReliableConfig};

use crate::harness::tidemark_bin;

/// node id -> set id.
const NODES: [(u64, u32); 4] = [(1, 1), (2, 1), (3, 1), (4, 2)];
const USER: u64 = 5;
const SENDER: u64 = 42;
/// Longest a step may wait for a leader (an election takes 1-2 s).
const LEADER_WAIT: Duration = Duration::from_secs(20);

/// The set a group is in, by the map this test writes.
fn set_of(group: u64) -> u32 {
    if shard(group) < 512 {
        1
    } else {
        2
    }
}

/// The first `n` group ids of `set`.
fn groups_of(set: u32, n: usize) -> Vec<u64> {
    (1..).filter(|&g| set_of(g) == set).take(n).collect()
}

#[derive(Clone, Copy)]
struct Ports {
    client: u16,
    cluster: u16,
}

struct Cluster {
    // Dropped in this order: the nodes stop before their directory goes.
    nodes: HashMap<u64, Node>,
    ports: HashMap<u64, Ports>,
    _root: tempfile::TempDir,
}

struct Node {
    id: u64,
    child: Option<Child>,
    args: Vec<String>,
}

impl Node {
    fn spawn(&mut self) {
        let mut child = Command::new(tidemark_bin())
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("TIDEMARK_NODE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tidemark");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        assert!(
            line.starts_with("tidemark listening on "),
            "node {}: {line:?}",
            self.id
        );
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

impl Cluster {
    /// Writes the map and starts the four nodes with it.
    fn start() -> Cluster {
        let root = tempfile::tempdir().expect("temp dir");
        let listeners: Vec<TcpListener> = (0..NODES.len() * 2)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let port = |i: usize| listeners[i].local_addr().expect("addr").port();
        let ports: HashMap<u64, Ports> = NODES
            .iter()
            .enumerate()
            .map(|(i, &(id, _))| {
                let p = Ports {
                    client: port(2 * i),
                    cluster: port(2 * i + 1),
                };
                (id, p)
            })
            .collect();
        drop(listeners);
        let mut map = String::from("epoch = 7\n");
        for set in [1, 2] {
            map.push_str(&format!("[[set]]\nid = {set}\nmembers = [\n"));
            for &(id, _) in NODES.iter().filter(|(_, s)| *s == set) {
                let p = ports[&id];
                map.push_str(&format!(
                    "  {{ node = {id}, cluster = \"127.0.0.1:{}\", client = \"127.0.0.1:{}\" }},\n",
                    p.cluster, p.client
                ));
            }
            map.push_str("]\n");
        }
        map.push_str("[[shards]]\nfirst = 0\nlast = 511\nset = 1\n");
        map.push_str("[[shards]]\nfirst = 512\nlast = 1023\nset = 2\n");
        let map_path = root.path().join("cluster-map.toml");
        std::fs::write(&map_path, map).expect("write the map");
        let nodes = NODES
            .iter()
            .map(|&(id, _)| {
                let dir = root.path().join(format!("n{id}"));
                let mut args = vec![
                    "serve".into(),
                    "--data".into(),
                    dir.display().to_string(),
                    "--listen".into(),
                    format!("127.0.0.1:{}", ports[&id].client),
                    "--cluster-node-id".into(),
                    id.to_string(),
                    "--cluster-map".into(),
                    map_path.display().to_string(),
                ];
                args.extend(crate::harness::cluster_token_args(&dir));
                let mut node = Node {
                    id,
                    child: None,
                    args,
                };
                node.spawn();
                (id, node)
            })
            .collect();
        Cluster {
            nodes,
            ports,
            _root: root,
        }
    }

    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.ports[&id].client)
    }

    fn client(&self, id: u64) -> Option<Client> {
        let mut config = ClientConfig::new(self.addr(id));
        config.io_timeout = Duration::from_secs(3);
        Client::connect(&config).ok()
    }

    /// The leader of `set` as its members know it (CLUSTER), waiting for
    /// one to be elected and to accept requests.
    fn leader(&self, set: u32) -> u64 {
        let deadline = Instant::now() + LEADER_WAIT;
        loop {
            for &(id, _) in NODES.iter().filter(|(_, s)| *s == set) {
                let Some(mut c) = self.client(id) else {
                    continue;
                };
                let Ok(view) = c.cluster() else { continue };
                let Some(lead) = view.leader_id else { continue };
                // A leader that serves: a read of a group of its set.
                let probe = groups_of(set, 1)[0];
                if let Some(mut l) = self.client(lead) {
                    match l.group_info(probe) {
                        Ok(_)
                        | Err(ClientError::Server {
                            code: ErrorCode::GroupNotFound,
                            ..
                        }) => return lead,
                        Err(_) => {}
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "no leader of set {set} within {LEADER_WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn reliable(addr: String) -> ReliableClient {
    let mut config = ReliableConfig::new(addr);
    config.give_up_after_ms = 30_000;
    config.backoff_base_ms = 10;
    config.backoff_max_ms = 200;
    config.client.io_timeout = Duration::from_secs(3);
    ReliableClient::new(config)
}

/// The WRONG_SET a request got: its detail and message.
fn wrong_set<T: std::fmt::Debug>(r: Result<T, ClientError>, what: &str) -> (u32, String) {
    match r {
        Err(
            e @ ClientError::Server {
                code: ErrorCode::WrongSet,
                ..
            },
        ) => {
            let set = e.wrong_set().expect("a WRONG_SET names its set");
            let ClientError::Server { message, .. } = e else {
                unreachable!("matched above")
            };
            (set, message)
        }
        other => panic!("{what}: expected WRONG_SET, got {other:?}"),
    }
}

#[test]
fn every_node_answers_the_map_and_refuses_other_sets_groups_with_wrong_set() {
    let cluster = Cluster::start();
    let lead1 = cluster.leader(1);
    let lead2 = cluster.leader(2);
    assert_eq!(lead2, 4, "set 2 is node 4 alone");
    let g1 = groups_of(1, 1)[0];
    let g2 = groups_of(2, 1)[0];
    cluster
        .client(lead1)
        .expect("set 1's leader")
        .create_group(g1)
        .expect("create a group of set 1 on its leader");

    // The map, from every node, a follower too.
    for &(id, set) in &NODES {
        let mut c = cluster.client(id).expect("connect");
        let map = c.cluster_map().expect("CLUSTER_MAP");
        assert_eq!((map.epoch, map.node_id, map.set_id), (7, id, set));
        assert_eq!(map.sets.len(), 2);
        let members: Vec<Vec<u64>> = map
            .sets
            .iter()
            .map(|s| s.members.iter().map(|(n, _)| *n).collect())
            .collect();
        assert_eq!(members, vec![vec![1, 2, 3], vec![4]]);
        let own = map.set(set).expect("its own set");
        let expected_leader = if set == 1 { lead1 } else { lead2 };
        assert_eq!(own.leader_id, Some(expected_leader), "node {id}'s leader");
        for g in 1..200 {
            assert_eq!(map.set_of(g), set_of(g), "group {g}");
        }
    }
    let printed = Command::new(tidemark_bin())
        .args(["cluster", "map", "--json", "--addr", &cluster.addr(2)])
        .output()
        .expect("run tidemark cluster map");
    assert!(printed.status.success(), "{printed:?}");
    let json: serde_json::Value =
        serde_json::from_slice(&printed.stdout).expect("cluster map --json");
    assert_eq!(json["epoch"], 7);
    assert_eq!(json["shards"][1]["first"], 512);
    assert_eq!(json["shards"][1]["set_id"], 2);

    // Other sets' groups: WRONG_SET naming the owner, on a leader and on a
    // follower (before NOT_LEADER: the map is the same on every member).
    let follower1 = [1, 2, 3]
        .into_iter()
        .find(|&id| id != lead1)
        .expect("set 1 has followers");
    let set2_addr = cluster.addr(4);
    for id in [lead1, follower1] {
        let mut c = cluster.client(id).expect("connect");
        let (set, message) = wrong_set(c.create_group(g2), "CREATE_GROUP at set 1");
        assert_eq!(set, 2);
        assert!(
            message.contains(&set2_addr),
            "{message:?} names {set2_addr}"
        );
        let (set, _) = wrong_set(c.send(g2, SENDER, 1, b"x"), "SEND at set 1");
        assert_eq!(set, 2);
    }
    let mut at4 = cluster.client(4).expect("connect node 4");
    let stats: HashMap<String, u64> = at4.stats().expect("STATS").into_iter().collect();
    assert_eq!(
        stats.get("server.cluster_map_epoch"),
        Some(&7),
        "what a client checks before CLUSTER_MAP"
    );
    for (what, r) in [
        ("GROUP_INFO", at4.group_info(g1).map(drop)),
        ("PULL", at4.pull(g1, USER, 0, 10, 0).map(drop)),
        ("JOIN", at4.join(g1, USER, JoinStart::Head).map(drop)),
    ] {
        let (set, message) = wrong_set(r, what);
        assert_eq!(set, 1, "{what}");
        for id in [1, 2, 3] {
            assert!(message.contains(&cluster.addr(id)), "{what}: {message:?}");
        }
    }
    // A BATCH_ACK spanning both sets is refused whole: no cursor moves.
    at4.create_group(g2)
        .expect("create a group of set 2 on node 4");
    at4.join(g2, USER, JoinStart::At(0)).expect("join");
    at4.send(g2, SENDER, 1, b"m").expect("send");
    let (set, _) = wrong_set(at4.batch_ack(USER, &[(g2, 1), (g1, 0)]), "BATCH_ACK");
    assert_eq!(set, 1);
    let unread = at4.unread(USER).expect("UNREAD at set 2");
    assert_eq!(
        unread
            .iter()
            .map(|u| (u.group, u.cursor))
            .collect::<Vec<_>>(),
        vec![(g2, 0)],
        "the refused batch moved no cursor; set 2 answers for its groups only"
    );
}

/// Every message of `group`, oldest first, through the reliable client.
fn read_all(c: &mut ReliableClient, group: u64) -> Vec<tidemark_client::Message> {
    let mut out = Vec::new();
    let mut before = 0;
    loop {
        let (page, more) = c
            .history(group, SENDER, before, 1000)
            .expect("HISTORY through the client");
        before = page.last().map_or(0, |m| m.msg_id);
        out.extend(page);
        if !more || before <= 1 {
            break;
        }
    }
    out.reverse();
    out
}

#[test]
fn a_reliable_client_at_one_node_routes_by_shard_and_survives_a_leader_kill() {
    let kills: usize = std::env::var("TIDEMARK_SHARDS_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let mut cluster = Cluster::start();
    cluster.leader(1);
    cluster.leader(2);
    let set1 = groups_of(1, 2);
    let set2 = groups_of(2, 2);
    let groups: Vec<u64> = set1.iter().chain(&set2).copied().collect();

    // Only node 4's address: the client finds set 1 by itself.
    let mut c = reliable(cluster.addr(4));
    for &g in &groups {
        c.create_group(g).expect("CREATE_GROUP routed to its set");
        c.join(g, USER, JoinStart::Head).expect("JOIN");
        c.join(g, SENDER, JoinStart::Head).expect("JOIN the sender");
    }
    assert!(c.shard_map().is_some(), "a WRONG_SET taught it the map");
    // Group i gets i + 1 messages.
    for (i, &g) in groups.iter().enumerate() {
        for k in 0..=i {
            c.enqueue(g, SENDER, format!("g{g}-{k}").into_bytes());
        }
    }
    for o in c.flush() {
        o.result.expect("every send acknowledged");
    }
    let truth: BTreeMap<u64, u64> = groups
        .iter()
        .enumerate()
        .map(|(i, &g)| (g, i as u64 + 1))
        .collect();
    let unread: BTreeMap<u64, (u64, u64)> = c
        .unread(USER)
        .expect("UNREAD fanned out")
        .into_iter()
        .map(|u| (u.group, (u.head, u.unread)))
        .collect();
    assert_eq!(
        unread,
        truth.iter().map(|(&g, &n)| (g, (n, n))).collect(),
        "UNREAD merged over both sets"
    );
    // Pull one page in a group of each set, and ACK across both sets.
    for g in [set1[1], set2[1]] {
        let page = c.pull_page(g, USER, 0, 100, 0).expect("PULL");
        assert_eq!(page.messages.len() as u64, truth[&g], "group {g}");
    }
    let acks: Vec<(u64, u64)> = groups.iter().map(|&g| (g, 1)).collect();
    for (r, &(g, _)) in c
        .batch_ack(USER, &acks)
        .expect("BATCH_ACK")
        .iter()
        .zip(&acks)
    {
        assert_eq!(r.as_ref().ok(), Some(&1), "group {g}");
    }
    let synced: BTreeMap<u64, (u64, usize)> = c
        .sync_all(USER, 100, 1 << 20)
        .expect("SYNC fanned out")
        .into_iter()
        .map(|s| (s.group, (s.unread, s.messages.len())))
        .collect();
    let expected: BTreeMap<u64, (u64, usize)> = truth
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(&g, &n)| (g, (n - 1, (n - 1) as usize)))
        .collect();
    assert_eq!(synced, expected, "SYNC merged over both sets");

    // Sends to a group of each set, alternating, while set 1's leader is
    // killed and restarted.
    let (g1, g2) = (set1[0], set2[0]);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(u64, String, u64)>>> = Arc::default();
    let failed: Arc<Mutex<Vec<String>>> = Arc::default();
    let writer = {
        let (stop, acked, failed) = (stop.clone(), acked.clone(), failed.clone());
        std::thread::spawn(move || {
            let mut k = 0u64;
            while !stop.load(Ordering::Acquire) {
                k += 1;
                let g = if k.is_multiple_of(2) { g1 } else { g2 };
                let payload = format!("w{k}");
                match c.send(g, SENDER, payload.as_bytes()) {
                    Ok(sent) => acked.lock().expect("acked").push((g, payload, sent.msg_id)),
                    Err(e) => failed.lock().expect("failed").push(format!("{g}: {e}")),
                }
            }
            c
        })
    };
    let acked_in = |g: u64| {
        acked
            .lock()
            .expect("acked")
            .iter()
            .filter(|a| a.0 == g)
            .count()
    };
    let wait_for = |g: u64, n: usize, what: &str| {
        let deadline = Instant::now() + LEADER_WAIT;
        while acked_in(g) < n {
            assert!(
                Instant::now() < deadline,
                "{what}: no progress in group {g}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    for round in 0..kills {
        wait_for(g1, acked_in(g1) + 20, "before the kill");
        let lead = cluster.leader(1);
        let node = cluster.nodes.get_mut(&lead).expect("a node");
        node.kill();
        wait_for(g1, acked_in(g1) + 10, &format!("after kill {round}"));
        wait_for(g2, acked_in(g2) + 10, &format!("set 2 after kill {round}"));
        node.spawn();
    }
    stop.store(true, Ordering::Release);
    let mut c = writer.join().expect("writer");
    assert!(
        failed.lock().expect("failed").is_empty(),
        "sends that failed: {:?}",
        failed.lock().expect("failed")
    );

    // Every acknowledged send once, at its id; ids dense; in both sets.
    let acked = acked.lock().expect("acked").clone();
    for (g, first) in [(g1, truth[&g1]), (g2, truth[&g2])] {
        let records = read_all(&mut c, g);
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.msg_id, i as u64 + 1, "group {g}: ids are dense");
        }
        let by_payload: HashMap<Vec<u8>, u64> = records
            .iter()
            .skip(first as usize)
            .map(|r| (r.payload.clone(), r.msg_id))
            .collect();
        assert_eq!(
            by_payload.len() as u64,
            records.len() as u64 - first,
            "group {g}: a send stored twice"
        );
        let mine: Vec<_> = acked.iter().filter(|a| a.0 == g).collect();
        for (_, payload, msg_id) in &mine {
            assert_eq!(
                by_payload.get(payload.as_bytes()),
                Some(msg_id),
                "group {g}: {payload} acknowledged as {msg_id}"
            );
        }
        assert_eq!(
            records.len() as u64 - first,
            mine.len() as u64,
            "group {g}: a stored send nobody acknowledged (the writer waits for each)"
        );
    }
    let stats = c.stats();
    assert!(stats.link.redirects >= 1, "{stats:?}");
}

#[test]
fn a_single_node_answers_a_map_of_one_set_owning_every_shard() {
    let dir = tempfile::tempdir().expect("temp dir");
    let node = crate::harness::Node::start(dir.path(), &[]);
    let mut c = node.client();
    let map = c.cluster_map().expect("CLUSTER_MAP of a single node");
    assert_eq!((map.epoch, map.node_id, map.set_id), (0, 0, 0));
    assert_eq!(map.sets.len(), 1);
    assert!(map.sets[0].members.is_empty(), "the node asked is the set");
    assert_eq!(map.table.ranges().len(), 1);
    // No check: every group is the node's.
    for g in [1, 2, 3, 7, 1000] {
        c.create_group(g).expect("a single node takes every group");
    }
}

#[test]
fn an_inbox_at_one_node_receives_and_acknowledges_groups_of_both_sets() {
    let cluster = Cluster::start();
    cluster.leader(1);
    cluster.leader(2);
    let groups = [groups_of(1, 1)[0], groups_of(2, 1)[0]];
    let mut c = reliable(cluster.addr(4));
    for &g in &groups {
        c.create_group(g).expect("CREATE_GROUP");
        c.join(g, USER, JoinStart::Head).expect("JOIN");
    }
    let send_round = |c: &mut ReliableClient, round: u32| {
        for &g in &groups {
            for k in 0..3 {
                c.send(g, SENDER, format!("r{round}-{k}").as_bytes())
                    .expect("SEND");
            }
        }
    };
    // Stored before the inbox exists: caught up by pulls.
    send_round(&mut c, 0);
    let mut config = ReliableConfig::new(cluster.addr(4));
    config.give_up_after_ms = 30_000;
    config.client.io_timeout = Duration::from_secs(3);
    let mut inbox = tidemark_client::Inbox::new(config, USER);
    let mut got: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    let mut take = |inbox: &mut tidemark_client::Inbox, n: usize| {
        let deadline = Instant::now() + LEADER_WAIT;
        let mut taken = 0;
        while taken < n {
            assert!(
                Instant::now() < deadline,
                "{taken} of {n} messages: {got:?}"
            );
            if let Some(m) = inbox.next(Duration::from_millis(200)).expect("next") {
                got.entry(m.group).or_default().push(m.msg_id);
                taken += 1;
            }
        }
    };
    take(&mut inbox, 6);
    // Stored after it subscribed: pushed by both sets.
    send_round(&mut c, 1);
    take(&mut inbox, 6);
    for &g in &groups {
        assert_eq!(
            got.get(&g),
            Some(&(1..=6).collect()),
            "group {g}, in order, once"
        );
    }
    inbox.close().expect("close acknowledges on both sets");
    for u in c.unread(USER).expect("UNREAD") {
        assert_eq!(
            (u.cursor, u.unread),
            (6, 0),
            "group {}: acknowledged",
            u.group
        );
    }
}

#[test]
fn receipts_at_one_node_follow_messages_of_both_sets() {
    let cluster = Cluster::start();
    cluster.leader(1);
    cluster.leader(2);
    let groups = [groups_of(1, 1)[0], groups_of(2, 1)[0]];
    let mut c = reliable(cluster.addr(4));
    let mut sent = Vec::new();
    for &g in &groups {
        c.create_group(g).expect("CREATE_GROUP");
        c.join(g, USER, JoinStart::Head).expect("JOIN");
        sent.push((g, c.send(g, SENDER, b"read me").expect("SEND").msg_id));
    }
    let mut config = ReliableConfig::new(cluster.addr(4));
    config.give_up_after_ms = 30_000;
    config.client.io_timeout = Duration::from_secs(3);
    let mut receipts = tidemark_client::Receipts::new(config, SENDER);
    for &(g, id) in &sent {
        receipts.track(g, id);
    }
    // Subscribed on both sets (nothing delivered yet), then the reader
    // acknowledges in both.
    assert_eq!(
        receipts.next(Duration::from_millis(100)).expect("next"),
        None
    );
    for &(g, id) in &sent {
        c.ack(g, USER, id).expect("ACK");
    }
    let deadline = Instant::now() + LEADER_WAIT;
    let mut seen = BTreeMap::new();
    while seen.len() < sent.len() {
        assert!(Instant::now() < deadline, "receipts of {seen:?} only");
        if let Some(d) = receipts.next(Duration::from_millis(200)).expect("next") {
            seen.insert(d.group, (d.msg_id, d.delivered));
        }
    }
    for &(g, id) in &sent {
        assert_eq!(seen.get(&g), Some(&(id, 1)), "group {g}");
        assert_eq!(receipts.delivered(g, id), Some(1));
    }
}
