//! What a peer can make a listener do (cluster.md sections 7.1 and 7.2):
//! a frame reader's buffer grows with the bytes that arrived, not with a
//! frame's claim; a stranger's bytes are refused at the handshake; after
//! a good handshake a frame claiming another `from` is dropped, counted,
//! and closes its connection; idle and silent connections are closed at
//! their deadlines; connections past the caps are refused; a snapshot
//! stream is taken only from its authenticated sender. The listener here
//! is node 2's, with a mailbox of no replica (members 1, 2, 3).

use std::io::{Cursor, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use raft::eraftpb::{Message, MessageType};

use super::secret;
use crate::peer_auth::{self, ClusterSecret, HandshakeError};
use crate::replica::DetachedInbox;
use crate::tcp::{
    encode_frame, BoundListener, FrameReader, ListenerLimits, ReadError, Step, TcpListenerHandle,
    FRAME_BYTES_MAX_DEFAULT, READ_CHUNK_BYTES,
};
use crate::Mailbox;

const ME: u64 = 2;
const WAIT: Duration = Duration::from_secs(5);

struct Listening {
    handle: TcpListenerHandle,
    addr: SocketAddr,
    inbox: DetachedInbox,
    dir: tempfile::TempDir,
}

fn listen(limits: ListenerLimits) -> Listening {
    let dir = tempfile::tempdir().unwrap();
    let (mailbox, inbox) = Mailbox::detached(ME, vec![1, 2, 3], dir.path().to_path_buf());
    let bound = BoundListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = bound.local_addr().unwrap();
    let handle = bound.start(ME, mailbox, secret(), limits).unwrap();
    Listening {
        handle,
        addr,
        inbox,
        dir,
    }
}

/// A connection to node 2 as node `me`, authenticated with `secret`.
fn dial_as(addr: SocketAddr, me: u64, secret: &ClusterSecret) -> Result<TcpStream, HandshakeError> {
    let mut s = TcpStream::connect(addr).map_err(HandshakeError::Io)?;
    peer_auth::dial(&mut s, secret, me, ME, WAIT)?;
    Ok(s)
}

fn heartbeat(from: u64, term: u64) -> Vec<u8> {
    let msg = Message {
        msg_type: MessageType::MsgHeartbeat,
        from,
        to: ME,
        term,
        ..Default::default()
    };
    let mut f = Vec::new();
    encode_frame(&mut f, &msg);
    f
}

/// Whether the listener closed `s` (EOF or reset) within `wait`.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let deadline = Instant::now() + wait;
    let mut b = [0u8; 64];
    while Instant::now() < deadline {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return true,
        }
    }
    false
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !f() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A reader that hands out one byte per read.
struct Trickle<'a>(&'a [u8]);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let Some((&b, rest)) = self.0.split_first() else {
            return Ok(0);
        };
        buf[0] = b;
        self.0 = rest;
        Ok(1)
    }
}

#[test]
fn an_oversized_length_prefix_does_not_allocate_its_claim() {
    // A frame claiming 80 MiB (within the bound), of which 4 bytes come.
    let claim = (FRAME_BYTES_MAX_DEFAULT - 4) as u32;
    let mut bytes = claim.to_le_bytes().to_vec();
    bytes.extend_from_slice(&[1, 2, 3, 4]);
    let mut reader = FrameReader::new(FRAME_BYTES_MAX_DEFAULT);
    let mut r = Cursor::new(bytes);
    let end = loop {
        match reader.read_from(&mut r) {
            Ok(Step::Pending) => continue,
            other => break other,
        }
    };
    assert!(
        matches!(end, Err(ReadError::Truncated { got: 8, .. })),
        "{end:?}"
    );
    assert!(
        reader.buffer_capacity() <= 2 * READ_CHUNK_BYTES,
        "{} bytes buffered for 8 received",
        reader.buffer_capacity()
    );
    // A frame past the bound is refused from its first 4 bytes.
    let mut reader = FrameReader::new(1 << 20);
    let mut r = Cursor::new(((2u32 << 20) - 4).to_le_bytes());
    let mut refused = reader.read_from(&mut r);
    while matches!(refused, Ok(Step::Pending)) {
        refused = reader.read_from(&mut r);
    }
    assert!(matches!(refused, Err(ReadError::Frame(_))), "{refused:?}");
}

