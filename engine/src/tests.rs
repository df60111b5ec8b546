//! Engine-level tests through the public API: dense ids, seeks, idempotence,
//! group commit, failures, and crash recovery with torn and damaged files.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::io::FaultyVfs;
use crate::{AppendRequest, Config, Engine, Error, FsyncPolicy};

pub(crate) fn small_config(dir: &Path) -> Config {
    let mut c = Config::segmented(dir);
    c.payload_bytes_max = 1024;
    c.segment_bytes_max = 8192;
    c.index_interval_bytes = 512;
    c.commit_round_bytes_max = 256 << 10;
    c
}

/// A payload of 10..=209 bytes that names its group and index.
pub(crate) fn payload(group: u64, i: u64) -> Vec<u8> {
    let tag = format!("g{group}-m{i};");
    tag.bytes()
        .cycle()
        .take(10 + (i * 37 % 200) as usize)
        .collect()
}

fn read_all(e: &Engine, group: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let b = e.read(group, after, 7, 1 << 20).unwrap();
        for r in b.records() {
            out.push((r.header.msg_id, r.payload().to_vec()));
        }
        if !b.has_more {
            return out;
        }
        after = b.last_id;
    }
}

pub(crate) fn assert_dense_and_exact(e: &Engine, group: u64, count: u64) {
    let all = read_all(e, group);
    assert_eq!(all.len() as u64, count, "group {group}: record count");
    for (i, (id, p)) in all.iter().enumerate() {
        assert_eq!(*id, i as u64 + 1, "group {group}: ids must be dense");
        assert_eq!(p, &payload(group, *id), "group {group} msg {id}: payload");
    }
    assert_eq!(e.head(group).unwrap(), count);
}

/// Copies a data directory (without its lock file).
pub(crate) fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), &to).unwrap();
        }
    }
}

pub(crate) fn fill(e: &Engine, groups: &[u64], per_group: u64) {
    for &g in groups {
        e.create_group(g).unwrap();
    }
    for i in 1..=per_group {
        for &g in groups {
            let a = e.append(g, 7, g * 1_000_000 + i, &payload(g, i)).unwrap();
            assert_eq!(a.msg_id, i);
        }
    }
}

#[test]
fn ids_are_dense_per_group_and_reads_return_what_was_written() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[1, 2, 3], 150);
    for g in [1, 2, 3] {
        assert_dense_and_exact(&e, g, 150);
    }
    e.close().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert!(e.recovery_report().clean_shutdown);
    assert_eq!(e.recovery_report().journal_entries_replayed, 0);
    for g in [1, 2, 3] {
        assert_dense_and_exact(&e, g, 150);
    }
}

#[test]
fn seek_lands_on_the_first_record_above_every_id_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[9], 400);
    // 400 records of ~130 bytes in 8 KiB segments: several segment boundaries.
    let segments = std::fs::read_dir(crate::logs::group_log::group_dir(dir.path(), 9))
        .unwrap()
        .count();
    assert!(segments >= 5, "expected several segments, got {segments}");
    for after in 0..=400u64 {
        for count in [1usize, 3] {
            let b = e.read(9, after, count, usize::MAX).unwrap();
            let ids: Vec<u64> = b.records().map(|r| r.header.msg_id).collect();
            let expected: Vec<u64> = (after + 1..=(after + count as u64).min(400)).collect();
            assert_eq!(ids, expected, "after {after}");
            assert_eq!(b.has_more, after + (count as u64) < 400);
        }
    }
}

#[test]
fn read_limits_bytes_but_always_returns_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[4], 20);
    let one = e.read(4, 0, 100, 1).unwrap();
    assert_eq!(one.count, 1);
    assert!(one.has_more);
    let some = e.read(4, 0, 100, 600).unwrap();
    assert!(some.bytes <= 600 && some.count > 1);
    let sum: usize = some.chunks.iter().map(|c| c.bytes().len()).sum();
    assert_eq!(sum, some.bytes);
    assert_eq!(e.read(4, 20, 10, 1000).unwrap().count, 0);
    assert_eq!(e.read(4, 999, 10, 1000).unwrap().count, 0);
}

/// Bytes of records 1..=n of `group` as `fill` sends them.
fn record_bytes(group: u64, n: u64) -> u64 {
    (1..=n)
        .map(|i| (crate::logs::record::RECORD_HEADER_BYTES + payload(group, i).len()) as u64)
        .sum()
}

#[test]
fn records_waiting_in_a_segment_tail_read_like_written_ones_and_survive_close_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.segment_tail_bytes = 2048;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 40);
    // Part of the active segment is still in memory (the test would not
    // test the mixed reads otherwise).
    let seg = newest_file(&crate::logs::group_log::group_dir(dir.path(), 1), ".seg");
    let on_disk = std::fs::metadata(&seg).unwrap().len();
    let sealed = std::fs::read_dir(crate::logs::group_log::group_dir(dir.path(), 1))
        .unwrap()
        .count() as u64
        - 1;
    assert!(sealed == 0, "the records fit one segment");
    let logical = crate::logs::segment::SEGMENT_HEADER_BYTES as u64 + record_bytes(1, 40);
    assert!(
        on_disk < logical && on_disk > crate::logs::segment::SEGMENT_HEADER_BYTES as u64,
        "file {on_disk} bytes, log {logical}"
    );
    assert_dense_and_exact(&e, 1, 40);
    // Every starting point and page size crosses the file/memory boundary
    // somewhere.
    for after in 0..40 {
        for max in [1, 3, 40] {
            let b = e.read(1, after, max, 1 << 20).unwrap();
            let ids: Vec<u64> = b.records().map(|r| r.header.msg_id).collect();
            let want: Vec<u64> = (after + 1..=(after + max as u64).min(40)).collect();
            assert_eq!(ids, want, "after {after}, max {max}");
            for r in b.records() {
                assert_eq!(r.payload(), payload(1, r.header.msg_id).as_slice());
            }
        }
    }
    // A crash loses the tail; the journal brings it back.
    e.simulate_crash();
    let e = Engine::open(c.clone()).unwrap();
    assert_dense_and_exact(&e, 1, 40);
    assert_eq!(
        e.append(1, 7, 1_000_041, &payload(1, 41)).unwrap().msg_id,
        41
    );
    // A clean close writes it: the file holds the whole log.
    e.close().unwrap();
    let on_disk = std::fs::metadata(&seg).unwrap().len();
    assert_eq!(
        on_disk,
        crate::logs::segment::SEGMENT_HEADER_BYTES as u64 + record_bytes(1, 41)
    );
    let e = Engine::open(c).unwrap();
    assert!(e.recovery_report().clean_shutdown);
    assert_dense_and_exact(&e, 1, 41);
}

#[test]
fn payload_over_the_limit_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    let err = e.append(1, 1, 1, &vec![0u8; 1025]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                len: 1025,
                max: 1024
            }
        ),
        "{err}"
    );
    assert_eq!(e.append(1, 1, 2, &vec![0u8; 1024]).unwrap().msg_id, 1);
    assert!(matches!(
        e.append(77, 1, 1, b"x"),
        Err(Error::GroupNotFound { group: 77 })
    ));
    assert!(matches!(
        e.create_group(1),
        Err(Error::GroupExists { group: 1 })
    ));
}

#[test]
fn retransmit_returns_the_original_id_across_clean_restart_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    e.create_group(5).unwrap();
    let first = e.append(5, 10, 111, b"hello").unwrap();
    e.append(5, 11, 111, b"other sender, same client id")
        .unwrap();
    let again = e.append(5, 10, 111, b"hello").unwrap();
    assert!(again.duplicate);
    assert_eq!(
        (again.msg_id, again.timestamp_ms),
        (first.msg_id, first.timestamp_ms)
    );
    assert_eq!(e.head(5).unwrap(), 2);
    e.close().unwrap();

    let e = Engine::open(small_config(dir.path())).unwrap();
    let after_restart = e.append(5, 10, 111, b"hello").unwrap();
    assert_eq!(after_restart.msg_id, first.msg_id);
    assert!(after_restart.duplicate);
    let third = e.append(5, 10, 112, b"new").unwrap();
    assert_eq!(third.msg_id, 3);
    e.simulate_crash();

    let e = Engine::open(small_config(dir.path())).unwrap();
    assert!(!e.recovery_report().clean_shutdown);
    assert_eq!(e.append(5, 10, 112, b"new").unwrap().msg_id, 3);
    assert_eq!(e.append(5, 10, 111, b"hello").unwrap().msg_id, 1);
    assert_eq!(e.head(5).unwrap(), 3);
}

#[test]
fn dedup_window_keeps_at_least_the_configured_sends_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.dedup_window_sends = 50;
    c.dedup_entries_max = 50;
    let e = Engine::open(c.clone()).unwrap();
    e.create_group(1).unwrap();
    for i in 1..=120 {
        e.append(1, 3, i, &payload(1, i)).unwrap();
    }
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    // The last 50 sends are remembered...
    assert!(e.append(1, 3, 71, b"x").unwrap().duplicate);
    assert_eq!(e.append(1, 3, 120, b"x").unwrap().msg_id, 120);
    // ...older ones beyond the cap are not (a new message).
    let old = e.append(1, 3, 1, b"x").unwrap();
    assert!(!old.duplicate);
    assert_eq!(old.msg_id, 121);
}

#[test]
fn a_round_writing_1000_groups_costs_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut c = small_config(dir.path());
    // Nothing else syncs during the test: no checkpoint (by bytes or by
    // time), no timed cursor flush, no retention pass, however slowly a
    // loaded machine runs it.
    c.checkpoint_journal_bytes = 1 << 30;
    c.checkpoint_interval_ms = 3_600_000;
    c.cursor_flush_ms = 3_600_000;
    c.retention_check_ms = 3_600_000;
    let e = Engine::open_with_vfs(c, Arc::new(vfs)).unwrap();
    let groups: Vec<u64> = (1..=1000).collect();
    let mut last = None;
    for &g in &groups {
        last = Some(e.submit_create_group(g).unwrap());
    }
    e.wait_op(last.unwrap()).unwrap();

    // Round A: one append whose fsync we hold, so the next 1,000 pile up.
    control.hold_syncs.store(true, Ordering::SeqCst);
    let first = e
        .submit(&AppendRequest {
            group_id: 1,
            sender_id: 1,
            client_msg_id: 1,
            payload: b"a",
        })
        .unwrap();
    while control.syncs_held.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let syncs_before = control.syncs();
    let rounds_before = e.stats().rounds;
    let tickets: Vec<_> = groups
        .iter()
        .map(|&g| {
            e.submit(&AppendRequest {
                group_id: g,
                sender_id: 2,
                client_msg_id: g,
                payload: &payload(g, 1),
            })
            .unwrap()
        })
        .collect();
    control.hold_syncs.store(false, Ordering::SeqCst);
    e.wait(first).unwrap();
    for t in tickets {
        e.wait(t).unwrap();
    }
    let stats = e.stats();
    // The held sync (round A) plus exactly one for the round of 1,000 groups.
    assert_eq!(
        control.syncs() - syncs_before,
        2,
        "fsyncs for rounds A and B"
    );
    assert_eq!(stats.rounds - rounds_before, 2);
    assert_eq!(stats.round_records_max, 1000);
    for &g in &groups {
        assert!(e.head(g).unwrap() >= 1);
    }
}

#[test]
fn a_write_back_error_seen_by_the_background_sync_fails_the_next_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut c = small_config(dir.path());
    c.fsync = FsyncPolicy::Never;
    c.checkpoint_journal_bytes = 8 * crate::commit::flusher::STEP_BYTES_MIN;
    let e = Engine::open_with_vfs(c, Arc::new(vfs)).unwrap();
    e.create_group(1).unwrap();
    // The checkpoint after open is done (it syncs, and so does the
    // preparation of the next journal file).
    e.checkpoint().unwrap();
    // The background sync that the first megabyte of journal asks for fails
    // (as a write-back error would); the commit path itself syncs nothing.
    control.fail_syncs.store(true, Ordering::SeqCst);
    let big = vec![7u8; 1000];
    let mut i = 0;
    while control.syncs_failed.load(Ordering::SeqCst) == 0 {
        i += 1;
        e.append(1, 7, i, &big).unwrap();
        assert!(i < 100_000, "no background sync was asked for");
    }
    control.fail_syncs.store(false, Ordering::SeqCst);
    // Its own syncs would now succeed, but the error was reported once, to
    // the background thread: the checkpoint must not claim durability.
    let err = e.checkpoint().unwrap_err();
    assert!(err.to_string().contains("background sync failed"), "{err}");
    assert!(matches!(
        e.accepting_writes(),
        Err(Error::WritesStopped { .. })
    ));
    drop(e);
    // The journal holds everything since the last checkpoint.
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_eq!(e.head(1).unwrap(), i);
}

