//! The file layer: every disk operation of the engine goes through [`Vfs`], so
//! tests can count fsyncs and inject failures (a write that fails, an fsync
//! that fails, a full disk) without touching the code under test. The
//! fault-injecting layer, `FaultyVfs` (in `io/faulty.rs`), exists only
//! with the `testing` feature or under `cfg(test)`.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

#[cfg(any(test, feature = "testing"))]
mod faulty;
#[cfg(any(test, feature = "testing"))]
pub use faulty::{FaultControl, FaultyVfs};
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod power_cut;
pub(crate) mod written;

/// A file opened through a [`Vfs`].
pub trait VfsFile: Send + Sync {
    /// Writes all of `buf` at `offset` (pwrite, looped).
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// fdatasync: the file's data (and the size) is durable when this returns.
    fn sync_data(&self) -> io::Result<()>;
    /// Writes the file's dirty pages to the device and waits for them,
    /// reporting a write-back error as `sync_data` does, but makes nothing
    /// durable: no metadata (the size) is written and the device's cache
    /// is not flushed (`sync_file_range` with `WAIT_BEFORE | WRITE |
    /// WAIT_AFTER`; errors per descriptor since Linux 4.19). The flusher's
    /// write-back ahead of checkpoints (`commit/flusher.rs`): an
    /// `fdatasync` per file would flush the device's cache once per file.
    /// Layers that do not intercept it sync the data.
    fn write_back(&self) -> io::Result<()> {
        self.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn file_len(&self) -> io::Result<u64>;
    /// Maps `len` bytes read-only and shared. `len` may exceed the current file
    /// size; the caller must never touch bytes at or beyond the file's end.
    fn map(&self, len: usize) -> io::Result<memmap2::Mmap>;
}

/// The guard every read through a mapping of a segment or shared file
/// makes before it touches the mapping (format-spec/storage.md section 4,
/// "Reads"): a mapping trusts the file, and touching a mapped page the
/// file no longer holds raises SIGBUS. So a file at `path` holding fewer
/// than `needed` bytes (cut, or lost data, under the engine) fails the
/// read with `GroupDamaged` of `group`, naming the file. One fstat.
pub(crate) fn check_mapped_len(
    file: &dyn VfsFile,
    path: &Path,
    group: u64,
    needed: u64,
) -> crate::error::Result<()> {
    let len = file
        .file_len()
        .map_err(|e| crate::error::Error::io(format!("stat {}", path.display()), e))?;
    if len < needed {
        return Err(crate::error::Error::GroupDamaged {
            group,
            reason: format!(
                "{}: file is {len} bytes but the log holds {needed} bytes in it \
                 (cut or damaged outside the node)",
                path.display()
            ),
        });
    }
    Ok(())
}

/// How a file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    Read,
    /// Read and write an existing file.
    ReadWrite,
    /// Read and write; creates the file when it is missing.
    ReadWriteCreate,
    /// Read and write; creates the file and fails if it exists.
    CreateNew,
}

/// Directory and file operations.
pub trait Vfs: Send + Sync + 'static {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>>;
    /// Creates `path` and its missing parents. The new entries are not
    /// durable until their parents are synced; see [`Vfs::create_dir_all_durable`].
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// fsync of a directory, so created, renamed and removed entries are durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// Creates `path` and its missing parents, and makes their entries
    /// durable: the parent of every directory this call creates is synced,
    /// and so is the parent of `path` itself even when it existed (an
    /// earlier run may have created it and stopped before its sync).
    /// A directory's own entry is durable only once its parent is synced
    /// (format-spec/storage.md section 1); without this a power cut can
    /// take a new data directory away with everything synced inside it.
    fn create_dir_all_durable(&self, path: &Path) -> io::Result<()> {
        // `Path::parent` of a relative single name is "", which means ".".
        fn parent(p: &Path) -> &Path {
            match p.parent() {
                Some(q) if q.as_os_str().is_empty() => Path::new("."),
                Some(q) => q,
                None => p, // the root has no parent; syncing itself is harmless
            }
        }
        let mut missing = Vec::new();
        let mut p = path;
        while !self.exists(p) {
            missing.push(p.to_owned());
            match p.parent() {
                Some(q) if !q.as_os_str().is_empty() => p = q,
                _ => break,
            }
        }
        self.create_dir_all(path)?;
        // Top-most first; each sync makes the next directory's entry durable.
        let mut synced = Vec::new();
        for dir in missing.iter().rev().map(|d| d.as_path()).chain([path]) {
            let parent = parent(dir);
            if !synced.contains(&parent) {
                self.sync_dir(parent)?;
                synced.push(parent);
            }
        }
        Ok(())
    }
    /// syncfs(2): every file and directory of the file system holding `path`
    /// is durable when this returns. One call instead of thousands of
    /// fdatasyncs when a checkpoint covers many groups.
    /// Layers that do not intercept it use the real file system's.
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        OsVfs.sync_filesystem(path)
    }
    /// Bytes an unprivileged writer may still use on the file system
    /// holding `path` (statvfs `f_bavail * f_frsize`). Layers that do not
    /// intercept it report the real file system's.
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        OsVfs.free_bytes(path)
    }
    /// rename(2): the erasure pass renames an erased copy over a segment
    /// (`state/erase_segments.rs`); the fault-injecting and power-cut
    /// layers model its atomicity.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    /// The entries of a directory (full paths), in no particular order.
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    fn exists(&self, path: &Path) -> bool;
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsVfs;

