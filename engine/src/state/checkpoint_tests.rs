//! Tests of incremental checkpoints in the engine (storage v2 step S4):
//! the reader's part limit reached by a large state, delta size following
//! what changed, checkpoints that run beside rounds, requests and a slow
//! fsync, crashes at every file operation of a checkpoint, and the crash
//! cases K1-K6 of format-spec/storage.md. Helpers shared with other test
//! modules read and write manifests and runs directly.

use std::path::{Path, PathBuf};

use crate::state::manifest::{self, Manifest, RunMeta};
use crate::state::run::{PartReader, RunWriter, RUN_FILE_BYTES_READ_MAX};
use crate::state::Item;

/// The manifest files of a data directory, oldest first.
pub(crate) fn manifests(data_dir: &Path) -> Vec<PathBuf> {
    manifest::list(&crate::io::OsVfs, &manifest::manifest_dir(data_dir))
        .unwrap()
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

pub(crate) fn newest_manifest(data_dir: &Path) -> PathBuf {
    manifests(data_dir).pop().expect("a manifest")
}

pub(crate) fn load_manifest(path: &Path) -> Manifest {
    manifest::decode(&std::fs::read(path).unwrap()).unwrap()
}

/// The items of one run, read from its part files.
pub(crate) fn run_items(data_dir: &Path, run: &RunMeta) -> Vec<Item> {
    let mut out = Vec::new();
    for p in &run.parts {
        let path = data_dir
            .join("state")
            .join(crate::state::run::part_file_name(p.run_seq, p.part));
        let bytes = std::fs::read(path).unwrap();
        for item in PartReader::open(&bytes, RUN_FILE_BYTES_READ_MAX).unwrap() {
            out.push(item.unwrap());
        }
    }
    out
}

/// Stores a new manifest naming one more run, holding `items`, newest.
pub(crate) fn add_run(data_dir: &Path, items: &[Item]) {
    let mut m = load_manifest(&newest_manifest(data_dir));
    let seq = m.next_run_seq;
    let dir = data_dir.join("state");
    let mut w = RunWriter::new(seq, 1 << 20, 0, |part| {
        std::fs::File::create(dir.join(crate::state::run::part_file_name(seq, part)))
    });
    for it in items {
        w.push(it).unwrap();
    }
    let parts = w.finish().unwrap().into_iter().map(|(_, m)| m).collect();
    m.runs.insert(
        0,
        RunMeta {
            run_seq: seq,
            parts,
        },
    );
    m.next_run_seq += 1;
    m.ckpt_seq += 1;
    let mdir = manifest::manifest_dir(data_dir);
    std::fs::write(
        manifest::manifest_path(&mdir, m.ckpt_seq),
        manifest::encode(&m).unwrap(),
    )
    .unwrap();
}

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::io::power_cut::{Cut, PowerCutVfs};
use crate::io::FaultyVfs;
use crate::{Config, Engine, FsyncPolicy, JoinStart};

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.payload_bytes_max = 1024;
    c.segment_bytes_max = 8192;
    c.index_interval_bytes = 512;
    // Checkpoints only when a test asks for one.
    c.checkpoint_journal_bytes = 1 << 30;
    c
}

/// Waits (with a deadline that only catches a hang) for `done`.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "hung waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_state_larger_than_a_run_part_is_stored_in_parts_and_opens_with_every_membership() {
    // The reader's limit made reachable: parts of at most 4 KiB (the same
    // check the writer makes against the 1 GiB reader constant by default).
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.run_file_bytes_max = 4096;
    c.fsync = FsyncPolicy::Never;
    let e = Engine::open(c.clone()).unwrap();
    let mut expected = BTreeMap::new();
    for g in 1..=400u64 {
        e.create_group(g).unwrap();
        for i in 0..3 {
            e.append(g, 1, g * 10 + i, b"hello").unwrap();
        }
        for u in 1..=6u64 {
            e.join(g, u * 1000 + g, JoinStart::Earliest).unwrap();
            let cursor = (g + u) % 4;
            if cursor > 0 {
                e.ack(g, u * 1000 + g, cursor).unwrap();
            }
            expected.insert((g, u * 1000 + g), cursor);
        }
    }
    e.close().unwrap();
    let m = load_manifest(&newest_manifest(dir.path()));
    let parts: Vec<_> = m.runs.iter().flat_map(|r| r.parts.iter()).collect();
    assert!(parts.len() >= 4, "{} parts", parts.len());
    for p in &parts {
        assert!(p.file_len <= 4096, "a part of {} bytes", p.file_len);
    }
    let e = Engine::open(c).unwrap();
    assert!(e.recovery_report().checkpoint_used);
    assert_eq!(e.recovery_report().journal_entries_replayed, 0);
    for (&(g, u), &cursor) in &expected {
        assert_eq!(e.cursor(g, u).unwrap(), cursor, "group {g} user {u}");
    }
    for g in 1..=400u64 {
        assert_eq!(e.members(g).unwrap().len(), 6);
        assert_eq!(e.head(g).unwrap(), 3);
    }
}

