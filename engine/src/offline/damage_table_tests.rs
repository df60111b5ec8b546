//! The damage table of storage format 2 (RELIABILITY.md, "Damage table:
//! every v2 file type"): one data directory holding every kind of file a
//! checkpoint names (run parts, manifests, cold files, small groups'
//! extents in journal files, sealed and active segments, erase lists in
//! group records), left by a crash and by a clean stop. Each case damages
//! one file of a copy once (a flipped bit inside a record the file holds,
//! a truncation, a deletion), then runs what `ctl verify` runs
//! ([`DataDir::verify`]), opens the node and reads back every acknowledged
//! record, closes it, runs what `ctl repair --yes` runs
//! ([`DataDir::plan_repair`], [`DataDir::repair`]), verifies again and
//! opens the node once more, sending to every group.
//!
//! Every acknowledged record is classified at each open: `intact` (the
//! bytes sent, or the erased form of a recalled message), `reported`
//! (the read answers `GroupDamaged` naming the damaged file, or the open
//! is refused naming it), `gap` (after repair: a gap record at its id),
//! `wrong` (other bytes served) or `lost` (no record at its id, the group
//! gone, or a head below it). The test asserts `wrong` and `lost` are 0,
//! that verify finds damage (exit status 1) naming the file and an offset
//! in the damaged structure up to the damaged byte (for a journal header,
//! each record it leaves unverifiable), that a refusal names the file,
//! that after repair verify is clean (or repair refused and the node
//! refuses too, or a group repair says it cannot mend stays damaged,
//! taking no send), and that the next send to every group gets an id
//! above every acknowledged one. It prints the table (`--nocapture`).
//!
//! Two focused tests below pin what the table found: a group damaged by
//! replay keeps the ids it skipped, and a deleted segment is
//! `GroupDamaged`.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use super::tests::{flip, segments};
use super::{DataDir, RepairTarget};
use crate::commit::journal::JOURNAL_HEADER_BYTES;
use crate::logs::record::{self, RECORD_HEADER_BYTES};
use crate::logs::segment::SEGMENT_HEADER_BYTES;
use crate::shared_file_tests::{config, cut, group_11_in_a_cold_file};
use crate::state::run::{encode_item, part_file_name, RUN_HEADER_BYTES};
use crate::state::{put_varint, Item};
use crate::tests::{copy_dir, payload};
use crate::{Change, ChangeRequest, Config, Engine, Error, JoinStart};

/// Group 1: 150 records and more over sealed segments and an active one.
const BIG: u64 = 1;
/// Group 3: small, its records in journal files the checkpoints name.
const SMALL: u64 = 3;
/// The groups `group_11_in_a_cold_file` makes: 2 (promoted), 11 (in a
/// cold file), 21 (small, in the journal).
const HELPER_GROUPS: [u64; 3] = [2, 11, 21];

fn cfg(dir: &Path) -> Config {
    config(dir, 4096)
}

/// The node's configuration: its state loaded before it opens, or in the
/// background (`state/lazy.rs`, the node's default).
fn node_cfg(dir: &Path, background: bool) -> Config {
    Config {
        load_in_background: background,
        ..cfg(dir)
    }
}

/// What an acknowledged record must read back as.
#[derive(Clone, Debug)]
enum Expect {
    Message(Vec<u8>),
    /// A recalled message: as sent, or erased (flag set, zeros).
    Recalled(Vec<u8>),
    /// A recall of the message with this id.
    Recall(u64),
}

/// Every acknowledged record, by group and id.
type Model = BTreeMap<u64, BTreeMap<u64, Expect>>;

fn send(e: &Engine, model: &mut Model, g: u64, ids: std::ops::Range<u64>) {
    for i in ids {
        let p = payload(g, i);
        let id = e.append(g, 10, i, &p).unwrap().msg_id;
        model.entry(g).or_default().insert(id, Expect::Message(p));
    }
}

