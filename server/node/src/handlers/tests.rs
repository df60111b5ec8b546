//! Handlers through a READY connection: commit rounds, BATCH_ACK, the
//! HELLO vector, HISTORY probes, a pending delete.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tidemark_engine::io::FaultyVfs;
use tidemark_engine::{AppendRequest, Config, Engine, JoinStart as EngineJoinStart, Ticket};

use crate::config::Limits;
use crate::connection::{Connection, Stop};
use crate::handlers::action::{Action, Parked};
use crate::handlers::context::Ctx;
use crate::handlers::handshake::SERVER_NAME;
use crate::handlers::reads::batch_ack_items_max;
use crate::receipts::Receipts;
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{decode_response, AckItem, ErrorCode, Frame, JoinStart, Request, Response};

fn engine(dir: &std::path::Path) -> Engine {
    Engine::open(Config::new(dir)).unwrap()
}

/// Handles one request on a READY connection; returns the whole
/// response frame (head and records), or `None` when it was deferred or
/// is answered by the loop.
fn call(e: &Engine, limits: &Limits, req: Request<'_>) -> Option<Vec<u8>> {
    let mut subs = Subscriptions::default();
    let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, 1 << 20);
    let mut ctx = Ctx::for_tests(e, limits, &mut subs, &mut receipts);
    let mut conn = Connection::ready(limits.frame_bytes_max);
    match conn.handle_request(&mut ctx, 9, req) {
        Ok(Action::Answer(out)) | Err(Stop::Fatal(out)) => {
            let mut frame = out.head;
            for c in &out.chunks {
                frame.extend_from_slice(c.bytes());
            }
            Some(frame)
        }
        _ => None,
    }
}

fn response(frame: &[u8]) -> Response<'_> {
    decode_response(&Frame::parse(frame).unwrap()).unwrap()
}

fn error_code(frame: &[u8]) -> Option<ErrorCode> {
    match response(frame) {
        Response::Error(e) => Some(e.code),
        _ => None,
    }
}

/// An engine over a file layer whose syncs a test can hold.
fn faulty_engine(dir: &std::path::Path) -> (Engine, Arc<tidemark_engine::io::FaultControl>) {
    let vfs = FaultyVfs::new();
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(Config::new(dir), Arc::new(vfs)).unwrap();
    (e, control)
}

/// Releases held syncs when dropped, also when an assertion failed, so
/// the engine's shutdown does not wait for a held sync forever.
struct Release(Arc<tidemark_engine::io::FaultControl>);

impl Drop for Release {
    fn drop(&mut self) {
        self.0.hold_syncs.store(false, Ordering::SeqCst);
    }
}

/// Submits a SEND to `group` whose round's fsync is held: until the
/// returned guard is dropped, everything queued later waits in the next
/// round (accepted, not committed).
fn hold_a_round(
    e: &Engine,
    control: &Arc<tidemark_engine::io::FaultControl>,
    group: u64,
) -> (Ticket, Release) {
    let release = Release(control.clone());
    control.hold_syncs.store(true, Ordering::SeqCst);
    let held = e
        .submit(&AppendRequest {
            group_id: group,
            sender_id: 100,
            client_msg_id: 1 << 40,
            payload: b"held",
        })
        .unwrap();
    while control.syncs_held.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    (held, release)
}

