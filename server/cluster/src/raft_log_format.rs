//! The bytes of the Raft log file (format-spec/cluster.md section 3): its
//! header, its records, and the reading of a whole file into what it means
//! ([`read`]), with no I/O: [`crate::raft_log::RaftLog::open`] acts on the
//! reading (cuts a torn tail, refuses damage, rewrites an older version),
//! and `tidemark ctl raft-log` prints it.
//!
//! Version 3 (this build writes it):
//!
//! ```text
//! header (32): { magic: [u8; 8] = "TMRAFTL\0" | version: u32 = 3 | mark_key: u32 |
//!                durable_len: u64 | reserved: u32 = 0 | header_crc: u32 (of bytes 0..28) }
//! record:      { head_crc: u32 (CRC-32 of mark_key (4 bytes LE) ++ bytes 4..32) | len: u32 |
//!                kind: u8 | reserved: [u8; 7] = 0 | synced_len: u64 | body_crc: u32 |
//!                reserved: u32 = 0 } + body (len - 32 bytes)
//! ```
//!
//! The synced-length proof, the engine journal's (storage.md section 5):
//! every record names `synced_len`, how far the file was durable (an
//! fdatasync had returned) when its write was issued, and the header names
//! `durable_len`, how much of the file was durable before it was named
//! `raft/log` (a file is created or rewritten whole under `log.new`,
//! fdatasynced, then renamed). A crash can tear only bytes written after
//! the last fdatasync, so an invalid record that the header or a later
//! valid record shows to lie below a synced length was damaged after it
//! was durable: the reading says [`Outcome::Damaged`] at its offset, and
//! nothing is cut. Otherwise it is a torn write ([`Outcome::Torn`]). Later
//! records are looked for at every offset after the invalid one, also
//! inside entry data, which clients choose; so the header checksum is keyed
//! with the file's random `mark_key` (a payload cannot hold a record header
//! that checks, but with probability 2^-32), and it covers only the 32
//! header bytes, so that trying an offset costs a few compares and at most
//! one CRC of 32 bytes.
//!
//! Versions 1 and 2 (16-byte header `{ magic | version | reserved: u32 }`,
//! records `{ len: u32 | crc: u32 (of bytes 8..len) | kind: u8 |
//! reserved: [u8; 7] }` + body, [`encode_record`]) carry no proof: an
//! invalid record ends their valid part, as before. The snapshot stream
//! (cluster.md section 8.2) frames its records the same way.
//!
//! Invariants of a version 3 file: `32 <= synced_len <=` the record's own
//! offset; `32 <= durable_len`; a record of a rewrite names 32 (nothing of
//! `log.new` was synced when it was written: the header's `durable_len`
//! vouches for all of it).
//!
//! Costs: [`read`] walks the file once (one CRC per record body); after an
//! invalid record it tries every offset after it once.

use raft::eraftpb::{Entry, EntryType, HardState};

use crate::le::u64_at;
use crate::members::{self, Members};

/// `"TMRAFTL\0"`, the file's magic.
pub const MAGIC: [u8; 8] = *b"TMRAFTL\0";
/// The format version this code writes (a file it creates or rewrites).
pub const VERSION: u32 = 3;
/// Version 2: no proof; a Start record allowed first. Read, then rewritten.
pub const VERSION_2: u32 = 2;
/// The first version: no proof, no Start record. Read, then rewritten.
pub const VERSION_1: u32 = 1;
/// Bytes of a version 3 file header.
pub const FILE_HEADER_BYTES: usize = 32;
/// Bytes of a version 1 or 2 file header.
pub const FILE_HEADER_V1_BYTES: usize = 16;
/// Bytes of a version 3 record header.
pub const RECORD_HEADER_V3_BYTES: usize = 32;
/// Bytes of a version 1 or 2 record header (and of a snapshot stream's,
/// cluster.md section 8.2).
pub const RECORD_HEADER_BYTES: usize = 16;
/// Bytes of an Entry body before its data.
pub const ENTRY_FIXED_BYTES: usize = 24;
/// Bytes of a HardState body.
pub const HARD_STATE_BYTES: usize = 24;
/// Bytes of a Start body.
pub const START_BYTES: usize = 16;
/// The largest index a Start record may name (cluster.md section 3.2).
pub const START_INDEX_MAX: u64 = 1 << 62;
/// Record kinds.
pub const KIND_ENTRY: u8 = 1;
pub const KIND_HARD_STATE: u8 = 2;
pub const KIND_START: u8 = 3;
/// The membership (cluster.md section 11.1; body: `members::encode_body`).
pub const KIND_MEMBERS: u8 = 4;

