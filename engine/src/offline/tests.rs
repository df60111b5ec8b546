//! `ctl` on real directories the engine wrote: each repair case (bytes
//! flipped in a sealed and in the active segment, a missing segment, a
//! damaged small group, a repair interrupted between its segment and its
//! checkpoint, deleting a group), then the engine opens the result and
//! serves every intact record at its id, gaps at the lost ids, and the next
//! send after the head.

use std::path::{Path, PathBuf};

use super::{DataDir, RepairTarget};
use crate::commit::journal_crash_tests::tree;
use crate::logs::record;
use crate::tests::{payload, small_config};
use crate::{Config, Engine, Error, JoinStart};

/// Segments of 8 KiB; groups up to 1,500 bytes stay small.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 1500;
    c
}

const BIG: u64 = 1;
const SMALL: u64 = 2;
const BIG_RECORDS: u64 = 150;
const SMALL_RECORDS: u64 = 6;

/// Group 1: 150 records over several segments; group 2: 6 small records
/// (kept in the journal). A member in each. Closed cleanly.
fn build(dir: &Path) {
    let e = Engine::open(config(dir)).unwrap();
    for (g, n) in [(BIG, BIG_RECORDS), (SMALL, SMALL_RECORDS)] {
        e.create_group(g).unwrap();
        e.join(g, 100 + g, JoinStart::Earliest).unwrap();
        for i in 1..=n {
            assert_eq!(e.append(g, 7, i, &payload(g, i)).unwrap().msg_id, i);
        }
    }
    e.close().unwrap();
}

/// Every record of `g` through the engine: `(id, kind, payload)`.
fn read_all(e: &Engine, g: u64) -> Vec<(u64, u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let b = e.read(g, after, 64, 1 << 20).unwrap();
        let before = out.len();
        for r in b.records() {
            out.push((r.header.msg_id, r.header.kind, r.payload().to_vec()));
        }
        if out.len() == before {
            return out;
        }
        after = out.last().unwrap().0;
    }
}

fn segments(dir: &Path, g: u64) -> Vec<(u64, PathBuf)> {
    let d = DataDir::open(dir).unwrap();
    let info = d.inspect().unwrap();
    let gi = info.groups.iter().find(|x| x.id == g).unwrap();
    gi.segments
        .iter()
        .map(|s| (s.0, super::walk::segment_path(dir, g, s.0)))
        .collect()
}

fn flip(path: &Path, at: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[at as usize] ^= 0x5a;
    std::fs::write(path, b).unwrap();
}

/// verify finds damage naming `file`; the plan writes nothing; repair;
/// verify is clean. Returns the lost ids the dump shows as gaps.
fn verify_plan_repair(dir: &Path, g: u64, file: &Path) -> Vec<u64> {
    let mut d = DataDir::open(dir).unwrap();
    let v = d.verify().unwrap();
    assert!(!v.clean(), "damage found");
    assert!(
        v.findings
            .iter()
            .any(|f| f.damage && f.group == Some(g) && f.file.as_deref() == Some(file)),
        "a finding names {}: {:?}",
        file.display(),
        v.findings
    );
    let before = tree(dir);
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(plan.refused.is_none() && !plan.is_empty(), "{plan:?}");
    assert_eq!(tree(dir), before, "planning writes nothing");
    d.repair(plan).unwrap();
    let v = d.verify().unwrap();
    assert!(v.clean(), "{:?}", v.findings);
    let dump = d.records(g, 0, u64::MAX).unwrap();
    assert!(dump.damage.is_empty(), "{:?}", dump.damage);
    dump.records
        .iter()
        .filter(|r| r.shape == super::RecordShape::Gap)
        .map(|r| r.msg_id)
        .collect()
}

