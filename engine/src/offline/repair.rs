//! `ctl repair`: what an operator may do to a damaged group of a stopped
//! node, planned first ([`DataDir::plan_repair`], which writes nothing and
//! whose [`RepairPlan::actions`] the CLI prints), then done
//! ([`DataDir::repair`], only on the operator's `--yes`).
//!
//! What a repair does (format-spec/storage.md section 19 is the
//! contract):
//!
//! - **A segmented group** whose segments are damaged (bytes that are not
//!   records, a missing file, records missing before the head): each
//!   damaged segment is written anew with every intact record the salvaging
//!   walk (`walk.rs`) found, before and after the damage, at its own id,
//!   and one **gap record** (kind 3, empty payload) per lost id, so that
//!   ids stay dense and no lost id goes to a new message. Intact segments
//!   are not touched.
//! - **A small group** (records in journal or cold files) whose records
//!   are damaged: its records from its floor to its head, intact ones and
//!   gaps for the lost ones, are written into its first segment file (the
//!   group becomes a segmented group, as a promotion would make it).
//! - **Only the state is wrong** (a group recorded damaged whose files
//!   verify, segment lengths that differ from the recorded ones: what a
//!   repair interrupted between its two steps leaves): nothing is
//!   rewritten.
//! - In every case the group is recorded again, not damaged, with its new
//!   segment list, in a **new checkpoint**: a delta run holding its group
//!   record (the run writer of checkpoints) and a manifest naming it before
//!   the runs of the manifest in force (same replay position, pins and
//!   `clean` flag). Memberships are untouched.
//! - **The journal of a clean shutdown's directory** damaged or lost
//!   (a file from the replay position on, or a pinned file): the new
//!   checkpoint replays from after every journal file present and pins
//!   only files that exist; the small groups whose records were there get
//!   gaps as above (a clean shutdown's checkpoint names every extent, so
//!   the lost ids are known exactly); segmented groups lose nothing.
//! - **Deleting a group** (`--delete-group`, for a group that cannot be
//!   repaired: one found damaged while small has no record of where its
//!   records were): a GroupDelete item in the new checkpoint, then its
//!   directory, if any, moved to `groups/trash/`, which the node empties at
//!   its next open. Its journal files are released by the node's next
//!   checkpoints.
//!
//! Crash safety, step by step: (1) each new segment is written to
//! `<name>.repair`, fdatasynced, renamed over the old file (atomic) and its
//! directory fsynced; (2) the run is written and synced; (3) the manifest
//! is stored (fdatasync, directory fsync): the repair counts from here;
//! (4) a deleted group's directory is moved to the trash. A crash before
//! (1) completes leaves the old directory (a stray `.repair` file is
//! ignored by every reader); between (1) and (3), repaired segment files
//! under the old checkpoint: `verify` reports the lengths that differ and
//! `repair` finishes by recording the state only; after (3), the repaired
//! directory (a crash before (4) leaves a directory of no group, which the
//! node moves to the trash if the id is created again).
//!
//! Repair requires a directory a clean shutdown left (its manifest's
//! `clean` set): then no journal frame follows the checkpoint, and a new
//! checkpoint with the same replay position cannot be contradicted by
//! replay. Any other directory: start the node once and stop it (a damaged
//! group does not keep it from opening).

use std::path::{Path, PathBuf};

use super::walk::{self, Event};
use super::DataDir;
use crate::error::{Error, Result};
use crate::logs::record;
use crate::logs::segment::{SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::state::manifest::{self, Manifest};
use crate::state::{checkpointer, GroupRecord, Item};

/// What to repair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepairTarget {
    /// Every group `verify` finds damaged.
    AllDamaged,
    /// One group.
    Group(u64),
    /// Delete one group (its records, memberships and files).
    DeleteGroup(u64),
}

