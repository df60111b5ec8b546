//! Damage to a checkpoint's runs and manifest that only the background
//! load meets (format-spec/storage.md 6.1, 6.3, section 11 "Loading in the
//! background", section 19): items that do not decode behind valid CRCs,
//! found by a request's lookup (a user's index entries for UNREAD, a
//! group's items for its first read) or by the loader, are named alike by
//! all of them and by `verify`, and never served; a manifest that says its
//! runs hold a complete user index when they do not is named by `verify`
//! and repaired by storing the checkpoint without the claim, after which
//! the node waits for the whole load and writes a complete index again.

use std::path::{Path, PathBuf};

use super::checkpoint_tests::{add_run, load_manifest, manifests, newest_manifest};
use super::checkpointer::older_build;
use super::lazy_tests::{config, without_state_wait};
use super::user_index_tests::{after_a_full_load, answers, populate, GROUPS};
use super::Item;
use crate::offline::{DataDir, RepairTarget};
use crate::state::lazy::hold;
use crate::state::run::{part_file_name, RUN_HEADER_BYTES};
use crate::tests::copy_dir;
use crate::{Engine, Error, STATE_TICKET};

/// Where the first item of a run part's first block starts (the block
/// header is 12 bytes).
const FIRST_ITEM: usize = RUN_HEADER_BYTES + 12;

/// `head`, then stale index entries of `user` (naming groups that do not
/// exist), then `tail`: enough that the run's first block is not its last
/// (the open decodes each part's last block, for its last key, which
/// would reject the checkpoint at the open; damage in an earlier block is
/// met only by the load), and that the first block ends before the next
/// id's keys, so that only lookups in `head`'s range read it.
fn with_filler(head: &[Item], user: u64, tail: &[Item]) -> Vec<Item> {
    let mut items = head.to_vec();
    items.extend((0..40_000).map(|i| Item::IndexPut {
        user,
        group: 1_000_000 + i,
    }));
    items.extend_from_slice(tail);
    items
}

/// The newest run's only part.
fn newest_part(dir: &Path) -> PathBuf {
    let m = load_manifest(&newest_manifest(dir));
    let p = &m.runs[0].parts[0];
    assert!(m.runs[0].parts.len() == 1);
    dir.join("state").join(part_file_name(p.run_seq, p.part))
}

/// A writer's bug: byte `at` of the first block of `part` becomes `value`
/// (the bytes there must be `expect`), and the block's CRC is made valid
/// again. Returns the block's offset.
fn damage_behind_the_crc(part: &Path, at: usize, expect: &[u8], value: u8) -> u64 {
    let mut b = std::fs::read(part).unwrap();
    assert_eq!(&b[at..at + expect.len()], expect, "the item as encoded");
    let block = RUN_HEADER_BYTES;
    let len = u32::from_le_bytes(b[block + 4..block + 8].try_into().unwrap()) as usize;
    assert!(block + len + 32 < b.len(), "not the last block");
    b[at] = value;
    let crc = crc32fast::hash(&b[block + 4..block + len]);
    b[block..block + 4].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(part, b).unwrap();
    block as u64
}

/// `(file name, offset, reason)` of a `Corrupt`, anything else a panic.
fn named(what: &str, r: crate::Result<impl std::fmt::Debug>) -> (String, u64, String) {
    match r {
        Err(Error::Corrupt {
            path,
            offset,
            reason,
            ..
        }) => (
            path.file_name().unwrap().to_string_lossy().into_owned(),
            offset,
            reason,
        ),
        other => panic!("{what}: expected Corrupt, got {other:?}"),
    }
}

/// `(file name, offset)` of every damage `verify` finds in the run parts.
fn verify_names(dir: &Path) -> Vec<(String, u64)> {
    DataDir::open(dir)
        .unwrap()
        .verify()
        .unwrap()
        .findings
        .iter()
        .filter(|f| f.damage)
        .filter_map(|f| {
            let file = f.file.as_ref()?.file_name()?.to_string_lossy().into_owned();
            file.ends_with(".tmr").then_some((file, f.offset))
        })
        .collect()
}

