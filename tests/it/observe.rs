//! Observing a running node, with the real binary: the Prometheus
//! endpoint scraped over HTTP and parsed (every STATS name is a series or
//! served by a standard one, with values that follow what was done; and
//! checked by `promtool check metrics` when the machine has it), INFO's
//! text figures, the slow log through the CLI, and a flood of bad
//! connections that leaves a bounded number of lines in the node's log.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig};
use tidemark_protocol::{encode_request, JoinStart, Request};

use crate::cli::{json, ok};
use crate::harness::{listening_addr, tidemark_bin, Node};

/// `GET path` over HTTP/1.0: `(status line, body)`.
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header and a body");
    (
        head.lines().next().unwrap_or("").to_string(),
        body.to_string(),
    )
}

/// The samples of a text exposition, `family{labels}` -> value, and each
/// family's `# TYPE`.
type Samples = BTreeMap<String, f64>;
fn parse_exposition(body: &str) -> (Samples, BTreeMap<String, String>) {
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (family, kind) = rest.split_once(' ').expect("# TYPE family kind");
            types.insert(family.to_string(), kind.to_string());
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else {
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let value = value.parse().unwrap_or_else(|_| panic!("number: {line}"));
            assert!(
                samples.insert(series.to_string(), value).is_none(),
                "{line} twice"
            );
        }
    }
    (samples, types)
}

/// A STATS name as the exposition writes it.
fn series_of(name: &str) -> (String, String) {
    let (family, labels) = tidemark_node::prometheus_series(name)
        .unwrap_or_else(|| panic!("STATS reports {name}, which protocol.md 4.4.1 does not list"));
    if labels.is_empty() {
        return (family.clone(), family);
    }
    let inner: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let series = format!("{family}{{{}}}", inner.join(","));
    (family, series)
}

