//! BACKUP (format-spec/protocol.md, BACKUP): a consistent snapshot of the
//! engine (`Engine::snapshot`, format-spec/storage.md section 18) streamed
//! to one connection as BACKUP_CHUNK frames and ended by the BACKUP
//! response (or an ERROR).
//!
//! Threads: the event loop begins the snapshot (O(1), memory only) and
//! starts a backup thread, which merges the snapshot's runs, reads its
//! files and encodes the frames; the event loop never reads a file. The
//! thread hands frames over through a channel of `CHANNEL_FRAMES` and
//! wakes the loop after each; the loop moves them to the connection's
//! output only while that holds less than `OUTPUT_QUEUED_MAX` bytes, so a
//! backup's memory is bounded (channel + output, about 2 MiB) and it goes
//! as fast as the client reads. When the connection closes, the loop drops
//! the stream's receiver: the thread's next send fails, it returns, and
//! the snapshot's drop ends its hold (the node's deletions go on).
//!
//! Invariants: the frames of one stream reach the connection in the order
//! the thread made them; after its `End` nothing more comes; at most
//! `BACKUPS_MAX` run at once (each holds the node's deletions back).

use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::Waker;
use tidemark_engine::{Engine, Snapshot};
use tidemark_protocol::{
    encode_response, BackupChunk, BackupEnd, ErrorCode, Response, BACKUP_CHUNK_FIXED_BYTES,
};

use crate::conn_id::ConnId;
use crate::outgoing::{engine_error, error, Outgoing};

/// Backups running at once; another is refused with OVERLOADED.
pub const BACKUPS_MAX: usize = 2;
/// Frames the thread may have made ahead of the connection.
const CHANNEL_FRAMES: usize = 4;
/// Data bytes per BACKUP_CHUNK (less if `frame_bytes_max` is smaller).
const CHUNK_BYTES_MAX: usize = 256 << 10;
/// The loop moves a stream's frames to its connection only below this
/// much queued output.
pub const OUTPUT_QUEUED_MAX: usize = 1 << 20;

/// A frame of a stream, whole (length prefix included).
pub enum Msg {
    Chunk(Vec<u8>),
    /// The BACKUP response, or an ERROR (with its code): the last frame.
    End {
        frame: Vec<u8>,
        error: Option<ErrorCode>,
    },
}

/// How long a backup may make no progress (its client reads nothing of
/// its queued frames) before the node ends it: a stalled backup holds
/// every deletion of the node back (storage.md section 18), so a client
/// that stops reading must not keep the disk from being given back.
pub const STALL_MAX: Duration = Duration::from_secs(60);

/// A backup under way, as the event loop holds it.
pub struct Stream {
    pub conn: ConnId,
    pub request_id: u64,
    rx: Receiver<Msg>,
    /// When the client last drained output or a frame was queued, and the
    /// connection's output then (progress is output going down).
    progress_at: Instant,
    output_then: usize,
}

/// What the loop gets from a stream now.
pub enum Next {
    Msg(Msg),
    Nothing,
    /// The thread ended without an `End` (it panicked): the stream is over.
    Gone,
}

impl Stream {
    /// Notes the connection's queued output now; true if the stream made
    /// progress within [`STALL_MAX`]: its output went down or was empty,
    /// or a frame was queued.
    pub fn alive(&mut self, output_now: usize, now: Instant) -> bool {
        // Nothing queued: the client has read everything (a slow thread,
        // reading or merging, is not the client's stall).
        if output_now == 0 || output_now < self.output_then {
            self.progress_at = now;
        }
        self.output_then = output_now;
        now.saturating_duration_since(self.progress_at) < STALL_MAX
    }

    /// A frame was queued on the connection (progress of the stream).
    pub fn queued(&mut self, output_now: usize, now: Instant) {
        self.progress_at = now;
        self.output_then = output_now;
    }

    /// When the stream counts as stalled if nothing moves before.
    pub fn deadline(&self) -> Instant {
        self.progress_at + STALL_MAX
    }

    pub fn try_next(&self) -> Next {
        match self.rx.try_recv() {
            Ok(m) => Next::Msg(m),
            Err(TryRecvError::Empty) => Next::Nothing,
            Err(TryRecvError::Disconnected) => Next::Gone,
        }
    }
}

/// The frame as an `Outgoing` of request `request_id`.
pub fn outgoing(request_id: u64, frame: Vec<u8>, error: Option<ErrorCode>) -> Outgoing {
    Outgoing {
        request_id,
        error,
        head: frame,
        chunks: Vec::new(),
        records: 0,
    }
}

/// Begins a snapshot and its thread; the ERROR to answer if either fails.
pub fn start(
    engine: &Engine,
    conn: ConnId,
    request_id: u64,
    frame_bytes_max: u32,
    waker: Arc<Waker>,
) -> Result<Stream, Outgoing> {
    let snapshot = engine
        .snapshot()
        .map_err(|e| engine_error(request_id, &e))?;
    let (tx, rx) = mpsc::sync_channel(CHANNEL_FRAMES);
    let chunk_bytes = CHUNK_BYTES_MAX.min(frame_bytes_max as usize);
    std::thread::Builder::new()
        .name("tidemark-backup".into())
        .spawn(move || run(snapshot, request_id, chunk_bytes, tx, waker))
        .map_err(|e| {
            error(
                request_id,
                ErrorCode::Internal,
                None,
                &format!("cannot start a backup thread: {e}"),
            )
        })?;
    Ok(Stream {
        conn,
        request_id,
        rx,
        progress_at: Instant::now(),
        output_then: 0,
    })
}

