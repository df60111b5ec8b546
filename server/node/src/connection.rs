//! One client connection, sans IO: the protocol state machine of a
//! connection, after rustls' `Connection`. The event loop hands it the bytes
//! it reads (`read_from`), asks it for the next request ([`Connection::
//! handle_next`], which turns a decoded request into an [`Action`] for the
//! loop), queues what the loop answers (`queue`), and writes what it holds
//! (`write_to`, writev over response heads and record bytes borrowed from
//! segment mappings); it derives its interest from `wants_read` /
//! `wants_write`.
//!
//! What lives here and nowhere else:
//!
//! - the handshake gate (format-spec/protocol.md 1.7): HELLO, then AUTH
//!   when the node has a token, then everything but HELLO;
//! - the in-flight limit (1.5): a request that may stay in flight (SEND,
//!   PULL, CREATE_GROUP, DELETE_GROUP, JOIN, LEAVE: the requests whose
//!   handlers can park) is refused TOO_MANY_REQUESTS_IN_FLIGHT when
//!   `requests_in_flight_max` are; the count moves when a request parks and
//!   when the loop reports it answered (`parked_done`);
//! - the ordering barrier (1.4): which parked requests hold back later ones
//!   (`waits_for`: a write starts behind parked writes whose outcome it
//!   cannot observe early, since the engine applies writes in submission
//!   order, so pipelined operations share commit rounds);
//! - closing and fatal: a fatal ERROR is the last frame queued, nothing is
//!   read after it, and the connection ends once its output is written and
//!   nothing is in flight;
//! - the connection's subscriptions: its groups and users are the truth;
//!   the node's push index (`subscriptions.rs`) is derived from them and
//!   changed only together with them (SUBSCRIBE, UNSUBSCRIBE, RESYNC,
//!   close).
//!
//! Invariants: `in_flight` = parked requests answered later (its parked
//! SENDs and operations, and its long polls); nothing is queued after a
//! fatal ERROR; a request that waits (behind a parked one, or for its
//! group's load) stays in the decoder, unread beyond, and is not in flight.
//! Costs: a request costs its handler; nothing here walks other
//! connections.

use std::collections::{HashSet, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::time::Instant;

use tidemark_engine::{Chunk, Engine, Error as EngineError};

use crate::conn_id::ConnId;
use crate::handlers::{self, Action, Ctx, OpKind, OwnRequest, Parked, Route};
use crate::outgoing::{self, Outgoing};
use crate::receipts::Receipts;
use crate::slowlog::Summary;
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{
    decode_request, ErrorCode, FrameDecoder, Opcode, Request, Subscription, HELLO_VERSION,
    PROTOCOL_VERSION,
};

/// Where the connection is in its lifecycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Only HELLO is accepted.
    AwaitHello,
    /// HELLO done; the node has a token, so only AUTH is accepted.
    AwaitAuth,
    Ready,
}

