//! Space reclamation for small groups (storage v2 step S6, design 5.2 and
//! 5.4): live records of small groups are copied out of old shared files
//! so those files can be deleted. Two jobs, run by the checkpointer thread
//! after each stored checkpoint (K7), never by the commit thread or a
//! request:
//!
//! - **evacuation**: a journal file before the older kept manifest's replay
//!   position that still holds small groups' records (live bytes > 0) is
//!   walked (its frames' Records entries name the groups); each group's
//!   extents in it, per run of consecutive extents, are copied into one
//!   extent of the current *cold file* (`cold.rs`);
//! - **compaction**: the planner (`reclaim::plan`) picks sealed cold files
//!   whose live bytes are low (`S > 2L + C`, or dead); their live extents,
//!   found by walking the self-describing file, are copied the same way.
//!
//! A copy is installed in the group's extent list only if the extents it
//! replaces are still exactly there (`ExtentList::replace`, raft-engine's
//! rewrite gate): a promotion, a deletion or a later rewrite makes it dead
//! on arrival. The cold file is fdatasynced (and its directory entry
//! fsynced when the file is new) **before** any install, so a checkpoint
//! that records a moved extent names durable bytes. Nothing is journaled:
//! until a stored manifest records the new extents, recovery uses the old
//! places, which stay until two checkpoints no longer pin them (D6,
//! `pins.rs`); a crash leaves at worst an unnamed cold file, deleted by a
//! later checkpoint.
//!
//! Every copy writes the group's recalled messages in erased form
//! (`Group::erase_recalled`; storage.md section 3, "Erasure"), so a journal file
//! that held a recalled payload leaves it behind when it is deleted; the
//! checkpointer keeps checkpoints coming until it is (`erase_journal_seq`,
//! storage.md section 16 item 16). A small group's message recalled once
//! its record is in a cold file is on the group's erase list (GroupPut bit
//! 6, `apply::records`); every cold file holding a listed id is compacted
//! in full ahead of the plan, and the ids cleared after the install
//! (`erase_cold`). A run holding a listed id whose records do not check
//! out cannot be copied erased, ever: its group is marked damaged
//! (`small_log::damage`) rather than retried at every checkpoint; this
//! is the one place a small slot changes kind off the applier's thread,
//! under the group's checkpoint lock, which the applier holds while it
//! uses the slot.
//!
//! Bounds (format-spec/storage.md section 9, "Reclaiming small groups'
//! space"): a small group's byte is copied by evacuation at most once (a
//! cold file is never evacuated), and compaction copies less than it frees
//! (a victim's usage is below 1/2), so cold files hold at most `2L + C`
//! (`L` their live bytes, `C` one cold file) plus the files awaiting their
//! second checkpoint. Cost: the live bytes copied plus one walk of each
//! victim file; the group's locks are held only to clone its list and to
//! install, in memory.
//!
//! The free-space reserve (`space.rs`): a file is started only if its live
//! bytes fit above `disk_free_min_bytes`, and each copy is checked again
//! before it is written; a pass that finds no room ends (counted, logged
//! once a spell) and the next checkpoint's pass tries again.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::catalog::Catalog;
use crate::commit::context::Context;
use crate::commit::journal::{self, EntryKind};
use crate::error::Result;
use crate::group::{Group, LogSlot};
use crate::logs::cold::{self, ColdScanner, ColdWriter};
use crate::logs::extents::{Extent, FileId, FileKind, Piece};
use crate::logs::group_log::LogContext;
use crate::logs::record;

/// What a reclamation pass did (engine stats, tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReclaimStats {
    /// Journal files whose small records were copied out.
    pub journal_files_evacuated: u64,
    /// Cold files compacted.
    pub cold_files_compacted: u64,
    /// Record bytes copied into cold files (extent headers excluded).
    pub bytes_copied: u64,
    /// Copies not installed: the group changed meanwhile.
    pub stale_copies: u64,
}

/// One copy waiting for its install: the extents it replaces (a run of
/// the group's list), the id of their first record, the new extent, and
/// the group's quiet ids among the copied records before the copy (the
/// recalled messages it wrote erased are among them).
struct Copy {
    group: Arc<Group>,
    old: Vec<Extent>,
    first_id: u64,
    new: Extent,
    quiet: Vec<u64>,
}

