//! The node's limits: every one has a default here (one constant in
//! [`defaults`], which `Limits::default` and `tidemark serve`'s flags take),
//! a `tidemark serve` flag, and a line in format-spec/protocol.md "Limits"
//! (checked against these constants by `tests/it/spec_limits.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;

use tidemark_engine::FD_RESERVE;
use tidemark_engine::{Config as EngineConfig, FsyncPolicy};

use tidemark_protocol::{self as protocol, FRAME_BYTES_MAX_FLOOR};

/// Frames one connection may have handled in one turn of the event loop
/// (format-spec/protocol.md section 1.8): then the other connections get
/// theirs, so a client that pipelines without pause delays the others by
/// at most one turn per pass.
pub const FRAMES_PER_PASS_MAX: usize = 64;
/// Bytes read from one connection in one turn of the event loop.
pub const READ_BYTES_PER_PASS_MAX: usize = 256 << 10;
/// Input a connection may buffer whatever the node-wide input total: a
/// frame up to this size is never refused for `input_bytes_total_max`.
pub const INPUT_BYTES_FREE: usize = 64 << 10;

/// The default of every node limit, one constant each, and of the address
/// and data directory `tidemark serve` uses without flags. The engine's
/// are in [`tidemark_engine::defaults`]; the two the protocol announces
/// come from the codec. The relationships `NodeConfig::validate` checks
/// hold between them at compile time (below the module).
pub mod defaults {
    pub use tidemark_protocol::{
        FRAME_BYTES_MAX_DEFAULT as FRAME_BYTES_MAX,
        REQUESTS_IN_FLIGHT_MAX_DEFAULT as REQUESTS_IN_FLIGHT_MAX,
    };

    pub const CONNECTIONS_MAX: usize = 10_000;
    pub const OUTPUT_BYTES_MAX: usize = 8 << 20;
    pub const LONG_POLL_MS_MAX: u32 = 60_000;
    pub const SUBSCRIPTIONS_MAX: usize = 100_000;
    pub const FRAME_TIMEOUT_MS: u64 = 30_000;
    pub const OUTPUT_BYTES_TOTAL_MAX: usize = 1 << 30;
    pub const INPUT_BYTES_TOTAL_MAX: usize = 1 << 30;
    /// Members one MEMBERS response lists at most (160 KiB of entries):
    /// bounds the work of one request on the event loop, whatever the
    /// group's size.
    pub const MEMBERS_PAGE_MAX: usize = 10_000;
    /// Groups with more members than this get counts-only receipts
    /// (RECEIPT_COUNTS instead of a RECEIPT listing every member whose
    /// cursor moved; format-spec/protocol.md 4.22): a RECEIPT of such a
    /// group lists at most this many members (16 KiB).
    pub const RECEIPT_MEMBERS_MAX: usize = 1_000;
    /// Receipts are coalesced over this interval: at most one per member
    /// (list mode) or per subscribed sender (counts mode) per interval.
    pub const RECEIPT_INTERVAL_MS: u64 = 100;
    /// `tidemark serve --listen`.
    pub const LISTEN: &str = "127.0.0.1:7070";
    /// `tidemark serve --data`.
    pub const DATA_DIR: &str = "./tidemark-data";
    /// Requests that take at least this long (from handling to queueing
    /// the response) go to the slow log: 10 ms, Redis's default too.
    pub const SLOWLOG_THRESHOLD_US: u64 = 10_000;
    /// Slow requests kept (the oldest go first).
    pub const SLOWLOG_ENTRIES_MAX: usize = 128;
    /// The largest `slowlog_entries_max` (a log of about 16 MiB).
    pub const SLOWLOG_ENTRIES_MAX_MAX: usize = 100_000;
}

