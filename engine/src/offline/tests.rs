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

pub(super) fn segments(dir: &Path, g: u64) -> Vec<(u64, PathBuf)> {
    let d = DataDir::open(dir).unwrap();
    let info = d.inspect().unwrap();
    let gi = info.groups.iter().find(|x| x.id == g).unwrap();
    gi.segments
        .iter()
        .map(|s| (s.0, super::walk::segment_path(dir, g, s.0)))
        .collect()
}

pub(super) fn flip(path: &Path, at: u64) {
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

/// The newest journal file (`.tmj`) of `dir` that is not empty (the
/// spare made ahead of the next roll is).
fn newest_journal(dir: &Path) -> PathBuf {
    let jdir = crate::commit::journal::journal_dir(dir);
    crate::commit::journal::list(&crate::io::OsVfs, &jdir)
        .unwrap()
        .into_iter()
        .rev()
        .find(|(_, p)| std::fs::metadata(p).unwrap().len() > 0)
        .unwrap()
        .1
}

/// Where the payload of the first record of `g`'s first Records entry in
/// the journal file at `path` lies (inside the record: its CRC fails).
fn first_record_payload_of(path: &Path, g: u64) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    let frames = crate::commit::journal::frames_of_file(&bytes);
    let (at, ..) = frames
        .iter()
        .flat_map(|f| f.entries.iter())
        .find(|e| e.2 == crate::commit::journal::EntryKind::Records && e.3 == g)
        .copied()
        .unwrap();
    (at + crate::commit::journal::ENTRY_HEADER_BYTES + record::RECORD_HEADER_BYTES + 2) as u64
}

/// A clean shutdown, a restart, acknowledged sends and a crash before any
/// checkpoint: the manifest in force still records a clean shutdown, but
/// journal frames follow it. One flipped bit in the first of them (a small
/// group's record, held nowhere else) makes the node refuse the directory;
/// repair must not take it for a clean one (and drop every frame since the
/// restart, whose ids the next sends would get again): it refuses, saying
/// why, and writes nothing.
#[test]
fn a_clean_flag_followed_by_journal_frames_is_not_trusted_by_repair() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let e = Engine::open(config(dir.path())).unwrap();
    for i in 1..=5 {
        let id = e
            .append(SMALL, 7, 100 + i, &payload(SMALL, 100 + i))
            .unwrap();
        assert_eq!(id.msg_id, SMALL_RECORDS + i);
    }
    e.simulate_crash();
    let d = DataDir::open(dir.path()).unwrap();
    assert!(
        d.inspect().unwrap().manifest.unwrap().clean,
        "the flag is stale"
    );
    drop(d);
    let newest = newest_journal(dir.path());
    flip(&newest, first_record_payload_of(&newest, SMALL));
    assert!(
        Engine::open(config(dir.path())).is_err(),
        "the node refuses"
    );

    let mut d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(
        v.findings
            .iter()
            .any(|f| f.damage && f.file.as_deref() == Some(&*newest)),
        "{:?}",
        v.findings
    );
    let before = tree(dir.path());
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    let why = plan.refused.clone().unwrap_or_default();
    assert!(
        why.contains("frames"),
        "refused, naming the frames: {plan:?}"
    );
    assert!(d.repair(plan).is_err());
    assert_eq!(tree(dir.path()), before, "nothing written");
}

