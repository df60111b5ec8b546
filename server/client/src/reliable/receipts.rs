//! The sender's side of receipts (the seeds' `ack:N`): the delivery state
//! of the application's own messages, kept current by RECEIPT and
//! RECEIPT_COUNTS pushes and corrected by pulls.
//!
//! The application tells [`Receipts`] which of its messages to follow
//! ([`Receipts::track`], typically with the `msg_id` a send returned);
//! [`Receipts::next`] then returns a [`Delivery`] each time the number of
//! members that received one of them (cursor ≥ its id, format-spec
//! protocol.md 4.22) grows, and [`Receipts::delivered`] answers at any time.
//!
//! How the counts are kept, per group:
//!
//! - **List mode** (RECEIPT, groups up to the node's threshold): a map of
//!   member → cursor, seeded from READERS at the oldest tracked id the
//!   first time a RECEIPT of the group arrives (and again after a
//!   reconnect or a RESYNC), then raised by every RECEIPT entry. A
//!   message's count is the members of the map at or above it.
//! - **Counts mode** (RECEIPT_COUNTS, larger groups): the pushed counts of
//!   the sender's recent messages, taken as they come.
//! - **Pull is the truth**: on every (re)subscription each tracked message's
//!   count is read with READ_COUNT, and a message the node's recent window
//!   no longer covers keeps the count of its last pull.
//!
//! Counts only grow while membership is stable (cursors never move back),
//! so every update is a maximum: a receipt that arrives twice, or after a
//! pull that already saw its cursor, changes nothing (receipts need no
//! dedup filter of their own, and an [`Inbox`](super::Inbox) on another
//! connection never sees them: its dedup of messages is untouched).
//!
//! In a cluster of several replica sets (format-spec/protocol.md 4.33)
//! each tracked group's receipts are subscribed to on the set that holds
//! it (the map learned from the first `WRONG_SET`, as
//! [`ReliableClient`](super::ReliableClient) does), its counts pulled
//! there, and the sets' connections are waited on in turn
//! ([`PUSH_POLL_SLICE`](super::PUSH_POLL_SLICE) each).
//!
//! Bounds: at most [`TRACKED_PER_GROUP_MAX`] messages per group are
//! followed (the oldest is dropped); a list-mode map holds at most the
//! members at or above the oldest tracked id of a group below the node's
//! threshold.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::error::{classify, Class, Ctx, Error};
use super::inbox::PUSH_POLL_SLICE;
use super::link::LinkStats;
use super::router::{Router, UNMAPPED, WRONG_SET_HOPS_MAX};
use super::ReliableConfig;
use crate::client::{later, Event};
use tidemark_protocol::{MemberEntry, ReceiptCount, ResyncScope};

/// Messages followed per group at most; tracking one more forgets the
/// oldest.
pub const TRACKED_PER_GROUP_MAX: usize = 1024;

/// Members listed per READERS request when seeding a group's map.
const READERS_PAGE: u32 = 10_000;

/// A change in a tracked message's delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub group: u64,
    pub msg_id: u64,
    /// Members whose cursor is at or above `msg_id` (the sender included
    /// if it acknowledged its own message).
    pub delivered: u64,
}

/// Counters of a [`Receipts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReceiptsStats {
    /// RECEIPT frames received.
    pub receipts: u64,
    /// RECEIPT_COUNTS frames received.
    pub counts: u64,
    /// Pulls of the truth (READ_COUNT of every tracked message of a group,
    /// READERS pages of a list-mode group).
    pub pulls: u64,
    pub resyncs: u64,
    pub link: LinkStats,
}

#[derive(Default)]
struct GroupState {
    /// Tracked msg id → members at or above it, best known.
    tracked: BTreeMap<u64, u64>,
    /// List mode: member → cursor, seeded from READERS at `seeded_from`.
    cursors: BTreeMap<u64, u64>,
    /// The id the map was seeded at (READERS' `msg_id`); `None`: not
    /// seeded on this connection.
    seeded_from: Option<u64>,
}

/// Follows the delivery of one sender's messages over its own connection.
pub struct Receipts {
    config: ReliableConfig,
    /// One link per replica set (`router.rs`).
    router: Router,
    sender: u64,
    groups: BTreeMap<u64, GroupState>,
    /// Per set: the connection generation and the groups the node has a
    /// receipt subscription for on it.
    subscribed: BTreeMap<u32, (u64, BTreeSet<u64>)>,
    /// Which set's connection is waited on next.
    poll_turn: usize,
    /// Groups whose counts must be pulled (new subscription, RESYNC).
    to_refresh: BTreeSet<u64>,
    updates: VecDeque<Delivery>,
    stats: ReceiptsStats,
}

