//! Request -> engine call -> response, one function per opcode. Everything
//! here runs on the event loop thread and never waits: a durable operation
//! comes back as a [`Parked`] request answered when its commit round
//! settles, a PULL that found nothing as a [`LongPoll`]. Which requests go
//! through the handshake gate and the in-flight limit, and what a request
//! does to its connection, is the connection's business
//! (`connection.rs`); these functions see only the engine and the limits.

use std::time::Duration;

use tidemark_engine::{
    AppendRequest, Change, ChangeRequest, Chunk, Engine, Error as EngineError,
    JoinStart as EngineJoinStart, OpTicket, ReadBatch, Ticket, Unread,
};

use crate::config::{Limits, SendPolicy};
use crate::connection::{Barrier, ConnId};
use crate::receipts::Receipts;
use crate::slowlog::SlowLog;
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{
    encode_response_head, AckItem, BatchAckResult, ErrorCode, ErrorResponse, GroupInfo,
    HelloResponse, JoinStart, MemberEntry, RecordsLen, Response, ResyncScope, RetentionPolicy,
    Stat, Subscription, SyncGroup, UnreadEntry, FRAME_HEADER_BYTES, MEMBERS_RESPONSE_FIXED_BYTES,
    MEMBER_ENTRY_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN, READERS_RESPONSE_FIXED_BYTES,
    RECORDS_RESPONSE_OVERHEAD_BYTES, SYNC_GROUP_BYTES,
};

/// The HELLO response's `server_name` (format-spec/protocol.md 4.1):
/// `tidemark/` and the node's major.minor version, as in the HELLO vector.
/// For logs; clients must not parse it.
pub const SERVER_NAME: &str = concat!(
    "tidemark/",
    env!("CARGO_PKG_VERSION_MAJOR"),
    ".",
    env!("CARGO_PKG_VERSION_MINOR")
);

/// A response frame: the encoded head, then record bytes from segments,
/// with what the loop needs to know of it without parsing its bytes.
/// Cloning shares the record bytes (a PUSH goes to every subscriber).
#[derive(Clone)]
pub struct Outgoing {
    /// The request it answers (0: a frame not tied to a request).
    pub request_id: u64,
    /// It is an ERROR frame with this code (counted in `net.errors` and
    /// `errors.{code}`).
    pub error: Option<ErrorCode>,
    pub head: Vec<u8>,
    pub chunks: Vec<Chunk>,
    /// Records the response delivers (for stats).
    pub records: u64,
}

/// A group or membership operation waiting for its commit round.
#[derive(Clone, Copy, Debug)]
pub enum OpKind {
    CreateGroup,
    DeleteGroup,
    Join { group: u64 },
    Leave,
    SetRetention,
    ClearHistory { group: u64, user: u64 },
}

/// A request parked until its commit round settles: a SEND, or a group or
/// membership operation.
pub enum Parked {
    /// A SEND, with its group and sender (a receipt subscription of the
    /// pair counts its message once it is answered).
    Send {
        ticket: Ticket,
        group: u64,
        sender: u64,
    },
    Op(OpTicket, OpKind),
    /// A RECALL (`recall`) or an EDIT: its Edit or Recall record's ticket.
    Change {
        ticket: Ticket,
        recall: bool,
    },
    /// On a replica set, an answer that reports cursors (an ACK's, a
    /// BATCH_ACK's, a PULL's, an UNREAD's...), computed at once and held
    /// until the Cursors round `round` is committed: the cursors it shows
    /// are then in the replicated state, so no failover takes them back
    /// (format-spec/cluster.md section 5). If the round fails, the answer
    /// is the round's error instead (the ACK's outcome is unknown).
    Cursors {
        round: u64,
        out: Outgoing,
    },
}

impl Parked {
    /// The commit round whose outcome answers it.
    pub fn round(&self) -> u64 {
        match self {
            Parked::Send { ticket, .. } | Parked::Change { ticket, .. } => ticket.round,
            Parked::Op(ticket, _) => ticket.round(),
            Parked::Cursors { round, .. } => *round,
        }
    }

    /// What it holds back on its connection while parked
    /// (format-spec/protocol.md 1.4).
    pub fn barrier(&self) -> Barrier {
        match self {
            // A change is assigned its id like a SEND (its rules were
            // checked when it started, after every earlier request).
            Parked::Send { .. } | Parked::Change { .. } => Barrier::Send,
            Parked::Op(..) => Barrier::Op,
            // Every later answer of the connection that shows cursors waits
            // for this round or a later one (`Connection`'s cursor hold),
            // so nothing needs to wait behind it.
            Parked::Cursors { .. } => Barrier::None,
        }
    }

    /// The response, once its round's outcome is known (an operation may be
    /// complete when it is parked: the retransmit of a durable send).
    pub fn answer(&self, engine: &Engine, request_id: u64) -> Option<Outgoing> {
        let out = match self {
            Parked::Send { ticket, .. } => match engine.poll(ticket)? {
                Ok(a) => reply(
                    request_id,
                    &Response::Send {
                        msg_id: a.msg_id,
                        timestamp_ms: a.timestamp_ms,
                        duplicate: a.duplicate,
                    },
                    Vec::new(),
                    0,
                ),
                Err(e) => engine_error(request_id, &e),
            },
            Parked::Change { ticket, recall } => match engine.poll(ticket)? {
                Ok(a) => {
                    let (msg_id, timestamp_ms, duplicate) = (a.msg_id, a.timestamp_ms, a.duplicate);
                    let resp: Response<'_, RecordsLen> = if *recall {
                        Response::Recall {
                            msg_id,
                            timestamp_ms,
                            duplicate,
                        }
                    } else {
                        Response::Edit {
                            msg_id,
                            timestamp_ms,
                            duplicate,
                        }
                    };
                    reply(request_id, &resp, Vec::new(), 0)
                }
                Err(e) => engine_error(request_id, &e),
            },
            Parked::Op(ticket, kind) => match engine.poll_op(ticket)? {
                Ok(value) => {
                    let resp: Response<'_, RecordsLen> = match kind {
                        OpKind::CreateGroup => Response::CreateGroup,
                        OpKind::DeleteGroup => Response::DeleteGroup,
                        OpKind::Leave => Response::Leave,
                        OpKind::SetRetention => Response::SetRetention,
                        OpKind::ClearHistory { group, user } => Response::ClearHistory {
                            join_point: value,
                            // Only ever raised: what it is now is at
                            // least what the clear set.
                            cursor: engine
                                .cursor(*group, *user)
                                .unwrap_or(value.saturating_sub(1)),
                        },
                        OpKind::Join { group } => Response::Join {
                            cursor: value,
                            head: engine.head(*group).unwrap_or(value),
                        },
                    };
                    reply(request_id, &resp, Vec::new(), 0)
                }
                Err(e) => engine_error(request_id, &e),
            },
            Parked::Cursors { round, out } => match engine.poll_round(*round)? {
                Ok(()) => out.clone(),
                Err(e) => engine_error(request_id, &e),
            },
        };
        Some(out)
    }

    /// A SEND's (group, sender, msg_id) once it was answered with success.
    pub fn accepted(&self, out: &Outgoing) -> Option<(u64, u64, u64)> {
        match self {
            Parked::Send {
                ticket,
                group,
                sender,
            } if out.error.is_none() => Some((*group, *sender, ticket.appended.msg_id)),
            _ => None,
        }
    }
}

/// A PULL that found nothing and waits for a message (a long poll). It holds
/// nothing back on its connection: its `ack_up_to` was applied when it
/// started.
#[derive(Clone, Copy, Debug)]
pub struct LongPoll {
    pub group: u64,
    pub user: u64,
    pub max_count: u32,
    pub max_bytes: u32,
    pub wait: Duration,
    /// The connection's protocol version: how its records are shown.
    pub version: u8,
}

impl LongPoll {
    /// The pull run again: the response when there is something to answer
    /// (records, or an error), or when `deadline_passed` (then with what is
    /// there, usually nothing); `None` while it should keep waiting. The one
    /// path of both a wake-up and an expiry.
    pub fn answer(
        &self,
        engine: &Engine,
        request_id: u64,
        deadline_passed: bool,
    ) -> Option<Outgoing> {
        let pull = engine.try_pull(
            self.group,
            self.user,
            self.max_count as usize,
            self.max_bytes as usize,
            None,
        );
        // A long poll was parked after a pull of its group ran, so the group
        // is loaded and new records are indexed: NotReady is not expected on
        // a wake-up; if it came, the poll keeps waiting.
        let nothing_yet = match &pull {
            Ok(p) => p.batch.count == 0,
            Err(e) => matches!(e, EngineError::NotReady { .. }),
        };
        if nothing_yet && !deadline_passed {
            return None;
        }
        Some(match pull {
            Ok(p) => pull_reply(engine, self.version, request_id, self.group, p),
            Err(e) => engine_error(request_id, &e),
        })
    }
}

/// What a handled request asks of the event loop.
pub enum Action {
    /// Send this response now.
    Answer(Outgoing),
    /// Answer when the commit round of this work settles (in flight).
    Park(Parked),
    /// Answer when the group grows or the wait ends (in flight).
    Wait(LongPoll),
    /// A replica set member's read (format-spec/cluster.md section 5.2):
    /// `work` (its answer, computed already) is parked once the read
    /// ticket is confirmed; refused `NOT_LEADER` if it fails (in flight).
    Confirm { ticket: u64, work: Parked },
    /// STATS, INFO, SLOWLOG: answer with what the loop holds (its
    /// counters, which count this request; the slow log).
    Report(Report),
    /// A fatal ERROR with this code was queued on the connection, which
    /// now closes (format-spec/protocol.md 1.6).
    Closed(ErrorCode),
    /// BACKUP: the loop begins a snapshot and streams it (`backup.rs`).
    Backup,
    /// CLUSTER_CHANGE: the loop hands it to the replica set's leadership
    /// and answers when that calls back (4.34).
    ClusterChange(crate::config::ChangeRequest),
}

