//! The background load (`lazy.rs`) seen through the engine's API: with
//! the loader held before its first batch, every group a request names is
//! taken from the runs and answers exactly as after a full load; what
//! needs the whole state waits; a deletion, a send and an ack made while
//! the load is pending survive the load, a clean stop and a crash.

use std::collections::BTreeMap;
use std::path::Path;

use crate::state::lazy::hold;
use crate::tests::payload;
use crate::STATE_TICKET;
use crate::{Config, Engine, Error, JoinStart};

const GROUPS: u64 = 120;
const USERS: u64 = 9;

/// What a client can see of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    head: u64,
    records: Vec<(u64, Vec<u8>)>,
    members: Vec<u64>,
    cursors: Vec<(u64, u64)>,
}

/// A configuration whose state loads in the background (`background`)
/// or at open.
pub(super) fn config(dir: &Path, background: bool) -> Config {
    let mut c = Config::new(dir);
    // Some groups outgrow a small group (their records go to segments).
    c.small_group_bytes_max = 4 << 10;
    c.load_in_background = background;
    c
}

/// Groups 1..=GROUPS with members and records (a few large enough for
/// segments), acks, a leave, and two groups deleted; several checkpoints,
/// so the state is in several runs.
fn populate(e: &Engine) {
    for g in 1..=GROUPS {
        e.create_group(g).unwrap();
        for u in 0..(g % USERS) {
            e.join(g, u, JoinStart::Earliest).unwrap();
        }
        let count = if g % 17 == 0 { 60 } else { g % 5 };
        for i in 1..=count {
            e.append(g, 7, g * 1000 + i, &payload(g, i)).unwrap();
        }
        if g % 30 == 0 {
            e.checkpoint().unwrap();
        }
    }
    for g in (1..=GROUPS).step_by(3) {
        let head = e.head(g).unwrap();
        if g % USERS > 1 && head > 0 {
            e.ack(g, 1, head.min(2)).unwrap();
        }
    }
    e.leave(16, 2).unwrap();
    e.delete_group(11).unwrap();
    e.delete_group(44).unwrap();
    e.checkpoint().unwrap();
}

fn read_all(e: &Engine, group: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let b = e.read(group, after, 16, 1 << 20).unwrap();
        for r in b.records() {
            out.push((r.header.msg_id, r.payload().to_vec()));
        }
        if !b.has_more {
            return out;
        }
        after = b.last_id;
    }
}

fn seen(e: &Engine, group: u64) -> Option<Seen> {
    let head = match e.head(group) {
        Ok(h) => h,
        Err(Error::GroupNotFound { .. }) => return None,
        Err(other) => panic!("group {group}: {other}"),
    };
    let members = e.members(group).unwrap();
    let cursors = members
        .iter()
        .map(|&u| (u, e.cursor(group, u).unwrap()))
        .collect();
    Some(Seen {
        head,
        records: read_all(e, group),
        members,
        cursors,
    })
}

/// What every group id looks like (`None`: no such group).
type Groups = BTreeMap<u64, Option<Seen>>;

/// Each user's UNREAD: `(group, head, cursor)`.
type Unreads = Vec<Vec<(u64, u64, u64)>>;

fn everything(e: &Engine) -> Groups {
    (0..=GROUPS + 2).map(|g| (g, seen(e, g))).collect()
}

fn unread_of_all(e: &Engine) -> Unreads {
    (0..USERS)
        .map(|u| {
            e.unread(u)
                .into_iter()
                .map(|x| (x.group_id, x.head, x.cursor))
                .collect()
        })
        .collect()
}

fn is_state_wait<T>(r: crate::Result<T>) -> bool {
    matches!(r, Err(Error::NotReady { ticket, .. }) if ticket == STATE_TICKET)
}

/// `NotReady` with a ticket of the maintenance worker (not the whole
/// state's).
fn is_worker_wait<T>(r: &crate::Result<T>) -> bool {
    matches!(r, Err(Error::NotReady { ticket, .. }) if *ticket != STATE_TICKET)
}

/// Runs a `try_` request until it answers, waiting for the worker's
/// tickets in between; fails if it waits for the whole state (the load
/// is held: it would wait for ever).
pub(super) fn without_state_wait<T>(
    e: &Engine,
    what: &str,
    mut request: impl FnMut() -> crate::Result<T>,
) -> crate::Result<T> {
    loop {
        match request() {
            Err(Error::NotReady { ticket, .. }) => {
                assert_ne!(ticket, STATE_TICKET, "{what} waited for the whole load");
                e.wait_ready(ticket).unwrap();
            }
            other => return other,
        }
    }
}

/// A directory populated and stopped cleanly, with what a full load shows.
fn stopped_dir(dir: &Path) -> (Groups, Unreads) {
    let e = Engine::open(config(dir, false)).unwrap();
    populate(&e);
    e.close().unwrap();
    let e = Engine::open(config(dir, false)).unwrap();
    let expected = (everything(&e), unread_of_all(&e));
    e.close().unwrap();
    expected
}

