//! Test vectors of format-spec/vectors/storage tie the spec to the code.
//!
//! Each `.hex` file is the byte-exact encoding of one structure described in
//! format-spec/storage.md. Every test checks both directions: the encoder
//! produces exactly the vector's bytes, and the decoder turns the vector's
//! bytes back into the documented field values.

use std::path::Path;

use crate::commit::journal::frame::{self, FrameIter};
use crate::commit::journal::{
    self, EntryIter, EntryKind, FrameBuf, FrameKind, JournalStart, ENTRY_HEADER_BYTES,
    JOURNAL_HEADER_BYTES,
};
use crate::io::OsVfs;
use crate::logs::record::{self, NewRecord, RecordError, KIND_MESSAGE, RECORD_HEADER_BYTES};
use crate::logs::retention::Retention;
use crate::logs::segment::{self, ScanStop, SegmentFile, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::state::manifest::{self, Manifest, RunMeta};
use crate::state::run::{
    PartMeta, PartReader, RunItems, RunWriter, RUN_FILE_BYTES_MIN, RUN_FILE_BYTES_READ_MAX,
};
use crate::state::{Item, Key};
use crate::{Config, Engine, JoinStart};

const RECORD: &str = include_str!("../../format-spec/vectors/storage/record.hex");
const RECORD_GAP: &str = include_str!("../../format-spec/vectors/storage/record-gap.hex");
const SEGMENT_HEADER: &str = include_str!("../../format-spec/vectors/storage/segment-header.hex");
const JOURNAL_HEADER: &str = include_str!("../../format-spec/vectors/storage/journal-header.hex");
const JOURNAL_FRAME: &str = include_str!("../../format-spec/vectors/storage/journal-frame.hex");
const JOURNAL_ENTRY_RECORDS: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-records.hex");
const JOURNAL_ENTRY_CREATE_GROUP: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-create-group.hex");
const JOURNAL_ENTRY_DELETE_GROUP: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-delete-group.hex");
const FORMAT: &str = include_str!("../../format-spec/vectors/storage/format.hex");
const JOURNAL_ENTRY_JOIN: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-join.hex");
const JOURNAL_ENTRY_LEAVE: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-leave.hex");
const JOURNAL_ENTRY_CURSORS: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-cursors.hex");
const JOURNAL_ENTRY_SET_RETENTION: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-set-retention.hex");
const JOURNAL_ENTRY_CLEAR_HISTORY: &str =
    include_str!("../../format-spec/vectors/storage/journal-entry-clear-history.hex");
const RUN_PART: &str = include_str!("../../format-spec/vectors/storage/run-part.hex");
const MANIFEST: &str = include_str!("../../format-spec/vectors/storage/manifest.hex");

const TIMESTAMP_MS: u64 = 1_700_000_000_000;
const RECORD_BYTES_MAX: usize = RECORD_HEADER_BYTES + (1 << 20);

/// Parses a vector: lines starting with `#` are comments, everything else is
/// whitespace-separated two-digit hex bytes.
fn parse_hex(text: &str) -> Vec<u8> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(|tok| {
            assert_eq!(tok.len(), 2, "hex token {tok:?} is not one byte");
            u8::from_str_radix(tok, 16).unwrap_or_else(|_| panic!("bad hex token {tok:?}"))
        })
        .collect()
}

/// The `# total: N bytes` line every vector carries.
fn declared_total(text: &str) -> usize {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("# total: "))
        .expect("vector declares its total");
    line.trim_end_matches(" bytes").parse().unwrap()
}

/// The mark key of `journal-header.hex`, mixed into the envelope checksum
/// of `journal-frame.hex`.
const VECTOR_MARK_KEY: u32 = 0x0403_0201;