/// A file's header, as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    /// Bytes of the header (16 for versions 1 and 2, 32 for 3).
    pub bytes: usize,
    /// The key of the record header checksums (version 3; 0 before).
    pub mark_key: u32,
    /// Bytes of the file durable before it was named `raft/log` (version
    /// 3; the header's bytes before).
    pub durable_len: u64,
}

/// What the valid records of a file mean (cluster.md section 3.3).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LogState {
    /// The last compacted entry: (index, term); (0, 0) if none.
    pub start: (u64, u64),
    /// The entries after the start, dense from `start.0 + 1`.
    pub entries: Vec<Entry>,
    pub hard_state: HardState,
    /// The last Members record's membership, if the file holds one.
    pub members: Option<Members>,
}

impl LogState {
    /// The last index (the start's when no entry follows it).
    pub fn last(&self) -> u64 {
        self.start.0 + self.entries.len() as u64
    }

    /// Applies one valid record's meaning (cluster.md section 3.3); a
    /// Start only where `start_allowed` (the first record of a version 2
    /// or 3 file). `Err`: the record is damage (why).
    fn apply(&mut self, kind: u8, body: &[u8], start_allowed: bool) -> Result<(), String> {
        match kind {
            KIND_ENTRY => {
                let entry = decode_entry(body)?;
                let last = self.last();
                if entry.index > last + 1 {
                    return Err(format!("entry {} after entry {last}: a gap", entry.index));
                }
                if entry.index <= self.start.0 {
                    return Err(format!(
                        "entry {} at or before the log's start {}",
                        entry.index, self.start.0
                    ));
                }
                self.entries
                    .truncate((entry.index - self.start.0 - 1) as usize);
                self.entries.push(entry);
            }
            KIND_HARD_STATE => {
                if body.len() != HARD_STATE_BYTES {
                    return Err(format!("a hard state of {} bytes", body.len()));
                }
                self.hard_state = HardState {
                    term: u64_at(body, 0),
                    vote: u64_at(body, 8),
                    commit: u64_at(body, 16),
                    ..Default::default()
                };
            }
            KIND_START if start_allowed => {
                if body.len() != START_BYTES {
                    return Err(format!("a start of {} bytes", body.len()));
                }
                let (index, term) = (u64_at(body, 0), u64_at(body, 8));
                // An index past 2^62 is no log's (a set appending a
                // million entries a second takes 146,000 years to get
                // there): refused, so that index arithmetic never wraps.
                if index == 0 || term == 0 || index > START_INDEX_MAX {
                    return Err(format!("start {index} term {term}"));
                }
                self.start = (index, term);
            }
            KIND_START => {
                return Err("a start record that is not a version 2 or 3 file's first".into())
            }
            KIND_MEMBERS => {
                let m = members::decode_body(body).map_err(|why| format!("members: {why}"))?;
                self.members = Some(m);
            }
            k => return Err(format!("unknown record kind {k}")),
        }
        Ok(())
    }
}

/// How a file's valid part ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte after the header is a valid record.
    Clean,
    /// An invalid record at `Reading::end` that nothing shows to have been
    /// synced: a write a crash tore before its fdatasync (or, in a version
    /// 1 or 2 file, anything invalid). What follows is not read; an open
    /// cuts it.
    Torn { reason: String },
    /// Bytes that were durable are damaged (or a valid record makes no
    /// sense): an open refuses the file and changes nothing.
    Damaged { offset: u64, reason: String },
}

/// A whole file, read ([`read`]).
#[derive(Clone, Debug)]
pub struct Reading {
    /// `None`: shorter than any header (a creation by a version 1 or 2
    /// build that a crash cut: a version 3 file is created whole).
    pub header: Option<Header>,
    /// What the valid records before `end` mean.
    pub state: LogState,
    /// The end of the valid part (where a torn write or damage starts).
    pub end: u64,
    pub file_len: u64,
    pub outcome: Outcome,
}

