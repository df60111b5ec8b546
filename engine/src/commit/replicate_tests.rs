//! Tests of the replication hooks (`replicate.rs`, `journal/rounds.rs`):
//! a follower fed a leader's rounds ends with byte-identical group logs
//! and equal memberships, before and after a crash; refused payloads
//! leave nothing behind; ids never collide on a node that took rounds.

use std::path::Path;

use proptest::prelude::*;

use crate::commit::journal::frame::PAYLOAD_HEADER_BYTES;
use crate::members::tidemarks::JoinStart;
use crate::tests::{payload, small_config};
use crate::{AppendRequest, Config, Engine, Error, Retention};

fn config(dir: &Path) -> Config {
    let mut c = small_config(dir);
    // Several journal files per checkpoint: rounds are found across files.
    c.journal_file_bytes = 4096;
    c.checkpoint_journal_bytes = 64 << 10;
    c
}

/// Feeds `b` every round of `a` it lacks; returns how many.
fn catch_up(a: &Engine, b: &Engine) -> u64 {
    let mut n = 0;
    while b.last_round() < a.last_round() {
        let rounds = a
            .read_rounds(b.last_round() + 1, a.last_round(), 16 << 10)
            .unwrap();
        assert!(!rounds.is_empty());
        for r in rounds {
            assert_eq!(b.append_replicated(&r.bytes).unwrap(), r.round_index);
            n += 1;
        }
    }
    n
}

/// Every record of the group, byte for byte as a read returns them.
fn log_bytes(e: &Engine, g: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let batch = e.read(g, after, usize::MAX, usize::MAX).unwrap();
        for c in &batch.chunks {
            out.extend_from_slice(c.bytes());
        }
        if batch.count == 0 || !batch.has_more {
            return out;
        }
        after = batch.last_id;
    }
}

/// A group as compared: id, head, record bytes, retention, (member, cursor).
type GroupState = (u64, u64, Vec<u8>, Retention, Vec<(u64, u64)>);

/// Groups, heads, record bytes, retention, members and cursors.
fn state_of(e: &Engine) -> Vec<GroupState> {
    let mut ids = e.group_ids();
    ids.sort_unstable();
    ids.into_iter()
        .map(|g| {
            let mut members: Vec<(u64, u64)> = e
                .members(g)
                .unwrap()
                .into_iter()
                .map(|u| (u, e.cursor(g, u).unwrap()))
                .collect();
            members.sort_unstable();
            let retention = e.group(g).unwrap().retention();
            (g, e.head(g).unwrap(), log_bytes(e, g), retention, members)
        })
        .collect()
}

/// A small deterministic generator (no seed crate needed).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One random operation on the leader. Refusals (a group that does not
/// exist, a leave of a non-member) are part of the mix: they write
/// nothing, or a round both nodes apply alike.
///
/// A checkpoint deletes the journal files before the previous one's, so
/// the follower catches up (`b`) before each: it never lags by two.
fn random_op(a: &Engine, b: &Engine, rng: &mut Rng, sent: &mut Vec<(u64, u64, u64)>, step: u64) {
    let g = 1 + rng.below(5);
    let user = 100 + rng.below(6);
    match rng.below(20) {
        0 => {
            let _ = a.create_group(g);
        }
        1 => {
            let _ = a.delete_group(g);
        }
        2..=8 => {
            let n = 1 + rng.below(6);
            let mut msgs: Vec<(u64, u64, u64, Vec<u8>)> = Vec::new();
            for i in 0..n {
                let g = 1 + rng.below(5);
                // Every fifth a retransmit of an earlier send.
                let (g, sender, client) = match (rng.below(5), sent.is_empty()) {
                    (0, false) => sent[rng.below(sent.len() as u64) as usize],
                    _ => (g, user, step * 100 + i),
                };
                msgs.push((g, sender, client, payload(g, step * 100 + i)));
            }
            let reqs: Vec<AppendRequest<'_>> = msgs
                .iter()
                .map(|(g, s, c, p)| AppendRequest {
                    group_id: *g,
                    sender_id: *s,
                    client_msg_id: *c,
                    payload: p,
                })
                .collect();
            if a.append_batch(&reqs).is_ok() {
                sent.extend(msgs.iter().map(|m| (m.0, m.1, m.2)));
            }
        }
        9..=11 => {
            let start = match rng.below(3) {
                0 => JoinStart::Head,
                1 => JoinStart::Earliest,
                _ => JoinStart::At(1 + rng.below(10)),
            };
            let _ = a.join(g, user, start);
        }
        12 => {
            let _ = a.leave(g, user);
        }
        13..=15 => {
            if let Ok(head) = a.head(g) {
                let _ = a.ack(g, user, rng.below(head + 1));
            }
        }
        16 => {
            let _ = a.flush_cursors();
        }
        17 => {
            // Policies that drop nothing here: segment drops are each
            // node's own checkpoint-time decision (section 17).
            let policy = Retention {
                by_cursor: false,
                max_age_ms: 86_400_000 + rng.below(1000),
                max_bytes: 1 << 40,
            };
            let _ = a.set_retention(g, policy);
        }
        18 => {
            catch_up(a, b);
            let _ = a.checkpoint();
        }
        _ => {
            let _ = a.create_group(g);
        }
    }
}

