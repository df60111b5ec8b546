//! The journal file header (format-spec/storage.md section 5) and the
//! names of journal files: what the frame codec (`frame.rs`), the round
//! index (`rounds.rs`) and the writer (`mod.rs`) share. It imports none of
//! them.
//!
//! Layout (little-endian):
//! `{ magic: [u8; 8] = "TDMKJRNL" | version: u16 = 3 | header_len: u16 = 48 |
//!    flags: u8 | reserved: [u8; 3] = 0 | seq: u64 | first_lsn: u64 |
//!    first_round: u64 | mark_key: u32 | crc32: u32 (of bytes 0..44) }`

use std::path::{Path, PathBuf};

pub const JOURNAL_HEADER_BYTES: usize = 48;
pub const JOURNAL_MAGIC: [u8; 8] = *b"TDMKJRNL";
/// The version this build writes and reads. Versions 1 and 2 were written
/// by tidemark 0.1 (storage format 1) and are refused.
pub const JOURNAL_VERSION: u16 = 3;
/// Header flag: the writer's group segments could receive a round's
/// records before the round's journal bytes were synced (fsync policy
/// `interval` or `never`), so after a power loss a segment may hold
/// records the journal lost. Recovery then looks at every group's segments
/// before trusting the heads the checkpoint recorded.
pub const FLAG_SEGMENTS_MAY_LEAD: u8 = 1;
pub(super) const JOURNAL_SUFFIX: &str = ".tmj";
/// Header bytes of a storage-format-1 journal file (versions 1 and 2).
const FORMAT_1_HEADER_BYTES: usize = 32;

/// A decoded journal file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    pub flags: u8,
    pub seq: u64,
    /// The lsn of the file's first frame (or of the next frame written).
    pub first_lsn: u64,
    /// The round index of the file's first Round frame (or of the next).
    pub first_round: u64,
    /// The random key that every envelope checksum of this file mixes in
    /// (frame.rs): it keeps client-chosen payloads from passing for frames.
    pub mark_key: u32,
}

impl JournalHeader {
    /// Whether group segments may hold records this file lost.
    pub fn segments_may_lead(&self) -> bool {
        self.flags & FLAG_SEGMENTS_MAY_LEAD != 0
    }
}

/// Where a new journal file starts: its sequence number and the numbers
/// its first frame gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalStart {
    pub seq: u64,
    pub lsn: u64,
    pub round: u64,
}

impl JournalStart {
    /// The start of a new data directory's first journal file.
    #[cfg(any(test, feature = "testing"))]
    pub fn first(seq: u64) -> JournalStart {
        JournalStart {
            seq,
            lsn: 1,
            round: 1,
        }
    }
}
/// The header this build writes for `start` (flags 0) with `mark_key`.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn encode_header(start: JournalStart, mark_key: u32) -> [u8; JOURNAL_HEADER_BYTES] {
    encode_header_of(&JournalHeader {
        flags: 0,
        seq: start.seq,
        first_lsn: start.lsn,
        first_round: start.round,
        mark_key,
    })
}

/// A fresh key for a new journal file's envelopes. It must be one a
/// client cannot predict (SipHash under the process's random keys, over
/// the time), not one that is secret in any stronger sense: it only keeps
/// record payloads, which clients choose, from passing for envelopes.
pub(crate) fn new_mark_key(seq: u64) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seq);
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    let b = h.finish().to_le_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

// Format: { magic | version: u16 = 3 | header_len: u16 = 48 | flags: u8 |
//   reserved: [u8; 3] | seq: u64 | first_lsn: u64 | first_round: u64 |
//   mark_key: u32 | crc32 of 0..44 }
pub(crate) fn encode_header_of(h: &JournalHeader) -> [u8; JOURNAL_HEADER_BYTES] {
    let mut b = [0u8; JOURNAL_HEADER_BYTES];
    b[0..8].copy_from_slice(&JOURNAL_MAGIC);
    b[8..10].copy_from_slice(&JOURNAL_VERSION.to_le_bytes());
    b[10..12].copy_from_slice(&(JOURNAL_HEADER_BYTES as u16).to_le_bytes());
    b[12] = h.flags;
    b[16..24].copy_from_slice(&h.seq.to_le_bytes());
    b[24..32].copy_from_slice(&h.first_lsn.to_le_bytes());
    b[32..40].copy_from_slice(&h.first_round.to_le_bytes());
    b[40..44].copy_from_slice(&h.mark_key.to_le_bytes());
    let crc = crc32fast::hash(&b[0..44]);
    b[44..48].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The largest frame number (lsn) a file may name: a group keeps its
/// `applied_lsn` in 62 bits beside two flags (`dirty.rs`), and 2^62 frames
/// are never written, so a larger one is damage.
pub const LSN_MAX: u64 = (1 << 62) - 1;

/// Checks a journal file header; returns its fields.
pub fn decode_header_of(b: &[u8]) -> Result<JournalHeader, String> {
    if b.len() < JOURNAL_HEADER_BYTES {
        return Err(format!(
            "file of {} bytes is shorter than the journal header",
            b.len()
        ));
    }
    let stored = u32::from_le_bytes([b[44], b[45], b[46], b[47]]);
    if crc32fast::hash(&b[0..44]) != stored {
        return Err("journal header checksum mismatch".into());
    }
    if b[0..8] != JOURNAL_MAGIC {
        return Err("bad journal magic".into());
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if version != JOURNAL_VERSION {
        return Err(format!("unsupported journal version {version}"));
    }
    if u16::from_le_bytes([b[10], b[11]]) as usize != JOURNAL_HEADER_BYTES
        || b[12] & !FLAG_SEGMENTS_MAY_LEAD != 0
        || b[13..16] != [0; 3]
    {
        return Err("journal header_len or reserved bytes invalid".into());
    }
    let (first_lsn, first_round) = (u64_at(b, 24), u64_at(b, 32));
    if first_lsn == 0 || first_round == 0 {
        return Err("journal header first_lsn or first_round is 0".into());
    }
    if first_lsn > LSN_MAX {
        return Err(format!(
            "journal header first_lsn {first_lsn} is at or beyond 2^62"
        ));
    }
    Ok(JournalHeader {
        flags: b[12],
        seq: u64_at(b, 16),
        first_lsn,
        first_round,
        mark_key: u32::from_le_bytes([b[40], b[41], b[42], b[43]]),
    })
}

/// The version of a journal file whose header is intact but of a version
/// this build does not read (such a file must be refused, not cut): a
/// storage-format-1 header (versions 1 and 2: 32 bytes, CRC of bytes
/// 0..28 at 28), or a header of this layout with another version.
pub fn unsupported_version(b: &[u8]) -> Option<u16> {
    if b.len() < FORMAT_1_HEADER_BYTES || b[0..8] != JOURNAL_MAGIC {
        return None;
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    let crc_at = |at: usize| {
        b.len() >= at + 4
            && crc32fast::hash(&b[0..at])
                == u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    };
    let format_1 = matches!(version, 1 | 2) && crc_at(28);
    let other = version != JOURNAL_VERSION && crc_at(44);
    (format_1 || other).then_some(version)
}

/// `journal/` under a data directory: the journal files (storage.md 5).
pub fn journal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("journal")
}

pub fn journal_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}{JOURNAL_SUFFIX}"))
}
