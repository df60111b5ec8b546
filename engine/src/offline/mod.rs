//! **Subsystem `offline`**: reading, checking and repairing the data
//! directory of a *stopped* node (`tidemark ctl`), with the engine's own
//! readers and writers (format check, manifest and run merge, segment
//! header, record and frame decoders, the run writer and manifest store):
//! nothing here parses a byte layout of its own.
//!
//! - [`DataDir::open`]: the `FORMAT` check, the `LOCK` (held for as long
//!   as the value lives, so a node cannot start meanwhile, and refused when
//!   a node holds it), the newest valid manifest and the merge of its runs
//!   into the group records and member rows it names. Nothing is written.
//! - [`DataDir::inspect`], [`DataDir::records`], [`DataDir::journal`]:
//!   what the directory holds, a group's records (`walk.rs`), the frames
//!   and entries of journal files.
//! - [`DataDir::verify`] (`verify.rs`): every CRC and every checked
//!   invariant of format-spec/storage.md section 8 that the node would read;
//!   [`DataDir::verify_with_progress`] also reports how far it is
//!   (`progress.rs`).
//! - [`DataDir::plan_repair`] and [`DataDir::repair`] (`repair.rs`): what
//!   an operator may do to a damaged group, first as a plan to print, then
//!   done as crash-safe steps.
//!
//! Representation: the merged checkpoint state in memory (a group record
//! and the member rows per group, `BTreeMap`s by id): an offline tool
//! reads the whole state once, like recovery does, and costs memory in
//! proportion to it. Group files are read when a command needs them.
//!
//! Invariant: nothing in this subsystem writes to the directory except
//! [`DataDir::repair`], and it only writes what a plan it was given says.

#[cfg(test)]
mod damage_table_tests;
pub(crate) mod progress;
pub(crate) mod repair;
#[cfg(test)]
mod tests;
pub(crate) mod verify;
pub(crate) mod walk;

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::commit::journal::{self, frame::FrameIter, EntryKind, JOURNAL_HEADER_BYTES};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::io::OsVfs;
use crate::logs::group_log::LogContext;
use crate::logs::record::{self, RECORD_HEADER_BYTES};
use crate::state::damage::{self, Located};
use crate::state::manifest::{self, Manifest};
use crate::state::pins::Holds;
use crate::state::{checkpointer, GroupRecord, Item};

pub use progress::{Reading, VerifyProgress};
pub use repair::{RepairPlan, RepairTarget};
pub use verify::{Finding, Verified};

/// A stopped node's data directory, opened for reading (and, through a
/// plan, for repair). Holds the directory's `LOCK` while it lives.
pub struct DataDir {
    path: PathBuf,
    /// The locked `LOCK` file (`None` when the directory has none: no node
    /// ever opened it, or someone removed it).
    _lock: Option<File>,
    ctx: LogContext,
    /// The manifest in force and its file, if one was usable.
    manifest: Option<(PathBuf, Manifest)>,
    /// The valid manifest before the one in force: the fallback recovery
    /// uses if the newest is lost, whose runs must be intact too.
    fallback: Option<(PathBuf, Manifest)>,
    /// Manifests newer than the one in force that were rejected, each
    /// with where its damage is (the manifest itself, or the run part
    /// and offset that kept its runs from merging: `damage.rs`).
    rejected: Vec<(PathBuf, Located)>,
    groups: BTreeMap<u64, GroupRecord>,
    members: BTreeMap<u64, Vec<Member>>,
    /// The user index's entries, `(user, group)` ascending (the merge's
    /// order): `verify` checks they cover every member row.
    user_index: Vec<(u64, u64)>,
}

/// One membership as the checkpoint records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub user: u64,
    pub cursor: u64,
    pub join_point: u64,
}

