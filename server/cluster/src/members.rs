//! The replica set's membership (format-spec/cluster.md section 11): who
//! the voters and learners are, with each one's cluster (Raft) address and
//! client address, as replicated state.
//!
//! Representation: [`Members`] is the list of members sorted by node id and
//! the Raft index of the entry whose application gave it (`index`; the
//! log's start for a bootstrapped or snapshot membership). It is durable as
//! the Raft log's Members record (kind 4, [`encode_body`]), written when a
//! ConfChange entry is applied, and in a snapshot's descriptor (version 2).
//! A ConfChange entry's data is raft-rs's `eraftpb.ConfChange`; its
//! `context` carries the added member's two addresses ([`encode_context`]).
//! [`KnownPeers`] is the set of member ids the transport's receivers admit
//! messages from, updated by the replica's driver when a change applies.
//!
//! Invariants: node ids are unique and non-zero; the voters of `Members` are
//! raft-rs's `ConfState` after every ConfChange up to `index` (a restart
//! gives raft-rs this state and applies only ConfChange entries after
//! `index`, so a change is never applied twice).
//!
//! Costs: a change rewrites the member list (a handful of members) once;
//! [`KnownPeers::admits`] is one read lock and a scan of a few ids.

use std::sync::Arc;

use parking_lot::RwLock;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfState};

use crate::le::u64_at;

/// A member's role: a voter counts toward the quorum; a learner receives
/// the log (and snapshots) but neither votes nor counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Voter = 1,
    Learner = 2,
}

/// One member of the replica set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub role: Role,
    /// Where its Raft messages go (`host:port`; empty when not known, as in
    /// the in-process tests).
    pub cluster_addr: String,
    /// Where its clients connect (`host:port`; empty when not known).
    pub client_addr: String,
}

/// The membership and the entry it reflects (module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Members {
    pub index: u64,
    pub list: Vec<Member>,
}

/// Bytes of a Members body before its members.
pub const MEMBERS_FIXED_BYTES: usize = 16;
/// Bytes of one member's fixed part.
pub const MEMBER_FIXED_BYTES: usize = 16;
/// An address's bytes, at most.
pub const ADDR_BYTES_MAX: usize = 255;

impl Members {
    /// The members `ids`, all voters, with no addresses, at `index`.
    pub fn voters(index: u64, ids: &[u64]) -> Members {
        let mut list: Vec<Member> = ids
            .iter()
            .map(|&id| Member {
                id,
                role: Role::Voter,
                cluster_addr: String::new(),
                client_addr: String::new(),
            })
            .collect();
        list.sort_by_key(|m| m.id);
        list.dedup_by_key(|m| m.id);
        Members { index, list }
    }

    /// raft-rs's view: the voters and learners.
    pub fn conf_state(&self) -> ConfState {
        let ids = |r: Role| {
            self.list
                .iter()
                .filter(|m| m.role == r)
                .map(|m| m.id)
                .collect()
        };
        ConfState {
            voters: ids(Role::Voter),
            learners: ids(Role::Learner),
            ..Default::default()
        }
    }

    pub fn get(&self, id: u64) -> Option<&Member> {
        self.list.iter().find(|m| m.id == id)
    }

    /// Every member's id.
    pub fn ids(&self) -> Vec<u64> {
        self.list.iter().map(|m| m.id).collect()
    }

    /// The membership after the committed change `cc` at Raft `index`
    /// (which raft-rs applied too): an added member's addresses come from
    /// the change's context; a promotion keeps them.
    pub fn apply(&self, index: u64, cc: &ConfChange) -> Result<Members, String> {
        let mut next = self.clone();
        next.index = index;
        let id = cc.node_id;
        let role = match cc.get_change_type() {
            ConfChangeType::AddNode => Some(Role::Voter),
            ConfChangeType::AddLearnerNode => Some(Role::Learner),
            ConfChangeType::RemoveNode => None,
        };
        next.list.retain(|m| m.id != id || role.is_some());
        if let Some(role) = role {
            let (cluster_addr, client_addr) = if cc.context.is_empty() {
                let old = self.get(id);
                (
                    old.map(|m| m.cluster_addr.clone()).unwrap_or_default(),
                    old.map(|m| m.client_addr.clone()).unwrap_or_default(),
                )
            } else {
                decode_context(&cc.context)?
            };
            let member = Member {
                id,
                role,
                cluster_addr,
                client_addr,
            };
            match next.list.iter_mut().find(|m| m.id == id) {
                Some(m) => *m = member,
                None => next.list.push(member),
            }
            next.list.sort_by_key(|m| m.id);
        }
        Ok(next)
    }
}

