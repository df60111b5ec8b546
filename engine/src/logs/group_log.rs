//! A group's log: its chain of segment files, the append path and the read
//! path ("records above msg_id X").
//!
//! Invariants (checked by `debug_check` in tests):
//! - `segments` is never empty; bases increase; the last one is active;
//! - ids are dense: segment `i` holds `base_i ..= base_{i+1} - 1`, the active
//!   one `base_last ..= head`;
//! - `len` of a segment is the end of its last valid record.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::io::Vfs;
use crate::logs::index::SparseIndex;
use crate::logs::record::{self, RecordHeader};
use crate::logs::segment::{self, SegmentFile, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::logs::segment_cache::SegmentCache;
use crate::logs::trash::{Holding, Trash};

/// What group logs and the shared files need from the engine around
/// them, and the counts over all groups' logs. The layers above add their
/// own (`commit/context.rs`: the dirty list of groups); the snapshot holds
/// (`state/pins.rs`) are known here only as what the trash asks of them.
pub struct LogContext {
    pub vfs: Arc<dyn Vfs>,
    pub config: Config,
    pub cache: SegmentCache,
    /// Where directories of deleted groups go before they are removed.
    pub trash: Trash,
    /// Where the retained journal's rounds lie (replication): kept here
    /// because recovery, the commit thread and the checkpoint that
    /// deletes journal files all update it.
    pub rounds: crate::commit::journal::rounds::RoundIndex,
    /// Read-only mappings of the journal files small groups' records are
    /// in (storage v2 S5), shared by every reader of a small group.
    pub shared_files: crate::logs::shared_files::SharedFiles,
    /// Bytes of small groups' records per journal file (invariant A1 of
    /// `reclaim.rs`): changed by whoever applies entries (the commit thread,
    /// replay) and by recovery's restore; read at checkpoint capture (the
    /// pinned list) and by the checkpoint's deletion of journal files.
    /// The commit thread and the checkpointer's reclamation share it, so
    /// its waiters sleep (`sleep_lock.rs`).
    pub live: crate::sleep_lock::SleepMutex<crate::logs::reclaim::LiveBytes>,
    /// Groups whose log slot is `Damaged` now (STATS
    /// `storage.groups_damaged`, read in O(1)): set by recovery from its
    /// walk over the groups, then one more where a slot becomes damaged (a
    /// load's verification in `group.rs`, `apply::damage`) and one fewer
    /// when a damaged group is deleted (`apply::delete_group`), the only
    /// ways in and out.
    pub damaged_groups: std::sync::atomic::AtomicU64,
    /// Messages stored and readable now, all groups (STATS
    /// `storage.messages_stored`, read in O(1)): the sum of
    /// `LogSlot::stored_messages`, damaged groups counting none. Set by
    /// recovery from its walk over the groups; then every change of a slot
    /// that can change its count adjusts it by the difference, measured
    /// around the change: records applied (`apply::records`, promotion and
    /// damage included), deletion (`apply::delete_group`), a load
    /// (`Group::load_if_unloaded`: damage found, or records past the
    /// recorded head) and retention (the checkpointer's `drop_oldest` of
    /// segments and `trim` of a small group's extents).
    /// The other slot changes (unload, rewrite, marking extents verified)
    /// keep head and floor.
    pub messages_stored: std::sync::atomic::AtomicU64,
    /// Erasure of recalled payloads (format-spec/storage.md section 16,
    /// item 16): the newest journal file that holds a Recall record or
    /// may hold a recalled payload a crash kept from its erasure. While a
    /// journal file at or below it exists, the checkpointer asks for a
    /// checkpoint every `checkpoint_interval_ms`, so that on a quiet node
    /// too the file leaves the replay window, is evacuated (recalled
    /// messages copied erased) and deleted. Raised by `apply::records`
    /// (a Recall applied from file N: N) and at open (every file before the
    /// one the open writes); never lowered.
    pub erase_journal_seq: std::sync::atomic::AtomicU64,
    /// Groups with a non-empty erase list (recalled messages whose
    /// payload a segment may still hold; `Group::erase_ids`): the
    /// checkpointer's erasure pass (`state/erase_segments.rs`) visits them
    /// after each stored checkpoint, and asks for checkpoints while any is
    /// here. Added by `apply::records` and recovery; removed by the pass
    /// once the group's list is empty (or the group is gone).
    pub erase_groups: parking_lot::Mutex<std::collections::BTreeSet<u64>>,
    /// The free-space reserve as background writers ask it (`space.rs`).
    pub reserve: crate::space::Reserve,
}

impl LogContext {
    /// The context of the logs in `config.data_dir`; `holds` are the
    /// engine's snapshot holds, which the trash asks before it removes.
    pub fn new(vfs: Arc<dyn Vfs>, config: Config, holds: Arc<dyn Holding>) -> Self {
        let cache = SegmentCache::new(config.open_segments_max, config.segment_bytes_max);
        let trash = Trash::new(&config.data_dir, holds);
        let shared_files = crate::logs::shared_files::SharedFiles::new(
            vfs.clone(),
            crate::commit::journal::journal_dir(&config.data_dir),
            config.open_segments_max,
        );
        LogContext {
            vfs,
            config,
            cache,
            trash,
            rounds: Default::default(),
            shared_files,
            live: Default::default(),
            damaged_groups: Default::default(),
            messages_stored: Default::default(),
            erase_journal_seq: Default::default(),
            erase_groups: Default::default(),
            reserve: Default::default(),
        }
    }

    /// A slot's stored messages went from `before` to `after`.
    pub fn stored_changed(&self, before: u64, after: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        if after > before {
            self.messages_stored.fetch_add(after - before, Relaxed);
        } else if before > after {
            self.messages_stored.fetch_sub(before - after, Relaxed);
        }
    }

    /// `groups/<shard>/<group id>`: 1,024 shard directories keep every
    /// directory to a few thousand entries up to a few million groups.
    pub fn group_dir(&self, group_id: u64) -> PathBuf {
        group_dir(&self.config.data_dir, group_id)
    }
}

/// The directory of a group under `data_dir`.
pub fn group_dir(data_dir: &Path, group_id: u64) -> PathBuf {
    let shard = group_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54;
    data_dir
        .join("groups")
        .join(format!("{shard:03x}"))
        .join(format!("{group_id:016x}"))
}

/// The state of a group log as a checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogState {
    pub head: u64,
    /// `(base_msg_id, valid bytes)` of every segment, oldest first.
    pub segments: Vec<(u64, u64)>,
}

