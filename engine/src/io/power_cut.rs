//! A file layer that can simulate a power cut, as unkindly as the media
//! assumptions of format-spec/storage.md (section 1) allow.
//!
//! It keeps a model of the directory tree under one root: per file (inode)
//! the bytes the process wrote and the bytes made durable by its last
//! `sync_data`; per directory entry what the process sees and what is on
//! the media. `cut()` then rewrites the root from the model:
//!
//! - **Directory entries** (creation, removal and rename of files and
//!   directories) are durable only once their parent directory was
//!   fsynced after the change (or `sync_filesystem` ran). A change not yet
//!   durable persists or not: all such changes are dropped
//!   ([`Cut::DropUnsynced`]), or a seeded choice keeps none, all, or each
//!   with probability one half ([`Cut::Seeded`]). A rename is one change
//!   (the new name appears exactly when the old one goes), as rename(2) is
//!   atomic. A file or directory whose entry did not persist is gone with
//!   everything under it, synced or not.
//! - **Data** written since the file's last sync persists as a seeded
//!   subset of 4 KiB pages: per file none, all, or each page independently
//!   as the old page, the new page, or torn (the new bytes up to, or from,
//!   a random byte of the page, the old bytes in the rest). An unsynced
//!   length change persists or not; an extension that persisted with pages
//!   that did not reads as zeros. Bytes that were durable and were not
//!   written again are never changed.
//!
//! After [`PowerControl::freeze`] nothing the process does counts: syncs
//! make nothing durable and later writes never reached the media.
//!
//! Files and directories that existed under the root before the layer
//! first saw them (or that were made beside it, like the engine's `LOCK`
//! file) are taken as durable as they are. The model keeps whole file
//! images in memory, so it is for tests with small data only. Writes
//! through a handle to a file that was removed since are still modelled,
//! by inode, like the real file system does.
//!
//! Test-only: compiled under `cfg(test)` or the `testing` feature.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::io::{OpenMode, OsVfs, Vfs, VfsFile};

/// The unit in which unsynced data persists or not.
pub const PAGE_BYTES: usize = 4096;

/// How a power cut treats what was not synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// Nothing unsynced persists: no byte, no directory entry change.
    DropUnsynced,
    /// A subset chosen by this seed persists (see the module docs). The
    /// same seed over the same sequence of operations makes the same cut.
    Seeded(u64),
}

type Ino = u64;
const ROOT: Ino = 0;

/// One directory entry change: `(directory, name, new target or removed)`.
type Change = (Ino, OsString, Option<Ino>);

enum Node {
    Dir,
    File {
        /// What the process wrote (as of the freeze).
        current: Vec<u8>,
        /// What its last `sync_data` made durable.
        durable: Vec<u8>,
    },
}

#[derive(Default)]
struct Model {
    next_ino: Ino,
    nodes: BTreeMap<Ino, Node>,
    /// Directory entries as the process sees them.
    current: BTreeMap<(Ino, OsString), Ino>,
    /// Directory entries as they are on the media.
    durable: BTreeMap<(Ino, OsString), Ino>,
    /// Entry changes no directory sync has made durable yet, oldest first;
    /// each element is one atomic unit (a rename is two changes).
    pending: Vec<Vec<Change>>,
}

/// Shared switches and state of a [`PowerCutVfs`].
pub struct PowerControl {
    root: PathBuf,
    model: Mutex<Model>,
    /// After `freeze`, nothing reaches the media: the power is already off,
    /// the process just does not know yet.
    frozen: AtomicBool,
    /// Operations that change files or directories so far (writes, length
    /// changes, syncs, creations, renames, removals).
    ops: AtomicU64,
    /// The power goes before operation number `freeze_at` (`u64::MAX`: not
    /// by count).
    freeze_at: AtomicU64,
}

/// A [`Vfs`] over the real file system under `root` that can simulate a
/// power cut.
#[derive(Clone)]
pub struct PowerCutVfs {
    pub control: Arc<PowerControl>,
}

impl PowerCutVfs {
    /// A layer over the existing directory `root`; every path the engine
    /// uses must lie under it (the data directory may be `root` itself).
    pub fn new(root: &Path) -> PowerCutVfs {
        PowerCutVfs {
            control: Arc::new(PowerControl {
                root: root.to_owned(),
                model: Mutex::new(Model::default()),
                frozen: AtomicBool::new(false),
                ops: AtomicU64::new(0),
                freeze_at: AtomicU64::new(u64::MAX),
            }),
        }
    }
}

