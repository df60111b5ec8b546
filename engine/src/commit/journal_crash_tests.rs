//! The journal's crash cases J1–J5 (format-spec/storage.md section 10,
//! "Journal cases"; storage-v2-design.md section 13), and the refusal of a
//! storage-format-1 directory (storage.md section 2, "FORMAT"), each
//! against the real engine with `FaultyVfs` or `PowerCutVfs` where a crash
//! must land at a chosen step.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::commit::journal::{self, EntryKind};
use crate::io::power_cut::{Cut, PowerCutVfs};
use crate::io::FaultyVfs;
use crate::tests::{
    assert_dense_and_exact, batch_of, copy_dir, fill, newest_file, payload, requests, seq_of,
    small_config,
};
use crate::{Config, Engine, Error};

/// J1: a round's frame torn by a power cut before its fdatasync (any
/// subset of its pages persisted) is applied whole or not at all: the
/// group's head is the one before the round or the one after it, never in
/// between, and nothing acknowledged is lost.
#[test]
fn j1_a_torn_round_is_applied_whole_or_not_at_all() {
    let (mut none, mut whole) = (0, 0);
    for seed in 0..16 {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let mut c = small_config(&dir);
        c.cursor_flush_ms = 3_600_000;
        c.retention_check_ms = 3_600_000;
        let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
        fill(&e, &[1], 3);
        // One round of 57 records, one frame over several pages: the power
        // goes after its write, before its fdatasync.
        control.freeze_after(2);
        let msgs: Vec<(u64, u64)> = (4..=60).map(|i| (1, i)).collect();
        let payloads = batch_of(&msgs);
        e.append_batch(&requests(&msgs, &payloads)).unwrap();
        assert!(control.is_frozen(), "the cut came before the round's sync");
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let e = Engine::open(c).unwrap();
        match e.head(1).unwrap() {
            3 => none += 1,
            60 => whole += 1,
            h => panic!("seed {seed}: head {h}: a round was applied in part"),
        }
        assert_dense_and_exact(&e, 1, e.head(1).unwrap());
    }
    assert!(none > 0, "some cut tore the round ({whole} kept it whole)");
}

/// J2: the frame is written but its fdatasync fails (the process dies
/// there, as far as the journal knows): the round was not acknowledged,
/// yet the page cache holds it, so the next open replays it, and a
/// retransmit of its send is answered with the original id.
#[test]
fn j2_a_frame_written_but_not_synced_is_replayed_and_a_retransmit_is_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_config(dir.path());
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    fill(&e, &[1], 3);
    control.fail_syncs.store(true, Ordering::SeqCst);
    let refused = e.append(1, 7, 1_000_004, &payload(1, 4));
    assert!(
        matches!(refused, Err(Error::WritesStopped { .. })),
        "{refused:?}"
    );
    e.simulate_crash();
    let e = Engine::open(c).unwrap();
    assert_dense_and_exact(&e, 1, 4);
    let again = e.append(1, 7, 1_000_004, &payload(1, 4)).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (4, true));
}

/// J3: the frame is durable but applying it fails (its segment write):
/// not acknowledged, replayed at the next open, a retransmit deduplicated.
#[test]
fn j3_a_durable_frame_not_applied_is_replayed_and_a_retransmit_is_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.segment_tail_bytes = 0; // apply writes the segment every round
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    fill(&e, &[1], 3);
    let p = payload(1, 4);
    // The frame: envelope and payload header, an entry header, the record.
    let frame = journal::frame::FRAME_OVERHEAD_BYTES
        + journal::ENTRY_HEADER_BYTES
        + crate::logs::record::RECORD_HEADER_BYTES
        + p.len();
    control
        .write_budget_bytes
        .store(frame as u64, Ordering::SeqCst);
    let refused = e.append(1, 7, 1_000_004, &p);
    assert!(
        matches!(refused, Err(Error::WritesStopped { .. })),
        "{refused:?}"
    );
    assert!(control.file_syncs.load(Ordering::SeqCst) > 0);
    e.simulate_crash();
    let e = Engine::open(c).unwrap();
    assert_dense_and_exact(&e, 1, 4);
    let again = e.append(1, 7, 1_000_004, &p).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (4, true));
}