impl LogState {
    /// Messages `floor..=head`, the floor being the first segment's base
    /// (none without a segment).
    pub fn stored_messages(&self) -> u64 {
        self.segments
            .first()
            .map_or(0, |&(base, _)| (self.head + 1).saturating_sub(base))
    }
}

/// The files a checkpoint must make durable for one group's captured
/// state: written segments, and the group directory (with its two parents)
/// when it is new.
#[derive(Debug)]
pub struct SyncDuties {
    pub group_id: u64,
    pub dir: PathBuf,
    pub bases: Vec<u64>,
    pub dir_new: bool,
}

impl SyncDuties {
    /// Does the syncs (fdatasync per segment, fsync of new directories);
    /// returns how many. A segment or directory that is gone belongs to a
    /// group deleted since the capture, whose tombstone the next checkpoint
    /// writes: skipped.
    pub fn sync(&self, ctx: &LogContext) -> Result<u64> {
        let mut syncs = 0;
        for &base in &self.bases {
            let path = self.dir.join(segment::file_name(base));
            let seg = match ctx
                .cache
                .get(&*ctx.vfs, self.group_id, base, || path.clone())
            {
                Ok(seg) => seg,
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                    continue
                }
                Err(e) => return Err(e),
            };
            seg.sync()?;
            syncs += 1;
        }
        if self.dir_new || syncs > 0 {
            let dirs = if self.dir_new { 3 } else { 1 };
            for dir in self.dir.ancestors().take(dirs) {
                match ctx.vfs.sync_dir(dir) {
                    Ok(()) => syncs += 1,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(format!("fsync dir {}", dir.display()), e)),
                }
            }
        }
        Ok(syncs)
    }
}

/// One segment as the log tracks it.
struct SegmentMeta {
    base_id: u64,
    len: u64,
    /// Built by a verifying scan on first use; the active segment's is built
    /// when the log is loaded and kept current by appends.
    index: OnceLock<Result<SparseIndex, String>>,
}

/// What loading a log found and repaired.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub records_verified: u64,
    /// Bytes cut from the tail of the active segment (torn or unsynced data).
    pub bytes_cut: u64,
    /// `(segment base, valid length)` of each file [`GroupLog::load`]
    /// found longer than its valid records: the caller cuts them
    /// ([`GroupLog::cut_tails`]) when it installs the log, under the
    /// group's log lock, so a load whose group was deleted meanwhile (its
    /// path perhaps reused by a new group of the same id) never writes.
    pub cuts: Vec<(u64, u64)>,
}

/// Whether a read may build a missing sealed-segment index itself (a
/// verifying scan of up to `segment_bytes_max` bytes, under the group's
/// log lock). Requests never do: they refuse, and the maintenance worker
/// builds the index without the lock ([`GroupLog::index_job`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    Allowed,
    Refused,
}

/// A read refused with [`Scan::Refused`]: the sealed segment with this
/// base msg_id needs its index first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeedsIndex {
    pub base: u64,
}

/// The outcome of a read that may be refused for a missing index.
pub type Scanned<T> = std::result::Result<T, NeedsIndex>;

/// `?` for a [`Scanned`] inside a function returning `Result<Scanned<_>>`.
macro_rules! scanned {
    ($e:expr) => {
        match $e? {
            Ok(v) => v,
            Err(needs) => return Ok(Err(needs)),
        }
    };
}
pub(crate) use scanned;

/// The unlocked half of building a sealed segment's index: what the scan
/// needs, copied out of the log under its lock, so the scan itself holds
/// no lock ([`GroupLog::index_job`], [`GroupLog::install_index`]).
pub struct IndexJob {
    group_id: u64,
    base_id: u64,
    len: u64,
    expected_last: u64,
    path: PathBuf,
}

pub struct GroupLog {
    group_id: u64,
    dir: PathBuf,
    segments: Vec<SegmentMeta>,
    head: u64,
    last_timestamp_ms: u64,
    /// Bases of segments written since the last checkpoint synced them.
    unsynced: Vec<u64>,
    /// The group directory itself was created since the last checkpoint.
    dir_unsynced: bool,
    /// Records appended to the active segment but not yet written to its
    /// file: the last `tail.len()` bytes of the active segment's `len`.
    /// Written when it reaches `segment_tail_bytes`, when the segment is
    /// sealed and before a checkpoint syncs the log, so a round costs a
    /// system call only for the groups whose tail filled up (not one per
    /// group it touched). Every byte here is also in the journal written
    /// since the last checkpoint, which bounds the sum over all groups by
    /// `checkpoint_journal_bytes`; a crash loses the tail and the replay
    /// writes it again. Invariant: whole records; only the active segment
    /// has a tail.
    tail: Vec<u8>,
}

/// Records above some id, as borrowed byte ranges of segment mappings.
#[derive(Default)]
pub struct ReadBatch {
    pub chunks: Vec<Chunk>,
    /// Number of records.
    pub count: u64,
    /// Total bytes of the records.
    pub bytes: usize,
    /// Id of the last record returned (the `after` argument when empty).
    pub last_id: u64,
    /// More records exist above `last_id`.
    pub has_more: bool,
}

/// A contiguous run of whole records in one segment. Cloning is cheap (the
/// segment mapping, or the copy of an unwritten tail, is shared).
#[derive(Clone)]
pub struct Chunk {
    source: ChunkSource,
    start: usize,
    end: usize,
}

/// Where a chunk's bytes are.
#[derive(Clone)]
enum ChunkSource {
    /// In the segment file, read through its mapping (no copy).
    Mapped(Arc<SegmentFile>),
    /// Records not yet written to the file, copied out of the log's tail.
    Copied(Arc<[u8]>),
    /// A small group's records where the commit round wrote them: a slice
    /// of a shared (journal) file's mapping (storage v2, `small_read.rs`).
    Shared(Arc<crate::logs::shared_files::SharedMap>),
}

impl ChunkSource {
    fn bytes(&self, start: usize, end: usize) -> &[u8] {
        match self {
            ChunkSource::Mapped(seg) => seg.bytes(start, end),
            ChunkSource::Copied(buf) => &buf[start..end],
            ChunkSource::Shared(map) => &map.bytes()[start..end],
        }
    }
}

