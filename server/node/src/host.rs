//! Figures about the machine the node runs on, measured by a background
//! thread so that no request waits for them: the bytes the data directory
//! takes on disk (and its journal's share), the free and total bytes of its
//! file system, and the process's resident and virtual memory.
//!
//! Why a refresher and not counts kept by the engine: the files of a data
//! directory are written by four threads (journal, segments, checkpoint
//! runs, cold files) and removed by two more, and what a file takes on
//! disk (blocks allocated) is the file system's business; a walk asks the
//! file system itself. A walk costs one `stat` per file, which grows with
//! the groups, so it runs here, never on the event loop, and paces itself:
//! the next walk starts at least [`WALK_INTERVAL_MIN`] and at least
//! [`WALK_DUTY`] times its own duration after the last one ended (a walk
//! that takes 2 s runs once a minute, about 5% of a core). `statvfs` and
//! `/proc/self/statm` cost one system call each and are read every
//! [`REFRESH`].
//!
//! Representation: [`HostFigures`], atomics the refresher stores and STATS
//! (on the event loop) and the metrics thread load. Each figure is 0 until
//! first measured; `disk_scanned_at` says how old the disk figures are.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often free space and memory are read.
pub const REFRESH: Duration = Duration::from_secs(1);
/// The shortest time between two walks of the data directory.
pub const WALK_INTERVAL_MIN: Duration = Duration::from_secs(10);
/// A walk waits at least this many times its own last duration.
pub const WALK_DUTY: u32 = 20;

/// The last measured values. All bytes.
#[derive(Debug, Default)]
pub struct HostFigures {
    pub disk_bytes_used: AtomicU64,
    pub journal_bytes: AtomicU64,
    pub disk_bytes_free: AtomicU64,
    pub disk_bytes_total: AtomicU64,
    pub resident_bytes: AtomicU64,
    pub virtual_bytes: AtomicU64,
    /// How long the last walk took, in ms.
    pub disk_scan_ms: AtomicU64,
    /// When the last walk ended, in ms since `epoch` (0: none yet).
    pub disk_scanned_at_ms: AtomicU64,
    epoch: Option<Instant>,
}

impl HostFigures {
    pub fn new(epoch: Instant) -> HostFigures {
        HostFigures {
            epoch: Some(epoch),
            ..HostFigures::default()
        }
    }

    fn since_epoch_ms(&self, now: Instant) -> u64 {
        self.epoch
            .map_or(0, |e| now.saturating_duration_since(e).as_millis() as u64)
    }

    /// How old the disk figures are at `now`, in ms (0 before the first
    /// walk ended, when they are 0 too).
    pub fn disk_scan_age_ms(&self, now: Instant) -> u64 {
        match self.disk_scanned_at_ms.load(Ordering::Relaxed) {
            0 => 0,
            at => self.since_epoch_ms(now).saturating_sub(at),
        }
    }

    /// One walk of `data_dir`, stored.
    fn walk(&self, data_dir: &Path, journal_dir: &Path) -> Duration {
        let started = Instant::now();
        let used = disk_bytes(data_dir);
        let journal = disk_bytes(journal_dir);
        self.disk_bytes_used.store(used, Ordering::Relaxed);
        self.journal_bytes.store(journal, Ordering::Relaxed);
        let took = started.elapsed();
        self.disk_scan_ms
            .store(took.as_millis() as u64, Ordering::Relaxed);
        // At least 1: 0 means "never".
        let at = self.since_epoch_ms(Instant::now()).max(1);
        self.disk_scanned_at_ms.store(at, Ordering::Relaxed);
        took
    }

    /// Free space and memory, stored.
    fn refresh(&self, data_dir: &Path) {
        if let Some((free, total)) = file_system_bytes(data_dir) {
            self.disk_bytes_free.store(free, Ordering::Relaxed);
            self.disk_bytes_total.store(total, Ordering::Relaxed);
        }
        if let Some((resident, virt)) = process_memory() {
            self.resident_bytes.store(resident, Ordering::Relaxed);
            self.virtual_bytes.store(virt, Ordering::Relaxed);
        }
    }
}

/// Starts the refresher over `data_dir`: it measures at once, then on its
/// schedule, until `stop`'s sender is dropped.
pub fn spawn(
    data_dir: PathBuf,
    journal_dir: PathBuf,
    figures: Arc<HostFigures>,
    stop: Receiver<()>,
) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name("tidemark-host".into())
        .spawn(move || {
            let mut next_walk = Instant::now();
            loop {
                figures.refresh(&data_dir);
                if Instant::now() >= next_walk {
                    let took = figures.walk(&data_dir, &journal_dir);
                    next_walk = Instant::now() + WALK_INTERVAL_MIN.max(took * WALK_DUTY);
                }
                match stop.recv_timeout(REFRESH) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
            }
        })
}

/// Bytes the files under `path` take on disk (allocated blocks), without
/// following symbolic links. Files that vanish during the walk (a
/// checkpoint deletes, the worker empties the trash) are skipped.
pub fn disk_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.path().symlink_metadata() else {
                continue;
            };
            // st_blocks is in 512-byte units whatever the block size.
            total = total.saturating_add(meta.blocks().saturating_mul(512));
            if meta.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    total
}

/// `(free for unprivileged users, total)` bytes of the file system holding
/// `path` (statvfs).
pub fn file_system_bytes(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs with a valid C string and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let frsize = st.f_frsize as u64;
    Some((
        (st.f_bavail as u64).saturating_mul(frsize),
        (st.f_blocks as u64).saturating_mul(frsize),
    ))
}

/// `(resident, virtual)` bytes of this process, from `/proc/self/statm`
/// (Linux; `None` elsewhere).
pub fn process_memory() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    let size = fields.next()?.ok()?;
    let resident = fields.next()?.ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = u64::try_from(page).ok().filter(|p| *p > 0)?;
    Some((resident.saturating_mul(page), size.saturating_mul(page)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_walk_counts_every_file_below_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let empty = disk_bytes(dir.path());
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), vec![7u8; 200_000]).unwrap();
        std::fs::write(dir.path().join("g"), vec![7u8; 100_000]).unwrap();
        let used = disk_bytes(dir.path());
        assert!(used >= empty + 300_000, "{used}");
        assert_eq!(disk_bytes(&dir.path().join("missing")), 0);
    }

    #[test]
    fn the_refresher_measures_at_once_and_stops_when_told() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("journal")).unwrap();
        std::fs::write(dir.path().join("journal/j"), vec![1u8; 100_000]).unwrap();
        let figures = Arc::new(HostFigures::new(Instant::now()));
        let (tx, rx) = std::sync::mpsc::channel();
        let t = spawn(
            dir.path().to_path_buf(),
            dir.path().join("journal"),
            figures.clone(),
            rx,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while figures.disk_scanned_at_ms.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "no walk");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(tx);
        t.join().unwrap();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        assert!(load(&figures.journal_bytes) >= 100_000);
        assert!(load(&figures.disk_bytes_used) >= load(&figures.journal_bytes));
        assert!(load(&figures.disk_bytes_total) >= load(&figures.disk_bytes_free));
        assert!(load(&figures.disk_bytes_total) > 0);
        assert!(load(&figures.resident_bytes) > 0);
        assert!(load(&figures.virtual_bytes) >= load(&figures.resident_bytes));
    }
}