// `NodeConfig::validate`'s relationships, for the defaults, at compile time.
const _: () = {
    use defaults::*;
    let payload_bytes_max = tidemark_engine::defaults::PAYLOAD_BYTES_MAX;
    assert!(FRAME_BYTES_MAX >= FRAME_BYTES_MAX_FLOOR);
    assert!(payload_bytes_max <= u32::MAX as usize);
    assert!(
        FRAME_BYTES_MAX as u64 >= protocol::frame_bytes_min_for_payload(payload_bytes_max as u32)
    );
    assert!(OUTPUT_BYTES_MAX >= FRAME_BYTES_MAX as usize);
    assert!(CONNECTIONS_MAX > 0 && REQUESTS_IN_FLIGHT_MAX > 0 && FRAME_TIMEOUT_MS > 0);
    assert!(OUTPUT_BYTES_TOTAL_MAX >= OUTPUT_BYTES_MAX + 4 + FRAME_BYTES_MAX as usize);
    assert!(INPUT_BYTES_TOTAL_MAX >= 4 + FRAME_BYTES_MAX as usize);
    // A frame the node-wide input budget never refuses is one it accepts.
    assert!(INPUT_BYTES_FREE <= FRAME_BYTES_MAX as usize);
    assert!(SLOWLOG_ENTRIES_MAX <= SLOWLOG_ENTRIES_MAX_MAX);
    // A full MEMBERS page fits the default frame.
    assert!(
        MEMBERS_PAGE_MAX * protocol::MEMBER_ENTRY_BYTES + protocol::MEMBERS_RESPONSE_FIXED_BYTES
            <= FRAME_BYTES_MAX as usize
    );
};

/// Everything `tidemark serve` runs with.
#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub listen: SocketAddr,
    pub engine: EngineConfig,
    /// When set, clients must AUTH with exactly these bytes after HELLO.
    pub token: Option<Vec<u8>>,
    pub limits: Limits,
    /// Who may SEND to a group (format-spec/protocol.md 4.9).
    pub sends: SendPolicy,
    /// Where to serve the Prometheus metrics over HTTP (`GET /metrics`);
    /// `None`: no endpoint.
    pub metrics_listen: Option<SocketAddr>,
    /// What INFO says the node is.
    pub build: Build,
    /// A member of a replica set (`serve --cluster`): who leads decides
    /// which requests it serves (format-spec/protocol.md 4.31). `None`: a
    /// single node, which serves everything.
    pub leadership: Option<LeaderGate>,
    /// The cluster map of a node started with one (`serve --cluster-map`):
    /// requests for another set's groups are refused with WRONG_SET
    /// (format-spec/protocol.md 4.33). `None`: the node (or its replica
    /// set) owns every shard, and nothing is checked.
    pub shards: Option<std::sync::Arc<crate::shards::ClusterShards>>,
}

/// A replica set's view of its leader, as the node's request gate needs
/// it (format-spec/protocol.md 4.31). The node knows nothing of Raft: the
/// binary implements this over its replica.
pub trait Leadership: Send + Sync {
    /// `None` when this node leads and accepts writes now; otherwise why
    /// it refuses, for `NOT_LEADER`. Called once per data request on the
    /// event loop: it must not block (a leaf lock at most).
    fn refusal(&self) -> Option<NotLeader>;

    /// This node's id, the leader as it knows it, and every member with
    /// its client address by ascending id, for CLUSTER (4.32). Called on
    /// the event loop: it must not block.
    fn map(&self) -> ClusterView;

    /// Asks for a membership change (CLUSTER_CHANGE, 4.34). `done` is
    /// called once, from any thread, when the change applied or was
    /// refused. Called on the event loop: it must not block.
    fn change(&self, change: ChangeRequest, done: ChangeDone);

    /// A read ticket (format-spec/cluster.md section 5.2): an answer
    /// computed now may be sent once [`Leadership::read_outcome`] confirms
    /// the ticket (this node still led after it was taken). Tickets taken
    /// meanwhile share one confirmation. Must not block.
    fn read_ticket(&self) -> u64;

    /// `Some(true)` once `ticket` is confirmed, `Some(false)` once it
    /// failed (leadership lost: the read is refused `NOT_LEADER`), `None`
    /// while it waits. Tickets settle in order. Must not block.
    fn read_outcome(&self, ticket: u64) -> Option<bool>;

    /// Registers `wake`, called (on another thread) whenever tickets were
    /// confirmed or failed.
    fn on_reads(&self, wake: std::sync::Arc<dyn Fn() + Send + Sync>);

