//! [`FaultyVfs`]: the real file system with counters and switches that make
//! its operations fail (a full disk, a failing fsync, an unreadable page).
//! Test-only: compiled under `cfg(test)` or the `testing` feature, so a
//! release build contains no fault injection.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::ThreadId;

use parking_lot::{Condvar, Mutex};

use super::{OpenMode, OsVfs, Vfs, VfsFile};

/// A [`Vfs`] over the real file system that counts syncs and can be told to
/// fail. Shared state lives in [`FaultControl`], which tests keep a handle to.
#[derive(Clone, Default)]
pub struct FaultyVfs {
    pub control: Arc<FaultControl>,
}

/// Counters and switches of a [`FaultyVfs`].
#[derive(Default)]
pub struct FaultControl {
    /// fdatasync (and write-back) calls on files.
    pub file_syncs: AtomicU64,
    /// fsync calls on directories.
    pub dir_syncs: AtomicU64,
    /// Bytes successfully written.
    pub bytes_written: AtomicU64,
    /// When set, every write fails with ENOSPC (a full disk).
    pub disk_full: AtomicBool,
    /// The disk fills up after this many more successful writes
    /// (`u64::MAX` = never): from then on every write fails with ENOSPC
    /// until the test stores `u64::MAX` again. Picks which write of a
    /// round meets the full disk (journal, first group, second group...).
    pub writes_before_full: AtomicU64,
    /// Writes that failed with ENOSPC.
    pub writes_refused: AtomicU64,
    /// While a fragment is here, every write to a file whose path contains
    /// it fails with ENOSPC: one directory (`groups/`) on a file system of
    /// its own that is full ([`FaultControl::fill_paths_containing`]).
    full_paths: Mutex<Vec<String>>,
    /// When set, every sync fails with EIO.
    pub fail_syncs: AtomicBool,
    /// Syncs that failed because of `fail_syncs`.
    pub syncs_failed: AtomicU64,
    /// Writes fail with EIO once this many more bytes have been written
    /// (`u64::MAX` = never). The failing write writes nothing.
    pub write_budget_bytes: AtomicU64,
    /// While set, file syncs block (so a test can pile work into the next
    /// commit round); `syncs_held` counts the syncs waiting.
    pub hold_syncs: AtomicBool,
    pub syncs_held: AtomicU64,
    /// While set, syncs (of files and directories) whose path contains
    /// this text block until it is cleared: a slow disk for one kind of
    /// file (a checkpoint's run parts), which `syncs_held` counts too.
    pub hold_syncs_of: parking_lot::Mutex<Option<String>>,
    /// When not `u64::MAX`, the free space the file system reports.
    pub free_bytes: AtomicU64,
    /// Files opened (to count how many segments a read touches).
    pub opens: AtomicU64,
    /// When set, every `read_exact_at` fails with EIO (a medium that cannot
    /// return a page). Reads through a mapping do not see it.
    pub fail_reads: AtomicBool,
    /// Operations (every call of the file layer, on files and paths) per
    /// calling thread: what a request did on its own thread.
    ops_by_thread: Mutex<HashMap<ThreadId, u64>>,
    /// While a fragment is here, reading (`read_exact_at`: a verifying
    /// scan), listing or removing a path that contains it waits (a latch: [`FaultControl::release_paths`] opens
    /// it); `ops_held` counts the operations waiting.
    held_paths: Mutex<Vec<String>>,
    held_cv: Condvar,
    pub ops_held: AtomicU64,
    /// While `Some`, the path of every operation (any thread) is appended:
    /// what a step touched, whichever thread did it
    /// ([`FaultControl::log_paths`]).
    path_log: Mutex<Option<Vec<PathBuf>>>,
    /// The path of every file synced (`sync_data`, `write_back`), in order, until
    /// [`FaultControl::take_synced_files`].
    synced_files: Mutex<Vec<PathBuf>>,
}

impl FaultControl {
    pub fn syncs(&self) -> u64 {
        self.file_syncs.load(Ordering::SeqCst) + self.dir_syncs.load(Ordering::SeqCst)
    }

    /// The files synced since the last call, in the order of their syncs.
    pub fn take_synced_files(&self) -> Vec<PathBuf> {
        std::mem::take(&mut *self.synced_files.lock())
    }

    /// How many file syncs [`FaultControl::take_synced_files`] would return.
    pub fn synced_files_len(&self) -> usize {
        self.synced_files.lock().len()
    }

    /// Operations of the file layer made by `thread` so far.
    pub fn ops_on(&self, thread: ThreadId) -> u64 {
        self.ops_by_thread.lock().get(&thread).copied().unwrap_or(0)
    }

    /// From now on, reading (`read_exact_at`), listing or removing a path
    /// that contains `fragment` waits until [`FaultControl::release_paths`].
    pub fn hold_paths_containing(&self, fragment: &str) {
        self.held_paths.lock().push(fragment.to_owned());
    }

    /// From now on, every write to a file whose path contains `fragment`
    /// fails with ENOSPC, until [`FaultControl::free_paths`].
    pub fn fill_paths_containing(&self, fragment: &str) {
        self.full_paths.lock().push(fragment.to_owned());
    }

    /// Space returns: writes to every path go through again.
    pub fn free_paths(&self) {
        self.full_paths.lock().clear();
    }

    /// Lets every held operation go on, and holds nothing more.
    pub fn release_paths(&self) {
        self.held_paths.lock().clear();
        self.held_cv.notify_all();
    }

    /// Starts logging the path of every operation, on any thread (a log
    /// already started is emptied).
    pub fn log_paths(&self) {
        *self.path_log.lock() = Some(Vec::new());
    }