/// True on kernels (Linux 5.8 and later) whose syncfs reports write-back
/// errors of any file of the file system.
fn syncfs_reports_errors() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release
            .trim()
            .split(['.', '-'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (5, 8)
    })
}

struct OsFile(File);

impl VfsFile for OsFile {
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(buf, offset)
    }
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.0.read_exact_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }
    fn write_back(&self) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
            | libc::SYNC_FILE_RANGE_WRITE
            | libc::SYNC_FILE_RANGE_WAIT_AFTER;
        // SAFETY: sync_file_range on a valid open descriptor; offset 0 and
        // length 0 mean the whole file.
        if unsafe { libc::sync_file_range(self.0.as_raw_fd(), 0, 0, flags) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }
    fn file_len(&self) -> io::Result<u64> {
        // lseek(SEEK_END) rather than fstat: the same i_size at about a
        // third of the cost (220 ns against 680 ns measured), and reads
        // check a segment's length on every pull (segment.rs). Moving the
        // file position is harmless: every read and write is positional.
        io::Seek::seek(&mut &self.0, io::SeekFrom::End(0))
    }
    fn map(&self, len: usize) -> io::Result<memmap2::Mmap> {
        // SAFETY: the engine only reads bytes below the verified end of data,
        // which lies inside the file, and never truncates a file below bytes
        // that a live mapping may still read (cuts happen before any reader
        // exists, and removed files keep their pages while mapped). A cut by
        // another program is caught by a length check before each read
        // (segment.rs), except in the windows listed there.
        unsafe { memmap2::MmapOptions::new().len(len).map(&self.0) }
    }
}

impl Vfs for OsVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn VfsFile>> {
        let mut o = OpenOptions::new();
        match mode {
            OpenMode::Read => o.read(true),
            OpenMode::ReadWrite => o.read(true).write(true),
            OpenMode::ReadWriteCreate => o.read(true).write(true).create(true),
            OpenMode::CreateNew => o.read(true).write(true).create_new(true),
        };
        Ok(Box::new(OsFile(o.open(path)?)))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }
    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
        // SAFETY: statvfs with a valid C string and a zeroed out-struct.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
    fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        // Before Linux 5.8 syncfs did not report write-back errors: a failed
        // write would go unnoticed. Callers fall back to per-file syncs.
        if !syncfs_reports_errors() {
            return Err(io::ErrorKind::Unsupported.into());
        }
        let dir = File::open(path)?;
        // SAFETY: syncfs on a valid open descriptor.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }
    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }
    fn read_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        fs::read_dir(path)?.map(|e| e.map(|e| e.path())).collect()
    }
    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

/// Descriptors kept free for everything that is not a cached segment
/// (journal, checkpoint, directories, the server's sockets are separate).
pub const FD_RESERVE: u64 = 256;

/// Raises the soft RLIMIT_NOFILE towards `want` (up to the hard limit) and
/// returns the soft limit the process runs with (`u64::MAX` if it cannot be
/// read). The one place that changes the limit: the engine's segment budget
/// and the node's descriptor budget both go through it.
pub fn raise_open_file_limit(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return u64::MAX;
        }
        if lim.rlim_cur < want {
            let raised = libc::rlimit {
                rlim_cur: want.min(lim.rlim_max),
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = raised.rlim_cur;
            }
        }
    }
    lim.rlim_cur
}

/// Raises the soft limit on open files so `segments` cached segments fit,
/// and returns how many segments may really be cached (fewer if the hard
/// limit is lower).
pub fn fit_open_file_limit(segments: usize) -> usize {
    let limit = raise_open_file_limit(segments as u64 + FD_RESERVE);
    if limit == u64::MAX {
        return segments;
    }
    let fit = limit.saturating_sub(FD_RESERVE).max(2) as usize;
    if fit < segments {
        log::warn!("open file limit {limit} allows only {fit} cached segments (asked {segments})");
    }
    fit.min(segments)
}
