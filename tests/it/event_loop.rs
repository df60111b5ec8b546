//! The event loop against the real binary: request order on one pipelined
//! connection, fair turns between connections, the partial-frame timeout,
//! the node-wide output budget, and the descriptor budget.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tidemark_protocol::{
    decode_response, encode_request, ErrorCode, Frame, JoinStart, Request, Response,
};

use crate::harness::Node;

pub(crate) fn encode(id: u64, req: &Request<'_>, out: &mut Vec<u8>) {
    encode_request(id, req, out).unwrap();
}

pub(crate) fn hello(out: &mut Vec<u8>) {
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
pub(crate) fn read_frame(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut rest = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut rest).ok()?;
    Some([len.to_vec(), rest].concat())
}

/// Reads frames until every id in `ids` was answered; returns them by id.
pub(crate) fn responses(s: &mut TcpStream, ids: &[u64]) -> HashMap<u64, Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut got = HashMap::new();
    while ids.iter().any(|id| !got.contains_key(id)) {
        let f = read_frame(s).expect("a response for every request");
        let id = u64::from_le_bytes(f[8..16].try_into().unwrap());
        got.insert(id, f);
    }
    got
}

pub(crate) fn decode(f: &[u8]) -> Response<'_> {
    decode_response(&Frame::parse(f).unwrap()).unwrap()
}

pub(crate) fn pull(group: u64, user: u64) -> Request<'static> {
    Request::Pull {
        group,
        user,
        ack_up_to: 0,
        max_count: 100,
        max_bytes: 1 << 20,
        wait_ms: 0,
    }
}

/// Execution order is request order (protocol.md 1.4),
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

pub(crate) fn stats(c: &mut tidemark_client::Client) -> HashMap<String, u64> {
    c.stats().unwrap().into_iter().collect()
}

/// A client that sends part of a frame and stalls (or
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
    assert_eq!(stats(&mut idle)["net.frames_timed_out"], 1);
}

/// Connections that pipeline PINGs without pause (and
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
    let mut good = tidemark_client::Client::connect(&c).expect("connect during flood");
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

/// A connection with thousands of requests buffered gets a bounded turn
/// before another connection's request runs (protocol.md 1.5: at most
/// FRAMES_PER_PASS_MAX frames per turn). The node is stopped (SIGSTOP)
/// while both connections' bytes arrive, so they are ready in the same
/// pass, the deep one first. STATS on the other connection then counts
/// the deep connection's PINGs handled before it: at most a turn or two,
/// never all of them.
#[test]
fn a_request_waits_a_bounded_turn_behind_another_connections_deep_pipeline() {
    const DEEP: u64 = 2_000; // about 40 KB: fits the socket buffers while stopped
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--fsync", "never"]);
    let pid = node.child.id();
    let connect = || {
        let mut s = TcpStream::connect(&node.addr).unwrap();
        // A write that blocks while the node is stopped fails, not hangs.
        s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = Vec::new();
        hello(&mut b);
        s.write_all(&b).unwrap();
        responses(&mut s, &[1]);
        s
    };
    let mut deep = connect();
    let mut other = connect();
    let mut pings = Vec::new();
    for id in 2..DEEP + 2 {
        encode(id, &Request::Ping, &mut pings);
    }
    let mut ask = Vec::new();
    encode(2, &Request::Stats, &mut ask);

    node.signal(libc::SIGSTOP);
    let stopped = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('T'))
    };
    while !stopped() {
        std::thread::sleep(Duration::from_millis(1));
    }
    deep.write_all(&pings).unwrap();
    other.write_all(&ask).unwrap();
    node.signal(libc::SIGCONT);

    let answer = responses(&mut other, &[2]);
    let Response::Stats(figures) = decode(&answer[&2]) else {
        panic!("STATS answered with something else");
    };
    let pings_before = figures
        .iter()
        .find(|f| f.name.eq_ignore_ascii_case("requests.ping"))
        .map_or(0, |f| f.value);
    // A turn or two of the deep connection, and (whatever the constant
    // says) far from all of it.
    assert!(
        pings_before <= 2 * tidemark_node::FRAMES_PER_PASS_MAX as u64 && pings_before < DEEP / 2,
        "{pings_before} of the other connection's {DEEP} PINGs ran before this STATS"
    );
    // The deep connection is served whole too.
    let ids: Vec<u64> = (2..DEEP + 2).collect();
    assert_eq!(responses(&mut deep, &ids).len(), DEEP as usize);
}

