//! The cluster map file of `tidemark serve --cluster-map FILE`
//! (format-spec/cluster.md section 9.1): the replica sets of a cluster,
//! their members' addresses, and which set owns each of the 1024 shards.
//!
//! Representation: a TOML file, the same on every node of the cluster
//! (`server/cluster-map.example.toml`):
//!
//! ```toml
//! epoch = 1
//! [[set]]
//! id = 1
//! members = [{ node = 1, cluster_listen = "127.0.0.1:7101", client = "127.0.0.1:7001" }]
//! [[shards]]
//! first = 0
//! last = 1023
//! set = 1
//! ```
//!
//! [`parse`] turns it into a [`ClusterMapFile`]; [`ClusterMapFile::check`]
//! refuses what cannot be a cluster, each with a typed [`MapError`]: set
//! and node ids 0, a set twice, a set without members, a node id or an
//! address twice (a node is in exactly one set), a shard assigned twice or
//! not at all, a range naming a set the map lacks.
//! [`ClusterMapFile::for_node`] then gives a node its own set, its peers
//! (what `--cluster-peer` gives without a map) and the node's copy of the
//! map ([`ClusterShards`]).
//!
//! Cost: one read and parse at start; the map is then immutable.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tidemark_node::{ClusterShards, SetMembers};
use tidemark_protocol::{ShardRange, ShardTable, ShardTableError};

/// One node of a set in the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapMember {
    pub node_id: u64,
    /// Where its Raft messages go (its `--cluster-listen`).
    pub cluster_addr: SocketAddr,
    /// Where its clients connect (its `--listen`).
    pub client_addr: SocketAddr,
}

/// One replica set of the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapSet {
    pub set_id: u32,
    pub members: Vec<MapMember>,
}

/// A parsed map file, not yet checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterMapFile {
    pub epoch: u64,
    pub sets: Vec<MapSet>,
    pub shards: Vec<ShardRange>,
}

/// Why a map file was refused.
#[derive(Debug)]
pub enum MapError {
    /// The file could not be read.
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not valid TOML (the message says where).
    Syntax(String),
    /// A key missing, of the wrong type or out of range, or unknown; `at`
    /// names it (`set[1].members[0].node`).
    Field { at: String, problem: String },
    /// Set id 0 (reserved: the one set of a node without a map).
    SetIdZero,
    /// Node id 0 (reserved: a node that is no replica set member).
    NodeIdZero { set_id: u32 },
    /// Two sets with one id.
    DuplicateSet { set_id: u32 },
    /// A set without members.
    EmptySet { set_id: u32 },
    /// A node id in two places (a node is in exactly one set).
    DuplicateNode { node_id: u64 },
    /// An address two members (or one member's two roles) use.
    DuplicateAddress { addr: SocketAddr },
    /// A shard range names a set the map does not have.
    UnknownSet { set_id: u32 },
    /// The shard ranges do not assign every shard exactly once.
    Shards(ShardTableError),
    /// `--cluster-node-id` is in no set of the map.
    NodeNotInMap { node_id: u64 },
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Read { path, error } => {
                write!(f, "cannot read cluster map {}: {error}", path.display())
            }
            MapError::Syntax(m) => write!(f, "cluster map is not valid TOML: {m}"),
            MapError::Field { at, problem } => write!(f, "cluster map: {at}: {problem}"),
            MapError::SetIdZero => f.write_str("cluster map: set id 0 is reserved; ids start at 1"),
            MapError::NodeIdZero { set_id } => write!(
                f,
                "cluster map: set {set_id} has node id 0, which is reserved; ids start at 1"
            ),
            MapError::DuplicateSet { set_id } => {
                write!(f, "cluster map: set {set_id} appears twice")
            }
            MapError::EmptySet { set_id } => write!(f, "cluster map: set {set_id} has no members"),
            MapError::DuplicateNode { node_id } => write!(
                f,
                "cluster map: node {node_id} appears twice (a node is in exactly one set)"
            ),
            MapError::DuplicateAddress { addr } => {
                write!(f, "cluster map: address {addr} is used twice")
            }
            MapError::UnknownSet { set_id } => write!(
                f,
                "cluster map: a shard range names set {set_id}, which the map does not have"
            ),
            MapError::Shards(e) => write!(f, "cluster map: {e}"),
            MapError::NodeNotInMap { node_id } => {
                write!(
                    f,
                    "cluster map: node {node_id} (--cluster-node-id) is in no set"
                )
            }
        }
    }
}

