//! The operator's client commands: `ping`, `leave`, `delete-group`,
//! `cluster map`, and `tail` (follow a group live); `cluster status` is in
//! `cluster_status.rs`, `cluster add` and `remove` in `membership.rs`.
//!
//! `ping`, `leave`, `delete-group` and `cluster map` are one request each
//! over the reliable client, like the commands in `cli.rs`. `tail` holds one plain
//! connection ([`tidemark_client::Client`]) with a SUBSCRIBE GROUPS of its
//! group and prints each PUSH as it arrives (format-spec/protocol.md
//! sections 4.17 and 5): messages that become durable after it subscribed,
//! in `msg_id` order. It needs no membership and moves no cursor. Pushes
//! are an optimisation the node may drop (RESYNC), and a lost connection
//! loses what was pushed meanwhile; ids are dense, so `tail` notices every
//! such gap and names it on stderr (with the `history` command that shows
//! it) instead of printing it: a member's PULL, not a tail, is the way to
//! read every message.
//!
//! Stopping: SIGINT or SIGTERM sets a flag that the loop checks between
//! waits of at most [`POLL`]; `tail` then shuts the connection down and
//! exits 0. A second signal while the first is handled exits at once
//! (status 130). No async runtime and no thread: the wait is the socket's
//! read timeout, which a signal also interrupts (EINTR).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use serde_json::json;

use tidemark_client::protocol::{ErrorCode, Subscription};
use tidemark_client::reliable::{Ctx, Error};
use tidemark_client::{Client, ClientConfig, ClientError, Event, Message};

use super::cluster_status::ClusterStatusArgs;
use super::{
    connect, emit, message_json, message_line, nonzero, output_error, reliable_config, CliError,
    ConnArgs,
};

/// Longest wait before `tail` looks at its stop flag again.
const POLL: Duration = Duration::from_millis(200);
/// Longest pause between two connection attempts of `tail`.
const RECONNECT_PAUSE_MAX: Duration = Duration::from_millis(500);

#[derive(Subcommand, Debug)]
pub enum OpsCommand {
    /// Check that the node answers (PING); prints the round trip.
    Ping(PingArgs),
    /// Remove a member from a group; its cursor is forgotten (a later join
    /// starts afresh).
    Leave(LeaveArgs),
    /// Delete a group with its messages, members and cursors; its id can
    /// then be created again, empty.
    DeleteGroup(DeleteGroupArgs),
    /// The replica set a node belongs to (format-spec/cluster.md).
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Follow a group: print each message as it is stored, until Ctrl-C.
    ///
    /// Prints the messages stored after it started, as `pull` does (with
    /// --json, one JSON object per message and line). Messages it could not
    /// print (pushes the node dropped, a lost connection) are named on
    /// stderr. A lost connection is retried for --timeout-ms. Ctrl-C
    /// (SIGINT) or SIGTERM closes the connection and exits 0.
    Tail(TailArgs),
}

#[derive(Args, Debug)]
pub struct PingArgs {
    #[command(flatten)]
    conn: ConnArgs,
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The replica set's health as the node sees it (CLUSTER and STATS'
    /// `raft.*` figures): its id, role (leader, candidate, pre-candidate,
    /// follower, learner, or joining: waiting to be added), term, commit
    /// and applied index, the members (id and client address) and the
    /// leader; on the leader, per follower: match index, lag in entries
    /// and in bytes (an estimate), time since its last message, progress
    /// state (probe, replicate, snapshot) and a snapshot being sent; its
    /// counters (elections, leaders seen, refused proposals, snapshots).
    /// A single node says so. --json: one object with the same figures.
    Status(ClusterStatusArgs),
    /// The cluster map as the node knows it (CLUSTER_MAP): its epoch, each
    /// replica set with its members and leader, and which set owns each
    /// range of the 1024 shards. Any node answers it, a follower too; a
    /// single node answers one set owning every shard.
    Map(ClusterStatusArgs),
    /// Add a node to the replica set (CLUSTER_CHANGE): start it first with
    /// `serve --cluster-join` on an empty directory; it catches up by a
    /// snapshot, and the answer comes once it is a voter. --addr may be
    /// any member: a follower's NOT_LEADER is followed to the leader.
    Add(super::membership::ClusterAddArgs),
    /// Remove a member of the replica set (CLUSTER_CHANGE), e.g. a dead
    /// one; --addr may be any member.
    Remove(super::membership::ClusterRemoveArgs),
}

#[derive(Args, Debug)]
pub struct LeaveArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group's id.
    #[arg(long, value_parser = nonzero)]
    group: u64,
    /// The member who leaves.
    #[arg(long, value_parser = nonzero)]
    user: u64,
}

#[derive(Args, Debug)]
pub struct DeleteGroupArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group to delete.
    #[arg(long, value_parser = nonzero)]
    group: u64,
}

#[derive(Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// The group to follow (no membership needed; no cursor moves).
    #[arg(long, value_parser = nonzero)]
    group: u64,
}

