//! Recall and edit through the real binary: RECALL and
//! EDIT by the sender and by an admin sender, refused for others and after
//! the window with CHANGE_REFUSED and its rule; retransmits deduplicated;
//! unread exact (changes do not count, a recalled unread message stops
//! counting) across a SIGKILL; what a protocol version 2 client sees
//! (kinds, recalled messages) and what a version 1 client sees (empty
//! messages at the same ids) through pull, sync, history and push; the
//! reliable client's inbox and its latest state of a message; the `recall`
//! and `edit` commands (format-spec/protocol.md 2.1, 4.28, 4.29, 7).

use std::time::Duration;

use tidemark_client::protocol::{ErrorCode, JoinStart, Subscription};
use tidemark_client::reliable::{Inbox, Latest, ReliableClient, ReliableConfig};
use tidemark_client::{Client, ClientConfig, ClientError, Event, Kind, Message};

use crate::cli::{json, ok};
use crate::harness::Node;

fn v1_client(node: &Node) -> Client {
    let mut config = ClientConfig::new(node.addr.clone());
    config.max_version = 1;
    let c = Client::connect(&config).expect("connect a version 1 client");
    assert_eq!(c.version(), 1);
    c
}

fn unread(c: &mut Client, group: u64, user: u64) -> u64 {
    c.unread(user)
        .unwrap()
        .into_iter()
        .find(|g| g.group == group)
        .expect("a member")
        .unread
}

/// `(msg_id, kind, payload)` of each message.
fn shown(msgs: &[Message]) -> Vec<(u64, Kind, Vec<u8>)> {
    msgs.iter()
        .map(|m| (m.msg_id, m.kind, m.payload.clone()))
        .collect()
}

fn refusal(r: Result<tidemark_client::Sent, ClientError>) -> Option<u64> {
    match r {
        Err(ClientError::Server {
            code: ErrorCode::ChangeRefused,
            detail,
            ..
        }) => detail,
        other => panic!("not CHANGE_REFUSED: {:?}", other.map(|s| s.msg_id)),
    }
}

fn m(id: u64, kind: Kind, payload: &[u8]) -> (u64, Kind, Vec<u8>) {
    (id, kind, payload.to_vec())
}

