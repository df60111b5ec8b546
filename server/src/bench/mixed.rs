//! The mixed workload: what a gateway sees. Group sizes are Zipf
//! distributed (exponent 1) from 2 to `--group-size-max` members; a
//! fraction of the users is online, subscribed (SUBSCRIBE USER) on a few
//! gateway connections; senders send to random groups; afterwards a sample
//! of offline users catches up with SYNC (then PULL for longer backlogs)
//! and acknowledges everything with one BATCH_ACK each.
//!
//! Verified: every gateway's view of every group it serves (pushes, plus
//! HISTORY for any gap a dropped push left) is exactly 1..=head, so no online
//! member misses a message; every catching-up user receives exactly the
//! messages of its groups, densely, and its BATCH_ACK leaves every cursor
//! at the head.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Map};

use super::conn::Conn;
use super::context::Ctx;
use super::driver::{run_phase, split, Job, Tally};
use super::plan::{self, Zipf};
use super::progress::group_digits;
use super::report::Report;
use super::workloads::{setup, SetupOp, W1Job};
use tidemark_protocol::{AckItem, JoinStart, Request, Response, ResyncScope, Subscription};

/// How long gateways wait for the last pushes once the sends are done.
const PUSH_DRAIN_MAX: Duration = Duration::from_secs(10);
/// SYNC's byte budget per response.
const SYNC_BYTES_MAX: u32 = 1 << 20;

