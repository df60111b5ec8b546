//! The `FORMAT` file: which storage format a data directory holds
//! (format-spec/storage.md section 2, "FORMAT", and section 14). Written
//! once, at the first open of a directory that holds no data; checked at
//! every open before anything else is written.
//!
//! Layout (32 bytes, little-endian):
//! `{ magic: [u8; 8] = "TDMKFMT\0" | version: u16 = 2 | header_len: u16 = 32 |
//!    reserved: u32 = 0 | created_ms: u64 | reserved: u32 = 0 |
//!    crc32: u32 (of bytes 0..28) }`
//!
//! Rule: a directory without `FORMAT` that holds any file of storage format
//! 1 (tidemark 0.1: `checkpoint`, `checkpoint.prev`, `journal/`, `groups/`)
//! is refused with [`Error::UnsupportedFormat`] naming format 1 and the
//! versions of the files seen, and nothing is written to it (not even
//! `FORMAT`): a build that silently misread it, or wrote a format-2 file
//! beside format-1 ones, would lose data. Cost: a few `stat`s and, for a
//! format-1 directory only, 10 bytes read per file named in the message.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs};

pub const FORMAT_FILE: &str = "FORMAT";
pub const FORMAT_BYTES: usize = 32;
pub const FORMAT_MAGIC: [u8; 8] = *b"TDMKFMT\0";
/// The storage format this build reads and writes.
pub const FORMAT_VERSION: u16 = 2;

/// Journal files whose versions a format-1 refusal reads (the message
/// names the distinct versions; a directory may hold many files).
const FORMAT_1_JOURNALS_READ_MAX: usize = 64;

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join(FORMAT_FILE)
}

