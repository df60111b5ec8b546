//! The message record: the only module that knows its byte layout.
//!
//! A record lies byte-for-byte the same in a segment file, in the commit
//! journal and in a pull response, so the node sends stored bytes without
//! re-encoding them and the client can check the CRC end to end.
//!
//! Format (little-endian), see format-spec/storage.md "Record":
//! `{ record_len: u32 | crc32: u32 | msg_id: u64 | timestamp_ms: u64 |
//!    sender_id: u64 | client_msg_id: u64 | kind: u8 | flags: u8 |
//!    reserved: u16 = 0 | payload: [u8; record_len - 44] }`
//! `crc32` is CRC-32 (IEEE, as crc32fast computes it) of bytes `8..record_len`.
//!
//! Kinds (storage.md section 3): 0 a message; 1 an Edit and 2 a Recall of
//! an earlier message of the group, whose payload starts with the target's
//! `msg_id` (u64, little-endian; an Edit's new payload follows it, a
//! Recall's payload is exactly the 8 bytes). Invariant of every verified
//! record of kind 1 or 2: `1 <= target < msg_id`, so a reader may take the
//! target without checking again.
//!
//! `flags` bit 0 ([`FLAG_ERASED`]) marks a recalled message in erased form
//! (same length, payload zeros, CRC over them; storage.md section 3,
//! "Erasure"); a verified record with it is a message whose payload bytes
//! are all zero. No other flag bit is defined.

/// Bytes before the payload.
pub const RECORD_HEADER_BYTES: usize = 44;

/// The largest record the format allows in a file (1 GiB). Stored records
/// are checked against this, not against the configured payload limit, so
/// reopening with a smaller `payload_bytes_max` never makes stored records
/// look invalid.
pub const RECORD_BYTES_STORED_MAX: usize = 1 << 30;

/// `kind` of an ordinary chat message.
pub const KIND_MESSAGE: u8 = 0;
/// `kind` of an edit: payload `target: u64 | new payload`.
pub const KIND_EDIT: u8 = 1;
/// `kind` of a recall: payload `target: u64`, nothing else.
pub const KIND_RECALL: u8 = 2;
/// Bytes of the target id at the start of an edit's or a recall's payload.
pub const TARGET_BYTES: usize = 8;

/// Storage `flags` bit 0, *erased* (format-spec/storage.md section 3,
/// "Erasure"): a recalled message (kind 0 only) whose payload bytes were
/// overwritten with zeros when a rewrite copied it. The record keeps its
/// `record_len`, so offsets, the sparse index and extents' byte counts
/// stay valid; its CRC covers the zeros. A reader presents it as the
/// recalled message it is (`edits.rs`); no other flag bit is defined.
pub const FLAG_ERASED: u8 = 1;

/// `kind` of a gap record: `tidemark ctl repair` writes one in place of
/// each msg_id whose record was lost to damage (format-spec/storage.md
/// section 3, "Gap records"), so that ids stay dense and never go to a
/// new message. Flags 0, sender and client_msg_id 0, empty payload: a
/// reader refuses any other gap. Only repair writes them; the send path
/// never does.
pub const KIND_GAP: u8 = 3;

const OFF_LEN: usize = 0;
const OFF_CRC: usize = 4;
const OFF_MSG_ID: usize = 8;
const OFF_TIMESTAMP: usize = 16;
const OFF_SENDER: usize = 24;
const OFF_CLIENT_MSG_ID: usize = 32;
const OFF_KIND: usize = 40;
const OFF_FLAGS: usize = 41;
const OFF_RESERVED: usize = 42;

/// The fixed fields of a record, decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub record_len: u32,
    pub crc: u32,
    pub msg_id: u64,
    pub timestamp_ms: u64,
    pub sender_id: u64,
    pub client_msg_id: u64,
    pub kind: u8,
    pub flags: u8,
}

impl RecordHeader {
    pub fn payload_len(&self) -> usize {
        self.record_len as usize - RECORD_HEADER_BYTES
    }
}