    /// The replica's figures for STATS' `raft.*` names (protocol.md
    /// 4.4.1), as its driver last published them; `None` before the
    /// replica runs. Called on the event loop per STATS or scrape: it
    /// must not block (a leaf lock and a copy of a few members at most).
    fn raft_figures(&self) -> Option<RaftFigures>;
}

/// The values `raft.role.{role}` takes, one of which is 1 (protocol.md
/// 4.4.1).
pub const RAFT_ROLES: [&str; 6] = [
    "leader",
    "candidate",
    "pre_candidate",
    "follower",
    "learner",
    "joining",
];

/// The values `raft.peer_{peer}.progress.{state}` takes, one of which is
/// 1 per peer: how the leader sends it the log.
pub const RAFT_PROGRESS_STATES: [&str; 3] = ["probe", "replicate", "snapshot"];

/// A replica set member's Raft figures (STATS `raft.*`, protocol.md
/// 4.4.1). The node knows nothing of Raft: the binary fills this from its
/// replica.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftFigures {
    /// One of [`RAFT_ROLES`].
    pub role: &'static str,
    pub term: u64,
    /// 0 when no leader is known.
    pub leader_id: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    pub last_index: u64,
    pub elections_started: u64,
    pub elections_won: u64,
    pub leader_changes: u64,
    pub proposals_refused: u64,
    pub snapshot_sends_started: u64,
    pub snapshot_sends_finished: u64,
    pub snapshot_sends_failed: u64,
    pub snapshots_installed: u64,
    /// Committed rounds the replica parked until its engine's maintenance
    /// worker looked up what they name (cluster.md section 4).
    pub rounds_parked: u64,
    /// On the leader, every other member; empty on any other node.
    pub peers: Vec<RaftPeerFigures>,
    /// What the member's Raft listener saw of the connections its peers
    /// opened (`raft.inbound.*`).
    pub inbound: RaftInboundFigures,
}

/// What a member's Raft listener saw of its inbound peer connections
/// (`raft.inbound.*`, format-spec/cluster.md section 7.2): counters since
/// the start, and two gauges of now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RaftInboundFigures {
    /// Connections that completed the peer handshake.
    pub authenticated: u64,
    /// Handshakes that failed (a wrong proof, a dialer that is no member,
    /// the deadline).
    pub handshakes_failed: u64,
    /// Connections closed at a cap (`handshakes_max`, `connections_max`).
    pub refused_at_cap: u64,
    /// Frames refused because their `from` is not the connection's
    /// authenticated peer (the connection closed with each).
    pub frames_forged: u64,
    /// Authenticated connections closed for idleness.
    pub idle_closed: u64,
    /// Connections in their handshake now.
    pub handshaking: u64,
    /// Authenticated connections open now.
    pub open: u64,
}

/// A follower as the leader reports it (`raft.peer_{peer}.*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaftPeerFigures {
    pub node_id: u64,
    pub voter: bool,
    pub match_index: u64,
    pub next_index: u64,
    pub lag_entries: u64,
    /// An estimate (protocol.md 4.4.1).
    pub lag_bytes: u64,
    pub last_contact_ms: u64,
    pub snapshot_sending: bool,
    /// One of [`RAFT_PROGRESS_STATES`].
    pub progress: &'static str,
}

/// A membership change a client asked for (CLUSTER_CHANGE, 4.34).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeRequest {
    Add {
        node_id: u64,
        cluster_addr: String,
        client_addr: String,
    },
    Remove {
        node_id: u64,
    },
}

/// How a membership change ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChangeOutcome {
    /// Applied: the replica set now.
    Done(ClusterView),
    /// This node does not lead (NOT_LEADER).
    NotLeader(NotLeader),
    /// MEMBERSHIP_REFUSED with this detail (protocol.md 4.34).
    Refused { detail: u64, message: String },
}

/// Where a change's outcome goes.
pub type ChangeDone = Box<dyn FnOnce(ChangeOutcome) + Send>;

/// What CLUSTER answers (format-spec/protocol.md 4.32).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    pub node_id: u64,
    /// 0 when no leader is known.
    pub leader_id: u64,
    /// `(node id, client address)`, by ascending id.
    pub members: Vec<(u64, String)>,
}

