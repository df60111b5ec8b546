//! Receipts (the seeds' `ack:N`) through the real binary:
//! SUBSCRIBE_RECEIPTS, RECEIPT coalesced per interval (each member once,
//! its latest cursor, only members whose cursor moved), READERS as the
//! pull side, RECEIPT_COUNTS above `--receipt-members-max`, nothing new
//! for connections that did not ask, and the client library's
//! [`Receipts`] (format-spec/protocol.md 4.21, 4.22, 5.3, 5.4).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tidemark_client::protocol::{ErrorCode, JoinStart, ReceiptCount, Subscription};
use tidemark_client::reliable::{Delivery, Receipts, ReliableConfig};
use tidemark_client::{Client, Event};

use crate::harness::Node;

/// Every event `c` receives until `until` says stop (checked after each
/// event), then for `drain` more: what a node that sent more than it
/// should would have sent by then.
fn events_until(c: &mut Client, until: impl Fn(&[Event]) -> bool, drain: Duration) -> Vec<Event> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !until(&got) {
        assert!(Instant::now() < deadline, "events so far: {got:?}");
        if let Some(e) = c.next_event(Duration::from_millis(100)).unwrap() {
            got.push(e);
        }
    }
    let end = Instant::now() + drain;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        if let Some(e) = c.next_event(left).unwrap() {
            got.push(e);
        }
    }
    got
}

/// The (user, cursor) entries of every RECEIPT of `group`, in order.
fn receipt_entries(events: &[Event], group: u64) -> Vec<(u64, u64)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Receipt { group: g, receipts } if *g == group => Some(receipts),
            _ => None,
        })
        .flatten()
        .map(|m| (m.user, m.cursor))
        .collect()
}

fn covers(events: &[Event], group: u64, users: &[u64]) -> bool {
    let entries = receipt_entries(events, group);
    users.iter().all(|u| entries.iter().any(|(e, _)| e == u))
}

/// One interval of ACKs by three paths (ACK, BATCH_ACK, PULL's
/// `ack_up_to`), several per member: the subscriber hears each member that
/// moved once, with its latest cursor, and nothing of the member whose
/// cursor did not move. The interval is long (1.5 s) so that every ACK of
/// the burst falls in one; a node that sent a receipt per ACK would list
/// member 10 five times, one that sent the first cursor would list 1.
#[test]
fn receipts_list_each_moved_member_once_with_its_latest_cursor() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--receipt-interval-ms", "1500"]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.create_group(2).unwrap();
    for u in [10, 11, 12] {
        admin.join(1, u, JoinStart::Head).unwrap();
    }
    admin.join(2, 10, JoinStart::Head).unwrap();
    let mut sub = node.client();
    sub.subscribe_receipts(42, &[1]).unwrap();
    // A version-1 subscriber of the same group's messages, and a
    // connection with no subscription at all.
    let mut v1 = node.client();
    v1.subscribe(Subscription::Groups(vec![1])).unwrap();
    let mut bare = node.client();
    bare.ping().unwrap();

    let ids: Vec<u64> = (1..=5)
        .map(|i| admin.send(1, 42, i, b"m").unwrap().msg_id)
        .collect();
    admin.send(2, 42, 9, b"other group").unwrap();
    // Member 10: five ACKs by three paths; 11: two; 12: none.
    admin.ack(1, 10, ids[0]).unwrap();
    admin.ack(1, 10, ids[1]).unwrap();
    admin
        .batch_ack(10, &[(1, ids[2]), (2, 1), (1, ids[3])])
        .unwrap();
    admin.pull(1, 10, ids[4], 10, 0).unwrap();
    admin.ack(1, 11, ids[1]).unwrap();
    admin.ack(1, 11, ids[2]).unwrap();
    admin.ack(1, 11, ids[0]).unwrap(); // below its cursor: no move

    let got = events_until(
        &mut sub,
        |e| covers(e, 1, &[10, 11]),
        Duration::from_millis(500),
    );
    assert_eq!(
        receipt_entries(&got, 1),
        [(10, ids[4]), (11, ids[2])],
        "each moved member once, latest cursor, ascending users: {got:?}"
    );
    assert!(
        got.iter()
            .all(|e| matches!(e, Event::Receipt { group: 1, .. })),
        "nothing of group 2, no counts, no pushes: {got:?}"
    );

    // The next interval: only what moved in it. Member 10 acknowledges
    // what it acknowledged already (no move), 12 moves.
    admin.ack(1, 10, ids[4]).unwrap();
    admin.ack(1, 12, ids[3]).unwrap();
    let got = events_until(
        &mut sub,
        |e| covers(e, 1, &[12]),
        Duration::from_millis(500),
    );
    assert_eq!(receipt_entries(&got, 1), [(12, ids[3])], "{got:?}");

    // The other connections saw nothing new: the v1 subscriber its pushes
    // only, the bare connection nothing at all.
    let v1_events = events_until(&mut v1, |_| true, Duration::from_millis(300));
    assert!(
        v1_events.iter().all(|e| matches!(e, Event::Push(_))),
        "{v1_events:?}"
    );
    assert!(!v1_events.is_empty(), "the v1 subscriber got its pushes");
    assert_eq!(
        events_until(&mut bare, |_| true, Duration::from_millis(300)),
        []
    );

    // UNSUBSCRIBE ends receipt subscriptions too.
    sub.unsubscribe().unwrap();
    admin.ack(1, 12, ids[4]).unwrap();
    assert_eq!(
        events_until(&mut sub, |_| true, Duration::from_millis(2_000)),
        []
    );
    // A receipt subscription to a group that does not exist is refused
    // whole.
    let refused = sub.subscribe_receipts(42, &[1, 99]);
    assert_eq!(
        refused.err().and_then(|e| e.code()),
        Some(ErrorCode::GroupNotFound)
    );
}

