//! Loading a checkpoint's state after the node listens (format-spec/
//! storage.md section 11, "Loading in the background").
//!
//! Before the engine opens, recovery maps the manifest's run parts and
//! checks every byte of them against its CRC ([`run::check_part_sums`]): a
//! damaged part still rejects the checkpoint for the previous one, as a
//! full load does. The journal tail is then replayed with every group it
//! names taken from the runs on its own ([`find`]). After that the engine
//! opens, and a loader thread registers the rest in key order
//! ([`Pending::load_rest`]).
//!
//! One owner per group: a group is registered from the runs exactly once,
//! either by the loader or by the first request (or replayed entry) that
//! names it, which looks it up in the runs itself: one binary search of
//! each part's block index and the blocks holding its items, merged with
//! the usual masking (`merge.rs`). [`Progress`] says which: every group at
//! or below `through` is the loader's (the catalog answers for it, also
//! when it was deleted since), every group in `taken` is a request's (the
//! loader skips it). The catalog alone answers once the load is done.
//!
//! Invariant: while a load is pending, nothing reads or changes a group
//! but through [`find`] (the engine's `group`, replay, replicated rounds),
//! and whatever needs every group (creation's group count, checkpoints,
//! snapshots) waits for the load to finish (`Engine::whole_state`). What
//! needs every membership of one user (UNREAD, SYNC, a JOIN's per-user
//! limit the manifest's bound does not decide: `commit/loading.rs`) takes
//! the groups the user index names for the user ([`index_of_user`],
//! storage.md 6.1) through [`find`] when the manifest says the index is
//! complete: a superset of the user's saved memberships, each checked by
//! its group's own rows; the user is then marked (`users_registered`), so
//! it is done once per user and load. A request's lookups are made by the
//! maintenance worker, never on the event loop (`Engine::user_state`);
//! without a complete index it waits for the load. So is a request's
//! first lookup of a group (`Engine::try_group`): the event loop asks
//! [`Progress`] only with `try_lock` (the loader holds it through a
//! batch's install), and gets the catalog's answer when it is final; a
//! group whose items did not decode is remembered (`damaged`), so the
//! request run again after the worker's lookup gets the error.
//! Lock order: `Progress`, then the catalog, then the cursor table.
//!
//! A run whose CRCs held but whose items do not decode is a writer's bug:
//! the load stops there, writes stop, and every group whose own items do
//! not decode, and whatever needs the whole state or a user's index
//! entries, answers `Corrupt` naming the part and offset (the first damage
//! met, located as `verify` locates it); every other group is still
//! looked up and served. A full load at the next open falls back to the
//! previous checkpoint.
//!
//! Costs: the parts stay mapped until the load ends (page cache, not
//! heap); a lookup costs O(runs x log blocks) plus the blocks of its group;
//! the loader costs what the load at open costs, in batches of
//! [`BATCH_ITEMS`] items: each batch's groups are made and its cursor rows
//! built in slots reserved for them, then published under one short
//! catalog write lock (`Pending::install`). What it costs beyond the load
//! at open is that a user's memberships come in many batches, each adding
//! to the user's list (one lookup each) where the load at open builds it
//! once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use std::thread::JoinHandle;

use parking_lot::{Mutex, RwLock};

use crate::catalog::{Catalog, Found, Unregistered, UserGroups};
use crate::commit::context::Context;
use crate::commit::loading::LimitsWhileLoading;
use crate::commit::thread::Shared;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::members::cursors::CursorTable;
use crate::members::membership::GroupMembers;
use crate::state::checkpointer;
use crate::state::manifest::RunMeta;
use crate::state::merge::Merge;
use crate::state::restore::{self, make_group};
use crate::state::run::{self, PartMeta, RunItems};
use crate::state::{GroupRecord, Item, Key};

/// Items the loader registers at a time: small enough that a request for
/// a group not yet registered (which waits for the batch being installed)
/// waits a few milliseconds at most. A few groups in tests, whose
/// checkpoints then load in many batches.
#[cfg(not(test))]
const BATCH_ITEMS: usize = 16 * 1024;
#[cfg(test)]
const BATCH_ITEMS: usize = 48;

