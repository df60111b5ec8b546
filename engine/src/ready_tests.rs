//! Nothing a request needs waits for the disk (ARCHITECTURE.md, "Nothing
//! waits for a disk"): a group's first use after open is
//! read by the maintenance worker while requests to other groups go on,
//! creating a group makes no file-system call on the caller's thread,
//! deleting one holds no lock while its files are removed, and a crash
//! mid-delete leaves trash that the next open removes.
//!
//! The disk is held with a latch of `FaultyVfs` (reads, listings and
//! removals of paths containing a group's directory name wait until the
//! test releases them), never with a sleep. A test runs the requests that
//! must not wait on a helper thread and fails if they do not finish while
//! the latch is held (a generous deadline stands for "never"; no timing is
//! asserted).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use crate::io::{FaultControl, FaultyVfs, OsVfs, Vfs};
use crate::{Config, Engine, Error};

/// How long a helper thread may take before the test calls it stuck: only
/// a request blocked on the held disk comes near it.
const STUCK: Duration = Duration::from_secs(60);

const A: u64 = 0xA1;
const B: u64 = 0xB2;

/// The directory name of a group (`groups/<shard>/<16 hex digits>`), which
/// also starts its trash entry's name.
fn fragment(group: u64) -> String {
    format!("{group:016x}")
}

fn config(dir: &Path) -> Config {
    let mut c = Config::segmented(dir);
    c.payload_bytes_max = 1024;
    c.segment_bytes_max = 8192;
    c.index_interval_bytes = 512;
    c
}

fn payload(group: u64, i: u64) -> Vec<u8> {
    format!("g{group}-m{i};")
        .repeat(1 + (i % 7) as usize)
        .into_bytes()
}

fn fill(e: &Engine, group: u64, n: u64) {
    e.create_group(group).unwrap();
    for i in 1..=n {
        e.append(group, 100, i, &payload(group, i)).unwrap();
    }
}

fn payloads(batch: &crate::ReadBatch) -> Vec<(u64, Vec<u8>)> {
    batch
        .records()
        .map(|r| (r.header.msg_id, r.payload().to_vec()))
        .collect()
}

fn open_faulty(dir: &Path) -> (Engine, Arc<FaultControl>) {
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    (
        Engine::open_with_vfs(config(dir), Arc::new(vfs)).unwrap(),
        control,
    )
}

/// Runs a `try_` request until it is not `NotReady`, waiting for the
/// worker in between (what the server's parking amounts to).
fn when_ready<T>(e: &Engine, f: impl Fn(&Engine) -> crate::Result<T>) -> T {
    loop {
        match f(e) {
            Ok(v) => return v,
            Err(Error::NotReady { ticket, .. }) => e.wait_ready(ticket).unwrap(),
            Err(other) => panic!("{other}"),
        }
    }
}

/// Waits until an operation of the file layer waits on the latch (the
/// worker reached the held disk).
fn until_held(control: &FaultControl) {
    while control.ops_held.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs `f` on a helper thread and returns its result, or releases the
/// latch and fails the test if it is stuck (it waited on the held disk).
fn must_not_wait<R: Send + 'static>(
    control: &FaultControl,
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(STUCK) {
        Ok(r) => {
            worker.join().unwrap();
            r
        }
        Err(_) => {
            // Not joined: it may wait for something that never comes now.
            control.release_paths();
            panic!("{what} waited for the disk held for another group");
        }
    }
}

