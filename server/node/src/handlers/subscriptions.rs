//! Subscriptions and the frames they bring: SUBSCRIBE, SUBSCRIBE_RECEIPTS
//! and UNSUBSCRIBE (checked here, held by the connection), PUSH and
//! RESYNC.

use tidemark_engine::{Error as EngineError, ReadBatch};

use crate::handlers::context::Ctx;
use crate::outgoing::{error, records_len, reply, Outgoing};
use tidemark_protocol::{ErrorCode, RecordsLen, Response, ResyncScope, Subscription};

/// UNSUBSCRIBE (4.18)'s response (the connection drops its subscriptions).
pub fn unsubscribed(request_id: u64) -> Outgoing {
    reply(request_id, &Response::Unsubscribe, Vec::new(), 0)
}

/// SUBSCRIBE (4.17)'s response, or its refusal: `held` entries are held by
/// the connection already, and a GROUPS subscription names existing groups
/// only. The connection adds the entries when this is `Ok(Ok(_))`; the
/// outer `Err` is the engine's `NotReady` while a group is looked up in
/// the saved state still loading (the connection parks the request).
pub fn subscribe(
    ctx: &Ctx<'_>,
    request_id: u64,
    held: usize,
    sub: &Subscription,
) -> Result<Result<Outgoing, Outgoing>, EngineError> {
    let max = ctx.limits.subscriptions_max;
    let adding = match sub {
        Subscription::User(_) => 1,
        Subscription::Groups(g) => g.len(),
    };
    if held + adding > max {
        return Ok(Err(error(
            request_id,
            ErrorCode::LimitExceeded,
            Some(max as u64),
            "too many subscriptions",
        )));
    }
    if let Subscription::Groups(groups) = sub {
        if let Some(missing) = ctx.engine.try_missing_group(groups)? {
            return Ok(Err(not_found(request_id, missing)));
        }
    }
    Ok(Ok(reply(request_id, &Response::Subscribe, Vec::new(), 0)))
}

/// A subscription's refusal: `group` does not exist.
fn not_found(request_id: u64, group: u64) -> Outgoing {
    error(
        request_id,
        ErrorCode::GroupNotFound,
        None,
        &format!("group {group} not found"),
    )
}

/// SUBSCRIBE_RECEIPTS (4.22)'s response, or its refusal: as SUBSCRIBE's,
/// `held` counting every subscription of the connection and each group
/// one more; the groups must exist. The connection adds the entries when
/// this is `Ok(Ok(_))`; the outer `Err` as SUBSCRIBE's.
pub fn subscribe_receipts(
    ctx: &Ctx<'_>,
    request_id: u64,
    held: usize,
    groups: &[u64],
) -> Result<Result<Outgoing, Outgoing>, EngineError> {
    let max = ctx.limits.subscriptions_max;
    if held + groups.len() > max {
        return Ok(Err(error(
            request_id,
            ErrorCode::LimitExceeded,
            Some(max as u64),
            "too many subscriptions",
        )));
    }
    if let Some(missing) = ctx.engine.try_missing_group(groups)? {
        return Ok(Err(not_found(request_id, missing)));
    }
    Ok(Ok(reply(
        request_id,
        &Response::SubscribeReceipts,
        Vec::new(),
        0,
    )))
}

/// PUSH (format-spec/protocol.md 5.1) of a batch of `group`'s records, read
/// within `records_budget` and shown for the subscribers' protocol version
/// (`Engine::present`).
pub fn push(group: u64, batch: ReadBatch) -> Outgoing {
    let resp = Response::Push {
        group,
        records: records_len(&batch),
    };
    reply(0, &resp, batch.chunks, batch.count)
}

/// RESYNC(all) (5.2): the subscriber's pushes stopped; it pulls to catch up.
pub fn resync_all() -> Outgoing {
    let resp: Response<'_, RecordsLen> = Response::Resync(ResyncScope::All);
    reply(0, &resp, Vec::new(), 0)
}