#[test]
fn listeners_hear_when_writes_stop_not_only_when_rounds_complete() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(small_config(dir.path()), Arc::new(vfs)).unwrap();
    e.create_group(1).unwrap();
    let heard = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let heard = heard.clone();
        e.add_commit_listener(Arc::new(move |_| {
            heard.fetch_add(1, Ordering::SeqCst);
        }));
    }
    control.fail_syncs.store(true, Ordering::SeqCst);
    let ticket = e
        .submit(&AppendRequest {
            group_id: 1,
            sender_id: 7,
            client_msg_id: 1,
            payload: b"x",
        })
        .unwrap();
    assert!(e.wait(ticket).is_err());
    // The failed round tells the listener (right after the waiters): a
    // server parked on it can answer.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while heard.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener never heard that writes stopped"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(e.settled_round(), u64::MAX);
}

#[test]
fn a_failed_fsync_stops_writes_and_reads_go_on_until_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(small_config(dir.path()), Arc::new(vfs)).unwrap();
    fill(&e, &[1], 10);
    control.fail_syncs.store(true, Ordering::SeqCst);
    assert!(matches!(
        e.append(1, 7, 99, b"lost?"),
        Err(Error::WritesStopped { .. })
    ));
    // Never retried: the disk recovering does not bring writes back.
    control.fail_syncs.store(false, Ordering::SeqCst);
    assert!(matches!(
        e.append(1, 7, 100, b"x"),
        Err(Error::WritesStopped { .. })
    ));
    assert_dense_and_exact(&e, 1, 10);
    assert!(e.close().is_err());
    let e = Engine::open(small_config(dir.path())).unwrap();
    let head = e.head(1).unwrap();
    // The failed append's bytes may have reached the journal (outcome unknown
    // to its sender); whatever is there is dense, and a retransmit dedups.
    assert!(head == 10 || head == 11);
    assert_eq!(e.append(1, 7, 99, b"lost?").unwrap().msg_id, 11);
}

/// Waits until the commit thread has met the full disk and refuses new
/// writes with a typed error.
fn wait_until_writes_are_refused(e: &Engine) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while e.accepting_writes().is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the full disk was never noticed"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let refused = e.append(1, 7, 9_999, b"refused").unwrap_err();
    assert!(refused.is_disk_full(), "{refused}");
}

/// Appends message `i` of `group`, retrying while the engine still says the
/// disk is full (it measures again every 200 ms).
fn append_once_space_returns(e: &Engine, group: u64, i: u64) -> u64 {
    loop {
        match e.append(group, 7, group * 1_000_000 + i, &payload(group, i)) {
            Ok(a) => return a.msg_id,
            Err(Error::DiskFull { .. }) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(other) => panic!("{other}"),
        }
    }
}

/// The payloads of messages `(group, i)` as `fill` sends them, and the
/// batch of append requests sending them (one commit round).
pub(crate) fn batch_of(msgs: &[(u64, u64)]) -> Vec<Vec<u8>> {
    msgs.iter().map(|&(g, i)| payload(g, i)).collect()
}

pub(crate) fn requests<'a>(msgs: &[(u64, u64)], payloads: &'a [Vec<u8>]) -> Vec<AppendRequest<'a>> {
    msgs.iter()
        .zip(payloads)
        .map(|(&(group, i), payload)| AppendRequest {
            group_id: group,
            sender_id: 7,
            client_msg_id: group * 1_000_000 + i,
            payload,
        })
        .collect()
}

/// Sends messages `(group, i)` in one batch on another thread.
fn spawn_batch(
    e: &Arc<Engine>,
    msgs: Vec<(u64, u64)>,
) -> std::thread::JoinHandle<crate::Result<Vec<crate::Appended>>> {
    let e = e.clone();
    std::thread::spawn(move || {
        let payloads = batch_of(&msgs);
        e.append_batch(&requests(&msgs, &payloads))
    })
}

#[test]
fn a_full_disk_at_the_journal_write_holds_the_round_until_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Arc::new(Engine::open_with_vfs(small_config(dir.path()), Arc::new(vfs)).unwrap());
    fill(&e, &[1], 3);
    // Writes fail with ENOSPC (the free-space reserve did not catch it).
    control.disk_full.store(true, Ordering::SeqCst);
    let waiting = {
        let e = e.clone();
        std::thread::spawn(move || e.append(1, 7, 1_000_004, &payload(1, 4)))
    };
    // Once the commit thread met the full disk, new sends are refused with a
    // typed error while the round waits.
    wait_until_writes_are_refused(&e);
    assert_dense_and_exact(&e, 1, 3);
    // Space returns: the held round is written, nothing is lost or doubled.
    control.disk_full.store(false, Ordering::SeqCst);
    let a = waiting.join().unwrap().unwrap();
    assert_eq!(a.msg_id, 4);
    assert_eq!(append_once_space_returns(&e, 1, 5), 5);
    drop(Arc::try_unwrap(e).ok().expect("one owner"));
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_dense_and_exact(&e, 1, 5);
}

#[test]
fn a_full_disk_at_a_segment_write_holds_the_round_and_resumes_where_it_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    // No free-space reserve: the held round alone makes sends refused.
    config.disk_free_min_bytes = 0;
    // Each round writes its groups' segments (no buffered tails).
    config.segment_tail_bytes = 0;
    let e = Arc::new(Engine::open_with_vfs(config, Arc::new(vfs)).unwrap());
    fill(&e, &[1, 2, 3], 3);
    let syncs_before = e.stats().journal_syncs;
    // One round for three groups: its journal write and group 1's segment
    // write succeed, then the disk is full (group 2's write fails).
    control.writes_before_full.store(2, Ordering::SeqCst);
    let waiting = spawn_batch(&e, (1..=3).map(|g| (g, 4)).collect());
    wait_until_writes_are_refused(&e);
    // The round reached the journal and its sync (so it is durable) and is
    // held at group 2's segment write. Group 1's went through; group 2's
    // record is readable from memory meanwhile (it is in the journal);
    // group 3 was not reached.
    assert_eq!(e.stats().journal_syncs, syncs_before + 1);
    assert_dense_and_exact(&e, 1, 4);
    assert_dense_and_exact(&e, 2, 4);
    assert_dense_and_exact(&e, 3, 3);
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    let done = waiting.join().unwrap().unwrap();
    assert_eq!(done.iter().map(|a| a.msg_id).collect::<Vec<_>>(), [4, 4, 4]);
    for g in 1..=3 {
        assert_dense_and_exact(&e, g, 4);
        assert_eq!(append_once_space_returns(&e, g, 5), 5);
    }
    drop(Arc::try_unwrap(e).ok().expect("one owner"));
    let e = Engine::open(small_config(dir.path())).unwrap();
    for g in 1..=3 {
        assert_dense_and_exact(&e, g, 5);
    }
}

#[test]
fn a_full_disk_between_two_segments_of_one_write_resumes_without_doubling() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Arc::new(Engine::open_with_vfs(small_config(dir.path()), Arc::new(vfs)).unwrap());
    fill(&e, &[1], 1);
    // 80 records (about 12 KiB) cross the 8 KiB segment size: the first
    // part is written, then the new segment's header write finds the disk
    // full.
    control.writes_before_full.store(2, Ordering::SeqCst);
    let waiting = spawn_batch(&e, (2..=81).map(|i| (1, i)).collect());
    wait_until_writes_are_refused(&e);
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    let done = waiting.join().unwrap().unwrap();
    assert_eq!(done.last().map(|a| a.msg_id), Some(81));
    assert_dense_and_exact(&e, 1, 81);
    drop(Arc::try_unwrap(e).ok().expect("one owner"));
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_dense_and_exact(&e, 1, 81);
}

#[test]
fn cursors_a_full_disk_kept_out_of_the_journal_are_written_at_the_next_flush() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.cursor_flush_ms = 10;
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    fill(&e, &[1], 5);
    e.join(1, 42, crate::JoinStart::Earliest).unwrap();
    control.writes_before_full.store(0, Ordering::SeqCst);
    e.ack(1, 42, 3).unwrap();
    // The timer's cursor flush finds the disk full: the cursor stays in
    // memory and writes do not stop.
    while control.writes_refused.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let stopped = matches!(e.accepting_writes(), Err(Error::WritesStopped { .. }));
    assert!(
        !stopped,
        "a cursor flush the disk stopped must not stop writes"
    );
    assert_eq!(e.unread(42)[0].cursor, 3);
    // Space returns; the next flush writes what the full disk kept out
    // (nothing moved since, so nothing is dirty any more).
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    e.flush_cursors().unwrap();
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_eq!(e.unread(42)[0].cursor, 3);
}

/// A cursor frame held back by a full disk is written as it was built, and
/// the cursors moved since go into a frame of their own: every frame's
/// entries stay in group id order (storage.md section 5), whichever groups
/// moved in between.
#[test]
fn cursors_held_by_a_full_disk_and_moved_since_go_in_frames_sorted_by_group() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.cursor_flush_ms = 10;
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    fill(&e, &[1, 2], 5);
    e.join(1, 42, crate::JoinStart::Earliest).unwrap();
    e.join(2, 42, crate::JoinStart::Earliest).unwrap();
    control.writes_before_full.store(0, Ordering::SeqCst);
    e.ack(2, 42, 3).unwrap();
    // The timer's flush finds the disk full and holds its frame (group 2).
    while control.writes_refused.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    e.ack(1, 42, 4).unwrap();
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    e.flush_cursors().unwrap();
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    let frames = crate::commit::journal::frames_of_file(&std::fs::read(journal).unwrap());
    let cursor_frames: Vec<Vec<u64>> = frames
        .iter()
        .map(|f| {
            f.entries
                .iter()
                .filter(|en| en.2 == crate::commit::journal::EntryKind::Cursors)
                .map(|en| en.3)
                .collect::<Vec<u64>>()
        })
        .filter(|groups| !groups.is_empty())
        .collect();
    assert_eq!(cursor_frames, vec![vec![2], vec![1]]);
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    let cursors: Vec<(u64, u64)> = e
        .unread(42)
        .iter()
        .map(|u| (u.group_id, u.cursor))
        .collect();
    assert_eq!(cursors, vec![(1, 4), (2, 3)]);
}

#[test]
fn cursors_a_checkpoint_put_off_by_a_full_disk_stay_dirty_for_the_next_flush() {
    // The checkpoint's membership snapshot cleared every
    // dirty bit before its files were written; when the disk was full the
    // checkpoint was put off and `flush_cursors` then found nothing to write.
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.segment_tail_bytes = 0; // the checkpoint has no tails to write first
    config.cursor_flush_ms = 3_600_000; // no timer flush: only the explicit one
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    e.checkpoint().unwrap();
    fill(&e, &[1], 5);
    e.join(1, 42, crate::JoinStart::Earliest).unwrap();
    e.ack(1, 42, 3).unwrap();
    let checkpoints = e.stats().checkpoints;
    // The delta run finds the disk full: the checkpoint (whose capture
    // already read cursor 3) is put off.
    control.writes_before_full.store(1, Ordering::SeqCst);
    e.checkpoint().unwrap();
    assert!(control.writes_refused.load(Ordering::SeqCst) > 0);
    assert_eq!(
        e.stats().checkpoints,
        checkpoints,
        "the checkpoint was put off"
    );
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    e.flush_cursors().unwrap();
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_eq!(
        e.unread(42)[0].cursor,
        3,
        "flush_cursors returned Ok, so the ACK is durable"
    );
}

#[test]
fn deleting_a_group_keeps_the_held_back_cursor_entries_of_other_groups() {
    // Same rule as item 2: a timer flush that met a full disk keeps its
    // entries (the dirty bits are already cleared); a group deletion applied
    // before the next flush used to drop all of them, not only its own.
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.cursor_flush_ms = 10;
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    fill(&e, &[1, 2], 5);
    e.join(1, 42, crate::JoinStart::Earliest).unwrap();
    e.join(2, 42, crate::JoinStart::Earliest).unwrap();
    control.writes_before_full.store(0, Ordering::SeqCst);
    e.ack(1, 42, 2).unwrap();
    e.ack(2, 42, 3).unwrap();
    while control.writes_refused.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    // The deletion's round is held by the full disk (so no timer flush runs
    // before it); once space returns it is written and applied.
    let ticket = e.submit_delete_group(1).unwrap();
    while !e.shared.held_for_space.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    e.wait_op(ticket).unwrap();
    e.flush_cursors().unwrap();
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    let unread = e.unread(42);
    assert_eq!(unread.len(), 1);
    assert_eq!((unread[0].group_id, unread[0].cursor), (2, 3));
}