impl Receipts {
    /// Receipts of `sender`'s messages; connects on first use.
    pub fn new(config: ReliableConfig, sender: u64) -> Receipts {
        let router = Router::new(
            config.client.clone(),
            &config.members,
            Duration::from_millis(config.backoff_base_ms),
            Duration::from_millis(config.backoff_max_ms),
        );
        Receipts {
            config,
            router,
            sender,
            groups: BTreeMap::new(),
            subscribed: BTreeMap::new(),
            poll_turn: 0,
            to_refresh: BTreeSet::new(),
            updates: VecDeque::new(),
            stats: ReceiptsStats::default(),
        }
    }

    pub fn stats(&self) -> ReceiptsStats {
        ReceiptsStats {
            link: self.router.stats(),
            ..self.stats
        }
    }

    /// Follows the delivery of `msg_id` in `group` (a message of this
    /// sender). Its count is pulled before the next [`next`](Self::next)
    /// waits.
    pub fn track(&mut self, group: u64, msg_id: u64) {
        let g = self.groups.entry(group).or_default();
        g.tracked.entry(msg_id).or_insert(0);
        if g.tracked.len() > TRACKED_PER_GROUP_MAX {
            g.tracked.pop_first();
        }
        // A message below the map's seed is not covered by it: seed again.
        if g.seeded_from.is_some_and(|from| msg_id < from) {
            g.seeded_from = None;
            g.cursors.clear();
        }
        self.to_refresh.insert(group);
    }

    /// Stops following a message.
    pub fn forget(&mut self, group: u64, msg_id: u64) {
        if let Some(g) = self.groups.get_mut(&group) {
            g.tracked.remove(&msg_id);
        }
    }

    /// Members known to have `msg_id` of `group` (cursor at or above it);
    /// `None` if it is not tracked.
    pub fn delivered(&self, group: u64, msg_id: u64) -> Option<u64> {
        self.groups.get(&group)?.tracked.get(&msg_id).copied()
    }

    /// Cuts the connection as a network failure would (tests, the demo):
    /// the next call reconnects, subscribes again and pulls the counts.
    pub fn cut_connection(&mut self) {
        self.router.cut_all();
    }

    /// The sets of the tracked groups (the configured node's before any).
    fn sets(&self) -> Vec<u32> {
        let sets: BTreeSet<u32> = self.groups.keys().map(|&g| self.router.route(g)).collect();
        if sets.is_empty() {
            vec![UNMAPPED]
        } else {
            sets.into_iter().collect()
        }
    }

    /// The next change of a tracked message's delivery, waiting up to
    /// `timeout`; `None` if none came. Subscribes, pulls and recovers from a
    /// lost connection on the way.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Delivery>, Error> {
        let deadline = later(Instant::now(), timeout);
        loop {
            if let Some(d) = self.updates.pop_front() {
                return Ok(Some(d));
            }
            self.maintain()?;
            if let Some(d) = self.updates.pop_front() {
                return Ok(Some(d));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            // One set's connection this turn; with several, a slice each.
            let keys = self.sets();
            let key = keys[self.poll_turn % keys.len()];
            self.poll_turn = self.poll_turn.wrapping_add(1);
            let mut wait = deadline.saturating_duration_since(now);
            if keys.len() > 1 {
                wait = wait.min(PUSH_POLL_SLICE);
            }
            let Some(client) = self.router.link(key).connected() else {
                continue;
            };
            match client.next_event(wait) {
                Ok(Some(Event::Receipt { group, receipts })) => {
                    self.stats.receipts += 1;
                    self.on_receipt(group, &receipts)?;
                }
                Ok(Some(Event::ReceiptCounts { group, counts, .. })) => {
                    self.stats.counts += 1;
                    self.on_counts(group, &counts);
                }
                Ok(Some(Event::Resync(scope))) => {
                    self.stats.resyncs += 1;
                    if let ResyncScope::All = scope {
                        // The node cancelled the subscription: subscribe
                        // again and pull.
                        self.subscribed.remove(&key);
                    }
                }
                // This connection subscribes to no messages.
                Ok(Some(Event::Push(_))) | Ok(None) => {}
                Err(e) => match classify(&e) {
                    Class::Permanent {
                        drop_connection: false,
                    } => return Err(Error::from_client(e, Ctx::user(self.sender), 1)),
                    Class::Redirect => self.router.link(key).redirect(),
                    _ => self.router.link(key).broken(),
                },
            }
        }
    }

