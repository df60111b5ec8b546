//! The reliability layer's typed errors: one variant per wire error code
//! (format-spec/protocol.md §6.2), plus what the client itself detects.
//!
//! Transient failures (a lost connection, `OVERLOADED`,
//! `TOO_MANY_REQUESTS_IN_FLIGHT`, `SHUTTING_DOWN`) are retried by the layer
//! with backoff and surface only when the retry budget (`give_up_after`) is
//! spent: a refusal as the node's own refusal (with how many attempts it
//! refused), a lost node as [`Error::Unavailable`]. What a retry cannot
//! change (an invalid address, any other refusal) fails at once.

use std::fmt;

use crate::client::ClientError;
use tidemark_protocol::ErrorCode;

/// What an operation was about, to fill the error's fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ctx {
    pub group: u64,
    pub user: u64,
}

impl Ctx {
    pub fn group(group: u64) -> Ctx {
        Ctx { group, user: 0 }
    }
    pub fn member(group: u64, user: u64) -> Ctx {
        Ctx { group, user }
    }
    pub fn user(user: u64) -> Ctx {
        Ctx { group: 0, user }
    }
}

/// Every way an operation of the reliable client can fail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// `BAD_FRAME` (1): the node could not decode a frame of ours; it closed
    /// the connection. A client bug or a version mix-up; not retried.
    BadFrame { message: String },
    /// `UNSUPPORTED_VERSION` (2): no protocol version in common. Not retried.
    UnsupportedVersion { server_max: Option<u64> },
    /// `UNAUTHENTICATED` (3): the token is missing or wrong. Not retried.
    Unauthenticated { message: String },
    /// `FRAME_TOO_LARGE` (4): a frame of ours exceeded the node's limit.
    FrameTooLarge { frame_bytes_max: Option<u64> },
    /// `TOO_MANY_REQUESTS_IN_FLIGHT` (5), still refused when the retry
    /// budget ran out after `attempts` tries.
    TooManyRequestsInFlight { limit: Option<u64>, attempts: u32 },
    /// `OVERLOADED` (6), still refused when the retry budget ran out after
    /// `attempts` tries; `message` is the node's reason (a full disk,
    /// too many connections).
    Overloaded { message: String, attempts: u32 },
    /// `SHUTTING_DOWN` (7), and no node took its place within the budget.
    ShuttingDown,
    /// `GROUP_NOT_FOUND` (10).
    GroupNotFound { group: u64 },
    /// `GROUP_EXISTS` (11).
    GroupExists { group: u64 },
    /// `NOT_MEMBER` (12).
    NotMember { group: u64, user: u64 },
    /// `PAYLOAD_TOO_LARGE` (13), from the node or checked locally against
    /// the limit the node announced at HELLO.
    PayloadTooLarge { payload_bytes: usize, limit: u64 },
    /// `CURSOR_ABOVE_HEAD` (14).
    CursorAboveHead { group: u64, head: Option<u64> },
    /// `BELOW_RETENTION_FLOOR` (15): the member's next message is no longer
    /// stored. Acknowledge `earliest - 1` to skip the lost range knowingly.
    BelowRetentionFloor { group: u64, earliest: Option<u64> },
    /// `LIMIT_EXCEEDED` (16): members per group, groups per user, groups per
    /// node or subscriptions per connection.
    LimitExceeded { limit: Option<u64> },
    /// `CHANGE_REFUSED` (17): an edit or a recall the rules refuse;
    /// `rule` is the detail: 1 not the sender, 2 the window passed, 3 no
    /// such message, 4 recalled already.
    ChangeRefused { group: u64, rule: Option<u64> },
    /// `KEY_REUSED` (18): the request's `client_msg_id` names an earlier
    /// request of another kind (or a change of another target) of the same
    /// sender, `msg_id` (the detail); nothing was stored. A new request
    /// needs a new `client_msg_id`.
    KeyReused { group: u64, msg_id: Option<u64> },
    /// `GROUP_DAMAGED` (20): the group's files failed verification.
    GroupDamaged { group: u64 },
    /// `WRITES_STOPPED` (21): the node refuses writes until restarted.
    WritesStopped,
    /// `INTERNAL` (22).
    Internal { message: String },
    /// A node of a replica set that is not its leader refused the request
    /// (nothing was done): `leader` is the leader's node id when the node
    /// knows it, the message names its client address
    /// (format-spec/protocol.md 4.31). Not retried on this node.
    NotLeader {
        leader: Option<u64>,
        message: String,
    },
    /// The group is held by another replica set of the cluster (nothing was
    /// done): `set` is its id, the message names its members' client
    /// addresses (format-spec/protocol.md 4.33). The reliable client
    /// follows it itself (it learns the map and routes the request to that
    /// set); it surfaces only when the nodes' maps keep disagreeing.
    WrongSet {
        group: u64,
        set: Option<u64>,
        message: String,
    },
    /// A replica set's leader refused a membership change (CLUSTER_CHANGE,
    /// format-spec/protocol.md 4.34; `reason` is its detail). Only that
    /// request gets it, which the reliable client never sends.
    MembershipRefused {
        reason: Option<u64>,
        message: String,
    },
    /// A code this client does not know (a newer node): a non-fatal failure
    /// of the request.
    UnknownCode { code: u16, message: String },
    /// A record whose CRC does not match its bytes: damage between the
    /// node's disk and here. The response is refused, never delivered.
    Crc { group: u64, msg_id: u64 },
    /// The node could not be reached, or the connection kept failing, for
    /// the whole retry budget. `cause` is the last failure.
    Unavailable { attempts: u32, cause: String },
    /// The node's address does not parse or does not resolve. Not retried.
    Address { addr: String, message: String },
}