/// The population: groups with their members, users with their groups.
struct Population {
    /// Members of group `g` at index `g - 1`.
    members: Vec<Vec<u64>>,
    /// Groups of user `u` at index `u - 1`.
    groups_of: Vec<Vec<u64>>,
    online: Vec<bool>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn population(seed: u64, users: u64, groups: u64, size_max: u64, online: f64) -> Population {
    let mut rng = plan::mixed_rng(seed);
    let zipf = Zipf::new(2, size_max.min(users).max(2), 1.0);
    let mut members = Vec::with_capacity(groups as usize);
    let mut groups_of = vec![Vec::new(); users as usize];
    for g in 1..=groups {
        let size = zipf.sample(&mut rng).min(users);
        // Distinct members: an arithmetic progression modulo `users` with a
        // step coprime to it.
        let start = rng.below(users);
        let mut step = 1 + rng.below(users);
        while gcd(step, users) != 1 {
            step = 1 + rng.below(users);
        }
        let list: Vec<u64> = (0..size).map(|k| 1 + (start + k * step) % users).collect();
        for &u in &list {
            groups_of[(u - 1) as usize].push(g);
        }
        members.push(list);
    }
    let online = (0..users).map(|_| rng.unit() < online).collect();
    Population {
        members,
        groups_of,
        online,
    }
}

/// One gateway's view of one group.
#[derive(Clone, Default)]
struct View {
    /// Online members of the group behind this gateway.
    online: u64,
    /// One of them (HISTORY needs a member).
    member: u64,
    /// Next id expected by push.
    next: u64,
    /// Ranges `[a, b]` that pushes skipped.
    missing: Vec<(u64, u64)>,
}

struct GatewayOutcome {
    push_frames: u64,
    push_records: u64,
    member_deliveries: u64,
    resyncs: u64,
    filled: u64,
    delay_us: Histogram<u64>,
    fault: Option<String>,
    groups_served: u64,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A gateway: reads pushes until the heads are known and reached (or
/// `PUSH_DRAIN_MAX` passed), then fills gaps with HISTORY and checks.
fn gateway(
    conn: &mut Conn,
    base: u64,
    mut views: Vec<View>,
    heads: &Mutex<Option<Vec<u64>>>,
    page: u32,
) -> Result<GatewayOutcome, String> {
    let mut out = GatewayOutcome {
        push_frames: 0,
        push_records: 0,
        member_deliveries: 0,
        resyncs: 0,
        filled: 0,
        delay_us: Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .expect("invariant: constant histogram bounds are valid"),
        fault: None,
        groups_served: views.iter().filter(|v| v.online > 0).count() as u64,
    };
    let mut heads_known: Option<(Vec<u64>, Instant)> = None;
    loop {
        if heads_known.is_none() {
            if let Ok(h) = heads.lock() {
                if let Some(h) = h.as_ref() {
                    heads_known = Some((h.clone(), Instant::now()));
                }
            }
        }
        if let Some((h, since)) = &heads_known {
            let reached = views
                .iter()
                .zip(h)
                .all(|(v, &head)| v.online == 0 || v.next > head);
            if reached || since.elapsed() > PUSH_DRAIN_MAX {
                break;
            }
        }
        let mut fault = None;
        conn.read_within(Duration::from_millis(50), &mut |id, resp| match resp {
            Response::Push { group, records } if id == 0 => {
                let g = group.wrapping_sub(base);
                let Some(v) = views.get_mut((g as usize).wrapping_sub(1)) else {
                    fault = Some(format!("push of unknown group {group}"));
                    return;
                };
                out.push_frames += 1;
                let now = now_us();
                for r in records.iter(true) {
                    let r = match r {
                        Ok(r) => r,
                        Err(e) => {
                            fault = Some(format!("push records: {e}"));
                            return;
                        }
                    };
                    let id = r.msg_id();
                    if id < v.next {
                        continue; // overlap: dedup by msg_id
                    }
                    if id > v.next {
                        v.missing.push((v.next, id - 1));
                    }
                    v.next = id + 1;
                    out.push_records += 1;
                    out.member_deliveries += v.online;
                    let _ = out
                        .delay_us
                        .record(now.saturating_sub(r.timestamp_ms() * 1000).max(1));
                }
            }
            Response::Resync(scope) => {
                out.resyncs += 1;
                if scope == ResyncScope::All {
                    fault = Some("the node cancelled the subscription (RESYNC all)".into());
                }
            }
            Response::Error(e) => fault = Some(format!("{:?}: {}", e.code, e.message)),
            _ => {}
        })?;
        if let Some(f) = fault {
            return Err(format!("gateway: {f}"));
        }
    }
    let heads = heads_known.map(|(h, _)| h).unwrap_or_default();
    // Whatever pushes did not bring (dropped, or not yet arrived) is read
    // with HISTORY: push is an optimisation, pull is the truth.
    for (i, v) in views.iter_mut().enumerate() {
        if v.online == 0 {
            continue;
        }
        let head = heads.get(i).copied().unwrap_or(0);
        if v.next <= head {
            v.missing.push((v.next, head));
            v.next = head + 1;
        }
        let group = base + i as u64 + 1;
        for (a, b) in std::mem::take(&mut v.missing) {
            let mut want = a; // the next id the fill must produce, ascending
            let mut before = b + 1;
            let mut got: Vec<u64> = Vec::new();
            while before > a {
                let count = (before - a).min(u64::from(page)) as u32;
                let mut page_ids = Vec::new();
                let mut err = None;
                conn.call(
                    &Request::History {
                        group,
                        user: base + v.member,
                        before_msg_id: before,
                        max_count: count,
                    },
                    &mut |r| match r {
                        Response::History { records, .. } => {
                            for r in records.iter(true) {
                                match r {
                                    Ok(r) => page_ids.push(r.msg_id()),
                                    Err(e) => err = Some(format!("history records: {e}")),
                                }
                            }
                        }
                        Response::Error(e) => {
                            err = Some(format!("HISTORY: {:?}: {}", e.code, e.message))
                        }
                        _ => err = Some("unexpected answer to HISTORY".into()),
                    },
                )?;
                if let Some(e) = err {
                    return Err(format!("gateway: {e}"));
                }
                let Some(&oldest) = page_ids.last() else {
                    break;
                };
                before = oldest;
                got.extend(page_ids);
            }
            got.sort_unstable();
            for id in got {
                if id == want {
                    want += 1;
                    out.filled += 1;
                    out.member_deliveries += v.online;
                }
            }
            if want != b + 1 && out.fault.is_none() {
                out.fault = Some(format!(
                    "group {group}: ids {want}..={b} neither pushed nor in HISTORY"
                ));
            }
        }
    }
    Ok(out)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Sync,
    Pull,
    Ack,
    Done,
}

struct CatchUser {
    user: u64,
    stage: Stage,
    continuation: u64,
    /// Groups whose backlog is longer than the SYNC page: `(group, last id)`.
    pulls: VecDeque<(u64, u64)>,
    acks: Vec<(u64, u64)>,
    delivered: u64,
    /// `(group, head)` as SYNC reported them, to explain a mismatch.
    seen: Vec<(u64, u64)>,
}

struct CatchUpJob<'a> {
    users: Vec<u64>,
    base: u64,
    page: u32,
    window: usize,
    heads: &'a [u64],
    groups_of: &'a [Vec<u64>],
    state: Vec<CatchUser>,
    ready: VecDeque<usize>,
    active: usize,
    sync_requests: u64,
    pull_requests: u64,
    acked_groups: u64,
    fault: Option<String>,
}

impl CatchUpJob<'_> {
    fn fail(&mut self, what: String) {
        if self.fault.is_none() {
            self.fault = Some(what);
        }
    }

