//! The commit journal: one shared append-only file per checkpoint period into
//! which every commit round writes its entries with one `write` and (under
//! `fsync=always`) one `fdatasync`, whatever number of groups it touched.
//! Group logs are written after the journal and synced only at checkpoints;
//! recovery replays the journal into them.
//!
//! File header (little-endian), see format-spec/storage.md "Journal file":
//! `{ magic: [u8; 8] = "TDMKJRNL" | version: u16 = 2 | header_len: u16 = 32 |
//!    flags: u8 | reserved: [u8; 3] = 0 | seq: u64 | mark_key: u32 |
//!    crc32: u32 (of bytes 0..28) }` (version 1: `flags` and `mark_key` are
//!    reserved, 0)
//!
//! Entry: `{ crc32: u32 (of bytes 4..24 + body_len) | body_len: u32 | kind: u8 |
//!    reserved: [u8; 7] = 0 | group_id: u64 | body: [u8; body_len] }`
//!
//! Sync marks (kind 8, version 2) are what lets recovery tell a torn write
//! from damage to bytes that were already durable: the first write after
//! an `fdatasync` starts with a mark saying how far the file was synced. A
//! torn write can only damage bytes after the newest sync; a mark further on
//! that names a synced length beyond a bad entry proves the bad entry was
//! durable, and so acknowledged data was damaged (format-spec/storage.md
//! sections 5 and 11). A mark carries its file's random `mark_key`, which
//! only the journal header holds: record payloads are chosen by clients,
//! and a payload shaped like a mark must not count as one.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs, VfsFile};

pub const JOURNAL_HEADER_BYTES: usize = 32;
pub const ENTRY_HEADER_BYTES: usize = 24;
pub const JOURNAL_MAGIC: [u8; 8] = *b"TDMKJRNL";
/// The version this build writes. It also reads version 1 (no sync marks,
/// no flags).
pub const JOURNAL_VERSION: u16 = 2;
/// Header flag (version 2): the writer's group segments could receive a
/// round's records before the round's journal bytes were synced (fsync
/// policy `interval` or `never`), so after a power loss a segment may hold
/// records the journal lost. Recovery then looks at every group's segments
/// before trusting the heads the checkpoint recorded.
pub const FLAG_SEGMENTS_MAY_LEAD: u8 = 1;
/// Body bytes of a sync mark: `{ synced_len: u64 | mark_key: u32 |
/// reserved: u32 = 0 }`.
pub const SYNC_MARK_BODY_BYTES: usize = 16;
const JOURNAL_SUFFIX: &str = ".tmj";

/// What a journal entry records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EntryKind {
    /// Body: one message record (record.rs layout).
    Record = 1,
    /// Body: empty. The group was created.
    CreateGroup = 2,
    /// Body: empty. The group and its files were deleted.
    DeleteGroup = 3,
    /// Body: `{ user: u64 | cursor: u64 }`, the cursor resolved when queued.
    Join = 4,
    /// Body: `{ user: u64 }`.
    Leave = 5,
    /// Body: `n x { user: u64 | cursor: u64 }`: persisted tidemarks.
    Cursors = 6,
    /// Body: `{ by_cursor: u8 | max_age_ms: u64 | max_bytes: u64 }`.
    SetRetention = 7,
    /// Body: `{ synced_len: u64 | mark_key: u32 | reserved: u32 = 0 }`;
    /// group_id 0. Every byte of the file below `synced_len` was durable
    /// (an fdatasync of it had returned) before this entry was written;
    /// `mark_key` is the file header's. Version 2 only.
    SyncMark = 8,
}

impl EntryKind {
    fn from_u8(b: u8) -> Option<EntryKind> {
        match b {
            1 => Some(EntryKind::Record),
            2 => Some(EntryKind::CreateGroup),
            3 => Some(EntryKind::DeleteGroup),
            4 => Some(EntryKind::Join),
            5 => Some(EntryKind::Leave),
            6 => Some(EntryKind::Cursors),
            7 => Some(EntryKind::SetRetention),
            8 => Some(EntryKind::SyncMark),
            _ => None,
        }
    }
}

