//! The tidemark wire protocol, sans IO: bytes in, frames out; values in,
//! bytes out. No sockets, no engine, no clock. The byte-level specification
//! is format-spec/protocol.md; the vectors in format-spec/vectors/protocol/
//! are checked by this module's tests.
//!
//! - [`frame`]: the length prefix, the 16-byte header, [`FrameDecoder`]
//!   (bounded buffering, oversized lengths rejected from 4 bytes).
//! - [`opcode`]: what each opcode byte means.
//! - [`request`] / [`response`]: body layouts; `encode_*` / `decode_*`.
//! - [`records`]: records sections (storage records carried verbatim).
//! - [`error_code`]: the wire error codes and which are fatal.
//! - [`shards`]: the shard of a group and the table of which replica set
//!   owns each shard (CLUSTER_MAP, WRONG_SET).
//! - `wire`: primitive types and the typed decode/encode errors.
//!
//! Every frame: `{ frame_len: u32 | version: u8 | opcode: u8 | flags: u16 |
//! request_id: u64 | body }`, little-endian.

pub mod error_code;
pub mod frame;
pub mod opcode;
pub mod records;
pub mod request;
pub mod response;
pub mod shards;
mod wire;

#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod fuzz_targets;

pub use error_code::ErrorCode;
pub use frame::{
    Frame, FrameDecoder, FrameError, FrameHeader, FRAME_BYTES_MAX_DEFAULT, FRAME_BYTES_MAX_FLOOR,
    FRAME_HEADER_BYTES,
};
pub use opcode::{FrameKind, InFlight, Opcode};
pub use records::{
    RecordIter, RecordView, Records, RecordsError, RecordsLen, RecordsSection, FLAG_EDITED,
    FLAG_RECALLED, KIND_EDIT, KIND_GAP, KIND_MESSAGE, KIND_RECALL, TARGET_BYTES,
};
pub use request::{
    decode_request, encode_request, encode_request_in, AckItem, JoinStart, MemberChange, Request,
    Subscription,
};
pub use response::{
    decode_response, encode_response, encode_response_head, encode_response_head_in,
    encode_response_in, set_version, BackupChunk, BackupEnd, BatchAckResult, ClusterMap,
    ClusterMember, ErrorResponse, GroupInfo, HelloResponse, InfoItem, MemberEntry, ReceiptCount,
    ReplicaSetEntry, Response, ResyncScope, RetentionPolicy, ShardMap, SlowLog, SlowLogEntry, Stat,
    SyncGroup, UnreadEntry, BACKUP_CHUNK_FIXED_BYTES, MEMBERS_RESPONSE_FIXED_BYTES,
    MEMBER_ENTRY_BYTES, READERS_RESPONSE_FIXED_BYTES, RECEIPT_COUNT_BYTES, RECEIPT_FIXED_BYTES,
    SLOW_LOG_ENTRY_BYTES_MIN, SLOW_LOG_RESPONSE_FIXED_BYTES, SYNC_GROUP_BYTES,
};
pub use shards::{shard, ShardRange, ShardTable, ShardTableError, SHARD_COUNT};
pub use wire::{DecodeError, EncodeError};

/// The newest protocol version this codec speaks. Version 2
/// (format-spec/protocol.md section 7) is version 1 plus record kinds on
/// the wire (Edit, Recall, Gap, and a recalled message's `recalled` flag)
/// and the requests that make them (RECALL, EDIT); every layout of version
/// 1 is unchanged.
pub const PROTOCOL_VERSION: u8 = 2;
/// Oldest version this codec speaks (a server answers HELLO with the newest
/// version in both its and the client's range).
pub const PROTOCOL_VERSION_MIN: u8 = 1;
/// The version byte of HELLO frames, whatever is negotiated (section 7).
pub const HELLO_VERSION: u8 = 1;

/// Default of the node's requests-in-flight limit per connection.
pub const REQUESTS_IN_FLIGHT_MAX_DEFAULT: u32 = 256;

/// Largest fixed part of a response carrying one records section, frame
/// header included (SYNC with one group: 16 + 8 + 4 + 40 = 68).
pub const RECORDS_RESPONSE_OVERHEAD_BYTES: u32 = 68;
const _: () = assert!(RECORDS_RESPONSE_OVERHEAD_BYTES as usize == 16 + 8 + 4 + SYNC_GROUP_BYTES);

/// The smallest `frame_bytes_max` with which every response can carry at
/// least one record of the largest payload. A node checks
/// `frame_bytes_max >= frame_bytes_min_for_payload(payload_bytes_max)`.
pub const fn frame_bytes_min_for_payload(payload_bytes_max: u32) -> u64 {
    // frame_len excludes the 4-byte prefix.
    RECORDS_RESPONSE_OVERHEAD_BYTES as u64 - frame::LENGTH_PREFIX_BYTES as u64
        + records::RECORD_HEADER_BYTES as u64
        + payload_bytes_max as u64
}

// The default frame limit carries the engine's default 1 MiB payload (the
// node asserts the same against `tidemark_engine::defaults`, which this
// crate does not depend on).
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT as u64 >= frame_bytes_min_for_payload(1 << 20));
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT >= FRAME_BYTES_MAX_FLOOR);
