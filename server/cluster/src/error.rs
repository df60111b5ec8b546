//! The cluster layer's typed errors, one variant per thing a caller can
//! act on.

use std::fmt;
use std::path::PathBuf;

/// Result of the cluster layer.
pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

/// What went wrong in a replica.
#[derive(Debug)]
pub enum ClusterError {
    /// This replica is not the leader, or is a leader that has not yet
    /// applied its log up to its term's first entry: the write goes to
    /// `leader` (a node id) if one is known.
    NotLeader { leader: Option<u64> },
    /// The engine refused or failed the request (for a write whose round
    /// the gate refused: `WritesStopped`, outcome unknown, retry on the
    /// leader with the same client_msg_id).
    Engine(tidemark_engine::Error),
    /// The Raft log file is damaged (or not a Raft log): refused at open.
    RaftLogDamaged {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A system call on the Raft log failed.
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A snapshot stream was refused (cluster.md section 8.2): malformed,
    /// beyond what it announced or the free space, or not taken now (one
    /// at a time, only newer ones). Nothing of it stays staged; the leader
    /// sends one again.
    SnapshotRefused { reason: String },
    /// The replica stopped (a failed Raft log write, a committed entry its
    /// engine cannot take, an engine that cannot be reopened, or it was
    /// stopped); it must be restarted.
    Stopped { reason: String },
}

impl ClusterError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ClusterError {
        ClusterError::Io {
            context: context.into(),
            source,
        }
    }
}

impl fmt::Display for ClusterError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClusterError::NotLeader { leader: Some(l) } => write!(f, "not the leader; node {l} is"),
            ClusterError::NotLeader { leader: None } => write!(f, "not the leader; none known"),
            ClusterError::Engine(e) => write!(f, "engine: {e}"),
            ClusterError::RaftLogDamaged {
                path,
                offset,
                reason,
            } => write!(
                f,
                "raft log {} damaged at offset {offset}: {reason}",
                path.display()
            ),
            ClusterError::Io { context, source } => write!(f, "{context}: {source}"),
            ClusterError::SnapshotRefused { reason } => {
                write!(f, "a snapshot stream refused: {reason}")
            }
            ClusterError::Stopped { reason } => write!(f, "replica stopped: {reason}"),
        }
    }
}

impl std::error::Error for ClusterError {}

impl From<tidemark_engine::Error> for ClusterError {
    fn from(e: tidemark_engine::Error) -> ClusterError {
        ClusterError::Engine(e)
    }
}
