//! Tests of the durable membership (`members.rs`, `raft_log.rs`;
//! cluster.md section 11): the bytes of a bootstrapped log and of a
//! ConfChange entry and Members record (the spec's vectors), reopen, a
//! rewrite keeping the membership, a snapshot's membership, damage.

use raft::eraftpb::{ConfChange, ConfChangeType, Entry, EntryType, HardState};
use raft::Storage;

use crate::members::{self, Member, Members, Role};
use crate::raft_log::{RaftLog, FILE_NAME};
use crate::ClusterError;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn node1() -> Member {
    Member {
        id: 1,
        role: Role::Voter,
        cluster_addr: "10.0.0.1:7101".into(),
        client_addr: "10.0.0.1:7001".into(),
    }
}

/// The ConfChange adding node 4 as a learner, and its entry at 2, term 2.
fn add_learner_4() -> (ConfChange, Entry) {
    let mut cc = ConfChange {
        node_id: 4,
        context: members::encode_context("10.0.0.4:7104", "10.0.0.4:7004")
            .unwrap()
            .into(),
        ..Default::default()
    };
    cc.set_change_type(ConfChangeType::AddLearnerNode);
    let mut e = Entry {
        index: 2,
        term: 2,
        data: protobuf::Message::write_to_bytes(&cc).unwrap().into(),
        ..Default::default()
    };
    e.set_entry_type(EntryType::EntryConfChange);
    (cc, e)
}

/// Written with the file key `0x04030201` (a real file's is random).
const BOOTSTRAPPED: &str = concat!(
    "544d524146544c000300000001020304", // header, version 3, key
    "e2000000000000000000000068db97f6", //   durable_len 226, reserved, header_crc
    "b687bf6d300000000300000000000000", // Start, 48 bytes
    "20000000000000005ada798e00000000", //   synced_len 32, body_crc
    "01000000000000000100000000000000", //   index 1, term 1
    "4d67280c5a0000000400000000000000", // Members, 90 bytes
    "200000000000000004e7a4cc00000000", //   synced_len 32, body_crc
    "01000000000000000100000000000000", //   index 1, 1 member
    "010000000000000001000d000d000000", //   node 1, voter, 13 + 13 bytes
    "31302e302e302e313a37313031",       //   "10.0.0.1:7101"
    "31302e302e302e313a37303031",       //   "10.0.0.1:7001"
    "79f5012b380000000200000000000000", // HardState, 56 bytes
    "200000000000000099af4eee00000000", //   synced_len 32, body_crc
    "01000000000000000000000000000000", //   term 1, vote 0,
    "0100000000000000",                 //   commit 1
);

const CHANGE: &str = concat!(
    "e4bb772d5c0000000100000000000000", // Entry, 92 bytes
    "e20000000000000099af301800000000", //   synced_len 226, body_crc
    "02000000000000000200000000000000", //   index 2, term 2
    "0100000000000000",                 //   ConfChange
    "10021804221e",                     //   change_type 2 (learner), node_id 4, context:
    "0d000d00",                         //     13 + 13 bytes
    "31302e302e302e343a37313034",       //     "10.0.0.4:7104"
    "31302e302e302e343a37303034",       //     "10.0.0.4:7004"
    "a6f3872e840000000400000000000000", // Members, 132 bytes
    "3e01000000000000cd38b6ca00000000", //   synced_len 318, body_crc
    "02000000000000000200000000000000", //   index 2, 2 members
    "010000000000000001000d000d000000", //   node 1, voter
    "31302e302e302e313a37313031",
    "31302e302e302e313a37303031",
    "040000000000000002000d000d000000", //   node 4, learner
    "31302e302e302e343a37313034",
    "31302e302e302e343a37303034",
);

#[test]
fn a_bootstrapped_log_and_an_applied_change_are_the_spec_vectors_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut log = RaftLog::open(dir.path(), &[]).unwrap();
    assert!(!log.members_recorded());
    crate::raft_log::TEST_MARK_KEY.with(|k| k.set(Some(0x0403_0201)));
    log.bootstrap(&[node1()]).unwrap();
    crate::raft_log::TEST_MARK_KEY.with(|k| k.set(None));
    let boot = std::fs::read(&path).unwrap();
    assert_eq!(hex(&boot), BOOTSTRAPPED);
    assert_eq!(log.start(), (1, 1));
    assert_eq!(log.first_index().unwrap(), 2);
    // A bootstrap only of an empty log.
    assert!(log.bootstrap(&[node1()]).is_err());

    let (cc, e) = add_learner_4();
    log.persist(std::slice::from_ref(&e), None).unwrap();
    let next = log.members().apply(2, &cc).unwrap();
    assert_eq!(next.conf_state().voters, vec![1]);
    assert_eq!(next.conf_state().learners, vec![4]);
    log.set_members(next.clone()).unwrap();
    let all = std::fs::read(&path).unwrap();
    assert_eq!(hex(&all[boot.len()..]), CHANGE);
    drop(log);

    let log = RaftLog::open(dir.path(), &[7, 8, 9]).unwrap();
    assert!(log.members_recorded());
    assert_eq!(log.members(), &next, "the durable membership wins");
    assert_eq!(log.initial_state().unwrap().conf_state.learners, vec![4]);
    assert_eq!(
        log.entry(2).unwrap().get_entry_type(),
        EntryType::EntryConfChange
    );
    assert_eq!(log.entry(2).unwrap().data, e.data);
}

