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
//! The bytes, and what reading them means, are `raft_log_format`'s (no
//! I/O there): each record names how far the file was synced when it was
//! written, so that open tells a write a crash tore (cut) from damage to
//! synced bytes (refused, nothing changed; cluster.md section 3.3).
//!
//! Invariants: the in-memory list, start and hard state are what reading
//! the file gives; every byte of the file up to its length is durable (a
//! record never names a synced length beyond what was); entry indices are
//! dense from `start.index + 1`; nothing
//! is acknowledged to raft-rs as persisted (the caller's `advance`) before
//! [`RaftLog::persist`] returned, which is after the fdatasync; the log is
//! compacted only up to an index the caller's engine holds durably.
//!
//! Costs: `persist` is one write and one fdatasync, plus copies of the
//! entries; `compact` writes the entries kept once (it runs when the file
//! passed the caller's bound and halves it at least, so its cost is
//! amortised over the appends); `open` reads the whole file once and
//! fdatasyncs it (after a torn or damaged record, it tries every offset
//! after it once, looking for a synced length); memory is
//! the entries kept. The storage reads are slices of the in-memory list.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Snapshot};

use crate::members::{self, Members};
use crate::raft_log_format::{self as format, Outcome};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::error::{ClusterError, Result};

pub use crate::raft_log_format::{
    encode_record, ENTRY_FIXED_BYTES, FILE_HEADER_BYTES, HARD_STATE_BYTES, KIND_ENTRY,
    KIND_HARD_STATE, KIND_MEMBERS, KIND_START, MAGIC, RECORD_HEADER_BYTES, RECORD_HEADER_V3_BYTES,
    START_BYTES, START_INDEX_MAX, VERSION, VERSION_1, VERSION_2,
};

/// The file's name inside the replica's `raft/` directory.
pub const FILE_NAME: &str = "log";
/// The rewrite's temporary name (module docs).
pub const NEW_FILE_NAME: &str = "log.new";

