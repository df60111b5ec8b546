//! Storage v2 step S5: small groups keep their records in the journal
//! (`small_log.rs`). Every read (read, pull, history), the dedup window,
//! promotion past the threshold, every kind of restart, the journal files
//! their records pin, and damage to one small group's record.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::commit::journal;
use crate::tests::{payload, small_config};
use crate::{AppendRequest, Config, Engine, Error, JoinStart};

/// Groups keep up to 1,500 bytes of records (about ten records of
/// `payload`), journal files roll every 4 KiB, checkpoints only on request.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 1500;
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 1 << 30;
    c
}

const GROUPS: u64 = 8;

/// Each group's records as sent; a member `100 + g` joined at the start.
#[derive(Default)]
struct Model {
    sent: BTreeMap<u64, Vec<Vec<u8>>>,
}

impl Model {
    fn create(&mut self, e: &Engine) {
        for g in 1..=GROUPS {
            e.create_group(g).unwrap();
            e.join(g, 100 + g, JoinStart::Earliest).unwrap();
            self.sent.insert(g, Vec::new());
        }
    }

    /// One round of sends, one batch: group 1 gets ten records (so it is
    /// promoted at once), groups 2 to 4 `(round + g) % 4` (promoted after
    /// a few rounds), the others one every eighth round (they stay small).
    fn round(&mut self, e: &Engine, round: u64) {
        let mut batch = Vec::new();
        for g in 1..=GROUPS {
            let n = match g {
                1 => 10,
                2..=4 => (round + g) % 4,
                _ => u64::from(round % 8 == g % 8),
            };
            for _ in 0..n {
                let id = self.sent[&g].len() as u64 + 1;
                let p = payload(g, id);
                self.sent.get_mut(&g).unwrap().push(p.clone());
                batch.push((g, id, p));
            }
        }
        let requests: Vec<AppendRequest<'_>> = batch
            .iter()
            .map(|(g, id, p)| AppendRequest {
                group_id: *g,
                sender_id: 1,
                client_msg_id: *id,
                payload: p,
            })
            .collect();
        for (r, (_, id, _)) in e.append_batch(&requests).unwrap().iter().zip(&batch) {
            assert_eq!(r.msg_id, *id, "ids are dense");
            assert!(!r.duplicate);
        }
    }

    fn bytes(&self, g: u64) -> u64 {
        self.sent[&g].iter().map(|p| 44 + p.len() as u64).sum()
    }

    /// Every read of every group answers the model, and a group has files
    /// of its own exactly when its records passed the threshold.
    fn check(&self, e: &Engine, dir: &Path, what: &str) {
        for (&g, records) in &self.sent {
            let want: Vec<Vec<u8>> = records.clone();
            assert_eq!(e.head(g).unwrap(), want.len() as u64, "{what}: head of {g}");
            // read, by pages of 7
            let mut got = Vec::new();
            let mut after = 0;
            loop {
                let b = e.read(g, after, 7, 1 << 20).unwrap();
                for r in b.records() {
                    assert_eq!(r.header.msg_id, got.len() as u64 + 1);
                    got.push(r.payload().to_vec());
                }
                if !b.has_more {
                    break;
                }
                after = b.last_id;
            }
            assert_eq!(got, want, "{what}: read of group {g}");
            // pull by a member from its cursor 0, pages of 5 records or 600 bytes
            let p = e.pull(g, 100 + g, 5, 600, None).unwrap();
            let pulled: Vec<Vec<u8>> = p.batch.records().map(|r| r.payload().to_vec()).collect();
            let n = pulled.len();
            assert!(n >= want.len().min(1) && n <= 5, "{what}: pull page of {n}");
            assert_eq!(pulled, want[..n], "{what}: pull of group {g}");
            // history backwards by pages of 3
            let mut back: Vec<Vec<u8>> = Vec::new();
            let mut before = None;
            loop {
                let h = e.history(g, 100 + g, before, 3, 1 << 20).unwrap();
                let page: Vec<(u64, Vec<u8>)> = h
                    .batch
                    .records()
                    .map(|r| (r.header.msg_id, r.payload().to_vec()))
                    .collect();
                let Some(&(first, _)) = page.first() else {
                    break;
                };
                back.splice(0..0, page.into_iter().map(|(_, p)| p));
                if h.complete {
                    break;
                }
                before = Some(first);
            }
            assert_eq!(back, want, "{what}: history of group {g}");
            let has_dir = crate::logs::group_log::group_dir(dir, g).exists();
            let promoted = self.bytes(g) > 1500;
            assert_eq!(
                has_dir,
                promoted,
                "{what}: files of group {g}, {} bytes",
                self.bytes(g)
            );
        }
    }
}