/// The bytes of `format-spec/vectors/storage/<name>.hex`, for tests
/// elsewhere that build files from the vectors.
pub(crate) fn storage_vector(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../format-spec/vectors/storage")
        .join(format!("{name}.hex"));
    vector(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

fn vector(text: &str) -> Vec<u8> {
    let bytes = parse_hex(text);
    assert_eq!(bytes.len(), declared_total(text), "vector length");
    bytes
}

fn sample_record() -> NewRecord<'static> {
    NewRecord {
        msg_id: 1,
        timestamp_ms: TIMESTAMP_MS,
        sender_id: 42,
        client_msg_id: 7,
        payload: b"hello",
    }
}

#[test]
fn record_vector_matches_the_encoder_and_decodes_to_its_fields() {
    let v = vector(RECORD);
    let mut out = Vec::new();
    record::encode_into(&sample_record(), &mut out);
    assert_eq!(out, v);

    let h = record::decode_verified(&v, RECORD_BYTES_MAX).unwrap();
    assert_eq!(h.record_len, 49);
    assert_eq!(h.crc, 0x9673_09e2);
    assert_eq!(h.msg_id, 1);
    assert_eq!(h.timestamp_ms, TIMESTAMP_MS);
    assert_eq!(h.sender_id, 42);
    assert_eq!(h.client_msg_id, 7);
    assert_eq!(h.kind, KIND_MESSAGE);
    assert_eq!(h.flags, 0);
    assert_eq!(h.payload_len(), 5);
    assert_eq!(&v[RECORD_HEADER_BYTES..], b"hello");
    // The CRC covers bytes 8..record_len.
    assert_eq!(crc32fast::hash(&v[8..]), h.crc);
}

#[test]
fn gap_record_vector_matches_the_encoder_and_decodes_to_its_fields() {
    let v = vector(RECORD_GAP);
    let mut out = Vec::new();
    record::encode_gap_into(2, TIMESTAMP_MS, &mut out);
    assert_eq!(out, v);
    let h = record::decode_verified(&v, RECORD_BYTES_MAX).unwrap();
    assert_eq!(h.record_len, 44);
    assert_eq!(h.crc, 0x299df9c4);
    assert_eq!(
        (h.msg_id, h.timestamp_ms, h.sender_id, h.client_msg_id),
        (2, TIMESTAMP_MS, 0, 0)
    );
    assert_eq!((h.kind, h.flags), (record::KIND_GAP, 0));
    assert!(record::is_gap(&h));
}

#[test]
fn record_invalid_values_get_the_documented_errors() {
    let v = vector(RECORD);
    let with = |off: usize, byte: u8| {
        let mut b = v.clone();
        b[off] = byte;
        b
    };
    // record_len below the header size, or above the configured maximum.
    let mut short = v.clone();
    short[0..4].copy_from_slice(&43u32.to_le_bytes());
    assert_eq!(
        record::decode_verified(&short, RECORD_BYTES_MAX),
        Err(RecordError::BadLength { record_len: 43 })
    );
    assert_eq!(
        record::decode_verified(&v, 48),
        Err(RecordError::BadLength { record_len: 49 })
    );
    // Fewer bytes than record_len.
    assert_eq!(
        record::decode_verified(&v[..48], RECORD_BYTES_MAX),
        Err(RecordError::Truncated { need: 49, have: 48 })
    );
    // Unknown kind, flags, reserved: rejected before the CRC is looked at.
    for (off, byte, reason) in [
        (40, 0xff, "unknown kind"),
        // Kind 1 (an edit) whose payload ("hello") is shorter than a target id.
        (40, 1, "an edit or recall without a target below its own id"),
        (40, 2, "a recall's payload is not exactly its target id"),
        // Flag bits other than bit 0 (`erased`, which the CRC then
        // catches: see `change_records::erased_vector_...`).
        (41, 2, "reserved bits set"),
        (41, 0x81, "reserved bits set"),
        (42, 1, "reserved bits set"),
        (43, 1, "reserved bits set"),
    ] {
        assert_eq!(
            record::decode_verified(&with(off, byte), RECORD_BYTES_MAX),
            Err(RecordError::BadHeader { reason }),
            "byte {off}"
        );
    }
    // The erased bit set on the stored record: its CRC no longer matches.
    assert!(matches!(
        record::decode_verified(&with(41, 1), RECORD_BYTES_MAX),
        Err(RecordError::BadCrc { .. })
    ));
    // A payload byte changed: checksum mismatch.
    assert!(matches!(
        record::decode_verified(&with(44, b'j'), RECORD_BYTES_MAX),
        Err(RecordError::BadCrc {
            stored: 0x9673_09e2,
            ..
        })
    ));
}

#[test]
fn segment_header_vector_matches_the_encoder_and_decodes_to_its_fields() {
    let v = vector(SEGMENT_HEADER);
    let header = SegmentHeader {
        group_id: 5,
        base_msg_id: 1,
        created_ms: TIMESTAMP_MS,
    };
    assert_eq!(v.len(), SEGMENT_HEADER_BYTES);
    assert_eq!(header.encode().to_vec(), v);
    assert_eq!(SegmentHeader::decode(&v), Ok(header));
    assert_eq!(&v[0..8], &segment::SEGMENT_MAGIC);
    assert_eq!(u16::from_le_bytes([v[8], v[9]]), segment::SEGMENT_VERSION);
    assert_eq!(u16::from_le_bytes([v[10], v[11]]), 64);
    assert_eq!(crc32fast::hash(&v[0..60]).to_le_bytes(), v[60..64]);

    // An unknown version is refused, even with a matching CRC.
    let mut future = v.clone();
    future[8] = 2;
    let crc = crc32fast::hash(&future[0..60]);
    future[60..64].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        SegmentHeader::decode(&future),
        Err("unsupported segment version 2".to_string())
    );
    // header_len other than 64 and non-zero reserved bytes are refused.
    for off in [10, 12, 15, 40, 59] {
        let mut b = v.clone();
        b[off] ^= 1;
        let crc = crc32fast::hash(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            SegmentHeader::decode(&b),
            Err("segment header_len or reserved bytes invalid".to_string()),
            "byte {off}"
        );
    }
}

