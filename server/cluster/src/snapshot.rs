//! Snapshots of a replica (format-spec/cluster.md section 8): the stream
//! that carries an engine snapshot from a leader to a follower, the
//! follower's staging of it, and the install that swaps it in for the
//! follower's engine, crash-safe.
//!
//! Representation: a *stream* is the 8-byte preamble `"TMSNAPS\0"` then
//! records of the Raft log's shape (`{len | crc | kind | reserved | body}`,
//! cluster.md section 8.2): Begin (who, which snapshot, how many bytes),
//! then per file a File record and its bytes in Chunk records, then End
//! (the counts and the raft-rs `MsgSnapshot` itself). The receiver's
//! [`Inbox`] takes one stream at a time, and only a snapshot newer than
//! any staged or installed; it writes the files into the stream's own
//! `snap-in/tmp-<from>-<index>-<term>-<n>/` of the replica's directory,
//! fsyncs them and their directories, and renames the whole to
//! `snap-in/<index>-<term>/` before it hands the message to Raft: Raft
//! sees a snapshot only once its files are durable. The install (the
//! driver, when raft-rs's `Ready` holds the snapshot) renames that to
//! `install-<index>-<term>/` ([`Inbox::stage`]), rewrites the Raft log to
//! start at the snapshot (the commit point, `RaftLog::reset_to_snapshot`,
//! with the commit index at the snapshot's), then, with the engine closed,
//! swaps the directories ([`finish`]): `engine` to `engine.old`,
//! `install-<index>-<term>` to `engine`, `engine.old` removed. [`recover`]
//! runs before every engine open and finishes an install the Raft log
//! committed or discards one it did not.
//!
//! Invariants: a file is written only below its stream's staging
//! directory and only under a checked relative name (no `..`, no absolute
//! path), never beyond the bytes its Begin announced nor the free space
//! above the node's disk reserve; a staging directory is removed only by
//! its own stream (or the next start), never under a writer; an install
//! directory becomes `engine` only if the Raft log starts at its
//! (index, term); `engine` is never removed before its replacement is in
//! place under `install-*` and committed.
//!
//! Costs: the sender reads each file once, in chunks of [`CHUNK_BYTES`]
//! (one buffer); the receiver writes each once and fsyncs it; memory is one
//! chunk on each side, whatever the engine's size. The install is a few
//! renames and fsyncs, plus the removal of the old engine's files.

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::Message;

use crate::error::{ClusterError, Result};
use crate::le::u64_at;
use crate::raft_log::{encode_record, sync_dir, RECORD_HEADER_BYTES};

/// The stream's first 8 bytes. Read as a frame's `len` (cluster.md section
/// 7), `"TMSN"` is 0x4e534d54, above any `frame_bytes_max`: a node that
/// does not know snapshots closes the connection.
pub const PREAMBLE: [u8; 8] = *b"TMSNAPS\0";
/// Stream record kinds.
pub const KIND_BEGIN: u8 = 1;
pub const KIND_FILE: u8 = 2;
pub const KIND_CHUNK: u8 = 3;
pub const KIND_END: u8 = 4;
/// Bytes of a Begin body: with the total of the file bytes that follow.
pub const BEGIN_BYTES: usize = 48;
/// Bytes of an older leader's Begin body, without the total (still
/// taken: its files are bounded by the free space alone).
pub const BEGIN_V1_BYTES: usize = 40;
/// Bytes of a File body before the name.
pub const FILE_FIXED_BYTES: usize = 16;
/// Bytes of an End body before the message.
pub const END_FIXED_BYTES: usize = 16;
/// The data of one Chunk record, at most.
pub const CHUNK_BYTES: usize = 1 << 20;
/// A record's bytes, at most: a chunk's, or an End's message (a
/// `MsgSnapshot` carries no entries).
pub const RECORD_BYTES_MAX: usize = CHUNK_BYTES + RECORD_HEADER_BYTES;
/// Bytes of the snapshot descriptor (raft-rs `Snapshot.data`).
pub const DESCRIPTOR_BYTES: usize = 16;
/// The descriptor's version without a membership.
pub const DESCRIPTOR_VERSION: u32 = 1;
/// The descriptor's version with the membership after its 16 bytes
/// (cluster.md section 11.3).
pub const DESCRIPTOR_VERSION_MEMBERS: u32 = 2;

