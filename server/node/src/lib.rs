//! tidemark-node: the network side of a tidemark node over the engine.
//!
//! One thread runs a mio event loop over the listener, the connections and
//! a waker; every request is a memory operation on the engine, and what
//! must wait for a commit round, a long poll or the engine's maintenance
//! worker is parked and finished when the commit thread's listener wakes
//! the loop. The wire format is the `tidemark-protocol` codec.
//!
//! The API is what the `tidemark` binary needs to run a node: a
//! [`NodeConfig`] (the engine's config, the listen address, the token,
//! the node's [`Limits`] and its [`SendPolicy`]), the limits' [`defaults`] and fixed values,
//! [`serve`], and the [`Shutdown`] handle it hands out once the node
//! accepts connections (which also hands it new [`LiveLimits`]). The modules are private:
//!
//! - `config`: the node's limits, their defaults and the checks between
//!   them and the engine's;
//! - `event_loop`: the loop, accept, fair bounded turns, buffer budgets,
//!   parked requests, push, long polls, shutdown; it moves bytes and does
//!   what each connection's `Action` says, never parsing a frame;
//! - `connection`: one connection as a state machine, sans IO: decoder,
//!   output, handshake gate, in-flight limit, ordering, closing and fatal,
//!   its subscriptions;
//! - `handlers`: one function per opcode, a file per request family,
//!   request -> engine call -> response, never waiting; the dispatch of a
//!   request to its handler;
//! - `outgoing`: a frame as the loop sends it and the builders of
//!   responses and ERROR frames that every module shares;
//! - `conn_id`: a connection's name, shared by the loop, the connections,
//!   the handlers and the indexes;
//! - `long_poll`: parked long polls by group and by deadline;
//! - `subscriptions`: who gets pushes;
//! - `stats`: the counters and latency histograms of STATS, the names of
//!   STATS and INFO;
//! - `slowlog`: the last slow requests, for SLOWLOG;
//! - `log_limit`: token buckets that keep event lines (accepts, closes,
//!   authentication failures, protocol errors) from flooding the log;
//! - `host`: the background refresher of disk and memory figures;
//! - `metrics`: `--metrics-listen`, the figures in the Prometheus text
//!   format over HTTP on their own thread;
//! - `durations`: request durations in the fixed buckets of the
//!   `/metrics` histogram;
//! - `process`: the standard `process_*` series, read from `/proc`;
//! - `receipts`: who gets receipts, what moved since the last flush, the
//!   RECEIPT and RECEIPT_COUNTS frames;
//! - `backup`: BACKUP, a snapshot of the engine streamed by a backup
//!   thread through a bounded channel.

mod backup;
mod config;
mod conn_id;
mod connection;
#[cfg(test)]
mod cursor_hold_tests;
mod durations;
mod event_loop;
mod handlers;
mod host;
mod log_limit;
mod long_poll;
mod metrics;
mod outgoing;
mod process;
mod receipts;
mod shards;
mod slowlog;
mod stats;
mod subscriptions;

pub use config::{
    defaults, Build, ChangeDone, ChangeOutcome, ChangeRequest, ClusterView, LeaderGate, Leadership,
    Limits, LiveLimits, NodeConfig, NotLeader, RaftFigures, RaftInboundFigures, RaftPeerFigures,
    SendPolicy, FRAMES_PER_PASS_MAX, INPUT_BYTES_FREE, RAFT_PROGRESS_STATES, RAFT_ROLES,
    READ_BYTES_PER_PASS_MAX,
};
pub use event_loop::{serve, serve_engine, Shutdown};
pub use metrics::{prometheus_series, served_as, stat_kind};
pub use receipts::RECENT_SENDS_MAX;
pub use shards::{ClusterShards, SetMembers, WrongSet};
pub use stats::parse_raft_figures;
