//! Journal entries: the kinds, the 16-byte entry header, and ([`body`]) the
//! one encoder and decoder of each kind's body (format-spec/storage.md
//! section 5, "Entries", and section 15.2). Entries live inside the
//! replicated payload of a frame (`frame.rs`), which checksums them all at
//! once; a Records body keeps the records' own CRCs, so disk bytes are wire
//! bytes.
//!
//! Representation: `{ body_len: u32 | kind: u8 | reserved: [u8; 3] = 0 |
//! group_id: u64 | body: [u8; body_len] }`, back to back, no padding. The
//! pending round holds entries in exactly this layout (one per submission),
//! so building a frame is a copy, plus one merged header per run of one
//! group's records.
//!
//! Cost: encoding is one append of the body; [`EntryIter`] reads 16 bytes
//! per entry and never looks into bodies (they are checked where they are
//! applied).

use std::ops::Range;

/// What a frame carries (`frame.rs`). It is defined with the entries
/// because each entry kind belongs to one ([`EntryKind::frame`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A commit round (or a cursor flush): replicated state, numbered by
    /// `round_index`.
    Round = 1,
    /// Local decisions of this node, never shipped (`round_index` 0). No
    /// entry kind of this version may be in one: a later version's Promote
    /// will be.
    Local = 2,
}

impl FrameKind {
    pub(super) fn from_u8(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Round),
            2 => Some(FrameKind::Local),
            _ => None,
        }
    }
}

/// Bytes of an entry header.
pub const ENTRY_HEADER_BYTES: usize = 16;

/// What a journal entry records. Kind numbers 8 (Trim) and 9 (Promote) are
/// reserved for later versions; 0 and every value above 10 are invalid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum EntryKind {
    /// Body: `n >= 1` whole records of the group (record.rs layout, CRC
    /// included), back to back, consecutive msg_ids.
    Records = 1,
    /// Body: empty. The group was created.
    CreateGroup = 2,
    /// Body: empty. The group and its files were deleted.
    DeleteGroup = 3,
    /// Body: `{ user: u64 | cursor: u64 }`, the cursor resolved when queued.
    Join = 4,
    /// Body: `{ user: u64 }`.
    Leave = 5,
    /// Body: `n x { user: u64 | cursor: u64 }`: persisted tidemarks.
    Cursors = 6,
    /// Body: `{ by_cursor: u8 | max_age_ms: u64 | max_bytes: u64 }`.
    SetRetention = 7,
    /// Body: `{ user: u64 | up_to: u64 }`: the member's history up to
    /// `up_to` is cleared for it (its join point rises to `up_to + 1`, its
    /// cursor to `up_to`), `up_to` resolved when queued.
    ClearHistory = 10,
}

impl EntryKind {
    pub fn from_u8(b: u8) -> Option<EntryKind> {
        match b {
            1 => Some(EntryKind::Records),
            2 => Some(EntryKind::CreateGroup),
            3 => Some(EntryKind::DeleteGroup),
            4 => Some(EntryKind::Join),
            5 => Some(EntryKind::Leave),
            6 => Some(EntryKind::Cursors),
            7 => Some(EntryKind::SetRetention),
            10 => Some(EntryKind::ClearHistory),
            _ => None,
        }
    }

    /// The kind of frame that may carry this entry: every kind of this
    /// version is replicated state, so a Round frame (a Local frame, for
    /// local decisions such as a later version's Promote, holds none of
    /// them).
    pub fn frame(self) -> FrameKind {
        FrameKind::Round
    }
}

/// The body of every entry kind: one encode and one decode per kind, the
/// only code that knows a body's layout (format-spec/storage.md section 5,
/// "Entries", and section 15.2). Encoders append to a buffer in which
/// [`begin_entry`] started the entry; decoders take the body an
/// [`EntryIter`] returned and answer `None` for a body of the wrong length
/// or with an invalid value (replay ignores such an entry, the spec says so
/// per kind). All integers are little-endian.
///
/// CreateGroup and DeleteGroup have an empty body: there is nothing to
/// encode, and their body is not looked at (storage.md section 16, item 5).
pub(crate) mod body {
    use crate::logs::record::{self, NewRecord};
    use crate::logs::retention::Retention;

