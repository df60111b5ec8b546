//! A consistent snapshot of a running engine: what an online backup copies
//! (and what a Raft leader ships to a follower that needs a snapshot). Format and argument: format-spec/storage.md section 18.
//!
//! Representation: a snapshot is a *hold* (`pins::Holds`) on the newest
//! stored manifest M and the journal end J at the moment it began. Its
//! files are the directory a crash at J would recover from, restricted to
//! what recovery reads and cut to what M and J need:
//!
//! - `FORMAT`, M's manifest file, M's run parts (immutable);
//! - the journal files M pins (sealed) and every journal file from M's
//!   replay file to J's, the last one cut at J (a prefix of the journal at
//!   a frame boundary is a valid journal: recovery replays it, no tear);
//! - the cold files M pins, cut after the last extent M names in each
//!   (cold files are append-only; bytes after it are no extent of M's);
//! - every segment file M names, cut at the length M recorded (a power
//!   cut may leave exactly that: K3 synced it before M was stored; replay
//!   of the journal prefix appends the rest, as after any crash).
//!
//! Invariants: nothing a snapshot names is deleted or changed below the
//! lengths it copies while it lives (the hold defers K7, the graveyard and
//! the trash's removals; files are append-only; a deleted group's
//! directory moves and the hold says where, `Whereabouts`); every round
//! completed before [`crate::Engine::snapshot`] returned is in the journal
//! prefix (J is published after each frame write). Dropping the snapshot
//! releases the hold.
//!
//! Costs: beginning one is one lock and O(1) (the writes' pause, measured
//! in [`SnapshotInfo::pause`]); [`Snapshot::files`] merges M's runs (the
//! size of the state, on the caller's thread, no lock held); copying reads
//! each file once. While a snapshot lives, deletions wait: the disk holds
//! what the node wrote meanwhile on top of the usual.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::commit::thread::Shared;
use crate::error::{Error, Result};
use crate::io::{OpenMode, VfsFile};
use crate::logs::extents::{FileId, FileKind};
use crate::state::pins::{Held, Holds, Whereabouts};
use crate::state::{manifest, run, Item};

/// Where a snapshot stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The checkpoint (manifest) it copies.
    pub checkpoint_seq: u64,
    /// The journal prefix ends in this file at this byte.
    pub journal_seq: u64,
    pub journal_len: u64,
    /// How long beginning it held the lock the journal writer publishes
    /// under: the longest a write waited for it.
    pub pause: Duration,
}

/// One file of a snapshot: its name relative to the data directory
/// (`/`-separated) and the bytes of it the snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotFile {
    pub name: String,
    pub len: u64,
    source: Source,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Source {
    Path(PathBuf),
    Segment { group: u64, base: u64 },
}

/// A snapshot under way (module doc). Dropping it ends the hold.
pub struct Snapshot {
    shared: Arc<Shared>,
    holds: Arc<Holds>,
    held: Held,
}

/// Reads one snapshot file front to back, never past its length.
pub struct SnapshotReader {
    file: Box<dyn VfsFile>,
    path: PathBuf,
    len: u64,
    at: u64,
}

/// How often a segment's open waits for a trash rename under way, 1 ms
/// each (a rename takes microseconds).
const RENAME_WAITS_MAX: u32 = 5000;

impl Snapshot {
    pub(crate) fn begin(shared: Arc<Shared>, holds: Arc<Holds>) -> Result<Snapshot> {
        let held = holds.hold().ok_or_else(|| Error::WritesStopped {
            reason: "no stored checkpoint to snapshot yet".into(),
        })?;
        Ok(Snapshot {
            shared,
            holds,
            held,
        })
    }

    pub fn info(&self) -> SnapshotInfo {
        SnapshotInfo {
            checkpoint_seq: self.held.manifest.ckpt_seq,
            journal_seq: self.held.journal_end.seq,
            journal_len: self.held.journal_end.len,
            pause: self.held.pause,
        }
    }

    fn data_dir(&self) -> &Path {
        &self.shared.ctx.config.data_dir
    }

