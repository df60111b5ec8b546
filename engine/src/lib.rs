//! tidemark-engine: the storage engine of tidemark, a storage node for
//! group-chat messages.
//!
//! Every group message is stored once, in its group's append-only log
//! (segment files with a sparse `msg_id` index). Appends from many threads
//! share commit rounds: one journal write and, under `fsync=always`, one
//! fdatasync per round however many groups it touched. The engine knows
//! nothing about sockets.
//!
//! Guarantees:
//! - msg_ids are per group 1, 2, 3, ... dense, in the order they were assigned;
//! - an append that returned `Ok` under `FsyncPolicy::Always` survives a
//!   crash or power loss, byte-exact; under `Never` it survives a process
//!   crash; under `Interval(d)` a power loss may lose the last `d`;
//! - a retransmit (same group, sender, client_msg_id) within the dedup
//!   window returns the original id and stores nothing, across restarts too;
//! - damage that a crash cannot explain is reported (typed error naming the
//!   file, group and offset), never skipped or served.
//!
//! Limits and their defaults are in [`Config`].
//!
//! The `testing` feature adds what only tests and fuzzing use: the
//! fault-injecting file layers (`io::FaultyVfs`, `power_cut`),
//! `Engine::open_with_vfs`, `Engine::simulate_crash`, the fuzz target
//! bodies (`fuzz_targets`), and public `io` and `record` modules. The
//! workspace's tests and benches and `fuzz/` enable it; a release build of
//! the node never does, so it contains no fault injection.

mod apply;
mod catalog;
#[cfg(test)]
mod checkpoint_stats_tests;
#[cfg(test)]
mod checkpoint_tests;
mod checkpointer;
// Cold files (storage v2 S6): public for tests and the `cold_scan` fuzz
// target, like `io` and `record`.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod cold;
#[cfg(not(any(test, feature = "testing")))]
mod cold;
mod commit;
mod config;
mod cursors;
mod dedup;
mod dirty;
mod engine;
mod error;
// Small groups in shared files (storage v2, issue 12): the extent list, the
// cold file format and the reclamation planner. The cold file format and
// the planner are compiled for tests only until step S6 wires them in
// (public then, like `io` and `record`, so the `testing` build does not see
// them as dead code). The extent list is a small group's slot
// (`LogSlot::Small`, step S5); its rewrite and trim wait for S6, so they
// are allowed as dead code in a release build only.
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod extents;
#[cfg(not(any(test, feature = "testing")))]
#[allow(dead_code)]
mod extents;
mod flusher;
mod format;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod fuzz_targets;
mod group;
mod group_log;
mod index;
// The file layer and the record layout are internals; tests, benches and
// fuzz targets (the `testing` feature) reach into them to build fault
// injection and raw images, so only they see them as public.
#[cfg(any(test, feature = "testing"))]
pub mod io;
#[cfg(not(any(test, feature = "testing")))]
mod io;
mod journal;
#[cfg(test)]
mod journal_crash_tests;
mod membership;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod ops_stats_tests;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod power_cut;
mod read_counts;
mod ready;
#[cfg(test)]
mod ready_tests;
// Live bytes per shared file and the compaction planner (storage v2).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod reclaim;
#[cfg(not(any(test, feature = "testing")))]
mod reclaim;
// The journal files checkpoints keep for small groups (storage v2).
mod pins;
#[cfg(any(test, feature = "testing"))]
pub mod record;
#[cfg(not(any(test, feature = "testing")))]
mod record;
mod recovery;
mod replicate;
#[cfg(test)]
mod replicate_tests;
mod retention;
#[cfg(test)]
mod retention_index_tests;
mod rewrite;
mod segment;
mod segment_cache;
// A small group's log in the shared journal files (storage v2 S5).
mod small_log;
#[cfg(test)]
mod small_log_tests;
// Reads of small groups from the shared journal files (storage v2).
mod small_read;
#[cfg(test)]
mod small_tests;
// Phase 1 of storage v2 step S4: the format and merge of incremental
// checkpoints, tested alone; the engine uses it from the next commit on.
#[cfg(test)]
mod spec_vectors;
#[allow(dead_code)]
mod state;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tidemark_tests;
mod tidemarks;
mod trash;
mod warn_limit;
mod worker;

pub use config::{defaults, Config, FsyncPolicy};
pub use engine::{
    AppendRequest, Appended, CommitNotice, Engine, EngineStats, GroupAppend, OpTicket, Ticket,
};
pub use error::{Error, Result, DAMAGED_GROUP_HINT};
pub use group_log::{Chunk, ReadBatch};
pub use io::{raise_open_file_limit, FD_RESERVE};
pub use journal::journal_dir;
pub use journal::rounds::RoundPayload;
pub use recovery::RecoveryReport;
pub use retention::Retention;
pub use tidemarks::{
    direct_group_id, AckOutcome, GroupInfo, History, JoinStart, MembersPage, MembersVersion, Pull,
    Sync, SyncGroup, Unread,
};

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before
/// it): record timestamps, checkpoint and segment creation times.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
