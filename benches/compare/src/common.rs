//! What every system's run produces (a [`Row`]), the scale of the run, and
//! small helpers shared by the peers.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tidemark_server::bench::plan;

/// Durability class: compared only within a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// An acknowledged write is on disk (fsync / fdatasync before the reply).
    Strict,
    /// Acknowledged writes may be lost in a crash (OS page cache, or a
    /// background fsync about every second).
    Relaxed,
}

impl Durability {
    pub fn label(self) -> &'static str {
        match self {
            Durability::Strict => "durable (fsync before ack)",
            Durability::Relaxed => "relaxed (no fsync before ack)",
        }
    }
}

/// One system's result for one workload.
#[derive(Clone, Debug)]
pub struct Row {
    pub workload: &'static str,
    pub system: String,
    pub durability: Durability,
    /// The setting that gives the durability, e.g. `appendfsync always`.
    pub setting: String,
    pub unit: &'static str,
    pub ops: u64,
    pub secs: f64,
    pub payload_bytes: u64,
    pub latency: Quantiles,
    pub setup_secs: f64,
    pub verified: bool,
    pub verification: String,
    /// Over the wire (loopback TCP) or in process.
    pub wire: bool,
}

impl Row {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }

    pub fn mb_per_sec(&self) -> f64 {
        self.payload_bytes as f64 / 1e6 / self.secs.max(1e-9)
    }
}

/// The parameters every system runs with.
#[derive(clap::Args, Clone, Debug)]
pub struct Scale {
    /// Client connections (threads) for systems reached over the wire.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Requests in flight per connection (Redis pipeline depth, batch size
    /// of the SQL peers' batched ACKs).
    #[arg(long, default_value_t = 16)]
    pub in_flight: usize,
    /// Threads of the in-process systems (SQLite, tidemark's engine) for
    /// reads; their writes go through one writer, as SQLite allows.
    #[arg(long, default_value_t = 2)]
    pub local_threads: usize,
    #[arg(long, default_value_t = 200)]
    pub size: usize,
    #[arg(long, default_value_t = plan::SEED_DEFAULT)]
    pub seed: u64,
    #[arg(long, default_value_t = 10_000)]
    pub w1_groups: u64,
    /// Scaled down from the brief's 1,000,000 so that the whole comparison
    /// (PostgreSQL at ~4,000 durable sends/s) fits in about 20 minutes.
    #[arg(long, default_value_t = 500_000)]
    pub w1_messages: u64,
    #[arg(long, default_value_t = 2_000)]
    pub w2_members: u64,
    #[arg(long, default_value_t = 100_000)]
    pub w2_messages: u64,
    #[arg(long, default_value_t = 200)]
    pub page: u32,
    #[arg(long, default_value_t = 100_000)]
    pub w3_members: u64,
    /// Messages stored in W3's group (the head ACKs are capped at).
    #[arg(long, default_value_t = 1_000)]
    pub w3_messages: u64,
    #[arg(long, default_value_t = 1_000_000)]
    pub w3_acks: u64,
    #[arg(long, default_value_t = 100_000)]
    pub w4_users: u64,
    #[arg(long, default_value_t = 10_000)]
    pub w4_groups: u64,
    #[arg(long, default_value_t = 50)]
    pub w4_groups_per_user: u64,
    #[arg(long, default_value_t = 1_000_000)]
    pub w4_messages: u64,
    #[arg(long, default_value_t = 100_000)]
    pub w4_queries: u64,
}

impl Scale {
    pub fn payloads(&self) -> Vec<Vec<u8>> {
        plan::payloads(self.seed, self.size)
    }

    pub fn w4_plan(&self) -> plan::W4Plan {
        plan::W4Plan {
            seed: self.seed,
            users: self.w4_users,
            groups: self.w4_groups,
            per_user: self.w4_groups_per_user,
            messages: self.w4_messages,
        }
    }

