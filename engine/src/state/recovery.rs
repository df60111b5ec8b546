//! Opening a data directory: the lock, the newest valid manifest and the
//! merge of its runs (the previous manifest if it fails), the replay of
//! the journal from the manifest's position (each valid entry applied by
//! `apply.rs`, as the commit thread applies it, skipping the frames a
//! group's checkpointed record already reflects), and the repair of torn
//! tails. Groups that recovery did not need to touch are loaded on first
//! use (`Group::load_if_unloaded`). Without a usable checkpoint while data
//! exists it refuses to open (a directory scan cannot find small groups
//! or memberships). Recovery takes no checkpoint itself: it cuts torn
//! journal tails, sweeps stray files no group explains (`damage.rs`:
//! empty segment files above a head, directories of no group, which go to
//! the trash) and starts a new journal file, so it can be repeated after a
//! crash during it.
//!
//! The algorithm, step by step, is in format-spec/storage.md "Recovery".

use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use std::sync::Arc;

use parking_lot::RwLock;

use crate::catalog::Catalog;
use crate::commit::apply;
use crate::commit::context::Context;
use crate::commit::journal::frame::{self, FrameIter, PAYLOAD_HEADER_BYTES};
use crate::commit::journal::{
    self, EntryIter, EntryKind, FrameKind, Journal, JournalStart, JOURNAL_HEADER_BYTES,
    JOURNAL_VERSION,
};
use crate::commit::loading::{JoinNeeds, LimitsWhileLoading};
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::io::Vfs;
use crate::logs::group_log::{LoadReport, LogState};
use crate::logs::record;
use crate::members::cursors::CursorTable;
use crate::state::checkpointer::OnDisk;
use crate::state::damage::{self, HeaderVerdict};
use crate::state::manifest::{self, Manifest};
use crate::state::{lazy, restore, run};

/// What opening the engine found and repaired.
#[derive(Clone, Debug, Default)]
pub struct RecoveryReport {
    /// The checkpoint was written by a clean shutdown and no journal followed it.
    pub clean_shutdown: bool,
    /// A valid checkpoint (manifest and runs) was used (otherwise the
    /// directory held no data: without a usable checkpoint and with data,
    /// recovery refuses to open).
    pub checkpoint_used: bool,
    /// Why the newest manifest was not used, if one existed and was not
    /// (the file and offset of its damage: the manifest, or a run part).
    pub checkpoint_rejected: Option<String>,
    /// Journal entries of frames a group's checkpointed record already
    /// reflected (at or below its `applied_lsn`), skipped.
    pub entries_reflected: u64,
    /// Groups registered when the engine opened: all of them, or, when
    /// `loading_in_background`, those replay and the sweep of `groups/`
    /// took from the runs (the rest follow, `state::lazy`).
    pub groups: u64,
    /// The checkpoint's groups and memberships are still loading: the
    /// group counts here are of the groups registered so far.
    pub loading_in_background: bool,
    pub journal_files_replayed: u64,
    pub journal_entries_replayed: u64,
    /// Records appended to group logs from the journal.
    pub records_replayed: u64,
    /// Records found in the journal that the group logs already held.
    pub records_already_present: u64,
    /// Entries for groups that no longer exist (deleted later).
    pub orphan_entries: u64,
    /// Records of durable journal frames that were damaged after they were
    /// synced and were restored from their intact copies in their groups'
    /// segments.
    pub journal_records_repaired: u64,
    /// Durable journal frames whose envelope was damaged and whose payload
    /// was intact: an envelope holds no data, so nothing was lost.
    pub journal_envelopes_repaired: u64,
    /// `(file, bytes cut, why)` for every torn tail removed.
    pub cuts: Vec<(String, u64, String)>,
    /// Groups that failed verification, with the reason.
    pub damaged_groups: Vec<(u64, String)>,
    /// Groups whose log recovery loaded: their active segment was scanned
    /// and verified (sealed segments are verified when first read).
    pub groups_verified: u64,
    /// Groups left as the checkpoint recorded them, to be loaded and
    /// verified on first use: damage in their files shows up only then.
    pub groups_unverified: u64,
}

impl RecoveryReport {
    pub fn bytes_cut(&self) -> u64 {
        self.cuts.iter().map(|c| c.1).sum()
    }

    /// One line for the start-up log: what was replayed, cut and repaired,
    /// and how many groups were verified, left unverified or found damaged.
    pub fn summary(&self) -> String {
        format!(
            "{} groups{}, clean shutdown: {}, journal entries replayed: {}, records replayed: {}, \
             journal records repaired: {}, damaged frame envelopes repaired: {}, bytes cut: {}, \
             groups loaded and verified: {}, groups not yet verified (loaded on first use): {}, \
             damaged groups: {}",
            self.groups,
            if self.loading_in_background {
                " registered (the rest load in the background)"
            } else {
                ""
            },
            self.clean_shutdown,
            self.journal_entries_replayed,
            self.records_replayed,
            self.journal_records_repaired,
            self.journal_envelopes_repaired,
            self.bytes_cut(),
            self.groups_verified,
            self.groups_unverified,
            self.damaged_groups.len()
        )
    }
}

/// What an operator can do about a journal file that recovery refuses at
/// an offset, given the journal files after it: cutting only this file
/// is not enough while a later file holds entries (recovery refuses a cut
/// file followed by entries), so those must be moved aside too.
pub fn journal_damage_hint(later: &[(u64, std::path::PathBuf)]) -> String {
    let mut hint = String::from(
        "The data directory was not opened, so nothing was dropped. Restore the data \
         directory (or this file) from a backup. To open it anyway, accepting the loss of \
         what the file holds from this offset on, keep a copy of the directory and truncate \
         the file to this offset",
    );
    if !later.is_empty() {
        // Bounded: while a group is damaged journal files are kept, so there
        // may be many.
        const NAMED_MAX: usize = 8;
        let names: Vec<String> = later
            .iter()
            .take(NAMED_MAX)
            .map(|(_, p)| p.display().to_string())
            .collect();
        hint.push_str(&format!(
            ", and move every later journal file out of the journal directory (their \
             entries are lost too): {}",
            names.join(", ")
        ));
        if later.len() > NAMED_MAX {
            hint.push_str(&format!(" and {} more", later.len() - NAMED_MAX));
        }
    }
    hint.push_str("; msg_ids of lost messages may then be given to new messages");
    hint
}

/// Takes an exclusive advisory lock on `<data_dir>/LOCK` (released when the
/// returned file is closed), creating the data directory if needed.
pub(crate) fn lock_data_dir(vfs: &dyn Vfs, data_dir: &Path) -> Result<File> {
    vfs.create_dir_all_durable(data_dir)
        .map_err(|e| Error::io(format!("mkdir {}", data_dir.display()), e))?;
    let path = data_dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    // A lock can outlive its holder for a moment: a process that forks
    // (to spawn anything) while an engine is open shares the descriptor
    // with the child until the child's exec closes it. So a lock found
    // held is tried again for a little while before it counts as taken.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock on a valid open descriptor; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            name_holder(&file);
            return Ok(file);
        }
        if std::time::Instant::now() >= deadline {
            let holder = lock_holder(&path);
            return Err(Error::Locked { path, holder });
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Writes this process's id into the `LOCK` file it holds, so that a
/// process refused the lock can say who holds it (storage.md section 2,
/// "LOCK"). Best effort: the id only informs; the lock is the `flock`.
fn name_holder(mut file: &File) {
    use std::io::{Seek, Write};
    let _ = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| writeln!(file, "{}", std::process::id()));
}