/// The differential test: a follower fed the leader's rounds as they are
/// written ends with the same groups, heads, record bytes, retention,
/// members and persisted cursors, and keeps them through a crash.
fn differential(seed: u64, steps: u64) {
    let da = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let a = Engine::open(config(da.path())).unwrap();
    let b = Engine::open(config(db.path())).unwrap();
    let mut rng = Rng(seed | 1);
    let mut sent = Vec::new();
    for step in 0..steps {
        random_op(&a, &b, &mut rng, &mut sent, step);
        if rng.below(3) == 0 {
            catch_up(&a, &b);
        }
    }
    // Cursors moved in the leader's memory (ACKs, senders' own messages)
    // reach the follower as the leader persists them.
    a.flush_cursors().unwrap();
    catch_up(&a, &b);
    // Rounds reached the follower (here or in a checkpoint step's catch-up:
    // some seeds ship everything there).
    // (A seed whose leader wrote no round at all ships nothing: found by
    // CI, seed 8312197824839141437 with 60 steps.)
    assert!(
        a.last_round() == 0 || b.last_round() > 0,
        "seed {seed}: nothing was shipped"
    );
    assert_eq!(b.last_round(), a.last_round());
    let want = state_of(&a);
    assert_eq!(state_of(&b), want, "seed {seed}");
    b.simulate_crash();
    let b = Engine::open(config(db.path())).unwrap();
    assert_eq!(
        state_of(&b),
        want,
        "seed {seed}, after the follower's crash"
    );
    assert_eq!(b.last_round(), a.last_round());
}

#[test]
fn a_follower_fed_the_leaders_rounds_holds_identical_logs_and_memberships() {
    for seed in [1, 7, 42, 1234] {
        differential(seed, 150);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]

    #[test]
    fn a_follower_matches_its_leader_for_any_seed(seed in any::<u64>()) {
        differential(seed, 60);
    }
}

#[test]
fn a_seed_whose_rounds_all_ship_in_checkpoint_steps_still_matches() {
    // Found by CI: every round of this seed reached the follower inside a
    // checkpoint step's catch-up, which the old count of shipped rounds
    // did not include.
    differential(699155175426772669, 60);
}

