//! Node statistics: counters and per-operation latency histograms, reported
//! by STATS as `(name, value)` pairs so new figures need no format change,
//! and the text figures of INFO.
//!
//! Every name is `area.figure` (lowercase, dot-separated, see [`NAME_RULE`])
//! and listed in [`STAT_NAMES`] with its kind and unit, which a test checks
//! against the table in format-spec/protocol.md section 4.4.1 and against
//! what [`Stats::report`] emits; the metrics endpoint (`metrics.rs`) takes
//! each figure's Prometheus type from it. A new figure is one row here and
//! one row there. INFO's names ([`INFO_NAMES`]) are checked the same way
//! against section 4.24.
//!
//! Who owns what: the counters here belong to the event loop; the
//! engine's figures are its atomics (`Engine::stats`, O(1) each); the
//! disk and memory figures are the host refresher's (`host.rs`). A report
//! reads them all and walks no group, member or file.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tidemark_engine::{Engine, FsyncPolicy};

use crate::config::{
    Limits, NodeConfig, RaftFigures, RaftPeerFigures, RAFT_PROGRESS_STATES, RAFT_ROLES,
};
use crate::durations::Durations;
use crate::host::HostFigures;
use crate::slowlog::SlowLog;
use tidemark_protocol::{ErrorCode, Opcode};

/// Whether a figure only grows (since the node started) or is a level now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    Counter,
    Gauge,
}

