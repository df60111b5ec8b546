//! The `tidemark` client subcommands and `tidemark demo`, run as a user
//! would: the real binary against a real node (harness), human-readable
//! output checked for its key lines, `--json` output parsed and checked.

use std::collections::BTreeMap;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig};
use tidemark_protocol::JoinStart;

use crate::harness::{tidemark_bin, Node};

pub(crate) fn tidemark(args: &[&str]) -> Output {
    Command::new(tidemark_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tidemark")
}

/// Runs a subcommand that must succeed; returns its stdout.
pub(crate) fn ok(args: &[&str]) -> String {
    let out = tidemark(args);
    assert!(
        out.status.success(),
        "tidemark {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// Runs a subcommand with `--json` and parses its one JSON object.
pub(crate) fn json(args: &[&str]) -> Json {
    let mut all = args.to_vec();
    all.push("--json");
    let text = ok(&all);
    assert_eq!(text.lines().count(), 1, "one line of JSON: {text}");
    Json::parse(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn every_client_subcommand_against_a_running_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();

    assert_eq!(
        ok(&["create-group", "--addr", a, "--group", "1"]),
        "created group 1\n"
    );
    assert_eq!(
        ok(&["join", "--addr", a, "--group", "1", "--user", "2"]),
        "user 2 is a member of group 1, cursor 0\n"
    );
    json(&["join", "--addr", a, "--group", "1", "--user", "3"]);
    let sent = ok(&[
        "send",
        "--addr",
        a,
        "--group",
        "1",
        "--sender",
        "1",
        "hello, world",
    ]);
    assert_eq!(sent, "sent to group 1: msg_id 1\n");
    let s = json(&[
        "send",
        "--addr",
        a,
        "--group",
        "1",
        "--sender",
        "1",
        "--client-msg-id",
        "77",
        "second",
    ]);
    assert_eq!((s.u("msg_id"), s.get("duplicate")), (2, &Json::Bool(false)));
    // A retransmit with the same client_msg_id is not a second message.
    let again = json(&[
        "send",
        "--addr",
        a,
        "--group",
        "1",
        "--sender",
        "1",
        "--client-msg-id",
        "77",
        "second",
    ]);
    assert_eq!(
        (again.u("msg_id"), again.get("duplicate")),
        (2, &Json::Bool(true))
    );

    let unread = json(&["unread", "--addr", a, "--user", "2"]);
    let g = &unread.get("groups").arr()[0];
    assert_eq!((g.u("group"), g.u("head"), g.u("unread")), (1, 2, 2));
    let human = ok(&["unread", "--addr", a, "--user", "2"]);
    assert!(human.contains("total unread: 2"), "{human}");

    let sync = json(&["sync", "--addr", a, "--user", "2", "--per-group", "1"]);
    let g = &sync.get("groups").arr()[0];
    assert_eq!(g.u("unread"), 2);
    assert_eq!(g.get("messages").arr().len(), 1, "per-group limit");

    // Pull in pages of one: the second page's request acknowledges the first.
    let pull = json(&[
        "pull", "--addr", a, "--group", "1", "--user", "2", "--page", "1",
    ]);
    let msgs = pull.get("messages").arr();
    assert_eq!(msgs.len(), 2);
    assert_eq!(msgs[0].s("payload"), "hello, world");
    assert_eq!((msgs[1].u("msg_id"), msgs[1].u("client_msg_id")), (2, 77));
    assert_eq!(
        (pull.u("cursor"), pull.u("head"), pull.u("unread")),
        (2, 2, 0)
    );
    let empty = ok(&["pull", "--addr", a, "--group", "1", "--user", "2"]);
    assert_eq!(
        empty,
        "no unread messages; group 1 cursor 2, head 2, unread 0\n"
    );

    // User 3 peeks without acknowledging, then acknowledges one.
    let peek = ok(&[
        "pull", "--addr", a, "--group", "1", "--user", "3", "--no-ack",
    ]);
    assert!(
        peek.contains("] ") && peek.contains("from 1: hello, world\n"),
        "{peek}"
    );
    assert!(
        peek.ends_with("2 message(s), not acknowledged; group 1 cursor 0, head 2, unread 2\n"),
        "{peek}"
    );
    assert_eq!(
        ok(&["ack", "--addr", a, "--group", "1", "--user", "3", "--msg-id", "1"]),
        "user 3 in group 1: cursor 1\n"
    );

    let hist = json(&[
        "history", "--addr", a, "--group", "1", "--user", "3", "--max", "1",
    ]);
    assert_eq!(hist.get("messages").arr()[0].u("msg_id"), 2, "newest first");
    assert_eq!(hist.get("has_more"), &Json::Bool(true));

    let members = json(&["members", "--addr", a, "--group", "1"]);
    assert_eq!(members.u("member_count"), 2);
    let receipts = members.get("read_receipts").arr();
    assert_eq!((receipts[0].u("msg_id"), receipts[0].u("read_by")), (2, 1));
    assert_eq!((receipts[1].u("msg_id"), receipts[1].u("read_by")), (1, 2));

    let stats = json(&["stats", "--addr", a]);
    assert!(
        matches!(stats, Json::Obj(ref m) if !m.is_empty()),
        "{stats:?}"
    );
}

#[test]
fn client_errors_are_typed_messages_and_a_failure_status() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let node = Node::start(
        &dir.path().join("data"),
        &["--token-file", token.to_str().unwrap()],
    );
    let a = node.addr.as_str();
    let t = token.to_str().unwrap();
    let fail = |args: &[&str], expect: &str| {
        let out = tidemark(args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    };
    fail(&["stats", "--addr", a], "UNAUTHENTICATED");
    ok(&[
        "create-group",
        "--addr",
        a,
        "--token-file",
        t,
        "--group",
        "5",
    ]);
    fail(
        &[
            "create-group",
            "--addr",
            a,
            "--token-file",
            t,
            "--group",
            "5",
        ],
        "GROUP_EXISTS: group 5",
    );
    fail(
        &[
            "send",
            "--addr",
            a,
            "--token-file",
            t,
            "--group",
            "9",
            "--sender",
            "1",
            "x",
        ],
        "GROUP_NOT_FOUND: group 9",
    );
    fail(
        &[
            "pull",
            "--addr",
            a,
            "--token-file",
            t,
            "--group",
            "5",
            "--user",
            "4",
        ],
        "NOT_MEMBER: user 4 is not a member of group 5",
    );
    fail(
        &[
            "ack",
            "--addr",
            a,
            "--token-file",
            t,
            "--group",
            "5",
            "--user",
            "4",
            "--msg-id",
            "1",
        ],
        "NOT_MEMBER",
    );
    fail(
        &["join", "--addr", a, "--group", "0", "--user", "1"],
        "0 is reserved",
    );
    // No node at all: a clear message once the retry budget is spent.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nowhere = format!("127.0.0.1:{port}");
    let start = std::time::Instant::now();
    fail(
        &[
            "unread",
            "--addr",
            &nowhere,
            "--user",
            "1",
            "--timeout-ms",
            "300",
        ],
        "node unavailable",
    );
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    // One "node unavailable", then its cause (it was once nested twice).
    let out = tidemark(&[
        "unread",
        "--addr",
        &nowhere,
        "--user",
        "1",
        "--timeout-ms",
        "300",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.matches("node unavailable").count(), 1, "{err}");
}

#[test]
fn demo_delivers_n_of_n_with_no_duplicates_and_says_so() {
    // In-process node, JSON.
    let out = tidemark(&["demo", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = Json::parse(&text).unwrap();
    assert_eq!(report.get("ok"), &Json::Bool(true));
    let members = report.get("members").arr();
    assert_eq!(members.len(), 4);
    for m in members {
        assert_eq!(
            (m.u("delivered"), m.u("expected"), m.u("duplicates")),
            (30, 30, 0),
            "{m:?}"
        );
        assert_eq!(m.u("cursor"), 30, "acknowledged to the head");
    }
    assert!(report.u("retransmits") > 0, "the cut forced retransmits");
    // The six packets of one message, ack:N (the RECEIPT) last, and the
    // sender's receipts of her last message: every member has it.
    let flow = report.get("flow").arr();
    let packets: Vec<String> = flow
        .iter()
        .map(|l| match l {
            Json::Str(s) => s.split_whitespace().next().unwrap_or("").to_string(),
            other => panic!("flow line {other:?}"),
        })
        .collect();
    assert_eq!(
        packets,
        ["msg:R", "msg:A", "msg:N", "ack:R", "ack:A", "ack:N"],
        "{flow:?}"
    );
    assert_eq!(report.u("last_delivered"), 5);
    assert_eq!(report.u("member_count"), 5);
    assert_eq!(report.u("head"), 30, "each send stored once");
    let dropped: u64 = members.iter().map(|m| m.u("dropped_by_filter")).sum();
    assert!(
        dropped > 0,
        "duplicates did reach the client and were dropped"
    );

    // Against a running node, human-readable.
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let text = ok(&["demo", "--addr", &node.addr, "--messages", "4"]);
    assert!(
        text.contains("OK: every member received all 12 messages exactly once"),
        "{text}"
    );
    assert!(
        text.contains("ack:N  node -> alice   RECEIPT group"),
        "{text}"
    );
    for name in ["bob", "carol", "dave", "erin"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name) && l.contains(" / "))
            .unwrap_or_else(|| panic!("no line for {name}: {text}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[2..7], &["12", "/", "12", "/", "0"], "{line}");
    }
}

/// The write end of a pipe whose read end is closed already: every write
/// to it fails with EPIPE (Rust ignores SIGPIPE), as a `| head` that went
/// away.
fn closed_pipe() -> Stdio {
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) fills the two descriptors, which we then own.
    let rc = unsafe { libc::pipe(fds.as_mut_ptr()) };
    assert_eq!(rc, 0, "pipe: {}", std::io::Error::last_os_error());
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

/// A port nobody listens on (bound, learnt, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn pull_acknowledges_nothing_it_could_not_write_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(6).unwrap();
    c.join(6, 3, JoinStart::Earliest).unwrap();
    for i in 1..=60u64 {
        c.send(6, 1, i, format!("message {i}").as_bytes()).unwrap();
    }
    // `tidemark pull | head -c 100` once head has gone: the output cannot
    // be written, so the user saw nothing and nothing may be acknowledged.
    let out = Command::new(tidemark_bin())
        .args(["pull", "--addr", &node.addr, "--group", "6", "--user", "3"])
        .env("RUST_LOG", "warn")
        .stdout(closed_pipe())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a failed write is a failure: {err}");
    assert!(
        err.contains("writing output") && err.contains("nothing was acknowledged"),
        "{err}"
    );
    let page = c.pull(6, 3, 0, 0, 0).unwrap();
    assert_eq!(
        (page.cursor, page.head),
        (0, 60),
        "messages that were never printed were acknowledged"
    );
    // The same pull into a working pipe prints and acknowledges all 60.
    let text = ok(&["pull", "--addr", &node.addr, "--group", "6", "--user", "3"]);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("[group 6 #")).count(),
        60
    );
    assert!(
        text.ends_with("60 message(s), acknowledged; group 6 cursor 60, head 60, unread 0\n"),
        "{text}"
    );
}

#[test]
fn send_backs_off_on_a_refusal_and_reports_the_nodes_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    node.client().create_group(1).unwrap();
    // The same node with a free-space reserve no disk has: every send is
    // refused OVERLOADED (a refusal the node lifts by itself, so retried).
    let node = {
        let mut node = node;
        node.kill();
        Node::start(
            dir.path(),
            &["--disk-free-min-bytes", &u64::MAX.to_string()],
        )
    };
    let out = tidemark(&[
        "send",
        "--addr",
        &node.addr,
        "--group",
        "1",
        "--sender",
        "1",
        "--timeout-ms",
        "2000",
        "x",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    // The node is up and refusing: say so in its words, not "unavailable".
    assert!(
        err.starts_with("tidemark: OVERLOADED: disk nearly full"),
        "{err}"
    );
    assert!(!err.contains("unavailable"), "{err}");
    // With backoff a 2 s budget holds a handful of attempts (without it,
    // thousands were made).
    let attempts: u32 = err
        .split("refused ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no attempt count: {err}"));
    assert!((2..=50).contains(&attempts), "{attempts} attempts: {err}");
}

#[test]
fn an_invalid_address_fails_at_once_with_a_clear_error() {
    for addr in ["not an address", "no-such-host.invalid:7070"] {
        let out = tidemark(&[
            "send",
            "--addr",
            addr,
            "--group",
            "1",
            "--sender",
            "1",
            "--timeout-ms",
            "3000",
            "x",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.starts_with(&format!("tidemark: invalid address {addr:?}: ")),
            "{err}"
        );
        assert!(!err.contains("attempt"), "not retried: {err}");
    }
}

#[test]
fn serve_keeps_serving_when_its_stdout_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut child = Command::new(tidemark_bin())
        .args(["serve", "--listen", &addr, "--data"])
        .arg(dir.path().join("data"))
        .env("RUST_LOG", "warn")
        .stdout(closed_pipe())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut c = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the node exited ({status}) because its stdout was closed");
        }
        if let Ok(c) = Client::connect(&ClientConfig::new(addr.clone())) {
            break c;
        }
        assert!(Instant::now() < deadline, "the node never accepted");
        std::thread::sleep(Duration::from_millis(20));
    };
    // The "listening" line could not be written; the node went on.
    std::thread::sleep(Duration::from_millis(100));
    c.ping().expect("PING");
    assert!(child.try_wait().unwrap().is_none(), "the node exited");
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs `tidemark serve` that must fail at start; returns its stderr.
fn serve_fails(args: &[&str]) -> String {
    let out = Command::new(tidemark_bin())
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "serve {args:?} started: {err}");
    err
}

#[test]
fn start_up_errors_name_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_s = data.to_str().unwrap();

    // A taken address is found before the data directory is touched.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let err = serve_fails(&["--listen", &addr, "--data", data_s]);
    assert!(
        err.contains(&format!("tidemark: listen {addr}: Address already in use")),
        "{err}"
    );
    assert!(
        !data.exists(),
        "the data directory was opened before binding"
    );

    // A data directory that is a file.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let err = serve_fails(&["--listen", "127.0.0.1:0", "--data", file.to_str().unwrap()]);
    assert!(
        err.contains(&format!(
            "data directory {} is not a directory",
            file.display()
        )),
        "{err}"
    );

    // A token file that cannot be read, for the node and for a client.
    let missing = dir.path().join("no-token");
    let missing_s = missing.to_str().unwrap();
    let err = serve_fails(&[
        "--listen",
        "127.0.0.1:0",
        "--data",
        data_s,
        "--token-file",
        missing_s,
    ]);
    assert!(
        err.contains(&format!("cannot read token file {missing_s}: ")),
        "{err}"
    );
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let node = Node::start(&data, &["--token-file", token.to_str().unwrap()]);

    // A data directory another node holds: the refusal names the process
    // that holds it (its id is in the LOCK file) and what to do; before,
    // it said only "locked by another process".
    let err = serve_fails(&["--listen", "127.0.0.1:0", "--data", data_s]);
    let pid = node.child.id();
    assert!(
        err.contains(&format!("is locked by process {pid}"))
            && err.contains("Stop that process first"),
        "{err}"
    );
    let out = tidemark(&["stats", "--addr", &node.addr, "--token-file", missing_s]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!("cannot read token file {missing_s}: ")),
        "{err}"
    );
    // No token at all is not "wrong token".
    let out = tidemark(&["stats", "--addr", &node.addr]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("UNAUTHENTICATED: the node requires a token and none was given"),
        "{err}"
    );
}

