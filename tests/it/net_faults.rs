//! The client library end to end over a faulty network: no loss, no
//! duplicates.
//!
//! `many_senders_and_receivers_through_a_faulty_proxy` runs senders and
//! receivers of several groups through [`Proxy`](crate::proxy::Proxy),
//! which cuts connections mid-frame, delays and stalls them, between the
//! clients and the real node. Afterwards every message a sender was told
//! succeeded must have been delivered to the application of every member
//! exactly once, the ids of each group must be dense (each send stored
//! once), and every member's cursor must be at the head. It prints its
//! counts. `TIDEMARK_NET_FAULTS_SCALE=N` multiplies the messages (default 1:
//! well under a minute on two cores).
//!
//! The other tests pin single mechanisms: retransmit after a cut, the
//! receiver's dedup of push-then-pull and of a re-pull after a lost ACK,
//! batch ACK after N or T, the CRC check of records, and a hostile "node"
//! whose every frame the client survives without a panic.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::reliable::{Error, Inbox, ReliableClient, ReliableConfig};
use tidemark_client::{Client, ClientConfig, ClientError};
use tidemark_protocol::{
    decode_request, encode_response, ErrorCode, FrameDecoder, HelloResponse, JoinStart, Records,
    Request, Response,
};

use crate::harness::Node;
use crate::proxy::{Faults, Proxy, Rng};

/// Reliable-client settings for a faulty network: short timeouts so that
/// stalls trip them, and a budget far above any fault.
fn faulty_config(addr: &str) -> ReliableConfig {
    let mut client = ClientConfig::new(addr.to_string());
    client.io_timeout = Duration::from_millis(1500);
    let mut c = ReliableConfig::with_client(client);
    c.send_timeout_ms = 1000;
    c.backoff_base_ms = 5;
    c.backoff_max_ms = 200;
    c.give_up_after_ms = 60_000;
    c.sends_in_flight_max = 8;
    c.ack_every_messages = 10;
    c.ack_every_ms = 100;
    c.page_messages_max = 16;
    c.heartbeat_ms = 500;
    c
}

fn network_faults() -> Faults {
    Faults {
        cut_percent: 60,
        cut_after_bytes: (64, 5000),
        delay_percent: 15,
        delay_ms: (1, 3),
        stall_percent: 30,
        stall_after_bytes: (0, 6000),
        stall_ms: (300, 1500),
    }
}

/// What one member's application received: msg_id -> (times, payload).
type Received = BTreeMap<(u64, u64), (u64, Vec<u8>)>;

fn take(received: &mut Received, group: u64, msg_id: u64, payload: Vec<u8>) {
    received.entry((group, msg_id)).or_insert((0, payload)).0 += 1;
}

/// Highest id received contiguously from 1 in `group`.
fn contiguous(received: &Received, group: u64) -> u64 {
    let mut next = 1;
    while received.contains_key(&(group, next)) {
        next += 1;
    }
    next - 1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Subscription iterator.
    Push,
    /// Paged pulls, each request acknowledging the previous page.
    Pull,
    /// Offline until every sender is done, then subscribes and catches up.
    Late,
    /// Subscription; "crashes" half-way (no ACK) and resumes with its marks.
    Crash,
}

