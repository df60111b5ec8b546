//! Records sections (format-spec/protocol.md "Records section"): storage
//! records carried back to back, byte for byte as the engine stores them.
//!
//! The codec treats records as opaque byte ranges. It knows only what a
//! reader needs to walk and check them: every record starts with its
//! `record_len: u32` (header included, at least 44) and carries a CRC-32 of
//! its bytes `8..record_len` at offset 4. The full record layout is
//! format-spec/storage.md "Record"; the accessors of [`RecordView`] read its
//! fixed fields for clients.
//!
//! On encode, a response's records need not be in one buffer: the encoder
//! writes the frame up to the records ([`RecordsLen`] says how many bytes
//! follow) and the caller writes the record slices after it (writev).

use std::fmt;

/// Bytes of a record's fixed header; the smallest valid `record_len`.
pub const RECORD_HEADER_BYTES: usize = 44;
/// `kind` of a message (the only kind of version 1).
pub const KIND_MESSAGE: u8 = 0;
/// `kind` of an edit (version 2): payload `target: u64 | new payload`.
pub const KIND_EDIT: u8 = 1;
/// `kind` of a recall (version 2): payload `target: u64`.
pub const KIND_RECALL: u8 = 2;
/// `kind` of a gap (version 2): a message lost to damage and cut by the
/// offline repair tool; no payload.
pub const KIND_GAP: u8 = 3;
/// `flags` bit of a recalled message (version 2): its payload is withheld
/// (empty), whatever the node still stores.
pub const FLAG_RECALLED: u8 = 1;
/// `flags` bit of a message shown in its latest state with its newest
/// edit's payload (version 2; HISTORY_LATEST only).
pub const FLAG_EDITED: u8 = 2;
/// Bytes of the target id that starts an edit's or a recall's payload.
pub const TARGET_BYTES: usize = 8;

/// Whether a record's `kind`, `flags` and reserved bytes (offsets 40..44)
/// are valid in protocol `version` (format-spec/protocol.md 2.1): all 0 in
/// version 1; in version 2 a known kind with its payload rule, and the
/// `recalled` flag only on an empty message. `record` is a whole record.
fn fields_valid(record: &[u8], version: u8) -> bool {
    let (kind, flags) = (record[40], record[41]);
    if record[42..44] != [0, 0] {
        return false;
    }
    if version < 2 {
        return kind == KIND_MESSAGE && flags == 0;
    }
    let payload = record.len() - RECORD_HEADER_BYTES;
    let target_ok = || {
        let (Some(t), Some(id)) = (
            record
                .get(RECORD_HEADER_BYTES..)
                .and_then(|b| b.first_chunk::<8>()),
            record.get(8..).and_then(|b| b.first_chunk::<8>()),
        ) else {
            return false;
        };
        let (t, id) = (u64::from_le_bytes(*t), u64::from_le_bytes(*id));
        t >= 1 && t < id
    };
    match kind {
        KIND_MESSAGE => {
            flags == 0 || flags == FLAG_EDITED || (flags == FLAG_RECALLED && payload == 0)
        }
        KIND_EDIT => flags == 0 && payload >= TARGET_BYTES && target_ok(),
        KIND_RECALL => flags == 0 && payload == TARGET_BYTES && target_ok(),
        KIND_GAP => flags == 0 && payload == 0,
        _ => false,
    }
}

/// What the encoder needs to know of a records section.
pub trait RecordsSection {
    /// Number of records.
    fn count(&self) -> u32;
    /// Total bytes of the records.
    fn byte_len(&self) -> usize;
    /// The record bytes if the section holds them (`None`: the caller writes
    /// them after the encoded head).
    fn inline_bytes(&self) -> Option<&[u8]>;
}

/// A records section held in one contiguous buffer: what decoding returns,
/// and what the all-in-one encoder writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Records<'a> {
    pub count: u32,
    /// The records back to back, each `record_len` bytes long.
    pub bytes: &'a [u8],
}

