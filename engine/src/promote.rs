//! Promotion of a small group to its own segment file, the worker's half
//! (storage v2 design section 4, steps P2-P4): the group's records, read
//! from the shared journal files where its rounds wrote them
//! (`small_read.rs`, every record CRC-checked), are copied into
//! `groups/<shard>/<id>/<floor>.seg` and made durable. The commit thread's
//! half (P5: copy the records that arrived meanwhile into the segment's
//! tail and switch the group's slot, in memory) and the checkpoint that
//! makes the switch durable (design 4.1: no Promote frame) come with the
//! wiring of step S5.
//!
//! Invariants:
//! - no engine lock is held: the caller copied the extent list under the
//!   group's lock;
//! - the segment is created `O_EXCL` after whatever was at the group's path
//!   moved to the trash (a stale directory of an interrupted promotion, or
//!   of an earlier incarnation of the id whose removal a crash undid), so
//!   the file holds exactly this copy;
//! - when [`copy_to_segment`] returns, the file (header and records) is
//!   fdatasynced and its directory entry, the group directory's and the
//!   shard directory's are fsynced: a checkpoint may name the segment at
//!   the returned length. Until one does, no state names it; a crash leaves
//!   files the next attempt moves to the trash.
//!
//! Cost: the group's bytes (at most `small_group_bytes_max`) read from the
//! page cache and written once; one mkdir, one create, one fdatasync and
//! three directory fsyncs per promotion.
//!
//! Test-only until step S5 wires small groups in.

use crate::error::{Error, Result};
use crate::extents::ExtentList;
use crate::group_log::LogContext;
use crate::segment::{self, SegmentFile, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::small_read::{self, SharedFiles};

/// A copy made by [`copy_to_segment`]: segment `floor` holds the ids
/// `floor..=head` in `len` bytes (its header included), durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentCopy {
    pub floor: u64,
    pub head: u64,
    pub len: u64,
}

