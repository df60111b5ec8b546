//! A frame as the event loop sends it ([`Outgoing`]: an encoded head and
//! record bytes borrowed from segments), and the builders every part of
//! the node shares: a response's head ([`reply`]), an ERROR frame
//! ([`error`]; [`engine_error`] with an engine error's wire code), and the
//! record budget of a response. It knows the protocol's encoder and the
//! engine's errors, nothing of connections, handlers or the loop.

use tidemark_engine::{Chunk, Error as EngineError, ReadBatch};

use crate::config::Limits;
use tidemark_protocol::{
    encode_response_head, ErrorCode, ErrorResponse, RecordsLen, Response,
    RECORDS_RESPONSE_OVERHEAD_BYTES,
};

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

pub fn records_len(batch: &ReadBatch) -> RecordsLen {
    // Invariant: batches are bounded by frame_bytes_max (< 4 GiB) and its records.
    RecordsLen {
        count: batch.count as u32,
        bytes: batch.bytes as u32,
    }
}

/// Record bytes a response may carry after its fixed part.
pub fn records_budget(limits: &Limits) -> usize {
    (limits.frame_bytes_max - RECORDS_RESPONSE_OVERHEAD_BYTES) as usize
}
