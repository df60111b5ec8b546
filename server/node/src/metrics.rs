//! `--metrics-listen ADDR`: the node's figures in the Prometheus text
//! exposition format (version 0.0.4) at `GET /metrics`, over HTTP served by
//! `tiny_http` on a thread of its own. Every series, its type, unit and
//! meaning: format-spec/metrics.md.
//!
//! Who owns what: the figures belong to the event loop (its counters and
//! request durations) and to the atomics it reads (engine, host
//! refresher). The metrics thread never touches them: per scrape it raises
//! [`Published::wanted`] and wakes the loop, which at its next pass builds
//! the same report STATS sends, with each opcode's duration buckets, and
//! stores it here (one `Arc` swap under a lock held for that swap only);
//! the thread waits for it at most [`FRESH_WAIT`], and serves the last
//! report it has if the loop did not answer in time. So the event loop
//! never blocks on the endpoint: a slow or stuck scraper holds only this
//! thread, and an idle endpoint costs the loop one atomic load per pass.
//! The `process_*` series are read from `/proc` by this thread
//! (`process.rs`).
//!
//! Names follow Prometheus's conventions, derived from the STATS name
//! (`stats::STAT_NAMES`, which gives kind and unit): `tidemark_` and the
//! name with `.` made `_`; a templated name (`requests.{op}`,
//! `errors.{code}`, `raft.peer_{peer}.lag_bytes`) is one family whose
//! placeholders become labels, each removed from the name with one
//! adjacent separator; a figure in ms, us or ns is served in seconds and
//! one in bytes in bytes, the unit word moved to the end of the name
//! (`storage.disk_bytes_used` is `tidemark_storage_disk_used_bytes`), a
//! time in `_unix_ms` is a `_timestamp_seconds`; a counter's name ends
//! `_total`. A few STATS figures are served as a standard series instead
//! (`stats::Metric::ServedAs`: the latency quantiles as the histogram
//! `tidemark_request_duration_seconds`, the uptime as
//! `process_start_time_seconds`, the memory figures as `process_*`), so
//! no figure is served twice. INFO's text figures are the labels of one
//! `tidemark_info` gauge of value 1, the usual form of build information.
//!
//! Why this writer and not the `prometheus-client` crate: that crate wants
//! each figure registered as its own metric object (an atomic shared with
//! the code that counts), which would make a second owner of every figure
//! STATS already reports from the event loop, or a custom collector that
//! maps the same report as this module does. What is left, the text
//! format, is small and checked: escaping by the tests here, the whole
//! scrape of a node that served every request kind by `promtool check
//! metrics` (tests/it/observe.rs).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::Waker;
use parking_lot::{Condvar, Mutex};

use crate::durations::{Durations, REQUEST_DURATION};
use crate::process::ProcessFigures;
use crate::stats::{placeholder_admits, Metric, StatKind, StatName, STAT_NAMES};

/// How long a scrape waits for the event loop's fresh report.
pub const FRESH_WAIT: Duration = Duration::from_secs(1);

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the event loop hands the metrics thread for a scrape.
#[derive(Debug, Default, PartialEq)]
pub struct Scrape {
    /// The STATS report: `(name, value)`s.
    pub figures: Vec<(String, u64)>,
    /// Each answered opcode's request durations (`Stats::durations`).
    pub durations: Vec<(&'static str, Durations)>,
}

/// A figure's labels and the documented name it is an instance of.
type Instance = (Vec<(String, String)>, &'static StatName);

/// A report handed from the event loop to the metrics thread.
#[derive(Default)]
pub struct Published {
    /// The scrape's request: set by the metrics thread, taken by the loop.
    wanted: AtomicBool,
    /// `(reports published so far, the last one)`.
    last: Mutex<(u64, Option<Arc<Scrape>>)>,
    fresh: Condvar,
}

impl Published {
    /// Whether a scrape waits for a report; clears the request. One atomic
    /// swap: what the event loop pays per pass.
    pub fn take_wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed) && self.wanted.swap(false, Ordering::AcqRel)
    }