/// The body of every entry kind: one encode and one decode per kind, the
/// only code that knows a body's layout (format-spec/storage.md section 5,
/// "Journal entry", and section 15.2). Encoders append to a buffer in which
/// [`begin_entry`] started the entry; decoders take the body an
/// [`EntryIter`] returned and answer `None` for a body of the wrong length
/// or with an invalid value (replay ignores such an entry, the spec says so
/// per kind). All integers are little-endian.
///
/// CreateGroup and DeleteGroup have an empty body: there is nothing to
/// encode, and their body is not looked at (storage.md section 16, item 5).
pub(crate) mod body {
    use crate::record::{self, NewRecord, RecordHeader};
    use crate::retention::Retention;

    /// Bytes of one row of a Cursors body.
    pub const CURSOR_ROW_BYTES: usize = 16;

    // Format: { record (record.rs layout, CRC included) }, body_len == record_len
    pub fn encode_record(out: &mut Vec<u8>, rec: &NewRecord<'_>) {
        record::encode_into(rec, out);
    }

    /// The header of the one record the body holds, verified (CRC
    /// included); `None` unless the body is exactly one valid record.
    pub fn decode_record(body: &[u8]) -> Option<RecordHeader> {
        let h = record::decode_verified(body, record::RECORD_BYTES_STORED_MAX).ok()?;
        (h.record_len as usize == body.len()).then_some(h)
    }

    // Format: { user: u64 | cursor: u64 }, 16 bytes; the cursor resolved
    // when the join was queued, so replay reproduces it exactly.
    pub fn encode_join(out: &mut Vec<u8>, user: u64, cursor: u64) {
        out.extend_from_slice(&user.to_le_bytes());
        out.extend_from_slice(&cursor.to_le_bytes());
    }

    /// `(user, cursor)`.
    pub fn decode_join(body: &[u8]) -> Option<(u64, u64)> {
        if body.len() != 16 {
            return None;
        }
        Some((u64_at(body, 0)?, u64_at(body, 8)?))
    }

    // Format: { user: u64 }, 8 bytes
    pub fn encode_leave(out: &mut Vec<u8>, user: u64) {
        out.extend_from_slice(&user.to_le_bytes());
    }

    pub fn decode_leave(body: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(body.try_into().ok()?))
    }

    // Format: n x { user: u64 | cursor: u64 }, 16 x n bytes, n >= 1
    pub fn encode_cursors(out: &mut Vec<u8>, rows: &[(u64, u64)]) {
        debug_assert!(!rows.is_empty(), "a Cursors entry holds at least one row");
        for &(user, cursor) in rows {
            out.extend_from_slice(&user.to_le_bytes());
            out.extend_from_slice(&cursor.to_le_bytes());
        }
    }

    /// The `(user, cursor)` rows; bytes after the last whole row are ignored.
    pub fn decode_cursors(body: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
        body.chunks_exact(CURSOR_ROW_BYTES)
            .filter_map(|row| Some((u64_at(row, 0)?, u64_at(row, 8)?)))
    }

    // Format: { by_cursor: u8 (0 or 1) | max_age_ms: u64 | max_bytes: u64 }, 17 bytes
    pub fn encode_set_retention(out: &mut Vec<u8>, r: &Retention) {
        out.push(u8::from(r.by_cursor));
        out.extend_from_slice(&r.max_age_ms.to_le_bytes());
        out.extend_from_slice(&r.max_bytes.to_le_bytes());
    }

    pub fn decode_set_retention(body: &[u8]) -> Option<Retention> {
        if body.len() != 17 || body[0] > 1 {
            return None;
        }
        Some(Retention {
            by_cursor: body[0] == 1,
            max_age_ms: u64_at(body, 1)?,
            max_bytes: u64_at(body, 9)?,
        })
    }

    // Format: { synced_len: u64 | mark_key: u32 | reserved: u32 = 0 },
    // 16 bytes (group_id 0); mark_key is the file header's (bytes 24..28)
    pub fn encode_sync_mark(out: &mut Vec<u8>, synced_len: u64, mark_key: u32) {
        out.extend_from_slice(&synced_len.to_le_bytes());
        out.extend_from_slice(&mark_key.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
    }

    /// `(synced_len, mark_key)`; `None` unless the body is 16 bytes with
    /// zero reserved bytes.
    pub fn decode_sync_mark(body: &[u8]) -> Option<(u64, u32)> {
        if body.len() != super::SYNC_MARK_BODY_BYTES || body[12..16] != [0; 4] {
            return None;
        }
        let key = u32::from_le_bytes(body[8..12].try_into().ok()?);
        Some((u64_at(body, 0)?, key))
    }

    fn u64_at(b: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    }
}

