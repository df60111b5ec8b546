//! Storage v2 step S5, first part: a group that holds no record has no
//! file and no directory (`LogSlot::Small` without records). Its creation and deletion are
//! journal entries only; its first record makes its files (commit thread,
//! replay); checkpoints record it with no segment (format-spec/storage.md
//! section 6.1) and recovery restores it without touching `groups/`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::io::{FaultControl, FaultyVfs};
use crate::{Config, Engine, FsyncPolicy, JoinStart};

fn config(dir: &Path) -> Config {
    let mut c = Config::segmented(dir);
    c.fsync = FsyncPolicy::Always;
    c
}

fn open_faulty(dir: &Path) -> (Engine, Arc<FaultControl>) {
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(config(dir), Arc::new(vfs)).unwrap();
    (e, control)
}

/// Files and directories under `groups/` (the trash included).
fn inodes_under_groups(dir: &Path) -> usize {
    fn walk(p: &Path, n: &mut usize) {
        let Ok(rd) = std::fs::read_dir(p) else {
            return;
        };
        for entry in rd.flatten() {
            *n += 1;
            walk(&entry.path(), n);
        }
    }
    let mut n = 0;
    walk(&dir.join("groups"), &mut n);
    n
}

/// The paths the engine touched while `f` ran, on any thread, apart from
/// the node-wide operations on the data directory itself (the free-space
/// measurement and the flusher's `syncfs`), which no single request causes.
fn touched(dir: &Path, control: &FaultControl, f: impl FnOnce()) -> Vec<PathBuf> {
    control.log_paths();
    f();
    control
        .logged_paths()
        .into_iter()
        .filter(|p| p != dir)
        .collect()
}

#[test]
fn creating_and_deleting_a_group_without_records_touch_only_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = open_faulty(dir.path());
    // The open's trash sweep runs on the worker: done before counting.
    e.wait_worker_idle();
    let journal = crate::commit::journal::journal_dir(dir.path());
    let paths = touched(dir.path(), &control, || {
        for g in 1..=20 {
            e.create_group(g).unwrap();
        }
    });
    assert!(!paths.is_empty(), "the creations were journaled");
    assert!(
        paths.iter().all(|p| p.starts_with(&journal)),
        "create_group touched files other than the journal: {paths:?}"
    );
    let paths = touched(dir.path(), &control, || {
        for g in 1..=20 {
            e.delete_group(g).unwrap();
        }
    });
    assert!(
        paths.iter().all(|p| p.starts_with(&journal)),
        "deleting a group without files touched files other than the journal: {paths:?}"
    );
    e.wait_worker_idle();
    assert_eq!(inodes_under_groups(dir.path()), 0);
}

#[test]
fn ten_thousand_groups_without_records_have_no_directory_across_checkpoints_and_crashes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.fsync = FsyncPolicy::Never;
    let e = Engine::open(c.clone()).unwrap();
    let tickets: Vec<_> = (1..=10_000u64)
        .map(|g| e.submit_create_group(g).unwrap())
        .collect();
    for t in tickets {
        e.wait_op(t).unwrap();
    }
    e.flush_cursors().unwrap(); // syncs the journal
    assert_eq!(inodes_under_groups(dir.path()), 0, "after creation");
    e.simulate_crash();
    let e = Engine::open(c.clone()).unwrap();
    assert_eq!(e.group_ids().len(), 10_000, "replayed creations");
    e.checkpoint().unwrap();
    assert_eq!(inodes_under_groups(dir.path()), 0, "after a checkpoint");
    e.simulate_crash();
    let e = Engine::open(c.clone()).unwrap();
    assert_eq!(e.group_ids().len(), 10_000, "restored from the checkpoint");
    assert_eq!(e.head(9_999).unwrap(), 0);
    assert_eq!(inodes_under_groups(dir.path()), 0, "after recovery");
    // The first record makes the group's files, and only its.
    assert_eq!(e.append(77, 1, 1, b"first").unwrap().msg_id, 1);
    assert_eq!(
        inodes_under_groups(dir.path()),
        3,
        "shard, group dir, segment"
    );
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    assert_eq!(e.group_ids().len(), 10_000, "after a clean stop");
    assert_eq!(e.head(77).unwrap(), 1);
    assert_eq!(inodes_under_groups(dir.path()), 3);
}

