//! The `tidemark` client subcommands and `tidemark demo`, run as a user
//! would: the real binary against a real node (harness), human-readable
//! output checked for its key lines, `--json` output parsed and checked.

use std::collections::BTreeMap;
use std::process::{Command, Output};

use crate::harness::{tidemark_bin, Node};

fn tidemark(args: &[&str]) -> Output {
    Command::new(tidemark_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tidemark")
}

/// Runs a subcommand that must succeed; returns its stdout.
fn ok(args: &[&str]) -> String {
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
fn json(args: &[&str]) -> Json {
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

    let members = json(&["members", "--addr", a, "--group", "1", "--user", "2"]);
    assert_eq!(members.u("members"), 2);
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
    for name in ["bob", "carol", "dave", "erin"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(name) && l.contains(" / "))
            .unwrap_or_else(|| panic!("no line for {name}: {text}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[2..7], &["12", "/", "12", "/", "0"], "{line}");
    }
}

/// A minimal JSON value and parser (the test crate has no JSON library).
#[derive(Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn parse(s: &str) -> Result<Json, String> {
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

    fn get(&self, key: &str) -> &Json {
        match self {
            Json::Obj(m) => m
                .get(key)
                .unwrap_or_else(|| panic!("no key {key} in {self:?}")),
            _ => panic!("not an object: {self:?}"),
        }
    }

    fn u(&self, key: &str) -> u64 {
        match self.get(key) {
            Json::Num(n) => *n as u64,
            other => panic!("{key} is not a number: {other:?}"),
        }
    }

    fn s(&self, key: &str) -> &str {
        match self.get(key) {
            Json::Str(s) => s,
            other => panic!("{key} is not a string: {other:?}"),
        }
    }

    fn arr(&self) -> &[Json] {
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
