//! `--metrics-listen ADDR`: the STATS figures in the Prometheus text
//! exposition format (version 0.0.4) at `GET /metrics`, over HTTP served by
//! `tiny_http` on a thread of its own.
//!
//! Who owns what: the figures belong to the event loop (its counters) and
//! to the atomics it reads (engine, host refresher). The metrics thread
//! never touches them: per scrape it raises [`Published::wanted`] and wakes
//! the loop, which at its next pass builds the same report STATS sends and
//! stores it here (one `Arc` swap under a lock held for that swap only);
//! the thread waits for it at most [`FRESH_WAIT`], and serves the last
//! report it has if the loop did not answer in time. So the event loop
//! never blocks on the endpoint: a slow or stuck scraper holds only this
//! thread, and an idle endpoint costs the loop one atomic load per pass.
//!
//! Names: a figure's series is `tidemark_` and its STATS name with `.`
//! made `_`; a templated name (`requests.{op}`, `latency.{op}.{q}_ns`,
//! `errors.{code}`) is one family whose placeholders become labels, each
//! removed from the name with one adjacent separator: `latency.send.p99_ns`
//! is `tidemark_latency_ns{op="send",q="p99"}` (format-spec/protocol.md
//! 4.4.2). The `raft.*` names follow Prometheus's conventions besides
//! (`stats::Naming::Conventional`): a counter's family ends `_total`, a
//! figure in ms is served in `_seconds` (`raft.peer_2.last_contact_ms` is
//! `tidemark_raft_peer_last_contact_seconds{peer="2"}`), and a node id is
//! a `peer` label. Kind and unit come from `stats::STAT_NAMES`. INFO's text
//! figures are the labels of one `tidemark_info` gauge of value 1, the
//! usual form of build information.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mio::Waker;
use parking_lot::{Condvar, Mutex};

use crate::stats::{placeholder_admits, Naming, StatKind, StatName, STAT_NAMES};