/// splitmix64: a small seeded generator, so the layer needs no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`; the bias is irrelevant here).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

impl Model {
    fn new_node(&mut self, node: Node) -> Ino {
        self.next_ino += 1;
        self.nodes.insert(self.next_ino, node);
        self.next_ino
    }

    fn children(map: &BTreeMap<(Ino, OsString), Ino>, dir: Ino) -> Vec<(OsString, Ino)> {
        map.range((dir, OsString::new())..)
            .take_while(|((d, _), _)| *d == dir)
            .map(|((_, name), &ino)| (name.clone(), ino))
            .collect()
    }

    /// Adopts `real`, an entry that exists on disk but not in the model, as
    /// durable as it is (it was there before the layer saw it).
    fn import(&mut self, dir: Ino, name: OsString, real: &Path) -> io::Result<Ino> {
        let node = if std::fs::symlink_metadata(real)?.is_dir() {
            Node::Dir
        } else {
            let data = std::fs::read(real)?;
            Node::File {
                current: data.clone(),
                durable: data,
            }
        };
        let ino = self.new_node(node);
        self.current.insert((dir, name.clone()), ino);
        self.durable.insert((dir, name), ino);
        Ok(ino)
    }

    /// Records a change of the entry `(dir, name)` as the process sees it,
    /// durable once `dir` is synced.
    fn change(&mut self, frozen: bool, changes: Vec<Change>) {
        for (dir, name, target) in &changes {
            match target {
                Some(ino) => self.current.insert((*dir, name.clone()), *ino),
                None => self.current.remove(&(*dir, name.clone())),
            };
        }
        if !frozen {
            self.pending.push(changes);
        }
    }

    fn apply_durably(&mut self, changes: &[Change]) {
        for (dir, name, target) in changes {
            match target {
                Some(ino) => self.durable.insert((*dir, name.clone()), *ino),
                None => self.durable.remove(&(*dir, name.clone())),
            };
        }
    }
}

impl PowerControl {
    /// The moment of the power cut: nothing synced or written from now on
    /// counts.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// Cuts the power just before the `n`th operation from now that
    /// changes files or directories: a cut at an exact step of a
    /// single-threaded sequence (recovery, a checkpoint).
    pub fn freeze_after(&self, n: u64) {
        let now = self.ops.load(Ordering::SeqCst);
        self.freeze_at
            .store(now.saturating_add(n), Ordering::SeqCst);
    }

    /// The system wrote `path` back on its own before the cut, as the
    /// kernel's write-back may do to any file at any time, before or
    /// after other files: its bytes as the process wrote them, and every
    /// change of the entries on the way to it (its own and its parent
    /// directories'), are durable from now on. Other files and entries
    /// are untouched. A test that needs one file kept while the rest of
    /// what was not synced goes (a segment kept, the journal's tail lost)
    /// calls this, then `cut(Cut::DropUnsynced)`.
    pub fn write_back(&self, path: &Path) -> io::Result<()> {
        let names = self.names_under_root(path);
        let mut m = self.model.lock();
        let ino = self
            .resolve(&mut m, &names)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        if let Some(Node::File { current, durable }) = m.nodes.get_mut(&ino) {
            durable.clone_from(current);
        }
        let mut entries = Vec::new();
        let mut dir = ROOT;
        for name in names {
            let child = m.current[&(dir, name.clone())];
            entries.push((dir, name));
            dir = child;
        }
        let (now, later): (Vec<_>, Vec<_>) =
            std::mem::take(&mut m.pending)
                .into_iter()
                .partition(|unit| {
                    unit.iter()
                        .any(|(d, n, _)| entries.iter().any(|(ed, en)| ed == d && en == n))
                });
        for unit in &now {
            m.apply_durably(unit);
        }
        m.pending = later;
        Ok(())
    }

    /// Operations that changed files or directories so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// True once the power is off. An operation that returned while this
    /// was false had all its syncs done before the cut.
    pub fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Counts one changing operation, cutting the power first if it is the
    /// one [`Self::freeze_after`] named; returns whether the power is off.
    fn tick(&self) -> bool {
        let n = self.ops.fetch_add(1, Ordering::SeqCst) + 1;
        if n >= self.freeze_at.load(Ordering::SeqCst) {
            self.freeze();
        }
        self.is_frozen()
    }