/// Why bytes are not a valid record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Fewer bytes than the header, or than `record_len` says.
    Truncated { need: usize, have: usize },
    /// `record_len` below the header size or above the configured maximum.
    BadLength { record_len: u32 },
    /// Stored CRC does not match the bytes.
    BadCrc { stored: u32, computed: u32 },
    /// Reserved bits set, or an unknown kind.
    BadHeader { reason: &'static str },
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::Truncated { need, have } => {
                write!(f, "truncated record: need {need} bytes, have {have}")
            }
            RecordError::BadLength { record_len } => {
                write!(f, "invalid record length {record_len}")
            }
            RecordError::BadCrc { stored, computed } => {
                write!(
                    f,
                    "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )
            }
            RecordError::BadHeader { reason } => write!(f, "invalid record header: {reason}"),
        }
    }
}

/// The fields a caller supplies for a new record.
#[derive(Clone, Copy, Debug)]
pub struct NewRecord<'a> {
    pub msg_id: u64,
    pub timestamp_ms: u64,
    pub sender_id: u64,
    pub client_msg_id: u64,
    pub payload: &'a [u8],
}

/// Total encoded size of a record with `payload_len` payload bytes.
pub const fn record_bytes(payload_len: usize) -> usize {
    RECORD_HEADER_BYTES + payload_len
}

/// Appends the encoded record (a message, kind 0) to `out`.
#[cfg(any(test, feature = "testing"))]
pub fn encode_into(rec: &NewRecord<'_>, out: &mut Vec<u8>) {
    encode_kind_into(rec, KIND_MESSAGE, out)
}