#[test]
fn a_checkpoint_writes_what_changed_not_the_population() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.fsync = FsyncPolicy::Never;
    let e = Engine::open(c).unwrap();
    let groups = 10_000u64;
    let tickets: Vec<_> = (1..=groups)
        .map(|g| e.submit_create_group(g).unwrap())
        .collect();
    for t in tickets {
        e.wait_op(t).unwrap();
    }
    for g in 1..=20 {
        e.join(g, 7, JoinStart::Head).unwrap();
    }
    e.checkpoint().unwrap();
    let full = e.stats().checkpoint_bytes_max;
    // Ten groups change: a message each, and one ACK in one of them.
    for g in (1..=10u64).map(|i| i * 997) {
        e.append(g, 1, g, b"x").unwrap();
    }
    e.append(5, 1, 5, b"x").unwrap();
    e.ack(5, 7, 1).unwrap();
    e.checkpoint().unwrap();
    let m = load_manifest(&newest_manifest(dir.path()));
    assert!(m.runs.len() >= 2, "the delta is a run of its own");
    let delta = run_items(dir.path(), &m.runs[0]);
    let groups_in_delta = delta
        .iter()
        .filter(|i| matches!(i, Item::GroupPut(_)))
        .count();
    let rows_in_delta = delta
        .iter()
        .filter(|i| matches!(i, Item::MemberPut { .. }))
        .count();
    assert_eq!(groups_in_delta, 11, "{delta:?}");
    assert_eq!(rows_in_delta, 1);
    assert_eq!(delta.len(), 12);
    let whole = run_items(dir.path(), m.runs.last().unwrap()).len();
    assert!(
        whole >= groups as usize,
        "the first run holds the population"
    );
    assert!(
        e.stats().checkpoint_bytes_max == full,
        "the small checkpoint wrote less than the first"
    );
}

#[test]
fn a_slow_fsync_in_a_checkpoint_holds_up_no_round_read_or_group_creation() {
    // The reproduction: a checkpoint's fsync that takes long made
    // an unrelated read and create_group wait for it. Here the
    // checkpointer is blocked inside the fdatasync of its run part while
    // the rest goes on (ordering, not timing, is asserted).
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Arc::new(Engine::open_with_vfs(config(dir.path()), Arc::new(vfs)).unwrap());
    e.create_group(1).unwrap();
    e.append(1, 1, 1, b"one").unwrap();
    e.checkpoint().unwrap();
    e.append(1, 1, 2, b"two").unwrap();
    *control.hold_syncs_of.lock() = Some("/state/".into());
    let ckpt = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    eventually("the checkpointer to block in its fsync", || {
        control.syncs_held.load(Ordering::SeqCst) >= 1
    });
    let others = {
        let e = e.clone();
        std::thread::spawn(move || {
            let sent = e.append(1, 1, 3, b"three").unwrap();
            let read = e.read(1, 0, 10, 1 << 20).unwrap().count;
            e.create_group(2).unwrap();
            e.append(2, 1, 1, b"other").unwrap();
            (sent.msg_id, read)
        })
    };
    eventually("a round, a read and a create_group", || {
        others.is_finished()
    });
    assert_eq!(others.join().unwrap(), (3, 3));
    assert!(
        control.syncs_held.load(Ordering::SeqCst) >= 1 && !ckpt.is_finished(),
        "all of it while the checkpointer was still blocked"
    );
    *control.hold_syncs_of.lock() = None;
    ckpt.join().unwrap().unwrap();
    let e = Arc::into_inner(e).unwrap();
    e.simulate_crash();
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!((e.head(1).unwrap(), e.head(2).unwrap()), (3, 1));
}