    fn file(&self, path: PathBuf, len: u64) -> Result<SnapshotFile> {
        Ok(SnapshotFile {
            name: relative(self.data_dir(), &path)?,
            len,
            source: Source::Path(path),
        })
    }

    fn stat(&self, path: &Path) -> Result<u64> {
        self.shared
            .ctx
            .vfs
            .open(path, OpenMode::Read)
            .and_then(|f| f.file_len())
            .map_err(|e| Error::io(format!("snapshot: stat {}", path.display()), e))
    }

    /// The snapshot's files, in the order a copy should write them (the
    /// manifest last but one and the journal last are not needed: recovery
    /// reads the copy only once it is whole). Merges the manifest's runs:
    /// O(state), no lock held.
    pub fn files(&self) -> Result<Vec<SnapshotFile>> {
        let ctx = &self.shared.ctx;
        let m = &self.held.manifest;
        let end = self.held.journal_end;
        let dd = self.data_dir().to_owned();
        let mut out = Vec::new();
        let format = crate::state::format::path(&dd);
        out.push(self.file(format.clone(), self.stat(&format)?)?);
        let mpath = manifest::manifest_path(&manifest::manifest_dir(&dd), m.ckpt_seq);
        out.push(self.file(mpath.clone(), self.stat(&mpath)?)?);
        let sdir = dd.join("state");
        for r in &m.runs {
            for p in &r.parts {
                out.push(self.file(
                    sdir.join(run::part_file_name(p.run_seq, p.part)),
                    p.file_len,
                )?);
            }
        }
        // The groups' records as M stored them: segments to copy, and how
        // far into each cold file M's extents reach.
        let mut segments: Vec<(u64, u64, u64)> = Vec::new();
        let mut shared_ends: std::collections::BTreeMap<u32, u64> =
            m.pinned.iter().map(|&raw| (raw as u32, 0)).collect();
        crate::state::checkpointer::with_merge(ctx, &m.runs, true, |items| {
            for item in items {
                if let Item::GroupPut(rec) = item? {
                    for &(base, bytes) in &rec.segments {
                        segments.push((rec.group, base, bytes));
                    }
                    for &(file, offset, bytes, _) in rec.small.iter().flat_map(|s| &s.extents) {
                        let e = shared_ends.entry(file).or_insert(0);
                        *e = (*e).max(u64::from(offset) + u64::from(bytes));
                    }
                }
            }
            Ok::<(), String>(())
        })
        .and_then(|r| r)
        .map_err(|reason| Error::Corrupt {
            path: sdir.clone(),
            group: None,
            offset: 0,
            reason: format!("snapshot: the runs of checkpoint {}: {reason}", m.ckpt_seq),
        })?;
        let jdir = crate::commit::journal::journal_dir(&dd);
        for (&raw, &end_of_extents) in &shared_ends {
            let f = FileId::from_raw(raw);
            match f.kind() {
                // Journal files before the replay window are sealed: whole.
                FileKind::Journal if f.seq() < m.replay_journal_seq => {
                    let path = crate::commit::journal::journal_path(&jdir, f.seq());
                    let len = self.stat(&path)?;
                    out.push(self.file(path, len)?);
                }
                FileKind::Journal => {} // in the window, below
                FileKind::Cold => {
                    let path = jdir.join(crate::logs::cold::file_name(f.seq()));
                    let len = end_of_extents.max(crate::logs::cold::COLD_HEADER_BYTES as u64);
                    out.push(self.file(path, len)?);
                }
            }
        }
        if end.seq < m.replay_journal_seq {
            return Err(Error::WritesStopped {
                reason: format!(
                    "snapshot: journal end {} before checkpoint {}'s replay file {} \
                     (an invariant of pins::Holds is broken)",
                    end.seq, m.ckpt_seq, m.replay_journal_seq
                ),
            });
        }
        for (seq, path) in crate::commit::journal::list(&*ctx.vfs, &jdir)? {
            if seq < m.replay_journal_seq || seq > end.seq {
                continue;
            }
            let len = if seq == end.seq {
                end.len
            } else {
                self.stat(&path)?
            };
            out.push(self.file(path, len)?);
        }
        for (group, base, bytes) in segments {
            let path = crate::logs::group_log::group_dir(&dd, group)
                .join(crate::logs::segment::file_name(base));
            out.push(SnapshotFile {
                name: relative(&dd, &path)?,
                len: bytes,
                source: Source::Segment { group, base },
            });
        }
        Ok(out)
    }