impl Chunk {
    /// Whole records at `[start, end)` of a shared file's mapping, which
    /// holds them (the caller checked the range).
    pub(crate) fn shared(
        map: Arc<crate::logs::shared_files::SharedMap>,
        start: usize,
        end: usize,
    ) -> Chunk {
        debug_assert!(start <= end && end <= map.bytes().len());
        Chunk {
            source: ChunkSource::Shared(map),
            start,
            end,
        }
    }

    pub fn bytes(&self) -> &[u8] {
        self.source.bytes(self.start, self.end)
    }

    /// The part `[from, to)` of this chunk (offsets into [`Chunk::bytes`],
    /// which the caller found at record boundaries).
    pub(crate) fn sub(&self, from: usize, to: usize) -> Chunk {
        debug_assert!(from <= to && self.start + to <= self.end);
        Chunk {
            source: self.source.clone(),
            start: self.start + from,
            end: self.start + to,
        }
    }

    /// Whole records made for a reader (a presentation, `edits.rs`).
    pub(crate) fn copied(bytes: Vec<u8>) -> Chunk {
        let end = bytes.len();
        Chunk {
            source: ChunkSource::Copied(bytes.into()),
            start: 0,
            end,
        }
    }

    /// One chunk per record, in order (to send records in another order
    /// without copying them). The bytes were verified when read, but a
    /// mapping shows what is in the file now: if something outside the
    /// engine wrote to it since, a record length that no longer fits is
    /// `GroupDamaged` (of `group_id`) rather than a panic or an endless loop.
    pub fn split_records(&self, group_id: u64) -> Result<Vec<Chunk>> {
        let mut out = Vec::new();
        let mut pos = self.start;
        while pos < self.end {
            let Some(len) = whole_record_len(self.source.bytes(pos, self.end)) else {
                return Err(Error::GroupDamaged {
                    group: group_id,
                    reason: format!(
                        "a record read at chunk offset {pos} changed after it was verified \
                         (the segment file was written outside the engine)"
                    ),
                });
            };
            out.push(Chunk {
                source: self.source.clone(),
                start: pos,
                end: pos + len,
            });
            pos += len;
        }
        Ok(out)
    }
}

/// The length of the record at the start of `buf` if it is at least a
/// record header and fits in `buf`: bytes verified earlier but read again
/// through a mapping may have been changed from outside since.
fn whole_record_len(buf: &[u8]) -> Option<usize> {
    record::peek_len(buf).filter(|&len| len >= record::RECORD_HEADER_BYTES && len <= buf.len())
}

/// One segment as a read sees it: its mapping, its verified index, and (for
/// the active segment) the records still in the log's unwritten tail.
struct SegView<'a> {
    group_id: u64,
    seg: Arc<SegmentFile>,
    index: &'a SparseIndex,
    base_id: u64,
    /// Id of the segment's last record (`base_id - 1` when it is empty).
    last_id: u64,
    /// End of the segment's last record.
    len: usize,
    /// Positions from here on are in `tail`; records never straddle it.
    file_end: usize,
    tail: &'a [u8],
}

impl SegView<'_> {
    /// The segment's bytes from `pos` to the end of the file's part, or of
    /// the tail for positions in it.
    fn at(&self, pos: usize) -> &[u8] {
        match pos.checked_sub(self.file_end) {
            Some(in_tail) => &self.tail[in_tail..],
            None => self.seg.bytes(pos, self.file_end),
        }
    }

    /// Length of the record at `pos`, which starts a record of the verified
    /// segment (an index entry or a walk from one). Its bytes were verified,
    /// but the file can be written under the engine since (a hole left by a
    /// write into a cut file): a length that cannot be a record there is
    /// `GroupDamaged`, never a wrong slice or a walk that does not move.
    fn record_len(&self, pos: usize) -> Result<usize> {
        match record::peek_len(self.at(pos)) {
            Some(len) if len >= record::RECORD_HEADER_BYTES && pos + len <= self.len => Ok(len),
            found => Err(Error::GroupDamaged {
                group: self.group_id,
                reason: format!(
                    "{}: offset {pos}: record length {found:?} where a verified record was \
                     (the file changed under the node)",
                    self.seg.path.display()
                ),
            }),
        }
    }

    /// Position of record `id` (`len` for `last_id + 1`): the nearest index
    /// entry at or below it, then a walk of at most one interval.
    fn position_of(&self, id: u64) -> Result<usize> {
        if id > self.last_id {
            return Ok(self.len);
        }
        let (mut at, pos) = self
            .index
            .floor(id)
            .unwrap_or((self.base_id, SEGMENT_HEADER_BYTES as u32));
        let mut pos = pos as usize;
        while at < id {
            pos += self.record_len(pos)?;
            at += 1;
        }
        Ok(pos)
    }

    /// `(id, position)` of the first record starting at or after `min_pos`
    /// (`(last_id + 1, len)` if none does): the nearest index entry at or
    /// below `min_pos`, then a walk of at most one interval.
    fn first_at_or_after(&self, min_pos: usize) -> Result<(u64, usize)> {
        let (mut id, pos) = self
            .index
            .floor_by_position(min_pos as u64)
            .unwrap_or((self.base_id, SEGMENT_HEADER_BYTES as u32));
        let mut pos = pos as usize;
        while pos < min_pos && id <= self.last_id {
            pos += self.record_len(pos)?;
            id += 1;
        }
        Ok((id, pos))
    }

    /// Appends the records in `[start, end)` as chunks: the part in the
    /// file borrowed from the mapping, the part in the tail copied.
    fn push_chunks(self, chunks: &mut Vec<Chunk>, start: usize, end: usize) {
        // Records never straddle `file_end` (the tail holds whole ones).
        if start < end.min(self.file_end) {
            chunks.push(Chunk {
                source: ChunkSource::Mapped(self.seg),
                start,
                end: end.min(self.file_end),
            });
        }
        if end > self.file_end {
            let from = start.max(self.file_end) - self.file_end;
            let copy: Arc<[u8]> = Arc::from(&self.tail[from..end - self.file_end]);
            let len = copy.len();
            chunks.push(Chunk {
                source: ChunkSource::Copied(copy),
                start: 0,
                end: len,
            });
        }
    }
}

