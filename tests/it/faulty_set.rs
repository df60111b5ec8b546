//! A replica set of three real `tidemark serve --cluster-*` processes whose
//! links to each other can be cut, and whose processes can be killed,
//! paused and restarted: the fixture of `cluster_faults.rs` and
//! `history_check.rs` (format-spec/cluster.md section 6.1).
//!
//! **Links.** Every ordered pair of members `(from, to)` has a [`Link`]: a
//! TCP forwarder on a loopback port of its own. Member `from` is started
//! with `--cluster-peer to=LINK_ADDR,CLIENT_ADDR`, so every Raft frame it
//! sends to `to` goes through the link (the transport only writes on the
//! connections it opens, cluster.md section 7, so the link from `from` to
//! `to` carries exactly `from`'s messages to `to`). Clients connect to the
//! members' own `--listen` addresses, never through a link: cutting links
//! isolates a member from the others and not from its clients.
//!
//! Why a proxy as well as network namespaces (`netns.rs`): it needs no
//! root, so these tests run for anyone; a member's only view of its peers
//! is TCP connections it opens or accepts, and a cut link is what a
//! partition looks like from there once TCP gives up (connections broken,
//! new ones refused, bytes in flight lost). Packets that vanish without a
//! reset (a silent drop) are what a proxy does not model; `netns.rs` drops
//! them with iptables rules, and the simulated network of
//! `tidemark-cluster` `sim_tests` loses messages.
//!
//! A cut link shuts down both sockets of every connection it carries (what
//! the pumps hold is dropped, not forwarded) and closes each new
//! connection at once until healed.
//!
//! [`SetUnderFaults`] is what a test's nemesis asks of a set: this one, or
//! `netns::NetnsSet`, whose members run in network namespaces of their own
//! and whose links are cut by packet-dropping rules. The checks after a
//! run ([`stop_and_compare`]) are written once, for both.
//!
//! Invariants: a member's data directory, client port and cluster port
//! stay the same across restarts; [`FaultySet::supervise`] restarts a
//! member whose process ended by itself, as a supervisor would, and
//! counts it (a replica that lost leadership with a round at its gate
//! restarts in place, same pid, cluster.md section 5.1: only a failed
//! write ends the process).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig, ClientError, Message};
use tidemark_protocol::ErrorCode;

use crate::harness::{file_tree, replica_dump, tidemark_bin};

pub const IDS: [u64; 3] = [1, 2, 3];
/// Longest a step may wait for a leader (an election takes 1-2 s; a
/// restarted member replays its logs first).
pub const LEADER_WAIT: Duration = Duration::from_secs(30);

/// A replica set of three members ([`IDS`]) whose processes and links a
/// test controls (module docs). A cut or a pause holds until healed or
/// resumed.
pub trait SetUnderFaults {
    /// Member `id`'s client address.
    fn addr(&self, id: u64) -> String;
    /// Every member's client address, by id.
    fn addrs(&self) -> BTreeMap<u64, String> {
        IDS.iter().map(|&id| (id, self.addr(id))).collect()
    }
    /// Member `id`'s data directory.
    fn dir(&self, id: u64) -> &Path;
    /// SIGKILL and reap.
    fn kill(&mut self, id: u64);
    /// Kills member `id` if it runs, and starts it again on the same
    /// directory and flags.
    fn restart(&mut self, id: u64);
    /// SIGSTOP: the process stops between any two instructions.
    fn pause(&self, id: u64);
    fn resume(&self, id: u64);
    /// Cuts everything between `id` and the other members, both ways;
    /// its clients still reach it.
    fn isolate(&self, id: u64);
    /// Cuts what `from` sends to `to`; what `to` sends to `from` passes.
    fn cut_one_way(&self, from: u64, to: u64);
    /// Every cut healed.
    fn heal_all(&self);
    /// Restarts every member whose process ended by itself, as a
    /// supervisor would, and counts it; returns their ids.
    fn supervise(&mut self) -> Vec<u64>;
    /// Per member (in [`IDS`] order), the times its process ended by itself.
    fn exits(&self) -> Vec<u64>;
    /// Clean stop of every member (resumed first; each must exit with
    /// success).
    fn terminate_all(&mut self);
    /// Starts every member again after [`SetUnderFaults::terminate_all`].
    fn start_all(&mut self);
}

struct LinkShared {
    cut: AtomicBool,
    /// Both sockets of every connection, to shut them at a cut.
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
    stop: AtomicBool,
    connections: AtomicU64,
}