    /// Subscriptions on each tracked group's set, then the pulls due. A new
    /// connection knows nothing of the old one's subscription: every group
    /// of its set is subscribed again and pulled (subscribe first, then
    /// pull, so that a cursor that moves after the pull is pushed). A
    /// WRONG_SET (a group of another set, before the map was known) learns
    /// the map and starts over.
    fn maintain(&mut self) -> Result<(), Error> {
        let mut hops = 0;
        'again: loop {
            let deadline = later(Instant::now(), self.config.give_up_after());
            let mut generations = Vec::new();
            for key in self.sets() {
                let link = self.router.link(key);
                link.get(deadline)?;
                let generation = link.generation();
                generations.push((key, generation));
                let known = self.subscribed.get(&key).map(|(g, _)| *g);
                if known != Some(generation) {
                    self.subscribed.insert(key, (generation, BTreeSet::new()));
                    for (&group, g) in self.groups.iter_mut() {
                        if self.router.route(group) == key {
                            g.seeded_from = None;
                            g.cursors.clear();
                            self.to_refresh.insert(group);
                        }
                    }
                }
                let missing: Vec<u64> = self
                    .groups
                    .keys()
                    .filter(|&&g| self.router.route(g) == key)
                    .filter(|g| {
                        !self
                            .subscribed
                            .get(&key)
                            .is_some_and(|(_, s)| s.contains(g))
                    })
                    .copied()
                    .collect();
                if missing.is_empty() {
                    continue;
                }
                let sender = self.sender;
                let budget = self.config.give_up_after();
                match self.router.link(key).call(budget, Ctx::user(sender), |c| {
                    c.subscribe_receipts(sender, &missing)
                }) {
                    Ok(()) => {}
                    Err(refused @ Error::WrongSet { .. }) if hops < WRONG_SET_HOPS_MAX => {
                        hops += 1;
                        if self.router.learn(key, budget).is_err() {
                            return Err(refused);
                        }
                        continue 'again;
                    }
                    Err(e) => return Err(e),
                }
                if self.router.link(key).generation() != generation {
                    continue 'again; // reconnected meanwhile: start over
                }
                if let Some((_, s)) = self.subscribed.get_mut(&key) {
                    s.extend(missing);
                }
            }
            for group in std::mem::take(&mut self.to_refresh) {
                self.pull_counts(group)?;
            }
            let unchanged = generations
                .iter()
                .all(|&(key, generation)| self.router.link(key).generation() == generation);
            if unchanged {
                return Ok(());
            }
        }
    }

    /// READ_COUNT of every tracked message of `group`.
    fn pull_counts(&mut self, group: u64) -> Result<(), Error> {
        let ids: Vec<u64> = match self.groups.get(&group) {
            Some(g) => g.tracked.keys().copied().collect(),
            None => return Ok(()),
        };
        for msg_id in ids {
            let count =
                self.router
                    .call(group, self.config.give_up_after(), Ctx::group(group), |c| {
                        c.read_count(group, msg_id)
                    })?;
            self.stats.pulls += 1;
            self.raise(group, msg_id, count);
        }
        Ok(())
    }

    /// A RECEIPT: seed the group's map from READERS if it is not, raise
    /// the members listed, recount the tracked messages.
    fn on_receipt(&mut self, group: u64, receipts: &[MemberEntry]) -> Result<(), Error> {
        let Some(from) = self
            .groups
            .get(&group)
            .and_then(|g| g.tracked.keys().next().copied())
        else {
            return Ok(());
        };
        if self
            .groups
            .get(&group)
            .is_some_and(|g| g.seeded_from.is_none())
        {
            let seed = self.readers(group, from)?;
            if let Some(g) = self.groups.get_mut(&group) {
                for m in seed {
                    let c = g.cursors.entry(m.user).or_insert(m.cursor);
                    *c = (*c).max(m.cursor);
                }
                g.seeded_from = Some(from);
            }
        }
        let Some(g) = self.groups.get_mut(&group) else {
            return Ok(());
        };
        for m in receipts {
            let c = g.cursors.entry(m.user).or_insert(m.cursor);
            *c = (*c).max(m.cursor);
        }
        let counts: Vec<(u64, u64)> = g
            .tracked
            .keys()
            .map(|&id| (id, g.cursors.values().filter(|&&c| c >= id).count() as u64))
            .collect();
        for (id, count) in counts {
            self.raise(group, id, count);
        }
        Ok(())
    }

    /// Every member of `group` at or above `msg_id`, page by page.
    fn readers(&mut self, group: u64, msg_id: u64) -> Result<Vec<MemberEntry>, Error> {
        let mut all = Vec::new();
        let mut after = 0;
        loop {
            let (page, next) =
                self.router
                    .call(group, self.config.give_up_after(), Ctx::group(group), |c| {
                        c.readers(group, msg_id, after, READERS_PAGE)
                    })?;
            self.stats.pulls += 1;
            all.extend(page);
            if next == 0 {
                return Ok(all);
            }
            after = next;
        }
    }

    fn on_counts(&mut self, group: u64, counts: &[ReceiptCount]) {
        for c in counts {
            self.raise(group, c.msg_id, c.count);
        }
    }

    /// Raises a tracked message's count; a rise is an update.
    fn raise(&mut self, group: u64, msg_id: u64, count: u64) {
        let Some(known) = self
            .groups
            .get_mut(&group)
            .and_then(|g| g.tracked.get_mut(&msg_id))
        else {
            return;
        };
        if count > *known {
            *known = count;
            self.updates.push_back(Delivery {
                group,
                msg_id,
                delivered: count,
            });
        }
    }
}
