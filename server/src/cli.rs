//! The `tidemark` client subcommands: `create-group`, `join`, `send`,
//! `pull`, `ack`, `unread`, `sync`, `history`, `members`, `group-info`,
//! `stats` against a running node, and `demo`; `ping`, `leave`, `delete-group`
//! and `tail` are in [`ops`], `recall` and `edit` in [`changes`], a send's
//! payload input (text, stdin, file) in [`payload`]. Human-readable output by default, one JSON
//! object with `--json`. Every command goes through the reliable client
//! ([`tidemark_client::reliable`]): it connects with retries for `--timeout-ms`, and
//! `send` retransmits with the same `client_msg_id` when a connection fails.
//! A failure is a [`CliError`]: one line on stderr, or with `--json` one
//! JSON object `{"error":{"code":..,"message":..}}` on stderr; either way
//! stdout gets no result and the exit status is 1. The one exception is a
//! `pull --json` that fails after it printed messages (which stay
//! unacknowledged past the last page it acknowledged): its object on stdout
//! is closed validly with that `"error"` member instead of the counts.

use std::io::Write;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

use tidemark_client::protocol::JoinStart;
use tidemark_client::GroupState;

use crate::demo;
use crate::token_file::read_token_file;

pub(crate) use common::{connect, emit, hex, nonzero, output_error, payload_text, reliable_config};
pub use common::{message_json, message_line, utc, CliError, ConnArgs};
pub use observe::StatsArgs;

pub mod backup;
pub mod changes;
pub mod cluster_status;
mod common;
pub mod ctl;
pub mod membership;
pub mod observe;
pub mod ops;
pub mod payload;
pub mod progress;
pub mod raft_log;
pub mod retention;

/// The client subcommands (flattened into the binary's `Command`).
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Create a group (its id is chosen by you).
    CreateGroup(CreateGroupArgs),
    /// Add a member to a group and set its cursor.
    Join(JoinArgs),
    /// Send a message to a group; prints its msg_id.
    Send(SendArgs),
    /// Print a member's unread messages of a group and acknowledge them.
    Pull(PullArgs),
    /// Advance a member's cursor.
    Ack(AckArgs),
    /// Unread counts of every group of a user.
    Unread(UnreadArgs),
    /// First unread messages of every group of a user, in one request.
    Sync(SyncArgs),
    /// Stored messages of a group, newest first (message roaming).
    History(HistoryArgs),
    /// A group's members with their cursors (paged by user id), and read
    /// receipts of its newest messages.
    Members(MembersArgs),
    /// A group's head, retention floor, member count and retention policy.
    GroupInfo(GroupInfoArgs),
    /// The node's figures (STATS and INFO), grouped by area, each with its
    /// kind (counter or gauge) and unit.
    Stats(StatsArgs),
    /// The node's slow log: the last requests that took at least its
    /// threshold (`serve --slowlog-threshold-us`), newest first.
    Slowlog(observe::SlowlogArgs),
    /// Copy a running node, consistently, into a new directory DIR;
    /// `tidemark serve --data DIR` restores it.
    ///
    /// Writes are held back only while the snapshot begins (microseconds:
    /// the end reports it); the copy streams while the node serves. DIR
    /// must not exist or be empty; it is removed if the backup fails.
    Backup(backup::BackupArgs),
    #[command(flatten)]
    Ops(ops::OpsCommand),
    #[command(flatten)]
    Retention(retention::RetentionCommand),
    #[command(flatten)]
    Changes(changes::ChangeCommand),
    /// Run a scripted session with offline members and cut connections;
    /// print what each member's application received.
    Demo(demo::DemoArgs),
}

#[derive(Args, Debug)]
pub struct CreateGroupArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The new group's id (nonzero).
    #[arg(long, value_parser = nonzero)]
    group: u64,
}

#[derive(Args, Debug)]
pub struct JoinArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// The user who joins (nonzero).
    #[arg(long, value_parser = nonzero)]
    user: u64,
    /// Where the cursor starts: head (only later messages are unread),
    /// earliest (every stored message is unread), or a msg_id.
    #[arg(long, default_value = "head", value_parser = parse_start)]
    start: JoinStart,
}

