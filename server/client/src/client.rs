//! A blocking client over `std::net`: the handshake, one method per request,
//! pipelining (`submit` / `recv`), pushes queued as [`Event`]s, and every
//! record's CRC verified end to end before a message reaches the caller.
//!
//! This is the low-level connection: one TCP connection, no retries. The
//! reliability layer (reconnect with backoff, retransmit with the same
//! `client_msg_id`, dedup by `msg_id`, batch ACK) is [`crate::reliable`].

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use tidemark_protocol::{
    decode_response, encode_request_in, AckItem, BackupChunk, BackupEnd, DecodeError, ErrorCode,
    Frame, FrameDecoder, GroupInfo, JoinStart, MemberChange, MemberEntry, Opcode, ReceiptCount,
    Records, Request, Response, ResyncScope, RetentionPolicy, ShardTable, Subscription,
    UnreadEntry, FRAME_BYTES_MAX_FLOOR, HELLO_VERSION, KIND_EDIT, KIND_GAP, KIND_RECALL,
    PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, SHARD_COUNT,
};

/// A message as the client hands it to the application.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub group: u64,
    pub msg_id: u64,
    pub timestamp_ms: u64,
    pub sender_id: u64,
    pub client_msg_id: u64,
    /// A message's payload; an edit's new payload (its target id taken
    /// off); empty for the other kinds.
    pub payload: Vec<u8>,
    /// What the record is (protocol version 2; always
    /// [`Kind::Message`] on a version 1 connection, where the node shows
    /// edits, recalls and recalled messages as empty messages).
    pub kind: Kind,
}

/// What a record is (format-spec/protocol.md 2.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A message.
    Message,
    /// A message recalled since (its payload withheld: empty).
    Recalled,
    /// A message shown in its latest state with its newest edit's payload
    /// (HISTORY_LATEST only).
    Edited,
    /// An edit of message `target`: `payload` is its new payload.
    Edit { target: u64 },
    /// The recall of message `target`.
    Recall { target: u64 },
    /// A message lost to damage, cut by the repair tool (no payload).
    Gap,
}

/// One request of the node's slow log (SLOWLOG, format-spec/protocol.md
/// 4.22).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowRequest {
    pub id: u64,
    pub unix_ms: u64,
    pub duration_ns: u64,
    /// The request's opcode byte (maybe one this client does not know).
    pub opcode: u8,
    pub client: String,
    pub args: String,
}

/// The node's slow log as SLOWLOG lists it: newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowLogReport {
    pub threshold_us: u64,
    pub entries_max: u32,
    /// Entries the log held (more than listed if the list was cut).
    pub held: u32,
    /// Slow requests since the node started.
    pub recorded: u64,
    pub entries: Vec<SlowRequest>,
}

/// Something the node sent on its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Push(Vec<Message>),
    /// Pushes were dropped (all: the subscription was cancelled); pull.
    Resync(ResyncScope),
    /// RECEIPT (after [`Client::subscribe_receipts`]): these members'
    /// cursors moved in `group`, each its latest.
    Receipt {
        group: u64,
        receipts: Vec<MemberEntry>,
    },
    /// RECEIPT_COUNTS (after [`Client::subscribe_receipts`], a group above
    /// the node's receipt threshold): members at or above each of
    /// `sender`'s recent messages.
    ReceiptCounts {
        group: u64,
        sender: u64,
        counts: Vec<ReceiptCount>,
    },
}

/// Everything that can go wrong, typed.
#[derive(Debug)]
pub enum ClientError {
    /// The node's address does not parse or does not resolve: nothing a
    /// retry can change (a name that resolves later is the caller's retry).
    Address {
        addr: String,
        message: String,
    },
    Io(io::Error),
    /// The node sent bytes that are not a valid frame.
    Protocol(String),
    /// The node answered with an ERROR frame.
    Server {
        code: ErrorCode,
        detail: Option<u64>,
        message: String,
    },
    /// A record whose CRC does not match its bytes.
    Crc {
        group: u64,
        msg_id: u64,
    },
    /// No answer within the client's I/O timeout.
    Timeout,
    /// The node closed the connection.
    Closed,
}

impl ClientError {
    /// The owning set's id when the node answered WRONG_SET: the request
    /// named a group another replica set of the cluster holds; nothing was
    /// done (format-spec/protocol.md 4.33). [`Client::cluster_map`] says
    /// where that set's nodes are.
    pub fn wrong_set(&self) -> Option<u32> {
        match self {
            ClientError::Server {
                code: ErrorCode::WrongSet,
                detail,
                ..
            } => Some(detail.and_then(|d| u32::try_from(d).ok()).unwrap_or(0)),
            _ => None,
        }
    }

