//! Tests of the Raft log's compaction and snapshot reset (`raft_log.rs`,
//! cluster.md sections 3.1, 3.2 and 3.5): the bytes of a rewritten file
//! (the spec's vector), reopen after a compaction, and a crash at each
//! step of the rewrite.

use raft::eraftpb::{Entry, HardState};
use raft::{Storage, StorageError};

use crate::raft_log::{RaftLog, FILE_NAME, NEW_FILE_NAME};
use crate::raft_log_format as format;
use crate::ClusterError;

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry {
        index,
        term,
        data: data.to_vec().into(),
        ..Default::default()
    }
}

fn hs(term: u64, vote: u64, commit: u64) -> HardState {
    HardState {
        term,
        vote,
        commit,
        ..Default::default()
    }
}

/// (index, term, data) of every entry the log holds.
fn held(log: &RaftLog) -> Vec<(u64, u64, Vec<u8>)> {
    (log.start().0 + 1..=log.last())
        .map(|i| {
            let e = log.entry(i).unwrap();
            (e.index, e.term, e.data.to_vec())
        })
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Five entries of term 1 (entry 1 empty), hard state (1, 1, 5).
fn five(dir: &std::path::Path) -> RaftLog {
    let mut log = RaftLog::open(dir, &[1, 2, 3]).unwrap();
    let entries: Vec<Entry> = (1..=5)
        .map(|i| entry(i, 1, if i == 1 { b"" } else { b"r" }))
        .collect();
    log.persist(&entries, Some(&hs(1, 1, 5))).unwrap();
    log
}

#[test]
fn a_compacted_log_is_the_spec_vector_and_reopens_to_the_entries_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = five(dir.path());
    // The rewrite's key, fixed for the vector (a new file's is random).
    crate::raft_log::TEST_MARK_KEY.with(|k| k.set(Some(0x0403_0201)));
    log.compact(4).unwrap();
    crate::raft_log::TEST_MARK_KEY.with(|k| k.set(None));
    assert_eq!(log.start(), (4, 1));
    assert_eq!(held(&log), vec![(5, 1, b"r".to_vec())]);
    // cluster.md section 3.5: the file after `compact(4)`, byte for byte.
    let bytes = std::fs::read(dir.path().join(FILE_NAME)).unwrap();
    assert_eq!(
        hex(&bytes),
        concat!(
            "544d5241 46544c00 03000000 01020304 c1000000 00000000 00000000 60d23899",
            "ce7c9c85 30000000 03 00000000000000 2000000000000000 4c0720f4 00000000",
            "0400000000000000 0100000000000000",
            "35f288d8 39000000 01 00000000000000 2000000000000000 290f548e 00000000",
            "0500000000000000 0100000000000000 00 00000000000000 72",
            "d9dc157e 38000000 02 00000000000000 2000000000000000 f2306cc4 00000000",
            "0100000000000000 0100000000000000 0500000000000000",
        )
        .replace(' ', "")
    );
    drop(log);
    let mut log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!(log.start(), (4, 1));
    assert_eq!(held(&log), vec![(5, 1, b"r".to_vec())]);
    assert_eq!(*log.hard_state(), hs(1, 1, 5));
    // raft-rs's view: compacted below the start, the start's term known.
    assert_eq!(log.first_index().unwrap(), 5);
    assert_eq!(log.last_index().unwrap(), 5);
    assert_eq!(log.term(4).unwrap(), 1);
    assert_eq!(
        log.term(3),
        Err(raft::Error::Store(StorageError::Compacted))
    );
    assert_eq!(
        log.entries(4, 6, None, raft::GetEntriesContext::empty(false)),
        Err(raft::Error::Store(StorageError::Compacted))
    );
    // Appends go on after the start, a conflict included; entries at or
    // before the start are refused.
    log.persist(&[entry(6, 2, b"s")], Some(&hs(2, 2, 6)))
        .unwrap();
    log.persist(&[entry(6, 3, b"t")], None).unwrap();
    assert!(log.persist(&[entry(4, 3, b"")], None).is_err());
    drop(log);
    let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!(
        held(&log),
        vec![(5, 1, b"r".to_vec()), (6, 3, b"t".to_vec())]
    );
    assert_eq!(*log.hard_state(), hs(2, 2, 6));
}

