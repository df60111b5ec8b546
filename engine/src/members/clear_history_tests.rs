//! A member's history clear (ClearHistory entries, format-spec/storage.md
//! section 15.2) and the node's default retention policy stored with each
//! group it creates: what members see, unread counts, and both through a
//! checkpoint, through replay and into a replica.

use std::path::Path;

use crate::{Config, Engine, Error, JoinStart, Retention};

fn config(dir: &Path) -> Config {
    let mut c = Config::segmented(dir);
    c.payload_bytes_max = 1024;
    c.segment_bytes_max = 4096;
    c.index_interval_bytes = 512;
    c
}

fn send(e: &Engine, group: u64, n: u64) {
    for _ in 0..n {
        let head = e.head(group).unwrap();
        e.append(group, 100, head + 1, format!("m{}", head + 1).as_bytes())
            .unwrap();
    }
}

fn ids(batch: &crate::ReadBatch) -> Vec<u64> {
    batch.records().map(|r| r.header.msg_id).collect()
}

fn unread_of(e: &Engine, user: u64, group: u64) -> u64 {
    e.unread(user)
        .into_iter()
        .find(|u| u.group_id == group)
        .map_or(u64::MAX, |u| u.unread)
}

/// What user `u` of group 1 sees: (history ids, pull ids, unread).
fn view(e: &Engine, u: u64) -> (Vec<u64>, Vec<u64>, u64) {
    let h = e.history(1, u, None, 100, usize::MAX).unwrap();
    let p = e.pull(1, u, 100, usize::MAX, None).unwrap();
    (ids(&h.batch), ids(&p.batch), unread_of(e, u, 1))
}

fn range(a: u64, b: u64) -> Vec<u64> {
    (a..=b).collect()
}

#[test]
fn a_clear_hides_history_from_one_member_and_keeps_unread_exact() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 1, JoinStart::Earliest).unwrap();
    e.join(1, 2, JoinStart::Earliest).unwrap();
    send(&e, 1, 10);
    e.ack(1, 1, 3).unwrap();
    assert_eq!(e.read_count(1, 5).unwrap(), 0);

    // Member 1 clears up to 6: its history and pull start at 7, its
    // cursor rises to 6 (what it cleared is acknowledged), so its unread
    // count is the 4 messages it can still read.
    assert_eq!(e.clear_history(1, 1, 6).unwrap(), 7);
    assert_eq!(view(&e, 1), (range(7, 10), range(7, 10), 4));
    assert_eq!(e.cursor(1, 1).unwrap(), 6);
    let h = e.history(1, 1, None, 100, usize::MAX).unwrap();
    assert_eq!((h.earliest_visible, h.complete), (7, true));
    // Read receipts count the raised cursor.
    assert_eq!(e.read_count(1, 5).unwrap(), 1);
    // Member 2 still reads everything.
    assert_eq!(view(&e, 2), (range(1, 10), range(1, 10), 10));

    // Never lowered: a clear below the floor changes nothing, and a clear
    // below a cursor that is ahead leaves the cursor where it is.
    assert_eq!(e.clear_history(1, 1, 2).unwrap(), 7);
    e.ack(1, 1, 9).unwrap();
    assert_eq!(e.clear_history(1, 1, 8).unwrap(), 9);
    assert_eq!(e.cursor(1, 1).unwrap(), 9);
    assert_eq!(view(&e, 1), (range(9, 10), range(10, 10), 1));
    // Above the head: everything, up to the head only.
    assert_eq!(e.clear_history(1, 1, u64::MAX).unwrap(), 11);
    assert_eq!(view(&e, 1), (vec![], vec![], 0));
    send(&e, 1, 2);
    assert_eq!(view(&e, 1), (range(11, 12), range(11, 12), 2));

    // Only members clear.
    assert!(matches!(
        e.clear_history(1, 3, 5),
        Err(Error::NotMember { group: 1, user: 3 })
    ));
    assert!(matches!(
        e.clear_history(2, 1, 5),
        Err(Error::GroupNotFound { group: 2 })
    ));
    e.close().unwrap();
}

#[test]
fn a_clear_survives_replay_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Replay, not a checkpoint, must bring the first clear back.
    c.checkpoint_interval_ms = 3_600_000;
    c.checkpoint_journal_bytes = 1 << 40;
    {
        let e = Engine::open(c.clone()).unwrap();
        e.create_group(1).unwrap();
        e.join(1, 1, JoinStart::Earliest).unwrap();
        e.join(1, 2, JoinStart::Earliest).unwrap();
        send(&e, 1, 10);
        e.clear_history(1, 1, 4).unwrap();
        // Dropped without close: no checkpoint, no cursor flush.
        e.simulate_crash();
    }
    {
        let e = Engine::open(c.clone()).unwrap();
        assert_eq!(view(&e, 1), (range(5, 10), range(5, 10), 6));
        assert_eq!(view(&e, 2), (range(1, 10), range(1, 10), 10));
        // Now through a checkpoint: the member row holds the join point.
        e.clear_history(1, 1, 7).unwrap();
        e.checkpoint().unwrap();
        e.close().unwrap();
    }
    let e = Engine::open(c).unwrap();
    assert_eq!(view(&e, 1), (range(8, 10), range(8, 10), 3));
    assert_eq!(view(&e, 2), (range(1, 10), range(1, 10), 10));
    e.close().unwrap();
}

/// The node's default policy is stored with each group at its creation:
/// a group keeps it when the default changes, and one created before the
/// default existed keeps "everything".
#[test]
fn the_default_policy_is_stored_with_the_groups_created_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let policy = Retention {
        by_cursor: true,
        max_age_ms: 0,
        max_bytes: 1 << 20,
    };
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.close().unwrap();
    let mut c = config(dir.path());
    c.retention_default = policy;
    let e = Engine::open(c).unwrap();
    e.create_group(2).unwrap();
    assert_eq!(e.group_info(1).unwrap().retention, Retention::default());
    assert_eq!(e.group_info(2).unwrap().retention, policy);
    // A group's own policy replaces the default.
    e.set_retention(2, Retention::default()).unwrap();
    e.create_group(3).unwrap();
    e.simulate_crash();
    // Replay (no checkpoint was written after the creations), under
    // another default: each group keeps what was journaled for it.
    let mut c = config(dir.path());
    c.retention_default = Retention {
        max_age_ms: 1,
        ..Retention::default()
    };
    let e = Engine::open(c).unwrap();
    assert_eq!(e.group_info(1).unwrap().retention, Retention::default());
    assert_eq!(e.group_info(2).unwrap().retention, Retention::default());
    assert_eq!(e.group_info(3).unwrap().retention, policy);
    e.close().unwrap();
}
