//! Messages sent and changed: SEND, RECALL and EDIT, each parked until
//! its commit round settles, under the node's send policy.

use tidemark_engine::{AppendRequest, Change, ChangeRequest, Error as EngineError};

use crate::handlers::action::{Action, Parked};
use crate::handlers::context::Ctx;
use crate::outgoing::error;
use tidemark_protocol::ErrorCode;

/// SEND (4.9): parked until its round is durable. Under a members-only
/// [`SendPolicy`] a sender who is neither a member nor a system sender is
/// refused NOT_MEMBER, after the checks that come first in 4.9's order
/// (payload size, writes accepted, the group exists): one lookup of the
/// sender's membership, O(log groups of the sender), never a walk of the
/// group's members.
pub fn send(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    sender: u64,
    client_msg_id: u64,
    payload: &[u8],
) -> Result<Action, EngineError> {
    let e = ctx.engine;
    if ctx.sends.needs_membership(sender)
        && payload.len() <= e.config().payload_bytes_max
        && e.accepting_writes().is_ok()
    {
        match e.try_cursor(group, sender) {
            Ok(_) => {}
            Err(EngineError::NotMember { .. }) => {
                return Ok(Action::Answer(error(
                    request_id,
                    ErrorCode::NotMember,
                    None,
                    &format!("SEND refused: sender {sender} is not a member of group {group}"),
                )));
            }
            Err(err) => return Err(err),
        }
    }
    let ticket = ctx.engine.try_submit(&AppendRequest {
        group_id: group,
        sender_id: sender,
        client_msg_id,
        payload,
    })?;
    Ok(Action::Park(Parked::Send {
        ticket,
        group,
        sender,
    }))
}

/// RECALL (4.28) and EDIT (4.29): the rules run in the engine (CHANGE_REFUSED
/// with the rule as detail); under a members-only send policy the changer
/// must be a member or a system sender, as for SEND; the node's admin
/// senders may change anyone's message. Parked until its round settles,
/// like a SEND.
// One argument per field of the request.
#[allow(clippy::too_many_arguments)]
pub fn change(
    ctx: &Ctx<'_>,
    request_id: u64,
    group: u64,
    sender: u64,
    client_msg_id: u64,
    target: u64,
    change: Change<'_>,
) -> Result<Action, EngineError> {
    let e = ctx.engine;
    if ctx.sends.needs_membership(sender) && !ctx.sends.is_admin(sender) {
        match e.try_cursor(group, sender) {
            Ok(_) => {}
            Err(EngineError::NotMember { .. }) => {
                return Ok(Action::Answer(error(
                    request_id,
                    ErrorCode::NotMember,
                    None,
                    &format!("refused: sender {sender} is not a member of group {group}"),
                )));
            }
            Err(err) => return Err(err),
        }
    }
    let ticket = e.try_submit_change(&ChangeRequest {
        group_id: group,
        sender_id: sender,
        client_msg_id,
        target,
        change,
        admin: ctx.sends.is_admin(sender),
    })?;
    Ok(Action::Park(Parked::Change {
        ticket,
        recall: change == Change::Recall,
    }))
}
