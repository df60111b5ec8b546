//! Journal frames: what one write of the commit thread puts in a journal
//! file (format-spec/storage.md section 5, "Frames"). A frame is a local
//! 32-byte *envelope* and a *payload*; the payload is what a later
//! replication ships byte for byte, the envelope is this node's own.
//!
//! ```text
//! envelope (32): { env_crc: u32 | payload_len: u32 | kind: u8 | reserved: [u8; 7] |
//!                  lsn: u64 | synced_len: u64 }
//! payload:       { payload_crc: u32 | entry_count: u32 | round_index: u64 | term: u64 |
//!                  reserved: u64 } + entry_count entries (entry.rs)
//! ```
//!
//! `synced_len` is 0.1's sync mark folded into every frame: every byte of
//! the file below it was durable before this frame was written, so a
//! later frame naming a `synced_len` past a bad frame proves the bad frame
//! was damaged after it was durable rather than torn by a crash. Frames are
//! looked for at every offset when that proof is needed, also inside
//! payload bytes a client chose; so `env_crc` is the CRC-32 of the file
//! header's random `mark_key` followed by envelope bytes 4..32. Only the
//! writer knows the key (it never leaves the file header), so a payload
//! cannot hold an envelope that checks (a guess succeeds with probability
//! 2^-32). The payload's own CRC is unkeyed: it must mean the same on
//! every node that holds the payload.
//!
//! Invariants: `lsn` is dense over the frames of a file (the header's
//! `first_lsn`, then one more per frame) and rises across files;
//! `round_index` is dense over the Round frames the same way, and 0 in a
//! Local frame; `48 <= synced_len <= ` the frame's own offset.
//!
//! Costs: building a frame is one copy of the round's entries plus one
//! CRC over the payload; checking one is the two CRCs; looking for a proof
//! costs a few byte compares per offset of the file after the bad frame
//! (the keyed CRC only where those match), once per bad frame.

use std::ops::Range;

pub use super::entry::FrameKind;
use super::entry::{self, Entry, EntryIter, EntryKind};
use super::header::JOURNAL_HEADER_BYTES;

/// Bytes of a frame envelope.
pub const ENVELOPE_BYTES: usize = 32;
/// Bytes of a payload header.
pub const PAYLOAD_HEADER_BYTES: usize = 32;
/// Envelope plus payload header: the bytes a frame adds to its entries.
pub const FRAME_OVERHEAD_BYTES: usize = ENVELOPE_BYTES + PAYLOAD_HEADER_BYTES;

/// A decoded envelope.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub payload_len: u32,
    pub kind: FrameKind,
    pub lsn: u64,
    pub synced_len: u64,
}

/// A decoded payload header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PayloadHeader {
    pub payload_crc: u32,
    pub entry_count: u32,
    pub round_index: u64,
    pub term: u64,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The keyed checksum of an envelope (`b` holds at least its 32 bytes).
fn envelope_crc(b: &[u8], mark_key: u32) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&mark_key.to_le_bytes());
    h.update(&b[4..ENVELOPE_BYTES]);
    h.finalize()
}

