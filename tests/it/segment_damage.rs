//! A segment file cut under a running node (an operator's mistake, another
//! program, a file system repair): the node goes on serving, the group
//! whose file was cut answers GROUP_DAMAGED naming the file, other groups
//! are served. Before reads checked the file's length, the read touched
//! the mapping past the file's end and the node died of SIGBUS.

use std::path::{Path, PathBuf};

use tidemark_client::{Client, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::Node;

/// The segment files of `group`, oldest first.
fn segment_files(data: &Path, group: u64) -> Vec<PathBuf> {
    let name = format!("{group:016x}");
    for shard in std::fs::read_dir(data.join("groups")).unwrap() {
        let dir = shard.unwrap().path().join(&name);
        if dir.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "seg"))
                .collect();
            files.sort();
            return files;
        }
    }
    panic!("no directory for group {group}");
}

fn fill(c: &mut Client, group: u64, n: u64) {
    for i in 1..=n {
        let payload = vec![b'a' + (i % 26) as u8; 2000];
        c.send(group, 1, i, &payload).unwrap();
    }
}

/// Expects GROUP_DAMAGED whose message names `file`.
fn assert_damaged<T: std::fmt::Debug>(r: Result<T, ClientError>, file: &Path) {
    match r {
        Err(ClientError::Server {
            code: ErrorCode::GroupDamaged,
            message,
            ..
        }) => {
            let name = file.file_name().unwrap().to_str().unwrap();
            assert!(message.contains(name), "{message:?} does not name {name}");
        }
        other => panic!("expected GROUP_DAMAGED, got {other:?}"),
    }
}

fn assert_alive(node: &mut Node) {
    // A node that just died may still be exiting.
    std::thread::sleep(std::time::Duration::from_millis(50));
    if let Some(status) = node.child.try_wait().unwrap() {
        panic!("the node died: {status}");
    }
}

#[test]
fn a_segment_cut_under_the_node_damages_its_group_only() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = Node::start(
        &data,
        &[
            // Segment files from the first record on (groups this small
            // would otherwise keep their records in the journal).
            "--small-group-bytes-max",
            "0",
            "--segment-bytes-max",
            "65536",
            "--payload-bytes-max",
            "4096",
            "--fsync",
            "never",
        ],
    );
    let mut c = node.client();
    for g in 1..=3 {
        c.create_group(g).unwrap();
        c.join(g, 10, JoinStart::Earliest).unwrap();
        c.join(g, 11, JoinStart::Earliest).unwrap();
    }
    // Group 1: ~400 KB, six sealed segments of 64 KiB and an active one.
    // Group 2: the healthy neighbour. Group 3: one active segment, 20 KB,
    // enough that most of it was written to the file (not only held in
    // the unwritten tail).
    fill(&mut c, 1, 200);
    fill(&mut c, 2, 50);
    fill(&mut c, 3, 10);
    let sealed = segment_files(&data, 1);
    assert!(sealed.len() >= 3, "{sealed:?}");
    let active = segment_files(&data, 3);
    assert_eq!(active.len(), 1, "{active:?}");
    // Read everything once: every segment is mapped and verified, as on a
    // node that has served for a while.
    for g in 1..=3 {
        let page = c.pull(g, 10, 0, 1000, 0).unwrap();
        assert_eq!(page.messages.len() as u64, page.head, "group {g}");
    }

    // Cut the oldest sealed segment of group 1 and the active segment of
    // group 3 to one page while the node serves.
    for file in [&sealed[0], &active[0]] {
        std::fs::OpenOptions::new()
            .write(true)
            .open(file)
            .unwrap()
            .set_len(4096)
            .unwrap();
    }

    // Pull and history over the cut range: a typed error on the same
    // connection, which stays usable.
    let r = c.pull(1, 11, 0, 1000, 0);
    assert_alive(&mut node);
    assert_damaged(r, &sealed[0]);
    assert_damaged(c.history(1, 10, 5, 10), &sealed[0]);
    assert_damaged(c.pull(3, 11, 0, 1000, 0), &active[0]);
    assert_damaged(c.history(3, 10, 0, 10), &active[0]);
    assert_alive(&mut node);
    c.ping().unwrap();

    // The newest history page of group 1 lies in segments that are intact.
    let (newest, more) = c.history(1, 10, 0, 5).unwrap();
    assert_eq!(
        newest.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![200, 199, 198, 197, 196]
    );
    assert!(more);

    // The other group is served, on this connection and on a new one.
    let page = c.pull(2, 11, 0, 1000, 0).unwrap();
    assert_eq!(page.messages.len(), 50);
    let mut fresh = node.client();
    let (hist, _) = fresh.history(2, 10, 0, 3).unwrap();
    assert_eq!(
        hist.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![50, 49, 48]
    );
    assert_damaged(fresh.pull(1, 11, 0, 1000, 0), &sealed[0]);
    assert_alive(&mut node);
}