/// How a figure is served at `/metrics` (`metrics.rs`,
/// format-spec/metrics.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// A series named by Prometheus's conventions from the STATS name
    /// (`metrics.rs`): base units, `_total` on counters.
    Conventional,
    /// A series of this name (where the conventional one would mislead).
    Renamed(&'static str),
    /// Not a series of its own: the figure is served by this standard
    /// series (so no figure is served twice).
    ServedAs(&'static str),
}

/// One documented STATS name. In `name`, `{op}` stands for every request
/// opcode's [`op_name`], `{q}` for every latency figure of
/// [`LATENCY_FIGURES`], `{code}` for every error code's [`code_name`],
/// `{role}` for every [`RAFT_ROLES`], `{state}` for every
/// [`RAFT_PROGRESS_STATES`] (see [`template_values`]) and `{peer}` for a
/// member's node id.
#[derive(Clone, Copy, Debug)]
pub struct StatName {
    pub name: &'static str,
    pub kind: StatKind,
    pub unit: &'static str,
    pub metric: Metric,
}

#[cfg(test)]
/// What every name matches: lowercase words of `[a-z0-9_]`, each starting
/// with a letter, joined by dots, at least two words.
pub const NAME_RULE: &str = "[a-z][a-z0-9_]*(.[a-z][a-z0-9_]*)+";

/// The latency figures reported per opcode: quantiles, then the maximum.
pub const LATENCY_FIGURES: [(&str, Option<f64>); 5] = [
    ("p50", Some(0.5)),
    ("p90", Some(0.9)),
    ("p99", Some(0.99)),
    ("p999", Some(0.999)),
    ("max", None),
];

const fn stat(name: &'static str, kind: StatKind, unit: &'static str) -> StatName {
    StatName {
        name,
        kind,
        unit,
        metric: Metric::Conventional,
    }
}

/// A name whose figure `/metrics` serves as `metric` ([`Metric`]).
const fn served(
    name: &'static str,
    kind: StatKind,
    unit: &'static str,
    metric: Metric,
) -> StatName {
    StatName {
        name,
        kind,
        unit,
        metric,
    }
}

/// The `/metrics` histogram that serves the latency quantiles.
const DURATIONS: Metric = Metric::ServedAs(crate::durations::REQUEST_DURATION);

use StatKind::{Counter, Gauge};

/// Every name STATS reports (format-spec/protocol.md 4.4.1, same order).
pub const STAT_NAMES: &[StatName] = &[
    stat("net.connections", Gauge, "connections"),
    stat("net.connections_accepted", Counter, "connections"),
    stat("net.connections_refused", Counter, "connections"),
    stat("net.bytes_in", Counter, "bytes"),
    stat("net.bytes_out", Counter, "bytes"),
    stat("net.deliveries", Counter, "records"),
    stat("net.pushes", Counter, "frames"),
    stat("net.resyncs", Counter, "frames"),
    stat("net.receipts", Counter, "frames"),
    stat("net.errors", Counter, "frames"),
    stat("net.frames_timed_out", Counter, "connections"),
    stat("net.output_bytes_queued", Gauge, "bytes"),
    stat("net.input_bytes_buffered", Gauge, "bytes"),
    stat("net.connections_shed", Counter, "connections"),
    stat("net.input_refused", Counter, "frames"),
    stat("net.requests_waited_for_load", Counter, "requests"),
    stat("engine.appends", Counter, "messages"),
    stat("engine.duplicates", Counter, "messages"),
    stat("engine.acks", Counter, "acks"),
    stat("engine.commit_rounds", Counter, "rounds"),
    stat("engine.commit_round_records_max", Gauge, "records"),
    stat("engine.commit_round_records_mean", Gauge, "records"),
    stat("engine.fsyncs", Counter, "syncs"),
    stat("engine.checkpoints", Counter, "checkpoints"),
    stat("engine.checkpoint_syncs", Counter, "syncs"),
    stat("engine.checkpoint_bytes", Counter, "bytes"),
    stat("engine.checkpoint_bytes_max", Gauge, "bytes"),
    stat("engine.checkpoint_ms", Counter, "milliseconds"),
    stat("engine.checkpoint_ms_max", Gauge, "milliseconds"),
    stat("engine.journal_bytes", Counter, "bytes"),
    stat("engine.groups", Gauge, "groups"),
    stat("engine.open_segments", Gauge, "files"),
    stat("engine.dedup_entries", Gauge, "entries"),
    stat("engine.dedup_windows_dropped", Counter, "windows"),
    stat("engine.group_loads", Counter, "groups"),
    stat("engine.groups_in_use", Gauge, "groups"),
    stat("limits.frame_bytes_max", Gauge, "bytes"),
    stat("limits.payload_bytes_max", Gauge, "bytes"),
    stat("limits.requests_in_flight_max", Gauge, "requests"),
    stat("limits.batch_ack_items_max", Gauge, "items"),
    stat("limits.connections_max", Gauge, "connections"),
    stat("limits.output_bytes_max", Gauge, "bytes"),
    stat("limits.output_bytes_total_max", Gauge, "bytes"),
    stat("limits.input_bytes_total_max", Gauge, "bytes"),
    stat("limits.frame_timeout_ms", Gauge, "ms"),
    stat("limits.long_poll_ms_max", Gauge, "ms"),
    stat("limits.subscriptions_max", Gauge, "subscriptions"),
    stat("limits.members_page_max", Gauge, "members"),
    stat("limits.receipt_members_max", Gauge, "members"),
    stat("limits.receipt_interval_ms", Gauge, "ms"),
    stat("limits.backups_max", Gauge, "backups"),
    stat("limits.members_per_group_max", Gauge, "members"),
    stat("limits.groups_per_user_max", Gauge, "groups"),
    stat("limits.groups_max", Gauge, "groups"),
    stat("limits.disk_free_min_bytes", Gauge, "bytes"),
    stat("limits.commit_round_bytes_max", Gauge, "bytes"),
    stat("limits.cursor_flush_ms", Gauge, "ms"),
    stat("limits.retention_check_ms", Gauge, "ms"),
    stat("limits.change_window_ms", Gauge, "ms"),
    stat("limits.dedup_window_sends", Gauge, "sends"),
    stat("limits.dedup_window_ms", Gauge, "ms"),
    stat("limits.dedup_entries_max", Gauge, "entries"),
    stat("limits.dedup_entries_total_max", Gauge, "entries"),
    stat("limits.open_segments_max", Gauge, "files"),
    stat("limits.segment_bytes_max", Gauge, "bytes"),
    stat("requests.{op}", Counter, "requests"),
    served("latency.{op}.{q}_us", Gauge, "us", DURATIONS),
    served(
        "server.uptime_ms",
        Counter,
        "ms",
        Metric::ServedAs("process_start_time_seconds"),
    ),
    stat("server.pid", Gauge, "id"),
    stat("server.started_unix_ms", Gauge, "ms"),
    stat("server.stats_omitted", Gauge, "names"),
    stat("storage.memberships", Gauge, "memberships"),
    stat("storage.messages_stored", Gauge, "messages"),
    stat("storage.groups_damaged", Gauge, "groups"),
    stat("storage.writes_stopped", Gauge, "flag"),
    stat("storage.state_loading", Gauge, "flag"),
    stat("storage.record_bytes_appended", Counter, "bytes"),
    stat("storage.disk_bytes_used", Gauge, "bytes"),
    stat("storage.journal_bytes", Gauge, "bytes"),
    stat("storage.disk_bytes_free", Gauge, "bytes"),
    served(
        "storage.disk_bytes_total",
        Gauge,
        "bytes",
        Metric::Renamed("tidemark_storage_disk_size_bytes"),
    ),
    stat("storage.disk_scan_ms", Gauge, "ms"),
    stat("storage.disk_scan_age_ms", Gauge, "ms"),
    served(
        "memory.resident_bytes",
        Gauge,
        "bytes",
        Metric::ServedAs("process_resident_memory_bytes"),
    ),
    served(
        "memory.virtual_bytes",
        Gauge,
        "bytes",
        Metric::ServedAs("process_virtual_memory_bytes"),
    ),
    stat("errors.{code}", Counter, "frames"),
    stat("slowlog.entries", Gauge, "entries"),
    stat("slowlog.recorded", Counter, "requests"),
    stat("log.events_suppressed", Counter, "events"),
    stat("limits.slowlog_threshold_us", Gauge, "us"),
    stat("limits.slowlog_entries_max", Gauge, "entries"),
    stat("server.cluster_map_epoch", Gauge, "epoch"),
    stat("server.cluster_node_id", Gauge, "id"),
    served("latency.{op}.{q}_ns", Gauge, "ns", DURATIONS),
    stat("raft.role.{role}", Gauge, "flag"),
    stat("raft.term", Gauge, "term"),
    stat("raft.leader_id", Gauge, "id"),
    stat("raft.commit_index", Gauge, "index"),
    stat("raft.applied_index", Gauge, "index"),
    stat("raft.last_index", Gauge, "index"),
    stat("raft.elections_started", Counter, "elections"),
    stat("raft.elections_won", Counter, "elections"),
    stat("raft.leader_changes", Counter, "leaders"),
    stat("raft.proposals_refused", Counter, "proposals"),
    stat("raft.snapshot_sends_started", Counter, "snapshots"),
    stat("raft.snapshot_sends_finished", Counter, "snapshots"),
    stat("raft.snapshot_sends_failed", Counter, "snapshots"),
    stat("raft.snapshots_installed", Counter, "snapshots"),
    stat("raft.rounds_parked", Counter, "rounds"),
    stat("raft.peer_{peer}.voter", Gauge, "flag"),
    stat("raft.peer_{peer}.match_index", Gauge, "index"),
    stat("raft.peer_{peer}.next_index", Gauge, "index"),
    stat("raft.peer_{peer}.lag_entries", Gauge, "entries"),
    stat("raft.peer_{peer}.lag_bytes", Gauge, "bytes"),
    stat("raft.peer_{peer}.last_contact_ms", Gauge, "ms"),
    stat("raft.peer_{peer}.snapshot_sending", Gauge, "flag"),
    stat("raft.peer_{peer}.progress.{state}", Gauge, "flag"),
    stat("raft.inbound.authenticated", Counter, "connections"),
    stat("raft.inbound.handshakes_failed", Counter, "handshakes"),
    stat("raft.inbound.refused_at_cap", Counter, "connections"),
    stat("raft.inbound.frames_forged", Counter, "frames"),
    stat("raft.inbound.idle_closed", Counter, "connections"),
    stat("raft.inbound.handshaking", Gauge, "connections"),
    stat("raft.inbound.open", Gauge, "connections"),
    stat("engine.checkpoints_failed", Counter, "checkpoints"),
    stat("engine.last_checkpoint_unix_ms", Gauge, "ms"),
    stat("engine.last_checkpoint_failed_unix_ms", Gauge, "ms"),
    stat("backup.streams_finished", Counter, "backups"),
    stat("backup.streams_failed", Counter, "backups"),
    stat("backup.last_finished_unix_ms", Gauge, "ms"),
    stat("backup.last_failed_unix_ms", Gauge, "ms"),
];

#[cfg(test)]
/// The placeholders of [`STAT_NAMES`]' templates.
pub const PLACEHOLDERS: [&str; 6] = ["op", "q", "code", "role", "state", "peer"];

/// Every name INFO reports (format-spec/protocol.md 4.24, same order).
pub const INFO_NAMES: [&str; 6] = [
    "server.version",
    "server.build_commit",
    "server.data_dir",
    "server.fsync_policy",
    "server.listen",
    "server.metrics_listen",
];

/// The values a template placeholder of a fixed set (`op`, `q`, `code`,
/// `role`, `state`) stands for; none for `peer` (any node id).
pub fn template_values(placeholder: &str) -> Vec<&'static str> {
    match placeholder {
        "op" => Opcode::ALL.iter().map(|&op| op_name(op)).collect(),
        "q" => LATENCY_FIGURES.iter().map(|(q, _)| *q).collect(),
        "code" => ErrorCode::ALL.iter().map(|&c| code_name(c)).collect(),
        "role" => RAFT_ROLES.to_vec(),
        "state" => RAFT_PROGRESS_STATES.to_vec(),
        _ => Vec::new(),
    }
}