#[test]
fn frames_arriving_a_byte_at_a_time_are_read_whole_and_the_preamble_only_first() {
    let two = [heartbeat(1, 3), heartbeat(1, 4)].concat();
    let mut reader = FrameReader::new(FRAME_BYTES_MAX_DEFAULT);
    let mut r = Trickle(&two);
    let mut frames = Vec::new();
    loop {
        match reader.read_from(&mut r).unwrap() {
            Step::Frame => frames.push(reader.frame().to_vec()),
            Step::Pending => {}
            Step::Closed => break,
            Step::Snapshot => panic!("frames taken for a snapshot"),
        }
    }
    assert_eq!(frames, [heartbeat(1, 3), heartbeat(1, 4)]);
    let mut reader = FrameReader::new(FRAME_BYTES_MAX_DEFAULT);
    let mut r = Cursor::new(crate::snapshot::PREAMBLE);
    assert_eq!(reader.read_from(&mut r).unwrap(), Step::Snapshot);
    // After a frame, the preamble's bytes are a length far too long.
    let mut reader = FrameReader::new(FRAME_BYTES_MAX_DEFAULT);
    let mut r = Cursor::new([heartbeat(1, 3), crate::snapshot::PREAMBLE.to_vec()].concat());
    assert_eq!(reader.read_from(&mut r).unwrap(), Step::Pending);
    assert_eq!(reader.read_from(&mut r).unwrap(), Step::Frame);
    let mut next = reader.read_from(&mut r);
    while matches!(next, Ok(Step::Pending)) {
        next = reader.read_from(&mut r);
    }
    assert!(matches!(next, Err(ReadError::Frame(_))), "{next:?}");
}

#[test]
fn a_frame_whose_from_is_not_the_authenticated_peer_is_dropped_and_counted() {
    let l = listen(ListenerLimits::default());
    let mut s = dial_as(l.addr, 1, &secret()).unwrap();
    s.write_all(&heartbeat(1, 3)).unwrap();
    let got = l.inbox.messages(WAIT);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].from, got[0].term), (1, 3));
    // Node 1, authenticated, claims to be node 3 at a term far ahead.
    s.write_all(&heartbeat(3, 1_000_000)).unwrap();
    s.write_all(&heartbeat(1, 5)).unwrap();
    assert!(closed_within(&mut s, WAIT), "the connection stayed open");
    let stats = l.handle.stats();
    assert_eq!(stats.frames_forged.load(Ordering::Acquire), 1);
    let after = l.inbox.messages(Duration::from_millis(200));
    assert!(
        after.is_empty(),
        "delivered after the forged frame: {after:?}"
    );
}

#[test]
fn a_stranger_is_refused_at_its_first_byte_and_another_secret_at_its_proof() {
    let l = listen(ListenerLimits::default());
    // A frame with no handshake: its first byte is not the magic's.
    let mut s = TcpStream::connect(l.addr).unwrap();
    s.write_all(&heartbeat(1, 1_000_000)).unwrap();
    assert!(closed_within(&mut s, WAIT));
    // A node of another set (another secret): the listener's proof fails
    // at the dialer, which never proves itself.
    let other = ClusterSecret::new(b"another set's secret".to_vec()).unwrap();
    let e = dial_as(l.addr, 1, &other).unwrap_err();
    assert!(matches!(e, HandshakeError::Proof), "{e}");
    let stats = l.handle.stats().clone();
    wait_until("two failed handshakes counted", || {
        stats.handshakes_failed.load(Ordering::Acquire) == 2
    });
    assert_eq!(stats.authenticated.load(Ordering::Acquire), 0);
    assert!(l.inbox.messages(Duration::from_millis(200)).is_empty());
}

