//! Small groups' records in shared files (journal and cold files) under
//! damage and races (format-spec/storage.md sections 4 "Reads", 9 "Small
//! groups" and "Reclaiming small groups' space"): a lost cold file's
//! number is never given to other records while a checkpoint names it, a
//! read never serves another group's records, a file cut under the node
//! is `GroupDamaged` (never SIGBUS), and a recall that lands while its
//! record is being copied to a cold file is still erased.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::commit::journal;
use crate::io::{FaultyVfs, Vfs};
use crate::logs::cold::{self, ColdWriter};
use crate::tests::{payload, small_config};
use crate::{AppendRequest, Change, ChangeRequest, Config, Engine, Error};

/// Small groups up to 1,500 bytes, journal and cold files of `file_bytes`,
/// checkpoints only on request.
pub(crate) fn config(dir: &Path, file_bytes: u64) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 1500;
    c.journal_file_bytes = file_bytes;
    c.checkpoint_journal_bytes = 1 << 30;
    c
}

/// The cold files of a data directory, by sequence number.
fn cold_files(dir: &Path) -> Vec<(u64, PathBuf)> {
    let mut out: Vec<(u64, PathBuf)> = std::fs::read_dir(journal::journal_dir(dir))
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            Some((cold::parse_file_name(&p)?, p))
        })
        .collect();
    out.sort();
    out
}

/// `n` records of group `g` in one round (one extent), payloads
/// `payload(g, i)`: two groups' records of the same ids have the same
/// lengths.
fn send_round(e: &Engine, g: u64, n: u64) {
    let payloads: Vec<Vec<u8>> = (1..=n).map(|i| payload(g, i)).collect();
    let reqs: Vec<AppendRequest<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| AppendRequest {
            group_id: g,
            sender_id: 1,
            client_msg_id: i as u64 + 1,
            payload: p,
        })
        .collect();
    e.append_batch(&reqs).unwrap();
}

/// Traffic in group 2 (promoted at its second record) rolls the journal;
/// checkpoints move the replay position on, evacuate old journal files
/// into cold files and store manifests naming the moved extents.
fn churn(e: &Engine, from: u64) {
    for i in 0..6u64 {
        e.append(2, 1, from + i, &[b'c'; 1000]).unwrap();
        e.checkpoint().unwrap();
    }
}

fn payloads(e: &Engine, g: u64) -> crate::Result<Vec<Vec<u8>>> {
    let b = e.read(g, 0, 100, 1 << 20)?;
    Ok(b.records().map(|r| r.payload().to_vec()).collect())
}

/// A directory where group 11's five records are in cold file 1, named by
/// the manifest in force, and group 21's five records (same lengths) in
/// the journal; closed.
pub(crate) fn group_11_in_a_cold_file(dir: &Path) {
    let e = Engine::open(config(dir, 4096)).unwrap();
    for g in [2, 11, 21] {
        e.create_group(g).unwrap();
    }
    send_round(&e, 11, 5);
    churn(&e, 100);
    assert_eq!(cold_files(dir).len(), 1, "group 11 was evacuated");
    assert!(!crate::logs::group_log::group_dir(dir, 11).exists());
    send_round(&e, 21, 5);
    e.close().unwrap();
}

/// Expects `got` to be `GroupDamaged` of `group` naming `file`.
fn assert_damage_names(got: crate::Result<Vec<Vec<u8>>>, group: u64, file: &Path) {
    match got {
        Err(Error::GroupDamaged { group: g, reason }) => {
            assert_eq!(g, group, "{reason}");
            let name = file.file_name().unwrap().to_str().unwrap();
            assert!(reason.contains(name), "names {name}: {reason}");
        }
        Err(other) => panic!("group {group}: {other}"),
        Ok(p) => panic!(
            "group {group} served {} records ({:?}...) instead of its damage",
            p.len(),
            p.first()
                .map(|p| String::from_utf8_lossy(&p[..p.len().min(12)]).into_owned())
        ),
    }
}

#[test]
fn a_lost_cold_files_number_is_never_given_to_other_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    group_11_in_a_cold_file(path);
    let (seq, lost) = cold_files(path).pop().unwrap();
    std::fs::remove_file(&lost).unwrap();
    // Group 21's journal file is evacuated after the restart: its records
    // must not land at the place the checkpoint names for group 11.
    let e = Engine::open(config(path, 4096)).unwrap();
    churn(&e, 200);
    assert!(
        cold_files(path).iter().any(|(s, _)| *s > seq),
        "group 21 went to a new cold file: {:?}",
        cold_files(path)
    );
    assert_damage_names(payloads(&e, 11), 11, &lost);
    let want: Vec<Vec<u8>> = (1..=5).map(|i| payload(21, i)).collect();
    assert_eq!(payloads(&e, 21).unwrap(), want);
    e.close().unwrap();
    let e = Engine::open(config(path, 4096)).unwrap();
    assert_damage_names(payloads(&e, 11), 11, &lost);
    assert_eq!(payloads(&e, 21).unwrap(), want);
}