/// A piece of output: bytes the node encoded, or stored records sent as
/// they lie in a segment.
enum OutChunk {
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
struct OutQueue {
    chunks: VecDeque<OutChunk>,
    /// Bytes of the front chunk already written.
    front_written: usize,
    /// Bytes queued and not yet written.
    len: usize,
}

/// iovecs per writev call.
const IOVECS_MAX: usize = 64;

impl OutQueue {
    fn push(&mut self, chunk: OutChunk) {
        let n = chunk.bytes().len();
        if n > 0 {
            self.len += n;
            self.chunks.push_back(chunk);
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes as much as `w` takes. Returns bytes written; stops at
    /// WouldBlock (not an error).
    fn write_to<W: Write>(&mut self, w: &mut W) -> io::Result<usize> {
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
    decoder: FrameDecoder,
    out: OutQueue,
    session: Session,
    /// Stop reading: write what is queued, then close (a fatal error, or
    /// the node shutting down).
    closing: bool,
    /// A fatal error frame was queued: nothing more is queued after it.
    fatal: bool,
    /// The peer closed its side (read returned 0), or the socket failed.
    peer_closed: bool,
    /// Since when the decoder has held part of a frame while the node was
    /// willing to read (None: no partial frame, or reading paused by the
    /// node's own back-pressure).
    partial_since: Option<Instant>,
    /// The request at the front of the decoder waits for the engine's
    /// maintenance worker (its group's files are read for the first time
    /// since open): the job's ticket. It stays in the input buffer, not in
    /// flight, and runs again once the ticket is settled; nothing behind it
    /// starts before (format-spec/protocol.md section 1.4).
    waiting_load: Option<u64>,
}

/// The part of a connection's state a request changes: kept apart from the
/// decoder, whose front frame the request borrows while it is handled.
struct Session {
    phase: Phase,
    /// Requests accepted and not yet answered (parked sends and operations,
    /// long polls).
    in_flight: u32,
    /// Parked requests waiting for their commit round, by [`Barrier`]
    /// (`Barrier::index`; long polls are not counted here).
    parked: [u32; Barrier::PARKED_KINDS],
    /// The groups and users this connection is subscribed to.
    sub_groups: HashSet<u64>,
    sub_users: HashSet<u64>,
    /// Its receipt subscriptions (4.22): (group, sender).
    sub_receipts: HashSet<(u64, u64)>,
    /// The protocol version HELLO chose (1 before): every frame after
    /// HELLO's carries it, and it says how records are shown
    /// (format-spec/protocol.md 7).
    version: u8,
}

/// What a parked request is, for the ordering barrier: which later
/// requests of its connection wait for it is [`waits_for`]'s table
/// (format-spec/protocol.md section 1.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Barrier {
    /// A long-poll PULL: its ACK was applied when it started and it changes
    /// nothing later, so it holds nothing back. Also an answer held for
    /// its Cursors round or read ticket.
    None,
    /// A SEND.
    Send,
    /// A RECALL or an EDIT.
    Change,
    CreateGroup,
    DeleteGroup,
    Join,
    Leave,
    SetRetention,
    ClearHistory,
}

impl Barrier {
    /// The kinds that are counted while parked (all but `None`).
    const PARKED_KINDS: usize = 8;
    const PARKED: [Barrier; Barrier::PARKED_KINDS] = [
        Barrier::Send,
        Barrier::Change,
        Barrier::CreateGroup,
        Barrier::DeleteGroup,
        Barrier::Join,
        Barrier::Leave,
        Barrier::SetRetention,
        Barrier::ClearHistory,
    ];

    /// What a parked request is on its connection while parked
    /// (format-spec/protocol.md 1.4).
    pub fn of(parked: &Parked) -> Barrier {
        match parked {
            Parked::Send { .. } => Barrier::Send,
            // Assigned its id like a SEND; its rules were checked when it
            // started, after every earlier SEND of the connection.
            Parked::Change { .. } => Barrier::Change,
            Parked::Op(_, kind) => match kind {
                OpKind::CreateGroup => Barrier::CreateGroup,
                OpKind::DeleteGroup => Barrier::DeleteGroup,
                OpKind::Join { .. } => Barrier::Join,
                OpKind::Leave => Barrier::Leave,
                OpKind::SetRetention => Barrier::SetRetention,
                OpKind::ClearHistory { .. } => Barrier::ClearHistory,
            },
            // Every later answer of the connection that shows cursors waits
            // for this round or a later one (`Connection`'s cursor hold),
            // so nothing needs to wait behind it.
            Parked::Cursors { .. } => Barrier::None,
        }
    }

    /// Its counter in `Session::parked`; `None` is not counted.
    fn index(self) -> Option<usize> {
        Barrier::PARKED.iter().position(|&b| b == self)
    }
}

/// The parked requests of its connection a request with this opcode byte
/// waits for (format-spec/protocol.md 1.4's table). The engine applies
/// writes in the order they were submitted, and decides on the commit
/// thread, when it applies them, what depends on an earlier write's
/// outcome (a join's membership limits, a leave's or a clear's membership,
/// a join of a member again); so a write starts at once behind parked
/// writes unless the engine checks, when it is submitted, something such a
/// write changes only when it is applied:
/// - SEND, RECALL, EDIT: the sender's membership (a members-only send
///   policy) behind JOIN and LEAVE;
/// - RECALL, EDIT: also their target, behind a SEND: the rules are checked
///   against the group's readable messages, and a parked SEND's message
///   becomes readable only when its round is applied (a change behind a
///   parked change starts at once: the one rule a change decides about
///   another, "recalled already", is documented to let two changes of one
///   message that share a round both be stored);
/// - CREATE_GROUP: that the id is free and `groups_max`, behind
///   DELETE_GROUP (a group leaves the registry when its deletion is
///   applied; a creation enters it when submitted, so creations and
///   everything behind them see it at once);
/// - JOIN: whether the user is a member already and its cursor (a member's
///   JOIN answers its cursor at once), behind LEAVE, CLEAR_HISTORY and a
///   SEND, RECALL or EDIT (its sender's cursor follows its record when
///   applied), and the head a JOIN at an explicit cursor is checked
///   against (the readable head, which a SEND's round moves);
/// - LEAVE, CLEAR_HISTORY: the user's membership, behind JOIN.
///
/// DELETE_GROUP and SET_RETENTION observe nothing a parked write changes
/// later (a deletion marks its group at once). PING observes nothing.
/// Every other request (reads, cursor moves, subscriptions, reports), and
/// an unknown opcode byte (answered BAD_FRAME in its turn), waits for
/// every parked request.
fn waits_for(opcode: u8) -> &'static [Barrier] {
    use Barrier::*;
    match Opcode::from_request_byte(opcode) {
        Some(Opcode::Ping | Opcode::DeleteGroup | Opcode::SetRetention) => &[],
        Some(Opcode::Send) => &[Join, Leave],
        Some(Opcode::Recall | Opcode::Edit) => &[Send, Join, Leave],
        Some(Opcode::CreateGroup) => &[DeleteGroup],
        Some(Opcode::Join) => &[Send, Change, Leave, ClearHistory],
        Some(Opcode::Leave | Opcode::ClearHistory) => &[Join],
        _ => &Barrier::PARKED,
    }
}

/// What [`Connection::handle_next`] did.
pub enum Next {
    /// Nothing to handle now: no whole frame, or the connection is closing,
    /// its output is full, or its front request waits (behind a parked one,
    /// or for a load).
    Idle,
    /// The front request was not run: its group's files must be read first,
    /// by the engine's maintenance worker (the ticket). It stays in the
    /// input buffer and runs again after `load_settled`.
    WaitsForLoad(u64),
    /// A request was taken from the input and handled. `op` is `None` for a
    /// frame that did not decode (answered by a fatal ERROR).
    Handled {
        request_id: u64,
        op: Option<Opcode>,
        /// What it asked, for the slow log.
        args: Summary,
        action: Action,
    },
}

/// Why a request produced no action: it must wait for a load, or it is a
/// fatal error (the ERROR to queue last).
pub enum Stop {
    NotReady(u64),
    Fatal(Outgoing),
}

impl Connection {
    pub fn new(frame_bytes_max: u32) -> Self {
        Connection {
            decoder: FrameDecoder::new(frame_bytes_max),
            out: OutQueue::default(),
            session: Session {
                phase: Phase::AwaitHello,
                in_flight: 0,
                parked: [0; Barrier::PARKED_KINDS],
                sub_groups: HashSet::new(),
                sub_users: HashSet::new(),
                sub_receipts: HashSet::new(),
                version: HELLO_VERSION,
            },
            closing: false,
            fatal: false,
            peer_closed: false,
            partial_since: None,
            waiting_load: None,
        }
    }

    /// Reads what `r` has into the decoder. `Ok(0)` and errors other than
    /// WouldBlock and Interrupted mean the peer is gone: nothing more is
    /// read. Call only while `wants_read`.
    pub fn read_from<R: Read>(&mut self, r: &mut R) -> io::Result<usize> {
        let result = self.decoder.read_from(r);
        match &result {
            Ok(0) => self.peer_closed = true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) => {}
            Err(_) => self.peer_closed = true,
        }
        result
    }