#[test]
fn many_senders_and_receivers_through_a_faulty_proxy() {
    let scale: u64 = std::env::var("TIDEMARK_NET_FAULTS_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
        .max(1);
    let seed: u64 = std::env::var("TIDEMARK_NET_FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7e57_5eed);
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let groups = [1u64, 2, 3];
    // Receivers and their groups. Senders (users 1..=4) are not members:
    // the gateway sends on behalf of users, and a member's own messages
    // would count as read by it.
    let receivers: Vec<(u64, Vec<u64>, Mode)> = vec![
        (101, vec![1, 2, 3], Mode::Push),
        (102, vec![1], Mode::Push),
        (103, vec![2, 3], Mode::Pull),
        (104, vec![3, 1], Mode::Pull),
        (105, vec![1, 2, 3], Mode::Late),
        (106, vec![2, 1], Mode::Crash),
    ];
    let mut admin = node.client();
    for g in groups {
        admin.create_group(g).unwrap();
    }
    for (u, gs, _) in &receivers {
        for &g in gs {
            admin.join(g, *u, JoinStart::Head).unwrap();
        }
    }

    let proxy = Proxy::start(&node.addr, seed, network_faults());
    let config = faulty_config(&proxy.addr);
    let senders = 4u64;
    let per_sender = 500 * scale;
    let senders_done = Arc::new(AtomicBool::new(false));
    // Final heads, published once every sender is done.
    let heads: Arc<Mutex<Option<HashMap<u64, u64>>>> = Arc::new(Mutex::new(None));

    let receiver_threads: Vec<_> = receivers
        .iter()
        .cloned()
        .map(|(user, my_groups, mode)| {
            let (config, done, heads) = (config.clone(), senders_done.clone(), heads.clone());
            std::thread::spawn(move || {
                run_receiver(config, user, my_groups, mode, done, heads, seed)
            })
        })
        .collect();

    let sender_threads: Vec<_> = (1..=senders)
        .map(|s| {
            let config = config.clone();
            std::thread::spawn(move || run_sender(config, s, per_sender, &groups, seed))
        })
        .collect();
    // (group, msg_id) -> (sender, client_msg_id, payload) of every send a
    // sender was told succeeded.
    let mut acked: HashMap<(u64, u64), (u64, u64, Vec<u8>)> = HashMap::new();
    let mut sender_totals = tidemark_client::reliable::SenderStats::default();
    let mut failed = Vec::new();
    for t in sender_threads {
        let (sender, outcomes, stats) = t.join().expect("sender thread");
        sender_totals.sent += stats.sent;
        sender_totals.retransmits += stats.retransmits;
        sender_totals.duplicates += stats.duplicates;
        sender_totals.timeouts += stats.timeouts;
        sender_totals.link.reconnects += stats.link.reconnects;
        for (group, cmid, payload, result) in outcomes {
            match result {
                Ok(msg_id) => {
                    let prev = acked.insert((group, msg_id), (sender, cmid, payload));
                    assert!(prev.is_none(), "two sends answered with {group}/{msg_id}");
                }
                Err(e) => failed.push(format!("sender {sender}: {e}")),
            }
        }
    }
    assert!(failed.is_empty(), "sends gave up: {failed:?}");
    let send_phase = started.elapsed();

    // Every sender is done: publish the heads (read directly, not through
    // the proxy).
    let unread = admin.unread(101).unwrap();
    let final_heads: HashMap<u64, u64> = unread.iter().map(|g| (g.group, g.head)).collect();
    for g in groups {
        let head = final_heads[&g];
        let ids: Vec<u64> = {
            let mut v: Vec<u64> = acked.keys().filter(|k| k.0 == g).map(|k| k.1).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(
            ids,
            (1..=head).collect::<Vec<_>>(),
            "group {g}: the acknowledged ids are exactly 1..=head (dense, each send stored once)"
        );
    }
    *heads.lock().unwrap() = Some(final_heads.clone());
    senders_done.store(true, Ordering::SeqCst);

    let mut lines = Vec::new();
    let mut dropped_total = 0;
    let mut receiver_reconnects = 0;
    for t in receiver_threads {
        let (user, my_groups, received, stats) = t.join().expect("receiver thread");
        dropped_total += stats.duplicates_dropped;
        receiver_reconnects += stats.link.reconnects;
        let mut expected = 0;
        let mut duplicates = 0;
        for &g in &my_groups {
            expected += final_heads[&g];
        }
        for ((g, id), (times, payload)) in &received {
            duplicates += times - 1;
            let (_, _, sent) = acked
                .get(&(*g, *id))
                .unwrap_or_else(|| panic!("user {user} got {g}/{id}, which nobody sent"));
            assert_eq!(payload, sent, "user {user}: bytes of {g}/{id}");
        }
        for &g in &my_groups {
            for id in 1..=final_heads[&g] {
                assert!(
                    received.contains_key(&(g, id)),
                    "user {user} never got {g}/{id}"
                );
            }
        }
        assert_eq!(duplicates, 0, "user {user}: the application saw duplicates");
        assert_eq!(received.len() as u64, expected, "user {user}");
        // Cursors at the head (read directly).
        for st in admin.unread(user).unwrap() {
            assert_eq!(
                (st.group, st.cursor),
                (st.group, st.head),
                "user {user}: cursor of group {} at the head after close",
                st.group
            );
        }
        lines.push(format!(
            "  member {user}: delivered {} / expected {expected} / duplicates {duplicates} (dropped by its filter: {}, reconnects {})",
            received.len(),
            stats.duplicates_dropped,
            stats.link.reconnects
        ));
    }
    let counts = proxy.counts();
    println!(
        "network faults: {} senders sent {} messages, {} acknowledged; {} retransmits ({} answered duplicate), {} send timeouts, {} sender reconnects",
        senders,
        senders * per_sender,
        acked.len(),
        sender_totals.retransmits,
        sender_totals.duplicates,
        sender_totals.timeouts,
        sender_totals.link.reconnects,
    );
    for l in &lines {
        println!("{l}");
    }
    println!(
        "  receivers: {dropped_total} copies dropped by dedup filters, {receiver_reconnects} reconnects; duplicates at the application: 0"
    );
    println!(
        "  proxy: {} connections, {} cut mid-stream, {} stalled, {} delayed, {} bytes; sends done after {:.1}s, all after {:.1}s",
        counts.connections,
        counts.cuts,
        counts.stalls,
        counts.delayed_connections,
        counts.bytes,
        send_phase.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        counts.cuts > 0 && counts.stalls > 0,
        "faults were injected: {counts:?}"
    );
    assert!(
        sender_totals.link.reconnects + receiver_reconnects > 0,
        "clients had to reconnect"
    );
}

type SenderResult = (
    u64,
    Vec<(u64, u64, Vec<u8>, Result<u64, Error>)>,
    tidemark_client::reliable::SenderStats,
);

fn run_sender(
    config: ReliableConfig,
    sender: u64,
    count: u64,
    groups: &[u64],
    seed: u64,
) -> SenderResult {
    let mut rng = Rng::new(seed ^ sender);
    let mut c = ReliableClient::new(config);
    let mut payloads: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    let mut outcomes = Vec::new();
    let mut collect = |o: tidemark_client::reliable::SendOutcome,
                       payloads: &mut HashMap<u64, (u64, Vec<u8>)>| {
        let (group, payload) = payloads.remove(&o.client_msg_id).expect("an enqueued send");
        outcomes.push((group, o.client_msg_id, payload, o.result.map(|s| s.msg_id)));
    };
    for i in 0..count {
        let group = groups[((i + sender) % groups.len() as u64) as usize];
        // 20..~700 bytes, so frames span reads and cuts fall mid-frame.
        let filler = rng.range((0, 680)) as usize;
        let mut payload = format!("sender {sender} message {i} ").into_bytes();
        payload.extend((0..filler).map(|k| b'a' + (k % 26) as u8));
        let id = c.enqueue(group, sender, payload.clone());
        payloads.insert(id, (group, payload));
        // Up to 8 in flight; some senders send one at a time.
        let window = if sender & 1 == 0 { 8 } else { 1 };
        while c.pending_len() >= window {
            match c.next_outcome() {
                Some(o) => collect(o, &mut payloads),
                None => break,
            }
        }
    }
    for o in c.flush() {
        collect(o, &mut payloads);
    }
    (sender, outcomes, c.stats())
}

type ReceiverResult = (
    u64,
    Vec<u64>,
    Received,
    tidemark_client::reliable::InboxStats,
);

fn run_receiver(
    config: ReliableConfig,
    user: u64,
    groups: Vec<u64>,
    mode: Mode,
    senders_done: Arc<AtomicBool>,
    heads: Arc<Mutex<Option<HashMap<u64, u64>>>>,
    seed: u64,
) -> ReceiverResult {
    let mut received = Received::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let caught_up = |received: &Received| -> bool {
        match heads.lock().unwrap().as_ref() {
            None => false,
            Some(h) => groups.iter().all(|g| contiguous(received, *g) >= h[g]),
        }
    };
    let mut totals = tidemark_client::reliable::InboxStats::default();
    let add = |totals: &mut tidemark_client::reliable::InboxStats,
               s: tidemark_client::reliable::InboxStats| {
        totals.delivered += s.delivered;
        totals.duplicates_dropped += s.duplicates_dropped;
        totals.link.reconnects += s.link.reconnects;
    };
    if mode == Mode::Late {
        while !senders_done.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut inbox = Inbox::new(config.clone(), user);
    let mut crashed = false;
    let crash_at = 20 + Rng::new(seed ^ user).range((0, 20));
    let mut g_index = 0;
    while !caught_up(&received) {
        assert!(
            Instant::now() < deadline,
            "user {user} stuck: {} received, heads {:?}",
            received.len(),
            heads.lock().unwrap()
        );
        match mode {
            Mode::Push | Mode::Late | Mode::Crash => {
                match inbox.next(Duration::from_millis(200)) {
                    Ok(Some(m)) => take(&mut received, m.group, m.msg_id, m.payload),
                    Ok(None) => {}
                    Err(e) => panic!("user {user}: {e}"),
                }
                if mode == Mode::Crash && !crashed && received.len() as u64 >= crash_at {
                    // A crash: nothing acknowledged since the last batch; the
                    // application persisted what it processed (the marks).
                    crashed = true;
                    let marks = inbox.marks();
                    add(&mut totals, inbox.abandon());
                    inbox = Inbox::with_marks(config.clone(), user, marks);
                }
            }
            Mode::Pull => {
                let g = groups[g_index % groups.len()];
                g_index += 1;
                match inbox.pull(g) {
                    Ok(page) => {
                        let empty = page.messages.is_empty();
                        for m in page.messages {
                            take(&mut received, m.group, m.msg_id, m.payload);
                        }
                        if empty {
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                    Err(e) => panic!("user {user}: {e}"),
                }
            }
        }
    }
    // Late duplicates would show up here.
    if mode != Mode::Pull {
        while let Some(m) = inbox.next(Duration::from_millis(300)).expect("drain") {
            take(&mut received, m.group, m.msg_id, m.payload);
        }
    } else {
        for &g in &groups {
            for m in inbox.pull_all(g).expect("final pull") {
                take(&mut received, m.group, m.msg_id, m.payload);
            }
        }
    }
    let stats = inbox
        .close()
        .unwrap_or_else(|e| panic!("user {user}: close: {e}"));
    add(&mut totals, stats);
    (user, groups, received, totals)
}

#[test]
fn a_send_cut_off_before_its_answer_is_retransmitted_and_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 50, JoinStart::Head).unwrap();
    let mut c = ReliableClient::new(faulty_config(&node.addr));
    c.ping().unwrap();
    let ids: Vec<u64> = (0..5)
        .map(|i| c.enqueue(1, 7, format!("m{i}").into_bytes()))
        .collect();
    // The node stores and answers them; the client never reads the answers.
    std::thread::sleep(Duration::from_millis(300));
    c.cut_connection();
    let outcomes = c.flush();
    assert_eq!(outcomes.len(), 5);
    for (o, id) in outcomes.iter().zip(&ids) {
        assert_eq!(o.client_msg_id, *id, "outcomes in enqueue order");
        let sent = o.result.clone().unwrap();
        assert!(sent.duplicate, "the retransmit was recognised: {o:?}");
    }
    let stats = c.stats();
    assert_eq!((stats.retransmits, stats.duplicates), (5, 5), "{stats:?}");
    assert_eq!(stats.link.reconnects, 1);
    // Stored once each: head 5.
    let u = admin.unread(50).unwrap();
    assert_eq!(u[0].head, 5);
    // A caller-chosen id makes a retransmit across process restarts safe.
    let again = c.send_with_id(1, 7, ids[2], b"m2").unwrap();
    assert_eq!((again.msg_id, again.duplicate), (3, true));
}

#[test]
fn a_stalled_send_times_out_and_goes_again_on_a_new_connection() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 50, JoinStart::Head).unwrap();
    let proxy = Proxy::start(&node.addr, 1, Faults::none());
    let mut config = faulty_config(&proxy.addr);
    config.send_timeout_ms = 300;
    let mut c = ReliableClient::new(config);
    c.ping().unwrap();
    // The node stores the send and answers; the answer sits in the stalled
    // path longer than the send timeout.
    proxy.stall_responses(Duration::from_millis(1200));
    let sent = c.send(1, 7, b"through a stall").unwrap();
    let stats = c.stats();
    assert!(stats.timeouts >= 1, "{stats:?}");
    assert!(
        stats.retransmits >= 1 && stats.link.reconnects >= 1,
        "{stats:?}"
    );
    assert_eq!(
        (sent.msg_id, sent.duplicate),
        (1, true),
        "the original was stored"
    );
    assert_eq!(admin.unread(50).unwrap()[0].head, 1, "stored once");
}

#[test]
fn the_inbox_delivers_push_then_pull_once_and_acks_in_batches() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 5, JoinStart::Head).unwrap();
    let mut config = faulty_config(&node.addr);
    config.ack_every_messages = 4;
    config.ack_every_ms = 60_000;
    let mut inbox = Inbox::new(config, 5);
    inbox.subscribe().unwrap();
    for i in 1..=10 {
        admin.send(1, 9, i, format!("m{i}").as_bytes()).unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 10 {
        let m = inbox
            .next(Duration::from_secs(5))
            .unwrap()
            .expect("a message");
        got.push(m.msg_id);
    }
    assert_eq!(got, (1..=10).collect::<Vec<_>>(), "once each, in order");
    // N = 4: after 10 deliveries, two batches went out (cursor 8); the next
    // call flushes nothing more until 4 more or T.
    assert!(inbox.next(Duration::from_millis(100)).unwrap().is_none());
    assert_eq!(admin.unread(5).unwrap()[0].cursor, 8, "acked after 4 and 8");
    // The application pulls although it has everything: the page request
    // carries the pending ACK (9, 10), nothing comes twice.
    let page = inbox.pull(1).unwrap();
    assert!(page.messages.is_empty(), "{page:?}");
    assert_eq!(page.cursor, 10, "the pull carried the ACK");
    let stats = inbox.close().unwrap();
    assert_eq!(stats.delivered, 10);
    assert!(
        stats.chained_acks >= 1 && stats.batch_acks >= 2,
        "{stats:?}"
    );
}

#[test]
fn batch_ack_goes_out_after_t_milliseconds_without_more_messages() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 5, JoinStart::Head).unwrap();
    let mut config = faulty_config(&node.addr);
    config.ack_every_messages = 1000;
    config.ack_every_ms = 150;
    let mut inbox = Inbox::new(config, 5);
    inbox.subscribe().unwrap();
    admin.send(1, 9, 1, b"one").unwrap();
    assert_eq!(
        inbox
            .next(Duration::from_secs(5))
            .unwrap()
            .map(|m| m.msg_id),
        Some(1)
    );
    assert_eq!(admin.unread(5).unwrap()[0].cursor, 0, "not yet: N=1000");
    // Waiting for more wakes at T and acknowledges.
    assert!(inbox.next(Duration::from_millis(400)).unwrap().is_none());
    assert_eq!(admin.unread(5).unwrap()[0].cursor, 1, "acked after T");
}

