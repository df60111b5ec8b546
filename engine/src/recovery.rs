//! Opening a data directory: the lock, the checkpoint, the replay of the
//! journal written after it, the repair of torn tails, and the lazy load of
//! groups that recovery did not need to touch.
//!
//! The algorithm, step by step, is in format-spec/storage.md "Recovery".

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use crate::checkpoint;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::group_log::{GroupLog, LoadReport, LogContext, LogState};
use crate::io::Vfs;
use crate::journal::{self, EntryKind, Journal, JOURNAL_HEADER_BYTES};
use crate::record;

/// What opening the engine found and repaired.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// The checkpoint was written by a clean shutdown and no journal followed it.
    pub clean_shutdown: bool,
    /// A valid checkpoint was used (otherwise every group was rescanned).
    pub checkpoint_used: bool,
    /// Why the checkpoint was not used, if one existed.
    pub checkpoint_rejected: Option<String>,
    pub groups: u64,
    pub journal_files_replayed: u64,
    pub journal_entries_replayed: u64,
    /// Records appended to group logs from the journal.
    pub records_replayed: u64,
    /// Records found in the journal that the group logs already held.
    pub records_already_present: u64,
    /// Entries for groups that no longer exist (deleted later).
    pub orphan_entries: u64,
    /// `(file, bytes cut, why)` for every torn tail removed.
    pub cuts: Vec<(String, u64, String)>,
    /// Groups that failed verification, with the reason.
    pub damaged_groups: Vec<(u64, String)>,
}

impl RecoveryReport {
    pub fn bytes_cut(&self) -> u64 {
        self.cuts.iter().map(|c| c.1).sum()
    }
}

/// Takes an exclusive advisory lock on `<data_dir>/LOCK` (released when the
/// returned file is closed), creating the data directory if needed.
pub(crate) fn lock_data_dir(vfs: &dyn Vfs, data_dir: &Path) -> Result<File> {
    vfs.create_dir_all(data_dir)
        .map_err(|e| Error::io(format!("mkdir {}", data_dir.display()), e))?;
    let path = data_dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    // SAFETY: flock on a valid open descriptor; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(Error::Locked { path });
    }
    Ok(file)
}

type Registry = HashMap<u64, Arc<Group>>;

