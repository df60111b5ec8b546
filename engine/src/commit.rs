//! The commit thread: takes the pending round whole, writes it to the
//! journal with one write, syncs it per the fsync policy (one fdatasync for
//! the round, however many groups it touched), applies it to the group logs,
//! then completes the round and wakes whoever waits. Checkpoints run here
//! too, between rounds.
//!
//! A failed write or sync is never retried: the round and every later one
//! fail with `WritesStopped`, and reads go on. Reopening recovers.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::checkpoint::{self, CheckpointBody, GroupEntry};
use crate::config::FsyncPolicy;
use crate::engine::{Op, Shared};
use crate::error::{Error, Result};
use crate::group::LogSlot;
use crate::journal::{self, EntryKind, Journal, ENTRY_HEADER_BYTES};

struct Committer {
    shared: Arc<Shared>,
    journal: Journal,
    /// Journal bytes written but not yet synced (interval and never policies).
    unsynced_bytes: u64,
    last_sync: Instant,
    /// Reused buffers: the round taken from senders and the per-group staging.
    round_buf: Vec<u8>,
    staging: Vec<u8>,
}

pub(crate) fn run(shared: Arc<Shared>, journal: Journal) {
    let mut c = Committer {
        shared,
        journal,
        unsynced_bytes: 0,
        last_sync: Instant::now(),
        round_buf: Vec::new(),
        staging: Vec::new(),
    };
    c.main_loop();
    let mut p = c.shared.progress.lock();
    p.commit_thread_exited = true;
    drop(p);
    c.shared.progress_cv.notify_all();
}

impl Committer {
    fn main_loop(&mut self) {
        loop {
            let Some((ops, round)) = self.next_round() else {
                break;
            };
            let result = self.commit_round(&ops);
            self.finish_round(round, ops.len() as u64, result);
            if self.journal.len() >= self.shared.ctx.config.journal_checkpoint_bytes
                && !self.failed()
            {
                let r = self.checkpoint(false);
                if let Err(e) = r {
                    self.fail(round + 1, e);
                }
            }
        }
        // Shutdown: everything accepted was committed by the loop above.
        if !self.failed() && !self.shared.pending.lock().crash {
            if let Err(e) = self.checkpoint(true) {
                log::error!("final checkpoint failed: {e}");
                let mut p = self.shared.progress.lock();
                p.failed.get_or_insert((u64::MAX, e.to_string()));
            }
        }
    }

    fn failed(&self) -> bool {
        self.shared.writes_stopped.load(Ordering::Acquire)
    }

    /// Waits for work; returns the ops of the next round and its number, or
    /// `None` at shutdown once nothing is pending. Syncs the journal when an
    /// interval policy's period elapses.
    fn next_round(&mut self) -> Option<(Vec<Op>, u64)> {
        let mut p = self.shared.pending.lock();
        loop {
            if !p.ops.is_empty() {
                break;
            }
            if p.shutdown {
                return None;
            }
            match self.shared.ctx.config.fsync {
                FsyncPolicy::Interval(period) if self.unsynced_bytes > 0 => {
                    let elapsed = self.last_sync.elapsed();
                    if elapsed >= period {
                        drop(p);
                        self.interval_sync();
                        p = self.shared.pending.lock();
                    } else {
                        self.shared.pending_cv.wait_for(&mut p, period - elapsed);
                    }
                }
                _ => self.shared.pending_cv.wait(&mut p),
            }
        }
        std::mem::swap(&mut p.buf, &mut self.round_buf);
        p.buf.clear();
        let ops = std::mem::take(&mut p.ops);
        let round = p.round;
        p.round += 1;
        drop(p);
        // Senders blocked on a full round may go on.
        self.shared.pending_cv.notify_all();
        Some((ops, round))
    }

    fn interval_sync(&mut self) {
        if self.failed() {
            return;
        }
        match self.journal.sync() {
            Ok(()) => {
                self.shared
                    .counters
                    .journal_syncs
                    .fetch_add(1, Ordering::Relaxed);
                self.unsynced_bytes = 0;
                self.last_sync = Instant::now();
            }
            Err(e) => {
                let round = self.shared.pending.lock().round;
                self.fail(round, e);
            }
        }
    }