/// Where received snapshots are staged, in the replica's directory.
pub const INBOX_DIR: &str = "snap-in";
/// The engine's directory, and its predecessor during a swap.
pub const ENGINE_DIR: &str = "engine";
pub const OLD_ENGINE_DIR: &str = "engine.old";

/// The snapshot's own part of a raft-rs `Snapshot` (its `data`): the
/// engine's last round in it (cluster.md section 8.1).
pub fn descriptor(last_round: u64) -> Vec<u8> {
    // Format: { version: u32 = 1 | reserved: u32 = 0 | last_round: u64 }
    let mut d = Vec::with_capacity(DESCRIPTOR_BYTES);
    d.extend_from_slice(&DESCRIPTOR_VERSION.to_le_bytes());
    d.extend_from_slice(&[0; 4]);
    d.extend_from_slice(&last_round.to_le_bytes());
    d
}

/// A version 2 descriptor: version 1's fields, then the membership at the
/// snapshot's index (a Members record's body, cluster.md section 11.3), so
/// that a node added to the set learns every member's addresses with the
/// snapshot.
pub fn descriptor_with_members(last_round: u64, members: &crate::members::Members) -> Vec<u8> {
    // Format: { version: u32 = 2 | reserved: u32 = 0 | last_round: u64 }
    //   + members body
    let mut d = descriptor(last_round);
    d[..4].copy_from_slice(&DESCRIPTOR_VERSION_MEMBERS.to_le_bytes());
    crate::members::encode_body(&mut d, members);
    d
}

/// The `last_round` of a descriptor, or why it is not one.
pub fn descriptor_last_round(d: &[u8]) -> std::result::Result<u64, String> {
    Ok(decode_descriptor(d)?.0)
}

/// The membership of a descriptor (version 2), if it has one.
pub fn descriptor_members(
    d: &[u8],
) -> std::result::Result<Option<crate::members::Members>, String> {
    Ok(decode_descriptor(d)?.1)
}

fn decode_descriptor(
    d: &[u8],
) -> std::result::Result<(u64, Option<crate::members::Members>), String> {
    let bad = || {
        format!(
            "a snapshot descriptor of {} bytes or another version",
            d.len()
        )
    };
    if d.len() < DESCRIPTOR_BYTES || d[4..8] != [0; 4] {
        return Err(bad());
    }
    let version = u32::from_le_bytes([d[0], d[1], d[2], d[3]]);
    let members = match version {
        DESCRIPTOR_VERSION if d.len() == DESCRIPTOR_BYTES => None,
        DESCRIPTOR_VERSION_MEMBERS => Some(crate::members::decode_body(&d[DESCRIPTOR_BYTES..])?),
        _ => return Err(bad()),
    };
    Ok((u64_at(d, 8), members))
}

/// Writes the stream of `snap` for `msg` (a `MsgSnapshot` whose metadata
/// names the snapshot) to `w`: the preamble, Begin, the files, End.
/// Returns the file bytes sent.
pub fn write_stream(
    w: &mut impl Write,
    msg: &Message,
    snap: &tidemark_engine::Snapshot,
) -> std::result::Result<u64, String> {
    let meta = msg.get_snapshot().get_metadata();
    let last_round = descriptor_last_round(msg.get_snapshot().get_data())?;
    let io = |e: io::Error| format!("write: {e}");
    let mut rec = Vec::with_capacity(RECORD_BYTES_MAX);
    w.write_all(&PREAMBLE).map_err(io)?;
    let files = snap.files().map_err(|e| e.to_string())?;
    // The total announced: every file listed (one a deletion drops
    // meanwhile is left out below, so the stream may carry less).
    let announced: u64 = files.iter().map(|f| f.len).sum();
    encode_begin(
        &mut rec,
        [
            msg.from, msg.to, meta.index, meta.term, last_round, announced,
        ],
    );
    w.write_all(&rec).map_err(io)?;
    let (mut count, mut bytes) = (0u32, 0u64);
    let mut buf = vec![0u8; CHUNK_BYTES];
    for f in &files {
        let Some(mut reader) = snap.open(f).map_err(|e| e.to_string())? else {
            // A segment of a group deleted meanwhile: left out, as a
            // backup leaves it (storage.md section 18).
            continue;
        };
        rec.clear();
        encode_file(&mut rec, &f.name, f.len)?;
        w.write_all(&rec).map_err(io)?;
        let mut left = f.len;
        while left > 0 {
            let n = reader.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 || n as u64 > left {
                return Err(format!("{}: read {n} bytes with {left} left", f.name));
            }
            rec.clear();
            encode_record(&mut rec, KIND_CHUNK, |b| b.extend_from_slice(&buf[..n]));
            w.write_all(&rec).map_err(io)?;
            left -= n as u64;
        }
        count += 1;
        bytes += f.len;
    }
    let message = msg.write_to_bytes().map_err(|e| e.to_string())?;
    rec.clear();
    encode_record(&mut rec, KIND_END, |b| {
        // Format: { files: u32 | reserved: u32 = 0 | bytes: u64 } + message
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&bytes.to_le_bytes());
        b.extend_from_slice(&message);
    });
    w.write_all(&rec).map_err(io)?;
    w.flush().map_err(io)?;
    Ok(bytes)
}

