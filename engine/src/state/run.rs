//! Run files: one run is a sorted sequence of [`Item`]s cut into **parts**
//! (files `state/<run seq>-<part>.tmr`), each at most `run_file_bytes_max`
//! bytes, covering disjoint increasing key ranges (format-spec/storage.md
//! section 6.2).
//!
//! Format of a part (little-endian):
//! `{ header (64) | blocks | block index (29 per block) | trailer (32) }`
//! - header: `{ magic "TDMKRUN\0" | version u16 = 1 | header_len u16 = 64 |
//!   part u32 | run_seq u64 | created_ms u64 | reserved [28] = 0 |
//!   crc32 of bytes 0..60 }`
//! - block: `{ crc32 of bytes 4..len | len u32 (whole block) | count u32 |
//!   count items }`, about [`BLOCK_BYTES_TARGET`]; items never straddle
//!   blocks;
//! - index entry: `{ offset u64 | len u32 | first key (17 bytes) }`;
//! - trailer: `{ magic "TDMKRUNT" | index_offset u64 | item_count u64 |
//!   block_count u32 | crc32 of the index and trailer bytes 0..28 }`.
//!
//! Item: `{ kind u8 | varint first id (the group; an index entry's user;
//! delta from the previous item's first id in the block, the first item
//! absolute) | member and index kinds: varint second id (the user; an index
//! entry's group; delta from the previous item's when that item has the
//! same first id and the same tag, else absolute) | value }` with values as
//! [`encode_value`] writes them.
//!
//! Invariants: keys strictly increase within a part and from one part of a
//! run to the next; a writer never produces a part larger than its
//! `part_bytes_max`, which the configuration keeps at or below
//! [`RUN_FILE_BYTES_READ_MAX`], the limit every reader checks. Costs: the
//! writer holds one block in memory; the reader checks a block's CRC before
//! decoding it and allocates nothing a length field alone asks for.

use std::io::Write;

use super::{
    check_header, put_key, put_varint, read_key, unzigzag, zigzag, GroupRecord, Item, Key, Reader,
    SmallRecord, StopAtError,
};
use crate::logs::retention::Retention;
use crate::logs::segment::SEGMENT_HEADER_BYTES;

pub(crate) const RUN_MAGIC: [u8; 8] = *b"TDMKRUN\0";
pub(crate) const RUN_TRAILER_MAGIC: [u8; 8] = *b"TDMKRUNT";
pub(crate) const RUN_VERSION: u16 = 1;
pub(crate) const RUN_HEADER_BYTES: usize = 64;
pub(crate) const RUN_TRAILER_BYTES: usize = 32;
pub(crate) const BLOCK_HEADER_BYTES: usize = 12;
pub(crate) const INDEX_ENTRY_BYTES: usize = 8 + 4 + super::KEY_BYTES;

/// Blocks are closed once they would exceed this (a larger item gets a
/// block of its own).
pub(crate) const BLOCK_BYTES_TARGET: usize = 64 << 10;

/// The largest part a reader accepts. `Config::run_file_bytes_max` is
/// validated against it, and the writer checks every part against the
/// configured value, so no writer produces a part a reader refuses.
pub(crate) const RUN_FILE_BYTES_READ_MAX: u64 = 1 << 30;

/// The smallest `run_file_bytes_max`: a part must hold its header, a block
/// with a group record of a few segments, an index entry and its trailer.
pub(crate) const RUN_FILE_BYTES_MIN: u64 = 1 << 10;

/// Longest damage reason stored (longer ones are cut at a char boundary).
pub(crate) const DAMAGE_REASON_BYTES_MAX: usize = 4096;

const KIND_GROUP_PUT: u8 = 1;
const KIND_GROUP_DELETE: u8 = 2;
const KIND_MEMBER_PUT: u8 = 3;
const KIND_MEMBER_DELETE: u8 = 4;
const KIND_INDEX_PUT: u8 = 5;
const KIND_INDEX_DELETE: u8 = 6;

const FLAG_FRESH: u8 = 1;
const FLAG_DAMAGED: u8 = 2;
const FLAG_RETENTION: u8 = 4;
const FLAG_SMALL: u8 = 8;
const FLAG_QUIET: u8 = 16;
const FLAG_EDITS: u8 = 32;
/// Recalled messages not yet erased from a segment (storage.md 6.1 bit 6).
const FLAG_ERASE: u8 = 64;

/// What a manifest records about a part, and what a reader checks it
/// against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PartMeta {
    pub run_seq: u64,
    pub part: u32,
    pub item_count: u64,
    pub file_len: u64,
    /// The trailer's CRC: names this exact part.
    pub trailer_crc: u32,
    pub first_key: Key,
    pub last_key: Key,
}

/// The file name of a part.
pub(crate) fn part_file_name(run_seq: u64, part: u32) -> String {
    format!("{run_seq:020}-{part:04}.tmr")
}

