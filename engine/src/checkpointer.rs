//! The checkpoint protocol (format-spec/storage.md section 9,
//! "Checkpoint"): apply retention, make every group log durable, start the
//! next journal file, store the checkpoint atomically (`checkpoint.rs`
//! holds its file format), then delete the journal files and segments it
//! no longer needs. Run by the commit thread between rounds and by
//! recovery at the end of an open.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::catalog::Catalog;
use crate::checkpoint::{self, CheckpointBody, GroupEntry};
use crate::cursors::CursorTable;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::group_log::LogContext;
use crate::journal::{self, Journal, JournalOptions, JournalStart};
use crate::member_snapshot;
use crate::retention;

/// Number of sealed segments the group's retention policy drops now.
pub(crate) fn plan_retention(
    ctx: &LogContext,
    cursors: &CursorTable,
    g: &Group,
) -> Result<Option<usize>> {
    let policy = g.retention();
    if policy.keeps_everything() {
        return Ok(None);
    }
    let slot = g.log.read();
    let LogSlot::Loaded(log) = &*slot else {
        return Ok(None);
    };
    let sealed = log.sealed_segments(ctx, policy.max_age_ms > 0)?;
    let min_cursor = g.min_cursor(cursors);
    let n = retention::droppable(
        &policy,
        &sealed,
        log.total_bytes(),
        min_cursor,
        crate::now_ms(),
    );
    Ok((n > 0).then_some(n))
}

/// Removes the journal file a checkpoint that failed had started, so no
/// half-written journal header is left beyond the one in use. (Left behind,
/// it would be an empty newest journal, which recovery also accepts.)
fn remove_unused_journal(ctx: &LogContext, dir: &std::path::Path, seq: u64) {
    let path = journal::journal_path(dir, seq);
    if ctx.vfs.exists(&path) {
        if let Err(e) = ctx.vfs.remove_file(&path) {
            log::warn!("could not remove unused {}: {e}", path.display());
        }
    }
}

/// Above this many groups with unsynced writes, a checkpoint syncs the
/// whole file system once instead of each segment file.
const SYNCFS_THRESHOLD_GROUPS: usize = 64;

pub(crate) struct CheckpointDone {
    pub journal: Journal,
    pub syncs: u64,
    /// Size of the checkpoint file written.
    pub bytes: u64,
}

/// Where a checkpoint's time went, for the log line operators read when
/// latency spikes line up with checkpoints.
#[derive(Default)]
struct CheckpointTimes {
    sync: Duration,
    memberships: Duration,
    store: Duration,
    membership_bytes: usize,
}

