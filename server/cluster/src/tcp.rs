//! The TCP transport between the replicas of a set (format-spec/cluster.md
//! section 7): Raft messages in CRC-checked frames on connections that
//! each open with the peer authentication handshake ([`peer_auth`],
//! section 7.1), one outbound connection per peer, a bounded number
//! inbound.
//!
//! Representation: per peer a bounded queue of encoded frames and a sender
//! thread that (re)connects, authenticates and writes them; a listener
//! thread that accepts connections and a reader thread per connection
//! that runs the listener's side of the handshake, then decodes frames
//! ([`FrameReader`]) and hands each message from its authenticated peer
//! to its [`Mailbox`]. Threads, not the client event loop: the event loop
//! never waits for Raft. A snapshot (cluster.md section 8.2) goes on a
//! connection and a thread of its own, authenticated the same way and
//! opened with the stream's preamble; the reader that finds the preamble
//! hands the whole stream to [`Mailbox::receive_snapshot`].
//!
//! Why a thread per connection still, and not the event loop's poll: the
//! connections are few and bounded (a member's peers, each with one frame
//! connection and now and then a snapshot stream), their reads block only
//! their own thread, and a snapshot's receive writes and fsyncs files,
//! which must not run on a loop. What made threads dangerous was their
//! number: inbound connections are capped ([`ListenerLimits`]: at most
//! `handshakes_max` unauthenticated ones, refused at accept beyond it,
//! and `connections_max` authenticated ones), so a stranger gets at most
//! `handshakes_max` threads, each for at most `handshake_timeout`.
//!
//! Invariants: nothing but the handshake is read from a connection before
//! both proofs were checked; a frame is delivered whole and checked
//! (length bounded by `frame_bytes_max`, CRC, `to` is this node, `from` is
//! the connection's authenticated peer and a member) or not at all; a
//! connection that sends a bad frame is closed, and one whose frame claims
//! another `from` is also counted ([`PeerStats::frames_forged`]). Nothing
//! is retried here: a frame the queue has no room for, or that a broken
//! connection lost, is dropped, which Raft tolerates (it resends).
//!
//! Costs: one handshake per connection (section 7.1); one encode and one
//! `write` per message on the sender thread; one decode per message on
//! the reader thread. Memory: [`QUEUED_FRAMES_MAX`] frames per peer; per
//! inbound connection a buffer that grows with the bytes that arrived
//! (never with the length a frame claims), so a stranger's connection
//! holds a few hundred bytes and a thread.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::peer_auth::{self, ClusterSecret, HandshakeError};
use crate::{Mailbox, Transport};

