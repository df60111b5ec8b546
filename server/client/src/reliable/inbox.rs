//! The receiver: one user's messages, each delivered to the application
//! once, in order per group, acknowledged in batches.
//!
//! Two ways to receive, which may be mixed:
//!
//! - **Subscription** ([`Inbox::next`], [`Inbox::messages`]): SUBSCRIBE to
//!   the user, then catch up by pulling every group the user is behind in
//!   (subscribe first, pull second, as the protocol requires). Pushes are
//!   delivered as they come. A RESYNC, a push that skips ids, a push of a
//!   group not seen yet, and a reconnect each make the inbox pull: push is
//!   an optimisation, pull is the truth.
//! - **Paged pull** ([`Inbox::pull`], [`Inbox::pull_all`]): pages of a
//!   group above the cursor; each PULL request carries, as `ack_up_to`, the
//!   newest id of that group already handed to the application.
//!
//! In a cluster of several replica sets (format-spec/protocol.md 4.33)
//! the inbox routes like [`ReliableClient`](super::ReliableClient): it
//! learns the cluster map before it subscribes (a STATS and a CLUSTER_MAP
//! per inbox; a node whose STATS lack `server.cluster_map_epoch` is one set),
//! subscribes to the user on
//! every set, pulls each group from its shard's set, asks every set for
//! the user's groups behind, and splits its BATCH_ACKs by set. Pushes of
//! several sets are waited for in turn, [`PUSH_POLL_SLICE`] on each
//! connection: a push of one set may wait that long while another set's
//! connection is watched.
//!
//! Either way every message passes the [`DedupFilter`]; what reaches the
//! application is counted by the [`BatchAcker`], which acknowledges with
//! BATCH_ACK after `ack_every_messages` messages or `ack_every_ms`, whichever
//! comes first, and on [`Inbox::close`] (and, best effort, on drop).
//!
//! Edits and recalls (protocol version 2) are records with their own ids,
//! delivered once and in order like messages (so deduplication holds for
//! them as for messages); the inbox also keeps, for every message an edit
//! or a recall it delivered names, the message's latest state
//! ([`Inbox::latest`]): one entry per changed message, kept until
//! [`Inbox::forget_changes`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::acker::BatchAcker;
use super::dedup::{DedupFilter, Verdict};
use super::error::{classify, Class, Ctx, Error};
use super::link::LinkStats;
use super::router::{Router, WRONG_SET_HOPS_MAX};
use super::ReliableConfig;
use crate::client::{later, ClientError, Event, Kind, Message};
use tidemark_protocol::{ResyncScope, Subscription};

/// With connections to several replica sets, how long the inbox waits on
/// one for a push before it looks at the next.
pub const PUSH_POLL_SLICE: Duration = Duration::from_millis(20);

/// Counters of an [`Inbox`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Messages handed to the application.
    pub delivered: u64,
    /// Messages that arrived again and were dropped by the dedup filter.
    pub duplicates_dropped: u64,
    /// Pushes that skipped ids or opened a group: the group was pulled.
    pub gaps: u64,
    /// RESYNC frames received.
    pub resyncs: u64,
    /// PULL requests that succeeded.
    pub pulls: u64,
    /// PULL requests that carried the ACK of the previous page.
    pub chained_acks: u64,
    /// BATCH_ACK requests that succeeded.
    pub batch_acks: u64,
    /// Pushes refused because a record failed its CRC (the group was pulled
    /// instead; a pull that fails its CRC is returned as [`Error::Crc`]).
    pub crc_errors: u64,
    pub link: LinkStats,
}

/// One page of [`Inbox::pull`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    /// New messages, ascending (duplicates removed).
    pub messages: Vec<Message>,
    /// The member's cursor after this request's `ack_up_to`.
    pub cursor: u64,
    pub head: u64,
    /// More messages are stored above the last one returned.
    pub has_more: bool,
}

/// A message's latest state, as the edits and recalls the inbox delivered
/// say (format-spec/protocol.md 4.28).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Latest {
    /// No edit or recall of it was delivered.
    Unchanged,
    /// Edited: its payload now (the newest edit's) and that edit's id.
    Edited { payload: Vec<u8>, edit_id: u64 },
    /// Recalled: deleted for everyone (final, whatever edits follow).
    Recalled,
}

