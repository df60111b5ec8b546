//! Members and groups through the real binary: MEMBERS
//! pages (dense, no member twice, cursors as the ACKs left them, stable
//! while members join and leave), GROUP_INFO after sends and ACKs, SEND's
//! membership check (`serve --send-requires-membership`, NOT_MEMBER, the
//! system senders, and the default that keeps version 1's rule), and the
//! `members` and `group-info` subcommands (format-spec/protocol.md 4.9,
//! 4.19, 4.20).

use std::collections::BTreeMap;

use tidemark_client::protocol::{ErrorCode, JoinStart, Request, Response, RetentionPolicy};
use tidemark_client::reliable::{Error, ReliableClient, ReliableConfig};
use tidemark_client::Client;

use crate::cli::{json, tidemark, Json};
use crate::harness::Node;

/// Every member of `group` and its cursor, paged `page` at a time from
/// after `after`; asserts each page's size and order on the way.
fn all_members(c: &mut Client, group: u64, page: u32) -> Vec<(u64, u64)> {
    let (mut out, mut after) = (Vec::new(), 0);
    loop {
        let (list, has_more) = c.members(group, after, page).expect("MEMBERS");
        assert!(
            list.len() <= page as usize,
            "a page holds at most max_count"
        );
        out.extend(list.iter().map(|m| (m.user, m.cursor)));
        match list.last() {
            Some(last) if has_more => after = last.user,
            _ => return out,
        }
    }
}

fn strictly_ascending(list: &[(u64, u64)]) -> bool {
    list.windows(2).all(|w| w[0].0 < w[1].0)
}

fn server_code<T: std::fmt::Debug>(r: tidemark_client::Result<T>) -> ErrorCode {
    match r {
        Err(e) => e
            .code()
            .unwrap_or_else(|| panic!("not a node's refusal: {e}")),
        Ok(v) => panic!("expected a refusal, got {v:?}"),
    }
}

#[test]
fn members_pages_are_dense_with_the_cursors_the_acks_left() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    // 25 members with scattered ids, more than six pages of 4.
    let users: Vec<u64> = (1..=25u64).map(|i| i * 7_919 % 1_009 + 1).collect();
    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
    for &u in &users {
        assert_eq!(c.join(1, u, JoinStart::Earliest).unwrap(), 0);
        model.insert(u, 0);
    }
    // The default node keeps version 1's rule: a sender that is no member
    // (an old gateway's) is stored.
    for i in 1..=6 {
        c.send(1, 5_000, i, b"m").unwrap();
    }
    for (k, &u) in users.iter().enumerate().step_by(2) {
        let to = 1 + k as u64 % 6;
        assert_eq!(c.ack(1, u, to).unwrap(), to);
        model.insert(u, to);
    }
    let want: Vec<(u64, u64)> = model.iter().map(|(&u, &c)| (u, c)).collect();
    for page in [1, 4, 25, 1000] {
        let got = all_members(&mut c, 1, page);
        assert!(
            strictly_ascending(&got),
            "pages of {page}: ascending, none twice"
        );
        assert_eq!(
            got, want,
            "pages of {page}: every member once, cursors right after the ACKs"
        );
    }
    let (first, more) = c.members(1, 0, 0).unwrap();
    assert!(
        first.is_empty() && more,
        "max_count 0 says whether members exist"
    );

    // Members who stay are listed once while others join and leave between
    // pages: one below the listing's position, one above it leaves.
    let (page, _) = c.members(1, 0, 4).unwrap();
    let at = page.last().unwrap().user;
    let (below, above) = (page[0].user + 1, *model.keys().next_back().unwrap());
    assert!(!model.contains_key(&below) && below < at);
    c.join(1, below, JoinStart::Head).unwrap();
    c.leave(1, above).unwrap();
    let mut rest = all_members_after(&mut c, 1, at, 3);
    let mut listed: Vec<(u64, u64)> = page.iter().map(|m| (m.user, m.cursor)).collect();
    listed.append(&mut rest);
    assert!(strictly_ascending(&listed));
    model.remove(&above);
    let stayed: Vec<(u64, u64)> = model.iter().map(|(&u, &c)| (u, c)).collect();
    assert_eq!(listed, stayed, "every member present throughout, once");
    model.insert(below, 6);

    // GROUP_INFO after the sends, ACKs, the join and the leave.
    let info = c.group_info(1).unwrap();
    assert_eq!((info.head, info.floor, info.member_count), (6, 1, 25));
    assert_eq!(
        info.retention,
        RetentionPolicy::default(),
        "no policy: keeps everything"
    );
    c.create_group(2).unwrap();
    let empty = c.group_info(2).unwrap();
    assert_eq!((empty.head, empty.floor, empty.member_count), (0, 1, 0));
    assert_eq!(c.members(2, 0, 10).unwrap(), (vec![], false));
    assert_eq!(server_code(c.group_info(3)), ErrorCode::GroupNotFound);
    assert_eq!(server_code(c.members(3, 0, 10)), ErrorCode::GroupNotFound);
    let stats = c.stats().unwrap();
    let page_max = stats.iter().find(|(n, _)| n == "limits.members_page_max");
    assert_eq!(page_max.map(|(_, v)| *v), Some(10_000));

    // A graceful restart keeps the members and their cursors.
    drop(c);
    assert!(node.terminate().success());
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    let want: Vec<(u64, u64)> = model.iter().map(|(&u, &c)| (u, c)).collect();
    assert_eq!(all_members(&mut c, 1, 7), want);
    assert_eq!(c.group_info(1).unwrap().member_count, 25);
}