fn recall(e: &Engine, model: &mut Model, g: u64, sender_id: u64, target: u64, cmid: u64) {
    let id = e
        .change(&ChangeRequest {
            group_id: g,
            sender_id,
            client_msg_id: cmid,
            target,
            change: Change::Recall,
            admin: false,
        })
        .unwrap()
        .msg_id;
    let recs = model.entry(g).or_default();
    let Some(Expect::Message(p)) = recs.get(&target).cloned() else {
        panic!("recall of {g}/{target}: not a message of the model");
    };
    recs.insert(target, Expect::Recalled(p));
    recs.insert(id, Expect::Recall(target));
}

/// The directory of the table: `group_11_in_a_cold_file`'s groups, then
/// a group over several segments, a small group, members with cursors,
/// recalls stored in erase lists, sends to every group after the
/// checkpoint in force, and a recall in the active segment. Ends with a
/// crash (`simulate_crash`) or a clean close; either way the manifest in
/// force names a run the fallback manifest names too. Returns every
/// acknowledged record.
fn build(dir: &Path, crash: bool) -> Model {
    group_11_in_a_cold_file(dir);
    let mut model = Model::new();
    // What the helper sent: group 2's churn (ids 1..=6, 1,000 bytes each),
    // groups 11 and 21 one round of five `payload`s each.
    model.insert(
        2,
        (1..=6)
            .map(|i| (i, Expect::Message(vec![b'c'; 1000])))
            .collect(),
    );
    for g in [11, 21] {
        model.insert(
            g,
            (1..=5)
                .map(|i| (i, Expect::Message(payload(g, i))))
                .collect(),
        );
    }
    let e = Engine::open(cfg(dir)).unwrap();
    assert_eq!(classify(&e, &model, "-").intact, 16, "the helper's records");
    e.create_group(BIG).unwrap();
    e.create_group(SMALL).unwrap();
    for g in [BIG, SMALL].into_iter().chain(HELPER_GROUPS) {
        e.join(g, 100 + g, JoinStart::Earliest).unwrap();
    }
    send(&e, &mut model, BIG, 1..151);
    send(&e, &mut model, SMALL, 1..5);
    e.ack(BIG, 101, 40).unwrap();
    e.ack(11, 111, 3).unwrap();
    e.checkpoint().unwrap();
    // Into the erase lists the next checkpoint stores (a delta run of two
    // groups, smaller than the run before it, which both kept manifests
    // then name, state.md section 6.4): a message in a sealed segment,
    // and one in group 11's cold file (sent by sender 1).
    recall(&e, &mut model, BIG, 10, 5, 1000);
    recall(&e, &mut model, 11, 1, 2, 1000);
    e.checkpoint().unwrap();
    for g in [BIG, SMALL].into_iter().chain(HELPER_GROUPS) {
        send(&e, &mut model, g, 3000..3002);
    }
    if !crash {
        // The clean stop's delta run stays small too: a cursor and the
        // recall below.
        e.checkpoint().unwrap();
        e.ack(BIG, 101, 60).unwrap();
    }
    // One more recall, in the active segment (the clean stop's checkpoint
    // stores it in the erase list).
    recall(&e, &mut model, BIG, 10, 140, 1001);
    let all: usize = model.values().map(|m| m.len()).sum();
    assert_eq!(classify(&e, &model, "-").intact as usize, all);
    if crash {
        e.simulate_crash();
    } else {
        e.close().unwrap();
    }
    assert!(
        segments(dir, BIG).len() >= 3,
        "sealed segments and an active one"
    );
    let d = DataDir::open(dir).unwrap();
    assert!(!d.inspect().unwrap().cold_files.is_empty(), "a cold file");
    assert!(
        d.groups.values().any(|g| !g.erase.is_empty()),
        "an erase list"
    );
    model
}

/// How the acknowledged records read back through the node.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    intact: u64,
    /// `GroupDamaged` naming the damaged file (or the open refused).
    reported: u64,
    /// A gap record at the id (after repair).
    gap: u64,
    wrong: u64,
    lost: u64,
    /// An error that does not name the damaged file.
    unnamed: u64,
}

