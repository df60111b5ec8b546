//! The retention commands: `retention` (SET_RETENTION, a group's policy)
//! and `clear-history` (CLEAR_HISTORY, one member's history floor),
//! format-spec/protocol.md sections 4.26 and 4.27. One request each over
//! the reliable client, like the commands in `cli.rs`; `group-info` shows
//! the policy and the floor it produces.
//!
//! Ages and sizes take units (`7d`, `12h`, `1GiB`), parsed here into the
//! milliseconds and bytes the wire carries; a bare number is milliseconds
//! or bytes.

use clap::{Args, Subcommand};
use serde_json::json;

use tidemark_client::protocol::RetentionPolicy;

use super::{connect, emit, nonzero, CliError, ConnArgs};

#[derive(Subcommand, Debug)]
pub enum RetentionCommand {
    /// Set a group's retention policy (what the node may drop); without
    /// any of --by-cursor, --max-age, --max-bytes: keep everything.
    ///
    /// Dropped messages' disk space comes back within about the node's
    /// retention_check_ms plus two checkpoint intervals; `group-info`
    /// shows the floor (the oldest message still stored).
    Retention(RetentionArgs),
    /// Clear a member's history of a group up to a message, for that member
    /// only: its history, pulls and syncs start after it, and what it
    /// cleared counts as read. Other members keep reading everything.
    ClearHistory(ClearHistoryArgs),
}

#[derive(Args, Debug)]
pub struct RetentionArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// Drop messages every member acknowledged.
    #[arg(long)]
    by_cursor: bool,
    /// Drop messages older than this: a number with a unit, ms, s, m, h or
    /// d (`7d`); a bare number is milliseconds.
    #[arg(long, value_parser = crate::units::parse_ms, value_name = "AGE")]
    max_age: Option<u64>,
    /// Drop the oldest messages while the group's stored messages take
    /// more than this: a number with a unit, B, KiB, MiB or GiB (`1GiB`);
    /// a bare number is bytes.
    #[arg(long, value_parser = crate::units::parse_bytes, value_name = "SIZE")]
    max_bytes: Option<u64>,
}

#[derive(Args, Debug)]
pub struct ClearHistoryArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// The member whose history is cleared.
    #[arg(long, value_parser = nonzero)]
    user: u64,
    /// Clear up to this msg_id (inclusive); without it, everything up to
    /// the group's head.
    #[arg(long)]
    up_to: Option<u64>,
}

impl RetentionCommand {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            RetentionCommand::Retention(a) => a.conn.json,
            RetentionCommand::ClearHistory(a) => a.conn.json,
        }
    }
}

pub fn run(cmd: RetentionCommand) -> Result<(), CliError> {
    match cmd {
        RetentionCommand::Retention(a) => retention(a),
        RetentionCommand::ClearHistory(a) => clear_history(a),
    }
}

fn retention(a: RetentionArgs) -> Result<(), CliError> {
    let policy = RetentionPolicy {
        by_cursor: a.by_cursor,
        max_age_ms: a.max_age.unwrap_or(0),
        max_bytes: a.max_bytes.unwrap_or(0),
    };
    let mut c = connect(&a.conn)?;
    c.set_retention(a.group, policy)?;
    let human = if policy == RetentionPolicy::default() {
        format!(
            "group {}: retention none (every message is kept)\n",
            a.group
        )
    } else {
        format!(
            "group {}: retention set (by_cursor {}, max_age_ms {}, max_bytes {})\n",
            a.group, policy.by_cursor, policy.max_age_ms, policy.max_bytes
        )
    };
    emit(
        a.conn.json,
        human,
        json!({
            "group": a.group,
            "retention": {
                "by_cursor": policy.by_cursor,
                "max_age_ms": policy.max_age_ms,
                "max_bytes": policy.max_bytes,
            },
        }),
    )
}

fn clear_history(a: ClearHistoryArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let (join_point, cursor) = c.clear_history(a.group, a.user, a.up_to.unwrap_or(u64::MAX))?;
    emit(
        a.conn.json,
        format!(
            "user {} of group {}: history starts at {join_point}, cursor {cursor}\n",
            a.user, a.group
        ),
        json!({
            "group": a.group,
            "user": a.user,
            "join_point": join_point,
            "cursor": cursor,
        }),
    )
}
