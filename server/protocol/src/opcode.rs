//! Opcodes (format-spec/protocol.md "Opcodes"): the byte that says what a
//! frame's body is.
//!
//! Requests use 0x01..=0x3F. The response to a request carries the request's
//! opcode with the high bit set (0x81..=0xBF). Server-initiated frames use
//! 0xF0 (PUSH), 0xF1 (RESYNC), 0xF2 (RECEIPT), 0xF3 (RECEIPT_COUNTS) and
//! 0xF4 (BACKUP_CHUNK, carrying its BACKUP's request id);
//! 0xFF is ERROR, the response to any request.
//! One byte thus tells a reader the direction and the body layout.

/// The opcode of a request (and, with [`RESPONSE_BIT`], of its response).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    Hello = 0x01,
    Auth = 0x02,
    Ping = 0x03,
    Stats = 0x04,
    Backup = 0x05,
    Info = 0x06,
    SlowLog = 0x07,
    Cluster = 0x08,
    ClusterMap = 0x09,
    ClusterChange = 0x0A,
    CreateGroup = 0x10,
    DeleteGroup = 0x11,
    Join = 0x12,
    Leave = 0x13,
    Send = 0x20,
    Pull = 0x21,
    Ack = 0x22,
    BatchAck = 0x23,
    Unread = 0x24,
    Sync = 0x25,
    History = 0x26,
    ReadCount = 0x27,
    Members = 0x28,
    GroupInfo = 0x29,
    Readers = 0x2A,
    SetRetention = 0x2B,
    ClearHistory = 0x2C,
    Recall = 0x2D,
    Edit = 0x2E,
    HistoryLatest = 0x2F,
    Subscribe = 0x30,
    Unsubscribe = 0x31,
    SubscribeReceipts = 0x32,
}

/// Set in the opcode of every response to a request.
pub const RESPONSE_BIT: u8 = 0x80;
/// Opcode of PUSH (server-initiated, request id 0).
pub const OPCODE_PUSH: u8 = 0xF0;
/// Opcode of RESYNC (server-initiated, request id 0).
pub const OPCODE_RESYNC: u8 = 0xF1;
/// Opcode of RECEIPT (server-initiated, request id 0).
pub const OPCODE_RECEIPT: u8 = 0xF2;
/// Opcode of RECEIPT_COUNTS (server-initiated, request id 0).
pub const OPCODE_RECEIPT_COUNTS: u8 = 0xF3;
/// Opcode of BACKUP_CHUNK: part of a file of a BACKUP's snapshot, carrying
/// the BACKUP's request id (format-spec/protocol.md, BACKUP).
pub const OPCODE_BACKUP_CHUNK: u8 = 0xF4;
/// Opcode of ERROR, the failure response to any request.
pub const OPCODE_ERROR: u8 = 0xFF;

/// Highest opcode a request may have; responses then stay below 0xC0 and
/// never collide with PUSH, RESYNC or ERROR.
const REQUEST_OPCODE_MAX: u8 = 0x3F;

impl Opcode {
    /// Every request opcode (MEMBERS, GROUP_INFO, READERS,
    /// SUBSCRIBE_RECEIPTS, BACKUP, INFO, SLOWLOG, SET_RETENTION and
    /// CLEAR_HISTORY, CLUSTER, CLUSTER_MAP and CLUSTER_CHANGE are additions to version 1 made
    /// after tidemark 0.1;
    /// RECALL, EDIT and HISTORY_LATEST exist from version 2 on,
    /// [`Opcode::since`];
    /// format-spec/protocol.md section 7).
    pub const ALL: [Opcode; 33] = [
        Opcode::Hello,
        Opcode::Auth,
        Opcode::Ping,
        Opcode::Stats,
        Opcode::Backup,
        Opcode::Info,
        Opcode::Cluster,
        Opcode::ClusterMap,
        Opcode::ClusterChange,
        Opcode::SlowLog,
        Opcode::CreateGroup,
        Opcode::DeleteGroup,
        Opcode::Join,
        Opcode::Leave,
        Opcode::Send,
        Opcode::Pull,
        Opcode::Ack,
        Opcode::BatchAck,
        Opcode::Unread,
        Opcode::Sync,
        Opcode::History,
        Opcode::ReadCount,
        Opcode::Members,
        Opcode::GroupInfo,
        Opcode::Readers,
        Opcode::SetRetention,
        Opcode::ClearHistory,
        Opcode::Recall,
        Opcode::Edit,
        Opcode::HistoryLatest,
        Opcode::Subscribe,
        Opcode::Unsubscribe,
        Opcode::SubscribeReceipts,
    ];

