//! Groups and their members: CREATE_GROUP, DELETE_GROUP, JOIN and LEAVE
//! (parked until their commit round settles), MEMBERS and GROUP_INFO.

use tidemark_engine::{Error as EngineError, JoinStart as EngineJoinStart};

use crate::config::Limits;
use crate::handlers::action::{Action, OpKind, Parked};
use crate::handlers::context::Ctx;
use crate::outgoing::{reply, Outgoing};
use tidemark_protocol::{
    GroupInfo, JoinStart, MemberEntry, Response, RetentionPolicy, MEMBERS_RESPONSE_FIXED_BYTES,
    MEMBER_ENTRY_BYTES,
};

/// CREATE_GROUP (4.5): parked until its round commits.
pub fn create_group(ctx: &Ctx<'_>, group: u64) -> Result<Action, EngineError> {
    let ticket = ctx.engine.try_submit_create_group(group)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::CreateGroup)))
}

/// DELETE_GROUP (4.6): parked until its round commits.
pub fn delete_group(ctx: &Ctx<'_>, group: u64) -> Result<Action, EngineError> {
    let ticket = ctx.engine.try_submit_delete_group(group)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::DeleteGroup)))
}

/// JOIN (4.7): parked until its round commits.
pub fn join(ctx: &Ctx<'_>, group: u64, user: u64, start: JoinStart) -> Result<Action, EngineError> {
    let e = ctx.engine;
    let start = match start {
        JoinStart::Head => EngineJoinStart::Head,
        JoinStart::Earliest => EngineJoinStart::Earliest,
        JoinStart::At(cursor) => {
            let head = e.try_head(group)?;
            if cursor > head {
                return Err(EngineError::CursorAboveHead {
                    group,
                    requested: cursor,
                    head,
                });
            }
            // The wire names the cursor; the engine the first unread id.
            EngineJoinStart::At(cursor + 1)
        }
    };
    let ticket = e.try_submit_join(group, user, start)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::Join { group })))
}

/// LEAVE (4.8): parked until its round commits.
pub fn leave(ctx: &Ctx<'_>, group: u64, user: u64) -> Result<Action, EngineError> {
    let ticket = ctx.engine.try_submit_leave(group, user)?;
    Ok(Action::Park(Parked::Op(ticket, OpKind::Leave)))
}

/// The most members a MEMBERS response lists: `members_page_max`, and
/// no more than fit `frame_bytes_max` (with the length prefix, as every
/// frame).
pub fn members_page_max(limits: &Limits) -> usize {
    let fit = (limits.frame_bytes_max as usize).saturating_sub(MEMBERS_RESPONSE_FIXED_BYTES)
        / MEMBER_ENTRY_BYTES;
    limits.members_page_max.min(fit)
}

/// MEMBERS (4.19): a page of the group's members with their cursors, by
/// user id; `max_count` clamped to [`members_page_max`]. The work is the
/// page's (`Engine::members_page`), not the group's.
pub fn members(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    after_user: u64,
    max_count: u32,
) -> Result<Outgoing, EngineError> {
    let max = (max_count as usize).min(members_page_max(ctx.limits));
    let page = ctx.engine.try_members_page(group, after_user, max)?;
    let members = page
        .members
        .iter()
        .map(|&(user, cursor)| MemberEntry { user, cursor })
        .collect();
    Ok(reply(
        request_id,
        &Response::Members {
            has_more: page.has_more,
            members,
        },
        Vec::new(),
        0,
    ))
}

/// GROUP_INFO (4.20): head, retention floor, member count and policy.
pub fn group_info(ctx: &Ctx<'_>, request_id: u64, group: u64) -> Result<Outgoing, EngineError> {
    let g = ctx.engine.try_group_info(group)?;
    let resp = Response::GroupInfo(GroupInfo {
        head: g.head,
        floor: g.floor,
        member_count: g.members as u64,
        retention: RetentionPolicy {
            by_cursor: g.retention.by_cursor,
            max_age_ms: g.retention.max_age_ms,
            max_bytes: g.retention.max_bytes,
        },
    });
    Ok(reply(request_id, &resp, Vec::new(), 0))
}