/// Appends a Begin record: `[from, to, index, term, last_round, bytes]`
/// (`bytes`: the total of the files' lengths that follow, at most).
pub fn encode_begin(buf: &mut Vec<u8>, fields: [u64; 6]) {
    encode_record(buf, KIND_BEGIN, |b| {
        // Format: { from: u64 | to: u64 | index: u64 | term: u64 |
        //   last_round: u64 | bytes: u64 }
        for x in fields {
            b.extend_from_slice(&x.to_le_bytes());
        }
    });
}

/// Appends a File record for `name` of `len` bytes (its Chunks follow).
pub fn encode_file(buf: &mut Vec<u8>, name: &str, len: u64) -> std::result::Result<(), String> {
    let name_len = u16::try_from(name.len()).map_err(|_| format!("file name {name} too long"))?;
    encode_record(buf, KIND_FILE, |b| {
        // Format: { len: u64 | name_len: u16 | reserved: [u8; 6] = 0 } + name
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&name_len.to_le_bytes());
        b.extend_from_slice(&[0; 6]);
        b.extend_from_slice(name.as_bytes());
    });
    Ok(())
}

/// A stream that made no progress (no record) for this long no longer
/// holds the inbox: the next offer takes its place (its reader may be
/// stuck on a connection whose peer vanished without a reset).
pub const STREAM_STALL_MAX: std::time::Duration = std::time::Duration::from_secs(30);

/// The receiving side of a replica (cluster.md section 8.2): its
/// `snap-in/` directory, the stream being received there, and the
/// snapshots staged and not installed yet. Shared by every connection's
/// reader (each stream is read on its connection's thread) and the
/// driver, which takes a staged snapshot for its install ([`Inbox::stage`]).
///
/// Invariants: at most one stream is received at a time; a stream is
/// taken only if its snapshot is newer than every one staged or
/// installed; each staging directory `tmp-*` has one writer, its stream,
/// and only that stream removes it (or the next start); a staged
/// directory `<index>-<term>` is removed only under the lock, by a newer
/// install, never while Raft may still install it. `snap-in/` itself is
/// removed only at start ([`recover`]), before any stream is read.
pub struct Inbox {
    dir: PathBuf,
    /// The node's disk reserve (the engine's `disk_free_min_bytes`): a
    /// stream whose files would leave less free is refused.
    reserve_bytes: u64,
    state: parking_lot::Mutex<InboxState>,
}

struct InboxState {
    receiving: Option<Receiving>,
    /// Received whole, handed to Raft, not installed: (index, term).
    staged: Vec<(u64, u64)>,
    /// The newest snapshot index installed (or the Raft log's start at
    /// open): nothing at or below it is taken.
    floor: u64,
    next_stream: u64,
}

/// The stream being received.
struct Receiving {
    stream: u64,
    index: u64,
    term: u64,
    /// Its last record.
    progress_at: std::time::Instant,
}

impl Inbox {
    /// The inbox of the replica directory `dir`, whose Raft log starts
    /// at `floor`.
    pub fn new(dir: &Path, floor: u64, reserve_bytes: u64) -> Inbox {
        Inbox {
            dir: dir.to_path_buf(),
            reserve_bytes,
            state: parking_lot::Mutex::new(InboxState {
                receiving: None,
                staged: Vec::new(),
                floor,
                next_stream: 0,
            }),
        }
    }

