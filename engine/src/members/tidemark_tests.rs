//! Tests of members and tidemarks through the public API: joins, ACKs,
//! pulls, unread, sync, history, read receipts, retention, persistence.

use std::path::Path;

use crate::{Config, Engine, Error, JoinStart, Retention};

fn config(dir: &Path) -> Config {
    let mut c = Config::segmented(dir);
    c.payload_bytes_max = 1024;
    c.segment_bytes_max = 4096;
    c.index_interval_bytes = 512;
    c
}

fn send(e: &Engine, group: u64, sender: u64, n: u64) {
    for _ in 0..n {
        let head = e.head(group).unwrap();
        let body = format!("g{group} m{} from {sender}", head + 1);
        e.append(group, sender, (group << 32) | (head + 1), body.as_bytes())
            .unwrap();
    }
}

fn ids(batch: &crate::ReadBatch) -> Vec<u64> {
    batch.records().map(|r| r.header.msg_id).collect()
}

#[test]
fn join_start_sets_cursor_and_history_floor() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    send(&e, 1, 100, 10);
    assert_eq!(e.join(1, 1, JoinStart::Head).unwrap(), 10);
    assert_eq!(e.join(1, 2, JoinStart::Earliest).unwrap(), 0);
    assert_eq!(e.join(1, 3, JoinStart::At(5)).unwrap(), 4);
    assert_eq!(e.join(1, 4, JoinStart::At(99)).unwrap(), 10);
    // Joining again changes nothing.
    assert_eq!(e.join(1, 3, JoinStart::Earliest).unwrap(), 4);
    assert_eq!(
        ids(&e.pull(1, 1, 100, 1 << 20, None).unwrap().batch),
        Vec::<u64>::new()
    );
    assert_eq!(
        ids(&e.pull(1, 3, 100, 1 << 20, None).unwrap().batch),
        (5..=10).collect::<Vec<_>>()
    );
    // History never reaches below the join point.
    let h = e.history(1, 1, None, 100, usize::MAX).unwrap();
    assert!(ids(&h.batch).is_empty() && h.complete);
    let h = e.history(1, 3, None, 100, usize::MAX).unwrap();
    assert_eq!(ids(&h.batch), (5..=10).collect::<Vec<_>>());
    assert_eq!(e.members(1).unwrap(), vec![1, 2, 3, 4]);
}

#[test]
fn non_members_see_nothing_of_the_group() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    send(&e, 1, 100, 3);
    let not_member =
        |r: Result<(), Error>| assert!(matches!(r, Err(Error::NotMember { group: 1, user: 9 })));
    not_member(e.pull(1, 9, 10, 1000, None).map(|_| ()));
    not_member(e.ack(1, 9, 1).map(|_| ()));
    not_member(e.history(1, 9, None, 10, usize::MAX).map(|_| ()));
    not_member(e.leave(1, 9));
    assert!(e.unread(9).is_empty());
    assert!(e.sync(9, 10, 1000, None).unwrap().groups.is_empty());
    e.join(1, 9, JoinStart::Earliest).unwrap();
    e.leave(1, 9).unwrap();
    not_member(e.pull(1, 9, 10, 1000, None).map(|_| ()));
}

#[test]
fn acks_only_move_forward_and_never_above_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 5, JoinStart::Earliest).unwrap();
    send(&e, 1, 100, 8);
    assert_eq!(e.ack(1, 5, 6).unwrap(), 6);
    assert_eq!(e.ack(1, 5, 2).unwrap(), 6);
    assert!(matches!(
        e.ack(1, 5, 9),
        Err(Error::CursorAboveHead {
            requested: 9,
            head: 8,
            ..
        })
    ));
    assert_eq!(e.unread(5)[0].cursor, 6);
    let results = e.batch_ack(5, &[(1, 7), (2, 1), (1, 3)]);
    assert_eq!((results[0].cursor, results[0].error.is_none()), (7, true));
    assert!(matches!(
        results[1].error,
        Some(Error::GroupNotFound { group: 2 })
    ));
    assert_eq!(results[1].cursor, 0);
    assert_eq!((results[2].cursor, results[2].error.is_none()), (7, true));
}

