//! A replica of a replica set (format-spec/cluster.md sections 1-6): a
//! raft-rs `RawNode` over the durable [`RaftLog`], driven by one thread of
//! its own (the *driver*), with the engine as the state machine of
//! committed rounds.
//!
//! The driver's loop: take Raft messages and the gate's proposals from one
//! channel, tick every `tick`, handle raft-rs's `Ready` (messages a leader
//! may send at once; the entries and hard state persisted with one write
//! and one fdatasync; then the messages that needed them durable), and
//! apply committed entries in index order (cluster.md section 4): a round
//! the engine has is skipped, the round this leader's commit thread waits
//! for at the gate is answered "committed" (the commit thread writes it),
//! any other goes through `Engine::try_append_replicated`. A round the
//! engine cannot take yet (`NotReady`: a job of its maintenance worker
//! first, such as a lookup in its saved state while it loads, or a
//! group's send state) is *parked*: nothing was written, the driver goes
//! on ticking and answering Raft, and hands the same round over again once
//! the job's ticket is settled (the engine's commit listener wakes it);
//! the entries after it wait, so rounds apply in index order, each once,
//! and the driver never reads the engine's files. After each turn it
//! compacts the Raft log past its bound (cluster.md section 3.5) and, if
//! raft-rs asked for a snapshot, takes one of the engine for the log to
//! offer (section 8.1); a `MsgSnapshot` goes to the transport with the
//! engine snapshot, and a snapshot in a `Ready` is installed (section
//! 8.3: staged, the log reset, the engine swapped and reopened; if a
//! node's loop holds the engine, the replica stops so that the node's
//! restart finishes the swap).
//! Last in each turn it publishes the replica's health (`health.rs`:
//! role, indexes, followers' progress, counters) for [`Replica::health`].
//!
//! The gate ([`RoundGate`] of the engine) is *open* while this node is the
//! leader and has applied its log up to its term's first entry (cluster.md
//! section 5); only then do [`Replica::write`] and the gate's proposals go
//! through. It is changed only by the driver, under its lock, and the gate
//! hands a payload to the driver under the same lock, so that once the
//! driver closed it and drained its channel, no proposal waits unanswered.
//!
//! Invariants: the engine holds only committed rounds; at most one round of
//! this node's own is in flight (proposed, or committed and being written
//! by the commit thread); a round the gate refused stops the engine's
//! writes, and the driver reopens the engine before it applies anything
//! more (a reopen rebuilds every send state from committed rounds): the
//! driver marks a refusal before it answers one, so that no committed
//! entry reaches that engine in between, and a committed entry an engine
//! that led refuses as not continuing its send states is taken for such
//! a refusal (its round had ids but had not reached the gate yet).
//!
//! Threads: the driver; the engine's own; the callers of
//! [`Replica::write`] and [`Replica::read`] (any thread), and a node's
//! event loop serving [`Replica::engine`] (which parks rather than waits,
//! and checks [`Replica::is_writable`] before a write). Locks: the engine slot
//! (`RwLock`, written only by the driver to reopen or stop the engine, after
//! the gate is closed so that no holder of a read lock waits for the
//! driver), then the gate state (a leaf); the published health is a leaf
//! too, which the driver only try-locks.
//!
//! Costs per round: one proposal, the Raft log's write and fdatasync on a
//! majority, then the engine's journal write (and fdatasync under
//! `fsync=always`) on every replica. Per loop turn: the inputs that came
//! (at most [`INPUTS_PER_TURN`] before a `Ready`), one `Ready`, the entries
//! newly committed, at most one tick's worth of applying (a backlog goes
//! on in the next turns, which then do not wait for inputs).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use raft::eraftpb::Message;
use raft::{RawNode, StateRole};
use tidemark_engine::{Engine, RoundGate};

use crate::error::{ClusterError, Result};
use crate::health::{Health, Tracker};
use crate::members::{Change, ChangeRefused, ChangeReply, KnownPeers, Member, Members, Role};
use crate::raft_log::RaftLog;

/// Inputs the driver takes in one turn before it handles a `Ready`.
pub const INPUTS_PER_TURN: usize = 256;
/// An offered snapshot Raft did not send within this long is dropped (a
/// new one is taken when Raft asks again).
const OFFER_UNUSED_MAX: Duration = Duration::from_secs(10);

/// Where a replica's Raft messages go. Messages may be lost, duplicated or
/// reordered (Raft tolerates all three); `send` never blocks for long.
pub trait Transport: Send + 'static {
    fn send(&self, msg: Message);

    /// The other members and their cluster addresses, after a membership
    /// change applied or at start (cluster.md section 11): messages to a
    /// member not named are dropped from now on. An empty address means
    /// "not known": whatever the transport had for that member is kept.
    fn set_peers(&self, peers: &[(u64, String)]);

    /// Sends a `MsgSnapshot` with the files of `snapshot` (cluster.md
    /// section 8.2), off the caller's thread: `done(true)` once the whole
    /// stream was written, `done(false)` if it could not be. The receiver
    /// hands the message to its replica only once the files are durable
    /// there ([`Mailbox::receive_snapshot`]).
    fn send_snapshot(
        &self,
        msg: Message,
        snapshot: Arc<tidemark_engine::Snapshot>,
        done: Box<dyn FnOnce(bool) + Send>,
    );
}

/// A replica's configuration.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    /// This node's id in the replica set (non-zero).
    pub id: u64,
    /// Every voter of the replica set, this node included, with their
    /// addresses: the membership a brand-new directory starts with
    /// (cluster.md section 11.2); afterwards the durable membership in the
    /// Raft log wins. Empty: a node that waits to be added
    /// (`serve --cluster-join`).
    pub members: Vec<Member>,
    /// The replica's directory: `engine/` and `raft/` (cluster.md section 2).
    pub dir: PathBuf,
    /// The engine's configuration; its `data_dir` is set to `dir/engine`.
    /// Its limits must be equal on every replica, and its fsync policy
    /// `always` (cluster.md section 4.2).
    pub engine: tidemark_engine::Config,
    /// One Raft tick.
    pub tick: Duration,
    /// Ticks without a leader's word before a follower campaigns (raft-rs
    /// randomises it in `[election_ticks, 2 * election_ticks)`).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// The Raft log file's bound in bytes (cluster.md section 3.5): past
    /// it the log drops what the engine holds durably, keeping for a
    /// lagging follower at most half of it (beyond, it gets a snapshot).
    pub raft_log_max_bytes: u64,
}

/// Default of [`ReplicaConfig::raft_log_max_bytes`]: 64 MiB.
pub const RAFT_LOG_MAX_BYTES_DEFAULT: u64 = 64 << 20;

/// Default of [`ReplicaConfig::election_ticks`]: 100 ticks of 10 ms, so a
/// follower campaigns after 1-2 s without a leader's word (cluster.md
/// section 5.3). A driver thread writes and fdatasyncs (the Raft log; on
/// a follower, each applied round's engine journal too) between the
/// messages it answers; on a loaded machine whose replicas share a disk,
/// one such fdatasync behind an engine checkpoint's writes was seen to
/// take hundreds of milliseconds on every replica at once, and at 100-200
/// ms that deposed working leaders: the timeout must be well above the
/// longest write a healthy node makes, at the cost of a slower failover.
pub const ELECTION_TICKS_DEFAULT: usize = 100;

impl ReplicaConfig {
    /// Defaults: 10 ms ticks, elections after 1-2 s
    /// ([`ELECTION_TICKS_DEFAULT`]), heartbeats every 20 ms.
    pub fn new(id: u64, voters: &[u64], dir: impl Into<PathBuf>) -> ReplicaConfig {
        let dir = dir.into();
        ReplicaConfig {
            id,
            members: Members::voters(0, voters).list,
            engine: tidemark_engine::Config::new(dir.join("engine")),
            dir,
            tick: Duration::from_millis(10),
            election_ticks: ELECTION_TICKS_DEFAULT,
            heartbeat_ticks: 2,
            raft_log_max_bytes: RAFT_LOG_MAX_BYTES_DEFAULT,
        }
    }
}

