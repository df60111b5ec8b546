//! Cold files (`log/<seq>.tmc`, storage v2 design 5.3 and 18): where live
//! records of small groups go when their journal file leaves the replay
//! window (evacuation) and where compaction copies the live extents of
//! mostly dead cold files.
//!
//! Format (little-endian):
//! - file header, 32 bytes: `{ magic: [u8; 8] = "TDMKCOLD" | version: u16 = 1
//!   | header_len: u16 = 32 | reserved: u32 = 0 | seq: u64 | reserved: u32 = 0
//!   | crc32: u32 (of bytes 0..28) }`;
//! - then extents back to back, each a 32-byte header `{ crc32: u32 (of
//!   header bytes 4..32) | bytes: u32 | group_id: u64 | first_msg_id: u64 |
//!   count: u32 | reserved: u32 = 0 }` followed by `bytes` bytes: `count`
//!   whole records of group `group_id` with ids `first_msg_id..` (the
//!   record layout of record.rs, each with its own CRC).
//!
//! A cold file is written only by [`ColdWriter`] (the maintenance worker),
//! append-only, never truncated, never appended to after a restart (a writer
//! always starts a new file), and rolls at `cold_file_bytes`. The engine
//! finds records through extents (extents.rs), whose `offset` is the first
//! record, just after its extent header; the headers make the file
//! self-describing so compaction and a recovery tool can walk it without
//! the index ([`ColdScanner`]).
//!
//! Torn versus damaged: only bytes that a checkpoint made durable are
//! promised. The scanner is told `durable_len` (what a manifest recorded;
//! 0 when nothing is known): an extent that starts at or after it and does
//! not check out is a torn end (the scan stops cleanly there); one that
//! starts before it is damage ([`ColdError`]). A record that fails inside an
//! extent whose header checks out damages that extent only (its group): the
//! header's `bytes` still leads to the next extent.
//!
//! Wired into the engine by step S6 (evacuation and compaction); until then
//! only tests and the `cold_scan` fuzz target use it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs, VfsFile};
use crate::logs::extents::{Extent, FileId, Piece, EXTENT_COUNT_MAX};
use crate::logs::record::{self, RECORD_BYTES_STORED_MAX, RECORD_HEADER_BYTES};

pub const COLD_HEADER_BYTES: usize = 32;
pub const COLD_MAGIC: [u8; 8] = *b"TDMKCOLD";
pub const COLD_VERSION: u16 = 1;
pub const EXTENT_HEADER_BYTES: usize = 32;
const COLD_SUFFIX: &str = ".tmc";

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// `00000000000000000007.tmc` for seq 7: names sort in sequence order.
pub fn file_name(seq: u64) -> String {
    format!("{seq:020}{COLD_SUFFIX}")
}

/// The seq a cold file name encodes, or `None` for other files.
pub fn parse_file_name(path: &Path) -> Option<u64> {
    let digits = path.file_name()?.to_str()?.strip_suffix(COLD_SUFFIX)?;
    (digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Why bytes of a cold file are not what the format allows, where a crash
/// cannot explain it. Offsets are file offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ColdError {
    /// The file header: `field` names the field that is wrong.
    FileHeader { field: &'static str, reason: String },
    /// The extent header at `offset`.
    ExtentHeader {
        offset: u64,
        field: &'static str,
        reason: String,
    },
    /// The file ends at `file_len` inside the extent at `offset`, which
    /// lies below the durable length: durable bytes are gone.
    Truncated {
        offset: u64,
        need: u64,
        file_len: u64,
    },
    /// A record at `offset` of the extent of `group` is not the one its
    /// header announces (bad record, wrong id, or records that do not fill
    /// exactly `bytes`).
    Record {
        offset: u64,
        group: u64,
        reason: String,
    },
}

impl std::fmt::Display for ColdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ColdError::FileHeader { field, reason } => {
                write!(f, "offset 0: cold file header field {field}: {reason}")
            }
            ColdError::ExtentHeader {
                offset,
                field,
                reason,
            } => write!(f, "offset {offset}: extent header field {field}: {reason}"),
            ColdError::Truncated {
                offset,
                need,
                file_len,
            } => write!(
                f,
                "offset {offset}: the extent needs {need} bytes but the file ends at {file_len} \
                 (below its durable length)"
            ),
            ColdError::Record {
                offset,
                group,
                reason,
            } => write!(f, "offset {offset}: extent of group {group}: {reason}"),
        }
    }
}

impl ColdError {
    /// The engine error for this damage in the file at `path`.
    #[cfg(test)]
    pub fn into_error(self, path: &Path) -> Error {
        let (offset, group) = match &self {
            ColdError::FileHeader { .. } => (0, None),
            ColdError::ExtentHeader { offset, .. } | ColdError::Truncated { offset, .. } => {
                (*offset, None)
            }
            ColdError::Record { offset, group, .. } => (*offset, Some(*group)),
        };
        Error::Corrupt {
            path: path.to_owned(),
            group,
            offset,
            reason: self.to_string(),
        }
    }
}

/// The decoded file header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdHeader {
    pub seq: u64,
}