    /// The ACKs of W3 split by member over `parts` workers, in order.
    pub fn w3_split(&self, parts: usize) -> (Vec<Vec<(u64, u64)>>, Vec<u64>) {
        let (acks, model) =
            plan::w3_acks(self.seed, self.w3_members, self.w3_messages, self.w3_acks);
        let mut out = vec![Vec::new(); parts];
        for (m, to) in acks {
            out[(m % parts as u64) as usize].push((m, to));
        }
        (out, model)
    }
}

/// Latency recorder (microseconds).
pub struct Lat(pub Histogram<u64>);

/// The latency figures a row reports, in microseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quantiles {
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl Quantiles {
    pub fn of(lat: &Lat) -> Quantiles {
        Quantiles {
            p50_us: lat.0.value_at_quantile(0.5),
            p99_us: lat.0.value_at_quantile(0.99),
            max_us: lat.0.max(),
        }
    }
}

impl Lat {
    pub fn new() -> Lat {
        Lat(Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"))
    }

    /// Records `n` operations that took `d` together (a pipeline, a batch).
    pub fn record_n(&mut self, d: Duration, n: u64) {
        let us = (d.as_micros() as u64).clamp(1, 3_600_000_000);
        let _ = self.0.record_n(us, n);
    }

    pub fn merge(&mut self, o: &Lat) {
        let _ = self.0.add(&o.0);
    }
}

/// Checks that each group's ids are exactly 1..=n; `ids` holds `(group, id)`.
pub fn dense(groups: u64, ids: &[(u64, u64)]) -> Result<String, String> {
    let mut per: Vec<Vec<u64>> = vec![Vec::new(); groups as usize];
    for &(g, id) in ids {
        per[(g - 1) as usize].push(id);
    }
    for (g, v) in per.iter_mut().enumerate() {
        v.sort_unstable();
        if let Some((k, &id)) = v.iter().enumerate().find(|&(k, &id)| id != k as u64 + 1) {
            return Err(format!("group {}: id #{} is {id}", g + 1, k + 1));
        }
    }
    Ok(format!(
        "ids dense: {} ids, every group exactly 1..=n",
        ids.len()
    ))
}

/// Splits `0..n` into `parts` contiguous ranges.
pub fn split(n: u64, parts: usize) -> Vec<std::ops::Range<u64>> {
    let parts = parts.max(1) as u64;
    (0..parts)
        .map(|i| (n * i / parts)..(n * (i + 1) / parts))
        .collect()
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs `f(worker)` on `n` threads and collects the results.
pub fn parallel<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|k| {
                s.spawn({
                    let f = &f;
                    move || f(k)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    })
}

/// Seconds since `t`.
pub fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// The 1-minute load average (other processes share the cores).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

/// Prints a progress note on stderr.
pub fn note(s: &str) {
    eprintln!("[compare] {s}");
}

/// W1's per-thread `(acknowledged (group, id) pairs, latencies)`, merged.
pub fn merge_sends(parts: Vec<(Vec<(u64, u64)>, Lat)>) -> (Vec<(u64, u64)>, Lat) {
    let mut lat = Lat::new();
    let mut ids = Vec::new();
    for (i, l) in parts {
        ids.extend(i);
        lat.merge(&l);
    }
    (ids, lat)
}

/// W2's per-thread `(deliveries, bytes, latencies, first fault)`, merged.
pub fn merge_pulls(parts: Vec<(u64, u64, Lat, Option<String>)>) -> (u64, u64, Lat, Option<String>) {
    let (mut delivered, mut bytes, mut fault) = (0, 0, None);
    let mut lat = Lat::new();
    for (d, b, l, f) in parts {
        delivered += d;
        bytes += b;
        lat.merge(&l);
        fault = fault.or(f);
    }
    (delivered, bytes, lat, fault)
}

/// W3's per-thread `(latencies, mismatched cursors)`, merged.
pub fn merge_acks(parts: Vec<(Lat, u64)>) -> (Lat, u64) {
    let mut lat = Lat::new();
    let mut bad = 0;
    for (l, b) in parts {
        lat.merge(&l);
        bad += b;
    }
    (lat, bad)
}