/// A group's items in a checkpoint: its record and its member rows
/// `(user, cursor, join_point, cursor-table shard of the user)`, users
/// ascending (the shard is 0 where no one computed it).
pub(crate) type GroupItems = (Box<GroupRecord>, Vec<(u64, u64, u64, usize)>);

/// The state of a checkpoint not yet registered: its runs, mapped and
/// checked, and who owns which group.
pub(crate) struct Pending {
    runs: Vec<RunMeta>,
    maps: Vec<Vec<memmap2::Mmap>>,
    progress: Mutex<Progress>,
    /// Groups registered from now on with an `applied_lsn` at or above
    /// this get it lowered to just below it (`recovery::lower_applied_lsns`,
    /// group by group); `u64::MAX` until replay ends.
    lower_from: AtomicU64,
    /// `(seq, valid length)` of the replayed journal files written under
    /// `never` or `interval`: a small group registered from now on loses
    /// the records past them (`recovery::cut_small_groups_past_journal_ends`,
    /// group by group). Set once, when replay ends.
    cut_ends: Mutex<Vec<(u64, u64)>>,
    /// How joins and creations are decided until the load ends (replay's,
    /// then the engine's: `LoadStatus::start`).
    limits: Arc<LimitsWhileLoading>,
    /// The runs hold a complete user index (the manifest's flag): a
    /// user's groups are found without the whole load.
    user_index: bool,
    /// Users every saved group of whom is registered
    /// (`Catalog::find_groups_of_user` marked them): their memberships
    /// are all in the cursor table. A leaf lock, held for one set
    /// operation, so that the event loop may ask it (`Progress` is held
    /// through a batch's install).
    users_registered: Mutex<HashSet<u64>>,
    /// The load stopped at damage (`Progress::failed` says where): read
    /// without `Progress`'s lock.
    stopped: AtomicBool,
}

#[derive(Default)]
struct Progress {
    /// The loader registered every group at or below this id that the
    /// runs hold and no request took.
    through: Option<u64>,
    /// Groups above `through` taken from the runs by a request (or found
    /// absent there): the loader skips them.
    taken: HashSet<u64>,
    /// Why the load stopped: the items did not decode.
    failed: Option<Located>,
    /// Groups whose own items did not decode (a lookup met the damage):
    /// every later lookup of one answers `failed`'s error without reading
    /// the runs again, so a request retried after the worker's lookup
    /// gets it at once.
    damaged: HashSet<u64>,
}

/// Where a load that stopped found the damage.
#[derive(Clone)]
struct Located {
    path: std::path::PathBuf,
    offset: u64,
    why: String,
}

impl Pending {
    /// Maps the runs of a manifest and checks their checksums, every
    /// byte; `Err` says why the checkpoint cannot be used (then recovery
    /// names the damaged part and tries the previous one).
    /// `limits` decide joins and creations meanwhile, from the manifest's
    /// bounds.
    pub(crate) fn open(
        ctx: &Context,
        runs: &[RunMeta],
        limits: LimitsWhileLoading,
        user_index: bool,
    ) -> std::result::Result<Pending, String> {
        let maps = runs
            .iter()
            .map(|r| checkpointer::map_run(ctx, r))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for (run, map) in runs.iter().zip(&maps) {
            for (meta, bytes) in run.parts.iter().zip(map) {
                run::check_part_sums(bytes, meta).map_err(|(offset, why)| {
                    format!(
                        "run {} part {} offset {offset}: {why}",
                        meta.run_seq, meta.part
                    )
                })?;
            }
        }
        Ok(Pending {
            runs: runs.to_vec(),
            maps,
            progress: Mutex::new(Progress::default()),
            lower_from: AtomicU64::new(u64::MAX),
            cut_ends: Mutex::new(Vec::new()),
            limits: Arc::new(limits),
            user_index,
            users_registered: Mutex::new(HashSet::new()),
            stopped: AtomicBool::new(false),
        })
    }

    /// How joins and creations are decided while this load runs.
    pub(crate) fn limits(&self) -> &LimitsWhileLoading {
        &self.limits
    }

    /// Replay ended: from now on, groups registered with an `applied_lsn`
    /// at or above `next_lsn` get it lowered, and small groups lose their
    /// records past `cut_ends`, as recovery does to the groups registered
    /// so far.
    pub(crate) fn after_replay(&self, next_lsn: u64, cut_ends: Vec<(u64, u64)>) {
        self.lower_from.store(next_lsn, Ordering::Release);
        *self.cut_ends.lock() = cut_ends;
    }

