//! Reading and acknowledging: PULL (and its long poll's re-run), ACK,
//! BATCH_ACK, UNREAD, SYNC, HISTORY, HISTORY_LATEST, READ_COUNT and
//! READERS. The ACK paths report the cursors they move in watched groups
//! to the node's receipts.

use std::time::Duration;

use tidemark_engine::{Chunk, Engine, Error as EngineError, ReadBatch, Unread};

use crate::config::Limits;
use crate::handlers::action::{Action, LongPoll};
use crate::handlers::context::Ctx;
use crate::handlers::membership::members_page_max;
use crate::outgoing::{
    engine_error, error, error_code_of, records_budget, records_len, reply, Outgoing,
};
use tidemark_protocol::{
    AckItem, BatchAckResult, ErrorCode, MemberEntry, RecordsLen, Response, SyncGroup, UnreadEntry,
    MEMBER_ENTRY_BYTES, READERS_RESPONSE_FIXED_BYTES, RECORDS_RESPONSE_OVERHEAD_BYTES,
    SYNC_GROUP_BYTES,
};

/// PULL (4.10): answered at once, or a long poll when it found nothing and
/// may wait.
// One argument per field of the request.
#[allow(clippy::too_many_arguments)]
pub fn pull(
    ctx: &mut Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    ack_up_to: u64,
    max_count: u32,
    max_bytes: u32,
    wait_ms: u32,
) -> Result<Action, EngineError> {
    let ack = (ack_up_to > 0).then_some(ack_up_to);
    let max_bytes = (max_bytes as usize).min(records_budget(ctx.limits));
    let before = ack.and_then(|_| ctx.cursor_before(group, user));
    let pull = ctx
        .engine
        .try_pull(group, user, max_count as usize, max_bytes, ack);
    if before.is_some() {
        // Also after a refusal: a pull that must wait for an index applied
        // its ACK first, and its re-run finds the cursor moved already.
        if let Ok(after) = ctx.engine.try_cursor(group, user) {
            ctx.report_move(group, user, before, after);
        }
    }
    let pull = pull?;
    if pull.batch.count == 0 && wait_ms > 0 && max_count > 0 {
        let wait = Duration::from_millis(wait_ms.min(ctx.limits.long_poll_ms_max) as u64);
        // Invariant: max_bytes was clamped below frame_bytes_max (u32).
        return Ok(Action::Wait(LongPoll {
            group,
            user,
            max_count,
            max_bytes: max_bytes as u32,
            wait,
            version: ctx.version,
        }));
    }
    Ok(Action::Answer(pull_reply(
        ctx.engine,
        ctx.version,
        request_id,
        group,
        pull,
    )))
}

impl LongPoll {
    /// The pull run again: the response when there is something to answer
    /// (records, or an error), or when `deadline_passed` (then with what is
    /// there, usually nothing); `None` while it should keep waiting. The one
    /// path of both a wake-up and an expiry.
    pub fn answer(
        &self,
        engine: &Engine,
        request_id: u64,
        deadline_passed: bool,
    ) -> Option<Outgoing> {
        let pull = engine.try_pull(
            self.group,
            self.user,
            self.max_count as usize,
            self.max_bytes as usize,
            None,
        );
        // A long poll was parked after a pull of its group ran, so the group
        // is loaded and new records are indexed: NotReady is not expected on
        // a wake-up; if it came, the poll keeps waiting.
        let nothing_yet = match &pull {
            Ok(p) => p.batch.count == 0,
            Err(e) => matches!(e, EngineError::NotReady { .. }),
        };
        if nothing_yet && !deadline_passed {
            return None;
        }
        Some(match pull {
            Ok(p) => pull_reply(engine, self.version, request_id, self.group, p),
            Err(e) => engine_error(request_id, &e),
        })
    }
}

/// A PULL's response, its records shown for protocol `version`.
pub fn pull_reply(
    engine: &Engine,
    version: u8,
    request_id: u64,
    group: u64,
    mut pull: tidemark_engine::Pull,
) -> Outgoing {
    pull.batch = engine.present(group, pull.batch, version >= 2);
    let resp = Response::Pull {
        cursor: pull.cursor,
        head: pull.head,
        has_more: pull.batch.has_more,
        records: records_len(&pull.batch),
    };
    let records = pull.batch.count;
    reply(request_id, &resp, pull.batch.chunks, records)
}

/// ACK (4.11).
pub fn ack(
    ctx: &mut Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    msg_id: u64,
) -> Result<Outgoing, EngineError> {
    let ack = ctx.engine.try_ack_move(group, user, msg_id)?;
    if ack.moved {
        // One hash lookup when nobody watches the group.
        ctx.receipts.moved(ctx.engine, group, user, ack.cursor);
    }
    let cursor = ack.cursor;
    Ok(reply(request_id, &Response::Ack { cursor }, Vec::new(), 0))
}