/// A group found damaged during crash recovery: replay skips its Records
/// entries, so its last acknowledged ids exist only in the journal files
/// the node keeps for it. Repair must not lower its head below them: the
/// next send after the repair gets an id above every acknowledged one.
#[test]
fn repair_never_lowers_a_head_below_ids_only_the_journal_holds() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(BIG).unwrap();
    for i in 1..=BIG_RECORDS {
        e.append(BIG, 7, i, &payload(BIG, i)).unwrap();
    }
    e.checkpoint().unwrap();
    let acked = BIG_RECORDS + 3;
    for i in BIG_RECORDS + 1..=acked {
        assert_eq!(e.append(BIG, 7, i, &payload(BIG, i)).unwrap().msg_id, i);
    }
    e.simulate_crash();
    let (_, path) = segments(dir.path(), BIG).pop().unwrap();
    // The first record of the active segment, inside its checkpointed part.
    flip(&path, 64 + 50);
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(
        e.recovery_report()
            .damaged_groups
            .iter()
            .any(|(g, _)| *g == BIG),
        "found damaged by replay"
    );
    e.close().unwrap();

    let mut d = DataDir::open(dir.path()).unwrap();
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(plan.refused.is_none(), "{plan:?}");
    d.repair(plan).unwrap();
    assert!(d.verify().unwrap().clean());
    drop(d);
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(
        e.head(BIG).unwrap() >= acked,
        "head {}",
        e.head(BIG).unwrap()
    );
    let next = e.append(BIG, 9, 1, b"after").unwrap().msg_id;
    assert!(
        next > acked,
        "send after repair got {next}, {acked} was acknowledged"
    );
    let got = read_all(&e, BIG);
    assert!(got
        .iter()
        .filter(|r| r.0 <= acked)
        .all(|(id, kind, p)| *kind == record::KIND_GAP || *p == payload(BIG, *id)));
    e.close().unwrap();
}

/// An empty (48-byte) journal file older than one holding frames, its
/// header damaged: the node refuses the directory (its header was durable
/// before the later file was made), so verify must call it damage, naming
/// the file, and repair must fix it: the file held no frame, so a new
/// header loses nothing.
#[test]
fn a_damaged_header_of_an_empty_journal_file_is_damage_to_node_verify_and_repair() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let e = Engine::open(config(dir.path())).unwrap();
    for i in 1..=3 {
        e.append(SMALL, 7, 100 + i, &payload(SMALL, 100 + i))
            .unwrap();
    }
    e.simulate_crash();
    let d = DataDir::open(dir.path()).unwrap();
    let m = d.inspect().unwrap().manifest.unwrap();
    drop(d);
    let jdir = crate::commit::journal::journal_dir(dir.path());
    let empty = crate::commit::journal::journal_path(&jdir, m.replay_journal_seq);
    assert_eq!(std::fs::metadata(&empty).unwrap().len(), 48);
    assert_ne!(newest_journal(dir.path()), empty);
    flip(&empty, 20);
    assert!(
        Engine::open(config(dir.path())).is_err(),
        "the node refuses"
    );

    let mut d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(
        v.findings
            .iter()
            .any(|f| f.damage && f.file.as_deref() == Some(&*empty) && f.offset == 0),
        "{:?}",
        v.findings
    );
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(plan.refused.is_none() && !plan.is_empty(), "{plan:?}");
    d.repair(plan).unwrap();
    assert!(
        d.verify().unwrap().clean(),
        "{:?}",
        d.verify().unwrap().findings
    );
    drop(d);
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(read_all(&e, SMALL).len() as u64, SMALL_RECORDS + 3);
    assert_eq!(
        e.append(SMALL, 9, 1, b"x").unwrap().msg_id,
        SMALL_RECORDS + 4
    );
    e.close().unwrap();
}

/// A repair cut after the first of two damaged segments was replaced: the
/// second run rebuilds the other one and records both, and the gap records
/// the first run wrote stay quiet (not unread), like the ones it writes.
#[test]
fn a_repair_cut_between_two_of_its_segments_keeps_every_gap_quiet() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let segs = segments(dir.path(), BIG);
    assert!(segs.len() >= 3, "{segs:?}");
    // Two sealed segments.
    for (_, path) in &segs[..2] {
        let len = std::fs::metadata(path).unwrap().len();
        flip(path, len / 2);
    }
    let second = std::fs::read(&segs[1].1).unwrap();
    let mut d = DataDir::open(dir.path()).unwrap();
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    d.write_segments(plan).unwrap();
    drop(d);
    // The crash came before the second segment's rename.
    std::fs::write(&segs[1].1, second).unwrap();
    let gaps = verify_plan_repair(dir.path(), BIG, &segs[1].1);
    assert!(gaps.iter().any(|&g| g < segs[1].0), "{gaps:?}");
    assert!(gaps.iter().any(|&g| g >= segs[1].0), "{gaps:?}");
    serves(dir.path(), BIG, BIG_RECORDS, &gaps);
}

