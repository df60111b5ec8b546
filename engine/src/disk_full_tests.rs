//! A full disk is a reason to wait, never to damage: a write of the open
//! (replay's promotions) that finds no space fails the open with a typed
//! error and marks nothing, so the open succeeds once space returns; and
//! the free-space reserve holds for the background writers too
//! (`space.rs`), on a real file system that fills.

use std::collections::BTreeMap;
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::io::{FaultyVfs, OsVfs, Vfs};
use crate::logs::group_log::group_dir;
use crate::tests::{payload, small_config};
use crate::{AppendRequest, Config, Engine, Error};

/// Groups keep up to 1,500 bytes of records in the journal; checkpoints
/// only on request.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 1500;
    c.checkpoint_journal_bytes = 1 << 30;
    c.checkpoint_interval_ms = 3_600_000;
    c
}

const GROUPS: u64 = 10;
const PER_GROUP: u64 = 40;

/// Sends `PER_GROUP` records to each of `GROUPS` groups, one batch per
/// round; returns what each group was sent.
fn fill_groups(e: &Engine) -> BTreeMap<u64, Vec<Vec<u8>>> {
    let mut sent: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
    for g in 1..=GROUPS {
        e.create_group(g).unwrap();
    }
    for i in 1..=PER_GROUP {
        let batch: Vec<(u64, Vec<u8>)> = (1..=GROUPS).map(|g| (g, payload(g, i))).collect();
        let requests: Vec<AppendRequest<'_>> = batch
            .iter()
            .map(|(g, p)| AppendRequest {
                group_id: *g,
                sender_id: 1,
                client_msg_id: i,
                payload: p,
            })
            .collect();
        e.append_batch(&requests).unwrap();
        for (g, p) in batch {
            sent.entry(g).or_default().push(p);
        }
    }
    sent
}

fn read_all(e: &Engine, g: u64) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut after = 0;
    loop {
        let b = e.read(g, after, 64, 1 << 20).unwrap();
        got.extend(b.records().map(|r| r.payload().to_vec()));
        if !b.has_more {
            return got;
        }
        after = b.last_id;
    }
}

#[test]
fn a_promotion_in_replay_that_finds_the_disk_full_fails_the_open_and_damages_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    let sent = fill_groups(&e);
    // Every group passed the threshold live, and no checkpoint recorded
    // it: replay promotes each one again.
    for g in 1..=GROUPS {
        assert!(group_dir(path, g).exists(), "group {g} was promoted live");
    }
    e.simulate_crash();

    // `groups/` is on a file system of its own, and it is full.
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    control.fill_paths_containing("groups");
    match Engine::open_with_vfs(config(path), Arc::new(vfs)) {
        Ok(e) => panic!(
            "the open went on over a full disk and marked {} groups damaged: {:?}",
            e.recovery_report().damaged_groups.len(),
            e.recovery_report().damaged_groups.first()
        ),
        Err(err) => {
            assert!(
                matches!(err, Error::NoSpace { .. }),
                "a typed disk-full error: {err}"
            );
            let text = err.to_string();
            assert!(
                text.contains("bytes free under") && text.contains("retry"),
                "the error says how much is free, where, and to retry: {text}"
            );
        }
    }
    assert!(control.writes_refused.load(Ordering::SeqCst) > 0);

    // Space returns: the open replays the same frames, promotes again, and
    // every acknowledged record reads back.
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(e.recovery_report().damaged_groups, Vec::new());
    for (g, want) in &sent {
        assert_eq!(&read_all(&e, *g), want, "group {g} after space returned");
    }
    // And a clean restart keeps them so.
    e.close().unwrap();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(e.recovery_report().damaged_groups, Vec::new());
    for (g, want) in &sent {
        assert_eq!(&read_all(&e, *g), want, "group {g} after a restart");
    }
}

/// A tmpfs of a fixed size, unmounted on drop: a real file system that
/// fills. Mounting needs CAP_SYS_ADMIN (root in the CI container); where
/// it is refused, the test says so and does not run.
struct SmallFs {
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(bytes: u64) -> Option<SmallFs> {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("fs");
        std::fs::create_dir(&root).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&root)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(SmallFs { root, _dir: dir }),
            other => {
                eprintln!("cannot mount a tmpfs here ({other:?}); test not run");
                None
            }
        }
    }

    fn free_bytes(&self) -> u64 {
        OsVfs.free_bytes(&self.root).unwrap()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.root).status();
    }
}

