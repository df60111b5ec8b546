//! A small group's log: where its records lie in the shared files (journal
//! and cold files), as an ordered list of extents (storage v2 design 3.1).
//!
//! Representation. An [`Extent`] is 16 bytes: a file ([`FileId`], a journal
//! or cold file's sequence number with the kind in bit 31), the offset of
//! its first record, the byte length of a run of whole records of one
//! group, and `count_flags` = record count (24 bits) | flags (8 bits; bit 0
//! `verified`: every record's CRC was checked since the extent was made).
//! An [`ExtentList`] holds the group's extents in id order with
//! `first_id` (the id of the first record of the first extent) and the
//! retention `floor`; the id of the first record of extent `i` is
//! `first_id + sum(count_j, j < i)`.
//!
//! Invariant E1 (checked after every change in debug builds):
//! - extents are in id order and contiguous in ids, each holding 1 to
//!   [`EXTENT_COUNT_MAX`] records in at least 44 bytes each, inside one
//!   file (offset + bytes fits `u32`);
//! - `first_id <= floor`; `floor` is an id of the first extent, or, with no
//!   extent, `first_id == floor` is the next id to be appended. Records of
//!   the first extent below `floor` (left by a trim inside it) are still on
//!   disk and counted, skipped by reads and dropped by the next rewrite.
//! - E1's other half, "each extent is a run of valid records of this group
//!   with the ids the list says", is a property of the files: a read checks
//!   it for the records it walks ([`read_run`]) and reports a mismatch as
//!   `GroupDamaged` naming file and offset.
//!
//! Memory: an idle group (one extent, the common case once its journal file
//! is evacuated) holds it inline, without an allocation; more extents spill
//! into a `Vec`, and shrinking back to one frees it. `size_of::<ExtentList>()`
//! is 40 bytes (pinned by a test).
//!
//! Costs: lookups walk the list from the front, O(extents), in memory and
//! under the group's lock; a small group has at most `extents_coalesce` cold
//! extents plus one per round it appeared in within the replay window, and at
//! most `small_group_bytes_max` bytes, so the walk is short. Reading record
//! bytes ([`read_run`]) happens outside the lock, on a mapping of the file,
//! and costs the bytes it walks: the records of the extent up to the last one
//! served (with a CRC check each while the extent is not verified).
//!
//! Wired into the engine by step S5/S6 (small groups in the journal, cold
//! files); until then only tests use it.

use std::path::Path;

use crate::error::{Error, Result};
use crate::logs::record::{self, RECORD_BYTES_STORED_MAX, RECORD_HEADER_BYTES};

/// Bit 31 of a [`FileId`]: set for a cold file, clear for a journal file.
const FILE_COLD: u32 = 1 << 31;
/// Records an extent holds at most (its count has 24 bits).
pub const EXTENT_COUNT_MAX: u32 = (1 << 24) - 1;
const COUNT_MASK: u32 = EXTENT_COUNT_MAX;
/// `count_flags` bit of flag 0, `verified`.
const FLAG_VERIFIED: u32 = 1 << 24;

/// The kind of a shared file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// `log/<seq>.tmj`, a commit journal file.
    Journal,
    /// `log/<seq>.tmc`, a cold file (records moved out of old journal files).
    Cold,
}

/// A shared file: its kind and sequence number in 32 bits (kind in bit 31),
/// so an extent stays 16 bytes. Sequence numbers are below 2^31: 2^31 files
/// of 64 MiB are 128 PiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(u32);

impl FileId {
    /// Journal file `seq`, or `None` if `seq` does not fit 31 bits.
    pub fn journal(seq: u64) -> Option<FileId> {
        u32::try_from(seq)
            .ok()
            .filter(|s| s & FILE_COLD == 0)
            .map(FileId)
    }

    /// Cold file `seq`, or `None` if `seq` does not fit 31 bits.
    pub fn cold(seq: u64) -> Option<FileId> {
        Self::journal(seq).map(|f| FileId(f.0 | FILE_COLD))
    }

    pub fn kind(self) -> FileKind {
        if self.0 & FILE_COLD == 0 {
            FileKind::Journal
        } else {
            FileKind::Cold
        }
    }

    pub fn seq(self) -> u64 {
        u64::from(self.0 & !FILE_COLD)
    }

    /// The 32 bits as stored (checkpoint items, manifests): a journal
    /// file's seq, or 2^31 + a cold file's seq.
    pub fn raw(self) -> u32 {
        self.0
    }

    /// The file `raw` names (every `u32` names one).
    pub fn from_raw(raw: u32) -> FileId {
        FileId(raw)
    }
}

/// A run of whole records of one group, contiguous in one shared file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    file: FileId,
    offset: u32,
    bytes: u32,
    count_flags: u32,
}

impl Extent {
    /// An extent of `count` records in `bytes` bytes at `offset` of `file`,
    /// not verified. `None` if that cannot be a run of records the list can
    /// hold: no record, more than [`EXTENT_COUNT_MAX`], fewer than 44 bytes
    /// per record, or an end beyond 4 GiB (shared files stay below it).
    pub fn new(file: FileId, offset: u32, bytes: u32, count: u32) -> Option<Extent> {
        let fits = (1..=EXTENT_COUNT_MAX).contains(&count)
            && u64::from(bytes) >= u64::from(count) * RECORD_HEADER_BYTES as u64
            && offset.checked_add(bytes).is_some();
        fits.then_some(Extent {
            file,
            offset,
            bytes,
            count_flags: count,
        })
    }

