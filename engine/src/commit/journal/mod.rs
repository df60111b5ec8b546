//! The commit journal: the shared append-only log into which every commit
//! round is written as one frame, with one `pwrite` and (under
//! `fsync=always`) one `fdatasync`, whatever number of groups it touched.
//! Group logs are written after the journal and synced only at
//! checkpoints; recovery replays the journal into them.
//!
//! Layout (format-spec/storage.md section 5): journal files
//! `journal/<seq>.tmj`, each a 48-byte header then frames back to back.
//! `frame.rs` holds the frame (envelope + replicated payload) codec,
//! `entry.rs` the entry kinds and their bodies' codecs (`journal::body`);
//! `header.rs` the file header and file names; this module holds the
//! writer.
//!
//! File header (little-endian):
//! `{ magic: [u8; 8] = "TDMKJRNL" | version: u16 = 3 | header_len: u16 = 48 |
//!    flags: u8 | reserved: [u8; 3] = 0 | seq: u64 | first_lsn: u64 |
//!    first_round: u64 | mark_key: u32 | crc32: u32 (of bytes 0..44) }`
//!
//! Invariants: frames are numbered densely by `lsn` from the header's
//! `first_lsn` (Round frames also by `round_index` from `first_round`); a
//! file is appended to only by the writer that created it; the writer
//! rolls to file `seq + 1` only after syncing this one, so a torn tail can
//! only be in the newest file that holds frames (the rule recovery relies
//! on). Versions 1 and 2 of the header are storage format 1 (32 bytes,
//! CRC at 28): such a file is refused, never read.
//!
//! Costs: a frame is one `pwrite`; a roll (every `journal_file_bytes` and
//! at every checkpoint's capture) is, on the commit thread, an fdatasync
//! of the old file if bytes of it are unsynced, and the header write and
//! fdatasync of the next file. The next file itself is created (and its
//! directory entry synced) ahead of time on a helper thread (`spare.rs`);
//! only if that failed does the roll create it. The header's fdatasync
//! stays on the roll: recovery relies on a file's header being durable
//! before any frame of it (section 11), and the header names the first
//! frame's numbers, known only at the roll.

pub mod entry;
pub mod frame;
pub mod header;
pub mod rounds;
mod spare;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs, VfsFile};

pub(crate) use entry::body;
pub use entry::FrameKind;
pub use entry::{encode_entry, Entry, EntryIter, EntryKind, ENTRY_HEADER_BYTES};
pub use frame::FrameBuf;
#[cfg(any(test, feature = "testing"))]
pub(crate) use header::encode_header;
use header::JOURNAL_SUFFIX;
pub use header::{
    decode_header_of, journal_dir, journal_path, unsupported_version, JournalHeader, JournalStart,
    FLAG_SEGMENTS_MAY_LEAD, JOURNAL_HEADER_BYTES, JOURNAL_MAGIC, JOURNAL_VERSION, LSN_MAX,
};
pub(crate) use header::{encode_header_of, new_mark_key};

/// How the writer creates and rolls files.
#[derive(Clone, Copy, Debug)]
pub struct JournalOptions {
    /// See [`FLAG_SEGMENTS_MAY_LEAD`]: set unless the fsync policy is `always`.
    pub segments_may_lead: bool,
    /// A file rolls before a frame would take it past this (`Config::journal_file_bytes`).
    pub file_bytes_max: u64,
}

impl JournalOptions {
    pub fn of(config: &crate::config::Config) -> JournalOptions {
        JournalOptions {
            segments_may_lead: config.fsync != crate::config::FsyncPolicy::Always,
            file_bytes_max: config.journal_file_bytes,
        }
    }
}

/// The journal files in `dir` as `(seq, path)`, oldest first.
pub fn list(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let entries = vfs
        .read_dir(dir)
        .map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    let mut files: Vec<(u64, PathBuf)> = entries
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let seq = name.strip_suffix(JOURNAL_SUFFIX)?.parse().ok()?;
            Some((seq, p))
        })
        .collect();
    files.sort_unstable();
    Ok(files)
}