impl OpsCommand {
    /// Whether `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            OpsCommand::Ping(a) => a.conn.json,
            OpsCommand::Leave(a) => a.conn.json,
            OpsCommand::DeleteGroup(a) => a.conn.json,
            OpsCommand::Cluster(ClusterCommand::Status(a) | ClusterCommand::Map(a)) => a.conn.json,
            OpsCommand::Cluster(ClusterCommand::Add(a)) => a.conn.json,
            OpsCommand::Cluster(ClusterCommand::Remove(a)) => a.conn.json,
            OpsCommand::Tail(a) => a.conn.json,
        }
    }
}

pub fn run(cmd: OpsCommand) -> Result<(), CliError> {
    match cmd {
        OpsCommand::Ping(a) => ping(a),
        OpsCommand::Leave(a) => leave(a),
        OpsCommand::DeleteGroup(a) => delete_group(a),
        OpsCommand::Cluster(ClusterCommand::Status(a)) => super::cluster_status::status(a),
        OpsCommand::Cluster(ClusterCommand::Map(a)) => cluster_map(a),
        OpsCommand::Cluster(ClusterCommand::Add(a)) => super::membership::add(a),
        OpsCommand::Cluster(ClusterCommand::Remove(a)) => super::membership::remove(a),
        OpsCommand::Tail(a) => tail(a),
    }
}

fn ping(a: PingArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    // The round trip of the PING alone, on a connection already made.
    let start = Instant::now();
    c.ping()?;
    let us = start.elapsed().as_micros() as u64;
    emit(
        a.conn.json,
        format!(
            "pong from {} in {}.{:03} ms\n",
            a.conn.addr,
            us / 1000,
            us % 1000
        ),
        json!({ "addr": a.conn.addr, "pong": true, "round_trip_us": us }),
    )
}

fn cluster_map(a: ClusterStatusArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let map = c.cluster_map()?;
    let ranges = map.table.ranges();
    let mut t = if map.node_id == 0 {
        format!(
            "node {}: a single node (no cluster map); it owns all {} shards\n",
            a.conn.addr,
            tidemark_client::protocol::SHARD_COUNT
        )
    } else {
        format!(
            "cluster map epoch {}, as node {} of set {} ({}) knows it\n",
            map.epoch, map.node_id, map.set_id, a.conn.addr
        )
    };
    if map.node_id != 0 {
        for set in &map.sets {
            let leader = match set.leader_id {
                Some(id) => format!("leader node {id}"),
                None if set.set_id == map.set_id => "no leader known".to_owned(),
                None => "leader not known here".to_owned(),
            };
            t.push_str(&format!("set {}: {leader}\n", set.set_id));
            for (id, addr) in &set.members {
                let role = if Some(*id) == set.leader_id {
                    " (leader)"
                } else {
                    ""
                };
                t.push_str(&format!("  node {id} at {addr}{role}\n"));
            }
        }
        for r in &ranges {
            t.push_str(&format!(
                "shards {}-{}: set {}\n",
                r.first, r.last, r.set_id
            ));
        }
    }
    let sets: Vec<_> = map
        .sets
        .iter()
        .map(|s| {
            let members: Vec<_> = s
                .members
                .iter()
                .map(|(id, addr)| json!({ "node_id": id, "client_addr": addr }))
                .collect();
            json!({ "set_id": s.set_id, "leader_id": s.leader_id, "members": members })
        })
        .collect();
    let shards: Vec<_> = ranges
        .iter()
        .map(|r| json!({ "first": r.first, "last": r.last, "set_id": r.set_id }))
        .collect();
    emit(
        a.conn.json,
        t,
        json!({
            "epoch": map.epoch,
            "node_id": map.node_id,
            "set_id": map.set_id,
            "sets": sets,
            "shards": shards,
        }),
    )
}

fn leave(a: LeaveArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    c.leave(a.group, a.user)?;
    emit(
        a.conn.json,
        format!("user {} left group {}\n", a.user, a.group),
        json!({ "group": a.group, "user": a.user, "left": true }),
    )
}

fn delete_group(a: DeleteGroupArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    c.delete_group(a.group)?;
    emit(
        a.conn.json,
        format!("deleted group {}\n", a.group),
        json!({ "group": a.group, "deleted": true }),
    )
}

