//! Write-back ahead of checkpoints. A checkpoint makes every group log
//! durable, and while it does, the commit thread commits nothing: with a
//! 64 MiB journal's worth of segment writes still dirty in the page cache
//! that sync took ~270 ms (the latency spike of BENCHMARKS.md). This thread
//! writes back, every eighth of the way to the next checkpoint, exactly the
//! files the engine wrote since its last pass (`io/written.rs`), so the
//! checkpoint's own sync finds little left to write. It once ran `syncfs`,
//! which writes back every dirty page of the file system, other processes'
//! too: its cost followed the neighbours' writes (up to 2.7 s under a
//! build) and filled the disk queue the journal's syncs wait in. Each file
//! gets a write-back that waits ([`crate::io::VfsFile::write_back`]), not an
//! `fdatasync`: that would also flush the device's cache once per file
//! (3,375 flushes in one benchmark run against 105 `syncfs` calls), and
//! nothing here needs to be durable. A file gone by the pass (deleted or
//! renamed away) is skipped (`io/written.rs` says why that loses nothing).
//!
//! It changes no durability rule: the checkpoint still syncs everything it
//! names, and nothing is acknowledged on the strength of a background sync.
//! One thing it must not do is swallow a write-back error: a sync reports an
//! error once, so if this thread were the one to see it, the checkpoint's
//! own sync would find nothing wrong. Errors are therefore kept, and a
//! checkpoint first waits for a background sync under way and then fails
//! with any error one saw (writes stop; the journal still holds everything
//! since the last checkpoint).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::error::Error;
use crate::io::written::WrittenFiles;
use crate::io::{OpenMode, Vfs};

/// Background syncs per checkpoint interval.
const SYNCS_PER_CHECKPOINT: u64 = 8;

/// No background sync for less than this much journal: below it a sync
/// costs more than it saves (and small test configurations stay quiet).
pub(crate) const STEP_BYTES_MIN: u64 = 1 << 20;

pub(crate) struct Flusher {
    requests: Option<SyncSender<()>>,
    thread: Option<JoinHandle<()>>,
    state: Arc<(Mutex<SyncState>, Condvar)>,
    /// Journal bytes between two background syncs (0 = never).
    step: u64,
    /// Journal length at which the next one is asked for.
    next_at: u64,
}

/// What the background thread has done, for [`Flusher::check`].
#[derive(Default)]
struct SyncState {
    /// Syncs asked for (requests the channel took).
    requested: u64,
    /// Syncs finished (or given up on).
    done: u64,
    /// The thread is gone: no request will be done any more.
    exited: bool,
    /// The first error a background sync saw.
    error: Option<String>,
}

impl Flusher {
    /// Starts the thread, which syncs the files `written` lists.
    /// `checkpoint_bytes` is the journal length that triggers a checkpoint.
    pub fn start(vfs: Arc<dyn Vfs>, written: Arc<WrittenFiles>, checkpoint_bytes: u64) -> Flusher {
        let (requests, wanted) = sync_channel::<()>(1);
        let state = Arc::new((Mutex::new(SyncState::default()), Condvar::new()));
        let shared = state.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-flush".into())
            .spawn(move || {
                let (lock, cv) = &*shared;
                while wanted.recv().is_ok() {
                    let result = sync_written(&*vfs, &written);
                    let mut st = lock.lock();
                    st.done += 1;
                    if let Err((path, e)) = result {
                        log::error!("background sync of {}: {e}", path.display());
                        st.error
                            .get_or_insert(format!("write-back of {}: {e}", path.display()));
                        st.exited = true;
                    }
                    let exited = st.exited;
                    drop(st);
                    cv.notify_all();
                    if exited {
                        return;
                    }
                }
                lock.lock().exited = true;
                cv.notify_all();
            })
            .ok();
        if thread.is_none() {
            log::warn!("could not start the background flush thread; checkpoints sync alone");
        }
        let step = (checkpoint_bytes / SYNCS_PER_CHECKPOINT).max(STEP_BYTES_MIN);
        Flusher {
            requests: thread.as_ref().map(|_| requests),
            thread,
            state,
            step,
            next_at: step,
        }
    }

