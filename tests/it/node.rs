//! The node over the wire: handshake and auth, round trips, pipelining,
//! durability of answered sends, push and resync, long polls, hostile
//! frames, SIGKILL under load, graceful shutdown. Every test starts the real
//! binary on an ephemeral port with a temp data directory.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use tidemark_client::{Client, ClientConfig, ClientError, Event};
use tidemark_protocol::{
    decode_response, encode_request, ErrorCode, Frame, JoinStart, Request, Response, ResyncScope,
    Subscription,
};

use crate::harness::Node;

fn payload(i: u64) -> Vec<u8> {
    format!("message {i}").into_bytes()
}

#[test]
fn wrong_token_is_refused_and_nothing_is_served_before_auth() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        &["--token-file", token.to_str().unwrap()],
    );

    let mut good = node.config();
    good.token = Some(b"s3cret".to_vec());
    let mut c = Client::connect(&good).unwrap();
    c.create_group(1).unwrap();

    let mut bad = node.config();
    bad.token = Some(b"guess".to_vec());
    let err = Client::connect(&bad).err().expect("wrong token refused");
    assert_eq!(err.code(), Some(ErrorCode::Unauthenticated), "{err}");

    // A raw client that skips AUTH gets UNAUTHENTICATED for every request.
    let mut raw = TcpStream::connect(&node.addr).unwrap();
    let hello = Request::Hello {
        min_version: 1,
        max_version: 1,
        client_name: "raw",
    };
    let reply = raw_call(&mut raw, 1, &hello);
    assert!(matches!(decode(&reply), Response::Hello(h) if h.auth_required));
    let reply = raw_call(
        &mut raw,
        2,
        &Request::Send {
            group: 1,
            sender: 1,
            client_msg_id: 1,
            payload: b"x",
        },
    );
    assert!(matches!(decode(&reply), Response::Error(e) if e.code == ErrorCode::Unauthenticated));
    assert_eq!(c.unread(1).unwrap().len(), 0);
    assert_eq!(
        c.pull(1, 1, 0, 10, 0).unwrap_err().code(),
        Some(ErrorCode::NotMember)
    );
}

#[test]
fn send_pull_ack_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(7).unwrap();
    assert_eq!(c.join(7, 100, JoinStart::Head).unwrap(), 0);
    assert_eq!(c.join(7, 200, JoinStart::Head).unwrap(), 0);
    for i in 1..=5 {
        let s = c.send(7, 100, i, &payload(i)).unwrap();
        assert_eq!((s.msg_id, s.duplicate), (i, false));
    }
    let again = c.send(7, 100, 3, &payload(3)).unwrap();
    assert_eq!((again.msg_id, again.duplicate), (3, true));
    let page = c.pull(7, 200, 0, 3, 0).unwrap();
    assert_eq!(
        page.messages.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(page.messages[1].payload, payload(2));
    assert!(page.has_more);
    let page = c.pull(7, 200, 3, 10, 0).unwrap();
    assert_eq!(page.cursor, 3);
    assert_eq!(
        page.messages.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![4, 5]
    );
    assert_eq!(c.ack(7, 200, 5).unwrap(), 5);
    let unread = c.unread(200).unwrap();
    assert_eq!(
        (unread[0].head, unread[0].cursor, unread[0].unread),
        (5, 5, 0)
    );
    assert_eq!(
        c.ack(7, 200, 9).unwrap_err().code(),
        Some(ErrorCode::CursorAboveHead)
    );
    assert_eq!(
        c.read_count(7, 5).unwrap(),
        2,
        "the caught-up sender read its own messages"
    );
    let (hist, more) = c.history(7, 200, 0, 2).unwrap();
    assert_eq!(
        hist.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
        vec![5, 4],
        "newest first"
    );
    assert!(more);
    let stats: std::collections::HashMap<String, u64> = c.stats().unwrap().into_iter().collect();
    assert_eq!(stats["engine.appends"], 5);
    assert_eq!(stats["engine.duplicates"], 1);
    assert_eq!(stats["requests.send"], 6);
    assert!(stats["engine.acks"] >= 2, "pull ack_up_to and ACK");
    assert!(stats["engine.fsyncs"] >= 5, "fsync=always: one per round");
    assert_eq!(
        stats["net.deliveries"], 7,
        "records sent in pulls and history"
    );
    assert!(
        stats["latency.send.p99_us"] > 0 && stats["net.bytes_in"] > 0 && stats["net.bytes_out"] > 0
    );
    assert_eq!(stats["net.connections"], 1);
}