    /// The replica's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Takes the stream of the snapshot at (`index`, `term`) from `from`,
    /// if no other is being received and nothing as new is staged or
    /// installed; its private staging directory.
    fn begin(&self, from: u64, index: u64, term: u64) -> Result<(u64, PathBuf)> {
        let mut st = self.state.lock();
        if let Some(r) = &st.receiving {
            if r.progress_at.elapsed() < STREAM_STALL_MAX {
                return Err(refused(format!(
                    "the snapshot at {index} term {term}: the one at {} term {} is being \
                     received (one at a time)",
                    r.index, r.term
                )));
            }
            log::warn!(
                "the snapshot stream at {} term {} made no progress for {STREAM_STALL_MAX:?}: \
                 given up for the one at {index} term {term}",
                r.index,
                r.term
            );
            st.receiving = None;
        }
        let newest = st.staged.iter().map(|s| s.0).fold(st.floor, u64::max);
        if index <= newest {
            return Err(refused(format!(
                "the snapshot at {index} term {term}: one at {newest} is staged or installed"
            )));
        }
        let inbox = self.dir.join(INBOX_DIR);
        std::fs::create_dir_all(&inbox).map_err(|e| ClusterError::io("create snap-in", e))?;
        let stream = st.next_stream;
        st.next_stream += 1;
        st.receiving = Some(Receiving {
            stream,
            index,
            term,
            progress_at: std::time::Instant::now(),
        });
        Ok((
            stream,
            inbox.join(format!("tmp-{from}-{index}-{term}-{stream}")),
        ))
    }

    /// A record of `stream` arrived: it still holds the inbox, or is told
    /// to stop (another took its place after it stalled).
    fn progress(&self, stream: u64) -> Result<()> {
        let mut st = self.state.lock();
        match st.receiving.as_mut() {
            Some(r) if r.stream == stream => {
                r.progress_at = std::time::Instant::now();
                Ok(())
            }
            _ => Err(refused(
                "given up after it stalled: another stream took its place".into(),
            )),
        }
    }

    /// `stream` ended: its directory `tmp` (durable, whole) becomes the
    /// staged `<index>-<term>` if it still holds the inbox; else it is
    /// removed. Either way the inbox is free again.
    fn end(&self, stream: u64, tmp: &Path, received: Option<(u64, u64)>) -> Result<()> {
        let mut st = self.state.lock();
        let current = st.receiving.as_ref().is_some_and(|r| r.stream == stream);
        if current {
            st.receiving = None;
        }
        let Some((index, term)) = received.filter(|_| current) else {
            drop(st);
            // Its own directory: no other writer, nobody else removes it.
            let _ = std::fs::remove_dir_all(tmp);
            return match received {
                Some(_) => Err(refused(
                    "given up after it stalled: another stream took its place".into(),
                )),
                None => Ok(()),
            };
        };
        let inbox = self.dir.join(INBOX_DIR);
        std::fs::rename(tmp, inbox.join(format!("{index}-{term}")))
            .map_err(|e| ClusterError::io("rename a snapshot", e))?;
        sync_dir(&inbox)?;
        st.staged.push((index, term));
        Ok(())
    }

    /// Step 1 of an install (cluster.md section 8.3): the received
    /// snapshot at (`index`, `term`) moves to `install-<index>-<term>/`;
    /// staged ones older than it are removed (Raft never installs a
    /// snapshot at or below its commit index, which is `index` from now
    /// on). A stream being received is left alone: it writes only under
    /// its own directory. An error if it was never received.
    pub fn stage(&self, index: u64, term: u64) -> Result<()> {
        let mut st = self.state.lock();
        let inbox = self.dir.join(INBOX_DIR);
        let received = inbox.join(format!("{index}-{term}"));
        if !st.staged.contains(&(index, term)) || !received.is_dir() {
            return Err(ClusterError::Stopped {
                reason: format!("the snapshot at {index} term {term} was never received"),
            });
        }
        let target = install_dir(&self.dir, index, term);
        remove_dir_if_present(&target)?;
        std::fs::rename(&received, &target)
            .map_err(|e| ClusterError::io(format!("rename {}", received.display()), e))?;
        sync_dir(&self.dir)?;
        st.floor = st.floor.max(index);
        st.staged.retain(|s| *s != (index, term));
        self.forget_locked(&mut st, index)
    }