// Format: { env_crc: u32 (CRC-32 of mark_key (4 bytes LE) + bytes 4..32) |
//   payload_len: u32 | kind: u8 | reserved: [u8; 7] = 0 | lsn: u64 |
//   synced_len: u64 }
pub fn encode_envelope(env: &Envelope, mark_key: u32) -> [u8; ENVELOPE_BYTES] {
    let mut b = [0u8; ENVELOPE_BYTES];
    b[4..8].copy_from_slice(&env.payload_len.to_le_bytes());
    b[8] = env.kind as u8;
    b[16..24].copy_from_slice(&env.lsn.to_le_bytes());
    b[24..32].copy_from_slice(&env.synced_len.to_le_bytes());
    let crc = envelope_crc(&b, mark_key);
    b[0..4].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Checks the envelope at absolute offset `at` of `file` against the
/// file's `mark_key`: its checksum, kind, reserved bytes, and a
/// `synced_len` between the file header and the frame itself (a writer can
/// only have synced bytes it wrote before). The fixed bytes are compared
/// before the checksum is computed, so asking at every offset is cheap.
pub fn envelope_at(file: &[u8], at: usize, mark_key: u32) -> Result<Envelope, String> {
    let Some(b) = file.get(at..at.saturating_add(ENVELOPE_BYTES)) else {
        return Err(format!(
            "truncated frame envelope ({} bytes)",
            file.len().saturating_sub(at)
        ));
    };
    check_envelope(b, at as u64, mark_key)
}

/// The checks of [`envelope_at`] on the 32 envelope bytes `b` of a frame
/// that starts at file offset `at` (a positioned read has no whole file).
pub fn check_envelope(b: &[u8], at: u64, mark_key: u32) -> Result<Envelope, String> {
    let Some(b) = b.get(..ENVELOPE_BYTES) else {
        return Err(format!("truncated frame envelope ({} bytes)", b.len()));
    };
    let Some(kind) = FrameKind::from_u8(b[8]) else {
        return Err(format!("unknown frame kind {}", b[8]));
    };
    if b[9..16] != [0; 7] {
        return Err("reserved envelope bytes set".into());
    }
    let synced_len = u64_at(b, 24);
    if synced_len < JOURNAL_HEADER_BYTES as u64 || synced_len > at {
        return Err(format!(
            "synced_len {synced_len} outside {JOURNAL_HEADER_BYTES}..={at}"
        ));
    }
    let computed = envelope_crc(b, mark_key);
    if computed != u32_at(b, 0) {
        return Err(format!(
            "frame envelope checksum mismatch: stored {:#010x}, computed {computed:#010x}",
            u32_at(b, 0)
        ));
    }
    Ok(Envelope {
        payload_len: u32_at(b, 4),
        kind,
        lsn: u64_at(b, 16),
        synced_len,
    })
}

/// The payload header at the start of `payload` (unchecked: any 32 bytes
/// decode). `None` if fewer than 32 bytes.
pub fn payload_header(payload: &[u8]) -> Option<PayloadHeader> {
    let b = payload.get(..PAYLOAD_HEADER_BYTES)?;
    Some(PayloadHeader {
        payload_crc: u32_at(b, 0),
        entry_count: u32_at(b, 4),
        round_index: u64_at(b, 8),
        term: u64_at(b, 16),
    })
}

/// Checks a payload carried by a frame of `kind`: its checksum, reserved
/// bytes, a `round_index` of 0 in a Local frame, and entries that are
/// valid for the frame's kind and tile the payload exactly,
/// `entry_count` of them. Returns its header.
pub fn check_payload(payload: &[u8], kind: FrameKind) -> Result<PayloadHeader, String> {
    let Some(h) = payload_header(payload) else {
        return Err(format!("payload of {} bytes has no header", payload.len()));
    };
    let computed = crc32fast::hash(&payload[4..]);
    if computed != h.payload_crc {
        return Err(format!(
            "frame payload checksum mismatch: stored {:#010x}, computed {computed:#010x}",
            h.payload_crc
        ));
    }
    check_payload_structure(payload, kind).map(|()| h)
}

/// The checks of [`check_payload`] other than the checksum.
pub fn check_payload_structure(payload: &[u8], kind: FrameKind) -> Result<(), String> {
    let Some(h) = payload_header(payload) else {
        return Err(format!("payload of {} bytes has no header", payload.len()));
    };
    if payload[24..32] != [0; 8] {
        return Err("reserved payload bytes set".into());
    }
    if kind == FrameKind::Local && h.round_index != 0 {
        return Err(format!("Local frame with round_index {}", h.round_index));
    }
    let entries = &payload[PAYLOAD_HEADER_BYTES..];
    let mut it = EntryIter::new(entries, kind);
    let n = it.by_ref().count();
    if let Some(why) = it.stop_reason() {
        return Err(why.to_string());
    }
    if n as u64 != u64::from(h.entry_count) {
        return Err(format!(
            "payload holds {n} entries, its header says {}",
            h.entry_count
        ));
    }
    Ok(())
}

/// A valid frame borrowed from a journal file.
#[derive(Clone, Copy, Debug)]
pub struct Frame<'a> {
    /// Where the frame starts in its file.
    pub offset: usize,
    pub envelope: Envelope,
    /// The whole payload, its header included (the replicated bytes).
    pub payload: &'a [u8],
}

