//! Edits and recalls (`edits.rs`, `logs/changes.rs`): the rules with their
//! typed refusals, retransmits, unread exact through a recall, and the
//! quiet ids across a checkpoint, replay and retention.

use crate::{Change, ChangeRefusal, ChangeRequest, Config, Engine, Error, JoinStart, Retention};

fn req(target: u64, sender: u64, cmid: u64, change: Change<'_>) -> ChangeRequest<'_> {
    ChangeRequest {
        group_id: 1,
        sender_id: sender,
        client_msg_id: cmid,
        target,
        change,
        admin: false,
    }
}

fn refusal(r: crate::Result<crate::Appended>) -> ChangeRefusal {
    match r {
        Err(Error::ChangeRefused { why, .. }) => why,
        other => panic!("not refused: {other:?}"),
    }
}

fn unread(e: &Engine, user: u64) -> u64 {
    e.unread(user)
        .into_iter()
        .find(|u| u.group_id == 1)
        .expect("a member")
        .unread
}

#[test]
fn only_the_sender_or_an_admin_changes_a_stored_message_once_recalled_never_again() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    for i in 1..=3 {
        e.append(1, 10, i, b"m").unwrap();
    }
    assert_eq!(unread(&e, 20), 3);
    // Someone else: refused; nothing stored.
    let r = e.change(&req(1, 11, 100, Change::Recall));
    assert_eq!(refusal(r), ChangeRefusal::NotSender);
    assert_eq!(e.head(1).unwrap(), 3);
    // No such message: 0, above the head.
    assert_eq!(
        refusal(e.change(&req(0, 10, 101, Change::Recall))),
        ChangeRefusal::NoSuchMessage
    );
    assert_eq!(
        refusal(e.change(&req(4, 10, 102, Change::Recall))),
        ChangeRefusal::NoSuchMessage
    );
    // The sender edits message 1: a record, not unread.
    let ed = e.change(&req(1, 10, 103, Change::Edit(b"new"))).unwrap();
    assert_eq!((ed.msg_id, ed.duplicate), (4, false));
    assert_eq!(unread(&e, 20), 3);
    // An edit is not a message to change.
    assert_eq!(
        refusal(e.change(&req(4, 10, 104, Change::Recall))),
        ChangeRefusal::NoSuchMessage
    );
    // An administrator recalls message 2 (not the sender's): the member's
    // unread drops by one.
    let mut admin = req(2, 99, 105, Change::Recall);
    admin.admin = true;
    assert_eq!(e.change(&admin).unwrap().msg_id, 5);
    assert_eq!(unread(&e, 20), 2);
    // Its retransmit gets the original answer, not "recalled".
    let again = e.change(&admin).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (5, true));
    // A recalled message is changed no more.
    assert_eq!(
        refusal(e.change(&req(2, 10, 106, Change::Edit(b"x")))),
        ChangeRefusal::Recalled
    );
    // The records are there in order, each target first in its payload.
    let b = e.read(1, 3, 10, usize::MAX).unwrap();
    let got: Vec<(u64, u8, Vec<u8>)> = b
        .records()
        .map(|r| (r.header.msg_id, r.header.kind, r.payload().to_vec()))
        .collect();
    assert_eq!(
        got,
        vec![
            (4, 1, [&1u64.to_le_bytes()[..], b"new"].concat()),
            (5, 2, 2u64.to_le_bytes().to_vec()),
        ]
    );
    // Reading everything: nothing unread; a new edit is not unread either.
    e.ack(1, 20, 5).unwrap();
    e.change(&req(3, 10, 107, Change::Edit(b"late"))).unwrap();
    assert_eq!(unread(&e, 20), 0);
    let sync = e.sync(20, 10, 1 << 20, None).unwrap();
    assert_eq!(
        sync.groups.len(),
        1,
        "an edit of a read message is delivered"
    );
    assert_eq!(sync.groups[0].unread.unread, 0);
}

#[test]
fn a_change_after_the_window_is_refused_for_everyone() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::new(dir.path());
    c.change_window_ms = 0;
    let e = Engine::open(c).unwrap();
    e.create_group(1).unwrap();
    e.append(1, 10, 1, b"m").unwrap();
    // A window of 0 ms passes once the clock moved by 1 ms.
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert_eq!(
        refusal(e.change(&req(1, 10, 2, Change::Recall))),
        ChangeRefusal::WindowPassed
    );
    let mut admin = req(1, 99, 3, Change::Edit(b"x"));
    admin.admin = true;
    assert_eq!(refusal(e.change(&admin)), ChangeRefusal::WindowPassed);
    // An edit's new payload plus its target id fit the payload limit.
    let big = vec![0u8; e.config().payload_bytes_max - 7];
    assert!(matches!(
        e.change(&req(1, 10, 4, Change::Edit(&big))),
        Err(Error::PayloadTooLarge { .. })
    ));
}

