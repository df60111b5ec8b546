//! tidemark-cluster: replication of a tidemark node with Raft
//! (format-spec/cluster.md, ARCHITECTURE.md "Replication").
//!
//! A [`Replica`] drives raft-rs (`raft` 0.7, synchronous and tick-driven)
//! from a thread of its own, keeps the Raft log durable in its own file
//! ([`raft_log`]) and uses the engine as the state machine of committed
//! rounds: a leader's rounds pass the engine's round gate (they are
//! written only once committed), a follower's arrive through
//! `Engine::try_append_replicated`. The transport is the caller's
//! ([`Transport`], [`Mailbox`]); [`tcp`] is the one between nodes
//! (cluster.md section 7), each of whose connections opens with the
//! [`peer_auth`] handshake over the members' shared secret. The Raft log
//! is bounded by compaction, and a follower that needs compacted entries
//! gets a [`snapshot`] of the leader's engine (cluster.md sections 3.5
//! and 8). Its [`health`] (role, term, indexes, each follower's
//! progress, counters) is published by the driver once per turn for
//! operators. No async runtime anywhere.

mod error;
#[cfg(any(test, feature = "testing"))]
pub mod fuzz_targets;
pub mod health;
mod le;
pub mod members;
#[cfg(test)]
mod members_tests;
pub mod peer_auth;
#[cfg(test)]
mod peer_auth_tests;
pub mod raft_log;
#[cfg(test)]
mod raft_log_compaction_tests;
pub mod raft_log_format;
#[cfg(test)]
mod raft_log_tests;
pub mod reads;
mod replica;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod sim_tests;
pub mod snapshot;
#[cfg(test)]
mod snapshot_tests;
pub mod tcp;
#[cfg(test)]
mod tcp_tests;

pub use error::{ClusterError, Result};
pub use health::{Counters, Health, NodeRole, PeerHealth, Progress};
pub use raft::eraftpb::Message;
pub use replica::{
    Mailbox, Replica, ReplicaConfig, Transport, INPUTS_PER_TURN, RAFT_LOG_MAX_BYTES_DEFAULT,
};
