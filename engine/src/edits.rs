//! Edits and recalls (format-spec/storage.md section 3,
//! protocol.md 4.28): a change to an earlier message is a new record of the
//! group's log, of kind Edit (payload: the target's id, then the new
//! payload) or Recall (payload: the target's id), appended through the
//! send path, so it gets the next id, is deduplicated by `(sender,
//! client_msg_id)` like a SEND (one key space with the messages: a key
//! that names an earlier request of another kind or target is
//! `KeyReused`), and reaches every member in order through
//! pull, sync, history and push. The log stays append-only.
//!
//! The rules, checked when the change is submitted, under the group's
//! `assign` lock (after the retransmit lookup: a retransmit of an accepted
//! recall gets the original's answer, not "recalled already"):
//! - the target is a stored message (kind 0, `floor <= target <= head`,
//!   the visible head: a message whose round is not applied yet is not
//!   there; the node starts a change only once the SENDs before it on its
//!   connection are answered, format-spec/protocol.md 1.4), else
//!   `NoSuchMessage`;
//! - it was not recalled, else `Recalled`;
//! - the requester is its sender, or the caller says it is an
//!   administrator (the node's configured admin senders), else `NotSender`;
//! - the target's timestamp is at most `Config::change_window_ms` old,
//!   for administrators too, else `WindowPassed`.
//!
//! Two changes of one message can both pass before either is applied
//! (a recall and an edit in the same round): both are stored, and the
//! latest state of the message is "recalled" whatever their order (a
//! recall is final). Unread stays exact because quiet ids are a set
//! (`logs/changes.rs`).
//!
//! Costs: one read of the target record (a page of one record: the sparse
//! index's seek) besides a SEND's.

use crate::commit::dedup::Keyed;
use crate::engine::{AppendRequest, Appended, Engine, Ticket};
use crate::error::{ChangeRefusal, Error, Result};
use crate::logs::group_log::{Chunk, ReadBatch};
use crate::logs::record::{
    self, KIND_EDIT, KIND_MESSAGE, KIND_RECALL, RECORD_HEADER_BYTES, TARGET_BYTES,
};

/// `flags` bit of a recalled message as a reader of protocol version 2
/// sees it (format-spec/protocol.md 2.1): its payload is withheld. Never
/// stored: the presentation sets it.
pub const FLAG_RECALLED: u8 = 1;

/// What a change does to its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change<'a> {
    /// Replaces the message's payload with this one.
    Edit(&'a [u8]),
    /// Recalls the message (deleted for everyone; its payload is erased).
    Recall,
}

/// An edit or a recall of message `target` of `group_id`.
#[derive(Clone, Copy, Debug)]
pub struct ChangeRequest<'a> {
    pub group_id: u64,
    /// Who asks; the new record's `sender_id`.
    pub sender_id: u64,
    /// The requester's idempotence key, as a SEND's.
    pub client_msg_id: u64,
    pub target: u64,
    pub change: Change<'a>,
    /// The requester is an administrator: may change anyone's message.
    pub admin: bool,
}

impl Engine {
    /// Appends an edit or a recall and waits until it is acknowledged
    /// under the fsync policy (as [`Engine::append`]). A retransmit returns
    /// the original's id.
    pub fn change(&self, req: &ChangeRequest<'_>) -> Result<Appended> {
        let ticket = self.blocking(|| self.submit_change(req, true))?;
        self.wait(ticket)
    }

    /// [`Engine::change`] that never waits: `Overloaded` when the pending
    /// round is full, `NotReady` when the group's send path or the
    /// target's segment index needs the disk first.
    pub fn try_submit_change(&self, req: &ChangeRequest<'_>) -> Result<Ticket> {
        self.submit_change(req, false)
    }

    fn submit_change(&self, req: &ChangeRequest<'_>, wait_for_room: bool) -> Result<Ticket> {
        let (keyed, extra) = match req.change {
            Change::Edit(p) => (Keyed::Edit { target: req.target }, p),
            Change::Recall => (Keyed::Recall { target: req.target }, &[][..]),
        };
        let max = self.shared.ctx.config.payload_bytes_max;
        if extra.len() + TARGET_BYTES > max {
            return Err(Error::PayloadTooLarge {
                len: extra.len(),
                max: max.saturating_sub(TARGET_BYTES),
            });
        }
        self.check_writable()?;
        let mut payload = Vec::with_capacity(TARGET_BYTES + extra.len());
        payload.extend_from_slice(&req.target.to_le_bytes());
        payload.extend_from_slice(extra);
        let append = AppendRequest {
            group_id: req.group_id,
            sender_id: req.sender_id,
            client_msg_id: req.client_msg_id,
            payload: &payload,
        };
        let group = self.try_group(req.group_id)?;
        let mut slot = group.assign.lock();
        let assign = self.ready_to_assign(&group, &mut slot)?;
        if let Some(dup) = self.duplicate_of(assign, &append, keyed)? {
            return Ok(dup);
        }
        self.check_change(req)?;
        let mut p = self.lock_pending(wait_for_room, true)?;
        let ticket = self.assign_one(&group, assign, &append, keyed, &mut p);
        drop(p);
        drop(slot);
        self.shared.pending_cv.notify_all();
        self.fit_dedup_budget(req.group_id);
        Ok(ticket)
    }

