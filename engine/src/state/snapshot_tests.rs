//! Snapshots (`snapshot.rs`, format-spec/storage.md section 18): a copy
//! taken while appends, checkpoints, reclamation, promotions and a group
//! deletion go on opens as a data directory holding every append
//! acknowledged before the snapshot began, once, with dense ids; a live
//! snapshot defers every deletion, and the deletions happen after it ends.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::tests::{payload, small_config};
use crate::{Config, Engine, JoinStart, Snapshot};

/// Small groups up to 1,500 bytes, 4 KiB journal files, a checkpoint every
/// 16 KiB of journal, 8 KiB segments: every kind of file changes often.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 1500;
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 16 << 10;
    c
}

/// Writes every file of `snap` under `to` (as `tidemark backup` does).
fn copy(snap: &Snapshot, to: &Path) -> usize {
    let mut copied = 0;
    for f in snap.files().unwrap() {
        let Some(mut r) = snap.open(&f).unwrap() else {
            continue;
        };
        let mut bytes = vec![0u8; f.len as usize];
        let mut at = 0;
        while at < bytes.len() {
            let n = r.read(&mut bytes[at..]).unwrap();
            assert!(n > 0, "{} ended early", f.name);
            at += n;
        }
        let path = to.join(&f.name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        copied += 1;
    }
    copied
}

/// Every record of `group` in id order, checked dense from 1.
fn records(e: &Engine, group: u64) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let b = e.read(group, after, 64, 1 << 20).unwrap();
        for r in b.records() {
            assert_eq!(
                r.header.msg_id,
                out.len() as u64 + 1,
                "dense ids in {group}"
            );
            out.push(r.payload().to_vec());
        }
        if !b.has_more {
            return out;
        }
        after = b.last_id;
    }
}

type Acked = Arc<Mutex<BTreeMap<u64, Vec<Vec<u8>>>>>;

/// Appends to groups `groups` until `stop`, one to three records a call,
/// noting each acknowledged one (its id must be the next of its group).
fn writer(e: Arc<Engine>, groups: Vec<u64>, acked: Acked, stop: Arc<AtomicBool>) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let g = groups[(i as usize * 7) % groups.len()];
        for _ in 0..1 + i % 3 {
            let next = acked.lock().unwrap().get(&g).map_or(0, Vec::len) as u64 + 1;
            let p = payload(g, next);
            let a = e.append(g, 1, next, &p).unwrap();
            assert_eq!(a.msg_id, next);
            acked.lock().unwrap().entry(g).or_default().push(p);
        }
    }
}

#[test]
fn a_snapshot_taken_under_load_opens_with_every_append_acknowledged_before_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let e = Arc::new(Engine::open(config(dir.path())).unwrap());
    let acked: Acked = Arc::default();
    for g in 1..=12 {
        e.create_group(g).unwrap();
        e.join(g, 100 + g, JoinStart::Earliest).unwrap();
    }
    // Group 12 gets its own segments and a checkpoint names them; it is
    // deleted after the snapshot began, while the copy runs.
    for i in 1..=40 {
        let p = payload(12, i);
        e.append(12, 1, i, &p).unwrap();
        acked.lock().unwrap().entry(12).or_default().push(p);
    }
    e.checkpoint().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [vec![1, 2, 3, 4, 5], vec![6, 7, 8, 9, 10, 11]]
        .into_iter()
        .map(|groups| {
            let (e, acked, stop) = (e.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || writer(e, groups, acked, stop))
        })
        .collect();
    while e.stats().checkpoints < 4 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Acknowledged before the snapshot began: what the copy must hold.
    let before = acked.lock().unwrap().clone();
    let snap = e.snapshot().unwrap();
    assert!(snap.info().pause < std::time::Duration::from_secs(1));
    e.delete_group(12).unwrap();
    // Checkpoints (with their K7 and reclamation) and promotions go on;
    // without the hold they delete what the snapshot names.
    let at = e.stats().checkpoints;
    while e.stats().checkpoints < at + 4 {
        e.checkpoint().unwrap();
    }
    let copy_dir = tempfile::tempdir().unwrap();
    let copied = copy(&snap, copy_dir.path());
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    drop(snap);
    assert!(copied >= 4, "FORMAT, a manifest, runs, journal: {copied}");
    let after = acked.lock().unwrap().clone();
    let c = Engine::open(config(copy_dir.path())).unwrap();
    for g in 1..=12 {
        let got = records(&c, g);
        let want = &before.get(&g).cloned().unwrap_or_default();
        assert!(
            got.len() >= want.len(),
            "group {g}: {} < {}",
            got.len(),
            want.len()
        );
        assert_eq!(
            &got[..want.len()],
            &want[..],
            "group {g}: acknowledged before"
        );
        // Anything more is a prefix of what was acknowledged later: no
        // record twice, none invented.
        let all = &after[&g];
        assert_eq!(&got[..], &all[..got.len()], "group {g}: later records");
        assert!(c.members(g).unwrap().contains(&(100 + g)), "member of {g}");
    }
    assert!(!before.is_empty());
    // The copy is a data directory like any other: it takes writes.
    let next = c.head(1).unwrap() + 1;
    assert_eq!(c.append(1, 2, 1, b"after restore").unwrap().msg_id, next);
}

