//! What a handler may use ([`Ctx`]): the engine, the node's limits and
//! policies, the node's subscription and receipt indexes, and the
//! connection's id and protocol version.

use tidemark_engine::Engine;

use crate::config::{Limits, SendPolicy};
use crate::conn_id::ConnId;
use crate::receipts::Receipts;
use crate::subscriptions::Subscriptions;

/// What a handler may use.
pub struct Ctx<'a> {
    pub engine: &'a Engine,
    pub limits: &'a Limits,
    /// Who may SEND (4.9).
    pub sends: &'a SendPolicy,
    pub token: Option<&'a [u8]>,
    /// The node is shutting down: every request is answered SHUTTING_DOWN.
    pub shutting_down: bool,
    /// The node's index of subscriptions and this connection's id in it:
    /// SUBSCRIBE and UNSUBSCRIBE change the connection's own list (the
    /// truth) and this index (derived from the lists) together.
    pub subs: &'a mut Subscriptions<ConnId>,
    /// The node's receipt subscriptions: the ACK paths report the cursors
    /// they move in watched groups (4.22).
    pub receipts: &'a mut Receipts<ConnId>,
    pub conn: ConnId,
    /// The connection's protocol version (1 until HELLO chose one): how
    /// records are shown to it (`Engine::present`).
    pub version: u8,
    /// A replica set member's leader gate (4.31); `None` on a single node.
    pub leadership: Option<&'a dyn crate::config::Leadership>,
    /// The cluster map (4.33); `None` when the node owns every shard.
    pub shards: Option<&'a crate::shards::ClusterShards>,
}

impl Ctx<'_> {
    /// The member's cursor before an ACK, when its group's receipts are
    /// watched (one lookup; nothing otherwise).
    pub fn cursor_before(&self, group: u64, user: u64) -> Option<u64> {
        if !self.receipts.watches(group) {
            return None;
        }
        self.engine.try_cursor(group, user).ok()
    }

    /// Reports the cursor an ACK left if it moved from `before`.
    pub fn report_move(&mut self, group: u64, user: u64, before: Option<u64>, after: u64) {
        if before.is_some_and(|b| after > b) {
            self.receipts.moved(self.engine, group, user, after);
        }
    }
}

/// Anyone may send: the policy [`Ctx::for_tests`] starts with.
#[cfg(test)]
static ANYONE: SendPolicy = SendPolicy::anyone();

#[cfg(test)]
impl<'a> Ctx<'a> {
    /// What a READY connection hands a handler in a unit test: connection
    /// 0 of generation 0, protocol version 1 (a connection sets its own
    /// when it handles a request), anyone may send, no token, not shutting
    /// down, a single node owning every shard. A test changes the fields
    /// it is about with struct update syntax.
    pub fn for_tests(
        engine: &'a Engine,
        limits: &'a Limits,
        subs: &'a mut Subscriptions<ConnId>,
        receipts: &'a mut Receipts<ConnId>,
    ) -> Ctx<'a> {
        Ctx {
            engine,
            limits,
            sends: &ANYONE,
            token: None,
            shutting_down: false,
            subs,
            receipts,
            conn: ConnId {
                index: 0,
                generation: 0,
            },
            version: 1,
            leadership: None,
            shards: None,
        }
    }
}
