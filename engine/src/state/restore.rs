//! Loading a checkpoint at open: the groups (unloaded, their logs read on
//! first use) and memberships that the merge of a manifest's runs yields,
//! registered in the catalog and the cursor table (format-spec/storage.md
//! section 11, step 2).
//!
//! Two cores share the work: a decoder thread reads the runs (every block
//! CRC and every reader check, as any merge does) and hands the merged
//! items over in batches, each member row with its user's cursor-table
//! shard (a keyed hash), while the opening thread registers them; the
//! cursor table's [`Loader`] then builds its shards on both cores. A
//! damaged run, a group whose record does not make sense, or rows out of
//! order end the load with the first error, whichever side finds it, and
//! recovery then tries the previous checkpoint.
//!
//! Costs: one decode and one registration per item; memory: the batches in
//! flight ([`BATCHES_IN_FLIGHT`] x [`BATCH_ITEMS`] items) and the loader's
//! rows (24 bytes a membership, freed at the end).

use std::sync::mpsc;
use std::sync::Arc;

use crate::catalog::Catalog;
use crate::commit::context::Context;
use crate::group::{Group, LogSlot};
use crate::logs::group_log::LogState;
use crate::members::cursors::{CursorTable, Loader};
use crate::members::membership::GroupMembers;
use crate::state::checkpointer;
use crate::state::manifest::{Manifest, RunMeta};
use crate::state::{GroupRecord, Item};

/// Items per batch handed from the decoder to the registering thread:
/// large enough that the hand-over costs nothing per item, small enough to
/// stay in the caches.
const BATCH_ITEMS: usize = 8192;

/// Batches decoded ahead of the registering thread.
const BATCHES_IN_FLIGHT: usize = 8;

/// Registers the groups (unloaded) and memberships the merge of a
/// manifest's runs yields. The runs hold what was accepted: no limit is
/// applied again; a cursor is never above its group's head. Returns the
/// highest `applied_lsn` of a group record (0 without one).
pub(crate) fn restore_runs(
    ctx: &Context,
    catalog: &mut Catalog,
    cursors: &CursorTable,
    m: &Manifest,
) -> Result<u64, String> {
    // The runs' items bound the memberships (a full merge yields fewer
    // when newer runs replace or delete older items). The counts are the
    // manifest's, not yet checked against the parts: the reservation is
    // capped (it is address space; beyond it the buffers grow).
    let items = m.runs.iter().map(|r| r.items()).sum::<u64>();
    let mut registry = Registry {
        ctx,
        catalog,
        loader: cursors.loader(usize::try_from(items.min(1 << 24)).unwrap_or(1 << 24)),
        current: None,
        members: Vec::new(),
        applied_lsn_max: 0,
    };
    for_each_batch(ctx, cursors, &m.runs, |batch| {
        batch
            .into_iter()
            .try_for_each(|(item, shard)| registry.item(item, shard))
    })?;
    let Registry {
        loader,
        applied_lsn_max,
        ..
    } = registry.finish();
    loader.finish();
    Ok(applied_lsn_max)
}

/// Merged items, each with its cursor-table shard (0 for a group item).
pub(crate) type Batch = Vec<(Item, usize)>;

/// Calls `consume` with the merged items of `runs` but the user index's,
/// in key order, in
/// batches decoded on a thread of its own (inline if no thread can be
/// started). The first error, of the merge or of `consume`, ends it.
/// Also the background load's (`state::lazy`).
pub(crate) fn for_each_batch(
    ctx: &Context,
    cursors: &CursorTable,
    runs: &[RunMeta],
    mut consume: impl FnMut(Batch) -> Result<(), String>,
) -> Result<(), String> {
    let decode = |send: &mut dyn FnMut(Result<Batch, String>) -> bool| {
        let merged = checkpointer::with_merge(ctx, runs, true, |items| {
            let mut batch = Vec::with_capacity(BATCH_ITEMS);
            for item in items {
                match item {
                    Ok(item) => {
                        let shard = match &item {
                            Item::MemberPut { user, .. } => cursors.shard_of(*user),
                            // The user index is for lookups before the
                            // load ends: the load registers member rows.
                            Item::IndexPut { .. } | Item::IndexDelete { .. } => continue,
                            _ => 0,
                        };
                        batch.push((item, shard));
                    }
                    Err(e) => {
                        send(Err(e));
                        return;
                    }
                }
                if batch.len() == BATCH_ITEMS {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ITEMS));
                    if !send(Ok(full)) {
                        return; // the receiving side stopped at an error
                    }
                }
            }
            if !batch.is_empty() {
                send(Ok(batch));
            }
        });
        if let Err(e) = merged {
            send(Err(e));
        }
    };
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::sync_channel::<Result<Batch, String>>(BATCHES_IN_FLIGHT);
        let decoder = std::thread::Builder::new()
            .name("tidemark-restore".into())
            .spawn_scoped(s, move || decode(&mut |b| tx.send(b).is_ok()));
        if decoder.is_err() {
            // No second thread: decode here, one batch at a time.
            let mut outcome = Ok(());
            decode(&mut |b| {
                outcome = b.and_then(&mut consume);
                outcome.is_ok()
            });
            return outcome;
        }
        // Ends when the decoder is done and dropped its sender; returning
        // early drops the receiver, which stops the decoder at its next
        // batch.
        rx.into_iter().try_for_each(|b| b.and_then(&mut consume))
    })
}