/// Bytes of a frame before its message.
pub const FRAME_HEADER_BYTES: usize = 24;
/// Default bound of a frame's bytes (its `len` field plus 4): a Raft
/// message carries at most `max_size_per_msg` (1 MiB) of entries beyond
/// the first, and an entry is one round payload (`commit_round_bytes_max`,
/// at most 64 MiB, storage.md section 13).
pub const FRAME_BYTES_MAX_DEFAULT: usize = 80 << 20;
/// Frames queued per peer before new ones are dropped.
pub const QUEUED_FRAMES_MAX: usize = 4096;
/// Default of [`ListenerLimits::connections_max`]: authenticated inbound
/// connections at once. A member of a set of up to 7 has at most 6 frame
/// connections inbound and now and then a snapshot stream beside one;
/// 32 is a few times that, room for reconnections whose old connection
/// the reader has not noticed closed yet.
pub const CONNECTIONS_MAX_DEFAULT: usize = 32;
/// Default of [`ListenerLimits::handshakes_max`]: connections in their
/// handshake at once. Peers connect rarely (once per link, then only
/// after a failure), so a few slots serve them; a stranger who fills them
/// delays a peer's reconnection by at most the handshake deadline.
pub const HANDSHAKES_MAX_DEFAULT: usize = 8;
/// Default of [`ListenerLimits::idle_timeout`]: an authenticated
/// connection on which no whole frame (or, for a snapshot stream, no byte)
/// arrived for this long is closed. The leader's heartbeats (every 20 ms)
/// keep the links that matter busy.
pub const PEER_IDLE_MS_DEFAULT: u64 = 30_000;
/// A sender drops a connection it has not written for this long and
/// connects again for its next frame, so that it never writes into a
/// connection the peer closed for idleness (where the frame would be
/// lost): half the peer's idle timeout.
pub const SEND_IDLE_MS: u64 = PEER_IDLE_MS_DEFAULT / 2;
const _: () = assert!(SEND_IDLE_MS < PEER_IDLE_MS_DEFAULT);
/// The room a full frame buffer grows by at least (one read fills at
/// most the room there is); the most a frame's claimed length makes a
/// reader allocate ahead of the bytes that arrived.
pub const READ_CHUNK_BYTES: usize = 64 << 10;
/// A reader's buffer keeps at most this much capacity between frames.
pub const FRAME_BUFFER_KEPT_BYTES: usize = 1 << 20;
/// How long a connect may take before the frame is dropped.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// How long one write of a snapshot stream may block before the stream is
/// given up (the leader sends a snapshot again later).
const SNAPSHOT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one write of a frame may block before its connection is
/// dropped.
const FRAME_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long bytes written on a frame connection may stay unacknowledged
/// by the peer's TCP before the kernel gives the connection up
/// (`TCP_USER_TIMEOUT`, cluster.md section 7): about the longest election
/// timeout at the defaults (2 x 100 ticks of 10 ms). A peer whose packets
/// vanish (a silent partition) is then noticed in that time rather than
/// after TCP's retransmissions end (about 15 minutes), and the next frame
/// dials a new connection; without it, frames written after the heal wait
/// behind the old connection's retransmission backoff (up to 2 minutes).
/// Not set on snapshot streams: their receiver may hold the window closed
/// while it syncs files, and their writes have a timeout of their own.
pub const FRAME_UNACKED_MAX: Duration = Duration::from_secs(2);
/// How often idle threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);
/// The same warning (a refused handshake, a connection refused at a cap)
/// is logged at most this often, with the count of those not logged: a
/// stranger must not be able to flood the log.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Why a frame was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum FrameError {
    /// `len` past the bound, or too small to hold the header.
    Length { len: usize, max: usize },
    /// The CRC does not match the bytes.
    Crc { expected: u32, actual: u32 },
    /// The message is not a valid `eraftpb.Message`.
    Message(String),
}

/// Appends the frame of `msg` (from `msg.from` to `msg.to`) to `buf`.
pub fn encode_frame(buf: &mut Vec<u8>, msg: &Message) {
    // Format: { len: u32 (bytes after itself) | crc: u32 (of from..end) |
    //   from: u64 | to: u64 } + eraftpb.Message (protobuf)
    let start = buf.len();
    buf.extend_from_slice(&[0; 8]);
    buf.extend_from_slice(&msg.from.to_le_bytes());
    buf.extend_from_slice(&msg.to.to_le_bytes());
    // Invariant: a message built by raft-rs always encodes (rust-protobuf
    // fails only on missing required fields, and eraftpb has none).
    let body = msg
        .write_to_bytes()
        .expect("invariant: an eraftpb message encodes");
    buf.extend_from_slice(&body);
    let len = u32::try_from(buf.len() - start - 4).unwrap_or(u32::MAX);
    buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// The length a frame's first 4 bytes announce (the whole frame's bytes),
/// checked against `max` before anything is buffered.
pub fn frame_len(head: [u8; 4], max: usize) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(head) as usize + 4;
    if len < FRAME_HEADER_BYTES || len > max {
        return Err(FrameError::Length { len, max });
    }
    Ok(len)
}

/// Decodes one whole frame (as long as [`frame_len`] said): its `from`,
/// `to` and message. The message's own `from` and `to` are the frame's.
pub fn decode_frame(frame: &[u8]) -> Result<Message, FrameError> {
    let max = frame.len();
    let head: [u8; 4] = frame
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .ok_or(FrameError::Length { len: max, max })?;
    if frame_len(head, max)? != max {
        return Err(FrameError::Length { len: max, max });
    }
    let expected = u32::from_le_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let actual = crc32fast::hash(&frame[8..]);
    if expected != actual {
        return Err(FrameError::Crc { expected, actual });
    }
    let from = u64::from_le_bytes(frame[8..16].try_into().unwrap_or([0; 8]));
    let to = u64::from_le_bytes(frame[16..24].try_into().unwrap_or([0; 8]));
    let mut msg = Message::default();
    msg.merge_from_bytes(&frame[FRAME_HEADER_BYTES..])
        .map_err(|e| FrameError::Message(e.to_string()))?;
    msg.from = from;
    msg.to = to;
    Ok(msg)
}