/// Appends the encoded record of `kind` to `out`; for an edit or a recall
/// the caller puts the target id first in `rec.payload` (module docs).
pub fn encode_kind_into(rec: &NewRecord<'_>, kind: u8, out: &mut Vec<u8>) {
    let total = record_bytes(rec.payload.len());
    let start = out.len();
    // Invariant: payloads are checked against payload_bytes_max (< u32::MAX) by the caller.
    let record_len = u32::try_from(total).expect("invariant: payload length checked by caller");
    out.reserve(total);
    out.extend_from_slice(&record_len.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // crc, filled below
    out.extend_from_slice(&rec.msg_id.to_le_bytes());
    out.extend_from_slice(&rec.timestamp_ms.to_le_bytes());
    out.extend_from_slice(&rec.sender_id.to_le_bytes());
    out.extend_from_slice(&rec.client_msg_id.to_le_bytes());
    out.push(kind);
    out.push(0); // flags
    out.extend_from_slice(&[0u8; 2]); // reserved
    out.extend_from_slice(rec.payload);
    let crc = crc32fast::hash(&out[start + OFF_MSG_ID..]);
    out[start + OFF_CRC..start + OFF_MSG_ID].copy_from_slice(&crc.to_le_bytes());
}

/// Appends a gap record (kind 3, see [`KIND_GAP`]) for `msg_id`: empty
/// payload, sender and client_msg_id 0, `timestamp_ms` chosen by the
/// caller so that timestamps never decrease within the group.
pub fn encode_gap_into(msg_id: u64, timestamp_ms: u64, out: &mut Vec<u8>) {
    encode_kind_into(
        &NewRecord {
            msg_id,
            timestamp_ms,
            sender_id: 0,
            client_msg_id: 0,
            payload: &[],
        },
        KIND_GAP,
        out,
    );
}

/// Whether a verified record is a gap record.
pub fn is_gap(h: &RecordHeader) -> bool {
    h.kind == KIND_GAP
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[off..off + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Reads just the `record_len` field of the record starting at `buf[0]`, for
/// walking already-verified bytes. `None` if fewer than 4 bytes remain.
pub fn peek_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= 4).then(|| u32_at(buf, OFF_LEN) as usize)
}

/// Reads just the `msg_id` of an already-verified record.
pub fn peek_msg_id(buf: &[u8]) -> u64 {
    u64_at(buf, OFF_MSG_ID)
}

/// Reads just the `kind` of an already-verified record.
pub fn peek_kind(buf: &[u8]) -> u8 {
    buf[OFF_KIND]
}

/// The target id of an already-verified edit or recall (`None` for
/// another kind).
pub fn peek_target(buf: &[u8]) -> Option<u64> {
    matches!(buf[OFF_KIND], KIND_EDIT | KIND_RECALL).then(|| u64_at(buf, RECORD_HEADER_BYTES))
}

/// Calls `f(msg_id, kind, target)` for every record of `buf` (verified
/// records back to back) whose kind is not a message: what the applier
/// counts as not unread (`changes.rs`). One header read per record.
pub fn for_each_change(buf: &[u8], mut f: impl FnMut(u64, u8, Option<u64>)) {
    let mut at = 0;
    while let Some(len) = peek_len(&buf[at..]).filter(|&l| l >= RECORD_HEADER_BYTES) {
        let rec = &buf[at..];
        if rec.len() < len {
            break;
        }
        if peek_kind(rec) != KIND_MESSAGE {
            f(peek_msg_id(rec), peek_kind(rec), peek_target(rec));
        }
        at += len;
    }
}

/// The tail of `buf` (already-verified records of one group, ids rising)
/// that holds the records with ids above `head`.
pub fn records_above(buf: &[u8], head: u64) -> &[u8] {
    let mut at = 0;
    while at < buf.len() && peek_msg_id(&buf[at..]) <= head {
        match peek_len(&buf[at..]) {
            Some(len) if len > 0 => at += len,
            // Invariant: verified records have a length; stop rather than spin.
            _ => break,
        }
    }
    &buf[at..]
}

/// Decodes the header of the record at `buf[0]` without checking the CRC.
/// Length and reserved fields are checked, so the result is safe to use for
/// slicing `buf[..record_len]`.
pub fn decode_header(buf: &[u8], record_bytes_max: usize) -> Result<RecordHeader, RecordError> {
    if buf.len() < RECORD_HEADER_BYTES {
        return Err(RecordError::Truncated {
            need: RECORD_HEADER_BYTES,
            have: buf.len(),
        });
    }
    let record_len = u32_at(buf, OFF_LEN);
    if (record_len as usize) < RECORD_HEADER_BYTES || record_len as usize > record_bytes_max {
        return Err(RecordError::BadLength { record_len });
    }
    if buf.len() < record_len as usize {
        return Err(RecordError::Truncated {
            need: record_len as usize,
            have: buf.len(),
        });
    }
    let kind = buf[OFF_KIND];
    let flags = buf[OFF_FLAGS];
    if kind > KIND_GAP {
        return Err(RecordError::BadHeader {
            reason: "unknown kind",
        });
    }
    if kind == KIND_GAP && record_len as usize != RECORD_HEADER_BYTES {
        return Err(RecordError::BadHeader {
            reason: "gap record with a payload",
        });
    }
    let erased_message = kind == KIND_MESSAGE && flags == FLAG_ERASED;
    if (flags != 0 && !erased_message) || buf[OFF_RESERVED] != 0 || buf[OFF_RESERVED + 1] != 0 {
        return Err(RecordError::BadHeader {
            reason: "reserved bits set",
        });
    }
    if kind == KIND_EDIT || kind == KIND_RECALL {
        let payload_len = record_len as usize - RECORD_HEADER_BYTES;
        let target = (payload_len >= TARGET_BYTES).then(|| u64_at(buf, RECORD_HEADER_BYTES));
        if kind == KIND_RECALL && payload_len != TARGET_BYTES {
            return Err(RecordError::BadHeader {
                reason: "a recall's payload is not exactly its target id",
            });
        }
        if !target.is_some_and(|t| t >= 1 && t < u64_at(buf, OFF_MSG_ID)) {
            return Err(RecordError::BadHeader {
                reason: "an edit or recall without a target below its own id",
            });
        }
    }
    Ok(RecordHeader {
        record_len,
        crc: u32_at(buf, OFF_CRC),
        msg_id: u64_at(buf, OFF_MSG_ID),
        timestamp_ms: u64_at(buf, OFF_TIMESTAMP),
        sender_id: u64_at(buf, OFF_SENDER),
        client_msg_id: u64_at(buf, OFF_CLIENT_MSG_ID),
        kind,
        flags,
    })
}

/// Decodes and fully verifies (length, reserved bytes, CRC) the record at
/// `buf[0]`. This is the check every byte read from a file passes before it is
/// trusted.
pub fn decode_verified(buf: &[u8], record_bytes_max: usize) -> Result<RecordHeader, RecordError> {
    let h = decode_header(buf, record_bytes_max)?;
    let computed = crc32fast::hash(&buf[OFF_MSG_ID..h.record_len as usize]);
    if computed != h.crc {
        return Err(RecordError::BadCrc {
            stored: h.crc,
            computed,
        });
    }
    if h.flags & FLAG_ERASED != 0
        && buf[RECORD_HEADER_BYTES..h.record_len as usize]
            .iter()
            .any(|&b| b != 0)
    {
        return Err(RecordError::BadHeader {
            reason: "an erased record with payload bytes",
        });
    }
    Ok(h)
}

/// Whether the (verified) record at `buf[0]` is in erased form.
pub fn peek_erased(buf: &[u8]) -> bool {
    buf[OFF_FLAGS] & FLAG_ERASED != 0
}

/// Turns the verified message record `rec` (exactly one record, kind 0)
/// into its erased form in place: `flags` = [`FLAG_ERASED`], every payload
/// byte 0, the CRC recomputed; `record_len` and the other fields stay.
/// Erasing an erased record changes nothing. Only on a copy that a
/// rewrite is about to write to a new file: an in-place overwrite of a
/// stored record could be torn by a crash (storage.md section 1).
pub fn erase_in_place(rec: &mut [u8]) {
    debug_assert_eq!(peek_kind(rec), KIND_MESSAGE, "only a message is erased");
    rec[OFF_FLAGS] = FLAG_ERASED;
    rec[RECORD_HEADER_BYTES..].fill(0);
    let crc = crc32fast::hash(&rec[OFF_MSG_ID..]);
    rec[OFF_CRC..OFF_MSG_ID].copy_from_slice(&crc.to_le_bytes());
}

/// A verified record borrowed from a buffer.
#[derive(Clone, Copy, Debug)]
pub struct RecordRef<'a> {
    pub header: RecordHeader,
    /// The whole record, header included (the bytes a pull response carries).
    pub bytes: &'a [u8],
}