/// A run of a group's records a copy left where it was: its records do
/// not check out (`copy_run`).
struct LeftInPlace {
    group: Arc<Group>,
    ids: std::ops::Range<u64>,
    why: String,
}

/// The writer of cold files and the jobs that fill them (module docs).
/// Owned by the checkpointer thread.
pub(crate) struct Reclaimer {
    writer: ColdWriter,
    dir: PathBuf,
    /// The current cold file's directory entry is not synced yet.
    dir_unsynced: bool,
    /// Cold files compacted to erase a recalled payload, until K7 deletes
    /// them (`erasing`).
    erased: BTreeSet<FileId>,
}

impl Reclaimer {
    /// A reclaimer whose first cold file is numbered above every cold
    /// file that exists or that a checkpoint may still name: those in the
    /// journal directory, those the restored state's extents name (the
    /// live accounting holds them, present or not) and those either kept
    /// manifest pins (`pinned`, raw file ids). A cold file number is never
    /// given twice while anything names the old file of that number: a
    /// lost newest cold file would otherwise get its number again, and the
    /// extents naming it would point into other groups' records (a cold
    /// file is never appended to after a restart either). The existing
    /// ones are accounted with their lengths, sealed.
    pub fn new(ctx: &LogContext, pinned: impl IntoIterator<Item = u64>) -> Reclaimer {
        let dir = journal::journal_dir(&ctx.config.data_dir);
        let mut live = ctx.live.lock();
        let named = live
            .files()
            .map(|(f, _)| f)
            .chain(
                pinned
                    .into_iter()
                    .filter_map(|raw| u32::try_from(raw).ok().map(FileId::from_raw)),
            )
            .filter(|f| f.kind() == FileKind::Cold)
            .map(|f| f.seq());
        let mut next = named.max().map_or(1, |seq| seq + 1);
        for p in ctx.vfs.read_dir(&dir).unwrap_or_default() {
            let Some(seq) = cold::parse_file_name(&p) else {
                continue;
            };
            next = next.max(seq.saturating_add(1));
            if let Some(f) = FileId::cold(seq) {
                let len = ctx
                    .vfs
                    .open(&p, crate::io::OpenMode::Read)
                    .and_then(|f| f.file_len())
                    .unwrap_or(0);
                live.set_len(f, len);
                live.seal(f);
            }
        }
        Reclaimer {
            writer: ColdWriter::new(ctx.vfs.clone(), &dir, next, ctx.config.journal_file_bytes),
            dir,
            dir_unsynced: false,
            erased: BTreeSet::new(),
        }
    }

    /// Whether a cold file compacted for an erasure still exists (K7 has
    /// not deleted it yet): the checkpointer keeps checkpoints coming
    /// until it has (storage.md section 16, item 16).
    pub fn erasing(&self, ctx: &LogContext) -> bool {
        let live = ctx.live.lock();
        self.erased.iter().any(|&f| live.usage(f).is_some())
    }

    /// The cold file being written (never deleted).
    pub fn writing(&self) -> Option<FileId> {
        self.writer.current().and_then(|(seq, _)| FileId::cold(seq))
    }

    /// Evacuates the journal files before `replay_floor` that hold small
    /// groups' records, then compacts cold files as the planner says.
    /// Errors (a full disk, a failed sync) end the pass; what was installed
    /// stays, and the next pass goes on.
    pub fn run(
        &mut self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        replay_floor: u64,
    ) -> Result<ReclaimStats> {
        let mut stats = ReclaimStats::default();
        let victims: Vec<FileId> = ctx
            .live
            .lock()
            .files()
            .filter(|(f, u)| f.kind() == FileKind::Journal && f.seq() < replay_floor && u.live > 0)
            .map(|(f, _)| f)
            .collect();
        // Runs left in place here stay so (their group's reads report
        // them; the file stays).
        let mut left = Vec::new();
        for file in victims {
            room_for_file(ctx, file)?;
            let groups = groups_in_journal_file(ctx, file);
            let copies = self.copy_out(ctx, catalog, file, groups, &mut stats, &mut left)?;
            self.install(ctx, copies, &mut stats)?;
            stats.journal_files_evacuated += 1;
        }
        self.erase_cold(ctx, catalog, &mut stats)?;
        let plan = crate::logs::reclaim::plan(
            &ctx.live.lock().cold_files(),
            ctx.config.journal_file_bytes,
        );
        for seq in plan.victims {
            let Some(file) = FileId::cold(seq) else {
                continue;
            };
            if Some(file) == self.writing() {
                continue;
            }
            room_for_file(ctx, file)?;
            let groups = groups_in_cold_file(ctx, file);
            let copies = self.copy_out(ctx, catalog, file, groups, &mut stats, &mut left)?;
            self.install(ctx, copies, &mut stats)?;
            stats.cold_files_compacted += 1;
        }
        Ok(stats)
    }