#[test]
fn a_groups_first_use_after_reopen_is_read_by_the_worker_while_other_groups_are_served() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = Engine::open(config(dir.path())).unwrap();
        fill(&e, A, 300); // several sealed segments and an active one
        fill(&e, B, 5);
        // A clean stop: the checkpoint covers everything, so the open
        // replays nothing and leaves both groups unloaded (a replay would
        // load the groups it meets).
        e.close().unwrap();
    }
    let (e, control) = open_faulty(dir.path());
    let e = Arc::new(e);
    // B is used (loaded, send path ready) before A's disk is held.
    assert_eq!(e.read(B, 0, 100, 1 << 20).unwrap().count, 5);
    e.append(B, 100, 6, &payload(B, 6)).unwrap();
    control.hold_paths_containing(&fragment(A));

    let e2 = e.clone();
    let ticket = must_not_wait(&control, "a first read of group A", move || {
        match e2.try_read(A, 290, 100, 1 << 20) {
            Err(Error::NotReady { group, ticket }) => {
                assert_eq!(group, A);
                ticket
            }
            Err(other) => panic!("expected NotReady, got {other}"),
            Ok(b) => panic!("read {} records of a group whose disk is held", b.count),
        }
    });
    until_held(&control);
    assert!(e.settled_load() < ticket, "A's load waits on the held disk");
    let e2 = e.clone();
    must_not_wait(&control, "requests to group B and a create", move || {
        assert_eq!(e2.head(B).unwrap(), 6);
        assert_eq!(e2.read(B, 0, 100, 1 << 20).unwrap().count, 6);
        e2.create_group(0xC3).unwrap();
        e2.append(B, 100, 7, &payload(B, 7)).unwrap();
        assert_eq!(
            e2.head(A).unwrap(),
            300,
            "A's head is known from the checkpoint"
        );
        // A's other requests do not wait either.
        assert!(matches!(
            e2.try_pull(A, 1, 10, 1 << 20, None),
            Err(Error::NotMember { .. }) | Err(Error::NotReady { .. })
        ));
    });
    control.release_paths();
    e.wait_ready(ticket).unwrap();
    assert!(e.settled_load() >= ticket);
    assert_eq!(e.stats().group_loads, 2, "B, then A, loaded by the worker");

    // Now A answers as it would have at once: verified data, in order;
    // its sealed segments' indexes are built by the worker too.
    let tail = when_ready(&e, |e| e.try_read(A, 290, 100, 1 << 20));
    let want: Vec<_> = (291..=300).map(|i| (i, payload(A, i))).collect();
    assert_eq!(payloads(&tail), want);
    let loads = e.stats().group_loads;
    let first = when_ready(&e, |e| e.try_read(A, 0, 3, 1 << 20));
    assert_eq!(e.stats().group_loads, loads, "an index build is not a load");
    let want: Vec<_> = (1..=3).map(|i| (i, payload(A, i))).collect();
    assert_eq!(payloads(&first), want);
    // The first send rebuilds the dedup window on the worker: a retransmit
    // of message 300 is recognised.
    let retransmit = crate::AppendRequest {
        group_id: A,
        sender_id: 100,
        client_msg_id: 300,
        payload: &payload(A, 300),
    };
    let ticket = match e.try_submit(&retransmit) {
        Err(Error::NotReady { ticket, .. }) => ticket,
        other => panic!("expected NotReady, got {:?}", other.map(|t| t.appended)),
    };
    e.wait_ready(ticket).unwrap();
    let t = e.try_submit(&retransmit).unwrap();
    assert!(t.appended.duplicate);
    assert_eq!(t.appended.msg_id, 300);
}

#[test]
fn damage_found_by_the_worker_is_group_damaged_for_the_request() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = Engine::open(config(dir.path())).unwrap();
        fill(&e, A, 20);
        e.close().unwrap();
    }
    // Flip a byte inside the first record of A's only segment.
    let seg_dir = crate::logs::group_log::group_dir(dir.path(), A);
    let seg = std::fs::read_dir(&seg_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = crate::logs::segment::SEGMENT_HEADER_BYTES + 40;
    bytes[at] ^= 0xFF;
    std::fs::write(&seg, &bytes).unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    let ticket = match e.try_read(A, 0, 10, 1 << 20) {
        Err(Error::NotReady { ticket, .. }) => ticket,
        other => panic!("expected NotReady, got {:?}", other.map(|b| b.count)),
    };
    e.wait_ready(ticket).unwrap();
    assert!(matches!(
        e.try_read(A, 0, 10, 1 << 20),
        Err(Error::GroupDamaged { group: A, .. })
    ));
    assert!(matches!(
        e.read(A, 0, 10, 1 << 20),
        Err(Error::GroupDamaged { group: A, .. })
    ));
    assert!(matches!(
        e.try_submit_join(A, 5, crate::JoinStart::Head),
        Err(Error::GroupDamaged { group: A, .. })
    ));
}