/// READERS pages the members at or above a message with their cursors,
/// as many pages as `max_count` asks, and agrees with READ_COUNT.
#[test]
fn readers_page_the_members_at_or_above_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    let users: Vec<u64> = (1..=30u64).map(|i| i * 7_919 % 1_009 + 1).collect();
    for &u in &users {
        c.join(1, u, JoinStart::Earliest).unwrap();
    }
    let ids: Vec<u64> = (1..=6)
        .map(|i| c.send(1, 5_000, i, b"m").unwrap().msg_id)
        .collect();
    let mut model = BTreeMap::new();
    for (k, &u) in users.iter().enumerate() {
        let to = ids[k % 6];
        c.ack(1, u, to).unwrap();
        model.insert(u, to);
    }
    for msg_id in [0, ids[0], ids[3], ids[5], ids[5] + 1] {
        let want: Vec<(u64, u64)> = model
            .iter()
            .filter(|&(_, &cur)| cur >= msg_id)
            .map(|(&u, &cur)| (u, cur))
            .collect();
        for page in [1, 4, 1000] {
            let (mut got, mut after, mut pages) = (Vec::new(), 0, 0);
            loop {
                let (list, next) = c.readers(1, msg_id, after, page).unwrap();
                assert!(list.len() <= page as usize);
                got.extend(list.iter().map(|m| (m.user, m.cursor)));
                pages += 1;
                if next == 0 {
                    break;
                }
                after = next;
            }
            assert_eq!(got, want, "msg {msg_id}, pages of {page}");
            assert!(pages >= want.len().div_ceil(page as usize));
        }
        assert_eq!(c.read_count(1, msg_id).unwrap(), want_len(&model, msg_id));
    }
    assert_eq!(
        c.readers(99, 1, 0, 10).err().and_then(|e| e.code()),
        Some(ErrorCode::GroupNotFound)
    );
}

fn want_len(model: &BTreeMap<u64, u64>, msg_id: u64) -> u64 {
    model.values().filter(|&&c| c >= msg_id).count() as u64
}

