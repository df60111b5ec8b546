//! Rate-limited event lines: connection accepts and closes, authentication
//! failures and protocol errors are logged, and a flood of them (a port
//! scanner, a client in a reconnect loop, garbage on the port) cannot turn
//! the log into a disk-filler.
//!
//! The idea is the engine's `commit/warn_limit.rs` (pure state over
//! caller-supplied instants, so its schedule is tested without sleeping;
//! what is not logged is counted and said later), applied to events that
//! have no "condition ended": a token bucket per [`EventKind`]. Each kind
//! may log a burst of [`BURST`] lines, then one line per [`REFILL`]; an
//! event without a token is counted, and [`LogLimiter::flush`] turns the
//! count into one "N similar events suppressed" line per kind
//! [`REPORT_INTERVAL`] after the first event it counts (so a flood's line
//! says most of it, and a kind has at most one such line per interval).
//!
//! Bound: per kind, at most `BURST + t / REFILL` event lines and
//! `t / REPORT_INTERVAL + 1` suppression lines over `t`, whatever the rate
//! of events.
//!
//! Costs: O(1) per event and per flush (four kinds); owned by the event
//! loop, no lock.

use std::time::{Duration, Instant};

/// Lines a kind may log at once after a quiet spell.
pub const BURST: u32 = 20;
/// One more line per this long, once the burst is spent.
pub const REFILL: Duration = Duration::from_secs(1);
/// Suppressed events are reported at most this often per kind.
pub const REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// The kinds of events, each with its own bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A connection accepted.
    Accept,
    /// A connection closed.
    Close,
    /// An AUTH with a wrong token.
    AuthFailure,
    /// A fatal protocol error (BAD_FRAME, FRAME_TOO_LARGE,
    /// UNSUPPORTED_VERSION, a frame timeout).
    ProtocolError,
}

impl EventKind {
    pub const ALL: [EventKind; 4] = [
        EventKind::Accept,
        EventKind::Close,
        EventKind::AuthFailure,
        EventKind::ProtocolError,
    ];

    /// How the suppression line names the kind.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::Accept => "connection accepted",
            EventKind::Close => "connection closed",
            EventKind::AuthFailure => "authentication failure",
            EventKind::ProtocolError => "protocol error",
        }
    }
}

#[derive(Debug)]
struct Bucket {
    tokens: u32,
    /// Tokens were last added up to this instant.
    refilled_at: Instant,
    /// Events not logged since the last suppression line.
    suppressed: u64,
    /// When the first of them happened (`None` while there are none).
    counting_since: Option<Instant>,
}

/// One token bucket per [`EventKind`].
#[derive(Debug)]
pub struct LogLimiter {
    buckets: [Bucket; 4],
    /// Events not logged since start, all kinds (STATS
    /// `log.events_suppressed`).
    suppressed_total: u64,
}

impl LogLimiter {
    pub fn new(now: Instant) -> LogLimiter {
        let bucket = || Bucket {
            tokens: BURST,
            refilled_at: now,
            suppressed: 0,
            counting_since: None,
        };
        LogLimiter {
            buckets: [bucket(), bucket(), bucket(), bucket()],
            suppressed_total: 0,
        }
    }

    fn bucket(&mut self, kind: EventKind) -> &mut Bucket {
        let i = EventKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or_default();
        &mut self.buckets[i]
    }

    /// An event of `kind` at `now`: true if its line may be logged (a
    /// token was taken), false if it is only counted.
    pub fn allow(&mut self, kind: EventKind, now: Instant) -> bool {
        let b = self.bucket(kind);
        let elapsed = now.saturating_duration_since(b.refilled_at);
        let new = (elapsed.as_nanos() / REFILL.as_nanos()) as u64;
        if new > 0 {
            b.tokens = (u64::from(b.tokens) + new).min(u64::from(BURST)) as u32;
            b.refilled_at += REFILL * new.min(u64::from(u32::MAX)) as u32;
        }
        if b.tokens > 0 {
            b.tokens -= 1;
            return true;
        }
        b.suppressed += 1;
        b.counting_since.get_or_insert(now);
        self.suppressed_total += 1;
        false
    }

    /// The suppression lines due at `now`: `(kind, events not logged since
    /// the last line)` for each kind whose oldest counted event is at
    /// least [`REPORT_INTERVAL`] old.
    pub fn flush(&mut self, now: Instant) -> Vec<(EventKind, u64)> {
        let mut due = Vec::new();
        for (kind, b) in EventKind::ALL.iter().zip(self.buckets.iter_mut()) {
            let ready = b
                .counting_since
                .is_some_and(|t| now.saturating_duration_since(t) >= REPORT_INTERVAL);
            if ready {
                due.push((*kind, std::mem::take(&mut b.suppressed)));
                b.counting_since = None;
            }
        }
        due
    }

    /// When [`LogLimiter::flush`] has something to say next, if anything
    /// is counted (the event loop's timer; an idle node is not woken).
    pub fn next_flush(&self) -> Option<Instant> {
        self.buckets
            .iter()
            .filter_map(|b| b.counting_since)
            .map(|t| t + REPORT_INTERVAL)
            .min()
    }

    pub fn suppressed_total(&self) -> u64 {
        self.suppressed_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_logs_a_burst_then_one_line_per_refill_and_counts_the_rest() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut l = LogLimiter::new(t0);
        assert_eq!(l.next_flush(), None, "nothing counted: no timer");
        // 10,000 bad frames in 5 s (one every 0.5 ms).
        let logged = (0..10_000u64)
            .filter(|i| l.allow(EventKind::ProtocolError, ms(i / 2)))
            .count() as u64;
        assert_eq!(
            logged,
            u64::from(BURST) + 4,
            "the burst, then one per second"
        );
        assert_eq!(l.suppressed_total(), 10_000 - logged);
        // Other kinds keep their own tokens.
        assert!(l.allow(EventKind::Accept, ms(5_000)));
        // The count is said once, REPORT_INTERVAL after the first event it
        // counts (the 21st, at 10 ms): the whole flood in one line.
        assert_eq!(l.next_flush(), Some(ms(10_010)));
        assert!(l.flush(ms(10_009)).is_empty());
        assert_eq!(
            l.flush(ms(10_010)),
            vec![(EventKind::ProtocolError, 10_000 - logged)]
        );
        assert!(l.flush(ms(10_011)).is_empty());
        assert_eq!(l.next_flush(), None);
        // A flood that goes on: at most one line per interval.
        let mut lines = 0;
        for i in 0..60_000u64 {
            l.allow(EventKind::ProtocolError, ms(10_011 + i));
            lines += l.flush(ms(10_011 + i)).len();
        }
        assert_eq!(lines, 5, "60 s of flood, 6 intervals, the last not over");
        // A quiet spell refills the burst, no more.
        let after_quiet = (0..100)
            .filter(|_| l.allow(EventKind::ProtocolError, ms(200_000)))
            .count();
        assert_eq!(after_quiet, BURST as usize);
    }
}