/// What a request the loop answers itself asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Report {
    Stats,
    Info,
    SlowLog { reset: bool, max_count: u32 },
}

/// What a handler may use.
pub struct Ctx<'a> {
    pub engine: &'a Engine,
    pub limits: &'a Limits,
    /// Who may SEND (4.9).
    pub sends: &'a SendPolicy,
    pub token: Option<&'a [u8]>,
    /// The node is shutting down: every request is answered SHUTTING_DOWN.
    pub shutting_down: bool,
    /// The node's index of subscriptions and this connection's id in it:
    /// SUBSCRIBE and UNSUBSCRIBE change the connection's own list (the
    /// truth) and this index (derived from the lists) together.
    pub subs: &'a mut Subscriptions<ConnId>,
    /// The node's receipt subscriptions: the ACK paths report the cursors
    /// they move in watched groups (4.22).
    pub receipts: &'a mut Receipts<ConnId>,
    pub conn: ConnId,
    /// The connection's protocol version (1 until HELLO chose one): how
    /// records are shown to it (`Engine::present`).
    pub version: u8,
    /// A replica set member's leader gate (4.31); `None` on a single node.
    pub leadership: Option<&'a dyn crate::config::Leadership>,
    /// The cluster map (4.33); `None` when the node owns every shard.
    pub shards: Option<&'a crate::shards::ClusterShards>,
}

impl Ctx<'_> {
    /// The member's cursor before an ACK, when its group's receipts are
    /// watched (one lookup; nothing otherwise).
    fn cursor_before(&self, group: u64, user: u64) -> Option<u64> {
        if !self.receipts.watches(group) {
            return None;
        }
        self.engine.cursor(group, user).ok()
    }

    /// Reports the cursor an ACK left if it moved from `before`.
    fn report_move(&mut self, group: u64, user: u64, before: Option<u64>, after: u64) {
        if before.is_some_and(|b| after > b) {
            self.receipts.moved(self.engine, group, user, after);
        }
    }
}

/// Encodes a response whose records the caller sends after the head.
pub fn reply(
    request_id: u64,
    resp: &Response<'_, RecordsLen>,
    chunks: Vec<Chunk>,
    records: u64,
) -> Outgoing {
    match encode_response_head(request_id, resp) {
        Ok(head) => Outgoing {
            request_id,
            error: match resp {
                Response::Error(e) => Some(e.code),
                _ => None,
            },
            head,
            chunks,
            records,
        },
        // Only a frame over 4 GiB fails to encode; responses are sized below
        // frame_bytes_max, so this is a bug, answered as INTERNAL.
        Err(e) => error(
            request_id,
            ErrorCode::Internal,
            None,
            &format!("encode: {e}"),
        ),
    }
}

pub fn error(request_id: u64, code: ErrorCode, detail: Option<u64>, message: &str) -> Outgoing {
    let resp: Response<'_, RecordsLen> = Response::Error(ErrorResponse {
        code,
        detail,
        message,
    });
    // Invariant: an ERROR frame with a short message always encodes.
    let head = encode_response_head(request_id, &resp).expect("invariant: error frames encode");
    Outgoing {
        request_id,
        error: Some(code),
        head,
        chunks: Vec::new(),
        records: 0,
    }
}

/// The wire error code (and detail) for an engine error.
/// NOT_LEADER (format-spec/protocol.md 4.31): detail the leader's node id
/// when known, the message naming its client address.
pub fn not_leader(request_id: u64, refusal: &crate::config::NotLeader) -> Outgoing {
    let message = match (refusal.leader, &refusal.client_addr) {
        (Some(id), _) if refusal.starting => {
            format!("not the leader yet: node {id} was elected and is catching up; retry")
        }
        (Some(id), Some(addr)) => {
            format!("not the leader: node {id} leads, its clients' address is {addr}")
        }
        (Some(id), None) => format!("not the leader: node {id} leads"),
        (None, _) => "not the leader: no leader is known (an election is under way)".into(),
    };
    error(request_id, ErrorCode::NotLeader, refusal.leader, &message)
}

pub fn error_code_of(e: &EngineError) -> (ErrorCode, Option<u64>) {
    match e {
        EngineError::PayloadTooLarge { max, .. } => (ErrorCode::PayloadTooLarge, Some(*max as u64)),
        EngineError::GroupNotFound { .. } => (ErrorCode::GroupNotFound, None),
        EngineError::GroupExists { .. } => (ErrorCode::GroupExists, None),
        EngineError::GroupDamaged { .. } | EngineError::Corrupt { .. } => {
            (ErrorCode::GroupDamaged, None)
        }
        EngineError::WritesStopped { .. } => (ErrorCode::WritesStopped, None),
        EngineError::ShuttingDown => (ErrorCode::ShuttingDown, None),
        EngineError::Overloaded => (ErrorCode::Overloaded, None),
        // A nearly full disk is a capacity limit: retry after a back-off.
        EngineError::DiskFull { free, .. } => (ErrorCode::Overloaded, Some(*free)),
        // Requests that get it wait in the input buffer (`Next::WaitsForLoad`);
        // a long poll's re-run or a push never reads what is not loaded. If
        // one ever did, "retry after a back-off" is what it means.
        EngineError::NotReady { .. } => (ErrorCode::Overloaded, None),
        EngineError::NoSpace { .. } => (ErrorCode::Overloaded, Some(0)),
        EngineError::NotMember { .. } => (ErrorCode::NotMember, None),
        EngineError::CursorAboveHead { head, .. } => (ErrorCode::CursorAboveHead, Some(*head)),
        EngineError::BelowRetentionFloor { earliest, .. } => {
            (ErrorCode::BelowRetentionFloor, Some(*earliest))
        }
        EngineError::LimitExceeded { max, .. } => (ErrorCode::LimitExceeded, Some(*max as u64)),
        EngineError::ChangeRefused { why, .. } => (ErrorCode::ChangeRefused, Some(why.code())),
        EngineError::KeyReused { msg_id, .. } => (ErrorCode::KeyReused, Some(*msg_id)),
        EngineError::Io { .. }
        | EngineError::Locked { .. }
        | EngineError::InvalidConfig { .. }
        | EngineError::NotADataDir { .. }
        | EngineError::UnsupportedFormat { .. }
        // Replication errors: no request of the client protocol reaches them.
        | EngineError::RoundCompacted { .. }
        | EngineError::RoundNotWritten { .. }
        | EngineError::RoundOutOfOrder { .. }
        | EngineError::InvalidRound { .. } => (ErrorCode::Internal, None),
    }
}

/// The ERROR frame for an engine error.
pub fn engine_error(request_id: u64, e: &EngineError) -> Outgoing {
    let (code, detail) = error_code_of(e);
    // Every GROUP_DAMAGED says what an operator can do (the engine's
    // `GroupDamaged` text already does; a `Corrupt` read does not).
    if let EngineError::Corrupt { .. } = e {
        let message = format!("{e}; {}", tidemark_engine::DAMAGED_GROUP_HINT);
        return error(request_id, code, detail, &message);
    }
    error(request_id, code, detail, &e.to_string())
}

fn records_len(batch: &ReadBatch) -> RecordsLen {
    // Invariant: batches are bounded by frame_bytes_max (< 4 GiB) and its records.
    RecordsLen {
        count: batch.count as u32,
        bytes: batch.bytes as u32,
    }
}

/// The most items a BATCH_ACK may hold so that its response (16 bytes of
/// frame header, a 4-byte count, 18 bytes per item) fits `frame_bytes_max`
/// with its 4-byte length prefix, as every frame must.
pub fn batch_ack_items_max(limits: &Limits) -> usize {
    (limits.frame_bytes_max as usize).saturating_sub(BATCH_ACK_RESPONSE_FIXED_BYTES)
        / BATCH_ACK_RESULT_BYTES
}

/// Bytes of a BATCH_ACK response counted by `frame_len` besides its items:
/// the 12 header bytes after the length prefix and the list count.
const BATCH_ACK_RESPONSE_FIXED_BYTES: usize = 12 + 4;
/// Bytes of one BATCH_ACK result (group, status, cursor).
const BATCH_ACK_RESULT_BYTES: usize = 18;

/// Record bytes a response may carry after its fixed part.
pub fn records_budget(limits: &Limits) -> usize {
    (limits.frame_bytes_max - RECORDS_RESPONSE_OVERHEAD_BYTES) as usize
}

/// HELLO (format-spec/protocol.md 4.1): the response, or the fatal
/// UNSUPPORTED_VERSION when no version is common.
/// With the response, the version chosen (section 7: the newest in both
/// ranges).
pub fn hello(
    ctx: &Ctx<'_>,
    request_id: u64,
    min_version: u8,
    max_version: u8,
) -> Result<(Outgoing, u8), Outgoing> {
    let version = PROTOCOL_VERSION.min(max_version);
    if version < min_version.max(PROTOCOL_VERSION_MIN) {
        return Err(error(
            request_id,
            ErrorCode::UnsupportedVersion,
            Some(PROTOCOL_VERSION as u64),
            "no protocol version in common",
        ));
    }
    let resp = Response::Hello(HelloResponse {
        version,
        auth_required: ctx.token.is_some(),
        frame_bytes_max: ctx.limits.frame_bytes_max,
        // Invariant: NodeConfig::validate keeps payload_bytes_max below 4 GiB.
        payload_bytes_max: ctx.engine.config().payload_bytes_max as u32,
        requests_in_flight_max: ctx.limits.requests_in_flight_max,
        server_name: SERVER_NAME,
    });
    Ok((reply(request_id, &resp, Vec::new(), 0), version))
}

