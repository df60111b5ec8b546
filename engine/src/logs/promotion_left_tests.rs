//! Storage.md section 10, case S1 under fsync `never`: the segment files
//! of a small group's promotion that reached the disk while a power cut
//! took the journal entries that promoted the group
//! (`promotion_left.rs`). Their records were acknowledged: the group keeps
//! them and gives no id twice; files that are not its records are not
//! adopted. `verify` names what the open does, where.

use std::path::Path;
use std::sync::Arc;

use crate::io::power_cut::{Cut, PowerCutVfs};
use crate::logs::group_log::group_dir;
use crate::logs::segment;
use crate::offline::DataDir;
use crate::offline::Finding;
use crate::tests::small_config;
use crate::{Config, Engine, Error, FsyncPolicy};

/// Small groups up to 1,500 bytes (ten records of [`message`]), fsync
/// `never`, records written to their segment every round, checkpoints
/// only on request.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 1500;
    c.fsync = FsyncPolicy::Never;
    c.segment_tail_bytes = 0;
    c.checkpoint_journal_bytes = 1 << 30;
    c
}

/// Bytes of a record of [`message`].
const RECORD_BYTES: u64 = 44 + 100;

/// Record `id`'s payload in the run tagged `tag`: 100 bytes.
fn message(tag: &str, id: u64) -> Vec<u8> {
    format!("{tag}-{id};").bytes().cycle().take(100).collect()
}

/// Group 1 gets three records (it stays small) and a checkpoint records
/// them; then records until it is promoted, and five more. The kernel
/// writes the group's files back on its own; then the power goes, and the
/// journal keeps only what the checkpoint synced. Returns the payloads of
/// every acknowledged record, in id order.
fn promote_then_lose_the_journal_tail(root: &Path, c: &Config, tag: &str) -> Vec<Vec<u8>> {
    let vfs = PowerCutVfs::new(root);
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    e.create_group(1).unwrap();
    let mut acked = Vec::new();
    let send = |acked: &mut Vec<Vec<u8>>| {
        let id = acked.len() as u64 + 1;
        let a = e.append(1, 7, id, &message(tag, id)).unwrap();
        assert_eq!(a.msg_id, id);
        acked.push(message(tag, id));
    };
    for _ in 0..3 {
        send(&mut acked);
    }
    e.checkpoint().unwrap();
    let dir = group_dir(&c.data_dir, 1);
    while !dir.exists() {
        send(&mut acked);
    }
    assert_eq!(acked.len(), 11, "promoted past 1,500 bytes");
    for _ in 0..5 {
        send(&mut acked);
    }
    for f in std::fs::read_dir(&dir).unwrap() {
        control.write_back(&f.unwrap().path()).unwrap();
    }
    control.freeze();
    e.simulate_crash();
    control.cut(Cut::DropUnsynced).unwrap();
    acked
}

fn read_all(e: &Engine, group: u64) -> Result<Vec<Vec<u8>>, Error> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let b = e.read(group, after, 7, 1 << 20)?;
        for r in b.records() {
            assert_eq!(r.header.msg_id, out.len() as u64 + 1, "ids dense");
            out.push(r.payload().to_vec());
        }
        if !b.has_more {
            return Ok(out);
        }
        after = b.last_id;
    }
}

/// `verify`'s findings about group 1.
fn verify_group_1(data_dir: &Path) -> Vec<Finding> {
    let v = DataDir::open(data_dir).unwrap().verify().unwrap();
    v.findings
        .into_iter()
        .filter(|f| f.group == Some(1))
        .collect()
}

#[test]
fn a_promotion_whose_journal_entries_a_power_cut_took_keeps_its_acknowledged_ids() {
    for background in [false, true] {
        let root = tempfile::tempdir().unwrap();
        let mut c = config(&root.path().join("data"));
        c.load_in_background = background;
        let acked = promote_then_lose_the_journal_tail(root.path(), &c, "a");
        let n = acked.len() as u64;
        // `verify` names what the open will do, at record 4 of the segment.
        let seg = group_dir(&c.data_dir, 1).join(segment::file_name(1));
        let found = verify_group_1(&c.data_dir);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(!found[0].damage, "{found:?}");
        assert_eq!(found[0].file.as_deref(), Some(seg.as_path()));
        assert_eq!(found[0].offset, 64 + 3 * RECORD_BYTES);
        assert!(
            found[0].what.contains("msg_ids 4..=16"),
            "{}",
            found[0].what
        );
        let e = Engine::open(c.clone()).unwrap();
        let got = read_all(&e, 1).unwrap();
        assert_eq!(got.len(), acked.len(), "acknowledged records read back");
        assert_eq!(got, acked, "background {background}");
        let next = e.append(1, 7, 1000, b"after the cut").unwrap();
        assert_eq!(next.msg_id, n + 1, "no id is given twice");
        e.close().unwrap();
        // The next checkpoint recorded the group with its segments.
        let e = Engine::open(c.clone()).unwrap();
        assert_eq!(read_all(&e, 1).unwrap().len() as u64, n + 1);
        e.close().unwrap();
    }
}

