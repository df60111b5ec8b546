//! `--spawn`: a node started as a child process on a fresh data directory,
//! stopped (SIGTERM, then SIGKILL once it stops making progress) and its
//! directory removed when dropped (kept with `--keep-data`).
//! The population workload also stops it cleanly, kills it, restarts the
//! same binary on the same directory, and reads its memory (`/proc`) and
//! its directory's size. A workload may pass the node extra `serve` flags
//! (the population workload's `--idle-evict-ms`), checked first against
//! what the binary's `serve --help` lists so older builds still run.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::conn::Conn;
use tidemark_protocol::{Request, Response};

/// How long a node stopping after SIGTERM may go without any progress (no
/// CPU time used, no byte read or written) before it is killed. A clean
/// stop first finishes a background load and then checkpoints, which at
/// ten million groups takes minutes; a fixed wait of 20 s killed such
/// nodes mid-checkpoint and left crash directories behind.
const STOP_STALL: Duration = Duration::from_secs(20);
/// How long a clean stop that is measured may take (its final checkpoint
/// grows with the population on 0.1) before it counts as failed; also the
/// ceiling of the wait for a node stopped when dropped, however busy.
const CLEAN_STOP_WAIT: Duration = Duration::from_secs(1800);
/// How long a restart may take to answer its first request.
const RESTART_WAIT: Duration = Duration::from_secs(3600);

pub struct SpawnedNode {
    child: Child,
    pub addr: String,
    dir: PathBuf,
    bin: PathBuf,
    fsync: String,
    /// Extra `serve` flags, given again on every restart.
    extra: Vec<String>,
    /// Leave the data directory when dropped (`--keep-data`).
    keep: bool,
}

/// What `du` and `find | wc -l` would say of a directory tree.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiskUsage {
    /// Bytes allocated (`st_blocks × 512`), directories included.
    pub bytes: u64,
    /// Files and directories below the root (the root not counted).
    pub inodes: u64,
}

/// The node's resident memory (`/proc/<pid>/statm` and `status`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory {
    /// Resident set: heap and every mapped page in memory.
    pub rss_bytes: u64,
    /// Anonymous resident memory only (`RssAnon`): the heap and thread
    /// stacks, without the pages of mapped segment files.
    pub anon_bytes: u64,
}

impl SpawnedNode {
    /// Starts `bin serve --listen 127.0.0.1:0 --data <fresh dir> --fsync
    /// <policy>` plus `extra`, and waits for its `tidemark listening on
    /// ADDR` line.
    pub fn start(
        bin: &Path,
        parent: &Path,
        label: &str,
        fsync: &str,
        extra: Vec<String>,
        keep: bool,
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
        let (child, addr) = launch(bin, &dir, fsync, &extra)?;
        Ok(SpawnedNode {
            child,
            addr,
            dir,
            bin: bin.to_path_buf(),
            fsync: fsync.to_string(),
            extra,
            keep,
        })
    }

