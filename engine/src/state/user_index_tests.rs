//! The user index (format-spec/storage.md 6.1, key tag 2) seen through the
//! engine: with the background loader held, UNREAD and SYNC of every user
//! answer from the index exactly as after a full load (memberships over
//! many groups, leaves, deleted and re-created groups, joins in the
//! journal tail); the merged index covers every member row after any
//! sequence of checkpoints, merges and reopenings; a directory stored
//! without an index waits for the whole load as before and gets a
//! complete index at its next checkpoint; `verify` names a missing entry.

use std::collections::BTreeSet;
use std::path::Path;

use proptest::prelude::*;

use super::checkpoint_tests::{load_manifest, manifests, newest_manifest, run_items};
use super::checkpointer::older_build;
use super::lazy_tests::config;
use super::merge::Merge;
use super::Item;
use crate::state::lazy::hold;
use crate::tests::{copy_dir, payload};
use crate::{Engine, Error, JoinStart, STATE_TICKET};

pub(super) const GROUPS: u64 = 60;
pub(super) const USERS: u64 = 12;

/// Memberships over many groups and several runs: user `u` is in group
/// `g` when `(g + u) % 3 == 0` or `u == 0`, some groups hold records;
/// then leaves (before and after a checkpoint), a group deleted, one
/// deleted and created again with other members within one checkpoint,
/// one deleted in one checkpoint and created again in the next.
pub(super) fn populate(e: &Engine) {
    for g in 1..=GROUPS {
        e.create_group(g).unwrap();
        for u in (0..USERS).filter(|u| (g + u) % 3 == 0 || *u == 0) {
            e.join(g, u, JoinStart::Earliest).unwrap();
        }
        let count = if g % 13 == 0 { 50 } else { g % 4 };
        for i in 1..=count {
            e.append(g, 7, g * 1000 + i, &payload(g, i)).unwrap();
        }
        if g % 20 == 0 {
            e.checkpoint().unwrap();
        }
    }
    e.ack(3, 0, 2).unwrap();
    e.leave(3, 0).unwrap();
    e.leave(6, 3).unwrap();
    e.checkpoint().unwrap();
    e.leave(9, 3).unwrap();
    e.delete_group(12).unwrap();
    e.delete_group(15).unwrap();
    e.create_group(15).unwrap();
    e.join(15, 5, JoinStart::Earliest).unwrap();
    e.append(15, 7, 15_000_900, b"again").unwrap();
    e.delete_group(18).unwrap();
    e.checkpoint().unwrap();
    e.create_group(18).unwrap();
    e.join(18, 4, JoinStart::Earliest).unwrap();
    e.checkpoint().unwrap();
}

/// After the last checkpoint, only in the journal: joins (one to a group
/// created there), a leave, a deletion.
fn journal_tail(e: &Engine) {
    e.create_group(GROUPS + 1).unwrap();
    e.join(GROUPS + 1, 6, JoinStart::Earliest).unwrap();
    e.join(30, 7, JoinStart::Earliest).unwrap();
    e.append(30, 7, 30_000_900, b"tail").unwrap();
    e.leave(33, 0).unwrap();
    e.delete_group(36).unwrap();
}

/// `(group, head, cursor, unread)` of each row of a user's UNREAD.
pub(super) type Rows = Vec<(u64, u64, u64, u64)>;
/// Per group of a user's SYNC: the row and the records' ids and payloads.
pub(super) type Synced = Vec<((u64, u64, u64, u64), Vec<(u64, Vec<u8>)>)>;

fn rows(list: Vec<crate::Unread>) -> Rows {
    list.into_iter()
        .map(|u| (u.group_id, u.head, u.cursor, u.unread))
        .collect()
}

/// A user's whole SYNC, page by page, never waiting for the whole state
/// (a group's log being loaded is waited for: that is not the state).
fn sync_of(e: &Engine, user: u64) -> Synced {
    let mut out = Vec::new();
    let mut after = None;
    loop {
        let s = match e.try_sync(user, 4, 1 << 20, after) {
            Err(Error::NotReady { ticket, .. }) => {
                assert_ne!(
                    ticket, STATE_TICKET,
                    "SYNC of user {user} waited for the state"
                );
                e.wait_ready(ticket).unwrap();
                continue;
            }
            other => other.unwrap(),
        };
        for g in s.groups {
            let u = g.unread;
            let records = g
                .batch
                .records()
                .map(|r| (r.header.msg_id, r.payload().to_vec()))
                .collect();
            out.push(((u.group_id, u.head, u.cursor, u.unread), records));
        }
        match s.continue_after {
            Some(g) => after = Some(g),
            None => return out,
        }
    }
}