    /// The same extent with the `verified` flag set (its writer checked
    /// every record's CRC, as the cold writer does).
    pub fn verified(mut self) -> Extent {
        self.count_flags |= FLAG_VERIFIED;
        self
    }

    pub fn file(&self) -> FileId {
        self.file
    }

    /// Offset of the first record in the file.
    pub fn offset(&self) -> u32 {
        self.offset
    }

    pub fn bytes(&self) -> u32 {
        self.bytes
    }

    /// Offset just past the last record.
    pub fn end(&self) -> u64 {
        u64::from(self.offset) + u64::from(self.bytes)
    }

    pub fn count(&self) -> u32 {
        self.count_flags & COUNT_MASK
    }

    pub fn is_verified(&self) -> bool {
        self.count_flags & FLAG_VERIFIED != 0
    }

    /// Same records in the same place (the `verified` flag aside, which a
    /// reader may set at any time).
    pub fn same_place(&self, other: &Extent) -> bool {
        (self.file, self.offset, self.bytes, self.count())
            == (other.file, other.offset, other.bytes, other.count())
    }
}

/// The extents of a list: none and one inline, more in a `Vec` (`Many`
/// always holds at least two).
#[derive(Clone, Debug, Default)]
enum Slots {
    #[default]
    Empty,
    One(Extent),
    Many(Vec<Extent>),
}

impl Slots {
    fn as_slice(&self) -> &[Extent] {
        match self {
            Slots::Empty => &[],
            Slots::One(e) => std::slice::from_ref(e),
            Slots::Many(v) => v,
        }
    }

    fn as_mut_slice(&mut self) -> &mut [Extent] {
        match self {
            Slots::Empty => &mut [],
            Slots::One(e) => std::slice::from_mut(e),
            Slots::Many(v) => v,
        }
    }

    fn from_vec(mut v: Vec<Extent>) -> Slots {
        match v.len() {
            0 => Slots::Empty,
            1 => Slots::One(v[0]),
            _ => {
                // A list that shrank a lot (trim, coalescing) gives memory back.
                if v.capacity() > 2 * v.len() {
                    v.shrink_to_fit();
                }
                Slots::Many(v)
            }
        }
    }

    /// Replaces the extents in `range` by `new` (if any), allocating only
    /// when the result holds more than one.
    fn splice(&mut self, range: std::ops::Range<usize>, new: Option<Extent>) {
        let result = self.as_slice().len() - range.len() + usize::from(new.is_some());
        *self = match (std::mem::take(self), result) {
            (_, 0) => Slots::Empty,
            (Slots::Many(mut v), _) => {
                v.splice(range, new);
                Slots::from_vec(v)
            }
            // At most one extent before, one after: `new` replaces it, or
            // nothing changes.
            (Slots::One(e), 1) => Slots::One(new.unwrap_or(e)),
            (Slots::Empty, 1) => Slots::One(new.expect("invariant: result 1 from empty needs new")),
            (old, _) => {
                let mut v = old.as_slice().to_vec();
                v.splice(range, new);
                Slots::from_vec(v)
            }
        };
    }
}

/// A small group's extent list: its records `floor..next_id()`.
#[derive(Clone, Debug)]
pub struct ExtentList {
    first_id: u64,
    floor: u64,
    slots: Slots,
}

/// One extent a read needs, with the id of its first record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub first_id: u64,
    pub ext: Extent,
}

impl Piece {
    /// Id just past the extent's last record.
    pub fn end_id(&self) -> u64 {
        self.first_id + u64::from(self.ext.count())
    }
}

/// Why [`ExtentList::replace`] did not install a rewritten extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplaceError {
    /// The extents the rewrite copied are no longer exactly in the list (a
    /// trim, a delete or another rewrite came first): the copy is dead on
    /// arrival (raft-engine's rewrite gate).
    Stale,
    /// The new extent does not hold exactly the ids of the replaced ones
    /// (minus, for the first extent, ids below the floor).
    Mismatch,
}

impl ExtentList {
    /// An empty list whose first record will be `next_id` (1 for a new group).
    pub fn new(next_id: u64) -> ExtentList {
        ExtentList {
            first_id: next_id,
            floor: next_id,
            slots: Slots::Empty,
        }
    }

    /// Id of the first record of the first extent (below `floor` after a
    /// trim inside it).
    pub fn first_id(&self) -> u64 {
        self.first_id
    }

    /// The oldest id reads may return.
    pub fn floor(&self) -> u64 {
        self.floor
    }

    pub fn extents(&self) -> &[Extent] {
        self.slots.as_slice()
    }

    /// Id the next appended record must have (`head + 1`). O(extents).
    pub fn next_id(&self) -> u64 {
        self.first_id
            + self
                .extents()
                .iter()
                .map(|e| u64::from(e.count()))
                .sum::<u64>()
    }

    /// Bytes of all extents (records below the floor included: they are on
    /// disk until the next rewrite). O(extents).
    pub fn bytes(&self) -> u64 {
        self.extents().iter().map(|e| u64::from(e.bytes())).sum()
    }