/// The open that adopted the records crashed before its checkpoint was
/// stored (its manifest removed: a power cut before the manifest was
/// durable, while the rest reached the disk). The manifest in force
/// records the group small again, and replay meets the records sent
/// after the adoption, ids past its head: the group adopts the segment
/// files again instead of being damaged for a gap.
#[test]
fn records_adopted_from_a_promotion_survive_a_crash_before_the_next_checkpoint() {
    let root = tempfile::tempdir().unwrap();
    let c = config(&root.path().join("data"));
    let mut acked = promote_then_lose_the_journal_tail(root.path(), &c, "a");
    let manifests = |dir: &Path| {
        let mut m: Vec<_> = std::fs::read_dir(crate::state::manifest::manifest_dir(dir))
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        m.sort();
        m
    };
    let before = manifests(&c.data_dir);
    let e = Engine::open(c.clone()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while e.stats().checkpoints < 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for _ in 0..3 {
        let id = acked.len() as u64 + 1;
        let a = e.append(1, 7, id, &message("a", id)).unwrap();
        assert_eq!(a.msg_id, id);
        acked.push(message("a", id));
    }
    e.simulate_crash();
    for m in manifests(&c.data_dir) {
        if !before.contains(&m) {
            std::fs::remove_file(m).unwrap();
        }
    }
    let e = Engine::open(c.clone()).unwrap();
    assert!(
        e.recovery_report().damaged_groups.is_empty(),
        "{:?}",
        e.recovery_report().damaged_groups
    );
    assert_eq!(read_all(&e, 1).unwrap(), acked);
    let next = e.append(1, 7, 1000, b"after the crash").unwrap();
    assert_eq!(next.msg_id, acked.len() as u64 + 1, "no id is given twice");
}

/// The segment files at a small group's path hold other messages at the
/// ids the group holds (here: another directory's promotion, as a deleted
/// incarnation's directory whose move to the trash a power cut took back
/// would): they are not this group's promotion's, so the group is served
/// from its own records, neither damaged nor mixed with them; the files
/// stay (the next promotion moves them), and `verify` notes them at the
/// first differing record, as the node logs them.
#[test]
fn segment_files_at_a_small_groups_path_that_hold_other_records_are_not_adopted() {
    let (ra, rb) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (ca, cb) = (
        config(&ra.path().join("data")),
        config(&rb.path().join("data")),
    );
    promote_then_lose_the_journal_tail(ra.path(), &ca, "a");
    let acked = promote_then_lose_the_journal_tail(rb.path(), &cb, "b");
    let (da, db) = (group_dir(&ca.data_dir, 1), group_dir(&cb.data_dir, 1));
    for f in std::fs::read_dir(&db).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    for f in std::fs::read_dir(&da).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, db.join(f.file_name().unwrap())).unwrap();
    }
    let seg = db.join(segment::file_name(1));
    let found = verify_group_1(&cb.data_dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(!found[0].damage, "{found:?}");
    assert_eq!(found[0].file.as_deref(), Some(seg.as_path()));
    assert_eq!(found[0].offset, 64, "record 1 differs");
    assert!(
        found[0].what.contains("not its promotion's"),
        "{}",
        found[0].what
    );
    let e = Engine::open(cb.clone()).unwrap();
    assert!(e.recovery_report().damaged_groups.is_empty());
    assert_eq!(
        read_all(&e, 1).unwrap(),
        acked[..3],
        "the group's own records"
    );
    assert_eq!(e.append(1, 7, 99, b"x").unwrap().msg_id, 4);
    e.close().unwrap();
    assert!(seg.exists(), "left to the next promotion");
}