/// A crashed directory with two groups, 20 records each (one frame per
/// record), and its newest journal file's bytes and frames.
fn crashed_journal(dir: &Path) -> (Config, std::path::PathBuf, Vec<u8>, Vec<journal::FrameInfo>) {
    let mut c = small_config(dir);
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1, 2], 20);
    e.simulate_crash();
    let path = newest_file(&dir.join("journal"), ".tmj");
    let bytes = std::fs::read(&path).unwrap();
    let frames = journal::frames_of_file(&bytes);
    (c, path, bytes, frames)
}

/// J4: a durable frame damaged where nothing else holds a copy (an entry
/// header, a control entry's body) fails the open naming file and offset,
/// and changes nothing; damage to its envelope alone, or to records its
/// groups' segments hold, is restored (tests.rs:
/// `a_damaged_envelope_of_a_durable_frame_is_restored_not_refused`,
/// `a_flipped_byte_mid_journal_is_restored_from_the_segment_copy_and_nothing_is_lost`).
#[test]
fn j4_a_durable_frame_damaged_outside_its_records_refuses_to_open() {
    // Byte offsets in a frame: 64 = the first entry's header, whose kind
    // byte is at 68 and group id at 72.
    for (what, at_in_frame, kind) in [
        ("entry kind", 68, EntryKind::Records),
        ("entry group id", 72, EntryKind::Records),
        ("join body", 64 + 16 + 3, EntryKind::Join),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (c, path, mut bytes, frames) = if kind == EntryKind::Join {
            let mut c = small_config(dir.path());
            c.checkpoint_journal_bytes = 1 << 30;
            let e = Engine::open(c.clone()).unwrap();
            fill(&e, &[1], 5);
            e.join(1, 300, crate::JoinStart::Head).unwrap();
            fill_more(&e, 1, 6..=20);
            e.simulate_crash();
            let path = newest_file(&dir.path().join("journal"), ".tmj");
            let bytes = std::fs::read(&path).unwrap();
            let frames = journal::frames_of_file(&bytes);
            (c, path, bytes, frames)
        } else {
            crashed_journal(dir.path())
        };
        let target = frames
            .iter()
            .filter(|f| f.entries.iter().any(|e| e.2 == kind))
            .nth(if kind == EntryKind::Join { 0 } else { 10 })
            .unwrap();
        assert!(
            target.end < bytes.len(),
            "{what}: later frames prove it durable"
        );
        bytes[target.offset + at_in_frame] ^= 0x02;
        std::fs::write(&path, &bytes).unwrap();
        let err = Engine::open(c).err().expect(what);
        match &err {
            Error::Corrupt {
                path: p,
                group: None,
                offset,
                ..
            } => {
                assert_eq!(p, &path, "{what}: {err}");
                assert_eq!(*offset, target.offset as u64, "{what}: {err}");
            }
            other => panic!("{what}: expected Corrupt, got {other}"),
        }
        assert!(
            err.to_string().contains("not a torn write"),
            "{what}: {err}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{what}: nothing cut");
    }
}

fn fill_more(e: &Engine, group: u64, ids: std::ops::RangeInclusive<u64>) {
    for i in ids {
        let a = e
            .append(group, 7, group * 1_000_000 + i, &payload(group, i))
            .unwrap();
        assert_eq!(a.msg_id, i);
    }
}

