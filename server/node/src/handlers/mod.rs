//! Request -> engine call -> response, one function per opcode, in one
//! file per request family (format-spec/protocol.md section 4):
//!
//! - `handshake`: HELLO, AUTH, PING;
//! - `sends`: SEND, RECALL, EDIT;
//! - `reads`: PULL, ACK, BATCH_ACK, UNREAD, SYNC, HISTORY, HISTORY_LATEST,
//!   READ_COUNT, READERS;
//! - `membership`: CREATE_GROUP, DELETE_GROUP, JOIN, LEAVE, MEMBERS,
//!   GROUP_INFO;
//! - `subscriptions`: SUBSCRIBE, SUBSCRIBE_RECEIPTS, UNSUBSCRIBE, PUSH,
//!   RESYNC;
//! - `admin`: STATS, INFO, SLOWLOG, SET_RETENTION, CLEAR_HISTORY, CLUSTER,
//!   CLUSTER_MAP, CLUSTER_CHANGE, NOT_LEADER, WRONG_SET;
//!
//! with what they share: `context` (what a handler may use) and `action`
//! (what a handled request asks of the loop). Everything here runs on the
//! event loop thread and never waits: a durable operation comes back as a
//! [`Parked`] request answered when its commit round settles, a PULL that
//! found nothing as a [`LongPoll`]. Which requests go through the handshake
//! gate and the in-flight limit, and what a request does to its connection,
//! is the connection's business (`connection.rs`); these functions see only
//! the engine and the limits.

pub mod action;
pub mod admin;
pub mod context;
pub mod handshake;
pub mod membership;
pub mod reads;
pub mod sends;
pub mod subscriptions;

#[cfg(test)]
mod cluster_map_tests;
#[cfg(test)]
mod member_tests;
#[cfg(test)]
mod tests;

pub use action::{Action, LongPoll, Parked, Report};
pub use admin::{
    clear_history, cluster, cluster_change, cluster_map, info, not_leader, set_retention, slowlog,
    stats, wrong_set,
};
pub use context::Ctx;
pub use handshake::{auth, hello, ping};
pub use membership::{
    create_group, delete_group, group_info, join, leave, members, members_page_max,
};
pub use reads::{
    ack, batch_ack, batch_ack_items_max, history, history_latest, pull, read_count, readers, sync,
    unread,
};
pub use sends::{change, send};
pub use subscriptions::{push, resync_all, subscribe, subscribe_receipts, unsubscribed};