#[test]
fn small_groups_serve_every_read_from_the_journal_across_every_kind_of_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let mut m = Model::default();
    let mut e = Engine::open(config(path)).unwrap();
    m.create(&e);
    let mut round = 0;
    let mut rounds = |e: &Engine, m: &mut Model, n: u64| {
        for _ in 0..n {
            m.round(e, round);
            round += 1;
        }
    };
    rounds(&e, &mut m, 6);
    m.check(&e, path, "live");
    assert!(
        std::fs::read_dir(journal::journal_dir(path))
            .unwrap()
            .count()
            > 3,
        "the records span several journal files"
    );
    // A crash: replay rebuilds the extents (and promotes again).
    e.simulate_crash();
    e = Engine::open(config(path)).unwrap();
    m.check(&e, path, "after a crash");
    rounds(&e, &mut m, 4);
    // A checkpoint records the extents; a crash after more rounds replays
    // only those.
    e.checkpoint().unwrap();
    rounds(&e, &mut m, 3);
    e.simulate_crash();
    e = Engine::open(config(path)).unwrap();
    m.check(&e, path, "after a checkpoint and a crash");
    rounds(&e, &mut m, 3);
    e.close().unwrap();
    e = Engine::open(config(path)).unwrap();
    m.check(&e, path, "after a clean close");
    rounds(&e, &mut m, 8);
    m.check(&e, path, "at the end");
    assert!(
        (2..=GROUPS).any(|g| m.bytes(g) <= 1500) && (2..=GROUPS).any(|g| m.bytes(g) > 1500),
        "the workload leaves some groups small and promotes others"
    );
}

#[test]
fn a_retransmit_to_a_small_group_is_a_duplicate_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path())).unwrap();
    e.create_group(5).unwrap();
    let first = e.append(5, 9, 77, b"once").unwrap();
    e.append(5, 9, 78, b"twice").unwrap();
    e.simulate_crash();
    let e = Engine::open(config(dir.path())).unwrap();
    // The window is rebuilt from the journal: the retransmit is found.
    let again = e.append(5, 9, 77, b"once").unwrap();
    assert!(again.duplicate);
    assert_eq!(again.msg_id, first.msg_id);
    assert_eq!(e.head(5).unwrap(), 2);
    assert!(!crate::logs::group_log::group_dir(dir.path(), 5).exists());
}

fn journal_files(dir: &Path) -> Vec<u64> {
    let jdir = journal::journal_dir(dir);
    let mut seqs: Vec<u64> = std::fs::read_dir(jdir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".tmj")?.parse().ok()
        })
        .collect();
    seqs.sort_unstable();
    seqs
}

