//! The Raft log (format-spec/cluster.md section 3): one append-only file of
//! records, Start, Entry and HardState, written by the replica's driver
//! thread once per raft-rs `Ready` (one write, one fdatasync), and the
//! raft-rs [`Storage`] over it.
//!
//! Representation: the file, and in memory the entries after the log's
//! *start* (`entries[k]` has index `start.index + 1 + k`), the start (the
//! last compacted entry's index and term, `(0, 0)` for a log that was never
//! compacted) and the newest hard state. A conflict is not an in-place
//! change: an Entry record of index `i` drops every entry of index `>= i`
//! when the file is read (section 3.3), as it does here in memory when it
//! is written. Compaction ([`RaftLog::compact`]) and a snapshot's install
//! ([`RaftLog::reset_to_snapshot`]) rewrite the file whole: a new file
//! `log.new` (header, a Start record, the entries kept, the hard state),
//! fdatasynced, renamed over `log`, the directory fsynced; a crash before
//! the rename leaves the old log (the stray `log.new` is removed at open),
//! after it the new one.
//!
//! Invariants: the in-memory list, start and hard state are what reading
//! the file gives; entry indices are dense from `start.index + 1`; nothing
//! is acknowledged to raft-rs as persisted (the caller's `advance`) before
//! [`RaftLog::persist`] returned, which is after the fdatasync; the log is
//! compacted only up to an index the caller's engine holds durably.
//!
//! Costs: `persist` is one write and one fdatasync, plus copies of the
//! entries; `compact` writes the entries kept once (it runs when the file
//! passed the caller's bound and halves it at least, so its cost is
//! amortised over the appends); `open` reads the whole file once; memory is
//! the entries kept. The storage reads are slices of the in-memory list.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};

use crate::members::{self, Members};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::error::{ClusterError, Result};

/// `"TMRAFTL\0"`, the file's magic.
pub const MAGIC: [u8; 8] = *b"TMRAFTL\0";
/// The format version this code writes (a file it rewrites or creates).
pub const VERSION: u32 = 2;
/// The first version, still read: no Start record.
pub const VERSION_1: u32 = 1;
/// Bytes of the file header.
pub const FILE_HEADER_BYTES: usize = 16;
/// Bytes of a record header.
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

/// The file's name inside the replica's `raft/` directory.
pub const FILE_NAME: &str = "log";
/// The rewrite's temporary name (module docs).
pub const NEW_FILE_NAME: &str = "log.new";

/// The durable Raft log of one replica, and raft-rs's view of it.
pub struct RaftLog {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    /// Bytes of the file (its valid part).
    len: u64,
    /// The last compacted entry: (index, term); (0, 0) if none.
    start: (u64, u64),
    entries: Vec<Entry>,
    hard_state: HardState,
    /// The membership: the last Members record's, or, in a log without
    /// one, the configured voters (cluster.md section 11.1).
    members: Members,
    /// A Members record is in the file: the membership is durable, and a
    /// rewrite keeps it.
    members_recorded: bool,
    /// The snapshot the driver offers to followers that need compacted
    /// entries ([`Storage::snapshot`]), if one is ready.
    offer: Option<Snapshot>,
    /// raft-rs asked for a snapshot none could answer: the driver makes one.
    snapshot_wanted: Cell<bool>,
    /// Reused encode buffer.
    buf: Vec<u8>,
}