const MIB: u64 = 1 << 20;
/// `disk_free_min_bytes` of the reserve test.
const RESERVE: u64 = 6 * MIB;
/// How far below the reserve the free space may go (storage.md section 9,
/// "Free space"): one commit round accepted on the last measurement
/// (256 KiB here), a checkpoint's delta run and manifest (the extents of
/// 1,500 small groups: about 1 MiB), journal file headers.
const SLACK: u64 = 2 * MIB;
const SMALL_GROUPS: u64 = 1500;

/// Sends of about 1 KiB to 1,500 groups that all stay small (at most 31
/// records, 32 KiB each: 47 MB in all, more than the file system holds);
/// a checkpoint every 12 MiB of journal, so each evacuation pass would
/// copy up to 12 MiB into cold files.
fn reserve_config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 32 << 10;
    c.journal_file_bytes = MIB;
    c.checkpoint_journal_bytes = 12 * MIB;
    c.checkpoint_interval_ms = 3_600_000;
    c.disk_free_min_bytes = RESERVE;
    c
}

/// Sends batches of 64 until the engine refuses one with `DiskFull`;
/// returns how many records were acknowledged.
fn send_until_refused(e: &Engine) -> u64 {
    let payload = vec![7u8; 1000];
    let mut k = 0u64;
    loop {
        let batch: Vec<AppendRequest<'_>> = (k..k + 64)
            .map(|n| AppendRequest {
                group_id: n % SMALL_GROUPS + 1,
                sender_id: 1,
                client_msg_id: n + 1,
                payload: &payload,
            })
            .collect();
        assert!(
            k / SMALL_GROUPS < 30,
            "the file system took every group to its threshold without a refusal"
        );
        match e.append_batch(&batch) {
            Ok(_) => k += 64,
            Err(Error::DiskFull { .. }) => return k,
            Err(other) => panic!("send {k}: {other}"),
        }
    }
}

#[test]
fn background_writers_leave_the_free_space_reserve_whole() {
    let Some(fs) = SmallFs::mount(40 * MIB) else {
        return;
    };
    let path = fs.root.join("data");
    // Not dropped if the test fails: closing an engine on a disk that
    // really filled waits for space (its final checkpoint is held), and
    // the failure must be reported instead.
    let e = ManuallyDrop::new(Arc::new(Engine::open(reserve_config(&path)).unwrap()));
    for g in 1..=SMALL_GROUPS {
        e.create_group(g).unwrap();
    }
    // The lowest free space seen, sampled every millisecond.
    let lowest = Arc::new(AtomicU64::new(u64::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (lowest, stop, root) = (lowest.clone(), stop.clone(), fs.root.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(free) = OsVfs.free_bytes(&root) {
                    lowest.fetch_min(free, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let floor = RESERVE - SLACK;
    let check = |when: &str| {
        let low = lowest.load(Ordering::Relaxed);
        assert!(
            low >= floor,
            "{when}: free space fell to {low} bytes, below the reserve of {RESERVE} minus a \
             slack of {SLACK}"
        );
    };
    // Sends until refused, on a thread: a disk that really fills may hold
    // a round (and its sender) until space returns.
    let sender = {
        let e = Arc::clone(&e);
        std::thread::spawn(move || send_until_refused(&e))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !sender.is_finished() {
        check("while sending");
        assert!(Instant::now() < deadline, "no refusal within 120 s");
        std::thread::sleep(Duration::from_millis(5));
    }
    let acknowledged = sender.join().unwrap();
    assert!(acknowledged > 0);
    // Checkpoints after the refusal: their evacuation passes would copy
    // the journal's small records into cold files.
    for _ in 0..3 {
        e.checkpoint().unwrap();
        check("after a checkpoint");
    }
    // Deleting the groups frees their records' space (after the
    // checkpoints that release the files); sends are accepted again.
    for g in 1..=SMALL_GROUPS {
        e.delete_group(g).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        e.checkpoint().unwrap();
        check("while space returns");
        match e.create_group(SMALL_GROUPS + 1) {
            Ok(()) => break,
            Err(Error::DiskFull { .. }) => {
                assert!(
                    Instant::now() < deadline,
                    "still refused after deleting every group: {} bytes free",
                    fs.free_bytes()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(other) => panic!("create after space returned: {other}"),
        }
    }
    e.append(SMALL_GROUPS + 1, 1, 1, b"space is back").unwrap();
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    check("at the end");
    eprintln!(
        "acknowledged {acknowledged} records; lowest free {} bytes; reserve back-offs {}",
        lowest.load(Ordering::Relaxed),
        e.stats().reserve_backoffs
    );
    drop(ManuallyDrop::into_inner(e));
}