#[test]
fn unread_stays_exact_across_a_checkpoint_replay_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let open = || Engine::open(Config::new(dir.path())).unwrap();
    let e = open();
    e.create_group(1).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    e.join(1, 21, JoinStart::Earliest).unwrap();
    for i in 1..=4 {
        e.append(1, 10, i, b"m").unwrap();
    }
    e.change(&req(1, 10, 10, Change::Recall)).unwrap(); // 5
    e.checkpoint().unwrap();
    e.change(&req(2, 10, 11, Change::Recall)).unwrap(); // 6, replayed
    assert_eq!((unread(&e, 20), unread(&e, 21)), (2, 2));
    assert_eq!(e.group(1).unwrap().quiet_ids(), vec![1, 2, 5, 6]);
    e.simulate_crash();
    let e = open();
    assert_eq!((unread(&e, 20), unread(&e, 21)), (2, 2));
    assert_eq!(e.group(1).unwrap().quiet_ids(), vec![1, 2, 5, 6]);
    // Retention below every cursor: user 21 read up to 3, 20 nothing; the
    // quiet ids stay while 20 may still count above them.
    e.ack(1, 21, 3).unwrap();
    let policy = Retention {
        by_cursor: true,
        ..Retention::default()
    };
    e.set_retention(1, policy).unwrap();
    e.checkpoint().unwrap();
    assert_eq!((unread(&e, 20), unread(&e, 21)), (2, 1));
    e.ack(1, 20, 6).unwrap();
    e.ack(1, 21, 6).unwrap();
    e.checkpoint().unwrap();
    e.close().unwrap();
    let e = open();
    assert_eq!((unread(&e, 20), unread(&e, 21)), (0, 0));
    assert!(
        e.group_info(1).unwrap().floor > 1,
        "retention dropped records"
    );
    // Retention trimmed the quiet ids no member can count (the group's
    // extras are gone with them).
    assert_eq!(e.group(1).unwrap().quiet_ids(), Vec::<u64>::new());
    e.close().unwrap();
}

/// What readers of protocol versions 1 and 2 see of a group with an edit
/// and a recall: byte for byte the records of the spec's vectors
/// pull_response_v2.hex and pull_response_v1.hex (protocol.md 2.1, 7).
#[test]
fn presentations_match_the_protocol_vectors() {
    use crate::logs::group_log::{Chunk, ReadBatch};
    let section = |text: &str| {
        let frame: Vec<u8> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .map(|t| u8::from_str_radix(t, 16).unwrap())
            .collect();
        // PULL response: 16 header, cursor, head, has_more, count, bytes.
        frame[16 + 8 + 8 + 1 + 4 + 4..].to_vec()
    };
    let v1 = section(include_str!(
        "../../format-spec/vectors/protocol/pull_response_v1.hex"
    ));
    let v2 = section(include_str!(
        "../../format-spec/vectors/protocol/pull_response_v2.hex"
    ));
    let hello = section(include_str!(
        "../../format-spec/vectors/protocol/pull_response.hex"
    ));
    // Stored: 1001 "hello" (pull_response.hex's first record), then
    // 1002, the edit 1003 and the recall 1004 as version 2 shows them.
    let first_v2 = crate::logs::record::peek_len(&v2).unwrap();
    let first_hello = crate::logs::record::peek_len(&hello).unwrap();
    let stored = [&hello[..first_hello], &v2[first_v2..]].concat();
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    e.create_group(7).unwrap();
    e.group(7)
        .unwrap()
        .restore_quiet(vec![1001, 1003, 1004], vec![(1002, 1003)]);
    let batch = || ReadBatch {
        bytes: stored.len(),
        chunks: vec![Chunk::copied(stored.clone())],
        count: 4,
        last_id: 1004,
        has_more: false,
    };
    let shown = |b: ReadBatch| {
        let bytes: Vec<u8> = b.chunks.iter().flat_map(|c| c.bytes().to_vec()).collect();
        assert_eq!(bytes.len(), b.bytes);
        bytes
    };
    assert_eq!(shown(e.present(7, batch(), true)), v2);
    assert_eq!(shown(e.present(7, batch(), false)), v1);
    // A group without quiet ids shows a version 2 reader the stored bytes.
    e.create_group(8).unwrap();
    assert_eq!(shown(e.present(8, batch(), true)), stored);
    // HISTORY_LATEST's records (history_latest_response.hex, after its
    // next_before): 1002 with its edit's payload, 1001 recalled.
    let latest = {
        let text = include_str!("../../format-spec/vectors/protocol/history_latest_response.hex");
        let frame: Vec<u8> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .map(|t| u8::from_str_radix(t, 16).unwrap())
            .collect();
        frame[16 + 1 + 8 + 4 + 4..].to_vec()
    };
    let rec_1002 = &stored
        [first_hello..first_hello + crate::logs::record::peek_len(&stored[first_hello..]).unwrap()];
    let want = [
        crate::edits::shown_with(rec_1002, crate::FLAG_EDITED, b"world?"),
        crate::edits::shown_with(&stored[..first_hello], crate::FLAG_RECALLED, b""),
    ]
    .concat();
    assert_eq!(want, latest);
}

