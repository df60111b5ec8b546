//! The trash: where the directory of a deleted group (or a stale directory
//! found where a new group's files go) is moved, with one rename, before
//! the maintenance worker removes it one file per step. So deleting a
//! group of any size costs the commit thread one rename outside every
//! lock, and no request waits for its files to go (format-spec/storage.md
//! section 2, "Trash").
//!
//! Representation: `groups/trash/<group id, 16 hex>-<suffix, 16 hex>`. The
//! suffix only makes names unique: it starts at the time the engine opened
//! (nanoseconds), so names of different runs do not meet, and grows by one
//! per rename; a rename that still meets a taken name tries the next one.
//! A name in the trash never parses as a group directory (it has a `-`),
//! so a directory scan of `groups/` never takes it for a group.
//!
//! Crash cases: everything in the trash is garbage, whatever state it is
//! in, so the sweep queued at every open removes it all. A rename that was
//! not yet durable may leave the directory at its old path after a power
//! cut: the DeleteGroup entry, if replayed, moves it again; otherwise it
//! stays a stray directory of a group that does not exist, moved to the
//! trash when a group of that id is created again (as 0.1 removed it then).
//!
//! A deletion the journal may still lose does not touch the disk: under
//! `fsync never` or `interval` a DeleteGroup is applied before its frame is
//! durable, and a power cut may keep any subset of the directory changes
//! made since (the move, each file's removal), so a deletion the cut takes
//! back would find its group's files gone. Such a directory waits at its
//! path ([`Trash::put_when_durable`]) until the commit thread knows the
//! journal durable through the deletion ([`Trash::move_awaiting`]): after
//! a sync, or before a round that makes files for the same id. A crash
//! meanwhile leaves it at its path: replayed, the deletion moves it;
//! otherwise the stray sweep at the next open does.
//!
//! Cost: one rename per deleted group on the commit thread; one unlink per
//! file and one rmdir per directory on the worker; a deletion waiting for
//! durability costs one entry in a list, and a round one atomic load.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::io::Vfs;
use crate::worker::Worker;

/// Tries of a rename that meets a taken name (only a clock far behind the
/// previous run's could make one happen at all).
const RENAME_TRIES: u32 = 16;

pub struct Trash {
    dir: PathBuf,
    next_suffix: AtomicU64,
    /// Entries moved in since the commit thread last queued their removal.
    moved: Mutex<Vec<PathBuf>>,
    /// Deletions whose DeleteGroup may not be durable yet; `awaiting_count`
    /// is their number, so a round that finds none pays one atomic load.
    awaiting: Mutex<Awaiting>,
    awaiting_count: AtomicU64,
    /// Snapshot holds: moves are noted in them, and while any is active
    /// the entries stay (a snapshot may be copying from them).
    holds: Arc<dyn Holding>,
}

/// Directories of deleted groups waiting for their deletion to be
/// durable. Invariant: `ids` holds exactly the groups of `dirs`, so a
/// round asks about each of its groups at the cost of one hash lookup,
/// however many deletions wait (under `never` they wait until the next
/// capture syncs the journal).
#[derive(Default)]
struct Awaiting {
    /// `(group, directory)` in deletion order (a group deleted, made again
    /// and deleted again before a sync appears twice; its first directory
    /// was moved before the round that made it again).
    dirs: Vec<(u64, PathBuf)>,
    ids: HashSet<u64>,
}

/// What the trash asks of the snapshot holds (`state/pins.rs`), which it
/// knows only as this.
pub(crate) trait Holding: Send + Sync {
    /// Whether any hold is active.
    fn active(&self) -> bool;

