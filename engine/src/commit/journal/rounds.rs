//! The round index: where each Round frame of the retained journal lies,
//! so that the replicated payloads of rounds `lo..=hi` can be read back
//! byte for byte by positioned reads (`read_rounds`, the `entries(lo, hi)`
//! of a later Raft log store; format-spec/storage.md section 17).
//!
//! Representation: per journal file holding Round frames, `(seq,
//! first_round, offsets)`, where `offsets[i]` is the file offset of the
//! frame of round `first_round + i`; files oldest first. Round numbers are
//! dense within a file (the writer numbers them so); between files they
//! are dense too, except where a power cut under `interval` or `never`
//! lost frames that a checkpoint had already counted (section 5): such a
//! gap reads as "not retained". `next_round` is the round the journal
//! writer numbers next, so `last_round = next_round - 1` holds also when
//! no round is retained (after a clean restart).
//!
//! Invariants: a round is in the index only once its frame was written
//! (the commit thread records it after the write, recovery as it replays
//! the frame); a file leaves the index when the checkpoint that deletes it
//! does (`checkpointer.rs`), before the file is removed, so a reader that
//! found a position and then finds no file reports the round compacted.
//!
//! Costs: 4 bytes per retained round (plus a few words per file), bounded
//! by the retained journal (`checkpoint_journal_bytes` twice over, D6);
//! recording a round is O(1) under a mutex held for nothing else; a
//! lookup is a binary search over the retained files. Reading a round is
//! two positioned reads (envelope, payload) after one header read per
//! file, and the two CRCs.

use std::collections::VecDeque;
use std::path::Path;

use parking_lot::Mutex;

use super::frame::{self, FrameKind, ENVELOPE_BYTES};
use super::header::{decode_header_of, journal_path, JOURNAL_HEADER_BYTES};
use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs, VfsFile};

/// The Round frames of one journal file.
struct FileRounds {
    seq: u64,
    first_round: u64,
    /// 4 bytes a round: a frame starts below `journal_file_bytes`, which
    /// is at most `u32::MAX` (`Config::validate`), or alone at offset 48.
    offsets: Vec<u32>,
}

impl FileRounds {
    fn end_round(&self) -> u64 {
        // Saturating: a damaged or hostile header may name a round near
        // u64::MAX (the journal's own numbering then stops writes).
        self.first_round.saturating_add(self.offsets.len() as u64)
    }
}

struct Inner {
    files: VecDeque<FileRounds>,
    next_round: u64,
}

/// Where the retained rounds lie (module docs).
pub struct RoundIndex {
    inner: Mutex<Inner>,
}

impl Default for RoundIndex {
    fn default() -> Self {
        RoundIndex {
            inner: Mutex::new(Inner {
                files: VecDeque::new(),
                next_round: 1,
            }),
        }
    }
}

impl RoundIndex {
    /// Notes that the frame of `round` was written at `offset` of journal
    /// file `seq`.
    pub fn record(&self, seq: u64, offset: u64, round: u64) {
        // Cannot saturate (see `FileRounds::offsets`); if it did, reading
        // the round would fail its frame checks, never return other bytes.
        let offset = u32::try_from(offset).unwrap_or(u32::MAX);
        let mut g = self.inner.lock();
        match g.files.back_mut() {
            Some(f) if f.seq == seq && f.end_round() == round => f.offsets.push(offset),
            _ => g.files.push_back(FileRounds {
                seq,
                first_round: round,
                offsets: vec![offset],
            }),
        }
        g.next_round = g.next_round.max(round.saturating_add(1));
    }

    /// The journal writer numbers its next round `round` (recovery's end:
    /// also when no retained file holds a frame).
    pub fn continue_at(&self, round: u64) {
        let mut g = self.inner.lock();
        g.next_round = g.next_round.max(round);
    }

    /// Journal files below `seq` are being deleted: their rounds are no
    /// longer retained.
    pub fn forget_files_below(&self, seq: u64) {
        let mut g = self.inner.lock();
        while g.files.front().is_some_and(|f| f.seq < seq) {
            g.files.pop_front();
        }
    }

    /// The oldest retained round; `last_round() + 1` when none is.
    pub fn first_round(&self) -> u64 {
        let g = self.inner.lock();
        g.files.front().map_or(g.next_round, |f| f.first_round)
    }

    /// The newest round written (0 before the first).
    pub fn last_round(&self) -> u64 {
        self.inner.lock().next_round - 1
    }

    /// Where the frame of `round` lies: `(journal seq, offset)`.
    pub fn position(&self, round: u64) -> Result<(u64, u64)> {
        let g = self.inner.lock();
        if round >= g.next_round {
            return Err(Error::RoundNotWritten {
                round,
                last: g.next_round - 1,
            });
        }
        let first = g.files.front().map_or(g.next_round, |f| f.first_round);
        let compacted = Error::RoundCompacted { round, first };
        // The last file starting at or below `round`.
        let i = g.files.partition_point(|f| f.first_round <= round);
        let Some(f) = i.checked_sub(1).and_then(|i| g.files.get(i)) else {
            return Err(compacted);
        };
        match f.offsets.get((round - f.first_round) as usize) {
            Some(&offset) => Ok((f.seq, u64::from(offset))),
            // A gap a power cut left between files.
            None => Err(compacted),
        }
    }
}

/// One round's replicated payload, byte for byte as its journal frame
/// holds it (format-spec/storage.md section 5: payload header and
/// entries; no envelope).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoundPayload {
    pub round_index: u64,
    pub bytes: Vec<u8>,
}

/// An open journal file and its envelope key, for consecutive rounds.
struct OpenFile {
    seq: u64,
    file: Box<dyn VfsFile>,
    mark_key: u32,
}