impl Error {
    /// The wire error code this error stands for, if any.
    pub fn code(&self) -> Option<ErrorCode> {
        Some(match self {
            Error::BadFrame { .. } => ErrorCode::BadFrame,
            Error::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            Error::Unauthenticated { .. } => ErrorCode::Unauthenticated,
            Error::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            Error::TooManyRequestsInFlight { .. } => ErrorCode::TooManyRequestsInFlight,
            Error::Overloaded { .. } => ErrorCode::Overloaded,
            Error::ShuttingDown => ErrorCode::ShuttingDown,
            Error::GroupNotFound { .. } => ErrorCode::GroupNotFound,
            Error::GroupExists { .. } => ErrorCode::GroupExists,
            Error::NotMember { .. } => ErrorCode::NotMember,
            Error::PayloadTooLarge { .. } => ErrorCode::PayloadTooLarge,
            Error::CursorAboveHead { .. } => ErrorCode::CursorAboveHead,
            Error::BelowRetentionFloor { .. } => ErrorCode::BelowRetentionFloor,
            Error::LimitExceeded { .. } => ErrorCode::LimitExceeded,
            Error::ChangeRefused { .. } => ErrorCode::ChangeRefused,
            Error::KeyReused { .. } => ErrorCode::KeyReused,
            Error::GroupDamaged { .. } => ErrorCode::GroupDamaged,
            Error::WritesStopped => ErrorCode::WritesStopped,
            Error::Internal { .. } => ErrorCode::Internal,
            Error::NotLeader { .. } => ErrorCode::NotLeader,
            Error::WrongSet { .. } => ErrorCode::WrongSet,
            Error::MembershipRefused { .. } => ErrorCode::MembershipRefused,
            Error::UnknownCode { code, .. } => ErrorCode::Unknown(*code),
            Error::Crc { .. } | Error::Unavailable { .. } | Error::Address { .. } => return None,
        })
    }