/// A forwarder from one member to another's `--cluster-listen` (module
/// docs).
pub struct Link {
    pub addr: String,
    shared: Arc<LinkShared>,
    accept: Option<JoinHandle<()>>,
}

impl Link {
    fn start(upstream: String) -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a link");
        let addr = listener.local_addr().expect("link addr").to_string();
        listener.set_nonblocking(true).expect("nonblocking accept");
        let shared = Arc::new(LinkShared {
            cut: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            connections: AtomicU64::new(0),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::spawn(move || accept_loop(&listener, &upstream, &shared))
        };
        Link {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Cuts the link: every connection broken, bytes in flight dropped,
    /// new connections closed at once.
    pub fn cut(&self) {
        self.shared.cut.store(true, Ordering::Release);
        for (a, b) in self.shared.open.lock().expect("open").drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }

    pub fn heal(&self) {
        self.shared.cut.store(false, Ordering::Release);
    }

    /// Connections the link accepted (a member that sends through it).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Acquire)
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.cut();
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, upstream: &str, shared: &Arc<LinkShared>) {
    while !shared.stop.load(Ordering::Acquire) {
        let (down, _) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(_) => continue,
        };
        if shared.cut.load(Ordering::Acquire) {
            drop(down);
            continue;
        }
        let _ = down.set_nonblocking(false);
        let Ok(up) = TcpStream::connect(upstream) else {
            continue;
        };
        shared.connections.fetch_add(1, Ordering::AcqRel);
        let _ = down.set_nodelay(true);
        let _ = up.set_nodelay(true);
        let (Ok(d2), Ok(u2), Ok(d3), Ok(u3)) = (
            down.try_clone(),
            up.try_clone(),
            down.try_clone(),
            up.try_clone(),
        ) else {
            continue;
        };
        shared.open.lock().expect("open").push((d3, u3));
        for (from, to) in [(down, up), (u2, d2)] {
            let shared = shared.clone();
            std::thread::spawn(move || pump(from, to, &shared));
        }
    }
}

/// Copies `from` to `to` until either end closes or the link is cut;
/// a chunk read after the cut is dropped, not written.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &LinkShared) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if shared.cut.load(Ordering::Acquire) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// One member's process and settings.
pub struct Member {
    pub id: u64,
    pub child: Option<Child>,
    pub dir: PathBuf,
    pub client_port: u16,
    args: Vec<String>,
    /// Times [`FaultySet::supervise`] found the process ended by itself.
    pub exits: u64,
}

impl Member {
    fn spawn(&mut self) {
        let mut child = Command::new(tidemark_bin())
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("TIDEMARK_NODE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tidemark");
        let mut line = String::new();
        let read = BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line);
        if read.is_err() || !line.starts_with("tidemark listening on ") {
            // Not left running when the test fails.
            let _ = child.kill();
            let _ = child.wait();
            panic!("node {} did not start: {read:?} {line:?}", self.id);
        }
        self.child = Some(child);
    }

    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn signal(&self, sig: i32) {
        if let Some(pid) = self.pid() {
            // SAFETY: kill(2) on our own child's pid (not yet reaped).
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; the exit status must be success.
    fn terminate(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // A stopped process does not handle SIGTERM.
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGCONT);
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "node {} exited with {status}", self.id);
                return;
            }
            assert!(Instant::now() < deadline, "node {} did not stop", self.id);
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        self.kill();
    }
}

/// Three members, their links, and a temp directory (module docs).
pub struct FaultySet {
    pub members: BTreeMap<u64, Member>,
    /// `(from, to)` → the link carrying `from`'s Raft frames to `to`.
    pub links: HashMap<(u64, u64), Link>,
    _root: tempfile::TempDir,
}

