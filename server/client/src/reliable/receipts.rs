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
//! Bounds: at most [`TRACKED_PER_GROUP_MAX`] messages per group are
//! followed (the oldest is dropped); a list-mode map holds at most the
//! members at or above the oldest tracked id of a group below the node's
//! threshold.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use super::error::{classify, Class, Ctx, Error};
use super::link::{Link, LinkStats};
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
    link: Link,
    sender: u64,
    groups: BTreeMap<u64, GroupState>,
    /// Groups the node has a receipt subscription for on this connection.
    subscribed: BTreeSet<u64>,
    subscribed_gen: u64,
    /// Groups whose counts must be pulled (new subscription, RESYNC).
    to_refresh: BTreeSet<u64>,
    updates: VecDeque<Delivery>,
    stats: ReceiptsStats,
}

impl Receipts {
    /// Receipts of `sender`'s messages; connects on first use.
    pub fn new(config: ReliableConfig, sender: u64) -> Receipts {
        let link = Link::new(
            config.client.clone(),
            Duration::from_millis(config.backoff_base_ms),
            Duration::from_millis(config.backoff_max_ms),
        )
        .with_members(&config.members);
        Receipts {
            config,
            link,
            sender,
            groups: BTreeMap::new(),
            subscribed: BTreeSet::new(),
            subscribed_gen: 0,
            to_refresh: BTreeSet::new(),
            updates: VecDeque::new(),
            stats: ReceiptsStats::default(),
        }
    }

    pub fn stats(&self) -> ReceiptsStats {
        ReceiptsStats {
            link: self.link.stats(),
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
        self.link.cut();
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
            let Some(client) = self.link.connected() else {
                continue;
            };
            match client.next_event(deadline.saturating_duration_since(now)) {
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
                        self.subscribed_gen = 0;
                    }
                }
                // This connection subscribes to no messages.
                Ok(Some(Event::Push(_))) | Ok(None) => {}
                Err(e) => match classify(&e) {
                    Class::Permanent {
                        drop_connection: false,
                    } => return Err(Error::from_client(e, Ctx::user(self.sender), 1)),
                    Class::Redirect => self.link.redirect(),
                    _ => self.link.broken(),
                },
            }
        }
    }

    /// Subscription on this connection, then the pulls due. A new
    /// connection knows nothing of the old one's subscription: every group
    /// is subscribed again and pulled (subscribe first, then pull, so that
    /// a cursor that moves after the pull is pushed).
    fn maintain(&mut self) -> Result<(), Error> {
        loop {
            let deadline = later(Instant::now(), self.config.give_up_after());
            self.link.get(deadline)?;
            let generation = self.link.generation();
            if self.subscribed_gen != generation {
                self.subscribed.clear();
                for g in self.groups.values_mut() {
                    g.seeded_from = None;
                    g.cursors.clear();
                }
                self.to_refresh.extend(self.groups.keys().copied());
                self.subscribed_gen = generation;
            }
            let missing: Vec<u64> = self
                .groups
                .keys()
                .filter(|g| !self.subscribed.contains(g))
                .copied()
                .collect();
            if !missing.is_empty() {
                let sender = self.sender;
                self.link
                    .call(self.config.give_up_after(), Ctx::user(sender), |c| {
                        c.subscribe_receipts(sender, &missing)
                    })?;
                if self.link.generation() != generation {
                    continue; // reconnected meanwhile: start over
                }
                self.subscribed.extend(missing);
            }
            for group in std::mem::take(&mut self.to_refresh) {
                self.pull_counts(group)?;
            }
            if self.link.generation() == generation {
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
            let count = self
                .link
                .call(self.config.give_up_after(), Ctx::group(group), |c| {
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
                self.link
                    .call(self.config.give_up_after(), Ctx::group(group), |c| {
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