    /// The rules of the module docs. The caller holds the group's `assign`
    /// lock (so its send state, and with it its loaded log, stays).
    fn check_change(&self, req: &ChangeRequest<'_>) -> Result<()> {
        let refused = |why| Error::ChangeRefused {
            group: req.group_id,
            target: req.target,
            why,
        };
        let group = self.group(req.group_id)?;
        if req.target == 0 || req.target > group.head() {
            return Err(refused(ChangeRefusal::NoSuchMessage));
        }
        let batch = self.try_read(req.group_id, req.target - 1, 1, 1)?;
        let Some(chunk) = batch.chunks.first() else {
            return Err(refused(ChangeRefusal::NoSuchMessage));
        };
        let bytes = chunk.bytes();
        // Verified when read; a short or foreign record is not the target
        // (below the floor, the first stored record comes back instead).
        let h = record::decode_header(bytes, record::RECORD_BYTES_STORED_MAX).map_err(|e| {
            Error::GroupDamaged {
                group: req.group_id,
                reason: format!("record {}: {e}", req.target),
            }
        })?;
        if h.msg_id != req.target || h.kind != KIND_MESSAGE {
            return Err(refused(ChangeRefusal::NoSuchMessage));
        }
        if group.is_quiet(req.target) {
            return Err(refused(ChangeRefusal::Recalled));
        }
        if h.sender_id != req.sender_id && !req.admin {
            return Err(refused(ChangeRefusal::NotSender));
        }
        let window = self.shared.ctx.config.change_window_ms;
        if crate::clock::now_ms().saturating_sub(h.timestamp_ms) > window {
            return Err(refused(ChangeRefusal::WindowPassed));
        }
        Ok(())
    }
}

impl Engine {
    /// `batch` (records of `group_id`, as a read returned them) as a
    /// reader sees them (format-spec/protocol.md 2.1 and 7). With
    /// `kinds` (protocol version 2) a recalled message is shown with the
    /// `recalled` flag and an empty payload, every other record as stored.
    /// Without (version 1), in addition every record of another kind than
    /// a message becomes a message with the same id, timestamp, sender and
    /// `client_msg_id` and an empty payload, so a version 1 reader still
    /// gets ascending ids without a gap and never meets a kind it does not
    /// know. A shown record's CRC is recomputed over what is shown.
    ///
    /// Costs: nothing for a version 2 reader of a group without quiet ids;
    /// otherwise one header read per record, and a copy of the 44-byte
    /// header of each record shown otherwise (the others stay slices of
    /// the mapping).
    pub fn present(&self, group_id: u64, batch: ReadBatch, kinds: bool) -> ReadBatch {
        let first = batch.last_id + 1 - batch.count.min(batch.last_id);
        // The group's lookup never reads the disk (the event loop calls
        // this after a read of the group, which looked it up).
        let quiet = match self.try_group(group_id) {
            Ok(g) if batch.count > 0 => g.quiet_between(first, batch.last_id),
            _ => Vec::new(),
        };
        if kinds && quiet.is_empty() {
            return batch;
        }
        let Ok((chunks, _)) = substitute::<std::convert::Infallible>(batch.chunks, |rec| {
            let kind = record::peek_kind(rec);
            // A stored erased record is a recalled message whose recall is
            // in `quiet` (it is trimmed only below the floor, where no read
            // goes); the flag is checked too so that its zeros are never
            // served as a payload.
            let recalled = kind == KIND_MESSAGE
                && (record::peek_erased(rec)
                    || quiet.binary_search(&record::peek_msg_id(rec)).is_ok());
            Ok(if recalled || (!kinds && kind != KIND_MESSAGE) {
                let flags = if recalled && kinds { FLAG_RECALLED } else { 0 };
                Shown::As(shown_empty(rec, flags))
            } else {
                Shown::Stored
            })
        });
        let bytes = chunks.iter().map(|c| c.bytes().len()).sum();
        ReadBatch {
            chunks,
            bytes,
            ..batch
        }
    }
}