    /// Removes the staged snapshots at or below `committed` (cluster.md
    /// section 8.2): Raft ignores a snapshot at or below its commit index,
    /// so they will never be installed. The driver calls it after each
    /// turn; cost: one lock, and a removal per snapshot dropped.
    pub fn forget_below(&self, committed: u64) -> Result<()> {
        let mut st = self.state.lock();
        if st.staged.iter().all(|s| s.0 >= committed) {
            return Ok(());
        }
        self.forget_locked(&mut st, committed)
    }

    fn forget_locked(&self, st: &mut InboxState, below: u64) -> Result<()> {
        let inbox = self.dir.join(INBOX_DIR);
        let mut kept = Vec::with_capacity(st.staged.len());
        for (index, term) in std::mem::take(&mut st.staged) {
            if index < below {
                log::info!("the snapshot at {index} term {term} was not installed: removed");
                remove_dir_if_present(&inbox.join(format!("{index}-{term}")))?;
            } else {
                kept.push((index, term));
            }
        }
        st.staged = kept;
        Ok(())
    }

    /// The bytes a stream may write here: what the file system has free
    /// above the reserve.
    fn room(&self) -> Result<u64> {
        let free = free_bytes(&self.dir)
            .map_err(|e| ClusterError::io(format!("free space of {}", self.dir.display()), e))?;
        Ok(free.saturating_sub(self.reserve_bytes))
    }
}

/// The bytes an unprivileged writer may still use on the file system
/// holding `path` (statvfs `f_bavail * f_frsize`), as the engine measures
/// its own.
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a path with a NUL byte"))?;
    // SAFETY: statvfs with a valid C string and a zeroed out-struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

fn refused(reason: String) -> ClusterError {
    ClusterError::SnapshotRefused { reason }
}

/// Reads one stream after its preamble from `r` into the replica's inbox
/// (module docs) and returns its `MsgSnapshot`, to be handed to Raft: its
/// files are durable under `snap-in/<index>-<term>/`. `me` and `peers`
/// check the stream's `to` and `from`. Anything malformed, a stream
/// beyond what its Begin announced or the free space, or a snapshot the
/// inbox does not take (one at a time, only newer ones) is an error and
/// leaves nothing staged.
pub fn receive(
    r: &mut impl Read,
    inbox: &Inbox,
    me: u64,
    peers: &crate::members::KnownPeers,
) -> Result<Message> {
    let mut rec = Vec::with_capacity(RECORD_BYTES_MAX);
    let kind = read_record(r, &mut rec)?;
    let body = &rec[RECORD_HEADER_BYTES..];
    if kind != KIND_BEGIN || !(body.len() == BEGIN_BYTES || body.len() == BEGIN_V1_BYTES) {
        return Err(refused(format!(
            "record kind {kind} of {} bytes first",
            body.len()
        )));
    }
    let (from, to, index, term) = (
        u64_at(body, 0),
        u64_at(body, 8),
        u64_at(body, 16),
        u64_at(body, 24),
    );
    // A Begin of 40 bytes (an older leader's) announces no total: its
    // files are bounded by the free space alone.
    let announced = (body.len() == BEGIN_BYTES).then(|| u64_at(body, 40));
    if to != me || !peers.admits(from) || index == 0 || term == 0 {
        return Err(refused(format!(
            "from {from} to {to} at {index} term {term}"
        )));
    }
    let room = inbox.room()?;
    if let Some(total) = announced.filter(|&t| t > room) {
        log::warn!(
            "the snapshot at {index} term {term} from node {from} refused: its {total} bytes \
             exceed the free space above the disk reserve ({room} bytes); free space, or \
             lower --disk-free-min-bytes"
        );
        return Err(refused(format!(
            "{total} bytes announced, {room} free above the reserve"
        )));
    }
    let (stream, tmp) = inbox.begin(from, index, term)?;
    let started = std::time::Instant::now();
    let limit = Limit {
        bytes: announced.unwrap_or(room).min(room),
        announced: announced.is_some(),
    };
    let result = receive_files(r, &mut rec, &tmp, limit, &|| inbox.progress(stream)).and_then(
        |(msg, files, bytes)| {
            let meta = msg.get_snapshot().get_metadata();
            if msg.from != from
                || msg.to != to
                || msg.get_msg_type() != raft::eraftpb::MessageType::MsgSnapshot
                || (meta.index, meta.term) != (index, term)
            {
                return Err(refused(
                    "its message is not the MsgSnapshot its Begin names".into(),
                ));
            }
            Ok((msg, files, bytes))
        },
    );
    let (msg, files, bytes) = match result {
        Ok(got) => got,
        Err(e) => {
            inbox.end(stream, &tmp, None)?;
            return Err(e);
        }
    };
    inbox.end(stream, &tmp, Some((index, term)))?;
    // The transfer rate benches/snapshot-transfer.sh reports: from Begin
    // to the files durable here.
    let secs = started.elapsed().as_secs_f64();
    log::info!(
        "snapshot at entry {index} from node {from}: {files} files, {bytes} bytes received \
         and synced in {:.1} ms ({:.1} MB/s)",
        secs * 1e3,
        bytes as f64 / 1e6 / secs.max(1e-9)
    );
    Ok(msg)
}