    /// Writes what `w` takes of the queued output. An error means the peer
    /// is gone: nothing queued can be delivered, and it is dropped. (Or
    /// EFAULT: record bytes queued from a segment file cut under the node
    /// since; the frame is broken, so the connection ends the same way. See
    /// engine segment.rs.)
    pub fn write_to<W: Write>(&mut self, w: &mut W) -> io::Result<usize> {
        let result = self.out.write_to(w);
        if result.is_err() {
            self.peer_closed = true;
            self.out = OutQueue::default();
        }
        result
    }

    /// The protocol version HELLO chose (1 before it).
    pub fn version(&self) -> u8 {
        self.session.version
    }

    /// Queues a response or a server-initiated frame, in the connection's
    /// protocol version. Returns false (and drops it) after a fatal error:
    /// nothing follows the fatal ERROR.
    pub fn queue(&mut self, out: Outgoing) -> bool {
        if self.fatal {
            return false;
        }
        let mut head = out.head;
        if self.session.version != HELLO_VERSION {
            tidemark_protocol::set_version(&mut head, self.session.version);
        }
        self.out.push(OutChunk::Bytes(head));
        // Most responses (ACK's, SEND's...) carry no records.
        if !out.chunks.is_empty() {
            for c in out.chunks {
                self.out.push(OutChunk::Records(c));
            }
        }
        true
    }

    /// Queues a fatal ERROR (unless one is queued already) and closes: the
    /// input is not read any more.
    pub fn fail(&mut self, out: Outgoing) {
        self.queue(out);
        self.closing = true;
        self.fatal = true;
        self.partial_since = None;
    }

    /// Stops reading (the node shuts down): what is queued and in flight is
    /// still answered.
    pub fn begin_close(&mut self) {
        self.closing = true;
    }

    /// Drops the queued output (the node sheds this connection).
    pub fn drop_output(&mut self) {
        self.out = OutQueue::default();
    }

    pub fn is_closing(&self) -> bool {
        self.closing
    }

    /// Bytes of output queued and not yet written.
    pub fn output_bytes(&self) -> usize {
        self.out.len()
    }