#[test]
fn every_group_answers_while_the_load_is_held_as_after_a_full_load() {
    let dir = tempfile::tempdir().unwrap();
    let (groups, unread) = stopped_dir(dir.path());
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert!(e.recovery_report().loading_in_background);
    assert!(e.stats().state_loading);
    // Only the groups with files were taken (by the sweep of `groups/`).
    let with_files = (1..=GROUPS).filter(|g| g % 17 == 0).count() as u64;
    assert_eq!(e.stats().groups, with_files);
    // A user's groups come from the user index (`user_index_tests`).
    let unread_of_1 = without_state_wait(&e, "UNREAD", || e.try_unread(1)).unwrap();
    let as_rows = |list: Vec<crate::Unread>| -> Vec<(u64, u64, u64)> {
        list.into_iter()
            .map(|x| (x.group_id, x.head, x.cursor))
            .collect()
    };
    assert_eq!(as_rows(unread_of_1), unread[1]);
    // A saved group not yet registered exists for a creation.
    assert!(matches!(
        e.create_group(7),
        Err(Error::GroupExists { group: 7 })
    ));
    // Every group, each taken from the runs by its first request.
    assert_eq!(everything(&e), groups);
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    while !e.state_load_settled() {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert_eq!(unread_of_all(&e), unread, "after the load");
    assert!(!e.stats().state_loading);
    assert_eq!(everything(&e), groups);
    e.close().unwrap();
}

/// While the loader installs its batches (of a few groups each in
/// tests), requests for every group answer exactly as after a full load:
/// a group is published only once its rows are in the cursor table
/// (they are built in slots reserved before the catalog's lock is taken),
/// and the groups requests took meanwhile are skipped by the loader.
#[test]
fn every_group_answers_as_after_a_full_load_while_batches_install() {
    let dir = tempfile::tempdir().unwrap();
    let (groups, unread) = stopped_dir(dir.path());
    for round in 0..4 {
        let e = Engine::open(config(dir.path(), true)).unwrap();
        std::thread::scope(|s| {
            let readers: Vec<_> = (0..2u64)
                .map(|r| {
                    let (e, groups) = (&e, &groups);
                    s.spawn(move || {
                        let mut checks = 0;
                        // Each reader walks the groups in its own order,
                        // until the load has ended (and once more).
                        let mut last = false;
                        while !last {
                            last = e.state_load_settled();
                            for i in 0..=GROUPS + 2 {
                                let g = if r == 0 { i } else { GROUPS + 2 - i };
                                assert_eq!(seen(e, g), groups[&g], "round {round}, group {g}");
                                checks += 1;
                            }
                        }
                        checks
                    })
                })
                .collect();
            for r in readers {
                assert!(r.join().unwrap() > 0);
            }
        });
        assert_eq!(unread_of_all(&e), unread, "round {round}");
        e.close().unwrap();
    }
}

/// A group of a batch whose rows are not built yet is not found: a
/// request for it waits for the batch (then finds it with its rows),
/// however long the build takes.
#[test]
fn a_group_is_found_only_with_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let (groups, _) = stopped_dir(dir.path());
    hold::hold_rows(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !hold::at_rows(dir.path()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the loader never built rows"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Groups 1 and 2 are the first batch's (none has a file the open took).
    std::thread::scope(|s| {
        let reader = s.spawn(|| (seen(&e, 1), seen(&e, 2)));
        // Time for a reader that finds the groups unbuilt to read them;
        // one that waits for the batch goes on at the release.
        let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while !reader.is_finished() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        hold::release_rows(dir.path());
        assert_eq!(
            reader.join().unwrap(),
            (groups[&1].clone(), groups[&2].clone())
        );
    });
    e.wait_ready(STATE_TICKET).unwrap();
    assert_eq!(everything(&e), groups);
    e.close().unwrap();
}

#[test]
fn changes_made_while_the_load_is_pending_survive_the_load_and_a_clean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let (mut groups, _) = stopped_dir(dir.path());
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    // Deleted, sent to, acked and left while no batch was loaded: the
    // loader must not bring back what these changed.
    e.delete_group(20).unwrap();
    groups.insert(20, None);
    let a = e.append(21, 7, 21_000_777, b"while loading").unwrap();
    assert_eq!(a.msg_id, groups[&21].as_ref().unwrap().head + 1);
    e.ack(24, 1, 3).unwrap();
    e.leave(23, 0).unwrap();
    hold::release(dir.path());
    // Full load done (UNREAD waits for it).
    e.unread(0);
    assert_eq!(
        seen(&e, 20),
        None,
        "a group deleted while loading stays deleted"
    );
    assert_eq!(e.head(21).unwrap(), a.msg_id);
    assert_eq!(e.cursor(24, 1).unwrap(), 3);
    assert!(!e.members(23).unwrap().contains(&0));
    let now = everything(&e);
    e.close().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    assert_eq!(everything(&e), now, "after a clean stop, loaded in full");
    assert_eq!(now[&20], None);
    e.close().unwrap();
}

#[test]
fn a_crash_while_the_load_is_pending_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (groups, _) = stopped_dir(dir.path());
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    e.delete_group(30).unwrap();
    let sent: Vec<(u64, u64)> = [31u64, 34, 51, 85]
        .iter()
        .map(|&g| {
            (
                g,
                e.append(g, 7, g * 1000 + 999, &payload(g, 999))
                    .unwrap()
                    .msg_id,
            )
        })
        .collect();
    e.ack(32, 1, 1).unwrap();
    e.flush_cursors().unwrap();
    // The loader never ran a batch: a crash now.
    e.simulate_crash();
    hold::release(dir.path());
    for background in [true, false] {
        let e = Engine::open(config(dir.path(), background)).unwrap();
        assert_eq!(seen(&e, 30), None, "the deletion was acknowledged");
        for &(g, id) in &sent {
            let records = read_all(&e, g);
            assert_eq!(records.last(), Some(&(id, payload(g, 999))), "group {g}");
        }
        assert_eq!(e.cursor(32, 1).unwrap(), 1);
        let untouched = [1u64, 2, 17, 50, 119];
        for g in untouched {
            assert_eq!(seen(&e, g), groups[&g], "group {g}");
        }
        e.simulate_crash();
    }
}

