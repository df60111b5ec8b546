//! One segment file of a group log: a 64-byte header, then records back to back.
//!
//! Format of the header (little-endian), see format-spec/storage.md "Segment file":
//! `{ magic: [u8; 8] = "TDMKSEG\0" | version: u16 = 1 | header_len: u16 = 64 |
//!    reserved: u32 = 0 | group_id: u64 | base_msg_id: u64 | created_ms: u64 |
//!    reserved: [u8; 20] = 0 | crc32: u32 (of bytes 0..60) }`
//!
//! Segments are written with `pwrite` and read through a shared read-only
//! mapping of `segment_bytes_max` bytes, of which only the verified prefix is
//! ever touched.
//!
//! A mapping trusts the file: touching a mapped page that a cut (truncation
//! by another program) or a media error left without data raises SIGBUS,
//! which kills the node. So (format-spec/storage.md "Reads"):
//! - a segment's first, verifying read ([`scan`]) goes through `pread`, in
//!   blocks, never through the mapping: a cut file or an EIO there is a
//!   typed error, and the group answers `GroupDamaged`;
//! - every later read checks the file's length ([`SegmentFile::check_len`],
//!   one fstat) against the bytes the log holds in it before touching the
//!   mapping, so a file cut since is `GroupDamaged`, not SIGBUS.
//!
//! A SIGBUS guard (a handler that jumps back out of the faulting read, as
//! LMDB users do in C) would close the remaining windows, but unwinding out
//! of a signal handler through Rust frames is not sound, and reading every
//! page through `pread` would give up sending records from the mapping
//! (a copy per pull, heap per queued response). The residual windows: a
//! cut or a media error between the length check and the read's own
//! touches of record headers (microseconds), or between the read and a
//! caller decoding the returned records, still raises SIGBUS; and a media
//! error on a page evicted since its verification is not seen by a length
//! check. Record bytes the kernel copies into a socket from a cut mapping
//! (writev) fail with EFAULT, not SIGBUS: the node survives and closes that
//! connection.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs, VfsFile};
use crate::logs::index::SparseIndex;
use crate::logs::record::{self, RecordError};

pub const SEGMENT_HEADER_BYTES: usize = 64;
pub const SEGMENT_MAGIC: [u8; 8] = *b"TDMKSEG\0";
pub const SEGMENT_VERSION: u16 = 1;
const SEGMENT_SUFFIX: &str = ".seg";