#[test]
fn a_lost_ack_redelivers_and_the_filter_drops_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 5, JoinStart::Head).unwrap();
    for i in 1..=6 {
        admin.send(1, 9, i, b"x").unwrap();
    }
    let mut config = faulty_config(&node.addr);
    config.page_messages_max = 4;
    let mut first = Inbox::new(config.clone(), 5);
    let page = first.pull(1).unwrap();
    assert_eq!(page.messages.len(), 4);
    // Crash before acknowledging; the application kept its marks.
    let marks = first.marks();
    assert_eq!(marks.get(&1), Some(&4));
    first.abandon();
    assert_eq!(admin.unread(5).unwrap()[0].cursor, 0, "nothing was acked");
    let mut second = Inbox::with_marks(config.clone(), 5, marks);
    let rest = second.pull_all(1).unwrap();
    assert_eq!(
        rest.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![5, 6],
        "1..=4 came again and were dropped"
    );
    let stats = second.close().unwrap();
    assert_eq!(stats.duplicates_dropped, 4);
    assert_eq!(
        admin.unread(5).unwrap()[0].cursor,
        6,
        "the redelivered copies were acknowledged too"
    );
    // Without marks (a fresh application) the node's cursor is the truth.
    let mut third = Inbox::new(config, 5);
    assert!(third.pull_all(1).unwrap().is_empty());
}

