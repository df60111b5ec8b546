//! The observing commands: `stats` (STATS and INFO, grouped by area) and
//! `slowlog` (SLOWLOG, format-spec/protocol.md 4.25).
//!
//! `stats` prints each figure with its kind and unit, as protocol.md
//! 4.4.1 lists them (this binary's copy of that table; a figure of a newer
//! node shows `?`), so counters (which only grow) and gauges (levels now)
//! are never mistaken for each other. INFO and SLOWLOG are additions: they
//! are sent only to a node whose STATS reports `limits.slowlog_entries_max`
//! (protocol.md section 7), and an older node's STATS is printed alone.

use clap::Args;
use serde_json::{json, Value};

use tidemark_client::protocol::Opcode;

use super::{connect, emit, utc, CliError, ConnArgs};

/// The STATS name whose presence says the node answers INFO and SLOWLOG.
const ADDITION_MARK: &str = "limits.slowlog_entries_max";

/// The areas in the order `stats` prints them; others follow, by name.
const AREAS: [&str; 13] = [
    "server", "raft", "storage", "memory", "net", "engine", "backup", "errors", "requests",
    "latency", "slowlog", "log", "limits",
];

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
}

#[derive(Args, Debug)]
pub struct SlowlogArgs {
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    /// List at most this many entries, newest first.
    #[arg(long, default_value_t = 128)]
    max: u32,
    /// Empty the log after listing it (listing and emptying are one step:
    /// nothing is lost in between).
    #[arg(long)]
    reset: bool,
}

/// One printed line of `stats`: name, value, kind, unit.
struct Line {
    name: String,
    value: String,
    kind: &'static str,
    unit: &'static str,
}

fn area(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

pub fn stats(a: StatsArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let stats = c.node_stats()?;
    let info = if stats.iter().any(|(n, _)| n == ADDITION_MARK) {
        c.node_info()?
    } else {
        Vec::new()
    };
    let mut lines: Vec<Line> = info
        .iter()
        .map(|(name, value)| Line {
            name: name.clone(),
            value: value.clone(),
            kind: "text",
            unit: "",
        })
        .collect();
    lines.extend(stats.iter().map(|(name, value)| {
        let (kind, unit) = tidemark_node::stat_kind(name).unwrap_or(("?", ""));
        Line {
            name: name.clone(),
            value: value.to_string(),
            kind,
            unit,
        }
    }));
    // By area (in AREAS order, then unknown ones by name), then as the
    // node listed them.
    let rank = |name: &str| {
        let a = area(name);
        AREAS
            .iter()
            .position(|x| *x == a)
            .map_or((AREAS.len(), a.to_string()), |i| (i, String::new()))
    };
    lines.sort_by_key(|l| rank(&l.name));
    let name_width = lines.iter().map(|l| l.name.len()).max().unwrap_or(0);
    let value_width = lines.iter().map(|l| l.value.len()).max().unwrap_or(0);
    let mut human = String::new();
    let mut current = None;
    for l in &lines {
        let a = area(&l.name);
        if current != Some(a) {
            if current.is_some() {
                human.push('\n');
            }
            human.push_str(&format!("# {a}\n"));
            current = Some(a);
        }
        let tail = format!("{} {}", l.kind, l.unit);
        human.push_str(&format!(
            "{:<name_width$}  {:>value_width$}  {}\n",
            l.name,
            l.value,
            tail.trim_end()
        ));
    }
    // JSON: the flat object of every name, numbers for STATS and strings
    // for INFO (the names never overlap).
    let mut obj = serde_json::Map::new();
    for (name, value) in &info {
        obj.insert(name.clone(), json!(value));
    }
    for (name, value) in &stats {
        obj.insert(name.clone(), json!(value));
    }
    emit(a.conn.json, human, Value::Object(obj))
}

/// An opcode byte as the spec names it, or in hex.
fn opcode_name(b: u8) -> String {
    Opcode::from_request_byte(b).map_or_else(|| format!("0x{b:02x}"), |op| op.name().to_string())
}

pub fn slowlog(a: SlowlogArgs) -> Result<(), CliError> {
    let mut c = connect(&a.conn)?;
    let stats = c.node_stats()?;
    if !stats.iter().any(|(n, _)| n == ADDITION_MARK) {
        return Err(CliError::new(
            "unsupported",
            "this node has no slow log (it predates SLOWLOG)",
        ));
    }
    let log = c.node_slowlog(a.reset, a.max)?;
    let mut human = format!(
        "slow log: {} held (at most {}), {} recorded since start, threshold {} us{}\n",
        log.held,
        log.entries_max,
        log.recorded,
        log.threshold_us,
        if a.reset { "; emptied" } else { "" }
    );
    for e in &log.entries {
        human.push_str(&format!(
            "#{} {} {:>10.3} ms {:<12} {:<21} {}\n",
            e.id,
            utc(e.unix_ms),
            e.duration_ns as f64 / 1e6,
            opcode_name(e.opcode),
            e.client,
            e.args
        ));
    }
    let entries: Vec<Value> = log
        .entries
        .iter()
        .map(|e| {
            json!({
                "id": e.id,
                "unix_ms": e.unix_ms,
                "duration_ns": e.duration_ns,
                "opcode": opcode_name(e.opcode),
                "client": e.client,
                "args": e.args,
            })
        })
        .collect();
    let obj = json!({
        "threshold_us": log.threshold_us,
        "entries_max": log.entries_max,
        "held": log.held,
        "recorded": log.recorded,
        "reset": a.reset,
        "entries": entries,
    });
    emit(a.conn.json, human, obj)
}
