//! Erasure of recalled messages from large groups' segment files
//! (format-spec/storage.md section 3, "Erasure"; section 16, item 16): the
//! checkpointer's pass after each stored checkpoint, over the groups of
//! `Context::erase_groups`.
//!
//! Representation: each such group has an *erase list* (`Group::erase_ids`,
//! GroupPut bit 6): the recalled messages whose payload a segment file may
//! still hold. `apply::records` adds a Recall's target for a group with
//! segments (and for a small group whose record lies in a cold file: a
//! small group's list is `rewrite.rs`'s, this pass skips it); recovery
//! restores the list a checkpoint stored; this pass takes ids off it.
//!
//! The pass, per group:
//! 1. A listed id in the *active* segment of a loaded log: the segment is
//!    rolled (its tail written, a new segment started at `head + 1`; a
//!    pwrite and a file create, no sync, under the checkpoint lock and
//!    `log.write`), so it becomes sealed. Its new segment's sync goes to
//!    the next checkpoint's K3 like any segment's.
//! 2. Each *sealed* segment `(base, len)` holding a listed id is copied:
//!    bytes `[0, len)` read with no lock (bytes below a sealed segment's
//!    `len` never change, the same argument as `IndexJob::build`), the
//!    recalled messages put in erased form (`Group::erase_recalled`,
//!    same length), the copy written to `<base>.seg.erasing` and
//!    fdatasynced, then renamed over the segment under the checkpoint lock
//!    and `log.read` once the slot is seen to still hold that segment with
//!    that length (retention's `drop_oldest` and a deletion hold both, so
//!    neither runs across the rename); the segment cache forgets the old
//!    file. The directory is fsynced after, with no lock held. A copy with
//!    nothing to erase (a rerun after a crash) is not written.
//! 3. Under the checkpoint lock the ids of the rewritten (or gone)
//!    segments leave the list and the group is marked dirty: the next
//!    capture stores the shorter list.
//!
//! Invariants: the list is cleared only after the rewritten file's data
//! and its name are durable, so a crash anywhere leaves the id listed and
//! the rerun (idempotent: an erased record is left as it is) finishes it.
//! Either file the name points at is valid, with the same length and the
//! same records but for the erased payloads, so a reader holding the old
//! mapping (`Chunk::Mapped`) and a new one agree; a backup copying `len`
//! bytes gets either.
//!
//! An *unloaded* group with a listed id in its active segment (possible
//! only after a restart: `unload_if_quiet` keeps a group with a list
//! loaded) cannot be rolled: its sealed segments are rewritten as above,
//! and the pass has the maintenance worker load it (`load`, the job a
//! request's first use queues; the verifying scan stays off the
//! checkpointer and the event loop) and keeps it in `erase_groups`, so the
//! next pass rolls and rewrites it. A node with a pending group takes a
//! checkpoint at open and one `checkpoint_interval_ms` after each stored
//! one, so this holds with no client touching the group: the segments no
//! longer hold the payload after the second stored checkpoint after open
//! (storage.md section 16, item 16).
//!
//! Not covered here: damaged groups (their files are kept for repair as
//! they are); cold files and journal files (`rewrite.rs`).
//!
//! Costs: per pass, work proportional to the pending groups (never to all
//! groups: `erase_groups` holds only the groups with a non-empty list) and
//! the bytes of the segments holding listed ids (each segment copied once
//! per recall that lands in it before a pass; at most `segment_bytes_max`
//! read and written per segment); no sync under a lock; one queued worker
//! job per unloaded pending group.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::catalog::Catalog;
use crate::commit::context::Context;
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::io::OpenMode;
use crate::logs::segment::{self, SEGMENT_HEADER_BYTES};

/// What one pass did (checkpoint counters, tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EraseStats {
    pub segments_rewritten: u64,
    pub bytes_written: u64,
}

/// The name a segment's erased copy is written under before its rename
/// (`segment::parse_file_name` does not take it for a segment).
pub(crate) fn erasing_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{}.erasing", segment::file_name(base)))
}

/// One pass over the groups with an erase list (module docs). A failure
/// ends the pass for that group; its list stays and the next pass retries.
/// `load` queues the load of an unloaded group's log on the maintenance
/// worker (it must not wait for it).
pub(crate) fn run(
    ctx: &Context,
    catalog: &RwLock<Catalog>,
    load: &dyn Fn(&Arc<Group>),
) -> EraseStats {
    let mut stats = EraseStats::default();
    let pending: Vec<u64> = ctx.erase_groups.lock().iter().copied().collect();
    for id in pending {
        let Some(g) = catalog.read().get(id).cloned() else {
            ctx.erase_groups.lock().remove(&id);
            continue;
        };
        match erase_group(ctx, &g, load, &mut stats) {
            Ok(()) => {}
            // Logged (once a spell) and counted by the reserve.
            Err(Error::DiskFull { .. }) => {}
            Err(e) => log::warn!("erasing recalled messages of group {id} put off: {e}"),
        }
    }
    stats
}