    /// Takes a page of `group`'s records starting above `last`.
    fn take(
        &mut self,
        group: u64,
        last: u64,
        records: &tidemark_protocol::Records<'_>,
        t: &mut Tally,
    ) -> u64 {
        let (last, stray) = t.take_dense(records, last, "records");
        if let Some(id) = stray {
            self.fail(format!("group {group}: id {id} after {last}"));
        }
        last
    }

    fn advance(&mut self, i: usize) {
        let s = &mut self.state[i];
        if s.stage == Stage::Pull && s.pulls.is_empty() {
            s.stage = Stage::Ack;
        }
        if s.stage == Stage::Ack && s.acks.is_empty() {
            s.stage = Stage::Done;
        }
        if s.stage == Stage::Done {
            self.active -= 1;
        } else {
            self.ready.push_back(i);
        }
    }
}

impl Job for CatchUpJob<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let i = match self.ready.pop_front() {
            Some(i) => i,
            None if self.state.len() < self.users.len() && self.active < self.window => {
                self.state.push(CatchUser {
                    user: self.users[self.state.len()],
                    stage: Stage::Sync,
                    continuation: 0,
                    pulls: VecDeque::new(),
                    acks: Vec::new(),
                    delivered: 0,
                    seen: Vec::new(),
                });
                self.active += 1;
                self.state.len() - 1
            }
            None => return None,
        };
        let s = &self.state[i];
        let user = self.base + s.user;
        let req = match s.stage {
            Stage::Sync => {
                self.sync_requests += 1;
                Request::Sync {
                    user,
                    per_group_max: self.page,
                    total_max_bytes: SYNC_BYTES_MAX,
                    continuation: s.continuation,
                }
            }
            Stage::Pull => {
                self.pull_requests += 1;
                let (group, last) = s.pulls.front().copied().unwrap_or((0, 0));
                Request::Pull {
                    group: self.base + group,
                    user,
                    ack_up_to: last,
                    max_count: self.page,
                    max_bytes: u32::MAX,
                    wait_ms: 0,
                }
            }
            Stage::Ack | Stage::Done => Request::BatchAck {
                user,
                items: s
                    .acks
                    .iter()
                    .map(|&(g, m)| AckItem {
                        group: self.base + g,
                        msg_id: m,
                    })
                    .collect(),
            },
        };
        Some((i as u64, req))
    }

    fn complete(&mut self, tag: u64, resp: Response<'_>, t: &mut Tally) {
        let i = tag as usize;
        let base = self.base;
        match resp {
            Response::Sync {
                next_continuation,
                groups,
            } => {
                for g in &groups {
                    let group = g.entry.group.wrapping_sub(base);
                    let last = self.take(group, g.entry.cursor, &g.records, t);
                    let s = &mut self.state[i];
                    s.seen.push((group, g.entry.head));
                    s.delivered += last - g.entry.cursor;
                    if last < g.entry.head {
                        s.pulls.push_back((group, last));
                    } else {
                        s.acks.push((group, last));
                    }
                }
                let s = &mut self.state[i];
                if next_continuation != 0 {
                    s.continuation = next_continuation;
                } else {
                    s.stage = Stage::Pull;
                }
            }
            Response::Pull {
                head,
                has_more,
                records,
                ..
            } => {
                let (group, last) = self.state[i].pulls.front().copied().unwrap_or((0, 0));
                let new_last = self.take(group, last, &records, t);
                let s = &mut self.state[i];
                s.delivered += new_last - last;
                s.pulls.pop_front();
                if has_more && new_last < head && new_last > last {
                    s.pulls.push_front((group, new_last));
                } else {
                    s.acks.push((group, new_last));
                }
            }
            Response::BatchAck(results) => {
                let s = &self.state[i];
                let user = s.user;
                let mut bad = None;
                for (r, &(g, m)) in results.iter().zip(&s.acks) {
                    if r.error.is_some() || r.cursor != m {
                        bad = Some(format!(
                            "user {user} group {g}: BATCH_ACK to {m} left cursor {} ({:?})",
                            r.cursor, r.error
                        ));
                    }
                }
                if results.len() != s.acks.len() {
                    bad = Some(format!(
                        "user {user}: BATCH_ACK answered {} items",
                        results.len()
                    ));
                }
                self.acked_groups += results.len() as u64;
                if let Some(b) = bad {
                    self.fail(b);
                }
                // Check the total against the model: every message of every
                // group of the user, since it joined before the first send.
                let expected: u64 = self.groups_of[(user - 1) as usize]
                    .iter()
                    .map(|&g| self.heads[(g - 1) as usize])
                    .sum();
                if self.state[i].delivered != expected {
                    let got = self.state[i].delivered;
                    self.fail(format!(
                        "user {user}: {got} messages delivered, model {expected}"
                    ));
                }
                let s = &mut self.state[i];
                s.acks.clear();
                s.stage = Stage::Done;
            }
            r => {
                t.unexpected(&r, "catch-up");
                self.state[i].stage = Stage::Done;
                self.state[i].pulls.clear();
                self.state[i].acks.clear();
            }
        }
        self.advance(i);
    }

    fn finished(&self) -> bool {
        self.state.len() == self.users.len() && self.active == 0
    }
}