#[derive(Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,

    /// The sender's user id (stored with the message; nonzero).
    #[arg(long, value_parser = nonzero)]
    sender: u64,
    /// Idempotency key; a retransmit must reuse it (default: a fresh one).
    /// Sending again with the same id stores nothing new.
    #[arg(long)]
    client_msg_id: Option<u64>,
    #[command(flatten)]
    payload: payload::PayloadArgs,
}

#[derive(Args, Debug)]
pub struct PullArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// The member whose unread messages are printed and acknowledged.
    #[arg(long, value_parser = nonzero)]
    user: u64,
    /// Print at most this many messages.
    #[arg(long, default_value_t = 100)]
    max: u32,
    /// Messages per PULL page; each page's request acknowledges the previous page.
    #[arg(long, default_value_t = 50)]
    page: u32,
    /// Wait up to this long for a message if none is unread (long poll).
    #[arg(long, default_value_t = 0)]
    wait_ms: u32,
    /// Only show one page; do not move the cursor.
    #[arg(long)]
    no_ack: bool,
}

#[derive(Args, Debug)]
pub struct AckArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// The member whose cursor moves.
    #[arg(long, value_parser = nonzero)]
    user: u64,
    /// Acknowledge up to this msg_id (cursors only move forward; ids start
    /// at 1).
    #[arg(long, value_parser = nonzero)]
    msg_id: u64,
}

#[derive(Args, Debug)]
pub struct UnreadArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The user whose groups are listed.
    #[arg(long, value_parser = nonzero)]
    user: u64,
}

#[derive(Args, Debug)]
pub struct SyncArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The user whose groups are read (no cursor moves).
    #[arg(long, value_parser = nonzero)]
    user: u64,
    /// Messages per group at most; 0 = counts only.
    #[arg(long, default_value_t = 10)]
    per_group: u32,
    /// Record bytes per SYNC response at most.
    #[arg(long, default_value_t = 1 << 20)]
    max_bytes: u32,
}

#[derive(Args, Debug)]
pub struct HistoryArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,

    /// A member of the group.
    #[arg(long, value_parser = nonzero)]
    user: u64,
    /// Messages below this msg_id; 0 = from the newest.
    #[arg(long, default_value_t = 0)]
    before: u64,
    /// Print at most this many messages (one HISTORY page).
    #[arg(long, default_value_t = 20)]
    max: u32,
    /// Each message as it reads now (HISTORY_LATEST, protocol version 2):
    /// recalled or with its newest edit's text, the edits and recalls
    /// themselves left out.
    #[arg(long)]
    latest: bool,
}

#[derive(Args, Debug)]
pub struct MembersArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// List members whose user id is above this one (0: from the first);
    /// to continue a listing, pass the `next_after` it printed.
    #[arg(long, default_value_t = 0)]
    after: u64,
    /// List at most this many members.
    #[arg(long, default_value_t = 1000)]
    max: u32,
    /// Members per MEMBERS request (the node lists at most its
    /// `limits.members_page_max`).
    #[arg(long, default_value_t = 1000)]
    page: u32,
    /// Read receipts of this many of the newest messages.
    #[arg(long, default_value_t = 5)]
    last: u64,
}

#[derive(Args, Debug)]
pub struct GroupInfoArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
}

fn parse_start(s: &str) -> Result<JoinStart, String> {
    match s {
        "head" => Ok(JoinStart::Head),
        "earliest" => Ok(JoinStart::Earliest),
        n => n
            .parse::<u64>()
            .map(JoinStart::At)
            .map_err(|_| format!("expected head, earliest or a msg_id, got {n:?}")),
    }
}