    fn slices(&self) -> Vec<Vec<&[u8]>> {
        self.maps
            .iter()
            .map(|m| m.iter().map(|m| &m[..]).collect())
            .collect()
    }

    /// The items the merge of every run yields for `group` (what a full
    /// load registers for it), found through the block indexes.
    fn group_items(&self, group: u64) -> std::result::Result<Option<GroupItems>, String> {
        let slices = self.slices();
        let parts: Vec<&[PartMeta]> = self.runs.iter().map(|r| &r.parts[..]).collect();
        items_of_group(&slices, &parts, group)
    }

    /// The groups the user index of the runs names for `user`: newest
    /// entry per group wins, deletes drop out (`Merge` with every run).
    fn groups_of_user_in_runs(&self, user: u64) -> std::result::Result<Vec<u64>, String> {
        let slices = self.slices();
        let parts: Vec<&[PartMeta]> = self.runs.iter().map(|r| &r.parts[..]).collect();
        index_of_user(&slices, &parts, user)
    }

    /// The group `id` taken from the runs by a request: registered now
    /// unless the loader or another request owns it (then the catalog
    /// answers). The caller holds no catalog lock. Also after the load
    /// stopped at damage: a group whose own items decode is served (its
    /// lookup is the merge of its items only), one whose items do not
    /// gets the load's error.
    fn take_group(
        &self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        cursors: &CursorTable,
        id: u64,
    ) -> Result<Option<Arc<Group>>> {
        let mut progress = self.progress.lock();
        if let Some(e) = progress.damage_of(id) {
            return Err(e);
        }
        if progress.through.is_some_and(|t| id <= t) || !progress.taken.insert(id) {
            return Ok(catalog.read().get(id).cloned());
        }
        match self.group_items(id) {
            Ok(None) => Ok(None),
            Ok(Some((rec, members))) => {
                let mut catalog = catalog.write();
                let g = self
                    .register(ctx, &mut catalog, rec)
                    .map_err(|why| self.fail(ctx, &mut progress, why, Some(id)))?;
                let head = g.head();
                let mut list = Vec::with_capacity(members.len());
                for (user, cursor, join_point, _) in members {
                    let cursor = cursor.min(head);
                    // A run's keys are unique: the user is not a member yet.
                    let _ = cursors.insert(user, g.slot, cursor, join_point, None);
                    list.push((user, cursor));
                }
                *g.members.lock() = GroupMembers::from_sorted(&list);
                Ok(Some(g))
            }
            Err(why) => {
                progress.taken.remove(&id);
                progress.damaged.insert(id);
                Err(self.fail(ctx, &mut progress, why, Some(id)))
            }
        }
    }

    /// What [`Self::take_group`] answers for `id` when that is told
    /// without reading the runs: `Final` when the loader or a lookup owns
    /// the group (the catalog's answer is final: registered, deleted
    /// since, or absent from the runs), `Err` for a group whose items did
    /// not decode; `NeedsLookup` when only a lookup in the runs tells, or when
    /// the loader holds `Progress` (it installs a batch: a few
    /// milliseconds). Never waits for that lock (`try_lock`): the event
    /// loop asks this, and `through` and `taken` are only meaningful
    /// together, under it.
    fn try_take_group(&self, catalog: &RwLock<Catalog>, id: u64) -> Result<Found> {
        let Some(progress) = self.progress.try_lock() else {
            return Ok(Found::NeedsLookup);
        };
        if let Some(e) = progress.damage_of(id) {
            return Err(e);
        }
        if progress.through.is_some_and(|t| id <= t) || progress.taken.contains(&id) {
            // Lock order: `Progress`, then the catalog.
            return Ok(Found::Final(catalog.read().get(id).cloned()));
        }
        Ok(Found::NeedsLookup)
    }