/// The run part both kept manifests name: one flipped bit. No checkpoint
/// is usable; a directory scan cannot see small groups (their records are
/// in journal files), so the node must refuse the directory rather than
/// open without them, naming the part and the offset, and verify must
/// name them too.
#[test]
fn a_damaged_run_part_both_manifests_name_refuses_the_open_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let e = Engine::open(config(dir.path())).unwrap();
    e.append(BIG, 7, 1000, b"one more").unwrap();
    e.close().unwrap();
    let mdir = crate::state::manifest::manifest_dir(dir.path());
    let manifests: Vec<_> = crate::state::manifest::list(&crate::io::OsVfs, &mdir)
        .unwrap()
        .into_iter()
        .filter_map(|(_, p)| {
            crate::state::manifest::load(&crate::io::OsVfs, &p)
                .unwrap()
                .ok()
        })
        .collect();
    assert_eq!(manifests.len(), 2, "two kept manifests");
    let shared = manifests[0]
        .runs
        .iter()
        .find(|r| manifests[1].runs.iter().any(|s| s.run_seq == r.run_seq))
        .expect("a run both name")
        .parts[0]
        .clone();
    let part = dir
        .path()
        .join("state")
        .join(crate::state::run::part_file_name(
            shared.run_seq,
            shared.part,
        ));
    flip(&part, 64 + 20);
    match Engine::open(config(dir.path())) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!((path, offset), (part.clone(), 64));
        }
        Err(other) => panic!("refused, but not naming the part: {other}"),
        Ok(e) => panic!(
            "opened without a checkpoint: {:?} groups",
            e.recovery_report().groups
        ),
    }
    let d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(
        v.findings
            .iter()
            .any(|f| f.damage && f.file.as_deref() == Some(&*part) && f.offset == 64),
        "{:?}",
        v.findings
    );
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(
        plan.refused
            .as_deref()
            .is_some_and(|r| r.contains(&*part.to_string_lossy())),
        "{plan:?}"
    );
}

/// Every manifest deleted while run parts, journal files and group
/// directories remain: not a new directory. The node refuses it and
/// verify reports it.
#[test]
fn lost_manifests_beside_data_files_refuse_the_open_and_fail_verify() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let mdir = crate::state::manifest::manifest_dir(dir.path());
    for (_, p) in crate::state::manifest::list(&crate::io::OsVfs, &mdir).unwrap() {
        std::fs::remove_file(p).unwrap();
    }
    assert!(
        Engine::open(config(dir.path())).is_err(),
        "the node refuses"
    );
    let d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(!v.clean(), "{:?}", v.findings);
}

/// Files no checkpoint names and no journal frame explains: an empty
/// segment file just above a group's head, and the directory of a group
/// that does not exist. verify names them as stray (a note, not damage);
/// the node removes them at open and serves the group as before.
#[test]
fn stray_files_are_noted_by_verify_and_swept_at_open() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let gdir = crate::logs::group_log::group_dir(dir.path(), BIG);
    let stray = gdir.join(crate::logs::segment::file_name(BIG_RECORDS + 1));
    std::fs::write(&stray, b"").unwrap();
    let stray_dir = crate::logs::group_log::group_dir(dir.path(), 77);
    std::fs::create_dir_all(&stray_dir).unwrap();
    std::fs::write(stray_dir.join(crate::logs::segment::file_name(1)), b"").unwrap();
    let d = DataDir::open(dir.path()).unwrap();
    let v = d.verify().unwrap();
    assert!(v.clean(), "{:?}", v.findings);
    for p in [&stray, &stray_dir] {
        assert!(
            v.findings
                .iter()
                .any(|f| !f.damage && f.file.as_deref() == Some(&**p) && f.what.contains("stray")),
            "{} noted: {:?}",
            p.display(),
            v.findings
        );
    }
    drop(d);
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(!stray.exists(), "the empty segment is removed");
    assert!(
        !stray_dir.exists(),
        "the directory of no group is moved out"
    );
    e.close().unwrap();
    serves(dir.path(), BIG, BIG_RECORDS, &[]);
}