/// Reads a whole Raft log file (module docs, cluster.md section 3.3).
pub fn read(bytes: &[u8]) -> Reading {
    let mut r = Reading {
        header: None,
        state: LogState::default(),
        end: 0,
        file_len: bytes.len() as u64,
        outcome: Outcome::Clean,
    };
    if bytes.len() < FILE_HEADER_V1_BYTES {
        return r;
    }
    let header = match decode_header(bytes) {
        Ok(h) => h,
        Err((offset, reason)) => {
            r.outcome = Outcome::Damaged { offset, reason };
            return r;
        }
    };
    r.header = Some(header);
    let mut at = header.bytes;
    loop {
        if at == bytes.len() {
            break;
        }
        let record = if header.version == VERSION {
            record_v3_at(bytes, at, header.mark_key)
        } else {
            record_v1_at(bytes, at)
        };
        match record {
            Ok(rec) => {
                let start_allowed = at == header.bytes && header.version >= VERSION_2;
                let applied = if rec.reserved_set {
                    Err("reserved bytes of a record are not 0".into())
                } else {
                    r.state.apply(rec.kind, rec.body, start_allowed)
                };
                if let Err(reason) = applied {
                    r.end = at as u64;
                    r.outcome = Outcome::Damaged {
                        offset: at as u64,
                        reason,
                    };
                    return r;
                }
                at += rec.len;
            }
            Err(why) => {
                r.outcome = invalid_record(bytes, &header, at, why);
                break;
            }
        }
    }
    r.end = at as u64;
    if r.outcome == Outcome::Clean && header.durable_len > r.file_len {
        // Cut at a record's end, below what was durable: not a crash's.
        r.outcome = Outcome::Damaged {
            offset: r.file_len,
            reason: format!(
                "the file ends at {}, but its first {} bytes were synced (header durable_len)",
                r.file_len, header.durable_len
            ),
        };
    }
    r
}

/// What an invalid record at `at` (`why`) is: damage if the header or a
/// valid record after it names a synced length past `at`, else a torn
/// write (always, in a version 1 or 2 file).
fn invalid_record(bytes: &[u8], header: &Header, at: usize, why: String) -> Outcome {
    if header.version != VERSION {
        return Outcome::Torn { reason: why };
    }
    let later = furthest_proof(bytes, at + 1, header.mark_key);
    let (proof, by) = match later {
        Some((synced, x)) if synced > header.durable_len => {
            (synced, format!("the record at offset {x} says so"))
        }
        _ => (header.durable_len, "the file header says so".to_string()),
    };
    if proof > at as u64 {
        Outcome::Damaged {
            offset: at as u64,
            reason: format!(
                "{why}, in bytes that were synced (up to {proof}: {by}): damage, not a torn write"
            ),
        }
    } else {
        Outcome::Torn { reason: why }
    }
}

/// The header's fields, or (offset, why) it is damage.
fn decode_header(b: &[u8]) -> Result<Header, (u64, String)> {
    if b[..8] != MAGIC {
        return Err((0, "not a tidemark Raft log (magic)".into()));
    }
    let version = u32_at(b, 8);
    match version {
        VERSION_1 | VERSION_2 => {
            if is_version_3_header(b) {
                // Read as an older version, it would be misread and cut.
                return Err((
                    8,
                    format!("version {version} in a version 3 header (its checksum says 3)"),
                ));
            }
            if b[12..16] != [0; 4] {
                return Err((12, "reserved header bytes are not 0".into()));
            }
            Ok(Header {
                version,
                bytes: FILE_HEADER_V1_BYTES,
                mark_key: 0,
                durable_len: FILE_HEADER_V1_BYTES as u64,
            })
        }
        VERSION => {
            // A version 3 file is created whole (module docs): a short or
            // damaged header is damage, never a torn creation.
            let Some(h) = b.get(..FILE_HEADER_BYTES) else {
                return Err((0, format!("a version 3 header of {} bytes", b.len())));
            };
            if crc32fast::hash(&h[..28]) != u32_at(h, 28) {
                return Err((0, "header checksum mismatch".into()));
            }
            let durable_len = u64_at(h, 16);
            if h[24..28] != [0; 4] || durable_len < FILE_HEADER_BYTES as u64 {
                return Err((16, format!("durable_len {durable_len} or reserved bytes")));
            }
            Ok(Header {
                version,
                bytes: FILE_HEADER_BYTES,
                mark_key: u32_at(h, 12),
                durable_len,
            })
        }
        v => Err((
            8,
            format!("version {v} (this build reads {VERSION_1} to {VERSION})"),
        )),
    }
}

