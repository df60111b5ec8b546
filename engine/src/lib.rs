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

mod apply;
mod catalog;
mod checkpoint;
mod checkpointer;
mod codec;
mod commit;
pub mod config;
mod cursors;
mod dedup;
mod engine;
pub mod error;
#[doc(hidden)]
mod flusher;
pub mod fuzz_targets;
mod group;
mod group_log;
mod index;
pub mod io;
mod journal;
mod member_snapshot;
mod membership;
#[cfg(test)]
mod model_tests;
pub mod power_cut;
mod read_counts;
pub mod record;
mod recovery;
pub mod retention;
mod segment;
mod segment_cache;
#[cfg(test)]
mod spec_vectors;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tidemark_tests;
mod tidemarks;
mod warn_limit;

pub use config::{Config, FsyncPolicy};
pub use engine::{
    AppendRequest, Appended, CommitNotice, Engine, EngineStats, GroupAppend, OpTicket, Ticket,
};
pub use error::{Error, Result, DAMAGED_GROUP_HINT};
pub use group_log::{Chunk, ReadBatch};
pub use recovery::RecoveryReport;
pub use retention::Retention;
pub use tidemarks::{
    direct_group_id, AckOutcome, History, JoinStart, MembersVersion, Pull, Sync, SyncGroup, Unread,
};

/// Wall-clock milliseconds since the Unix epoch (0 if the clock is before
/// it): record timestamps, checkpoint and segment creation times.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