fn cold_files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out: Vec<(PathBuf, u64)> = std::fs::read_dir(journal::journal_dir(dir))
        .unwrap()
        .filter_map(|e| {
            let e = e.ok()?;
            crate::logs::cold::parse_file_name(&e.path())?;
            Some((e.path(), e.metadata().ok()?.len()))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_small_groups_records_leave_old_journal_files_for_a_cold_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.append(1, 1, 1, b"kept in the first journal file")
        .unwrap();
    let first = *journal_files(path).last().unwrap();
    // Traffic elsewhere rolls the journal; checkpoints move the replay
    // position past the file, evacuate it (its record goes to a cold
    // file) and, two checkpoints later, delete it.
    for i in 0..40u64 {
        e.append(2, 1, i + 10, &payload(2, i)).unwrap();
    }
    assert!(journal_files(path).contains(&first));
    for i in 0..5 {
        e.checkpoint().unwrap();
        e.append(2, 1, 1000 + i, b"x").unwrap();
    }
    assert!(
        !journal_files(path).contains(&first),
        "the journal file went once its small record was moved"
    );
    assert!(journal_files(path).len() < 6, "old journal files go");
    assert_eq!(cold_files(path).len(), 1, "the record is in a cold file");
    assert!(e.stats().reclaim_bytes_copied > 0);
    let read = |e: &Engine| -> Vec<Vec<u8>> {
        let b = e.read(1, 0, 10, 1 << 20).unwrap();
        b.records().map(|r| r.payload().to_vec()).collect()
    };
    assert_eq!(read(&e), [b"kept in the first journal file".to_vec()]);
    // A crash, then a clean close: read from the cold file each time.
    e.append(1, 1, 2, b"second").unwrap();
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(read(&e).len(), 2);
    e.close().unwrap();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(read(&e)[0], b"kept in the first journal file");
    // Promoted: the cold file holds nothing live and goes two checkpoints
    // later.
    e.append(1, 1, 3, &vec![b'p'; 1000]).unwrap();
    e.append(1, 1, 4, &vec![b'q'; 1000]).unwrap();
    assert!(
        crate::logs::group_log::group_dir(path, 1).exists(),
        "promoted"
    );
    for _ in 0..3 {
        e.checkpoint().unwrap();
        e.append(2, 1, 5000, b"y").unwrap();
    }
    assert!(cold_files(path).is_empty(), "a dead cold file goes");
    assert_eq!(read(&e).len(), 4);
}

#[test]
fn reclamation_bounds_the_space_of_small_groups_and_what_it_copies() {
    // Many small groups, three in four deleted midway (their cold bytes
    // become garbage spread over every cold file, so only compaction can
    // give it back), a busy big group rolling the journal and many
    // checkpoints: old journal files go, cold files stay within twice the
    // live bytes plus two files (one being written, one awaiting its
    // second checkpoint), and evacuation copies each live byte about once.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    const SMALL: u64 = 120;
    e.create_group(1000).unwrap();
    let mut small_bytes = 0u64;
    for g in 1..=SMALL {
        e.create_group(g).unwrap();
    }
    for round in 0..6u64 {
        for g in 1..=SMALL {
            let p = payload(g, round + 1);
            small_bytes += 44 + p.len() as u64;
            e.append(g, 1, round, &p).unwrap();
        }
        for i in 0..20 {
            e.append(1000, 1, round * 100 + i, &payload(1000, i))
                .unwrap();
        }
        e.checkpoint().unwrap();
    }
    for g in (1..=SMALL).filter(|g| g % 4 != 0) {
        e.delete_group(g).unwrap();
    }
    for round in 0..12u64 {
        for i in 0..20 {
            e.append(1000, 2, round * 100 + i, &payload(1000, i))
                .unwrap();
        }
        e.checkpoint().unwrap();
    }
    let live: u64 = (4..=SMALL)
        .step_by(4)
        .map(|g| {
            (1..=6)
                .map(|i| 44 + payload(g, i).len() as u64)
                .sum::<u64>()
        })
        .sum();
    let cold: u64 = cold_files(path).iter().map(|(_, len)| len).sum();
    // Live bytes as the accounting counts them: records plus a 32-byte
    // header per cold extent (one per round the group appeared in).
    let accounted: u64 = e
        .shared
        .ctx
        .live
        .lock()
        .cold_files()
        .iter()
        .map(|f| f.live)
        .sum();
    assert!(
        accounted <= live + 32 * 6 * SMALL / 4,
        "{accounted} for {live}"
    );
    let file = config(path).journal_file_bytes;
    assert!(
        cold <= 2 * accounted + 2 * file,
        "cold files hold {cold} bytes for {accounted} live"
    );
    assert!(journal_files(path).len() <= 6, "{:?}", journal_files(path));
    let copied = e.stats().reclaim_bytes_copied;
    assert!(
        copied <= 3 * small_bytes,
        "copied {copied} for {small_bytes} bytes of small records"
    );
    for g in (4..=SMALL).step_by(4) {
        let b = e.read(g, 0, 10, 1 << 20).unwrap();
        let got: Vec<Vec<u8>> = b.records().map(|r| r.payload().to_vec()).collect();
        let want: Vec<Vec<u8>> = (1..=6).map(|i| payload(g, i)).collect();
        assert_eq!(got, want, "group {g}");
    }
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    for g in (4..=SMALL).step_by(4) {
        assert_eq!(e.read(g, 0, 10, 1 << 20).unwrap().count, 6, "group {g}");
    }
}

/// The journal file and offset of the first occurrence of `needle`.
fn find_in_journal(dir: &Path, needle: &[u8]) -> (PathBuf, usize) {
    for seq in journal_files(dir) {
        let path = journal::journal_path(&journal::journal_dir(dir), seq);
        let bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            return (path, at);
        }
    }
    panic!("not in the journal");
}

