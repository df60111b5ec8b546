//! The edge cases of physical erasure (format-spec/storage.md section 16, item 16): a group whose active
//! segment holds a recalled payload and that nobody loads after a restart,
//! a power cut during the cold-file erasure, and a listed cold record that
//! fails its CRC.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::cold_erasure_tests::churn;
use crate::erasure_tests::{files_holding, marker, shown};
use crate::group::LogSlot;
use crate::io::power_cut::{Cut, PowerControl, PowerCutVfs};
use crate::segment_erasure_tests::{config, fill, recall, seen};
use crate::{Config, Engine};

fn none() -> Vec<PathBuf> {
    Vec::new()
}

/// An engine over `<root>/data` through a [`PowerCutVfs`] of `root`.
fn open_cuttable(root: &Path, config: fn(&Path) -> Config) -> (PathBuf, Arc<PowerControl>, Engine) {
    let data = root.join("data");
    std::fs::create_dir(&data).unwrap();
    let vfs = PowerCutVfs::new(root);
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(config(&data), Arc::new(vfs)).unwrap();
    (data, control, e)
}

/// A power cut now (every unsynced change dropped), then the engine
/// opened again on the real files.
fn cut_and_reopen(
    control: &PowerControl,
    e: Engine,
    data: &Path,
    config: fn(&Path) -> Config,
) -> Engine {
    control.freeze();
    e.simulate_crash();
    control.cut(Cut::DropUnsynced).unwrap();
    Engine::open(config(data)).unwrap()
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
        let (data, control, e) = open_cuttable(root.path(), config);
        fill(&e, &a, &b);
        let model = seen(&e);
        let before = control.ops();
        if let Some(n) = cut_at {
            control.freeze_after(n);
        }
        e.checkpoint().unwrap();
        let used = control.ops() - before;
        let e = cut_and_reopen(&control, e, &data, config);
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

/// Small groups whose records sit in cold files (`cold_erasure_tests`'s
/// setting): group 1's messages 1..=3, the secret at 2.
fn cold_config(dir: &Path) -> Config {
    let mut c = crate::tests::small_config(dir);
    c.small_group_bytes_max = 1500;
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 1 << 30;
    c
}

/// The file group 1's extent list names for message `id`, if the group is
/// small.
fn file_of(e: &Engine, id: u64) -> Option<PathBuf> {
    let g = e.shared.catalog.read().get(1).cloned().expect("group 1");
    let slot = g.log.read();
    let LogSlot::Small(list) = &*slot else {
        return None;
    };
    let piece = list
        .pieces()
        .find(|p| p.first_id <= id && id < p.end_id())?;
    Some(e.shared.ctx.shared_files.path(piece.ext.file()))
}

/// Small group 1 (messages 1..=3, `secret` at 2, member 20) and group
/// 2's traffic, until group 1's records are in a cold file only: that
/// file.
fn secret_in_cold_file(e: &Engine, secret: &[u8]) -> PathBuf {
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 20, crate::JoinStart::Earliest).unwrap();
    e.append(1, 10, 1, b"before").unwrap();
    e.append(1, 10, 2, secret).unwrap();
    e.append(1, 10, 3, b"after").unwrap();
    churn(e, 10);
    let cold = file_of(e, 2).expect("small");
    assert!(cold.extension().is_some_and(|x| x == "tmc"), "{cold:?}");
    cold
}

/// A power cut at every file operation of the checkpoint whose pass
/// erases a small group's recalled message from the cold file holding it
/// (the stored erase list, the sealing of the cold file being written, the
/// compaction's copy, its sync, the directory sync, the install) and of
/// the next one (which stores the moved extent and the shorter list):
/// the next open serves every record of both groups as before (the
/// recalled one shown recalled), the erase list still names the message
/// unless the file its extent points to no longer holds the payload (the
/// list is never shortened before the erased copy is durable and
/// installed), and the erasure completes within the cold-file bound.
#[test]
fn a_power_cut_at_every_file_operation_of_a_cold_file_erasure_loses_nothing_and_erases_after() {
    let secret = marker();
    let run = |cut_at: Option<u64>| -> u64 {
        let root = tempfile::tempdir().unwrap();
        let (data, control, e) = open_cuttable(root.path(), cold_config);
        let cold = secret_in_cold_file(&e, &secret);
        // The only cold file: the one being written, which the pass seals.
        let tmc = std::fs::read_dir(cold.parent().unwrap())
            .unwrap()
            .filter(|d| {
                d.as_ref()
                    .is_ok_and(|d| d.path().extension().is_some_and(|x| x == "tmc"))
            })
            .count();
        assert_eq!(tmc, 1, "one cold file");
        recall(&e, 1, 2, 4);
        let model = (shown(&e, 1), shown(&e, 2));
        assert_eq!(model.0[1], (2, 0, crate::FLAG_RECALLED, Vec::new()));
        let before = control.ops();
        if let Some(n) = cut_at {
            control.freeze_after(n);
        }
        e.checkpoint().unwrap();
        if cut_at.is_none() {
            // The pass compacted the file: the extent points elsewhere.
            let now = file_of(&e, 2).expect("small");
            assert_ne!(now, cold, "compacted");
            assert!(!files_holding(&data, &secret).contains(&now));
        }
        // The checkpoint that stores the moved extent and the shorter list.
        e.checkpoint().unwrap();
        let used = control.ops() - before;
        let e = cut_and_reopen(&control, e, &data, cold_config);
        let at = format!("cut at {cut_at:?} of {used}");
        assert_eq!((shown(&e, 1), shown(&e, 2)), model, "{at}");
        let g = e.shared.catalog.read().get(1).cloned().expect("group 1");
        if !g.erase_ids().contains(&2) {
            let named = file_of(&e, 2).expect("small");
            assert!(
                !files_holding(&data, &secret).contains(&named),
                "{at}: the list was cleared but {named:?} holds the payload"
            );
        }
        churn(&e, 5000);
        assert_eq!(files_holding(&data, &secret), none(), "{at}");
        assert_eq!(shown(&e, 1), model.0, "{at}");
        assert_eq!(shown(&e, 2)[..model.1.len()], model.1[..], "{at}");
        used
    };
    let ops = run(None);
    assert!(ops >= 6, "the erasure is {ops} file operations");
    for n in 1..=ops + 1 {
        run(Some(n));
    }
}