#[test]
fn a_subscriber_whose_connection_is_cut_catches_up_without_duplicates() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 5, JoinStart::Head).unwrap();
    let mut config = faulty_config(&node.addr);
    config.ack_every_messages = 1000;
    config.ack_every_ms = 60_000;
    let mut inbox = Inbox::new(config, 5);
    inbox.subscribe().unwrap();
    let mut seen = HashMap::new();
    for i in 1..=5 {
        admin.send(1, 9, i, b"a").unwrap();
    }
    while seen.len() < 5 {
        let m = inbox.next(Duration::from_secs(5)).unwrap().unwrap();
        *seen.entry(m.msg_id).or_insert(0) += 1;
    }
    inbox.cut_connection();
    for i in 6..=10 {
        admin.send(1, 9, i, b"b").unwrap(); // pushed to nobody
    }
    while seen.len() < 10 {
        let m = inbox.next(Duration::from_secs(5)).unwrap().unwrap();
        *seen.entry(m.msg_id).or_insert(0) += 1;
    }
    assert!(inbox.next(Duration::from_millis(300)).unwrap().is_none());
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    let stats = inbox.close().unwrap();
    assert_eq!(stats.link.reconnects, 1);
    assert!(
        stats.chained_acks >= 1,
        "the catch-up pull after the reconnect carried the ACK of what was delivered before the cut: {stats:?}"
    );
    assert_eq!(admin.unread(5).unwrap()[0].cursor, 10, "acked on close");
}