#[test]
fn an_idle_connection_is_closed_after_the_timeout_and_a_busy_one_is_not() {
    let l = listen(ListenerLimits {
        idle_timeout: Duration::from_millis(500),
        ..ListenerLimits::default()
    });
    let mut busy = dial_as(l.addr, 1, &secret()).unwrap();
    let mut idle = dial_as(l.addr, 3, &secret()).unwrap();
    let started = Instant::now();
    for term in 1..=12 {
        busy.write_all(&heartbeat(1, term)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        closed_within(&mut idle, WAIT),
        "the idle connection stayed open"
    );
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert_eq!(l.handle.stats().idle_closed.load(Ordering::Acquire), 1);
    // 1.2 s of a frame every 100 ms: the busy one is open, all delivered.
    busy.write_all(&heartbeat(1, 13)).unwrap();
    let deadline = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < 13 && Instant::now() < deadline {
        got.extend(l.inbox.messages(Duration::from_millis(100)));
    }
    assert_eq!(got.len(), 13);
    // A connection that never completes its handshake ends at its deadline.
    let l = listen(ListenerLimits {
        handshake_timeout: Duration::from_millis(300),
        ..ListenerLimits::default()
    });
    let mut silent = TcpStream::connect(l.addr).unwrap();
    assert!(closed_within(&mut silent, WAIT));
    assert_eq!(
        l.handle.stats().handshakes_failed.load(Ordering::Acquire),
        1
    );
}

#[test]
fn connections_past_the_caps_are_refused() {
    let l = listen(ListenerLimits {
        handshakes_max: 2,
        connections_max: 1,
        handshake_timeout: Duration::from_secs(30),
        ..ListenerLimits::default()
    });
    let stats = l.handle.stats().clone();
    let silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(l.addr).unwrap())
        .collect();
    wait_until("two handshakes under way", || {
        stats.handshaking.load(Ordering::Acquire) == 2
    });
    // A third is closed at accept, long before the handshake deadline.
    let mut third = TcpStream::connect(l.addr).unwrap();
    assert!(
        closed_within(&mut third, WAIT),
        "a third handshake was let in"
    );
    assert_eq!(stats.refused_at_cap.load(Ordering::Acquire), 1);
    drop(silent);
    wait_until("the silent ones' slots given back", || {
        stats.handshaking.load(Ordering::Acquire) == 0
    });
    let first = dial_as(l.addr, 1, &secret()).unwrap();
    wait_until("one connection open", || {
        stats.open.load(Ordering::Acquire) == 1
    });
    // The second proves itself but finds the one slot taken.
    let mut second = dial_as(l.addr, 3, &secret()).unwrap();
    assert!(closed_within(&mut second, WAIT));
    assert_eq!(stats.refused_at_cap.load(Ordering::Acquire), 2);
    drop(first);
    wait_until("its slot given back", || {
        stats.open.load(Ordering::Acquire) == 0
    });
    let mut again = dial_as(l.addr, 3, &secret()).unwrap();
    again.write_all(&heartbeat(3, 1)).unwrap();
    assert_eq!(l.inbox.messages(WAIT).len(), 1);
}

/// A snapshot stream's preamble and a Begin record from `from` at a new
/// (index, term) (cluster.md section 8.2).
fn stream_start(from: u64) -> Vec<u8> {
    let mut s = crate::snapshot::PREAMBLE.to_vec();
    crate::snapshot::encode_begin(&mut s, [from, ME, 1_000, 1_000, 1, 0]);
    s
}

#[test]
fn a_snapshot_stream_is_taken_only_from_its_authenticated_sender() {
    let l = listen(ListenerLimits::default());
    let staged = l.dir.path().join(crate::snapshot::INBOX_DIR);
    // A stranger's stream claiming the leader: refused at the handshake.
    let mut s = TcpStream::connect(l.addr).unwrap();
    let _ = s.write_all(&stream_start(1));
    assert!(closed_within(&mut s, WAIT));
    // Node 3, authenticated, sends a stream under node 1's name.
    let mut s = dial_as(l.addr, 3, &secret()).unwrap();
    s.write_all(&stream_start(1)).unwrap();
    assert!(closed_within(&mut s, WAIT));
    assert!(!staged.exists(), "{} created", staged.display());
    // Under its own name, the stream's Begin is taken (and staging starts).
    let mut s = dial_as(l.addr, 3, &secret()).unwrap();
    s.write_all(&stream_start(3)).unwrap();
    wait_until("node 3's stream staged", || staged.exists());
    drop(s);
    assert!(l.inbox.messages(Duration::from_millis(200)).is_empty());
}