#[test]
fn deleting_a_big_group_holds_no_lock_while_its_files_are_removed() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = open_faulty(dir.path());
    let e = Arc::new(e);
    fill(&e, A, 300);
    fill(&e, B, 5);
    let group_dir = e.shared.ctx.group_dir(A);
    assert!(group_dir.exists());
    control.hold_paths_containing(&fragment(A));
    let e2 = e.clone();
    let c2 = control.clone();
    must_not_wait(
        &control,
        "the deletion and requests to group B",
        move || {
            e2.delete_group(A).unwrap();
            // The files are being removed (the removal waits on the latch)...
            until_held(&c2);
            // ...and nothing else waits for them.
            assert!(matches!(e2.head(A), Err(Error::GroupNotFound { .. })));
            assert_eq!(e2.head(B).unwrap(), 5);
            assert_eq!(e2.read(B, 0, 100, 1 << 20).unwrap().count, 5);
            e2.create_group(0xC3).unwrap();
            e2.append(B, 100, 6, &payload(B, 6)).unwrap();
            // The id can be created again at once; its files are new.
            e2.create_group(A).unwrap();
            e2.append(A, 100, 1, b"new").unwrap();
        },
    );
    assert!(!e.shared.ctx.trash.entries(&OsVfs).is_empty());
    control.release_paths();
    e.wait_worker_idle();
    assert!(
        e.shared.ctx.trash.entries(&OsVfs).is_empty(),
        "trash emptied"
    );
    let batch = e.read(A, 0, 10, 1 << 20).unwrap();
    assert_eq!(payloads(&batch), vec![(1, b"new".to_vec())]);
}

#[test]
fn create_group_makes_no_file_system_call_on_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = open_faulty(dir.path());
    let me = std::thread::current().id();
    let before = control.ops_on(me);
    let ticket = e.submit_create_group(7).unwrap();
    assert_eq!(
        control.ops_on(me) - before,
        0,
        "create_group touched the file system on the caller's thread"
    );
    // Appends may follow at once; the commit thread made the files.
    let send = e
        .submit(&crate::AppendRequest {
            group_id: 7,
            sender_id: 1,
            client_msg_id: 1,
            payload: b"hello",
        })
        .unwrap();
    e.wait_op(ticket).unwrap();
    e.wait(send).unwrap();
    assert!(e
        .shared
        .ctx
        .group_dir(7)
        .join(crate::logs::segment::file_name(1))
        .exists());
    e.close().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(e.read(7, 0, 10, 1 << 20).unwrap().count, 1);
}

#[test]
fn a_crash_mid_delete_leaves_no_group_and_the_next_open_empties_the_trash() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = open_faulty(dir.path());
    fill(&e, A, 300);
    fill(&e, B, 5);
    control.hold_paths_containing(&fragment(A));
    e.delete_group(A).unwrap();
    until_held(&control);
    // Crash while the removal is under way: the engine stops between two
    // of its steps (the held one finishes once released; the rest never
    // runs: the worker is stopping by then).
    let shared = e.shared.clone();
    let crash = std::thread::spawn(move || e.simulate_crash());
    while shared.worker.settled() != u64::MAX {
        std::thread::sleep(Duration::from_millis(1));
    }
    control.release_paths();
    crash.join().unwrap();
    drop(shared);
    let trash = dir.path().join("groups").join("trash");
    let left: Vec<_> = std::fs::read_dir(&trash).unwrap().collect();
    assert_eq!(left.len(), 1, "the deleted group's files are in the trash");
    assert!(!crate::logs::group_log::group_dir(dir.path(), A).exists());

    let e = Engine::open(config(dir.path())).unwrap();
    assert!(matches!(e.head(A), Err(Error::GroupNotFound { .. })));
    assert_eq!(e.group_ids(), vec![B]);
    e.wait_worker_idle();
    let left = OsVfs.read_dir(&trash).unwrap();
    assert!(left.is_empty(), "the open removed the trash: {left:?}");
    assert_eq!(e.read(B, 0, 10, 1 << 20).unwrap().count, 5);
}