impl<'a> Frame<'a> {
    /// The payload header (checked with the frame).
    #[cfg(any(test, feature = "testing"))]
    pub fn header(&self) -> PayloadHeader {
        // Invariant: a Frame's payload passed `check_payload`, so it has one.
        payload_header(self.payload).expect("invariant: a checked payload has a header")
    }

    /// Offset just past the frame.
    pub fn end(&self) -> usize {
        self.offset + ENVELOPE_BYTES + self.payload.len()
    }

    /// The frame's entries, in payload order.
    pub fn entries(&self) -> EntryIter<'a> {
        EntryIter::new(&self.payload[PAYLOAD_HEADER_BYTES..], self.envelope.kind)
    }
}

/// Walks the frames of one journal file from just after its header,
/// checking each (envelope, payload, and that `lsn` and `round_index`
/// continue the numbering the header starts). Stops at the first invalid
/// frame, with the reason; the file ended cleanly when there is none.
pub struct FrameIter<'a> {
    file: &'a [u8],
    pos: usize,
    mark_key: u32,
    next_lsn: u64,
    next_round: u64,
    stop: Option<String>,
}

impl<'a> FrameIter<'a> {
    /// Starts at offset `at` (just past the header, or past a frame that
    /// recovery restored) expecting `lsn` and `round` next.
    pub fn new(file: &'a [u8], at: usize, mark_key: u32, lsn: u64, round: u64) -> FrameIter<'a> {
        FrameIter {
            file,
            pos: at,
            mark_key,
            next_lsn: lsn,
            next_round: round,
            stop: None,
        }
    }

    /// Offset just past the last valid frame returned.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The lsn and round index the next frame must have.
    pub fn next_numbers(&self) -> (u64, u64) {
        (self.next_lsn, self.next_round)
    }

    /// Why the walk stopped before the end of the file, if it did.
    pub fn stop_reason(&self) -> Option<&str> {
        self.stop.as_deref()
    }

    fn frame(&self) -> Result<Frame<'a>, String> {
        let at = self.pos;
        let env = envelope_at(self.file, at, self.mark_key)?;
        let start = at + ENVELOPE_BYTES;
        let end = start
            .checked_add(env.payload_len as usize)
            .filter(|&e| e <= self.file.len())
            .ok_or_else(|| {
                format!(
                    "frame payload of {} bytes runs past the end of the file ({} bytes remain)",
                    env.payload_len,
                    self.file.len() - start
                )
            })?;
        let payload = &self.file[start..end];
        let header = check_payload(payload, env.kind)?;
        if env.lsn != self.next_lsn {
            return Err(format!(
                "frame lsn {} where {} was expected",
                env.lsn, self.next_lsn
            ));
        }
        if env.kind == FrameKind::Round && header.round_index != self.next_round {
            return Err(format!(
                "round_index {} where {} was expected",
                header.round_index, self.next_round
            ));
        }
        Ok(Frame {
            offset: at,
            envelope: env,
            payload,
        })
    }
}

impl<'a> Iterator for FrameIter<'a> {
    type Item = Frame<'a>;

