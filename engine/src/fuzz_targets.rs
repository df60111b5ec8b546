//! Bodies of the engine's fuzz targets.
//!
//! They live in the library so that the cargo-fuzz wrappers in `fuzz/` and
//! the corpus replay test (`tests/it/fuzz_corpus.rs`, run by `cargo test`)
//! call the same functions: a target that stops compiling or starts failing
//! on its committed corpus breaks the ordinary test suite, so targets never
//! rot. Every function takes arbitrary bytes, must never panic on them, and
//! asserts the invariants its input lets it check (a failed assertion is a
//! finding). Not an API: hidden from the docs, and compiled only with the
//! `testing` feature (which `fuzz/` and the workspace's tests enable).
//!
//! | target | what it drives |
//! |---|---|
//! | `record_scan` | [`record::RecordIter`], `decode_header` / `decode_verified` |
//! | `frame_decode` | journal header decode, `FrameIter` (envelopes, payloads, entries), proof search, entry bodies |
//! | `run_decode` | a run part: `state::run::PartReader` and the item decoder |
//! | `manifest_decode` | `state::manifest::decode` |
//! | `recovery` | `Engine::open` over an arbitrary data-directory image |
//! | `engine_ops` | the engine API under an operation sequence, against an oracle |
//! | `append_replicated` | `Engine::append_replicated` of a follower fed arbitrary payloads |
//! | `cold_scan` | `cold::ColdScanner` over a cold file (storage v2) |
//!
//! Inputs that need valid checksums to get past the first check
//! (`frame_decode`, `run_decode`, `manifest_decode`, `recovery`) carry
//! a flag that
//! makes the target recompute them, so the fuzzer reaches the decoders
//! behind the CRCs as well as the CRC checks themselves.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::commit::journal::frame::{
    self, FrameIter, ENVELOPE_BYTES, FRAME_OVERHEAD_BYTES, PAYLOAD_HEADER_BYTES,
};
use crate::commit::journal::{
    self, EntryKind, FrameBuf, FrameKind, JournalStart, ENTRY_HEADER_BYTES, JOURNAL_HEADER_BYTES,
    JOURNAL_VERSION,
};
use crate::io::power_cut::{Cut, PowerCutVfs};
use crate::io::OsVfs;
use crate::logs::record::{
    self, NewRecord, RecordError, KIND_EDIT, KIND_MESSAGE, KIND_RECALL, RECORD_BYTES_STORED_MAX,
    RECORD_HEADER_BYTES,
};
use crate::logs::segment::{self, SEGMENT_HEADER_BYTES, SEGMENT_MAGIC, SEGMENT_VERSION};
use crate::{Config, Engine, Error, JoinStart};

/// A fuzz target body: arbitrary bytes in, a panic on a finding.
pub type Target = fn(&[u8]);

/// Every engine target by name (the name of its `fuzz/fuzz_targets/*.rs`
/// wrapper and of its `fuzz/corpus/` directory).
pub const TARGETS: &[(&str, Target)] = &[
    ("record_scan", record_scan),
    ("frame_decode", frame_decode),
    ("run_decode", run_decode),
    ("manifest_decode", manifest_decode),
    ("recovery", recovery),
    ("engine_ops", engine_ops),
    ("append_replicated", append_replicated),
    ("cold_scan", cold_scan),
];

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

// ---------------------------------------------------------------------------
// record_scan

/// Input: `{ limit: u16 | bytes }`. Walks `bytes` as records back to back
/// with `record_bytes_max = 44 + limit` (`0xffff`: the stored maximum).
///
/// Checks: every record returned is whole, verified and exactly where the
/// iterator says; positions add up; an error ends the iteration; the
/// unverified and verified decoders agree; a record re-encodes to its bytes.
pub fn record_scan(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    let limit = u16_at(data, 0);
    let max = if limit == u16::MAX {
        RECORD_BYTES_STORED_MAX
    } else {
        RECORD_HEADER_BYTES + limit as usize
    };
    let buf = &data[2..];
    let mut it = record::RecordIter::new(buf, max);
    let mut pos = 0;
    let mut failed = false;
    while let Some(next) = it.next() {
        assert!(!failed, "the record iterator yielded after an error");
        match next {
            Ok(r) => {
                let len = r.header.record_len as usize;
                assert_eq!(r.bytes.len(), len);
                assert!((RECORD_HEADER_BYTES..=max).contains(&len));
                assert_eq!(r.bytes, &buf[pos..pos + len], "record not at its position");
                assert_eq!(r.payload().len(), r.header.payload_len());
                assert_eq!(record::peek_len(r.bytes), Some(len));
                assert_eq!(record::peek_msg_id(r.bytes), r.header.msg_id);
                assert_eq!(record::decode_header(r.bytes, max), Ok(r.header));
                // A verified record is exactly what the encoder writes.
                let mut again = Vec::with_capacity(len);
                record::encode_kind_into(
                    &NewRecord {
                        msg_id: r.header.msg_id,
                        timestamp_ms: r.header.timestamp_ms,
                        sender_id: r.header.sender_id,
                        client_msg_id: r.header.client_msg_id,
                        payload: r.payload(),
                    },
                    r.header.kind,
                    &mut again,
                );
                // An erased message (flags bit 0, payload zeros) is what
                // erasing such an encoding writes (storage.md section 3).
                if r.header.flags & record::FLAG_ERASED != 0 {
                    record::erase_in_place(&mut again);
                }
                // An edit or a recall names an earlier record (record.rs).
                if let Some(t) = record::peek_target(r.bytes) {
                    assert!(
                        t >= 1 && t < r.header.msg_id,
                        "target {t} of {:?}",
                        r.header
                    );
                }
                assert_eq!(again, r.bytes, "a verified record does not re-encode");
                pos += len;
                assert_eq!(it.position(), pos);
            }
            Err(e) => {
                failed = true;
                let rest = &buf[pos..];
                assert_eq!(record::decode_verified(rest, max), Err(e.clone()));
                match (&e, record::decode_header(rest, max)) {
                    (RecordError::BadCrc { stored, .. }, Ok(h)) => assert_eq!(h.crc, *stored),
                    (RecordError::BadCrc { .. }, Err(h)) => {
                        panic!("CRC failure but the header does not decode: {h:?}")
                    }
                    // The one check past the CRC: an erased record's
                    // payload must be zeros (the header alone is valid).
                    (
                        RecordError::BadHeader {
                            reason: "an erased record with payload bytes",
                        },
                        Ok(h),
                    ) => assert_eq!(h.flags, record::FLAG_ERASED),
                    (_, h) => assert_eq!(h, Err(e.clone())),
                }
                assert_eq!(it.position(), buf.len(), "an error must fuse the iterator");
            }
        }
    }
    if !failed {
        assert_eq!(pos, buf.len(), "iteration ended early without an error");
    }
}

// ---------------------------------------------------------------------------
// frame_decode

/// Recomputes the checksums of a Records body's records (walking by
/// `record_len`), so that mutated records still pass their CRC.
fn fix_records(b: &mut [u8], whole: bool) {
    let mut pos = 0;
    while b.len() - pos >= RECORD_HEADER_BYTES {
        let mut len = u32_at(b, pos) as usize;
        if whole {
            len = b.len() - pos;
            put_u32(b, pos, len as u32);
        }
        if len < RECORD_HEADER_BYTES || len > b.len() - pos {
            return;
        }
        let crc = crc32fast::hash(&b[pos + 8..pos + len]);
        put_u32(b, pos, len as u32);
        put_u32(b, pos + 4, crc);
        pos += len;
    }
}

/// Makes the entries laid out back to back in `b` fit it (body lengths
/// clamped to what is there, record CRCs of Records bodies recomputed).
/// Returns how many there are.
fn fix_entries(b: &mut [u8]) -> u32 {
    let mut pos = 0;
    let mut n = 0u32;
    while b.len() - pos >= ENTRY_HEADER_BYTES {
        let room = b.len() - pos - ENTRY_HEADER_BYTES;
        let body_len = (u32_at(b, pos) as usize).min(room);
        // Invariant: body_len <= b.len() <= u32::MAX (fuzz inputs are small).
        put_u32(b, pos, body_len as u32);
        let body = pos + ENTRY_HEADER_BYTES..pos + ENTRY_HEADER_BYTES + body_len;
        if b[pos + 4] == EntryKind::Records as u8 {
            fix_records(&mut b[body.clone()], false);
        }
        pos = body.end;
        n = n.saturating_add(1);
    }
    n
}

/// Rewrites a journal file header (magic, version, header length, CRC),
/// keeping its sequence number, first numbers (at least 1) and key.
fn fix_journal_header(b: &mut [u8]) {
    if b.len() < JOURNAL_HEADER_BYTES {
        return;
    }
    let start = JournalStart {
        seq: u64_at(b, 16),
        lsn: u64_at(b, 24).max(1),
        round: u64_at(b, 32).max(1),
    };
    let mark_key = u32_at(b, 40);
    b[..JOURNAL_HEADER_BYTES].copy_from_slice(&journal::encode_header(start, mark_key));
}

/// Rewrites a whole journal file so that it passes every checksum: the
/// header, then each frame's payload length (clamped), entries, payload
/// CRC, numbers (continuing the header's), `synced_len` (clamped to the
/// frame's offset) and keyed envelope CRC. The frame kinds, entry kinds
/// and every other byte stay as the fuzzer made them.
fn fix_journal_file(b: &mut [u8]) {
    fix_journal_header(b);
    let Ok(h) = journal::decode_header_of(b) else {
        return;
    };
    let (mut lsn, mut round) = (h.first_lsn, h.first_round);
    let mut pos = JOURNAL_HEADER_BYTES;
    while b.len() - pos >= FRAME_OVERHEAD_BYTES {
        let room = b.len() - pos - ENVELOPE_BYTES;
        let payload_len = (u32_at(b, pos + 4) as usize).clamp(PAYLOAD_HEADER_BYTES, room);
        let start = pos + ENVELOPE_BYTES;
        let kind = if b[pos + 8] == FrameKind::Local as u8 {
            FrameKind::Local
        } else {
            FrameKind::Round
        };
        let payload = &mut b[start..start + payload_len];
        let count = fix_entries(&mut payload[PAYLOAD_HEADER_BYTES..]);
        put_u32(payload, 4, count);
        let index = if kind == FrameKind::Round { round } else { 0 };
        payload[8..16].copy_from_slice(&index.to_le_bytes());
        let crc = crc32fast::hash(&payload[4..]);
        put_u32(payload, 0, crc);
        let synced = u64_at(b, pos + 24).clamp(JOURNAL_HEADER_BYTES as u64, pos as u64);
        let env = frame::encode_envelope(
            &frame::Envelope {
                payload_len: payload_len as u32,
                kind,
                lsn,
                synced_len: synced,
            },
            h.mark_key,
        );
        b[pos..pos + ENVELOPE_BYTES].copy_from_slice(&env);
        lsn = lsn.saturating_add(1);
        if kind == FrameKind::Round {
            round = round.saturating_add(1);
        }
        pos = start + payload_len;
    }
}

/// The header `frame_decode` puts before bare frames (flag bit 1 clear).
const FRAME_DECODE_KEY: u32 = 0x0403_0201;

