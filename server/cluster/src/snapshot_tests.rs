//! Tests of snapshot streams and installs (`snapshot.rs`, cluster.md
//! section 8): an engine's snapshot streamed and received opens to the same
//! state; malformed streams, and streams beyond what they announced or the
//! free space, are refused and leave nothing installed; one stream at a
//! time, only newer snapshots, and a stream being received is never
//! disturbed by an install; a crash at each step of an install either
//! finishes it or discards it; an install never leaves a commit index
//! past the log, and a log that has one (an older version's) opens.

use std::path::Path;

use raft::eraftpb::{Message, MessageType, Snapshot};
use tidemark_engine::{Config, Engine};

use crate::raft_log::{encode_record, RECORD_HEADER_BYTES};
use crate::sim_tests::{state_of, GroupState};
use crate::snapshot::{self, descriptor, Inbox, PREAMBLE};

fn peers() -> crate::members::KnownPeers {
    crate::members::KnownPeers::new(vec![1, 2, 3])
}

/// The inbox of a replica directory with no reserve.
fn inbox(dir: &Path) -> Inbox {
    Inbox::new(dir, 0, 0)
}

/// A `MsgSnapshot` from 1 to 2 at (`index`, `term`).
fn msg(index: u64, term: u64, last_round: u64) -> Message {
    let mut s = Snapshot {
        data: descriptor(last_round).into(),
        ..Default::default()
    };
    s.mut_metadata().index = index;
    s.mut_metadata().term = term;
    s.mut_metadata().mut_conf_state().voters = vec![1, 2, 3];
    let mut m = Message {
        from: 1,
        to: 2,
        term,
        ..Default::default()
    };
    m.set_msg_type(MessageType::MsgSnapshot);
    m.set_snapshot(s);
    m
}

/// An engine in `dir` with two groups and some records; its state and
/// last round.
fn engine_with_data(dir: &Path) -> (Engine, Vec<GroupState>) {
    let mut cfg = Config::new(dir);
    // Small files (as the replica tests use): the snapshot spans several
    // journal files and segments.
    cfg.payload_bytes_max = 1024;
    cfg.segment_bytes_max = 8192;
    cfg.index_interval_bytes = 512;
    cfg.commit_round_bytes_max = 256 << 10;
    cfg.journal_file_bytes = 4096;
    let e = Engine::open(cfg).unwrap();
    for g in [5, 6] {
        e.create_group(g).unwrap();
        for i in 1..=200u64 {
            e.append(g, 9, i, format!("message {i} of {g}").as_bytes())
                .unwrap();
        }
    }
    let state = state_of(&e);
    (e, state)
}

/// The stream of `e`'s snapshot for `msg`, without its preamble.
fn stream_of(e: &Engine, m: &Message) -> Vec<u8> {
    let snap = e.snapshot().unwrap();
    let mut out = Vec::new();
    snapshot::write_stream(&mut out, m, &snap).unwrap();
    assert_eq!(out[..8], PREAMBLE);
    out.split_off(8)
}

