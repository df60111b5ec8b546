//! `tidemark cluster add` and `tidemark cluster remove`: a membership
//! change of a replica set (format-spec/cluster.md section 11, protocol.md
//! 4.34).
//!
//! One CLUSTER_CHANGE on a plain connection ([`tidemark_client::Client`]:
//! the reliable client has no reason to send it), to the node given; a
//! `NOT_LEADER` is followed to the leader that CLUSTER names there (at most
//! [`HOPS_MAX`] redirects in a row; a leader that cannot be reached sends
//! it back to the node given, and while no leader is known, an election,
//! the same node is asked again, both until `--timeout-ms`), and an
//! interrupted change (leadership lost before it applied, detail 5) is
//! asked again of the new leader until `--timeout-ms`: asking again is
//! safe (cluster.md section 11.4). The answer waits for the change to
//! apply; an add waits for the new node's snapshot and promotion, hence
//! `--wait-ms`.
//!
//! A change already in place succeeds (exit 0) and says it was already
//! applied: a retry of a change whose answer was lost (an interruption, a
//! lost connection, a command run again) must not look like a failure.
//! A remove of a node that is not a member (`MEMBERSHIP_REFUSED` detail 3)
//! is one; an add of a node the leader's STATS report as a voter already
//! (`raft.peer_{id}.voter`, asked on the connection the change goes on)
//! is the other, the leader answering the set as for any add of a member
//! with the same addresses (protocol.md 4.34; other addresses are still
//! refused, detail 2).

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use tidemark_client::protocol::{ErrorCode, MemberChange};
use tidemark_client::{Client, ClientConfig, ClientError, ClusterMap};

use super::{emit, nonzero, read_token_file, CliError, ConnArgs};

/// Redirects in a row between nodes that answer before giving up.
const HOPS_MAX: u32 = 5;
/// Pause before asking again after an interruption or an election.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

#[derive(Args, Debug)]
pub struct ClusterAddArgs {
    #[command(flatten)]
    pub conn: ConnArgs,
    /// The new node's id (not a member yet).
    #[arg(long, value_parser = nonzero)]
    node_id: u64,
    /// The new node's Raft address, HOST:PORT: what it gives as its own
    /// `serve --cluster-listen` (the same name everywhere: the cluster
    /// map's `cluster_listen` key too). `--raft` is a deprecated spelling,
    /// still accepted.
    #[arg(long, value_name = "ADDR", alias = "raft")]
    cluster_listen: String,
    /// The new node's client address (its --listen), HOST:PORT.
    #[arg(long, value_name = "ADDR")]
    client: String,
    /// How long the answer may take (the new node's snapshot transfer and
    /// catch-up come first), in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    wait_ms: u64,
}

#[derive(Args, Debug)]
pub struct ClusterRemoveArgs {
    #[command(flatten)]
    pub conn: ConnArgs,
    /// The member to remove (not the leader: another node must lead).
    #[arg(long, value_parser = nonzero)]
    node_id: u64,
    /// How long the answer may take, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    wait_ms: u64,
}

/// How a change ended well.
enum Done {
    /// Applied by this request.
    Applied(ClusterMap),
    /// In place already (module docs).
    AlreadyApplied(ClusterMap),
}

pub fn add(a: ClusterAddArgs) -> Result<(), CliError> {
    let change = MemberChange::Add {
        node_id: a.node_id,
        cluster_addr: &a.cluster_listen,
        client_addr: &a.client,
    };
    let what = match change_at_leader(&a.conn, a.wait_ms, change)? {
        Done::Applied(map) => (format!("node {} added", a.node_id), false, map),
        Done::AlreadyApplied(map) => (
            format!(
                "node {} is a member already, with these addresses: already applied, \
                 nothing changed",
                a.node_id
            ),
            true,
            map,
        ),
    };
    report(&a.conn, what)
}

pub fn remove(a: ClusterRemoveArgs) -> Result<(), CliError> {
    let change = MemberChange::Remove { node_id: a.node_id };
    let what = match change_at_leader(&a.conn, a.wait_ms, change)? {
        Done::Applied(map) => (format!("node {} removed", a.node_id), false, map),
        Done::AlreadyApplied(map) => (
            format!(
                "node {} is not a member: already applied (removed before), nothing changed",
                a.node_id
            ),
            true,
            map,
        ),
    };
    report(&a.conn, what)
}