/// A leader with rounds 1 (create 5), 2 (records 1..=2), 3 (records 3..=4),
/// and the payloads of those rounds.
fn leader_with_three_rounds(dir: &Path) -> (Engine, Vec<Vec<u8>>) {
    let a = Engine::open(config(dir)).unwrap();
    a.create_group(5).unwrap();
    for ids in [[1, 2], [3, 4]] {
        let p: Vec<Vec<u8>> = ids.iter().map(|&i| payload(5, i)).collect();
        let reqs: Vec<AppendRequest<'_>> = ids
            .iter()
            .zip(&p)
            .map(|(&i, p)| AppendRequest {
                group_id: 5,
                sender_id: 9,
                client_msg_id: i,
                payload: p,
            })
            .collect();
        a.append_batch(&reqs).unwrap();
    }
    let rounds = a.read_rounds(1, 3, usize::MAX).unwrap();
    assert_eq!(
        rounds.iter().map(|r| r.round_index).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    (a, rounds.into_iter().map(|r| r.bytes).collect())
}

fn journal_bytes(dir: &Path) -> u64 {
    crate::commit::journal::list(&crate::io::OsVfs, &dir.join("journal"))
        .unwrap()
        .iter()
        .map(|(_, p)| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// Sets the payload CRC of a payload edited on purpose (a forgery).
fn reseal(p: &mut [u8]) {
    let crc = crc32fast::hash(&p[4..]);
    p[0..4].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn refused_payloads_are_typed_errors_and_write_nothing() {
    let da = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let (_a, rounds) = leader_with_three_rounds(da.path());
    let b = Engine::open(config(db.path())).unwrap();
    assert_eq!(b.append_replicated(&rounds[0]).unwrap(), 1);
    let before = journal_bytes(db.path());
    let refused = |payload: &[u8]| {
        let e = b.append_replicated(payload).unwrap_err();
        assert_eq!(b.last_round(), 1, "{e}");
        assert_eq!(journal_bytes(db.path()), before, "{e}");
        assert_eq!(b.head(5).unwrap(), 0, "{e}");
        e
    };
    // A damaged byte anywhere: the payload CRC.
    for at in [0, 5, 9, PAYLOAD_HEADER_BYTES + 3, rounds[1].len() - 1] {
        let mut bad = rounds[1].clone();
        bad[at] ^= 0x20;
        assert!(matches!(refused(&bad), Error::InvalidRound { .. }), "{at}");
    }
    // Torn: every strict prefix.
    for len in [0, 10, PAYLOAD_HEADER_BYTES, rounds[1].len() - 1] {
        assert!(matches!(
            refused(&rounds[1][..len]),
            Error::InvalidRound { .. }
        ));
    }
    // A duplicate and a gap.
    assert!(matches!(
        refused(&rounds[0]),
        Error::RoundOutOfOrder {
            round: 1,
            expected: 2
        }
    ));
    assert!(matches!(
        refused(&rounds[2]),
        Error::RoundOutOfOrder {
            round: 3,
            expected: 2
        }
    ));
    // Forged with a valid CRC: round 3's records numbered as round 2
    // (they do not continue the head), and round 2 aimed at a group that
    // does not exist here.
    let mut skips = rounds[2].clone();
    skips[8..16].copy_from_slice(&2u64.to_le_bytes());
    reseal(&mut skips);
    assert!(matches!(refused(&skips), Error::InvalidRound { .. }));
    let mut orphan = rounds[1].clone();
    let group_at = PAYLOAD_HEADER_BYTES + 8;
    orphan[group_at..group_at + 8].copy_from_slice(&6u64.to_le_bytes());
    reseal(&mut orphan);
    assert!(matches!(refused(&orphan), Error::InvalidRound { .. }));
    // A CreateGroup of a group that exists.
    let mut again = rounds[0].clone();
    again[8..16].copy_from_slice(&2u64.to_le_bytes());
    reseal(&mut again);
    assert!(matches!(refused(&again), Error::InvalidRound { .. }));
    // The genuine rounds are still taken, and the follower reopens fine.
    assert_eq!(b.append_replicated(&rounds[1]).unwrap(), 2);
    assert_eq!(b.append_replicated(&rounds[2]).unwrap(), 3);
    assert_eq!(b.head(5).unwrap(), 4);
    b.simulate_crash();
    let b = Engine::open(config(db.path())).unwrap();
    assert_eq!(b.head(5).unwrap(), 4);
    assert_eq!(b.last_round(), 3);
}

/// A follower that built a send state (a retransmit looked up) before
/// replicated records arrived: the state follows them, so a later local
/// send gets the next id (not one a replicated record holds) and a
/// retransmit of a replicated message finds its original.
#[test]
fn a_send_state_follows_replicated_records_so_ids_never_collide() {
    let da = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let (a, rounds) = leader_with_three_rounds(da.path());
    let b = Engine::open(config(db.path())).unwrap();
    b.append_replicated(&rounds[0]).unwrap();
    b.append_replicated(&rounds[1]).unwrap();
    // A retransmit: answered from the window, no round written.
    let dup = b.append(5, 9, 1, &payload(5, 1)).unwrap();
    assert!(dup.duplicate && dup.msg_id == 1);
    assert_eq!(b.last_round(), 2);
    b.append_replicated(&rounds[2]).unwrap();
    let dup = b.append(5, 9, 3, &payload(5, 3)).unwrap();
    assert!(dup.duplicate, "a replicated message is in the window");
    assert_eq!(dup.msg_id, 3);
    let fresh = b.append(5, 9, 99, b"local").unwrap();
    assert_eq!((fresh.msg_id, fresh.duplicate), (5, false));
    assert_eq!(b.head(5).unwrap(), 5);
    let (ab, bb) = (log_bytes(&a, 5), log_bytes(&b, 5));
    assert_eq!(
        &bb[..ab.len()],
        &ab[..],
        "the replicated records, byte for byte"
    );
    // The node wrote a round of its own: the leader's next one no longer
    // follows its journal.
    let more = b.append_replicated(&rounds[2]).unwrap_err();
    assert!(matches!(more, Error::RoundOutOfOrder { .. }), "{more}");
}

#[test]
fn read_rounds_bounds_bytes_and_reports_compacted_and_unwritten_rounds() {
    let da = tempfile::tempdir().unwrap();
    let (a, rounds) = leader_with_three_rounds(da.path());
    assert_eq!((a.first_round(), a.last_round()), (1, 3));
    // At least one round, however small the budget.
    let one = a.read_rounds(2, 3, 1).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].bytes, rounds[1]);
    let two = a
        .read_rounds(2, 3, rounds[1].len() + rounds[2].len())
        .unwrap();
    assert_eq!(two.len(), 2);
    assert!(a.read_rounds(3, 2, usize::MAX).unwrap().is_empty());
    assert!(matches!(
        a.read_rounds(3, 4, usize::MAX),
        Err(Error::RoundNotWritten { round: 4, last: 3 })
    ));
    // Two checkpoints: the first journal files are deleted, and their
    // rounds leave the index with them.
    a.checkpoint().unwrap();
    a.create_group(6).unwrap();
    a.checkpoint().unwrap();
    assert_eq!(a.last_round(), 4);
    assert_eq!(a.first_round(), 4);
    assert!(matches!(
        a.read_rounds(1, 4, usize::MAX),
        Err(Error::RoundCompacted { round: 1, first: 4 })
    ));
    assert_eq!(a.read_rounds(4, 4, usize::MAX).unwrap().len(), 1);
    // A restart keeps the numbering (nothing is retained past it).
    drop(a);
    let a = Engine::open(config(da.path())).unwrap();
    assert_eq!((a.first_round(), a.last_round()), (5, 4));
    a.create_group(7).unwrap();
    assert_eq!(a.read_rounds(5, 5, usize::MAX).unwrap()[0].round_index, 5);
}

/// The dedup window a follower builds from replicated rounds remembers
/// what each key was used for, as the leader's send path did: after a
/// failover the new leader refuses a key reused for another request
/// (`KeyReused`) exactly as the old one would, and answers a true
/// retransmit of a replicated recall as a duplicate.
#[test]
fn a_follower_remembers_what_each_replicated_key_was_for() {
    use crate::{Change, ChangeRequest};
    let da = tempfile::tempdir().unwrap();
    let db = tempfile::tempdir().unwrap();
    let a = Engine::open(config(da.path())).unwrap();
    a.create_group(5).unwrap();
    a.append(5, 42, 1, b"one").unwrap();
    a.append(5, 42, 2, b"two").unwrap();
    let recall = |client_msg_id, target| ChangeRequest {
        group_id: 5,
        sender_id: 42,
        client_msg_id,
        target,
        change: Change::Recall,
        admin: false,
    };
    assert_eq!(a.change(&recall(3, 1)).unwrap().msg_id, 3);
    let b = Engine::open(config(db.path())).unwrap();
    catch_up(&a, &b);
    let reused = |r: crate::Result<crate::Appended>| match r {
        Err(Error::KeyReused { msg_id, .. }) => msg_id,
        other => panic!("not KeyReused: {other:?}"),
    };
    for e in [&a, &b] {
        assert_eq!(reused(e.change(&recall(2, 1))), 2, "a send's key");
        assert_eq!(reused(e.append(5, 42, 3, b"m")), 3, "a recall's key");
        assert_eq!(reused(e.change(&recall(3, 2))), 3, "another target");
        let dup = e.change(&recall(3, 1)).unwrap();
        assert_eq!((dup.msg_id, dup.duplicate), (3, true));
    }
    assert_eq!(b.head(5).unwrap(), 3);
}

#[test]
fn a_seed_whose_leader_creates_no_group_ships_nothing_and_still_matches() {
    // Found by CI: none of this seed's 60 steps creates a group (one in
    // ten does; about one seed in 550 has none), so the leader writes no
    // round and there is nothing to ship.
    differential(8312197824839141437, 60);
}

/// A leader and a follower with `groups_per_user_max` 5: groups 1-8
/// created (without records, so without a directory: nothing registers
/// them at the follower's open), user 1 in groups 1-3, then `more` on the
/// leader; the follower caught up, stopped cleanly (its manifest bounds
/// every user's groups by 3) and opened again with its saved state held
/// loading in the background. The directories live as long as the first
/// value.
fn a_follower_loading_user_1_in_three_of_eight_groups(
    more: impl FnOnce(&Engine),
) -> ((tempfile::TempDir, tempfile::TempDir), Engine, Engine) {
    use crate::state::lazy::hold;
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let limited = |dir: &Path| {
        let mut c = config(dir);
        c.groups_per_user_max = 5;
        c
    };
    let a = Engine::open(limited(da.path())).unwrap();
    let b = Engine::open(limited(db.path())).unwrap();
    for g in 1..=8 {
        a.create_group(g).unwrap();
    }
    for g in [1, 2, 3] {
        a.join(g, 1, JoinStart::Earliest).unwrap();
    }
    more(&a);
    catch_up(&a, &b);
    b.close().unwrap();
    hold::hold(db.path());
    let mut c = limited(db.path());
    c.load_in_background = true;
    let b = Engine::open(c).unwrap();
    assert!(b.stats().state_loading);
    ((da, db), a, b)
}

/// A follower whose saved state still loads (its loader held) applies a
/// leader's joins near `groups_per_user_max` as the leader decided them
/// (`groups_registered`, `commit/loading.rs`), all while its load is held:
/// user 1's first joins are admitted by the checkpoint's bound at once;
/// for the next ones user 1's saved groups are registered from the user
/// index (one of them deleted since the checkpoint: a stale entry), then
/// the limit is counted exactly, so the join the leader refused (user 1
/// already in five groups) is refused too, and the join after a leave is
/// admitted. The follower ends with exactly the leader's memberships.
#[test]
fn a_loading_follower_decides_joins_near_the_per_user_limit_as_its_leader() {
    use crate::state::lazy::hold;
    let ((_da, db), a, b) = a_follower_loading_user_1_in_three_of_eight_groups(|a| {
        a.join(1, 2, JoinStart::Earliest).unwrap();
    });

    a.delete_group(2).unwrap();
    a.join(4, 1, JoinStart::Earliest).unwrap();
    a.join(5, 1, JoinStart::Earliest).unwrap();
    a.join(6, 1, JoinStart::Earliest).unwrap();
    let refused = a.join(8, 1, JoinStart::Earliest);
    assert!(
        matches!(
            refused,
            Err(Error::LimitExceeded {
                what: "groups_per_user_max",
                ..
            })
        ),
        "{refused:?}"
    );
    a.leave(4, 1).unwrap();
    a.join(7, 1, JoinStart::Earliest).unwrap();
    a.join(8, 2, JoinStart::Earliest).unwrap();

    // The bound admits the first two joins of user 1; the later ones are
    // decided once user 1's saved groups are registered from the user
    // index: every round applies while the load is held.
    let caught_up = std::thread::scope(|s| {
        let follower = s.spawn(|| catch_up(&a, &b));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while b.last_round() < a.last_round() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let caught_up = (b.last_round(), b.stats().state_loading);
        hold::release(db.path());
        follower.join().unwrap();
        caught_up
    });
    assert_eq!(
        caught_up,
        (a.last_round(), true),
        "the follower applied every round while its load was held"
    );
    b.wait_ready(crate::STATE_TICKET).unwrap();
    assert!(!b.stats().state_loading);
    assert_eq!(a.members(8).unwrap(), vec![2], "the leader refused user 1");
    let groups_of_1 = |e: &Engine| {
        e.unread(1)
            .into_iter()
            .map(|u| u.group_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(groups_of_1(&a), vec![1, 3, 5, 6, 7]);
    assert_eq!(groups_of_1(&b), groups_of_1(&a));
    assert_eq!(state_of(&b), state_of(&a));
    b.close().unwrap();
}

/// A follower whose saved state loads in the background takes a leader's
/// rounds that name groups it has not registered yet and joins of a user
/// near `groups_per_user_max`: the lookups in the mapped runs (each group
/// a round names, the user's saved groups) are the maintenance worker's
/// jobs, never a read on the thread that hands the rounds over (a
/// replica's raft driver, whose ticks and heartbeats must not wait for a
/// block read): the rounds wait for the jobs' tickets, in order, and
/// apply as the leader applied them, all while the load is held.
#[test]
fn a_loading_follower_hands_rounds_over_without_reading_a_run_on_its_thread() {
    use crate::state::lazy::hold;
    let ((_da, db), a, b) = a_follower_loading_user_1_in_three_of_eight_groups(|_| {});

    // Records to groups without a directory at the follower (not
    // registered by its open), joins up to user 1's limit and one over it.
    for g in [3, 4] {
        a.append(g, 7, g, &payload(g, 1)).unwrap();
    }
    for g in [4, 5, 6, 7] {
        let _ = a.join(g, 1, JoinStart::Earliest);
    }
    assert_eq!(a.members(7).unwrap(), Vec::<u64>::new(), "over the limit");
    a.leave(5, 1).unwrap();
    a.join(8, 1, JoinStart::Earliest).unwrap();

    // As a replica's driver hands them over: a round that needs a job
    // is not taken (`NotReady`, nothing applied) and is handed over again
    // once the job's ticket is settled.
    let before = hold::run_lookups();
    let mut waits = 0;
    for r in a
        .read_rounds(b.last_round() + 1, a.last_round(), usize::MAX)
        .unwrap()
    {
        loop {
            match b.try_append_replicated(&r.bytes) {
                Ok(round) => {
                    assert_eq!(round, r.round_index);
                    break;
                }
                Err(Error::NotReady { ticket, .. }) => {
                    assert_ne!(ticket, crate::STATE_TICKET, "waits for the whole load");
                    assert_eq!(b.last_round(), r.round_index - 1, "nothing applied");
                    waits += 1;
                    b.wait_ready(ticket).unwrap();
                }
                Err(e) => panic!("round {}: {e}", r.round_index),
            }
        }
    }
    assert!(waits > 0, "some round needed a lookup");
    assert_eq!(
        hold::run_lookups(),
        before,
        "the thread that handed the rounds over read the runs"
    );
    assert!(b.stats().state_loading, "still held");
    hold::release(db.path());
    b.wait_ready(crate::STATE_TICKET).unwrap();
    assert_eq!(state_of(&b), state_of(&a));
    b.close().unwrap();
}