    /// Stores a report and wakes the scrapes waiting for it.
    pub fn publish(&self, report: Scrape) {
        let mut last = self.last.lock();
        last.0 += 1;
        last.1 = Some(Arc::new(report));
        drop(last);
        self.fresh.notify_all();
    }

    /// A report made after this call if the loop answers within `wait`,
    /// else the last one (None before the first).
    fn fresh(&self, waker: &Waker, wait: Duration) -> Option<Arc<Scrape>> {
        let deadline = Instant::now() + wait;
        let mut last = self.last.lock();
        let seen = last.0;
        self.wanted.store(true, Ordering::Release);
        // A failed wake means the loop is gone: the last report is served.
        let _ = waker.wake();
        while last.0 == seen {
            if self.fresh.wait_until(&mut last, deadline).timed_out() {
                break;
            }
        }
        last.1.clone()
    }
}

/// The running endpoint; [`MetricsServer::stop`] ends its thread.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` (a taken address is an error at start, as for the
    /// node's own listener). The endpoint has no authentication: an
    /// address other than loopback gets a warning in the log.
    pub fn bind(addr: SocketAddr) -> Result<MetricsServer, String> {
        if !addr.ip().is_loopback() {
            log::warn!(
                "metrics listen {addr}: GET /metrics has no authentication and this address \
                 is not loopback; keep it on a trusted network or behind a proxy"
            );
        }
        let server =
            tiny_http::Server::http(addr).map_err(|e| format!("metrics listen {addr}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| format!("metrics listen {addr}: not an IP address"))?;
        Ok(MetricsServer {
            server: Arc::new(server),
            thread: None,
            addr,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves scrapes on a new thread until [`MetricsServer::stop`].
    pub fn start(
        &mut self,
        published: Arc<Published>,
        waker: Arc<Waker>,
        info: Vec<(String, String)>,
    ) -> std::io::Result<()> {
        let server = self.server.clone();
        let thread = std::thread::Builder::new()
            .name("tidemark-metrics".into())
            .spawn(move || {
                let none = Scrape::default();
                for request in server.incoming_requests() {
                    let response = match (request.method(), request.url()) {
                        (tiny_http::Method::Get, "/metrics") => {
                            let report = published.fresh(&waker, FRESH_WAIT);
                            let report = report.as_deref().unwrap_or(&none);
                            let body = render(report, &info, &ProcessFigures::read());
                            let header =
                                tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                                    .expect("invariant: a constant, valid header");
                            tiny_http::Response::from_string(body).with_header(header)
                        }
                        _ => tiny_http::Response::from_string("not found: try GET /metrics\n")
                            .with_status_code(404),
                    };
                    // A scraper that went away is its own problem.
                    let _ = request.respond(response);
                }
            })?;
        self.thread = Some(thread);
        Ok(())
    }

    /// Stops accepting scrapes and joins the thread.
    pub fn stop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One template of `STAT_NAMES`, split into literal text and placeholders.
fn pieces(template: &str) -> Vec<Result<&str, &str>> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        if open > 0 {
            out.push(Ok(&rest[..open]));
        }
        out.push(Err(&rest[open + 1..open + close]));
        rest = &rest[open + close + 1..];
    }
    if !rest.is_empty() {
        out.push(Ok(rest));
    }
    out
}

/// The placeholder values of `name` if it is an instance of `template`.
fn instance<'n>(template: &str, name: &'n str) -> Option<Vec<(String, &'n str)>> {
    let parts = pieces(template);
    let mut labels = Vec::new();
    let mut at = 0;
    for (i, part) in parts.iter().enumerate() {
        match part {
            Ok(lit) => {
                if !name[at..].starts_with(lit) {
                    return None;
                }
                at += lit.len();
            }
            Err(placeholder) => {
                let end = match parts.get(i + 1) {
                    Some(Ok(next)) => at + name[at..].find(next)?,
                    _ => name.len(),
                };
                let value = &name[at..end];
                if !placeholder_admits(placeholder, value) {
                    return None;
                }
                labels.push((placeholder.to_string(), value));
                at = end;
            }
        }
    }
    (at == name.len()).then_some(labels)
}

/// The base unit a figure of `unit` is served in: `(base, the unit's
/// word in STATS names, decimal digits that take a value to the base)`.
/// Times are served in seconds, sizes in bytes; other units are counts.
fn base_unit(unit: &str) -> Option<(&'static str, &'static str, u32)> {
    match unit {
        "ms" | "milliseconds" => Some(("seconds", "ms", 3)),
        "us" => Some(("seconds", "us", 6)),
        "ns" => Some(("seconds", "ns", 9)),
        "bytes" => Some(("bytes", "bytes", 0)),
        _ => None,
    }
}

/// The family of a documented name (module doc): `None` for a name
/// served as another series ([`Metric::ServedAs`]).
fn family(stat: &StatName) -> Option<String> {
    match stat.metric {
        Metric::ServedAs(_) => return None,
        Metric::Renamed(name) => return Some(name.to_string()),
        Metric::Conventional => {}
    }
    let mut name = family_as_stats(stat.name);
    if let Some((base, word, _)) = base_unit(stat.unit) {
        name = match name.strip_suffix("_unix_ms") {
            Some(stem) => format!("{stem}_timestamp_seconds"),
            None => {
                let mut words: Vec<&str> = name.split('_').collect();
                if let Some(at) = words.iter().rposition(|w| *w == word) {
                    words.remove(at);
                }
                format!("{}_{base}", words.join("_"))
            }
        };
    }
    if stat.kind == StatKind::Counter {
        name.push_str("_total");
    }
    Some(name)
}

/// `value / 10^digits`, exact, without trailing zeros (`2504, 3` is
/// `2.504`, `1000, 3` is `1`).
fn decimal(value: u64, digits: u32) -> String {
    let scale = 10u64.pow(digits);
    let fraction = format!("{:0width$}", value % scale, width = digits as usize);
    let fraction = fraction.trim_end_matches('0');
    if fraction.is_empty() {
        (value / scale).to_string()
    } else {
        format!("{}.{fraction}", value / scale)
    }
}

/// A figure's value as its series writes it: in its base unit.
fn sample_value(stat: &StatName, value: u64) -> String {
    let digits = base_unit(stat.unit).map_or(0, |(_, _, digits)| digits);
    decimal(value, digits)
}

/// `tidemark_` and the template with its placeholders removed (each with
/// one adjacent separator) and `.` made `_`.
fn family_as_stats(template: &str) -> String {
    let mut name = template.to_string();
    while let Some(open) = name.find('{') {
        let Some(close) = name[open..].find('}').map(|c| open + c) else {
            break;
        };
        let (from, to) = if open > 0 && name.as_bytes()[open - 1] == b'.' {
            (open - 1, close + 1)
        } else if name
            .as_bytes()
            .get(close + 1)
            .is_some_and(|c| *c == b'_' || *c == b'.')
        {
            (open, close + 2)
        } else {
            (open, close + 1)
        };
        name.replace_range(from..to, "");
    }
    format!("tidemark_{}", name.replace('.', "_"))
}

fn kind_text(kind: StatKind) -> &'static str {
    match kind {
        StatKind::Counter => "counter",
        StatKind::Gauge => "gauge",
    }
}

/// The kind (`"counter"` or `"gauge"`) and unit of a STATS name, as
/// format-spec/protocol.md 4.4.1 lists it; `None` for a name it does not
/// (a newer node's).
pub fn stat_kind(name: &str) -> Option<(&'static str, &'static str)> {
    lookup(name).map(|(_, s)| (kind_text(s.kind), s.unit))
}

/// The Prometheus series of a STATS name: its family and its labels (in
/// the template's order); `None` for a name `STAT_NAMES` does not list or
/// one served as another series ([`served_as`]).
pub fn prometheus_series(name: &str) -> Option<(String, Vec<(String, String)>)> {
    let (labels, stat) = lookup(name)?;
    Some((family(stat)?, labels))
}

/// The series that serves a STATS name's figure when it is not a series
/// of its own (`latency.send.p99_ns`: `tidemark_request_duration_seconds`).
pub fn served_as(name: &str) -> Option<&'static str> {
    match lookup(name)?.1.metric {
        Metric::ServedAs(series) => Some(series),
        _ => None,
    }
}