/// Input: `{ flags: u8 | bytes }`. Flag bit 1: `bytes` is a journal file
/// (a 48-byte header, then frames, as replay reads it); otherwise it is
/// frames alone, read after a header with seq 1, lsn and round 1 and key
/// `0x04030201`. Flag bit 0 recomputes every checksum and length
/// ([`fix_journal_file`]).
///
/// Checks: a header that decodes is the one the encoder writes and is not
/// also taken for another version; frames tile the valid prefix exactly,
/// continue the numbering, and re-encode to their bytes through the
/// writer's builder; the walk stops with a reason exactly when bytes
/// remain, and stays stopped; a proof found after the valid prefix is a
/// valid envelope naming a length inside the file; entry bodies decode (or
/// are refused) without panicking, as replay decodes them.
pub fn frame_decode(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut file = if flags & 2 != 0 {
        rest.to_vec()
    } else {
        let mut f = journal::encode_header(JournalStart::first(1), FRAME_DECODE_KEY).to_vec();
        f.extend_from_slice(rest);
        f
    };
    if flags & 1 != 0 {
        fix_journal_file(&mut file);
    }
    let header = match journal::decode_header_of(&file) {
        Ok(h) => {
            assert_eq!(journal::unsupported_version(&file), None);
            assert_eq!(file[..JOURNAL_HEADER_BYTES], journal::encode_header_of(&h));
            h
        }
        Err(_) => {
            if let Some(v) = journal::unsupported_version(&file) {
                assert_ne!(v, JOURNAL_VERSION);
            }
            return;
        }
    };
    let mut it = FrameIter::new(
        &file,
        JOURNAL_HEADER_BYTES,
        header.mark_key,
        header.first_lsn,
        header.first_round,
    );
    let mut pos = JOURNAL_HEADER_BYTES;
    let (mut lsn, mut round) = (header.first_lsn, header.first_round);
    for f in it.by_ref() {
        assert_eq!(f.offset, pos, "frames do not tile the file");
        assert_eq!(f.envelope.lsn, lsn);
        if f.envelope.kind == FrameKind::Round {
            assert_eq!(f.header().round_index, round);
            round = round.saturating_add(1);
        }
        lsn = lsn.saturating_add(1);
        let mut again = FrameBuf::default();
        for e in f.entries() {
            again.push_entry(e.kind, e.group_id, |b| b.extend_from_slice(e.body));
            decode_entry_body(e.kind, e.body);
        }
        let sealed = again
            .seal(
                f.envelope.kind,
                f.envelope.lsn,
                f.header().round_index,
                f.envelope.synced_len,
                header.mark_key,
            )
            .expect("a frame read from a file has a u32 payload");
        // The term is not checked by readers of this version; the builder
        // writes 0.
        if f.header().term == 0 {
            assert_eq!(
                sealed,
                &file[f.offset..f.end()],
                "a valid frame does not re-encode"
            );
        }
        pos = f.end();
    }
    assert_eq!(it.position(), pos);
    assert_eq!(it.next_numbers(), (lsn, round));
    assert_eq!(
        it.stop_reason().is_some(),
        pos < file.len(),
        "stop reason {:?} at {pos} of {}",
        it.stop_reason(),
        file.len()
    );
    assert!(it.next().is_none(), "the frame walk yielded after stopping");
    if pos < file.len() {
        if let Some((synced, at)) = frame::furthest_proof_from(&file, pos + 1, header.mark_key) {
            assert!(at > pos && synced <= at as u64 && synced >= JOURNAL_HEADER_BYTES as u64);
            assert!(frame::envelope_at(&file, at, header.mark_key).is_ok());
        }
    }
}

/// Decodes an entry body the way recovery's replay does.
fn decode_entry_body(kind: EntryKind, body: &[u8]) {
    match kind {
        EntryKind::Records => {
            if let Some((first, n)) = journal::body::decode_records(body) {
                assert!(n >= 1);
                assert_eq!(record::peek_msg_id(body), first);
            }
        }
        EntryKind::Join => {
            if let Some((user, cursor)) = journal::body::decode_join(body) {
                assert_eq!(body[..8], user.to_le_bytes());
                assert_eq!(body[8..], cursor.to_le_bytes());
            }
        }
        EntryKind::Leave => {
            let _ = journal::body::decode_leave(body);
        }
        EntryKind::SetRetention => {
            if let Some(r) = journal::body::decode_set_retention(body) {
                let mut again = Vec::new();
                journal::body::encode_set_retention(&mut again, &r);
                assert_eq!(again, body);
            }
        }
        EntryKind::ClearHistory => {
            if let Some((user, up_to)) = journal::body::decode_clear_history(body) {
                let mut again = Vec::new();
                journal::body::encode_clear_history(&mut again, user, up_to);
                assert_eq!(again, body);
            }
        }
        EntryKind::Cursors => {
            assert!(journal::body::decode_cursors(body).count() <= body.len() / 16)
        }
        EntryKind::CreateGroup | EntryKind::DeleteGroup => {}
    }
}

// ---------------------------------------------------------------------------
// run_decode

/// Recomputes the checksums of a run part: header, then (if the trailer's
/// index lies inside the bytes) each block the index names, then the
/// index and trailer; lengths are left alone.
fn fix_run_part(b: &mut [u8]) {
    use crate::state::run::{INDEX_ENTRY_BYTES, RUN_HEADER_BYTES, RUN_TRAILER_BYTES};
    if b.len() < RUN_HEADER_BYTES + RUN_TRAILER_BYTES {
        return;
    }
    let crc = crc32fast::hash(&b[..60]);
    put_u32(b, 60, crc);
    let t = b.len() - RUN_TRAILER_BYTES;
    let index_offset = u64_at(b, t + 8);
    let blocks = u32_at(b, t + 24) as usize;
    let Some(index_end) = usize::try_from(index_offset)
        .ok()
        .and_then(|o| o.checked_add(blocks.checked_mul(INDEX_ENTRY_BYTES)?))
        .filter(|&end| end == t)
    else {
        return;
    };
    let index_at = index_end - blocks * INDEX_ENTRY_BYTES;
    for i in 0..blocks {
        let e = index_at + i * INDEX_ENTRY_BYTES;
        let (off, len) = (u64_at(b, e) as usize, u32_at(b, e + 8) as usize);
        if len >= 12 && off.checked_add(len).is_some_and(|end| end <= index_at) {
            let crc = crc32fast::hash(&b[off + 4..off + len]);
            put_u32(b, off, crc);
        }
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&b[index_at..t + 28]);
    let crc = crc.finalize();
    put_u32(b, t + 28, crc);
}

/// Input: `{ flags: u8 | run part }`; flag bit 0 recomputes the part's
/// checksums, bit 1 reads it with a 4 KiB limit instead of the reader's.
///
/// Checks: a part that opens yields at most `item_count` items in strictly
/// increasing key order; when every item decodes, they re-encode (through
/// the writer, one part) to a part that reads back to the same items.
pub fn run_decode(data: &[u8]) {
    use crate::state::run::{PartReader, RunWriter, RUN_FILE_BYTES_READ_MAX};
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = rest.to_vec();
    if flags & 1 != 0 {
        fix_run_part(&mut buf);
    }
    let limit = if flags & 2 != 0 {
        4096
    } else {
        RUN_FILE_BYTES_READ_MAX
    };
    let Ok(reader) = PartReader::open(&buf, limit) else {
        return;
    };
    assert!(buf.len() as u64 <= limit);
    let declared = reader.item_count;
    let mut items = Vec::new();
    for item in reader {
        let Ok(item) = item else {
            return;
        };
        if let Some(prev) = items.last().map(crate::state::Item::key) {
            assert!(item.key() > prev, "keys do not increase");
        }
        items.push(item);
        assert!(
            items.len() as u64 <= declared,
            "more items than the trailer says"
        );
    }
    assert_eq!(items.len() as u64, declared);
    let mut w = RunWriter::new(1, RUN_FILE_BYTES_READ_MAX, 0, |_| Ok(Vec::new()));
    for it in &items {
        w.push(it).expect("decoded items re-encode in order");
    }
    let parts = w.finish().expect("an in-memory run cannot fail");
    assert_eq!(parts.len(), 1);
    let again: Vec<_> = PartReader::open(&parts[0].0, RUN_FILE_BYTES_READ_MAX)
        .expect("a written part opens")
        .collect::<Result<_, _>>()
        .expect("a written part reads");
    assert_eq!(again, items, "items do not survive re-encoding");
}

// ---------------------------------------------------------------------------
// manifest_decode

/// Input: `{ flags: u8 | manifest file }`; flag bit 0 rewrites the
/// header's body length and checksums for the body that follows.
///
/// Checks: a manifest that decodes re-encodes to exactly its bytes (the
/// format has one encoding of each value).
pub fn manifest_decode(data: &[u8]) {
    use crate::state::manifest;
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let mut buf = rest.to_vec();
    if flags & 1 != 0 {
        fix_manifest(&mut buf);
    }
    if let Ok(m) = manifest::decode(&buf) {
        let again = manifest::encode(&m).expect("a decoded manifest is within the limit");
        assert_eq!(
            again, buf,
            "a decoded manifest does not re-encode to its bytes"
        );
    }
}

/// Rewrites a manifest header's body length and checksums for the body
/// that follows it.
fn fix_manifest(buf: &mut [u8]) {
    use crate::state::manifest::MANIFEST_HEADER_BYTES;
    if buf.len() < MANIFEST_HEADER_BYTES {
        return;
    }
    let body_len = (buf.len() - MANIFEST_HEADER_BYTES) as u64;
    buf[16..24].copy_from_slice(&body_len.to_le_bytes());
    let body_crc = crc32fast::hash(&buf[MANIFEST_HEADER_BYTES..]);
    put_u32(buf, 24, body_crc);
    let header_crc = crc32fast::hash(&buf[..28]);
    put_u32(buf, 28, header_crc);
}

/// Seeds of `run_decode` and `manifest_decode`: a run of every item kind
/// (one part and several) and a manifest naming it.
fn state_seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::state::manifest::{self, Manifest, RunMeta};
    use crate::state::run::RunWriter;
    use crate::state::{GroupRecord, Item};
    let items = vec![
        Item::GroupPut(Box::new(GroupRecord {
            group: 1,
            fresh: true,
            applied_lsn: 11,
            head: 9,
            segments: vec![(1, 300), (6, 200)],
            retention: crate::Retention {
                by_cursor: true,
                max_age_ms: 0,
                max_bytes: 4096,
            },
            damaged: None,
            small: None,
            quiet: Vec::new(),
            edits: Vec::new(),
            erase: Vec::new(),
        })),
        Item::MemberPut {
            group: 1,
            user: 7,
            cursor: 4,
            join_point: 2,
        },
        Item::MemberDelete { group: 1, user: 8 },
        Item::GroupDelete { group: 2 },
        Item::GroupPut(Box::new(GroupRecord {
            group: 3,
            fresh: false,
            applied_lsn: 1,
            head: 0,
            segments: vec![(1, 64)],
            retention: crate::Retention::default(),
            damaged: Some("checkpointed data damaged".into()),
            small: None,
            quiet: Vec::new(),
            edits: Vec::new(),
            erase: Vec::new(),
        })),
    ];
    let mut out = Vec::new();
    let mut runs = Vec::new();
    for (name, max) in [("one-part", 1 << 20), ("small-parts", 1 << 10)] {
        let mut w = RunWriter::new(4, max, 0, |_| Ok(Vec::new()));
        for it in &items {
            w.push(it).expect("seed items in order");
        }
        let parts = w.finish().expect("in memory");
        for (i, (bytes, _)) in parts.iter().enumerate() {
            out.push((
                "run_decode",
                format!("{name}-{i}"),
                [&[0u8][..], bytes].concat(),
            ));
        }
        runs.push(RunMeta {
            run_seq: 4 + runs.len() as u64,
            parts: parts
                .into_iter()
                .map(|(_, mut m)| {
                    m.run_seq = 4 + runs.len() as u64;
                    m
                })
                .collect(),
        });
    }
    runs.reverse();
    let m = Manifest {
        ckpt_seq: 2,
        replay_journal_seq: 3,
        replay_lsn: 12,
        replay_round: 10,
        created_ms: 1,
        next_run_seq: 6,
        clean: false,
        runs,
        pinned: vec![1, 2],
        groups_per_user_bound: Some(3),
        groups_bound: Some(4),
        user_index: false,
    };
    out.push((
        "manifest_decode",
        "two-runs".into(),
        [&[0u8][..], &manifest::encode(&m).expect("small")].concat(),
    ));
    out
}

// ---------------------------------------------------------------------------
// Data directories for the targets that open an engine