    /// The input memory to count against the node's budget: the decoder's
    /// buffer or the whole frame in progress once its length prefix is
    /// here; a closing connection reads nothing more, so only its buffer.
    pub fn input_bytes(&self) -> usize {
        if self.closing {
            self.decoder.allocated()
        } else {
            self.decoder.memory_bytes()
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

    /// True when nothing more will happen on this connection: its peer is
    /// gone and nothing is in flight, or it is closing and its output is
    /// written too.
    pub fn finished(&self) -> bool {
        let idle = self.session.in_flight == 0;
        (self.peer_closed && idle) || (self.closing && self.out.is_empty() && idle)
    }

    /// Runs the clock of a partial frame after a turn
    /// (format-spec/protocol.md 1.6): since when the decoder holds part of
    /// a frame while the node is willing to read, or `None`. The clock runs
    /// only while the node reads (a frame held back by the node's own
    /// back-pressure is not the client's delay) and restarts with each
    /// whole frame (`handled_frames`).
    pub fn frame_clock(
        &mut self,
        output_bytes_max: usize,
        handled_frames: bool,
    ) -> Option<Instant> {
        let partial = self.wants_read(output_bytes_max) && self.decoder.holds_partial_frame();
        if !partial {
            self.partial_since = None;
            return None;
        }
        if handled_frames || self.partial_since.is_none() {
            self.partial_since = Some(Instant::now());
        }
        self.partial_since
    }

    /// Since when the current partial frame is awaited (see `frame_clock`).
    pub fn partial_frame_since(&self) -> Option<Instant> {
        self.partial_since
    }

    /// The load the front request waited for is settled: it runs in the
    /// connection's next turn.
    pub fn load_settled(&mut self) {
        self.waiting_load = None;
    }

    /// A parked request or long poll with this barrier was answered.
    pub fn parked_done(&mut self, barrier: Barrier) {
        self.session.unpark(barrier);
    }

    /// Whether the connection holds any subscription (gets pushes or
    /// receipts).
    pub fn is_subscribed(&self) -> bool {
        !self.session.sub_groups.is_empty()
            || !self.session.sub_users.is_empty()
            || !self.session.sub_receipts.is_empty()
    }

    /// Drops every subscription of the connection, from its list and from
    /// the node's index (UNSUBSCRIBE, RESYNC, close).
    pub fn unsubscribe_all(
        &mut self,
        engine: &Engine,
        subs: &mut Subscriptions<ConnId>,
        receipts: &mut Receipts<ConnId>,
        id: ConnId,
    ) {
        self.session.unsubscribe_all(engine, subs, receipts, id);
    }

    /// Handles the request at the front of the input if one may start now
    /// (the connection is not closing, its output has room, and nothing
    /// parked before it could be observed by it, format-spec/protocol.md
    /// 1.4): decodes it, passes it through the shutdown check, the
    /// handshake gate and the in-flight limit, runs its handler, and says
    /// what the loop must do with it. A frame that does not decode is
    /// answered by a fatal ERROR queued here.
    pub fn handle_next(&mut self, ctx: &mut Ctx<'_>) -> Next {
        if self.closing
            || self.out.len() >= ctx.limits.output_bytes_max
            || self.waiting_load.is_some()
        {
            return Next::Idle;
        }
        if let Some(opcode) = self.decoder.front_opcode() {
            if !self.session.may_start(opcode) {
                return Next::Idle;
            }
        }
        let frame_bytes_max = ctx.limits.frame_bytes_max;
        // The frame borrows the decoder; it is handled into owned output
        // before the rest of the connection is touched. It stays at the
        // front until it is taken below (a request that must wait for the
        // engine's worker stays there).
        let mut args = Summary::default();
        let (request_id, op, result) = match self.decoder.front_frame() {
            Ok(None) => return Next::Idle,
            Err(fe) => {
                let out = outgoing::error(
                    0,
                    fe.error_code(),
                    Some(frame_bytes_max as u64),
                    &fe.to_string(),
                );
                (0, None, Err(Stop::Fatal(out)))
            }
            // A frame of another version than the connection's (1 until
            // HELLO chose one) is fatal (format-spec/protocol.md 7).
            Ok(Some(ref frame)) if frame.header.version != self.session.version => {
                let id = frame.header.request_id;
                let out = outgoing::error(
                    id,
                    ErrorCode::UnsupportedVersion,
                    Some(u64::from(PROTOCOL_VERSION)),
                    &format!(
                        "a frame of version {} on a connection of version {}",
                        frame.header.version, self.session.version
                    ),
                );
                (id, None, Err(Stop::Fatal(out)))
            }
            Ok(Some(ref frame)) => {
                let id = frame.header.request_id;
                // Matched in place, by reference: the decoded request is
                // read where it was decoded, not moved (nor is the frame).
                match decode_request(frame) {
                    Err(ref de) => {
                        let detail =
                            (de.error_code() == ErrorCode::UnsupportedVersion).then_some(1);
                        let out = outgoing::error(id, de.error_code(), detail, &de.to_string());
                        (id, None, Err(Stop::Fatal(out)))
                    }
                    Ok(ref req) => {
                        args = Summary::of_request(req);
                        (id, Some(req.opcode()), self.session.handle(ctx, id, req))
                    }
                }
            }
        };
        let action = match result {
            Ok(action) => action,
            Err(Stop::NotReady(ticket)) => {
                // Not run: it waits in the input buffer for the worker, and
                // so does everything behind it (format-spec/protocol.md 1.4).
                self.waiting_load = Some(ticket);
                return Next::WaitsForLoad(ticket);
            }
            Err(Stop::Fatal(out)) => {
                // Invariant: a fatal answer is an ERROR frame.
                let code = out.error.unwrap_or(ErrorCode::BadFrame);
                self.fail(out);
                Action::Closed(code)
            }
        };
        self.decoder.consume_front();
        Next::Handled {
            request_id,
            op,
            args,
            action,
        }
    }

    /// Handles a decoded request as `handle_next` does, for tests of the
    /// handlers.
    #[cfg(test)]
    pub fn handle_request(
        &mut self,
        ctx: &mut Ctx<'_>,
        request_id: u64,
        req: Request<'_>,
    ) -> Result<Action, Stop> {
        self.session.handle(ctx, request_id, &req)
    }

    /// A connection past its handshake, for tests of the handlers.
    #[cfg(test)]
    pub fn ready(frame_bytes_max: u32) -> Self {
        let mut c = Connection::new(frame_bytes_max);
        c.session.phase = Phase::Ready;
        c
    }
}

impl Session {
    /// Whether a request with this opcode byte may start now, given the
    /// requests of this connection parked before it: execution order is
    /// request order, so a request that could observe a parked request's
    /// outcome early waits until that request is answered ([`waits_for`]).
    /// A request that waits holds back everything behind it, so a later
    /// request never overtakes an earlier one that has not started.
    fn may_start(&self, opcode: u8) -> bool {
        waits_for(opcode)
            .iter()
            .all(|b| b.index().is_none_or(|i| self.parked[i] == 0))
    }

    /// Counts a request parked with this barrier.
    fn park(&mut self, barrier: Barrier) {
        self.in_flight += 1;
        if let Some(i) = barrier.index() {
            self.parked[i] += 1;
        }
    }

    /// Counts a parked request answered.
    fn unpark(&mut self, barrier: Barrier) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Some(i) = barrier.index() {
            self.parked[i] = self.parked[i].saturating_sub(1);
        }
    }

    /// One decoded request: the shutdown check, the handshake gate
    /// (format-spec/protocol.md 1.7), then its handler, which
    /// `handlers::dispatch` picks (or hands back when the request changes
    /// this connection's own state); the requests that may stay in flight
    /// go through the in-flight limit (1.5) first and are counted when
    /// they park.
    fn handle(&mut self, ctx: &mut Ctx<'_>, id: u64, req: &Request<'_>) -> Result<Action, Stop> {
        ctx.version = self.version;
        if ctx.shutting_down {
            return Ok(answer(outgoing::error(
                id,
                ErrorCode::ShuttingDown,
                None,
                "node is shutting down",
            )));
        }
        // The handshake gate. Nothing parks before READY, so the in-flight
        // limit below never refuses a request the gate would.
        let refused = match (req, self.phase) {
            (Request::Hello { .. }, Phase::AwaitHello) => None,
            (Request::Hello { .. }, _) => {
                let out = outgoing::error(id, ErrorCode::BadFrame, None, "a second HELLO");
                return Err(Stop::Fatal(out));
            }
            (Request::Auth { .. }, Phase::AwaitAuth | Phase::Ready) => None,
            (_, Phase::AwaitHello) => Some("send HELLO first"),
            (_, Phase::AwaitAuth) => Some("send AUTH first"),
            (_, Phase::Ready) => None,
        };
        if let Some(message) = refused {
            let out = outgoing::error(id, ErrorCode::Unauthenticated, None, message);
            return Ok(answer(out));
        }
        // The shard gate of a cluster node (4.33), before the leader gate: a
        // group of another set is refused on every member of this one, so
        // a client goes straight to the right set (a follower knows the
        // map as well as its leader does). Nothing of the request is done.
        if let Some(wrong) = ctx.shards.and_then(|m| m.foreign(req).map(|w| (m, w))) {
            let (map, wrong) = wrong;
            return Ok(answer(handlers::wrong_set(id, map, &wrong)));
        }
        // The leader gate of a replica set member (4.31): only the leader
        // serves data requests, reads included (a follower may be behind:
        // a client moving between nodes must not go back in time); the
        // handshake, the node's own reports and UNSUBSCRIBE (the
        // connection's own state) are served by every node.
        if let Some(gate) = ctx.leadership {
            if !req.opcode().served_by_every_member() {
                if let Some(refusal) = gate.refusal() {
                    return Ok(answer(handlers::not_leader(id, &refusal)));
                }
            }
        }
        // Whether the request moves a cursor (ACK, BATCH_ACK, a PULL's
        // `ack_up_to`): on a replica set its answer waits for a Cursors
        // round (`hold_for_cursors`).
        let moves_cursor = matches!(req, Request::Ack { .. } | Request::BatchAck { .. })
            || matches!(req, Request::Pull { ack_up_to, .. } if *ack_up_to > 0);
        // Refused at once, not run, while `requests_in_flight_max` are in
        // flight: every request that may stay in flight (even a PULL that
        // would not wait), and only those (format-spec/protocol.md 1.5).
        let max = ctx.limits.requests_in_flight_max;
        if req.opcode().in_flight().is_limited() && self.in_flight >= max {
            return Ok(answer(outgoing::error(
                id,
                ErrorCode::TooManyRequestsInFlight,
                Some(u64::from(max)),
                "too many requests in flight",
            )));
        }
        // One match of the route, so that an action is moved once, into
        // the answer.
        match handlers::dispatch(ctx, id, req) {
            Route::Connection(own) => self.handle_own(ctx, id, own),
            Route::Node(action) => Ok(action),
            Route::Engine(Ok(action)) => {
                self.count_in_flight(&action);
                if ctx.leadership.is_some() {
                    let action = self.hold_for_cursors(ctx, id, action, moves_cursor);
                    Ok(self.confirm_read(ctx, action))
                } else {
                    Ok(action)
                }
            }
            Route::Engine(Err(e)) => engine_outcome(id, &e),
        }
    }

    /// A request that changes the connection's own state: HELLO and AUTH
    /// move it through the handshake, SUBSCRIBE, SUBSCRIBE_RECEIPTS and
    /// UNSUBSCRIBE change its subscriptions and the node's indexes with
    /// them.
    fn handle_own(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        own: OwnRequest<'_>,
    ) -> Result<Action, Stop> {
        match own {
            OwnRequest::Hello {
                min_version,
                max_version,
            } => {
                let (out, version) =
                    handlers::hello(ctx, id, min_version, max_version).map_err(Stop::Fatal)?;
                // Every later frame, both ways, carries it (HELLO's
                // response itself carries 1, `queue`).
                self.version = version;
                self.phase = if ctx.token.is_some() {
                    Phase::AwaitAuth
                } else {
                    Phase::Ready
                };
                Ok(answer(out))
            }
            OwnRequest::Auth { token } => {
                let out = handlers::auth(ctx, id, token).map_err(Stop::Fatal)?;
                self.phase = Phase::Ready;
                Ok(answer(out))
            }
            OwnRequest::Subscribe(sub) => self.subscribe(ctx, id, sub),
            OwnRequest::SubscribeReceipts { sender, groups } => {
                self.subscribe_receipts(ctx, id, sender, groups)
            }
            OwnRequest::Unsubscribe => {
                self.unsubscribe_all(ctx.engine, ctx.subs, ctx.receipts, ctx.conn);
                Ok(answer(handlers::unsubscribed(id)))
            }
        }
    }

    /// On a replica set member (format-spec/cluster.md section 5): a request
    /// that moved a cursor asks for a Cursors round now, and an answer that
    /// may show a cursor not yet in a committed Cursors round is held
    /// ([`Parked::Cursors`]) until that round is committed, so that no
    /// failover takes back a cursor a client was shown. Every cursor moved
    /// in memory asked for a round when it moved, so the newest round asked
    /// for and not yet completed covers all of them: an answer parks only
    /// while one is in flight, and parks on it alone. Rounds asked for
    /// while one is being written share the next: one Cursors frame
    /// carries every cursor moved meanwhile. Counted in flight (but never
    /// refused by the in-flight limit: a single node answers these at
    /// once). A long poll is held the same way when it is answered
    /// (`EventLoop::answer_poll`).
    fn hold_for_cursors(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        action: Action,
        moves_cursor: bool,
    ) -> Action {
        let mut own = None;
        if moves_cursor {
            match ctx.engine.cursor_round() {
                Ok(round) => own = Some(round),
                // Writes stopped: the cursor moved in memory can not be
                // made durable; the answer says so instead of the cursor.
                Err(e) => {
                    return match action {
                        Action::Answer(_) => answer(outgoing::engine_error(id, &e)),
                        other => other,
                    }
                }
            }
        }
        match action {
            // Its own round even if it already failed (then the answer is
            // the failure), else the newest in flight.
            Action::Answer(out) => match own.max(ctx.engine.cursor_round_unsettled()) {
                Some(round) => {
                    let parked = Parked::Cursors { round, out };
                    self.park(Barrier::of(&parked));
                    Action::Park(parked)
                }
                None => Action::Answer(out),
            },
            other => other,
        }
    }

    /// On a replica set member (format-spec/cluster.md section 5.2): an
    /// answer computed from the engine is sent only once the leader's read
    /// ticket, taken now, is confirmed (a deposed leader that does not know
    /// it yet must not answer reads a new leader may have made stale).
    /// Writes are confirmed by their commit and are not held.
    fn confirm_read(&mut self, ctx: &mut Ctx<'_>, action: Action) -> Action {
        let Some(gate) = ctx.leadership else {
            return action;
        };
        let work = match action {
            Action::Answer(out) => {
                self.park(Barrier::None);
                Parked::Cursors { round: 0, out }
            }
            // Counted in flight already.
            Action::Park(work @ Parked::Cursors { .. }) => work,
            other => return other,
        };
        Action::Confirm {
            ticket: gate.read_ticket(),
            work,
        }
    }

    /// Counts a request in flight when it parked or waits
    /// (format-spec/protocol.md 1.5; the limit was checked before,
    /// `Opcode::in_flight`): only the requests the limit applies to do.
    fn count_in_flight(&mut self, action: &Action) {
        match action {
            Action::Park(parked) => self.park(Barrier::of(parked)),
            Action::Wait(_) => self.park(Barrier::None),
            // Counted where it is made (`confirm_read`).
            Action::Confirm { .. } => {}
            Action::Answer(_)
            | Action::Report(_)
            | Action::Backup
            | Action::Closed(_)
            | Action::ClusterChange(_) => {}
        }
    }

    /// SUBSCRIBE: checked by its handler, then added to this connection's
    /// list and the node's index.
    fn subscribe(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        sub: &Subscription,
    ) -> Result<Action, Stop> {
        let checked = match handlers::subscribe(ctx, id, self.held(), sub) {
            Ok(checked) => checked,
            Err(e) => return engine_outcome(id, &e),
        };
        match checked {
            Err(refusal) => Ok(answer(refusal)),
            Ok(out) => {
                match *sub {
                    Subscription::User(user) => {
                        self.sub_users.insert(user);
                        ctx.subs.add_user(ctx.engine, ctx.conn, user);
                    }
                    Subscription::Groups(ref groups) => {
                        for &g in groups {
                            self.sub_groups.insert(g);
                            ctx.subs.add_group(ctx.conn, g);
                        }
                    }
                }
                Ok(answer(out))
            }
        }
    }

    /// Subscriptions held: groups, users and receipt subscriptions, which
    /// `subscriptions_max` bounds together.
    fn held(&self) -> usize {
        self.sub_groups.len() + self.sub_users.len() + self.sub_receipts.len()
    }

    /// SUBSCRIBE_RECEIPTS: checked by its handler, then added to this
    /// connection's list and the node's receipt index.
    fn subscribe_receipts(
        &mut self,
        ctx: &mut Ctx<'_>,
        id: u64,
        sender: u64,
        groups: &[u64],
    ) -> Result<Action, Stop> {
        let checked = match handlers::subscribe_receipts(ctx, id, self.held(), groups) {
            Ok(checked) => checked,
            Err(e) => return engine_outcome(id, &e),
        };
        match checked {
            Err(refusal) => Ok(answer(refusal)),
            Ok(out) => {
                for &g in groups {
                    if self.sub_receipts.insert((g, sender)) {
                        ctx.receipts.add(ctx.conn, sender, g);
                    }
                }
                Ok(answer(out))
            }
        }
    }

    fn unsubscribe_all(
        &mut self,
        engine: &Engine,
        subs: &mut Subscriptions<ConnId>,
        receipts: &mut Receipts<ConnId>,
        id: ConnId,
    ) {
        let groups = std::mem::take(&mut self.sub_groups);
        let users = std::mem::take(&mut self.sub_users);
        subs.remove(engine, id, groups, users);
        receipts.remove(id, std::mem::take(&mut self.sub_receipts));
    }
}

fn answer(out: Outgoing) -> Action {
    Action::Answer(out)
}

/// What an engine error makes of a request: `NotReady` leaves it in the
/// input buffer until the worker's ticket is done (it runs again then);
/// any other is its answer.
fn engine_outcome(id: u64, e: &EngineError) -> Result<Action, Stop> {
    match *e {
        EngineError::NotReady { ticket, .. } => Err(Stop::NotReady(ticket)),
        _ => Ok(answer(outgoing::engine_error(id, e))),
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
        let mut c = Connection::new(4096).session;
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
        c.park(Barrier::Join);
        assert!(!c.may_start(send) && !c.may_start(pull));
        assert!(c.may_start(ping));
        c.unpark(Barrier::Join);
        c.unpark(Barrier::Send);
        assert!(c.may_start(pull));
        assert_eq!(c.in_flight, 1);
    }

    /// The barrier table (format-spec/protocol.md 1.4), one parked request
    /// at a time: which later requests start at once behind it.
    #[test]
    fn writes_start_behind_parked_writes_they_cannot_observe_early() {
        use Opcode::*;
        let writes = [
            Send,
            Recall,
            Edit,
            CreateGroup,
            DeleteGroup,
            Join,
            Leave,
            SetRetention,
            ClearHistory,
        ];
        let reads = [
            Pull, Ack, BatchAck, Unread, Sync, History, Members, GroupInfo,
        ];
        // (parked, the later writes that wait for it)
        let table: [(Barrier, &[Opcode]); 8] = [
            (Barrier::Send, &[Join, Recall, Edit]),
            (Barrier::Change, &[Join]),
            (Barrier::CreateGroup, &[]),
            (Barrier::DeleteGroup, &[CreateGroup]),
            (Barrier::Join, &[Send, Recall, Edit, Leave, ClearHistory]),
            (Barrier::Leave, &[Send, Recall, Edit, Join]),
            (Barrier::SetRetention, &[]),
            (Barrier::ClearHistory, &[Join]),
        ];
        for (parked, waiting) in table {
            let mut c = Connection::new(4096).session;
            c.park(parked);
            for w in writes {
                assert_eq!(
                    c.may_start(w.request_byte()),
                    !waiting.contains(&w),
                    "{w:?} behind a parked {parked:?}"
                );
            }
            for r in reads {
                assert!(!c.may_start(r.request_byte()), "{r:?} behind {parked:?}");
            }
            assert!(c.may_start(Ping.request_byte()));
            c.unpark(parked);
            assert!(reads.iter().all(|r| c.may_start(r.request_byte())));
        }
    }

    /// Counts are per kind: a request waits while any parked request it
    /// depends on is, however many others were answered.
    #[test]
    fn a_wait_lasts_until_the_last_parked_request_it_depends_on_is_answered() {
        let mut c = Connection::new(4096).session;
        let (join, leave) = (Opcode::Join.request_byte(), Opcode::Leave.request_byte());
        c.park(Barrier::Join);
        c.park(Barrier::Join);
        c.park(Barrier::CreateGroup);
        assert!(c.may_start(join), "joins share rounds behind joins");
        assert!(!c.may_start(leave));
        c.unpark(Barrier::Join);
        c.unpark(Barrier::CreateGroup);
        assert!(!c.may_start(leave), "one join is still parked");
        c.unpark(Barrier::Join);
        assert!(c.may_start(leave));
        assert_eq!(c.in_flight, 0);
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

/// The connection as a state machine, fed frames as a client sends them:
/// the handshake gate, the in-flight limit, closing and fatal.
#[cfg(test)]
mod state_tests {
    use super::*;
    use crate::config::Limits;
    use tidemark_engine::{Config, JoinStart as EngineJoinStart};
    use tidemark_protocol::{decode_response, encode_request, Frame, Response};

    struct Node {
        _dir: tempfile::TempDir,
        engine: Engine,
        limits: Limits,
        subs: Subscriptions<ConnId>,
        receipts: Receipts<ConnId>,
        shutting_down: bool,
    }

    const TOKEN: &[u8] = b"s3cret";

    impl Node {
        fn new(limits: Limits) -> Node {
            let dir = tempfile::tempdir().unwrap();
            let engine = Engine::open(Config::new(dir.path())).unwrap();
            engine.create_group(1).unwrap();
            engine.join(1, 5, EngineJoinStart::Head).unwrap();
            Node {
                _dir: dir,
                engine,
                limits,
                subs: Subscriptions::default(),
                receipts: Receipts::new(std::time::Duration::ZERO, usize::MAX, 1 << 20),
                shutting_down: false,
            }
        }

        /// What this node hands a handler: its token, connection 0 of
        /// generation 1.
        fn ctx(&mut self) -> Ctx<'_> {
            Ctx {
                token: Some(TOKEN),
                shutting_down: self.shutting_down,
                conn: ConnId {
                    index: 0,
                    generation: 1,
                },
                ..Ctx::for_tests(
                    &self.engine,
                    &self.limits,
                    &mut self.subs,
                    &mut self.receipts,
                )
            }
        }

        /// Sends `req` on `conn` and lets it handle its next request.
        fn request(&mut self, conn: &mut Connection, id: u64, req: Request<'_>) -> Next {
            let mut frame = Vec::new();
            encode_request(id, &req, &mut frame).unwrap();
            assert_eq!(conn.decoder.push(&frame), frame.len());
            conn.handle_next(&mut self.ctx())
        }

        /// [`Node::request`] as a frame of protocol `version`.
        fn request_in(
            &mut self,
            conn: &mut Connection,
            version: u8,
            id: u64,
            req: Request<'_>,
        ) -> Next {
            let mut frame = Vec::new();
            tidemark_protocol::encode_request_in(version, id, &req, &mut frame).unwrap();
            assert_eq!(conn.decoder.push(&frame), frame.len());
            conn.handle_next(&mut self.ctx())
        }

        /// A connection through HELLO and AUTH.
        fn authenticated(&mut self) -> Connection {
            let mut c = Connection::new(self.limits.frame_bytes_max);
            assert_eq!(self.answered(&mut c, hello()), None);
            assert_eq!(self.answered(&mut c, Request::Auth { token: TOKEN }), None);
            c
        }

        /// The error code of the response `req` got at once, or None for
        /// another response.
        fn answered(&mut self, conn: &mut Connection, req: Request<'_>) -> Option<ErrorCode> {
            match self.request(conn, 7, req) {
                Next::Handled {
                    request_id: 7,
                    action: Action::Answer(out),
                    ..
                } => {
                    let frame = Frame::parse(&out.head).unwrap();
                    match decode_response(&frame).unwrap() {
                        Response::Error(e) => {
                            assert_eq!(out.error, Some(e.code), "an ERROR frame says so");
                            Some(e.code)
                        }
                        _ => None,
                    }
                }
                _ => panic!("not answered at once"),
            }
        }
    }

    fn hello() -> Request<'static> {
        Request::Hello {
            min_version: 1,
            max_version: 1,
            client_name: "t",
        }
    }

    fn send(client_msg_id: u64) -> Request<'static> {
        Request::Send {
            group: 1,
            sender: 9,
            client_msg_id,
            payload: b"m",
        }
    }