/// `(run_seq, part)` of a part file name.
pub(crate) fn parse_part_file_name(name: &str) -> Option<(u64, u32)> {
    let stem = name.strip_suffix(".tmr")?;
    let (seq, part) = stem.split_once('-')?;
    if seq.len() != 20
        || part.len() < 4
        || !(seq.bytes().chain(part.bytes()).all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    Some((seq.parse().ok()?, part.parse().ok()?))
}

/// Appends the item's bytes; `prev` is the key of the previous item of the
/// block (`None` for the first).
pub(crate) fn encode_item(out: &mut Vec<u8>, item: &Item, prev: Option<Key>) {
    let key = item.key();
    let kind = match item {
        Item::GroupPut(_) => KIND_GROUP_PUT,
        Item::GroupDelete { .. } => KIND_GROUP_DELETE,
        Item::MemberPut { .. } => KIND_MEMBER_PUT,
        Item::MemberDelete { .. } => KIND_MEMBER_DELETE,
        Item::IndexPut { .. } => KIND_INDEX_PUT,
        Item::IndexDelete { .. } => KIND_INDEX_DELETE,
    };
    out.push(kind);
    let prev_group = prev.map_or(0, |p| p.group);
    put_varint(out, key.group - prev_group);
    if let Some(second) = key.user {
        match prev {
            Some(Key {
                group,
                index,
                user: Some(ps),
            }) if group == key.group && index == key.index => put_varint(out, second - ps),
            _ => put_varint(out, second),
        }
    }
    encode_value(out, item);
}

// Format: GroupPut value { flags u8 (1 fresh, 2 damaged, 4 retention,
// 8 small, 16 quiet, 32 edits, 64 erase) | varint applied_lsn | varint head | varint m (0 with head 0: no
// file; 0 for a small or damaged group) |
// m x { varint base (the first absolute, then the delta > 0) | varint len } |
// small? { varint first_id | varint floor - first_id | varint n |
//   n x { varint file (FileId::raw) | varint offset | varint bytes | varint count } } |
// retention? { by_cursor u8 | varint max_age_ms | varint max_bytes } |
// damaged? { varint n <= 4096 | n bytes UTF-8 } |
// quiet? { varint n | n x varint id (the first absolute, then the delta > 0) } |
// edits? { varint n | n x { varint message (as quiet's) | varint edit - message > 0 } } |
// erase? { as quiet's: recalled messages not yet erased from a segment } };
// MemberPut value
// { varint cursor | varint zigzag(cursor + 1 - join_point) }; deletes none.
fn encode_value(out: &mut Vec<u8>, item: &Item) {
    match item {
        Item::GroupPut(g) => {
            let mut flags = 0;
            if g.fresh {
                flags |= FLAG_FRESH;
            }
            if g.damaged.is_some() {
                flags |= FLAG_DAMAGED;
            }
            if !g.retention.keeps_everything() {
                flags |= FLAG_RETENTION;
            }
            if g.small.is_some() {
                flags |= FLAG_SMALL;
            }
            if !g.quiet.is_empty() {
                flags |= FLAG_QUIET;
            }
            if !g.edits.is_empty() {
                flags |= FLAG_EDITS;
            }
            if !g.erase.is_empty() {
                flags |= FLAG_ERASE;
            }
            out.push(flags);
            put_varint(out, g.applied_lsn);
            put_varint(out, g.head);
            put_varint(out, g.segments.len() as u64);
            let mut prev_base = 0;
            for &(base, len) in &g.segments {
                put_varint(out, base - prev_base);
                put_varint(out, len);
                prev_base = base;
            }
            if let Some(small) = &g.small {
                put_varint(out, small.first_id);
                put_varint(out, small.floor - small.first_id);
                put_varint(out, small.extents.len() as u64);
                for &(file, offset, bytes, count) in &small.extents {
                    put_varint(out, file.into());
                    put_varint(out, offset.into());
                    put_varint(out, bytes.into());
                    put_varint(out, count.into());
                }
            }
            if flags & FLAG_RETENTION != 0 {
                out.push(u8::from(g.retention.by_cursor));
                put_varint(out, g.retention.max_age_ms);
                put_varint(out, g.retention.max_bytes);
            }
            if let Some(reason) = &g.damaged {
                let reason = cut_at_char_boundary(reason, DAMAGE_REASON_BYTES_MAX);
                put_varint(out, reason.len() as u64);
                out.extend_from_slice(reason.as_bytes());
            }
            if !g.quiet.is_empty() {
                put_varint(out, g.quiet.len() as u64);
                let mut prev = 0;
                for &id in &g.quiet {
                    put_varint(out, id - prev);
                    prev = id;
                }
            }
            if !g.edits.is_empty() {
                put_varint(out, g.edits.len() as u64);
                let mut prev = 0;
                for &(message, edit) in &g.edits {
                    put_varint(out, message - prev);
                    put_varint(out, edit - message);
                    prev = message;
                }
            }
            if !g.erase.is_empty() {
                put_varint(out, g.erase.len() as u64);
                let mut prev = 0;
                for &id in &g.erase {
                    put_varint(out, id - prev);
                    prev = id;
                }
            }
        }
        Item::MemberPut {
            cursor, join_point, ..
        } => {
            put_varint(out, *cursor);
            put_varint(
                out,
                zigzag(
                    (*cursor as i64)
                        .wrapping_add(1)
                        .wrapping_sub(*join_point as i64),
                ),
            );
        }
        Item::GroupDelete { .. }
        | Item::MemberDelete { .. }
        | Item::IndexPut { .. }
        | Item::IndexDelete { .. } => {}
    }
}

fn cut_at_char_boundary(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A damage reason as stored (what a decoded record holds).
#[cfg(test)]
pub(crate) fn stored_reason(reason: &str) -> String {
    cut_at_char_boundary(reason, DAMAGE_REASON_BYTES_MAX).to_owned()
}

/// Decodes one item; `prev` as in [`encode_item`].
pub(super) fn decode_item(r: &mut Reader<'_>, prev: Option<Key>) -> Result<Item, String> {
    let at = r.position();
    let kind = r.u8()?;
    let delta = r.varint()?;
    let group = prev
        .map_or(0, |p| p.group)
        .checked_add(delta)
        .ok_or_else(|| format!("group id overflows at offset {at}"))?;
    let index = matches!(kind, KIND_INDEX_PUT | KIND_INDEX_DELETE);
    let two_ids = index || matches!(kind, KIND_MEMBER_PUT | KIND_MEMBER_DELETE);
    let user = if two_ids {
        let v = r.varint()?;
        match prev {
            Some(Key {
                group: pg,
                index: pi,
                user: Some(ps),
            }) if pg == group && pi == index => Some(
                ps.checked_add(v)
                    .ok_or_else(|| format!("second id overflows at offset {at}"))?,
            ),
            _ => Some(v),
        }
    } else {
        None
    };
    let item = match kind {
        KIND_GROUP_PUT => Item::GroupPut(Box::new(decode_group(r, group)?)),
        KIND_GROUP_DELETE => Item::GroupDelete { group },
        KIND_MEMBER_PUT => {
            let cursor = r.varint()?;
            let delta = unzigzag(r.varint()?);
            Item::MemberPut {
                group,
                // Invariant: `member` kinds set `user`.
                user: user.unwrap_or_default(),
                cursor,
                join_point: (cursor as i64).wrapping_add(1).wrapping_sub(delta) as u64,
            }
        }
        KIND_MEMBER_DELETE => Item::MemberDelete {
            group,
            user: user.unwrap_or_default(),
        },
        // An index entry's first id is its user, the second its group.
        KIND_INDEX_PUT => Item::IndexPut {
            user: group,
            group: user.unwrap_or_default(),
        },
        KIND_INDEX_DELETE => Item::IndexDelete {
            user: group,
            group: user.unwrap_or_default(),
        },
        other => return Err(format!("invalid item kind {other} at offset {at}")),
    };
    if let Some(p) = prev {
        if item.key() <= p {
            return Err(format!(
                "item at offset {at}: key {:?} does not follow {p:?}",
                item.key()
            ));
        }
    }
    Ok(item)
}

fn decode_group(r: &mut Reader<'_>, group: u64) -> Result<GroupRecord, String> {
    let bad = |what: &str| format!("group {group}: {what}");
    let flags = r.u8()?;
    let known = FLAG_FRESH
        | FLAG_DAMAGED
        | FLAG_RETENTION
        | FLAG_SMALL
        | FLAG_QUIET
        | FLAG_EDITS
        | FLAG_ERASE;
    if flags & !known != 0 {
        return Err(bad(&format!("reserved flag bits set ({flags:#x})")));
    }
    let applied_lsn = r.varint()?;
    if applied_lsn > crate::commit::journal::LSN_MAX {
        return Err(bad(&format!("applied_lsn {applied_lsn} at or beyond 2^62")));
    }
    let head = r.varint()?;
    let m = r.varint()?;
    // Each segment takes at least two bytes: a hostile count fails here.
    // No segment: a group that holds no record and has no file, a small
    // group (its records in the journal), or a group damaged while small.
    let fileless_ok = flags & (FLAG_SMALL | FLAG_DAMAGED) != 0;
    if (m == 0 && head != 0 && !fileless_ok)
        || (m > 0 && flags & FLAG_SMALL != 0)
        || m > (r.remaining() / 2) as u64
    {
        return Err(bad(&format!("{m} segments with head {head}")));
    }
    let mut segments = Vec::with_capacity(m as usize);
    let mut base = 0u64;
    for i in 0..m {
        let delta = r.varint()?;
        if i > 0 && delta == 0 {
            return Err(bad("segment bases do not rise"));
        }
        base = base
            .checked_add(delta)
            .ok_or_else(|| bad("segment base overflows"))?;
        let len = r.varint()?;
        if len < SEGMENT_HEADER_BYTES as u64 {
            return Err(bad("segment shorter than its header"));
        }
        segments.push((base, len));
    }
    // Bases rise from at least 1 (ids start at 1) to at most head + 1.
    if segments.first().is_some_and(|s| s.0 == 0) || base > head.saturating_add(1) {
        return Err(bad("inconsistent segment list"));
    }
    let small = if flags & FLAG_SMALL != 0 {
        Some(decode_small(r, head).map_err(|why| bad(&why))?)
    } else {
        None
    };
    let retention = if flags & FLAG_RETENTION != 0 {
        let by_cursor = match r.u8()? {
            0 => false,
            1 => true,
            v => return Err(bad(&format!("by_cursor {v}"))),
        };
        let ret = Retention {
            by_cursor,
            max_age_ms: r.varint()?,
            max_bytes: r.varint()?,
        };
        if ret.keeps_everything() {
            return Err(bad("retention flag with the default policy"));
        }
        ret
    } else {
        Retention::default()
    };
    let damaged = if flags & FLAG_DAMAGED != 0 {
        let n = r.varint()?;
        if n > DAMAGE_REASON_BYTES_MAX as u64 {
            return Err(bad("damage reason too long"));
        }
        let bytes = r.bytes(n as usize)?;
        Some(
            std::str::from_utf8(bytes)
                .map_err(|_| bad("damage reason is not UTF-8"))?
                .to_owned(),
        )
    } else {
        None
    };
    let quiet = if flags & FLAG_QUIET != 0 {
        decode_quiet(r, head).map_err(|why| bad(&why))?
    } else {
        Vec::new()
    };
    let edits = if flags & FLAG_EDITS != 0 {
        decode_edits(r, head).map_err(|why| bad(&why))?
    } else {
        Vec::new()
    };
    // Laid out and checked like the quiet ids.
    let erase = if flags & FLAG_ERASE != 0 {
        decode_quiet(r, head).map_err(|why| bad(&format!("erase list: {why}")))?
    } else {
        Vec::new()
    };
    Ok(GroupRecord {
        group,
        fresh: flags & FLAG_FRESH != 0,
        applied_lsn,
        head,
        segments,
        retention,
        damaged,
        small,
        quiet,
        edits,
        erase,
    })
}

/// A group's latest edits (the `edits` part of a GroupPut value): at least
/// one, messages rising from at least 1, each edit above its message and
/// at most `head`.
fn decode_edits(r: &mut Reader<'_>, head: u64) -> Result<Vec<(u64, u64)>, String> {
    let n = r.varint()?;
    // Each entry takes at least two bytes: a hostile count fails here.
    if n == 0 || n > (r.remaining() / 2) as u64 {
        return Err(format!("{n} latest edits"));
    }
    let mut edits = Vec::with_capacity(n as usize);
    let mut message = 0u64;
    for _ in 0..n {
        let delta = r.varint()?;
        let above = r.varint()?;
        if delta == 0 || above == 0 {
            return Err("latest edits do not rise, or an edit is not above its message".into());
        }
        message = message
            .checked_add(delta)
            .ok_or("edited message overflows")?;
        let edit = message.checked_add(above).ok_or("edit id overflows")?;
        if edit > head {
            return Err(format!("edit {edit} above head {head}"));
        }
        edits.push((message, edit));
    }
    Ok(edits)
}

/// A group's quiet ids (the `quiet` part of a GroupPut value): at least
/// one, rising from at least 1 to at most `head`.
fn decode_quiet(r: &mut Reader<'_>, head: u64) -> Result<Vec<u64>, String> {
    let n = r.varint()?;
    // Each id takes at least one byte: a hostile count fails here.
    if n == 0 || n > r.remaining() as u64 {
        return Err(format!("{n} quiet ids"));
    }
    let mut ids = Vec::with_capacity(n as usize);
    let mut id = 0u64;
    for _ in 0..n {
        let delta = r.varint()?;
        if delta == 0 {
            return Err("quiet ids do not rise from 1".into());
        }
        id = id.checked_add(delta).ok_or("quiet id overflows")?;
        ids.push(id);
    }
    if id > head {
        return Err(format!("quiet id {id} above head {head}"));
    }
    Ok(ids)
}

/// A small group's extents (the `small` part of a GroupPut value): each a
/// run of records an extent can be (`Extent::new`), in a journal file, the
/// ids from `first_id` through `head` covered exactly.
fn decode_small(r: &mut Reader<'_>, head: u64) -> Result<SmallRecord, String> {
    let first_id = r.varint()?;
    let floor = first_id
        .checked_add(r.varint()?)
        .ok_or("small floor overflows")?;
    let n = r.varint()?;
    // Each extent takes at least four bytes: a hostile count fails here.
    // No extent: a group whose every record retention dropped (a group
    // that never had one is written without bit 3).
    let emptied = n == 0 && head > 0 && first_id == head.saturating_add(1) && floor == first_id;
    if first_id == 0 || (n == 0 && !emptied) || n > (r.remaining() / 4) as u64 {
        return Err(format!(
            "small group: first_id {first_id}, floor {floor}, {n} extents, head {head}"
        ));
    }
    let mut extents = Vec::with_capacity(n as usize);
    let mut next = first_id;
    for _ in 0..n {
        let field = |v: u64| u32::try_from(v).map_err(|_| format!("extent field {v} too large"));
        let file = field(r.varint()?)?;
        let (offset, bytes, count) = (
            field(r.varint()?)?,
            field(r.varint()?)?,
            field(r.varint()?)?,
        );
        crate::logs::extents::Extent::new(
            crate::logs::extents::FileId::from_raw(file),
            offset,
            bytes,
            count,
        )
        .ok_or_else(|| format!("extent ({file}, {offset}, {bytes}, {count}) is invalid"))?;
        next = next
            .checked_add(count.into())
            .ok_or("small group ids overflow")?;
        extents.push((file, offset, bytes, count));
    }
    // The floor lies in the first extent (invariant E1 of `extents.rs`).
    let first_end = extents
        .first()
        .map_or(first_id, |e| first_id + u64::from(e.3));
    if next - 1 != head || (n > 0 && floor >= first_end) {
        return Err(format!(
            "small group: extents hold ids {first_id}..{next}, floor {floor}, head {head}"
        ));
    }
    Ok(SmallRecord {
        first_id,
        floor,
        extents,
    })
}

/// Why a run could not be written.
#[derive(Debug)]
pub(crate) enum WriteError {
    Io(std::io::Error),
    /// One item does not fit in a part of `part_bytes_max` bytes.
    ItemTooLarge {
        key: Key,
        bytes: usize,
        part_bytes_max: u64,
    },
    /// Keys must strictly increase (a programmer error of the caller).
    OutOfOrder {
        key: Key,
        after: Key,
    },
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WriteError::Io(e) => write!(f, "{e}"),
            WriteError::ItemTooLarge {
                key,
                bytes,
                part_bytes_max,
            } => write!(
                f,
                "item {key:?} of {bytes} bytes does not fit in a run part of {part_bytes_max} bytes"
            ),
            WriteError::OutOfOrder { key, after } => {
                write!(f, "run item {key:?} written after {after:?}")
            }
        }
    }
}

