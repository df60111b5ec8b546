//! tidemark-server: the network side of the tidemark node.
//!
//! [`protocol`] is the binary wire protocol as a sans-IO codec: it turns
//! bytes into frames and frames into bytes and knows nothing of sockets or
//! of the engine (format-spec/protocol.md is its specification).

pub mod bench;
pub mod cli;
pub mod client;
pub mod config;
pub mod connection;
pub mod demo;
pub mod event_loop;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod fuzz_targets;
pub mod handlers;
pub mod long_poll;
pub mod protocol;
pub mod reliable;
pub mod stats;
pub mod subscriptions;