    /// Registers every group no request took, in key order, `BATCH_ITEMS`
    /// items at a time (decoded on a second thread, as the load at open
    /// is: `restore::for_each_batch`); ends early (`Ok(false)`) once
    /// `stop` says so.
    pub(crate) fn load_rest(
        &self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        cursors: &CursorTable,
        stop: &dyn Fn() -> bool,
    ) -> Result<bool> {
        let pause = std::time::Duration::from_millis(ctx.config.load_batch_pause_ms);
        let mut batch: Vec<GroupItems> = Vec::new();
        let mut items = 0;
        // Why the registering side ended the merge: stopped, or an error
        // already recorded (`fail`).
        let mut ended: Option<Result<bool>> = None;
        // The catalog is presized once, from the first batch's share of
        // groups among its items: growing it rehashes every group (half a
        // second at a million), under its write lock.
        let items_total = self.runs.iter().map(RunMeta::items).sum::<u64>();
        let mut presized = false;
        let mut install = |batch: Vec<GroupItems>| -> std::result::Result<(), String> {
            std::thread::sleep(pause);
            if stop() {
                ended = Some(Ok(false));
                return Err(String::new());
            }
            let expected = if presized {
                0
            } else {
                presized = true;
                groups_expected(&batch, items_total)
            };
            self.install(ctx, catalog, cursors, batch, expected)
                .map_err(|e| {
                    ended = Some(Err(e));
                    String::new()
                })
        };
        let merged = restore::for_each_batch(ctx, cursors, &self.runs, |decoded| {
            for (item, shard) in decoded {
                if matches!(item, Item::GroupPut(_)) && items >= BATCH_ITEMS {
                    install(std::mem::take(&mut batch))?;
                    items = 0;
                }
                push_batch_item(&mut batch, item, shard)?;
                items += 1;
            }
            Ok(())
        })
        .and_then(|()| install(batch));
        if let Some(end) = ended {
            return end;
        }
        if let Err(why) = merged {
            let mut progress = self.progress.lock();
            return Err(self.fail(ctx, &mut progress, why, None));
        }
        self.progress.lock().through = Some(u64::MAX);
        Ok(true)
    }

    /// Registers a batch of whole groups (those no request took) and their
    /// rows. The groups are made and their rows built into the cursor
    /// table in slots reserved for them before the catalog's write lock is
    /// taken, which then only publishes them: requests wait on it for the
    /// batch's groups, not for its rows (rows in a reserved slot are
    /// reached by no one: no group is found there until it is published).
    /// `Progress` is held throughout: a request for a group of the batch
    /// waits for it, then finds the group in the catalog. `groups_expected`
    /// presizes the catalog (the first batch's estimate of the load's
    /// groups).
    fn install(
        &self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        cursors: &CursorTable,
        batch: Vec<GroupItems>,
        groups_expected: usize,
    ) -> Result<()> {
        let Some(last) = batch.last().map(|(rec, _)| rec.group) else {
            return Ok(());
        };
        let mut progress = self.progress.lock();
        let batch: Vec<GroupItems> = batch
            .into_iter()
            .filter(|(rec, _)| !progress.taken.remove(&rec.group))
            .collect();
        let slots: Vec<u32> = {
            let mut cat = catalog.write();
            cat.reserve(groups_expected);
            batch.iter().map(|_| cat.reserve_slot()).collect()
        };
        let rows = batch.iter().map(|(_, m)| m.len()).sum();
        let mut loader = cursors.loader(rows);
        let mut made = Vec::with_capacity(batch.len());
        let mut failed = None;
        let mut list = Vec::new();
        for ((rec, members), &slot) in batch.into_iter().zip(&slots) {
            let id = rec.group;
            let g = match self.make(ctx, rec, slot) {
                Ok(g) => g,
                Err(why) => {
                    failed = Some((id, why));
                    break;
                }
            };
            let head = g.head();
            list.clear();
            for (user, cursor, join_point, shard) in members {
                let cursor = cursor.min(head);
                loader.push_in_shard(shard, user, g.slot, cursor, join_point);
                list.push((user, cursor));
            }
            *g.members.lock() = GroupMembers::from_sorted(&list);
            made.push(g);
        }
        #[cfg(test)]
        hold::wait_before_rows(&ctx.config.data_dir);
        loader.finish_here();
        if failed.is_some() {
            // `through` stays below them: lookups get the catalog's answer
            // for the groups published here (also once deleted).
            progress.taken.extend(made.iter().map(|g| g.id));
        }
        {
            let mut cat = catalog.write();
            for &slot in &slots[made.len()..] {
                cat.release_slot(slot);
            }
            for g in made {
                cat.publish(g);
            }
        }
        if let Some((id, why)) = failed {
            return Err(self.fail(ctx, &mut progress, why, Some(id)));
        }
        progress.through = Some(last);
        Ok(())
    }