/// HISTORY_LATEST's page: every message in its latest state, the changes
/// left out, across a checkpoint and a crash (the latest edits stored in
/// the group record and replayed).
#[test]
fn history_latest_shows_each_message_as_it_reads_now() {
    use crate::{FLAG_EDITED, FLAG_RECALLED};
    let dir = tempfile::tempdir().unwrap();
    let open = || Engine::open(Config::new(dir.path())).unwrap();
    let e = open();
    e.create_group(1).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    for (i, p) in [b"a", b"b", b"c"].iter().enumerate() {
        e.append(1, 10, i as u64 + 1, *p).unwrap();
    }
    e.change(&req(2, 10, 10, Change::Edit(b"b2"))).unwrap(); // 4
    e.checkpoint().unwrap();
    e.change(&req(2, 10, 11, Change::Edit(b"b3"))).unwrap(); // 5
    e.change(&req(1, 10, 12, Change::Recall)).unwrap(); // 6
    e.change(&req(3, 10, 13, Change::Edit(b"c2"))).unwrap(); // 7
    let page = |e: &Engine, before: Option<u64>, n: usize| {
        let p = e.try_history_latest(1, 20, before, n, usize::MAX).unwrap();
        let recs: Vec<(u64, u8, u8, Vec<u8>)> = p
            .history
            .batch
            .chunks
            .iter()
            .flat_map(|c| {
                let mut out = Vec::new();
                let mut b = c.bytes();
                while let Some(len) = crate::logs::record::peek_len(b) {
                    let r = &b[..len];
                    assert_eq!(crc32fast::hash(&r[8..]).to_le_bytes(), r[4..8], "CRC");
                    out.push((
                        crate::logs::record::peek_msg_id(r),
                        r[40],
                        r[41],
                        r[44..].to_vec(),
                    ));
                    b = &b[len..];
                }
                out
            })
            .collect();
        assert_eq!(recs.len() as u64, p.history.batch.count);
        (recs, p.next_before, p.history.complete)
    };
    let check = |e: &Engine| {
        let all = page(e, None, 10);
        assert_eq!(
            all.0,
            vec![
                (1, 0, FLAG_RECALLED, vec![]),
                (2, 0, FLAG_EDITED, b"b3".to_vec()),
                (3, 0, FLAG_EDITED, b"c2".to_vec()),
            ]
        );
        assert_eq!((all.1, all.2), (1, true));
        // A page of changes only: nothing shown, and where to go on.
        assert_eq!(page(e, None, 2), (vec![], 6, false));
        let older = page(e, Some(6), 3);
        assert_eq!(older.0, vec![(3, 0, FLAG_EDITED, b"c2".to_vec())]);
        assert_eq!(older.1, 3);
    };
    check(&e);
    e.simulate_crash();
    let e = open();
    check(&e);
    e.close().unwrap();
}

fn reused(r: crate::Result<crate::Appended>) -> u64 {
    match r {
        Err(Error::KeyReused { msg_id, .. }) => msg_id,
        other => panic!("not KeyReused: {other:?}"),
    }
}