    /// Whether the node was started with `flag` among its extra flags.
    pub fn has_flag(&self, flag: &str) -> bool {
        self.extra.iter().any(|f| f == flag)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
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

    /// Allocated bytes and inodes of the data directory tree.
    pub fn disk_usage(&self) -> Result<DiskUsage, String> {
        use std::os::unix::fs::MetadataExt;
        let mut total = DiskUsage::default();
        let mut stack = vec![self.dir.clone()];
        while let Some(d) = stack.pop() {
            let rd = std::fs::read_dir(&d).map_err(|e| format!("read {}: {e}", d.display()))?;
            for e in rd {
                let e = e.map_err(|e| format!("read {}: {e}", d.display()))?;
                // A file the node removes meanwhile (a checkpoint deleting an
                // old journal) is simply not counted.
                let Ok(m) = e.path().symlink_metadata() else {
                    continue;
                };
                total.bytes += m.blocks() * 512;
                total.inodes += 1;
                if m.is_dir() {
                    stack.push(e.path());
                }
            }
        }
        if let Ok(m) = self.dir.symlink_metadata() {
            total.bytes += m.blocks() * 512;
        }
        Ok(total)
    }

    /// The node's resident memory now.
    pub fn memory(&self) -> Result<Memory, String> {
        let pid = self.pid();
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm"))
            .map_err(|e| format!("read /proc/{pid}/statm: {e}"))?;
        let resident_pages: u64 = statm
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/statm: no resident field in {statm:?}"))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = u64::try_from(page).unwrap_or(4096);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_err(|e| format!("read /proc/{pid}/status: {e}"))?;
        let anon_kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/status: no RssAnon line"))?;
        Ok(Memory {
            rss_bytes: resident_pages * page,
            anon_bytes: anon_kb * 1024,
        })
    }

    /// Stops the node with SIGTERM and waits for it to exit (a clean
    /// shutdown, with its final checkpoint); returns how long that took.
    pub fn stop_clean(&mut self) -> Result<Duration, String> {
        let start = Instant::now();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(start.elapsed()),
                Ok(Some(status)) => {
                    return Err(format!("the node exited with {status} on SIGTERM"))
                }
                Ok(None) if start.elapsed() < CLEAN_STOP_WAIT => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    return Err(format!(
                        "the node did not stop within {} s of SIGTERM",
                        CLEAN_STOP_WAIT.as_secs()
                    ))
                }
                Err(e) => return Err(format!("wait for the node: {e}")),
            }
        }
    }

    /// Waits for the node to exit after [`kill_now`] was sent.
    pub fn reap(&mut self) -> Result<(), String> {
        self.child
            .wait()
            .map(|_| ())
            .map_err(|e| format!("wait for the node: {e}"))
    }

    /// Starts the same binary again on the same data directory (the node
    /// must have exited) and waits until it answers a PING; returns the
    /// time from the start of the process to that answer.
    pub fn restart(&mut self, token: Option<&[u8]>) -> Result<Duration, String> {
        let start = Instant::now();
        let (child, addr) = launch(&self.bin, &self.dir, &self.fsync, &self.extra)?;
        self.child = child;
        self.addr = addr;
        let mut last = String::new();
        while start.elapsed() < RESTART_WAIT {
            let answered =
                Conn::connect(&self.addr, token, Duration::from_secs(60)).and_then(|mut c| {
                    let mut pong = false;
                    c.call(&Request::Ping, &mut |r| pong = matches!(r, Response::Pong))?;
                    Ok(pong)
                });
            match answered {
                Ok(true) => return Ok(start.elapsed()),
                Ok(false) => last = "PING not answered with PONG".into(),
                Err(e) => last = e,
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the restarted node exited with {status} ({last})"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Err(format!(
            "the restarted node did not answer within {} s ({last})",
            RESTART_WAIT.as_secs()
        ))
    }
}

/// Whether `bin serve --help` lists `flag` (e.g. `--idle-evict-ms`): a
/// flag the node does not know would make it refuse to start.
pub fn serve_has_flag(bin: &Path, flag: &str) -> Result<bool, String> {
    let out = Command::new(bin)
        .args(["serve", "--help"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("run {} serve --help: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "{} serve --help exited with {}",
            bin.display(),
            out.status
        ));
    }
    let help = String::from_utf8_lossy(&out.stdout);
    Ok(help
        .split(|c: char| c.is_whitespace() || c == ',')
        .any(|word| word == flag))
}

