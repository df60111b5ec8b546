//! Model-based test: random operation sequences run against the engine and
//! a small in-memory oracle; every answer must agree.
//!
//! The oracle models groups (messages with their ids and payloads, the dedup
//! key of every send), memberships (cursor and join point), ACK, pull with
//! `ack_up_to`, unread, sync's first pages, history, read counts, clean
//! reopen and crash. It leaves out retention, limits, byte budgets other
//! than "at least one record", and timing. After a crash the engine may have
//! forgotten ACKs that were not yet persisted: the oracle accepts any cursor
//! between the last persisted value and the last ACKed one (the documented
//! allowance), then adopts the engine's value.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use proptest::prelude::*;

use crate::{Config, Engine, Error, JoinStart};

#[derive(Clone, Debug)]
enum Op {
    Create(u64),
    Delete(u64),
    Join(u64, u64, u8, u64),
    Leave(u64, u64),
    Append(u64, u64, u64, u8),
    Ack(u64, u64, u64),
    BatchAck(u64, Vec<(u64, u64)>),
    Pull(u64, u64, u8, bool),
    Unread(u64),
    Sync(u64),
    History(u64, u64, u64, u8),
    ReadCount(u64, u64),
    Flush,
    Reopen,
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    let g = 1..4u64;
    let u = 1..5u64;
    prop_oneof![
        2 => g.clone().prop_map(Op::Create),
        1 => g.clone().prop_map(Op::Delete),
        4 => (g.clone(), u.clone(), 0..3u8, 0..12u64).prop_map(|(g, u, s, m)| Op::Join(g, u, s, m)),
        1 => (g.clone(), u.clone()).prop_map(|(g, u)| Op::Leave(g, u)),
        10 => (g.clone(), u.clone(), 1..6u64, 0..40u8).prop_map(|(g, s, c, l)| Op::Append(g, s, c, l)),
        4 => (g.clone(), u.clone(), 0..15u64).prop_map(|(g, u, m)| Op::Ack(g, u, m)),
        1 => (u.clone(), proptest::collection::vec((g.clone(), 0..15u64), 0..4)).prop_map(|(u, v)| Op::BatchAck(u, v)),
        4 => (g.clone(), u.clone(), 1..5u8, any::<bool>()).prop_map(|(g, u, n, a)| Op::Pull(g, u, n, a)),
        2 => u.clone().prop_map(Op::Unread),
        2 => u.clone().prop_map(Op::Sync),
        2 => (g.clone(), u.clone(), 0..15u64, 1..5u8).prop_map(|(g, u, b, n)| Op::History(g, u, b, n)),
        1 => (g.clone(), 0..15u64).prop_map(|(g, m)| Op::ReadCount(g, m)),
        1 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

#[derive(Clone, Debug)]
struct MemberModel {
    cursor: u64,
    persisted: u64,
    join_point: u64,
}

#[derive(Default, Debug)]
struct GroupModel {
    /// (sender, client_msg_id, payload)
    messages: Vec<(u64, u64, Vec<u8>)>,
    members: BTreeMap<u64, MemberModel>,
}

impl GroupModel {
    fn head(&self) -> u64 {
        self.messages.len() as u64
    }
}

fn config(dir: &Path) -> Config {
    let mut c = Config::new(dir);
    c.payload_bytes_max = 256;
    c.segment_bytes_max = 1024;
    c.index_interval_bytes = 128;
    c
}

fn payload(g: u64, s: u64, c: u64, len: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (g * 31 + s * 7 + c * 3 + i as u64) as u8)
        .collect()
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Some(Engine::open(config(dir.path())).unwrap());
    let mut model: HashMap<u64, GroupModel> = HashMap::new();
    for op in ops {
        let e = engine.as_ref().unwrap();
        match op {
            Op::Create(g) => {
                let r = e.create_group(g);
                prop_assert_eq!(r.is_ok(), !model.contains_key(&g), "create {}", g);
                model.entry(g).or_default();
            }
            Op::Delete(g) => {
                prop_assert_eq!(e.delete_group(g).is_ok(), model.remove(&g).is_some());
            }
            Op::Join(g, u, s, m) => {
                let start = match s {
                    0 => JoinStart::Head,
                    1 => JoinStart::Earliest,
                    _ => JoinStart::At(m),
                };
                let r = e.join(g, u, start);
                match model.get_mut(&g) {
                    None => prop_assert!(
                        matches!(r, Err(Error::GroupNotFound { .. })),
                        "{:?}",
                        r.as_ref().err()
                    ),
                    Some(gm) => {
                        let head = gm.head();
                        let expected = match gm.members.get(&u) {
                            Some(mm) => mm.cursor,
                            None => {
                                let c = match start {
                                    JoinStart::Head => head,
                                    JoinStart::Earliest => 0,
                                    JoinStart::At(m) => m.saturating_sub(1).min(head),
                                };
                                gm.members.insert(
                                    u,
                                    MemberModel {
                                        cursor: c,
                                        persisted: c,
                                        join_point: c + 1,
                                    },
                                );
                                c
                            }
                        };
                        prop_assert_eq!(r.unwrap(), expected);
                    }
                }
            }
            Op::Leave(g, u) => {
                let expected = model
                    .get_mut(&g)
                    .and_then(|gm| gm.members.remove(&u))
                    .is_some();
                prop_assert_eq!(e.leave(g, u).is_ok(), expected);
            }
            Op::Append(g, s, c, len) => {
                let p = payload(g, s, c, len);
                let r = e.append(g, s, c, &p);
                match model.get_mut(&g) {
                    None => prop_assert!(r.is_err()),
                    Some(gm) => {
                        let a = r.unwrap();
                        match gm.messages.iter().position(|m| m.0 == s && m.1 == c) {
                            Some(i) => {
                                prop_assert!(a.duplicate);
                                prop_assert_eq!(a.msg_id, i as u64 + 1);
                            }
                            None => {
                                prop_assert!(!a.duplicate);
                                gm.messages.push((s, c, p));
                                let id = gm.head();
                                prop_assert_eq!(a.msg_id, id);
                                if let Some(mm) = gm.members.get_mut(&s) {
                                    if mm.cursor == id - 1 {
                                        mm.cursor = id;
                                    }
                                }
                            }
                        }
                    }
                }
            }
            Op::Ack(g, u, m) => check_ack(&mut model, g, u, m, e.ack(g, u, m))?,
            Op::BatchAck(u, acks) => {
                let results = e.batch_ack(u, &acks);
                for ((g, m), r) in acks.into_iter().zip(results) {
                    check_ack(&mut model, g, u, m, r)?;
                }
            }
            Op::Pull(g, u, n, with_ack) => {
                let ack = if with_ack {
                    model
                        .get(&g)
                        .and_then(|gm| gm.members.get(&u))
                        .map(|mm| mm.cursor + 1)
                } else {
                    None
                };
                let r = e.pull(g, u, n as usize, 1, ack.map(|a| a.min(model[&g].head())));
                match model.get_mut(&g).map(|gm| (gm.head(), gm)) {
                    Some((head, gm)) if gm.members.contains_key(&u) => {
                        let mm = gm.members.get_mut(&u).unwrap();
                        if let Some(a) = ack {
                            mm.cursor = mm.cursor.max(a.min(head));
                        }
                        let p = r.unwrap();
                        prop_assert_eq!(p.cursor, mm.cursor);
                        prop_assert_eq!(p.head, head);
                        let got: Vec<(u64, Vec<u8>)> = p
                            .batch
                            .records()
                            .map(|r| (r.header.msg_id, r.payload().to_vec()))
                            .collect();
                        // Byte budget 1: exactly one record if any is unread.
                        let expected: Vec<(u64, Vec<u8>)> = (mm.cursor + 1..=head)
                            .take(1)
                            .map(|id| (id, gm.messages[id as usize - 1].2.clone()))
                            .collect();
                        prop_assert_eq!(got, expected);
                        prop_assert_eq!(p.batch.has_more, mm.cursor + 1 < head);
                    }
                    _ => prop_assert!(r.is_err()),
                }
            }
            Op::Unread(u) => {
                let got: Vec<(u64, u64, u64)> = e
                    .unread(u)
                    .iter()
                    .map(|x| (x.group_id, x.cursor, x.unread))
                    .collect();
                prop_assert_eq!(got, expected_unread(&model, u));
            }
            Op::Sync(u) => {
                let s = e.sync(u, 2, 1 << 20, None).unwrap();
                prop_assert!(s.continue_after.is_none());
                let got: Vec<(u64, Vec<u64>)> = s
                    .groups
                    .iter()
                    .map(|g| {
                        (
                            g.unread.group_id,
                            g.batch.records().map(|r| r.header.msg_id).collect(),
                        )
                    })
                    .collect();
                let expected: Vec<(u64, Vec<u64>)> = expected_unread(&model, u)
                    .into_iter()
                    .filter(|x| x.2 > 0)
                    .map(|(g, c, n)| (g, (c + 1..=c + n.min(2)).collect()))
                    .collect();
                prop_assert_eq!(got, expected);
            }
            Op::History(g, u, before, n) => {
                let before = if before == 0 { None } else { Some(before) };
                let r = e.history(g, u, before, n as usize);
                match model
                    .get(&g)
                    .and_then(|gm| gm.members.get(&u).map(|mm| (gm, mm)))
                {
                    Some((gm, mm)) => {
                        let h = r.unwrap();
                        let end = before.unwrap_or(gm.head() + 1).min(gm.head() + 1);
                        let start = mm.join_point.max(end.saturating_sub(n as u64)).max(1);
                        let expected: Vec<u64> = (start..end).collect();
                        let got: Vec<u64> = h.batch.records().map(|r| r.header.msg_id).collect();
                        prop_assert_eq!(got, expected);
                        prop_assert_eq!(h.complete, start <= mm.join_point.max(1));
                    }
                    None => prop_assert!(r.is_err()),
                }
            }
            Op::ReadCount(g, m) => {
                let r = e.read_count(g, m);
                match model.get(&g) {
                    Some(gm) => prop_assert_eq!(
                        r.unwrap() as usize,
                        gm.members.values().filter(|mm| mm.cursor >= m).count()
                    ),
                    None => prop_assert!(r.is_err()),
                }
            }
            Op::Flush => {
                e.flush_cursors().unwrap();
                persist_all(&mut model);
            }
            Op::Reopen => {
                engine.take().unwrap().close().unwrap();
                engine = Some(Engine::open(config(dir.path())).unwrap());
                persist_all(&mut model);
            }
            Op::Crash => {
                engine.take().unwrap().simulate_crash();
                let e = Engine::open(config(dir.path())).unwrap();
                for (&g, gm) in model.iter_mut() {
                    prop_assert_eq!(e.head(g).unwrap(), gm.head());
                    for (&u, mm) in gm.members.iter_mut() {
                        let c = e
                            .unread(u)
                            .iter()
                            .find(|x| x.group_id == g)
                            .map(|x| x.cursor);
                        let Some(c) = c else {
                            return Err(TestCaseError::fail(format!("member {u} of {g} lost")));
                        };
                        prop_assert!(
                            c >= mm.persisted && c <= mm.cursor,
                            "cursor {} not in [{}, {}]",
                            c,
                            mm.persisted,
                            mm.cursor
                        );
                        mm.cursor = c;
                        mm.persisted = c;
                    }
                }
                engine = Some(e);
            }
        }
        // Invariants after every step: dense ids and stored bytes.
        let e = engine.as_ref().unwrap();
        for (&g, gm) in &model {
            prop_assert_eq!(e.head(g).unwrap(), gm.head());
        }
    }
    Ok(())
}

fn check_ack(
    model: &mut HashMap<u64, GroupModel>,
    g: u64,
    u: u64,
    m: u64,
    r: crate::Result<u64>,
) -> Result<(), TestCaseError> {
    match model.get_mut(&g).map(|gm| (gm.head(), gm)) {
        None => prop_assert!(
            matches!(r, Err(Error::GroupNotFound { .. })),
            "{:?}",
            r.as_ref().err()
        ),
        Some((head, gm)) => match gm.members.get_mut(&u) {
            None => prop_assert!(
                matches!(r, Err(Error::NotMember { .. })),
                "{:?}",
                r.as_ref().err()
            ),
            Some(mm) if m > head => {
                prop_assert!(
                    matches!(r, Err(Error::CursorAboveHead { .. })),
                    "{:?}",
                    r.as_ref().err()
                );
                let _ = mm;
            }
            Some(mm) => {
                mm.cursor = mm.cursor.max(m);
                prop_assert_eq!(r.unwrap(), mm.cursor);
            }
        },
    }
    Ok(())
}

fn expected_unread(model: &HashMap<u64, GroupModel>, u: u64) -> Vec<(u64, u64, u64)> {
    let mut v: Vec<(u64, u64, u64)> = model
        .iter()
        .filter_map(|(&g, gm)| {
            gm.members
                .get(&u)
                .map(|mm| (g, mm.cursor, gm.head() - mm.cursor))
        })
        .collect();
    v.sort_unstable();
    v
}

fn persist_all(model: &mut HashMap<u64, GroupModel>) {
    for gm in model.values_mut() {
        for mm in gm.members.values_mut() {
            mm.persisted = mm.cursor;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn engine_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops)?;
    }
}