/// What the crash tests check after reopening: heads, every record's
/// payload, members and cursors.
type State = (BTreeMap<u64, Vec<Vec<u8>>>, BTreeMap<(u64, u64), u64>);

fn state_of(e: &Engine) -> State {
    let mut groups = BTreeMap::new();
    let mut cursors = BTreeMap::new();
    let mut ids = e.group_ids();
    ids.sort_unstable();
    for g in ids {
        let b = e.read(g, 0, usize::MAX, usize::MAX).unwrap();
        groups.insert(g, b.records().map(|r| r.payload().to_vec()).collect());
        for u in e.members(g).unwrap() {
            cursors.insert((g, u), e.cursor(g, u).unwrap());
        }
    }
    (groups, cursors)
}

/// Acknowledged work before the checkpoint under test: two checkpoints
/// (so one run and a previous manifest exist), a deletion and a new
/// incarnation of one id, cursors flushed.
fn crash_workload(e: &Engine) {
    for g in 1..=3u64 {
        e.create_group(g).unwrap();
        e.join(g, 10 + g, JoinStart::Earliest).unwrap();
        for i in 0..4 {
            e.append(g, 1, g * 100 + i, format!("g{g}m{i}").as_bytes())
                .unwrap();
        }
    }
    // A group with one record: with small groups on, it stays small, its
    // record in a journal file the next checkpoint evacuates to a cold file.
    e.create_group(4).unwrap();
    e.append(4, 1, 1, b"small").unwrap();
    e.ack(1, 11, 3).unwrap();
    e.checkpoint().unwrap();
    e.delete_group(2).unwrap();
    e.create_group(2).unwrap();
    e.join(2, 99, JoinStart::Head).unwrap();
    e.append(2, 1, 7, b"again").unwrap();
    e.append(3, 1, 8, b"more").unwrap();
    e.ack(3, 13, 5).unwrap();
    e.leave(1, 11).unwrap();
    e.join(1, 11, JoinStart::Head).unwrap();
    e.flush_cursors().unwrap();
}

/// Runs `scenario` over a fresh data directory under a `PowerCutVfs`,
/// first without a cut, then with the power cut before each file operation
/// of its part under test (and one past them). `scenario(open, arm)`:
/// `open()` opens an engine over the layer; `arm()` is called just before
/// the part under test (the operations are counted, and the cut is armed,
/// from there); it returns the engine after that part and the acknowledged
/// state. After the cut, recovery must find that state, and again after a
/// checkpoint and a clean reopen.
fn cut_at_every_operation(
    what: &str,
    small_group_bytes_max: u64,
    scenario: impl Fn(&dyn Fn() -> Engine, &dyn Fn()) -> (Engine, State),
) {
    let config = |dir: &Path| Config {
        small_group_bytes_max,
        ..config(dir)
    };
    let run = |cut_at: Option<u64>| -> u64 {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let open = || Engine::open_with_vfs(config(&data), Arc::new(vfs.clone())).unwrap();
        let before = std::cell::Cell::new(0);
        let arm = || {
            before.set(control.ops());
            if let Some(n) = cut_at {
                control.freeze_after(n);
            }
        };
        let (e, model) = scenario(&open, &arm);
        let used = control.ops() - before.get();
        control.freeze();
        e.simulate_crash();
        control.cut(Cut::DropUnsynced).unwrap();
        let e = Engine::open(config(&data)).unwrap();
        assert_eq!(state_of(&e), model, "{what}: cut at {cut_at:?} of {used}");
        // And it goes on: a checkpoint and a clean reopen keep it.
        e.checkpoint().unwrap();
        e.close().unwrap();
        let e = Engine::open(config(&data)).unwrap();
        assert_eq!(
            state_of(&e),
            model,
            "{what}: after a checkpoint, cut at {cut_at:?}"
        );
        used
    };
    let ops = run(None);
    assert!(ops >= 6, "{what} is {ops} file operations");
    for n in 1..=ops + 1 {
        run(Some(n));
    }
}

#[test]
fn a_crash_at_every_file_operation_of_a_checkpoint_recovers_the_acknowledged_state() {
    // K2-K7 one operation at a time: run part writes and syncs, the
    // directory fsync, the manifest, the deletions, the next journal file.
    cut_at_every_operation("a checkpoint", 0, checkpoint_scenario);
}