    fn long_poll() -> Request<'static> {
        Request::Pull {
            group: 1,
            user: 5,
            ack_up_to: 0,
            max_count: 10,
            max_bytes: 4096,
            wait_ms: 60_000,
        }
    }

    /// format-spec/protocol.md 1.7: before HELLO and before AUTH, every
    /// other request is refused UNAUTHENTICATED and runs nothing; the
    /// connection stays open.
    #[test]
    fn the_handshake_gate_runs_nothing_before_hello_and_auth() {
        let mut node = Node::new(Limits::default());
        let mut c = Connection::new(node.limits.frame_bytes_max);
        let unauth = Some(ErrorCode::Unauthenticated);
        assert_eq!(node.answered(&mut c, send(1)), unauth);
        assert_eq!(node.answered(&mut c, Request::Unread { user: 5 }), unauth);
        assert_eq!(node.answered(&mut c, Request::Ping), unauth);
        assert_eq!(node.answered(&mut c, hello()), None);
        assert_eq!(node.answered(&mut c, send(2)), unauth);
        assert_eq!(node.answered(&mut c, long_poll()), unauth);
        assert!(!c.is_closing());
        assert_eq!(node.engine.stats().appends, 0, "no SEND ran");
        assert_eq!(c.session.in_flight, 0);
        let auth = Request::Auth { token: TOKEN };
        assert_eq!(node.answered(&mut c, auth), None);
        assert!(matches!(
            node.request(&mut c, 8, send(3)),
            Next::Handled {
                action: Action::Park(_),
                ..
            }
        ));
        assert_eq!(c.session.in_flight, 1);
    }

