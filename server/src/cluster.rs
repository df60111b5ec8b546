//! `tidemark serve --cluster-*`: a node that is a member of a replica set
//! (format-spec/cluster.md, protocol.md 4.31).
//!
//! Its job: from the cluster flags, start a [`Replica`] over the TCP
//! transport (`tidemark_cluster::tcp`) and serve its engine with the
//! ordinary event loop ([`tidemark_node::serve_engine`]), whose request
//! gate ([`Leadership`]) answers `NOT_LEADER` on every node but the leader
//! with its writes gate open. The event loop never waits for Raft: a write
//! it lets through is parked as on a single node, and the engine's commit
//! thread waits at the round gate for the round's commit.
//!
//! Representation: the data directory holds the replica's `engine/` and
//! `raft/` (cluster.md section 2); the peers are `ID=PEER_ADDR,CLIENT_ADDR`
//! (Raft messages to the first, clients redirected to the second).
//!
//! Invariants: the node's request gate lets a data request through only
//! while `Replica::is_writable`; a replica whose engine must be reopened
//! stops, since the engine the loop serves cannot be swapped under it:
//! after leadership was lost with a round of its own not committed, the
//! node shuts down and [`serve`] returns [`Served::Restart`] (the binary
//! re-executes itself, unless a signal asked it to stop meanwhile:
//! `signals.rs`), and the new run recovers both logs (cluster.md section
//! 5.1); after a failed write, an error (exit status 1). A replica that
//! stops to install a snapshot (its Raft log already reset to it) ends
//! the same way as a restart, whose start finishes the install
//! (cluster.md section 8.4).
//!
//! Costs: per data request one leaf-lock read of the gate state; a watcher
//! thread that looks at the replica's state every [`WATCH_INTERVAL`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tidemark_cluster::members::{Change, ChangeRefused, Member, Members, Role};
use tidemark_cluster::peer_auth::ClusterSecret;
use tidemark_cluster::tcp::{BoundListener, ListenerLimits, PeerStats, TcpTransport};
use tidemark_cluster::{Health, Replica, ReplicaConfig};
use tidemark_node::{
    ChangeDone, ChangeOutcome, ChangeRequest, ClusterShards, ClusterView, LeaderGate, Leadership,
    NodeConfig, NotLeader, RaftFigures, RaftInboundFigures, RaftPeerFigures, Shutdown,
};

use crate::cluster_map;
use crate::token_file::read_token_file;

/// How often the watcher looks whether the replica stopped.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(100);

/// One `--cluster-peer`: another voter of the replica set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub id: u64,
    /// Where its Raft messages go (its `--cluster-listen`).
    pub peer_addr: SocketAddr,
    /// Where its clients connect (its `--listen`), named in `NOT_LEADER`.
    pub client_addr: SocketAddr,
}

/// Parses `ID=PEER_ADDR,CLIENT_ADDR` (`2=127.0.0.1:7102,127.0.0.1:7002`).
pub fn parse_peer(s: &str) -> Result<Peer, String> {
    let usage = "expected ID=PEER_HOST:PORT,CLIENT_HOST:PORT, e.g. 2=127.0.0.1:7102,127.0.0.1:7002";
    let (id, addrs) = s.split_once('=').ok_or_else(|| usage.to_string())?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|e| format!("node id {id:?}: {e} ({usage})"))?;
    if id == 0 {
        return Err("node id 0 is reserved; ids start at 1".into());
    }
    let (peer, client) = addrs.split_once(',').ok_or_else(|| usage.to_string())?;
    let addr = |a: &str| {
        a.trim()
            .parse::<SocketAddr>()
            .map_err(|e| format!("address {a:?}: {e} ({usage})"))
    };
    Ok(Peer {
        id,
        peer_addr: addr(peer)?,
        client_addr: addr(client)?,
    })
}

