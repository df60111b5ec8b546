//! Group and membership operations pipelined on one connection
//! (format-spec/protocol.md 1.4): every request still observes every
//! earlier request of its connection, whether it started at once (a write
//! behind writes it cannot observe early, which then share a commit round)
//! or waited (a read, or a write whose answer depends on an earlier one's
//! outcome). Each test sends its requests in one write, so that all of them
//! are in the node's socket before the first commit round completes.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;

use tidemark_protocol::{encode_request_in, ErrorCode, JoinStart, MemberEntry, Request, Response};

use crate::cluster::{client_addr, free_ports, leader, start_member};
use crate::event_loop::{decode, encode, hello, pull, responses, stats};
use crate::harness::Node;

/// Sends HELLO (id 1) and `reqs` (ids 2, 3, ...) in one write on a new
/// connection and returns every response by request id.
fn one_write(node: &Node, reqs: &[Request<'_>]) -> HashMap<u64, Vec<u8>> {
    one_write_in(&node.addr, 1, reqs)
}

/// [`one_write`] to `addr` at protocol `version` (2: RECALL and EDIT): HELLO
/// asks for it, and every frame behind HELLO carries it.
fn one_write_in(addr: &str, version: u8, reqs: &[Request<'_>]) -> HashMap<u64, Vec<u8>> {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut out = Vec::new();
    if version == 1 {
        hello(&mut out);
    } else {
        let hello = Request::Hello {
            min_version: version,
            max_version: version,
            client_name: "pipelined",
        };
        encode(1, &hello, &mut out);
    }
    for (i, r) in reqs.iter().enumerate() {
        encode_request_in(version, i as u64 + 2, r, &mut out).unwrap();
    }
    s.write_all(&out).unwrap();
    let ids: Vec<u64> = (1..=reqs.len() as u64 + 1).collect();
    responses(&mut s, &ids)
}

fn join(group: u64, user: u64, start: JoinStart) -> Request<'static> {
    Request::Join { group, user, start }
}

fn send(group: u64, sender: u64, client_msg_id: u64) -> Request<'static> {
    Request::Send {
        group,
        sender,
        client_msg_id,
        payload: b"hi",
    }
}

fn members(group: u64) -> Request<'static> {
    Request::Members {
        group,
        after_user: 0,
        max_count: 100,
    }
}

/// The error code of an ERROR response, `None` for any other.
fn error_code(f: &[u8]) -> Option<ErrorCode> {
    match decode(f) {
        Response::Error(e) => Some(e.code),
        _ => None,
    }
}

/// A JOIN's `(cursor, head)`; panics on any other answer.
fn joined(f: &[u8], what: &str) -> (u64, u64) {
    match decode(f) {
        Response::Join { cursor, head } => (cursor, head),
        other => panic!("{what}: got {other:?}"),
    }
}

/// A MEMBERS page as `(user, cursor)` pairs; panics on any other answer.
fn member_list(f: &[u8], what: &str) -> Vec<(u64, u64)> {
    match decode(f) {
        Response::Members { members, .. } => members
            .iter()
            .map(|&MemberEntry { user, cursor }| (user, cursor))
            .collect(),
        other => panic!("{what}: got {other:?}"),
    }
}

