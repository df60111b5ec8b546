//! Requests (format-spec/protocol.md "Requests"): what a client asks, and
//! their body layouts. Each arm's `// Format:` comment matches the spec table.

use super::frame::{begin_frame, finish_frame, Frame, FRAME_HEADER_BYTES};
use super::opcode::{FrameKind, Opcode};
use super::wire::{
    put_bool, put_bytes, put_count, put_str, put_u32, put_u64, put_u8, DecodeError, EncodeError,
    Reader,
};
use super::{HELLO_VERSION, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN};

/// Where a new member's cursor starts (JOIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinStart {
    /// At the group's head: only messages sent after the join are unread.
    Head,
    /// Just below the oldest stored message: everything stored is unread.
    Earliest,
    /// At this msg_id: messages above it are unread.
    At(u64),
}

impl JoinStart {
    const HEAD: u8 = 0;
    const EARLIEST: u8 = 1;
    const AT: u8 = 2;
}

/// A membership change CLUSTER_CHANGE asks for (format-spec/protocol.md
/// 4.34).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberChange<'a> {
    /// Add node `node_id` (its Raft address and its client address,
    /// `host:port`): as a learner, promoted to voter once it caught up.
    Add {
        node_id: u64,
        cluster_addr: &'a str,
        client_addr: &'a str,
    },
    /// Remove node `node_id`.
    Remove { node_id: u64 },
}

impl MemberChange<'_> {
    const ADD: u8 = 1;
    const REMOVE: u8 = 2;
}

/// What a SUBSCRIBE adds to the connection's push subscription.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subscription {
    /// Every group this user is a member of, now and as memberships change.
    User(u64),
    /// These groups.
    Groups(Vec<u64>),
}

impl Subscription {
    const USER: u8 = 1;
    const GROUPS: u8 = 2;
}

/// One item of a BATCH_ACK: advance the user's cursor in `group` to `msg_id`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckItem {
    pub group: u64,
    pub msg_id: u64,
}

/// Bytes of one BATCH_ACK item on the wire.
const ACK_ITEM_BYTES: usize = 16;

