//! Physical erasure of recalled payloads (format-spec/storage.md section 3, "Erasure"): a recalled message's
//! payload is found in no file of the data directory once the rewrites
//! the bound names have run, while reads stay dense and unread exact.

use std::path::Path;

use crate::{Change, ChangeRequest, Engine, JoinStart};

/// A payload no other test writes: a random 32-hex-digit marker.
pub(crate) fn marker() -> Vec<u8> {
    use std::hash::{BuildHasher, Hasher};
    let mut out = b"ERASE-ME-".to_vec();
    for _ in 0..2 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(0);
        out.extend_from_slice(format!("{:016x}", h.finish()).as_bytes());
    }
    out
}

/// The files under `dir` whose bytes contain `needle`.
pub(crate) fn files_holding(dir: &Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
            {
                found.push(p);
            }
        }
    }
    found.sort();
    found
}

fn recall(e: &Engine, group: u64, sender: u64, target: u64, cmid: u64) {
    e.change(&ChangeRequest {
        group_id: group,
        sender_id: sender,
        client_msg_id: cmid,
        target,
        change: Change::Recall,
        admin: false,
    })
    .unwrap();
}

fn unread(e: &Engine, user: u64, group: u64) -> u64 {
    e.unread(user)
        .into_iter()
        .find(|u| u.group_id == group)
        .expect("a member")
        .unread
}

/// `(msg_id, kind, presented flags, payload)` of every record of `group`
/// as a protocol version 2 reader sees it.
pub(crate) fn shown(e: &Engine, group: u64) -> Vec<(u64, u8, u8, Vec<u8>)> {
    let b = e.read(group, 0, 1000, 1 << 20).unwrap();
    let b = e.present(group, b, true);
    b.records()
        .map(|r| {
            (
                r.header.msg_id,
                r.header.kind,
                r.header.flags,
                r.payload().to_vec(),
            )
        })
        .collect()
}

/// Small groups (records in journal files, section 9): a recalled
/// message's payload goes with the evacuation that copies its extent out of
/// the journal (written erased) and the deletion of the journal file two
/// checkpoints later.
#[test]
fn a_recalled_payload_of_a_small_group_leaves_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let mut c = crate::tests::small_config(path);
    c.small_group_bytes_max = 1500;
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    let secret = marker();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    e.append(1, 10, 1, b"before").unwrap();
    e.append(1, 10, 2, &secret).unwrap();
    e.append(1, 10, 3, b"after").unwrap();
    assert_eq!(unread(&e, 20, 1), 3);
    recall(&e, 1, 10, 2, 4);
    assert_eq!(unread(&e, 20, 1), 2, "a recall lowers unread");
    assert!(!files_holding(path, &secret).is_empty(), "stored first");
    // Traffic elsewhere rolls the journal; checkpoints move the replay
    // position past the files, evacuate them and delete them.
    for i in 0..40u64 {
        e.append(2, 1, i + 10, &crate::tests::payload(2, i))
            .unwrap();
    }
    for i in 0..5 {
        e.checkpoint().unwrap();
        e.append(2, 1, 1000 + i, b"x").unwrap();
    }
    assert!(
        !crate::logs::group_log::group_dir(path, 1).exists(),
        "group 1 is still small"
    );
    assert_eq!(
        files_holding(path, &secret),
        Vec::<std::path::PathBuf>::new()
    );
    let want = vec![
        (1, 0, 0, b"before".to_vec()),
        (2, 0, crate::FLAG_RECALLED, Vec::new()),
        (3, 0, 0, b"after".to_vec()),
        (
            4,
            crate::logs::record::KIND_RECALL,
            0,
            2u64.to_le_bytes().to_vec(),
        ),
    ];
    assert_eq!(shown(&e, 1), want);
    assert_eq!(unread(&e, 20, 1), 2);
    // The erased form is what the files hold now: every kind of reopen
    // reads it back the same.
    e.simulate_crash();
    let e = Engine::open(c.clone()).unwrap();
    assert_eq!(shown(&e, 1), want);
    assert_eq!(unread(&e, 20, 1), 2);
    e.close().unwrap();
    let e = Engine::open(c).unwrap();
    assert_eq!(shown(&e, 1), want);
    assert_eq!(
        files_holding(path, &secret),
        Vec::<std::path::PathBuf>::new()
    );
}