/// Every group's head after a full load (on a copy, before the damage).
fn heads_of(dir: &Path) -> std::collections::BTreeMap<u64, u64> {
    let copy = copy_of(dir);
    let e = Engine::open(config(copy.path(), false)).unwrap();
    let heads = (1..=GROUPS)
        .filter_map(|g| Some((g, e.head(g).ok()?)))
        .collect();
    e.simulate_crash();
    heads
}

fn copy_of(dir: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir, copy.path());
    copy
}

#[test]
fn an_index_item_that_does_not_decode_is_named_alike_by_unread_the_loader_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.close().unwrap();
    // User 1's entries: (1, 2, 3), then (1, 2, 4) with its kind byte
    // damaged (5, IndexPut, becomes 9, no kind).
    add_run(
        dir.path(),
        &with_filler(
            &[
                Item::IndexPut { user: 1, group: 3 },
                Item::IndexPut { user: 1, group: 4 },
            ],
            1,
            &[],
        ),
    );
    let heads = heads_of(dir.path());
    let part = newest_part(dir.path());
    let block = damage_behind_the_crc(&part, FIRST_ITEM + 3, &[5, 0, 1], 9);
    let part_name = part.file_name().unwrap().to_string_lossy().into_owned();

    // A request meets it: UNREAD of user 1 has the user's entries read.
    let first = copy_of(dir.path());
    hold::hold(first.path());
    let e = Engine::open(config(first.path(), true)).unwrap();
    // Group 1 sorts before the damaged block: its lookup is served.
    let read_before = e.read(1, 0, 100, 1 << 20).unwrap().last_id;
    // The user's lookups are the maintenance worker's: UNREAD run again
    // after its ticket gets the error.
    let by_unread = named(
        "UNREAD of user 1",
        without_state_wait(&e, "UNREAD", || e.try_unread(1)),
    );
    assert_eq!((&by_unread.0[..], by_unread.1), (&part_name[..], block));
    // What needs the index is refused after one worker hop; every group
    // whose own items decode is still served, registered before or not.
    named(
        "UNREAD of user 0",
        without_state_wait(&e, "UNREAD of user 0", || e.try_unread(0)),
    );
    assert_eq!(e.read(1, 0, 100, 1 << 20).unwrap().last_id, read_before);
    assert_eq!(e.head(40).unwrap(), heads[&40]);
    hold::release(first.path());
    e.wait_ready(STATE_TICKET).unwrap();
    assert_eq!(named("after the load", e.try_unread(2)), by_unread);
    assert_eq!(e.head(52).unwrap(), heads[&52]);
    e.simulate_crash();

    // The loader meets it first.
    let second = copy_of(dir.path());
    let e = Engine::open(config(second.path(), true)).unwrap();
    e.wait_ready(STATE_TICKET).unwrap();
    let by_loader = named("the loader", e.try_unread(1));
    assert_eq!(by_loader, by_unread);
    assert_eq!(e.head(40).unwrap(), heads[&40]);
    e.simulate_crash();

    // verify names the same part and offset.
    assert!(
        verify_names(dir.path()).contains(&(part_name, block)),
        "{:?}",
        verify_names(dir.path())
    );
}