/// What one [`FrameReader::read_from`] got.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// A whole frame is in [`FrameReader::frame`] (length checked, not yet
    /// decoded).
    Frame,
    /// The connection's first 4 bytes are the snapshot preamble's
    /// (cluster.md section 8.2): the rest of the connection is a stream.
    Snapshot,
    /// No whole frame yet (some bytes may have arrived, or none before the
    /// read timeout).
    Pending,
    /// The peer closed the connection between two frames.
    Closed,
}

/// Why a connection's frames stopped.
#[derive(Debug)]
pub enum ReadError {
    /// The frame's length is out of bounds (its first 4 bytes).
    Frame(FrameError),
    /// The peer closed the connection inside a frame.
    Truncated {
        got: usize,
        want: usize,
    },
    Io(io::Error),
}

impl From<FrameError> for ReadError {
    fn from(e: FrameError) -> ReadError {
        ReadError::Frame(e)
    }
}

/// Reads a connection's frames as their bytes arrive: the buffer grows
/// with what was read (when full, by [`READ_CHUNK_BYTES`] or to twice
/// what arrived), never with the length a frame claims, so a peer that
/// announces 80 MiB and sends 4 bytes costs 64 KiB. Each buffer byte is
/// zeroed once, however the bytes are split into reads. Between frames a
/// buffer that grew past [`FRAME_BUFFER_KEPT_BYTES`] is given back.
#[derive(Debug)]
pub struct FrameReader {
    /// `buf[..have]` is the frame read so far; the rest is room, zeroed
    /// once.
    buf: Vec<u8>,
    have: usize,
    /// The frame's whole length once its first 4 bytes are checked.
    len: Option<usize>,
    max: usize,
    /// Nothing was read yet: the preamble may come.
    first: bool,
    /// `buf[..have]` is a whole frame (handed out; dropped by the next
    /// read).
    whole: bool,
}

impl FrameReader {
    /// A reader of frames of at most `frame_bytes_max` bytes.
    pub fn new(frame_bytes_max: usize) -> FrameReader {
        FrameReader {
            buf: Vec::new(),
            have: 0,
            len: None,
            max: frame_bytes_max,
            first: true,
            whole: false,
        }
    }

    /// One `read` from `r`, of at most what the frame still lacks; a read
    /// timeout is [`Step::Pending`].
    pub fn read_from(&mut self, r: &mut impl Read) -> Result<Step, ReadError> {
        if self.whole {
            self.whole = false;
            self.len = None;
            self.have = 0;
            if self.buf.capacity() > FRAME_BUFFER_KEPT_BYTES {
                self.buf = Vec::new();
            }
        }
        let want = self.len.unwrap_or(4);
        if self.buf.len() == self.have {
            // No room left: up to a chunk more, or double what arrived
            // (amortised copies for a large frame), never past the claim.
            let room = (self.have + READ_CHUNK_BYTES).max(2 * self.have).min(want);
            self.buf.reserve_exact(room - self.buf.len());
            self.buf.resize(room, 0);
        }
        let end = self.buf.len().min(want);
        let got = match r.read(&mut self.buf[self.have..end]) {
            Ok(n) => n,
            Err(e) => {
                return match e.kind() {
                    io::ErrorKind::WouldBlock
                    | io::ErrorKind::TimedOut
                    | io::ErrorKind::Interrupted => Ok(Step::Pending),
                    _ => Err(ReadError::Io(e)),
                };
            }
        };
        if got == 0 {
            return match self.have {
                0 => Ok(Step::Closed),
                got => Err(ReadError::Truncated { got, want }),
            };
        }
        self.have += got;
        if self.len.is_none() && self.have == 4 {
            let head = [self.buf[0], self.buf[1], self.buf[2], self.buf[3]];
            if std::mem::take(&mut self.first) && head[..] == crate::snapshot::PREAMBLE[..4] {
                self.have = 0;
                return Ok(Step::Snapshot);
            }
            self.len = Some(frame_len(head, self.max)?);
        }
        if self.len == Some(self.have) {
            self.whole = true;
            return Ok(Step::Frame);
        }
        Ok(Step::Pending)
    }

