//! Reads of a small group's records where its commit rounds wrote them:
//! inside the Records entries of the shared journal files (storage v2
//! design 3.1, step S5). The group's [`ExtentList`] says where they are;
//! this module maps the files and serves the records as slices of the
//! mappings, so disk bytes are wire bytes (the record CRC included).
//!
//! Representation: [`SharedFiles`] (`shared_files.rs`) keeps a read-only
//! mapping of each shared file a read used ([`SharedMap`]: the whole file
//! as long as it was when mapped), at most `max_open` of them, least
//! recently used first out. A mapping of the journal file still being
//! written is mapped again when a read needs bytes past its end.
//!
//! Invariants:
//! - a mapping is touched only below the length the file has now: every
//!   use measures the file first (one `fstat`, `io::check_mapped_len`, the
//!   guard segments use), also when a mapping made earlier is long enough,
//!   so a file cut under the engine (by another program: the engine cuts
//!   none while it runs) is `GroupDamaged`, not SIGBUS (storage.md section
//!   4 "Reads", with the windows it lists). Deleting a file keeps its
//!   mapping valid, so a reader never races with deletion;
//! - an extent is served only from a file that says it holds the group's
//!   records there ([`SharedFiles::map_piece`]: a cold file's extent
//!   header, a journal file's own seq), so another group's valid records
//!   at the place a list names are never served;
//! - every record served was walked by [`extents::read_run`]: its id is the
//!   one the list says and, until its extent is `verified`, its CRC holds;
//!   anything else (a damaged record, a missing or short file) is
//!   `GroupDamaged` naming the file and offset, never a panic.
//!
//! Costs: [`read_above`] walks the extents a page needs, each from its
//! start to the last record served (a small group holds at most
//! `small_group_bytes_max` bytes); [`read_before`] walks at most the
//! `max_count` records below `before`, twice. No lock is held while the
//! files are read: the caller copies the list under the group's lock and
//! marks the extents this read verified afterwards
//! ([`ExtentList::mark_verified`]).
//!
//! Used by `commit/small_log.rs` (the reads behind `with_log` and the
//! dedup rebuild) and `commit/apply.rs` (the promotion's copy).

use crate::error::Result;
use crate::logs::extents::{self, Extent, ExtentList};
use crate::logs::group_log::{Chunk, ReadBatch};
use crate::logs::shared_files::SharedFiles;

/// What a read of a small group found: the records, and the extents it
/// verified (every record's CRC checked), whose flags the caller sets.
pub struct SmallRead {
    pub batch: ReadBatch,
    pub verified: Vec<Extent>,
}

/// The records of `group` above `after`, at most `count_max` of them and
/// `max_bytes` bytes, except that the first is served whatever its size
/// (0.1's page rule, as `GroupLog::read`). `list` is the group's extent
/// list, copied under its lock; `has_more` says whether records above the
/// last one served exist.
pub fn read_above(
    files: &SharedFiles,
    group: u64,
    list: &ExtentList,
    after: u64,
    count_max: u64,
    max_bytes: usize,
) -> Result<SmallRead> {
    let head = list.next_id() - 1;
    let mut batch = ReadBatch {
        last_id: after,
        has_more: after < head,
        ..ReadBatch::default()
    };
    let mut verified = Vec::new();
    if after >= head || count_max == 0 {
        return Ok(SmallRead { batch, verified });
    }
    let mut from = after.saturating_add(1).max(list.floor());
    for p in list.covering(after, count_max, max_bytes) {
        let map = files.map_piece(group, &p)?;
        let r = extents::read_run(
            map.bytes(),
            map.path(),
            group,
            &p,
            from.max(p.first_id),
            count_max - batch.count,
            max_bytes.saturating_sub(batch.bytes),
            batch.count == 0,
        )?;
        if r.verified_now {
            verified.push(p.ext);
        }
        if r.count > 0 {
            batch
                .chunks
                .push(Chunk::shared(map, r.start as usize, r.end as usize));
            batch.count += r.count;
            batch.bytes += (r.end - r.start) as usize;
            batch.last_id = r.first_id + r.count - 1;
        }
        if r.full {
            break;
        }
        from = p.end_id();
    }
    batch.has_more = batch.last_id < head;
    Ok(SmallRead { batch, verified })
}

