//! The engine's persistent state (format-spec/storage.md sections 6, 9
//! "Checkpoint", 11): what changed since the last checkpoint (`dirty`),
//! the checkpointer thread and the journal files it keeps for small groups
//! (`pins`), the run and manifest files, the `FORMAT` file, and recovery
//! at open. This module itself holds the state's items as incremental
//! checkpoints store them: a set of immutable **runs** of sorted items,
//! named by a **manifest**.
//!
//! Representation: the state is a map from [`Key`] to a value. For every
//! group a *group record* under `(group, None)` (head, segments, retention,
//! damage, `applied_lsn`) and for every membership a *member row* under
//! `(group, Some(user))` (cursor, join point). A checkpoint writes one
//! *delta run* holding what changed since the one before (puts, and
//! tombstones for what went away); older runs are merged now and then
//! ([`merge::plan`]) so their number stays logarithmic in the state.
//!
//! Invariants:
//! - within a run, keys strictly increase (checked by the writer's caller
//!   and by every reader);
//! - runs are ordered newest first; for a key, the newest run holding it
//!   wins, except that a `GroupDelete` or a `fresh` group record hides
//!   every item of its group in older runs (`merge` has the table);
//! - no run part and no manifest is larger than the constant its reader
//!   checks ([`run::RUN_FILE_BYTES_READ_MAX`],
//!   [`manifest::MANIFEST_BYTES_MAX`]): writers check the same constant.
//!
//! Costs: a delta run costs its items (~25-45 bytes a group record, 6-10
//! a member row); loading at open is one k-way merge over all runs.

#[cfg(test)]
pub(crate) mod checkpoint_stats_tests;
#[cfg(test)]
pub(crate) mod checkpoint_tests;
pub(crate) mod checkpointer;
pub(crate) mod damage;
pub(crate) mod erase_segments;
pub(crate) mod format;
pub(crate) mod lazy;
#[cfg(test)]
mod lazy_tests;
#[cfg(test)]
mod load_damage_tests;
pub(crate) mod manifest;
mod merge;
pub(crate) mod pins;
pub(crate) mod recovery;
mod restore;
pub(crate) mod rewrite;
pub(crate) mod run;
// Consistent snapshots of a running engine (online backup, Raft later).
pub(crate) mod snapshot;
#[cfg(test)]
mod snapshot_tests;
#[cfg(test)]
mod user_index_tests;

use crate::logs::extents::{Extent, ExtentList, FileId};
use crate::logs::retention::Retention;

/// The key of an item: `(group, None)` is the group record, `(group,
/// Some(user))` a member row, and with `index` set an entry of the **user
/// index**, `(user, Some(group))`: the first field then holds the user,
/// which orders the index by user so that a user's groups are one range
/// (storage.md 6.1, key tag 2). Ordered by the first field, then the group
/// record, the member rows and the index entries (`index` false before
/// true), then by the second field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Key {
    /// The group; the user in an index entry.
    pub group: u64,
    /// An entry of the user index: never masked by a group item whose id
    /// equals its first field.
    pub index: bool,
    /// The user of a member row; the group of an index entry.
    pub user: Option<u64>,
}

impl Key {
    pub fn group(group: u64) -> Key {
        Key {
            group,
            index: false,
            user: None,
        }
    }

    pub fn member(group: u64, user: u64) -> Key {
        Key {
            group,
            index: false,
            user: Some(user),
        }
    }

    /// The user index's entry saying `user` may be a member of `group`.
    pub fn user_index(user: u64, group: u64) -> Key {
        Key {
            group: user,
            index: true,
            user: Some(group),
        }
    }

    /// The key's tag as stored: 0 group record, 1 member row, 2 index entry.
    pub fn tag(&self) -> u8 {
        match (self.index, self.user) {
            (true, _) => 2,
            (false, Some(_)) => 1,
            (false, None) => 0,
        }
    }
}

/// A group as a checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GroupRecord {
    pub group: u64,
    /// First record of this incarnation of the group: hides every older
    /// item of the same id (a group deleted and created again between two
    /// checkpoints leaves nothing of its old incarnation visible).
    pub fresh: bool,
    /// The position of the last journal entry this record reflects; replay
    /// applies to this group only entries after it.
    pub applied_lsn: u64,
    pub head: u64,
    /// `(base_msg_id, valid bytes)` of every segment, oldest first; the
    /// lengths were durable before the manifest naming this record was.
    pub segments: Vec<(u64, u64)>,
    pub retention: Retention,
    /// Why the group failed verification; it stays damaged.
    pub damaged: Option<String>,
    /// A small group's records in the shared journal files (storage v2
    /// S5): `segments` is then empty. `None` for a group with segments and
    /// for a small group without any record.
    pub small: Option<SmallRecord>,
    /// The group's quiet ids (`logs/changes.rs`: edits, recalls, recalled
    /// messages; not unread), ascending; empty for nearly every group.
    pub quiet: Vec<u64>,
    /// `(message, its newest Edit)` of the group's edited messages
    /// (`logs/changes.rs`), ascending by message; empty for nearly every
    /// group.
    pub edits: Vec<(u64, u64)>,
    /// Recalled messages whose payload may still be in a segment file
    /// (storage.md section 3, "Erasure"), ascending: the checkpointer's
    /// erasure pass rewrites those segments and clears them. Empty for
    /// nearly every group.
    pub erase: Vec<u64>,
}

