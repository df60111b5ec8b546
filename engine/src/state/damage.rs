//! What counts as damage to the files a checkpoint stands on, decided once
//! for the three readers that must agree on it: recovery (the node refuses
//! to open), `ctl verify` (exit status 1, naming the file and the offset)
//! and `ctl repair` (what it fixes, or why it refuses). format-spec/
//! storage.md sections 10, 11 and 19 state the rules; each is one function
//! here:
//!
//! - [`judge_journal_header`]: a journal file's header, given whether the
//!   header was durable before anything relied on it
//!   ([`journal_header_durable`]). A file without a valid header that no
//!   checkpoint named and that holds no frame may be a crash while it was
//!   created (a *torn* file); it is damage as soon as a later file holds
//!   frames (the writer made it durable before it made the later file).
//! - [`locate_run_damage`]: the run part, and the offset in it, that keeps
//!   a manifest's runs from merging.
//! - [`data_without_checkpoint`]: a directory with no manifest is new only
//!   if it holds no data; otherwise its checkpoint state was lost.
//! - [`frames_after_checkpoint`]: a manifest's `clean` flag says that
//!   nothing was written *when it was stored*; a node started again later
//!   writes frames to a new journal file without storing a checkpoint until
//!   one is due. "Clean" is what the journal shows, not the flag.
//! - [`find_strays`]: files under `groups/` that no group explains (the
//!   node sweeps them at open, verify notes them).
//!
//! Costs: header and length checks are one read each; locating run damage
//! reads the parts once and runs only when a merge failed; the stray search
//! lists each shard directory once and looks up one file per group
//! directory.

use std::path::{Path, PathBuf};

use crate::commit::journal::{self, JournalHeader, JOURNAL_HEADER_BYTES};
use crate::error::{Error, Result};
use crate::io::{OpenMode, Vfs};
use crate::logs::segment::{self, SEGMENT_HEADER_BYTES};
use crate::state::manifest::RunMeta;
use crate::state::run;

/// What a journal file's header says about the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HeaderVerdict {
    /// 0 bytes, and nothing relied on its header: it holds no frame.
    Empty,
    Valid(JournalHeader),
    /// An intact header of a version this build does not read (offset 8).
    Unsupported(u16),
    /// No valid header, in a file of at most a header's length that no
    /// checkpoint names: a crash while it was created, nothing in it
    /// acknowledged. Its torn part starts at offset 0; it is damage if a
    /// later journal file holds frames (section 11, step 4).
    Torn(String),
    /// The checkpoint in force names the file (and is not a clean
    /// shutdown's): its header was durable before that checkpoint was
    /// stored, so an invalid one (or none) is damage.
    DamagedNamed(String),
    /// The file is longer than a header, so it holds frames, and the
    /// writer syncs a header before it writes a frame: damage.
    DamagedWithFrames(String),
}

/// Whether journal file `seq`'s header was durable before the checkpoint in
/// force was stored: the file it names as its replay start, unless that
/// checkpoint is a clean shutdown's (the file then held no frame, so
/// damage to it loses nothing). `checkpoint` is `(replay_journal_seq,
/// clean)` of the checkpoint in force, if one is.
pub(crate) fn journal_header_durable(checkpoint: Option<(u64, bool)>, seq: u64) -> bool {
    checkpoint.is_some_and(|(replay_from, clean)| !clean && seq == replay_from)
}

/// Judges the header of a journal file whose bytes are `bytes` (the whole
/// file, or at least its first 48 bytes and its true length `len`).
pub(crate) fn judge_journal_header(bytes: &[u8], len: u64, header_durable: bool) -> HeaderVerdict {
    if len == 0 {
        return if header_durable {
            HeaderVerdict::DamagedNamed("journal file is empty (0 bytes)".into())
        } else {
            HeaderVerdict::Empty
        };
    }
    if let Some(version) = journal::unsupported_version(bytes) {
        return HeaderVerdict::Unsupported(version);
    }
    match journal::decode_header_of(bytes) {
        Ok(h) => HeaderVerdict::Valid(h),
        Err(why) if header_durable => HeaderVerdict::DamagedNamed(why),
        Err(why) if len > JOURNAL_HEADER_BYTES as u64 => HeaderVerdict::DamagedWithFrames(why),
        Err(why) => HeaderVerdict::Torn(why),
    }
}