#[test]
fn a_cold_extent_of_another_group_at_the_named_place_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    group_11_in_a_cold_file(path);
    let (seq, cold_path) = cold_files(path).pop().unwrap();
    // Cold file 1 replaced (a restore from another directory, an outside
    // write) by a valid cold file holding group 21's records at the very
    // place the checkpoint names for group 11.
    let e = Engine::open(config(path, 4096)).unwrap();
    let theirs: Vec<u8> = {
        let b = e.read(21, 0, 100, 1 << 20).unwrap();
        b.records().flat_map(|r| r.bytes.to_vec()).collect()
    };
    e.close().unwrap();
    std::fs::remove_file(&cold_path).unwrap();
    let vfs: Arc<dyn Vfs> = Arc::new(crate::io::OsVfs);
    let mut w = ColdWriter::new(vfs, &journal::journal_dir(path), seq, 1 << 20);
    w.append(21, 1, 5, &theirs).unwrap();
    w.sync().unwrap();
    let e = Engine::open(config(path, 4096)).unwrap();
    assert_damage_names(payloads(&e, 11), 11, &cold_path);
    let err = payloads(&e, 11).unwrap_err().to_string();
    assert!(err.contains("group 21"), "says whose extent it is: {err}");
}

/// Groups 3 to 10 hold about 1,000 bytes each and group 11 one record,
/// all in one round of a journal file of 64 KiB: group 11's extent lies
/// past the first page of every file holding it.
fn group_11_past_the_first_page(e: &Engine) {
    for g in 2..=11 {
        e.create_group(g).unwrap();
    }
    let big = vec![b'b'; 1000];
    let mut reqs: Vec<AppendRequest<'_>> = (3..=10)
        .map(|g| AppendRequest {
            group_id: g,
            sender_id: 1,
            client_msg_id: 1,
            payload: &big,
        })
        .collect();
    reqs.push(AppendRequest {
        group_id: 11,
        sender_id: 1,
        client_msg_id: 1,
        payload: b"eleven",
    });
    e.append_batch(&reqs).unwrap();
}

pub(crate) fn cut(path: &Path, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_pinned_journal_file_cut_under_the_node_is_damage_not_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path, 1 << 16)).unwrap();
    group_11_past_the_first_page(&e);
    // The journal rolls: the file holding group 11 is written no more.
    e.checkpoint().unwrap();
    assert_eq!(payloads(&e, 11).unwrap(), [b"eleven".to_vec()]);
    let file = journal::journal_path(&journal::journal_dir(path), 1);
    cut(&file, 40);
    assert_damage_names(payloads(&e, 11), 11, &file);
    // Other groups read on, and a send elsewhere is taken.
    e.append(2, 1, 1, b"still writing").unwrap();
    assert_eq!(payloads(&e, 2).unwrap(), [b"still writing".to_vec()]);
}

#[test]
fn a_cold_file_cut_under_the_node_is_damage_not_sigbus() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path, 1 << 16)).unwrap();
    group_11_past_the_first_page(&e);
    churn(&e, 100);
    let (_, file) = cold_files(path).pop().expect("evacuated");
    assert_eq!(payloads(&e, 11).unwrap(), [b"eleven".to_vec()]);
    cut(&file, 40);
    assert_damage_names(payloads(&e, 11), 11, &file);
    e.append(2, 1, 1000, b"still writing").unwrap();
}

#[test]
fn a_recall_applied_while_its_record_is_copied_to_a_cold_file_is_erased() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let faulty = FaultyVfs::new();
    let e = Arc::new(Engine::open_with_vfs(config(path, 4096), Arc::new(faulty.clone())).unwrap());
    let secret = crate::erasure_tests::marker();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.append(1, 10, 1, b"before").unwrap();
    e.append(1, 10, 2, &secret).unwrap();
    e.append(1, 10, 3, b"after").unwrap();
    // The second checkpoint evacuates the journal file holding them: its
    // copy waits at the cold file's sync, before the install.
    e.append(2, 1, 1, &[b'c'; 1000]).unwrap();
    e.checkpoint().unwrap();
    e.append(2, 1, 2, &[b'c'; 1000]).unwrap();
    *faulty.control.hold_syncs_of.lock() = Some(".tmc".into());
    let ckpt = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while faulty.control.syncs_held.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no copy to a cold file"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    e.change(&ChangeRequest {
        group_id: 1,
        sender_id: 10,
        client_msg_id: 4,
        target: 2,
        change: Change::Recall,
        admin: false,
    })
    .unwrap();
    *faulty.control.hold_syncs_of.lock() = None;
    ckpt.join().unwrap().unwrap();
    churn(&e, 100);
    churn(&e, 200);
    assert_eq!(
        crate::erasure_tests::files_holding(path, &secret),
        Vec::<PathBuf>::new(),
        "the recalled payload left every file"
    );
    let ids: Vec<u64> = e
        .read(1, 0, 10, 1 << 20)
        .unwrap()
        .records()
        .map(|r| r.header.msg_id)
        .collect();
    assert_eq!(ids, [1, 2, 3, 4]);
}