/// Above `--receipt-members-max` a group's receipts are counts of the
/// subscribed sender's recent messages (sent after the subscription):
/// RECEIPT_COUNTS, never a RECEIPT listing members, and another sender's
/// messages are not counted.
#[test]
fn a_group_above_the_threshold_gets_counts_of_the_senders_messages() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &["--receipt-members-max", "3", "--receipt-interval-ms", "200"],
    );
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    for u in 1..=5 {
        admin.join(1, u, JoinStart::Head).unwrap();
    }
    // Sent before the subscription: not one of the sender's recent ones.
    let early = admin.send(1, 42, 1, b"before").unwrap().msg_id;
    let mut sub = node.client();
    sub.subscribe_receipts(42, &[1]).unwrap();
    let mine: Vec<u64> = (2..=4)
        .map(|i| admin.send(1, 42, i, b"mine").unwrap().msg_id)
        .collect();
    let theirs = admin.send(1, 43, 1, b"theirs").unwrap().msg_id;
    // A retransmit of a message of 42 counts once.
    assert!(admin.send(1, 42, 3, b"mine").unwrap().duplicate);
    admin.ack(1, 1, mine[1]).unwrap();
    admin.ack(1, 2, mine[2]).unwrap();
    admin.ack(1, 3, theirs).unwrap();
    admin.ack(1, 4, early).unwrap();
    let want = vec![
        ReceiptCount {
            msg_id: mine[0],
            count: 3,
        },
        ReceiptCount {
            msg_id: mine[1],
            count: 3,
        },
        ReceiptCount {
            msg_id: mine[2],
            count: 2,
        },
    ];
    let done = |e: &[Event]| {
        e.iter()
            .any(|e| matches!(e, Event::ReceiptCounts { counts, .. } if *counts == want))
    };
    let got = events_until(&mut sub, done, Duration::from_millis(300));
    for e in &got {
        match e {
            Event::ReceiptCounts {
                group,
                sender,
                counts,
            } => {
                assert_eq!((*group, *sender), (1, 42));
                let ids: Vec<u64> = counts.iter().map(|c| c.msg_id).collect();
                assert_eq!(ids, mine, "the sender's recent messages only");
            }
            other => panic!("counts only above the threshold, got {other:?}"),
        }
    }
}

/// The client library's `Receipts`: tracked messages' delivery grows with
/// the members' ACKs (from pushes), and survives a cut connection (pulled
/// after it resubscribes).
#[test]
fn the_client_follows_its_messages_delivery_across_a_reconnect() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--receipt-interval-ms", "50"]);
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    for u in [10, 11, 12] {
        admin.join(1, u, JoinStart::Head).unwrap();
    }
    let a = admin.send(1, 42, 1, b"a").unwrap().msg_id;
    let b = admin.send(1, 42, 2, b"b").unwrap().msg_id;
    let mut receipts = Receipts::new(ReliableConfig::new(node.addr.clone()), 42);
    receipts.track(1, a);
    receipts.track(1, b);
    // Nothing acknowledged yet: nothing to report.
    assert_eq!(receipts.next(Duration::from_millis(300)).unwrap(), None);
    assert_eq!(receipts.delivered(1, a), Some(0));

    admin.ack(1, 10, a).unwrap();
    admin.ack(1, 11, b).unwrap();
    let want_a = Delivery {
        group: 1,
        msg_id: a,
        delivered: 2,
    };
    let mut seen = Vec::new();
    while receipts.delivered(1, a) != Some(2) || receipts.delivered(1, b) != Some(1) {
        let d = receipts
            .next(Duration::from_secs(10))
            .unwrap()
            .expect("an update");
        seen.push(d);
    }
    // Updates of the same frame still queued.
    while let Some(d) = receipts.next(Duration::from_millis(200)).unwrap() {
        seen.push(d);
    }
    assert!(seen.contains(&want_a), "{seen:?}");
    assert!(receipts.stats().receipts >= 1, "pushed, not only pulled");

    // Cut: an ACK made while no connection exists reaches the client by
    // the pull after it resubscribes.
    receipts.cut_connection();
    admin.ack(1, 12, b).unwrap();
    let d = receipts.next(Duration::from_secs(10)).unwrap();
    assert!(
        matches!(d, Some(Delivery { msg_id, delivered: 3, .. }) if msg_id == a)
            || matches!(d, Some(Delivery { msg_id, delivered: 2, .. }) if msg_id == b),
        "{d:?}"
    );
    while receipts.delivered(1, a) != Some(3) || receipts.delivered(1, b) != Some(2) {
        receipts
            .next(Duration::from_secs(10))
            .unwrap()
            .expect("an update");
    }
    assert!(receipts.stats().link.reconnects >= 1);
}