#[test]
fn a_member_row_that_does_not_decode_is_named_alike_by_a_first_read_the_loader_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.close().unwrap();
    // Two joins to group 5 in a new run; the second row's kind byte (3,
    // MemberPut) becomes 9.
    let join = |user| Item::MemberPut {
        group: 5,
        user,
        cursor: 0,
        join_point: 1,
    };
    add_run(
        dir.path(),
        &with_filler(
            &[join(20), join(21)],
            5,
            &[
                Item::IndexPut { user: 20, group: 5 },
                Item::IndexPut { user: 21, group: 5 },
            ],
        ),
    );
    let heads = heads_of(dir.path());
    let part = newest_part(dir.path());
    let block = damage_behind_the_crc(&part, FIRST_ITEM + 5, &[3, 0, 1, 0, 0], 9);
    let part_name = part.file_name().unwrap().to_string_lossy().into_owned();

    // The group's first lookup meets it.
    let first = copy_of(dir.path());
    hold::hold(first.path());
    let e = Engine::open(config(first.path(), true)).unwrap();
    // Group 2 sorts before the damaged block: its lookup is served.
    let two = e.read(2, 0, 100, 1 << 20).unwrap().last_id;
    // A PULL (the event loop's request): the worker's lookup meets the
    // damage, the calling thread reads no run, and the PULL run again
    // after its ticket gets the error.
    let lookups = hold::run_lookups();
    let ticket = match e.try_pull(5, 20, 100, 1 << 20, None) {
        Err(Error::NotReady { ticket, .. }) if ticket != STATE_TICKET => ticket,
        other => panic!("the first PULL of group 5: {:?}", other.map(|p| p.head)),
    };
    e.wait_ready(ticket).unwrap();
    let by_pull = named(
        "the PULL of group 5 after the worker's lookup",
        e.try_pull(5, 20, 100, 1 << 20, None).map(|p| p.head),
    );
    // Every other request of the group after the lookup: the same error
    // (a BATCH_ACK's at each of its pairs), without a run read.
    let pairs = [(2, 0), (5, 1), (5, 2)];
    let acks = e.try_batch_ack(0, &pairs).unwrap();
    assert!(acks[0].error.is_none(), "{:?}", acks[0].error);
    for (what, r) in [
        ("GROUP_INFO", e.try_group_info(5).map(drop)),
        ("READ_COUNT", e.try_read_count(5, 1).map(drop)),
        ("MEMBERS", e.try_members_page(5, 0, 10).map(drop)),
        ("the cursor", e.try_cursor(5, 20).map(drop)),
        ("the head", e.try_head(5).map(drop)),
        ("DELETE_GROUP", e.try_submit_delete_group(5).map(drop)),
        (
            "SET_RETENTION",
            e.try_submit_set_retention(5, Default::default()).map(drop),
        ),
        (
            "CLEAR_HISTORY",
            e.try_submit_clear_history(5, 20, 1).map(drop),
        ),
        ("CREATE_GROUP", e.try_submit_create_group(5).map(drop)),
    ]
    .into_iter()
    .chain(acks.into_iter().skip(1).map(|a| {
        assert_eq!(a.cursor, 0);
        ("a BATCH_ACK pair", Err(a.error.expect("refused")))
    })) {
        assert_eq!(named(what, r), by_pull, "{what}");
    }
    assert_eq!(e.try_missing_group(&[2, 5]).unwrap(), Some(5));
    assert_eq!(hold::run_lookups(), lookups, "the PULL read the runs");
    let by_read = named(
        "the first read of group 5",
        e.read(5, 0, 100, 1 << 20).map(|b| b.last_id),
    );
    assert_eq!(by_read, by_pull);
    assert_eq!((&by_read.0[..], by_read.1), (&part_name[..], block));
    assert_eq!(named("again", e.head(5)), by_read);
    // Every other group is still served, registered before or not.
    assert_eq!(e.read(2, 0, 100, 1 << 20).unwrap().last_id, two);
    assert_eq!(e.head(40).unwrap(), heads[&40]);
    hold::release(first.path());
    e.wait_ready(STATE_TICKET).unwrap();
    assert_eq!(named("after the load", e.head(5)), by_read);
    assert_eq!(e.head(52).unwrap(), heads[&52]);
    e.simulate_crash();

    // The loader meets it first: the same error for the group.
    let second = copy_of(dir.path());
    let e = Engine::open(config(second.path(), true)).unwrap();
    e.wait_ready(STATE_TICKET).unwrap();
    assert_eq!(named("after the loader", e.head(5)), by_read);
    assert_eq!(e.head(40).unwrap(), heads[&40]);
    e.simulate_crash();

    assert!(
        verify_names(dir.path()).contains(&(part_name, block)),
        "{:?}",
        verify_names(dir.path())
    );
}