#[test]
fn ids_of_zero_are_refused_for_every_id_argument() {
    let cases: &[&[&str]] = &[
        &["create-group", "--group", "0"],
        &["join", "--group", "0", "--user", "1"],
        &["join", "--group", "1", "--user", "0"],
        &["send", "--group", "1", "--sender", "0", "x"],
        &["send", "--group", "0", "--sender", "1", "x"],
        &["pull", "--group", "1", "--user", "0"],
        &["ack", "--group", "1", "--user", "1", "--msg-id", "0"],
        &["unread", "--user", "0"],
        &["sync", "--user", "0"],
        &["history", "--group", "1", "--user", "0"],
        &["members", "--group", "0"],
        &["group-info", "--group", "0"],
    ];
    // No node: the argument is refused before anything is sent.
    let nowhere = format!("127.0.0.1:{}", free_port());
    for args in cases {
        let mut all = args.to_vec();
        all.extend(["--addr", &nowhere, "--timeout-ms", "100"]);
        let out = tidemark(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("0 is reserved; ids start at 1"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn errors_under_json_are_json_objects_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();
    let error_of = |args: &[&str]| {
        let out = tidemark(args);
        assert!(!out.status.success(), "{args:?}");
        assert!(out.stdout.is_empty(), "no result on stdout: {args:?}");
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        assert_eq!(err.lines().count(), 1, "{err}");
        let v = Json::parse(&err).unwrap_or_else(|e| panic!("not JSON ({e}): {err}"));
        let e = v.get("error");
        (e.s("code").to_string(), e.s("message").to_string())
    };
    let (code, message) = error_of(&[
        "send", "--addr", a, "--group", "9", "--sender", "1", "x", "--json",
    ]);
    assert_eq!(
        (code.as_str(), message.as_str()),
        ("GROUP_NOT_FOUND", "GROUP_NOT_FOUND: group 9")
    );
    let (code, message) = error_of(&[
        "send", "--addr", a, "--group", "9", "--sender", "0", "x", "--json",
    ]);
    assert_eq!(code, "usage");
    assert!(message.contains("0 is reserved"), "{message}");
    let (code, _) = error_of(&["stats", "--addr", "not an address", "--json"]);
    assert_eq!(code, "invalid_address");
}

/// A minimal JSON value and parser (the test crate has no JSON library).
#[derive(Debug, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    pub(crate) fn parse(s: &str) -> Result<Json, String> {
        let mut p = Parser {
            b: s.trim().as_bytes(),
            i: 0,
        };
        let v = p.value()?;
        if p.i != p.b.len() {
            return Err(format!("trailing bytes at {}", p.i));
        }
        Ok(v)
    }

    pub(crate) fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m
                .get(key)
                .unwrap_or_else(|| panic!("no key {key} in {self:?}")),
            _ => panic!("not an object: {self:?}"),
        }
    }

    pub(crate) fn u(&self, key: &str) -> u64 {
        match self.get(key) {
            Json::Num(n) => *n as u64,
            other => panic!("{key} is not a number: {other:?}"),
        }
    }

    pub(crate) fn s(&self, key: &str) -> &str {
        match self.get(key) {
            Json::Str(s) => s,
            other => panic!("{key} is not a string: {other:?}"),
        }
    }

    pub(crate) fn arr(&self) -> &[Json] {
        match self {
            Json::Arr(v) => v,
            _ => panic!("not an array: {self:?}"),
        }
    }
}