/// A scratch directory, removed on drop (also when a finding unwinds).
///
/// The engine fsyncs for real, which on a busy disk can take longer than
/// the rest of a replay: unless `TMPDIR` is set, scratch directories go to
/// `/dev/shm` (tmpfs, where fsync costs nothing) when it is writable, and to
/// the system temp dir otherwise.
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn new(what: &str) -> ScratchDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "tidemark-fuzz-{what}-{}-{n}-{}",
            std::process::id(),
            crate::clock::now_ms()
        );
        let shm = Path::new("/dev/shm");
        if std::env::var_os("TMPDIR").is_none() && shm.is_dir() {
            let dir = shm.join(&name);
            if std::fs::create_dir(&dir).is_ok() {
                return ScratchDir(dir);
            }
        }
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        ScratchDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Small limits, so short inputs cross segment, index and journal
/// boundaries; timers far away, so a run does not depend on the clock.
fn small_config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.payload_bytes_max = 256;
    c.segment_bytes_max = 1024;
    // Groups keep up to 300 bytes of records in the journal, then are
    // promoted (storage v2 S5): both kinds of log in every run.
    c.small_group_bytes_max = 300;
    c.index_interval_bytes = 128;
    c.open_segments_max = 4;
    c.checkpoint_journal_bytes = 4096;
    // Rolls every few rounds, checkpoints every few files.
    c.journal_file_bytes = 1024;
    c.commit_round_bytes_max = 4096;
    c.groups_max = 64;
    c.members_per_group_max = 64;
    c.groups_per_user_max = 64;
    c.cursor_flush_ms = 3_600_000;
    c.retention_check_ms = 3_600_000;
    c
}

fn open(dir: &Path) -> crate::Result<Engine> {
    Engine::open(small_config(dir))
}

// ---------------------------------------------------------------------------
// recovery

/// What one file of a data-directory image is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ImageFile {
    /// A manifest, named after the `ckpt_seq` of its body (1 if too short).
    Manifest = 0,
    /// A run part, named after the run and part of its header (run 1,
    /// part 0 if too short).
    RunPart = 1,
    /// Named after the sequence number in its header (1 if too short).
    Journal = 2,
    /// A segment of group 1, named after the base id in its header.
    SegmentGroup1 = 3,
    /// A segment of group 2, named after the base id in its header.
    SegmentGroup2 = 4,
    /// `FORMAT`. An image without one gets a valid one; one of 0 bytes
    /// means none at all (a directory of storage format 1, to be refused).
    Format = 5,
}

impl ImageFile {
    const ALL: [ImageFile; 6] = [
        ImageFile::Manifest,
        ImageFile::RunPart,
        ImageFile::Journal,
        ImageFile::SegmentGroup1,
        ImageFile::SegmentGroup2,
        ImageFile::Format,
    ];
}

/// Bit of the kind byte that makes the target recompute the file's checksums.
pub const IMAGE_FIX_CRCS: u8 = 0x80;

/// Encodes a data-directory image: `n x { kind: u8 | len: u16 | bytes }`.
pub fn encode_image(files: &[(ImageFile, bool, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (kind, fix, bytes) in files {
        let len = bytes.len().min(u16::MAX as usize);
        out.push(*kind as u8 | if *fix { IMAGE_FIX_CRCS } else { 0 });
        out.extend_from_slice(&(len as u16).to_le_bytes());
        out.extend_from_slice(&bytes[..len]);
    }
    out
}

/// Decodes an image; a truncated last file is cut to the bytes present.
fn decode_image(mut data: &[u8]) -> Vec<(ImageFile, bool, Vec<u8>)> {
    let mut files = Vec::new();
    while data.len() >= 3 {
        let kind = ImageFile::ALL[(data[0] & !IMAGE_FIX_CRCS) as usize % ImageFile::ALL.len()];
        let fix = data[0] & IMAGE_FIX_CRCS != 0;
        let len = (u16_at(data, 1) as usize).min(data.len() - 3);
        files.push((kind, fix, data[3..3 + len].to_vec()));
        data = &data[3 + len..];
    }
    files
}

fn fix_segment(b: &mut [u8]) {
    if b.len() < SEGMENT_HEADER_BYTES {
        return;
    }
    b[0..8].copy_from_slice(&SEGMENT_MAGIC);
    b[8..10].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
    b[10..12].copy_from_slice(&(SEGMENT_HEADER_BYTES as u16).to_le_bytes());
    b[12..16].copy_from_slice(&[0; 4]);
    b[40..60].copy_from_slice(&[0; 20]);
    let crc = crc32fast::hash(&b[0..60]);
    put_u32(b, 60, crc);
    fix_records(&mut b[SEGMENT_HEADER_BYTES..], false);
}

/// The files of an image as the engine lays them out under `dir`: path,
/// kind and bytes (checksums recomputed where the image asks for it). A
/// later file at the same path replaces an earlier one; a `FORMAT` of 0
/// bytes is left out, and an image without one gets a valid one.
fn lay_out(dir: &Path, files: &[(ImageFile, bool, Vec<u8>)]) -> Vec<(PathBuf, ImageFile, Vec<u8>)> {
    let jdir = journal::journal_dir(dir);
    let mut out = Vec::new();
    if !files.iter().any(|(k, _, _)| *k == ImageFile::Format) {
        let valid = crate::state::format::encode(crate::state::format::FORMAT_VERSION, 0).to_vec();
        out.push((crate::state::format::path(dir), ImageFile::Format, valid));
    }
    for (kind, fix, bytes) in files {
        let mut b = bytes.clone();
        let path = match kind {
            ImageFile::Format => {
                let path = crate::state::format::path(dir);
                out.retain(|(p, _, _)| *p != path);
                if b.is_empty() {
                    continue;
                }
                if *fix {
                    let version = if b.len() >= 10 { u16_at(&b, 8) } else { 2 };
                    b = crate::state::format::encode(version, 0).to_vec();
                }
                path
            }
            ImageFile::Manifest => {
                if *fix {
                    fix_manifest(&mut b);
                }
                let seq = if b.len() >= 40 { u64_at(&b, 32) } else { 1 };
                let mdir = crate::state::manifest::manifest_dir(dir);
                crate::state::manifest::manifest_path(&mdir, seq)
            }
            ImageFile::RunPart => {
                if *fix {
                    fix_run_part(&mut b);
                }
                let (run, part) = if b.len() >= 24 {
                    (u64_at(&b, 16), u32_at(&b, 12))
                } else {
                    (1, 0)
                };
                dir.join("state")
                    .join(crate::state::run::part_file_name(run, part))
            }
            ImageFile::Journal => {
                if *fix {
                    fix_journal_file(&mut b);
                }
                let seq = if b.len() >= 24 { u64_at(&b, 16) } else { 1 };
                journal::journal_path(&jdir, seq)
            }
            ImageFile::SegmentGroup1 | ImageFile::SegmentGroup2 => {
                if *fix {
                    fix_segment(&mut b);
                }
                let group = if *kind == ImageFile::SegmentGroup1 {
                    1
                } else {
                    2
                };
                let base = if b.len() >= 32 { u64_at(&b, 24) } else { 1 };
                crate::logs::group_log::group_dir(dir, group).join(segment::file_name(base))
            }
        };
        out.retain(|(p, _, _)| *p != path);
        out.push((path, *kind, b));
    }
    out
}

fn write_image(files: &[(PathBuf, ImageFile, Vec<u8>)]) -> std::io::Result<()> {
    for (path, _, bytes) in files {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
    }
    Ok(())
}

/// Users whose memberships the recovery target inspects.
const RECOVERY_USERS_MAX: usize = 16;

/// Sender of the probe message appended to every recovered group.
const PROBE_SENDER: u64 = u64::MAX - 7;

/// Input: a data-directory image (see [`encode_image`]): manifests, run
/// parts, journal files and segments of groups 1 and 2, each optionally
/// with its checksums recomputed.
///
/// Opening must never panic. If it succeeds: every group reads back with
/// dense ids up to its head (or answers a typed error); unread rows of its
/// members satisfy `cursor <= head` and `unread == head - cursor`, one row
/// per group; a probe append gets `head + 1`; and after a clean close the
/// directory reopens with the same heads.
pub fn recovery(data: &[u8]) {
    let dir = ScratchDir::new("recovery");
    let files = lay_out(dir.path(), &decode_image(data));
    if write_image(&files).is_err() {
        return;
    }
    let Ok(engine) = open(dir.path()) else {
        return;
    };
    let mut ids = engine.group_ids();
    ids.sort_unstable();
    let mut heads = BTreeMap::new();
    let mut users = Vec::new();
    for &g in &ids {
        let readable = check_group_reads(&engine, g);
        if let Ok(members) = engine.members(g) {
            users.extend(members.into_iter().take(RECOVERY_USERS_MAX));
        }
        let head = engine.head(g).expect("a listed group has a head");
        if readable {
            let probe = engine.append(g, PROBE_SENDER, head, b"probe");
            if let Ok(a) = probe {
                if !a.duplicate {
                    assert_eq!(a.msg_id, head + 1, "group {g}: ids not dense");
                }
                assert_eq!(engine.head(g).unwrap(), a.msg_id.max(head));
            }
        }
        heads.insert(g, engine.head(g).unwrap());
    }
    users.sort_unstable();
    users.dedup();
    users.truncate(RECOVERY_USERS_MAX);
    for &u in &users {
        check_unread_rows(&engine, u);
    }
    if engine.close().is_err() {
        return;
    }
    let engine = open(dir.path())
        .unwrap_or_else(|e| panic!("a directory closed cleanly does not reopen: {e}"));
    let mut again: Vec<u64> = engine.group_ids();
    again.sort_unstable();
    assert_eq!(again, ids, "groups changed across a clean reopen");
    for &g in &ids {
        assert_eq!(
            engine.head(g).unwrap(),
            heads[&g],
            "group {g}: head changed"
        );
        check_group_reads(&engine, g);
    }
    for &u in &users {
        check_unread_rows(&engine, u);
    }
    let _ = engine.close();
}

/// Reads a whole group; its ids must be dense up to the head. Returns
/// whether the group was readable.
fn check_group_reads(engine: &Engine, g: u64) -> bool {
    let head = engine.head(g).expect("a listed group has a head");
    let batch = match engine.read(g, 0, usize::MAX, usize::MAX) {
        Ok(b) => b,
        Err(Error::GroupDamaged { .. } | Error::Corrupt { .. } | Error::Io { .. }) => return false,
        Err(e) => panic!("group {g}: unexpected read error {e}"),
    };
    // A load during the read may have moved the head (records written
    // after the checkpoint were found in the segment).
    let head = engine.head(g).unwrap().max(head);
    let ids: Vec<u64> = batch.records().map(|r| r.header.msg_id).collect();
    if head == 0 {
        assert!(ids.is_empty(), "group {g}: records in an empty group");
        return true;
    }
    assert!(!batch.has_more, "group {g}: unlimited read left records");
    assert_eq!(batch.count as usize, ids.len());
    if let (Some(&first), Some(&last)) = (ids.first(), ids.last()) {
        assert!(first >= 1, "group {g}: msg_id 0 stored");
        assert_eq!(last, head, "group {g}: last record {last} but head {head}");
        assert_eq!(
            ids,
            (first..=last).collect::<Vec<_>>(),
            "group {g}: ids not dense"
        );
    }
    true
}

/// One row per group, ascending, `cursor <= head`, `unread == head - cursor`.
fn check_unread_rows(engine: &Engine, u: u64) {
    let rows = engine.unread(u);
    for w in rows.windows(2) {
        assert!(
            w[0].group_id < w[1].group_id,
            "user {u}: unread rows not one per group in order: {rows:?}"
        );
    }
    for r in &rows {
        assert!(r.cursor <= r.head, "user {u}: cursor above head: {r:?}");
        // Edits, recalls and recalled messages are not unread.
        assert!(r.unread <= r.head - r.cursor, "user {u}: {r:?}");
    }
}

/// The files of small engines stopped in a few ways (clean close or
/// crash, a few or many appends), as images.
fn seed_images() -> Vec<Vec<(ImageFile, bool, Vec<u8>)>> {
    let mut images = Vec::new();
    for (appends, crash) in [(0, false), (3, true), (12, false), (25, true)] {
        let dir = ScratchDir::new("recovery-seed");
        let engine = open(dir.path()).expect("open a fresh directory");
        engine.create_group(1).unwrap();
        engine.create_group(2).unwrap();
        engine.join(1, 1, JoinStart::Earliest).unwrap();
        engine.join(2, 1, JoinStart::Head).unwrap();
        engine.join(1, 2, JoinStart::Head).unwrap();
        for i in 0..appends {
            let g = 1 + i % 2;
            let payload = vec![b'a' + (i % 26) as u8; 20 + i as usize];
            engine.append(g, 1 + i % 3, i, &payload).unwrap();
            if i % 5 == 4 {
                engine.ack(1, 1, engine.head(1).unwrap() - 1).unwrap();
            }
        }
        if crash {
            engine.simulate_crash();
        } else {
            engine.close().unwrap();
        }
        images.push(image_of(dir.path()));
    }
    images
}

/// The seed corpus of every engine target as `(target, file name, bytes)`:
/// the storage vectors (`(file stem, bytes)` of format-spec/vectors/storage/),
/// files of small engines, and op sequences.
pub fn seeds(storage_vectors: &[(String, Vec<u8>)]) -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let prefixed = |p: &[u8], b: &[u8]| [p, b].concat();
    for (name, v) in storage_vectors {
        let seed = format!("vector-{name}");
        if name.starts_with("record") {
            out.push(("record_scan", seed, prefixed(&[0xff, 0xff], v)));
        } else if name.starts_with("journal-entry") {
            // A frame of just this entry: the fix flag fills in the
            // envelope and payload header.
            let mut frame = vec![1];
            frame.extend_from_slice(&[0; FRAME_OVERHEAD_BYTES]);
            frame.extend_from_slice(v);
            out.push(("frame_decode", seed.clone(), frame));
            if v.len() > ENTRY_HEADER_BYTES && v[4] == EntryKind::Records as u8 {
                let body = &v[ENTRY_HEADER_BYTES..];
                out.push(("record_scan", seed, prefixed(&[0xff, 0xff], body)));
            }
        } else if name.starts_with("journal-frame") {
            out.push(("frame_decode", seed, prefixed(&[0], v)));
        } else if name.starts_with("journal-header") {
            out.push(("frame_decode", seed, prefixed(&[2], v)));
        } else if name.starts_with("run-part") {
            out.push(("run_decode", seed, prefixed(&[0], v)));
        } else if name.starts_with("manifest") {
            out.push(("manifest_decode", seed, prefixed(&[0], v)));
        }
    }
    for (i, image) in seed_images().into_iter().enumerate() {
        for (kind, _, bytes) in &image {
            let seed = format!("engine{i}-{kind:?}");
            match kind {
                ImageFile::Manifest => {
                    out.push(("manifest_decode", seed, prefixed(&[0], bytes)));
                }
                ImageFile::RunPart => {
                    out.push(("run_decode", seed, prefixed(&[0], bytes)));
                }
                ImageFile::Journal => {
                    out.push(("frame_decode", seed, prefixed(&[2], bytes)));
                }
                ImageFile::SegmentGroup1 if bytes.len() > SEGMENT_HEADER_BYTES => {
                    let records = &bytes[SEGMENT_HEADER_BYTES..];
                    out.push(("record_scan", seed, prefixed(&[0, 1], records)));
                }
                _ => {}
            }
        }
        out.push(("recovery", format!("engine{i}"), encode_image(&image)));
        if i == 3 {
            let fixed: Vec<_> = image.into_iter().map(|(k, _, b)| (k, true, b)).collect();
            out.push((
                "recovery",
                format!("engine{i}-fix-crcs"),
                encode_image(&fixed),
            ));
        }
    }
    for (i, input) in append_replicated_seeds().into_iter().enumerate() {
        out.push(("append_replicated", format!("leader{i}"), input));
    }
    for (i, ops) in engine_ops_seeds().into_iter().enumerate() {
        out.push(("engine_ops", format!("ops{i}"), ops));
    }
    out.extend(state_seeds());
    for (name, input) in cold_scan_seeds() {
        out.push(("cold_scan", name.to_string(), input));
    }
    // Keep one seed per (target, name): a directory holds several journal
    // files or segments under one kind; the first is enough.
    let mut seen = std::collections::HashSet::new();
    out.retain(|(t, name, _)| seen.insert((*t, name.clone())));
    out
}

/// The files of a data directory as an image (files the format has no
/// kind for are left out).
fn image_of(dir: &Path) -> Vec<(ImageFile, bool, Vec<u8>)> {
    let mut files = Vec::new();
    let read = |p: PathBuf| std::fs::read(p).ok();
    if let Some(b) = read(crate::state::format::path(dir)) {
        files.push((ImageFile::Format, false, b));
    }
    let listed = |d: PathBuf| -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(d)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    for p in listed(crate::state::manifest::manifest_dir(dir)) {
        if let Some(b) = read(p) {
            files.push((ImageFile::Manifest, false, b));
        }
    }
    for p in listed(dir.join("state")) {
        if let Some(b) = read(p) {
            files.push((ImageFile::RunPart, false, b));
        }
    }
    for (_, path) in journal::list(&OsVfs, &journal::journal_dir(dir)).unwrap_or_default() {
        if let Some(b) = read(path) {
            files.push((ImageFile::Journal, false, b));
        }
    }
    for (group, kind) in [(1, ImageFile::SegmentGroup1), (2, ImageFile::SegmentGroup2)] {
        let gdir = crate::logs::group_log::group_dir(dir, group);
        let mut segs: Vec<PathBuf> = std::fs::read_dir(gdir)
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        segs.sort();
        for p in segs {
            if let Some(b) = read(p) {
                files.push((kind, false, b));
            }
        }
    }
    files
}

// ---------------------------------------------------------------------------
// engine_ops

const OPS_GROUPS: u64 = 3;
const OPS_USERS: u64 = 4;
/// Ids and positions range a little above any head a short input reaches.
const OPS_IDS: u64 = 24;
const OPS_MAX: usize = 256;
/// Reopens and crashes per input (each costs a recovery).
const OPS_RESTARTS_MAX: usize = 8;

/// One step of the `engine_ops` target. Groups are `1..=3`, users `1..=4`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Create(u64),
    Delete(u64),
    /// group, user, start
    Join(u64, u64, JoinStart),
    Leave(u64, u64),
    /// group, sender, client_msg_id, payload length
    Append(u64, u64, u64, u8),
    /// group, user, msg_id
    Ack(u64, u64, u64),
    /// user, (group, msg_id)...
    BatchAck(u64, Vec<(u64, u64)>),
    /// group, user, max_count, ack_up_to
    Pull(u64, u64, u8, Option<u64>),
    Unread(u64),
    Sync(u64),
    /// group, user, before (0 = none), max_count
    History(u64, u64, u64, u8),
    /// group, msg_id
    ReadCount(u64, u64),
    Flush,
    Checkpoint,
    Reopen,
    Crash,
    /// A power cut at the `n`th file-system operation (from 1) of a
    /// checkpoint taken now, or just after it when the checkpoint has fewer
    /// operations: nothing unsynced persists; then a reopen.
    PowerCut(u64),
    /// group, user, up_to: a history clear.
    ClearHistory(u64, u64, u64),
    /// group, sender, client_msg_id, target, new payload length: an edit
    /// (user 4 is the administrator).
    Edit(u64, u64, u64, u64, u8),
    /// group, sender, client_msg_id, target: a recall.
    Recall(u64, u64, u64, u64),
    /// group, user, before (0 = none), max_count: HISTORY_LATEST.
    HistoryLatest(u64, u64, u64, u8),
    /// group, by bytes: retention applied once (the policy set, a
    /// checkpoint, the policy back to keep-everything): "below every
    /// member's cursor", or by bytes (1 byte: everything it may drop,
    /// read or not).
    Retain(u64, bool),
}

