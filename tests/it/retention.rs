//! Retention you can set and a member's history clear through the real binary: SET_RETENTION (and `tidemark
//! retention`) raises GROUP_INFO's floor and gives disk space back; the
//! node's default policy (`serve --retention-*`) is stored with the groups
//! created under it; CLEAR_HISTORY (and `tidemark clear-history`) hides a
//! member's history from it alone with its unread count exact; all of it
//! across a SIGKILL and a graceful restart (format-spec/protocol.md 4.26,
//! 4.27; storage.md section 9 "Retention", section 15.2).

use std::path::Path;
use std::time::{Duration, Instant};

use tidemark_client::protocol::{ErrorCode, JoinStart, RetentionPolicy};
use tidemark_client::Client;

use crate::cli::{json, ok};
use crate::harness::Node;

/// Bytes the files under `dir` take on disk (allocated blocks).
fn disk_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += disk_bytes(&entry.path());
        } else {
            total += meta.blocks() * 512;
        }
    }
    total
}

/// Polls `f` every 50 ms until it returns `Some`, for at most 60 s.
fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What member `user` of `group` sees: (history ids oldest first, pull
/// ids, unread count). The pull acknowledges nothing.
fn view(c: &mut Client, group: u64, user: u64) -> (Vec<u64>, Vec<u64>, u64) {
    let (hist, _) = c.history(group, user, 0, 1000).unwrap();
    let mut hist: Vec<u64> = hist.iter().map(|m| m.msg_id).collect();
    hist.reverse();
    let page = c.pull(group, user, 0, 1000, 0).unwrap();
    let pulled = page.messages.iter().map(|m| m.msg_id).collect();
    let unread = c
        .unread(user)
        .unwrap()
        .into_iter()
        .find(|g| g.group == group)
        .map_or(u64::MAX, |g| g.unread);
    (hist, pulled, unread)
}

fn range(a: u64, b: u64) -> Vec<u64> {
    (a..=b).collect()
}

const FAST: [&str; 8] = [
    "--payload-bytes-max",
    "8192",
    "--retention-check-ms",
    "100",
    "--checkpoint-interval-ms",
    "200",
    "--segment-bytes-max",
    "131072",
];

/// A 4 MiB group under a 256 KiB size policy: GROUP_INFO's floor rises,
/// the segment files go, the data directory shrinks by about what was
/// dropped, and the floor and policy survive a SIGKILL.
#[test]
fn a_size_policy_raises_the_floor_and_gives_the_disk_back() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &FAST);
    let a = node.addr.clone();
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 5, JoinStart::Earliest).unwrap();
    let payload = vec![b'x'; 4096];
    for i in 1..=1024u64 {
        c.send(1, 9, i, &payload).unwrap();
    }
    let info = c.group_info(1).unwrap();
    assert_eq!((info.head, info.floor), (1024, 1));
    assert_eq!(info.retention, RetentionPolicy::default());
    // Let the checkpoints that follow the sends settle, then measure.
    std::thread::sleep(Duration::from_millis(1000));
    let before = disk_bytes(dir.path());
    let groups_before = disk_bytes(&dir.path().join("groups"));
    assert!(
        groups_before > 4 << 20,
        "segments hold the 4 MiB: {groups_before}"
    );

    let set = json(&[
        "retention",
        "--addr",
        &a,
        "--group",
        "1",
        "--max-bytes",
        "256KiB",
    ]);
    assert_eq!(set.get("retention").u("max_bytes"), 256 << 10);
    let info = c.group_info(1).unwrap();
    assert_eq!(
        info.retention,
        RetentionPolicy {
            by_cursor: false,
            max_age_ms: 0,
            max_bytes: 256 << 10,
        }
    );
    let floor = wait_for("the floor to rise", || {
        let f = c.group_info(1).unwrap().floor;
        (f > 1).then_some(f)
    });
    // Whole segments of 128 KiB: at most the policy plus one segment stays.
    let stored = 1025 - floor;
    assert!(
        stored * 4136 <= (256 << 10) + (128 << 10) + 8192,
        "{stored} messages stored"
    );
    let groups_after = wait_for("the segment files to go", || {
        let now = disk_bytes(&dir.path().join("groups"));
        (now < 1 << 20).then_some(now)
    });
    let after = disk_bytes(dir.path());
    eprintln!(
        "retention: data directory {before} -> {after} bytes, groups/ {groups_before} -> {groups_after} bytes, floor {floor}"
    );
    assert!(
        after + (3 << 20) < before,
        "the directory gave back the dropped segments: {before} -> {after}"
    );
    // The member below the floor is told so, and can go on.
    let refused = c.pull(1, 5, 0, 10, 0).map(|_| ()).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::BelowRetentionFloor));
    let page = c.pull(1, 5, floor - 1, 10, 0).unwrap();
    assert_eq!(page.messages[0].msg_id, floor);

    // SIGKILL: the policy and the floor come back.
    let node = node.restart_after_kill();
    let mut c = node.client();
    let info = c.group_info(1).unwrap();
    assert_eq!((info.retention.max_bytes, info.head), (256 << 10, 1024));
    assert!(info.floor >= floor, "{} < {floor}", info.floor);
}