/// The process id a `LOCK` file names, if it names one.
pub(crate) fn lock_holder(path: &Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// How long a held data-directory lock is waited for.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Everything recovery rebuilds.
pub(crate) struct Recovered {
    pub catalog: Catalog,
    pub cursors: CursorTable,
    pub journal: Journal,
    pub report: RecoveryReport,
    /// The manifests in force, for the checkpointer.
    pub on_disk: OnDisk,
    /// A checkpoint should come first (the journal was replayed).
    pub needs_checkpoint: bool,
    /// The groups whose log recovery loaded (replay, segments
    /// that may lead the journal, creations replayed): the engine lists
    /// them for the idle sweep, as it lists every log loaded later.
    pub loaded: Vec<u64>,
    /// The saved state left to load in the background (`state/lazy.rs`).
    pub pending: Option<Arc<lazy::Pending>>,
}

/// Rebuilds the in-memory state from disk and returns the journal to
/// append to (a new file after every existing one).
pub(crate) fn recover(ctx: &Context) -> Result<Recovered> {
    let vfs = &*ctx.vfs;
    let data_dir = &ctx.config.data_dir;
    // Checked again under the lock (`Engine::open` checked before taking
    // it, so that a directory of another format gets nothing written).
    if crate::state::format::check(vfs, data_dir)? == crate::state::format::Found::Empty {
        crate::state::format::create(vfs, data_dir)?;
    }
    let jdir = journal::journal_dir(data_dir);
    let mdir = manifest::manifest_dir(data_dir);
    for dir in [
        jdir.clone(),
        data_dir.join("groups"),
        data_dir.join("state"),
        mdir.clone(),
    ] {
        vfs.create_dir_all_durable(&dir)
            .map_err(|e| Error::io(format!("mkdir {}", dir.display()), e))?;
    }
    let mut report = RecoveryReport::default();
    let mut catalog = Catalog::default();
    let mut cursors = CursorTable::new();
    let mut on_disk = OnDisk::default();

    let manifests = manifest::list(vfs, &mdir)?;
    on_disk.next_ckpt_seq = manifests.last().map_or(1, |(seq, _)| seq.saturating_add(1));
    let mut replay_from = 0;
    let mut loaded = false;
    // The highest `applied_lsn` of a restored group record.
    let mut restored_applied_lsn_max = 0;
    // The saved state loaded in the background, while it is.
    let mut pending: Option<Arc<lazy::Pending>> = None;
    // Where the newest rejected checkpoint is damaged (the run part and
    // offset when its runs did not merge, else the manifest itself).
    let mut first_damage: Option<damage::Located> = None;
    // Newest first: the first that passes its checks and whose runs load.
    let mut older = manifests.iter().rev();
    for (seq, path) in older.by_ref() {
        let (reason, located) = match manifest::load(vfs, path)? {
            Err(reason) => (reason, None),
            Ok(m) if m.ckpt_seq != *seq => (format!("names checkpoint {}", m.ckpt_seq), None),
            Ok(m) => match restore_or_defer(ctx, &mut catalog, &cursors, &m) {
                Ok((applied_max, deferred)) => {
                    pending = deferred;
                    restored_applied_lsn_max = applied_max;
                    replay_from = m.replay_journal_seq;
                    report.clean_shutdown = m.clean;
                    report.checkpoint_used = true;
                    loaded = true;
                    on_disk.last = Some(m);
                    break;
                }
                Err(reason) => {
                    // Start over from nothing for the next candidate.
                    catalog = Catalog::default();
                    cursors = CursorTable::new();
                    *ctx.live.lock() = Default::default();
                    let located = damage::locate_run_damage(vfs, data_dir, &m.runs);
                    (reason, located)
                }
            },
        };
        let located = located.unwrap_or_else(|| damage::Located {
            path: path.clone(),
            offset: 0,
            why: reason.clone(),
        });
        log::warn!(
            "checkpoint {} rejected: {}",
            path.display(),
            located.describe()
        );
        report.checkpoint_rejected.get_or_insert(format!(
            "{}: {}",
            path.display(),
            located.describe()
        ));
        first_damage.get_or_insert(located);
    }
    if !loaded {
        refuse_without_checkpoint(vfs, data_dir, first_damage)?;
    }
    // The one before it stays the fallback: the checkpointer keeps what it
    // needs until the next checkpoint is stored.
    if loaded {
        for (seq, path) in older {
            if let Ok(Ok(m)) = manifest::load(vfs, path) {
                if m.ckpt_seq == *seq {
                    on_disk.prev = Some(m);
                    break;
                }
            }
        }
    }
    let max_run = vfs
        .read_dir(&data_dir.join("state"))
        .map_err(|e| Error::io("list state", e))?
        .iter()
        .filter_map(|p| run::parse_part_file_name(p.file_name()?.to_str()?))
        .map(|(seq, _)| seq)
        .max();
    on_disk.next_run_seq = on_disk
        .last
        .as_ref()
        .map_or(1, |m| m.next_run_seq)
        .max(max_run.map_or(1, |s| s.saturating_add(1)));

    let files: Vec<_> = journal::list(vfs, &jdir)?
        .into_iter()
        .filter(|(seq, _)| *seq >= replay_from)
        .collect();
    // The newest journal file the restored small groups' extents name.
    // Loaded in the background, the groups are not read yet: their
    // extents lie in files before the replay start (a capture starts a new
    // journal file), which the manifest pins.
    let named_newest = match catalog.pending() {
        None => ctx
            .live
            .lock()
            .files()
            .filter(|(f, _)| f.kind() == crate::logs::extents::FileKind::Journal)
            .map(|(f, _)| f.seq())
            .max(),
        Some(_) => on_disk
            .last
            .as_ref()
            .and_then(|m| m.pinned.iter().filter(|&&id| id < 1 << 31).max().copied()),
    };
    check_journal_sequence(
        &jdir,
        &files,
        loaded.then_some(replay_from),
        report.clean_shutdown,
        named_newest,
    )?;
    let report_clean = report.clean_shutdown;
    let mut next_seq = replay_from.max(1);
    let replay_lsn = on_disk.last.as_ref().map_or(0, |m| m.replay_lsn);
    // Frames are numbered on from the furthest any file reached (a file
    // started by a checkpoint names the numbers the writer had reached,
    // also when frames before it were lost to a power cut).
    let mut next_numbers = on_disk
        .last
        .as_ref()
        .map_or((1, 1), |m| (m.replay_lsn.max(1), m.replay_round.max(1)));
    // An invalid frame that no later frame's synced_len shows to be durable
    // ends a journal file's valid part. That is a torn tail (a crash
    // mid-write) only if no later file holds frames; if one does,
    // acknowledged data after it is unreadable and opening fails. (Damage
    // that a synced_len shows to be durable is restored or refused in
    // `Replay::file`.)
    let mut torn: Vec<TornTail> = Vec::new();
    let mut segments_may_lead = false;
    // `(seq, valid length)` of each replayed file written under `never`
    // or `interval`: small groups' extents past it lost their records.
    let mut unsynced_ends: Vec<(u64, u64)> = Vec::new();
    // The file a checkpoint names had its header synced (and its directory
    // entry) before the checkpoint was stored (`Journal::create`), so a
    // missing or damaged header there is damage, not a crash while it was
    // being created. After a clean shutdown that file held no entry, so
    // damage to it loses nothing and stays tolerated, like its absence.
    let checkpoint = loaded.then_some((replay_from, report_clean));
    let header_durable = |seq: u64| damage::journal_header_durable(checkpoint, seq);
    // Replay applies entries the way the commit thread does, to the
    // registry behind the lock the commit thread uses (uncontended here).
    let shared_catalog = RwLock::new(catalog);
    let pending = std::cell::RefCell::new(pending);
    for (i, (seq, path)) in files.iter().enumerate() {
        let mut replay = Replay {
            st: apply::State {
                ctx,
                catalog: &shared_catalog,
                cursors: &cursors,
            },
            report: &mut report,
            later: &files[i + 1..],
            replay_lsn,
            pending: &pending,
        };
        let outcome = replay.file(*seq, path, header_durable(*seq))?;
        if let Some((lsn, round)) = outcome.next {
            next_numbers = (next_numbers.0.max(lsn), next_numbers.1.max(round));
        }
        // The file a clean shutdown's checkpoint names held no entry, so
        // its header's flag says nothing: a clean restart loads no group.
        let held_nothing = loaded && report_clean && *seq == replay_from;
        segments_may_lead |= outcome.segments_may_lead && !held_nothing;
        if outcome.frames > 0 {
            if let Some(t) = torn.first() {
                return Err(Error::Corrupt {
                    path: t.path.clone(),
                    group: None,
                    offset: t.valid,
                    reason: format!(
                        "{} (and a later journal file holds frames). {}",
                        t.reason,
                        journal_damage_hint(later_than(&files, &t.path))
                    ),
                });
            }
        }
        if outcome.replayed > 0 {
            report.clean_shutdown = false;
        }
        if outcome.segments_may_lead {
            let valid = match &outcome.torn {
                Some(t) => Some(t.valid),
                None => vfs
                    .open(path, crate::io::OpenMode::Read)
                    .and_then(|f| f.file_len())
                    .ok(),
            };
            unsynced_ends.extend(valid.map(|v| (*seq, v)));
        }
        torn.extend(outcome.torn);
        next_seq = seq.checked_add(1).ok_or_else(|| Error::Corrupt {
            path: path.clone(),
            group: None,
            offset: 0,
            reason: "journal sequence numbers exhausted".into(),
        })?;
    }
    for t in torn {
        let file = vfs
            .open(&t.path, crate::io::OpenMode::ReadWriteCreate)
            .map_err(|e| Error::io(format!("open {}", t.path.display()), e))?;
        file.set_len(t.valid)
            .and_then(|()| file.sync_data())
            .map_err(|e| Error::io(format!("cut {}", t.path.display()), e))?;
        // Entries that were cut may have reached group segments before the
        // tear (a damaged last write whose records were written out). A
        // file cut to nothing had no valid header, so it held no entry.
        segments_may_lead |= t.valid > 0 && t.len > t.valid;
        report
            .cuts
            .push((t.path.display().to_string(), t.len - t.valid, t.reason));
    }
    let pending = pending.into_inner();
    if let Some(deferred) = &pending {
        // The groups registered from now on get the lowering and the cut
        // as they come, before they are published; those registered so
        // far get them below. Segments that lead the journal are in group
        // directories, whose groups the sweep registers.
        deferred.after_replay(next_numbers.0, unsynced_ends.clone());
        restored_applied_lsn_max = u64::MAX;
    }
    let with_directory = sweep_strays(ctx, &shared_catalog, &cursors)?;
    let catalog = shared_catalog.into_inner();
    cut_small_groups_past_journal_ends(ctx, &catalog, &unsynced_ends, &mut report);
    take_in_promotions_left(
        ctx,
        &catalog,
        &with_directory,
        segments_may_lead,
        &mut report,
    )?;
    // Replay sets `applied_lsn`s below `next_numbers.0` only: the walk is
    // needed only when a restored record reaches it (loaded in the
    // background: the groups registered so far, the others as they come).
    if restored_applied_lsn_max >= next_numbers.0 {
        lower_applied_lsns(ctx, &catalog, next_numbers.0);
    }
    if segments_may_lead {
        // The journal may have lost records that group segments hold. Their
        // msg_ids were given out, so every such group is loaded now: its
        // head covers them before anyone reads it or sends to the group,
        // and it does not jump when the group is first used.
        load_groups_whose_segments_lead(ctx, &catalog, &with_directory, &mut report);
    }
    // The restore clamped every cursor to its group's head: only replay
    // and cuts change heads since (loading groups whose segments lead only
    // raises them).
    if report.journal_entries_replayed > 0 || !report.cuts.is_empty() {
        clamp_cursors_to_heads(&catalog, &cursors);
    }
    let mut loaded_groups = Vec::new();
    let mut stored = 0;
    for g in catalog.groups() {
        let slot = g.log.read();
        stored += slot.stored_messages();
        match &*slot {
            LogSlot::Damaged { reason, .. } => report.damaged_groups.push((g.id, reason.clone())),
            LogSlot::Loaded(_) => {
                report.groups_verified += 1;
                loaded_groups.push(g.id);
            }
            LogSlot::Unloaded(_) => report.groups_unverified += 1,
            LogSlot::Small(_) | LogSlot::Deleted => {}
        }
    }
    report.groups = catalog.len() as u64;
    report.loading_in_background = catalog.pending().is_some();
    // Replay's own damages are counted here, with those the checkpoint
    // recorded; from now on the count changes where damage happens. The
    // same for the stored messages.
    ctx.damaged_groups.store(
        report.damaged_groups.len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    ctx.messages_stored
        .store(stored, std::sync::atomic::Ordering::Relaxed);

    on_disk.damaged = report.damaged_groups.iter().map(|(g, _)| *g).collect();
    // A new journal file after every existing one, numbered on; the
    // replayed files stay until a checkpoint no longer needs them.
    let next = JournalStart {
        seq: next_seq,
        lsn: next_numbers.0,
        round: next_numbers.1,
    };
    ctx.rounds.continue_at(next.round);
    let journal = Journal::create(
        ctx.vfs.clone(),
        &jdir,
        next,
        journal::JournalOptions::of(&ctx.config),
    )?;
    // A directory never checkpointed and with nothing to replay (a new
    // one) gets an empty manifest naming the new journal file, so from
    // its first frame on a lost journal file is noticed (it is named).
    let fresh = manifests.is_empty() && report.journal_entries_replayed == 0;
    if fresh {
        let m = Manifest {
            ckpt_seq: on_disk.next_ckpt_seq,
            replay_journal_seq: next.seq,
            replay_lsn: next.lsn,
            replay_round: next.round,
            created_ms: crate::clock::now_ms(),
            next_run_seq: on_disk.next_run_seq,
            clean: false,
            runs: Vec::new(),
            pinned: Vec::new(),
            groups_per_user_bound: Some(cursors.groups_per_user_high()),
            groups_bound: Some(catalog.len_high() as u64),
            // No run: the index of an empty state is complete.
            user_index: true,
        };
        manifest::store(vfs, &mdir, &m)?;
        on_disk.next_ckpt_seq = on_disk.next_ckpt_seq.saturating_add(1);
        on_disk.last = Some(m);
    }
    // After a crash the first checkpoint comes at once, so the journal
    // just replayed is not replayed again after the next crash.
    let needs_checkpoint = !(fresh || report.clean_shutdown && report.checkpoint_used);
    for (file, bytes, why) in &report.cuts {
        log::warn!("recovery cut {bytes} bytes from {file}: {why}");
    }
    for (g, why) in &report.damaged_groups {
        log::error!("group {g} is damaged: {why}");
    }
    Ok(Recovered {
        catalog,
        cursors,
        journal,
        report,
        on_disk,
        needs_checkpoint,
        loaded: loaded_groups,
        pending,
    })
}

/// Loads a manifest's runs now (returning the highest `applied_lsn` of a
/// group record) or, with `load_in_background`, checks their checksums and
/// leaves them to `state::lazy` (returning 0, no record being read yet,
/// and the load to finish).
#[allow(clippy::type_complexity)]
fn restore_or_defer(
    ctx: &Context,
    catalog: &mut Catalog,
    cursors: &CursorTable,
    m: &manifest::Manifest,
) -> std::result::Result<(u64, Option<Arc<lazy::Pending>>), String> {
    // The slots the state needs at most, taken at once: grown one
    // doubling at a time, the list would be copied under the registry's
    // write lock while requests wait (a background load). Capped by
    // `groups_max`: the bound is a figure a writer stored.
    if let Some(bound) = m.groups_bound {
        let cap = ctx.config.groups_max as u64;
        catalog.reserve_slots(usize::try_from(bound.min(cap)).unwrap_or(0));
    }
    if !ctx.config.load_in_background {
        return restore::restore_runs(ctx, catalog, cursors, m).map(|max| (max, None));
    }
    let limits = LimitsWhileLoading::new(m.groups_per_user_bound, m.groups_bound);
    let pending = Arc::new(lazy::Pending::open(ctx, &m.runs, limits, m.user_index)?);
    catalog.set_pending(Some(pending.clone()));
    Ok((0, Some(pending)))
}

/// Without a usable checkpoint the node does not open: a directory scan
/// cannot see small groups (their records are in journal files only the
/// checkpoint names) nor memberships, so opening would silently lose them.
/// A directory with no manifest at all is new only if it holds no data
/// (`damage::data_without_checkpoint`). `damage` names where the newest
/// rejected checkpoint is damaged.
fn refuse_without_checkpoint(
    vfs: &dyn Vfs,
    data_dir: &Path,
    damage: Option<damage::Located>,
) -> Result<()> {
    const HINT: &str = "The data directory was not opened, so nothing was dropped: restore \
        the checkpoint files (manifest/ and state/) or the data directory from a backup; \
        `tidemark ctl verify` names every damaged file";
    if let Some(d) = damage {
        return Err(Error::Corrupt {
            path: d.path,
            group: None,
            offset: d.offset,
            reason: format!(
                "no usable checkpoint: every kept manifest was rejected, the newest because \
                 of this damage ({}). Without a checkpoint, small groups (whose records are \
                 in journal files) and memberships cannot be found. {HINT}",
                d.why
            ),
        });
    }
    if let Some(path) = damage::data_without_checkpoint(vfs, data_dir)? {
        return Err(Error::Corrupt {
            path: manifest::manifest_dir(data_dir),
            group: None,
            offset: 0,
            reason: format!(
                "no checkpoint (no manifest), but the directory holds data ({}): the \
                 checkpoint state was lost, this is not a new directory. {HINT}",
                path.display()
            ),
        });
    }
    Ok(())
}

/// The files of `files` after the one at `path`.
fn later_than<'a>(
    files: &'a [(u64, std::path::PathBuf)],
    path: &Path,
) -> &'a [(u64, std::path::PathBuf)] {
    files
        .iter()
        .position(|(_, p)| p == path)
        .map_or(&[], |i| &files[i + 1..])
}