impl std::error::Error for MapError {}

/// Reads and parses a map file (not checked: [`ClusterMapFile::check`]).
pub fn load(path: &Path) -> Result<ClusterMapFile, MapError> {
    let text = std::fs::read_to_string(path).map_err(|error| MapError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    parse(&text)
}

fn field(at: impl Into<String>, problem: impl Into<String>) -> MapError {
    MapError::Field {
        at: at.into(),
        problem: problem.into(),
    }
}

/// The keys a table may have; any other is refused (a typo would
/// otherwise be ignored).
fn only_keys(table: &toml::Table, at: &str, keys: &[&str]) -> Result<(), MapError> {
    match table.keys().find(|k| !keys.contains(&k.as_str())) {
        Some(k) => Err(field(
            format!("{at}{k}"),
            format!("unknown key (expected one of {})", keys.join(", ")),
        )),
        None => Ok(()),
    }
}

fn int(table: &toml::Table, at: &str, key: &str) -> Result<u64, MapError> {
    match table.get(key) {
        Some(toml::Value::Integer(n)) => {
            u64::try_from(*n).map_err(|_| field(format!("{at}{key}"), "must not be negative"))
        }
        Some(v) => Err(field(
            format!("{at}{key}"),
            format!("expected an integer, found {}", v.type_str()),
        )),
        None => Err(field(format!("{at}{key}"), "missing")),
    }
}

fn narrow<T: TryFrom<u64>>(n: u64, at: String) -> Result<T, MapError> {
    T::try_from(n).map_err(|_| field(at, format!("{n} is out of range")))
}

fn addr(table: &toml::Table, at: &str, key: &str) -> Result<SocketAddr, MapError> {
    match table.get(key) {
        Some(toml::Value::String(s)) => s
            .parse()
            .map_err(|e| field(format!("{at}{key}"), format!("address {s:?}: {e}"))),
        Some(v) => Err(field(
            format!("{at}{key}"),
            format!("expected an address string, found {}", v.type_str()),
        )),
        None => Err(field(format!("{at}{key}"), "missing")),
    }
}

/// A member's Raft address: `cluster_listen`, the name `serve
/// --cluster-listen` and `cluster add --cluster-listen` give it too, or
/// `cluster`, its deprecated spelling (still read; both at once is
/// refused).
fn cluster_listen(member: &toml::Table, at: &str) -> Result<SocketAddr, MapError> {
    match (
        member.contains_key("cluster_listen"),
        member.contains_key("cluster"),
    ) {
        (true, true) => Err(field(
            format!("{at}cluster"),
            "give cluster_listen only (cluster is its deprecated spelling)",
        )),
        (false, true) => addr(member, at, "cluster"),
        _ => addr(member, at, "cluster_listen"),
    }
}

/// The array of tables under `key` (`[[key]]`).
fn tables<'a>(root: &'a toml::Table, key: &str) -> Result<Vec<&'a toml::Table>, MapError> {
    match root.get(key) {
        Some(toml::Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_table()
                    .ok_or_else(|| field(format!("{key}[{i}]"), "expected a table"))
            })
            .collect(),
        Some(v) => Err(field(
            key,
            format!("expected an array of tables, found {}", v.type_str()),
        )),
        None => Err(field(key, "missing")),
    }
}