/// BATCH_ACK (4.12): each item's outcome; refused whole, before any item is
/// applied, when its response could not be sent.
pub fn batch_ack(
    ctx: &mut Ctx<'_>,
    request_id: u64,
    user: u64,
    items: &[AckItem],
) -> Result<Outgoing, EngineError> {
    // The response is 2 bytes per item longer than the request.
    let max = batch_ack_items_max(ctx.limits);
    if items.len() > max {
        return Ok(error(
            request_id,
            ErrorCode::LimitExceeded,
            Some(max as u64),
            &format!(
                "{} BATCH_ACK items: the response would exceed frame_bytes_max; \
                 at most {max} items per request, nothing was applied",
                items.len()
            ),
        ));
    }
    let pairs: Vec<(u64, u64)> = items.iter().map(|i| (i.group, i.msg_id)).collect();
    // The cursors watched groups start from (a group may appear twice: the
    // first item's is the start).
    let mut before: Vec<(u64, u64)> = Vec::new();
    for &(g, _) in &pairs {
        if !before.iter().any(|&(b, _)| b == g) {
            if let Some(c) = ctx.cursor_before(g, user) {
                before.push((g, c));
            }
        }
    }
    // Each outcome carries the cursor as it stood right after its item,
    // found by one membership lookup (never a walk of the user's groups):
    // the cost is bounded by the request's size. While the saved state
    // loads, the whole batch waits (`NotReady`, nothing applied) until
    // every group it names is looked up, then runs again from the start.
    let outcomes = ctx.engine.try_batch_ack(user, &pairs)?;
    for &(g, start) in &before {
        // Cursors only move forward: the last item of the group left the
        // highest.
        let last = pairs
            .iter()
            .zip(&outcomes)
            .filter(|((pg, _), o)| *pg == g && o.error.is_none())
            .map(|(_, o)| o.cursor)
            .max();
        if let Some(after) = last {
            ctx.report_move(g, user, Some(start), after);
        }
    }
    let results = outcomes
        .into_iter()
        .zip(items)
        .map(|(r, item)| BatchAckResult {
            group: item.group,
            error: r.error.as_ref().map(|err| error_code_of(err).0),
            cursor: r.cursor,
        })
        .collect();
    Ok(reply(
        request_id,
        &Response::BatchAck(results),
        Vec::new(),
        0,
    ))
}

/// The most items a BATCH_ACK may hold so that its response (16 bytes of
/// frame header, a 4-byte count, 18 bytes per item) fits `frame_bytes_max`
/// with its 4-byte length prefix, as every frame must.
pub fn batch_ack_items_max(limits: &Limits) -> usize {
    (limits.frame_bytes_max as usize).saturating_sub(BATCH_ACK_RESPONSE_FIXED_BYTES)
        / BATCH_ACK_RESULT_BYTES
}

/// Bytes of a BATCH_ACK response counted by `frame_len` besides its items:
/// the 12 header bytes after the length prefix and the list count.
const BATCH_ACK_RESPONSE_FIXED_BYTES: usize = 12 + 4;
/// Bytes of one BATCH_ACK result (group, status, cursor).
const BATCH_ACK_RESULT_BYTES: usize = 18;

/// A group's counts as UNREAD and SYNC list them.
fn unread_entry(u: &Unread) -> UnreadEntry {
    UnreadEntry {
        group: u.group_id,
        head: u.head,
        cursor: u.cursor,
        unread: u.unread,
    }
}

/// UNREAD (4.13).
pub fn unread(ctx: &Ctx<'_>, request_id: u64, user: u64) -> Result<Outgoing, EngineError> {
    let list = ctx
        .engine
        .try_unread(user)?
        .into_iter()
        .map(|u| unread_entry(&u))
        .collect();
    Ok(reply(request_id, &Response::Unread(list), Vec::new(), 0))
}

/// SYNC (4.14).
pub fn sync(
    ctx: &Ctx<'_>,
    request_id: u64,
    user: u64,
    per_group_max: u32,
    total_max_bytes: u32,
    continuation: u64,
) -> Result<Outgoing, EngineError> {
    // The group entries take SYNC_GROUP_BYTES each; the records get what is
    // left of the frame.
    // The groups SYNC lists: records above the cursor (4.14).
    let groups = ctx
        .engine
        .try_unread(user)?
        .iter()
        .filter(|u| u.head > u.cursor)
        .count();
    let fixed = RECORDS_RESPONSE_OVERHEAD_BYTES as usize + SYNC_GROUP_BYTES * groups;
    let budget =
        (total_max_bytes as usize).min((ctx.limits.frame_bytes_max as usize).saturating_sub(fixed));
    let after = continuation.checked_sub(1);
    let s = ctx
        .engine
        .try_sync(user, per_group_max as usize, budget.max(1), after)?;
    let mut chunks = Vec::new();
    let mut records = 0;
    let list = s
        .groups
        .into_iter()
        .map(|g| {
            let batch = ctx
                .engine
                .present(g.unread.group_id, g.batch, ctx.version >= 2);
            let section = records_len(&batch);
            records += batch.count;
            chunks.extend(batch.chunks);
            SyncGroup {
                entry: unread_entry(&g.unread),
                records: section,
            }
        })
        .collect();
    let next_continuation = s.continue_after.map_or(0, |g| g.saturating_add(1));
    Ok(reply(
        request_id,
        &Response::Sync {
            next_continuation,
            groups: list,
        },
        chunks,
        records,
    ))
}