/// Journal files must run without a gap from the one the checkpoint names
/// (`first`, when a checkpoint is used): a missing file held acknowledged
/// entries nothing else may hold. The one exception is the file a clean
/// shutdown's checkpoint names, which holds no entry.
/// Small groups whose recorded extents reach past the valid end of a
/// journal file written under `never` or `interval` lost those records
/// with its unsynced bytes (`small_log::cut_past_journal_ends`): cut, and
/// reported as a cut; the next checkpoint records the shorter list.
fn cut_small_groups_past_journal_ends(
    ctx: &Context,
    catalog: &Catalog,
    ends: &[(u64, u64)],
    report: &mut RecoveryReport,
) {
    if ends.is_empty() {
        return;
    }
    for g in catalog.groups() {
        if let Some(why) = crate::commit::small_log::cut_and_mark_past_journal_ends(ctx, g, ends) {
            report.cuts.push((format!("small group {}", g.id), 0, why));
        }
    }
}

/// A group's `applied_lsn` at or above `next_lsn` (the number the next
/// frame gets) names frames the journal no longer holds: a checkpoint
/// captured them, and a power cut under `never` or `interval` lost them
/// before they were synced (a checkpoint stored by this build syncs them
/// first, checkpointer K3). Lowered, so that replay after the next crash
/// applies the new frames of those numbers to the group instead of taking
/// them for reflected.
fn lower_applied_lsns(ctx: &Context, catalog: &Catalog, next_lsn: u64) {
    for g in catalog.groups() {
        let mut ck = g.ckpt(&ctx.dirty);
        if ck.applied_lsn() >= next_lsn {
            ck.set_applied_lsn(next_lsn.saturating_sub(1));
            ctx.dirty.mark(g, &mut ck);
        }
    }
}