/// Whether `value` is one a placeholder stands for: a node id (decimal,
/// non-zero, no leading zero) for `peer`, one of [`template_values`] for
/// the others.
pub fn placeholder_admits(placeholder: &str, value: &str) -> bool {
    match placeholder {
        "peer" => {
            !value.starts_with('0')
                && !value.is_empty()
                && value.bytes().all(|b| b.is_ascii_digit())
                && value.parse::<u64>().is_ok()
        }
        _ => template_values(placeholder).contains(&value),
    }
}

#[cfg(test)]
/// The node ids the tests expand `{peer}` with.
pub const EXAMPLE_PEERS: [&str; 2] = ["2", "3"];

#[cfg(test)]
/// A name of [`STAT_NAMES`] with each placeholder replaced by each of its
/// values (`{peer}` by [`EXAMPLE_PEERS`]): every concrete name the
/// template stands for.
pub fn expand(template: &str) -> Vec<String> {
    let mut names = vec![template.to_string()];
    for placeholder in PLACEHOLDERS {
        let token = format!("{{{placeholder}}}");
        if !template.contains(&token) {
            continue;
        }
        let values = match placeholder {
            "peer" => EXAMPLE_PEERS.to_vec(),
            _ => template_values(placeholder),
        };
        names = names
            .iter()
            .flat_map(|n| values.iter().map(|v| n.replace(&token, v)))
            .collect();
    }
    names
}

/// An error code's name in `errors.{code}`: the spec's name in lowercase.
pub fn code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::BadFrame => "bad_frame",
        ErrorCode::UnsupportedVersion => "unsupported_version",
        ErrorCode::Unauthenticated => "unauthenticated",
        ErrorCode::FrameTooLarge => "frame_too_large",
        ErrorCode::TooManyRequestsInFlight => "too_many_requests_in_flight",
        ErrorCode::Overloaded => "overloaded",
        ErrorCode::ShuttingDown => "shutting_down",
        ErrorCode::GroupNotFound => "group_not_found",
        ErrorCode::GroupExists => "group_exists",
        ErrorCode::NotMember => "not_member",
        ErrorCode::PayloadTooLarge => "payload_too_large",
        ErrorCode::CursorAboveHead => "cursor_above_head",
        ErrorCode::BelowRetentionFloor => "below_retention_floor",
        ErrorCode::LimitExceeded => "limit_exceeded",
        ErrorCode::ChangeRefused => "change_refused",
        ErrorCode::KeyReused => "key_reused",
        ErrorCode::GroupDamaged => "group_damaged",
        ErrorCode::WritesStopped => "writes_stopped",
        ErrorCode::Internal => "internal",
        ErrorCode::NotLeader => "not_leader",
        ErrorCode::WrongSet => "wrong_set",
        ErrorCode::MembershipRefused => "membership_refused",
        // The node sends only the codes it defines.
        ErrorCode::Unknown(_) => "unknown",
    }
}

/// The fsync policy as `serve --fsync` takes it.
pub fn fsync_text(policy: FsyncPolicy) -> String {
    match policy {
        FsyncPolicy::Always => "always".into(),
        FsyncPolicy::Never => "never".into(),
        FsyncPolicy::Interval(d) => format!("interval:{}", d.as_millis()),
    }
}

/// INFO's items, in [`INFO_NAMES`] order: fixed while the node runs, so
/// built once at start, with the addresses the node bound (`listen` and
/// the metrics endpoint's, which a port 0 in the configuration leaves to
/// the system).
pub fn info_items(
    config: &NodeConfig,
    listen: std::net::SocketAddr,
    metrics: Option<std::net::SocketAddr>,
) -> Vec<(String, String)> {
    let values = [
        config.build.version.clone(),
        config.build.commit.clone(),
        config.engine.data_dir.display().to_string(),
        fsync_text(config.engine.fsync),
        listen.to_string(),
        metrics.map_or_else(String::new, |a| a.to_string()),
    ];
    INFO_NAMES
        .iter()
        .zip(values)
        .map(|(n, v)| (n.to_string(), v))
        .collect()
}

/// The node's connection buffers at the moment of a report (gauges).
#[derive(Clone, Copy, Debug, Default)]
pub struct Buffers {
    pub output: usize,
    pub input: usize,
}

/// Counters of the node since start. Owned by the event loop thread.
#[derive(Default)]
pub struct Stats {
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Records sent in PULL, SYNC, HISTORY and PUSH responses.
    pub deliveries: u64,
    pub pushes: u64,
    pub resyncs: u64,
    /// RECEIPT and RECEIPT_COUNTS frames queued.
    pub receipts: u64,
    pub errors: u64,
    /// Connections closed because a frame did not arrive whole in time.
    pub frames_timed_out: u64,
    /// Connections closed because the node's queued output passed
    /// output_bytes_total_max (the ones with the most queued).
    pub connections_shed: u64,
    /// Frames refused because the node's input passed input_bytes_total_max.
    pub input_refused: u64,
    /// Requests that waited in the input buffer for the engine's
    /// maintenance worker (their group's first use since open).
    pub requests_waited_for_load: u64,
    /// BACKUP streams that ended with their BACKUP response, and those
    /// that did not (an error, the client gone or stalled), with the Unix
    /// ms of the last of each (0: none yet).
    backups_finished: u64,
    backups_failed: u64,
    last_backup_finished_unix_ms: u64,
    last_backup_failed_unix_ms: u64,
    /// Requests handled, per opcode.
    requests: ByOpcode<u64>,
    /// Per opcode.
    latency: ByOpcode<OpLatency>,
    /// ERROR frames by code, in [`ErrorCode::ALL`] order.
    errors_by_code: [u64; ErrorCode::ALL.len()],
}

/// A figure per request opcode, held at the opcode's byte: every request
/// updates two (its count and its durations) with one index each, neither
/// hashing nor comparing names. A report lists the opcodes that have one
/// by name ([`ByOpcode::by_name`]), the order STATS and `/metrics` give.
struct ByOpcode<T> {
    /// Indexed by [`Opcode::request_byte`]; grown on first use.
    slots: Vec<Option<T>>,
}

impl<T> Default for ByOpcode<T> {
    fn default() -> Self {
        ByOpcode { slots: Vec::new() }
    }
}

