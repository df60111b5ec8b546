//! `ctl verify`: every check the node's reads would make on a stopped
//! node's directory, made now and all at once, like SQLite's `PRAGMA
//! integrity_check`. What it checks (format-spec/storage.md section 8, the
//! invariants marked *checked*, and every file the checkpoint names):
//!
//! - `FORMAT` (at open) and the manifest in force: a newer manifest that
//!   fails its checks, or none usable while manifests exist, is a finding
//!   at the place of the damage (the run part and offset when its runs do
//!   not merge, `damage::locate_run_damage`), and so is a directory with
//!   no manifest that holds data (the node refuses both); the merge of its
//!   runs checks every run part's header, trailer, block CRCs and key
//!   order (invariants 11, 12);
//! - the journal files replay would read (from the manifest's replay file
//!   on): none missing, each header (judged as the node judges it,
//!   `damage::judge_journal_header`), every frame's envelope and payload
//!   checksums and numbering (invariant 9); an invalid frame is a torn
//!   tail (a note, the node cuts it) only in the newest file holding frames
//!   and only when no later envelope shows it durable (the replay's own
//!   proof search), else damage; every shared file the manifest pins
//!   exists;
//! - every group (`walk.rs`): its segment headers, every record's CRC,
//!   dense ids from floor to head across segments and the lengths the
//!   checkpoint records (invariants 1, 2, 4), timestamps that never
//!   decrease (8), a small group's extents in journal and cold files; a
//!   group the checkpoint records damaged is a finding;
//! - when the manifest says its runs hold a complete user index, an entry
//!   for every member row (storage.md 6.1), each missing one named;
//! - files the node's open sweeps (`damage::find_strays`), as notes, when
//!   nothing was written after the checkpoint.
//!
//! Costs: one read of every file named, linear in the directory's bytes.
//! [`DataDir::verify_with_progress`] reports how far it is (`progress.rs`).

use std::path::PathBuf;

use super::progress::{Meter, Reading, VerifyProgress};
use super::walk::{self, Event};
use super::DataDir;
use crate::commit::journal::{self, frame, JOURNAL_HEADER_BYTES};
use crate::error::Result;
use crate::logs::promotion_left;
use crate::state::damage::{self, GroupFiles, HeaderVerdict};
use crate::state::GroupRecord;

/// A journal file replay would read: `(seq, path, bytes)`.
pub(super) type JournalFile = (u64, PathBuf, u64);

/// One thing `verify` found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub group: Option<u64>,
    pub file: Option<PathBuf>,
    pub offset: u64,
    pub what: String,
    /// False for notes that are not damage (a torn tail a crash left,
    /// which the node cuts at its next open).
    pub damage: bool,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.damage { "DAMAGE" } else { "note" })?;
        if let Some(g) = self.group {
            write!(f, " group {g}")?;
        }
        if let Some(p) = &self.file {
            write!(f, " {} offset {}", p.display(), self.offset)?;
        }
        write!(f, ": {}", self.what)
    }
}

/// What `verify` checked and found.
#[derive(Clone, Debug, Default)]
pub struct Verified {
    pub findings: Vec<Finding>,
    pub groups: u64,
    pub records: u64,
    pub journal_frames: u64,
}

impl Verified {
    /// No damage (notes allowed).
    pub fn clean(&self) -> bool {
        !self.findings.iter().any(|f| f.damage)
    }
}

impl DataDir {
    /// Checks everything the module docs list. Findings are returned, not
    /// errors: an `Err` means the check itself could not run (I/O).
    pub fn verify(&self) -> Result<Verified> {
        self.verify_with_progress(&mut |_| {})
    }

