//! The mappings of the shared files (journal and cold files) that reads
//! of small groups use (`small_read.rs`), and the check that a file holds
//! a group's records where an extent says.
//!
//! Representation: [`SharedFiles`] keeps a read-only mapping of each
//! shared file a read used ([`SharedMap`]: the whole file as long as it was
//! when mapped), at most `max_open` of them, least recently used first out.
//! A mapping of the journal file still being written is mapped again when
//! a read needs bytes past its end. Every use measures the file first
//! (`small_read.rs` states the invariants).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs, VfsFile};
use crate::logs::extents::{FileId, FileKind, Piece};

/// A read-only mapping of a whole shared file, as long as the file was
/// when it was mapped, with the open file: every use measures it first
/// ([`SharedFiles::map`]).
pub struct SharedMap {
    path: PathBuf,
    file: Box<dyn VfsFile>,
    map: memmap2::Mmap,
}

impl SharedMap {
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The mappings of shared files that reads of small groups use.
pub struct SharedFiles {
    vfs: Arc<dyn Vfs>,
    journal_dir: PathBuf,
    max_open: usize,
    /// Most recently used last.
    maps: Mutex<VecDeque<(FileId, Arc<SharedMap>)>>,
}

impl SharedFiles {
    /// Mappings kept now.
    #[cfg(test)]
    pub(crate) fn mapped(&self) -> usize {
        self.maps.lock().len()
    }

    pub fn new(vfs: Arc<dyn Vfs>, journal_dir: PathBuf, max_open: usize) -> SharedFiles {
        SharedFiles {
            vfs,
            journal_dir,
            max_open: max_open.max(1),
            maps: Mutex::new(VecDeque::new()),
        }
    }

    /// Drops the cached mapping of `file` (deleted): its disk space is
    /// given back once the readers holding chunks of it are done.
    pub fn forget(&self, file: FileId) {
        self.maps.lock().retain(|(f, _)| *f != file);
    }

    /// The path of a shared file.
    pub fn path(&self, file: FileId) -> PathBuf {
        match file.kind() {
            FileKind::Journal => {
                crate::commit::journal::journal_path(&self.journal_dir, file.seq())
            }
            FileKind::Cold => self
                .journal_dir
                .join(crate::logs::cold::file_name(file.seq())),
        }
    }

    /// A mapping of `file` holding at least `end` bytes. The file is
    /// opened, measured and mapped only if no cached mapping is that long
    /// (the active journal file grows); a cached one is used only after
    /// the file is measured again (one fstat: a file cut under the engine
    /// since it was mapped must not be touched there, storage.md section
    /// 4 "Reads"). A missing file, or one shorter than `end`, is damage
    /// of `group` (its extent names bytes the file does not hold).
    pub fn map(&self, group: u64, file: FileId, end: u64) -> Result<Arc<SharedMap>> {
        let cached = {
            let mut maps = self.maps.lock();
            match maps.iter().position(|(f, _)| *f == file) {
                Some(i) if maps[i].1.bytes().len() as u64 >= end => {
                    let hit = maps.remove(i).expect("invariant: index found above");
                    let map = hit.1.clone();
                    maps.push_back(hit);
                    Some(map)
                }
                _ => None,
            }
        };
        if let Some(map) = cached {
            crate::io::check_mapped_len(&*map.file, &map.path, group, end)?;
            return Ok(map);
        }
        let path = self.path(file);
        let damaged = |reason: String| Error::GroupDamaged {
            group,
            reason: format!("{}: {reason}", path.display()),
        };
        let f = self.vfs.open(&path, OpenMode::Read).map_err(|e| {
            damaged(format!(
                "cannot open the shared file the group's records are in: {e}"
            ))
        })?;
        let len = f
            .file_len()
            .map_err(|e| damaged(format!("cannot measure the file: {e}")))?;
        if len < end {
            return Err(damaged(format!(
                "the file holds {len} bytes, but an extent of the group ends at offset {end}"
            )));
        }
        let len =
            usize::try_from(len).map_err(|_| damaged("larger than the address space".into()))?;
        let map = f
            .map(len)
            .map_err(|e| damaged(format!("cannot map the file: {e}")))?;
        let map = Arc::new(SharedMap { path, file: f, map });
        let mut maps = self.maps.lock();
        maps.retain(|(f, _)| *f != file);
        maps.push_back((file, map.clone()));
        while maps.len() > self.max_open {
            maps.pop_front();
        }
        Ok(map)
    }

    /// The mapping of the file holding `piece`, an extent of `group`,
    /// once [`Self::map`] found the file long enough and the file proves
    /// to hold `group`'s records there (storage.md section 9, "Small
    /// groups"): a cold file by the extent header before the records
    /// (`cold::check_owner`: group, first id, count, bytes, under its
    /// CRC), a journal file by its header naming the file's own seq (file
    /// numbers are never given twice, so it is the file the extent was
    /// made in). Anything else is `GroupDamaged` naming the file; nothing
    /// of it is served.
    pub fn map_piece(&self, group: u64, piece: &Piece) -> Result<Arc<SharedMap>> {
        let map = self.map(group, piece.ext.file(), piece.ext.end())?;
        check_owner(map.bytes(), group, piece).map_err(|why| Error::GroupDamaged {
            group,
            reason: format!("{}: {why}", map.path().display()),
        })?;
        Ok(map)
    }
}

/// Whether `file` (the bytes of the shared file holding `piece`, at
/// least up to its end) holds `group`'s records there, by what the file
/// itself says ([`SharedFiles::map_piece`]); also what `ctl verify` and
/// `ctl repair` check before they take an extent's records. `Err` says
/// what does not match, with the offset.
pub(crate) fn check_owner(file: &[u8], group: u64, piece: &Piece) -> Result<(), String> {
    match piece.ext.file().kind() {
        FileKind::Cold => crate::logs::cold::check_owner(file, group, piece),
        FileKind::Journal => journal_file_is(file, piece.ext.file().seq()),
    }
}

/// Whether the journal file mapped as `map` is file `seq` by its own
/// header (checked under its CRC).
fn journal_file_is(map: &[u8], seq: u64) -> Result<(), String> {
    let h = crate::commit::journal::decode_header_of(map).map_err(|e| format!("offset 0: {e}"))?;
    if h.seq != seq {
        return Err(format!(
            "offset 16: the file's header names journal file {}, not {seq}",
            h.seq
        ));
    }
    Ok(())
}
