//! W1-W4 of IM-bench v1 (design brief section 5) over the wire: setup,
//! the measured phase, and verification against the plan.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use serde_json::Map;

use super::conn::Conn;
use super::context::Ctx;
use super::driver::{run_phase, split, Job, Tally};
use super::plan::{self, W4Plan};
use super::progress::group_digits;
use super::report::Report;
use tidemark_protocol::{JoinStart, Request, Response};

/// One setup request; group and user ids before the `--id-base` offset.
#[derive(Clone, Copy, Debug)]
pub(crate) enum SetupOp {
    Create(u64),
    Join {
        group: u64,
        user: u64,
        start: JoinStart,
    },
    /// Message `i` of the plan (its sender, client_msg_id and payload).
    Send {
        group: u64,
        i: u64,
    },
}

/// Builds the SEND of message `i` of the plan; its sender is user
/// `base + sender_offset + plan::sender_of(i).0`.
pub(crate) fn send_request<'p>(
    base: u64,
    sender_offset: u64,
    group: u64,
    i: u64,
    payloads: &'p [Vec<u8>],
) -> Request<'p> {
    let (sender, client_msg_id) = plan::sender_of(i);
    Request::Send {
        group: base + group,
        sender: base + sender_offset + sender,
        client_msg_id,
        payload: &payloads[(i % payloads.len() as u64) as usize],
    }
}

/// Setup: the requests `gen(i)` for `i` in a range, each expected to succeed.
pub(crate) struct SetupJob<'a, G> {
    range: Range<u64>,
    gen: G,
    base: u64,
    payloads: &'a [Vec<u8>],
}

impl<G: FnMut(u64) -> SetupOp + Send> Job for SetupJob<'_, G> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let i = self.range.next()?;
        let req = match (self.gen)(i) {
            SetupOp::Create(g) => Request::CreateGroup {
                group: self.base + g,
            },
            SetupOp::Join { group, user, start } => Request::Join {
                group: self.base + group,
                user: self.base + user,
                start,
            },
            SetupOp::Send { group, i } => send_request(self.base, 0, group, i, self.payloads),
        };
        Some((i, req))
    }

    fn complete(&mut self, _tag: u64, resp: Response<'_>, t: &mut Tally) {
        if !t.check(&resp, "setup") {
            t.ops += 1;
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// The jobs of `n` setup requests `gen(i)`, split over `conns` connections.
pub(crate) fn setup_jobs<'a, G, F>(
    ctx: &Ctx<'a>,
    conns: usize,
    n: u64,
    make_gen: F,
) -> Vec<SetupJob<'a, G>>
where
    F: Fn() -> G,
    G: FnMut(u64) -> SetupOp + Send,
{
    split(n, conns)
        .into_iter()
        .map(|range| SetupJob {
            range,
            gen: make_gen(),
            base: ctx.base,
            payloads: ctx.payloads,
        })
        .collect()
}

/// Runs `n` setup requests split over the connections; fails on any error.
/// Returns the seconds it took.
pub(crate) fn setup<G, F>(
    ctx: &Ctx<'_>,
    conns: &mut [Conn],
    label: &str,
    unit: &str,
    n: u64,
    make_gen: F,
) -> Result<f64, String>
where
    F: Fn() -> G,
    G: FnMut(u64) -> SetupOp + Send,
{
    let jobs = setup_jobs(ctx, conns.len(), n, make_gen);
    let r = run_phase(conns, jobs, &ctx.setup_phase(label, unit))?;
    if r.tally.errors > 0 {
        return Err(format!(
            "{label}: {} requests failed, e.g. {}",
            r.tally.errors,
            r.tally.error_samples.join("; ")
        ));
    }
    Ok(r.elapsed.as_secs_f64())
}

/// The node's counters (STATS).
pub(crate) fn node_stats(conn: &mut Conn) -> Result<HashMap<String, u64>, String> {
    let mut out = HashMap::new();
    conn.call(&Request::Stats, &mut |r| {
        if let Response::Stats(list) = r {
            out = list.iter().map(|s| (s.name.to_string(), s.value)).collect();
        }
    })?;
    Ok(out)
}

pub(crate) fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, k: &str) -> u64 {
    after
        .get(k)
        .copied()
        .unwrap_or(0)
        .saturating_sub(before.get(k).copied().unwrap_or(0))
}