/// AUTH (4.2): the response, or the fatal UNAUTHENTICATED for a wrong token
/// (compared in constant time; any token passes when the node has none).
pub fn auth(ctx: &Ctx<'_>, request_id: u64, token: &[u8]) -> Result<Outgoing, Outgoing> {
    if ctx.token.is_none_or(|t| constant_time_eq(t, token)) {
        return Ok(reply(request_id, &Response::Auth, Vec::new(), 0));
    }
    Err(error(
        request_id,
        ErrorCode::Unauthenticated,
        None,
        "wrong token",
    ))
}

/// PING (4.3).
pub fn ping(request_id: u64) -> Outgoing {
    reply(request_id, &Response::Pong, Vec::new(), 0)
}

/// CLUSTER (4.32): the replica set as this node knows it; a single node
/// answers node id 0, no leader, no members. Served by every member.
pub fn cluster(ctx: &Ctx<'_>, request_id: u64) -> Outgoing {
    let view = ctx.leadership.map(|l| l.map());
    let (node_id, leader_id, members) = match &view {
        Some(v) => (v.node_id, v.leader_id, &v.members[..]),
        None => (0, 0, &[][..]),
    };
    let map = tidemark_protocol::ClusterMap {
        node_id,
        leader_id,
        members: members
            .iter()
            .map(|(id, addr)| tidemark_protocol::ClusterMember {
                node_id: *id,
                client_addr: addr,
            })
            .collect(),
    };
    reply(request_id, &Response::Cluster(map), Vec::new(), 0)
}

/// CLUSTER_CHANGE's answer (4.34): the membership once the change
/// applied, NOT_LEADER, or MEMBERSHIP_REFUSED.
pub fn cluster_change(request_id: u64, outcome: &crate::config::ChangeOutcome) -> Outgoing {
    use crate::config::ChangeOutcome;
    match outcome {
        ChangeOutcome::Done(v) => {
            let map = tidemark_protocol::ClusterMap {
                node_id: v.node_id,
                leader_id: v.leader_id,
                members: v
                    .members
                    .iter()
                    .map(|(id, addr)| tidemark_protocol::ClusterMember {
                        node_id: *id,
                        client_addr: addr,
                    })
                    .collect(),
            };
            reply(request_id, &Response::ClusterChange(map), Vec::new(), 0)
        }
        ChangeOutcome::NotLeader(n) => not_leader(request_id, n),
        ChangeOutcome::Refused { detail, message } => error(
            request_id,
            ErrorCode::MembershipRefused,
            Some(*detail),
            message,
        ),
    }
}

/// CLUSTER_MAP (4.33): the cluster's sets and shard table as this node
/// knows them, its own set's leader from its replica. Without a map file:
/// one set (id 0, epoch 0) owning every shard, whose members are the
/// replica set's (none on a single node: the node asked is the set).
/// Served by every member. Cost: the map copied (1024 shards walked into
/// ranges); a rare request.
pub fn cluster_map(ctx: &Ctx<'_>, request_id: u64) -> Outgoing {
    use tidemark_protocol::{ClusterMember, ReplicaSetEntry, ShardMap, ShardTable, SHARD_COUNT};
    let view = ctx.leadership.map(|l| l.map());
    let (node_id, own_leader) = view.as_ref().map_or((0, 0), |v| (v.node_id, v.leader_id));
    fn members(list: &[(u64, String)]) -> Vec<ClusterMember<'_>> {
        list.iter()
            .map(|(id, addr)| ClusterMember {
                node_id: *id,
                client_addr: addr,
            })
            .collect()
    }
    let single;
    let (epoch, own_set, table, sets) = match ctx.shards {
        Some(map) => (
            map.epoch,
            map.own_set,
            &map.table,
            map.sets
                .iter()
                .map(|s| ReplicaSetEntry {
                    set_id: s.set_id,
                    // Other sets' leaders: not learned in this version.
                    leader_id: if s.set_id == map.own_set {
                        own_leader
                    } else {
                        0
                    },
                    members: members(&s.members),
                })
                .collect(),
        ),
        None => {
            single = ShardTable::single(0);
            let set = ReplicaSetEntry {
                set_id: 0,
                leader_id: own_leader,
                members: view.as_ref().map_or_else(Vec::new, |v| members(&v.members)),
            };
            (0, 0, &single, vec![set])
        }
    };
    let map = ShardMap {
        epoch,
        node_id,
        set_id: own_set,
        shard_count: SHARD_COUNT,
        sets,
        ranges: table.ranges(),
    };
    reply(request_id, &Response::ClusterMap(map), Vec::new(), 0)
}

/// WRONG_SET (4.33): the request names a group of another set; detail the
/// set's id, the message its members' client addresses.
pub fn wrong_set(
    request_id: u64,
    map: &crate::shards::ClusterShards,
    wrong: &crate::shards::WrongSet,
) -> Outgoing {
    error(
        request_id,
        ErrorCode::WrongSet,
        Some(u64::from(wrong.set_id)),
        &map.message(wrong),
    )
}

/// CREATE_GROUP (4.5): parked until its round commits.
pub fn create_group(ctx: &Ctx<'_>, group: u64) -> Result<Action, EngineError> {
    let ticket = ctx.engine.submit_create_group(group)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::CreateGroup)))
}

/// DELETE_GROUP (4.6): parked until its round commits.
pub fn delete_group(ctx: &Ctx<'_>, group: u64) -> Result<Action, EngineError> {
    let ticket = ctx.engine.submit_delete_group(group)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::DeleteGroup)))
}

/// JOIN (4.7): parked until its round commits.
pub fn join(ctx: &Ctx<'_>, group: u64, user: u64, start: JoinStart) -> Result<Action, EngineError> {
    let e = ctx.engine;
    let start = match start {
        JoinStart::Head => EngineJoinStart::Head,
        JoinStart::Earliest => EngineJoinStart::Earliest,
        JoinStart::At(cursor) => {
            let head = e.head(group)?;
            if cursor > head {
                return Err(EngineError::CursorAboveHead {
                    group,
                    requested: cursor,
                    head,
                });
            }
            // The wire names the cursor; the engine the first unread id.
            EngineJoinStart::At(cursor + 1)
        }
    };
    let ticket = e.try_submit_join(group, user, start)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::Join { group })))
}

/// LEAVE (4.8): parked until its round commits.
pub fn leave(ctx: &Ctx<'_>, group: u64, user: u64) -> Result<Action, EngineError> {
    let ticket = ctx.engine.submit_leave(group, user)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::Leave)))
}

/// SET_RETENTION (4.26): parked until the policy is durable.
pub fn set_retention(
    ctx: &Ctx<'_>,
    group: u64,
    policy: RetentionPolicy,
) -> Result<Action, EngineError> {
    let ticket = ctx.engine.submit_set_retention(
        group,
        tidemark_engine::Retention {
            by_cursor: policy.by_cursor,
            max_age_ms: policy.max_age_ms,
            max_bytes: policy.max_bytes,
        },
    )?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::SetRetention)))
}

/// CLEAR_HISTORY (4.27): parked until the clear is durable.
pub fn clear_history(
    ctx: &Ctx<'_>,
    group: u64,
    user: u64,
    up_to: u64,
) -> Result<Action, EngineError> {
    let ticket = ctx.engine.submit_clear_history(group, user, up_to)?;
    Ok(Action::Park(Parked::Op(
        ticket,
        OpKind::ClearHistory { group, user },
    )))
}

/// SEND (4.9): parked until its round is durable. Under a members-only
/// [`SendPolicy`] a sender who is neither a member nor a system sender is
/// refused NOT_MEMBER, after the checks that come first in 4.9's order
/// (payload size, writes accepted, the group exists): one lookup of the
/// sender's membership, O(log groups of the sender), never a walk of the
/// group's members.
pub fn send(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    sender: u64,
    client_msg_id: u64,
    payload: &[u8],
) -> Result<Action, EngineError> {
    let e = ctx.engine;
    if ctx.sends.needs_membership(sender)
        && payload.len() <= e.config().payload_bytes_max
        && e.accepting_writes().is_ok()
    {
        match e.cursor(group, sender) {
            Ok(_) => {}
            Err(EngineError::NotMember { .. }) => {
                return Ok(Action::Answer(error(
                    request_id,
                    ErrorCode::NotMember,
                    None,
                    &format!("SEND refused: sender {sender} is not a member of group {group}"),
                )));
            }
            Err(err) => return Err(err),
        }
    }
    let ticket = ctx.engine.try_submit(&AppendRequest {
        group_id: group,
        sender_id: sender,
        client_msg_id,
        payload,
    })?;
    Ok(Action::Park(Parked::Send {
        ticket,
        group,
        sender,
    }))
}

/// RECALL (4.28) and EDIT (4.29): the rules run in the engine (CHANGE_REFUSED
/// with the rule as detail); under a members-only send policy the changer
/// must be a member or a system sender, as for SEND; the node's admin
/// senders may change anyone's message. Parked until its round settles,
/// like a SEND.
// One argument per field of the request.
#[allow(clippy::too_many_arguments)]
pub fn change(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    sender: u64,
    client_msg_id: u64,
    target: u64,
    change: Change<'_>,
) -> Result<Action, EngineError> {
    let e = ctx.engine;
    if ctx.sends.needs_membership(sender) && !ctx.sends.is_admin(sender) {
        match e.cursor(group, sender) {
            Ok(_) => {}
            Err(EngineError::NotMember { .. }) => {
                return Ok(Action::Answer(error(
                    request_id,
                    ErrorCode::NotMember,
                    None,
                    &format!("refused: sender {sender} is not a member of group {group}"),
                )));
            }
            Err(err) => return Err(err),
        }
    }
    let ticket = e.try_submit_change(&ChangeRequest {
        group_id: group,
        sender_id: sender,
        client_msg_id,
        target,
        change,
        admin: ctx.sends.is_admin(sender),
    })?;
    Ok(Action::Park(Parked::Change {
        ticket,
        recall: change == Change::Recall,
    }))
}

