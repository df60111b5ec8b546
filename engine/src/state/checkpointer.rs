//! The checkpointer thread: incremental, fuzzy checkpoints beside the
//! commit rounds (format-spec/storage.md section 9, "Checkpoint").
//!
//! The commit thread only *captures* (K1, `commit.rs`): between two rounds
//! it takes the dirty lists (`dirty.rs`) and hands them over with the
//! journal's next position (file, lsn, round) as the replay position P.
//! Everything else runs here, while rounds go on:
//!
//! - K2 copy: per dirty group, under its `ckpt` lock (one group at a time,
//!   microseconds), write its unwritten tail, copy its record and the rows
//!   of the memberships that changed, take the files it must sync; then the
//!   moved cursors, 4,096 a lock. Items go into the delta buffer.
//! - K3: make what was captured durable (per file, or one `syncfs` above
//!   64 groups); no lock held.
//! - K4: write the delta run (parts, fdatasync each, fsync `state/`).
//! - K5: merge the newest runs when the policy says so (`state::merge`).
//! - K6: write the manifest (fdatasync, fsync `manifest/`).
//! - K7: delete what neither kept manifest needs: older manifests, run
//!   parts, journal files before the one holding the older manifest's
//!   replay position, segments retention dropped a checkpoint ago (D6).
//!
//! A full disk in K2 or K4-K6 puts the checkpoint off: the delta buffer
//! keeps what was captured (the next capture's newer items replace it) and
//! a new capture is asked for a second later. Any other failure stops
//! writes, as a failed commit does. Retention runs here too, every
//! `retention_check_ms`: its drops are group changes the next checkpoint
//! records, and the files go only after the one after it (D6).

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::commit::capture::Capture;
use crate::commit::dirty::Taken;
use crate::commit::flusher::FlushCheck;
use crate::commit::journal;
use crate::commit::thread::Shared;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::io::{OpenMode, VfsFile};
use crate::logs::extents::FileId;
use crate::logs::group_log::{LogContext, LogState, SyncDuties};
use crate::logs::retention;
use crate::members::cursors::CursorTable;
use crate::state::manifest::{self, Manifest, RunMeta};
use crate::state::merge::{self, Merge};
use crate::state::pins::{self, Holds};
use crate::state::run::{self, RunItems, RunWriter, WriteError};
use crate::state::{GroupRecord, Item, Key};

/// Above this many captured groups, K3 syncs the file system once instead
/// of each of their files.
const SYNCFS_THRESHOLD_GROUPS: usize = 64;

/// Moved cursors read per hold of a group's `ckpt` lock.
const CURSORS_PER_LOCK: usize = 4096;

/// How long a checkpoint that found the disk full is put off.
const RETRY_AFTER_NO_SPACE: Duration = Duration::from_secs(1);

/// What recovery found on disk for the checkpointer to go on from.
#[derive(Default)]
pub(crate) struct OnDisk {
    /// The manifest in force (the newest valid one) and the one before it.
    pub last: Option<Manifest>,
    pub prev: Option<Manifest>,
    pub next_ckpt_seq: u64,
    pub next_run_seq: u64,
    /// Groups damaged at open (journal files are kept while any is).
    pub damaged: HashSet<u64>,
}

struct Checkpointer {
    shared: Arc<Shared>,
    /// Snapshot holds (`pins.rs`): told each stored manifest; while one is
    /// active, K7 deletes nothing.
    holds: Arc<Holds>,
    flush: FlushCheck,
    last: Option<Manifest>,
    prev: Option<Manifest>,
    next_ckpt_seq: u64,
    next_run_seq: u64,
    /// Captured items not yet in a stored checkpoint.
    delta: BTreeMap<Key, Item>,
    /// Captured changes of the user index not yet in a stored checkpoint,
    /// `(user, group, put)` in capture order (a later one of a key wins).
    /// Kept apart from `delta`: 24 bytes a change instead of a map entry,
    /// and every membership change has one.
    index_changes: Vec<(u64, u64, bool)>,
    /// Files those items need durable.
    duties: Vec<SyncDuties>,
    /// `(file, first checkpoint not naming it)`: unlinked once the one
    /// after it is stored.
    graveyard: Vec<(PathBuf, u64)>,
    damaged: HashSet<u64>,
    last_retention: Instant,
    /// Copies small groups' records out of old shared files after each
    /// checkpoint (rewrite.rs).
    reclaimer: Option<crate::state::rewrite::Reclaimer>,
}

/// Starts the checkpointer thread.
pub(crate) fn start(
    shared: Arc<Shared>,
    holds: Arc<Holds>,
    flush: FlushCheck,
    on_disk: OnDisk,
) -> Result<std::thread::JoinHandle<()>> {
    let mut c = Checkpointer {
        shared,
        holds,
        flush,
        last: on_disk.last,
        prev: on_disk.prev,
        next_ckpt_seq: on_disk.next_ckpt_seq,
        next_run_seq: on_disk.next_run_seq,
        delta: BTreeMap::new(),
        index_changes: Vec::new(),
        duties: Vec::new(),
        graveyard: Vec::new(),
        damaged: on_disk.damaged,
        last_retention: Instant::now(),
        reclaimer: None,
    };
    // Cold files are numbered above every one a kept manifest pins.
    let pinned: Vec<u64> = [&c.last, &c.prev]
        .into_iter()
        .flatten()
        .flat_map(|m| m.pinned.iter().copied())
        .collect();
    c.reclaimer = Some(crate::state::rewrite::Reclaimer::new(&c.shared.ctx, pinned));
    if let Some(m) = &c.last {
        c.holds.set_newest(m);
    }
    std::thread::Builder::new()
        .name("tidemark-ckpt".into())
        .spawn(move || {
            let _exit = ExitGuard(c.shared.clone());
            c.run()
        })
        .map_err(|e| Error::io("spawn checkpointer thread", e))
}

