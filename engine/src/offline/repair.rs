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
//! - **Ids the journal shows were given out** (a group found damaged by
//!   replay skipped its later Records entries): the highest id every
//!   journal file present names for the group, frames past damage
//!   included, becomes its head, with gap records up to it
//!   ([`DataDir::journal_heads`]): a repair never lowers a head below an
//!   id that was given out.
//! - **A journal file that holds no frame with a damaged header**, which
//!   the node refuses: its header is written anew (nothing is lost), in
//!   any directory.
//! - **A user index that misses entries** (`verify` names each member row
//!   without one): the checkpoint is stored again saying its runs hold no
//!   complete index, in any directory (nothing else changes, so replay
//!   cannot contradict it); the node then waits for its whole load before
//!   UNREAD and SYNC and writes the index anew at its next checkpoint.
//!
//! Repair otherwise requires a checkpoint after which nothing was written:
//! its manifest's `clean` set *and* no journal file from its replay
//! position on holding frames (`damage::frames_after_checkpoint`; the flag
//! alone says only that nothing was written when it was stored, and a node
//! started again writes to a new file). Then a new checkpoint with the same
//! replay position cannot be contradicted by replay. Any other directory:
//! start the node once and stop it (a damaged group does not keep it from
//! opening). Without a usable checkpoint it refuses, naming the damaged
//! file and offset: it never rebuilds one (small groups, memberships and
//! the ids given out are known only to it).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::walk::{self, Event};
use super::DataDir;
use crate::commit::journal::{self, frame, EntryIter, EntryKind, JOURNAL_HEADER_BYTES};
use crate::error::{Error, Result};
use crate::logs::record;
use crate::logs::segment::SegmentHeader;
use crate::state::damage::{self, HeaderVerdict};
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
    /// The checkpoint in force stored again (a new manifest, no new run),
    /// so that the fallback becomes that intact checkpoint instead of one
    /// that names a damaged run part.
    Restore,
    /// A journal file that holds no frame gets a valid header (`header`)
    /// in place of its damaged one.
    JournalHeader {
        path: PathBuf,
        header: [u8; JOURNAL_HEADER_BYTES],
    },
    /// The new checkpoint says its runs hold no complete user index
    /// (manifest `user_index` 0): the index in force misses entries.
    DropUserIndex,
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
            created_ms: crate::clock::now_ms(),
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
        let m = match &self.manifest {
            None => {
                plan.refused = Some(match self.rejected.first() {
                    Some((manifest, at)) => format!(
                        "no usable checkpoint: {} is damaged at offset {} ({}), so checkpoint \
                         {} was rejected, and no older one is usable. Without a checkpoint \
                         this tool cannot know the small groups (their records are in journal \
                         files only a checkpoint names), the memberships or the ids given \
                         out, and it does not guess them: restore the checkpoint files \
                         (manifest/ and state/) or the data directory from a backup",
                        at.path.display(),
                        at.offset,
                        at.why,
                        manifest.display()
                    ),
                    None => "no checkpoint is stored in this directory: if it holds data, its \
                             checkpoint state was lost (restore manifest/ and state/ from a \
                             backup); a new directory needs no repair"
                        .into(),
                });
                return Ok(plan);
            }
            Some((_, m)) => m,
        };
        let written_after = self.frames_after_checkpoint()?;
        if !m.clean || written_after.is_some() {
            let why = match &written_after {
                Some((path, len)) if m.clean => format!(
                    "journal frames were written after the checkpoint in force ({} holds {len} \
                     bytes), although it records a clean shutdown: the node was started again \
                     after it. A repair from that checkpoint would drop those frames and give \
                     their acknowledged ids to new messages",
                    path.display()
                ),
                _ => "the node did not shut down cleanly (journal frames may follow the \
                      checkpoint)"
                    .into(),
            };
            // A damaged header of a journal file that holds no frame loses
            // nothing and is fixed whatever the checkpoint: the node refuses
            // the directory until it is. So is an incomplete user index's
            // claim dropped: the new checkpoint differs from the one in
            // force in that flag only, so replay cannot contradict it.
            if target == RepairTarget::AllDamaged {
                self.plan_journal_headers(&mut plan)?;
                self.plan_user_index(&mut plan);
                if plan.steps.iter().any(|s| matches!(s, Step::DropUserIndex)) {
                    self.plan_checkpoint(&mut plan);
                }
            }
            if plan.steps.is_empty() {
                plan.refused = Some(format!(
                    "{why}: start the node on this directory once and stop it with SIGTERM (a \
                     damaged group does not keep it from opening), then repair. If the node \
                     refuses the directory (a damaged or missing journal file), restore it \
                     from a backup, or follow the node's error text"
                ));
            } else {
                plan.actions.push(format!(
                    "then start the node once and stop it with SIGTERM, and repair again if \
                     `verify` still finds damage ({why})"
                ));
            }
            return Ok(plan);
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
                self.plan_fallback(&mut plan);
                self.plan_user_index(&mut plan);
                self.groups.keys().copied().collect()
            }
        };
        let mut evidence = None;
        for g in groups {
            self.plan_group(g, &mut evidence, &mut plan)?;
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
        self.verify_journal(
            &mut v,
            self.journal_window()?,
            &mut super::progress::Meter::quiet(),
        )?;
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

    /// Journal files from the replay position on whose header is damaged
    /// (as the node judges it, `damage::judge_journal_header`) and that
    /// hold no frame (at most a header's length): each gets a valid header
    /// numbered as the next file that has one (a file without frames
    /// starts where the next one does), or as the checkpoint's replay
    /// position for the file it names. Nothing is lost: the file held no
    /// frame. A file no later frame follows is a torn tail the node cuts,
    /// not damage, and is left alone.
    fn plan_journal_headers(&self, plan: &mut RepairPlan) -> Result<()> {
        let Some((_, m)) = &self.manifest else {
            return Ok(());
        };
        let jdir = journal::journal_dir(&self.path);
        if !jdir.exists() {
            return Ok(());
        }
        let checkpoint = Some((m.replay_journal_seq, m.clean));
        let mut files = Vec::new();
        for (seq, path) in journal::list(&*self.ctx.vfs, &jdir)? {
            if seq < m.replay_journal_seq {
                continue;
            }
            let bytes = walk::read_file(&path)?.unwrap_or_default();
            let durable = damage::journal_header_durable(checkpoint, seq);
            let verdict = damage::judge_journal_header(&bytes, bytes.len() as u64, durable);
            files.push((seq, path, bytes.len(), verdict));
        }
        for (i, (seq, path, len, verdict)) in files.iter().enumerate() {
            let later = &files[i + 1..];
            let frames_follow = later.iter().any(|f| f.2 > JOURNAL_HEADER_BYTES);
            let damaged = match verdict {
                HeaderVerdict::DamagedNamed(why) => why,
                HeaderVerdict::Torn(why) if frames_follow => why,
                _ => continue,
            };
            if *len > JOURNAL_HEADER_BYTES {
                continue;
            }
            let next = later.iter().find_map(|f| match &f.3 {
                HeaderVerdict::Valid(h) => Some((h.first_lsn, h.first_round, h.flags)),
                _ => None,
            });
            let Some((first_lsn, first_round, flags)) = next.or_else(|| {
                (*seq == m.replay_journal_seq).then_some((m.replay_lsn, m.replay_round, 0))
            }) else {
                continue;
            };
            let header = journal::encode_header_of(&journal::JournalHeader {
                flags,
                seq: *seq,
                first_lsn: first_lsn.max(1),
                first_round: first_round.max(1),
                mark_key: journal::new_mark_key(*seq),
            });
            plan.actions.push(format!(
                "journal: {} ({len} bytes, no frame) has a damaged header ({damaged}): write its \
                 header anew (seq {seq}, first lsn {first_lsn}, first round {first_round}); \
                 nothing is lost",
                path.display()
            ));
            plan.steps.push(Step::JournalHeader {
                path: path.clone(),
                header,
            });
        }
        Ok(())
    }

    /// The highest msg_id that the Records entries of every journal file
    /// present name for each group (after the group's last DeleteGroup
    /// there): ids that were given out, whatever the checkpoint says. A
    /// damaged frame does not hide the frames after it: past invalid bytes
    /// every later offset is tried for a frame whose envelope and payload
    /// checksums hold (the envelope's mixes in the file's key, so record
    /// bytes do not pass for one). Linear in the journal's bytes.
    fn journal_heads(&self) -> Result<BTreeMap<u64, u64>> {
        let mut heads = BTreeMap::new();
        let jdir = journal::journal_dir(&self.path);
        if !jdir.exists() {
            return Ok(heads);
        }
        for (_, path) in journal::list(&*self.ctx.vfs, &jdir)? {
            let bytes = walk::read_file(&path)?.unwrap_or_default();
            let Ok(h) = journal::decode_header_of(&bytes) else {
                continue;
            };
            let mut at = JOURNAL_HEADER_BYTES;
            while at + frame::ENVELOPE_BYTES <= bytes.len() {
                let Some((kind, payload, end)) = frame_at(&bytes, at, h.mark_key) else {
                    at += 1;
                    continue;
                };
                for e in EntryIter::new(&payload[frame::PAYLOAD_HEADER_BYTES..], kind) {
                    match e.kind {
                        EntryKind::Records => {
                            if let Some((first, n)) = journal::body::decode_records(e.body) {
                                let last = first.saturating_add(n).saturating_sub(1);
                                let head = heads.entry(e.group_id).or_insert(0);
                                *head = last.max(*head);
                            }
                        }
                        EntryKind::DeleteGroup => {
                            heads.remove(&e.group_id);
                        }
                        _ => {}
                    }
                }
                at = end;
            }
        }
        Ok(heads)
    }

    /// The fallback checkpoint names a damaged run part: the checkpoint in
    /// force, intact, is stored again, which makes it the fallback (the
    /// node's next checkpoint deletes the damaged one, section 9 K7).
    fn plan_fallback(&self, plan: &mut RepairPlan) {
        let Some((manifest, m)) = &self.fallback else {
            return;
        };
        if let Some(at) = damage::locate_run_damage(&*self.ctx.vfs, &self.path, &m.runs) {
            plan.actions.push(format!(
                "the fallback checkpoint {} names a damaged run part ({}): store the checkpoint \
                 in force again, so that the fallback is intact",
                manifest.display(),
                at.describe()
            ));
            plan.steps.push(Step::Restore);
        }
    }

    /// The manifest in force says its runs hold a complete user index
    /// and they miss entries (`verify` names each): while a load runs, the
    /// node would answer UNREAD and SYNC of those users without the
    /// groups. The checkpoint is stored again without the claim
    /// (`user_index` 0), which the node reads as an index it cannot use:
    /// UNREAD and SYNC wait for the whole load, and its first checkpoint
    /// after the load writes an entry for every member row (storage.md
    /// 6.1), so the index is a superset again. The entries the runs hold
    /// stay (stale ones cost a lookup, never an answer).
    fn plan_user_index(&self, plan: &mut RepairPlan) {
        let missing = self.index_entries_missing();
        let (Some(&(group, user)), Some((manifest, _))) = (missing.first(), &self.manifest) else {
            return;
        };
        plan.actions.push(format!(
            "the user index of {} misses {} entries (the first: user {user}, tag 2, group \
             {group}): store the checkpoint without claiming a complete index; the node then \
             answers UNREAD and SYNC after its whole load, and its first checkpoint after it \
             writes the index anew",
            manifest.display(),
            missing.len()
        ));
        plan.steps.push(Step::DropUserIndex);
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
    fn plan_group(
        &self,
        id: u64,
        evidence: &mut Option<BTreeMap<u64, u64>>,
        plan: &mut RepairPlan,
    ) -> Result<()> {
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
        // Ids the journal shows were given out: a group found damaged by
        // replay did not apply its later Records entries, so its head in
        // the checkpoint may be below them. They become gaps, never ids
        // given again.
        if evidence.is_none() {
            *evidence = Some(self.journal_heads()?);
        }
        let given = evidence
            .as_ref()
            .and_then(|heads| heads.get(&id))
            .copied()
            .unwrap_or(0);
        let mut rec = g.clone();
        rec.damaged = None;
        rec.fresh = false;
        if let Some(small) = &g.small {
            if !damaged.is_empty() || given > g.head {
                self.plan_small(g, small.floor, given, &mut rec, plan)?;
            } else if g.damaged.is_some() {
                plan.actions.push(format!(
                    "group {id}: its records verify: record it as not damaged"
                ));
            }
        } else {
            self.plan_segments(g, &damaged, &lengths, given, &mut rec, plan)?;
        }
        plan.steps.push(Step::Record(Box::new(rec)));
        Ok(())
    }

    fn plan_segments(
        &self,
        g: &GroupRecord,
        damaged: &[PathBuf],
        lengths: &[(PathBuf, u64)],
        given: u64,
        rec: &mut GroupRecord,
        plan: &mut RepairPlan,
    ) -> Result<()> {
        let id = g.group;
        let active = g.segments.len().saturating_sub(1);
        // Damaged segments are written anew; so is the active one when ids
        // above the head were given out (their gaps go at its end).
        let mut rebuilds: Vec<(usize, Rebuild)> = g
            .segments
            .iter()
            .enumerate()
            .filter(|(i, &(base, _))| {
                damaged.contains(&walk::segment_path(&self.path, id, base))
                    || (*i == active && given > g.head)
            })
            .map(|(i, &(base, _))| (i, Rebuild::new(id, base)))
            .collect();
        let paths: Vec<PathBuf> = rebuilds
            .iter()
            .map(|(i, _)| walk::segment_path(&self.path, id, g.segments[*i].0))
            .collect();
        let mut last_ts = 0u64;
        if !rebuilds.is_empty() {
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
        if let Some((_, rb)) = rebuilds.iter_mut().find(|(i, _)| *i == active) {
            if given > rb.last_id {
                plan.actions.push(format!(
                    "group {id}: the journal shows msg_ids up to {given} were given out, the \
                     checkpoint's head is {}: gap records up to {given}",
                    g.head
                ));
                rb.gap(rb.last_id + 1, given, last_ts);
            }
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
        // The segments not written anew may hold gap records an earlier,
        // interrupted repair wrote (before its checkpoint): they must be
        // quiet too, as that repair would have made them.
        let mut on_disk = Vec::new();
        walk::walk_group(&self.path, g, &mut |ev| {
            if let Event::Record { header, file, .. } = ev {
                if record::is_gap(&header) && !paths.iter().any(|p| p == file) {
                    on_disk.push((header.msg_id, header.msg_id));
                }
            }
        })?;
        record_gaps(rec, &on_disk);
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
        given: u64,
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
        let head = g.head.max(given);
        if head > rb.last_id {
            plan.actions.push(format!(
                "group {id}: the journal shows msg_ids up to {given} were given out, the \
                 checkpoint's head is {}: gap records up to {given}",
                g.head
            ));
            rb.gap(rb.last_id + 1, head, last_ts);
        }
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
            "group {id}: record it with head {head}, 1 segment (no longer small), not damaged"
        ));
        rec.head = head;
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
        let mut restore = false;
        let mut drop_user_index = false;
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
                Step::Restore => restore = true,
                Step::DropUserIndex => drop_user_index = true,
                Step::JournalHeader { path, header } => {
                    write_replacing(&path, &header)?;
                    let jdir = crate::commit::journal::journal_dir(&self.path);
                    vfs.sync_dir(&jdir)
                        .map_err(|e| Error::io(format!("fsync dir {}", jdir.display()), e))?;
                }
            }
        }
        Ok(Written {
            items,
            deletes,
            journal,
            restore,
            drop_user_index,
        })
    }

    /// Steps (2) to (4): the run, the manifest, the deleted groups'
    /// directories to the trash; then the new state is read back.
    fn store_checkpoint(&mut self, w: Written) -> Result<()> {
        let Written {
            mut items,
            deletes,
            journal,
            restore,
            drop_user_index,
        } = w;
        let Some((_, m)) = self.manifest.clone() else {
            return Ok(());
        };
        if items.is_empty() && journal.is_none() && !restore && !drop_user_index {
            return Ok(());
        }
        let vfs = &*self.ctx.vfs;
        items.sort_by_key(Item::key);
        let mut new = m.clone();
        new.ckpt_seq = self.next_ckpt_seq(&m);
        new.created_ms = crate::clock::now_ms();
        new.user_index = m.user_index && !drop_user_index;
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
        self.fallback = None;
        self.rejected.clear();
        self.groups.clear();
        self.members.clear();
        self.user_index.clear();
        self.load_state()
    }
}