/// Appends a whole entry to `out`: its header, the body `body` appends
/// (one of the [`body`] encoders), then its length and checksum. Returns
/// where the entry lies in `out`.
pub fn encode_entry(
    out: &mut Vec<u8>,
    kind: EntryKind,
    group_id: u64,
    body: impl FnOnce(&mut Vec<u8>),
) -> std::ops::Range<usize> {
    let start = begin_entry(out, kind, group_id);
    body(out);
    finish_entry(out, start);
    start..out.len()
}

/// Starts an entry at the end of `out`; the caller appends the body, then
/// calls [`finish_entry`] with the returned start offset.
// Format: { crc32: u32 | body_len: u32 | kind: u8 | reserved: [u8; 7] = 0 |
//   group_id: u64 | body: [u8; body_len] }, crc32 of bytes 4..24 + body_len
pub fn begin_entry(out: &mut Vec<u8>, kind: EntryKind, group_id: u64) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0u8; 8]); // crc, body_len: filled by finish_entry
    out.push(kind as u8);
    out.extend_from_slice(&[0u8; 7]);
    out.extend_from_slice(&group_id.to_le_bytes());
    start
}

/// Fills in the length and checksum of the entry begun at `start`.
pub fn finish_entry(out: &mut [u8], start: usize) {
    let body_len = out.len() - start - ENTRY_HEADER_BYTES;
    // Invariant: bodies are single records, bounded by payload_bytes_max < u32::MAX / 2.
    let body_len = u32::try_from(body_len).expect("invariant: entry body fits u32");
    out[start + 4..start + 8].copy_from_slice(&body_len.to_le_bytes());
    let crc = crc32fast::hash(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A decoded journal entry borrowing its body.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub kind: EntryKind,
    pub group_id: u64,
    pub body: &'a [u8],
}

/// Iterates over the entries of journal bytes (after the file header).
/// Stops at the first invalid entry: that and everything after it is the
/// torn tail of a crash.
pub struct EntryIter<'a> {
    buf: &'a [u8],
    pos: usize,
    body_bytes_max: usize,
    stop: Option<String>,
}

impl<'a> EntryIter<'a> {
    pub fn new(buf: &'a [u8], body_bytes_max: usize) -> Self {
        EntryIter {
            buf,
            pos: 0,
            body_bytes_max,
            stop: None,
        }
    }

    /// Offset just past the last valid entry returned.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Why iteration stopped before the end, if it did.
    pub fn stop_reason(&self) -> Option<&str> {
        self.stop.as_deref()
    }

    fn fail(&mut self, why: String) -> Option<Entry<'a>> {
        self.stop = Some(why);
        None
    }
}