/// The sequence number after `seq`; none after `u64::MAX` (only a damaged
/// or hostile directory names such a file): writes stop rather than a
/// number being used twice.
fn next_seq(seq: u64, what: &str) -> Result<u64> {
    seq.checked_add(1).ok_or_else(|| Error::WritesStopped {
        reason: format!("{what} sequence numbers exhausted"),
    })
}

/// The journal and cold files in `jdir` (unreadable listings: none, a
/// later checkpoint tries again).
fn shared_files(ctx: &LogContext, jdir: &Path) -> Vec<(FileId, PathBuf)> {
    let mut out: Vec<(FileId, PathBuf)> = journal::list(&*ctx.vfs, jdir)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(seq, p)| Some((FileId::journal(seq)?, p)))
        .collect();
    for p in ctx.vfs.read_dir(jdir).unwrap_or_default() {
        if let Some(f) = crate::logs::cold::parse_file_name(&p).and_then(FileId::cold) {
            out.push((f, p));
        }
    }
    out
}

/// Marks the checkpointer exited however its thread ends, a panic (a
/// broken invariant) included, so whoever waits for a checkpoint
/// (`Engine::checkpoint`, the commit thread's `checkpointer_ready`) stops
/// waiting instead of hanging.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // No checkpoint can be taken any more: the journal would grow
            // without bound and every open replay all of it.
            crate::commit::thread::stop_writes(
                &self.0,
                &Error::WritesStopped {
                    reason: "the checkpointer thread panicked".into(),
                },
            );
        }
        let co = &self.0.ckpt;
        co.status.lock().exited = true;
        co.cv.notify_all();
    }
}

/// What a group's retention policy drops now.
enum RetentionCut {
    /// The `n` oldest sealed segments of a segmented log.
    Segments(usize),
    /// A small group's records below this new floor (design 5.5).
    SmallFloor(u64),
}

/// What the group's retention policy drops now, if anything. A small
/// group's list is copied under its lock and its files are read (for
/// timestamps) without it.
fn plan_retention(
    ctx: &LogContext,
    cursors: &CursorTable,
    g: &Group,
) -> Result<Option<RetentionCut>> {
    let policy = g.retention();
    if policy.keeps_everything() {
        return Ok(None);
    }
    let min_cursor = g.min_cursor(cursors);
    let slot = g.log.read();
    match &*slot {
        LogSlot::Loaded(log) => {
            let sealed = log.sealed_segments(ctx, policy.max_age_ms > 0)?;
            let n = retention::droppable(
                &policy,
                &sealed,
                log.total_bytes(),
                min_cursor,
                crate::clock::now_ms(),
            );
            Ok((n > 0).then_some(RetentionCut::Segments(n)))
        }
        LogSlot::Small(list) => {
            let list = list.clone();
            drop(slot);
            let extents = crate::logs::small_read::retention_view(
                &ctx.shared_files,
                g.id,
                &list,
                policy.max_age_ms > 0,
            )?;
            let head = list.next_id() - 1;
            Ok(retention::plan_small(
                &policy,
                &extents,
                list.floor(),
                head,
                min_cursor,
                crate::clock::now_ms(),
            )
            .map(RetentionCut::SmallFloor))
        }
        _ => Ok(None),
    }
}

fn state_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("state")
}

/// A run part being written front to back through the file layer.
struct PartFile {
    file: Box<dyn VfsFile>,
    path: PathBuf,
    at: u64,
}

impl Write for PartFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write_all_at(buf, self.at)?;
        self.at += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `items` as run `run_seq` (parts fdatasynced, `state/` fsynced).
/// `None` for a run without items. A full disk is `NoSpace` (the partial
/// parts are removed).
/// `items` are owned (a merge's) or borrowed (the delta buffer, kept for a
/// retry if the write fails: no copy of it is made).
pub(crate) fn write_run<T: std::borrow::Borrow<Item>>(
    ctx: &LogContext,
    run_seq: u64,
    items: impl Iterator<Item = Result<T, String>>,
) -> Result<Option<RunMeta>> {
    let dir = state_dir(&ctx.config.data_dir);
    let created: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let result = (|| {
        let mut w = RunWriter::new(
            run_seq,
            ctx.config.run_file_bytes_max,
            crate::clock::now_ms(),
            |part| {
                let path = dir.join(run::part_file_name(run_seq, part));
                created.lock().push(path.clone());
                let file = ctx.vfs.open(&path, OpenMode::ReadWriteCreate)?;
                file.set_len(0)?;
                Ok(PartFile { file, path, at: 0 })
            },
        );
        let io = |e: WriteError, what: &str| match e {
            WriteError::Io(e) => Error::write(format!("{what} run {run_seq}"), e),
            other => Error::WritesStopped {
                reason: format!("run {run_seq}: {other}"),
            },
        };
        for item in items {
            let item = item.map_err(|reason| Error::Corrupt {
                path: dir.clone(),
                group: None,
                offset: 0,
                reason: format!("a run being merged is damaged: {reason}"),
            })?;
            w.push(item.borrow()).map_err(|e| io(e, "write"))?;
        }
        let parts = w.finish().map_err(|e| io(e, "write"))?;
        if parts.is_empty() {
            return Ok(None);
        }
        let mut metas = Vec::with_capacity(parts.len());
        for (f, meta) in parts {
            f.file
                .sync_data()
                .map_err(|e| Error::io(format!("fdatasync {}", f.path.display()), e))?;
            metas.push(meta);
        }
        ctx.vfs
            .sync_dir(&dir)
            .map_err(|e| Error::io(format!("fsync dir {}", dir.display()), e))?;
        Ok(Some(RunMeta {
            run_seq,
            parts: metas,
        }))
    })();
    if result.is_err() {
        for path in created.into_inner() {
            let _ = ctx.vfs.remove_file(&path);
        }
    }
    result
}