impl ReadBatch {
    fn empty(after: u64, has_more: bool) -> Self {
        ReadBatch {
            last_id: after,
            has_more,
            ..Default::default()
        }
    }

    /// The records, decoded (their bytes were verified when the segment was).
    /// If the file was written outside the engine since, so that a record no
    /// longer decodes, the iteration ends there (it never panics or loops).
    pub fn records(&self) -> impl Iterator<Item = record::RecordRef<'_>> {
        self.chunks
            .iter()
            .flat_map(|c| ChunkRecords { buf: c.bytes() })
    }
}

struct ChunkRecords<'a> {
    buf: &'a [u8],
}

impl<'a> Iterator for ChunkRecords<'a> {
    type Item = record::RecordRef<'a>;
    fn next(&mut self) -> Option<Self::Item> {
        let decoded = whole_record_len(self.buf).and_then(|len| {
            let (bytes, rest) = self.buf.split_at(len);
            Some((record::decode_header(bytes, usize::MAX).ok()?, bytes, rest))
        });
        let Some((header, bytes, rest)) = decoded else {
            if !self.buf.is_empty() {
                // Verified bytes changed under the mapping: stop here.
                log::error!(
                    "a record changed after it was verified (segment written outside the engine)"
                );
                self.buf = &[];
            }
            return None;
        };
        self.buf = rest;
        Some(record::RecordRef { header, bytes })
    }
}

impl GroupLog {
    /// A new group's log, in memory only: empty, its first segment (base 1)
    /// named but not created. [`GroupLog::create_files`] makes its files
    /// before anything is appended: the commit thread, when it applies the
    /// group's creation (replay: at once). Until then nothing touches them:
    /// the log is empty, so reads return before opening a segment, and
    /// checkpoints run between rounds, after the creation was applied.
    /// The log of a group whose next record is `base` and whose files
    /// [`GroupLog::create_files`] just made: one empty segment `base`, not
    /// synced yet (the next checkpoint syncs it and its directories).
    pub fn empty_at(ctx: &LogContext, group_id: u64, base: u64) -> GroupLog {
        GroupLog {
            group_id,
            dir: ctx.group_dir(group_id),
            segments: vec![SegmentMeta {
                base_id: base,
                len: SEGMENT_HEADER_BYTES as u64,
                index: OnceLock::from(Ok(SparseIndex::new(base, ctx.config.index_interval_bytes))),
            }],
            head: base - 1,
            last_timestamp_ms: 0,
            unsynced: vec![base],
            dir_unsynced: true,
            tail: Vec::new(),
        }
    }

    /// Makes the files of a group taking its first segment (a new group's
    /// first record, or a small group's promotion): its directory and
    /// segment `base` with its header. A directory left at its path (by an
    /// earlier incarnation of the id whose removal a crash undid, or by a
    /// promotion a crash made moot) goes to the trash first. Runs with no
    /// lock held. A retry after a failure part-way (a full disk) starts
    /// over: the half-made directory goes to the trash.
    pub fn create_files(ctx: &LogContext, group_id: u64, base: u64) -> Result<()> {
        let dir = ctx.group_dir(group_id);
        ctx.trash.put(&*ctx.vfs, group_id, &dir)?;
        ctx.vfs
            .create_dir_all(&dir)
            .map_err(|e| Error::write(format!("mkdir {}", dir.display()), e))?;
        let header = SegmentHeader {
            group_id,
            base_msg_id: base,
            created_ms: crate::clock::now_ms(),
        };
        ctx.cache
            .create(&*ctx.vfs, &dir.join(segment::file_name(base)), &header)?;
        Ok(())
    }

    /// Opens a log whose state a checkpoint recorded. The active segment is
    /// verified: everything up to the checkpointed length must be intact
    /// (it was fsynced); valid records written after it are kept (the journal
    /// replay then skips them) and a torn tail after them is cut.
    pub fn load(
        ctx: &LogContext,
        group_id: u64,
        state: &LogState,
    ) -> Result<(GroupLog, LoadReport)> {
        let dir = ctx.group_dir(group_id);
        let Some(&(active_base, active_len)) = state.segments.last() else {
            return Err(Error::Corrupt {
                path: ctx.config.data_dir.join("checkpoint"),
                group: Some(group_id),
                offset: 0,
                reason: "group without segments".into(),
            });
        };
        let segments = state
            .segments
            .iter()
            .map(|&(base_id, len)| SegmentMeta {
                base_id,
                len,
                index: OnceLock::new(),
            })
            .collect();
        let mut log = GroupLog {
            group_id,
            dir,
            segments,
            head: state.head,
            last_timestamp_ms: 0,
            unsynced: Vec::new(),
            dir_unsynced: false,
            tail: Vec::new(),
        };
        let (path, _, file_len, scan) = log.scan_whole(ctx, active_base)?;
        if scan.header.base_msg_id != active_base
            || scan.valid_len < active_len
            || scan.last_id < state.head
        {
            let why = scan
                .stopped
                .map(|s| s.to_string())
                .unwrap_or_else(|| "data ends early".into());
            return Err(Error::Corrupt {
                path,
                group: Some(group_id),
                offset: scan.valid_len,
                reason: format!(
                    "checkpointed data damaged (expected {active_len} bytes up to id {}): {why}",
                    state.head
                ),
            });
        }
        let mut report = LoadReport {
            records_verified: scan.records,
            bytes_cut: file_len - scan.valid_len,
            cuts: Vec::new(),
        };
        if report.bytes_cut > 0 {
            report.cuts.push((active_base, scan.valid_len));
        }
        if file_len > active_len {
            log.unsynced.push(active_base);
        }
        report.records_verified = scan.records;
        log.adopt_scan_as_active(scan);
        log.adopt_later_segments(ctx, &mut report)?;
        Ok((log, report))
    }

    /// Cuts the files [`GroupLog::load`] found longer than their valid
    /// records (`report.cuts`) to their valid length. Called by whoever
    /// installs the loaded log, under the group's log lock.
    pub fn cut_tails(&self, ctx: &LogContext, cuts: &[(u64, u64)]) -> Result<()> {
        for &(base, len) in cuts {
            ctx.cache
                .get(&*ctx.vfs, self.group_id, base, || self.segment_path(base))?
                .truncate(len)?;
        }
        Ok(())
    }

