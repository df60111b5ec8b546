//! Online backup and restore with the real binary: a node
//! under load from several clients is copied by `tidemark backup`, the copy
//! is served by `tidemark serve --data`, and every send acknowledged before
//! the backup began is there once, at its id, ids dense from 1; members and
//! the cursors a checkpoint persisted before the backup are there too.
//! Also: a backup into a directory that is not empty is refused.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tidemark_protocol::JoinStart;

use crate::harness::{tidemark_bin, Node};

const GROUPS: u64 = 24;

/// Small groups promoted past 4 KiB, a checkpoint every 256 KiB of
/// journal (about a second of this load: several before the backup, and
/// the journal after the newest holds many acknowledged sends), cursors
/// journaled every 50 ms: journal files, runs and segments change while
/// the backup runs.
const FLAGS: &[&str] = &[
    "--small-group-bytes-max",
    "4096",
    "--checkpoint-journal-bytes",
    "262144",
    "--checkpoint-interval-ms",
    "60000",
    "--cursor-flush-ms",
    "50",
];

fn user(g: u64) -> u64 {
    1000 + g
}

fn payload(g: u64, i: u64) -> Vec<u8> {
    format!("g{g}-m{i}-")
        .bytes()
        .cycle()
        .take(20 + (i * 53 % 400) as usize)
        .collect()
}

type Acked = Arc<Mutex<BTreeMap<u64, Vec<Vec<u8>>>>>;

/// Sends to `groups` until `stop`; every acknowledged send is noted at
/// its msg_id (a group is written by one client only, so ids follow).
fn writer(node_addr: String, groups: Vec<u64>, acked: Acked, stop: Arc<AtomicBool>) {
    let mut c =
        tidemark_client::Client::connect(&tidemark_client::ClientConfig::new(node_addr)).unwrap();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let g = groups[i * 5 % groups.len()];
        let next = acked.lock().unwrap().get(&g).map_or(0, Vec::len) as u64 + 1;
        let p = payload(g, next);
        let sent = c.send(g, 7, next, &p).unwrap();
        assert_eq!(sent.msg_id, next);
        acked.lock().unwrap().entry(g).or_default().push(p);
    }
}

/// Every record of group `g` (read by its member), oldest first, ids
/// checked dense from 1.
fn all_records(c: &mut tidemark_client::Client, g: u64) -> Vec<Vec<u8>> {
    let mut newest_first = Vec::new();
    let mut before = 0;
    loop {
        let (page, more) = c.history(g, user(g), before, 500).unwrap();
        let Some(oldest) = page.last() else { break };
        before = oldest.msg_id;
        newest_first.extend(page);
        if !more {
            break;
        }
    }
    let mut out = Vec::new();
    for (i, m) in newest_first.into_iter().rev().enumerate() {
        assert_eq!(m.msg_id, i as u64 + 1, "group {g}: ids dense from 1");
        out.push(m.payload);
    }
    out
}