    fn next(&mut self) -> Option<Frame<'a>> {
        if self.stop.is_some() || self.pos >= self.file.len() {
            return None;
        }
        match self.frame() {
            Ok(f) => {
                self.pos = f.end();
                self.next_lsn = self.next_lsn.saturating_add(1);
                if f.envelope.kind == FrameKind::Round {
                    self.next_round = self.next_round.saturating_add(1);
                }
                Some(f)
            }
            Err(why) => {
                self.stop = Some(why);
                None
            }
        }
    }
}

/// The furthest `synced_len` that a valid envelope (of the file whose
/// header has `mark_key`) at or after absolute offset `from` names, with
/// the envelope's offset. Every offset is tried, so an envelope is found
/// past bytes that no longer parse as frames.
pub fn furthest_proof_from(file: &[u8], from: usize, mark_key: u32) -> Option<(u64, usize)> {
    let mut best: Option<(u64, usize)> = None;
    let last = file.len().checked_sub(ENVELOPE_BYTES)?;
    for at in from..=last {
        // Cheap filters first: kind, reserved bytes.
        if !matches!(file[at + 8], 1 | 2) || file[at + 9..at + 16] != [0; 7] {
            continue;
        }
        if let Ok(env) = envelope_at(file, at, mark_key) {
            if best.is_none_or(|(b, _)| env.synced_len > b) {
                best = Some((env.synced_len, at));
            }
        }
    }
    best
}

/// A frame being built: the envelope and the payload header are reserved
/// at the front and filled in by [`FrameBuf::seal`] when the journal
/// writes the frame (it alone knows the lsn, the round index and the
/// synced length); entries are appended in between. Its capacity stays at
/// the largest frame built (bounded by `commit_round_bytes_max` plus one
/// entry and the group operations of one round).
pub struct FrameBuf {
    bytes: Vec<u8>,
    entries: u32,
}

impl Default for FrameBuf {
    fn default() -> Self {
        FrameBuf {
            bytes: vec![0; FRAME_OVERHEAD_BYTES],
            entries: 0,
        }
    }
}

impl FrameBuf {
    /// Drops every entry (the capacity is kept).
    pub fn clear(&mut self) {
        self.bytes.truncate(FRAME_OVERHEAD_BYTES);
        self.entries = 0;
    }

    /// Makes room for `additional` more bytes of entries at once (a
    /// frame whose size is known before it is built grows once, not by
    /// doublings that copy it and touch twice its pages).
    pub fn reserve(&mut self, additional: usize) {
        self.bytes.reserve(additional);
    }

    pub fn entry_count(&self) -> u32 {
        self.entries
    }

    /// Bytes of the frame, envelope included.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends an entry whose body `body` appends; returns where it lies
    /// in the frame.
    pub fn push_entry(
        &mut self,
        kind: EntryKind,
        group_id: u64,
        body: impl FnOnce(&mut Vec<u8>),
    ) -> Range<usize> {
        self.entries += 1;
        entry::encode_entry(&mut self.bytes, kind, group_id, body)
    }

    /// Appends a whole entry encoded elsewhere (by [`entry::encode_entry`],
    /// into the pending round); returns where it lies in the frame.
    pub fn push_encoded(&mut self, encoded: &[u8]) -> Range<usize> {
        debug_assert!(entry::entry_at(encoded).is_some(), "an encoded entry");
        let start = self.bytes.len();
        self.bytes.extend_from_slice(encoded);
        self.entries += 1;
        start..self.bytes.len()
    }

    /// Starts a Records entry of `group_id`; append the records with
    /// [`FrameBuf::extend_body`], then call [`FrameBuf::finish_entry`].
    pub fn begin_records(&mut self, group_id: u64) -> usize {
        self.entries += 1;
        entry::begin_entry(&mut self.bytes, EntryKind::Records, group_id)
    }

    pub fn extend_body(&mut self, bytes: &[u8]) {
        self.bytes.extend_from_slice(bytes);
    }

    /// Ends the entry begun at `start`; returns where it lies in the frame.
    pub fn finish_entry(&mut self, start: usize) -> Range<usize> {
        entry::finish_entry(&mut self.bytes, start);
        start..self.bytes.len()
    }