    /// A wrong token and a second HELLO are fatal: the ERROR is the last
    /// frame, nothing after it is read or queued, and the connection ends
    /// once its output is written and nothing is in flight.
    #[test]
    fn a_fatal_error_is_the_last_frame_and_ends_the_connection() {
        let mut node = Node::new(Limits::default());
        let mut c = Connection::new(node.limits.frame_bytes_max);
        assert_eq!(node.answered(&mut c, hello()), None);
        assert!(matches!(
            node.request(&mut c, 2, Request::Auth { token: b"guess" }),
            Next::Handled {
                action: Action::Closed(ErrorCode::Unauthenticated),
                ..
            }
        ));
        assert!(c.is_closing() && c.wants_write());
        assert!(!c.wants_read(usize::MAX));
        let queued = c.output_bytes();
        assert!(
            !c.queue(handlers::handshake::ping(3)),
            "nothing follows a fatal ERROR"
        );
        assert_eq!(c.output_bytes(), queued);
        assert!(matches!(node.request(&mut c, 4, Request::Ping), Next::Idle));
        assert!(!c.finished(), "its output is not written yet");
        let mut written = Vec::new();
        c.write_to(&mut written).unwrap();
        let frame = Frame::parse(&written).unwrap();
        assert!(matches!(decode_response(&frame).unwrap(),
            Response::Error(e) if e.code == ErrorCode::Unauthenticated));
        assert!(c.finished());

        // A second HELLO, with a long poll in flight: the connection ends
        // when that is answered too.
        let mut c = node.authenticated();
        assert!(matches!(
            node.request(&mut c, 3, long_poll()),
            Next::Handled {
                action: Action::Wait(_),
                ..
            }
        ));
        assert!(matches!(
            node.request(&mut c, 4, hello()),
            Next::Handled {
                action: Action::Closed(ErrorCode::BadFrame),
                ..
            }
        ));
        c.write_to(&mut Vec::new()).unwrap();
        assert!(!c.finished(), "a long poll is in flight");
        c.parked_done(Barrier::None);
        assert!(c.finished());
    }

