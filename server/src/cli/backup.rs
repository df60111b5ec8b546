//! `tidemark backup --addr ADDR DIR`: a consistent copy of a running node
//! (format-spec/storage.md section 18) written into a new directory `DIR`,
//! from the node's BACKUP stream (format-spec/protocol.md, BACKUP).
//!
//! The copy is a data directory: `tidemark serve --data DIR` restores it.
//! Once every file arrived, the command opens the copy with the engine
//! (recovery replays the copied journal prefix) and closes it cleanly, so
//! that the copy is a clean shutdown's directory like a stopped node's:
//! the offline tools (`ctl verify`, `ctl repair`) take it as it is. There
//! is no separate restore command: what it could check, that open checks.
//!
//! Checks: `DIR` must not exist or be empty; every file name is a relative
//! path of at most four plain components (no `..`, no absolute path), each
//! file arrives once, its chunks in order and whole (offsets contiguous up
//! to its length), each chunk's CRC matched (the codec checks it), and the
//! end's file and byte counts match what arrived. Each file is fdatasynced
//! when complete, every directory made and `DIR`'s parent fsynced at the
//! end. On any failure `DIR` is removed (it was made or empty), so a
//! partial copy is never left to be served.
//!
//! Progress: the copy reports bytes and files written ([`Copied`]) after
//! every chunk; `cli/progress.rs` draws them on a terminal's standard
//! error. The node says how many bytes the snapshot holds only in its last
//! frame (protocol.md section 4.23), so the line shows what was copied and
//! how fast, without a total.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use tidemark_client::protocol::BackupChunk;
use tidemark_client::{Client, ClientConfig, ClientError};

use super::progress::{Copied, Progress};
use super::{emit, read_token_file, CliError, ConnArgs};

#[derive(Args, Debug)]
pub struct BackupArgs {
    #[command(flatten)]
    conn: ConnArgs,
    /// Directory to write the copy into: must not exist, or be empty.
    dir: PathBuf,
}

impl BackupArgs {
    pub fn json(&self) -> bool {
        self.conn.json
    }
}

/// The file being written.
struct Current {
    name: String,
    file: File,
    len: u64,
    at: u64,
}

/// What arrived so far.
struct Writer<'p> {
    root: PathBuf,
    current: Option<Current>,
    seen: BTreeSet<String>,
    dirs: BTreeSet<PathBuf>,
    /// Complete files and their bytes (what the end's counts must match).
    files: u32,
    bytes: u64,
    /// Bytes written, the current file's included.
    written: u64,
    progress: &'p mut dyn FnMut(&Copied<'_>),
}

/// A name the node may send: 1 to 4 components of `[A-Za-z0-9._-]`, none
/// `.` or `..`, joined by `/`.
fn valid_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('/').collect();
    (1..=4).contains(&parts.len())
        && parts.iter().all(|p| {
            !p.is_empty()
                && *p != "."
                && *p != ".."
                && p.len() <= 64
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
        })
}

fn bad(message: String) -> ClientError {
    ClientError::Protocol(message)
}

impl<'p> Writer<'p> {
    fn new(root: &Path, progress: &'p mut dyn FnMut(&Copied<'_>)) -> Writer<'p> {
        Writer {
            root: root.to_owned(),
            current: None,
            seen: BTreeSet::new(),
            dirs: BTreeSet::new(),
            files: 0,
            bytes: 0,
            written: 0,
            progress,
        }
    }

    fn report(&mut self, file: &str) {
        (self.progress)(&Copied {
            files: self.files,
            bytes: self.written,
            file,
        });
    }

    fn finish_current(&mut self) -> Result<(), ClientError> {
        if let Some(c) = self.current.take() {
            if c.at != c.len {
                return Err(bad(format!(
                    "{} ended at byte {} of {}",
                    c.name, c.at, c.len
                )));
            }
            c.file.sync_data()?;
            self.files += 1;
            self.bytes += c.len;
            self.report(&c.name);
        }
        Ok(())
    }

    fn chunk(&mut self, c: &BackupChunk<'_>) -> Result<(), ClientError> {
        if self.current.as_ref().is_none_or(|cur| cur.name != c.name) {
            self.finish_current()?;
            if !valid_name(c.name) {
                return Err(bad(format!("refused file name {:?}", c.name)));
            }
            if !self.seen.insert(c.name.to_string()) {
                return Err(bad(format!("{} sent twice", c.name)));
            }
            let path = self.root.join(c.name);
            if let Some(parent) = path.parent() {
                if !self.dirs.contains(parent) {
                    std::fs::create_dir_all(parent)?;
                    let mut p = parent;
                    while p != self.root && self.dirs.insert(p.to_owned()) {
                        p = p.parent().unwrap_or(&self.root);
                    }
                }
            }
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)?;
            self.current = Some(Current {
                name: c.name.to_string(),
                file,
                len: c.file_len,
                at: 0,
            });
        }
        let cur = self.current.as_mut().ok_or_else(|| bad("no file".into()))?;
        if c.offset != cur.at || c.file_len != cur.len {
            return Err(bad(format!(
                "{}: chunk at {} of {} bytes, expected {} of {}",
                c.name, c.offset, c.file_len, cur.at, cur.len
            )));
        }
        cur.file.write_all(c.data)?;
        cur.at += c.data.len() as u64;
        self.written += c.data.len() as u64;
        self.report(c.name);
        Ok(())
    }

    /// Every directory made, then the root and its parent, fsynced.
    fn sync_dirs(&self) -> std::io::Result<()> {
        for d in self.dirs.iter().rev() {
            File::open(d)?.sync_all()?;
        }
        File::open(&self.root)?.sync_all()?;
        let parent = match self.root.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        File::open(parent)?.sync_all()
    }
}

