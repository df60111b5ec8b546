//! A history check in the spirit of Jepsen (format-spec/cluster.md
//! section 6.1) against a replica set of three real nodes: [`run`] takes
//! any [`SetUnderFaults`], the proxy links of `faulty_set.rs` (this
//! module's test) or the network namespaces and packet-dropping rules of
//! `netns.rs` (`netns_faults.rs`).
//!
//! Several client threads, each a user of two groups, send, pull (each
//! pull ACKing what the client saw before) and ask UNREAD against
//! whichever member leads, while a seeded nemesis, round after round,
//! takes turns at the faults of its [`Plan`]: SIGKILL and restart a
//! member, cut a member's links both ways, cut one direction between two
//! members, or SIGSTOP a member and resume it (the leader or a random
//! member), then heals.
//! Every operation is recorded, in each client's order: which
//! member answered, and its outcome: ok (with the msg_id, cursor, head,
//! records), fail (NOT_LEADER: refused before anything happened) or
//! unknown (no answer, a broken connection, any other error). A send
//! whose outcome was unknown is retransmitted with the same
//! `client_msg_id` half of the time.
//!
//! The checker, after the last round, a heal and a clean stop:
//!
//! - the replicas' group logs are byte-identical (`ctl dump` and segment
//!   files): one order;
//! - in that order ids are dense, and each `(sender, client_msg_id)` is
//!   stored at most once, with the payload its sender invoked it with: no
//!   id holds a send that was never invoked;
//! - every acknowledged send is stored, at the msg_id it was acknowledged
//!   with (every acknowledgement of one `client_msg_id` names the same
//!   id); sends that were only ever unknown or refused appear at most once;
//! - every pulled page is the final log's records `cursor + 1 ..` in
//!   order: what each client read is a prefix of the one order;
//! - per client and group, the cursor and head it read (PULL, UNREAD)
//!   never go back, across faults too: an ACK (a PULL's `ack_up_to`) is
//!   answered only once a committed Cursors round holds the cursor, and a
//!   leader answers a read only once a read index confirmed it still led
//!   (cluster.md sections 5 and 5.2). Cursors are never above the head;
//! - no member's process ended by itself: a member that lost leadership
//!   with a round at its gate restarts in place (cluster.md section 5.1).
//!
//! Environment: `TIDEMARK_HISTORY_ROUNDS=N` nemesis rounds of this
//! module's test (default 6; `netns_faults.rs` has its own),
//! `TIDEMARK_HISTORY_SEED=S` (default: from the clock, printed),
//! `TIDEMARK_HISTORY_CLIENTS=N` client threads (default 4).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_client::{Client, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart};

use crate::faulty_set::{
    connect, on_leader, read_all, stop_and_compare, FaultySet, SetUnderFaults, IDS, LEADER_WAIT,
};
use crate::proxy::Rng;

const GROUPS: [u64; 2] = [11, 12];
/// Client `i` is user `USER_BASE + i`.
const USER_BASE: u64 = 100;

#[derive(Clone, Debug)]
enum Outcome<T> {
    Ok(T),
    /// Refused before anything happened (NOT_LEADER).
    Fail,
    /// No answer, a broken connection, or another error.
    Unknown,
}

/// A pulled page or an UNREAD entry: what a client read of one group.
#[derive(Clone, Debug)]
struct Read {
    cursor: u64,
    head: u64,
    /// `(msg_id, sender, client_msg_id)` of a pulled page's records.
    records: Vec<(u64, u64, u64)>,
}

#[derive(Clone, Debug)]
enum Op {
    Send {
        group: u64,
        cmid: u64,
        outcome: Outcome<u64>,
    },
    Pull {
        group: u64,
        ack_up_to: u64,
        outcome: Outcome<Read>,
    },
    Unread {
        outcome: Outcome<Vec<(u64, Read)>>,
    },
}

#[derive(Clone, Debug)]
struct Event {
    node: u64,
    op: Op,
}

fn payload(user: u64, cmid: u64) -> Vec<u8> {
    format!("u{user} c{cmid}").into_bytes()
}

fn classify<T>(r: Result<T, ClientError>) -> (Outcome<T>, Option<ClientError>) {
    match r {
        Ok(v) => (Outcome::Ok(v), None),
        Err(
            e @ ClientError::Server {
                code: ErrorCode::NotLeader,
                ..
            },
        ) => (Outcome::Fail, Some(e)),
        Err(e) => (Outcome::Unknown, Some(e)),
    }
}