    /// Erasure in cold files (storage.md section 16, item 16): every cold
    /// file holding a small group's listed recalled message (its erase
    /// list, `apply::records`) is compacted in full, ahead of the planner,
    /// whatever its usage; the copies write the recalled payloads erased.
    /// The file being written is sealed first (its bytes synced). Then
    /// each listed id no longer in one of those files (moved, or in no
    /// cold file: a journal file's evacuation erases it, retention dropped
    /// it) leaves the list, under the checkpoint lock, and the group is
    /// marked dirty: the next capture stores the new extents and the
    /// shorter list together, and K7 deletes the old file once no kept
    /// manifest names it. A copy not installed (the group changed) leaves
    /// its ids listed for the next pass. Cost: the listed groups' extent
    /// lists walked, and the victims' live bytes copied.
    fn erase_cold(
        &mut self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        stats: &mut ReclaimStats,
    ) -> Result<()> {
        let pending: Vec<u64> = ctx.erase_groups.lock().iter().copied().collect();
        let mut victims = BTreeSet::new();
        // Each group with its list as this pass starts: only those ids
        // leave it below (one listed meanwhile, by a recall applied or
        // found at an install, waits for the next pass).
        let mut groups = Vec::new();
        for id in pending {
            let Some(g) = catalog.read().get(id).cloned() else {
                continue;
            };
            let ids = g.erase_ids();
            if let LogSlot::Small(list) = &*g.log.read() {
                victims.extend(ids.iter().filter_map(|&id| cold_file_of(list, id)));
            } else {
                continue;
            }
            groups.push((g, ids));
        }
        let live = ctx.live.lock();
        self.erased.retain(|&f| live.usage(f).is_some());
        drop(live);
        if groups.is_empty() {
            return Ok(());
        }
        if self.writing().is_some_and(|w| victims.contains(&w)) {
            let durable = self.writer.sync()?;
            if self.dir_unsynced {
                ctx.vfs.sync_dir(&self.dir).map_err(|e| {
                    crate::Error::io(format!("fsync dir {}", self.dir.display()), e)
                })?;
                self.dir_unsynced = false;
            }
            if let Some((seq, len)) = durable.and(self.writer.seal()) {
                if let Some(f) = FileId::cold(seq) {
                    let mut live = ctx.live.lock();
                    live.set_len(f, len);
                    live.seal(f);
                }
            }
        }
        let mut left = Vec::new();
        for &file in &victims {
            let in_file = groups_in_cold_file(ctx, file);
            let before = left.len();
            let copies = self.copy_out(ctx, catalog, file, in_file, stats, &mut left)?;
            self.install(ctx, copies, stats)?;
            stats.cold_files_compacted += 1;
            // Checkpoints keep coming until K7 deletes it, unless a run
            // stays in it (it is not deleted then: no point asking).
            if left.len() == before {
                self.erased.insert(file);
            }
        }
        // A run holding a listed id whose records do not check out: no
        // copy can erase the payload, and every retry would fail the same
        // way. The group is damaged (the node's way: its reads answer
        // `GroupDamaged`, the next checkpoint records it with the reason,
        // STATS counts it, `ctl verify` reports it), which ends the retries;
        // its list stays stored (the payload is still there), for the
        // operator's repair or deletion.
        for l in left {
            let listed = l.group.erase_ids().iter().any(|id| l.ids.contains(id));
            if !listed {
                continue;
            }
            let reason = format!(
                "a recalled message's payload cannot be erased: its records {}..{} do not check out: {}",
                l.ids.start, l.ids.end, l.why
            );
            log::error!("group {} is damaged: {reason}", l.group.id);
            // Under the checkpoint lock the applier holds while it uses
            // the small slot (`apply.rs`, `small_records`).
            let _ck = l.group.ckpt(&ctx.dirty);
            crate::commit::small_log::damage(ctx, &l.group, reason);
            ctx.erase_groups.lock().remove(&l.group.id);
        }
        for (g, ids) in groups {
            let mut ck = g.ckpt(&ctx.dirty);
            let done: Vec<u64> = match &*g.log.read() {
                LogSlot::Small(list) => ids
                    .iter()
                    .copied()
                    .filter(|&id| !cold_file_of(list, id).is_some_and(|f| victims.contains(&f)))
                    .collect(),
                // Promoted meanwhile: the segment pass has it.
                _ => continue,
            };
            if !done.is_empty() {
                g.clear_erase(&done);
                ctx.dirty.mark(&g, &mut ck);
            }
            if g.erase_ids().is_empty() {
                ctx.erase_groups.lock().remove(&g.id);
            }
        }
        Ok(())
    }