/// Every report `verify_with_progress` makes on `dir`.
fn progress_of(dir: &Path) -> (super::Verified, Vec<super::VerifyProgress>) {
    let d = DataDir::open(dir).unwrap();
    let mut seen = Vec::new();
    let v = d.verify_with_progress(&mut |p| seen.push(p)).unwrap();
    (v, seen)
}

/// The bytes verify reads, from what `inspect` lists: every segment's
/// recorded length, every small extent, the journal files from the replay
/// position on.
fn bytes_to_check(dir: &Path) -> u64 {
    let info = DataDir::open(dir).unwrap().inspect().unwrap();
    let replay_from = info.manifest.as_ref().unwrap().replay_journal_seq;
    let groups: u64 = info
        .groups
        .iter()
        .map(|g| {
            g.segments.iter().map(|s| s.1).sum::<u64>()
                + g.extents.iter().map(|e| u64::from(e.2)).sum::<u64>()
        })
        .sum();
    let journal: u64 = info
        .journal_files
        .iter()
        .filter(|f| f.0 >= replay_from)
        .map(|f| f.1)
        .sum();
    groups + journal
}

/// The reports never go back, all name the same total (the bytes the
/// directory's listing names), and the last one reaches it.
fn assert_monotone_to_total(seen: &[super::VerifyProgress], total: u64) {
    assert!(total > 0);
    assert!(seen.len() >= 3, "{seen:?}");
    assert!(seen.iter().all(|p| p.total == total), "{seen:?}");
    assert!(
        seen.windows(2).all(|w| w[0].checked <= w[1].checked),
        "checked goes back: {seen:?}"
    );
    assert!(seen.iter().all(|p| p.checked <= p.total), "{seen:?}");
    assert_eq!(seen.last().unwrap().checked, total, "{seen:?}");
}

#[test]
fn verify_reports_monotone_progress_reaching_the_bytes_it_reads() {
    use super::Reading;
    let dir = tempfile::tempdir().unwrap();
    build(dir.path());
    let (v, seen) = progress_of(dir.path());
    assert!(v.clean(), "{:?}", v.findings);
    assert_monotone_to_total(&seen, bytes_to_check(dir.path()));
    for kind in [Reading::Journal, Reading::Segments, Reading::Extents] {
        assert!(seen.iter().any(|p| p.reading == kind), "{kind:?}: {seen:?}");
    }
    // The big group's unit is its segments' bytes: a report at its start
    // and its end, which differ by them.
    let segs: u64 = DataDir::open(dir.path()).unwrap().inspect().unwrap().groups[0]
        .segments
        .iter()
        .map(|s| s.1)
        .sum();
    let big: Vec<_> = seen
        .iter()
        .filter(|p| p.reading == Reading::Segments)
        .collect();
    assert_eq!(
        big.last().unwrap().checked - big[0].checked,
        segs,
        "{big:?}"
    );

    // Damage (bytes skipped, a segment missing) still ends at the total,
    // never going back.
    let segs = segments(dir.path(), BIG);
    let len = std::fs::metadata(&segs[0].1).unwrap().len();
    flip(&segs[0].1, len / 2);
    std::fs::remove_file(&segs[1].1).unwrap();
    let total = bytes_to_check(dir.path());
    let (v, seen) = progress_of(dir.path());
    assert!(!v.clean());
    assert_monotone_to_total(&seen, total);
}