/// A listed cold record that fails its check during the cold-file erasure
/// (message 2, recalled, with a bit flipped in the cold file at `offset`
/// of its record: its CRC fails and no copy can erase it): the group is
/// damaged the node's way, once (STATS `groups_damaged`, reads answer
/// `GroupDamaged` with the reason, the next checkpoint records it and
/// `ctl verify` reports it), and the group leaves the erasure's pending
/// set, also after a restart (no retry at every checkpoint). The other
/// group keeps every record.
fn damaged_listed_cold_record(offset: usize) {
    use std::os::unix::fs::FileExt;
    let secret = marker();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let mut c = cold_config(data);
    // Only the checkpoints this test asks for.
    c.checkpoint_interval_ms = 3_600_000;
    let e = Engine::open(c.clone()).unwrap();
    let cold = secret_in_cold_file(&e, &secret);
    recall(&e, 1, 2, 4);
    let other = shown(&e, 2);
    let bytes = std::fs::read(&cold).unwrap();
    let payload_at = bytes
        .windows(secret.len())
        .position(|w| w == &secret[..])
        .expect("the cold file holds the payload");
    let at = (payload_at - crate::logs::record::RECORD_HEADER_BYTES + offset) as u64;
    let f = std::fs::OpenOptions::new().write(true).open(&cold).unwrap();
    f.write_all_at(&[bytes[at as usize] ^ 0x40], at).unwrap();
    drop(f);
    assert_eq!(e.stats().groups_damaged, 0);
    e.checkpoint().unwrap();
    assert_eq!(e.stats().groups_damaged, 1, "counted once");
    match e.read(1, 0, 10, 1 << 20) {
        Err(crate::Error::GroupDamaged { group: 1, reason }) => {
            assert!(reason.contains("cannot be erased"), "{reason}")
        }
        Err(other) => panic!("group 1 should be damaged: {other}"),
        Ok(_) => panic!("group 1 should be damaged"),
    }
    assert!(!e.shared.ctx.erase_groups.lock().contains(&1), "no retry");
    for _ in 0..3 {
        e.checkpoint().unwrap();
        assert!(!e.shared.ctx.erase_groups.lock().contains(&1), "no retry");
    }
    assert_eq!(e.stats().groups_damaged, 1);
    assert_eq!(shown(&e, 2), other);
    e.close().unwrap();
    // `ctl verify` reports it, from what the checkpoint recorded.
    let v = crate::offline::DataDir::open(data)
        .unwrap()
        .verify()
        .unwrap();
    assert!(
        v.findings
            .iter()
            .any(|f| f.damage && f.group == Some(1) && f.what.contains("cannot be erased")),
        "{:?}",
        v.findings
    );
    // And the node after a restart: still damaged, counted, not retried.
    let e = Engine::open(c).unwrap();
    assert_eq!(e.stats().groups_damaged, 1);
    assert!(matches!(
        e.read(1, 0, 10, 1 << 20),
        Err(crate::Error::GroupDamaged { group: 1, .. })
    ));
    e.checkpoint().unwrap();
    assert!(!e.shared.ctx.erase_groups.lock().contains(&1), "no retry");
    assert_eq!(shown(&e, 2), other);
}

#[test]
fn a_listed_cold_record_that_fails_its_check_damages_its_group_once_and_is_reported() {
    // Byte 15: the top byte of its `msg_id` (the cold writer refuses the
    // run); byte 30: one of its `sender_id` (erasing would have written a
    // valid CRC over it).
    for offset in [15, 30] {
        damaged_listed_cold_record(offset);
    }
}
