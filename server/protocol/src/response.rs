//! Responses and server-initiated frames (format-spec/protocol.md
//! "Responses", "Server-initiated frames", "ERROR"): their body layouts.
//! Each arm's `// Format:` comment matches the spec table.
//!
//! Responses that carry records put them last in the body, after every
//! fixed field, so the encoder can write the head into a small buffer and
//! the caller can send the stored record bytes after it without copying
//! ([`encode_response_head`]).

use super::error_code::{ErrorCode, STATUS_OK};
use super::frame::{begin_frame, finish_frame, Frame, FRAME_HEADER_BYTES};
use super::opcode::{FrameKind, Opcode};
use super::records::{Records, RecordsSection};
use super::wire::{
    put_bool, put_bytes, put_count, put_str, put_u16, put_u32, put_u64, put_u8, DecodeError,
    EncodeError, Reader,
};
use super::{HELLO_VERSION, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};

/// The server's answer to HELLO: the chosen version and the limits it enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloResponse<'a> {
    /// The protocol version every later frame of the connection uses.
    pub version: u8,
    /// True when the client must send AUTH before any other request.
    pub auth_required: bool,
    /// Largest `frame_len` the server accepts (and sends).
    pub frame_bytes_max: u32,
    /// Largest SEND payload the server accepts.
    pub payload_bytes_max: u32,
    /// Requests one connection may have in flight.
    pub requests_in_flight_max: u32,
    pub server_name: &'a str,
}

/// One named counter of STATS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat<'a> {
    pub name: &'a str,
    pub value: u64,
}

/// One text figure of INFO (format-spec/protocol.md 4.24).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InfoItem<'a> {
    pub name: &'a str,
    pub value: &'a str,
}

/// One member of a replica set as CLUSTER reports it
/// (format-spec/protocol.md 4.32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClusterMember<'a> {
    pub node_id: u64,
    /// Where its clients connect (`host:port`).
    pub client_addr: &'a str,
}

/// The answer to CLUSTER (format-spec/protocol.md 4.32).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMap<'a> {
    /// The answering node's id; 0 on a node that is no replica set member
    /// (then `leader_id` is 0 and `members` empty).
    pub node_id: u64,
    /// The leader as the answering node knows it; 0 when unknown.
    pub leader_id: u64,
    /// Every member, the answering node included, by ascending id.
    pub members: Vec<ClusterMember<'a>>,
}

/// One replica set of a cluster as CLUSTER_MAP reports it
/// (format-spec/protocol.md 4.33).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaSetEntry<'a> {
    pub set_id: u32,
    /// Its leader as the answering node knows it; 0 when unknown (always
    /// for another set than the answering node's, in this version).
    pub leader_id: u64,
    /// Its members by ascending id; empty on a single node (the node the
    /// client connected to is the set).
    pub members: Vec<ClusterMember<'a>>,
}

/// The answer to CLUSTER_MAP (format-spec/protocol.md 4.33): the cluster's
/// replica sets and which owns each shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardMap<'a> {
    /// The map's epoch (0: a single node, or one replica set started
    /// without a map file).
    pub epoch: u64,
    /// The answering node's id (0 on a single node).
    pub node_id: u64,
    /// The answering node's set.
    pub set_id: u32,
    /// Shards of the cluster: [`SHARD_COUNT`](crate::shards::SHARD_COUNT).
    pub shard_count: u32,
    /// Every set, by ascending id.
    pub sets: Vec<ReplicaSetEntry<'a>>,
    /// The shard table as ascending ranges (`ShardTable::ranges`).
    pub ranges: Vec<crate::shards::ShardRange>,
}

/// One request the slow log kept (format-spec/protocol.md 4.25).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlowLogEntry<'a> {
    /// 1 for the first slow request since the node started, then dense.
    pub id: u64,
    /// When its response was queued, in ms since the Unix epoch.
    pub unix_ms: u64,
    /// From handling the request to queueing its response, in nanoseconds.
    pub duration_ns: u64,
    /// The request's opcode byte (a client may meet one it does not know).
    pub opcode: u8,
    /// The client's address, as `ip:port`.
    pub client: &'a str,
    /// A short summary of the request's arguments (no payload bytes).
    pub args: &'a str,
}

/// The SLOWLOG response (format-spec/protocol.md 4.25).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlowLog<'a> {
    /// Requests that took at least this long are kept.
    pub threshold_us: u64,
    /// The most entries the log keeps (the oldest go first).
    pub entries_max: u32,
    /// Entries the log held when the request was handled.
    pub held: u32,
    /// Slow requests recorded since the node started (kept or not).
    pub recorded: u64,
    /// Newest first.
    pub entries: Vec<SlowLogEntry<'a>>,
}

/// The outcome of one BATCH_ACK item, in request order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchAckResult {
    pub group: u64,
    /// `None` when the item succeeded (status 0 on the wire).
    pub error: Option<ErrorCode>,
    /// The cursor after the item (0 if the group or membership is unknown).
    pub cursor: u64,
}

/// One group of UNREAD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnreadEntry {
    pub group: u64,
    pub head: u64,
    pub cursor: u64,
    /// `head - cursor`.
    pub unread: u64,
}

/// One group of SYNC with its first page of records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncGroup<R> {
    /// The group's counts, the same 32 bytes as its UNREAD entry.
    pub entry: UnreadEntry,
    pub records: R,
}

/// One member of MEMBERS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberEntry {
    pub user: u64,
    /// The member's cursor (`last_ack_msg_id`).
    pub cursor: u64,
}

/// One message of RECEIPT_COUNTS: how many members' cursors are at or
/// above it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReceiptCount {
    pub msg_id: u64,
    /// Members whose cursor is at or above `msg_id` when the push was made.
    pub count: u64,
}

/// A group's retention policy as GROUP_INFO reports it; all zero (the
/// default) keeps every message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Messages every member acknowledged may be dropped.
    pub by_cursor: bool,
    /// Messages older than this may be dropped; 0 = no age limit.
    pub max_age_ms: u64,
    /// The oldest messages may be dropped while the group's log is larger;
    /// 0 = no size limit.
    pub max_bytes: u64,
}

/// The BACKUP response: the end of a snapshot's stream (format-spec/
/// protocol.md, BACKUP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupEnd {
    /// The checkpoint the snapshot copies.
    pub checkpoint_seq: u64,
    /// Its journal prefix ends in this journal file, at this length.
    pub journal_seq: u64,
    pub journal_len: u64,
    /// How long beginning the snapshot held the node's writes back, in
    /// microseconds.
    pub pause_us: u64,
    /// Files sent, and their bytes in all.
    pub files: u32,
    pub bytes: u64,
}