    /// The first protocol version with this request: in an older one its
    /// byte is an unknown opcode (BAD_FRAME).
    pub const fn since(self) -> u8 {
        match self {
            Opcode::Recall | Opcode::Edit | Opcode::HistoryLatest => 2,
            _ => 1,
        }
    }

    /// Whether and how the request may stay **in flight**, held
    /// unanswered after it was handled (format-spec/protocol.md 1.4 and
    /// 1.5, one table): the requests that may are the ones
    /// `requests_in_flight_max` refuses when that many are in flight.
    pub const fn in_flight(self) -> InFlight {
        match self {
            Opcode::Send | Opcode::Recall | Opcode::Edit => InFlight::ParksAsSend,
            Opcode::CreateGroup
            | Opcode::DeleteGroup
            | Opcode::Join
            | Opcode::Leave
            | Opcode::SetRetention
            | Opcode::ClearHistory => InFlight::ParksAsOperation,
            Opcode::Pull => InFlight::LongPoll,
            _ => InFlight::Never,
        }
    }

    /// Served by every member of a replica set, a follower too: the
    /// connection's handshake, the node's own reports and the connection's
    /// own state (format-spec/protocol.md 4.31, cluster.md section 5.1).
    /// Every other request is refused with NOT_LEADER by a member that is
    /// not the leader with its writes gate open.
    pub const fn served_by_every_member(self) -> bool {
        matches!(
            self,
            Opcode::Hello
                | Opcode::Auth
                | Opcode::Ping
                | Opcode::Stats
                | Opcode::Info
                | Opcode::SlowLog
                | Opcode::Cluster
                | Opcode::ClusterMap
                | Opcode::Unsubscribe
        )
    }

    /// The request's opcode byte.
    pub const fn request_byte(self) -> u8 {
        self as u8
    }

    /// The opcode byte of the response to this request.
    pub const fn response_byte(self) -> u8 {
        self as u8 | RESPONSE_BIT
    }

    /// The request opcode with this byte, if version 1 has one. One index
    /// into [`BY_REQUEST_BYTE`] (every request's frame is classified by it,
    /// twice: its ordering check and its decoding).
    pub fn from_request_byte(b: u8) -> Option<Opcode> {
        BY_REQUEST_BYTE.get(usize::from(b)).copied().flatten()
    }

    /// The name used in the spec.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::Hello => "HELLO",
            Opcode::Auth => "AUTH",
            Opcode::Ping => "PING",
            Opcode::Stats => "STATS",
            Opcode::Backup => "BACKUP",
            Opcode::Info => "INFO",
            Opcode::SlowLog => "SLOWLOG",
            Opcode::Cluster => "CLUSTER",
            Opcode::ClusterMap => "CLUSTER_MAP",
            Opcode::ClusterChange => "CLUSTER_CHANGE",
            Opcode::CreateGroup => "CREATE_GROUP",
            Opcode::DeleteGroup => "DELETE_GROUP",
            Opcode::Join => "JOIN",
            Opcode::Leave => "LEAVE",
            Opcode::SetRetention => "SET_RETENTION",
            Opcode::ClearHistory => "CLEAR_HISTORY",
            Opcode::Recall => "RECALL",
            Opcode::Edit => "EDIT",
            Opcode::HistoryLatest => "HISTORY_LATEST",
            Opcode::Send => "SEND",
            Opcode::Pull => "PULL",
            Opcode::Ack => "ACK",
            Opcode::BatchAck => "BATCH_ACK",
            Opcode::Unread => "UNREAD",
            Opcode::Sync => "SYNC",
            Opcode::History => "HISTORY",
            Opcode::ReadCount => "READ_COUNT",
            Opcode::Members => "MEMBERS",
            Opcode::GroupInfo => "GROUP_INFO",
            Opcode::Readers => "READERS",
            Opcode::Subscribe => "SUBSCRIBE",
            Opcode::Unsubscribe => "UNSUBSCRIBE",
            Opcode::SubscribeReceipts => "SUBSCRIBE_RECEIPTS",
        }
    }
}

/// How a request may stay in flight (format-spec/protocol.md 1.4, 1.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InFlight {
    /// Answered while it is handled: never in flight on a single node, and
    /// never refused by `requests_in_flight_max`.
    Never,
    /// In flight until its commit round is durable; while parked, only
    /// SEND-like requests and PING start behind it.
    ParksAsSend,
    /// In flight until its commit round completes; while parked, only PING
    /// starts behind it.
    ParksAsOperation,
    /// In flight while it waits for a message (a long poll); holds nothing
    /// back.
    LongPoll,
}

impl InFlight {
    /// Refused at once with TOO_MANY_REQUESTS_IN_FLIGHT when the
    /// connection has `requests_in_flight_max` in flight.
    pub const fn is_limited(self) -> bool {
        !matches!(self, InFlight::Never)
    }