/// Messages, edits and recalls share one key space (storage.md section
/// 12, "One key space"): a key is a retransmit only of the request it
/// named (same kind, same target); reused for another request it is
/// refused with `KeyReused` naming the earlier one, and nothing is
/// stored. Before, a RECALL with the key of an earlier SEND answered
/// that SEND (`duplicate`) and recalled nothing. The same after a
/// restart (the window rebuilt from the log).
#[test]
fn a_key_reused_for_another_request_is_refused_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let check = |e: &Engine| {
        // The key of SEND 2 on a recall of message 1.
        assert_eq!(reused(e.change(&req(1, 42, 2, Change::Recall))), 2);
        // The key of the recall of 1 on an edit of 1, on a recall of 2, on
        // a send.
        assert_eq!(reused(e.change(&req(1, 42, 3, Change::Edit(b"e")))), 3);
        assert_eq!(reused(e.change(&req(2, 42, 3, Change::Recall))), 3);
        assert_eq!(reused(e.append(1, 42, 3, b"m")), 3);
        // The key of the edit of 2 on an edit of 1.
        assert_eq!(reused(e.change(&req(1, 42, 4, Change::Edit(b"e")))), 4);
        // True retransmits are answered as such.
        let again = e.change(&req(1, 42, 3, Change::Recall)).unwrap();
        assert_eq!((again.msg_id, again.duplicate), (3, true));
        let again = e
            .change(&req(2, 42, 4, Change::Edit(b"other bytes")))
            .unwrap();
        assert_eq!((again.msg_id, again.duplicate), (4, true));
        assert!(e.append(1, 42, 2, b"m").unwrap().duplicate);
        assert_eq!(e.head(1).unwrap(), 4, "nothing stored");
    };
    {
        let e = Engine::open(Config::new(dir.path())).unwrap();
        e.create_group(1).unwrap();
        assert_eq!(e.append(1, 42, 1, b"one").unwrap().msg_id, 1);
        assert_eq!(e.append(1, 42, 2, b"two").unwrap().msg_id, 2);
        let r = e.change(&req(1, 42, 3, Change::Recall)).unwrap();
        assert_eq!((r.msg_id, r.duplicate), (3, false));
        let ed = e.change(&req(2, 42, 4, Change::Edit(b"2!"))).unwrap();
        assert_eq!((ed.msg_id, ed.duplicate), (4, false));
        check(&e);
        // A batch with a reused key is refused whole.
        let batch = [
            crate::AppendRequest {
                group_id: 1,
                sender_id: 42,
                client_msg_id: 50,
                payload: b"fine",
            },
            crate::AppendRequest {
                group_id: 1,
                sender_id: 42,
                client_msg_id: 4,
                payload: b"reused",
            },
        ];
        assert!(matches!(
            e.append_batch(&batch),
            Err(Error::KeyReused { msg_id: 4, .. })
        ));
        assert_eq!(e.head(1).unwrap(), 4);
    }
    let e = Engine::open(Config::new(dir.path())).unwrap();
    check(&e);
}

/// HISTORY_LATEST's byte budget is for what is shown: the Edit and
/// Recall records it leaves out do not use it (protocol.md 4.30). Five
/// messages of 988 stored bytes, the newest edited with as large a
/// payload: a budget of 4028 (a 4096-byte frame's) shows four messages.
/// Before, the left-out edit took its share and three were shown.
#[test]
fn history_latest_spends_its_byte_budget_on_what_it_shows() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    let big = vec![7u8; 944];
    for i in 1..=5 {
        e.append(1, 10, i, &big).unwrap();
    }
    e.change(&req(5, 10, 6, Change::Edit(&big))).unwrap(); // 6
    let p = e.try_history_latest(1, 20, None, 100, 4028).unwrap();
    let b = &p.history.batch;
    assert_eq!(b.count, 4, "4 × 988 = 3952 bytes fit 4028");
    assert_eq!(b.bytes, 4 * 988);
    assert_eq!(p.next_before, 2, "ids 2..=6 covered");
    assert!(!p.history.complete);
    // The rest on the next page.
    let next = e.try_history_latest(1, 20, Some(2), 100, 4028).unwrap();
    assert_eq!((next.history.batch.count, next.next_before), (1, 1));
    assert!(next.history.complete);
    // `max_count` still counts the ids covered, changes included.
    let p = e.try_history_latest(1, 20, None, 3, 4028).unwrap();
    assert_eq!((p.history.batch.count, p.next_before), (2, 4));
}