impl<'a> Records<'a> {
    /// A section of no records.
    pub const EMPTY: Records<'static> = Records {
        count: 0,
        bytes: &[],
    };

    /// Walks `bytes` by record length (CRC not checked) and counts them.
    pub fn from_bytes(bytes: &'a [u8]) -> Result<Records<'a>, RecordsError> {
        let mut count = 0u32;
        for r in RecordIter::new(bytes, None, false) {
            r?;
            count += 1;
        }
        Ok(Records { count, bytes })
    }

    /// Iterates the records, checking each length, its kind and flags as
    /// version 2 allows them (a decoded section was checked against its
    /// frame's version already) and, if `verify_crc`, its CRC; at the end
    /// checks that the number found matches `count`.
    pub fn iter(&self, verify_crc: bool) -> RecordIter<'a> {
        self.iter_in(crate::PROTOCOL_VERSION, verify_crc)
    }

    /// [`Records::iter`] with the kinds and flags of protocol `version`.
    pub fn iter_in(&self, version: u8, verify_crc: bool) -> RecordIter<'a> {
        let mut it = RecordIter::new(self.bytes, Some(self.count), verify_crc);
        it.version = version;
        it
    }
}

impl RecordsSection for Records<'_> {
    fn count(&self) -> u32 {
        self.count
    }
    fn byte_len(&self) -> usize {
        self.bytes.len()
    }
    fn inline_bytes(&self) -> Option<&[u8]> {
        Some(self.bytes)
    }
}

/// A records section the caller writes itself after the encoded head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RecordsLen {
    pub count: u32,
    /// Total bytes of the records the caller will write.
    pub bytes: u32,
}

impl RecordsSection for RecordsLen {
    fn count(&self) -> u32 {
        self.count
    }
    fn byte_len(&self) -> usize {
        self.bytes as usize
    }
    fn inline_bytes(&self) -> Option<&[u8]> {
        None
    }
}

/// Why a records section is not a valid run of records. Offsets count from
/// the start of the section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordsError {
    /// Fewer than 4 bytes left for a length, or fewer than `record_len`.
    Truncated {
        offset: usize,
        need: usize,
        have: usize,
    },
    /// A `record_len` below the 44-byte header.
    BadLength { offset: usize, record_len: u32 },
    /// The stored CRC does not match the record's bytes.
    BadCrc {
        offset: usize,
        stored: u32,
        computed: u32,
    },
    /// The section holds a different number of records than declared.
    CountMismatch { declared: u32, found: u32 },
    /// `kind`, `flags` or the reserved bytes (record offsets 40..44) are
    /// not valid in the version: all 0 in version 1; a known kind with its
    /// payload rule in version 2 (format-spec/protocol.md 2.1).
    Reserved { offset: usize },
}

impl fmt::Display for RecordsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordsError::Truncated { offset, need, have } => write!(
                f,
                "record at offset {offset} truncated: need {need} bytes, have {have}"
            ),
            RecordsError::BadLength { offset, record_len } => {
                write!(f, "record at offset {offset}: invalid length {record_len}")
            }
            RecordsError::BadCrc {
                offset,
                stored,
                computed,
            } => write!(
                f,
                "record at offset {offset}: checksum mismatch: stored {stored:#010x}, \
                 computed {computed:#010x}"
            ),
            RecordsError::CountMismatch { declared, found } => {
                write!(
                    f,
                    "records section declares {declared} records, holds {found}"
                )
            }
            RecordsError::Reserved { offset } => write!(
                f,
                "record at offset {offset}: kind, flags or reserved bytes not valid in this version"
            ),
        }
    }
}

impl std::error::Error for RecordsError {}

/// One record of a section, borrowed. Its length was checked; its CRC was
/// checked if the iterator was asked to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordView<'a> {
    bytes: &'a [u8],
}

impl<'a> RecordView<'a> {
    fn u32_at(&self, off: usize) -> u32 {
        self.bytes
            .get(off..)
            .and_then(|b| b.first_chunk::<4>())
            .map_or(0, |a| u32::from_le_bytes(*a))
    }

    fn u64_at(&self, off: usize) -> u64 {
        self.bytes
            .get(off..)
            .and_then(|b| b.first_chunk::<8>())
            .map_or(0, |a| u64::from_le_bytes(*a))
    }