/// J5 by file state: the round that rolled to a new file crashed while the
/// new file was being created (missing, a torn header, a header and no
/// frame). The old file was synced first, so every state opens with every
/// earlier round, and a torn header is cut. The spare made ahead of the
/// roll after (an empty file numbered next) is left by every crash once
/// the roll took its own: it is no damage and holds nothing; when the
/// rolled file is missing, so is the spare made after it.
#[test]
fn j5_a_crash_while_rolling_to_a_new_file_loses_nothing_acknowledged_before_it() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    let mut c = small_config(&src);
    c.checkpoint_journal_bytes = 1 << 30;
    c.journal_file_bytes = 4096;
    let e = Engine::open(c.clone()).unwrap();
    let jdir = src.join("journal");
    let i = sends_until_a_roll(&e, &jdir);
    // Round `i` rolled: it is the only frame of the new file.
    e.simulate_crash();
    let rolled = newest_file(&jdir, ".tmj");
    let frames = journal::frames_of_file(&std::fs::read(&rolled).unwrap());
    assert_eq!(frames.len(), 1);
    for (what, len) in [
        ("missing", None),
        ("torn header", Some(20)),
        ("header only", Some(48)),
    ] {
        let dst = base.path().join(what.replace(' ', "-"));
        copy_dir(&src, &dst);
        let file = dst.join("journal").join(rolled.file_name().unwrap());
        let spare = journal::journal_path(&dst.join("journal"), seq_of(&rolled) + 1);
        assert_eq!(
            std::fs::metadata(&spare).unwrap().len(),
            0,
            "{what}: the spare"
        );
        match len {
            None => {
                std::fs::remove_file(&file).unwrap();
                std::fs::remove_file(&spare).unwrap();
            }
            Some(n) => std::fs::OpenOptions::new()
                .write(true)
                .open(&file)
                .unwrap()
                .set_len(n)
                .unwrap(),
        }
        // The segment did not get round `i` either (the crash was before it).
        let mut c = c.clone();
        c.data_dir = dst.clone();
        let e = Engine::open(c.clone()).unwrap_or_else(|err| panic!("{what}: {err}"));
        assert_eq!(e.head(1).unwrap(), i - 1, "{what}");
        assert_dense_and_exact(&e, 1, i - 1);
        assert_eq!(
            e.recovery_report().bytes_cut() > 0,
            len == Some(20),
            "{what}: {:?}",
            e.recovery_report().cuts
        );
        assert_eq!(
            e.append(1, 7, 1_000_000 + i, &payload(1, i))
                .unwrap()
                .msg_id,
            i
        );
        e.close().unwrap();
    }
}