/// What a stream may write: the bytes its Begin announced (`announced`),
/// else the free space above the reserve.
#[derive(Clone, Copy)]
struct Limit {
    bytes: u64,
    announced: bool,
}

/// The files and End of a stream, into `tmp`; the message, and the counts
/// of files and bytes.
fn receive_files(
    r: &mut impl Read,
    rec: &mut Vec<u8>,
    tmp: &Path,
    limit: Limit,
    progress: &dyn Fn() -> Result<()>,
) -> Result<(Message, u32, u64)> {
    let bad = refused;
    let io = |what: &str, e| ClusterError::io(format!("{what} {}", tmp.display()), e);
    std::fs::create_dir_all(tmp).map_err(|e| io("create", e))?;
    let mut dirs = vec![tmp.to_path_buf()];
    let (mut count, mut bytes) = (0u32, 0u64);
    loop {
        let kind = read_record(r, rec)?;
        progress()?;
        let body = &rec[RECORD_HEADER_BYTES..];
        match kind {
            KIND_FILE => {
                if body.len() < FILE_FIXED_BYTES || body[10..16] != [0; 6] {
                    return Err(bad("a malformed File record".into()));
                }
                let len = u64_at(body, 0);
                let name_len = u16::from_le_bytes([body[8], body[9]]) as usize;
                let name = std::str::from_utf8(&body[FILE_FIXED_BYTES..])
                    .ok()
                    .filter(|n| n.len() == name_len && safe_name(n))
                    .ok_or_else(|| bad("a file name that is not a safe relative path".into()))?
                    .to_string();
                if len > limit.bytes - bytes {
                    return Err(bad(match limit.announced {
                        true => format!(
                            "{name}: {len} bytes beyond the {} bytes its Begin announced",
                            limit.bytes
                        ),
                        false => format!(
                            "{name}: {len} bytes beyond the free space above the reserve ({} bytes)",
                            limit.bytes
                        ),
                    }));
                }
                let path = tmp.join(&name);
                let parent = path.parent().unwrap_or(tmp).to_path_buf();
                if !dirs.contains(&parent) {
                    std::fs::create_dir_all(&parent).map_err(|e| io("create under", e))?;
                    // Every directory between `tmp` and the file is synced.
                    let mut d = parent.clone();
                    while d != tmp && !dirs.contains(&d) {
                        dirs.push(d.clone());
                        d = d.parent().unwrap_or(tmp).to_path_buf();
                    }
                }
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| io("create a file under", e))?;
                let mut left = len;
                while left > 0 {
                    if read_record(r, rec)? != KIND_CHUNK {
                        return Err(bad(format!("{name}: {left} bytes missing")));
                    }
                    progress()?;
                    let data = &rec[RECORD_HEADER_BYTES..];
                    if data.is_empty() || data.len() as u64 > left {
                        return Err(bad(format!("{name}: a chunk of {} bytes", data.len())));
                    }
                    file.write_all(data).map_err(|e| io("write under", e))?;
                    left -= data.len() as u64;
                }
                file.sync_all().map_err(|e| io("fsync under", e))?;
                count += 1;
                bytes += len;
            }
            KIND_END => {
                if body.len() < END_FIXED_BYTES || body[4..8] != [0; 4] {
                    return Err(bad("a malformed End record".into()));
                }
                let (files, total) = (
                    u32::from_le_bytes([body[0], body[1], body[2], body[3]]),
                    u64_at(body, 8),
                );
                if (files, total) != (count, bytes) {
                    return Err(bad(format!(
                        "End counts {files} files, {total} bytes; {count}, {bytes} arrived"
                    )));
                }
                let msg = Message::parse_from_bytes(&body[END_FIXED_BYTES..])
                    .map_err(|e| bad(format!("its message: {e}")))?;
                // Deepest first, so that each directory's entry in its
                // parent is synced after its own entries.
                dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
                for d in &dirs {
                    sync_dir(d)?;
                }
                return Ok((msg, count, bytes));
            }
            k => return Err(bad(format!("record kind {k} where a File or End belongs"))),
        }
    }
}