impl FaultySet {
    /// Starts three members, each group in files of its own
    /// (`--small-group-bytes-max 0`), to compare them after a clean stop.
    pub fn start() -> FaultySet {
        let root = tempfile::tempdir().expect("temp dir");
        // Client and cluster ports: bound together, then released.
        let listeners: Vec<TcpListener> = (0..IDS.len() * 2)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let port = |i: usize| listeners[i].local_addr().expect("addr").port();
        let client: HashMap<u64, u16> = IDS
            .iter()
            .map(|&id| (id, port(2 * id as usize - 2)))
            .collect();
        let raft: HashMap<u64, u16> = IDS
            .iter()
            .map(|&id| (id, port(2 * id as usize - 1)))
            .collect();
        drop(listeners);
        let mut links = HashMap::new();
        for &from in &IDS {
            for &to in IDS.iter().filter(|&&to| to != from) {
                links.insert((from, to), Link::start(format!("127.0.0.1:{}", raft[&to])));
            }
        }
        let mut members = BTreeMap::new();
        for &id in &IDS {
            let dir = root.path().join(format!("n{id}"));
            let mut args: Vec<String> = vec![
                "serve".into(),
                "--data".into(),
                dir.to_string_lossy().into_owned(),
                "--listen".into(),
                format!("127.0.0.1:{}", client[&id]),
                "--small-group-bytes-max".into(),
                "0".into(),
                "--cluster-node-id".into(),
                id.to_string(),
                "--cluster-listen".into(),
                format!("127.0.0.1:{}", raft[&id]),
            ];
            args.extend(crate::harness::cluster_token_args(&dir));
            for &p in IDS.iter().filter(|&&p| p != id) {
                args.push("--cluster-peer".into());
                args.push(format!(
                    "{p}={},127.0.0.1:{}",
                    links[&(id, p)].addr,
                    client[&p]
                ));
            }
            let mut m = Member {
                id,
                child: None,
                dir,
                client_port: client[&id],
                args,
                exits: 0,
            };
            m.spawn();
            members.insert(id, m);
        }
        FaultySet {
            members,
            links,
            _root: root,
        }
    }

    fn member(&mut self, id: u64) -> &mut Member {
        self.members.get_mut(&id).expect("a member")
    }

    /// See [`stop_and_compare`].
    pub fn stop_and_compare(&mut self, groups: &[u64]) -> Vec<usize> {
        stop_and_compare(self, groups)
    }
}

impl SetUnderFaults for FaultySet {
    fn addr(&self, id: u64) -> String {
        format!("127.0.0.1:{}", self.members[&id].client_port)
    }

    fn dir(&self, id: u64) -> &Path {
        &self.members[&id].dir
    }

    fn isolate(&self, id: u64) {
        for (&(from, to), link) in &self.links {
            if from == id || to == id {
                link.cut();
            }
        }
    }

    /// The link `(from, to)` carries exactly `from`'s messages to `to`
    /// (module docs).
    fn cut_one_way(&self, from: u64, to: u64) {
        self.links[&(from, to)].cut();
    }

    fn heal_all(&self) {
        for link in self.links.values() {
            link.heal();
        }
    }

    fn kill(&mut self, id: u64) {
        self.member(id).kill();
    }

    fn restart(&mut self, id: u64) {
        let m = self.member(id);
        m.kill();
        m.spawn();
    }

    fn pause(&self, id: u64) {
        self.members[&id].signal(libc::SIGSTOP);
    }

    fn resume(&self, id: u64) {
        self.members[&id].signal(libc::SIGCONT);
    }

    fn supervise(&mut self) -> Vec<u64> {
        let mut restarted = Vec::new();
        for m in self.members.values_mut() {
            let ended = match m.child.as_mut() {
                Some(c) => c.try_wait().expect("try_wait").is_some(),
                None => false,
            };
            if ended {
                m.child = None;
                m.exits += 1;
                m.spawn();
                restarted.push(m.id);
            }
        }
        restarted
    }

    fn exits(&self) -> Vec<u64> {
        self.members.values().map(|m| m.exits).collect()
    }

    fn terminate_all(&mut self) {
        for m in self.members.values_mut() {
            m.terminate();
        }
    }

    fn start_all(&mut self) {
        for m in self.members.values_mut() {
            m.spawn();
        }
    }
}

/// `ctl dump --json --group G` of a stopped member's engine, its own
/// directory replaced by `DIR`.
pub fn dump(set: &impl SetUnderFaults, id: u64, group: u64) -> String {
    replica_dump(set.dir(id), group, &format!("node {id}"))
}