// --- with the idle sweep (storage v2 step S3) -------------------------

/// An engine whose own idle sweep never finds a group idle (a minute), so
/// only `sweep_idle` (the same sweep, a minute later) evicts.
fn open_idle(dir: &Path) -> Engine {
    let mut c = config(dir);
    c.idle_evict_ms = 60_000;
    Engine::open(c).unwrap()
}

/// Runs the commit thread's idle sweep as if a minute had passed.
fn sweep_idle(e: &Engine) {
    while crate::commit::thread::evict_idle(&e.shared, crate::clock::now_ms() + 60_000, usize::MAX)
    {
    }
}

/// True if the group holds neither a send state nor a loaded log.
fn evicted(e: &Engine, group: u64) -> bool {
    let g = e.shared.catalog.read().get(group).cloned().unwrap();
    let none = g.assign.lock().is_none();
    none && matches!(&*g.log.read(), crate::group::LogSlot::Unloaded(_))
}

#[test]
fn a_send_to_a_new_group_needs_no_worker_job() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_idle(dir.path());
    e.create_group(A).unwrap();
    let req = crate::AppendRequest {
        group_id: A,
        sender_id: 100,
        client_msg_id: 1,
        payload: b"first",
    };
    // Its log is in memory and holds no record: an empty window, no disk.
    let ticket = e.try_submit(&req).unwrap();
    assert_eq!(ticket.appended.msg_id, 1);
    e.wait(ticket).unwrap();
    assert_eq!(e.stats().group_loads, 0);
}

/// The idle sweep may evict what the worker built for a request (the
/// loaded log, the send state) before that request runs again: the request
/// then gets `NotReady` with a new job, never the settled ticket again (a
/// server would retry it at once, forever) and never a hang; and what the
/// worker loads is listed for the sweep like any use.
#[test]
fn an_idle_sweep_between_the_workers_job_and_the_request_costs_a_new_job() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_idle(dir.path());
    e.create_group(A).unwrap();
    let first = e.append(A, 100, 1, b"one").unwrap();
    e.checkpoint().unwrap();
    sweep_idle(&e);
    assert!(evicted(&e, A));
    let req = crate::AppendRequest {
        group_id: A,
        sender_id: 100,
        client_msg_id: 1,
        payload: b"one",
    };
    let not_ready = |r: crate::Result<crate::Ticket>| match r {
        Err(Error::NotReady { group, ticket }) if group == A => ticket,
        other => panic!("expected NotReady, got {other:?}"),
    };

    let t1 = not_ready(e.try_submit(&req));
    e.wait_ready(t1).unwrap();
    assert!(
        !evicted(&e, A),
        "the worker loaded the log and built the state"
    );
    {
        let g = e.shared.catalog.read().get(A).cloned().unwrap();
        let assign = g.assign.lock();
        let log = g.log.read();
        assert!(assign.is_some() && matches!(&*log, crate::group::LogSlot::Loaded(_)));
    }
    sweep_idle(&e);
    assert!(
        evicted(&e, A),
        "the worker's load and state are listed for the sweep"
    );
    let t2 = not_ready(e.try_submit(&req));
    assert!(t2 > t1, "a new job ({t2}), not the settled one ({t1})");
    e.wait_ready(t2).unwrap();
    let again = e.try_submit(&req).unwrap();
    assert!(
        again.appended.duplicate,
        "the rebuilt window knows the send"
    );
    assert_eq!(again.appended.msg_id, first.msg_id);

    // A read: the same with the log alone.
    sweep_idle(&e);
    assert!(evicted(&e, A));
    let read_ticket = |r: crate::Result<crate::ReadBatch>| match r {
        Err(Error::NotReady { ticket, .. }) => ticket,
        other => panic!("expected NotReady, got {:?}", other.map(|b| b.count)),
    };
    let t3 = read_ticket(e.try_read(A, 0, 10, 1 << 20));
    e.wait_ready(t3).unwrap();
    sweep_idle(&e);
    assert!(
        evicted(&e, A),
        "a log loaded for a read is listed for the sweep"
    );
    let t4 = read_ticket(e.try_read(A, 0, 10, 1 << 20));
    assert!(t4 > t3);
    e.wait_ready(t4).unwrap();
    assert_eq!(e.try_read(A, 0, 10, 1 << 20).unwrap().count, 1);
    assert_eq!(e.stats().group_loads, 4);
}

