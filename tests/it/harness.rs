//! Starts the real `tidemark` binary on an ephemeral port with a temp data
//! directory, and stops it (SIGKILL or SIGTERM) when asked or dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

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
