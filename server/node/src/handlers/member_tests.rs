//! MEMBERS' and READERS' page limits and SEND's membership check (4.9,
//! 4.19, 4.20, 4.21), at the handlers: what the end-to-end tests cannot
//! reach cheaply (a page limit below the group, a frame limit below the
//! page limit, the order of SEND's refusals).

use std::time::Duration;

use tidemark_engine::{Config, Engine, FsyncPolicy, JoinStart as EngineJoinStart};

use crate::config::{Limits, SendPolicy};
use crate::conn_id::ConnId;
use crate::connection::Connection;
use crate::handlers::action::{Action, Parked};
use crate::handlers::context::Ctx;
use crate::handlers::membership::members_page_max;
use crate::handlers::reads::readers;
use crate::receipts::Receipts;
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{decode_response, ErrorCode, Frame, Request, Response};

/// Runs `req` on a READY connection under `sends`; the response frame,
/// or `None` when it parked (a SEND accepted).
fn call(e: &Engine, limits: &Limits, sends: &SendPolicy, req: Request<'_>) -> Option<Vec<u8>> {
    let mut subs = Subscriptions::default();
    let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, limits.frame_bytes_max);
    let mut ctx = Ctx {
        sends,
        ..Ctx::for_tests(e, limits, &mut subs, &mut receipts)
    };
    let mut conn = Connection::ready(limits.frame_bytes_max);
    match conn.handle_request(&mut ctx, 9, req) {
        Ok(Action::Answer(out)) => Some(out.head),
        Ok(Action::Park(Parked::Send { ticket, .. })) => {
            e.wait(ticket).unwrap();
            None
        }
        _ => panic!("answered at once, or a SEND parked"),
    }
}

fn members_of(frame: &[u8]) -> (bool, Vec<(u64, u64)>) {
    match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
        Response::Members { has_more, members } => (
            has_more,
            members.iter().map(|m| (m.user, m.cursor)).collect(),
        ),
        other => panic!("{other:?}"),
    }
}

fn code_of(frame: &[u8]) -> ErrorCode {
    match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
        Response::Error(err) => err.code,
        other => panic!("not an ERROR: {other:?}"),
    }
}

#[test]
fn members_pages_are_clamped_to_the_page_limit_and_the_frame() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    e.create_group(1).unwrap();
    for u in 1..=300 {
        e.join(1, u, EngineJoinStart::Head).unwrap();
    }
    let anyone = SendPolicy::anyone();
    let mut limits = Limits {
        members_page_max: 5,
        ..Limits::default()
    };
    let page = |limits: &Limits, after_user, max_count| {
        let req = Request::Members {
            group: 1,
            after_user,
            max_count,
        };
        members_of(&call(&e, limits, &anyone, req).unwrap())
    };
    let (more, got) = page(&limits, 0, u32::MAX);
    assert!(more);
    assert_eq!(got, (1..=5).map(|u| (u, 0)).collect::<Vec<_>>());
    let (more, got) = page(&limits, 298, 100);
    assert!(!more);
    assert_eq!(got, vec![(299, 0), (300, 0)]);
    // At the smallest frame a node may have, the frame is the bound.
    limits.members_page_max = 10_000;
    limits.frame_bytes_max = tidemark_protocol::FRAME_BYTES_MAX_FLOOR;
    assert_eq!(members_page_max(&limits), (4096 - 21) / 16);
    let (more, got) = page(&limits, 0, u32::MAX);
    assert!(more);
    assert_eq!(got.len(), 254);
    let req = Request::Members {
        group: 2,
        after_user: 0,
        max_count: 1,
    };
    let frame = call(&e, &limits, &anyone, req).unwrap();
    assert_eq!(code_of(&frame), ErrorCode::GroupNotFound);
}

#[test]
fn sends_of_non_members_are_refused_after_the_checks_that_come_first() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(Config::new(dir.path())).unwrap();
    e.create_group(1).unwrap();
    e.join(1, 5, EngineJoinStart::Head).unwrap();
    let limits = Limits::default();
    let policy = SendPolicy::members_only([900, 77, 900]);
    assert_eq!(policy.system_senders(), &[77, 900]);
    let send = |sender, payload: &'static [u8], group| Request::Send {
        group,
        sender,
        client_msg_id: sender,
        payload,
    };
    let big: &'static [u8] = Box::leak(vec![0u8; (1 << 20) + 1].into_boxed_slice());
    let refused = |req| code_of(&call(&e, &limits, &policy, req).unwrap());
    assert_eq!(refused(send(6, b"x", 1)), ErrorCode::NotMember);
    // 4.9's order: the payload's size and the group come first.
    assert_eq!(refused(send(6, big, 1)), ErrorCode::PayloadTooLarge);
    assert_eq!(refused(send(6, b"x", 2)), ErrorCode::GroupNotFound);
    // A member and a system sender are accepted.
    assert!(call(&e, &limits, &policy, send(5, b"m", 1)).is_none());
    assert!(call(&e, &limits, &policy, send(900, b"s", 1)).is_none());
    assert_eq!(e.head(1).unwrap(), 2, "two messages stored, none refused");
    // The default policy is version 1's: anyone may send.
    let anyone = SendPolicy::anyone();
    assert!(call(&e, &limits, &anyone, send(6, b"v1", 1)).is_none());
    assert_eq!(e.head(1).unwrap(), 3);
}

/// READERS examines at most `members_page_max` members per request,
/// however few of them have read the message: a page may list none
/// and still name where the next one starts; the pages together list
/// every reader once, and `max_count` cuts a page before a reader.
#[test]
fn readers_examine_a_bounded_page_and_continue_where_they_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    let e = Engine::open(config).unwrap();
    e.create_group(1).unwrap();
    for u in 1..=10 {
        e.join(1, u, EngineJoinStart::Head).unwrap();
    }
    let id = e.append(1, 99, 1, b"x").unwrap().msg_id;
    for u in [2, 8, 9] {
        e.ack(1, u, id).unwrap();
    }
    let limits = Limits {
        members_page_max: 3,
        ..Limits::default()
    };
    let mut subs = Subscriptions::default();
    let mut receipts: Receipts<ConnId> = Receipts::new(Duration::ZERO, 5, 1 << 20);
    let ctx = Ctx::for_tests(&e, &limits, &mut subs, &mut receipts);
    let page = |after: u64, max: u32| -> (Vec<u64>, u64) {
        let out = readers(&ctx, 1, 1, id, after, max).unwrap();
        match decode_response(&Frame::parse(&out.head).unwrap()).unwrap() {
            Response::Readers {
                next_after_user,
                readers,
            } => (readers.iter().map(|m| m.user).collect(), next_after_user),
            other => panic!("{other:?}"),
        }
    };
    // Pages of 3 examined: 1-3 (2 read), 4-6 (none), 7-9 (8, 9), 10.
    assert_eq!(page(0, 100), (vec![2], 3));
    assert_eq!(page(3, 100), (vec![], 6));
    assert_eq!(page(6, 100), (vec![8, 9], 9));
    assert_eq!(page(9, 100), (vec![], 0));
    // max_count 1 stops before the second reader: the next page
    // starts at it.
    assert_eq!(page(6, 1), (vec![8], 8));
    assert_eq!(page(8, 1), (vec![9], 0));
    // 0 is taken as 1.
    assert_eq!(page(6, 0), (vec![8], 8));
}