#[test]
fn the_journal_tail_is_replayed_into_the_groups_it_names_before_the_engine_opens() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    // After the last checkpoint: sends, an ack and a deletion only in the
    // journal.
    let a = e.append(60, 7, 60_000_500, b"tail").unwrap();
    e.ack(61, 1, 1).unwrap();
    e.delete_group(62).unwrap();
    e.simulate_crash();
    // What a full load shows, on a copy (its open checkpoints the tail).
    let copy = tempfile::tempdir().unwrap();
    crate::tests::copy_dir(dir.path(), copy.path());
    let expected = {
        let e = Engine::open(config(copy.path(), false)).unwrap();
        let all = everything(&e);
        e.simulate_crash();
        all
    };
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    let report = e.recovery_report();
    assert!(report.loading_in_background);
    assert!(report.journal_entries_replayed > 0);
    assert_eq!(e.head(60).unwrap(), a.msg_id);
    assert_eq!(everything(&e), expected);
    hold::release(dir.path());
    e.close().unwrap();
}

/// The most groups any user of [`populate`] is in at once: user 0 is in
/// every group with `g % USERS > 0` (107 of 120), before two of them are
/// deleted.
const USER_0_PEAK: usize = 107;
/// User 0's groups once [`populate`] is done.
const USER_0_GROUPS: usize = USER_0_PEAK - 2;

fn config_with_limit(dir: &Path, background: bool, groups_per_user_max: usize) -> Config {
    Config {
        groups_per_user_max,
        ..config(dir, background)
    }
}

fn members_of(e: &Engine, groups: &[u64]) -> Vec<Vec<u64>> {
    groups.iter().map(|&g| e.members(g).unwrap()).collect()
}

/// A checkpoint's manifest bounds every user's groups: the most any user
/// held since the node opened (user 0's peak before two of its groups were
/// deleted); an open counts it again from the memberships it loads.
#[test]
fn the_manifest_bounds_every_users_groups_and_an_open_counts_it_again() {
    use crate::state::checkpoint_tests::{load_manifest, newest_manifest};
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    let bound = |d: &Path| load_manifest(&newest_manifest(d)).groups_per_user_bound;
    assert_eq!(bound(dir.path()), Some(USER_0_PEAK as u64));
    e.close().unwrap();
    for background in [false, true] {
        let e = Engine::open(config(dir.path(), background)).unwrap();
        e.join(9, 0, JoinStart::Head).unwrap();
        e.close().unwrap();
        assert_eq!(bound(dir.path()), Some(USER_0_GROUPS as u64 + 1));
        let e = Engine::open(config(dir.path(), false)).unwrap();
        e.leave(9, 0).unwrap();
        e.close().unwrap();
        assert_eq!(bound(dir.path()), Some(USER_0_GROUPS as u64 + 1));
    }
}

/// A join in the journal tail whose user is far below the limit is
/// decided with the groups registered so far: the open leaves the rest to
/// the background load.
#[test]
fn a_join_the_bound_decides_leaves_the_state_loading_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config(dir.path(), false)).unwrap();
    populate(&e);
    e.join(70, 8, JoinStart::Head).unwrap();
    e.simulate_crash();
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    assert!(
        e.recovery_report().loading_in_background,
        "user 8 is in no group: no count of its groups can reach the limit"
    );
    assert!(e.members(70).unwrap().contains(&8));
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    assert_eq!(e.unread(8).len(), 1);
    e.close().unwrap();
}

