//! A file layer that can simulate a power cut: it remembers, per file, the
//! bytes that were made durable (by `sync_data`, a directory sync for
//! creations, renames and removals, or `sync_filesystem`), and `cut()`
//! puts the directory back to exactly that state, dropping everything that
//! was only in the page cache.
//!
//! The model is the strict reading of POSIX that the storage spec assumes:
//! data is durable after fdatasync of its file; a new, renamed or removed
//! directory entry after fsync of its directory. It keeps whole durable
//! images in memory, so it is for tests with small data only.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::io::{OpenMode, OsVfs, Vfs, VfsFile};

/// What is durable of one path.
#[derive(Clone, Debug, Default)]
struct Durable {
    /// The directory entry exists durably.
    entry: bool,
    /// The file's durable data (as of its last sync).
    data: Vec<u8>,
    /// A rename or removal not yet made durable by a directory sync: what
    /// the path will hold once it is (`None`: nothing).
    pending_entry: Option<Option<Vec<u8>>>,
}

#[derive(Default)]
struct State {
    /// Paths touched since they were last wholly durable, with their
    /// durable state. Untouched paths are durable as they are.
    durable: HashMap<PathBuf, Durable>,
}

/// Shared switches and state of a [`PowerCutVfs`].
#[derive(Default)]
pub struct PowerControl {
    state: Mutex<State>,
    /// After `freeze`, syncs no longer make anything durable: the power is
    /// already off, the process just does not know yet.
    frozen: AtomicBool,
}

impl PowerControl {
    /// The moment of the power cut: nothing synced from now on counts.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Puts every touched path back to its durable state. Call after the
    /// engine using the layer is stopped.
    pub fn cut(&self) -> io::Result<()> {
        let state = std::mem::take(&mut *self.state.lock());
        for (path, d) in state.durable {
            if d.entry {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(&path, &d.data)?;
            } else {
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    fn frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Remembers the durable state of `path` before its first change.
    fn touch(&self, path: &Path) {
        let mut st = self.state.lock();
        st.durable
            .entry(path.to_owned())
            .or_insert_with(|| match std::fs::read(path) {
                Ok(data) => Durable {
                    entry: true,
                    data,
                    pending_entry: None,
                },
                Err(_) => Durable::default(),
            });
    }

    /// `path`'s current data becomes durable (fdatasync of the file).
    fn sync_file(&self, path: &Path) {
        if self.frozen() {
            return;
        }
        if let Some(d) = self.state.lock().durable.get_mut(path) {
            d.data = std::fs::read(path).unwrap_or_default();
        }
    }

    /// The entries of `dir` become durable: creations, renames, removals.
    fn sync_dir(&self, dir: &Path) {
        if self.frozen() {
            return;
        }
        let mut st = self.state.lock();
        for (path, d) in st
            .durable
            .iter_mut()
            .filter(|(p, _)| p.parent() == Some(dir))
        {
            match d.pending_entry.take() {
                Some(Some(data)) => {
                    d.entry = true;
                    d.data = data;
                }
                Some(None) => d.entry = false,
                None => d.entry = path.exists(),
            }
        }
    }

    fn rename(&self, from: &Path, to: &Path) {
        self.touch(from);
        self.touch(to);
        let mut st = self.state.lock();
        // The inode travels with its durable data; both entries change once
        // the directory is synced.
        let moved = st
            .durable
            .get(from)
            .map(|d| d.data.clone())
            .unwrap_or_default();
        if let Some(d) = st.durable.get_mut(from) {
            d.pending_entry = Some(None);
        }
        if let Some(d) = st.durable.get_mut(to) {
            d.pending_entry = Some(Some(moved));
        }
    }

    fn remove(&self, path: &Path) {
        self.touch(path);
        if let Some(d) = self.state.lock().durable.get_mut(path) {
            d.pending_entry = Some(None);
        }
    }

    fn sync_everything(&self) {
        if self.frozen() {
            return;
        }
        self.state.lock().durable.clear();
    }
}

/// A [`Vfs`] over the real file system that can simulate a power cut.
#[derive(Clone, Default)]
pub struct PowerCutVfs {
    pub control: Arc<PowerControl>,
}

struct PowerCutFile {
    inner: Box<dyn VfsFile>,
    path: PathBuf,
    control: Arc<PowerControl>,
}

impl VfsFile for PowerCutFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.control.touch(&self.path);
        self.inner.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()?;
        self.control.sync_file(&self.path);
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.control.touch(&self.path);
        self.inner.set_len(len)
    }
    fn file_len(&self) -> io::Result<u64> {
        self.inner.file_len()
    }
    fn map(&self, len: usize) -> io::Result<memmap2::Mmap> {
        self.inner.map(len)
    }
}

impl Vfs for PowerCutVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        if mode != OpenMode::Read {
            self.control.touch(path);
        }
        let inner = OsVfs.open(path, mode)?;
        Ok(Box::new(PowerCutFile {
            inner,
            path: path.to_owned(),
            control: self.control.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        // Directories are modelled as durable once created (the engine
        // syncs the parents of new group directories at checkpoints).
        OsVfs.create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        OsVfs.sync_dir(path)?;
        self.control.sync_dir(path);
        Ok(())
    }
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        OsVfs.sync_filesystem(path)?;
        self.control.sync_everything();
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.control.rename(from, to);
        OsVfs.rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.control.remove(path);
        OsVfs.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        OsVfs.remove_dir_all(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        OsVfs.read_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        OsVfs.exists(path)
    }
}