#[test]
fn a_held_back_cursor_entry_never_lands_after_a_later_join_of_the_same_user() {
    // A timer flush meets a full disk and keeps the cursor entry (3) of
    // user 42's membership; space returns; 42 leaves and joins again at
    // Earliest before the next timer flush. The held entry must reach the
    // journal before the leave, or replay raises the new cursor to 3 and
    // messages 1..=3 are skipped after a crash.
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.cursor_flush_ms = 1500;
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    fill(&e, &[1], 5);
    e.join(1, 42, crate::JoinStart::Earliest).unwrap();
    e.ack(1, 42, 3).unwrap();
    control.writes_before_full.store(0, Ordering::SeqCst);
    while control.writes_refused.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    // Until a write succeeds again the engine may still answer DiskFull
    // (it measured a full disk): both requests retry until it does.
    retry_while_disk_full(|| e.leave(1, 42));
    assert_eq!(
        retry_while_disk_full(|| e.join(1, 42, crate::JoinStart::Earliest)),
        0
    );
    // The next flush writes whatever is still held.
    e.flush_cursors().unwrap();
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_eq!(e.unread(42)[0].cursor, 0, "the new membership's cursor");
}

/// Runs `op` until it answers something other than `DiskFull`.
fn retry_while_disk_full<T>(mut op: impl FnMut() -> crate::Result<T>) -> T {
    loop {
        match op() {
            Ok(v) => return v,
            Err(Error::DiskFull { .. }) => std::thread::sleep(std::time::Duration::from_millis(5)),
            Err(other) => panic!("{other}"),
        }
    }
}

/// The oldest msg_id of `group` still stored.
fn floor_of(e: &Engine, group: u64) -> u64 {
    match e.read(group, 0, 7, 1 << 10) {
        Ok(b) => b.records().next().map_or(0, |r| r.header.msg_id),
        Err(Error::BelowRetentionFloor { earliest, .. }) => earliest,
        Err(other) => panic!("{other}"),
    }
}

#[test]
fn a_checkpoint_that_finds_the_disk_full_changes_nothing_and_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.segment_tail_bytes = 0; // the checkpoint has no tails to write first
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    e.checkpoint().unwrap();
    fill(&e, &[1], 200);
    e.set_retention(
        1,
        crate::Retention {
            max_bytes: 10_000,
            ..Default::default()
        },
    )
    .unwrap();
    let manifests_before = crate::state::checkpoint_tests::manifests(dir.path());
    let seg_files = || {
        std::fs::read_dir(crate::logs::group_log::group_dir(dir.path(), 1))
            .unwrap()
            .count()
    };
    let segs_before = seg_files();
    // The delta run's first write goes through, then the disk is full: the
    // checkpoint is put off (retention already dropped segments from the
    // log in memory; their files stay until a later checkpoint).
    control.writes_before_full.store(1, Ordering::SeqCst);
    e.checkpoint().unwrap();
    assert_eq!(
        crate::state::checkpoint_tests::manifests(dir.path()),
        manifests_before
    );
    assert_eq!(
        seg_files(),
        segs_before,
        "no file named by a kept manifest goes"
    );
    let stopped = matches!(e.accepting_writes(), Err(Error::WritesStopped { .. }));
    assert!(
        !stopped,
        "a checkpoint the disk stopped must not stop writes"
    );
    control.writes_before_full.store(u64::MAX, Ordering::SeqCst);
    assert_eq!(append_once_space_returns(&e, 1, 201), 201);
    e.checkpoint().unwrap();
    let floor = floor_of(&e, 1);
    assert!(
        floor > 150,
        "retention applied once space returned: {floor}"
    );
    // One more: the dropped segments' files go (D6).
    e.checkpoint().unwrap();
    assert!(seg_files() < segs_before);
    drop(e);
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_eq!(floor_of(&e, 1), floor);
    assert_eq!(e.head(1).unwrap(), 201);
}

#[test]
fn a_crash_while_a_round_is_held_by_a_full_disk_loses_nothing_it_journaled() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut config = small_config(dir.path());
    config.segment_tail_bytes = 0; // each round writes its segments
    let e = Engine::open_with_vfs(config, Arc::new(vfs)).unwrap();
    fill(&e, &[1, 2], 3);
    // The journal write goes through, both segment writes find the disk full.
    control.writes_before_full.store(1, Ordering::SeqCst);
    let msgs = [(1, 4), (2, 4)];
    let payloads = batch_of(&msgs);
    let tickets = e.submit_batch(&requests(&msgs, &payloads)).unwrap();
    wait_until_writes_are_refused(&e);
    assert!(
        e.poll(&tickets[0]).is_none(),
        "the round is held, not answered"
    );
    // The power goes while the round waits; its sender never got an answer,
    // but the round is in the synced journal.
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    for g in 1..=2 {
        assert_dense_and_exact(&e, g, 4);
    }
}

#[test]
fn many_groups_stay_within_the_open_segment_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.open_segments_max = 16;
    let e = Engine::open(c.clone()).unwrap();
    let groups: Vec<u64> = (100..400).collect();
    fill(&e, &groups, 3);
    assert!(e.stats().open_segments <= 16);
    for &g in &groups {
        assert_dense_and_exact(&e, g, 3);
    }
    assert!(e.stats().open_segments <= 16);
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    assert_eq!(e.stats().groups, 300);
    // Reopening from the checkpoint opened no group log.
    assert!(e.stats().open_segments <= 1, "{}", e.stats().open_segments);
}

#[test]
fn delete_group_removes_its_files_and_survives_restart() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[1, 2], 30);
    e.delete_group(1).unwrap();
    assert!(!crate::logs::group_log::group_dir(dir.path(), 1).exists());
    assert!(matches!(
        e.append(1, 1, 1, b"x"),
        Err(Error::GroupNotFound { .. })
    ));
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert!(matches!(e.head(1), Err(Error::GroupNotFound { .. })));
    assert_dense_and_exact(&e, 2, 30);
    // The id can be used again, starting from 1.
    e.create_group(1).unwrap();
    assert_eq!(e.append(1, 1, 1, b"x").unwrap().msg_id, 1);
}

#[test]
fn concurrent_appenders_get_dense_ids_in_assignment_order() {
    let dir = tempfile::tempdir().unwrap();
    let e = Arc::new(Engine::open(small_config(dir.path())).unwrap());
    for g in 1..=4 {
        e.create_group(g).unwrap();
    }
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                let mut ids = Vec::new();
                for i in 0..200u64 {
                    let g = 1 + (i + t) % 4;
                    ids.push((g, e.append(g, t, i, &[t as u8; 16]).unwrap().msg_id));
                }
                ids
            })
        })
        .collect();
    let mut per_group: Vec<Vec<u64>> = vec![Vec::new(); 5];
    for t in threads {
        for (g, id) in t.join().unwrap() {
            per_group[g as usize].push(id);
        }
    }
    for (g, ids) in per_group.iter_mut().enumerate().skip(1) {
        ids.sort_unstable();
        assert_eq!(
            *ids,
            (1..=ids.len() as u64).collect::<Vec<_>>(),
            "group {g}"
        );
        let stored: Vec<u64> = read_all(&e, g as u64).iter().map(|r| r.0).collect();
        assert_eq!(&stored, ids);
    }
}

/// Positions of the last `n` record starts in a segment file and its length.
fn last_record_offsets(path: &Path, n: usize) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    let mut pos = crate::logs::segment::SEGMENT_HEADER_BYTES;
    let mut starts = Vec::new();
    while pos < bytes.len() {
        starts.push(pos as u64);
        pos += crate::logs::record::peek_len(&bytes[pos..]).unwrap();
    }
    starts.split_off(starts.len().saturating_sub(n))
}

/// The newest file with `suffix`; for journal files, the newest one that
/// holds more than its header (recovery starts a new, empty journal file
/// at each open).
pub(crate) fn newest_file(dir: &Path, suffix: &str) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(suffix))
        .collect();
    files.sort();
    let header = crate::commit::journal::JOURNAL_HEADER_BYTES as u64;
    while suffix == ".tmj"
        && files.len() > 1
        && std::fs::metadata(files.last().unwrap()).unwrap().len() <= header
    {
        files.pop();
    }
    files.pop().unwrap()
}

#[test]
fn active_segment_cut_at_every_byte_of_its_last_records_is_refilled_from_the_journal() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    let mut c = small_config(&src);
    // Every round's records reach the segment file, which the test cuts.
    c.segment_tail_bytes = 0;
    let e = Engine::open(c).unwrap();
    fill(&e, &[1], 25);
    e.simulate_crash();
    let seg = newest_file(&crate::logs::group_log::group_dir(&src, 1), ".seg");
    let len = std::fs::metadata(&seg).unwrap().len();
    let start = last_record_offsets(&seg, 3)[0];
    for cut in start..len {
        let dst = base.path().join(format!("cut{cut}"));
        copy_dir(&src, &dst);
        let target = crate::logs::group_log::group_dir(&dst, 1).join(seg.file_name().unwrap());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let e = Engine::open(small_config(&dst)).unwrap();
        assert_dense_and_exact(&e, 1, 25);
        drop(e);
        std::fs::remove_dir_all(&dst).unwrap();
    }
}

#[test]
fn journal_torn_at_every_byte_of_its_last_entries_keeps_exactly_the_whole_ones() {
    let base = tempfile::tempdir().unwrap();
    let src = base.path().join("src");
    let mut c = small_config(&src);
    c.checkpoint_journal_bytes = 1 << 30;
    c.segment_tail_bytes = 0; // every round's records reach the segment file
    let e = Engine::open(c).unwrap();
    // The first checkpoint switches journal files: the fill goes to one.
    e.checkpoint().unwrap();
    fill(&e, &[1], 25);
    e.simulate_crash();
    let journal = newest_file(&src.join("journal"), ".tmj");
    let jbytes = std::fs::read(&journal).unwrap();
    // Frame boundaries of the journal, and the ends of its frames holding
    // records (one per round; the first creates the group).
    let (mut ends, mut record_ends) = (Vec::new(), Vec::new());
    for (_, end, kind, _) in journal_entries(&jbytes) {
        ends.push(end as u64);
        if kind == crate::commit::journal::EntryKind::Records {
            record_ends.push(end as u64);
        }
    }
    let seg = newest_file(&crate::logs::group_log::group_dir(&src, 1), ".seg");
    let seg_starts = last_record_offsets(&seg, 25);
    let from = ends[ends.len() - 4];
    for cut in from..jbytes.len() as u64 {
        // Records whose frames are whole before the cut.
        let whole = record_ends.iter().filter(|&&e| e <= cut).count() as u64;
        let dst = base.path().join(format!("cut{cut}"));
        copy_dir(&src, &dst);
        std::fs::OpenOptions::new()
            .write(true)
            .open(dst.join("journal").join(journal.file_name().unwrap()))
            .unwrap()
            .set_len(cut)
            .unwrap();
        // The crash hit before the group log got the torn round's records.
        let target = crate::logs::group_log::group_dir(&dst, 1).join(seg.file_name().unwrap());
        std::fs::OpenOptions::new()
            .write(true)
            .open(&target)
            .unwrap()
            .set_len(seg_starts[whole as usize])
            .unwrap();
        let e = Engine::open(small_config(&dst)).unwrap();
        assert_dense_and_exact(&e, 1, whole);
        let cut_bytes = e.recovery_report().bytes_cut();
        assert_eq!(
            cut_bytes > 0,
            !ends.contains(&cut),
            "cut {cut}: reported {cut_bytes}"
        );
        // Writing goes on densely after the repair.
        assert_eq!(
            e.append(1, 7, 1_000_000 + whole + 1, &payload(1, whole + 1))
                .unwrap()
                .msg_id,
            whole + 1
        );
        drop(e);
        std::fs::remove_dir_all(&dst).unwrap();
    }
}