/// The scenario of the two tests above and below: the workload, then a
/// checkpoint under test.
fn checkpoint_scenario(open: &dyn Fn() -> Engine, arm: &dyn Fn()) -> (Engine, State) {
    {
        let e = open();
        crash_workload(&e);
        let model = state_of(&e);
        arm();
        e.checkpoint().unwrap();
        (e, model)
    }
}

#[test]
fn with_small_groups_a_crash_at_every_file_operation_of_the_checkpoint_after_an_evacuation_recovers_the_acknowledged_state(
) {
    // The checkpoint after the workload's second one moved group 4's
    // record to a cold file; this one records the cold extent, and a cut
    // anywhere in it (or just after) must find the cold bytes durable.
    cut_at_every_operation("the checkpoint after an evacuation", 120, |open, arm| {
        let e = open();
        crash_workload(&e);
        e.checkpoint().unwrap();
        assert!(e.stats().reclaim_files > 0, "group 4's file was evacuated");
        let model = state_of(&e);
        arm();
        e.checkpoint().unwrap();
        (e, model)
    });
}

#[test]
fn with_small_groups_a_crash_at_every_file_operation_of_a_checkpoint_recovers_the_acknowledged_state(
) {
    // Records of about 50 bytes: a group keeps two in the journal and is
    // promoted by the round that brings its third (crash_workload's groups
    // take four, group 2's new incarnation one): the checkpoint records
    // small groups with extents, promoted ones with segments, and pins the
    // journal files the extents name.
    cut_at_every_operation("a checkpoint, small groups", 120, checkpoint_scenario);
}

#[test]
fn a_power_cut_in_the_first_checkpoint_after_a_crash_loses_nothing_acknowledged() {
    // A crash, then the power goes at every file operation from the
    // reopen (recovery: torn tails cut, a new journal file) through the
    // checkpoint recovery asks for at once (beside the rounds: segment
    // syncs, the run, the manifest, deletions of journal files the new
    // manifest no longer needs). Writes from before the crash that nothing
    // synced (segment appends, whose copies are in the journal) are lost
    // with the power too. The next recovery finds everything acknowledged.
    cut_at_every_operation("recovery and its checkpoint", 0, recovery_scenario);
}

#[test]
fn with_small_groups_a_power_cut_in_the_first_checkpoint_after_a_crash_loses_nothing_acknowledged()
{
    // As above with small groups (see the checkpoint test above): replay
    // rebuilds extents and promotes again, the checkpoint records both.
    cut_at_every_operation(
        "recovery and its checkpoint, small groups",
        120,
        recovery_scenario,
    );
}

/// Acknowledged work after the last checkpoint, a crash, then the reopen
/// and the checkpoint recovery asks for under test.
fn recovery_scenario(open: &dyn Fn() -> Engine, arm: &dyn Fn()) -> (Engine, State) {
    {
        let e = open();
        crash_workload(&e);
        // Acknowledged after the last checkpoint: only the journal has them.
        e.append(1, 1, 500, b"after the checkpoint").unwrap();
        e.create_group(7).unwrap();
        e.join(7, 70, JoinStart::Earliest).unwrap();
        e.append(7, 70, 1, b"new group").unwrap();
        e.ack(7, 70, 1).unwrap();
        e.flush_cursors().unwrap();
        let model = state_of(&e);
        e.simulate_crash();
        arm();
        let e = open();
        eventually("the checkpoint recovery asks for", || {
            e.stats().checkpoints >= 1
        });
        (e, model)
    }
}

#[test]
fn torn_newer_manifests_and_orphan_run_parts_are_ignored_then_removed() {
    // K2 (a run part no manifest names) and K3 (the newest manifest torn):
    // the previous manifest is in force, its journal files exist, and the
    // leftovers go with the next stored checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    crash_workload(&e);
    e.checkpoint().unwrap();
    let model = state_of(&e);
    e.append(3, 1, 9, b"after").unwrap();
    let mut model_after = model.clone();
    model_after.0.get_mut(&3).unwrap().push(b"after".to_vec());
    e.simulate_crash();
    let newest = newest_manifest(dir.path());
    let mut m = load_manifest(&newest);
    let orphan = dir
        .path()
        .join("state")
        .join(crate::state::run::part_file_name(m.next_run_seq + 5, 0));
    std::fs::write(&orphan, b"half a run part").unwrap();
    m.ckpt_seq += 1;
    let torn = manifest::manifest_path(&manifest::manifest_dir(dir.path()), m.ckpt_seq);
    let bytes = manifest::encode(&m).unwrap();
    std::fs::write(&torn, &bytes[..bytes.len() - 9]).unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let report = e.recovery_report().clone();
    assert!(report.checkpoint_used);
    assert!(report.checkpoint_rejected.unwrap().contains(".tmm"));
    assert_eq!(state_of(&e), model_after);
    e.checkpoint().unwrap();
    assert!(!orphan.exists(), "orphan run part removed");
    assert!(!torn.exists(), "torn manifest removed");
    assert_eq!(manifests(dir.path()).len(), 2, "two manifests kept");
    e.close().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(state_of(&e), model_after);
}