/// Joins in the journal tail of a user at the limit: the live node took
/// two and refused the third, took one after a leave and refused the
/// next. Replay must decide alike: the bound cannot decide them (user 0 is
/// at it), so the user's saved groups are registered from the user index
/// first and each join is counted exactly, and the rest of the state stays
/// loading in the background.
#[test]
fn a_join_near_the_limit_in_the_journal_tail_is_decided_as_the_live_node_did() {
    let limit = USER_0_PEAK;
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(config_with_limit(dir.path(), false, limit)).unwrap();
    populate(&e);
    let refused = |r: crate::Result<u64>| {
        matches!(
            r,
            Err(Error::LimitExceeded {
                what: "groups_per_user_max",
                ..
            })
        )
    };
    e.join(9, 0, JoinStart::Head).unwrap();
    e.join(18, 0, JoinStart::Head).unwrap();
    assert!(refused(e.join(27, 0, JoinStart::Head)));
    e.leave(9, 0).unwrap();
    e.join(27, 0, JoinStart::Head).unwrap();
    assert!(refused(e.join(36, 0, JoinStart::Head)));
    let tail_groups = [9, 18, 27, 36];
    let live = members_of(&e, &tail_groups);
    e.simulate_crash();
    hold::hold(dir.path());
    let e = Engine::open(config_with_limit(dir.path(), true, limit)).unwrap();
    assert!(
        e.recovery_report().loading_in_background,
        "user 0's joins were decided from its saved groups: the rest stays in the background"
    );
    assert_eq!(
        members_of(&e, &tail_groups),
        live,
        "replay decided otherwise"
    );
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    assert_eq!(e.unread(0).len(), limit);
    assert_eq!(members_of(&e, &tail_groups), live);
    e.close().unwrap();
}

/// A JOIN of a user near `groups_per_user_max` while the state loads,
/// with a user at the limit in the manifest (its bound decides no join):
/// the worker registers the user's saved groups from the user index, then
/// each join is decided exactly, as after the load: joins queued together
/// pass until the limit and the next is refused; a leave and a deletion
/// make room again. A user in no group joins too.
#[test]
fn a_join_near_the_limit_while_loading_is_decided_as_after_the_load() {
    let limit = USER_0_PEAK;
    let ops = |e: &Engine| -> Vec<String> {
        let submit = |g: u64, u: u64| {
            without_state_wait(e, "JOIN", || e.try_submit_join(g, u, JoinStart::Head))
                .and_then(|t| e.wait_op(t))
        };
        let mut out = Vec::new();
        // Queued together: each is counted when it applies.
        let queued: Vec<_> = [9, 18, 27]
            .into_iter()
            .map(|g| without_state_wait(e, "JOIN", || e.try_submit_join(g, 0, JoinStart::Head)))
            .collect();
        for t in queued {
            out.push(format!("{:?}", t.and_then(|t| e.wait_op(t))));
        }
        e.leave(9, 0).unwrap();
        out.push(format!("{:?}", submit(27, 0)));
        e.delete_group(1).unwrap();
        out.push(format!("{:?}", submit(36, 0)));
        out.push(format!("{:?}", submit(45, 0)));
        out.push(format!("{:?}", submit(5, 8)));
        let unread_0: Vec<u64> = e.unread(0).into_iter().map(|u| u.group_id).collect();
        out.push(format!(
            "{unread_0:?} {:?}",
            members_of(e, &[5, 18, 27, 36, 45])
        ));
        out
    };
    let full = tempfile::tempdir().unwrap();
    stopped_dir(full.path());
    let e = Engine::open(config_with_limit(full.path(), false, limit)).unwrap();
    let expected = ops(&e);
    e.close().unwrap();
    assert!(expected[2].contains("groups_per_user_max"), "{expected:?}");

    let dir = tempfile::tempdir().unwrap();
    stopped_dir(dir.path());
    hold::hold(dir.path());
    let e = Engine::open(config_with_limit(dir.path(), true, limit)).unwrap();
    let answered = ops(&e);
    assert!(e.stats().state_loading, "answered while the load is held");
    hold::release(dir.path());
    assert_eq!(answered, expected);
    e.close().unwrap();
}