/// The cluster flags as given (all absent on a single node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterArgs {
    pub node_id: Option<u64>,
    pub listen: Option<SocketAddr>,
    pub peers: Vec<Peer>,
    /// `--raft-log-max-bytes` (cluster.md section 3.5); 0 is taken as the
    /// default.
    pub raft_log_max_bytes: u64,
    /// `--cluster-map FILE` (format-spec/cluster.md section 9.1).
    pub map: Option<PathBuf>,
    /// `--cluster-join`: an empty directory waits to be added to the set
    /// of `peers` (cluster.md section 11.2) instead of starting one.
    pub join: bool,
    /// `--cluster-token-file FILE`: the set's shared secret (cluster.md
    /// section 7.1).
    pub token_file: Option<PathBuf>,
    /// `--cluster-insecure`: a member without a secret.
    pub insecure: bool,
}

/// A replica set member's settings, checked.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub node_id: u64,
    pub listen: SocketAddr,
    /// The other members of its set; empty for a set of one.
    pub peers: Vec<Peer>,
    pub raft_log_max_bytes: u64,
    /// The cluster map, when the node was started with one: requests for
    /// other sets' groups get WRONG_SET. `None`: the set owns every shard.
    pub shards: Option<ClusterShards>,
    /// Waits to be added (`--cluster-join`): `peers` are the set's members
    /// it answers, not its voters.
    pub join: bool,
    /// What the connections between members prove (cluster.md section
    /// 7.1); the insecure one under `--cluster-insecure`.
    pub secret: ClusterSecret,
}

impl ClusterArgs {
    /// `None` when no cluster flag is given (a single node). Without a map:
    /// the id, the listen address and the peers all together (one set
    /// owning every shard). With `--cluster-map`: the id, and the node's
    /// set and peers from the map (`--cluster-listen` defaults to the
    /// map's cluster address; `--cluster-peer` is refused: the map says).
    pub fn check(self) -> Result<Option<ClusterConfig>, String> {
        let raft_log_max_bytes = match self.raft_log_max_bytes {
            0 => tidemark_cluster::RAFT_LOG_MAX_BYTES_DEFAULT,
            n => n,
        };
        let single = self.map.is_none()
            && (self.node_id, self.listen, self.peers.is_empty(), self.join)
                == (None, None, true, false);
        if single {
            if self.token_file.is_some() || self.insecure {
                return Err(
                    "--cluster-token-file and --cluster-insecure are for a replica set member \
                     (--cluster-node-id ...); a single node has no Raft port"
                        .into(),
                );
            }
            return Ok(None);
        }
        if let Some(path) = &self.map {
            let Some(node_id) = self.node_id else {
                return Err("--cluster-map needs --cluster-node-id".into());
            };
            if !self.peers.is_empty() || self.join {
                return Err(
                    "--cluster-peer (or --cluster-join) and --cluster-map exclude each other: \
                     the map names the node's peers"
                        .into(),
                );
            }
            let view = cluster_map::load(path)
                .and_then(|m| m.for_node(node_id))
                .map_err(|e| e.to_string())?;
            let peers = view
                .peers
                .iter()
                .map(|m| Peer {
                    id: m.node_id,
                    peer_addr: m.cluster_addr,
                    client_addr: m.client_addr,
                })
                .collect();
            let secret = self.secret()?;
            return Ok(Some(ClusterConfig {
                node_id,
                listen: self.listen.unwrap_or(view.own.cluster_addr),
                peers,
                raft_log_max_bytes,
                shards: Some(view.shards),
                join: false,
                secret,
            }));
        }
        let (node_id, listen) = match (self.node_id, self.listen, self.peers.is_empty()) {
            (Some(id), Some(listen), false) => (id, listen),
            _ => {
                return Err(
                    "a replica set member needs --cluster-node-id, --cluster-listen and one \
                     --cluster-peer per other member (or --cluster-node-id and --cluster-map); \
                     --cluster-join needs them too (the set's members it waits to be added by)"
                        .into(),
                )
            }
        };
        if node_id == 0 {
            return Err("--cluster-node-id 0 is reserved; ids start at 1".into());
        }
        let mut ids = BTreeSet::from([node_id]);
        for p in &self.peers {
            if !ids.insert(p.id) {
                return Err(format!(
                    "node id {} appears twice (this node's and the peers' ids must differ)",
                    p.id
                ));
            }
        }
        let secret = self.secret()?;
        Ok(Some(ClusterConfig {
            node_id,
            listen,
            peers: self.peers,
            raft_log_max_bytes,
            shards: None,
            join: self.join,
            secret,
        }))
    }