// ---------------------------------------------------------------- W1

pub(crate) struct W1Job<'a> {
    pub range: Range<u64>,
    /// Seed of the group choice (`plan::w1_group`).
    pub seed: u64,
    pub groups: u64,
    pub base: u64,
    /// Added to every sender id (see `send_request`).
    pub sender_offset: u64,
    pub payloads: &'a [Vec<u8>],
    pub size: u64,
    /// `(group, msg_id)` of every accepted send.
    pub got: Vec<(u32, u64)>,
    pub duplicates: u64,
}

impl Job for W1Job<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let i = self.range.next()?;
        let g = plan::w1_group(self.seed, self.groups, i);
        Some((
            g,
            send_request(self.base, self.sender_offset, g, i, self.payloads),
        ))
    }

    fn complete(&mut self, group: u64, resp: Response<'_>, t: &mut Tally) {
        if let Some((msg_id, duplicate)) = t.sent(&resp, self.size) {
            self.got.push((group as u32, msg_id));
            self.duplicates += u64::from(duplicate);
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// W1 append: `messages` sends to `groups` groups, group uniform at random.
pub(crate) fn w1(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let groups = a.groups.unwrap_or(10_000).max(1);
    let messages = a.messages.unwrap_or(1_000_000);
    if groups > u64::from(u32::MAX) {
        return Err("w1: at most 2^32 - 1 groups".into());
    }
    let mut params = Map::new();
    params.insert("groups".into(), groups.into());
    params.insert("messages".into(), messages.into());
    let mut rep = Report::new(
        ctx,
        "w1",
        format!(
            "W1 append: {} messages to {} groups (uniform), {} connections x {} in flight, {}-byte payloads, fsync {}",
            group_digits(messages),
            group_digits(groups),
            a.connections,
            a.in_flight,
            a.size,
            ctx.fsync
        ),
        params,
        "sends",
    );
    let mut conns = ctx.connect(a.connections)?;
    let t = setup(ctx, &mut conns, "w1 setup", "groups", groups, || {
        |i| SetupOp::Create(i + 1)
    })?;
    rep.setup
        .push((format!("{} groups created", group_digits(groups)), t));

    let before = node_stats(&mut conns[0])?;
    let jobs: Vec<_> = split(messages, conns.len())
        .into_iter()
        .map(|range| W1Job {
            got: Vec::with_capacity((range.end - range.start).min(1 << 20) as usize),
            range,
            seed: a.seed,
            groups,
            base: ctx.base,
            sender_offset: 0,
            payloads: ctx.payloads,
            size: a.size as u64,
            duplicates: 0,
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.measured_phase("w1", "sends"))?;
    let after = node_stats(&mut conns[0])?;

    let mut ids: Vec<Vec<u64>> = vec![Vec::new(); groups as usize];
    let mut duplicates = 0;
    for j in &r.jobs {
        duplicates += j.duplicates;
        for &(g, id) in &j.got {
            ids[(g - 1) as usize].push(id);
        }
    }
    let mut bad = None;
    let mut stored = 0u64;
    for (g, v) in ids.iter_mut().enumerate() {
        v.sort_unstable();
        stored += v.len() as u64;
        if bad.is_none() {
            if let Some((k, &id)) = v.iter().enumerate().find(|&(k, &id)| id != k as u64 + 1) {
                bad = Some(format!(
                    "group {}: the {}th id acknowledged is {id}",
                    g + 1,
                    k + 1
                ));
            }
        }
    }
    rep.verified = bad.is_none() && duplicates == 0 && r.tally.errors == 0;
    rep.verification = match bad {
        Some(b) => format!("ids not dense: {b}"),
        None if duplicates > 0 => format!("{duplicates} sends answered as duplicates"),
        None => format!(
            "ids dense: every group's acknowledged ids are exactly 1..=n ({} ids in {} groups)",
            group_digits(stored),
            group_digits(groups)
        ),
    };
    let rounds = delta(&before, &after, "engine.commit_rounds");
    let appends = delta(&before, &after, "engine.appends");
    rep.extra.insert(
        "commit".into(),
        format!(
            "{} appends in {} commit rounds ({:.1} a round), {} fsyncs",
            group_digits(appends),
            group_digits(rounds),
            appends as f64 / rounds.max(1) as f64,
            group_digits(delta(&before, &after, "engine.fsyncs"))
        )
        .into(),
    );
    rep.tally = r.tally;
    rep.measured_secs = r.elapsed.as_secs_f64();
    rep.cut_short = r.cut_short;
    Ok(rep)
}

// ---------------------------------------------------------------- W2

#[derive(Clone, Copy)]
struct Member {
    user: u64,
    /// The cursor the member started at.
    start: u64,
    /// Last id received.
    last: u64,
    /// True once a page said nothing more is above it.
    read_all: bool,
    /// True once the last page is acknowledged (or the member failed).
    done: bool,
}

struct W2Job {
    group: u64,
    page: u32,
    messages: u64,
    window: usize,
    /// Members (user ids before the offset) this connection serves.
    users: Vec<u64>,
    seed: u64,
    base: u64,
    members: Vec<Member>,
    /// Members (indexes into `members`) with no request in flight.
    ready: VecDeque<usize>,
    active: usize,
    pages: u64,
    /// Description of the first inconsistency seen.
    fault: Option<String>,
}

impl W2Job {
    fn fail(&mut self, what: String) {
        if self.fault.is_none() {
            self.fault = Some(what);
        }
    }

    fn finish(&mut self, i: usize) {
        self.members[i].done = true;
        self.active -= 1;
    }
}

impl Job for W2Job {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let i = match self.ready.pop_front() {
            Some(i) => i,
            None if self.members.len() < self.users.len() && self.active < self.window => {
                let u = self.users[self.members.len()];
                let start = plan::w2_cursor(self.seed, self.messages, u);
                self.members.push(Member {
                    user: self.base + u,
                    start,
                    last: start,
                    read_all: false,
                    done: false,
                });
                self.active += 1;
                self.members.len() - 1
            }
            None => return None,
        };
        let m = self.members[i];
        let req = if m.read_all {
            Request::Ack {
                group: self.group,
                user: m.user,
                msg_id: m.last,
            }
        } else {
            Request::Pull {
                group: self.group,
                user: m.user,
                // The request for the next page ACKs the previous one.
                ack_up_to: if m.last > m.start { m.last } else { 0 },
                max_count: self.page,
                max_bytes: u32::MAX,
                wait_ms: 0,
            }
        };
        Some((i as u64, req))
    }

    fn complete(&mut self, tag: u64, resp: Response<'_>, t: &mut Tally) {
        let i = tag as usize;
        let m = self.members[i];
        match resp {
            Response::Pull {
                cursor,
                head,
                has_more,
                records,
            } => {
                self.pages += 1;
                if cursor != m.last {
                    self.fail(format!(
                        "user {}: cursor {cursor} after acking {}",
                        m.user, m.last
                    ));
                }
                let (last, stray) = t.take_dense(&records, m.last, "PULL records");
                if let Some(id) = stray {
                    self.fail(format!("user {}: got id {id} after {last}", m.user));
                }
                if head != self.messages {
                    self.fail(format!("head {head}, expected {}", self.messages));
                }
                self.members[i].last = last;
                if !has_more || last >= head {
                    self.members[i].read_all = true;
                }
                if self.members[i].read_all && last == m.start {
                    // Nothing to acknowledge (an empty backlog).
                    self.finish(i);
                } else {
                    self.ready.push_back(i);
                }
            }
            Response::Ack { cursor } => {
                if cursor != m.last {
                    self.fail(format!(
                        "user {}: cursor {cursor} after ACK {}",
                        m.user, m.last
                    ));
                }
                self.finish(i);
            }
            r => {
                t.unexpected(&r, "W2");
                self.finish(i);
            }
        }
    }

    fn finished(&self) -> bool {
        self.members.len() == self.users.len() && self.active == 0
    }
}

/// W2's and W3's setup: group 1 with `messages` messages stored and
/// users `1..=members` joined at `start(user)`; one setup line in `rep`,
/// ending in `joined`.
// One argument per part of the setup.
#[allow(clippy::too_many_arguments)]
pub(crate) fn one_group_setup(
    ctx: &Ctx<'_>,
    conns: &mut [Conn],
    rep: &mut Report,
    label: &str,
    messages: u64,
    members: u64,
    start: impl Fn(u64) -> JoinStart + Sync,
    joined: &str,
) -> Result<(), String> {
    let t0 = setup(ctx, conns, label, "groups", 1, || |_| SetupOp::Create(1))?;
    let t1 = setup(ctx, conns, label, "sends", messages, || {
        |i| SetupOp::Send { group: 1, i }
    })?;
    let start = &start;
    let t2 = setup(ctx, conns, label, "joins", members, || {
        move |i| SetupOp::Join {
            group: 1,
            user: i + 1,
            start: start(i + 1),
        }
    })?;
    rep.setup.push((
        format!(
            "1 group, {} messages stored, {} members joined{joined}",
            group_digits(messages),
            group_digits(members)
        ),
        t0 + t1 + t2,
    ));
    Ok(())
}

/// W2 fan-out pull: one group, `members` members with cursors in the top
/// tenth of `messages` stored messages; each pulls everything above its
/// cursor in pages, every page ACKing the previous, and ACKs the last.
pub(crate) fn w2(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let members = a.members.unwrap_or(2_000);
    let messages = a.messages.unwrap_or(100_000).max(1);
    let mut params = Map::new();
    params.insert("members".into(), members.into());
    params.insert("messages".into(), messages.into());
    params.insert("page".into(), a.page.into());
    let mut rep = Report::new(
        ctx,
        "w2",
        format!(
            "W2 fan-out pull: 1 group, {} members, {} stored messages, cursors in [{}, {}), pages of {}, {} connections x {} in flight",
            group_digits(members),
            group_digits(messages),
            group_digits(messages - messages / 10),
            group_digits(messages),
            a.page,
            a.connections,
            a.in_flight
        ),
        params,
        "deliveries",
    );
    let mut conns = ctx.connect(a.connections)?;
    one_group_setup(
        ctx,
        &mut conns,
        &mut rep,
        "w2 setup",
        messages,
        members,
        |user| JoinStart::At(plan::w2_cursor(a.seed, messages, user)),
        "",
    )?;

    let c = conns.len();
    let jobs: Vec<_> = (0..c)
        .map(|k| W2Job {
            group: ctx.base + 1,
            page: a.page.max(1),
            messages,
            window: a.in_flight,
            users: (1..=members)
                .filter(|u| (u % c as u64) as usize == k)
                .collect(),
            seed: a.seed,
            base: ctx.base,
            members: Vec::new(),
            ready: VecDeque::new(),
            active: 0,
            pages: 0,
            fault: None,
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.measured_phase("w2", "deliveries"))?;
    let expected = plan::w2_expected(a.seed, messages, members);
    let fault = r.jobs.iter().find_map(|j| j.fault.clone());
    let done: usize = r
        .jobs
        .iter()
        .map(|j| {
            j.members
                .iter()
                .filter(|m| m.done && m.last == messages)
                .count()
        })
        .sum();
    let pages: u64 = r.jobs.iter().map(|j| j.pages).sum();
    let delivered = r.tally.ops;
    rep.verified = fault.is_none() && r.tally.errors == 0 && {
        if r.cut_short {
            delivered <= expected
        } else {
            delivered == expected && done as u64 == members
        }
    };
    rep.verification = match fault {
        Some(f) => f,
        None if r.cut_short => format!(
            "partial (--duration): delivered {} of {} expected, {} of {} members read and ACKed to the head; every page dense",
            group_digits(delivered),
            group_digits(expected),
            done,
            members
        ),
        None => format!(
            "delivered {} == sum over members of (head - cursor) = {}; {} of {} members ACKed to the head",
            group_digits(delivered),
            group_digits(expected),
            done,
            members
        ),
    };
    rep.extra.insert("pages".into(), pages.into());
    rep.tally = r.tally;
    rep.measured_secs = r.elapsed.as_secs_f64();
    rep.cut_short = r.cut_short;
    Ok(rep)
}

// ---------------------------------------------------------------- W3

pub(crate) struct W3Job {
    pub group: u64,
    pub base: u64,
    /// (member, target) ACKs, in order.
    pub acks: Vec<(u64, u64)>,
    pub pos: usize,
    /// The first ACK whose answer was not its target.
    pub fault: Option<String>,
}

impl Job for W3Job {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let &(m, to) = self.acks.get(self.pos)?;
        self.pos += 1;
        Some((
            to,
            Request::Ack {
                group: self.group,
                user: self.base + m,
                msg_id: to,
            },
        ))
    }

    fn complete(&mut self, to: u64, resp: Response<'_>, t: &mut Tally) {
        match resp {
            // Acks of one member go in order on one connection, so the
            // cursor after each is exactly its target.
            Response::Ack { cursor } if cursor == to => t.ops += 1,
            Response::Ack { cursor } => {
                t.ops += 1;
                if self.fault.is_none() {
                    self.fault = Some(format!("cursor {cursor} after ACK to {to}"));
                }
            }
            r => {
                t.unexpected(&r, "ACK");
            }
        }
    }

    fn finished(&self) -> bool {
        self.pos >= self.acks.len()
    }
}

/// Reads cursors back with UNREAD: `(user, group) -> cursor` of the users asked.
struct CursorReadJob {
    users: Range<u64>,
    base: u64,
    cursors: Vec<(u64, Vec<(u64, u64)>)>,
}

impl Job for CursorReadJob {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let u = self.users.next()?;
        Some((
            u,
            Request::Unread {
                user: self.base + u,
            },
        ))
    }

    fn complete(&mut self, u: u64, resp: Response<'_>, t: &mut Tally) {
        match resp {
            Response::Unread(list) => {
                t.ops += 1;
                self.cursors
                    .push((u, list.iter().map(|e| (e.group, e.cursor)).collect()));
            }
            r => {
                t.unexpected(&r, "UNREAD");
            }
        }
    }

    fn finished(&self) -> bool {
        self.users.is_empty()
    }
}

/// W3 ACK storm: one group of `members` members, `ops` single ACKs, each
/// moving a random member's cursor forward (the ACKs of one member travel
/// on one connection, in order).
pub(crate) fn w3(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let members = a.members.unwrap_or(100_000).max(1);
    let messages = a.messages.unwrap_or(1_000).max(1);
    let acks = a.ops.unwrap_or(1_000_000);
    let mut params = Map::new();
    params.insert("members".into(), members.into());
    params.insert("messages".into(), messages.into());
    params.insert("acks".into(), acks.into());
    let mut rep = Report::new(
        ctx,
        "w3",
        format!(
            "W3 ACK storm: 1 group, {} members, {} single ACKs (each moves a cursor forward by 1..={}, head {}), {} connections x {} in flight",
            group_digits(members),
            group_digits(acks),
            plan::W3_STEP_MAX,
            group_digits(messages),
            a.connections,
            a.in_flight
        ),
        params,
        "acks",
    );
    let mut conns = ctx.connect(a.connections)?;
    one_group_setup(
        ctx,
        &mut conns,
        &mut rep,
        "w3 setup",
        messages,
        members,
        |_| JoinStart::At(0),
        " at cursor 0",
    )?;
    let (moves, model) = plan::w3_acks(a.seed, members, messages, acks);
    let c = conns.len() as u64;
    let mut per_conn: Vec<Vec<(u64, u64)>> = vec![Vec::new(); c as usize];
    for &(m, to) in &moves {
        per_conn[(m % c) as usize].push((m, to));
    }
    drop(moves);
    let jobs: Vec<_> = per_conn
        .into_iter()
        .map(|acks| W3Job {
            group: ctx.base + 1,
            base: ctx.base,
            acks,
            pos: 0,
            fault: None,
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.measured_phase("w3", "acks"))?;

    // Read every cursor back.
    let jobs: Vec<_> = split(members, conns.len())
        .into_iter()
        .map(|range| CursorReadJob {
            users: (range.start + 1)..(range.end + 1),
            base: ctx.base,
            cursors: Vec::new(),
        })
        .collect();
    let back = run_phase(&mut conns, jobs, &ctx.setup_phase("w3 verify", "cursors"))?;
    let fault = r.jobs.iter().find_map(|j| j.fault.clone());
    let mut mismatch = None;
    let mut checked = 0u64;
    // With --duration the model is what was sent: replay the sent prefix
    // of each connection's list.
    let mut sent_model = vec![0u64; members as usize];
    for j in &r.jobs {
        for &(m, to) in &j.acks[..j.pos] {
            sent_model[(m - 1) as usize] = to;
        }
    }
    if !r.cut_short && sent_model != model {
        mismatch = Some("the ACKs sent do not replay to the plan's cursors".to_string());
    }
    for j in &back.jobs {
        for (u, list) in &j.cursors {
            checked += 1;
            let want = sent_model[(u - 1) as usize];
            let got = list.first().map(|&(_, c)| c);
            if list.len() != 1 || got != Some(want) {
                mismatch.get_or_insert_with(|| {
                    format!(
                        "user {u}: cursor {got:?}, model {want} ({} groups)",
                        list.len()
                    )
                });
            }
        }
    }
    rep.verified = fault.is_none()
        && mismatch.is_none()
        && checked == members
        && r.tally.errors == 0
        && back.tally.errors == 0;
    rep.verification = match (fault, mismatch) {
        (Some(f), _) | (None, Some(f)) => f,
        _ if checked != members => format!("read back {checked} of {members} cursors"),
        _ => format!(
            "all {} cursors read back with UNREAD equal the model (cursors moved by {} ids in total)",
            group_digits(members),
            group_digits(sent_model.iter().sum())
        ),
    };
    rep.setup.push((
        "verify: cursors read back".into(),
        back.elapsed.as_secs_f64(),
    ));
    rep.tally = r.tally;
    rep.measured_secs = r.elapsed.as_secs_f64();
    rep.cut_short = r.cut_short;
    Ok(rep)
}

// ---------------------------------------------------------------- W4

/// A fingerprint of an UNREAD answer: count, unread total and a hash of
/// `(group, cursor, head)`, compared with the model's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fingerprint {
    groups: u64,
    unread: u64,
    hash: u64,
}

fn fingerprint(entries: impl Iterator<Item = (u64, u64, u64)>) -> Fingerprint {
    let mut f = Fingerprint {
        groups: 0,
        unread: 0,
        hash: 0,
    };
    for (g, cursor, head) in entries {
        f.groups += 1;
        f.unread += head.saturating_sub(cursor);
        f.hash = f.hash.wrapping_add(plan::hash(g, cursor, head));
    }
    f
}

struct W4Job<'a> {
    range: Range<u64>,
    users: &'a [u64],
    base: u64,
    expect: &'a [Fingerprint],
    unread_total: u64,
    fault: Option<String>,
}

