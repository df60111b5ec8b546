//! The little-endian fields of the replica set's byte formats (the Raft
//! log's records, the membership body, snapshot streams, the peer
//! handshake; format-spec/cluster.md): one reader for all of them, below
//! every module that decodes one.

/// The little-endian u64 at `at` (the caller checked the bounds).
pub fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