/// Appends the Members record body (cluster.md section 11.1).
pub fn encode_body(buf: &mut Vec<u8>, m: &Members) {
    // Format: { index: u64 | count: u32 | reserved: u32 = 0 } then per
    //   member { node_id: u64 | role: u8 | reserved: u8 = 0 |
    //   cluster_len: u16 | client_len: u16 | reserved: u16 = 0 |
    //   cluster: [u8; cluster_len] | client: [u8; client_len] }
    buf.extend_from_slice(&m.index.to_le_bytes());
    buf.extend_from_slice(&(m.list.len() as u32).to_le_bytes());
    buf.extend_from_slice(&[0; 4]);
    for x in &m.list {
        buf.extend_from_slice(&x.id.to_le_bytes());
        buf.push(x.role as u8);
        buf.push(0);
        // Invariant: addresses are checked to at most ADDR_BYTES_MAX bytes
        // where they enter (`encode_context`, the server's flags).
        buf.extend_from_slice(&(x.cluster_addr.len() as u16).to_le_bytes());
        buf.extend_from_slice(&(x.client_addr.len() as u16).to_le_bytes());
        buf.extend_from_slice(&[0; 2]);
        buf.extend_from_slice(x.cluster_addr.as_bytes());
        buf.extend_from_slice(x.client_addr.as_bytes());
    }
}

/// Decodes a Members body, the whole of `b`.
pub fn decode_body(b: &[u8]) -> Result<Members, String> {
    if b.len() < MEMBERS_FIXED_BYTES || b[12..16] != [0; 4] {
        return Err(format!("a members body of {} bytes", b.len()));
    }
    let index = u64_at(b, 0);
    let count = u32::from_le_bytes([b[8], b[9], b[10], b[11]]) as usize;
    let mut at = MEMBERS_FIXED_BYTES;
    let mut list: Vec<Member> = Vec::new();
    for _ in 0..count {
        let f = b
            .get(at..at + MEMBER_FIXED_BYTES)
            .ok_or("a member past the body's end")?;
        let id = u64_at(f, 0);
        let role = match f[8] {
            1 => Role::Voter,
            2 => Role::Learner,
            r => return Err(format!("member {id}: role {r}")),
        };
        if f[9] != 0 || f[14..16] != [0; 2] {
            return Err(format!("member {id}: reserved bytes are not 0"));
        }
        let cl = u16::from_le_bytes([f[10], f[11]]) as usize;
        let ll = u16::from_le_bytes([f[12], f[13]]) as usize;
        at += MEMBER_FIXED_BYTES;
        let text = |s: &[u8]| String::from_utf8(s.to_vec()).map_err(|_| "an address not UTF-8");
        let cluster_addr = text(b.get(at..at + cl).ok_or("an address past the end")?)?;
        at += cl;
        let client_addr = text(b.get(at..at + ll).ok_or("an address past the end")?)?;
        at += ll;
        if id == 0 || list.last().is_some_and(|m| m.id >= id) {
            return Err(format!("member {id}: 0, or not in increasing id order"));
        }
        list.push(Member {
            id,
            role,
            cluster_addr,
            client_addr,
        });
    }
    if at != b.len() {
        return Err(format!("{} bytes after the members", b.len() - at));
    }
    Ok(Members { index, list })
}