#[test]
fn a_crash_during_a_compaction_leaves_the_old_log_or_the_new_one() {
    // Before the rename: `log.new` written (whole or torn), `log` untouched.
    for torn in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut log = five(dir.path());
        log.crash_before_rename(3);
        drop(log);
        let new = dir.path().join(NEW_FILE_NAME);
        if torn {
            let len = std::fs::metadata(&new).unwrap().len();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&new)
                .unwrap()
                .set_len(len / 2)
                .unwrap();
        }
        let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
        assert_eq!(log.start(), (0, 0), "torn {torn}");
        assert_eq!(held(&log).len(), 5);
        assert!(!new.exists(), "the unfinished rewrite is removed");
    }
    // After the rename (its directory entry synced or not: the rename is
    // atomic): the new log.
    let dir = tempfile::tempdir().unwrap();
    let mut log = five(dir.path());
    log.compact(3).unwrap();
    drop(log);
    let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!(log.start(), (3, 1));
    assert_eq!(held(&log).len(), 2);
}

#[test]
fn a_reset_to_a_snapshot_drops_every_entry_and_reopens_at_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = five(dir.path());
    assert!(log.reset_to_snapshot(9, 2, &hs(2, 0, 8), None).is_err());
    log.reset_to_snapshot(9, 2, &hs(2, 0, 9), None).unwrap();
    assert_eq!((log.start(), log.last()), ((9, 2), 9));
    log.persist(&[entry(10, 2, b"u")], None).unwrap();
    drop(log);
    let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!(log.start(), (9, 2));
    assert_eq!(held(&log), vec![(10, 2, b"u".to_vec())]);
    assert_eq!(*log.hard_state(), hs(2, 0, 9));
}

#[test]
fn a_start_record_anywhere_but_first_or_in_a_version_1_file_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = five(dir.path());
    log.compact(2).unwrap();
    drop(log);
    let path = dir.path().join(FILE_NAME);
    let bytes = std::fs::read(&path).unwrap();
    // The Start record (bytes 32..80) appended again after the others.
    let start = format::FILE_HEADER_BYTES..format::FILE_HEADER_BYTES + 48;
    assert_eq!(bytes[start.start + 8], format::KIND_START);
    let mut twice = bytes.clone();
    twice.extend_from_slice(&bytes[start]);
    std::fs::write(&path, &twice).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset, .. }) if offset == bytes.len() as u64
    ));
    // A Start in a version 1 file.
    let mut v1 = format::MAGIC.to_vec();
    v1.extend_from_slice(&format::VERSION_1.to_le_bytes());
    v1.extend_from_slice(&[0; 4]);
    format::encode_record(&mut v1, format::KIND_START, |b| format::start_body(b, 2, 1));
    std::fs::write(&path, &v1).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset: 16, .. })
    ));
    // An entry at or before the start (this file's key, a true synced
    // length: a valid record that makes no sense).
    let other = tempfile::tempdir().unwrap();
    let mut log = five(other.path());
    log.compact(4).unwrap();
    drop(log);
    let mut early = std::fs::read(other.path().join(FILE_NAME)).unwrap();
    let key = format::read(&early).header.unwrap().mark_key;
    let at = early.len() as u64;
    format::encode_record_v3(&mut early, key, at, format::KIND_ENTRY, |b| {
        format::entry_body(b, &entry(4, 1, b""))
    });
    std::fs::write(other.path().join(FILE_NAME), &early).unwrap();
    assert!(matches!(
        RaftLog::open(other.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset, .. }) if offset == at
    ));
}

/// Found by fuzzing (`raft_log_open`): a Start at u64::MAX made the
/// reader's `start + 1` wrap.
#[test]
fn a_start_beyond_any_log_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let whole = |index| format::encode_whole(7, (index, 1), None, &[], &hs(1, 0, index));
    std::fs::write(&path, whole(u64::MAX)).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset: 32, .. })
    ));
    // In a version 2 file too.
    let mut v2 = format::MAGIC.to_vec();
    v2.extend_from_slice(&format::VERSION_2.to_le_bytes());
    v2.extend_from_slice(&[0; 4]);
    format::encode_record(&mut v2, format::KIND_START, |b| {
        format::start_body(b, u64::MAX, 1)
    });
    std::fs::write(&path, &v2).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset: 16, .. })
    ));
    std::fs::write(&path, whole(format::START_INDEX_MAX)).unwrap();
    let log = RaftLog::open(dir.path(), &[1]).expect("the largest start opens");
    assert_eq!(log.last(), format::START_INDEX_MAX);
}

#[test]
fn a_compaction_past_the_stored_commit_raises_it_to_the_start() {
    // The stored commit may lag the applied index (Raft relearns it), but
    // raft-rs refuses a log whose stored commit is below its start.
    let dir = tempfile::tempdir().unwrap();
    let mut log = five(dir.path());
    log.persist(&[], Some(&hs(1, 1, 2))).unwrap();
    log.compact(4).unwrap();
    drop(log);
    let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!(*log.hard_state(), hs(1, 1, 4));
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let config = raft::Config {
        id: 1,
        ..Default::default()
    };
    assert!(raft::RawNode::new(&config, log, &logger).is_ok());
}