/// Per format-spec/protocol.md 2, "head": PULL, ACK,
/// BATCH_ACK, UNREAD and JOIN AT see the committed head, never a message
/// that was accepted but whose commit round has not completed; JOIN
/// HEAD's cursor counts it (it is not unread for the new member).
#[test]
fn requests_see_the_committed_head_and_join_head_counts_accepted_sends() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = faulty_engine(dir.path());
    let limits = Limits::default();
    e.create_group(1).unwrap();
    e.join(1, 5, EngineJoinStart::Earliest).unwrap();
    e.append(1, 100, 1, b"m1").unwrap();
    e.append(1, 100, 2, b"m2").unwrap();
    // Message 3 is accepted; its round is not committed.
    let (held, release) = hold_a_round(&e, &control, 1);
    assert_eq!(held.appended.msg_id, 3);
    let pull = Request::Pull {
        group: 1,
        user: 5,
        ack_up_to: 0,
        max_count: 10,
        max_bytes: 1 << 16,
        wait_ms: 0,
    };
    let frame = call(&e, &limits, pull).unwrap();
    match response(&frame) {
        Response::Pull { head, records, .. } => assert_eq!((head, records.count), (2, 2)),
        other => panic!("{other:?}"),
    }
    let ack = Request::Ack {
        group: 1,
        user: 5,
        msg_id: 3,
    };
    let frame = call(&e, &limits, ack).unwrap();
    assert!(matches!(response(&frame), Response::Error(err)
        if err.code == ErrorCode::CursorAboveHead && err.detail == Some(2)));
    let frame = batch_ack(&e, &limits, 5, &[(1, 3)]);
    assert!(matches!(response(&frame), Response::BatchAck(r)
        if r[0].error == Some(ErrorCode::CursorAboveHead) && r[0].cursor == 0));
    let frame = call(&e, &limits, Request::Unread { user: 5 }).unwrap();
    assert!(matches!(response(&frame), Response::Unread(u) if u[0].head == 2));
    let join_at = Request::Join {
        group: 1,
        user: 6,
        start: JoinStart::At(3),
    };
    let frame = call(&e, &limits, join_at).unwrap();
    assert!(matches!(response(&frame), Response::Error(err)
        if err.code == ErrorCode::CursorAboveHead && err.detail == Some(2)));
    let join_head = e.submit_join(1, 7, EngineJoinStart::Head).unwrap();
    drop(release);
    e.wait(held).unwrap();
    assert_eq!(
        e.wait_op(join_head).unwrap(),
        3,
        "JOIN HEAD counts message 3"
    );
    assert_eq!(e.head(1).unwrap(), 3);
}

fn batch_ack(e: &Engine, limits: &Limits, user: u64, pairs: &[(u64, u64)]) -> Vec<u8> {
    let items = pairs
        .iter()
        .map(|&(group, msg_id)| AckItem { group, msg_id })
        .collect();
    call(e, limits, Request::BatchAck { user, items }).unwrap()
}

/// A refused item reports the cursor as it
/// stands right after that item (4.12), found without walking the
/// user's groups: the work of a BATCH_ACK is bounded by its items.
#[test]
fn batch_ack_refused_items_report_the_cursor_after_the_item_without_walking_the_user() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let limits = Limits::default();
    let groups = 200u64;
    let mut last = None;
    for g in 1..=groups {
        e.submit_create_group(g).unwrap();
        last = Some(e.submit_join(g, 5, EngineJoinStart::Head).unwrap());
    }
    e.wait_op(last.unwrap()).unwrap();
    for i in 1..=8 {
        e.append(1, 100, i, b"m").unwrap();
    }
    // The user joined group 1 at head 0: (1, 1000) is refused at cursor
    // 0, (1, 7) moves it to 7, (1, 1001) is refused at 7.
    let mut pairs = vec![(1, 1000), (1, 7), (1, 1001), (groups + 1, 3)];
    pairs.extend((0..1_000).map(|i| (2 + i % (groups - 1), 50)));
    let rows_before = e.stats().membership_rows_listed;
    let frame = batch_ack(&e, &limits, 5, &pairs);
    assert_eq!(
        e.stats().membership_rows_listed - rows_before,
        0,
        "a BATCH_ACK must not walk the user's {groups} groups per item"
    );
    let Response::BatchAck(results) = response(&frame) else {
        panic!("not a BATCH_ACK response: {:?}", response(&frame));
    };
    let got: Vec<_> = results[..4]
        .iter()
        .map(|r| (r.group, r.error, r.cursor))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, Some(ErrorCode::CursorAboveHead), 0),
            (1, None, 7),
            (1, Some(ErrorCode::CursorAboveHead), 7),
            (groups + 1, Some(ErrorCode::GroupNotFound), 0),
        ],
        "each item's cursor as it stands after that item"
    );
    assert_eq!(results.len(), pairs.len());
    assert!(results[4..]
        .iter()
        .all(|r| r.error == Some(ErrorCode::CursorAboveHead) && r.cursor == 0));
}

