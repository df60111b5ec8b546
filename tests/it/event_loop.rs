//! The event loop against the real binary: request order on one pipelined
//! connection, fair turns between connections, the partial-frame timeout,
//! the node-wide output budget, and the descriptor budget.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tidemark_server::protocol::{
    decode_response, encode_request, ErrorCode, Frame, JoinStart, Request, Response,
};

use crate::harness::Node;

fn encode(id: u64, req: &Request<'_>, out: &mut Vec<u8>) {
    encode_request(id, req, out).unwrap();
}

fn hello(out: &mut Vec<u8>) {
    encode(
        1,
        &Request::Hello {
            min_version: 1,
            max_version: 1,
            client_name: "evloop-test",
        },
        out,
    );
}

/// Reads one frame (length prefix included); None at end of stream.
fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut rest = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut rest).ok()?;
    Some([len.to_vec(), rest].concat())
}

/// Reads frames until every id in `ids` was answered; returns them by id.
fn responses(s: &mut TcpStream, ids: &[u64]) -> HashMap<u64, Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = HashMap::new();
    while ids.iter().any(|id| !got.contains_key(id)) {
        let f = read_frame(s).expect("a response for every request");
        let id = u64::from_le_bytes(f[8..16].try_into().unwrap());
        got.insert(id, f);
    }
    got
}

fn decode(f: &[u8]) -> Response<'_> {
    decode_response(&Frame::parse(f).unwrap()).unwrap()
}

fn pull(group: u64, user: u64) -> Request<'static> {
    Request::Pull {
        group,
        user,
        ack_up_to: 0,
        max_count: 100,
        max_bytes: 1 << 20,
        wait_ms: 0,
    }
}

/// Issue 11 item 13: execution order is request order (protocol.md 1.4),
/// also for requests pipelined behind one that waits for its commit round.
#[test]
fn pipelined_requests_observe_every_earlier_request() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut s = TcpStream::connect(&node.addr).unwrap();
    let mut out = Vec::new();
    hello(&mut out);
    let send = |id: u64| Request::Send {
        group: 1,
        sender: 9,
        client_msg_id: id,
        payload: b"hi",
    };
    let reqs: Vec<(u64, Request<'_>)> = vec![
        (2, Request::CreateGroup { group: 1 }),
        (3, send(3)),
        (
            4,
            Request::Join {
                group: 1,
                user: 5,
                start: JoinStart::Earliest,
            },
        ),
        (5, pull(1, 5)),
        (6, Request::Unread { user: 5 }),
        (
            7,
            Request::Sync {
                user: 5,
                per_group_max: 10,
                total_max_bytes: 1 << 20,
                continuation: 0,
            },
        ),
        (8, Request::Leave { group: 1, user: 5 }),
        (9, pull(1, 5)),
        (10, send(10)),
        (
            11,
            Request::Join {
                group: 1,
                user: 6,
                start: JoinStart::Earliest,
            },
        ),
        (12, pull(1, 6)),
    ];
    for (id, r) in &reqs {
        encode(*id, r, &mut out);
    }
    // One write: every request is in the node's socket before the first
    // commit round completes.
    s.write_all(&out).unwrap();
    let ids: Vec<u64> = (1..=12).collect();
    let got = responses(&mut s, &ids);
    match decode(&got[&5]) {
        Response::Pull { records, head, .. } => {
            assert_eq!(records.count, 1, "PULL behind JOIN sees the send");
            assert_eq!(head, 1);
        }
        other => panic!("PULL pipelined behind JOIN got {other:?}"),
    }
    match decode(&got[&6]) {
        Response::Unread(list) => {
            assert_eq!(list.len(), 1, "UNREAD behind JOIN lists the group");
            assert_eq!((list[0].group, list[0].unread), (1, 1));
        }
        other => panic!("UNREAD pipelined behind JOIN got {other:?}"),
    }
    match decode(&got[&7]) {
        Response::Sync { groups, .. } => {
            assert_eq!(groups.len(), 1, "SYNC behind JOIN lists the group");
            assert_eq!(groups[0].records.count, 1);
        }
        other => panic!("SYNC pipelined behind JOIN got {other:?}"),
    }
    match decode(&got[&9]) {
        Response::Error(e) => assert_eq!(e.code, ErrorCode::NotMember, "PULL behind LEAVE"),
        other => panic!("PULL pipelined behind LEAVE got {other:?}"),
    }
    match decode(&got[&12]) {
        Response::Pull { records, .. } => {
            assert_eq!(
                records.count, 2,
                "PULL behind SEND and JOIN sees both sends"
            )
        }
        other => panic!("PULL pipelined behind JOIN got {other:?}"),
    }
    assert!(matches!(decode(&got[&3]), Response::Send { msg_id: 1, .. }));
    assert!(matches!(
        decode(&got[&10]),
        Response::Send { msg_id: 2, .. }
    ));
}