fn check_journal_sequence(
    jdir: &Path,
    files: &[(u64, std::path::PathBuf)],
    first: Option<u64>,
    clean_shutdown: bool,
    named_newest: Option<u64>,
) -> Result<()> {
    let missing = |seq: u64, why: String| Error::Corrupt {
        path: journal::journal_path(jdir, seq),
        group: None,
        offset: 0,
        reason: format!(
            "journal file missing: {why}. Its entries (acknowledged messages, joins, \
             cursors) may exist nowhere else. The data directory was not opened, so \
             nothing was dropped: restore the file from a backup"
        ),
    };
    let mut expected = first;
    for (i, (seq, _)) in files.iter().enumerate() {
        match expected {
            Some(e) if *seq != e => {
                let skippable = i == 0 && first == Some(e) && clean_shutdown;
                if !skippable {
                    let why = match i {
                        0 => format!("the checkpoint names file {e} as the first to replay"),
                        _ => format!("files {} and {seq} exist", e - 1),
                    };
                    return Err(missing(e, why));
                }
                log::warn!(
                    "journal file {e} is missing; the clean shutdown's checkpoint names it, \
                     so it held no entry"
                );
            }
            _ => {}
        }
        expected = seq.checked_add(1);
    }
    // A file the restored state's extents name must be there too, also
    // the newest (whose loss the sequence alone does not show): its
    // records were acknowledged, and the next file would otherwise get
    // its number, into which those extents would then point.
    let after_last = files.last().map_or(first, |(seq, _)| seq.checked_add(1));
    if let (Some(named), Some(e)) = (named_newest, after_last) {
        if named >= e {
            return Err(missing(
                e,
                format!("the checkpoint names records of small groups in file {named}"),
            ));
        }
    }
    if let (Some(e), true) = (first, files.is_empty()) {
        if !clean_shutdown {
            return Err(missing(
                e,
                format!("the checkpoint names file {e} as the first to replay"),
            ));
        }
        log::warn!(
            "journal file {e} is missing; the clean shutdown's checkpoint names it, so it held no entry"
        );
    }
    Ok(())
}