/// Registers a group as its checkpoint record says (its log unloaded,
/// read on first use), with its small extents counted as live and its
/// pending erasures queued; its members come separately. The record's
/// `applied_lsn` is its captured one. Shared by the load at open and the
/// background load (`state::lazy`).
pub(crate) fn register_group(
    ctx: &Context,
    catalog: &mut Catalog,
    rec: Box<GroupRecord>,
) -> Result<Arc<Group>, String> {
    catalog.register_made(|slot| make_group(ctx, rec, slot))
}

/// The group a checkpoint record describes, in a slot reserved for it
/// ([`Catalog::reserve_slot`]), made as [`register_group`] registers it
/// but not registered: the background load makes a batch's groups and
/// their cursor rows before it takes the catalog's lock to publish them.
pub(crate) fn make_group(
    ctx: &Context,
    rec: Box<GroupRecord>,
    slot: u32,
) -> Result<Arc<Group>, String> {
    let rec = *rec;
    let state = LogState {
        head: rec.head,
        segments: rec.segments,
    };
    let log = match (rec.damaged, rec.small) {
        (Some(reason), _) => LogSlot::Damaged { state, reason },
        // A small group: its records in the journal files.
        (None, Some(small)) => {
            let list = small
                .extent_list(state.head)
                .map_err(|why| format!("group {}: {why}", rec.group))?;
            crate::commit::small_log::restore_live(ctx, &list);
            LogSlot::Small(list)
        }
        // No segment: a group without record or file.
        (None, None) if state.segments.is_empty() => LogSlot::new_small(),
        (None, None) => LogSlot::Unloaded(state),
    };
    let g = Arc::new(Group::new(rec.group, slot, log));
    // A new group keeps everything already (and setting that would box and
    // drop its extras). Not registered yet: `Catalog::publish` indexes it.
    if !rec.retention.keeps_everything() {
        g.set_retention(rec.retention);
    }
    if !rec.quiet.is_empty() || !rec.edits.is_empty() {
        g.restore_quiet(rec.quiet, rec.edits);
    }
    if !rec.erase.is_empty() {
        // Recalled payloads a segment may still hold: the erasure pass goes
        // on with them.
        g.add_erase(&rec.erase);
        ctx.erase_groups.lock().insert(rec.group);
    }
    let mut ck = g.ckpt(&ctx.dirty);
    ck.set_applied_lsn(rec.applied_lsn);
    ck.capture_once();
    drop(ck);
    Ok(g)
}

/// The registering side of a load.
struct Registry<'a> {
    ctx: &'a Context,
    catalog: &'a mut Catalog,
    loader: Loader<'a>,
    /// The group whose rows come now, and its members so far: rows follow
    /// their group's record in key order, users ascending.
    current: Option<Arc<Group>>,
    members: Vec<(u64, u64)>,
    applied_lsn_max: u64,
}

impl Registry<'_> {
    /// Registers one item; `shard` is a member row's user's shard.
    fn item(&mut self, item: Item, shard: usize) -> Result<(), String> {
        match item {
            Item::GroupPut(rec) => {
                self.close_group();
                self.applied_lsn_max = self.applied_lsn_max.max(rec.applied_lsn);
                self.current = Some(register_group(self.ctx, self.catalog, rec)?);
            }
            Item::MemberPut {
                group,
                user,
                cursor,
                join_point,
            } => {
                let g = self
                    .current
                    .as_ref()
                    .filter(|g| g.id == group)
                    .ok_or_else(|| format!("member row of group {group} without its record"))?;
                if self.members.last().is_some_and(|&(last, _)| last >= user) {
                    return Err(format!("member rows of group {group} out of order"));
                }
                let cursor = cursor.min(g.head());
                self.loader
                    .push_in_shard(shard, user, g.slot, cursor, join_point);
                self.members.push((user, cursor));
            }
            other => return Err(format!("a full merge yielded {other:?}")),
        }
        Ok(())
    }

    /// Gives the group whose rows came last its member list.
    fn close_group(&mut self) {
        if let Some(g) = self.current.take() {
            *g.members.lock() = GroupMembers::from_sorted(&self.members);
        }
        self.members.clear();
    }

    fn finish(mut self) -> Self {
        self.close_group();
        self
    }
}