/// PULL (4.10): answered at once, or a long poll when it found nothing and
/// may wait.
// One argument per field of the request.
#[allow(clippy::too_many_arguments)]
pub fn pull(
    ctx: &mut Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    ack_up_to: u64,
    max_count: u32,
    max_bytes: u32,
    wait_ms: u32,
) -> Result<Action, EngineError> {
    let ack = (ack_up_to > 0).then_some(ack_up_to);
    let max_bytes = (max_bytes as usize).min(records_budget(ctx.limits));
    let before = ack.and_then(|_| ctx.cursor_before(group, user));
    let pull = ctx
        .engine
        .try_pull(group, user, max_count as usize, max_bytes, ack);
    if before.is_some() {
        // Also after a refusal: a pull that must wait for an index applied
        // its ACK first, and its re-run finds the cursor moved already.
        if let Ok(after) = ctx.engine.cursor(group, user) {
            ctx.report_move(group, user, before, after);
        }
    }
    let pull = pull?;
    if pull.batch.count == 0 && wait_ms > 0 && max_count > 0 {
        let wait = Duration::from_millis(wait_ms.min(ctx.limits.long_poll_ms_max) as u64);
        // Invariant: max_bytes was clamped below frame_bytes_max (u32).
        return Ok(Action::Wait(LongPoll {
            group,
            user,
            max_count,
            max_bytes: max_bytes as u32,
            wait,
            version: ctx.version,
        }));
    }
    Ok(Action::Answer(pull_reply(
        ctx.engine,
        ctx.version,
        request_id,
        group,
        pull,
    )))
}

/// ACK (4.11).
pub fn ack(
    ctx: &mut Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    msg_id: u64,
) -> Result<Outgoing, EngineError> {
    let ack = ctx.engine.ack_move(group, user, msg_id)?;
    if ack.moved {
        // One hash lookup when nobody watches the group.
        ctx.receipts.moved(ctx.engine, group, user, ack.cursor);
    }
    let cursor = ack.cursor;
    Ok(reply(request_id, &Response::Ack { cursor }, Vec::new(), 0))
}

/// BATCH_ACK (4.12): each item's outcome; refused whole, before any item is
/// applied, when its response could not be sent.
pub fn batch_ack(
    ctx: &mut Ctx<'_>,
    request_id: u64,
    user: u64,
    items: &[AckItem],
) -> Result<Outgoing, EngineError> {
    // The response is 2 bytes per item longer than the request.
    let max = batch_ack_items_max(ctx.limits);
    if items.len() > max {
        return Ok(error(
            request_id,
            ErrorCode::LimitExceeded,
            Some(max as u64),
            &format!(
                "{} BATCH_ACK items: the response would exceed frame_bytes_max; \
                 at most {max} items per request, nothing was applied",
                items.len()
            ),
        ));
    }
    let pairs: Vec<(u64, u64)> = items.iter().map(|i| (i.group, i.msg_id)).collect();
    // The cursors watched groups start from (a group may appear twice: the
    // first item's is the start).
    let mut before: Vec<(u64, u64)> = Vec::new();
    for &(g, _) in &pairs {
        if !before.iter().any(|&(b, _)| b == g) {
            if let Some(c) = ctx.cursor_before(g, user) {
                before.push((g, c));
            }
        }
    }
    // Each outcome carries the cursor as it stood right after its item,
    // found by one membership lookup (never a walk of the user's groups):
    // the cost is bounded by the request's size.
    let outcomes = ctx.engine.batch_ack(user, &pairs);
    for &(g, start) in &before {
        // Cursors only move forward: the last item of the group left the
        // highest.
        let last = pairs
            .iter()
            .zip(&outcomes)
            .filter(|((pg, _), o)| *pg == g && o.error.is_none())
            .map(|(_, o)| o.cursor)
            .max();
        if let Some(after) = last {
            ctx.report_move(g, user, Some(start), after);
        }
    }
    let results = outcomes
        .into_iter()
        .zip(items)
        .map(|(r, item)| BatchAckResult {
            group: item.group,
            error: r.error.as_ref().map(|err| error_code_of(err).0),
            cursor: r.cursor,
        })
        .collect();
    Ok(reply(
        request_id,
        &Response::BatchAck(results),
        Vec::new(),
        0,
    ))
}

/// A group's counts as UNREAD and SYNC list them.
fn unread_entry(u: &Unread) -> UnreadEntry {
    UnreadEntry {
        group: u.group_id,
        head: u.head,
        cursor: u.cursor,
        unread: u.unread,
    }
}

/// UNREAD (4.13).
pub fn unread(ctx: &Ctx<'_>, request_id: u64, user: u64) -> Result<Outgoing, EngineError> {
    let list = ctx
        .engine
        .unread(user)
        .into_iter()
        .map(|u| unread_entry(&u))
        .collect();
    Ok(reply(request_id, &Response::Unread(list), Vec::new(), 0))
}

/// HISTORY (4.15).
pub fn history(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    before_msg_id: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let before = (before_msg_id > 0).then_some(before_msg_id);
    // The engine stops reading at the frame's budget.
    let budget = records_budget(ctx.limits);
    let mut h = ctx
        .engine
        .try_history(group, user, before, max_count as usize, budget)?;
    h.batch = ctx.engine.present(group, h.batch, ctx.version >= 2);
    history_reply(request_id, group, h, budget)
}

/// HISTORY_LATEST (4.30, version 2): HISTORY's page with each message in
/// its latest state (`Engine::try_history_latest`), newest first, cut to
/// the frame as HISTORY's; `next_before` is the oldest id the records sent
/// cover (the page's start when all were sent).
pub fn history_latest(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    before_msg_id: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let before = (before_msg_id > 0).then_some(before_msg_id);
    let budget = records_budget(ctx.limits);
    let page = ctx
        .engine
        .try_history_latest(group, user, before, max_count as usize, budget)?;
    let (records, bytes, truncated) = newest_first(group, &page.history.batch, budget)?;
    let next_before = match records.last() {
        Some(oldest) if truncated => peek_msg_id(oldest.bytes()),
        _ => page.next_before,
    };
    let resp = Response::HistoryLatest {
        has_more: truncated || !page.history.complete,
        next_before,
        // Invariant: bounded by the frame budget.
        records: RecordsLen {
            count: records.len() as u32,
            bytes: bytes as u32,
        },
    };
    let n = records.len() as u64;
    Ok(reply(request_id, &resp, records, n))
}

/// The `msg_id` of a whole record (offset 8).
fn peek_msg_id(record: &[u8]) -> u64 {
    record
        .get(8..16)
        .and_then(|b| b.first_chunk::<8>())
        .map_or(0, |b| u64::from_le_bytes(*b))
}

/// READ_COUNT (4.16).
pub fn read_count(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    msg_id: u64,
) -> Result<Outgoing, EngineError> {
    let count = ctx.engine.read_count(group, msg_id)? as u64;
    Ok(reply(
        request_id,
        &Response::ReadCount { count },
        Vec::new(),
        0,
    ))
}

/// The most members a MEMBERS response lists: `members_page_max`, and
/// no more than fit `frame_bytes_max` (with the length prefix, as every
/// frame).
pub fn members_page_max(limits: &Limits) -> usize {
    let fit = (limits.frame_bytes_max as usize).saturating_sub(MEMBERS_RESPONSE_FIXED_BYTES)
        / MEMBER_ENTRY_BYTES;
    limits.members_page_max.min(fit)
}

/// MEMBERS (4.19): a page of the group's members with their cursors, by
/// user id; `max_count` clamped to [`members_page_max`]. The work is the
/// page's (`Engine::members_page`), not the group's.
pub fn members(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    after_user: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let max = (max_count as usize).min(members_page_max(ctx.limits));
    let page = ctx.engine.members_page(group, after_user, max)?;
    let members = page
        .members
        .iter()
        .map(|&(user, cursor)| MemberEntry { user, cursor })
        .collect();
    Ok(reply(
        request_id,
        &Response::Members {
            has_more: page.has_more,
            members,
        },
        Vec::new(),
        0,
    ))
}

/// READERS (4.21): the members at or above `msg_id` among at most
/// [`members_page_max`] members examined above `after_user`, at most
/// `max_count` listed. The work is bounded by the page limit whatever the
/// group's size or how few members have read the message;
/// `next_after_user` continues where the examination stopped.
pub fn readers(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    msg_id: u64,
    after_user: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let fit = (ctx.limits.frame_bytes_max as usize).saturating_sub(READERS_RESPONSE_FIXED_BYTES)
        / MEMBER_ENTRY_BYTES;
    // At least one, so that a page always makes progress or ends.
    let list_max = (max_count as usize).clamp(1, fit.max(1));
    let examine = members_page_max(ctx.limits);
    let page = ctx.engine.members_page(group, after_user, examine)?;
    let mut readers = Vec::new();
    let mut last_examined = after_user;
    let mut stopped_early = false;
    for &(user, cursor) in &page.members {
        if cursor >= msg_id {
            if readers.len() == list_max {
                // The list is full: the next page starts at this member.
                stopped_early = true;
                break;
            }
            readers.push(MemberEntry { user, cursor });
        }
        last_examined = user;
    }
    let next_after_user = if stopped_early || page.has_more {
        last_examined
    } else {
        0
    };
    Ok(reply(
        request_id,
        &Response::Readers {
            next_after_user,
            readers,
        },
        Vec::new(),
        0,
    ))
}

/// GROUP_INFO (4.20): head, retention floor, member count and policy.
pub fn group_info(ctx: &Ctx<'_>, request_id: u64, group: u64) -> Result<Outgoing, EngineError> {
    let g = ctx.engine.group_info(group)?;
    let resp = Response::GroupInfo(GroupInfo {
        head: g.head,
        floor: g.floor,
        member_count: g.members as u64,
        retention: RetentionPolicy {
            by_cursor: g.retention.by_cursor,
            max_age_ms: g.retention.max_age_ms,
            max_bytes: g.retention.max_bytes,
        },
    });
    Ok(reply(request_id, &resp, Vec::new(), 0))
}