#[test]
fn pipelined_requests_are_answered_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    let mut expected = HashMap::new();
    for i in 1..=100u64 {
        let id = c
            .submit(&Request::Send {
                group: 1,
                sender: 9,
                client_msg_id: i,
                payload: &payload(i),
            })
            .unwrap();
        expected.insert(id, Some(i));
        let ping = c.submit(&Request::Ping).unwrap();
        expected.insert(ping, None);
    }
    let mut got_ids = Vec::new();
    for _ in 0..expected.len() {
        let f = c.recv().unwrap();
        let id = f.request_id();
        match (
            expected
                .remove(&id)
                .expect("a response for each request, once"),
            f.response().unwrap(),
        ) {
            (Some(_), Response::Send { msg_id, .. }) => got_ids.push(msg_id),
            (None, Response::Pong) => {}
            (want, other) => panic!("request {id} ({want:?}) got {other:?}"),
        }
    }
    got_ids.sort_unstable();
    assert_eq!(
        got_ids,
        (1..=100).collect::<Vec<_>>(),
        "one connection's sends get ids in order, densely"
    );
}

#[test]
fn an_answered_send_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--fsync", "always"]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 5, JoinStart::Earliest).unwrap();
    let s = c.send(1, 5, 42, b"durable").unwrap();
    // SIGKILL right after the answer: under fsync=always it was on disk.
    let node = node.restart_after_kill();
    let mut c = node.client();
    let page = c.pull(1, 5, 0, 10, 0).unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(
        (page.messages[0].msg_id, page.messages[0].payload.as_slice()),
        (s.msg_id, &b"durable"[..])
    );
    assert!(
        c.send(1, 5, 42, b"durable").unwrap().duplicate,
        "the retransmit after restart is recognised"
    );
}

#[test]
fn push_reaches_a_subscriber_who_then_acks() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut admin = node.client();
    admin.create_group(3).unwrap();
    admin.join(3, 1, JoinStart::Head).unwrap();
    admin.join(3, 2, JoinStart::Head).unwrap();
    let mut sub = node.client();
    sub.subscribe(Subscription::User(2)).unwrap();
    for i in 1..=3 {
        admin.send(3, 1, i, &payload(i)).unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        match sub.next_event(Duration::from_secs(5)).unwrap() {
            Some(Event::Push(msgs)) => got.extend(msgs.into_iter().map(|m| (m.group, m.msg_id))),
            other => panic!("expected a push, got {other:?}"),
        }
    }
    assert_eq!(got, vec![(3, 1), (3, 2), (3, 3)]);
    assert_eq!(sub.ack(3, 2, 3).unwrap(), 3);
    assert_eq!(sub.unread(2).unwrap()[0].unread, 0);
}

#[test]
fn a_slow_subscriber_gets_resync_and_then_pulls_everything() {
    let dir = tempfile::tempdir().unwrap();
    // Small output budget: the subscriber that does not read falls behind fast.
    let node = Node::start(
        dir.path(),
        &[
            "--fsync",
            "never",
            "--frame-bytes-max",
            "300000",
            "--payload-bytes-max",
            "100000",
            "--output-bytes-max",
            "300000",
        ],
    );
    let mut admin = node.client();
    admin.create_group(1).unwrap();
    admin.join(1, 2, JoinStart::Head).unwrap();
    let mut slow = node.client();
    slow.subscribe(Subscription::Groups(vec![1])).unwrap();
    let big = vec![7u8; 50_000];
    let total = 200u64;
    for i in 1..=total {
        admin.send(1, 1, i, &big).unwrap();
    }
    // Now read: some pushes, then one RESYNC, then nothing more.
    let mut pushed = Vec::new();
    let mut resync = false;
    while let Some(e) = slow.next_event(Duration::from_millis(500)).unwrap() {
        match e {
            Event::Push(m) => {
                assert!(!resync, "no push after RESYNC(all)");
                pushed.extend(m.into_iter().map(|m| m.msg_id));
            }
            Event::Resync(scope) => {
                assert_eq!(scope, ResyncScope::All);
                resync = true;
            }
            e @ (Event::Receipt { .. } | Event::ReceiptCounts { .. }) => {
                panic!("no receipt subscription, yet {e:?}")
            }
        }
    }
    assert!(resync, "the slow subscriber was told to resync");
    assert!((pushed.len() as u64) < total);
    // Nothing is lost: the cursor never moved, a pull returns everything.
    let mut all = Vec::new();
    let mut ack = 0;
    loop {
        let page = slow.pull(1, 2, ack, 50, 0).unwrap();
        all.extend(page.messages.iter().map(|m| m.msg_id));
        ack = page.messages.last().map_or(ack, |m| m.msg_id);
        if !page.has_more {
            break;
        }
    }
    assert_eq!(all, (1..=total).collect::<Vec<_>>());
}