/// One client thread's loop: 60% sends, 25% pulls, 15% UNREAD, until
/// `stop`. Returns its history.
fn client(
    user: u64,
    seed: u64,
    addrs: BTreeMap<u64, String>,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
) -> Vec<Event> {
    let mut rng = Rng::new(seed);
    let mut history = Vec::new();
    let mut node = IDS[(user as usize) % IDS.len()];
    let mut conn: Option<Client> = None;
    let mut next_cmid = 1;
    // A send to retransmit (its outcome was unknown): (group, cmid).
    let mut retry: Option<(u64, u64)> = None;
    // Per group, the highest msg_id this client pulled.
    let mut seen: HashMap<u64, u64> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        if conn.is_none() {
            conn = connect(&addrs[&node], Duration::from_secs(1));
        }
        let dice = rng.range((0, 99));
        let (op, err) = match conn.as_mut() {
            None => (None, Some(ClientError::Closed)),
            Some(c) if dice < 60 => {
                let (group, cmid) = retry.take().unwrap_or_else(|| {
                    next_cmid += 1;
                    (GROUPS[rng.range((0, 1)) as usize], next_cmid - 1)
                });
                let (outcome, err) = classify(
                    c.send(group, user, cmid, &payload(user, cmid))
                        .map(|s| s.msg_id),
                );
                match outcome {
                    Outcome::Ok(_) => {
                        acked.fetch_add(1, Ordering::AcqRel);
                    }
                    Outcome::Fail => retry = Some((group, cmid)),
                    Outcome::Unknown if rng.percent(50) => retry = Some((group, cmid)),
                    Outcome::Unknown => {}
                }
                (
                    Some(Op::Send {
                        group,
                        cmid,
                        outcome,
                    }),
                    err,
                )
            }
            Some(c) if dice < 85 => {
                let group = GROUPS[rng.range((0, 1)) as usize];
                let ack_up_to = seen.get(&group).copied().unwrap_or(0);
                let (outcome, err) = classify(c.pull(group, user, ack_up_to, 20, 0).map(|p| {
                    Read {
                        cursor: p.cursor,
                        head: p.head,
                        records: p
                            .messages
                            .iter()
                            .map(|m| (m.msg_id, m.sender_id, m.client_msg_id))
                            .collect(),
                    }
                }));
                if let Outcome::Ok(r) = &outcome {
                    if let Some(&(last, ..)) = r.records.last() {
                        seen.insert(group, last);
                    }
                }
                (
                    Some(Op::Pull {
                        group,
                        ack_up_to,
                        outcome,
                    }),
                    err,
                )
            }
            Some(c) => {
                let (outcome, err) = classify(c.unread(user).map(|list| {
                    list.iter()
                        .map(|g| {
                            (
                                g.group,
                                Read {
                                    cursor: g.cursor,
                                    head: g.head,
                                    records: Vec::new(),
                                },
                            )
                        })
                        .collect()
                }));
                (Some(Op::Unread { outcome }), err)
            }
        };
        if let Some(op) = op {
            history.push(Event { node, op });
        }
        match err {
            None => {}
            Some(ClientError::Server {
                code: ErrorCode::NotLeader,
                detail: Some(l),
                ..
            }) if l != node && addrs.contains_key(&l) => {
                node = l;
                conn = None;
            }
            Some(_) => {
                conn = None;
                node = IDS[(IDS.iter().position(|&i| i == node).unwrap_or(0) + 1) % IDS.len()];
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    history
}

/// A fault the nemesis holds for one round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SIGKILL, then a restart.
    Kill,
    /// Every link between the member and its peers cut, both ways.
    Partition,
    /// What the member sends to one other member cut, not the reverse.
    OneWay,
    /// SIGSTOP, then SIGCONT.
    Pause,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kill => "kill",
            Kind::Partition => "partition",
            Kind::OneWay => "one-way",
            Kind::Pause => "pause",
        }
    }
}