/// CREATE_GROUP, JOIN, SEND and PULL in one write see each other, under a
/// send policy that checks the sender's membership: a SEND behind its
/// sender's JOIN is accepted, one before it refused.
#[test]
fn create_join_send_and_pull_in_one_write_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--send-requires-membership"]);
    let got = one_write(
        &node,
        &[
            Request::CreateGroup { group: 1 }, // 2
            send(1, 6, 1),                     // 3: 6 is no member yet
            join(1, 5, JoinStart::Earliest),   // 4
            send(1, 5, 1),                     // 5
            pull(1, 5),                        // 6
            join(1, 6, JoinStart::Earliest),   // 7
            send(1, 6, 2),                     // 8
            pull(1, 6),                        // 9
            Request::CreateGroup { group: 1 }, // 10: exists
        ],
    );
    assert!(matches!(decode(&got[&2]), Response::CreateGroup));
    assert_eq!(error_code(&got[&3]), Some(ErrorCode::NotMember));
    assert_eq!(joined(&got[&4], "JOIN behind CREATE_GROUP"), (0, 0));
    assert!(
        matches!(decode(&got[&5]), Response::Send { msg_id: 1, .. }),
        "SEND behind its sender's JOIN: {:?}",
        decode(&got[&5])
    );
    match decode(&got[&6]) {
        // Its own message: its cursor followed it (read), the head shows it.
        Response::Pull { records, head, .. } => assert_eq!((records.count, head), (0, 1)),
        other => panic!("PULL behind JOIN and SEND got {other:?}"),
    }
    assert!(matches!(decode(&got[&8]), Response::Send { msg_id: 2, .. }));
    match decode(&got[&9]) {
        Response::Pull { records, .. } => assert_eq!(records.count, 2),
        other => panic!("PULL behind both SENDs got {other:?}"),
    }
    assert_eq!(error_code(&got[&10]), Some(ErrorCode::GroupExists));
}

/// A JOIN pipelined right behind the CREATE_GROUP of its group succeeds,
/// for many groups in one write.
#[test]
fn a_join_pipelined_behind_its_groups_creation_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut reqs = Vec::new();
    for g in 1..=100 {
        reqs.push(Request::CreateGroup { group: g });
        reqs.push(join(g, 1000 + g, JoinStart::Head));
    }
    reqs.push(members(100));
    let got = one_write(&node, &reqs);
    for g in 1..=100u64 {
        assert!(matches!(decode(&got[&(2 * g)]), Response::CreateGroup));
        assert_eq!(joined(&got[&(2 * g + 1)], "JOIN behind its CREATE"), (0, 0));
    }
    assert_eq!(member_list(&got[&202], "MEMBERS"), vec![(1100, 0)]);
}

/// DELETE_GROUP, CREATE_GROUP and JOIN of the same id in one write: the
/// creation sees the deletion (not GROUP_EXISTS), the JOIN the new, empty
/// group.
#[test]
fn delete_create_and_join_of_one_group_in_one_write() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let first = one_write(
        &node,
        &[
            Request::CreateGroup { group: 7 },
            join(7, 1, JoinStart::Head),
            send(7, 1, 1),
        ],
    );
    assert!(matches!(
        decode(&first[&4]),
        Response::Send { msg_id: 1, .. }
    ));
    let got = one_write(
        &node,
        &[
            Request::DeleteGroup { group: 7 }, // 2
            Request::CreateGroup { group: 7 }, // 3
            join(7, 2, JoinStart::Earliest),   // 4
            members(7),                        // 5
            Request::GroupInfo { group: 7 },   // 6
        ],
    );
    assert!(matches!(decode(&got[&2]), Response::DeleteGroup));
    assert!(
        matches!(decode(&got[&3]), Response::CreateGroup),
        "CREATE_GROUP behind DELETE_GROUP of its id: {:?}",
        decode(&got[&3])
    );
    assert_eq!(joined(&got[&4], "JOIN of the new group"), (0, 0));
    assert_eq!(member_list(&got[&5], "MEMBERS"), vec![(2, 0)]);
    match decode(&got[&6]) {
        Response::GroupInfo(i) => assert_eq!((i.head, i.member_count), (0, 1)),
        other => panic!("GROUP_INFO got {other:?}"),
    }
}