pub struct Inbox {
    /// `(group, msg_id)` of every message a delivered edit or recall
    /// named, or delivered as recalled: its latest state.
    changes: HashMap<(u64, u64), Latest>,
    config: ReliableConfig,
    /// One link per replica set (`router.rs`).
    router: Router,
    user: u64,
    filter: DedupFilter,
    acker: BatchAcker,
    /// Accepted by the filter, not yet returned to the application.
    ready: VecDeque<Message>,
    /// Groups to pull before waiting for pushes.
    to_pull: BTreeSet<u64>,
    /// List the user's groups (UNREAD) and pull those behind.
    catch_up: bool,
    /// The application asked for pushes.
    want_pushes: bool,
    /// Per set, the connection generation on which SUBSCRIBE succeeded.
    subscribed: BTreeMap<u32, u64>,
    /// Which set's connection is waited on next.
    poll_turn: usize,
    last_traffic: Instant,
    stats: InboxStats,
    closed: bool,
}

/// Pages of ready messages held at most (across groups), so that catching
/// up on many groups pulls in steps instead of all at once.
const READY_PAGES_MAX: usize = 4;

impl Inbox {
    /// An inbox for `user`; connects on first use.
    pub fn new(config: ReliableConfig, user: u64) -> Inbox {
        Inbox::with_marks(config, user, BTreeMap::new())
    }

    /// An inbox that has already delivered, per group, every id up to the
    /// mark (what an earlier run persisted from [`Inbox::marks`]).
    pub fn with_marks(config: ReliableConfig, user: u64, marks: BTreeMap<u64, u64>) -> Inbox {
        let router = Router::new(
            config.client.clone(),
            &config.members,
            Duration::from_millis(config.backoff_base_ms),
            Duration::from_millis(config.backoff_max_ms),
        );
        let acker = BatchAcker::new(
            config.ack_every_messages,
            Duration::from_millis(config.ack_every_ms),
        );
        Inbox {
            changes: HashMap::new(),
            config,
            router,
            user,
            filter: DedupFilter::with_marks(marks),
            acker,
            ready: VecDeque::new(),
            to_pull: BTreeSet::new(),
            catch_up: false,
            want_pushes: false,
            subscribed: BTreeMap::new(),
            poll_turn: 0,
            last_traffic: Instant::now(),
            stats: InboxStats::default(),
            closed: false,
        }
    }

    pub fn user(&self) -> u64 {
        self.user
    }

    pub fn stats(&self) -> InboxStats {
        InboxStats {
            link: self.router.stats(),
            ..self.stats
        }
    }

    /// Per group, the newest id accepted: persist these with what the
    /// application processed to keep exactly-once across its restarts.
    pub fn marks(&self) -> BTreeMap<u64, u64> {
        let mut marks = self.filter.marks();
        // Accepted but not returned yet: not delivered, so not "seen".
        for m in &self.ready {
            if let Some(mark) = marks.get_mut(&m.group) {
                *mark = (*mark).min(m.msg_id.saturating_sub(1));
            }
        }
        marks
    }

    /// Cuts the connection as a network failure would (for tests and the
    /// demo). The inbox reconnects, resubscribes and catches up by itself.
    pub fn cut_connection(&mut self) {
        self.router.cut_all();
    }

    /// Subscribes now (connecting if needed) and schedules a catch-up of
    /// every group; messages then come from [`next`](Self::next).
    pub fn subscribe(&mut self) -> Result<(), Error> {
        self.want_pushes = true;
        self.ensure_subscribed()
    }