    /// Stops logging paths; returns those logged since [`Self::log_paths`].
    pub fn logged_paths(&self) -> Vec<PathBuf> {
        self.path_log.lock().take().unwrap_or_default()
    }

    fn count_op(&self, path: &Path) {
        *self
            .ops_by_thread
            .lock()
            .entry(std::thread::current().id())
            .or_default() += 1;
        if let Some(log) = self.path_log.lock().as_mut() {
            log.push(path.to_owned());
        }
    }

    /// Counts an operation on `path` and waits while the path is held.
    fn path_op(&self, path: &Path) {
        self.count_op(path);
        let text = path.to_string_lossy();
        let mut held = self.held_paths.lock();
        if !held.iter().any(|f| text.contains(f.as_str())) {
            return;
        }
        self.ops_held.fetch_add(1, Ordering::SeqCst);
        while held.iter().any(|f| text.contains(f.as_str())) {
            self.held_cv.wait(&mut held);
        }
        self.ops_held.fetch_sub(1, Ordering::SeqCst);
    }
}

impl FaultyVfs {
    pub fn new() -> Self {
        let v = FaultyVfs::default();
        v.control
            .write_budget_bytes
            .store(u64::MAX, Ordering::SeqCst);
        v.control.free_bytes.store(u64::MAX, Ordering::SeqCst);
        v.control
            .writes_before_full
            .store(u64::MAX, Ordering::SeqCst);
        v
    }
}

struct FaultyFile {
    inner: Box<dyn VfsFile>,
    control: Arc<FaultControl>,
    path: PathBuf,
}

impl FaultControl {
    /// ENOSPC for a write or a directory made under a path a
    /// [`FaultControl::fill_paths_containing`] fragment names.
    fn check_full_path(&self, path: &Path) -> io::Result<()> {
        let text = path.to_string_lossy();
        if self
            .full_paths
            .lock()
            .iter()
            .any(|f| text.contains(f.as_str()))
        {
            self.writes_refused.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    fn check_write(&self, path: &Path, len: usize) -> io::Result<()> {
        self.check_full_path(path)?;
        let left = self.writes_before_full.load(Ordering::SeqCst);
        if self.disk_full.load(Ordering::SeqCst) || left == 0 {
            self.writes_refused.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        if left != u64::MAX {
            self.writes_before_full.store(left - 1, Ordering::SeqCst);
        }
        let len = len as u64;
        let budget = self.write_budget_bytes.load(Ordering::SeqCst);
        if budget != u64::MAX {
            if budget < len {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
            self.write_budget_bytes
                .store(budget - len, Ordering::SeqCst);
        }
        Ok(())
    }

    fn check_sync(&self, path: &Path) -> io::Result<()> {
        let held = || {
            self.hold_syncs.load(Ordering::SeqCst)
                || self
                    .hold_syncs_of
                    .lock()
                    .as_deref()
                    .is_some_and(|p| path.to_string_lossy().contains(p))
        };
        if held() {
            self.syncs_held.fetch_add(1, Ordering::SeqCst);
            while held() {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            self.syncs_held.fetch_sub(1, Ordering::SeqCst);
        }
        if self.fail_syncs.load(Ordering::SeqCst) {
            self.syncs_failed.fetch_add(1, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }
}

impl VfsFile for FaultyFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.control.count_op(&self.path);
        self.control.check_write(&self.path, buf.len())?;
        self.inner.write_all_at(buf, offset)?;
        self.control
            .bytes_written
            .fetch_add(buf.len() as u64, Ordering::SeqCst);
        Ok(())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.control.path_op(&self.path);
        if self.control.fail_reads.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.control.count_op(&self.path);
        self.control.check_sync(&self.path)?;
        self.control.file_syncs.fetch_add(1, Ordering::SeqCst);
        self.control.synced_files.lock().push(self.path.clone());
        self.inner.sync_data()
    }
    /// Counted and failed like a sync (it reports write-back errors).
    fn write_back(&self) -> io::Result<()> {
        self.control.count_op(&self.path);
        self.control.check_sync(&self.path)?;
        self.control.file_syncs.fetch_add(1, Ordering::SeqCst);
        self.control.synced_files.lock().push(self.path.clone());
        self.inner.write_back()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.control.count_op(&self.path);
        self.inner.set_len(len)
    }
    fn file_len(&self) -> io::Result<u64> {
        self.control.count_op(&self.path);
        self.inner.file_len()
    }
    fn map(&self, len: usize) -> io::Result<memmap2::Mmap> {
        self.control.count_op(&self.path);
        self.inner.map(len)
    }
}

impl Vfs for FaultyVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        self.control.count_op(path);
        self.control.opens.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(FaultyFile {
            inner: OsVfs.open(path, mode)?,
            control: self.control.clone(),
            path: path.to_owned(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.control.count_op(path);
        if self.control.disk_full.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.control.check_full_path(path)?;
        OsVfs.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.control.count_op(path);
        self.control.check_sync(path)?;
        self.control.dir_syncs.fetch_add(1, Ordering::SeqCst);
        OsVfs.sync_dir(path)
    }
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        self.control.count_op(path);
        match self.control.free_bytes.load(Ordering::SeqCst) {
            u64::MAX => OsVfs.free_bytes(path),
            n => Ok(n),
        }
    }
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        self.control.count_op(path);
        self.control.check_sync(path)?;
        self.control.file_syncs.fetch_add(1, Ordering::SeqCst);
        OsVfs.sync_filesystem(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.control.count_op(from);
        OsVfs.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.control.path_op(path);
        OsVfs.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        self.control.path_op(path);
        OsVfs.remove_dir_all(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.control.path_op(path);
        OsVfs.read_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.control.count_op(path);
        OsVfs.exists(path)
    }
}