#[test]
fn recall_and_edit_follow_the_rules_keep_unread_exact_and_show_per_version() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--admin-sender", "99"]);
    let mut c = node.client();
    assert_eq!(c.version(), 2);
    let mut old = v1_client(&node);
    // Subscribers of user 20: one of each version.
    let mut push2 = node.client();
    push2.subscribe(Subscription::User(20)).unwrap();
    let mut push1 = v1_client(&node);
    push1.subscribe(Subscription::User(20)).unwrap();

    c.create_group(1).unwrap();
    c.join(1, 10, JoinStart::Earliest).unwrap();
    c.join(1, 20, JoinStart::Earliest).unwrap();
    for (cmid, text) in [(1, "hello"), (2, "world")] {
        c.send(1, 10, cmid, text.as_bytes()).unwrap();
    }
    c.send(1, 30, 1, b"other").unwrap();
    assert_eq!(unread(&mut c, 1, 20), 3);

    // The sender edits 2: a record, not unread.
    let ed = c.edit(1, 10, 5, 2, b"world!").unwrap();
    assert_eq!((ed.msg_id, ed.duplicate), (4, false));
    assert_eq!(unread(&mut c, 1, 20), 3);
    // The sender recalls 1: member 20 had not read it.
    assert_eq!(c.recall(1, 10, 6, 1).unwrap().msg_id, 5);
    assert_eq!(unread(&mut c, 1, 20), 2);
    // A retransmit (same client_msg_id) stores nothing new.
    let again = c.recall(1, 10, 6, 1).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (5, true));
    // Refused: not the sender (1), no such message (3), recalled (4).
    assert_eq!(refusal(c.recall(1, 10, 7, 3)), Some(1));
    assert_eq!(refusal(c.edit(1, 10, 8, 4, b"x")), Some(3));
    assert_eq!(refusal(c.edit(1, 10, 9, 1, b"x")), Some(4));
    // An admin sender recalls someone else's message.
    assert_eq!(c.recall(1, 99, 1, 3).unwrap().msg_id, 6);
    assert_eq!(unread(&mut c, 1, 20), 1);
    // A version 1 client cannot send RECALL (not in its version).
    assert!(matches!(
        old.recall(1, 10, 10, 2),
        Err(ClientError::Protocol(_))
    ));

    let v2 = vec![
        m(1, Kind::Recalled, b""),
        m(2, Kind::Message, b"world"),
        m(3, Kind::Recalled, b""),
        m(4, Kind::Edit { target: 2 }, b"world!"),
        m(5, Kind::Recall { target: 1 }, b""),
        m(6, Kind::Recall { target: 3 }, b""),
    ];
    // Version 1: the same ids, every change and recalled message an empty
    // message.
    let v1: Vec<_> = (1..=6)
        .map(|id| m(id, Kind::Message, if id == 2 { b"world" } else { b"" }))
        .collect();
    assert_eq!(shown(&c.pull(1, 20, 0, 100, 0).unwrap().messages), v2);
    assert_eq!(shown(&old.pull(1, 20, 0, 100, 0).unwrap().messages), v1);
    let (groups, _) = c.sync(20, 100, 1 << 20, 0).unwrap();
    assert_eq!(
        (groups[0].unread, shown(&groups[0].messages)),
        (1, v2.clone())
    );
    let (groups, _) = old.sync(20, 100, 1 << 20, 0).unwrap();
    assert_eq!(shown(&groups[0].messages), v1);
    let (mut hist, _) = c.history(1, 20, 0, 100).unwrap();
    hist.reverse();
    assert_eq!(shown(&hist), v2);
    let (mut hist, _) = old.history(1, 20, 0, 100).unwrap();
    hist.reverse();
    assert_eq!(shown(&hist), v1);
    // The latest state of each message, the changes left out.
    let (latest, has_more, next_before) = c.history_latest(1, 20, 0, 100).unwrap();
    assert_eq!(
        shown(&latest),
        vec![
            m(3, Kind::Recalled, b""),
            m(2, Kind::Edited, b"world!"),
            m(1, Kind::Recalled, b""),
        ]
    );
    assert_eq!((has_more, next_before), (false, 1));
    // A page of changes only says where to go on.
    let (latest, has_more, next_before) = c.history_latest(1, 20, 0, 2).unwrap();
    assert_eq!((latest.len(), has_more, next_before), (0, true, 5));
    assert!(matches!(
        old.history_latest(1, 20, 0, 100),
        Err(ClientError::Protocol(_))
    ));
    // Pushes, per subscriber version.
    let pushed = |client: &mut Client| {
        let mut got = Vec::new();
        while got.len() < 6 {
            match client.next_event(Duration::from_secs(10)).unwrap() {
                Some(Event::Push(msgs)) => got.extend(msgs),
                Some(_) => {}
                None => panic!("pushes missing: {got:?}"),
            }
        }
        shown(&got)
    };
    // Pushed as they were accepted: 1 and 3 were not recalled yet then.
    let mut at_push = v2.clone();
    at_push[0] = m(1, Kind::Message, b"hello");
    at_push[2] = m(3, Kind::Message, b"other");
    assert_eq!(pushed(&mut push2), at_push);
    let mut at_push = v1.clone();
    at_push[0] = m(1, Kind::Message, b"hello");
    at_push[2] = m(3, Kind::Message, b"other");
    assert_eq!(pushed(&mut push1), at_push);

    // Everything read: a new edit is delivered but not unread.
    c.ack(1, 20, 6).unwrap();
    c.edit(1, 10, 11, 2, b"world?").unwrap();
    assert_eq!(unread(&mut c, 1, 20), 0);
    assert_eq!(c.sync(20, 100, 1 << 20, 0).unwrap().0.len(), 1);

    // Across a SIGKILL (the quiet ids from the checkpoint and the journal).
    drop((c, old, push1, push2));
    let node = node.restart_after_kill();
    let mut c = node.client();
    // The ACK may be lost with the kill (cursors persist every second):
    // message 2 is the only one above any cursor that counts.
    let row = c
        .unread(20)
        .unwrap()
        .into_iter()
        .find(|g| g.group == 1)
        .unwrap();
    assert_eq!(row.unread, u64::from(row.cursor < 2), "{row:?}");
    c.join(1, 21, JoinStart::Earliest).unwrap();
    assert_eq!(unread(&mut c, 1, 21), 1, "only message 2 counts");
    let page = c.pull(1, 21, 0, 100, 0).unwrap();
    let mut after = v2.clone();
    after.push(m(7, Kind::Edit { target: 2 }, b"world?"));
    assert_eq!(shown(&page.messages), after);
}

#[test]
fn a_change_after_the_window_is_refused_with_its_rule() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &["--change-window-ms", "0", "--admin-sender", "99"],
    );
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.send(1, 10, 1, b"too late").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(refusal(c.recall(1, 10, 2, 1)), Some(2));
    assert_eq!(refusal(c.edit(1, 99, 3, 1, b"x")), Some(2));
    assert_eq!(c.group_info(1).unwrap().head, 1, "nothing stored");
}