/// Parses a map file's text (module docs: the layout).
pub fn parse(text: &str) -> Result<ClusterMapFile, MapError> {
    let root: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| MapError::Syntax(e.to_string()))?;
    only_keys(&root, "", &["epoch", "set", "shards"])?;
    let epoch = int(&root, "", "epoch")?;
    let mut sets = Vec::new();
    for (i, t) in tables(&root, "set")?.into_iter().enumerate() {
        let at = format!("set[{i}].");
        only_keys(t, &at, &["id", "members"])?;
        let set_id = narrow(int(t, &at, "id")?, format!("{at}id"))?;
        let mut members = Vec::new();
        for (j, m) in tables(t, "members")
            .map_err(|e| match e {
                MapError::Field { at: a, problem } => field(format!("{at}{a}"), problem),
                e => e,
            })?
            .into_iter()
            .enumerate()
        {
            let at = format!("{at}members[{j}].");
            only_keys(m, &at, &["node", "cluster_listen", "cluster", "client"])?;
            members.push(MapMember {
                node_id: int(m, &at, "node")?,
                cluster_addr: cluster_listen(m, &at)?,
                client_addr: addr(m, &at, "client")?,
            });
        }
        sets.push(MapSet { set_id, members });
    }
    let mut shards = Vec::new();
    for (i, t) in tables(&root, "shards")?.into_iter().enumerate() {
        let at = format!("shards[{i}].");
        only_keys(t, &at, &["first", "last", "set"])?;
        shards.push(ShardRange {
            first: narrow(int(t, &at, "first")?, format!("{at}first"))?,
            last: narrow(int(t, &at, "last")?, format!("{at}last"))?,
            set_id: narrow(int(t, &at, "set")?, format!("{at}set"))?,
        });
    }
    Ok(ClusterMapFile {
        epoch,
        sets,
        shards,
    })
}

/// What a node takes from the map: its set's other members and the map
/// it serves.
#[derive(Clone, Debug)]
pub struct NodeView {
    pub set_id: u32,
    /// The node's own entry (its cluster address is its default
    /// `--cluster-listen`).
    pub own: MapMember,
    /// The other members of its set.
    pub peers: Vec<MapMember>,
    pub shards: ClusterShards,
}

impl ClusterMapFile {
    /// The checks of the module docs; the shard table on success.
    pub fn check(&self) -> Result<ShardTable, MapError> {
        let mut set_ids = BTreeSet::new();
        let mut nodes = BTreeSet::new();
        let mut addrs = BTreeSet::new();
        for set in &self.sets {
            if set.set_id == 0 {
                return Err(MapError::SetIdZero);
            }
            if !set_ids.insert(set.set_id) {
                return Err(MapError::DuplicateSet { set_id: set.set_id });
            }
            if set.members.is_empty() {
                return Err(MapError::EmptySet { set_id: set.set_id });
            }
            for m in &set.members {
                if m.node_id == 0 {
                    return Err(MapError::NodeIdZero { set_id: set.set_id });
                }
                if !nodes.insert(m.node_id) {
                    return Err(MapError::DuplicateNode { node_id: m.node_id });
                }
                for a in [m.cluster_addr, m.client_addr] {
                    if !addrs.insert(a) {
                        return Err(MapError::DuplicateAddress { addr: a });
                    }
                }
            }
        }
        if let Some(r) = self.shards.iter().find(|r| !set_ids.contains(&r.set_id)) {
            return Err(MapError::UnknownSet { set_id: r.set_id });
        }
        ShardTable::from_ranges(&self.shards).map_err(MapError::Shards)
    }

