//! What a handled request asks of the event loop ([`Action`]), and the
//! requests answered later: a [`Parked`] one, answered when its commit
//! round settles, and a [`LongPoll`], answered when its group grows or its
//! wait ends (its re-run is PULL's, in `reads.rs`).

use std::time::Duration;

use tidemark_engine::{Engine, OpTicket, Ticket};

use crate::outgoing::{engine_error, reply, Outgoing};
use tidemark_protocol::{ErrorCode, RecordsLen, Response};

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
                                .try_cursor(*group, *user)
                                .unwrap_or(value.saturating_sub(1)),
                        },
                        OpKind::Join { group } => Response::Join {
                            cursor: value,
                            head: engine.try_head(*group).unwrap_or(value),
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
