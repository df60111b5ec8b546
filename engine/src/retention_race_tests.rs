//! Retention run by the checkpointer's timer, outside a checkpoint
//! (format-spec/storage.md section 9, "Retention", and K7): a capture that
//! came while it dropped segments must not leave a kept manifest naming
//! files the drop deletes.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::io::FaultyVfs;
use crate::state::manifest;
use crate::tests::{fill, small_config};
use crate::{Engine, Retention};

fn journal_file_count(dir: &Path) -> usize {
    crate::commit::journal::list(&crate::io::OsVfs, &crate::commit::journal::journal_dir(dir))
        .unwrap()
        .len()
}

#[test]
fn a_capture_during_timed_retention_leaves_both_kept_manifests_complete() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let mut c = small_config(path);
    c.retention_check_ms = 3_600_000;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 200);
    e.create_group(3).unwrap();
    let policy = Retention {
        max_age_ms: 1,
        ..Retention::default()
    };
    e.set_retention(1, policy).unwrap();
    e.close().unwrap();
    std::thread::sleep(Duration::from_millis(5)); // every record is older than max_age_ms

    // Reopened with the retention timer on: the group is loaded (its
    // sealed segments not yet scanned), then the timer's pass is held
    // while it plans (the scan of a sealed segment for its first
    // timestamp), and a checkpoint is asked for meanwhile.
    let faulty = FaultyVfs::new();
    c.retention_check_ms = 200;
    let e = Arc::new(Engine::open_with_vfs(c.clone(), Arc::new(faulty.clone())).unwrap());
    let head = e.head(1).unwrap();
    e.read(1, head - 1, 1, 1 << 20).unwrap();
    let gdir = crate::logs::group_log::group_dir(path, 1);
    faulty.control.hold_paths_containing(gdir.to_str().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    while faulty.control.ops_held.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the retention pass never ran");
        std::thread::sleep(Duration::from_millis(1));
    }
    let files_before = journal_file_count(path);
    e.append(3, 7, 1, b"a change to capture").unwrap();
    let ckpt = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    // A capture rolls the journal: wait (bounded) to see whether one
    // comes while the pass is held.
    let until = Instant::now() + Duration::from_secs(3);
    while journal_file_count(path) == files_before && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    faulty.control.release_paths();
    ckpt.join().unwrap().unwrap();
    // The dropped files go with the checkpoint after the one recording
    // the drop (asked for by the checkpointer itself): then both kept
    // manifests must name only files that exist.
    let first_segment = gdir.join(crate::logs::segment::file_name(1));
    let until = Instant::now() + Duration::from_secs(30);
    while first_segment.exists() {
        assert!(
            Instant::now() < until,
            "the dropped segment was never deleted"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let mdir = manifest::manifest_dir(path);
    let kept = manifest::list(&crate::io::OsVfs, &mdir).unwrap();
    assert_eq!(kept.len(), 2, "{kept:?}");
    let engine = Arc::try_unwrap(e).ok().expect("the only handle");
    engine.simulate_crash();
    // The fallback: the newest manifest lost, the older one in force.
    std::fs::remove_file(&kept[1].1).unwrap();
    c.retention_check_ms = 3_600_000;
    let e = Engine::open(c).unwrap();
    let mut after = 0;
    loop {
        match e.read(1, after, 1000, 1 << 20) {
            Ok(b) if b.count == 0 => break,
            Ok(b) => after = b.last_id,
            Err(crate::Error::BelowRetentionFloor { earliest, .. }) if after == 0 => {
                after = earliest - 1
            }
            Err(err) => panic!("the fallback manifest names a deleted file: {err}"),
        }
    }
    assert!(after >= 200, "read to {after}");
}
