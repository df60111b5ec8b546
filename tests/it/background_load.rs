//! A node listens before its saved groups and memberships are registered
//! (format-spec/storage.md section 11, "Loading in the background"): while
//! the rest loads, requests that name one group are answered as after a
//! full load, and a SIGKILL loses nothing acknowledged, also with
//! checkpoints asked for every 100 ms meanwhile (none may be taken before
//! every group is registered: a capture's pinned journal files cover the
//! registered groups only). The hidden `serve --load-batch-pause-ms` holds
//! the loader before each batch, and the test checks STATS
//! `storage.state_loading` is still 1 before it acts and before the kill.
//! Asserts outcomes, never time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart, Request};

use crate::harness::Node;

const GROUPS: u64 = 3000;
const MEMBERS: u64 = 3;
/// Groups with messages before the restart (every tenth).
const WITH_MESSAGES: u64 = 10;
const DELETED: u64 = 7;

fn value(c: &mut Client, name: &str) -> u64 {
    c.stats()
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("STATS has no {name}"))
        .1
}

fn member(g: u64, i: u64) -> u64 {
    100 + (g * 7 + i) % 500
}

/// Every group's messages, read by its first member without acking.
fn messages(c: &mut Client, g: u64) -> Vec<(u64, Vec<u8>)> {
    let page = c.pull(g, member(g, 0), 0, 100_000, 0).unwrap();
    page.messages
        .iter()
        .map(|m| (m.msg_id, m.payload.clone()))
        .collect()
}

/// Creates groups `1..=groups`, each with the members `members_of(g)`
/// joined at the earliest message. Pipelined, fifty groups at a time:
/// within the requests a connection may have in flight.
fn create_groups(c: &mut Client, groups: u64, members_of: impl Fn(u64) -> Vec<u64>) {
    for first in (1..=groups).step_by(50) {
        let mut waiting = Vec::new();
        for g in first..(first + 50).min(groups + 1) {
            waiting.push(c.submit(&Request::CreateGroup { group: g }).unwrap());
            for user in members_of(g) {
                let join = Request::Join {
                    group: g,
                    user,
                    start: JoinStart::Earliest,
                };
                waiting.push(c.submit(&join).unwrap());
            }
        }
        for id in waiting {
            c.wait(id, Duration::from_secs(60))
                .unwrap()
                .response()
                .unwrap();
        }
    }
}

/// Sends one message to each group of `groups` (pipelined, 200 at a time:
/// within the requests a connection may have in flight); returns what
/// each was acknowledged as.
fn send_each(
    c: &mut Client,
    groups: &[u64],
    tag: &str,
    key_base: u64,
) -> BTreeMap<u64, (u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for chunk in groups.chunks(200) {
        let mut waiting = Vec::new();
        for &g in chunk {
            let payload = format!("{tag} to {g}").into_bytes();
            let id = c
                .submit(&Request::Send {
                    group: g,
                    sender: 9,
                    client_msg_id: key_base + g,
                    payload: &payload,
                })
                .unwrap();
            waiting.push((g, id, payload));
        }
        for (g, id, payload) in waiting {
            let f = c.wait(id, Duration::from_secs(60)).unwrap();
            match f.response().unwrap() {
                tidemark_protocol::Response::Send { msg_id, .. } => {
                    out.insert(g, (msg_id, payload));
                }
                other => panic!("send to {g}: {other:?}"),
            }
        }
    }
    out
}