/// Where a small group's records are, as a checkpoint records them: its
/// extent list (`extents.rs`) without the in-memory `verified` flags.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SmallRecord {
    /// Id of the first record of the first extent.
    pub first_id: u64,
    /// The oldest id reads may return (at least `first_id`).
    pub floor: u64,
    /// `(file, offset, bytes, count)` per extent, in id order; `file` is
    /// the shared file's id as stored (`FileId::raw`: a journal file's seq,
    /// or 2^31 + a cold file's seq).
    pub extents: Vec<(u32, u32, u32, u32)>,
}

impl SmallRecord {
    /// A small group's extents as a checkpoint records them.
    pub(crate) fn of(list: &ExtentList) -> SmallRecord {
        SmallRecord {
            first_id: list.first_id(),
            floor: list.floor(),
            extents: list
                .extents()
                .iter()
                .map(|e| (e.file().raw(), e.offset(), e.bytes(), e.count()))
                .collect(),
        }
    }

    /// The extent list a checkpoint recorded, or why it cannot be one. The
    /// extents are not verified: the first read of each checks its records.
    pub(crate) fn extent_list(&self, head: u64) -> Result<ExtentList, String> {
        let mut list = ExtentList::new(self.first_id);
        for &(file, offset, bytes, count) in &self.extents {
            let ext = Extent::new(FileId::from_raw(file), offset, bytes, count)
                .ok_or_else(|| format!("extent ({file}, {offset}, {bytes}, {count}) is invalid"))?;
            list.append(list.next_id(), ext);
        }
        if list.next_id() - 1 != head {
            return Err(format!(
                "extents end at msg_id {} but the head is {head}",
                list.next_id() - 1
            ));
        }
        if self.floor < self.first_id || self.floor > head + 1 {
            return Err(format!("floor {} outside the extents", self.floor));
        }
        list.trim(self.floor, |_| {});
        Ok(list)
    }
}

/// One item of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// Boxed: a group record is several times the size of a member row,
    /// and a checkpoint's delta buffer holds an item per changed membership
    /// (the enum is as large as its largest variant).
    GroupPut(Box<GroupRecord>),
    /// The group is gone: hides every item of the group in older runs.
    GroupDelete { group: u64 },
    MemberPut {
        group: u64,
        user: u64,
        cursor: u64,
        join_point: u64,
    },
    /// The membership is gone.
    MemberDelete { group: u64, user: u64 },
    /// The user index: `user` may be a member of `group` (storage.md 6.1:
    /// the index holds at least every membership of the state; a lookup
    /// checks each entry against the group's own member rows).
    IndexPut { user: u64, group: u64 },
    /// The user index: `user` left `group`.
    IndexDelete { user: u64, group: u64 },
}

impl Item {
    pub fn key(&self) -> Key {
        match self {
            Item::GroupPut(g) => Key::group(g.group),
            Item::GroupDelete { group } => Key::group(*group),
            Item::MemberPut { group, user, .. } | Item::MemberDelete { group, user } => {
                Key::member(*group, *user)
            }
            Item::IndexPut { user, group } | Item::IndexDelete { user, group } => {
                Key::user_index(*user, *group)
            }
        }
    }
}

/// Unsigned LEB128 (7 bits a byte, low first, at most 10 bytes).
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Reads little-endian fields and varints from a buffer, with the offset
/// for error messages. Every read is bounds-checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "{n} bytes wanted at offset {} but {} remain",
                self.pos,
                self.remaining()
            ));
        }
        let b = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(b)
    }

    pub fn u8(&mut self) -> Result<u8, String> {
        Ok(self.bytes(1)?[0])
    }

    pub fn u32(&mut self) -> Result<u32, String> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(a))
    }

    pub fn varint(&mut self) -> Result<u64, String> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(format!("truncated varint at offset {}", self.pos));
            };
            self.pos += 1;
            if i == 9 && b > 1 {
                return Err(format!("varint overflows u64 at offset {}", self.pos - 1));
            }
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!(
            "varint longer than 10 bytes at offset {}",
            self.pos
        ))
    }
}

