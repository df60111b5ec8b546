//! The checkpoint statistics (`EngineStats::checkpoint_bytes`,
//! `checkpoint_bytes_max`, `journal_bytes`): what the population benchmark
//! reads to report checkpoint bytes per journal byte.

use std::collections::HashSet;

use crate::state::checkpoint_tests::{load_manifest, newest_manifest};
use crate::{Config, Engine, FsyncPolicy, JoinStart};

/// Bytes of the newest manifest and of the run parts it names that the
/// previous manifest (`before`, its run sequence numbers) did not.
fn stored_bytes(dir: &std::path::Path, before: &HashSet<u64>) -> (u64, HashSet<u64>) {
    let path = newest_manifest(dir);
    let m = load_manifest(&path);
    let new_runs: u64 = m
        .runs
        .iter()
        .filter(|r| !before.contains(&r.run_seq))
        .map(|r| r.bytes())
        .sum();
    let runs = m.runs.iter().map(|r| r.run_seq).collect();
    (std::fs::metadata(&path).unwrap().len() + new_runs, runs)
}

#[test]
fn checkpoint_and_journal_bytes_count_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    config.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(config).unwrap();
    let s0 = e.stats();
    assert_eq!((s0.checkpoint_bytes, s0.checkpoint_bytes_max), (0, 0));

    e.create_group(1).unwrap();
    for i in 0..10 {
        e.append(1, 7, i + 1, &[0xab; 200]).unwrap();
    }
    let s1 = e.stats();
    // Ten records of 200 payload bytes went through the journal.
    assert!(
        s1.journal_bytes >= s0.journal_bytes + 10 * 200,
        "{} -> {}",
        s0.journal_bytes,
        s1.journal_bytes
    );

    e.checkpoint().unwrap();
    let (first, runs) = stored_bytes(dir.path(), &HashSet::new());
    let s2 = e.stats();
    assert_eq!(s2.checkpoints, s1.checkpoints + 1);
    assert_eq!(s2.checkpoint_bytes, s1.checkpoint_bytes + first);
    assert_eq!(s2.checkpoint_bytes_max, first);

    // More changes make a bigger checkpoint: the maximum follows it. (The
    // delta is merged with the first run here, so it wrote both.)
    for g in 2..=200 {
        e.create_group(g).unwrap();
        e.join(g, 9, JoinStart::Head).unwrap();
    }
    e.checkpoint().unwrap();
    let (second, _) = stored_bytes(dir.path(), &runs);
    let s3 = e.stats();
    assert!(s3.checkpoint_bytes >= s2.checkpoint_bytes + second);
    assert!(s3.checkpoint_bytes_max >= second && second > first);
    assert_eq!(
        s3.checkpoint_bytes_max,
        s3.checkpoint_bytes - s2.checkpoint_bytes
    );
    assert!(s3.journal_bytes > s2.journal_bytes);
    assert!(s3.checkpoint_ms_max <= s3.checkpoint_ms_total);
}

/// Each checkpoint's outcome is counted with its time: a stored one sets
/// `last_checkpoint_unix_ms`, a failed one (here a sync that fails, which
/// also stops writes) counts in `checkpoints_failed` and sets
/// `last_checkpoint_failed_unix_ms` (whether its capture or its writing
/// failed); neither touches the other's figures.
#[test]
fn a_checkpoints_outcome_and_time_are_counted() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    let now_ms = crate::clock::now_ms;
    let dir = tempfile::tempdir().unwrap();
    let vfs = crate::io::FaultyVfs::new();
    let control = vfs.control.clone();
    // No journal syncs for the rounds: the syncs that fail are the
    // checkpoint's (its capture's journal roll, its files).
    let mut config = Config::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    let s0 = e.stats();
    assert_eq!(
        (
            s0.checkpoints_failed,
            s0.last_checkpoint_unix_ms,
            s0.last_checkpoint_failed_unix_ms
        ),
        (0, 0, 0),
        "nothing since open"
    );

    let before = now_ms();
    e.create_group(1).unwrap();
    e.checkpoint().unwrap();
    let s1 = e.stats();
    assert_eq!(s1.checkpoints, s0.checkpoints + 1);
    assert!((before..=now_ms()).contains(&s1.last_checkpoint_unix_ms));
    assert_eq!(
        (s1.checkpoints_failed, s1.last_checkpoint_failed_unix_ms),
        (0, 0)
    );

    e.create_group(2).unwrap();
    control.fail_syncs.store(true, Ordering::SeqCst);
    let before = now_ms();
    assert!(e.checkpoint().is_err());
    control.fail_syncs.store(false, Ordering::SeqCst);
    let s2 = e.stats();
    assert_eq!(s2.checkpoints, s1.checkpoints, "not stored");
    assert_eq!(s2.checkpoints_failed, 1);
    assert!((before..=now_ms()).contains(&s2.last_checkpoint_failed_unix_ms));
    assert_eq!(s2.last_checkpoint_unix_ms, s1.last_checkpoint_unix_ms);
}