impl ClientCommand {
    /// Whether `--json` was given: errors are then printed as JSON too.
    pub fn json(&self) -> bool {
        match self {
            ClientCommand::CreateGroup(a) => a.conn.json,
            ClientCommand::Join(a) => a.conn.json,
            ClientCommand::Send(a) => a.conn.json,
            ClientCommand::Pull(a) => a.conn.json,
            ClientCommand::Ack(a) => a.conn.json,
            ClientCommand::Unread(a) => a.conn.json,
            ClientCommand::Sync(a) => a.conn.json,
            ClientCommand::History(a) => a.conn.json,
            ClientCommand::Members(a) => a.conn.json,
            ClientCommand::GroupInfo(a) => a.conn.json,
            ClientCommand::Stats(a) => a.conn.json,
            ClientCommand::Slowlog(a) => a.conn.json,
            ClientCommand::Backup(a) => a.json(),
            ClientCommand::Ops(c) => c.json(),
            ClientCommand::Retention(c) => c.json(),
            ClientCommand::Changes(c) => c.json(),
            ClientCommand::Demo(a) => a.json,
        }
    }
}

/// Prints a failure as `--json` or as text says, on stderr.
pub fn report_error(e: &CliError, json: bool) {
    if json {
        eprintln!("{}", e.to_json());
    } else {
        eprintln!("tidemark: {e}");
    }
}

/// Runs a client subcommand.
pub fn run(cmd: ClientCommand) -> Result<(), CliError> {
    match cmd {
        ClientCommand::CreateGroup(a) => create_group(a),
        ClientCommand::Join(a) => join(a),
        ClientCommand::Send(a) => send(a),
        ClientCommand::Pull(a) => pull(a),
        ClientCommand::Ack(a) => ack(a),
        ClientCommand::Unread(a) => unread(a),
        ClientCommand::Sync(a) => sync(a),
        ClientCommand::History(a) => history(a),
        ClientCommand::Members(a) => members(a),
        ClientCommand::GroupInfo(a) => group_info(a),
        ClientCommand::Stats(a) => observe::stats(a),
        ClientCommand::Slowlog(a) => observe::slowlog(a),
        ClientCommand::Backup(a) => backup::run(a),
        ClientCommand::Ops(c) => ops::run(c),
        ClientCommand::Retention(c) => retention::run(c),
        ClientCommand::Changes(c) => changes::run(c),
        ClientCommand::Demo(a) => demo::run_cli(a).map_err(|m| CliError::new("demo", m)),
    }
}

fn create_group(a: CreateGroupArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    c.create_group(a.group)?;
    emit(
        a.conn.json,
        format!("created group {}\n", a.group),
        json!({ "group": a.group, "created": true }),
    )
}

fn join(a: JoinArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let cursor = c.join(a.group, a.user, a.start)?;
    emit(
        a.conn.json,
        format!(
            "user {} is a member of group {}, cursor {cursor}\n",
            a.user, a.group
        ),
        json!({ "group": a.group, "user": a.user, "cursor": cursor }),
    )
}

fn send(a: SendArgs) -> Result<(), CliError> {
    let payload = a.payload.read()?;
    let payload = payload.as_slice();
    let mut c = connect(&a.conn)?;
    let (client_msg_id, sent) = match a.client_msg_id {
        Some(id) => (id, c.send_with_id(a.group, a.sender, id, payload)),
        None => {
            let id = tidemark_client::reliable::ClientMsgIds::new().next_id();
            (id, c.send_with_id(a.group, a.sender, id, payload))
        }
    };
    let sent = sent?;
    let stats = c.stats();
    let dup = if sent.duplicate {
        " (already stored: nothing new was stored)"
    } else {
        ""
    };
    emit(
        a.conn.json,
        format!("sent to group {}: msg_id {}{dup}\n", a.group, sent.msg_id),
        json!({
            "group": a.group,
            "sender": a.sender,
            "client_msg_id": client_msg_id,
            "msg_id": sent.msg_id,
            "timestamp_ms": sent.timestamp_ms,
            "duplicate": sent.duplicate,
            "payload_bytes": payload.len(),
            "retransmits": stats.retransmits,
        }),
    )
}

