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
//! fault-injecting file layers (`io::FaultyVfs`, `io::power_cut`),
//! `Engine::open_with_vfs`, `Engine::simulate_crash`, `Engine::hold_load`
//! (a background load held, for tests of what runs while it is pending),
//! the fuzz target bodies (`fuzz_targets`), and public `io` and `record`
//! modules. The
//! workspace's tests and benches and `fuzz/` enable it; a release build of
//! the node never does, so it contains no fault injection.

// The engine's files by subsystem (ARCHITECTURE.md has the codemap): the
// facade and what every subsystem shares at the top, then `logs` (where a
// group's records live), `members` (memberships and tidemarks), `commit`
// (the journal, rounds and their one applier), `state` (checkpoints and
// recovery), `io` (the file layer) and `offline` (a stopped node's
// directory: inspect, verify, repair, for `tidemark ctl`).
#[cfg(test)]
mod adopted_segment_tests;
mod catalog;
mod clock;
#[cfg(test)]
mod cold_erasure_tests;
mod commit;
mod config;
#[cfg(test)]
mod disk_full_tests;
mod edits;
#[cfg(test)]
mod edits_tests;
mod engine;
#[cfg(test)]
mod erasure_edge_tests;
#[cfg(test)]
mod erasure_tests;
mod error;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod fuzz_targets;
mod group;
#[cfg(test)]
mod segment_erasure_tests;
mod sleep_lock;
// The file layer and the record layout are internals; tests, benches and
// fuzz targets (the `testing` feature) reach into them to build fault
// injection and raw images, so only they see them as public.
#[cfg(any(test, feature = "testing"))]
pub mod io;
#[cfg(not(any(test, feature = "testing")))]
mod io;
mod limits;
mod logs;
mod members;
#[cfg(test)]
mod model_tests;
mod offline;
#[cfg(test)]
mod ops_stats_tests;
mod ready;
#[cfg(test)]
mod ready_tests;
#[cfg(test)]
mod retention_race_tests;
#[cfg(test)]
mod shared_file_tests;
pub mod sizing;
mod space;
#[cfg(test)]
mod spec_vectors;
mod state;
#[cfg(test)]
mod tests;
mod worker;

#[cfg(any(test, feature = "testing"))]
pub use logs::record;

pub use commit::gate::RoundGate;
pub use commit::journal::journal_dir;
pub use commit::journal::rounds::RoundPayload;
pub use commit::loading::set_loading_hook;
pub use config::{defaults, Config, FsyncPolicy};
pub use edits::{Change, ChangeRequest, LatestPage, FLAG_EDITED, FLAG_RECALLED};
pub use engine::{
    AppendRequest, Appended, CommitNotice, Engine, EngineStats, GroupAppend, OpTicket, Ticket,
};
pub use error::STATE_TICKET;
pub use error::{ChangeRefusal, Error, Result, DAMAGED_GROUP_HINT};
pub use io::{raise_open_file_limit, FD_RESERVE};
pub use logs::group_log::{Chunk, ReadBatch};
pub use logs::retention::Retention;
pub use members::tidemarks::{
    direct_group_id, AckMove, AckOutcome, GroupInfo, History, JoinStart, MembersPage,
    MembersVersion, Pull, Sync, SyncGroup, Unread,
};
pub use offline::{
    member_engine, DataDir, Dump, DumpRecord, Finding, Inspection, JournalDump, JournalFrame,
    ManifestInfo, Member, OfflineGroup, Reading, RecordShape, RepairPlan, RepairTarget, Verified,
    VerifyProgress,
};
pub use state::recovery::RecoveryReport;
pub use state::snapshot::{Snapshot, SnapshotFile, SnapshotInfo, SnapshotReader};
