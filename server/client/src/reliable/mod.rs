//! The client library's reliability layer, over the one-connection
//! [`Client`](crate::Client): no loss, no duplicates, end to end.
//!
//! - [`ReliableClient`] (sender side, and every other request): connects
//!   lazily, reconnects with exponential backoff, and keeps each SEND in a
//!   pending queue, keyed by its `client_msg_id`, until the node answers.
//!   A send whose connection failed, or that stayed unanswered for
//!   `send_timeout_ms`, is retransmitted on a new connection with the
//!   **same** `client_msg_id`: the node's idempotent send stores it once and
//!   answers the copy with the original `msg_id` (`duplicate = true`).
//! - [`Inbox`] (receiver side, one per user): a subscription iterator over
//!   pushes, paged pulls whose next request carries the ACK of the previous
//!   page (`ack_up_to`), a [`DedupFilter`] so that a message delivered twice
//!   (push then pull, a push repeated on a new connection, a re-pull after a
//!   lost ACK) reaches the application once, and a [`BatchAcker`] that
//!   acknowledges after N messages or T milliseconds, whichever comes
//!   first, and on close.
//! - [`Receipts`] (sender side, the seeds' `ack:N`): the delivery state of
//!   the application's own messages, from RECEIPT and RECEIPT_COUNTS
//!   pushes, with READERS and READ_COUNT pulls as the truth after every
//!   (re)subscription.
//! - Every record's CRC is verified before a message reaches the
//!   application (a mismatch is [`Error::Crc`]); every wire error code has
//!   its own [`Error`] variant; nothing the node sends makes this code panic.
//!
//! What "exactly once" means here: within one `Inbox` (or across restarts,
//! if the application persists [`Inbox::marks`] with what it processed and
//! passes them to [`Inbox::with_marks`]), each `(group, msg_id)` is returned
//! once, and ids of a group are returned in ascending order without gaps
//! from the member's cursor on. A sender's message is stored once as long as
//! its retransmits reach the node within the node's dedup window (ten
//! minutes by default; `give_up_after_ms` is far below it).

mod acker;
mod dedup;
mod error;
mod inbox;
mod link;
mod receipts;
mod router;
mod sender;

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

pub use acker::BatchAcker;
pub use dedup::{DedupFilter, Verdict};
pub use error::{Ctx, Error};
pub use inbox::{Inbox, InboxStats, Latest, Messages, Pulled, PUSH_POLL_SLICE};
pub use link::LinkStats;
pub use receipts::{Delivery, Receipts, ReceiptsStats, TRACKED_PER_GROUP_MAX};
pub use sender::{ReliableClient, SendOutcome, SenderStats};

use crate::client::ClientConfig;

/// How the reliable client behaves. Every field has a default
/// ([`ReliableConfig::new`]).
#[derive(Clone, Debug)]
pub struct ReliableConfig {
    /// Address, token and client name; its `io_timeout` bounds every request
    /// except SEND (a long poll adds its own wait).
    pub client: ClientConfig,
    /// A SEND unanswered this long: the connection is presumed stalled, the
    /// client drops it, reconnects and retransmits every pending send with
    /// its `client_msg_id`. Default 5000.
    pub send_timeout_ms: u64,
    /// First reconnect delay; it doubles per failure. Default 20.
    pub backoff_base_ms: u64,
    /// Largest reconnect delay. Default 2000.
    pub backoff_max_ms: u64,
    /// An operation that could not complete for this long fails with
    /// [`Error::Unavailable`] (or the node's last refusal). Default 60000.
    pub give_up_after_ms: u64,
    /// SENDs pipelined on one connection (also bounded by the node's
    /// `requests_in_flight_max`). Default 32.
    pub sends_in_flight_max: usize,
    /// Batch ACK: acknowledge after this many delivered messages... Default 100.
    pub ack_every_messages: u32,
    /// ...or this long after the oldest unacknowledged one. Default 1000.
    pub ack_every_ms: u64,
    /// Records per PULL page. Default 200.
    pub page_messages_max: u32,
    /// An idle subscription pings the node this often to notice a dead
    /// connection. Default 5000.
    pub heartbeat_ms: u64,
    /// The other members' client addresses when the node is a member of a
    /// replica set: tried in turn when the node cannot be reached. A
    /// NOT_LEADER answer is followed to the leader (CLUSTER names it,
    /// format-spec/protocol.md 4.31-4.32) without this list, which then
    /// becomes the members CLUSTER answered. Default empty.
    pub members: Vec<String>,
}

impl ReliableConfig {
    pub fn new(addr: impl Into<String>) -> ReliableConfig {
        ReliableConfig::with_client(ClientConfig::new(addr))
    }

    pub fn with_client(client: ClientConfig) -> ReliableConfig {
        ReliableConfig {
            client,
            send_timeout_ms: 5_000,
            backoff_base_ms: 20,
            backoff_max_ms: 2_000,
            give_up_after_ms: 60_000,
            sends_in_flight_max: 32,
            ack_every_messages: 100,
            ack_every_ms: 1_000,
            page_messages_max: 200,
            heartbeat_ms: 5_000,
            members: Vec::new(),
        }
    }

    pub(crate) fn give_up_after(&self) -> Duration {
        Duration::from_millis(self.give_up_after_ms)
    }
}

/// Assigns `client_msg_id`s: a random 32-bit prefix per instance and a
/// 32-bit counter, so two instances (two processes, or a restart) of the
/// same sender do not reuse each other's ids (a collision needs the same
/// random prefix: 1 in 2^32 per pair) and one instance never repeats one.
#[derive(Clone, Debug)]
pub struct ClientMsgIds {
    prefix: u32,
    counter: u32,
}

impl ClientMsgIds {
    pub fn new() -> ClientMsgIds {
        ClientMsgIds {
            prefix: random_prefix(),
            counter: 0,
        }
    }

    pub fn next_id(&mut self) -> u64 {
        if self.counter == u32::MAX {
            self.prefix = random_prefix();
            self.counter = 0;
        }
        self.counter += 1;
        (u64::from(self.prefix) << 32) | u64::from(self.counter)
    }
}

impl Default for ClientMsgIds {
    fn default() -> Self {
        ClientMsgIds::new()
    }
}

fn random_prefix() -> u32 {
    loop {
        let p = (random_u64() >> 32) as u32;
        if p != 0 {
            return p;
        }
    }
}

/// 64 random bits from the standard library's randomly keyed hasher, mixed
/// with the time and the process id (no dependency on a PRNG crate).
/// Public for `tidemark demo`, which draws a shared node's fresh ids here.
pub fn random_u64() -> u64 {
    let mut h = RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_msg_ids_are_unique_within_and_across_instances() {
        let mut a = ClientMsgIds::new();
        let mut b = ClientMsgIds::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            assert!(seen.insert(a.next_id()));
            assert!(seen.insert(b.next_id()));
        }
        let mut c = ClientMsgIds {
            prefix: 9,
            counter: u32::MAX - 1,
        };
        let last = c.next_id();
        let wrapped = c.next_id();
        assert_eq!(last, (9 << 32) | u64::from(u32::MAX));
        assert_ne!(wrapped >> 32, 9, "a new prefix after 2^32 ids");
    }
}