/// The spare journal file made ahead of the next roll (empty, its name
/// durable) is what a crash or a power cut leaves next to the newest
/// file. It holds no frame: recovery opens with every acknowledged send,
/// `ctl verify` finds nothing and `ctl repair` plans nothing; recovery
/// numbers its own file after it, and the empty file left between two
/// files is no gap at the next open either.
#[test]
fn j5_a_spare_file_left_by_a_crash_is_no_damage_to_recovery_verify_or_repair() {
    for seed in 0..4 {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let mut c = small_config(&dir);
        c.checkpoint_journal_bytes = 1 << 30;
        c.journal_file_bytes = 4096;
        c.cursor_flush_ms = 3_600_000;
        c.retention_check_ms = 3_600_000;
        let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
        let jdir = dir.join("journal");
        let i = sends_until_a_roll(&e, &jdir);
        fill_more(&e, 1, i + 1..=i + 3);
        let rolled = seq_of(&newest_file(&jdir, ".tmj"));
        let spare = journal::journal_path(&jdir, rolled + 1);
        // The spare is made on its own thread: wait for its file and for
        // the file layer to go quiet (its directory sync done).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut ops = control.ops();
        while !spare.exists() || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            std::mem::replace(&mut ops, control.ops()) != ops
        } {
            assert!(std::time::Instant::now() < deadline, "the spare is made");
        }
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let len = std::fs::metadata(&spare).map(|m| m.len());
        assert_eq!(
            len.ok(),
            Some(0),
            "seed {seed}: the spare, durable and empty"
        );
        let d = crate::offline::DataDir::open(&dir).unwrap();
        let v = d.verify().unwrap();
        assert!(v.clean(), "seed {seed}: {:?}", v.findings);
        let plan = d
            .plan_repair(crate::offline::RepairTarget::AllDamaged)
            .unwrap();
        assert!(plan.is_empty(), "seed {seed}: {plan:?}");
        drop(d);
        let e = Engine::open(c.clone()).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        assert_eq!(e.head(1).unwrap(), i + 3, "seed {seed}");
        assert_dense_and_exact(&e, 1, i + 3);
        assert_eq!(e.recovery_report().bytes_cut(), 0, "seed {seed}");
        // Recovery's own file comes after the spare, which stays empty
        // between two files until a checkpoint no longer needs either.
        fill_more(&e, 1, i + 4..=i + 5);
        e.simulate_crash();
        // Recovery's own file comes after the spare and holds frames. The
        // checkpoint that ends the open starts a file of its own on the
        // checkpointer's thread, so the new frames may be in that one too:
        // what follows recovery's file is a contiguous list of files of
        // which only the last may be empty (a spare made for the next roll).
        let own = journal::journal_path(&jdir, rolled + 2);
        assert!(
            std::fs::metadata(&own).unwrap().len() > journal::JOURNAL_HEADER_BYTES as u64,
            "seed {seed}: recovery's own file holds the frames"
        );
        let later: Vec<u64> = (rolled + 3..)
            .map(|seq| std::fs::metadata(journal::journal_path(&jdir, seq)).map(|m| m.len()))
            .take_while(|len| len.is_ok())
            .map(|len| len.unwrap_or(0))
            .collect();
        if let Some((_, before_last)) = later.split_last() {
            assert!(
                before_last.iter().all(|&len| len > 0),
                "seed {seed}: an empty journal file before the last: {later:?}"
            );
        }
        let after = rolled + 3 + later.len() as u64;
        assert!(
            !journal::journal_path(&jdir, after + 1).exists(),
            "seed {seed}: journal files are contiguous"
        );
        assert_eq!(std::fs::metadata(&spare).unwrap().len(), 0);
        let e = Engine::open(c).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        assert_dense_and_exact(&e, 1, i + 5);
        e.close().unwrap();
    }
}

/// J5 by power cut: the power goes at every step of a roll (the old file's
/// fdatasync, the new file's creation, header, fdatasync and directory
/// fsync, the frame's write and fdatasync); every append acknowledged
/// before the cut survives, ids stay dense.
#[test]
fn j5_a_power_cut_at_every_step_of_a_roll_keeps_every_acknowledged_append() {
    for step in 0..10 {
        for seed in 0..2 {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("data");
            let vfs = PowerCutVfs::new(root.path());
            let control = vfs.control.clone();
            let mut c = small_config(&dir);
            c.checkpoint_journal_bytes = 1 << 30;
            c.journal_file_bytes = 4096;
            c.cursor_flush_ms = 3_600_000;
            c.retention_check_ms = 3_600_000;
            let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
            e.create_group(1).unwrap();
            let jdir = dir.join("journal");
            let first = newest_file(&jdir, ".tmj");
            let mut acked = 0;
            loop {
                let i = acked + 1;
                let p = payload(1, i);
                let frame = (journal::frame::FRAME_OVERHEAD_BYTES
                    + journal::ENTRY_HEADER_BYTES
                    + crate::logs::record::RECORD_HEADER_BYTES
                    + p.len()) as u64;
                let len = std::fs::metadata(&first).unwrap().len();
                let rolls = len + frame > c.journal_file_bytes;
                if rolls {
                    control.freeze_after(step);
                }
                e.append(1, 7, 1_000_000 + i, &p).unwrap();
                if rolls {
                    break;
                }
                acked = i;
            }
            e.simulate_crash();
            control.cut(Cut::Seeded(seed)).unwrap();
            let e = Engine::open(c).unwrap_or_else(|err| panic!("step {step}: {err}"));
            let head = e.head(1).unwrap();
            assert!(
                head == acked || head == acked + 1,
                "step {step} seed {seed}: head {head}, {acked} acknowledged"
            );
            assert_dense_and_exact(&e, 1, head);
        }
    }
}