#[test]
fn backup_under_load_then_serve_restores_every_send_acknowledged_before_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("node"), FLAGS);
    let mut c = node.client();
    let acked: Acked = Arc::default();
    for g in 1..=GROUPS {
        c.create_group(g).unwrap();
        c.join(g, user(g), JoinStart::Earliest).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..3)
        .map(|w| {
            let groups: Vec<u64> = (1..=GROUPS).filter(|g| g % 3 == w).collect();
            let (addr, acked, stop) = (node.addr.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || writer(addr, groups, acked, stop))
        })
        .collect();
    while acked.lock().unwrap().values().map(Vec::len).sum::<usize>() < 3000 {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Cursors: each member acknowledges half of what it has; the cursor
    // flush (every 50 ms) journals them before the backup begins.
    let mut cursors = BTreeMap::new();
    for g in 1..=GROUPS {
        let half = acked.lock().unwrap().get(&g).map_or(0, Vec::len) as u64 / 2;
        if half > 0 {
            cursors.insert(g, c.ack(g, user(g), half).unwrap());
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let before = acked.lock().unwrap().clone();
    let copy = dir.path().join("copy");
    let out = Command::new(tidemark_bin())
        .args(["backup", "--addr", &node.addr])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backup failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // "backup of ADDR in DIR: N files, B bytes in ..."
    let report = String::from_utf8(out.stdout).unwrap();
    let counts: Vec<u64> = report
        .split(": ")
        .nth(1)
        .unwrap()
        .split(' ')
        .filter_map(|w| w.trim_end_matches(',').parse().ok())
        .collect();
    assert!(counts[0] >= 4 && counts[1] > 100_000, "{report}");
    // Sends go on a little after the backup, then stop.
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let after = acked.lock().unwrap().clone();
    drop(node);

    let restored = Node::start(&copy, FLAGS);
    let mut r = restored.client();
    let mut total = 0;
    for g in 1..=GROUPS {
        let got = all_records(&mut r, g);
        let want = before.get(&g).cloned().unwrap_or_default();
        assert!(
            got.len() >= want.len(),
            "group {g}: {} records, {} acknowledged before the backup",
            got.len(),
            want.len()
        );
        // Each at its id, once; whatever is more was acknowledged later,
        // in order: nothing twice, nothing invented.
        assert_eq!(got[..], after[&g][..got.len()], "group {g}");
        let (members, _) = r.members(g, 0, 10).unwrap();
        assert_eq!(members.len(), 1, "group {g}: its member");
        assert_eq!(members[0].user, user(g));
        if let Some(&cursor) = cursors.get(&g) {
            assert_eq!(members[0].cursor, cursor, "group {g}: the cursor persisted");
        }
        total += want.len();
    }
    assert!(total >= 3000);
    // The restored node takes sends at the next id.
    let head = r.group_info(1).unwrap().head;
    assert_eq!(r.send(1, 9, 1, b"after restore").unwrap().msg_id, head + 1);
}

#[test]
fn a_backup_into_a_directory_that_is_not_empty_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("node"), &[]);
    let target = dir.path().join("full");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), b"x").unwrap();
    let out = Command::new(tidemark_bin())
        .args(["backup", "--addr", &node.addr])
        .arg(&target)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(std::fs::read(target.join("keep")).unwrap(), b"x");
}

fn ctl_on(args: &[&str], data: &std::path::Path) -> std::process::Output {
    Command::new(tidemark_bin())
        .arg("ctl")
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .expect("run tidemark ctl")
}

/// A fresh backup is a clean shutdown's directory (the backup command
/// opens the copy once and closes it cleanly): `ctl verify` (text and
/// `--json`) finds it clean and `ctl repair` finds nothing to do, with no
/// node started on it first. Before, repair refused it ("start the node
/// once and stop it"): the copy's checkpoint was a running node's.
#[test]
fn a_fresh_backup_is_verified_and_repairable_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("node"), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 2, JoinStart::Earliest).unwrap();
    for i in 1..=5 {
        c.send(1, 2, i, b"kept in the backup").unwrap();
    }
    let target = dir.path().join("copy");
    let out = Command::new(tidemark_bin())
        .args(["backup", "--addr", &node.addr])
        .arg(&target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let o = ctl_on(&["verify"], &target);
    let said = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(said.starts_with("ok: "), "{said}");
    let o = ctl_on(&["verify", "--json"], &target);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(
        (v["clean"].as_bool(), v["records"].as_u64()),
        (Some(true), Some(5))
    );
    let o = ctl_on(&["repair"], &target);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(said.contains("nothing to repair"), "{said}");

    // A replica set member's layout (`engine/` beside `raft/`): the
    // reading commands find the engine and say so; repair names it.
    // Before, verify called the member's directory "corrupt".
    let member = dir.path().join("member");
    std::fs::create_dir_all(member.join("raft")).unwrap();
    std::fs::rename(&target, member.join("engine")).unwrap();
    let o = ctl_on(&["verify"], &member);
    let (said, note) = (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    );
    assert_eq!(o.status.code(), Some(0), "{said}{note}");
    assert!(note.contains("replica set member's directory"), "{note}");
    let o = ctl_on(&["repair"], &member);
    let said = String::from_utf8_lossy(&o.stderr).to_string();
    assert_eq!(o.status.code(), Some(2), "{said}");
    assert!(
        said.contains("not a tidemark data directory")
            && said.contains(&member.join("engine").display().to_string())
            && !said.contains("corrupt"),
        "{said}"
    );
}