/// Writes one run as parts, each a `W` that `open_part(part)` gives (a
/// file, or a `Vec<u8>` in tests), written front to back.
pub(crate) struct RunWriter<W: Write, F: FnMut(u32) -> std::io::Result<W>> {
    run_seq: u64,
    part_bytes_max: u64,
    created_ms: u64,
    open_part: F,
    done: Vec<(W, PartMeta)>,
    cur: Option<PartState<W>>,
    /// The block being filled (header space reserved at the front).
    block: Vec<u8>,
    block_count: u32,
    block_first: Option<Key>,
    block_prev: Option<Key>,
    last_key: Option<Key>,
    item_buf: Vec<u8>,
}

struct PartState<W> {
    out: W,
    part: u32,
    /// Bytes written: header and closed blocks.
    written: u64,
    index: Vec<u8>,
    blocks: u32,
    items: u64,
    first_key: Option<Key>,
    last_key: Option<Key>,
}

impl<W: Write, F: FnMut(u32) -> std::io::Result<W>> RunWriter<W, F> {
    /// `part_bytes_max` must lie in `RUN_FILE_BYTES_MIN..=RUN_FILE_BYTES_READ_MAX`
    /// (the configuration checks it).
    pub fn new(run_seq: u64, part_bytes_max: u64, created_ms: u64, open_part: F) -> Self {
        assert!(
            (RUN_FILE_BYTES_MIN..=RUN_FILE_BYTES_READ_MAX).contains(&part_bytes_max),
            "invariant: run_file_bytes_max validated"
        );
        RunWriter {
            run_seq,
            part_bytes_max,
            created_ms,
            open_part,
            done: Vec::new(),
            cur: None,
            block: Vec::new(),
            block_count: 0,
            block_first: None,
            block_prev: None,
            last_key: None,
            item_buf: Vec::new(),
        }
    }

