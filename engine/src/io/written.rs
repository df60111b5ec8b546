//! Which files the engine wrote since the flusher's last pass
//! (`commit/flusher.rs`). The engine's file layer is wrapped in
//! [`TrackWrites`] at open: every file opened for writing notes its path in
//! [`WrittenFiles`] on its first write of each pass, and the flusher takes
//! the set and writes back exactly those files, so the cost of its pass follows
//! the node's own dirty files, not every dirty page of the file system
//! (a `syncfs` also wrote back other processes' pages: up to 2.7 s under
//! a neighbour's build, BENCHMARKS.md).
//!
//! Paths, not open files, are kept: the set holds no descriptor (the open
//! file budget stays the engine's) and keeps no deleted file's space. A
//! path gone by the pass (the file deleted, or renamed away) is skipped:
//! the flusher makes nothing durable that anything counts on, and the
//! only files the engine renames are synced by their writer before the
//! rename (an erased segment copy, `FORMAT`) or served no more (a deleted
//! group's directory moved to the trash).
//!
//! Cost on the write path: one atomic load per write; a lock and a set
//! insertion once per file per pass.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{OpenMode, Vfs, VfsFile};
use crate::sleep_lock::SleepMutex;

/// The paths written since the last [`WrittenFiles::take`].
#[derive(Default)]
pub(crate) struct WrittenFiles {
    /// The pass files note themselves in; `take` starts the next one. A
    /// file whose last noted pass is this one is in `paths` already.
    pass: AtomicU64,
    paths: SleepMutex<HashSet<PathBuf>>,
}

impl WrittenFiles {
    /// The files written since the last call (in no particular order), and
    /// starts a new pass: a write that ends after this returns notes its
    /// file again.
    pub fn take(&self) -> Vec<PathBuf> {
        let mut paths = self.paths.lock();
        // Under the lock: a writer that saw the old pass inserts before
        // this (its path is taken now) or after it (it reads the new pass
        // under the lock and notes it for the next one).
        self.pass.fetch_add(1, Ordering::SeqCst);
        std::mem::take(&mut *paths).into_iter().collect()
    }

    /// Called after every successful write to `file`.
    fn note(&self, file: &TrackedFile) {
        if file.noted_pass.load(Ordering::SeqCst) == self.pass.load(Ordering::SeqCst) {
            return;
        }
        let mut paths = self.paths.lock();
        paths.insert(file.path.clone());
        file.noted_pass
            .store(self.pass.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// A [`Vfs`] that notes in [`WrittenFiles`] every file written through it.
pub(crate) struct TrackWrites {
    inner: Arc<dyn Vfs>,
    written: Arc<WrittenFiles>,
}

impl TrackWrites {
    pub fn new(inner: Arc<dyn Vfs>, written: Arc<WrittenFiles>) -> TrackWrites {
        TrackWrites { inner, written }
    }
}

struct TrackedFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    written: Arc<WrittenFiles>,
    /// The pass this file last noted itself in (`u64::MAX`: none yet).
    noted_pass: AtomicU64,
}

impl VfsFile for TrackedFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        // Noted even after a failed write: part of it may be in the page
        // cache, and a sync of it reports what went wrong.
        let result = self.inner.write_all_at(buf, offset);
        self.written.note(self);
        result
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()
    }
    fn write_back(&self) -> io::Result<()> {
        self.inner.write_back()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        // A length change is metadata a sync writes, like data.
        let result = self.inner.set_len(len);
        self.written.note(self);
        result
    }
    fn file_len(&self) -> io::Result<u64> {
        self.inner.file_len()
    }
    fn map(&self, len: usize) -> io::Result<memmap2::Mmap> {
        self.inner.map(len)
    }
}

impl Vfs for TrackWrites {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let inner = self.inner.open(path, mode)?;
        if mode == OpenMode::Read {
            return Ok(inner);
        }
        Ok(Box::new(TrackedFile {
            inner,
            path: path.to_owned(),
            written: self.written.clone(),
            noted_pass: AtomicU64::new(u64::MAX),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }
    fn create_dir_all_durable(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all_durable(path)
    }
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_filesystem(path)
    }
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        self.inner.free_bytes(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_dir_all(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.read_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;

    fn sorted(mut v: Vec<PathBuf>) -> Vec<PathBuf> {
        v.sort();
        v
    }

    #[test]
    fn each_pass_takes_the_files_written_in_it_once() {
        let dir = tempfile::tempdir().unwrap();
        let written = Arc::new(WrittenFiles::default());
        let vfs = TrackWrites::new(Arc::new(OsVfs), written.clone());
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        let fa = vfs.open(&a, OpenMode::ReadWriteCreate).unwrap();
        let fb = vfs.open(&b, OpenMode::ReadWriteCreate).unwrap();
        // Opened for reading only: never noted.
        std::fs::write(&c, b"c").unwrap();
        let fc = vfs.open(&c, OpenMode::Read).unwrap();
        let mut one = [0u8; 1];
        fc.read_exact_at(&mut one, 0).unwrap();
        fa.write_all_at(b"1", 0).unwrap();
        fa.write_all_at(b"2", 1).unwrap();
        fb.set_len(10).unwrap();
        assert_eq!(sorted(written.take()), vec![a.clone(), b.clone()]);
        assert!(written.take().is_empty(), "nothing written since");
        // A file written in an earlier pass is noted again in the next.
        fa.write_all_at(b"3", 2).unwrap();
        drop(fa); // closed before the pass: still taken
        assert_eq!(written.take(), vec![a]);
    }
}