#[test]
fn a_flipped_byte_in_a_sealed_segment_is_reported_and_other_groups_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[1, 2], 200);
    e.close().unwrap();
    let gdir = crate::logs::group_log::group_dir(dir.path(), 1);
    let mut segs: Vec<_> = std::fs::read_dir(&gdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    let victim = &segs[1];
    let mut bytes = std::fs::read(victim).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(victim, &bytes).unwrap();

    let e = Engine::open(small_config(dir.path())).unwrap();
    let mut after = 0;
    let err = loop {
        match e.read(1, after, 50, 1 << 20) {
            Ok(b) => after = b.last_id,
            Err(err) => break err,
        }
    };
    let text = err.to_string();
    assert!(
        matches!(err, Error::GroupDamaged { group: 1, .. }),
        "{text}"
    );
    assert!(
        text.contains(victim.file_name().unwrap().to_str().unwrap()),
        "names the file: {text}"
    );
    assert!(after < 200);
    assert_dense_and_exact(&e, 2, 200);
}

/// storage.md section 4: a group whose sealed segment fails its check
/// "still takes sends", also after a restart (its dedup window is rebuilt
/// from the records it can read); reads of the damaged segment fail naming
/// it, reads of the others are served.
#[test]
fn a_flipped_bit_in_a_sealed_segment_still_takes_sends_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[1], 200);
    e.close().unwrap();
    let gdir = crate::logs::group_log::group_dir(dir.path(), 1);
    let mut segs: Vec<_> = std::fs::read_dir(&gdir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    assert!(segs.len() >= 3, "{segs:?}");
    let victim = &segs[0];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[100] ^= 0x01;
    std::fs::write(victim, &bytes).unwrap();

    let e = Engine::open(small_config(dir.path())).unwrap();
    let sent = e.append(1, 7, 5_000_000, b"after the damage");
    assert_eq!(sent.map(|a| a.msg_id).map_err(|e| e.to_string()), Ok(201));
    // A retransmit of a send the window could read is still a duplicate.
    let again = e.append(1, 7, 1_000_000 + 200, &payload(1, 200)).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (200, true));
    match e.read(1, 0, 10, 1 << 20) {
        Err(Error::GroupDamaged { group: 1, reason }) => assert!(
            reason.contains(victim.file_name().unwrap().to_str().unwrap()),
            "{reason}"
        ),
        other => panic!("{:?}", other.map(|b| b.count)),
    }
    let second_base: u64 = segs[1]
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let b = e.read(1, second_base - 1, 1000, 1 << 20).unwrap();
    assert_eq!((b.count as u64, b.last_id), (201 - second_base + 1, 201));
    e.close().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert_eq!(e.append(1, 7, 5_000_001, b"and again").unwrap().msg_id, 202);
}

#[test]
fn a_damaged_checkpoint_is_rejected_and_everything_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[1, 2, 3], 60);
    e.close().unwrap();
    let cp = crate::state::checkpoint_tests::newest_manifest(dir.path());
    let mut bytes = std::fs::read(&cp).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0xff;
    std::fs::write(&cp, &bytes).unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    assert!(e.recovery_report().checkpoint_rejected.is_some());
    for g in [1, 2, 3] {
        assert_dense_and_exact(&e, g, 60);
    }
}

#[test]
fn a_second_engine_on_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _e = Engine::open(small_config(dir.path())).unwrap();
    assert!(matches!(
        Engine::open(small_config(dir.path())),
        Err(Error::Locked { .. })
    ));
}

#[test]
fn never_and_interval_policies_commit_without_syncing_every_round() {
    for policy in [
        FsyncPolicy::Never,
        FsyncPolicy::Interval(std::time::Duration::from_secs(3600)),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let vfs = FaultyVfs::new();
        let mut c = small_config(dir.path());
        c.fsync = policy;
        let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
        fill(&e, &[1], 50);
        assert_eq!(e.stats().journal_syncs, 0, "{policy:?}");
        e.simulate_crash();
        let e = Engine::open(c).unwrap();
        assert_dense_and_exact(&e, 1, 50);
    }
}

#[test]
fn retransmits_within_the_time_window_are_recognised_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    // Few sends by count, but 10 minutes by age: the age rule must hold
    // after a restart even where the count rule alone would forget.
    c.dedup_window_sends = 2;
    c.dedup_entries_max = 10_000;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 120); // several 8 KiB segments
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    for i in [1u64, 10, 60, 119] {
        let a = e.append(1, 7, 1_000_000 + i, &payload(1, i)).unwrap();
        assert!(a.duplicate, "send {i} recognised");
        assert_eq!(a.msg_id, i);
    }
    assert_eq!(e.head(1).unwrap(), 120);
}

#[test]
fn a_torn_journal_followed_only_by_empty_files_is_cut_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 10);
    e.simulate_crash();
    let jdir = dir.path().join("journal");
    let newest = newest_file(&jdir, ".tmj");
    let len = std::fs::metadata(&newest).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&newest)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    // A crash right after the next journal file was created (empty).
    let seq: u64 = newest
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let next = crate::commit::journal::Journal::create(
        Arc::new(crate::io::OsVfs),
        &jdir,
        crate::commit::journal::JournalStart::first(seq + 1),
        crate::commit::journal::JournalOptions::of(&c),
    )
    .unwrap();
    drop(next);
    let e = Engine::open(c.clone()).unwrap();
    assert!(e.recovery_report().bytes_cut() > 0);
    let head = e.head(1).unwrap();
    assert!(head >= 9, "only the torn frame is lost: head {head}");
    e.close().unwrap();
    // And the repair is durable: the next open finds nothing to cut.
    let e = Engine::open(c).unwrap();
    assert_eq!(e.recovery_report().bytes_cut(), 0);
    assert_eq!(e.head(1).unwrap(), head);
}

#[test]
fn a_journal_of_an_unknown_version_is_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_config(dir.path());
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 3);
    e.simulate_crash();
    let newest = newest_file(&dir.path().join("journal"), ".tmj");
    let mut bytes = std::fs::read(&newest).unwrap();
    bytes[8] = 9; // version 9
    let crc = crc32fast::hash(&bytes[0..44]);
    bytes[44..48].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&newest, &bytes).unwrap();
    let err = Engine::open(c).err().expect("refused");
    assert!(err.to_string().contains("version 9"), "{err}");
}

#[test]
fn a_damaged_group_stays_damaged_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_config(dir.path());
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1, 2], 30);
    e.close().unwrap();
    // Damage what the checkpoint says was synced: the group's active segment
    // (bytes after a checkpoint would be repaired from the journal instead).
    let seg = newest_file(&crate::logs::group_log::group_dir(dir.path(), 1), ".seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[crate::logs::segment::SEGMENT_HEADER_BYTES + 20] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let e = Engine::open(c.clone()).unwrap();
    assert!(matches!(
        e.read(1, 0, 10, 1 << 20),
        Err(Error::GroupDamaged { group: 1, .. })
    ));
    assert_dense_and_exact(&e, 2, 30);
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    assert!(
        matches!(
            e.read(1, 0, 10, 1 << 20),
            Err(Error::GroupDamaged { group: 1, .. })
        ),
        "still damaged"
    );
    assert!(
        e.append(1, 1, 1, b"x").is_err(),
        "a damaged group takes no writes"
    );
    assert_dense_and_exact(&e, 2, 30);
}

#[test]
fn a_batch_is_one_commit_round_and_dedups_within_itself() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    for g in 1..=50 {
        e.create_group(g).unwrap();
    }
    let rounds = e.stats().rounds;
    let payloads: Vec<Vec<u8>> = (0..500u64).map(|i| payload(1 + i % 50, i)).collect();
    let mut reqs: Vec<AppendRequest<'_>> = (0..500u64)
        .map(|i| AppendRequest {
            group_id: 1 + i % 50,
            sender_id: 3,
            client_msg_id: i,
            payload: &payloads[i as usize],
        })
        .collect();
    // The same send twice in one batch is stored once.
    reqs.push(AppendRequest {
        group_id: 1,
        sender_id: 3,
        client_msg_id: 0,
        payload: b"again",
    });
    let out = e.append_batch(&reqs).unwrap();
    assert_eq!(
        e.stats().rounds - rounds,
        1,
        "one round for the whole batch"
    );
    assert_eq!(
        out[500],
        crate::Appended {
            duplicate: true,
            ..out[0]
        }
    );
    for g in 1..=50 {
        assert_eq!(e.head(g).unwrap(), 10);
    }
    // All or nothing.
    let bad = [
        AppendRequest {
            group_id: 1,
            sender_id: 3,
            client_msg_id: 9999,
            payload: b"ok",
        },
        AppendRequest {
            group_id: 777,
            sender_id: 3,
            client_msg_id: 1,
            payload: b"no group",
        },
    ];
    assert!(matches!(
        e.append_batch(&bad),
        Err(Error::GroupNotFound { group: 777 })
    ));
    assert_eq!(e.head(1).unwrap(), 10);
}

#[test]
fn a_nearly_full_disk_refuses_writes_until_space_returns_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let mut c = small_config(dir.path());
    c.disk_free_min_bytes = 1 << 20;
    let e = Engine::open_with_vfs(c, Arc::new(vfs)).unwrap();
    fill(&e, &[1], 5);
    control.free_bytes.store(1000, Ordering::SeqCst);
    // The commit thread notices at its next round or timer.
    e.append(1, 7, 500, b"last one before the check").unwrap();
    let err = loop {
        match e.append(1, 7, 501, b"refused") {
            Err(err) => break err,
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
        }
    };
    assert!(
        matches!(
            err,
            Error::DiskFull {
                free: 1000,
                min: 1048576
            }
        ),
        "{err}"
    );
    assert!(err.is_disk_full());
    let head = e.head(1).unwrap();
    assert_eq!(
        read_all(&e, 1).len() as u64,
        head,
        "everything acknowledged is readable"
    );
    // Space returns: writes resume without a restart, ids stay dense.
    control.free_bytes.store(u64::MAX, Ordering::SeqCst);
    let a = loop {
        match e.append(1, 7, 502, b"accepted again") {
            Ok(a) => break a,
            Err(Error::DiskFull { .. }) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(a.msg_id, head + 1);
}

/// `(group, msg_id, sender, client_msg_id, journal syncs completed when it returned)`.
type Acked = (u64, u64, u64, u64, u64);

/// Appends from several threads, then a simulated power cut at a random
/// moment: everything not fsynced is dropped. Returns, per acknowledged
/// append, `(group, msg_id, sender, client_msg_id, journal syncs completed
/// when it returned)`, and the journal syncs completed before the cut.
fn run_until_power_cut(root: &Path, c: Config, seed: u64) -> (Vec<Acked>, u64) {
    use crate::io::power_cut::{Cut, PowerCutVfs};
    use std::sync::atomic::AtomicBool;
    let vfs = PowerCutVfs::new(root);
    let control = vfs.control.clone();
    let e = Arc::new(Engine::open_with_vfs(c, Arc::new(vfs)).unwrap());
    for g in 1..=3 {
        e.create_group(g).unwrap();
    }
    // Durable before the run under every policy.
    e.checkpoint().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acks = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let (e, stop, acks) = (e.clone(), stop.clone(), acks.clone());
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0.. {
                    let g = 1 + (i + t) % 3;
                    let cmid = t << 32 | i;
                    let r = e.append(g, t, cmid, &payload(g, cmid));
                    // Counted only if it returned before the cut began.
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    match r {
                        Ok(a) => {
                            acked.push((g, a.msg_id, t, cmid, e.stats().journal_syncs));
                            acks.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(err) => panic!("append failed before the cut: {err}"),
                    }
                }
                acked
            })
        })
        .collect();
    // Cut at a point that depends on the seed, counted in acknowledged
    // appends and journal syncs rather than time (the machine may be slow).
    let want = 20 + seed % 60;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while (acks.load(Ordering::SeqCst) < want || e.stats().journal_syncs < 4)
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // First the test stops counting, then the power goes: an append counted
    // as acknowledged returned before anything stopped being durable.
    stop.store(true, Ordering::SeqCst);
    let syncs_before_cut = e.stats().journal_syncs;
    control.freeze();
    let acked: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    Arc::try_unwrap(e)
        .ok()
        .expect("threads joined")
        .simulate_crash();
    control.cut(Cut::Seeded(seed)).unwrap();
    (acked, syncs_before_cut)
}