/// format-spec/protocol.md 4.12: a refused item reports the cursor as it
/// stands right after that item, not after the whole batch; and finding it
/// costs one membership lookup, not a walk of every group of the user.
#[test]
fn batch_ack_reports_each_refused_items_cursor_after_that_item() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    // The user is a member of many groups; group 1 has 8 messages.
    let groups = 300u64;
    let mut last = None;
    for g in 1..=groups {
        e.submit_create_group(g).unwrap();
        last = Some(e.submit_join(g, 5, JoinStart::Earliest).unwrap());
    }
    e.wait_op(last.unwrap()).unwrap();
    send(&e, 1, 100, 8);
    e.ack(1, 5, 2).unwrap();
    // (1, 1000) is above the head: refused while the cursor is still 2; the
    // later (1, 7) then moves it to 7. Group 2 is empty: every item above 0
    // is refused with cursor 0.
    let mut pairs = vec![(1, 1000), (1, 7), (1, 1001)];
    pairs.extend((0..2_000).map(|i| (2 + i % (groups - 1), 50)));
    let rows_before = e.stats().membership_rows_listed;
    let results = e.batch_ack(5, &pairs);
    assert!(matches!(
        results[0].error,
        Some(Error::CursorAboveHead { head: 8, .. })
    ));
    assert_eq!(results[0].cursor, 2, "the cursor after the first item");
    assert_eq!((results[1].cursor, results[1].error.is_none()), (7, true));
    assert_eq!(results[2].cursor, 7);
    for r in &results[3..] {
        assert!(matches!(
            r.error,
            Some(Error::CursorAboveHead { head: 0, .. })
        ));
        assert_eq!(r.cursor, 0);
    }
    assert_eq!(
        e.stats().membership_rows_listed,
        rows_before,
        "a batch ack walks no user's list of groups"
    );
    assert_eq!(e.unread(5).len(), groups as usize);
    assert_eq!(e.stats().membership_rows_listed, rows_before + groups);
}

#[test]
fn paging_with_ack_up_to_delivers_everything_once() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 5, JoinStart::Head).unwrap();
    send(&e, 1, 100, 50);
    let mut got = Vec::new();
    let mut ack = None;
    loop {
        let p = e.pull(1, 5, 7, 1 << 20, ack).unwrap();
        got.extend(ids(&p.batch));
        if !p.batch.has_more {
            ack = Some(p.batch.last_id);
            break;
        }
        ack = Some(p.batch.last_id);
    }
    e.pull(1, 5, 7, 1 << 20, ack).unwrap();
    assert_eq!(got, (1..=50).collect::<Vec<_>>());
    assert_eq!(e.unread(5)[0].unread, 0);
}

#[test]
fn own_messages_are_not_unread_for_a_caught_up_sender() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 1, JoinStart::Head).unwrap();
    e.join(1, 2, JoinStart::Head).unwrap();
    send(&e, 1, 1, 3);
    assert_eq!(e.unread(1)[0].unread, 0, "caught-up sender");
    assert_eq!(e.unread(2)[0].unread, 3);
    // User 2 is behind: its own message does not move its cursor.
    send(&e, 1, 2, 1);
    assert_eq!(
        e.unread(2)[0],
        crate::Unread {
            group_id: 1,
            head: 4,
            cursor: 0,
            unread: 4
        }
    );
    assert_eq!(e.unread(1)[0].unread, 1);
}

#[test]
fn unread_and_sync_cover_every_group_of_the_user_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    for g in 1..=5 {
        e.create_group(g).unwrap();
        e.join(g, 7, JoinStart::Head).unwrap();
        send(&e, g, 100, g * 2);
    }
    e.create_group(6).unwrap();
    e.join(6, 7, JoinStart::Head).unwrap();
    let unread = e.unread(7);
    assert_eq!(
        unread
            .iter()
            .map(|u| (u.group_id, u.unread))
            .collect::<Vec<_>>(),
        vec![(1, 2), (2, 4), (3, 6), (4, 8), (5, 10), (6, 0)]
    );
    // Small budget: a continuation, and following it covers every group once.
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let s = e.sync(7, 3, 200, after).unwrap();
        assert!(!s.groups.is_empty());
        let bytes: usize = s.groups.iter().map(|g| g.batch.bytes).sum();
        assert!(bytes <= 200 || s.groups.len() == 1, "budget kept: {bytes}");
        for g in &s.groups {
            assert!(g.batch.count <= 3 && g.batch.count >= 1);
            assert_eq!(ids(&g.batch)[0], 1);
            seen.push(g.unread.group_id);
        }
        match s.continue_after {
            Some(a) => after = Some(a),
            None => break,
        }
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5]);
}