fn report(
    conn: &ConnArgs,
    (what, already, map): (String, bool, ClusterMap),
) -> Result<(), CliError> {
    let mut t = format!(
        "{what}; leader: node {}\n",
        map.leader_id.map_or("unknown".into(), |l| l.to_string())
    );
    for (id, addr) in &map.members {
        t.push_str(&format!("  member {id} at {addr}\n"));
    }
    let members: Vec<_> = map
        .members
        .iter()
        .map(|(id, addr)| json!({ "node_id": id, "client_addr": addr }))
        .collect();
    emit(
        conn.json,
        t,
        json!({ "leader_id": map.leader_id, "members": members, "already_applied": already }),
    )
}

/// Whether the node `c` is connected to leads a set in which `node_id` is
/// a voter already (its STATS' `raft.*` figures; false for a node without
/// them).
fn voter_already(c: &mut Client, node_id: u64) -> bool {
    let Some(r) = c
        .stats()
        .ok()
        .and_then(|s| tidemark_node::parse_raft_figures(&s))
    else {
        return false;
    };
    r.role == "leader"
        && (r.leader_id == node_id || r.peers.iter().any(|p| p.node_id == node_id && p.voter))
}

/// Sends `change` to the leader (module docs).
fn change_at_leader(
    conn: &ConnArgs,
    wait_ms: u64,
    change: MemberChange<'_>,
) -> Result<Done, CliError> {
    let deadline = Instant::now() + Duration::from_millis(conn.timeout_ms.max(wait_ms));
    let mut addr = conn.addr.clone();
    let mut hops = 0;
    loop {
        let fail = |e: ClientError, at: &str| match e {
            ClientError::Server { code, message, .. } => {
                CliError::new(code.name(), format!("{at}: {message}"))
            }
            ClientError::Address { .. } => CliError::new("invalid_address", e.to_string()),
            e => CliError::new("unavailable", format!("{at}: {e}")),
        };
        let mut config = ClientConfig::new(addr.clone());
        config.client_name = "tidemark-cluster".into();
        if let Some(path) = &conn.token_file {
            config.token = Some(read_token_file(path).map_err(|m| CliError::new("token_file", m))?);
        }
        config.io_timeout = Duration::from_millis(wait_ms.max(1000));
        let mut c = match Client::connect(&config) {
            Ok(c) => c,
            // A leader named a moment ago may be gone (killed, or an
            // election since): start again from the node given. The hops
            // start again too: they count redirects in a row between
            // nodes that answer (a circle), while a dead leader still
            // named during an election is waited out until the deadline.
            Err(e @ (ClientError::Io(_) | ClientError::Timeout)) => {
                if Instant::now() >= deadline {
                    return Err(fail(e, &addr));
                }
                addr = conn.addr.clone();
                hops = 0;
                std::thread::sleep(RETRY_PAUSE);
                continue;
            }
            Err(e) => return Err(fail(e, &addr)),
        };
        let already = match change {
            MemberChange::Add { node_id, .. } => voter_already(&mut c, node_id),
            MemberChange::Remove { .. } => false,
        };
        let e = match c.cluster_change(change) {
            Ok(map) if already => return Ok(Done::AlreadyApplied(map)),
            Ok(map) => return Ok(Done::Applied(map)),
            Err(e) => e,
        };
        if let (
            MemberChange::Remove { .. },
            ClientError::Server {
                code: ErrorCode::MembershipRefused,
                detail: Some(3),
                ..
            },
        ) = (change, &e)
        {
            // Not a member: removed already. The set as this node knows it.
            if let Ok(map) = c.cluster() {
                return Ok(Done::AlreadyApplied(map));
            }
        }
        let again = match &e {
            ClientError::Server {
                code: ErrorCode::NotLeader,
                ..
            } => {
                // Where the leader is, as this node knows it. None during
                // an election: ask the same node again until the deadline
                // (an election is not a hop; only a redirect is, and the
                // hop limit stops redirects that go round in a circle).
                let leader = c
                    .cluster()
                    .ok()
                    .and_then(|m| m.leader_addr().map(String::from));
                if let Some(l) = leader {
                    addr = l;
                    hops += 1;
                }
                hops <= HOPS_MAX
            }
            ClientError::Server {
                code: ErrorCode::MembershipRefused,
                detail: Some(5),
                ..
            } => true,
            _ => false,
        };
        if !again || Instant::now() >= deadline {
            return Err(fail(e, &addr));
        }
        std::thread::sleep(RETRY_PAUSE);
    }
}