/// A record whose checksums match.
struct Record<'a> {
    kind: u8,
    body: &'a [u8],
    /// Bytes of the whole record.
    len: usize,
    /// A version 1 or 2 record with reserved bytes set (a checked record
    /// a writer made so: damage, not a crash's).
    reserved_set: bool,
}

/// Whether `b` begins with a version 3 header whose version field alone
/// was damaged: its checksum matches with version 3 in that field.
fn is_version_3_header(b: &[u8]) -> bool {
    let Some(h) = b.get(..FILE_HEADER_BYTES) else {
        return false;
    };
    let mut c = crc32fast::Hasher::new();
    c.update(&h[..8]);
    c.update(&VERSION.to_le_bytes());
    c.update(&h[12..28]);
    c.finalize() == u32_at(h, 28)
}

/// A version 3 record header, checked.
struct RecordHeader {
    len: usize,
    kind: u8,
    synced_len: u64,
    body_crc: u32,
}

/// Checks the version 3 record header at `at` (not its body): kind,
/// reserved bytes, `32 <= synced_len <= at` (a writer can only have
/// synced bytes it wrote before), the keyed checksum, `len >= 32`. The
/// fixed bytes are compared before the checksum is computed, so asking at
/// every offset is cheap.
fn record_header_at(bytes: &[u8], at: usize, mark_key: u32) -> Result<RecordHeader, String> {
    let Some(h) = bytes.get(at..at.saturating_add(RECORD_HEADER_V3_BYTES)) else {
        return Err(format!(
            "a truncated record header ({} bytes)",
            bytes.len() - at
        ));
    };
    let kind = h[8];
    if !(KIND_ENTRY..=KIND_MEMBERS).contains(&kind) {
        return Err(format!("unknown record kind {kind}"));
    }
    if h[9..16] != [0; 7] || h[28..32] != [0; 4] {
        return Err("reserved record header bytes are not 0".into());
    }
    let synced_len = u64_at(h, 16);
    if synced_len < FILE_HEADER_BYTES as u64 || synced_len > at as u64 {
        return Err(format!(
            "synced_len {synced_len} outside {FILE_HEADER_BYTES}..={at}"
        ));
    }
    let computed = head_crc(h, mark_key);
    if computed != u32_at(h, 0) {
        return Err(format!(
            "record header checksum mismatch: stored {:#010x}, computed {computed:#010x}",
            u32_at(h, 0)
        ));
    }
    let len = u32_at(h, 4) as usize;
    if len < RECORD_HEADER_V3_BYTES {
        return Err(format!("a record of {len} bytes"));
    }
    Ok(RecordHeader {
        len,
        kind,
        synced_len,
        body_crc: u32_at(h, 24),
    })
}

/// The version 3 record at `at`: (kind, body, bytes), or why it is
/// invalid.
fn record_v3_at(bytes: &[u8], at: usize, mark_key: u32) -> Result<Record<'_>, String> {
    let h = record_header_at(bytes, at, mark_key)?;
    let Some(rec) = bytes.get(at..at.saturating_add(h.len)) else {
        return Err(format!(
            "a record of {} bytes runs past the end of the file ({} bytes remain)",
            h.len,
            bytes.len() - at
        ));
    };
    let body = &rec[RECORD_HEADER_V3_BYTES..];
    let computed = crc32fast::hash(body);
    if computed != h.body_crc {
        return Err(format!(
            "record body checksum mismatch: stored {:#010x}, computed {computed:#010x}",
            h.body_crc
        ));
    }
    Ok(Record {
        kind: h.kind,
        body,
        len: h.len,
        reserved_set: false,
    })
}