#[test]
fn a_streamed_snapshot_opens_to_the_engine_it_was_taken_from() {
    let src = tempfile::tempdir().unwrap();
    let (e, state) = engine_with_data(src.path());
    let m = msg(40, 3, e.last_round());
    let stream = stream_of(&e, &m);
    let replica = tempfile::tempdir().unwrap();
    let inbox = inbox(replica.path());
    let got = snapshot::receive(&mut &stream[..], &inbox, 2, &peers()).unwrap();
    assert_eq!(got, m);
    // The install's steps, as the driver takes them (no engine before).
    inbox.stage(40, 3).unwrap();
    snapshot::finish(replica.path(), 40, 3).unwrap();
    let copy = Engine::open(Config::new(replica.path().join("engine"))).unwrap();
    assert_eq!(copy.last_round(), e.last_round());
    assert_eq!(state_of(&copy), state);
    // Nothing left staged (`snap-in/` itself stays until the next start:
    // a stream may be writing under it).
    let left = std::fs::read_dir(replica.path().join("snap-in"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "snap-in/ holds nothing");
    assert!(!replica.path().join("install-40-3").exists());
}

#[test]
fn malformed_streams_are_refused_and_leave_nothing_to_install() {
    let src = tempfile::tempdir().unwrap();
    let (e, _) = engine_with_data(src.path());
    let m = msg(40, 3, e.last_round());
    let good = stream_of(&e, &m);
    let replica = tempfile::tempdir().unwrap();
    let inbox = inbox(replica.path());
    let refused = |bytes: &[u8], me: u64| {
        let r = snapshot::receive(&mut &bytes[..], &inbox, me, &peers());
        assert!(r.is_err(), "a bad stream was taken");
        assert!(!replica.path().join("snap-in/40-3").exists());
        // Nothing of it stays: its staging directory is removed.
        let left: Vec<_> = std::fs::read_dir(replica.path().join("snap-in"))
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "a refused stream left {left:?}");
    };
    // Addressed to another node.
    refused(&good, 3);
    // A flipped bit in a chunk: its CRC.
    let mut flipped = good.clone();
    let at = good.len() / 2;
    flipped[at] ^= 1;
    refused(&flipped, 2);
    // Cut before its End.
    refused(&good[..good.len() - 10], 2);
    // A file name that climbs out of the staging directory.
    let mut evil = good[..RECORD_HEADER_BYTES + snapshot::BEGIN_BYTES].to_vec();
    encode_record(&mut evil, snapshot::KIND_FILE, |b| {
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&(9u16).to_le_bytes());
        b.extend_from_slice(&[0; 6]);
        b.extend_from_slice(b"../escape");
    });
    encode_record(&mut evil, snapshot::KIND_CHUNK, |b| b.push(b'x'));
    refused(&evil, 2);
    assert!(!replica.path().join("escape").exists());
    // A record past the bound.
    let mut huge = good[..RECORD_HEADER_BYTES + snapshot::BEGIN_BYTES].to_vec();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    huge.extend_from_slice(&[0; 12]);
    refused(&huge, 2);
    // A file longer than the whole stream's announced total.
    let mut over = Vec::new();
    snapshot::encode_begin(&mut over, [1, 2, 40, 3, 7, 4]);
    snapshot::encode_file(&mut over, "FORMAT", 5).unwrap();
    encode_record(&mut over, snapshot::KIND_CHUNK, |b| {
        b.extend_from_slice(b"hello")
    });
    refused(&over, 2);
    // Files adding up past the total, each within it.
    let mut over = Vec::new();
    snapshot::encode_begin(&mut over, [1, 2, 40, 3, 7, 8]);
    for name in ["a", "b"] {
        snapshot::encode_file(&mut over, name, 5).unwrap();
        encode_record(&mut over, snapshot::KIND_CHUNK, |b| {
            b.extend_from_slice(b"hello")
        });
    }
    refused(&over, 2);
    // Nothing was staged, so there is nothing to install.
    assert!(inbox.stage(40, 3).is_err());
    // The good one is taken after all that.
    snapshot::receive(&mut &good[..], &inbox, 2, &peers()).unwrap();
    inbox.stage(40, 3).unwrap();
}

#[test]
fn a_stream_larger_than_the_free_space_above_the_reserve_is_refused_before_a_byte() {
    let src = tempfile::tempdir().unwrap();
    let (e, _) = engine_with_data(src.path());
    let good = stream_of(&e, &msg(40, 3, e.last_round()));
    let replica = tempfile::tempdir().unwrap();
    // A reserve of all but a few bytes of what is free.
    let free = snapshot::free_bytes(replica.path()).unwrap();
    let tight = Inbox::new(replica.path(), 0, free.saturating_sub(1000));
    let r = snapshot::receive(&mut &good[..], &tight, 2, &peers());
    assert!(
        matches!(&r, Err(crate::ClusterError::SnapshotRefused { reason }) if reason.contains("free")),
        "{r:?}"
    );
    assert!(!replica.path().join("snap-in").exists(), "nothing written");
    // With room it is taken.
    snapshot::receive(&mut &good[..], &inbox(replica.path()), 2, &peers()).unwrap();
}