/// A fake node: answers HELLO, then hands each decoded request to `answer`
/// together with the stream to write whatever it likes. One thread per
/// connection.
fn fake_node(
    answer: impl Fn(u64, &Request<'_>, &mut TcpStream) + Send + Sync + 'static,
) -> (String, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let answer = Arc::new(answer);
    let t = std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(s) = s else { return };
            let answer = answer.clone();
            std::thread::spawn(move || serve_fake(s, &*answer));
        }
    });
    (addr, t)
}

fn serve_fake(mut s: TcpStream, answer: &dyn Fn(u64, &Request<'_>, &mut TcpStream)) {
    let mut dec = FrameDecoder::new(1 << 20);
    let mut buf = [0u8; 4096];
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        dec.push(&buf[..n]);
        while let Ok(Some(f)) = dec.next_frame() {
            let id = f.header.request_id;
            let Ok(req) = decode_request(&f) else {
                return;
            };
            if let Request::Hello { .. } = req {
                let mut out = Vec::new();
                encode_response(
                    id,
                    &Response::Hello(HelloResponse {
                        version: 1,
                        auth_required: false,
                        frame_bytes_max: 1 << 20,
                        payload_bytes_max: 1 << 16,
                        requests_in_flight_max: 16,
                        server_name: "fake",
                    }),
                    &mut out,
                )
                .unwrap();
                let _ = s.write_all(&out);
            } else {
                answer(id, &req, &mut s);
            }
        }
    }
}