    /// The names from the root to `path`; `None` for a path outside it.
    fn names(&self, path: &Path) -> Option<Vec<OsString>> {
        let rel = path.strip_prefix(&self.root).ok()?;
        rel.components()
            .map(|c| match c {
                Component::Normal(n) => Some(n.to_owned()),
                _ => None,
            })
            .collect()
    }

    fn names_under_root(&self, path: &Path) -> Vec<OsString> {
        // A test that points the engine outside the layer's root tests nothing.
        self.names(path).unwrap_or_else(|| {
            panic!(
                "PowerCutVfs: {} is outside its root {}",
                path.display(),
                self.root.display()
            )
        })
    }

    /// The inode `path` names now, adopting entries that exist on disk but
    /// are not modelled yet. `None` if it does not exist.
    fn resolve(&self, m: &mut Model, names: &[OsString]) -> io::Result<Option<Ino>> {
        let mut ino = ROOT;
        let mut real = self.root.clone();
        for name in names {
            real.push(name);
            ino = match m.current.get(&(ino, name.clone())) {
                Some(&child) => child,
                None if real.symlink_metadata().is_ok() => m.import(ino, name.clone(), &real)?,
                None => return Ok(None),
            };
        }
        Ok(Some(ino))
    }

    /// The parent directory's inode and the last name of `path`.
    fn parent_of(&self, m: &mut Model, path: &Path) -> io::Result<(Ino, OsString)> {
        let names = self.names_under_root(path);
        let Some((name, dir)) = names.split_last() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "PowerCutVfs: the root itself",
            ));
        };
        let dir = self
            .resolve(m, dir)?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        Ok((dir, name.clone()))
    }

    /// Adopts everything on disk under `path` that the model does not know.
    fn import_tree(&self, m: &mut Model, path: &Path) -> io::Result<()> {
        let Some(names) = self.names(path) else {
            return Ok(());
        };
        if self.resolve(m, &names)?.is_none() {
            return Ok(());
        }
        if path.symlink_metadata()?.is_dir() {
            for e in std::fs::read_dir(path)? {
                self.import_tree(m, &e?.path())?;
            }
        }
        Ok(())
    }

    /// Cuts the power: puts the tree under the root back to what the media
    /// held (see the module docs for what persists). Call after the engine
    /// using the layer is stopped. The layer is usable again afterwards,
    /// taking what is on disk as durable.
    pub fn cut(&self, how: Cut) -> io::Result<()> {
        let mut m = std::mem::take(&mut *self.model.lock());
        // What the process made beside the layer counts as durable as it is.
        for e in std::fs::read_dir(&self.root)? {
            self.import_tree(&mut m, &e?.path())?;
        }
        let mut rng = Rng(match how {
            Cut::DropUnsynced => 0,
            Cut::Seeded(seed) => seed,
        });
        // Which unsynced entry changes persist: none, all, or each by a coin.
        let entry_mode = match how {
            Cut::DropUnsynced => 0,
            Cut::Seeded(_) => rng.below(3),
        };
        for changes in std::mem::take(&mut m.pending) {
            let keep = match entry_mode {
                0 => false,
                1 => true,
                _ => rng.below(2) == 0,
            };
            if keep {
                m.apply_durably(&changes);
            }
        }
        for e in std::fs::read_dir(&self.root)? {
            let p = e?.path();
            if p.symlink_metadata()?.is_dir() {
                std::fs::remove_dir_all(&p)?;
            } else {
                std::fs::remove_file(&p)?;
            }
        }
        let mut stack = vec![(ROOT, self.root.clone())];
        while let Some((dir, path)) = stack.pop() {
            for (name, ino) in Model::children(&m.durable, dir) {
                let p = path.join(&name);
                match m.nodes.get(&ino) {
                    Some(Node::Dir) => {
                        std::fs::create_dir(&p)?;
                        stack.push((ino, p));
                    }
                    Some(Node::File { current, durable }) => {
                        let bytes = match how {
                            Cut::DropUnsynced => durable.clone(),
                            Cut::Seeded(_) => persisted(durable, current, &mut rng),
                        };
                        std::fs::write(&p, bytes)?;
                    }
                    None => {}
                }
            }
        }
        self.frozen.store(false, Ordering::SeqCst);
        self.freeze_at.store(u64::MAX, Ordering::SeqCst);
        Ok(())
    }

    fn write(&self, ino: Ino, offset: u64, buf: &[u8]) {
        if self.tick() {
            return;
        }
        if let Some(Node::File { current, .. }) = self.model.lock().nodes.get_mut(&ino) {
            // Invariant: test files are small; offsets fit usize.
            let at = usize::try_from(offset).expect("invariant: small test files");
            if current.len() < at + buf.len() {
                current.resize(at + buf.len(), 0);
            }
            current[at..at + buf.len()].copy_from_slice(buf);
        }
    }

    fn set_len(&self, ino: Ino, len: u64) {
        if self.tick() {
            return;
        }
        if let Some(Node::File { current, .. }) = self.model.lock().nodes.get_mut(&ino) {
            current.resize(
                usize::try_from(len).expect("invariant: small test files"),
                0,
            );
        }
    }

    fn sync_file(&self, ino: Ino) {
        if self.tick() {
            return;
        }
        if let Some(Node::File { current, durable }) = self.model.lock().nodes.get_mut(&ino) {
            durable.clone_from(current);
        }
    }
}