impl<'a> RecordRef<'a> {
    pub fn payload(&self) -> &'a [u8] {
        &self.bytes[RECORD_HEADER_BYTES..]
    }
}

/// Iterates over the verified records of `buf`, which must hold whole records
/// back to back. Stops at the first invalid one, returning its error.
/// Test and fuzz code only (the engine reads records through the segment
/// scan, which also knows where a segment's data ends).
#[cfg(any(test, feature = "testing"))]
pub struct RecordIter<'a> {
    buf: &'a [u8],
    pos: usize,
    record_bytes_max: usize,
}

#[cfg(any(test, feature = "testing"))]
impl<'a> RecordIter<'a> {
    pub fn new(buf: &'a [u8], record_bytes_max: usize) -> Self {
        RecordIter {
            buf,
            pos: 0,
            record_bytes_max,
        }
    }

    /// Offset of the next record to be returned (the end of the last good one).
    pub fn position(&self) -> usize {
        self.pos
    }
}

#[cfg(any(test, feature = "testing"))]
impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordRef<'a>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        match decode_verified(rest, self.record_bytes_max) {
            Ok(header) => {
                let len = header.record_len as usize;
                self.pos += len;
                Some(Ok(RecordRef {
                    header,
                    bytes: &rest[..len],
                }))
            }
            Err(e) => {
                // Fuse: an invalid record ends the iteration.
                self.pos = self.buf.len();
                Some(Err(e))
            }
        }
    }
}

