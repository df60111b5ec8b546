//! `tidemark ctl raft-log`: what a replica set member's Raft log holds
//! (format-spec/cluster.md section 3): its header, Start, Members, hard
//! state, the entries' index range and terms, and how the file ends:
//! clean, a torn tail (a write a crash cut before its fdatasync, which the
//! next open cuts), or damage, named with the file and the offset. The
//! reading is `tidemark_cluster::raft_log_format::read`, the one an open
//! acts on; this command only reads.
//!
//! Exit status as the other `ctl` commands: 0 clean or torn, 1 damage, 2
//! no Raft log could be read.

use std::path::{Path, PathBuf};

use clap::Args;
use serde_json::{json, Value};
use tidemark_cluster::members::Role;
use tidemark_cluster::raft_log::FILE_NAME;
use tidemark_cluster::raft_log_format::{self as format, Outcome, Reading};

use super::common::{out, EXIT_CLEAN, EXIT_DAMAGE};

#[derive(Args, Debug)]
pub struct RaftLogArgs {
    /// The member's data directory (`serve --data`, which holds
    /// `raft/log`), or its `raft/` directory.
    #[arg(long, default_value = tidemark_node::defaults::DATA_DIR)]
    pub data: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Runs `ctl raft-log`; its exit status.
pub fn run(a: RaftLogArgs) -> Result<u8, String> {
    let path = log_path(&a.data)?;
    let bytes = std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))?;
    let r = format::read(&bytes);
    out(&if a.json {
        format!("{}\n", to_json(&path, &r))
    } else {
        to_text(&path, &r)
    });
    Ok(match r.outcome {
        Outcome::Damaged { .. } => EXIT_DAMAGE,
        Outcome::Clean | Outcome::Torn { .. } => EXIT_CLEAN,
    })
}

/// `DIR/raft/log`, or `DIR/log` for a `raft/` directory.
fn log_path(dir: &Path) -> Result<PathBuf, String> {
    [dir.join("raft").join(FILE_NAME), dir.join(FILE_NAME)]
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "no Raft log in {} (looked for raft/{FILE_NAME} and {FILE_NAME})",
                dir.display()
            )
        })
}

/// The entries' terms as runs: (term, first index, last index).
fn term_runs(r: &Reading) -> Vec<(u64, u64, u64)> {
    let mut runs: Vec<(u64, u64, u64)> = Vec::new();
    for e in &r.state.entries {
        match runs.last_mut() {
            Some(run) if run.0 == e.term => run.2 = e.index,
            _ => runs.push((e.term, e.index, e.index)),
        }
    }
    runs
}

fn role(r: Role) -> &'static str {
    match r {
        Role::Voter => "voter",
        Role::Learner => "learner",
    }
}

fn to_json(path: &Path, r: &Reading) -> Value {
    let s = &r.state;
    let (torn, damage) = match &r.outcome {
        Outcome::Clean => (Value::Null, Value::Null),
        Outcome::Torn { reason } => (
            json!({ "offset": r.end, "bytes": r.file_len - r.end, "reason": reason }),
            Value::Null,
        ),
        Outcome::Damaged { offset, reason } => (
            Value::Null,
            json!({ "file": path.display().to_string(), "offset": offset, "reason": reason }),
        ),
    };
    json!({
        "file": path.display().to_string(),
        "file_bytes": r.file_len,
        "header": r.header.map(|h| json!({
            "version": h.version,
            "bytes": h.bytes,
            "durable_len": h.durable_len,
        })),
        "start": { "index": s.start.0, "term": s.start.1 },
        "members": s.members.as_ref().map(|m| json!({
            "index": m.index,
            "list": m.list.iter().map(|x| json!({
                "id": x.id,
                "role": role(x.role),
                "cluster_addr": x.cluster_addr,
                "client_addr": x.client_addr,
            })).collect::<Vec<_>>(),
        })),
        "hard_state": {
            "term": s.hard_state.term,
            "vote": s.hard_state.vote,
            "commit": s.hard_state.commit,
        },
        "entries": {
            "first": s.start.0 + 1,
            "last": s.last(),
            "count": s.entries.len(),
            "terms": term_runs(r).iter().map(|t| json!({
                "term": t.0, "first": t.1, "last": t.2,
            })).collect::<Vec<_>>(),
        },
        "valid_bytes": r.end,
        "torn": torn,
        "damage": damage,
    })
}

fn to_text(path: &Path, r: &Reading) -> String {
    let s = &r.state;
    let mut t = match r.header {
        Some(h) => format!(
            "raft log {}: version {}, {} bytes ({} synced before it was named raft/log)\n",
            path.display(),
            h.version,
            r.file_len,
            h.durable_len
        ),
        None if matches!(r.outcome, Outcome::Damaged { .. }) => format!(
            "raft log {}: {} bytes, its header unreadable\n",
            path.display(),
            r.file_len
        ),
        None => format!(
            "raft log {}: {} bytes, no header (a creation a crash cut: an open writes it anew)\n",
            path.display(),
            r.file_len
        ),
    };
    t.push_str(&match s.start {
        (0, _) => "start: none (entries from index 1)\n".to_string(),
        (index, term) => format!(
            "start: entry {index} of term {term} (entries from {})\n",
            index + 1
        ),
    });
    match &s.members {
        None => t.push_str("members: none recorded (the configured voters are used)\n"),
        Some(m) => {
            t.push_str(&format!("members (entry {}):\n", m.index));
            for x in &m.list {
                t.push_str(&format!(
                    "  node {}: {}, cluster {}, client {}\n",
                    x.id,
                    role(x.role),
                    x.cluster_addr,
                    x.client_addr
                ));
            }
        }
    }
    let hs = &s.hard_state;
    t.push_str(&format!(
        "hard state: term {}, vote {}, commit {}\n",
        hs.term, hs.vote, hs.commit
    ));
    if s.entries.is_empty() {
        t.push_str("entries: none\n");
    } else {
        let runs: Vec<String> = term_runs(r)
            .iter()
            .map(|(term, a, b)| format!("term {term}: {a}..={b}"))
            .collect();
        t.push_str(&format!(
            "entries: {}..={} ({}); {}\n",
            s.start.0 + 1,
            s.last(),
            s.entries.len(),
            runs.join(", ")
        ));
    }
    t.push_str(&match &r.outcome {
        Outcome::Clean => format!("end: clean, {} bytes\n", r.end),
        Outcome::Torn { reason } => format!(
            "end: torn tail of {} bytes at offset {} ({reason}): a write a crash cut before \
             its fdatasync; the next open cuts it\n",
            r.file_len - r.end,
            r.end
        ),
        Outcome::Damaged { offset, reason } => format!(
            "DAMAGED: {} at offset {offset}: {reason}; the node refuses to open it (nothing \
             above is read past the damage)\n",
            path.display()
        ),
    });
    t
}