    /// The map checked, seen from node `node_id`.
    pub fn for_node(&self, node_id: u64) -> Result<NodeView, MapError> {
        let table = self.check()?;
        let set = self
            .sets
            .iter()
            .find(|s| s.members.iter().any(|m| m.node_id == node_id))
            .ok_or(MapError::NodeNotInMap { node_id })?;
        let (own, peers): (Vec<MapMember>, Vec<MapMember>) = set
            .members
            .iter()
            .cloned()
            .partition(|m| m.node_id == node_id);
        // Invariant: `set` was found by a member with this id, and ids are
        // unique (`check`).
        let own = own
            .into_iter()
            .next()
            .ok_or(MapError::NodeNotInMap { node_id })?;
        let by_id: BTreeMap<u32, &MapSet> = self.sets.iter().map(|s| (s.set_id, s)).collect();
        let sets = by_id
            .values()
            .map(|s| {
                let mut members: Vec<(u64, String)> = s
                    .members
                    .iter()
                    .map(|m| (m.node_id, m.client_addr.to_string()))
                    .collect();
                members.sort();
                SetMembers {
                    set_id: s.set_id,
                    members,
                }
            })
            .collect();
        Ok(NodeView {
            set_id: set.set_id,
            own,
            peers,
            shards: ClusterShards {
                epoch: self.epoch,
                own_set: set.set_id,
                table,
                sets,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../cluster-map.example.toml");

    #[test]
    fn the_example_map_parses_and_every_node_finds_its_set() {
        let map = parse(EXAMPLE).expect("the example parses");
        assert_eq!(map.epoch, 1);
        assert_eq!(map.sets.len(), 2);
        let table = map.check().expect("the example is valid");
        assert_eq!(table.sets(), vec![1, 2]);
        let view = map.for_node(2).expect("node 2 is in the map");
        assert_eq!(view.set_id, 1);
        assert_eq!(view.own.node_id, 2);
        assert_eq!(
            view.peers.iter().map(|m| m.node_id).collect::<Vec<_>>(),
            vec![1, 3]
        );
        assert_eq!(view.shards.own_set, 1);
        let view = map.for_node(4).expect("node 4 is in the map");
        assert_eq!((view.set_id, view.peers.len()), (2, 0));
        assert!(matches!(
            map.for_node(9),
            Err(MapError::NodeNotInMap { node_id: 9 })
        ));
    }

    /// The example with one line replaced.
    fn with(from: &str, to: &str) -> String {
        assert!(EXAMPLE.contains(from), "{from:?} is not in the example");
        EXAMPLE.replacen(from, to, 1)
    }

    #[test]
    fn bad_maps_are_refused_with_typed_errors() {
        let checked = |text: &str| parse(text).and_then(|m| m.check().map(|_| ()));
        assert!(matches!(checked("epoch = "), Err(MapError::Syntax(_))));
        assert!(matches!(
            checked(&with("epoch = 1", "epoch = -1")),
            Err(MapError::Field { at, .. }) if at == "epoch"
        ));
        assert!(matches!(
            checked(&with("epoch = 1", "epoch = 1\nepok = 2")),
            Err(MapError::Field { at, .. }) if at == "epok"
        ));
        assert!(matches!(
            checked(&with("{ node = 4,", "{ nod = 4,")),
            Err(MapError::Field { at, .. }) if at == "set[1].members[0].nod"
        ));
        assert!(matches!(
            checked(&with("\"127.0.0.1:7004\"", "\"localhost\"")),
            Err(MapError::Field { at, .. }) if at == "set[1].members[0].client"
        ));
        assert!(matches!(
            checked(&with("id = 2", "id = 0")),
            Err(MapError::SetIdZero)
        ));
        assert!(matches!(
            checked(&with("id = 2", "id = 1")),
            Err(MapError::DuplicateSet { set_id: 1 })
        ));
        assert!(matches!(
            checked(&with("{ node = 4,", "{ node = 3,")),
            Err(MapError::DuplicateNode { node_id: 3 })
        ));
        assert!(matches!(
            checked(&with("{ node = 4,", "{ node = 0,")),
            Err(MapError::NodeIdZero { set_id: 2 })
        ));
        assert!(matches!(
            checked(&with("\"127.0.0.1:7104\"", "\"127.0.0.1:7101\"")),
            Err(MapError::DuplicateAddress { .. })
        ));
        assert!(matches!(
            checked(&with("last = 511", "last = 510")),
            Err(MapError::Shards(ShardTableError::Unassigned { shard: 511 }))
        ));
        assert!(matches!(
            checked(&with("last = 511", "last = 512")),
            Err(MapError::Shards(ShardTableError::AssignedTwice {
                shard: 512,
                ..
            }))
        ));
        assert!(matches!(
            checked(&with("set = 2", "set = 3")),
            Err(MapError::UnknownSet { set_id: 3 })
        ));
        let empty = with(
            "members = [\n  { node = 4, cluster_listen = \"127.0.0.1:7104\", client = \"127.0.0.1:7004\" },\n]",
            "members = []",
        );
        assert!(matches!(
            checked(&empty),
            Err(MapError::EmptySet { set_id: 2 })
        ));
        // The deprecated key still reads; both keys at once are refused.
        let old = with("{ node = 4, cluster_listen =", "{ node = 4, cluster =");
        let map = parse(&old).expect("the deprecated key reads");
        assert!(map.check().is_ok());
        let both = with(
            "{ node = 4, cluster_listen =",
            "{ node = 4, cluster = \"127.0.0.1:7199\", cluster_listen =",
        );
        assert!(matches!(
            checked(&both),
            Err(MapError::Field { at, .. }) if at == "set[1].members[0].cluster"
        ));
    }
}