#[test]
fn a_node_killed_while_its_state_loads_in_the_background_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected: BTreeMap<u64, Vec<(u64, Vec<u8>)>> = BTreeMap::new();
    {
        let mut node = Node::start(dir.path(), &[]);
        let mut c = node.client();
        create_groups(&mut c, GROUPS, |g| {
            (0..MEMBERS).map(|i| member(g, i)).collect()
        });
        expected.extend((1..=GROUPS).map(|g| (g, Vec::new())));
        let some: Vec<u64> = (1..=GROUPS).filter(|g| g % WITH_MESSAGES == 0).collect();
        for (g, m) in send_each(&mut c, &some, "before", 0) {
            expected.get_mut(&g).unwrap().push(m);
        }
        drop(c);
        assert!(node.terminate().success(), "a clean stop");
    }

    let mut node = Node::start(
        dir.path(),
        &[
            "--load-batch-pause-ms",
            "600000",
            "--checkpoint-interval-ms",
            "100",
        ],
    );
    let mut c = node.client();
    assert_eq!(value(&mut c, "storage.state_loading"), 1);
    assert!(value(&mut c, "engine.groups") < GROUPS, "not loaded yet");
    // Reads of single groups are answered as after a full load.
    for g in [1, WITH_MESSAGES, 1234, GROUPS] {
        assert_eq!(messages(&mut c, g), expected[&g], "group {g}");
    }
    // Writes to single groups: sends (to groups holding records and to
    // empty ones), a deletion.
    let targets: Vec<u64> = (1..=GROUPS).filter(|g| g % 37 == 0).collect();
    for (g, m) in send_each(&mut c, &targets, "while loading", 1 << 32) {
        expected.get_mut(&g).unwrap().push(m);
    }
    c.delete_group(DELETED).unwrap();
    expected.remove(&DELETED);
    // Rounds go on, one after another, long after the first checkpoint
    // is due (every 100 ms).
    let started = Instant::now();
    let mut i = 0;
    while i < 50 || (started.elapsed() < Duration::from_millis(1000) && i < 400) {
        i += 1;
        let payload = format!("tick {i}").into_bytes();
        let sent = c.send(41, 9, 1_000_000 + i, &payload).unwrap();
        expected.get_mut(&41).unwrap().push((sent.msg_id, payload));
    }
    assert_eq!(
        value(&mut c, "storage.state_loading"),
        1,
        "the kill must come while the state loads"
    );
    // Asserted at the end: what a capture taken now would lose shows first.
    let checkpoints_while_loading = value(&mut c, "engine.checkpoints");
    drop(c);
    node.kill();

    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    let deadline = Instant::now() + Duration::from_secs(120);
    while value(&mut c, "storage.state_loading") == 1 {
        assert!(Instant::now() < deadline, "the load never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(value(&mut c, "engine.groups"), GROUPS - 1);
    for (&g, want) in &expected {
        assert_eq!(&messages(&mut c, g), want, "group {g}");
    }
    match c.pull(DELETED, member(DELETED, 0), 0, 10, 0) {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::GroupNotFound), "{e}"),
        Ok(p) => panic!("the deleted group answers: {p:?}"),
    }
    let unread = c.unread(member(WITH_MESSAGES, 0)).unwrap();
    assert!(unread.iter().any(|u| u.group == WITH_MESSAGES));
    assert_eq!(checkpoints_while_loading, 0, "no capture while loading");
}

/// Groups of the restart series, each with [`MEMBERS`] members.
const SERIES_GROUPS: u64 = 300;
const RESTARTS: u64 = 20;
/// A group outside the series whose member's cursor moves once per
/// restart, after the ACK the series checks: the cursor flush that
/// follows it holds that ACK too (its own ACKs are not checked).
const SCRATCH: u64 = SERIES_GROUPS + 1;
const SCRATCH_USER: u64 = 90_000;

/// What a group answers: its messages (read by a member that never
/// acks) and every member with its cursor.
type Answers = BTreeMap<u64, (Vec<(u64, Vec<u8>)>, BTreeMap<u64, u64>)>;

fn answers(c: &mut Client, groups: u64) -> Answers {
    (1..=groups)
        .map(|g| {
            let (members, more) = c.members(g, 0, 1000).unwrap();
            assert!(!more);
            let members = members.into_iter().map(|m| (m.user, m.cursor)).collect();
            (g, (messages(c, g), members))
        })
        .collect()
}

