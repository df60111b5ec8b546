//! Physical erasure of a small group's recalled payload that a cold file
//! held when it was recalled (format-spec/storage.md section 16, item 16;
//! `state/rewrite.rs`, "Erasure in cold files"): the reclaimer compacts
//! the file in full, the copy is written erased, and K7 deletes the old
//! file; reads stay dense and unread exact.

use crate::erasure_tests::{files_holding, marker};
use crate::{Change, ChangeRequest, Engine, JoinStart};

fn shown(e: &Engine, group: u64) -> Vec<(u64, u8, u8, Vec<u8>)> {
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

fn unread(e: &Engine, user: u64, group: u64) -> u64 {
    e.unread(user)
        .into_iter()
        .find(|u| u.group_id == group)
        .expect("a member")
        .unread
}

/// Traffic in group 2 rolls the journal; checkpoints move the replay
/// position past the files, evacuate them, compact and delete.
pub(crate) fn churn(e: &Engine, from: u64) {
    for i in 0..40u64 {
        e.append(2, 1, from + i, &crate::tests::payload(2, i))
            .unwrap();
    }
    for i in 0..5 {
        e.checkpoint().unwrap();
        e.append(2, 1, from + 1000 + i, b"x").unwrap();
    }
}

#[test]
fn a_recalled_payload_held_by_a_cold_file_leaves_every_file() {
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
    churn(&e, 10);
    // Evacuated: the payload is in a cold file only.
    let holding = files_holding(path, &secret);
    assert!(!holding.is_empty(), "stored");
    assert!(
        holding
            .iter()
            .all(|p| p.extension().is_some_and(|x| x == "tmc")),
        "only cold files hold it: {holding:?}"
    );
    assert!(
        !crate::logs::group_log::group_dir(path, 1).exists(),
        "group 1 is still small"
    );
    assert_eq!(unread(&e, 20, 1), 3);
    e.change(&ChangeRequest {
        group_id: 1,
        sender_id: 10,
        client_msg_id: 4,
        target: 2,
        change: Change::Recall,
        admin: false,
    })
    .unwrap();
    assert_eq!(unread(&e, 20, 1), 2, "a recall lowers unread");
    churn(&e, 5000);
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