    /// format-spec/protocol.md 1.5: with requests_in_flight_max in flight,
    /// the requests that may park are refused at once and run nothing (a
    /// PULL too), the others are answered; one answered makes room.
    #[test]
    fn the_in_flight_limit_refuses_only_requests_that_may_park() {
        let limits = Limits {
            requests_in_flight_max: 2,
            ..Limits::default()
        };
        let mut node = Node::new(limits);
        let mut c = node.authenticated();
        for id in [10, 11] {
            assert!(matches!(
                node.request(&mut c, id, long_poll()),
                Next::Handled {
                    action: Action::Wait(_),
                    ..
                }
            ));
        }
        let full = Some(ErrorCode::TooManyRequestsInFlight);
        assert_eq!(node.answered(&mut c, send(1)), full);
        assert_eq!(node.answered(&mut c, long_poll()), full);
        assert_eq!(
            node.answered(&mut c, Request::CreateGroup { group: 2 }),
            full
        );
        assert_eq!(node.answered(&mut c, Request::Unread { user: 5 }), None);
        assert_eq!(node.answered(&mut c, Request::Ping), None);
        assert_eq!(node.engine.stats().appends, 0, "a refused SEND ran");
        assert_eq!(c.session.in_flight, 2);
        c.parked_done(Barrier::None);
        assert!(matches!(
            node.request(&mut c, 12, send(2)),
            Next::Handled {
                action: Action::Park(_),
                ..
            }
        ));
    }