#[test]
fn an_older_leaders_stream_without_a_total_is_taken() {
    let src = tempfile::tempdir().unwrap();
    let (e, state) = engine_with_data(src.path());
    let m = msg(40, 3, e.last_round());
    let new = stream_of(&e, &m);
    // The same stream with the 40-byte Begin of an older version.
    let begin_len = RECORD_HEADER_BYTES + snapshot::BEGIN_BYTES;
    let mut old = Vec::new();
    encode_record(&mut old, snapshot::KIND_BEGIN, |b| {
        b.extend_from_slice(
            &new[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + snapshot::BEGIN_V1_BYTES],
        )
    });
    old.extend_from_slice(&new[begin_len..]);
    let replica = tempfile::tempdir().unwrap();
    let inbox = inbox(replica.path());
    assert_eq!(
        snapshot::receive(&mut &old[..], &inbox, 2, &peers()).unwrap(),
        m
    );
    inbox.stage(40, 3).unwrap();
    snapshot::finish(replica.path(), 40, 3).unwrap();
    let copy = Engine::open(Config::new(replica.path().join("engine"))).unwrap();
    assert_eq!(state_of(&copy), state);
}

/// A stream read from a socket the test writes in two parts: the reader
/// blocks in the middle, as a stream arriving over the network does.
struct HalfSent {
    rest: Vec<u8>,
    w: std::os::unix::net::UnixStream,
    reader: std::thread::JoinHandle<crate::Result<Message>>,
}

impl HalfSent {
    /// Sends the first `at` bytes of `stream` to `inbox`, read on a thread
    /// of its own, and waits until the stream is being received (its
    /// staging directory exists).
    fn start(dir: &Path, inbox: &std::sync::Arc<Inbox>, stream: &[u8], at: usize) -> HalfSent {
        use std::io::Write;
        let (mut w, mut r) = std::os::unix::net::UnixStream::pair().unwrap();
        let inbox = inbox.clone();
        let reader = std::thread::spawn(move || snapshot::receive(&mut r, &inbox, 2, &peers()));
        w.write_all(&stream[..at]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while staging_dirs(dir).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the stream never started"
            );
            assert!(!reader.is_finished(), "the stream ended early");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        HalfSent {
            rest: stream[at..].to_vec(),
            w,
            reader,
        }
    }

    /// Sends the rest; the reader's result.
    fn finish(mut self) -> crate::Result<Message> {
        use std::io::Write;
        // The reader may have stopped already (refused): then the write
        // fails, and its result says why.
        let _ = self.w.write_all(&self.rest);
        drop(self.w);
        self.reader.join().unwrap()
    }
}

/// The `tmp-*` staging directories under `dir/snap-in`.
fn staging_dirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir.join("snap-in"))
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tmp-"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn one_stream_at_a_time_and_only_newer_snapshots_are_taken() {
    let src = tempfile::tempdir().unwrap();
    let (e, _) = engine_with_data(src.path());
    let at = |index| stream_of(&e, &msg(index, 3, e.last_round()));
    let (s40, s50) = (at(40), at(50));
    let replica = tempfile::tempdir().unwrap();
    let dir = replica.path();
    let inbox = std::sync::Arc::new(inbox(dir));
    let receive = |s: &[u8]| snapshot::receive(&mut &s[..], &inbox, 2, &peers());
    let busy = |r: crate::Result<Message>| {
        assert!(
            matches!(&r, Err(crate::ClusterError::SnapshotRefused { .. })),
            "{r:?}"
        );
    };

    // Two streams of the same snapshot at once: the second is refused,
    // the first goes on undisturbed and is staged once.
    let first = HalfSent::start(dir, &inbox, &s40, s40.len() / 2);
    busy(receive(&s40));
    // An older one, and a newer one, while it runs: refused too.
    busy(receive(&at(30)));
    busy(receive(&s50));
    assert_eq!(staging_dirs(dir).len(), 1, "only the first one writes");
    first.finish().unwrap();
    assert!(dir.join("snap-in/40-3").is_dir());
    assert!(staging_dirs(dir).is_empty());
    // Staged: the same one again, or an older one, is refused.
    busy(receive(&s40));
    busy(receive(&at(30)));

    // A newer one is received while the staged one is installed: the
    // install neither waits for it nor disturbs it.
    let newer = HalfSent::start(dir, &inbox, &s50, s50.len() / 3);
    inbox.stage(40, 3).unwrap();
    snapshot::finish(dir, 40, 3).unwrap();
    assert_eq!(newer.finish().unwrap(), msg(50, 3, e.last_round()));
    assert!(dir.join("snap-in/50-3").is_dir());
    // Installed at 40: nothing at or below it is taken again.
    busy(receive(&s40));
    inbox.stage(50, 3).unwrap();
    busy(receive(&s50));
    assert!(!dir.join("snap-in/50-3").exists());
}