impl ColdHeader {
    // Format: { magic "TDMKCOLD" | version u16 | header_len u16 | reserved u32 | seq u64 | reserved u32 | crc32 u32 }
    pub fn encode(&self) -> [u8; COLD_HEADER_BYTES] {
        let mut b = [0u8; COLD_HEADER_BYTES];
        b[0..8].copy_from_slice(&COLD_MAGIC);
        b[8..10].copy_from_slice(&COLD_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(COLD_HEADER_BYTES as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        let crc = crc32fast::hash(&b[0..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks a file header (CRC first, then each field).
    pub fn decode(b: &[u8]) -> Result<ColdHeader, ColdError> {
        let bad = |field, reason: String| ColdError::FileHeader { field, reason };
        if b.len() < COLD_HEADER_BYTES {
            return Err(bad(
                "length",
                format!("file of {} bytes is shorter than the header", b.len()),
            ));
        }
        let (stored, computed) = (u32_at(b, 28), crc32fast::hash(&b[0..28]));
        if stored != computed {
            return Err(bad(
                "crc32",
                format!("stored {stored:#010x}, computed {computed:#010x}"),
            ));
        }
        if b[0..8] != COLD_MAGIC {
            return Err(bad("magic", format!("{:02x?}", &b[0..8])));
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != COLD_VERSION {
            return Err(bad("version", format!("{version}, this build reads 1")));
        }
        let header_len = u16::from_le_bytes([b[10], b[11]]);
        if header_len as usize != COLD_HEADER_BYTES {
            return Err(bad("header_len", format!("{header_len}, must be 32")));
        }
        if b[12..16] != [0; 4] || b[24..28] != [0; 4] {
            return Err(bad("reserved", "not zero".into()));
        }
        Ok(ColdHeader { seq: u64_at(b, 16) })
    }
}

/// The decoded header of one extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentHeader {
    pub bytes: u32,
    pub group_id: u64,
    pub first_msg_id: u64,
    pub count: u32,
}

impl ExtentHeader {
    // Format: { crc32 u32 | bytes u32 | group_id u64 | first_msg_id u64 | count u32 | reserved u32 }
    pub fn encode(&self) -> [u8; EXTENT_HEADER_BYTES] {
        let mut b = [0u8; EXTENT_HEADER_BYTES];
        b[4..8].copy_from_slice(&self.bytes.to_le_bytes());
        b[8..16].copy_from_slice(&self.group_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.first_msg_id.to_le_bytes());
        b[24..28].copy_from_slice(&self.count.to_le_bytes());
        let crc = crc32fast::hash(&b[4..32]);
        b[0..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and checks the extent header at file offset `offset`.
    pub fn decode(b: &[u8], offset: u64) -> Result<ExtentHeader, ColdError> {
        let bad = |field, reason: String| ColdError::ExtentHeader {
            offset,
            field,
            reason,
        };
        let b = &b[..EXTENT_HEADER_BYTES];
        let (stored, computed) = (u32_at(b, 0), crc32fast::hash(&b[4..32]));
        if stored != computed {
            return Err(bad(
                "crc32",
                format!("stored {stored:#010x}, computed {computed:#010x}"),
            ));
        }
        if b[28..32] != [0; 4] {
            return Err(bad("reserved", "not zero".into()));
        }
        let h = ExtentHeader {
            bytes: u32_at(b, 4),
            group_id: u64_at(b, 8),
            first_msg_id: u64_at(b, 16),
            count: u32_at(b, 24),
        };
        if !(1..=EXTENT_COUNT_MAX).contains(&h.count) {
            return Err(bad("count", format!("{} records", h.count)));
        }
        if u64::from(h.bytes) < u64::from(h.count) * RECORD_HEADER_BYTES as u64 {
            return Err(bad(
                "bytes",
                format!("{} bytes cannot hold {} records", h.bytes, h.count),
            ));
        }
        if h.first_msg_id == 0 || h.first_msg_id.checked_add(u64::from(h.count)).is_none() {
            return Err(bad("first_msg_id", format!("{}", h.first_msg_id)));
        }
        Ok(h)
    }
}

/// Checks that `records` are `count` whole, valid records (CRCs included
/// when `verify_crc`) with ids `first_msg_id..`, filling `records` exactly.
/// On failure: the offset within `records` and why.
fn check_records(
    records: &[u8],
    first_msg_id: u64,
    count: u32,
    verify_crc: bool,
) -> Result<(), (usize, String)> {
    let mut pos = 0;
    for i in 0..u64::from(count) {
        let rest = &records[pos..];
        let h = if verify_crc {
            record::decode_verified(rest, RECORD_BYTES_STORED_MAX)
        } else {
            record::decode_header(rest, RECORD_BYTES_STORED_MAX)
        }
        .map_err(|e| (pos, e.to_string()))?;
        if h.msg_id != first_msg_id + i {
            return Err((
                pos,
                format!(
                    "msg_id {} where {} was expected",
                    h.msg_id,
                    first_msg_id + i
                ),
            ));
        }
        pos += h.record_len as usize;
    }
    if pos != records.len() {
        return Err((
            pos,
            format!(
                "{count} records end {} bytes before the extent's end",
                records.len() - pos
            ),
        ));
    }
    Ok(())
}

/// Proves that the extent `piece` of `group`, read through `map` (the
/// whole cold file, at least up to the extent's end), is that group's:
/// the file header names the file's own seq, and the extent header just
/// before the records (they start 32 bytes after it, module docs) checks
/// out and names `group`, the piece's first id, count and bytes. A record
/// carries no group id, so this is what keeps a reader from serving
/// another group's valid records at the place a list names (a file
/// restored from elsewhere, a number given twice). Costs two header CRCs
/// (60 bytes) per extent read. `Err` says what does not match, with the
/// file offset.
pub fn check_owner(map: &[u8], group: u64, piece: &Piece) -> Result<(), String> {
    let ext = &piece.ext;
    let file = ColdHeader::decode(map).map_err(|e| e.to_string())?;
    if file.seq != ext.file().seq() {
        return Err(format!(
            "offset 16: the file's header names cold file {}, not {}",
            file.seq,
            ext.file().seq()
        ));
    }
    let at = u64::from(ext.offset())
        .checked_sub(EXTENT_HEADER_BYTES as u64)
        .filter(|&at| at >= COLD_HEADER_BYTES as u64)
        .ok_or_else(|| {
            format!(
                "offset {}: an extent cannot start there (no extent header before it)",
                ext.offset()
            )
        })?;
    // Invariant: the caller mapped at least up to the extent's end, past `at + 32`.
    let h = ExtentHeader::decode(&map[at as usize..], at).map_err(|e| e.to_string())?;
    let (want, found) = (
        (group, piece.first_id, ext.count(), ext.bytes()),
        (h.group_id, h.first_msg_id, h.count, h.bytes),
    );
    if want != found {
        return Err(format!(
            "offset {at}: the extent there holds {} records of group {} from msg_id {} in {} \
             bytes, where {} records of group {group} from msg_id {} in {} bytes were expected",
            h.count,
            h.group_id,
            h.first_msg_id,
            h.bytes,
            ext.count(),
            piece.first_id,
            ext.bytes()
        ));
    }
    Ok(())
}

/// Writes cold files: one per `cold_file_bytes`, each created new (never
/// one left by an earlier run), extents appended with one `pwrite` each.
/// The caller syncs the file being written ([`ColdWriter::sync`]) before
/// it points a group at an extent; a roll syncs the file it leaves, so
/// that sync covers every extent appended before it.
pub struct ColdWriter {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    cold_file_bytes: u64,
    next_seq: u64,
    current: Option<OpenCold>,
}

struct OpenCold {
    seq: u64,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    len: u64,
}

/// Where [`ColdWriter::append`] put an extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdAppend {
    /// The new extent: the records, in the cold file, verified.
    pub extent: Extent,
    /// `(seq, len)` of the file this append sealed by rolling to a new one.
    pub sealed: Option<(u64, u64)>,
}

impl ColdWriter {
    /// A writer whose first file will be `log/<next_seq>.tmc` in `dir`.
    /// `cold_file_bytes` is at most `u32::MAX` (config validation), so
    /// record offsets fit an extent.
    pub fn new(vfs: Arc<dyn Vfs>, dir: &Path, next_seq: u64, cold_file_bytes: u64) -> ColdWriter {
        ColdWriter {
            vfs,
            dir: dir.to_owned(),
            cold_file_bytes: cold_file_bytes.min(u64::from(u32::MAX)),
            next_seq,
            current: None,
        }
    }

    /// `(seq, len)` of the file being written, if any.
    pub fn current(&self) -> Option<(u64, u64)> {
        self.current.as_ref().map(|c| (c.seq, c.len))
    }

    /// Appends one extent: `records` are `count` whole records of `group_id`
    /// from `first_msg_id` on, as copied out of a journal or cold file. They
    /// are checked here, CRCs included (this is where copied bytes are
    /// trusted again, so the new extent is marked verified); a bad one is
    /// `GroupDamaged` and nothing is written. The file rolls first if the
    /// extent would take it past `cold_file_bytes` (an extent larger than
    /// that gets a file of its own).
    ///
    /// A failed write abandons the file: the next append starts a new one,
    /// and the abandoned file's bytes past what was written before are dead
    /// (nothing refers to them; a scan with its durable length ignores them).
    pub fn append(
        &mut self,
        group_id: u64,
        first_msg_id: u64,
        count: u32,
        records: &[u8],
    ) -> Result<ColdAppend> {
        let damaged = |reason: String| Error::GroupDamaged {
            group: group_id,
            reason,
        };
        let bytes = u32::try_from(records.len())
            .ok()
            .filter(|b| {
                (COLD_HEADER_BYTES + EXTENT_HEADER_BYTES) as u64 + u64::from(*b)
                    <= u64::from(u32::MAX)
            })
            .ok_or_else(|| damaged(format!("an extent of {} bytes", records.len())))?;
        let header = ExtentHeader {
            bytes,
            group_id,
            first_msg_id,
            count,
        };
        // The header's own checks (count, bytes per record, ids) first.
        ExtentHeader::decode(&header.encode(), 0)
            .and_then(|_| {
                check_records(records, first_msg_id, count, true).map_err(|(at, why)| {
                    ColdError::Record {
                        offset: at as u64,
                        group: group_id,
                        reason: why,
                    }
                })
            })
            .map_err(|e| damaged(format!("records copied for a cold extent: {e}")))?;
        let need = (EXTENT_HEADER_BYTES + records.len()) as u64;
        let mut sealed = None;
        if let Some(c) = &self.current {
            if c.len > COLD_HEADER_BYTES as u64 && c.len + need > self.cold_file_bytes {
                // The file left is synced now: the caller's sync covers
                // only the file being written, and its install points
                // groups at the extents appended here before the roll.
                c.file
                    .sync_data()
                    .map_err(|e| Error::io(format!("fdatasync {}", c.path.display()), e))?;
                sealed = Some((c.seq, c.len));
                self.current = None;
            }
        }
        if self.current.is_none() {
            self.current = Some(self.create()?);
        }
        // Invariant: set just above.
        let cur = self
            .current
            .as_mut()
            .expect("invariant: a current cold file");
        let mut buf = Vec::with_capacity(need as usize);
        buf.extend_from_slice(&header.encode());
        buf.extend_from_slice(records);
        if let Err(e) = cur.file.write_all_at(&buf, cur.len) {
            let err = Error::write(format!("write {}", cur.path.display()), e);
            self.current = None;
            return Err(err);
        }
        let offset = cur.len + EXTENT_HEADER_BYTES as u64;
        cur.len += need;
        // Invariant: cur.len <= max(cold_file_bytes, one extent) <= u32::MAX (checked above).
        let offset = u32::try_from(offset).expect("invariant: cold offsets fit u32");
        let file = FileId::cold(cur.seq).ok_or_else(|| Error::Corrupt {
            path: cur.path.clone(),
            group: None,
            offset: 0,
            reason: "cold file sequence number past 2^31".into(),
        })?;
        // Invariant: count and bytes passed the header checks above.
        let extent = Extent::new(file, offset, bytes, count)
            .expect("invariant: checked extent")
            .verified();
        Ok(ColdAppend { extent, sealed })
    }

    /// Creates the next file, header written (not synced: K3 syncs it
    /// before a manifest names it, and the directory entry with it).
    fn create(&mut self) -> Result<OpenCold> {
        let seq = self.next_seq;
        let path = self.dir.join(file_name(seq));
        let file = self
            .vfs
            .open(&path, OpenMode::CreateNew)
            .map_err(|e| Error::write(format!("create {}", path.display()), e))?;
        self.next_seq += 1;
        file.write_all_at(&ColdHeader { seq }.encode(), 0)
            .map_err(|e| Error::write(format!("write {}", path.display()), e))?;
        Ok(OpenCold {
            seq,
            path,
            file,
            len: COLD_HEADER_BYTES as u64,
        })
    }

    /// Ends the current file (after a [`ColdWriter::sync`]): the next
    /// append starts a new one. Returns `(seq, len)` of the file ended, so
    /// the caller accounts it sealed; a sealed file can be compacted, which
    /// is how an erasure gets a recalled payload out of the file being
    /// written (`rewrite.rs`).
    pub fn seal(&mut self) -> Option<(u64, u64)> {
        self.current.take().map(|c| (c.seq, c.len))
    }

    /// fdatasync of the current file; returns `(seq, len)` now durable.
    pub fn sync(&self) -> Result<Option<(u64, u64)>> {
        let Some(c) = &self.current else {
            return Ok(None);
        };
        c.file
            .sync_data()
            .map_err(|e| Error::io(format!("fdatasync {}", c.path.display()), e))?;
        Ok(Some((c.seq, c.len)))
    }
}

/// Positional reads of a cold file's bytes: the file itself (`pread`, so a
/// cut file is an error, not SIGBUS) or, for tests and fuzzing, a slice.
pub trait ReadAt {
    fn size(&self) -> io::Result<u64>;
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let at = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let src = at
            .checked_add(buf.len())
            .and_then(|end| self.get(at..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl ReadAt for dyn VfsFile {
    fn size(&self) -> io::Result<u64> {
        self.file_len()
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        VfsFile::read_exact_at(self, buf, offset)
    }
}

/// One extent as a scan found it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScannedExtent {
    /// File offset of its header; its records start 32 bytes later.
    pub offset: u64,
    pub header: ExtentHeader,
    pub records: Vec<u8>,
    /// Set when its records are not what the header announces: that group
    /// is damaged; the scan goes on with the next extent.
    pub damage: Option<ColdError>,
}

/// How a scan ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// At the end of the file, after a whole extent.
    Clean,
    /// At `offset`, at or past the durable length, where the bytes stop
    /// being a whole valid extent: the torn end of unsynced writes.
    Torn { offset: u64, reason: String },
}

/// Walks a cold file's extents structurally: header CRCs and fields,
/// records of each extent (lengths and ids; CRCs when `verify_crc`). Reads
/// a header, then one extent's records at a time, never more than the file
/// holds (a length field cannot make it allocate more).
pub struct ColdScanner<'a, R: ReadAt + ?Sized> {
    src: &'a R,
    file_len: u64,
    durable_len: u64,
    verify_crc: bool,
    header: ColdHeader,
    pos: u64,
    end: Option<ScanEnd>,
}

impl<'a, R: ReadAt + ?Sized> ColdScanner<'a, R> {
    /// Reads and checks the file header. A file whose header does not check
    /// out is refused whatever `durable_len` says: a cold file's header is
    /// written before any extent, and a file left without one by a crash is
    /// an orphan no manifest names, which the sweep removes unread.
    pub fn new(src: &'a R, durable_len: u64, verify_crc: bool) -> Result<Self, ColdError> {
        let io_err = |e: io::Error| ColdError::FileHeader {
            field: "length",
            reason: e.to_string(),
        };
        let file_len = src.size().map_err(io_err)?;
        let mut head = [0u8; COLD_HEADER_BYTES];
        if file_len < COLD_HEADER_BYTES as u64 {
            return Err(ColdError::FileHeader {
                field: "length",
                reason: format!("file of {file_len} bytes is shorter than the header"),
            });
        }
        src.read_exact_at(&mut head, 0).map_err(io_err)?;
        let header = ColdHeader::decode(&head)?;
        Ok(ColdScanner {
            src,
            file_len,
            durable_len,
            verify_crc,
            header,
            pos: COLD_HEADER_BYTES as u64,
            end: None,
        })
    }

    pub fn header(&self) -> ColdHeader {
        self.header
    }

    /// End of the last whole extent returned (where a torn end starts).
    #[cfg(any(test, feature = "testing"))]
    pub fn valid_len(&self) -> u64 {
        self.pos
    }

    /// How the scan ended, once [`Self::next_extent`] returned `None`.
    #[cfg(any(test, feature = "testing"))]
    pub fn end(&self) -> Option<&ScanEnd> {
        self.end.as_ref()
    }

    /// Stops at a torn end past the durable length, or fails below it.
    fn stop(
        &mut self,
        damage: ColdError,
        reason: String,
    ) -> Result<Option<ScannedExtent>, ColdError> {
        if self.pos >= self.durable_len {
            self.end = Some(ScanEnd::Torn {
                offset: self.pos,
                reason,
            });
            Ok(None)
        } else {
            Err(damage)
        }
    }

    /// The next extent, `None` at the end (see [`Self::end`]), or the damage
    /// that stops the walk. I/O errors are reported as the damage they look
    /// like at that offset (a short read: the bytes are not there).
    pub fn next_extent(&mut self) -> Result<Option<ScannedExtent>, ColdError> {
        if self.end.is_some() {
            return Ok(None);
        }
        let at = self.pos;
        let left = self.file_len - at;
        let truncated = |need: u64| ColdError::Truncated {
            offset: at,
            need,
            file_len: self.file_len,
        };
        if left == 0 {
            if at < self.durable_len {
                // The file ends between extents, before its durable length.
                return Err(truncated(self.durable_len - at));
            }
            self.end = Some(ScanEnd::Clean);
            return Ok(None);
        }
        if left < EXTENT_HEADER_BYTES as u64 {
            let e = truncated(EXTENT_HEADER_BYTES as u64);
            return self.stop(e, format!("{left} bytes, less than an extent header"));
        }
        let mut hb = [0u8; EXTENT_HEADER_BYTES];
        if let Err(e) = self.src.read_exact_at(&mut hb, at) {
            let why = format!("reading the extent header: {e}");
            return self.stop(truncated(EXTENT_HEADER_BYTES as u64), why);
        }
        let header = match ExtentHeader::decode(&hb, at) {
            Ok(h) => h,
            Err(e) => {
                let why = e.to_string();
                return self.stop(e, why);
            }
        };
        let need = EXTENT_HEADER_BYTES as u64 + u64::from(header.bytes);
        if need > left {
            return self.stop(
                truncated(need),
                format!("extent of {need} bytes, {left} left"),
            );
        }
        // Invariant: bytes <= left <= file_len, which the file really holds.
        let mut records = vec![0u8; header.bytes as usize];
        let records_at = at + EXTENT_HEADER_BYTES as u64;
        if let Err(e) = self.src.read_exact_at(&mut records, records_at) {
            let why = format!("reading the records: {e}");
            return self.stop(truncated(need), why);
        }
        let damage = check_records(&records, header.first_msg_id, header.count, self.verify_crc)
            .err()
            .map(|(pos, reason)| ColdError::Record {
                offset: records_at + pos as u64,
                group: header.group_id,
                reason,
            });
        if let Some(d) = &damage {
            // Past the durable length a header may have reached the disk
            // without its records: torn, not damage.
            if at >= self.durable_len {
                let why = d.to_string();
                return self.stop(d.clone(), why);
            }
        }
        self.pos = at + need;
        Ok(Some(ScannedExtent {
            offset: at,
            header,
            records,
            damage,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::{FaultyVfs, OsVfs};
    use crate::logs::record::NewRecord;
    use std::sync::atomic::Ordering;

    fn records(first: u64, n: u64, payload: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for id in first..first + n {
            record::encode_into(
                &NewRecord {
                    msg_id: id,
                    timestamp_ms: id,
                    sender_id: 1,
                    client_msg_id: id,
                    payload: &vec![7; payload],
                },
                &mut out,
            );
        }
        out
    }

    /// A cold file image: header, then extents `(group, first, n)`.
    fn image(extents: &[(u64, u64, u64)]) -> Vec<u8> {
        let mut b = ColdHeader { seq: 3 }.encode().to_vec();
        for &(g, first, n) in extents {
            let r = records(first, n, 10);
            let h = ExtentHeader {
                bytes: r.len() as u32,
                group_id: g,
                first_msg_id: first,
                count: n as u32,
            };
            b.extend_from_slice(&h.encode());
            b.extend_from_slice(&r);
        }
        b
    }

    fn scan_all(b: &[u8], durable: u64) -> Result<(Vec<ScannedExtent>, ScanEnd), ColdError> {
        let mut s = ColdScanner::new(b, durable, true)?;
        let mut out = Vec::new();
        while let Some(e) = s.next_extent()? {
            out.push(e);
        }
        Ok((out, s.end().cloned().unwrap()))
    }

    #[test]
    fn file_header_round_trips_and_every_field_is_checked() {
        let h = ColdHeader { seq: 77 };
        let b = h.encode();
        assert_eq!(ColdHeader::decode(&b), Ok(h));
        // Each byte flipped: the CRC catches it.
        for i in 0..COLD_HEADER_BYTES {
            let mut d = b;
            d[i] ^= 0x04;
            assert!(ColdHeader::decode(&d).is_err(), "byte {i}");
        }
        // With the CRC recomputed, each field's own check names it.
        let fixed = |off: usize, val: &[u8]| {
            let mut d = b;
            d[off..off + val.len()].copy_from_slice(val);
            let crc = crc32fast::hash(&d[0..28]);
            d[28..32].copy_from_slice(&crc.to_le_bytes());
            match ColdHeader::decode(&d) {
                Err(ColdError::FileHeader { field, .. }) => field,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(fixed(0, b"TDMKCOLX"), "magic");
        assert_eq!(fixed(8, &2u16.to_le_bytes()), "version");
        assert_eq!(fixed(10, &64u16.to_le_bytes()), "header_len");
        assert_eq!(fixed(12, &[1]), "reserved");
        assert_eq!(fixed(24, &[1]), "reserved");
        assert!(matches!(
            ColdHeader::decode(&b[..31]),
            Err(ColdError::FileHeader {
                field: "length",
                ..
            })
        ));
    }

    #[test]
    fn file_names_sort_and_parse_back() {
        assert_eq!(file_name(7), "00000000000000000007.tmc");
        assert_eq!(
            parse_file_name(Path::new("/d/log/00000000000000000007.tmc")),
            Some(7)
        );
        assert_eq!(
            parse_file_name(Path::new("/d/log/00000000000000000007.tmj")),
            None
        );
        assert_eq!(parse_file_name(Path::new("/d/log/7.tmc")), None);
        assert_eq!(
            parse_file_name(Path::new("/d/log/+0000000000000000007.tmc")),
            None
        );
    }

    #[test]
    fn every_extent_header_field_is_checked_inside_the_durable_length() {
        let b = image(&[(5, 10, 3), (6, 1, 2)]);
        let durable = b.len() as u64;
        let (ok, end) = scan_all(&b, durable).unwrap();
        assert_eq!(end, ScanEnd::Clean);
        assert_eq!(ok.len(), 2);
        assert_eq!(
            (
                ok[0].header.group_id,
                ok[0].header.first_msg_id,
                ok[0].header.count
            ),
            (5, 10, 3)
        );
        assert_eq!(
            ok[1].offset,
            ok[0].offset + 32 + u64::from(ok[0].header.bytes)
        );
        let second = ok[1].offset as usize;
        // A flipped byte anywhere in the second header: the CRC names it.
        for i in 0..EXTENT_HEADER_BYTES {
            let mut d = b.clone();
            d[second + i] ^= 0x20;
            let err = scan_all(&d, durable).unwrap_err();
            assert!(
                matches!(err, ColdError::ExtentHeader { field: "crc32", offset, .. } if offset == second as u64),
                "byte {i}: {err:?}"
            );
        }
        // With the CRC recomputed, the field's own check (or the records
        // that no longer match it) names what is wrong.
        let fixed = |off: usize, val: &[u8]| {
            let mut d = b.clone();
            d[second + off..second + off + val.len()].copy_from_slice(val);
            let crc = crc32fast::hash(&d[second + 4..second + 32]);
            d[second..second + 4].copy_from_slice(&crc.to_le_bytes());
            d
        };
        let scan = |d: Vec<u8>| scan_all(&d, durable);
        let problem = |d: Vec<u8>| first_problem(&d, durable);
        let bytes = ok[1].header.bytes;
        let e = scan(fixed(4, &(bytes + 1).to_le_bytes()));
        assert!(matches!(e, Err(ColdError::Truncated { .. })), "{e:?}");
        let e = scan(fixed(4, &87u32.to_le_bytes()));
        assert!(
            matches!(e, Err(ColdError::ExtentHeader { field: "bytes", .. })),
            "{e:?}"
        );
        let e = problem(fixed(4, &(bytes - 10).to_le_bytes()));
        assert!(e.contains("group 6: truncated record"), "{e}");
        let e = problem(fixed(16, &2u64.to_le_bytes()));
        assert!(e.contains("msg_id 1 where 2 was expected"), "{e}");
        for id in [0, u64::MAX] {
            let e = scan(fixed(16, &id.to_le_bytes()));
            assert!(
                matches!(
                    e,
                    Err(ColdError::ExtentHeader {
                        field: "first_msg_id",
                        ..
                    })
                ),
                "{e:?}"
            );
        }
        let e = problem(fixed(24, &1u32.to_le_bytes()));
        assert!(e.contains("1 records end 54 bytes before"), "{e}");
        let e = scan(fixed(24, &0u32.to_le_bytes()));
        assert!(
            matches!(e, Err(ColdError::ExtentHeader { field: "count", .. })),
            "{e:?}"
        );
        let e = scan(fixed(28, &[1]));
        assert!(
            matches!(
                e,
                Err(ColdError::ExtentHeader {
                    field: "reserved",
                    ..
                })
            ),
            "{e:?}"
        );
        // group_id is not checkable from the file alone: the index says
        // which group an extent belongs to; a scan reports what it read.
        let (other, _) = scan(fixed(8, &9u64.to_le_bytes())).unwrap();
        assert_eq!(other[1].header.group_id, 9);
    }

    /// The first damage a scan meets, as text: an extent's (the scan goes
    /// on after it) or the error that stops it.
    fn first_problem(d: &[u8], durable: u64) -> String {
        let mut s = ColdScanner::new(d, durable, true).unwrap();
        loop {
            match s.next_extent() {
                Ok(Some(e)) => {
                    if let Some(x) = e.damage {
                        return x.to_string();
                    }
                }
                Ok(None) => return "none".into(),
                Err(e) => return e.to_string(),
            }
        }
    }

    #[test]
    fn a_bad_record_damages_its_extent_only() {
        let b = image(&[(5, 1, 2), (6, 1, 2), (7, 4, 1)]);
        let (ok, _) = scan_all(&b, b.len() as u64).unwrap();
        let mut d = b.clone();
        let at = ok[1].offset as usize + 32 + 60; // a payload byte of group 6's second record
        d[at] ^= 1;
        let (got, end) = scan_all(&d, d.len() as u64).unwrap();
        assert_eq!(end, ScanEnd::Clean);
        assert_eq!(got.len(), 3);
        assert!(got[0].damage.is_none() && got[2].damage.is_none());
        let Some(ColdError::Record {
            group: 6,
            offset,
            reason,
        }) = &got[1].damage
        else {
            panic!("{:?}", got[1].damage)
        };
        assert_eq!(
            *offset,
            ok[1].offset + 32 + 54,
            "the second record's offset"
        );
        assert!(reason.contains("checksum"), "{reason}");
        // Without CRC checks the structure alone is fine.
        let mut s = ColdScanner::new(&d[..], d.len() as u64, false).unwrap();
        while let Some(e) = s.next_extent().unwrap() {
            assert!(e.damage.is_none());
        }
        let err = got[1]
            .damage
            .clone()
            .unwrap()
            .into_error(Path::new("log/x.tmc"));
        assert!(
            matches!(err, Error::Corrupt { group: Some(6), .. }),
            "{err}"
        );
    }

    #[test]
    fn a_torn_tail_past_the_durable_length_ends_the_scan_cleanly() {
        let b = image(&[(5, 1, 2), (6, 1, 3), (7, 1, 1)]);
        let (all, _) = scan_all(&b, 0).unwrap();
        let last = all[2].offset;
        for cut in COLD_HEADER_BYTES..b.len() {
            let short = &b[..cut];
            // Durable through the second extent: a cut inside the third is torn.
            match scan_all(short, last) {
                Ok((got, end)) => {
                    assert!(
                        cut as u64 >= last,
                        "cut {cut} inside durable bytes accepted"
                    );
                    assert_eq!(got.len(), 2, "cut {cut}");
                    assert_eq!(got[..], all[..2]);
                    let want = if cut as u64 == last {
                        ScanEnd::Clean
                    } else {
                        ScanEnd::Torn {
                            offset: last,
                            reason: String::new(),
                        }
                    };
                    let end = match end {
                        ScanEnd::Torn { offset, .. } => ScanEnd::Torn {
                            offset,
                            reason: String::new(),
                        },
                        e => e,
                    };
                    assert_eq!(end, want, "cut {cut}");
                }
                Err(e) => {
                    assert!((cut as u64) < last, "cut {cut}: {e:?}");
                    assert!(matches!(e, ColdError::Truncated { .. }), "{e:?}");
                }
            }
        }
        // Zeros where the third extent should be (a hole, or a header that
        // reached the disk without its records): torn past durable...
        let mut z = b.clone();
        z[last as usize + 32..].fill(0);
        let (got, end) = scan_all(&z, last).unwrap();
        assert_eq!(got.len(), 2);
        assert!(matches!(end, ScanEnd::Torn { .. }));
        // ...damage below it.
        let (got, _) = scan_all(&z, b.len() as u64).unwrap();
        assert!(
            matches!(got[2].damage, Some(ColdError::Record { group: 7, .. })),
            "{:?}",
            got[2]
        );
        z[last as usize..].fill(0);
        assert!(matches!(
            scan_all(&z, b.len() as u64),
            Err(ColdError::ExtentHeader { field: "crc32", .. })
        ));
        assert!(matches!(
            scan_all(&b[..10], 0),
            Err(ColdError::FileHeader { .. })
        ));
    }

    /// The caller syncs the file being written ([`ColdWriter::sync`]) and
    /// then points groups at every extent it appended, also at those in a
    /// file the writer rolled away from meanwhile: a roll syncs the file it
    /// leaves, so a power cut keeps every extent appended before the last
    /// sync.
    #[test]
    fn a_roll_makes_the_file_it_leaves_durable() {
        use crate::io::power_cut::{Cut, PowerCutVfs};
        for seed in 0..8 {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("journal");
            std::fs::create_dir_all(&dir).unwrap();
            let vfs = PowerCutVfs::new(root.path());
            let control = vfs.control.clone();
            let vfs: Arc<dyn Vfs> = Arc::new(vfs);
            let mut w = ColdWriter::new(vfs.clone(), &dir, 4, 32 + 2 * 140);
            let mut got = Vec::new();
            for g in 0..3u64 {
                let r = records(10 * g + 1, 2, 10);
                got.push((g, r.clone(), w.append(g, 10 * g + 1, 2, &r).unwrap()));
            }
            assert_eq!(got[2].2.sealed, Some((4, 32 + 2 * 140)), "the third rolled");
            w.sync().unwrap();
            vfs.sync_dir(&dir).unwrap();
            control.cut(Cut::Seeded(seed)).unwrap();
            for (g, r, a) in &got {
                let e = a.extent;
                let bytes = std::fs::read(dir.join(file_name(e.file().seq()))).unwrap();
                assert_eq!(
                    bytes.get(e.offset() as usize..e.end() as usize),
                    Some(&r[..]),
                    "seed {seed}: group {g}'s extent in file {}",
                    e.file().seq()
                );
            }
        }
    }

    #[test]
    fn the_writer_rolls_files_and_its_extents_point_at_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn Vfs> = Arc::new(OsVfs);
        // Room for two extents of 2 x 54-byte records (32 + 108 each) per file.
        let mut w = ColdWriter::new(vfs.clone(), dir.path(), 4, 32 + 2 * 140);
        let mut got = Vec::new();
        for g in 0..5u64 {
            let r = records(10 * g + 1, 2, 10);
            got.push((g, r.clone(), w.append(g, 10 * g + 1, 2, &r).unwrap()));
        }
        assert_eq!(got[2].2.sealed, Some((4, 32 + 2 * 140)));
        assert_eq!(got[4].2.sealed, Some((5, 32 + 2 * 140)));
        assert!(got
            .iter()
            .filter(|g| g.0 % 2 == 1 || g.0 == 0)
            .all(|g| g.2.sealed.is_none()));
        assert_eq!(w.current(), Some((6, 32 + 140)));
        assert_eq!(w.sync().unwrap(), Some((6, 172)));
        for (g, r, a) in &got {
            let e = a.extent;
            assert!(e.is_verified());
            assert_eq!(e.count(), 2);
            let bytes = std::fs::read(dir.path().join(file_name(e.file().seq()))).unwrap();
            assert_eq!(
                &bytes[e.offset() as usize..e.end() as usize],
                &r[..],
                "group {g}"
            );
        }
        // Each file scans back through the Vfs, with no torn end.
        for seq in 4..=6 {
            let f = vfs
                .open(&dir.path().join(file_name(seq)), OpenMode::Read)
                .unwrap();
            let mut s = ColdScanner::new(&*f, 0, true).unwrap();
            assert_eq!(s.header().seq, seq);
            let mut n = 0;
            while let Some(e) = s.next_extent().unwrap() {
                assert!(e.damage.is_none());
                n += 1;
            }
            assert_eq!(
                (n, s.end()),
                (if seq == 6 { 1 } else { 2 }, Some(&ScanEnd::Clean))
            );
        }
        // An extent larger than a file gets one of its own.
        let big = records(1, 9, 10);
        let a = w.append(9, 1, 9, &big).unwrap();
        assert_eq!(a.sealed, Some((6, 172)));
        assert_eq!((a.extent.file().seq(), a.extent.offset()), (7, 64));
        // A new writer never appends to an existing file.
        let mut again = ColdWriter::new(vfs, dir.path(), 7, 1 << 20);
        assert!(again.append(1, 1, 1, &records(1, 1, 0)).is_err());
    }

    #[test]
    fn the_writer_refuses_bad_records_and_abandons_a_file_after_a_failed_write() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = FaultyVfs::new();
        let vfs: Arc<dyn Vfs> = Arc::new(faulty.clone());
        let mut w = ColdWriter::new(vfs, dir.path(), 1, 1 << 20);
        let mut r = records(5, 3, 10);
        for (first, count) in [(4, 3), (5, 2), (5, 4), (5, 0)] {
            let err = w.append(8, first, count, &r).unwrap_err();
            assert!(matches!(err, Error::GroupDamaged { group: 8, .. }), "{err}");
        }
        r[60] ^= 1;
        assert!(w
            .append(8, 5, 3, &r)
            .unwrap_err()
            .to_string()
            .contains("checksum"));
        assert_eq!(w.current(), None, "nothing written");
        r[60] ^= 1;
        w.append(8, 5, 3, &r).unwrap();
        faulty
            .control
            .write_budget_bytes
            .store(10, Ordering::SeqCst);
        assert!(w.append(8, 8, 3, &records(8, 3, 10)).is_err());
        assert_eq!(w.current(), None, "the file is abandoned");
        faulty
            .control
            .write_budget_bytes
            .store(u64::MAX, Ordering::SeqCst);
        let a = w.append(8, 8, 3, &records(8, 3, 10)).unwrap();
        assert_eq!(a.extent.file().seq(), 2, "a new file");
    }
}