/// What of a file persists at a cut: `durable`, with a seeded subset of
/// the pages where `current` differs from it.
fn persisted(durable: &[u8], current: &[u8], rng: &mut Rng) -> Vec<u8> {
    if durable == current {
        return durable.to_vec();
    }
    let len = match (durable.len() == current.len(), rng.below(2)) {
        (true, _) | (false, 0) => current.len(),
        (false, _) => durable.len(),
    };
    // 0: no unsynced page persists; 1: all do; otherwise page by page.
    let file_mode = rng.below(4);
    let mut out = vec![0u8; len];
    let n = durable.len().min(len);
    out[..n].copy_from_slice(&durable[..n]);
    let new = |i: usize| current.get(i).copied().unwrap_or(0);
    for page in (0..len).step_by(PAGE_BYTES) {
        let end = (page + PAGE_BYTES).min(len);
        if (page..end).all(|i| out[i] == new(i)) {
            continue;
        }
        let (from, to) = match (file_mode, rng.below(4)) {
            (0, _) | (2.., 0) => continue,
            (1, _) | (2.., 1 | 2) => (page, end),
            _ => {
                // Torn at any byte: the new bytes before it, or after it.
                let at = page + 1 + rng.below((end - page) as u64) as usize;
                let at = at.min(end);
                if rng.below(2) == 0 {
                    (page, at)
                } else {
                    (at - 1, end)
                }
            }
        };
        for (i, b) in out.iter_mut().enumerate().take(to).skip(from) {
            *b = new(i);
        }
    }
    out
}

struct PowerCutFile {
    inner: Box<dyn VfsFile>,
    ino: Ino,
    control: Arc<PowerControl>,
}