fn pull(a: PullArgs) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let mut json_started = false;
    let result = pull_pages(&a, &mut out, &mut json_started);
    if let Err(e) = &result {
        if json_started {
            // Messages are already on stdout in an open JSON object: close it
            // validly, saying why it ends (stderr gets the error as usual).
            let _ = close_pull_json_with_error(&mut out, e);
        }
    }
    result
}

/// Ends a `pull --json` object whose `messages` array is open:
/// `],"error":{"code":..,"message":..}}`.
fn close_pull_json_with_error(out: &mut impl Write, e: &CliError) -> std::io::Result<()> {
    let tail = format!("],\"error\":{}}}\n", e.to_json()["error"]);
    out.write_all(tail.as_bytes()).and_then(|()| out.flush())
}

/// Pulls and prints pages. `json_started` is true while stdout holds a
/// `--json` object whose `messages` array is open and whole (a failed
/// write of stdout itself leaves it false: nothing valid can follow).
fn pull_pages(a: &PullArgs, out: &mut impl Write, json_started: &mut bool) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let page_max = a.page.max(1);
    let mut printed = 0u32;
    // The last msg_id written and flushed to stdout: the only thing a
    // request may acknowledge. A page is acknowledged by the request for
    // the next page (or the final ACK), never before it was printed, so
    // `tidemark pull | head` acknowledges nothing the pipe did not take.
    let mut ack_up_to = 0;
    let (mut cursor, mut head);
    let mut wait_ms = a.wait_ms;
    let mut started = false;
    loop {
        let want = a.max.saturating_sub(printed).min(page_max);
        let page = c.pull_page(a.group, a.user, ack_up_to, want, wait_ms)?;
        wait_ms = 0;
        cursor = page.cursor;
        head = page.head;
        let mut text = String::new();
        for m in &page.messages {
            if a.conn.json {
                // One JSON object, streamed: its head with the first
                // message, then each message, then the counts at the end.
                if started {
                    text.push(',');
                } else {
                    text.push_str(&format!(
                        "{{\"group\":{},\"user\":{},\"messages\":[",
                        a.group, a.user
                    ));
                    started = true;
                }
                text.push_str(&message_json(m).to_string());
            } else {
                text.push_str(&message_line(m));
            }
        }
        *json_started = false;
        out.write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .map_err(|e| {
                let acked = if ack_up_to > 0 {
                    format!("messages up to msg_id {ack_up_to} were written to standard output and acknowledged")
                } else {
                    "nothing was acknowledged".to_string()
                };
                CliError::new(
                    "output",
                    format!(
                        "writing output: {e}; {acked}, the rest of group {} stays unread",
                        a.group
                    ),
                )
            })?;
        *json_started = started;
        printed = printed.saturating_add(page.messages.len() as u32);
        if let Some(last) = page.messages.last() {
            ack_up_to = last.msg_id;
        }
        if a.no_ack || !page.has_more || printed >= a.max {
            break;
        }
    }
    if !a.no_ack && ack_up_to > cursor {
        cursor = c.ack(a.group, a.user, ack_up_to)?;
    }
    let unread = head.saturating_sub(cursor);
    let tail = if a.conn.json {
        let fields = format!(
            "\"acknowledged\":{},\"cursor\":{cursor},\"head\":{head},\"unread\":{unread}}}\n",
            !a.no_ack
        );
        if started {
            format!("],{fields}")
        } else {
            format!(
                "{{\"group\":{},\"user\":{},\"messages\":[],{fields}",
                a.group, a.user
            )
        }
    } else {
        let what = if printed == 0 {
            "no unread messages".to_string()
        } else if a.no_ack {
            format!("{printed} message(s), not acknowledged")
        } else {
            format!("{printed} message(s), acknowledged")
        };
        format!(
            "{what}; group {} cursor {cursor}, head {head}, unread {unread}\n",
            a.group
        )
    };
    *json_started = false;
    out.write_all(tail.as_bytes())
        .and_then(|()| out.flush())
        .map_err(output_error)
}

