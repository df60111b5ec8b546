//! One client connection, sans IO: the frame decoder on the way in, a
//! bounded queue of outgoing bytes on the way out (response heads plus
//! record bytes borrowed from segment mappings, written with writev), the
//! handshake phase and the requests it has in flight. The event loop moves
//! bytes and derives its interest from `wants_read` / `wants_write`.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use tidemark_engine::Chunk;

use tidemark_protocol::{FrameDecoder, Opcode};

/// Where the connection is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Only HELLO is accepted.
    AwaitHello,
    /// HELLO done; the node has a token, so only AUTH is accepted.
    AwaitAuth,
    Ready,
}

/// A piece of output: bytes the node encoded, or stored records sent as
/// they lie in a segment.
pub enum OutChunk {
    Bytes(Vec<u8>),
    Records(Chunk),
}

impl OutChunk {
    fn bytes(&self) -> &[u8] {
        match self {
            OutChunk::Bytes(b) => b,
            OutChunk::Records(c) => c.bytes(),
        }
    }
}

/// Queued output, written front to back.
#[derive(Default)]
pub struct OutQueue {
    chunks: VecDeque<OutChunk>,
    /// Bytes of the front chunk already written.
    front_written: usize,
    /// Bytes queued and not yet written.
    len: usize,
}

/// iovecs per writev call.
const IOVECS_MAX: usize = 64;

impl OutQueue {
    pub fn push(&mut self, chunk: OutChunk) {
        let n = chunk.bytes().len();
        if n > 0 {
            self.len += n;
            self.chunks.push_back(chunk);
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes as much as `w` takes. Returns bytes written; stops at
    /// WouldBlock (not an error).
    pub fn write_to<W: Write>(&mut self, w: &mut W) -> io::Result<usize> {
        let mut total = 0;
        while !self.chunks.is_empty() {
            let mut slices: Vec<IoSlice<'_>> =
                Vec::with_capacity(IOVECS_MAX.min(self.chunks.len()));
            for (i, c) in self.chunks.iter().take(IOVECS_MAX).enumerate() {
                let b = c.bytes();
                slices.push(IoSlice::new(if i == 0 {
                    &b[self.front_written..]
                } else {
                    b
                }));
            }
            let n = match w.write_vectored(&slices) {
                Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(total),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            drop(slices);
            self.advance(n);
            total += n;
        }
        Ok(total)
    }

    fn advance(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            // Invariant: n <= bytes queued, so a front chunk exists.
            let front_len = self
                .chunks
                .front()
                .expect("invariant: written bytes were queued")
                .bytes()
                .len();
            let left = front_len - self.front_written;
            if n >= left {
                n -= left;
                self.chunks.pop_front();
                self.front_written = 0;
            } else {
                self.front_written += n;
                n = 0;
            }
        }
    }
}

pub struct Connection {
    pub decoder: FrameDecoder,
    pub out: OutQueue,
    pub phase: Phase,
    /// Requests accepted and not yet answered (durable sends, ops, long polls).
    pub in_flight: u32,
    /// Stop reading: write what is queued, then close (a fatal error, or
    /// the node shutting down).
    pub closing: bool,
    /// A fatal error frame was queued: nothing more is queued after it.
    pub fatal: bool,
    /// The peer closed its side (read returned 0).
    pub peer_closed: bool,
    /// Subscription entries (groups + users) this connection holds.
    pub subscriptions: usize,
    /// Parked SENDs waiting for their commit round.
    pub parked_sends: u32,
    /// Parked CREATE_GROUP, DELETE_GROUP, JOIN and LEAVE requests.
    pub parked_ops: u32,
    /// Since when the decoder has held part of a frame while the node was
    /// willing to read (None: no partial frame, or reading paused by the
    /// node's own back-pressure).
    pub partial_since: Option<std::time::Instant>,
    /// The request at the front of the decoder waits for the engine's
    /// maintenance worker (its group's files are read for the first time
    /// since open): the job's ticket. It stays in the input buffer, not in
    /// flight, and runs again once the ticket is settled; nothing behind it
    /// starts before (format-spec/protocol.md section 1.4).
    pub waiting_load: Option<u64>,
}

/// Which parked requests hold back the later requests of their connection
/// (format-spec/protocol.md section 1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// A long-poll PULL: its ACK was applied when it started and it changes
    /// nothing later, so it holds nothing back.
    None,
    /// A SEND: later SENDs may start (ids are assigned in request order
    /// whatever the outcome), anything else but PING waits.
    Send,
    /// A group or membership operation: everything but PING waits.
    Op,
}

impl Connection {
    pub fn new(frame_bytes_max: u32) -> Self {
        Connection {
            decoder: FrameDecoder::new(frame_bytes_max),
            out: OutQueue::default(),
            phase: Phase::AwaitHello,
            in_flight: 0,
            closing: false,
            fatal: false,
            peer_closed: false,
            subscriptions: 0,
            parked_sends: 0,
            parked_ops: 0,
            partial_since: None,
            waiting_load: None,
        }
    }