/// A client request. Strings and payloads borrow the frame body.
///
/// Group and user ids are nonzero (0 is reserved as "none"); the decoder
/// rejects a 0 in any group or user field. `sender` is stored as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<'a> {
    Hello {
        min_version: u8,
        max_version: u8,
        client_name: &'a str,
    },
    Auth {
        token: &'a [u8],
    },
    Ping,
    Stats,
    /// A consistent snapshot of the node, streamed as BACKUP_CHUNK frames
    /// and ended by the BACKUP response.
    Backup,
    /// The node's text figures (version, data directory, ...): an addition
    /// (format-spec/protocol.md 4.24).
    Info,
    /// The replica set's members and leader as this node knows them
    /// (format-spec/protocol.md 4.32; an addition).
    Cluster,
    /// The cluster's replica sets and which owns each shard, as this node
    /// knows them (format-spec/protocol.md 4.33; an addition).
    ClusterMap,
    /// A membership change of the replica set, served by its leader and
    /// answered once applied (format-spec/protocol.md 4.34; an addition).
    ClusterChange(MemberChange<'a>),
    /// The slow log (4.25): up to `max_count` entries, newest first; with
    /// `reset`, the log is emptied after they are listed (an addition).
    SlowLog {
        reset: bool,
        max_count: u32,
    },
    CreateGroup {
        group: u64,
    },
    DeleteGroup {
        group: u64,
    },
    Join {
        group: u64,
        user: u64,
        start: JoinStart,
    },
    Leave {
        group: u64,
        user: u64,
    },
    /// Sets the group's retention policy (all zero: keep everything).
    SetRetention {
        group: u64,
        by_cursor: bool,
        /// 0 = no age limit.
        max_age_ms: u64,
        /// 0 = no size limit.
        max_bytes: u64,
    },
    /// Clears `user`'s history of the group up to `up_to` (above the head:
    /// everything), for that member only.
    ClearHistory {
        group: u64,
        user: u64,
        up_to: u64,
    },
    Send {
        group: u64,
        sender: u64,
        client_msg_id: u64,
        payload: &'a [u8],
    },
    /// Version 2: recalls message `target` (4.28).
    Recall {
        group: u64,
        sender: u64,
        client_msg_id: u64,
        target: u64,
    },
    /// Version 2: replaces message `target`'s payload (4.29).
    Edit {
        group: u64,
        sender: u64,
        client_msg_id: u64,
        target: u64,
        payload: &'a [u8],
    },
    Pull {
        group: u64,
        user: u64,
        /// Acknowledge up to this msg_id first; 0 acknowledges nothing.
        ack_up_to: u64,
        max_count: u32,
        max_bytes: u32,
        /// Long-poll: wait up to this long for a record if none is above
        /// the cursor; 0 answers at once.
        wait_ms: u32,
    },
    Ack {
        group: u64,
        user: u64,
        msg_id: u64,
    },
    BatchAck {
        user: u64,
        items: Vec<AckItem>,
    },
    Unread {
        user: u64,
    },
    Sync {
        user: u64,
        /// Records per group at most; 0 returns counts only.
        per_group_max: u32,
        total_max_bytes: u32,
        /// Group id to resume at (inclusive); 0 starts from the beginning.
        continuation: u64,
    },
    History {
        group: u64,
        user: u64,
        /// Records below this msg_id; 0 starts at the head (inclusive).
        before_msg_id: u64,
        max_count: u32,
    },
    /// Version 2: HISTORY's page with each message in its latest state
    /// (4.30); HISTORY's fields.
    HistoryLatest {
        group: u64,
        user: u64,
        before_msg_id: u64,
        max_count: u32,
    },
    ReadCount {
        group: u64,
        msg_id: u64,
    },
    /// A page of the group's members with their cursors, by user id.
    Members {
        group: u64,
        /// Members with an id above this one; 0 starts from the first.
        after_user: u64,
        /// At most this many (the node clamps it to its page limit).
        max_count: u32,
    },
    GroupInfo {
        group: u64,
    },
    /// A page of the group's members whose cursor is at or above `msg_id`
    /// (who has received it), by user id; the node examines a bounded
    /// number of members per request.
    Readers {
        group: u64,
        msg_id: u64,
        /// Members with an id above this one; 0 starts from the first.
        after_user: u64,
        /// At most this many listed (the node clamps it to its page limit).
        max_count: u32,
    },
    Subscribe(Subscription),
    Unsubscribe,
    /// Adds receipt subscriptions: RECEIPT pushes of these groups (and, in
    /// groups above the node's receipt threshold, RECEIPT_COUNTS of
    /// `sender`'s recent messages).
    SubscribeReceipts {
        sender: u64,
        groups: Vec<u64>,
    },
}

impl Request<'_> {
    pub fn opcode(&self) -> Opcode {
        match self {
            Request::Hello { .. } => Opcode::Hello,
            Request::Auth { .. } => Opcode::Auth,
            Request::Ping => Opcode::Ping,
            Request::Stats => Opcode::Stats,
            Request::Backup => Opcode::Backup,
            Request::Info => Opcode::Info,
            Request::Cluster => Opcode::Cluster,
            Request::ClusterMap => Opcode::ClusterMap,
            Request::ClusterChange(_) => Opcode::ClusterChange,
            Request::SlowLog { .. } => Opcode::SlowLog,
            Request::CreateGroup { .. } => Opcode::CreateGroup,
            Request::DeleteGroup { .. } => Opcode::DeleteGroup,
            Request::Join { .. } => Opcode::Join,
            Request::Leave { .. } => Opcode::Leave,
            Request::SetRetention { .. } => Opcode::SetRetention,
            Request::ClearHistory { .. } => Opcode::ClearHistory,
            Request::Send { .. } => Opcode::Send,
            Request::Recall { .. } => Opcode::Recall,
            Request::Edit { .. } => Opcode::Edit,
            Request::Pull { .. } => Opcode::Pull,
            Request::Ack { .. } => Opcode::Ack,
            Request::BatchAck { .. } => Opcode::BatchAck,
            Request::Unread { .. } => Opcode::Unread,
            Request::Sync { .. } => Opcode::Sync,
            Request::History { .. } => Opcode::History,
            Request::HistoryLatest { .. } => Opcode::HistoryLatest,
            Request::ReadCount { .. } => Opcode::ReadCount,
            Request::Members { .. } => Opcode::Members,
            Request::GroupInfo { .. } => Opcode::GroupInfo,
            Request::Readers { .. } => Opcode::Readers,
            Request::Subscribe(_) => Opcode::Subscribe,
            Request::Unsubscribe => Opcode::Unsubscribe,
            Request::SubscribeReceipts { .. } => Opcode::SubscribeReceipts,
        }
    }
}