/// Reads one whole record into `rec` (header included), checking its
/// length bound, CRC and reserved bytes; its kind.
fn read_record(r: &mut impl Read, rec: &mut Vec<u8>) -> Result<u8> {
    let bad = refused;
    rec.clear();
    rec.resize(RECORD_HEADER_BYTES, 0);
    r.read_exact(rec)
        .map_err(|e| ClusterError::io("read a snapshot stream", e))?;
    let len = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize;
    if !(RECORD_HEADER_BYTES..=RECORD_BYTES_MAX).contains(&len) {
        return Err(bad(format!("a record of {len} bytes")));
    }
    rec.resize(len, 0);
    r.read_exact(&mut rec[RECORD_HEADER_BYTES..])
        .map_err(|e| ClusterError::io("read a snapshot stream", e))?;
    let crc = u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]);
    if crc32fast::hash(&rec[8..]) != crc {
        return Err(bad("a record's CRC does not match".into()));
    }
    if rec[9..16] != [0; 7] {
        return Err(bad("a record's reserved bytes are not 0".into()));
    }
    Ok(rec[8])
}

/// A relative `/`-separated name of plain components.
fn safe_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        })
}

fn install_dir(dir: &Path, index: u64, term: u64) -> PathBuf {
    dir.join(format!("install-{index}-{term}"))
}

/// Step 3 of an install, with the engine closed and the Raft log starting
/// at (`index`, `term`) (step 2, the commit point): the swap (module docs).
pub fn finish(dir: &Path, index: u64, term: u64) -> Result<()> {
    let install = install_dir(dir, index, term);
    let (engine, old) = (dir.join(ENGINE_DIR), dir.join(OLD_ENGINE_DIR));
    if install.exists() {
        if engine.exists() {
            remove_dir_if_present(&old)?;
            std::fs::rename(&engine, &old).map_err(|e| ClusterError::io("rename engine", e))?;
        }
        std::fs::rename(&install, &engine)
            .map_err(|e| ClusterError::io(format!("rename {}", install.display()), e))?;
        sync_dir(dir)?;
    }
    remove_dir_if_present(&old)
}

/// Before the engine opens: finishes an install the Raft log committed
/// (it starts at the install's (index, term)), removes any other install
/// directory, an old engine, and everything received but not installed.
pub fn recover(dir: &Path, start: (u64, u64)) -> Result<()> {
    remove_dir_if_present(&dir.join(INBOX_DIR))?;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(ClusterError::io(format!("list {}", dir.display()), e)),
    };
    let mut committed = false;
    for entry in entries {
        let entry = entry.map_err(|e| ClusterError::io(format!("list {}", dir.display()), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix("install-") else {
            continue;
        };
        let at = rest
            .split_once('-')
            .and_then(|(i, t)| Some((i.parse::<u64>().ok()?, t.parse::<u64>().ok()?)));
        if at == Some(start) {
            committed = true;
        } else {
            log::warn!("{name}: an install the Raft log never committed, removed");
            remove_dir_if_present(&entry.path())?;
        }
    }
    if committed {
        log::info!("finishing the install of the snapshot at {start:?}");
    }
    finish(dir, start.0, start.1)
}

fn remove_dir_if_present(d: &Path) -> Result<()> {
    match std::fs::remove_dir_all(d) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ClusterError::io(format!("remove {}", d.display()), e)),
    }
}