/// The `engine_ops` administrator: may edit and recall anyone's message.
const OPS_ADMIN: u64 = 4;
/// Changes' `client_msg_id`s start here, apart from messages' (0..8), so
/// that most of them are not retransmits of a message; a few collide on
/// purpose in the seeds.
pub const OPS_CHANGE_IDS: u64 = 100;

/// Power cuts land within this many file-system operations of a
/// checkpoint's start (a checkpoint of a few groups takes 10 to 40).
const OPS_CUT_AT_MAX: u64 = 64;

/// Takes bytes of an op sequence, one at a time (0 once they run out).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn group(&mut self) -> u64 {
        1 + self.next() as u64 % OPS_GROUPS
    }
    fn user(&mut self) -> u64 {
        1 + self.next() as u64 % OPS_USERS
    }
    fn id(&mut self) -> u64 {
        self.next() as u64 % OPS_IDS
    }
}

/// Decodes an op sequence: a tag byte per op (`tag % 18`), then one byte
/// per argument, each reduced to its small domain.
pub fn decode_ops(data: &[u8]) -> Vec<Op> {
    let mut b = Bytes(data);
    let mut ops = Vec::new();
    while !b.0.is_empty() && ops.len() < OPS_MAX {
        let op = match b.next() % 22 {
            0 => Op::Create(b.group()),
            1 => Op::Delete(b.group()),
            2 => {
                let (g, u) = (b.group(), b.user());
                let start = match b.next() % 3 {
                    0 => JoinStart::Head,
                    1 => JoinStart::Earliest,
                    _ => JoinStart::At(b.id()),
                };
                Op::Join(g, u, start)
            }
            3 => Op::Leave(b.group(), b.user()),
            4 => Op::Append(b.group(), b.user(), b.next() as u64 % 8, b.next() % 48),
            5 => Op::Ack(b.group(), b.user(), b.id()),
            6 => {
                let u = b.user();
                let n = b.next() % 4;
                Op::BatchAck(u, (0..n).map(|_| (b.group(), b.id())).collect())
            }
            7 => {
                let (g, u, n) = (b.group(), b.user(), 1 + b.next() % 4);
                let a = b.next() % 32;
                Op::Pull(g, u, n, (a < OPS_IDS as u8).then_some(a as u64))
            }
            8 => Op::Unread(b.user()),
            9 => Op::Sync(b.user()),
            10 => Op::History(b.group(), b.user(), b.id(), 1 + b.next() % 4),
            11 => Op::ReadCount(b.group(), b.id()),
            12 => Op::Flush,
            13 => Op::Checkpoint,
            14 => Op::Reopen,
            15 => Op::Crash,
            16 => Op::PowerCut(1 + b.next() as u64 % OPS_CUT_AT_MAX),
            17 => Op::ClearHistory(b.group(), b.user(), b.id()),
            18 => Op::Edit(
                b.group(),
                b.user(),
                OPS_CHANGE_IDS + b.next() as u64 % 8,
                b.id(),
                b.next() % 48,
            ),
            19 => Op::Recall(
                b.group(),
                b.user(),
                OPS_CHANGE_IDS + b.next() as u64 % 8,
                b.id(),
            ),
            20 => Op::Retain(b.group(), b.next() % 2 == 1),
            _ => Op::HistoryLatest(b.group(), b.user(), b.id(), 1 + b.next() % 4),
        };
        ops.push(op);
    }
    ops
}