    /// Takes in the segment files started after the recorded state: a file
    /// named for `head + 1` whose header is this group's and whose valid
    /// records continue the ids becomes the active segment (its torn tail
    /// cut), and so on. Their records were given msg_ids (and, unless the
    /// journal still holds them, cannot be had from anywhere else), so they
    /// are kept rather than replaced: no id is handed out twice. A file
    /// that fails its header checks or holds no valid record is left alone
    /// as a stale file (removed when the group next rolls to its base).
    fn adopt_later_segments(&mut self, ctx: &LogContext, report: &mut LoadReport) -> Result<()> {
        loop {
            let Some(base) = self.head.checked_add(1) else {
                return Ok(());
            };
            let path = self.segment_path(base);
            if !ctx.vfs.exists(&path) {
                return Ok(());
            }
            let scanned = self.scan_whole(ctx, base);
            let (file_len, scan) = match scanned {
                Ok((_, _, file_len, scan))
                    if scan.header.base_msg_id == base && scan.records > 0 =>
                {
                    (file_len, scan)
                }
                _ => {
                    ctx.cache.forget(self.group_id, base);
                    return Ok(());
                }
            };
            if file_len > scan.valid_len {
                report.cuts.push((base, scan.valid_len));
                report.bytes_cut += file_len - scan.valid_len;
            }
            report.records_verified += scan.records;
            // Neither the file nor its directory entry is known durable:
            // the next checkpoint syncs both (a synced segment makes it
            // sync the group directory too).
            self.unsynced.push(base);
            self.push_scanned_active(base, scan);
        }
    }

    /// Opens segment `base` and verifies all of it.
    fn scan_whole(
        &self,
        ctx: &LogContext,
        base: u64,
    ) -> Result<(PathBuf, Arc<SegmentFile>, u64, segment::ScanOutcome)> {
        let path = self.segment_path(base);
        let seg = ctx
            .cache
            .get(&*ctx.vfs, self.group_id, base, || path.clone())?;
        let file_len = seg.file_len()?;
        let scan = segment::scan(
            &seg,
            file_len,
            self.group_id,
            record::RECORD_BYTES_STORED_MAX,
            ctx.config.index_interval_bytes,
        )?;
        Ok((path, seg, file_len, scan))
    }

    /// Makes the newest segment what a verifying scan of it found: its
    /// valid length, its index, and the log's head and newest timestamp.
    fn adopt_scan_as_active(&mut self, scan: segment::ScanOutcome) {
        // Invariant: segments is never empty.
        let active = self
            .segments
            .last_mut()
            .expect("invariant: a log has a segment");
        active.len = scan.valid_len;
        active.index = OnceLock::from(Ok(scan.index));
        self.head = scan.last_id;
        self.last_timestamp_ms = scan.last_timestamp_ms;
    }

    /// Appends segment `base_id`, scanned, as the new active segment.
    fn push_scanned_active(&mut self, base_id: u64, scan: segment::ScanOutcome) {
        self.segments.push(SegmentMeta {
            base_id,
            len: scan.valid_len,
            index: OnceLock::new(),
        });
        self.adopt_scan_as_active(scan);
    }

    fn segment_path(&self, base_id: u64) -> PathBuf {
        self.dir.join(segment::file_name(base_id))
    }

    fn start_segment(&mut self, ctx: &LogContext, base_id: u64) -> Result<()> {
        let path = self.segment_path(base_id);
        // The in-memory state says this segment does not exist; a file at
        // this path is a leftover of writes after the last checkpoint that
        // the journal did not keep (power loss under `never`).
        if ctx.vfs.exists(&path) {
            ctx.cache.forget(self.group_id, base_id);
            ctx.vfs
                .remove_file(&path)
                .map_err(|e| Error::io(format!("remove stale {}", path.display()), e))?;
        }
        let header = SegmentHeader {
            group_id: self.group_id,
            base_msg_id: base_id,
            created_ms: crate::clock::now_ms(),
        };
        ctx.cache.create(&*ctx.vfs, &path, &header)?;
        self.segments.push(SegmentMeta {
            base_id,
            len: SEGMENT_HEADER_BYTES as u64,
            index: OnceLock::from(Ok(SparseIndex::new(
                base_id,
                ctx.config.index_interval_bytes,
            ))),
        });
        self.unsynced.push(base_id);
        Ok(())
    }

    /// The newest msg_id (0 for an empty group).
    pub fn head(&self) -> u64 {
        self.head
    }

    /// The oldest msg_id still stored (head + 1 when nothing is).
    pub fn floor(&self) -> u64 {
        self.segments[0].base_id
    }

    pub fn last_timestamp_ms(&self) -> u64 {
        self.last_timestamp_ms
    }

    pub fn state(&self) -> LogState {
        LogState {
            head: self.head,
            segments: self.segments.iter().map(|s| (s.base_id, s.len)).collect(),
        }
    }

    /// Appends whole, verified records whose ids continue `head` densely.
    /// They are readable at once; they reach the active segment's file with
    /// its tail (see `tail`). A segment that cannot take the next record is
    /// sealed (its tail written) and a new one started. On an error the
    /// records taken in before it stay taken in (`head` says how far it
    /// got), so a retry passes only the ones above `head`.
    pub fn append(&mut self, ctx: &LogContext, records: &[u8]) -> Result<()> {
        let seg_max = ctx.config.segment_bytes_max;
        let mut start = 0;
        while start < records.len() {
            // Invariant: segments is never empty.
            let active = self
                .segments
                .last()
                .expect("invariant: a log has a segment");
            let (base, mut pos) = (active.base_id, active.len);
            let mut end = start;
            while end < records.len() {
                // Invariant: the caller passes whole records.
                let len =
                    record::peek_len(&records[end..]).expect("invariant: whole records") as u64;
                let empty = pos == SEGMENT_HEADER_BYTES as u64;
                if pos + len > seg_max && !empty {
                    break;
                }
                pos += len;
                end += len as usize;
            }
            if end == start {
                // Sealing: the segment's file gets its last records first.
                self.flush_tail(ctx)?;
                self.start_segment(ctx, self.head + 1)?;
                continue;
            }
            let write_pos = self.segments.last().map(|s| s.len).unwrap_or_default();
            self.tail.extend_from_slice(&records[start..end]);
            let active = self
                .segments
                .last_mut()
                .expect("invariant: a log has a segment");
            let index = active.index.get_mut().and_then(|r| r.as_mut().ok());
            let mut at = start;
            let mut rec_pos = write_pos;
            let mut id = self.head;
            let mut last_ts = self.last_timestamp_ms;
            let mut index = index;
            while at < end {
                let h = record::decode_header(&records[at..], usize::MAX)
                    .expect("invariant: whole records");
                id += 1;
                debug_assert_eq!(h.msg_id, id, "ids must continue the head densely");
                if let Some(ix) = index.as_deref_mut() {
                    // Invariant: rec_pos < segment_bytes_max <= u32::MAX.
                    ix.observe(id, rec_pos as u32);
                }
                last_ts = h.timestamp_ms;
                rec_pos += h.record_len as u64;
                at += h.record_len as usize;
            }
            active.len = rec_pos;
            debug_assert_eq!(active.base_id, base);
            self.head = id;
            self.last_timestamp_ms = last_ts;
            start = end;
        }
        // Also with nothing new: a flush a full disk stopped is tried again.
        if self.tail.len() >= ctx.config.segment_tail_bytes {
            self.flush_tail(ctx)?;
        }
        Ok(())
    }