    /// The secret of `--cluster-token-file`, or the insecure one of
    /// `--cluster-insecure`; neither (or both) is an error naming the flag
    /// (cluster.md section 7.1).
    fn secret(&self) -> Result<ClusterSecret, String> {
        match (&self.token_file, self.insecure) {
            (Some(_), true) => {
                Err("--cluster-token-file and --cluster-insecure exclude each other".into())
            }
            (Some(path), false) => {
                warn_if_others_may_read(path);
                ClusterSecret::new(read_token_file(path)?)
                    .map_err(|e| format!("--cluster-token-file {}: {e}", path.display()))
            }
            (None, true) => Ok(ClusterSecret::insecure()),
            (None, false) => Err(
                "a replica set member needs --cluster-token-file FILE: the set's shared secret, \
                 the same file on every member (format-spec/cluster.md section 7.1); without it \
                 anyone who reaches --cluster-listen could change the set. --cluster-insecure \
                 runs without one (tests on a closed machine only)"
                    .into(),
            ),
        }
    }
}

/// A secret others can read is no secret: said at start, not refused (a
/// file on a volume without permissions, a container's mounted secret).
fn warn_if_others_may_read(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            log::warn!(
                "--cluster-token-file {}: mode {:o} lets other users read the cluster secret \
                 (chmod 600)",
                path.display(),
                mode & 0o777
            );
        }
    }
}

/// The node's request gate over its replica (module docs).
struct ReplicaLeadership {
    /// Set once the replica started (the listener is bound before).
    replica: OnceLock<Arc<Replica>>,
    node_id: u64,
    /// Every member's client address, this node's included, as
    /// configured: used until the replica runs, and for members whose
    /// address the durable membership does not have (a set made before
    /// membership was recorded).
    clients: BTreeMap<u64, String>,
    /// What the Raft listener saw of its inbound connections; set each
    /// time a listener starts (with the replica).
    inbound: Mutex<Option<Arc<PeerStats>>>,
}

impl ReplicaLeadership {
    /// The members' client addresses: the replica's membership (which
    /// membership changes update, cluster.md section 11), else the
    /// configured ones. A node waiting to be added (`--cluster-join`: no
    /// membership yet) answers the set it waits for, the members it was
    /// started with, itself not among them (protocol.md 4.32). Cost: a
    /// copy of a few members.
    fn clients(&self) -> BTreeMap<u64, String> {
        let Some(r) = self.replica.get() else {
            return self.clients.clone();
        };
        let members = r.members();
        if members.list.is_empty() {
            let mut set = self.clients.clone();
            set.remove(&self.node_id);
            return set;
        }
        client_addrs(&members, &self.clients)
    }
}

