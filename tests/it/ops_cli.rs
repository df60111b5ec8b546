//! Operating a node from the command line, with
//! the real binary: `serve --config FILE` (values reach the node, flags
//! override the file, bad keys are refused by name), `--version`, payloads
//! from standard input and files, `ping`, `leave`, `delete-group`, and
//! `tail` (prints what is sent after it started, exits 0 on SIGINT).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::{tidemark_bin, Node};

fn tidemark(args: &[&str]) -> Output {
    Command::new(tidemark_bin())
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run tidemark")
}

fn ok(args: &[&str]) -> String {
    let out = tidemark(args);
    assert!(
        out.status.success(),
        "tidemark {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// A config file that lets a node take 2 MiB payloads (the default is
/// 1 MiB), with a fsync policy and a data directory the harness's flags
/// override.
/// `tidemark ARGS`, which must exit by itself (a `serve` that starts
/// although it should not fails the test instead of hanging it).
fn must_exit(args: &[&str]) -> Output {
    let mut child = Reaped(
        Command::new(tidemark_bin())
            .args(args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tidemark"),
    );
    let status = wait_exit(&mut child);
    Output {
        status,
        stdout: read_all(child.stdout.take()),
        stderr: read_all(child.stderr.take()),
    }
}

fn read_all(pipe: Option<impl std::io::Read>) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(mut pipe) = pipe {
        pipe.read_to_end(&mut bytes).unwrap();
    }
    bytes
}

fn write_config(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("tidemark.toml");
    std::fs::write(
        &path,
        "# test node\n\
         payload_bytes_max = 3145728\n\
         frame_bytes_max = 8388608\n\
         output_bytes_max = 16777216\n\
         fsync = \"never\"\n\
         data = \"/nonexistent/overridden-by-the-flag\"\n",
    )
    .expect("write config");
    path
}

#[test]
fn config_file_values_reach_the_node_and_flags_override_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let config = config.to_str().unwrap();

    // The file's payload limit is what the node announces in HELLO; its
    // `data` key is overridden by the harness's --data flag (the node
    // starts on the temp dir, not on /nonexistent).
    let node = Node::start(&dir.path().join("a"), &["--config", config]);
    assert_eq!(node.client().limits().payload_bytes_max, 3 << 20);
    assert_eq!(node.client().limits().frame_bytes_max, 8 << 20);
    drop(node);

    // A flag overrides the file's key.
    let node = Node::start(
        &dir.path().join("b"),
        &["--config", config, "--payload-bytes-max", "2000"],
    );
    assert_eq!(node.client().limits().payload_bytes_max, 2000);
    assert_eq!(node.client().limits().frame_bytes_max, 8 << 20);
    drop(node);

    // Refusals name the key, and the node does not start.
    for (text, expect) in [
        ("payload_byte_max = 5\n", "unknown key `payload_byte_max`"),
        (
            "payload_bytes_max = \"lots\"\n",
            "key `payload_bytes_max`: invalid value \"lots\"",
        ),
        (
            "fsync = true\n",
            "key `fsync`: expected an integer or a string, found boolean",
        ),
    ] {
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, text).unwrap();
        let data = dir.path().join("c");
        let out = must_exit(&[
            "serve",
            "--config",
            bad.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text}: started");
        assert!(stderr.contains(expect), "{text}: {stderr}");
        assert!(stderr.contains("bad.toml"), "names the file: {stderr}");
        assert!(out.stdout.is_empty(), "{text}: never listened");
    }
}

#[test]
fn version_names_the_build_commit() {
    let version = ok(&["--version"]);
    let commit = version
        .trim_end()
        .strip_prefix(&format!("tidemark {} (commit ", env!("CARGO_PKG_VERSION")))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected --version: {version:?}"));
    // In a git checkout, the commit checked out; elsewhere `unknown`.
    let git = Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match git {
        Some(head) => assert_eq!(commit, head),
        None => assert_eq!(commit, "unknown"),
    }
}

/// Bytes that are not text, so that nothing on the way may treat them as
/// a string (or strip a trailing newline).
fn binary_payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len - 1)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed)
        .chain(std::iter::once(b'\n'))
        .collect()
}