#[test]
fn segment_file_of_header_and_record_scans_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(segment::file_name(1));
    assert_eq!(
        path.file_name().unwrap().to_str(),
        Some("00000000000000000001.seg")
    );
    let header = SegmentHeader::decode(&vector(SEGMENT_HEADER)).unwrap();
    let record = vector(RECORD);
    let seg = SegmentFile::create(&OsVfs, &path, &header, 1 << 16).unwrap();
    seg.write_at(&record, SEGMENT_HEADER_BYTES as u64).unwrap();
    // A torn tail: the first 10 bytes of a second record.
    seg.write_at(&record[..10], 113).unwrap();

    let file = std::fs::read(&path).unwrap();
    assert_eq!(file[..64], vector(SEGMENT_HEADER)[..]);
    assert_eq!(file[64..113], record[..]);

    let scan = segment::scan(&seg, 123, 5, RECORD_BYTES_MAX, 4096).unwrap();
    assert_eq!(scan.header, header);
    assert_eq!(scan.valid_len, 113);
    assert_eq!(scan.last_id, 1);
    assert_eq!(scan.last_timestamp_ms, TIMESTAMP_MS);
    assert_eq!(scan.records, 1);
    assert_eq!(
        scan.stopped,
        Some(ScanStop::Record(RecordError::Truncated {
            need: RECORD_HEADER_BYTES,
            have: 10
        }))
    );
    // The first record of a segment is always indexed, at its file position.
    assert_eq!(scan.index.floor(1), Some((1, 64)));

    // A segment scanned for another group is corrupt at offset 16.
    match segment::scan(&seg, 113, 6, RECORD_BYTES_MAX, 4096) {
        Err(crate::Error::Corrupt { offset, .. }) => assert_eq!(offset, 16),
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn journal_header_vector_matches_the_encoder_and_decodes_to_its_fields() {
    let v = vector(JOURNAL_HEADER);
    assert_eq!(v.len(), JOURNAL_HEADER_BYTES);
    assert_eq!(
        journal::encode_header(JournalStart::first(1), VECTOR_MARK_KEY).to_vec(),
        v
    );
    let h = journal::decode_header_of(&v).unwrap();
    assert_eq!(
        (h.seq, h.first_lsn, h.first_round, h.mark_key, h.flags),
        (1, 1, 1, VECTOR_MARK_KEY, 0)
    );
    assert_eq!(&v[0..8], &journal::JOURNAL_MAGIC);
    assert_eq!(u16::from_le_bytes([v[8], v[9]]), journal::JOURNAL_VERSION);
    assert_eq!(journal::JOURNAL_VERSION, 3);
    assert_eq!(u16::from_le_bytes([v[10], v[11]]), 48);
    assert_eq!(crc32fast::hash(&v[0..44]).to_le_bytes(), v[44..48]);
    assert_eq!(
        journal::journal_path(Path::new("data/journal"), 1),
        Path::new("data/journal/00000000000000000001.tmj")
    );
    let resealed = |mut b: Vec<u8>| {
        let crc = crc32fast::hash(&b[0..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    };
    // header_len other than 48 and non-zero reserved bytes are refused.
    // (Bit 0 of byte 12 is the one defined flag; the other bits are reserved.)
    for (off, bit) in [(10, 1), (12, 2), (12, 0x80), (13, 1), (15, 1)] {
        let mut b = v.clone();
        b[off] ^= bit;
        assert_eq!(
            journal::decode_header_of(&resealed(b)),
            Err("journal header_len or reserved bytes invalid".to_string()),
            "byte {off} bit {bit:#x}"
        );
    }
    for off in [24, 32] {
        let mut b = v.clone();
        b[off] = 0;
        assert_eq!(
            journal::decode_header_of(&resealed(b)),
            Err("journal header first_lsn or first_round is 0".to_string())
        );
    }
    let mut flagged = v.clone();
    flagged[12] = journal::FLAG_SEGMENTS_MAY_LEAD;
    assert!(journal::decode_header_of(&resealed(flagged))
        .unwrap()
        .segments_may_lead());
    assert!(!h.segments_may_lead());
    // An intact header of another version is recognised as such (recovery
    // refuses the file instead of cutting it as torn).
    assert_eq!(journal::unsupported_version(&v), None);
    let mut future = v.clone();
    future[8] = 4;
    let future = resealed(future);
    assert_eq!(journal::unsupported_version(&future), Some(4));
    assert_eq!(
        journal::decode_header_of(&future),
        Err("unsupported journal version 4".to_string())
    );
    // So is a storage-format-1 header (versions 1 and 2: 32 bytes, CRC of
    // bytes 0..28 at 28), which this build never reads.
    for version in [1u16, 2] {
        let mut old = v[..32].to_vec();
        old[8..10].copy_from_slice(&version.to_le_bytes());
        old[10..12].copy_from_slice(&32u16.to_le_bytes());
        old[16..32].copy_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0]);
        let crc = crc32fast::hash(&old[0..28]);
        old[28..32].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(journal::unsupported_version(&old), Some(version));
        assert!(journal::decode_header_of(&old).is_err());
    }
    // A damaged header (CRC mismatch) is not an unknown version.
    let mut torn = future.clone();
    torn[46] ^= 1;
    assert_eq!(journal::unsupported_version(&torn), None);
}

/// Every entry vector, with its kind and body.
fn entry_vectors() -> Vec<(EntryKind, Vec<u8>, Vec<u8>)> {
    let record = vector(RECORD);
    let retention = {
        let mut b = Vec::new();
        journal::body::encode_set_retention(
            &mut b,
            &Retention {
                by_cursor: true,
                max_age_ms: 604_800_000,
                max_bytes: 1 << 30,
            },
        );
        b
    };
    let mut join = Vec::new();
    journal::body::encode_join(&mut join, 300, 0);
    let mut leave = Vec::new();
    journal::body::encode_leave(&mut leave, 300);
    let mut cursors = Vec::new();
    journal::body::encode_cursors(&mut cursors, &[(300, 1)]);
    let mut clear = Vec::new();
    journal::body::encode_clear_history(&mut clear, 300, 1000);
    vec![
        (EntryKind::Records, vector(JOURNAL_ENTRY_RECORDS), record),
        (
            EntryKind::CreateGroup,
            vector(JOURNAL_ENTRY_CREATE_GROUP),
            vec![],
        ),
        (
            EntryKind::DeleteGroup,
            vector(JOURNAL_ENTRY_DELETE_GROUP),
            vec![],
        ),
        (EntryKind::Join, vector(JOURNAL_ENTRY_JOIN), join),
        (EntryKind::Leave, vector(JOURNAL_ENTRY_LEAVE), leave),
        (EntryKind::Cursors, vector(JOURNAL_ENTRY_CURSORS), cursors),
        (
            EntryKind::SetRetention,
            vector(JOURNAL_ENTRY_SET_RETENTION),
            retention,
        ),
        (
            EntryKind::ClearHistory,
            vector(JOURNAL_ENTRY_CLEAR_HISTORY),
            clear,
        ),
    ]
}

#[test]
fn journal_entry_vectors_match_the_encoder_and_decode_to_their_fields() {
    for (kind, v, body) in entry_vectors() {
        assert_eq!(entry(kind, &body), v, "{kind:?}");
        assert_eq!(v[4], kind as u8);
        assert_eq!(
            u32::from_le_bytes(v[0..4].try_into().unwrap()) as usize,
            body.len()
        );
        assert_eq!(only_entry(&v), (kind, 5, body), "{kind:?}");
    }
    // The Records body is the record, byte for byte, CRC included.
    let (_, records, record) = &entry_vectors()[0];
    assert_eq!(records[ENTRY_HEADER_BYTES..], record[..]);
    assert_eq!(journal::body::decode_records(record), Some((1, 1)));
    // Kinds 8 (Trim) and 9 (Promote) are reserved, 0 and the rest invalid.
    for k in [0u8, 8, 9, 11, 255] {
        assert_eq!(EntryKind::from_u8(k), None, "kind {k}");
    }
}

#[test]
fn journal_frame_vector_matches_the_builder_and_decodes_to_its_fields() {
    let v = vector(JOURNAL_FRAME);
    let mut f = FrameBuf::default();
    f.push_entry(EntryKind::CreateGroup, 5, |_| {});
    let s = f.begin_records(5);
    f.extend_body(&vector(RECORD));
    f.finish_entry(s);
    let sealed = f
        .seal(FrameKind::Round, 1, 1, 48, VECTOR_MARK_KEY)
        .unwrap()
        .to_vec();
    assert_eq!(sealed, v);
    // Field by field, as storage.md section 5 lists them.
    let u32_at = |o: usize| u32::from_le_bytes(v[o..o + 4].try_into().unwrap());
    let u64_at = |o: usize| u64::from_le_bytes(v[o..o + 8].try_into().unwrap());
    let mut keyed = VECTOR_MARK_KEY.to_le_bytes().to_vec();
    keyed.extend_from_slice(&v[4..32]);
    assert_eq!(u32_at(0), crc32fast::hash(&keyed));
    assert_eq!(u32_at(4) as usize, v.len() - 32);
    assert_eq!((v[8], u64_at(16), u64_at(24)), (1, 1, 48));
    assert_eq!(u32_at(32), crc32fast::hash(&v[36..]));
    assert_eq!(
        (u32_at(36), u64_at(40), u64_at(48), u64_at(56)),
        (2, 1, 0, 0)
    );
    let [create, records] = [1, 0].map(|i| entry_vectors()[i].1.clone());
    assert_eq!(v[64..], [create, records].concat()[..]);
    // In the file of journal-header.hex, it is the first frame.
    let mut file = vector(JOURNAL_HEADER);
    file.extend_from_slice(&v);
    let mut it = FrameIter::new(&file, JOURNAL_HEADER_BYTES, VECTOR_MARK_KEY, 1, 1);
    let frame = it.next().unwrap();
    assert_eq!(
        (frame.envelope.lsn, frame.header().round_index, frame.end()),
        (1, 1, file.len())
    );
    let kinds: Vec<_> = frame.entries().map(|e| (e.kind, e.group_id)).collect();
    assert_eq!(
        kinds,
        vec![(EntryKind::CreateGroup, 5), (EntryKind::Records, 5)]
    );
    assert!(it.next().is_none());
    assert_eq!(it.stop_reason(), None);
    // Under another file's key the envelope does not check: a payload that
    // carries these bytes proves nothing about another file.
    assert!(frame::envelope_at(&file, 48, VECTOR_MARK_KEY ^ 1).is_err());
}

#[test]
fn journal_frame_invalid_values_stop_the_walk_as_documented() {
    let mut file = vector(JOURNAL_HEADER);
    let frame_at = file.len();
    file.extend_from_slice(&vector(JOURNAL_FRAME));
    let good_end = file.len();
    file.extend_from_slice(&vector(JOURNAL_FRAME)); // second frame, to be broken
    let reseal = move |b: &mut Vec<u8>| {
        // Payload CRC, then the keyed envelope CRC, of the second frame.
        let p = good_end + 32;
        let crc = crc32fast::hash(&b[p + 4..]);
        b[p..p + 4].copy_from_slice(&crc.to_le_bytes());
        let mut keyed = VECTOR_MARK_KEY.to_le_bytes().to_vec();
        keyed.extend_from_slice(&b[good_end + 4..good_end + 32]);
        let crc = crc32fast::hash(&keyed);
        b[good_end..good_end + 4].copy_from_slice(&crc.to_le_bytes());
    };
    let put = move |b: &mut Vec<u8>, at: usize, bytes: &[u8]| {
        b[good_end + at..good_end + at + bytes.len()].copy_from_slice(bytes)
    };
    // The second frame must be lsn 2, round 2, and may name the first as synced.
    let mut base = file.clone();
    put(&mut base, 16, &2u64.to_le_bytes());
    put(&mut base, 40, &2u64.to_le_bytes());
    reseal(&mut base);
    let walk = |b: &[u8]| {
        let mut it = FrameIter::new(b, JOURNAL_HEADER_BYTES, VECTOR_MARK_KEY, 1, 1);
        let n = it.by_ref().count();
        (n, it.position(), it.stop_reason().map(str::to_owned))
    };
    assert_eq!(walk(&base), (2, base.len(), None));
    type Case = (&'static str, Box<dyn Fn(&mut Vec<u8>)>);
    let cases: Vec<Case> = vec![
        (
            "truncated frame envelope",
            Box::new(move |b| b.truncate(good_end + 31)),
        ),
        (
            "frame envelope checksum mismatch",
            Box::new(move |b| b[good_end + 20] ^= 1),
        ),
        (
            "unknown frame kind 3",
            Box::new(move |b| {
                put(b, 8, &[3]);
                reseal(b)
            }),
        ),
        (
            "reserved envelope bytes set",
            Box::new(move |b| {
                put(b, 9, &[1]);
                reseal(b)
            }),
        ),
        (
            "synced_len 47 outside",
            Box::new(move |b| {
                put(b, 24, &47u64.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "synced_len 194 outside",
            Box::new(move |b| {
                put(b, 24, &194u64.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "frame payload of 114 bytes runs past the end",
            Box::new(move |b| {
                put(b, 4, &114u32.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "frame payload checksum mismatch",
            Box::new(move |b| b[good_end + 100] ^= 1),
        ),
        (
            "reserved payload bytes set",
            Box::new(move |b| {
                put(b, 56, &[1]);
                reseal(b)
            }),
        ),
        (
            "payload holds 2 entries, its header says 3",
            Box::new(move |b| {
                put(b, 36, &3u32.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "unknown entry kind 8",
            Box::new(move |b| {
                put(b, 68, &[8]);
                reseal(b)
            }),
        ),
        (
            "reserved entry bytes set",
            Box::new(move |b| {
                put(b, 69, &[1]);
                reseal(b)
            }),
        ),
        (
            "entry of 66 bytes overruns its payload",
            Box::new(move |b| {
                put(b, 80, &50u32.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "a CreateGroup entry in a Local frame",
            Box::new(move |b| {
                put(b, 8, &[2]);
                put(b, 40, &0u64.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "frame lsn 3 where 2 was expected",
            Box::new(move |b| {
                put(b, 16, &3u64.to_le_bytes());
                reseal(b)
            }),
        ),
        (
            "round_index 1 where 2 was expected",
            Box::new(move |b| {
                put(b, 40, &1u64.to_le_bytes());
                reseal(b)
            }),
        ),
    ];
    for (why, break_it) in cases {
        let mut b = base.clone();
        break_it(&mut b);
        let (n, pos, reason) = walk(&b);
        assert_eq!((n, pos), (1, good_end), "{why}");
        let reason = reason.unwrap_or_default();
        assert!(reason.starts_with(why), "{why}: {reason}");
    }
    assert_eq!(frame_at, JOURNAL_HEADER_BYTES);
}

#[test]
fn format_vector_matches_the_encoder_and_decodes_to_its_version() {
    let v = vector(FORMAT);
    assert_eq!(
        crate::state::format::encode(crate::state::format::FORMAT_VERSION, TIMESTAMP_MS).to_vec(),
        v
    );
    assert_eq!(crate::state::format::decode(&v), Ok(2));
    assert_eq!(&v[0..8], b"TDMKFMT\0");
    assert_eq!(crc32fast::hash(&v[0..28]).to_le_bytes(), v[28..32]);
    assert_eq!(
        crate::state::format::path(Path::new("data")),
        Path::new("data/FORMAT")
    );
}

/// An entry of `kind` for group 5 with `body`, as the engine frames it.
fn entry(kind: EntryKind, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    journal::encode_entry(&mut out, kind, 5, |b| b.extend_from_slice(body));
    out
}

/// The single entry of a vector, decoded: `(kind, group, body)`.
fn only_entry(v: &[u8]) -> (EntryKind, u64, Vec<u8>) {
    let mut it = EntryIter::new(v, FrameKind::Round);
    let e = it.next().expect("one entry");
    assert!(it.next().is_none());
    assert_eq!((it.position(), it.stop_reason()), (v.len(), None));
    (e.kind, e.group_id, e.body.to_vec())
}

#[test]
fn membership_entry_vectors_decode_to_their_fields() {
    let join = vector(JOURNAL_ENTRY_JOIN);
    let (kind, group, body) = only_entry(&join);
    assert_eq!((kind, group, body.len()), (EntryKind::Join, 5, 16));
    assert_eq!(journal::body::decode_join(&body), Some((300, 0)));
    assert_eq!(entry(EntryKind::Join, &body), join);

    let leave = vector(JOURNAL_ENTRY_LEAVE);
    let (kind, group, body) = only_entry(&leave);
    assert_eq!((kind, group), (EntryKind::Leave, 5));
    assert_eq!(journal::body::decode_leave(&body), Some(300));
    assert_eq!(entry(EntryKind::Leave, &body), leave);

    let cursors = vector(JOURNAL_ENTRY_CURSORS);
    let (kind, group, body) = only_entry(&cursors);
    assert_eq!((kind, group, body.len()), (EntryKind::Cursors, 5, 16));
    assert_eq!(body[0..8], 300u64.to_le_bytes());
    assert_eq!(body[8..16], 1u64.to_le_bytes());
    assert_eq!(entry(EntryKind::Cursors, &body), cursors);

    let retention = vector(JOURNAL_ENTRY_SET_RETENTION);
    let (kind, group, body) = only_entry(&retention);
    assert_eq!((kind, group), (EntryKind::SetRetention, 5));
    let policy = Retention {
        by_cursor: true,
        max_age_ms: 604_800_000,
        max_bytes: 1 << 30,
    };
    assert_eq!(journal::body::decode_set_retention(&body), Some(policy));
    let mut encoded = Vec::new();
    journal::body::encode_set_retention(&mut encoded, &policy);
    assert_eq!(encoded, body);

    // Bodies of the wrong length (and by_cursor above 1) are not decoded;
    // replay ignores such entries.
    assert_eq!(journal::body::decode_join(&body[..15]), None);
    assert_eq!(journal::body::decode_leave(&[0; 9]), None);
    let mut bad = body.clone();
    bad[0] = 2;
    assert_eq!(journal::body::decode_set_retention(&bad), None);
    assert_eq!(journal::body::decode_set_retention(&body[..16]), None);

    let clear = vector(JOURNAL_ENTRY_CLEAR_HISTORY);
    let (kind, group, body) = only_entry(&clear);
    assert_eq!((kind, group, body.len()), (EntryKind::ClearHistory, 5, 16));
    assert_eq!(
        journal::body::decode_clear_history(&body),
        Some((300, 1000))
    );
    assert_eq!(journal::body::decode_clear_history(&body[..15]), None);
    assert_eq!(journal::body::decode_clear_history(&[0; 17]), None);
}

/// Every entry of every frame of every journal file under `data_dir`,
/// oldest first.
fn journal_entries(data_dir: &Path) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for (_, path) in journal::list(&OsVfs, &journal::journal_dir(data_dir)).unwrap() {
        let bytes = std::fs::read(&path).unwrap();
        for f in journal::frames_of_file(&bytes) {
            for (at, len, _, _) in f.entries {
                out.push(bytes[at..at + len].to_vec());
            }
        }
    }
    out
}

fn first_of_kind(entries: &[Vec<u8>], kind: EntryKind) -> &[u8] {
    entries
        .iter()
        .find(|e| e[4] == kind as u8)
        .unwrap_or_else(|| panic!("no {kind:?} entry in the journal"))
}

/// The engine itself writes the bytes of the membership vectors: the story
/// of the vectors (user 300 joins group 5 EARLIEST, acknowledges msg_id 1,
/// group 5 gets a retention policy, user 300 leaves) run on a real engine.
#[test]
fn the_engine_writes_the_membership_vectors() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(Config::segmented(dir.path())).unwrap();
    // The checkpoint after open is done before the story starts.
    engine.checkpoint().unwrap();
    engine.create_group(5).unwrap();
    assert_eq!(engine.join(5, 300, JoinStart::Earliest).unwrap(), 0);
    let sent = engine.append(5, 42, 7, b"hello").unwrap();
    assert_eq!(sent.msg_id, 1);
    assert_eq!(engine.ack(5, 300, 1).unwrap(), 1);
    engine.flush_cursors().unwrap();
    // Checkpoints delete older journal files: read the entries first.
    let mut entries = journal_entries(dir.path());
    engine.checkpoint().unwrap();

    // The checkpoint's delta run holds the group and the membership of
    // storage.md section 6A's example (the lsn depends on the journal).
    let m = crate::state::checkpoint_tests::load_manifest(
        &crate::state::checkpoint_tests::newest_manifest(dir.path()),
    );
    let items = crate::state::checkpoint_tests::run_items(dir.path(), &m.runs[0]);
    let crate::state::Item::GroupPut(g) = &items[0] else {
        panic!("{items:?}")
    };
    assert_eq!(
        (
            g.group,
            g.fresh,
            g.head,
            g.segments.clone(),
            g.damaged.clone()
        ),
        (5, true, 1, vec![(1, 113)], None)
    );
    // The member row, and the user index's entry of the join (under the
    // user's id, after every item of group 5).
    assert_eq!(
        items[1..],
        [
            crate::state::Item::MemberPut {
                group: 5,
                user: 300,
                cursor: 1,
                join_point: 1
            },
            crate::state::Item::IndexPut {
                user: 300,
                group: 5
            }
        ]
    );

    engine
        .set_retention(
            5,
            Retention {
                by_cursor: true,
                max_age_ms: 604_800_000,
                max_bytes: 1 << 30,
            },
        )
        .unwrap();
    // A clear above the head is resolved to the head (1) when queued; the
    // vector's up_to is 1000, so the engine writes it after 1000 records.
    for i in 2..=1000u64 {
        engine.append(5, 42, 7 + i, b"x").unwrap();
    }
    engine.clear_history(5, 300, u64::MAX).unwrap();
    engine.leave(5, 300).unwrap();
    entries.extend(journal_entries(dir.path()));
    for (kind, v) in [
        (EntryKind::Join, JOURNAL_ENTRY_JOIN),
        (EntryKind::Cursors, JOURNAL_ENTRY_CURSORS),
        (EntryKind::SetRetention, JOURNAL_ENTRY_SET_RETENTION),
        (EntryKind::Leave, JOURNAL_ENTRY_LEAVE),
        (EntryKind::ClearHistory, JOURNAL_ENTRY_CLEAR_HISTORY),
    ] {
        assert_eq!(first_of_kind(&entries, kind), &vector(v)[..], "{kind:?}");
    }
    engine.close().unwrap();
}

/// The member items of `run-part.hex`, in key order.
fn run_part_items() -> Vec<Item> {
    vec![
        Item::MemberPut {
            group: 5,
            user: 300,
            cursor: 2,
            join_point: 1,
        },
        Item::MemberDelete {
            group: 5,
            user: 301,
        },
        Item::MemberPut {
            group: 9,
            user: 300,
            cursor: 2,
            join_point: 3,
        },
    ]
}

/// What a manifest records of the part of `run-part.hex`.
fn run_part_meta() -> PartMeta {
    PartMeta {
        run_seq: 7,
        part: 0,
        item_count: 3,
        file_len: 152,
        trailer_crc: 0xbaf0_ec9a,
        first_key: Key::member(5, 300),
        last_key: Key::member(9, 300),
    }
}

#[test]
fn run_part_vector_matches_the_writer_and_reads_back_its_items() {
    let v = vector(RUN_PART);
    let mut w = RunWriter::new(7, RUN_FILE_BYTES_MIN, TIMESTAMP_MS, |_| Ok(Vec::new()));
    for item in run_part_items() {
        w.push(&item).unwrap();
    }
    let mut parts = w.finish().unwrap();
    assert_eq!(parts.len(), 1);
    let (bytes, meta) = parts.remove(0);
    assert_eq!(bytes, v);
    assert_eq!(meta, run_part_meta());

    let r = PartReader::open(&v, RUN_FILE_BYTES_READ_MAX).unwrap();
    assert_eq!((r.run_seq, r.part, r.item_count), (7, 0, 3));
    assert_eq!(r.trailer_crc, 0xbaf0_ec9a);
    assert_eq!(r.first_key().unwrap(), Key::member(5, 300));
    let items: Vec<Item> = r.map(Result::unwrap).collect();
    assert_eq!(items, run_part_items());
    // The whole run, checked against what the manifest vector names.
    let parts: [&[u8]; 1] = [&v];
    let run: Vec<Item> = RunItems::new(&parts, &[run_part_meta()])
        .map(Result::unwrap)
        .collect();
    assert_eq!(run, run_part_items());
    // The documented checksums: header, block, index and trailer.
    assert_eq!(crc32fast::hash(&v[..60]).to_le_bytes(), v[60..64]);
    assert_eq!(crc32fast::hash(&v[68..91]).to_le_bytes(), v[64..68]);
    let mut t = crc32fast::Hasher::new();
    t.update(&v[91..120]);
    t.update(&v[120..148]);
    assert_eq!(t.finalize().to_le_bytes(), v[148..152]);
}

#[test]
fn manifest_vector_matches_the_encoder_and_decodes_to_its_fields() {
    let v = vector(MANIFEST);
    let m = Manifest {
        ckpt_seq: 3,
        replay_journal_seq: 2,
        replay_lsn: 41,
        replay_round: 40,
        created_ms: TIMESTAMP_MS,
        next_run_seq: 8,
        clean: false,
        runs: vec![RunMeta {
            run_seq: 7,
            parts: vec![run_part_meta()],
        }],
        pinned: vec![1],
        groups_per_user_bound: Some(5),
        groups_bound: Some(2),
        user_index: false,
    };
    assert_eq!(manifest::encode(&m).unwrap(), v);
    assert_eq!(manifest::decode(&v).unwrap(), m);
    assert_eq!(crc32fast::hash(&v[..28]).to_le_bytes(), v[28..32]);
    assert_eq!(crc32fast::hash(&v[32..]).to_le_bytes(), v[24..28]);
}

/// The worked example of storage.md section 15, byte for byte.
#[test]
fn crc32_is_the_ieee_crc_of_the_readme() {
    // CRC-32/ISO-HDLC check value, as format-spec/README.md states it.
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
}

#[test]
fn directory_layout_matches_the_spec() {
    let data = Path::new("data");
    assert_eq!(
        crate::logs::group_log::group_dir(data, 5),
        Path::new("data/groups/05c/0000000000000005")
    );
    assert_eq!(
        crate::logs::group_log::group_dir(data, 42),
        Path::new("data/groups/3d4/000000000000002a")
    );
    assert_eq!(
        crate::logs::group_log::group_dir(data, u64::MAX),
        Path::new("data/groups/187/ffffffffffffffff")
    );
    assert_eq!(
        crate::state::manifest::manifest_path(&crate::state::manifest::manifest_dir(data), 7),
        Path::new("data/manifest/00000000000000000007.tmm")
    );
    assert_eq!(
        crate::state::run::part_file_name(7, 2),
        "00000000000000000007-0002.tmr"
    );
    assert_eq!(journal::journal_dir(data), Path::new("data/journal"));
    // The shard formula of storage.md, spelled out.
    for g in [0u64, 1, 5, 42, 1 << 40, u64::MAX] {
        let shard = g.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
        assert!(shard < 1024);
        let expected = data
            .join("groups")
            .join(format!("{shard:03x}"))
            .join(format!("{g:016x}"));
        assert_eq!(crate::logs::group_log::group_dir(data, g), expected);
    }
}

/// The Edit and Recall records (storage.md section 3).
mod change_records {
    use super::*;
    use crate::logs::record::{KIND_EDIT, KIND_RECALL};

    #[test]
    fn edit_and_recall_vectors_match_the_encoder_and_name_their_target() {
        for (text, msg_id, cmid, kind, payload, target) in [
            (
                include_str!("../../format-spec/vectors/storage/record-edit.hex"),
                2,
                8,
                KIND_EDIT,
                &b"\x01\0\0\0\0\0\0\0hi!"[..],
                1,
            ),
            (
                include_str!("../../format-spec/vectors/storage/record-recall.hex"),
                3,
                9,
                KIND_RECALL,
                &b"\x01\0\0\0\0\0\0\0"[..],
                1,
            ),
        ] {
            let v = vector(text);
            let mut out = Vec::new();
            let rec = NewRecord {
                msg_id,
                timestamp_ms: TIMESTAMP_MS + msg_id - 1,
                sender_id: 42,
                client_msg_id: cmid,
                payload,
            };
            record::encode_kind_into(&rec, kind, &mut out);
            assert_eq!(out, v, "kind {kind}");
            let h = record::decode_verified(&v, RECORD_BYTES_MAX).unwrap();
            assert_eq!((h.msg_id, h.kind, h.flags), (msg_id, kind, 0));
            assert_eq!(record::peek_target(&v), Some(target));
            // A target at or above the record's own id is refused.
            let mut bad = v.clone();
            bad[44..52].copy_from_slice(&msg_id.to_le_bytes());
            assert_eq!(
                record::decode_header(&bad, RECORD_BYTES_MAX),
                Err(RecordError::BadHeader {
                    reason: "an edit or recall without a target below its own id"
                })
            );
        }
    }

    /// A recalled message in erased form (section 3, "Erasure"): the
    /// vector is `record.hex` erased in place; it decodes with its fields
    /// and the erased flag, and erased with a payload byte left is refused.
    #[test]
    fn erased_vector_is_the_record_vector_erased() {
        let v = vector(include_str!(
            "../../format-spec/vectors/storage/record-erased.hex"
        ));
        let mut erased = vector(RECORD);
        record::erase_in_place(&mut erased);
        assert_eq!(erased, v);
        let h = record::decode_verified(&v, RECORD_BYTES_MAX).unwrap();
        assert_eq!(
            (
                h.record_len,
                h.msg_id,
                h.sender_id,
                h.client_msg_id,
                h.kind,
                h.flags
            ),
            (49, 1, 42, 7, KIND_MESSAGE, record::FLAG_ERASED)
        );
        assert!(record::peek_erased(&v));
        let mut left = v.clone();
        left[46] = b'l';
        let crc = crc32fast::hash(&left[8..]);
        left[4..8].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            record::decode_verified(&left, RECORD_BYTES_MAX),
            Err(RecordError::BadHeader {
                reason: "an erased record with payload bytes"
            })
        );
        // The flag on any other kind is a reserved bit.
        let mut recall = vector(include_str!(
            "../../format-spec/vectors/storage/record-recall.hex"
        ));
        recall[41] = record::FLAG_ERASED;
        assert_eq!(
            record::decode_header(&recall, RECORD_BYTES_MAX),
            Err(RecordError::BadHeader {
                reason: "reserved bits set"
            })
        );
    }
}