/// Part of one file of a snapshot: `data` is bytes `offset..offset +
/// data.len()` of the file `name` (relative to the data directory,
/// `/`-separated), which has `file_len` bytes in the snapshot. `crc32` is
/// the CRC-32 of `data`, checked when decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupChunk<'a> {
    pub name: &'a str,
    pub file_len: u64,
    pub offset: u64,
    pub crc32: u32,
    pub data: &'a [u8],
}

/// A BACKUP_CHUNK's bytes besides its name and data, the length prefix and
/// header included: a node sizes its chunks to `frame_bytes_max` with it.
pub const BACKUP_CHUNK_FIXED_BYTES: usize = FRAME_HEADER_BYTES + 4 + 8 + 8 + 4 + 4;

/// The answer to GROUP_INFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    /// The newest committed msg_id (0: none yet).
    pub head: u64,
    /// The oldest stored msg_id, the retention floor (1 until retention
    /// drops messages; `head + 1` when nothing is stored).
    pub floor: u64,
    pub member_count: u64,
    pub retention: RetentionPolicy,
}

/// What a RESYNC covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResyncScope {
    /// Pushes of this group were dropped; later pushes of it may follow.
    Group(u64),
    /// The connection's whole subscription was cancelled.
    All,
}

/// An ERROR frame's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorResponse<'a> {
    pub code: ErrorCode,
    /// A number whose meaning depends on the code (see the error table).
    pub detail: Option<u64>,
    /// Human-readable; clients must not parse it.
    pub message: &'a str,
}