fn stats(c: &mut tidemark_server::client::Client) -> HashMap<String, u64> {
    c.stats().unwrap().into_iter().collect()
}

/// Issue 11 item 10: a client that sends part of a frame and stalls (or
/// trickles) is closed after `frame_timeout_ms`, with BAD_FRAME.
#[test]
fn a_stalled_partial_frame_is_closed_after_the_frame_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--frame-timeout-ms", "300"]);
    let mut s = TcpStream::connect(&node.addr).unwrap();
    let mut out = Vec::new();
    hello(&mut out);
    encode(2, &Request::Ping, &mut out);
    // Half of a PING frame.
    s.write_all(&out[..out.len() - 8]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello_reply = read_frame(&mut s).expect("HELLO answered");
    assert!(matches!(decode(&hello_reply), Response::Hello(_)));
    // Trickle a byte now and then: bytes of the same frame do not restart
    // the clock.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(50));
        let _ = s.write_all(&out[out.len() - 8..out.len() - 7]);
    }
    let err = read_frame(&mut s).expect("an ERROR before the close");
    match decode(&err) {
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::BadFrame);
            assert_eq!(u64::from_le_bytes(err[8..16].try_into().unwrap()), 0);
        }
        other => panic!("stalled frame got {other:?}"),
    }
    assert!(
        read_frame(&mut s).is_none(),
        "then the connection is closed"
    );
    // A connection that is merely idle between whole frames stays open.
    let mut idle = node.client();
    std::thread::sleep(Duration::from_millis(700));
    idle.ping().unwrap();
    assert_eq!(stats(&mut idle)["frames_timed_out"], 1);
}

/// Issue 11 item 10: connections that pipeline PINGs without pause (and
/// read their PONGs, so their output never stops them) do not keep the node
/// from serving another client: each connection gets a bounded turn.
#[test]
fn ping_floods_do_not_starve_a_normal_client() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--fsync", "never"]);
    let stop = Arc::new(AtomicBool::new(false));
    let mut flood = Vec::new();
    let mut batch = Vec::new();
    for id in 2..=4097u64 {
        encode(id, &Request::Ping, &mut batch);
    }
    for _ in 0..4 {
        let mut w = TcpStream::connect(&node.addr).unwrap();
        let mut start = Vec::new();
        hello(&mut start);
        w.write_all(&start).unwrap();
        let mut r = w.try_clone().unwrap();
        let stop_r = stop.clone();
        // Drain PONGs so the flood is never slowed by its own output.
        flood.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            r.set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            while !stop_r.load(Ordering::Relaxed) {
                if let Ok(0) = r.read(&mut buf) {
                    break;
                }
            }
        }));
        let stop_w = stop.clone();
        let batch = batch.clone();
        flood.push(std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            while !stop_w.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                if w.write_all(&batch).is_err() {
                    break;
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut c = node.config();
    c.io_timeout = Duration::from_secs(60);
    let mut good = tidemark_server::client::Client::connect(&c).expect("connect during flood");
    good.create_group(1).unwrap();
    // A generous bound: before the fix the first PING waited for a flood
    // connection's socket to run dry, which it never does.
    for i in 1..=100u64 {
        good.ping().unwrap();
        good.send(1, 1, i, b"x").unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        let _ = t.join();
    }
}