/// The end of the journal's written frames: file `seq`, `len` bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalEnd {
    pub seq: u64,
    pub len: u64,
}

/// Who is told the journal's end after every frame write and roll: the
/// snapshot holds (`state/pins.rs`), which the journal knows only as this.
pub(crate) trait EndWatcher: Send + Sync {
    fn journal_at(&self, end: JournalEnd);
}

/// What a frame write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameWritten {
    pub lsn: u64,
    /// fdatasyncs of journal files a roll before the frame made (0 or 2:
    /// the file left, and the new file's header).
    pub roll_syncs: u64,
    /// Where the frame lies: the journal file and its offset there.
    pub seq: u64,
    pub offset: u64,
    /// The frame's `round_index` (0 for a Local frame).
    pub round: u64,
}

/// The journal file being appended to, and the numbering of frames.
pub struct Journal {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    options: JournalOptions,
    pub seq: u64,
    path: PathBuf,
    file: Box<dyn VfsFile>,
    len: u64,
    /// Bytes of the file known durable: its length when the last
    /// fdatasync returned. Every frame carries it (`synced_len`).
    synced: u64,
    /// The header's key, mixed into every envelope checksum of this file.
    mark_key: u32,
    next_lsn: u64,
    next_round: u64,
    /// Bytes written since this writer was created (by a checkpoint or
    /// recovery), headers of rolled files included: what triggers the
    /// next checkpoint.
    written: u64,
    /// Where the end of the written frames is published for snapshots
    /// (the engine's snapshot holds), once the engine is open.
    published: Option<Arc<dyn EndWatcher>>,
    /// File `seq + 1`, made ahead of time.
    spare: spare::Spare,
}

impl Journal {
    /// Creates journal file `start.seq` in `dir` and makes it (and its
    /// directory entry) durable, so a checkpoint may point at it.
    pub fn create(
        vfs: Arc<dyn Vfs>,
        dir: &Path,
        start: JournalStart,
        options: JournalOptions,
    ) -> Result<Journal> {
        let (path, file, mark_key) = create_file(&*vfs, dir, start, options)?;
        let mut spare = spare::Spare::start(vfs.clone(), dir.to_owned());
        if let Some(next) = start.seq.checked_add(1).filter(|&s| s < u64::MAX) {
            spare.ask(next);
        }
        Ok(Journal {
            vfs,
            dir: dir.to_owned(),
            options,
            seq: start.seq,
            path,
            file,
            len: JOURNAL_HEADER_BYTES as u64,
            synced: JOURNAL_HEADER_BYTES as u64,
            mark_key,
            next_lsn: start.lsn,
            next_round: start.round,
            written: JOURNAL_HEADER_BYTES as u64,
            published: None,
            spare,
        })
    }

    /// From now on, the end of the written frames is published to
    /// `watcher` after every write and roll (a snapshot's journal prefix
    /// ends there).
    pub(crate) fn publish_to(&mut self, watcher: Arc<dyn EndWatcher>) {
        self.published = Some(watcher);
        self.publish();
    }

    fn publish(&self) {
        if let Some(h) = &self.published {
            h.journal_at(JournalEnd {
                seq: self.seq,
                len: self.len,
            });
        }
    }

    /// Writes `frame` (sealed here with the next lsn, round index and the
    /// synced length) with one write, after rolling to the next file if
    /// the frame would take this one past `journal_file_bytes` (a frame
    /// larger than that goes alone into a new file). On failure the file
    /// is cut back to where it was and no number is used, so a failed
    /// write (a full disk) can be retried as if it never happened.
    pub fn append(&mut self, frame: &mut FrameBuf, kind: FrameKind) -> Result<FrameWritten> {
        lsn_available(self.next_lsn)?;
        let roll_syncs = self.roll_for(frame.len())?;
        let round = match kind {
            FrameKind::Round => self.next_round,
            FrameKind::Local => 0,
        };
        let bytes = frame
            .seal(kind, self.next_lsn, round, self.synced, self.mark_key)
            .map_err(|reason| Error::WritesStopped { reason })?;
        self.write_sealed(bytes, kind, round, roll_syncs)
    }