/// A repair, planned: what it would do, as lines to print, and the bytes
/// it would write.
#[derive(Debug, Default)]
pub struct RepairPlan {
    /// One line per action, in the order they would be done.
    pub actions: Vec<String>,
    /// Groups this plan cannot repair, with why (delete them instead).
    pub unrepairable: Vec<(u64, String)>,
    /// Why nothing may be done at all (the directory is not a clean
    /// shutdown's, or has no checkpoint).
    pub refused: Option<String>,
    steps: Vec<Step>,
}

impl RepairPlan {
    /// Whether doing it would write anything.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }
}

#[derive(Debug)]
enum Step {
    /// A segment file written anew (atomically replacing any old one).
    Segment {
        group: u64,
        path: PathBuf,
        bytes: Vec<u8>,
        /// A small group's directory left at its path by an earlier
        /// incarnation goes to the trash first.
        trash_dir_first: bool,
    },
    /// The group's new record in the new checkpoint.
    Record(Box<GroupRecord>),
    /// A GroupDelete in the new checkpoint, then the directory trashed.
    Delete { group: u64 },
    /// The new checkpoint replays from journal file `seq` (after every
    /// file present) and pins `pinned` (the old pins that still exist).
    Journal { seq: u64, pinned: Vec<u64> },
}

/// A segment being rebuilt from the walk's events.
struct Rebuild {
    bytes: Vec<u8>,
    kept: u64,
    gaps: Vec<(u64, u64)>,
    last_id: u64,
}

impl Rebuild {
    fn new(group: u64, base: u64) -> Rebuild {
        let header = SegmentHeader {
            group_id: group,
            base_msg_id: base,
            created_ms: crate::now_ms(),
        };
        Rebuild {
            bytes: header.encode().to_vec(),
            kept: 0,
            gaps: Vec::new(),
            last_id: base - 1,
        }
    }

    fn keep(&mut self, id: u64, rec: &[u8]) {
        self.bytes.extend_from_slice(rec);
        self.kept += 1;
        self.last_id = id;
    }

    /// Gap records for `from..=to`, stamped `ts` (the last intact record's
    /// timestamp before them: timestamps never decrease).
    fn gap(&mut self, from: u64, to: u64, ts: u64) {
        for id in from..=to {
            record::encode_gap_into(id, ts, &mut self.bytes);
        }
        self.gaps.push((from, to));
        self.last_id = to;
    }

    fn describe(&self, path: &Path, old_len: Option<u64>) -> String {
        let gaps: Vec<String> = self
            .gaps
            .iter()
            .map(|(a, b)| format!("{a}..={b}"))
            .collect();
        format!(
            "write {} anew: {} intact records kept at their ids, gap records for msg_ids [{}] \
             ({} id(s)), {} -> {} bytes",
            path.display(),
            self.kept,
            gaps.join(", "),
            self.gaps.iter().map(|(a, b)| b - a + 1).sum::<u64>(),
            old_len.map_or("missing".to_owned(), |l| l.to_string()),
            self.bytes.len()
        )
    }
}

/// Makes the group record agree with its gaps (`gaps`: id ranges): a gap
/// is not unread (protocol.md 2.1), so its id joins the group's quiet ids
/// (`logs/changes.rs`); and a latest edit that names a lost id (the message
/// or its newest edit) is dropped, so the message reads as its stored
/// original (or, lost, as a gap) rather than through a record that is no
/// longer there.
fn record_gaps(rec: &mut GroupRecord, gaps: &[(u64, u64)]) {
    if gaps.is_empty() {
        return;
    }
    let lost = |id: u64| gaps.iter().any(|&(a, b)| (a..=b).contains(&id));
    rec.quiet.extend(gaps.iter().flat_map(|&(a, b)| a..=b));
    rec.quiet.sort_unstable();
    rec.quiet.dedup();
    rec.edits
        .retain(|&(message, edit)| !lost(message) && !lost(edit));
}

