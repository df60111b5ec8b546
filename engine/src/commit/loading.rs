//! Whether the saved state is still being registered after the engine
//! opened (`state/lazy.rs` registers it; format-spec/storage.md section 11,
//! "Loading in the background"), for the requests and threads that need
//! every group: the flag they read, the wait, and their refusal meanwhile.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result, STATE_TICKET};

/// Why a load stopped, as `Error::Corrupt` says it: path, group, offset,
/// reason.
type Failure = (PathBuf, Option<u64>, u64, String);

/// Whether the checkpoint's state is still loading, for the engine's
/// requests and threads. One owner: the loader thread ends it.
#[derive(Default)]
pub(crate) struct LoadStatus {
    loading: AtomicBool,
    /// The loader stopped at damage (or panicked): waiters go on and get
    /// this error.
    failed: Mutex<Option<Failure>>,
    /// Ask the loader to stop between batches (a simulated crash).
    stop: AtomicBool,
    ended: Mutex<()>,
    ended_cv: Condvar,
}

impl LoadStatus {
    pub(crate) fn loading(&self) -> bool {
        self.loading.load(Ordering::Acquire)
    }

    /// Requests waiting for the whole state may run (again): the load
    /// ended, or stopped at damage (they then get its error).
    pub(crate) fn settled(&self) -> bool {
        !self.loading() || self.failed.lock().is_some()
    }

    /// Why the load stopped, if it did.
    pub(crate) fn failure(&self) -> Option<Error> {
        let failed = self.failed.lock();
        let (path, group, offset, reason) = failed.as_ref()?;
        Some(Error::Corrupt {
            path: path.clone(),
            group: *group,
            offset: *offset,
            reason: reason.clone(),
        })
    }

    /// Blocks until [`LoadStatus::settled`].
    pub(crate) fn wait_settled(&self) {
        let mut g = self.ended.lock();
        while !self.settled() {
            self.ended_cv.wait(&mut g);
        }
    }

    /// The loader ended: done (`None`), or stopped at `failed` (then the
    /// state stays loading: what needs all of it gets the error).
    /// `state_dir` names the failure when it is not `Error::Corrupt`.
    pub(crate) fn end(&self, failed: Option<&Error>, state_dir: PathBuf) {
        let _g = self.ended.lock();
        match failed {
            None => self.loading.store(false, Ordering::Release),
            Some(Error::Corrupt {
                path,
                group,
                offset,
                reason,
            }) => *self.failed.lock() = Some((path.clone(), *group, *offset, reason.clone())),
            Some(other) => *self.failed.lock() = Some((state_dir, None, 0, other.to_string())),
        }
        self.ended_cv.notify_all();
    }

    /// Asks a running loader to stop at its next batch.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the loader was asked to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// A load starts (before the engine's threads do).
    pub(crate) fn start(&self) {
        self.loading.store(true, Ordering::Release);
    }
}

/// The process's hook told when a background load starts (`true`) and
/// when its loader thread ends (`false`), however it ends: the binary
/// tunes its allocator meanwhile (a load frees and takes pages again at a
/// high rate). Process-wide, as the allocator is; loads of several
/// engines overlap, so the hook counts them.
static LOADING_HOOK: std::sync::OnceLock<fn(bool)> = std::sync::OnceLock::new();

/// Sets the hook told when a background load of the saved state starts
/// (`true`) and ends (`false`); once per process (`false` if one was set
/// already). It runs on the engine's threads and must not block.
pub fn set_loading_hook(hook: fn(bool)) -> bool {
    LOADING_HOOK.set(hook).is_ok()
}

/// A background load in progress, for the hook: told `true` when made,
/// `false` when dropped (the loader thread holds it; a panic drops it
/// too).
pub(crate) struct LoadingHint(());

impl LoadingHint {
    pub(crate) fn start() -> LoadingHint {
        if let Some(hook) = LOADING_HOOK.get() {
            hook(true);
        }
        LoadingHint(())
    }
}

impl Drop for LoadingHint {
    fn drop(&mut self) {
        if let Some(hook) = LOADING_HOOK.get() {
            hook(false);
        }
    }
}

/// `Err` for a request that needs every group or every membership of a
/// user while the state loads: `NotReady` with [`STATE_TICKET`], or the
/// load's own error if it stopped at damage.
pub(crate) fn whole_state(load: &LoadStatus) -> Result<()> {
    if !load.loading() {
        return Ok(());
    }
    match load.failure() {
        Some(e) => Err(e),
        None => Err(Error::NotReady {
            group: 0,
            ticket: STATE_TICKET,
        }),
    }
}
