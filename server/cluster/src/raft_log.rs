//! The Raft log (format-spec/cluster.md section 3): one append-only file of
//! records, Entry and HardState, written by the replica's driver thread
//! once per raft-rs `Ready` (one write, one fdatasync), and the raft-rs
//! [`Storage`] over it.
//!
//! Representation: the file, and in memory every entry since the log
//! began (`entries[i - 1]` has index `i`: this version never compacts, so
//! the first index is always 1) and the newest hard state. A conflict is
//! not an in-place change: an Entry record of index `i` drops every entry
//! of index `>= i` when the file is read (section 3.3), as it does here in
//! memory when it is written.
//!
//! Invariants: the in-memory list and hard state are what reading the
//! file gives; entry indices are dense from 1; nothing is acknowledged to
//! raft-rs as persisted (the caller's `advance`) before [`RaftLog::persist`]
//! returned, which is after the fdatasync.
//!
//! Costs: `persist` is one write and one fdatasync, plus copies of the
//! entries; `open` reads the whole file once; memory is every entry's data
//! (compaction is the next step, cluster.md section 8). The storage reads
//! are slices of the in-memory list.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::error::{ClusterError, Result};

/// `"TMRAFTL\0"`, the file's magic.
pub const MAGIC: [u8; 8] = *b"TMRAFTL\0";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of the file header.
pub const FILE_HEADER_BYTES: usize = 16;
/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 16;
/// Bytes of an Entry body before its data.
pub const ENTRY_FIXED_BYTES: usize = 24;
/// Bytes of a HardState body.
pub const HARD_STATE_BYTES: usize = 24;
/// Record kinds.
pub const KIND_ENTRY: u8 = 1;
pub const KIND_HARD_STATE: u8 = 2;

/// The file's name inside the replica's `raft/` directory.
pub const FILE_NAME: &str = "log";

/// The durable Raft log of one replica, and raft-rs's view of it.
pub struct RaftLog {
    path: PathBuf,
    file: File,
    /// Bytes of the file (its valid part).
    len: u64,
    entries: Vec<Entry>,
    hard_state: HardState,
    /// The voters: configuration in this version (cluster.md section 2).
    conf_state: ConfState,
    /// Reused encode buffer.
    buf: Vec<u8>,
}

impl RaftLog {
    /// Opens (or creates) the log in `dir` (the replica's `raft/`), with
    /// `voters` as the replica set. A torn tail is cut; damage is refused.
    pub fn open(dir: &Path, voters: &[u64]) -> Result<RaftLog> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ClusterError::io("create the raft directory", e))?;
        let path = dir.join(FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| ClusterError::io(format!("open {}", path.display()), e))?;
        let mut bytes = Vec::new();
        (&file)
            .read_to_end(&mut bytes)
            .map_err(|e| ClusterError::io(format!("read {}", path.display()), e))?;
        let conf_state = ConfState {
            voters: voters.to_vec(),
            ..Default::default()
        };
        let mut log = RaftLog {
            path,
            file,
            len: 0,
            entries: Vec::new(),
            hard_state: HardState::default(),
            conf_state,
            buf: Vec::new(),
        };
        if bytes.len() < FILE_HEADER_BYTES {
            // A new file, or a creation a crash cut: written anew.
            let mut header = [0u8; FILE_HEADER_BYTES];
            header[..8].copy_from_slice(&MAGIC);
            header[8..12].copy_from_slice(&VERSION.to_le_bytes());
            log.write_synced(0, &header, true)?;
            log.len = FILE_HEADER_BYTES as u64;
            sync_dir(dir)?;
            return Ok(log);
        }
        if bytes[..8] != MAGIC {
            return Err(log.damaged(0, "not a tidemark Raft log (magic)".into()));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if version != VERSION || bytes[12..16] != [0; 4] {
            return Err(log.damaged(8, format!("version {version} (this build reads {VERSION})")));
        }
        let mut at = FILE_HEADER_BYTES;
        while let Some(rec) = record_at(&bytes, at) {
            log.apply_record(at as u64, rec)?;
            at += rec.len();
        }
        if at < bytes.len() {
            log::warn!(
                "{}: torn tail of {} bytes at offset {at} cut",
                log.path.display(),
                bytes.len() - at
            );
            log.file
                .set_len(at as u64)
                .and_then(|()| log.file.sync_data())
                .map_err(|e| ClusterError::io(format!("cut {}", log.path.display()), e))?;
        }
        log.len = at as u64;
        Ok(log)
    }

    /// Applies one record read from the file at `offset` to the list and
    /// the hard state (cluster.md section 3.3).
    fn apply_record(&mut self, offset: u64, rec: &[u8]) -> Result<()> {
        let kind = rec[8];
        if rec[9..16] != [0; 7] {
            return Err(self.damaged(offset, "reserved bytes of a record are not 0".into()));
        }
        let body = &rec[RECORD_HEADER_BYTES..];
        match kind {
            KIND_ENTRY => {
                let entry = decode_entry(body).map_err(|why| self.damaged(offset, why))?;
                let last = self.last();
                if entry.index > last + 1 {
                    return Err(self.damaged(
                        offset,
                        format!("entry {} after entry {last}: a gap", entry.index),
                    ));
                }
                self.entries.truncate(entry.index as usize - 1);
                self.entries.push(entry);
            }
            KIND_HARD_STATE => {
                if body.len() != HARD_STATE_BYTES {
                    return Err(
                        self.damaged(offset, format!("a hard state of {} bytes", body.len()))
                    );
                }
                self.hard_state = HardState {
                    term: u64_at(body, 0),
                    vote: u64_at(body, 8),
                    commit: u64_at(body, 16),
                    ..Default::default()
                };
            }
            k => return Err(self.damaged(offset, format!("unknown record kind {k}"))),
        }
        Ok(())
    }

    fn damaged(&self, offset: u64, reason: String) -> ClusterError {
        ClusterError::RaftLogDamaged {
            path: self.path.clone(),
            offset,
            reason,
        }
    }

    /// Makes `entries` (which may start at or below the last index: a
    /// conflict) and `hard_state` durable: one write of their records, one
    /// fdatasync. Refuses entries that would leave a gap or that are not
    /// Normal (membership changes are the next step).
    pub fn persist(&mut self, entries: &[Entry], hard_state: Option<&HardState>) -> Result<()> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        self.buf.clear();
        let mut last = self.last();
        for e in entries {
            if e.index == 0 || e.index > last + 1 {
                return Err(ClusterError::Stopped {
                    reason: format!("raft handed entry {} after entry {last}", e.index),
                });
            }
            if e.get_entry_type() != EntryType::EntryNormal {
                return Err(ClusterError::Stopped {
                    reason: format!(
                        "entry {} of type {:?}: membership changes are not supported yet",
                        e.index,
                        e.get_entry_type()
                    ),
                });
            }
            encode_entry(&mut self.buf, e);
            last = e.index;
        }
        if let Some(hs) = hard_state {
            encode_hard_state(&mut self.buf, hs);
        }
        let buf = std::mem::take(&mut self.buf);
        let written = self.write_synced(self.len, &buf, true);
        self.buf = buf;
        written?;
        self.len += self.buf.len() as u64;
        if let Some(first) = entries.first() {
            self.entries.truncate(first.index as usize - 1);
            self.entries.extend_from_slice(entries);
        }
        if let Some(hs) = hard_state {
            self.hard_state = hs.clone();
        }
        Ok(())
    }

    /// Writes `bytes` at `offset` and fdatasyncs the file. A failure is
    /// never retried: the caller stops the replica.
    fn write_synced(&self, offset: u64, bytes: &[u8], sync: bool) -> Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| ClusterError::io(format!("write {}", self.path.display()), e))?;
        if sync {
            self.file
                .sync_data()
                .map_err(|e| ClusterError::io(format!("fdatasync {}", self.path.display()), e))?;
        }
        Ok(())
    }

    /// The last index (0 when empty).
    pub fn last(&self) -> u64 {
        self.entries.len() as u64
    }

    /// The entry of `index`, if the log has it.
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let i = usize::try_from(index).ok()?.checked_sub(1)?;
        self.entries.get(i)
    }

    /// The durable hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }
}