    /// Seals `frame`'s payload as the next Round frame's (its round index
    /// [`Journal::next_round`]) without writing it, for the round gate
    /// (`commit/gate.rs`); returns the round index and the payload. The
    /// payload does not depend on the envelope, so [`Journal::append`]
    /// writes these same payload bytes.
    pub fn seal_round_payload<'a>(&self, frame: &'a mut FrameBuf) -> Result<(u64, &'a [u8])> {
        let round = self.next_round;
        let bytes = frame
            .seal(
                FrameKind::Round,
                self.next_lsn,
                round,
                self.synced,
                self.mark_key,
            )
            .map_err(|reason| Error::WritesStopped { reason })?;
        Ok((round, &bytes[frame::ENVELOPE_BYTES..]))
    }

    /// Writes a Round frame whose payload another node wrote
    /// ([`FrameBuf::load_payload`]): its bytes unchanged, in this node's
    /// envelope (its lsn, its `synced_len`). Like [`Journal::append`] in
    /// every other way. The caller checked that the payload's
    /// `round_index` is [`Journal::next_round`]; it is checked again here,
    /// since a frame numbered otherwise would end the valid part of the
    /// file for recovery.
    pub fn append_replicated(&mut self, frame: &mut FrameBuf, round: u64) -> Result<FrameWritten> {
        if round != self.next_round {
            return Err(Error::RoundOutOfOrder {
                round,
                expected: self.next_round,
            });
        }
        lsn_available(self.next_lsn)?;
        let roll_syncs = self.roll_for(frame.len())?;
        let bytes = frame
            .seal_envelope(FrameKind::Round, self.next_lsn, self.synced, self.mark_key)
            .map_err(|reason| Error::WritesStopped { reason })?;
        self.write_sealed(bytes, FrameKind::Round, round, roll_syncs)
    }

    /// Rolls to the next file first if a frame of `len` bytes would take
    /// this one past `journal_file_bytes` (a frame larger than that goes
    /// alone into a new file); returns the fdatasyncs that took.
    fn roll_for(&mut self, len: usize) -> Result<u64> {
        let would_be = self.len.saturating_add(len as u64);
        if would_be > self.options.file_bytes_max && self.len > JOURNAL_HEADER_BYTES as u64 {
            return self.roll();
        }
        Ok(0)
    }

    /// Writes a sealed frame at the end of the file and moves the numbers on.
    fn write_sealed(
        &mut self,
        bytes: &[u8],
        kind: FrameKind,
        round: u64,
        roll_syncs: u64,
    ) -> Result<FrameWritten> {
        let offset = self.len;
        if let Err(e) = self.file.write_all_at(bytes, offset) {
            let _ = self.file.set_len(offset);
            return Err(Error::write(format!("write {}", self.path.display()), e));
        }
        let n = bytes.len() as u64;
        self.len += n;
        self.written += n;
        let lsn = self.next_lsn;
        // Numbers saturate rather than wrap: 2^64 frames are not reachable,
        // only a crafted header starts near the end.
        self.next_lsn = self.next_lsn.saturating_add(1);
        if kind == FrameKind::Round {
            self.next_round = self.next_round.saturating_add(1);
        }
        self.publish();
        Ok(FrameWritten {
            lsn,
            roll_syncs,
            seq: self.seq,
            offset,
            round,
        })
    }

    /// Moves to file `seq + 1`: this file is synced first (so a torn tail
    /// can only be in the newest file holding frames), then the next one
    /// gets its header, synced: the spare made ahead of time, or a file
    /// created here if there is none. Nothing changes if either step
    /// fails. The spare of the file after is asked for. Returns
    /// the fdatasyncs of files that took: this file's is skipped when the
    /// last one already covered all of it (every round under `fsync
    /// always`), since a sync of a clean file still waits for the disk's
    /// cache flush, on the commit thread, at every checkpoint's capture.
    pub(crate) fn roll(&mut self) -> Result<u64> {
        let seq = self
            .seq
            .checked_add(1)
            .filter(|&s| s < u64::MAX)
            .ok_or_else(|| Error::WritesStopped {
                reason: "journal sequence numbers exhausted".into(),
            })?;
        let mut syncs = 1;
        if self.synced < self.len {
            self.sync()?;
            syncs += 1;
        }
        let start = self.next_start_at(seq);
        lsn_available(start.lsn)?;
        let (path, file, mark_key) = match self.spare.take(seq) {
            Some(file) => {
                let path = journal_path(&self.dir, seq);
                let mark_key = write_header(&*file, &path, start, self.options)?;
                (path, file, mark_key)
            }
            None => create_file(&*self.vfs, &self.dir, start, self.options)?,
        };
        if let Some(after) = seq.checked_add(1).filter(|&s| s < u64::MAX) {
            self.spare.ask(after);
        }
        self.seq = seq;
        self.path = path;
        self.file = file;
        self.len = JOURNAL_HEADER_BYTES as u64;
        self.synced = JOURNAL_HEADER_BYTES as u64;
        self.mark_key = mark_key;
        self.written += JOURNAL_HEADER_BYTES as u64;
        self.publish();
        Ok(syncs)
    }

    /// Waits until the next file's spare is made; whether it is.
    #[cfg(test)]
    pub(crate) fn wait_for_spare(&mut self) -> bool {
        self.spare.wait_ready()
    }

    pub fn sync(&mut self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| Error::io(format!("fdatasync {}", self.path.display()), e))?;
        self.synced = self.len;
        Ok(())
    }

    /// Whether the current file holds frames (a checkpoint's capture
    /// rolls to a new file only then).
    pub fn holds_frames(&self) -> bool {
        self.len > JOURNAL_HEADER_BYTES as u64
    }

    /// Bytes written since this writer was created (a checkpoint or the
    /// end of recovery), the headers of rolled files included.
    pub fn bytes_since_start(&self) -> u64 {
        self.written
    }

    /// Where the file after this one starts (a checkpoint creates it).
    pub fn next_start(&self) -> Result<JournalStart> {
        let seq = self
            .seq
            .checked_add(1)
            .ok_or_else(|| Error::WritesStopped {
                reason: "journal sequence numbers exhausted".into(),
            })?;
        Ok(self.next_start_at(seq))
    }

    fn next_start_at(&self, seq: u64) -> JournalStart {
        JournalStart {
            seq,
            lsn: self.next_lsn,
            round: self.next_round,
        }
    }
}