/// The newest records of `group` below `before` and not below `lowest`: at
/// most `max_count` of them and `max_bytes` bytes, except that the newest
/// is served whatever its size; ascending, `has_more` not set (as
/// `GroupLog::read_before`). Walks the `max_count` records below `before`
/// to find where the byte budget ends, then reads the answer.
pub fn read_before(
    files: &SharedFiles,
    group: u64,
    list: &ExtentList,
    before: u64,
    lowest: u64,
    max_count: usize,
    max_bytes: usize,
) -> Result<SmallRead> {
    let before = before.min(list.next_id());
    let lowest = lowest
        .max(list.floor())
        .max(before.saturating_sub(max_count as u64));
    if lowest >= before {
        let batch = ReadBatch {
            last_id: before.saturating_sub(1),
            ..ReadBatch::default()
        };
        return Ok(SmallRead {
            batch,
            verified: Vec::new(),
        });
    }
    let span = read_above(files, group, list, lowest - 1, before - lowest, usize::MAX)?;
    let lens: Vec<usize> = span.batch.records().map(|r| r.bytes.len()).collect();
    // Newest first: the newest record whatever its size, then while the
    // budget holds.
    let (mut start, mut bytes) = (before, 0usize);
    for len in lens.iter().rev() {
        if start < before && bytes + len > max_bytes {
            break;
        }
        bytes += len;
        start -= 1;
    }
    let mut answer = read_above(files, group, list, start - 1, before - start, usize::MAX)?;
    answer.batch.has_more = false;
    answer.verified.extend(span.verified);
    Ok(answer)
}

