//! Model-based test: random operation sequences, chosen and shrunk by
//! proptest, run against the engine and a small in-memory oracle; every
//! answer must agree. The oracle and the checks are the `engine_ops` fuzz
//! target's ([`crate::fuzz_targets::run_ops`]), so the two never drift
//! apart: groups, memberships, ACK, pull with `ack_up_to`, unread, sync,
//! history, read counts, history clears (a member's join point and cursor
//! raised, unread exact), edits and recalls (the rules, retransmits, unread
//! exact: neither counts, a recalled message stops counting), history in its latest state, retention
//! below every cursor and by bytes (the floor, and unread exact across it), cursor flushes, checkpoints, clean reopen, crash
//! and a power cut at an operation of a checkpoint (after which a cursor
//! may lie anywhere between its last persisted and its last ACKed value,
//! the documented allowance).

use proptest::prelude::*;

use crate::fuzz_targets::{run_ops, Op};
use crate::JoinStart;

fn op() -> impl Strategy<Value = Op> {
    let g = 1..4u64;
    let u = 1..5u64;
    let start = prop_oneof![
        Just(JoinStart::Head),
        Just(JoinStart::Earliest),
        (0..12u64).prop_map(JoinStart::At),
    ];
    prop_oneof![
        2 => g.clone().prop_map(Op::Create),
        1 => g.clone().prop_map(Op::Delete),
        4 => (g.clone(), u.clone(), start).prop_map(|(g, u, s)| Op::Join(g, u, s)),
        1 => (g.clone(), u.clone()).prop_map(|(g, u)| Op::Leave(g, u)),
        10 => (g.clone(), u.clone(), 1..6u64, 0..40u8).prop_map(|(g, s, c, l)| Op::Append(g, s, c, l)),
        4 => (g.clone(), u.clone(), 0..15u64).prop_map(|(g, u, m)| Op::Ack(g, u, m)),
        1 => (u.clone(), proptest::collection::vec((g.clone(), 0..15u64), 0..4)).prop_map(|(u, v)| Op::BatchAck(u, v)),
        4 => (g.clone(), u.clone(), 1..5u8, proptest::option::of(0..15u64)).prop_map(|(g, u, n, a)| Op::Pull(g, u, n, a)),
        2 => u.clone().prop_map(Op::Unread),
        2 => u.clone().prop_map(Op::Sync),
        2 => (g.clone(), u.clone(), 0..15u64, 1..5u8).prop_map(|(g, u, b, n)| Op::History(g, u, b, n)),
        1 => (g.clone(), 0..15u64).prop_map(|(g, m)| Op::ReadCount(g, m)),
        1 => Just(Op::Flush),
        1 => Just(Op::Checkpoint),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
        1 => (1..65u64).prop_map(Op::PowerCut),
        2 => (g.clone(), u.clone(), 0..15u64).prop_map(|(g, u, m)| Op::ClearHistory(g, u, m)),
        3 => (g.clone(), u.clone(), 100..106u64, 0..12u64, 0..40u8).prop_map(|(g, s, c, t, l)| Op::Edit(g, s, c, t, l)),
        3 => (g.clone(), u.clone(), 100..106u64, 0..12u64).prop_map(|(g, s, c, t)| Op::Recall(g, s, c, t)),
        1 => (g.clone(), any::<bool>()).prop_map(|(g, b)| Op::Retain(g, b)),
        3 => (g.clone(), u.clone(), 0..15u64, 1..5u8).prop_map(|(g, u, b, n)| Op::HistoryLatest(g, u, b, n)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run_ops(ops);
    }
}