/// The next receipt frame of `group` `sub` gets (within 20 s), and
/// nothing else of that group for `drain` after it.
fn next_receipt(sub: &mut Client, group: u64, drain: Duration) -> Event {
    let is_receipt = |e: &Event| matches!(e, Event::Receipt { group: g, .. } | Event::ReceiptCounts { group: g, .. } if *g == group);
    let got = events_until(sub, |e| e.iter().any(is_receipt), drain);
    let receipts: Vec<Event> = got.into_iter().filter(is_receipt).collect();
    assert_eq!(receipts.len(), 1, "one receipt per interval: {receipts:?}");
    receipts.into_iter().next().expect("one receipt")
}

fn counts_of(e: &Event) -> Vec<(u64, u64)> {
    match e {
        Event::ReceiptCounts { counts, .. } => counts.iter().map(|c| (c.msg_id, c.count)).collect(),
        other => panic!("RECEIPT_COUNTS expected, got {other:?}"),
    }
}

fn listed(e: &Event) -> Vec<(u64, u64)> {
    match e {
        Event::Receipt { receipts, .. } => receipts.iter().map(|m| (m.user, m.cursor)).collect(),
        other => panic!("RECEIPT expected, got {other:?}"),
    }
}

/// A group that crosses `--receipt-members-max` gets the mode of its
/// member count when an interval begins (its first cursor move after the
/// previous flush; format-spec/protocol.md 4.22, "Changing mode"), both
/// ways, and in counts mode every interval in which a cursor moved gets a
/// RECEIPT_COUNTS of the sender's recent messages, those sent while the
/// group was small included. Members who join at the head are at the
/// head: their ACK of an older message moves nothing and is no receipt.
/// Before, the mode decided at the previous flush stayed until the next
/// one: two members joined while nothing moved, and the group of four
/// then got a list-mode RECEIPT for the next ACK.
#[test]
fn receipts_follow_a_group_across_the_threshold_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &["--receipt-members-max", "3", "--receipt-interval-ms", "300"],
    );
    let drain = Duration::from_millis(600);
    let mut admin = node.client();
    admin.create_group(7).unwrap();
    for u in [10, 20] {
        admin.join(7, u, JoinStart::Earliest).unwrap();
    }
    let mut sub = node.client();
    sub.subscribe_receipts(42, &[7]).unwrap();
    let m1 = admin.send(7, 42, 1, b"hello").unwrap().msg_id;
    admin.ack(7, 10, m1).unwrap();
    assert_eq!(listed(&next_receipt(&mut sub, 7, drain)), [(10, m1)]);

    // Two members join at the head: 4 members, above the threshold.
    // Their ACK of m1 moves no cursor: nothing is pushed.
    for u in [11, 12] {
        admin.join(7, u, JoinStart::Head).unwrap();
    }
    admin.ack(7, 11, m1).unwrap();
    let quiet = events_until(&mut sub, |_| true, drain);
    assert!(quiet.is_empty(), "no cursor moved: {quiet:?}");
    // The next move begins an interval of a group of 4: counts, m1 (sent
    // while the group was small) among the sender's recent messages.
    let m2 = admin.send(7, 42, 2, b"again").unwrap().msg_id;
    admin.ack(7, 11, m2).unwrap();
    assert_eq!(
        counts_of(&next_receipt(&mut sub, 7, drain)),
        [(m1, 3), (m2, 1)]
    );
    admin.ack(7, 20, m1).unwrap();
    assert_eq!(
        counts_of(&next_receipt(&mut sub, 7, drain)),
        [(m1, 4), (m2, 1)]
    );

    // Two members leave: 2 members, lists again from the next move.
    for u in [11, 12] {
        admin.leave(7, u).unwrap();
    }
    admin.ack(7, 20, m2).unwrap();
    assert_eq!(listed(&next_receipt(&mut sub, 7, drain)), [(20, m2)]);
}