    /// The extents with their first ids.
    pub fn pieces(&self) -> impl Iterator<Item = Piece> + '_ {
        let mut id = self.first_id;
        self.extents().iter().map(move |&ext| {
            let p = Piece { first_id: id, ext };
            id += u64::from(ext.count());
            p
        })
    }

    /// Appends the run `ext` whose first record is `first` (a round's
    /// records of this group, or a promotion's catch-up). The caller (apply)
    /// derived `first` from the group's head, so it is `next_id()`; that is
    /// asserted in debug builds only, as it costs a walk of the list.
    ///
    /// Adjacency: a run that starts where the last extent ends in the same
    /// file extends it (if the count still fits), so a list never holds two
    /// extents that could be one; it stays verified only if both were.
    pub fn append(&mut self, first: u64, ext: Extent) {
        debug_assert_eq!(first, self.next_id(), "append must continue the ids");
        let _ = first;
        if let Some(last) = self.slots.as_mut_slice().last_mut() {
            let count = last.count() + ext.count();
            if last.file == ext.file
                && last.end() == u64::from(ext.offset)
                && count <= EXTENT_COUNT_MAX
                && last
                    .bytes
                    .checked_add(ext.bytes)
                    .and_then(|b| last.offset.checked_add(b))
                    .is_some()
            {
                let verified = last.is_verified() && ext.is_verified();
                last.bytes += ext.bytes;
                last.count_flags = count | if verified { FLAG_VERIFIED } else { 0 };
                self.check();
                return;
            }
        }
        let n = self.extents().len();
        self.slots.splice(n..n, Some(ext));
        self.check();
    }

    /// The extents a read of the records above `after` needs, at most
    /// `count_max` records and about `bytes_max` bytes: the extent holding
    /// the first wanted id, then following ones until they hold `count_max`
    /// ids or `bytes_max` bytes (the first extent's bytes are not counted:
    /// it may hold mostly records before the wanted ones). Taken under the
    /// group's lock; the bytes are read after it with [`read_run`].
    pub fn covering(&self, after: u64, count_max: u64, bytes_max: usize) -> Vec<Piece> {
        let from = after.saturating_add(1).max(self.floor);
        let mut out = Vec::new();
        if count_max == 0 {
            return out;
        }
        let (mut ids, mut bytes) = (0u64, 0u64);
        for p in self.pieces().skip_while(|p| p.end_id() <= from) {
            if !out.is_empty() {
                bytes += u64::from(p.ext.bytes());
            }
            ids += p.end_id() - from.max(p.first_id);
            out.push(p);
            if ids >= count_max || bytes >= bytes_max as u64 {
                break;
            }
        }
        out
    }

    /// Sets the `verified` flag of `ext` if it is still in the list (a read
    /// checked every record of it outside the lock; the list may have
    /// changed meanwhile).
    pub fn mark_verified(&mut self, ext: &Extent) {
        if let Some(e) = self
            .slots
            .as_mut_slice()
            .iter_mut()
            .find(|e| e.same_place(ext))
        {
            *e = e.verified();
        }
    }

    /// Raises the floor to `floor` (clamped to `next_id()`: apply checked a
    /// Trim's floor against the head) and drops the extents wholly below it,
    /// handing each to `dropped` (for the files' live-byte accounting). An
    /// extent straddling the floor stays whole.
    pub fn trim(&mut self, floor: u64, mut dropped: impl FnMut(&Extent)) {
        let floor = floor.min(self.next_id());
        if floor <= self.floor {
            return;
        }
        self.floor = floor;
        let (mut n, mut first) = (0, self.first_id);
        for p in self.pieces() {
            if p.end_id() > floor {
                break;
            }
            dropped(&p.ext);
            first = p.end_id();
            n += 1;
        }
        self.first_id = first;
        self.slots.splice(0..n, None);
        self.check();
    }

    /// Installs `new`, a rewrite of the extents `old` (a contiguous run of
    /// the list when the rewrite copied them), whose first record is
    /// `new_first`, **only if `old` is still exactly in the list** (the
    /// rewrite ran outside the group's lock; a trim, a delete or another
    /// rewrite may have changed the list since). A rewrite of the first
    /// extent may leave out records below the floor (`new_first` then lies
    /// between the old first id and the floor); otherwise `new` holds
    /// exactly the ids of `old`.
    ///
    /// On success the caller moves `old`'s bytes from their files' live
    /// counts to `new`'s file.
    pub fn replace(
        &mut self,
        old: &[Extent],
        new_first: u64,
        new: Extent,
    ) -> Result<(), ReplaceError> {
        let Some(first_old) = old.first() else {
            return Err(ReplaceError::Mismatch);
        };
        let list = self.extents();
        let Some(at) = (0..list.len().saturating_sub(old.len() - 1)).find(|&i| {
            list[i].same_place(first_old)
                && list[i..i + old.len()]
                    .iter()
                    .zip(old)
                    .all(|(a, b)| a.same_place(b))
        }) else {
            return Err(ReplaceError::Stale);
        };
        let run_first =
            self.first_id + list[..at].iter().map(|e| u64::from(e.count())).sum::<u64>();
        let run_end = run_first + old.iter().map(|e| u64::from(e.count())).sum::<u64>();
        let first_ok = if at == 0 {
            (run_first..=self.floor).contains(&new_first)
        } else {
            new_first == run_first
        };
        if !first_ok || new_first + u64::from(new.count()) != run_end {
            return Err(ReplaceError::Mismatch);
        }
        if at == 0 {
            self.first_id = new_first;
        }
        self.slots.splice(at..at + old.len(), Some(new));
        self.check();
        Ok(())
    }

    /// Keeps the first `n` extents only (recovery: the records of the
    /// others were lost with a journal's unsynced tail) and hands each
    /// dropped extent to `dropped`. Refused (`false`, nothing changes) when
    /// that would drop the extent holding the floor above the list's first
    /// id: its ids below the floor were given out, and a list that starts
    /// over at `first_id` would give them again.
    pub fn truncate(&mut self, n: usize, mut dropped: impl FnMut(&Extent)) -> bool {
        let len = self.extents().len();
        if n >= len {
            return true;
        }
        if n == 0 && self.floor != self.first_id {
            return false;
        }
        for e in &self.extents()[n..] {
            dropped(e);
        }
        self.slots.splice(n..len, None);
        self.check();
        true
    }

    /// Invariant E1, its in-memory half (see the module docs). Debug builds
    /// only: it walks the list.
    fn check(&self) {
        if cfg!(debug_assertions) {
            assert!(self.first_id >= 1, "E1: ids start at 1");
            assert!(
                !matches!(&self.slots, Slots::Many(v) if v.len() < 2),
                "E1: a spilled list holds at least two extents"
            );
            for e in self.extents() {
                assert!((1..=EXTENT_COUNT_MAX).contains(&e.count()), "E1: count");
                assert!(
                    u64::from(e.bytes) >= u64::from(e.count()) * RECORD_HEADER_BYTES as u64,
                    "E1: bytes of whole records"
                );
                assert!(e.end() <= u64::from(u32::MAX), "E1: inside one file");
            }
            match self.pieces().next() {
                Some(p) => assert!(
                    (p.first_id..p.end_id()).contains(&self.floor),
                    "E1: the floor lies in the first extent"
                ),
                None => assert_eq!(self.first_id, self.floor, "E1: an empty list's floor"),
            }
        }
    }
}