fn check_after_power_cut(
    dir: &Path,
    c: Config,
    acked: &[Acked],
    must_keep: impl Fn(u64) -> bool,
) -> (usize, usize) {
    let e = Engine::open(c).unwrap();
    let mut stored: std::collections::HashMap<(u64, u64), (u64, u64, Vec<u8>)> = Default::default();
    for g in 1..=3 {
        let mut next = 1;
        let mut after = 0;
        loop {
            let b = e.read(g, after, 500, 1 << 20).unwrap();
            for r in b.records() {
                assert_eq!(r.header.msg_id, next, "ids dense in group {g}");
                next += 1;
                stored.insert(
                    (g, r.header.msg_id),
                    (
                        r.header.sender_id,
                        r.header.client_msg_id,
                        r.payload().to_vec(),
                    ),
                );
            }
            if !b.has_more {
                break;
            }
            after = b.last_id;
        }
    }
    let mut required = 0;
    for &(g, id, t, cmid, syncs) in acked {
        if !must_keep(syncs) {
            continue;
        }
        required += 1;
        let got = stored
            .get(&(g, id))
            .unwrap_or_else(|| panic!("{}: acknowledged append {g}/{id} lost", dir.display()));
        assert_eq!(got, &(t, cmid, payload(g, cmid)));
    }
    (required, stored.len())
}

#[test]
fn a_data_directory_the_engine_created_survives_a_power_cut() {
    // The data directory's own entry (and those of any
    // parents the engine created) was never synced in its parent, so a
    // power cut could take the directory with every synced byte inside it.
    use crate::io::power_cut::{Cut, PowerCutVfs};
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("new-parent").join("data");
    let vfs = PowerCutVfs::new(root.path());
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(small_config(&dir), Arc::new(vfs)).unwrap();
    e.create_group(1).unwrap();
    let a = e.append(1, 7, 1, &payload(1, 1)).unwrap(); // fsync=always: durable
    control.freeze();
    e.simulate_crash();
    control.cut(Cut::DropUnsynced).unwrap();
    let e = Engine::open(small_config(&dir)).unwrap();
    assert_eq!(a.msg_id, 1);
    assert_dense_and_exact(&e, 1, 1);
}

/// Every other power cut is followed by opens that load the checkpoint's
/// state in the background (the node's default), the others by opens
/// that load it before they return.
fn background_every_other(seed: u64) -> bool {
    seed.is_multiple_of(2)
}

/// Power cuts per power-cut test: a few in CI; `TIDEMARK_POWER_CUTS=N`
/// runs N (RELIABILITY.md, long modes).
fn power_cuts(ci: u64) -> u64 {
    std::env::var("TIDEMARK_POWER_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci)
}

#[test]
fn a_power_cut_keeps_every_append_acknowledged_under_fsync_always() {
    let mut total = 0;
    let cuts = power_cuts(6);
    for seed in 0..cuts {
        // The data directory is made by the engine inside the layer's root,
        // so its own entry is subject to the cut too.
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let mut c = small_config(&dir);
        c.checkpoint_journal_bytes = 64 << 10; // checkpoints happen during the run
        c.journal_file_bytes = 16 << 10; // and journal rolls between them
        c.load_in_background = background_every_other(seed);
        let (acked, _) = run_until_power_cut(root.path(), c.clone(), seed * 17);
        let (required, _) = check_after_power_cut(&dir, c, &acked, |_| true);
        assert!(required > 0);
        total += required;
    }
    println!("power cut, fsync=always: {total} acknowledged appends over {cuts} cuts, 0 lost");
}

#[test]
fn a_power_cut_under_fsync_interval_loses_at_most_what_followed_the_last_sync() {
    let mut kept = 0;
    let cuts = power_cuts(4);
    for seed in 0..cuts {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let mut c = small_config(&dir);
        c.fsync = FsyncPolicy::Interval(std::time::Duration::from_millis(5));
        c.checkpoint_journal_bytes = 64 << 10;
        c.journal_file_bytes = 16 << 10;
        c.load_in_background = background_every_other(seed);
        let (acked, syncs_before_cut) = run_until_power_cut(root.path(), c.clone(), seed * 23);
        // The allowance, exactly: an append is covered by the second journal
        // sync that completed after it returned (the first may have started
        // before its write). Those must survive; later ones may not.
        let (required, _) = check_after_power_cut(&dir, c, &acked, |s| s + 2 <= syncs_before_cut);
        kept += required;
    }
    assert!(kept > 0, "the interval syncs covered some appends");
    println!("power cut, fsync=interval:5ms: {kept} covered appends kept over {cuts} cuts, 0 lost");
}

#[test]
fn stored_cursors_far_above_the_head_are_clamped_not_trusted() {
    // Fuzz finding F1: a cursor of 2^40 in a checkpoint's member rows
    // sized the read-count tree by its value.
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    fill(&e, &[1], 3);
    e.join(1, 5, crate::JoinStart::Earliest).unwrap();
    e.close().unwrap();
    crate::state::checkpoint_tests::add_run(
        dir.path(),
        &[crate::state::Item::MemberPut {
            group: 1,
            user: 5,
            cursor: 1 << 40,
            join_point: 1,
        }],
    );
    let e = Engine::open(small_config(dir.path())).unwrap();
    let u = e.unread(5);
    assert_eq!((u[0].cursor, u[0].head), (3, 3), "clamped to the head");
    assert_eq!(e.read_count(1, 3).unwrap(), 1);
}

#[test]
fn a_restored_applied_lsn_beyond_the_journal_is_lowered_and_new_frames_replay() {
    // A checkpoint whose group record reflects a frame number the journal
    // never reached (an older build's checkpoint, then a power cut under
    // `never`): recovery lowers it, else the next frames of the group,
    // numbered from the journal, would be taken for reflected and skipped.
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30; // no checkpoint during the test
    c.checkpoint_interval_ms = 3_600_000;
    let e = Engine::open(c.clone()).unwrap();
    e.create_group(1).unwrap();
    e.close().unwrap();
    crate::state::checkpoint_tests::add_run(
        dir.path(),
        &[crate::state::Item::GroupPut(Box::new(
            crate::state::GroupRecord {
                group: 1,
                fresh: false,
                applied_lsn: 1 << 40,
                head: 0,
                segments: Vec::new(),
                retention: Default::default(),
                damaged: None,
                small: None,
                quiet: Vec::new(),
                edits: Vec::new(),
                erase: Vec::new(),
            },
        ))],
    );
    let e = Engine::open(c.clone()).unwrap();
    // The first checkpoint after the open stores what recovery lowered.
    e.checkpoint().unwrap();
    e.append(1, 7, 1, b"after the checkpoint").unwrap();
    e.simulate_crash();
    let e = Engine::open(c).unwrap();
    assert_eq!(e.head(1).unwrap(), 1, "the append was replayed");
    e.close().unwrap();
}

#[test]
fn a_journal_sequence_number_at_the_end_of_its_range_is_an_error_not_a_panic() {
    // Fuzz finding F4: `seq + 1` overflowed for a journal named u64::MAX.
    let dir = tempfile::tempdir().unwrap();
    Engine::open(small_config(dir.path()))
        .unwrap()
        .close()
        .unwrap();
    // Only a journal named u64::MAX and no checkpoint (with a checkpoint,
    // the gap before it would be refused as a missing file first).
    let jdir = dir.path().join("journal");
    for f in std::fs::read_dir(&jdir).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    std::fs::remove_dir_all(dir.path().join("manifest")).unwrap();
    crate::commit::journal::Journal::create(
        Arc::new(crate::io::OsVfs),
        &jdir,
        crate::commit::journal::JournalStart::first(u64::MAX),
        crate::commit::journal::JournalOptions::of(&small_config(dir.path())),
    )
    .unwrap();
    let err = Engine::open(small_config(dir.path()))
        .err()
        .expect("refused");
    assert!(err.to_string().contains("exhausted"), "{err}");
}

/// `(frame start, frame end, kind, group)` of every entry of a journal
/// file's valid part, by the frame that holds it.
fn journal_entries(bytes: &[u8]) -> Vec<(usize, usize, crate::commit::journal::EntryKind, u64)> {
    crate::commit::journal::frames_of_file(bytes)
        .into_iter()
        .flat_map(|f| {
            f.entries
                .into_iter()
                .map(move |(_, _, kind, group)| (f.offset, f.end, kind, group))
        })
        .collect()
}

pub(crate) fn seq_of(journal: &Path) -> u64 {
    journal
        .file_stem()
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_flipped_byte_mid_journal_with_valid_entries_after_it_refuses_to_open_naming_file_and_offset() {
    // Records wait in segment tails (16 KiB), so at the crash the journal
    // is their only copy: a damaged frame cannot be restored from anywhere.
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    // The first checkpoint switches journal files: the fill goes to one.
    e.checkpoint().unwrap();
    fill(&e, &[1, 2], 40);
    e.simulate_crash();
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    let mut bytes = std::fs::read(&journal).unwrap();
    let records: Vec<_> = journal_entries(&bytes)
        .into_iter()
        .filter(|e| e.2 == crate::commit::journal::EntryKind::Records)
        .collect();
    assert_eq!(records.len(), 80);
    // The middle record's payload (the end of its frame): valid,
    // acknowledged frames follow it.
    let (start, end, _, _) = records[40];
    bytes[end - 3] ^= 0x20;
    std::fs::write(&journal, &bytes).unwrap();

    for _ in 0..2 {
        let err = Engine::open(c.clone()).err().expect("refused");
        let text = err.to_string();
        match &err {
            Error::Corrupt {
                path,
                group: None,
                offset,
                ..
            } => {
                assert_eq!(path, &journal, "{text}");
                assert_eq!(*offset, start as u64, "{text}");
            }
            other => panic!("expected Corrupt naming the journal, got {other}"),
        }
        assert!(text.contains("not a torn write"), "{text}");
        assert!(text.contains("backup"), "says what to do: {text}");
        // Refusing changed nothing: the file still holds every frame.
        assert_eq!(std::fs::read(&journal).unwrap(), bytes);
    }
}

#[test]
fn a_flipped_byte_mid_journal_is_restored_from_the_segment_copy_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    c.segment_tail_bytes = 0; // every record also reaches its segment file
    let e = Engine::open(c.clone()).unwrap();
    // Both groups are in the checkpoint with their files (a group's first
    // record makes them, and replaying it starts them afresh, so its
    // segments could not help).
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    for g in [1, 2] {
        e.append(g, 7, g * 1_000_000 + 1, &payload(g, 1)).unwrap();
    }
    e.checkpoint().unwrap();
    for g in [1, 2] {
        // Group 2's records all follow the damaged entry in the journal.
        for i in 2..=30 {
            e.append(g, 7, g * 1_000_000 + i, &payload(g, i)).unwrap();
        }
    }
    e.simulate_crash();
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    let mut bytes = std::fs::read(&journal).unwrap();
    let records: Vec<_> = journal_entries(&bytes)
        .into_iter()
        .filter(|e| e.2 == crate::commit::journal::EntryKind::Records)
        .collect();
    // A byte of the 20th record of group 1 (in its payload, at the end of
    // its frame).
    let (_, end, _, group) = records[19];
    assert_eq!(group, 1);
    bytes[end - 5] ^= 0x01;
    std::fs::write(&journal, &bytes).unwrap();

    let e = Engine::open(c.clone()).unwrap();
    let report = e.recovery_report().clone();
    assert_eq!(report.journal_records_repaired, 1);
    assert_eq!(report.bytes_cut(), 0, "nothing is cut: {report:?}");
    for g in [1, 2] {
        assert_dense_and_exact(&e, g, 30);
        // The next id is new.
        let a = e.append(g, 7, 9_000_000 + g, &payload(g, 31)).unwrap();
        assert_eq!(a.msg_id, 31);
    }
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    for g in [1, 2] {
        assert_eq!(e.head(g).unwrap(), 31);
    }
}

#[test]
fn a_deleted_journal_file_that_the_checkpoint_names_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1, 2], 20);
    e.simulate_crash();
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    std::fs::remove_file(&journal).unwrap();
    let err = Engine::open(c.clone()).err().expect("refused");
    let text = err.to_string();
    assert!(
        matches!(&err, Error::Corrupt { path, .. } if path == &journal),
        "names the file: {text}"
    );
    assert!(text.contains("missing"), "{text}");

    // After a clean shutdown the file the checkpoint names holds nothing:
    // losing it loses nothing, and opening goes on.
    let dir = tempfile::tempdir().unwrap();
    let c = small_config(dir.path());
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 20);
    e.close().unwrap();
    std::fs::remove_file(newest_file(&dir.path().join("journal"), ".tmj")).unwrap();
    let e = Engine::open(c).unwrap();
    assert_dense_and_exact(&e, 1, 20);
}