/// The decoded header of a segment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub group_id: u64,
    pub base_msg_id: u64,
    pub created_ms: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[0..8].copy_from_slice(&SEGMENT_MAGIC);
        b[8..10].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&(SEGMENT_HEADER_BYTES as u16).to_le_bytes());
        b[16..24].copy_from_slice(&self.group_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.base_msg_id.to_le_bytes());
        b[32..40].copy_from_slice(&self.created_ms.to_le_bytes());
        let crc = crc32fast::hash(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<SegmentHeader, String> {
        if b.len() < SEGMENT_HEADER_BYTES {
            return Err(format!(
                "file of {} bytes is shorter than the segment header",
                b.len()
            ));
        }
        let b = &b[..SEGMENT_HEADER_BYTES];
        let stored = u32::from_le_bytes([b[60], b[61], b[62], b[63]]);
        let computed = crc32fast::hash(&b[0..60]);
        if stored != computed {
            return Err(format!(
                "header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        if b[0..8] != SEGMENT_MAGIC {
            return Err("bad segment magic".into());
        }
        let version = u16::from_le_bytes([b[8], b[9]]);
        if version != SEGMENT_VERSION {
            return Err(format!("unsupported segment version {version}"));
        }
        if u16::from_le_bytes([b[10], b[11]]) as usize != SEGMENT_HEADER_BYTES
            || b[12..16] != [0; 4]
            || b[40..60] != [0; 20]
        {
            return Err("segment header_len or reserved bytes invalid".into());
        }
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let base_msg_id = u64_at(24);
        if base_msg_id == 0 {
            // Ids start at 1; no segment ever holds id 0.
            return Err("segment base msg_id 0".into());
        }
        Ok(SegmentHeader {
            group_id: u64_at(16),
            base_msg_id,
            created_ms: u64_at(32),
        })
    }
}

/// `00000000000000000001.seg` for base id 1: names sort in id order.
pub fn file_name(base_msg_id: u64) -> String {
    format!("{base_msg_id:020}{SEGMENT_SUFFIX}")
}

/// The base id a segment file name encodes, or `None` for other files:
/// the rule of format-spec/storage.md section 2. The engine opens segments
/// by the names their bases give; it lists a group directory only to
/// judge the files of a promotion a crash made moot
/// (`promotion_left.rs`).
pub fn parse_file_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != 20 {
        return None;
    }
    digits.parse().ok()
}

/// An open segment: the file (for appends) and its read mapping, made on
/// first read (the commit path only writes, and a mapping costs a system
/// call and address space).
pub struct SegmentFile {
    pub path: PathBuf,
    file: Box<dyn VfsFile>,
    map: std::sync::OnceLock<memmap2::Mmap>,
    map_bytes: u64,
}

impl SegmentFile {
    /// Opens an existing segment file; it is mapped (`map_bytes`, at least
    /// the file size) on first read.
    pub fn open(vfs: &dyn Vfs, path: &Path, map_bytes: u64) -> Result<SegmentFile> {
        let file = vfs
            .open(path, OpenMode::ReadWrite)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        Ok(SegmentFile {
            path: path.to_owned(),
            file,
            map: std::sync::OnceLock::new(),
            map_bytes,
        })
    }

    /// Creates a new segment file holding only its header.
    pub fn create(
        vfs: &dyn Vfs,
        path: &Path,
        header: &SegmentHeader,
        map_bytes: u64,
    ) -> Result<SegmentFile> {
        let file = vfs
            .open(path, OpenMode::CreateNew)
            .map_err(|e| Error::write(format!("create {}", path.display()), e))?;
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| Error::write(format!("write {}", path.display()), e))?;
        Ok(SegmentFile {
            path: path.to_owned(),
            file,
            map: std::sync::OnceLock::new(),
            map_bytes,
        })
    }

    /// Maps the file if it is not mapped yet. Must precede [`Self::bytes`].
    pub fn ensure_mapped(&self) -> Result<()> {
        if self.map.get().is_some() {
            return Ok(());
        }
        let file_len = self.file_len()?;
        let map_len =
            usize::try_from(self.map_bytes.max(file_len)).map_err(|_| Error::Corrupt {
                path: self.path.clone(),
                group: None,
                offset: 0,
                reason: "segment larger than the address space".into(),
            })?;
        let map = self
            .file
            .map(map_len)
            .map_err(|e| Error::io(format!("mmap {}", self.path.display()), e))?;
        // A racing reader may have mapped it first; either mapping is the file.
        let _ = self.map.set(map);
        Ok(())
    }

    /// False if the file is mapped and the mapping ends before `end`: the
    /// file grew past it (a record larger than a segment, which only a
    /// journal written under larger limits can bring). The caller must then
    /// drop this handle from the cache so that readers map the file anew.
    pub fn mapping_covers(&self, end: u64) -> bool {
        self.map.get().is_none_or(|m| m.len() as u64 >= end)
    }

    /// The mapped bytes `[start, end)`. The caller mapped the file
    /// ([`Self::ensure_mapped`]) and guarantees `end` does not exceed the
    /// verified data length, which [`Self::check_len`] found inside the file.
    pub fn bytes(&self, start: usize, end: usize) -> &[u8] {
        // Invariant: every read path calls ensure_mapped before slicing.
        &self
            .map
            .get()
            .expect("invariant: segment mapped before reading")[start..end]
    }

    /// Fails with `GroupDamaged` naming the file if it holds fewer than
    /// `needed` bytes: it was cut (or lost data) under the engine, and the
    /// mapping must not be touched there (SIGBUS). One fstat, made before
    /// every read of the mapping.
    pub fn check_len(&self, group: u64, needed: u64) -> Result<()> {
        crate::io::check_mapped_len(&*self.file, &self.path, group, needed)
    }

    /// Reads exactly `buf.len()` bytes at `offset` with `pread` (not through
    /// the mapping: a cut or unreadable file is an error, not SIGBUS).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.file.read_exact_at(buf, offset).map_err(|e| {
            Error::io(
                format!("read {} at offset {offset}", self.path.display()),
                e,
            )
        })
    }

    pub fn write_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| Error::write(format!("write {}", self.path.display()), e))
    }

    pub fn sync(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(format!("fdatasync {}", self.path.display()), e))
    }

    pub fn file_len(&self) -> Result<u64> {
        self.file
            .file_len()
            .map_err(|e| Error::io(format!("stat {}", self.path.display()), e))
    }

    /// Cuts the file to `len` bytes. Only used during recovery, before any
    /// reader can hold a slice of the cut region.
    pub fn truncate(&self, len: u64) -> Result<()> {
        self.file
            .set_len(len)
            .map_err(|e| Error::io(format!("truncate {}", self.path.display()), e))
    }
}

/// What a verifying scan of a segment found.
#[derive(Debug)]
pub struct ScanOutcome {
    pub header: SegmentHeader,
    /// Offset just past the last valid record (the append position).
    pub valid_len: u64,
    /// Id of the last valid record; `base_msg_id - 1` if there is none.
    pub last_id: u64,
    /// Timestamp of the last valid record (0 if none).
    pub last_timestamp_ms: u64,
    pub records: u64,
    pub index: SparseIndex,
    /// The first invalid record after `valid_len`, if the scan stopped early.
    pub stopped: Option<ScanStop>,
}

/// Why a scan stopped before `scan_end`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    Record(RecordError),
    /// A valid record whose msg_id breaks density.
    IdOutOfOrder {
        found: u64,
        expected: u64,
    },
}

impl std::fmt::Display for ScanStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScanStop::Record(e) => e.fmt(f),
            ScanStop::IdOutOfOrder { found, expected } => {
                write!(f, "msg_id {found} where {expected} was expected")
            }
        }
    }
}