/// J5 under `never`: the journal is synced only when a file is created and
/// when the writer rolls. A power cut after a roll and a few frames in the
/// new file may tear the old file's tail only if the roll did not sync it
/// first, and then the new file's frames would make the open refuse
/// (section 11, step 4). With the sync, every cut opens, ids dense.
#[test]
fn j5_under_fsync_never_a_power_cut_after_a_roll_still_opens() {
    for seed in 0..12 {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let mut c = small_config(&dir);
        c.fsync = crate::FsyncPolicy::Never;
        c.checkpoint_journal_bytes = 1 << 30;
        c.journal_file_bytes = 4096;
        c.cursor_flush_ms = 3_600_000;
        c.retention_check_ms = 3_600_000;
        let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
        let jdir = dir.join("journal");
        let i = sends_until_a_roll(&e, &jdir);
        fill_more(&e, 1, i + 1..=i + 3);
        control.freeze();
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let e = Engine::open(c).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        let head = e.head(1).unwrap();
        // The old file was synced whole at the roll.
        assert!(
            head >= i - 1,
            "seed {seed}: head {head}, roll after {}",
            i - 1
        );
        assert_dense_and_exact(&e, 1, head);
    }
}

/// J5 at a checkpoint, under `never`: a checkpoint moves writing to a new
/// journal file, and like a roll it syncs the file it leaves first. A power
/// cut after frames reached the new file, with the newest checkpoint then
/// unreadable, makes recovery replay the old file and the new one from
/// `checkpoint.prev`: without that sync the old file's tail could be torn
/// while a later file holds frames, and the open would be refused.
#[test]
fn j5_a_checkpoint_syncs_the_journal_file_it_leaves() {
    for seed in 0..16 {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let mut c = small_config(&dir);
        c.fsync = crate::FsyncPolicy::Never;
        c.checkpoint_journal_bytes = 1 << 30;
        c.cursor_flush_ms = 3_600_000;
        c.retention_check_ms = 3_600_000;
        let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
        e.create_group(1).unwrap();
        fill_more(&e, 1, 1..=40);
        e.checkpoint().unwrap();
        fill_more(&e, 1, 41..=43);
        control.freeze();
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let newest = crate::state::checkpoint_tests::newest_manifest(&dir);
        let mut bytes = std::fs::read(&newest).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&newest, &bytes).unwrap();
        let e = Engine::open(c).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        let head = e.head(1).unwrap();
        assert!(
            head >= 40,
            "seed {seed}: head {head}: the checkpoint synced 40"
        );
        assert_dense_and_exact(&e, 1, head);
    }
}

/// Creates group 1 and sends to it one round at a time until the journal
/// rolls to a new file; returns the id of the send whose round rolled (the
/// only frame of the new file).
fn sends_until_a_roll(e: &Engine, jdir: &Path) -> u64 {
    e.create_group(1).unwrap();
    let first = newest_file(jdir, ".tmj");
    let mut i = 0;
    while newest_file(jdir, ".tmj") == first {
        i += 1;
        fill_more(e, 1, i..=i);
    }
    i
}

/// The header of a tidemark 0.1 journal file (journal version 2, the
/// former `vectors/storage/journal-header.hex`: seq 1, mark key
/// 0x04030201).
const FORMAT_1_JOURNAL_HEADER: [u8; 32] = [
    0x54, 0x44, 0x4d, 0x4b, 0x4a, 0x52, 0x4e, 0x4c, 0x02, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x7e, 0xee, 0x53, 0x50,
];

/// A directory as tidemark 0.1 left it: `checkpoint` (version 1), a
/// journal file of version 2, `groups/`, `LOCK`; no `FORMAT`.
pub(crate) fn format_1_directory(dir: &Path) {
    let checkpoint = crate::spec_vectors::storage_vector("checkpoint");
    std::fs::write(dir.join("checkpoint"), checkpoint).unwrap();
    std::fs::create_dir_all(dir.join("journal")).unwrap();
    std::fs::write(
        dir.join("journal/00000000000000000001.tmj"),
        FORMAT_1_JOURNAL_HEADER,
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("groups/05c/0000000000000005")).unwrap();
}

