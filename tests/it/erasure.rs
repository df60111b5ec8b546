//! Physical erasure of a recalled payload (format-spec/storage.md section 3 "Erasure", section 16 item 16) through
//! the real binary: a small group's message with a random marker payload is
//! recalled; within the documented bound (a few checkpoint intervals on a
//! quiet node) the marker is found in no file of the data directory, and
//! the group still reads dense with the message recalled.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tidemark_client::protocol::JoinStart;
use tidemark_client::Kind;

use crate::harness::Node;

/// The files under `dir` whose bytes contain `needle`.
fn files_holding(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                found.push(p);
            }
        }
    }
    found
}

fn marker() -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(13);
    format!("ERASE-ME-{:016x}-{:?}", h.finish(), Instant::now()).into_bytes()
}

#[test]
fn a_recalled_payload_is_gone_from_the_data_directory_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let interval_ms = 200;
    let node = Node::start(
        dir.path(),
        &["--checkpoint-interval-ms", &interval_ms.to_string()],
    );
    let mut c = node.client();
    let secret = marker();
    c.create_group(1).unwrap();
    c.join(1, 20, JoinStart::Earliest).unwrap();
    c.send(1, 10, 1, b"kept").unwrap();
    c.send(1, 10, 2, &secret).unwrap();
    assert!(!files_holding(dir.path(), &secret).is_empty(), "stored");
    assert_eq!(c.recall(1, 10, 3, 2).unwrap().msg_id, 3);
    // The bound on a quiet node (storage.md section 16, item 16): the
    // checkpoints that take the journal file out of the replay window,
    // evacuate it and delete it. Waited for with a generous margin; the
    // assertion is on the files, not on the time.
    let recalled_at = Instant::now();
    let deadline =
        Instant::now() + Duration::from_millis(interval_ms * 5) + Duration::from_secs(20);
    let mut left = files_holding(dir.path(), &secret);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(interval_ms));
        left = files_holding(dir.path(), &secret);
    }
    assert_eq!(left, Vec::<PathBuf>::new(), "the payload is still on disk");
    eprintln!("erased {:?} after the recall", recalled_at.elapsed());
    let page = c.pull(1, 20, 0, 100, 0).unwrap();
    let shown: Vec<(u64, Kind, Vec<u8>)> = page
        .messages
        .iter()
        .map(|m| (m.msg_id, m.kind, m.payload.clone()))
        .collect();
    assert_eq!(
        shown,
        vec![
            (1, Kind::Message, b"kept".to_vec()),
            (2, Kind::Recalled, Vec::new()),
            (3, Kind::Recall { target: 2 }, Vec::new()),
        ]
    );
    // And after a restart, read from the erased copy.
    drop(c);
    let node = node.restart_after_kill();
    let mut c = node.client();
    let page = c.pull(1, 20, 0, 100, 0).unwrap();
    assert_eq!(page.messages.len(), 3);
    assert_eq!(page.messages[1].kind, Kind::Recalled);
    assert!(files_holding(dir.path(), &secret).is_empty());
}

/// A large group (its records in segment files: `--small-group-bytes-max`
/// below the payloads): the recalled payload leaves the segment files by
/// the erasure pass of the first stored checkpoint after the recall
/// (storage.md section 9 "Erasing segments", section 16 item 16), and the
/// journal's copy as for a small group's.
#[test]
fn a_recalled_payload_of_a_large_group_is_gone_from_the_data_directory_within_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let interval_ms = 200;
    let node = Node::start(
        dir.path(),
        &[
            "--checkpoint-interval-ms",
            &interval_ms.to_string(),
            "--small-group-bytes-max",
            "100",
        ],
    );
    let mut c = node.client();
    let mut secret = marker();
    secret.resize(300, b'#');
    c.create_group(1).unwrap();
    c.join(1, 20, JoinStart::Earliest).unwrap();
    c.send(1, 10, 1, &[b'k'; 200]).unwrap();
    c.send(1, 10, 2, &secret).unwrap();
    assert_eq!(c.recall(1, 10, 3, 2).unwrap().msg_id, 3);
    let deadline =
        Instant::now() + Duration::from_millis(interval_ms * 5) + Duration::from_secs(20);
    let mut left = files_holding(dir.path(), &secret);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(interval_ms));
        left = files_holding(dir.path(), &secret);
    }
    assert_eq!(left, Vec::<PathBuf>::new(), "the payload is still on disk");
    let groups = dir.path().join("groups");
    assert!(groups.exists(), "the group has segment files");
    let page = c.pull(1, 20, 0, 100, 0).unwrap();
    let kinds: Vec<(u64, Kind)> = page.messages.iter().map(|m| (m.msg_id, m.kind)).collect();
    assert_eq!(
        kinds,
        vec![
            (1, Kind::Message),
            (2, Kind::Recalled),
            (3, Kind::Recall { target: 2 })
        ]
    );
    assert!(page.messages[1].payload.is_empty());
    drop(c);
    let node = node.restart_after_kill();
    let mut c = node.client();
    let page = c.pull(1, 20, 0, 100, 0).unwrap();
    assert_eq!(page.messages.len(), 3);
    assert_eq!(page.messages[1].kind, Kind::Recalled);
    assert!(files_holding(dir.path(), &secret).is_empty());
}