/// UNREAD and SYNC while the state loads: the user's saved groups are
/// registered by the maintenance worker (`NotReady` with its ticket), not
/// on the calling thread (the event loop's), which makes no lookup in the
/// mapped runs; then they answer as after a full load.
#[test]
fn unread_and_sync_while_loading_read_no_run_on_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (_, unread) = stopped_dir(dir.path());
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    let before = hold::run_lookups();
    let first = e.try_unread(1);
    assert!(
        is_worker_wait(&first),
        "UNREAD answered {:?} groups",
        first.map(|l| l.len())
    );
    assert_eq!(hold::run_lookups(), before, "UNREAD read the runs");
    let rows = |list: Vec<crate::Unread>| -> Vec<(u64, u64, u64)> {
        list.into_iter()
            .map(|x| (x.group_id, x.head, x.cursor))
            .collect()
    };
    let list = without_state_wait(&e, "UNREAD", || e.try_unread(1)).unwrap();
    assert_eq!(rows(list), unread[1]);
    let first = e.try_sync(2, 4, 1 << 20, None);
    assert!(is_worker_wait(&first), "SYNC answered {:?}", first.err());
    let synced = without_state_wait(&e, "SYNC", || e.try_sync(2, 4, 1 << 20, None)).unwrap();
    let listed: Vec<u64> = synced.groups.iter().map(|g| g.unread.group_id).collect();
    let expected: Vec<u64> = unread[2]
        .iter()
        .filter(|(_, head, cursor)| head > cursor)
        .map(|&(g, ..)| g)
        .collect();
    assert_eq!(listed, expected);
    assert_eq!(hold::run_lookups(), before, "UNREAD or SYNC read the runs");
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    e.close().unwrap();
}

/// The first PULL, SEND, JOIN, ACK or LEAVE of a group not yet registered while the
/// state loads: the group is looked up in the mapped runs by the
/// maintenance worker (`NotReady` with its ticket, one job for every
/// request of the group), not on the calling thread (the event loop's);
/// run again, the request answers as after a full load. A group that does
/// not exist, or was deleted before the checkpoint, is `GroupNotFound`
/// after that one hop.
#[test]
fn first_requests_of_an_unregistered_group_while_loading_read_no_run_on_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (groups, _) = stopped_dir(dir.path());
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    let before = hold::run_lookups();
    let seen = |g: u64| groups[&g].clone().expect("a saved group");
    fn ticket_of<T>(r: &crate::Result<T>) -> u64 {
        match r {
            Err(Error::NotReady { ticket, .. }) if *ticket != STATE_TICKET => *ticket,
            _ => panic!("not a worker's wait"),
        }
    }

    // PULL of group 6 (user 1 is a member): the worker's lookup, then its
    // cursor, head and records as after a full load.
    let first = e.try_pull(6, 1, 100, 1 << 20, None);
    assert!(is_worker_wait(&first), "PULL answered {:?}", first.err());
    // A JOIN of the same group meanwhile waits for the same job.
    let join = e.try_submit_join(6, 8, JoinStart::Head);
    assert_eq!(ticket_of(&join), ticket_of(&first), "a second lookup job");
    let pull = without_state_wait(&e, "PULL", || e.try_pull(6, 1, 100, 1 << 20, None)).unwrap();
    let expected = seen(6);
    assert_eq!(
        (pull.cursor, pull.head),
        (expected.cursors[1].1, expected.head)
    );
    let records: Vec<(u64, Vec<u8>)> = pull
        .batch
        .records()
        .map(|r| (r.header.msg_id, r.payload().to_vec()))
        .collect();
    let unread: Vec<_> = (expected.records.iter())
        .filter(|(id, _)| *id > pull.cursor)
        .cloned()
        .collect();
    assert_eq!(records, unread);

    // SEND to group 7.
    let first = e.try_submit(&crate::AppendRequest {
        group_id: 7,
        sender_id: 7,
        client_msg_id: 1 << 40,
        payload: b"sent while loading",
    });
    assert!(is_worker_wait(&first), "SEND answered {:?}", first.err());
    let sent = without_state_wait(&e, "SEND", || {
        e.try_submit(&crate::AppendRequest {
            group_id: 7,
            sender_id: 7,
            client_msg_id: 1 << 40,
            payload: b"sent while loading",
        })
    })
    .unwrap();

    // JOIN of group 8 by user 8 (not a member).
    let first = e.try_submit_join(8, 8, JoinStart::Head);
    assert!(is_worker_wait(&first), "JOIN answered {:?}", first.err());
    let joined = without_state_wait(&e, "JOIN", || e.try_submit_join(8, 8, JoinStart::Head));
    let joined = joined.unwrap();

    // ACK of group 12 and LEAVE of group 13, by members.
    assert_eq!(seen(12).cursors[1], (1, 0));
    let first = e.try_ack_move(12, 1, 1);
    assert!(is_worker_wait(&first), "ACK answered {:?}", first.err());
    let acked = without_state_wait(&e, "ACK", || e.try_ack_move(12, 1, 1)).unwrap();
    assert_eq!((acked.cursor, acked.moved), (1, true));
    let first = e.try_submit_leave(13, 2);
    assert!(is_worker_wait(&first), "LEAVE answered {:?}", first.err());
    let left = without_state_wait(&e, "LEAVE", || e.try_submit_leave(13, 2)).unwrap();

    // A group that never existed, and one deleted before the checkpoint:
    // not found after exactly one hop.
    for g in [GROUPS + 50, 11] {
        let first = e.try_pull(g, 1, 100, 1 << 20, None);
        e.wait_ready(ticket_of(&first)).unwrap();
        assert!(
            matches!(e.try_pull(g, 1, 100, 1 << 20, None), Err(Error::GroupNotFound { group }) if group == g),
            "group {g}"
        );
    }
    assert_eq!(hold::run_lookups(), before, "a request read the runs");
    assert!(e.stats().state_loading, "still held");

    assert_eq!(e.wait(sent).unwrap().msg_id, seen(7).head + 1);
    assert_eq!(e.wait_op(joined).unwrap(), seen(8).head);
    e.wait_op(left).unwrap();
    assert!(!e.members(13).unwrap().contains(&2));
    hold::release(dir.path());
    e.close().unwrap();
}