/// A refusal: the leader as this node knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotLeader {
    /// The leader's node id; `None` when no leader is known (an election
    /// is under way, or this node is cut off).
    pub leader: Option<u64>,
    /// The leader's client address (`host:port`), when known.
    pub client_addr: Option<String>,
    /// True when this node is the leader but does not accept writes yet
    /// (it applies its log up to its term's start, cluster.md section 5).
    pub starting: bool,
}

/// The node's handle on a [`Leadership`] (a newtype for `Clone` and
/// `Debug` of [`NodeConfig`]).
#[derive(Clone)]
pub struct LeaderGate(pub std::sync::Arc<dyn Leadership>);

impl std::fmt::Debug for LeaderGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaderGate")
    }
}

/// The build a node runs, for INFO: the binary knows its commit (its
/// `build.rs`), the node crate only its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    pub version: String,
    /// `unknown` when not built from a git checkout.
    pub commit: String,
}

impl Default for Build {
    fn default() -> Self {
        Build {
            version: env!("CARGO_PKG_VERSION").to_string(),
            commit: "unknown".to_string(),
        }
    }
}

/// Who may SEND to a group: anyone (version 1's rule, the default: the
/// gateway authorises senders), or members only, except the system
/// senders (format-spec/protocol.md 4.9, "Who may send").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendPolicy {
    members_only: bool,
    /// Sorted, no duplicates: one binary search per SEND.
    system_senders: Vec<u64>,
    /// Senders who may EDIT and RECALL anyone's message (moderators, the
    /// application's own service), within the change window
    /// (format-spec/protocol.md 4.28). Sorted, no duplicates.
    admin_senders: Vec<u64>,
}

impl SendPolicy {
    /// Every sender may send to every group (the default).
    pub const fn anyone() -> SendPolicy {
        SendPolicy {
            members_only: false,
            system_senders: Vec::new(),
            admin_senders: Vec::new(),
        }
    }

    /// Only members may send, except `system_senders` (bots, the
    /// application's own notices), who may send to any group.
    pub fn members_only(system_senders: impl IntoIterator<Item = u64>) -> SendPolicy {
        let mut system_senders: Vec<u64> = system_senders.into_iter().collect();
        system_senders.sort_unstable();
        system_senders.dedup();
        SendPolicy {
            members_only: true,
            system_senders,
            admin_senders: Vec::new(),
        }
    }

    /// True when a SEND of `sender` must be from a member of its group.
    /// O(log system senders).
    pub fn needs_membership(&self, sender: u64) -> bool {
        self.members_only && self.system_senders.binary_search(&sender).is_err()
    }

    /// The system senders, ascending.
    pub fn system_senders(&self) -> &[u64] {
        &self.system_senders
    }

    /// This policy with `admin_senders` as the administrators.
    pub fn with_admins(mut self, admin_senders: impl IntoIterator<Item = u64>) -> SendPolicy {
        let mut admins: Vec<u64> = admin_senders.into_iter().collect();
        admins.sort_unstable();
        admins.dedup();
        self.admin_senders = admins;
        self
    }

    /// True when `sender` may edit and recall anyone's message. O(log
    /// administrators).
    pub fn is_admin(&self, sender: u64) -> bool {
        self.admin_senders.binary_search(&sender).is_ok()
    }

    /// The administrators, ascending.
    pub fn admin_senders(&self) -> &[u64] {
        &self.admin_senders
    }
}