/// What the driver's channel carries.
enum Input {
    Raft(Message),
    /// The gate's payload and where its answer goes.
    Propose {
        payload: Vec<u8>,
        reply: Sender<std::result::Result<(), String>>,
    },
    /// The engine completed a round (the driver may wait for one).
    Wake,
    /// Read tickets wait for a leadership confirmation (`reads.rs`).
    Read,
    /// A snapshot stream to `to` ended: written whole (`ok`) or not.
    SnapshotSent {
        to: u64,
        ok: bool,
    },
    /// A membership change a client asked for.
    Change {
        change: Change,
        reply: ChangeReply,
    },
    Stop {
        crash: bool,
    },
    /// Tests: the driver stops for a while, as a process under SIGSTOP
    /// does (no tick, no message handled; its channel fills meanwhile).
    #[cfg(test)]
    Pause(Duration),
}

/// Hands Raft messages from the transport to a replica.
#[derive(Clone)]
pub struct Mailbox {
    tx: Sender<Input>,
    /// The replica's id, the members it admits messages from and its
    /// snapshot inbox, for snapshot streams and the transport's receivers.
    id: u64,
    peers: KnownPeers,
    inbox: Arc<crate::snapshot::Inbox>,
}

impl Mailbox {
    /// Delivers a message (dropped if the replica stopped).
    pub fn deliver(&self, msg: Message) {
        let _ = self.tx.send(Input::Raft(msg));
    }

    /// Reads a snapshot stream (after its preamble) from node `from` (the
    /// connection's authenticated peer, cluster.md section 7.1) into the
    /// replica's directory, then delivers its `MsgSnapshot` (section 8.2).
    /// A stream whose Begin names another sender, or from a node this
    /// replica does not admit, is refused before anything is staged; so
    /// is a second stream, or one of a snapshot not newer than any staged
    /// or installed (`snapshot::Inbox`: one stream at a time).
    /// Costs: the snapshot's bytes written and fsynced on the caller's
    /// thread (a transport's reader, never the driver).
    pub fn receive_snapshot(&self, r: &mut impl std::io::Read, from: u64) -> Result<()> {
        if !self.peers.admits(from) {
            return Err(ClusterError::Stopped {
                reason: format!("a snapshot stream from node {from}, not a member, refused"),
            });
        }
        // The stream's Begin must name the sender itself.
        let sender = KnownPeers::new(vec![from]);
        let msg = crate::snapshot::receive(r, &self.inbox, self.id, &sender)?;
        self.deliver(msg);
        Ok(())
    }

    /// Whether messages from node `from` are taken: a member's, or any
    /// while this node waits to be added (it knows no member yet).
    pub fn admits(&self, from: u64) -> bool {
        self.peers.admits(from)
    }
}

/// Tests of transports: a mailbox of no replica, and what it was handed.
#[cfg(test)]
pub(crate) struct DetachedInbox(Receiver<Input>);

#[cfg(test)]
impl Mailbox {
    /// The mailbox of a node `id` admitting `peers` (empty: any), with
    /// directory `dir`, whose messages arrive in the inbox returned.
    pub(crate) fn detached(id: u64, peers: Vec<u64>, dir: PathBuf) -> (Mailbox, DetachedInbox) {
        let (tx, rx) = channel();
        let mailbox = Mailbox {
            tx,
            id,
            peers: KnownPeers::new(peers),
            inbox: Arc::new(crate::snapshot::Inbox::new(&dir, 0, 0)),
        };
        (mailbox, DetachedInbox(rx))
    }
}

#[cfg(test)]
impl DetachedInbox {
    /// The messages delivered so far, waiting up to `wait` for the first.
    pub(crate) fn messages(&self, wait: Duration) -> Vec<Message> {
        let mut out = Vec::new();
        let mut next = self.0.recv_timeout(wait).ok();
        while let Some(input) = next {
            if let Input::Raft(m) = input {
                out.push(m);
            }
            next = self.0.try_recv().ok();
        }
        out
    }
}

/// The gate's state, a leaf lock (module docs).
struct GateState {
    open: bool,
    leader: Option<u64>,
    inbox: Sender<Input>,
}

/// The engine's round gate: the leader's payloads go to the driver.
struct Gate {
    state: Mutex<GateState>,
    /// The gate refused a round since the driver last looked: the engine
    /// stopped its writes and must be reopened.
    refused: AtomicBool,
    /// Tests: how long the commit thread takes, after a refusal reached
    /// it, to mark it (a thread descheduled at that moment).
    #[cfg(test)]
    refusal_delay: Mutex<Duration>,
}

impl RoundGate for Gate {
    fn replicate(&self, payload: &[u8]) -> std::result::Result<(), String> {
        let result = self.ask_driver(payload);
        if result.is_err() {
            #[cfg(test)]
            std::thread::sleep(*self.refusal_delay.lock());
            self.refused.store(true, Ordering::Release);
        }
        result
    }
}

impl Gate {
    fn ask_driver(&self, payload: &[u8]) -> std::result::Result<(), String> {
        let (tx, rx) = channel();
        {
            let st = self.state.lock();
            if !st.open {
                return Err("not the leader".into());
            }
            st.inbox
                .send(Input::Propose {
                    payload: payload.to_vec(),
                    reply: tx,
                })
                .map_err(|_| "replica stopped".to_string())?;
        }
        rx.recv()
            .unwrap_or_else(|_| Err("replica stopped".to_string()))
    }
}

/// What the driver and the callers share.
struct Shared {
    /// `None` only while the driver reopens the engine, and once stopped.
    /// Others may hold the engine too ([`Replica::engine`]: a node's event
    /// loop); the driver reopens it only when it holds the last reference.
    engine: RwLock<Option<Arc<Engine>>>,
    /// The driver waits for the commit thread to write a round: the commit
    /// listener wakes it.
    awaiting: AtomicBool,
    /// The driver waits for the engine's maintenance worker to settle the
    /// ticket of a parked round (`Driver::parked`): the commit listener,
    /// told after every such job, wakes it.
    parked: AtomicBool,
    /// Why the driver stopped, if it did.
    stopped: Mutex<Option<String>>,
    /// The driver stopped to finish a snapshot's install (cluster.md
    /// section 8.3): the Raft log starts at the snapshot, and the engine
    /// directory is swapped at the next start ([`Replica::start`]).
    restart_to_install: AtomicBool,
    /// The driver stopped because the gate refused a round (leadership
    /// lost) while a node serves the engine (cluster.md section 5.1): a
    /// restart recovers both logs; not set for a failed write.
    restart_after_refusal: AtomicBool,
    /// Snapshots this replica installed since it started.
    snapshots_installed: std::sync::atomic::AtomicU64,
    /// The Raft log's first index (its start + 1), as the driver last set it.
    log_first_index: std::sync::atomic::AtomicU64,
    /// The membership as last applied (a copy of the Raft log's).
    members: Mutex<Members>,
    /// Read tickets and their confirmations (`reads.rs`).
    reads: crate::reads::Reads,
    /// The health the driver publishes once per turn (`health.rs`).
    health: Arc<Mutex<Health>>,
}