    /// Bytes of one row of a Cursors body.
    pub const CURSOR_ROW_BYTES: usize = 16;

    // Format: { record (record.rs layout, CRC included) }; a Records body
    // is one or more of these back to back (one per submission, merged by
    // the frame builder)
    #[cfg(test)]
    pub fn encode_record(out: &mut Vec<u8>, rec: &NewRecord<'_>) {
        record::encode_into(rec, out);
    }

    /// A record of `kind` (a message, an edit, a recall; record.rs).
    pub fn encode_record_kind(out: &mut Vec<u8>, rec: &NewRecord<'_>, kind: u8) {
        record::encode_kind_into(rec, kind, out);
    }

    /// `(first msg_id, count)` of a Records body: `None` unless it is
    /// `n >= 1` valid records (CRC included) that tile it exactly, with
    /// consecutive msg_ids.
    pub fn decode_records(body: &[u8]) -> Option<(u64, u64)> {
        let mut rest = body;
        let mut first = None;
        let mut count = 0u64;
        while !rest.is_empty() {
            let h = record::decode_verified(rest, record::RECORD_BYTES_STORED_MAX).ok()?;
            let first_id = *first.get_or_insert(h.msg_id);
            if h.msg_id != first_id.checked_add(count)? {
                return None;
            }
            count += 1;
            rest = &rest[h.record_len as usize..];
        }
        Some((first?, count))
    }

    // Format: { user: u64 | cursor: u64 }, 16 bytes; the cursor resolved
    // when the join was queued, so replay reproduces it exactly.
    pub fn encode_join(out: &mut Vec<u8>, user: u64, cursor: u64) {
        out.extend_from_slice(&user.to_le_bytes());
        out.extend_from_slice(&cursor.to_le_bytes());
    }

    /// `(user, cursor)`.
    pub fn decode_join(body: &[u8]) -> Option<(u64, u64)> {
        if body.len() != 16 {
            return None;
        }
        Some((u64_at(body, 0)?, u64_at(body, 8)?))
    }

    // Format: { user: u64 }, 8 bytes
    pub fn encode_leave(out: &mut Vec<u8>, user: u64) {
        out.extend_from_slice(&user.to_le_bytes());
    }

    pub fn decode_leave(body: &[u8]) -> Option<u64> {
        Some(u64::from_le_bytes(body.try_into().ok()?))
    }

    // Format: n x { user: u64 | cursor: u64 }, 16 x n bytes, n >= 1
    pub fn encode_cursors(out: &mut Vec<u8>, rows: &[(u64, u64)]) {
        debug_assert!(!rows.is_empty(), "a Cursors entry holds at least one row");
        for &(user, cursor) in rows {
            out.extend_from_slice(&user.to_le_bytes());
            out.extend_from_slice(&cursor.to_le_bytes());
        }
    }

    /// The `(user, cursor)` rows; bytes after the last whole row are ignored.
    pub fn decode_cursors(body: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
        body.chunks_exact(CURSOR_ROW_BYTES)
            .filter_map(|row| Some((u64_at(row, 0)?, u64_at(row, 8)?)))
    }

    // Format: { by_cursor: u8 (0 or 1) | max_age_ms: u64 | max_bytes: u64 }, 17 bytes
    pub fn encode_set_retention(out: &mut Vec<u8>, r: &Retention) {
        out.push(u8::from(r.by_cursor));
        out.extend_from_slice(&r.max_age_ms.to_le_bytes());
        out.extend_from_slice(&r.max_bytes.to_le_bytes());
    }

    pub fn decode_set_retention(body: &[u8]) -> Option<Retention> {
        if body.len() != 17 || body[0] > 1 {
            return None;
        }
        Some(Retention {
            by_cursor: body[0] == 1,
            max_age_ms: u64_at(body, 1)?,
            max_bytes: u64_at(body, 9)?,
        })
    }

    // Format: { user: u64 | up_to: u64 }, 16 bytes; `up_to` resolved
    // against the group's head when the clear was queued, so replay
    // reproduces it exactly.
    pub fn encode_clear_history(out: &mut Vec<u8>, user: u64, up_to: u64) {
        out.extend_from_slice(&user.to_le_bytes());
        out.extend_from_slice(&up_to.to_le_bytes());
    }