    /// [`DataDir::verify`], reporting to `progress` how many of the bytes
    /// it reads it has checked, and what it is reading (`progress.rs`).
    pub fn verify_with_progress(
        &self,
        progress: &mut dyn FnMut(VerifyProgress),
    ) -> Result<Verified> {
        let journal = self.journal_window()?;
        let fallback_bytes = self
            .fallback
            .as_ref()
            .map_or(0, |(_, m)| m.runs.iter().map(|r| r.bytes()).sum::<u64>());
        let total = fallback_bytes
            + journal.iter().map(|f| f.2).sum::<u64>()
            + self.groups.values().map(|g| group_bytes(g).1).sum::<u64>();
        let mut meter = Meter::new(total, progress);
        let mut v = Verified::default();
        for (manifest, at) in &self.rejected {
            v.findings.push(Finding {
                group: None,
                file: Some(at.path.clone()),
                offset: at.offset,
                what: format!("checkpoint {} rejected: {}", manifest.display(), at.why),
                damage: true,
            });
        }
        if let Some((manifest, m)) = &self.fallback {
            meter.begin(Reading::FallbackRuns, fallback_bytes);
            // The fallback's runs: every part checked alone, as a failed
            // merge is located (`damage::locate_run_damage`).
            if let Some(at) = damage::locate_run_damage(&*self.ctx.vfs, &self.path, &m.runs) {
                v.findings.push(Finding {
                    group: None,
                    file: Some(at.path.clone()),
                    offset: at.offset,
                    what: format!(
                        "the fallback checkpoint {} (used if the newest is lost) names a \
                         damaged run part: {}",
                        manifest.display(),
                        at.why
                    ),
                    damage: true,
                });
            }
            meter.end();
        }
        if self.manifest.is_none() && self.rejected.is_empty() {
            if let Some(data) = damage::data_without_checkpoint(&*self.ctx.vfs, &self.path)? {
                v.findings.push(Finding {
                    group: None,
                    file: Some(crate::state::manifest::manifest_dir(&self.path)),
                    offset: 0,
                    what: format!(
                        "no checkpoint (no manifest), but the directory holds data ({}): the \
                         checkpoint state was lost (the node refuses the directory)",
                        data.display()
                    ),
                    damage: true,
                });
            }
        }
        self.verify_journal(&mut v, journal, &mut meter)?;
        for g in self.groups.values() {
            v.groups += 1;
            let id = g.group;
            let (reading, bytes) = group_bytes(g);
            meter.begin(reading, bytes);
            if let Some(reason) = &g.damaged {
                v.findings.push(Finding {
                    group: Some(id),
                    file: None,
                    offset: 0,
                    what: format!("the checkpoint records the group damaged: {reason}"),
                    damage: true,
                });
            }
            let mut last_ts = 0u64;
            let mut records = 0u64;
            let mut findings = Vec::new();
            let walked = walk::walk_group(&self.path, g, &mut |ev| {
                let (file, offset, damage) = match &ev {
                    Event::Record {
                        header,
                        bytes,
                        file,
                        offset,
                    } => {
                        records += 1;
                        meter.walked(bytes.len() as u64);
                        if header.timestamp_ms < last_ts {
                            findings.push(Finding {
                                group: Some(id),
                                file: Some(file.to_path_buf()),
                                offset: *offset,
                                what: format!(
                                    "timestamp of msg_id {} decreases ({} after {last_ts})",
                                    header.msg_id, header.timestamp_ms
                                ),
                                damage: true,
                            });
                        }
                        last_ts = last_ts.max(header.timestamp_ms);
                        return;
                    }
                    Event::Damage { file, offset, .. } => (file.clone(), *offset, true),
                    Event::TornTail { file, offset } => (file.clone(), *offset, false),
                    Event::LengthMismatch { file, found, .. } => (file.clone(), *found, true),
                };
                findings.push(Finding {
                    group: Some(id),
                    file: Some(file),
                    offset,
                    what: walk::what(&ev),
                    damage,
                });
            })?;
            if !walked && g.damaged.is_none() {
                findings.push(Finding {
                    group: Some(id),
                    file: None,
                    offset: 0,
                    what: "the checkpoint names no place for the group's records".into(),
                    damage: true,
                });
            }
            v.records += records;
            v.findings.extend(findings);
            meter.end();
        }
        self.verify_user_index(&mut v);
        self.verify_strays(&mut v)?;
        self.verify_promotions_left(&mut v)?;
        meter.finish();
        Ok(v)
    }

    /// When the manifest says its runs hold a complete user index: an
    /// entry for every member row (storage.md 6.1). A missing one is a
    /// writer's bug no read notices otherwise: while a later open loads
    /// the state, UNREAD and SYNC of that user would leave the group out.
    fn verify_user_index(&self, v: &mut Verified) {
        let Some((file, _)) = &self.manifest else {
            return;
        };
        for (group, user) in self.index_entries_missing() {
            v.findings.push(Finding {
                group: Some(group),
                file: Some(file.clone()),
                offset: 0,
                what: format!(
                    "the user index has no entry (user {user}, tag 2, group {group}) for \
                     the member row of user {user} in group {group}: while a background \
                     load runs, UNREAD and SYNC of that user would leave the group out"
                ),
                damage: true,
            });
        }
    }

    /// `(group, user)` of every member row the user index has no entry
    /// for, when the manifest in force says the index is complete (none
    /// otherwise): what `verify` names and `repair` stores the checkpoint
    /// without the claim for.
    pub(super) fn index_entries_missing(&self) -> Vec<(u64, u64)> {
        if !self.manifest.as_ref().is_some_and(|(_, m)| m.user_index) {
            return Vec::new();
        }
        let mut missing = Vec::new();
        for (&group, members) in &self.members {
            for member in members {
                if self
                    .user_index
                    .binary_search(&(member.user, group))
                    .is_err()
                {
                    missing.push((group, member.user));
                }
            }
        }
        missing
    }