impl<'a> Iterator for EntryIter<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.stop.is_some() || self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        if rest.len() < ENTRY_HEADER_BYTES {
            return self.fail(format!("truncated entry header ({} bytes)", rest.len()));
        }
        let u32_at =
            |o: usize| u32::from_le_bytes([rest[o], rest[o + 1], rest[o + 2], rest[o + 3]]);
        let body_len = u32_at(4) as usize;
        if body_len > self.body_bytes_max {
            return self.fail(format!(
                "entry body length {body_len} exceeds {}",
                self.body_bytes_max
            ));
        }
        let total = ENTRY_HEADER_BYTES + body_len;
        if rest.len() < total {
            return self.fail(format!(
                "truncated entry: need {total} bytes, have {}",
                rest.len()
            ));
        }
        let computed = crc32fast::hash(&rest[4..total]);
        if computed != u32_at(0) {
            return self.fail(format!(
                "entry checksum mismatch: stored {:#010x}, computed {computed:#010x}",
                u32_at(0)
            ));
        }
        let Some(kind) = EntryKind::from_u8(rest[8]) else {
            return self.fail(format!("unknown entry kind {}", rest[8]));
        };
        if rest[9..16].iter().any(|&b| b != 0) {
            return self.fail("reserved entry bytes set".into());
        }
        let mut g = [0u8; 8];
        g.copy_from_slice(&rest[16..24]);
        self.pos += total;
        Some(Entry {
            kind,
            group_id: u64::from_le_bytes(g),
            body: &rest[ENTRY_HEADER_BYTES..total],
        })
    }
}

/// A decoded journal file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JournalHeader {
    pub version: u16,
    pub flags: u8,
    pub seq: u64,
    /// Version 2: the random key every sync mark of this file carries
    /// (version 1: 0).
    pub mark_key: u32,
}

impl JournalHeader {
    /// Version 2 files carry sync marks (version 1 files never do).
    pub fn has_sync_marks(&self) -> bool {
        self.version >= 2
    }

    /// Whether group segments may hold records this file lost. A version 1
    /// file does not say, so it is assumed.
    pub fn segments_may_lead(&self) -> bool {
        self.version < 2 || self.flags & FLAG_SEGMENTS_MAY_LEAD != 0
    }
}

/// The header this build writes for file `seq` (flags 0) with `mark_key`.
#[cfg(any(test, feature = "testing"))]
pub(crate) fn encode_header(seq: u64, mark_key: u32) -> [u8; JOURNAL_HEADER_BYTES] {
    encode_header_of(&JournalHeader {
        version: JOURNAL_VERSION,
        flags: 0,
        seq,
        mark_key,
    })
}

/// A fresh key for a new journal file's sync marks. It must be one a
/// client cannot predict (SipHash under the process's random keys, over
/// the time), not one that is secret in any stronger sense: it only keeps
/// record payloads, which clients choose, from passing for sync marks.
fn new_mark_key(seq: u64) -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(seq);
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    let b = h.finish().to_le_bytes();
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