#[test]
fn an_empty_short_or_bad_header_journal_file_that_the_checkpoint_names_refuses_to_open() {
    // Its header was synced before the checkpoint naming it was stored, so
    // a file without a valid header is damage, not a crash while creating it.
    type Damage = fn(&mut Vec<u8>);
    let damage: [(&str, Damage); 3] = [
        ("empty", |b| b.clear()),
        ("short", |b| b.truncate(20)),
        ("bad header crc", |b| b[17] ^= 1),
    ];
    for (what, damage) in damage {
        let dir = tempfile::tempdir().unwrap();
        let mut c = small_config(dir.path());
        c.checkpoint_journal_bytes = 1 << 30;
        let e = Engine::open(c.clone()).unwrap();
        fill(&e, &[1, 2], 20);
        e.simulate_crash();
        let journal = newest_file(&dir.path().join("journal"), ".tmj");
        let mut bytes = std::fs::read(&journal).unwrap();
        damage(&mut bytes);
        std::fs::write(&journal, &bytes).unwrap();
        let err = Engine::open(c.clone()).err().expect(what);
        assert!(
            matches!(&err, Error::Corrupt { path, offset: 0, .. } if path == &journal),
            "{what}: names the file at offset 0: {err}"
        );
        assert!(err.to_string().contains("backup"), "{what}: {err}");
        // Nothing was cut.
        assert_eq!(std::fs::read(&journal).unwrap(), bytes, "{what}");
    }

    // After a clean shutdown the file the checkpoint names holds no entry:
    // a damaged header there loses nothing, and opening goes on.
    let dir = tempfile::tempdir().unwrap();
    let c = small_config(dir.path());
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 20);
    e.close().unwrap();
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    std::fs::write(&journal, b"").unwrap();
    let e = Engine::open(c).unwrap();
    assert_dense_and_exact(&e, 1, 20);
}

#[test]
fn refusing_an_older_journal_file_says_to_move_the_later_files_aside_too() {
    // Cutting an older file is not enough while a later one holds frames:
    // the hint names the later files.
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    // Small journal files: the fills span several.
    c.journal_file_bytes = 2048;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 5);
    e.checkpoint().unwrap();
    fill(&e, &[2], 40);
    e.simulate_crash();
    let jdir = dir.path().join("journal");
    let newest = newest_file(&jdir, ".tmj");
    let older = crate::commit::journal::journal_path(&jdir, seq_of(&newest) - 1);
    // Both after the checkpoint's replay position (the fill spans several
    // files), and the older one has a torn end.
    let replay_from = crate::state::checkpoint_tests::newest_manifest(dir.path());
    let m = crate::state::manifest::load(&crate::io::OsVfs, &replay_from)
        .unwrap()
        .unwrap();
    assert!(seq_of(&older) >= m.replay_journal_seq);
    let len = std::fs::metadata(&older).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&older)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let err = Engine::open(c).err().expect("refused");
    assert!(
        matches!(&err, Error::Corrupt { path, .. } if path == &older),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("later journal file"), "{text}");
    assert!(
        text.contains(&newest.display().to_string()),
        "names the later file: {text}"
    );
}

/// A frame envelope forged by hand with `key` mixed into its checksum
/// (what a client can put into a payload, not knowing the file's key).
fn forged_envelope(lsn: u64, synced_len: u64, key: Option<u32>) -> Vec<u8> {
    let mut b = vec![0u8; 32];
    b[4..8].copy_from_slice(&16u32.to_le_bytes());
    b[8] = 1;
    b[16..24].copy_from_slice(&lsn.to_le_bytes());
    b[24..32].copy_from_slice(&synced_len.to_le_bytes());
    let mut h = crc32fast::Hasher::new();
    if let Some(key) = key {
        h.update(&key.to_le_bytes());
    }
    h.update(&b[4..32]);
    let crc = h.finalize();
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    b
}

#[test]
fn a_payload_shaped_like_frame_envelopes_cannot_make_a_torn_write_refused() {
    // A client's payload holds envelopes naming a synced length beyond the
    // start of its own frame. When a power cut tears that frame, the forged
    // envelopes must not pass for proof that the frame was durable: the
    // tear is cut, not refused.
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 5);
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    let before = std::fs::metadata(&journal).unwrap().len();
    // The round's frame starts at `before`, and the forged envelopes lie
    // beyond `before + 400`.
    let synced = before + 200;
    let mut forged = Vec::new();
    for key in [None, Some(0u32), Some(1), Some(0x0403_0201)] {
        for lsn in 5..9 {
            forged.extend(forged_envelope(lsn, synced, key));
        }
    }
    let mut p = vec![b'x'; 400];
    p.extend_from_slice(&forged);
    assert_eq!(e.append(1, 7, 99, &p).unwrap().msg_id, 6);
    e.simulate_crash();
    let mut bytes = std::fs::read(&journal).unwrap();
    let (start, _, kind, _) = *journal_entries(&bytes).last().unwrap();
    assert_eq!(kind, crate::commit::journal::EntryKind::Records);
    assert_eq!(start as u64, before);
    // The power cut kept the later page of the write but not its start.
    bytes[start..start + 64].fill(0);
    std::fs::write(&journal, &bytes).unwrap();
    let e = Engine::open(c).expect("a torn write is cut, not refused");
    assert_eq!(e.head(1).unwrap(), 5);
    assert!(e.recovery_report().bytes_cut() > 0);
}

#[test]
fn a_damaged_envelope_of_a_durable_frame_is_restored_not_refused() {
    // An envelope holds no data: damage to its checksum, lsn or synced
    // length loses nothing when later frames show it was durable and its
    // payload is intact.
    for at in [0, 18, 28] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = small_config(dir.path());
        c.checkpoint_journal_bytes = 1 << 30;
        let e = Engine::open(c.clone()).unwrap();
        fill(&e, &[1, 2], 20);
        e.simulate_crash();
        let journal = newest_file(&dir.path().join("journal"), ".tmj");
        let mut bytes = std::fs::read(&journal).unwrap();
        let frames = crate::commit::journal::frames_of_file(&bytes);
        assert!(frames.len() > 10);
        // A frame in the middle: later frames show it durable.
        let start = frames[frames.len() / 2].offset;
        bytes[start + at] ^= 0x04;
        std::fs::write(&journal, &bytes).unwrap();
        let e = Engine::open(c.clone()).expect("a damaged envelope loses nothing");
        let report = e.recovery_report();
        assert_eq!(report.journal_envelopes_repaired, 1, "byte {at}");
        assert_eq!(report.bytes_cut(), 0, "byte {at}");
        for g in [1, 2] {
            assert_dense_and_exact(&e, g, 20);
        }
    }
}

#[test]
fn a_clean_restart_under_fsync_never_opens_no_group_segment() {
    // Every journal header carries `segments_may_lead` under `never`, also
    // the empty file a clean shutdown's checkpoint names; that one held no
    // entry, so a clean restart must not open every group's segments.
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.fsync = FsyncPolicy::Never;
    let groups: Vec<u64> = (1..=100).collect();
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &groups, 2);
    e.close().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    let report = e.recovery_report().clone();
    assert!(report.clean_shutdown);
    assert_eq!(report.groups_verified, 0, "{report:?}");
    assert_eq!(report.groups_unverified, 100);
    let opens = control.opens.load(Ordering::SeqCst);
    assert!(opens < 20, "{opens} files opened for 100 groups");
    e.close().unwrap();
    // After a crash the flag still counts: segments may hold records the
    // journal lost, so every group's active segment is looked at.
    let e = Engine::open(c.clone()).unwrap();
    e.append(1, 7, 5_000_000, &payload(1, 3)).unwrap();
    e.simulate_crash();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c, Arc::new(vfs)).unwrap();
    assert!(!e.recovery_report().clean_shutdown);
    assert!(control.opens.load(Ordering::SeqCst) >= 100);
    assert_eq!(e.head(1).unwrap(), 3);
}

#[test]
fn a_gap_in_journal_sequence_numbers_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1], 5);
    e.simulate_crash();
    let jdir = dir.path().join("journal");
    let seq = seq_of(&newest_file(&jdir, ".tmj"));
    // File seq + 1 is missing (the spare made ahead of the next roll is
    // removed); seq + 2 holds a frame.
    let spare = crate::commit::journal::journal_path(&jdir, seq + 1);
    assert_eq!(std::fs::metadata(&spare).unwrap().len(), 0, "the spare");
    std::fs::remove_file(&spare).unwrap();
    let mut j = crate::commit::journal::Journal::create(
        Arc::new(crate::io::OsVfs),
        &jdir,
        crate::commit::journal::JournalStart::first(seq + 2),
        crate::commit::journal::JournalOptions::of(&c),
    )
    .unwrap();
    let mut frame = crate::commit::journal::FrameBuf::default();
    frame.push_entry(crate::commit::journal::EntryKind::CreateGroup, 9, |_| {});
    j.append(&mut frame, crate::commit::journal::FrameKind::Round)
        .unwrap();
    j.sync().unwrap();
    drop(j);
    let err = Engine::open(c).err().expect("refused");
    let missing = crate::commit::journal::journal_path(&jdir, seq + 1);
    assert!(
        matches!(&err, Error::Corrupt { path, .. } if path == &missing),
        "names the missing file: {err}"
    );
}

#[test]
fn segments_written_after_the_checkpoint_set_heads_at_open_and_no_id_is_given_twice() {
    // Under `never` a power loss may keep segment writes whose journal bytes
    // it lost. Here the journal ends cleanly before group 2's records (a
    // lost, unsynced end at an entry boundary), while group 2's segments
    // hold 200 records: the active one the checkpoint lists, grown, and
    // segment files started after the checkpoint.
    let dir = tempfile::tempdir().unwrap();
    let mut c = small_config(dir.path());
    c.fsync = FsyncPolicy::Never;
    c.checkpoint_journal_bytes = 1 << 30;
    c.segment_tail_bytes = 0;
    let e = Engine::open(c.clone()).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.checkpoint().unwrap();
    for i in 1..=5 {
        e.append(1, 7, 1_000_000 + i, &payload(1, i)).unwrap();
    }
    for i in 1..=200 {
        e.append(2, 7, 2_000_000 + i, &payload(2, i)).unwrap();
    }
    e.simulate_crash();
    let gdir = crate::logs::group_log::group_dir(dir.path(), 2);
    assert!(
        std::fs::read_dir(&gdir).unwrap().count() >= 3,
        "several segments"
    );
    let journal = newest_file(&dir.path().join("journal"), ".tmj");
    let bytes = std::fs::read(&journal).unwrap();
    let first_of_2 = journal_entries(&bytes)
        .into_iter()
        .find(|e| e.2 == crate::commit::journal::EntryKind::Records && e.3 == 2)
        .unwrap()
        .0;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(first_of_2 as u64)
        .unwrap();

    let e = Engine::open(c.clone()).unwrap();
    // Known at open, before anything loads the group, and it never jumps.
    assert_eq!(e.head(2).unwrap(), 200);
    assert_dense_and_exact(&e, 2, 200);
    assert_eq!(e.head(2).unwrap(), 200);
    assert_dense_and_exact(&e, 1, 5);
    // A new send gets an id no stored message has.
    let a = e.append(2, 7, 3_000_000, &payload(2, 201)).unwrap();
    assert_eq!(a.msg_id, 201);
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    assert_dense_and_exact(&e, 2, 201);
}

#[test]
fn the_report_counts_unverified_groups_and_a_damaged_group_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let c = small_config(dir.path());
    let e = Engine::open(c.clone()).unwrap();
    fill(&e, &[1, 2, 3], 30);
    e.close().unwrap();
    // Damage group 1's checkpointed data: found only when it is loaded.
    let seg = newest_file(&crate::logs::group_log::group_dir(dir.path(), 1), ".seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[crate::logs::segment::SEGMENT_HEADER_BYTES + 20] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();

    let e = Engine::open(c.clone()).unwrap();
    let report = e.recovery_report().clone();
    assert_eq!(report.groups, 3);
    assert_eq!(report.groups_verified, 0);
    assert_eq!(report.groups_unverified, 3);
    assert!(report.damaged_groups.is_empty());
    let line = report.summary();
    assert!(
        line.contains("groups loaded and verified: 0")
            && line.contains("groups not yet verified (loaded on first use): 3")
            && line.contains("damaged groups: 0"),
        "{line}"
    );
    let err = e.read(1, 0, 10, 1 << 20).err().expect("damaged");
    let text = err.to_string();
    assert!(
        matches!(err, Error::GroupDamaged { group: 1, .. }),
        "{text}"
    );
    assert!(
        text.contains(crate::DAMAGED_GROUP_HINT)
            && text.contains("delete the group")
            && text.contains("backup"),
        "says what an operator can do: {text}"
    );
    e.close().unwrap();
    // The next open knows the damage from the checkpoint and counts it.
    let e = Engine::open(c).unwrap();
    let report = e.recovery_report();
    assert_eq!(report.damaged_groups.len(), 1);
    assert_eq!(report.groups_unverified, 2);
    assert!(report.summary().contains("damaged groups: 1"));
}

