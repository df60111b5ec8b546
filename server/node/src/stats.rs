//! Node statistics: counters and per-operation latency histograms, reported
//! by STATS as `(name, value)` pairs so new figures need no format change.
//!
//! Every name is `area.figure` (lowercase, dot-separated, see [`NAME_RULE`])
//! and listed in [`STAT_NAMES`], which a test checks against the table in
//! format-spec/protocol.md section 4.4.1 and against what
//! [`Stats::report`] emits (the list exists for that test, and is compiled
//! only with it). A new figure is one row here and one row there.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;
use tidemark_engine::Engine;

use crate::config::Limits;
use tidemark_protocol::Opcode;

#[cfg(test)]
/// Whether a figure only grows (since the node started) or is a level now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatKind {
    Counter,
    Gauge,
}

#[cfg(test)]
/// One documented STATS name. In `name`, `{op}` stands for every request
/// opcode's [`op_name`] and `{q}` for every latency figure of
/// [`LATENCY_FIGURES`].
#[derive(Clone, Copy, Debug)]
pub struct StatName {
    pub name: &'static str,
    pub kind: StatKind,
    pub unit: &'static str,
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

#[cfg(test)]
const fn stat(name: &'static str, kind: StatKind, unit: &'static str) -> StatName {
    StatName { name, kind, unit }
}

#[cfg(test)]
use StatKind::{Counter, Gauge};

#[cfg(test)]
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
    stat("limits.dedup_window_sends", Gauge, "sends"),
    stat("limits.dedup_window_ms", Gauge, "ms"),
    stat("limits.dedup_entries_max", Gauge, "entries"),
    stat("limits.dedup_entries_total_max", Gauge, "entries"),
    stat("limits.open_segments_max", Gauge, "files"),
    stat("limits.segment_bytes_max", Gauge, "bytes"),
    stat("requests.{op}", Counter, "requests"),
    stat("latency.{op}.{q}_us", Gauge, "us"),
];

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
    requests: BTreeMap<&'static str, u64>,
    latency: BTreeMap<&'static str, Histogram<u64>>,
}

pub fn op_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Hello => "hello",
        Opcode::Auth => "auth",
        Opcode::Ping => "ping",
        Opcode::Stats => "stats",
        Opcode::Backup => "backup",
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
        Opcode::Readers => "readers",
        Opcode::Subscribe => "subscribe",
        Opcode::Unsubscribe => "unsubscribe",
        Opcode::SubscribeReceipts => "subscribe_receipts",
    }
}

impl Stats {
    pub fn request(&mut self, op: Opcode) {
        *self.requests.entry(op_name(op)).or_default() += 1;
    }

    /// Records the time from a request's arrival to its response.
    pub fn latency(&mut self, op: Opcode, elapsed: Duration) {
        let h = self
            .latency
            .entry(op_name(op))
            // Invariant: constant, valid bounds (1 µs .. 1 h, 3 significant digits).
            .or_insert_with(|| {
                Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("invariant: valid bounds")
            });
        h.saturating_record(elapsed.as_micros().max(1) as u64);
    }

    /// All figures as `(name, value)`, every name one of [`STAT_NAMES`];
    /// latencies in microseconds. `limits` and the engine's configuration
    /// give the `limits.*` figures: what a client cannot learn from HELLO.
    pub fn report(
        &self,
        connections: usize,
        buffers: Buffers,
        engine: &Engine,
        limits: &Limits,
    ) -> Vec<(String, u64)> {
        let e = engine.stats();
        let c = engine.config();
        let n = |v: usize| v as u64;
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
        for (op, count) in &self.requests {
            out.push((format!("requests.{op}"), *count));
        }
        for (op, h) in &self.latency {
            for (label, q) in LATENCY_FIGURES {
                let v = q.map_or_else(|| h.max(), |q| h.value_at_quantile(q));
                out.push((format!("latency.{op}.{label}_us"), v));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name of [`STAT_NAMES`] with its templates expanded.
    fn expanded() -> Vec<String> {
        let mut out = Vec::new();
        for s in STAT_NAMES {
            let ops: Vec<&str> = if s.name.contains("{op}") {
                Opcode::ALL.iter().map(|&op| op_name(op)).collect()
            } else {
                vec![""]
            };
            for op in ops {
                let with_op = s.name.replace("{op}", op);
                if with_op.contains("{q}") {
                    for (q, _) in LATENCY_FIGURES {
                        out.push(with_op.replace("{q}", q));
                    }
                } else {
                    out.push(with_op);
                }
            }
        }
        out
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
    fn the_node_reports_exactly_the_documented_names() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Engine::open(tidemark_engine::Config::new(dir.path())).unwrap();
        let mut stats = Stats::default();
        for op in Opcode::ALL {
            stats.request(op);
            stats.latency(op, Duration::from_micros(250));
        }
        let limits = Limits::default();
        let report = stats.report(3, Buffers::default(), &engine, &limits);
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
    }
}