    /// The whole frame the last read completed (empty otherwise).
    pub fn frame(&self) -> &[u8] {
        match self.whole {
            true => &self.buf[..self.have],
            false => &[],
        }
    }

    /// The bytes the buffer holds room for now.
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }
}

/// The bounds of a node's inbound peer connections (cluster.md section
/// 7.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerLimits {
    /// A frame's bytes at most (its `len` plus 4).
    pub frame_bytes_max: usize,
    /// Authenticated connections at once; one more is closed after its
    /// handshake.
    pub connections_max: usize,
    /// Connections in their handshake at once; one more is closed at
    /// accept, before a byte is read.
    pub handshakes_max: usize,
    /// How long a handshake may take from the accept.
    pub handshake_timeout: Duration,
    /// An authenticated connection without a whole frame (a snapshot
    /// stream: without a byte) for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ListenerLimits {
    fn default() -> ListenerLimits {
        ListenerLimits {
            frame_bytes_max: FRAME_BYTES_MAX_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            handshakes_max: HANDSHAKES_MAX_DEFAULT,
            handshake_timeout: Duration::from_millis(peer_auth::HANDSHAKE_MS_DEFAULT),
            idle_timeout: Duration::from_millis(PEER_IDLE_MS_DEFAULT),
        }
    }
}

/// What a node's listener saw of its inbound peer connections: counters
/// since the start and gauges of now, for the node's reports.
#[derive(Debug, Default)]
pub struct PeerStats {
    /// Connections that completed the handshake.
    pub authenticated: AtomicU64,
    /// Handshakes that failed: a wrong byte, a wrong proof (another
    /// secret, or none), a dialer that is no member, the deadline.
    pub handshakes_failed: AtomicU64,
    /// Connections closed at a cap (`handshakes_max` at accept,
    /// `connections_max` after the handshake).
    pub refused_at_cap: AtomicU64,
    /// Frames dropped because their `from` is not the connection's
    /// authenticated peer (the connection is closed with it).
    pub frames_forged: AtomicU64,
    /// Authenticated connections closed for idleness.
    pub idle_closed: AtomicU64,
    /// Connections in their handshake now.
    pub handshaking: AtomicUsize,
    /// Authenticated connections open now.
    pub open: AtomicUsize,
}

/// One unit of a [`PeerStats`] gauge, given back when dropped.
struct Held {
    stats: Arc<PeerStats>,
    gauge: fn(&PeerStats) -> &AtomicUsize,
}

impl Held {
    /// A unit of `gauge` if it is below `max`.
    fn take(
        stats: &Arc<PeerStats>,
        gauge: fn(&PeerStats) -> &AtomicUsize,
        max: usize,
    ) -> Option<Held> {
        gauge(stats)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Held {
            stats: stats.clone(),
            gauge,
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        (self.gauge)(&self.stats).fetch_sub(1, Ordering::AcqRel);
    }
}

/// Logs a warning at most once per [`WARN_EVERY`], with how many were
/// left out since the last one.
struct WarnEvery {
    start: Instant,
    /// Milliseconds after `start` of the last warning logged; `u64::MAX`:
    /// none yet.
    last_ms: AtomicU64,
    left_out: AtomicU64,
}

impl WarnEvery {
    fn new() -> WarnEvery {
        WarnEvery {
            start: Instant::now(),
            last_ms: AtomicU64::new(u64::MAX),
            left_out: AtomicU64::new(0),
        }
    }