    /// `(user, up_to)`.
    pub fn decode_clear_history(body: &[u8]) -> Option<(u64, u64)> {
        if body.len() != 16 {
            return None;
        }
        Some((u64_at(body, 0)?, u64_at(body, 8)?))
    }

    fn u64_at(b: &[u8], at: usize) -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    }
}

/// Appends a whole entry to `out`: its header, then the body `body`
/// appends (one of the [`body`] encoders). Returns where the entry lies in
/// `out`.
pub fn encode_entry(
    out: &mut Vec<u8>,
    kind: EntryKind,
    group_id: u64,
    body: impl FnOnce(&mut Vec<u8>),
) -> Range<usize> {
    let start = begin_entry(out, kind, group_id);
    body(out);
    finish_entry(out, start);
    start..out.len()
}

/// Starts an entry at the end of `out`; the caller appends the body, then
/// calls [`finish_entry`] with the returned start offset.
// Format: { body_len: u32 | kind: u8 | reserved: [u8; 3] = 0 |
//   group_id: u64 | body: [u8; body_len] }
pub fn begin_entry(out: &mut Vec<u8>, kind: EntryKind, group_id: u64) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]); // body_len: filled by finish_entry
    out.push(kind as u8);
    out.extend_from_slice(&[0u8; 3]);
    out.extend_from_slice(&group_id.to_le_bytes());
    start
}

/// Fills in the body length of the entry begun at `start`.
pub fn finish_entry(out: &mut [u8], start: usize) {
    let body_len = out.len() - start - ENTRY_HEADER_BYTES;
    // Invariant: an entry lies in one frame, whose payload length is a u32
    // (the frame builder refuses a larger round before this point).
    let body_len = u32::try_from(body_len).expect("invariant: entry body fits u32");
    out[start..start + 4].copy_from_slice(&body_len.to_le_bytes());
}

/// A decoded journal entry borrowing its body.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    pub kind: EntryKind,
    pub group_id: u64,
    pub body: &'a [u8],
}

/// The entry whose header starts `b` (which holds at least the whole
/// entry): used on entries this process encoded or a payload check
/// already walked. `None` on an unknown kind or a body past `b`'s end.
pub fn entry_at(b: &[u8]) -> Option<Entry<'_>> {
    let header = b.get(..ENTRY_HEADER_BYTES)?;
    let body_len = u32::from_le_bytes(header[0..4].try_into().ok()?) as usize;
    Some(Entry {
        kind: EntryKind::from_u8(header[4])?,
        group_id: u64::from_le_bytes(header[8..16].try_into().ok()?),
        body: b.get(ENTRY_HEADER_BYTES..ENTRY_HEADER_BYTES.checked_add(body_len)?)?,
    })
}

/// Iterates over the entries laid out back to back in `buf` (the part of a
/// payload after its header). Stops at the first entry that is not valid
/// (truncated, unknown kind, reserved bytes set, a kind the frame may not
/// carry), with the reason; a valid payload (`frame::check_payload`) is one
/// the iterator walks to its end.
pub struct EntryIter<'a> {
    buf: &'a [u8],
    pos: usize,
    frame: FrameKind,
    stop: Option<String>,
}

impl<'a> EntryIter<'a> {
    pub fn new(buf: &'a [u8], frame: FrameKind) -> Self {
        EntryIter {
            buf,
            pos: 0,
            frame,
            stop: None,
        }
    }

    /// Offset just past the last valid entry returned.
    #[cfg(test)]
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Why iteration stopped before the end, if it did.
    pub fn stop_reason(&self) -> Option<&str> {
        self.stop.as_deref()
    }

    fn fail(&mut self, why: String) -> Option<Entry<'a>> {
        self.stop = Some(why);
        None
    }
}

impl<'a> Iterator for EntryIter<'a> {
    type Item = Entry<'a>;