/// What a request answers after a full load of `dir`, on a copy (the
/// request may change it; the copy is dropped).
fn after_a_full_load<T>(dir: &Path, request: impl FnOnce(&Engine) -> T) -> T {
    let copy = tempfile::tempdir().unwrap();
    crate::tests::copy_dir(dir, copy.path());
    let e = Engine::open(config(copy.path(), false)).unwrap();
    let answer = request(&e);
    e.simulate_crash();
    answer
}

/// A BATCH_ACK's outcomes as a client sees them: each pair's cursor and
/// error.
fn outcomes(list: Vec<crate::AckOutcome>) -> Vec<(u64, Option<String>)> {
    list.into_iter()
        .map(|o| (o.cursor, o.error.map(|e| e.to_string())))
        .collect()
}

/// The other requests that name groups (BATCH_ACK, DELETE_GROUP,
/// SET_RETENTION, CLEAR_HISTORY, CREATE_GROUP's check of the id,
/// READ_COUNT, GROUP_INFO, MEMBERS, and the node's own lookups of a
/// cursor, a head and a subscription's groups), each the first of its
/// group while the state loads: the group is looked up by the
/// maintenance worker (`NotReady` with its ticket), never on the calling
/// thread; run again, each answers as after a full load, `GroupNotFound`
/// for a group that does not exist included. A BATCH_ACK waits whole,
/// once for all its groups, and applies nothing before.
#[test]
fn the_other_requests_of_unregistered_groups_while_loading_read_no_run_on_the_calling_thread() {
    let dir = tempfile::tempdir().unwrap();
    let (groups, _) = stopped_dir(dir.path());
    let missing = GROUPS + 50;
    let policy = crate::Retention {
        by_cursor: true,
        max_age_ms: 0,
        max_bytes: 1 << 20,
    };
    // Group 17 has files (registered at open), 27, 28 and 29 not; user 1
    // is a member of 17, 27 and 28, not of 36; 11 was deleted.
    let pairs = [
        (17, 1),
        (27, 1),
        (28, 9_999),
        (missing, 1),
        (36, 1),
        (27, 2),
        (11, 1),
    ];
    let expected = after_a_full_load(dir.path(), |e| {
        (
            e.group_info(20).unwrap(),
            e.read_count(22, 1).unwrap(),
            e.members_page(21, 0, 100).unwrap(),
            outcomes(e.batch_ack(1, &pairs)),
            e.clear_history(32, 1, 1).unwrap(),
        )
    });
    assert_eq!(expected.1, 1, "user 1 read group 22's first message");
    hold::hold(dir.path());
    let e = Engine::open(config(dir.path(), true)).unwrap();
    let before = hold::run_lookups();
    /// The ticket of a request's first answer, a worker's wait.
    fn first<T>(what: &str, r: crate::Result<T>) -> u64 {
        match r {
            Err(Error::NotReady { ticket, .. }) if ticket != STATE_TICKET => ticket,
            other => panic!("{what} answered {:?}", other.err()),
        }
    }
    let seen = |g: u64| groups[&g].clone().expect("a saved group");

    first("GROUP_INFO", e.try_group_info(20));
    let info = without_state_wait(&e, "GROUP_INFO", || e.try_group_info(20));
    assert_eq!(info.unwrap(), expected.0);
    first("READ_COUNT", e.try_read_count(22, 1));
    let count = without_state_wait(&e, "READ_COUNT", || e.try_read_count(22, 1));
    assert_eq!(count.unwrap(), expected.1);
    first("MEMBERS", e.try_members_page(21, 0, 100));
    let page = without_state_wait(&e, "MEMBERS", || e.try_members_page(21, 0, 100));
    assert_eq!(page.unwrap(), expected.2);
    first("the cursor", e.try_cursor(23, 1));
    let cursor = without_state_wait(&e, "the cursor", || e.try_cursor(23, 1));
    assert_eq!(cursor.unwrap(), seen(23).cursors[1].1);
    first("the head", e.try_head(24));
    assert_eq!(
        without_state_wait(&e, "the head", || e.try_head(24)).unwrap(),
        seen(24).head
    );
    // A subscription's groups: one wait for all of them.
    let ticket = first("the groups' check", e.try_missing_group(&[25, 26, missing]));
    e.wait_ready(ticket).unwrap();
    assert_eq!(
        e.try_missing_group(&[25, 26, missing]).unwrap(),
        Some(missing)
    );
    assert_eq!(e.try_missing_group(&[25, 26]).unwrap(), None);

    // BATCH_ACK: nothing applied before its groups are looked up, then
    // every pair's outcome as after a full load, after one wait.
    let cursor_17 = e.cursor(17, 1).unwrap();
    let ticket = first("BATCH_ACK", e.try_batch_ack(1, &pairs));
    assert_eq!(e.cursor(17, 1).unwrap(), cursor_17, "a pair was applied");
    e.wait_ready(ticket).unwrap();
    assert_eq!(outcomes(e.try_batch_ack(1, &pairs).unwrap()), expected.3);

    // DELETE_GROUP, SET_RETENTION, CLEAR_HISTORY, CREATE_GROUP.
    first("DELETE_GROUP", e.try_submit_delete_group(30));
    let deleted = without_state_wait(&e, "DELETE_GROUP", || e.try_submit_delete_group(30));
    for g in [missing + 2, 44] {
        first("DELETE_GROUP", e.try_submit_delete_group(g));
        let gone = without_state_wait(&e, "DELETE_GROUP", || e.try_submit_delete_group(g));
        assert!(matches!(gone, Err(Error::GroupNotFound { group }) if group == g));
    }
    first("SET_RETENTION", e.try_submit_set_retention(31, policy));
    let set = without_state_wait(&e, "SET_RETENTION", || {
        e.try_submit_set_retention(31, policy)
    });
    first("CLEAR_HISTORY", e.try_submit_clear_history(32, 1, 1));
    let cleared = without_state_wait(&e, "CLEAR_HISTORY", || e.try_submit_clear_history(32, 1, 1));
    assert!(matches!(
        e.try_submit_clear_history(32, 8, 1),
        Err(Error::NotMember { group: 32, user: 8 })
    ));
    first("CREATE_GROUP", e.try_submit_create_group(33));
    let exists = without_state_wait(&e, "CREATE_GROUP", || e.try_submit_create_group(33));
    assert!(matches!(exists, Err(Error::GroupExists { group: 33 })));
    first("CREATE_GROUP", e.try_submit_create_group(missing + 1));
    let created = without_state_wait(&e, "CREATE_GROUP", || {
        e.try_submit_create_group(missing + 1)
    });
    assert_eq!(hold::run_lookups(), before, "a request read the runs");
    assert!(e.stats().state_loading, "still held");

    e.wait_op(deleted.unwrap()).unwrap();
    assert!(matches!(
        e.head(30),
        Err(Error::GroupNotFound { group: 30 })
    ));
    e.wait_op(set.unwrap()).unwrap();
    assert_eq!(e.group_info(31).unwrap().retention, policy);
    assert_eq!(e.wait_op(cleared.unwrap()).unwrap(), expected.4);
    e.wait_op(created.unwrap()).unwrap();
    assert_eq!(e.head(missing + 1).unwrap(), 0);
    hold::release(dir.path());
    e.close().unwrap();
}