/// Appends the frame of `req` with `request_id` (nonzero) to `out`, in the
/// oldest version that has the request (1 but for RECALL and EDIT, 2).
pub fn encode_request(
    request_id: u64,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let version = req.opcode().since().max(PROTOCOL_VERSION_MIN);
    encode_request_in(version, request_id, req, out)
}

/// [`encode_request`] in the negotiated `version` (its byte in the frame
/// header; HELLO always carries 1). A request the version does not have
/// is not encoded.
pub fn encode_request_in(
    version: u8,
    request_id: u64,
    req: &Request<'_>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    let op = req.opcode();
    if version < op.since() {
        return Err(EncodeError::NotInVersion {
            what: op.name(),
            version,
        });
    }
    let version = if op == Opcode::Hello {
        HELLO_VERSION
    } else {
        version
    };
    if request_id == 0 {
        return Err(EncodeError::BadRequestId {
            request_id,
            reason: "requests need a nonzero request id",
        });
    }
    let start = begin_frame(out, version, op.request_byte(), request_id);
    let result = encode_body(req, out).and_then(|()| finish_frame(out, start, 0));
    if result.is_err() {
        out.truncate(start);
    }
    result
}

fn encode_body(req: &Request<'_>, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    match req {
        Request::Hello {
            min_version,
            max_version,
            client_name,
        } => {
            // Format: { min_version: u8 | max_version: u8 | client_name: string }
            put_u8(out, *min_version);
            put_u8(out, *max_version);
            put_str(out, client_name, "client_name")?;
        }
        Request::Auth { token } => {
            // Format: { token: bytes }
            put_bytes(out, token, "token")?;
        }
        // Format: {} (empty body)
        Request::Ping
        | Request::Stats
        | Request::Backup
        | Request::Info
        | Request::Cluster
        | Request::ClusterMap
        | Request::Unsubscribe => {}
        Request::SlowLog { reset, max_count } => {
            // Format: { reset: bool | max_count: u32 }
            put_bool(out, *reset);
            put_u32(out, *max_count);
        }
        Request::ClusterChange(change) => {
            // Format: { action: u8 (1 add, 2 remove) | node_id: u64 |
            //           cluster_addr: string | client_addr: string }
            let (action, node_id, cluster_addr, client_addr) = match change {
                MemberChange::Add {
                    node_id,
                    cluster_addr,
                    client_addr,
                } => (MemberChange::ADD, *node_id, *cluster_addr, *client_addr),
                MemberChange::Remove { node_id } => (MemberChange::REMOVE, *node_id, "", ""),
            };
            put_u8(out, action);
            put_u64(out, node_id);
            put_str(out, cluster_addr, "cluster_addr")?;
            put_str(out, client_addr, "client_addr")?;
        }
        Request::CreateGroup { group }
        | Request::DeleteGroup { group }
        | Request::GroupInfo { group } => {
            // Format: { group: u64 }
            put_u64(out, *group);
        }
        Request::Join { group, user, start } => {
            // Format: { group: u64 | user: u64 | start: u8 | start_msg_id: u64 }
            put_u64(out, *group);
            put_u64(out, *user);
            let (tag, at) = match start {
                JoinStart::Head => (JoinStart::HEAD, 0),
                JoinStart::Earliest => (JoinStart::EARLIEST, 0),
                JoinStart::At(id) => (JoinStart::AT, *id),
            };
            put_u8(out, tag);
            put_u64(out, at);
        }
        Request::Leave { group, user } => {
            // Format: { group: u64 | user: u64 }
            put_u64(out, *group);
            put_u64(out, *user);
        }
        Request::SetRetention {
            group,
            by_cursor,
            max_age_ms,
            max_bytes,
        } => {
            // Format: { group: u64 | by_cursor: bool | max_age_ms: u64 | max_bytes: u64 }
            put_u64(out, *group);
            put_bool(out, *by_cursor);
            put_u64(out, *max_age_ms);
            put_u64(out, *max_bytes);
        }
        Request::ClearHistory { group, user, up_to } => {
            // Format: { group: u64 | user: u64 | up_to: u64 }
            put_u64(out, *group);
            put_u64(out, *user);
            put_u64(out, *up_to);
        }
        Request::Send {
            group,
            sender,
            client_msg_id,
            payload,
        } => {
            // Format: { group: u64 | sender: u64 | client_msg_id: u64 | payload: bytes }
            put_u64(out, *group);
            put_u64(out, *sender);
            put_u64(out, *client_msg_id);
            put_bytes(out, payload, "payload")?;
        }
        Request::Recall {
            group,
            sender,
            client_msg_id,
            target,
        } => {
            // Format: { group: u64 | sender: u64 | client_msg_id: u64 | target: u64 }
            put_u64(out, *group);
            put_u64(out, *sender);
            put_u64(out, *client_msg_id);
            put_u64(out, *target);
        }
        Request::Edit {
            group,
            sender,
            client_msg_id,
            target,
            payload,
        } => {
            // Format: { group: u64 | sender: u64 | client_msg_id: u64 | target: u64 |
            //           payload: bytes }
            put_u64(out, *group);
            put_u64(out, *sender);
            put_u64(out, *client_msg_id);
            put_u64(out, *target);
            put_bytes(out, payload, "payload")?;
        }
        Request::Pull {
            group,
            user,
            ack_up_to,
            max_count,
            max_bytes,
            wait_ms,
        } => {
            // Format: { group: u64 | user: u64 | ack_up_to: u64 | max_count: u32 |
            //           max_bytes: u32 | wait_ms: u32 }
            put_u64(out, *group);
            put_u64(out, *user);
            put_u64(out, *ack_up_to);
            put_u32(out, *max_count);
            put_u32(out, *max_bytes);
            put_u32(out, *wait_ms);
        }
        Request::Ack {
            group,
            user,
            msg_id,
        } => {
            // Format: { group: u64 | user: u64 | msg_id: u64 }
            put_u64(out, *group);
            put_u64(out, *user);
            put_u64(out, *msg_id);
        }
        Request::BatchAck { user, items } => {
            // Format: { user: u64 | items: list<{ group: u64 | msg_id: u64 }> }
            put_u64(out, *user);
            put_count(out, items.len(), "items")?;
            for it in items {
                put_u64(out, it.group);
                put_u64(out, it.msg_id);
            }
        }
        Request::Unread { user } => {
            // Format: { user: u64 }
            put_u64(out, *user);
        }
        Request::Sync {
            user,
            per_group_max,
            total_max_bytes,
            continuation,
        } => {
            // Format: { user: u64 | per_group_max: u32 | total_max_bytes: u32 |
            //           continuation: u64 }
            put_u64(out, *user);
            put_u32(out, *per_group_max);
            put_u32(out, *total_max_bytes);
            put_u64(out, *continuation);
        }
        Request::History {
            group,
            user,
            before_msg_id,
            max_count,
        }
        | Request::HistoryLatest {
            group,
            user,
            before_msg_id,
            max_count,
        } => {
            // Format: { group: u64 | user: u64 | before_msg_id: u64 | max_count: u32 }
            put_u64(out, *group);
            put_u64(out, *user);
            put_u64(out, *before_msg_id);
            put_u32(out, *max_count);
        }
        Request::ReadCount { group, msg_id } => {
            // Format: { group: u64 | msg_id: u64 }
            put_u64(out, *group);
            put_u64(out, *msg_id);
        }
        Request::Members {
            group,
            after_user,
            max_count,
        } => {
            // Format: { group: u64 | after_user: u64 | max_count: u32 }
            put_u64(out, *group);
            put_u64(out, *after_user);
            put_u32(out, *max_count);
        }
        Request::Readers {
            group,
            msg_id,
            after_user,
            max_count,
        } => {
            // Format: { group: u64 | msg_id: u64 | after_user: u64 | max_count: u32 }
            put_u64(out, *group);
            put_u64(out, *msg_id);
            put_u64(out, *after_user);
            put_u32(out, *max_count);
        }
        Request::SubscribeReceipts { sender, groups } => {
            // Format: { sender: u64 | groups: list<u64> }
            put_u64(out, *sender);
            put_count(out, groups.len(), "groups")?;
            for g in groups {
                put_u64(out, *g);
            }
        }
        Request::Subscribe(sub) => {
            // Format: { mode: u8 | user: u64 | groups: list<u64> }
            match sub {
                Subscription::User(user) => {
                    put_u8(out, Subscription::USER);
                    put_u64(out, *user);
                    put_count(out, 0, "groups")?;
                }
                Subscription::Groups(groups) => {
                    put_u8(out, Subscription::GROUPS);
                    put_u64(out, 0);
                    put_count(out, groups.len(), "groups")?;
                    for g in groups {
                        put_u64(out, *g);
                    }
                }
            }
        }
    }
    Ok(())
}