/// HISTORY (4.15).
pub fn history(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    before_msg_id: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let before = (before_msg_id > 0).then_some(before_msg_id);
    // The engine stops reading at the frame's budget.
    let budget = records_budget(ctx.limits);
    let mut h = ctx
        .engine
        .try_history(group, user, before, max_count as usize, budget)?;
    h.batch = ctx.engine.present(group, h.batch, ctx.version >= 2);
    history_reply(request_id, group, h, budget)
}

/// HISTORY_LATEST (4.30, version 2): HISTORY's page with each message in
/// its latest state (`Engine::try_history_latest`), newest first, cut to
/// the frame as HISTORY's; `next_before` is the oldest id the records sent
/// cover (the page's start when all were sent).
pub fn history_latest(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    user: u64,
    before_msg_id: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let before = (before_msg_id > 0).then_some(before_msg_id);
    let budget = records_budget(ctx.limits);
    let page = ctx
        .engine
        .try_history_latest(group, user, before, max_count as usize, budget)?;
    let (records, bytes, truncated) = newest_first(group, &page.history.batch, budget)?;
    let next_before = match records.last() {
        Some(oldest) if truncated => peek_msg_id(oldest.bytes()),
        _ => page.next_before,
    };
    let resp = Response::HistoryLatest {
        has_more: truncated || !page.history.complete,
        next_before,
        // Invariant: bounded by the frame budget.
        records: RecordsLen {
            count: records.len() as u32,
            bytes: bytes as u32,
        },
    };
    let n = records.len() as u64;
    Ok(reply(request_id, &resp, records, n))
}

/// HISTORY answers newest first: the page's records are sent in reverse,
/// one iovec each, dropping the oldest ones that do not fit the frame.
fn history_reply(
    request_id: u64,
    group: u64,
    h: tidemark_engine::History,
    budget: usize,
) -> Result<Outgoing, EngineError> {
    let (records, bytes, truncated) = newest_first(group, &h.batch, budget)?;
    let keep = records.len();
    let resp = Response::History {
        has_more: truncated || !h.complete,
        // Invariant: bounded by the frame budget.
        records: RecordsLen {
            count: keep as u32,
            bytes: bytes as u32,
        },
    };
    Ok(reply(request_id, &resp, records, keep as u64))
}

/// A page's records newest first, one chunk each, dropping the oldest that
/// do not fit `budget` (the newest always goes): the records, their bytes,
/// and whether some were dropped.
fn newest_first(
    group: u64,
    batch: &ReadBatch,
    budget: usize,
) -> Result<(Vec<Chunk>, usize, bool), EngineError> {
    let mut records: Vec<Chunk> = Vec::new();
    for c in &batch.chunks {
        records.extend(c.split_records(group)?);
    }
    records.reverse();
    let mut bytes = 0;
    let mut keep = 0;
    for r in &records {
        if keep > 0 && bytes + r.bytes().len() > budget {
            break;
        }
        bytes += r.bytes().len();
        keep += 1;
    }
    let truncated = keep < records.len();
    records.truncate(keep);
    Ok((records, bytes, truncated))
}

/// The `msg_id` of a whole record (offset 8).
fn peek_msg_id(record: &[u8]) -> u64 {
    record
        .get(8..16)
        .and_then(|b| b.first_chunk::<8>())
        .map_or(0, |b| u64::from_le_bytes(*b))
}

/// READ_COUNT (4.16).
pub fn read_count(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    msg_id: u64,
) -> Result<Outgoing, EngineError> {
    let count = ctx.engine.try_read_count(group, msg_id)? as u64;
    Ok(reply(
        request_id,
        &Response::ReadCount { count },
        Vec::new(),
        0,
    ))
}

/// READERS (4.21): the members at or above `msg_id` among at most
/// [`members_page_max`] members examined above `after_user`, at most
/// `max_count` listed. The work is bounded by the page limit whatever the
/// group's size or how few members have read the message;
/// `next_after_user` continues where the examination stopped.
pub fn readers(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    msg_id: u64,
    after_user: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let fit = (ctx.limits.frame_bytes_max as usize).saturating_sub(READERS_RESPONSE_FIXED_BYTES)
        / MEMBER_ENTRY_BYTES;
    // At least one, so that a page always makes progress or ends.
    let list_max = (max_count as usize).clamp(1, fit.max(1));
    let examine = members_page_max(ctx.limits);
    let page = ctx.engine.try_members_page(group, after_user, examine)?;
    let mut readers = Vec::new();
    let mut last_examined = after_user;
    let mut stopped_early = false;
    for &(user, cursor) in &page.members {
        if cursor >= msg_id {
            if readers.len() == list_max {
                // The list is full: the next page starts at this member.
                stopped_early = true;
                break;
            }
            readers.push(MemberEntry { user, cursor });
        }
        last_examined = user;
    }
    let next_after_user = if stopped_early || page.has_more {
        last_examined
    } else {
        0
    };
    Ok(reply(
        request_id,
        &Response::Readers {
            next_after_user,
            readers,
        },
        Vec::new(),
        0,
    ))
}