fn wait_loaded(c: &mut Client) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while value(c, "storage.state_loading") == 1 {
        assert!(Instant::now() < deadline, "the load never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Twenty SIGKILLs in a row, each while the node's saved state is still
/// loading (the loader held before its first batch), with sends, a join
/// and an ack between them, and checkpoints asked for every 100 ms. Each
/// open replays the journal since the last checkpoint (none may be taken
/// while loading), into the groups it names. After the last kill, the
/// node loads in the background, then again before listening: every
/// acknowledged send, join and ack is there (the ack made durable by a
/// cursor flush before the kill, storage.md crash case 8), and every
/// group answers the same both ways.
#[test]
fn twenty_kills_in_a_row_while_the_state_loads_lose_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected: Answers = BTreeMap::new();
    {
        let mut node = Node::start(dir.path(), &[]);
        let mut c = node.client();
        for g in 1..=SERIES_GROUPS {
            c.create_group(g).unwrap();
            let mut members = BTreeMap::new();
            for i in 0..MEMBERS {
                let cursor = c.join(g, member(g, i), JoinStart::Earliest).unwrap();
                members.insert(member(g, i), cursor);
            }
            expected.insert(g, (Vec::new(), members));
        }
        c.create_group(SCRATCH).unwrap();
        c.join(SCRATCH, SCRATCH_USER, JoinStart::Earliest).unwrap();
        for i in 0..=RESTARTS {
            c.send(SCRATCH, 9, i + 1, b"scratch").unwrap();
        }
        drop(c);
        assert!(node.terminate().success(), "a clean stop");
    }
    let holding = [
        "--load-batch-pause-ms",
        "600000",
        "--checkpoint-interval-ms",
        "100",
        "--cursor-flush-ms",
        "10",
    ];
    let mut captures_while_loading = 0;
    for round in 0..RESTARTS {
        let mut node = Node::start(dir.path(), &holding);
        let mut c = node.client();
        assert_eq!(value(&mut c, "storage.state_loading"), 1, "round {round}");
        let targets: Vec<u64> = (0..5)
            .map(|k| (round * 37 + k * 101) % SERIES_GROUPS + 1)
            .collect();
        for (k, &g) in targets.iter().enumerate() {
            let payload = format!("round {round} send {k}").into_bytes();
            let sent = c
                .send(g, 9, (round + 1) << 20 | k as u64, &payload)
                .unwrap();
            expected.get_mut(&g).unwrap().0.push((sent.msg_id, payload));
        }
        let joined = (round * 53) % SERIES_GROUPS + 1;
        let user = 10_000 + round;
        let cursor = c.join(joined, user, JoinStart::Earliest).unwrap();
        expected.get_mut(&joined).unwrap().1.insert(user, cursor);
        let acked = targets[0];
        let last = expected[&acked].0.last().unwrap().0;
        let cursor = c.ack(acked, member(acked, 1), last).unwrap();
        expected
            .get_mut(&acked)
            .unwrap()
            .1
            .insert(member(acked, 1), cursor);
        // An ACK moves a cursor in memory; the next cursor flush makes it
        // durable. Cursor flushes are the only journal syncs now (no
        // round, no capture while loading): one after this reading holds
        // the ACK (also if an earlier one did), and the scratch cursor
        // moved after the reading makes sure one comes.
        let syncs = value(&mut c, "engine.fsyncs");
        c.ack(SCRATCH, SCRATCH_USER, round + 1).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while value(&mut c, "engine.fsyncs") == syncs {
            assert!(Instant::now() < deadline, "round {round}: no cursor flush");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            value(&mut c, "storage.state_loading"),
            1,
            "round {round}: the kill must come while the state loads"
        );
        // Asserted at the end: what a capture taken now would lose shows
        // first.
        captures_while_loading += value(&mut c, "engine.checkpoints");
        drop(c);
        node.kill();
    }

    // A full load of a copy, then the node itself loading in the
    // background.
    let full = tempfile::tempdir().unwrap();
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(dir.path().join("."))
        .arg(full.path())
        .status()
        .unwrap();
    assert!(copied.success());
    let mut node = Node::start(full.path(), &["--load-before-listening"]);
    let mut c = node.client();
    assert_eq!(value(&mut c, "storage.state_loading"), 0);
    let after_full_load = answers(&mut c, SERIES_GROUPS);
    drop(c);
    node.kill();
    for (g, want) in &expected {
        assert_eq!(&after_full_load[g], want, "group {g}, after a full load");
    }
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    assert_eq!(
        answers(&mut c, SERIES_GROUPS),
        after_full_load,
        "while loading"
    );
    wait_loaded(&mut c);
    assert_eq!(value(&mut c, "engine.groups"), SCRATCH);
    assert_eq!(answers(&mut c, SERIES_GROUPS), after_full_load, "loaded");
    assert_eq!(captures_while_loading, 0, "no capture while loading");
}

/// The biggest run part of `data` (one the checkpoint in force names),
/// which must have more than one block: `(path, the first id of its second
/// block's first key)`.
fn part_of_two_blocks(data: &Path) -> (PathBuf, u64) {
    let mut parts: Vec<(u64, PathBuf)> = std::fs::read_dir(data.join("state"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tmr"))
        .map(|p| (std::fs::metadata(&p).unwrap().len(), p))
        .collect();
    parts.sort();
    let (_, part) = parts.pop().expect("a run part");
    let b = std::fs::read(&part).unwrap();
    let trailer = &b[b.len() - 32..];
    let index_at = u64::from_le_bytes(trailer[8..16].try_into().unwrap()) as usize;
    let blocks = u32::from_le_bytes(trailer[24..28].try_into().unwrap());
    assert!(blocks >= 2, "{} holds {blocks} block", part.display());
    // Index entry 1: offset u64 | len u32 | first key (first id u64 ...).
    let entry = &b[index_at + 29..index_at + 58];
    let second_first_id = u64::from_le_bytes(entry[12..20].try_into().unwrap());
    (part, second_first_id)
}

/// A writer's bug: the kind byte of the first item of `part`'s first block
/// (offset 64) becomes 9, no kind, and the block's CRC is made valid again.
fn damage_first_item_behind_its_crc(part: &Path) {
    let mut b = std::fs::read(part).unwrap();
    let len = u32::from_le_bytes(b[68..72].try_into().unwrap()) as usize;
    b[76] = 9;
    let crc = crc32fast::hash(&b[68..64 + len]);
    b[64..68].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(part, b).unwrap();
}

/// Expects GROUP_DAMAGED naming `part` at offset 64.
fn assert_names(r: Result<impl std::fmt::Debug, ClientError>, part: &Path, what: &str) {
    let name = part.file_name().unwrap().to_str().unwrap();
    match r {
        Err(ClientError::Server {
            code: ErrorCode::GroupDamaged,
            message,
            ..
        }) => assert!(
            message.contains(name) && message.contains("at offset 64"),
            "{what}: {message:?} does not name {name} at offset 64"
        ),
        other => panic!("{what}: expected GROUP_DAMAGED, got {other:?}"),
    }
}

/// Items of the saved state that do not decode behind a valid CRC (a
/// writer's bug), in the first block of a run part: the group whose first
/// read meets them, the groups the loader meets them in, and `ctl verify`
/// all name the same part and offset; every group outside that block is
/// served, before and after the loader stopped there.
#[test]
fn damage_behind_a_valid_crc_is_named_alike_by_a_first_read_the_loader_and_verify() {
    let dir = tempfile::tempdir().unwrap();
    const DAMAGE_GROUPS: u64 = 3000;
    {
        let mut node = Node::start(dir.path(), &[]);
        let mut c = node.client();
        create_groups(&mut c, DAMAGE_GROUPS, |g| {
            (0..MEMBERS).map(|i| member(g, i)).collect()
        });
        drop(c);
        assert!(node.terminate().success(), "a clean stop");
    }
    let (part, second_block_from) = part_of_two_blocks(dir.path());
    let served = second_block_from + 1;
    assert!(served < DAMAGE_GROUPS, "group {served} is saved");
    damage_first_item_behind_its_crc(&part);
    let members_of = |c: &mut Client, g: u64| c.members(g, 0, 1000).map(|(m, _)| m.len());

    // The loader held: the first read of group 1 meets the damage.
    let mut node = Node::start(dir.path(), &["--load-batch-pause-ms", "600000"]);
    let mut c = node.client();
    assert_names(c.pull(1, member(1, 0), 0, 100, 0), &part, "group 1");
    assert_eq!(members_of(&mut c, served).unwrap(), MEMBERS as usize);
    assert_eq!(members_of(&mut c, DAMAGE_GROUPS).unwrap(), MEMBERS as usize);
    drop(c);
    node.kill();

    // The loader meets it first: writes stop, the same part and offset.
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match c.send(served, 9, 1, b"x") {
            Err(ClientError::Server {
                code: ErrorCode::WritesStopped,
                ..
            }) => break,
            // Accepted before the loader met the damage (then deduplicated).
            Ok(_) => {}
            other => panic!("send: {other:?}"),
        }
        assert!(Instant::now() < deadline, "the load never stopped");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_names(c.members(2, 0, 1000), &part, "group 2 after the loader");
    assert_eq!(members_of(&mut c, served + 1).unwrap(), MEMBERS as usize);
    drop(c);
    drop(node);

    let verify = std::process::Command::new(crate::harness::tidemark_bin())
        .args(["ctl", "verify", "--data"])
        .arg(dir.path())
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&verify.stdout);
    assert_eq!(verify.status.code(), Some(1), "{out}");
    assert!(
        out.lines().any(
            |l| l.starts_with("DAMAGE") && l.contains(&format!("{} offset 64", part.display()))
        ),
        "{out}"
    );
}

/// While the saved state loads (the loader held before each batch), with
/// one user at `groups_per_user_max` in the saved state (so the manifest's
/// bound decides no join): a JOIN of a user two groups below the limit is
/// answered, the join past the limit is refused as after the load, and
/// UNREAD lists the user's groups as after the load. The node reads the
/// user's saved groups from its user index in the background (the
/// requests are held meanwhile); the same answers come after the whole
/// load.
#[test]
fn a_join_near_the_per_user_limit_is_decided_while_the_state_loads() {
    const LIMIT: u64 = 40;
    const GROUPS_N: u64 = 600;
    const HEAVY: u64 = 7;
    const NEAR: u64 = 8;
    let limit = LIMIT.to_string();
    let dir = tempfile::tempdir().unwrap();
    {
        let mut node = Node::start(dir.path(), &["--groups-per-user-max", &limit]);
        let mut c = node.client();
        create_groups(&mut c, GROUPS_N, |g| {
            let mut users = vec![member(g, 0)];
            if g <= LIMIT {
                users.push(HEAVY);
            } else if g <= 2 * LIMIT - 2 {
                users.push(NEAR);
            }
            users
        });
        drop(c);
        assert!(node.terminate().success(), "a clean stop");
    }
    let refused = |r: Result<u64, tidemark_client::ClientError>| match r {
        Err(e) => e.code() == Some(ErrorCode::LimitExceeded),
        Ok(_) => false,
    };
    let groups_of = |c: &mut Client, user: u64| -> Vec<u64> {
        c.unread(user).unwrap().iter().map(|u| u.group).collect()
    };
    let mut expected: Vec<u64> = (LIMIT + 1..=2 * LIMIT - 2).collect();
    expected.extend([500, 501]);

    let mut node = Node::start(
        dir.path(),
        &[
            "--groups-per-user-max",
            &limit,
            "--load-batch-pause-ms",
            "600000",
        ],
    );
    let mut c = node.client();
    assert_eq!(value(&mut c, "storage.state_loading"), 1);
    c.join(500, NEAR, JoinStart::Head).unwrap();
    c.join(501, NEAR, JoinStart::Head).unwrap();
    assert!(
        refused(c.join(502, NEAR, JoinStart::Head)),
        "past the limit"
    );
    assert!(refused(c.join(502, HEAVY, JoinStart::Head)), "at the limit");
    assert_eq!(groups_of(&mut c, NEAR), expected);
    assert_eq!(
        value(&mut c, "storage.state_loading"),
        1,
        "answered while the state loads"
    );
    drop(c);
    node.kill();

    let node = Node::start(dir.path(), &["--groups-per-user-max", &limit]);
    let mut c = node.client();
    wait_loaded(&mut c);
    assert_eq!(groups_of(&mut c, NEAR), expected);
    assert!(refused(c.join(502, NEAR, JoinStart::Head)));
    assert_eq!(groups_of(&mut c, HEAVY), (1..=LIMIT).collect::<Vec<_>>());
}

/// The requests whose group was still looked up on the event loop while
/// the state loaded (format-spec/storage.md section 11, "Where each path
/// makes its lookups"), each the first of its group, sent while the
/// loader is held: BATCH_ACK (one wait for all its groups, every item's
/// outcome kept, and a request pipelined behind it sees its ACKs),
/// DELETE_GROUP, SET_RETENTION, CLEAR_HISTORY, CREATE_GROUP, READ_COUNT,
/// GROUP_INFO, MEMBERS, READERS, SUBSCRIBE, SUBSCRIBE_RECEIPTS and a JOIN
/// at a cursor. Each answers as the node answered before its restart
/// (GROUP_NOT_FOUND for a group that does not exist), and STATS
/// `storage.state_loading` is still 1 after them.
#[test]
fn every_request_that_names_a_group_is_answered_while_the_state_loads() {
    use tidemark_protocol::{Response, RetentionPolicy, Subscription};
    const GROUPS_N: u64 = 600;
    let missing = GROUPS_N + 100;
    let dir = tempfile::tempdir().unwrap();
    let member_of = |g: u64| member(g, 0);
    let expected = {
        let mut node = Node::start(dir.path(), &[]);
        let mut c = node.client();
        create_groups(&mut c, GROUPS_N, |g| vec![member(g, 0), member(g, 1)]);
        let with_one: Vec<u64> = (1..=GROUPS_N).filter(|g| g % 10 == 1).collect();
        send_each(&mut c, &with_one, "before", 0);
        c.ack(111, member(111, 1), 1).unwrap();
        let expected = (
            c.group_info(101).unwrap(),
            c.read_count(111, 1).unwrap(),
            c.members(121, 0, 100).unwrap(),
        );
        drop(c);
        assert!(node.terminate().success(), "a clean stop");
        expected
    };
    assert_eq!(expected.1, 1, "one member read group 111's message");

    let node = Node::start(dir.path(), &["--load-batch-pause-ms", "600000"]);
    let mut c = node.client();
    assert_eq!(value(&mut c, "storage.state_loading"), 1);
    let code = |r: Result<(), ClientError>| r.err().and_then(|e| e.code());

    assert_eq!(c.group_info(101).unwrap(), expected.0);
    assert_eq!(c.read_count(111, 1).unwrap(), expected.1);
    let members = c.members(121, 0, 100).unwrap();
    assert_eq!(
        members
            .0
            .iter()
            .map(|m| (m.user, m.cursor))
            .collect::<Vec<_>>(),
        expected
            .2
             .0
            .iter()
            .map(|m| (m.user, m.cursor))
            .collect::<Vec<_>>()
    );
    let (readers, _) = c.readers(111, 1, 0, 100).unwrap();
    assert_eq!(
        readers.iter().map(|m| m.user).collect::<Vec<_>>(),
        vec![member(111, 1)]
    );

    // BATCH_ACK of two groups not registered, one that does not exist,
    // and an id above a head; the MEMBERS pipelined behind it sees its
    // ACK.
    let user = member_of(131);
    let items = [
        tidemark_protocol::AckItem {
            group: 131,
            msg_id: 1,
        },
        tidemark_protocol::AckItem {
            group: missing,
            msg_id: 1,
        },
        tidemark_protocol::AckItem {
            group: 131,
            msg_id: 9,
        },
    ];
    let batch = c
        .submit(&Request::BatchAck {
            user,
            items: items.to_vec(),
        })
        .unwrap();
    let after = c
        .submit(&Request::Members {
            group: 131,
            after_user: 0,
            max_count: 10,
        })
        .unwrap();
    let f = c.wait(batch, Duration::from_secs(60)).unwrap();
    match f.response().unwrap() {
        Response::BatchAck(results) => {
            let got: Vec<_> = results.iter().map(|r| (r.error, r.cursor)).collect();
            assert_eq!(
                got,
                vec![
                    (None, 1),
                    (Some(ErrorCode::GroupNotFound), 0),
                    (Some(ErrorCode::CursorAboveHead), 1),
                ]
            );
        }
        other => panic!("BATCH_ACK: {other:?}"),
    }
    let f = c.wait(after, Duration::from_secs(60)).unwrap();
    match f.response().unwrap() {
        Response::Members { members, .. } => {
            assert!(members.iter().any(|m| m.user == user && m.cursor == 1));
        }
        other => panic!("MEMBERS: {other:?}"),
    }

    // Subscriptions: their groups must exist.
    let subscribe = |c: &mut Client, groups: Vec<u64>| c.subscribe(Subscription::Groups(groups));
    assert_eq!(
        code(subscribe(&mut c, vec![141, missing])),
        Some(ErrorCode::GroupNotFound)
    );
    subscribe(&mut c, vec![141, 151]).unwrap();
    assert_eq!(
        code(c.subscribe_receipts(9, &[152, missing + 1])),
        Some(ErrorCode::GroupNotFound)
    );
    c.subscribe_receipts(9, &[152]).unwrap();

    // A JOIN at a cursor checks it against the head first.
    assert_eq!(c.join(161, 5, JoinStart::At(1)).unwrap(), 1);
    assert_eq!(
        code(c.join(171, 5, JoinStart::At(2)).map(drop)),
        Some(ErrorCode::CursorAboveHead)
    );

    // CLEAR_HISTORY, SET_RETENTION, DELETE_GROUP, CREATE_GROUP.
    assert_eq!(c.clear_history(181, member_of(181), 1).unwrap(), (2, 1));
    let policy = RetentionPolicy {
        by_cursor: true,
        max_age_ms: 0,
        max_bytes: 1 << 20,
    };
    c.set_retention(191, policy).unwrap();
    assert_eq!(c.group_info(191).unwrap().retention, policy);
    c.delete_group(201).unwrap();
    assert_eq!(
        code(c.group_info(201).map(drop)),
        Some(ErrorCode::GroupNotFound)
    );
    assert_eq!(
        code(c.delete_group(missing + 2)),
        Some(ErrorCode::GroupNotFound)
    );
    assert_eq!(code(c.create_group(211)), Some(ErrorCode::GroupExists));
    c.create_group(missing + 3).unwrap();
    assert_eq!(c.group_info(missing + 3).unwrap().head, 0);
    assert_eq!(
        value(&mut c, "storage.state_loading"),
        1,
        "answered while the state loads"
    );
}