    /// Whether a request with this opcode byte may start now, given the
    /// requests of this connection parked before it: execution order is
    /// request order, so a request that could observe a parked request's
    /// effect waits until it is answered. PING observes nothing; a SEND
    /// behind SENDs only needs the order of id assignment, which is request
    /// order. An unknown opcode byte waits like any request (it is then
    /// answered BAD_FRAME in its turn).
    pub fn may_start(&self, opcode: u8) -> bool {
        match Opcode::from_request_byte(opcode) {
            Some(Opcode::Ping) => true,
            Some(Opcode::Send) => self.parked_ops == 0,
            _ => self.parked_ops == 0 && self.parked_sends == 0,
        }
    }

    /// Counts a request parked with this barrier.
    pub fn park(&mut self, barrier: Barrier) {
        self.in_flight += 1;
        match barrier {
            Barrier::None => {}
            Barrier::Send => self.parked_sends += 1,
            Barrier::Op => self.parked_ops += 1,
        }
    }

    /// Counts a parked request answered.
    pub fn unpark(&mut self, barrier: Barrier) {
        self.in_flight = self.in_flight.saturating_sub(1);
        match barrier {
            Barrier::None => {}
            Barrier::Send => self.parked_sends = self.parked_sends.saturating_sub(1),
            Barrier::Op => self.parked_ops = self.parked_ops.saturating_sub(1),
        }
    }

    /// Read more requests only while the output has room: a client that does
    /// not read its responses stops being read (bounded memory).
    pub fn wants_read(&self, output_bytes_max: usize) -> bool {
        !self.closing
            && !self.peer_closed
            && self.out.len() < output_bytes_max
            && self.decoder.wants_read()
    }

    pub fn wants_write(&self) -> bool {
        !self.out.is_empty()
    }

    /// True when nothing more will happen on this connection.
    pub fn finished(&self) -> bool {
        (self.closing || self.peer_closed) && self.out.is_empty() && self.in_flight == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `cap` bytes per call.
    struct Trickle {
        data: Vec<u8>,
        cap: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.cap == 0 {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let n = buf.len().min(self.cap);
            self.data.extend_from_slice(&buf[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn parked_requests_hold_back_what_could_observe_them() {
        let mut c = Connection::new(4096);
        let (ping, send, pull) = (
            Opcode::Ping.request_byte(),
            Opcode::Send.request_byte(),
            Opcode::Pull.request_byte(),
        );
        assert!(c.may_start(pull));
        c.park(Barrier::None); // a long poll holds nothing back
        assert!(c.may_start(pull) && c.may_start(send));
        c.park(Barrier::Send);
        assert!(c.may_start(send) && c.may_start(ping));
        assert!(!c.may_start(pull));
        assert!(!c.may_start(0x7E), "an unknown opcode waits its turn");
        c.park(Barrier::Op);
        assert!(!c.may_start(send) && !c.may_start(pull));
        assert!(c.may_start(ping));
        c.unpark(Barrier::Op);
        c.unpark(Barrier::Send);
        assert!(c.may_start(pull));
        assert_eq!(c.in_flight, 1);
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let mut q = OutQueue::default();
        q.push(OutChunk::Bytes(b"hello ".to_vec()));
        q.push(OutChunk::Bytes(Vec::new()));
        q.push(OutChunk::Bytes(b"world".to_vec()));
        assert_eq!(q.len(), 11);
        let mut w = Trickle {
            data: Vec::new(),
            cap: 4,
        };
        q.write_to(&mut w).unwrap();
        assert_eq!(w.data, b"hello world");
        assert!(q.is_empty());
        q.push(OutChunk::Bytes(b"x".to_vec()));
        let mut blocked = Trickle {
            data: Vec::new(),
            cap: 0,
        };
        assert_eq!(q.write_to(&mut blocked).unwrap(), 0);
        assert_eq!(q.len(), 1);
    }
}