impl Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < 1 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let mut out = self.entries[(low - 1) as usize..(high - 1) as usize].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == 0 {
            return Ok(0);
        }
        self.entry(idx)
            .map(|e| e.term)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, _request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Never asked while nothing is compacted: a follower's log always
        // joins the leader's from index 1 (cluster.md section 8 is next).
        Err(raft::Error::Store(
            StorageError::SnapshotTemporarilyUnavailable,
        ))
    }
}

/// The record at `at` if a whole one with a matching CRC lies there.
fn record_at(bytes: &[u8], at: usize) -> Option<&[u8]> {
    let header = bytes.get(at..at.checked_add(RECORD_HEADER_BYTES)?)?;
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len < RECORD_HEADER_BYTES {
        return None;
    }
    let rec = bytes.get(at..at.checked_add(len)?)?;
    let crc = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
    (crc32fast::hash(&rec[8..]) == crc).then_some(rec)
}

/// Appends one record of `kind` whose body `body` writes.
fn encode_record(buf: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
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

fn encode_entry(buf: &mut Vec<u8>, e: &Entry) {
    // Format: { index: u64 | term: u64 | entry_type: u8 |
    //   reserved: [u8; 7] = 0 } + data
    encode_record(buf, KIND_ENTRY, |b| {
        b.extend_from_slice(&e.index.to_le_bytes());
        b.extend_from_slice(&e.term.to_le_bytes());
        b.push(e.get_entry_type() as u8);
        b.extend_from_slice(&[0; 7]);
        b.extend_from_slice(&e.data);
    });
}

fn encode_hard_state(buf: &mut Vec<u8>, hs: &HardState) {
    // Format: { term: u64 | vote: u64 | commit: u64 }
    encode_record(buf, KIND_HARD_STATE, |b| {
        b.extend_from_slice(&hs.term.to_le_bytes());
        b.extend_from_slice(&hs.vote.to_le_bytes());
        b.extend_from_slice(&hs.commit.to_le_bytes());
    });
}

fn decode_entry(body: &[u8]) -> std::result::Result<Entry, String> {
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
    if body[16] != EntryType::EntryNormal as u8 {
        return Err(format!("entry {} of type {}", e.index, body[16]));
    }
    if body[17..24] != [0; 7] {
        return Err(format!("entry {}: reserved bytes are not 0", e.index));
    }
    e.data = body[ENTRY_FIXED_BYTES..].to_vec().into();
    Ok(e)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Makes a new file's directory entry durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ClusterError::io(format!("fsync {}", dir.display()), e))
}