/// How long a scrape waits for the event loop's fresh report.
pub const FRESH_WAIT: Duration = Duration::from_secs(1);

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A STATS report: `(name, value)`s.
type Figures = Arc<Vec<(String, u64)>>;
/// A figure's series: its family, its labels, the documented name.
type Series = (String, Vec<(String, String)>, &'static StatName);

/// A report handed from the event loop to the metrics thread.
#[derive(Default)]
pub struct Published {
    /// The scrape's request: set by the metrics thread, taken by the loop.
    wanted: AtomicBool,
    /// `(reports published so far, the last one)`.
    last: Mutex<(u64, Option<Figures>)>,
    fresh: Condvar,
}

impl Published {
    /// Whether a scrape waits for a report; clears the request. One atomic
    /// swap: what the event loop pays per pass.
    pub fn take_wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed) && self.wanted.swap(false, Ordering::AcqRel)
    }

    /// Stores a report and wakes the scrapes waiting for it.
    pub fn publish(&self, figures: Vec<(String, u64)>) {
        let mut last = self.last.lock();
        last.0 += 1;
        last.1 = Some(Arc::new(figures));
        drop(last);
        self.fresh.notify_all();
    }

    /// A report made after this call if the loop answers within `wait`,
    /// else the last one (None before the first).
    fn fresh(&self, waker: &Waker, wait: Duration) -> Option<Figures> {
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
                for request in server.incoming_requests() {
                    let response = match (request.method(), request.url()) {
                        (tiny_http::Method::Get, "/metrics") => {
                            let figures = published.fresh(&waker, FRESH_WAIT);
                            let body = render(figures.as_deref().map_or(&[], |f| f), &info);
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

/// The family name of a documented name: its template's placeholders
/// removed with one adjacent separator, `.` made `_`, prefixed
/// `tidemark_`; under [`Naming::Conventional`], `_ms` made `_seconds` and
/// a counter's name ending `_total`.
fn family(stat: &StatName) -> String {
    let base = family_as_stats(stat.name);
    if stat.naming == Naming::AsStats {
        return base;
    }
    let base = match base.strip_suffix("_ms") {
        Some(stem) => format!("{stem}_seconds"),
        None => base,
    };
    match stat.kind {
        StatKind::Counter => format!("{base}_total"),
        StatKind::Gauge => base,
    }
}

/// A figure's value as its series writes it: as is, or for a figure in ms
/// under [`Naming::Conventional`], in seconds (exact: three decimals).
fn sample_value(stat: &StatName, value: u64) -> String {
    match (stat.naming, stat.unit) {
        (Naming::Conventional, "ms") => format!("{}.{:03}", value / 1000, value % 1000),
        _ => value.to_string(),
    }
}

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

/// The kind (`"counter"` or `"gauge"`) and unit of a STATS name, as
/// format-spec/protocol.md 4.4.1 lists it; `None` for a name it does not
/// (a newer node's).
pub fn stat_kind(name: &str) -> Option<(&'static str, &'static str)> {
    series(name).map(|(_, _, s)| {
        let kind = match s.kind {
            StatKind::Counter => "counter",
            StatKind::Gauge => "gauge",
        };
        (kind, s.unit)
    })
}

/// The Prometheus series of a STATS name: its family and its labels (in
/// the template's order); `None` for a name `STAT_NAMES` does not list.
pub fn prometheus_series(name: &str) -> Option<(String, Vec<(String, String)>)> {
    series(name).map(|(family, labels, _)| (family, labels))
}

fn series(name: &str) -> Option<Series> {
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
        Some((family(s), labels, s))
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

/// The exposition of a STATS report and INFO's items: one `# HELP` and
/// `# TYPE` per family, then its series. Names `STAT_NAMES` does not list
/// are left out (none are reported: a test checks it).
pub fn render(figures: &[(String, u64)], info: &[(String, String)]) -> String {
    type Family = (&'static StatName, Vec<(String, String)>);
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for (name, value) in figures {
        if let Some((family, labels, stat)) = series(name) {
            families
                .entry(family)
                .or_insert_with(|| (stat, Vec::new()))
                .1
                .push((labels_text(&labels), sample_value(stat, *value)));
        }
    }
    let mut out = String::new();
    for (family, (stat, series)) in &families {
        let kind = match stat.kind {
            StatKind::Counter => "counter",
            StatKind::Gauge => "gauge",
        };
        let unit = match (stat.naming, stat.unit) {
            (Naming::Conventional, "ms") => "ms, served in seconds",
            (_, unit) => unit,
        };
        let help = format!(
            "STATS {} ({kind}, {unit}; format-spec/protocol.md 4.4.1)",
            stat.name
        );
        let _ = writeln!(out, "# HELP {family} {}", escape_help(&help));
        let _ = writeln!(out, "# TYPE {family} {kind}");
        for (labels, value) in series {
            let _ = writeln!(out, "{family}{labels} {value}");
        }
    }
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
        "# HELP tidemark_info INFO's text figures as labels (format-spec/protocol.md 4.24)"
    );
    let _ = writeln!(out, "# TYPE tidemark_info gauge");
    let _ = writeln!(out, "tidemark_info{} 1", labels_text(&labels));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::expand;

    #[test]
    fn names_map_to_families_and_labels() {
        let s = |n: &str| prometheus_series(n).unwrap();
        assert_eq!(
            s("engine.appends"),
            ("tidemark_engine_appends".into(), vec![])
        );
        assert_eq!(
            s("latency.create_group.p999_ns"),
            (
                "tidemark_latency_ns".into(),
                vec![
                    ("op".into(), "create_group".into()),
                    ("q".into(), "p999".into())
                ]
            )
        );
        assert_eq!(
            s("requests.send"),
            (
                "tidemark_requests".into(),
                vec![("op".into(), "send".into())]
            )
        );
        assert_eq!(
            s("errors.not_member"),
            (
                "tidemark_errors".into(),
                vec![("code".into(), "not_member".into())]
            )
        );
        assert_eq!(
            s("raft.elections_won"),
            ("tidemark_raft_elections_won_total".into(), vec![])
        );
        assert_eq!(s("raft.term"), ("tidemark_raft_term".into(), vec![]));
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

    /// Every documented name is one series, and no two names are the same
    /// series; a family has one kind.
    #[test]
    fn every_name_is_a_distinct_series() {
        let mut seen = std::collections::BTreeSet::new();
        let mut kinds = BTreeMap::new();
        for stat in STAT_NAMES {
            for name in expand(stat.name) {
                let (family, labels, found) = series(&name).unwrap_or_else(|| panic!("{name}"));
                assert_eq!(found.name, stat.name, "{name} matched another template");
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
        let figures = vec![
            ("engine.appends".to_string(), 7),
            ("requests.send".to_string(), 3),
            ("requests.ping".to_string(), 1),
            ("net.connections".to_string(), 2),
        ];
        let text = render(&figures, &info);
        let expected = "\
# HELP tidemark_engine_appends STATS engine.appends (counter, messages; format-spec/protocol.md 4.4.1)
# TYPE tidemark_engine_appends counter
tidemark_engine_appends 7
# HELP tidemark_net_connections STATS net.connections (gauge, connections; format-spec/protocol.md 4.4.1)
# TYPE tidemark_net_connections gauge
tidemark_net_connections 2
# HELP tidemark_requests STATS requests.{op} (counter, requests; format-spec/protocol.md 4.4.1)
# TYPE tidemark_requests counter
tidemark_requests{op=\"send\"} 3
tidemark_requests{op=\"ping\"} 1
# HELP tidemark_info INFO's text figures as labels (format-spec/protocol.md 4.24)
# TYPE tidemark_info gauge
tidemark_info{version=\"0.1.0\",data_dir=\"/data/\\\"x\\\"\\n\"} 1
";
        assert_eq!(text, expected);
    }

    #[test]
    fn raft_figures_follow_the_prometheus_conventions() {
        let figures = vec![
            ("raft.elections_started".to_string(), 3),
            ("raft.peer_3.last_contact_ms".to_string(), 2_504),
            ("raft.peer_2.last_contact_ms".to_string(), 7),
            ("raft.peer_3.lag_bytes".to_string(), 12_000),
        ];
        let text = render(&figures, &[]);
        let expected = "\
# HELP tidemark_raft_elections_started_total STATS raft.elections_started (counter, elections; format-spec/protocol.md 4.4.1)
# TYPE tidemark_raft_elections_started_total counter
tidemark_raft_elections_started_total 3
# HELP tidemark_raft_peer_lag_bytes STATS raft.peer_{peer}.lag_bytes (gauge, bytes; format-spec/protocol.md 4.4.1)
# TYPE tidemark_raft_peer_lag_bytes gauge
tidemark_raft_peer_lag_bytes{peer=\"3\"} 12000
# HELP tidemark_raft_peer_last_contact_seconds STATS raft.peer_{peer}.last_contact_ms (gauge, ms, served in seconds; format-spec/protocol.md 4.4.1)
# TYPE tidemark_raft_peer_last_contact_seconds gauge
tidemark_raft_peer_last_contact_seconds{peer=\"3\"} 2.504
tidemark_raft_peer_last_contact_seconds{peer=\"2\"} 0.007
";
        assert!(text.starts_with(expected), "{text}");
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
        published.publish(vec![("net.connections".into(), 1)]);
        // A loop that answers: the scrape gets the new report, not the old.
        let loop_side = {
            let published = published.clone();
            std::thread::spawn(move || {
                while !published.take_wanted() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                published.publish(vec![("net.connections".into(), 2)]);
            })
        };
        let got = published.fresh(&waker, Duration::from_secs(30)).unwrap();
        loop_side.join().unwrap();
        assert_eq!(*got, vec![("net.connections".to_string(), 2)]);
    }
}