/// One stored record, laid out as format-spec/storage.md "Record".
fn record(msg_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&((44 + payload.len()) as u32).to_le_bytes());
    r.extend_from_slice(&[0; 4]);
    r.extend_from_slice(&msg_id.to_le_bytes());
    r.extend_from_slice(&1_700_000_000_000u64.to_le_bytes());
    r.extend_from_slice(&9u64.to_le_bytes());
    r.extend_from_slice(&msg_id.to_le_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(payload);
    let crc = crc32(&r[8..]);
    r[4..8].copy_from_slice(&crc.to_le_bytes());
    r
}

/// zlib's CRC-32 (bitwise; tests only).
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn a_record_damaged_on_the_way_is_a_typed_crc_error_never_a_message() {
    let (addr, _t) = fake_node(|id, req, s| {
        if let Request::Pull { group, .. } = req {
            let mut bytes = record(1, b"good");
            bytes.extend(record(2, b"will be damaged"));
            let last = bytes.len() - 1;
            bytes[last] ^= 0x20; // one bit flipped in the payload of msg 2
            let mut out = Vec::new();
            encode_response(
                id,
                &Response::Pull {
                    cursor: 0,
                    head: 2,
                    has_more: false,
                    records: Records {
                        count: 2,
                        bytes: &bytes,
                    },
                },
                &mut out,
            )
            .unwrap();
            let _ = s.write_all(&out);
            let _ = group;
        }
    });
    // The low-level client.
    let mut c = Client::connect(&ClientConfig::new(addr.clone())).unwrap();
    let err = c.pull(7, 5, 0, 10, 0).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Crc {
                group: 7,
                msg_id: 2
            }
        ),
        "{err}"
    );
    // The inbox: typed error, no message delivered.
    let mut inbox = Inbox::new(faulty_config(&addr), 5);
    let err = inbox.pull(7).unwrap_err();
    assert_eq!(
        err,
        Error::Crc {
            group: 7,
            msg_id: 2
        }
    );
    assert_eq!(inbox.stats().delivered, 0);
    inbox.abandon();
}