/// The node's `raft.*` figures from the replica's health, with each
/// follower's time since its last contact as of `now`, and its listener's
/// `inbound` counts.
fn raft_figures(h: &Health, inbound: Option<&PeerStats>, now: Instant) -> RaftFigures {
    let c = &h.counters;
    let count = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let level = |a: &AtomicUsize| a.load(Ordering::Relaxed) as u64;
    RaftFigures {
        inbound: inbound.map_or_else(RaftInboundFigures::default, |i| RaftInboundFigures {
            authenticated: count(&i.authenticated),
            handshakes_failed: count(&i.handshakes_failed),
            refused_at_cap: count(&i.refused_at_cap),
            frames_forged: count(&i.frames_forged),
            idle_closed: count(&i.idle_closed),
            handshaking: level(&i.handshaking),
            open: level(&i.open),
        }),
        role: h.role.name(),
        term: h.term,
        leader_id: h.leader.unwrap_or(0),
        commit_index: h.commit_index,
        applied_index: h.applied_index,
        last_index: h.last_index,
        elections_started: c.elections_started,
        elections_won: c.elections_won,
        leader_changes: c.leader_changes,
        proposals_refused: c.proposals_refused,
        snapshot_sends_started: c.snapshot_sends_started,
        snapshot_sends_finished: c.snapshot_sends_finished,
        snapshot_sends_failed: c.snapshot_sends_failed,
        snapshots_installed: c.snapshots_installed,
        rounds_parked: c.rounds_parked,
        peers: h
            .peers
            .iter()
            .map(|p| RaftPeerFigures {
                node_id: p.id,
                voter: p.voter,
                match_index: p.match_index,
                next_index: p.next_index,
                lag_entries: p.lag_entries,
                lag_bytes: p.lag_bytes,
                last_contact_ms: now.saturating_duration_since(p.last_contact).as_millis() as u64,
                snapshot_sending: p.snapshot_sending,
                progress: p.progress.name(),
            })
            .collect(),
    }
}

/// Every member's client address: the membership's, else the configured
/// one (a membership recorded without addresses).
fn client_addrs(members: &Members, configured: &BTreeMap<u64, String>) -> BTreeMap<u64, String> {
    members
        .list
        .iter()
        .map(|m| {
            let addr = match m.client_addr.is_empty() {
                true => configured.get(&m.id).cloned().unwrap_or_default(),
                false => m.client_addr.clone(),
            };
            (m.id, addr)
        })
        .collect()
}

impl Leadership for ReplicaLeadership {
    fn refusal(&self) -> Option<NotLeader> {
        let Some(replica) = self.replica.get() else {
            return Some(NotLeader {
                leader: None,
                client_addr: None,
                starting: false,
            });
        };
        if replica.is_writable() {
            return None;
        }
        let leader = replica.leader();
        Some(NotLeader {
            leader,
            client_addr: leader.and_then(|l| self.clients().remove(&l)),
            starting: leader == Some(replica.id()),
        })
    }

    /// Hands the change to the replica's driver (never waits for it): the
    /// driver's answer is mapped to the protocol's outcome on its thread.
    fn change(&self, change: ChangeRequest, done: ChangeDone) {
        let Some(replica) = self.replica.get().cloned() else {
            return done(ChangeOutcome::NotLeader(NotLeader {
                leader: None,
                client_addr: None,
                starting: false,
            }));
        };
        let change = match change {
            ChangeRequest::Add {
                node_id,
                cluster_addr,
                client_addr,
            } => {
                let bad = [&cluster_addr, &client_addr]
                    .into_iter()
                    .find(|a| a.parse::<SocketAddr>().is_err());
                if let Some(a) = bad {
                    return done(ChangeOutcome::Refused {
                        detail: 4,
                        message: format!("address {a:?} is not HOST:PORT with a numeric host"),
                    });
                }
                Change::Add {
                    id: node_id,
                    cluster_addr,
                    client_addr,
                }
            }
            ChangeRequest::Remove { node_id } => Change::Remove { id: node_id },
        };
        let (configured, node_id) = (self.clients.clone(), self.node_id);
        let r = replica.clone();
        replica.change_members(
            change,
            Box::new(move |result| {
                let refused = |detail, e: ChangeRefused| ChangeOutcome::Refused {
                    detail,
                    message: e.to_string(),
                };
                done(match result {
                    Ok(members) => ChangeOutcome::Done(ClusterView {
                        node_id,
                        leader_id: r.leader().unwrap_or(0),
                        members: client_addrs(&members, &configured).into_iter().collect(),
                    }),
                    Err(ChangeRefused::NotLeader { leader }) => {
                        let members = r.members();
                        ChangeOutcome::NotLeader(NotLeader {
                            leader,
                            client_addr: leader
                                .and_then(|l| client_addrs(&members, &configured).remove(&l)),
                            starting: false,
                        })
                    }
                    Err(e @ ChangeRefused::InProgress) => refused(1, e),
                    Err(e @ ChangeRefused::AlreadyMember { .. }) => refused(2, e),
                    Err(e @ ChangeRefused::UnknownMember { .. }) => refused(3, e),
                    Err(e @ ChangeRefused::Refused { .. }) => refused(4, e),
                    Err(e @ ChangeRefused::Interrupted { .. }) => refused(5, e),
                });
            }),
        );
    }