fn flip(path: &Path, at: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_flipped_byte_in_a_small_groups_record_damages_only_that_group() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    for g in [1, 2] {
        e.create_group(g).unwrap();
        e.append(g, 1, 1, format!("group {g} record one").as_bytes())
            .unwrap();
    }
    // A clean close: nothing is replayed, the records are read from the
    // journal file where they are.
    e.close().unwrap();
    let (file, at) = find_in_journal(path, b"group 1 record one");
    flip(&file, at + 3);
    let e = Engine::open(config(path)).unwrap();
    match e.read(1, 0, 10, 1 << 20) {
        Err(Error::GroupDamaged { group: 1, reason }) => {
            assert!(
                reason.contains(&file.display().to_string()),
                "names the file: {reason}"
            );
        }
        other => panic!("expected GroupDamaged, got {:?}", other.map(|b| b.count)),
    }
    assert!(matches!(
        e.append(1, 1, 2, b"more"),
        Err(Error::GroupDamaged { group: 1, .. })
    ));
    // The other group reads and takes sends.
    assert_eq!(e.read(2, 0, 10, 1 << 20).unwrap().count, 1);
    assert_eq!(e.append(2, 1, 2, b"more").unwrap().msg_id, 2);
}

#[test]
fn a_flipped_byte_in_a_small_record_the_journal_must_replay_refuses_the_open() {
    // The known limitation (format-spec/storage.md, recovery): a damaged
    // durable frame is restored only from segment copies, and a small
    // group has none, so the open fails naming the file and offset rather
    // than dropping an acknowledged record.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    e.create_group(1).unwrap();
    e.append(1, 1, 1, b"group 1 record one").unwrap();
    e.append(1, 1, 2, b"group 1 record two").unwrap();
    e.simulate_crash();
    let (file, at) = find_in_journal(path, b"group 1 record one");
    flip(&file, at + 3);
    match Engine::open(config(path)) {
        Err(Error::Corrupt { path: p, .. }) => assert_eq!(p, file),
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("opened over a damaged acknowledged record"),
    }
}

/// Sends `payload(group, i)` for i in 1..=n from sender 7 in one batch
/// (one round: one extent of a small group); returns the payloads.
fn send_in_one_round(e: &Engine, group: u64, n: u64) -> Vec<Vec<u8>> {
    let payloads: Vec<Vec<u8>> = (1..=n).map(|i| payload(group, i)).collect();
    let reqs: Vec<AppendRequest<'_>> = payloads
        .iter()
        .zip(1u64..)
        .map(|(p, i)| AppendRequest {
            group_id: group,
            sender_id: 7,
            client_msg_id: i,
            payload: p,
        })
        .collect();
    for (r, id) in e.append_batch(&reqs).unwrap().iter().zip(1u64..) {
        assert_eq!(r.msg_id, id);
    }
    payloads
}

/// Storage v2 design 5.5: retention trims small groups too. Cursor
/// retention raises a small group's floor to the record (here inside an
/// extent: the slowest member is in the middle of one), the floor survives
/// every kind of restart, and the journal files that held only dropped
/// records go once two checkpoints no longer pin them, without waiting for
/// an evacuation to copy anything.
#[test]
fn cursor_retention_trims_a_small_group_and_gives_its_journal_files_back() {
    use crate::Retention;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    for user in [100, 101] {
        e.join(1, user, JoinStart::Earliest).unwrap();
    }
    // Ids 1-3 in one round (one extent), then one round each for 4-9;
    // group 2's traffic rolls the journal between them.
    send_in_one_round(&e, 1, 3);
    let oldest_file = *journal_files(path).last().unwrap();
    for i in 4..=9u64 {
        e.append(1, 7, i, &payload(1, i)).unwrap();
        for j in 0..8u64 {
            e.append(2, 7, i * 100 + j, &payload(2, i * 100 + j))
                .unwrap();
        }
    }
    assert!(
        !crate::logs::group_log::group_dir(path, 1).exists(),
        "still small"
    );
    e.set_retention(
        1,
        Retention {
            by_cursor: true,
            ..Default::default()
        },
    )
    .unwrap();
    e.ack(1, 100, 6).unwrap();
    e.ack(1, 101, 2).unwrap();
    e.checkpoint().unwrap();
    let floor = |e: &Engine| e.group_info(1).unwrap().floor;
    assert_eq!(
        floor(&e),
        3,
        "the slowest member read 2: inside the first extent"
    );
    let b = e.read(1, 0, 10, 1 << 20).unwrap();
    assert_eq!(
        b.records().next().unwrap().header.msg_id,
        3,
        "reads start at the floor"
    );

    e.ack(1, 101, 6).unwrap();
    e.checkpoint().unwrap();
    assert_eq!(floor(&e), 7);
    let ids = |e: &Engine| -> Vec<u64> {
        let b = e.read(1, 6, 10, 1 << 20).unwrap();
        b.records().map(|r| r.header.msg_id).collect()
    };
    assert_eq!(ids(&e), [7, 8, 9]);
    // Two more checkpoints: the journal file of ids 1-3 held nothing else
    // live (group 2 was promoted to its own segments at once), so it goes.
    for i in 0..2u64 {
        e.append(2, 7, 10_000 + i, b"z").unwrap();
        e.checkpoint().unwrap();
    }
    assert!(
        !journal_files(path).contains(&oldest_file),
        "the journal file of the dropped records went"
    );
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!((floor(&e), ids(&e)), (7, vec![7, 8, 9]), "after a crash");
    e.close().unwrap();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(
        (floor(&e), ids(&e)),
        (7, vec![7, 8, 9]),
        "after a clean close"
    );
    assert_eq!(e.head(1).unwrap(), 9);
    assert_eq!(e.append(1, 7, 10, b"next").unwrap().msg_id, 10, "ids go on");
}

