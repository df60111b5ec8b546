//! Small groups' records in shared files (journal and cold files) through
//! the real binary (format-spec/storage.md section 9, "Small groups"):
//! a data directory with small, promoted and cold-evacuated groups, then
//! damage. A cold file lost while the node was stopped: `ctl verify` names
//! it (status 1), and the node, which numbers its next cold files above
//! every one the checkpoint names, answers GROUP_DAMAGED for the group
//! whose records it held, never another group's records at the same
//! place. A cold file cut under a running node: the read answers
//! GROUP_DAMAGED naming the file (before, the read touched the mapping
//! past the file's end and the node died of SIGBUS).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::{tidemark_bin, Node};

/// Promoted past the small-group threshold at its first sends.
const PROMOTED: u64 = 1;
/// Traffic that keeps checkpoints coming (every 100 ms while anything
/// changed), which move journal files out of the replay window, evacuate
/// them into cold files and delete them.
const CHURN: u64 = 2;
const LOST: u64 = 11;
const LATER: u64 = 21;

fn start(data: &Path) -> Node {
    Node::start(data, &["--checkpoint-interval-ms", "100"])
}

fn ctl_verify(data: &Path) -> (Option<i32>, String) {
    let o: Output = Command::new(tidemark_bin())
        .args(["ctl", "verify", "--data"])
        .arg(data)
        .output()
        .expect("run tidemark ctl");
    let t = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code(), t)
}

/// Payload `i` of group `g`: the same length for every group.
fn payload(g: u64, i: u64) -> Vec<u8> {
    let mut p = format!("group {g:02} message {i:02} ").into_bytes();
    p.resize(60, b'.');
    p
}

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
    found.sort();
    found
}

/// Sends to the churn group until `needle` is in cold files only (its
/// journal file was evacuated and deleted), then returns those files.
fn churn_until_cold_only(c: &mut Client, data: &Path, needle: &[u8], from: u64) -> Vec<PathBuf> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut i = from;
    loop {
        let holding = files_holding(data, needle);
        if !holding.is_empty()
            && holding
                .iter()
                .all(|p| p.extension().is_some_and(|x| x == "tmc"))
        {
            return holding;
        }
        assert!(Instant::now() < deadline, "never evacuated: {holding:?}");
        c.send(CHURN, 9, i, &[b'c'; 2000]).unwrap();
        i += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn messages(c: &mut Client, g: u64) -> Result<Vec<Vec<u8>>, ClientError> {
    let page = c.pull(g, 100 + g, 0, 1000, 0)?;
    Ok(page.messages.into_iter().map(|m| m.payload).collect())
}

/// Expects GROUP_DAMAGED whose message names `file`.
fn assert_damaged(r: Result<Vec<Vec<u8>>, ClientError>, file: &Path) {
    match r {
        Err(ClientError::Server {
            code: ErrorCode::GroupDamaged,
            message,
            ..
        }) => {
            let name = file.file_name().unwrap().to_str().unwrap();
            assert!(message.contains(name), "{message:?} does not name {name}");
        }
        Ok(got) => panic!(
            "served {} messages instead of GROUP_DAMAGED: {:?}",
            got.len(),
            got.first().map(|p| String::from_utf8_lossy(p).into_owned())
        ),
        other => panic!("expected GROUP_DAMAGED, got {other:?}"),
    }
}

fn assert_alive(node: &mut Node) {
    std::thread::sleep(Duration::from_millis(50));
    if let Some(status) = node.child.try_wait().unwrap() {
        panic!("the node died: {status}");
    }
}

fn create(c: &mut Client, groups: &[u64]) {
    for &g in groups {
        c.create_group(g).unwrap();
        c.join(g, 100 + g, JoinStart::Earliest).unwrap();
    }
    // The churn group is promoted at once: its records are in segment
    // files, not in the cold files the tests damage.
    if groups.contains(&CHURN) {
        for i in 1..=4 {
            c.send(CHURN, 6, i, &vec![b'c'; 20_000]).unwrap();
        }
    }
}

#[test]
fn a_lost_cold_file_is_named_and_never_serves_another_groups_records() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = start(&data);
    let mut c = node.client();
    create(&mut c, &[PROMOTED, CHURN, LOST, LATER]);
    for i in 1..=5 {
        c.send(PROMOTED, 7, i, &vec![b'p'; 20_000]).unwrap();
        c.send(LOST, 7, i, &payload(LOST, i)).unwrap();
    }
    let cold = churn_until_cold_only(&mut c, &data, &payload(LOST, 5), 1);
    assert_eq!(cold.len(), 1, "{cold:?}");
    // Group 21's records, of the same lengths, wait in the journal.
    for i in 1..=5 {
        c.send(LATER, 7, i, &payload(LATER, i)).unwrap();
    }
    assert!(node.terminate().success());

    std::fs::remove_file(&cold[0]).unwrap();
    let (code, t) = ctl_verify(&data);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains(&*cold[0].to_string_lossy()), "{t}");
    assert!(t.contains("offset"), "{t}");

    let mut node = start(&data);
    let mut c = node.client();
    // Group 21's journal file is evacuated into a new cold file, never
    // under the lost file's number.
    let later = churn_until_cold_only(&mut c, &data, &payload(LATER, 5), 1000);
    assert!(!later.contains(&cold[0]), "{later:?} reuses {:?}", cold[0]);
    assert_damaged(messages(&mut c, LOST), &cold[0]);
    assert_alive(&mut node);
    let want: Vec<Vec<u8>> = (1..=5).map(|i| payload(LATER, i)).collect();
    assert_eq!(messages(&mut c, LATER).unwrap(), want);
    assert_eq!(messages(&mut c, PROMOTED).unwrap().len(), 5);
    // Sends go on to every group but the damaged small one, which answers
    // GROUP_DAMAGED (its window cannot be rebuilt from its records).
    for g in [PROMOTED, CHURN, LATER] {
        c.send(g, 8, 1, b"after").unwrap();
    }
    match c.send(LOST, 8, 1, b"after") {
        Err(ClientError::Server {
            code: ErrorCode::GroupDamaged,
            ..
        }) => {}
        other => panic!("expected GROUP_DAMAGED, got {other:?}"),
    }
    assert_alive(&mut node);
    assert!(node.terminate().success());
    let (code, t) = ctl_verify(&data);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains(&*cold[0].to_string_lossy()), "{t}");
}