/// A client's JOIN while the state loads: admitted at once when the bound
/// proves its user below the limit, counting the joins admitted before it;
/// otherwise it waits for the worker to register its user's saved groups,
/// then is decided exactly.
#[test]
fn a_join_while_loading_waits_only_when_its_user_may_be_near_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    stopped_dir(dir.path());
    // The open's count: user 0's groups now, below its peak.
    let limit = USER_0_GROUPS + 2;
    hold::hold(dir.path());
    let e = Engine::open(config_with_limit(dir.path(), true, limit)).unwrap();
    assert!(e.stats().state_loading);
    // User 8 is in no group: 0 registered + the bound is below the limit.
    e.join(5, 8, JoinStart::Head).unwrap();
    // A second: 1 registered + the bound + 1 admitted before reaches it.
    assert!(is_worker_wait(&e.try_submit_join(6, 8, JoinStart::Head)));
    // User 0 is in the groups the sweep registered (those with files).
    assert!(is_worker_wait(&e.try_submit_join(9, 0, JoinStart::Head)));
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    e.join(6, 8, JoinStart::Head).unwrap();
    e.join(9, 0, JoinStart::Head).unwrap();
    e.join(18, 0, JoinStart::Head).unwrap();
    assert!(matches!(
        e.join(27, 0, JoinStart::Head),
        Err(Error::LimitExceeded {
            what: "groups_per_user_max",
            ..
        })
    ));
    assert_eq!(e.unread(8).len(), 2);
    e.close().unwrap();
}

