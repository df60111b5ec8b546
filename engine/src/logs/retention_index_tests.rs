//! Retention planning visits only the groups with a retention policy: the
//! registry's index of them (`catalog.rs`) is kept by set, reset, delete
//! and checkpoint restore, so the checkpointer's periodic walk costs
//! O(groups with a policy), not O(groups).

use crate::{Config, Engine, FsyncPolicy, Retention};

fn planned(e: &Engine) -> u64 {
    e.stats().retention_groups_planned
}

#[test]
fn retention_planning_visits_only_the_groups_with_a_policy() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Config::new(dir.path());
    c.fsync = FsyncPolicy::Never;
    // Retention runs only when a checkpoint is asked for.
    c.retention_check_ms = 1 << 40;
    c.checkpoint_journal_bytes = 1 << 30;
    let e = Engine::open(c.clone()).unwrap();
    let tickets: Vec<_> = (1..=10_000u64)
        .map(|g| e.submit_create_group(g).unwrap())
        .collect();
    for t in tickets {
        e.wait_op(t).unwrap();
    }
    let policy = Retention {
        by_cursor: true,
        ..Retention::default()
    };
    for g in [10, 20, 30, 40] {
        e.set_retention(g, policy).unwrap();
    }
    // Reset to keep-everything, and deleted: both leave the index.
    e.set_retention(40, Retention::default()).unwrap();
    e.delete_group(30).unwrap();
    e.set_retention(50, policy).unwrap();
    let before = planned(&e);
    e.checkpoint().unwrap();
    assert_eq!(planned(&e) - before, 3, "groups 10, 20 and 50 only");
    // A new group in the deleted group's slot does not inherit its place.
    e.create_group(30).unwrap();
    let before = planned(&e);
    e.checkpoint().unwrap();
    assert_eq!(planned(&e) - before, 3);
    e.close().unwrap();

    // Restored from the checkpoint: the same three.
    let e = Engine::open(c).unwrap();
    assert!(e.recovery_report().checkpoint_used);
    let before = planned(&e);
    e.checkpoint().unwrap();
    assert_eq!(planned(&e) - before, 3);
    e.close().unwrap();
}
