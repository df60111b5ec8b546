//! A node listens before its saved groups and memberships are registered
//! (format-spec/storage.md section 11, "Loading in the background"): while
//! the rest loads, requests that name one group are answered as after a
//! full load, and a SIGKILL loses nothing acknowledged, also with
//! checkpoints asked for every 100 ms meanwhile (none may be taken before
//! every group is registered: a capture's pinned journal files cover the
//! registered groups only). The hidden `serve --load-batch-pause-ms` holds
//! the loader before each batch, and the test checks STATS
//! `storage.state_loading` is still 1 before it acts and before the kill.
//! Asserts outcomes, never time.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tidemark_client::Client;
use tidemark_protocol::{ErrorCode, JoinStart, Request};

use crate::harness::Node;

const GROUPS: u64 = 3000;
const MEMBERS: u64 = 3;
/// Groups with messages before the restart (every tenth).
const WITH_MESSAGES: u64 = 10;
const DELETED: u64 = 7;

fn value(c: &mut Client, name: &str) -> u64 {
    c.stats()
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("STATS has no {name}"))
        .1
}

fn member(g: u64, i: u64) -> u64 {
    100 + (g * 7 + i) % 500
}

/// Every group's messages, read by its first member without acking.
fn messages(c: &mut Client, g: u64) -> Vec<(u64, Vec<u8>)> {
    let page = c.pull(g, member(g, 0), 0, 100_000, 0).unwrap();
    page.messages
        .iter()
        .map(|m| (m.msg_id, m.payload.clone()))
        .collect()
}

/// Sends one message to each group of `groups` (pipelined, 200 at a time:
/// within the requests a connection may have in flight); returns what
/// each was acknowledged as.
fn send_each(
    c: &mut Client,
    groups: &[u64],
    tag: &str,
    key_base: u64,
) -> BTreeMap<u64, (u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for chunk in groups.chunks(200) {
        let mut waiting = Vec::new();
        for &g in chunk {
            let payload = format!("{tag} to {g}").into_bytes();
            let id = c
                .submit(&Request::Send {
                    group: g,
                    sender: 9,
                    client_msg_id: key_base + g,
                    payload: &payload,
                })
                .unwrap();
            waiting.push((g, id, payload));
        }
        for (g, id, payload) in waiting {
            let f = c.wait(id, Duration::from_secs(60)).unwrap();
            match f.response().unwrap() {
                tidemark_protocol::Response::Send { msg_id, .. } => {
                    out.insert(g, (msg_id, payload));
                }
                other => panic!("send to {g}: {other:?}"),
            }
        }
    }
    out
}

#[test]
fn a_node_killed_while_its_state_loads_in_the_background_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    {
        let mut node = Node::start(dir.path(), &[]);
        let mut c = node.client();
        // Pipelined, fifty groups (200 requests) at a time: within the
        // requests a connection may have in flight.
        for first in (1..=GROUPS).step_by(50) {
            let mut waiting = Vec::new();
            for g in first..(first + 50).min(GROUPS + 1) {
                waiting.push(c.submit(&Request::CreateGroup { group: g }).unwrap());
                for i in 0..MEMBERS {
                    let join = Request::Join {
                        group: g,
                        user: member(g, i),
                        start: JoinStart::Earliest,
                    };
                    waiting.push(c.submit(&join).unwrap());
                }
                expected.insert(g, Vec::new());
            }
            for id in waiting {
                c.wait(id, Duration::from_secs(60))
                    .unwrap()
                    .response()
                    .unwrap();
            }
        }
        let some: Vec<u64> = (1..=GROUPS).filter(|g| g % WITH_MESSAGES == 0).collect();
        for (g, m) in send_each(&mut c, &some, "before", 0) {
            expected.get_mut(&g).unwrap().push(m);
        }
        drop(c);
        assert!(node.terminate().success(), "a clean stop");
    }

    let mut node = Node::start(
        dir.path(),
        &[
            "--load-batch-pause-ms",
            "600000",
            "--checkpoint-interval-ms",
            "100",
        ],
    );
    let mut c = node.client();
    assert_eq!(value(&mut c, "storage.state_loading"), 1);
    assert!(value(&mut c, "engine.groups") < GROUPS, "not loaded yet");
    // Reads of single groups are answered as after a full load.
    for g in [1, WITH_MESSAGES, 1234, GROUPS] {
        assert_eq!(messages(&mut c, g), expected[&g], "group {g}");
    }
    // Writes to single groups: sends (to groups holding records and to
    // empty ones), a deletion.
    let targets: Vec<u64> = (1..=GROUPS).filter(|g| g % 37 == 0).collect();
    for (g, m) in send_each(&mut c, &targets, "while loading", 1 << 32) {
        expected.get_mut(&g).unwrap().push(m);
    }
    c.delete_group(DELETED).unwrap();
    expected.remove(&DELETED);
    // Rounds go on, one after another, long after the first checkpoint
    // is due (every 100 ms).
    let started = Instant::now();
    let mut i = 0;
    while i < 50 || (started.elapsed() < Duration::from_millis(1000) && i < 400) {
        i += 1;
        let payload = format!("tick {i}").into_bytes();
        let sent = c.send(41, 9, 1_000_000 + i, &payload).unwrap();
        expected.get_mut(&41).unwrap().push((sent.msg_id, payload));
    }
    assert_eq!(
        value(&mut c, "storage.state_loading"),
        1,
        "the kill must come while the state loads"
    );
    // Asserted at the end: what a capture taken now would lose shows first.
    let checkpoints_while_loading = value(&mut c, "engine.checkpoints");
    drop(c);
    node.kill();

    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    while value(&mut c, "storage.state_loading") == 1 {
        assert!(Instant::now() < deadline, "the load never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(value(&mut c, "engine.groups"), GROUPS - 1);
    for (&g, want) in &expected {
        assert_eq!(&messages(&mut c, g), want, "group {g}");
    }
    match c.pull(DELETED, member(DELETED, 0), 0, 10, 0) {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::GroupNotFound), "{e}"),
        Ok(p) => panic!("the deleted group answers: {p:?}"),
    }
    let unread = c.unread(member(WITH_MESSAGES, 0)).unwrap();
    assert!(unread.iter().any(|u| u.group == WITH_MESSAGES));
    assert_eq!(checkpoints_while_loading, 0, "no capture while loading");
}