/// What the nemesis does: `rounds` rounds taking turns at `kinds` (the
/// first of each kind hits the leader, the fault that matters most, also
/// in a short CI run; later ones the leader or a random member, half and
/// half), each held 0.2-1.2 s.
pub struct Plan {
    pub rounds: u64,
    pub clients: u64,
    pub seed: u64,
    pub kinds: &'static [Kind],
}

impl Plan {
    /// Rounds from the variable `rounds_var` (else `default_rounds`),
    /// clients and seed from the module's variables; prints them.
    pub fn from_env(rounds_var: &str, default_rounds: u64, kinds: &'static [Kind]) -> Plan {
        let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let plan = Plan {
            rounds: env(rounds_var).unwrap_or(default_rounds),
            clients: env("TIDEMARK_HISTORY_CLIENTS").unwrap_or(4),
            seed: env("TIDEMARK_HISTORY_SEED").unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            }),
            kinds,
        };
        eprintln!(
            "history check: seed {} (TIDEMARK_HISTORY_SEED), {} rounds ({rounds_var}), {} clients, faults {:?}",
            plan.seed, plan.rounds, plan.clients, plan.kinds
        );
        plan
    }
}

/// What the nemesis did in one round: the fault, its member, and for a
/// one-way cut the member that stopped hearing from it.
#[derive(Clone, Copy, Debug)]
struct Fault {
    kind: Kind,
    node: u64,
    to: Option<u64>,
}

fn leader(set: &impl SetUnderFaults) -> u64 {
    on_leader(&set.addrs(), |c| c.ping().and_then(|_| c.unread(USER_BASE))).1
}

