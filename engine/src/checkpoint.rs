//! The checkpoint: the recovery point of the engine. It lists every group
//! with its head and segments (lengths that were fsynced before the
//! checkpoint was written), and the first journal file to replay. Opening
//! after a clean shutdown replays nothing; after a crash, only the journal
//! written since the checkpoint.
//!
//! Written atomically: `checkpoint.tmp` is written and fsynced, renamed over
//! `checkpoint`, and the directory fsynced.
//!
//! File format (little-endian), see format-spec/storage.md "Checkpoint file":
//! `{ magic: [u8; 8] = "TDMKCKPT" | version: u16 = 1 | header_len: u16 = 32 |
//!    reserved: u32 = 0 | body_len: u64 | body_crc32: u32 | header_crc32: u32 (of bytes 0..28) |
//!    body: bincode(CheckpointBody) }`

use std::path::{Path, PathBuf};

use crate::codec;
use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"TDMKCKPT";
pub const CHECKPOINT_VERSION: u16 = 1;
pub const CHECKPOINT_HEADER_BYTES: usize = 32;

#[derive(bincode::Encode, bincode::Decode, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointBody {
    /// Replay journal files with this sequence number and above.
    pub journal_seq: u64,
    /// Written by a clean shutdown (the journal after it is empty).
    pub clean_shutdown: bool,
    pub created_ms: u64,
    /// Groups in slot order (the memberships section refers to them by index).
    pub groups: Vec<GroupEntry>,
    /// The memberships section (member_snapshot.rs format).
    pub members: Vec<u8>,
}

#[derive(bincode::Encode, bincode::Decode, Clone, Debug, PartialEq, Eq)]
pub struct GroupEntry {
    pub group_id: u64,
    pub head: u64,
    /// `(base_msg_id, bytes)` of every segment, oldest first; the last is the active one.
    pub segments: Vec<(u64, u64)>,
    pub retention: crate::retention::Retention,
    /// Why the group failed verification; it stays damaged (answering
    /// `GroupDamaged`, never loaded) until an operator repairs it.
    pub damaged: Option<String>,
}

pub fn path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The checkpoint before the current one, kept (with the journal files it
/// needs) so a damaged current checkpoint still leaves a recovery point.
pub fn previous_path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint.prev")
}

