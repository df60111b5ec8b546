//! The budget of open segment files: an LRU of `(group, base_msg_id)` to an
//! open [`SegmentFile`] (one file descriptor and one mapping each), so an
//! engine with 100,000 groups never holds 100,000 descriptors.
//!
//! A handle handed out stays valid after eviction (it is reference counted);
//! the budget bounds the cached handles, and a handle in use by a reader
//! outlives its eviction only until that reader drops it.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::Result;
use crate::io::Vfs;
use crate::logs::segment::{SegmentFile, SegmentHeader};

type Key = (u64, u64);

pub struct SegmentCache {
    lru: Mutex<lru::LruCache<Key, Arc<SegmentFile>>>,
    map_bytes: u64,
}

impl SegmentCache {
    pub fn new(open_segments_max: usize, map_bytes: u64) -> Self {
        // Invariant: Config::validate requires open_segments_max >= 2.
        let cap = NonZeroUsize::new(open_segments_max).expect("invariant: validated budget");
        SegmentCache {
            lru: Mutex::new(lru::LruCache::new(cap)),
            map_bytes,
        }
    }

    /// The open segment `(group, base)`, opening the file at `path()` if it
    /// is not cached (the path is only built then: this is on every append
    /// and read).
    pub fn get(
        &self,
        vfs: &dyn Vfs,
        group: u64,
        base: u64,
        path: impl FnOnce() -> PathBuf,
    ) -> Result<Arc<SegmentFile>> {
        if let Some(seg) = self.lru.lock().get(&(group, base)) {
            return Ok(seg.clone());
        }
        // Open outside the lock: opening and mapping are system calls.
        let seg = Arc::new(SegmentFile::open(vfs, &path(), self.map_bytes)?);
        let mut lru = self.lru.lock();
        // Opened or created by another thread meanwhile: the first stays. A
        // file created for a new group of a deleted one's id must not be
        // shadowed by a handle of the old file opened just before.
        if let Some(first) = lru.get(&(group, base)) {
            return Ok(first.clone());
        }
        let evicted = lru.push((group, base), seg.clone());
        drop(lru);
        // Closed and unmapped outside the lock.
        drop(evicted);
        Ok(seg)
    }

    /// Creates segment `(group, header.base_msg_id)` at `path` and caches it.
    pub fn create(
        &self,
        vfs: &dyn Vfs,
        path: &Path,
        header: &SegmentHeader,
    ) -> Result<Arc<SegmentFile>> {
        let seg = Arc::new(SegmentFile::create(vfs, path, header, self.map_bytes)?);
        self.lru
            .lock()
            .put((header.group_id, header.base_msg_id), seg.clone());
        Ok(seg)
    }

    /// Drops the cached handle of one segment (before its file is removed).
    pub fn forget(&self, group: u64, base: u64) {
        let dropped = self.lru.lock().pop(&(group, base));
        // Closed and unmapped (if no reader holds it) outside the lock.
        drop(dropped);
    }

    /// Number of cached open segments.
    pub fn len(&self) -> usize {
        self.lru.lock().len()
    }
}