/// What a run of [`mixed_work_until_power_cut`] acknowledged, and so what
/// must be found after the cut (fsync=always).
#[derive(Clone, Debug, Default)]
struct Expected {
    /// Live groups: acknowledged records `msg_id -> client_msg_id`.
    groups: std::collections::BTreeMap<u64, std::collections::BTreeMap<u64, u64>>,
    /// Groups whose creation or deletion was under way at the cut.
    uncertain_groups: std::collections::BTreeSet<u64>,
    /// Groups with a retention policy (records below the floor may go).
    retained: std::collections::BTreeSet<u64>,
    /// Memberships `(group, user) -> cursor at least this`.
    members: std::collections::BTreeMap<(u64, u64), u64>,
    /// Memberships whose join or leave was under way at the cut.
    uncertain_members: std::collections::BTreeSet<(u64, u64)>,
    /// Memberships acknowledged gone.
    left: std::collections::BTreeSet<(u64, u64)>,
}

/// ACKed cursors not yet covered by a flush, `(group, user) -> cursor`.
type AckedCursors = std::collections::BTreeMap<(u64, u64), u64>;
/// How to note an operation that returned before the cut.
type Record = Box<dyn FnOnce(&mut Expected, &mut AckedCursors)>;

const MIXED_USERS: u64 = 4;
const MIXED_GROUPS: u64 = 6;

/// Checks the reopened engine against `x`, then returns what it holds now
/// (all of it durable, since opening ends with a checkpoint) as the next
/// run's starting point.
fn check_mixed(e: &Engine, x: &Expected, what: &str) -> Expected {
    let live: std::collections::BTreeSet<u64> = e.group_ids().into_iter().collect();
    for g in 1..=MIXED_GROUPS {
        if x.uncertain_groups.contains(&g) {
            continue;
        }
        assert_eq!(
            live.contains(&g),
            x.groups.contains_key(&g),
            "{what}: group {g} present"
        );
    }
    let mut now = Expected::default();
    for &g in &live {
        let mut records = std::collections::BTreeMap::new();
        // Reads start at the floor (the oldest stored id).
        let head = e.head(g).unwrap();
        let floor = match e.read(g, 0, 7, 1 << 10) {
            Ok(b) => b.records().next().map_or(head + 1, |r| r.header.msg_id),
            Err(Error::BelowRetentionFloor { earliest, .. }) => earliest,
            Err(other) => panic!("{what}: group {g}: {other}"),
        };
        let mut after = 0;
        loop {
            let b = e.read(g, after, 500, 1 << 20).unwrap();
            for r in b.records() {
                let id = r.header.msg_id;
                assert_eq!(
                    id,
                    floor + records.len() as u64,
                    "{what}: group {g}: ids dense"
                );
                assert_eq!(
                    r.payload(),
                    &payload(g, r.header.client_msg_id)[..],
                    "{what}: {g}/{id}"
                );
                records.insert(id, r.header.client_msg_id);
            }
            if !b.has_more {
                break;
            }
            after = b.last_id;
        }
        assert_eq!(
            floor + records.len() as u64,
            head + 1,
            "{what}: group {g}: up to the head"
        );
        if let Some(want) = x.groups.get(&g) {
            for (&id, &cmid) in want {
                if id < floor && x.retained.contains(&g) {
                    continue;
                }
                assert_eq!(
                    records.get(&id),
                    Some(&cmid),
                    "{what}: acknowledged {g}/{id} lost"
                );
            }
            assert!(
                floor == 1 || x.retained.contains(&g),
                "{what}: group {g} floor {floor}"
            );
        }
        now.groups.insert(g, records);
        for u in 1..=MIXED_USERS {
            let member = e.is_member(g, u);
            let key = (g, u);
            if !x.uncertain_members.contains(&key) && !x.uncertain_groups.contains(&g) {
                if let Some(&min) = x.members.get(&key) {
                    assert!(member, "{what}: membership {key:?} lost");
                    let cursor = e.unread(u).iter().find(|r| r.group_id == g).unwrap().cursor;
                    assert!(
                        cursor >= min && cursor <= head,
                        "{what}: {key:?} cursor {cursor}, at least {min}, head {head}"
                    );
                } else if x.left.contains(&key) {
                    assert!(!member, "{what}: {key:?} left but is a member");
                }
            }
            if member {
                let cursor = e.unread(u).iter().find(|r| r.group_id == g).unwrap().cursor;
                now.members.insert(key, cursor);
            }
        }
    }
    now.retained = x.retained.clone();
    now
}