/// Creates journal file `start.seq` (truncating any file of that name),
/// writes its header, syncs it and its directory.
/// Refuses a frame number past [`LSN_MAX`]: a reader would take the frame
/// (or a file header naming it) for damage. Only a crafted header starts
/// near the end; 2^62 frames are never written.
fn lsn_available(lsn: u64) -> Result<()> {
    if lsn > LSN_MAX {
        return Err(Error::WritesStopped {
            reason: format!("journal frame numbers exhausted (next lsn {lsn} is at 2^62)"),
        });
    }
    Ok(())
}

fn create_file(
    vfs: &dyn Vfs,
    dir: &Path,
    start: JournalStart,
    options: JournalOptions,
) -> Result<(PathBuf, Box<dyn VfsFile>, u32)> {
    lsn_available(start.lsn)?;
    let path = journal_path(dir, start.seq);
    let ctx = |op: &str| format!("{op} {}", path.display());
    let file = vfs
        .open(&path, OpenMode::ReadWriteCreate)
        .map_err(|e| Error::io(ctx("create"), e))?;
    file.set_len(0).map_err(|e| Error::io(ctx("truncate"), e))?;
    let mark_key = write_header(&*file, &path, start, options)?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(format!("fsync dir {}", dir.display()), e))?;
    Ok((path, file, mark_key))
}

