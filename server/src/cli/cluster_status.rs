//! `tidemark cluster status`: a replica set's health as one node sees it.
//!
//! Two requests on one connection: CLUSTER (the node's id, the leader it
//! knows, the members' client addresses; format-spec/protocol.md 4.32)
//! and STATS, whose `raft.*` figures (4.4.1) give the node's role, term,
//! commit and applied index, its counters, and on the leader each
//! follower's match, lag, last contact, snapshot and progress state. A
//! follower knows no other node's progress: it names the leader to ask.
//! A node older than the `raft.*` names gets CLUSTER's answer alone.
//! A node started with `--cluster-join` and not added yet says which set
//! it waits for (CLUSTER lists that set's members without it).

use clap::Args;
use serde_json::{json, Value};

use tidemark_client::ClusterMap;
use tidemark_node::{RaftFigures, RaftPeerFigures};

use super::{connect, emit, CliError, ConnArgs};

/// Where `cluster status` and `cluster map` ask.
#[derive(Args, Debug)]
pub struct ClusterStatusArgs {
    #[command(flatten)]
    pub conn: ConnArgs,
}

pub fn status(a: ClusterStatusArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let map = c.cluster()?;
    let raft = tidemark_node::parse_raft_figures(&c.node_stats()?);
    let addr = &a.conn.addr;
    let (text, json) = if map.node_id == 0 {
        (
            format!("node {addr}: a single node (no replica set)\n"),
            json!({ "node_id": 0, "leader_id": null, "members": [], "role": "single" }),
        )
    } else if is_joining(&map, raft.as_ref()) {
        joining(&map, addr)
    } else {
        member(&map, raft.as_ref(), addr)
    };
    emit(a.conn.json, text, json)
}

/// A node waiting to be added: STATS says `joining`, or (a node without
/// the `raft.*` names) CLUSTER does not list it among the members.
fn is_joining(map: &ClusterMap, raft: Option<&RaftFigures>) -> bool {
    match raft {
        Some(r) => r.role == "joining",
        None => !map.members.iter().any(|(id, _)| *id == map.node_id),
    }
}

fn members_json(map: &ClusterMap) -> Vec<Value> {
    map.members
        .iter()
        .map(|(id, addr)| json!({ "node_id": id, "client_addr": addr }))
        .collect()
}

fn joining(map: &ClusterMap, addr: &str) -> (String, Value) {
    let set: Vec<&str> = map.members.iter().map(|(_, a)| a.as_str()).collect();
    let text = format!(
        "node {} ({addr}): waiting to be added to the set at {} (`tidemark cluster add \
         --node-id {} ...` asked of a member adds it)\n",
        map.node_id,
        set.join(", "),
        map.node_id
    );
    let json = json!({
        "node_id": map.node_id,
        "leader_id": null,
        "role": "joining",
        "members": [],
        "waiting_for_set": members_json(map),
    });
    (text, json)
}

fn member(map: &ClusterMap, raft: Option<&RaftFigures>, addr: &str) -> (String, Value) {
    let leader = match (map.leader_id, map.leader_addr()) {
        (Some(id), Some(a)) => format!("node {id} at {a}"),
        (Some(id), None) => format!("node {id}"),
        _ => "none known (an election may be under way)".to_owned(),
    };
    let Some(r) = raft else {
        // A node older than the `raft.*` figures: what CLUSTER says.
        let mut t = format!("node {} ({addr}); leader: {leader}\n", map.node_id);
        for (id, a) in &map.members {
            let role = if Some(*id) == map.leader_id {
                " leader"
            } else {
                ""
            };
            t.push_str(&format!("  member {id} at {a}{role}\n"));
        }
        let json = json!({
            "node_id": map.node_id,
            "leader_id": map.leader_id,
            "members": members_json(map),
        });
        return (t, json);
    };
    let mut t = format!(
        "node {} ({addr}): {} in term {}; leader: {leader}\n  commit index {}, applied index \
         {}, last index {}\n",
        map.node_id,
        r.role.replace('_', "-"),
        r.term,
        r.commit_index,
        r.applied_index,
        r.last_index
    );
    let mut members = Vec::new();
    for (id, a) in &map.members {
        let peer = r.peers.iter().find(|p| p.node_id == *id);
        let what = if *id == map.node_id {
            format!("{} (this node)", r.role.replace('_', "-"))
        } else if Some(*id) == map.leader_id {
            "leader".to_owned()
        } else {
            match peer {
                Some(p) => peer_text(p),
                None => String::new(),
            }
        };
        t.push_str(&format!("  member {id} at {a}  {what}\n").replace("  \n", "\n"));
        let mut m = json!({ "node_id": id, "client_addr": a });
        if let Some(p) = peer {
            m["follower"] = peer_json(p);
        }
        members.push(m);
    }
    if r.role != "leader" {
        t.push_str(&match map.leader_id {
            Some(_) => {
                format!("  (the followers' progress is the leader's to report: ask {leader})\n")
            }
            None => "  (the followers' progress is the leader's to report: none is known now)\n"
                .to_owned(),
        });
    }
    t.push_str(&format!(
        "  elections: {} started, {} won; {} leader(s) seen; {} proposal(s) refused\n  \
         snapshots: {} send(s) started, {} finished, {} failed; {} installed\n  \
         applying: {} round(s) parked\n",
        r.elections_started,
        r.elections_won,
        r.leader_changes,
        r.proposals_refused,
        r.snapshot_sends_started,
        r.snapshot_sends_finished,
        r.snapshot_sends_failed,
        r.snapshots_installed,
        r.rounds_parked
    ));
    let json = json!({
        "node_id": map.node_id,
        "leader_id": map.leader_id,
        "members": members,
        "role": r.role,
        "term": r.term,
        "commit_index": r.commit_index,
        "applied_index": r.applied_index,
        "last_index": r.last_index,
        "counters": {
            "elections_started": r.elections_started,
            "elections_won": r.elections_won,
            "leader_changes": r.leader_changes,
            "proposals_refused": r.proposals_refused,
            "snapshot_sends_started": r.snapshot_sends_started,
            "snapshot_sends_finished": r.snapshot_sends_finished,
            "snapshot_sends_failed": r.snapshot_sends_failed,
            "snapshots_installed": r.snapshots_installed,
            "rounds_parked": r.rounds_parked,
        },
    });
    (t, json)
}

fn peer_text(p: &RaftPeerFigures) -> String {
    let mut t = format!(
        "{}: match {}, lag {} entries (~{} bytes, estimated), last contact {} ms ago, {}",
        if p.voter { "follower" } else { "learner" },
        p.match_index,
        p.lag_entries,
        p.lag_bytes,
        p.last_contact_ms,
        p.progress
    );
    if p.snapshot_sending {
        t.push_str(", a snapshot is being sent");
    }
    t
}

fn peer_json(p: &RaftPeerFigures) -> Value {
    json!({
        "voter": p.voter,
        "match_index": p.match_index,
        "next_index": p.next_index,
        "lag_entries": p.lag_entries,
        "lag_bytes_estimate": p.lag_bytes,
        "last_contact_ms": p.last_contact_ms,
        "snapshot_sending": p.snapshot_sending,
        "progress": p.progress,
    })
}