fn tail(a: TailArgs) -> Result<(), CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The conditional exit first: it fires only once `stop` is set, so
        // the first signal stops the loop and a second one exits at once.
        signal_hook::flag::register_conditional_shutdown(sig, 130, Arc::clone(&stop))
            .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&stop)))
            .map_err(|e| CliError::new("signal", format!("cannot handle signal {sig}: {e}")))?;
    }
    let config = reliable_config(&a.conn)?.client;
    let budget = Duration::from_millis(a.conn.timeout_ms.max(1));
    let Some(mut c) = follow(&config, a.group, &stop, budget)? else {
        return Ok(());
    };
    // Scripts (and the tests) wait for this line: messages stored from
    // now on are printed.
    eprintln!(
        "tidemark: following group {} on {} (Ctrl-C stops)",
        a.group, a.conn.addr
    );
    let mut out = std::io::stdout().lock();
    // The newest msg_id printed, or passed over as a gap.
    let mut last: Option<u64> = None;
    let mut printed = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match c.next_event(POLL) {
            // A tail never subscribes to receipts.
            Ok(None | Some(Event::Receipt { .. } | Event::ReceiptCounts { .. })) => {}
            Ok(Some(Event::Push(messages))) => {
                let mut text = String::new();
                for m in &messages {
                    // Ids from the node are input: one not above the
                    // last printed (which a node never pushes) is not
                    // printed twice.
                    if last.is_some_and(|l| m.msg_id <= l) {
                        continue;
                    }
                    if let Some(l) = last.filter(|l| m.msg_id > l + 1) {
                        note_gap(a.group, l + 1, m.msg_id - 1);
                    }
                    text.push_str(&line(m, a.conn.json));
                    last = Some(m.msg_id);
                    printed += 1;
                }
                out.write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .map_err(output_error)?;
            }
            Ok(Some(Event::Resync(_))) => {
                eprintln!(
                    "tidemark: the node dropped pushes to this tail (it read too slowly); subscribing again"
                );
                if let Err(e) = c.subscribe(Subscription::Groups(vec![a.group])) {
                    match reconnect(&config, a.group, &stop, budget, e)? {
                        Some(new) => c = new,
                        None => break,
                    }
                }
            }
            // A signal interrupted the wait: look at the flag.
            Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // The push is not printed: the next one reports it as a gap.
            Err(e @ ClientError::Crc { .. }) => eprintln!("tidemark: {e}; not printed"),
            Err(e) => match reconnect(&config, a.group, &stop, budget, e)? {
                Some(new) => c = new,
                None => break,
            },
        }
    }
    c.cut();
    eprintln!(
        "tidemark: stopped following group {} ({printed} message(s) printed)",
        a.group
    );
    Ok(())
}

fn line(m: &Message, json: bool) -> String {
    if json {
        format!("{}\n", message_json(m))
    } else {
        message_line(m)
    }
}

fn note_gap(group: u64, first: u64, last: u64) {
    eprintln!(
        "tidemark: group {group}: msg_ids {first}..={last} were not pushed to this tail; a member sees them with `tidemark history --group {group} --user USER --before {}`",
        last + 1
    );
}

/// After `e` broke the connection: a new one, subscribed (`None` if stopped
/// meanwhile), or the error if it is not one a new connection mends.
fn reconnect(
    config: &ClientConfig,
    group: u64,
    stop: &AtomicBool,
    budget: Duration,
    e: ClientError,
) -> Result<Option<Client>, CliError> {
    if !is_transient(&e) {
        return Err(cli_error(e, group, &config.addr));
    }
    eprintln!("tidemark: connection lost ({e}); reconnecting");
    let c = follow(config, group, stop, budget)?;
    if c.is_some() {
        eprintln!("tidemark: following group {group} again (messages stored meanwhile are reported as a gap)");
    }
    Ok(c)
}

/// Connects and subscribes to `group`, retrying transient failures for
/// `budget`; `None` if stopped meanwhile.
fn follow(
    config: &ClientConfig,
    group: u64,
    stop: &AtomicBool,
    budget: Duration,
) -> Result<Option<Client>, CliError> {
    let deadline = Instant::now() + budget;
    let mut pause = Duration::from_millis(50);
    loop {
        if stop.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let attempt = Client::connect(config).and_then(|mut c| {
            c.subscribe(Subscription::Groups(vec![group]))?;
            Ok(c)
        });
        match attempt {
            Ok(c) => return Ok(Some(c)),
            Err(e) if is_transient(&e) && Instant::now() < deadline => {
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
            }
            Err(e) => return Err(cli_error(e, group, &config.addr)),
        }
    }
}

/// A failure that another connection may not have: the connection broke,
/// the node is stopping or busy (what the reliable client retries).
fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Io(_) | ClientError::Closed | ClientError::Timeout => true,
        ClientError::Server { code, .. } => matches!(
            code,
            ErrorCode::ShuttingDown | ErrorCode::Overloaded | ErrorCode::TooManyRequestsInFlight
        ),
        ClientError::Address { .. } | ClientError::Protocol(_) | ClientError::Crc { .. } => false,
    }
}

/// A connection's error as the commands report it: a node's refusal by its
/// wire name, anything else as `unavailable` naming the address.
fn cli_error(e: ClientError, group: u64, addr: &str) -> CliError {
    match e {
        ClientError::Server {
            code,
            detail,
            message,
        } => CliError::from(Error::from_code(code, detail, message, Ctx::group(group))),
        ClientError::Address { .. } => CliError::new("invalid_address", e.to_string()),
        e => CliError::new("unavailable", format!("{addr}: {e}")),
    }
}