/// UNREAD and SYNC of every user, none waiting for the whole state.
pub(super) fn answers(e: &Engine) -> Vec<(Rows, Synced)> {
    (0..USERS)
        .map(|u| {
            let unread = loop {
                match e.try_unread(u) {
                    Ok(list) => break rows(list),
                    // The worker registers the user's saved groups.
                    Err(Error::NotReady { ticket, .. }) if ticket != STATE_TICKET => {
                        e.wait_ready(ticket).unwrap();
                    }
                    Err(other) => panic!("UNREAD of user {u}: {other}"),
                }
            };
            (unread, sync_of(e, u))
        })
        .collect()
}

/// UNREAD and SYNC of every user after a full load, on a copy (its open
/// checkpoints what it replayed).
pub(super) fn after_a_full_load(dir: &Path) -> Vec<(Rows, Synced)> {
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir, copy.path());
    let e = Engine::open(config(copy.path(), false)).unwrap();
    let all = answers(&e);
    e.simulate_crash();
    all
}

#[test]
fn unread_and_sync_answer_from_the_user_index_while_the_load_is_held() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    journal_tail(&e);
    e.simulate_crash();
    let expected = after_a_full_load(dir.path());
    // Not trivial: users with many groups, the tail's joins among them.
    assert!(expected[0].0.len() > 40, "{:?}", expected[0].0);
    assert!(expected[7].0.iter().any(|r| r.0 == 30));
    assert!(expected[6].0.iter().any(|r| r.0 == GROUPS + 1));
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert!(e.recovery_report().loading_in_background);
    let groups_before = e.stats().groups;
    assert_eq!(answers(&e), expected);
    assert!(e.stats().state_loading, "still held");
    // Only the groups the users' index entries named were registered.
    assert!(e.stats().groups > groups_before);
    hold::release(dir.path());
    assert_eq!(answers(&e), expected);
    e.close().unwrap();
}

/// Rewrites every manifest of `dir` as a version 3 writer wrote it
/// (without the index flag, which must be off).
fn as_version_3(dir: &Path) {
    for path in manifests(dir) {
        let mut b = std::fs::read(&path).unwrap();
        b.pop();
        b[8..10].copy_from_slice(&3u16.to_le_bytes());
        let body_len = (b.len() - 32) as u64;
        b[16..24].copy_from_slice(&body_len.to_le_bytes());
        let body_crc = crc32fast::hash(&b[32..]);
        b[24..28].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&b[..28]);
        b[28..32].copy_from_slice(&header_crc.to_le_bytes());
        std::fs::write(&path, b).unwrap();
    }
}

#[test]
fn a_directory_stored_without_an_index_waits_then_gets_one_at_its_next_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    older_build::set(dir.path(), true);
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.close().unwrap();
    older_build::set(dir.path(), false);
    let m = load_manifest(&newest_manifest(dir.path()));
    assert!(!m.user_index);
    let runs: Vec<Item> = m
        .runs
        .iter()
        .flat_map(|r| run_items(dir.path(), r))
        .collect();
    assert!(
        !runs.iter().any(|i| i.key().index),
        "written as before the index"
    );
    as_version_3(dir.path());
    let expected = after_a_full_load(dir.path());

    // Opened as before: what needs a user's groups waits for the load.
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert!(matches!(
        e.try_unread(0),
        Err(Error::NotReady { ticket, .. }) if ticket == STATE_TICKET
    ));
    hold::release(dir.path());
    assert_eq!(rows(e.unread(0)), expected[0].0);
    // The next checkpoint (after the load) writes a complete index.
    e.checkpoint().unwrap();
    let m = load_manifest(&newest_manifest(dir.path()));
    assert!(m.user_index);
    e.simulate_crash();

    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert_eq!(answers(&e), expected);
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    e.close().unwrap();
}