/// Decodes a request frame: checks the header (version, request opcode, no
/// flags, nonzero request id), then the body, rejecting trailing bytes.
pub fn decode_request<'a>(frame: &Frame<'a>) -> Result<Request<'a>, DecodeError> {
    let h = &frame.header;
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&h.version) {
        return Err(DecodeError::UnsupportedVersion { version: h.version });
    }
    let Some(FrameKind::Request(op)) = FrameKind::from_byte(h.opcode) else {
        return Err(DecodeError::UnknownOpcode {
            opcode: h.opcode,
            expected: "request",
        });
    };
    // A request of a later version is unknown in this frame's version;
    // HELLO is a version 1 frame in every version.
    if h.version < op.since() || (op == Opcode::Hello && h.version != HELLO_VERSION) {
        return Err(DecodeError::UnknownOpcode {
            opcode: h.opcode,
            expected: "request of this version",
        });
    }
    if h.flags != 0 {
        return Err(DecodeError::UnknownFlags { flags: h.flags });
    }
    if h.request_id == 0 {
        return Err(DecodeError::BadRequestId {
            request_id: 0,
            reason: "requests need a nonzero request id",
        });
    }
    decode_body(op, Reader::new(frame.body, FRAME_HEADER_BYTES))
}

/// The body of a request `op`, to its end (a byte left over is an error).
/// Its result is `decode_request`'s as it is: the request is built once,
/// where the caller wants it, not copied on its way out.
fn decode_body<'a>(op: Opcode, mut r: Reader<'a>) -> Result<Request<'a>, DecodeError> {
    let req = match op {
        Opcode::Hello => {
            // Format: { min_version: u8 | max_version: u8 | client_name: string }
            Request::Hello {
                min_version: r.u8("min_version")?,
                max_version: r.u8("max_version")?,
                client_name: r.str("client_name")?,
            }
        }
        // Format: { token: bytes }
        Opcode::Auth => Request::Auth {
            token: r.bytes("token")?,
        },
        // Format: {} (empty body)
        Opcode::Ping => Request::Ping,
        Opcode::Stats => Request::Stats,
        Opcode::Backup => Request::Backup,
        Opcode::Info => Request::Info,
        Opcode::Cluster => Request::Cluster,
        Opcode::ClusterMap => Request::ClusterMap,
        Opcode::ClusterChange => {
            // Format: { action: u8 (1 add, 2 remove) | node_id: u64 |
            //           cluster_addr: string | client_addr: string }
            let action_offset = r.offset();
            let action = r.u8("action")?;
            let node_id = r.id("node_id")?;
            let addr_offset = r.offset();
            let cluster_addr = r.str("cluster_addr")?;
            let client_addr = r.str("client_addr")?;
            match action {
                MemberChange::ADD => Request::ClusterChange(MemberChange::Add {
                    node_id,
                    cluster_addr,
                    client_addr,
                }),
                MemberChange::REMOVE if cluster_addr.is_empty() && client_addr.is_empty() => {
                    Request::ClusterChange(MemberChange::Remove { node_id })
                }
                MemberChange::REMOVE => {
                    return Err(DecodeError::InvalidValue {
                        field: "cluster_addr",
                        offset: addr_offset,
                        value: (cluster_addr.len() + client_addr.len()) as u64,
                    })
                }
                v => {
                    return Err(DecodeError::InvalidValue {
                        field: "action",
                        offset: action_offset,
                        value: u64::from(v),
                    })
                }
            }
        }
        // Format: { reset: bool | max_count: u32 }
        Opcode::SlowLog => Request::SlowLog {
            reset: r.bool("reset")?,
            max_count: r.u32("max_count")?,
        },
        Opcode::Unsubscribe => Request::Unsubscribe,
        // Format: { group: u64 }
        Opcode::CreateGroup => Request::CreateGroup {
            group: r.id("group")?,
        },
        Opcode::DeleteGroup => Request::DeleteGroup {
            group: r.id("group")?,
        },
        Opcode::GroupInfo => Request::GroupInfo {
            group: r.id("group")?,
        },
        Opcode::Join => {
            // Format: { group: u64 | user: u64 | start: u8 | start_msg_id: u64 }
            let group = r.id("group")?;
            let user = r.id("user")?;
            let tag_offset = r.offset();
            let tag = r.u8("start")?;
            let start = match tag {
                JoinStart::HEAD => {
                    r.zero_u64("start_msg_id")?;
                    JoinStart::Head
                }
                JoinStart::EARLIEST => {
                    r.zero_u64("start_msg_id")?;
                    JoinStart::Earliest
                }
                JoinStart::AT => JoinStart::At(r.u64("start_msg_id")?),
                v => {
                    return Err(DecodeError::InvalidValue {
                        field: "start",
                        offset: tag_offset,
                        value: u64::from(v),
                    })
                }
            };
            Request::Join { group, user, start }
        }
        // Format: { group: u64 | user: u64 }
        Opcode::Leave => Request::Leave {
            group: r.id("group")?,
            user: r.id("user")?,
        },
        // Format: { group: u64 | by_cursor: bool | max_age_ms: u64 | max_bytes: u64 }
        Opcode::SetRetention => Request::SetRetention {
            group: r.id("group")?,
            by_cursor: r.bool("by_cursor")?,
            max_age_ms: r.u64("max_age_ms")?,
            max_bytes: r.u64("max_bytes")?,
        },
        // Format: { group: u64 | user: u64 | up_to: u64 }
        Opcode::ClearHistory => Request::ClearHistory {
            group: r.id("group")?,
            user: r.id("user")?,
            up_to: r.u64("up_to")?,
        },
        // Format: { group: u64 | sender: u64 | client_msg_id: u64 | payload: bytes }
        Opcode::Send => Request::Send {
            group: r.id("group")?,
            sender: r.u64("sender")?,
            client_msg_id: r.u64("client_msg_id")?,
            payload: r.bytes("payload")?,
        },
        // Format: { group: u64 | sender: u64 | client_msg_id: u64 | target: u64 }
        Opcode::Recall => Request::Recall {
            group: r.id("group")?,
            sender: r.u64("sender")?,
            client_msg_id: r.u64("client_msg_id")?,
            target: r.u64("target")?,
        },
        // Format: { group: u64 | sender: u64 | client_msg_id: u64 | target: u64 |
        //           payload: bytes }
        Opcode::Edit => Request::Edit {
            group: r.id("group")?,
            sender: r.u64("sender")?,
            client_msg_id: r.u64("client_msg_id")?,
            target: r.u64("target")?,
            payload: r.bytes("payload")?,
        },
        // Format: { group: u64 | user: u64 | ack_up_to: u64 | max_count: u32 |
        //           max_bytes: u32 | wait_ms: u32 }
        Opcode::Pull => Request::Pull {
            group: r.id("group")?,
            user: r.id("user")?,
            ack_up_to: r.u64("ack_up_to")?,
            max_count: r.u32("max_count")?,
            max_bytes: r.u32("max_bytes")?,
            wait_ms: r.u32("wait_ms")?,
        },
        // Format: { group: u64 | user: u64 | msg_id: u64 }
        Opcode::Ack => Request::Ack {
            group: r.id("group")?,
            user: r.id("user")?,
            msg_id: r.u64("msg_id")?,
        },
        Opcode::BatchAck => {
            // Format: { user: u64 | items: list<{ group: u64 | msg_id: u64 }> }
            let user = r.id("user")?;
            let n = r.count("items", ACK_ITEM_BYTES)?;
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(AckItem {
                    group: r.id("items.group")?,
                    msg_id: r.u64("items.msg_id")?,
                });
            }
            Request::BatchAck { user, items }
        }
        // Format: { user: u64 }
        Opcode::Unread => Request::Unread {
            user: r.id("user")?,
        },
        // Format: { user: u64 | per_group_max: u32 | total_max_bytes: u32 |
        //           continuation: u64 }
        Opcode::Sync => Request::Sync {
            user: r.id("user")?,
            per_group_max: r.u32("per_group_max")?,
            total_max_bytes: r.u32("total_max_bytes")?,
            continuation: r.u64("continuation")?,
        },
        // Format: { group: u64 | user: u64 | before_msg_id: u64 | max_count: u32 }
        Opcode::History => Request::History {
            group: r.id("group")?,
            user: r.id("user")?,
            before_msg_id: r.u64("before_msg_id")?,
            max_count: r.u32("max_count")?,
        },
        // Format: { group: u64 | user: u64 | before_msg_id: u64 | max_count: u32 }
        Opcode::HistoryLatest => Request::HistoryLatest {
            group: r.id("group")?,
            user: r.id("user")?,
            before_msg_id: r.u64("before_msg_id")?,
            max_count: r.u32("max_count")?,
        },
        // Format: { group: u64 | msg_id: u64 }
        Opcode::ReadCount => Request::ReadCount {
            group: r.id("group")?,
            msg_id: r.u64("msg_id")?,
        },
        // Format: { group: u64 | after_user: u64 | max_count: u32 }
        Opcode::Members => Request::Members {
            group: r.id("group")?,
            after_user: r.u64("after_user")?,
            max_count: r.u32("max_count")?,
        },
        // Format: { group: u64 | msg_id: u64 | after_user: u64 | max_count: u32 }
        Opcode::Readers => Request::Readers {
            group: r.id("group")?,
            msg_id: r.u64("msg_id")?,
            after_user: r.u64("after_user")?,
            max_count: r.u32("max_count")?,
        },
        Opcode::SubscribeReceipts => {
            // Format: { sender: u64 | groups: list<u64> }
            let sender = r.id("sender")?;
            let n = r.count("groups", 8)?;
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                groups.push(r.id("groups")?);
            }
            Request::SubscribeReceipts { sender, groups }
        }
        Opcode::Subscribe => {
            // Format: { mode: u8 | user: u64 | groups: list<u64> }
            let mode_offset = r.offset();
            let mode = r.u8("mode")?;
            match mode {
                Subscription::USER => {
                    let user = r.id("user")?;
                    let groups_offset = r.offset();
                    let n = r.count("groups", 8)?;
                    if n != 0 {
                        return Err(DecodeError::InvalidValue {
                            field: "groups (must be empty in mode USER)",
                            offset: groups_offset,
                            value: n as u64,
                        });
                    }
                    Request::Subscribe(Subscription::User(user))
                }
                Subscription::GROUPS => {
                    r.zero_u64("user (must be 0 in mode GROUPS)")?;
                    let n = r.count("groups", 8)?;
                    let mut groups = Vec::with_capacity(n);
                    for _ in 0..n {
                        groups.push(r.id("groups")?);
                    }
                    Request::Subscribe(Subscription::Groups(groups))
                }
                v => {
                    return Err(DecodeError::InvalidValue {
                        field: "mode",
                        offset: mode_offset,
                        value: u64::from(v),
                    })
                }
            }
        }
    };
    r.finish()?;
    Ok(req)
}
