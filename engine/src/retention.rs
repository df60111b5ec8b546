//! Retention: which sealed segments of a group may be dropped. The floor
//! (oldest stored msg_id) rises only by whole segments, and reads below it
//! get a typed `BelowRetentionFloor` naming the earliest stored id.

/// A group's retention policy. The default keeps everything (roaming).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Retention {
    /// Drop sealed segments whose every message every member acknowledged.
    pub by_cursor: bool,
    /// Drop sealed segments whose newest message is older than this (0 = no limit).
    pub max_age_ms: u64,
    /// Drop the oldest sealed segments while the log exceeds this (0 = no limit).
    pub max_bytes: u64,
}

impl Retention {
    pub fn keeps_everything(&self) -> bool {
        *self == Retention::default()
    }
}

/// What the planner needs to know about one sealed segment.
#[derive(Clone, Copy, Debug)]
pub struct SealedSegment {
    pub last_id: u64,
    pub bytes: u64,
    /// Timestamp of the first record after this segment (an upper bound of
    /// its own records' timestamps, which never decrease within a group).
    pub next_first_timestamp_ms: u64,
}

/// How many of the oldest sealed segments may go. `min_cursor` is the lowest
/// member cursor (`None` without members: nothing is held back by cursors).
pub fn droppable(
    policy: &Retention,
    sealed: &[SealedSegment],
    total_bytes: u64,
    min_cursor: Option<u64>,
    now_ms: u64,
) -> usize {
    if policy.keeps_everything() {
        return 0;
    }
    let mut remaining = total_bytes;
    let mut n = 0;
    for s in sealed {
        let read_by_all = policy.by_cursor && min_cursor.is_none_or(|c| s.last_id <= c);
        let too_old = policy.max_age_ms > 0
            && s.next_first_timestamp_ms.saturating_add(policy.max_age_ms) < now_ms;
        let too_big = policy.max_bytes > 0 && remaining > policy.max_bytes;
        if !(read_by_all || too_old || too_big) {
            break;
        }
        remaining -= s.bytes;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segs() -> Vec<SealedSegment> {
        vec![
            SealedSegment {
                last_id: 10,
                bytes: 100,
                next_first_timestamp_ms: 1_000,
            },
            SealedSegment {
                last_id: 20,
                bytes: 100,
                next_first_timestamp_ms: 2_000,
            },
            SealedSegment {
                last_id: 30,
                bytes: 100,
                next_first_timestamp_ms: 3_000,
            },
        ]
    }

    #[test]
    fn default_keeps_everything() {
        assert_eq!(
            droppable(&Retention::default(), &segs(), 400, Some(100), 99_999),
            0
        );
    }

    #[test]
    fn cursor_retention_stops_at_the_slowest_member() {
        let p = Retention {
            by_cursor: true,
            ..Default::default()
        };
        assert_eq!(droppable(&p, &segs(), 400, Some(19), 0), 1);
        assert_eq!(droppable(&p, &segs(), 400, Some(20), 0), 2);
        assert_eq!(droppable(&p, &segs(), 400, Some(0), 0), 0);
    }

    #[test]
    fn age_and_size_limits() {
        let age = Retention {
            max_age_ms: 500,
            ..Default::default()
        };
        assert_eq!(droppable(&age, &segs(), 400, None, 2_600), 2);
        let size = Retention {
            max_bytes: 250,
            ..Default::default()
        };
        assert_eq!(droppable(&size, &segs(), 400, None, 0), 2);
    }
}
