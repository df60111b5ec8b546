//! The next journal file, created ahead of time on a thread of its own:
//! a roll on the commit thread then writes the header into it and syncs
//! it, and neither creates a file nor syncs the directory (a directory
//! fsync waits behind every other metadata change of the file system,
//! and the commit thread holds every send while it waits).
//!
//! The spare is journal file `<seq>.tmj`, empty (0 bytes), its directory
//! entry durable. An empty journal file that no checkpoint names holds
//! no frame, so recovery, `ctl verify` and `ctl repair` take a spare left
//! by a crash or a shutdown for what it is (format-spec/storage.md
//! sections 5 and 11).
//!
//! Invariant: at most one spare is asked for at a time, and the commit
//! thread never creates the file it asked for itself: when it needs the
//! file before it is ready it waits for it (what a roll without a spare
//! would cost anyway), so two threads never create the same path.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::io::{OpenMode, Vfs, VfsFile};

use super::header::journal_path;

type Made = (u64, std::io::Result<Box<dyn VfsFile>>);

/// The helper thread and the spare it is making or made.
pub(crate) struct Spare {
    asks: Option<Sender<u64>>,
    made: Receiver<Made>,
    /// The sequence number of the spare asked for and not yet taken.
    asked: Option<u64>,
    /// The answer to the ask, received and not yet taken.
    ready: Option<Made>,
    thread: Option<JoinHandle<()>>,
}

impl Spare {
    /// Starts the helper thread for journal directory `dir`. Without a
    /// thread (none could be started) every roll creates its file.
    pub fn start(vfs: Arc<dyn Vfs>, dir: PathBuf) -> Spare {
        let (asks, wanted) = channel::<u64>();
        let (done, made) = channel::<Made>();
        let thread = std::thread::Builder::new()
            .name("tidemark-journal-spare".into())
            .spawn(move || {
                for seq in wanted {
                    if done.send((seq, create_empty(&*vfs, &dir, seq))).is_err() {
                        return;
                    }
                }
            })
            .ok();
        if thread.is_none() {
            log::warn!("could not start the journal spare thread; rolls create their files");
        }
        Spare {
            asks: thread.as_ref().map(|_| asks),
            made,
            asked: None,
            ready: None,
            thread,
        }
    }

    /// Asks for file `seq` to be made ready. Never blocks.
    pub fn ask(&mut self, seq: u64) {
        if self.asked.is_some() {
            return;
        }
        if let Some(asks) = &self.asks {
            if asks.send(seq).is_ok() {
                self.asked = Some(seq);
            }
        }
    }

    /// File `seq`, empty and durably named, if it was asked for (waiting
    /// for it if it is still being made); `None` if it was not or could
    /// not be made: the caller creates it.
    pub fn take(&mut self, seq: u64) -> Option<Box<dyn VfsFile>> {
        self.asked.take()?;
        // The thread answers asks in order, one at a time.
        let (made_seq, result) = match self.ready.take() {
            Some(made) => made,
            None => self.made.recv().ok()?,
        };
        if made_seq != seq {
            return None;
        }
        match result {
            Ok(file) => Some(file),
            Err(e) => {
                log::warn!("journal spare file {seq}: {e}; the roll creates the file");
                None
            }
        }
    }

    /// Waits until the spare asked for is made; whether one is (tests).
    #[cfg(test)]
    pub fn wait_ready(&mut self) -> bool {
        if self.asked.is_none() {
            return false;
        }
        if self.ready.is_none() {
            self.ready = self.made.recv().ok();
        }
        matches!(self.ready, Some((_, Ok(_))))
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        // The thread ends once it sees no more asks; joining it means no
        // file is created after the journal is gone.
        self.asks = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Creates journal file `seq` in `dir` empty (cutting any file of that
/// name, which holds no frame: it is numbered past every file replayed)
/// and makes its directory entry durable.
fn create_empty(vfs: &dyn Vfs, dir: &Path, seq: u64) -> std::io::Result<Box<dyn VfsFile>> {
    let path = journal_path(dir, seq);
    let file = vfs.open(&path, OpenMode::ReadWriteCreate)?;
    file.set_len(0)?;
    vfs.sync_dir(dir)?;
    Ok(file)
}