/// Every path under `dir` with its bytes (directories as `None`).
pub(crate) fn tree(dir: &Path) -> Vec<(std::path::PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                out.push((p.clone(), None));
                stack.push(p);
            } else {
                out.push((p.clone(), Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_format_1_directory_is_refused_naming_its_versions_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    format_1_directory(dir.path());
    let before = tree(dir.path());
    let err = Engine::open(Config::segmented(dir.path()))
        .err()
        .expect("a format-1 directory is refused");
    match &err {
        Error::UnsupportedFormat {
            found, supported, ..
        } => assert_eq!((*found, *supported), (1, 2)),
        other => panic!("expected UnsupportedFormat, got {other}"),
    }
    let text = err.to_string();
    for needle in [
        "storage format 1",
        "checkpoint version 1",
        "journal version 2",
        "groups/",
        "tidemark 0.1",
    ] {
        assert!(text.contains(needle), "names {needle:?}: {text}");
    }
    assert_eq!(
        tree(dir.path()),
        before,
        "nothing was written: no FORMAT, no LOCK"
    );
    // Any one of the format-1 names is enough.
    for keep in ["checkpoint", "journal", "groups"] {
        let dir = tempfile::tempdir().unwrap();
        format_1_directory(dir.path());
        for name in ["checkpoint", "journal", "groups"] {
            if name != keep {
                let p = dir.path().join(name);
                if p.is_dir() {
                    std::fs::remove_dir_all(p).unwrap();
                } else {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        assert!(
            matches!(
                Engine::open(Config::segmented(dir.path())),
                Err(Error::UnsupportedFormat { found: 1, .. })
            ),
            "{keep} alone"
        );
    }
}

#[test]
fn a_new_directory_gets_format_2_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::segmented(dir.path())).unwrap();
    e.close().unwrap();
    let b = std::fs::read(dir.path().join("FORMAT")).unwrap();
    assert_eq!(crate::state::format::decode(&b), Ok(2));
    Engine::open(Config::segmented(dir.path()))
        .unwrap()
        .close()
        .unwrap();
    // A FORMAT of another version is refused, and stays as it was.
    std::fs::write(
        dir.path().join("FORMAT"),
        crate::state::format::encode(3, 0),
    )
    .unwrap();
    assert!(matches!(
        Engine::open(Config::segmented(dir.path())),
        Err(Error::UnsupportedFormat {
            found: 3,
            supported: 2,
            ..
        })
    ));
}

/// J5, damage after the roll: a rolled file that holds frames had its
/// header synced before its first frame, so a damaged header there is
/// damage to acknowledged data, never a crash while the file was created:
/// the open is refused and nothing is cut (a cut would lose the file's
/// acknowledged sends and hand their ids out again).
#[test]
fn j5_a_damaged_header_of_a_rolled_file_that_holds_frames_refuses_to_open() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("data");
    let mut c = small_config(&dir);
    c.checkpoint_journal_bytes = 1 << 30;
    c.journal_file_bytes = 4096;
    let e = Engine::open(c.clone()).unwrap();
    let jdir = dir.join("journal");
    let i = sends_until_a_roll(&e, &jdir);
    // Ten more acknowledged sends land in the rolled file.
    fill_more(&e, 1, i + 1..=i + 10);
    e.simulate_crash();
    let rolled = newest_file(&jdir, ".tmj");
    let len = std::fs::metadata(&rolled).unwrap().len();
    let mut bytes = std::fs::read(&rolled).unwrap();
    bytes[20] ^= 0x01;
    std::fs::write(&rolled, &bytes).unwrap();
    match Engine::open(c) {
        Err(Error::Corrupt { path, offset, .. }) => {
            assert_eq!(path, rolled);
            assert_eq!(offset, 0);
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(e) => panic!(
            "opened with head {} of {}: the rolled file's frames were cut",
            e.head(1).unwrap(),
            i + 10
        ),
    }
    assert_eq!(
        std::fs::metadata(&rolled).unwrap().len(),
        len,
        "nothing cut"
    );
}