    /// Files under `groups/` that no group of a checkpoint explains, as
    /// notes (the node sweeps them at open, `damage::find_strays`). Only
    /// when nothing was written after the checkpoint: a group created
    /// after it, whose directory is not stray, is known only to the
    /// journal.
    fn verify_strays(&self, v: &mut Verified) -> Result<()> {
        if self.manifest.is_none() || self.frames_after_checkpoint()?.is_some() {
            return Ok(());
        }
        let files = |id: u64| match self.groups.get(&id) {
            None => GroupFiles::None,
            Some(g) if g.damaged.is_some() || g.small.is_some() || g.segments.is_empty() => {
                GroupFiles::NoSegments
            }
            Some(g) => GroupFiles::Segments {
                head: g.head,
                names_next: g
                    .segments
                    .iter()
                    .any(|&(base, _)| Some(base) == g.head.checked_add(1)),
            },
        };
        for stray in damage::find_strays(&*self.ctx.vfs, &self.path, &files)? {
            let group = match &stray {
                damage::Stray::Directory { group, .. } | damage::Stray::Segment { group, .. } => {
                    *group
                }
            };
            v.findings.push(Finding {
                group: Some(group),
                file: Some(stray.path().to_owned()),
                offset: 0,
                what: stray.describe(),
                damage: false,
            });
        }
        Ok(())
    }

    /// The segment files a promotion left under a small group's path
    /// (storage.md section 10, S1), judged as the node judges them at open
    /// (`promotion_left::judge`, the same text, file and offset), as
    /// notes: records past the group's head that the node adopts, files
    /// it moves to the trash, files that are not the group's promotion's
    /// (a deleted incarnation's) that it leaves. Only when nothing was
    /// written after the checkpoint, as for strays: replay may change the
    /// group's records first. A group whose own records are damaged is
    /// left to the walk, which names that damage.
    fn verify_promotions_left(&self, v: &mut Verified) -> Result<()> {
        let Some((_, m)) = &self.manifest else {
            return Ok(());
        };
        if self.frames_after_checkpoint()?.is_some() {
            return Ok(());
        }
        // As the node's replay decides it: a file it replays was written
        // while segments could lead it (fsync `never` or `interval`),
        // except the one a clean shutdown's checkpoint names.
        let mut journal_lost = false;
        for (seq, path, _) in self.journal_window()? {
            if m.clean && seq == m.replay_journal_seq {
                continue;
            }
            let bytes = walk::read_file(&path)?.unwrap_or_default();
            let durable =
                damage::journal_header_durable(Some((m.replay_journal_seq, m.clean)), seq);
            if let HeaderVerdict::Valid(h) =
                damage::judge_journal_header(&bytes, bytes.len() as u64, durable)
            {
                journal_lost |= h.segments_may_lead();
            }
        }
        for g in self.groups.values() {
            if g.damaged.is_some() || !g.segments.is_empty() {
                continue;
            }
            let list = match &g.small {
                Some(small) => match small.extent_list(g.head) {
                    Ok(list) => list,
                    Err(_) => continue, // the walk names it
                },
                None if g.head == 0 => crate::logs::extents::ExtentList::new(1),
                None => continue,
            };
            let left = match promotion_left::judge(&self.ctx, g.group, &list, journal_lost) {
                Ok(Some(left)) => left,
                Ok(None) | Err(crate::error::Error::Corrupt { .. }) => continue,
                Err(e) => return Err(e),
            };
            let (file, offset) = left.place();
            v.findings.push(Finding {
                group: Some(g.group),
                file: Some(file.to_owned()),
                offset,
                what: left.describe(),
                damage: false,
            });
        }
        Ok(())
    }

    /// The journal files replay would read (from the manifest's replay
    /// file on, every file without a manifest), with their lengths.
    pub(super) fn journal_window(&self) -> Result<Vec<JournalFile>> {
        let jdir = journal::journal_dir(&self.path);
        let files = if jdir.exists() {
            journal::list(&*self.ctx.vfs, &jdir)?
        } else {
            Vec::new()
        };
        let replay_from = self
            .manifest
            .as_ref()
            .map_or(0, |(_, m)| m.replay_journal_seq);
        Ok(files
            .into_iter()
            .filter(|(s, _)| *s >= replay_from)
            .map(|(s, path)| {
                let bytes = super::file_len(&path).unwrap_or(0);
                (s, path, bytes)
            })
            .collect())
    }

