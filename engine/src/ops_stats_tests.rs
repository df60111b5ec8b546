//! The figures `EngineStats` gives an operator in O(1), kept where they
//! change: memberships (the cursor table's
//! count), damaged groups (in at recovery, a load's verification or an
//! apply's damage, out at deletion), messages stored (checked against a
//! walk of GROUP_INFO through sends, promotions, retention, deletions and
//! reopens), and the writes-stopped state.

use std::path::Path;

use crate::{Config, Engine, Error, JoinStart};

const A: u64 = 0xA1;
const B: u64 = 0xB2;

fn config(dir: &Path) -> Config {
    let mut c = Config::segmented(dir);
    c.payload_bytes_max = 1024;
    c.segment_bytes_max = 8192;
    c
}

fn fill(e: &Engine, group: u64, n: u64) {
    e.create_group(group).unwrap();
    for i in 1..=n {
        e.append(group, 100, i, format!("m{i}").as_bytes()).unwrap();
    }
}

#[test]
fn memberships_count_joins_and_leaves_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = Engine::open(config(dir.path())).unwrap();
        fill(&e, A, 1);
        fill(&e, B, 1);
        for user in 1..=3 {
            e.join(A, user, JoinStart::Head).unwrap();
        }
        e.join(B, 1, JoinStart::Head).unwrap();
        assert_eq!(e.stats().memberships, 4);
        e.leave(A, 2).unwrap();
        assert_eq!(e.stats().memberships, 3);
        e.delete_group(B).unwrap();
        assert_eq!(e.stats().memberships, 2);
        e.close().unwrap();
    }
    // The clean close wrote a checkpoint: this open restores the
    // memberships with the bulk loader (`members::cursors::Loader`), which
    // must count them too.
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(e.stats().memberships, 2);
    assert_eq!(e.membership_memory().0, 2, "the member lists agree");
    assert!(!e.stats().writes_stopped);
    // Then both paths at once: a checkpoint holds some memberships (bulk
    // loaded), the journal after it the rest (replayed one by one).
    e.join(A, 4, JoinStart::Head).unwrap();
    e.checkpoint().unwrap();
    fill(&e, B + 1, 1);
    e.join(B + 1, 1, JoinStart::Head).unwrap();
    e.leave(A, 1).unwrap();
    assert_eq!(e.stats().memberships, 3);
    e.simulate_crash();
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(e.stats().memberships, 3);
    assert_eq!(e.membership_memory().0, 3, "the member lists agree");
}

#[test]
fn a_damaged_group_is_counted_until_it_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let e = Engine::open(config(dir.path())).unwrap();
        fill(&e, A, 20);
        fill(&e, B, 20);
        e.close().unwrap();
    }
    // Flip a byte inside the first record of A's only segment.
    let seg_dir = crate::logs::group_log::group_dir(dir.path(), A);
    let seg = std::fs::read_dir(&seg_dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[crate::logs::segment::SEGMENT_HEADER_BYTES + 40] ^= 0xFF;
    std::fs::write(&seg, &bytes).unwrap();
    {
        let e = Engine::open(config(dir.path())).unwrap();
        assert_eq!(e.stats().groups_damaged, 0, "not loaded yet, not known");
        // The first read loads A on the worker, which finds the damage.
        let ticket = match e.try_read(A, 0, 10, 1 << 20) {
            Err(Error::NotReady { ticket, .. }) => ticket,
            other => panic!("expected NotReady, got {:?}", other.map(|b| b.count)),
        };
        e.wait_ready(ticket).unwrap();
        assert!(matches!(
            e.try_read(A, 0, 10, 1 << 20),
            Err(Error::GroupDamaged { .. })
        ));
        assert_eq!(e.stats().groups_damaged, 1);
        e.close().unwrap();
    }
    // The checkpoint recorded the damage: recovery counts it at once.
    let e = Engine::open(config(dir.path())).unwrap();
    assert_eq!(e.stats().groups_damaged, 1);
    // A damaged group's messages are not counted as stored: B's are.
    assert_eq!(e.stats().messages_stored, 20);
    e.delete_group(A).unwrap();
    assert_eq!(e.stats().groups_damaged, 0);
    assert_eq!(e.stats().messages_stored, 20);
    e.delete_group(B).unwrap();
    assert_eq!(e.stats().groups_damaged, 0, "an intact group's deletion");
}

/// `floor..=head` of every listed group, from GROUP_INFO: what
/// `messages_stored` must equal (a walk the engine itself never makes).
fn stored_by_walk(e: &Engine, groups: &[u64]) -> u64 {
    groups
        .iter()
        .map(|&g| {
            let i = e.group_info(g).unwrap();
            (i.head + 1).saturating_sub(i.floor)
        })
        .sum()
}

#[test]
fn messages_stored_follow_sends_promotions_retention_deletes_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Small groups in the journal until 2 KiB, then their own segments.
    c.small_group_bytes_max = 2048;
    let payload = [7u8; 200];
    let e = Engine::open(c.clone()).unwrap();
    // 1 and 2 stay small; 3 is promoted; 4 is segmented and long.
    let groups = [1, 2, 3, 4];
    for (g, n) in [(1, 1), (2, 5), (3, 40), (4, 200)] {
        e.create_group(g).unwrap();
        for i in 1..=n {
            e.append(g, 100, i, &payload).unwrap();
        }
    }
    assert_eq!(e.stats().messages_stored, 246);
    assert_eq!(e.stats().messages_stored, stored_by_walk(&e, &groups));
    // Retention by cursor: a member read 150 of group 4's messages; the
    // sealed segments below that go at the next checkpoint.
    // So did a member of small group 2, which drops 3 of its 5.
    let by_cursor = crate::Retention {
        by_cursor: true,
        ..Default::default()
    };
    for (g, read) in [(4, 150), (2, 3)] {
        e.join(g, 9, JoinStart::Earliest).unwrap();
        e.ack(g, 9, read).unwrap();
        e.set_retention(g, by_cursor).unwrap();
    }
    e.checkpoint().unwrap();
    let floor = e.group_info(4).unwrap().floor;
    assert!(floor > 1, "retention dropped segments");
    assert_eq!(
        e.group_info(2).unwrap().floor,
        4,
        "retention trimmed the small group"
    );
    assert_eq!(e.stats().messages_stored, 1 + 2 + 40 + 201 - floor);
    assert_eq!(e.stats().messages_stored, stored_by_walk(&e, &groups));
    e.delete_group(2).unwrap();
    let left = [1, 3, 4];
    assert_eq!(e.stats().messages_stored, stored_by_walk(&e, &left));
    e.close().unwrap();
    // Recovery counts them again from what it restored.
    let e = Engine::open(c).unwrap();
    assert_eq!(e.stats().messages_stored, stored_by_walk(&e, &left));
    e.append(1, 100, 99, &payload).unwrap();
    assert_eq!(e.stats().messages_stored, stored_by_walk(&e, &left));
}