/// Loads every group still unloaded whose active segment is longer than
/// the checkpoint recorded or that has a segment file starting just above
/// its recorded head: such a group got records after the checkpoint that
/// the journal no longer holds. Only groups with a directory under
/// `groups/` can hold such records, so only those the sweep found
/// (`with_directory`, all registered by it) are looked at: one open and
/// one lookup per such unloaded group, done only when the journal may
/// have lost records. A group recorded with segments whose directory is
/// missing is damage no crash explains; its load finds it on first use,
/// like any unloaded group's.
fn load_groups_whose_segments_lead(
    ctx: &Context,
    catalog: &Catalog,
    with_directory: &[u64],
    report: &mut RecoveryReport,
) {
    for group in with_directory.iter().filter_map(|&id| catalog.get(id)) {
        let lead = match &*group.log.read() {
            LogSlot::Unloaded(state) => segments_lead(ctx, group.id, state),
            _ => continue,
        };
        if lead {
            ensure_loaded_reporting(ctx, group, report);
            // Its head may have moved past what the runs say: record it.
            let mut ck = group.ckpt(&ctx.dirty);
            ctx.dirty.mark(group, &mut ck);
        }
    }
}

/// Every small group with a directory (`with_directory`, all registered
/// by the sweep): the segment files a promotion left, which a power cut
/// may have kept while it took the journal entries that promoted the
/// group (storage.md section 10, S1), are judged against the group's
/// records now that replay and the cuts are done: adopted when they hold
/// the group's records and more, the group damaged when they are not its
/// records (`small_log::take_in_promotion_left`; files that are not its
/// promotion's, a deleted incarnation's, are left alone). Not only when
/// the journal may have lost records (`journal_lost`, which only files
/// that share no id with the group need): a directory a build without
/// this check left is judged too, at the cost of one listing per such
/// group (a crash during the life of a promotion leaves one).
fn take_in_promotions_left(
    ctx: &Context,
    catalog: &Catalog,
    with_directory: &[u64],
    journal_lost: bool,
    report: &mut RecoveryReport,
) -> Result<()> {
    for group in with_directory.iter().filter_map(|&id| catalog.get(id)) {
        let mut ck = group.ckpt(&ctx.dirty);
        let left = crate::commit::small_log::take_in_promotion_left(ctx, group, journal_lost)?;
        if let Some(load) = left {
            report_load(report, group.id, &load);
            ctx.dirty.mark(group, &mut ck);
        }
    }
    Ok(())
}

fn segments_lead(ctx: &Context, group_id: u64, state: &LogState) -> bool {
    let Some(&(base, len)) = state.segments.last() else {
        return true; // loading reports the damage
    };
    let dir = ctx.group_dir(group_id);
    let active = dir.join(crate::logs::segment::file_name(base));
    let longer = ctx
        .vfs
        .open(&active, crate::io::OpenMode::Read)
        .and_then(|f| f.file_len())
        // A segment that cannot be opened is loaded so the damage is found now.
        .map_or(true, |file_len| file_len > len);
    longer
        || ctx.vfs.exists(&dir.join(crate::logs::segment::file_name(
            state.head.saturating_add(1),
        )))
}

/// After replay, before anything is served: what no group explains under
/// `groups/` (`damage::find_strays`) goes. The directory of a group that
/// does not exist (a deletion whose move to the trash was not durable, a
/// promotion of a group deleted since) is moved to the trash, which the
/// worker empties after the open; a segment file above a group's head that
/// its state does not name and that holds no record (left by a roll or a
/// rewrite a stop cut short) is removed. Each is logged. A damaged group's
/// files are evidence for `ctl repair` and are left alone, and so is a
/// stray segment that holds records (loading the group adopts them) and a
/// small group's directory (judged after replay,
/// [`take_in_promotions_left`]).
/// Returns the groups that have a directory (every one registered now).
fn sweep_strays(
    ctx: &Context,
    catalog: &RwLock<Catalog>,
    cursors: &CursorTable,
) -> Result<Vec<u64>> {
    let vfs = &*ctx.vfs;
    let with_directory = std::cell::RefCell::new(Vec::new());
    let files = |id: u64| {
        // Loaded in the background, a group with files is taken from the
        // runs now; one that cannot be read is left alone.
        let g = match Catalog::find(catalog, ctx, cursors, id) {
            Ok(Some(g)) => g,
            Ok(None) => return damage::GroupFiles::None,
            Err(_) => return damage::GroupFiles::NoSegments,
        };
        with_directory.borrow_mut().push(id);
        let state = match &*g.log.read() {
            LogSlot::Unloaded(state) => state.clone(),
            LogSlot::Loaded(log) => log.state(),
            LogSlot::Small(_) | LogSlot::Damaged { .. } | LogSlot::Deleted => {
                return damage::GroupFiles::NoSegments
            }
        };
        if state.segments.is_empty() {
            return damage::GroupFiles::NoSegments;
        }
        let next = state.head.saturating_add(1);
        damage::GroupFiles::Segments {
            head: state.head,
            names_next: state.segments.iter().any(|&(base, _)| base == next),
        }
    };
    for stray in damage::find_strays(vfs, &ctx.config.data_dir, &files)? {
        match &stray {
            damage::Stray::Directory { group, path } => {
                log::warn!("{}: {}", path.display(), stray.describe());
                ctx.trash.put(vfs, *group, path)?;
            }
            damage::Stray::Segment { path, .. } if stray.is_empty_segment() => {
                log::warn!("{}: {}", path.display(), stray.describe());
                vfs.remove_file(path)
                    .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            }
            damage::Stray::Segment { .. } => {}
        }
    }
    Ok(with_directory.into_inner())
}

