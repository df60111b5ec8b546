//! Starts the real `tidemark` binary on an ephemeral port with a temp data
//! directory, and stops it (SIGKILL or SIGTERM) when asked or dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientConfig};

/// Reads the first line a just-started `tidemark serve` prints on its piped
/// standard output and returns the address it names.
pub fn listening_addr(child: &mut Child) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read the listening line");
    line.trim()
        .strip_prefix("tidemark listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string()
}

/// Builds the binary once per test run (cargo test does not build other
/// packages' binaries) and returns its path, next to this test binary.
pub fn tidemark_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test binary path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps");
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => "dev".to_string(),
            Some(other) => other.to_string(),
            None => "dev".to_string(),
        };
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "-q",
                "-p",
                "tidemark-server",
                "--bin",
                "tidemark",
                "--profile",
                &profile,
            ])
            .status()
            .expect("run cargo build");
        assert!(status.success(), "building the tidemark binary failed");
        profile_dir.join("tidemark")
    })
}

pub struct Node {
    pub child: Child,
    pub addr: String,
    pub dir: PathBuf,
    args: Vec<String>,
}

impl Node {
    /// Starts a node on `dir` with extra `serve` flags.
    pub fn start(dir: &Path, extra: &[&str]) -> Node {
        let args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        Node::start_with(dir, args)
    }

    fn start_with(dir: &Path, args: Vec<String>) -> Node {
        let mut child = Command::new(tidemark_bin())
            .arg("serve")
            .arg("--data")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(&args)
            .env(
                "RUST_LOG",
                std::env::var("TIDEMARK_NODE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn tidemark");
        let addr = listening_addr(&mut child);
        Node {
            child,
            addr,
            dir: dir.to_owned(),
            args,
        }
    }

    /// Starts a node on `dir`, or returns what it wrote to standard error
    /// when it exits without listening (a directory it refuses).
    pub fn try_start(dir: &Path, extra: &[&str]) -> Result<Node, String> {
        use std::io::Read;
        let mut child = Command::new(tidemark_bin())
            .arg("serve")
            .arg("--data")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tidemark");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped stdout");
        let _ = BufReader::new(stdout).read_line(&mut line);
        let mut stderr = child.stderr.take().expect("piped stderr");
        match line.trim().strip_prefix("tidemark listening on ") {
            Some(addr) => {
                // Drained, so a node that logs much never blocks on the pipe.
                std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
                Ok(Node {
                    child,
                    addr: addr.to_string(),
                    dir: dir.to_owned(),
                    args: extra.iter().map(|s| s.to_string()).collect(),
                })
            }
            None => {
                let _ = child.wait();
                let mut err = String::new();
                let _ = stderr.read_to_string(&mut err);
                Err(err)
            }
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(&ClientConfig::new(self.addr.clone())).expect("connect")
    }

    pub fn config(&self) -> ClientConfig {
        ClientConfig::new(self.addr.clone())
    }

    /// SIGKILL: the node dies between any two instructions.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends `sig` (SIGSTOP, SIGCONT, SIGHUP) to the node's process.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid (not yet reaped: `self`
        // holds it).
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// SIGTERM and wait for the exit status (graceful shutdown).
    pub fn terminate(&mut self) -> ExitStatus {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        wait_timeout(&mut self.child, Duration::from_secs(20))
            .expect("node did not exit after SIGTERM")
    }

    /// Kills the node and starts it again on the same directory and flags.
    pub fn restart_after_kill(mut self) -> Node {
        self.kill();
        let (dir, args) = (self.dir.clone(), std::mem::take(&mut self.args));
        Node::start_with(&dir, args)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Ok(Some(s)) = child.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// `tidemark ctl dump --json --group GROUP` of a replica set member's
/// engine (`member_dir/engine`, the node stopped), with the member's
/// directory replaced by `DIR` so that replicas' dumps compare equal.
pub fn replica_dump(member_dir: &Path, group: u64, what: &str) -> String {
    let out = Command::new(tidemark_bin())
        .args([
            "ctl",
            "dump",
            "--json",
            "--group",
            &group.to_string(),
            "--data",
        ])
        .arg(member_dir.join("engine"))
        .output()
        .expect("run ctl dump");
    assert!(out.status.success(), "ctl dump of {what}: {out:?}");
    String::from_utf8(out.stdout)
        .expect("JSON is UTF-8")
        .replace(&*member_dir.to_string_lossy(), "DIR")
}

/// Every file under `dir` with its bytes, by relative path.
pub fn file_tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let path = e.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).expect("under dir").to_path_buf();
                out.insert(rel, std::fs::read(&path).expect("read"));
            }
        }
    }
    out
}