/// Names of the files in `dir`'s `journal/`, `manifest/` and `state/`.
fn files(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for sub in ["journal", "manifest", "state"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap() {
            out.insert(format!(
                "{sub}/{}",
                e.unwrap().file_name().to_str().unwrap()
            ));
        }
    }
    out
}

fn trash_entries(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("groups").join("trash")).map_or(0, |d| d.count())
}

#[test]
fn a_snapshot_defers_every_deletion_until_it_ends_and_then_they_happen() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30; // checkpoints on request only
    let e = Engine::open(c).unwrap();
    for g in 1..=4 {
        e.create_group(g).unwrap();
    }
    let mut sent = 0;
    let mut send = |e: &Engine, n: u64| {
        for _ in 0..n {
            sent += 1;
            let g = 2 + sent % 3;
            e.append(g, 1, sent, &payload(g, sent)).unwrap();
        }
    };
    for i in 1..=60 {
        e.append(1, 2, i, &payload(1, i)).unwrap(); // promoted: a directory
    }
    send(&e, 200);
    e.checkpoint().unwrap();
    let snap = e.snapshot().unwrap();
    let held: Vec<_> = snap.files().unwrap();
    let before = files(dir.path());
    // Three checkpoints would release the snapshot's manifest, its runs
    // and journal files; a deleted group's directory would be removed.
    for _ in 0..3 {
        send(&e, 100);
        e.checkpoint().unwrap();
    }
    e.delete_group(1).unwrap();
    send(&e, 10);
    let during = files(dir.path());
    let kept: Vec<_> = before.difference(&during).collect();
    assert!(kept.is_empty(), "deleted during the snapshot: {kept:?}");
    assert_eq!(
        trash_entries(dir.path()),
        1,
        "the deleted group's directory stays"
    );
    for f in &held {
        let mut r = snap.open(f).unwrap().expect("every held file opens");
        let mut buf = vec![0u8; f.len as usize];
        let mut at = 0;
        while at < buf.len() {
            at += r.read(&mut buf[at..]).unwrap();
        }
    }
    drop(snap);
    // Deferred, not lost: the first round queues the trash's removal, the
    // next checkpoints delete what the held ones kept.
    send(&e, 10);
    e.checkpoint().unwrap();
    e.checkpoint().unwrap();
    let after = files(dir.path());
    let gone: Vec<_> = before.difference(&after).collect();
    assert!(
        gone.iter().any(|f| f.starts_with("manifest/"))
            && gone.iter().any(|f| f.starts_with("journal/")),
        "released after the snapshot: {gone:?}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while trash_entries(dir.path()) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the trash was not emptied"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
