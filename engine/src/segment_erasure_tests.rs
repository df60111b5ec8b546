//! Physical erasure of recalled payloads from large groups' segment files
//! (format-spec/storage.md section 3, "Erasure", and
//! `state/erase_segments.rs`): after the first stored checkpoint following
//! a recall, no segment holds the payload (sealed ones rewritten, the
//! active one rolled first); after the journal bound, no file at all;
//! reads stay dense, the message shown recalled, unread exact, across a
//! crash, a reopen and a power cut at any file operation of the pass.

use std::path::{Path, PathBuf};

use crate::erasure_tests::{files_holding, marker};
use crate::{Change, ChangeRequest, Config, Engine, JoinStart};

pub(crate) fn recall(e: &Engine, group: u64, target: u64, cmid: u64) {
    e.change(&ChangeRequest {
        group_id: group,
        sender_id: 10,
        client_msg_id: cmid,
        target,
        change: Change::Recall,
        admin: false,
    })
    .unwrap();
}

pub(crate) fn config(dir: &Path) -> Config {
    let mut c = crate::tests::small_config(dir);
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 1 << 30;
    c
}

/// What a protocol version 2 reader sees of group 1 (`(id, kind, flags,
/// payload)`) and member 20's unread count there.
pub(crate) type Seen = (Vec<(u64, u8, u8, Vec<u8>)>, u64);

pub(crate) fn seen(e: &Engine) -> Seen {
    let b = e.read(1, 0, 1000, 1 << 20).unwrap();
    let b = e.present(1, b, true);
    let recs = b
        .records()
        .map(|r| {
            (
                r.header.msg_id,
                r.header.kind,
                r.header.flags,
                r.payload().to_vec(),
            )
        })
        .collect();
    let unread = e
        .unread(20)
        .into_iter()
        .find(|u| u.group_id == 1)
        .expect("a member")
        .unread;
    (recs, unread)
}

/// Group 1 (segments): secret `a` in a sealed segment (id 1), secret `b`
/// in the active one (id 13), both recalled (ids 14, 15); group 2 traffic.
pub(crate) fn fill(e: &Engine, a: &[u8], b: &[u8]) {
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    e.append(1, 10, 1, a).unwrap();
    for i in 2..=12u64 {
        e.append(1, 10, i, &[b'p'; 1000]).unwrap();
    }
    e.append(1, 10, 13, b).unwrap();
    recall(e, 1, 1, 14);
    recall(e, 1, 13, 15);
    for i in 0..40u64 {
        e.append(2, 1, i + 10, &crate::tests::payload(2, i))
            .unwrap();
    }
}

fn none() -> Vec<PathBuf> {
    Vec::new()
}

#[test]
fn recalled_payloads_leave_sealed_and_active_segments_then_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let (a, b) = (marker(), marker());
    let e = Engine::open(config(path)).unwrap();
    fill(&e, &a, &b);
    let seg_dir = crate::logs::group_log::group_dir(path, 1);
    let segs = std::fs::read_dir(&seg_dir).unwrap().count();
    assert!(segs >= 2, "a sealed segment and the active one ({segs})");
    let (recs, unread) = seen(&e);
    assert_eq!(recs.len(), 15, "ids dense");
    assert_eq!(recs[0], (1, 0, crate::FLAG_RECALLED, Vec::new()));
    assert_eq!(recs[12], (13, 0, crate::FLAG_RECALLED, Vec::new()));
    assert_eq!(unread, 11);
    e.checkpoint().unwrap(); // writes the tails
                             // The bound for segments: the stored checkpoint's pass.
    assert_eq!(files_holding(&seg_dir, &a), none(), "sealed segment");
    assert_eq!(files_holding(&seg_dir, &b), none(), "active segment");
    // The journal's copies go as for a small group's.
    for i in 0..5 {
        e.checkpoint().unwrap();
        e.append(2, 1, 1000 + i, b"x").unwrap();
    }
    assert_eq!(files_holding(path, &a), none());
    assert_eq!(files_holding(path, &b), none());
    let model = seen(&e);
    assert_eq!(model, (recs, unread));
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(seen(&e), model);
    e.append(1, 10, 99, b"more").unwrap();
    e.close().unwrap();
    let e = Engine::open(config(path)).unwrap();
    let (recs, unread) = seen(&e);
    assert_eq!(recs[..15], model.0[..]);
    assert_eq!(unread, model.1 + 1);
    assert_eq!(files_holding(path, &a), none());
    assert_eq!(files_holding(path, &b), none());
}

/// A crash after the recall and before any checkpoint: the replay applies
/// the recall again and the pass erases both segments' copies.
#[test]
fn a_crash_before_the_pass_still_erases_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let (a, b) = (marker(), marker());
    let e = Engine::open(config(path)).unwrap();
    fill(&e, &a, &b);
    let model = seen(&e);
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(seen(&e), model);
    e.checkpoint().unwrap();
    let seg_dir = crate::logs::group_log::group_dir(path, 1);
    assert_eq!(files_holding(&seg_dir, &a), none());
    assert_eq!(files_holding(&seg_dir, &b), none());
    assert_eq!(seen(&e), model);
}

/// A power cut at every file operation of the checkpoint whose pass rolls
/// the active segment and rewrites the sealed ones (the copies, their
/// syncs, renames and directory syncs, the manifest that stores the erase
/// list): the next open serves everything as before, and the erasure
/// completes from the stored erase list (the recalls' journal entries are
/// before the replay position by then).
#[test]
fn a_power_cut_at_every_file_operation_of_a_segment_erasure_loses_nothing_and_erases_after() {
    use crate::io::power_cut::{Cut, PowerCutVfs};
    use std::sync::Arc;
    let (a, b) = (marker(), marker());
    let run = |cut_at: Option<u64>| -> u64 {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let e = Engine::open_with_vfs(config(&data), Arc::new(vfs.clone())).unwrap();
        fill(&e, &a, &b);
        let model = seen(&e);
        let seg_dir = crate::logs::group_log::group_dir(&data, 1);
        let before = control.ops();
        if let Some(n) = cut_at {
            control.freeze_after(n);
        }
        e.checkpoint().unwrap();
        let used = control.ops() - before;
        if cut_at.is_none() {
            assert_eq!(files_holding(&seg_dir, &a), none());
            assert_eq!(files_holding(&seg_dir, &b), none());
        }
        control.freeze();
        e.simulate_crash();
        control.cut(Cut::DropUnsynced).unwrap();
        let e = Engine::open(config(&data)).unwrap();
        assert_eq!(seen(&e), model, "cut at {cut_at:?} of {used}");
        for i in 0..2 {
            e.checkpoint().unwrap();
            e.append(2, 1, 1000 + i, b"x").unwrap();
        }
        assert_eq!(
            files_holding(&seg_dir, &a),
            none(),
            "erased after a cut at {cut_at:?}"
        );
        assert_eq!(
            files_holding(&seg_dir, &b),
            none(),
            "erased after a cut at {cut_at:?}"
        );
        assert_eq!(seen(&e), model, "after a cut at {cut_at:?}");
        used
    };
    let ops = run(None);
    assert!(ops >= 6, "the erasure is {ops} file operations");
    for n in 1..=ops + 1 {
        run(Some(n));
    }
}