    /// Opens `f` for reading. `None`: a segment file that is gone, which
    /// only a group deleted before the snapshot began can show (its
    /// DeleteGroup is in the journal prefix, and recovery from the copy
    /// deletes it again, as after a crash then).
    pub fn open(&self, f: &SnapshotFile) -> Result<Option<SnapshotReader>> {
        let vfs = &*self.shared.ctx.vfs;
        let reader = |path: PathBuf, file| SnapshotReader {
            file,
            path,
            len: f.len,
            at: 0,
        };
        match &f.source {
            Source::Path(path) => {
                let file = vfs
                    .open(path, OpenMode::Read)
                    .map_err(|e| Error::io(format!("snapshot: open {}", path.display()), e))?;
                Ok(Some(reader(path.clone(), file)))
            }
            Source::Segment { group, base } => {
                let holds = &self.holds;
                let name = crate::logs::segment::file_name(*base);
                let in_place =
                    crate::logs::group_log::group_dir(self.data_dir(), *group).join(&name);
                for _ in 0..RENAME_WAITS_MAX {
                    let path = match holds.whereabouts(self.held.id, *group) {
                        Whereabouts::Moved(dir) => dir.join(&name),
                        Whereabouts::Renaming => {
                            std::thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        Whereabouts::InPlace => in_place.clone(),
                    };
                    let opened = vfs.open(&path, OpenMode::Read);
                    // Opened in place and still not moved: the directory
                    // was the one at the snapshot's start (a new group of
                    // that id can only be made after the move is noted).
                    if path == in_place
                        && holds.whereabouts(self.held.id, *group) != Whereabouts::InPlace
                    {
                        continue;
                    }
                    return match opened {
                        Ok(file) => Ok(Some(reader(path, file))),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                            log::warn!(
                                "snapshot: {} is gone (group {group} deleted before the \
                                 snapshot began); left out",
                                path.display()
                            );
                            Ok(None)
                        }
                        Err(e) => Err(Error::io(format!("snapshot: open {}", path.display()), e)),
                    };
                }
                Err(Error::io(
                    format!("snapshot: open {}", in_place.display()),
                    std::io::ErrorKind::TimedOut.into(),
                ))
            }
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        self.holds.release(self.held.id);
    }
}

impl SnapshotReader {
    /// Bytes left to read.
    pub fn remaining(&self) -> u64 {
        self.len - self.at
    }

    /// Reads the next `min(buf.len(), remaining)` bytes into `buf`;
    /// returns how many (0 at the end). A file shorter than the snapshot
    /// says is an error (something broke the hold's invariant, or damage).
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let n = buf.len().min(self.remaining() as usize);
        if n == 0 {
            return Ok(0);
        }
        self.file
            .read_exact_at(&mut buf[..n], self.at)
            .map_err(|e| {
                Error::io(
                    format!(
                        "snapshot: read {} bytes at {} of {} (needs {})",
                        n,
                        self.at,
                        self.path.display(),
                        self.len
                    ),
                    e,
                )
            })?;
        self.at += n as u64;
        Ok(n)
    }
}

/// `path` relative to `dd`, `/`-separated.
fn relative(dd: &Path, path: &Path) -> Result<String> {
    let rel = path.strip_prefix(dd).map_err(|_| Error::WritesStopped {
        reason: format!("snapshot: {} is outside the data directory", path.display()),
    })?;
    let parts: Option<Vec<&str>> = rel.components().map(|c| c.as_os_str().to_str()).collect();
    parts
        .map(|p| p.join("/"))
        .ok_or_else(|| Error::WritesStopped {
            reason: format!("snapshot: {} is not UTF-8", path.display()),
        })
}