    fn warn(&self, what: impl FnOnce() -> String) {
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.last_ms.load(Ordering::Acquire);
        let due = last == u64::MAX || now.saturating_sub(last) >= WARN_EVERY.as_millis() as u64;
        if !due
            || self
                .last_ms
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            self.left_out.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match self.left_out.swap(0, Ordering::Relaxed) {
            0 => log::warn!("{}", what()),
            n => log::warn!("{} ({n} more like it not logged)", what()),
        }
    }
}

/// How this node reaches one peer: its ids and the secret.
#[derive(Clone, Debug)]
struct Link {
    me: u64,
    peer: u64,
    addr: SocketAddr,
    secret: ClusterSecret,
}

/// Why a connection to a peer could not be made.
enum DialError {
    /// No TCP connection (the peer is down: Raft copes, nothing to say).
    Connect(io::Error),
    /// A connection, but no handshake: worth a warning.
    Handshake(HandshakeError),
}

impl Link {
    /// A connection to the peer, authenticated (cluster.md section 7.1).
    /// With `unacked_max`, the kernel gives the connection up once written
    /// bytes stayed unacknowledged that long ([`FRAME_UNACKED_MAX`]).
    fn dial(
        &self,
        write_timeout: Duration,
        unacked_max: Option<Duration>,
    ) -> Result<TcpStream, DialError> {
        let mut s = TcpStream::connect_timeout(&self.addr, CONNECT_TIMEOUT)
            .and_then(|s| s.set_nodelay(true).map(|()| s))
            .and_then(|s| match unacked_max {
                Some(max) => set_unacked_max(&s, max).map(|()| s),
                None => Ok(s),
            })
            .map_err(DialError::Connect)?;
        let handshake = Duration::from_millis(peer_auth::HANDSHAKE_MS_DEFAULT);
        peer_auth::dial(&mut s, &self.secret, self.me, self.peer, handshake)
            .map_err(DialError::Handshake)?;
        s.set_write_timeout(Some(write_timeout))
            .map_err(DialError::Connect)?;
        Ok(s)
    }