/// Age retention drops a small group's whole extents whose records are all
/// older than the limit; with every record old, all of them (the floor
/// passes the head, which stays: ids are never reused).
#[test]
fn age_retention_drops_every_old_record_of_a_small_group() {
    use crate::Retention;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    e.create_group(1).unwrap();
    for i in 1..=4u64 {
        e.append(1, 7, i, &payload(1, i)).unwrap();
    }
    let max_age = |max_age_ms| Retention {
        max_age_ms,
        ..Default::default()
    };
    // A limit no record can reach while the test runs, however slowly.
    e.set_retention(1, max_age(600_000)).unwrap();
    e.checkpoint().unwrap();
    assert_eq!(e.group_info(1).unwrap().floor, 1, "nothing is old yet");
    // The records' timestamps come from the clock; make them old.
    e.set_retention(1, max_age(50)).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(120));
    e.checkpoint().unwrap();
    assert_eq!(e.group_info(1).unwrap().floor, 5);
    assert_eq!(e.head(1).unwrap(), 4);
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(e.group_info(1).unwrap().floor, 5);
    assert_eq!(e.append(1, 7, 5, b"new").unwrap().msg_id, 5);
    let b = e.read(1, 4, 10, 1 << 20).unwrap();
    assert_eq!(
        b.records().map(|r| r.header.msg_id).collect::<Vec<_>>(),
        [5]
    );
}

/// A rewrite leaves out the records below a small group's floor that
/// share an extent with kept ones (design 5.5): the cold copy starts at
/// the floor, and reads after it answer the same.
#[test]
fn a_rewrite_drops_the_records_below_a_small_groups_floor() {
    use crate::Retention;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(config(path)).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 100, JoinStart::Earliest).unwrap();
    let payloads = send_in_one_round(&e, 1, 6);
    let kept: u64 = payloads[4..].iter().map(|p| 44 + p.len() as u64).sum();
    e.set_retention(
        1,
        Retention {
            by_cursor: true,
            ..Default::default()
        },
    )
    .unwrap();
    e.ack(1, 100, 4).unwrap();
    let copied_before = e.stats().reclaim_bytes_copied;
    // Traffic elsewhere rolls the journal; checkpoints move the replay
    // position past the file and evacuate it.
    for i in 0..40u64 {
        e.append(2, 1, i + 10, &payload(2, i)).unwrap();
    }
    for i in 0..4 {
        e.checkpoint().unwrap();
        e.append(2, 1, 1000 + i, b"x").unwrap();
    }
    assert_eq!(
        cold_files(path).len(),
        1,
        "the kept records are in a cold file"
    );
    assert_eq!(
        e.stats().reclaim_bytes_copied - copied_before,
        kept,
        "only the records at or above the floor were copied"
    );
    let ids = |e: &Engine| -> Vec<u64> {
        let b = e.read(1, 4, 10, 1 << 20).unwrap();
        b.records().map(|r| r.header.msg_id).collect()
    };
    assert_eq!(ids(&e), [5, 6]);
    e.simulate_crash();
    let e = Engine::open(config(path)).unwrap();
    assert_eq!(ids(&e), [5, 6]);
    assert_eq!(e.group_info(1).unwrap().floor, 5);
}