fn matches(want: &Expect, r: &record::RecordRef<'_>) -> bool {
    let (kind, flags, p) = (r.header.kind, r.header.flags, r.payload());
    match want {
        Expect::Message(w) => kind == record::KIND_MESSAGE && p == &w[..],
        Expect::Recalled(w) => {
            kind == record::KIND_MESSAGE
                && (p == &w[..] || (flags & record::FLAG_ERASED != 0 && p.iter().all(|&b| b == 0)))
        }
        Expect::Recall(t) => {
            kind == record::KIND_RECALL && p.get(..8) == Some(&t.to_le_bytes()[..])
        }
    }
}

/// Reads every acknowledged record one by one; `file` is the damaged
/// file's name, which a `GroupDamaged` answer must contain. Notes what
/// is not intact in `notes`.
fn classify_noting(e: &Engine, model: &Model, file: &str, notes: &mut Vec<String>) -> Counts {
    let mut c = Counts::default();
    for (&g, recs) in model {
        let acked = recs.keys().copied().max().unwrap_or(0);
        let mut head_low = false;
        match e.head(g) {
            Ok(h) if h < acked => head_low = true,
            _ => {}
        }
        for (&id, want) in recs {
            match e.read(g, id - 1, 1, 1 << 20) {
                Ok(b) => match b.records().next() {
                    Some(r) if r.header.msg_id == id && r.header.kind == record::KIND_GAP => {
                        c.gap += 1
                    }
                    Some(r) if r.header.msg_id == id && matches(want, &r) => c.intact += 1,
                    Some(r) if r.header.msg_id == id => {
                        c.wrong += 1;
                        notes.push(format!("{g}/{id} served other bytes"));
                    }
                    _ => {
                        c.lost += 1;
                        notes.push(format!("{g}/{id} not served"));
                    }
                },
                Err(Error::GroupDamaged { reason, .. }) if reason.contains(file) => c.reported += 1,
                Err(Error::GroupNotFound { .. }) => {
                    c.lost += 1;
                    notes.push(format!("{g}/{id}: group gone"));
                }
                Err(other) => {
                    c.unnamed += 1;
                    notes.push(format!("{g}/{id}: {other}"));
                }
            }
        }
        if head_low {
            c.lost += 1;
            notes.push(format!("group {g}: head below {acked}"));
        }
    }
    c
}

/// The first notes and how many there were.
fn some(notes: &[String]) -> String {
    format!(
        "{} notes, first {:?}",
        notes.len(),
        &notes[..notes.len().min(4)]
    )
}