/// The engine serves the repaired group: dense ids, the intact records
/// with their payloads, gaps exactly at `gaps`, the next send after them.
fn serves(dir: &Path, g: u64, n: u64, gaps: &[u64]) {
    let e = Engine::open(config(dir)).unwrap();
    let got = read_all(&e, g);
    assert_eq!(got.len() as u64, n);
    for (i, (id, kind, p)) in got.iter().enumerate() {
        assert_eq!(*id, i as u64 + 1, "dense ids");
        if gaps.contains(id) {
            assert_eq!((*kind, p.len()), (record::KIND_GAP, 0), "gap at {id}");
        } else {
            assert_eq!((*kind, p), (0, &payload(g, *id)), "record {id} intact");
        }
    }
    // A gap is not unread (protocol.md 2.1): the member that joined before
    // the damage counts every other record.
    let unread = e.unread(100 + g).into_iter().find(|u| u.group_id == g);
    assert_eq!(
        unread.map(|u| u.unread),
        Some(n - gaps.len() as u64),
        "unread leaves the gaps out"
    );
    // A gap's key (sender 0, client_msg_id 0) answers no send: the next
    // sends get the ids after the head.
    assert_eq!(e.append(g, 0, 0, b"next").unwrap().msg_id, n + 1);
    assert_eq!(
        e.append(g, 0, 0, b"next").unwrap().msg_id,
        n + 1,
        "a retransmit"
    );
    assert_eq!(e.append(g, 9, 1, b"after").unwrap().msg_id, n + 2);
    e.close().unwrap();
}

#[test]
fn bytes_flipped_in_a_sealed_segment_become_gaps_and_every_other_record_stays() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let segs = segments(dir.path(), BIG);
    assert!(segs.len() >= 3, "{segs:?}");
    let (_, path) = &segs[1];
    let len = std::fs::metadata(path).unwrap().len();
    flip(path, len / 2);
    let gaps = verify_plan_repair(dir.path(), BIG, path);
    assert!(!gaps.is_empty() && gaps.len() < 4, "{gaps:?}");
    assert!(gaps[0] > segs[1].0 && gaps[gaps.len() - 1] < segs[2].0 - 1);
    serves(dir.path(), BIG, BIG_RECORDS, &gaps);
}

#[test]
fn bytes_flipped_in_the_active_segment_keep_the_records_after_them() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let segs = segments(dir.path(), BIG);
    let (base, path) = segs.last().unwrap().clone();
    let len = std::fs::metadata(&path).unwrap().len();
    flip(&path, len / 2);
    let gaps = verify_plan_repair(dir.path(), BIG, &path);
    assert!(!gaps.is_empty() && gaps[0] > base && *gaps.last().unwrap() < BIG_RECORDS);
    serves(dir.path(), BIG, BIG_RECORDS, &gaps);
}

#[test]
fn a_missing_sealed_segment_becomes_gaps_for_its_ids() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let segs = segments(dir.path(), BIG);
    std::fs::remove_file(&segs[1].1).unwrap();
    let gaps = verify_plan_repair(dir.path(), BIG, &segs[1].1);
    assert_eq!(gaps, (segs[1].0..segs[2].0).collect::<Vec<_>>());
    serves(dir.path(), BIG, BIG_RECORDS, &gaps);
}

#[test]
fn a_damaged_small_group_is_cut_into_gaps_in_a_segment_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let d = DataDir::open(dir.path()).unwrap();
    let info = d.inspect().unwrap();
    let g = info.groups.iter().find(|x| x.id == SMALL).unwrap();
    assert_eq!(g.kind, "small");
    // Record 3's payload, in a journal file: the records before and after
    // it stay.
    let third = d.records(SMALL, 3, 3).unwrap().records.remove(0);
    let (path, at) = (third.file, third.offset + 50);
    drop(d);
    flip(&path, at);
    let gaps = verify_plan_repair(dir.path(), SMALL, &path);
    assert_eq!(gaps, vec![3]);
    let d = DataDir::open(dir.path()).unwrap();
    let info = d.inspect().unwrap();
    assert_eq!(
        info.groups.iter().find(|x| x.id == SMALL).unwrap().kind,
        "segments"
    );
    drop(d);
    serves(dir.path(), SMALL, SMALL_RECORDS, &gaps);
}

