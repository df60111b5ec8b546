//! A real full disk: the node's data directory sits on a small tmpfs that a
//! ballast file fills. Senders must get a typed refusal (OVERLOADED), never
//! lose an answered send, and the node must accept sends again by itself
//! once the ballast is removed; a SIGKILL and restart afterwards must find
//! every answered send exactly once.
//!
//! Mounting needs CAP_SYS_ADMIN (root in the CI container). Where the mount
//! is refused the tests say so on stderr and return: the same paths are
//! covered with injected ENOSPC by the engine's unit tests
//! (`tests::a_full_disk_*`).

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{BufRead, BufReader};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::harness::{tidemark_bin, Node};

const GROUP: u64 = 1;
const PROBE_GROUP: u64 = 2;
const READER: u64 = 1_000;
const PAYLOAD_BYTES: usize = 2_048;

/// A tmpfs of a fixed size, unmounted on drop.
struct SmallFs {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl SmallFs {
    /// None where this process may not mount.
    fn mount(bytes: u64) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("fs");
        std::fs::create_dir(&root).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(&root)
            .output()
            .ok()?;
        if !out.status.success() {
            eprintln!(
                "disk_full: cannot mount a tmpfs here ({}); test not run",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return None;
        }
        Some(SmallFs { _dir: dir, root })
    }

    fn free_bytes(&self) -> u64 {
        let path = CString::new(self.root.as_os_str().as_bytes()).expect("no NUL in a temp path");
        // SAFETY: statvfs(3) fills the zeroed struct; the path is NUL-terminated.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::statvfs(path.as_ptr(), &mut s) };
        assert_eq!(rc, 0, "statvfs {}", self.root.display());
        s.f_bavail as u64 * s.f_frsize as u64
    }

    /// Fills the file system until `leave` bytes are free (written, not
    /// sparse: tmpfs only charges pages that hold data).
    fn fill_leaving(&self, leave: u64) -> PathBuf {
        let path = self.root.join("ballast");
        let n = self.free_bytes().saturating_sub(leave);
        std::fs::write(&path, vec![0xbau8; n as usize]).expect("write the ballast");
        path
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.root).status();
    }
}

fn payload_of(client_msg_id: u64) -> Vec<u8> {
    let tag = format!("msg {client_msg_id};");
    tag.bytes().cycle().take(PAYLOAD_BYTES).collect()
}

/// Sends until told to stop, recording every answered send. A send the
/// node holds (its round met the full disk) simply waits for its answer.
fn keep_sending(addr: String, stop: Arc<AtomicBool>, answered: Arc<Mutex<HashMap<u64, u64>>>) {
    let mut config = ClientConfig::new(addr);
    config.io_timeout = Duration::from_secs(120);
    let mut c = Client::connect(&config).expect("connect the sender");
    let mut client_msg_id = 0;
    while !stop.load(Ordering::SeqCst) {
        client_msg_id += 1;
        match c.send(GROUP, 7, client_msg_id, &payload_of(client_msg_id)) {
            Ok(sent) => {
                answered.lock().unwrap().insert(client_msg_id, sent.msg_id);
            }
            Err(e) if e.code() == Some(ErrorCode::Overloaded) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("send {client_msg_id}: {e}"),
        }
    }
}

/// Sends probes from a second connection until one is refused with
/// OVERLOADED (returned), reconnecting after a probe the node held. Panics
/// after `limit`.
fn probe_until_refused(addr: &str, limit: Duration) -> ClientError {
    let deadline = Instant::now() + limit;
    let mut config = ClientConfig::new(addr.to_string());
    config.io_timeout = Duration::from_secs(2);
    let mut probe = 0u64;
    loop {
        assert!(
            Instant::now() < deadline,
            "the full disk was never reported"
        );
        let Ok(mut c) = Client::connect(&config) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        loop {
            probe += 1;
            match c.send(PROBE_GROUP, 8, probe, b"probe") {
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                Err(e) if e.code() == Some(ErrorCode::Overloaded) => return e,
                Err(e) if e.code().is_none() => break, // held: time out, reconnect
                Err(e) => panic!("probe: {e}"),
            }
            assert!(
                Instant::now() < deadline,
                "the full disk was never reported"
            );
        }
    }
}