    /// Writes the unwritten tail to the active segment's file (one write).
    /// On failure nothing changes: the tail stays, and the bytes the write
    /// may have left in the file past its written length are overwritten
    /// by the next attempt (or cut at the next open).
    pub fn flush_tail(&mut self, ctx: &LogContext) -> Result<()> {
        if self.tail.is_empty() {
            return Ok(());
        }
        // Invariant: segments is never empty.
        let active = self
            .segments
            .last()
            .expect("invariant: a log has a segment");
        let (base, end) = (active.base_id, active.len);
        let written = end - self.tail.len() as u64;
        let seg = ctx
            .cache
            .get(&*ctx.vfs, self.group_id, base, || self.segment_path(base))?;
        seg.write_at(&self.tail, written)?;
        if !seg.mapping_covers(end) {
            ctx.cache.forget(self.group_id, base);
        }
        self.tail.clear();
        if self.unsynced.last() != Some(&base) {
            self.unsynced.push(base);
        }
        Ok(())
    }

    /// Seals the active segment (its tail written) and starts a new one at
    /// `head + 1`, as `append` does when a record does not fit: the
    /// erasure pass (`erase_segments.rs`) does it so that a recalled
    /// message in the active segment is in a sealed one it may rewrite.
    /// Returns whether it rolled (not for an active segment without
    /// records). The new segment is synced by the next checkpoint.
    pub fn roll(&mut self, ctx: &LogContext) -> Result<bool> {
        let active = self
            .segments
            .last()
            .expect("invariant: a log has a segment");
        if active.len == SEGMENT_HEADER_BYTES as u64 {
            return Ok(false);
        }
        self.flush_tail(ctx)?;
        self.start_segment(ctx, self.head + 1)?;
        Ok(true)
    }

    /// Takes what must be synced before a checkpoint may name the log's
    /// current state (checkpoint step K2; the syncs run in K3, outside the
    /// group's locks). The caller wrote the tail first.
    pub fn take_sync_duties(&mut self) -> SyncDuties {
        debug_assert!(self.tail.is_empty(), "tail written before a capture");
        SyncDuties {
            group_id: self.group_id,
            dir: self.dir.clone(),
            bases: std::mem::take(&mut self.unsynced),
            dir_new: std::mem::take(&mut self.dir_unsynced),
        }
    }

    /// Neither the log's segment files nor its directory's entry (nor its
    /// shard directory's) are known durable: the next checkpoint syncs them
    /// all, as for a new group's (a log adopted from the files a promotion
    /// left, whose creation nothing synced, `promotion_left.rs`).
    pub fn files_not_known_durable(&mut self) {
        self.unsynced = self.segments.iter().map(|s| s.base_id).collect();
        self.dir_unsynced = true;
    }

    /// True if writes since the last checkpoint have not been synced.
    pub fn needs_sync(&self) -> bool {
        !self.unsynced.is_empty() || self.dir_unsynced
    }

    /// True if appended records wait in memory for their segment's file.
    pub fn has_unwritten_tail(&self) -> bool {
        !self.tail.is_empty()
    }

    fn segment_index(&self, base: u64) -> Option<usize> {
        self.segments
            .binary_search_by_key(&base, |s| s.base_id)
            .ok()
    }

    /// The verified sparse index of segment `i`, scanning it on first use
    /// if `scan` allows (else `NeedsIndex`).
    fn index_of(
        &self,
        ctx: &LogContext,
        i: usize,
        seg: &SegmentFile,
        scan: Scan,
    ) -> Result<Scanned<&SparseIndex>> {
        let meta = &self.segments[i];
        if meta.index.get().is_none() {
            if scan == Scan::Refused {
                return Ok(Err(NeedsIndex { base: meta.base_id }));
            }
            let job = IndexJob {
                group_id: self.group_id,
                base_id: meta.base_id,
                len: meta.len,
                expected_last: self.last_id_of(i),
                path: self.segment_path(meta.base_id),
            };
            let _ = meta.index.set(job.scan(ctx, seg));
        }
        // Invariant: set just above if it was empty.
        match meta.index.get().expect("invariant: index initialised") {
            Ok(ix) => Ok(Ok(ix)),
            Err(reason) => Err(Error::GroupDamaged {
                group: self.group_id,
                reason: reason.clone(),
            }),
        }
    }

    /// Id of the last record of segment `i`.
    fn last_id_of(&self, i: usize) -> u64 {
        self.segments
            .get(i + 1)
            .map(|n| n.base_id - 1)
            .unwrap_or(self.head)
    }

    /// What building the index of segment `base` needs, if it is a segment
    /// of this log without an index yet. Taken under the log's lock; the
    /// scan ([`IndexJob::build`]) then runs without it.
    pub fn index_job(&self, base: u64) -> Option<IndexJob> {
        let i = self.segment_index(base)?;
        let meta = &self.segments[i];
        meta.index.get().is_none().then(|| IndexJob {
            group_id: self.group_id,
            base_id: base,
            len: meta.len,
            expected_last: self.last_id_of(i),
            path: self.segment_path(base),
        })
    }

