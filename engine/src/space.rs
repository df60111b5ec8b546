//! The free-space reserve (`disk_free_min_bytes`, format-spec/storage.md
//! section 9, "Free space") as the background writers see it.
//!
//! Client writes are refused by the commit thread's measurement
//! (`Engine::check_writable`). The writers no client waits for — evacuation
//! and compaction into cold files (`rewrite.rs`), the erasure rewrite of a
//! segment (`erase_segments.rs`), the merge of checkpoint runs (K5) — ask
//! [`Reserve::allows`] before they write, with what they are about to
//! write, and put their work off (the next checkpoint's pass tries again)
//! when it would take the free space below the reserve. The writes that
//! free space or that an accepted round needs (the round's journal frame,
//! its segment tails and promotions, cursor flushes, a checkpoint's delta
//! run and manifest, deletions) are not asked: they may dip into the
//! reserve, which exists for them (storage.md section 9 says why that
//! ends).
//!
//! A spell of back-offs is logged once, when it starts, and once when space
//! returns; each back-off is counted (`EngineStats::reserve_backoffs`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::io::Vfs;

/// What the background writers share about the reserve: one per engine
/// (in `LogContext`).
#[derive(Default)]
pub struct Reserve {
    /// Writes put off because they would have used the reserve.
    backoffs: AtomicU64,
    /// Set from the first back-off until a check finds room again.
    backing_off: AtomicBool,
}

impl Reserve {
    /// Whether a background writer may write `bytes` more now (`what` names
    /// it for the log): `Err(DiskFull)` if that would take the free space
    /// of the data directory's file system (one `statvfs`) below
    /// `disk_free_min_bytes`. Always `Ok` with the reserve off (0). A
    /// failed measurement lets the write go (as the commit thread keeps
    /// its last value): the write itself then meets ENOSPC, which every
    /// background writer already takes as a reason to put off.
    pub fn allows(&self, vfs: &dyn Vfs, config: &Config, what: &str, bytes: u64) -> Result<()> {
        let min = config.disk_free_min_bytes;
        if min == 0 {
            return Ok(());
        }
        let free = match vfs.free_bytes(&config.data_dir) {
            Ok(free) => free,
            Err(e) => {
                log::warn!("statvfs: {e}");
                return Ok(());
            }
        };
        if free >= min.saturating_add(bytes) {
            if self.backing_off.swap(false, Ordering::AcqRel) {
                log::info!("disk space back ({free} bytes free): background writes go on");
            }
            return Ok(());
        }
        self.backoffs.fetch_add(1, Ordering::Relaxed);
        if !self.backing_off.swap(true, Ordering::AcqRel) {
            log::warn!(
                "{what} put off: it would write {bytes} bytes with {free} free and a reserve of \
                 {min} (background writes wait for space; further back-offs are counted, not \
                 logged)"
            );
        }
        Err(Error::DiskFull { free, min })
    }

    /// Background writes put off for the reserve since open.
    pub fn backoffs(&self) -> u64 {
        self.backoffs.load(Ordering::Relaxed)
    }
}