/// Per-node and per-connection limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest `frame_len` accepted (and sent).
    pub frame_bytes_max: u32,
    pub connections_max: usize,
    /// Output a connection may have queued before the node stops reading its
    /// requests and stops pushing to it.
    pub output_bytes_max: usize,
    /// Requests of one connection answered later (durable sends, joins, long
    /// polls) at once; one more gets TOO_MANY_REQUESTS_IN_FLIGHT.
    pub requests_in_flight_max: u32,
    /// Longest PULL `wait_ms` honoured.
    pub long_poll_ms_max: u32,
    /// Groups plus users one connection may subscribe to.
    pub subscriptions_max: usize,
    /// A frame must arrive whole within this time of its first byte (while
    /// the node reads the connection); else the connection is closed.
    pub frame_timeout_ms: u64,
    /// Output queued by all connections together. Above it, the node closes
    /// the connections with the most output queued until it is back below
    /// (format-spec/protocol.md section 1.5), and pushes stop first.
    pub output_bytes_total_max: usize,
    /// Input buffered by all connections together. A frame that would take
    /// the total above it (and is larger than `INPUT_BYTES_FREE`) is refused
    /// with OVERLOADED and its connection closed.
    pub input_bytes_total_max: usize,
    /// Members a MEMBERS response lists at most (also kept within
    /// `frame_bytes_max`); a larger `max_count` is clamped to it.
    pub members_page_max: usize,
    /// Requests that take at least this many microseconds go to the slow
    /// log (0: every request).
    pub slowlog_threshold_us: u64,
    /// Slow requests kept, newest; 0 keeps none.
    pub slowlog_entries_max: usize,
    /// Groups with more members get counts-only receipts (4.22).
    pub receipt_members_max: usize,
    /// Receipts are coalesced over this interval (4.22); 0 flushes them
    /// at the end of every pass of the event loop.
    pub receipt_interval_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        use defaults::*;
        Limits {
            frame_bytes_max: FRAME_BYTES_MAX,
            connections_max: CONNECTIONS_MAX,
            output_bytes_max: OUTPUT_BYTES_MAX,
            requests_in_flight_max: REQUESTS_IN_FLIGHT_MAX,
            long_poll_ms_max: LONG_POLL_MS_MAX,
            subscriptions_max: SUBSCRIPTIONS_MAX,
            frame_timeout_ms: FRAME_TIMEOUT_MS,
            output_bytes_total_max: OUTPUT_BYTES_TOTAL_MAX,
            input_bytes_total_max: INPUT_BYTES_TOTAL_MAX,
            members_page_max: MEMBERS_PAGE_MAX,
            slowlog_threshold_us: SLOWLOG_THRESHOLD_US,
            slowlog_entries_max: SLOWLOG_ENTRIES_MAX,
            receipt_members_max: RECEIPT_MEMBERS_MAX,
            receipt_interval_ms: RECEIPT_INTERVAL_MS,
        }
    }
}

/// The limits a running node changes without a restart (`tidemark serve`
/// applies them on SIGHUP): the event loop reads each where it is used,
/// for the next request, frame or buffer check, and nothing was sized,
/// bound or announced from it at start. A change applies from the loop's
/// next pass. Work already under way keeps what it was given (a parked
/// long poll its deadline, an armed frame timer its time); a budget
/// lowered below what is buffered now acts as when the buffers grow past
/// it (reads stop, the connections with the most output queued are
/// closed, a frame that would pass the input total gets OVERLOADED); a
/// smaller slow log drops its oldest entries; existing subscriptions are
/// kept and only new ones are refused.
///
/// The other limits need a restart: `frame_bytes_max` and
/// `requests_in_flight_max` are announced to each client in HELLO (and
/// the frame limit sizes each connection's decoder and the receipts'
/// frames); `connections_max` is fitted with the engine's open segment
/// files into the descriptor limit at start; the receipt limits shape the
/// receipts state made at start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveLimits {
    pub output_bytes_max: usize,
    pub output_bytes_total_max: usize,
    pub input_bytes_total_max: usize,
    pub long_poll_ms_max: u32,
    pub subscriptions_max: usize,
    pub frame_timeout_ms: u64,
    pub slowlog_threshold_us: u64,
    pub slowlog_entries_max: usize,
}

impl LiveLimits {
    /// Their names: the [`Limits`] fields, `tidemark serve`'s config keys.
    pub const KEYS: [&'static str; 8] = [
        "output_bytes_max",
        "output_bytes_total_max",
        "input_bytes_total_max",
        "long_poll_ms_max",
        "subscriptions_max",
        "frame_timeout_ms",
        "slowlog_threshold_us",
        "slowlog_entries_max",
    ];

    /// The live limits of `limits`.
    pub fn of(limits: &Limits) -> LiveLimits {
        LiveLimits {
            output_bytes_max: limits.output_bytes_max,
            output_bytes_total_max: limits.output_bytes_total_max,
            input_bytes_total_max: limits.input_bytes_total_max,
            long_poll_ms_max: limits.long_poll_ms_max,
            subscriptions_max: limits.subscriptions_max,
            frame_timeout_ms: limits.frame_timeout_ms,
            slowlog_threshold_us: limits.slowlog_threshold_us,
            slowlog_entries_max: limits.slowlog_entries_max,
        }
    }