impl Job for W4Job<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let i = self.range.next()?;
        Some((
            i,
            Request::Unread {
                user: self.base + self.users[i as usize],
            },
        ))
    }

    fn complete(&mut self, i: u64, resp: Response<'_>, t: &mut Tally) {
        match resp {
            Response::Unread(list) => {
                t.ops += 1;
                let base = self.base;
                let f = fingerprint(
                    list.iter()
                        .map(|e| (e.group.wrapping_sub(base), e.cursor, e.head)),
                );
                self.unread_total += f.unread;
                if f != self.expect[i as usize] && self.fault.is_none() {
                    self.fault = Some(format!(
                        "user {}: {} groups, {} unread; the model has {} groups, {} unread",
                        self.users[i as usize],
                        f.groups,
                        f.unread,
                        self.expect[i as usize].groups,
                        self.expect[i as usize].unread
                    ));
                }
            }
            r => {
                t.unexpected(&r, "UNREAD");
            }
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// W4 unread: `members` users, each in `groups_per_user` of `groups`
/// groups at a random cursor, `messages` messages; `ops` UNREAD queries of
/// random users.
pub(crate) fn w4(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let p = W4Plan {
        seed: a.seed,
        users: a.members.unwrap_or(100_000).max(1),
        groups: a.groups.unwrap_or(10_000).max(1),
        per_user: a.groups_per_user.max(1),
        messages: a.messages.unwrap_or(1_000_000),
    };
    let queries = a.ops.unwrap_or(100_000);
    let per_user = p.per_user.min(p.groups);
    let mut params = Map::new();
    params.insert("users".into(), p.users.into());
    params.insert("groups".into(), p.groups.into());
    params.insert("groups_per_user".into(), per_user.into());
    params.insert("messages".into(), p.messages.into());
    params.insert("queries".into(), queries.into());
    let mut rep = Report::new(
        ctx,
        "w4",
        format!(
            "W4 unread: {} users x {} of {} groups ({} memberships), {} messages, {} UNREAD queries of random users, {} connections x {} in flight",
            group_digits(p.users),
            per_user,
            group_digits(p.groups),
            group_digits(p.users * per_user),
            group_digits(p.messages),
            group_digits(queries),
            a.connections,
            a.in_flight
        ),
        params,
        "queries",
    );
    let heads = p.heads();
    let mut conns = ctx.connect(a.connections)?;
    let t0 = setup(ctx, &mut conns, "w4 setup", "groups", p.groups, || {
        |i| SetupOp::Create(i + 1)
    })?;
    let t1 = setup(ctx, &mut conns, "w4 setup", "sends", p.messages, || {
        |i| SetupOp::Send {
            group: p.message_group(i),
            i,
        }
    })?;
    let t2 = setup(
        ctx,
        &mut conns,
        "w4 setup",
        "joins",
        p.users * per_user,
        || {
            let (p, heads) = (&p, &heads);
            let mut cache: (u64, Vec<(u64, u64)>) = (0, Vec::new());
            move |k| {
                let u = 1 + k / per_user;
                if cache.0 != u {
                    cache = (u, p.user_groups(u, heads));
                }
                let (g, c) = cache.1[(k % per_user) as usize];
                SetupOp::Join {
                    group: g,
                    user: u,
                    start: JoinStart::At(c),
                }
            }
        },
    )?;
    rep.setup
        .push((format!("{} groups created", group_digits(p.groups)), t0));
    rep.setup
        .push((format!("{} messages stored", group_digits(p.messages)), t1));
    rep.setup.push((
        format!(
            "{} memberships joined at random cursors",
            group_digits(p.users * per_user)
        ),
        t2,
    ));

    let users: Vec<u64> = (0..queries).map(|i| p.query_user(i)).collect();
    let expect: Vec<Fingerprint> = users
        .iter()
        .map(|&u| {
            fingerprint(
                p.user_groups(u, &heads)
                    .into_iter()
                    .map(|(g, c)| (g, c, heads[(g - 1) as usize])),
            )
        })
        .collect();
    let jobs: Vec<_> = split(queries, conns.len())
        .into_iter()
        .map(|range| W4Job {
            range,
            users: &users,
            base: ctx.base,
            expect: &expect,
            unread_total: 0,
            fault: None,
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.measured_phase("w4", "queries"))?;
    let fault = r.jobs.iter().find_map(|j| j.fault.clone());
    let total: u64 = r.jobs.iter().map(|j| j.unread_total).sum();
    rep.verified = fault.is_none() && r.tally.errors == 0;
    rep.verification = fault.unwrap_or_else(|| {
        format!(
            "all {} answers match the model: {per_user} groups each, heads, cursors and unread counts (unread total {})",
            group_digits(r.tally.ops),
            group_digits(total)
        )
    });
    rep.tally = r.tally;
    rep.measured_secs = r.elapsed.as_secs_f64();
    rep.cut_short = r.cut_short;
    Ok(rep)
}