    /// Copies, for each group of `groups`, every run of its extents that
    /// lies in `file` into the current cold file, then makes the cold file
    /// durable. No install yet. A run whose records do not check out stays
    /// where it is and goes to `left` (the erasure pass acts on it).
    fn copy_out(
        &mut self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        file: FileId,
        groups: BTreeSet<u64>,
        stats: &mut ReclaimStats,
        left: &mut Vec<LeftInPlace>,
    ) -> Result<Vec<Copy>> {
        let mut copies = Vec::new();
        for id in groups {
            let Some(group) = catalog.read().get(id).cloned() else {
                continue;
            };
            let list = match &*group.log.read() {
                LogSlot::Small(list) => list.clone(),
                _ => continue,
            };
            for run in runs_in(list.pieces().collect(), file) {
                let copy = match self.copy_run(ctx, &group, &run, list.floor())? {
                    Ok(copy) => copy,
                    Err(why) => {
                        left.push(LeftInPlace {
                            group: group.clone(),
                            ids: run[0].first_id..run[run.len() - 1].end_id(),
                            why,
                        });
                        continue;
                    }
                };
                stats.bytes_copied += u64::from(copy.new.bytes());
                copies.push(copy);
            }
        }
        if !copies.is_empty() {
            if let Some((seq, len)) = self.writer.sync()? {
                if let Some(f) = FileId::cold(seq) {
                    ctx.live.lock().set_len(f, len);
                }
            }
            if self.dir_unsynced {
                ctx.vfs.sync_dir(&self.dir).map_err(|e| {
                    crate::Error::io(format!("fsync dir {}", self.dir.display()), e)
                })?;
                self.dir_unsynced = false;
            }
        }
        Ok(copies)
    }