/// The node's HELLO response is byte for byte the
/// spec's vector (format-spec/vectors/protocol/hello_response.hex):
/// the `server_name` of 4.1 and of the vector is the one sent.
#[test]
fn the_hello_response_is_the_vector() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let limits = Limits::default();
    let mut subs = Subscriptions::default();
    let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, 1 << 20);
    let mut ctx = Ctx {
        token: Some(b"s3cret"),
        ..Ctx::for_tests(&e, &limits, &mut subs, &mut receipts)
    };
    let hello = Request::Hello {
        min_version: 1,
        max_version: 1,
        client_name: "gw-1",
    };
    let mut conn = Connection::new(limits.frame_bytes_max);
    let Ok(Action::Answer(out)) = conn.handle_request(&mut ctx, 1, hello) else {
        panic!("HELLO is answered at once");
    };
    let text = include_str!("../../../../format-spec/vectors/protocol/hello_response.hex");
    let vector: Vec<u8> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(str::split_whitespace)
        .map(|b| u8::from_str_radix(b, 16).unwrap())
        .collect();
    assert_eq!(out.head, vector);
    assert_eq!(SERVER_NAME, "tidemark/0.2");
}

/// HISTORY with `max_count` 0 returns no records and
/// `has_more` says whether visible records lie below `before_msg_id`,
/// as PULL's `max_count` 0 reports `has_more` above the cursor.
#[test]
fn history_with_max_count_0_is_a_probe() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let limits = Limits::default();
    e.create_group(1).unwrap();
    e.join(1, 5, EngineJoinStart::Earliest).unwrap();
    let history = |before_msg_id| {
        let req = Request::History {
            group: 1,
            user: 5,
            before_msg_id,
            max_count: 0,
        };
        let frame = call(&e, &limits, req).unwrap();
        match response(&frame) {
            Response::History { has_more, records } => (has_more, records.count),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(history(0), (false, 0), "an empty group has nothing below");
    for i in 1..=3 {
        e.append(1, 100, i, b"m").unwrap();
    }
    assert_eq!(history(0), (true, 0));
    assert_eq!(history(2), (true, 0), "message 1 is below 2");
    assert_eq!(history(1), (false, 0), "nothing is below message 1");
}

/// A BATCH_ACK whose response could not be sent is
/// refused before any of its items is applied.
#[test]
fn an_oversized_batch_ack_is_refused_before_any_item_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let limits = Limits {
        frame_bytes_max: 4096,
        ..Limits::default()
    };
    let max = batch_ack_items_max(&limits);
    assert_eq!(max, (4096 - 16) / 18);
    e.create_group(1).unwrap();
    e.join(1, 5, EngineJoinStart::Head).unwrap();
    for i in 1..=8 {
        e.append(1, 100, i, b"m").unwrap();
    }
    // One item too many: refused, nothing applied.
    let mut pairs = vec![(1, 8)];
    pairs.extend((0..max).map(|_| (1, 1)));
    let frame = batch_ack(&e, &limits, 5, &pairs);
    match response(&frame) {
        Response::Error(err) => {
            assert_eq!(err.code, ErrorCode::LimitExceeded);
            assert_eq!(err.detail, Some(max as u64));
        }
        other => panic!("expected LIMIT_EXCEEDED, got {other:?}"),
    }
    assert_eq!(e.cursor(1, 5).unwrap(), 0, "no cursor moved");
    // The largest batch that fits is answered, and its response fits.
    pairs.pop();
    let frame = batch_ack(&e, &limits, 5, &pairs);
    assert!(frame.len() <= 4 + limits.frame_bytes_max as usize);
    assert!(matches!(response(&frame), Response::BatchAck(r) if r.len() == max));
    assert_eq!(e.cursor(1, 5).unwrap(), 8);
}

