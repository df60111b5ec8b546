//! Request durations in fixed buckets: what `/metrics` serves as the
//! histogram `tidemark_request_duration_seconds` (format-spec/metrics.md).
//!
//! Why fixed buckets beside the HDR histogram of `stats.rs`: STATS' quantiles
//! (`latency.{op}.{q}_ns`) come from the HDR histogram, which keeps values
//! to 3 significant digits and no exact sum; Prometheus wants cumulative
//! counts at fixed bounds, an exact sum and a count, which add up across
//! nodes and can be `rate()`d. Both are recorded by the one recorder,
//! `Stats::latency`, from the same measurement: the time from handling a
//! request to queueing its response.
//!
//! Cost: an observation is a binary search over [`BUCKET_BOUNDS_NS`] (17
//! bounds, at most 5 comparisons) and two additions, O(1) on the event
//! loop. A copy for a scrape is 19 integers.

/// The name of the histogram on `/metrics`: request durations, per
/// opcode. It lives beside the buckets it names so that `stats.rs` (which
/// maps STATS' latency names to it) and `metrics.rs` (which writes it) both
/// import it from below.
pub const REQUEST_DURATION: &str = "tidemark_request_duration_seconds";

/// The upper bounds of the buckets, in nanoseconds: 50 µs to 10 s, about
/// 1-2.5-5 per decade, for a storage node whose requests take from tens of
/// microseconds (a read from memory) to seconds (a commit round stuck
/// behind a slow disk). A duration above the last falls in `+Inf` only.
pub const BUCKET_BOUNDS_NS: [u64; 17] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
    5_000_000_000,
    10_000_000_000,
];

/// The durations of one opcode's requests since the node started.
/// Invariant: `in_bucket` sums to the count of observations.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durations {
    /// Observations per bucket (not cumulative): `in_bucket[i]` took more
    /// than bound `i - 1` and at most bound `i`; the last slot is above
    /// every bound.
    in_bucket: [u64; BUCKET_BOUNDS_NS.len() + 1],
    /// The sum of all observations, in nanoseconds (wraps after 584 years
    /// of request time).
    sum_ns: u64,
}

impl Durations {
    /// Records one request that took `ns` nanoseconds.
    pub fn observe(&mut self, ns: u64) {
        let i = BUCKET_BOUNDS_NS.partition_point(|&bound| bound < ns);
        self.in_bucket[i] += 1;
        self.sum_ns = self.sum_ns.wrapping_add(ns);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.in_bucket.iter().sum()
    }

    pub fn sum_ns(&self) -> u64 {
        self.sum_ns
    }

    /// `(bound in ns, observations at most that long)` for each bound, in
    /// ascending order: the cumulative counts of Prometheus's `le` buckets
    /// (`+Inf` is [`Durations::count`]).
    pub fn cumulative(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        BUCKET_BOUNDS_NS
            .iter()
            .zip(self.in_bucket.iter().scan(0u64, |total, n| {
                *total += n;
                Some(*total)
            }))
            .map(|(&bound, total)| (bound, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_ascend_from_50_us_to_10_s() {
        assert!(BUCKET_BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(BUCKET_BOUNDS_NS[0], 50_000);
        assert_eq!(BUCKET_BOUNDS_NS[16], 10_000_000_000);
    }

    #[test]
    fn a_bound_is_inclusive_and_counts_are_cumulative() {
        let mut d = Durations::default();
        for ns in [1, 50_000, 50_001, 1_000_000, 10_000_000_000, 10_000_000_001] {
            d.observe(ns);
        }
        assert_eq!(d.count(), 6);
        assert_eq!(d.sum_ns(), 1 + 50_000 + 50_001 + 1_000_000 + 20_000_000_001);
        let c: Vec<(u64, u64)> = d.cumulative().collect();
        assert_eq!(c.len(), BUCKET_BOUNDS_NS.len());
        assert_eq!(c[0], (50_000, 2), "1 ns and exactly 50 us");
        assert_eq!(c[1], (100_000, 3));
        assert_eq!(c[4], (1_000_000, 4), "exactly 1 ms");
        assert_eq!(c[15], (5_000_000_000, 4));
        assert_eq!(c[16], (10_000_000_000, 5), "above 10 s: +Inf only");
        assert!(c.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}