// Format: { magic | version: u16 | header_len: u16 = 32 | reserved: u32 |
//   created_ms: u64 | reserved: u32 | crc32 of 0..28 }
pub fn encode(version: u16, created_ms: u64) -> [u8; FORMAT_BYTES] {
    let mut b = [0u8; FORMAT_BYTES];
    b[0..8].copy_from_slice(&FORMAT_MAGIC);
    b[8..10].copy_from_slice(&version.to_le_bytes());
    b[10..12].copy_from_slice(&(FORMAT_BYTES as u16).to_le_bytes());
    b[16..24].copy_from_slice(&created_ms.to_le_bytes());
    let crc = crc32fast::hash(&b[0..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The version a `FORMAT` file names, after its checks: exactly 32 bytes,
/// CRC, magic, `header_len`, reserved bytes zero.
pub fn decode(b: &[u8]) -> Result<u16, String> {
    if b.len() != FORMAT_BYTES {
        return Err(format!(
            "FORMAT file of {} bytes, not {FORMAT_BYTES}",
            b.len()
        ));
    }
    let stored = u32::from_le_bytes([b[28], b[29], b[30], b[31]]);
    if crc32fast::hash(&b[0..28]) != stored {
        return Err("FORMAT checksum mismatch".into());
    }
    if b[0..8] != FORMAT_MAGIC {
        return Err("bad FORMAT magic".into());
    }
    if u16::from_le_bytes([b[10], b[11]]) as usize != FORMAT_BYTES
        || b[12..16] != [0; 4]
        || b[24..28] != [0; 4]
    {
        return Err("FORMAT header_len or reserved bytes invalid".into());
    }
    Ok(u16::from_le_bytes([b[8], b[9]]))
}

/// What [`check`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    /// `FORMAT` names this build's format.
    Current,
    /// No `FORMAT` and no data: a new directory, to be marked by [`create`].
    Empty,
}

/// Checks the directory's format without writing anything: `FORMAT` of
/// this build's version, or no data at all. Refuses anything else.
pub(crate) fn check(vfs: &dyn Vfs, data_dir: &Path) -> Result<Found> {
    let file = path(data_dir);
    if vfs.exists(&file) {
        let bytes = read_prefix(vfs, &file, FORMAT_BYTES + 1)
            .map_err(|e| Error::io(format!("read {}", file.display()), e))?;
        let version = decode(&bytes).map_err(|reason| Error::Corrupt {
            path: file.clone(),
            group: None,
            offset: 0,
            reason: format!(
                "{reason}: the file that says which storage format this directory holds is \
                 damaged, so nothing in it is read. The data directory was not opened: restore \
                 FORMAT (or the directory) from a backup"
            ),
        })?;
        if version != FORMAT_VERSION {
            return Err(Error::UnsupportedFormat {
                path: data_dir.to_owned(),
                found: version,
                supported: FORMAT_VERSION,
                detail: format!(
                    "FORMAT names version {version}; the data directory was not opened and \
                     nothing was written to it"
                ),
            });
        }
        return Ok(Found::Current);
    }
    let seen = format_1_files(vfs, data_dir);
    if seen.is_empty() {
        return Ok(Found::Empty);
    }
    Err(Error::UnsupportedFormat {
        path: data_dir.to_owned(),
        found: 1,
        supported: FORMAT_VERSION,
        detail: format!(
            "{}: this directory was written by tidemark 0.1 (storage format 1), which this \
             build does not convert. The directory was not opened and nothing was written to \
             it: open it with a tidemark 0.1.x release (the only releases that read storage \
             format 1; this build is tidemark {}), or start this build on an empty directory",
            seen.join(", "),
            env!("CARGO_PKG_VERSION")
        ),
    })
}

/// Writes `FORMAT` into a directory [`check`] found empty: `FORMAT.tmp`,
/// fdatasync, rename, fsync of the directory. A crash before the rename
/// leaves no `FORMAT` (and no data: the next open starts over).
pub(crate) fn create(vfs: &dyn Vfs, data_dir: &Path) -> Result<()> {
    let tmp = data_dir.join("FORMAT.tmp");
    let file = vfs
        .open(&tmp, OpenMode::ReadWriteCreate)
        .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
    file.set_len(0)
        .map_err(|e| Error::io(format!("truncate {}", tmp.display()), e))?;
    file.write_all_at(&encode(FORMAT_VERSION, crate::clock::now_ms()), 0)
        .map_err(|e| Error::write(format!("write {}", tmp.display()), e))?;
    file.sync_data()
        .map_err(|e| Error::io(format!("fdatasync {}", tmp.display()), e))?;
    drop(file);
    let to = path(data_dir);
    vfs.rename(&tmp, &to)
        .map_err(|e| Error::io(format!("rename {} to {}", tmp.display(), to.display()), e))?;
    vfs.sync_dir(data_dir)
        .map_err(|e| Error::io(format!("fsync dir {}", data_dir.display()), e))
}

/// The format-1 files of a directory without `FORMAT`, each with the
/// version its header names where it has one ("checkpoint version 1",
/// "journal version 2", "groups/").
fn format_1_files(vfs: &dyn Vfs, data_dir: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    for name in ["checkpoint", "checkpoint.prev"] {
        let p = data_dir.join(name);
        if vfs.exists(&p) {
            seen.push(match header_version(vfs, &p, b"TDMKCKPT") {
                Some(v) => format!("{name} version {v}"),
                None => format!("{name} (no readable header)"),
            });
        }
    }
    let jdir = data_dir.join("journal");
    if vfs.exists(&jdir) {
        let mut versions: Vec<u16> = crate::commit::journal::list(vfs, &jdir)
            .unwrap_or_default()
            .iter()
            .take(FORMAT_1_JOURNALS_READ_MAX)
            .filter_map(|(_, p)| header_version(vfs, p, &crate::commit::journal::JOURNAL_MAGIC))
            .collect();
        versions.sort_unstable();
        versions.dedup();
        seen.push(match versions.as_slice() {
            [] => "journal/".to_string(),
            vs => {
                let vs: Vec<String> = vs.iter().map(u16::to_string).collect();
                format!("journal version {}", vs.join(" and "))
            }
        });
    }
    if vfs.exists(&data_dir.join("groups")) {
        seen.push("groups/".to_string());
    }
    seen
}

/// The `u16` version after an 8-byte magic, if the file starts with it.
fn header_version(vfs: &dyn Vfs, path: &Path, magic: &[u8; 8]) -> Option<u16> {
    let b = read_prefix(vfs, path, 10).ok()?;
    (b.len() == 10 && b[0..8] == magic[..]).then(|| u16::from_le_bytes([b[8], b[9]]))
}

/// Up to `max` bytes from the start of a file.
fn read_prefix(vfs: &dyn Vfs, path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    let file = vfs.open(path, OpenMode::Read)?;
    let len = usize::try_from(file.file_len()?)
        .unwrap_or(usize::MAX)
        .min(max);
    let mut b = vec![0u8; len];
    file.read_exact_at(&mut b, 0)?;
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;

    #[test]
    fn format_round_trips_and_any_damage_is_refused() {
        let b = encode(FORMAT_VERSION, 1_700_000_000_000);
        assert_eq!(decode(&b), Ok(2));
        for at in 0..FORMAT_BYTES {
            let mut d = b;
            d[at] ^= 1;
            assert!(decode(&d).is_err(), "byte {at}");
        }
        assert!(decode(&b[..31]).is_err());
    }

    #[test]
    fn a_new_directory_is_marked_and_a_marked_one_is_current() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(check(&OsVfs, dir.path()).unwrap(), Found::Empty);
        assert_eq!(
            check(&OsVfs, &dir.path().join("not-yet")).unwrap(),
            Found::Empty
        );
        create(&OsVfs, dir.path()).unwrap();
        assert_eq!(check(&OsVfs, dir.path()).unwrap(), Found::Current);
        assert!(!dir.path().join("FORMAT.tmp").exists());
    }

    #[test]
    fn another_version_and_a_damaged_format_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path()), encode(3, 0)).unwrap();
        match check(&OsVfs, dir.path()) {
            Err(Error::UnsupportedFormat {
                found, supported, ..
            }) => assert_eq!((found, supported), (3, 2)),
            other => panic!("{other:?}"),
        }
        let mut d = encode(2, 0);
        d[20] ^= 1;
        std::fs::write(path(dir.path()), d).unwrap();
        assert!(matches!(
            check(&OsVfs, dir.path()),
            Err(Error::Corrupt { offset: 0, .. })
        ));
    }
}
