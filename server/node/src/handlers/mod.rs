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
//! (what a handled request asks of the loop). This file holds the
//! dispatch: which handler answers each request ([`dispatch`]).
//!
//! Everything here runs on the event loop thread and never waits: a
//! durable operation comes back as a [`Parked`] request answered when its
//! commit round settles, a PULL that found nothing as a [`LongPoll`].
//! Which requests go through the handshake gate and the in-flight limit,
//! and what a request does to its connection, is the connection's business
//! (`connection.rs`); the handlers see only the engine, the limits and the
//! node's indexes. Nothing here imports the connection or the loop.

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

// What the connection, the loop and STATS call besides the dispatch.
pub use action::{Action, LongPoll, OpKind, Parked, Report};
pub use admin::{cluster_change, info, not_leader, slowlog, stats, wrong_set};
pub use context::Ctx;
pub use handshake::{auth, hello};
pub use membership::members_page_max;
pub use reads::batch_ack_items_max;
pub use subscriptions::{push, resync_all, subscribe, subscribe_receipts, unsubscribed};

use tidemark_engine::{Change, Error as EngineError};
use tidemark_protocol::{Request, RetentionPolicy, Subscription};

/// Where [`dispatch`] sent a request.
pub enum Route<'q> {
    /// Answered from what the node itself holds, not from the engine's
    /// replicated state (PING, STATS, INFO, SLOWLOG, BACKUP, CLUSTER,
    /// CLUSTER_MAP, CLUSTER_CHANGE): the action goes to the loop as it is.
    Node(Action),
    /// Run on the engine: its outcome, which on a replica set member the
    /// connection holds for the cursor round and the read confirmation
    /// (format-spec/cluster.md section 5).
    Engine(Result<Action, EngineError>),
    /// A request whose effect is on its connection's own state: the
    /// connection runs it.
    Connection(OwnRequest<'q>),
}

/// The requests that change their connection's own state: HELLO and AUTH
/// (its phase and protocol version, format-spec/protocol.md 1.7),
/// SUBSCRIBE, SUBSCRIBE_RECEIPTS and UNSUBSCRIBE (its subscriptions).
/// It borrows what it carries from the decoded request.
pub enum OwnRequest<'q> {
    Hello { min_version: u8, max_version: u8 },
    Auth { token: &'q [u8] },
    Subscribe(&'q Subscription),
    SubscribeReceipts { sender: u64, groups: &'q [u64] },
    Unsubscribe,
}

/// Sends a request that passed its connection's gates (shutdown, the
/// handshake, the shard and leader gates, the in-flight limit) to the
/// handler of its family. The request is borrowed where its frame was
/// decoded: what a handler needs is read from there, never moved
/// (a request is as large as its largest kind).
pub fn dispatch<'q>(ctx: &mut Ctx<'_>, id: u64, req: &'q Request<'_>) -> Route<'q> {
    let result = match *req {
        Request::Hello {
            min_version,
            max_version,
            ..
        } => {
            return Route::Connection(OwnRequest::Hello {
                min_version,
                max_version,
            })
        }
        Request::Auth { token } => return Route::Connection(OwnRequest::Auth { token }),
        Request::Subscribe(ref sub) => return Route::Connection(OwnRequest::Subscribe(sub)),
        Request::SubscribeReceipts { sender, ref groups } => {
            return Route::Connection(OwnRequest::SubscribeReceipts { sender, groups })
        }
        Request::Unsubscribe => return Route::Connection(OwnRequest::Unsubscribe),
        Request::Ping => return Route::Node(Action::Answer(handshake::ping(id))),
        Request::Cluster => return Route::Node(Action::Answer(admin::cluster(ctx, id))),
        Request::ClusterMap => return Route::Node(Action::Answer(admin::cluster_map(ctx, id))),
        Request::ClusterChange(change) => {
            return Route::Node(admin::begin_cluster_change(ctx, id, change))
        }
        Request::Stats => return Route::Node(Action::Report(Report::Stats)),
        Request::Info => return Route::Node(Action::Report(Report::Info)),
        Request::SlowLog { reset, max_count } => {
            return Route::Node(Action::Report(Report::SlowLog { reset, max_count }))
        }
        Request::Backup => return Route::Node(Action::Backup),
        Request::CreateGroup { group } => membership::create_group(ctx, group),
        Request::DeleteGroup { group } => membership::delete_group(ctx, group),
        Request::Join { group, user, start } => membership::join(ctx, group, user, start),
        Request::Leave { group, user } => membership::leave(ctx, group, user),
        Request::SetRetention {
            group,
            by_cursor,
            max_age_ms,
            max_bytes,
        } => {
            let policy = RetentionPolicy {
                by_cursor,
                max_age_ms,
                max_bytes,
            };
            admin::set_retention(ctx, group, policy)
        }
        Request::ClearHistory { group, user, up_to } => {
            admin::clear_history(ctx, group, user, up_to)
        }
        Request::Send {
            group,
            sender,
            client_msg_id,
            payload,
        } => sends::send(ctx, id, group, sender, client_msg_id, payload),
        Request::Recall {
            group,
            sender,
            client_msg_id,
            target,
        } => sends::change(
            ctx,
            id,
            group,
            sender,
            client_msg_id,
            target,
            Change::Recall,
        ),
        Request::Edit {
            group,
            sender,
            client_msg_id,
            target,
            payload,
        } => {
            let change = Change::Edit(payload);
            sends::change(ctx, id, group, sender, client_msg_id, target, change)
        }
        Request::Pull {
            group,
            user,
            ack_up_to,
            max_count,
            max_bytes,
            wait_ms,
        } => reads::pull(
            ctx, id, group, user, ack_up_to, max_count, max_bytes, wait_ms,
        ),
        Request::Ack {
            group,
            user,
            msg_id,
        } => reads::ack(ctx, id, group, user, msg_id).map(Action::Answer),
        Request::BatchAck { user, ref items } => {
            reads::batch_ack(ctx, id, user, items).map(Action::Answer)
        }
        Request::Unread { user } => reads::unread(ctx, id, user).map(Action::Answer),
        Request::Sync {
            user,
            per_group_max,
            total_max_bytes,
            continuation,
        } => reads::sync(ctx, id, user, per_group_max, total_max_bytes, continuation)
            .map(Action::Answer),
        Request::History {
            group,
            user,
            before_msg_id,
            max_count,
        } => reads::history(ctx, id, group, user, before_msg_id, max_count).map(Action::Answer),
        Request::HistoryLatest {
            group,
            user,
            before_msg_id,
            max_count,
        } => reads::history_latest(ctx, id, group, user, before_msg_id, max_count)
            .map(Action::Answer),
        Request::ReadCount { group, msg_id } => {
            reads::read_count(ctx, id, group, msg_id).map(Action::Answer)
        }
        Request::Readers {
            group,
            msg_id,
            after_user,
            max_count,
        } => reads::readers(ctx, id, group, msg_id, after_user, max_count).map(Action::Answer),
        Request::Members {
            group,
            after_user,
            max_count,
        } => membership::members(ctx, id, group, after_user, max_count).map(Action::Answer),
        Request::GroupInfo { group } => membership::group_info(ctx, id, group).map(Action::Answer),
    };
    Route::Engine(result)
}