    /// Called with the journal's length after each round: asks for a sync
    /// each time the length passes another step. Never blocks (a sync
    /// already under way absorbs the request).
    pub fn journal_grew_to(&mut self, len: u64) {
        if self.step == 0 || len < self.next_at {
            return;
        }
        self.next_at = (len / self.step + 1) * self.step;
        if let Some(tx) = &self.requests {
            // Counted before sending, so `check` never misses one under way.
            self.state.0.lock().requested += 1;
            match tx.try_send(()) {
                Ok(()) => {}
                Err(TrySendError::Full(())) => self.state.0.lock().requested -= 1,
                Err(TrySendError::Disconnected(())) => {
                    self.state.0.lock().requested -= 1;
                    self.requests = None;
                }
            }
        }
    }

    /// A checkpoint started a new journal.
    pub fn journal_restarted(&mut self) {
        self.next_at = self.step;
    }

    /// What the checkpointer asks before it syncs (see [`FlushCheck`]).
    pub fn checker(&self) -> FlushCheck {
        FlushCheck(self.state.clone())
    }
}

/// One pass: a write-back of every file written since the last one. A
/// file gone since (deleted, or renamed away) is skipped. The first error
/// ends the pass with the file it came from.
fn sync_written(vfs: &dyn Vfs, written: &WrittenFiles) -> Result<(), (PathBuf, std::io::Error)> {
    for path in written.take() {
        sync_one(vfs, &path).map_err(|e| (path, e))?;
    }
    Ok(())
}