    /// Copies one run of a group's extents (all in one file) into one cold
    /// extent, leaving out the records below the group's retention `floor`
    /// (only the list's first extent can hold some). `Err(why)` if the
    /// records do not check out (the group's reads report the damage; its
    /// extents stay where they are).
    fn copy_run(
        &mut self,
        ctx: &Context,
        group: &Arc<Group>,
        run: &[Piece],
        floor: u64,
    ) -> Result<std::result::Result<Copy, String>> {
        let mut records = Vec::new();
        let mut count = 0u32;
        let first_id = run[0].first_id.max(floor);
        for p in run {
            let map = match ctx.shared_files.map_piece(group.id, p) {
                Ok(m) => m,
                Err(e) => {
                    log::warn!("group {}: records left in place: {e}", group.id);
                    return Ok(Err(e.to_string()));
                }
            };
            let at = p.ext.offset() as usize;
            let bytes = &map.bytes()[at..at + p.ext.bytes() as usize];
            // E1: the floor lies in the list's first extent, so only the
            // run's first piece can start below it, and keeps a record.
            let skip = first_id.saturating_sub(p.first_id);
            let Some(kept) = records_from(bytes, skip) else {
                let why = format!(
                    "{}: the lengths of extent {}..{} do not walk to id {first_id}",
                    ctx.shared_files.path(p.ext.file()).display(),
                    p.first_id,
                    p.end_id()
                );
                log::warn!("group {}: records left in place: {why}", group.id);
                return Ok(Err(why));
            };
            records.extend_from_slice(kept);
            // `skip` < the piece's count (E1), so this fits u32.
            count += p.ext.count() - skip as u32;
        }
        // Before the copy erases them: an install compares (`install`).
        let quiet = group.quiet_between(first_id, (first_id + u64::from(count)).saturating_sub(1));
        if let Some((id, e)) = group.damaged_recalled(&records) {
            let why = format!(
                "{}: recalled message {id} does not check out: {e}",
                ctx.shared_files.path(run[0].ext.file()).display()
            );
            log::warn!("group {}: records left in place: {why}", group.id);
            return Ok(Err(why));
        }
        group.erase_recalled(&mut records);
        // The copy (and a new cold file's header) must leave the
        // free-space reserve whole; else the pass ends and the next
        // checkpoint's tries again (`space.rs`).
        let header_bytes = 2 * cold::EXTENT_HEADER_BYTES as u64;
        ctx.reserve.allows(
            &*ctx.vfs,
            &ctx.config,
            "reclaiming small groups' space",
            records.len() as u64 + header_bytes,
        )?;
        let before = self.writer.current().map(|(seq, _)| seq);
        let appended = match self.writer.append(group.id, first_id, count, &records) {
            Ok(a) => a,
            Err(crate::Error::GroupDamaged { reason, .. }) => {
                log::warn!("group {}: records left in place: {reason}", group.id);
                let file = run[0].ext.file();
                return Ok(Err(format!(
                    "{} (copied from {})",
                    reason,
                    ctx.shared_files.path(file).display()
                )));
            }
            Err(e) => return Err(e),
        };
        let mut live = ctx.live.lock();
        if let Some((seq, len)) = appended.sealed {
            if let Some(f) = FileId::cold(seq) {
                live.set_len(f, len);
                live.seal(f);
            }
        }
        if let Some((seq, len)) = self.writer.current() {
            if let Some(f) = FileId::cold(seq) {
                live.set_len(f, len);
            }
            self.dir_unsynced |= before != Some(seq);
        }
        Ok(Ok(Copy {
            group: group.clone(),
            old: run.iter().map(|p| p.ext).collect(),
            first_id,
            new: appended.extent,
            quiet,
        }))
    }

    /// Installs each copy if the group still holds exactly the extents it
    /// replaces; the moved bytes change files in the accounting and the
    /// group is recorded by the next checkpoint.
    ///
    /// A recall applied between the copy and the install (under the
    /// checkpoint lock held here, apply takes it to add quiet ids) found
    /// its target in the old place and listed nothing, or listed it for
    /// the old cold file; the copy holds its payload unerased. So the
    /// recalled messages quiet now and not at the copy go on the group's
    /// erase list, with the install: the cold-file erasure (`erase_cold`,
    /// this pass or the next) compacts the new file.
    fn install(
        &mut self,
        ctx: &Context,
        copies: Vec<Copy>,
        stats: &mut ReclaimStats,
    ) -> Result<()> {
        for c in copies {
            let mut ck = c.group.ckpt(&ctx.dirty);
            let installed = match &mut *c.group.log.write() {
                LogSlot::Small(list) => list.replace(&c.old, c.first_id, c.new).is_ok(),
                _ => false,
            };
            if !installed {
                stats.stale_copies += 1;
                continue;
            }
            let last = (c.first_id + u64::from(c.new.count())).saturating_sub(1);
            let recalled_meanwhile: Vec<u64> = c
                .group
                .quiet_between(c.first_id, last)
                .into_iter()
                .filter(|id| c.quiet.binary_search(id).is_err())
                .collect();
            if !recalled_meanwhile.is_empty() {
                c.group.add_erase(&recalled_meanwhile);
                ctx.erase_groups.lock().insert(c.group.id);
            }
            let mut live = ctx.live.lock();
            for e in &c.old {
                live.remove(e);
            }
            live.add(&c.new);
            drop(live);
            ctx.dirty.mark(&c.group, &mut ck);
        }
        Ok(())
    }
}