    /// A stable lowercase name, for `--json` output and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Crc { .. } => "crc_mismatch",
            Error::Unavailable { .. } => "unavailable",
            Error::Address { .. } => "invalid_address",
            other => match other.code() {
                Some(c) => c.name(),
                None => "unknown",
            },
        }
    }

    /// The typed error for a server's ERROR frame.
    pub fn from_code(code: ErrorCode, detail: Option<u64>, message: String, ctx: Ctx) -> Error {
        match code {
            ErrorCode::BadFrame => Error::BadFrame { message },
            ErrorCode::UnsupportedVersion => Error::UnsupportedVersion { server_max: detail },
            ErrorCode::Unauthenticated => Error::Unauthenticated { message },
            ErrorCode::FrameTooLarge => Error::FrameTooLarge {
                frame_bytes_max: detail,
            },
            ErrorCode::TooManyRequestsInFlight => Error::TooManyRequestsInFlight {
                limit: detail,
                attempts: 1,
            },
            ErrorCode::Overloaded => Error::Overloaded {
                message,
                attempts: 1,
            },
            ErrorCode::ShuttingDown => Error::ShuttingDown,
            ErrorCode::GroupNotFound => Error::GroupNotFound { group: ctx.group },
            ErrorCode::GroupExists => Error::GroupExists { group: ctx.group },
            ErrorCode::NotMember => Error::NotMember {
                group: ctx.group,
                user: ctx.user,
            },
            ErrorCode::PayloadTooLarge => Error::PayloadTooLarge {
                payload_bytes: 0,
                limit: detail.unwrap_or(0),
            },
            ErrorCode::CursorAboveHead => Error::CursorAboveHead {
                group: ctx.group,
                head: detail,
            },
            ErrorCode::BelowRetentionFloor => Error::BelowRetentionFloor {
                group: ctx.group,
                earliest: detail,
            },
            ErrorCode::LimitExceeded => Error::LimitExceeded { limit: detail },
            ErrorCode::ChangeRefused => Error::ChangeRefused {
                group: ctx.group,
                rule: detail,
            },
            ErrorCode::KeyReused => Error::KeyReused {
                group: ctx.group,
                msg_id: detail,
            },
            ErrorCode::GroupDamaged => Error::GroupDamaged { group: ctx.group },
            ErrorCode::WritesStopped => Error::WritesStopped,
            ErrorCode::Internal => Error::Internal { message },
            ErrorCode::NotLeader => Error::NotLeader {
                leader: detail,
                message,
            },
            ErrorCode::WrongSet => Error::WrongSet {
                group: ctx.group,
                set: detail,
                message,
            },
            ErrorCode::MembershipRefused => Error::MembershipRefused {
                reason: detail,
                message,
            },
            ErrorCode::Unknown(code) => Error::UnknownCode { code, message },
        }
    }

    /// A busy refusal that was repeated `attempts` times (other errors are
    /// returned as they are).
    pub(crate) fn with_attempts(mut self, n: u32) -> Error {
        if let Error::Overloaded { attempts, .. }
        | Error::TooManyRequestsInFlight { attempts, .. } = &mut self
        {
            *attempts = n.max(1);
        }
        self
    }

    /// The typed error for a low-level failure that will not be retried.
    pub(crate) fn from_client(e: ClientError, ctx: Ctx, attempts: u32) -> Error {
        match e {
            ClientError::Server {
                code,
                detail,
                message,
            } => Error::from_code(code, detail, message, ctx).with_attempts(attempts),
            ClientError::Crc { group, msg_id } => Error::Crc { group, msg_id },
            ClientError::Address { addr, message } => Error::Address { addr, message },
            other => Error::Unavailable {
                attempts,
                cause: other.to_string(),
            },
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let opt = |v: &Option<u64>| v.map_or_else(|| "?".to_string(), |v| v.to_string());
        match self {
            Error::BadFrame { message } => write!(f, "BAD_FRAME: {message}"),
            Error::UnsupportedVersion { server_max } => write!(
                f,
                "UNSUPPORTED_VERSION: no common protocol version (node speaks up to {})",
                opt(server_max)
            ),
            Error::Unauthenticated { message } => {
                write!(f, "UNAUTHENTICATED: {message} (check --token-file)")
            }
            Error::FrameTooLarge { frame_bytes_max } => write!(
                f,
                "FRAME_TOO_LARGE: the node accepts frames up to {} bytes",
                opt(frame_bytes_max)
            ),
            Error::TooManyRequestsInFlight { limit, attempts } => {
                write!(
                    f,
                    "TOO_MANY_REQUESTS_IN_FLIGHT: limit {} per connection",
                    opt(limit)
                )?;
                still_refused(f, *attempts)
            }
            Error::Overloaded { message, attempts } => {
                if message.is_empty() {
                    write!(f, "OVERLOADED: the node is over capacity")?;
                } else {
                    write!(f, "OVERLOADED: {message}")?;
                }
                still_refused(f, *attempts)
            }
            Error::ShuttingDown => write!(f, "SHUTTING_DOWN: the node is shutting down"),
            Error::GroupNotFound { group } => write!(f, "GROUP_NOT_FOUND: group {group}"),
            Error::GroupExists { group } => write!(f, "GROUP_EXISTS: group {group}"),
            Error::NotMember { group, user } => {
                write!(
                    f,
                    "NOT_MEMBER: user {user} is not a member of group {group}"
                )
            }
            Error::PayloadTooLarge {
                payload_bytes,
                limit,
            } => {
                if *payload_bytes > 0 {
                    write!(
                        f,
                        "PAYLOAD_TOO_LARGE: {payload_bytes} bytes, the node accepts up to {limit}"
                    )
                } else {
                    write!(f, "PAYLOAD_TOO_LARGE: the node accepts up to {limit} bytes")
                }
            }
            Error::CursorAboveHead { group, head } => {
                write!(f, "CURSOR_ABOVE_HEAD: group {group} head is {}", opt(head))
            }
            Error::BelowRetentionFloor { group, earliest } => write!(
                f,
                "BELOW_RETENTION_FLOOR: group {group} keeps messages from {}",
                opt(earliest)
            ),
            Error::LimitExceeded { limit } => {
                write!(f, "LIMIT_EXCEEDED: limit {}", opt(limit))
            }
            Error::ChangeRefused { group, rule } => write!(
                f,
                "CHANGE_REFUSED: group {group}: {}",
                match rule {
                    Some(1) => "only its sender or an administrator may change it",
                    Some(2) => "the change window has passed",
                    Some(3) => "no such message is stored",
                    Some(4) => "it was recalled",
                    _ => "refused",
                }
            ),
            Error::KeyReused { group, msg_id } => write!(
                f,
                "KEY_REUSED: group {group}: the client_msg_id names message {} of another request",
                opt(msg_id)
            ),
            Error::GroupDamaged { group } => {
                write!(f, "GROUP_DAMAGED: group {group} failed verification")
            }
            Error::WritesStopped => write!(
                f,
                "WRITES_STOPPED: a write or fsync failed; the node refuses writes until restarted"
            ),
            Error::Internal { message } => write!(f, "INTERNAL: {message}"),
            Error::NotLeader { message, .. } => write!(f, "NOT_LEADER: {message}"),
            Error::WrongSet { message, .. } => write!(f, "WRONG_SET: {message}"),
            Error::MembershipRefused { message, .. } => write!(f, "MEMBERSHIP_REFUSED: {message}"),
            Error::UnknownCode { code, message } => write!(f, "error code {code}: {message}"),
            Error::Crc { group, msg_id } => write!(
                f,
                "CRC mismatch in group {group} message {msg_id}: the record was damaged"
            ),
            Error::Unavailable { attempts, cause } => {
                write!(f, "node unavailable after {attempts} attempt(s): {cause}")
            }
            Error::Address { addr, message } => write!(f, "invalid address {addr:?}: {message}"),
        }
    }
}