/// What a read shows of one stored record ([`substitute`]).
enum Shown {
    /// The stored bytes.
    Stored,
    /// These bytes instead.
    As(Vec<u8>),
    /// Nothing.
    Left,
}

/// The chunks of a read with each record shown as `show` says: the
/// stored records kept stay slices of their chunks (no copy; a run of
/// them is one slice), each substitute is a chunk of its own. Returns the
/// chunks and the number of records shown (stored or substituted). The
/// one walk of `present` and `try_history_latest`; `show` sees every
/// whole record in order, and its error ends the walk.
fn substitute<E>(
    chunks: Vec<Chunk>,
    mut show: impl FnMut(&[u8]) -> std::result::Result<Shown, E>,
) -> std::result::Result<(Vec<Chunk>, u64), E> {
    let mut out = Vec::with_capacity(chunks.len());
    let mut count = 0;
    for chunk in chunks {
        let buf = chunk.bytes();
        let (mut pos, mut kept_from) = (0, 0);
        while let Some(len) = record::peek_len(&buf[pos..])
            .filter(|&l| l >= RECORD_HEADER_BYTES && pos + l <= buf.len())
        {
            let shown = show(&buf[pos..pos + len])?;
            if !matches!(shown, Shown::Left) {
                count += 1;
            }
            if !matches!(shown, Shown::Stored) {
                if pos > kept_from {
                    out.push(chunk.sub(kept_from, pos));
                }
                if let Shown::As(bytes) = shown {
                    out.push(Chunk::copied(bytes));
                }
                kept_from = pos + len;
            }
            pos += len;
        }
        if kept_from == 0 {
            out.push(chunk);
        } else if kept_from < buf.len() {
            out.push(chunk.sub(kept_from, buf.len()));
        }
    }
    Ok((out, count))
}

/// A record shown as a message (kind 0) with `flags` and an empty
/// payload: its header's ids, timestamp and sender, its CRC recomputed.
fn shown_empty(rec: &[u8], flags: u8) -> Vec<u8> {
    shown_with(rec, flags, &[])
}

/// `flags` bit of a message shown in its latest state with its newest
/// edit's payload (HISTORY_LATEST, protocol.md 4.30). Never stored.
pub const FLAG_EDITED: u8 = 2;

/// The most reads of a group's log one HISTORY_LATEST page makes
/// (`Engine::try_history_latest`): the bound on its cost when the Edit and
/// Recall records it leaves out are many and large.
pub const LATEST_READS_MAX: usize = 16;

/// A page of [`Engine::try_history_latest`].
pub struct LatestPage {
    /// The page's messages in their latest state, oldest first (Edit and
    /// Recall records left out).
    pub history: crate::History,
    /// Where the next (older) page starts: the oldest id this page covered
    /// (edits and recalls included), for `before_msg_id`.
    pub next_before: u64,
}

