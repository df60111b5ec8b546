//! Tests of the Raft log file (`raft_log.rs`, cluster.md section 3): what
//! a reopen reads back after writes, conflicts, torn tails and damage.

use std::fs::OpenOptions;
use std::io::Write;

use raft::eraftpb::{Entry, HardState};
use raft::Storage;

use crate::raft_log::{RaftLog, FILE_HEADER_BYTES, FILE_NAME};
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

fn terms(log: &RaftLog) -> Vec<(u64, u64, Vec<u8>)> {
    (1..=log.last())
        .map(|i| {
            let e = log.entry(i).unwrap();
            (e.index, e.term, e.data.to_vec())
        })
        .collect()
}

#[test]
fn a_reopened_log_holds_what_was_persisted_and_a_conflict_drops_the_entries_after_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
        assert_eq!(log.last(), 0);
        log.persist(
            &[entry(1, 1, b""), entry(2, 1, b"a"), entry(3, 1, b"b")],
            Some(&hs(1, 2, 2)),
        )
        .unwrap();
        // A new leader of term 2 overwrites entry 3 (and what followed).
        log.persist(&[entry(3, 2, b"c")], Some(&hs(2, 3, 3)))
            .unwrap();
        assert_eq!(log.last(), 3);
    }
    let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!(
        terms(&log),
        vec![(1, 1, vec![]), (2, 1, b"a".to_vec()), (3, 2, b"c".to_vec())]
    );
    assert_eq!(*log.hard_state(), hs(2, 3, 3));
    let state = log.initial_state().unwrap();
    assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
    assert_eq!(log.term(3).unwrap(), 2);
    assert_eq!(log.term(0).unwrap(), 0);
    assert_eq!(
        log.entries(2, 4, None, raft::GetEntriesContext::empty(false))
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_torn_tail_is_cut_and_the_log_goes_on_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    {
        let mut log = RaftLog::open(dir.path(), &[1]).unwrap();
        log.persist(&[entry(1, 1, b"x"), entry(2, 1, b"yy")], None)
            .unwrap();
    }
    let full = std::fs::metadata(&path).unwrap().len();
    // The last record cut part-way, as a crash before the fdatasync can.
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(full - 3)
        .unwrap();
    {
        let mut log = RaftLog::open(dir.path(), &[1]).unwrap();
        assert_eq!(terms(&log), vec![(1, 1, b"x".to_vec())]);
        log.persist(&[entry(2, 2, b"z")], None).unwrap();
    }
    let log = RaftLog::open(dir.path(), &[1]).unwrap();
    assert_eq!(
        terms(&log),
        vec![(1, 1, b"x".to_vec()), (2, 2, b"z".to_vec())]
    );
}

#[test]
fn damage_is_refused_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    {
        let mut log = RaftLog::open(dir.path(), &[1]).unwrap();
        log.persist(&[entry(1, 1, b"x")], None).unwrap();
    }
    // A valid record of entry 3 after entry 1: a gap.
    let other = tempfile::tempdir().unwrap();
    {
        let mut log = RaftLog::open(other.path(), &[1]).unwrap();
        log.persist(
            &[entry(1, 1, b""), entry(2, 1, b""), entry(3, 1, b"q")],
            None,
        )
        .unwrap();
    }
    let bytes = std::fs::read(other.path().join(FILE_NAME)).unwrap();
    let third = bytes.len() - (16 + 24 + 1);
    OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(&bytes[third..])
        .unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { .. })
    ));
    // Not a Raft log at all.
    std::fs::write(other.path().join(FILE_NAME), [7u8; FILE_HEADER_BYTES + 8]).unwrap();
    assert!(matches!(
        RaftLog::open(other.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset: 0, .. })
    ));
}

#[test]
fn entries_that_leave_a_gap_or_are_joint_changes_are_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RaftLog::open(dir.path(), &[1]).unwrap();
    assert!(log.persist(&[entry(2, 1, b"")], None).is_err());
    let mut cc = entry(1, 1, b"");
    cc.set_entry_type(raft::eraftpb::EntryType::EntryConfChangeV2);
    assert!(log.persist(&[cc], None).is_err());
    assert_eq!(log.last(), 0);
    drop(log);
    assert_eq!(RaftLog::open(dir.path(), &[1]).unwrap().last(), 0);
}