/// After replay: no cursor beyond its group's head.
/// The heads are copied by slot first: the walk goes by user, and reading
/// each membership's group in place would cost a cache miss per
/// membership.
fn clamp_cursors_to_heads(catalog: &Catalog, cursors: &CursorTable) {
    let mut heads: Vec<u64> = Vec::new();
    for g in catalog.groups() {
        let slot = g.slot as usize;
        if heads.len() <= slot {
            heads.resize(slot + 1, u64::MAX);
        }
        heads[slot] = g.head();
    }
    let mut moved = Vec::new();
    cursors.clamp_all(
        |slot| heads.get(slot as usize).copied().unwrap_or(u64::MAX),
        |slot, old, new| moved.push((slot, old, new)),
    );
    for (slot, old, new) in moved {
        if let Some(g) = catalog.by_slot(slot) {
            // Recovery is single-threaded: no cursor moves meanwhile.
            g.members.lock().advance(old, new);
        }
    }
}

/// The end of a journal file's valid part, when it ends early.
struct TornTail {
    path: std::path::PathBuf,
    valid: u64,
    len: u64,
    reason: String,
}

#[derive(Default)]
struct FileOutcome {
    /// Valid frames (restored ones included).
    frames: u64,
    /// Of them, the frames at or after the checkpoint's replay position:
    /// applied.
    replayed: u64,
    torn: Option<TornTail>,
    /// The file's header says group segments may hold records it lost.
    segments_may_lead: bool,
    /// The lsn and round index a frame after this file's valid ones would
    /// have (the header's first ones if it holds none); `None` without a
    /// valid header.
    next: Option<(u64, u64)>,
}

/// A durable frame that was damaged, as recovery restored it.
struct Restored {
    kind: FrameKind,
    /// Where the payload starts in the file.
    start: usize,
    /// The payload with its damaged records replaced by their segment
    /// copies (its checksum matches again).
    payload: Vec<u8>,
    end: usize,
    records_restored: u64,
}

/// Where the entries of a frame being replayed lie: `buf` (the file's
/// mapping, or a restored copy of a payload) starts at byte `start` of
/// journal file `seq`.
#[derive(Clone, Copy)]
struct Located<'a> {
    seq: u64,
    buf: &'a [u8],
    start: u64,
}

struct Replay<'a> {
    st: apply::State<'a>,
    report: &'a mut RecoveryReport,
    /// The journal files after the one being replayed (for the hint).
    later: &'a [(u64, std::path::PathBuf)],
    /// Frames before this lsn are reflected in the checkpoint: skipped.
    replay_lsn: u64,
    /// The saved state still to load (`state/lazy.rs`), until a join
    /// needs all of it.
    pending: &'a std::cell::RefCell<Option<Arc<lazy::Pending>>>,
}