/// The cold-file erasure's own race: a message recalled while the file
/// holding it is being compacted for an earlier recall was listed for that
/// file; the copy holds its payload unerased, so the pass must not take
/// it off the list (it compacts the new file next).
#[test]
fn a_recall_applied_while_a_cold_file_is_compacted_for_another_is_erased() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let faulty = FaultyVfs::new();
    let e = Arc::new(Engine::open_with_vfs(config(path, 4096), Arc::new(faulty.clone())).unwrap());
    let (first, second) = (
        crate::erasure_tests::marker(),
        crate::erasure_tests::marker(),
    );
    assert_ne!(first, second);
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.append(1, 10, 1, &first).unwrap();
    e.append(1, 10, 2, &second).unwrap();
    e.append(1, 10, 3, b"after").unwrap();
    churn(&e, 100);
    let holding = crate::erasure_tests::files_holding(path, &second);
    assert!(
        !holding.is_empty()
            && holding
                .iter()
                .all(|p| p.extension().is_some_and(|x| x == "tmc")),
        "in a cold file only: {holding:?}"
    );
    let recall = |client_msg_id, target| {
        e.change(&ChangeRequest {
            group_id: 1,
            sender_id: 10,
            client_msg_id,
            target,
            change: Change::Recall,
            admin: false,
        })
        .unwrap()
    };
    assert_eq!(
        holding,
        [journal::journal_dir(path).join(cold::file_name(1))]
    );
    recall(4, 1);
    // The next checkpoint's erasure compacts cold file 1 (sealed and
    // synced first): its copy waits at the sync of cold file 2, before
    // the install.
    *faulty.control.hold_syncs_of.lock() = Some(cold::file_name(2));
    let ckpt = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while faulty.control.syncs_held.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "no compaction");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    recall(5, 2);
    *faulty.control.hold_syncs_of.lock() = None;
    ckpt.join().unwrap().unwrap();
    churn(&e, 200);
    churn(&e, 300);
    for secret in [&first, &second] {
        assert_eq!(
            crate::erasure_tests::files_holding(path, secret),
            Vec::<PathBuf>::new(),
            "a recalled payload left every file"
        );
    }
}

/// Under `never`, on a directory inside `root`: group 3 small, with one
/// record durable at a first checkpoint, one written before a second
/// checkpoint's capture and one after it, which that checkpoint's copy
/// (K2) took nevertheless (it waited for group 1's checkpoint lock while
/// the record was written). Returns the engine after that checkpoint.
fn a_checkpoint_copying_a_record_written_after_its_capture(
    dir: &Path,
    vfs: Arc<dyn Vfs>,
) -> (Config, Arc<Engine>) {
    let mut c = config(dir, 1 << 16);
    c.fsync = crate::FsyncPolicy::Never;
    c.cursor_flush_ms = 3_600_000;
    c.retention_check_ms = 3_600_000;
    c.checkpoint_interval_ms = 3_600_000;
    let e = Arc::new(Engine::open_with_vfs(c.clone(), vfs).unwrap());
    e.create_group(1).unwrap();
    e.create_group(3).unwrap();
    e.append(3, 1, 1, b"durable at the first checkpoint")
        .unwrap();
    e.checkpoint().unwrap();
    // Both dirty, group 1 first: the next checkpoint's copy waits for
    // group 1's checkpoint lock, which this thread holds.
    e.append(1, 1, 1, b"first").unwrap();
    e.append(3, 1, 2, b"before the capture").unwrap();
    let files = || {
        journal::list(&crate::io::OsVfs, &journal::journal_dir(dir))
            .unwrap()
            .len()
    };
    let before = files();
    let g1 = e.group(1).unwrap();
    let held = g1.ckpt(&e.shared.ctx.dirty);
    let ckpt = {
        let e = e.clone();
        std::thread::spawn(move || e.checkpoint())
    };
    // The capture rolls the journal.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while files() == before {
        assert!(std::time::Instant::now() < deadline, "no capture");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    e.append(3, 1, 3, b"after the capture").unwrap();
    drop(held);
    ckpt.join().unwrap().unwrap();
    (c, e)
}