    fn read_ticket(&self) -> u64 {
        // No replica yet: `refusal` refused the request before this; 0
        // is failed by `read_outcome`.
        self.replica.get().map_or(0, |r| r.read_ticket())
    }

    fn read_outcome(&self, ticket: u64) -> Option<bool> {
        match self.replica.get() {
            Some(r) => r.reads_settled().outcome(ticket),
            None => Some(false),
        }
    }

    fn on_reads(&self, wake: Arc<dyn Fn() + Send + Sync>) {
        if let Some(r) = self.replica.get() {
            r.on_reads(wake);
        }
    }

    fn raft_figures(&self) -> Option<RaftFigures> {
        let health = self.replica.get()?.health();
        let inbound = self
            .inbound
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        Some(raft_figures(&health, inbound.as_deref(), Instant::now()))
    }

    fn map(&self) -> ClusterView {
        ClusterView {
            node_id: self.node_id,
            leader_id: self.replica.get().and_then(|r| r.leader()).unwrap_or(0),
            members: self.clients().into_iter().collect(),
        }
    }
}

/// How a member's run ended, when not on an error.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// Stopped (a signal, or `on_ready`'s handle).
    Stopped,
    /// Everything closed, the node must run again in place (same command
    /// line, same pid): to finish a snapshot's install (cluster.md
    /// section 8.4), or for a fresh engine after leadership was lost with
    /// a round of its own not committed (section 5.1). Says which.
    Restart(&'static str),
}

