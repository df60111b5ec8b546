//! Tests of snapshot streams and installs (`snapshot.rs`, cluster.md
//! section 8): an engine's snapshot streamed and received opens to the same
//! state; malformed streams are refused and leave nothing installed; a
//! crash at each step of an install either finishes it or discards it.

use std::path::Path;

use raft::eraftpb::{Message, MessageType, Snapshot};
use tidemark_engine::{Config, Engine};

use crate::raft_log::{encode_record, RECORD_HEADER_BYTES};
use crate::sim_tests::{state_of, GroupState};
use crate::snapshot::{self, descriptor, PREAMBLE};

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
    let got = snapshot::receive(
        &mut &stream[..],
        replica.path(),
        2,
        &crate::members::KnownPeers::new(vec![1, 2, 3]),
    )
    .unwrap();
    assert_eq!(got, m);
    // The install's steps, as the driver takes them (no engine before).
    snapshot::stage(replica.path(), 40, 3).unwrap();
    snapshot::finish(replica.path(), 40, 3).unwrap();
    let copy = Engine::open(Config::new(replica.path().join("engine"))).unwrap();
    assert_eq!(copy.last_round(), e.last_round());
    assert_eq!(state_of(&copy), state);
    assert!(!replica.path().join("snap-in").exists());
    assert!(!replica.path().join("install-40-3").exists());
}

#[test]
fn malformed_streams_are_refused_and_leave_nothing_to_install() {
    let src = tempfile::tempdir().unwrap();
    let (e, _) = engine_with_data(src.path());
    let m = msg(40, 3, e.last_round());
    let good = stream_of(&e, &m);
    let replica = tempfile::tempdir().unwrap();
    let refused = |bytes: &[u8], me: u64| {
        let r = snapshot::receive(
            &mut &bytes[..],
            replica.path(),
            me,
            &crate::members::KnownPeers::new(vec![1, 2, 3]),
        );
        assert!(r.is_err(), "a bad stream was taken");
        assert!(!replica.path().join("snap-in/40-3").exists());
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
    // Nothing was staged, so there is nothing to install.
    assert!(snapshot::stage(replica.path(), 40, 3).is_err());
    // The good one is taken after all that.
    snapshot::receive(
        &mut &good[..],
        replica.path(),
        2,
        &crate::members::KnownPeers::new(vec![1, 2, 3]),
    )
    .unwrap();
    snapshot::stage(replica.path(), 40, 3).unwrap();
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
    snapshot::encode_begin(&mut rec, [1, 2, 40, 3, 7]);
    assert_eq!(
        hex(&rec),
        concat!(
            "38000000",
            "34bf6e57",
            "01",
            "00000000000000",
            "0100000000000000",
            "0200000000000000",
            "2800000000000000",
            "0300000000000000",
            "0700000000000000",
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