/// What step (1) leaves for the checkpoint: the group items, the groups
/// whose directories go to the trash after it, the new replay file and pins.
pub(super) struct Written {
    items: Vec<Item>,
    deletes: Vec<u64>,
    journal: Option<(u64, Vec<u64>)>,
    /// Store the checkpoint in force again (`Step::Restore`).
    restore: bool,
    /// Store it without claiming a complete user index
    /// (`Step::DropUserIndex`).
    drop_user_index: bool,
}

/// The frame at `at` of a journal file whose key is `mark_key`, if its
/// envelope and its payload pass their checks: its kind, payload and end.
fn frame_at(file: &[u8], at: usize, mark_key: u32) -> Option<(frame::FrameKind, &[u8], usize)> {
    // Cheap filters first (kind, reserved bytes), as the replay's search.
    if !matches!(file.get(at + 8)?, 1 | 2) || file.get(at + 9..at + 16)? != [0; 7] {
        return None;
    }
    let env = frame::envelope_at(file, at, mark_key).ok()?;
    let start = at + frame::ENVELOPE_BYTES;
    let end = start.checked_add(env.payload_len as usize)?;
    let payload = file.get(start..end)?;
    frame::check_payload(payload, env.kind).ok()?;
    Some((env.kind, payload, end))
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
    Ok(())
}