#[test]
fn a_staged_snapshot_raft_ignored_is_removed_once_the_log_passed_it() {
    let src = tempfile::tempdir().unwrap();
    let (e, _) = engine_with_data(src.path());
    let replica = tempfile::tempdir().unwrap();
    let inbox = inbox(replica.path());
    let m = msg(40, 3, e.last_round());
    snapshot::receive(&mut &stream_of(&e, &m)[..], &inbox, 2, &peers()).unwrap();
    // Raft may still install it while its commit index is below it.
    inbox.forget_below(40).unwrap();
    assert!(replica.path().join("snap-in/40-3").is_dir());
    inbox.forget_below(41).unwrap();
    assert!(!replica.path().join("snap-in/40-3").exists());
    assert!(inbox.stage(40, 3).is_err());
}

/// A replica directory with an old engine (a file `old`) and the snapshot
/// at (40, 3) staged in `install-40-3` (a file `new`).
fn staged(dir: &Path) {
    std::fs::create_dir_all(dir.join("engine")).unwrap();
    std::fs::write(dir.join("engine/old"), b"").unwrap();
    std::fs::create_dir_all(dir.join("install-40-3")).unwrap();
    std::fs::write(dir.join("install-40-3/new"), b"").unwrap();
}

#[test]
fn a_crash_at_each_step_of_an_install_finishes_it_or_discards_it() {
    // Staged, the Raft log not reset (it starts elsewhere): discarded.
    let d = tempfile::tempdir().unwrap();
    staged(d.path());
    std::fs::create_dir_all(d.path().join("snap-in/tmp-1-50-3-0")).unwrap();
    snapshot::recover(d.path(), (7, 2)).unwrap();
    assert!(d.path().join("engine/old").exists());
    assert!(!d.path().join("install-40-3").exists());
    assert!(!d.path().join("snap-in").exists());

    // Staged and committed (the Raft log starts at (40, 3)), the engine
    // not swapped yet: swapped.
    let d = tempfile::tempdir().unwrap();
    staged(d.path());
    snapshot::recover(d.path(), (40, 3)).unwrap();
    assert!(d.path().join("engine/new").exists());
    assert!(!d.path().join("engine.old").exists());
    assert!(!d.path().join("install-40-3").exists());

    // Committed, the old engine renamed away, the new one not in place.
    let d = tempfile::tempdir().unwrap();
    staged(d.path());
    std::fs::rename(d.path().join("engine"), d.path().join("engine.old")).unwrap();
    snapshot::recover(d.path(), (40, 3)).unwrap();
    assert!(d.path().join("engine/new").exists());
    assert!(!d.path().join("engine.old").exists());

    // Swapped, the old engine not removed yet.
    let d = tempfile::tempdir().unwrap();
    staged(d.path());
    std::fs::rename(d.path().join("engine"), d.path().join("engine.old")).unwrap();
    std::fs::rename(d.path().join("install-40-3"), d.path().join("engine")).unwrap();
    snapshot::recover(d.path(), (40, 3)).unwrap();
    assert!(d.path().join("engine/new").exists());
    assert!(!d.path().join("engine.old").exists());

    // A later start of a replica whose log was compacted since: nothing
    // to do, the engine stays.
    snapshot::recover(d.path(), (90, 4)).unwrap();
    assert!(d.path().join("engine/new").exists());
}