#[test]
fn payloads_of_2_mib_from_stdin_and_from_a_file_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let node = Node::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let a = node.addr.as_str();
    ok(&["create-group", "--addr", a, "--group", "1"]);
    ok(&[
        "join", "--addr", a, "--group", "1", "--user", "2", "--start", "earliest",
    ]);

    let from_stdin = binary_payload(2 << 20, 0x5a);
    let mut send = Command::new(tidemark_bin())
        .args(["send", "--addr", a, "--group", "1", "--sender", "7", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    send.stdin.take().unwrap().write_all(&from_stdin).unwrap();
    let out = send.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "sent to group 1: msg_id 1\n"
    );

    let from_file = binary_payload(2 << 20, 0xa5);
    let file = dir.path().join("payload.bin");
    std::fs::write(&file, &from_file).unwrap();
    let sent = ok(&[
        "send",
        "--addr",
        a,
        "--group",
        "1",
        "--sender",
        "7",
        "--payload-file",
        file.to_str().unwrap(),
    ]);
    assert_eq!(sent, "sent to group 1: msg_id 2\n");

    // A literal "-" goes through standard input too.
    let mut send = Command::new(tidemark_bin())
        .args(["send", "--addr", a, "--group", "1", "--sender", "7", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    send.stdin.take().unwrap().write_all(b"-").unwrap();
    assert!(send.wait().unwrap().success());

    let mut c = node.client();
    let mut got = Vec::new();
    while got.len() < 3 {
        let page = c.pull(1, 2, 0, 3, 0).unwrap();
        assert!(!page.messages.is_empty(), "pulled {} of 3", got.len());
        got.extend(page.messages);
        c.ack(1, 2, got.last().unwrap().msg_id).unwrap();
    }
    assert_eq!(got[0].payload, from_stdin, "the payload read from stdin");
    assert_eq!(got[1].payload, from_file, "the payload read from the file");
    assert_eq!(got[2].payload, b"-");

    // MESSAGE and --payload-file exclude each other; one is required.
    let both = tidemark(&[
        "send",
        "--addr",
        a,
        "--group",
        "1",
        "--sender",
        "7",
        "--payload-file",
        file.to_str().unwrap(),
        "text",
    ]);
    assert_eq!(both.status.code(), Some(2), "usage error");
    let neither = tidemark(&["send", "--addr", a, "--group", "1", "--sender", "7"]);
    assert_eq!(neither.status.code(), Some(2), "usage error");
    let missing = tidemark(&[
        "send",
        "--addr",
        a,
        "--group",
        "1",
        "--sender",
        "7",
        "--payload-file",
        "/nonexistent/payload",
        "--json",
    ]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains(r#""code":"input""#));
}

#[test]
fn ping_leave_and_delete_group() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();
    let pong = ok(&["ping", "--addr", a]);
    assert!(pong.starts_with(&format!("pong from {a} in ")), "{pong}");
    assert!(pong.ends_with(" ms\n"), "{pong}");

    ok(&["create-group", "--addr", a, "--group", "5"]);
    ok(&["join", "--addr", a, "--group", "5", "--user", "8"]);
    assert_eq!(
        ok(&["leave", "--addr", a, "--group", "5", "--user", "8"]),
        "user 8 left group 5\n"
    );
    let mut c = node.client();
    match c.pull(5, 8, 0, 1, 0) {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::NotMember), "{e}"),
        Ok(p) => panic!("still a member: {p:?}"),
    }
    // LEAVE is not idempotent: the node's refusal, by its wire name.
    let again = tidemark(&[
        "leave", "--addr", a, "--group", "5", "--user", "8", "--json",
    ]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains(r#""code":"NOT_MEMBER""#));

    assert_eq!(
        ok(&["delete-group", "--addr", a, "--group", "5"]),
        "deleted group 5\n"
    );
    match c.join(5, 8, JoinStart::Head) {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::GroupNotFound), "{e}"),
        Ok(cursor) => panic!("group still there (cursor {cursor})"),
    }
    let again = tidemark(&["delete-group", "--addr", a, "--group", "5"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("GROUP_NOT_FOUND"));
    // The id is free again.
    ok(&["create-group", "--addr", a, "--group", "5"]);
}

/// A child process killed when the test ends, also when it fails (a child
/// left running would hold the test's output pipes open).
struct Reaped(Child);

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines a child writes to a pipe, read on a thread so that a test waits
/// with a timeout instead of hanging on a child that went wrong.
fn lines(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn next_line(rx: &mpsc::Receiver<String>, what: &str) -> String {
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("no {what}: {e}"))
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn tail_prints_messages_sent_after_it_started_and_exits_0_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    let a = node.addr.as_str();
    ok(&["create-group", "--addr", a, "--group", "3"]);
    ok(&[
        "send",
        "--addr",
        a,
        "--group",
        "3",
        "--sender",
        "1",
        "before the tail",
    ]);

    let mut tail = Reaped(
        Command::new(tidemark_bin())
            .args(["tail", "--addr", a, "--group", "3"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = lines(tail.stdout.take().unwrap());
    let err = lines(tail.stderr.take().unwrap());
    let ready = next_line(&err, "following line");
    assert_eq!(
        ready,
        format!("tidemark: following group 3 on {a} (Ctrl-C stops)")
    );

    ok(&[
        "send",
        "--addr",
        a,
        "--group",
        "3",
        "--sender",
        "1",
        "first live",
    ]);
    ok(&[
        "send",
        "--addr",
        a,
        "--group",
        "3",
        "--sender",
        "4",
        "second live",
    ]);
    let first = next_line(&out, "first message");
    assert!(first.starts_with("[group 3 #2] "), "{first}");
    assert!(first.ends_with(" from 1: first live"), "{first}");
    let second = next_line(&out, "second message");
    assert!(second.starts_with("[group 3 #3] "), "{second}");
    assert!(second.ends_with(" from 4: second live"), "{second}");

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(tail.id() as i32, libc::SIGINT) };
    let status = wait_exit(&mut tail);
    assert_eq!(status.code(), Some(0), "exit status after SIGINT");
    assert_eq!(
        next_line(&err, "the closing line"),
        "tidemark: stopped following group 3 (2 message(s) printed)"
    );
    // Nothing else was printed: no message from before the tail.
    assert!(out.recv_timeout(Duration::from_secs(5)).is_err());

    // Following a group that does not exist fails at once, by the node's
    // refusal.
    let missing = tidemark(&["tail", "--addr", a, "--group", "99"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("GROUP_NOT_FOUND"));
}

/// A node on a fixed port (so that a restarted node has the same address).
fn serve_on(dir: &Path, addr: &str) -> Reaped {
    let mut child = Command::new(tidemark_bin())
        .args(["serve", "--data", dir.to_str().unwrap(), "--listen", addr])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert_eq!(crate::harness::listening_addr(&mut child), addr);
    Reaped(child)
}

#[test]
fn tail_reconnects_and_names_the_messages_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let a = format!("127.0.0.1:{port}");
    let a = a.as_str();
    let node = serve_on(dir.path(), a);
    ok(&["create-group", "--addr", a, "--group", "4"]);
    let mut tail = Reaped(
        Command::new(tidemark_bin())
            .args(["tail", "--addr", a, "--group", "4", "--timeout-ms", "20000"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = lines(tail.stdout.take().unwrap());
    let err = lines(tail.stderr.take().unwrap());
    next_line(&err, "following line");
    ok(&["send", "--addr", a, "--group", "4", "--sender", "1", "one"]);
    assert!(next_line(&out, "message 1").ends_with(": one"));

    // The tail is stopped while its node restarts and a message is stored:
    // nothing can push it that message.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(tail.id() as i32, libc::SIGSTOP) };
    drop(node); // SIGKILL
    let _node = serve_on(dir.path(), a);
    ok(&[
        "send", "--addr", a, "--group", "4", "--sender", "1", "missed",
    ]);
    // SAFETY: as above.
    unsafe { libc::kill(tail.id() as i32, libc::SIGCONT) };
    let lost = next_line(&err, "connection lost line");
    assert!(lost.starts_with("tidemark: connection lost ("), "{lost}");
    let again = next_line(&err, "following again line");
    assert!(
        again.starts_with("tidemark: following group 4 again"),
        "{again}"
    );

    ok(&[
        "send", "--addr", a, "--group", "4", "--sender", "1", "three",
    ]);
    let gap = next_line(&err, "gap line");
    assert_eq!(
        gap,
        "tidemark: group 4: msg_ids 2..=2 were not pushed to this tail; a member sees them with `tidemark history --group 4 --user USER --before 3`"
    );
    let third = next_line(&out, "message 3");
    assert!(third.starts_with("[group 4 #3] "), "{third}");

    // SAFETY: as above.
    unsafe { libc::kill(tail.id() as i32, libc::SIGTERM) };
    assert_eq!(wait_exit(&mut tail).code(), Some(0));
}