/// Where a checkpoint's state is damaged: the file, the offset in it and
/// why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Located {
    pub path: PathBuf,
    pub offset: u64,
    pub why: String,
}

impl Located {
    pub fn describe(&self) -> String {
        format!(
            "{} offset {}: {}",
            self.path.display(),
            self.offset,
            self.why
        )
    }
}

/// The first run part of `runs` (newest run first, parts in order) that
/// is missing, of another length than its manifest entry says, or fails
/// any check of section 6.2, with the offset of the damage (`run::
/// check_part`). `None` when every part passes on its own (the merge then
/// failed on something between parts).
pub(crate) fn locate_run_damage(
    vfs: &dyn Vfs,
    data_dir: &Path,
    runs: &[RunMeta],
) -> Option<Located> {
    let dir = data_dir.join("state");
    for meta in runs.iter().flat_map(|r| &r.parts) {
        let path = dir.join(run::part_file_name(meta.run_seq, meta.part));
        let at = |offset: u64, why: String| {
            Some(Located {
                path: path.clone(),
                offset,
                why,
            })
        };
        let file = match vfs.open(&path, OpenMode::Read) {
            Ok(f) => f,
            Err(e) => return at(0, format!("run part cannot be opened: {e}")),
        };
        let len = match file.file_len() {
            Ok(l) => l,
            Err(e) => return at(0, format!("run part cannot be measured: {e}")),
        };
        if len != meta.file_len {
            return at(
                len.min(meta.file_len),
                format!(
                    "run part is {len} bytes, the manifest says {}",
                    meta.file_len
                ),
            );
        }
        let Ok(size) = usize::try_from(len) else {
            return at(0, format!("run part of {len} bytes"));
        };
        let map = match file.map(size) {
            Ok(m) => m,
            Err(e) => return at(0, format!("run part cannot be mapped: {e}")),
        };
        if let Err((offset, why)) = run::check_part(&map, meta) {
            return at(offset, why);
        }
    }
    None
}

/// The entries of `dir`, none if it does not exist.
fn list(vfs: &dyn Vfs, dir: &Path) -> Result<Vec<PathBuf>> {
    match vfs.read_dir(dir) {
        Ok(v) => Ok(v),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(format!("list {}", dir.display()), e)),
    }
}

fn file_len(vfs: &dyn Vfs, path: &Path) -> u64 {
    vfs.open(path, OpenMode::Read)
        .and_then(|f| f.file_len())
        .unwrap_or(0)
}

/// A data file in a directory that has no manifest: a run part, a cold
/// file, a journal file that holds frames (longer than its header), or
/// anything in a shard directory under `groups/`. A new directory has none
/// (its first open stores a manifest before any frame is written), so any
/// of them means the checkpoint state was lost.
pub(crate) fn data_without_checkpoint(vfs: &dyn Vfs, data_dir: &Path) -> Result<Option<PathBuf>> {
    for path in list(vfs, &data_dir.join("state"))? {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if run::parse_part_file_name(name).is_some() {
            return Ok(Some(path));
        }
    }
    let jdir = journal::journal_dir(data_dir);
    for path in list(vfs, &jdir)? {
        if crate::logs::cold::parse_file_name(&path).is_some() {
            return Ok(Some(path));
        }
    }
    let journals = if vfs.exists(&jdir) {
        journal::list(vfs, &jdir)?
    } else {
        Vec::new()
    };
    for (_, path) in journals {
        if file_len(vfs, &path) > JOURNAL_HEADER_BYTES as u64 {
            return Ok(Some(path));
        }
    }
    for shard in shard_dirs(vfs, data_dir)? {
        if let Some(first) = list(vfs, &shard)?.into_iter().next() {
            return Ok(Some(first));
        }
    }
    Ok(None)
}

/// The shard directories under `groups/` (names of 3 hex digits; the
/// trash is not one).
fn shard_dirs(vfs: &dyn Vfs, data_dir: &Path) -> Result<Vec<PathBuf>> {
    Ok(list(vfs, &data_dir.join("groups"))?
        .into_iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.len() == 3 && n.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .collect())
}

