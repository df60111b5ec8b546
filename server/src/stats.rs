//! Node statistics: counters and per-operation latency histograms, reported
//! by STATS as `(name, value)` pairs so new figures need no format change.

use std::collections::BTreeMap;
use std::time::Duration;

use hdrhistogram::Histogram;

use crate::protocol::Opcode;

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
    pub errors: u64,
    /// Connections closed because a frame did not arrive whole in time.
    pub frames_timed_out: u64,
    /// Connections closed because the node's queued output passed
    /// output_bytes_total_max (the ones with the most queued).
    pub connections_shed: u64,
    /// Frames refused because the node's input passed input_bytes_total_max.
    pub input_refused: u64,
    requests: BTreeMap<&'static str, u64>,
    latency: BTreeMap<&'static str, Histogram<u64>>,
}

pub fn op_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Hello => "hello",
        Opcode::Auth => "auth",
        Opcode::Ping => "ping",
        Opcode::Stats => "stats",
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
        Opcode::Subscribe => "subscribe",
        Opcode::Unsubscribe => "unsubscribe",
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

    /// All figures as `(name, value)`; latencies in microseconds.
    pub fn report(
        &self,
        connections: usize,
        buffers: Buffers,
        engine: &tidemark_engine::EngineStats,
    ) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = vec![
            ("connections".into(), connections as u64),
            ("output_bytes_queued".into(), buffers.output as u64),
            ("input_bytes_buffered".into(), buffers.input as u64),
            ("connections_shed".into(), self.connections_shed),
            ("input_refused".into(), self.input_refused),
            ("dedup_entries".into(), engine.dedup_entries),
            ("dedup_windows_dropped".into(), engine.dedup_windows_dropped),
            ("connections_accepted".into(), self.connections_accepted),
            ("connections_refused".into(), self.connections_refused),
            ("bytes_in".into(), self.bytes_in),
            ("bytes_out".into(), self.bytes_out),
            ("deliveries".into(), self.deliveries),
            ("pushes".into(), self.pushes),
            ("resyncs".into(), self.resyncs),
            ("acks".into(), engine.acks),
            ("errors".into(), self.errors),
            ("frames_timed_out".into(), self.frames_timed_out),
            ("appends".into(), engine.appends),
            ("duplicates".into(), engine.duplicates),
            ("commit_rounds".into(), engine.rounds),
            ("commit_round_records_max".into(), engine.round_records_max),
            ("fsyncs".into(), engine.journal_syncs),
            ("checkpoints".into(), engine.checkpoints),
            ("checkpoint_syncs".into(), engine.checkpoint_syncs),
            ("groups".into(), engine.groups),
            ("open_segments".into(), engine.open_segments),
        ];
        if let Some(mean) = engine.appends.checked_div(engine.rounds) {
            out.push(("commit_round_records_mean".into(), mean));
        }
        for (op, n) in &self.requests {
            out.push((format!("requests_{op}"), *n));
        }
        for (op, h) in &self.latency {
            for (label, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)] {
                out.push((format!("latency_{op}_{label}_us"), h.value_at_quantile(q)));
            }
            out.push((format!("latency_{op}_max_us"), h.max()));
        }
        out
    }
}