/// Sends SIGKILL to process `pid` (a node this tool spawned).
pub fn kill_now(pid: u32) {
    // SAFETY: kill(2) on a child of ours that has not been reaped yet, so
    // the pid cannot have been reused.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

/// Starts `bin serve` on `dir` and reads its `tidemark listening on ADDR`
/// line (printed once it accepts connections).
fn launch(
    bin: &Path,
    dir: &Path,
    fsync: &str,
    extra: &[String],
) -> Result<(Child, String), String> {
    let mut child = Command::new(bin)
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--fsync", fsync])
        .args(extra)
        .arg("--data")
        .arg(dir)
        .env(
            "RUST_LOG",
            std::env::var("TIDEMARK_NODE_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("start {}: {e}", bin.display()))?;
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        return Err("the node's stdout is not piped".into());
    };
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    let addr = reader
        .read_line(&mut line)
        .map_err(|e| format!("read the node's first line: {e}"))
        .and_then(|_| {
            line.trim()
                .strip_prefix("tidemark listening on ")
                .map(str::to_string)
                .ok_or_else(|| format!("the node did not start (first line {line:?})"))
        });
    let addr = match addr {
        Ok(a) => a,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
    };
    // Keep reading so that a later line can never block the node.
    std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = reader.read_to_end(&mut sink);
    });
    Ok((child, addr))
}

impl Drop for SpawnedNode {
    fn drop(&mut self) {
        // An exited child was reaped by `try_wait`: its pid may belong to
        // another process by now, so it gets no signal.
        if !matches!(self.child.try_wait(), Ok(Some(_))) {
            // SAFETY: kill(2) on our own child's pid, not yet reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        if !wait_while_progressing(&mut self.child, STOP_STALL, CLEAN_STOP_WAIT) {
            eprintln!("tidemark bench: the node did not stop after SIGTERM; killed it");
        }
        if self.keep {
            eprintln!(
                "tidemark bench: data directory kept: {}",
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// What a process has done so far: its CPU time in clock ticks (`utime` +
/// `stime` of `/proc/<pid>/stat`) and the bytes it read and wrote
/// (`rchar` + `wchar` of `/proc/<pid>/io`, 0 where that file cannot be
/// read). Either grows while the process works. `None` once the process
/// is gone.
fn progress_of(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the
    // fields counted from the state (field 3) follow its last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    // utime and stime are fields 14 and 15, so the 12th and 13th here.
    let cpu = tick(11)? + tick(12)?;
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .map(|text| {
            text.lines()
                .filter_map(|l| {
                    l.strip_prefix("rchar:")
                        .or_else(|| l.strip_prefix("wchar:"))
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Some((cpu, io))
}

/// Waits for `child`, already asked to stop, to exit: as long as it keeps
/// making progress ([`progress_of`]) and at most `ceiling`; kills it once
/// it made none for `stall`, or at the ceiling. True if it exited by
/// itself.
fn wait_while_progressing(child: &mut Child, stall: Duration, ceiling: Duration) -> bool {
    let start = Instant::now();
    let mut last = progress_of(child.id());
    let mut last_change = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) => {}
            Err(_) => break,
        }
        let now = progress_of(child.id());
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        if last_change.elapsed() >= stall || start.elapsed() >= ceiling {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that ignores SIGTERM and runs `script` (bash).
    fn stubborn(script: &str) -> Child {
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(format!("trap '' TERM; {script}"))
            .spawn()
            .unwrap();
        // Let bash set its trap before the signal comes.
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: kill(2) on our own child's pid, not yet reaped.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        assert!(matches!(child.try_wait(), Ok(None)), "ignores SIGTERM");
        child
    }

    #[test]
    fn a_stopping_process_that_works_is_waited_for_past_the_stall_time() {
        // Busy for 4 s, twice the stall time: a fixed wait kills it.
        let mut child = stubborn("while [ $SECONDS -lt 4 ]; do :; done");
        let start = Instant::now();
        assert!(
            wait_while_progressing(&mut child, Duration::from_secs(2), Duration::from_secs(60)),
            "killed while it was working, after {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn a_stopping_process_that_does_nothing_is_killed_after_the_stall_time() {
        let mut child = stubborn("exec sleep 60");
        let start = Instant::now();
        assert!(!wait_while_progressing(
            &mut child,
            Duration::from_secs(1),
            Duration::from_secs(60)
        ));
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn the_ceiling_ends_the_wait_for_a_process_that_keeps_working() {
        let mut child = stubborn("while :; do :; done");
        assert!(!wait_while_progressing(
            &mut child,
            Duration::from_secs(5),
            Duration::from_secs(1)
        ));
    }
}