/// The version 1 or 2 record at `at`, if a whole one with a matching CRC
/// lies there (the same framing as a snapshot stream's records).
fn record_v1_at(bytes: &[u8], at: usize) -> Result<Record<'_>, String> {
    let invalid = || format!("no whole record with a matching checksum at {at}");
    let header = bytes
        .get(at..at.saturating_add(RECORD_HEADER_BYTES))
        .ok_or_else(invalid)?;
    let len = u32_at(header, 0) as usize;
    if len < RECORD_HEADER_BYTES {
        return Err(invalid());
    }
    let rec = bytes.get(at..at.saturating_add(len)).ok_or_else(invalid)?;
    if crc32fast::hash(&rec[8..]) != u32_at(rec, 4) {
        return Err(invalid());
    }
    Ok(Record {
        kind: rec[8],
        body: &rec[RECORD_HEADER_BYTES..],
        len,
        reserved_set: rec[9..16] != [0; 7],
    })
}

/// The furthest `synced_len` that a valid version 3 record header at or
/// after `from` names, with the header's offset. Every offset is tried, so
/// a record is found past bytes that no longer parse as records.
pub fn furthest_proof(bytes: &[u8], from: usize, mark_key: u32) -> Option<(u64, usize)> {
    let last = bytes.len().checked_sub(RECORD_HEADER_V3_BYTES)?;
    let mut best: Option<(u64, usize)> = None;
    for at in from..=last {
        // Cheap filters first: kind, reserved bytes.
        if !(KIND_ENTRY..=KIND_MEMBERS).contains(&bytes[at + 8]) || bytes[at + 9..at + 16] != [0; 7]
        {
            continue;
        }
        if let Ok(h) = record_header_at(bytes, at, mark_key) {
            if best.is_none_or(|(b, _)| h.synced_len > b) {
                best = Some((h.synced_len, at));
            }
        }
    }
    best
}

/// The keyed checksum of a version 3 record header `h` (module docs).
fn head_crc(h: &[u8], mark_key: u32) -> u32 {
    let mut c = crc32fast::Hasher::new();
    c.update(&mark_key.to_le_bytes());
    c.update(&h[4..RECORD_HEADER_V3_BYTES]);
    c.finalize()
}

/// The version 3 file header for `mark_key` and `durable_len`.
pub fn encode_header(mark_key: u32, durable_len: u64) -> [u8; FILE_HEADER_BYTES] {
    // Format: { magic: [u8; 8] = "TMRAFTL\0" | version: u32 = 3 | mark_key: u32 |
    //   durable_len: u64 | reserved: u32 = 0 | header_crc: u32 (of bytes 0..28) }
    let mut h = [0u8; FILE_HEADER_BYTES];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&mark_key.to_le_bytes());
    h[16..24].copy_from_slice(&durable_len.to_le_bytes());
    let crc = crc32fast::hash(&h[..28]);
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Appends one version 3 record of `kind`, whose body `body` writes, to a
/// file keyed `mark_key` whose first `synced_len` bytes are durable.
pub fn encode_record_v3(
    buf: &mut Vec<u8>,
    mark_key: u32,
    synced_len: u64,
    kind: u8,
    body: impl FnOnce(&mut Vec<u8>),
) {
    // Format: { head_crc: u32 (CRC-32 of mark_key (4 bytes LE) ++ bytes 4..32) |
    //   len: u32 | kind: u8 | reserved: [u8; 7] = 0 | synced_len: u64 |
    //   body_crc: u32 | reserved: u32 = 0 } + body
    let start = buf.len();
    buf.resize(start + RECORD_HEADER_V3_BYTES, 0);
    body(buf);
    let len = u32::try_from(buf.len() - start).unwrap_or(u32::MAX);
    let body_crc = crc32fast::hash(&buf[start + RECORD_HEADER_V3_BYTES..]);
    let h = &mut buf[start..start + RECORD_HEADER_V3_BYTES];
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8] = kind;
    h[16..24].copy_from_slice(&synced_len.to_le_bytes());
    h[24..28].copy_from_slice(&body_crc.to_le_bytes());
    let crc = head_crc(h, mark_key);
    h[..4].copy_from_slice(&crc.to_le_bytes());
}