    /// The whole record, header included.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
    pub fn crc32(&self) -> u32 {
        self.u32_at(4)
    }
    pub fn msg_id(&self) -> u64 {
        self.u64_at(8)
    }
    pub fn timestamp_ms(&self) -> u64 {
        self.u64_at(16)
    }
    pub fn sender_id(&self) -> u64 {
        self.u64_at(24)
    }
    pub fn client_msg_id(&self) -> u64 {
        self.u64_at(32)
    }
    pub fn kind(&self) -> u8 {
        self.bytes.get(40).copied().unwrap_or(0)
    }
    pub fn flags(&self) -> u8 {
        self.bytes.get(41).copied().unwrap_or(0)
    }
    pub fn payload(&self) -> &'a [u8] {
        self.bytes.get(RECORD_HEADER_BYTES..).unwrap_or(&[])
    }
    /// The message an edit or a recall changes (`None` for other kinds).
    pub fn target(&self) -> Option<u64> {
        matches!(self.kind(), KIND_EDIT | KIND_RECALL).then(|| self.u64_at(RECORD_HEADER_BYTES))
    }
    /// An edit's new payload (the payload after its target id).
    pub fn edit_payload(&self) -> Option<&'a [u8]> {
        (self.kind() == KIND_EDIT).then(|| self.payload().get(TARGET_BYTES..).unwrap_or(&[]))
    }
    /// A message shown with its newest edit's payload (HISTORY_LATEST).
    pub fn is_edited(&self) -> bool {
        self.kind() == KIND_MESSAGE && self.flags() & FLAG_EDITED != 0
    }
    /// A message presented as recalled (version 2; its payload is empty).
    pub fn is_recalled(&self) -> bool {
        self.kind() == KIND_MESSAGE && self.flags() & FLAG_RECALLED != 0
    }
}

/// Walks a records section by `record_len`. Yields an error once (then
/// stops) at the first record that does not fit, fails its CRC, or when the
/// count found differs from the count declared.
#[derive(Clone, Debug)]
pub struct RecordIter<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// The section's declared count, checked at the end (`None`: no count
    /// to check, for [`Records::from_bytes`]). Never a sentinel value from
    /// the wire.
    declared: Option<u32>,
    found: u32,
    verify_crc: bool,
    /// Whose kinds and flags are valid (`fields_valid`).
    version: u8,
    done: bool,
}

impl<'a> RecordIter<'a> {
    fn new(bytes: &'a [u8], declared: Option<u32>, verify_crc: bool) -> Self {
        RecordIter {
            bytes,
            pos: 0,
            declared,
            found: 0,
            verify_crc,
            version: crate::PROTOCOL_VERSION,
            done: false,
        }
    }

    fn fail(&mut self, e: RecordsError) -> Option<Result<RecordView<'a>, RecordsError>> {
        self.done = true;
        Some(Err(e))
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<RecordView<'a>, RecordsError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let rest = self.bytes.get(self.pos..).unwrap_or(&[]);
        if rest.is_empty() {
            self.done = true;
            if let Some(declared) = self.declared.filter(|&d| d != self.found) {
                return Some(Err(RecordsError::CountMismatch {
                    declared,
                    found: self.found,
                }));
            }
            return None;
        }
        let offset = self.pos;
        let Some(len) = rest.first_chunk::<4>().map(|a| u32::from_le_bytes(*a)) else {
            return self.fail(RecordsError::Truncated {
                offset,
                need: 4,
                have: rest.len(),
            });
        };
        if (len as usize) < RECORD_HEADER_BYTES {
            return self.fail(RecordsError::BadLength {
                offset,
                record_len: len,
            });
        }
        let Some(record) = rest.get(..len as usize) else {
            return self.fail(RecordsError::Truncated {
                offset,
                need: len as usize,
                have: rest.len(),
            });
        };
        // kind, flags and reserved must be valid in the version (all 0 in
        // version 1): a record with another value is not one this reader
        // understands, so it is refused like a malformed one rather than
        // delivered. Checked before the count, so a count mismatch reported
        // below always counts at least one whole, valid record beyond the
        // declared ones.
        if !fields_valid(record, self.version) {
            return self.fail(RecordsError::Reserved { offset });
        }
        if let Some(declared) = self.declared.filter(|&d| d == self.found) {
            // More records than declared: count them all for the message.
            let mut found = self.found;
            let mut it = RecordIter::new(rest, None, false);
            it.version = self.version;
            while let Some(Ok(_)) = it.next() {
                found = found.saturating_add(1);
            }
            return self.fail(RecordsError::CountMismatch { declared, found });
        }
        let view = RecordView { bytes: record };
        if self.verify_crc {
            let computed = crc32fast::hash(&record[8..]);
            if computed != view.crc32() {
                return self.fail(RecordsError::BadCrc {
                    offset,
                    stored: view.crc32(),
                    computed,
                });
            }
        }
        self.pos += len as usize;
        self.found += 1;
        Some(Ok(view))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the engine writes it (see format-spec/storage.md).
    pub(crate) fn record(msg_id: u64, payload: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend(((RECORD_HEADER_BYTES + payload.len()) as u32).to_le_bytes());
        r.extend([0; 4]);
        r.extend(msg_id.to_le_bytes());
        r.extend(1_700_000_000_000u64.to_le_bytes());
        r.extend(42u64.to_le_bytes());
        r.extend(msg_id.wrapping_mul(3).to_le_bytes());
        r.extend([0, 0, 0, 0]);
        r.extend(payload);
        let crc = crc32fast::hash(&r[8..]);
        r[4..8].copy_from_slice(&crc.to_le_bytes());
        r
    }