pub(crate) fn mixed(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let users = a.members.unwrap_or(100_000).max(2);
    let groups = a.groups.unwrap_or(100).max(1);
    let messages = a.messages.unwrap_or(20_000);
    let gateways = a.gateways.max(1);
    let pop = population(
        a.seed,
        users,
        groups,
        a.group_size_max,
        a.online.clamp(0.0, 1.0),
    );
    let memberships: u64 = pop.members.iter().map(|m| m.len() as u64).sum();
    let largest = pop.members.iter().map(|m| m.len()).max().unwrap_or(0);
    let online_users = pop.online.iter().filter(|&&o| o).count() as u64;

    let mut params = Map::new();
    params.insert("users".into(), users.into());
    params.insert("groups".into(), groups.into());
    params.insert("messages".into(), messages.into());
    params.insert("memberships".into(), memberships.into());
    params.insert("online".into(), a.online.into());
    params.insert("gateways".into(), gateways.into());
    params.insert("catchup_users".into(), a.catchup_users.into());
    let mut rep = Report::new(
        ctx,
        "mixed",
        format!(
            "mixed: {} users, {} groups (Zipf sizes 2..={}, largest {}, {} memberships), {} online on {} gateways, {} sends over {} connections x {} in flight, then {} offline users SYNC + BATCH_ACK",
            group_digits(users),
            group_digits(groups),
            group_digits(a.group_size_max.min(users)),
            group_digits(largest as u64),
            group_digits(memberships),
            group_digits(online_users),
            gateways,
            group_digits(messages),
            a.connections,
            a.in_flight,
            group_digits(a.catchup_users)
        ),
        params,
        "sends",
    );

    let mut conns = ctx.connect(a.connections)?;
    let t0 = setup(ctx, &mut conns, "mixed setup", "groups", groups, || {
        |i| SetupOp::Create(i + 1)
    })?;
    // Joins, flattened: membership k is the k-th of the concatenated lists.
    let offsets: Vec<u64> = pop
        .members
        .iter()
        .scan(0u64, |acc, m| {
            let o = *acc;
            *acc += m.len() as u64;
            Some(o)
        })
        .collect();
    let t1 = setup(ctx, &mut conns, "mixed setup", "joins", memberships, || {
        let (offsets, members) = (&offsets, &pop.members);
        move |k| {
            let g = offsets.partition_point(|&o| o <= k) - 1;
            SetupOp::Join {
                group: g as u64 + 1,
                user: members[g][(k - offsets[g]) as usize],
                start: JoinStart::Head,
            }
        }
    })?;
    // Gateways subscribe their online users.
    let mut gws = ctx.connect(gateways)?;
    let subscribe_start = Instant::now();
    for (k, gw) in gws.iter_mut().enumerate() {
        let mine: Vec<u64> = (1..=users)
            .filter(|&u| pop.online[(u - 1) as usize] && (u as usize) % gateways == k)
            .collect();
        for chunk in mine.chunks(a.in_flight.max(1)) {
            let ids: Vec<u64> = chunk
                .iter()
                .map(|&u| gw.queue(&Request::Subscribe(Subscription::User(ctx.base + u))))
                .collect::<Result<_, _>>()?;
            gw.flush()?;
            let mut left = ids.len();
            let mut err = None;
            while left > 0 {
                gw.read_some(&mut |id, r| {
                    if ids.contains(&id) {
                        left -= 1;
                        if let Response::Error(e) = r {
                            err = Some(format!("SUBSCRIBE: {:?}: {}", e.code, e.message));
                        }
                    }
                })?;
            }
            if let Some(e) = err {
                return Err(e);
            }
        }
    }
    rep.setup.push((
        format!(
            "{} groups, {} memberships joined, {} online users subscribed",
            group_digits(groups),
            group_digits(memberships),
            group_digits(online_users)
        ),
        t0 + t1 + subscribe_start.elapsed().as_secs_f64(),
    ));

    // Views per gateway.
    let mut views: Vec<Vec<View>> = vec![
        vec![
            View {
                next: 1,
                ..View::default()
            };
            groups as usize
        ];
        gateways
    ];
    for (g, members) in pop.members.iter().enumerate() {
        for &u in members {
            if pop.online[(u - 1) as usize] {
                let v = &mut views[(u as usize) % gateways][g];
                v.online += 1;
                v.member = u;
            }
        }
    }

    let send_seed = plan::hash(a.seed, 0x006d_6978_6564, 1);
    let heads_cell: Mutex<Option<Vec<u64>>> = Mutex::new(None);
    let gateways_failed = AtomicBool::new(false);
    let (send_result, gw_results) = std::thread::scope(|s| {
        let handles: Vec<_> = gws
            .iter_mut()
            .zip(views)
            .map(|(gw, v)| {
                let (heads_cell, failed) = (&heads_cell, &gateways_failed);
                let (base, page) = (ctx.base, a.page.max(1));
                s.spawn(move || {
                    let r = gateway(gw, base, v, heads_cell, page);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let jobs: Vec<_> = split(messages, conns.len())
            .into_iter()
            .map(|range| W1Job {
                got: Vec::new(),
                range,
                seed: send_seed,
                groups,
                base: ctx.base,
                // Senders are not members: a member's own message counts
                // as read when it had read everything before it (the
                // caught-up sender rule), which the catch-up model below
                // does not follow. Found as a SYNC one message short.
                sender_offset: users,
                payloads: ctx.payloads,
                size: a.size as u64,
                duplicates: 0,
            })
            .collect();
        let r = run_phase(
            &mut conns,
            jobs,
            &ctx.measured_phase("mixed sends", "sends"),
        );
        // Publish the heads (or empty heads on failure, so gateways stop).
        let mut heads = vec![0u64; groups as usize];
        if let Ok(r) = &r {
            for j in &r.jobs {
                for &(g, id) in &j.got {
                    let h = &mut heads[(g - 1) as usize];
                    *h = (*h).max(id);
                }
            }
        }
        if let Ok(mut cell) = heads_cell.lock() {
            *cell = Some(heads);
        }
        let gw: Vec<_> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a gateway thread panicked".into()))
            })
            .collect();
        (r, gw)
    });
    let sends = send_result?;
    let heads = heads_cell
        .lock()
        .map_err(|_| "heads lock poisoned".to_string())?
        .take()
        .unwrap_or_default();
    let sent: u64 = sends.jobs.iter().map(|j| j.got.len() as u64).sum();
    let mut dense_sends = true;
    for (g, &h) in heads.iter().enumerate() {
        let n = sends
            .jobs
            .iter()
            .map(|j| j.got.iter().filter(|&&(x, _)| x as usize == g + 1).count() as u64)
            .sum::<u64>();
        if n != h {
            dense_sends = false;
        }
    }

    let mut gw_out = Vec::new();
    for r in gw_results {
        gw_out.push(r?);
    }

    // Catch-up of offline users (the first ones of a shuffled order that
    // have at least one group).
    let mut rng = plan::mixed_rng(a.seed ^ 0x0063_6174_6368_7570);
    let mut offline: Vec<u64> = (1..=users)
        .filter(|&u| !pop.online[(u - 1) as usize] && !pop.groups_of[(u - 1) as usize].is_empty())
        .collect();
    for k in (1..offline.len()).rev() {
        let j = rng.below(k as u64 + 1) as usize;
        offline.swap(k, j);
    }
    offline.truncate(a.catchup_users as usize);
    let c = conns.len();
    let jobs: Vec<_> = (0..c)
        .map(|k| CatchUpJob {
            users: offline.iter().copied().skip(k).step_by(c).collect(),
            base: ctx.base,
            page: a.page.max(1),
            window: a.in_flight,
            heads: &heads,
            groups_of: &pop.groups_of,
            state: Vec::new(),
            ready: VecDeque::new(),
            active: 0,
            sync_requests: 0,
            pull_requests: 0,
            acked_groups: 0,
            fault: None,
        })
        .collect();
    let catch = run_phase(
        &mut conns,
        jobs,
        &ctx.setup_phase("mixed catch-up", "deliveries"),
    )?;

    // Verification.
    let gw_fault = gw_out.iter().find_map(|g| g.fault.clone());
    let catch_fault = catch.jobs.iter().find_map(|j| j.fault.clone());
    let mut delays = Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3)
        .expect("invariant: constant histogram bounds are valid");
    for g in &gw_out {
        let _ = delays.add(&g.delay_us);
    }
    let push_records: u64 = gw_out.iter().map(|g| g.push_records).sum();
    let filled: u64 = gw_out.iter().map(|g| g.filled).sum();
    let member_deliveries: u64 = gw_out.iter().map(|g| g.member_deliveries).sum();
    let served: u64 = gw_out.iter().map(|g| g.groups_served).sum();
    let resyncs: u64 = gw_out.iter().map(|g| g.resyncs).sum();
    let sync_requests: u64 = catch.jobs.iter().map(|j| j.sync_requests).sum();
    let pull_requests: u64 = catch.jobs.iter().map(|j| j.pull_requests).sum();
    let acked_groups: u64 = catch.jobs.iter().map(|j| j.acked_groups).sum();

    rep.extra.insert(
        "push".into(),
        json!(format!(
            "{} records pushed in {} frames to {} gateway-groups ({} member deliveries), {} filled by HISTORY, {} RESYNCs; push delay after the node accepted a message: p50 {} us, p99 {} us, max {} us (millisecond timestamps)",
            group_digits(push_records),
            group_digits(gw_out.iter().map(|g| g.push_frames).sum()),
            group_digits(served),
            group_digits(member_deliveries),
            group_digits(filled),
            resyncs,
            group_digits(delays.value_at_quantile(0.5)),
            group_digits(delays.value_at_quantile(0.99)),
            group_digits(delays.max())
        )),
    );
    rep.extra.insert(
        "catch-up".into(),
        json!(format!(
            "{} offline users: {} deliveries in {:.2} s ({} deliveries/s, {:.1} MB/s) with {} SYNC, {} PULL, {} BATCH_ACK requests ({} groups acknowledged), {} errors; latency p50 {} us, p99 {} us",
            offline.len(),
            group_digits(catch.tally.ops),
            catch.elapsed.as_secs_f64(),
            group_digits((catch.tally.ops as f64 / catch.elapsed.as_secs_f64().max(1e-9)) as u64),
            catch.tally.payload_bytes as f64 / 1e6 / catch.elapsed.as_secs_f64().max(1e-9),
            sync_requests,
            pull_requests,
            offline.len(),
            acked_groups,
            catch.tally.errors,
            group_digits(catch.tally.latency_us.value_at_quantile(0.5)),
            group_digits(catch.tally.latency_us.value_at_quantile(0.99)),
        )),
    );
    rep.extra.insert("push_records".into(), push_records.into());
    rep.extra
        .insert("member_deliveries".into(), member_deliveries.into());
    rep.extra
        .insert("catchup_deliveries".into(), catch.tally.ops.into());
    rep.extra
        .insert("catchup_secs".into(), catch.elapsed.as_secs_f64().into());

    rep.verified = gw_fault.is_none()
        && catch_fault.is_none()
        && dense_sends
        && sends.tally.errors == 0
        && catch.tally.errors == 0
        && !gateways_failed.load(Ordering::Relaxed);
    rep.verification = match (gw_fault, catch_fault) {
        (Some(f), _) | (None, Some(f)) => f,
        _ if !dense_sends => "send ids are not dense per group".into(),
        _ => format!(
            "{} sends, ids dense per group; every gateway's view of its {} groups is 1..=head (push + HISTORY), so no online member missed a message; {} offline users received exactly their groups' messages and ACKed to the head",
            group_digits(sent),
            group_digits(served),
            offline.len()
        ),
    };
    rep.tally = sends.tally;
    rep.measured_secs = sends.elapsed.as_secs_f64();
    rep.cut_short = sends.cut_short;
    Ok(rep)
}