impl<T> ByOpcode<T> {
    /// The opcode's figure, made by `new` on its first use.
    fn entry(&mut self, op: Opcode, new: impl FnOnce() -> T) -> &mut T {
        let i = usize::from(op.request_byte());
        if i >= self.slots.len() {
            self.slots.resize_with(i + 1, || None);
        }
        self.slots[i].get_or_insert_with(new)
    }

    /// The opcodes with a figure, by [`op_name`]. O(opcodes), for reports.
    fn by_name(&self) -> Vec<(&'static str, &T)> {
        let mut named: Vec<(&'static str, &T)> = Opcode::ALL
            .iter()
            .filter_map(|op| {
                let figure = self.slots.get(usize::from(op.request_byte()))?.as_ref()?;
                Some((op_name(*op), figure))
            })
            .collect();
        named.sort_unstable_by_key(|(name, _)| *name);
        named
    }
}

/// One opcode's request durations, recorded twice from one measurement:
/// the HDR histogram gives STATS' quantiles, the fixed buckets
/// `/metrics`' histogram (`durations.rs` says why both).
struct OpLatency {
    /// In nanoseconds, 3 significant digits.
    quantiles: Histogram<u64>,
    buckets: Durations,
}

/// What a report reads besides the loop's own counters.
pub struct Sources<'a> {
    pub connections: usize,
    pub buffers: Buffers,
    pub engine: &'a Engine,
    pub limits: &'a Limits,
    pub host: &'a HostFigures,
    pub slowlog: &'a SlowLog,
    pub log_suppressed: u64,
    /// When the node started serving, and the same instant as Unix ms.
    pub started: Instant,
    pub started_unix_ms: u64,
    pub now: Instant,
    /// The epoch of the node's cluster map; 0 without one.
    pub cluster_map_epoch: u64,
    /// The node's id in its replica set; 0 for a single node.
    pub cluster_node_id: u64,
    /// A replica set member's Raft figures (`raft.*`); `None` for a
    /// single node (and a member whose replica is not running yet).
    pub raft: Option<&'a RaftFigures>,
}

pub fn op_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Hello => "hello",
        Opcode::Auth => "auth",
        Opcode::Ping => "ping",
        Opcode::Stats => "stats",
        Opcode::Backup => "backup",
        Opcode::Info => "info",
        Opcode::SlowLog => "slowlog",
        Opcode::Cluster => "cluster",
        Opcode::ClusterMap => "cluster_map",
        Opcode::ClusterChange => "cluster_change",
        Opcode::CreateGroup => "create_group",
        Opcode::DeleteGroup => "delete_group",
        Opcode::Join => "join",
        Opcode::Leave => "leave",
        Opcode::Send => "send",
        Opcode::Pull => "pull",
        Opcode::Ack => "ack",
        Opcode::BatchAck => "batch_ack",
        Opcode::Unread => "unread",
        Opcode::Sync => "sync",
        Opcode::History => "history",
        Opcode::ReadCount => "read_count",
        Opcode::Members => "members",
        Opcode::GroupInfo => "group_info",
        Opcode::SetRetention => "set_retention",
        Opcode::ClearHistory => "clear_history",
        Opcode::Recall => "recall",
        Opcode::Edit => "edit",
        Opcode::HistoryLatest => "history_latest",
        Opcode::Readers => "readers",
        Opcode::Subscribe => "subscribe",
        Opcode::Unsubscribe => "unsubscribe",
        Opcode::SubscribeReceipts => "subscribe_receipts",
    }
}

impl Stats {
    pub fn request(&mut self, op: Opcode) {
        *self.requests.entry(op, || 0) += 1;
    }