/// A running replica (module docs).
pub struct Replica {
    id: u64,
    mailbox: Mailbox,
    shared: Arc<Shared>,
    gate: Arc<Gate>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Replica {
    /// Opens the replica's Raft log and engine in `cfg.dir` (recovering
    /// both after a crash) and starts its driver, which sends through
    /// `transport`.
    pub fn start(cfg: ReplicaConfig, transport: impl Transport) -> Result<Replica> {
        if cfg.engine.fsync != tidemark_engine::FsyncPolicy::Always {
            // A round the engine loses after its commit would be a hole in
            // its rounds (cluster.md section 4.2): not until the Raft log
            // keeps entries back to the last checkpoint (section 10).
            return Err(ClusterError::Stopped {
                reason: format!(
                    "a replica's engine needs fsync=always, not {:?}",
                    cfg.engine.fsync
                ),
            });
        }
        let mut engine_config = cfg.engine.clone();
        engine_config.data_dir = cfg.dir.join(crate::snapshot::ENGINE_DIR);
        let configured: Vec<u64> = cfg.members.iter().map(|m| m.id).collect();
        let mut log = RaftLog::open(&cfg.dir.join("raft"), &configured)?;
        settle_membership(&mut log, &cfg)?;
        // An install a crash (or the node's restart, section 8.3) left
        // half done is finished if the Raft log committed it, else dropped.
        crate::snapshot::recover(&cfg.dir, log.start())?;
        // Every entry up to the log's start is in the engine, durably.
        let applied = log.start().0;
        let inbox = Arc::new(crate::snapshot::Inbox::new(
            &cfg.dir,
            applied,
            cfg.engine.disk_free_min_bytes,
        ));
        let raft_config = raft::Config {
            id: cfg.id,
            election_tick: cfg.election_ticks,
            heartbeat_tick: cfg.heartbeat_ticks,
            // A leader cut from a majority steps down by itself, and a
            // node back from a partition does not depose a working leader.
            check_quorum: true,
            pre_vote: true,
            // Reads are confirmed by a heartbeat round, not a lease
            // (`reads.rs`, cluster.md section 5.2).
            read_only_option: raft::ReadOnlyOption::Safe,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            // Applied progress is the driver's (`applied`), from 0: rounds
            // the engine has are skipped by their round index.
            applied: 0,
            ..Default::default()
        };
        raft_config.validate().map_err(|e| ClusterError::Stopped {
            reason: format!("raft configuration: {e}"),
        })?;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&raft_config, log, &logger).map_err(|e| ClusterError::Stopped {
            reason: format!("raft: {e}"),
        })?;
        let health = Tracker::new(&raw, applied);
        let (tx, rx) = channel();
        let gate = Arc::new(Gate {
            state: Mutex::new(GateState {
                open: false,
                leader: None,
                inbox: tx.clone(),
            }),
            refused: AtomicBool::new(false),
            #[cfg(test)]
            refusal_delay: Mutex::new(Duration::ZERO),
        });
        let shared = Arc::new(Shared {
            engine: RwLock::new(None),
            awaiting: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            stopped: Mutex::new(None),
            restart_to_install: AtomicBool::new(false),
            restart_after_refusal: AtomicBool::new(false),
            snapshots_installed: std::sync::atomic::AtomicU64::new(0),
            log_first_index: std::sync::atomic::AtomicU64::new(applied + 1),
            members: Mutex::new(raw.store().members().clone()),
            reads: Default::default(),
            health: health.published(),
        });
        let peers = KnownPeers::new(raw.store().members().ids());
        if !raw.store().members().list.is_empty() {
            // A node waiting to be added keeps the addresses its transport
            // was made with: the set's members, which it must answer.
            transport.set_peers(&peer_addrs(raw.store().members(), cfg.id));
        }
        let engine = open_engine(&engine_config, &gate, &shared, &tx)?;
        *shared.engine.write() = Some(Arc::new(engine));
        let mut driver = Driver {
            raw,
            inbox: rx,
            deferred: VecDeque::new(),
            wake: tx.clone(),
            transport: Box::new(transport),
            shared: shared.clone(),
            gate: gate.clone(),
            engine_config,
            snapshots: inbox.clone(),
            raft_log_max_bytes: cfg.raft_log_max_bytes,
            tick: cfg.tick,
            election_after: cfg
                .tick
                .saturating_mul(u32::try_from(cfg.election_ticks).unwrap_or(u32::MAX)),
            applied,
            want_snapshot: false,
            offer: None,
            compact_check_at: 0,
            term_start: None,
            pending: None,
            awaiting: None,
            parked: None,
            peers: peers.clone(),
            change: None,
            own_rounds: false,
            health,
        };
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("tidemark-raft-{}", cfg.id))
            .spawn(move || {
                let (crash, result) = match driver.run() {
                    Ok(crash) => (crash, Ok(())),
                    Err(e) => (false, Err(e)),
                };
                driver.shut_down(crash);
                if let Err(e) = result {
                    if thread_shared.restart_to_install.load(Ordering::Acquire)
                        || thread_shared.restart_after_refusal.load(Ordering::Acquire)
                    {
                        log::warn!("replica {}: {e}", cfg.id);
                    } else {
                        log::error!("replica {}: {e}", cfg.id);
                    }
                    *thread_shared.stopped.lock() = Some(e.to_string());
                }
            })
            .map_err(|e| ClusterError::io("spawn the raft driver", e))?;
        Ok(Replica {
            id: cfg.id,
            mailbox: Mailbox {
                tx,
                id: cfg.id,
                peers,
                inbox,
            },
            shared,
            gate,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Where the transport delivers this replica's messages.
    pub fn mailbox(&self) -> Mailbox {
        self.mailbox.clone()
    }

    /// Whether this node accepts writes now (leader, writes gate open).
    pub fn is_writable(&self) -> bool {
        self.gate.state.lock().open
    }

    /// The leader as this node last heard (itself included).
    pub fn leader(&self) -> Option<u64> {
        self.gate.state.lock().leader
    }

    /// Runs a write (send, group or member operation) on this node's engine
    /// if it is the leader with its writes gate open, else `NotLeader`.
    /// The engine answers once the round is committed, written and applied;
    /// a round the gate refused is `Engine(WritesStopped)`: outcome
    /// unknown, retry on the leader with the same client_msg_id.
    pub fn write<T>(&self, f: impl FnOnce(&Engine) -> tidemark_engine::Result<T>) -> Result<T> {
        {
            let st = self.gate.state.lock();
            if !st.open {
                return Err(ClusterError::NotLeader { leader: st.leader });
            }
        }
        let slot = self.shared.engine.read();
        let engine = slot.as_ref().ok_or_else(|| self.stopped())?;
        f(engine).map_err(ClusterError::Engine)
    }

    /// Runs a read on this node's engine, whatever its role: it sees
    /// committed rounds only, but a follower's may be behind the leader's
    /// (follower reads that never go back in time are a later step).
    pub fn read<T>(&self, f: impl FnOnce(&Engine) -> T) -> Result<T> {
        let slot = self.shared.engine.read();
        let engine = slot.as_ref().ok_or_else(|| self.stopped())?;
        Ok(f(engine))
    }

    /// The engine, for a caller that serves it (a node's event loop): its
    /// reads see committed rounds only; its writes go through only on a
    /// leader whose gate is open ([`Replica::is_writable`], checked first:
    /// a write the gate refuses stops the engine's writes). While someone
    /// holds it, the driver cannot reopen it: a round the gate refused
    /// then stops the replica (`stopped_reason`), and the node must be
    /// restarted (cluster.md section 5). `None` once stopped.
    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.shared.engine.read().clone()
    }

    /// Why the replica stopped, if its driver ended on an error.
    pub fn stopped_reason(&self) -> Option<String> {
        self.shared.stopped.lock().clone()
    }

    /// Whether the replica stopped to finish a snapshot's install: the
    /// engine it served is stale, and the install completes when the
    /// replica starts again (cluster.md section 8.3; a node restarts
    /// itself).
    pub fn restart_to_install(&self) -> bool {
        self.shared.restart_to_install.load(Ordering::Acquire)
    }

    /// The membership as this replica last applied it.
    pub fn members(&self) -> Members {
        self.shared.members.lock().clone()
    }

    /// Asks for a membership change (cluster.md section 11.4): answered
    /// through `reply`, on the driver's thread, once the change is
    /// committed and applied (an add: once the new node is a voter), or
    /// refused.
    pub fn change_members(&self, change: Change, reply: ChangeReply) {
        if let Err(e) = self.mailbox.tx.send(Input::Change { change, reply }) {
            if let Input::Change { reply, .. } = e.0 {
                reply(Err(ChangeRefused::Interrupted {
                    reason: "the replica stopped".into(),
                }));
            }
        }
    }

    /// Whether the replica stopped because a round was refused at the
    /// gate when leadership was lost, while a node held the engine: the
    /// node restarts itself (cluster.md section 5.1). False for a failed
    /// write, which a restart would not cure.
    pub fn restart_after_refusal(&self) -> bool {
        self.shared.restart_after_refusal.load(Ordering::Acquire)
    }

    /// A read ticket (`reads.rs`): the read's answer may be given once
    /// [`Replica::reads_settled`] confirms it; the driver is told at once
    /// and confirms every ticket taken meanwhile with one heartbeat round.
    /// Non-blocking.
    pub fn read_ticket(&self) -> u64 {
        let (ticket, poke) = self.shared.reads.ticket();
        if poke {
            let _ = self.mailbox.tx.send(Input::Read);
        }
        ticket
    }

    /// Which read tickets are confirmed or failed. One leaf lock.
    pub fn reads_settled(&self) -> crate::reads::ReadsSettled {
        self.shared.reads.settled()
    }

    /// Called on the driver's thread whenever read tickets were confirmed
    /// or failed (a node's event loop wakes itself with it).
    pub fn on_reads(&self, f: crate::reads::ReadsListener) {
        self.shared.reads.set_listener(f);
    }

    /// This replica's role, term, indexes, followers and counters as its
    /// driver last published them (at most a turn old: a tick, 10 ms by
    /// default). One leaf lock and a copy of a few members; never waits
    /// for the driver.
    pub fn health(&self) -> Health {
        self.shared.health.lock().clone()
    }

    /// Snapshots this replica installed since it started.
    pub fn snapshots_installed(&self) -> u64 {
        self.shared.snapshots_installed.load(Ordering::Acquire)
    }

    /// The Raft log's first index: entries before it were compacted (or
    /// came in a snapshot).
    pub fn log_first_index(&self) -> u64 {
        self.shared.log_first_index.load(Ordering::Acquire)
    }

    fn stopped(&self) -> ClusterError {
        ClusterError::Stopped {
            reason: self
                .stopped_reason()
                .unwrap_or_else(|| "the engine is being reopened or the replica stopped".into()),
        }
    }

    /// Stops the driver and closes the engine (a clean shutdown).
    pub fn stop(&self) {
        self.end(false);
    }

    /// Stops the driver and drops the engine as a crash would
    /// (`Engine::simulate_crash`): only what reached the files remains.
    #[cfg(test)]
    pub fn crash(&self) {
        self.end(true);
    }

    /// Delays the commit thread's own mark of a refused round by `d`
    /// (`Gate::refusal_delay`).
    #[cfg(test)]
    pub fn delay_refusals(&self, d: Duration) {
        *self.gate.refusal_delay.lock() = d;
    }

    /// Pauses the driver for `d` (module docs of `Input::Pause`).
    #[cfg(test)]
    pub fn pause(&self, d: Duration) {
        let _ = self.mailbox.tx.send(Input::Pause(d));
    }

    fn end(&self, crash: bool) {
        let _ = self.mailbox.tx.send(Input::Stop { crash });
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// Whether the maintenance worker's job of `ticket` (from a round's
/// `NotReady`) is done: every job up to it, or, for the whole saved
/// state's ticket, the background load.
fn ticket_settled(engine: &Engine, ticket: u64) -> bool {
    if ticket == tidemark_engine::STATE_TICKET {
        engine.state_load_settled()
    } else {
        engine.settled_load() >= ticket
    }
}

/// Opens the engine with the gate, its commit listener waking the driver
/// while it waits for the commit thread or for the maintenance worker.
fn open_engine(
    config: &tidemark_engine::Config,
    gate: &Arc<Gate>,
    shared: &Arc<Shared>,
    wake: &Sender<Input>,
) -> Result<Engine> {
    let engine = Engine::open_gated(config.clone(), gate.clone())?;
    let wake = Mutex::new(wake.clone());
    let weak = Arc::downgrade(shared);
    engine.add_commit_listener(Arc::new(move |_| {
        if weak
            .upgrade()
            .is_some_and(|s| s.awaiting.load(Ordering::Acquire) || s.parked.load(Ordering::Acquire))
        {
            let _ = wake.lock().send(Input::Wake);
        }
    }));
    Ok(engine)
}

/// Makes the Raft log's membership the one to use (cluster.md section
/// 11.2): a brand-new log is bootstrapped with the configured members (none:
/// a node waiting to be added, which writes nothing); a log written before
/// membership was recorded records the configured voters; a recorded one
/// wins over the configuration, with a warning if they differ.
fn settle_membership(log: &mut RaftLog, cfg: &ReplicaConfig) -> Result<()> {
    let brand_new = log.last() == 0 && *log.hard_state() == raft::eraftpb::HardState::default();
    if log.members_recorded() {
        let durable = log.members().ids();
        let mut configured: Vec<u64> = cfg.members.iter().map(|m| m.id).collect();
        configured.sort_unstable();
        if !cfg.members.is_empty() && durable != configured {
            log::warn!(
                "node {}: the replica set's members are {durable:?} (its Raft log), not the \
                 configured {configured:?}: the Raft log's are used",
                cfg.id
            );
        }
        return Ok(());
    }
    if cfg.members.is_empty() {
        return Ok(());
    }
    let mut members = cfg.members.clone();
    members.sort_by_key(|m| m.id);
    if brand_new {
        return log.bootstrap(&members);
    }
    let index = log.start().0;
    log.set_members(Members {
        index,
        list: members,
    })
}

/// The members other than `me` with their cluster addresses.
fn peer_addrs(members: &Members, me: u64) -> Vec<(u64, String)> {
    members
        .list
        .iter()
        .filter(|m| m.id != me)
        .map(|m| (m.id, m.cluster_addr.clone()))
        .collect()
}

/// A membership change under way on this leader (cluster.md section 11.4).
struct ChangeInFlight {
    change: Change,
    reply: ChangeReply,
    /// The ConfChange entry proposed for it and not applied yet.
    proposed: Option<u64>,
    /// An add whose learner entry applied at this index: the node is
    /// promoted once it holds the log up to there.
    admitted: Option<u64>,
}

/// This leader's round in flight: proposed at `index` in `term`.
struct Pending {
    index: u64,
    term: u64,
    reply: Sender<std::result::Result<(), String>>,
}

/// The driver thread's state (module docs).
struct Driver {
    raw: RawNode<RaftLog>,
    inbox: Receiver<Input>,
    /// Inputs taken from the channel while the gate closed (section in
    /// `close_gate`), handled before new ones.
    deferred: VecDeque<Input>,
    wake: Sender<Input>,
    transport: Box<dyn Transport>,
    shared: Arc<Shared>,
    gate: Arc<Gate>,
    engine_config: tidemark_engine::Config,
    /// Received snapshots (cluster.md section 8.2), shared with the
    /// transport's readers.
    snapshots: Arc<crate::snapshot::Inbox>,
    raft_log_max_bytes: u64,
    tick: Duration,
    /// The shortest silence after which a follower campaigns (and a leader
    /// that heard from no quorum steps down): a turn's disk work that
    /// takes half of it is logged.
    election_after: Duration,
    /// raft-rs asked for a snapshot and none is offered yet.
    want_snapshot: bool,
    /// The engine snapshot the Raft log offers (`RaftLog::offer`), by its
    /// Raft index, and when it was taken; handed to the transport with the
    /// `MsgSnapshot`s.
    offer: Option<(u64, Arc<tidemark_engine::Snapshot>, Instant)>,
    /// The Raft log file's length at which compaction is looked at again
    /// after a look that found nothing worth doing.
    compact_check_at: u64,
    /// Every committed entry up to this index is applied (or skipped).
    applied: u64,
    /// While leader: its term and the index of the term's first entry.
    term_start: Option<(u64, u64)>,
    pending: Option<Pending>,
    /// A committed round of this leader's that its commit thread writes
    /// now: (Raft index, round index).
    awaiting: Option<(u64, u64)>,
    /// The ticket of the maintenance worker's job the next committed round
    /// waits for (module docs: a parked round); it is handed over again
    /// once the ticket is settled.
    parked: Option<u64>,
    /// The members the transport's receivers admit messages from.
    peers: KnownPeers,
    /// The membership change under way, on a leader.
    change: Option<ChangeInFlight>,
    /// The gate opened since the engine was (re)opened: the engine may
    /// have given msg_ids to a round of its own not committed (ids are
    /// assigned at submit, before the round reaches the gate), which a
    /// refusal will stop but which its send states count until a reopen.
    own_rounds: bool,
    /// What the health figures count and publish (`health.rs`).
    health: Tracker,
}

impl Driver {
    /// The loop (module docs); `Ok(crash)` when asked to stop.
    fn run(&mut self) -> Result<bool> {
        let mut next_tick = Instant::now() + self.tick;
        loop {
            // Committed entries left over by the last turn's apply budget
            // (`apply_committed`): no waiting for inputs then.
            let wait = if self.apply_behind() {
                Duration::ZERO
            } else {
                next_tick.saturating_duration_since(Instant::now())
            };
            let first = match self.deferred.pop_front() {
                Some(input) => Some(input),
                None => match self.inbox.recv_timeout(wait) {
                    Ok(input) => Some(input),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return Ok(false),
                },
            };
            if let Some(input) = first {
                if let Some(crash) = self.handle(input) {
                    return Ok(crash);
                }
                for _ in 1..INPUTS_PER_TURN {
                    let Some(input) = self
                        .deferred
                        .pop_front()
                        .or_else(|| self.inbox.try_recv().ok())
                    else {
                        break;
                    };
                    if let Some(crash) = self.handle(input) {
                        return Ok(crash);
                    }
                }
            }
            if Instant::now() >= next_tick {
                self.raw.tick();
                next_tick = Instant::now() + self.tick;
            }
            self.issue_reads();
            let began = Instant::now();
            self.on_ready()?;
            self.apply()?;
            self.snapshots
                .forget_below(self.raw.raft.raft_log.committed.min(self.applied))?;
            self.note_slow_turn(began.elapsed());
            self.promote();
            self.compact()?;
            self.make_offer()?;
            let installed = self.shared.snapshots_installed.load(Ordering::Acquire);
            self.health.turn(&self.raw, self.applied, installed);
        }
    }

    /// Logs a turn whose `Ready` and applying (writes and fdatasyncs)
    /// took half the election timeout or more: meanwhile this node
    /// answered no message and, as leader, sent no heartbeat; as long
    /// again, and a working leader may be deposed (cluster.md section 5.3).
    fn note_slow_turn(&self, took: Duration) {
        if took >= self.election_after / 2 {
            log::warn!(
                "node {}: a turn of writes and fdatasyncs took {} ms (term {}; elections \
                 start after {} ms without a leader's word)",
                self.raw.raft.id,
                took.as_millis(),
                self.raw.raft.term,
                self.election_after.as_millis()
            );
        }
    }

    /// Handles one input; `Some(crash)` to stop.
    fn handle(&mut self, input: Input) -> Option<bool> {
        match input {
            Input::Raft(m) => {
                self.health.heard_from(&self.raw, m.from);
                // Messages from unknown peers or stale terms are Raft's to
                // ignore; an error here is never this node's fault.
                if let Err(e) = self.raw.step(m) {
                    log::debug!("raft step: {e}");
                }
            }
            Input::Propose { payload, reply } => self.propose(payload, reply),
            Input::Wake | Input::Read => {}
            Input::SnapshotSent { to, ok } => {
                self.health.snapshot_send_ended(to, ok);
                let status = if ok {
                    raft::SnapshotStatus::Finish
                } else {
                    raft::SnapshotStatus::Failure
                };
                self.raw.report_snapshot(to, status);
            }
            Input::Change { change, reply } => self.start_change(change, reply),
            Input::Stop { crash } => return Some(crash),
            #[cfg(test)]
            Input::Pause(d) => std::thread::sleep(d),
        }
        None
    }

    /// Proposes a payload of this leader's commit thread (cluster.md
    /// section 4.1, step 2).
    fn propose(&mut self, payload: Vec<u8>, reply: Sender<std::result::Result<(), String>>) {
        let expected = {
            let slot = self.shared.engine.read();
            slot.as_ref().map(|e| e.last_round() + 1)
        };
        // The commit thread proposes its next round only after it wrote
        // the one awaited: that one is applied.
        if let (Some((index, round)), Some(next)) = (self.awaiting, expected) {
            if round < next {
                self.awaited(index);
            }
        }
        // Open, but maybe no longer leader: inputs of this turn may have
        // deposed it before the next `Ready` closes the gate. A follower's
        // raft-rs would forward the proposal to the leader, which could
        // commit it while this node took another entry at `last_index` for
        // it: a proposal is this leader's own entry or none, in the term
        // whose start it applied.
        let term = self.raw.raft.term;
        let open = self.gate.state.lock().open
            && self.raw.raft.state == StateRole::Leader
            && self.term_start.is_some_and(|(t, _)| t == term);
        if !open || self.pending.is_some() || self.awaiting.is_some() {
            return self.refuse_round(&reply, "not the leader".into());
        }
        let round = Engine::round_index_of(&payload);
        if expected.is_none() || round != expected {
            return self.refuse_round(
                &reply,
                format!("round {round:?} proposed, {expected:?} expected"),
            );
        }
        let before = self.raw.raft.raft_log.last_index();
        match self.raw.propose(vec![], payload) {
            Ok(()) => {
                let index = self.raw.raft.raft_log.last_index();
                let term = self.raw.raft.term;
                // Invariant: a leader appends a proposal to its own log.
                debug_assert_eq!(index, before + 1, "a leader's proposal is its next entry");
                self.pending = Some(Pending { index, term, reply })
            }
            Err(e) => self.refuse_round(&reply, format!("raft refused the proposal: {e}")),
        }
    }

    /// Answers a round of this leader's commit thread "not replicated":
    /// the engine stops its writes on it, and its send states count the
    /// round's ids until a reopen. Marked first, so that the driver never
    /// applies another leader's round to that engine in between
    /// (`apply_committed` reopens it first).
    fn refuse_round(&mut self, reply: &Sender<std::result::Result<(), String>>, why: String) {
        self.health.proposal_refused();
        self.gate.refused.store(true, Ordering::Release);
        let _ = reply.send(Err(why));
    }

    /// Asks raft-rs for a read index covering every read ticket taken
    /// since the last one (`reads.rs`), if this node is the leader with
    /// its writes gate open (raft-rs drops a read index of a leader that
    /// has not committed an entry of its term; the gate opens only after
    /// that); otherwise the tickets fail.
    fn issue_reads(&mut self) {
        let Some(ctx) = self.shared.reads.to_issue() else {
            return;
        };
        let term = self.raw.raft.term;
        let leads = self.gate.state.lock().open
            && self.raw.raft.state == StateRole::Leader
            && self.term_start.is_some_and(|(t, _)| t == term);
        if leads {
            self.raw.read_index(ctx);
        } else {
            self.shared.reads.fail_all();
        }
    }

    /// Handles one raft-rs `Ready` (module docs, cluster.md section 3.4).
    fn on_ready(&mut self) -> Result<()> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        if let Some(ss) = rd.ss() {
            let (role, leader) = (ss.raft_state, ss.leader_id);
            self.role_changed(role, leader);
        }
        self.note_term_start();
        // After a role change above failed every ticket: a read state of
        // the same `Ready` confirms nothing then.
        for rs in rd.take_read_states() {
            self.shared.reads.confirm(&rs.request_ctx);
        }
        self.send(rd.take_messages());
        if !rd.snapshot().is_empty() {
            let snap = rd.snapshot().clone();
            let hs = rd.hs().unwrap_or(self.raw.store().hard_state()).clone();
            self.install(&snap, hs)?;
        }
        if !self.raw.store().members_recorded() && !rd.entries().is_empty() {
            // A node waiting to be added has no membership until a
            // snapshot brings one (cluster.md section 11.2); entries from
            // index 1 would be applied without the set's members.
            return Err(ClusterError::Stopped {
                reason: "a node waiting to be added was sent entries instead of a snapshot \
                         (the leader's Raft log starts at entry 0: made by an older version)"
                    .into(),
            });
        }
        // Committed entries are applied from the Raft log (`apply`), which
        // can go again from where it stopped.
        drop(rd.take_committed_entries());
        let appended = (rd.entries().first().map(|e| e.index), rd.entries().len());
        self.raw.mut_store().persist(rd.entries(), rd.hs())?;
        if let (Some(first), count) = appended {
            let bytes = self.raw.store().entry_bytes_from(first);
            self.health.appended(count as u64, bytes);
        }
        self.send(rd.take_persisted_messages());
        let mut light = self.raw.advance_append(rd);
        self.send(light.take_messages());
        drop(light.take_committed_entries());
        Ok(())
    }

    fn send(&mut self, msgs: Vec<Message>) {
        let mut offered = false;
        for m in msgs {
            if m.get_msg_type() != raft::eraftpb::MessageType::MsgSnapshot {
                self.transport.send(m);
                continue;
            }
            let (to, index) = (m.to, m.get_snapshot().get_metadata().index);
            // Its end (a failure at once if it is not offered) comes back
            // as `Input::SnapshotSent`.
            self.health.snapshot_send_started(to);
            let wake = Mutex::new(self.wake.clone());
            let done = Box::new(move |ok| {
                let _ = wake.lock().send(Input::SnapshotSent { to, ok });
            });
            match &self.offer {
                Some((i, snap, _)) if *i == index => {
                    offered = true;
                    self.transport.send_snapshot(m, snap.clone(), done);
                }
                // Invariant: raft-rs sends only the snapshot the log
                // offers, and the offer changes only here and in
                // `make_offer`, after the messages of its turn went out.
                _ => done(false),
            }
        }
        if offered {
            // The streams hold the engine snapshot as long as they need
            // it; the next follower that needs one gets a newer one, and
            // the engine's deletions wait no longer than the streams.
            self.offer = None;
            self.raw.mut_store().set_offer(None);
        }
    }

    /// Takes an engine snapshot for the Raft log to offer if raft-rs asked
    /// for one (cluster.md section 8.1): at `applied`, while no round of
    /// this leader's is being written (the engine's last round is then the
    /// one of the last data entry applied).
    fn make_offer(&mut self) -> Result<()> {
        if self
            .offer
            .as_ref()
            .is_some_and(|o| o.2.elapsed() > OFFER_UNUSED_MAX)
        {
            // The follower it was for went away before Raft sent it: its
            // hold would keep the engine's deletions waiting.
            self.offer = None;
            self.raw.mut_store().set_offer(None);
        }
        self.want_snapshot |= self.raw.store().take_snapshot_wanted();
        if !self.want_snapshot || self.awaiting.is_some() {
            return Ok(());
        }
        // A snapshot holds every group: while the engine's saved state
        // still loads in the background, the offer waits (asked again on
        // the next turn).
        let loading = self
            .shared
            .engine
            .read()
            .as_ref()
            .is_some_and(|e| !e.state_load_settled());
        if loading {
            return Ok(());
        }
        self.want_snapshot = false;
        let index = self.applied;
        let term =
            raft::Storage::term(self.raw.store(), index).map_err(|e| ClusterError::Stopped {
                reason: format!("the term of applied entry {index}: {e}"),
            })?;
        let (last_round, snap) = {
            let slot = self.shared.engine.read();
            let engine = slot.as_ref().ok_or_else(|| ClusterError::Stopped {
                reason: "no engine".into(),
            })?;
            (engine.last_round(), engine.snapshot()?)
        };
        let mut offer = raft::eraftpb::Snapshot {
            data: crate::snapshot::descriptor_with_members(last_round, self.raw.store().members())
                .into(),
            ..Default::default()
        };
        let meta = offer.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(self.raw.store().conf_state());
        log::info!(
            "node {}: snapshot at entry {index} (term {term}, round {last_round}) offered",
            self.raw.raft.id
        );
        self.raw.mut_store().set_offer(Some(offer));
        self.offer = Some((index, Arc::new(snap), Instant::now()));
        Ok(())
    }

    /// Compacts the Raft log once its file passed its bound (cluster.md
    /// section 3.5): up to `applied` (the engine holds it durably under
    /// `fsync=always`), or on a leader up to the slowest follower's match
    /// if what it still needs takes at most half the bound; only if that
    /// halves the file, so that each compaction's rewrite is paid for by
    /// as many bytes of appends.
    fn compact(&mut self) -> Result<()> {
        let store = self.raw.store();
        let max = self.raft_log_max_bytes;
        if store.file_bytes() <= max.max(self.compact_check_at) {
            return Ok(());
        }
        // Looked at again only after another quarter of the bound was
        // appended: each look walks the entries kept.
        self.compact_check_at = store.file_bytes() + max / 4;
        let mut to = self.applied;
        if self.raw.raft.state == StateRole::Leader {
            let me = self.raw.raft.id;
            let slowest = self
                .raw
                .raft
                .prs()
                .iter()
                .filter(|(id, _)| **id != me)
                .map(|(_, pr)| pr.matched)
                .min();
            if let Some(m) = slowest {
                if m < to && store.entry_bytes_from(m + 1) <= max / 2 {
                    to = m;
                }
            }
        }
        if to <= store.start().0 || store.entry_bytes_from(to + 1) > store.file_bytes() / 2 {
            return Ok(());
        }
        self.raw.mut_store().compact(to)?;
        self.compact_check_at = 0;
        self.shared.log_first_index.store(to + 1, Ordering::Release);
        Ok(())
    }

    /// Installs the snapshot raft-rs's `Ready` holds (cluster.md section
    /// 8.3): its files (received before Raft saw the message) staged, the
    /// Raft log reset to it (the commit point), then the engine swapped
    /// and reopened; if a node's loop holds the engine, the replica stops
    /// to finish the swap at its restart.
    fn install(
        &mut self,
        snap: &raft::eraftpb::Snapshot,
        mut hs: raft::eraftpb::HardState,
    ) -> Result<()> {
        let (index, term) = (snap.get_metadata().index, snap.get_metadata().term);
        let last_round = crate::snapshot::descriptor_last_round(snap.get_data())
            .map_err(|reason| ClusterError::Stopped { reason })?;
        let members = crate::snapshot::descriptor_members(snap.get_data())
            .map_err(|reason| ClusterError::Stopped { reason })?;
        self.snapshots.stage(index, term)?;
        // The log holds nothing after the snapshot yet: a commit index
        // above it (the same `Ready` may carry the entries after it, and
        // their commit) would name entries this log does not have if the
        // install ends here (a crash, or the node's restart before those
        // entries are persisted), and raft-rs refuses to start from such
        // a log. The entries and the commit follow in `persist`.
        hs.commit = index;
        self.raw
            .mut_store()
            .reset_to_snapshot(index, term, &hs, members)?;
        self.members_applied();
        self.shared
            .log_first_index
            .store(index + 1, Ordering::Release);
        self.close_gate("a snapshot is being installed");
        self.awaiting = None;
        self.shared.awaiting.store(false, Ordering::Release);
        self.unpark();
        let mut slot = self.shared.engine.write();
        if let Some(old) = slot.take() {
            match Arc::try_unwrap(old) {
                Ok(old) => {
                    if let Err(e) = old.close() {
                        log::info!("closing the engine a snapshot replaces: {e}");
                    }
                    self.gate.refused.store(false, Ordering::Release);
                }
                Err(held) => {
                    // A node's loop serves it: the node restarts, and the
                    // start finishes the install (`snapshot::recover`).
                    *slot = Some(held);
                    self.shared
                        .restart_to_install
                        .store(true, Ordering::Release);
                    return Err(ClusterError::Stopped {
                        reason: format!(
                            "a snapshot at entry {index} is to be installed: the node restarts"
                        ),
                    });
                }
            }
        }
        crate::snapshot::finish(self.snapshots.dir(), index, term)?;
        let engine = open_engine(&self.engine_config, &self.gate, &self.shared, &self.wake)?;
        if engine.last_round() != last_round {
            return Err(ClusterError::Stopped {
                reason: format!(
                    "the snapshot at entry {index} opened at round {}, not {last_round}",
                    engine.last_round()
                ),
            });
        }
        *slot = Some(Arc::new(engine));
        self.own_rounds = false;
        self.applied = index;
        self.shared
            .snapshots_installed
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        log::info!(
            "node {}: snapshot at entry {index} (round {last_round}) installed",
            self.raw.raft.id
        );
        Ok(())
    }

    /// A new role or leader (cluster.md section 5): any role but leader
    /// closes the gate.
    fn role_changed(&mut self, role: StateRole, leader: u64) {
        self.gate.state.lock().leader = (leader != 0).then_some(leader);
        if role != StateRole::Leader && self.term_start.is_some() {
            log::warn!(
                "node {} lost leadership in term {}: now {role:?}, leader {}",
                self.raw.raft.id,
                self.raw.raft.term,
                if leader == 0 {
                    "unknown".to_string()
                } else {
                    leader.to_string()
                }
            );
        }
        if role != StateRole::Leader {
            self.term_start = None;
            self.close_gate("leadership lost");
            self.interrupt_change("leadership lost before the change was applied");
        }
    }

    /// A leader notes its term's first entry, once per term: raft-rs
    /// appended that empty entry when the node became leader, and nothing
    /// since, as no proposal is taken while the gate is closed. A leader of
    /// a new term (two elections between two turns) starts closed.
    fn note_term_start(&mut self) {
        if self.raw.raft.state != StateRole::Leader {
            return;
        }
        let term = self.raw.raft.term;
        if self.term_start.is_some_and(|(t, _)| t == term) {
            return;
        }
        if self.term_start.is_some() {
            self.close_gate("a new term");
        }
        log::info!("node {} leads in term {term}", self.raw.raft.id);
        self.term_start = Some((term, self.raw.raft.raft_log.last_index()));
    }

    /// Closes the gate: no write or proposal goes through, the round in
    /// flight (if not committed yet) is refused, and every proposal already
    /// in the channel is refused; other inputs taken meanwhile are kept.
    fn close_gate(&mut self, why: &str) {
        self.gate.state.lock().open = false;
        self.shared.reads.fail_all();
        if let Some(p) = self.pending.take() {
            self.refuse_round(&p.reply, why.to_string());
        }
        while let Ok(input) = self.inbox.try_recv() {
            match input {
                Input::Propose { reply, .. } => self.refuse_round(&reply, why.to_string()),
                other => self.deferred.push_back(other),
            }
        }
    }

    /// Applies the committed entries not applied yet (cluster.md section 4),
    /// reopening the engine if its writes stopped (once: an engine that
    /// stops again at once stops the replica), then opens the gate if this
    /// leader reached its term start.
    fn apply(&mut self) -> Result<()> {
        if self.apply_committed()? {
            self.reopen_engine()?;
            if self.apply_committed()? {
                return Err(ClusterError::Stopped {
                    reason: "the engine stopped its writes again right after its reopen".into(),
                });
            }
        }
        let open = self
            .term_start
            .is_some_and(|(_, index)| self.applied >= index);
        let mut st = self.gate.state.lock();
        if st.open != open {
            st.open = open;
            self.own_rounds |= open;
            if open {
                log::info!(
                    "node {} leads and accepts writes (term {})",
                    self.raw.raft.id,
                    self.raw.raft.term
                );
            }
        }
        Ok(())
    }

    /// The body of [`Driver::apply`]; true if the engine must be reopened
    /// first.
    fn apply_committed(&mut self) -> Result<bool> {
        let mut reopen = false;
        let mut conf = None;
        {
            let shared = self.shared.clone();
            let slot = shared.engine.read();
            let engine = slot.as_ref().ok_or_else(|| ClusterError::Stopped {
                reason: "no engine".into(),
            })?;
            if self.gate.refused.swap(false, Ordering::AcqRel) {
                reopen = true;
                // The cause, if the reopen cannot happen (a node holds the
                // engine); cleared by a reopen that does.
                self.shared
                    .restart_after_refusal
                    .store(true, Ordering::Release);
            } else if let Some((index, round)) = self.awaiting {
                if engine.last_round() >= round {
                    self.awaited(index);
                } else if matches!(
                    engine.accepting_writes(),
                    Err(tidemark_engine::Error::WritesStopped { .. })
                ) {
                    // The commit thread failed after the commit: the round
                    // is applied again from the Raft log after a reopen.
                    reopen = true;
                } else {
                    return Ok(false);
                }
            } else if let Some(ticket) = self.parked {
                if !ticket_settled(engine, ticket) {
                    return Ok(false);
                }
                self.unpark();
            }
            let store = self.raw.store();
            let committed = self.raw.raft.raft_log.committed.min(store.last());
            // A follower's engine writes and syncs each round it applies:
            // a backlog of them is applied over several turns, at most one
            // tick's worth per turn, so that the driver goes on answering
            // the leader and ticking (a driver busy for longer than the
            // leader's quorum check lets a leader step down with nothing
            // wrong, and a follower stop campaigning when it should).
            let budget = Instant::now() + self.tick;
            while !reopen && self.applied < committed && Instant::now() < budget {
                let index = self.applied + 1;
                // Invariant: index <= committed <= the log's last index.
                let entry = store
                    .entry(index)
                    .expect("invariant: a committed entry is in the log");
                if entry.get_entry_type() == raft::eraftpb::EntryType::EntryConfChange {
                    // Applied with the engine and the log let go of
                    // (`apply_conf`); the next entries in the next turn.
                    conf = Some(index);
                    break;
                }
                if entry.data.is_empty() {
                    self.applied = index;
                    continue;
                }
                let round =
                    Engine::round_index_of(&entry.data).ok_or_else(|| ClusterError::Stopped {
                        reason: format!("committed entry {index} is not a round payload"),
                    })?;
                let last = engine.last_round();
                if round <= last {
                    self.applied = index;
                    continue;
                }
                if round > last + 1 {
                    return Err(ClusterError::Stopped {
                        reason: format!(
                            "committed entry {index} holds round {round}, the engine is at round {last}"
                        ),
                    });
                }
                if let Some(p) = self.pending.take() {
                    if p.index != index {
                        self.pending = Some(p);
                    } else if p.term == entry.term {
                        // This leader's round: its commit thread writes it.
                        self.awaiting = Some((index, round));
                        self.shared.awaiting.store(true, Ordering::Release);
                        let _ = p.reply.send(Ok(()));
                        break;
                    } else {
                        let _ = p.reply.send(Err(format!("entry {index} overwritten")));
                    }
                }
                match engine.try_append_replicated(&entry.data) {
                    Ok(_) => self.applied = index,
                    Err(tidemark_engine::Error::NotReady { ticket, .. }) => {
                        // Nothing was written: handed over again once the
                        // worker's job is done (module docs).
                        self.parked = Some(ticket);
                        self.shared.parked.store(true, Ordering::Release);
                        self.health.round_parked();
                        break;
                    }
                    Err(tidemark_engine::Error::WritesStopped { .. }) => reopen = true,
                    Err(e @ tidemark_engine::Error::InvalidRound { .. }) if self.own_rounds => {
                        // Its send states may count a round of this node's
                        // own that was never committed (ids assigned at
                        // submit, the round not refused yet): a reopen
                        // rebuilds them from committed rounds, and the
                        // entry is applied after it (cluster.md section
                        // 5.1). Once only: `own_rounds` is cleared by it.
                        log::warn!(
                            "node {}: committed entry {index} refused by an engine that led: \
                             {e}; reopening it",
                            self.raw.raft.id
                        );
                        self.shared
                            .restart_after_refusal
                            .store(true, Ordering::Release);
                        reopen = true;
                    }
                    Err(e) => {
                        return Err(ClusterError::Stopped {
                            reason: format!("committed entry {index} refused by the engine: {e}"),
                        })
                    }
                }
            }
        }
        if let Some(index) = conf {
            self.apply_conf(index)?;
        }
        self.raw.advance_apply_to(self.applied);
        Ok(reopen)
    }

    /// Applies the committed ConfChange entry at `index` (cluster.md
    /// section 11.1): raft-rs's configuration changed, the membership
    /// written to the Raft log (one record, one fdatasync), the transport
    /// and the receivers told. An entry at or below the durable
    /// membership's index is in it already (applied before a restart).
    fn apply_conf(&mut self, index: u64) -> Result<()> {
        let store = self.raw.store();
        if index <= store.members().index {
            self.applied = index;
            return Ok(());
        }
        let stop = |reason: String| ClusterError::Stopped { reason };
        // Invariant: `apply_committed` found the entry at `index`.
        let entry = store
            .entry(index)
            .expect("invariant: a committed entry is in the log");
        let cc = <raft::eraftpb::ConfChange as protobuf::Message>::parse_from_bytes(&entry.data)
            .map_err(|e| stop(format!("committed entry {index}: not a ConfChange: {e}")))?;
        let next = store
            .members()
            .apply(index, &cc)
            .map_err(|e| stop(format!("committed entry {index}: {e}")))?;
        self.raw
            .apply_conf_change(&cc)
            .map_err(|e| stop(format!("committed entry {index}: raft refused it: {e}")))?;
        self.raw.mut_store().set_members(next)?;
        self.applied = index;
        self.members_applied();
        log::info!(
            "node {}: membership at entry {index}: {:?}",
            self.raw.raft.id,
            self.raw.store().conf_state()
        );
        if let Some(mut c) = self.change.take() {
            if c.proposed != Some(index) {
                self.change = Some(c);
            } else if matches!(c.change, Change::Add { .. }) && c.admitted.is_none() {
                // The learner is in: promoted once it caught up (`promote`).
                c.proposed = None;
                c.admitted = Some(index);
                self.change = Some(c);
            } else {
                (c.reply)(Ok(self.raw.store().members().clone()));
            }
        }
        Ok(())
    }

    /// The Raft log's membership changed (a change applied, a snapshot
    /// installed): the copy readers see, the receivers and the transport.
    fn members_applied(&mut self) {
        let members = self.raw.store().members().clone();
        self.peers.set(members.ids());
        self.transport
            .set_peers(&peer_addrs(&members, self.raw.raft.id));
        *self.shared.members.lock() = members;
    }

    /// Takes a client's membership change (cluster.md section 11.4): on
    /// the leader with its writes gate open, one at a time, checked
    /// against the membership; proposed as a ConfChange entry.
    fn start_change(&mut self, change: Change, reply: ChangeReply) {
        let leader = self.gate.state.lock().leader;
        if !self.gate.state.lock().open || self.raw.raft.state != StateRole::Leader {
            return reply(Err(ChangeRefused::NotLeader { leader }));
        }
        if self.change.is_some() || self.raw.raft.pending_conf_index > self.applied {
            return reply(Err(ChangeRefused::InProgress));
        }
        let members = self.raw.store().members().clone();
        let me = self.raw.raft.id;
        let (cc, admitted) = match &change {
            Change::Add {
                id,
                cluster_addr,
                client_addr,
            } => {
                let same =
                    |m: &Member| m.cluster_addr == *cluster_addr && m.client_addr == *client_addr;
                match members.get(*id) {
                    _ if *id == 0 => return reply(Err(ChangeRefused::AlreadyMember { id: 0 })),
                    Some(m) if !same(m) => {
                        return reply(Err(ChangeRefused::AlreadyMember { id: *id }))
                    }
                    // Asked again after an interruption: done already, or
                    // a learner still to be promoted.
                    Some(m) if m.role == Role::Voter => return reply(Ok(members)),
                    Some(_) => (None, Some(members.index)),
                    None => {
                        let context =
                            match crate::members::encode_context(cluster_addr, client_addr) {
                                Ok(c) => c,
                                Err(reason) => {
                                    return reply(Err(ChangeRefused::Refused { reason }))
                                }
                            };
                        let mut cc = raft::eraftpb::ConfChange {
                            node_id: *id,
                            context: context.into(),
                            ..Default::default()
                        };
                        cc.set_change_type(raft::eraftpb::ConfChangeType::AddLearnerNode);
                        (Some(cc), None)
                    }
                }
            }
            Change::Remove { id } => {
                let Some(m) = members.get(*id) else {
                    return reply(Err(ChangeRefused::UnknownMember { id: *id }));
                };
                if *id == me {
                    return reply(Err(ChangeRefused::Refused {
                        reason: format!("node {id} leads: another node must lead to remove it"),
                    }));
                }
                let voters = members.conf_state().voters.len();
                if m.role == Role::Voter && voters <= 1 {
                    return reply(Err(ChangeRefused::Refused {
                        reason: format!("node {id} is the last voter"),
                    }));
                }
                let mut cc = raft::eraftpb::ConfChange {
                    node_id: *id,
                    ..Default::default()
                };
                cc.set_change_type(raft::eraftpb::ConfChangeType::RemoveNode);
                (Some(cc), None)
            }
        };
        let mut c = ChangeInFlight {
            change,
            reply,
            proposed: None,
            admitted,
        };
        if let Some(cc) = cc {
            match self.propose_conf(cc) {
                Ok(index) => c.proposed = Some(index),
                Err(reason) => return (c.reply)(Err(ChangeRefused::Interrupted { reason })),
            }
        }
        self.change = Some(c);
    }

    /// Proposes a ConfChange as this leader's next entry; its index.
    fn propose_conf(&mut self, cc: raft::eraftpb::ConfChange) -> std::result::Result<u64, String> {
        let before = self.raw.raft.raft_log.last_index();
        if let Err(e) = self.raw.propose_conf_change(vec![], cc) {
            self.health.proposal_refused();
            return Err(format!("raft refused the change: {e}"));
        }
        let index = self.raw.raft.raft_log.last_index();
        if index != before + 1 {
            self.health.proposal_refused();
            return Err("raft dropped the change (another one is pending)".into());
        }
        Ok(index)
    }

    /// Promotes the learner of an add under way once it holds the log up
    /// to its admission (it installed its snapshot, or was sent the
    /// entries): a voter that cannot take part yet would only weaken the
    /// quorum (cluster.md section 11.4).
    fn promote(&mut self) {
        let Some(c) = self.change.as_ref() else {
            return;
        };
        let (Change::Add { id, .. }, None, Some(admitted)) = (&c.change, c.proposed, c.admitted)
        else {
            return;
        };
        let id = *id;
        let caught_up = self
            .raw
            .raft
            .prs()
            .get(id)
            .is_some_and(|pr| pr.matched >= admitted);
        if !caught_up || self.raw.raft.state != StateRole::Leader {
            return;
        }
        let mut cc = raft::eraftpb::ConfChange {
            node_id: id,
            ..Default::default()
        };
        cc.set_change_type(raft::eraftpb::ConfChangeType::AddNode);
        match self.propose_conf(cc) {
            Ok(index) => {
                if let Some(c) = self.change.as_mut() {
                    c.proposed = Some(index);
                }
            }
            Err(reason) => self.interrupt_change(&reason),
        }
    }

    /// Answers the change under way, if any, as interrupted.
    fn interrupt_change(&mut self, why: &str) {
        if let Some(c) = self.change.take() {
            (c.reply)(Err(ChangeRefused::Interrupted {
                reason: why.to_string(),
            }));
        }
    }

    /// Committed entries wait to be applied (and no round of this
    /// leader's is being written by its commit thread, nor is the next
    /// round parked on a ticket not settled yet). Checked at the top of
    /// every turn, so a ticket settled before the round was marked parked
    /// (its wake-up missed) is seen there.
    fn apply_behind(&self) -> bool {
        let parked = self.parked.is_some_and(|ticket| {
            self.shared
                .engine
                .read()
                .as_ref()
                .is_some_and(|e| !ticket_settled(e, ticket))
        });
        self.awaiting.is_none()
            && !parked
            && self.applied
                < self
                    .raw
                    .raft
                    .raft_log
                    .committed
                    .min(self.raw.store().last())
    }

    /// No round is parked (its ticket settled, or its engine replaced).
    fn unpark(&mut self) {
        self.parked = None;
        self.shared.parked.store(false, Ordering::Release);
    }

    /// The awaited round (at Raft `index`) is in the engine.
    fn awaited(&mut self, index: u64) {
        self.awaiting = None;
        self.shared.awaiting.store(false, Ordering::Release);
        self.applied = index;
    }

    /// Reopens an engine whose writes stopped (a refused round, or a
    /// failure): closed gate first, so that nobody holding the engine
    /// waits for this thread.
    fn reopen_engine(&mut self) -> Result<()> {
        self.close_gate("the engine is being reopened");
        self.awaiting = None;
        self.shared.awaiting.store(false, Ordering::Release);
        self.unpark();
        let mut slot = self.shared.engine.write();
        if let Some(old) = slot.take() {
            match Arc::try_unwrap(old) {
                Ok(old) => {
                    if let Err(e) = old.close() {
                        log::info!("closing the stopped engine: {e}");
                    }
                    // Its commit thread ended: a refusal it met was of a
                    // round of the engine just closed.
                    self.gate.refused.store(false, Ordering::Release);
                }
                Err(_) => {
                    // A node serves it: its directory cannot be opened
                    // twice, and the node's loop cannot switch engines.
                    // After a refusal the node restarts itself
                    // (`restart_after_refusal`, set by the caller).
                    return Err(ClusterError::Stopped {
                        reason: "the engine's writes stopped (a round refused when leadership \
                                 was lost, or a failed write) while the node serves it: \
                                 the node restarts after a refusal, else restart the node"
                            .into(),
                    });
                }
            }
        }
        *slot = Some(Arc::new(open_engine(
            &self.engine_config,
            &self.gate,
            &self.shared,
            &self.wake,
        )?));
        self.own_rounds = false;
        self.shared
            .restart_after_refusal
            .store(false, Ordering::Release);
        log::info!("node {}: engine reopened", self.raw.raft.id);
        Ok(())
    }

    /// Ends the replica: the gate closed, the engine closed (or, in tests,
    /// dropped as in a crash: `Replica::crash`).
    #[cfg_attr(not(test), allow(unused_variables))]
    fn shut_down(&mut self, crash: bool) {
        self.term_start = None;
        self.close_gate("replica stopping");
        self.interrupt_change("the replica stopped before the change was applied");
        let engine = self.shared.engine.write().take();
        // Held elsewhere (a node's loop that has not stopped yet): its last
        // holder's drop shuts it down.
        if let Some(Ok(engine)) = engine.map(Arc::try_unwrap) {
            #[cfg(test)]
            if crash {
                engine.simulate_crash();
                return;
            }
            if let Err(e) = engine.close() {
                log::warn!("closing the engine: {e}");
            }
        }
    }
}
