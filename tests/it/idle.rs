//! Idle groups over the wire: a group's send state (its dedup window) leaves
//! the node's memory once the group is idle (`--idle-evict-ms`), and a
//! retransmit after that is still answered with the original msg_id
//! (format-spec/storage.md section 12, "Idle groups").

use std::time::{Duration, Instant};

use tidemark_client::Client;

use crate::harness::Node;

fn dedup_entries(c: &mut Client) -> u64 {
    c.stats()
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == "engine.dedup_entries")
        .map(|(_, v)| v)
        .expect("engine.dedup_entries in STATS")
}

#[test]
fn a_retransmit_to_a_group_gone_idle_is_still_a_duplicate() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--idle-evict-ms", "0"]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    let first = c.send(1, 7, 42, b"hello").unwrap();
    assert!(!first.duplicate);
    // Wait for the idle sweep (a condition; the deadline only turns a hang
    // into a failure).
    let deadline = Instant::now() + Duration::from_secs(30);
    while dedup_entries(&mut c) > 0 {
        assert!(Instant::now() < deadline, "the window never left memory");
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = c.send(1, 7, 42, b"hello").unwrap();
    assert!(again.duplicate, "retransmit stored again after eviction");
    assert_eq!(
        (again.msg_id, again.timestamp_ms),
        (first.msg_id, first.timestamp_ms)
    );
    assert_eq!(c.send(1, 7, 43, b"next").unwrap().msg_id, 2);
}