#[test]
fn history_pages_backwards_to_the_join_point() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    send(&e, 1, 100, 20);
    e.join(1, 3, JoinStart::At(6)).unwrap();
    send(&e, 1, 100, 5);
    let mut pages = Vec::new();
    let mut before = None;
    loop {
        let h = e.history(1, 3, before, 8, usize::MAX).unwrap();
        pages.push(ids(&h.batch));
        if h.complete {
            break;
        }
        before = Some(h.batch.records().next().unwrap().header.msg_id);
    }
    assert_eq!(
        pages,
        vec![
            (18..=25).collect::<Vec<_>>(),
            (10..=17).collect(),
            (6..=9).collect()
        ]
    );
}

#[test]
fn read_count_counts_cursors_at_or_above() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    for u in 1..=10 {
        e.join(1, u, JoinStart::Head).unwrap();
    }
    send(&e, 1, 100, 10);
    for u in 1..=10 {
        e.ack(1, u, u).unwrap();
    }
    for m in 1..=10u64 {
        assert_eq!(e.read_count(1, m).unwrap() as u64, 11 - m);
    }
    e.leave(1, 10).unwrap();
    assert_eq!(e.read_count(1, 10).unwrap(), 0);
}

#[test]
fn retention_by_cursor_and_size_raises_the_floor_with_a_typed_signal() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 1, JoinStart::Head).unwrap();
    e.join(1, 2, JoinStart::Head).unwrap();
    send(&e, 1, 100, 300);
    e.set_retention(
        1,
        Retention {
            by_cursor: true,
            ..Default::default()
        },
    )
    .unwrap();
    e.ack(1, 1, 300).unwrap();
    e.ack(1, 2, 150).unwrap();
    e.checkpoint().unwrap();
    let floor = e
        .history(1, 2, Some(2), 1, usize::MAX)
        .unwrap()
        .earliest_visible;
    assert!(floor > 1 && floor <= 151, "floor {floor}");
    // Member 2 still gets everything above its cursor.
    assert_eq!(
        ids(&e.pull(1, 2, 1000, 1 << 20, None).unwrap().batch),
        (151..=300).collect::<Vec<_>>()
    );

    e.set_retention(
        1,
        Retention {
            max_bytes: 6000,
            ..Default::default()
        },
    )
    .unwrap();
    e.checkpoint().unwrap();
    let err = e.pull(1, 2, 10, 1 << 20, None).map(|_| ()).unwrap_err();
    let Error::BelowRetentionFloor { group: 1, earliest } = err else {
        panic!("{err}")
    };
    assert!(earliest > 151);
    let h = e
        .history(1, 2, Some(earliest + 3), 100, usize::MAX)
        .unwrap();
    assert!(h.truncated_by_retention && h.complete);
    assert_eq!(ids(&h.batch), (earliest..earliest + 3).collect::<Vec<_>>());
    // Acknowledging the gap lets the member go on.
    e.ack(1, 2, earliest - 1).unwrap();
    assert_eq!(
        e.pull(1, 2, 1, 1 << 20, None).unwrap().batch.last_id,
        earliest
    );
    e.close().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(matches!(e.pull(1, 1, 1, 100, None), Ok(p) if p.batch.count == 0));
    assert_eq!(
        e.history(1, 2, None, 1, usize::MAX)
            .unwrap()
            .earliest_visible,
        earliest
    );
}