/// What `ctl inspect` shows.
#[derive(Clone, Debug)]
pub struct Inspection {
    pub path: PathBuf,
    /// The manifest in force: file, checkpoint seq, clean shutdown, replay
    /// position (journal file, lsn, round), runs `(seq, parts, items,
    /// bytes)`, pinned shared files (as stored: 2^31 + seq for cold files).
    pub manifest: Option<ManifestInfo>,
    pub rejected_manifests: Vec<(PathBuf, String)>,
    /// `(seq, bytes, first_lsn, first_round)` per journal file (lsn and
    /// round 0 when the header is unreadable).
    pub journal_files: Vec<(u64, u64, u64, u64)>,
    /// `(seq, bytes)` per cold file.
    pub cold_files: Vec<(u64, u64)>,
    pub groups: Vec<OfflineGroup>,
}

#[derive(Clone, Debug)]
pub struct ManifestInfo {
    pub file: PathBuf,
    pub ckpt_seq: u64,
    pub clean: bool,
    pub replay_journal_seq: u64,
    pub replay_lsn: u64,
    pub replay_round: u64,
    pub runs: Vec<(u64, usize, u64, u64)>,
    pub pinned: Vec<u64>,
    /// The manifest's bounds on any user's groups and on the groups
    /// (`None`: unknown, a version 2 manifest).
    pub groups_per_user_bound: Option<u64>,
    pub groups_bound: Option<u64>,
}

/// One group as the checkpoint records it.
#[derive(Clone, Debug)]
pub struct OfflineGroup {
    pub id: u64,
    /// `"segments"`, `"small"` (records in journal or cold files),
    /// `"empty"` (no record yet) or `"damaged"`.
    pub kind: &'static str,
    pub head: u64,
    /// The oldest id served.
    pub floor: u64,
    pub applied_lsn: u64,
    pub members: Vec<Member>,
    /// `(base, recorded bytes, file bytes or None when missing)`.
    pub segments: Vec<(u64, u64, Option<u64>)>,
    /// `(file as stored, offset, bytes, count)` of a small group.
    pub extents: Vec<(u32, u32, u32, u32)>,
    pub damaged: Option<String>,
    /// Retention policy `(by_cursor, max_age_ms, max_bytes)`.
    pub retention: (bool, u64, u64),
}

/// A record as `ctl dump` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DumpRecord {
    pub msg_id: u64,
    pub timestamp_ms: u64,
    pub sender_id: u64,
    pub client_msg_id: u64,
    pub shape: RecordShape,
    /// What the record carries for a reader: a message's payload, an
    /// edit's new payload (after its target id); empty for the others (an
    /// erased message's zeros are not shown).
    pub payload: Vec<u8>,
    pub file: PathBuf,
    pub offset: u64,
}

/// What a stored record is (format-spec/storage.md section 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordShape {
    Message,
    /// A recalled message in erased form (payload zeros, `flags` bit 0).
    Erased,
    Edit {
        target: u64,
    },
    Recall {
        target: u64,
    },
    /// An id lost to damage, written by `ctl repair`.
    Gap,
}

impl RecordShape {
    /// The record's shape and what it carries for a reader (module docs of
    /// [`DumpRecord::payload`]), from its verified bytes.
    fn of(header: &record::RecordHeader, bytes: &[u8]) -> (RecordShape, Vec<u8>) {
        let body = &bytes[RECORD_HEADER_BYTES..];
        // A verified edit or recall starts with its 8-byte target id.
        let target = || {
            let mut id = [0u8; 8];
            id.copy_from_slice(&body[..record::TARGET_BYTES]);
            u64::from_le_bytes(id)
        };
        match header.kind {
            record::KIND_EDIT => (
                RecordShape::Edit { target: target() },
                body[record::TARGET_BYTES..].to_vec(),
            ),
            record::KIND_RECALL => (RecordShape::Recall { target: target() }, Vec::new()),
            record::KIND_GAP => (RecordShape::Gap, Vec::new()),
            _ if record::peek_erased(bytes) => (RecordShape::Erased, Vec::new()),
            _ => (RecordShape::Message, body.to_vec()),
        }
    }