    /// Registers one group's record (a request's lookup): as the load at
    /// open, then what [`Self::make`] adds.
    fn register(
        &self,
        ctx: &Context,
        catalog: &mut Catalog,
        rec: Box<GroupRecord>,
    ) -> std::result::Result<Arc<Group>, String> {
        catalog.register_made(|slot| self.make(ctx, rec, slot))
    }

    /// Makes one group's record in a reserved slot, not yet registered:
    /// as the load at open makes it, then the lowering of its
    /// `applied_lsn` and the counts recovery keeps.
    fn make(
        &self,
        ctx: &Context,
        rec: Box<GroupRecord>,
        slot: u32,
    ) -> std::result::Result<Arc<Group>, String> {
        let g = make_group(ctx, rec, slot)?;
        let from = self.lower_from.load(Ordering::Acquire);
        {
            let mut ck = g.ckpt(&ctx.dirty);
            if ck.applied_lsn() >= from {
                ck.set_applied_lsn(from.saturating_sub(1));
                ctx.dirty.mark(&g, &mut ck);
            }
        }
        {
            let ends = self.cut_ends.lock();
            if !ends.is_empty() {
                if let Some(why) =
                    crate::commit::small_log::cut_and_mark_past_journal_ends(ctx, &g, &ends)
                {
                    log::warn!("recovery cut small group {}: {why}", g.id);
                }
            }
        }
        let slot = g.log.read();
        ctx.messages_stored
            .fetch_add(slot.stored_messages(), Ordering::Relaxed);
        if let LogSlot::Damaged { reason, .. } = &*slot {
            log::error!("group {} is damaged: {reason}", g.id);
            ctx.damaged_groups.fetch_add(1, Ordering::Relaxed);
        }
        drop(slot);
        Ok(g)
    }

    /// Records that the load stopped at items that do not decode, names
    /// where, and returns the error every later lookup gets.
    fn fail(
        &self,
        ctx: &Context,
        progress: &mut Progress,
        why: String,
        group: Option<u64>,
    ) -> Error {
        let at = progress.failed.get_or_insert_with(|| {
            let located = crate::state::damage::locate_run_damage(
                &*ctx.vfs,
                &ctx.config.data_dir,
                &self.runs,
            );
            let at = match located {
                Some(l) => Located {
                    path: l.path,
                    offset: l.offset,
                    why: l.why,
                },
                None => Located {
                    path: ctx.config.data_dir.join("state"),
                    offset: 0,
                    why,
                },
            };
            log::error!(
                "the checkpoint's state does not load: {} offset {}: {}; writes stop. \
                 A restart loads the previous checkpoint",
                at.path.display(),
                at.offset,
                at.why
            );
            at
        });
        self.stopped.store(true, Ordering::Release);
        at.error(group)
    }
}

impl Progress {
    /// The load's error for group `id` if its own items did not decode.
    fn damage_of(&self, id: u64) -> Option<Error> {
        if !self.damaged.contains(&id) {
            return None;
        }
        self.failed.as_ref().map(|at| at.error(Some(id)))
    }
}

impl Unregistered for Pending {
    fn take(
        &self,
        ctx: &Context,
        catalog: &RwLock<Catalog>,
        cursors: &CursorTable,
        id: u64,
    ) -> Result<Option<Arc<Group>>> {
        self.take_group(ctx, catalog, cursors, id)
    }

    fn try_take(&self, catalog: &RwLock<Catalog>, id: u64) -> Result<Found> {
        self.try_take_group(catalog, id)
    }

    fn groups_of_user(&self, ctx: &Context, user: u64) -> Result<Option<Vec<u64>>> {
        if !self.user_index {
            return Ok(None);
        }
        if let Some(at) = &self.progress.lock().failed {
            return Err(at.error(None));
        }
        self.groups_of_user_in_runs(user).map(Some).map_err(|why| {
            let mut progress = self.progress.lock();
            self.fail(ctx, &mut progress, why, None)
        })
    }