    fn refused(&self, e: &HandshakeError) -> String {
        format!(
            "raft connection to node {} at {}: {e} (every member needs the same \
             --cluster-token-file)",
            self.peer, self.addr
        )
    }
}

/// Sets `TCP_USER_TIMEOUT` on `s` (Linux): the longest written bytes may
/// stay unacknowledged before the kernel ends the connection with
/// `ETIMEDOUT`, which the next write returns.
fn set_unacked_max(s: &TcpStream, max: Duration) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let ms = libc::c_uint::try_from(max.as_millis()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: the descriptor is `s`'s, open for the call; the option value
    // is a c_uint that lives across it, and its size is passed.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A peer's cluster address and its sender thread's queue.
type PeerQueue = (SocketAddr, SyncSender<Vec<u8>>);

/// The sending side: a queue and a thread per peer.
pub struct TcpTransport {
    /// This node's id, which its handshakes claim and prove.
    me: u64,
    secret: ClusterSecret,
    /// Per peer its cluster address (snapshot streams connect there, on a
    /// connection of their own each) and its sender thread's queue. Changed
    /// when a membership change applies ([`Transport::set_peers`]).
    peers: Mutex<HashMap<u64, PeerQueue>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl TcpTransport {
    /// Node `me` sends to `peers` (node id to cluster address), proving
    /// that it holds `secret` on each connection.
    pub fn new(
        me: u64,
        peers: &HashMap<u64, SocketAddr>,
        secret: ClusterSecret,
    ) -> io::Result<TcpTransport> {
        let out = TcpTransport {
            me,
            secret,
            peers: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
        };
        for (&id, &addr) in peers {
            out.add_peer(id, addr)?;
        }
        Ok(out)
    }

    fn link(&self, peer: u64, addr: SocketAddr) -> Link {
        Link {
            me: self.me,
            peer,
            addr,
            secret: self.secret.clone(),
        }
    }

    fn add_peer(&self, id: u64, addr: SocketAddr) -> io::Result<()> {
        let (tx, rx) = sync_channel(QUEUED_FRAMES_MAX);
        let stop = self.stop.clone();
        let link = self.link(id, addr);
        let t = std::thread::Builder::new()
            .name(format!("tidemark-raft-send-{id}"))
            .spawn(move || send_loop(&link, rx, &stop))?;
        lock(&self.peers).insert(id, (addr, tx));
        let mut threads = lock(&self.threads);
        threads.retain(|t| !t.is_finished());
        threads.push(t);
        Ok(())
    }
}

/// A lock that a panicked holder left is still good here: the maps hold
/// no invariant a half-done change could break.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Transport for TcpTransport {
    /// A peer whose address is new or changed gets a sender thread (an
    /// address that does not parse is logged and left out, an empty one
    /// changes nothing); a peer no longer named loses its queue, and its
    /// thread ends.
    fn set_peers(&self, peers: &[(u64, String)]) {
        lock(&self.peers).retain(|id, _| peers.iter().any(|(p, _)| p == id));
        for (id, addr) in peers {
            if addr.is_empty() {
                // Not known (a membership from configuration without
                // addresses): the queue it has, if any, is kept.
                continue;
            }
            let Ok(addr) = addr.parse::<SocketAddr>() else {
                log::warn!("node {id}: cluster address {addr:?} is not host:port; not sent to");
                continue;
            };
            if lock(&self.peers).get(id).is_some_and(|(a, _)| *a == addr) {
                continue;
            }
            if let Err(e) = self.add_peer(*id, addr) {
                log::warn!("node {id}: sender thread: {e}");
            }
        }
    }

    fn send(&self, msg: Message) {
        if let Some((_, q)) = lock(&self.peers).get(&msg.to) {
            let mut frame = Vec::new();
            encode_frame(&mut frame, &msg);
            // A full queue drops the frame: Raft resends.
            let _ = q.try_send(frame);
        }
    }

    /// A connection of its own to the peer, authenticated, and a thread
    /// that writes the stream (cluster.md section 8.2), so that a snapshot
    /// never holds up the peer's Raft frames; the thread ends with the
    /// stream.
    fn send_snapshot(
        &self,
        msg: Message,
        snapshot: Arc<tidemark_engine::Snapshot>,
        done: Box<dyn FnOnce(bool) + Send>,
    ) {
        let Some(addr) = lock(&self.peers).get(&msg.to).map(|(a, _)| *a) else {
            done(false);
            return;
        };
        let to = msg.to;
        let link = self.link(to, addr);
        let spawned = std::thread::Builder::new()
            .name(format!("tidemark-raft-snap-{to}"))
            .spawn(move || {
                let started = std::time::Instant::now();
                let sent = link
                    .dial(SNAPSHOT_WRITE_TIMEOUT, None)
                    .map_err(|e| match e {
                        DialError::Connect(e) => format!("connect: {e}"),
                        DialError::Handshake(e) => link.refused(&e),
                    })
                    .and_then(|s| {
                        let mut w = io::BufWriter::with_capacity(256 << 10, s);
                        crate::snapshot::write_stream(&mut w, &msg, &snapshot)
                    });
                match &sent {
                    Ok(bytes) => log::info!(
                        "snapshot to node {to}: {bytes} bytes in {:?}",
                        started.elapsed()
                    ),
                    Err(e) => log::warn!("snapshot to node {to}: {e}"),
                }
                drop(snapshot);
                done(sent.is_ok());
            });
        if let Err(e) = spawned {
            log::warn!("snapshot sender thread: {e}");
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        lock(&self.peers).clear();
        for t in lock(&self.threads).drain(..) {
            let _ = t.join();
        }
    }
}

/// A peer's sender thread: connects and authenticates when it has a frame
/// and no connection, writes, and forgets a connection that failed (the
/// frame is lost) or that it left unused for [`SEND_IDLE_MS`].
fn send_loop(link: &Link, rx: Receiver<Vec<u8>>, stop: &AtomicBool) {
    let idle = Duration::from_millis(SEND_IDLE_MS);
    let warn = WarnEvery::new();
    let mut conn: Option<TcpStream> = None;
    let mut written = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let frame = match rx.recv_timeout(POLL) {
            Ok(f) => Some(f),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if written.elapsed() >= idle {
            conn = None;
        }
        let Some(frame) = frame else {
            continue;
        };
        if conn.is_none() {
            conn = match link.dial(FRAME_WRITE_TIMEOUT, Some(FRAME_UNACKED_MAX)) {
                Ok(s) => Some(s),
                Err(DialError::Handshake(e)) if e.is_refusal() => {
                    warn.warn(|| link.refused(&e));
                    None
                }
                Err(_) => None,
            };
        }
        if let Some(s) = conn.as_mut() {
            if s.write_all(&frame).is_err() {
                conn = None;
            }
            written = Instant::now();
        }
    }
}

/// The receiving side: a listener thread and a reader per connection.
pub struct TcpListenerHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<PeerStats>,
}

impl TcpListenerHandle {
    /// What the listener saw of its connections.
    pub fn stats(&self) -> &Arc<PeerStats> {
        &self.stats
    }
}

/// A bound listening socket, before its node's mailbox exists (peers must
/// know its address before the replicas start).
pub struct BoundListener {
    listener: TcpListener,
}

impl BoundListener {
    /// Binds `addr` (port 0: any free port).
    pub fn bind(addr: SocketAddr) -> io::Result<BoundListener> {
        Ok(BoundListener {
            listener: TcpListener::bind(addr)?,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Accepts connections to node `id` within `limits`, each of which
    /// must prove that it holds `secret` and come from a member `mailbox`
    /// admits (`Mailbox::admits`, which follows membership changes); their
    /// frames go to `mailbox`.
    pub fn start(
        self,
        id: u64,
        mailbox: Mailbox,
        secret: ClusterSecret,
        limits: ListenerLimits,
    ) -> io::Result<TcpListenerHandle> {
        let listener = self.listener;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(PeerStats::default());
        let inbound = Arc::new(Inbound {
            id,
            mailbox,
            secret,
            limits,
            stats: stats.clone(),
            stop: stop.clone(),
            warn: WarnEvery::new(),
        });
        let thread = std::thread::Builder::new()
            .name(format!("tidemark-raft-listen-{id}"))
            .spawn(move || accept_loop(&listener, &inbound))?;
        Ok(TcpListenerHandle {
            stop,
            thread: Some(thread),
            stats,
        })
    }
}

impl Drop for TcpListenerHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What every reader thread of a listener shares.
struct Inbound {
    id: u64,
    mailbox: Mailbox,
    secret: ClusterSecret,
    limits: ListenerLimits,
    stats: Arc<PeerStats>,
    stop: Arc<AtomicBool>,
    /// Refused handshakes and connections: one warning per [`WARN_EVERY`].
    warn: WarnEvery,
}

fn accept_loop(listener: &TcpListener, inbound: &Arc<Inbound>) {
    let id = inbound.id;
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    while !inbound.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((conn, from)) => {
                readers.retain(|t| !t.is_finished());
                let stats = &inbound.stats;
                let max = inbound.limits.handshakes_max;
                let Some(slot) = Held::take(stats, |s| &s.handshaking, max) else {
                    // Closed before a byte is read: no thread, no buffer.
                    stats.refused_at_cap.fetch_add(1, Ordering::Relaxed);
                    inbound.warn.warn(|| {
                        format!(
                            "raft listener of node {id}: a connection from {from} refused: \
                             {max} handshakes under way (handshakes_max)"
                        )
                    });
                    continue;
                };
                let inbound = inbound.clone();
                let spawned = std::thread::Builder::new()
                    .name(format!("tidemark-raft-read-{id}"))
                    .spawn(move || {
                        if let Err(e) = serve_connection(conn, from, &inbound, slot) {
                            log::debug!("raft connection from {from} to node {id} closed: {e}");
                        }
                    });
                if let Ok(t) = spawned {
                    readers.push(t);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::sleep(POLL / 10),
            Err(e) => {
                log::warn!("raft listener of node {id}: {e}");
                std::thread::sleep(POLL);
            }
        }
    }
    for t in readers {
        let _ = t.join();
    }
}

/// One inbound connection: the handshake (holding `handshake` slot), then
/// its frames or its snapshot stream.
fn serve_connection(
    mut conn: TcpStream,
    from: SocketAddr,
    inbound: &Inbound,
    handshake: Held,
) -> Result<(), String> {
    let (id, stats) = (inbound.id, &inbound.stats);
    conn.set_nonblocking(false)
        .map_err(|e| format!("read: {e}"))?;
    let accepted = peer_auth::accept(
        &mut conn,
        &inbound.secret,
        id,
        &|p| inbound.mailbox.admits(p),
        inbound.limits.handshake_timeout,
    );
    drop(handshake);
    let peer = match accepted {
        Ok(peer) => peer,
        Err(e) => {
            stats.handshakes_failed.fetch_add(1, Ordering::Relaxed);
            if e.is_refusal() {
                inbound.warn.warn(|| {
                    format!("raft listener of node {id}: a handshake from {from} refused: {e}")
                });
            }
            return Err(format!("handshake: {e}"));
        }
    };
    stats.authenticated.fetch_add(1, Ordering::Relaxed);
    let max = inbound.limits.connections_max;
    let Some(_open) = Held::take(stats, |s| &s.open, max) else {
        stats.refused_at_cap.fetch_add(1, Ordering::Relaxed);
        inbound.warn.warn(|| {
            format!(
                "raft listener of node {id}: node {peer}'s connection from {from} refused: \
                 {max} connections open (connections_max)"
            )
        });
        return Err("connections_max".into());
    };
    serve_peer(&mut conn, peer, inbound)
}

/// The frames (or the snapshot stream) of an authenticated connection
/// from node `peer`.
fn serve_peer(conn: &mut TcpStream, peer: u64, inbound: &Inbound) -> Result<(), String> {
    let (id, limits, stats) = (inbound.id, &inbound.limits, &inbound.stats);
    conn.set_read_timeout(Some(POLL))
        .map_err(|e| format!("read: {e}"))?;
    let mut reader = FrameReader::new(limits.frame_bytes_max);
    let mut last_frame = Instant::now();
    loop {
        if inbound.stop.load(Ordering::Acquire) {
            return Ok(());
        }
        match reader.read_from(conn).map_err(|e| format!("{e:?}"))? {
            Step::Frame => {
                last_frame = Instant::now();
                let msg = decode_frame(reader.frame()).map_err(|e| format!("{e:?}"))?;
                if msg.from != peer {
                    stats.frames_forged.fetch_add(1, Ordering::Relaxed);
                    inbound.warn.warn(|| {
                        format!(
                            "raft listener of node {id}: node {peer} sent a frame from node {}: \
                             dropped, connection closed",
                            msg.from
                        )
                    });
                    return Err(format!(
                        "a frame from {} on node {peer}'s connection",
                        msg.from
                    ));
                }
                if msg.to != id || !inbound.mailbox.admits(peer) {
                    return Err(format!(
                        "a frame from node {peer} to node {}: not a member, or not for this node",
                        msg.to
                    ));
                }
                inbound.mailbox.deliver(msg);
            }
            Step::Snapshot => {
                // A snapshot stream (cluster.md section 8.2): its
                // connection carries nothing else.
                let mut r = IdleRead::new(conn, &inbound.stop, limits.idle_timeout);
                let mut rest = [0u8; 4];
                r.read_exact(&mut rest).map_err(|e| format!("read: {e}"))?;
                if rest != crate::snapshot::PREAMBLE[4..] {
                    return Err("a connection that is neither frames nor a snapshot".into());
                }
                return inbound
                    .mailbox
                    .receive_snapshot(&mut r, peer)
                    .map_err(|e| e.to_string());
            }
            Step::Pending => {
                if last_frame.elapsed() >= limits.idle_timeout {
                    stats.idle_closed.fetch_add(1, Ordering::Relaxed);
                    return Err(format!("no whole frame for {:?}", limits.idle_timeout));
                }
            }
            Step::Closed => return Ok(()),
        }
    }
}

/// A connection read to the end, whatever its read timeout, until the
/// stop flag or `idle` without a byte.
struct IdleRead<'a> {
    conn: &'a mut TcpStream,
    stop: &'a AtomicBool,
    idle: Duration,
    last: Instant,
}

impl<'a> IdleRead<'a> {
    fn new(conn: &'a mut TcpStream, stop: &'a AtomicBool, idle: Duration) -> IdleRead<'a> {
        IdleRead {
            conn,
            stop,
            idle,
            last: Instant::now(),
        }
    }
}

impl Read for IdleRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("the node stops"));
            }
            match self.conn.read(buf) {
                // Judged only when a read found nothing: a receiver that
                // spent long in an fsync finds the stream's bytes waiting.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) =>
                {
                    if self.last.elapsed() >= self.idle {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no byte for {:?}", self.idle),
                        ));
                    }
                }
                Ok(n) => {
                    self.last = Instant::now();
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
    }
}