impl Replay<'_> {
    /// Replays the valid frames of one journal file; reports where its
    /// valid part ends if it ends before the file does.
    ///
    /// An invalid frame is a torn write unless a frame after it names a
    /// `synced_len` beyond it: then bytes that were durable are damaged.
    /// Such a frame is restored when the damage provably touched only its
    /// envelope (which holds no data) or records whose intact copies are
    /// in their groups' segments, and otherwise opening fails: it held
    /// acknowledged data that exists nowhere else.
    ///
    /// `header_durable`: the file's header was made durable before anything
    /// relied on the file (section 11, step 4), so a file without a valid
    /// header is refused rather than taken for a crash during its creation.
    fn file(&mut self, seq: u64, path: &Path, header_durable: bool) -> Result<FileOutcome> {
        let damaged_header = |reason: &str| Error::Corrupt {
            path: path.to_owned(),
            group: None,
            offset: 0,
            reason: format!(
                "{reason}. The checkpoint in use names this journal file, and its header \
                 was durable before that checkpoint was stored, so this is damage, not a \
                 crash while the file was created: the file's frames (acknowledged \
                 messages, joins, cursors) cannot be read. The data directory was not \
                 opened, so nothing was dropped: restore the data directory (or this file) \
                 from a backup"
            ),
        };
        let map = journal::map_file(&*self.st.ctx.vfs, path)?;
        let bytes: &[u8] = map.as_deref().unwrap_or_default();
        let torn = |valid: usize, reason: String| TornTail {
            path: path.to_owned(),
            valid: valid as u64,
            len: bytes.len() as u64,
            reason,
        };
        // The one judgement of a header that `ctl verify` and `ctl repair`
        // make too (`damage.rs`).
        let header = match damage::judge_journal_header(bytes, bytes.len() as u64, header_durable) {
            HeaderVerdict::Valid(h) => h,
            HeaderVerdict::Empty => return Ok(FileOutcome::default()),
            HeaderVerdict::Unsupported(version) => {
                let what = if version < JOURNAL_VERSION {
                    " (it was written by tidemark 0.1, storage format 1)"
                } else {
                    ""
                };
                return Err(Error::Corrupt {
                    path: path.to_owned(),
                    group: None,
                    offset: 8,
                    reason: format!(
                        "journal version {version} is not supported by this build{what}"
                    ),
                });
            }
            HeaderVerdict::DamagedNamed(reason) => return Err(damaged_header(&reason)),
            // A file longer than its header holds frames, and the writer
            // writes the first frame only after the header and the file's
            // directory entry are synced (`Journal::create`): the header
            // was durable, so this is damage, whichever file it is.
            HeaderVerdict::DamagedWithFrames(reason) => {
                return Err(damaged_header_with_frames(path, &reason))
            }
            // A crash while creating the file: nothing in it was
            // acknowledged (damage if a later file holds frames: `recover`).
            HeaderVerdict::Torn(reason) => {
                return Ok(FileOutcome {
                    torn: Some(torn(0, reason)),
                    ..FileOutcome::default()
                })
            }
        };
        let map = bytes;
        self.report.journal_files_replayed += 1;
        let mut outcome = FileOutcome {
            segments_may_lead: header.segments_may_lead(),
            ..FileOutcome::default()
        };
        let mut pos = JOURNAL_HEADER_BYTES;
        let (mut lsn, mut round) = (header.first_lsn, header.first_round);
        // The furthest proof (a valid envelope's synced_len) after the last
        // bad frame, kept while it still lies after the next one.
        let mut proof: Option<(u64, usize)> = None;
        loop {
            let mut it = FrameIter::new(map, pos, header.mark_key, lsn, round);
            for f in it.by_ref() {
                outcome.frames += 1;
                if f.envelope.kind == FrameKind::Round {
                    let round = frame::payload_header(f.payload).map_or(0, |h| h.round_index);
                    self.st.ctx.rounds.record(seq, f.offset as u64, round);
                }
                if f.envelope.lsn >= self.replay_lsn {
                    outcome.replayed += 1;
                    let at = Located {
                        seq,
                        buf: map,
                        start: 0,
                    };
                    self.frame_entries(f.entries(), f.envelope.lsn, at)?;
                }
            }
            pos = it.position();
            (lsn, round) = it.next_numbers();
            let Some(reason) = it.stop_reason().map(str::to_owned) else {
                break;
            };
            let bad = pos;
            if proof.is_none_or(|(_, at)| at <= bad) {
                proof = frame::furthest_proof_from(map, bad + 1, header.mark_key);
            }
            let Some((synced, proof_at)) = proof.filter(|&(synced, _)| synced > bad as u64) else {
                outcome.torn = Some(torn(bad, reason));
                break;
            };
            match self.restore_frame(map, bad, header.mark_key, lsn, round) {
                Ok(r) => {
                    log::warn!(
                        "journal {} offset {bad}: {reason}; the frame (lsn {lsn}) was durable and \
                         is restored: {}",
                        path.display(),
                        if r.records_restored == 0 {
                            "only its envelope, which holds no data, was damaged".to_string()
                        } else {
                            format!(
                                "{} damaged records were replaced by their intact copies in \
                                 their groups' segments",
                                r.records_restored
                            )
                        }
                    );
                    if r.records_restored == 0 {
                        self.report.journal_envelopes_repaired += 1;
                    }
                    self.report.journal_records_repaired += r.records_restored;
                    outcome.frames += 1;
                    if r.kind == FrameKind::Round {
                        // Its bytes in the file stay damaged: a read of
                        // the round reports it (`Corrupt`).
                        self.st.ctx.rounds.record(seq, bad as u64, round);
                    }
                    if lsn >= self.replay_lsn {
                        outcome.replayed += 1;
                        let entries = EntryIter::new(&r.payload[PAYLOAD_HEADER_BYTES..], r.kind);
                        // The copy of the payload lies at `start` in the file;
                        // a small group's records in it are the file's bytes
                        // (only records of groups with segments are restored).
                        let at = Located {
                            seq,
                            buf: &r.payload,
                            start: r.start as u64,
                        };
                        self.frame_entries(entries, lsn, at)?;
                    }
                    pos = r.end;
                    lsn = lsn.saturating_add(1);
                    if r.kind == FrameKind::Round {
                        round = round.saturating_add(1);
                    }
                }
                Err(why) => {
                    return Err(Error::Corrupt {
                        path: path.to_owned(),
                        group: None,
                        offset: bad as u64,
                        reason: format!(
                            "{reason}. This is not a torn write: the frame at offset \
                             {proof_at} shows that the file was durable up to offset {synced}, \
                             so acknowledged frames were damaged, and they are not all intact \
                             elsewhere ({why}). {}",
                            journal_damage_hint(self.later)
                        ),
                    });
                }
            }
        }
        outcome.next = Some((lsn, round));
        Ok(outcome)
    }

    /// Restores the durable frame at `bad` (expected to be numbered `lsn`
    /// and, if a Round frame, `round`), if the damage provably touched
    /// nothing that only it held:
    /// - its extent is confirmed: the payload length its envelope gives
    ///   (checked or not) ends where a valid envelope numbered `lsn + 1`
    ///   starts;
    /// - and either its payload is valid (the damage is in the envelope,
    ///   which holds no data), or its payload's structure parses and
    ///   replacing each record that fails its own CRC by the group's
    ///   stored record of that msg_id (same length) makes the payload's
    ///   stored checksum match again.
    ///
    /// Otherwise says why not.
    fn restore_frame(
        &mut self,
        map: &[u8],
        bad: usize,
        mark_key: u32,
        lsn: u64,
        round: u64,
    ) -> Result<Restored, String> {
        let env = map
            .get(bad..bad + frame::ENVELOPE_BYTES)
            .ok_or("its envelope is truncated")?;
        let checked = frame::envelope_at(map, bad, mark_key).ok();
        if checked.is_some_and(|e| e.lsn != lsn) {
            return Err(format!(
                "its intact envelope names lsn {}",
                checked.map_or(0, |e| e.lsn)
            ));
        }
        let payload_len = u32::from_le_bytes([env[4], env[5], env[6], env[7]]) as usize;
        let start = bad + frame::ENVELOPE_BYTES;
        let end = start
            .checked_add(payload_len)
            .filter(|&e| e < map.len())
            .ok_or("its payload length runs past the last frame")?;
        match frame::envelope_at(map, end, mark_key) {
            Ok(next) if Some(next.lsn) == lsn.checked_add(1) => {}
            _ => return Err("no valid frame follows where its payload length says it ends".into()),
        }
        let payload = &map[start..end];
        let header = frame::payload_header(payload).ok_or("its payload has no header")?;
        // An unchecked kind byte is trusted only if it is a kind; the
        // payload's checksum or restoration then confirms it.
        let kind = match checked {
            Some(e) => e.kind,
            None if env[8] == FrameKind::Local as u8 => FrameKind::Local,
            None => FrameKind::Round,
        };
        if kind == FrameKind::Round && header.round_index != round {
            return Err(format!(
                "its payload names round_index {} where {round} was expected",
                header.round_index
            ));
        }
        if frame::check_payload(payload, kind).is_ok() {
            return Ok(Restored {
                kind,
                start,
                payload: payload.to_vec(),
                end,
                records_restored: 0,
            });
        }
        frame::check_payload_structure(payload, kind)
            .map_err(|why| format!("its payload does not parse: {why}"))?;
        let mut fixed = payload.to_vec();
        let mut restored = 0;
        let mut at = PAYLOAD_HEADER_BYTES;
        for e in EntryIter::new(&payload[PAYLOAD_HEADER_BYTES..], kind) {
            let body_at = at + journal::ENTRY_HEADER_BYTES;
            at = body_at + e.body.len();
            if e.kind == EntryKind::Records {
                restored += self.restore_records(e.group_id, &mut fixed[body_at..at])?;
            }
        }
        if crc32fast::hash(&fixed[4..]) != header.payload_crc {
            return Err(
                "its damage is not only in records that the segments hold (restoring them did \
                 not reproduce the payload's checksum)"
                    .into(),
            );
        }
        Ok(Restored {
            kind,
            start,
            payload: fixed,
            end,
            records_restored: restored,
        })
    }

    /// Replaces each record of a damaged Records body that fails its own
    /// CRC by the stored record of its msg_id in the group's log: the id
    /// after the previous record of the body, or (for the first) the id
    /// the damaged record names. Returns how many were replaced, or why one
    /// could not be.
    fn restore_records(&mut self, group_id: u64, body: &mut [u8]) -> Result<u64, String> {
        let mut restored = 0;
        let mut prev: Option<u64> = None;
        let mut at = 0;
        while at < body.len() {
            let rest = &body[at..];
            let len = record::peek_len(rest)
                .filter(|&l| l >= record::RECORD_HEADER_BYTES && l <= rest.len())
                .ok_or_else(|| format!("a record length in group {group_id}'s entry is damaged"))?;
            if let Ok(h) = record::decode_verified(&rest[..len], len) {
                prev = Some(h.msg_id);
                at += len;
                continue;
            }
            let msg_id = match prev {
                Some(p) => p + 1,
                None => record::peek_msg_id(rest),
            };
            let copy = self.stored_record(group_id, msg_id).ok_or_else(|| {
                format!("group {group_id} holds no intact copy of msg_id {msg_id}")
            })?;
            if copy.len() != len {
                return Err(format!(
                    "group {group_id}'s copy of msg_id {msg_id} has {} bytes, the frame {len}",
                    copy.len()
                ));
            }
            body[at..at + len].copy_from_slice(&copy);
            restored += 1;
            prev = Some(msg_id);
            at += len;
        }
        Ok(restored)
    }

    /// The stored (verified) record `msg_id` of a registered, undamaged
    /// group, loading the group if needed.
    fn stored_record(&mut self, group_id: u64, msg_id: u64) -> Option<Vec<u8>> {
        let group = self.st.group(group_id).ok()??;
        ensure_loaded_reporting(self.st.ctx, &group, self.report);
        let slot = group.log.read();
        let LogSlot::Loaded(log) = &*slot else {
            return None;
        };
        if msg_id == 0 || msg_id > log.head() || msg_id < log.floor() {
            return None;
        }
        let batch = log.read(self.st.ctx, msg_id - 1, 1, usize::MAX).ok()?;
        let copy = batch.records().next()?;
        (copy.header.msg_id == msg_id).then(|| copy.bytes.to_vec())
    }

    /// Applies the entries of one valid frame numbered `lsn`, then notes
    /// the frame done for each group it named (a frame lists a group's
    /// entries together).
    fn frame_entries(&mut self, entries: EntryIter<'_>, lsn: u64, at: Located<'_>) -> Result<()> {
        let mut current: Option<u64> = None;
        for e in entries {
            if current.is_some_and(|g| g != e.group_id) {
                self.frame_done(current, lsn);
            }
            current = Some(e.group_id);
            self.report.journal_entries_replayed += 1;
            let body_at = apply::BodyAt {
                seq: at.seq,
                offset: at.start + crate::commit::thread::offset_in(at.buf, e.body) as u64,
            };
            self.entry(&e, lsn, body_at)?;
        }
        self.frame_done(current, lsn);
        Ok(())
    }

    fn frame_done(&mut self, group: Option<u64>, lsn: u64) {
        let Some(id) = group else {
            return;
        };
        if let Ok(Some(g)) = self.st.group(id) {
            apply::frame_done(&self.st, &g, lsn);
        }
    }

    /// What a Join entry needs before it is applied as the live node
    /// applied it (`LimitsWhileLoading`): nothing with no background load,
    /// or when its user's saved groups are registered or the load's bound
    /// proves its user below `groups_per_user_max`. A body that does not
    /// decode is decided by the apply (which refuses it) and needs nothing.
    fn join_needs(&self, entry: &journal::Entry<'_>) -> Result<(u64, JoinNeeds)> {
        let pending = self.pending.borrow();
        let Some(pending) = pending.as_ref() else {
            return Ok((0, JoinNeeds::Nothing));
        };
        let Some((user, _cursor)) = journal::body::decode_join(entry.body) else {
            return Ok((0, JoinNeeds::Nothing));
        };
        let needs = pending.limits().join_needs(
            user,
            Catalog::user_groups(self.st.catalog, user)?,
            self.st.cursors.groups_of(user),
            self.st.ctx.config.groups_per_user_max,
        );
        Ok((user, needs))
    }

    /// Applies one valid entry (the same apply as the commit thread's)
    /// and counts what it did.
    fn entry(&mut self, entry: &journal::Entry<'_>, lsn: u64, at: apply::BodyAt) -> Result<()> {
        if entry.kind == EntryKind::Join {
            // Its per-user limit counts every group of its user: those the
            // user index names are registered first, or, without a complete
            // index, the rest of a background load.
            let (user, needs) = self.join_needs(entry)?;
            let whole_state_first = match needs {
                JoinNeeds::Nothing => false,
                JoinNeeds::UserGroups => !Catalog::find_groups_of_user(
                    self.st.catalog,
                    self.st.ctx,
                    self.st.cursors,
                    user,
                )?,
                JoinNeeds::WholeState => true,
            };
            if whole_state_first {
                lazy::finish_now(
                    self.st.ctx,
                    self.st.catalog,
                    self.st.cursors,
                    &mut self.pending.borrow_mut(),
                )?;
            }
        }
        let group = self.st.group(entry.group_id)?;
        match apply::entry(
            &self.st,
            entry,
            group.as_ref(),
            apply::Mode::Replay,
            lsn,
            Some(at),
        )? {
            apply::Applied::Orphan => self.report.orphan_entries += 1,
            apply::Applied::Reflected => self.report.entries_reflected += 1,
            apply::Applied::Records(done) => {
                if let Some(load) = done.loaded {
                    report_load(self.report, entry.group_id, &load);
                }
                self.report.records_replayed += done.appended;
                self.report.records_already_present += done.already_present;
            }
            // Refusals (a limit, a malformed body) are ignored: replay
            // checks what the live apply checked, in the same order.
            apply::Applied::Op(_) => {}
        }
        Ok(())
    }
}

