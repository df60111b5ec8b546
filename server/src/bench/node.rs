//! `--spawn`: a node started as a child process on a fresh data directory,
//! stopped (SIGTERM, then SIGKILL) and its directory removed when dropped.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a node may take to exit after SIGTERM before it is killed.
const STOP_WAIT: Duration = Duration::from_secs(20);

pub struct SpawnedNode {
    child: Child,
    pub addr: String,
    dir: PathBuf,
}

impl SpawnedNode {
    /// Starts `bin serve --listen 127.0.0.1:0 --data <fresh dir> --fsync <policy>`
    /// and waits for its `tidemark listening on ADDR` line.
    pub fn start(
        bin: &Path,
        parent: &Path,
        label: &str,
        fsync: &str,
    ) -> Result<SpawnedNode, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = parent.join(format!(
            "tidemark-bench-{}-{label}-{nanos:09}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let child = Command::new(bin)
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--fsync", fsync])
            .arg("--data")
            .arg(&dir)
            .env(
                "RUST_LOG",
                std::env::var("TIDEMARK_NODE_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("start {}: {e}", bin.display()))?;
        let mut node = SpawnedNode {
            child,
            addr: String::new(),
            dir,
        };
        let stdout = node
            .child
            .stdout
            .take()
            .ok_or("the node's stdout is not piped")?;
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .map_err(|e| format!("read the node's first line: {e}"))?;
        node.addr = line
            .trim()
            .strip_prefix("tidemark listening on ")
            .ok_or_else(|| format!("the node did not start (first line {line:?})"))?
            .to_string();
        // Keep reading so that a later line can never block the node.
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = reader.read_to_end(&mut sink);
        });
        Ok(node)
    }

    /// Bytes under the data directory (what the workload left on disk).
    pub fn disk_bytes(&self) -> u64 {
        fn walk(p: &Path) -> u64 {
            let Ok(rd) = std::fs::read_dir(p) else {
                return 0;
            };
            rd.flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.dir)
    }
}

impl Drop for SpawnedNode {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid; a failure means it is gone.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if start.elapsed() < STOP_WAIT => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    eprintln!("tidemark bench: the node did not stop after SIGTERM; killing it");
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