struct Parser<'a> {
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at {}", c as char, self.i))
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        match self.b.get(self.i) {
            Some(b'{') => {
                self.i += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.b.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Json::Obj(m));
                }
                loop {
                    self.ws();
                    let Json::Str(k) = self.value()? else {
                        return Err("object key".into());
                    };
                    self.eat(b':')?;
                    m.insert(k, self.value()?);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Json::Obj(m));
                        }
                        _ => return Err(format!("object at {}", self.i)),
                    }
                }
            }
            Some(b'[') => {
                self.i += 1;
                let mut v = Vec::new();
                self.ws();
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Json::Arr(v));
                }
                loop {
                    v.push(self.value()?);
                    self.ws();
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Json::Arr(v));
                        }
                        _ => return Err(format!("array at {}", self.i)),
                    }
                }
            }
            Some(b'"') => {
                self.i += 1;
                let mut out = String::new();
                loop {
                    let c = *self.b.get(self.i).ok_or("unterminated string")?;
                    self.i += 1;
                    match c {
                        b'"' => return Ok(Json::Str(out)),
                        b'\\' => {
                            let e = *self.b.get(self.i).ok_or("escape")?;
                            self.i += 1;
                            match e {
                                b'n' => out.push('\n'),
                                b't' => out.push('\t'),
                                b'r' => out.push('\r'),
                                b'u' => {
                                    let hex = std::str::from_utf8(&self.b[self.i..self.i + 4])
                                        .map_err(|e| e.to_string())?;
                                    let cp =
                                        u32::from_str_radix(hex, 16).map_err(|e| e.to_string())?;
                                    out.push(char::from_u32(cp).unwrap_or('?'));
                                    self.i += 4;
                                }
                                other => out.push(other as char),
                            }
                        }
                        _ => {
                            // Copy a whole UTF-8 sequence.
                            let start = self.i - 1;
                            let mut end = self.i;
                            while end < self.b.len() && (self.b[end] & 0xC0) == 0x80 {
                                end += 1;
                            }
                            out.push_str(
                                std::str::from_utf8(&self.b[start..end])
                                    .map_err(|e| e.to_string())?,
                            );
                            self.i = end;
                        }
                    }
                }
            }
            Some(b't') if self.b[self.i..].starts_with(b"true") => {
                self.i += 4;
                Ok(Json::Bool(true))
            }
            Some(b'f') if self.b[self.i..].starts_with(b"false") => {
                self.i += 5;
                Ok(Json::Bool(false))
            }
            Some(b'n') if self.b[self.i..].starts_with(b"null") => {
                self.i += 4;
                Ok(Json::Null)
            }
            Some(_) => {
                let start = self.i;
                while self.i < self.b.len()
                    && matches!(
                        self.b[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                std::str::from_utf8(&self.b[start..self.i])
                    .ok()
                    .and_then(|t| t.parse::<f64>().ok())
                    .map(Json::Num)
                    .ok_or_else(|| format!("value at {start}"))
            }
            None => Err("unexpected end".into()),
        }
    }
}