pub fn run(a: BackupArgs) -> Result<(), CliError> {
    let dir = &a.dir;
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(CliError::new(
                    "usage",
                    format!(
                        "{} is not empty: a backup goes into a new directory",
                        dir.display()
                    ),
                ));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(CliError::new("output", format!("{}: {e}", dir.display()))),
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| CliError::new("output", format!("mkdir {}: {e}", dir.display())))?;
    let started = Instant::now();
    let mut progress = Progress::backup(a.conn.json);
    let result = copy(&a, dir, &mut |c| progress.copied(c));
    // The line is cleared before anything is printed.
    drop(progress);
    let (end, (files, bytes)) = match result.and_then(|x| settle(dir).map(|()| x)) {
        Ok(x) => x,
        Err(e) => {
            // Never leave a partial copy that could be served.
            let _ = std::fs::remove_dir_all(dir);
            return Err(e);
        }
    };
    let took = started.elapsed();
    let mib_s = bytes as f64 / (1 << 20) as f64 / took.as_secs_f64().max(1e-9);
    emit(
        a.conn.json,
        format!(
            "backup of {addr} in {dir}: {files} files, {bytes} bytes in {secs:.2} s ({mib_s:.1} MiB/s)\n\
             checkpoint {ckpt}, journal up to file {jseq} byte {jlen}; writes held for {pause} us\n\
             the copy was opened once and closed cleanly: ctl verify and ctl repair take it as is\n\
             restore: tidemark serve --data {dir}\n",
            addr = a.conn.addr,
            dir = dir.display(),
            files = files,
            bytes = bytes,
            secs = took.as_secs_f64(),
            ckpt = end.checkpoint_seq,
            jseq = end.journal_seq,
            jlen = end.journal_len,
            pause = end.pause_us,
        ),
        json!({
            "addr": a.conn.addr,
            "dir": dir.display().to_string(),
            "files": files,
            "bytes": bytes,
            "elapsed_ms": took.as_millis() as u64,
            "checkpoint_seq": end.checkpoint_seq,
            "journal_seq": end.journal_seq,
            "journal_len": end.journal_len,
            "pause_us": end.pause_us,
            "clean_shutdown": true,
        }),
    )
}

/// Opens the copy once and closes it cleanly: recovery replays the
/// copied journal prefix (storage.md section 18), then the engine's clean
/// shutdown stores a checkpoint with nothing after it. The copy is then a
/// clean shutdown's directory, as a stopped node leaves one: `ctl verify`
/// and `ctl repair` take it as it is, and a restore opens it without a
/// replay. Costs one recovery of the copy (its journal prefix is at most
/// about `checkpoint_journal_bytes`). A copy that does not open is not a
/// backup: the caller removes it.
fn settle(dir: &Path) -> Result<(), CliError> {
    let fail = |e: tidemark_engine::Error| {
        CliError::new(
            "backup",
            format!("the copy in {} does not open: {e}", dir.display()),
        )
    };
    let engine = tidemark_engine::Engine::open(tidemark_engine::Config::new(dir)).map_err(fail)?;
    engine.close().map_err(fail)
}