    #[test]
    fn iterates_and_verifies() {
        let mut bytes = record(1, b"one");
        bytes.extend(record(2, b""));
        let recs = Records::from_bytes(&bytes).unwrap();
        assert_eq!(recs.count, 2);
        let got: Vec<_> = recs.iter(true).collect::<Result<_, _>>().unwrap();
        assert_eq!(got[0].msg_id(), 1);
        assert_eq!(got[0].payload(), b"one");
        assert_eq!(got[0].sender_id(), 42);
        assert_eq!(got[1].msg_id(), 2);
        assert_eq!(got[1].payload(), b"");
    }

    /// A record whose kind, flags or reserved bytes are
    /// not 0 is refused (even with a matching CRC), and so is a response
    /// carrying it; it is never delivered as a message.
    #[test]
    fn nonzero_kind_flags_or_reserved_bytes_are_refused() {
        for at in 40..44 {
            let mut bad = record(1, b"one");
            bad[at] = 1;
            let crc = crc32fast::hash(&bad[8..]);
            bad[4..8].copy_from_slice(&crc.to_le_bytes());
            let mut bytes = record(7, b"ok");
            let offset = bytes.len();
            bytes.extend(&bad);
            assert_eq!(
                Records::from_bytes(&bytes).unwrap_err(),
                RecordsError::Reserved { offset },
                "byte {at}"
            );
            let recs = Records {
                count: 2,
                bytes: &bytes,
            };
            for verify in [false, true] {
                let mut it = recs.iter(verify);
                assert!(matches!(it.next(), Some(Ok(v)) if v.msg_id() == 7));
                assert_eq!(it.next(), Some(Err(RecordsError::Reserved { offset })));
                assert_eq!(it.next(), None);
            }
        }
    }

    #[test]
    fn crc_mismatch_count_mismatch_and_bad_lengths_are_errors() {
        let mut bytes = record(1, b"one");
        bytes[45] ^= 1; // a payload byte
        let recs = Records {
            count: 1,
            bytes: &bytes,
        };
        assert!(recs.iter(false).all(|r| r.is_ok()));
        assert!(matches!(
            recs.iter(true).next(),
            Some(Err(RecordsError::BadCrc { offset: 0, .. }))
        ));

        let bytes = record(1, b"one");
        let recs = Records {
            count: 2,
            bytes: &bytes,
        };
        let mut it = recs.iter(true);
        assert!(it.next().unwrap().is_ok());
        assert_eq!(
            it.next(),
            Some(Err(RecordsError::CountMismatch {
                declared: 2,
                found: 1
            }))
        );
        assert_eq!(it.next(), None);
        let recs = Records {
            count: 0,
            bytes: &bytes,
        };
        assert!(matches!(
            recs.iter(true).next(),
            Some(Err(RecordsError::CountMismatch { found: 1, .. }))
        ));

        let mut bytes = record(1, b"one");
        bytes[0..4].copy_from_slice(&43u32.to_le_bytes());
        assert!(matches!(
            Records::from_bytes(&bytes),
            Err(RecordsError::BadLength { record_len: 43, .. })
        ));
        bytes[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            Records::from_bytes(&bytes),
            Err(RecordsError::Truncated { .. })
        ));
        assert!(matches!(
            Records::from_bytes(&bytes[..3]),
            Err(RecordsError::Truncated { need: 4, .. })
        ));
    }
}

#[cfg(test)]
mod declared_count_tests {
    use super::*;

    #[test]
    fn a_declared_count_of_u32_max_is_checked_like_any_other() {
        // Fuzz finding F3: u32::MAX used to mean "do not check the count".
        let section = Records {
            count: u32::MAX,
            bytes: &[],
        };
        let results: Vec<_> = section.iter(false).collect();
        assert_eq!(results.len(), 1);
        assert!(matches!(
            results[0],
            Err(RecordsError::CountMismatch {
                declared: u32::MAX,
                found: 0
            })
        ));
    }
}