#[test]
fn the_descriptor_and_stream_records_are_the_spec_vectors() {
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    // cluster.md section 8.2, byte for byte.
    assert_eq!(hex(&descriptor(7)), "01000000000000000700000000000000");
    assert_eq!(snapshot::descriptor_last_round(&descriptor(7)), Ok(7));
    assert!(snapshot::descriptor_last_round(&[0; 16]).is_err());
    let mut rec = Vec::new();
    snapshot::encode_begin(&mut rec, [1, 2, 40, 3, 7, 5]);
    assert_eq!(
        hex(&rec),
        concat!(
            "40000000",
            "32ceb542",
            "01",
            "00000000000000",
            "0100000000000000",
            "0200000000000000",
            "2800000000000000",
            "0300000000000000",
            "0700000000000000",
            "0500000000000000",
        )
    );
    rec.clear();
    snapshot::encode_file(&mut rec, "FORMAT", 5).unwrap();
    assert_eq!(
        hex(&rec),
        concat!(
            "26000000",
            "29500e54",
            "02",
            "00000000000000",
            "0500000000000000",
            "0600",
            "000000000000",
            "464f524d4154",
        )
    );
    rec.clear();
    encode_record(&mut rec, snapshot::KIND_CHUNK, |b| {
        b.extend_from_slice(b"hello")
    });
    assert_eq!(
        hex(&rec),
        concat!("15000000", "d77b8c42", "03", "00000000000000", "68656c6c6f")
    );
}

/// Where a test replica's messages go: kept for the test to look at.
struct Outbox(parking_lot::Mutex<std::sync::mpsc::Sender<Message>>);

impl crate::Transport for Outbox {
    fn send(&self, msg: Message) {
        let _ = self.0.lock().send(msg);
    }
    fn set_peers(&self, _peers: &[(u64, String)]) {}
    fn send_snapshot(
        &self,
        _msg: Message,
        _snapshot: std::sync::Arc<tidemark_engine::Snapshot>,
        done: Box<dyn FnOnce(bool) + Send>,
    ) {
        done(false);
    }
}

/// Node 2 of {1, 2, 3} in `dir`, with the engine limits of
/// `engine_with_data`; what it sends.
fn follower(dir: &Path) -> (crate::Replica, std::sync::mpsc::Receiver<Message>) {
    let mut cfg = crate::ReplicaConfig::new(2, &[1, 2, 3], dir);
    cfg.engine.payload_bytes_max = 1024;
    cfg.engine.segment_bytes_max = 8192;
    cfg.engine.index_interval_bytes = 512;
    cfg.engine.commit_round_bytes_max = 256 << 10;
    cfg.engine.journal_file_bytes = 4096;
    let (tx, rx) = std::sync::mpsc::channel();
    let r = crate::Replica::start(cfg, Outbox(parking_lot::Mutex::new(tx))).unwrap();
    (r, rx)
}

/// Node 1's append of empty entries `from..=to` of `term` after
/// (`from - 1`, `term`), committing them.
fn append(from: u64, to: u64, term: u64) -> Message {
    let mut m = Message {
        from: 1,
        to: 2,
        term,
        log_term: term,
        index: from - 1,
        commit: to,
        ..Default::default()
    };
    m.set_msg_type(MessageType::MsgAppend);
    let entries: Vec<raft::eraftpb::Entry> = (from..=to)
        .map(|index| raft::eraftpb::Entry {
            index,
            term,
            ..Default::default()
        })
        .collect();
    m.set_entries(entries.into());
    m
}

/// Waits until the follower acknowledges holding entries up to `index`.
fn acknowledged(out: &std::sync::mpsc::Receiver<Message>, index: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let m = out
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("entries up to {index} never acknowledged"));
        if m.get_msg_type() == MessageType::MsgAppendResponse && !m.reject && m.index >= index {
            return;
        }
    }
}