/// Sends `n` messages of sizes from 1 to 700 bytes, pseudo-random.
fn send_varied(e: &Engine, group: u64, n: u64, seed: &mut u64) {
    for _ in 0..n {
        *seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 1 + (*seed >> 33) as usize % 700;
        let head = e.head(group).unwrap();
        e.append(group, 100, (group << 32) | (head + 1), &vec![b'x'; len])
            .unwrap();
    }
}

/// Checks `history` against a brute-force oracle: the newest records
/// below `before`, not below the join point, at most `max_count` and at
/// most `max_bytes` bytes except that the newest always comes.
fn check_history_against_oracle(e: &Engine, group: u64, user: u64, join_point: u64) {
    let head = e.head(group).unwrap();
    let all = e.read(group, 0, usize::MAX, usize::MAX).unwrap();
    let sizes: Vec<usize> = all.records().map(|r| r.bytes.len()).collect();
    assert_eq!(sizes.len() as u64, head);
    let befores = [
        None,
        Some(head + 5),
        Some(head),
        Some(join_point + 1),
        Some(join_point),
        Some(1),
        Some(head / 2 + 1),
    ];
    for before in befores {
        for max_count in [0, 1, 2, 7, 40, usize::MAX] {
            for max_bytes in [0, 1, 300, 701, 2000, 4096, 9000, 1 << 20, usize::MAX] {
                let h = e
                    .history(group, user, before, max_count, max_bytes)
                    .unwrap();
                let end = before.unwrap_or(head + 1).min(head + 1);
                let (mut start, mut bytes) = (end, 0);
                while start > join_point.max(1)
                    && ((end - start) as usize) < max_count
                    && (start == end || bytes + sizes[start as usize - 2] <= max_bytes)
                {
                    bytes += sizes[start as usize - 2];
                    start -= 1;
                }
                let what = format!("before {before:?} count {max_count} bytes {max_bytes}");
                assert_eq!(ids(&h.batch), (start..end).collect::<Vec<_>>(), "{what}");
                assert_eq!(h.batch.bytes, bytes, "{what}");
                let oldest = if max_count == 0 { end } else { start };
                assert_eq!(h.complete, oldest <= join_point.max(1), "{what}");
            }
        }
    }
}

#[test]
fn history_pages_by_bytes_as_well_as_by_count() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    let mut seed = 7;
    send_varied(&e, 1, 60, &mut seed);
    e.join(1, 3, JoinStart::At(9)).unwrap();
    send_varied(&e, 1, 140, &mut seed);
    // Live: the active segment's newest records are still in its tail.
    check_history_against_oracle(&e, 1, 3, 9);
    e.close().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    check_history_against_oracle(&e, 1, 3, 9);
}

#[test]
fn history_reads_only_what_the_page_holds() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 1, JoinStart::Earliest).unwrap();
    // About 130 segments of 4 KiB.
    for i in 1..=2000u64 {
        e.append(1, 100, i, &[b'y'; 200]).unwrap();
    }
    e.join(1, 2, JoinStart::Head).unwrap();
    e.close().unwrap();
    // Reopened, nothing is open or verified; a pull at the head loads
    // the group (its active segment).
    let vfs = crate::io::FaultyVfs::new();
    let e = Engine::open_with_vfs(config(dir.path()), std::sync::Arc::new(vfs.clone())).unwrap();
    assert_eq!(e.pull(1, 2, 10, 1 << 20, None).unwrap().batch.count, 0);
    let opens = vfs.control.opens.load(std::sync::atomic::Ordering::SeqCst);
    // max_count as large as the wire allows, the budget of a small frame.
    let h = e.history(1, 1, None, u32::MAX as usize, 4000).unwrap();
    // Only the segments holding the page were opened (and verified), not
    // the ~130 below it.
    let opened = vfs.control.opens.load(std::sync::atomic::Ordering::SeqCst) - opens;
    assert!(opened <= 2, "history opened {opened} segment files");
    assert!(h.batch.count <= 4000 / 200, "{} records", h.batch.count);
    let record = e.read(1, 0, 1, usize::MAX).unwrap().bytes;
    let fit = 4000 / record;
    assert_eq!(
        ids(&h.batch),
        (2001 - fit as u64..=2000).collect::<Vec<_>>()
    );
    assert!(!h.complete);
}