/// A creation while the state loads: admitted at once when the groups
/// registered plus the manifest's bound stay below `groups_max`, otherwise
/// it waits for the load and is decided exactly; a saved group not yet
/// registered exists for it, a deleted one does not.
#[test]
fn a_creation_while_loading_waits_only_when_the_groups_may_be_near_groups_max() {
    let dir = tempfile::tempdir().unwrap();
    stopped_dir(dir.path());
    let saved = GROUPS as usize - 2;
    let limit = saved + 12;
    hold::hold(dir.path());
    let e = Engine::open(Config {
        groups_max: limit,
        ..config(dir.path(), true)
    })
    .unwrap();
    // The sweep registered the groups with files.
    let registered = e.stats().groups as usize;
    assert_eq!(registered, 7);
    // Each is admitted while registered + the bound stays below the limit.
    let admitted = limit - saved - registered;
    // Deleted before the checkpoint: its id is free.
    e.create_group(11).unwrap();
    for g in 1..admitted as u64 {
        e.submit_create_group(1_000 + g).unwrap();
    }
    // Its id is looked up in the runs by the worker, then it waits for
    // the whole load.
    let mut create = e.try_submit_create_group(2_000);
    while let Err(Error::NotReady { ticket, .. }) = create {
        if ticket == STATE_TICKET {
            break;
        }
        e.wait_ready(ticket).unwrap();
        create = e.try_submit_create_group(2_000);
    }
    assert!(is_state_wait(create));
    assert!(matches!(
        e.submit_create_group(8),
        Err(Error::GroupExists { group: 8 })
    ));
    assert!(e.stats().state_loading, "still held");
    hold::release(dir.path());
    // Counted exactly now: the saved groups and the new ones.
    let mut made = saved + admitted;
    while made < limit {
        e.create_group(2_000 + made as u64).unwrap();
        made += 1;
    }
    assert!(matches!(
        e.create_group(3_000),
        Err(Error::LimitExceeded {
            what: "groups_max",
            ..
        })
    ));
    e.close().unwrap();
}

/// A power cut under `never` (storage.md crash case 5) left the journal
/// torn inside the first frame written after the last checkpoint, while
/// group 34's active segment holds that frame's records and those of the
/// frames after it (their journal bytes were lost), and a small group's
/// record is lost with its frame. The open cuts the tail, loads group 34
/// (the sweep of `groups/` registers every group with a directory, and
/// only those can hold records the journal lost) and leaves the rest of
/// the state loading: every group answers as after a full load, while
/// the loader is held and once it finished.
#[test]
fn a_power_cut_with_a_torn_tail_and_leading_segments_leaves_the_state_loading() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path(), false);
    c.fsync = crate::FsyncPolicy::Never;
    // Each round's records reach the group's segment at once.
    c.segment_tail_bytes = 0;
    let e = Engine::open(c.clone()).unwrap();
    populate(&e);
    let head = e.head(34).unwrap();
    for i in 1..=30 {
        e.append(34, 7, 34_000_000 + i, &payload(34, 100 + i))
            .unwrap();
    }
    e.append(2, 7, 2_000_000, b"only in the journal").unwrap();
    e.simulate_crash();
    let journal = crate::tests::newest_file(&dir.path().join("journal"), ".tmj");
    let first_of_34 = crate::commit::journal::frames_of_file(&std::fs::read(&journal).unwrap())
        .into_iter()
        .find(|f| {
            f.entries.iter().any(|&(_, _, kind, g)| {
                kind == crate::commit::journal::EntryKind::Records && g == 34
            })
        })
        .expect("group 34's records are in the newest journal file")
        .offset;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(first_of_34 as u64 + 20)
        .unwrap();
    // What a full load shows, on a copy.
    let copy = tempfile::tempdir().unwrap();
    crate::tests::copy_dir(dir.path(), copy.path());
    let expected = {
        let mut c = c.clone();
        c.data_dir = copy.path().to_path_buf();
        let e = Engine::open(c).unwrap();
        let all = everything(&e);
        e.simulate_crash();
        all
    };
    let of_34 = expected[&34].as_ref().expect("group 34");
    assert_eq!(of_34.head, head + 30, "the segment's records are kept");
    assert_eq!(
        of_34.records.last(),
        Some(&(head + 30, payload(34, 130))),
        "the segment's records are kept"
    );

    hold::hold(dir.path());
    let mut c = c.clone();
    c.load_in_background = true;
    let e = Engine::open(c).unwrap();
    let report = e.recovery_report().clone();
    assert!(report.loading_in_background, "{report:?}");
    assert!(report.bytes_cut() > 0, "the torn tail was cut: {report:?}");
    assert!(report.groups_verified >= 1, "group 34 loaded: {report:?}");
    assert!(e.stats().state_loading);
    assert_eq!(everything(&e), expected, "while the loader is held");
    hold::release(dir.path());
    e.wait_ready(crate::STATE_TICKET).unwrap();
    assert!(!e.stats().state_loading);
    assert_eq!(everything(&e), expected, "once loaded");
    // No id is given twice.
    assert_eq!(
        e.append(34, 7, 35_000_000, b"next").unwrap().msg_id,
        head + 31
    );
    e.close().unwrap();
}