/// Encodes a key as stored in block indexes and manifests (17 bytes):
/// `{ group: u64 | tag: u8 (0 group record, 1 member row, 2 index entry)
/// | user: u64 (0 for tag 0) }` (an index entry: `{ user | 2 | group }`).
pub(crate) fn put_key(out: &mut Vec<u8>, k: Key) {
    out.extend_from_slice(&k.group.to_le_bytes());
    out.push(k.tag());
    out.extend_from_slice(&k.user.unwrap_or(0).to_le_bytes());
}

pub(crate) const KEY_BYTES: usize = 17;

/// Checks the header shape that run parts and manifests share
/// (format-spec/storage.md section 6): `{ magic[8] | version u16 |
/// header_len u16 | ... | crc32 of the header's other bytes }`, `h` being
/// the whole header. `reserved_zero` says whether the caller's reserved
/// bytes are zero. In this order: checksum, magic, version, length and
/// reserved bytes; the errors name `what`.
pub(crate) fn check_header(
    h: &[u8],
    what: &str,
    magic: &[u8; 8],
    version: u16,
    reserved_zero: bool,
) -> Result<(), String> {
    let n = h.len();
    debug_assert!(n >= 16, "a header holds its magic, version and crc");
    let stored_crc = u32::from_le_bytes([h[n - 4], h[n - 3], h[n - 2], h[n - 1]]);
    if crc32fast::hash(&h[..n - 4]) != stored_crc {
        return Err(format!("{what} header checksum mismatch"));
    }
    if h[..8] != magic[..] {
        return Err(format!("bad {what} magic"));
    }
    let found = u16::from_le_bytes([h[8], h[9]]);
    if found != version {
        return Err(format!("unsupported {what} version {found}"));
    }
    let header_len = u16::from_le_bytes([h[10], h[11]]);
    if header_len as usize != n || !reserved_zero {
        return Err(format!("bad {what} header length or reserved bytes"));
    }
    Ok(())
}

/// A reader of items (a run part, a run, a merge) that yields its first
/// error and then ends: a damaged input is reported once, and nothing
/// after the damage is read as if it were sound.
pub(crate) trait StopAtError {
    /// The next item, `Ok(None)` at the end.
    fn next_inner(&mut self) -> Result<Option<Item>, String>;

    /// The flag that the first error was yielded.
    fn failed(&mut self) -> &mut bool;

    /// `Iterator::next` of such a reader.
    fn next_or_first_error(&mut self) -> Option<Result<Item, String>> {
        if *self.failed() {
            return None;
        }
        match self.next_inner() {
            Ok(v) => v.map(Ok),
            Err(e) => {
                *self.failed() = true;
                Some(Err(e))
            }
        }
    }
}

pub(crate) fn read_key(r: &mut Reader<'_>) -> Result<Key, String> {
    let group = r.u64()?;
    let tag = r.u8()?;
    let user = r.u64()?;
    match tag {
        0 if user == 0 => Ok(Key::group(group)),
        1 => Ok(Key::member(group, user)),
        2 => Ok(Key::user_index(group, user)),
        _ => Err(format!("invalid key tag {tag} (user {user})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_group_records_before_their_members() {
        let mut keys = vec![
            Key::member(2, 0),
            Key::group(2),
            Key::user_index(1, 0),
            Key::member(1, u64::MAX),
            Key::group(1),
            Key::member(1, 3),
        ];
        keys.sort();
        assert_eq!(
            keys,
            vec![
                Key::group(1),
                Key::member(1, 3),
                Key::member(1, u64::MAX),
                Key::user_index(1, 0),
                Key::group(2),
                Key::member(2, 0),
            ]
        );
    }

    #[test]
    fn varints_and_keys_round_trip_and_refuse_bad_bytes() {
        for v in [0, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut r = Reader::new(&out);
            assert_eq!(r.varint().unwrap(), v);
            assert!(r.is_empty());
            for n in 0..out.len() {
                assert!(Reader::new(&out[..n]).varint().is_err());
            }
        }
        assert!(Reader::new(&[0xff; 11]).varint().is_err());
        assert!(
            Reader::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02])
                .varint()
                .is_err()
        );
        for v in [0i64, -1, 1, i64::MIN, i64::MAX] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        for k in [
            Key::group(7),
            Key::member(7, 0),
            Key::member(u64::MAX, 9),
            Key::user_index(7, 0),
            Key::user_index(u64::MAX, 3),
        ] {
            let mut out = Vec::new();
            put_key(&mut out, k);
            assert_eq!(out.len(), KEY_BYTES);
            assert_eq!(read_key(&mut Reader::new(&out)).unwrap(), k);
        }
        let mut bad = Vec::new();
        put_key(&mut bad, Key::group(7));
        bad[8] = 3;
        assert!(read_key(&mut Reader::new(&bad)).is_err());
        bad[8] = 0;
        bad[9] = 1; // a group key with a user
        assert!(read_key(&mut Reader::new(&bad)).is_err());
    }
}

#[cfg(test)]
pub(crate) mod format_tests;
