//! `tidemark bench`: the load tool (like redis-benchmark or `nats bench`).
//!
//! Drives a running node (or one it spawns on a temporary directory) over
//! the wire protocol with the workloads of IM-bench v1 (design brief
//! section 5) and a mixed gateway workload, and prints per workload the
//! throughput, MB/s, latency percentiles (HDR histogram), errors and a
//! verification line; `--json` prints one JSON object per workload.
//!
//! - [`args`]: the command line.
//! - [`plan`]: the deterministic inputs (payloads, groups, cursors, ACK
//!   moves, memberships, queries), shared with benches/compare.
//! - `conn`: a pipelining connection on the protocol codec; `context`:
//!   what every workload is handed ([`Ctx`]).
//! - `driver`: one thread per connection, requests in flight, latency.
//! - `workloads`: W1-W4; `mixed`: the mixed workload; `population`: the
//!   population workload (groups held, restarts); `receipts`:
//!   the ACK storm of one large group without and with receipt
//!   subscribers; `joins`: memberships loaded with pipelined JOINs;
//!   `create`: group creation and first joins.
//! - `report`: summaries and JSON; `progress`: the live line on stderr.
//! - `node`: `--spawn` (and the population's stops, kills, restarts,
//!   memory and disk readings).
//!
//! Every workload has a setup (groups, members, stored messages: pipelined
//! too, timed separately, never part of the measured figures), a measured
//! phase, and a verification of what the node answered against a model.

pub mod args;
mod conn;
mod context;
mod create;
mod driver;
mod joins;
mod mixed;
mod node;
pub mod plan;
mod population;
mod progress;
mod receipts;
mod report;
mod workloads;

use serde_json::Value;

pub use args::{BenchArgs, Workload};
use context::Ctx;
use node::SpawnedNode;
pub use report::Report;
/// The type of the JSON objects [`run_workloads`] returns.
pub use serde_json::Value as JsonValue;

/// Runs the workloads and prints each result as it completes: a human
/// summary on stdout, or with `--json` one JSON object per line.
pub fn run(args: BenchArgs) -> Result<(), String> {
    let json = args.json;
    let mut failed = Vec::new();
    run_each(&args, &mut |r| {
        if json {
            println!("{}", r.to_json());
        } else {
            println!("{}", r.human());
        }
        if !r.verified || r.tally.errors > 0 {
            failed.push(r.workload);
        }
    })?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "verification failed or errors in: {}",
            failed.join(", ")
        ))
    }
}

/// Runs the workloads and returns one JSON object per workload (what
/// `--json` prints), printing nothing on stdout.
pub fn run_workloads(args: &BenchArgs) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    run_each(args, &mut |r| out.push(r.to_json()))?;
    Ok(out)
}

fn run_each(args: &BenchArgs, on_report: &mut dyn FnMut(&Report)) -> Result<(), String> {
    if args.connections == 0 || args.in_flight == 0 {
        return Err("--connections and --in-flight must be at least 1".into());
    }
    let token = match &args.token_file {
        Some(p) => {
            let mut t = std::fs::read(p).map_err(|e| format!("token file {}: {e}", p.display()))?;
            while t.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                t.pop();
            }
            Some(t)
        }
        None => None,
    };
    if args.ops.is_some() && !args.workloads().iter().any(|w| w.takes_ops()) {
        let names: Vec<&str> = args.workloads().iter().map(|w| w.name()).collect();
        return Err(format!(
            "--ops sets the measured operations of w3, w4, receipts and joins, none of which runs \
             here ({}); size w1, mixed and population with --messages",
            names.join(", ")
        ));
    }
    if args.workloads().contains(&Workload::Population) && !args.spawn {
        return Err(
            "the population workload needs --spawn: it reads the node's memory and data directory, and stops, kills and restarts it"
                .into(),
        );
    }
    let payloads = plan::payloads(args.seed, args.size);
    for w in args.workloads() {
        let mut spawned = if args.spawn {
            let bin = match &args.node_bin {
                Some(b) => b.clone(),
                None => std::env::current_exe().map_err(|e| format!("current executable: {e}"))?,
            };
            let parent = args.data_dir.clone().unwrap_or_else(std::env::temp_dir);
            let extra = match w {
                Workload::Population => population::node_flags(args, &bin)?,
                Workload::Receipts => receipts::node_flags(args),
                _ => Vec::new(),
            };
            Some(SpawnedNode::start(
                &bin,
                &parent,
                w.name(),
                &args.fsync,
                extra,
                args.keep_data,
            )?)
        } else {
            None
        };
        let ctx = Ctx {
            args,
            addr: spawned
                .as_ref()
                .map_or_else(|| args.addr.clone(), |n| n.addr.clone()),
            token: token.clone(),
            base: args
                .id_base
                .unwrap_or_else(|| if args.spawn { 0 } else { clock_id_base() }),
            payloads: &payloads,
            fsync: if args.spawn {
                args.fsync.clone()
            } else {
                "(the running node's)".to_string()
            },
        };
        let mut report = match w {
            Workload::W1 => workloads::w1(&ctx)?,
            Workload::W2 => workloads::w2(&ctx)?,
            Workload::W3 => workloads::w3(&ctx)?,
            Workload::W4 => workloads::w4(&ctx)?,
            Workload::Mixed => mixed::mixed(&ctx)?,
            Workload::Population => match spawned.as_mut() {
                Some(node) => population::population(&ctx, node)?,
                None => return Err("the population workload needs --spawn".into()),
            },
            Workload::Receipts => receipts::receipts(&ctx)?,
            Workload::Joins => joins::joins(&ctx)?,
            Workload::Create => create::create(&ctx)?,
            Workload::All => continue,
        };
        if let Some(n) = &spawned {
            report
                .extra
                .insert("node_disk_bytes".into(), n.disk_bytes().into());
        }
        on_report(&report);
        drop(spawned);
    }
    Ok(())
}

/// Ids above 2^32 that differ from one run to the next (seconds of the
/// clock), so that runs against the same node use fresh groups and users.
fn clock_id_base() -> u64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(1);
    (secs % 1_000_000_000) << 32
}