impl VfsFile for PowerCutFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)?;
        self.control.write(self.ino, offset, buf);
        Ok(())
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.inner.sync_data()?;
        self.control.sync_file(self.ino);
        Ok(())
    }
    /// Written back to the device, durable only once synced: the model
    /// keeps every byte since the last sync at risk.
    fn write_back(&self) -> io::Result<()> {
        self.inner.write_back()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)?;
        self.control.set_len(self.ino, len);
        Ok(())
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
        if mode == OpenMode::Read {
            // Reads change nothing on the media.
            return OsVfs.open(path, mode);
        }
        let c = &self.control;
        let mut m = c.model.lock();
        let names = c.names_under_root(path);
        let existing = c.resolve(&mut m, &names)?;
        let inner = OsVfs.open(path, mode)?;
        let ino = match existing {
            Some(ino) => ino,
            None => {
                let (dir, name) = c.parent_of(&mut m, path)?;
                let ino = m.new_node(Node::File {
                    current: Vec::new(),
                    durable: Vec::new(),
                });
                m.change(c.tick(), vec![(dir, name, Some(ino))]);
                ino
            }
        };
        Ok(Box::new(PowerCutFile {
            inner,
            ino,
            control: c.clone(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let c = &self.control;
        let mut m = c.model.lock();
        let names = c.names_under_root(path);
        let mut dir = ROOT;
        let mut real = c.root.clone();
        for (i, name) in names.iter().enumerate() {
            real.push(name);
            dir = match c.resolve(&mut m, &names[..=i])? {
                Some(ino) => ino,
                None => {
                    std::fs::create_dir(&real)?;
                    let ino = m.new_node(Node::Dir);
                    m.change(c.tick(), vec![(dir, name.clone(), Some(ino))]);
                    ino
                }
            };
        }
        Ok(())
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        OsVfs.sync_dir(path)?;
        let c = &self.control;
        let Some(names) = c.names(path) else {
            return Ok(()); // above the root: nothing modelled changes there
        };
        if c.tick() {
            return Ok(());
        }
        let mut m = c.model.lock();
        let Some(dir) = c.resolve(&mut m, &names)? else {
            return Ok(());
        };
        let mut pending = std::mem::take(&mut m.pending);
        for changes in &mut pending {
            let (now, later): (Vec<Change>, Vec<Change>) =
                changes.drain(..).partition(|(d, _, _)| *d == dir);
            m.apply_durably(&now);
            *changes = later;
        }
        pending.retain(|c| !c.is_empty());
        m.pending = pending;
        Ok(())
    }
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        OsVfs.sync_filesystem(path)?;
        let c = &self.control;
        if c.tick() {
            return Ok(());
        }
        let mut m = c.model.lock();
        m.durable = m.current.clone();
        m.pending.clear();
        for node in m.nodes.values_mut() {
            if let Node::File { current, durable } = node {
                durable.clone_from(current);
            }
        }
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let c = &self.control;
        let mut m = c.model.lock();
        let ino = c
            .resolve(&mut m, &c.names_under_root(from))?
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        // Adopt what `to` names now, so an unsynced rename over it keeps it.
        c.resolve(&mut m, &c.names_under_root(to))?;
        let (from_dir, from_name) = c.parent_of(&mut m, from)?;
        let (to_dir, to_name) = c.parent_of(&mut m, to)?;
        OsVfs.rename(from, to)?;
        m.change(
            c.tick(),
            vec![(from_dir, from_name, None), (to_dir, to_name, Some(ino))],
        );
        Ok(())
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let c = &self.control;
        let mut m = c.model.lock();
        c.resolve(&mut m, &c.names_under_root(path))?;
        let (dir, name) = c.parent_of(&mut m, path)?;
        OsVfs.remove_file(path)?;
        m.change(c.tick(), vec![(dir, name, None)]);
        Ok(())
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let c = &self.control;
        let mut m = c.model.lock();
        c.import_tree(&mut m, path)?;
        let (dir, name) = c.parent_of(&mut m, path)?;
        let Some(&top) = m.current.get(&(dir, name.clone())) else {
            return Err(io::ErrorKind::NotFound.into());
        };
        OsVfs.remove_dir_all(path)?;
        // One removal per entry, children first, as remove_dir_all does;
        // each becomes durable with a sync of its own directory.
        let mut removals = Vec::new();
        let mut stack = vec![top];
        while let Some(d) = stack.pop() {
            for (child_name, child) in Model::children(&m.current, d) {
                removals.push((d, child_name, None));
                stack.push(child);
            }
        }
        let frozen = c.tick();
        for r in removals.into_iter().rev() {
            m.change(frozen, vec![r]);
        }
        m.change(frozen, vec![(dir, name, None)]);
        Ok(())
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        OsVfs.read_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        OsVfs.exists(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_file(vfs: &PowerCutVfs, path: &Path, bytes: &[u8], sync: bool) {
        let f = vfs.open(path, OpenMode::ReadWriteCreate).unwrap();
        let len = f.file_len().unwrap();
        f.write_all_at(bytes, len).unwrap();
        if sync {
            f.sync_data().unwrap();
        }
    }

    #[test]
    fn entries_persist_only_when_their_directory_was_synced() {
        let root = tempfile::tempdir().unwrap();
        let vfs = PowerCutVfs::new(root.path());
        let (a, b) = (root.path().join("a"), root.path().join("a/b"));
        vfs.create_dir_all(&b).unwrap();
        write_file(&vfs, &b.join("synced"), b"x", true);
        vfs.sync_dir(&b).unwrap();
        vfs.sync_dir(&a).unwrap();
        // `a` itself was never synced in the root: everything goes.
        vfs.control.cut(Cut::DropUnsynced).unwrap();
        assert!(!a.exists());

        vfs.create_dir_all(&b).unwrap();
        write_file(&vfs, &b.join("synced"), b"x", true);
        vfs.sync_dir(root.path()).unwrap();
        vfs.sync_dir(&a).unwrap();
        vfs.sync_dir(&b).unwrap();
        // Created (and its data synced) after its directory's last sync.
        write_file(&vfs, &b.join("late"), b"z", true);
        vfs.control.cut(Cut::DropUnsynced).unwrap();
        assert_eq!(std::fs::read(b.join("synced")).unwrap(), b"x");
        assert!(!b.join("late").exists());
    }

    #[test]
    fn removals_and_renames_need_a_directory_sync_too() {
        let root = tempfile::tempdir().unwrap();
        let vfs = PowerCutVfs::new(root.path());
        let p = |n: &str| root.path().join(n);
        write_file(&vfs, &p("old"), b"old", true);
        write_file(&vfs, &p("gone"), b"gone", true);
        vfs.sync_dir(root.path()).unwrap();
        write_file(&vfs, &p("tmp"), b"new", true);
        vfs.rename(&p("tmp"), &p("old")).unwrap();
        vfs.remove_file(&p("gone")).unwrap();
        vfs.create_dir_all(&p("d/e")).unwrap();
        vfs.sync_dir(root.path()).unwrap();
        vfs.remove_dir_all(&p("d")).unwrap();
        assert_eq!(std::fs::read(p("old")).unwrap(), b"new");
        vfs.control.cut(Cut::DropUnsynced).unwrap();
        // The rename and removal were synced; the directory removal was not
        // (and `e` inside `d` never was created durably).
        assert_eq!(std::fs::read(p("old")).unwrap(), b"new");
        assert!(!p("tmp").exists() && !p("gone").exists());
        assert!(p("d").is_dir() && !p("d/e").exists());

        vfs.rename(&p("old"), &p("renamed")).unwrap();
        vfs.control.cut(Cut::DropUnsynced).unwrap();
        assert_eq!(std::fs::read(p("old")).unwrap(), b"new");
        assert!(!p("renamed").exists());
    }

    #[test]
    fn unsynced_pages_persist_as_a_seeded_subset_and_synced_bytes_stay() {
        let synced: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let mut outcomes = std::collections::HashSet::new();
        let mut torn = false;
        for seed in 0..200 {
            let root = tempfile::tempdir().unwrap();
            let vfs = PowerCutVfs::new(root.path());
            let p = root.path().join("f");
            write_file(&vfs, &p, &synced, true);
            vfs.sync_dir(root.path()).unwrap();
            write_file(&vfs, &p, &[0xAB; 3 * PAGE_BYTES], false);
            vfs.control.cut(Cut::Seeded(seed)).unwrap();
            let got = std::fs::read(&p).unwrap();
            assert!(got.len() == synced.len() || got.len() == synced.len() + 3 * PAGE_BYTES);
            assert_eq!(&got[..synced.len()], &synced[..], "seed {seed}");
            // Each unsynced page: old (zeros), new (0xAB), or a mixture.
            let pages: Vec<u8> = got[synced.len()..]
                .chunks(PAGE_BYTES)
                .map(
                    |c| match (c.iter().all(|&b| b == 0), c.iter().all(|&b| b == 0xAB)) {
                        (true, _) => 0,
                        (_, true) => 1,
                        _ => 2,
                    },
                )
                .collect();
            torn |= pages.contains(&2);
            outcomes.insert(pages);
            // The same seed cuts the same way.
            let again = tempfile::tempdir().unwrap();
            let vfs = PowerCutVfs::new(again.path());
            let q = again.path().join("f");
            write_file(&vfs, &q, &synced, true);
            vfs.sync_dir(again.path()).unwrap();
            write_file(&vfs, &q, &[0xAB; 3 * PAGE_BYTES], false);
            vfs.control.cut(Cut::Seeded(seed)).unwrap();
            assert_eq!(std::fs::read(&q).unwrap(), got, "seed {seed} reproduces");
        }
        assert!(torn, "some page was torn");
        assert!(outcomes.len() > 10, "many different subsets: {outcomes:?}");
    }
}