    /// The entry at `range` (as a push returned it).
    pub fn entry(&self, range: Range<usize>) -> Entry<'_> {
        // Invariant: ranges come from this buffer's pushes, which write
        // whole entries of known kinds.
        entry::entry_at(&self.bytes[range]).expect("invariant: a pushed entry")
    }

    /// Fills in the payload header and the envelope and returns the whole
    /// frame, or why it cannot be framed (a payload past `u32::MAX` bytes).
    pub fn seal(
        &mut self,
        kind: FrameKind,
        lsn: u64,
        round_index: u64,
        synced_len: u64,
        mark_key: u32,
    ) -> Result<&[u8], String> {
        let p = &mut self.bytes[ENVELOPE_BYTES..];
        // Format: { payload_crc: u32 (of payload bytes 4..payload_len) |
        //   entry_count: u32 | round_index: u64 | term: u64 = 0 |
        //   reserved: u64 = 0 } + entries
        p[4..8].copy_from_slice(&self.entries.to_le_bytes());
        p[8..16].copy_from_slice(&round_index.to_le_bytes());
        p[16..32].copy_from_slice(&[0; 16]);
        let crc = crc32fast::hash(&p[4..]);
        p[0..4].copy_from_slice(&crc.to_le_bytes());
        self.seal_envelope(kind, lsn, synced_len, mark_key)
    }

    /// Makes the frame one around `payload`, a whole payload written by
    /// another node (checked by the caller, `replicate.rs`): its bytes go
    /// to the journal unchanged, and only [`FrameBuf::seal_envelope`]
    /// fills in anything (this node's envelope).
    pub fn load_payload(&mut self, payload: &[u8]) {
        self.bytes.truncate(ENVELOPE_BYTES);
        self.bytes.extend_from_slice(payload);
        self.entries = payload_header(payload).map_or(0, |h| h.entry_count);
    }

    /// Fills in the envelope of a frame whose payload is complete (sealed
    /// by [`FrameBuf::seal`] or loaded whole by [`FrameBuf::load_payload`])
    /// and returns the whole frame, or why it cannot be framed.
    pub fn seal_envelope(
        &mut self,
        kind: FrameKind,
        lsn: u64,
        synced_len: u64,
        mark_key: u32,
    ) -> Result<&[u8], String> {
        let payload_len = u32::try_from(self.bytes.len() - ENVELOPE_BYTES).map_err(|_| {
            format!(
                "a frame of {} bytes exceeds the largest payload ({} bytes)",
                self.bytes.len(),
                u32::MAX
            )
        })?;
        let env = encode_envelope(
            &Envelope {
                payload_len,
                kind,
                lsn,
                synced_len,
            },
            mark_key,
        );
        self.bytes[..ENVELOPE_BYTES].copy_from_slice(&env);
        Ok(&self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commit::journal::entry::body;
    use crate::logs::record::NewRecord;

    const KEY: u32 = 0x0403_0201;

    fn rec(msg_id: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        body::encode_record(
            &mut out,
            &NewRecord {
                msg_id,
                timestamp_ms: 7,
                sender_id: 3,
                client_msg_id: msg_id,
                payload,
            },
        );
        out
    }

    /// A file image: a header-sized prefix, then `frames` sealed with
    /// lsn 1.. and round 1.., each naming the previous frame's end as
    /// synced.
    fn file_of(frames: &mut [FrameBuf]) -> Vec<u8> {
        let mut file = vec![0u8; JOURNAL_HEADER_BYTES];
        for (i, f) in frames.iter_mut().enumerate() {
            let synced = file.len() as u64;
            let n = i as u64 + 1;
            file.extend_from_slice(f.seal(FrameKind::Round, n, n, synced, KEY).unwrap());
        }
        file
    }

    fn sample(n: usize) -> FrameBuf {
        let mut f = FrameBuf::default();
        f.push_entry(EntryKind::CreateGroup, 5, |_| {});
        let s = f.begin_records(5);
        for id in 1..=n as u64 {
            f.extend_body(&rec(id, b"payload"));
        }
        f.finish_entry(s);
        f.push_entry(EntryKind::Join, 6, |b| body::encode_join(b, 1, 0));
        f
    }

    #[test]
    fn frames_round_trip_with_their_numbers_and_entries() {
        let mut frames = [sample(1), sample(3), FrameBuf::default()];
        let file = file_of(&mut frames);
        let mut it = FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 1, 1);
        let got: Vec<_> = it.by_ref().collect();
        assert_eq!(it.stop_reason(), None);
        assert_eq!(it.position(), file.len());
        assert_eq!(got.len(), 3);
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.envelope.lsn, i as u64 + 1);
            assert_eq!(f.header().round_index, i as u64 + 1);
            assert_eq!(f.header().term, 0);
        }
        let kinds: Vec<_> = got[1].entries().map(|e| (e.kind, e.group_id)).collect();
        assert_eq!(
            kinds,
            vec![
                (EntryKind::CreateGroup, 5),
                (EntryKind::Records, 5),
                (EntryKind::Join, 6)
            ]
        );
        let records = got[1].entries().nth(1).unwrap();
        assert_eq!(body::decode_records(records.body), Some((1, 3)));
        assert_eq!(got[2].entries().count(), 0);
        assert_eq!(got[1].envelope.synced_len, got[0].end() as u64);
    }

    #[test]
    fn every_cut_and_every_flipped_bit_of_a_frame_stops_the_walk_there() {
        let mut frames = [sample(2), sample(2)];
        let file = file_of(&mut frames);
        let first_end = FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 1, 1)
            .next()
            .unwrap()
            .end();
        for cut in first_end..file.len() {
            let mut it = FrameIter::new(&file[..cut], JOURNAL_HEADER_BYTES, KEY, 1, 1);
            assert_eq!(it.by_ref().count(), 1, "cut at {cut}");
            assert_eq!(it.position(), first_end);
            assert_eq!(it.stop_reason().is_some(), cut > first_end);
        }
        for at in first_end..file.len() {
            for bit in [0x01, 0x80] {
                let mut d = file.clone();
                d[at] ^= bit;
                let mut it = FrameIter::new(&d, JOURNAL_HEADER_BYTES, KEY, 1, 1);
                assert_eq!(it.by_ref().count(), 1, "byte {at} bit {bit:#x}");
                assert!(it.stop_reason().is_some());
            }
        }
    }

    #[test]
    fn numbers_that_do_not_continue_stop_the_walk() {
        let mut frames = [sample(1)];
        let file = file_of(&mut frames);
        let lsn = FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 2, 1);
        assert_eq!(lsn.count(), 0);
        let mut round = FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 1, 9);
        assert!(round.next().is_none());
        assert_eq!(
            round.stop_reason(),
            Some("round_index 1 where 9 was expected")
        );
    }

    #[test]
    fn an_envelope_checks_only_under_its_files_key_and_only_after_what_it_names() {
        let mut frames = [sample(1), sample(1)];
        let file = file_of(&mut frames);
        let second = FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 1, 1)
            .nth(1)
            .unwrap()
            .offset;
        assert!(envelope_at(&file, second, KEY).is_ok());
        assert!(envelope_at(&file, second, KEY ^ 1).is_err());
        assert_eq!(
            furthest_proof_from(&file, JOURNAL_HEADER_BYTES + 1, KEY),
            Some((second as u64, second))
        );
        assert_eq!(furthest_proof_from(&file, 1, KEY ^ 1), None);
        // A payload holding the bytes of a real envelope (a client chose
        // them) proves nothing in another file, whose key differs.
        let env = file[second..second + ENVELOPE_BYTES].to_vec();
        let mut f = FrameBuf::default();
        f.push_entry(EntryKind::Records, 5, |b| {
            b.extend_from_slice(&rec(1, &[env.clone(), env].concat()))
        });
        let mut other = vec![0u8; JOURNAL_HEADER_BYTES];
        other.extend_from_slice(f.seal(FrameKind::Round, 1, 1, 48, KEY ^ 0xffff).unwrap());
        assert_eq!(furthest_proof_from(&other, 49, KEY ^ 0xffff), None);
    }

    proptest::proptest! {
        /// Any frames built by the writer's builder walk back to the same
        /// entries, kinds, numbers and offsets; and any one flipped byte in
        /// the last frame stops the walk exactly there.
        #[test]
        fn frames_built_walk_back_exactly_and_any_flip_of_the_last_stops_there(
            frames in proptest::collection::vec(
                proptest::collection::vec((2u8..=7, 1u64..1000, proptest::collection::vec(0u8..=255, 0..40)), 0..6),
                1..5,
            ),
            key in 0u32..=u32::MAX,
            first in 1u64..1_000_000,
            flip in 0usize..10_000,
        ) {
            let mut file = vec![0u8; JOURNAL_HEADER_BYTES];
            let mut starts = Vec::new();
            for (i, entries) in frames.iter().enumerate() {
                let mut f = FrameBuf::default();
                for (kind, group, body) in entries {
                    let kind = EntryKind::from_u8(*kind).unwrap();
                    f.push_entry(kind, *group, |b| b.extend_from_slice(body));
                }
                starts.push(file.len());
                let n = first + i as u64;
                let synced = file.len() as u64;
                file.extend_from_slice(f.seal(FrameKind::Round, n, n, synced, key).unwrap());
            }
            let walked: Vec<_> = FrameIter::new(&file, JOURNAL_HEADER_BYTES, key, first, first)
                .map(|f| {
                    let entries: Vec<_> = f
                        .entries()
                        .map(|e| (e.kind as u8, e.group_id, e.body.to_vec()))
                        .collect();
                    (f.offset, f.envelope.lsn, f.header().round_index, entries)
                })
                .collect();
            proptest::prop_assert_eq!(walked.len(), frames.len());
            for (i, (offset, lsn, round, entries)) in walked.into_iter().enumerate() {
                proptest::prop_assert_eq!(offset, starts[i]);
                proptest::prop_assert_eq!((lsn, round), (first + i as u64, first + i as u64));
                proptest::prop_assert_eq!(&entries, &frames[i]);
            }
            let last = *starts.last().unwrap();
            let at = last + flip % (file.len() - last);
            let mut damaged = file.clone();
            damaged[at] ^= 0x10;
            let mut it = FrameIter::new(&damaged, JOURNAL_HEADER_BYTES, key, first, first);
            proptest::prop_assert_eq!(it.by_ref().count(), frames.len() - 1);
            proptest::prop_assert_eq!(it.position(), last);
            proptest::prop_assert!(it.stop_reason().is_some());
        }
    }

    #[test]
    fn a_local_frame_carries_no_entry_of_this_version_and_no_round_index() {
        let mut f = FrameBuf::default();
        let mut file = vec![0u8; JOURNAL_HEADER_BYTES];
        file.extend_from_slice(f.seal(FrameKind::Local, 1, 0, 48, KEY).unwrap());
        let mut it = FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 1, 1);
        let local = it.next().unwrap();
        assert_eq!(local.envelope.kind, FrameKind::Local);
        assert_eq!(
            it.next_numbers(),
            (2, 1),
            "a Local frame takes no round index"
        );
        let mut f = sample(1);
        let mut file = vec![0u8; JOURNAL_HEADER_BYTES];
        file.extend_from_slice(f.seal(FrameKind::Local, 1, 0, 48, KEY).unwrap());
        assert!(FrameIter::new(&file, JOURNAL_HEADER_BYTES, KEY, 1, 1)
            .next()
            .is_none());
    }
}