/// `(msg_id, offset, len)` of each record of `bytes` while the lengths
/// walk inside it (the bytes are checked whole later, by the cold writer).
pub(crate) fn records_walk(bytes: &[u8]) -> Vec<(u64, usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while let Some(len) = bytes.get(at..).and_then(peek_len) {
        let end = match at.checked_add(len) {
            Some(end) if len >= RECORD_HEADER_BYTES && end <= bytes.len() => end,
            _ => break,
        };
        out.push((peek_msg_id(&bytes[at..]), at, len));
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_into(
            &NewRecord {
                msg_id: 7,
                timestamp_ms: 1_700_000_000_000,
                sender_id: 42,
                client_msg_id: 9,
                payload,
            },
            &mut out,
        );
        out
    }

    #[test]
    fn round_trip_preserves_every_field() {
        let bytes = sample(b"hello");
        assert_eq!(bytes.len(), RECORD_HEADER_BYTES + 5);
        let h = decode_verified(&bytes, 1 << 20).unwrap();
        assert_eq!(
            (h.msg_id, h.timestamp_ms, h.sender_id, h.client_msg_id),
            (7, 1_700_000_000_000, 42, 9)
        );
        assert_eq!(h.payload_len(), 5);
        assert_eq!(&bytes[RECORD_HEADER_BYTES..], b"hello");
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let bytes = sample(b"payload bytes");
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                decode_verified(&b, 1 << 20).is_err(),
                "flip of bit {i} not detected"
            );
        }
    }

    #[test]
    fn truncation_is_an_error_not_a_panic() {
        let bytes = sample(b"abc");
        for n in 0..bytes.len() {
            assert!(matches!(
                decode_verified(&bytes[..n], 1 << 20),
                Err(RecordError::Truncated { .. })
            ));
        }
    }

    #[test]
    fn oversized_length_is_rejected_before_slicing() {
        let mut bytes = sample(b"abc");
        bytes[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_header(&bytes, 1 << 20),
            Err(RecordError::BadLength { .. })
        ));
    }

    #[test]
    fn a_gap_record_is_valid_only_empty_and_without_flags() {
        let mut gap = Vec::new();
        encode_gap_into(12, 5, &mut gap);
        assert_eq!(gap.len(), RECORD_HEADER_BYTES);
        let h = decode_verified(&gap, 1 << 20).unwrap();
        assert!(is_gap(&h));
        assert_eq!((h.msg_id, h.timestamp_ms, h.sender_id), (12, 5, 0));
        // A gap with flags, or with a payload, is not a record.
        let mut flagged = gap.clone();
        flagged[OFF_FLAGS] = 1;
        assert!(decode_header(&flagged, 1 << 20).is_err());
        let mut with_payload = sample(b"x");
        with_payload[OFF_KIND] = KIND_GAP;
        assert_eq!(
            decode_header(&with_payload, 1 << 20),
            Err(RecordError::BadHeader {
                reason: "gap record with a payload"
            })
        );
        // Kinds 1, 2 (reserved for edits and recalls) and 4 stay unknown.
        for kind in [1u8, 2, 4] {
            let mut other = gap.clone();
            other[OFF_KIND] = kind;
            assert!(decode_header(&other, 1 << 20).is_err(), "kind {kind}");
        }
    }

    #[test]
    fn iterator_stops_at_first_bad_record() {
        let mut buf = sample(b"one");
        let first = buf.len();
        buf.extend(sample(b"two"));
        buf.push(0xff);
        let mut it = RecordIter::new(&buf, 1 << 20);
        assert!(it.next().unwrap().is_ok());
        assert!(it.next().unwrap().is_ok());
        assert_eq!(it.position(), first * 2);
        assert!(it.next().unwrap().is_err());
        assert!(it.next().is_none());
    }
}