/// STATS (4.4): the node's figures, as `Stats::report` lists them.
///
/// The answer always fits `frame_bytes_max` (format-spec/protocol.md
/// 4.4): the `limits.*` and `server.*` names come first (they fit the
/// smallest legal frame, `FRAME_BYTES_MAX_FLOOR`: a client can always
/// read the limits it runs under), then the others in report order while
/// they fit; `server.stats_omitted` says how many were left out.
pub fn stats(request_id: u64, figures: &[(String, u64)], frame_bytes_max: u32) -> Outgoing {
    let first = |name: &str| name.starts_with("limits.") || name.starts_with("server.");
    let ordered = figures
        .iter()
        .filter(|(name, _)| first(name))
        .chain(figures.iter().filter(|(name, _)| !first(name)));
    // The length prefix, the header and the list's count, then per name
    // its string and its value.
    let entry_bytes = |name: &str| 4 + name.len() + 8;
    let room = (frame_bytes_max as usize + 4).saturating_sub(FRAME_HEADER_BYTES + 4);
    let mut used = 0;
    let mut omitted = 0u64;
    let mut list: Vec<Stat<'_>> = Vec::with_capacity(figures.len());
    for (name, value) in ordered {
        if used + entry_bytes(name) > room && !first(name) {
            omitted += 1;
            continue;
        }
        used += entry_bytes(name);
        list.push(Stat {
            name,
            value: *value,
        });
    }
    if let Some(s) = list.iter_mut().find(|s| s.name == "server.stats_omitted") {
        s.value = omitted;
    }
    reply(request_id, &Response::Stats(list), Vec::new(), 0)
}

/// INFO (format-spec/protocol.md 4.24): the node's text figures.
pub fn info(request_id: u64, items: &[(String, String)]) -> Outgoing {
    let list: Vec<tidemark_protocol::InfoItem<'_>> = items
        .iter()
        .map(|(name, value)| tidemark_protocol::InfoItem { name, value })
        .collect();
    reply(request_id, &Response::Info(list), Vec::new(), 0)
}

/// SLOWLOG (format-spec/protocol.md 4.25): up to `max_count` entries,
/// newest first, as many as fit `frame_bytes_max`; with `reset`, the log
/// is emptied once they are listed (entries that did not fit are dropped
/// too: `held` says how many there were). Costs the entries listed.
pub fn slowlog(
    request_id: u64,
    log: &mut SlowLog,
    reset: bool,
    max_count: u32,
    frame_bytes_max: u32,
) -> Outgoing {
    let texts: Vec<(String, String)> = log
        .newest_first()
        .take(max_count as usize)
        .map(|e| (e.client.to_string(), e.args.text()))
        .collect();
    let mut room = (frame_bytes_max as usize + 4)
        .saturating_sub(tidemark_protocol::SLOW_LOG_RESPONSE_FIXED_BYTES);
    let mut entries = Vec::with_capacity(texts.len());
    for (e, (client, args)) in log.newest_first().zip(&texts) {
        let size = tidemark_protocol::SLOW_LOG_ENTRY_BYTES_MIN + client.len() + args.len();
        if size > room {
            break;
        }
        room -= size;
        entries.push(tidemark_protocol::SlowLogEntry {
            id: e.id,
            unix_ms: e.unix_ms,
            duration_ns: e.duration.as_nanos().min(u128::from(u64::MAX)) as u64,
            opcode: e.op.request_byte(),
            client,
            args,
        });
    }
    let resp = Response::SlowLog(tidemark_protocol::SlowLog {
        threshold_us: log.threshold_us(),
        entries_max: u32::try_from(log.entries_max()).unwrap_or(u32::MAX),
        held: u32::try_from(log.len()).unwrap_or(u32::MAX),
        recorded: log.recorded(),
        entries,
    });
    let out = reply(request_id, &resp, Vec::new(), 0);
    if reset {
        log.reset();
    }
    out
}

/// PUSH (format-spec/protocol.md 5.1) of a batch of `group`'s records, read
/// within `records_budget` and shown for the subscribers' protocol version
/// (`Engine::present`).
pub fn push(group: u64, batch: ReadBatch) -> Outgoing {
    let resp = Response::Push {
        group,
        records: records_len(&batch),
    };
    reply(0, &resp, batch.chunks, batch.count)
}

/// RESYNC(all) (5.2): the subscriber's pushes stopped; it pulls to catch up.
pub fn resync_all() -> Outgoing {
    let resp: Response<'_, RecordsLen> = Response::Resync(ResyncScope::All);
    reply(0, &resp, Vec::new(), 0)
}

/// UNSUBSCRIBE (4.18)'s response (the connection drops its subscriptions).
pub fn unsubscribed(request_id: u64) -> Outgoing {
    reply(request_id, &Response::Unsubscribe, Vec::new(), 0)
}

/// SUBSCRIBE (4.17)'s response, or its refusal: `held` entries are held by
/// the connection already, and a GROUPS subscription names existing groups
/// only. The connection adds the entries when this is `Ok`.
pub fn subscribe(
    ctx: &Ctx<'_>,
    request_id: u64,
    held: usize,
    sub: &Subscription,
) -> Result<Outgoing, Outgoing> {
    let max = ctx.limits.subscriptions_max;
    let adding = match sub {
        Subscription::User(_) => 1,
        Subscription::Groups(g) => g.len(),
    };
    if held + adding > max {
        return Err(error(
            request_id,
            ErrorCode::LimitExceeded,
            Some(max as u64),
            "too many subscriptions",
        ));
    }
    if let Subscription::Groups(groups) = sub {
        if let Some(missing) = groups.iter().find(|g| ctx.engine.head(**g).is_err()) {
            return Err(error(
                request_id,
                ErrorCode::GroupNotFound,
                None,
                &format!("group {missing} not found"),
            ));
        }
    }
    Ok(reply(request_id, &Response::Subscribe, Vec::new(), 0))
}

/// SUBSCRIBE_RECEIPTS (4.22)'s response, or its refusal: as SUBSCRIBE's,
/// `held` counting every subscription of the connection and each group
/// one more; the groups must exist. The connection adds the entries when
/// this is `Ok`.
pub fn subscribe_receipts(
    ctx: &Ctx<'_>,
    request_id: u64,
    held: usize,
    groups: &[u64],
) -> Result<Outgoing, Outgoing> {
    let max = ctx.limits.subscriptions_max;
    if held + groups.len() > max {
        return Err(error(
            request_id,
            ErrorCode::LimitExceeded,
            Some(max as u64),
            "too many subscriptions",
        ));
    }
    if let Some(missing) = groups.iter().find(|g| ctx.engine.head(**g).is_err()) {
        return Err(error(
            request_id,
            ErrorCode::GroupNotFound,
            None,
            &format!("group {missing} not found"),
        ));
    }
    Ok(reply(
        request_id,
        &Response::SubscribeReceipts,
        Vec::new(),
        0,
    ))
}

/// A PULL's response, its records shown for protocol `version`.
pub fn pull_reply(
    engine: &Engine,
    version: u8,
    request_id: u64,
    group: u64,
    mut pull: tidemark_engine::Pull,
) -> Outgoing {
    pull.batch = engine.present(group, pull.batch, version >= 2);
    let resp = Response::Pull {
        cursor: pull.cursor,
        head: pull.head,
        has_more: pull.batch.has_more,
        records: records_len(&pull.batch),
    };
    let records = pull.batch.count;
    reply(request_id, &resp, pull.batch.chunks, records)
}

/// SYNC (4.14).
pub fn sync(
    ctx: &Ctx<'_>,
    request_id: u64,
    user: u64,
    per_group_max: u32,
    total_max_bytes: u32,
    continuation: u64,
) -> Result<Outgoing, EngineError> {
    // The group entries take SYNC_GROUP_BYTES each; the records get what is
    // left of the frame.
    // The groups SYNC lists: records above the cursor (4.14).
    let groups = ctx
        .engine
        .unread(user)
        .iter()
        .filter(|u| u.head > u.cursor)
        .count();
    let fixed = RECORDS_RESPONSE_OVERHEAD_BYTES as usize + SYNC_GROUP_BYTES * groups;
    let budget =
        (total_max_bytes as usize).min((ctx.limits.frame_bytes_max as usize).saturating_sub(fixed));
    let after = continuation.checked_sub(1);
    let s = ctx
        .engine
        .try_sync(user, per_group_max as usize, budget.max(1), after)?;
    let mut chunks = Vec::new();
    let mut records = 0;
    let list = s
        .groups
        .into_iter()
        .map(|g| {
            let batch = ctx
                .engine
                .present(g.unread.group_id, g.batch, ctx.version >= 2);
            let section = records_len(&batch);
            records += batch.count;
            chunks.extend(batch.chunks);
            SyncGroup {
                entry: unread_entry(&g.unread),
                records: section,
            }
        })
        .collect();
    let next_continuation = s.continue_after.map_or(0, |g| g.saturating_add(1));
    Ok(reply(
        request_id,
        &Response::Sync {
            next_continuation,
            groups: list,
        },
        chunks,
        records,
    ))
}

/// HISTORY answers newest first: the page's records are sent in reverse,
/// one iovec each, dropping the oldest ones that do not fit the frame.
fn history_reply(
    request_id: u64,
    group: u64,
    h: tidemark_engine::History,
    budget: usize,
) -> Result<Outgoing, EngineError> {
    let (records, bytes, truncated) = newest_first(group, &h.batch, budget)?;
    let keep = records.len();
    let resp = Response::History {
        has_more: truncated || !h.complete,
        // Invariant: bounded by the frame budget.
        records: RecordsLen {
            count: keep as u32,
            bytes: bytes as u32,
        },
    };
    Ok(reply(request_id, &resp, records, keep as u64))
}