/// A crash after the new segment replaced the old one and before the
/// checkpoint naming it: the old checkpoint's lengths do not match, verify
/// says so, and repair finishes by recording the state.
#[test]
fn a_repair_cut_between_its_segment_and_its_checkpoint_is_finished_by_repair() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let segs = segments(dir.path(), BIG);
    let (_, path) = &segs[1];
    let len = std::fs::metadata(path).unwrap().len();
    flip(path, len / 2);
    let mut d = DataDir::open(dir.path()).unwrap();
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    d.write_segments(plan).unwrap();
    drop(d);
    let mut d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(!v.clean(), "the old checkpoint's length is wrong now");
    assert!(
        v.findings
            .iter()
            .any(|f| f.what.contains("the checkpoint records")),
        "{:?}",
        v.findings
    );
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(
        plan.actions.iter().all(|a| !a.contains("anew")),
        "only the state is recorded: {:?}",
        plan.actions
    );
    d.repair(plan).unwrap();
    assert!(d.verify().unwrap().clean());
    let gaps: Vec<u64> = d
        .records(BIG, 0, u64::MAX)
        .unwrap()
        .records
        .iter()
        .filter(|r| r.shape == super::RecordShape::Gap)
        .map(|r| r.msg_id)
        .collect();
    assert!(!gaps.is_empty());
    drop(d);
    serves(dir.path(), BIG, BIG_RECORDS, &gaps);
}

#[test]
fn deleting_a_group_removes_it_and_its_memberships() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let mut d = DataDir::open(dir.path()).unwrap();
    let plan = d.plan_repair(RepairTarget::DeleteGroup(BIG)).unwrap();
    assert!(plan.actions[0].contains("delete"), "{:?}", plan.actions);
    d.repair(plan).unwrap();
    let info = d.inspect().unwrap();
    assert!(info.groups.iter().all(|g| g.id != BIG));
    drop(d);
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(matches!(e.head(BIG), Err(Error::GroupNotFound { .. })));
    assert_eq!(read_all(&e, SMALL).len() as u64, SMALL_RECORDS);
    e.create_group(BIG).unwrap();
    assert_eq!(e.append(BIG, 7, 1, b"new").unwrap().msg_id, 1);
    e.close().unwrap();
}

#[test]
fn a_directory_a_running_engine_holds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(matches!(
        DataDir::open(dir.path()),
        Err(Error::Locked { .. })
    ));
    e.close().unwrap();
    assert!(DataDir::open(dir.path()).unwrap().verify().unwrap().clean());
}

/// The usual way in: the node found the damage when it loaded the group,
/// answered `GroupDamaged` and recorded the group damaged at its clean
/// shutdown (keeping every journal file). Repair clears it.
#[test]
fn a_group_the_node_recorded_damaged_serves_again_after_repair() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let segs = segments(dir.path(), BIG);
    let (_, path) = segs.last().unwrap().clone();
    let len = std::fs::metadata(&path).unwrap().len();
    flip(&path, len / 2);
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(matches!(
        e.read(BIG, 0, 1000, 1 << 30),
        Err(Error::GroupDamaged { .. })
    ));
    e.close().unwrap();
    let d = DataDir::open(dir.path()).unwrap();
    let info = d.inspect().unwrap();
    assert_eq!(
        info.groups.iter().find(|g| g.id == BIG).unwrap().kind,
        "damaged"
    );
    let v = d.verify().unwrap();
    assert!(v
        .findings
        .iter()
        .any(|f| f.what.contains("the checkpoint records the group damaged")));
    drop(d);
    let gaps = verify_plan_repair(dir.path(), BIG, &path);
    assert!(!gaps.is_empty());
    serves(dir.path(), BIG, BIG_RECORDS, &gaps);
}

/// A crash, then the journal file the checkpoint's replay starts in is
/// lost: the node refuses the directory, `verify` names the file, and
/// `repair` refuses a directory no clean shutdown left (rebuilding the
/// state without the journal is not offered, storage.md section 19).
#[test]
fn a_lost_journal_file_is_found_and_repair_refuses_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(BIG).unwrap();
    for i in 1..=40 {
        e.append(BIG, 7, i, &payload(BIG, i)).unwrap();
    }
    e.checkpoint().unwrap();
    for i in 41..=80 {
        e.append(BIG, 7, i, &payload(BIG, i)).unwrap();
    }
    e.simulate_crash();
    let d = DataDir::open(dir.path()).unwrap();
    let m = d.inspect().unwrap().manifest.unwrap();
    assert!(!m.clean);
    let journal = crate::commit::journal::journal_path(
        &crate::commit::journal::journal_dir(dir.path()),
        m.replay_journal_seq,
    );
    drop(d);
    std::fs::remove_file(&journal).unwrap();
    assert!(
        Engine::open(config(dir.path())).is_err(),
        "the node refuses"
    );

    let d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(
        v.findings
            .iter()
            .any(|f| f.damage && f.file.as_deref() == Some(&*journal)),
        "{:?}",
        v.findings
    );
    let before = tree(dir.path());
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(
        plan.refused
            .as_deref()
            .unwrap()
            .contains("did not shut down cleanly"),
        "{plan:?}"
    );
    drop(d);
    let mut d = DataDir::open(dir.path()).unwrap();
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(d.repair(plan).is_err(), "a refused plan does nothing");
    assert_eq!(tree(dir.path()), before);
}