/// Tests: the checkpointer of the engine opened on a data directory
/// writes as a build before the user index did (no index entries, the
/// manifest's flag off), to make the directories such a build left.
pub(crate) mod older_build {
    use std::path::Path;

    #[cfg(test)]
    static DIRS: parking_lot::Mutex<Vec<std::path::PathBuf>> = parking_lot::Mutex::new(Vec::new());

    /// Whether the checkpointer of `dir` writes as an older build.
    #[cfg(not(test))]
    pub(crate) fn acts_on(_dir: &Path) -> bool {
        false
    }

    #[cfg(test)]
    pub(crate) fn acts_on(dir: &Path) -> bool {
        DIRS.lock().iter().any(|d| d == dir)
    }

    #[cfg(test)]
    pub(crate) fn set(dir: &Path, on: bool) {
        let mut dirs = DIRS.lock();
        dirs.retain(|d| d != dir);
        if on {
            dirs.push(dir.to_path_buf());
        }
    }
}

/// `(user, group)` of every member row the merge of `runs` (every run of
/// the checkpoint in force) yields, ascending: the user index of a state
/// written without one. Costs a full merge of the runs and 16 bytes a
/// membership, once per directory (the first checkpoint after an older
/// build's), on the checkpointer thread.
fn user_index_of_runs(ctx: &LogContext, runs: &[RunMeta]) -> Result<Vec<(u64, u64)>> {
    let mut index = Vec::new();
    with_merge(ctx, runs, true, |items| {
        for item in items {
            if let Item::MemberPut { group, user, .. } = item? {
                index.push((user, group));
            }
        }
        Ok(())
    })
    .and_then(|r| r)
    .map_err(|reason| Error::Corrupt {
        path: state_dir(&ctx.config.data_dir),
        group: None,
        offset: 0,
        reason: format!("the runs to index cannot be read: {reason}"),
    })?;
    index.sort_unstable();
    log::info!(
        "user index: {} entries written for a state stored without one",
        index.len()
    );
    Ok(index)
}

/// Sorts captured user index changes `(user, group, put)` by key, in
/// place, keeping the last change of each key (the sort is stable, so the
/// changes of one key stay in capture order). In place because a
/// checkpoint that fails keeps its changes for the next one.
fn normalize_index_changes(changes: &mut Vec<(u64, u64, bool)>) {
    changes.sort_by_key(|&(user, group, _)| (user, group));
    changes.dedup_by(|later, kept| {
        let same = (later.0, later.1) == (kept.0, kept.1);
        if same {
            *kept = *later;
        }
        same
    });
}

/// The user index entries of a delta run that also indexes runs written
/// without an index: `catch_up` (their memberships, ascending, all puts)
/// merged with `changes` (normalized), a change winning on its key.
fn with_catch_up(catch_up: &[(u64, u64)], changes: &[(u64, u64, bool)]) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::with_capacity(catch_up.len() + changes.len());
    let mut changes = changes.iter().copied().peekable();
    for &(user, group) in catch_up {
        while let Some(c) = changes.next_if(|c| (c.0, c.1) < (user, group)) {
            out.push(c);
        }
        match changes.next_if(|c| (c.0, c.1) == (user, group)) {
            Some(c) => out.push(c),
            None => out.push((user, group, true)),
        }
    }
    out.extend(changes);
    out
}

/// The delta buffer's items with the user index entries `index`
/// (ascending, unique) merged in, in key order. The buffer
/// holds no index item, so no key is in both.
fn with_index_entries<'a>(
    delta: &'a BTreeMap<Key, Item>,
    index: &'a [(u64, u64, bool)],
) -> impl Iterator<Item = std::result::Result<std::borrow::Cow<'a, Item>, String>> + 'a {
    use std::borrow::Cow;
    let mut buffered = delta.values().peekable();
    let mut entries = index
        .iter()
        .map(|&(user, group, put)| {
            if put {
                Item::IndexPut { user, group }
            } else {
                Item::IndexDelete { user, group }
            }
        })
        .peekable();
    std::iter::from_fn(move || {
        let from_buffer = match (buffered.peek(), entries.peek()) {
            (None, None) => return None,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(a), Some(b)) => a.key() <= b.key(),
        };
        if !from_buffer {
            return entries.next().map(|e| Ok(Cow::Owned(e)));
        }
        let item = buffered.next()?;
        if entries.peek().is_some_and(|e| e.key() == item.key()) {
            entries.next();
        }
        Some(Ok(Cow::Borrowed(item)))
    })
}

/// The mappings of a run's parts, checked against their lengths.
pub(crate) fn map_run(ctx: &LogContext, run: &RunMeta) -> Result<Vec<memmap2::Mmap>, String> {
    let dir = state_dir(&ctx.config.data_dir);
    run.parts
        .iter()
        .map(|p| {
            let path = dir.join(run::part_file_name(p.run_seq, p.part));
            let file = ctx
                .vfs
                .open(&path, OpenMode::Read)
                .map_err(|e| format!("open {}: {e}", path.display()))?;
            let len = file
                .file_len()
                .map_err(|e| format!("stat {}: {e}", path.display()))?;
            if len != p.file_len {
                return Err(format!(
                    "{} is {len} bytes, the manifest says {}",
                    path.display(),
                    p.file_len
                ));
            }
            file.map(len as usize)
                .map_err(|e| format!("mmap {}: {e}", path.display()))
        })
        .collect()
}

