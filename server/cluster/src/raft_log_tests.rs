//! Tests of the Raft log file (`raft_log.rs`, `raft_log_format.rs`,
//! cluster.md section 3): what a reopen reads back after writes, conflicts,
//! torn tails and damage; damage to synced bytes refused, never cut; an
//! older version read and rewritten.

use std::fs::OpenOptions;
use std::path::Path;

use raft::eraftpb::{Entry, HardState};
use raft::Storage;

use crate::raft_log::{RaftLog, FILE_HEADER_BYTES, FILE_NAME};
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
    // A valid record (this file's key, a true synced length) of entry 3
    // after entry 1: a gap.
    let mut bytes = std::fs::read(&path).unwrap();
    let key = format::read(&bytes).header.unwrap().mark_key;
    let at = bytes.len() as u64;
    format::encode_record_v3(&mut bytes, key, at, format::KIND_ENTRY, |b| {
        format::entry_body(b, &entry(3, 1, b"q"))
    });
    std::fs::write(&path, &bytes).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset, .. }) if offset == at
    ));
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "nothing changed");
    // Not a Raft log at all.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join(FILE_NAME), [7u8; FILE_HEADER_BYTES + 8]).unwrap();
    assert!(matches!(
        RaftLog::open(other.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset: 0, .. })
    ));
}

/// Bytes of the file after each of a log's writes: its creation, then
/// entry 1 (term 1), entry 2 (term 4, vote 2), entry 3 (term 5, vote 3)
/// with their hard states, one `persist` each.
fn three_writes(dir: &Path) -> Vec<u64> {
    let len = || std::fs::metadata(dir.join(FILE_NAME)).unwrap().len();
    let mut log = RaftLog::open(dir, &[1, 2, 3]).unwrap();
    let mut ends = vec![len()];
    log.persist(&[entry(1, 1, b"a")], Some(&hs(1, 1, 0)))
        .unwrap();
    ends.push(len());
    log.persist(&[entry(2, 4, b"bb")], Some(&hs(4, 2, 1)))
        .unwrap();
    ends.push(len());
    log.persist(&[entry(3, 5, b"ccc")], Some(&hs(5, 3, 2)))
        .unwrap();
    ends.push(len());
    ends
}

/// A flipped byte in the middle of a log (entry 2's write, synced, with
/// a synced write after it) was taken for a torn tail: the file was cut
/// there and synced, losing entries 2 and 3 and the hard state (term 5,
/// vote 3: the node could vote again in term 5). It is damage: the open is
/// refused, naming the file and the offset, and the file is left as it is.
#[test]
fn a_flipped_byte_in_a_synced_middle_record_is_refused_and_nothing_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let ends = three_writes(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[((ends[1] + ends[2]) / 2) as usize] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    match RaftLog::open(dir.path(), &[1, 2, 3]) {
        Err(e @ ClusterError::RaftLogDamaged { .. }) => {
            let ClusterError::RaftLogDamaged {
                path: named,
                offset,
                ..
            } = &e
            else {
                unreachable!()
            };
            assert_eq!(*named, path);
            assert_eq!(*offset, ends[1], "entry 2's record: {e}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(log) => panic!(
            "opened at last entry {} with hard state {:?}: synced records were cut",
            log.last(),
            log.hard_state()
        ),
    }
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "the file is unchanged"
    );
}

/// Every byte of a small log flipped in turn (two ways): a byte that was
/// synced before a later write is refused at its record's offset with the
/// file unchanged; a byte of the last write, which no later record shows
/// synced and a crash may tear, is a torn write: the log is the write
/// before it and the last write's whole records before the flipped one.
/// Never a log with a record it did not hold, never one that lost a
/// record a synced length covers.
#[test]
fn a_flip_at_every_offset_is_refused_at_its_record_or_is_the_last_write_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let ends = three_writes(dir.path());
    let good = std::fs::read(&path).unwrap();
    assert_eq!(good.len() as u64, ends[3]);
    let last_write = ends[2];
    for flip in [0x01u8, 0xff] {
        for at in 0..good.len() {
            let mut bytes = good.clone();
            bytes[at] ^= flip;
            std::fs::write(&path, &bytes).unwrap();
            let opened = RaftLog::open(dir.path(), &[1, 2, 3]);
            let what = format!("byte {at} ^ {flip:#x}");
            if (at as u64) < last_write {
                // The record it is in starts in the same write, at or
                // before it (the header: its fields' offsets).
                let write_start = ends.iter().rev().find(|&&e| e <= at as u64).unwrap_or(&0);
                match opened {
                    Err(ClusterError::RaftLogDamaged { offset, .. }) => assert!(
                        offset <= at as u64 && (offset >= *write_start || at < FILE_HEADER_BYTES),
                        "{what}: refused at {offset}"
                    ),
                    Err(e) => panic!("{what}: {e}"),
                    Ok(log) => panic!("{what}: opened at {} {:?}", log.last(), log.hard_state()),
                }
                assert_eq!(std::fs::read(&path).unwrap(), bytes, "{what}: changed");
            } else {
                // The last write: entry 3's record, then the hard state's.
                // The records before the flipped one are whole and kept.
                let entry_3_end = last_write
                    + (format::RECORD_HEADER_V3_BYTES + format::ENTRY_FIXED_BYTES + 3) as u64;
                let (kept, mut held) = (
                    last_write,
                    vec![(1, 1, b"a".to_vec()), (2, 4, b"bb".to_vec())],
                );
                let kept = if at as u64 >= entry_3_end {
                    held.push((3, 5, b"ccc".to_vec()));
                    entry_3_end
                } else {
                    kept
                };
                let log = opened.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(terms(&log), held, "{what}");
                assert_eq!(*log.hard_state(), hs(4, 2, 1), "{what}");
                drop(log);
                assert_eq!(std::fs::read(&path).unwrap(), &good[..kept as usize]);
            }
        }
    }
}