/// Checkpoints stored by the engines of `mixed_work_until_power_cut`
/// before their power cuts (the checkpointer runs beside the work).
static CHECKPOINTS_DURING_RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Runs creates, deletes, appends, joins, leaves, ACKs, cursor flushes,
/// retention and checkpoints on one thread while another cuts the power
/// after a seeded number of operations. Returns what is durable: under
/// `always` every operation acknowledged; under `interval` and `never`
/// those acknowledged before a checkpoint that returned (storage.md
/// section 1: a power loss may lose the appends since the last
/// checkpoint), the others uncertain until then.
fn mixed_work_until_power_cut(root: &Path, c: &Config, start: Expected, seed: u64) -> Expected {
    use crate::io::power_cut::{Cut, PowerCutVfs};
    use std::sync::atomic::AtomicU64;
    let vfs = PowerCutVfs::new(root);
    let control = vfs.control.clone();
    // Every other run the power goes at an exact file operation counted
    // from the start of the open: often inside recovery or its checkpoint.
    let in_open = seed % 2 == 1;
    if in_open {
        control.freeze_after(1 + seed % 97);
    }
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    // What recovery rebuilt came from the disk alone, so it must survive
    // a cut during recovery too (format-spec/storage.md crash case 7).
    let x = check_mixed(&e, &start, &format!("{:?} seed {seed} at open", c.fsync));
    let ops = Arc::new(AtomicU64::new(0));
    let defer = c.fsync != crate::FsyncPolicy::Always;
    let driver = {
        let (stop, ops) = (control.clone(), ops.clone());
        std::thread::spawn(move || {
            let mut x = x;
            let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut rnd = |n: u64| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s % n
            };
            let mut acked = AckedCursors::default();
            let mut cmid = seed << 32;
            // Operations acknowledged but not yet made durable by a
            // checkpoint (`defer`), noted in order at the next one.
            let mut deferred: Vec<Record> = Vec::new();
            loop {
                let live: Vec<u64> = x
                    .groups
                    .keys()
                    .copied()
                    .filter(|g| !x.uncertain_groups.contains(g))
                    .collect();
                let g = if live.is_empty() {
                    0
                } else {
                    live[rnd(live.len() as u64) as usize]
                };
                let u = 1 + rnd(MIXED_USERS);
                let op = rnd(100);
                let settled = !x.uncertain_members.contains(&(g, u));
                // With every group waiting for a checkpoint to settle its
                // creation or deletion (`defer`), only a checkpoint moves on.
                let op = if g == 0 && defer && !x.uncertain_groups.is_empty() && op >= 50 {
                    99
                } else {
                    op
                };
                let mut durable_now = false;
                // Each arm does one operation and returns how to record it
                // if it returned before the cut.
                let record: Record = match op {
                    _ if (g == 0 && op < 95) || op < 5 => {
                        let g = 1 + rnd(MIXED_GROUPS);
                        if x.groups.contains_key(&g) || x.uncertain_groups.contains(&g) {
                            continue;
                        }
                        x.uncertain_groups.insert(g);
                        e.create_group(g).unwrap();
                        Box::new(move |x, _| {
                            x.uncertain_groups.remove(&g);
                            x.groups.insert(g, Default::default());
                            x.retained.remove(&g);
                        })
                    }
                    5..=7 => {
                        x.uncertain_groups.insert(g);
                        e.delete_group(g).unwrap();
                        Box::new(move |x, acked| {
                            x.uncertain_groups.remove(&g);
                            x.groups.remove(&g);
                            x.members.retain(|k, _| k.0 != g);
                            x.left.retain(|k| k.0 != g);
                            x.uncertain_members.retain(|k| k.0 != g);
                            acked.retain(|k, _| k.0 != g);
                        })
                    }
                    8..=50 => {
                        cmid += 1;
                        let a = e.append(g, 7, cmid, &payload(g, cmid)).unwrap();
                        let cmid = cmid;
                        Box::new(move |x, _| {
                            x.groups.get_mut(&g).unwrap().insert(a.msg_id, cmid);
                        })
                    }
                    51..=60 => {
                        if x.members.contains_key(&(g, u)) || !settled {
                            continue;
                        }
                        x.uncertain_members.insert((g, u));
                        let cursor = e.join(g, u, crate::JoinStart::Earliest).unwrap();
                        Box::new(move |x, _| {
                            x.uncertain_members.remove(&(g, u));
                            x.left.remove(&(g, u));
                            x.members.insert((g, u), cursor);
                        })
                    }
                    61..=63 => {
                        if !x.members.contains_key(&(g, u)) || !settled {
                            continue;
                        }
                        x.uncertain_members.insert((g, u));
                        e.leave(g, u).unwrap();
                        Box::new(move |x, acked| {
                            x.uncertain_members.remove(&(g, u));
                            x.members.remove(&(g, u));
                            acked.remove(&(g, u));
                            x.left.insert((g, u));
                        })
                    }
                    64..=85 => {
                        let Some(&min) = x.members.get(&(g, u)).filter(|_| settled) else {
                            continue;
                        };
                        let head = e.head(g).unwrap();
                        if head <= min {
                            continue;
                        }
                        let to = min + 1 + rnd(head - min);
                        let now = e.ack(g, u, to).unwrap();
                        Box::new(move |_, acked| {
                            let a = acked.entry((g, u)).or_default();
                            *a = (*a).max(now);
                        })
                    }
                    86..=91 => {
                        let covered = acked.clone();
                        e.flush_cursors().unwrap();
                        Box::new(move |x, _| {
                            for (k, v) in covered {
                                if let Some(m) = x.members.get_mut(&k) {
                                    *m = (*m).max(v);
                                }
                            }
                        })
                    }
                    92..=94 => {
                        let policy = crate::Retention {
                            max_bytes: 6000,
                            ..Default::default()
                        };
                        x.retained.insert(g); // from now on, whatever the cut
                        e.set_retention(g, policy).unwrap();
                        Box::new(|_, _| {})
                    }
                    _ => {
                        e.checkpoint().unwrap();
                        durable_now = true;
                        Box::new(|_, _| {})
                    }
                };
                // Returned while the power was on: every sync it waited for
                // happened before the cut.
                if stop.is_frozen() {
                    CHECKPOINTS_DURING_RUNS.fetch_add(e.stats().checkpoints, Ordering::SeqCst);
                    return x;
                }
                deferred.push(record);
                if !defer || durable_now {
                    for r in deferred.drain(..) {
                        r(&mut x, &mut acked);
                    }
                }
                ops.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let want = 10 + seed % 150;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !control.is_frozen()
        && ops.load(Ordering::SeqCst) < want
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    control.freeze();
    let x = driver.join().unwrap();
    control.cut(Cut::Seeded(seed)).unwrap();
    x
}

#[test]
fn power_cuts_during_mixed_work_lose_nothing_acknowledged() {
    let cuts = power_cuts(8);
    for seed in 0..cuts {
        let root = tempfile::tempdir().unwrap();
        let mut c = small_config(&root.path().join("data"));
        c.checkpoint_journal_bytes = 16 << 10; // checkpoints happen during the run
        c.journal_file_bytes = 4 << 10; // and journal rolls between them
        c.retention_check_ms = 5;
        c.load_in_background = background_every_other(seed);
        let mut x = Expected::default();
        // Three cuts in a row on one directory: each recovery's own writes
        // are subject to the next cut.
        for round in 0..3 {
            x = mixed_work_until_power_cut(root.path(), &c, x, seed * 3 + round);
        }
        let e = Engine::open(c.clone()).unwrap();
        check_mixed(&e, &x, &format!("seed {seed} final"));
    }
    // The checkpointer ran during the work, not only when asked at the
    // end: incremental checkpoints (their order of writes, syncs and
    // deletions) met the cuts.
    assert!(CHECKPOINTS_DURING_RUNS.load(Ordering::SeqCst) > cuts);
}

/// The mixed power-cut run with small groups on (records in the journal
/// and cold files, promoted past 1,500 bytes), under every fsync policy:
/// after each cut every group reads back (no small group left unreadable
/// by a checkpoint that named journal bytes a cut took back, storage.md
/// crash case S5) and holds what a checkpoint made durable.
#[test]
fn power_cuts_with_small_groups_lose_nothing_durable_under_every_fsync_policy() {
    let cuts = power_cuts(4);
    for fsync in [
        crate::FsyncPolicy::Always,
        crate::FsyncPolicy::Interval(std::time::Duration::from_millis(3)),
        crate::FsyncPolicy::Never,
    ] {
        for seed in 0..cuts {
            let root = tempfile::tempdir().unwrap();
            let mut c = small_config(&root.path().join("data"));
            c.fsync = fsync;
            c.small_group_bytes_max = 1500;
            c.checkpoint_journal_bytes = 16 << 10;
            c.journal_file_bytes = 4 << 10;
            c.retention_check_ms = 5;
            c.load_in_background = background_every_other(seed);
            let mut x = Expected::default();
            for round in 0..3 {
                x = mixed_work_until_power_cut(root.path(), &c, x, 1000 + seed * 3 + round);
            }
            let e = Engine::open(c.clone()).unwrap();
            check_mixed(&e, &x, &format!("{fsync:?} seed {seed} final"));
        }
    }
}

#[test]
fn a_power_cut_may_keep_later_pages_of_the_last_round_but_not_earlier_ones() {
    // The media assumptions let any subset of an unsynced write's pages
    // persist. Under fsync=always that write is the last round, which was
    // not acknowledged: the journal can end in valid entries after a hole,
    // and recovery must treat that as the torn tail it is (crash case 1),
    // not as damage to acknowledged data.
    use crate::io::power_cut::{Cut, PowerCutVfs};
    let mut holes = 0;
    let cuts = power_cuts(12);
    for seed in 0..cuts {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let mut c = small_config(&dir);
        c.cursor_flush_ms = 3_600_000;
        c.retention_check_ms = 3_600_000;
        c.load_in_background = background_every_other(seed);
        let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
        fill(&e, &[1], 3);
        // One round of 57 records (several pages): its journal write reaches
        // the page cache, and the power goes before its fdatasync.
        control.freeze_after(2);
        let msgs: Vec<(u64, u64)> = (4..=60).map(|i| (1, i)).collect();
        let payloads = batch_of(&msgs);
        e.append_batch(&requests(&msgs, &payloads)).unwrap();
        assert!(control.is_frozen(), "the cut came before the round's sync");
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let journal = std::fs::read(newest_file(&dir.join("journal"), ".tmj")).unwrap();
        let valid = crate::commit::journal::frames_of_file(&journal)
            .last()
            .map_or(crate::commit::journal::JOURNAL_HEADER_BYTES, |f| f.end);
        // Bytes of the torn frame that did not persist (a run of zeros no
        // frame holds), followed by bytes that did.
        let torn = &journal[valid..];
        let lost = torn.windows(64).position(|w| w.iter().all(|&b| b == 0));
        if lost.is_some_and(|at| torn[at..].iter().any(|&b| b != 0)) {
            holes += 1;
        }
        let e = Engine::open(c).unwrap();
        let head = e.head(1).unwrap();
        assert!((3..=60).contains(&head), "seed {seed}: head {head}");
        assert_dense_and_exact(&e, 1, head);
    }
    assert!(
        cuts < 12 || holes > 0,
        "some cut kept a page of the torn frame after a lost one"
    );
    println!("{holes} of {cuts} cuts kept a page of the torn frame after a lost one");
}

/// format-spec/protocol.md 4.6: once a group's deletion is accepted, every
/// call treats it as not found, also while the deletion waits for its
/// commit round; the per-user lists leave it out. One predicate
/// (`Group::is_deleting`) behind `Engine::group` decides this for all.
#[test]
fn a_group_whose_deletion_is_pending_is_not_found_by_any_call() {
    use crate::{JoinStart, Retention};
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(small_config(dir.path()), Arc::new(vfs)).unwrap();
    for g in [1, 2] {
        e.create_group(g).unwrap();
        e.join(g, 5, JoinStart::Earliest).unwrap();
        e.append(g, 100, 1, b"m1").unwrap();
        e.append(g, 100, 2, b"m2").unwrap();
    }
    // Released on drop too, so a failed assertion does not leave the engine's
    // shutdown waiting for a held sync.
    struct Release(Arc<crate::io::FaultControl>);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.hold_syncs.store(false, Ordering::SeqCst);
        }
    }
    let _release = Release(control.clone());
    control.hold_syncs.store(true, Ordering::SeqCst);
    let held = e
        .submit(&AppendRequest {
            group_id: 2,
            sender_id: 100,
            client_msg_id: 3,
            payload: b"held",
        })
        .unwrap();
    while control.syncs_held.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let delete = e.submit_delete_group(1).unwrap();
    let gone = |what: &str, r: Result<(), Error>| {
        assert!(
            matches!(r, Err(Error::GroupNotFound { group: 1 })),
            "{what}: {r:?}"
        );
    };
    gone("head", e.head(1).map(drop));
    gone("read", e.read(1, 0, 10, 1 << 16).map(drop));
    gone("pull", e.pull(1, 5, 10, 1 << 16, None).map(drop));
    gone(
        "pull with ack",
        e.pull(1, 5, 10, 1 << 16, Some(1)).map(drop),
    );
    gone("ack", e.ack(1, 5, 1).map(drop));
    gone("cursor", e.cursor(1, 5).map(drop));
    gone("history", e.history(1, 5, None, 10, usize::MAX).map(drop));
    gone("read_count", e.read_count(1, 1).map(drop));
    gone("members", e.members(1).map(drop));
    gone("members_version", e.members_version(1).map(drop));
    gone(
        "join of a member",
        e.submit_join(1, 5, JoinStart::Head).map(drop),
    );
    gone("join", e.submit_join(1, 6, JoinStart::Head).map(drop));
    gone("leave", e.submit_leave(1, 5).map(drop));
    gone("delete", e.submit_delete_group(1).map(drop));
    gone("set_retention", e.set_retention(1, Retention::default()));
    let send = AppendRequest {
        group_id: 1,
        sender_id: 100,
        client_msg_id: 9,
        payload: b"x",
    };
    gone("send", e.try_submit(&send).map(drop));
    let ticket = e.submit_batch(&[send]);
    gone("send batch", ticket.map(drop));
    assert!(!e.is_member(1, 5));
    let items = e.batch_ack(5, &[(1, 1), (2, 1)]);
    assert!(matches!(
        items[0].error,
        Some(Error::GroupNotFound { group: 1 })
    ));
    assert_eq!(items[0].cursor, 0);
    assert_eq!((items[1].error.is_none(), items[1].cursor), (true, 1));
    assert_eq!(
        e.unread(5).iter().map(|u| u.group_id).collect::<Vec<_>>(),
        vec![2]
    );
    let sync = e.sync(5, 10, 1 << 16, None).unwrap();
    assert_eq!(
        sync.groups
            .iter()
            .map(|g| g.unread.group_id)
            .collect::<Vec<_>>(),
        vec![2]
    );
    // The id is taken until the deletion completes.
    assert!(matches!(
        e.submit_create_group(1),
        Err(Error::GroupExists { group: 1 })
    ));
    assert!(
        e.poll_op(&delete).is_none(),
        "the deletion is still pending"
    );

    control.hold_syncs.store(false, Ordering::SeqCst);
    e.wait(held).unwrap();
    e.wait_op(delete).unwrap();
    gone("head after the delete", e.head(1).map(drop));
    e.create_group(1).unwrap();
    assert_eq!(e.head(1).unwrap(), 0);
}

/// format-spec/protocol.md 4.6 and storage.md section 12: a group created
/// again under a deleted group's id starts afresh: ids from 1 and an empty
/// dedup window, so a retransmit of a send to the old group is a new
/// message of the new one (also after a reopen, which replays both).
#[test]
fn a_group_created_again_does_not_keep_the_old_dedup_window() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(small_config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    for c in 1..=3 {
        e.append(1, 7, c, b"old").unwrap();
    }
    assert!(e.append(1, 7, 2, b"old").unwrap().duplicate);
    e.delete_group(1).unwrap();
    e.create_group(1).unwrap();
    let again = e.append(1, 7, 2, b"new").unwrap();
    assert_eq!((again.msg_id, again.duplicate), (1, false));
    e.simulate_crash();
    let e = Engine::open(small_config(dir.path())).unwrap();
    let retry = e.append(1, 7, 2, b"new").unwrap();
    assert_eq!((retry.msg_id, retry.duplicate), (1, true));
    let other = e.append(1, 7, 3, b"new").unwrap();
    assert_eq!((other.msg_id, other.duplicate), (2, false));
}

/// An engine under `fsync never` on a file system that power cuts can
/// take back, in `root/data`, that neither checkpoints, flushes cursors
/// nor checks retention by itself: what a test writes after its own
/// `checkpoint()` is only in the journal when the power is cut.
fn open_never_synced_on_power_cuts(
    root: &Path,
) -> (Config, Engine, Arc<crate::io::power_cut::PowerControl>) {
    let mut c = small_config(&root.join("data"));
    c.fsync = FsyncPolicy::Never;
    c.checkpoint_journal_bytes = 1 << 30;
    c.cursor_flush_ms = 3_600_000;
    c.retention_check_ms = 3_600_000;
    let vfs = crate::io::power_cut::PowerCutVfs::new(root);
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    (c, e, control)
}

/// Under `never` a DeleteGroup is acknowledged before its frame is
/// durable, so a power cut may take the deletion back. Whatever the cut
/// keeps of the directory changes the deletion made (its move to the trash,
/// the removal of its files), a group that comes back comes back whole.
#[test]
fn a_deletion_a_power_cut_takes_back_leaves_the_group_whole() {
    use crate::io::power_cut::Cut;
    let mut back = 0;
    for seed in 0..power_cuts(24) {
        let root = tempfile::tempdir().unwrap();
        let (c, e, control) = open_never_synced_on_power_cuts(root.path());
        fill(&e, &[1], 30);
        // Durable: a manifest names group 1 and its segments.
        e.checkpoint().unwrap();
        e.delete_group(1).unwrap();
        // Whatever the worker does with the deleted group's files, it has
        // done it before the cut.
        e.wait_worker_idle();
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let e = Engine::open(c).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        match e.head(1) {
            Err(Error::GroupNotFound { .. }) => {}
            Ok(head) => {
                back += 1;
                assert_eq!(head, 30, "seed {seed}");
                assert_dense_and_exact(&e, 1, 30);
            }
            Err(other) => panic!("seed {seed}: {other}"),
        }
        e.close().unwrap();
    }
    assert!(back > 0, "some cut took the deletion back");
}

/// As above, with the id created again and written to before the cut:
/// the new incarnation's files take the old one's path, so the old
/// directory may move only once the deletion is durable. A group that
/// comes back is the old one whole or the new one, never a mix.
#[test]
fn a_group_created_again_after_a_deletion_a_power_cut_takes_back_is_never_a_mix() {
    use crate::io::power_cut::Cut;
    let (mut old_back, mut new_back) = (0, 0);
    for seed in 0..power_cuts(24) {
        let root = tempfile::tempdir().unwrap();
        let (c, e, control) = open_never_synced_on_power_cuts(root.path());
        fill(&e, &[1], 30);
        e.checkpoint().unwrap();
        e.delete_group(1).unwrap();
        e.create_group(1).unwrap();
        for i in 1..=5u64 {
            let a = e
                .append(1, 9, 500 + i, format!("new-{i}").as_bytes())
                .unwrap();
            assert_eq!(a.msg_id, i);
        }
        e.wait_worker_idle();
        e.simulate_crash();
        control.cut(Cut::Seeded(seed)).unwrap();
        let e = Engine::open(c).unwrap_or_else(|err| panic!("seed {seed}: {err}"));
        match e.head(1) {
            Err(Error::GroupNotFound { .. }) => {}
            Ok(30) => {
                old_back += 1;
                assert_dense_and_exact(&e, 1, 30);
            }
            Ok(head) => {
                new_back += 1;
                let all = read_all(&e, 1);
                assert_eq!(all.len() as u64, head, "seed {seed}");
                for (id, p) in all {
                    assert_eq!(p, format!("new-{id}").into_bytes(), "seed {seed}: {id}");
                }
            }
            Err(other) => panic!("seed {seed}: {other}"),
        }
        e.close().unwrap();
    }
    assert!(old_back + new_back > 0, "some cut kept group 1");
}