/// Calls `f` with the merge of `runs` (newest first).
pub(crate) fn with_merge<R>(
    ctx: &LogContext,
    runs: &[RunMeta],
    includes_oldest: bool,
    f: impl FnOnce(&mut dyn Iterator<Item = Result<Item, String>>) -> R,
) -> Result<R, String> {
    let maps: Vec<Vec<memmap2::Mmap>> = runs
        .iter()
        .map(|r| map_run(ctx, r))
        .collect::<Result<_, _>>()?;
    let slices: Vec<Vec<&[u8]>> = maps
        .iter()
        .map(|m| m.iter().map(|m| &m[..]).collect())
        .collect();
    let inputs: Vec<RunItems<'_>> = slices
        .iter()
        .zip(runs)
        .map(|(s, r)| RunItems::new(s, &r.parts))
        .collect();
    let mut merged = Merge::new(inputs, includes_oldest);
    Ok(f(&mut merged))
}

impl Checkpointer {
    fn ctx(&self) -> &LogContext {
        &self.shared.ctx
    }

    fn run(&mut self) {
        loop {
            let job = {
                let co = &self.shared.ckpt;
                let mut st = co.status.lock();
                loop {
                    if st.shutdown {
                        st.exited = true;
                        co.cv.notify_all();
                        return;
                    }
                    if let Some(job) = st.job.take() {
                        st.busy = true;
                        break Some(job);
                    }
                    if self.retention_due() {
                        // Busy while it runs, so no capture is taken
                        // meanwhile (see `timed_retention`).
                        st.busy = true;
                        break None;
                    }
                    let wake = self.last_retention
                        + Duration::from_millis(self.ctx().config.retention_check_ms);
                    co.cv.wait_until(&mut st, wake);
                }
            };
            match job {
                Some(job) => {
                    let round = job.round;
                    let outcome = self.checkpoint(job);
                    self.shared.counters.checkpoint_ended(outcome.is_ok());
                    let co = &self.shared.ckpt;
                    let mut st = co.status.lock();
                    st.busy = false;
                    st.attempted_through = st.attempted_through.max(round);
                    match outcome {
                        Ok(()) => {}
                        Err(e @ Error::NoSpace { .. }) => {
                            log::warn!("checkpoint put off: {e}; tried again in a second");
                            st.wanted = true;
                            st.wanted_at = Some(Instant::now() + RETRY_AFTER_NO_SPACE);
                        }
                        Err(e) => {
                            drop(st);
                            crate::commit::thread::stop_writes(&self.shared, &e);
                            st = co.status.lock();
                        }
                    }
                    drop(st);
                    co.cv.notify_all();
                    // The commit thread may wait to capture again.
                    self.shared.pending_cv.notify_all();
                }
                None => self.timed_retention(),
            }
        }
    }

    /// Retention by the timer, outside a checkpoint, with the checkpointer
    /// marked busy (the caller set it) so that the commit thread takes no
    /// capture while it runs. A drop is tagged with the next checkpoint's
    /// number (its files go at K7 of the one after it), which is right
    /// only if that checkpoint's capture comes after the drop marked the
    /// group dirty: a capture taken in between would store a manifest
    /// still naming the dropped segments, and K7 of the checkpoint after
    /// it would delete them while that manifest is kept (the fallback).
    fn timed_retention(&mut self) {
        self.retention();
        let co = &self.shared.ckpt;
        co.status.lock().busy = false;
        co.cv.notify_all();
        self.shared.pending_cv.notify_all();
    }

    fn retention_due(&self) -> bool {
        // Retention walks the registered groups' policies: it waits for
        // every group to be registered (`state::lazy`).
        !self.shared.load.loading()
            && self.last_retention.elapsed()
                >= Duration::from_millis(self.ctx().config.retention_check_ms)
    }

    /// Applies every group's retention policy: drops the sealed segments it
    /// allows from the group's log (readers get `BelowRetentionFloor` at
    /// once), marks the group dirty, and queues the files for deletion once
    /// the checkpoint after the next one is stored (D6). Walks only the
    /// groups with a policy (the registry's index of them), in chunks,
    /// holding the registry's read lock per chunk only.
    fn retention(&mut self) -> Vec<Arc<Group>> {
        self.last_retention = Instant::now();
        let mut dropped = Vec::new();
        let ctx = &self.shared.ctx;
        let mut dropped_any = false;
        let mut from = 0;
        loop {
            let chunk = self.shared.catalog.read().retained_from(from, 1024);
            let Some(last) = chunk.last() else {
                break;
            };
            // Slots stay below u32::MAX (catalog.rs): no overflow.
            from = last.slot + 1;
            self.shared
                .counters
                .retention_groups_planned
                .fetch_add(chunk.len() as u64, Ordering::Relaxed);
            for g in chunk {
                let cut = match plan_retention(ctx, &self.shared.cursors, &g) {
                    Ok(Some(cut)) => cut,
                    Ok(None) => continue,
                    Err(e) => {
                        log::warn!("group {}: retention skipped: {e}", g.id);
                        continue;
                    }
                };
                let mut ck = g.ckpt(&ctx.dirty);
                let mut slot = g.log.write();
                match (&mut *slot, cut) {
                    (LogSlot::Loaded(log), RetentionCut::Segments(n)) => {
                        let stored = (log.head() + 1).saturating_sub(log.floor());
                        let paths = log.drop_oldest(ctx, n);
                        ctx.stored_changed(stored, (log.head() + 1).saturating_sub(log.floor()));
                        drop(slot);
                        if paths.is_empty() {
                            continue;
                        }
                        let tag = self.next_ckpt_seq;
                        self.graveyard.extend(paths.into_iter().map(|p| (p, tag)));
                    }
                    // The floor was planned on a copy of the list: appends
                    // and rewrites since then keep ids, so it still names
                    // the same records, and `trim` clamps it to the head.
                    (LogSlot::Small(list), RetentionCut::SmallFloor(floor)) => {
                        let before = list.floor();
                        let stored = list.next_id().saturating_sub(before);
                        let mut live = ctx.live.lock();
                        list.trim(floor, |e| live.remove(e));
                        drop(live);
                        ctx.stored_changed(stored, list.next_id().saturating_sub(list.floor()));
                        if list.floor() == before {
                            continue;
                        }
                        drop(slot);
                    }
                    // Promoted, deleted or damaged since the plan.
                    _ => continue,
                }
                // Quiet ids no member can count any more (`changes.rs`):
                // at or below every cursor and below the new floor.
                let floor = g.log.read().floor();
                let below_floor = floor.saturating_sub(1);
                let up_to = g
                    .min_cursor(&self.shared.cursors)
                    .map_or(below_floor, |c| c.min(below_floor));
                g.trim_quiet(up_to, floor);
                dropped_any = true;
                ctx.dirty.mark(&g, &mut ck);
                drop(ck);
                dropped.push(g);
            }
        }
        if dropped_any {
            let mut st = self.shared.ckpt.status.lock();
            st.wanted = true;
            st.wanted_at = None;
            drop(st);
            self.shared.pending_cv.notify_all();
        }
        dropped
    }