/// Stops every member cleanly and compares their logs: every member's
/// dump of each group the same, and its files past their 64-byte headers
/// (whose `created_ms` is each replica's clock) too. A member that
/// stopped behind (its dump a prefix of another's: it had not applied
/// everything committed yet, which a member catching up on a loaded
/// machine may need seconds for) gets more time: all are started again (a
/// new leader's first entry commits everything before it) and stopped
/// again, up to 5 times. A dump that is not a prefix of the longest fails
/// at once. Returns each group's number of records.
pub fn stop_and_compare(set: &mut impl SetUnderFaults, groups: &[u64]) -> Vec<usize> {
    for attempt in 1..=5 {
        // Followers learn the last commit index from the leader's
        // next heartbeats (every 20 ms) and apply it.
        std::thread::sleep(Duration::from_millis(1500));
        set.supervise();
        set.terminate_all();
        let mut behind = Vec::new();
        let mut counts = Vec::new();
        for &g in groups {
            let dumps: Vec<String> = IDS.iter().map(|&id| dump(set, id, g)).collect();
            let longest = dumps.iter().max_by_key(|d| d.len()).expect("three dumps");
            for (id, d) in IDS.iter().zip(&dumps) {
                if d == longest {
                    continue;
                }
                if !longest.starts_with(d.as_str()) {
                    let diff = longest.lines().zip(d.lines()).find(|(x, y)| x != y);
                    panic!(
                        "group {g}: node {id}'s records differ from the longest log: {} and {} lines, first difference {diff:?}",
                        d.lines().count(),
                        longest.lines().count()
                    );
                }
                behind.push((*id, g, d.lines().count(), longest.lines().count()));
            }
            counts.push(longest.lines().count());
        }
        if behind.is_empty() {
            assert_files_identical(set);
            return counts;
        }
        eprintln!("stop {attempt}: members stopped behind (id, group, records, of): {behind:?}; starting them all again");
        set.start_all();
        let reader = groups[0];
        on_leader(&set.addrs(), |c| match c.history(reader, 1, 0, 1) {
            Err(ClientError::Server {
                code: ErrorCode::NotMember | ErrorCode::GroupNotFound,
                ..
            }) => Ok(()),
            r => r.map(drop),
        });
    }
    panic!("the members' logs did not converge after 5 stops");
}

/// The members' group files are identical past their 64-byte headers.
fn assert_files_identical(set: &impl SetUnderFaults) {
    let files = |id: u64| file_tree(&set.dir(id).join("engine").join("groups"));
    let mine = files(IDS[0]);
    for &id in &IDS[1..] {
        let theirs = files(id);
        assert_eq!(
            theirs.keys().collect::<Vec<_>>(),
            mine.keys().collect::<Vec<_>>(),
            "node {id}'s group files"
        );
        for (path, bytes) in &mine {
            assert!(
                theirs[path].len() == bytes.len() && theirs[path][64..] == bytes[64..],
                "node {id}: {} differs",
                path.display()
            );
        }
    }
}

pub fn connect(addr: &str, timeout: Duration) -> Option<Client> {
    let mut config = ClientConfig::new(addr.to_string());
    config.io_timeout = timeout;
    Client::connect(&config).ok()
}

/// Runs `op` against whichever member serves it: follows NOT_LEADER's
/// detail, tries the next member on any other failure, until `op`
/// succeeds (idempotent requests only) or [`LEADER_WAIT`] passes.
/// Returns the answer and the member that gave it.
pub fn on_leader<T>(
    addrs: &BTreeMap<u64, String>,
    mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
) -> (T, u64) {
    let deadline = Instant::now() + LEADER_WAIT;
    let mut next = IDS[0];
    loop {
        let mut last = None;
        if let Some(mut c) = connect(&addrs[&next], Duration::from_secs(2)) {
            match op(&mut c) {
                Ok(v) => return (v, next),
                Err(ClientError::Server {
                    code: ErrorCode::NotLeader,
                    detail: Some(l),
                    ..
                }) if l != next && addrs.contains_key(&l) => {
                    next = l;
                    continue;
                }
                Err(e) => last = Some(e),
            }
        }
        assert!(
            Instant::now() < deadline,
            "no member served within {LEADER_WAIT:?}: {last:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
        next = IDS[(IDS.iter().position(|&i| i == next).unwrap_or(0) + 1) % IDS.len()];
    }
}

/// Every record of `group` (oldest first), read through the leader as
/// `reader` (a member).
pub fn read_all(addrs: &BTreeMap<u64, String>, group: u64, reader: u64) -> Vec<Message> {
    on_leader(addrs, |c| {
        let mut out = Vec::new();
        let mut before = 0;
        loop {
            let (page, more) = c.history(group, reader, before, 1000)?;
            before = page.last().map_or(0, |m| m.msg_id);
            out.extend(page);
            if !more || before <= 1 {
                break;
            }
        }
        out.reverse();
        Ok(out)
    })
    .0
}