/// LEAVE then JOIN of one member, JOIN then LEAVE, JOIN then CLEAR_HISTORY
/// then JOIN again, and a member's JOIN behind its own SEND, all in one
/// write: each operation's answer is the one it gets after the earlier ones
/// completed.
#[test]
fn membership_operations_in_one_write_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    // Member 5 at cursor 0, two messages: head 2.
    let first = one_write(
        &node,
        &[
            Request::CreateGroup { group: 3 },
            join(3, 5, JoinStart::Head),
            send(3, 9, 1),
            send(3, 9, 2),
        ],
    );
    assert!(matches!(
        decode(&first[&5]),
        Response::Send { msg_id: 2, .. }
    ));
    let got = one_write(
        &node,
        &[
            Request::Leave { group: 3, user: 5 }, // 2
            join(3, 5, JoinStart::Head),          // 3: a new membership at 2
            join(3, 6, JoinStart::Head),          // 4
            Request::Leave { group: 3, user: 6 }, // 5: sees the join
            join(3, 7, JoinStart::Earliest),      // 6
            Request::ClearHistory {
                group: 3,
                user: 7,
                up_to: 2,
            }, // 7: sees the join
            join(3, 7, JoinStart::Earliest),      // 8: already a member
            send(3, 7, 1),                        // 9: message 3
            join(3, 7, JoinStart::Earliest),      // 10: its cursor followed
            members(3),                           // 11
        ],
    );
    assert!(matches!(decode(&got[&2]), Response::Leave));
    assert_eq!(joined(&got[&3], "JOIN behind LEAVE"), (2, 2));
    assert_eq!(joined(&got[&4], "JOIN"), (2, 2));
    assert!(
        matches!(decode(&got[&5]), Response::Leave),
        "LEAVE behind JOIN: {:?}",
        decode(&got[&5])
    );
    assert_eq!(joined(&got[&6], "JOIN"), (0, 2));
    match decode(&got[&7]) {
        Response::ClearHistory { join_point, cursor } => assert_eq!((join_point, cursor), (3, 2)),
        other => panic!("CLEAR_HISTORY behind JOIN got {other:?}"),
    }
    assert_eq!(joined(&got[&8], "JOIN behind CLEAR_HISTORY").0, 2);
    assert!(matches!(decode(&got[&9]), Response::Send { msg_id: 3, .. }));
    assert_eq!(joined(&got[&10], "JOIN behind its own SEND").0, 3);
    assert_eq!(
        member_list(&got[&11], "MEMBERS"),
        vec![(5, 2), (7, 3)],
        "5 joined again, 6 left, 7 stays"
    );
}

/// A JOIN refused by a membership limit (decided when its round is
/// applied) is seen by a PULL pipelined behind it: the user is no member.
#[test]
fn a_join_refused_by_a_limit_is_seen_by_a_pipelined_pull() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &["--members-per-group-max", "2", "--groups-per-user-max", "1"],
    );
    let got = one_write(
        &node,
        &[
            Request::CreateGroup { group: 1 }, // 2
            Request::CreateGroup { group: 2 }, // 3
            join(1, 1, JoinStart::Head),       // 4
            join(1, 2, JoinStart::Head),       // 5
            join(1, 3, JoinStart::Head),       // 6: the group is full
            pull(1, 3),                        // 7
            join(2, 1, JoinStart::Head),       // 8: user 1 is in a group
            pull(2, 1),                        // 9
            pull(1, 2),                        // 10
            members(1),                        // 11
        ],
    );
    assert_eq!(joined(&got[&4], "JOIN"), (0, 0));
    assert_eq!(joined(&got[&5], "JOIN"), (0, 0));
    assert_eq!(error_code(&got[&6]), Some(ErrorCode::LimitExceeded));
    assert_eq!(error_code(&got[&7]), Some(ErrorCode::NotMember));
    assert_eq!(error_code(&got[&8]), Some(ErrorCode::LimitExceeded));
    assert_eq!(error_code(&got[&9]), Some(ErrorCode::NotMember));
    assert!(matches!(decode(&got[&10]), Response::Pull { .. }));
    assert_eq!(member_list(&got[&11], "MEMBERS"), vec![(1, 0), (2, 0)]);
}

/// JOINs pipelined on one connection share commit rounds: a thousand of
/// them take far fewer rounds than a thousand (one round each when every
/// JOIN waited for the one before).
#[test]
fn joins_pipelined_on_one_connection_share_commit_rounds() {
    const JOINS: u64 = 1_000;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--requests-in-flight-max", "1024"]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    let before = stats(&mut c)["engine.commit_rounds"];
    let reqs: Vec<Request<'_>> = (1..=JOINS).map(|u| join(1, u, JoinStart::Head)).collect();
    let got = one_write(&node, &reqs);
    let rounds = stats(&mut c)["engine.commit_rounds"] - before;
    for id in 2..=JOINS + 1 {
        assert_eq!(joined(&got[&id], "pipelined JOIN"), (0, 0));
    }
    assert!(
        rounds * 4 <= JOINS,
        "{JOINS} pipelined JOINs took {rounds} commit rounds"
    );
    match decode(&one_write(&node, &[Request::GroupInfo { group: 1 }])[&2]) {
        Response::GroupInfo(i) => assert_eq!(i.member_count, JOINS),
        other => panic!("GROUP_INFO got {other:?}"),
    }
}