/// The inverse of [`decode_ops`] (for seeds).
pub fn encode_ops(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    let g = |g: u64| (g - 1) as u8;
    let u = |u: u64| (u - 1) as u8;
    for op in ops {
        match op {
            Op::Create(x) => out.extend([0, g(*x)]),
            Op::Delete(x) => out.extend([1, g(*x)]),
            Op::Join(x, y, s) => {
                out.extend([2, g(*x), u(*y)]);
                match s {
                    JoinStart::Head => out.push(0),
                    JoinStart::Earliest => out.push(1),
                    JoinStart::At(m) => out.extend([2, *m as u8]),
                }
            }
            Op::Leave(x, y) => out.extend([3, g(*x), u(*y)]),
            Op::Append(x, s, c, l) => out.extend([4, g(*x), u(*s), *c as u8, *l]),
            Op::Ack(x, y, m) => out.extend([5, g(*x), u(*y), *m as u8]),
            Op::BatchAck(y, items) => {
                out.extend([6, u(*y), items.len() as u8]);
                for (x, m) in items {
                    out.extend([g(*x), *m as u8]);
                }
            }
            Op::Pull(x, y, n, a) => {
                out.extend([7, g(*x), u(*y), n - 1, a.map_or(31, |a| a as u8)]);
            }
            Op::Unread(y) => out.extend([8, u(*y)]),
            Op::Sync(y) => out.extend([9, u(*y)]),
            Op::History(x, y, b, n) => out.extend([10, g(*x), u(*y), *b as u8, n - 1]),
            Op::ReadCount(x, m) => out.extend([11, g(*x), *m as u8]),
            Op::Flush => out.push(12),
            Op::Checkpoint => out.push(13),
            Op::Reopen => out.push(14),
            Op::Crash => out.push(15),
            Op::PowerCut(n) => out.extend([16, (n - 1) as u8]),
            Op::ClearHistory(x, y, m) => out.extend([17, g(*x), u(*y), *m as u8]),
            Op::Edit(x, s, c, t, l) => {
                out.extend([18, g(*x), u(*s), (c - OPS_CHANGE_IDS) as u8, *t as u8, *l])
            }
            Op::Recall(x, s, c, t) => {
                out.extend([19, g(*x), u(*s), (c - OPS_CHANGE_IDS) as u8, *t as u8])
            }
            Op::Retain(x, by_bytes) => out.extend([20, g(*x), u8::from(*by_bytes)]),
            Op::HistoryLatest(x, y, b, n) => out.extend([21, g(*x), u(*y), *b as u8, n - 1]),
        }
    }
    out
}

/// The oracle's view of a member.
#[derive(Clone, Copy, Debug)]
struct MemberModel {
    cursor: u64,
    /// The value a crash cannot go below: last flushed, checkpointed or joined.
    persisted: u64,
    join_point: u64,
}

/// One record of the oracle: `(sender, client_msg_id, payload length)`,
/// its kind and, for an edit or a recall, its target.
#[derive(Clone, Copy, Debug)]
struct Rec {
    s: u64,
    c: u64,
    len: u8,
    kind: u8,
    target: u64,
}

/// The oracle's view of a group: its records, ids being positions + 1,
/// and the oldest id retention kept.
#[derive(Debug)]
struct GroupModel {
    messages: Vec<Rec>,
    members: BTreeMap<u64, MemberModel>,
    floor: u64,
}

impl Default for GroupModel {
    fn default() -> Self {
        GroupModel {
            messages: Vec::new(),
            members: BTreeMap::new(),
            floor: 1,
        }
    }
}

impl GroupModel {
    fn head(&self) -> u64 {
        self.messages.len() as u64
    }

    fn recalled(&self, id: u64) -> bool {
        self.messages
            .iter()
            .any(|r| r.kind == KIND_RECALL && r.target == id)
    }

    /// Unread of a member at `cursor`: the messages above it that are
    /// neither an edit or a recall nor recalled.
    fn unread(&self, cursor: u64) -> u64 {
        (cursor + 1..=self.head())
            .filter(|&id| self.messages[id as usize - 1].kind == KIND_MESSAGE && !self.recalled(id))
            .count() as u64
    }

    /// The stored payload of record `id`.
    /// The payload of a stored record `r` of group `g` as the model
    /// knows it: a recalled message stored in erased form (storage.md
    /// section 3, "Erasure": flags bit 0, zeros of the original's length)
    /// stands for its original payload; any other record is as stored.
    /// Only a recalled message may be erased.
    fn stored_payload(&self, g: u64, r: &record::RecordRef<'_>) -> Vec<u8> {
        let id = r.header.msg_id;
        if r.header.flags & record::FLAG_ERASED == 0 {
            return r.payload().to_vec();
        }
        assert!(
            self.recalled(id),
            "group {g}: message {id} erased but not recalled"
        );
        let original = self.payload_of(g, id);
        if r.payload().len() == original.len() && r.payload().iter().all(|&b| b == 0) {
            original
        } else {
            r.payload().to_vec()
        }
    }

    fn payload_of(&self, g: u64, id: u64) -> Vec<u8> {
        let r = self.messages[id as usize - 1];
        let mut out = Vec::new();
        if r.kind != KIND_MESSAGE {
            out.extend_from_slice(&r.target.to_le_bytes());
        }
        if r.kind != KIND_RECALL {
            out.extend(payload(g, r.s, r.c, r.len));
        }
        out
    }

    /// The id of the record with this idempotence key, if the engine must
    /// know it: `Some(Ok(id))` when it must answer the original,
    /// `Some(Err(id))` when retention dropped it (a window rebuilt since
    /// cannot know it: either answer is right), `None` for a new one.
    fn original(&self, s: u64, c: u64) -> Option<Result<u64, u64>> {
        let i = self.messages.iter().rposition(|m| m.s == s && m.c == c)?;
        let id = i as u64 + 1;
        Some(if id < self.floor { Err(id) } else { Ok(id) })
    }

    /// Message `id` as HISTORY_LATEST shows it: `(flags, payload)`, or
    /// `None` for an edit or a recall (left out).
    fn latest(&self, g: u64, id: u64) -> Option<(u8, Vec<u8>)> {
        let r = self.messages[id as usize - 1];
        if r.kind != KIND_MESSAGE {
            return None;
        }
        if self.recalled(id) {
            return Some((crate::FLAG_RECALLED, Vec::new()));
        }
        let newest = self
            .messages
            .iter()
            .rev()
            .find(|m| m.kind == KIND_EDIT && m.target == id);
        Some(match newest {
            Some(m) => (crate::FLAG_EDITED, payload(g, m.s, m.c, m.len)),
            None => (0, payload(g, r.s, r.c, r.len)),
        })
    }

    /// Stores a new record: the next id; a sender who had read everything
    /// has read its own record.
    fn push(&mut self, rec: Rec) -> u64 {
        self.messages.push(rec);
        let id = self.head();
        if let Some(mm) = self.members.get_mut(&rec.s) {
            if mm.cursor == id - 1 {
                mm.cursor = id;
            }
        }
        id
    }

    /// What the rules answer an edit or a recall of `target` by `s`
    /// (`edits.rs`; the window is a day, never passed here).
    fn change_refusal(&self, s: u64, target: u64) -> Option<crate::ChangeRefusal> {
        use crate::ChangeRefusal::*;
        if target < self.floor.max(1) || target > self.head() {
            return Some(NoSuchMessage);
        }
        let r = self.messages[target as usize - 1];
        if r.kind != KIND_MESSAGE {
            Some(NoSuchMessage)
        } else if self.recalled(target) {
            Some(Recalled)
        } else if r.s != s && s != OPS_ADMIN {
            Some(NotSender)
        } else {
            None
        }
    }
}

fn payload(g: u64, s: u64, c: u64, len: u8) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (g * 31 + s * 7 + c * 3 + i) as u8)
        .collect()
}

/// Input: an op sequence (see [`decode_ops`]).
///
/// A structure-aware target: drives one engine through the ops and holds it
/// to an in-memory oracle of groups, messages (with their dedup keys) and
/// memberships. After every op: every head equals the oracle's (ids are
/// dense, nothing acknowledged is lost), every member's cursor equals the
/// oracle's (cursors are monotonic), and `unread == head - cursor`. A crash
/// may lose ACKs that were not yet persisted: the cursor must then lie
/// between the last persisted value and the last ACKed one (the documented
/// allowance), never below it and never above the head. A power cut (the
/// engine runs over a [`PowerCutVfs`]) at an operation of a checkpoint,
/// or just after one, is held to the same allowance: under
/// `fsync = always` every acknowledged change was synced before its
/// answer, so nothing the oracle holds may be lost. Retention, limits and
/// timers are left out (the config keeps everything, far below its limits,
/// with timers an hour away).
///
/// Deterministic: the ops run one after another and the checks depend on
/// no timing. The cut's operation count starts once the checkpointer and
/// the maintenance worker are idle; a checkpoint the engine starts on its
/// own meanwhile (every 4 KiB of journal) is then the one cut, which is as
/// valid a cut point.
pub fn engine_ops(data: &[u8]) {
    run_ops(decode_ops(data));
}