/// Rebuilds the in-memory registry from disk and returns the journal to
/// append to. Ends with a checkpoint, so a crash during a later run never
/// replays the same journal twice.
pub(crate) fn recover(ctx: &LogContext) -> Result<(Registry, Journal, RecoveryReport)> {
    let vfs = &*ctx.vfs;
    let data_dir = &ctx.config.data_dir;
    let jdir = journal::journal_dir(data_dir);
    vfs.create_dir_all(&jdir)
        .map_err(|e| Error::io(format!("mkdir {}", jdir.display()), e))?;
    vfs.create_dir_all(&data_dir.join("groups"))
        .map_err(|e| Error::io("mkdir groups", e))?;
    let mut report = RecoveryReport::default();
    let mut groups = Registry::new();

    let replay_from = match checkpoint::load(vfs, data_dir)? {
        Some(Ok(body)) => {
            report.checkpoint_used = true;
            for g in body.groups {
                let state = LogState {
                    head: g.head,
                    segments: g.segments,
                };
                groups.insert(
                    g.group_id,
                    Arc::new(Group::new(g.group_id, LogSlot::Unloaded(state), g.head)),
                );
            }
            report.clean_shutdown = body.clean_shutdown;
            body.journal_seq
        }
        found => {
            if let Some(Err(reason)) = found {
                log::warn!("checkpoint rejected ({reason}); rescanning every group");
                report.checkpoint_rejected = Some(reason);
            }
            discover_groups(ctx, &mut groups, &mut report)?;
            0
        }
    };

    let files: Vec<_> = journal::list(vfs, &jdir)?
        .into_iter()
        .filter(|(seq, _)| *seq >= replay_from)
        .collect();
    let mut next_seq = replay_from.max(1);
    for (i, (seq, path)) in files.iter().enumerate() {
        let newest = i + 1 == files.len();
        let replayed = replay_file(ctx, &mut groups, path, newest, &mut report)?;
        if replayed > 0 {
            report.clean_shutdown = false;
        }
        next_seq = seq + 1;
    }
    for g in groups.values() {
        if let LogSlot::Damaged { reason, .. } = &*g.log.read() {
            report.damaged_groups.push((g.id, reason.clone()));
        }
    }
    report.groups = groups.len() as u64;

    // A fresh checkpoint over a fresh journal: the replayed journal files
    // are no longer needed once the logs they fed are synced.
    let journal = Journal::create(vfs, &jdir, next_seq)?;
    let mut entries = Vec::with_capacity(groups.len());
    for g in groups.values() {
        let mut slot = g.log.write();
        if let LogSlot::Loaded(log) = &mut *slot {
            log.sync(ctx)?;
        }
        if let Some(state) = slot.state() {
            entries.push(checkpoint::GroupEntry {
                group_id: g.id,
                head: state.head,
                segments: state.segments,
            });
        }
    }
    let body = checkpoint::CheckpointBody {
        journal_seq: journal.seq,
        clean_shutdown: false,
        created_ms: crate::engine::now_ms(),
        groups: entries,
    };
    checkpoint::store(vfs, data_dir, &body)?;
    for (seq, path) in journal::list(vfs, &jdir)? {
        if seq < journal.seq {
            vfs.remove_file(&path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
        }
    }
    for (file, bytes, why) in &report.cuts {
        log::warn!("recovery cut {bytes} bytes from {file}: {why}");
    }
    for (g, why) in &report.damaged_groups {
        log::error!("group {g} is damaged: {why}");
    }
    Ok((groups, journal, report))
}

/// Without a usable checkpoint: every group directory is opened and its
/// active segment scanned.
fn discover_groups(
    ctx: &LogContext,
    groups: &mut Registry,
    report: &mut RecoveryReport,
) -> Result<()> {
    let vfs = &*ctx.vfs;
    let root = ctx.config.data_dir.join("groups");
    for shard in vfs
        .read_dir(&root)
        .map_err(|e| Error::io(format!("list {}", root.display()), e))?
    {
        let Ok(dirs) = vfs.read_dir(&shard) else {
            continue;
        };
        for dir in dirs {
            let Some(id) = dir
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            else {
                continue;
            };
            if ctx.group_dir(id) != dir {
                continue; // not a directory this engine would have made
            }
            let slot = match GroupLog::discover(ctx, id) {
                Ok((log, load)) => {
                    note_cut(report, &log, &load);
                    let head = log.head();
                    groups.insert(id, Arc::new(Group::new(id, LogSlot::Loaded(log), head)));
                    continue;
                }
                Err(e) => LogSlot::Damaged {
                    state: LogState {
                        head: 0,
                        segments: vec![(1, 64)],
                    },
                    reason: e.to_string(),
                },
            };
            groups.insert(id, Arc::new(Group::new(id, slot, 0)));
        }
    }
    Ok(())
}

fn note_cut(report: &mut RecoveryReport, log: &GroupLog, load: &LoadReport) {
    if load.bytes_cut > 0 {
        report.cuts.push((
            format!("group {} active segment", log.group_id()),
            load.bytes_cut,
            "torn or unsynced tail".into(),
        ));
    }
}

/// Replays one journal file. Only the newest file may end in a torn entry;
/// an invalid entry in an older one means acknowledged data is unreadable.
fn replay_file(
    ctx: &LogContext,
    groups: &mut Registry,
    path: &Path,
    newest: bool,
    report: &mut RecoveryReport,
) -> Result<u64> {
    let corrupt = |offset: u64, reason: String| Error::Corrupt {
        path: path.to_owned(),
        group: None,
        offset,
        reason,
    };
    let Some(map) = journal::map_file(&*ctx.vfs, path)? else {
        return Ok(0);
    };
    if let Err(reason) = journal::decode_header(&map) {
        if newest {
            // A crash while creating the newest journal file: nothing in it
            // was ever acknowledged.
            report
                .cuts
                .push((path.display().to_string(), map.len() as u64, reason));
            return Ok(0);
        }
        return Err(corrupt(0, reason));
    }
    report.journal_files_replayed += 1;
    let body_max = ctx.config.record_bytes_max();
    let mut it = journal::EntryIter::new(&map[JOURNAL_HEADER_BYTES..], body_max);
    let mut count = 0;
    for entry in it.by_ref() {
        count += 1;
        report.journal_entries_replayed += 1;
        replay_entry(ctx, groups, &entry, report);
    }
    if let Some(reason) = it.stop_reason() {
        let valid = (JOURNAL_HEADER_BYTES + it.position()) as u64;
        if !newest {
            return Err(corrupt(
                valid,
                format!("invalid entry in a journal that is not the newest: {reason}"),
            ));
        }
        report.cuts.push((
            path.display().to_string(),
            map.len() as u64 - valid,
            reason.to_string(),
        ));
    }
    Ok(count)
}

fn replay_entry(
    ctx: &LogContext,
    groups: &mut Registry,
    entry: &journal::Entry<'_>,
    report: &mut RecoveryReport,
) {
    let id = entry.group_id;
    match entry.kind {
        EntryKind::CreateGroup => {
            if groups.contains_key(&id) {
                return;
            }
            let slot = match GroupLog::create(ctx, id) {
                Ok(log) => LogSlot::Loaded(log),
                Err(e) => LogSlot::Damaged {
                    state: LogState {
                        head: 0,
                        segments: vec![(1, 64)],
                    },
                    reason: e.to_string(),
                },
            };
            groups.insert(id, Arc::new(Group::new(id, slot, 0)));
        }
        EntryKind::DeleteGroup => {
            if let Some(g) = groups.remove(&id) {
                let dir = ctx.group_dir(id);
                *g.log.write() = LogSlot::Deleted;
                if ctx.vfs.exists(&dir) {
                    if let Err(e) = ctx.vfs.remove_dir_all(&dir) {
                        log::warn!(
                            "could not remove deleted group directory {}: {e}",
                            dir.display()
                        );
                    }
                }
            }
        }
        EntryKind::Record => {
            let Some(group) = groups.get(&id) else {
                report.orphan_entries += 1;
                return;
            };
            ensure_loaded_reporting(ctx, group, report);
            let mut slot = group.log.write();
            let LogSlot::Loaded(log) = &mut *slot else {
                return;
            };
            let header = match record::decode_verified(entry.body, ctx.config.record_bytes_max()) {
                Ok(h) if h.record_len as usize == entry.body.len() => h,
                Ok(_) | Err(_) => {
                    let state = log.state();
                    *slot = LogSlot::Damaged {
                        state,
                        reason: "journal entry holds an invalid record".into(),
                    };
                    return;
                }
            };
            if header.msg_id <= log.head() {
                report.records_already_present += 1;
            } else if header.msg_id == log.head() + 1 {
                match log.append(ctx, entry.body) {
                    Ok(()) => {
                        report.records_replayed += 1;
                        group.publish_head(log.head());
                    }
                    Err(e) => {
                        let state = log.state();
                        *slot = LogSlot::Damaged {
                            state,
                            reason: format!("replay failed: {e}"),
                        };
                    }
                }
            } else {
                let reason = format!(
                    "journal holds msg_id {} but the log ends at {}",
                    header.msg_id,
                    log.head()
                );
                let state = log.state();
                *slot = LogSlot::Damaged { state, reason };
            }
        }
    }
}

fn ensure_loaded_reporting(ctx: &LogContext, group: &Group, report: &mut RecoveryReport) {
    if let Some((log_id, load)) = load_slot(ctx, group) {
        if load.bytes_cut > 0 {
            report.cuts.push((
                format!("group {log_id} active segment"),
                load.bytes_cut,
                "written after the checkpoint".into(),
            ));
        }
    }
}

/// Loads the group's log if it is still as the checkpoint left it.
pub(crate) fn ensure_loaded(ctx: &LogContext, group: &Group) {
    if let Some((id, load)) = load_slot(ctx, group) {
        if load.bytes_cut > 0 {
            log::warn!(
                "group {id}: cut {} bytes written after the last checkpoint",
                load.bytes_cut
            );
        }
    }
}

fn load_slot(ctx: &LogContext, group: &Group) -> Option<(u64, LoadReport)> {
    if !matches!(&*group.log.read(), LogSlot::Unloaded(_)) {
        return None;
    }
    let mut slot = group.log.write();
    let LogSlot::Unloaded(state) = &*slot else {
        return None; // another thread loaded it meanwhile
    };
    match GroupLog::load(ctx, group.id, state) {
        Ok((log, load)) => {
            group.publish_head(log.head());
            *slot = LogSlot::Loaded(log);
            Some((group.id, load))
        }
        Err(e) => {
            log::error!("group {} is damaged: {e}", group.id);
            let state = state.clone();
            *slot = LogSlot::Damaged {
                state,
                reason: e.to_string(),
            };
            None
        }
    }
}