    fn commit_round(&mut self, ops: &[Op]) -> Result<()> {
        if self.failed() {
            return Err(Error::WritesStopped {
                reason: "an earlier round failed".into(),
            });
        }
        self.journal.append(&self.round_buf)?;
        self.unsynced_bytes += self.round_buf.len() as u64;
        let sync_now = match self.shared.ctx.config.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval(period) => self.last_sync.elapsed() >= period,
            FsyncPolicy::Never => false,
        };
        if sync_now {
            self.journal.sync()?;
            self.shared
                .counters
                .journal_syncs
                .fetch_add(1, Ordering::Relaxed);
            self.unsynced_bytes = 0;
            self.last_sync = Instant::now();
        }
        self.apply(ops)
    }

    /// Applies the round's entries to the group logs: records of one group
    /// go out in one write (its entries are staged contiguously first).
    fn apply(&mut self, ops: &[Op]) -> Result<()> {
        // Stable sort: per-group order (= id order) is kept.
        let mut order: Vec<usize> = (0..ops.len()).collect();
        order.sort_by_key(|&i| ops[i].group.id);
        let mut i = 0;
        while i < order.len() {
            let op = &ops[order[i]];
            if op.kind != EntryKind::Record {
                if op.kind == EntryKind::DeleteGroup {
                    self.apply_delete(op)?;
                }
                i += 1;
                continue;
            }
            self.staging.clear();
            let mut j = i;
            while j < order.len()
                && ops[order[j]].group.id == op.group.id
                && ops[order[j]].kind == EntryKind::Record
            {
                let e = &ops[order[j]].entry;
                self.staging
                    .extend_from_slice(&self.round_buf[e.start + ENTRY_HEADER_BYTES..e.end]);
                j += 1;
            }
            let mut slot = op.group.log.write();
            if let LogSlot::Loaded(log) = &mut *slot {
                log.append(&self.shared.ctx, &self.staging)?;
                op.group.publish_head(log.head());
            }
            // A group that is not loaded cannot have accepted a send (the
            // send path loads it); a damaged one refuses sends.
            i = j;
        }
        Ok(())
    }

    fn apply_delete(&mut self, op: &Op) -> Result<()> {
        let removed = self.shared.groups.write().remove(&op.group.id);
        let mut slot = op.group.log.write();
        let old = std::mem::replace(&mut *slot, LogSlot::Deleted);
        drop(slot);
        if let LogSlot::Loaded(log) = &old {
            log.remove_files(&self.shared.ctx)?;
        } else if removed.is_some() {
            let dir = self.shared.ctx.group_dir(op.group.id);
            if self.shared.ctx.vfs.exists(&dir) {
                self.shared
                    .ctx
                    .vfs
                    .remove_dir_all(&dir)
                    .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
            }
        }
        Ok(())
    }

    fn finish_round(&mut self, round: u64, records: u64, result: Result<()>) {
        match result {
            Ok(()) => {
                let c = &self.shared.counters;
                c.rounds.fetch_add(1, Ordering::Relaxed);
                c.round_records_max.fetch_max(records, Ordering::Relaxed);
                self.shared.progress.lock().completed = round;
                self.shared.progress_cv.notify_all();
                let listeners = self.shared.listeners.lock().clone();
                for l in listeners {
                    l(round);
                }
            }
            Err(e) => self.fail(round, e),
        }
    }

    /// Stops writes: `round` and every later one fail with the reason.
    fn fail(&self, round: u64, e: Error) {
        log::error!("commit round {round} failed, writes stopped: {e}");
        self.shared.writes_stopped.store(true, Ordering::Release);
        let mut p = self.shared.progress.lock();
        if p.failed.is_none() {
            p.failed = Some((round, e.to_string()));
        }
        drop(p);
        self.shared.progress_cv.notify_all();
    }

    /// Makes the group logs durable, starts a new journal file and records
    /// the recovery point; then the old journal files are deleted.
    pub(crate) fn checkpoint(&mut self, clean_shutdown: bool) -> Result<()> {
        let ctx = &self.shared.ctx;
        let groups: Vec<_> = self.shared.groups.read().values().cloned().collect();
        let mut entries = Vec::with_capacity(groups.len());
        let mut syncs = 0;
        for g in &groups {
            let mut slot = g.log.write();
            if let LogSlot::Loaded(log) = &mut *slot {
                if log.needs_sync() {
                    syncs += log.sync(ctx)?;
                }
            }
            if let Some(state) = slot.state() {
                entries.push(GroupEntry {
                    group_id: g.id,
                    head: state.head,
                    segments: state.segments,
                });
            }
        }
        let dir = journal::journal_dir(&ctx.config.data_dir);
        let old_seq = self.journal.seq;
        let next = Journal::create(&*ctx.vfs, &dir, old_seq + 1)?;
        let body = CheckpointBody {
            journal_seq: next.seq,
            clean_shutdown,
            created_ms: crate::engine::now_ms(),
            groups: entries,
        };
        checkpoint::store(&*ctx.vfs, &ctx.config.data_dir, &body)?;
        self.journal = next;
        self.unsynced_bytes = 0;
        for (seq, path) in journal::list(&*ctx.vfs, &dir)? {
            if seq <= old_seq {
                ctx.vfs
                    .remove_file(&path)
                    .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
            }
        }
        let c = &self.shared.counters;
        c.checkpoints.fetch_add(1, Ordering::Relaxed);
        c.checkpoint_syncs.fetch_add(syncs + 3, Ordering::Relaxed);
        Ok(())
    }
}
