//! The maintenance worker's jobs that make a group ready for its first
//! use after open (`ready.rs` has the requests' side and the module's
//! account): loading a group's log, building a sealed segment's index,
//! rebuilding the send state (the dedup window) from the log; and the
//! worker's start. They take the engine's shared state (`commit/thread.rs`),
//! so the checkpointer can queue a load without the facade.
//!
//! Invariant: the jobs read files with no lock held; they take a group's
//! locks only to copy what the scan needs and to install what it built,
//! and install only if the group is still in the state they scanned.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::clock::now_ms;
use crate::commit::change_intake;
use crate::commit::dedup::{DedupWindow, WindowLimits};
use crate::commit::small_log;
use crate::commit::thread::Shared;
use crate::error::{Error, Result};
use crate::group::{AssignState, Group, LogSlot};
use crate::logs::group_log::{GroupLog, NeedsIndex, Scan};
use crate::worker::{Need, Worker};

/// Keeps in `acc` the `NotReady` with the latest ticket (`e` is one): a
/// request that needs several jobs asks for all of them, then waits once,
/// for the last (tickets settle in order).
pub(crate) fn keep_latest(acc: &mut Option<Error>, e: Error) {
    let ticket_of = |e: &Error| match e {
        Error::NotReady { ticket, .. } => *ticket,
        _ => 0,
    };
    if acc.as_ref().is_none_or(|a| ticket_of(a) < ticket_of(&e)) {
        *acc = Some(e);
    }
}

/// Queues the load of `group`'s log with no request waiting for it: the
/// segment erasure pass's, for an unloaded group whose active segment
/// holds a recalled payload (`erase_segments.rs`). The same job (and key)
/// a request's first use queues, so either coalesces with the other;
/// dropped if the worker stopped (the next open's pass queues it again).
pub(crate) fn queue_load(shared: &Shared, group: &Arc<Group>) {
    let _ticket = request(shared, group, Need::Log);
}

/// Queues the job that makes `group` meet `need`, or finds it queued: its
/// ticket (`None` once the worker stopped).
pub(crate) fn request(shared: &Shared, group: &Arc<Group>, need: Need) -> Option<u64> {
    let g = group.clone();
    shared
        .worker
        .request((group.id, need), move |_, shared| run(shared, &g, need))
}

/// Queues the registration of every saved group of `user` while the
/// checkpoint's state loads in the background
/// (`Catalog::find_groups_of_user`: it reads the mapped runs), or finds it
/// queued: its ticket (`None` once the worker stopped). A failure is the
/// load's (damage in the runs): recorded there, and the request that runs
/// again gets it.
pub(crate) fn request_user_groups(shared: &Shared, user: u64) -> Option<u64> {
    shared
        .worker
        .request((user, Need::UserGroups), move |_, shared: &Shared| {
            let found = crate::catalog::Catalog::find_groups_of_user(
                &shared.catalog,
                &shared.ctx,
                &shared.cursors,
                user,
            );
            if let Err(e) = found {
                log::error!("the saved groups of user {user} do not register: {e}");
            }
        })
}

/// Queues the lookup of group `id` in the mapped runs while the
/// checkpoint's state loads in the background (`Catalog::find`: it
/// registers the group, or records it absent, so that
/// `Catalog::try_find` answers for it from then on), or finds it queued:
/// its ticket (`None` once the worker stopped). A failure is the load's
/// (the group's items do not decode): recorded there, and the request
/// that runs again gets it.
pub(crate) fn request_group(shared: &Shared, id: u64) -> Option<u64> {
    shared
        .worker
        .request((id, Need::Registered), move |_, shared: &Shared| {
            let found =
                crate::catalog::Catalog::find(&shared.catalog, &shared.ctx, &shared.cursors, id);
            if let Err(e) = found {
                log::error!("group {id} does not register: {e}");
            }
        })
}

/// A worker job: makes `group` meet `need`.
fn run(shared: &Shared, group: &Arc<Group>, need: Need) {
    match need {
        // Queued by `request_user_groups` and `request_group`, for groups
        // not registered yet.
        Need::UserGroups | Need::Registered => {}
        Need::Log => load(shared, group),
        Need::Index(base) => build_index(shared, group, base),
        Need::Assign => {
            if let Err(e) = prepare_assign(shared, group) {
                log::warn!("group {}: send path not ready: {e}", group.id);
                shared.ready_failures.lock().insert(group.id, e);
            }
        }
    }
}

/// Loads the group's log if it is unloaded (the verifying scan without a
/// lock: `Group::load_if_unloaded`), and lists the group for the idle
/// sweep, which unloads a small log again once it is idle (`commit.rs`).
/// Records the load finds past the recorded head have their edits and
/// recalls taken in under the group's checkpoint lock, taken for that
/// only (never across the scan), and the group goes on the dirty list.
/// (Recovery loads every group whose segments lead the journal, so a
/// load here normally finds none.)
fn load(shared: &Shared, group: &Arc<Group>) {
    let ctx = &shared.ctx;
    let adopted = |log: &GroupLog, after: u64| {
        let mut ck = group.ckpt(&ctx.dirty);
        change_intake::take_in_adopted(ctx, group, log, after)?;
        ctx.dirty.mark(group, &mut ck);
        Ok(())
    };
    if let Some(load) = group.load_if_unloaded(ctx, &ctx.dirty, adopted) {
        shared.dedup.touch_used(group.id);
        shared.counters.group_loads.fetch_add(1, Ordering::Relaxed);
        if load.bytes_cut > 0 {
            log::warn!(
                "group {}: cut {} bytes written after the last checkpoint",
                group.id,
                load.bytes_cut
            );
        }
    }
}