/// A frame the server sends: the response to a request, ERROR, PUSH or
/// RESYNC. `R` is how records sections are held: [`Records`] (bytes in one
/// buffer: decoding, the all-in-one encoder) or
/// [`RecordsLen`](super::records::RecordsLen) (the caller writes them).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response<'a, R = Records<'a>> {
    Hello(HelloResponse<'a>),
    Auth,
    Pong,
    Stats(Vec<Stat<'a>>),
    Info(Vec<InfoItem<'a>>),
    Cluster(ClusterMap<'a>),
    /// CLUSTER_CHANGE's answer (4.34): the membership once the change
    /// applied, in CLUSTER's layout.
    ClusterChange(ClusterMap<'a>),
    ClusterMap(ShardMap<'a>),
    SlowLog(SlowLog<'a>),
    CreateGroup,
    DeleteGroup,
    Join {
        cursor: u64,
        head: u64,
    },
    Leave,
    SetRetention,
    ClearHistory {
        /// The member's join point now: the first msg_id its HISTORY,
        /// PULL and SYNC may return.
        join_point: u64,
        /// The member's cursor now (at least `join_point − 1`).
        cursor: u64,
    },
    Send {
        msg_id: u64,
        timestamp_ms: u64,
        /// True when this was a retransmit: nothing new was stored.
        duplicate: bool,
    },
    /// Version 2: the Recall record stored (or, for a retransmit, the
    /// original's); same layout as SEND's.
    Recall {
        msg_id: u64,
        timestamp_ms: u64,
        duplicate: bool,
    },
    /// Version 2: the Edit record stored; same layout as SEND's.
    Edit {
        msg_id: u64,
        timestamp_ms: u64,
        duplicate: bool,
    },
    Pull {
        /// The member's cursor after the request's ack.
        cursor: u64,
        head: u64,
        /// More records exist above the last one returned.
        has_more: bool,
        records: R,
    },
    Ack {
        cursor: u64,
    },
    BatchAck(Vec<BatchAckResult>),
    Unread(Vec<UnreadEntry>),
    Sync {
        /// Group id to pass as the next SYNC's continuation; 0 when done.
        next_continuation: u64,
        groups: Vec<SyncGroup<R>>,
    },
    History {
        /// Older records are still stored below the last one returned.
        has_more: bool,
        /// Newest first.
        records: R,
    },
    /// Version 2 (4.30): messages in their latest state, newest first.
    HistoryLatest {
        /// Older messages may be stored below `next_before`.
        has_more: bool,
        /// The next page's `before_msg_id`: the oldest id this page covered.
        next_before: u64,
        records: R,
    },
    ReadCount {
        count: u64,
    },
    Members {
        /// Members above the last one listed remain.
        has_more: bool,
        /// Ascending user ids.
        members: Vec<MemberEntry>,
    },
    GroupInfo(GroupInfo),
    Readers {
        /// The `after_user` of the next page; 0 when every member was
        /// examined.
        next_after_user: u64,
        /// Members whose cursor is at or above the request's `msg_id`,
        /// ascending user ids.
        readers: Vec<MemberEntry>,
    },
    Subscribe,
    Unsubscribe,
    SubscribeReceipts,
    /// Server-initiated (request id 0): new records of a subscribed group.
    Push {
        group: u64,
        records: R,
    },
    /// Server-initiated (request id 0): pushes were dropped; pull.
    Resync(ResyncScope),
    /// Server-initiated (request id 0): members whose cursor moved in a
    /// group of a receipt subscription, each once with its latest cursor.
    Receipt {
        group: u64,
        /// At least one; ascending user ids.
        receipts: Vec<MemberEntry>,
    },
    /// Server-initiated (request id 0): in a group above the receipt
    /// threshold, the read counts of `sender`'s recent messages.
    ReceiptCounts {
        group: u64,
        sender: u64,
        /// At least one; ascending msg ids.
        counts: Vec<ReceiptCount>,
    },
    /// The end of a BACKUP's stream.
    Backup(BackupEnd),
    /// Part of a file of a BACKUP's snapshot (the BACKUP's request id).
    BackupChunk(BackupChunk<'a>),
    Error(ErrorResponse<'a>),
}

impl<R> Response<'_, R> {
    /// The frame kind (and so the opcode byte) of this response.
    pub fn kind(&self) -> FrameKind {
        let op = match self {
            Response::Push { .. } => return FrameKind::Push,
            Response::Resync(_) => return FrameKind::Resync,
            Response::Receipt { .. } => return FrameKind::Receipt,
            Response::ReceiptCounts { .. } => return FrameKind::ReceiptCounts,
            Response::BackupChunk(_) => return FrameKind::BackupChunk,
            Response::Error(_) => return FrameKind::Error,
            Response::Hello(_) => Opcode::Hello,
            Response::Auth => Opcode::Auth,
            Response::Pong => Opcode::Ping,
            Response::Stats(_) => Opcode::Stats,
            Response::Backup(_) => Opcode::Backup,
            Response::Info(_) => Opcode::Info,
            Response::Cluster(_) => Opcode::Cluster,
            Response::ClusterChange(_) => Opcode::ClusterChange,
            Response::ClusterMap(_) => Opcode::ClusterMap,
            Response::SlowLog(_) => Opcode::SlowLog,
            Response::CreateGroup => Opcode::CreateGroup,
            Response::DeleteGroup => Opcode::DeleteGroup,
            Response::Join { .. } => Opcode::Join,
            Response::Leave => Opcode::Leave,
            Response::SetRetention => Opcode::SetRetention,
            Response::ClearHistory { .. } => Opcode::ClearHistory,
            Response::Send { .. } => Opcode::Send,
            Response::Recall { .. } => Opcode::Recall,
            Response::Edit { .. } => Opcode::Edit,
            Response::Pull { .. } => Opcode::Pull,
            Response::Ack { .. } => Opcode::Ack,
            Response::BatchAck(_) => Opcode::BatchAck,
            Response::Unread(_) => Opcode::Unread,
            Response::Sync { .. } => Opcode::Sync,
            Response::History { .. } => Opcode::History,
            Response::HistoryLatest { .. } => Opcode::HistoryLatest,
            Response::ReadCount { .. } => Opcode::ReadCount,
            Response::Members { .. } => Opcode::Members,
            Response::GroupInfo(_) => Opcode::GroupInfo,
            Response::Readers { .. } => Opcode::Readers,
            Response::Subscribe => Opcode::Subscribe,
            Response::Unsubscribe => Opcode::Unsubscribe,
            Response::SubscribeReceipts => Opcode::SubscribeReceipts,
        };
        FrameKind::Response(op)
    }
}

const STAT_BYTES_MIN: usize = 12;
/// Smallest INFO item: two empty strings.
const INFO_ITEM_BYTES_MIN: usize = 8;
/// Smallest CLUSTER member: its id and an empty address.
const CLUSTER_MEMBER_BYTES_MIN: usize = 12;
/// Smallest CLUSTER_MAP set: its id, its leader, no members.
const REPLICA_SET_BYTES_MIN: usize = 4 + 8 + 4;
/// A CLUSTER_MAP shard range: first, last, set id.
const SHARD_RANGE_BYTES: usize = 2 + 2 + 4;
/// Smallest slow log entry: three u64, the opcode, two empty strings.
pub const SLOW_LOG_ENTRY_BYTES_MIN: usize = 8 * 3 + 1 + 4 + 4;
/// The fixed part of a SLOWLOG response, frame header included.
pub const SLOW_LOG_RESPONSE_FIXED_BYTES: usize = 16 + 8 + 4 + 4 + 8 + 4;
const BATCH_ACK_RESULT_BYTES: usize = 18;
const UNREAD_ENTRY_BYTES: usize = 32;
/// Bytes of one MEMBERS entry (user, cursor).
pub const MEMBER_ENTRY_BYTES: usize = 16;
/// A MEMBERS response's bytes besides its entries, its length prefix
/// included: the frame header, `has_more` and the list count. A node fits
/// its pages to `frame_bytes_max` with it.
pub const MEMBERS_RESPONSE_FIXED_BYTES: usize = FRAME_HEADER_BYTES + 1 + 4;
/// Bytes of one RECEIPT_COUNTS entry (msg_id, count).
pub const RECEIPT_COUNT_BYTES: usize = 16;
/// A READERS response's bytes besides its entries, its length prefix
/// included: the frame header, `next_after_user` and the list count.
pub const READERS_RESPONSE_FIXED_BYTES: usize = FRAME_HEADER_BYTES + 8 + 4;
/// A RECEIPT frame's bytes besides its entries, its length prefix included:
/// the frame header, `group` and the list count. A node splits a round's
/// receipts of one group into frames that fit `frame_bytes_max` with it.
pub const RECEIPT_FIXED_BYTES: usize = FRAME_HEADER_BYTES + 8 + 4;
/// A SYNC group's fixed part: its UNREAD entry and its records-section count
/// (protocol.md, SYNC response); a node budgets its frame with it.
pub const SYNC_GROUP_BYTES: usize = UNREAD_ENTRY_BYTES + 8;

/// Checks the request id against the frame kind: PUSH and RESYNC carry 0,
/// ERROR any id (0: about the connection), every other response nonzero.
fn request_id_error(kind: FrameKind, request_id: u64) -> Option<&'static str> {
    match kind {
        FrameKind::Push | FrameKind::Resync | FrameKind::Receipt | FrameKind::ReceiptCounts
            if request_id != 0 =>
        {
            Some("server-initiated frames carry request id 0")
        }
        FrameKind::Response(_) | FrameKind::BackupChunk if request_id == 0 => {
            Some("responses carry their request's nonzero id")
        }
        _ => None,
    }
}

/// Appends the whole frame of `resp`, records included, to `out`, in the
/// oldest version that has it (1 but for RECALL's and EDIT's, 2).
pub fn encode_response(
    request_id: u64,
    resp: &Response<'_, Records<'_>>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    encode_frame(oldest_version(resp), request_id, resp, out, true)
}

/// The oldest protocol version with `resp`'s frame.
fn oldest_version<R: RecordsSection>(resp: &Response<'_, R>) -> u8 {
    match resp.kind() {
        FrameKind::Response(op) => op.since().max(PROTOCOL_VERSION_MIN),
        _ => PROTOCOL_VERSION_MIN,
    }
}

/// [`encode_response`] in the negotiated `version` (HELLO's response
/// always carries 1).
pub fn encode_response_in(
    version: u8,
    request_id: u64,
    resp: &Response<'_, Records<'_>>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    encode_frame(version, request_id, resp, out, true)
}

/// Encodes `resp` up to its records: the frame header (whose length counts
/// the records) and every fixed field. The caller sends the returned bytes,
/// then each records section's bytes in order (for SYNC: group after group),
/// e.g. with writev straight from the stored segments.
/// The head is a frame of the oldest version that has it (as
/// [`encode_response`]); a node serving a session of another version sets
/// its version byte with [`set_version`].
pub fn encode_response_head<R: RecordsSection>(
    request_id: u64,
    resp: &Response<'_, R>,
) -> Result<Vec<u8>, EncodeError> {
    encode_response_head_in(oldest_version(resp), request_id, resp)
}

/// [`encode_response_head`] in the negotiated `version`.
pub fn encode_response_head_in<R: RecordsSection>(
    version: u8,
    request_id: u64,
    resp: &Response<'_, R>,
) -> Result<Vec<u8>, EncodeError> {
    let mut out = Vec::with_capacity(64);
    encode_frame(version, request_id, resp, &mut out, false)?;
    Ok(out)
}

/// Sets the version byte of an encoded frame's head to the session's
/// `version`, except for HELLO's response, which carries 1 in every
/// version (format-spec/protocol.md 7). A head shorter than the header
/// is left alone.
pub fn set_version(head: &mut [u8], version: u8) {
    if head.len() >= FRAME_HEADER_BYTES && head[5] != Opcode::Hello.response_byte() {
        head[4] = version;
    }
}

fn encode_frame<R: RecordsSection>(
    version: u8,
    request_id: u64,
    resp: &Response<'_, R>,
    out: &mut Vec<u8>,
    inline: bool,
) -> Result<(), EncodeError> {
    let kind = resp.kind();
    if let Some(reason) = request_id_error(kind, request_id) {
        return Err(EncodeError::BadRequestId { request_id, reason });
    }
    let version = match kind {
        FrameKind::Response(Opcode::Hello) => HELLO_VERSION,
        FrameKind::Response(op) if op.since() > version => {
            return Err(EncodeError::NotInVersion {
                what: op.name(),
                version,
            })
        }
        _ => version,
    };
    let start = begin_frame(out, version, kind.byte(), request_id);
    let mut trailing = 0u64;
    let result = encode_body(resp, out, inline, &mut trailing)
        .and_then(|()| finish_frame(out, start, trailing));
    if result.is_err() {
        out.truncate(start);
    }
    result
}

/// `record_count: u32 | records_bytes: u32` of a records section.
fn put_section_header<R: RecordsSection>(out: &mut Vec<u8>, s: &R) -> Result<(), EncodeError> {
    put_u32(out, s.count());
    put_count(out, s.byte_len(), "records_bytes")
}

/// The records themselves, or their length added to `trailing`.
fn put_section_bytes<R: RecordsSection>(
    out: &mut Vec<u8>,
    s: &R,
    inline: bool,
    trailing: &mut u64,
) {
    match s.inline_bytes() {
        Some(b) if inline => out.extend_from_slice(b),
        _ => *trailing = trailing.saturating_add(s.byte_len() as u64),
    }
}

/// An UNREAD entry, also the start of a SYNC group.
// Format: { group: u64 | head: u64 | cursor: u64 | unread: u64 }
fn put_unread_entry(out: &mut Vec<u8>, e: &UnreadEntry) {
    put_u64(out, e.group);
    put_u64(out, e.head);
    put_u64(out, e.cursor);
    put_u64(out, e.unread);
}

/// A list of (user, cursor) pairs: MEMBERS, READERS, RECEIPT.
// Format: list<{ user: u64 | cursor: u64 }>
fn put_members(
    out: &mut Vec<u8>,
    members: &[MemberEntry],
    field: &'static str,
) -> Result<(), EncodeError> {
    put_count(out, members.len(), field)?;
    for m in members {
        put_u64(out, m.user);
        put_u64(out, m.cursor);
    }
    Ok(())
}

/// The list [`put_members`] writes.
// Format: list<{ user: u64 | cursor: u64 }>
fn member_list(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<MemberEntry>, DecodeError> {
    let n = r.count(field, MEMBER_ENTRY_BYTES)?;
    let mut members = Vec::with_capacity(n);
    for _ in 0..n {
        members.push(MemberEntry {
            user: r.u64("user")?,
            cursor: r.u64("cursor")?,
        });
    }
    Ok(members)
}

/// A RECEIPT or RECEIPT_COUNTS list must not be empty: a push says
/// something or is not sent.
fn nonempty<T>(list: Vec<T>, field: &'static str, offset: usize) -> Result<Vec<T>, DecodeError> {
    if list.is_empty() {
        return Err(DecodeError::InvalidValue {
            field,
            offset,
            value: 0,
        });
    }
    Ok(list)
}

fn encode_body<R: RecordsSection>(
    resp: &Response<'_, R>,
    out: &mut Vec<u8>,
    inline: bool,
    trailing: &mut u64,
) -> Result<(), EncodeError> {
    match resp {
        Response::Hello(h) => {
            // Format: { version: u8 | auth_required: bool | frame_bytes_max: u32 |
            //           payload_bytes_max: u32 | requests_in_flight_max: u32 |
            //           server_name: string }
            put_u8(out, h.version);
            put_bool(out, h.auth_required);
            put_u32(out, h.frame_bytes_max);
            put_u32(out, h.payload_bytes_max);
            put_u32(out, h.requests_in_flight_max);
            put_str(out, h.server_name, "server_name")?;
        }
        // Format: {} (empty body)
        Response::Auth
        | Response::Pong
        | Response::CreateGroup
        | Response::DeleteGroup
        | Response::Leave
        | Response::SetRetention
        | Response::Subscribe
        | Response::Unsubscribe
        | Response::SubscribeReceipts => {}
        Response::ClearHistory { join_point, cursor } => {
            // Format: { join_point: u64 | cursor: u64 }
            put_u64(out, *join_point);
            put_u64(out, *cursor);
        }
        Response::Stats(stats) => {
            // Format: { stats: list<{ name: string | value: u64 }> }
            put_count(out, stats.len(), "stats")?;
            for s in stats {
                put_str(out, s.name, "stats.name")?;
                put_u64(out, s.value);
            }
        }
        Response::Info(items) => {
            // Format: { items: list<{ name: string | value: string }> }
            put_count(out, items.len(), "items")?;
            for i in items {
                put_str(out, i.name, "items.name")?;
                put_str(out, i.value, "items.value")?;
            }
        }
        Response::Cluster(m) | Response::ClusterChange(m) => {
            // Format: { node_id: u64 | leader_id: u64 |
            //           members: list<{ node_id: u64 | client_addr: string }> }
            put_u64(out, m.node_id);
            put_u64(out, m.leader_id);
            put_count(out, m.members.len(), "members")?;
            for member in &m.members {
                put_u64(out, member.node_id);
                put_str(out, member.client_addr, "members.client_addr")?;
            }
        }
        Response::ClusterMap(m) => {
            // Format: { epoch: u64 | node_id: u64 | set_id: u32 | shard_count: u32 |
            //           sets: list<{ set_id: u32 | leader_id: u64 |
            //             members: list<{ node_id: u64 | client_addr: string }> }> |
            //           ranges: list<{ first_shard: u16 | last_shard: u16 | set_id: u32 }> }
            put_u64(out, m.epoch);
            put_u64(out, m.node_id);
            put_u32(out, m.set_id);
            put_u32(out, m.shard_count);
            put_count(out, m.sets.len(), "sets")?;
            for set in &m.sets {
                put_u32(out, set.set_id);
                put_u64(out, set.leader_id);
                put_count(out, set.members.len(), "sets.members")?;
                for member in &set.members {
                    put_u64(out, member.node_id);
                    put_str(out, member.client_addr, "sets.members.client_addr")?;
                }
            }
            put_count(out, m.ranges.len(), "ranges")?;
            for range in &m.ranges {
                put_u16(out, range.first);
                put_u16(out, range.last);
                put_u32(out, range.set_id);
            }
        }
        Response::SlowLog(l) => {
            // Format: { threshold_us: u64 | entries_max: u32 | held: u32 |
            //           recorded: u64 | entries: list<{ id: u64 | unix_ms: u64 |
            //           duration_ns: u64 | opcode: u8 | client: string |
            //           args: string }> }
            put_u64(out, l.threshold_us);
            put_u32(out, l.entries_max);
            put_u32(out, l.held);
            put_u64(out, l.recorded);
            put_count(out, l.entries.len(), "entries")?;
            for e in &l.entries {
                put_u64(out, e.id);
                put_u64(out, e.unix_ms);
                put_u64(out, e.duration_ns);
                put_u8(out, e.opcode);
                put_str(out, e.client, "entries.client")?;
                put_str(out, e.args, "entries.args")?;
            }
        }
        Response::Join { cursor, head } => {
            // Format: { cursor: u64 | head: u64 }
            put_u64(out, *cursor);
            put_u64(out, *head);
        }
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
        } => {
            // Format: { msg_id: u64 | timestamp_ms: u64 | duplicate: bool }
            put_u64(out, *msg_id);
            put_u64(out, *timestamp_ms);
            put_bool(out, *duplicate);
        }
        Response::Pull {
            cursor,
            head,
            has_more,
            records,
        } => {
            // Format: { cursor: u64 | head: u64 | has_more: bool | record_count: u32 |
            //           records_bytes: u32 | records }
            put_u64(out, *cursor);
            put_u64(out, *head);
            put_bool(out, *has_more);
            put_section_header(out, records)?;
            put_section_bytes(out, records, inline, trailing);
        }
        Response::Ack { cursor } => {
            // Format: { cursor: u64 }
            put_u64(out, *cursor);
        }
        Response::BatchAck(items) => {
            // Format: { items: list<{ group: u64 | status: u16 | cursor: u64 }> }
            put_count(out, items.len(), "items")?;
            for it in items {
                put_u64(out, it.group);
                put_u16(out, it.error.map_or(STATUS_OK, ErrorCode::code));
                put_u64(out, it.cursor);
            }
        }
        Response::Unread(groups) => {
            // Format: { groups: list<{ group: u64 | head: u64 | cursor: u64 | unread: u64 }> }
            put_count(out, groups.len(), "groups")?;
            for g in groups {
                put_unread_entry(out, g);
            }
        }
        Response::Sync {
            next_continuation,
            groups,
        } => {
            // Format: { next_continuation: u64 | groups: list<{ group: u64 | head: u64 |
            //           cursor: u64 | unread: u64 | record_count: u32 | records_bytes: u32 }> |
            //           records of every group, in list order }
            put_u64(out, *next_continuation);
            put_count(out, groups.len(), "groups")?;
            for g in groups {
                put_unread_entry(out, &g.entry);
                put_section_header(out, &g.records)?;
            }
            for g in groups {
                put_section_bytes(out, &g.records, inline, trailing);
            }
        }
        Response::History { has_more, records } => {
            // Format: { has_more: bool | record_count: u32 | records_bytes: u32 | records }
            put_bool(out, *has_more);
            put_section_header(out, records)?;
            put_section_bytes(out, records, inline, trailing);
        }
        Response::HistoryLatest {
            has_more,
            next_before,
            records,
        } => {
            // Format: { has_more: bool | next_before: u64 | record_count: u32 |
            //           records_bytes: u32 | records }
            put_bool(out, *has_more);
            put_u64(out, *next_before);
            put_section_header(out, records)?;
            put_section_bytes(out, records, inline, trailing);
        }
        Response::ReadCount { count } => {
            // Format: { count: u64 }
            put_u64(out, *count);
        }
        Response::Members { has_more, members } => {
            // Format: { has_more: bool | members: list<{ user: u64 | cursor: u64 }> }
            put_bool(out, *has_more);
            put_count(out, members.len(), "members")?;
            for m in members {
                put_u64(out, m.user);
                put_u64(out, m.cursor);
            }
        }
        Response::GroupInfo(g) => {
            // Format: { head: u64 | floor: u64 | member_count: u64 |
            //           retention_by_cursor: bool | retention_max_age_ms: u64 |
            //           retention_max_bytes: u64 }
            put_u64(out, g.head);
            put_u64(out, g.floor);
            put_u64(out, g.member_count);
            put_bool(out, g.retention.by_cursor);
            put_u64(out, g.retention.max_age_ms);
            put_u64(out, g.retention.max_bytes);
        }
        Response::Readers {
            next_after_user,
            readers,
        } => {
            // Format: { next_after_user: u64 | readers: list<{ user: u64 | cursor: u64 }> }
            put_u64(out, *next_after_user);
            put_members(out, readers, "readers")?;
        }
        Response::Push { group, records } => {
            // Format: { group: u64 | record_count: u32 | records_bytes: u32 | records }
            put_u64(out, *group);
            put_section_header(out, records)?;
            put_section_bytes(out, records, inline, trailing);
        }
        Response::Receipt { group, receipts } => {
            // Format: { group: u64 | receipts: list<{ user: u64 | cursor: u64 }> }
            put_u64(out, *group);
            put_members(out, receipts, "receipts")?;
        }
        Response::ReceiptCounts {
            group,
            sender,
            counts,
        } => {
            // Format: { group: u64 | sender: u64 | counts: list<{ msg_id: u64 | count: u64 }> }
            put_u64(out, *group);
            put_u64(out, *sender);
            put_count(out, counts.len(), "counts")?;
            for c in counts {
                put_u64(out, c.msg_id);
                put_u64(out, c.count);
            }
        }
        Response::Resync(scope) => {
            // Format: { all: bool | group: u64 }
            let (all, group) = match scope {
                ResyncScope::All => (true, 0),
                ResyncScope::Group(g) => (false, *g),
            };
            put_bool(out, all);
            put_u64(out, group);
        }
        Response::Backup(b) => {
            // Format: { checkpoint_seq: u64 | journal_seq: u64 | journal_len: u64 |
            //           pause_us: u64 | files: u32 | bytes: u64 }
            put_u64(out, b.checkpoint_seq);
            put_u64(out, b.journal_seq);
            put_u64(out, b.journal_len);
            put_u64(out, b.pause_us);
            put_u32(out, b.files);
            put_u64(out, b.bytes);
        }
        Response::BackupChunk(c) => {
            // Format: { name: string | file_len: u64 | offset: u64 | crc32: u32 | data: bytes }
            put_str(out, c.name, "name")?;
            put_u64(out, c.file_len);
            put_u64(out, c.offset);
            put_u32(out, c.crc32);
            put_bytes(out, c.data, "data")?;
        }
        Response::Error(e) => {
            // Format: { code: u16 | has_detail: bool | detail: u64 | message: string }
            put_u16(out, e.code.code());
            put_bool(out, e.detail.is_some());
            put_u64(out, e.detail.unwrap_or(0));
            put_str(out, e.message, "message")?;
        }
    }
    Ok(())
}

/// Decodes a frame the server sent: checks the header (version, a response,
/// ERROR, PUSH or RESYNC opcode, no flags, request id rule), then the body,
/// including that records sections are whole records, rejecting trailing
/// bytes. Record CRCs are checked by [`Records::iter`] on request.
pub fn decode_response<'a>(frame: &Frame<'a>) -> Result<Response<'a>, DecodeError> {
    let h = &frame.header;
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&h.version) {
        return Err(DecodeError::UnsupportedVersion { version: h.version });
    }
    let kind = match FrameKind::from_byte(h.opcode) {
        Some(FrameKind::Request(_)) | None => {
            return Err(DecodeError::UnknownOpcode {
                opcode: h.opcode,
                expected: "response",
            })
        }
        // The response of a later version's request, or a HELLO response
        // in another version than 1, is unknown in this frame's version.
        Some(FrameKind::Response(op))
            if h.version < op.since() || (op == Opcode::Hello && h.version != HELLO_VERSION) =>
        {
            return Err(DecodeError::UnknownOpcode {
                opcode: h.opcode,
                expected: "response of this version",
            })
        }
        Some(k) => k,
    };
    if h.flags != 0 {
        return Err(DecodeError::UnknownFlags { flags: h.flags });
    }
    if let Some(reason) = request_id_error(kind, h.request_id) {
        return Err(DecodeError::BadRequestId {
            request_id: h.request_id,
            reason,
        });
    }
    let mut r = Reader::new(frame.body, FRAME_HEADER_BYTES);
    let resp = decode_body(kind, h.version, &mut r)?;
    r.finish()?;
    Ok(resp)
}

/// `record_count: u32 | records_bytes: u32`.
fn section_header(r: &mut Reader<'_>) -> Result<(u32, u32), DecodeError> {
    Ok((r.u32("record_count")?, r.u32("records_bytes")?))
}

/// Takes a section's bytes and checks that `count` whole records tile them.
/// `version` says which kinds and flags a record may have (2.1).
fn section_bytes<'a>(
    r: &mut Reader<'a>,
    (count, len): (u32, u32),
    version: u8,
) -> Result<Records<'a>, DecodeError> {
    let offset = r.offset();
    let bytes = r.take(len as usize, "records")?;
    let records = Records { count, bytes };
    for rec in records.iter_in(version, false) {
        if let Err(e) = rec {
            use super::records::RecordsError as E;
            let (at, reason) = match e {
                E::Truncated { offset, .. } => (offset, "a record runs past the section"),
                E::BadLength { offset, .. } => (offset, "a record_len below 44"),
                E::CountMismatch { .. } => (0, "record_count differs from the records present"),
                E::BadCrc { offset, .. } => (offset, "checksum mismatch"),
                E::Reserved { offset } => (
                    offset,
                    "kind, flags or reserved bytes not valid in this version",
                ),
            };
            return Err(DecodeError::BadRecords {
                offset: offset + at,
                reason,
            });
        }
    }
    Ok(records)
}

/// An UNREAD entry, also the start of a SYNC group.
// Format: { group: u64 | head: u64 | cursor: u64 | unread: u64 }
fn unread_entry(r: &mut Reader<'_>) -> Result<UnreadEntry, DecodeError> {
    Ok(UnreadEntry {
        group: r.u64("groups.group")?,
        head: r.u64("groups.head")?,
        cursor: r.u64("groups.cursor")?,
        unread: r.u64("groups.unread")?,
    })
}

fn decode_body<'a>(
    kind: FrameKind,
    version: u8,
    r: &mut Reader<'a>,
) -> Result<Response<'a>, DecodeError> {
    let op = match kind {
        FrameKind::Response(op) => op,
        FrameKind::Push => {
            // Format: { group: u64 | record_count: u32 | records_bytes: u32 | records }
            let group = r.u64("group")?;
            let section = section_header(r)?;
            let records = section_bytes(r, section, version)?;
            return Ok(Response::Push { group, records });
        }
        FrameKind::Receipt => {
            // Format: { group: u64 | receipts: list<{ user: u64 | cursor: u64 }> }
            let group = r.id("group")?;
            let at = r.offset();
            let receipts = nonempty(member_list(r, "receipts")?, "receipts (count)", at)?;
            return Ok(Response::Receipt { group, receipts });
        }
        FrameKind::ReceiptCounts => {
            // Format: { group: u64 | sender: u64 | counts: list<{ msg_id: u64 | count: u64 }> }
            let group = r.id("group")?;
            let sender = r.id("sender")?;
            let at = r.offset();
            let n = r.count("counts", RECEIPT_COUNT_BYTES)?;
            let mut counts = Vec::with_capacity(n);
            for _ in 0..n {
                counts.push(ReceiptCount {
                    msg_id: r.u64("counts.msg_id")?,
                    count: r.u64("counts.count")?,
                });
            }
            let counts = nonempty(counts, "counts (count)", at)?;
            return Ok(Response::ReceiptCounts {
                group,
                sender,
                counts,
            });
        }
        FrameKind::Resync => {
            // Format: { all: bool | group: u64 }
            let scope = if r.bool("all")? {
                r.zero_u64("group (must be 0 when all)")?;
                ResyncScope::All
            } else {
                ResyncScope::Group(r.u64("group")?)
            };
            return Ok(Response::Resync(scope));
        }
        FrameKind::BackupChunk => {
            // Format: { name: string | file_len: u64 | offset: u64 | crc32: u32 | data: bytes }
            let name = r.str("name")?;
            let file_len = r.u64("file_len")?;
            let offset_at = r.offset();
            let offset = r.u64("offset")?;
            let crc_at = r.offset();
            let crc32 = r.u32("crc32")?;
            let data = r.bytes("data")?;
            if offset
                .checked_add(data.len() as u64)
                .is_none_or(|end| end > file_len)
            {
                return Err(DecodeError::InvalidValue {
                    field: "offset (the data ends past file_len)",
                    offset: offset_at,
                    value: offset,
                });
            }
            if crc32fast::hash(data) != crc32 {
                return Err(DecodeError::InvalidValue {
                    field: "crc32 (of data)",
                    offset: crc_at,
                    value: u64::from(crc32),
                });
            }
            return Ok(Response::BackupChunk(BackupChunk {
                name,
                file_len,
                offset,
                crc32,
                data,
            }));
        }
        FrameKind::Error => {
            // Format: { code: u16 | has_detail: bool | detail: u64 | message: string }
            let code_offset = r.offset();
            let Some(code) = ErrorCode::from_code(r.u16("code")?) else {
                return Err(DecodeError::InvalidValue {
                    field: "code",
                    offset: code_offset,
                    value: 0,
                });
            };
            let detail = if r.bool("has_detail")? {
                Some(r.u64("detail")?)
            } else {
                r.zero_u64("detail (must be 0 without has_detail)")?;
                None
            };
            let message = r.str("message")?;
            return Ok(Response::Error(ErrorResponse {
                code,
                detail,
                message,
            }));
        }
        FrameKind::Request(op) => {
            // decode_response rejected request opcodes already.
            return Err(DecodeError::UnknownOpcode {
                opcode: op.request_byte(),
                expected: "response",
            });
        }
    };
    Ok(match op {
        // Format: { version: u8 | auth_required: bool | frame_bytes_max: u32 |
        //           payload_bytes_max: u32 | requests_in_flight_max: u32 |
        //           server_name: string }
        Opcode::Hello => Response::Hello(HelloResponse {
            version: r.u8("version")?,
            auth_required: r.bool("auth_required")?,
            frame_bytes_max: r.u32("frame_bytes_max")?,
            payload_bytes_max: r.u32("payload_bytes_max")?,
            requests_in_flight_max: r.u32("requests_in_flight_max")?,
            server_name: r.str("server_name")?,
        }),
        // Format: {} (empty body)
        Opcode::Auth => Response::Auth,
        Opcode::Ping => Response::Pong,
        Opcode::CreateGroup => Response::CreateGroup,
        Opcode::DeleteGroup => Response::DeleteGroup,
        Opcode::Leave => Response::Leave,
        Opcode::SetRetention => Response::SetRetention,
        // Format: { join_point: u64 | cursor: u64 }
        Opcode::ClearHistory => Response::ClearHistory {
            join_point: r.u64("join_point")?,
            cursor: r.u64("cursor")?,
        },
        Opcode::Subscribe => Response::Subscribe,
        Opcode::Unsubscribe => Response::Unsubscribe,
        Opcode::SubscribeReceipts => Response::SubscribeReceipts,
        // Format: { checkpoint_seq: u64 | journal_seq: u64 | journal_len: u64 |
        //           pause_us: u64 | files: u32 | bytes: u64 }
        Opcode::Backup => Response::Backup(BackupEnd {
            checkpoint_seq: r.u64("checkpoint_seq")?,
            journal_seq: r.u64("journal_seq")?,
            journal_len: r.u64("journal_len")?,
            pause_us: r.u64("pause_us")?,
            files: r.u32("files")?,
            bytes: r.u64("bytes")?,
        }),
        Opcode::Stats => {
            // Format: { stats: list<{ name: string | value: u64 }> }
            let n = r.count("stats", STAT_BYTES_MIN)?;
            let mut stats = Vec::with_capacity(n);
            for _ in 0..n {
                stats.push(Stat {
                    name: r.str("stats.name")?,
                    value: r.u64("stats.value")?,
                });
            }
            Response::Stats(stats)
        }
        Opcode::Info => {
            // Format: { items: list<{ name: string | value: string }> }
            let n = r.count("items", INFO_ITEM_BYTES_MIN)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(InfoItem {
                    name: r.str("items.name")?,
                    value: r.str("items.value")?,
                });
            }
            Response::Info(items)
        }
        Opcode::Cluster | Opcode::ClusterChange => {
            // Format: { node_id: u64 | leader_id: u64 |
            //           members: list<{ node_id: u64 | client_addr: string }> }
            let node_id = r.u64("node_id")?;
            let leader_id = r.u64("leader_id")?;
            let n = r.count("members", CLUSTER_MEMBER_BYTES_MIN)?;
            let mut members = Vec::with_capacity(n);
            for _ in 0..n {
                members.push(ClusterMember {
                    node_id: r.u64("members.node_id")?,
                    client_addr: r.str("members.client_addr")?,
                });
            }
            let m = ClusterMap {
                node_id,
                leader_id,
                members,
            };
            match op {
                Opcode::Cluster => Response::Cluster(m),
                _ => Response::ClusterChange(m),
            }
        }
        Opcode::ClusterMap => {
            // Format: { epoch: u64 | node_id: u64 | set_id: u32 | shard_count: u32 |
            //           sets: list<{ set_id: u32 | leader_id: u64 |
            //             members: list<{ node_id: u64 | client_addr: string }> }> |
            //           ranges: list<{ first_shard: u16 | last_shard: u16 | set_id: u32 }> }
            let epoch = r.u64("epoch")?;
            let node_id = r.u64("node_id")?;
            let set_id = r.u32("set_id")?;
            let shard_count = r.u32("shard_count")?;
            let n = r.count("sets", REPLICA_SET_BYTES_MIN)?;
            let mut sets = Vec::with_capacity(n);
            for _ in 0..n {
                let set_id = r.u32("sets.set_id")?;
                let leader_id = r.u64("sets.leader_id")?;
                let k = r.count("sets.members", CLUSTER_MEMBER_BYTES_MIN)?;
                let mut members = Vec::with_capacity(k);
                for _ in 0..k {
                    members.push(ClusterMember {
                        node_id: r.u64("sets.members.node_id")?,
                        client_addr: r.str("sets.members.client_addr")?,
                    });
                }
                sets.push(ReplicaSetEntry {
                    set_id,
                    leader_id,
                    members,
                });
            }
            let n = r.count("ranges", SHARD_RANGE_BYTES)?;
            let mut ranges = Vec::with_capacity(n);
            for _ in 0..n {
                ranges.push(crate::shards::ShardRange {
                    first: r.u16("ranges.first_shard")?,
                    last: r.u16("ranges.last_shard")?,
                    set_id: r.u32("ranges.set_id")?,
                });
            }
            Response::ClusterMap(ShardMap {
                epoch,
                node_id,
                set_id,
                shard_count,
                sets,
                ranges,
            })
        }
        Opcode::SlowLog => {
            // Format: { threshold_us: u64 | entries_max: u32 | held: u32 |
            //           recorded: u64 | entries: list<{ id: u64 | unix_ms: u64 |
            //           duration_ns: u64 | opcode: u8 | client: string |
            //           args: string }> }
            let threshold_us = r.u64("threshold_us")?;
            let entries_max = r.u32("entries_max")?;
            let held = r.u32("held")?;
            let recorded = r.u64("recorded")?;
            let n = r.count("entries", SLOW_LOG_ENTRY_BYTES_MIN)?;
            let mut entries = Vec::with_capacity(n);
            for _ in 0..n {
                entries.push(SlowLogEntry {
                    id: r.u64("entries.id")?,
                    unix_ms: r.u64("entries.unix_ms")?,
                    duration_ns: r.u64("entries.duration_ns")?,
                    opcode: r.u8("entries.opcode")?,
                    client: r.str("entries.client")?,
                    args: r.str("entries.args")?,
                });
            }
            Response::SlowLog(SlowLog {
                threshold_us,
                entries_max,
                held,
                recorded,
                entries,
            })
        }
        // Format: { cursor: u64 | head: u64 }
        Opcode::Join => Response::Join {
            cursor: r.u64("cursor")?,
            head: r.u64("head")?,
        },
        // Format: { msg_id: u64 | timestamp_ms: u64 | duplicate: bool }
        Opcode::Send => Response::Send {
            msg_id: r.u64("msg_id")?,
            timestamp_ms: r.u64("timestamp_ms")?,
            duplicate: r.bool("duplicate")?,
        },
        // Format: { msg_id: u64 | timestamp_ms: u64 | duplicate: bool }
        Opcode::Recall => Response::Recall {
            msg_id: r.u64("msg_id")?,
            timestamp_ms: r.u64("timestamp_ms")?,
            duplicate: r.bool("duplicate")?,
        },
        // Format: { msg_id: u64 | timestamp_ms: u64 | duplicate: bool }
        Opcode::Edit => Response::Edit {
            msg_id: r.u64("msg_id")?,
            timestamp_ms: r.u64("timestamp_ms")?,
            duplicate: r.bool("duplicate")?,
        },
        Opcode::Pull => {
            // Format: { cursor: u64 | head: u64 | has_more: bool | record_count: u32 |
            //           records_bytes: u32 | records }
            let cursor = r.u64("cursor")?;
            let head = r.u64("head")?;
            let has_more = r.bool("has_more")?;
            let section = section_header(r)?;
            let records = section_bytes(r, section, version)?;
            Response::Pull {
                cursor,
                head,
                has_more,
                records,
            }
        }
        // Format: { cursor: u64 }
        Opcode::Ack => Response::Ack {
            cursor: r.u64("cursor")?,
        },
        Opcode::BatchAck => {
            // Format: { items: list<{ group: u64 | status: u16 | cursor: u64 }> }
            let n = r.count("items", BATCH_ACK_RESULT_BYTES)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(BatchAckResult {
                    group: r.u64("items.group")?,
                    error: ErrorCode::from_code(r.u16("items.status")?),
                    cursor: r.u64("items.cursor")?,
                });
            }
            Response::BatchAck(items)
        }
        Opcode::Unread => {
            // Format: { groups: list<{ group: u64 | head: u64 | cursor: u64 | unread: u64 }> }
            let n = r.count("groups", UNREAD_ENTRY_BYTES)?;
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                groups.push(unread_entry(r)?);
            }
            Response::Unread(groups)
        }
        Opcode::Sync => {
            // Format: { next_continuation: u64 | groups: list<{ group: u64 | head: u64 |
            //           cursor: u64 | unread: u64 | record_count: u32 | records_bytes: u32 }> |
            //           records of every group, in list order }
            let next_continuation = r.u64("next_continuation")?;
            let n = r.count("groups", SYNC_GROUP_BYTES)?;
            let mut heads = Vec::with_capacity(n);
            for _ in 0..n {
                heads.push((unread_entry(r)?, section_header(r)?));
            }
            let mut groups = Vec::with_capacity(n);
            for (entry, section) in heads {
                groups.push(SyncGroup {
                    entry,
                    records: section_bytes(r, section, version)?,
                });
            }
            Response::Sync {
                next_continuation,
                groups,
            }
        }
        Opcode::History => {
            // Format: { has_more: bool | record_count: u32 | records_bytes: u32 | records }
            let has_more = r.bool("has_more")?;
            let section = section_header(r)?;
            let records = section_bytes(r, section, version)?;
            Response::History { has_more, records }
        }
        Opcode::HistoryLatest => {
            // Format: { has_more: bool | next_before: u64 | record_count: u32 |
            //           records_bytes: u32 | records }
            let has_more = r.bool("has_more")?;
            let next_before = r.u64("next_before")?;
            let section = section_header(r)?;
            let records = section_bytes(r, section, version)?;
            Response::HistoryLatest {
                has_more,
                next_before,
                records,
            }
        }
        // Format: { count: u64 }
        Opcode::ReadCount => Response::ReadCount {
            count: r.u64("count")?,
        },
        Opcode::Members => {
            // Format: { has_more: bool | members: list<{ user: u64 | cursor: u64 }> }
            let has_more = r.bool("has_more")?;
            let n = r.count("members", MEMBER_ENTRY_BYTES)?;
            let mut members = Vec::with_capacity(n);
            for _ in 0..n {
                members.push(MemberEntry {
                    user: r.u64("members.user")?,
                    cursor: r.u64("members.cursor")?,
                });
            }
            Response::Members { has_more, members }
        }
        // Format: { next_after_user: u64 | readers: list<{ user: u64 | cursor: u64 }> }
        Opcode::Readers => Response::Readers {
            next_after_user: r.u64("next_after_user")?,
            readers: member_list(r, "readers")?,
        },
        // Format: { head: u64 | floor: u64 | member_count: u64 |
        //           retention_by_cursor: bool | retention_max_age_ms: u64 |
        //           retention_max_bytes: u64 }
        Opcode::GroupInfo => Response::GroupInfo(GroupInfo {
            head: r.u64("head")?,
            floor: r.u64("floor")?,
            member_count: r.u64("member_count")?,
            retention: RetentionPolicy {
                by_cursor: r.bool("retention_by_cursor")?,
                max_age_ms: r.u64("retention_max_age_ms")?,
                max_bytes: r.u64("retention_max_bytes")?,
            },
        }),
    })
}
