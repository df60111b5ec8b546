//! What every workload of `tidemark bench` is handed ([`Ctx`]): below the
//! workloads and the runner in `mod.rs` that builds it, so that neither
//! imports the other.

use std::time::{Duration, Instant};

use serde_json::Value;

use super::args::BenchArgs;
use super::conn::Conn;
use super::driver::PhaseConfig;

/// Longest wait for a response before a connection is given up.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// What every workload needs: the arguments, where the node is, the ids'
/// offset and the payloads.
pub(crate) struct Ctx<'a> {
    pub args: &'a BenchArgs,
    pub addr: String,
    pub token: Option<Vec<u8>>,
    pub base: u64,
    pub payloads: &'a [Vec<u8>],
    pub fsync: String,
}

impl Ctx<'_> {
    pub fn connect(&self, n: usize) -> Result<Vec<Conn>, String> {
        (0..n)
            .map(|_| Conn::connect(&self.addr, self.token.as_deref(), IO_TIMEOUT))
            .collect()
    }

    /// A setup phase: no deadline, progress unless `--quiet`.
    pub fn setup_phase<'b>(&self, label: &'b str, unit: &'b str) -> PhaseConfig<'b> {
        PhaseConfig {
            label,
            unit,
            in_flight: self.args.in_flight,
            deadline: None,
            progress: !self.args.quiet,
            until_disconnect: false,
        }
    }

    /// The measured phase, starting now (`--duration` counts from here).
    pub fn measured_phase<'b>(&self, label: &'b str, unit: &'b str) -> PhaseConfig<'b> {
        PhaseConfig {
            label,
            unit,
            in_flight: self.args.in_flight,
            deadline: self
                .args
                .duration
                .map(|s| Instant::now() + Duration::from_secs_f64(s.max(0.0))),
            progress: !self.args.quiet,
            until_disconnect: false,
        }
    }

    /// `(connections, in_flight, size, fsync, seed)` as report parameters.
    pub fn common_params(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("connections".into(), self.args.connections.into());
        m.insert("in_flight".into(), self.args.in_flight.into());
        m.insert("size".into(), self.args.size.into());
        m.insert("fsync".into(), self.fsync.clone().into());
        m.insert("seed".into(), self.args.seed.into());
        m.insert("spawned".into(), self.args.spawn.into());
        m
    }
}
