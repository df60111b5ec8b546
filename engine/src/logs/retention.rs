//! Retention: which sealed segments of a group may be dropped. The floor
//! (oldest stored msg_id) rises only by whole segments, and reads below it
//! get a typed `BelowRetentionFloor` naming the earliest stored id.
//!
//! Storage v2 (design 5.5) adds [`plan_small`], the same policy over a small
//! group's extents. The checkpointer applies both (its retention pass):
//! dropped segments go to its graveyard, a small group's floor rises in its
//! extent list, and the next checkpoint records either.

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

/// What the planner needs to know about one sealed segment (or, for
/// [`plan_small`], one extent of a small group).
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

/// The new floor of a small group (storage v2 design 5.5), or `None` if
/// its policy does not raise it. `extents` describe the group's extents,
/// oldest first, as [`SealedSegment`]s: the id of the last record, the
/// bytes, and an upper bound of the records' timestamps (the first record of
/// the next extent; the group's last timestamp for the last extent). The
/// group stores `floor..=head`.
///
/// Cursor retention is exact to the record (a floor inside an extent is
/// allowed: reads skip what lies below it, and the next rewrite drops it):
/// everything every member acknowledged goes, all of it without members.
/// Age and size retention drop whole extents, their only known bounds, by
/// the rules of [`droppable`]. Unlike a segmented log, whose active segment
/// always stays, a small group may drop every record (`head + 1`): its
/// head lives in the group, not in a file.
pub fn plan_small(
    policy: &Retention,
    extents: &[SealedSegment],
    floor: u64,
    head: u64,
    min_cursor: Option<u64>,
    now_ms: u64,
) -> Option<u64> {
    if policy.keeps_everything() {
        return None;
    }
    let total = extents.iter().map(|e| e.bytes).sum();
    let mut new = match droppable(policy, extents, total, min_cursor, now_ms) {
        0 => floor,
        n => extents[n - 1].last_id + 1,
    };
    if policy.by_cursor {
        new = new.max(min_cursor.map_or(head, |c| c.min(head)) + 1);
    }
    let new = new.min(head + 1);
    (new > floor).then_some(new)
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

#[cfg(test)]
mod small_tests {
    use super::*;

    /// A small group storing ids 3..=30 (floor 3 inside the first extent,
    /// which holds 1..=10) in three extents of 100 bytes; the last record's
    /// timestamp is 3,500.
    fn extents() -> Vec<SealedSegment> {
        [(10, 1_000), (20, 2_000), (30, 3_500)]
            .iter()
            .map(|&(last_id, ts)| SealedSegment {
                last_id,
                bytes: 100,
                next_first_timestamp_ms: ts,
            })
            .collect()
    }

    #[test]
    fn plan_small_table() {
        let cursor = Retention {
            by_cursor: true,
            ..Default::default()
        };
        let age = Retention {
            max_age_ms: 500,
            ..Default::default()
        };
        let size = Retention {
            max_bytes: 150,
            ..Default::default()
        };
        let both = Retention {
            by_cursor: true,
            max_bytes: 250,
            ..Default::default()
        };
        // (policy, min cursor, now, expected new floor)
        let cases: Vec<(Retention, Option<u64>, u64, Option<u64>)> = vec![
            (Retention::default(), Some(30), 99_999, None),
            // Cursor retention: to the record, inside an extent.
            (cursor, Some(14), 0, Some(15)),
            (cursor, Some(30), 0, Some(31)),
            (cursor, None, 0, Some(31)),
            (cursor, Some(2), 0, None),
            (cursor, Some(3), 0, Some(4)),
            // Age: whole extents whose newest record is older than now - 500.
            (age, None, 1_400, None),
            (age, None, 1_501, Some(11)),
            (age, None, 2_600, Some(21)),
            (age, None, 4_001, Some(31)),
            // Size: whole extents while the log exceeds 150 bytes.
            (size, None, 0, Some(21)),
            // Both: whichever goes further.
            (both, Some(5), 0, Some(11)),
            (both, Some(25), 0, Some(26)),
        ];
        for (policy, min_cursor, now, want) in cases {
            assert_eq!(
                plan_small(&policy, &extents(), 3, 30, min_cursor, now),
                want,
                "{policy:?} cursor {min_cursor:?} now {now}"
            );
        }
    }

    #[test]
    fn plan_small_never_lowers_the_floor_nor_passes_the_head() {
        let cursor = Retention {
            by_cursor: true,
            ..Default::default()
        };
        // The floor already above what the policy would keep.
        assert_eq!(plan_small(&cursor, &extents(), 25, 30, Some(14), 0), None);
        // A cursor above the head (clamped at load; here as input) stops at it.
        assert_eq!(
            plan_small(&cursor, &extents(), 3, 30, Some(99), 0),
            Some(31)
        );
        // An empty group (everything dropped already).
        assert_eq!(plan_small(&cursor, &[], 31, 30, None, 0), None);
    }
}