    /// The server's error code, if this is a server error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Address { addr, message } => {
                write!(f, "invalid address {addr:?}: {message}")
            }
            ClientError::Io(e) => write!(f, "i/o: {e}"),
            ClientError::Protocol(m) => write!(f, "protocol: {m}"),
            ClientError::Server {
                code,
                detail,
                message,
            } => {
                write!(f, "{code:?}: {message}")?;
                if let Some(d) = detail {
                    write!(f, " (detail {d})")?;
                }
                Ok(())
            }
            ClientError::Crc { group, msg_id } => {
                write!(f, "CRC mismatch in group {group} msg {msg_id}")
            }
            ClientError::Timeout => write!(f, "timed out"),
            ClientError::Closed => write!(f, "connection closed by the node"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ClientError::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => ClientError::Closed,
            _ => ClientError::Io(e),
        }
    }
}

impl From<DecodeError> for ClientError {
    fn from(e: DecodeError) -> Self {
        ClientError::Protocol(e.to_string())
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;

/// How to connect.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub addr: String,
    pub token: Option<Vec<u8>>,
    /// Longest wait for one response (a long poll adds its own wait).
    pub io_timeout: Duration,
    pub client_name: String,
    /// The newest protocol version to offer at HELLO (default: the
    /// newest this library speaks; 1 makes a version 1 client).
    pub max_version: u8,
}

impl ClientConfig {
    pub fn new(addr: impl Into<String>) -> Self {
        ClientConfig {
            addr: addr.into(),
            token: None,
            io_timeout: Duration::from_secs(10),
            client_name: "tidemark-client".into(),
            max_version: PROTOCOL_VERSION,
        }
    }
}

/// What the node announced at HELLO.
#[derive(Clone, Copy, Debug)]
pub struct NodeLimits {
    pub frame_bytes_max: u32,
    pub payload_bytes_max: u32,
    pub requests_in_flight_max: u32,
}

/// The result of a SEND.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    pub msg_id: u64,
    pub timestamp_ms: u64,
    pub duplicate: bool,
}

/// The client address of `leader` among `members`, when both are known.
fn leader_addr(leader: Option<u64>, members: &[(u64, String)]) -> Option<&str> {
    let leader = leader?;
    members
        .iter()
        .find(|(id, _)| *id == leader)
        .map(|(_, a)| a.as_str())
}

/// The answer to CLUSTER, owned: the answering node's id (0: no replica
/// set member), the leader it knows, the members' `(id, client address)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMap {
    pub node_id: u64,
    pub leader_id: Option<u64>,
    pub members: Vec<(u64, String)>,
}

impl ClusterMap {
    /// The leader's client address, when known.
    pub fn leader_addr(&self) -> Option<&str> {
        leader_addr(self.leader_id, &self.members)
    }
}

/// One replica set of a [`ShardMap`]: its id, its leader as the answering
/// node knows it, its members' `(node id, client address)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetInfo {
    pub set_id: u32,
    pub leader_id: Option<u64>,
    /// Empty on a single node: the node asked is the set.
    pub members: Vec<(u64, String)>,
}

impl SetInfo {
    /// The leader's client address, when known.
    pub fn leader_addr(&self) -> Option<&str> {
        leader_addr(self.leader_id, &self.members)
    }
}

/// The answer to CLUSTER_MAP, owned and checked (format-spec/protocol.md
/// 4.33): the cluster's sets and the set of every shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap {
    pub epoch: u64,
    /// The answering node's id (0 on a single node) and set.
    pub node_id: u64,
    pub set_id: u32,
    /// Every set, by ascending id.
    pub sets: Vec<SetInfo>,
    pub table: ShardTable,
}

impl ShardMap {
    /// The set holding `group`.
    pub fn set_of(&self, group: u64) -> u32 {
        self.table.set_of(group)
    }

    /// Set `set_id`, if the map has it.
    pub fn set(&self, set_id: u32) -> Option<&SetInfo> {
        self.sets.iter().find(|s| s.set_id == set_id)
    }
}

/// A page of PULL.
#[derive(Clone, Debug)]
pub struct Page {
    pub cursor: u64,
    pub head: u64,
    pub has_more: bool,
    pub messages: Vec<Message>,
}

/// One group of UNREAD or SYNC.
#[derive(Clone, Debug)]
pub struct GroupState {
    pub group: u64,
    pub head: u64,
    pub cursor: u64,
    pub unread: u64,
    pub messages: Vec<Message>,
}

impl GroupState {
    fn new(e: &UnreadEntry, messages: Vec<Message>) -> GroupState {
        GroupState {
            group: e.group,
            head: e.head,
            cursor: e.cursor,
            unread: e.unread,
            messages,
        }
    }
}

/// A response frame, owned.
pub struct OwnedFrame(Vec<u8>);