/// The durable Raft log of one replica, and raft-rs's view of it.
pub struct RaftLog {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    /// Bytes of the file (its valid part). Every one is durable: each
    /// write is fdatasynced before `len` moves past it, and open syncs
    /// what it keeps; so it is the `synced_len` the next records name.
    len: u64,
    /// The key of the file's record header checksums (`raft_log_format`).
    mark_key: u32,
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
    /// (bytes no synced length covers) is cut; damage, also inside synced
    /// bytes, is refused with nothing changed; a rewrite a crash left
    /// unfinished (`log.new`) is removed; a version 1 or 2 file is
    /// rewritten as version 3 (cluster.md section 3.1).
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
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(ClusterError::io(format!("read {}", path.display()), e)),
        };
        let reading = format::read(&bytes);
        if let Outcome::Damaged { offset, reason } = reading.outcome {
            return Err(ClusterError::RaftLogDamaged {
                path,
                offset,
                reason,
            });
        }
        if let Outcome::Torn { reason } = &reading.outcome {
            log::warn!(
                "{}: torn tail of {} bytes at offset {} cut ({reason})",
                path.display(),
                reading.file_len - reading.end,
                reading.end
            );
        }
        let state = reading.state;
        let (file, mark_key, len) = match reading.header {
            Some(h) if h.version == VERSION => {
                let io = |what: &str, e| ClusterError::io(format!("{what} {}", path.display()), e);
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(|e| io("open", e))?;
                if reading.end < reading.file_len {
                    file.set_len(reading.end).map_err(|e| io("cut", e))?;
                }
                // What a crash left unsynced (a write whose fdatasync did
                // not return) is made durable before a record names it.
                file.sync_data().map_err(|e| io("fdatasync", e))?;
                (file, h.mark_key, reading.end)
            }
            header => {
                // No file, a creation an older build's crash cut, or a
                // version 1 or 2 file: written whole as version 3.
                match header {
                    Some(h) => log::info!(
                        "{}: version {} rewritten as version {VERSION}",
                        path.display(),
                        h.version
                    ),
                    None if !bytes.is_empty() => log::warn!(
                        "{}: a creation of {} bytes a crash cut, written anew",
                        path.display(),
                        bytes.len()
                    ),
                    None => {}
                }
                let key = fresh_mark_key();
                let whole = format::encode_whole(
                    key,
                    state.start,
                    state.members.as_ref(),
                    &state.entries,
                    &state.hard_state,
                );
                (write_whole(dir, &path, &whole)?, key, whole.len() as u64)
            }
        };
        let mut log = RaftLog {
            dir: dir.to_path_buf(),
            path,
            file,
            len,
            mark_key,
            start: state.start,
            entries: state.entries,
            hard_state: state.hard_state,
            members_recorded: state.members.is_some(),
            members: state.members.unwrap_or_else(|| Members::voters(0, voters)),
            offer: None,
            snapshot_wanted: Cell::new(false),
            buf: Vec::new(),
        };
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
            format::encode_record_v3(&mut self.buf, self.mark_key, self.len, KIND_ENTRY, |b| {
                format::entry_body(b, e)
            });
            last = e.index;
        }
        if let Some(hs) = hard_state {
            format::encode_record_v3(
                &mut self.buf,
                self.mark_key,
                self.len,
                KIND_HARD_STATE,
                |b| format::hard_state_body(b, hs),
            );
        }
        let buf = std::mem::take(&mut self.buf);
        let written = self.write_synced(self.len, &buf);
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
        format::encode_record_v3(&mut self.buf, self.mark_key, self.len, KIND_MEMBERS, |b| {
            members::encode_body(b, &m)
        });
        let buf = std::mem::take(&mut self.buf);
        let written = self.write_synced(self.len, &buf);
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

    /// Writes the whole log to `log.new` (a new key), fdatasyncs it,
    /// renames it over `log` and fsyncs the directory (module docs).
    fn rewrite(&mut self) -> Result<()> {
        let key = fresh_mark_key();
        let bytes = self.encode_whole(key);
        self.file = write_whole(&self.dir, &self.path, &bytes)?;
        self.mark_key = key;
        self.len = bytes.len() as u64;
        Ok(())
    }

    /// The file a rewrite writes, keyed `key` (`raft_log_format::encode_whole`).
    fn encode_whole(&self, key: u32) -> Vec<u8> {
        format::encode_whole(
            key,
            self.start,
            self.members_recorded.then_some(&self.members),
            &self.entries,
            &self.hard_state,
        )
    }

    /// Test hook: the first step of a rewrite only (`log.new` written and
    /// synced, not renamed), as a crash before the rename leaves it.
    #[cfg(test)]
    pub fn crash_before_rename(&mut self, index: u64) {
        let term = self.entry(index).map_or(0, |e| e.term);
        let keep = self.entries.split_off((index - self.start.0) as usize);
        self.entries = keep;
        self.start = (index, term);
        let bytes = self.encode_whole(fresh_mark_key());
        std::fs::write(self.dir.join(NEW_FILE_NAME), bytes).unwrap();
    }

    /// Writes `bytes` at `offset` and fdatasyncs the file. A failure is
    /// never retried: the caller stops the replica.
    fn write_synced(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all_at(bytes, offset)
            .map_err(|e| ClusterError::io(format!("write {}", self.path.display()), e))?;
        self.file
            .sync_data()
            .map_err(|e| ClusterError::io(format!("fdatasync {}", self.path.display()), e))
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
            .map(|e| (RECORD_HEADER_V3_BYTES + ENTRY_FIXED_BYTES + e.data.len()) as u64)
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

/// Writes a whole file to `dir/log.new`, fdatasyncs it, renames it over
/// `path` and fsyncs the directory: a crash leaves the old file or the new
/// one, whole (cluster.md section 3.5). The new file, open.
fn write_whole(dir: &Path, path: &Path, bytes: &[u8]) -> Result<File> {
    let new_path = dir.join(NEW_FILE_NAME);
    let io = |what: &str, e| ClusterError::io(format!("{what} {}", new_path.display()), e);
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&new_path)
        .map_err(|e| io("create", e))?;
    file.write_all_at(bytes, 0).map_err(|e| io("write", e))?;
    file.sync_data().map_err(|e| io("fdatasync", e))?;
    std::fs::rename(&new_path, path).map_err(|e| io("rename", e))?;
    sync_dir(dir)?;
    Ok(file)
}

#[cfg(test)]
thread_local! {
    /// Tests: the key the next file created or rewritten on this thread
    /// gets (the spec's vector needs a fixed one).
    pub(crate) static TEST_MARK_KEY: Cell<Option<u32>> = const { Cell::new(None) };
}

/// A new file's key (`raft_log_format::new_mark_key`).
fn fresh_mark_key() -> u32 {
    #[cfg(test)]
    if let Some(k) = TEST_MARK_KEY.with(Cell::get) {
        return k;
    }
    format::new_mark_key()
}

/// Makes a directory's entries (a new or renamed file) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| ClusterError::io(format!("fsync {}", dir.display()), e))
}