fn sync_one(vfs: &dyn Vfs, path: &Path) -> std::io::Result<()> {
    match vfs.open(path, OpenMode::Read) {
        Ok(file) => file.write_back(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A handle on the background syncs' outcome, for the checkpointer thread.
#[derive(Clone)]
pub(crate) struct FlushCheck(Arc<(Mutex<SyncState>, Condvar)>);

impl FlushCheck {
    /// Waits for a background sync under way, then returns the write-back
    /// error any background sync saw. A checkpoint must not claim
    /// durability after one; and one still running could see an error the
    /// checkpoint's own sync then would not.
    pub fn check(&self) -> Result<(), Error> {
        let (lock, cv) = &*self.0;
        let mut st = lock.lock();
        while st.done < st.requested && !st.exited {
            cv.wait(&mut st);
        }
        match &st.error {
            Some(e) => Err(Error::WritesStopped {
                reason: format!("a background sync failed: {e}"),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.requests = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::written::TrackWrites;
    use crate::io::FaultyVfs;
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// A flusher over `FaultyVfs` (which logs the files it syncs), and the
    /// file layer the "engine" writes through.
    fn flusher(step: u64) -> (Flusher, Arc<dyn Vfs>, Arc<crate::io::FaultControl>) {
        let faulty = FaultyVfs::new();
        let control = faulty.control.clone();
        let written = Arc::new(WrittenFiles::default());
        let vfs: Arc<dyn Vfs> = Arc::new(TrackWrites::new(Arc::new(faulty), written.clone()));
        (Flusher::start(vfs.clone(), written, 8 * step), vfs, control)
    }

    fn write(vfs: &dyn Vfs, path: &Path) {
        vfs.open(path, OpenMode::ReadWriteCreate)
            .unwrap()
            .write_all_at(b"bytes", 0)
            .unwrap();
    }

    fn sorted(mut v: Vec<PathBuf>) -> Vec<PathBuf> {
        v.sort();
        v
    }

    #[test]
    fn syncs_exactly_the_files_written_since_its_last_pass() {
        let dir = tempfile::tempdir().unwrap();
        let step = STEP_BYTES_MIN;
        let (mut f, vfs, control) = flusher(step);
        let path = |name: &str| dir.path().join(name);
        // Kept open across passes, as the journal and segments are.
        let a = vfs.open(&path("a"), OpenMode::ReadWriteCreate).unwrap();
        a.write_all_at(b"bytes", 0).unwrap();
        write(&*vfs, &path("b"));
        // Written, then deleted before the pass: nothing to write back.
        write(&*vfs, &path("deleted"));
        vfs.remove_file(&path("deleted")).unwrap();
        // Written, then renamed away: the engine renames only files it
        // synced itself (io/written.rs).
        write(&*vfs, &path("renamed"));
        vfs.rename(&path("renamed"), &path("renamed-to")).unwrap();
        // Opened for writing, never written; and one only read.
        drop(
            vfs.open(&path("untouched"), OpenMode::ReadWriteCreate)
                .unwrap(),
        );
        let mut one = [0u8; 1];
        vfs.open(&path("a"), OpenMode::Read)
            .unwrap()
            .read_exact_at(&mut one, 0)
            .unwrap();
        f.journal_grew_to(step);
        wait_for("the first pass", || control.synced_files_len() == 2);
        f.checker().check().unwrap();
        assert_eq!(
            sorted(control.take_synced_files()),
            vec![path("a"), path("b")]
        );
        // The next pass: a file of the last pass written again, and a new one.
        a.write_all_at(b"more", 5).unwrap();
        write(&*vfs, &path("c"));
        f.journal_grew_to(2 * step);
        wait_for("the second pass", || control.synced_files_len() == 2);
        f.checker().check().unwrap();
        assert_eq!(
            sorted(control.take_synced_files()),
            vec![path("a"), path("c")]
        );
        // Nothing written since: a pass syncs nothing.
        f.journal_grew_to(3 * step);
        f.checker().check().unwrap();
        assert_eq!(control.take_synced_files(), Vec::<PathBuf>::new());
        assert_eq!(control.syncs(), 4, "no sync of anything else");
        drop(f); // joins the thread
    }

    #[test]
    fn syncs_once_per_step_and_keeps_the_error_it_saw() {
        let dir = tempfile::tempdir().unwrap();
        let step = STEP_BYTES_MIN;
        let (mut f, vfs, control) = flusher(step);
        let file = dir.path().join("segment");
        write(&*vfs, &file);
        f.journal_grew_to(step / 2);
        f.journal_grew_to(step - 1);
        f.checker().check().unwrap();
        assert_eq!(control.syncs(), 0, "below the first step");
        f.journal_grew_to(step);
        wait_for("one background sync", || control.syncs() == 1);
        write(&*vfs, &file);
        f.journal_grew_to(step + step / 2);
        f.journal_grew_to(2 * step - 1);
        f.journal_grew_to(3 * step + 5); // several steps at once: one sync
        wait_for("a second background sync", || control.syncs() == 2);
        f.journal_restarted();
        f.journal_grew_to(step - 1);
        write(&*vfs, &file);
        control.fail_syncs.store(true, Ordering::SeqCst);
        f.journal_grew_to(step);
        wait_for("the failed sync to be kept", || {
            f.checker().check().is_err()
        });
        let err = f.checker().check().unwrap_err();
        assert!(err.to_string().contains("background sync failed"), "{err}");
        assert!(err.to_string().contains("segment"), "names the file: {err}");
        drop(f); // joins the thread
    }

    #[test]
    fn check_waits_for_a_sync_under_way_and_sees_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let step = STEP_BYTES_MIN;
        let (mut f, vfs, control) = flusher(step);
        write(&*vfs, &dir.path().join("segment"));
        control.hold_syncs.store(true, Ordering::SeqCst);
        f.journal_grew_to(step);
        wait_for("the background sync to start", || {
            control.syncs_held.load(Ordering::SeqCst) == 1
        });
        // It will fail once released, after check() has started waiting.
        control.fail_syncs.store(true, Ordering::SeqCst);
        let release = {
            let control = control.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                control.hold_syncs.store(false, Ordering::SeqCst);
            })
        };
        let err = f.checker().check().unwrap_err();
        assert!(err.to_string().contains("background sync failed"), "{err}");
        release.join().unwrap();
    }
}