#[test]
fn memberships_and_cursors_survive_restart_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    for u in 1..=20 {
        e.join(1, u, JoinStart::Head).unwrap();
    }
    e.join(2, 1, JoinStart::Head).unwrap();
    send(&e, 1, 100, 30);
    for u in 1..=20 {
        e.ack(1, u, u).unwrap();
    }
    e.close().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    for u in 1..=20 {
        assert_eq!(e.unread(u)[0].cursor, u, "clean restart keeps every cursor");
    }
    assert_eq!(e.unread(1).len(), 2);
    // Persisted cursors survive a crash; later ACKs may be forgotten, never
    // more than that, and never backward of what was persisted.
    e.flush_cursors().unwrap();
    for u in 1..=20 {
        e.ack(1, u, 25).unwrap();
    }
    e.leave(1, 20).unwrap();
    e.simulate_crash();
    let e = Engine::open(config(dir.path())).unwrap();
    for u in 1..=19 {
        let c = e.unread(u)[0].cursor;
        assert!(c == u || c == 25, "user {u}: cursor {c}");
    }
    assert!(e.unread(20).is_empty(), "leave is durable");
    assert_eq!(e.read_count(1, 1).unwrap(), 19);
}

#[test]
fn a_damaged_checkpoint_falls_back_to_the_previous_one_with_memberships() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 5, JoinStart::Head).unwrap();
    send(&e, 1, 100, 10);
    e.checkpoint().unwrap();
    e.join(1, 6, JoinStart::Head).unwrap();
    e.close().unwrap();
    let cp = crate::state::checkpoint_tests::newest_manifest(dir.path());
    let mut bytes = std::fs::read(&cp).unwrap();
    bytes[40] ^= 1;
    std::fs::write(&cp, bytes).unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    assert!(e.recovery_report().checkpoint_rejected.is_some());
    assert_eq!(e.members(1).unwrap(), vec![5, 6]);
    assert_eq!(e.head(1).unwrap(), 10);
}

#[test]
fn deleting_a_group_removes_it_from_its_members() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 7, JoinStart::Head).unwrap();
    e.join(2, 7, JoinStart::Head).unwrap();
    e.delete_group(1).unwrap();
    assert_eq!(
        e.unread(7).iter().map(|u| u.group_id).collect::<Vec<_>>(),
        vec![2]
    );
    e.create_group(3).unwrap(); // reuses the slot of group 1
    assert_eq!(
        e.unread(7).iter().map(|u| u.group_id).collect::<Vec<_>>(),
        vec![2]
    );
}

#[test]
fn fan_out_to_10_000_members_delivers_each_message_once_per_member() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(1).unwrap();
    let members = 10_000u64;
    for u in 1..=members {
        e.join(1, u, JoinStart::Earliest).unwrap();
    }
    let msgs = 400u64;
    send(&e, 1, 1_000_000, msgs);
    let mut x: u64 = 7;
    let mut expected_total = 0;
    for u in 1..=members {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let c = (x >> 33) % (msgs + 1);
        e.ack(1, u, c).unwrap();
        expected_total += msgs - c;
    }
    let unread_total: u64 = (1..=members).map(|u| e.unread(u)[0].unread).sum();
    assert_eq!(unread_total, expected_total);
    let mut delivered = 0u64;
    for u in 1..=members {
        let mut ack = None;
        let mut next = e.unread(u)[0].cursor + 1;
        loop {
            let p = e.pull(1, u, 200, 1 << 20, ack).unwrap();
            for r in p.batch.records() {
                assert_eq!(
                    r.header.msg_id, next,
                    "member {u}: each message once, in order"
                );
                next += 1;
                delivered += 1;
            }
            ack = Some(p.batch.last_id);
            if !p.batch.has_more {
                break;
            }
        }
        e.ack(1, u, ack.unwrap()).unwrap();
        assert_eq!(next, msgs + 1);
    }
    assert_eq!(delivered, expected_total);
    assert_eq!(e.read_count(1, msgs).unwrap() as u64, members);
}