// Format: { magic | version: u16 | header_len: u16 = 32 | flags: u8 |
//   reserved: [u8; 3] | seq: u64 | mark_key: u32 | crc32 of 0..28 }
pub(crate) fn encode_header_of(h: &JournalHeader) -> [u8; JOURNAL_HEADER_BYTES] {
    let mut b = [0u8; JOURNAL_HEADER_BYTES];
    b[0..8].copy_from_slice(&JOURNAL_MAGIC);
    b[8..10].copy_from_slice(&h.version.to_le_bytes());
    b[10..12].copy_from_slice(&(JOURNAL_HEADER_BYTES as u16).to_le_bytes());
    b[12] = h.flags;
    b[16..24].copy_from_slice(&h.seq.to_le_bytes());
    b[24..28].copy_from_slice(&h.mark_key.to_le_bytes());
    let crc = crc32fast::hash(&b[0..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Checks a journal file header (version 1 or 2); returns its fields.
pub fn decode_header_of(b: &[u8]) -> Result<JournalHeader, String> {
    if b.len() < JOURNAL_HEADER_BYTES {
        return Err(format!(
            "file of {} bytes is shorter than the journal header",
            b.len()
        ));
    }
    let stored = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
    if crc32fast::hash(&b[0..28]) != stored {
        return Err("journal header checksum mismatch".into());
    }
    if b[0..8] != JOURNAL_MAGIC {
        return Err("bad journal magic".into());
    }
    let version = u16::from_le_bytes([b[8], b[9]]);
    if !is_known_version(version) {
        return Err(format!("unsupported journal version {version}"));
    }
    // Version 1 has no flags and no mark key: byte 12 and bytes 24..28 are
    // reserved there.
    let flags_allowed = if version >= 2 {
        FLAG_SEGMENTS_MAY_LEAD
    } else {
        0
    };
    if u16::from_le_bytes([b[10], b[11]]) as usize != JOURNAL_HEADER_BYTES
        || b[12] & !flags_allowed != 0
        || b[13..16] != [0; 3]
        || (version < 2 && b[24..28] != [0; 4])
    {
        return Err("journal header_len or reserved bytes invalid".into());
    }
    let mut s = [0u8; 8];
    s.copy_from_slice(&b[16..24]);
    Ok(JournalHeader {
        version,
        flags: b[12],
        seq: u64::from_le_bytes(s),
        mark_key: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
    })
}

fn is_known_version(version: u16) -> bool {
    version == 1 || version == JOURNAL_VERSION
}

/// The version of a journal file whose header is intact but whose version
/// this build does not know (such a file must be refused, not cut).
pub fn unsupported_version(b: &[u8]) -> Option<u16> {
    if b.len() < JOURNAL_HEADER_BYTES || b[0..8] != JOURNAL_MAGIC {
        return None;
    }
    let stored = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
    let version = u16::from_le_bytes([b[8], b[9]]);
    (crc32fast::hash(&b[0..28]) == stored && !is_known_version(version)).then_some(version)
}

/// Whether the 24-byte entry header `b` is that of a sync mark: kind 8,
/// `body_len` 16, zero reserved bytes and group 0. No other entry this
/// build writes has such a header (a Record body is longer than 16 bytes,
/// every other kind names a group, and group 0 does not exist).
pub fn is_sync_mark_header(b: &[u8]) -> bool {
    b.len() >= ENTRY_HEADER_BYTES
        && b[8] == EntryKind::SyncMark as u8
        && b[4..8] == (SYNC_MARK_BODY_BYTES as u32).to_le_bytes()
        && b[9..16] == [0; 7]
        && b[16..24] == [0; 8]
}

/// A sync mark entry of the file whose header has `mark_key`, valid in
/// itself at absolute file offset `at` of `file`: its header and checksum
/// check, it carries the file's key, and the length it names lies between
/// the file header and the mark itself (a writer can only have synced
/// bytes it wrote before). Returns the synced length it names.
/// Cheap to ask at every offset: the fixed kind, length, key and reserved
/// bytes are compared before the checksum is computed.
pub fn sync_mark_at(file: &[u8], at: usize, mark_key: u32) -> Option<u64> {
    let total = ENTRY_HEADER_BYTES + SYNC_MARK_BODY_BYTES;
    let b = file.get(at..at.checked_add(total)?)?;
    let body = &b[ENTRY_HEADER_BYTES..];
    if !is_sync_mark_header(b) || body[8..12] != mark_key.to_le_bytes() || body[12..16] != [0; 4] {
        return None;
    }
    if crc32fast::hash(&b[4..total]) != u32::from_le_bytes([b[0], b[1], b[2], b[3]]) {
        return None;
    }
    let (synced, key) = body::decode_sync_mark(body)?;
    debug_assert_eq!(key, mark_key, "the key was compared above");
    (synced >= JOURNAL_HEADER_BYTES as u64 && synced <= at as u64).then_some(synced)
}

/// The furthest synced length that a valid sync mark (carrying
/// `mark_key`) at or after absolute offset `from` names, with the mark's
/// offset. Every offset is tried, so a mark is found past bytes that no
/// longer parse as entries.
pub fn furthest_sync_mark_from(file: &[u8], from: usize, mark_key: u32) -> Option<(u64, usize)> {
    let mut best: Option<(u64, usize)> = None;
    for at in from..file.len() {
        if let Some(synced) = sync_mark_at(file, at, mark_key) {
            if best.is_none_or(|(b, _)| synced > b) {
                best = Some((synced, at));
            }
        }
    }
    best
}

/// Appends a sync mark entry naming `synced_len`, for the file whose
/// header has `mark_key`, to `out`.
pub fn encode_sync_mark(out: &mut Vec<u8>, synced_len: u64, mark_key: u32) {
    encode_entry(out, EntryKind::SyncMark, 0, |b| {
        body::encode_sync_mark(b, synced_len, mark_key)
    });
}

pub fn journal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("journal")
}

pub fn journal_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:020}{JOURNAL_SUFFIX}"))
}