/// Sends to the probe group until one is accepted.
fn wait_until_accepted(addr: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut config = ClientConfig::new(addr.to_string());
    config.io_timeout = Duration::from_secs(30);
    let mut c = Client::connect(&config).expect("connect");
    for probe in 1_000_000u64.. {
        match c.send(PROBE_GROUP, 8, probe, b"probe") {
            Ok(_) => return,
            Err(e) if e.code() == Some(ErrorCode::Overloaded) => {
                assert!(Instant::now() < deadline, "sends still refused: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("probe after space returned: {e}"),
        }
    }
}

/// Reads the group whole through PULL and checks that every answered send
/// is there once, under its id, with its payload, and that ids are dense.
fn check_every_answered_send(node: &Node, answered: &HashMap<u64, u64>) {
    let mut c = node.client();
    let mut stored: HashMap<u64, u64> = HashMap::new();
    let mut cursor = 0;
    loop {
        let page = c.pull(GROUP, READER, cursor, 500, 0).expect("pull");
        for m in &page.messages {
            assert_eq!(m.msg_id, cursor + 1, "ids dense");
            cursor = m.msg_id;
            assert_eq!(m.payload, payload_of(m.client_msg_id), "msg {}", m.msg_id);
            let earlier = stored.insert(m.client_msg_id, m.msg_id);
            assert!(
                earlier.is_none(),
                "client_msg_id {} stored twice",
                m.client_msg_id
            );
        }
        if page.messages.is_empty() {
            break;
        }
    }
    for (client_msg_id, msg_id) in answered {
        assert_eq!(
            stored.get(client_msg_id),
            Some(msg_id),
            "answered send {client_msg_id} (msg {msg_id}) lost or moved"
        );
    }
}

/// Fills the disk under a sending node, checks the typed refusal, frees
/// space, checks the node takes sends again by itself, then kills and
/// restarts it and checks every answered send.
fn fill_refuse_recover(fs: &SmallFs, node_flags: &[&str], leave_free: u64) -> ClientError {
    let data = fs.root.join("data");
    let node = Node::start(&data, node_flags);
    let mut c = node.client();
    c.create_group(GROUP).unwrap();
    c.create_group(PROBE_GROUP).unwrap();
    c.join(GROUP, READER, JoinStart::Earliest).unwrap();
    let ballast = fs.fill_leaving(leave_free);

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(Mutex::new(HashMap::new()));
    let sender = {
        let (addr, stop, answered) = (node.addr.clone(), stop.clone(), answered.clone());
        std::thread::spawn(move || keep_sending(addr, stop, answered))
    };
    let refusal = probe_until_refused(&node.addr, Duration::from_secs(120));
    let before = answered.lock().unwrap().len();
    assert!(
        before > 0,
        "some sends were answered before the disk filled"
    );

    std::fs::remove_file(&ballast).expect("remove the ballast");
    wait_until_accepted(&node.addr, Duration::from_secs(60));
    // The sender goes on (its held send, if any, was answered).
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.lock().unwrap().len() < before + 20 {
        assert!(Instant::now() < deadline, "the sender never went on");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    sender.join().expect("sender thread");

    let node = node.restart_after_kill();
    check_every_answered_send(&node, &answered.lock().unwrap());
    refusal
}

#[test]
fn the_free_space_reserve_refuses_sends_typed_and_lets_them_in_again_by_itself() {
    let Some(fs) = SmallFs::mount(24 << 20) else {
        return;
    };
    let reserve = 4u64 << 20;
    let refusal = fill_refuse_recover(
        &fs,
        &["--disk-free-min-bytes", &reserve.to_string()],
        reserve + (2 << 20),
    );
    let ClientError::Server { detail, .. } = refusal else {
        panic!("{refusal}")
    };
    let free = detail.expect("OVERLOADED for a full disk carries the free bytes");
    assert!(free < reserve, "refused with {free} bytes free");
}

#[test]
fn a_write_that_finds_the_disk_full_is_held_refuses_sends_and_goes_on_by_itself() {
    let Some(fs) = SmallFs::mount(24 << 20) else {
        return;
    };
    // No reserve: the node's writes run into ENOSPC for real.
    let refusal = fill_refuse_recover(&fs, &["--disk-free-min-bytes", "0"], 1 << 20);
    assert_eq!(refusal.code(), Some(ErrorCode::Overloaded), "{refusal}");
}

/// `tidemark serve` with its log captured line by line (the harness's
/// node inherits stderr).
struct LoggedNode {
    child: std::process::Child,
    addr: String,
    lines: std::sync::mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl LoggedNode {
    fn start(data: &std::path::Path) -> LoggedNode {
        let mut child = Command::new(tidemark_bin())
            .arg("serve")
            .arg("--data")
            .arg(data)
            .args(["--listen", "127.0.0.1:0", "--disk-free-min-bytes", "0"])
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tidemark");
        let addr = crate::harness::listening_addr(&mut child);
        let (tx, lines) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().expect("piped stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        LoggedNode {
            child,
            addr,
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads the log until a line contains `what`; panics after `limit`.
    fn wait_for_line(&mut self, what: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.seen.iter().any(|l| l.contains(what)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no log line with {what:?}:\n{}", self.seen.join("\n")),
            }
        }
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }
}

impl Drop for LoggedNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends until the node refuses for good or goes away, recording every
/// answered send; a refusal of a full disk is waited out.
fn send_until_gone(addr: String, answered: Arc<Mutex<HashMap<u64, u64>>>, stop: Arc<AtomicBool>) {
    let mut config = ClientConfig::new(addr);
    config.io_timeout = Duration::from_secs(120);
    let mut c = Client::connect(&config).expect("connect the sender");
    let mut client_msg_id = 0;
    while !stop.load(Ordering::SeqCst) {
        client_msg_id += 1;
        match c.send(GROUP, 7, client_msg_id, &payload_of(client_msg_id)) {
            Ok(sent) => {
                answered.lock().unwrap().insert(client_msg_id, sent.msg_id);
            }
            Err(e) if e.code() == Some(ErrorCode::Overloaded) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(_) => return, // the node is gone
        }
    }
}

/// A node on a full disk: a sender's round is held (a probe was refused).
struct HeldNode {
    node: LoggedNode,
    ballast: PathBuf,
    answered: Arc<Mutex<HashMap<u64, u64>>>,
    stop: Arc<AtomicBool>,
    sender: std::thread::JoinHandle<()>,
}

fn hold_a_round(fs: &SmallFs) -> HeldNode {
    let node = LoggedNode::start(&fs.root.join("data"));
    let mut c = Client::connect(&ClientConfig::new(node.addr.clone())).expect("connect");
    c.create_group(GROUP).unwrap();
    c.create_group(PROBE_GROUP).unwrap();
    c.join(GROUP, READER, JoinStart::Earliest).unwrap();
    let ballast = fs.fill_leaving(1 << 20);
    let answered = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (addr, answered, stop) = (node.addr.clone(), answered.clone(), stop.clone());
        std::thread::spawn(move || send_until_gone(addr, answered, stop))
    };
    probe_until_refused(&node.addr, Duration::from_secs(120));
    HeldNode {
        node,
        ballast,
        answered,
        stop,
        sender,
    }
}

/// While the disk stays full the held round is retried every 200 ms; the
/// warning is logged once (then once a minute), and the resume is logged.
#[test]
fn a_full_disk_warns_once_while_it_lasts_and_logs_when_writes_resume() {
    let Some(fs) = SmallFs::mount(24 << 20) else {
        return;
    };
    let mut held = hold_a_round(&fs);
    held.node
        .wait_for_line("no space left on device", Duration::from_secs(60));
    // Retries go on meanwhile (five a second); none of them is logged.
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::remove_file(&held.ballast).expect("remove the ballast");
    held.node
        .wait_for_line("writes resumed after", Duration::from_secs(30));
    let full_lines = held
        .node
        .seen
        .iter()
        .filter(|l| l.contains("no space left on device"))
        .count();
    assert_eq!(full_lines, 1, "{}", held.node.seen.join("\n"));
    held.stop.store(true, Ordering::SeqCst);
    held.sender.join().expect("sender thread");
}

/// A graceful shutdown waits for held work, and a full disk holds it until
/// space returns; a second signal must stop the node at once, with a
/// non-zero status and a note of what that leaves behind, and nothing
/// answered may be lost by it.
#[test]
fn a_second_signal_stops_a_shutdown_held_by_a_full_disk_at_once() {
    let Some(fs) = SmallFs::mount(24 << 20) else {
        return;
    };
    let mut held = hold_a_round(&fs);
    held.node.signal(libc::SIGINT);
    // The first signal was taken: the node is shutting down, and waits.
    held.node
        .wait_for_line("shutting down", Duration::from_secs(60));
    held.node.signal(libc::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = held.node.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the node ignored the second signal"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    held.node.seen.extend(held.node.lines.iter());
    let log = held.node.seen.join("\n");
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{log}");
    assert!(
        log.contains("signal 2 again: stopping now, without a clean shutdown: every answered send was fsynced before its answer and is kept"),
        "{log}"
    );
    held.sender.join().expect("sender thread");

    // What it said holds: with space back, every answered send is there.
    std::fs::remove_file(&held.ballast).expect("remove the ballast");
    let node = Node::start(&fs.root.join("data"), &["--disk-free-min-bytes", "0"]);
    check_every_answered_send(&node, &held.answered.lock().unwrap());
}