#[test]
fn a_cold_file_cut_under_the_node_answers_group_damaged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = start(&data);
    let mut c = node.client();
    // Groups 3 to 10 first, about 1 KB each: group 11's extent lies past
    // the first page of the cold file.
    let before: Vec<u64> = (3..=10).collect();
    create(&mut c, &[PROMOTED, CHURN, LOST]);
    create(&mut c, &before);
    for &g in &before {
        c.send(g, 7, 1, &vec![b'a' + g as u8; 1000]).unwrap();
    }
    for i in 1..=5 {
        c.send(PROMOTED, 7, i, &vec![b'p'; 20_000]).unwrap();
        c.send(LOST, 7, i, &payload(LOST, i)).unwrap();
    }
    let cold = churn_until_cold_only(&mut c, &data, &payload(LOST, 5), 1);
    assert_eq!(cold.len(), 1, "{cold:?}");
    // Read once (the file is mapped), then cut it under the node.
    assert_eq!(messages(&mut c, LOST).unwrap().len(), 5);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&cold[0])
        .unwrap()
        .set_len(40)
        .unwrap();
    let r = messages(&mut c, LOST);
    assert_alive(&mut node);
    assert_damaged(r, &cold[0]);
    assert_eq!(messages(&mut c, PROMOTED).unwrap().len(), 5);
    for g in [PROMOTED, CHURN] {
        c.send(g, 8, 1, b"after").unwrap();
    }
    assert_alive(&mut node);
    assert!(node.terminate().success());

    let (code, t) = ctl_verify(&data);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains(&*cold[0].to_string_lossy()), "{t}");
    assert!(t.contains("offset"), "{t}");
    let mut node = start(&data);
    let mut c = node.client();
    assert_damaged(messages(&mut c, LOST), &cold[0]);
    assert_eq!(messages(&mut c, PROMOTED).unwrap().len(), 6);
    for g in [PROMOTED, CHURN] {
        c.send(g, 8, 2, b"again").unwrap();
    }
    assert_alive(&mut node);
}