/// A compacted file holds its header's `durable_len` bytes, all synced
/// before it was renamed into place: one that ends before them (cut at a
/// record's end, which no torn write does) is refused.
#[test]
fn a_rewritten_file_cut_short_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    {
        let mut log = RaftLog::open(dir.path(), &[1]).unwrap();
        log.persist(
            &[entry(1, 1, b""), entry(2, 1, b"a"), entry(3, 1, b"b")],
            Some(&hs(1, 1, 3)),
        )
        .unwrap();
        log.compact(1).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap();
    // Without its last record (the hard state, 32 + 24 bytes).
    let cut = bytes.len() - (format::RECORD_HEADER_V3_BYTES + format::HARD_STATE_BYTES);
    std::fs::write(&path, &bytes[..cut]).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[1]),
        Err(ClusterError::RaftLogDamaged { offset, .. }) if offset == cut as u64
    ));
    assert_eq!(std::fs::read(&path).unwrap(), &bytes[..cut]);
}

/// A version 2 file (no synced lengths) is read by its version's rules
/// (an invalid record ends it) and rewritten as version 3 at open.
#[test]
fn a_version_2_file_is_read_and_rewritten_as_version_3() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut v2 = format::MAGIC.to_vec();
    v2.extend_from_slice(&format::VERSION_2.to_le_bytes());
    v2.extend_from_slice(&[0; 4]);
    format::encode_record(&mut v2, format::KIND_START, |b| format::start_body(b, 4, 2));
    for e in [entry(5, 2, b"r"), entry(6, 3, b"")] {
        format::encode_record(&mut v2, format::KIND_ENTRY, |b| format::entry_body(b, &e));
    }
    format::encode_record(&mut v2, format::KIND_HARD_STATE, |b| {
        format::hard_state_body(b, &hs(3, 1, 6))
    });
    let whole = v2.len();
    // A torn last write: half an entry record.
    format::encode_record(&mut v2, format::KIND_ENTRY, |b| {
        format::entry_body(b, &entry(7, 3, b"xyz"))
    });
    v2.truncate(whole + 20);
    std::fs::write(&path, &v2).unwrap();
    let log = RaftLog::open(dir.path(), &[1, 2, 3]).unwrap();
    assert_eq!((log.start(), log.last()), ((4, 2), 6));
    assert_eq!(*log.hard_state(), hs(3, 1, 6));
    drop(log);
    let bytes = std::fs::read(&path).unwrap();
    let reading = format::read(&bytes);
    assert_eq!(reading.header.unwrap().version, format::VERSION);
    assert_eq!(reading.outcome, format::Outcome::Clean);
    assert_eq!(reading.state.start, (4, 2));
    assert_eq!(reading.state.last(), 6);
    assert_eq!(reading.header.unwrap().durable_len, bytes.len() as u64);
}

/// Entry data holding what looks like a record header naming a synced
/// length past a torn write (a client chooses a round's bytes) is not
/// taken for a proof: the header checksum is keyed with the file's key,
/// which entry data cannot know; the torn write is cut. (With the file's
/// key, the same bytes would be a proof: the open refuses.)
#[test]
fn entry_data_that_mimics_a_record_header_proves_nothing() {
    for knows_the_key in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        let mut log = RaftLog::open(dir.path(), &[1]).unwrap();
        log.persist(&[entry(1, 1, b"x")], None).unwrap();
        let torn_at = std::fs::metadata(&path).unwrap().len();
        let key = format::read(&std::fs::read(&path).unwrap())
            .header
            .unwrap()
            .mark_key;
        let forged_key = if knows_the_key {
            key
        } else {
            key ^ 0x5a5a_5a5a
        };
        // Entry 2's data: a record header naming `torn_at + 1`, which is
        // at most its own offset (`torn_at` + 32 + 24).
        let mut forged = Vec::new();
        format::encode_record_v3(
            &mut forged,
            forged_key,
            torn_at + 1,
            format::KIND_HARD_STATE,
            |b| format::hard_state_body(b, &hs(9, 9, 9)),
        );
        log.persist(&[entry(2, 1, &forged)], None).unwrap();
        drop(log);
        // The last write's record header damaged, as a torn write can
        // leave it.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[torn_at as usize + 4] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let opened = RaftLog::open(dir.path(), &[1]);
        if knows_the_key {
            assert!(matches!(
                opened,
                Err(ClusterError::RaftLogDamaged { offset, .. }) if offset == torn_at
            ));
        } else {
            let log = opened.unwrap();
            assert_eq!(terms(&log), vec![(1, 1, b"x".to_vec())]);
        }
    }
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