/// Writes the header of journal file `start.seq` (`path`, empty) and
/// syncs it; returns its mark key.
fn write_header(
    file: &dyn VfsFile,
    path: &Path,
    start: JournalStart,
    options: JournalOptions,
) -> Result<u32> {
    lsn_available(start.lsn)?;
    let ctx = |op: &str| format!("{op} {}", path.display());
    let header = JournalHeader {
        flags: if options.segments_may_lead {
            FLAG_SEGMENTS_MAY_LEAD
        } else {
            0
        },
        seq: start.seq,
        first_lsn: start.lsn,
        first_round: start.round,
        mark_key: new_mark_key(start.seq),
    };
    file.write_all_at(&encode_header_of(&header), 0)
        .map_err(|e| Error::write(ctx("write"), e))?;
    file.sync_data()
        .map_err(|e| Error::io(ctx("fdatasync"), e))?;
    Ok(header.mark_key)
}

/// Maps a whole journal file for replay.
pub fn map_file(vfs: &dyn Vfs, path: &Path) -> Result<Option<memmap2::Mmap>> {
    let file = vfs
        .open(path, OpenMode::Read)
        .map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let len = file
        .file_len()
        .map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
    if len == 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| Error::Corrupt {
        path: path.to_owned(),
        group: None,
        offset: 0,
        reason: "journal larger than the address space".into(),
    })?;
    file.map(len)
        .map(Some)
        .map_err(|e| Error::io(format!("mmap {}", path.display()), e))
}

/// A frame of a journal file as tests see it: where it lies and its
/// entries as `(offset in the file, length, kind, group)`.
#[cfg(test)]
#[derive(Clone, Debug)]
pub struct FrameInfo {
    pub offset: usize,
    pub end: usize,
    pub lsn: u64,
    pub synced_len: u64,
    pub entries: Vec<(usize, usize, EntryKind, u64)>,
}

