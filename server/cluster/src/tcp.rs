//! The TCP transport between the replicas of a set (format-spec/cluster.md
//! section 7): Raft messages in CRC-checked frames, one outbound connection
//! per peer, any number inbound.
//!
//! Representation: per peer a bounded queue of encoded frames and a sender
//! thread that (re)connects and writes them; a listener thread that accepts
//! connections and a reader thread per connection that decodes frames and
//! hands each message addressed to this node to its [`Mailbox`]. Threads,
//! not the client event loop: the event loop never waits for Raft. A
//! snapshot (cluster.md section 8.2) goes on a connection and a thread of
//! its own, opened with the stream's preamble; the reader that finds the
//! preamble hands the whole stream to [`Mailbox::receive_snapshot`].
//!
//! Invariants: a frame is delivered whole and checked (length bounded by
//! `frame_bytes_max`, CRC, `to` is this node, `from` is a member) or not at
//! all; a connection that sends a bad frame is closed. Nothing is retried
//! here: a frame the queue has no room for, or that a broken connection
//! lost, is dropped, which Raft tolerates (it resends).
//!
//! Costs: one encode and one `write` per message on the sender thread; one
//! decode per message on the reader thread; memory bounded by
//! [`QUEUED_FRAMES_MAX`] frames per peer and one frame per connection.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use protobuf::Message as _;
use raft::eraftpb::Message;

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
/// How long a connect may take before the frame is dropped.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(200);
/// How long one write of a snapshot stream may block before the stream is
/// given up (the leader sends a snapshot again later).
const SNAPSHOT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often idle threads look at the stop flag.
const POLL: Duration = Duration::from_millis(100);

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

/// A peer's cluster address and its sender thread's queue.
type PeerQueue = (SocketAddr, SyncSender<Vec<u8>>);