#[test]
fn the_inbox_keeps_the_latest_state_and_the_commands_recall_and_edit() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();
    let config = ReliableConfig::new(node.addr.clone());
    let mut sender = ReliableClient::new(config.clone());
    sender.create_group(1).unwrap();
    sender.join(1, 20, JoinStart::Earliest).unwrap();
    sender.join(1, 21, JoinStart::Earliest).unwrap();
    let first = sender.send(1, 10, b"hello").unwrap().msg_id;
    let second = sender.send(1, 10, b"world").unwrap().msg_id;
    sender.edit(1, 10, second, b"world!").unwrap();
    sender.edit(1, 10, second, b"world!!").unwrap();
    sender.recall(1, 10, first).unwrap();
    let refused = sender.recall(1, 11, second).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::ChangeRefused));

    let mut inbox = Inbox::new(config, 20);
    let got = inbox.pull_all(1).unwrap();
    assert_eq!(got.len(), 5, "every record once: {got:?}");
    assert_eq!(inbox.latest(1, first), Latest::Recalled);
    assert_eq!(
        inbox.latest(1, second),
        Latest::Edited {
            payload: b"world!!".to_vec(),
            edit_id: 4
        }
    );
    // Delivered again (pulled from a fresh cursor): the filter drops them.
    assert!(inbox.pull_all(1).unwrap().is_empty());
    inbox.close().unwrap();

    // The commands: text and JSON, and the rule of a refusal.
    let out = ok(&[
        "edit", "--addr", a, "--group", "1", "--sender", "10", "--msg-id", "2", "new text",
    ]);
    assert_eq!(out, "edited message 2 of group 1: edit msg_id 6\n");
    let j = json(&[
        "recall", "--addr", a, "--group", "1", "--sender", "10", "--msg-id", "2",
    ]);
    assert_eq!((j.u("msg_id"), j.u("target")), (7, 2));
    let out = crate::cli::tidemark(&[
        "recall", "--addr", a, "--group", "1", "--sender", "10", "--msg-id", "2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CHANGE_REFUSED") && err.contains("recalled"),
        "{err}"
    );
    let pulled = ok(&["pull", "--addr", a, "--group", "1", "--user", "21"]);
    assert!(
        pulled.contains("#2] ") && pulled.contains("(recalled)"),
        "{pulled}"
    );
    assert!(pulled.contains("(edit of #2) new text"), "{pulled}");
    assert!(
        pulled.contains("#7] ") && pulled.contains("(recall of #2)"),
        "{pulled}"
    );
    let latest = ok(&[
        "history", "--addr", a, "--group", "1", "--user", "21", "--latest",
    ]);
    assert_eq!(latest.lines().count(), 3, "{latest}");
    assert!(
        latest.contains("#2] ") && latest.contains("(recalled)"),
        "{latest}"
    );
    assert!(
        latest.contains("#1] ") && latest.contains("(recalled)"),
        "{latest}"
    );
    assert!(
        latest.ends_with("2 message(s), newest first; no older ones\n"),
        "{latest}"
    );
}

/// One key space for SEND, RECALL and EDIT (format-spec/protocol.md
/// 4.28, storage.md section 12): a RECALL whose key is an earlier SEND's
/// is refused with KEY_REUSED (detail: the message the key names) and
/// recalls nothing; before, it was answered as that SEND's duplicate
/// (`msg_id 2, duplicate 1`) and message 1 stayed readable. A true
/// retransmit of a recall is still a duplicate; a SEND with a recall's
/// key is refused too.
#[test]
fn a_key_reused_for_another_request_is_refused_with_key_reused() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 20, JoinStart::Earliest).unwrap();
    assert_eq!(c.send(1, 42, 1, b"one").unwrap().msg_id, 1);
    assert_eq!(c.send(1, 42, 2, b"two").unwrap().msg_id, 2);
    let key_reused = |r: Result<tidemark_client::Sent, ClientError>| match r {
        Err(ClientError::Server {
            code: ErrorCode::KeyReused,
            detail,
            ..
        }) => detail,
        other => panic!(
            "not KEY_REUSED: {:?}",
            other.map(|s| (s.msg_id, s.duplicate))
        ),
    };
    assert_eq!(key_reused(c.recall(1, 42, 2, 1)), Some(2));
    let page = c.pull(1, 20, 0, 10, 0).unwrap();
    assert_eq!(
        shown(&page.messages),
        [m(1, Kind::Message, b"one"), m(2, Kind::Message, b"two")],
        "message 1 is not recalled, nothing was stored"
    );
    let r = c.recall(1, 42, 3, 1).unwrap();
    assert_eq!((r.msg_id, r.duplicate), (3, false));
    let again = c.recall(1, 42, 3, 1).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (3, true));
    assert_eq!(key_reused(c.recall(1, 42, 3, 2)), Some(3));
    assert_eq!(key_reused(c.send(1, 42, 3, b"three")), Some(3));
    assert_eq!(key_reused(c.edit(1, 42, 1, 2, b"2!")), Some(1));
    assert_eq!(c.group_info(1).unwrap().head, 3);
}