/// Bytes a verifying scan reads with one `pread` (more when one record is
/// longer): big enough that the system call cost vanishes next to the CRC.
const SCAN_BLOCK_BYTES: usize = 256 << 10;

/// Verifies the records of `seg` in `[SEGMENT_HEADER_BYTES, scan_end)`: CRCs,
/// lengths, dense ids from the header's base id. Builds the sparse index on
/// the way. Never panics and never allocates in proportion to a length field
/// (the buffer is a block, or one record that the file really holds).
///
/// Reads with `pread`, not through the mapping (see the module docs): this
/// is the first read of a segment's bytes and the longest, so a file cut
/// under the engine, or a page the medium cannot return, is an `Io` error
/// here rather than SIGBUS.
pub fn scan(
    seg: &SegmentFile,
    scan_end: u64,
    expected_group: u64,
    record_bytes_max: usize,
    index_interval_bytes: u32,
) -> Result<ScanOutcome> {
    let corrupt = |offset: u64, reason: String| Error::Corrupt {
        path: seg.path.clone(),
        group: Some(expected_group),
        offset,
        reason,
    };
    let file_len = seg.file_len()?;
    let scan_end = scan_end.min(file_len);
    if scan_end < SEGMENT_HEADER_BYTES as u64 {
        return Err(corrupt(
            0,
            format!("file of {file_len} bytes is shorter than the segment header"),
        ));
    }
    let mut head = [0u8; SEGMENT_HEADER_BYTES];
    seg.read_at(&mut head, 0)?;
    let header = SegmentHeader::decode(&head).map_err(|r| corrupt(0, r))?;
    if header.group_id != expected_group {
        return Err(corrupt(
            16,
            format!(
                "segment belongs to group {} not {expected_group}",
                header.group_id
            ),
        ));
    }
    let mut index = SparseIndex::new(header.base_msg_id, index_interval_bytes);
    let mut expected = header.base_msg_id;
    let mut last_ts = 0;
    let mut stopped = None;
    // `buf` holds the file's bytes `[buf_start, buf_start + buf.len())`;
    // `pos` is the start of the next record (the end of the valid ones).
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_start = SEGMENT_HEADER_BYTES as u64;
    let mut pos = SEGMENT_HEADER_BYTES as u64;
    while pos < scan_end {
        // Invariant: buf_start <= pos <= buf_start + buf.len().
        let rest = &buf[(pos - buf_start) as usize..];
        match record::decode_verified(rest, record_bytes_max) {
            Ok(h) => {
                if h.msg_id != expected {
                    stopped = Some(ScanStop::IdOutOfOrder {
                        found: h.msg_id,
                        expected,
                    });
                    break;
                }
                // Invariant: pos < scan_end <= segment_bytes_max <= u32::MAX (Config::validate).
                index.observe(expected, pos as u32);
                last_ts = h.timestamp_ms;
                expected += 1;
                pos += h.record_len as u64;
            }
            Err(RecordError::Truncated { need, .. })
                if buf_start + (buf.len() as u64) < scan_end =>
            {
                // The record goes on past the buffer but the file may hold
                // it: read from its start, a block or the whole record,
                // never past scan_end (a length field cannot make it more).
                let want = (need.max(SCAN_BLOCK_BYTES) as u64).min(scan_end - pos);
                // Invariant: want <= scan_end <= u32::MAX.
                buf.resize(want as usize, 0);
                seg.read_at(&mut buf, pos)?;
                buf_start = pos;
            }
            Err(e) => {
                stopped = Some(ScanStop::Record(e));
                break;
            }
        }
    }
    Ok(ScanOutcome {
        header,
        valid_len: pos,
        last_id: expected - 1,
        last_timestamp_ms: last_ts,
        records: expected - header.base_msg_id,
        index,
        stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = SegmentHeader {
            group_id: 5,
            base_msg_id: 1001,
            created_ms: 77,
        };
        let b = h.encode();
        assert_eq!(SegmentHeader::decode(&b).unwrap(), h);
        for i in 0..SEGMENT_HEADER_BYTES {
            let mut d = b;
            d[i] ^= 0x10;
            assert!(SegmentHeader::decode(&d).is_err(), "byte {i}");
        }
        assert!(SegmentHeader::decode(&b[..10]).is_err());
        let zero = SegmentHeader {
            base_msg_id: 0,
            ..h
        };
        let err = SegmentHeader::decode(&zero.encode()).unwrap_err();
        assert!(err.contains("base msg_id 0"), "{err}");
    }

    #[test]
    fn file_names_sort_by_id_and_parse_back() {
        assert_eq!(file_name(1), "00000000000000000001.seg");
        assert_eq!(
            parse_file_name(Path::new("/x/00000000000000000042.seg")),
            Some(42)
        );
        assert_eq!(parse_file_name(Path::new("/x/42.seg")), None);
        assert_eq!(
            parse_file_name(Path::new("/x/00000000000000000042.tmp")),
            None
        );
    }
}