/// The replica set secret of every set these tests start (cluster.md
/// section 7.1): one set's members must share it; sets of different
/// tests never meet (their ports differ).
pub const CLUSTER_SECRET: &str = "tidemark tests' cluster secret";

/// `--cluster-token-file FILE` for a member whose data directory is
/// `dir`: the file, beside the directory, holds [`CLUSTER_SECRET`] and
/// only its owner may read it.
pub fn cluster_token_args(dir: &Path) -> [String; 2] {
    use std::os::unix::fs::PermissionsExt;
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".cluster-token");
    let path = dir.with_file_name(name);
    std::fs::write(&path, format!("{CLUSTER_SECRET}\n")).expect("write the cluster token file");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .expect("chmod the cluster token file");
    [
        "--cluster-token-file".into(),
        path.to_string_lossy().into_owned(),
    ]
}

/// A replica set member's `tidemark serve` process, its log (stderr, info
/// level) appended to a file; killed when dropped. Its command line gets
/// [`cluster_token_args`] unless it names its own secret (or
/// `--cluster-insecure`).
pub struct ReplicaMember {
    id: u64,
    child: Option<Child>,
    pub dir: PathBuf,
    log: PathBuf,
    args: Vec<String>,
    /// A command the binary runs under (`ip netns exec NS`), or empty.
    prefix: Vec<String>,
}

impl ReplicaMember {
    /// Node `id` run with the command line `args`, its data in `dir`, its
    /// log appended to `log`.
    pub fn start(id: u64, dir: PathBuf, log: PathBuf, args: Vec<String>) -> ReplicaMember {
        ReplicaMember::start_under(Vec::new(), id, dir, log, args)
    }

    /// Like [`ReplicaMember::start`], the binary run by the command
    /// `prefix` (`["ip", "netns", "exec", NS]`), which must exec it in
    /// place: the child's pid is the node's, for signals.
    pub fn start_under(
        prefix: Vec<String>,
        id: u64,
        dir: PathBuf,
        log: PathBuf,
        mut args: Vec<String>,
    ) -> ReplicaMember {
        let own = ["--cluster-token-file", "--cluster-insecure", "--config"];
        if !args.iter().any(|a| own.contains(&a.as_str())) {
            args.extend(cluster_token_args(&dir));
        }
        let mut m = ReplicaMember {
            id,
            child: None,
            log,
            dir,
            args,
            prefix,
        };
        m.spawn();
        m
    }

    /// Starts the process; its log (stderr, info level) appends to `log`.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the node's log");
        let mut command = match self.prefix.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(tidemark_bin());
                c
            }
            None => Command::new(tidemark_bin()),
        };
        let mut child = command
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("spawn tidemark");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        if !line.starts_with("tidemark listening on ") {
            // Not left running; the log says why it did not start.
            let _ = child.kill();
            let _ = child.wait();
            let log = self.log_text();
            let tail: Vec<&str> = log.lines().rev().take(6).collect();
            panic!(
                "node {} did not start ({line:?}); its log ends:\n{}",
                self.id,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        self.child = Some(child);
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends `sig` (SIGSTOP, SIGCONT, SIGTERM) to the running process, if any.
    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            // SAFETY: kill(2) on our own child's pid (not yet reaped).
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// The exit status if the process was started and has ended since, by
    /// itself or on a signal (reaped; a later [`ReplicaMember::spawn`]
    /// starts it again). A restart in place keeps the process (same pid),
    /// so it is not an end.
    pub fn ended(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().expect("try_wait")?;
        self.child = None;
        Some(status)
    }

    /// SIGTERM; the exit status must be success.
    pub fn terminate(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = c.try_wait().expect("wait") {
                assert!(status.success(), "node {} exited with {status}", self.id);
                return;
            }
            assert!(Instant::now() < deadline, "node {} did not stop", self.id);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ReplicaMember {
    fn drop(&mut self) {
        self.kill();
    }
}