    /// A connection's subscriptions are its own list; the node's push index
    /// follows it: SUBSCRIBE adds to both (within subscriptions_max, existing
    /// groups only), UNSUBSCRIBE empties both.
    #[test]
    fn subscriptions_are_the_connections_and_the_index_follows_them() {
        let limits = Limits {
            subscriptions_max: 2,
            ..Limits::default()
        };
        let mut node = Node::new(limits);
        let mut c = node.authenticated();
        let me = ConnId {
            index: 0,
            generation: 1,
        };
        let groups = |g: &[u64]| Request::Subscribe(Subscription::Groups(g.to_vec()));
        assert_eq!(
            node.answered(&mut c, groups(&[99])),
            Some(ErrorCode::GroupNotFound)
        );
        assert!(!c.is_subscribed());
        assert_eq!(node.answered(&mut c, groups(&[1])), None);
        assert_eq!(node.subs.targets(&node.engine, 1), [me]);
        let over = Some(ErrorCode::LimitExceeded);
        assert_eq!(node.answered(&mut c, groups(&[1, 1])), over);
        let user = Request::Subscribe(Subscription::User(5));
        assert_eq!(node.answered(&mut c, user), None);
        assert_eq!(
            node.answered(&mut c, Request::Subscribe(Subscription::User(6))),
            over
        );
        assert!(c.is_subscribed());
        assert_eq!(node.answered(&mut c, Request::Unsubscribe), None);
        assert!(!c.is_subscribed());
        assert!(node.subs.targets(&node.engine, 1).is_empty());
    }

    /// While the node shuts down every request is answered SHUTTING_DOWN,
    /// HELLO included, and nothing runs.
    #[test]
    fn a_shutting_down_node_runs_nothing() {
        let mut node = Node::new(Limits::default());
        node.shutting_down = true;
        let mut c = Connection::new(node.limits.frame_bytes_max);
        let down = Some(ErrorCode::ShuttingDown);
        assert_eq!(node.answered(&mut c, hello()), down);
        assert_eq!(node.answered(&mut c, send(1)), down);
        assert_eq!(c.session.phase, Phase::AwaitHello);
    }

    /// Protocol version 2 (format-spec/protocol.md 7): HELLO's response is
    /// a version 1 frame, every later frame carries 2 both ways, and a
    /// frame of another version than the connection's is fatal.
    #[test]
    fn a_version_2_connection_stamps_its_frames_and_refuses_other_versions() {
        let mut node = Node::new(Limits::default());
        let mut c = Connection::new(node.limits.frame_bytes_max);
        let hello = Request::Hello {
            min_version: 1,
            max_version: 2,
            client_name: "t",
        };
        let answer = |next: Next| match next {
            Next::Handled {
                action: Action::Answer(out),
                ..
            } => out,
            _ => panic!("not answered at once"),
        };
        let out = answer(node.request(&mut c, 1, hello));
        assert_eq!(out.head[4], 1, "HELLO's response carries 1");
        assert!(c.queue(out));
        assert_eq!(c.version(), 2);
        let auth = answer(node.request_in(&mut c, 2, 2, Request::Auth { token: TOKEN }));
        assert_eq!(auth.error, None);
        // A version 2 PING: its response stamped 2 when queued.
        let pong = answer(node.request_in(&mut c, 2, 3, Request::Ping));
        assert!(c.queue(pong));
        let mut sink = Vec::new();
        c.write_to(&mut sink).unwrap();
        let pong = &sink[sink.len() - 16..];
        assert_eq!((pong[4], pong[5]), (2, Opcode::Ping.response_byte()));
        // A version 1 frame on the version 2 connection: fatal.
        assert!(matches!(
            node.request(&mut c, 4, Request::Ping),
            Next::Handled {
                action: Action::Closed(ErrorCode::UnsupportedVersion),
                ..
            }
        ));
    }
}