    /// Installs an index built by `job` (a failed build makes reads of
    /// that segment `GroupDamaged`). Memory only: callers hold the log's
    /// lock for reading. A segment dropped or changed since is left alone.
    pub fn install_index(&self, job: &IndexJob, built: Result<SparseIndex, String>) {
        let Some(i) = self.segment_index(job.base_id) else {
            return;
        };
        let meta = &self.segments[i];
        if meta.len == job.len && self.last_id_of(i) == job.expected_last {
            let _ = meta.index.set(built);
        }
    }

    /// Segment `i` opened for reading: its file checked to still hold what
    /// the log wrote to it, mapped, its index verified (a verifying scan on
    /// first use), the tail attached if it is the active segment.
    fn view(&self, ctx: &LogContext, i: usize, scan: Scan) -> Result<Scanned<SegView<'_>>> {
        let meta = &self.segments[i];
        let seg = ctx
            .cache
            .get(&*ctx.vfs, self.group_id, meta.base_id, || {
                self.segment_path(meta.base_id)
            })
            .map_err(|e| match e {
                // A file the log names, deleted outside the node: damage,
                // like a cut one (`io::check_mapped_len`), not an I/O error.
                Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                    Error::GroupDamaged {
                        group: self.group_id,
                        reason: format!(
                            "{}: file is missing but the log holds {} bytes in it (deleted \
                             outside the node)",
                            self.segment_path(meta.base_id).display(),
                            meta.len
                        ),
                    }
                }
                other => other,
            })?;
        // The active segment's last records may still be in the tail:
        // positions from `file_end` on are in `self.tail`.
        let tail: &[u8] = if i + 1 == self.segments.len() {
            &self.tail
        } else {
            &[]
        };
        let len = meta.len as usize;
        // Before anything touches the mapping: a file cut under the engine
        // is GroupDamaged here, not SIGBUS below (one fstat per segment a
        // read visits; the windows this leaves are in segment.rs).
        seg.check_len(self.group_id, (len - tail.len()) as u64)?;
        seg.ensure_mapped()?;
        let index = scanned!(self.index_of(ctx, i, &seg, scan));
        Ok(Ok(SegView {
            group_id: self.group_id,
            seg,
            index,
            base_id: meta.base_id,
            last_id: self
                .segments
                .get(i + 1)
                .map(|n| n.base_id - 1)
                .unwrap_or(self.head),
            len,
            file_end: len - tail.len(),
            tail,
        }))
    }

    /// Reads the records above `after`, at most `max_count` of them and at
    /// most `max_bytes` bytes, except that the first record is returned
    /// whatever its size. `after` below `floor() - 1` reads from the floor;
    /// callers that must not skip check `floor()` first.
    pub fn read(
        &self,
        ctx: &LogContext,
        after: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<ReadBatch> {
        let read = self.read_with(ctx, Scan::Allowed, after, max_count, max_bytes)?;
        Ok(read.expect("invariant: a read that may scan is never refused"))
    }

    /// [`Self::read`], refused with `NeedsIndex` when it reaches a sealed
    /// segment whose index is not built and `scan` is `Refused`.
    pub fn read_with(
        &self,
        ctx: &LogContext,
        scan: Scan,
        after: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Scanned<ReadBatch>> {
        if after >= self.head || max_count == 0 {
            return Ok(Ok(ReadBatch::empty(after, after < self.head)));
        }
        let first = (after + 1).max(self.floor());
        let mut batch = ReadBatch::empty(after, false);
        let mut i = self.segments.partition_point(|s| s.base_id <= first) - 1;
        let mut next_id = first;
        loop {
            let view = scanned!(self.view(ctx, i, scan));
            let mut pos = view.position_of(next_id)?;
            let mut id = next_id;
            let start = pos;
            let mut full = false;
            while id <= view.last_id {
                let len = view.record_len(pos)?;
                if batch.count as usize >= max_count
                    || (batch.count > 0 && batch.bytes + len > max_bytes)
                {
                    full = true;
                    break;
                }
                pos += len;
                batch.bytes += len;
                batch.count += 1;
                id += 1;
            }
            view.push_chunks(&mut batch.chunks, start, pos);
            batch.last_id = id - 1;
            next_id = id;
            if full || id > self.head {
                batch.has_more = id <= self.head;
                return Ok(Ok(batch));
            }
            i += 1;
        }
    }

    /// The newest records below `before` and not below `lowest`: at most
    /// `max_count` of them and at most `max_bytes` bytes, except that the
    /// newest is returned whatever its size; in ascending id order
    /// (`has_more` is not set: the caller knows what lies below).
    ///
    /// Work is bounded by what is returned, never by the distance down to
    /// `lowest`: it walks segments backwards from the one holding
    /// `before - 1`, and in each it finds where the byte budget runs out
    /// from positions alone (a run of records is as long as the distance
    /// between the positions of its ends), with the sparse index and a walk
    /// of at most one interval. Only the segments the answer touches are
    /// opened (and verified on first use), and only the answer's records
    /// are walked, once, by [`Self::read`].
    pub fn read_before(
        &self,
        ctx: &LogContext,
        scan: Scan,
        before: u64,
        lowest: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<Scanned<ReadBatch>> {
        let before = before.min(self.head + 1);
        let lowest = lowest
            .max(self.floor())
            .max(before.saturating_sub(max_count as u64));
        if lowest >= before {
            return Ok(Ok(ReadBatch::empty(before.saturating_sub(1), false)));
        }
        // Invariant from here: floor() <= lowest < before <= head + 1, so
        // every id in [lowest, before) is stored.
        let mut start = before; // the oldest id taken so far
        let mut budget = max_bytes;
        let mut i = self.segment_of(before - 1);
        loop {
            let view = scanned!(self.view(ctx, i, scan));
            let end = view.position_of(start)?;
            let seg_lowest = lowest.max(view.base_id);
            let lowest_pos = view.position_of(seg_lowest)?;
            if end - lowest_pos <= budget {
                // All of this segment's part fits.
                budget -= end - lowest_pos;
                start = seg_lowest;
                if seg_lowest == lowest {
                    break;
                }
                // seg_lowest is this segment's base, above lowest >= floor:
                // an older segment exists.
                i -= 1;
                continue;
            }
            // The budget runs out here: the oldest record that fits is the
            // first one starting at or after `end - budget`.
            start = view.first_at_or_after(end - budget)?.0;
            break;
        }
        if start == before {
            start = before - 1; // the newest record, whatever its size
        }
        let mut batch =
            scanned!(self.read_with(ctx, scan, start - 1, (before - start) as usize, usize::MAX));
        batch.has_more = false;
        Ok(Ok(batch))
    }

    /// Id of the last record of segment `i`: the next one's base − 1, or
    /// the head for the active segment.
    pub fn segment_last_id(&self, i: usize) -> u64 {
        self.segments
            .get(i + 1)
            .map_or(self.head, |next| next.base_id - 1)
    }

    /// Whether segment `i` is sealed (not the active one).
    pub fn is_sealed(&self, i: usize) -> bool {
        i + 1 < self.segments.len()
    }

    /// Header of the first record of segment `segment_i`, for dedup rebuilds.
    pub fn first_header_from(
        &self,
        ctx: &LogContext,
        scan: Scan,
        segment_i: usize,
    ) -> Result<Scanned<Option<RecordHeader>>> {
        let b = scanned!(self.read_with(
            ctx,
            scan,
            self.segments[segment_i].base_id.saturating_sub(1),
            1,
            0,
        ));
        let first = b.records().next().map(|r| r.header);
        Ok(Ok(first))
    }

    /// Index of the segment holding `msg_id` (clamped to the stored range).
    pub fn segment_of(&self, msg_id: u64) -> usize {
        self.segments
            .partition_point(|s| s.base_id <= msg_id)
            .saturating_sub(1)
    }

    /// Base id of segment `i`.
    pub fn segment_base(&self, i: usize) -> u64 {
        self.segments[i].base_id
    }

    /// Sealed segments, oldest first, as the retention planner sees them.
    pub fn sealed_segments(
        &self,
        ctx: &LogContext,
        with_timestamps: bool,
    ) -> Result<Vec<crate::logs::retention::SealedSegment>> {
        let mut out = Vec::with_capacity(self.segments.len().saturating_sub(1));
        for i in 0..self.segments.len().saturating_sub(1) {
            let next_first_timestamp_ms = if with_timestamps {
                self.first_header_from(ctx, Scan::Allowed, i + 1)?
                    .expect("invariant: a read that may scan is never refused")
                    .map_or(u64::MAX, |h| h.timestamp_ms)
            } else {
                u64::MAX
            };
            out.push(crate::logs::retention::SealedSegment {
                last_id: self.segments[i + 1].base_id - 1,
                bytes: self.segments[i].len,
                next_first_timestamp_ms,
            });
        }
        Ok(out)
    }

    /// Bytes of all segments.
    pub fn total_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    /// Forgets the `n` oldest sealed segments (the floor rises) and returns
    /// their paths; the caller deletes the files once a checkpoint no longer
    /// names them.
    pub fn drop_oldest(&mut self, ctx: &LogContext, n: usize) -> Vec<PathBuf> {
        let n = self.droppable(n);
        let dropped: Vec<SegmentMeta> = self.segments.drain(..n).collect();
        dropped
            .iter()
            .map(|s| {
                ctx.cache.forget(self.group_id, s.base_id);
                self.segment_path(s.base_id)
            })
            .collect()
    }

    /// How many of the `n` oldest segments can be dropped: all but the
    /// active one.
    pub fn droppable(&self, n: usize) -> usize {
        n.min(self.segments.len() - 1)
    }
}

impl IndexJob {
    /// The verifying scan of the segment: its index, or why the segment
    /// is damaged. Holds no lock: the segment is sealed, so its bytes up
    /// to `len` no longer change. `None` when the file cannot be opened or
    /// is shorter than the log says: a read meets the same error before it
    /// asks for the index, and reports it (nothing is installed for it).
    pub fn build(&self, ctx: &LogContext) -> Option<Result<SparseIndex, String>> {
        let seg = ctx
            .cache
            .get(&*ctx.vfs, self.group_id, self.base_id, || self.path.clone())
            .ok()?;
        seg.check_len(self.group_id, self.len).ok()?;
        Some(self.scan(ctx, &seg))
    }

    fn scan(&self, ctx: &LogContext, seg: &SegmentFile) -> Result<SparseIndex, String> {
        segment::scan(
            seg,
            self.len,
            self.group_id,
            record::RECORD_BYTES_STORED_MAX,
            ctx.config.index_interval_bytes,
        )
        .map_err(|e| e.to_string())
        .and_then(|s| {
            if s.valid_len == self.len
                && s.last_id == self.expected_last
                && s.header.base_msg_id == self.base_id
            {
                Ok(s.index)
            } else {
                let why = s
                    .stopped
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "ids do not match".into());
                Err(format!(
                    "{}: offset {}: {why} (expected ids {}..={} in {} bytes)",
                    seg.path.display(),
                    s.valid_len,
                    self.base_id,
                    self.expected_last,
                    self.len
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_record(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        record::encode_into(
            &record::NewRecord {
                msg_id: 1,
                timestamp_ms: 2,
                sender_id: 3,
                client_msg_id: 4,
                payload,
            },
            &mut out,
        );
        out
    }

    fn chunk_of(bytes: Vec<u8>) -> Chunk {
        let end = bytes.len();
        Chunk {
            source: ChunkSource::Copied(bytes.into()),
            start: 0,
            end,
        }
    }

    #[test]
    fn record_lengths_changed_after_verification_are_an_error_not_a_panic_or_a_loop() {
        let good = one_record(b"hello");
        assert_eq!(chunk_of(good.clone()).split_records(9).unwrap().len(), 1);
        // Length 0 (the old code looped forever), a length beyond the chunk
        // (it panicked in split_at), and one shorter than a record header.
        for len in [1u32 << 20, 10, 0] {
            let mut bad = good.clone();
            bad.extend_from_slice(&good);
            let at = good.len();
            bad[at..at + 4].copy_from_slice(&len.to_le_bytes());
            let chunk = chunk_of(bad);
            match chunk.split_records(9) {
                Err(Error::GroupDamaged { group: 9, .. }) => {}
                Err(other) => panic!("len {len}: {other}"),
                Ok(v) => panic!("len {len}: {} chunks", v.len()),
            }
            let batch = ReadBatch {
                chunks: vec![chunk],
                ..Default::default()
            };
            assert_eq!(
                batch.records().count(),
                1,
                "len {len}: stops at the bad one"
            );
        }
    }
}