/// A page's records newest first, one chunk each, dropping the oldest that
/// do not fit `budget` (the newest always goes): the records, their bytes,
/// and whether some were dropped.
fn newest_first(
    group: u64,
    batch: &ReadBatch,
    budget: usize,
) -> Result<(Vec<Chunk>, usize, bool), EngineError> {
    let mut records: Vec<Chunk> = Vec::new();
    for c in &batch.chunks {
        records.extend(c.split_records(group)?);
    }
    records.reverse();
    let mut bytes = 0;
    let mut keep = 0;
    for r in &records {
        if keep > 0 && bytes + r.bytes().len() > budget {
            break;
        }
        bytes += r.bytes().len();
        keep += 1;
    }
    let truncated = keep < records.len();
    records.truncate(keep);
    Ok((records, bytes, truncated))
}

/// Compares secrets without an early exit on the first difference.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    for i in 0..a.len().max(b.len()) {
        diff |= a.get(i).copied().unwrap_or(0) ^ b.get(i).copied().unwrap_or(0xff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connection::{Connection, Stop};
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use tidemark_engine::io::FaultyVfs;
    use tidemark_engine::Config;
    use tidemark_protocol::{decode_response, Frame, Request};

    fn engine(dir: &std::path::Path) -> Engine {
        Engine::open(Config::new(dir)).unwrap()
    }

    /// Handles one request on a READY connection; returns the whole
    /// response frame (head and records), or `None` when it was deferred or
    /// is answered by the loop.
    fn call(e: &Engine, limits: &Limits, req: Request<'_>) -> Option<Vec<u8>> {
        let mut subs = Subscriptions::default();
        let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, 1 << 20);
        let mut ctx = test_ctx(e, limits, None, &mut subs, &mut receipts);
        let mut conn = Connection::ready(limits.frame_bytes_max);
        match conn.handle_request(&mut ctx, 9, req) {
            Ok(Action::Answer(out)) | Err(Stop::Fatal(out)) => {
                let mut frame = out.head;
                for c in &out.chunks {
                    frame.extend_from_slice(c.bytes());
                }
                Some(frame)
            }
            _ => None,
        }
    }

    static ANYONE: SendPolicy = SendPolicy::anyone();

    /// What a connection hands a handler, for a connection of its own.
    fn test_ctx<'a>(
        engine: &'a Engine,
        limits: &'a Limits,
        token: Option<&'a [u8]>,
        subs: &'a mut Subscriptions<ConnId>,
        receipts: &'a mut Receipts<ConnId>,
    ) -> Ctx<'a> {
        Ctx {
            engine,
            limits,
            sends: &ANYONE,
            token,
            shutting_down: false,
            subs,
            receipts,
            conn: ConnId {
                index: 0,
                generation: 0,
            },
            version: 1,
            leadership: None,
            shards: None,
        }
    }

    fn response(frame: &[u8]) -> Response<'_> {
        decode_response(&Frame::parse(frame).unwrap()).unwrap()
    }

    fn error_code(frame: &[u8]) -> Option<ErrorCode> {
        match response(frame) {
            Response::Error(e) => Some(e.code),
            _ => None,
        }
    }

    /// An engine over a file layer whose syncs a test can hold.
    fn faulty_engine(dir: &std::path::Path) -> (Engine, Arc<tidemark_engine::io::FaultControl>) {
        let vfs = FaultyVfs::new();
        let control = vfs.control.clone();
        let e = Engine::open_with_vfs(Config::new(dir), Arc::new(vfs)).unwrap();
        (e, control)
    }

    /// Releases held syncs when dropped, also when an assertion failed, so
    /// the engine's shutdown does not wait for a held sync forever.
    struct Release(Arc<tidemark_engine::io::FaultControl>);

    impl Drop for Release {
        fn drop(&mut self) {
            self.0.hold_syncs.store(false, Ordering::SeqCst);
        }
    }

    /// Submits a SEND to `group` whose round's fsync is held: until the
    /// returned guard is dropped, everything queued later waits in the next
    /// round (accepted, not committed).
    fn hold_a_round(
        e: &Engine,
        control: &Arc<tidemark_engine::io::FaultControl>,
        group: u64,
    ) -> (Ticket, Release) {
        let release = Release(control.clone());
        control.hold_syncs.store(true, Ordering::SeqCst);
        let held = e
            .submit(&AppendRequest {
                group_id: group,
                sender_id: 100,
                client_msg_id: 1 << 40,
                payload: b"held",
            })
            .unwrap();
        while control.syncs_held.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        (held, release)
    }

    /// Issue 11 item 17 (format-spec/protocol.md 2, "head"): PULL, ACK,
    /// BATCH_ACK, UNREAD and JOIN AT see the committed head, never a message
    /// that was accepted but whose commit round has not completed; JOIN
    /// HEAD's cursor counts it (it is not unread for the new member).
    #[test]
    fn requests_see_the_committed_head_and_join_head_counts_accepted_sends() {
        let dir = tempfile::tempdir().unwrap();
        let (e, control) = faulty_engine(dir.path());
        let limits = Limits::default();
        e.create_group(1).unwrap();
        e.join(1, 5, EngineJoinStart::Earliest).unwrap();
        e.append(1, 100, 1, b"m1").unwrap();
        e.append(1, 100, 2, b"m2").unwrap();
        // Message 3 is accepted; its round is not committed.
        let (held, release) = hold_a_round(&e, &control, 1);
        assert_eq!(held.appended.msg_id, 3);
        let pull = Request::Pull {
            group: 1,
            user: 5,
            ack_up_to: 0,
            max_count: 10,
            max_bytes: 1 << 16,
            wait_ms: 0,
        };
        let frame = call(&e, &limits, pull).unwrap();
        match response(&frame) {
            Response::Pull { head, records, .. } => assert_eq!((head, records.count), (2, 2)),
            other => panic!("{other:?}"),
        }
        let ack = Request::Ack {
            group: 1,
            user: 5,
            msg_id: 3,
        };
        let frame = call(&e, &limits, ack).unwrap();
        assert!(matches!(response(&frame), Response::Error(err)
            if err.code == ErrorCode::CursorAboveHead && err.detail == Some(2)));
        let frame = batch_ack(&e, &limits, 5, &[(1, 3)]);
        assert!(matches!(response(&frame), Response::BatchAck(r)
            if r[0].error == Some(ErrorCode::CursorAboveHead) && r[0].cursor == 0));
        let frame = call(&e, &limits, Request::Unread { user: 5 }).unwrap();
        assert!(matches!(response(&frame), Response::Unread(u) if u[0].head == 2));
        let join_at = Request::Join {
            group: 1,
            user: 6,
            start: JoinStart::At(3),
        };
        let frame = call(&e, &limits, join_at).unwrap();
        assert!(matches!(response(&frame), Response::Error(err)
            if err.code == ErrorCode::CursorAboveHead && err.detail == Some(2)));
        let join_head = e.submit_join(1, 7, EngineJoinStart::Head).unwrap();
        drop(release);
        e.wait(held).unwrap();
        assert_eq!(
            e.wait_op(join_head).unwrap(),
            3,
            "JOIN HEAD counts message 3"
        );
        assert_eq!(e.head(1).unwrap(), 3);
    }

    fn batch_ack(e: &Engine, limits: &Limits, user: u64, pairs: &[(u64, u64)]) -> Vec<u8> {
        let items = pairs
            .iter()
            .map(|&(group, msg_id)| AckItem { group, msg_id })
            .collect();
        call(e, limits, Request::BatchAck { user, items }).unwrap()
    }

    /// Issue 11 items 3 and 15: a refused item reports the cursor as it
    /// stands right after that item (4.12), found without walking the
    /// user's groups: the work of a BATCH_ACK is bounded by its items.
    #[test]
    fn batch_ack_refused_items_report_the_cursor_after_the_item_without_walking_the_user() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        let limits = Limits::default();
        let groups = 200u64;
        let mut last = None;
        for g in 1..=groups {
            e.submit_create_group(g).unwrap();
            last = Some(e.submit_join(g, 5, EngineJoinStart::Head).unwrap());
        }
        e.wait_op(last.unwrap()).unwrap();
        for i in 1..=8 {
            e.append(1, 100, i, b"m").unwrap();
        }
        // The user joined group 1 at head 0: (1, 1000) is refused at cursor
        // 0, (1, 7) moves it to 7, (1, 1001) is refused at 7.
        let mut pairs = vec![(1, 1000), (1, 7), (1, 1001), (groups + 1, 3)];
        pairs.extend((0..1_000).map(|i| (2 + i % (groups - 1), 50)));
        let rows_before = e.stats().membership_rows_listed;
        let frame = batch_ack(&e, &limits, 5, &pairs);
        assert_eq!(
            e.stats().membership_rows_listed - rows_before,
            0,
            "a BATCH_ACK must not walk the user's {groups} groups per item"
        );
        let Response::BatchAck(results) = response(&frame) else {
            panic!("not a BATCH_ACK response: {:?}", response(&frame));
        };
        let got: Vec<_> = results[..4]
            .iter()
            .map(|r| (r.group, r.error, r.cursor))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, Some(ErrorCode::CursorAboveHead), 0),
                (1, None, 7),
                (1, Some(ErrorCode::CursorAboveHead), 7),
                (groups + 1, Some(ErrorCode::GroupNotFound), 0),
            ],
            "each item's cursor as it stands after that item"
        );
        assert_eq!(results.len(), pairs.len());
        assert!(results[4..]
            .iter()
            .all(|r| r.error == Some(ErrorCode::CursorAboveHead) && r.cursor == 0));
    }

    /// Issue 11 item 17: the node's HELLO response is byte for byte the
    /// spec's vector (format-spec/vectors/protocol/hello_response.hex):
    /// the `server_name` of 4.1 and of the vector is the one sent.
    #[test]
    fn the_hello_response_is_the_vector() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        let limits = Limits::default();
        let mut subs = Subscriptions::default();
        let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, 1 << 20);
        let mut ctx = test_ctx(&e, &limits, Some(b"s3cret"), &mut subs, &mut receipts);
        let hello = Request::Hello {
            min_version: 1,
            max_version: 1,
            client_name: "gw-1",
        };
        let mut conn = Connection::new(limits.frame_bytes_max);
        let Ok(Action::Answer(out)) = conn.handle_request(&mut ctx, 1, hello) else {
            panic!("HELLO is answered at once");
        };
        let text = include_str!("../../../format-spec/vectors/protocol/hello_response.hex");
        let vector: Vec<u8> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .flat_map(str::split_whitespace)
            .map(|b| u8::from_str_radix(b, 16).unwrap())
            .collect();
        assert_eq!(out.head, vector);
        assert_eq!(SERVER_NAME, "tidemark/0.2");
    }

    /// Issue 11 item 17: HISTORY with `max_count` 0 returns no records and
    /// `has_more` says whether visible records lie below `before_msg_id`,
    /// as PULL's `max_count` 0 reports `has_more` above the cursor.
    #[test]
    fn history_with_max_count_0_is_a_probe() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        let limits = Limits::default();
        e.create_group(1).unwrap();
        e.join(1, 5, EngineJoinStart::Earliest).unwrap();
        let history = |before_msg_id| {
            let req = Request::History {
                group: 1,
                user: 5,
                before_msg_id,
                max_count: 0,
            };
            let frame = call(&e, &limits, req).unwrap();
            match response(&frame) {
                Response::History { has_more, records } => (has_more, records.count),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(history(0), (false, 0), "an empty group has nothing below");
        for i in 1..=3 {
            e.append(1, 100, i, b"m").unwrap();
        }
        assert_eq!(history(0), (true, 0));
        assert_eq!(history(2), (true, 0), "message 1 is below 2");
        assert_eq!(history(1), (false, 0), "nothing is below message 1");
    }

    /// Issue 11 item 5: a BATCH_ACK whose response could not be sent is
    /// refused before any of its items is applied.
    #[test]
    fn an_oversized_batch_ack_is_refused_before_any_item_is_applied() {
        let dir = tempfile::tempdir().unwrap();
        let e = engine(dir.path());
        let limits = Limits {
            frame_bytes_max: 4096,
            ..Limits::default()
        };
        let max = batch_ack_items_max(&limits);
        assert_eq!(max, (4096 - 16) / 18);
        e.create_group(1).unwrap();
        e.join(1, 5, EngineJoinStart::Head).unwrap();
        for i in 1..=8 {
            e.append(1, 100, i, b"m").unwrap();
        }
        // One item too many: refused, nothing applied.
        let mut pairs = vec![(1, 8)];
        pairs.extend((0..max).map(|_| (1, 1)));
        let frame = batch_ack(&e, &limits, 5, &pairs);
        match response(&frame) {
            Response::Error(err) => {
                assert_eq!(err.code, ErrorCode::LimitExceeded);
                assert_eq!(err.detail, Some(max as u64));
            }
            other => panic!("expected LIMIT_EXCEEDED, got {other:?}"),
        }
        assert_eq!(e.cursor(1, 5).unwrap(), 0, "no cursor moved");
        // The largest batch that fits is answered, and its response fits.
        pairs.pop();
        let frame = batch_ack(&e, &limits, 5, &pairs);
        assert!(frame.len() <= 4 + limits.frame_bytes_max as usize);
        assert!(matches!(response(&frame), Response::BatchAck(r) if r.len() == max));
        assert_eq!(e.cursor(1, 5).unwrap(), 8);
    }

    /// Issue 11 item 14 (format-spec/protocol.md 4.6): while a DELETE_GROUP
    /// waits for its commit round, every request treats the group as not
    /// found, and the per-user lists leave it out.
    #[test]
    fn a_pending_delete_is_group_not_found_for_every_request() {
        let dir = tempfile::tempdir().unwrap();
        let (e, control) = faulty_engine(dir.path());
        let limits = Limits::default();
        for g in [1, 2] {
            e.create_group(g).unwrap();
            e.join(g, 5, EngineJoinStart::Earliest).unwrap();
            for i in 1..=3 {
                e.append(g, 100, i, b"m").unwrap();
            }
        }
        // Hold the fsync of a round on group 2, so the delete of group 1
        // waits in the next round while the requests below are handled.
        let (held, release) = hold_a_round(&e, &control, 2);
        let mut subs = Subscriptions::default();
        let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, 1 << 20);
        let mut ctx = test_ctx(&e, &limits, None, &mut subs, &mut receipts);
        let mut conn = Connection::ready(limits.frame_bytes_max);
        let Ok(Action::Park(Parked::Op(delete, _))) =
            conn.handle_request(&mut ctx, 1, Request::DeleteGroup { group: 1 })
        else {
            panic!("DELETE_GROUP is answered after its round");
        };
        let not_found = |req: Request<'_>| {
            let name = format!("{:?}", req.opcode());
            let frame = call(&e, &limits, req).unwrap_or_else(|| panic!("{name} deferred"));
            assert_eq!(
                error_code(&frame),
                Some(ErrorCode::GroupNotFound),
                "{name} during a pending delete: {:?}",
                response(&frame)
            );
        };
        not_found(Request::Send {
            group: 1,
            sender: 100,
            client_msg_id: 50,
            payload: b"x",
        });
        not_found(Request::Pull {
            group: 1,
            user: 5,
            ack_up_to: 0,
            max_count: 10,
            max_bytes: 1 << 16,
            wait_ms: 0,
        });
        not_found(Request::Pull {
            group: 1,
            user: 5,
            ack_up_to: 0,
            max_count: 10,
            max_bytes: 1 << 16,
            wait_ms: 1000,
        });
        not_found(Request::Ack {
            group: 1,
            user: 5,
            msg_id: 2,
        });
        not_found(Request::History {
            group: 1,
            user: 5,
            before_msg_id: 0,
            max_count: 10,
        });
        not_found(Request::ReadCount {
            group: 1,
            msg_id: 1,
        });
        not_found(Request::Join {
            group: 1,
            user: 5,
            start: JoinStart::Head,
        });
        not_found(Request::Join {
            group: 1,
            user: 6,
            start: JoinStart::At(1),
        });
        not_found(Request::Leave { group: 1, user: 5 });
        not_found(Request::DeleteGroup { group: 1 });
        let frame = batch_ack(&e, &limits, 5, &[(1, 2), (2, 2)]);
        let Response::BatchAck(items) = response(&frame) else {
            panic!("{:?}", response(&frame));
        };
        assert_eq!(
            (items[0].error, items[0].cursor),
            (Some(ErrorCode::GroupNotFound), 0)
        );
        assert_eq!((items[1].error, items[1].cursor), (None, 2));
        let frame = call(&e, &limits, Request::Unread { user: 5 }).unwrap();
        let Response::Unread(list) = response(&frame) else {
            panic!("{:?}", response(&frame));
        };
        assert_eq!(list.iter().map(|u| u.group).collect::<Vec<_>>(), vec![2]);
        let sync = Request::Sync {
            user: 5,
            per_group_max: 10,
            total_max_bytes: 1 << 16,
            continuation: 0,
        };
        let frame = call(&e, &limits, sync).unwrap();
        let Response::Sync { groups, .. } = response(&frame) else {
            panic!("{:?}", response(&frame));
        };
        assert_eq!(
            groups.iter().map(|g| g.entry.group).collect::<Vec<_>>(),
            vec![2]
        );
        // SUBSCRIBE GROUPS is answered by the loop, which checks each group
        // with `head`.
        assert!(e.head(1).is_err());
        assert!(e.poll_op(&delete).is_none(), "the delete is still pending");

        drop(release);
        e.wait(held).unwrap();
        e.wait_op(delete).unwrap();
        assert!(e.group_ids() == vec![2]);
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret!"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }
}