/// Sets the `user_index` byte (the body's last) of every manifest of
/// `dir` to `value`, with valid CRCs: a manifest that claims what its runs
/// may not hold.
fn set_user_index_flag(dir: &Path, value: u8) {
    for path in manifests(dir) {
        let mut b = std::fs::read(&path).unwrap();
        *b.last_mut().unwrap() = value;
        let body_crc = crc32fast::hash(&b[32..]);
        b[24..28].copy_from_slice(&body_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&b[..28]);
        b[28..32].copy_from_slice(&header_crc.to_le_bytes());
        std::fs::write(&path, b).unwrap();
    }
}

/// What a repair of every damage does to `dir`, with the plan's lines.
fn repair(dir: &Path) -> Vec<String> {
    let mut d = DataDir::open(dir).unwrap();
    let plan = d.plan_repair(RepairTarget::AllDamaged).unwrap();
    assert!(plan.refused.is_none(), "{:?}", plan.refused);
    let actions = plan.actions.clone();
    assert!(!plan.is_empty(), "the repair plans nothing: {actions:?}");
    d.repair(plan).unwrap();
    actions
}

#[test]
fn a_manifest_claiming_an_index_its_runs_lack_is_named_by_verify_and_repaired_by_dropping_the_claim(
) {
    let dir = tempfile::tempdir().unwrap();
    older_build::set(dir.path(), true);
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.close().unwrap();
    older_build::set(dir.path(), false);
    assert!(!load_manifest(&newest_manifest(dir.path())).user_index);
    let expected = after_a_full_load(dir.path());
    set_user_index_flag(dir.path(), 1);
    assert!(load_manifest(&newest_manifest(dir.path())).user_index);

    let verified = DataDir::open(dir.path()).unwrap().verify().unwrap();
    let missing = verified
        .findings
        .iter()
        .filter(|f| f.damage && f.what.contains("user index"))
        .count();
    let rows: usize = expected.iter().map(|(unread, _)| unread.len()).sum();
    assert_eq!(missing, rows, "{:?}", verified.findings);

    let actions = repair(dir.path());
    assert!(
        actions.iter().any(|a| a.contains("user index")),
        "{actions:?}"
    );
    let verified = DataDir::open(dir.path()).unwrap().verify().unwrap();
    assert!(verified.clean(), "{:?}", verified.findings);
    assert!(!load_manifest(&newest_manifest(dir.path())).user_index);

    // The node waits for the whole load, then writes a complete index.
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert!(matches!(
        e.try_unread(0),
        Err(Error::NotReady { ticket, .. }) if ticket == STATE_TICKET
    ));
    hold::release(dir.path());
    e.wait_ready(STATE_TICKET).unwrap();
    assert_eq!(answers(&e), expected);
    e.checkpoint().unwrap();
    assert!(load_manifest(&newest_manifest(dir.path())).user_index);
    e.simulate_crash();
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert_eq!(answers(&e), expected, "from the rebuilt index");
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    e.close().unwrap();
}

#[test]
fn a_member_row_without_its_index_entry_is_repaired_and_answered_after_the_repair() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.close().unwrap();
    // A writer's bug: a join stored without its index entry.
    add_run(
        dir.path(),
        &[Item::MemberPut {
            group: 2,
            user: 11,
            cursor: 0,
            join_point: 1,
        }],
    );
    let expected = after_a_full_load(dir.path());
    assert!(expected[11].0.iter().any(|r| r.0 == 2));
    assert!(!DataDir::open(dir.path()).unwrap().verify().unwrap().clean());
    repair(dir.path());
    let verified = DataDir::open(dir.path()).unwrap().verify().unwrap();
    assert!(verified.clean(), "{:?}", verified.findings);

    // UNREAD of user 11 never leaves group 2 out: it waits for the load.
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert!(matches!(
        e.try_unread(11),
        Err(Error::NotReady { ticket, .. }) if ticket == STATE_TICKET
    ));
    hold::release(dir.path());
    e.wait_ready(STATE_TICKET).unwrap();
    assert_eq!(answers(&e), expected);
    e.checkpoint().unwrap();
    e.simulate_crash();
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert_eq!(answers(&e), expected, "from the rebuilt index");
    hold::release(dir.path());
    e.close().unwrap();
}
