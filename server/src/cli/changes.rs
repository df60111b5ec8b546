//! The change commands: `recall` (RECALL) and `edit` (EDIT), a message
//! recalled or edited by its sender or an admin sender of the node, within
//! the node's change window (format-spec/protocol.md 4.28, 4.29; protocol
//! version 2). One request each over the reliable client, retried with one
//! `client_msg_id` like `send`; a refusal by the rules is the node's
//! CHANGE_REFUSED with the rule it broke.

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use tidemark_client::reliable::ClientMsgIds;
use tidemark_client::Sent;

use super::{connect, emit, nonzero, payload, CliError, ConnArgs};

#[derive(Subcommand, Debug)]
pub enum ChangeCommand {
    /// Recall a message (delete it for everyone): its sender, or an admin
    /// sender of the node, within the node's change window. Members see a
    /// recall record and the message shows as recalled: its payload is
    /// never served again, at once. The node's checkpoints then erase it
    /// from every file on its disk, by the fourth checkpoint after the
    /// recall (about 4 x --checkpoint-interval-ms on a quiet node, sooner
    /// under load; format-spec/storage.md section 16, item 16).
    Recall(RecallArgs),
    /// Edit a message (its sender, or an admin sender, within the change
    /// window): members see an edit record with the new payload.
    Edit(EditArgs),
}

#[derive(Args, Debug)]
pub struct RecallArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// Who recalls it (its sender, or an admin sender of the node).
    #[arg(long, value_parser = nonzero)]
    sender: u64,
    /// The msg_id of the message to recall.
    #[arg(long, value_parser = nonzero)]
    msg_id: u64,
    /// Idempotency key; a retransmit must reuse it (default: a fresh one).
    #[arg(long)]
    client_msg_id: Option<u64>,
}

#[derive(Args, Debug)]
pub struct EditArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// Who edits it (its sender, or an admin sender of the node).
    #[arg(long, value_parser = nonzero)]
    sender: u64,
    /// The msg_id of the message to edit.
    #[arg(long, value_parser = nonzero)]
    msg_id: u64,
    /// Idempotency key; a retransmit must reuse it (default: a fresh one).
    #[arg(long)]
    client_msg_id: Option<u64>,
    /// The new payload, as `send` takes it.
    #[command(flatten)]
    payload: payload::PayloadArgs,
}

impl ChangeCommand {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            ChangeCommand::Recall(a) => a.conn.json,
            ChangeCommand::Edit(a) => a.conn.json,
        }
    }
}

pub fn run(cmd: ChangeCommand) -> Result<(), CliError> {
    match cmd {
        ChangeCommand::Recall(a) => recall(a),
        ChangeCommand::Edit(a) => edit(a),
    }
}

fn recall(a: RecallArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let id = a
        .client_msg_id
        .unwrap_or_else(|| ClientMsgIds::new().next_id());
    let sent = c.recall_with_id(a.group, a.sender, id, a.msg_id)?;
    let change = Change {
        verb: "recalled",
        record: "recall",
        group: a.group,
        sender: a.sender,
        target: a.msg_id,
        client_msg_id: id,
    };
    change.report(a.conn.json, &sent, json!({}))
}

fn edit(a: EditArgs) -> Result<(), CliError> {
    let payload = a.payload.read()?;
    let mut c = connect(&a.conn)?;
    let id = a
        .client_msg_id
        .unwrap_or_else(|| ClientMsgIds::new().next_id());
    let sent = c.edit_with_id(a.group, a.sender, id, a.msg_id, &payload)?;
    let change = Change {
        verb: "edited",
        record: "edit",
        group: a.group,
        sender: a.sender,
        target: a.msg_id,
        client_msg_id: id,
    };
    change.report(
        a.conn.json,
        &sent,
        json!({ "payload_bytes": payload.len() }),
    )
}

/// A recall or an edit the node answered, as both commands print it.
struct Change {
    /// "recalled" or "edited".
    verb: &'static str,
    /// The new record's name: "recall" or "edit".
    record: &'static str,
    group: u64,
    sender: u64,
    target: u64,
    client_msg_id: u64,
}

impl Change {
    /// One line of text, or one JSON object with `extra`'s fields added.
    fn report(&self, json_out: bool, sent: &Sent, extra: Value) -> Result<(), CliError> {
        let dup = if sent.duplicate {
            " (already stored: nothing new was stored)"
        } else {
            ""
        };
        let mut v = json!({
            "group": self.group,
            "sender": self.sender,
            "target": self.target,
            "client_msg_id": self.client_msg_id,
            "msg_id": sent.msg_id,
            "timestamp_ms": sent.timestamp_ms,
            "duplicate": sent.duplicate,
        });
        if let (Some(v), Value::Object(extra)) = (v.as_object_mut(), extra) {
            v.extend(extra);
        }
        emit(
            json_out,
            format!(
                "{} message {} of group {}: {} msg_id {}{dup}\n",
                self.verb, self.target, self.group, self.record, sent.msg_id
            ),
            v,
        )
    }
}