/// Waits until the clients had `n` more sends acknowledged, restarting
/// members whose process ended (cluster.md section 5.1).
fn wait_progress(set: &mut impl SetUnderFaults, acked: &AtomicU64, n: u64) {
    let start = acked.load(Ordering::Acquire);
    let deadline = Instant::now() + LEADER_WAIT;
    while acked.load(Ordering::Acquire) < start + n {
        assert!(
            Instant::now() < deadline,
            "no progress within {LEADER_WAIT:?}"
        );
        set.supervise();
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_history_under_kills_partitions_and_pauses_is_consistent() {
    let plan = Plan::from_env(
        "TIDEMARK_HISTORY_ROUNDS",
        6,
        &[Kind::Partition, Kind::Kill, Kind::Pause],
    );
    run(&mut FaultySet::start(), &plan);
}

/// One history under `plan`'s nemesis against `set`, then the checker
/// (module docs); panics naming the first violation.
pub fn run(set: &mut impl SetUnderFaults, plan: &Plan) {
    let began = Instant::now();
    let seed = plan.seed;
    let mut rng = Rng::new(seed);
    let addrs = set.addrs();
    let users: Vec<u64> = (0..plan.clients).map(|i| USER_BASE + i).collect();
    for &g in &GROUPS {
        on_leader(&addrs, |c| match c.create_group(g) {
            Err(ClientError::Server {
                code: ErrorCode::GroupExists,
                ..
            }) => Ok(()),
            r => r,
        });
        for &u in &users {
            on_leader(&addrs, |c| c.join(g, u, JoinStart::Head));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = users
        .iter()
        .map(|&u| {
            let (addrs, stop, acked) = (addrs.clone(), stop.clone(), acked.clone());
            let seed = seed ^ u.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            std::thread::spawn(move || client(u, seed, addrs, stop, acked))
        })
        .collect();

    let mut faults = Vec::new();
    wait_progress(set, &acked, 20);
    for round in 0..plan.rounds {
        let kind = plan.kinds[round as usize % plan.kinds.len()];
        let lead = leader(set);
        let node = if round < plan.kinds.len() as u64 || rng.percent(50) {
            lead
        } else {
            IDS[rng.range((0, 2)) as usize]
        };
        let hold = Duration::from_millis(rng.range((200, 1200)));
        let mut to = None;
        match kind {
            Kind::Kill => {
                set.kill(node);
                std::thread::sleep(hold);
                set.restart(node);
            }
            Kind::Partition => {
                set.isolate(node);
                std::thread::sleep(hold);
                set.heal_all();
            }
            Kind::OneWay => {
                let others: Vec<u64> = IDS.into_iter().filter(|&i| i != node).collect();
                let peer = others[rng.range((0, 1)) as usize];
                to = Some(peer);
                set.cut_one_way(node, peer);
                std::thread::sleep(hold);
                set.heal_all();
            }
            Kind::Pause => {
                set.pause(node);
                std::thread::sleep(hold);
                set.resume(node);
            }
        }
        wait_progress(set, &acked, 20);
        faults.push(Fault { kind, node, to });
    }
    stop.store(true, Ordering::Release);
    let histories: Vec<Vec<Event>> = threads
        .into_iter()
        .map(|t| t.join().expect("client thread"))
        .collect();
    set.supervise();

    // The one order: each group's log read through the leader; after a
    // clean stop every replica must hold exactly it.
    let logs: Logs = GROUPS
        .iter()
        .map(|&g| {
            let records = read_all(&addrs, g, USER_BASE);
            (
                g,
                records
                    .into_iter()
                    .map(|r| {
                        assert_eq!(r.group, g);
                        (r.sender_id, r.client_msg_id, r.payload)
                    })
                    .collect(),
            )
        })
        .collect();
    let report = check(&users, &histories, &logs);
    let kinds: Vec<String> = plan
        .kinds
        .iter()
        .map(|&k| {
            let n = faults.iter().filter(|f| f.kind == k).count();
            format!("{n} {}", k.name())
        })
        .collect();
    let schedule: Vec<String> = faults
        .iter()
        .map(|f| match f.to {
            Some(to) => format!("{} {}>{to}", f.kind.name(), f.node),
            None => format!("{} {}", f.kind.name(), f.node),
        })
        .collect();
    eprintln!("history check: nemesis {}", schedule.join(", "));
    let exits = set.exits();
    eprintln!(
        "history check: seed {seed}, {} rounds ({}), {:.1} s; \
         {} operations; sends: {} acknowledged, {} refused, {} unknown, {} retransmits; \
         records stored {}; unknown sends stored {}; pulls {} ({} records checked); \
         processes that ended by themselves {exits:?}",
        plan.rounds,
        kinds.join(", "),
        began.elapsed().as_secs_f64(),
        report.operations,
        report.acked,
        report.refused,
        report.unknown,
        report.retransmits,
        logs.values().map(Vec::len).sum::<usize>(),
        report.unknown_stored,
        report.pulls,
        report.pulled_records,
    );
    assert!(report.acked > 0 && report.pulled_records > 0, "{report:?}");
    assert!(
        exits.iter().all(|&n| n == 0),
        "a member's process ended by itself (times per member: {exits:?}); a refused round restarts it in place"
    );
    let counts = stop_and_compare(set, &GROUPS);
    for (i, &g) in GROUPS.iter().enumerate() {
        assert_eq!(
            counts[i],
            logs[&g].len(),
            "group {g}: the dump holds the log read"
        );
    }
}

/// Per group, its final log: `(sender, client_msg_id, payload)` at
/// msg_id `index + 1`.
type Logs = HashMap<u64, Vec<(u64, u64, Vec<u8>)>>;

#[derive(Debug, Default)]
struct Report {
    operations: usize,
    acked: usize,
    refused: usize,
    unknown: usize,
    retransmits: usize,
    unknown_stored: usize,
    pulls: usize,
    pulled_records: usize,
}

/// The checker (module docs); panics naming the first violation.
fn check(users: &[u64], histories: &[Vec<Event>], logs: &Logs) -> Report {
    let mut report = Report::default();
    // Where each (sender, client_msg_id) is stored: (group, msg_id).
    let mut stored: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    for (&g, log) in logs {
        for (i, (sender, cmid, body)) in log.iter().enumerate() {
            let id = i as u64 + 1;
            assert!(
                stored.insert((*sender, *cmid), (g, id)).is_none(),
                "sender {sender} client_msg_id {cmid} stored twice (again at group {g} id {id})"
            );
            assert_eq!(body, &payload(*sender, *cmid), "group {g} id {id}: payload");
        }
    }
    // Every stored send was invoked (by its sender, to that group).
    let mut invoked: HashMap<(u64, u64), u64> = HashMap::new();
    for (&user, history) in users.iter().zip(histories) {
        for e in history {
            if let Op::Send { group, cmid, .. } = e.op {
                if let Some(g) = invoked.insert((user, cmid), group) {
                    assert_eq!(g, group, "a client_msg_id sent to two groups");
                    report.retransmits += 1;
                }
            }
        }
    }
    for (&(sender, cmid), &(g, id)) in &stored {
        assert_eq!(
            invoked.get(&(sender, cmid)),
            Some(&g),
            "group {g} id {id} holds sender {sender} client_msg_id {cmid}, never sent there"
        );
    }
    for (&user, history) in users.iter().zip(histories) {
        report.operations += history.len();
        // The acknowledged id of each client_msg_id (all the same).
        let mut acked: HashMap<u64, u64> = HashMap::new();
        let mut ever_ok: HashMap<u64, bool> = HashMap::new();
        // Per group, the last read and the event it came from.
        let mut last: HashMap<u64, (u64, u64, &Event)> = HashMap::new();
        for e in history {
            match &e.op {
                Op::Send { cmid, outcome, .. } => {
                    match outcome {
                        Outcome::Ok(id) => {
                            report.acked += 1;
                            ever_ok.insert(*cmid, true);
                            if let Some(prev) = acked.insert(*cmid, *id) {
                                assert_eq!(prev, *id, "user {user} client_msg_id {cmid} acknowledged as {prev} and {id}");
                            }
                        }
                        Outcome::Fail => report.refused += 1,
                        Outcome::Unknown => {
                            report.unknown += 1;
                            ever_ok.entry(*cmid).or_insert(false);
                        }
                    }
                }
                Op::Pull {
                    group,
                    ack_up_to,
                    outcome: Outcome::Ok(r),
                } => {
                    report.pulls += 1;
                    assert!(
                        r.cursor >= *ack_up_to,
                        "user {user} group {group}: cursor {} below the ACK {ack_up_to} of the same PULL",
                        r.cursor
                    );
                    for (k, &(id, sender, cmid)) in r.records.iter().enumerate() {
                        assert_eq!(
                            id,
                            r.cursor + 1 + k as u64,
                            "user {user} group {group}: a page is the records after the cursor"
                        );
                        let (s, c, _) = logs[group].get(id as usize - 1).unwrap_or_else(|| {
                            panic!(
                                "user {user} group {group}: pulled id {id} is not in the final log"
                            )
                        });
                        assert_eq!(
                            (*s, *c),
                            (sender, cmid),
                            "user {user} group {group} id {id}: pulled one send, the final log holds another"
                        );
                        report.pulled_records += 1;
                    }
                    check_read(user, *group, r, e, &mut last, logs);
                }
                Op::Unread {
                    outcome: Outcome::Ok(list),
                } => {
                    for (g, r) in list {
                        check_read(user, *g, r, e, &mut last, logs);
                    }
                }
                Op::Pull { .. } | Op::Unread { .. } => {}
            }
        }
        for (&cmid, &id) in &acked {
            let group = invoked[&(user, cmid)];
            assert_eq!(
                stored.get(&(user, cmid)),
                Some(&(group, id)),
                "user {user} client_msg_id {cmid} acknowledged as group {group} id {id}"
            );
        }
        report.unknown_stored += ever_ok
            .iter()
            .filter(|&(cmid, &ok)| !ok && stored.contains_key(&(user, *cmid)))
            .count();
    }
    report
}

/// One read of a group by `user`: cursor at most head, head at most the
/// final log's, and neither below the user's previous read of the group
/// (module docs).
fn check_read<'a>(
    user: u64,
    group: u64,
    r: &Read,
    e: &'a Event,
    last: &mut HashMap<u64, (u64, u64, &'a Event)>,
    logs: &Logs,
) {
    assert!(
        r.cursor <= r.head,
        "user {user} group {group}: cursor {} above head {}",
        r.cursor,
        r.head
    );
    assert!(
        r.head <= logs[&group].len() as u64,
        "user {user} group {group}: head {} above the final log's {}",
        r.head,
        logs[&group].len()
    );
    if let Some(&(cursor, head, prev)) = last.get(&group) {
        assert!(
            r.cursor >= cursor,
            "user {user} group {group}: cursor went back from {cursor} to {} (node {} then {})",
            r.cursor,
            prev.node,
            e.node
        );
        assert!(
            r.head >= head,
            "user {user} group {group}: head went back from {head} to {} (node {} then {})",
            r.head,
            prev.node,
            e.node
        );
    }
    last.insert(group, (r.cursor, r.head, e));
}