#[test]
fn a_long_poll_wakes_when_a_message_arrives() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 2, JoinStart::Head).unwrap();
    let addr = node.addr.clone();
    let poller = std::thread::spawn(move || {
        let mut p = Client::connect(&ClientConfig::new(addr)).unwrap();
        let start = std::time::Instant::now();
        let page = p.pull(1, 2, 0, 10, 30_000).unwrap();
        (
            page.messages.iter().map(|m| m.msg_id).collect::<Vec<_>>(),
            start.elapsed(),
        )
    });
    std::thread::sleep(Duration::from_millis(300));
    c.send(1, 1, 1, b"wake up").unwrap();
    let (ids, waited) = poller.join().unwrap();
    assert_eq!(ids, vec![1]);
    assert!(
        waited < Duration::from_secs(30),
        "answered by the send, not the timeout"
    );
    // With nothing to deliver the poll ends empty at its deadline.
    let page = c.pull(1, 2, 1, 10, 200).unwrap();
    assert!(page.messages.is_empty());
}

fn raw_call(s: &mut TcpStream, id: u64, req: &Request<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(id, req, &mut out).unwrap();
    s.write_all(&out).unwrap();
    read_frame(s)
}

fn read_frame(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut rest = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut rest).unwrap();
    [len.to_vec(), rest].concat()
}

fn decode(bytes: &[u8]) -> Response<'_> {
    decode_response(&Frame::parse(bytes).unwrap()).unwrap()
}

fn assert_closed(s: &mut TcpStream) {
    let mut b = [0u8; 1];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    assert!(
        matches!(s.read(&mut b), Ok(0) | Err(_)),
        "connection closed"
    );
}

#[test]
fn malformed_and_oversized_frames_get_the_documented_error_and_a_close() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    // Oversized length prefix: FRAME_TOO_LARGE with request id 0, then close.
    let mut s = TcpStream::connect(&node.addr).unwrap();
    s.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let f = read_frame(&mut s);
    assert!(
        matches!(decode(&f), Response::Error(e) if e.code == ErrorCode::FrameTooLarge && e.detail == Some(4 << 20))
    );
    assert_eq!(u64::from_le_bytes(f[8..16].try_into().unwrap()), 0);
    assert_closed(&mut s);

    // An undecodable body: BAD_FRAME, then close.
    let mut s = TcpStream::connect(&node.addr).unwrap();
    raw_call(
        &mut s,
        1,
        &Request::Hello {
            min_version: 1,
            max_version: 1,
            client_name: "raw",
        },
    );
    let mut bad = Vec::new();
    encode_request(2, &Request::Ping, &mut bad).unwrap();
    bad[5] = 0x7e; // unknown opcode
    s.write_all(&bad).unwrap();
    assert!(
        matches!(decode(&read_frame(&mut s)), Response::Error(e) if e.code == ErrorCode::BadFrame)
    );
    assert_closed(&mut s);

    // Garbage of every kind never takes the node down.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for _ in 0..50 {
        let mut s = TcpStream::connect(&node.addr).unwrap();
        let junk: Vec<u8> = (0..200)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let _ = s.write_all(&junk);
    }
    let mut c = node.client();
    c.ping().unwrap();
    // A payload over the limit is a typed, non-fatal error.
    c.create_group(1).unwrap();
    let err = c.send(1, 1, 1, &vec![0u8; (1 << 20) + 1]).unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Server {
                code: ErrorCode::PayloadTooLarge,
                detail: Some(1048576),
                ..
            }
        ),
        "{err}"
    );
    c.ping().unwrap();
}