/// A join needs only the assigned head, which without a send state is the
/// log's head, loaded or not: it loads nothing, builds no window and queues
/// no worker job.
#[test]
fn a_join_to_an_idle_group_reads_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_idle(dir.path());
    e.create_group(A).unwrap();
    e.append(A, 100, 1, b"one").unwrap();
    e.append(A, 100, 2, b"two").unwrap();
    e.checkpoint().unwrap();
    sweep_idle(&e);
    assert!(evicted(&e, A));
    let at_head = e.try_submit_join(A, 7, crate::JoinStart::Head).unwrap();
    assert_eq!(e.wait_op(at_head).unwrap(), 2);
    let earliest = e.try_submit_join(A, 8, crate::JoinStart::Earliest).unwrap();
    assert_eq!(e.wait_op(earliest).unwrap(), 0);
    assert!(evicted(&e, A), "nothing loaded or built for the joins");
    assert_eq!(e.stats().group_loads, 0);
    assert_eq!(e.stats().dedup_entries, 0);
    // The next send still finds its retransmit.
    assert!(e.append(A, 100, 2, b"two").unwrap().duplicate);
}

/// Logs that recovery loaded (here: replay applying records to a group the
/// checkpoint left unloaded) are listed for the idle sweep like any other.
#[test]
fn a_log_loaded_by_recovery_leaves_memory_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_idle(dir.path());
    e.create_group(A).unwrap();
    e.append(A, 100, 1, b"one").unwrap();
    e.checkpoint().unwrap();
    e.append(A, 100, 2, b"two").unwrap();
    e.simulate_crash();
    let e = open_idle(dir.path());
    {
        let g = e.shared.catalog.read().get(A).cloned().unwrap();
        assert!(matches!(&*g.log.read(), crate::group::LogSlot::Loaded(_)));
    }
    assert_eq!(e.stats().groups_in_use, 1);
    // The checkpoint after a crash (on the checkpointer thread, storage
    // v2 S4) makes the replayed records durable; then the log may go.
    e.checkpoint().unwrap();
    sweep_idle(&e);
    assert!(evicted(&e, A), "the replayed log left memory");
    assert_eq!(e.read(A, 0, 10, 1 << 20).unwrap().count, 2);
}

/// A follower whose group went idle (send state dropped, log unloaded)
/// takes the leader's next round: the worker builds the state, the payload
/// waits for it and is checked again.
#[test]
fn a_replicated_round_to_an_idle_group_waits_for_the_worker() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (leader, follower) = (open_idle(da.path()), open_idle(db.path()));
    let catch_up = || {
        let from = follower.last_round() + 1;
        for r in leader
            .read_rounds(from, leader.last_round(), usize::MAX)
            .unwrap()
        {
            assert_eq!(follower.append_replicated(&r.bytes).unwrap(), r.round_index);
        }
    };
    leader.create_group(A).unwrap();
    leader.append(A, 100, 1, b"one").unwrap();
    catch_up();
    follower.checkpoint().unwrap();
    sweep_idle(&follower);
    assert!(evicted(&follower, A));
    leader.append(A, 100, 2, b"two").unwrap();
    catch_up();
    assert_eq!(follower.stats().group_loads, 1);
    assert_eq!(follower.read(A, 0, 10, 1 << 20).unwrap().count, 2);
    // The state the worker built counted the replicated record in.
    assert!(follower.append(A, 100, 2, b"two").unwrap().duplicate);
}