/// A ConfChange's context: the added member's addresses.
pub fn encode_context(cluster_addr: &str, client_addr: &str) -> Result<Vec<u8>, String> {
    // Format: { cluster_len: u16 | client_len: u16 | cluster | client }
    if cluster_addr.len() > ADDR_BYTES_MAX || client_addr.len() > ADDR_BYTES_MAX {
        return Err(format!("an address over {ADDR_BYTES_MAX} bytes"));
    }
    let mut c = Vec::with_capacity(4 + cluster_addr.len() + client_addr.len());
    c.extend_from_slice(&(cluster_addr.len() as u16).to_le_bytes());
    c.extend_from_slice(&(client_addr.len() as u16).to_le_bytes());
    c.extend_from_slice(cluster_addr.as_bytes());
    c.extend_from_slice(client_addr.as_bytes());
    Ok(c)
}

/// The addresses of a ConfChange's context.
pub fn decode_context(c: &[u8]) -> Result<(String, String), String> {
    if c.len() < 4 {
        return Err(format!("a conf change context of {} bytes", c.len()));
    }
    let cl = u16::from_le_bytes([c[0], c[1]]) as usize;
    let ll = u16::from_le_bytes([c[2], c[3]]) as usize;
    if c.len() != 4 + cl + ll {
        return Err(format!("a conf change context of {} bytes", c.len()));
    }
    let text =
        |s: &[u8]| String::from_utf8(s.to_vec()).map_err(|_| String::from("an address not UTF-8"));
    Ok((text(&c[4..4 + cl])?, text(&c[4 + cl..])?))
}

/// The member ids the transport's receivers admit messages from (module
/// docs). Empty: a node waiting to be added (`serve --cluster-join`), which
/// admits any sender, as it knows none yet.
#[derive(Clone, Debug, Default)]
pub struct KnownPeers(Arc<RwLock<Vec<u64>>>);

impl KnownPeers {
    pub fn new(ids: Vec<u64>) -> KnownPeers {
        KnownPeers(Arc::new(RwLock::new(ids)))
    }

    pub fn admits(&self, from: u64) -> bool {
        let ids = self.0.read();
        ids.is_empty() || ids.contains(&from)
    }

    pub fn set(&self, ids: Vec<u64>) {
        *self.0.write() = ids;
    }
}

/// A membership change a client asks for (protocol.md 4.34).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Add node `id`: first as a learner, promoted to voter by the leader
    /// once it holds the log up to its admission (cluster.md section 11.4).
    Add {
        id: u64,
        cluster_addr: String,
        client_addr: String,
    },
    /// Remove node `id` (a voter or a learner; not the leader itself).
    Remove { id: u64 },
}

/// Why a change was not made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeRefused {
    /// This node is not the leader (`leader` if known).
    NotLeader { leader: Option<u64> },
    /// Another change is under way (one at a time).
    InProgress,
    /// The id is already a member with other addresses, or 0.
    AlreadyMember { id: u64 },
    /// The id is not a member.
    UnknownMember { id: u64 },
    /// The change would leave no voter, or removes the leader itself
    /// (another node must lead first).
    Refused { reason: String },
    /// Leadership was lost or the replica stopped before the change was
    /// applied: it may or may not happen; asking again is safe (an add of
    /// a node already added, or a remove of one already removed, answers
    /// with the membership).
    Interrupted { reason: String },
}

impl std::fmt::Display for ChangeRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChangeRefused::NotLeader { leader: Some(l) } => {
                write!(f, "not the leader; node {l} is")
            }
            ChangeRefused::NotLeader { leader: None } => write!(f, "not the leader; none known"),
            ChangeRefused::InProgress => write!(f, "another membership change is under way"),
            ChangeRefused::AlreadyMember { id } => {
                write!(
                    f,
                    "node {id} is already a member (with other addresses), or is 0"
                )
            }
            ChangeRefused::UnknownMember { id } => write!(f, "node {id} is not a member"),
            ChangeRefused::Refused { reason } | ChangeRefused::Interrupted { reason } => {
                f.write_str(reason)
            }
        }
    }
}

/// Where a change's answer goes: called once, on the replica's driver
/// thread (it must not block).
pub type ChangeReply = Box<dyn FnOnce(Result<Members, ChangeRefused>) + Send>;