    /// The journal checks of the module docs over `window`
    /// ([`DataDir::journal_window`]), each file a unit of `meter`.
    pub(super) fn verify_journal(
        &self,
        v: &mut Verified,
        window: Vec<JournalFile>,
        meter: &mut Meter<'_>,
    ) -> Result<()> {
        let jdir = journal::journal_dir(&self.path);
        let mut finding = |file: Option<PathBuf>, offset: u64, what: String, damage: bool| {
            v.findings.push(Finding {
                group: None,
                file,
                offset,
                what,
                damage,
            })
        };
        let (replay_from, clean, pinned) = match &self.manifest {
            Some((_, m)) => (m.replay_journal_seq, m.clean, m.pinned.clone()),
            None => (0, false, Vec::new()),
        };
        let checkpoint = self.manifest.is_some().then_some((replay_from, clean));
        for raw in pinned {
            let Ok(raw32) = u32::try_from(raw) else {
                continue;
            };
            let path = walk::shared_path(&self.path, raw32);
            if !path.exists() {
                finding(
                    Some(path),
                    0,
                    "a file the checkpoint pins is missing".into(),
                    true,
                );
            }
        }
        // Replay's sequence rule (storage.md section 11, step 4): the
        // manifest's file first (unless a clean shutdown's: it held no
        // frame), then no gap.
        let mut expect = (self.manifest.is_some() && !clean).then_some(replay_from);
        if expect.is_some() && window.is_empty() {
            finding(
                Some(journal::journal_path(&jdir, replay_from)),
                0,
                "journal file missing (the checkpoint's replay starts in it)".into(),
                true,
            );
        }
        // The newest file holding frames: a torn tail may only be there.
        let mut walked = Vec::new();
        for (seq, path, file_bytes) in &window {
            // The previous file's unit ends here (its checks end early on
            // several paths) or after the loop.
            meter.end();
            meter.begin(Reading::Journal, *file_bytes);
            if let Some(e) = expect {
                if *seq != e {
                    finding(
                        Some(journal::journal_path(&jdir, e)),
                        0,
                        format!("journal file missing (replay needs {e} before {seq})"),
                        true,
                    );
                }
            }
            expect = Some(seq + 1);
            let bytes = walk::read_file(path)?.unwrap_or_default();
            // The node's own judgement of the header (`damage.rs`).
            let durable = damage::journal_header_durable(checkpoint, *seq);
            let h = match damage::judge_journal_header(&bytes, bytes.len() as u64, durable) {
                HeaderVerdict::Valid(h) => h,
                HeaderVerdict::Empty => continue,
                // No valid part: damage if a later file holds frames.
                HeaderVerdict::Torn(why) => {
                    walked.push((
                        path.clone(),
                        false,
                        Some((0, format!("journal header: {why}"))),
                        false,
                    ));
                    continue;
                }
                HeaderVerdict::Unsupported(version) => {
                    finding(
                        Some(path.clone()),
                        8,
                        format!("journal version {version} is not supported by this build"),
                        true,
                    );
                    continue;
                }
                HeaderVerdict::DamagedNamed(why) | HeaderVerdict::DamagedWithFrames(why) => {
                    finding(
                        Some(path.clone()),
                        0,
                        format!("journal header: {why}"),
                        true,
                    );
                    continue;
                }
            };
            let mut it = frame::FrameIter::new(
                &bytes,
                JOURNAL_HEADER_BYTES,
                h.mark_key,
                h.first_lsn,
                h.first_round,
            );
            let frames = it.by_ref().count() as u64;
            v.journal_frames += frames;
            let stop = it.stop_reason().map(|why| (it.position(), why.to_owned()));
            let proof = stop
                .as_ref()
                .and_then(|&(at, _)| frame::furthest_proof_from(&bytes, at, h.mark_key))
                .filter(|&(synced, _)| synced > stop.as_ref().map_or(0, |s| s.0 as u64));
            walked.push((path.clone(), frames > 0, stop, proof.is_some()));
        }
        meter.end();
        let newest_with_frames = walked.iter().rposition(|w| w.1);
        for (i, (path, _, stop, durable)) in walked.into_iter().enumerate() {
            let Some((at, why)) = stop else { continue };
            let torn = !durable && newest_with_frames.is_none_or(|n| i >= n);
            let what = if torn {
                format!("{why}: a torn write (cut by the node at its next open)")
            } else if durable {
                format!("{why}: damage to a frame a later frame shows was durable")
            } else {
                format!("{why}: and a later journal file holds frames")
            };
            finding(Some(path), at as u64, what, !torn);
        }
        Ok(())
    }
}

/// What a group's walk reads and how many bytes, as its checkpoint record
/// says: its segments' recorded lengths, or a small group's extents.
fn group_bytes(g: &GroupRecord) -> (Reading, u64) {
    match &g.small {
        Some(small) => (
            Reading::Extents,
            small.extents.iter().map(|e| u64::from(e.2)).sum(),
        ),
        None => (
            Reading::Segments,
            g.segments.iter().map(|&(_, len)| len).sum(),
        ),
    }
}