#[test]
fn sigkill_under_load_loses_no_answered_send() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--fsync", "always"]);
    let mut admin = node.client();
    for g in 1..=4 {
        admin.create_group(g).unwrap();
    }
    let answered = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (cfg, answered) = (node.config(), answered.clone());
            std::thread::spawn(move || {
                let Ok(mut c) = Client::connect(&cfg) else {
                    return;
                };
                for i in 0.. {
                    let g = 1 + (i + t) % 4;
                    match c.send(g, t, i, &payload(t * 1_000_000 + i)) {
                        Ok(s) => answered.lock().push((g, s.msg_id, t, i)),
                        Err(_) => return, // the node died
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let node = node.restart_after_kill();
    for t in threads {
        t.join().unwrap();
    }
    let answered = answered.lock().clone();
    assert!(answered.len() > 10, "the load ran: {}", answered.len());
    let mut c = node.client();
    let mut stored: HashMap<(u64, u64), (u64, u64, Vec<u8>)> = HashMap::new();
    for g in 1..=4 {
        c.join(g, 999, JoinStart::Earliest).unwrap();
        let mut ack = 0;
        let mut next = 1;
        loop {
            let page = c.pull(g, 999, ack, 500, 0).unwrap();
            for m in &page.messages {
                assert_eq!(m.msg_id, next, "ids dense in group {g}");
                next += 1;
                stored.insert(
                    (g, m.msg_id),
                    (m.sender_id, m.client_msg_id, m.payload.clone()),
                );
            }
            ack = next - 1;
            if !page.has_more {
                break;
            }
        }
    }
    for (g, id, t, i) in &answered {
        let got = stored
            .get(&(*g, *id))
            .unwrap_or_else(|| panic!("answered send {g}/{id} lost"));
        assert_eq!(got, &(*t, *i, payload(t * 1_000_000 + i)));
    }
    println!(
        "sigkill under load: {} answered sends, all present, ids dense",
        answered.len()
    );
}

#[test]
fn graceful_shutdown_persists_cursors_and_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 5, JoinStart::Head).unwrap();
    for i in 1..=10 {
        c.send(1, 1, i, &payload(i)).unwrap();
    }
    c.ack(1, 5, 7).unwrap();
    drop(c);
    let status = node.terminate();
    assert!(status.success(), "exit status {status:?}");
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    let u = c.unread(5).unwrap();
    assert_eq!(
        (u[0].cursor, u[0].head),
        (7, 10),
        "the ACK survived the restart"
    );
}

/// Per format-spec/protocol.md 1.7: before HELLO, framing
/// and decoding errors win over the AWAIT_HELLO rule: a malformed frame is
/// fatal in every state, while a well-formed request before HELLO gets
/// UNAUTHENTICATED and the connection stays open.
#[test]
fn before_hello_a_malformed_frame_is_fatal_and_a_well_formed_request_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let hello = Request::Hello {
        min_version: 1,
        max_version: 1,
        client_name: "raw",
    };

    let mut s = TcpStream::connect(&node.addr).unwrap();
    let reply = raw_call(&mut s, 1, &Request::Ping);
    assert!(matches!(decode(&reply), Response::Error(e) if e.code == ErrorCode::Unauthenticated));
    assert!(matches!(
        decode(&raw_call(&mut s, 2, &hello)),
        Response::Hello(_)
    ));
    assert!(matches!(
        decode(&raw_call(&mut s, 3, &Request::Ping)),
        Response::Pong
    ));

    for (what, at, value) in [("flags", 6, 1u8), ("opcode", 5, 0x7e), ("version", 4, 2)] {
        let mut s = TcpStream::connect(&node.addr).unwrap();
        let mut bad = Vec::new();
        encode_request(4, &Request::Ping, &mut bad).unwrap();
        bad[at] = value;
        s.write_all(&bad).unwrap();
        let reply = read_frame(&mut s);
        let code = match decode(&reply) {
            Response::Error(e) => e.code,
            other => panic!("{what}: {other:?}"),
        };
        let want = if what == "version" {
            ErrorCode::UnsupportedVersion
        } else {
            ErrorCode::BadFrame
        };
        assert_eq!(code, want, "{what} before HELLO");
        assert_closed(&mut s);
    }
    // A length prefix below 12 before HELLO: BAD_FRAME, request id 0, close.
    let mut s = TcpStream::connect(&node.addr).unwrap();
    s.write_all(&5u32.to_le_bytes()).unwrap();
    let reply = read_frame(&mut s);
    assert!(matches!(decode(&reply), Response::Error(e) if e.code == ErrorCode::BadFrame));
    assert_closed(&mut s);
}