/// How often a retried refusal was repeated, when it was.
fn still_refused(f: &mut fmt::Formatter<'_>, attempts: u32) -> fmt::Result {
    if attempts > 1 {
        write!(f, " (refused {attempts} times in a row; gave up)")
    } else {
        Ok(())
    }
}

impl std::error::Error for Error {}

/// What to do after a low-level failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    /// The connection is gone or untrustworthy (closed, timed out, garbage
    /// from the node): drop it, reconnect, retry idempotently.
    Broken,
    /// The node is busy: keep the connection, back off, retry.
    Busy,
    /// A replica set member that does not lead (NOT_LEADER): learn the
    /// leader (`Link::redirect`), connect to it, retry idempotently.
    Redirect,
    /// The node refused the request for a reason a retry cannot change; the
    /// connection is unusable (fatal codes) or fine (everything else).
    Permanent { drop_connection: bool },
}

pub(crate) fn classify(e: &ClientError) -> Class {
    match e {
        ClientError::Address { .. } => Class::Permanent {
            drop_connection: true,
        },
        ClientError::Io(_)
        | ClientError::Closed
        | ClientError::Timeout
        | ClientError::Protocol(_) => Class::Broken,
        ClientError::Crc { .. } => Class::Permanent {
            drop_connection: false,
        },
        ClientError::Server { code, .. } => match code {
            ErrorCode::Overloaded | ErrorCode::TooManyRequestsInFlight => Class::Busy,
            ErrorCode::ShuttingDown => Class::Broken,
            ErrorCode::NotLeader => Class::Redirect,
            ErrorCode::BadFrame
            | ErrorCode::UnsupportedVersion
            | ErrorCode::FrameTooLarge
            | ErrorCode::Unauthenticated => Class::Permanent {
                drop_connection: true,
            },
            _ => Class::Permanent {
                drop_connection: false,
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_wire_code_has_its_own_typed_error_and_maps_back() {
        let ctx = Ctx::member(7, 5);
        let mut kinds = std::collections::HashSet::new();
        for code in ErrorCode::ALL.into_iter().chain([ErrorCode::Unknown(999)]) {
            let e = Error::from_code(code, Some(3), "m".into(), ctx);
            assert_eq!(e.code(), Some(code), "{e}");
            assert!(
                kinds.insert(std::mem::discriminant(&e)),
                "{code:?} shares a variant"
            );
            assert!(!e.to_string().is_empty());
        }
        assert!(matches!(
            Error::from_code(ErrorCode::NotMember, None, String::new(), ctx),
            Error::NotMember { group: 7, user: 5 }
        ));
        assert!(matches!(
            Error::from_code(
                ErrorCode::BelowRetentionFloor,
                Some(500),
                String::new(),
                ctx
            ),
            Error::BelowRetentionFloor {
                group: 7,
                earliest: Some(500)
            }
        ));
    }

    #[test]
    fn transient_failures_are_retried_and_refusals_are_not() {
        let server = |code| ClientError::Server {
            code,
            detail: None,
            message: String::new(),
        };
        assert_eq!(classify(&ClientError::Closed), Class::Broken);
        assert_eq!(classify(&ClientError::Timeout), Class::Broken);
        assert_eq!(classify(&ClientError::Protocol("x".into())), Class::Broken);
        assert_eq!(classify(&server(ErrorCode::ShuttingDown)), Class::Broken);
        assert_eq!(classify(&server(ErrorCode::Overloaded)), Class::Busy);
        assert_eq!(classify(&server(ErrorCode::NotLeader)), Class::Redirect);
        assert_eq!(
            classify(&server(ErrorCode::TooManyRequestsInFlight)),
            Class::Busy
        );
        assert_eq!(
            classify(&server(ErrorCode::Unauthenticated)),
            Class::Permanent {
                drop_connection: true
            }
        );
        assert_eq!(
            classify(&server(ErrorCode::GroupNotFound)),
            Class::Permanent {
                drop_connection: false
            }
        );
        assert_eq!(
            classify(&server(ErrorCode::Unknown(77))),
            Class::Permanent {
                drop_connection: false
            }
        );
    }
}