fn all_members_after(c: &mut Client, group: u64, mut after: u64, page: u32) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    loop {
        let (list, has_more) = c.members(group, after, page).unwrap();
        out.extend(list.iter().map(|m| (m.user, m.cursor)));
        match list.last() {
            Some(last) if has_more => after = last.user,
            _ => return out,
        }
    }
}

#[test]
fn sends_of_non_members_are_refused_except_from_system_senders() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &["--send-requires-membership", "--system-sender", "900"],
    );
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 5, JoinStart::Head).unwrap();
    assert_eq!(server_code(c.send(1, 6, 1, b"x")), ErrorCode::NotMember);
    assert_eq!(c.group_info(1).unwrap().head, 0, "nothing stored");
    assert_eq!(c.send(1, 5, 1, b"member").unwrap().msg_id, 1);
    assert_eq!(c.send(1, 900, 1, b"system").unwrap().msg_id, 2);
    assert_eq!(server_code(c.send(2, 6, 1, b"x")), ErrorCode::GroupNotFound);

    // A JOIN and a SEND pipelined in one write: the SEND sees the join.
    let join = c
        .submit(&Request::Join {
            group: 1,
            user: 7,
            start: JoinStart::Head,
        })
        .unwrap();
    let send = c
        .submit(&Request::Send {
            group: 1,
            sender: 7,
            client_msg_id: 1,
            payload: b"joined",
        })
        .unwrap();
    let mut answered = BTreeMap::new();
    while answered.len() < 2 {
        let f = c.recv().unwrap();
        let ok = !matches!(f.response().unwrap(), Response::Error(_));
        answered.insert(f.request_id(), ok);
    }
    assert_eq!(answered, BTreeMap::from([(join, true), (send, true)]));

    // A member that left is refused.
    c.leave(1, 5).unwrap();
    assert_eq!(server_code(c.send(1, 5, 2, b"gone")), ErrorCode::NotMember);
    let info = c.group_info(1).unwrap();
    assert_eq!((info.head, info.member_count), (3, 1));

    // The reliable client reports the refusal with the sender, at once.
    let mut config = ReliableConfig::new(node.addr.clone());
    config.give_up_after_ms = 2_000;
    let mut r = ReliableClient::connect(config).unwrap();
    match r.send(1, 6, b"x") {
        Err(Error::NotMember { group: 1, user: 6 }) => {}
        other => panic!("expected NOT_MEMBER naming user 6: {other:?}"),
    }
    assert_eq!(r.stats().retransmits, 0, "a refusal is not retransmitted");

    // So does the CLI.
    let out = tidemark(&[
        "send", "--addr", &node.addr, "--group", "1", "--sender", "6", "x", "--json",
    ]);
    assert!(!out.status.success());
    let err = Json::parse(&String::from_utf8_lossy(&out.stderr)).unwrap();
    assert_eq!(err.get("error").s("code"), "NOT_MEMBER");
}

#[test]
fn members_and_group_info_subcommands() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();
    let mut c = node.client();
    c.create_group(4).unwrap();
    for u in [30, 10, 20, 50, 40] {
        c.join(4, u, JoinStart::Head).unwrap();
    }
    for i in 1..=3 {
        c.send(4, 10, i, b"hi").unwrap();
    }
    c.ack(4, 30, 2).unwrap();

    let all = json(&["members", "--addr", a, "--group", "4", "--page", "2"]);
    assert_eq!((all.u("member_count"), all.u("head")), (5, 3));
    let listed: Vec<(u64, u64)> = all
        .get("members")
        .arr()
        .iter()
        .map(|m| (m.u("user"), m.u("cursor")))
        .collect();
    // User 10 sent 1..3 after reading everything: its own messages are read.
    assert_eq!(listed, vec![(10, 3), (20, 0), (30, 2), (40, 0), (50, 0)]);
    assert_eq!(all.get("next_after"), &Json::Null);
    let receipts = all.get("read_receipts").arr();
    assert_eq!((receipts[0].u("msg_id"), receipts[0].u("read_by")), (3, 1));
    assert_eq!((receipts[2].u("msg_id"), receipts[2].u("read_by")), (1, 2));

    // A listing cut by --max says where to go on.
    let cut = json(&[
        "members", "--addr", a, "--group", "4", "--max", "2", "--last", "0",
    ]);
    assert_eq!(cut.get("members").arr().len(), 2);
    assert_eq!(cut.u("next_after"), 20);
    let rest = json(&["members", "--addr", a, "--group", "4", "--after", "20"]);
    assert_eq!(rest.get("members").arr()[0].u("user"), 30);
    let text = crate::cli::ok(&["members", "--addr", a, "--group", "4", "--max", "2"]);
    assert!(text.starts_with("group 4: 5 member(s), head 3\n"), "{text}");
    assert!(text.contains("more members: --after 20\n"), "{text}");

    let info = json(&["group-info", "--addr", a, "--group", "4"]);
    assert_eq!(
        (info.u("head"), info.u("floor"), info.u("member_count")),
        (3, 1, 5)
    );
    assert_eq!(
        info.get("retention").get("keeps_everything"),
        &Json::Bool(true)
    );
    let text = crate::cli::ok(&["group-info", "--addr", a, "--group", "4"]);
    assert_eq!(
        text,
        "group 4: head 3, floor 1 (3 message(s) stored), 5 member(s)\n\
         retention: none (every message is kept)\n"
    );
    let out = tidemark(&["group-info", "--addr", a, "--group", "9", "--json"]);
    let err = Json::parse(&String::from_utf8_lossy(&out.stderr)).unwrap();
    assert_eq!(err.get("error").s("code"), "GROUP_NOT_FOUND");
}