    /// Appends one item; keys must strictly increase.
    pub fn push(&mut self, item: &Item) -> Result<(), WriteError> {
        let key = item.key();
        if let Some(after) = self.last_key.filter(|&l| key <= l) {
            return Err(WriteError::OutOfOrder { key, after });
        }
        loop {
            // The item as it would be encoded in the current block.
            self.item_buf.clear();
            encode_item(&mut self.item_buf, item, self.block_prev);
            let in_block = !self.block.is_empty();
            let block_len = if in_block {
                self.block.len()
            } else {
                BLOCK_HEADER_BYTES
            };
            let fits_block = !in_block || block_len + self.item_buf.len() <= BLOCK_BYTES_TARGET;
            if in_block && !fits_block {
                self.close_block()?;
                continue;
            }
            let part_written = self
                .cur
                .as_ref()
                .map_or(RUN_HEADER_BYTES as u64, |p| p.written);
            // Index entries once this item's block is closed.
            let blocks_after = self.cur.as_ref().map_or(0, |p| p.blocks) + 1;
            let projected = part_written
                + (block_len + self.item_buf.len()) as u64
                + u64::from(blocks_after) * INDEX_ENTRY_BYTES as u64
                + RUN_TRAILER_BYTES as u64;
            if projected > self.part_bytes_max {
                let part_has_items = self.cur.as_ref().is_some_and(|p| p.items > 0) || in_block;
                if !part_has_items {
                    return Err(WriteError::ItemTooLarge {
                        key,
                        bytes: self.item_buf.len(),
                        part_bytes_max: self.part_bytes_max,
                    });
                }
                self.close_part()?;
                continue;
            }
            if self.cur.is_none() {
                self.open_part()?;
            }
            if !in_block {
                self.block.extend_from_slice(&[0; BLOCK_HEADER_BYTES]);
                self.block_first = Some(key);
            }
            self.block.extend_from_slice(&self.item_buf);
            self.block_count += 1;
            self.block_prev = Some(key);
            self.last_key = Some(key);
            // Invariant: `open_part` above made `cur`.
            let p = self.cur.as_mut().expect("invariant: a part is open");
            p.items += 1;
            p.first_key.get_or_insert(key);
            p.last_key = Some(key);
            return Ok(());
        }
    }