/// The commit index of the hard state a Raft log file holds, as the
/// reader an open uses reads it (cluster.md section 3.3).
fn file_commit(path: &Path) -> u64 {
    let b = std::fs::read(path).unwrap();
    crate::raft_log_format::read(&b).state.hard_state.commit
}

/// cluster.md section 8.3: a snapshot and the entries after it, with
/// their commit, in one `Ready` (the leader's appends follow its stream at
/// once) on a follower whose engine a node serves, so that the install
/// ends with the Raft log reset and the replica stopped for the node's
/// restart, before those entries are persisted. The restart finishes the
/// install and catches up: the reset log named no commit past itself.
#[test]
fn a_snapshot_and_the_entries_after_it_in_one_turn_install_through_a_restart() {
    let src = tempfile::tempdir().unwrap();
    let (e, state) = engine_with_data(src.path());
    let mut m = msg(40, 3, e.last_round());
    m.mut_snapshot().data = snapshot::descriptor_with_members(
        e.last_round(),
        &crate::members::Members::voters(40, &[1, 2, 3]),
    )
    .into();
    let stream = stream_of(&e, &m);
    let replica = tempfile::tempdir().unwrap();
    let (r, _out) = follower(replica.path());
    // A node's event loop holds the engine: the install stops the replica.
    let held = r.engine().unwrap();
    // Both arrive while the driver is busy, and are taken in one turn.
    r.pause(std::time::Duration::from_millis(300));
    r.mailbox().receive_snapshot(&mut &stream[..], 1).unwrap();
    r.mailbox().deliver(append(41, 43, 3));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while r.stopped_reason().is_none() {
        assert!(std::time::Instant::now() < deadline, "no install");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(r.restart_to_install(), "{:?}", r.stopped_reason());
    drop(held);
    r.stop();
    drop(r);
    // The reset log, as the install wrote it (before any repair at open).
    let written = file_commit(&replica.path().join("raft/log"));
    // The node's restart: the install finishes, and the follower goes on
    // from the snapshot.
    let (r, out) = follower(replica.path());
    assert_eq!(r.read(|e| e.last_round()).unwrap(), e.last_round());
    assert_eq!(r.read(state_of).unwrap(), state);
    r.mailbox().deliver(append(41, 43, 3));
    acknowledged(&out, 43);
    r.stop();
    let log = crate::raft_log::RaftLog::open(&replica.path().join("raft"), &[1, 2, 3]).unwrap();
    assert_eq!((log.start(), log.last()), ((40, 3), 43));
    // Start at the snapshot, no entry, a commit at the snapshot.
    assert_eq!(written, 40, "the install wrote a commit index past the log");
}

/// cluster.md section 3.3: a log that starts at a snapshot, holds no entry
/// and a hard state whose commit is past the snapshot (written by an
/// older version's install that ended before the entries were persisted)
/// opens with the commit lowered to what it holds, and the replica starts
/// (raft-rs refuses a commit index past the last entry: it would panic).
#[test]
fn a_log_whose_commit_is_past_its_entries_opens_clamped_and_the_replica_starts() {
    let replica = tempfile::tempdir().unwrap();
    let raft_dir = replica.path().join("raft");
    {
        let mut log = crate::raft_log::RaftLog::open(&raft_dir, &[1, 2, 3]).unwrap();
        let hs = raft::eraftpb::HardState {
            term: 22,
            vote: 1,
            commit: 46,
            ..Default::default()
        };
        let members = crate::members::Members::voters(40, &[1, 2, 3]);
        log.reset_to_snapshot(40, 22, &hs, Some(members)).unwrap();
    }
    let log = crate::raft_log::RaftLog::open(&raft_dir, &[1, 2, 3]).unwrap();
    let (start, commit) = (log.start(), log.hard_state().commit);
    drop(log);
    let (r, out) = follower(replica.path());
    r.mailbox().deliver(append(41, 46, 22));
    acknowledged(&out, 46);
    assert!(r.stopped_reason().is_none(), "{:?}", r.stopped_reason());
    r.stop();
    assert_eq!(start, (40, 22));
    assert_eq!(commit, 40, "clamped to the last index held");
}