fn erase_group(
    ctx: &Context,
    g: &Arc<Group>,
    load: &dyn Fn(&Arc<Group>),
    stats: &mut EraseStats,
) -> Result<()> {
    // Step 1, and the segments to copy, under the checkpoint lock.
    let (ids, sealed) = {
        let mut ck = g.ckpt(&ctx.dirty);
        let ids = g.erase_ids();
        let mut slot = g.log.write();
        let state = match &mut *slot {
            _ if ids.is_empty() => None,
            LogSlot::Loaded(log) => {
                let active_base = log.state().segments.last().map_or(u64::MAX, |s| s.0);
                if ids.last().is_some_and(|&last| last >= active_base) && log.roll(ctx)? {
                    ctx.dirty.mark(g, &mut ck);
                }
                Some(log.state())
            }
            LogSlot::Unloaded(state) => Some(state.clone()),
            // Small: its listed ids lie in cold files, which the
            // reclaimer compacts (`rewrite.rs`); it takes the group off.
            LogSlot::Small(_) => return Ok(()),
            // Damaged (kept for repair)
            // or deleted: nothing this pass can rewrite.
            _ => None,
        };
        drop(slot);
        let Some(state) = state else {
            ctx.erase_groups.lock().remove(&g.id);
            return Ok(());
        };
        // Sealed segments as `(base, len, first id of the next one)`.
        let sealed: Vec<(u64, u64, u64)> = state
            .segments
            .windows(2)
            .map(|w| (w[0].0, w[0].1, w[1].0))
            .collect();
        (ids, sealed)
    };
    let dir = ctx.group_dir(g.id);
    let mut done = Vec::new();
    for &(base, len, next) in &sealed {
        let here: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|&id| id >= base && id < next)
            .collect();
        if here.is_empty() {
            continue;
        }
        if rewrite_segment(ctx, g, &dir, base, len, stats)? {
            done.extend(here);
        }
    }
    // Ids below the oldest segment are in no file any more (retention).
    let floor = sealed.first().map_or(0, |s| s.0);
    done.extend(ids.iter().copied().filter(|&id| id < floor));
    done.sort_unstable();
    let mut ck = g.ckpt(&ctx.dirty);
    if !done.is_empty() {
        g.clear_erase(&done);
        ctx.dirty.mark(g, &mut ck);
    }
    let left = g.erase_ids();
    let active_base = match &*g.log.read() {
        LogSlot::Loaded(log) => log.state().segments.last().map(|s| s.0),
        LogSlot::Unloaded(state) => state.segments.last().map(|s| s.0),
        _ => None,
    };
    let unloaded = matches!(&*g.log.read(), LogSlot::Unloaded(_));
    if left.is_empty() {
        ctx.erase_groups.lock().remove(&g.id);
    }
    drop(ck);
    // Ids in an unloaded group's active segment: the worker loads it, the
    // next pass rolls it (module docs). The group stays pending, so
    // checkpoints keep coming.
    if unloaded && active_base.is_some_and(|b| left.last().is_some_and(|&l| l >= b)) {
        load(g);
    }
    Ok(())
}

/// Step 2 for one sealed segment. Returns whether the segment is now
/// erased durably (or is gone); `false`: it changed meanwhile, the next
/// pass looks again.
fn rewrite_segment(
    ctx: &Context,
    g: &Arc<Group>,
    dir: &Path,
    base: u64,
    len: u64,
    stats: &mut EraseStats,
) -> Result<bool> {
    let path = dir.join(segment::file_name(base));
    let mut bytes = vec![0u8; len as usize];
    {
        let f = match ctx.vfs.open(&path, OpenMode::Read) {
            Ok(f) => f,
            // Retention or a deletion took it since: nothing to erase.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
        };
        f.read_exact_at(&mut bytes, 0)
            .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    }
    let before = bytes.clone();
    g.erase_recalled(&mut bytes[SEGMENT_HEADER_BYTES..]);
    if bytes == before {
        // Already erased (a rerun after a crash).
        return Ok(true);
    }
    // The copy must leave the free-space reserve whole (`space.rs`); else
    // the id stays listed for the next pass.
    ctx.reserve
        .allows(&*ctx.vfs, &ctx.config, "erasing a segment", len)?;
    let tmp = erasing_path(dir, base);
    if ctx.vfs.exists(&tmp) {
        ctx.vfs
            .remove_file(&tmp)
            .map_err(|e| Error::io(format!("remove stale {}", tmp.display()), e))?;
    }
    {
        let f = ctx
            .vfs
            .open(&tmp, OpenMode::CreateNew)
            .map_err(|e| Error::write(format!("create {}", tmp.display()), e))?;
        f.write_all_at(&bytes, 0)
            .map_err(|e| Error::write(format!("write {}", tmp.display()), e))?;
        f.sync_data()
            .map_err(|e| Error::write(format!("sync {}", tmp.display()), e))?;
    }
    {
        let _ck = g.ckpt(&ctx.dirty);
        let slot = g.log.read();
        let state = match &*slot {
            LogSlot::Loaded(log) => Some(log.state()),
            LogSlot::Unloaded(state) => Some(state.clone()),
            _ => None,
        };
        let still = state.is_some_and(|s| {
            let n = s.segments.len();
            s.segments[..n.saturating_sub(1)].contains(&(base, len))
        });
        if !still {
            drop(slot);
            let _ = ctx.vfs.remove_file(&tmp);
            return Ok(false);
        }
        ctx.vfs
            .rename(&tmp, &path)
            .map_err(|e| Error::write(format!("rename {}", tmp.display()), e))?;
        ctx.cache.forget(g.id, base);
    }
    ctx.vfs
        .sync_dir(dir)
        .map_err(|e| Error::write(format!("sync {}", dir.display()), e))?;
    stats.segments_rewritten += 1;
    stats.bytes_written += len;
    Ok(true)
}