/// Polls STATS until `cond` holds (or panics after a generous while): a
/// wait for the node to get there, not a timing assertion.
fn wait_for_stats(
    c: &mut tidemark_client::Client,
    what: &str,
    cond: impl Fn(&HashMap<String, u64>) -> bool,
) -> HashMap<String, u64> {
    for _ in 0..600 {
        let s = stats(c);
        if cond(&s) {
            return s;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{what}: never happened ({:?})", stats(c));
}

/// The output queued by all connections together is
/// bounded. Many connections pipeline big PULLs and never read; past
/// `output_bytes_total_max` the node closes the ones holding the most, and a
/// client that reads its responses keeps being served, big pages included.
#[test]
fn slow_readers_cannot_take_the_node_past_its_output_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget: u64 = 1 << 20;
    let node = Node::start(
        dir.path(),
        &[
            "--fsync",
            "never",
            "--frame-bytes-max",
            "131072",
            "--payload-bytes-max",
            "65536",
            "--output-bytes-max",
            "262144",
            "--output-bytes-total-max",
            &budget.to_string(),
        ],
    );
    let mut good = node.client();
    good.create_group(1).unwrap();
    for user in 1..=9 {
        good.join(1, user, JoinStart::Earliest).unwrap();
    }
    let payload = vec![7u8; 32 << 10];
    // Sent by a non-member: the members' cursors stay at 0.
    for i in 1..=40u64 {
        good.send(1, 100, i, &payload).unwrap();
    }
    let mut slow = Vec::new();
    for user in 2..=9u64 {
        let s = TcpStream::connect(&node.addr).unwrap();
        let mut out = Vec::new();
        hello(&mut out);
        for id in 2..=200u64 {
            encode(
                id,
                &Request::Pull {
                    group: 1,
                    user,
                    ack_up_to: 0,
                    max_count: 1000,
                    max_bytes: 1 << 20,
                    wait_ms: 0,
                },
                &mut out,
            );
        }
        let mut w = s.try_clone().unwrap();
        // Written from a thread: the node stops reading a connection whose
        // output is full, so the write may block until it is closed (the
        // thread then ends with an error; it is not joined).
        std::thread::spawn(move || {
            let _ = w.write_all(&out);
        });
        slow.push(s);
    }
    let s = wait_for_stats(&mut good, "a slow reader closed", |s| {
        s["net.connections_shed"] > 0
    });
    assert!(s["net.output_bytes_queued"] <= budget, "{s:?}");
    // The reading client is served throughout, whole pages included.
    for i in 41..=60u64 {
        good.ping().unwrap();
        good.send(1, 100, i, b"small").unwrap();
        let page = good.pull(1, 1, 0, 1000, 0).unwrap();
        assert_eq!(page.messages.first().map(|m| m.msg_id), Some(1));
        assert!(page.messages.len() >= 2, "a whole page, not a refusal");
    }
    let s = stats(&mut good);
    assert!(s["net.output_bytes_queued"] <= budget, "{s:?}");
    assert!(
        s["net.connections"] < 9,
        "the closed slow readers are gone: {s:?}"
    );
    drop(slow);
}

/// The input buffered by all connections together is
/// bounded. Connections that announce big frames and stall hold the budget
/// until it is full; the next big frame is refused with OVERLOADED (request
/// id 0, detail = the budget) and a close, and small frames are still served.
#[test]
fn stalled_big_frames_are_refused_past_the_input_budget() {
    let dir = tempfile::tempdir().unwrap();
    let budget: u64 = 300_000;
    let node = Node::start(
        dir.path(),
        &[
            "--frame-bytes-max",
            "131072",
            "--payload-bytes-max",
            "65536",
            "--output-bytes-max",
            "131072",
            "--input-bytes-total-max",
            &budget.to_string(),
        ],
    );
    let mut good = node.client();
    good.create_group(1).unwrap();
    let mut refused = 0;
    let mut held = Vec::new();
    for _ in 0..6 {
        let mut s = TcpStream::connect(&node.addr).unwrap();
        let mut out = Vec::new();
        hello(&mut out);
        // The first 4 KiB of a 100 000-byte SEND, then nothing.
        out.extend_from_slice(&100_000u32.to_le_bytes());
        out.extend_from_slice(&[1, 0x20, 0, 0]);
        out.extend_from_slice(&[0u8; 4096]);
        s.write_all(&out).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        assert!(matches!(
            decode(&read_frame(&mut s).unwrap()),
            Response::Hello(_)
        ));
        // Either the node holds the frame (no answer yet) or refuses it.
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        if let Some(f) = read_frame(&mut s) {
            match decode(&f) {
                Response::Error(e) => {
                    assert_eq!(e.code, ErrorCode::Overloaded);
                    assert_eq!(e.detail, Some(budget));
                    assert_eq!(u64::from_le_bytes(f[8..16].try_into().unwrap()), 0);
                }
                other => panic!("a stalled big frame got {other:?}"),
            }
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            assert!(read_frame(&mut s).is_none(), "closed after the refusal");
            refused += 1;
        }
        held.push(s);
    }
    assert!(
        refused >= 3,
        "100 000-byte frames past a 300 000-byte budget: {refused} refused"
    );
    good.ping().unwrap();
    good.send(1, 1, 1, b"small frames are served").unwrap();
    let s = stats(&mut good);
    assert!(s["net.input_bytes_buffered"] <= budget + 64 * 1024, "{s:?}");
    assert_eq!(s["net.input_refused"], refused);
}

/// A node spawned with a hard descriptor limit (set between fork and exec),
/// killed on drop.
struct LimitedNode {
    child: std::process::Child,
    addr: String,
}

impl LimitedNode {
    fn start(dir: &std::path::Path, nofile: u64) -> LimitedNode {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(crate::harness::tidemark_bin());
        cmd.arg("serve")
            .arg("--data")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0", "--fsync", "never"])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::inherit());
        // SAFETY: setrlimit is async-signal-safe; the closure touches no
        // shared state.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn tidemark");
        let addr = crate::harness::listening_addr(&mut child);
        LimitedNode { child, addr }
    }
}

impl Drop for LimitedNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What became of a new connection: served (HELLO answered), or refused
/// with the documented frame (OVERLOADED, request id 0) and closed. A
/// connection that hangs fails the test (read timeout).
fn connect_outcome(addr: &str) -> bool {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    hello(&mut out);
    // The refused get their frame whether or not they wrote first.
    let _ = s.write_all(&out);
    let f = read_frame(&mut s).expect("an answer, not a hang");
    match decode(&f) {
        Response::Hello(_) => true,
        Response::Error(e) => {
            assert_eq!(e.code, ErrorCode::Overloaded);
            assert_eq!(u64::from_le_bytes(f[8..16].try_into().unwrap()), 0);
            assert!(read_frame(&mut s).is_none(), "closed after the refusal");
            false
        }
        other => panic!("a new connection got {other:?}"),
    }
}

/// Segment files and connections share the descriptor
/// limit. Under a limit that cannot hold the configured maxima, the node
/// lowers both at start, so connections beyond what fits get OVERLOADED
/// instead of hanging in the accept queue.
#[test]
fn connections_beyond_the_descriptor_budget_get_overloaded() {
    let dir = tempfile::tempdir().unwrap();
    let node = LimitedNode::start(dir.path(), 300);
    let mut kept = Vec::new();
    let (mut served, mut refused) = (0, 0);
    for _ in 0..40 {
        let mut s = TcpStream::connect(&node.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = Vec::new();
        hello(&mut out);
        let _ = s.write_all(&out);
        let f = read_frame(&mut s).expect("an answer, not a hang");
        match decode(&f) {
            Response::Hello(_) => {
                served += 1;
                kept.push(s);
            }
            Response::Error(e) => {
                assert_eq!(e.code, ErrorCode::Overloaded);
                refused += 1;
            }
            other => panic!("got {other:?}"),
        }
    }
    assert!(
        served >= 1 && refused >= 1,
        "served {served}, refused {refused}"
    );
    // The node keeps serving the connections it holds.
    let mut s = kept.pop().unwrap();
    let mut out = Vec::new();
    encode(2, &Request::Ping, &mut out);
    s.write_all(&out).unwrap();
    assert!(matches!(
        decode(&read_frame(&mut s).unwrap()),
        Response::Pong
    ));
}

/// The node's open descriptors, from /proc.
fn open_fds(pid: u32) -> Vec<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// When accept fails for want of descriptors anyway
/// (EMFILE), the waiting connection gets the documented OVERLOADED frame
/// (the node's spare descriptor makes room for it), the node keeps serving
/// its connections, and accepts again once a descriptor is free.
#[test]
fn out_of_descriptors_at_accept_refuses_with_overloaded() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--fsync", "never"]);
    let pid = node.child.id();
    let mut kept = node.client();
    kept.create_group(1).unwrap();
    // A group's files are made at its first record (storage v2): made
    // now, while the node can still open files.
    kept.send(1, 1, 1, b"first").unwrap();
    let to_close = node.client();
    // Lower the node's limit to its lowest free descriptor number: it can
    // open nothing more.
    let fds = open_fds(pid);
    let limit = (0..).find(|n| !fds.contains(n)).unwrap();
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit on our own child with valid structs; the hard limit
    // stays as it is.
    let rc = unsafe {
        let got = libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, std::ptr::null(), &mut lim);
        lim.rlim_cur = limit;
        got | libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut())
    };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());
    for i in 0..5 {
        assert!(!connect_outcome(&node.addr), "connection {i} is refused");
    }
    kept.ping().unwrap();
    kept.send(1, 1, 2, b"still served").unwrap();
    // A descriptor comes free: the next connection is served.
    drop(to_close);
    let mut served = false;
    for _ in 0..50 {
        if connect_outcome(&node.addr) {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(served, "a connection is served once a descriptor is free");
    let s = stats(&mut kept);
    assert!(s["net.connections_refused"] >= 5, "{s:?}");
}