/// A small group promoted after a recall: its records go into its first
/// segment with the recalled message erased, and the journal's copies go
/// with the checkpoints as for a group that stays small.
#[test]
fn a_promotion_after_a_recall_writes_the_recalled_message_erased() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path();
    let mut c = crate::tests::small_config(path);
    c.small_group_bytes_max = 1500;
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    let secret = marker();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    e.append(1, 10, 1, &secret).unwrap();
    recall(&e, 1, 10, 1, 2);
    let seg_dir = crate::logs::group_log::group_dir(path, 1);
    assert!(!seg_dir.exists(), "small so far");
    // Past the threshold: promoted.
    for i in 0..4u64 {
        e.append(1, 10, 10 + i, &[b'p'; 500]).unwrap();
    }
    assert!(seg_dir.exists(), "promoted");
    assert_eq!(
        files_holding(&seg_dir, &secret),
        Vec::<std::path::PathBuf>::new()
    );
    for i in 0..40u64 {
        e.append(2, 1, i + 10, &crate::tests::payload(2, i))
            .unwrap();
    }
    for i in 0..5 {
        e.checkpoint().unwrap();
        e.append(2, 1, 1000 + i, b"x").unwrap();
    }
    assert_eq!(
        files_holding(path, &secret),
        Vec::<std::path::PathBuf>::new()
    );
    let got = shown(&e, 1);
    assert_eq!(got.len(), 6, "ids dense");
    assert_eq!(got[0], (1, 0, crate::FLAG_RECALLED, Vec::new()));
    assert_eq!(unread(&e, 20, 1), 4);
    e.simulate_crash();
    let e = Engine::open(c).unwrap();
    assert_eq!(shown(&e, 1), got);
    assert_eq!(unread(&e, 20, 1), 4);
}

/// What a protocol version 2 reader sees of groups 1 and 2, and member
/// 20's unread count in group 1.
type Seen = (
    Vec<(u64, u8, u8, Vec<u8>)>,
    Vec<(u64, u8, u8, Vec<u8>)>,
    u64,
);

fn seen(e: &Engine) -> Seen {
    (shown(e, 1), shown(e, 2), unread(e, 20, 1))
}

/// A power cut at every file operation of the checkpoints that erase a
/// small group's recalled payload (the evacuation's cold file write, its
/// sync and directory sync, the manifests that record the erased copy,
/// the deletion of the journal files): the next open serves everything
/// acknowledged as before (the recalled message recalled, unread exact),
/// and the erasure then completes: the payload is in no file.
#[test]
fn a_power_cut_at_every_file_operation_of_an_erasure_loses_nothing_and_erases_after() {
    use crate::io::power_cut::{Cut, PowerCutVfs};
    use std::sync::Arc;
    let secret = marker();
    let config = |dir: &Path| {
        let mut c = crate::tests::small_config(dir);
        c.small_group_bytes_max = 1500;
        c.journal_file_bytes = 4096;
        c.checkpoint_journal_bytes = 1 << 30;
        c
    };
    let run = |cut_at: Option<u64>| -> u64 {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let vfs = PowerCutVfs::new(root.path());
        let control = vfs.control.clone();
        let e = Engine::open_with_vfs(config(&data), Arc::new(vfs.clone())).unwrap();
        e.create_group(1).unwrap();
        e.create_group(2).unwrap();
        e.join(1, 20, JoinStart::Earliest).unwrap();
        e.append(1, 10, 1, b"before").unwrap();
        e.append(1, 10, 2, &secret).unwrap();
        e.append(1, 10, 3, b"after").unwrap();
        recall(&e, 1, 10, 2, 4);
        for i in 0..40u64 {
            e.append(2, 1, i + 10, &crate::tests::payload(2, i))
                .unwrap();
        }
        e.checkpoint().unwrap();
        let model = seen(&e);
        let before = control.ops();
        if let Some(n) = cut_at {
            control.freeze_after(n);
        }
        // Under test: the checkpoints that evacuate the journal files
        // (the recalled message copied erased) and delete them.
        for _ in 0..4 {
            e.checkpoint().unwrap();
        }
        let used = control.ops() - before;
        if cut_at.is_none() {
            assert!(
                e.stats().reclaim_files > 0,
                "the journal files were evacuated"
            );
            assert_eq!(
                files_holding(&data, &secret),
                Vec::<std::path::PathBuf>::new()
            );
        }
        control.freeze();
        e.simulate_crash();
        control.cut(Cut::DropUnsynced).unwrap();
        let e = Engine::open(config(&data)).unwrap();
        assert_eq!(seen(&e), model, "cut at {cut_at:?} of {used}");
        // The erasure goes on after the cut.
        for i in 0..5 {
            e.checkpoint().unwrap();
            e.append(2, 1, 1000 + i, b"x").unwrap();
        }
        assert_eq!(
            files_holding(&data, &secret),
            Vec::<std::path::PathBuf>::new(),
            "erased after a cut at {cut_at:?}"
        );
        let mut after = model.clone();
        after
            .1
            .extend((0..5u64).map(|i| (41 + i, 0, 0, b"x".to_vec())));
        assert_eq!(seen(&e), after, "after a cut at {cut_at:?}");
        used
    };
    let ops = run(None);
    assert!(ops >= 6, "the erasure is {ops} file operations");
    for n in 1..=ops + 1 {
        run(Some(n));
    }
}