    /// The name `ctl dump` prints (text and JSON).
    pub fn name(&self) -> &'static str {
        match self {
            RecordShape::Message => "message",
            RecordShape::Erased => "erased",
            RecordShape::Edit { .. } => "edit",
            RecordShape::Recall { .. } => "recall",
            RecordShape::Gap => "gap",
        }
    }

    /// The message an edit or a recall names.
    pub fn target(&self) -> Option<u64> {
        match self {
            RecordShape::Edit { target } | RecordShape::Recall { target } => Some(*target),
            _ => None,
        }
    }
}

/// What `ctl dump` finds in a group's id range: its records, and the
/// damage the walk met (as text).
#[derive(Clone, Debug, Default)]
pub struct Dump {
    pub records: Vec<DumpRecord>,
    pub damage: Vec<String>,
}

/// A journal frame as `ctl dump --journal` shows it.
#[derive(Clone, Debug)]
pub struct JournalFrame {
    pub offset: u64,
    pub lsn: u64,
    /// 0 for a Local frame.
    pub round: u64,
    pub synced_len: u64,
    /// `(kind name, group, summary of the body)`.
    pub entries: Vec<(&'static str, u64, String)>,
}

/// A journal file's frames, and why the walk stopped early (if it did).
#[derive(Clone, Debug)]
pub struct JournalDump {
    pub seq: u64,
    pub path: PathBuf,
    pub header: Option<String>,
    pub frames: Vec<JournalFrame>,
    pub stop: Option<(u64, String)>,
}

/// The engine's data directory inside a replica set member's directory
/// (`serve --cluster-*`: `engine/` beside `raft/`, cluster.md section 2),
/// if `path` is one.
pub fn member_engine(path: &Path) -> Option<PathBuf> {
    let engine = path.join("engine");
    (path.join("raft").is_dir() && crate::state::format::path(&engine).is_file()).then_some(engine)
}

impl DataDir {
    /// Opens `path` read-only: refuses a directory that is not a tidemark
    /// data directory of this format, and one a running node holds (its
    /// `LOCK`, storage.md section 2) with `Error::Locked`.
    pub fn open(path: &Path) -> Result<DataDir> {
        let vfs: Arc<dyn crate::io::Vfs> = Arc::new(OsVfs);
        if !path.is_dir() {
            return Err(Error::io(
                format!("open data directory {}", path.display()),
                std::io::ErrorKind::NotFound.into(),
            ));
        }
        if crate::state::format::check(&*vfs, path)? == crate::state::format::Found::Empty {
            return Err(Error::NotADataDir {
                path: path.to_owned(),
                member_engine: member_engine(path),
            });
        }
        let lock = lock(path)?;
        let ctx = LogContext::new(vfs, Config::new(path), Arc::new(Holds::default()));
        let mut dir = DataDir {
            path: path.to_owned(),
            _lock: lock,
            ctx,
            manifest: None,
            fallback: None,
            rejected: Vec::new(),
            groups: BTreeMap::new(),
            members: BTreeMap::new(),
            user_index: Vec::new(),
        };
        dir.load_state()?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The newest manifest that passes its checks and whose runs merge,
    /// as recovery picks it (storage.md section 11, step 2).
    fn load_state(&mut self) -> Result<()> {
        let mdir = manifest::manifest_dir(&self.path);
        let list = if mdir.exists() {
            manifest::list(&*self.ctx.vfs, &mdir)?
        } else {
            Vec::new()
        };
        let mut newest_first = list.iter().rev();
        for (seq, path) in newest_first.by_ref() {
            let (reason, located) = match manifest::load(&*self.ctx.vfs, path)? {
                Err(reason) => (reason, None),
                Ok(m) if m.ckpt_seq != *seq => (format!("names checkpoint {}", m.ckpt_seq), None),
                Ok(m) => match self.merge(&m) {
                    Ok(()) => {
                        self.manifest = Some((path.clone(), m));
                        // The one before it is the kept fallback (as the
                        // node's checkpointer keeps it, section 9 K7).
                        for (seq, path) in newest_first {
                            if let Ok(Ok(m)) = manifest::load(&*self.ctx.vfs, path) {
                                if m.ckpt_seq == *seq {
                                    self.fallback = Some((path.clone(), m));
                                    break;
                                }
                            }
                        }
                        return Ok(());
                    }
                    Err(reason) => {
                        self.groups.clear();
                        self.members.clear();
                        self.user_index.clear();
                        let at = damage::locate_run_damage(&*self.ctx.vfs, &self.path, &m.runs);
                        (reason, at)
                    }
                },
            };
            let located = located.unwrap_or(Located {
                path: path.clone(),
                offset: 0,
                why: reason,
            });
            self.rejected.push((path.clone(), located));
        }
        Ok(())
    }

    /// The first journal file from the checkpoint's replay position on
    /// that holds frames, with its length: something was written after the
    /// checkpoint in force, whatever its `clean` flag says
    /// (`damage::frames_after_checkpoint`).
    pub(crate) fn frames_after_checkpoint(&self) -> Result<Option<(PathBuf, u64)>> {
        let Some((_, m)) = &self.manifest else {
            return Ok(None);
        };
        damage::frames_after_checkpoint(&*self.ctx.vfs, &self.path, m.replay_journal_seq)
    }

    fn merge(&mut self, m: &Manifest) -> std::result::Result<(), String> {
        let (groups, members, index) = (&mut self.groups, &mut self.members, &mut self.user_index);
        checkpointer::with_merge(&self.ctx, &m.runs, true, |items| {
            for item in items {
                match item? {
                    Item::GroupPut(rec) => {
                        groups.insert(rec.group, *rec);
                    }
                    Item::MemberPut {
                        group,
                        user,
                        cursor,
                        join_point,
                    } => members.entry(group).or_default().push(Member {
                        user,
                        cursor,
                        join_point,
                    }),
                    Item::IndexPut { user, group } => index.push((user, group)),
                    other => return Err(format!("a full merge yielded {other:?}")),
                }
            }
            Ok(())
        })?
    }

    /// What the directory holds: the checkpoint, journal and cold files,
    /// and every group with its members and files.
    pub fn inspect(&self) -> Result<Inspection> {
        let jdir = journal::journal_dir(&self.path);
        let mut journal_files = Vec::new();
        let mut cold_files = Vec::new();
        if jdir.exists() {
            for (seq, path) in journal::list(&*self.ctx.vfs, &jdir)? {
                let bytes = file_len(&path).unwrap_or(0);
                let mut head = [0u8; JOURNAL_HEADER_BYTES];
                let h = File::open(&path)
                    .and_then(|f| std::os::unix::fs::FileExt::read_exact_at(&f, &mut head, 0))
                    .ok()
                    .and_then(|()| journal::decode_header_of(&head).ok());
                journal_files.push((
                    seq,
                    bytes,
                    h.map_or(0, |h| h.first_lsn),
                    h.map_or(0, |h| h.first_round),
                ));
            }
            for path in self.ctx.vfs.read_dir(&jdir).unwrap_or_default() {
                if let Some(seq) = crate::logs::cold::parse_file_name(&path) {
                    cold_files.push((seq, file_len(&path).unwrap_or(0)));
                }
            }
            cold_files.sort_unstable();
        }
        let manifest = self.manifest.as_ref().map(|(file, m)| ManifestInfo {
            file: file.clone(),
            ckpt_seq: m.ckpt_seq,
            clean: m.clean,
            replay_journal_seq: m.replay_journal_seq,
            replay_lsn: m.replay_lsn,
            replay_round: m.replay_round,
            runs: m
                .runs
                .iter()
                .map(|r| (r.run_seq, r.parts.len(), r.items(), r.bytes()))
                .collect(),
            pinned: m.pinned.clone(),
            groups_per_user_bound: m.groups_per_user_bound,
            groups_bound: m.groups_bound,
        });
        let groups = self.groups.values().map(|g| self.group_info(g)).collect();
        Ok(Inspection {
            path: self.path.clone(),
            manifest,
            rejected_manifests: self
                .rejected
                .iter()
                .map(|(p, at)| (p.clone(), at.describe()))
                .collect(),
            journal_files,
            cold_files,
            groups,
        })
    }

    fn group_info(&self, g: &GroupRecord) -> OfflineGroup {
        let kind = if g.damaged.is_some() {
            "damaged"
        } else if g.small.is_some() {
            "small"
        } else if g.segments.is_empty() {
            "empty"
        } else {
            "segments"
        };
        let floor = match (&g.small, g.segments.first()) {
            (Some(s), _) => s.floor,
            (None, Some(&(base, _))) => base,
            (None, None) => g.head + 1,
        };
        OfflineGroup {
            id: g.group,
            kind,
            head: g.head,
            floor,
            applied_lsn: g.applied_lsn,
            members: self.members.get(&g.group).cloned().unwrap_or_default(),
            segments: g
                .segments
                .iter()
                .map(|&(base, len)| {
                    let path = walk::segment_path(&self.path, g.group, base);
                    (base, len, file_len(&path))
                })
                .collect(),
            extents: g.small.as_ref().map_or(Vec::new(), |s| s.extents.clone()),
            damaged: g.damaged.clone(),
            retention: (
                g.retention.by_cursor,
                g.retention.max_age_ms,
                g.retention.max_bytes,
            ),
        }
    }

    /// The records of `group` with ids in `from..=to` (below the floor
    /// none), gap records included, and the damage the walk met.
    pub fn records(&self, group: u64, from: u64, to: u64) -> Result<Dump> {
        let g = self.group(group)?;
        let floor = self.group_info(g).floor;
        let mut out = Dump::default();
        let walked = walk::walk_group(&self.path, g, &mut |ev| match ev {
            walk::Event::Record {
                header,
                bytes,
                file,
                offset,
            } if header.msg_id >= floor.max(from) && header.msg_id <= to => {
                let (shape, payload) = RecordShape::of(&header, bytes);
                out.records.push(DumpRecord {
                    msg_id: header.msg_id,
                    timestamp_ms: header.timestamp_ms,
                    sender_id: header.sender_id,
                    client_msg_id: header.client_msg_id,
                    shape,
                    payload,
                    file: file.to_owned(),
                    offset,
                })
            }
            walk::Event::Record { .. } => {}
            other => out.damage.push(walk::describe(&other)),
        })?;
        if !walked {
            out.damage.push(format!(
                "group {group} was found damaged while small: the checkpoint does not say \
                 where its records are"
            ));
        }
        Ok(out)
    }

    fn group(&self, group: u64) -> Result<&GroupRecord> {
        self.groups
            .get(&group)
            .ok_or(Error::GroupNotFound { group })
    }

    /// The frames and entries of journal file `seq` (every file if `None`).
    pub fn journal(&self, seq: Option<u64>) -> Result<Vec<JournalDump>> {
        let jdir = journal::journal_dir(&self.path);
        let files = if jdir.exists() {
            journal::list(&*self.ctx.vfs, &jdir)?
        } else {
            Vec::new()
        };
        let mut out = Vec::new();
        for (s, path) in files {
            if seq.is_some_and(|want| want != s) {
                continue;
            }
            out.push(dump_journal_file(s, &path)?);
        }
        if let Some(want) = seq {
            if out.is_empty() {
                return Err(Error::io(
                    format!("journal file {want} in {}", jdir.display()),
                    std::io::ErrorKind::NotFound.into(),
                ));
            }
        }
        Ok(out)
    }
}

/// Walks one journal file's frames with the replay's checked walk.
fn dump_journal_file(seq: u64, path: &Path) -> Result<JournalDump> {
    let bytes = walk::read_file(path)?.unwrap_or_default();
    let mut dump = JournalDump {
        seq,
        path: path.to_owned(),
        header: None,
        frames: Vec::new(),
        stop: None,
    };
    if bytes.is_empty() {
        dump.header = Some("empty file (0 bytes)".into());
        return Ok(dump);
    }
    let h = match journal::decode_header_of(&bytes) {
        Ok(h) => h,
        Err(why) => {
            dump.stop = Some((0, format!("journal header: {why}")));
            return Ok(dump);
        }
    };
    dump.header = Some(format!(
        "seq {} first_lsn {} first_round {} segments_may_lead {}",
        h.seq,
        h.first_lsn,
        h.first_round,
        h.segments_may_lead()
    ));
    let mut it = FrameIter::new(
        &bytes,
        JOURNAL_HEADER_BYTES,
        h.mark_key,
        h.first_lsn,
        h.first_round,
    );
    for f in it.by_ref() {
        let round =
            crate::commit::journal::frame::payload_header(f.payload).map_or(0, |p| p.round_index);
        let entries = f
            .entries()
            .map(|e| (kind_name(e.kind), e.group_id, body_summary(e.kind, e.body)))
            .collect();
        dump.frames.push(JournalFrame {
            offset: f.offset as u64,
            lsn: f.envelope.lsn,
            round,
            synced_len: f.envelope.synced_len,
            entries,
        });
    }
    if let Some(why) = it.stop_reason() {
        dump.stop = Some((it.position() as u64, why.to_owned()));
    }
    Ok(dump)
}

fn kind_name(k: EntryKind) -> &'static str {
    match k {
        EntryKind::Records => "Records",
        EntryKind::CreateGroup => "CreateGroup",
        EntryKind::DeleteGroup => "DeleteGroup",
        EntryKind::Join => "Join",
        EntryKind::Leave => "Leave",
        EntryKind::Cursors => "Cursors",
        EntryKind::SetRetention => "SetRetention",
        EntryKind::ClearHistory => "ClearHistory",
    }
}

/// A body in one line, through `journal::body` (the one decoder).
fn body_summary(kind: EntryKind, body: &[u8]) -> String {
    use crate::commit::journal::entry::body as b;
    let bad = || format!("malformed body of {} bytes", body.len());
    match kind {
        EntryKind::Records => b::decode_records(body).map_or_else(bad, |(first, n)| {
            format!("msg_ids {first}..={} ({} bytes)", first + n - 1, body.len())
        }),
        EntryKind::CreateGroup | EntryKind::DeleteGroup => String::new(),
        EntryKind::Join => b::decode_join(body)
            .map_or_else(bad, |(user, cursor)| format!("user {user} cursor {cursor}")),
        EntryKind::Leave => b::decode_leave(body).map_or_else(bad, |user| format!("user {user}")),
        EntryKind::Cursors => b::decode_cursors(body)
            .map(|(user, cursor)| format!("{user}:{cursor}"))
            .collect::<Vec<_>>()
            .join(" "),
        EntryKind::SetRetention => b::decode_set_retention(body).map_or_else(bad, |r| {
            format!(
                "by_cursor {} max_age_ms {} max_bytes {}",
                r.by_cursor, r.max_age_ms, r.max_bytes
            )
        }),
        EntryKind::ClearHistory => b::decode_clear_history(body)
            .map_or_else(bad, |(user, up_to)| format!("user {user} up_to {up_to}")),
    }
}

fn file_len(path: &Path) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.len())
}

/// Takes `LOCK` (exclusive, non-blocking, once): a running node holds it.
/// A directory without one is opened unlocked (nothing is created).
fn lock(data_dir: &Path) -> Result<Option<File>> {
    let path = data_dir.join("LOCK");
    let file = match File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("open {}", path.display()), e)),
    };
    // SAFETY: flock on a valid open descriptor; no memory is shared.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let holder = crate::state::recovery::lock_holder(&path);
        return Err(Error::Locked { path, holder });
    }
    Ok(Some(file))
}
