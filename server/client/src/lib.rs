#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! - `client` (its items re-exported here): one TCP connection, no
//!   retries: the handshake, one method per request, pipelining
//!   (`submit` / `recv`), pushes queued as [`Event`]s, every record's CRC
//!   checked before a message reaches the caller.
//! - [`reliable`]: the reliability layer over it: reconnects with backoff,
//!   the pending queue of sends, the dedup filter and the batch ACK of
//!   [`Inbox`], and the delivery state of a sender's messages
//!   ([`Receipts`]).
//!
//! The README's example above is this crate's doctest, so it compiles with
//! every `cargo test`; the repository's README shows the same lines (a test
//! below checks that they match).

mod client;
pub mod reliable;

pub use client::{
    messages, parse_sent, Client, ClientConfig, ClientError, ClusterMap, Event, GroupState, Kind,
    Message, NodeLimits, OwnedFrame, Page, Result, Sent, SetInfo, ShardMap, SlowLogReport,
    SlowRequest,
};
pub use reliable::{Delivery, Inbox, Receipts, ReliableClient, ReliableConfig};
/// The wire codec the client speaks, for the types its requests take
/// ([`protocol::JoinStart`], [`protocol::Subscription`], ...).
pub use tidemark_protocol as protocol;

#[cfg(test)]
mod tests {
    /// The ```rust block of a markdown text, with its fence line.
    fn rust_example(markdown: &str) -> Option<&str> {
        let start = markdown.find("```rust")?;
        let len = markdown[start + 3..].find("```")? + 6;
        Some(&markdown[start..start + len])
    }

    /// The repository's README shows the example this crate's doctest
    /// compiles, line for line.
    #[test]
    fn repository_readme_shows_the_compiled_example() {
        let ours = rust_example(include_str!("../README.md")).expect("example in the crate README");
        let repo = include_str!("../../../README.md");
        assert!(
            repo.contains(ours),
            "README.md must show the client example of server/client/README.md verbatim:\n{ours}"
        );
    }
}