/// The payloads of rounds `lo..=hi` (empty if `lo > hi`), oldest first,
/// read from the journal files in `dir` where `index` says they lie: as
/// many as fit `bytes_max` payload bytes, but at least one. Each frame's
/// envelope and payload are checked (the keyed envelope CRC, the payload
/// CRC, structure and `round_index`). Errors: `RoundCompacted` for a round
/// no longer retained (also when its file was deleted after the lookup),
/// `RoundNotWritten` for `hi` past the last round, `Corrupt` for a frame
/// that fails its checks (damage after it was written).
pub fn read_rounds(
    vfs: &dyn Vfs,
    dir: &Path,
    index: &RoundIndex,
    lo: u64,
    hi: u64,
    bytes_max: usize,
) -> Result<Vec<RoundPayload>> {
    let mut out: Vec<RoundPayload> = Vec::new();
    if lo > hi {
        return Ok(out);
    }
    let last = index.last_round();
    if hi > last {
        return Err(Error::RoundNotWritten { round: hi, last });
    }
    let mut total = 0usize;
    let mut open: Option<OpenFile> = None;
    for round in lo..=hi {
        let (seq, offset) = index.position(round)?;
        if open.as_ref().is_none_or(|o| o.seq != seq) {
            open = Some(open_file(vfs, dir, seq, round, index)?);
        }
        // Invariant: set just above.
        let o = open.as_ref().expect("invariant: file opened above");
        let path = journal_path(dir, seq);
        let bytes = read_frame(&*o.file, &path, offset, o.mark_key, round)?;
        if !out.is_empty() && total.saturating_add(bytes.len()) > bytes_max {
            break;
        }
        total += bytes.len();
        out.push(RoundPayload {
            round_index: round,
            bytes,
        });
    }
    Ok(out)
}

/// Opens journal file `seq` and reads its envelope key from its header. A
/// file that is gone was deleted by a checkpoint after `round` was looked
/// up: the round is compacted.
fn open_file(
    vfs: &dyn Vfs,
    dir: &Path,
    seq: u64,
    round: u64,
    index: &RoundIndex,
) -> Result<OpenFile> {
    let path = journal_path(dir, seq);
    let file = match vfs.open(&path, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::RoundCompacted {
                round,
                first: index.first_round(),
            })
        }
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    let mut h = [0u8; JOURNAL_HEADER_BYTES];
    file.read_exact_at(&mut h, 0)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let header = decode_header_of(&h).map_err(|reason| Error::Corrupt {
        path: path.clone(),
        group: None,
        offset: 0,
        reason,
    })?;
    Ok(OpenFile {
        seq,
        file,
        mark_key: header.mark_key,
    })
}

/// The checked payload of the Round frame of `round` at `offset`.
fn read_frame(
    file: &dyn VfsFile,
    path: &Path,
    offset: u64,
    mark_key: u32,
    round: u64,
) -> Result<Vec<u8>> {
    let corrupt = |reason: String| Error::Corrupt {
        path: path.to_owned(),
        group: None,
        offset,
        reason,
    };
    let read_err = |e| Error::io(format!("read {}", path.display()), e);
    let mut env = [0u8; ENVELOPE_BYTES];
    file.read_exact_at(&mut env, offset).map_err(read_err)?;
    let envelope = frame::check_envelope(&env, offset, mark_key).map_err(corrupt)?;
    // The length comes from a checked envelope, and the file must hold it
    // (no allocation of a length that damage made up).
    let file_len = file.file_len().map_err(read_err)?;
    let start = offset + ENVELOPE_BYTES as u64;
    let len = u64::from(envelope.payload_len);
    if start.saturating_add(len) > file_len {
        return Err(corrupt(format!(
            "frame payload of {len} bytes runs past the end of the file"
        )));
    }
    let mut payload = vec![0u8; len as usize];
    file.read_exact_at(&mut payload, start).map_err(read_err)?;
    let header = frame::check_payload(&payload, envelope.kind).map_err(corrupt)?;
    if envelope.kind != FrameKind::Round || header.round_index != round {
        return Err(corrupt(format!(
            "the round index names round {round} here, the frame holds a {:?} frame of round {}",
            envelope.kind, header.round_index
        )));
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_finds_rounds_across_files_and_forgets_deleted_files() {
        let ix = RoundIndex::default();
        assert_eq!((ix.first_round(), ix.last_round()), (1, 0));
        assert!(matches!(
            ix.position(1),
            Err(Error::RoundNotWritten { round: 1, last: 0 })
        ));
        ix.record(3, 48, 1);
        ix.record(3, 100, 2);
        ix.record(4, 48, 3);
        // A power cut lost rounds 4..=5; the next file starts at 6.
        ix.record(6, 48, 6);
        assert_eq!((ix.first_round(), ix.last_round()), (1, 6));
        assert_eq!(ix.position(2).unwrap(), (3, 100));
        assert_eq!(ix.position(3).unwrap(), (4, 48));
        assert_eq!(ix.position(6).unwrap(), (6, 48));
        assert!(matches!(
            ix.position(5),
            Err(Error::RoundCompacted { round: 5, first: 1 })
        ));
        ix.forget_files_below(4);
        assert_eq!(ix.first_round(), 3);
        assert!(matches!(
            ix.position(2),
            Err(Error::RoundCompacted { round: 2, first: 3 })
        ));
        ix.forget_files_below(7);
        assert_eq!((ix.first_round(), ix.last_round()), (7, 6));
        ix.continue_at(9);
        assert_eq!((ix.first_round(), ix.last_round()), (9, 8));
    }
}