    /// Records the time from handling a request to queueing its response,
    /// to the nanosecond: in the HDR histogram (3 significant digits) and
    /// in the fixed buckets. O(1).
    pub fn latency(&mut self, op: Opcode, elapsed: Duration) {
        let l = self.latency.entry(op, || OpLatency {
            // Invariant: constant, valid bounds (1 ns .. 1 h, 3 significant digits).
            quantiles: Histogram::new_with_bounds(1, 3_600_000_000_000, 3)
                .expect("invariant: valid bounds"),
            buckets: Durations::default(),
        });
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX).max(1);
        l.quantiles.saturating_record(ns);
        l.buckets.observe(ns);
    }

    /// Each answered opcode's request durations in the fixed buckets, for
    /// `/metrics`: O(opcodes).
    pub fn durations(&self) -> Vec<(&'static str, Durations)> {
        self.latency
            .by_name()
            .into_iter()
            .map(|(op, l)| (op, l.buckets))
            .collect()
    }

    /// Counts a BACKUP stream that ended, `finished` with its BACKUP
    /// response or not, at `unix_ms` (`backup.*`).
    pub fn backup_ended(&mut self, finished: bool, unix_ms: u64) {
        if finished {
            self.backups_finished += 1;
            self.last_backup_finished_unix_ms = unix_ms;
        } else {
            self.backups_failed += 1;
            self.last_backup_failed_unix_ms = unix_ms;
        }
    }

    /// Counts an ERROR frame with this code (`net.errors`, `errors.{code}`).
    pub fn error(&mut self, code: ErrorCode) {
        self.errors += 1;
        if let Some(i) = ErrorCode::ALL.iter().position(|c| *c == code) {
            self.errors_by_code[i] += 1;
        }
    }

    /// All figures as `(name, value)`, every name one of [`STAT_NAMES`].
    /// `limits` and the engine's configuration give the `limits.*`
    /// figures: what a client cannot learn from HELLO. O(figures): reads
    /// counters and atomics, walks nothing.
    pub fn report(&self, src: &Sources<'_>) -> Vec<(String, u64)> {
        let (connections, buffers, engine, limits) =
            (src.connections, src.buffers, src.engine, src.limits);
        let e = engine.stats();
        let c = engine.config();
        let n = |v: usize| v as u64;
        let host = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let mut out: Vec<(String, u64)> = vec![
            ("net.connections".into(), n(connections)),
            ("net.connections_accepted".into(), self.connections_accepted),
            ("net.connections_refused".into(), self.connections_refused),
            ("net.bytes_in".into(), self.bytes_in),
            ("net.bytes_out".into(), self.bytes_out),
            ("net.deliveries".into(), self.deliveries),
            ("net.pushes".into(), self.pushes),
            ("net.resyncs".into(), self.resyncs),
            ("net.receipts".into(), self.receipts),
            ("net.errors".into(), self.errors),
            ("net.frames_timed_out".into(), self.frames_timed_out),
            ("net.output_bytes_queued".into(), n(buffers.output)),
            ("net.input_bytes_buffered".into(), n(buffers.input)),
            ("net.connections_shed".into(), self.connections_shed),
            ("net.input_refused".into(), self.input_refused),
            (
                "net.requests_waited_for_load".into(),
                self.requests_waited_for_load,
            ),
            ("engine.appends".into(), e.appends),
            ("engine.duplicates".into(), e.duplicates),
            ("engine.acks".into(), e.acks),
            ("engine.commit_rounds".into(), e.rounds),
            (
                "engine.commit_round_records_max".into(),
                e.round_records_max,
            ),
            (
                "engine.commit_round_records_mean".into(),
                e.appends.checked_div(e.rounds).unwrap_or(0),
            ),
            ("engine.fsyncs".into(), e.journal_syncs),
            ("engine.checkpoints".into(), e.checkpoints),
            ("engine.checkpoint_syncs".into(), e.checkpoint_syncs),
            ("engine.checkpoint_bytes".into(), e.checkpoint_bytes),
            ("engine.checkpoint_bytes_max".into(), e.checkpoint_bytes_max),
            ("engine.checkpoint_ms".into(), e.checkpoint_ms_total),
            ("engine.checkpoint_ms_max".into(), e.checkpoint_ms_max),
            ("engine.journal_bytes".into(), e.journal_bytes),
            ("engine.groups".into(), e.groups),
            ("engine.open_segments".into(), e.open_segments),
            ("engine.dedup_entries".into(), e.dedup_entries),
            (
                "engine.dedup_windows_dropped".into(),
                e.dedup_windows_dropped,
            ),
            ("engine.group_loads".into(), e.group_loads),
            ("engine.groups_in_use".into(), e.groups_in_use),
            (
                "limits.frame_bytes_max".into(),
                u64::from(limits.frame_bytes_max),
            ),
            ("limits.payload_bytes_max".into(), n(c.payload_bytes_max)),
            (
                "limits.requests_in_flight_max".into(),
                u64::from(limits.requests_in_flight_max),
            ),
            (
                "limits.batch_ack_items_max".into(),
                n(crate::handlers::batch_ack_items_max(limits)),
            ),
            ("limits.connections_max".into(), n(limits.connections_max)),
            ("limits.output_bytes_max".into(), n(limits.output_bytes_max)),
            (
                "limits.output_bytes_total_max".into(),
                n(limits.output_bytes_total_max),
            ),
            (
                "limits.input_bytes_total_max".into(),
                n(limits.input_bytes_total_max),
            ),
            ("limits.frame_timeout_ms".into(), limits.frame_timeout_ms),
            (
                "limits.long_poll_ms_max".into(),
                u64::from(limits.long_poll_ms_max),
            ),
            (
                "limits.subscriptions_max".into(),
                n(limits.subscriptions_max),
            ),
            (
                "limits.members_page_max".into(),
                n(crate::handlers::members_page_max(limits)),
            ),
            ("limits.backups_max".into(), n(crate::backup::BACKUPS_MAX)),
            (
                "limits.receipt_members_max".into(),
                n(limits.receipt_members_max),
            ),
            (
                "limits.receipt_interval_ms".into(),
                limits.receipt_interval_ms,
            ),
            (
                "limits.members_per_group_max".into(),
                n(c.members_per_group_max),
            ),
            (
                "limits.groups_per_user_max".into(),
                n(c.groups_per_user_max),
            ),
            ("limits.groups_max".into(), n(c.groups_max)),
            ("limits.disk_free_min_bytes".into(), c.disk_free_min_bytes),
            (
                "limits.commit_round_bytes_max".into(),
                n(c.commit_round_bytes_max),
            ),
            ("limits.cursor_flush_ms".into(), c.cursor_flush_ms),
            ("limits.retention_check_ms".into(), c.retention_check_ms),
            ("limits.change_window_ms".into(), c.change_window_ms),
            ("limits.dedup_window_sends".into(), n(c.dedup_window_sends)),
            ("limits.dedup_window_ms".into(), c.dedup_window_ms),
            ("limits.dedup_entries_max".into(), n(c.dedup_entries_max)),
            (
                "limits.dedup_entries_total_max".into(),
                n(c.dedup_entries_total_max),
            ),
            ("limits.open_segments_max".into(), n(c.open_segments_max)),
            ("limits.segment_bytes_max".into(), c.segment_bytes_max),
        ];
        let h = src.host;
        out.extend([
            (
                "server.uptime_ms".into(),
                src.now.saturating_duration_since(src.started).as_millis() as u64,
            ),
            ("server.pid".into(), u64::from(std::process::id())),
            ("server.started_unix_ms".into(), src.started_unix_ms),
            // Set by the STATS answer that has to leave names out to fit
            // its frame (`handlers::stats`); every name fits otherwise.
            ("server.stats_omitted".into(), 0),
            ("storage.memberships".into(), e.memberships),
            ("storage.messages_stored".into(), e.messages_stored),
            ("storage.groups_damaged".into(), e.groups_damaged),
            ("storage.writes_stopped".into(), u64::from(e.writes_stopped)),
            ("storage.state_loading".into(), u64::from(e.state_loading)),
            ("storage.record_bytes_appended".into(), e.bytes_appended),
            ("storage.disk_bytes_used".into(), host(&h.disk_bytes_used)),
            ("storage.journal_bytes".into(), host(&h.journal_bytes)),
            ("storage.disk_bytes_free".into(), host(&h.disk_bytes_free)),
            ("storage.disk_bytes_total".into(), host(&h.disk_bytes_total)),
            ("storage.disk_scan_ms".into(), host(&h.disk_scan_ms)),
            (
                "storage.disk_scan_age_ms".into(),
                h.disk_scan_age_ms(src.now),
            ),
            ("memory.resident_bytes".into(), host(&h.resident_bytes)),
            ("memory.virtual_bytes".into(), host(&h.virtual_bytes)),
            ("slowlog.entries".into(), n(src.slowlog.len())),
            ("slowlog.recorded".into(), src.slowlog.recorded()),
            ("log.events_suppressed".into(), src.log_suppressed),
            (
                "limits.slowlog_threshold_us".into(),
                src.slowlog.threshold_us(),
            ),
            (
                "limits.slowlog_entries_max".into(),
                n(src.slowlog.entries_max()),
            ),
            ("server.cluster_map_epoch".into(), src.cluster_map_epoch),
            ("server.cluster_node_id".into(), src.cluster_node_id),
        ]);
        for (code, count) in ErrorCode::ALL.iter().zip(self.errors_by_code) {
            out.push((format!("errors.{}", code_name(*code)), count));
        }
        for (op, count) in self.requests.by_name() {
            out.push((format!("requests.{op}"), *count));
        }
        for (op, l) in self.latency.by_name() {
            let h = &l.quantiles;
            for (label, q) in LATENCY_FIGURES {
                let ns = q.map_or_else(|| h.max(), |q| h.value_at_quantile(q));
                // Microseconds rounded up: a request is never reported as
                // taking 0 us (what version 1's names always meant).
                out.push((format!("latency.{op}.{label}_us"), ns.div_ceil(1000)));
                out.push((format!("latency.{op}.{label}_ns"), ns));
            }
        }
        if let Some(raft) = src.raft {
            raft_report(raft, &mut out);
        }
        out.extend([
            ("engine.checkpoints_failed".into(), e.checkpoints_failed),
            (
                "engine.last_checkpoint_unix_ms".into(),
                e.last_checkpoint_unix_ms,
            ),
            (
                "engine.last_checkpoint_failed_unix_ms".into(),
                e.last_checkpoint_failed_unix_ms,
            ),
            ("backup.streams_finished".into(), self.backups_finished),
            ("backup.streams_failed".into(), self.backups_failed),
            (
                "backup.last_finished_unix_ms".into(),
                self.last_backup_finished_unix_ms,
            ),
            (
                "backup.last_failed_unix_ms".into(),
                self.last_backup_failed_unix_ms,
            ),
        ]);
        out
    }
}