    /// Sets these in `limits`, leaving the others as they are.
    pub fn apply_to(&self, limits: &mut Limits) {
        limits.output_bytes_max = self.output_bytes_max;
        limits.output_bytes_total_max = self.output_bytes_total_max;
        limits.input_bytes_total_max = self.input_bytes_total_max;
        limits.long_poll_ms_max = self.long_poll_ms_max;
        limits.subscriptions_max = self.subscriptions_max;
        limits.frame_timeout_ms = self.frame_timeout_ms;
        limits.slowlog_threshold_us = self.slowlog_threshold_us;
        limits.slowlog_entries_max = self.slowlog_entries_max;
    }
}

impl NodeConfig {
    /// Defaults: data in `data_dir`, [`defaults::LISTEN`], fsync always,
    /// the saved state loaded in the background once the node listens
    /// (format-spec/storage.md section 11, "Loading in the background").
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let mut engine = EngineConfig::new(data_dir);
        engine.fsync = FsyncPolicy::Always;
        engine.load_in_background = true;
        NodeConfig {
            // Invariant: a literal address.
            listen: defaults::LISTEN
                .parse()
                .expect("invariant: valid default address"),
            engine,
            token: None,
            limits: Limits::default(),
            sends: SendPolicy::anyone(),
            metrics_listen: None,
            build: Build::default(),
            leadership: None,
            shards: None,
        }
    }

    /// Descriptors the node needs at most: every cached segment file, every
    /// connection, the engine's reserve (journal, checkpoint, directories,
    /// the loop's own), and the spare one kept for refusing connections.
    pub fn descriptors_needed(&self) -> u64 {
        self.engine.open_segments_max as u64 + self.limits.connections_max as u64 + FD_RESERVE + 1
    }

    /// Fits segment files and connections into `nofile`, the soft
    /// RLIMIT_NOFILE the node runs with: if both at their configured
    /// maximum do not fit, both are lowered in proportion (each at least its
    /// floor) and the returned warning says so and what limit would keep
    /// them. Fails when not even the floors fit.
    pub fn fit_descriptors(&mut self, nofile: u64) -> Result<Option<String>, String> {
        let need = self.descriptors_needed();
        if need <= nofile {
            return Ok(None);
        }
        let (segments, connections) = (
            self.engine.open_segments_max as u64,
            self.limits.connections_max as u64,
        );
        // The engine needs 2 segment files; a node needs 1 connection.
        let avail = nofile.saturating_sub(FD_RESERVE + 1);
        if avail < 3 {
            return Err(format!(
                "the open-file limit (RLIMIT_NOFILE) is {nofile}: a node needs at least {} \
                 descriptors ({FD_RESERVE} reserved, 2 segment files, 1 connection, 1 spare); \
                 raise it (ulimit -n) to at least {need} for the configured \
                 open_segments_max {segments} and connections_max {connections}",
                FD_RESERVE + 4
            ));
        }
        let new_connections = (connections * avail / (segments + connections)).clamp(1, avail - 2);
        let new_segments = avail - new_connections;
        self.limits.connections_max = new_connections as usize;
        self.engine.open_segments_max = new_segments as usize;
        Ok(Some(format!(
            "the open-file limit (RLIMIT_NOFILE) is {nofile}: connections_max lowered from \
             {connections} to {new_connections} and open_segments_max from {segments} to \
             {new_segments}; raise the limit (ulimit -n) to at least {need} to keep them"
        )))
    }

    /// Checks the relationships between limits.
    pub fn validate(&self) -> Result<(), String> {
        let l = &self.limits;
        if l.frame_bytes_max < FRAME_BYTES_MAX_FLOOR {
            return Err(format!(
                "frame_bytes_max must be at least {FRAME_BYTES_MAX_FLOOR}"
            ));
        }
        let need = protocol::frame_bytes_min_for_payload(self.engine.payload_bytes_max as u32);
        if (l.frame_bytes_max as u64) < need || self.engine.payload_bytes_max > u32::MAX as usize {
            return Err(format!(
                "frame_bytes_max {} cannot carry a payload of payload_bytes_max {} (needs {need})",
                l.frame_bytes_max, self.engine.payload_bytes_max
            ));
        }
        if l.output_bytes_max < l.frame_bytes_max as usize {
            return Err("output_bytes_max must hold at least one frame of frame_bytes_max".into());
        }
        if l.connections_max == 0 || l.requests_in_flight_max == 0 {
            return Err("connections_max and requests_in_flight_max must be positive".into());
        }
        if l.members_page_max == 0 {
            return Err("members_page_max must be positive".into());
        }
        if l.slowlog_entries_max > defaults::SLOWLOG_ENTRIES_MAX_MAX {
            return Err(format!(
                "slowlog_entries_max must be at most {}",
                defaults::SLOWLOG_ENTRIES_MAX_MAX
            ));
        }
        if l.frame_timeout_ms == 0 {
            return Err("frame_timeout_ms must be positive".into());
        }
        // One connection at its own limit, plus the response that took it
        // there, must fit the node's budget: else a single well-behaved
        // connection could be closed for the node's total.
        let one_out = l.output_bytes_max + 4 + l.frame_bytes_max as usize;
        if l.output_bytes_total_max < one_out {
            return Err(format!(
                "output_bytes_total_max must be at least output_bytes_max + 4 + frame_bytes_max ({one_out})"
            ));
        }
        let one_in = 4 + l.frame_bytes_max as usize;
        if l.input_bytes_total_max < one_in {
            return Err(format!(
                "input_bytes_total_max must hold one frame of frame_bytes_max ({one_in})"
            ));
        }
        self.engine.validate().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        NodeConfig::new("/tmp/x").validate().unwrap();
    }

    #[test]
    fn descriptors_are_shared_between_segments_and_connections() {
        let mut c = NodeConfig::new("/tmp/x");
        let need = c.descriptors_needed();
        assert_eq!(need, 16_384 + 10_000 + FD_RESERVE + 1);
        assert_eq!(c.fit_descriptors(need), Ok(None));
        assert_eq!(c.limits.connections_max, 10_000);
        // 20,000 descriptors: both lowered, and they fit with the reserve.
        let warning = c.fit_descriptors(20_000).unwrap().unwrap();
        assert!(warning.contains("20000") && warning.contains(&need.to_string()));
        assert!(c.descriptors_needed() <= 20_000);
        assert!(c.limits.connections_max >= 7_000 && c.engine.open_segments_max >= 12_000);
        c.validate().unwrap();
        // A tiny limit keeps the floors, or refuses to start.
        let mut c = NodeConfig::new("/tmp/x");
        c.fit_descriptors(FD_RESERVE + 4).unwrap();
        assert_eq!(
            (c.limits.connections_max, c.engine.open_segments_max),
            (1, 2)
        );
        let mut c = NodeConfig::new("/tmp/x");
        assert!(c.fit_descriptors(FD_RESERVE + 3).is_err());
    }

    /// Live limits move between configurations whole, and only they.
    #[test]
    fn live_limits_change_only_themselves() {
        let mut changed = Limits::default();
        changed.output_bytes_max += 1;
        changed.output_bytes_total_max += 1;
        changed.input_bytes_total_max += 1;
        changed.long_poll_ms_max += 1;
        changed.subscriptions_max += 1;
        changed.frame_timeout_ms += 1;
        changed.slowlog_threshold_us += 1;
        changed.slowlog_entries_max += 1;
        changed.frame_bytes_max += 1;
        changed.connections_max += 1;
        let mut running = Limits::default();
        LiveLimits::of(&changed).apply_to(&mut running);
        let mut want = changed;
        want.frame_bytes_max = running.frame_bytes_max;
        want.connections_max = running.connections_max;
        assert_eq!(running, want);
        assert_eq!(running.frame_bytes_max, Limits::default().frame_bytes_max);
    }

    #[test]
    fn a_frame_limit_too_small_for_the_payload_limit_is_refused() {
        let mut c = NodeConfig::new("/tmp/x");
        c.limits.frame_bytes_max = 1 << 20;
        assert!(c.validate().is_err());
    }
}