/// Runs `ops` against a fresh engine and the model (see [`engine_ops`]);
/// panics on the first disagreement. The proptest model test drives it too.
pub fn run_ops(ops: Vec<Op>) {
    let dir = ScratchDir::new("ops");
    let vfs = PowerCutVfs::new(dir.path());
    let control = vfs.control.clone();
    let open = || Engine::open_with_vfs(small_config(dir.path()), Arc::new(vfs.clone()));
    let mut engine = Some(open().expect("open a fresh directory"));
    let mut model: BTreeMap<u64, GroupModel> = BTreeMap::new();
    let mut restarts = 0;
    for op in ops {
        let e = engine.as_ref().expect("engine open between ops");
        match op {
            Op::Create(g) => {
                let r = e.create_group(g);
                match model.entry(g) {
                    std::collections::btree_map::Entry::Occupied(_) => {
                        assert!(matches!(r, Err(Error::GroupExists { .. })), "{r:?}")
                    }
                    std::collections::btree_map::Entry::Vacant(v) => {
                        r.unwrap();
                        v.insert(GroupModel::default());
                    }
                }
            }
            Op::Delete(g) => {
                let r = e.delete_group(g);
                match model.remove(&g) {
                    Some(_) => r.unwrap(),
                    None => assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}"),
                }
            }
            Op::Join(g, u, start) => {
                let r = e.join(g, u, start);
                let Some(gm) = model.get_mut(&g) else {
                    assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
                    continue_checks(e, &model);
                    continue;
                };
                let head = gm.head();
                let below = gm.floor - 1;
                let expected = match gm.members.get(&u) {
                    Some(mm) => mm.cursor,
                    None => {
                        let c = match start {
                            JoinStart::Head => head,
                            JoinStart::Earliest => below,
                            JoinStart::At(m) => m.saturating_sub(1).clamp(below, head.max(below)),
                        };
                        gm.members.insert(
                            u,
                            MemberModel {
                                cursor: c,
                                persisted: c,
                                join_point: c + 1,
                            },
                        );
                        c
                    }
                };
                assert_eq!(r.unwrap(), expected, "join {g} {u} {start:?}");
            }
            Op::Leave(g, u) => {
                let r = e.leave(g, u);
                match model.get_mut(&g) {
                    None => assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}"),
                    Some(gm) => match gm.members.remove(&u) {
                        Some(_) => r.unwrap(),
                        None => assert!(matches!(r, Err(Error::NotMember { .. })), "{r:?}"),
                    },
                }
            }
            Op::Append(g, s, c, len) => {
                let p = payload(g, s, c, len);
                let r = e.append(g, s, c, &p);
                let Some(gm) = model.get_mut(&g) else {
                    assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
                    continue_checks(e, &model);
                    continue;
                };
                let a = r.unwrap();
                match gm.original(s, c) {
                    Some(Ok(id)) => {
                        assert!(a.duplicate, "a retransmit was stored again");
                        assert_eq!(a.msg_id, id);
                    }
                    Some(Err(id)) if a.duplicate => assert_eq!(a.msg_id, id),
                    _ => {
                        assert!(!a.duplicate, "a new message was taken for a retransmit");
                        let rec = Rec {
                            s,
                            c,
                            len,
                            kind: KIND_MESSAGE,
                            target: 0,
                        };
                        assert_eq!(a.msg_id, gm.push(rec), "ids not dense");
                    }
                }
            }
            Op::Edit(g, s, c, t, len) => {
                let p = payload(g, s, c, len);
                let change = crate::Change::Edit(&p);
                check_change(e, &mut model, g, s, c, t, change, len);
            }
            Op::Recall(g, s, c, t) => {
                check_change(e, &mut model, g, s, c, t, crate::Change::Recall, 0);
            }
            Op::Retain(g, by_bytes) => {
                let policy = crate::Retention {
                    by_cursor: !by_bytes,
                    max_age_ms: 0,
                    max_bytes: u64::from(by_bytes),
                };
                let r = e.set_retention(g, policy);
                let Some(gm) = model.get_mut(&g) else {
                    assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
                    continue_checks(e, &model);
                    continue;
                };
                r.unwrap();
                e.checkpoint().unwrap();
                e.set_retention(g, crate::Retention::default()).unwrap();
                let floor = e.group_info(g).unwrap().floor;
                assert!(floor >= gm.floor, "group {g}: floor {floor} went back");
                if let Some(min) = gm.members.values().map(|m| m.cursor).min() {
                    assert!(
                        by_bytes || floor <= (min + 1).max(gm.floor),
                        "group {g}: floor {floor} above a cursor {min}"
                    );
                }
                gm.floor = floor;
                persist_all(&mut model);
            }
            Op::Ack(g, u, m) => check_ack(&mut model, g, u, m, e.ack(g, u, m)),
            Op::ClearHistory(g, u, m) => {
                let r = e.clear_history(g, u, m);
                match model.get_mut(&g) {
                    None => assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}"),
                    Some(gm) => {
                        let head = gm.head();
                        match gm.members.get_mut(&u) {
                            None => {
                                assert!(matches!(r, Err(Error::NotMember { .. })), "{r:?}")
                            }
                            Some(mm) => {
                                // Journaled and synced before it returns:
                                // what it sets is persisted.
                                let up = m.min(head);
                                mm.join_point = mm.join_point.max(up + 1);
                                mm.cursor = mm.cursor.max(up);
                                mm.persisted = mm.persisted.max(up);
                                assert_eq!(r.unwrap(), mm.join_point, "clear {g} {u} {m}");
                            }
                        }
                    }
                }
            }
            Op::BatchAck(u, acks) => {
                let results = e.batch_ack(u, &acks);
                assert_eq!(results.len(), acks.len());
                for ((g, m), r) in acks.into_iter().zip(results) {
                    let cursor = r.cursor;
                    check_ack(&mut model, g, u, m, r.error.map_or(Ok(cursor), Err));
                    // Every pair, refused ones too, reports the cursor as it
                    // stands right after that pair.
                    let expected = model
                        .get(&g)
                        .and_then(|gm| gm.members.get(&u))
                        .map_or(0, |mm| mm.cursor);
                    assert_eq!(cursor, expected, "batch ack {g} {u} {m}");
                }
            }
            Op::Pull(g, u, n, ack) => {
                let r = e.pull(g, u, n as usize, 1 << 20, ack);
                let Some(gm) = model.get_mut(&g) else {
                    assert!(
                        matches!(r, Err(Error::GroupNotFound { .. })),
                        "{:?}",
                        r.as_ref().err()
                    );
                    continue_checks(e, &model);
                    continue;
                };
                let head = gm.head();
                let Some(mm) = gm.members.get_mut(&u) else {
                    assert!(
                        matches!(r, Err(Error::NotMember { .. })),
                        "{:?}",
                        r.as_ref().err()
                    );
                    continue_checks(e, &model);
                    continue;
                };
                if let Some(a) = ack.filter(|&a| a > head) {
                    assert!(
                        matches!(r, Err(Error::CursorAboveHead { .. })),
                        "pull with ack {a} above head {head}: {:?}",
                        r.as_ref().err()
                    );
                    continue_checks(e, &model);
                    continue;
                }
                if let Some(a) = ack {
                    mm.cursor = mm.cursor.max(a);
                }
                if mm.cursor + 1 < gm.floor {
                    assert!(
                        matches!(r, Err(Error::BelowRetentionFloor { earliest, .. }) if earliest == gm.floor),
                        "pull below the floor: {:?}",
                        r.as_ref().err()
                    );
                    continue_checks(e, &model);
                    continue;
                }
                let p = r.unwrap();
                assert_eq!((p.cursor, p.head), (mm.cursor, head));
                let cursor = mm.cursor;
                let got: Vec<(u64, Vec<u8>)> = p
                    .batch
                    .records()
                    .map(|r| (r.header.msg_id, gm.stored_payload(g, &r)))
                    .collect();
                let expected: Vec<(u64, Vec<u8>)> = (cursor + 1..=head)
                    .take(n as usize)
                    .map(|id| (id, gm.payload_of(g, id)))
                    .collect();
                assert_eq!(got, expected, "pull {g} {u}");
                let last = expected.last().map_or(cursor, |r| r.0);
                assert_eq!(p.batch.has_more, last < head);
            }
            Op::Unread(u) => check_unread(e, &model, u),
            Op::Sync(u) => {
                let s = e.sync(u, 2, 1 << 20, None).unwrap();
                assert!(s.continue_after.is_none());
                let got: Vec<(u64, Vec<u64>)> = s
                    .groups
                    .iter()
                    .map(|g| {
                        let gm = &model[&g.unread.group_id];
                        assert_eq!(g.unread.unread, gm.unread(g.unread.cursor));
                        (
                            g.unread.group_id,
                            g.batch.records().map(|r| r.header.msg_id).collect(),
                        )
                    })
                    .collect();
                // Every group with records above the cursor, counted as
                // unread or not (an edit of a read message is delivered).
                let expected: Vec<(u64, Vec<u64>)> = model
                    .iter()
                    .filter_map(|(&g, gm)| {
                        let mm = gm.members.get(&u)?;
                        let above = gm.head() - mm.cursor;
                        // Below the floor: listed without records.
                        let ids = if mm.cursor + 1 < gm.floor {
                            Vec::new()
                        } else {
                            (mm.cursor + 1..=mm.cursor + above.min(2)).collect()
                        };
                        (above > 0).then_some((g, ids))
                    })
                    .collect();
                assert_eq!(got, expected, "sync {u}");
            }
            Op::History(g, u, before, n) => {
                let before = (before != 0).then_some(before);
                let r = e.history(g, u, before, n as usize, usize::MAX);
                match model
                    .get(&g)
                    .and_then(|gm| gm.members.get(&u).map(|mm| (gm, mm)))
                {
                    Some((gm, mm)) => {
                        let h = r.unwrap();
                        let end = before.unwrap_or(gm.head() + 1).min(gm.head() + 1);
                        let earliest = mm.join_point.max(gm.floor);
                        let start = earliest.max(end.saturating_sub(n as u64)).max(1);
                        let got: Vec<u64> = h.batch.records().map(|r| r.header.msg_id).collect();
                        assert_eq!(got, (start..end).collect::<Vec<_>>(), "history {g} {u}");
                        assert_eq!(h.complete, start <= earliest.max(1));
                    }
                    None => assert!(r.is_err()),
                }
            }
            Op::HistoryLatest(g, u, before, n) => {
                let before = (before != 0).then_some(before);
                let r = e.history_latest(g, u, before, n as usize, usize::MAX);
                match model
                    .get(&g)
                    .and_then(|gm| gm.members.get(&u).map(|mm| (gm, mm)))
                {
                    Some((gm, mm)) => {
                        let p = r.unwrap();
                        let end = before.unwrap_or(gm.head() + 1).min(gm.head() + 1);
                        let earliest = mm.join_point.max(gm.floor);
                        let start = earliest.max(end.saturating_sub(n as u64)).max(1);
                        let mut got = Vec::new();
                        for c in &p.history.batch.chunks {
                            let mut b = c.bytes();
                            while let Some(len) = record::peek_len(b) {
                                let r = &b[..len];
                                assert_eq!(crc32fast::hash(&r[8..]).to_le_bytes(), r[4..8]);
                                got.push((record::peek_msg_id(r), r[41], r[44..].to_vec()));
                                b = &b[len..];
                            }
                        }
                        let expected: Vec<(u64, u8, Vec<u8>)> = (start..end)
                            .filter_map(|id| gm.latest(g, id).map(|(f, p)| (id, f, p)))
                            .collect();
                        assert_eq!(got, expected, "history latest {g} {u}");
                        if start < end {
                            assert_eq!(p.next_before, start, "history latest {g} {u}");
                        }
                        assert_eq!(p.history.complete, start <= earliest.max(1));
                    }
                    None => assert!(r.is_err()),
                }
            }
            Op::ReadCount(g, m) => {
                let r = e.read_count(g, m);
                match model.get(&g) {
                    Some(gm) => assert_eq!(
                        r.unwrap() as usize,
                        gm.members.values().filter(|mm| mm.cursor >= m).count(),
                        "read count {g} {m}"
                    ),
                    None => assert!(matches!(r, Err(Error::GroupNotFound { .. }))),
                }
            }
            Op::Flush => {
                e.flush_cursors().unwrap();
                persist_all(&mut model);
            }
            Op::Checkpoint => {
                e.checkpoint().unwrap();
                persist_all(&mut model);
            }
            Op::Reopen | Op::Crash | Op::PowerCut(_) if restarts >= OPS_RESTARTS_MAX => {}
            Op::Reopen => {
                restarts += 1;
                engine.take().unwrap().close().unwrap();
                let e = open().expect("reopen after a clean close");
                assert!(e.recovery_report().clean_shutdown);
                persist_all(&mut model);
                check_contents(&e, &model);
                engine = Some(e);
            }
            Op::Crash => {
                restarts += 1;
                engine.take().unwrap().simulate_crash();
                let e = open().expect("reopen after a crash");
                check_recovered(&e, &mut model, "a crash");
                engine = Some(e);
            }
            Op::PowerCut(n) => {
                restarts += 1;
                let e = engine.take().unwrap();
                wait_quiet(&e);
                control.freeze_after(n);
                // Operations after the cut succeed but reach no media.
                e.checkpoint().unwrap();
                control.freeze();
                e.simulate_crash();
                control
                    .cut(Cut::DropUnsynced)
                    .expect("rewrite the directory as the media held it");
                let e = open().expect("reopen after a power cut in a checkpoint");
                check_recovered(
                    &e,
                    &mut model,
                    &format!("a power cut at operation {n} of a checkpoint"),
                );
                engine = Some(e);
            }
        }
        continue_checks(engine.as_ref().unwrap(), &model);
    }
    let e = engine.take().unwrap();
    check_contents(&e, &model);
    e.close().unwrap();
}

/// Blocks until no checkpoint and no worker job is under way, so that the
/// file-system operations that follow are those the next op causes.
fn wait_quiet(e: &Engine) {
    e.shared.worker.wait_idle();
    let co = &e.shared.ckpt;
    let mut st = co.status.lock();
    while (st.job.is_some() || st.busy) && !st.exited {
        co.cv
            .wait_for(&mut st, std::time::Duration::from_millis(10));
    }
}

/// The checks after a reopen that follows a crash or a power cut: every
/// member is still there with its cursor between its last persisted value
/// and its last ACK, and every stored message is intact. The recovered
/// cursors become the persisted ones once the checkpoint recovery asks
/// for (taken beside the rounds) is stored: waited for here.
fn check_recovered(e: &Engine, model: &mut BTreeMap<u64, GroupModel>, after: &str) {
    for (&g, gm) in model.iter_mut() {
        for (&u, mm) in gm.members.iter_mut() {
            let row = e.unread(u).into_iter().find(|r| r.group_id == g);
            let c = row
                .unwrap_or_else(|| panic!("{after} lost member {u} of group {g}"))
                .cursor;
            assert!(
                mm.persisted <= c && c <= mm.cursor,
                "group {g} user {u}: cursor {c} after {after}, not in [{}, {}]",
                mm.persisted,
                mm.cursor
            );
            mm.cursor = c;
        }
    }
    e.checkpoint().expect("the checkpoint after recovery");
    persist_all(model);
    check_contents(e, model);
}