    /// The next message, waiting up to `timeout` for one; `None` if none
    /// came. Subscribes on first use. Also flushes due ACKs, and recovers
    /// from a lost connection (reconnect, resubscribe, pull what was missed;
    /// reconnecting may take up to `give_up_after_ms`).
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Message>, Error> {
        self.want_pushes = true;
        let deadline = later(Instant::now(), timeout);
        loop {
            if !self.ready.is_empty() {
                // N delivered: the batch goes out before the next message.
                self.flush_due_acks()?;
            }
            if let Some(m) = self.ready.pop_front() {
                self.delivered(&m);
                return Ok(Some(m));
            }
            self.maintain()?;
            if !self.ready.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let heartbeat = Duration::from_millis(self.config.heartbeat_ms);
            let mut wake = deadline.min(later(self.last_traffic, heartbeat));
            if let Some(d) = self.acker.deadline() {
                wake = wake.min(d);
            }
            if !self.to_pull.is_empty() {
                // A page of duplicates only moved the cursor: pull on after
                // taking what has arrived.
                wake = now;
            }
            // One set's connection this turn; with several, a slice each.
            let keys = self.router.sets();
            let key = keys[self.poll_turn % keys.len()];
            self.poll_turn = self.poll_turn.wrapping_add(1);
            let mut wait = wake.saturating_duration_since(now);
            if keys.len() > 1 {
                wait = wait.min(PUSH_POLL_SLICE);
            }
            let Some(client) = self.router.link(key).connected() else {
                continue;
            };
            match client.next_event(wait) {
                Ok(Some(Event::Push(msgs))) => {
                    self.last_traffic = Instant::now();
                    log::debug!(
                        "user {}: push of {} message(s) from {:?}",
                        self.user,
                        msgs.len(),
                        msgs.first().map(|m| (m.group, m.msg_id))
                    );
                    self.on_push(msgs);
                }
                Ok(Some(Event::Resync(scope))) => {
                    self.last_traffic = Instant::now();
                    self.stats.resyncs += 1;
                    match scope {
                        ResyncScope::Group(g) => {
                            self.to_pull.insert(g);
                        }
                        ResyncScope::All => {
                            self.subscribed.remove(&key);
                        }
                    }
                }
                // An inbox's connection never sends SUBSCRIBE_RECEIPTS, so
                // receipts do not come; were one to, it is traffic and
                // nothing else (no message, no effect on the dedup filter).
                Ok(Some(Event::Receipt { .. } | Event::ReceiptCounts { .. })) => {
                    self.last_traffic = Instant::now();
                }
                Ok(None) => {
                    if Instant::now() >= later(self.last_traffic, heartbeat) {
                        // Quiet for a while: make sure the connection lives.
                        match client.ping() {
                            Ok(()) => self.last_traffic = Instant::now(),
                            Err(_) => self.router.link(key).broken(),
                        }
                    }
                }
                Err(ClientError::Crc { group, .. }) => {
                    self.stats.crc_errors += 1;
                    self.to_pull.insert(group);
                }
                Err(e) => match classify(&e) {
                    Class::Permanent {
                        drop_connection: false,
                    } => return Err(Error::from_client(e, Ctx::user(self.user), 1)),
                    Class::Redirect => self.router.link(key).redirect(),
                    _ => self.router.link(key).broken(),
                },
            }
        }
    }