    fn open_part(&mut self) -> Result<(), WriteError> {
        let part = u32::try_from(self.done.len()).map_err(|_| {
            WriteError::Io(std::io::Error::other("more than 2^32 parts in one run"))
        })?;
        let mut out = (self.open_part)(part).map_err(WriteError::Io)?;
        let mut h = Vec::with_capacity(RUN_HEADER_BYTES);
        h.extend_from_slice(&RUN_MAGIC);
        h.extend_from_slice(&RUN_VERSION.to_le_bytes());
        h.extend_from_slice(&(RUN_HEADER_BYTES as u16).to_le_bytes());
        h.extend_from_slice(&part.to_le_bytes());
        h.extend_from_slice(&self.run_seq.to_le_bytes());
        h.extend_from_slice(&self.created_ms.to_le_bytes());
        h.extend_from_slice(&[0; 28]);
        let crc = crc32fast::hash(&h);
        h.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(h.len(), RUN_HEADER_BYTES);
        out.write_all(&h).map_err(WriteError::Io)?;
        self.cur = Some(PartState {
            out,
            part,
            written: RUN_HEADER_BYTES as u64,
            index: Vec::new(),
            blocks: 0,
            items: 0,
            first_key: None,
            last_key: None,
        });
        Ok(())
    }

    fn close_block(&mut self) -> Result<(), WriteError> {
        if self.block.is_empty() {
            return Ok(());
        }
        // Invariant: a block is only started inside an open part.
        let p = self
            .cur
            .as_mut()
            .expect("invariant: a block lies in a part");
        let len = u32::try_from(self.block.len()).expect("invariant: a block fits a part");
        self.block[4..8].copy_from_slice(&len.to_le_bytes());
        self.block[8..12].copy_from_slice(&self.block_count.to_le_bytes());
        let crc = crc32fast::hash(&self.block[4..]);
        self.block[0..4].copy_from_slice(&crc.to_le_bytes());
        p.out.write_all(&self.block).map_err(WriteError::Io)?;
        p.index.extend_from_slice(&p.written.to_le_bytes());
        p.index.extend_from_slice(&len.to_le_bytes());
        put_key(
            &mut p.index,
            self.block_first
                .expect("invariant: a block has a first item"),
        );
        p.written += u64::from(len);
        p.blocks += 1;
        self.block.clear();
        self.block_count = 0;
        self.block_first = None;
        self.block_prev = None;
        Ok(())
    }