#[test]
fn the_metrics_endpoint_serves_every_stats_figure() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let mut c = Client::connect(&ClientConfig::new(node.addr.clone())).unwrap();
    let info: BTreeMap<String, String> = c.info().unwrap().into_iter().collect();
    let metrics = info["server.metrics_listen"].clone();
    assert!(metrics.starts_with("127.0.0.1:") && !metrics.ends_with(":0"));
    assert_eq!(info["server.listen"], node.addr);
    assert_eq!(info["server.fsync_policy"], "always");
    assert_eq!(info["server.data_dir"], dir.path().display().to_string());

    // Some work to see in the figures.
    c.create_group(7).unwrap();
    c.join(7, 5, JoinStart::Head).unwrap();
    for i in 1..=5 {
        c.send(7, 42, i, b"hello").unwrap();
    }
    let stats = c.stats().unwrap();
    let (status, body) = http_get(&metrics, "/metrics");
    assert!(status.contains("200"), "{status}");
    let (samples, types) = parse_exposition(&body);
    // Every figure STATS reports is a documented series of the scrape, or
    // served by the standard series that replaces it.
    for (name, _) in &stats {
        if let Some(by) = tidemark_node::served_as(name) {
            assert!(types.contains_key(by), "{name}: no {by} in the scrape");
            continue;
        }
        let (family, series) = series_of(name);
        assert!(
            samples.contains_key(&series),
            "{name}: no {series} in the scrape"
        );
        let (kind, _) = tidemark_node::stat_kind(name).unwrap();
        assert_eq!(
            types.get(&family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    let get = |series: &str| {
        samples
            .get(series)
            .copied()
            .unwrap_or_else(|| panic!("{series}"))
    };
    // Sane values, taken after the sends (the scrape is newer than STATS).
    assert!(get("tidemark_engine_appends_total") >= 5.0);
    assert!(get("tidemark_requests_total{op=\"send\"}") >= 5.0);
    assert!(get("tidemark_storage_memberships") >= 1.0);
    assert_eq!(get("tidemark_storage_messages_stored"), 5.0);
    assert_eq!(get("tidemark_engine_groups"), 1.0);
    assert_eq!(get("tidemark_storage_groups_damaged"), 0.0);
    assert_eq!(get("tidemark_storage_writes_stopped"), 0.0);
    assert!(get("tidemark_storage_record_appended_bytes_total") >= 5.0 * 5.0);
    assert!(get("tidemark_storage_disk_size_bytes") >= get("tidemark_storage_disk_free_bytes"));
    assert!(get("tidemark_net_connections") >= 1.0);
    assert_eq!(get("tidemark_server_pid"), f64::from(node.child.id()));
    // Milliseconds are served in seconds.
    assert_eq!(get("tidemark_limits_frame_timeout_seconds"), 30.0);
    let started = get("tidemark_server_started_timestamp_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(started > now - 600.0 && started <= now, "{started}");
    // The process series, read from /proc by the endpoint.
    assert!(get("process_resident_memory_bytes") > 0.0);
    assert!(get("process_open_fds") >= 3.0);
    assert!(get("process_cpu_seconds_total") >= 0.0);
    let process_start = get("process_start_time_seconds");
    assert!(
        (process_start - started).abs() < 60.0,
        "{process_start} {started}"
    );
    // The five SENDs are in the histogram: cumulative buckets, the count
    // and a sum of at least a microsecond each (a SEND waits for its
    // commit round).
    let bucket = |le: &str| {
        get(&format!(
            "tidemark_request_duration_seconds_bucket{{op=\"send\",le=\"{le}\"}}"
        ))
    };
    let count = get("tidemark_request_duration_seconds_count{op=\"send\"}");
    assert_eq!(bucket("+Inf"), count);
    assert!(count >= 5.0, "{count}");
    assert!(bucket("0.00005") <= bucket("0.001") && bucket("0.001") <= bucket("10"));
    assert!(get("tidemark_request_duration_seconds_sum{op=\"send\"}") >= count * 1e-6);
    assert_eq!(
        types
            .get("tidemark_request_duration_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    let info_line = body
        .lines()
        .find(|l| l.starts_with("tidemark_info{"))
        .expect("tidemark_info");
    assert!(info_line.contains("fsync_policy=\"always\"") && info_line.ends_with(" 1"));
    // The disk walk runs in the background: it has measured by now or soon.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http_get(&metrics, "/metrics");
        let (s, _) = parse_exposition(&body);
        if s["tidemark_storage_disk_used_bytes"] > 0.0 {
            assert!(s["tidemark_storage_disk_used_bytes"] >= s["tidemark_storage_journal_bytes"]);
            assert!(s["tidemark_storage_journal_bytes"] > 0.0);
            break;
        }
        assert!(Instant::now() < deadline, "no disk walk");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _) = http_get(&metrics, "/nope");
    assert!(status.contains("404"), "{status}");
}

#[test]
fn the_slow_log_through_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        dir.path(),
        &["--slowlog-threshold-us", "0", "--slowlog-entries-max", "16"],
    );
    let a = node.addr.as_str();
    ok(&["create-group", "--addr", a, "--group", "7"]);
    ok(&[
        "send",
        "--addr",
        a,
        "--group",
        "7",
        "--sender",
        "42",
        "secret words",
    ]);
    let log = json(&["slowlog", "--addr", a, "--max", "100"]);
    assert_eq!(log.u("threshold_us"), 0);
    assert_eq!(log.u("entries_max"), 16);
    let entries = log.get("entries").arr();
    assert_eq!(entries.len() as u64, log.u("held"));
    assert!(entries.len() <= 16);
    // Newest first, ids dense.
    for pair in entries.windows(2) {
        assert_eq!(pair[0].u("id"), pair[1].u("id") + 1);
    }
    assert_eq!(entries[0].u("id"), log.u("recorded"));
    let send = entries
        .iter()
        .find(|e| e.s("opcode") == "SEND")
        .expect("the SEND is in the log");
    assert!(send
        .s("args")
        .starts_with("group=7 sender=42 client_msg_id="));
    assert!(send.s("args").ends_with("payload_bytes=12"));
    assert!(send.s("client").starts_with("127.0.0.1:"));
    assert!(send.u("duration_ns") > 0);
    for e in entries {
        assert!(!e.s("args").contains("secret"), "no payload bytes");
    }
    // A reset lists and empties in one step; the next listing holds only
    // what came after it (that command's own HELLO and STATS, and no more
    // than the log keeps).
    let before = log.u("recorded");
    let reset = json(&["slowlog", "--addr", a, "--reset"]);
    assert!(reset.u("held") >= 1);
    let after = json(&["slowlog", "--addr", a]);
    assert!(after.u("held") <= 4, "{}", after.u("held"));
    let ids: Vec<u64> = after
        .get("entries")
        .arr()
        .iter()
        .map(|e| e.u("id"))
        .collect();
    assert!(ids.iter().all(|&id| id > before + 1), "{ids:?}");
    // The human form names the opcode, the client and the summary.
    let text = ok(&["slowlog", "--addr", a]);
    assert!(text.starts_with("slow log: "), "{text}");
    assert!(
        text.contains(" SLOWLOG ") && text.contains("127.0.0.1:"),
        "{text}"
    );
    // STATS reports the log, and `stats` groups and labels the figures.
    let stats = ok(&["stats", "--addr", a]);
    assert!(stats.starts_with("# server\nserver.version"), "{stats}");
    let line = |name: &str| {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name}: {stats}"))
            .to_string()
    };
    assert!(line("slowlog.recorded").ends_with("counter requests"));
    assert!(line("slowlog.entries").ends_with("gauge entries"));
    assert!(line("server.fsync_policy").contains("always"));
}

/// A node with a token whose log (stderr, at `info`) goes to a file.
fn start_logging_node(dir: &std::path::Path, log: &std::path::Path) -> (Child, String) {
    let token = dir.join("token");
    std::fs::write(&token, "s3cret").unwrap();
    let mut child = Command::new(tidemark_bin())
        .arg("serve")
        .arg("--data")
        .arg(dir.join("data"))
        .args(["--listen", "127.0.0.1:0", "--token-file"])
        .arg(&token)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("spawn tidemark");
    let addr = listening_addr(&mut child);
    (child, addr)
}

/// Writes `bytes` on a new connection and reads until the node closes it.
fn send_and_wait_close(addr: &str, bytes: &[u8]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(bytes).unwrap();
    let mut sink = Vec::new();
    let _ = s.read_to_end(&mut sink);
}

#[test]
fn a_flood_of_bad_connections_leaves_a_bounded_log() {
    const GARBAGE: u64 = 400;
    const BAD_TOKENS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("node.log");
    let (mut child, addr) = start_logging_node(dir.path(), &log);
    let started = Instant::now();
    // A frame of an undefined opcode: BAD_FRAME, fatal.
    let mut garbage = vec![12, 0, 0, 0, 1, 0x3E, 0, 0];
    garbage.extend_from_slice(&1u64.to_le_bytes());
    // HELLO then a wrong token: UNAUTHENTICATED, and the node closes.
    let mut bad_auth = Vec::new();
    let hello = Request::Hello {
        min_version: 1,
        max_version: 1,
        client_name: "flood",
    };
    encode_request(1, &hello, &mut bad_auth).unwrap();
    encode_request(2, &Request::Auth { token: b"guess" }, &mut bad_auth).unwrap();
    for i in 0..GARBAGE + BAD_TOKENS {
        if i % 3 == 0 && i / 3 < BAD_TOKENS {
            send_and_wait_close(&addr, &bad_auth);
        } else {
            send_and_wait_close(&addr, &garbage);
        }
    }
    let flood_secs = started.elapsed().as_secs();
    // The node counted every one, logged few, and said how many it did not.
    let mut config = ClientConfig::new(addr.clone());
    config.token = Some(b"s3cret".to_vec());
    let stats: BTreeMap<String, u64> = Client::connect(&config)
        .unwrap()
        .stats()
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(stats["errors.bad_frame"], GARBAGE);
    assert_eq!(stats["errors.unauthenticated"], BAD_TOKENS);
    assert!(stats["log.events_suppressed"] > 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let text = std::fs::read_to_string(&log).unwrap();
        if text.contains("similar events suppressed: protocol error") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let elapsed = started.elapsed().as_secs() + 1;
    let count = |needle: &str| text.lines().filter(|l| l.contains(needle)).count() as u64;
    let events = count("connection ");
    let suppressed_lines = count("similar events suppressed");
    assert!(suppressed_lines >= 1, "no suppression line:\n{text}");
    // Per kind (accept, close, auth failure, protocol error): a burst of
    // 20, one per second after it, one suppression line per 10 s. Without
    // the limit the flood writes 3 lines per connection, 1,800 lines.
    let per_kind = 20 + elapsed + (elapsed / 10 + 1);
    assert!(
        events + suppressed_lines <= 4 * per_kind + 4,
        "{events} event lines and {suppressed_lines} suppression lines in {elapsed} s \
         (flood {flood_secs} s):\n{text}"
    );
    assert!(count("authentication failed") >= 1 && count("protocol error") >= 1);
}

/// `promtool`, if this machine has it (Debian's `prometheus` package;
/// `.ci/run` installs it).
fn promtool() -> Option<&'static str> {
    Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
        .then_some("promtool")
}

/// One request of every opcode on `c`, each answered (a refusal counts:
/// a single node refuses CLUSTER_CHANGE). HELLO and AUTH were the
/// client's handshake.
fn serve_every_request_kind(c: &mut Client) {
    use tidemark_protocol::{MemberChange, RetentionPolicy, Subscription};
    c.ping().unwrap();
    c.create_group(7).unwrap();
    c.create_group(8).unwrap();
    c.join(7, 5, JoinStart::Earliest).unwrap();
    c.join(7, 6, JoinStart::Earliest).unwrap();
    c.join(8, 5, JoinStart::Earliest).unwrap();
    for i in 1..=4 {
        c.send(7, 42, i, b"hello").unwrap();
    }
    c.recall(7, 42, 10, 1).unwrap();
    c.edit(7, 42, 11, 2, b"edited").unwrap();
    c.pull(7, 5, 0, 10, 0).unwrap();
    c.ack(7, 5, 2).unwrap();
    c.batch_ack(6, &[(7, 1)]).unwrap();
    c.unread(5).unwrap();
    c.sync(5, 10, 1 << 16, 0).unwrap();
    c.history(7, 5, 0, 10).unwrap();
    c.history_latest(7, 5, 0, 10).unwrap();
    c.read_count(7, 2).unwrap();
    c.members(7, 0, 10).unwrap();
    c.group_info(7).unwrap();
    c.readers(7, 1, 0, 10).unwrap();
    c.set_retention(8, RetentionPolicy::default()).unwrap();
    c.clear_history(7, 6, 1).unwrap();
    c.leave(8, 5).unwrap();
    c.delete_group(8).unwrap();
    c.subscribe(Subscription::User(5)).unwrap();
    c.unsubscribe().unwrap();
    c.subscribe_receipts(42, &[7]).unwrap();
    c.unsubscribe().unwrap();
    c.backup(|_| Ok(())).unwrap();
    c.info().unwrap();
    c.slowlog(false, 10).unwrap();
    c.stats().unwrap();
    c.cluster().unwrap();
    c.cluster_map().unwrap();
    let refused = c.cluster_change(MemberChange::Remove { node_id: 2 });
    assert!(
        refused.is_err(),
        "a single node has no replica set to change"
    );
}

#[test]
fn promtool_accepts_the_scrape_of_a_node_that_served_every_request_kind() {
    let Some(promtool) = promtool() else {
        println!("SKIPPED: promtool not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret").unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    let mut config = ClientConfig::new(node.addr.clone());
    config.token = Some(b"s3cret".to_vec());
    let mut c = Client::connect(&config).unwrap();
    serve_every_request_kind(&mut c);
    let stats = c.stats().unwrap();
    let served = stats
        .iter()
        .filter(|(n, v)| n.starts_with("requests.") && *v > 0)
        .count();
    assert_eq!(served, tidemark_protocol::Opcode::ALL.len(), "{stats:?}");
    let info: BTreeMap<String, String> = c.info().unwrap().into_iter().collect();
    let (status, body) = http_get(&info["server.metrics_listen"], "/metrics");
    assert!(status.contains("200"), "{status}");

    let mut check = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    check
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(body.as_bytes())
        .unwrap();
    let out = check.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool check metrics: {}, {} finding(s):\n{findings}",
        out.status,
        findings.lines().count()
    );
}