impl Engine {
    /// [`Engine::try_history_latest`], waiting for the disk when it must.
    pub fn history_latest(
        &self,
        group_id: u64,
        user: u64,
        before_msg_id: Option<u64>,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<LatestPage> {
        self.blocking(|| {
            self.try_history_latest(group_id, user, before_msg_id, max_count, max_bytes)
        })
    }

    /// HISTORY's page (`Engine::try_history`) with every message in its
    /// latest state (protocol.md 4.30): a recalled message with the
    /// `recalled` flag and no payload, an edited one with the `edited` flag
    /// and its newest edit's payload (same id, timestamp, sender and
    /// `client_msg_id`), the Edit and Recall records themselves left out,
    /// so a new device needs no replay of the changes.
    ///
    /// `max_bytes` bounds the bytes **shown**: the Edit and Recall records
    /// left out do not use it. A read cut by the bytes that left some out
    /// is followed by a read of the older ids with what is left of the
    /// budget and of `max_count`, at most [`LATEST_READS_MAX`] reads in
    /// all (so a page of a group with many large edits costs a bounded
    /// amount, and may be shorter than the budget: `next_before` goes on).
    ///
    /// Costs: those reads, plus one read of the newest edit of each edited
    /// message of the page (a binary search in the group's latest edits,
    /// then the index's seek); `NotReady` if a read needs a sealed
    /// segment's index.
    pub fn try_history_latest(
        &self,
        group_id: u64,
        user: u64,
        before_msg_id: Option<u64>,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<LatestPage> {
        let group = self.try_group(group_id)?;
        let mut before = before_msg_id;
        let (mut ids_left, mut shown_bytes) = (max_count, 0usize);
        // Oldest page first: each read's chunks go before the newer ones.
        let mut pages: Vec<(Vec<Chunk>, u64)> = Vec::new();
        let mut next_before = before_msg_id.unwrap_or(group.head() + 1);
        let mut last_read = None;
        // The newest read's `last_id` and `has_more`: the page's.
        let mut newest = None;
        for _ in 0..LATEST_READS_MAX {
            let left = max_bytes.saturating_sub(shown_bytes).max(1);
            let mut h = self.try_history(group_id, user, before, ids_left, left)?;
            let batch = std::mem::take(&mut h.batch);
            let covered = batch.count;
            let (last_id, has_more) = (batch.last_id, batch.has_more);
            let (chunks, count, bytes) = self.latest_state(&group, batch)?;
            // A read after the first that would pass the budget (a read
            // returns at least one record, and an edited message may show
            // more bytes than it stores) is not taken: the page ends
            // before it, and the next page starts there.
            if last_read.is_some() && shown_bytes + bytes > max_bytes {
                break;
            }
            newest.get_or_insert((last_id, has_more));
            if covered > 0 {
                // The oldest id this read covered (ids are dense).
                next_before = last_id + 1 - covered.min(last_id);
            }
            shown_bytes += bytes;
            ids_left = ids_left.saturating_sub(usize::try_from(covered).unwrap_or(usize::MAX));
            pages.push((chunks, count));
            let more = covered > 0 && !h.complete && ids_left > 0 && shown_bytes < max_bytes;
            before = Some(next_before);
            last_read = Some(h);
            if !more {
                break;
            }
        }
        // Invariant: the loop runs at least once.
        let mut h = last_read.expect("invariant: one read at least");
        let (last_id, has_more) = newest.unwrap_or((0, false));
        let mut chunks = Vec::new();
        let mut count = 0;
        for (c, n) in pages.into_iter().rev() {
            chunks.extend(c);
            count += n;
        }
        h.batch = ReadBatch {
            chunks,
            count,
            bytes: shown_bytes,
            last_id,
            has_more,
        };
        Ok(LatestPage {
            history: h,
            next_before,
        })
    }

    /// The records of one read of a group (ascending ids) in their latest
    /// state: the shown chunks, how many records they hold, their bytes.
    fn latest_state(
        &self,
        group: &crate::group::Group,
        batch: ReadBatch,
    ) -> Result<(Vec<Chunk>, u64, usize)> {
        if batch.count == 0 {
            return Ok((Vec::new(), 0, 0));
        }
        let first = batch.last_id + 1 - batch.count.min(batch.last_id);
        let quiet = group.quiet_between(first, batch.last_id);
        let (chunks, count) = substitute(batch.chunks, |rec| {
            let (id, kind) = (record::peek_msg_id(rec), record::peek_kind(rec));
            if kind == KIND_EDIT || kind == KIND_RECALL {
                return Ok(Shown::Left);
            }
            if kind != KIND_MESSAGE {
                return Ok(Shown::Stored);
            }
            if record::peek_erased(rec) || quiet.binary_search(&id).is_ok() {
                return Ok(Shown::As(shown_empty(rec, FLAG_RECALLED)));
            }
            let Some(e) = group.latest_edit(id) else {
                return Ok(Shown::Stored);
            };
            let edit = self.try_read(group.id, e - 1, 1, 1)?;
            let bytes = edit.chunks.first().map(|c| c.bytes()).unwrap_or(&[]);
            let new = (record::peek_msg_id(bytes) == e)
                .then(|| bytes.get(RECORD_HEADER_BYTES + TARGET_BYTES..))
                .flatten()
                .ok_or_else(|| Error::GroupDamaged {
                    group: group.id,
                    reason: format!("the edit {e} of message {id} is not readable"),
                })?;
            Ok(Shown::As(shown_with(rec, FLAG_EDITED, new)))
        })?;
        let bytes = chunks.iter().map(|c| c.bytes().len()).sum();
        Ok((chunks, count, bytes))
    }
}

/// A record shown as a message with `flags` and `payload` in place of its
/// own: its header's ids, timestamp and sender, its CRC recomputed.
pub(crate) fn shown_with(rec: &[u8], flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
    out.extend_from_slice(&rec[..RECORD_HEADER_BYTES]);
    out.extend_from_slice(payload);
    // Invariant: the payload is a stored record's (below 1 GiB).
    let len = u32::try_from(out.len()).expect("invariant: a stored record's size");
    out[..4].copy_from_slice(&len.to_le_bytes());
    out[40] = KIND_MESSAGE;
    out[41] = flags;
    let crc = crc32fast::hash(&out[8..]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
    out
}