    /// Renames group `group`'s directory to the trash entry `to` with
    /// `rename`, noting the move in every active hold.
    fn moving(
        &self,
        group: u64,
        to: &Path,
        rename: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()>;
}

impl Trash {
    /// The trash of the data directory `data_dir` (nothing is created yet).
    pub fn new(data_dir: &Path, holds: Arc<dyn Holding>) -> Trash {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Trash {
            dir: data_dir.join("groups").join("trash"),
            next_suffix: AtomicU64::new(now_ns),
            moved: Mutex::new(Vec::new()),
            awaiting: Mutex::new(Awaiting::default()),
            awaiting_count: AtomicU64::new(0),
            holds,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves the directory `from` (of group `group_id`) into the trash, if
    /// it exists. One rename (and, the first time, a mkdir of the trash).
    /// The entry is remembered for [`Trash::take_moved`]. A file at the
    /// trash's own path (damage, another program) is garbage like
    /// everything in the trash: it is removed and the directory made, so
    /// that it never fails a deletion or the replay of one.
    pub fn put(&self, vfs: &dyn Vfs, group_id: u64, from: &Path) -> Result<()> {
        if !vfs.exists(from) {
            return Ok(());
        }
        if let Err(e) = vfs.create_dir_all(&self.dir) {
            if vfs.remove_file(&self.dir).is_err() {
                return Err(Error::write(format!("mkdir {}", self.dir.display()), e));
            }
            log::warn!(
                "trash: {} was a file, not a directory: removed",
                self.dir.display()
            );
            vfs.create_dir_all(&self.dir)
                .map_err(|e| Error::write(format!("mkdir {}", self.dir.display()), e))?;
        }
        let mut last = None;
        for _ in 0..RENAME_TRIES {
            let suffix = self.next_suffix.fetch_add(1, Ordering::Relaxed);
            let to = self.dir.join(format!("{group_id:016x}-{suffix:016x}"));
            match self
                .holds
                .moving(group_id, &to, &mut || vfs.rename(from, &to))
            {
                Ok(()) => {
                    self.moved.lock().push(to);
                    return Ok(());
                }
                // Gone meanwhile: nothing to move.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !vfs.exists(from) => {
                    return Ok(())
                }
                // The name is taken (a directory that is not empty).
                Err(e) => last = Some(e),
            }
        }
        let e = last.unwrap_or_else(|| std::io::ErrorKind::AlreadyExists.into());
        Err(Error::io(
            format!("move {} to {}", from.display(), self.dir.display()),
            e,
        ))
    }

    /// Notes the directory `from` of the deleted group `group_id`, to be
    /// moved into the trash once the deletion is durable
    /// ([`Trash::move_awaiting`]). No file-system call.
    pub fn put_when_durable(&self, group_id: u64, from: PathBuf) {
        let mut awaiting = self.awaiting.lock();
        awaiting.ids.insert(group_id);
        awaiting.dirs.push((group_id, from));
        self.awaiting_count
            .store(awaiting.dirs.len() as u64, Ordering::Release);
    }

    /// Whether any deletion waits for durability.
    pub fn any_awaiting(&self) -> bool {
        self.awaiting_count.load(Ordering::Acquire) > 0
    }

    /// Whether a deletion of one of `groups` waits for durability: a round
    /// that makes files at such a group's path must first make the
    /// deletion durable and move the old directory away.
    pub fn awaits_any(&self, mut groups: impl Iterator<Item = u64>) -> bool {
        if !self.any_awaiting() {
            return false;
        }
        let awaiting = self.awaiting.lock();
        groups.any(|g| awaiting.ids.contains(&g))
    }

    /// Moves into the trash every directory noted by
    /// [`Trash::put_when_durable`]; the caller knows the journal durable
    /// through their deletions. A move that fails leaves the directory at
    /// its path, a stray the next open's sweep moves (logged).
    pub fn move_awaiting(&self, vfs: &dyn Vfs) {
        if !self.any_awaiting() {
            return;
        }
        let awaiting = {
            let mut awaiting = self.awaiting.lock();
            self.awaiting_count.store(0, Ordering::Release);
            std::mem::take(&mut *awaiting)
        };
        for (group, dir) in awaiting.dirs {
            if let Err(e) = self.put(vfs, group, &dir) {
                log::warn!("trash: the directory of deleted group {group} stays at its path: {e}");
            }
        }
    }

    /// The entries moved in since the last call (the commit thread queues
    /// their removal after each round). None while a snapshot hold is
    /// active: they are kept for the first round after the last hold ends.
    pub fn take_moved(&self) -> Vec<PathBuf> {
        if self.holds.active() {
            return Vec::new();
        }
        std::mem::take(&mut *self.moved.lock())
    }

    /// Everything in the trash now. A trash that does not exist is empty.
    #[cfg(test)]
    pub fn entries(&self, vfs: &dyn Vfs) -> Vec<PathBuf> {
        list(vfs, &self.dir)
    }
}

/// The removal of one trash entry, one file per [`Removal::step`].
pub struct Removal {
    entry: PathBuf,
    /// The entry's files not yet removed; `None` before it was listed.
    files: Option<Vec<PathBuf>>,
}

impl Removal {
    pub fn new(entry: PathBuf) -> Removal {
        Removal { entry, files: None }
    }