impl OwnedFrame {
    pub fn request_id(&self) -> u64 {
        let mut id = [0u8; 8];
        id.copy_from_slice(&self.0[8..16]);
        u64::from_le_bytes(id)
    }

    /// Decodes the response; an ERROR frame becomes `ClientError::Server`.
    pub fn response(&self) -> Result<Response<'_>> {
        let frame = Frame::parse(&self.0)?;
        match decode_response(&frame)? {
            Response::Error(e) => Err(ClientError::Server {
                code: e.code,
                detail: e.detail,
                message: e.message.to_string(),
            }),
            r => Ok(r),
        }
    }
}

/// Verifies and copies the records of a section.
pub fn messages(group: u64, records: &Records<'_>) -> Result<Vec<Message>> {
    let mut out = Vec::with_capacity(records.count as usize);
    for r in records.iter(false) {
        let r = r.map_err(|e| ClientError::Protocol(e.to_string()))?;
        let bytes = r.bytes();
        if crc32fast::hash(&bytes[8..]) != r.crc32() {
            return Err(ClientError::Crc {
                group,
                msg_id: r.msg_id(),
            });
        }
        // The section was checked against its frame's version: a kind's
        // target and payload rule hold (`Records::iter_in`).
        let (kind, payload) = match (r.kind(), r.target()) {
            (KIND_EDIT, Some(target)) => {
                (Kind::Edit { target }, r.edit_payload().unwrap_or_default())
            }
            (KIND_RECALL, Some(target)) => (Kind::Recall { target }, &[][..]),
            (KIND_GAP, _) => (Kind::Gap, &[][..]),
            _ if r.is_recalled() => (Kind::Recalled, &[][..]),
            _ if r.is_edited() => (Kind::Edited, r.payload()),
            _ => (Kind::Message, r.payload()),
        };
        out.push(Message {
            group,
            msg_id: r.msg_id(),
            timestamp_ms: r.timestamp_ms(),
            sender_id: r.sender_id(),
            client_msg_id: r.client_msg_id(),
            payload: payload.to_vec(),
            kind,
        });
    }
    Ok(out)
}

/// `base + d`, saturating: a timeout too large for the clock (a caller's
/// `Duration::MAX`) means "practically never", not a panic.
pub(crate) fn later(base: Instant, d: Duration) -> Instant {
    // 2^32 s is 136 years; the monotonic clock is nowhere near overflow.
    base.checked_add(d.min(Duration::from_secs(1 << 32)))
        .unwrap_or(base)
}

fn unexpected<T>(what: &str) -> Result<T> {
    Err(ClientError::Protocol(format!(
        "unexpected response to {what}"
    )))
}

pub struct Client {
    stream: TcpStream,
    decoder: FrameDecoder,
    next_id: u64,
    io_timeout: Duration,
    /// Pushes and resyncs in arrival order. A push whose records fail their
    /// CRC is queued as its error, so that it surfaces from `next_event` and
    /// never fails an unrelated request that happened to read it.
    events: VecDeque<Result<Event>>,
    /// Responses read while waiting for another one (pipelining).
    stashed: HashMap<u64, OwnedFrame>,
    limits: NodeLimits,
    out: Vec<u8>,
    /// The protocol version HELLO chose (1 until then: HELLO's frames).
    version: u8,
}

impl Client {
    /// Connects, says HELLO, and AUTHs when the node asks for a token.
    pub fn connect(config: &ClientConfig) -> Result<Client> {
        let bad_address = |message: String| ClientError::Address {
            addr: config.addr.clone(),
            message,
        };
        let addr = config
            .addr
            .to_socket_addrs()
            .map_err(|e| bad_address(e.to_string()))?
            .next()
            .ok_or_else(|| bad_address("resolves to no address".into()))?;
        let stream = TcpStream::connect_timeout(&addr, config.io_timeout)?;
        stream.set_nodelay(true)?;
        let mut c = Client {
            stream,
            decoder: FrameDecoder::new(FRAME_BYTES_MAX_FLOOR),
            next_id: 1,
            io_timeout: config.io_timeout,
            events: VecDeque::new(),
            stashed: HashMap::new(),
            limits: NodeLimits {
                frame_bytes_max: FRAME_BYTES_MAX_FLOOR,
                payload_bytes_max: 0,
                requests_in_flight_max: 1,
            },
            out: Vec::new(),
            version: HELLO_VERSION,
        };
        let hello = c.call(&Request::Hello {
            min_version: PROTOCOL_VERSION_MIN,
            max_version: config.max_version,
            client_name: &config.client_name,
        })?;
        let auth_required = match hello.response()? {
            Response::Hello(h) => {
                if !(PROTOCOL_VERSION_MIN..=config.max_version).contains(&h.version) {
                    return Err(ClientError::Protocol(format!(
                        "the node chose protocol version {}, not offered",
                        h.version
                    )));
                }
                c.version = h.version;
                c.limits = NodeLimits {
                    frame_bytes_max: h.frame_bytes_max,
                    payload_bytes_max: h.payload_bytes_max,
                    requests_in_flight_max: h.requests_in_flight_max,
                };
                h.auth_required
            }
            _ => return unexpected("HELLO"),
        };
        c.decoder = FrameDecoder::new(c.limits.frame_bytes_max);
        if auth_required {
            // Without a token the node's answer would be "wrong token";
            // say what is actually wrong, as the node's refusal it is.
            let Some(token) = config.token.as_deref() else {
                return Err(ClientError::Server {
                    code: ErrorCode::Unauthenticated,
                    detail: None,
                    message: "the node requires a token and none was given".into(),
                });
            };
            match c.call(&Request::Auth { token })?.response()? {
                Response::Auth => {}
                _ => return unexpected("AUTH"),
            }
        }
        Ok(c)
    }

