//! The wire error codes (format-spec/protocol.md "Error codes"): one number
//! per failure a client can act on, and which of them end the connection.
//!
//! Codes 1-9 concern the connection and the protocol, 10-19 the request,
//! 20-29 the node. Code 0 means "no error" and appears only as a BATCH_ACK
//! item status, never in an ERROR frame.

use std::fmt;

/// Wire value of "no error" in a BATCH_ACK item status.
pub const STATUS_OK: u16 = 0;

/// An error code carried by an ERROR frame or a BATCH_ACK item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// A frame that is not valid in this version: undecodable body, unknown
    /// opcode, undefined flags, bad request id, a second HELLO. Fatal.
    BadFrame,
    /// No protocol version in common at HELLO, or a frame whose version byte
    /// is not the negotiated one. Fatal. Detail: the server's newest version.
    UnsupportedVersion,
    /// A request before the handshake completed (connection stays open), or
    /// an AUTH with a wrong token (the server then closes).
    Unauthenticated,
    /// A length prefix above the server's frame_bytes_max. Fatal; the server
    /// did not read the body, so the request id is 0. Detail: frame_bytes_max.
    FrameTooLarge,
    /// More requests in flight on this connection than requests_in_flight_max.
    /// Detail: the limit.
    TooManyRequestsInFlight,
    /// The node is over a capacity limit (commit queue, connections); retry
    /// after a back-off.
    Overloaded,
    /// The node is shutting down; it closes the connection once the
    /// responses of requests already in flight are written.
    ShuttingDown,
    /// The group does not exist.
    GroupNotFound,
    /// CREATE_GROUP of an existing group.
    GroupExists,
    /// The user is not a member of the group.
    NotMember,
    /// A SEND payload above payload_bytes_max. Detail: payload_bytes_max.
    PayloadTooLarge,
    /// An ACK, PULL ack_up_to or JOIN AT above the group's head. Detail: head.
    CursorAboveHead,
    /// A position below the oldest stored message. Detail: the earliest
    /// stored msg_id.
    BelowRetentionFloor,
    /// Members per group, groups per user or subscriptions per connection
    /// reached. Detail: the limit.
    LimitExceeded,
    /// An EDIT or RECALL the rules refuse (not the sender, the window
    /// passed, no such message, recalled already). Detail: which rule
    /// (format-spec/protocol.md 4.28).
    ChangeRefused,
    /// The idempotence key `(sender, client_msg_id)` of a SEND, RECALL or
    /// EDIT names an earlier request of another kind (or a change of
    /// another target) in the group's dedup window; nothing was stored.
    /// Detail: that request's msg_id (format-spec/protocol.md 4.9, 4.28).
    KeyReused,
    /// The group's files failed verification; the group answers this until
    /// it is repaired. Other groups are unaffected.
    GroupDamaged,
    /// An earlier write or fsync failed; the node refuses writes until it is
    /// restarted. Reads go on.
    WritesStopped,
    /// A failure the node did not classify; the message says more.
    Internal,
    /// A node of a replica set that is not its leader (or knows no leader
    /// yet) refuses the request; nothing was done. Detail: the leader's
    /// node id, when known; the message names its client address
    /// (format-spec/protocol.md 4.31).
    NotLeader,
    /// The request names a group whose shard another replica set of the
    /// cluster owns; nothing was done. Detail: that set's id; the message
    /// names its members' client addresses (format-spec/protocol.md 4.33).
    WrongSet,
    /// A replica set's leader refused a membership change (CLUSTER_CHANGE);
    /// nothing was changed, except for detail 5. Detail: 1 another change
    /// is under way, 2 the node id is already a member (with other
    /// addresses; an id of 0 is a malformed frame, never this), 3 the node
    /// id is not a member, 4 refused (the last
    /// voter, the leader itself, a bad address, not a replica set), 5
    /// interrupted (leadership lost before it applied: it may happen; ask
    /// again) (format-spec/protocol.md 4.34).
    MembershipRefused,
    /// A code this version does not define (a newer server). Clients treat it
    /// as a non-fatal failure of the request.
    Unknown(u16),
}

impl ErrorCode {
    /// Every defined code, in wire order.
    pub const ALL: [ErrorCode; 22] = [
        ErrorCode::BadFrame,
        ErrorCode::UnsupportedVersion,
        ErrorCode::Unauthenticated,
        ErrorCode::FrameTooLarge,
        ErrorCode::TooManyRequestsInFlight,
        ErrorCode::Overloaded,
        ErrorCode::ShuttingDown,
        ErrorCode::GroupNotFound,
        ErrorCode::GroupExists,
        ErrorCode::NotMember,
        ErrorCode::PayloadTooLarge,
        ErrorCode::CursorAboveHead,
        ErrorCode::BelowRetentionFloor,
        ErrorCode::LimitExceeded,
        ErrorCode::ChangeRefused,
        ErrorCode::KeyReused,
        ErrorCode::GroupDamaged,
        ErrorCode::WritesStopped,
        ErrorCode::Internal,
        ErrorCode::NotLeader,
        ErrorCode::WrongSet,
        ErrorCode::MembershipRefused,
    ];