    /// The name of this kind in protocol.md's table of section 1.5.
    pub const fn spec_name(self) -> &'static str {
        match self {
            InFlight::Never => "never",
            InFlight::ParksAsSend => "parks as a SEND",
            InFlight::ParksAsOperation => "parks as an operation",
            InFlight::LongPoll => "long poll",
        }
    }
}

/// What a frame is, from its opcode byte alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// A client request.
    Request(Opcode),
    /// The success response to a request of this opcode.
    Response(Opcode),
    /// New records of a subscribed group (server-initiated).
    Push,
    /// Pushes were dropped; the client must pull (server-initiated).
    Resync,
    /// Members' cursors moved in a group whose receipts the client
    /// subscribed to (server-initiated; only after SUBSCRIBE_RECEIPTS).
    Receipt,
    /// Read counts of a sender's recent messages in a large group
    /// (server-initiated; only after SUBSCRIBE_RECEIPTS).
    ReceiptCounts,
    /// Part of a file of a BACKUP's snapshot (the BACKUP's request id).
    BackupChunk,
    /// The failure response to a request, or a connection-level error
    /// (request id 0).
    Error,
}

impl FrameKind {
    /// Classifies an opcode byte; `None` if version 1 has no such frame.
    pub fn from_byte(b: u8) -> Option<FrameKind> {
        match b {
            OPCODE_PUSH => Some(FrameKind::Push),
            OPCODE_RESYNC => Some(FrameKind::Resync),
            OPCODE_RECEIPT => Some(FrameKind::Receipt),
            OPCODE_RECEIPT_COUNTS => Some(FrameKind::ReceiptCounts),
            OPCODE_BACKUP_CHUNK => Some(FrameKind::BackupChunk),
            OPCODE_ERROR => Some(FrameKind::Error),
            b if b & RESPONSE_BIT != 0 => {
                Opcode::from_request_byte(b & !RESPONSE_BIT).map(FrameKind::Response)
            }
            b => Opcode::from_request_byte(b).map(FrameKind::Request),
        }
    }

    /// The opcode byte on the wire.
    pub const fn byte(self) -> u8 {
        match self {
            FrameKind::Request(op) => op.request_byte(),
            FrameKind::Response(op) => op.response_byte(),
            FrameKind::Push => OPCODE_PUSH,
            FrameKind::Resync => OPCODE_RESYNC,
            FrameKind::Receipt => OPCODE_RECEIPT,
            FrameKind::ReceiptCounts => OPCODE_RECEIPT_COUNTS,
            FrameKind::BackupChunk => OPCODE_BACKUP_CHUNK,
            FrameKind::Error => OPCODE_ERROR,
        }
    }

    /// True for frames the server sends without a request (request id 0).
    pub const fn is_server_initiated(self) -> bool {
        matches!(
            self,
            FrameKind::Push | FrameKind::Resync | FrameKind::Receipt | FrameKind::ReceiptCounts
        )
    }
}

/// The request opcode of each byte up to [`REQUEST_OPCODE_MAX`], made from
/// [`Opcode::ALL`] (so the two cannot disagree): `None` where no request
/// has the byte.
const BY_REQUEST_BYTE: [Option<Opcode>; REQUEST_OPCODE_MAX as usize + 1] = {
    let mut table = [None; REQUEST_OPCODE_MAX as usize + 1];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let op = Opcode::ALL[i];
        table[op as usize] = Some(op);
        i += 1;
    }
    table
};

// Request opcodes must leave room for the response bit and must not collide
// with the server-initiated and error opcodes.
const _: () = {
    let mut i = 0;
    while i < Opcode::ALL.len() {
        let b = Opcode::ALL[i] as u8;
        assert!(b != 0 && b <= REQUEST_OPCODE_MAX);
        i += 1;
    }
    assert!((REQUEST_OPCODE_MAX | RESPONSE_BIT) < OPCODE_PUSH);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_classifies_consistently() {
        let mut kinds = 0;
        for b in 0..=u8::MAX {
            if let Some(k) = FrameKind::from_byte(b) {
                assert_eq!(k.byte(), b);
                kinds += 1;
            }
        }
        // Requests, their responses, PUSH, RESYNC, RECEIPT, RECEIPT_COUNTS,
        // BACKUP_CHUNK and ERROR.
        assert_eq!(kinds, Opcode::ALL.len() * 2 + 6);
    }

    #[test]
    fn every_request_byte_names_the_opcode_of_the_list() {
        for b in 0..=u8::MAX {
            let listed = Opcode::ALL.iter().copied().find(|op| *op as u8 == b);
            assert_eq!(Opcode::from_request_byte(b), listed, "byte 0x{b:02x}");
        }
    }
}