impl DataDir {
    /// Plans a repair: reads the group files, writes nothing.
    pub fn plan_repair(&self, target: RepairTarget) -> Result<RepairPlan> {
        let mut plan = RepairPlan::default();
        match &self.manifest {
            None => {
                plan.refused = Some(
                    "no checkpoint is stored in this directory: start the node on it once and \
                     stop it (SIGTERM), then repair"
                        .into(),
                );
                return Ok(plan);
            }
            Some((_, m)) if !m.clean => {
                plan.refused = Some(
                    "the node did not shut down cleanly (journal frames may follow the \
                     checkpoint): start the node on this directory once and stop it with \
                     SIGTERM (a damaged group does not keep it from opening), then repair"
                        .into(),
                );
                return Ok(plan);
            }
            Some(_) => {}
        }
        let groups: Vec<u64> = match target {
            RepairTarget::DeleteGroup(g) => {
                self.group(g)?;
                let dir = crate::logs::group_log::group_dir(&self.path, g);
                plan.actions.push(format!(
                    "group {g}: delete it (its records, {} memberships and files) with a \
                     GroupDelete in a new checkpoint{}",
                    self.members.get(&g).map_or(0, Vec::len),
                    if dir.exists() {
                        format!(", then move {} to groups/trash/", dir.display())
                    } else {
                        String::new()
                    }
                ));
                plan.steps.push(Step::Delete { group: g });
                self.plan_checkpoint(&mut plan);
                return Ok(plan);
            }
            RepairTarget::Group(g) => {
                self.group(g)?;
                vec![g]
            }
            RepairTarget::AllDamaged => {
                self.plan_journal(&mut plan)?;
                self.groups.keys().copied().collect()
            }
        };
        for g in groups {
            self.plan_group(g, &mut plan)?;
        }
        if !plan.steps.is_empty() {
            self.plan_checkpoint(&mut plan);
        }
        Ok(plan)
    }

    fn plan_checkpoint(&self, plan: &mut RepairPlan) {
        if let Some((_, m)) = &self.manifest {
            let journal = plan.steps.iter().find_map(|s| match s {
                Step::Journal { seq, .. } => Some(*seq),
                _ => None,
            });
            let run = plan
                .steps
                .iter()
                .any(|s| matches!(s, Step::Record(_) | Step::Delete { .. }));
            plan.actions.push(format!(
                "store checkpoint {} ({}manifest {}), {}",
                self.next_ckpt_seq(m),
                if run {
                    format!("run {} with the groups' new items, then ", m.next_run_seq)
                } else {
                    String::new()
                },
                manifest::manifest_path(&manifest::manifest_dir(&self.path), self.next_ckpt_seq(m))
                    .display(),
                match journal {
                    Some(seq) => format!("replay from journal file {seq}, the pins that exist"),
                    None => "replay position and pins unchanged".into(),
                }
            ));
        }
    }

    /// A clean shutdown's directory whose journal is damaged or lost: what
    /// the node would refuse or miss there (a damaged or missing file from
    /// the replay position on, a pinned file gone) is left behind by a
    /// checkpoint that replays from after every journal file present (a
    /// clean shutdown's checkpoint covers every group: nothing after its
    /// position is lost) and pins only files that exist. The small groups
    /// whose records were in a lost or damaged file get gaps for exactly
    /// those ids (`plan_group`); segmented groups lose nothing.
    fn plan_journal(&self, plan: &mut RepairPlan) -> Result<()> {
        let Some((_, m)) = &self.manifest else {
            return Ok(());
        };
        let mut v = super::Verified::default();
        self.verify_journal(&mut v)?;
        let damage: Vec<String> = v
            .findings
            .iter()
            .filter(|f| f.damage)
            .map(|f| f.to_string())
            .collect();
        if damage.is_empty() {
            return Ok(());
        }
        let jdir = crate::commit::journal::journal_dir(&self.path);
        let newest = crate::commit::journal::list(&*self.ctx.vfs, &jdir)?
            .last()
            .map_or(0, |f| f.0);
        let seq = newest.max(m.replay_journal_seq) + 1;
        let pinned: Vec<u64> = m
            .pinned
            .iter()
            .copied()
            .filter(|&p| {
                u32::try_from(p).is_ok_and(|raw| walk::shared_path(&self.path, raw).exists())
            })
            .collect();
        plan.actions.push(format!(
            "journal: {}; replay from journal file {seq} (after every file present: the clean \
             shutdown's checkpoint covers everything before), pin {} of {} pinned file(s) (the \
             others are missing)",
            damage.join("; "),
            pinned.len(),
            m.pinned.len()
        ));
        plan.steps.push(Step::Journal { seq, pinned });
        Ok(())
    }