    fn close_part(&mut self) -> Result<(), WriteError> {
        self.close_block()?;
        let Some(mut p) = self.cur.take() else {
            return Ok(());
        };
        let mut t = Vec::with_capacity(RUN_TRAILER_BYTES);
        t.extend_from_slice(&RUN_TRAILER_MAGIC);
        t.extend_from_slice(&p.written.to_le_bytes());
        t.extend_from_slice(&p.items.to_le_bytes());
        t.extend_from_slice(&p.blocks.to_le_bytes());
        let mut crc = crc32fast::Hasher::new();
        crc.update(&p.index);
        crc.update(&t);
        let trailer_crc = crc.finalize();
        t.extend_from_slice(&trailer_crc.to_le_bytes());
        p.out.write_all(&p.index).map_err(WriteError::Io)?;
        p.out.write_all(&t).map_err(WriteError::Io)?;
        p.out.flush().map_err(WriteError::Io)?;
        let file_len = p.written + p.index.len() as u64 + RUN_TRAILER_BYTES as u64;
        assert!(
            file_len <= self.part_bytes_max,
            "invariant: a part never exceeds run_file_bytes_max ({file_len} > {})",
            self.part_bytes_max
        );
        self.done.push((
            p.out,
            PartMeta {
                run_seq: self.run_seq,
                part: p.part,
                item_count: p.items,
                file_len,
                trailer_crc,
                first_key: p.first_key.expect("invariant: a closed part holds an item"),
                last_key: p.last_key.expect("invariant: a closed part holds an item"),
            },
        ));
        Ok(())
    }

    /// Closes the last part; returns every part with what a manifest
    /// records of it (none for a run without items).
    pub fn finish(mut self) -> Result<Vec<(W, PartMeta)>, WriteError> {
        self.close_part()?;
        Ok(self.done)
    }
}

/// A part checked at its header, index and trailer, whose items are
/// decoded (and each block's CRC checked) as they are iterated.
pub(crate) struct PartReader<'a> {
    bytes: &'a [u8],
    pub run_seq: u64,
    pub part: u32,
    pub item_count: u64,
    pub trailer_crc: u32,
    index: &'a [u8],
    blocks: u32,
    next_block: u32,
    block: Reader<'a>,
    block_left: u32,
    prev: Option<Key>,
    last: Option<Key>,
    /// The first item of the block just entered (decoded to check it
    /// against the index).
    pending: Option<Item>,
    seen: u64,
    failed: bool,
    /// Where the block being read starts (where a block error lies).
    block_at: u64,
    /// Reading started past the first block ([`PartReader::seek`]): the
    /// items counted are not the part's, so the end does not compare them
    /// with the trailer's count.
    partial: bool,
}