/// The sending side: a queue and a thread per peer.
pub struct TcpTransport {
    /// Per peer its cluster address (snapshot streams connect there, on a
    /// connection of their own each) and its sender thread's queue. Changed
    /// when a membership change applies ([`Transport::set_peers`]).
    peers: Mutex<HashMap<u64, PeerQueue>>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl TcpTransport {
    /// Sends to `peers` (node id to cluster address).
    pub fn new(peers: &HashMap<u64, SocketAddr>) -> io::Result<TcpTransport> {
        let out = TcpTransport {
            peers: Mutex::new(HashMap::new()),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
        };
        for (&id, &addr) in peers {
            out.add_peer(id, addr)?;
        }
        Ok(out)
    }

    fn add_peer(&self, id: u64, addr: SocketAddr) -> io::Result<()> {
        let (tx, rx) = sync_channel(QUEUED_FRAMES_MAX);
        let stop = self.stop.clone();
        let t = std::thread::Builder::new()
            .name(format!("tidemark-raft-send-{id}"))
            .spawn(move || send_loop(addr, rx, &stop))?;
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

    /// A connection of its own to the peer and a thread that writes the
    /// stream (cluster.md section 8.2), so that a snapshot never holds up
    /// the peer's Raft frames; the thread ends with the stream.
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
        let spawned = std::thread::Builder::new()
            .name(format!("tidemark-raft-snap-{to}"))
            .spawn(move || {
                let started = std::time::Instant::now();
                let sent = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                    .and_then(|s| {
                        s.set_write_timeout(Some(SNAPSHOT_WRITE_TIMEOUT))?;
                        Ok(s)
                    })
                    .map_err(|e| format!("connect: {e}"))
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

/// A peer's sender thread: connects when it has a frame and no connection,
/// writes, and forgets a connection that failed (the frame is lost).
fn send_loop(addr: SocketAddr, rx: Receiver<Vec<u8>>, stop: &AtomicBool) {
    let mut conn: Option<TcpStream> = None;
    while !stop.load(Ordering::Acquire) {
        let frame = match rx.recv_timeout(POLL) {
            Ok(f) => f,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if conn.is_none() {
            conn = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                .and_then(|s| {
                    s.set_nodelay(true)?;
                    s.set_write_timeout(Some(Duration::from_secs(1)))?;
                    Ok(s)
                })
                .ok();
        }
        if let Some(s) = conn.as_mut() {
            if s.write_all(&frame).is_err() {
                conn = None;
            }
        }
    }
}

/// The receiving side: a listener thread and a reader per connection.
pub struct TcpListenerHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
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

    /// Accepts frames to node `id` from the members `mailbox` admits
    /// (`Mailbox::admits`, which follows membership changes), delivered
    /// to `mailbox`; a frame over `frame_bytes_max` closes its connection.
    pub fn start(
        self,
        id: u64,
        mailbox: Mailbox,
        frame_bytes_max: usize,
    ) -> io::Result<TcpListenerHandle> {
        let listener = self.listener;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tidemark-raft-listen-{id}"))
            .spawn(move || accept_loop(&listener, id, &mailbox, frame_bytes_max, &s))?;
        Ok(TcpListenerHandle {
            stop,
            thread: Some(thread),
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

fn accept_loop(
    listener: &TcpListener,
    id: u64,
    mailbox: &Mailbox,
    frame_bytes_max: usize,
    stop: &Arc<AtomicBool>,
) {
    let mut readers: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((conn, _)) => {
                let (mailbox, stop) = (mailbox.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("tidemark-raft-read-{id}"))
                    .spawn(move || {
                        if let Err(e) = read_loop(conn, id, &mailbox, frame_bytes_max, &stop) {
                            log::debug!("raft connection to node {id} closed: {e}");
                        }
                    });
                if let Ok(t) = spawned {
                    readers.push(t);
                }
                readers.retain(|t| !t.is_finished());
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

fn read_loop(
    mut conn: TcpStream,
    id: u64,
    mailbox: &Mailbox,
    frame_bytes_max: usize,
    stop: &AtomicBool,
) -> Result<(), String> {
    let io = |e: io::Error| format!("read: {e}");
    conn.set_nonblocking(false).map_err(io)?;
    conn.set_read_timeout(Some(POLL)).map_err(io)?;
    let mut frame = Vec::new();
    loop {
        let mut head = [0u8; 4];
        if !read_full(&mut conn, &mut head, stop).map_err(io)? {
            return Ok(());
        }
        if head == crate::snapshot::PREAMBLE[..4] {
            // A snapshot stream (cluster.md section 8.2): its connection
            // carries nothing else.
            let mut rest = [0u8; 4];
            if !read_full(&mut conn, &mut rest, stop).map_err(io)?
                || rest != crate::snapshot::PREAMBLE[4..]
            {
                return Err("a connection that is neither frames nor a snapshot".into());
            }
            return mailbox
                .receive_snapshot(&mut StopRead {
                    conn: &mut conn,
                    stop,
                })
                .map_err(|e| e.to_string());
        }
        let len = frame_len(head, frame_bytes_max).map_err(|e| format!("{e:?}"))?;
        frame.clear();
        frame.extend_from_slice(&head);
        frame.resize(len, 0);
        if !read_full(&mut conn, &mut frame[4..], stop).map_err(io)? {
            return Ok(());
        }
        let msg = decode_frame(&frame).map_err(|e| format!("{e:?}"))?;
        if msg.to != id || !mailbox.admits(msg.from) {
            return Err(format!(
                "a frame from node {} to node {}: not a member, or not for this node",
                msg.from, msg.to
            ));
        }
        mailbox.deliver(msg);
    }
}

/// A connection read to the end, whatever its read timeout, until the
/// stop flag.
struct StopRead<'a> {
    conn: &'a mut TcpStream,
    stop: &'a AtomicBool,
}

impl Read for StopRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("the node stops"));
            }
            match self.conn.read(buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock
                            | io::ErrorKind::TimedOut
                            | io::ErrorKind::Interrupted
                    ) => {}
                other => return other,
            }
        }
    }
}

/// Fills `buf`; false at a clean end (EOF before its first byte, or the
/// stop flag).
fn read_full(conn: &mut TcpStream, buf: &mut [u8], stop: &AtomicBool) -> io::Result<bool> {
    let mut at = 0;
    while at < buf.len() {
        if stop.load(Ordering::Acquire) {
            return Ok(false);
        }
        match conn.read(&mut buf[at..]) {
            Ok(0) if at == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => at += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