/// The node's end of the stream and the copy's counts `(files, bytes)`.
type CopyDone = (tidemark_client::protocol::BackupEnd, (u32, u64));

fn copy(
    a: &BackupArgs,
    dir: &Path,
    progress: &mut dyn FnMut(&Copied<'_>),
) -> Result<CopyDone, CliError> {
    let mut config = ClientConfig::new(a.conn.addr.clone());
    config.client_name = "tidemark-backup".into();
    if let Some(path) = &a.conn.token_file {
        config.token = Some(read_token_file(path).map_err(|m| CliError::new("token_file", m))?);
    }
    config.io_timeout = Duration::from_millis(a.conn.timeout_ms.clamp(1000, 60_000));
    let fail = |e: ClientError| match e {
        ClientError::Server { code, message, .. } => {
            CliError::new(code.name(), format!("{}: {message}", a.conn.addr))
        }
        ClientError::Address { .. } => CliError::new("invalid_address", e.to_string()),
        ClientError::Protocol(m) => CliError::new("backup", format!("{}: {m}", a.conn.addr)),
        e => CliError::new("unavailable", format!("{}: {e}", a.conn.addr)),
    };
    let mut client = Client::connect(&config).map_err(fail)?;
    let mut w = Writer::new(dir, progress);
    let end = client.backup(|c| w.chunk(c)).map_err(fail)?;
    w.finish_current().map_err(fail)?;
    if end.files != w.files || end.bytes != w.bytes {
        return Err(CliError::new(
            "backup",
            format!(
                "the node sent {} files, {} bytes; {} files, {} bytes arrived",
                end.files, end.bytes, w.files, w.bytes
            ),
        ));
    }
    w.sync_dirs()
        .map_err(|e| CliError::new("output", format!("fsync {}: {e}", dir.display())))?;
    Ok((end, (w.files, w.bytes)))
}

#[cfg(test)]
mod tests {
    use super::{valid_name, Copied, Writer};
    use tidemark_client::protocol::BackupChunk;

    /// Chunks of three files (one empty, one in three chunks) into a
    /// writer: every report's bytes are at least the last's, and the last
    /// report counts every file and byte, as the end's counts must.
    #[test]
    fn a_copy_reports_monotone_progress_reaching_every_file_and_byte() {
        let dir = tempfile::tempdir().unwrap();
        let files: [(&str, Vec<u8>); 3] = [
            ("FORMAT", vec![1; 32]),
            ("journal/00000000000000000001.tmj", vec![2; 700]),
            ("state/empty", Vec::new()),
        ];
        let mut seen: Vec<(u32, u64, String)> = Vec::new();
        let mut progress = |c: &Copied<'_>| seen.push((c.files, c.bytes, c.file.to_owned()));
        let mut w = Writer::new(dir.path(), &mut progress);
        for (name, data) in &files {
            let pieces: Vec<&[u8]> = if data.is_empty() {
                vec![&[]]
            } else {
                data.chunks(300).collect()
            };
            let mut offset = 0;
            for piece in pieces {
                w.chunk(&BackupChunk {
                    name,
                    file_len: data.len() as u64,
                    offset,
                    // The codec checks it, not the writer.
                    crc32: 0,
                    data: piece,
                })
                .unwrap();
                offset += piece.len() as u64;
            }
        }
        w.finish_current().unwrap();
        let (files_done, bytes_done) = (w.files, w.bytes);
        drop(w);
        assert_eq!((files_done, bytes_done), (3, 732));
        assert!(
            seen.windows(2)
                .all(|p| p[0].1 <= p[1].1 && p[0].0 <= p[1].0),
            "{seen:?}"
        );
        assert!(seen
            .iter()
            .any(|p| p.1 == 332 && p.2.starts_with("journal/")));
        assert_eq!(seen.last().unwrap(), &(3, 732, "state/empty".to_owned()));
        for (name, data) in &files {
            assert_eq!(&std::fs::read(dir.path().join(name)).unwrap(), data);
        }
    }

    #[test]
    fn only_plain_relative_names_are_written() {
        for ok in [
            "FORMAT",
            "journal/00000000000000000003.tmj",
            "groups/05c/0000000000000005/00000000000000000001.seg",
        ] {
            assert!(valid_name(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/b/c/d/e",
            "a b",
            "a\\b",
            "groups/trash/x\u{0}",
        ] {
            assert!(!valid_name(bad), "{bad:?}");
        }
    }
}