fn lookup(name: &str) -> Option<Instance> {
    STAT_NAMES.iter().find_map(|s| {
        let labels = if s.name.contains('{') {
            instance(s.name, name)?
        } else if s.name == name {
            Vec::new()
        } else {
            return None;
        };
        let labels = labels
            .into_iter()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        Some((labels, s))
    })
}

/// A label value as the text format writes it: `\`, `"` and newline
/// escaped.
pub fn escape_label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A HELP text as the text format writes it: `\` and newline escaped.
pub fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

fn labels_text(labels: &[(String, String)]) -> String {
    if labels.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// The HELP text of a STATS figure's family.
fn help(stat: &StatName) -> String {
    let unit = match base_unit(stat.unit) {
        Some(("seconds", _, _)) => format!("{}, served in seconds", stat.unit),
        _ => stat.unit.to_string(),
    };
    format!("STATS {} ({unit}; format-spec/metrics.md)", stat.name)
}

/// The histogram of each opcode's request durations: cumulative
/// `_bucket`s (`le` in seconds), `_sum` in seconds, `_count`.
fn render_durations(durations: &[(&'static str, Durations)], out: &mut String) {
    if durations.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP {REQUEST_DURATION} Time from handling a request to queueing its response, \
         by opcode (format-spec/metrics.md)"
    );
    let _ = writeln!(out, "# TYPE {REQUEST_DURATION} histogram");
    for (op, d) in durations {
        for (bound_ns, count) in d.cumulative() {
            let le = decimal(bound_ns, 9);
            let _ = writeln!(
                out,
                "{REQUEST_DURATION}_bucket{{op=\"{op}\",le=\"{le}\"}} {count}"
            );
        }
        let count = d.count();
        let _ = writeln!(
            out,
            "{REQUEST_DURATION}_bucket{{op=\"{op}\",le=\"+Inf\"}} {count}"
        );
        let sum = decimal(d.sum_ns(), 9);
        let _ = writeln!(out, "{REQUEST_DURATION}_sum{{op=\"{op}\"}} {sum}");
        let _ = writeln!(out, "{REQUEST_DURATION}_count{{op=\"{op}\"}} {count}");
    }
}

/// The exposition of a report, the process figures and INFO's items: one
/// `# HELP` and `# TYPE` per family, then its series. Names `STAT_NAMES`
/// does not list are left out (none are reported: a test checks it), and
/// so are those served as another series.
pub fn render(report: &Scrape, info: &[(String, String)], process: &ProcessFigures) -> String {
    type Family = (&'static StatName, Vec<(String, String)>);
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (name, value) in &report.figures {
        let Some((labels, stat)) = lookup(name) else {
            continue;
        };
        let Some(family) = family(stat) else {
            continue;
        };
        families
            .entry(family)
            .or_insert_with(|| (stat, Vec::new()))
            .1
            .push((labels_text(&labels), sample_value(stat, *value)));
    }
    let mut out = String::new();
    for (family, (stat, series)) in &families {
        let _ = writeln!(out, "# HELP {family} {}", escape_help(&help(stat)));
        let _ = writeln!(out, "# TYPE {family} {}", kind_text(stat.kind));
        for (labels, value) in series {
            let _ = writeln!(out, "{family}{labels} {value}");
        }
    }
    render_durations(&report.durations, &mut out);
    process.render(&mut out);
    let labels: Vec<(String, String)> = info
        .iter()
        .map(|(n, v)| {
            (
                n.strip_prefix("server.").unwrap_or(n).to_string(),
                v.clone(),
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "# HELP tidemark_info INFO's text figures as labels (format-spec/metrics.md)"
    );
    let _ = writeln!(out, "# TYPE tidemark_info gauge");
    let _ = writeln!(out, "tidemark_info{} 1", labels_text(&labels));
    out
}

/// Every family `/metrics` may serve: `(name, type, unit)`, in the order
/// of format-spec/metrics.md's table (the STATS families in
/// `STAT_NAMES` order, then the histogram, the process series and
/// `tidemark_info`). A family's unit is its base unit, or the count the
/// STATS table names.
#[cfg(test)]
pub fn families() -> Vec<(String, &'static str, &'static str)> {
    let mut out: Vec<(String, &'static str, &'static str)> = Vec::new();
    for stat in STAT_NAMES {
        let Some(name) = family(stat) else {
            continue;
        };
        if out.iter().any(|(n, _, _)| *n == name) {
            continue;
        }
        let unit = base_unit(stat.unit).map_or(stat.unit, |(base, _, _)| base);
        out.push((name, kind_text(stat.kind), unit));
    }
    out.push((REQUEST_DURATION.to_string(), "histogram", "seconds"));
    for (name, kind, unit) in crate::process::SERIES {
        out.push((name.to_string(), kind, unit));
    }
    out.push(("tidemark_info".to_string(), "gauge", "info"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::expand;

    #[test]
    fn names_map_to_families_and_labels() {
        let s = |n: &str| prometheus_series(n).unwrap_or_else(|| panic!("{n}"));
        let plain = |n: &str| (n.to_string(), vec![]);
        assert_eq!(s("engine.appends"), plain("tidemark_engine_appends_total"));
        assert_eq!(s("net.bytes_in"), plain("tidemark_net_in_bytes_total"));
        assert_eq!(
            s("storage.disk_bytes_used"),
            plain("tidemark_storage_disk_used_bytes")
        );
        assert_eq!(
            s("storage.disk_bytes_total"),
            plain("tidemark_storage_disk_size_bytes")
        );
        assert_eq!(
            s("engine.checkpoint_ms"),
            plain("tidemark_engine_checkpoint_seconds_total")
        );
        assert_eq!(
            s("engine.checkpoint_ms_max"),
            plain("tidemark_engine_checkpoint_max_seconds")
        );
        assert_eq!(
            s("limits.slowlog_threshold_us"),
            plain("tidemark_limits_slowlog_threshold_seconds")
        );
        assert_eq!(
            s("server.started_unix_ms"),
            plain("tidemark_server_started_timestamp_seconds")
        );
        assert_eq!(
            s("engine.last_checkpoint_unix_ms"),
            plain("tidemark_engine_last_checkpoint_timestamp_seconds")
        );
        assert_eq!(
            s("backup.streams_failed"),
            plain("tidemark_backup_streams_failed_total")
        );
        assert_eq!(
            s("requests.send"),
            (
                "tidemark_requests_total".into(),
                vec![("op".into(), "send".into())]
            )
        );
        assert_eq!(
            s("errors.not_member"),
            (
                "tidemark_errors_total".into(),
                vec![("code".into(), "not_member".into())]
            )
        );
        assert_eq!(
            s("raft.elections_won"),
            plain("tidemark_raft_elections_won_total")
        );
        assert_eq!(s("raft.term"), plain("tidemark_raft_term"));
        assert_eq!(
            s("raft.inbound.frames_forged"),
            plain("tidemark_raft_inbound_frames_forged_total")
        );
        assert_eq!(s("raft.inbound.open"), plain("tidemark_raft_inbound_open"));
        assert_eq!(
            s("raft.role.pre_candidate"),
            (
                "tidemark_raft_role".into(),
                vec![("role".into(), "pre_candidate".into())]
            )
        );
        assert_eq!(
            s("raft.peer_12.last_contact_ms"),
            (
                "tidemark_raft_peer_last_contact_seconds".into(),
                vec![("peer".into(), "12".into())]
            )
        );
        assert_eq!(
            s("raft.peer_2.progress.replicate"),
            (
                "tidemark_raft_peer_progress".into(),
                vec![
                    ("peer".into(), "2".into()),
                    ("state".into(), "replicate".into())
                ]
            )
        );
        assert_eq!(
            s("raft.peer_2.lag_bytes"),
            (
                "tidemark_raft_peer_lag_bytes".into(),
                vec![("peer".into(), "2".into())]
            )
        );
        // Served by standard series, not twice.
        for (name, by) in [
            ("latency.create_group.p999_ns", REQUEST_DURATION),
            ("latency.send.max_us", REQUEST_DURATION),
            ("server.uptime_ms", "process_start_time_seconds"),
            ("memory.resident_bytes", "process_resident_memory_bytes"),
            ("memory.virtual_bytes", "process_virtual_memory_bytes"),
        ] {
            assert_eq!(prometheus_series(name), None, "{name}");
            assert_eq!(served_as(name), Some(by), "{name}");
        }
        assert_eq!(served_as("engine.appends"), None);
        for bad in [
            "raft.peer_0.lag_bytes",
            "raft.peer_02.lag_bytes",
            "raft.peer_x.lag_bytes",
            "raft.peer_.lag_bytes",
            "raft.role.king",
            "raft.peer_2.progress.lost",
        ] {
            assert_eq!(prometheus_series(bad), None, "{bad}");
        }
        assert_eq!(prometheus_series("requests.nope"), None);
        assert_eq!(prometheus_series("engine.appends_x"), None);
    }

    /// Every documented name is one series (or served by another), no two
    /// names are the same series, a family has one kind, and the names
    /// follow Prometheus's conventions as `promtool check metrics` checks
    /// them: `_total` on counters and only on them, base units at the end,
    /// no abbreviated unit.
    #[test]
    fn every_name_is_a_distinct_conventional_series() {
        let mut seen = std::collections::BTreeSet::new();
        let mut kinds = BTreeMap::new();
        for stat in STAT_NAMES {
            for name in expand(stat.name) {
                let (labels, found) = lookup(&name).unwrap_or_else(|| panic!("{name}"));
                assert_eq!(found.name, stat.name, "{name} matched another template");
                let Some(family) = family(stat) else {
                    let by = served_as(&name).unwrap_or_else(|| panic!("{name}"));
                    assert!(families().iter().any(|(f, _, _)| f == by), "{by}");
                    continue;
                };
                assert!(
                    seen.insert((family.clone(), labels)),
                    "{name}: series twice"
                );
                let kind = *kinds.entry(family.clone()).or_insert(stat.kind);
                assert_eq!(kind, stat.kind, "{family}: two kinds");
                assert!(
                    family
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                    "{family}"
                );
            }
        }
        for (family, kind, unit) in families() {
            let stem = match family.strip_suffix("_total") {
                Some(stem) => {
                    assert_eq!(kind, "counter", "{family}: _total on a {kind}");
                    stem
                }
                None => {
                    assert_ne!(kind, "counter", "{family}: a counter without _total");
                    &family
                }
            };
            if unit == "seconds" || unit == "bytes" {
                assert!(stem.ends_with(&format!("_{unit}")), "{family}: unit last");
            }
            for abbreviation in ["ms", "us", "ns", "milliseconds", "sec", "secs"] {
                assert!(
                    !family.split('_').any(|w| w == abbreviation),
                    "{family}: {abbreviation}"
                );
            }
        }
    }

    /// The table of format-spec/metrics.md lists every family `/metrics`
    /// may serve, with its type and unit, in [`families`]' order.
    #[test]
    fn the_metrics_page_lists_every_family() {
        let page = include_str!("../../../format-spec/metrics.md");
        let rows: Vec<(String, String, String)> = page
            .lines()
            .filter(|l| l.starts_with("| `tidemark_") || l.starts_with("| `process_"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (
                    cells[1].trim_matches('`').to_string(),
                    cells[2].to_string(),
                    cells[3].to_string(),
                )
            })
            .collect();
        let code: Vec<(String, String, String)> = families()
            .into_iter()
            .map(|(f, k, u)| (f, k.to_string(), u.to_string()))
            .collect();
        assert_eq!(rows, code, "format-spec/metrics.md and the code differ");
    }

    #[test]
    fn values_are_served_in_base_units_exactly() {
        assert_eq!(decimal(2_504, 3), "2.504");
        assert_eq!(decimal(7, 3), "0.007");
        assert_eq!(decimal(2_500, 3), "2.5");
        assert_eq!(decimal(0, 9), "0");
        assert_eq!(decimal(10_000, 6), "0.01");
        assert_eq!(decimal(50_000, 9), "0.00005");
        assert_eq!(decimal(u64::MAX, 0), u64::MAX.to_string());
        let report = Scrape {
            figures: vec![
                ("limits.slowlog_threshold_us".into(), 10_000),
                ("server.started_unix_ms".into(), 1_795_501_476_553),
                ("latency.send.p50_ns".into(), 195_071),
                ("server.uptime_ms".into(), 12_744),
            ],
            durations: vec![],
        };
        let text = render(&report, &[], &ProcessFigures::default());
        assert!(text.contains("\ntidemark_limits_slowlog_threshold_seconds 0.01\n"));
        assert!(text.contains("\ntidemark_server_started_timestamp_seconds 1795501476.553\n"));
        assert!(!text.contains("latency"), "{text}");
        assert!(!text.contains("uptime"), "{text}");
    }

    #[test]
    fn the_text_format_escapes_what_it_must() {
        assert_eq!(escape_label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label_value("x\ny"), "x\\ny");
        assert_eq!(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
        let info = vec![
            ("server.version".to_string(), "0.1.0".to_string()),
            ("server.data_dir".to_string(), "/data/\"x\"\n".to_string()),
        ];
        let report = Scrape {
            figures: vec![
                ("engine.appends".to_string(), 7),
                ("requests.send".to_string(), 3),
                ("requests.ping".to_string(), 1),
                ("net.connections".to_string(), 2),
            ],
            durations: vec![],
        };
        let text = render(&report, &info, &ProcessFigures::default());
        let expected = "\
# HELP tidemark_engine_appends_total STATS engine.appends (messages; format-spec/metrics.md)
# TYPE tidemark_engine_appends_total counter
tidemark_engine_appends_total 7
# HELP tidemark_net_connections STATS net.connections (connections; format-spec/metrics.md)
# TYPE tidemark_net_connections gauge
tidemark_net_connections 2
# HELP tidemark_requests_total STATS requests.{op} (requests; format-spec/metrics.md)
# TYPE tidemark_requests_total counter
tidemark_requests_total{op=\"send\"} 3
tidemark_requests_total{op=\"ping\"} 1
# HELP tidemark_info INFO's text figures as labels (format-spec/metrics.md)
# TYPE tidemark_info gauge
tidemark_info{version=\"0.1.0\",data_dir=\"/data/\\\"x\\\"\\n\"} 1
";
        assert_eq!(text, expected);
    }

    #[test]
    fn raft_figures_follow_the_prometheus_conventions() {
        let report = Scrape {
            figures: vec![
                ("raft.elections_started".to_string(), 3),
                ("raft.peer_3.last_contact_ms".to_string(), 2_504),
                ("raft.peer_2.last_contact_ms".to_string(), 7),
                ("raft.peer_3.lag_bytes".to_string(), 12_000),
            ],
            durations: vec![],
        };
        let text = render(&report, &[], &ProcessFigures::default());
        let expected = "\
# HELP tidemark_raft_elections_started_total STATS raft.elections_started (elections; format-spec/metrics.md)
# TYPE tidemark_raft_elections_started_total counter
tidemark_raft_elections_started_total 3
# HELP tidemark_raft_peer_lag_bytes STATS raft.peer_{peer}.lag_bytes (bytes; format-spec/metrics.md)
# TYPE tidemark_raft_peer_lag_bytes gauge
tidemark_raft_peer_lag_bytes{peer=\"3\"} 12000
# HELP tidemark_raft_peer_last_contact_seconds STATS raft.peer_{peer}.last_contact_ms (ms, served in seconds; format-spec/metrics.md)
# TYPE tidemark_raft_peer_last_contact_seconds gauge
tidemark_raft_peer_last_contact_seconds{peer=\"3\"} 2.504
tidemark_raft_peer_last_contact_seconds{peer=\"2\"} 0.007
";
        assert!(text.starts_with(expected), "{text}");
    }

    /// Request durations are one histogram: cumulative buckets from 50 us
    /// to 10 s and `+Inf`, the exact sum in seconds, the count.
    #[test]
    fn request_durations_are_a_histogram() {
        let mut d = Durations::default();
        for ns in [40_000, 60_000, 3_000_000, 20_000_000_000] {
            d.observe(ns);
        }
        let report = Scrape {
            figures: vec![],
            durations: vec![("send", d), ("ping", Durations::default())],
        };
        let text = render(&report, &[], &ProcessFigures::default());
        let send: Vec<&str> = text.lines().filter(|l| l.contains("op=\"send\"")).collect();
        assert_eq!(send.len(), 17 + 1 + 2, "{text}");
        assert_eq!(
            send[0],
            "tidemark_request_duration_seconds_bucket{op=\"send\",le=\"0.00005\"} 1"
        );
        assert_eq!(
            send[1],
            "tidemark_request_duration_seconds_bucket{op=\"send\",le=\"0.0001\"} 2"
        );
        assert_eq!(
            send[6],
            "tidemark_request_duration_seconds_bucket{op=\"send\",le=\"0.005\"} 3"
        );
        assert_eq!(
            send[16],
            "tidemark_request_duration_seconds_bucket{op=\"send\",le=\"10\"} 3"
        );
        assert_eq!(
            send[17],
            "tidemark_request_duration_seconds_bucket{op=\"send\",le=\"+Inf\"} 4"
        );
        assert_eq!(
            send[18],
            "tidemark_request_duration_seconds_sum{op=\"send\"} 20.0031"
        );
        assert_eq!(
            send[19],
            "tidemark_request_duration_seconds_count{op=\"send\"} 4"
        );
        assert_eq!(
            text.matches("# TYPE tidemark_request_duration_seconds histogram")
                .count(),
            1
        );
        assert!(text.contains("tidemark_request_duration_seconds_count{op=\"ping\"} 0\n"));
    }

    #[test]
    fn a_scrape_gets_a_report_made_after_it_asked() {
        let poll = mio::Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let published = Arc::new(Published::default());
        assert!(!published.take_wanted());
        // No loop answers: the scrape waits its time, then has nothing.
        assert_eq!(published.fresh(&waker, Duration::from_millis(10)), None);
        assert!(published.take_wanted(), "the scrape asked");
        assert!(!published.take_wanted(), "once");
        let report = |connections: u64| Scrape {
            figures: vec![("net.connections".into(), connections)],
            durations: vec![],
        };
        published.publish(report(1));
        // A loop that answers: the scrape gets the new report, not the old.
        let loop_side = {
            let published = published.clone();
            std::thread::spawn(move || {
                while !published.take_wanted() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                published.publish(report(2));
            })
        };
        let got = published.fresh(&waker, Duration::from_secs(30)).unwrap();
        loop_side.join().unwrap();
        assert_eq!(*got, report(2));
    }
}