/// The client went away (a send failed): the stream ends silently.
struct Gone;

fn send(tx: &SyncSender<Msg>, waker: &Waker, m: Msg) -> Result<(), Gone> {
    tx.send(m).map_err(|_| Gone)?;
    // A failed wake means the loop is gone; the next send fails.
    let _ = waker.wake();
    Ok(())
}

fn run(
    snap: Snapshot,
    request_id: u64,
    chunk_bytes: usize,
    tx: SyncSender<Msg>,
    waker: Arc<Waker>,
) {
    let info = snap.info();
    log::info!(
        "backup: checkpoint {}, journal up to file {} byte {}, writes held {:?}",
        info.checkpoint_seq,
        info.journal_seq,
        info.journal_len,
        info.pause
    );
    let started = std::time::Instant::now();
    let end = match stream_files(&snap, request_id, chunk_bytes, &tx, &waker) {
        Ok(Ok((files, bytes))) => {
            log::info!(
                "backup: {files} files, {bytes} bytes in {:.1?}",
                started.elapsed()
            );
            let end = BackupEnd {
                checkpoint_seq: info.checkpoint_seq,
                journal_seq: info.journal_seq,
                journal_len: info.journal_len,
                pause_us: info.pause.as_micros() as u64,
                files,
                bytes,
            };
            let mut frame = Vec::new();
            match encode_response(request_id, &Response::Backup(end), &mut frame) {
                Ok(()) => Msg::End { frame, error: None },
                Err(e) => error_end(request_id, &e.to_string()),
            }
        }
        Ok(Err(e)) => {
            log::warn!("backup failed: {e}");
            error_end(request_id, &format!("backup failed: {e}"))
        }
        Err(Gone) => {
            log::info!("backup: the client went away");
            return;
        }
    };
    let _ = send(&tx, &waker, end);
    // `snap` is dropped here: the hold ends.
}

fn error_end(request_id: u64, message: &str) -> Msg {
    let out = error(request_id, ErrorCode::Internal, None, message);
    Msg::End {
        frame: out.head,
        error: out.error,
    }
}

/// Sends every file of `snap` in chunks; `(files, bytes)` sent.
#[allow(clippy::type_complexity)]
fn stream_files(
    snap: &Snapshot,
    request_id: u64,
    chunk_bytes: usize,
    tx: &SyncSender<Msg>,
    waker: &Waker,
) -> Result<Result<(u32, u64), String>, Gone> {
    let files = match snap.files() {
        Ok(f) => f,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let mut sent = (0u32, 0u64);
    let mut buf = Vec::new();
    for f in &files {
        let mut reader = match snap.open(f) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => return Ok(Err(e.to_string())),
        };
        // The frame must fit frame_bytes_max with the name (floor 4 KiB).
        let room = chunk_bytes.saturating_sub(BACKUP_CHUNK_FIXED_BYTES + f.name.len());
        if room == 0 {
            return Ok(Err(format!("file name {} too long for a frame", f.name)));
        }
        buf.resize(room, 0);
        let mut offset = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(n) => n,
                Err(e) => return Ok(Err(e.to_string())),
            };
            let data = &buf[..n];
            let chunk = BackupChunk {
                name: &f.name,
                file_len: f.len,
                offset,
                crc32: crc32fast::hash(data),
                data,
            };
            let mut frame = Vec::with_capacity(n + 128);
            if let Err(e) = encode_response(request_id, &Response::BackupChunk(chunk), &mut frame) {
                return Ok(Err(e.to_string()));
            }
            send(tx, waker, Msg::Chunk(frame))?;
            offset += n as u64;
            // An empty file is sent as one empty chunk.
            if offset == f.len {
                break;
            }
        }
        sent.0 += 1;
        sent.1 += f.len;
    }
    Ok(Ok(sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> (Stream, SyncSender<Msg>) {
        let (tx, rx) = mpsc::sync_channel(1);
        let s = Stream {
            conn: ConnId {
                index: 0,
                generation: 0,
            },
            request_id: 1,
            rx,
            progress_at: Instant::now(),
            output_then: 0,
        };
        (s, tx)
    }

    /// A client that leaves its output queued for `STALL_MAX` stalls the
    /// backup; one that reads (output going down or empty), or a thread
    /// that queues frames, keeps it alive.
    #[test]
    fn a_backup_stalls_only_while_its_client_reads_nothing() {
        let (mut s, _tx) = stream();
        let t0 = Instant::now();
        s.queued(900_000, t0);
        let later = t0 + STALL_MAX - Duration::from_millis(1);
        assert!(s.alive(900_000, later), "within the limit");
        assert!(
            !s.alive(900_000, t0 + STALL_MAX),
            "nothing read for STALL_MAX"
        );
        let (mut s, _tx) = stream();
        s.queued(900_000, t0);
        assert!(s.alive(500_000, t0 + STALL_MAX / 2), "the client read");
        assert!(
            s.alive(500_000, t0 + STALL_MAX),
            "counted from its last read"
        );
        assert!(!s.alive(500_000, t0 + STALL_MAX * 3 / 2));
        let (mut s, _tx) = stream();
        s.queued(0, t0);
        assert!(
            s.alive(0, t0 + STALL_MAX * 2),
            "all read: the thread is slow, not the client"
        );
        assert_eq!(s.deadline(), t0 + STALL_MAX * 3);
    }
}