fn classify(e: &Engine, model: &Model, file: &str) -> Counts {
    let mut notes = Vec::new();
    let c = classify_noting(e, model, file, &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    c
}

/// The damage applied to a copy: the file, the byte flipped or where the
/// file was cut (0 for a deletion), and the offsets a report of it may
/// name (the start of the structure holding the byte up to the byte).
struct Damage {
    file: PathBuf,
    at: u64,
    named: RangeInclusive<u64>,
}

type Apply = fn(&Path) -> Damage;

/// The first record (`(file, offset)`) of any group that lies in a file
/// named `*.{ext}`.
fn first_record_in(dir: &Path, ext: &str) -> (PathBuf, u64) {
    let d = DataDir::open(dir).unwrap();
    for &g in d.groups.keys() {
        let dump = d.records(g, 0, u64::MAX).unwrap();
        if let Some(r) = dump
            .records
            .iter()
            .find(|r| r.file.extension().is_some_and(|x| x == ext))
        {
            return (r.file.clone(), r.offset);
        }
    }
    panic!("no record in a .{ext} file");
}

/// The first record of `BIG`'s segment `index` (`usize::MAX`: the last).
fn record_of_segment(dir: &Path, index: usize) -> (PathBuf, u64) {
    let segs = segments(dir, BIG);
    let (base, path) = segs[index.min(segs.len() - 1)].clone();
    let d = DataDir::open(dir).unwrap();
    let r = d.records(BIG, base, base).unwrap().records.remove(0);
    assert_eq!(r.file, path);
    (path, r.offset)
}

/// Flips a payload byte of the record at `offset` of `file`.
fn flip_record(file: PathBuf, offset: u64) -> Damage {
    let at = offset + RECORD_HEADER_BYTES as u64 + 2;
    flip(&file, at);
    Damage {
        file,
        at,
        named: offset..=at,
    }
}

fn delete(file: PathBuf) -> Damage {
    std::fs::remove_file(&file).unwrap();
    Damage {
        file,
        at: 0,
        named: 0..=0,
    }
}

/// Cuts `file` 10 bytes into the record at `offset`; a report may name
/// any offset from `from` to the cut.
fn cut_record(file: PathBuf, offset: u64, from: u64) -> Damage {
    let at = offset + 10;
    cut(&file, at);
    Damage {
        file,
        at,
        named: from..=at,
    }
}

/// The manifest in force and the fallback's run sequence numbers.
fn manifests(dir: &Path) -> (PathBuf, super::Manifest, Vec<u64>) {
    let d = DataDir::open(dir).unwrap();
    let (path, m) = d.manifest.clone().expect("a manifest in force");
    let fallback = d
        .fallback
        .as_ref()
        .expect("a fallback manifest")
        .1
        .runs
        .iter()
        .map(|r| r.run_seq)
        .collect();
    (path, m, fallback)
}

fn part_path(dir: &Path, run_seq: u64, part: u32) -> PathBuf {
    dir.join("state").join(part_file_name(run_seq, part))
}

/// A run part's first block, 20 bytes in.
fn flip_block(file: PathBuf) -> Damage {
    let at = RUN_HEADER_BYTES as u64 + 20;
    flip(&file, at);
    Damage {
        file,
        at,
        named: RUN_HEADER_BYTES as u64..=at,
    }
}

fn newest_run_part(dir: &Path) -> PathBuf {
    let (_, m, _) = manifests(dir);
    part_path(dir, m.runs[0].run_seq, 0)
}

fn run_part_newest_flipped(dir: &Path) -> Damage {
    flip_block(newest_run_part(dir))
}

fn run_part_shared_flipped(dir: &Path) -> Damage {
    let (_, m, fallback) = manifests(dir);
    let shared = m
        .runs
        .iter()
        .find(|r| fallback.contains(&r.run_seq))
        .expect("a run both manifests name");
    flip_block(part_path(dir, shared.run_seq, 0))
}

fn run_part_newest_deleted(dir: &Path) -> Damage {
    delete(newest_run_part(dir))
}

/// A byte of the erase list of a group record: the last byte of the
/// item's value (the erase list is its last field), found by encoding the
/// record as the checkpoint holds it and looking for it in the parts of
/// the manifest in force, newest run first.
fn erase_list_flipped(dir: &Path) -> Damage {
    let d = DataDir::open(dir).unwrap();
    let (_, m) = d.manifest.clone().unwrap();
    let rec = d
        .groups
        .values()
        .find(|g| !g.erase.is_empty())
        .expect("a group with an erase list")
        .clone();
    drop(d);
    let mut key = Vec::new();
    put_varint(&mut key, rec.group);
    let values: Vec<Vec<u8>> = [false, true]
        .into_iter()
        .map(|fresh| {
            let mut r = rec.clone();
            r.fresh = fresh;
            let mut item = Vec::new();
            encode_item(&mut item, &Item::GroupPut(Box::new(r)), None);
            item[1 + key.len()..].to_vec()
        })
        .collect();
    for run in &m.runs {
        for part in 0..run.parts.len() as u32 {
            let file = part_path(dir, run.run_seq, part);
            let bytes = std::fs::read(&file).unwrap();
            for v in &values {
                if let Some(pos) = bytes.windows(v.len()).position(|w| w == &v[..]) {
                    let at = (pos + v.len() - 1) as u64;
                    flip(&file, at);
                    return Damage {
                        file,
                        at,
                        named: RUN_HEADER_BYTES as u64..=at,
                    };
                }
            }
        }
    }
    panic!("group {}'s record is in no run part", rec.group);
}

fn manifest_newest_flipped(dir: &Path) -> Damage {
    let (file, ..) = manifests(dir);
    // The body's replay_journal_seq.
    let at = 32 + 8;
    flip(&file, at);
    Damage {
        file,
        at,
        named: 0..=at,
    }
}

fn manifest_newest_truncated(dir: &Path) -> Damage {
    let (file, ..) = manifests(dir);
    let at = std::fs::metadata(&file).unwrap().len() - 10;
    cut(&file, at);
    Damage {
        file,
        at,
        named: 0..=at,
    }
}

fn manifests_deleted(dir: &Path) -> Damage {
    let mdir = crate::state::manifest::manifest_dir(dir);
    for (_, p) in crate::state::manifest::list(&crate::io::OsVfs, &mdir).unwrap() {
        std::fs::remove_file(p).unwrap();
    }
    Damage {
        file: mdir,
        at: 0,
        named: 0..=0,
    }
}

fn cold_record_flipped(dir: &Path) -> Damage {
    let (file, offset) = first_record_in(dir, "tmc");
    flip_record(file, offset)
}

fn cold_truncated(dir: &Path) -> Damage {
    let (file, offset) = first_record_in(dir, "tmc");
    cut_record(file, offset, 0)
}

fn cold_deleted(dir: &Path) -> Damage {
    delete(first_record_in(dir, "tmc").0)
}

fn journal_extent_flipped(dir: &Path) -> Damage {
    let (file, offset) = first_record_in(dir, "tmj");
    let mut d = flip_record(file, offset);
    // A frame's damage is named at the frame.
    d.named = JOURNAL_HEADER_BYTES as u64..=d.at;
    d
}

/// Verify names each record the header leaves unverifiable, at its
/// offset, saying `offset 0: journal header ...`.
fn journal_header_flipped(dir: &Path) -> Damage {
    let (file, _) = first_record_in(dir, "tmj");
    let at = 20;
    flip(&file, at);
    let len = std::fs::metadata(&file).unwrap().len();
    Damage {
        file,
        at,
        named: 0..=len,
    }
}

fn journal_truncated(dir: &Path) -> Damage {
    let (file, offset) = first_record_in(dir, "tmj");
    cut_record(file, offset, JOURNAL_HEADER_BYTES as u64)
}

fn journal_deleted(dir: &Path) -> Damage {
    delete(first_record_in(dir, "tmj").0)
}

fn sealed_flipped(dir: &Path) -> Damage {
    let (file, offset) = record_of_segment(dir, 1);
    flip_record(file, offset)
}

fn sealed_truncated(dir: &Path) -> Damage {
    let (file, offset) = record_of_segment(dir, 1);
    cut_record(file, offset, SEGMENT_HEADER_BYTES as u64)
}

fn sealed_deleted(dir: &Path) -> Damage {
    delete(record_of_segment(dir, 1).0)
}

fn active_flipped(dir: &Path) -> Damage {
    let (file, offset) = record_of_segment(dir, usize::MAX);
    flip_record(file, offset)
}

fn active_truncated(dir: &Path) -> Damage {
    let (file, offset) = record_of_segment(dir, usize::MAX);
    cut_record(file, offset, SEGMENT_HEADER_BYTES as u64)
}

const CASES: [(&str, Apply); 19] = [
    (
        "run part of the newest run: bit flipped",
        run_part_newest_flipped,
    ),
    (
        "run part both manifests name: bit flipped",
        run_part_shared_flipped,
    ),
    (
        "run part of the newest run: deleted",
        run_part_newest_deleted,
    ),
    (
        "erase list (group record in a run part): bit flipped",
        erase_list_flipped,
    ),
    ("newest manifest: bit flipped", manifest_newest_flipped),
    ("newest manifest: truncated", manifest_newest_truncated),
    ("both manifests: deleted", manifests_deleted),
    ("cold file: record bit flipped", cold_record_flipped),
    ("cold file: truncated in a record", cold_truncated),
    ("cold file: deleted", cold_deleted),
    (
        "journal file, small group's extent: record bit flipped",
        journal_extent_flipped,
    ),
    (
        "journal file holding an extent: header bit flipped",
        journal_header_flipped,
    ),
    (
        "journal file holding an extent: truncated in a record",
        journal_truncated,
    ),
    ("journal file holding an extent: deleted", journal_deleted),
    ("sealed segment: record bit flipped", sealed_flipped),
    ("sealed segment: truncated in a record", sealed_truncated),
    ("sealed segment: deleted", sealed_deleted),
    ("active segment: record bit flipped", active_flipped),
    ("active segment: truncated in a record", active_truncated),
];

/// One row of the table.
struct Row {
    damage: &'static str,
    when: &'static str,
    file: String,
    verify: String,
    open: String,
    first: Counts,
    repair: String,
    verify_after: String,
    after: Option<Counts>,
    next: String,
}

fn name_of(p: &Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

/// Runs one case on a copy of `base`; what breaks a rule goes to
/// `failures`.
fn run_case(
    base: &Path,
    model: &Model,
    damage: &'static str,
    apply: Apply,
    when: &'static str,
    background: bool,
    failures: &mut Vec<String>,
) -> Row {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    copy_dir(base, &dir);
    let d = apply(&dir);
    let name = name_of(&d.file);
    let case = format!("{damage} ({when}, {name} at {})", d.at);
    let mut fail = |what: String| failures.push(format!("{case}: {what}"));

    // `ctl verify`: exit status 1, a finding naming the file.
    let verify = match DataDir::open(&dir) {
        Err(e) => {
            fail(format!("verify cannot open the directory (exit 2): {e}"));
            format!("exit 2: {e}")
        }
        Ok(dd) => {
            let v = dd.verify().unwrap();
            let named = v.findings.iter().find(|f| {
                f.damage && f.file.as_deref() == Some(&*d.file) && d.named.contains(&f.offset)
            });
            match (v.clean(), named) {
                (true, _) => {
                    fail(format!("verify is clean: {:?}", v.findings));
                    "exit 0 (clean)".into()
                }
                (false, Some(f)) => format!("exit 1, names it at {}", f.offset),
                (false, None) => {
                    fail(format!(
                        "verify does not name the file at {:?}: {:?}",
                        d.named, v.findings
                    ));
                    "exit 1, names another place".into()
                }
            }
        }
    };

    // The node: refused naming the file, or every record classified.
    let all: u64 = model.values().map(|m| m.len() as u64).sum();
    let mut notes = Vec::new();
    let (open, first) = match Engine::open(node_cfg(&dir, background)) {
        Err(e) => {
            let msg = e.to_string();
            if !msg.contains(&name) {
                fail(format!(
                    "the open is refused without naming the file: {msg}"
                ));
            }
            (
                "refused, names it".to_string(),
                Counts {
                    reported: all,
                    ..Counts::default()
                },
            )
        }
        Ok(e) => {
            let c = classify_noting(&e, model, &name, &mut notes);
            if let Err(err) = e.close() {
                fail(format!("close: {err}"));
            }
            ("opens".to_string(), c)
        }
    };
    if first.wrong + first.lost + first.unnamed > 0 {
        fail(format!("at the first open: {first:?} {}", some(&notes)));
    }

    // `ctl repair --yes`, then `ctl verify`.
    let mut dd = DataDir::open(&dir).unwrap();
    let plan = dd.plan_repair(RepairTarget::AllDamaged).unwrap();
    let refused = plan.refused.clone();
    // Groups repair cannot mend (`ctl repair` says so and exits 1): they
    // must stay damaged, answering `GroupDamaged` and taking no send.
    let unrepairable: Vec<u64> = plan.unrepairable.iter().map(|(g, _)| *g).collect();
    let repair = match &refused {
        Some(why) if why.contains(&name) => "refused, names it".to_string(),
        Some(why) => format!("refused: {why}"),
        None if plan.is_empty() && unrepairable.is_empty() => "nothing to do".to_string(),
        None => {
            if !plan.is_empty() {
                dd.repair(plan).unwrap();
            }
            match &unrepairable[..] {
                [] => "repaired".to_string(),
                groups => format!("group {groups:?} cannot be repaired (delete it)"),
            }
        }
    };
    drop(dd);
    let clean_after = DataDir::open(&dir).unwrap().verify().unwrap();
    let left: Vec<_> = clean_after
        .findings
        .iter()
        .filter(|f| f.damage && !f.group.is_some_and(|g| unrepairable.contains(&g)))
        .collect();
    let verify_after = if clean_after.clean() {
        "clean".to_string()
    } else if left.is_empty() {
        "damage (that group)".to_string()
    } else {
        if refused.is_none() {
            fail(format!("verify after repair: {left:?}"));
        }
        "damage".to_string()
    };

    // The node again: every record classified, the next send to every
    // group above every acknowledged id.
    let (after, next) = match Engine::open(node_cfg(&dir, background)) {
        Err(e) => {
            if refused.is_none() {
                fail(format!("repaired, but the node refuses: {e}"));
            } else if !e.to_string().contains(&name) {
                fail(format!("the open after repair does not name the file: {e}"));
            }
            (None, "refused (no id given)".to_string())
        }
        Ok(e) => {
            let mut notes = Vec::new();
            let c = classify_noting(&e, model, &name, &mut notes);
            if c.wrong + c.lost + c.unnamed > 0 {
                fail(format!("after repair: {c:?} {}", some(&notes)));
            }
            let (mut above, mut damaged) = (0, 0);
            for (&g, recs) in model {
                let acked = recs.keys().copied().max().unwrap_or(0);
                match e.append(g, 77, 5_000_000, b"after repair") {
                    Ok(a) if a.msg_id > acked => above += 1,
                    Ok(a) => fail(format!(
                        "group {g} gave id {}, {acked} was acknowledged",
                        a.msg_id
                    )),
                    Err(Error::GroupDamaged { .. }) if unrepairable.contains(&g) => damaged += 1,
                    Err(err) => fail(format!("group {g}: send after repair: {err}")),
                }
            }
            if let Err(err) = e.close() {
                fail(format!("close after repair: {err}"));
            }
            let next = match damaged {
                0 => format!("{above}/{} groups above", model.len()),
                n => format!(
                    "{above}/{} groups above, {n} refused (damaged)",
                    model.len()
                ),
            };
            (Some(c), next)
        }
    };
    Row {
        damage,
        when,
        file: format!("{} at {}", name, d.at),
        verify,
        open,
        first,
        repair,
        verify_after,
        after,
        next,
    }
}

/// Every case after a crash and after a clean stop, the node's state
/// loaded before it opens or in the background: the rows, and what broke
/// a rule.
fn damage_table(background: bool) -> (Vec<Row>, Vec<String>) {
    let root = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    for (crash, when) in [(true, "crash"), (false, "clean stop")] {
        let base = root.path().join(when.replace(' ', "-"));
        let model = build(&base, crash);
        for (damage, apply) in CASES {
            rows.push(run_case(
                &base,
                &model,
                damage,
                apply,
                when,
                background,
                &mut failures,
            ));
        }
    }
    (rows, failures)
}

/// The same rules with the node's state loaded in the background (the
/// node's default): damage is found by the check of every run part's
/// checksums before it opens, or where a full load finds it.
#[test]
fn the_damage_table_holds_with_the_state_loaded_in_the_background() {
    let (rows, failures) = damage_table(true);
    assert_eq!(rows.len(), 2 * CASES.len());
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn damage_table_every_v2_file_type_after_a_crash_and_after_a_clean_stop() {
    let (rows, failures) = damage_table(false);
    let acked: u64 = rows.first().map_or(0, |r| {
        r.first.intact + r.first.reported + r.first.gap + r.first.wrong + r.first.lost
    });
    eprintln!("\n{acked} acknowledged records per case\n");
    eprintln!(
        "| damage | after | file at byte | verify | open | intact / reported / wrong / lost | \
         repair | verify after | after repair: intact / gap / reported / wrong / lost | next send |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let after = r.after.map_or("-".to_string(), |c| {
            format!(
                "{} / {} / {} / {} / {}",
                c.intact,
                c.gap,
                c.reported,
                c.wrong,
                c.lost + c.unnamed
            )
        });
        eprintln!(
            "| {} | {} | `{}` | {} | {} | {} / {} / {} / {} | {} | {} | {} | {} |",
            r.damage,
            r.when,
            r.file,
            r.verify,
            r.open,
            r.first.intact,
            r.first.reported,
            r.first.wrong,
            r.first.lost + r.first.unnamed,
            r.repair,
            r.verify_after,
            after,
            r.next
        );
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// A crash, then damage in the checkpointed part of a group's active
/// segment: replay finds the group damaged and skips its later Records
/// entries, whose ids were acknowledged (two messages and a recall of an
/// older one). The node must not answer "nothing after" below them nor
/// give them again, and the checkpoint it writes for the damaged group
/// (the recall's quiet ids with it) must be one it reads back: a clean
/// stop, then a repair that gives the next send the id after them.
#[test]
fn a_group_damaged_by_replay_keeps_the_ids_it_skipped_and_its_checkpoint_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(cfg(path)).unwrap();
    let mut model = Model::new();
    e.create_group(BIG).unwrap();
    send(&e, &mut model, BIG, 1..151);
    e.checkpoint().unwrap();
    send(&e, &mut model, BIG, 151..153);
    recall(&e, &mut model, BIG, 10, 140, 1000);
    let acked = *model[&BIG].keys().last().unwrap();
    assert_eq!(acked, 153);
    e.simulate_crash();
    let (file, offset) = record_of_segment(path, usize::MAX);
    let name = name_of(&file);
    flip_record(file, offset);

    let e = Engine::open(cfg(path)).unwrap();
    assert!(
        e.recovery_report()
            .damaged_groups
            .iter()
            .any(|(g, _)| *g == BIG),
        "found damaged by replay"
    );
    assert_eq!(
        e.head(BIG).unwrap(),
        acked,
        "the head covers every acknowledged id"
    );
    for after in [0, 150, 152] {
        match e.read(BIG, after, 1, 1 << 20) {
            Err(Error::GroupDamaged { reason, .. }) => {
                assert!(reason.contains(&name), "names {name}: {reason}")
            }
            Err(other) => panic!("read after {after}: {other}"),
            Ok(b) => panic!("read after {after}: {} records, not the damage", b.count),
        }
    }
    e.close()
        .expect("the checkpoint of the damaged group is one the node reads back");

    let mut d = DataDir::open(path).unwrap();
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(plan.refused.is_none(), "{plan:?}");
    d.repair(plan).unwrap();
    let v = d.verify().unwrap();
    assert!(v.clean(), "{:?}", v.findings);
    drop(d);
    let e = Engine::open(cfg(path)).unwrap();
    assert_eq!(
        e.append(BIG, 77, 1, b"after repair").unwrap().msg_id,
        acked + 1
    );
    e.close().unwrap();
}

/// A sealed segment the checkpoint names, deleted outside the node: reads
/// that need it answer `GroupDamaged` naming it (as for a cut file,
/// storage.md section 4, "Reads"), not an I/O error; the others are
/// served.
#[test]
fn a_deleted_sealed_segment_answers_group_damaged_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let e = Engine::open(cfg(path)).unwrap();
    let mut model = Model::new();
    e.create_group(BIG).unwrap();
    send(&e, &mut model, BIG, 1..151);
    e.close().unwrap();
    let segs = segments(path, BIG);
    let (base, file) = segs[1].clone();
    std::fs::remove_file(&file).unwrap();

    let e = Engine::open(cfg(path)).unwrap();
    match e.read(BIG, base - 1, 1, 1 << 20) {
        Err(Error::GroupDamaged { reason, .. }) => {
            let name = name_of(&file);
            assert!(reason.contains(&name), "names {name}: {reason}")
        }
        Err(other) => panic!("not GroupDamaged: {other}"),
        Ok(b) => panic!("{} records served from a deleted file", b.count),
    }
    let first = e.read(BIG, 0, 1, 1 << 20).unwrap();
    assert_eq!(first.records().next().map(|r| r.header.msg_id), Some(1));
}