/// The cold file holding message `id` of a small group's `list`, if any.
fn cold_file_of(list: &crate::logs::extents::ExtentList, id: u64) -> Option<FileId> {
    list.pieces()
        .find(|p| p.first_id <= id && id < p.end_id())
        .map(|p| p.ext.file())
        .filter(|f| f.kind() == FileKind::Cold)
}

/// `bytes` (a run of records) without its first `skip` records, or `None`
/// if their lengths do not walk inside it. The kept records are checked
/// whole by the cold writer; this walk only has to stay in bounds.
fn records_from(bytes: &[u8], skip: u64) -> Option<&[u8]> {
    let mut at = 0usize;
    for _ in 0..skip {
        let len = record::peek_len(bytes.get(at..)?)?;
        if len < record::RECORD_HEADER_BYTES {
            return None;
        }
        at = at.checked_add(len).filter(|&end| end <= bytes.len())?;
    }
    bytes.get(at..)
}

/// The reserve check (`space.rs`) for copying the live bytes of `file`
/// whole: a pass that has no room for a file does not start on it, so no
/// copy is left uninstalled (dead bytes) for lack of room. Each copy is
/// checked again (`copy_run`): other writers take space meanwhile.
fn room_for_file(ctx: &LogContext, file: FileId) -> Result<()> {
    let live = ctx.live.lock().usage(file).map_or(0, |u| u.live);
    ctx.reserve.allows(
        &*ctx.vfs,
        &ctx.config,
        "reclaiming small groups' space",
        live + 2 * cold::EXTENT_HEADER_BYTES as u64,
    )
}

/// The maximal runs of consecutive pieces that lie in `file`.
fn runs_in(pieces: Vec<Piece>, file: FileId) -> Vec<Vec<Piece>> {
    let mut runs: Vec<Vec<Piece>> = Vec::new();
    let mut open = false;
    for p in pieces {
        if p.ext.file() != file {
            open = false;
            continue;
        }
        match runs.last_mut() {
            Some(run) if open => run.push(p),
            _ => runs.push(vec![p]),
        }
        open = true;
    }
    runs
}

/// The groups whose Records entries a journal file holds (its valid
/// frames; a damaged frame ends the walk, and the groups after it keep
/// the file until they are promoted or deleted).
fn groups_in_journal_file(ctx: &LogContext, file: FileId) -> BTreeSet<u64> {
    let mut groups = BTreeSet::new();
    let path = ctx.shared_files.path(file);
    let map = match journal::map_file(&*ctx.vfs, &path) {
        Ok(Some(m)) => m,
        Ok(None) => return groups,
        Err(e) => {
            log::warn!("reclaim: cannot read {}: {e}", path.display());
            return groups;
        }
    };
    let Ok(h) = journal::decode_header_of(&map) else {
        return groups;
    };
    let mut frames = journal::frame::FrameIter::new(
        &map,
        journal::JOURNAL_HEADER_BYTES,
        h.mark_key,
        h.first_lsn,
        h.first_round,
    );
    for f in frames.by_ref() {
        for e in f.entries() {
            if e.kind == EntryKind::Records {
                groups.insert(e.group_id);
            }
        }
    }
    if let Some(why) = frames.stop_reason() {
        log::warn!("reclaim: {} ends early: {why}", path.display());
    }
    groups
}

/// The groups whose extents a cold file holds (its self-describing
/// extent headers, `cold.rs`).
fn groups_in_cold_file(ctx: &LogContext, file: FileId) -> BTreeSet<u64> {
    let mut groups = BTreeSet::new();
    let path = ctx.shared_files.path(file);
    let Ok(f) = ctx.vfs.open(&path, crate::io::OpenMode::Read) else {
        return groups;
    };
    let Ok(len) = f.file_len() else {
        return groups;
    };
    let Ok(mut scan) = ColdScanner::new(&*f, len, false) else {
        return groups;
    };
    if scan.header().seq != file.seq() {
        log::warn!(
            "reclaim: {} names cold file {}",
            path.display(),
            scan.header().seq
        );
        return groups;
    }
    while let Ok(Some(ext)) = scan.next_extent() {
        groups.insert(ext.header.group_id);
    }
    groups
}