/// MEMBERS' page limits and SEND's membership check (4.9, 4.19, 4.20),
/// at the handlers: what the end-to-end tests cannot reach cheaply (a page
/// limit below the group, a frame limit below the page limit, the order
/// of SEND's refusals).
#[cfg(test)]
mod member_tests {
    use super::*;
    use crate::connection::Connection;
    use tidemark_engine::Config;
    use tidemark_protocol::{decode_response, Frame, Request};

    /// Runs `req` on a READY connection under `sends`; the response frame,
    /// or `None` when it parked (a SEND accepted).
    fn call(e: &Engine, limits: &Limits, sends: &SendPolicy, req: Request<'_>) -> Option<Vec<u8>> {
        let mut subs = Subscriptions::default();
        let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, limits.frame_bytes_max);
        let mut ctx = Ctx {
            engine: e,
            limits,
            sends,
            token: None,
            shutting_down: false,
            subs: &mut subs,
            receipts: &mut receipts,
            conn: ConnId {
                index: 0,
                generation: 0,
            },
            version: 1,
            leadership: None,
            shards: None,
        };
        let mut conn = Connection::ready(limits.frame_bytes_max);
        match conn.handle_request(&mut ctx, 9, req) {
            Ok(Action::Answer(out)) => Some(out.head),
            Ok(Action::Park(Parked::Send { ticket, .. })) => {
                e.wait(ticket).unwrap();
                None
            }
            _ => panic!("answered at once, or a SEND parked"),
        }
    }

    fn members_of(frame: &[u8]) -> (bool, Vec<(u64, u64)>) {
        match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
            Response::Members { has_more, members } => (
                has_more,
                members.iter().map(|m| (m.user, m.cursor)).collect(),
            ),
            other => panic!("{other:?}"),
        }
    }

    fn code_of(frame: &[u8]) -> ErrorCode {
        match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
            Response::Error(err) => err.code,
            other => panic!("not an ERROR: {other:?}"),
        }
    }

    #[test]
    fn members_pages_are_clamped_to_the_page_limit_and_the_frame() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(Config::new(dir.path())).unwrap();
        e.create_group(1).unwrap();
        for u in 1..=300 {
            e.join(1, u, EngineJoinStart::Head).unwrap();
        }
        let anyone = SendPolicy::anyone();
        let mut limits = Limits {
            members_page_max: 5,
            ..Limits::default()
        };
        let page = |limits: &Limits, after_user, max_count| {
            let req = Request::Members {
                group: 1,
                after_user,
                max_count,
            };
            members_of(&call(&e, limits, &anyone, req).unwrap())
        };
        let (more, got) = page(&limits, 0, u32::MAX);
        assert!(more);
        assert_eq!(got, (1..=5).map(|u| (u, 0)).collect::<Vec<_>>());
        let (more, got) = page(&limits, 298, 100);
        assert!(!more);
        assert_eq!(got, vec![(299, 0), (300, 0)]);
        // At the smallest frame a node may have, the frame is the bound.
        limits.members_page_max = 10_000;
        limits.frame_bytes_max = tidemark_protocol::FRAME_BYTES_MAX_FLOOR;
        assert_eq!(members_page_max(&limits), (4096 - 21) / 16);
        let (more, got) = page(&limits, 0, u32::MAX);
        assert!(more);
        assert_eq!(got.len(), 254);
        let req = Request::Members {
            group: 2,
            after_user: 0,
            max_count: 1,
        };
        let frame = call(&e, &limits, &anyone, req).unwrap();
        assert_eq!(code_of(&frame), ErrorCode::GroupNotFound);
    }

    #[test]
    fn sends_of_non_members_are_refused_after_the_checks_that_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(Config::new(dir.path())).unwrap();
        e.create_group(1).unwrap();
        e.join(1, 5, EngineJoinStart::Head).unwrap();
        let limits = Limits::default();
        let policy = SendPolicy::members_only([900, 77, 900]);
        assert_eq!(policy.system_senders(), &[77, 900]);
        let send = |sender, payload: &'static [u8], group| Request::Send {
            group,
            sender,
            client_msg_id: sender,
            payload,
        };
        let big: &'static [u8] = Box::leak(vec![0u8; (1 << 20) + 1].into_boxed_slice());
        let refused = |req| code_of(&call(&e, &limits, &policy, req).unwrap());
        assert_eq!(refused(send(6, b"x", 1)), ErrorCode::NotMember);
        // 4.9's order: the payload's size and the group come first.
        assert_eq!(refused(send(6, big, 1)), ErrorCode::PayloadTooLarge);
        assert_eq!(refused(send(6, b"x", 2)), ErrorCode::GroupNotFound);
        // A member and a system sender are accepted.
        assert!(call(&e, &limits, &policy, send(5, b"m", 1)).is_none());
        assert!(call(&e, &limits, &policy, send(900, b"s", 1)).is_none());
        assert_eq!(e.head(1).unwrap(), 2, "two messages stored, none refused");
        // The default policy is version 1's: anyone may send.
        let anyone = SendPolicy::anyone();
        assert!(call(&e, &limits, &anyone, send(6, b"v1", 1)).is_none());
        assert_eq!(e.head(1).unwrap(), 3);
    }
}