fn ack(a: AckArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let cursor = c.ack(a.group, a.user, a.msg_id)?;
    emit(
        a.conn.json,
        format!("user {} in group {}: cursor {cursor}\n", a.user, a.group),
        json!({ "group": a.group, "user": a.user, "cursor": cursor }),
    )
}

fn group_json(g: &GroupState) -> Value {
    json!({ "group": g.group, "head": g.head, "cursor": g.cursor, "unread": g.unread })
}

fn unread(a: UnreadArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let groups = c.unread(a.user)?;
    let mut human = String::new();
    if groups.is_empty() {
        human.push_str(&format!("user {} is in no group\n", a.user));
    } else {
        human.push_str(&format!(
            "{:>20} {:>12} {:>12} {:>12}\n",
            "group", "head", "cursor", "unread"
        ));
        for g in &groups {
            human.push_str(&format!(
                "{:>20} {:>12} {:>12} {:>12}\n",
                g.group, g.head, g.cursor, g.unread
            ));
        }
        let total: u64 = groups.iter().map(|g| g.unread).sum();
        human.push_str(&format!("total unread: {total}\n"));
    }
    emit(
        a.conn.json,
        human,
        json!({ "user": a.user, "groups": groups.iter().map(group_json).collect::<Vec<_>>() }),
    )
}

fn sync(a: SyncArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let groups = c.sync_all(a.user, a.per_group, a.max_bytes)?;
    let mut human = String::new();
    if groups.is_empty() {
        human.push_str(&format!("user {} has no unread messages\n", a.user));
    }
    for g in &groups {
        human.push_str(&format!(
            "group {}: {} unread (cursor {}, head {})\n",
            g.group, g.unread, g.cursor, g.head
        ));
        for m in &g.messages {
            human.push_str("  ");
            human.push_str(&message_line(m));
        }
    }
    let list: Vec<Value> = groups
        .iter()
        .map(|g| {
            let mut v = group_json(g);
            v["messages"] = g.messages.iter().map(message_json).collect();
            v
        })
        .collect();
    emit(
        a.conn.json,
        human,
        json!({ "user": a.user, "groups": list }),
    )
}

fn history(a: HistoryArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let (msgs, has_more, next_before) = if a.latest {
        c.history_latest(a.group, a.user, a.before, a.max)?
    } else {
        let (msgs, has_more) = c.history(a.group, a.user, a.before, a.max)?;
        let next = msgs.last().map_or(a.before, |m| m.msg_id);
        (msgs, has_more, next)
    };
    let mut human = String::new();
    for m in &msgs {
        human.push_str(&message_line(m));
    }
    if has_more {
        human.push_str(&format!(
            "{} message(s), newest first; older ones: --before {next_before}\n",
            msgs.len(),
        ));
    } else {
        human.push_str(&format!(
            "{} message(s), newest first; no older ones\n",
            msgs.len()
        ));
    }
    emit(
        a.conn.json,
        human,
        json!({
            "group": a.group,
            "messages": msgs.iter().map(message_json).collect::<Vec<_>>(),
            "has_more": has_more,
        }),
    )
}