/// The first journal file from `replay_from` on that holds more than its
/// header (so frames were written after the checkpoint that replays from
/// there), with its length.
pub(crate) fn frames_after_checkpoint(
    vfs: &dyn Vfs,
    data_dir: &Path,
    replay_from: u64,
) -> Result<Option<(PathBuf, u64)>> {
    let jdir = journal::journal_dir(data_dir);
    if !vfs.exists(&jdir) {
        return Ok(None);
    }
    for (seq, path) in journal::list(vfs, &jdir)? {
        let len = file_len(vfs, &path);
        if seq >= replay_from && len > JOURNAL_HEADER_BYTES as u64 {
            return Ok(Some((path, len)));
        }
    }
    Ok(None)
}

/// What the state says of a group's files, for the stray search.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupFiles {
    /// No such group.
    None,
    /// A group without segments (a small group, or one without a record):
    /// a directory at its path is not a stray (the files of a promotion
    /// before a crash: recovery judges them against the group's records
    /// after replay, `logs/promotion_left.rs`).
    NoSegments,
    /// A group with segments, its head, and whether the state names a
    /// segment starting just above it.
    Segments { head: u64, names_next: bool },
}

/// A file under `groups/` that no group explains.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stray {
    /// The directory of a group that does not exist.
    Directory { group: u64, path: PathBuf },
    /// A segment file named for `head + 1` of a group whose state does not
    /// name it, with its length: it holds no record when the length is at
    /// most a segment header's ([`Stray::is_empty_segment`]).
    Segment {
        group: u64,
        path: PathBuf,
        bytes: u64,
    },
}

impl Stray {
    pub fn path(&self) -> &Path {
        match self {
            Stray::Directory { path, .. } | Stray::Segment { path, .. } => path,
        }
    }

    /// A stray segment that cannot hold a record: removing it loses
    /// nothing. (One that holds records is a segment started after the
    /// checkpoint; loading the group adopts it, section 11 step 6.)
    pub fn is_empty_segment(&self) -> bool {
        matches!(self, Stray::Segment { bytes, .. } if *bytes <= SEGMENT_HEADER_BYTES as u64)
    }

    pub fn describe(&self) -> String {
        match self {
            Stray::Directory { group, .. } => format!(
                "stray directory: no group {group} exists (the node moves it to the trash at open)"
            ),
            Stray::Segment { bytes, .. } if self.is_empty_segment() => format!(
                "stray segment file of {bytes} bytes above the group's head that the checkpoint \
                 does not name; it holds no record (the node removes it at open)"
            ),
            Stray::Segment { bytes, .. } => format!(
                "segment file of {bytes} bytes above the group's head that the checkpoint does \
                 not name (the node adopts its records when it loads the group)"
            ),
        }
    }
}

/// The strays under `groups/`: directories of groups `files` says do not
/// exist, and in the directory of a group with segments, a file named for
/// `head + 1` that its state does not name. Only names this engine would
/// make are looked at (section 2).
pub(crate) fn find_strays(
    vfs: &dyn Vfs,
    data_dir: &Path,
    files: &dyn Fn(u64) -> GroupFiles,
) -> Result<Vec<Stray>> {
    let mut out = Vec::new();
    for shard in shard_dirs(vfs, data_dir)? {
        for path in list(vfs, &shard)? {
            let Some(group) = path
                .file_name()
                .and_then(|n| n.to_str())
                .filter(|n| n.len() == 16)
                .and_then(|n| u64::from_str_radix(n, 16).ok())
            else {
                continue;
            };
            if crate::logs::group_log::group_dir(data_dir, group) != path {
                continue;
            }
            match files(group) {
                GroupFiles::None => out.push(Stray::Directory { group, path }),
                GroupFiles::NoSegments => {}
                GroupFiles::Segments { head, names_next } => {
                    let Some(next) = head.checked_add(1).filter(|_| !names_next) else {
                        continue;
                    };
                    let seg = path.join(segment::file_name(next));
                    if vfs.exists(&seg) {
                        let bytes = file_len(vfs, &seg);
                        out.push(Stray::Segment {
                            group,
                            path: seg,
                            bytes,
                        });
                    }
                }
            }
        }
    }
    Ok(out)
}