    /// Adds an item to the delta buffer; newer replaces older, and a
    /// tombstone or a `fresh` record hides the group's older buffered items
    /// (the buffer becomes one run, where masking works across runs only).
    fn put(&mut self, item: Item) {
        let key = item.key();
        match item {
            Item::GroupDelete { group } => {
                self.drop_rows(group);
                self.delta.insert(key, Item::GroupDelete { group });
            }
            Item::GroupPut(mut rec) => {
                let masked_before = matches!(self.delta.get(&key), Some(Item::GroupDelete { .. }))
                    || matches!(self.delta.get(&key), Some(Item::GroupPut(p)) if p.fresh);
                if rec.fresh {
                    self.drop_rows(rec.group);
                }
                rec.fresh |= masked_before;
                self.delta.insert(key, Item::GroupPut(rec));
            }
            row => {
                self.delta.insert(key, row);
            }
        }
    }

    fn drop_rows(&mut self, group: u64) {
        let rows: Vec<Key> = self
            .delta
            .range(Key::member(group, 0)..=Key::member(group, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in rows {
            self.delta.remove(&k);
        }
    }

    /// K2: copies what changed into the delta buffer. On an error, the
    /// groups not yet copied go back on the dirty list.
    fn capture(&mut self, taken: Taken<Group>) -> Result<()> {
        for &group in &taken.deleted {
            self.put(Item::GroupDelete { group });
            self.damaged.remove(&group);
        }
        for (i, g) in taken.groups.iter().enumerate() {
            if let Err(e) = self.capture_group(g, false) {
                self.shared.ctx.dirty.put_back(taken.groups[i..].to_vec());
                return Err(e);
            }
        }
        // Groups a first load found damaged: recorded so, changed or not
        // (capturing a group whose record is current is always correct).
        for id in taken.damaged {
            let g = self.shared.catalog.read().get(id).cloned();
            if let Some(g) = g {
                self.capture_group(&g, true)?;
            }
        }
        Ok(())
    }

    fn capture_group(&mut self, g: &Arc<Group>, force: bool) -> Result<()> {
        let shared = self.shared.clone();
        let ctx = &shared.ctx;
        let cursors = &shared.cursors;
        let mut ck = g.ckpt(&ctx.dirty);
        if !ck.is_dirty() && !force {
            return Ok(());
        }
        let mut slot = g.log.write();
        let (state, damaged, duties) = match &mut *slot {
            LogSlot::Deleted => {
                // Its tombstone is on the deleted list (and its lists were
                // forgotten when it was deleted).
                ck.clear_dirty();
                return Ok(());
            }
            LogSlot::Loaded(log) => {
                // What the record names must be in the segment's file
                // (a pwrite to the page cache; its fdatasync is K3's).
                log.flush_tail(ctx)?;
                (log.state(), None, Some(log.take_sync_duties()))
            }
            LogSlot::Unloaded(state) => (state.clone(), None, None),
            LogSlot::Damaged { state, reason } => (state.clone(), Some(reason.clone()), None),
            // No file of its own: recorded with its extents (none for a
            // group without records), nothing to sync (the journal holds
            // its records, synced per the policy).
            LogSlot::Small(list) => (
                LogState {
                    head: list.next_id() - 1,
                    segments: Vec::new(),
                },
                None,
                None,
            ),
        };
        let small = match &*slot {
            LogSlot::Small(list) if list.next_id() > 1 => Some(crate::state::SmallRecord::of(list)),
            _ => None,
        };
        drop(slot);
        ck.clear_dirty();
        let fresh = !ck.capture_once();
        if damaged.is_some() {
            self.damaged.insert(g.id);
        } else {
            self.damaged.remove(&g.id);
        }
        let retention = g.retention();
        self.put(Item::GroupPut(Box::new(GroupRecord {
            group: g.id,
            fresh,
            applied_lsn: ck.applied_lsn(),
            head: state.head,
            segments: state.segments,
            retention,
            damaged,
            small,
            quiet: g.quiet_ids(),
            edits: g.latest_edits(),
            erase: g.erase_ids(),
        })));
        self.duties.extend(duties);
        let mut changed = ck.take_members_changed();
        changed.sort_unstable();
        changed.dedup();
        // The user index follows the member row (storage.md 6.1): a join's
        // entry is written with its row, so the index holds every
        // membership of the state; a leave's delete with its.
        let indexed = !older_build::acts_on(&ctx.config.data_dir);
        for &user in &changed {
            match cursors.take_for_checkpoint(user, g.slot) {
                Some(m) => {
                    self.put(Item::MemberPut {
                        group: g.id,
                        user,
                        cursor: m.cursor,
                        join_point: m.join_point,
                    });
                    if indexed {
                        self.index_changes.push((user, g.id, true));
                    }
                }
                None => {
                    self.put(Item::MemberDelete { group: g.id, user });
                    if indexed {
                        self.index_changes.push((user, g.id, false));
                    }
                }
            }
        }
        let moved = ck.take_cursors_moved();
        drop(ck);
        // Moved cursors, a chunk per lock hold. A user whose membership
        // changed meanwhile is left to the next capture (queued there with
        // its whole row), so a row never pairs a membership with a record
        // older than it.
        for chunk in moved.chunks(CURSORS_PER_LOCK) {
            let ck = g.ckpt(&ctx.dirty);
            for &user in chunk {
                if changed.binary_search(&user).is_ok() || ck.member_changed_since(user) {
                    continue;
                }
                if let Some(m) = cursors.take_for_checkpoint(user, g.slot) {
                    self.put(Item::MemberPut {
                        group: g.id,
                        user,
                        cursor: m.cursor,
                        join_point: m.join_point,
                    });
                }
            }
            drop(ck);
        }
        Ok(())
    }

    /// K3: makes every file the buffered items name durable.
    fn make_durable(&mut self) -> Result<u64> {
        self.flush.check()?;
        let ctx = &self.shared.ctx;
        let synced = 0;
        if self.duties.len() > SYNCFS_THRESHOLD_GROUPS {
            match ctx.vfs.sync_filesystem(&ctx.config.data_dir) {
                Ok(()) => return Ok(synced + 1),
                // Not trustworthy on this kernel: sync each file instead.
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {}
                Err(e) => {
                    return Err(Error::io(
                        format!("syncfs {}", ctx.config.data_dir.display()),
                        e,
                    ))
                }
            }
        }
        let mut syncs = synced;
        for d in &self.duties {
            syncs += d.sync(ctx)?;
        }
        Ok(syncs)
    }

    /// K3, the journal's part: every frame a captured record reflects (up
    /// to its `applied_lsn`; a small group's extents point into frames)
    /// must be durable before a manifest names it. Otherwise a power cut
    /// under `never` or `interval` right after the checkpoint leaves a
    /// manifest naming records the journal lost: a small group's extents
    /// past its file's end, frame numbers the next frames would be given
    /// again. K2 copies records fuzzily, also of frames written after the
    /// capture: those are in the files from P's (`seq`) on. The capture's
    /// roll synced the files before P, and each roll since synced the file
    /// it left, so only the newest holds unsynced bytes; each is synced
    /// (one `fdatasync`, little to write for all but the newest). Under
    /// `always` every applied frame was synced before it was applied.
    fn sync_journal_since(&self, seq: u64) -> Result<u64> {
        let ctx = &self.shared.ctx;
        if ctx.config.fsync == crate::FsyncPolicy::Always {
            return Ok(0);
        }
        let jdir = journal::journal_dir(&ctx.config.data_dir);
        let mut syncs = 0;
        for (s, path) in journal::list(&*ctx.vfs, &jdir)? {
            if s < seq {
                continue;
            }
            ctx.vfs
                .open(&path, OpenMode::ReadWrite)
                .and_then(|f| f.sync_data())
                .map_err(|e| Error::io(format!("fdatasync {}", path.display()), e))?;
            syncs += 1;
        }
        Ok(syncs)
    }

    /// K2-K7 for one capture.
    fn checkpoint(&mut self, job: Capture) -> Result<()> {
        let started = Instant::now();
        self.capture(job.taken)?;
        // A requested checkpoint applies the retention policies first; what
        // they drop is recorded by this checkpoint (and the files go after
        // the next one, D6).
        if job.retention {
            for g in self.retention() {
                self.capture_group(&g, true)?;
            }
            let mut st = self.shared.ckpt.status.lock();
            st.wanted = false;
            st.wanted_at = None;
        }
        let mut syncs = self.make_durable()?;
        syncs += self.sync_journal_since(job.replay.seq)?;
        let shared = self.shared.clone();
        let ctx = &shared.ctx;
        // K4: the delta run.
        let mut runs: Vec<RunMeta> = self.last.as_ref().map_or(Vec::new(), |m| m.runs.clone());
        let mut written = 0u64;
        let delta_seq = self.next_run_seq;
        // Runs without a complete user index (written by an older build)
        // get one now: an entry for every member row they hold, written
        // with this delta, whose own rows carry theirs.
        let older_build = older_build::acts_on(&ctx.config.data_dir);
        let index = match &self.last {
            Some(m) if !m.user_index && !older_build => user_index_of_runs(ctx, &runs)?,
            _ => Vec::new(),
        };
        normalize_index_changes(&mut self.index_changes);
        let index = if index.is_empty() {
            std::borrow::Cow::Borrowed(&self.index_changes[..])
        } else {
            std::borrow::Cow::Owned(with_catch_up(&index, &self.index_changes))
        };
        let delta = write_run(ctx, delta_seq, with_index_entries(&self.delta, &index))?;
        if let Some(run) = delta {
            self.next_run_seq = next_seq(self.next_run_seq, "run")?;
            written += run.bytes();
            syncs += run.parts.len() as u64 + 1;
            runs.insert(0, run);
        }
        // K5: merge the newest runs if the policy says so. A full disk, or
        // a merge (at most the bytes of its inputs) that would use the
        // free-space reserve, skips the merge (the delta alone is a valid
        // checkpoint).
        let n = merge::plan(&runs.iter().map(RunMeta::bytes).collect::<Vec<_>>());
        let merge_bytes: u64 = runs.iter().take(n).map(RunMeta::bytes).sum();
        if n >= 2
            && ctx
                .reserve
                .allows(&*ctx.vfs, &ctx.config, "a run merge", merge_bytes)
                .is_ok()
        {
            let seq = self.next_run_seq;
            let includes_oldest = n == runs.len();
            let merged = with_merge(ctx, &runs[..n], includes_oldest, |items| {
                write_run(ctx, seq, items)
            })
            .map_err(|reason| Error::Corrupt {
                path: state_dir(&ctx.config.data_dir),
                group: None,
                offset: 0,
                reason: format!("a run to merge cannot be read: {reason}"),
            })?;
            match merged {
                Ok(merged) => {
                    self.next_run_seq = next_seq(self.next_run_seq, "run")?;
                    runs.drain(..n);
                    if let Some(run) = merged {
                        written += run.bytes();
                        syncs += run.parts.len() as u64 + 1;
                        runs.insert(0, run);
                    }
                }
                Err(e @ Error::NoSpace { .. }) => log::warn!("run merge put off: {e}"),
                Err(e) => return Err(e),
            }
        }
        // K6: the manifest.
        let m = Manifest {
            ckpt_seq: self.next_ckpt_seq,
            replay_journal_seq: job.replay.seq,
            replay_lsn: job.replay.lsn,
            replay_round: job.replay.round,
            created_ms: crate::clock::now_ms(),
            next_run_seq: self.next_run_seq,
            clean: job.clean,
            runs,
            pinned: job.pinned,
            // Read after the capture: both only rise, so they cover the
            // captured state (captures wait for a background load, so
            // every group and membership is registered).
            groups_per_user_bound: Some(self.shared.cursors.groups_per_user_high()),
            groups_bound: Some(self.shared.catalog.read().len_high() as u64),
            // Complete before, or made complete by this delta (above).
            user_index: !older_build,
        };
        let mdir = manifest::manifest_dir(&ctx.config.data_dir);
        manifest::store(&*ctx.vfs, &mdir, &m)?;
        // Snapshots begun from now on copy this checkpoint (`pins::Holds`).
        self.holds.set_newest(&m);
        syncs += 2;
        written += manifest::encode(&m).map_or(0, |b| b.len() as u64);
        let items = self.delta.len() + index.len();
        // Given back, not kept at their peak size (a checkpoint of many
        // groups must not leave memory per group behind).
        self.delta = BTreeMap::new();
        self.index_changes = Vec::new();
        self.duties = Vec::new();
        self.next_ckpt_seq = next_seq(self.next_ckpt_seq, "checkpoint")?;
        self.prev = self.last.replace(m);
        // K7: what neither kept manifest needs.
        self.release(ctx);
        // Then small groups' records out of files they alone keep.
        self.reclaim();
        // Then the room a burst of joins and leaves left in the users'
        // lists of memberships (stored now, so the lists stay as they are
        // until the next burst).
        self.shared.cursors.compact_lists();
        // Then recalled messages out of large groups' segments.
        let shared = &self.shared;
        let load = |g: &Arc<Group>| crate::commit::worker_jobs::queue_load(shared, g);
        let erased = crate::state::erase_segments::run(ctx, &shared.catalog, &load);
        if erased.segments_rewritten > 0 {
            log::info!(
                "erasure: {} segments rewritten ({} bytes)",
                erased.segments_rewritten,
                erased.bytes_written
            );
        }
        self.ask_while_erasing(ctx);
        let took = started.elapsed();
        let c = &self.shared.counters;
        c.checkpoints.fetch_add(1, Ordering::Relaxed);
        c.checkpoint_syncs.fetch_add(syncs, Ordering::Relaxed);
        c.checkpoint_bytes.fetch_add(written, Ordering::Relaxed);
        c.checkpoint_bytes_max.fetch_max(written, Ordering::Relaxed);
        let ms = took.as_millis() as u64;
        c.checkpoint_ms_total.fetch_add(ms, Ordering::Relaxed);
        c.checkpoint_ms_max.fetch_max(ms, Ordering::Relaxed);
        log::info!(
            "checkpoint {} (replay from journal {}, lsn {}): {items} items, {written} bytes, \
             {} runs, {syncs} syncs, {took:.1?}",
            self.next_ckpt_seq - 1,
            job.replay.seq,
            job.replay.lsn,
            self.last.as_ref().map_or(0, |m| m.runs.len()),
        );
        Ok(())
    }

    /// Erasure's bound on a quiet node (storage.md section 16, item 16):
    /// while a journal file at or below `erase_journal_seq` exists (it may
    /// hold a recalled payload), asks for the next checkpoint one
    /// `checkpoint_interval_ms` from now, so the file leaves the replay
    /// window, is evacuated and goes with K7 without waiting for traffic.
    /// One directory listing per stored checkpoint.
    fn ask_while_erasing(&self, ctx: &LogContext) {
        let up_to = ctx.erase_journal_seq.load(Ordering::Relaxed);
        let jdir = journal::journal_dir(&ctx.config.data_dir);
        // Also while a group's erase list waits for the segment pass
        // (`erase_segments.rs`): its next stored checkpoint runs it again.
        // The files wait for K7, which deletes none while a group is
        // damaged: then asking would only repeat checkpoints until a
        // repair, so the wait is for the files only with no damage.
        let pending = !ctx.erase_groups.lock().is_empty()
            || (self.damaged.is_empty()
                && (self.reclaimer.as_ref().is_some_and(|r| r.erasing(ctx))
                    || journal::list(&*ctx.vfs, &jdir)
                        .unwrap_or_default()
                        .iter()
                        .any(|&(seq, _)| seq <= up_to)));
        if !pending {
            return;
        }
        let at = Instant::now() + Duration::from_millis(ctx.config.checkpoint_interval_ms);
        let mut st = self.shared.ckpt.status.lock();
        if !st.wanted {
            st.wanted = true;
            st.wanted_at = Some(at);
        }
        drop(st);
        self.shared.pending_cv.notify_all();
    }

    /// Evacuation and compaction (rewrite.rs) after a stored checkpoint: a
    /// failure ends the pass (nothing installed depends on a failed copy)
    /// and the next checkpoint's pass goes on.
    fn reclaim(&mut self) {
        let Some(floor) = self.prev.as_ref().map(|m| m.replay_journal_seq) else {
            return;
        };
        let shared = self.shared.clone();
        let Some(r) = self.reclaimer.as_mut() else {
            return;
        };
        match r.run(&shared.ctx, &shared.catalog, floor) {
            Ok(s) => {
                let c = &shared.counters;
                c.reclaim_bytes_copied
                    .fetch_add(s.bytes_copied, Ordering::Relaxed);
                c.reclaim_files.fetch_add(
                    s.journal_files_evacuated + s.cold_files_compacted,
                    Ordering::Relaxed,
                );
            }
            // Logged (once a spell) and counted by the reserve.
            Err(Error::DiskFull { .. }) => {}
            Err(e) => log::warn!("reclaiming small groups' space put off: {e}"),
        }
    }

    /// K7: deletes what neither kept manifest (`last`, `prev`) needs:
    /// other manifests, run parts neither names, journal files before
    /// `prev`'s replay position that neither pins and no small group's
    /// records are in now (none while a group is damaged: they may hold
    /// its records for a repair), and graveyard files dropped before
    /// `last`'s capture. Failures are logged: a file left behind is
    /// removed by a later checkpoint.
    fn release(&mut self, ctx: &LogContext) {
        let Some(last) = &self.last else {
            return;
        };
        // A snapshot is being copied (`pins::Holds`): nothing goes. The
        // first checkpoint after the last hold ends deletes what this one
        // would have (its rules read listings and the graveyard list).
        // A hold begun after this check holds this manifest or the one
        // before it, whose files this K7 keeps anyway.
        if self.holds.active() {
            log::debug!(
                "checkpoint {}: deletions deferred by a snapshot",
                last.ckpt_seq
            );
            return;
        }
        let keep_runs: HashSet<u64> = last
            .runs
            .iter()
            .chain(self.prev.iter().flat_map(|m| m.runs.iter()))
            .map(|r| r.run_seq)
            .collect();
        let keep_manifests = [Some(last.ckpt_seq), self.prev.as_ref().map(|m| m.ckpt_seq)];
        let remove = |path: &Path| {
            if let Err(e) = ctx.vfs.remove_file(path) {
                log::warn!("could not remove {}: {e}", path.display());
            }
        };
        let mdir = manifest::manifest_dir(&ctx.config.data_dir);
        if let Ok(list) = manifest::list(&*ctx.vfs, &mdir) {
            for (seq, path) in list {
                if !keep_manifests.contains(&Some(seq)) {
                    remove(&path);
                }
            }
        }
        let sdir = state_dir(&ctx.config.data_dir);
        if let Ok(list) = ctx.vfs.read_dir(&sdir) {
            for path in list {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if let Some((seq, _)) = run::parse_part_file_name(name) {
                    if !keep_runs.contains(&seq) {
                        remove(&path);
                    }
                }
            }
        }
        if let (Some(prev), true) = (&self.prev, self.damaged.is_empty()) {
            let jdir = journal::journal_dir(&ctx.config.data_dir);
            // Out of the round index first: a reader that finds a round's
            // position and then no file reports it compacted.
            ctx.rounds.forget_files_below(prev.replay_journal_seq);
            // Small groups' records keep a shared file while either kept
            // manifest or the memory state names it (`pins.rs`); the cold
            // file being written stays whatever it holds.
            let writing = self.reclaimer.as_ref().and_then(|r| r.writing());
            // The files are listed and unlinked without the live-bytes
            // lock: the commit thread takes it for every send to a small
            // group, and an unlink may wait for the disk. A file judged
            // deletable holds no live record and lies before both kept
            // replay positions, so nothing adds to it meanwhile.
            let files = shared_files(ctx, &jdir);
            let mut live = ctx.live.lock();
            let mut gone = Vec::new();
            for (file, path) in files {
                let go = Some(file) != writing
                    && pins::deletable(
                        file,
                        prev.replay_journal_seq,
                        &last.pinned,
                        &prev.pinned,
                        &live,
                    );
                if go {
                    live.forget(file);
                    gone.push((file, path));
                }
            }
            drop(live);
            for (file, path) in gone {
                remove(&path);
                ctx.shared_files.forget(file);
            }
        }
        let stored = last.ckpt_seq;
        self.graveyard.retain(|(path, tag)| {
            if *tag < stored {
                remove(path);
                false
            } else {
                true
            }
        });
        if !self.graveyard.is_empty() {
            // Files this checkpoint recorded as dropped go with the next
            // one, which a quiet node would otherwise never take (nothing
            // else changes): ask for it, so retention gives the disk back
            // within two checkpoints whatever the load. It stores a later
            // sequence number, so every file now in the graveyard goes
            // then and this asks at most once per drop.
            let mut st = self.shared.ckpt.status.lock();
            st.wanted = true;
            st.wanted_at = None;
            drop(st);
            self.shared.pending_cv.notify_all();
        }
    }
}

#[cfg(test)]
mod index_change_tests {
    use super::{normalize_index_changes, with_catch_up};

    #[test]
    fn the_last_change_of_a_key_wins_and_a_change_wins_over_the_catch_up() {
        // A join, a leave and a join again of (1, 5); (2, 3) left; a
        // retried checkpoint appends after a normalized prefix.
        let mut changes = vec![(1, 5, true), (2, 3, false), (1, 5, false), (1, 5, true)];
        normalize_index_changes(&mut changes);
        assert_eq!(changes, vec![(1, 5, true), (2, 3, false)]);
        changes.push((1, 5, false));
        normalize_index_changes(&mut changes);
        assert_eq!(changes, vec![(1, 5, false), (2, 3, false)]);
        let catch_up = [(1, 4), (1, 5), (2, 3), (9, 9)];
        assert_eq!(
            with_catch_up(&catch_up, &changes),
            vec![(1, 4, true), (1, 5, false), (2, 3, false), (9, 9, true)]
        );
        assert_eq!(
            with_catch_up(&[(3, 3)], &[(1, 1, true), (4, 4, false)]),
            vec![(1, 1, true), (3, 3, true), (4, 4, false)]
        );
    }
}