fn members(a: MembersArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let info = c.group_info(a.group)?;
    let count = info.member_count;
    let mut human = format!("group {}: {count} member(s), head {}\n", a.group, info.head);
    // Pages by user id: each starts after the last user of the one before,
    // so every member present throughout is listed once.
    let mut listed = Vec::new();
    let mut after = a.after;
    let mut next_after = None;
    while listed.len() < a.max as usize {
        let want = (a.max as usize - listed.len()).min(a.page.max(1) as usize) as u32;
        let (page, has_more) = c.members(a.group, after, want)?;
        listed.extend(page.iter().map(|m| (m.user, m.cursor)));
        match page.last() {
            Some(last) if has_more => after = last.user,
            _ => break,
        }
        if listed.len() >= a.max as usize {
            next_after = Some(after);
        }
    }
    if !listed.is_empty() {
        human.push_str(&format!(
            "{:>20} {:>12} {:>12}\n",
            "user", "cursor", "unread"
        ));
    }
    for &(user, cursor) in &listed {
        let unread = info.head.saturating_sub(cursor);
        human.push_str(&format!("{user:>20} {cursor:>12} {unread:>12}\n"));
    }
    if let Some(n) = next_after {
        human.push_str(&format!("more members: --after {n}\n"));
    }
    let mut receipts = Vec::new();
    let first = info.head.saturating_sub(a.last.saturating_sub(1)).max(1);
    if a.last > 0 {
        for msg_id in (first..=info.head).rev() {
            let read = c.read_count(a.group, msg_id)?;
            human.push_str(&format!("  msg {msg_id}: read by {read} of {count}\n"));
            receipts.push(json!({ "msg_id": msg_id, "read_by": read }));
        }
    }
    let list: Vec<Value> = listed
        .iter()
        .map(|&(user, cursor)| json!({ "user": user, "cursor": cursor }))
        .collect();
    emit(
        a.conn.json,
        human,
        json!({
            "group": a.group,
            "member_count": count,
            "head": info.head,
            "members": list,
            "next_after": next_after,
            "read_receipts": receipts,
        }),
    )
}

fn group_info(a: GroupInfoArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let g = c.group_info(a.group)?;
    let r = g.retention;
    let keeps_everything = r == tidemark_client::protocol::RetentionPolicy::default();
    let policy = if keeps_everything {
        "none (every message is kept)".to_string()
    } else {
        let mut parts = Vec::new();
        if r.by_cursor {
            parts.push("messages every member acknowledged".to_string());
        }
        if r.max_age_ms > 0 {
            parts.push(format!("older than {} ms", r.max_age_ms));
        }
        if r.max_bytes > 0 {
            parts.push(format!("beyond {} bytes", r.max_bytes));
        }
        format!("drops {}", parts.join(", "))
    };
    let stored = (g.head + 1).saturating_sub(g.floor);
    emit(
        a.conn.json,
        format!(
            "group {}: head {}, floor {} ({stored} message(s) stored), {} member(s)\nretention: {policy}\n",
            a.group, g.head, g.floor, g.member_count
        ),
        json!({
            "group": a.group,
            "head": g.head,
            "floor": g.floor,
            "member_count": g.member_count,
            "retention": {
                "by_cursor": r.by_cursor,
                "max_age_ms": r.max_age_ms,
                "max_bytes": r.max_bytes,
                "keeps_everything": keeps_everything,
            },
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pull_json_object_cut_by_a_failure_is_closed_validly_with_the_error() {
        // What `pull --json` has printed when a later page fails: the head
        // and the messages of the pages before.
        let mut out = br#"{"group":1,"user":2,"messages":[{"msg_id":1},{"msg_id":2}"#.to_vec();
        let e = CliError::new("unavailable", "node unavailable after 3 attempt(s)");
        close_pull_json_with_error(&mut out, &e).unwrap();
        assert_eq!(out.last(), Some(&b'\n'));
        let v: Value = serde_json::from_slice(&out).expect("valid JSON");
        assert_eq!(v["messages"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["error"], e.to_json()["error"]);
        assert!(v.get("acknowledged").is_none());
    }

    #[test]
    fn timestamps_print_as_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(1_700_000_000_123), "2023-11-14 22:13:20.123");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn payloads_print_safely() {
        assert_eq!(payload_text(b"hello"), "hello");
        assert_eq!(payload_text(b"a\x1b[2J"), "\"a\\u{1b}[2J\"");
        assert_eq!(payload_text(&[0xff, 0x00]), "<2 bytes: ff00>");
    }

    #[test]
    fn join_start_and_ids_parse() {
        assert_eq!(parse_start("head"), Ok(JoinStart::Head));
        assert_eq!(parse_start("earliest"), Ok(JoinStart::Earliest));
        assert_eq!(parse_start("42"), Ok(JoinStart::At(42)));
        assert!(parse_start("x").is_err());
        assert!(nonzero("0").is_err());
        assert_eq!(nonzero("7"), Ok(7));
    }
}