    pub fn limits(&self) -> NodeLimits {
        self.limits
    }

    /// Longest wait for one response (a long poll adds its own wait).
    pub fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    pub fn set_io_timeout(&mut self, timeout: Duration) {
        self.io_timeout = timeout;
    }

    /// Shuts the socket down, both directions, without waiting for
    /// responses: requests in flight have unknown outcome, and once the
    /// bytes already received are read, reads see the end of the stream.
    /// For abandoning a stalled connection before dropping it.
    pub fn cut(&self) {
        // An error means the socket is already gone, which is the aim.
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    /// Sends a request without waiting; returns its id (pipelining).
    pub fn submit(&mut self, req: &Request<'_>) -> Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        self.out.clear();
        encode_request_in(self.version, id, req, &mut self.out)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.stream.write_all(&self.out)?;
        Ok(id)
    }

    /// Reads frames until one that is not a push arrives; pushes are queued.
    /// With `events_end_wait`, a queued event ends the wait too (as
    /// `Timeout`: no response came), so that [`Client::next_event`] returns
    /// a push or a receipt when it arrives rather than at its deadline.
    fn read_response_frame(
        &mut self,
        deadline: Instant,
        events_end_wait: bool,
    ) -> Result<OwnedFrame> {
        loop {
            if let Some(f) = self.take_frame()? {
                return Ok(f);
            }
            if events_end_wait && !self.events.is_empty() {
                return Err(ClientError::Timeout);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout);
            }
            self.stream.set_read_timeout(Some(left))?;
            if !self.decoder.wants_read() {
                return Err(ClientError::Protocol("frame decoder stalled".into()));
            }
            match self.decoder.read_from(&mut self.stream) {
                Ok(0) => return Err(ClientError::Closed),
                Ok(_) => {}
                // A signal delivered to this process while it waited (a
                // child's exit, a timer): nothing was read, wait again.
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Takes one whole response frame from the decoder, queueing events.
    fn take_frame(&mut self) -> Result<Option<OwnedFrame>> {
        loop {
            let frame = match self.decoder.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(None),
                Err(e) => return Err(ClientError::Protocol(e.to_string())),
            };
            let owned = OwnedFrame(frame.to_vec());
            // Every frame after HELLO's carries the negotiated version.
            let hello = frame.header.opcode == Opcode::Hello.response_byte();
            if frame.header.version != self.version && !hello {
                return Err(ClientError::Protocol(format!(
                    "a frame of version {} on a connection of version {}",
                    frame.header.version, self.version
                )));
            }
            let event = match decode_response(&frame)? {
                Response::Push { group, records } => {
                    Some(messages(group, &records).map(Event::Push))
                }
                Response::Resync(scope) => Some(Ok(Event::Resync(scope))),
                Response::Receipt { group, receipts } => {
                    Some(Ok(Event::Receipt { group, receipts }))
                }
                Response::ReceiptCounts {
                    group,
                    sender,
                    counts,
                } => Some(Ok(Event::ReceiptCounts {
                    group,
                    sender,
                    counts,
                })),
                _ => None,
            };
            match event {
                Some(e) => self.events.push_back(e),
                None => return Ok(Some(owned)),
            }
        }
    }

    /// The next response of any request (pipelining).
    pub fn recv(&mut self) -> Result<OwnedFrame> {
        if let Some(&id) = self.stashed.keys().next() {
            if let Some(f) = self.stashed.remove(&id) {
                return Ok(f);
            }
        }
        self.read_response_frame(later(Instant::now(), self.io_timeout), false)
    }

    /// Waits for the response to request `id`, stashing others.
    pub fn wait(&mut self, id: u64, extra: Duration) -> Result<OwnedFrame> {
        if let Some(f) = self.stashed.remove(&id) {
            return Ok(f);
        }
        let deadline = later(later(Instant::now(), self.io_timeout), extra);
        loop {
            let f = self.read_response_frame(deadline, false)?;
            let rid = f.request_id();
            if rid == id {
                return Ok(f);
            }
            if rid == 0 {
                // An ERROR about the connection (oversized frame, shutdown).
                f.response()?;
                continue;
            }
            self.stashed.insert(rid, f);
        }
    }

    /// One request, one response.
    pub fn call(&mut self, req: &Request<'_>) -> Result<OwnedFrame> {
        let extra = match req {
            Request::Pull { wait_ms, .. } => Duration::from_millis(*wait_ms as u64),
            _ => Duration::ZERO,
        };
        let id = self.submit(req)?;
        self.wait(id, extra)
    }

    /// The next push or resync, waiting up to `timeout`. A push whose
    /// records fail their CRC is returned as `Err(ClientError::Crc)` (the
    /// connection stays usable; pull the group). An ERROR about the
    /// connection (request id 0, e.g. `SHUTTING_DOWN`) is returned as
    /// `Err(ClientError::Server)`.
    pub fn next_event(&mut self, timeout: Duration) -> Result<Option<Event>> {
        let deadline = later(Instant::now(), timeout);
        loop {
            if let Some(e) = self.events.pop_front() {
                return e.map(Some);
            }
            match self.read_response_frame(deadline, true) {
                Ok(f) => {
                    let id = f.request_id();
                    if id == 0 {
                        f.response()?;
                        continue;
                    }
                    self.stashed.insert(id, f);
                }
                Err(ClientError::Timeout) => return self.events.pop_front().transpose(),
                Err(e) => return Err(e),
            }
        }
    }

    pub fn ping(&mut self) -> Result<()> {
        match self.call(&Request::Ping)?.response()? {
            Response::Pong => Ok(()),
            _ => unexpected("PING"),
        }
    }

    pub fn create_group(&mut self, group: u64) -> Result<()> {
        match self.call(&Request::CreateGroup { group })?.response()? {
            Response::CreateGroup => Ok(()),
            _ => unexpected("CREATE_GROUP"),
        }
    }

    pub fn delete_group(&mut self, group: u64) -> Result<()> {
        match self.call(&Request::DeleteGroup { group })?.response()? {
            Response::DeleteGroup => Ok(()),
            _ => unexpected("DELETE_GROUP"),
        }
    }

    /// Joins; returns the member's cursor.
    pub fn join(&mut self, group: u64, user: u64, start: JoinStart) -> Result<u64> {
        match self
            .call(&Request::Join { group, user, start })?
            .response()?
        {
            Response::Join { cursor, .. } => Ok(cursor),
            _ => unexpected("JOIN"),
        }
    }

    pub fn leave(&mut self, group: u64, user: u64) -> Result<()> {
        match self.call(&Request::Leave { group, user })?.response()? {
            Response::Leave => Ok(()),
            _ => unexpected("LEAVE"),
        }
    }

    pub fn send(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        payload: &[u8],
    ) -> Result<Sent> {
        let f = self.call(&Request::Send {
            group,
            sender,
            client_msg_id,
            payload,
        })?;
        parse_sent(&f)
    }

    /// RECALL (protocol version 2): recalls message `target` of `group`
    /// (its sender's, or any as an admin sender of the node). A retransmit
    /// with the same `client_msg_id` gets the original's answer.
    pub fn recall(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        target: u64,
    ) -> Result<Sent> {
        let f = self.call(&Request::Recall {
            group,
            sender,
            client_msg_id,
            target,
        })?;
        parse_sent(&f)
    }

    /// EDIT (protocol version 2): replaces message `target`'s payload.
    pub fn edit(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        target: u64,
        payload: &[u8],
    ) -> Result<Sent> {
        let f = self.call(&Request::Edit {
            group,
            sender,
            client_msg_id,
            target,
            payload,
        })?;
        parse_sent(&f)
    }

    /// HISTORY_LATEST (protocol version 2): HISTORY's page with every
    /// message in its latest state (recalled, or with its newest edit's
    /// payload), the edits and recalls left out. Returns the messages
    /// (newest first), whether older ones remain, and the `before_msg_id`
    /// of the next page.
    pub fn history_latest(
        &mut self,
        group: u64,
        user: u64,
        before_msg_id: u64,
        max_count: u32,
    ) -> Result<(Vec<Message>, bool, u64)> {
        let f = self.call(&Request::HistoryLatest {
            group,
            user,
            before_msg_id,
            max_count,
        })?;
        match f.response()? {
            Response::HistoryLatest {
                has_more,
                next_before,
                records,
            } => Ok((messages(group, &records)?, has_more, next_before)),
            _ => unexpected("HISTORY_LATEST"),
        }
    }

    /// The protocol version HELLO chose.
    pub fn version(&self) -> u8 {
        self.version
    }

    /// PULL: messages above the cursor, after acknowledging `ack_up_to`.
    pub fn pull(
        &mut self,
        group: u64,
        user: u64,
        ack_up_to: u64,
        max_count: u32,
        wait_ms: u32,
    ) -> Result<Page> {
        let f = self.call(&Request::Pull {
            group,
            user,
            ack_up_to,
            max_count,
            max_bytes: u32::MAX,
            wait_ms,
        })?;
        match f.response()? {
            Response::Pull {
                cursor,
                head,
                has_more,
                records,
            } => Ok(Page {
                cursor,
                head,
                has_more,
                messages: messages(group, &records)?,
            }),
            _ => unexpected("PULL"),
        }
    }

    pub fn ack(&mut self, group: u64, user: u64, msg_id: u64) -> Result<u64> {
        match self
            .call(&Request::Ack {
                group,
                user,
                msg_id,
            })?
            .response()?
        {
            Response::Ack { cursor } => Ok(cursor),
            _ => unexpected("ACK"),
        }
    }

    /// BATCH_ACK: per item, the cursor or the error code.
    pub fn batch_ack(
        &mut self,
        user: u64,
        items: &[(u64, u64)],
    ) -> Result<Vec<Result<u64, ErrorCode>>> {
        let items = items
            .iter()
            .map(|&(group, msg_id)| AckItem { group, msg_id })
            .collect();
        match self.call(&Request::BatchAck { user, items })?.response()? {
            Response::BatchAck(results) => Ok(results
                .iter()
                .map(|r| r.error.map_or(Ok(r.cursor), Err))
                .collect()),
            _ => unexpected("BATCH_ACK"),
        }
    }

    pub fn unread(&mut self, user: u64) -> Result<Vec<GroupState>> {
        match self.call(&Request::Unread { user })?.response()? {
            Response::Unread(list) => Ok(list
                .iter()
                .map(|u| GroupState::new(u, Vec::new()))
                .collect()),
            _ => unexpected("UNREAD"),
        }
    }

    /// SYNC: returns the groups and the next continuation (0 = done).
    pub fn sync(
        &mut self,
        user: u64,
        per_group_max: u32,
        total_max_bytes: u32,
        continuation: u64,
    ) -> Result<(Vec<GroupState>, u64)> {
        let f = self.call(&Request::Sync {
            user,
            per_group_max,
            total_max_bytes,
            continuation,
        })?;
        match f.response()? {
            Response::Sync {
                next_continuation,
                groups,
            } => {
                let mut out = Vec::with_capacity(groups.len());
                for g in groups {
                    let messages = messages(g.entry.group, &g.records)?;
                    out.push(GroupState::new(&g.entry, messages));
                }
                Ok((out, next_continuation))
            }
            _ => unexpected("SYNC"),
        }
    }

    /// HISTORY: messages below `before_msg_id` (0 = from the head), newest
    /// first, and whether older ones exist.
    pub fn history(
        &mut self,
        group: u64,
        user: u64,
        before_msg_id: u64,
        max_count: u32,
    ) -> Result<(Vec<Message>, bool)> {
        match self
            .call(&Request::History {
                group,
                user,
                before_msg_id,
                max_count,
            })?
            .response()?
        {
            Response::History { has_more, records } => Ok((messages(group, &records)?, has_more)),
            _ => unexpected("HISTORY"),
        }
    }

    pub fn read_count(&mut self, group: u64, msg_id: u64) -> Result<u64> {
        match self
            .call(&Request::ReadCount { group, msg_id })?
            .response()?
        {
            Response::ReadCount { count } => Ok(count),
            _ => unexpected("READ_COUNT"),
        }
    }

    /// MEMBERS: at most `max_count` members with an id above `after_user`
    /// (0: from the first) and their cursors, ascending, and whether more
    /// remain (the next page starts after the last user returned).
    pub fn members(
        &mut self,
        group: u64,
        after_user: u64,
        max_count: u32,
    ) -> Result<(Vec<MemberEntry>, bool)> {
        match self
            .call(&Request::Members {
                group,
                after_user,
                max_count,
            })?
            .response()?
        {
            Response::Members { has_more, members } => Ok((members, has_more)),
            _ => unexpected("MEMBERS"),
        }
    }

    /// GROUP_INFO: head, retention floor, member count, retention policy.
    pub fn group_info(&mut self, group: u64) -> Result<GroupInfo> {
        match self.call(&Request::GroupInfo { group })?.response()? {
            Response::GroupInfo(info) => Ok(info),
            _ => unexpected("GROUP_INFO"),
        }
    }

    /// SET_RETENTION: the group's retention policy from now on (all zero:
    /// keep everything); answered once durable.
    pub fn set_retention(&mut self, group: u64, policy: RetentionPolicy) -> Result<()> {
        let req = Request::SetRetention {
            group,
            by_cursor: policy.by_cursor,
            max_age_ms: policy.max_age_ms,
            max_bytes: policy.max_bytes,
        };
        match self.call(&req)?.response()? {
            Response::SetRetention => Ok(()),
            _ => unexpected("SET_RETENTION"),
        }
    }

    /// CLEAR_HISTORY: clears `user`'s history of the group up to `up_to`
    /// (above the head: everything) for that member only; returns its
    /// `(join_point, cursor)` afterwards.
    pub fn clear_history(&mut self, group: u64, user: u64, up_to: u64) -> Result<(u64, u64)> {
        match self
            .call(&Request::ClearHistory { group, user, up_to })?
            .response()?
        {
            Response::ClearHistory { join_point, cursor } => Ok((join_point, cursor)),
            _ => unexpected("CLEAR_HISTORY"),
        }
    }

    pub fn subscribe(&mut self, sub: Subscription) -> Result<()> {
        match self.call(&Request::Subscribe(sub))?.response()? {
            Response::Subscribe => Ok(()),
            _ => unexpected("SUBSCRIBE"),
        }
    }

    /// SUBSCRIBE_RECEIPTS: receipts of `groups` arrive as
    /// [`Event::Receipt`] (or [`Event::ReceiptCounts`] of `sender`'s recent
    /// messages in a group above the node's threshold).
    pub fn subscribe_receipts(&mut self, sender: u64, groups: &[u64]) -> Result<()> {
        let req = Request::SubscribeReceipts {
            sender,
            groups: groups.to_vec(),
        };
        match self.call(&req)?.response()? {
            Response::SubscribeReceipts => Ok(()),
            _ => unexpected("SUBSCRIBE_RECEIPTS"),
        }
    }

    /// READERS: members whose cursor is at or above `msg_id`, among those
    /// the node examined above `after_user` (0: from the first), and the
    /// `after_user` of the next page (0: none left).
    pub fn readers(
        &mut self,
        group: u64,
        msg_id: u64,
        after_user: u64,
        max_count: u32,
    ) -> Result<(Vec<MemberEntry>, u64)> {
        let req = Request::Readers {
            group,
            msg_id,
            after_user,
            max_count,
        };
        match self.call(&req)?.response()? {
            Response::Readers {
                next_after_user,
                readers,
            } => Ok((readers, next_after_user)),
            _ => unexpected("READERS"),
        }
    }

    pub fn unsubscribe(&mut self) -> Result<()> {
        match self.call(&Request::Unsubscribe)?.response()? {
            Response::Unsubscribe => Ok(()),
            _ => unexpected("UNSUBSCRIBE"),
        }
    }

    /// BACKUP: a consistent snapshot of the node, streamed
    /// (format-spec/protocol.md, BACKUP). `on_chunk` gets each part of each
    /// file in order (its CRC already checked) and may stop the stream
    /// with an error; the end says what the snapshot holds. The client's
    /// I/O timeout applies to each frame, not to the whole stream.
    pub fn backup(
        &mut self,
        mut on_chunk: impl FnMut(&BackupChunk<'_>) -> Result<()>,
    ) -> Result<BackupEnd> {
        let id = self.submit(&Request::Backup)?;
        loop {
            let f = self.wait(id, Duration::ZERO)?;
            match f.response()? {
                Response::BackupChunk(c) => on_chunk(&c)?,
                Response::Backup(end) => return Ok(end),
                _ => return unexpected("BACKUP"),
            }
        }
    }

    pub fn stats(&mut self) -> Result<Vec<(String, u64)>> {
        match self.call(&Request::Stats)?.response()? {
            Response::Stats(list) => {
                Ok(list.iter().map(|s| (s.name.to_string(), s.value)).collect())
            }
            _ => unexpected("STATS"),
        }
    }

    /// INFO: the node's text figures. An addition (format-spec/protocol.md
    /// section 7): send it only to a node whose STATS reports
    /// `limits.slowlog_entries_max`.
    pub fn info(&mut self) -> Result<Vec<(String, String)>> {
        match self.call(&Request::Info)?.response()? {
            Response::Info(items) => Ok(items
                .iter()
                .map(|i| (i.name.to_string(), i.value.to_string()))
                .collect()),
            _ => unexpected("INFO"),
        }
    }

    /// CLUSTER (format-spec/protocol.md 4.32): the replica set as the node
    /// knows it. A node that is no replica set member answers node id 0,
    /// no leader and no members. An addition, as INFO.
    pub fn cluster(&mut self) -> Result<ClusterMap> {
        match self.call(&Request::Cluster)?.response()? {
            Response::Cluster(m) => Ok(ClusterMap {
                node_id: m.node_id,
                leader_id: (m.leader_id != 0).then_some(m.leader_id),
                members: m
                    .members
                    .iter()
                    .map(|e| (e.node_id, e.client_addr.to_string()))
                    .collect(),
            }),
            _ => unexpected("CLUSTER"),
        }
    }

    /// CLUSTER_CHANGE (format-spec/protocol.md 4.34): asks the replica
    /// set's leader to add or remove a member; answered with the set once
    /// the change applied (an add: once the new node caught up and was
    /// promoted to voter, which takes its snapshot's transfer). A follower
    /// answers `NOT_LEADER` (ask the leader), a refusal is
    /// `MEMBERSHIP_REFUSED` with its reason in `detail`. An addition: a
    /// node older than it answers BAD_FRAME and closes the connection.
    pub fn cluster_change(&mut self, change: MemberChange<'_>) -> Result<ClusterMap> {
        match self.call(&Request::ClusterChange(change))?.response()? {
            Response::ClusterChange(m) => Ok(ClusterMap {
                node_id: m.node_id,
                leader_id: (m.leader_id != 0).then_some(m.leader_id),
                members: m
                    .members
                    .iter()
                    .map(|e| (e.node_id, e.client_addr.to_string()))
                    .collect(),
            }),
            _ => unexpected("CLUSTER_CHANGE"),
        }
    }

    /// CLUSTER_MAP (format-spec/protocol.md 4.33): the cluster's replica
    /// sets and which owns each shard, as the node knows them; a single
    /// node answers one set (id 0) owning every shard. Every node answers
    /// it (a follower too). An addition, as CLUSTER: a node older than it
    /// answers BAD_FRAME and closes the connection. A map whose shard
    /// table is not whole, or not of [`SHARD_COUNT`] shards, is a
    /// [`ClientError::Protocol`].
    pub fn cluster_map(&mut self) -> Result<ShardMap> {
        match self.call(&Request::ClusterMap)?.response()? {
            Response::ClusterMap(m) => {
                if m.shard_count != SHARD_COUNT {
                    return Err(ClientError::Protocol(format!(
                        "CLUSTER_MAP of {} shards; this client knows {SHARD_COUNT}",
                        m.shard_count
                    )));
                }
                let table = ShardTable::from_ranges(&m.ranges)
                    .map_err(|e| ClientError::Protocol(format!("CLUSTER_MAP: {e}")))?;
                Ok(ShardMap {
                    epoch: m.epoch,
                    node_id: m.node_id,
                    set_id: m.set_id,
                    sets: m
                        .sets
                        .iter()
                        .map(|s| SetInfo {
                            set_id: s.set_id,
                            leader_id: (s.leader_id != 0).then_some(s.leader_id),
                            members: s
                                .members
                                .iter()
                                .map(|e| (e.node_id, e.client_addr.to_string()))
                                .collect(),
                        })
                        .collect(),
                    table,
                })
            }
            _ => unexpected("CLUSTER_MAP"),
        }
    }

    /// SLOWLOG: up to `max_count` slow requests, newest first; with
    /// `reset`, the node empties its log once they are listed. An
    /// addition, as INFO.
    pub fn slowlog(&mut self, reset: bool, max_count: u32) -> Result<SlowLogReport> {
        match self
            .call(&Request::SlowLog { reset, max_count })?
            .response()?
        {
            Response::SlowLog(l) => Ok(SlowLogReport {
                threshold_us: l.threshold_us,
                entries_max: l.entries_max,
                held: l.held,
                recorded: l.recorded,
                entries: l
                    .entries
                    .iter()
                    .map(|e| SlowRequest {
                        id: e.id,
                        unix_ms: e.unix_ms,
                        duration_ns: e.duration_ns,
                        opcode: e.opcode,
                        client: e.client.to_string(),
                        args: e.args.to_string(),
                    })
                    .collect(),
            }),
            _ => unexpected("SLOWLOG"),
        }
    }
}

/// Decodes a SEND response.
/// The answer to a SEND, a RECALL or an EDIT (one layout).
pub fn parse_sent(f: &OwnedFrame) -> Result<Sent> {
    match f.response()? {
        Response::Send {
            msg_id,
            timestamp_ms,
            duplicate,
        }
        | Response::Recall {
            msg_id,
            timestamp_ms,
            duplicate,
        }
        | Response::Edit {
            msg_id,
            timestamp_ms,
            duplicate,
        } => Ok(Sent {
            msg_id,
            timestamp_ms,
            duplicate,
        }),
        _ => unexpected("SEND"),
    }
}