/// Retention's view of a small group (`retention::plan_small`): for each
/// extent, oldest first, the id of its last record, its bytes and an upper
/// bound of its records' timestamps: the next extent's first record's, the
/// group's last record's for the last extent. Timestamps never decrease
/// within a group, so the bound holds. Without `with_timestamps` (no age
/// policy) the bound is `u64::MAX` and nothing is read. With it, the cost is
/// one record read per extent (verified reads, as any read).
pub fn retention_view(
    files: &SharedFiles,
    group: u64,
    list: &ExtentList,
    with_timestamps: bool,
) -> Result<Vec<crate::logs::retention::SealedSegment>> {
    let pieces: Vec<_> = list.pieces().collect();
    let mut out = Vec::with_capacity(pieces.len());
    for (i, p) in pieces.iter().enumerate() {
        let next_first_timestamp_ms = if !with_timestamps {
            u64::MAX
        } else {
            let read = match pieces.get(i + 1) {
                Some(next) => read_above(files, group, list, next.first_id - 1, 1, usize::MAX)?,
                None => read_before(files, group, list, p.end_id(), p.first_id, 1, usize::MAX)?,
            };
            let first = read.batch.records().next();
            first.map_or(u64::MAX, |r| r.header.timestamp_ms)
        };
        out.push(crate::logs::retention::SealedSegment {
            last_id: p.end_id() - 1,
            bytes: u64::from(p.ext.bytes()),
            next_first_timestamp_ms,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::commit::journal::{self, EntryKind, ENTRY_HEADER_BYTES};
    use crate::error::Error;
    use crate::io::OsVfs;
    use crate::logs::extents::FileId;
    use crate::{AppendRequest, Engine, FsyncPolicy};

    /// An engine that rolls its journal every 4 KiB and deletes none of
    /// it: groups 1 and 2 get rounds of 1 to 5 records of mixed sizes,
    /// interleaved, so each group's records lie in many rounds and files.
    fn written(dir: &Path) -> Engine {
        let mut c = crate::tests::small_config(dir);
        c.fsync = FsyncPolicy::Never;
        c.journal_file_bytes = 4096;
        c.checkpoint_journal_bytes = 1 << 30;
        let e = Engine::open(c).unwrap();
        e.create_group(1).unwrap();
        e.create_group(2).unwrap();
        let mut cmid = 0;
        for round in 0..40u64 {
            let tickets: Vec<_> = (0..1 + round % 5)
                .flat_map(|i| [1, 2].map(|g| (g, i)))
                .map(|(g, i)| {
                    cmid += 1;
                    let payload =
                        vec![b'a' + (cmid % 26) as u8; ((round * 37 + i * 101) % 300) as usize];
                    e.submit(&AppendRequest {
                        group_id: g,
                        sender_id: 9,
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
        e
    }

    /// Group `g`'s extent list as apply will build it: one extent per
    /// Records entry, at its body's offset in its journal file.
    fn extents_of(dir: &Path, g: u64) -> ExtentList {
        let mut list = ExtentList::new(1);
        let jdir = journal::journal_dir(dir);
        for (seq, path) in journal::list(&OsVfs, &jdir).unwrap() {
            let bytes = std::fs::read(&path).unwrap();
            for f in journal::frames_of_file(&bytes) {
                for (at, len, kind, group) in f.entries {
                    if kind != EntryKind::Records || group != g {
                        continue;
                    }
                    let body = &bytes[at + ENTRY_HEADER_BYTES..at + len];
                    let (first, n) = journal::body::decode_records(body).unwrap();
                    let ext = Extent::new(
                        FileId::journal(seq).unwrap(),
                        (at + ENTRY_HEADER_BYTES) as u32,
                        body.len() as u32,
                        n as u32,
                    )
                    .unwrap();
                    list.append(first, ext);
                }
            }
        }
        list
    }

    fn files(dir: &Path) -> SharedFiles {
        SharedFiles::new(Arc::new(OsVfs), journal::journal_dir(dir), 2)
    }

    fn bytes_of(b: &ReadBatch) -> Vec<u8> {
        b.chunks.iter().flat_map(|c| c.bytes().to_vec()).collect()
    }

    #[test]
    fn pages_read_from_the_journal_equal_the_segment_logs_pages() {
        let dir = tempfile::tempdir().unwrap();
        let e = written(dir.path());
        let shared = files(dir.path());
        for g in [1, 2] {
            let mut list = extents_of(dir.path(), g);
            let head = e.head(g).unwrap();
            assert_eq!(list.next_id() - 1, head);
            let files_used: std::collections::BTreeSet<_> =
                list.extents().iter().map(|x| x.file()).collect();
            assert!(files_used.len() >= 5, "spans {} files", files_used.len());
            for after in [0, 1, 7, head / 2, head - 1, head, head + 3] {
                for (count, bytes) in [(1, 0), (3, usize::MAX), (50, 700), (1000, usize::MAX)] {
                    let got = read_above(&shared, g, &list, after, count, bytes).unwrap();
                    let want = e.read(g, after, count as usize, bytes).unwrap();
                    let what = format!("group {g} after {after} count {count} bytes {bytes}");
                    assert_eq!(bytes_of(&got.batch), bytes_of(&want), "{what}");
                    assert_eq!(
                        (
                            got.batch.count,
                            got.batch.last_id,
                            got.batch.has_more,
                            got.batch.bytes
                        ),
                        (want.count, want.last_id, want.has_more, want.bytes),
                        "{what}"
                    );
                    for x in &got.verified {
                        list.mark_verified(x);
                    }
                }
            }
            assert!(
                list.extents().iter().all(|x| x.is_verified()),
                "reads to the head verified every extent"
            );
            // History pages: the newest whatever its size, then by budget.
            let all: Vec<(u64, usize)> = e
                .read(g, 0, usize::MAX, usize::MAX)
                .unwrap()
                .records()
                .map(|r| (r.header.msg_id, r.bytes.len()))
                .collect();
            for before in [1, 2, head / 3, head, head + 1, head + 10] {
                for (lowest, count, bytes) in
                    [(1, 5, usize::MAX), (1, 100, 500), (head / 2, 100, 0)]
                {
                    let got = read_before(&shared, g, &list, before, lowest, count, bytes).unwrap();
                    let mut want = Vec::new();
                    let mut used = 0;
                    for &(id, len) in all.iter().rev() {
                        if id >= before.min(head + 1) {
                            continue;
                        }
                        if id < lowest
                            || want.len() >= count
                            || (!want.is_empty() && used + len > bytes)
                        {
                            break;
                        }
                        used += len;
                        want.push(id);
                    }
                    want.reverse();
                    let ids: Vec<u64> = got.batch.records().map(|r| r.header.msg_id).collect();
                    assert_eq!(
                        ids, want,
                        "group {g} before {before} lowest {lowest} {count} {bytes}"
                    );
                    assert!(!got.batch.has_more);
                }
            }
        }
    }

    #[test]
    fn a_flipped_byte_is_damage_naming_file_and_offset_and_other_groups_read_on() {
        let dir = tempfile::tempdir().unwrap();
        let e = written(dir.path());
        e.close().unwrap();
        let (list1, list2) = (extents_of(dir.path(), 1), extents_of(dir.path(), 2));
        let victim = list1.extents()[3];
        let path = crate::commit::journal::journal_path(
            &journal::journal_dir(dir.path()),
            victim.file().seq(),
        );
        let mut bytes = std::fs::read(&path).unwrap();
        let at = victim.offset() as usize + victim.bytes() as usize - 2; // in the last record's payload
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let shared = files(dir.path());
        let err = read_above(&shared, 1, &list1, 0, u64::MAX, usize::MAX)
            .err()
            .expect("damage found");
        let Error::GroupDamaged { group: 1, reason } = &err else {
            panic!("{err}")
        };
        assert!(reason.contains(&path.display().to_string()), "{reason}");
        let record_at = {
            // The damaged record starts somewhere in the extent; the reason
            // names its offset.
            let mut pos = victim.offset() as usize;
            loop {
                let len = crate::logs::record::peek_len(&bytes[pos..]).unwrap();
                if pos + len > at {
                    break pos;
                }
                pos += len;
            }
        };
        assert!(reason.contains(&format!("offset {record_at}")), "{reason}");
        // The other group's records, also in those files, read on.
        let all2 = read_above(&shared, 2, &list2, 0, u64::MAX, usize::MAX).unwrap();
        assert_eq!(all2.batch.last_id, list2.next_id() - 1);
    }

    #[test]
    fn a_missing_or_short_file_is_damage_of_the_group_never_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let e = written(dir.path());
        e.close().unwrap();
        let list = extents_of(dir.path(), 1);
        let jdir = journal::journal_dir(dir.path());
        let first = list.extents()[0].file();
        let last = list.extents().last().unwrap();
        // Cut the last file inside the group's last extent, remove the first.
        let last_path = journal::journal_path(&jdir, last.file().seq());
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&last_path)
            .unwrap();
        f.set_len(last.end() - 1).unwrap();
        let first_path = journal::journal_path(&jdir, first.seq());
        std::fs::remove_file(&first_path).unwrap();
        let shared = files(dir.path());
        for (after, path) in [(0, &first_path), (list.next_id() - 2, &last_path)] {
            match read_above(&shared, 1, &list, after, u64::MAX, usize::MAX) {
                Err(Error::GroupDamaged { group: 1, reason }) => {
                    assert!(reason.contains(&path.display().to_string()), "{reason}")
                }
                Err(other) => panic!("{other}"),
                Ok(_) => panic!("read past a missing or short file"),
            }
        }
    }

    #[test]
    fn the_mapping_of_a_growing_file_is_renewed_and_the_cache_stays_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let e = written(dir.path());
        let shared = files(dir.path());
        let list = extents_of(dir.path(), 1);
        let seen = read_above(&shared, 1, &list, 0, u64::MAX, usize::MAX).unwrap();
        assert_eq!(seen.batch.last_id, e.head(1).unwrap());
        assert!(shared.mapped() <= 2, "at most max_open mappings");
        // More records in the journal file being written: the cached
        // mapping of it is too short for the new extent and is renewed.
        e.append(1, 9, 1_000_000, b"later").unwrap();
        let list = extents_of(dir.path(), 1);
        let got = read_above(&shared, 1, &list, e.head(1).unwrap() - 1, 10, usize::MAX).unwrap();
        let payloads: Vec<Vec<u8>> = got.batch.records().map(|r| r.payload().to_vec()).collect();
        assert_eq!(payloads, vec![b"later".to_vec()]);
    }
}
