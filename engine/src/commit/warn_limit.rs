//! A warning that repeats while a condition lasts, rate limited: a full
//! disk holds writes and retries them every 200 ms, and one line per retry
//! (49 lines in 10 s) buried the log while saying nothing new, and nothing
//! said when the condition ended. Here the first occurrence is logged at
//! once, then at most one line per interval carrying the count of those
//! not logged, and the end is reported with how long the condition lasted.
//!
//! Pure state over caller-supplied instants, so its schedule is tested
//! without sleeping.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub(crate) struct RepeatedWarning {
    interval: Duration,
    /// When the condition began; `None` while it does not hold.
    since: Option<Instant>,
    last_logged: Option<Instant>,
    /// Occurrences not logged since the last line.
    suppressed: u64,
    /// Occurrences not logged over the whole condition.
    suppressed_total: u64,
}

/// What [`RepeatedWarning::ended`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Ended {
    pub(crate) lasted: Duration,
    pub(crate) suppressed_total: u64,
}

impl RepeatedWarning {
    pub(crate) fn new(interval: Duration) -> RepeatedWarning {
        RepeatedWarning {
            interval,
            since: None,
            last_logged: None,
            suppressed: 0,
            suppressed_total: 0,
        }
    }

    /// The condition occurred (again) at `now`. `Some(n)`: log it now,
    /// mentioning the `n` occurrences not logged since the last line;
    /// `None`: stay quiet (it is counted).
    pub(crate) fn occurred(&mut self, now: Instant) -> Option<u64> {
        self.since.get_or_insert(now);
        let due = self
            .last_logged
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if due {
            self.last_logged = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            self.suppressed_total += 1;
            None
        }
    }

    /// The condition is over at `now` (a write went through). Reports how
    /// long it lasted if it held; the next occurrence is logged at once.
    pub(crate) fn ended(&mut self, now: Instant) -> Option<Ended> {
        let since = self.since.take()?;
        let ended = Ended {
            lasted: now.saturating_duration_since(since),
            suppressed_total: self.suppressed_total,
        };
        self.last_logged = None;
        self.suppressed = 0;
        self.suppressed_total = 0;
        Some(ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_at_once_then_once_per_interval_with_the_count_then_the_end() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut w = RepeatedWarning::new(Duration::from_secs(60));
        assert_eq!(w.ended(t0), None, "no condition, nothing to end");

        // A retry every 200 ms for 10 s: one line, not 50.
        let logged: Vec<(u64, u64)> = (0..50u64)
            .filter_map(|i| w.occurred(ms(i * 200)).map(|n| (i, n)))
            .collect();
        assert_eq!(logged, vec![(0, 0)]);
        // A minute after the first line: the next one, with the count.
        assert_eq!(w.occurred(ms(60_000)), Some(49));
        assert_eq!(w.occurred(ms(60_200)), None);
        assert_eq!(
            w.ended(ms(61_000)),
            Some(Ended {
                lasted: Duration::from_secs(61),
                suppressed_total: 50
            })
        );
        assert_eq!(w.ended(ms(62_000)), None, "ended once");
        // A new condition is logged at once, its count starting afresh.
        assert_eq!(w.occurred(ms(62_100)), Some(0));
        assert_eq!(
            w.ended(ms(62_600)),
            Some(Ended {
                lasted: Duration::from_millis(500),
                suppressed_total: 0
            })
        );
    }
}