impl<'a> PartReader<'a> {
    /// Checks the part's header, trailer and block index; refuses a part
    /// longer than `limit` (the reader's constant).
    pub fn open(bytes: &'a [u8], limit: u64) -> Result<PartReader<'a>, String> {
        let len = bytes.len();
        if len as u64 > limit {
            return Err(format!(
                "run part of {len} bytes exceeds the limit of {limit}"
            ));
        }
        if len < RUN_HEADER_BYTES + RUN_TRAILER_BYTES {
            return Err(format!(
                "run part of {len} bytes is shorter than its header and trailer"
            ));
        }
        let h = &bytes[..RUN_HEADER_BYTES];
        let mut r = Reader::new(h);
        r.bytes(12)?;
        let part = r.u32()?;
        let run_seq = r.u64()?;
        let _created_ms = r.u64()?;
        check_header(
            h,
            "run part",
            &RUN_MAGIC,
            RUN_VERSION,
            h[32..60].iter().all(|&b| b == 0),
        )?;
        let t = &bytes[len - RUN_TRAILER_BYTES..];
        let mut tr = Reader::new(t);
        let tmagic = tr.bytes(8)?;
        let index_offset = tr.u64()?;
        let item_count = tr.u64()?;
        let blocks = tr.u32()?;
        let trailer_crc = tr.u32()?;
        if tmagic != RUN_TRAILER_MAGIC {
            return Err("bad run part trailer magic".into());
        }
        let index_len = u64::from(blocks) * INDEX_ENTRY_BYTES as u64;
        if blocks == 0
            || item_count == 0
            || index_offset < RUN_HEADER_BYTES as u64
            || index_offset.checked_add(index_len) != Some((len - RUN_TRAILER_BYTES) as u64)
        {
            return Err(format!(
                "run part trailer: index at {index_offset} with {blocks} blocks and {item_count} items does not fit {len} bytes"
            ));
        }
        let index = &bytes[index_offset as usize..len - RUN_TRAILER_BYTES];
        let mut crc = crc32fast::Hasher::new();
        crc.update(index);
        crc.update(&t[..28]);
        if crc.finalize() != trailer_crc {
            return Err("run part index or trailer checksum mismatch".into());
        }
        // Blocks tile the bytes between the header and the index.
        let mut ir = Reader::new(index);
        let mut expect = RUN_HEADER_BYTES as u64;
        for _ in 0..blocks {
            let off = ir.u64()?;
            let blen = ir.u32()?;
            read_key(&mut ir)?;
            if off != expect || (blen as usize) < BLOCK_HEADER_BYTES {
                return Err(format!(
                    "block index entry at {off} (expected {expect}), {blen} bytes"
                ));
            }
            expect += u64::from(blen);
        }
        if expect != index_offset {
            return Err("blocks do not end where the index starts".into());
        }
        Ok(PartReader {
            bytes,
            run_seq,
            part,
            item_count,
            trailer_crc,
            index,
            blocks,
            next_block: 0,
            block: Reader::new(&[]),
            block_left: 0,
            prev: None,
            last: None,
            pending: None,
            seen: 0,
            failed: false,
            block_at: RUN_HEADER_BYTES as u64,
            partial: false,
        })
    }

    /// The first key (from the index; checked against the first item).
    pub fn first_key(&self) -> Result<Key, String> {
        read_key(&mut Reader::new(&self.index[12..INDEX_ENTRY_BYTES]))
    }

    /// The last key read so far.
    pub fn last_key(&self) -> Option<Key> {
        self.last
    }

    /// Offset and length of block `block` from the index (checked to tile
    /// the part when it was opened).
    fn index_entry(&self, block: u32) -> Result<(u64, u32), String> {
        let mut ir = Reader::new(&self.index[block as usize * INDEX_ENTRY_BYTES..]);
        Ok((ir.u64()?, ir.u32()?))
    }

    /// Positions the reader at the block that holds `key` if any item
    /// does (the last block whose first key is at or below it; the first
    /// block if none is): the items it yields from then on start there.
    /// A binary search of the index: O(log blocks), no block read.
    pub fn seek(&mut self, key: Key) -> Result<(), String> {
        let (mut lo, mut hi) = (0u32, self.blocks);
        // Invariant: blocks below `lo` start at or below `key` (but for
        // block 0, taken anyway), blocks at or above `hi` start above it.
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            let entry = &self.index[mid as usize * INDEX_ENTRY_BYTES + 12..][..super::KEY_BYTES];
            if read_key(&mut Reader::new(entry))? <= key {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        self.next_block = lo;
        self.partial = lo > 0;
        Ok(())
    }

    fn enter_block(&mut self) -> Result<(), String> {
        let entry =
            &self.index[self.next_block as usize * INDEX_ENTRY_BYTES..][..INDEX_ENTRY_BYTES];
        let mut ir = Reader::new(entry);
        let off = ir.u64()? as usize;
        let blen = ir.u32()? as usize;
        let first = read_key(&mut ir)?;
        self.block_at = off as u64;
        let b = &self.bytes[off..off + blen];
        let count = check_block(b, off as u64)?;
        self.block = Reader::new(&b[BLOCK_HEADER_BYTES..]);
        self.block_left = count;
        self.next_block += 1;
        // Keys are delta-coded from the block's first item: decode it with
        // no predecessor, then check it against the index and the previous
        // block.
        let item = decode_item(&mut self.block, None)?;
        if item.key() != first {
            return Err(format!(
                "run block at offset {off}: first key differs from the index"
            ));
        }
        if self.prev.is_some_and(|p| first <= p) {
            return Err(format!("run block at offset {off}: keys do not increase"));
        }
        self.pending = Some(item);
        Ok(())
    }
}

impl StopAtError for PartReader<'_> {
    fn failed(&mut self) -> &mut bool {
        &mut self.failed
    }

    fn next_inner(&mut self) -> Result<Option<Item>, String> {
        if self.block_left == 0 {
            if !self.block.is_empty() {
                return Err("bytes after the last item of a run block".into());
            }
            if self.next_block == self.blocks {
                if self.seen != self.item_count && !self.partial {
                    return Err(format!(
                        "run part holds {} items, its trailer says {}",
                        self.seen, self.item_count
                    ));
                }
                return Ok(None);
            }
            self.enter_block()?;
        }
        // Checked before an item is yielded, not only at the end: a reader
        // never hands out an item its trailer does not count.
        if self.seen >= self.item_count {
            return Err(format!(
                "run part holds more items than its trailer says ({})",
                self.item_count
            ));
        }
        let item = match self.pending.take() {
            Some(item) => item,
            None => decode_item(&mut self.block, self.prev)?,
        };
        self.block_left -= 1;
        self.seen += 1;
        self.prev = Some(item.key());
        self.last = self.prev;
        Ok(Some(item))
    }
}

impl Iterator for PartReader<'_> {
    type Item = Result<Item, String>;

    /// The next item; an error ends the iteration.
    fn next(&mut self) -> Option<Self::Item> {
        self.next_or_first_error()
    }
}

/// Checks one part alone, every byte of it, against what its manifest
/// entry says (`meta`), as a merge would read it: `Err((offset, why))`
/// names where the first damage lies (0 for the header, the trailer's
/// offset for the trailer and the index, a block's own offset for a
/// block). Recovery, `ctl verify` and `ctl repair` name a damaged
/// checkpoint's file and offset with it.
pub(crate) fn check_part(bytes: &[u8], meta: &PartMeta) -> Result<(), (u64, String)> {
    let trailer_at = bytes.len().saturating_sub(RUN_TRAILER_BYTES) as u64;
    read_to_last_key(open_as_named(bytes, meta)?, meta, trailer_at)
}

/// Reads `r`'s items to its end and checks the last key against the
/// manifest's (`meta`): the end of [`check_part`] and [`check_part_sums`].
fn read_to_last_key(
    mut r: PartReader<'_>,
    meta: &PartMeta,
    trailer_at: u64,
) -> Result<(), (u64, String)> {
    while let Some(item) = r.next() {
        if let Err(why) = item {
            return Err((r.block_at, why));
        }
    }
    if r.last_key() != Some(meta.last_key) {
        return Err((trailer_at, "last key differs from the manifest".into()));
    }
    Ok(())
}

/// Checks a block (`b`, its index entry's bytes, at offset `off` of its
/// part) against its header: the CRC of bytes 4.., the length field equal
/// to the entry's, at least one item. Returns the item count. The index
/// entry's length was checked to be at least the header's when the part
/// was opened.
fn check_block(b: &[u8], off: u64) -> Result<u32, String> {
    let stored = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let len_field = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as usize;
    let count = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
    if crc32fast::hash(&b[4..]) != stored {
        return Err(format!("run block at offset {off}: checksum mismatch"));
    }
    if len_field != b.len() || count == 0 {
        return Err(format!(
            "run block at offset {off}: length {len_field}, {count} items"
        ));
    }
    Ok(count)
}