/// The checks after every op: heads (dense ids, nothing lost), and every
/// user's unread rows against the oracle.
fn continue_checks(e: &Engine, model: &BTreeMap<u64, GroupModel>) {
    let mut ids = e.group_ids();
    ids.sort_unstable();
    assert_eq!(ids, model.keys().copied().collect::<Vec<_>>(), "groups");
    for (&g, gm) in model {
        assert_eq!(e.head(g).unwrap(), gm.head(), "group {g}: head");
        assert_eq!(e.group_info(g).unwrap().floor, gm.floor, "group {g}: floor");
    }
    for u in 1..=OPS_USERS {
        check_unread(e, model, u);
    }
}

fn check_unread(e: &Engine, model: &BTreeMap<u64, GroupModel>, u: u64) {
    let got: Vec<(u64, u64, u64, u64)> = e
        .unread(u)
        .iter()
        .map(|r| {
            assert!(
                r.unread <= r.head - r.cursor,
                "unread above head - cursor: {r:?}"
            );
            (r.group_id, r.head, r.cursor, r.unread)
        })
        .collect();
    let expected: Vec<(u64, u64, u64, u64)> = model
        .iter()
        .filter_map(|(&g, gm)| {
            let mm = gm.members.get(&u)?;
            Some((g, gm.head(), mm.cursor, gm.unread(mm.cursor)))
        })
        .collect();
    assert_eq!(
        got, expected,
        "unread of user {u} (group, head, cursor, unread)"
    );
}

/// Every stored message, byte for byte, with dense ids; a recalled
/// message may be stored in erased form (storage.md section 3,
/// "Erasure": the same length, zeros), any other never.
fn check_contents(e: &Engine, model: &BTreeMap<u64, GroupModel>) {
    for (&g, gm) in model {
        let batch = e.read(g, 0, usize::MAX, usize::MAX).unwrap();
        let got: Vec<(u64, u64, u64, Vec<u8>)> = batch
            .records()
            .map(|r| {
                let h = r.header;
                (
                    h.msg_id,
                    h.sender_id,
                    h.client_msg_id,
                    gm.stored_payload(g, &r),
                )
            })
            .collect();
        let expected: Vec<(u64, u64, u64, Vec<u8>)> = (gm.floor..=gm.head())
            .map(|id| {
                let r = gm.messages[id as usize - 1];
                (id, r.s, r.c, gm.payload_of(g, id))
            })
            .collect();
        assert_eq!(got, expected, "group {g}: stored messages");
        // Every stored message in its latest state, as HISTORY_LATEST
        // shows it to a member (the first one).
        if let Some((&u, mm)) = gm.members.iter().next() {
            let p = e
                .history_latest(g, u, None, usize::MAX, usize::MAX)
                .unwrap();
            let mut got = Vec::new();
            for c in &p.history.batch.chunks {
                let mut b = c.bytes();
                while let Some(len) = record::peek_len(b) {
                    got.push((record::peek_msg_id(b), b[41], b[44..len].to_vec()));
                    b = &b[len..];
                }
            }
            let expected: Vec<(u64, u8, Vec<u8>)> = (mm.join_point.max(gm.floor)..=gm.head())
                .filter_map(|id| gm.latest(g, id).map(|(f, p)| (id, f, p)))
                .collect();
            assert_eq!(got, expected, "group {g}: latest state");
        }
    }
}

/// An edit or a recall against the oracle: the rules, the retransmit,
/// the new record.
#[allow(clippy::too_many_arguments)]
fn check_change(
    e: &Engine,
    model: &mut BTreeMap<u64, GroupModel>,
    g: u64,
    s: u64,
    c: u64,
    target: u64,
    change: crate::Change<'_>,
    len: u8,
) {
    let r = e.change(&crate::ChangeRequest {
        group_id: g,
        sender_id: s,
        client_msg_id: c,
        target,
        change,
        admin: s == OPS_ADMIN,
    });
    let Some(gm) = model.get_mut(&g) else {
        assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
        return;
    };
    let kind = match change {
        crate::Change::Edit(_) => KIND_EDIT,
        crate::Change::Recall => KIND_RECALL,
    };
    // One key space (protocol.md "One key space"): a remembered key names
    // one request; the same kind and target is a retransmit, anything else
    // is refused as a reused key naming the original.
    let repeats = |id: u64| {
        let m = gm.messages[id as usize - 1];
        m.kind == kind && m.target == target
    };
    match (gm.original(s, c), r) {
        (Some(Ok(id)), Err(Error::KeyReused { msg_id, .. })) if !repeats(id) => {
            assert_eq!(msg_id, id, "a reused key names its original");
        }
        (Some(Ok(id)), r) => {
            let a = r.unwrap();
            assert!(a.duplicate, "a retransmitted change was stored again");
            assert_eq!(a.msg_id, id);
        }
        (Some(Err(id)), Ok(a)) if a.duplicate => assert_eq!(a.msg_id, id),
        (Some(Err(id)), Err(Error::KeyReused { msg_id, .. })) => assert_eq!(msg_id, id),
        (_, r) => match gm.change_refusal(s, target) {
            Some(why) => match r {
                Err(Error::ChangeRefused { why: got, .. }) => {
                    assert_eq!(got, why, "change of {target} in {g} by {s}")
                }
                other => panic!("change of {target} in {g} by {s}: {other:?}, want {why:?}"),
            },
            None => {
                let a = r.unwrap();
                assert!(!a.duplicate);
                let rec = Rec {
                    s,
                    c,
                    len,
                    kind,
                    target,
                };
                assert_eq!(a.msg_id, gm.push(rec), "ids not dense");
            }
        },
    }
}

fn check_ack(model: &mut BTreeMap<u64, GroupModel>, g: u64, u: u64, m: u64, r: crate::Result<u64>) {
    let Some(gm) = model.get_mut(&g) else {
        assert!(matches!(r, Err(Error::GroupNotFound { .. })), "{r:?}");
        return;
    };
    let head = gm.head();
    let Some(mm) = gm.members.get_mut(&u) else {
        assert!(matches!(r, Err(Error::NotMember { .. })), "{r:?}");
        return;
    };
    if m > head {
        assert!(matches!(r, Err(Error::CursorAboveHead { .. })), "{r:?}");
        return;
    }
    mm.cursor = mm.cursor.max(m);
    assert_eq!(r.unwrap(), mm.cursor, "ack {g} {u} {m}");
}

fn persist_all(model: &mut BTreeMap<u64, GroupModel>) {
    for gm in model.values_mut() {
        for mm in gm.members.values_mut() {
            mm.persisted = mm.cursor;
        }
    }
}

/// Seed op sequences: the paths a short run of the oracle test covers.
pub fn engine_ops_seeds() -> Vec<Vec<u8>> {
    use Op::*;
    let basic = vec![
        Create(1),
        Join(1, 1, JoinStart::Head),
        Join(1, 2, JoinStart::Earliest),
        Append(1, 1, 1, 10),
        Append(1, 2, 1, 20),
        Append(1, 2, 1, 20),
        Ack(1, 2, 1),
        Pull(1, 2, 2, Some(2)),
        Unread(2),
        Sync(1),
        History(1, 2, 0, 3),
        ReadCount(1, 1),
    ];
    let crash = vec![
        Create(1),
        Create(2),
        Join(1, 1, JoinStart::Head),
        Join(2, 1, JoinStart::Head),
        Append(1, 3, 1, 40),
        Append(2, 3, 1, 40),
        Append(1, 3, 2, 40),
        Ack(1, 1, 2),
        Flush,
        Ack(2, 1, 1),
        Crash,
        Unread(1),
        Append(1, 3, 2, 40),
        Append(1, 3, 3, 40),
        Reopen,
        Pull(1, 1, 4, None),
    ];
    let membership = vec![
        Create(3),
        Join(3, 4, JoinStart::At(0)),
        Append(3, 4, 0, 1),
        Append(3, 1, 0, 47),
        Leave(3, 4),
        Join(3, 4, JoinStart::At(2)),
        BatchAck(4, vec![(3, 2), (1, 1), (3, 9)]),
        Delete(3),
        Create(3),
        Join(3, 4, JoinStart::Earliest),
        Checkpoint,
        Crash,
        Unread(4),
    ];
    let mut segments = vec![Create(2), Join(2, 2, JoinStart::Earliest)];
    for i in 0..40 {
        segments.push(Append(2, 1 + i % 4, i % 8, 47));
    }
    segments.extend([
        Ack(2, 2, 9),
        Crash,
        History(2, 2, 20, 4),
        Pull(2, 2, 4, Some(11)),
    ]);
    // Power cuts early in a checkpoint (its cursor round and journal roll),
    // in its run part and manifest writes, and past its end; a crash and
    // a cut after the first checkpoint of a recovery.
    let mut cuts = vec![
        Create(1),
        Create(2),
        Join(1, 1, JoinStart::Earliest),
        Join(2, 2, JoinStart::Earliest),
    ];
    for (i, n) in [1u64, 6, 12, 64].into_iter().enumerate() {
        let i = i as u64;
        cuts.extend([
            Append(1, 3, i, 30),
            Append(2, 3, i, 30),
            Ack(1, 1, i + 1),
            Ack(2, 2, i + 1),
            PowerCut(n),
        ]);
    }
    cuts.extend([Delete(2), Ack(1, 1, 2), Crash, PowerCut(3), Unread(1)]);
    // History clears: one member's, below and above the head, through a
    // crash (replay) and a power cut in a checkpoint.
    let clears = vec![
        Create(1),
        Join(1, 1, JoinStart::Earliest),
        Join(1, 2, JoinStart::Earliest),
        Append(1, 3, 1, 10),
        Append(1, 3, 2, 10),
        Append(1, 3, 3, 10),
        ClearHistory(1, 1, 2),
        Crash,
        History(1, 1, 0, 4),
        History(1, 2, 0, 4),
        Unread(1),
        ClearHistory(1, 2, 20),
        ClearHistory(1, 1, 1),
        PowerCut(6),
        Pull(1, 1, 4, None),
        History(1, 2, 0, 4),
        ClearHistory(1, 4, 1),
        ClearHistory(3, 1, 1),
    ];
    // Edits and recalls (the rules, a retransmit, the administrator,
    // unread exact) through a crash and a power cut, then retention by
    // cursor and by bytes across the quiet ids.
    let changes = vec![
        Create(1),
        Join(1, 1, JoinStart::Earliest),
        Join(1, 2, JoinStart::Earliest),
        Append(1, 3, 1, 10),
        Append(1, 3, 2, 10),
        Append(1, 1, 1, 10),
        Edit(1, 3, 103, 1, 5),
        Recall(1, 3, 104, 2),
        Recall(1, 3, 104, 2),
        Recall(1, 2, 105, 3),
        Recall(1, OPS_ADMIN, 105, 3),
        Edit(1, 3, 106, 2, 5),
        Unread(1),
        Crash,
        Unread(2),
        Ack(1, 1, 5),
        Retain(1, false),
        Edit(1, 1, 107, 3, 4),
        PowerCut(5),
        Sync(1),
        Retain(1, true),
        Pull(1, 2, 4, None),
        History(1, 2, 0, 4),
        HistoryLatest(1, 2, 0, 4),
        HistoryLatest(1, 1, 6, 3),
        Unread(2),
    ];
    [basic, crash, membership, segments, cuts, clears, changes]
        .iter()
        .map(|ops| encode_ops(ops))
        .collect()
}

// ---------------------------------------------------------------------------
// append_replicated

/// Flag of an `append_replicated` input: number each payload as the
/// follower's next round and recompute its payload CRC, so the fuzzer gets
/// past those checks to the entry checks and the apply behind them.
pub const REPLICATED_FIX: u8 = 1;