/// A journal file that holds frames (it is longer than a header) but whose
/// header is invalid: its header was synced before its first frame was
/// written, so the header is damaged, and the frames cannot be trusted to
/// be read (their `mark_key` and numbering are in it).
fn damaged_header_with_frames(path: &Path, reason: &str) -> Error {
    Error::Corrupt {
        path: path.to_owned(),
        group: None,
        offset: 0,
        reason: format!(
            "{reason}. The file is longer than its header, so it holds frames, and the \
             writer syncs a journal file's header (and its directory entry) before it writes \
             the first frame: this is damage to a durable header, not a crash while the file \
             was created. Its frames (acknowledged messages, joins, cursors) cannot be read. \
             The data directory was not opened, so nothing was dropped: restore the data \
             directory (or this file) from a backup"
        ),
    }
}

/// Loads `group` if it is unloaded, reporting what the load cut. Records
/// it finds past the recorded head (segment records whose journal
/// entries a power cut took) have their edits and recalls taken in, under
/// the group's checkpoint lock, and the group is marked dirty so that the
/// next checkpoint records them.
fn ensure_loaded_reporting(ctx: &Context, group: &Arc<Group>, report: &mut RecoveryReport) {
    let mut ck = group.ckpt(&ctx.dirty);
    let mut adopted = false;
    let loaded = group.load_if_unloaded(ctx, &ctx.dirty, |log, after| {
        adopted = true;
        crate::commit::change_intake::take_in_adopted(ctx, group, log, after)
    });
    if let Some(load) = loaded {
        report_load(report, group.id, &load);
    }
    if adopted {
        ctx.dirty.mark(group, &mut ck);
    }
}

fn report_load(report: &mut RecoveryReport, group_id: u64, load: &LoadReport) {
    if load.bytes_cut > 0 {
        report.cuts.push((
            format!("group {group_id} active segment"),
            load.bytes_cut,
            "written after the checkpoint".into(),
        ));
    }
}
