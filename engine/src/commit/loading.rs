//! Whether the saved state is still being registered after the engine
//! opened (`state/lazy.rs` registers it; format-spec/storage.md section 11,
//! "Loading in the background"), for the requests and threads that need
//! every group: the flag they read, the wait, and their refusal meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::catalog::Catalog;
use crate::error::{Error, Result, STATE_TICKET};

/// Whether the checkpoint's state is still loading, for the engine's
/// requests and threads. One owner: the loader thread ends it.
#[derive(Default)]
pub(crate) struct LoadStatus {
    loading: AtomicBool,
    /// The loader stopped at damage: waiters go on and get the error.
    failed: AtomicBool,
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
        !self.loading() || self.failed.load(Ordering::Acquire)
    }

    /// Blocks until [`LoadStatus::settled`].
    pub(crate) fn wait_settled(&self) {
        let mut g = self.ended.lock();
        while !self.settled() {
            self.ended_cv.wait(&mut g);
        }
    }

    /// The loader ended: done, or stopped at damage.
    pub(crate) fn end(&self, failed: bool) {
        let _g = self.ended.lock();
        if failed {
            self.failed.store(true, Ordering::Release);
        } else {
            self.loading.store(false, Ordering::Release);
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

/// `Err` for a request that needs every group or every membership of a
/// user while the state loads: `NotReady` with [`STATE_TICKET`], or the
/// load's own error if it stopped at damage.
pub(crate) fn whole_state(load: &LoadStatus, catalog: &RwLock<Catalog>) -> Result<()> {
    if !load.loading() {
        return Ok(());
    }
    let failure = catalog.read().pending().and_then(|p| p.failure());
    match failure {
        Some(e) => Err(e),
        None => Err(Error::NotReady {
            group: 0,
            ticket: STATE_TICKET,
        }),
    }
}