/// Appends one version 1/2 record (and snapshot stream record) of `kind`
/// whose body `body` writes.
pub fn encode_record(buf: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
    // Format: { len: u32 | crc: u32 (of bytes 8..len) | kind: u8 |
    //   reserved: [u8; 7] = 0 } + body
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]);
    buf.push(kind);
    buf.extend_from_slice(&[0; 7]);
    body(buf);
    let len = u32::try_from(buf.len() - start).unwrap_or(u32::MAX);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// An Entry body.
pub fn entry_body(b: &mut Vec<u8>, e: &Entry) {
    // Format: { index: u64 | term: u64 | entry_type: u8 |
    //   reserved: [u8; 7] = 0 } + data
    b.extend_from_slice(&e.index.to_le_bytes());
    b.extend_from_slice(&e.term.to_le_bytes());
    b.push(e.get_entry_type() as u8);
    b.extend_from_slice(&[0; 7]);
    b.extend_from_slice(&e.data);
}

/// A HardState body.
pub fn hard_state_body(b: &mut Vec<u8>, hs: &HardState) {
    // Format: { term: u64 | vote: u64 | commit: u64 }
    b.extend_from_slice(&hs.term.to_le_bytes());
    b.extend_from_slice(&hs.vote.to_le_bytes());
    b.extend_from_slice(&hs.commit.to_le_bytes());
}

/// A Start body.
pub fn start_body(b: &mut Vec<u8>, index: u64, term: u64) {
    // Format: { index: u64 | term: u64 }
    b.extend_from_slice(&index.to_le_bytes());
    b.extend_from_slice(&term.to_le_bytes());
}

/// A whole version 3 file keyed `mark_key` (a creation or a rewrite,
/// module docs): header, Start (if `start` is not (0, 0)), Members (if
/// recorded), the entries, the hard state; every record names 32, the
/// header's `durable_len` the whole file.
pub fn encode_whole(
    mark_key: u32,
    start: (u64, u64),
    members: Option<&Members>,
    entries: &[Entry],
    hard_state: &HardState,
) -> Vec<u8> {
    let mut b = vec![0u8; FILE_HEADER_BYTES];
    let synced = FILE_HEADER_BYTES as u64;
    if start.0 > 0 {
        encode_record_v3(&mut b, mark_key, synced, KIND_START, |r| {
            start_body(r, start.0, start.1)
        });
    }
    if let Some(m) = members {
        encode_record_v3(&mut b, mark_key, synced, KIND_MEMBERS, |r| {
            members::encode_body(r, m)
        });
    }
    for e in entries {
        encode_record_v3(&mut b, mark_key, synced, KIND_ENTRY, |r| entry_body(r, e));
    }
    encode_record_v3(&mut b, mark_key, synced, KIND_HARD_STATE, |r| {
        hard_state_body(r, hard_state)
    });
    let header = encode_header(mark_key, b.len() as u64);
    b[..FILE_HEADER_BYTES].copy_from_slice(&header);
    b
}

fn decode_entry(body: &[u8]) -> Result<Entry, String> {
    if body.len() < ENTRY_FIXED_BYTES {
        return Err(format!("an entry body of {} bytes", body.len()));
    }
    let mut e = Entry {
        index: u64_at(body, 0),
        term: u64_at(body, 8),
        ..Default::default()
    };
    if e.index == 0 || e.term == 0 {
        return Err(format!("entry index {} term {}", e.index, e.term));
    }
    if body[16] == EntryType::EntryConfChange as u8 {
        e.set_entry_type(EntryType::EntryConfChange);
    } else if body[16] != EntryType::EntryNormal as u8 {
        return Err(format!("entry {} of type {}", e.index, body[16]));
    }
    if body[17..24] != [0; 7] {
        return Err(format!("entry {}: reserved bytes are not 0", e.index));
    }
    e.data = body[ENTRY_FIXED_BYTES..].to_vec().into();
    Ok(e)
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A fresh key for a new file's record headers. It must be one a client
/// cannot predict (SipHash under the process's random keys, over the
/// time), like the engine journal's `mark_key`, not one that is secret in
/// any stronger sense: it only keeps entry data, which clients choose,
/// from passing for record headers.
pub fn new_mark_key() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    let b = h.finish().to_le_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