#[cfg(test)]
mod cluster_map_tests {
    use super::*;
    use crate::config::{ClusterView, Leadership, NotLeader};
    use crate::connection::Connection;
    use crate::shards::{ClusterShards, SetMembers};
    use tidemark_engine::Config;
    use tidemark_protocol::{decode_response, Frame, Request, ShardRange, ShardTable};

    /// Node 2 of a replica set led by node 1, refusing data requests.
    struct Follower;

    impl Leadership for Follower {
        // Never asked: a follower refuses every data request first.
        fn read_ticket(&self) -> u64 {
            0
        }
        fn read_outcome(&self, _ticket: u64) -> Option<bool> {
            Some(false)
        }
        fn on_reads(&self, _wake: std::sync::Arc<dyn Fn() + Send + Sync>) {}
        fn raft_figures(&self) -> Option<crate::config::RaftFigures> {
            None
        }
        fn refusal(&self) -> Option<NotLeader> {
            Some(NotLeader {
                leader: Some(1),
                client_addr: Some("127.0.0.1:7001".into()),
                starting: false,
            })
        }
        fn map(&self) -> ClusterView {
            ClusterView {
                node_id: 2,
                leader_id: 1,
                members: vec![(1, "127.0.0.1:7001".into()), (2, "127.0.0.1:7002".into())],
            }
        }
        fn change(&self, _: crate::config::ChangeRequest, done: crate::config::ChangeDone) {
            done(crate::config::ChangeOutcome::NotLeader(NotLeader {
                leader: Some(1),
                client_addr: Some("127.0.0.1:7001".into()),
                starting: false,
            }))
        }
    }

    fn two_sets() -> ClusterShards {
        let range = |first, last, set_id| ShardRange {
            first,
            last,
            set_id,
        };
        ClusterShards {
            epoch: 3,
            own_set: 1,
            table: ShardTable::from_ranges(&[range(0, 511, 1), range(512, 1023, 2)]).unwrap(),
            sets: vec![
                SetMembers {
                    set_id: 1,
                    members: vec![(1, "127.0.0.1:7001".into()), (2, "127.0.0.1:7002".into())],
                },
                SetMembers {
                    set_id: 2,
                    members: vec![(4, "127.0.0.1:7004".into())],
                },
            ],
        }
    }

    /// The answer of a READY connection to `req`, with the given gates.
    fn answer(
        e: &Engine,
        leadership: Option<&dyn Leadership>,
        shards: Option<&ClusterShards>,
        req: Request<'_>,
    ) -> Vec<u8> {
        let limits = Limits::default();
        let anyone = SendPolicy::anyone();
        let mut subs = Subscriptions::default();
        let mut receipts = Receipts::new(Duration::ZERO, usize::MAX, limits.frame_bytes_max);
        let mut ctx = Ctx {
            engine: e,
            limits: &limits,
            sends: &anyone,
            token: None,
            shutting_down: false,
            subs: &mut subs,
            receipts: &mut receipts,
            conn: ConnId {
                index: 0,
                generation: 0,
            },
            version: 1,
            leadership,
            shards,
        };
        let mut conn = Connection::ready(limits.frame_bytes_max);
        match conn.handle_request(&mut ctx, 9, req) {
            Ok(Action::Answer(out)) => out.head,
            _ => panic!("not answered at once"),
        }
    }

    /// A CLUSTER_MAP answer in short: epoch, node, set, (set, leader,
    /// members) per set, and the number of shard ranges.
    type MapSummary = (u64, u64, u32, Vec<(u32, u64, usize)>, usize);

    fn map_of(frame: &[u8]) -> MapSummary {
        match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
            Response::ClusterMap(m) => (
                m.epoch,
                m.node_id,
                m.set_id,
                m.sets
                    .iter()
                    .map(|s| (s.set_id, s.leader_id, s.members.len()))
                    .collect(),
                m.ranges.len(),
            ),
            other => panic!("not a CLUSTER_MAP: {other:?}"),
        }
    }

    /// CLUSTER_CHANGE (4.34): a follower refuses it with NOT_LEADER at its
    /// gate; a single node with MEMBERSHIP_REFUSED, detail 4.
    #[test]
    fn cluster_change_is_refused_at_a_follower_and_on_a_single_node() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(Config::new(dir.path())).unwrap();
        let change =
            || Request::ClusterChange(tidemark_protocol::MemberChange::Remove { node_id: 3 });
        let code_of = |frame: Vec<u8>| match decode_response(&Frame::parse(&frame).unwrap()) {
            Ok(Response::Error(err)) => (err.code, err.detail),
            other => panic!("not an ERROR: {other:?}"),
        };
        assert_eq!(
            code_of(answer(&e, Some(&Follower), None, change())),
            (ErrorCode::NotLeader, Some(1))
        );
        assert_eq!(
            code_of(answer(&e, None, None, change())),
            (ErrorCode::MembershipRefused, Some(4))
        );
    }

    #[test]
    fn every_kind_of_node_answers_cluster_map_and_a_follower_too() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(Config::new(dir.path())).unwrap();
        // A single node: one set, no members, every shard.
        let single = answer(&e, None, None, Request::ClusterMap);
        assert_eq!(map_of(&single), (0, 0, 0, vec![(0, 0, 0)], 1));
        // A replica set without a map, asked at a follower: set 0 with
        // its members and leader.
        let set = answer(&e, Some(&Follower), None, Request::ClusterMap);
        assert_eq!(map_of(&set), (0, 2, 0, vec![(0, 1, 2)], 1));
        // With a map: its sets, the own set's leader, the others' unknown.
        let map = two_sets();
        let sharded = answer(&e, Some(&Follower), Some(&map), Request::ClusterMap);
        assert_eq!(map_of(&sharded), (3, 2, 1, vec![(1, 1, 2), (2, 0, 1)], 2));
    }

    #[test]
    fn wrong_set_comes_before_not_leader_and_own_groups_meet_the_leader_gate() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(Config::new(dir.path())).unwrap();
        let map = two_sets();
        let code = |frame: &[u8]| match decode_response(&Frame::parse(frame).unwrap()).unwrap() {
            Response::Error(err) => (err.code, err.detail),
            other => panic!("not an ERROR: {other:?}"),
        };
        // shard(1) = 632 (set 2), shard(2) = 241 (set 1).
        let foreign = answer(
            &e,
            Some(&Follower),
            Some(&map),
            Request::GroupInfo { group: 1 },
        );
        assert_eq!(code(&foreign), (ErrorCode::WrongSet, Some(2)));
        let own = answer(
            &e,
            Some(&Follower),
            Some(&map),
            Request::GroupInfo { group: 2 },
        );
        assert_eq!(code(&own), (ErrorCode::NotLeader, Some(1)));
        // Refused before anything is done: the group was not created.
        let create = answer(&e, None, Some(&map), Request::CreateGroup { group: 1 });
        assert_eq!(code(&create), (ErrorCode::WrongSet, Some(2)));
        assert!(e.head(1).is_err(), "nothing of a refused request is done");
    }
}