    /// Removes one file of the entry (the first step lists it; the last
    /// removes the emptied directory). Returns true when the entry is gone
    /// or cannot be removed (then it is tried again at the next open).
    pub fn step(&mut self, vfs: &dyn Vfs) -> bool {
        let files = match &mut self.files {
            Some(files) => files,
            None => match vfs.read_dir(&self.entry) {
                Ok(files) => self.files.insert(files),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
                // Not a directory: removed as a whole below.
                Err(_) => self.files.insert(Vec::new()),
            },
        };
        if let Some(file) = files.pop() {
            // A directory inside (not made by the engine) goes whole.
            if vfs.remove_file(&file).is_err() {
                if let Err(e) = vfs.remove_dir_all(&file) {
                    log::warn!("trash: cannot remove {}: {e}", file.display());
                }
            }
            return false;
        }
        // An entry that is a file (not made by the engine) goes as one.
        if vfs.remove_file(&self.entry).is_err() {
            if let Err(e) = vfs.remove_dir_all(&self.entry) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    log::warn!("trash: cannot remove {}: {e}", self.entry.display());
                }
            }
        }
        true
    }
}

/// Queues `removal` on the maintenance worker, one step per background
/// job (each step queues the next), so a job a request waits for never
/// waits behind more than one file's removal.
pub(crate) fn remove_in_background<C: Send + Sync + 'static>(
    worker: &Worker<C>,
    vfs: Arc<dyn Vfs>,
    mut removal: Removal,
) {
    worker.background(move |w, _| {
        if !removal.step(&*vfs) {
            remove_in_background(w, vfs, removal);
        }
    });
}

/// Queues the removal of everything in the trash (at every open: a crash
/// may have left anything there).
pub(crate) fn sweep_in_background<C: Send + Sync + 'static>(
    worker: &Worker<C>,
    vfs: Arc<dyn Vfs>,
    trash_dir: PathBuf,
) {
    worker.background(move |w, _| {
        for entry in list(&*vfs, &trash_dir) {
            remove_in_background(w, vfs.clone(), Removal::new(entry));
        }
    });
}