/// The valid frames of a whole journal file (header first), for tests.
#[cfg(test)]
pub fn frames_of_file(file: &[u8]) -> Vec<FrameInfo> {
    let Ok(h) = decode_header_of(file) else {
        return Vec::new();
    };
    frame::FrameIter::new(
        file,
        JOURNAL_HEADER_BYTES,
        h.mark_key,
        h.first_lsn,
        h.first_round,
    )
    .map(|f| {
        let base = f.offset + frame::FRAME_OVERHEAD_BYTES;
        let mut at = base;
        let entries = f
            .entries()
            .map(|e| {
                let len = ENTRY_HEADER_BYTES + e.body.len();
                let row = (at, len, e.kind, e.group_id);
                at += len;
                row
            })
            .collect();
        FrameInfo {
            offset: f.offset,
            end: f.end(),
            lsn: f.envelope.lsn,
            synced_len: f.envelope.synced_len,
            entries,
        }
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::OsVfs;

    /// The journal files that hold a header: all but the spare, which is
    /// empty until a roll takes it.
    fn files_with_header(vfs: &dyn Vfs, dir: &Path) -> Vec<(u64, PathBuf)> {
        list(vfs, dir)
            .unwrap()
            .into_iter()
            .filter(|(_, p)| std::fs::metadata(p).unwrap().len() > 0)
            .collect()
    }

    /// A roll whose spare is ready writes the next file's header and
    /// syncs it, and nothing else: the file was created and its directory
    /// entry synced on the spare's thread. Without a spare the roll
    /// creates the file, cuts it, and syncs the directory on the commit
    /// thread, behind every other metadata change of the file system.
    #[test]
    fn a_roll_with_its_spare_ready_creates_no_file_and_syncs_no_directory() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = crate::io::FaultyVfs::new();
        let control = faulty.control.clone();
        let vfs: Arc<dyn Vfs> = Arc::new(faulty);
        let options = JournalOptions {
            segments_may_lead: false,
            file_bytes_max: 1 << 20,
        };
        let mut j =
            Journal::create(vfs.clone(), dir.path(), JournalStart::first(1), options).unwrap();
        let me = std::thread::current().id();
        let mut f = FrameBuf::default();
        for g in 1..=3u64 {
            f.clear();
            f.push_entry(EntryKind::CreateGroup, g, |b| b.extend_from_slice(&[0; 40]));
            j.append(&mut f, FrameKind::Round).unwrap();
            j.sync().unwrap();
            assert!(
                j.wait_for_spare(),
                "the spare of file {} is made",
                j.seq + 1
            );
            // Operations of the file layer on this thread (the spare's
            // thread makes the next spare meanwhile).
            let ops = control.ops_on(me);
            assert_eq!(j.roll().unwrap(), 1, "only the new header is synced");
            assert_eq!(
                control.ops_on(me) - ops,
                2,
                "the header's write and sync: no open, cut or directory sync"
            );
        }
        drop(j);
        // The files rolled to hold their headers; the spare of the next
        // one is there, empty, its name durable.
        let files = list(&*vfs, dir.path()).unwrap();
        assert_eq!(
            files.iter().map(|f| f.0).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5]
        );
        for (seq, path) in &files {
            let bytes = std::fs::read(path).unwrap();
            match seq {
                5 => assert!(bytes.is_empty(), "the spare is empty"),
                _ => assert_eq!(decode_header_of(&bytes).unwrap().seq, *seq),
            }
        }
    }

    #[test]
    fn header_round_trips_and_detects_damage() {
        let start = JournalStart {
            seq: 77,
            lsn: 5,
            round: 4,
        };
        let h = encode_header(start, 0xfeed);
        let d = decode_header_of(&h).unwrap();
        assert_eq!(
            (d.seq, d.first_lsn, d.first_round, d.mark_key),
            (77, 5, 4, 0xfeed)
        );
        for at in 0..JOURNAL_HEADER_BYTES {
            let mut b = h;
            b[at] ^= 1;
            assert!(decode_header_of(&b).is_err(), "byte {at}");
        }
    }

    /// Fuzz finding F12: a journal whose header starts at the last frame
    /// number a reader accepts took one more frame numbered 2^62, which
    /// the next open would call damage (and a group's `applied_lsn` cannot
    /// hold). The writer refuses it: writes stop with a reason.
    #[test]
    fn the_writer_stops_at_the_last_frame_number_a_reader_accepts() {
        let dir = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn Vfs> = Arc::new(OsVfs);
        let options = JournalOptions {
            segments_may_lead: false,
            file_bytes_max: 400,
        };
        let start = JournalStart {
            seq: 1,
            lsn: LSN_MAX,
            round: 1,
        };
        let mut j = Journal::create(vfs.clone(), dir.path(), start, options).unwrap();
        let mut f = FrameBuf::default();
        f.push_entry(EntryKind::CreateGroup, 1, |b| b.extend_from_slice(&[0; 40]));
        assert_eq!(j.append(&mut f, FrameKind::Round).unwrap().lsn, LSN_MAX);
        f.clear();
        f.push_entry(EntryKind::CreateGroup, 2, |b| b.extend_from_slice(&[0; 40]));
        assert!(matches!(
            j.append(&mut f, FrameKind::Round),
            Err(Error::WritesStopped { .. })
        ));
        assert!(matches!(j.roll(), Err(Error::WritesStopped { .. })));
        let files = files_with_header(&*vfs, dir.path());
        assert_eq!(files.len(), 1, "no file numbered past the limit");
        let first = std::fs::read(&files[0].1).unwrap();
        assert_eq!(frames_of_file(&first).len(), 1);
    }

    /// A roll syncs the file it leaves only when the last sync did not
    /// cover all of it: the capture of every checkpoint rolls, and under
    /// `fsync always` the file was synced by the round before, so a second
    /// fdatasync (which still waits for the disk's cache flush) only held
    /// the commit thread.
    #[test]
    fn a_roll_syncs_the_file_it_leaves_only_if_unsynced_bytes_remain() {
        let dir = tempfile::tempdir().unwrap();
        let faulty = crate::io::FaultyVfs::new();
        let control = faulty.control.clone();
        let vfs: Arc<dyn Vfs> = Arc::new(faulty);
        let options = JournalOptions {
            segments_may_lead: false,
            file_bytes_max: 1 << 20,
        };
        let mut j =
            Journal::create(vfs.clone(), dir.path(), JournalStart::first(1), options).unwrap();
        let syncs = || control.file_syncs.load(std::sync::atomic::Ordering::SeqCst);
        let mut f = FrameBuf::default();
        f.push_entry(EntryKind::CreateGroup, 1, |b| b.extend_from_slice(&[0; 40]));
        j.append(&mut f, FrameKind::Round).unwrap();
        j.sync().unwrap();
        let before = syncs();
        assert_eq!(j.roll().unwrap(), 1, "only the new file is synced");
        assert_eq!(syncs() - before, 1);
        // Unsynced frames: the file left is synced before the next exists.
        f.clear();
        f.push_entry(EntryKind::CreateGroup, 2, |b| b.extend_from_slice(&[0; 40]));
        j.append(&mut f, FrameKind::Round).unwrap();
        let before = syncs();
        assert_eq!(j.roll().unwrap(), 2, "the file left, then the new one");
        assert_eq!(syncs() - before, 2);
        let files = files_with_header(&*vfs, dir.path());
        assert_eq!(files.iter().map(|f| f.0).collect::<Vec<_>>(), vec![1, 2, 3]);
        for (seq, frames) in [(0, 1), (1, 1), (2, 0)] {
            let bytes = std::fs::read(&files[seq].1).unwrap();
            assert_eq!(frames_of_file(&bytes).len(), frames, "file {}", seq + 1);
        }
    }

    #[test]
    fn the_writer_numbers_frames_densely_and_rolls_only_after_syncing() {
        let dir = tempfile::tempdir().unwrap();
        let vfs: Arc<dyn Vfs> = Arc::new(OsVfs);
        let options = JournalOptions {
            segments_may_lead: false,
            file_bytes_max: 400,
        };
        let mut j =
            Journal::create(vfs.clone(), dir.path(), JournalStart::first(3), options).unwrap();
        let mut f = FrameBuf::default();
        let mut lsns = Vec::new();
        for g in 1..=6u64 {
            f.clear();
            f.push_entry(EntryKind::CreateGroup, g, |b| b.extend_from_slice(&[0; 40]));
            let w = j.append(&mut f, FrameKind::Round).unwrap();
            lsns.push((w.lsn, j.seq, w.roll_syncs));
        }
        // Frames of 120 bytes: 48 + 3 x 120 = 408 > 400, so two per file.
        assert_eq!(
            lsns,
            vec![
                (1, 3, 0),
                (2, 3, 0),
                (3, 4, 2),
                (4, 4, 0),
                (5, 5, 2),
                (6, 5, 0)
            ]
        );
        let files = files_with_header(&*vfs, dir.path());
        assert_eq!(files.iter().map(|f| f.0).collect::<Vec<_>>(), vec![3, 4, 5]);
        let second = std::fs::read(&files[1].1).unwrap();
        let h = decode_header_of(&second).unwrap();
        assert_eq!((h.first_lsn, h.first_round), (3, 3));
        let frames = frames_of_file(&second);
        assert_eq!(frames.iter().map(|f| f.lsn).collect::<Vec<_>>(), vec![3, 4]);
        // A new file's frames name its synced header until it is synced.
        assert_eq!(frames[1].synced_len, JOURNAL_HEADER_BYTES as u64);
        assert_eq!(
            j.next_start().unwrap(),
            JournalStart {
                seq: 6,
                lsn: 7,
                round: 7
            }
        );
    }
}