impl RaftLog {
    /// Opens (or creates) the log in `dir` (the replica's `raft/`), with
    /// `voters` as the replica set unless the log holds a Members record
    /// (cluster.md section 11.1: the durable membership wins). A torn tail
    /// is cut; damage is refused; a rewrite a crash left unfinished
    /// (`log.new`) is removed.
    pub fn open(dir: &Path, voters: &[u64]) -> Result<RaftLog> {
        std::fs::create_dir_all(dir)
            .map_err(|e| ClusterError::io("create the raft directory", e))?;
        let stray = dir.join(NEW_FILE_NAME);
        match std::fs::remove_file(&stray) {
            Ok(()) => log::warn!("{}: an unfinished rewrite removed", stray.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ClusterError::io(format!("remove {}", stray.display()), e)),
        }
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
        let mut log = RaftLog {
            dir: dir.to_path_buf(),
            path,
            file,
            len: 0,
            start: (0, 0),
            entries: Vec::new(),
            hard_state: HardState::default(),
            members: Members::voters(0, voters),
            members_recorded: false,
            offer: None,
            snapshot_wanted: Cell::new(false),
            buf: Vec::new(),
        };
        if bytes.len() < FILE_HEADER_BYTES {
            // A new file, or a creation a crash cut: written anew.
            log.write_synced(0, &file_header(), true)?;
            log.len = FILE_HEADER_BYTES as u64;
            sync_dir(dir)?;
            return Ok(log);
        }
        if bytes[..8] != MAGIC {
            return Err(log.damaged(0, "not a tidemark Raft log (magic)".into()));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        if !(version == VERSION || version == VERSION_1) || bytes[12..16] != [0; 4] {
            return Err(log.damaged(
                8,
                format!("version {version} (this build reads {VERSION_1} and {VERSION})"),
            ));
        }
        let mut at = FILE_HEADER_BYTES;
        while let Some(rec) = record_at(&bytes, at) {
            let first = at == FILE_HEADER_BYTES;
            log.apply_record(at as u64, rec, first && version >= VERSION)?;
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
        log.clamp_commit_to_last();
        Ok(log)
    }

    /// Repairs a hard state whose commit index names an entry the log does
    /// not hold (cluster.md section 8.3: an install by an older version
    /// wrote the commit of the entries that came with the snapshot, then
    /// ended before those entries were persisted): raft-rs would refuse
    /// to start from it. The commit is lowered to the last index held,
    /// with a warning naming the file. Safe: the commit index is a lower
    /// bound the leader tells again, and nothing past the last index held
    /// was applied (a replica applies only entries its log holds).
    fn clamp_commit_to_last(&mut self) {
        let last = self.last();
        if self.hard_state.commit > last {
            log::warn!(
                "{}: the hard state's commit index {} is past the last entry held, {last}: \
                 lowered to {last} (the leader sends the rest again)",
                self.path.display(),
                self.hard_state.commit
            );
            self.hard_state.commit = last;
        }
    }

    /// Applies one record read from the file at `offset` to the list and
    /// the hard state (cluster.md section 3.3); a Start record only as the
    /// first record of a version 2 file (`start_allowed`).
    fn apply_record(&mut self, offset: u64, rec: &[u8], start_allowed: bool) -> Result<()> {
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
                if entry.index <= self.start.0 {
                    return Err(self.damaged(
                        offset,
                        format!(
                            "entry {} at or before the log's start {}",
                            entry.index, self.start.0
                        ),
                    ));
                }
                self.entries
                    .truncate((entry.index - self.start.0 - 1) as usize);
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
            KIND_START if start_allowed => {
                if body.len() != START_BYTES {
                    return Err(self.damaged(offset, format!("a start of {} bytes", body.len())));
                }
                let (index, term) = (u64_at(body, 0), u64_at(body, 8));
                // An index past 2^62 is no log's (a set appending a
                // million entries a second takes 146,000 years to get
                // there): refused, so that index arithmetic never wraps.
                if index == 0 || term == 0 || index > START_INDEX_MAX {
                    return Err(self.damaged(offset, format!("start {index} term {term}")));
                }
                self.start = (index, term);
            }
            KIND_START => {
                return Err(self.damaged(
                    offset,
                    "a start record that is not a version 2 file's first".into(),
                ))
            }
            KIND_MEMBERS => {
                self.members = members::decode_body(body)
                    .map_err(|why| self.damaged(offset, format!("members: {why}")))?;
                self.members_recorded = true;
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
    /// fdatasync. Refuses entries that would leave a gap, that lie at or
    /// before the start, or that are ConfChangeV2 (tidemark proposes only
    /// single-step changes, cluster.md section 11).
    pub fn persist(&mut self, entries: &[Entry], hard_state: Option<&HardState>) -> Result<()> {
        if entries.is_empty() && hard_state.is_none() {
            return Ok(());
        }
        self.buf.clear();
        let mut last = self.last();
        for e in entries {
            if e.index <= self.start.0 || e.index > last + 1 {
                return Err(ClusterError::Stopped {
                    reason: format!(
                        "raft handed entry {} after entry {last} (log start {})",
                        e.index, self.start.0
                    ),
                });
            }
            if e.get_entry_type() == EntryType::EntryConfChangeV2 {
                return Err(ClusterError::Stopped {
                    reason: format!(
                        "entry {} of type {:?}: only single-step changes are written",
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
            self.entries
                .truncate((first.index - self.start.0 - 1) as usize);
            self.entries.extend_from_slice(entries);
        }
        if let Some(hs) = hard_state {
            self.hard_state = hs.clone();
        }
        Ok(())
    }

    /// Drops the entries up to `index` (at most the last index, committed
    /// and applied: the caller's engine holds them durably), rewriting the
    /// file (module docs). Does nothing if `index` is at or before the
    /// start.
    pub fn compact(&mut self, index: u64) -> Result<()> {
        if index <= self.start.0 {
            return Ok(());
        }
        let Some(term) = self.entry(index).map(|e| e.term) else {
            return Err(ClusterError::Stopped {
                reason: format!("compaction to {index}, past the last entry {}", self.last()),
            });
        };
        let keep = self.entries.split_off((index - self.start.0) as usize);
        self.entries = keep;
        self.start = (index, term);
        // The caller applied `index`, so it is committed; the stored commit
        // may lag (Raft relearns it), but never below the start, which
        // raft-rs requires at load.
        self.hard_state.commit = self.hard_state.commit.max(index);
        self.rewrite()
    }

    /// Resets the log to a snapshot at (`index`, `term`): no entries, the
    /// start there, `hard_state` (whose commit is at least `index`) as the
    /// hard state; the file rewritten (module docs). This rewrite is the
    /// install's commit point (cluster.md section 8.3).
    /// `members` (the snapshot's, cluster.md section 11.3) become the
    /// durable membership if given.
    pub fn reset_to_snapshot(
        &mut self,
        index: u64,
        term: u64,
        hard_state: &HardState,
        members: Option<Members>,
    ) -> Result<()> {
        if index == 0 || term == 0 || hard_state.commit < index {
            return Err(ClusterError::Stopped {
                reason: format!(
                    "a snapshot at {index} term {term} with commit {}",
                    hard_state.commit
                ),
            });
        }
        self.entries.clear();
        self.start = (index, term);
        self.hard_state = hard_state.clone();
        self.offer = None;
        if let Some(m) = members {
            self.members = m;
            self.members_recorded = true;
        }
        self.rewrite()
    }

    /// Makes a brand-new log the start of a replica set whose membership is
    /// `members` (cluster.md section 11.2): Start at (1, 1), the Members
    /// record at index 1, the hard state (1, 0, 1). Entry 1 is never held
    /// by any log, so a node added later, whose log is empty, is always
    /// sent a snapshot (which carries the membership) and never replays
    /// the log from its first entry without it. Refused on a log that is
    /// not empty.
    pub fn bootstrap(&mut self, members: &[members::Member]) -> Result<()> {
        if self.last() > 0 || self.members_recorded || self.hard_state != HardState::default() {
            return Err(ClusterError::Stopped {
                reason: "bootstrap of a Raft log that is not empty".into(),
            });
        }
        self.start = (1, 1);
        self.members = Members {
            index: 1,
            list: members.to_vec(),
        };
        self.members_recorded = true;
        self.hard_state = HardState {
            term: 1,
            vote: 0,
            commit: 1,
            ..Default::default()
        };
        self.rewrite()
    }

    /// Makes `members` the durable membership: one Members record appended
    /// and fdatasynced (called when a ConfChange entry is applied).
    pub fn set_members(&mut self, m: Members) -> Result<()> {
        self.buf.clear();
        encode_record(&mut self.buf, KIND_MEMBERS, |b| members::encode_body(b, &m));
        let buf = std::mem::take(&mut self.buf);
        let written = self.write_synced(self.len, &buf, true);
        self.buf = buf;
        written?;
        self.len += self.buf.len() as u64;
        self.members = m;
        self.members_recorded = true;
        Ok(())
    }

    /// The membership (the durable one if `members_recorded`).
    pub fn members(&self) -> &Members {
        &self.members
    }

    /// Whether the membership is durable in the log (a Members record);
    /// else it is the configuration the log was opened with.
    pub fn members_recorded(&self) -> bool {
        self.members_recorded
    }

    /// Writes the whole log to `log.new`, fdatasyncs it, renames it over
    /// `log` and fsyncs the directory (module docs).
    fn rewrite(&mut self) -> Result<()> {
        let bytes = self.encode_whole();
        let new_path = self.dir.join(NEW_FILE_NAME);
        let io = |what: &str, e| ClusterError::io(format!("{what} {}", new_path.display()), e);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&new_path)
            .map_err(|e| io("create", e))?;
        file.write_all_at(&bytes, 0).map_err(|e| io("write", e))?;
        file.sync_data().map_err(|e| io("fdatasync", e))?;
        std::fs::rename(&new_path, &self.path).map_err(|e| io("rename", e))?;
        sync_dir(&self.dir)?;
        self.file = file;
        self.len = bytes.len() as u64;
        Ok(())
    }

    /// The file a rewrite writes: header, Start (if the log has one), the
    /// entries, the hard state.
    fn encode_whole(&self) -> Vec<u8> {
        let mut bytes = file_header().to_vec();
        if self.start.0 > 0 {
            encode_start(&mut bytes, self.start.0, self.start.1);
        }
        if self.members_recorded {
            encode_record(&mut bytes, KIND_MEMBERS, |b| {
                members::encode_body(b, &self.members)
            });
        }
        for e in &self.entries {
            encode_entry(&mut bytes, e);
        }
        encode_hard_state(&mut bytes, &self.hard_state);
        bytes
    }

    /// Test hook: the first step of a rewrite only (`log.new` written and
    /// synced, not renamed), as a crash before the rename leaves it.
    #[cfg(test)]
    pub fn crash_before_rename(&mut self, index: u64) {
        let term = self.entry(index).map_or(0, |e| e.term);
        let keep = self.entries.split_off((index - self.start.0) as usize);
        self.entries = keep;
        self.start = (index, term);
        std::fs::write(self.dir.join(NEW_FILE_NAME), self.encode_whole()).unwrap();
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

    /// The last index (the start's when no entry follows it; 0 when empty).
    pub fn last(&self) -> u64 {
        self.start.0 + self.entries.len() as u64
    }

    /// The log's start: the last compacted entry's (index, term), (0, 0)
    /// for a log that was never compacted.
    pub fn start(&self) -> (u64, u64) {
        self.start
    }

    /// The entry of `index`, if the log has it (not compacted).
    pub fn entry(&self, index: u64) -> Option<&Entry> {
        let i = usize::try_from(index.checked_sub(self.start.0)?.checked_sub(1)?).ok()?;
        self.entries.get(i)
    }

    /// Bytes the file takes now (records superseded by later ones
    /// included): what compaction bounds.
    pub fn file_bytes(&self) -> u64 {
        self.len
    }

    /// Bytes the records of entries `from..=last` take in the file.
    pub fn entry_bytes_from(&self, from: u64) -> u64 {
        let skip = from.saturating_sub(self.start.0 + 1) as usize;
        self.entries
            .iter()
            .skip(skip)
            .map(|e| (RECORD_HEADER_BYTES + ENTRY_FIXED_BYTES + e.data.len()) as u64)
            .sum()
    }

    /// The durable hard state.
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    /// Whether raft-rs asked for a snapshot since the last call (and none
    /// was offered): the driver makes one.
    pub fn take_snapshot_wanted(&self) -> bool {
        self.snapshot_wanted.replace(false)
    }

    /// The snapshot [`Storage::snapshot`] answers with from now on (`None`:
    /// none; the next ask sets the wanted flag).
    pub fn set_offer(&mut self, offer: Option<Snapshot>) {
        self.offer = offer;
    }

    /// The snapshot offered, if any.
    pub fn offer(&self) -> Option<&Snapshot> {
        self.offer.as_ref()
    }

    /// The voters and learners, as raft-rs sees them.
    pub fn conf_state(&self) -> ConfState {
        self.members.conf_state()
    }
}

impl Storage for RaftLog {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.members.conf_state(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low <= self.start.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let base = self.start.0 + 1;
        let mut out = self.entries[(low - base) as usize..(high - base) as usize].to_vec();
        raft::util::limit_size(&mut out, max_size.into());
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.start.0 {
            return Ok(self.start.1);
        }
        if idx < self.start.0 {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        self.entry(idx)
            .map(|e| e.term)
            .ok_or(raft::Error::Store(StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.start.0 + 1)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // An offer is good if a follower that installs it can go on from
        // this log: it reaches the start at least (cluster.md section 8.1).
        match &self.offer {
            Some(s)
                if s.get_metadata().index >= self.start.0
                    && s.get_metadata().index >= request_index =>
            {
                Ok(s.clone())
            }
            _ => {
                // Taken on the driver's thread after this turn (an engine
                // snapshot is one short hold, but never inside raft-rs).
                self.snapshot_wanted.set(true);
                Err(raft::Error::Store(
                    StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}

/// The 16-byte file header of the version this code writes.
fn file_header() -> [u8; FILE_HEADER_BYTES] {
    // Format: { magic: [u8; 8] = "TMRAFTL\0" | version: u32 | reserved: u32 = 0 }
    let mut header = [0u8; FILE_HEADER_BYTES];
    header[..8].copy_from_slice(&MAGIC);
    header[8..12].copy_from_slice(&VERSION.to_le_bytes());
    header
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
pub(crate) fn encode_record(buf: &mut Vec<u8>, kind: u8, body: impl FnOnce(&mut Vec<u8>)) {
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

pub(crate) fn encode_entry(buf: &mut Vec<u8>, e: &Entry) {
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

pub(crate) fn encode_hard_state(buf: &mut Vec<u8>, hs: &HardState) {
    // Format: { term: u64 | vote: u64 | commit: u64 }
    encode_record(buf, KIND_HARD_STATE, |b| {
        b.extend_from_slice(&hs.term.to_le_bytes());
        b.extend_from_slice(&hs.vote.to_le_bytes());
        b.extend_from_slice(&hs.commit.to_le_bytes());
    });
}

pub(crate) fn encode_start(buf: &mut Vec<u8>, index: u64, term: u64) {
    // Format: { index: u64 | term: u64 }
    encode_record(buf, KIND_START, |b| {
        b.extend_from_slice(&index.to_le_bytes());
        b.extend_from_slice(&term.to_le_bytes());
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

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Makes a directory's entries (a new or renamed file) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ClusterError::io(format!("fsync {}", dir.display()), e))
}