#[test]
fn verify_names_a_member_row_without_its_index_entry() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.close().unwrap();
    let verified = crate::offline::DataDir::open(dir.path())
        .unwrap()
        .verify()
        .unwrap();
    assert!(verified.clean(), "{:?}", verified.findings);
    // A writer's bug: a member row stored without its index entry.
    super::checkpoint_tests::add_run(
        dir.path(),
        &[Item::MemberPut {
            group: 2,
            user: 11,
            cursor: 0,
            join_point: 1,
        }],
    );
    let newest = newest_manifest(dir.path());
    let verified = crate::offline::DataDir::open(dir.path())
        .unwrap()
        .verify()
        .unwrap();
    let found: Vec<_> = verified
        .findings
        .iter()
        .filter(|f| f.what.contains("user index"))
        .collect();
    assert_eq!(found.len(), 1, "{:?}", verified.findings);
    assert_eq!(found[0].group, Some(2));
    assert_eq!(found[0].file.as_deref(), Some(newest.as_path()));
    assert!(found[0].what.contains("(user 11, tag 2, group 2)"));
    assert!(found[0].damage);
}

#[derive(Clone, Debug)]
enum Op {
    Create(u64),
    Delete(u64),
    Join(u64, u64),
    Leave(u64, u64),
    Checkpoint,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..8u64).prop_map(Op::Create),
        1 => (0..8u64).prop_map(Op::Delete),
        6 => (0..8u64, 0..6u64).prop_map(|(g, u)| Op::Join(g, u)),
        3 => (0..8u64, 0..6u64).prop_map(|(g, u)| Op::Leave(g, u)),
        3 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
    ]
}

/// `(group, user)` of member rows, and `(user, group)` of index entries.
type RowsAndIndex = (Vec<(u64, u64)>, BTreeSet<(u64, u64)>);

/// The merge of every run the newest manifest names: each member row
/// `(group, user)` and each index entry `(user, group)`.
fn merged_rows_and_index(dir: &Path) -> RowsAndIndex {
    let m = load_manifest(&newest_manifest(dir));
    let runs: Vec<_> = m
        .runs
        .iter()
        .map(|r| run_items(dir, r).into_iter().map(Ok))
        .collect();
    let (mut rows, mut index) = (Vec::new(), BTreeSet::new());
    for item in Merge::new(runs, true) {
        match item.unwrap() {
            Item::MemberPut { group, user, .. } => rows.push((group, user)),
            Item::IndexPut { user, group } => {
                index.insert((user, group));
            }
            _ => {}
        }
    }
    assert!(m.user_index);
    (rows, index)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Oracle: the merged runs' own member rows. After any sequence of
    /// joins, leaves, deletions, creations, checkpoints (with the merges
    /// the policy makes, the oldest run included or not) and reopenings,
    /// the merged index holds an entry for every member row (it may hold
    /// more: deleted groups' members). Left out: crashes (replay captures
    /// what it applied as any change) and the background load.
    #[test]
    fn the_merged_index_covers_every_member_row(ops in proptest::collection::vec(op(), 1..60)) {
        let dir = tempfile::tempdir().unwrap();
        let mut c = config(dir.path(), false);
        c.run_file_bytes_max = crate::state::run::RUN_FILE_BYTES_MIN;
        let mut e = Engine::open(c.clone()).unwrap();
        for op in &ops {
            // Refusals (no such group, already a member) change nothing.
            let _ = match *op {
                Op::Create(g) => e.create_group(g),
                Op::Delete(g) => e.delete_group(g),
                Op::Join(g, u) => e.join(g, u, JoinStart::Earliest).map(|_| ()),
                Op::Leave(g, u) => e.leave(g, u),
                Op::Checkpoint => e.checkpoint(),
                Op::Reopen => {
                    e.close().unwrap();
                    e = Engine::open(c.clone()).unwrap();
                    Ok(())
                }
            };
            if matches!(op, Op::Checkpoint | Op::Reopen) {
                let (rows, index) = merged_rows_and_index(dir.path());
                for (group, user) in rows {
                    prop_assert!(
                        index.contains(&(user, group)),
                        "after {:?}: member row ({}, {}) without its index entry",
                        op, group, user
                    );
                }
            }
        }
        e.close().unwrap();
    }
}