    fn user_groups(&self, user: u64) -> Result<UserGroups> {
        if self.stopped.load(Ordering::Acquire) {
            if let Some(at) = &self.progress.lock().failed {
                return Err(at.error(None));
            }
        }
        if !self.user_index {
            return Ok(UserGroups::Unindexed);
        }
        Ok(if self.users_registered.lock().contains(&user) {
            UserGroups::Registered
        } else {
            UserGroups::Unregistered
        })
    }

    fn mark_user_registered(&self, user: u64) {
        self.users_registered.lock().insert(user);
    }
}

impl Located {
    fn error(&self, group: Option<u64>) -> Error {
        Error::Corrupt {
            path: self.path.clone(),
            group,
            offset: self.offset,
            reason: format!("the checkpoint's state does not load: {}", self.why),
        }
    }
}

/// The items the merge of runs (`slices[i]` the parts of the run
/// `parts[i]` describes, newest first) yields for `group`: its record and
/// member rows, or `None` if it has no record. The same merge as a full
/// load's, over each run's items of that group only (masking is per
/// group), each run read from the block its index says holds the group.
pub(crate) fn items_of_group(
    slices: &[Vec<&[u8]>],
    parts: &[&[PartMeta]],
    group: u64,
) -> std::result::Result<Option<GroupItems>, String> {
    #[cfg(test)]
    hold::count_run_lookup();
    let inputs: Vec<KeyRange<'_>> = slices
        .iter()
        .zip(parts)
        .map(|(s, p)| KeyRange::new(s, p, group, false))
        .collect();
    let mut found: Option<GroupItems> = None;
    for item in Merge::new(inputs, true) {
        push_item(&mut found, item?)?;
    }
    Ok(found)
}

/// The groups the user index of runs (as in [`items_of_group`]) names for
/// `user`, ascending: a superset of the user's memberships in the merge of
/// the runs when the manifest says the index is complete (storage.md
/// 6.1), each to be checked against its group's own member rows. Each run
/// is read from the block its index says holds the user's first entry.
pub(crate) fn index_of_user(
    slices: &[Vec<&[u8]>],
    parts: &[&[PartMeta]],
    user: u64,
) -> std::result::Result<Vec<u64>, String> {
    #[cfg(test)]
    hold::count_run_lookup();
    let inputs: Vec<KeyRange<'_>> = slices
        .iter()
        .zip(parts)
        .map(|(s, p)| KeyRange::new(s, p, user, true))
        .collect();
    let mut groups = Vec::new();
    for item in Merge::new(inputs, true) {
        match item? {
            Item::IndexPut { group, .. } => groups.push(group),
            other => return Err(format!("the user index of user {user} yielded {other:?}")),
        }
    }
    Ok(groups)
}

/// Registers the rest of a pending load now, on the calling thread, if
/// one is pending (recovery, before a replayed join the bound does not
/// decide; it is no longer pending after). A failure refuses the open like
/// a damaged checkpoint.
pub(crate) fn finish_now(
    ctx: &Context,
    catalog: &RwLock<Catalog>,
    cursors: &CursorTable,
    pending: &mut Option<Arc<Pending>>,
) -> Result<()> {
    let Some(p) = pending.take() else {
        return Ok(());
    };
    p.load_rest(ctx, catalog, cursors, &|| false)?;
    catalog.write().set_pending(None);
    Ok(())
}

/// The groups a load of `items_total` items holds if the rest is like
/// `batch` (its first groups): their share among its items, at most the
/// items (each group is one). An estimate: the catalog it presizes grows
/// as usual past it.
fn groups_expected(batch: &[GroupItems], items_total: u64) -> usize {
    let groups = batch.len() as u64;
    let items = groups + batch.iter().map(|(_, m)| m.len() as u64).sum::<u64>();
    if items == 0 {
        return 0;
    }
    let expected = u128::from(items_total) * u128::from(groups) / u128::from(items);
    usize::try_from(expected.min(u128::from(items_total))).unwrap_or(usize::MAX)
}

/// Adds one merged item of one group to what was found of it.
fn push_item(found: &mut Option<GroupItems>, item: Item) -> std::result::Result<(), String> {
    match (item, found) {
        (Item::GroupPut(rec), found @ None) => {
            *found = Some((rec, Vec::new()));
            Ok(())
        }
        (Item::GroupPut(rec), Some(_)) => Err(format!("group {} has two records", rec.group)),
        (item, Some((_, members))) => push_row(members, item, 0),
        (item, None) => Err(format!(
            "member row of group {} without its record",
            item.key().group
        )),
    }
}