/// Per format-spec/protocol.md 4.6: while a DELETE_GROUP
/// waits for its commit round, every request treats the group as not
/// found, and the per-user lists leave it out.
#[test]
fn a_pending_delete_is_group_not_found_for_every_request() {
    let dir = tempfile::tempdir().unwrap();
    let (e, control) = faulty_engine(dir.path());
    let limits = Limits::default();
    for g in [1, 2] {
        e.create_group(g).unwrap();
        e.join(g, 5, EngineJoinStart::Earliest).unwrap();
        for i in 1..=3 {
            e.append(g, 100, i, b"m").unwrap();
        }
    }
    // Hold the fsync of a round on group 2, so the delete of group 1
    // waits in the next round while the requests below are handled.
    let (held, release) = hold_a_round(&e, &control, 2);
    let mut subs = Subscriptions::default();
    let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, 1 << 20);
    let mut ctx = Ctx::for_tests(&e, &limits, &mut subs, &mut receipts);
    let mut conn = Connection::ready(limits.frame_bytes_max);
    let Ok(Action::Park(Parked::Op(delete, _))) =
        conn.handle_request(&mut ctx, 1, Request::DeleteGroup { group: 1 })
    else {
        panic!("DELETE_GROUP is answered after its round");
    };
    let not_found = |req: Request<'_>| {
        let name = format!("{:?}", req.opcode());
        let frame = call(&e, &limits, req).unwrap_or_else(|| panic!("{name} deferred"));
        assert_eq!(
            error_code(&frame),
            Some(ErrorCode::GroupNotFound),
            "{name} during a pending delete: {:?}",
            response(&frame)
        );
    };
    not_found(Request::Send {
        group: 1,
        sender: 100,
        client_msg_id: 50,
        payload: b"x",
    });
    not_found(Request::Pull {
        group: 1,
        user: 5,
        ack_up_to: 0,
        max_count: 10,
        max_bytes: 1 << 16,
        wait_ms: 0,
    });
    not_found(Request::Pull {
        group: 1,
        user: 5,
        ack_up_to: 0,
        max_count: 10,
        max_bytes: 1 << 16,
        wait_ms: 1000,
    });
    not_found(Request::Ack {
        group: 1,
        user: 5,
        msg_id: 2,
    });
    not_found(Request::History {
        group: 1,
        user: 5,
        before_msg_id: 0,
        max_count: 10,
    });
    not_found(Request::ReadCount {
        group: 1,
        msg_id: 1,
    });
    not_found(Request::Join {
        group: 1,
        user: 5,
        start: JoinStart::Head,
    });
    not_found(Request::Join {
        group: 1,
        user: 6,
        start: JoinStart::At(1),
    });
    not_found(Request::Leave { group: 1, user: 5 });
    not_found(Request::DeleteGroup { group: 1 });
    let frame = batch_ack(&e, &limits, 5, &[(1, 2), (2, 2)]);
    let Response::BatchAck(items) = response(&frame) else {
        panic!("{:?}", response(&frame));
    };
    assert_eq!(
        (items[0].error, items[0].cursor),
        (Some(ErrorCode::GroupNotFound), 0)
    );
    assert_eq!((items[1].error, items[1].cursor), (None, 2));
    let frame = call(&e, &limits, Request::Unread { user: 5 }).unwrap();
    let Response::Unread(list) = response(&frame) else {
        panic!("{:?}", response(&frame));
    };
    assert_eq!(list.iter().map(|u| u.group).collect::<Vec<_>>(), vec![2]);
    let sync = Request::Sync {
        user: 5,
        per_group_max: 10,
        total_max_bytes: 1 << 16,
        continuation: 0,
    };
    let frame = call(&e, &limits, sync).unwrap();
    let Response::Sync { groups, .. } = response(&frame) else {
        panic!("{:?}", response(&frame));
    };
    assert_eq!(
        groups.iter().map(|g| g.entry.group).collect::<Vec<_>>(),
        vec![2]
    );
    // SUBSCRIBE GROUPS is answered by the loop, which checks each group
    // with `head`.
    assert!(e.head(1).is_err());
    assert!(e.poll_op(&delete).is_none(), "the delete is still pending");

    drop(release);
    e.wait(held).unwrap();
    e.wait_op(delete).unwrap();
    assert!(e.group_ids() == vec![2]);
}
