//! Batch ACK policy (the design brief's answer to the ACK storm): a receiver
//! acknowledges once per N delivered messages or once per T milliseconds,
//! whichever comes first, by advancing each group's cursor to the newest id
//! delivered, in one BATCH_ACK; and once more on close.
//!
//! Sans IO: the caller passes the time and sends the items. A message not
//! yet acknowledged when the connection or the process dies is delivered
//! again later and dropped by the [`DedupFilter`](super::DedupFilter).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::client::later;

#[derive(Clone, Debug)]
pub struct BatchAcker {
    every_messages: u32,
    every: Duration,
    /// Per group, the newest id delivered and not yet acknowledged.
    pending: BTreeMap<u64, u64>,
    /// Messages delivered since the last flush.
    count: u32,
    /// When the oldest unacknowledged delivery happened.
    since: Option<Instant>,
}

impl BatchAcker {
    /// Flush after `every_messages` deliveries (at least 1) or `every` after
    /// the first unacknowledged one.
    pub fn new(every_messages: u32, every: Duration) -> BatchAcker {
        BatchAcker {
            every_messages: every_messages.max(1),
            every,
            pending: BTreeMap::new(),
            count: 0,
            since: None,
        }
    }

    /// The application received `msg_id` of `group`.
    pub fn delivered(&mut self, group: u64, msg_id: u64, now: Instant) {
        let e = self.pending.entry(group).or_insert(msg_id);
        *e = (*e).max(msg_id);
        self.count = self.count.saturating_add(1);
        self.since.get_or_insert(now);
    }

    /// A copy of `msg_id` came again (its earlier ACK was lost): make sure
    /// the next flush covers it, without counting it as a new delivery.
    pub fn redelivered(&mut self, group: u64, msg_id: u64, now: Instant) {
        let e = self.pending.entry(group).or_insert(msg_id);
        *e = (*e).max(msg_id);
        self.since.get_or_insert(now);
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Messages delivered since the last flush.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// True when a flush is due: N messages, or T since the oldest.
    pub fn is_due(&self, now: Instant) -> bool {
        !self.pending.is_empty()
            && (self.count >= self.every_messages || self.deadline().is_some_and(|d| now >= d))
    }

    /// When the T-timer fires, if anything is pending.
    pub fn deadline(&self) -> Option<Instant> {
        if self.pending.is_empty() {
            return None;
        }
        self.since.map(|s| later(s, self.every))
    }

    /// Every pending `(group, msg_id)`, ascending by group; the batch starts
    /// over. If sending them fails, give them back with [`restore`](Self::restore).
    pub fn take(&mut self) -> Vec<(u64, u64)> {
        self.count = 0;
        self.since = None;
        std::mem::take(&mut self.pending).into_iter().collect()
    }

    /// The pending id of one group, for a PULL's `ack_up_to` (the request
    /// for the next page doubles as the ACK of the previous one).
    pub fn take_group(&mut self, group: u64) -> Option<u64> {
        let id = self.pending.remove(&group);
        if self.pending.is_empty() {
            self.count = 0;
            self.since = None;
        }
        id
    }

    /// Puts back items whose ACK did not reach the node.
    pub fn restore(&mut self, items: &[(u64, u64)], now: Instant) {
        for &(group, msg_id) in items {
            let e = self.pending.entry(group).or_insert(msg_id);
            *e = (*e).max(msg_id);
        }
        if !self.pending.is_empty() {
            self.since.get_or_insert(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_after_n_messages() {
        let t0 = Instant::now();
        let mut a = BatchAcker::new(3, Duration::from_secs(3600));
        a.delivered(1, 1, t0);
        a.delivered(2, 8, t0);
        assert!(!a.is_due(t0));
        a.delivered(1, 2, t0);
        assert!(a.is_due(t0), "3 messages");
        assert_eq!(a.take(), vec![(1, 2), (2, 8)], "newest id per group");
        assert!(!a.is_due(t0) && a.is_empty());
    }

    #[test]
    fn flushes_after_t_milliseconds_whichever_first() {
        let t0 = Instant::now();
        let t = Duration::from_millis(200);
        let mut a = BatchAcker::new(100, t);
        assert_eq!(a.deadline(), None);
        a.delivered(1, 1, t0);
        a.delivered(1, 2, t0 + Duration::from_millis(150));
        assert_eq!(a.deadline(), Some(t0 + t), "timed from the oldest");
        assert!(!a.is_due(t0 + Duration::from_millis(199)));
        assert!(a.is_due(t0 + t));
        assert_eq!(a.take(), vec![(1, 2)]);
    }

    #[test]
    fn a_failed_flush_is_restored_and_a_pull_can_carry_one_group() {
        let t0 = Instant::now();
        let mut a = BatchAcker::new(10, Duration::from_secs(1));
        a.delivered(1, 5, t0);
        a.delivered(2, 9, t0);
        let items = a.take();
        a.delivered(1, 6, t0);
        a.restore(&items, t0);
        assert_eq!(a.take_group(1), Some(6), "restore never lowers an id");
        assert_eq!(a.take(), vec![(2, 9)]);
        assert_eq!(a.take_group(3), None);
    }

    #[test]
    fn redelivered_copies_are_acknowledged_but_do_not_count_as_messages() {
        let t0 = Instant::now();
        let t = Duration::from_millis(100);
        let mut a = BatchAcker::new(2, t);
        a.redelivered(1, 7, t0);
        a.redelivered(1, 8, t0);
        a.redelivered(1, 9, t0);
        assert_eq!(a.count(), 0);
        assert!(!a.is_due(t0), "not N messages");
        assert!(a.is_due(t0 + t), "but T after the first");
        assert_eq!(a.take(), vec![(1, 9)]);
    }
}