/// storage.md crash case S5: under `never`, a checkpoint whose copy (K2)
/// took a small group's extent written after its capture, then a power
/// cut right after the manifest. The manifest must name only journal
/// bytes that survive (K3 syncs the journal from P on): the group reads
/// back, its records from before the capture included.
#[test]
fn a_power_cut_right_after_a_checkpoint_leaves_every_small_group_readable() {
    use crate::io::power_cut::{Cut, PowerCutVfs};
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let vfs = PowerCutVfs::new(root.path());
    let control = vfs.control.clone();
    let (c, e) = a_checkpoint_copying_a_record_written_after_its_capture(&dir, Arc::new(vfs));
    control.freeze();
    Arc::try_unwrap(e)
        .ok()
        .expect("the only handle")
        .simulate_crash();
    control.cut(Cut::DropUnsynced).unwrap();
    let e = Engine::open(c).unwrap();
    let got = payloads(&e, 3).map_err(|e| e.to_string());
    let got = got.expect("group 3 reads back");
    assert_eq!(
        got[..2],
        [
            b"durable at the first checkpoint".to_vec(),
            b"before the capture".to_vec()
        ]
    );
}

/// storage.md crash case S5 as a build without K3's journal sync left it,
/// loaded in the background: the manifest names group 3's record written
/// after its capture, and the power cut took that record's journal
/// frame (the file is cut inside it, a torn tail). The cut of the
/// group's extents past the journal's valid end is made when the group
/// is registered, before anyone sees it: by the loader, or by the
/// request that names it first. Either way the group answers as after a
/// full load: its two earlier records, head 2, and the next send gets
/// id 3 (the lost id is given again, as for any append a power cut
/// loses under `never`).
#[test]
fn a_small_group_past_a_lost_journal_end_is_cut_whoever_registers_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let (c, e) =
        a_checkpoint_copying_a_record_written_after_its_capture(&dir, Arc::new(crate::io::OsVfs));
    Arc::try_unwrap(e)
        .ok()
        .expect("the only handle")
        .simulate_crash();
    // The power cut: the frame of the record written after the capture
    // is lost but for its first bytes.
    let jdir = journal::journal_dir(&dir);
    let (path, frame) = journal::list(&crate::io::OsVfs, &jdir)
        .unwrap()
        .into_iter()
        .filter_map(|(_, p)| {
            let frames = journal::frames_of_file(&std::fs::read(&p).unwrap());
            let last = frames.into_iter().rev().find(|f| {
                f.entries
                    .iter()
                    .any(|&(_, _, kind, g)| kind == journal::EntryKind::Records && g == 3)
            })?;
            Some((p, last.offset))
        })
        .next_back()
        .expect("group 3's records are in the journal");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(frame as u64 + 20)
        .unwrap();
    let expected = {
        let copy = root.path().join("full");
        crate::tests::copy_dir(&dir, &copy);
        let mut c = c.clone();
        c.data_dir = copy;
        let e = Engine::open(c).unwrap();
        let seen = (e.head(3).unwrap(), payloads(&e, 3).unwrap());
        e.simulate_crash();
        seen
    };
    assert_eq!(
        expected,
        (
            2,
            vec![
                b"durable at the first checkpoint".to_vec(),
                b"before the capture".to_vec()
            ]
        ),
        "a full load cuts the group"
    );
    for by_request in [true, false] {
        let copy = root.path().join(format!("background-{by_request}"));
        crate::tests::copy_dir(&dir, &copy);
        let mut c = c.clone();
        c.data_dir = copy.clone();
        c.load_in_background = true;
        crate::state::lazy::hold::hold(&copy);
        let e = Engine::open(c).unwrap();
        let report = e.recovery_report().clone();
        assert!(report.loading_in_background, "{report:?}");
        assert!(report.bytes_cut() > 0, "the torn tail was cut: {report:?}");
        if !by_request {
            crate::state::lazy::hold::release(&copy);
            // The loader registered it.
            e.wait_ready(crate::STATE_TICKET).unwrap();
            assert!(!e.stats().state_loading);
        }
        let got = (
            e.head(3).unwrap(),
            payloads(&e, 3).map_err(|e| e.to_string()),
        );
        assert_eq!(
            (got.0, got.1.expect("group 3 reads back")),
            expected,
            "registered by {}",
            if by_request {
                "a request"
            } else {
                "the loader"
            }
        );
        assert_eq!(e.append(3, 1, 4, b"next").unwrap().msg_id, 3);
        crate::state::lazy::hold::release(&copy);
        e.close().unwrap();
    }
}