/// Adds one merged item (a member row with its user's shard) to a batch
/// of whole groups.
fn push_batch_item(
    batch: &mut Vec<GroupItems>,
    item: Item,
    shard: usize,
) -> std::result::Result<(), String> {
    let group = item.key().group;
    match (item, batch.last_mut()) {
        (Item::GroupPut(rec), _) => {
            batch.push((rec, Vec::new()));
            Ok(())
        }
        (item, Some((rec, members))) if rec.group == group => push_row(members, item, shard),
        (_, _) => Err(format!("member row of group {group} without its record")),
    }
}

/// Adds a member row (the only other kind a full merge yields) after the
/// rows of its group so far.
fn push_row(
    members: &mut Vec<(u64, u64, u64, usize)>,
    item: Item,
    shard: usize,
) -> std::result::Result<(), String> {
    match item {
        Item::MemberPut {
            group,
            user,
            cursor,
            join_point,
        } => {
            if members.last().is_some_and(|&(last, ..)| last >= user) {
                return Err(format!("member rows of group {group} out of order"));
            }
            members.push((user, cursor, join_point, shard));
            Ok(())
        }
        other => Err(format!("a full merge yielded {other:?}")),
    }
}

/// One run's items under one id of the key space: a group's record and
/// member rows (`index` false), or a user's index entries (`index` true,
/// which sort after the items of the group of the same id). Items below
/// the range are skipped, the end is at the first item past it.
struct KeyRange<'a> {
    items: RunItems<'a>,
    id: u64,
    index: bool,
    done: bool,
}

impl<'a> KeyRange<'a> {
    fn new(slices: &'a [&'a [u8]], parts: &'a [PartMeta], id: u64, index: bool) -> KeyRange<'a> {
        KeyRange {
            items: RunItems::from_key(slices, parts, Self::first(id, index)),
            id,
            index,
            done: false,
        }
    }

    fn first(id: u64, index: bool) -> Key {
        if index {
            Key::user_index(id, 0)
        } else {
            Key::group(id)
        }
    }
}