/// A clean shutdown's directory loses the journal file holding a small
/// group's records (and the journal files after the checkpoint's position
/// are damaged): repair knows the lost ids exactly (the checkpoint names
/// every extent), gives them gap records, moves the replay position past
/// every journal file and pins only what exists; the segmented group loses
/// nothing, and the node opens and serves both.
#[test]
fn a_lost_journal_file_of_a_clean_directory_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let d = DataDir::open(dir.path()).unwrap();
    let info = d.inspect().unwrap();
    let m = info.manifest.unwrap();
    assert!(m.clean);
    let small = info.groups.iter().find(|g| g.id == SMALL).unwrap();
    let lost = super::walk::shared_path(dir.path(), small.extents[0].0);
    drop(d);
    std::fs::remove_file(&lost).unwrap();
    // The checkpoint's replay file, damaged too (its header).
    let replay = crate::commit::journal::journal_path(
        &crate::commit::journal::journal_dir(dir.path()),
        m.replay_journal_seq,
    );
    assert!(replay.exists());
    flip(&replay, 20);

    let gaps = verify_plan_repair(dir.path(), SMALL, &lost);
    assert_eq!(gaps, (1..=SMALL_RECORDS).collect::<Vec<_>>());
    let d = DataDir::open(dir.path()).unwrap();
    let m2 = d.inspect().unwrap().manifest.unwrap();
    assert!(m2.clean && m2.replay_journal_seq > m.replay_journal_seq);
    assert!(m2
        .pinned
        .iter()
        .all(|&p| super::walk::shared_path(dir.path(), p as u32).exists()));
    drop(d);
    serves(dir.path(), SMALL, SMALL_RECORDS, &gaps);
    serves(dir.path(), BIG, BIG_RECORDS, &[]);
}

/// `ctl dump` names what each record is: an edit with its target and new
/// payload, a recall with its target, a recalled message erased by the
/// promotion that copied it (its zeros not shown), the others as messages.
#[test]
fn dump_names_edits_recalls_and_erased_messages() {
    use super::RecordShape;
    use crate::{Change, ChangeRequest};
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let e = Engine::open(config(dir.path())).unwrap();
    let change = |client_msg_id, target, change| ChangeRequest {
        group_id: SMALL,
        sender_id: 7,
        client_msg_id,
        target,
        change,
        admin: false,
    };
    let n = SMALL_RECORDS;
    e.change(&change(100, 2, Change::Edit(b"second, edited")))
        .unwrap();
    e.change(&change(101, 3, Change::Recall)).unwrap();
    e.close().unwrap();

    let d = DataDir::open(dir.path()).unwrap();
    let dump = d.records(SMALL, 0, u64::MAX).unwrap();
    let shapes: Vec<(u64, RecordShape, Vec<u8>)> = dump
        .records
        .iter()
        .map(|r| (r.msg_id, r.shape, r.payload.clone()))
        .collect();
    assert_eq!(shapes.len() as u64, n + 2);
    assert_eq!(
        shapes[n as usize],
        (
            n + 1,
            RecordShape::Edit { target: 2 },
            b"second, edited".to_vec()
        )
    );
    assert_eq!(
        shapes[n as usize + 1],
        (n + 2, RecordShape::Recall { target: 3 }, Vec::new())
    );
    // Message 3 is stored as sent until a rewrite erases it; either way
    // the dump shows it as a message or as erased, never another shape.
    assert!(matches!(
        shapes[2].1,
        RecordShape::Message | RecordShape::Erased
    ));
    assert_eq!(
        (shapes[0].1, shapes[0].2.clone()),
        (RecordShape::Message, payload(SMALL, 1))
    );
}