    /// The u16 on the wire.
    pub const fn code(self) -> u16 {
        match self {
            ErrorCode::BadFrame => 1,
            ErrorCode::UnsupportedVersion => 2,
            ErrorCode::Unauthenticated => 3,
            ErrorCode::FrameTooLarge => 4,
            ErrorCode::TooManyRequestsInFlight => 5,
            ErrorCode::Overloaded => 6,
            ErrorCode::ShuttingDown => 7,
            ErrorCode::GroupNotFound => 10,
            ErrorCode::GroupExists => 11,
            ErrorCode::NotMember => 12,
            ErrorCode::PayloadTooLarge => 13,
            ErrorCode::CursorAboveHead => 14,
            ErrorCode::BelowRetentionFloor => 15,
            ErrorCode::LimitExceeded => 16,
            ErrorCode::ChangeRefused => 17,
            ErrorCode::KeyReused => 18,
            ErrorCode::GroupDamaged => 20,
            ErrorCode::WritesStopped => 21,
            ErrorCode::Internal => 22,
            ErrorCode::NotLeader => 23,
            ErrorCode::WrongSet => 24,
            ErrorCode::MembershipRefused => 25,
            ErrorCode::Unknown(c) => c,
        }
    }

    /// The code for a wire value; `None` for 0 (which is "no error").
    pub fn from_code(code: u16) -> Option<ErrorCode> {
        if code == STATUS_OK {
            return None;
        }
        Some(
            ErrorCode::ALL
                .iter()
                .copied()
                .find(|c| c.code() == code)
                .unwrap_or(ErrorCode::Unknown(code)),
        )
    }

    /// True when the server closes the connection after sending this code.
    /// (UNAUTHENTICATED closes only after a failed AUTH; the client knows
    /// which request it answered.)
    pub const fn is_fatal(self) -> bool {
        matches!(
            self,
            ErrorCode::BadFrame | ErrorCode::UnsupportedVersion | ErrorCode::FrameTooLarge
        )
    }

    /// The name used in the spec.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::BadFrame => "BAD_FRAME",
            ErrorCode::UnsupportedVersion => "UNSUPPORTED_VERSION",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::FrameTooLarge => "FRAME_TOO_LARGE",
            ErrorCode::TooManyRequestsInFlight => "TOO_MANY_REQUESTS_IN_FLIGHT",
            ErrorCode::Overloaded => "OVERLOADED",
            ErrorCode::ShuttingDown => "SHUTTING_DOWN",
            ErrorCode::GroupNotFound => "GROUP_NOT_FOUND",
            ErrorCode::GroupExists => "GROUP_EXISTS",
            ErrorCode::NotMember => "NOT_MEMBER",
            ErrorCode::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            ErrorCode::CursorAboveHead => "CURSOR_ABOVE_HEAD",
            ErrorCode::BelowRetentionFloor => "BELOW_RETENTION_FLOOR",
            ErrorCode::LimitExceeded => "LIMIT_EXCEEDED",
            ErrorCode::ChangeRefused => "CHANGE_REFUSED",
            ErrorCode::KeyReused => "KEY_REUSED",
            ErrorCode::GroupDamaged => "GROUP_DAMAGED",
            ErrorCode::WritesStopped => "WRITES_STOPPED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::NotLeader => "NOT_LEADER",
            ErrorCode::WrongSet => "WRONG_SET",
            ErrorCode::MembershipRefused => "MEMBERSHIP_REFUSED",
            ErrorCode::Unknown(_) => "UNKNOWN",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorCode::Unknown(c) => write!(f, "UNKNOWN({c})"),
            c => f.write_str(c.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_nonzero_and_round_trip() {
        let mut seen = std::collections::HashSet::new();
        for c in ErrorCode::ALL {
            assert_ne!(c.code(), STATUS_OK);
            assert!(seen.insert(c.code()), "duplicate code {}", c.code());
            assert_eq!(ErrorCode::from_code(c.code()), Some(c));
        }
        assert_eq!(ErrorCode::from_code(0), None);
        assert_eq!(ErrorCode::from_code(999), Some(ErrorCode::Unknown(999)));
    }
}