/// SENDs, then RECALL and EDIT of their messages, in one write (the ids
/// are the ones the SENDs get, as a sole writer of a new group knows
/// them): each change starts once the SENDs before it are answered, so its
/// target is checked against their messages (protocol.md 1.4); changes
/// behind changes start at once. Returns the answers by request id.
fn sends_then_changes_of_their_messages(addr: &str, group: u64) -> HashMap<u64, Vec<u8>> {
    one_write_in(
        addr,
        2,
        &[
            Request::CreateGroup { group },      // 2
            join(group, 5, JoinStart::Earliest), // 3
            send(group, 5, 1),                   // 4: message 1
            send(group, 5, 2),                   // 5: message 2
            Request::Recall {
                group,
                sender: 5,
                client_msg_id: 3,
                target: 1,
            }, // 6: record 3
            Request::Edit {
                group,
                sender: 5,
                client_msg_id: 4,
                target: 2,
                payload: b"edited",
            }, // 7: record 4
            send(group, 5, 5),                   // 8: message 5
            Request::Recall {
                group,
                sender: 5,
                client_msg_id: 6,
                target: 5,
            }, // 9: record 6, right behind the SEND of its target
            Request::History {
                group,
                user: 5,
                before_msg_id: 0,
                max_count: 100,
            }, // 10
        ],
    )
}

/// The answers of [`sends_then_changes_of_their_messages`], checked.
fn check_changes_of_pipelined_sends(got: &HashMap<u64, Vec<u8>>) {
    let id_of = |req: u64| match decode(&got[&req]) {
        Response::Send { msg_id, .. }
        | Response::Recall { msg_id, .. }
        | Response::Edit { msg_id, .. } => msg_id,
        other => panic!("request {req}: got {other:?}"),
    };
    assert_eq!(
        [4, 5, 6, 7, 8, 9].map(id_of),
        [1, 2, 3, 4, 5, 6],
        "the SENDs' messages and the changes of them, in request order"
    );
    match decode(&got[&10]) {
        Response::History { records, .. } => {
            let mut shown: Vec<(u64, u8, u8)> = records
                .iter(true)
                .map(|r| {
                    let r = r.expect("a valid record");
                    (r.msg_id(), r.kind(), r.flags())
                })
                .collect();
            shown.sort_unstable();
            // (id, kind, flags): messages 1 and 5 shown recalled (flag 1),
            // 2 edited by record 4 (kind 1), records 3 and 6 recalls
            // (kind 2).
            assert_eq!(
                shown,
                vec![
                    (1, 0, 1),
                    (2, 0, 0),
                    (3, 2, 0),
                    (4, 1, 0),
                    (5, 0, 1),
                    (6, 2, 0)
                ]
            );
        }
        other => panic!("HISTORY behind the changes got {other:?}"),
    }
}

/// RECALL and EDIT pipelined behind the SENDs of their targets on one
/// connection are checked against those messages, not refused "no such
/// message" while the SENDs' round is still being written.
#[test]
fn a_change_pipelined_behind_the_send_of_its_target_sees_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    check_changes_of_pipelined_sends(&sends_then_changes_of_their_messages(&node.addr, 1));
}

/// The same on a replica set's leader, whose rounds take a Raft commit
/// before they are applied (the same connection code; a longer round).
#[test]
fn a_change_pipelined_behind_the_send_of_its_target_sees_it_on_a_replica_set() {
    let root = tempfile::tempdir().unwrap();
    let ports = free_ports();
    let _members: Vec<_> = ports
        .keys()
        .map(|&id| start_member(id, root.path(), &ports))
        .collect();
    let addr = client_addr(&ports, leader(&ports));
    check_changes_of_pipelined_sends(&sends_then_changes_of_their_messages(&addr, 9));
}