/// Per format-spec/protocol.md 1.8, 4.4.1: every limit a
/// client cannot learn from HELLO is in STATS as `limits.*`, with the value
/// the node runs with; `--cursor-flush-ms` sets how often ACKs are
/// persisted (with an hour, an ACK is not persisted before a SIGKILL).
#[test]
fn stats_report_the_limits_and_cursor_flush_ms_is_a_serve_flag() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &[
            "--cursor-flush-ms",
            "3600000",
            "--subscriptions-max",
            "77",
            "--frame-bytes-max",
            "2097152",
        ],
    );
    let mut c = node.client();
    let stats: HashMap<String, u64> = c.stats().unwrap().into_iter().collect();
    assert_eq!(stats["limits.cursor_flush_ms"], 3_600_000);
    assert_eq!(stats["limits.subscriptions_max"], 77);
    assert_eq!(stats["limits.frame_bytes_max"], 2 << 20);
    assert_eq!(stats["limits.batch_ack_items_max"], ((2 << 20) - 16) / 18);
    assert_eq!(stats["limits.payload_bytes_max"], 1 << 20);
    assert_eq!(stats["limits.requests_in_flight_max"], 256);
    assert_eq!(stats["limits.groups_per_user_max"], 20_000);
    assert_eq!(stats["limits.commit_round_bytes_max"], 8 << 20);
    assert_eq!(stats["limits.dedup_window_sends"], 10_000);
    for name in stats.keys() {
        let area = name.split('.').next().unwrap_or("");
        assert!(
            [
                "net", "engine", "limits", "requests", "latency", "server", "storage", "memory",
                "errors", "slowlog", "log", "backup"
            ]
            .contains(&area),
            "{name}"
        );
    }

    c.create_group(1).unwrap();
    c.join(1, 5, JoinStart::Earliest).unwrap();
    for i in 1..=3 {
        c.send(1, 100, i, b"m").unwrap();
    }
    assert_eq!(c.ack(1, 5, 3).unwrap(), 3);
    drop(c);
    let node = node.restart_after_kill();
    let mut c = node.client();
    let unread = c.unread(5).unwrap();
    assert_eq!(
        (unread[0].cursor, unread[0].unread),
        (0, 3),
        "the ACK waited for a cursor flush an hour away"
    );

    // The flag is checked like every limit.
    let out = std::process::Command::new(crate::harness::tidemark_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--cursor-flush-ms", "0"])
        .arg("--data")
        .arg(dir.path().join("other"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cursor_flush_ms"), "{err}");
}

/// Per format-spec/protocol.md 4.9: under `--fsync never` an
/// answered SEND is in the operating system's page cache: it survives the
/// node's process being killed (not a power loss, which storage.md
/// section 1 covers).
#[test]
fn under_fsync_never_answered_sends_survive_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--fsync", "never"]);
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 5, JoinStart::Earliest).unwrap();
    for i in 1..=50 {
        assert_eq!(c.send(1, 100, i, &payload(i)).unwrap().msg_id, i);
    }
    drop(c);
    let node = node.restart_after_kill();
    let mut c = node.client();
    let page = c.pull(1, 5, 0, 100, 0).unwrap();
    let got: Vec<u64> = page.messages.iter().map(|m| m.msg_id).collect();
    assert_eq!(got, (1..=50).collect::<Vec<_>>());
    assert_eq!(page.messages[49].payload, payload(50));
}

/// Does nothing: its only effect is that a blocking read of the thread it
/// runs on returns `EINTR` (installed without `SA_RESTART`).
extern "C" fn ignore_signal(_: libc::c_int) {}

/// A signal delivered to the client's thread while it waits for a
/// response (a child's exit, a timer in the application) interrupts its
/// read with `EINTR`: the client waits again and returns the response,
/// never an I/O error for a request the node answers.
#[test]
fn a_signal_while_the_client_waits_does_not_fail_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("data"), &[]);
    let mut waiter = node.client();
    waiter.create_group(1).unwrap();
    waiter.join(1, 7, JoinStart::Earliest).unwrap();
    // SAFETY: a handler that touches nothing, installed for SIGUSR1, which
    // only this test sends, and only to its own thread.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_signal as *const () as usize;
        action.sa_flags = 0;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
            0
        );
    }
    let waiting = unsafe { libc::pthread_self() };
    let addr = node.addr.clone();
    let signaller = std::thread::spawn(move || {
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(100));
            // SAFETY: the test thread outlives this thread (joined below).
            assert_eq!(unsafe { libc::pthread_kill(waiting, libc::SIGUSR1) }, 0);
        }
        let mut sender = Client::connect(&ClientConfig::new(addr)).unwrap();
        sender.send(1, 9, 1, b"after the signals").unwrap();
    });
    // A long poll: the client waits in its read while the signals arrive,
    // until the send wakes it.
    let page = waiter
        .pull(1, 7, 0, 10, 30_000)
        .expect("the long poll is answered despite the signals");
    signaller.join().unwrap();
    assert_eq!(page.messages.len(), 1);
    assert_eq!(page.messages[0].payload, b"after the signals");
}
