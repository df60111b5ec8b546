//! A big group's segment files that lead the journal after a power cut
//! (fsync `never`: the segment's pages reached the disk, the journal's
//! entries for them did not; format-spec/storage.md section 11, step 6).
//! The group adopts the records, so no id is given again, and the edits
//! and recalls among them are taken in as replay takes in those of the
//! journal (`commit/change_intake.rs`): a recalled message is never
//! served and its payload is erased, an edited one is served edited, and
//! neither counts as unread.

use std::path::Path;
use std::sync::Arc;

use crate::erasure_tests::{files_holding, marker, shown};
use crate::io::power_cut::{Cut, PowerCutVfs};
use crate::logs::group_log::group_dir;
use crate::logs::record::KIND_MESSAGE;
use crate::tests::small_config;
use crate::{Change, ChangeRequest, Config, Engine, FsyncPolicy, JoinStart};

/// Groups segmented from their first record, fsync `never`, records
/// written to their segment every round, checkpoints only on request.
fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    c.small_group_bytes_max = 0;
    c.fsync = FsyncPolicy::Never;
    c.segment_tail_bytes = 0;
    c.checkpoint_journal_bytes = 1 << 30;
    c.cursor_flush_ms = 3_600_000;
    c.retention_check_ms = 3_600_000;
    c
}

fn change(e: &Engine, target: u64, cmid: u64, change: Change<'_>) -> u64 {
    e.change(&ChangeRequest {
        group_id: 1,
        sender_id: 10,
        client_msg_id: cmid,
        target,
        change,
        admin: false,
    })
    .unwrap()
    .msg_id
}

/// Group 1 (member 20) gets messages 1..=3 and a checkpoint records them;
/// then message 4 (`secret`), an Edit of message 2 (id 5) and a Recall of
/// message 4 (id 6). The kernel writes the group's segment files back on
/// its own (and, with `journal_keeps_send`, the journal up to message 4);
/// then the power goes and everything else not synced is lost.
fn lose_the_journal_tail(root: &Path, c: &Config, secret: &[u8], journal_keeps_send: bool) {
    let vfs = PowerCutVfs::new(root);
    let control = vfs.control.clone();
    let e = Engine::open_with_vfs(c.clone(), Arc::new(vfs)).unwrap();
    e.create_group(1).unwrap();
    e.create_group(2).unwrap();
    e.join(1, 20, JoinStart::Earliest).unwrap();
    for (i, p) in [&b"one"[..], b"two", b"three"].into_iter().enumerate() {
        assert_eq!(
            e.append(1, 10, i as u64 + 1, p).unwrap().msg_id,
            i as u64 + 1
        );
    }
    e.checkpoint().unwrap();
    assert_eq!(e.append(1, 10, 4, secret).unwrap().msg_id, 4);
    if journal_keeps_send {
        let journal = crate::commit::journal::journal_dir(&c.data_dir);
        for f in std::fs::read_dir(journal).unwrap() {
            control.write_back(&f.unwrap().path()).unwrap();
        }
    }
    assert_eq!(change(&e, 2, 5, Change::Edit(b"two, edited")), 5);
    assert_eq!(change(&e, 4, 6, Change::Recall), 6);
    for f in std::fs::read_dir(group_dir(&c.data_dir, 1)).unwrap() {
        control.write_back(&f.unwrap().path()).unwrap();
    }
    control.freeze();
    e.simulate_crash();
    control.cut(Cut::DropUnsynced).unwrap();
}

fn unread_of_20(e: &Engine) -> u64 {
    e.unread(20)
        .into_iter()
        .find(|u| u.group_id == 1)
        .expect("a member")
        .unread
}

/// Message 2 as HISTORY_LATEST shows it: flags and payload (read from
/// the shown bytes: a shown flag is no stored record's).
fn latest_of_2(e: &Engine) -> (u8, Vec<u8>) {
    use crate::logs::record::{peek_len, peek_msg_id};
    let page = e.history_latest(1, 20, None, 10, usize::MAX).unwrap();
    for c in &page.history.batch.chunks {
        let mut b = c.bytes();
        while let Some(len) = peek_len(b) {
            let r = &b[..len];
            if peek_msg_id(r) == 2 {
                return (r[41], r[44..].to_vec());
            }
            b = &b[len..];
        }
    }
    panic!("message 2 not shown");
}

#[test]
fn edits_and_recalls_in_segment_records_past_the_journals_end_are_taken_in() {
    for journal_keeps_send in [false, true] {
        for background in [false, true] {
            let case =
                format!("journal keeps the send {journal_keeps_send}, background {background}");
            let root = tempfile::tempdir().unwrap();
            let mut c = config(&root.path().join("data"));
            c.load_in_background = background;
            let secret = marker();
            lose_the_journal_tail(root.path(), &c, &secret, journal_keeps_send);
            let e = Engine::open(c.clone()).unwrap();
            assert_eq!(
                e.head(1).unwrap(),
                6,
                "{case}: the segment's records adopted"
            );
            let recs = shown(&e, 1);
            assert_eq!(recs.len(), 6, "{case}");
            assert_eq!(
                recs[3],
                (4, KIND_MESSAGE, crate::FLAG_RECALLED, Vec::new()),
                "{case}: the recalled message is never served"
            );
            assert_eq!(
                latest_of_2(&e),
                (crate::FLAG_EDITED, b"two, edited".to_vec()),
                "{case}: the edit is served"
            );
            assert_eq!(unread_of_20(&e), 3, "{case}: messages 1..=3 unread");
            assert_eq!(
                e.append(1, 10, 7, b"after").unwrap().msg_id,
                7,
                "{case}: no id given again"
            );
            // The erase list names message 4: the stored checkpoint's pass
            // rewrites the segment holding it, and the journal's copies go
            // within the journal bound.
            e.checkpoint().unwrap();
            e.wait_worker_idle();
            e.checkpoint().unwrap();
            let seg_dir = group_dir(&c.data_dir, 1);
            assert_eq!(
                files_holding(&seg_dir, &secret),
                Vec::<std::path::PathBuf>::new(),
                "{case}"
            );
            for i in 0..5 {
                e.append(2, 1, 100 + i, b"x").unwrap();
                e.checkpoint().unwrap();
            }
            assert_eq!(
                files_holding(&c.data_dir, &secret),
                Vec::<std::path::PathBuf>::new(),
                "{case}"
            );
            let model = (shown(&e, 1), unread_of_20(&e), latest_of_2(&e));
            e.close().unwrap();
            // What the checkpoint recorded (quiet ids, latest edits) holds
            // after a reopen.
            let e = Engine::open(c.clone()).unwrap();
            assert_eq!(
                (shown(&e, 1), unread_of_20(&e), latest_of_2(&e)),
                model,
                "{case}"
            );
            e.close().unwrap();
        }
    }
}
