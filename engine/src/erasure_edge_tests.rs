//! The edge cases of physical erasure (issue 13 item 2;
//! format-spec/storage.md section 16, item 16): a group whose active
//! segment holds a recalled payload and that nobody loads after a restart,
//! a power cut during the cold-file erasure, and a listed cold record that
//! fails its CRC.

use std::path::PathBuf;
use std::sync::Arc;

use crate::erasure_tests::{files_holding, marker};
use crate::group::LogSlot;
use crate::io::power_cut::{Cut, PowerCutVfs};
use crate::segment_erasure_tests::{config, fill, seen};
use crate::Engine;

fn none() -> Vec<PathBuf> {
    Vec::new()
}

/// Whether group 1 is unloaded and lists `id` for erasure.
fn unloaded_and_listed(e: &Engine, id: u64) -> bool {
    let g = e.shared.catalog.read().get(1).cloned().expect("group 1");
    let unloaded = matches!(&*g.log.read(), LogSlot::Unloaded(_));
    unloaded && g.erase_ids().contains(&id)
}

/// A power cut at every file operation of the checkpoint that stores the
/// erase list of group 1 (recalled payloads in a sealed segment and in the
/// active one) and runs its pass; the next open does not touch group 1
/// (no read, no send: it stays unloaded). Where the cut left the recall
/// before the replay position and the active segment not yet rolled, the
/// pending list alone must bring the erasure: the pass after the first
/// stored checkpoint after open has the worker load the group, the next
/// one rolls and rewrites it (storage.md section 16 item 16: the second
/// stored checkpoint after open), and every other file follows within the
/// journal bound (four more).
#[test]
fn an_unloaded_group_nobody_touches_after_a_restart_still_has_its_active_segment_erased() {
    let (a, b) = (marker(), marker());
    let run = |cut_at: Option<u64>| -> (u64, bool) {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let e = Engine::open_with_vfs(config(&data), Arc::new(vfs.clone())).unwrap();
        fill(&e, &a, &b);
        let model = seen(&e);
        let before = control.ops();
        if let Some(n) = cut_at {
            control.freeze_after(n);
        }
        e.checkpoint().unwrap();
        let used = control.ops() - before;
        control.freeze();
        e.simulate_crash();
        control.cut(Cut::DropUnsynced).unwrap();
        let e = Engine::open(config(&data)).unwrap();
        // Message 13 (payload `b`) is in the active segment.
        let pending = unloaded_and_listed(&e, 13);
        let seg_dir = crate::logs::group_log::group_dir(&data, 1);
        e.checkpoint().unwrap();
        e.wait_worker_idle();
        e.checkpoint().unwrap();
        assert_eq!(
            files_holding(&seg_dir, &b),
            none(),
            "active segment erased after a cut at {cut_at:?} (pending: {pending})"
        );
        assert_eq!(files_holding(&seg_dir, &a), none(), "sealed segment");
        for i in 0..4 {
            e.append(2, 1, 1000 + i, &[b'x'; 900]).unwrap();
            e.checkpoint().unwrap();
        }
        assert_eq!(files_holding(&data, &a), none(), "cut at {cut_at:?}");
        assert_eq!(files_holding(&data, &b), none(), "cut at {cut_at:?}");
        // Only now a client reads group 1: nothing lost, shown recalled.
        assert_eq!(seen(&e), model, "after a cut at {cut_at:?}");
        (used, pending)
    };
    let (ops, _) = run(None);
    let mut reached = 0;
    for n in 1..=ops + 1 {
        reached += u32::from(run(Some(n)).1);
    }
    assert!(
        reached > 0,
        "some cut leaves group 1 unloaded with its active segment listed"
    );
}

/// The same state after a clean stop, on a quiet node. The stop's own
/// pass cannot roll group 1's active segment
/// (a directory stands where the next segment would go, so the roll fails:
/// a pass that failed), so the stored list still names message 13 and the
/// segment holds its payload.
/// The open that restores the list takes a checkpoint by itself (a clean
/// open otherwise takes none until something changes), and checkpoints
/// keep coming one `checkpoint_interval_ms` apart until the active segment
/// of group 1, which nobody touches, is erased.
#[test]
fn after_a_clean_stop_a_quiet_node_erases_an_unloaded_groups_active_segment_by_itself() {
    let (a, b) = (marker(), marker());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let e = Engine::open(config(data)).unwrap();
    fill(&e, &a, &b);
    let seg_dir = crate::logs::group_log::group_dir(data, 1);
    let head = e.head(1).unwrap();
    let blocker = seg_dir.join(crate::logs::segment::file_name(head + 1));
    std::fs::create_dir(&blocker).unwrap();
    e.close().unwrap();
    std::fs::remove_dir(&blocker).unwrap();
    assert!(!files_holding(&seg_dir, &b).is_empty(), "not erased yet");
    let mut c = config(data);
    c.checkpoint_interval_ms = 50;
    let e = Engine::open(c).unwrap();
    assert!(unloaded_and_listed(&e, 13), "pending after the stop");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !files_holding(&seg_dir, &b).is_empty() || !files_holding(&seg_dir, &a).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the quiet node never erased group 1's segments"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    e.close().unwrap();
}