/// The node's default policy is stored with the groups created under it:
/// GROUP_INFO shows it, a restart without the flag keeps it for them, and
/// groups created before it or after it was removed keep everything.
#[test]
fn the_default_policy_belongs_to_the_groups_created_under_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(dir.path(), &[]);
    node.client().create_group(1).unwrap();
    drop(node);
    let node = Node::start(
        dir.path(),
        &[
            "--retention-by-cursor",
            "--retention-max-age-ms",
            "604800000",
        ],
    );
    let mut c = node.client();
    c.create_group(2).unwrap();
    let policy = RetentionPolicy {
        by_cursor: true,
        max_age_ms: 604_800_000,
        max_bytes: 0,
    };
    assert_eq!(
        c.group_info(1).unwrap().retention,
        RetentionPolicy::default()
    );
    assert_eq!(c.group_info(2).unwrap().retention, policy);
    let mut node = node;
    node.kill();
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    c.create_group(3).unwrap();
    assert_eq!(
        c.group_info(1).unwrap().retention,
        RetentionPolicy::default()
    );
    assert_eq!(c.group_info(2).unwrap().retention, policy);
    assert_eq!(
        c.group_info(3).unwrap().retention,
        RetentionPolicy::default()
    );
    let text = ok(&["group-info", "--addr", &node.addr, "--group", "2"]);
    assert!(
        text.contains(
            "retention: drops messages every member acknowledged, older than 604800000 ms"
        ),
        "{text}"
    );
}

/// A member clears its history: its history, pull and sync start after
/// what it cleared and its unread count is what it can still read, while
/// another member reads everything; both survive a SIGKILL (replay) and a
/// graceful restart (checkpoint).
#[test]
fn a_history_clear_is_one_members_and_survives_restarts() {
    let dir = tempfile::tempdir().unwrap();
    // Long checkpoint interval: the SIGKILL's restart replays the clear.
    let node = Node::start(dir.path(), &["--checkpoint-interval-ms", "3600000"]);
    let a = node.addr.clone();
    let mut c = node.client();
    c.create_group(1).unwrap();
    c.join(1, 1, JoinStart::Earliest).unwrap();
    c.join(1, 2, JoinStart::Earliest).unwrap();
    for i in 1..=10u64 {
        c.send(1, 9, i, format!("m{i}").as_bytes()).unwrap();
    }
    c.ack(1, 1, 2).unwrap();
    let cleared = json(&[
        "clear-history",
        "--addr",
        &a,
        "--group",
        "1",
        "--user",
        "1",
        "--up-to",
        "6",
    ]);
    assert_eq!((cleared.u("join_point"), cleared.u("cursor")), (7, 6));
    let expect_1 = (range(7, 10), range(7, 10), 4);
    let expect_2 = (range(1, 10), range(1, 10), 10);
    assert_eq!(view(&mut c, 1, 1), expect_1);
    assert_eq!(view(&mut c, 1, 2), expect_2);
    let (groups, _) = c.sync(1, 100, 1 << 20, 0).unwrap();
    let first: Vec<u64> = groups[0].messages.iter().map(|m| m.msg_id).collect();
    assert_eq!((groups[0].unread, first), (4, range(7, 10)));
    // A clear never lowers anything.
    assert_eq!(c.clear_history(1, 1, 3).unwrap(), (7, 6));
    // Only members clear.
    let refused = c.clear_history(1, 3, 3).map(|_| ()).unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::NotMember));

    let node = node.restart_after_kill();
    let mut c = node.client();
    assert_eq!(view(&mut c, 1, 1), expect_1);
    assert_eq!(view(&mut c, 1, 2), expect_2);

    // Everything (no --up-to), then a graceful restart.
    let text = ok(&[
        "clear-history",
        "--addr",
        &node.addr,
        "--group",
        "1",
        "--user",
        "1",
    ]);
    assert_eq!(text, "user 1 of group 1: history starts at 11, cursor 10\n");
    let mut node = node;
    assert!(node.terminate().success());
    let node = Node::start(dir.path(), &[]);
    let mut c = node.client();
    assert_eq!(view(&mut c, 1, 1), (vec![], vec![], 0));
    assert_eq!(view(&mut c, 1, 2), expect_2);
    c.send(1, 9, 11, b"m11").unwrap();
    assert_eq!(view(&mut c, 1, 1), (range(11, 11), range(11, 11), 1));
}