/// Builds the index of sealed segment `base`: copies what the scan needs
/// under the log's lock, scans without it, installs under it.
fn build_index(shared: &Shared, group: &Group, base: u64) {
    let job = match &*group.log.read() {
        LogSlot::Loaded(log) => log.index_job(base),
        _ => None,
    };
    let Some(job) = job else { return };
    let Some(built) = job.build(&shared.ctx) else {
        return;
    };
    if let LogSlot::Loaded(log) = &*group.log.read() {
        log.install_index(&job, built);
    }
}

/// Makes the group's send path ready: its log loaded, its dedup window
/// rebuilt from the log (each sealed segment the rebuild reaches gets its
/// index first, without the lock), then its send state installed under
/// `assign` if it still has none.
///
/// Nothing is assigned to a group without a send state (a state is dropped
/// only once its last round completed), so no record of it is applied
/// meanwhile: the log's head read with the window is still its head at
/// install (checked there all the same). The idle sweep may unload the log between any two of these
/// steps (it unloads only a group without a send state, under `assign`):
/// the job then loads it again. The state is installed only over a loaded
/// log, checked under `assign`, so a group with a send state always has
/// its log loaded and the commit thread never loads one to apply a record.
/// Each round of the loop needs the sweep to have found the group idle
/// since this job loaded it (`idle_evict_ms`), so it ends.
fn prepare_assign(shared: &Shared, group: &Arc<Group>) -> Result<()> {
    let ctx = &shared.ctx;
    let limits = WindowLimits::from_config(&ctx.config);
    loop {
        load(shared, group);
        // A small group: its window from its records (at most
        // `small_group_bytes_max`), read from the journal files with no
        // lock held (the read marks what it verified under the slot's).
        let small = match &*group.log.read() {
            LogSlot::Small(list) => Some(list.clone()),
            _ => None,
        };
        let rebuilt = match small {
            Some(list) => {
                let (w, last_ts) = DedupWindow::rebuild_small(
                    &list,
                    |after| small_log::read_above(ctx, group, &list, after, 4096, usize::MAX),
                    now_ms(),
                    limits,
                )?;
                Ok((w, list.next_id() - 1, last_ts))
            }
            None => match &*group.log.read() {
                LogSlot::Loaded(log) => {
                    DedupWindow::rebuild(log, ctx, Scan::Refused, now_ms(), limits)?
                        .map(|w| (w, log.head(), log.last_timestamp_ms()))
                }
                // Unloaded again by the idle sweep since `load`, or just
                // promoted.
                LogSlot::Unloaded(_) | LogSlot::Small(_) => continue,
                // Damaged or deleted: the request finds out from the slot.
                LogSlot::Damaged { .. } | LogSlot::Deleted => return Ok(()),
            },
        };
        let (dedup, head, last_timestamp_ms) = match rebuilt {
            Ok(done) => done,
            Err(NeedsIndex { base }) => {
                build_index(shared, group, base);
                continue;
            }
        };
        let mut slot = group.assign.lock();
        if group.is_deleting() || slot.is_some() {
            return Ok(()); // no longer needed
        }
        // Unloaded by the idle sweep since the rebuild, or (a request made
        // an empty log's state meanwhile, sent, and that state went idle)
        // moved on: start over.
        let still = match &*group.log.read() {
            LogSlot::Loaded(log) => log.head() == head,
            LogSlot::Small(list) => list.next_id() - 1 == head,
            _ => false,
        };
        if !still {
            continue;
        }
        shared.dedup.resized(0, dedup.len());
        // The assigned head starts at the applied one (see above).
        *slot = Some(Box::new(AssignState {
            last_id: head,
            last_timestamp_ms,
            last_round: 0,
            dedup,
        }));
        // Listed for the dedup budget and the idle sweep, as a send does.
        shared.dedup.touch(group.id);
        return Ok(());
    }
}

/// The send state of a group whose log is loaded and holds no record (a
/// group just created, or one whose records retention removed): an empty
/// window, made with no disk work, so a send needs no worker job. `None`
/// otherwise. The caller holds `assign` (which holds no state), so no
/// record of the group is queued and the log's head is the one to start
/// from.
pub(crate) fn empty_send_state(group: &Group) -> Option<AssignState> {
    let slot = group.log.read();
    let log = match &*slot {
        LogSlot::Loaded(log) => log,
        // A small group without records (with records, its window is
        // rebuilt from them by the worker).
        LogSlot::Small(list) => {
            return (list.next_id() == list.floor()).then(|| AssignState {
                last_id: list.next_id() - 1,
                ..AssignState::default()
            })
        }
        _ => return None,
    };
    (log.head() < log.floor()).then(|| AssignState {
        last_id: log.head(),
        last_timestamp_ms: log.last_timestamp_ms(),
        last_round: 0,
        dedup: DedupWindow::default(),
    })
}

/// Starts the maintenance worker of an engine whose shared state is
/// `shared`, and queues the trash sweep every open does.
pub(crate) fn start_worker(shared: &Arc<Shared>) -> Result<std::thread::JoinHandle<()>> {
    let handle = Worker::spawn(
        shared.clone(),
        |s: &Shared| &s.worker,
        crate::commit::thread::worker_settled,
    )?;
    // Whatever recovery moved to the trash is in the listing below.
    drop(shared.ctx.trash.take_moved());
    crate::logs::trash::sweep_in_background(
        &shared.worker,
        shared.ctx.vfs.clone(),
        shared.ctx.trash.dir().to_owned(),
    );
    Ok(handle)
}