/// The checkpoint protocol (format-spec/storage.md "Checkpoint"): apply
/// retention, make every group log durable, start journal file
/// `next_journal.seq` (its frames numbered on from `next_journal`), write
/// the checkpoint atomically, then delete older journal files and the
/// segments retention dropped.
pub(crate) fn write_checkpoint(
    ctx: &LogContext,
    catalog: &Catalog,
    cursors: &CursorTable,
    next_journal: JournalStart,
    clean_shutdown: bool,
) -> Result<CheckpointDone> {
    let next_journal_seq = next_journal.seq;
    // Every open starts a journal one above the newest: a checkpoint that
    // leaves no room for it would leave a directory that cannot reopen.
    if next_journal_seq == u64::MAX {
        return Err(Error::WritesStopped {
            reason: "journal sequence numbers exhausted".into(),
        });
    }
    let mut entries = Vec::with_capacity(catalog.len());
    let mut ordinals: Vec<u64> = Vec::new();
    // Retention drops are planned here but done only once the new
    // checkpoint is stored: until then the current one names those segments.
    let mut planned_drops: Vec<(&Group, usize)> = Vec::new();
    let mut syncs = 0;
    let mut any_damaged = false;
    let mut times = CheckpointTimes::default();
    let started = Instant::now();
    // Every record the checkpoint covers must be in its segment file before
    // the files are synced.
    for g in catalog.groups() {
        if let LogSlot::Loaded(log) = &mut *g.log.write() {
            log.flush_tail(ctx)?;
        }
    }
    // Many groups to sync: one syncfs beats one fdatasync per segment file.
    let dirty = catalog
        .groups()
        .filter(|g| matches!(&*g.log.read(), LogSlot::Loaded(l) if l.needs_sync()))
        .count();
    let sync_all = dirty > SYNCFS_THRESHOLD_GROUPS
        && match ctx.vfs.sync_filesystem(&ctx.config.data_dir) {
            Ok(()) => true,
            // Not trustworthy on this kernel: sync each file instead.
            Err(e) if e.kind() == std::io::ErrorKind::Unsupported => false,
            Err(e) => {
                return Err(Error::io(
                    format!("syncfs {}", ctx.config.data_dir.display()),
                    e,
                ))
            }
        };
    if sync_all {
        syncs += 1;
    }
    for g in catalog.groups() {
        let drop_n = plan_retention(ctx, cursors, g).unwrap_or_else(|e| {
            log::warn!("group {}: retention skipped: {e}", g.id);
            None
        });
        let mut slot = g.log.write();
        let mut drop_n = drop_n.unwrap_or(0);
        if let LogSlot::Loaded(log) = &mut *slot {
            drop_n = log.droppable(drop_n);
            if drop_n > 0 {
                planned_drops.push((g, drop_n));
            }
            if sync_all {
                log.mark_synced();
            } else if log.needs_sync() {
                syncs += log.sync(ctx)?;
            }
        }
        if let Some(mut state) = slot.state() {
            state.segments.drain(..drop_n);
            if ordinals.len() <= g.slot as usize {
                ordinals.resize(g.slot as usize + 1, u64::MAX);
            }
            ordinals[g.slot as usize] = entries.len() as u64;
            let damaged = match &*slot {
                LogSlot::Damaged { reason, .. } => Some(reason.clone()),
                _ => None,
            };
            any_damaged |= damaged.is_some();
            entries.push(GroupEntry {
                group_id: g.id,
                head: state.head,
                segments: state.segments,
                retention: g.retention(),
                damaged,
            });
        }
    }
    times.sync = started.elapsed();
    let started = Instant::now();
    let mut members = Vec::new();
    let mut users = 0u64;
    // The snapshot leaves dirty bits set; they are cleared only once the
    // checkpoint holding it is stored (below). A checkpoint that fails here
    // or later (a full disk puts it off) leaves them for the next flush.
    let snapshot_dirty = cursors.snapshot(|user, ms| {
        users += 1;
        member_snapshot::encode_user(&mut members, user, ms, |slot| ordinals[slot as usize]);
    });
    let mut section = Vec::with_capacity(members.len() + 10);
    member_snapshot::put_varint(&mut section, users);
    section.extend_from_slice(&members);
    drop(members);
    times.membership_bytes = section.len();
    times.memberships = started.elapsed();
    let started = Instant::now();

    let dir = journal::journal_dir(&ctx.config.data_dir);
    let journal = Journal::create(
        ctx.vfs.clone(),
        &dir,
        next_journal,
        JournalOptions::of(&ctx.config),
    )
    .inspect_err(|_| remove_unused_journal(ctx, &dir, next_journal_seq))?;
    let body = CheckpointBody {
        journal_seq: journal.seq,
        clean_shutdown,
        created_ms: crate::now_ms(),
        groups: entries,
        members: section,
    };
    // Journal files from the previous checkpoint on are kept: they are what
    // `checkpoint.prev` replays if the new checkpoint is ever unreadable.
    // While a group is damaged none are deleted: they may hold its records
    // for a repair.
    let current = checkpoint::load(&*ctx.vfs, &checkpoint::path(&ctx.config.data_dir))?;
    let current_valid = matches!(current, Some(Ok(_)));
    // A valid current checkpoint becomes `checkpoint.prev`; an invalid one
    // leaves the existing `checkpoint.prev` in place, whose journals stay.
    let keep_from = match current {
        Some(Ok(current)) => current.journal_seq,
        _ => match checkpoint::load(&*ctx.vfs, &checkpoint::previous_path(&ctx.config.data_dir))? {
            Some(Ok(prev)) => prev.journal_seq,
            _ => journal.seq,
        },
    };
    let bytes = checkpoint::store(&*ctx.vfs, &ctx.config.data_dir, &body, current_valid)
        .inspect_err(|_| remove_unused_journal(ctx, &dir, next_journal_seq))?;
    // The snapshot is durable: the cursors it holds need no flush, unless
    // an ACK moved them since (those stay dirty). Memberships change only
    // on this thread, so none came or went since the snapshot.
    cursors.mark_persisted(&snapshot_dirty);
    drop(snapshot_dirty);
    // The new checkpoint is in force: do what it assumes.
    let mut dropped: Vec<PathBuf> = Vec::new();
    for (g, n) in planned_drops {
        if let LogSlot::Loaded(log) = &mut *g.log.write() {
            dropped.extend(log.drop_oldest(ctx, n));
        }
    }
    if !any_damaged {
        // Out of the round index first: a reader that finds a round's
        // position and then no file reports it compacted.
        ctx.rounds.forget_files_below(keep_from);
        for (seq, path) in journal::list(&*ctx.vfs, &dir)? {
            if seq < keep_from {
                ctx.vfs
                    .remove_file(&path)
                    .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            }
        }
    }
    for path in dropped {
        if let Err(e) = ctx.vfs.remove_file(&path) {
            log::warn!("retention could not remove {}: {e}", path.display());
        }
    }
    times.store = started.elapsed();
    log::info!(
        "checkpoint (journal {}): {} groups, {} syncs {:.1?}, memberships {} bytes {:.1?}, store {:.1?}",
        journal.seq,
        catalog.len(),
        syncs + 3,
        times.sync,
        times.membership_bytes,
        times.memberships,
        times.store
    );
    Ok(CheckpointDone {
        journal,
        syncs: syncs + 3,
        bytes,
    })
}