impl Iterator for KeyRange<'_> {
    type Item = std::result::Result<Item, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let first = Self::first(self.id, self.index);
        loop {
            match self.items.next()? {
                Ok(item) => {
                    let key = item.key();
                    if key < first {
                        continue;
                    }
                    if key.group != self.id || key.index != self.index {
                        self.done = true;
                        return None;
                    }
                    return Some(Ok(item));
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

/// Starts the loader thread if the catalog holds a pending load (loading
/// it here when no thread can be started). After it registered the last
/// group, the catalog alone answers, captures and retention start, and the
/// commit listeners are told (the server's parked requests run again).
pub(crate) fn start_loader(
    shared: &Arc<Shared>,
    pending: Option<Arc<Pending>>,
) -> Result<Option<JoinHandle<()>>> {
    let Some(pending) = pending else {
        return Ok(None);
    };
    shared.load.start(pending.limits.clone());
    let spare = pending.clone();
    let hint = crate::commit::loading::LoadingHint::start();
    let run = {
        let shared = shared.clone();
        move || {
            // Told the hook when the thread ends, however it ends.
            let _hint = hint;
            let s = &*shared;
            // A panic of the loader (a bug) ends the load as damage would:
            // waiters get an error instead of waiting for ever.
            let guard = EndOnPanic(s);
            let stop = || s.load.stopping();
            #[cfg(any(test, feature = "testing"))]
            hold::wait_while_held(&s.ctx.config.data_dir, &stop);
            if stop() {
                std::mem::forget(guard);
                return;
            }
            match pending.load_rest(&s.ctx, &s.catalog, &s.cursors, &stop) {
                Ok(true) => {
                    s.catalog.write().set_pending(None);
                    log::info!(
                        "state loaded: {} groups, {} memberships",
                        s.catalog.read().len(),
                        s.cursors.memberships()
                    );
                    s.load.end(None, state_dir(s));
                    // Recalled payloads the registered groups' segments may
                    // still hold: the erasure pass runs after a stored
                    // checkpoint, and its bound counts from the open.
                    if !s.ctx.erase_groups.lock().is_empty() {
                        s.pending.lock().checkpoint = true;
                        s.pending_cv.notify_all();
                    }
                }
                Ok(false) => {
                    // Stopped: the engine is going away.
                    std::mem::forget(guard);
                    return;
                }
                Err(e) => {
                    crate::commit::thread::stop_writes(s, &e);
                    s.load.end(Some(&e), state_dir(s));
                }
            }
            std::mem::forget(guard);
            s.ckpt.cv.notify_all();
            crate::commit::thread::worker_settled(s);
        }
    };
    match std::thread::Builder::new()
        .name("tidemark-load".into())
        .spawn(run)
    {
        Ok(handle) => Ok(Some(handle)),
        Err(e) => {
            log::warn!("no loader thread ({e}): the state loads before the engine opens");
            finish_now(
                &shared.ctx,
                &shared.catalog,
                &shared.cursors,
                &mut Some(spare),
            )?;
            shared.load.end(None, state_dir(shared));
            Ok(None)
        }
    }
}

fn state_dir(shared: &Shared) -> std::path::PathBuf {
    shared.ctx.config.data_dir.join("state")
}

/// Ends the load as stopped at damage if the loader thread unwinds.
struct EndOnPanic<'a>(&'a Shared);

impl Drop for EndOnPanic<'_> {
    fn drop(&mut self) {
        let e = Error::Corrupt {
            path: state_dir(self.0),
            group: None,
            offset: 0,
            reason: "the background load of the saved state panicked (a bug): restart \
                     with --load-before-listening"
                .into(),
        };
        crate::commit::thread::stop_writes(self.0, &e);
        self.0.load.end(Some(&e), state_dir(self.0));
        crate::commit::thread::worker_settled(self.0);
    }
}

/// Tests: holds the loader of the engine opened on a data directory
/// before its first batch, so that what requests do while a load is
/// pending is deterministic. The hold itself is in the `testing` feature
/// too (`Engine::hold_load`), for the replica set's tests; the rest is
/// the engine's own tests'.
#[cfg(any(test, feature = "testing"))]
pub(crate) mod hold {
    use std::path::{Path, PathBuf};

    use parking_lot::Mutex;

    static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    #[cfg(test)]
    thread_local! {
        /// Lookups in the mapped runs (a group's items, a user's index
        /// entries) made on this thread.
        static RUN_LOOKUPS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    #[cfg(test)]
    pub(super) fn count_run_lookup() {
        RUN_LOOKUPS.with(|n| n.set(n.get() + 1));
    }

    /// Lookups in the mapped runs made on the calling thread so far.
    #[cfg(test)]
    pub(crate) fn run_lookups() -> u64 {
        RUN_LOOKUPS.with(std::cell::Cell::get)
    }

    pub(crate) fn hold(dir: &Path) {
        HELD.lock().push(dir.to_path_buf());
    }

    pub(crate) fn release(dir: &Path) {
        HELD.lock().retain(|d| d != dir);
    }

    pub(super) fn wait_while_held(dir: &Path, stop: &dyn Fn() -> bool) {
        while HELD.lock().iter().any(|d| d == dir) && !stop() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Loaders held before they build a batch's rows, and those waiting
    /// there now.
    #[cfg(test)]
    static ROWS_HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    #[cfg(test)]
    static AT_ROWS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    /// Holds the loader of the engine opened on `dir` before it builds
    /// the cursor rows of its next batch (its groups are made, not yet
    /// published).
    #[cfg(test)]
    pub(crate) fn hold_rows(dir: &Path) {
        ROWS_HELD.lock().push(dir.to_path_buf());
    }

    #[cfg(test)]
    pub(crate) fn release_rows(dir: &Path) {
        ROWS_HELD.lock().retain(|d| d != dir);
    }

    /// Whether that loader waits there now.
    #[cfg(test)]
    pub(crate) fn at_rows(dir: &Path) -> bool {
        AT_ROWS.lock().iter().any(|d| d == dir)
    }

    #[cfg(test)]
    pub(super) fn wait_before_rows(dir: &Path) {
        if !ROWS_HELD.lock().iter().any(|d| d == dir) {
            return;
        }
        AT_ROWS.lock().push(dir.to_path_buf());
        while ROWS_HELD.lock().iter().any(|d| d == dir) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        AT_ROWS.lock().retain(|d| d != dir);
    }
}