/// The journal files in `dir` as `(seq, path)`, oldest first.
pub fn list(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = vfs
        .read_dir(dir)
        .map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    let mut files: Vec<(u64, PathBuf)> = entries
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let seq = name.strip_suffix(JOURNAL_SUFFIX)?.parse().ok()?;
            Some((seq, p))
        })
        .collect();
    files.sort_unstable();
    Ok(files)
}

/// The journal file being appended to.
pub struct Journal {
    pub seq: u64,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    len: u64,
    /// Bytes of the file known durable: its length when the last
    /// fdatasync returned.
    synced: u64,
    /// The synced length the last sync mark written names.
    marked: u64,
    /// The header's key, carried by every sync mark of this file.
    mark_key: u32,
    /// A write that starts with a sync mark is assembled here, so the
    /// mark and the round still go out in one write. Its capacity stays at
    /// the largest round written (bounded by `commit_round_bytes_max` plus
    /// one entry).
    scratch: Vec<u8>,
}

impl Journal {
    /// Creates journal file `seq` in `dir` and makes it (and its directory
    /// entry) durable, so a checkpoint may point at it. `segments_may_lead`
    /// says whether group segments are written before the journal bytes of
    /// their round are synced (fsync policy other than `always`), see
    /// [`FLAG_SEGMENTS_MAY_LEAD`].
    pub fn create(vfs: &dyn Vfs, dir: &Path, seq: u64, segments_may_lead: bool) -> Result<Journal> {
        let path = journal_path(dir, seq);
        let ctx = |op: &str| format!("{op} {}", path.display());
        let file = vfs
            .open(&path, OpenMode::ReadWriteCreate)
            .map_err(|e| Error::io(ctx("create"), e))?;
        file.set_len(0).map_err(|e| Error::io(ctx("truncate"), e))?;
        let header = JournalHeader {
            version: JOURNAL_VERSION,
            flags: if segments_may_lead {
                FLAG_SEGMENTS_MAY_LEAD
            } else {
                0
            },
            seq,
            mark_key: new_mark_key(seq),
        };
        file.write_all_at(&encode_header_of(&header), 0)
            .map_err(|e| Error::write(ctx("write"), e))?;
        file.sync_data()
            .map_err(|e| Error::io(ctx("fdatasync"), e))?;
        vfs.sync_dir(dir)
            .map_err(|e| Error::io(format!("fsync dir {}", dir.display()), e))?;
        Ok(Journal {
            seq,
            path,
            file,
            len: JOURNAL_HEADER_BYTES as u64,
            synced: JOURNAL_HEADER_BYTES as u64,
            marked: JOURNAL_HEADER_BYTES as u64,
            mark_key: header.mark_key,
            scratch: Vec::new(),
        })
    }

    /// Appends `bytes` (whole entries) with one write. The first write after
    /// a sync that moved the synced length starts with a sync mark naming
    /// it. On failure the file is cut back to where it was, so a failed
    /// write (a full disk) can be retried as if it never happened (the mark
    /// is then written with the retry).
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let mark = self.synced > self.marked;
        let out: &[u8] = if mark {
            self.scratch.clear();
            encode_sync_mark(&mut self.scratch, self.synced, self.mark_key);
            self.scratch.extend_from_slice(bytes);
            &self.scratch
        } else {
            bytes
        };
        if let Err(e) = self.file.write_all_at(out, self.len) {
            let _ = self.file.set_len(self.len);
            return Err(Error::write(format!("write {}", self.path.display()), e));
        }
        self.len += out.len() as u64;
        if mark {
            self.marked = self.synced;
        }
        Ok(())
    }

    pub fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(format!("fdatasync {}", self.path.display()), e))?;
        self.synced = self.len;
        Ok(())
    }

    /// Bytes in the file, header included.
    pub fn len(&self) -> u64 {
        self.len
    }
}