pub fn encode(body: &CheckpointBody) -> Vec<u8> {
    let payload = codec::encode(body);
    let mut out = Vec::with_capacity(CHECKPOINT_HEADER_BYTES + payload.len());
    out.extend_from_slice(&CHECKPOINT_MAGIC);
    out.extend_from_slice(&CHECKPOINT_VERSION.to_le_bytes());
    out.extend_from_slice(&(CHECKPOINT_HEADER_BYTES as u16).to_le_bytes());
    out.extend_from_slice(&[0u8; 4]);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    let header_crc = crc32fast::hash(&out[0..28]);
    out.extend_from_slice(&header_crc.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

pub fn decode(bytes: &[u8]) -> Result<CheckpointBody, String> {
    if bytes.len() < CHECKPOINT_HEADER_BYTES {
        return Err(format!(
            "{} bytes is shorter than the checkpoint header",
            bytes.len()
        ));
    }
    let u32_at =
        |o: usize| u32::from_le_bytes([bytes[o], bytes[o + 1], bytes[o + 2], bytes[o + 3]]);
    if crc32fast::hash(&bytes[0..28]) != u32_at(28) {
        return Err("checkpoint header checksum mismatch".into());
    }
    if bytes[0..8] != CHECKPOINT_MAGIC {
        return Err("bad checkpoint magic".into());
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if version != CHECKPOINT_VERSION {
        return Err(format!("unsupported checkpoint version {version}"));
    }
    let mut l = [0u8; 8];
    l.copy_from_slice(&bytes[16..24]);
    let body = &bytes[CHECKPOINT_HEADER_BYTES..];
    if u64::from_le_bytes(l) != body.len() as u64 {
        return Err(format!(
            "body length {} but {} bytes follow the header",
            u64::from_le_bytes(l),
            body.len()
        ));
    }
    if crc32fast::hash(body) != u32_at(24) {
        return Err("checkpoint body checksum mismatch".into());
    }
    let decoded: CheckpointBody = codec::decode(body)?;
    for g in &decoded.groups {
        // Bases rise from at least 1 (ids start at 1) to at most head + 1,
        // and every segment holds at least its header.
        let rising = g.segments.windows(2).all(|w| w[0].0 < w[1].0);
        let headers = g
            .segments
            .iter()
            .all(|&(_, len)| len >= crate::segment::SEGMENT_HEADER_BYTES as u64);
        if g.segments.is_empty()
            || !rising
            || !headers
            || g.segments[0].0 == 0
            || g.segments[g.segments.len() - 1].0 > g.head.saturating_add(1)
        {
            return Err(format!(
                "group {} has an inconsistent segment list",
                g.group_id
            ));
        }
    }
    Ok(decoded)
}

/// Reads a checkpoint file. `Ok(None)` when there is none; `Err(reason)`
/// inside `Ok(Some(Err))` when it exists but is invalid.
pub fn load(vfs: &dyn Vfs, p: &Path) -> Result<Option<Result<CheckpointBody, String>>> {
    if !vfs.exists(p) {
        return Ok(None);
    }
    let file = vfs
        .open(p, OpenMode::Read)
        .map_err(|e| Error::io(format!("open {}", p.display()), e))?;
    let len = file
        .file_len()
        .map_err(|e| Error::io(format!("stat {}", p.display()), e))?;
    if len > codec::DECODE_LIMIT_BYTES as u64 {
        return Ok(Some(Err(format!(
            "checkpoint of {len} bytes exceeds the limit"
        ))));
    }
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| Error::io(format!("read {}", p.display()), e))?;
    Ok(Some(decode(&buf)))
}

/// Writes the checkpoint atomically (tmp file, fdatasync, the current one
/// renamed to `checkpoint.prev`, tmp renamed to `checkpoint`, dir fsync).
/// `rotate` is false when the current checkpoint is invalid: a damaged file
/// must not replace a valid `checkpoint.prev`. Returns the bytes written
/// (the file's size), for the checkpoint statistics.
pub fn store(vfs: &dyn Vfs, data_dir: &Path, body: &CheckpointBody, rotate: bool) -> Result<u64> {
    let final_path = path(data_dir);
    let tmp = data_dir.join("checkpoint.tmp");
    let bytes = encode(body);
    let file = vfs
        .open(&tmp, OpenMode::ReadWriteCreate)
        .map_err(|e| Error::io(format!("create {}", tmp.display()), e))?;
    file.set_len(0)
        .map_err(|e| Error::io(format!("truncate {}", tmp.display()), e))?;
    file.write_all_at(&bytes, 0)
        .map_err(|e| Error::write(format!("write {}", tmp.display()), e))?;
    file.sync_data()
        .map_err(|e| Error::io(format!("fdatasync {}", tmp.display()), e))?;
    drop(file);
    if rotate && vfs.exists(&final_path) {
        let prev = previous_path(data_dir);
        vfs.rename(&final_path, &prev)
            .map_err(|e| Error::io(format!("rename {}", final_path.display()), e))?;
    }
    vfs.rename(&tmp, &final_path)
        .map_err(|e| Error::io(format!("rename {}", tmp.display()), e))?;
    vfs.sync_dir(data_dir)
        .map_err(|e| Error::io(format!("fsync dir {}", data_dir.display()), e))?;
    Ok(bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointBody {
        CheckpointBody {
            journal_seq: 3,
            clean_shutdown: true,
            created_ms: 5,
            groups: vec![GroupEntry {
                group_id: 1,
                head: 10,
                segments: vec![(1, 64), (6, 300)],
                retention: Default::default(),
                damaged: None,
            }],
            members: vec![0],
        }
    }

    #[test]
    fn round_trip() {
        assert_eq!(decode(&encode(&sample())).unwrap(), sample());
    }

    #[test]
    fn segment_lists_no_log_could_have_are_refused() {
        let with = |segments: Vec<(u64, u64)>| {
            let mut b = sample();
            b.groups[0].segments = segments;
            decode(&encode(&b))
        };
        assert!(with(vec![(1, 64), (6, 300)]).is_ok());
        for bad in [
            vec![],
            vec![(0, 64), (6, 300)],  // ids start at 1
            vec![(6, 64), (1, 300)],  // bases fall
            vec![(1, 63), (6, 300)],  // shorter than a segment header
            vec![(1, 64), (12, 300)], // base above head + 1
        ] {
            assert!(with(bad.clone()).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn any_flipped_byte_is_detected() {
        let bytes = encode(&sample());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x01;
            assert!(decode(&b).is_err(), "byte {i}");
        }
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err());
        }
    }
}