/// A follower's state as compared: every group with its head and record
/// bytes, and the last round.
fn follower_state(e: &Engine) -> (u64, Vec<(u64, u64, Vec<u8>)>) {
    let mut ids = e.group_ids();
    ids.sort_unstable();
    let groups = ids
        .into_iter()
        .map(|g| {
            let head = e.head(g).unwrap_or(0);
            let mut bytes = Vec::new();
            if let Ok(batch) = e.read(g, 0, usize::MAX, usize::MAX) {
                for c in &batch.chunks {
                    bytes.extend_from_slice(c.bytes());
                }
            }
            (g, head, bytes)
        })
        .collect();
    (e.last_round(), groups)
}

/// Input: `{ flags: u8 | n x { len: u16 | payload } }`, at most 16
/// payloads, fed in order to [`Engine::append_replicated`] of an empty
/// follower (flag [`REPLICATED_FIX`]: each renumbered and resealed).
///
/// Checks: no panic; a refused payload is a typed replication error (or
/// the error of a group it names) and changes nothing (last round, groups,
/// heads, record bytes, journal bytes); a taken one is the next round and
/// every record of it reads back byte for byte; after a crash the follower
/// reopens with the same state.
pub fn append_replicated(data: &[u8]) {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let dir = ScratchDir::new("replicated");
    let Ok(b) = open(dir.path()) else {
        panic!("an empty follower opens");
    };
    let journal_bytes = || -> u64 {
        let jdir = crate::commit::journal::journal_dir(dir.path());
        crate::commit::journal::list(&OsVfs, &jdir)
            .map(|files| {
                files
                    .iter()
                    .map(|(_, p)| std::fs::metadata(p).map_or(0, |m| m.len()))
                    .sum()
            })
            .unwrap_or(0)
    };
    for _ in 0..16 {
        if rest.len() < 2 {
            break;
        }
        let len = (u16_at(rest, 0) as usize).min(rest.len() - 2);
        let mut payload = rest[2..2 + len].to_vec();
        rest = &rest[2 + len..];
        if flags & REPLICATED_FIX != 0 && payload.len() >= PAYLOAD_HEADER_BYTES {
            let next = b.last_round() + 1;
            payload[8..16].copy_from_slice(&next.to_le_bytes());
            let crc = crc32fast::hash(&payload[4..]);
            put_u32(&mut payload, 0, crc);
        }
        let before = follower_state(&b);
        let bytes_before = journal_bytes();
        match b.append_replicated(&payload) {
            Ok(round) => {
                assert_eq!(round, before.0 + 1, "the next round");
                assert_eq!(b.last_round(), round);
                let entries: Vec<_> =
                    journal::EntryIter::new(&payload[PAYLOAD_HEADER_BYTES..], FrameKind::Round)
                        .collect();
                let deleted = |g: u64| {
                    entries
                        .iter()
                        .any(|d| d.group_id == g && d.kind == EntryKind::DeleteGroup)
                };
                for e in entries.iter().filter(|e| e.kind == EntryKind::Records) {
                    if deleted(e.group_id) {
                        continue; // its records left with it
                    }
                    let Some((first, n)) = journal::body::decode_records(e.body) else {
                        panic!("a taken round holds an invalid Records body");
                    };
                    let batch = match b.read(e.group_id, first - 1, n as usize, usize::MAX) {
                        Ok(batch) => batch,
                        Err(err) => panic!("group {}: {err}", e.group_id),
                    };
                    let got: Vec<u8> = batch
                        .chunks
                        .iter()
                        .flat_map(|c| c.bytes().to_vec())
                        .collect();
                    assert_eq!(
                        got, e.body,
                        "group {}: replicated records read back",
                        e.group_id
                    );
                }
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        Error::InvalidRound { .. }
                            | Error::RoundOutOfOrder { .. }
                            | Error::GroupDamaged { .. }
                            | Error::GroupNotFound { .. }
                    ),
                    "unexpected refusal: {e}"
                );
                assert_eq!(
                    follower_state(&b),
                    before,
                    "a refused payload changed state: {e}"
                );
                assert_eq!(
                    journal_bytes(),
                    bytes_before,
                    "a refused payload was written: {e}"
                );
            }
        }
    }
    let want = follower_state(&b);
    b.simulate_crash();
    let b = match open(dir.path()) {
        Ok(b) => b,
        Err(e) => panic!("the follower does not reopen: {e}"),
    };
    assert_eq!(follower_state(&b), want, "state after the follower's crash");
}

/// Seeds of `append_replicated`: the rounds of a small leader (creations,
/// sends with a retransmit, joins, an ACK flush, a delete), as the target
/// reads them, with and without [`REPLICATED_FIX`].
pub fn append_replicated_seeds() -> Vec<Vec<u8>> {
    let dir = ScratchDir::new("replicated-seed");
    let Ok(a) = open(dir.path()) else {
        return Vec::new();
    };
    let ops = || -> crate::Result<()> {
        a.create_group(1)?;
        a.create_group(2)?;
        a.append(1, 7, 1, b"hello")?;
        a.join(1, 7, JoinStart::Earliest)?;
        a.append(2, 8, 1, b"world")?;
        a.append(1, 7, 1, b"hello")?;
        a.append(1, 8, 2, b"again")?;
        a.ack(1, 7, 2)?;
        a.flush_cursors()?;
        a.delete_group(2)?;
        Ok(())
    };
    if ops().is_err() {
        return Vec::new();
    }
    let Ok(rounds) = a.read_rounds(1, a.last_round(), usize::MAX) else {
        return Vec::new();
    };
    let mut input = vec![0];
    for r in &rounds {
        input.extend_from_slice(&(r.bytes.len() as u16).to_le_bytes());
        input.extend_from_slice(&r.bytes);
    }
    let mut fixed = input.clone();
    fixed[0] = REPLICATED_FIX;
    vec![input, fixed]
}

// ---------------------------------------------------------------------------
// cold_scan

/// Recomputes the checksums of a cold file image: the file header's, then,
/// walking extents by their `bytes` fields, each record's (as far as the
/// record lengths allow) and each extent header's.
fn fix_cold(b: &mut [u8]) {
    use crate::logs::cold::{COLD_HEADER_BYTES, EXTENT_HEADER_BYTES};
    if b.len() < COLD_HEADER_BYTES {
        return;
    }
    let crc = crc32fast::hash(&b[0..28]);
    put_u32(b, 28, crc);
    let mut pos = COLD_HEADER_BYTES;
    while b.len() - pos >= EXTENT_HEADER_BYTES {
        let bytes = u32_at(b, pos + 4) as usize;
        let records = pos + EXTENT_HEADER_BYTES;
        let records_end = records + bytes.min(b.len() - records);
        fix_records(&mut b[records..records_end], false);
        let crc = crc32fast::hash(&b[pos + 4..pos + EXTENT_HEADER_BYTES]);
        put_u32(b, pos, crc);
        pos = match records.checked_add(bytes) {
            Some(next) if next <= b.len() => next,
            _ => return,
        };
    }
}

/// Input: `{ flags: u8 | durable: u8 | bytes }`: `bytes` is a cold file,
/// scanned with `durable_len = len(bytes) * durable / 255`. Flag bit 0
/// recomputes the checksums (so the fuzzer reaches the field checks and the
/// record walk behind them); bit 1 has the scan check record CRCs.
///
/// Checks: extents tile the file from its header to `valid_len`, each inside
/// the file, with the bytes the file holds there; the walked prefix is
/// exactly what the encoders write for what was decoded; an extent without
/// damage holds `count` whole records with dense ids filling `bytes`; damage
/// (of an extent, or an error) only below the durable length, a torn end
/// only at or past it; a clean end only at the end of the file; the scanner
/// stays ended.
pub fn cold_scan(data: &[u8]) {
    use crate::logs::cold::{ColdError, ColdHeader, ColdScanner, ScanEnd, COLD_HEADER_BYTES};
    if data.len() < 2 {
        return;
    }
    let (flags, durable) = (data[0], data[1]);
    let mut file = data[2..].to_vec();
    if flags & 1 != 0 {
        fix_cold(&mut file);
    }
    let durable_len = file.len() as u64 * u64::from(durable) / 255;
    let mut scan = match ColdScanner::new(&file[..], durable_len, flags & 2 != 0) {
        Ok(s) => s,
        Err(e) => {
            assert_eq!(ColdHeader::decode(&file).err(), Some(e));
            return;
        }
    };
    let mut rebuilt = scan.header().encode().to_vec();
    assert_eq!(rebuilt[..], file[..COLD_HEADER_BYTES]);
    loop {
        let at = scan.valid_len();
        match scan.next_extent() {
            Ok(Some(e)) => {
                assert_eq!(e.offset, at, "extents must tile the file");
                let records = e.offset as usize + 32;
                let end = records + e.header.bytes as usize;
                assert_eq!(scan.valid_len(), end as u64);
                assert_eq!(e.records[..], file[records..end]);
                rebuilt.extend_from_slice(&e.header.encode());
                rebuilt.extend_from_slice(&e.records);
                match &e.damage {
                    None => {
                        let (mut pos, mut id) = (0, e.header.first_msg_id);
                        while pos < e.records.len() {
                            let h =
                                record::decode_header(&e.records[pos..], RECORD_BYTES_STORED_MAX)
                                    .expect("an undamaged extent holds whole records");
                            assert_eq!(h.msg_id, id);
                            pos += h.record_len as usize;
                            id += 1;
                        }
                        assert_eq!(id - e.header.first_msg_id, u64::from(e.header.count));
                    }
                    Some(d) => {
                        assert!(
                            e.offset < durable_len,
                            "damage past the durable length: {d}"
                        );
                        assert!(
                            matches!(d, ColdError::Record { group, .. } if *group == e.header.group_id)
                        );
                    }
                }
            }
            Ok(None) => {
                match scan.end() {
                    Some(ScanEnd::Clean) => assert_eq!(at, file.len() as u64),
                    Some(ScanEnd::Torn { offset, .. }) => {
                        assert_eq!(*offset, at);
                        assert!(at >= durable_len && at < file.len() as u64);
                    }
                    None => panic!("a scan that returned None must say how it ended"),
                }
                assert_eq!(scan.next_extent(), Ok(None), "the scan stays ended");
                break;
            }
            Err(e) => {
                assert!(
                    at < durable_len,
                    "an error at or past the durable length: {e}"
                );
                break;
            }
        }
    }
    assert_eq!(rebuilt[..], file[..scan.valid_len() as usize]);
}

/// Seeds of `cold_scan`: a clean file (durable), the same with a torn tail
/// (half durable, CRCs recomputed and checked) and with a damaged record.
fn cold_scan_seeds() -> Vec<(&'static str, Vec<u8>)> {
    use crate::logs::cold::{ColdHeader, ExtentHeader};
    let mut file = ColdHeader { seq: 1 }.encode().to_vec();
    for (group, first, n) in [(1u64, 1u64, 2u64), (2, 5, 1), (3, 1, 3)] {
        let mut recs = Vec::new();
        for id in first..first + n {
            let payload = [id as u8; 5];
            record::encode_into(
                &NewRecord {
                    msg_id: id,
                    timestamp_ms: id,
                    sender_id: group,
                    client_msg_id: id,
                    payload: &payload,
                },
                &mut recs,
            );
        }
        let h = ExtentHeader {
            bytes: recs.len() as u32,
            group_id: group,
            first_msg_id: first,
            count: n as u32,
        };
        file.extend_from_slice(&h.encode());
        file.extend_from_slice(&recs);
    }
    let torn = &file[..file.len() - 20];
    let mut damaged = file.clone();
    damaged[32 + 32 + 50] ^= 1;
    vec![
        ("clean", [&[0, 255], &file[..]].concat()),
        ("torn", [&[3, 128], torn].concat()),
        ("damaged-record", [&[2, 255], &damaged[..]].concat()),
    ]
}