/// Everything in the trash directory `dir` (none if it does not exist).
fn list(vfs: &dyn Vfs, dir: &Path) -> Vec<PathBuf> {
    match vfs.read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            log::warn!("cannot list {}: {e}", dir.display());
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;

    #[test]
    fn a_deletion_waits_at_its_path_until_moved_and_is_found_by_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let trash = Trash::new(dir.path(), Arc::new(crate::state::pins::Holds::default()));
        let group_dir = |id: u64| dir.path().join("groups").join(format!("{id:016x}"));
        for id in [3u64, 9] {
            std::fs::create_dir_all(group_dir(id)).unwrap();
            trash.put_when_durable(id, group_dir(id));
        }
        assert!(trash.any_awaiting());
        assert!(trash.awaits_any([1u64, 9].into_iter()));
        assert!(!trash.awaits_any([1u64, 2, 4].into_iter()));
        assert!(group_dir(3).exists(), "no file-system call before the move");
        trash.move_awaiting(&OsVfs);
        assert!(!group_dir(3).exists() && !group_dir(9).exists());
        assert_eq!(trash.take_moved().len(), 2);
        assert!(!trash.any_awaiting());
        assert!(
            !trash.awaits_any([3u64, 9].into_iter()),
            "moved: nothing waits"
        );
    }

    #[test]
    fn a_moved_directory_is_removed_one_file_per_step_and_never_looks_like_a_group() {
        let dir = tempfile::tempdir().unwrap();
        let trash = Trash::new(dir.path(), Arc::new(crate::state::pins::Holds::default()));
        let group_dir = dir
            .path()
            .join("groups")
            .join("001")
            .join("0000000000000007");
        std::fs::create_dir_all(&group_dir).unwrap();
        for i in 0..3 {
            std::fs::write(group_dir.join(format!("{i}.seg")), b"x").unwrap();
        }
        trash.put(&OsVfs, 7, &group_dir).unwrap();
        trash.put(&OsVfs, 8, &dir.path().join("missing")).unwrap();
        assert!(!group_dir.exists());
        let moved = trash.take_moved();
        assert_eq!(moved.len(), 1, "a missing directory is not moved");
        assert_eq!(trash.entries(&OsVfs), moved);
        let name = moved[0].file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("0000000000000007-"), "{name}");
        assert!(u64::from_str_radix(name, 16).is_err());
        let mut removal = Removal::new(moved[0].clone());
        let mut steps = 1;
        while !removal.step(&OsVfs) {
            steps += 1;
        }
        assert_eq!(
            steps, 4,
            "three files (the first step lists them), then the directory"
        );
        assert!(trash.entries(&OsVfs).is_empty());
    }

    /// Damage in the trash (a file system repair, another program): an
    /// entry that is a file, an entry holding a directory, an entry gone
    /// meanwhile. Each is removed (or found gone) by the sweep, so a
    /// trash is emptied whatever it holds.
    #[test]
    fn entries_that_are_files_hold_directories_or_vanish_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let trash = dir.path().join("groups").join("trash");
        std::fs::create_dir_all(trash.join("0000000000000002-0000000000000001/sub")).unwrap();
        std::fs::write(
            trash.join("0000000000000002-0000000000000001/sub/x.seg"),
            b"x",
        )
        .unwrap();
        std::fs::write(
            trash.join("0000000000000003-0000000000000001"),
            b"not a dir",
        )
        .unwrap();
        for entry in list(&OsVfs, &trash) {
            let mut removal = Removal::new(entry.clone());
            let mut steps = 0;
            while !removal.step(&OsVfs) {
                steps += 1;
                assert!(steps < 10, "{} is never removed", entry.display());
            }
        }
        let left = list(&OsVfs, &trash);
        assert!(left.is_empty(), "left in the trash: {left:?}");
        let mut gone = Removal::new(trash.join("0000000000000004-0000000000000001"));
        assert!(gone.step(&OsVfs), "an entry gone meanwhile ends at once");
    }

    /// A file where the trash directory goes: a deletion (and the replay
    /// of one, which would fail the open) still moves the group's
    /// directory in.
    #[test]
    fn a_file_at_the_trash_path_does_not_fail_a_deletion() {
        let dir = tempfile::tempdir().unwrap();
        let trash = Trash::new(dir.path(), Arc::new(crate::state::pins::Holds::default()));
        std::fs::create_dir_all(dir.path().join("groups")).unwrap();
        std::fs::write(trash.dir(), b"not a directory").unwrap();
        let group_dir = dir
            .path()
            .join("groups")
            .join("007")
            .join("0000000000000007");
        std::fs::create_dir_all(&group_dir).unwrap();
        std::fs::write(group_dir.join("1.seg"), b"x").unwrap();
        trash.put(&OsVfs, 7, &group_dir).unwrap();
        assert!(!group_dir.exists());
        assert_eq!(trash.entries(&OsVfs).len(), 1);
    }
}