/// Copies the records of `list` (the group's extent list, copied under its
/// lock) into a new segment file of `group` and makes it durable (module
/// docs). Damage found in a record is `GroupDamaged` naming file and
/// offset, and nothing is promoted.
pub fn copy_to_segment(
    ctx: &LogContext,
    files: &SharedFiles,
    group: u64,
    list: &ExtentList,
) -> Result<SegmentCopy> {
    let floor = list.floor();
    let read = small_read::read_above(files, group, list, floor - 1, u64::MAX, usize::MAX)?;
    let mut records = Vec::with_capacity(read.batch.bytes);
    for c in &read.batch.chunks {
        records.extend_from_slice(c.bytes());
    }
    let head = list.next_id() - 1;
    let len = (SEGMENT_HEADER_BYTES + records.len()) as u64;
    if len > ctx.config.segment_bytes_max && !records.is_empty() {
        return Err(Error::InvalidConfig {
            reason: format!(
                "group {group}: {len} bytes to promote do not fit one segment \
                 (segment_bytes_max {}); small_group_bytes_max must stay below it",
                ctx.config.segment_bytes_max
            ),
        });
    }
    let dir = ctx.group_dir(group);
    ctx.trash.put(&*ctx.vfs, group, &dir)?;
    ctx.vfs
        .create_dir_all(&dir)
        .map_err(|e| Error::write(format!("mkdir {}", dir.display()), e))?;
    let header = SegmentHeader {
        group_id: group,
        base_msg_id: floor,
        created_ms: crate::now_ms(),
    };
    let path = dir.join(segment::file_name(floor));
    let seg = SegmentFile::create(&*ctx.vfs, &path, &header, ctx.config.segment_bytes_max)?;
    if !records.is_empty() {
        seg.write_at(&records, SEGMENT_HEADER_BYTES as u64)?;
    }
    seg.sync()?;
    // The file's entry, the group directory's (made above, maybe with its
    // shard directory) and the shard's in `groups/`.
    for d in dir.ancestors().take(3) {
        ctx.vfs
            .sync_dir(d)
            .map_err(|e| Error::io(format!("fsync dir {}", d.display()), e))?;
    }
    Ok(SegmentCopy { floor, head, len })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::extents::{Extent, FileId};
    use crate::group_log::{GroupLog, LogState};
    use crate::io::{OsVfs, Vfs};
    use crate::journal::{self, EntryKind, ENTRY_HEADER_BYTES};
    use crate::power_cut::{Cut, PowerCutVfs};
    use crate::{AppendRequest, Config, Engine, FsyncPolicy};

    fn config(dir: &Path) -> Config {
        let mut c = crate::tests::small_config(dir);
        c.fsync = FsyncPolicy::Never;
        c.journal_file_bytes = 4096;
        c.checkpoint_journal_bytes = 1 << 30;
        // Above the group's bytes: a promotion makes one segment.
        c.segment_bytes_max = 1 << 20;
        c
    }

    /// A data directory whose journal holds 30 rounds of group 1 (1 to 3
    /// records each, in many files), and group 1's extent list as apply
    /// will build it, with its records as the engine reads them.
    fn fixture(dir: &Path) -> (ExtentList, Vec<u8>) {
        let e = Engine::open(config(dir)).unwrap();
        e.create_group(1).unwrap();
        let mut cmid = 0;
        for round in 0..30u64 {
            let tickets: Vec<_> = (0..1 + round % 3)
                .map(|_| {
                    cmid += 1;
                    let payload = vec![b'p'; (cmid * 13 % 200) as usize];
                    e.submit(&AppendRequest {
                        group_id: 1,
                        sender_id: 4,
                        client_msg_id: cmid,
                        payload: &payload,
                    })
                    .unwrap()
                })
                .collect();
            for t in tickets {
                e.wait(t).unwrap();
            }
        }
        let all = e.read(1, 0, usize::MAX, usize::MAX).unwrap();
        let bytes = all.chunks.iter().flat_map(|c| c.bytes().to_vec()).collect();
        e.close().unwrap();
        // The engine made group 1's files at its first record: a promotion
        // of a small group starts without them.
        std::fs::remove_dir_all(dir.join("groups")).unwrap();
        std::fs::create_dir(dir.join("groups")).unwrap();
        let mut list = ExtentList::new(1);
        for (seq, path) in journal::list(&OsVfs, &journal::journal_dir(dir)).unwrap() {
            let file = std::fs::read(&path).unwrap();
            for f in journal::frames_of_file(&file) {
                for (at, len, kind, group) in f.entries {
                    if kind == EntryKind::Records && group == 1 {
                        let body = &file[at + ENTRY_HEADER_BYTES..at + len];
                        let (first, n) = journal::body::decode_records(body).unwrap();
                        let offset = (at + ENTRY_HEADER_BYTES) as u32;
                        let ext = Extent::new(
                            FileId::journal(seq).unwrap(),
                            offset,
                            body.len() as u32,
                            n as u32,
                        );
                        list.append(first, ext.unwrap());
                    }
                }
            }
        }
        (list, bytes)
    }

    /// The records a segment log of `copy` serves, after a verifying load.
    fn loaded(dir: &Path, copy: &SegmentCopy) -> crate::Result<Vec<u8>> {
        let ctx = LogContext::new(Arc::new(OsVfs), config(dir));
        let state = LogState {
            head: copy.head,
            segments: vec![(copy.floor, copy.len)],
        };
        let (log, _) = GroupLog::load(&ctx, 1, &state)?;
        let batch = log.read(&ctx, 0, usize::MAX, usize::MAX)?;
        Ok(batch
            .chunks
            .iter()
            .flat_map(|c| c.bytes().to_vec())
            .collect())
    }

    fn promote(dir: &Path, vfs: Arc<dyn Vfs>, list: &ExtentList) -> crate::Result<SegmentCopy> {
        let ctx = LogContext::new(vfs.clone(), config(dir));
        let files = SharedFiles::new(vfs, journal::journal_dir(dir), 4);
        copy_to_segment(&ctx, &files, 1, list)
    }

    #[test]
    fn a_promoted_group_reads_the_same_records_from_its_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (list, want) = fixture(dir.path());
        let copy = promote(dir.path(), Arc::new(OsVfs), &list).unwrap();
        assert_eq!((copy.floor, copy.head), (1, list.next_id() - 1));
        assert_eq!(copy.len, 64 + want.len() as u64);
        assert_eq!(
            loaded(dir.path(), &copy).unwrap(),
            want,
            "records identical"
        );
        // Again (a crash after the copy, before any checkpoint named it):
        // the stale directory goes to the trash and the copy is made anew.
        let again = promote(dir.path(), Arc::new(OsVfs), &list).unwrap();
        assert_eq!(
            (again.floor, again.head, again.len),
            (copy.floor, copy.head, copy.len)
        );
        assert_eq!(loaded(dir.path(), &again).unwrap(), want);
    }

    /// A power cut before every file operation of a promotion: what is left
    /// is never needed (no state names it) and never in the way (the next
    /// attempt makes a complete, durable copy); a promotion that returned
    /// before the cut survives it whole.
    #[test]
    fn a_power_cut_at_every_step_of_a_promotion_loses_nothing() {
        let base = tempfile::tempdir().unwrap();
        let (list, want) = fixture(base.path());
        let copy_tree = |to: &Path| {
            let out = std::process::Command::new("cp")
                .arg("-a")
                .arg(format!("{}/.", base.path().display()))
                .arg(to)
                .status()
                .unwrap();
            assert!(out.success());
        };
        // Operations of a whole promotion.
        let probe = tempfile::tempdir().unwrap();
        copy_tree(probe.path());
        let vfs = PowerCutVfs::new(probe.path());
        let control = vfs.control.clone();
        let before = control.ops();
        promote(probe.path(), Arc::new(vfs), &list).unwrap();
        let steps = control.ops() - before;
        assert!(steps >= 5, "mkdir, create, write, sync, dir syncs: {steps}");
        for n in 1..=steps + 1 {
            let dir = tempfile::tempdir().unwrap();
            copy_tree(dir.path());
            let vfs = PowerCutVfs::new(dir.path());
            let control = vfs.control.clone();
            control.freeze_after(n);
            let done = promote(dir.path(), Arc::new(vfs), &list).unwrap();
            let returned_before_cut = !control.is_frozen();
            control.cut(Cut::Seeded(n)).unwrap();
            if returned_before_cut {
                assert_eq!(
                    loaded(dir.path(), &done).unwrap(),
                    want,
                    "step {n}: durable"
                );
            }
            // The group is still small wherever the cut fell: promoting it
            // again from the journal gives the same records.
            let again = promote(dir.path(), Arc::new(OsVfs), &list).unwrap();
            assert_eq!(loaded(dir.path(), &again).unwrap(), want, "step {n}");
        }
    }

    #[test]
    fn a_damaged_record_stops_the_promotion_naming_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let (list, _) = fixture(dir.path());
        let victim = list.extents()[2];
        let path = journal::journal_path(&journal::journal_dir(dir.path()), victim.file().seq());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[victim.end() as usize - 1] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        match promote(dir.path(), Arc::new(OsVfs), &list) {
            Err(crate::Error::GroupDamaged { group: 1, reason }) => {
                assert!(reason.contains(&path.display().to_string()), "{reason}")
            }
            other => panic!("{:?}", other.map(|c| c.len)),
        }
        assert!(
            !crate::group_log::group_dir(dir.path(), 1).exists(),
            "nothing made for a damaged group"
        );
    }
}