/// Maps a whole journal file for replay.
pub fn map_file(vfs: &dyn Vfs, path: &Path) -> Result<Option<memmap2::Mmap>> {
    let file = vfs
        .open(path, OpenMode::Read)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let len = file
        .file_len()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| Error::Corrupt {
        path: path.to_owned(),
        group: None,
        offset: 0,
        reason: "journal larger than the address space".into(),
    })?;
    file.map(len)
        .map(Some)
        .map_err(|e| Error::io(format!("mmap {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(kind: EntryKind, group: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let s = begin_entry(&mut out, kind, group);
        out.extend_from_slice(body);
        finish_entry(&mut out, s);
        out
    }

    #[test]
    fn entries_round_trip() {
        let mut buf = entry(EntryKind::CreateGroup, 9, b"");
        buf.extend(entry(EntryKind::Record, 9, b"record bytes"));
        let mut it = EntryIter::new(&buf, 1 << 20);
        let a = it.next().unwrap();
        assert_eq!(
            (a.kind, a.group_id, a.body),
            (EntryKind::CreateGroup, 9, &b""[..])
        );
        let b = it.next().unwrap();
        assert_eq!(
            (b.kind, b.group_id, b.body),
            (EntryKind::Record, 9, &b"record bytes"[..])
        );
        assert!(it.next().is_none());
        assert_eq!(it.position(), buf.len());
        assert!(it.stop_reason().is_none());
    }

    #[test]
    fn every_truncation_stops_cleanly_at_the_last_whole_entry() {
        let first = entry(EntryKind::Record, 1, b"first");
        let mut buf = first.clone();
        buf.extend(entry(EntryKind::Record, 1, b"second"));
        for cut in first.len()..buf.len() {
            let mut it = EntryIter::new(&buf[..cut], 1 << 20);
            assert_eq!(it.by_ref().count(), 1);
            assert_eq!(it.position(), first.len());
            assert_eq!(it.stop_reason().is_some(), cut > first.len());
        }
    }

    #[test]
    fn bodies_round_trip() {
        let mut b = Vec::new();
        body::encode_join(&mut b, 5, 77);
        assert_eq!(body::decode_join(&b), Some((5, 77)));
        assert_eq!(body::decode_join(&[0; 17]), None);
        let mut b = Vec::new();
        body::encode_leave(&mut b, 5);
        assert_eq!(body::decode_leave(&b), Some(5));
        let mut b = Vec::new();
        body::encode_cursors(&mut b, &[(5, 7), (6, 8)]);
        b.push(1); // a partial row is ignored
        assert_eq!(
            body::decode_cursors(&b).collect::<Vec<_>>(),
            vec![(5, 7), (6, 8)]
        );
        let r = crate::retention::Retention {
            by_cursor: true,
            max_age_ms: 5,
            max_bytes: 9,
        };
        let mut b = Vec::new();
        body::encode_set_retention(&mut b, &r);
        assert_eq!(body::decode_set_retention(&b), Some(r));
        let mut b = Vec::new();
        body::encode_sync_mark(&mut b, 4096, 0xfeed);
        assert_eq!(b.len(), SYNC_MARK_BODY_BYTES);
        assert_eq!(body::decode_sync_mark(&b), Some((4096, 0xfeed)));
        b[15] = 1; // reserved bytes must be zero
        assert_eq!(body::decode_sync_mark(&b), None);
        assert_eq!(body::decode_sync_mark(&b[..8]), None);
    }

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = encode_header(77, 0xfeed);
        assert_eq!(decode_header_of(&h).map(|h| h.seq), Ok(77));
        let mut d = h;
        d[17] ^= 1;
        assert!(decode_header_of(&d).is_err());
    }
}