#[test]
fn every_error_code_from_the_node_becomes_its_typed_error() {
    let (addr, _t) = fake_node(|id, req, s| {
        if let Request::Ack { msg_id, .. } = req {
            let code = ErrorCode::from_code(*msg_id as u16).unwrap();
            let mut out = Vec::new();
            encode_response(
                id,
                &Response::Error(tidemark_protocol::ErrorResponse {
                    code,
                    detail: Some(42),
                    message: "from the fake node",
                }),
                &mut out,
            )
            .unwrap();
            let _ = s.write_all(&out);
        }
    });
    let mut config = faulty_config(&addr);
    config.give_up_after_ms = 300;
    let mut c = ReliableClient::new(config);
    let codes: Vec<ErrorCode> = ErrorCode::ALL
        .into_iter()
        .chain([ErrorCode::Unknown(99)])
        .collect();
    for code in codes {
        // The fake node answers ACK with the code given as msg_id.
        let err = c.ack(3, 4, u64::from(code.code())).unwrap_err();
        match code {
            // Retried until the budget, then reported as themselves.
            ErrorCode::Overloaded
            | ErrorCode::TooManyRequestsInFlight
            | ErrorCode::ShuttingDown => {
                assert!(
                    err.code() == Some(code) || matches!(err, Error::Unavailable { .. }),
                    "{code:?}: {err}"
                )
            }
            _ => assert_eq!(err.code(), Some(code), "{code:?}: {err}"),
        }
        if code == ErrorCode::NotMember {
            assert_eq!(err, Error::NotMember { group: 3, user: 4 });
        }
        if code == ErrorCode::CursorAboveHead {
            assert_eq!(
                err,
                Error::CursorAboveHead {
                    group: 3,
                    head: Some(42)
                }
            );
        }
    }
}