/// `send` and `edit` take every trailing word as the message (joined by
/// single spaces), as a user types it; before, `edit ... see you at 6`
/// failed with "unexpected argument 'you'".
#[test]
fn send_and_edit_take_the_trailing_words_as_the_message() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();
    ok(&["create-group", "--addr", a, "--group", "1"]);
    ok(&[
        "join", "--addr", a, "--group", "1", "--user", "3", "--start", "earliest",
    ]);
    assert_eq!(
        ok(&["send", "--addr", a, "--group", "1", "--sender", "2", "see", "you", "at", "5"]),
        "sent to group 1: msg_id 1\n"
    );
    assert_eq!(
        ok(&[
            "edit", "--addr", a, "--group", "1", "--sender", "2", "--msg-id", "1", "see", "you",
            "at", "6",
        ]),
        "edited message 1 of group 1: edit msg_id 2\n"
    );
    let pulled = ok(&["pull", "--addr", a, "--group", "1", "--user", "3"]);
    assert!(pulled.contains(": see you at 5"), "{pulled}");
    assert!(pulled.contains("(edit of #1) see you at 6"), "{pulled}");
}

/// `serve` takes the addresses and sizes every other command takes: a
/// name in `--listen` (`localhost:PORT`, as clients' `--addr`), units in
/// sizes (`--payload-bytes-max 4MiB`, as `retention --max-bytes 256KiB`)
/// and durations (`--receipt-interval-ms 1s`). Before, both were refused.
#[test]
fn serve_takes_names_in_addresses_and_units_in_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let listen = format!("localhost:{port}");
    let mut child = Command::new(tidemark_bin())
        .args([
            "serve",
            "--data",
            dir.path().to_str().unwrap(),
            "--listen",
            &listen,
            "--payload-bytes-max",
            "2MiB",
            "--frame-bytes-max",
            "4MiB",
            "--receipt-interval-ms",
            "1s",
            "--fsync",
            "never",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start serve");
    let addr = listen.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let stats = loop {
        if let Ok(mut c) = Client::connect(&ClientConfig::new(addr.clone())) {
            break c.stats().unwrap();
        }
        assert!(Instant::now() < deadline, "serve did not start on {listen}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    let get = |n: &str| stats.iter().find(|(k, _)| k == n).map(|(_, v)| *v);
    assert_eq!(get("limits.payload_bytes_max"), Some(2 << 20));
    assert_eq!(get("limits.frame_bytes_max"), Some(4 << 20));
    assert_eq!(get("limits.receipt_interval_ms"), Some(1000));
}