#[test]
fn a_rewrite_and_a_snapshot_reset_keep_the_membership() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = RaftLog::open(dir.path(), &[]).unwrap();
    log.bootstrap(&[node1()]).unwrap();
    let (cc, e) = add_learner_4();
    let hs = HardState {
        term: 2,
        vote: 1,
        commit: 2,
        ..Default::default()
    };
    log.persist(std::slice::from_ref(&e), Some(&hs)).unwrap();
    let next = log.members().apply(2, &cc).unwrap();
    log.set_members(next.clone()).unwrap();
    log.compact(2).unwrap();
    drop(log);
    let mut log = RaftLog::open(dir.path(), &[]).unwrap();
    assert_eq!(log.members(), &next);
    assert_eq!(log.start(), (2, 2));

    // A snapshot's membership replaces the log's.
    let snap = Members::voters(9, &[1, 4]);
    let hs = HardState {
        term: 3,
        vote: 0,
        commit: 9,
        ..Default::default()
    };
    log.reset_to_snapshot(9, 3, &hs, Some(snap.clone()))
        .unwrap();
    drop(log);
    assert_eq!(RaftLog::open(dir.path(), &[]).unwrap().members(), &snap);
}

#[test]
fn a_snapshot_descriptor_carries_the_membership() {
    let m = Members {
        index: 5,
        list: vec![node1()],
    };
    let d = crate::snapshot::descriptor_with_members(7, &m);
    assert_eq!(
        hex(&d),
        concat!(
            "02000000000000000700000000000000",
            "05000000000000000100000000000000",
            "010000000000000001000d000d000000",
            "31302e302e302e313a37313031",
            "31302e302e302e313a37303031",
        )
    );
    assert_eq!(crate::snapshot::descriptor_last_round(&d), Ok(7));
    assert_eq!(crate::snapshot::descriptor_members(&d), Ok(Some(m)));
    let v1 = crate::snapshot::descriptor(7);
    assert_eq!(crate::snapshot::descriptor_members(&v1), Ok(None));
}

#[test]
fn damaged_members_records_and_contexts_are_refused() {
    let mut body = Vec::new();
    members::encode_body(
        &mut body,
        &Members {
            index: 1,
            list: vec![node1()],
        },
    );
    assert!(members::decode_body(&body).is_ok());
    let mut bad_role = body.clone();
    bad_role[24] = 3;
    assert!(members::decode_body(&bad_role).is_err());
    let mut short = body.clone();
    short.pop();
    assert!(members::decode_body(&short).is_err());
    let mut reserved = body.clone();
    reserved[12] = 1;
    assert!(members::decode_body(&reserved).is_err());
    assert!(members::decode_context(&[1, 0, 0]).is_err());
    assert!(members::decode_context(&[1, 0, 0, 0]).is_err());
    assert!(members::encode_context(&"x".repeat(256), "").is_err());

    // In a log: a damaged Members record (valid checksums, a role of 9)
    // refuses the open.
    let dir = tempfile::tempdir().unwrap();
    let mut log = RaftLog::open(dir.path(), &[]).unwrap();
    log.bootstrap(&[node1()]).unwrap();
    let mut body = Vec::new();
    members::encode_body(&mut body, log.members());
    drop(log);
    // The member's role (body 16, then the member's id).
    body[16 + 8] = 9;
    let mut bytes = crate::raft_log_format::encode_whole(7, (1, 1), None, &[], &Default::default());
    let synced = bytes.len() as u64;
    crate::raft_log_format::encode_record_v3(
        &mut bytes,
        7,
        synced,
        crate::raft_log_format::KIND_MEMBERS,
        |b| b.extend_from_slice(&body),
    );
    std::fs::write(dir.path().join(FILE_NAME), &bytes).unwrap();
    assert!(matches!(
        RaftLog::open(dir.path(), &[]),
        Err(ClusterError::RaftLogDamaged { .. })
    ));
}