#[test]
fn nothing_a_hostile_node_sends_makes_the_client_panic() {
    // After a valid HELLO, the fake node answers each request with a
    // mutated copy of a valid response, or with random bytes.
    let rng = Arc::new(Mutex::new(Rng::new(99)));
    let (addr, _t) = fake_node(move |id, _req, s| {
        let mut rng = rng.lock().unwrap();
        let mut out = Vec::new();
        let recs = record(1, b"payload");
        let valid = Response::Pull {
            cursor: 0,
            head: 1,
            has_more: false,
            records: Records {
                count: 1,
                bytes: &recs,
            },
        };
        encode_response(id, &valid, &mut out).unwrap();
        match rng.next_u64() % 4 {
            0 => {
                // Flip a few bytes anywhere, header included.
                for _ in 0..1 + rng.next_u64() % 4 {
                    let i = (rng.next_u64() % out.len() as u64) as usize;
                    out[i] ^= 1 << (rng.next_u64() % 8);
                }
            }
            1 => out.truncate((rng.next_u64() % out.len() as u64) as usize),
            2 => {
                out = (0..rng.next_u64() % 200)
                    .map(|_| rng.next_u64() as u8)
                    .collect();
            }
            _ => {
                // A PUSH with damaged records before the answer.
                let mut push = Vec::new();
                let mut bad = record(5, b"pushed");
                bad[45] ^= 1; // a payload byte
                encode_response(
                    0,
                    &Response::Push {
                        group: 7,
                        records: Records {
                            count: 1,
                            bytes: &bad,
                        },
                    },
                    &mut push,
                )
                .unwrap();
                push.extend(out);
                out = push;
            }
        }
        let _ = s.write_all(&out);
        if rng.range((0, 2)) == 0 {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    });
    let mut config = ClientConfig::new(addr.clone());
    config.io_timeout = Duration::from_millis(100);
    let mut outcomes: HashMap<&'static str, u64> = HashMap::new();
    for _ in 0..120 {
        let Ok(mut c) = Client::connect(&config) else {
            *outcomes.entry("connect failed").or_default() += 1;
            continue;
        };
        for _ in 0..3 {
            let kind = match c.pull(7, 5, 0, 10, 0) {
                Ok(_) => "ok",
                Err(ClientError::Crc { .. }) => "crc",
                Err(ClientError::Protocol(_)) => "protocol",
                Err(ClientError::Closed) | Err(ClientError::Io(_)) => "closed",
                Err(ClientError::Timeout) => "timeout",
                Err(ClientError::Server { .. }) => "server error",
                // Only connecting resolves the address.
                Err(ClientError::Address { .. }) => "address",
            };
            *outcomes.entry(kind).or_default() += 1;
            if kind != "ok" && kind != "crc" && kind != "server error" {
                break;
            }
            // A damaged push surfaces as a typed error from next_event, not
            // from the request that read it.
            let _ = c.next_event(Duration::from_millis(1));
        }
    }
    println!("hostile node: client outcomes {outcomes:?}");
    assert!(outcomes.get("ok").copied().unwrap_or(0) > 0);
    assert!(outcomes.len() >= 3, "{outcomes:?}");
    // The reliable layer on top: typed errors or success, never a panic.
    let mut rc = faulty_config(&addr);
    rc.give_up_after_ms = 300;
    rc.client.io_timeout = Duration::from_millis(200);
    let mut inbox = Inbox::new(rc, 5);
    for _ in 0..10 {
        let _ = inbox.pull(7);
    }
    inbox.abandon();
}