/// Runs a replica set member until a signal or `on_ready`'s handle stops
/// it, or its replica stops: on an error (then an error), or to be run
/// again in place ([`Served::Restart`]: the caller re-executes the
/// process, unless it was asked to stop meanwhile).
pub fn serve(
    mut node: NodeConfig,
    cluster: ClusterConfig,
    on_ready: impl FnOnce(SocketAddr, Shutdown),
) -> Result<Served, String> {
    let voters: Vec<u64> = std::iter::once(cluster.node_id)
        .chain(cluster.peers.iter().map(|p| p.id))
        .collect();
    let mut clients: BTreeMap<u64, String> = cluster
        .peers
        .iter()
        .map(|p| (p.id, p.client_addr.to_string()))
        .collect();
    clients.insert(cluster.node_id, node.listen.to_string());
    let peers: HashMap<u64, SocketAddr> =
        cluster.peers.iter().map(|p| (p.id, p.peer_addr)).collect();
    let leadership = Arc::new(ReplicaLeadership {
        replica: OnceLock::new(),
        node_id: cluster.node_id,
        clients,
        inbound: Mutex::new(None),
    });
    node.leadership = Some(LeaderGate(leadership.clone()));
    if let Some(shards) = cluster.shards.clone() {
        // The map's own client address is what other nodes and clients
        // are told; a node listening elsewhere is reachable only by luck.
        let own = shards
            .members(shards.own_set)
            .iter()
            .find(|(id, _)| *id == cluster.node_id)
            .map(|(_, a)| a.clone());
        if let Some(advertised) = own.filter(|a| *a != node.listen.to_string()) {
            log::warn!(
                "--listen {} is not the client address {advertised} the cluster map gives \
                 node {}: clients are sent there",
                node.listen,
                cluster.node_id
            );
        }
        node.shards = Some(Arc::new(shards));
    }
    // The replica's directory: `engine/` (the node's data) and `raft/`.
    let dir = node.engine.data_dir.clone();
    let mut replica_config = ReplicaConfig::new(cluster.node_id, &voters, &dir);
    // What a brand-new directory starts the set with (cluster.md section
    // 11.2); a node that joins starts with none and waits to be added.
    replica_config.members = match cluster.join {
        true => Vec::new(),
        false => replica_members(&cluster, node.listen),
    };
    replica_config.engine = node.engine.clone();
    replica_config.raft_log_max_bytes = cluster.raft_log_max_bytes;
    node.engine.data_dir = dir.join("engine");
    let bound = BoundListener::bind(cluster.listen)
        .map_err(|e| format!("cluster listen {}: {e}", cluster.listen))?;
    let raft_listener = Mutex::new(None);
    let secret = cluster.secret.clone();
    if secret.is_insecure() {
        log::warn!(
            "--cluster-insecure: the Raft port {} accepts ANY peer: anyone who reaches it can \
             elect a leader, rewrite this replica set's log and replace its data. Give every \
             member --cluster-token-file (format-spec/cluster.md section 7.1)",
            cluster.listen
        );
    }
    let open = |_: &NodeConfig| {
        let transport = TcpTransport::new(cluster.node_id, &peers, secret.clone())
            .map_err(|e| format!("raft transport threads: {e}"))?;
        let replica = Arc::new(
            Replica::start(replica_config, transport).map_err(|e| format!("replica: {e}"))?,
        );
        let handle = bound
            .start(
                cluster.node_id,
                replica.mailbox(),
                secret.clone(),
                ListenerLimits::default(),
            )
            .map_err(|e| format!("cluster listener thread: {e}"))?;
        *leadership.inbound.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(handle.stats().clone());
        *raft_listener.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        let engine = replica
            .engine()
            .ok_or_else(|| "the replica stopped at start".to_string())?;
        let _ = leadership.replica.set(replica);
        log::info!(
            "replica set member {} of {voters:?}: raft messages on {}",
            cluster.node_id,
            cluster.listen
        );
        Ok(engine)
    };
    let watcher_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut watcher = None;
    let watched = leadership.clone();
    let stop_watching = watcher_stop.clone();
    let engine = tidemark_node::serve_engine(node, open, |addr, shutdown| {
        // A replica that stopped cannot serve: the node shuts down.
        let spawned = std::thread::Builder::new()
            .name("tidemark-replica-watch".into())
            .spawn({
                let shutdown = shutdown.clone();
                move || watch(&watched, &shutdown, &stop_watching)
            });
        match spawned {
            Ok(t) => watcher = Some(t),
            Err(e) => {
                log::error!("replica watcher thread: {e}");
                shutdown.request();
            }
        }
        on_ready(addr, shutdown);
    });
    watcher_stop.store(true, Ordering::Release);
    if let Some(t) = watcher {
        let _ = t.join();
    }
    let replica = leadership.replica.get().cloned();
    // The loop's reference goes first: the replica closes the engine.
    let engine = engine.map(drop);
    let (stopped, reinstall, refused) = replica.map_or((None, false, false), |r| {
        r.stop();
        (
            r.stopped_reason(),
            r.restart_to_install(),
            r.restart_after_refusal(),
        )
    });
    drop(raft_listener);
    if reinstall {
        // Everything this process held is closed (the engine by the loop's
        // drop, the listeners, the transport): the new image finishes the
        // install before it opens the engine (cluster.md section 8.4).
        return Ok(Served::Restart("to finish a snapshot's install"));
    }
    if refused && stopped.is_some() {
        // A round refused at the gate when leadership was lost, or a
        // committed round its engine refused while it may still count
        // one of its own: the new image recovers both logs and follows
        // the new leader (cluster.md section 5.1). Not after a failed
        // write: a broken disk would only fail again, so that one still
        // ends the process.
        return Ok(Served::Restart(
            "after a round refused when leadership was lost",
        ));
    }
    match stopped {
        Some(reason) => Err(format!("replica stopped: {reason}")),
        None => engine.map(|()| Served::Stopped),
    }
}