    /// Iterates over messages as they come; ends after `idle` without one.
    pub fn messages(&mut self, idle: Duration) -> Messages<'_> {
        Messages { inbox: self, idle }
    }

    /// One page of `group` above the cursor (the request acknowledges what
    /// this inbox delivered of the group before). Messages returned are
    /// delivered: they count for the batch ACK.
    pub fn pull(&mut self, group: u64) -> Result<Pulled, Error> {
        let max = self.config.page_messages_max;
        self.pull_with(group, max, 0)
    }

    /// [`pull`](Self::pull) with a page size and a long-poll wait.
    pub fn pull_with(&mut self, group: u64, max_count: u32, wait_ms: u32) -> Result<Pulled, Error> {
        self.flush_due_acks()?;
        // Messages of the group already accepted from pushes come first.
        let mut messages: Vec<Message> = Vec::new();
        self.ready.retain(|m| {
            if m.group == group {
                messages.push(m.clone());
                false
            } else {
                true
            }
        });
        let page = match self.pull_page(group, max_count, wait_ms) {
            Ok(page) => page,
            Err(e) => {
                // Not delivered after all: they stay first in line.
                for m in messages.into_iter().rev() {
                    self.ready.push_front(m);
                }
                return Err(e);
            }
        };
        messages.extend(page.messages);
        for m in &messages {
            self.delivered(m);
        }
        Ok(Pulled { messages, ..page })
    }

    /// Every message of `group` above the cursor, page by page, each page's
    /// request acknowledging the previous page.
    pub fn pull_all(&mut self, group: u64) -> Result<Vec<Message>, Error> {
        let mut out = Vec::new();
        loop {
            let page = self.pull(group)?;
            out.extend(page.messages);
            if !page.has_more {
                return Ok(out);
            }
        }
    }

    /// Every group of the user with unread messages, pulled completely
    /// (UNREAD, then [`pull_all`](Self::pull_all) of each group behind).
    pub fn catch_up(&mut self) -> Result<Vec<Message>, Error> {
        let mut out = Vec::new();
        for group in self.groups_behind()? {
            out.extend(self.pull_all(group)?);
        }
        Ok(out)
    }

    /// Sends the pending batch ACK now (retrying across reconnects).
    pub fn flush_acks(&mut self) -> Result<(), Error> {
        let deadline = later(Instant::now(), self.config.give_up_after());
        while !self.acker.is_empty() {
            match self.send_acks() {
                Ok(()) => {}
                Err(e @ Error::Unavailable { .. }) if Instant::now() >= deadline => return Err(e),
                Err(Error::Unavailable { .. }) => {
                    self.router.pause(deadline);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Acknowledges everything delivered and closes the connection.
    pub fn close(mut self) -> Result<InboxStats, Error> {
        self.closed = true;
        let result = self.flush_acks();
        self.router.close_all();
        result.map(|()| self.stats())
    }

    /// Drops the inbox without acknowledging anything, as a crash would:
    /// what it delivered since the last ACK is delivered again to the next
    /// inbox of the user (which drops it if given [`marks`](Self::marks)).
    pub fn abandon(mut self) -> InboxStats {
        self.closed = true;
        self.router.cut_all();
        self.router.close_all();
        self.stats()
    }

    /// A copy of a message delivered before (by this inbox, or by an
    /// earlier run whose marks it was given) came again, so its ACK was
    /// lost: acknowledge it again, or the node would send it forever. A
    /// message accepted but not yet returned to the application is not
    /// acknowledged.
    fn ack_seen(&mut self, group: u64, msg_id: u64) {
        let limit = self
            .ready
            .iter()
            .find(|m| m.group == group)
            .map_or(u64::MAX, |m| m.msg_id.saturating_sub(1));
        let id = msg_id.min(limit);
        if id > 0 {
            self.acker.redelivered(group, id, Instant::now());
        }
    }

    fn delivered(&mut self, m: &Message) {
        self.acker.delivered(m.group, m.msg_id, Instant::now());
        self.stats.delivered += 1;
        let (target, latest) = match m.kind {
            Kind::Edit { target } => (
                target,
                Latest::Edited {
                    payload: m.payload.clone(),
                    edit_id: m.msg_id,
                },
            ),
            Kind::Recall { target } => (target, Latest::Recalled),
            Kind::Recalled => (m.msg_id, Latest::Recalled),
            Kind::Message | Kind::Gap | Kind::Edited => return,
        };
        let entry = self
            .changes
            .entry((m.group, target))
            .or_insert(Latest::Unchanged);
        // A recall is final; edits come in id order, the newest wins.
        if *entry != Latest::Recalled {
            *entry = latest;
        }
    }

    /// The latest state of message `msg_id` of `group` as the edits and
    /// recalls this inbox delivered say: an application shows a message
    /// it delivered earlier with this (a new device asks HISTORY).
    pub fn latest(&self, group: u64, msg_id: u64) -> Latest {
        self.changes
            .get(&(group, msg_id))
            .cloned()
            .unwrap_or(Latest::Unchanged)
    }

    /// Forgets the latest states of `group`'s messages up to `msg_id`
    /// (the application keeps them itself): the memory of the changes.
    pub fn forget_changes(&mut self, group: u64, up_to: u64) {
        self.changes.retain(|&(g, id), _| g != group || id > up_to);
    }

    fn on_push(&mut self, msgs: Vec<Message>) {
        for m in msgs {
            match self.filter.pushed(m.group, m.msg_id) {
                Verdict::New => self.ready.push_back(m),
                Verdict::Duplicate => {
                    self.stats.duplicates_dropped += 1;
                    self.ack_seen(m.group, m.msg_id);
                }
                Verdict::Gap => {
                    log::debug!(
                        "user {}: gap at group {} msg {} (mark {:?}): pull",
                        self.user,
                        m.group,
                        m.msg_id,
                        self.filter.mark(m.group)
                    );
                    // The rest of this push is above the gap too; the pull
                    // returns it.
                    self.stats.gaps += 1;
                    self.to_pull.insert(m.group);
                    return;
                }
            }
        }
    }

    /// Connection, subscription, due ACKs, pending pulls.
    fn maintain(&mut self) -> Result<(), Error> {
        if self.want_pushes {
            self.ensure_subscribed()?;
        }
        self.flush_due_acks()?;
        if self.catch_up {
            for g in self.groups_behind()? {
                self.to_pull.insert(g);
            }
            self.catch_up = false;
        }
        // One page per group at a time: PULL returns what is above the
        // cursor, and the cursor moves (by the next page's `ack_up_to`) only
        // once the application has the page. A group whose messages wait
        // in `ready` is pulled again after they are delivered.
        let ready_max = READY_PAGES_MAX * self.config.page_messages_max.max(1) as usize;
        let groups: Vec<u64> = self.to_pull.iter().copied().collect();
        for group in groups {
            if self.ready.len() >= ready_max {
                break;
            }
            if self.ready.iter().any(|m| m.group == group) {
                continue;
            }
            match self.pull_page(group, self.config.page_messages_max, 0) {
                Ok(page) => {
                    self.ready.extend(page.messages);
                    // Done when the node has nothing more, or when pushes
                    // already brought everything up to the head it reported
                    // (the gap is filled; pushes carry on from there).
                    let filled = self.filter.mark(group).is_some_and(|m| m >= page.head);
                    if !page.has_more || filled {
                        self.to_pull.remove(&group);
                    }
                }
                Err(e) => {
                    // A refusal (not a member any more, damaged, below the
                    // retention floor, CRC): report it once; a later push
                    // of the group pulls it again.
                    self.to_pull.remove(&group);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Subscribed to the user on every set (the map learned first).
    fn ensure_subscribed(&mut self) -> Result<(), Error> {
        let deadline = later(Instant::now(), self.config.give_up_after());
        self.router.ensure_map(self.config.give_up_after())?;
        for key in self.router.sets() {
            self.ensure_subscribed_to(key, deadline)?;
        }
        Ok(())
    }

    fn ensure_subscribed_to(&mut self, key: u32, deadline: Instant) -> Result<(), Error> {
        loop {
            let link = self.router.link(key);
            let connected = link.connected().is_some();
            if connected && self.subscribed.get(&key) == Some(&link.generation()) {
                return Ok(());
            }
            let user = self.user;
            let client = link.get(deadline)?;
            let e = match client.subscribe(Subscription::User(user)) {
                Ok(()) => {
                    let generation = link.generation();
                    log::debug!("user {user}: subscribed at set {key} on connection {generation}");
                    link.succeeded();
                    self.subscribed.insert(key, generation);
                    self.last_traffic = Instant::now();
                    // Subscribe first, then pull: anything that became
                    // durable before the SUBSCRIBE is pulled.
                    self.catch_up = true;
                    return Ok(());
                }
                Err(e) => e,
            };
            match classify(&e) {
                Class::Permanent { drop_connection } => {
                    if drop_connection {
                        link.broken();
                    }
                    return Err(Error::from_client(e, Ctx::user(user), 1));
                }
                Class::Broken => link.broken(),
                Class::Busy => {}
                Class::Redirect => link.redirect(),
            }
            if !link.pause(deadline) {
                return Err(Error::from_client(e, Ctx::user(user), 1));
            }
        }
    }

    /// Groups of the user with messages above what this inbox has.
    fn groups_behind(&mut self) -> Result<Vec<u64>, Error> {
        let user = self.user;
        let budget = self.config.give_up_after();
        // Every set's groups of the user (the map learned first).
        self.router.ensure_map(budget)?;
        let mut list = Vec::new();
        for key in self.router.sets() {
            list.extend(
                self.router
                    .link(key)
                    .call(budget, Ctx::user(user), |c| c.unread(user))?,
            );
        }
        self.last_traffic = Instant::now();
        let mut behind = Vec::new();
        for g in list {
            self.filter.observe_cursor(g.group, g.cursor);
            if self.filter.mark(g.group).is_some_and(|m| g.head > m) {
                behind.push(g.group);
            }
        }
        Ok(behind)
    }

    /// One PULL of `group`, carrying the group's pending ACK; returns the
    /// new messages (accepted by the filter, not yet delivered).
    fn pull_page(&mut self, group: u64, max_count: u32, wait_ms: u32) -> Result<Pulled, Error> {
        let user = self.user;
        let ack = self.acker.take_group(group).unwrap_or(0);
        let budget = self
            .config
            .give_up_after()
            .saturating_add(Duration::from_millis(u64::from(wait_ms)));
        let result = self
            .router
            .call(group, budget, Ctx::member(group, user), |c| {
                c.pull(group, user, ack, max_count, wait_ms)
            });
        let page = match result {
            Ok(p) => p,
            Err(e) => {
                if ack > 0 {
                    self.acker.restore(&[(group, ack)], Instant::now());
                }
                return Err(e);
            }
        };
        self.last_traffic = Instant::now();
        self.stats.pulls += 1;
        if ack > 0 {
            self.stats.chained_acks += 1;
        }
        log::debug!(
            "user {user}: pulled group {group} ack_up_to {ack}: cursor {}, head {}, {} record(s), more {}",
            page.cursor,
            page.head,
            page.messages.len(),
            page.has_more
        );
        self.filter.observe_cursor(group, page.cursor);
        let mut messages = Vec::with_capacity(page.messages.len());
        for m in page.messages {
            match self.filter.pulled(group, m.msg_id) {
                Verdict::New => messages.push(m),
                Verdict::Duplicate | Verdict::Gap => {
                    self.stats.duplicates_dropped += 1;
                    self.ack_seen(group, m.msg_id);
                }
            }
        }
        Ok(Pulled {
            messages,
            cursor: page.cursor,
            head: page.head,
            has_more: page.has_more,
        })
    }

    fn flush_due_acks(&mut self) -> Result<(), Error> {
        if !self.acker.is_due(Instant::now()) {
            return Ok(());
        }
        match self.send_acks() {
            // Not reachable now: the items were restored; the next call
            // (or close) tries again.
            Err(Error::Unavailable { .. }) => Ok(()),
            other => other,
        }
    }

    /// One BATCH_ACK of everything pending per replica set (retried across
    /// reconnects within the budget; a WRONG_SET learns the map again).
    /// Items the node refuses (the user left the group, it was deleted)
    /// are dropped: there is nothing left to acknowledge.
    fn send_acks(&mut self) -> Result<(), Error> {
        let mut pending = self.acker.take();
        let user = self.user;
        let budget = self.config.give_up_after();
        let mut hops = 0;
        while !pending.is_empty() {
            let key = self.router.route(pending[0].0);
            let (batch, rest): (Vec<_>, Vec<_>) = pending
                .iter()
                .partition(|&&(group, _)| self.router.route(group) == key);
            match self
                .router
                .link(key)
                .call(budget, Ctx::user(user), |c| c.batch_ack(user, &batch))
            {
                Ok(results) => {
                    self.stats.batch_acks += 1;
                    self.last_traffic = Instant::now();
                    for (r, (group, _)) in results.iter().zip(&batch) {
                        if r.is_err() {
                            self.filter.forget(*group);
                        }
                    }
                    pending = rest;
                }
                Err(Error::WrongSet { .. })
                    if hops < WRONG_SET_HOPS_MAX && self.router.learn(key, budget).is_ok() =>
                {
                    hops += 1;
                }
                Err(e) => {
                    self.acker.restore(&pending, Instant::now());
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl Drop for Inbox {
    /// Best effort: acknowledge what was delivered, on the current
    /// connection only (a drop does not wait to reconnect). Call
    /// [`Inbox::close`] to be sure.
    fn drop(&mut self) {
        if self.closed || self.acker.is_empty() {
            return;
        }
        let items = self.acker.take();
        let user = self.user;
        let mut by_set: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        for item in items {
            by_set
                .entry(self.router.route(item.0))
                .or_default()
                .push(item);
        }
        for (key, batch) in by_set {
            if let Some(c) = self.router.link(key).connected() {
                let _ = c.batch_ack(user, &batch);
            }
        }
    }
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("user", &self.user)
            .field("ready", &self.ready.len())
            .field("stats", &self.stats())
            .finish()
    }
}

/// The subscription iterator of [`Inbox::messages`]: yields each message
/// once; ends after `idle` without a message. An error is yielded and the
/// iteration may go on (the inbox recovers what it can).
pub struct Messages<'a> {
    inbox: &'a mut Inbox,
    idle: Duration,
}

impl Iterator for Messages<'_> {
    type Item = Result<Message, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.inbox.next(self.idle).transpose()
    }
}