    fn next_ckpt_seq(&self, m: &Manifest) -> u64 {
        // Above every manifest on disk, valid or not (recovery tries the
        // newest name first).
        let newest = self
            .rejected
            .iter()
            .filter_map(|(p, _)| p.file_stem()?.to_str()?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        m.ckpt_seq.max(newest) + 1
    }

    /// What repairing group `id` takes, if it needs anything.
    fn plan_group(&self, id: u64, plan: &mut RepairPlan) -> Result<()> {
        let g = self.group(id)?;
        // First walk: which files are damaged, which lengths differ.
        let mut damaged: Vec<PathBuf> = Vec::new();
        let mut lengths: Vec<(PathBuf, u64)> = Vec::new();
        let walked = walk::walk_group(&self.path, g, &mut |ev| match ev {
            Event::Damage { file, .. } => {
                if !damaged.contains(&file) {
                    damaged.push(file)
                }
            }
            Event::LengthMismatch { file, found, .. } => lengths.push((file, found)),
            Event::Record { .. } | Event::TornTail { .. } => {}
        })?;
        if !walked {
            plan.unrepairable.push((
                id,
                "found damaged while small: the checkpoint does not say where its records are; \
                 delete it with `ctl repair --delete-group`"
                    .into(),
            ));
            return Ok(());
        }
        if damaged.is_empty() && lengths.is_empty() && g.damaged.is_none() {
            return Ok(());
        }
        let mut rec = g.clone();
        rec.damaged = None;
        rec.fresh = false;
        if let Some(small) = &g.small {
            if !damaged.is_empty() {
                self.plan_small(g, small.floor, &mut rec, plan)?;
            } else if g.damaged.is_some() {
                plan.actions.push(format!(
                    "group {id}: its records verify: record it as not damaged"
                ));
            }
        } else {
            self.plan_segments(g, &damaged, &lengths, &mut rec, plan)?;
        }
        plan.steps.push(Step::Record(Box::new(rec)));
        Ok(())
    }

    fn plan_segments(
        &self,
        g: &GroupRecord,
        damaged: &[PathBuf],
        lengths: &[(PathBuf, u64)],
        rec: &mut GroupRecord,
        plan: &mut RepairPlan,
    ) -> Result<()> {
        let id = g.group;
        let mut rebuilds: Vec<(usize, Rebuild)> = g
            .segments
            .iter()
            .enumerate()
            .filter(|(_, &(base, _))| damaged.contains(&walk::segment_path(&self.path, id, base)))
            .map(|(i, &(base, _))| (i, Rebuild::new(id, base)))
            .collect();
        let rebuilds_none = rebuilds.is_empty();
        if !rebuilds_none {
            let paths: Vec<PathBuf> = rebuilds
                .iter()
                .map(|(i, _)| walk::segment_path(&self.path, id, g.segments[*i].0))
                .collect();
            let mut last_ts = 0u64;
            walk::walk_group(&self.path, g, &mut |ev| {
                let (file, r) = match &ev {
                    Event::Record { header, file, .. } => {
                        last_ts = last_ts.max(header.timestamp_ms);
                        (file.to_path_buf(), None)
                    }
                    Event::Damage {
                        file,
                        lost: Some(lost),
                        ..
                    } => (file.clone(), Some(*lost)),
                    _ => return,
                };
                let Some(k) = paths.iter().position(|p| *p == file) else {
                    return;
                };
                let rb = &mut rebuilds[k].1;
                match (ev, r) {
                    (Event::Record { header, bytes, .. }, _) => rb.keep(header.msg_id, bytes),
                    (_, Some((from, to))) => rb.gap(from, to, last_ts),
                    _ => {}
                }
            })?;
        }
        for (i, rb) in rebuilds {
            let (base, _) = g.segments[i];
            let path = walk::segment_path(&self.path, id, base);
            let old = std::fs::metadata(&path).ok().map(|m| m.len());
            plan.actions
                .push(format!("group {id}: {}", rb.describe(&path, old)));
            rec.segments[i].1 = rb.bytes.len() as u64;
            record_gaps(rec, &rb.gaps);
            if i + 1 == g.segments.len() {
                rec.head = rec.head.max(rb.last_id);
            }
            plan.steps.push(Step::Segment {
                group: id,
                path,
                bytes: rb.bytes,
                trash_dir_first: false,
            });
        }
        for (path, found) in lengths {
            if let Some(i) = g
                .segments
                .iter()
                .position(|&(base, _)| walk::segment_path(&self.path, id, base) == *path)
            {
                if !damaged.contains(path) {
                    plan.actions.push(format!(
                        "group {id}: record {} at {found} bytes (the checkpoint says {})",
                        path.display(),
                        g.segments[i].1
                    ));
                    rec.segments[i].1 = *found;
                }
            }
        }
        if rebuilds_none {
            // Only the state is recorded (a repair cut before its
            // checkpoint wrote these files): the gap records already in
            // them must be quiet too, as the cut repair would have made
            // them.
            let mut on_disk = Vec::new();
            walk::walk_group(&self.path, rec, &mut |ev| {
                if let Event::Record { header, .. } = ev {
                    if record::is_gap(&header) {
                        on_disk.push((header.msg_id, header.msg_id));
                    }
                }
            })?;
            record_gaps(rec, &on_disk);
        }
        plan.actions.push(format!(
            "group {id}: record it with head {}, {} segments, not damaged",
            rec.head,
            rec.segments.len()
        ));
        Ok(())
    }

    fn plan_small(
        &self,
        g: &GroupRecord,
        floor: u64,
        rec: &mut GroupRecord,
        plan: &mut RepairPlan,
    ) -> Result<()> {
        let id = g.group;
        let mut rb = Rebuild::new(id, floor);
        let mut last_ts = 0u64;
        walk::walk_group(&self.path, g, &mut |ev| match ev {
            Event::Record { header, bytes, .. } if header.msg_id >= floor => {
                last_ts = last_ts.max(header.timestamp_ms);
                rb.keep(header.msg_id, bytes);
            }
            Event::Damage {
                lost: Some((from, to)),
                ..
            } if to >= floor => rb.gap(from.max(floor), to, last_ts),
            _ => {}
        })?;
        let dir = crate::logs::group_log::group_dir(&self.path, id);
        let path = dir.join(crate::logs::segment::file_name(floor));
        let trash_dir_first = dir.exists();
        if trash_dir_first {
            plan.actions.push(format!(
                "group {id}: move the directory left at {} to groups/trash/",
                dir.display()
            ));
        }
        plan.actions.push(format!(
            "group {id} (small, records in journal files): {}",
            rb.describe(&path, None)
        ));
        plan.actions.push(format!(
            "group {id}: record it with head {}, 1 segment (no longer small), not damaged",
            g.head
        ));
        rec.small = None;
        rec.segments = vec![(floor, rb.bytes.len() as u64)];
        record_gaps(rec, &rb.gaps);
        plan.steps.push(Step::Segment {
            group: id,
            path,
            bytes: rb.bytes,
            trash_dir_first,
        });
        Ok(())
    }

    /// Does what `plan` says (see the module docs for the order and what a
    /// crash at each point leaves), then reads the new state back.
    pub fn repair(&mut self, plan: RepairPlan) -> Result<()> {
        let done = self.write_segments(plan)?;
        self.store_checkpoint(done)
    }

    /// Step (1): the new segment files. Returns the checkpoint's items and
    /// the groups to delete. (Tests stop here to leave the directory as a
    /// crash between steps (1) and (2) would.)
    pub(super) fn write_segments(&mut self, plan: RepairPlan) -> Result<Written> {
        if let Some(why) = plan.refused {
            return Err(Error::WritesStopped { reason: why });
        }
        let vfs = &*self.ctx.vfs;
        let mut items = Vec::new();
        let mut deletes = Vec::new();
        let mut journal = None;
        for step in plan.steps {
            match step {
                Step::Segment {
                    group,
                    path,
                    bytes,
                    trash_dir_first,
                } => {
                    let dir = crate::logs::group_log::group_dir(&self.path, group);
                    if trash_dir_first {
                        self.ctx.trash.put(vfs, group, &dir)?;
                    }
                    vfs.create_dir_all_durable(&dir)
                        .map_err(|e| Error::write(format!("mkdir {}", dir.display()), e))?;
                    write_replacing(&path, &bytes)?;
                    vfs.sync_dir(&dir)
                        .map_err(|e| Error::io(format!("fsync dir {}", dir.display()), e))?;
                }
                Step::Record(rec) => items.push(Item::GroupPut(rec)),
                Step::Delete { group } => {
                    items.push(Item::GroupDelete { group });
                    deletes.push(group);
                }
                Step::Journal { seq, pinned } => journal = Some((seq, pinned)),
            }
        }
        Ok(Written {
            items,
            deletes,
            journal,
        })
    }

    /// Steps (2) to (4): the run, the manifest, the deleted groups'
    /// directories to the trash; then the new state is read back.
    fn store_checkpoint(&mut self, w: Written) -> Result<()> {
        let Written {
            mut items,
            deletes,
            journal,
        } = w;
        let Some((_, m)) = self.manifest.clone() else {
            return Ok(());
        };
        if items.is_empty() && journal.is_none() {
            return Ok(());
        }
        let vfs = &*self.ctx.vfs;
        items.sort_by_key(Item::key);
        let mut new = m.clone();
        new.ckpt_seq = self.next_ckpt_seq(&m);
        new.created_ms = crate::now_ms();
        if let Some(run) = checkpointer::write_run(&self.ctx, m.next_run_seq, items.iter().map(Ok))?
        {
            new.next_run_seq = m.next_run_seq + 1;
            new.runs.insert(0, run);
        }
        if let Some((seq, pinned)) = journal {
            new.replay_journal_seq = seq;
            new.pinned = pinned;
        }
        manifest::store(vfs, &manifest::manifest_dir(&self.path), &new)?;
        for group in deletes {
            let dir = crate::logs::group_log::group_dir(&self.path, group);
            self.ctx.trash.put(vfs, group, &dir)?;
        }
        self.manifest = None;
        self.rejected.clear();
        self.groups.clear();
        self.members.clear();
        self.load_state()
    }
}

/// What step (1) leaves for the checkpoint: the group items, the groups
/// whose directories go to the trash after it, the new replay file and pins.
pub(super) struct Written {
    items: Vec<Item>,
    deletes: Vec<u64>,
    journal: Option<(u64, Vec<u64>)>,
}

/// `path` replaced by `bytes`: written to `<path>.repair`, fdatasynced,
/// renamed over `path` (the caller fsyncs the directory).
fn write_replacing(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".repair");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)
        .map_err(|e| Error::write(format!("create {}", tmp.display()), e))?;
    f.write_all(bytes)
        .map_err(|e| Error::write(format!("write {}", tmp.display()), e))?;
    f.sync_data()
        .map_err(|e| Error::io(format!("fdatasync {}", tmp.display()), e))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| Error::io(format!("rename {} to {}", tmp.display(), path.display()), e))?;
    debug_assert!(bytes.len() >= SEGMENT_HEADER_BYTES);
    Ok(())
}