/// What [`read_run`] found in one extent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunRead {
    /// File offsets of the records served: `[start, end)` (empty if none).
    pub start: u64,
    pub end: u64,
    /// Records served, and the id of the first one.
    pub first_id: u64,
    pub count: u64,
    /// The budget ran out inside this extent: the read is complete.
    pub full: bool,
    /// The extent was not verified and this read checked the CRC of every
    /// one of its records: the caller sets its flag
    /// ([`ExtentList::mark_verified`]).
    pub verified_now: bool,
}

/// Reads the records of `piece` from `from` on (an id of the extent), at
/// most `count_max` of them and `bytes_max` bytes, except that when `first`
/// is set (nothing served yet by this read) one record is served whatever
/// its size. `map` is the file's mapping, of which the caller checked that
/// the file still holds the extent's bytes (one length check before touching
/// the mapping: a cut file must not raise SIGBUS, segment.rs "Reads").
///
/// Walks record headers from the extent's start (record.rs is the only
/// module that knows them), checking on the way that each record has the id
/// the list says and, if the extent is not verified yet, its CRC; the
/// records must end exactly at the extent's end. Anything else is
/// `GroupDamaged` naming the file (`path`) and the offset.
#[allow(clippy::too_many_arguments)] // each is one fact of the read; a struct would only rename them
pub fn read_run(
    map: &[u8],
    path: &Path,
    group: u64,
    piece: &Piece,
    from: u64,
    count_max: u64,
    bytes_max: usize,
    first: bool,
) -> Result<RunRead> {
    let ext = &piece.ext;
    let damaged = |offset: u64, what: String| Error::GroupDamaged {
        group,
        reason: format!(
            "{}: offset {offset}: {what} (extent of ids {}..{} at offset {}, {} bytes)",
            path.display(),
            piece.first_id,
            piece.end_id(),
            ext.offset(),
            ext.bytes()
        ),
    };
    let end = ext.end();
    let Some(bytes) = usize::try_from(end)
        .ok()
        .and_then(|end| map.get(ext.offset() as usize..end))
    else {
        return Err(damaged(
            map.len() as u64,
            format!("the file's mapping ends at {} before the extent", map.len()),
        ));
    };
    debug_assert!((piece.first_id..piece.end_id()).contains(&from));
    let verify = !ext.is_verified();
    let mut out = RunRead {
        start: end,
        end,
        first_id: from,
        count: 0,
        full: false,
        verified_now: false,
    };
    let (mut pos, mut id, mut served_bytes) = (0usize, piece.first_id, 0usize);
    while id < piece.end_id() {
        let rest = &bytes[pos..];
        let at = u64::from(ext.offset()) + pos as u64;
        let len = if verify {
            let h = record::decode_header(rest, RECORD_BYTES_STORED_MAX)
                .map_err(|e| damaged(at, e.to_string()))?;
            h.record_len as usize
        } else {
            // Verified once; the length is still checked so that bytes
            // changed under the mapping cannot make a wrong slice.
            match record::peek_len(rest) {
                Some(len) if len >= RECORD_HEADER_BYTES && len <= rest.len() => len,
                found => {
                    return Err(damaged(
                        at,
                        format!("record length {found:?} where a verified record was"),
                    ))
                }
            }
        };
        let msg_id = record::peek_msg_id(rest);
        if msg_id != id {
            return Err(damaged(
                at,
                format!("record of msg_id {msg_id} where {id} was expected"),
            ));
        }
        if id >= from {
            let over = out.count >= count_max
                || ((out.count > 0 || !first) && served_bytes + len > bytes_max);
            if over {
                out.full = true;
                break;
            }
        }
        // The CRC of every record walked, served or skipped, so that a walk
        // to the extent's end verifies all of it; not of the record that
        // did not fit (the budget is checked first).
        if verify {
            record::decode_verified(rest, RECORD_BYTES_STORED_MAX)
                .map_err(|e| damaged(at, e.to_string()))?;
        }
        if id >= from {
            if out.count == 0 {
                out.start = at;
            }
            out.count += 1;
            served_bytes += len;
            out.end = at + len as u64;
        }
        pos += len;
        id += 1;
    }
    if id == piece.end_id() {
        if pos != bytes.len() {
            return Err(damaged(
                u64::from(ext.offset()) + pos as u64,
                format!(
                    "the extent's {} records end here, {} bytes before the extent's end",
                    ext.count(),
                    bytes.len() - pos
                ),
            ));
        }
        out.verified_now = verify;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use proptest::prelude::*;

    use super::*;
    use crate::logs::record::NewRecord;

    fn rec(id: u64, payload_len: usize) -> Vec<u8> {
        let mut out = Vec::new();
        record::encode_into(
            &NewRecord {
                msg_id: id,
                timestamp_ms: 1000 + id,
                sender_id: 7,
                client_msg_id: id,
                payload: &vec![id as u8; payload_len],
            },
            &mut out,
        );
        out
    }

    /// Shared files as byte vectors, and the oracle: `(id, record bytes)`
    /// of the group's stored records, `floor..next`.
    #[derive(Default)]
    struct World {
        files: HashMap<FileId, Vec<u8>>,
        journal_seq: u64,
        cold_seq: u64,
        model: Vec<(u64, Vec<u8>)>,
        next: u64,
    }

    impl World {
        fn new() -> World {
            World {
                journal_seq: 1,
                next: 1,
                ..Default::default()
            }
        }

        /// Writes `filler` bytes of other frames, then a run of records of
        /// the given payload sizes, into the current journal file; returns
        /// the run's extent.
        fn round(&mut self, filler: usize, sizes: &[usize]) -> (u64, Extent) {
            let file = FileId::journal(self.journal_seq).unwrap();
            let buf = self.files.entry(file).or_default();
            buf.extend(std::iter::repeat_n(0xAB, filler));
            let offset = buf.len();
            let first = self.next;
            for &s in sizes {
                let r = rec(self.next, s);
                buf.extend_from_slice(&r);
                self.model.push((self.next, r));
                self.next += 1;
            }
            let bytes = buf.len() - offset;
            let ext = Extent::new(file, offset as u32, bytes as u32, sizes.len() as u32).unwrap();
            (first, ext)
        }

        /// Copies the records of `old` (from `new_first` on) to a new cold
        /// file, as evacuation and compaction do.
        fn rewrite(&mut self, old: &[Extent], old_first: u64, new_first: u64) -> Extent {
            self.cold_seq += 1;
            let file = FileId::cold(self.cold_seq).unwrap();
            let mut buf = vec![0xCD; 32]; // stands for the headers of the cold file
            let mut id = old_first;
            let mut n = 0;
            for e in old {
                let src = &self.files[&e.file()];
                let mut pos = e.offset() as usize;
                for _ in 0..e.count() {
                    let len = record::peek_len(&src[pos..]).unwrap();
                    if id >= new_first {
                        buf.extend_from_slice(&src[pos..pos + len]);
                        n += 1;
                    }
                    pos += len;
                    id += 1;
                }
            }
            let bytes = buf.len() - 32;
            self.files.insert(file, buf);
            Extent::new(file, 32, bytes as u32, n).unwrap().verified()
        }

        fn path(f: FileId) -> PathBuf {
            PathBuf::from(format!("log/{:020}.{:?}", f.seq(), f.kind()))
        }

        /// A read as the engine does it: the pieces under the lock, then
        /// the bytes from the mappings; verified flags set afterwards.
        fn read(
            &self,
            list: &mut ExtentList,
            after: u64,
            count_max: u64,
            bytes_max: usize,
        ) -> Result<Vec<(u64, Vec<u8>)>> {
            let pieces = list.covering(after, count_max, bytes_max);
            let mut from = after.saturating_add(1).max(list.floor());
            let (mut out, mut bytes) = (Vec::new(), 0usize);
            for p in &pieces {
                let map = &self.files[&p.ext.file()];
                let r = read_run(
                    map,
                    &Self::path(p.ext.file()),
                    9,
                    p,
                    from,
                    count_max - out.len() as u64,
                    bytes_max.saturating_sub(bytes),
                    out.is_empty(),
                )?;
                let mut pos = r.start as usize;
                for i in 0..r.count {
                    let len = record::peek_len(&map[pos..]).unwrap();
                    out.push((r.first_id + i, map[pos..pos + len].to_vec()));
                    pos += len;
                }
                assert_eq!(pos as u64, r.end.max(r.start));
                bytes += (r.end - r.start) as usize;
                if r.verified_now {
                    list.mark_verified(&p.ext);
                }
                if r.full {
                    break;
                }
                from = p.end_id();
            }
            Ok(out)
        }

        /// The oracle's answer: records from `max(after + 1, floor)`, the
        /// first whatever its size, then while both budgets allow.
        fn expected(&self, after: u64, count_max: u64, bytes_max: usize) -> Vec<(u64, Vec<u8>)> {
            let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
            let mut bytes = 0;
            for (id, r) in self.model.iter().filter(|(id, _)| *id > after) {
                if out.len() as u64 >= count_max || (!out.is_empty() && bytes + r.len() > bytes_max)
                {
                    break;
                }
                bytes += r.len();
                out.push((*id, r.clone()));
            }
            out
        }
    }

    #[test]
    fn an_idle_list_holds_its_extent_inline_in_40_bytes() {
        assert_eq!(std::mem::size_of::<Extent>(), 16);
        assert_eq!(std::mem::size_of::<ExtentList>(), 40);
        let mut w = World::new();
        let mut list = ExtentList::new(1);
        let (first, e) = w.round(10, &[5, 6]);
        list.append(first, e);
        assert!(
            matches!(list.slots, Slots::One(_)),
            "one extent, no allocation"
        );
        let (first, e) = w.round(10, &[5]);
        list.append(first, e);
        assert!(matches!(&list.slots, Slots::Many(v) if v.len() == 2));
        // A trim down to one extent gives the allocation back.
        list.trim(3, |_| {});
        assert!(matches!(list.slots, Slots::One(_)));
        assert_eq!((list.first_id(), list.floor(), list.next_id()), (3, 3, 4));
    }

    #[test]
    fn file_ids_keep_kind_and_sequence_in_32_bits() {
        let j = FileId::journal(5).unwrap();
        let c = FileId::cold(5).unwrap();
        assert_ne!(j, c);
        assert_eq!((j.kind(), j.seq()), (FileKind::Journal, 5));
        assert_eq!((c.kind(), c.seq()), (FileKind::Cold, 5));
        assert_eq!(FileId::cold((1 << 31) - 1).unwrap().seq(), (1 << 31) - 1);
        assert_eq!(FileId::journal(1 << 31), None);
        assert_eq!(FileId::cold(u64::MAX), None);
    }

    #[test]
    fn extents_that_cannot_be_runs_of_records_are_refused() {
        let f = FileId::journal(1).unwrap();
        assert!(Extent::new(f, 0, 44, 1).is_some());
        assert!(Extent::new(f, 0, 0, 0).is_none(), "no record");
        assert!(
            Extent::new(f, 0, 87, 2).is_none(),
            "two records in 87 bytes"
        );
        assert!(Extent::new(f, 0, u32::MAX, EXTENT_COUNT_MAX + 1).is_none());
        assert!(Extent::new(f, u32::MAX - 10, 44, 1).is_none(), "past 4 GiB");
        let e = Extent::new(f, 100, 88, 2).unwrap();
        assert!(!e.is_verified());
        assert!(e.verified().is_verified());
        assert_eq!(e.verified().count(), 2);
        assert!(e.same_place(&e.verified()));
    }

    #[test]
    fn a_truncate_keeps_the_first_extents_and_never_the_ids_below_the_floor() {
        let j = FileId::journal(1).unwrap();
        let mut list = ExtentList::new(1);
        list.append(1, Extent::new(j, 100, 88, 2).unwrap());
        list.append(3, Extent::new(j, 300, 44, 1).unwrap());
        list.append(4, Extent::new(j, 400, 88, 2).unwrap());
        let mut gone = Vec::new();
        assert!(list.truncate(1, |e| gone.push(e.offset())));
        assert_eq!(gone, [300, 400]);
        assert_eq!((list.first_id(), list.floor(), list.next_id()), (1, 1, 3));
        assert!(list.truncate(5, |_| panic!("nothing past the end")));
        // Below a floor inside the first extent: its ids were given out,
        // so dropping it (the list would start over at them) is refused.
        list.trim(2, |_| {});
        assert!(!list.truncate(0, |_| panic!("refused")));
        assert_eq!(list.next_id(), 3);
        let mut whole = ExtentList::new(1);
        whole.append(1, Extent::new(j, 100, 88, 2).unwrap());
        assert!(whole.truncate(0, |_| {}));
        assert_eq!(
            (whole.first_id(), whole.floor(), whole.next_id()),
            (1, 1, 1)
        );
    }

    #[test]
    fn appends_merge_only_runs_that_touch_in_one_file() {
        let j1 = FileId::journal(1).unwrap();
        let j2 = FileId::journal(2).unwrap();
        let mut list = ExtentList::new(1);
        list.append(1, Extent::new(j1, 100, 88, 2).unwrap().verified());
        list.append(3, Extent::new(j1, 188, 44, 1).unwrap().verified());
        assert_eq!(list.extents().len(), 1, "adjacent: merged");
        assert_eq!(list.extents()[0].count(), 3);
        assert!(list.extents()[0].is_verified());
        list.append(4, Extent::new(j1, 232, 44, 1).unwrap());
        assert_eq!(list.extents().len(), 1);
        assert!(
            !list.extents()[0].is_verified(),
            "merged with an unverified run"
        );
        list.append(5, Extent::new(j1, 300, 44, 1).unwrap());
        list.append(6, Extent::new(j2, 344, 44, 1).unwrap());
        assert_eq!(list.extents().len(), 3, "a gap, another file: not merged");
        assert_eq!((list.next_id(), list.bytes()), (7, 264));
    }

    #[test]
    fn reads_skip_records_below_a_floor_inside_an_extent() {
        let mut w = World::new();
        let mut list = ExtentList::new(1);
        let (f, e) = w.round(3, &[1, 2, 3, 4]);
        list.append(f, e);
        let mut dropped = Vec::new();
        list.trim(3, |e| dropped.push(*e));
        assert!(dropped.is_empty(), "the extent straddles the floor");
        assert_eq!(
            (list.first_id(), list.floor(), list.bytes()),
            (1, 3, e.bytes() as u64)
        );
        w.model.retain(|(id, _)| *id >= 3);
        assert_eq!(
            w.read(&mut list, 0, 10, 1 << 20).unwrap(),
            w.expected(0, 10, 1 << 20)
        );
        list.trim(5, |e| dropped.push(*e));
        assert!(matches!(dropped[..], [d] if d.same_place(&e)));
        assert_eq!(
            (list.first_id(), list.floor(), list.extents().len()),
            (5, 5, 0)
        );
        assert!(list.covering(0, 10, 1 << 20).is_empty());
        // A floor beyond the head is clamped to it.
        list.trim(99, |_| panic!("nothing left"));
        assert_eq!(list.floor(), 5);
    }

    #[test]
    fn a_rewrite_is_installed_only_over_the_extents_it_copied() {
        let mut w = World::new();
        let mut list = ExtentList::new(1);
        for _ in 0..3 {
            let (f, e) = w.round(16, &[3, 4, 5]);
            list.append(f, e);
        }
        let old: Vec<Extent> = list.extents()[..2].to_vec();
        list.trim(2, |_| {});
        // The copier saw floor 2 and left record 1 out.
        let new = w.rewrite(&old, 1, 2);
        let mut trimmed = list.clone();
        trimmed.trim(3, |_| {});
        assert_eq!(
            trimmed.replace(&old, 2, new),
            Ok(()),
            "a floor that rose inside the extent still matches"
        );
        assert_eq!(
            list.replace(&old, 3, new),
            Err(ReplaceError::Mismatch),
            "wrong first id"
        );
        assert_eq!(
            list.replace(&old[1..], 3, new),
            Err(ReplaceError::Mismatch),
            "ids of another run"
        );
        assert_eq!(list.replace(&old, 2, new), Ok(()));
        assert_eq!(
            (list.first_id(), list.floor(), list.extents().len()),
            (2, 2, 2)
        );
        assert_eq!(
            list.replace(&old, 2, new),
            Err(ReplaceError::Stale),
            "already replaced"
        );
        assert_eq!(list.replace(&[], 2, new), Err(ReplaceError::Mismatch));
        w.model.retain(|(id, _)| *id >= 2);
        assert_eq!(
            w.read(&mut list, 0, 99, 1 << 20).unwrap(),
            w.expected(0, 99, 1 << 20)
        );
        // A trim that drops the copied extents before the install: stale.
        let mut list2 = ExtentList::new(1);
        let mut w2 = World::new();
        for _ in 0..2 {
            let (f, e) = w2.round(1, &[1]);
            list2.append(f, e);
        }
        let old2 = list2.extents()[..1].to_vec();
        let new2 = w2.rewrite(&old2, 1, 1);
        list2.trim(2, |_| {});
        assert_eq!(list2.replace(&old2, 1, new2), Err(ReplaceError::Stale));
    }

    #[test]
    fn damage_is_reported_naming_file_and_offset_and_a_verified_extent_is_not_rechecked() {
        let mut w = World::new();
        let mut list = ExtentList::new(1);
        let (f, e) = w.round(20, &[10, 10]);
        list.append(f, e);
        let file = e.file();
        let second = e.offset() as usize + rec(1, 10).len();
        // A flipped payload byte of record 2.
        w.files.get_mut(&file).unwrap()[second + 50] ^= 1;
        let err = w.read(&mut list, 0, 10, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("group 9 is damaged"), "{err}");
        assert!(
            err.contains(&format!("offset {second}: checksum mismatch")),
            "{err}"
        );
        assert!(err.contains("00000000000000000001.Journal"), "{err}");
        // Record 1 alone reads (the page ends before the damage), and does
        // not mark the extent verified.
        assert_eq!(w.read(&mut list, 0, 1, 1 << 20).unwrap().len(), 1);
        assert!(!list.extents()[0].is_verified());
        w.files.get_mut(&file).unwrap()[second + 50] ^= 1;
        assert_eq!(w.read(&mut list, 0, 10, 1 << 20).unwrap().len(), 2);
        assert!(list.extents()[0].is_verified(), "a whole walk verified it");
        // Once verified, payload bytes are not checked again (the CRC
        // travels to the client), but lengths and ids are.
        w.files.get_mut(&file).unwrap()[second + 50] ^= 1;
        assert_eq!(w.read(&mut list, 0, 10, 1 << 20).unwrap().len(), 2);
        w.files.get_mut(&file).unwrap()[second + 8] ^= 1; // msg_id of record 2
        let err = w.read(&mut list, 0, 10, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("where 2 was expected"), "{err}");
        w.files.get_mut(&file).unwrap()[second] = 0xff; // its length
        let err = w.read(&mut list, 0, 10, 1 << 20).unwrap_err().to_string();
        assert!(
            err.contains(&format!("offset {second}: record length")),
            "{err}"
        );
        // A mapping that ends before the extent (the caller's length check
        // missed a cut): an error, not a panic.
        let p = list.pieces().next().unwrap();
        let short = &w.files[&file][..second];
        assert!(read_run(short, Path::new("x"), 9, &p, 1, 9, 1 << 20, true).is_err());
    }

    #[test]
    fn an_extent_whose_records_end_before_its_bytes_is_damage() {
        let mut w = World::new();
        let (_, e) = w.round(0, &[3, 3]);
        let padded = Extent::new(e.file(), e.offset(), e.bytes(), 1).unwrap();
        w.files
            .get_mut(&e.file())
            .unwrap()
            .extend_from_slice(&[0; 8]);
        let longer = Extent::new(e.file(), e.offset(), e.bytes() + 8, 2).unwrap();
        for (ext, want) in [
            (padded, "1 records end here"),
            (longer, "2 records end here"),
        ] {
            let p = Piece { first_id: 1, ext };
            let map = &w.files[&e.file()];
            let err = read_run(map, Path::new("j"), 9, &p, 1, 9, 1 << 20, true).unwrap_err();
            assert!(err.to_string().contains(want), "{err}");
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A round: filler bytes of other frames, then records of these sizes.
        Round(usize, Vec<usize>),
        /// A new journal file.
        Roll,
        Trim(u64),
        /// Rewrite `n` extents from index `at` (mod the list's length) into
        /// a cold file, dropping records below the floor when at the front.
        Rewrite(usize, usize),
        /// Rewrite, but a trim of `k` lands between the copy and the install.
        RewriteRacingTrim(usize, usize, u64),
        Read(u64, u64, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..40usize, proptest::collection::vec(0..60usize, 1..4))
                .prop_map(|(f, s)| Op::Round(f, s)),
            1 => Just(Op::Roll),
            2 => (0..4u64).prop_map(Op::Trim),
            2 => (0..8usize, 1..4usize).prop_map(|(a, n)| Op::Rewrite(a, n)),
            1 => (0..8usize, 1..4usize, 0..4u64).prop_map(|(a, n, k)| Op::RewriteRacingTrim(a, n, k)),
            4 => (0..30u64, 0..8u64, 0..400usize).prop_map(|(a, c, b)| Op::Read(a, c, b)),
        ]
    }

    proptest! {
        /// Model: the group's records as `(id, bytes)`, floor..next. Every
        /// operation keeps E1 (asserted inside the list in debug builds),
        /// and every read returns exactly the oracle's records, budgets
        /// included. Left out: several groups per file, the files' live
        /// accounting (reclaim.rs) and damage (unit tests above).
        #[test]
        fn extent_list_matches_a_vec_of_records(ops in proptest::collection::vec(op(), 1..60)) {
            let mut w = World::new();
            let mut list = ExtentList::new(1);
            for op in ops {
                match op {
                    Op::Round(filler, sizes) => {
                        let (f, e) = w.round(filler, &sizes);
                        list.append(f, e);
                    }
                    Op::Roll => w.journal_seq += 1,
                    Op::Trim(k) => {
                        let floor = (list.floor() + k).min(w.next);
                        let (mut gone, first_before) = (0u64, list.first_id());
                        list.trim(floor, |e| gone += u64::from(e.count()));
                        w.model.retain(|(id, _)| *id >= floor);
                        // The extents handed back are exactly those that went.
                        prop_assert_eq!(first_before + gone, list.first_id());
                    }
                    Op::Rewrite(at, n) | Op::RewriteRacingTrim(at, n, _) => {
                        let len = list.extents().len();
                        if len == 0 {
                            continue;
                        }
                        let at = at % len;
                        let n = n.min(len - at);
                        let old: Vec<Extent> = list.extents()[at..at + n].to_vec();
                        let old_first = list.pieces().nth(at).unwrap().first_id;
                        let new_first = if at == 0 { list.floor() } else { old_first };
                        let new = w.rewrite(&old, old_first, new_first);
                        if let Op::RewriteRacingTrim(_, _, k) = op {
                            let floor = (list.floor() + k).min(w.next);
                            list.trim(floor, |_| {});
                            w.model.retain(|(id, _)| *id >= floor);
                            // A trim drops extents from the front: the run is
                            // still whole exactly when its first extent is there.
                            let still_there = list.extents().iter().any(|e| e.same_place(&old[0]));
                            let want = if still_there { Ok(()) } else { Err(ReplaceError::Stale) };
                            prop_assert_eq!(list.replace(&old, new_first, new), want);
                        } else {
                            prop_assert_eq!(list.replace(&old, new_first, new), Ok(()));
                            prop_assert_eq!(list.replace(&old, new_first, new), Err(ReplaceError::Stale));
                        }
                    }
                    Op::Read(after, count, bytes) => {
                        let got = w.read(&mut list, after, count, bytes).unwrap();
                        prop_assert_eq!(got, w.expected(after, count, bytes));
                    }
                }
                prop_assert_eq!(list.next_id(), w.next);
                prop_assert_eq!(list.floor(), w.model.first().map_or(w.next, |r| r.0));
                let all = w.read(&mut list, 0, u64::MAX, usize::MAX).unwrap();
                prop_assert_eq!(&all, &w.model);
            }
        }
    }
}