/// Checks one part's checksums only, every byte of it, against what its
/// manifest entry says (`meta`): header, index and trailer as
/// [`check_part`] does, then each block's CRC, length and count without
/// decoding its items (only the last block is decoded, for the last key).
/// `Err((offset, why))` as [`check_part`]. What it does not check is the
/// items' own sense (varints, keys, values), which only a writer's bug
/// could break under a valid CRC: a background load finds that later.
/// Cost: one CRC pass over the bytes, about a tenth of a decode.
pub(crate) fn check_part_sums(bytes: &[u8], meta: &PartMeta) -> Result<(), (u64, String)> {
    let trailer_at = bytes.len().saturating_sub(RUN_TRAILER_BYTES) as u64;
    let mut r = open_as_named(bytes, meta)?;
    for block in 0..r.blocks {
        let (off, len) = r.index_entry(block).map_err(|why| (trailer_at, why))?;
        check_block(&bytes[off as usize..][..len as usize], off).map_err(|why| (off, why))?;
    }
    // The last key: decode the last block alone.
    r.partial = true;
    r.next_block = r.blocks - 1;
    read_to_last_key(r, meta, trailer_at)
}

/// Opens a part and checks it is the one its manifest entry names (run,
/// part, item count, trailer CRC, length, first key).
fn open_as_named<'a>(bytes: &'a [u8], meta: &PartMeta) -> Result<PartReader<'a>, (u64, String)> {
    let trailer_at = bytes.len().saturating_sub(RUN_TRAILER_BYTES) as u64;
    let header_ok = || {
        bytes.len() >= RUN_HEADER_BYTES
            && check_header(
                &bytes[..RUN_HEADER_BYTES],
                "run part",
                &RUN_MAGIC,
                RUN_VERSION,
                bytes[32..60].iter().all(|&b| b == 0),
            )
            .is_ok()
    };
    let r = PartReader::open(bytes, RUN_FILE_BYTES_READ_MAX)
        .map_err(|why| (if header_ok() { trailer_at } else { 0 }, why))?;
    if (r.run_seq, r.part) != (meta.run_seq, meta.part) {
        return Err((
            12,
            format!(
                "the header names run {} part {}, the manifest run {} part {}",
                r.run_seq, r.part, meta.run_seq, meta.part
            ),
        ));
    }
    if (r.item_count, r.trailer_crc) != (meta.item_count, meta.trailer_crc)
        || bytes.len() as u64 != meta.file_len
        || r.first_key().ok() != Some(meta.first_key)
    {
        return Err((
            trailer_at,
            "the part's trailer is not the one the manifest names".into(),
        ));
    }
    Ok(r)
}

/// The items of a whole run, part after part, each part checked against
/// what the manifest says of it (`metas[i]` describes `parts[i]`).
pub(crate) struct RunItems<'a> {
    parts: &'a [&'a [u8]],
    metas: &'a [PartMeta],
    next: usize,
    cur: Option<PartReader<'a>>,
    failed: bool,
    /// Where the next part opened starts ([`RunItems::from_key`]).
    seek: Option<Key>,
}

impl<'a> RunItems<'a> {
    pub fn new(parts: &'a [&'a [u8]], metas: &'a [PartMeta]) -> RunItems<'a> {
        debug_assert_eq!(parts.len(), metas.len());
        RunItems {
            parts,
            metas,
            next: 0,
            cur: None,
            failed: false,
            seek: None,
        }
    }

    /// The run's items from the block holding `key` on (the part whose
    /// range can hold it, then its block by the index): items below `key`
    /// may come first, from that block; the caller skips them. Cost: a
    /// binary search of the part's index, no block read before the first
    /// item is asked for.
    pub fn from_key(parts: &'a [&'a [u8]], metas: &'a [PartMeta], key: Key) -> RunItems<'a> {
        let mut items = RunItems::new(parts, metas);
        items.next = metas.partition_point(|m| m.last_key < key);
        items.seek = Some(key);
        items
    }
}

impl StopAtError for RunItems<'_> {
    fn failed(&mut self) -> &mut bool {
        &mut self.failed
    }

    fn next_inner(&mut self) -> Result<Option<Item>, String> {
        loop {
            if self.cur.is_none() {
                let Some(&bytes) = self.parts.get(self.next) else {
                    return Ok(None);
                };
                let meta = &self.metas[self.next];
                let r = PartReader::open(bytes, RUN_FILE_BYTES_READ_MAX)?;
                if (r.run_seq, r.part, r.item_count, r.trailer_crc)
                    != (meta.run_seq, meta.part, meta.item_count, meta.trailer_crc)
                    || bytes.len() as u64 != meta.file_len
                    || r.first_key()? != meta.first_key
                {
                    return Err(format!(
                        "run {} part {} is not the part the manifest names",
                        meta.run_seq, meta.part
                    ));
                }
                let mut r = r;
                if let Some(key) = self.seek.take() {
                    r.seek(key)?;
                }
                self.cur = Some(r);
            }
            // Invariant: set just above.
            let r = self.cur.as_mut().expect("invariant: a part is open");
            match r.next() {
                Some(item) => return item.map(Some),
                None => {
                    let meta = &self.metas[self.next];
                    if r.last_key() != Some(meta.last_key) {
                        return Err(format!(
                            "run {} part {}: last key differs from the manifest",
                            meta.run_seq, meta.part
                        ));
                    }
                    self.cur = None;
                    self.next += 1;
                }
            }
        }
    }
}

impl Iterator for RunItems<'_> {
    type Item = Result<Item, String>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_or_first_error()
    }
}
