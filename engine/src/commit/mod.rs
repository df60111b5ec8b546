//! The write path (format-spec/storage.md sections 5 and 7): the commit
//! journal and its frames and entries, the commit thread (rounds: journal
//! write, sync, then `apply`), the one applier of entries shared with
//! replay, the send path's dedup windows, replication of rounds (and the
//! round gate a Raft layer holds a leader's rounds at), and the background
//! write-back ahead of checkpoints; the locks the commit thread shares
//! with the senders are `SleepMutex`es (`src/sleep_lock.rs`).

pub(crate) mod apply;
pub(crate) mod capture;
pub(crate) mod change_intake;
pub(crate) mod context;
mod cursor_rows;
pub(crate) mod dedup;
pub(crate) mod dirty;
pub(crate) mod flusher;
pub(crate) mod gate;
#[cfg(test)]
mod gate_tests;
pub(crate) mod journal;
#[cfg(test)]
pub(crate) mod journal_crash_tests;
pub(crate) mod loading;
mod replicate;
#[cfg(test)]
pub(crate) mod replicate_tests;
pub(crate) mod small_log;
pub(crate) mod thread;
mod warn_limit;
pub(crate) mod worker_jobs;