/// The `raft.*` figures of a STATS report (what [`raft_report`] writes),
/// for a client such as `tidemark cluster status`; `None` if it has none
/// (a single node, or a node older than these names). Names it does not
/// know (a newer node's) are passed over.
pub fn parse_raft_figures(stats: &[(String, u64)]) -> Option<RaftFigures> {
    let mut r = RaftFigures::default();
    let mut peers: BTreeMap<u64, RaftPeerFigures> = BTreeMap::new();
    let mut any = false;
    let known = |list: &[&'static str], name: &str| list.iter().copied().find(|n| *n == name);
    for (name, value) in stats {
        let Some(rest) = name.strip_prefix("raft.") else {
            continue;
        };
        any = true;
        let v = *value;
        if let Some(role) = rest.strip_prefix("role.") {
            if v == 1 {
                r.role = known(&RAFT_ROLES, role).unwrap_or(r.role);
            }
            continue;
        }
        if let Some(peer) = rest.strip_prefix("peer_") {
            let Some((id, figure)) = peer.split_once('.') else {
                continue;
            };
            let Some(id) = placeholder_admits("peer", id)
                .then(|| id.parse::<u64>().ok())
                .flatten()
            else {
                continue;
            };
            let p = peers.entry(id).or_insert_with(|| RaftPeerFigures {
                node_id: id,
                ..Default::default()
            });
            match figure {
                "voter" => p.voter = v == 1,
                "match_index" => p.match_index = v,
                "next_index" => p.next_index = v,
                "lag_entries" => p.lag_entries = v,
                "lag_bytes" => p.lag_bytes = v,
                "last_contact_ms" => p.last_contact_ms = v,
                "snapshot_sending" => p.snapshot_sending = v == 1,
                other => {
                    if let Some(state) = other.strip_prefix("progress.").filter(|_| v == 1) {
                        p.progress = known(&RAFT_PROGRESS_STATES, state).unwrap_or(p.progress);
                    }
                }
            }
            continue;
        }
        let field = match rest {
            "term" => &mut r.term,
            "leader_id" => &mut r.leader_id,
            "commit_index" => &mut r.commit_index,
            "applied_index" => &mut r.applied_index,
            "last_index" => &mut r.last_index,
            "elections_started" => &mut r.elections_started,
            "elections_won" => &mut r.elections_won,
            "leader_changes" => &mut r.leader_changes,
            "proposals_refused" => &mut r.proposals_refused,
            "snapshot_sends_started" => &mut r.snapshot_sends_started,
            "snapshot_sends_finished" => &mut r.snapshot_sends_finished,
            "snapshot_sends_failed" => &mut r.snapshot_sends_failed,
            "snapshots_installed" => &mut r.snapshots_installed,
            "rounds_parked" => &mut r.rounds_parked,
            "inbound.authenticated" => &mut r.inbound.authenticated,
            "inbound.handshakes_failed" => &mut r.inbound.handshakes_failed,
            "inbound.refused_at_cap" => &mut r.inbound.refused_at_cap,
            "inbound.frames_forged" => &mut r.inbound.frames_forged,
            "inbound.idle_closed" => &mut r.inbound.idle_closed,
            "inbound.handshaking" => &mut r.inbound.handshaking,
            "inbound.open" => &mut r.inbound.open,
            _ => continue,
        };
        *field = v;
    }
    any.then(|| {
        r.peers = peers.into_values().collect();
        r
    })
}

/// The `raft.*` figures of a replica set member: O(members).
fn raft_report(r: &RaftFigures, out: &mut Vec<(String, u64)>) {
    for role in RAFT_ROLES {
        out.push((format!("raft.role.{role}"), u64::from(r.role == role)));
    }
    out.extend([
        ("raft.term".into(), r.term),
        ("raft.leader_id".into(), r.leader_id),
        ("raft.commit_index".into(), r.commit_index),
        ("raft.applied_index".into(), r.applied_index),
        ("raft.last_index".into(), r.last_index),
        ("raft.elections_started".into(), r.elections_started),
        ("raft.elections_won".into(), r.elections_won),
        ("raft.leader_changes".into(), r.leader_changes),
        ("raft.proposals_refused".into(), r.proposals_refused),
        (
            "raft.snapshot_sends_started".into(),
            r.snapshot_sends_started,
        ),
        (
            "raft.snapshot_sends_finished".into(),
            r.snapshot_sends_finished,
        ),
        ("raft.snapshot_sends_failed".into(), r.snapshot_sends_failed),
        ("raft.snapshots_installed".into(), r.snapshots_installed),
        ("raft.rounds_parked".into(), r.rounds_parked),
    ]);
    let i = &r.inbound;
    out.extend([
        ("raft.inbound.authenticated".into(), i.authenticated),
        ("raft.inbound.handshakes_failed".into(), i.handshakes_failed),
        ("raft.inbound.refused_at_cap".into(), i.refused_at_cap),
        ("raft.inbound.frames_forged".into(), i.frames_forged),
        ("raft.inbound.idle_closed".into(), i.idle_closed),
        ("raft.inbound.handshaking".into(), i.handshaking),
        ("raft.inbound.open".into(), i.open),
    ]);
    for p in &r.peers {
        let name = |figure: &str| format!("raft.peer_{}.{figure}", p.node_id);
        out.extend([
            (name("voter"), u64::from(p.voter)),
            (name("match_index"), p.match_index),
            (name("next_index"), p.next_index),
            (name("lag_entries"), p.lag_entries),
            (name("lag_bytes"), p.lag_bytes),
            (name("last_contact_ms"), p.last_contact_ms),
            (name("snapshot_sending"), u64::from(p.snapshot_sending)),
        ]);
        for state in RAFT_PROGRESS_STATES {
            out.push((
                name(&format!("progress.{state}")),
                u64::from(p.progress == state),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name of [`STAT_NAMES`] with its templates expanded.
    fn expanded() -> Vec<String> {
        STAT_NAMES.iter().flat_map(|s| expand(s.name)).collect()
    }

    /// [`NAME_RULE`], checked without a regex engine.
    fn follows_the_rule(name: &str) -> bool {
        let words: Vec<&str> = name.split('.').collect();
        words.len() >= 2
            && words.iter().all(|w| {
                w.starts_with(|c: char| c.is_ascii_lowercase())
                    && w.chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            })
    }

    /// The rows of format-spec/protocol.md 4.4.1: `(name, kind, unit)`.
    fn spec_rows() -> Vec<(String, String, String)> {
        let spec = include_str!("../../../format-spec/protocol.md");
        let start = spec
            .find("#### 4.4.1 ")
            .expect("protocol.md has section 4.4.1, the STATS names");
        let section = &spec[start..];
        let end = section[5..].find("\n#").map_or(section.len(), |e| e + 5);
        section[..end]
            .lines()
            .filter(|l| l.starts_with("| `"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].trim_matches('`').to_string(),
                    cells[2].to_string(),
                    cells[3].to_string(),
                )
            })
            .collect()
    }

    #[test]
    fn every_stat_name_is_in_the_spec_with_its_kind_and_unit() {
        let rows = spec_rows();
        let table: Vec<(String, String, String)> = STAT_NAMES
            .iter()
            .map(|s| {
                let kind = match s.kind {
                    StatKind::Counter => "counter",
                    StatKind::Gauge => "gauge",
                };
                (s.name.to_string(), kind.to_string(), s.unit.to_string())
            })
            .collect();
        assert_eq!(rows, table, "protocol.md 4.4.1 and STAT_NAMES differ");
        for name in expanded() {
            assert!(follows_the_rule(&name), "{name} breaks {NAME_RULE}");
        }
        // The spec's own example and the stats vector use real names.
        for example in ["engine.appends", "net.connections", "latency.send.p99_us"] {
            assert!(expanded().iter().any(|n| n == example), "{example}");
        }
    }

    #[test]
    fn figures_per_opcode_list_the_opcodes_seen_by_name() {
        let mut counts = ByOpcode::<u64>::default();
        for op in [
            Opcode::Send,
            Opcode::Ack,
            Opcode::Ping,
            Opcode::Ack,
            Opcode::Pull,
        ] {
            *counts.entry(op, || 0) += 1;
        }
        let listed: Vec<(&str, u64)> = counts.by_name().into_iter().map(|(n, c)| (n, *c)).collect();
        assert_eq!(
            listed,
            [("ack", 2), ("ping", 1), ("pull", 1), ("send", 1)],
            "only the opcodes counted, in name order"
        );
        let mut stats = Stats::default();
        for op in [Opcode::SubscribeReceipts, Opcode::Hello, Opcode::Ack] {
            stats.latency(op, Duration::from_micros(3));
        }
        let names: Vec<&str> = stats.durations().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["ack", "hello", "subscribe_receipts"]);
    }

    #[test]
    fn the_node_reports_exactly_the_documented_names() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(tidemark_engine::Config::new(dir.path())).unwrap();
        let mut stats = Stats::default();
        for op in Opcode::ALL {
            stats.request(op);
            stats.latency(op, Duration::from_micros(250));
        }
        stats.error(ErrorCode::NotMember);
        stats.error(ErrorCode::NotMember);
        stats.latency(Opcode::Ping, Duration::from_nanos(420));
        stats.backup_ended(true, 1_700_000_000_100);
        stats.backup_ended(false, 1_700_000_000_200);
        stats.backup_ended(true, 1_700_000_000_300);
        let limits = Limits::default();
        let mut slowlog = SlowLog::new(0, 4);
        let addr = "127.0.0.1:1".parse().unwrap();
        slowlog.finished(Opcode::Ping, Duration::ZERO, addr, Default::default());
        let started = Instant::now();
        let host = HostFigures::new(started);
        let src = Sources {
            connections: 3,
            buffers: Buffers::default(),
            engine: &engine,
            limits: &limits,
            host: &host,
            slowlog: &slowlog,
            log_suppressed: 7,
            started,
            started_unix_ms: 1_700_000_000_000,
            now: started + Duration::from_secs(2),
            cluster_map_epoch: 0,
            cluster_node_id: 0,
            raft: None,
        };
        // A single node: no `raft.*` name.
        let single = stats.report(&src);
        assert!(single.iter().all(|(n, _)| !n.starts_with("raft.")));
        // A leader of a set of three reports every name.
        let raft = leader_figures();
        let src = Sources {
            raft: Some(&raft),
            cluster_node_id: 1,
            ..src
        };
        let report = stats.report(&src);
        let mut emitted: Vec<String> = report.iter().map(|(n, _)| n.clone()).collect();
        let mut documented = expanded();
        emitted.sort();
        documented.sort();
        assert_eq!(emitted, documented);
        let get = |name: &str| report.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        assert_eq!(get("net.connections"), Some(3));
        assert_eq!(get("limits.frame_bytes_max"), Some(4 << 20));
        assert_eq!(get("limits.batch_ack_items_max"), Some(233_016));
        assert_eq!(get("limits.cursor_flush_ms"), Some(1000));
        assert!(get("latency.send.p99_us").is_some_and(|v| v >= 250));
        // Sub-microsecond resolution in ns; the us figure rounds up.
        assert!(get("latency.ping.p50_ns").is_some_and(|v| (420..250_000).contains(&v)));
        assert!(get("latency.ping.p50_us").is_some_and(|v| v >= 1));
        assert_eq!(get("errors.not_member"), Some(2));
        assert_eq!(get("errors.bad_frame"), Some(0));
        assert_eq!(get("net.errors"), Some(2));
        assert_eq!(get("server.uptime_ms"), Some(2_000));
        assert_eq!(get("server.pid"), Some(u64::from(std::process::id())));
        assert_eq!(get("slowlog.entries"), Some(1));
        assert_eq!(get("log.events_suppressed"), Some(7));
        assert_eq!(get("storage.writes_stopped"), Some(0));
        assert_eq!(get("storage.disk_scan_age_ms"), Some(0), "no walk yet");
        assert_eq!(get("raft.role.leader"), Some(1));
        assert_eq!(get("raft.role.follower"), Some(0));
        assert_eq!(get("raft.term"), Some(7));
        assert_eq!(get("raft.leader_id"), Some(1));
        assert_eq!(get("raft.commit_index"), Some(120));
        assert_eq!(get("raft.applied_index"), Some(119));
        assert_eq!(get("raft.elections_won"), Some(2));
        assert_eq!(get("raft.peer_3.lag_entries"), Some(40));
        assert_eq!(get("raft.peer_3.last_contact_ms"), Some(2_500));
        assert_eq!(get("raft.peer_3.progress.probe"), Some(1));
        assert_eq!(get("raft.peer_3.progress.replicate"), Some(0));
        assert_eq!(get("raft.peer_2.progress.replicate"), Some(1));
        assert_eq!(get("raft.peer_3.snapshot_sending"), Some(1));
        assert_eq!(get("raft.peer_2.voter"), Some(1));
        assert_eq!(get("raft.peer_3.voter"), Some(0));
        assert_eq!(get("backup.streams_finished"), Some(2));
        assert_eq!(get("backup.streams_failed"), Some(1));
        assert_eq!(get("backup.last_finished_unix_ms"), Some(1_700_000_000_300));
        assert_eq!(get("backup.last_failed_unix_ms"), Some(1_700_000_000_200));
        assert_eq!(get("engine.checkpoints_failed"), Some(0));
        // The same measurements in the fixed buckets of /metrics: every
        // opcode once at 250 us, PING once more at 420 ns.
        let durations = stats.durations();
        assert_eq!(durations.len(), Opcode::ALL.len());
        for (op, d) in &durations {
            let (count, sum) = if *op == "ping" {
                (2, 250_420)
            } else {
                (1, 250_000)
            };
            assert_eq!((d.count(), d.sum_ns()), (count, sum), "{op}");
            let at_250_us = d.cumulative().find(|(le, _)| *le == 250_000).unwrap();
            assert_eq!(at_250_us.1, count, "{op}");
        }
    }

    #[test]
    fn the_raft_figures_read_back_from_a_report() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(tidemark_engine::Config::new(dir.path())).unwrap();
        let (limits, slowlog) = (Limits::default(), SlowLog::new(0, 4));
        let started = Instant::now();
        let host = HostFigures::new(started);
        let mut src = Sources {
            connections: 0,
            buffers: Buffers::default(),
            engine: &engine,
            limits: &limits,
            host: &host,
            slowlog: &slowlog,
            log_suppressed: 0,
            started,
            started_unix_ms: 0,
            now: started,
            cluster_map_epoch: 0,
            cluster_node_id: 1,
            raft: None,
        };
        let stats = Stats::default();
        assert_eq!(parse_raft_figures(&stats.report(&src)), None, "single");
        let leader = leader_figures();
        src.raft = Some(&leader);
        assert_eq!(
            parse_raft_figures(&stats.report(&src)),
            Some(leader_figures())
        );
        let joining = RaftFigures {
            role: "joining",
            ..Default::default()
        };
        src.raft = Some(&joining);
        assert_eq!(
            parse_raft_figures(&stats.report(&src)),
            Some(joining.clone())
        );
        // A newer node's names are passed over; bad peer ids too.
        let mut report = stats.report(&src);
        report.push(("raft.future_figure".into(), 9));
        report.push(("raft.peer_0x.lag_bytes".into(), 9));
        report.push(("raft.peer_2.future".into(), 9));
        let parsed = parse_raft_figures(&report).unwrap();
        assert_eq!(parsed.role, "joining");
        assert_eq!(parsed.peers.len(), 1);
        assert_eq!(parsed.peers[0].node_id, 2);
        assert_eq!(parsed.peers[0].lag_bytes, 0);
    }

    /// Node 1 leading nodes 2 (caught up) and 3 (a learner behind, being
    /// sent a snapshot).
    pub(crate) fn leader_figures() -> RaftFigures {
        RaftFigures {
            role: "leader",
            term: 7,
            leader_id: 1,
            commit_index: 120,
            applied_index: 119,
            last_index: 120,
            elections_started: 3,
            elections_won: 2,
            leader_changes: 4,
            proposals_refused: 1,
            snapshot_sends_started: 2,
            snapshot_sends_finished: 1,
            snapshot_sends_failed: 0,
            snapshots_installed: 0,
            rounds_parked: 6,
            inbound: crate::config::RaftInboundFigures {
                authenticated: 5,
                handshakes_failed: 2,
                refused_at_cap: 1,
                frames_forged: 3,
                idle_closed: 4,
                handshaking: 1,
                open: 2,
            },
            peers: vec![
                crate::config::RaftPeerFigures {
                    node_id: 2,
                    voter: true,
                    match_index: 120,
                    next_index: 121,
                    lag_entries: 0,
                    lag_bytes: 0,
                    last_contact_ms: 12,
                    snapshot_sending: false,
                    progress: "replicate",
                },
                crate::config::RaftPeerFigures {
                    node_id: 3,
                    voter: false,
                    match_index: 80,
                    next_index: 81,
                    lag_entries: 40,
                    lag_bytes: 12_000,
                    last_contact_ms: 2_500,
                    snapshot_sending: true,
                    progress: "probe",
                },
            ],
        }
    }

    /// The rows of format-spec/protocol.md 4.24: the INFO names.
    #[test]
    fn every_info_name_is_in_the_spec_and_reported() {
        let spec = include_str!("../../../format-spec/protocol.md");
        let start = spec
            .find("### 4.24 ")
            .expect("protocol.md has section 4.24, INFO");
        let section = &spec[start..];
        let end = section[5..].find("\n### ").map_or(section.len(), |e| e + 5);
        let rows: Vec<String> = section[..end]
            .lines()
            .filter(|l| l.starts_with("| `server."))
            .map(|l| {
                l.split('|')
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .trim_matches('`')
                    .to_string()
            })
            .collect();
        assert_eq!(rows, INFO_NAMES.to_vec());
        let mut c = NodeConfig::new("/tmp/d");
        c.engine.fsync = FsyncPolicy::Interval(Duration::from_millis(50));
        let items = info_items(&c, "127.0.0.1:7070".parse().unwrap(), None);
        let names: Vec<&str> = items.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, INFO_NAMES.to_vec());
        assert_eq!(items[2].1, "/tmp/d");
        assert_eq!(items[3].1, "interval:50");
        assert_eq!(items[5].1, "", "no metrics endpoint");
        for name in INFO_NAMES {
            assert!(follows_the_rule(name));
        }
    }
}