/// The first record of a group that a checkpoint recorded without files:
/// a crash before the next checkpoint replays it into new files (the
/// half-made directory of the lost run, if any, goes to the trash).
#[test]
fn a_first_record_after_a_checkpoint_survives_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let e = Engine::open(c.clone()).unwrap();
    e.create_group(5).unwrap();
    e.checkpoint().unwrap();
    let a = e.append(5, 1, 1, b"one").unwrap();
    e.append(5, 1, 2, b"two").unwrap();
    e.simulate_crash();
    let e = Engine::open(c.clone()).unwrap();
    let batch = e.read(5, 0, 10, usize::MAX).unwrap();
    let got: Vec<_> = batch
        .records()
        .map(|r| (r.header.msg_id, r.payload().to_vec()))
        .collect();
    assert_eq!(got, vec![(1, b"one".to_vec()), (2, b"two".to_vec())]);
    let again = e.append(5, 1, 1, b"one").unwrap();
    assert!(
        again.duplicate,
        "a retransmit after the crash is deduplicated"
    );
    assert_eq!(again.msg_id, a.msg_id);
    e.checkpoint().unwrap();
    e.simulate_crash();
    let e = Engine::open(c).unwrap();
    assert_eq!(e.head(5).unwrap(), 2);
}

/// Every read of a group without records answers from memory.
#[test]
fn reads_of_a_group_without_records_open_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = open_faulty(dir.path());
    e.create_group(3).unwrap();
    e.checkpoint().unwrap();
    e.wait_worker_idle();
    let paths = touched(dir.path(), &control, || {
        assert_eq!(e.join(3, 9, JoinStart::Earliest).unwrap(), 0);
        let batch = e.read(3, 0, 10, usize::MAX).unwrap();
        assert_eq!((batch.count, batch.has_more), (0, false));
        let pulled = e.pull(3, 9, 10, usize::MAX, None).unwrap();
        assert_eq!((pulled.cursor, pulled.head, pulled.batch.count), (0, 0, 0));
        let before = e.history(3, 9, None, 10, usize::MAX).unwrap();
        assert_eq!((before.batch.count, before.complete), (0, true));
        let sync = e.sync(9, 10, usize::MAX, None).unwrap();
        assert!(sync.groups.is_empty(), "nothing unread");
        assert_eq!(e.unread(9)[0].unread, 0);
    });
    let group_dir = dir.path().join("groups");
    assert!(
        !paths.iter().any(|p| p.starts_with(&group_dir)),
        "reads touched group files: {paths:?}"
    );
    let g = e.shared.catalog.read().get(3).cloned().unwrap();
    assert!(g.log.read().is_small_without_records());
}

/// A follower applies a leader's rounds through the same `apply`: groups
/// created by replicated rounds have no files either, until their first
/// replicated record.
#[test]
fn replicated_creations_make_no_files_on_the_follower() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Engine::open(config(da.path())).unwrap();
    let b = Engine::open(config(db.path())).unwrap();
    for g in 1..=50 {
        a.create_group(g).unwrap();
    }
    let feed = |a: &Engine, b: &Engine| {
        let rounds = a
            .read_rounds(b.last_round() + 1, a.last_round(), usize::MAX)
            .unwrap();
        for r in rounds {
            b.append_replicated(&r.bytes).unwrap();
        }
    };
    feed(&a, &b);
    assert_eq!(b.group_ids().len(), 50);
    assert_eq!(inodes_under_groups(db.path()), 0, "follower: no files");
    a.append(7, 1, 1, b"hi").unwrap();
    feed(&a, &b);
    assert_eq!(b.head(7).unwrap(), 1);
    assert_eq!(inodes_under_groups(db.path()), 3, "group 7's files only");
    b.simulate_crash();
    let b = Engine::open(config(db.path())).unwrap();
    assert_eq!((b.group_ids().len(), b.head(7).unwrap()), (50, 1));
}