#[test]
fn a_failed_sync_in_a_checkpoint_stops_writes_and_stores_no_manifest() {
    // K5: a sync in K3-K6 fails: no manifest names what it did not make
    // durable, writes stop (never retried), the journal keeps everything.
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(config(dir.path()), Arc::new(vfs)).unwrap();
    e.checkpoint().unwrap();
    crash_workload(&e);
    let model = state_of(&e);
    let manifests_before = manifests(dir.path());
    control.fail_syncs.store(true, Ordering::SeqCst);
    assert!(e.checkpoint().is_err());
    assert!(matches!(
        e.accepting_writes(),
        Err(crate::Error::WritesStopped { .. })
    ));
    control.fail_syncs.store(false, Ordering::SeqCst);
    assert_eq!(manifests(dir.path()), manifests_before);
    drop(e);
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(state_of(&e), model);
}

#[test]
fn a_group_deleted_and_created_again_between_checkpoints_shows_nothing_old() {
    // `fresh` masks the old incarnation's rows (design G3).
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(4).unwrap();
    e.join(4, 1, JoinStart::Head).unwrap();
    e.join(4, 2, JoinStart::Head).unwrap();
    e.append(4, 1, 1, b"old").unwrap();
    e.checkpoint().unwrap();
    e.delete_group(4).unwrap();
    e.create_group(4).unwrap();
    e.join(4, 3, JoinStart::Head).unwrap();
    e.checkpoint().unwrap();
    e.close().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(e.members(4).unwrap(), vec![3]);
    assert_eq!(e.head(4).unwrap(), 0);
}

/// K7 deletes the journal files neither kept manifest needs without
/// holding the table of small groups' live bytes: the commit thread takes
/// that lock for every send to a small group (and at every capture), so
/// an unlink that waits for the disk (behind other writers' I/O) held
/// every send. Here the unlink of journal file 1 is held; a send to a
/// small group still completes.
#[test]
fn k7_deletes_journal_files_without_holding_the_small_groups_live_table() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let mut c = crate::tests::small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    c.checkpoint_interval_ms = 3_600_000;
    let faulty = crate::io::FaultyVfs::new();
    let control = faulty.control.clone();
    let e = Arc::new(crate::Engine::open_with_vfs(c, Arc::new(faulty)).unwrap());
    // File 1 holds group creations only: no small group's record pins it.
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    let first = crate::commit::journal::journal_path(&dir.path().join("journal"), 1);
    control.hold_paths_containing(first.file_name().unwrap().to_str().unwrap());
    // File 1 goes once neither kept manifest replays it: after the second
    // checkpoint that starts past it.
    let checkpoints = {
        let e = e.clone();
        std::thread::spawn(move || {
            for _ in 0..3 {
                e.checkpoint().unwrap();
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while control.ops_held.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "K7 never removed file 1");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The checkpointer waits in the unlink of file 1; a send to small
    // group 2 is applied meanwhile (bounded wait, then the hold ends).
    let (done, sent) = std::sync::mpsc::channel();
    let sender = {
        let e = e.clone();
        std::thread::spawn(move || {
            let r = e.append(2, 7, 1, b"sent while K7 unlinks");
            let _ = done.send(r.map(|a| a.msg_id));
        })
    };
    let got = sent.recv_timeout(Duration::from_secs(10));
    control.release_paths();
    sender.join().unwrap();
    checkpoints.join().unwrap();
    assert_eq!(
        got.ok().map(|r| r.unwrap()),
        Some(1),
        "the send waited for the unlink of a journal file"
    );
    assert!(!first.exists(), "file 1 was removed");
}