/// The set's members with their addresses, from the flags or the map.
fn replica_members(cluster: &ClusterConfig, listen: SocketAddr) -> Vec<Member> {
    let member = |id, cluster_addr: SocketAddr, client_addr: SocketAddr| Member {
        id,
        role: Role::Voter,
        cluster_addr: cluster_addr.to_string(),
        client_addr: client_addr.to_string(),
    };
    std::iter::once(member(cluster.node_id, cluster.listen, listen))
        .chain(
            cluster
                .peers
                .iter()
                .map(|p| member(p.id, p.peer_addr, p.client_addr)),
        )
        .collect()
}

/// The watcher's loop: a replica that stopped on an error shuts the node
/// down.
fn watch(
    leadership: &ReplicaLeadership,
    shutdown: &Shutdown,
    stop: &std::sync::atomic::AtomicBool,
) {
    while !stop.load(std::sync::atomic::Ordering::Acquire) {
        if let Some(reason) = leadership.replica.get().and_then(|r| r.stopped_reason()) {
            if leadership
                .replica
                .get()
                .is_some_and(|r| r.restart_to_install() || r.restart_after_refusal())
            {
                log::warn!("{reason}: the node stops serving and starts again");
            } else {
                log::error!("replica stopped: {reason}; the node shuts down");
            }
            shutdown.request();
            return;
        }
        std::thread::sleep(WATCH_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every role and progress state the replica reports is one STATS
    /// names (`raft.role.{role}`, `raft.peer_{peer}.progress.{state}`).
    #[test]
    fn the_replicas_roles_and_states_are_the_stats_names() {
        use tidemark_cluster::{NodeRole, Progress};
        let roles: Vec<&str> = NodeRole::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(roles, tidemark_node::RAFT_ROLES);
        let states: Vec<&str> = Progress::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(states, tidemark_node::RAFT_PROGRESS_STATES);
    }

    #[test]
    fn peers_parse_and_bad_ones_are_refused() {
        assert_eq!(
            parse_peer("2=127.0.0.1:7102,127.0.0.1:7002"),
            Ok(Peer {
                id: 2,
                peer_addr: "127.0.0.1:7102".parse().unwrap(),
                client_addr: "127.0.0.1:7002".parse().unwrap(),
            })
        );
        for bad in [
            "",
            "2",
            "2=127.0.0.1:7102",
            "0=127.0.0.1:1,127.0.0.1:2",
            "x=127.0.0.1:1,127.0.0.1:2",
            "2=host,127.0.0.1:2",
        ] {
            assert!(parse_peer(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_node_with_a_map_finds_its_set_and_peers_there() {
        let example = std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/cluster-map.example.toml"
        ));
        let with_map = |node_id, peers: Vec<Peer>| ClusterArgs {
            node_id,
            listen: None,
            peers,
            raft_log_max_bytes: 0,
            map: Some(example.clone()),
            join: false,
            token_file: None,
            insecure: true,
        };
        let c = with_map(Some(2), vec![])
            .check()
            .expect("node 2 of the example")
            .expect("a replica set member");
        assert_eq!(
            c.listen,
            "127.0.0.1:7102".parse().unwrap(),
            "its map address"
        );
        assert_eq!(c.peers.iter().map(|p| p.id).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(c.shards.as_ref().map(|s| s.own_set), Some(1));
        let alone = with_map(Some(4), vec![]).check().unwrap().unwrap();
        assert!(alone.peers.is_empty(), "a set of one");
        let peer = parse_peer("2=127.0.0.1:7102,127.0.0.1:7002").unwrap();
        for bad in [
            with_map(None, vec![]),
            with_map(Some(9), vec![]),
            with_map(Some(1), vec![peer]),
            ClusterArgs {
                map: Some("/nonexistent/map.toml".into()),
                ..with_map(Some(1), vec![])
            },
        ] {
            assert!(bad.clone().check().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_cluster_flags_come_all_together_or_not_at_all() {
        let peer = parse_peer("2=127.0.0.1:7102,127.0.0.1:7002").unwrap();
        let listen = Some("127.0.0.1:7101".parse().unwrap());
        assert!(ClusterArgs::default().check().unwrap().is_none());
        let full = ClusterArgs {
            node_id: Some(1),
            listen,
            peers: vec![peer.clone()],
            raft_log_max_bytes: 0,
            map: None,
            join: false,
            token_file: None,
            insecure: true,
        };
        // 0 (unset) is the default bound; a value given is kept.
        let checked = full.clone().check().unwrap().unwrap();
        assert_eq!(
            checked.raft_log_max_bytes,
            tidemark_cluster::RAFT_LOG_MAX_BYTES_DEFAULT
        );
        let small = ClusterArgs {
            raft_log_max_bytes: 4096,
            ..full.clone()
        };
        assert_eq!(small.check().unwrap().unwrap().raft_log_max_bytes, 4096);
        for partial in [
            ClusterArgs {
                node_id: None,
                ..full.clone()
            },
            ClusterArgs {
                listen: None,
                ..full.clone()
            },
            ClusterArgs {
                peers: vec![],
                ..full.clone()
            },
            ClusterArgs {
                node_id: Some(0),
                ..full.clone()
            },
            ClusterArgs {
                node_id: Some(2),
                ..full.clone()
            },
            ClusterArgs {
                peers: vec![peer.clone(), peer],
                ..full
            },
        ] {
            assert!(partial.clone().check().is_err(), "{partial:?} accepted");
        }
    }

    /// A member needs the set's secret (or says it runs without one);
    /// the file's bytes are the secret, never shown.
    #[test]
    fn a_member_without_a_cluster_secret_refuses_to_start() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write");
            Some(path)
        };
        let member = ClusterArgs {
            node_id: Some(1),
            listen: Some("127.0.0.1:7101".parse().unwrap()),
            peers: vec![parse_peer("2=127.0.0.1:7102,127.0.0.1:7002").unwrap()],
            ..ClusterArgs::default()
        };
        let e = member.clone().check().expect_err("no secret");
        assert!(e.contains("--cluster-token-file"), "{e}");
        let good = ClusterArgs {
            token_file: file("token", "a secret of at least sixteen bytes\n"),
            ..member.clone()
        };
        let checked = good.check().unwrap().unwrap();
        assert!(!checked.secret.is_insecure());
        assert!(
            !format!("{checked:?}").contains("sixteen"),
            "the secret shown"
        );
        let insecure = ClusterArgs {
            insecure: true,
            ..member.clone()
        };
        assert!(insecure.check().unwrap().unwrap().secret.is_insecure());
        for bad in [
            ClusterArgs {
                token_file: file("short", "short\n"),
                ..member.clone()
            },
            ClusterArgs {
                token_file: file("both", "a secret of at least sixteen bytes"),
                insecure: true,
                ..member.clone()
            },
            ClusterArgs {
                token_file: Some(dir.path().join("missing")),
                ..member.clone()
            },
            ClusterArgs {
                insecure: true,
                ..ClusterArgs::default()
            },
        ] {
            assert!(bad.clone().check().is_err(), "{bad:?} accepted");
        }
    }
}