    fn next(&mut self) -> Option<Entry<'a>> {
        if self.stop.is_some() || self.pos >= self.buf.len() {
            return None;
        }
        let rest = &self.buf[self.pos..];
        if rest.len() < ENTRY_HEADER_BYTES {
            return self.fail(format!("truncated entry header ({} bytes)", rest.len()));
        }
        let body_len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let total = ENTRY_HEADER_BYTES + body_len;
        if rest.len() < total {
            return self.fail(format!(
                "entry of {total} bytes overruns its payload ({} bytes remain)",
                rest.len()
            ));
        }
        let Some(kind) = EntryKind::from_u8(rest[4]) else {
            return self.fail(format!("unknown entry kind {}", rest[4]));
        };
        if rest[5..8] != [0; 3] {
            return self.fail("reserved entry bytes set".into());
        }
        if kind.frame() != self.frame {
            return self.fail(format!("a {kind:?} entry in a {:?} frame", self.frame));
        }
        let mut g = [0u8; 8];
        g.copy_from_slice(&rest[8..16]);
        self.pos += total;
        Some(Entry {
            kind,
            group_id: u64::from_le_bytes(g),
            body: &rest[ENTRY_HEADER_BYTES..total],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::record::NewRecord;

    fn entry(kind: EntryKind, group: u64, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_entry(&mut out, kind, group, |b| b.extend_from_slice(body));
        out
    }

    fn rec(msg_id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        body::encode_record(
            &mut out,
            &NewRecord {
                msg_id,
                timestamp_ms: 1,
                sender_id: 2,
                client_msg_id: msg_id,
                payload: b"x",
            },
        );
        out
    }

    #[test]
    fn entries_round_trip_and_every_truncation_stops_at_the_last_whole_one() {
        let first = entry(EntryKind::CreateGroup, 9, b"");
        let mut buf = first.clone();
        buf.extend(entry(EntryKind::Records, 9, &rec(1)));
        let all: Vec<_> = EntryIter::new(&buf, FrameKind::Round)
            .map(|e| (e.kind, e.group_id, e.body.to_vec()))
            .collect();
        assert_eq!(
            all,
            vec![
                (EntryKind::CreateGroup, 9, vec![]),
                (EntryKind::Records, 9, rec(1))
            ]
        );
        for cut in first.len()..buf.len() {
            let mut it = EntryIter::new(&buf[..cut], FrameKind::Round);
            assert_eq!(it.by_ref().count(), 1);
            assert_eq!(it.position(), first.len());
            assert_eq!(it.stop_reason().is_some(), cut > first.len());
        }
        assert_eq!(
            EntryIter::new(&buf, FrameKind::Local)
                .next()
                .map(|e| e.kind),
            None,
            "no entry kind of this version may sit in a Local frame"
        );
    }

    #[test]
    fn a_records_body_is_whole_valid_records_with_consecutive_ids() {
        let run = [rec(4), rec(5), rec(6)].concat();
        assert_eq!(body::decode_records(&run), Some((4, 3)));
        assert_eq!(body::decode_records(&rec(1)), Some((1, 1)));
        assert_eq!(body::decode_records(&[]), None);
        assert_eq!(body::decode_records(&[rec(4), rec(6)].concat()), None);
        assert_eq!(body::decode_records(&run[..run.len() - 1]), None);
        let mut bad = run.clone();
        bad[60] ^= 1;
        assert_eq!(body::decode_records(&bad), None);
    }

    #[test]
    fn bodies_round_trip() {
        let mut b = Vec::new();
        body::encode_join(&mut b, 5, 77);
        assert_eq!(body::decode_join(&b), Some((5, 77)));
        assert_eq!(body::decode_join(&[0; 17]), None);
        let mut b = Vec::new();
        body::encode_leave(&mut b, 5);
        assert_eq!(body::decode_leave(&b), Some(5));
        let mut b = Vec::new();
        body::encode_clear_history(&mut b, 5, 1 << 40);
        assert_eq!(body::decode_clear_history(&b), Some((5, 1 << 40)));
        assert_eq!(body::decode_clear_history(&b[..15]), None);
        let mut b = Vec::new();
        body::encode_cursors(&mut b, &[(5, 7), (6, 8)]);
        b.push(1); // a partial row is ignored
        assert_eq!(
            body::decode_cursors(&b).collect::<Vec<_>>(),
            vec![(5, 7), (6, 8)]
        );
        let r = crate::logs::retention::Retention {
            by_cursor: true,
            max_age_ms: 5,
            max_bytes: 9,
        };
        let mut b = Vec::new();
        body::encode_set_retention(&mut b, &r);
        assert_eq!(body::decode_set_retention(&b), Some(r));
    }
}
