//! The creation workload (BENCHMARKS.md, "Group creation"): how fast a
//! node takes new groups and their first members over the wire, the way a
//! gateway opens one-to-one chats.
//!
//! 1. Creates `--groups` groups (1,000,000) with CREATE_GROUP, split over
//!    `--connections`, each keeping up to `--in-flight` requests
//!    outstanding (the measured phase: groups/s and latency).
//! 2. Joins `--members` users (2) to every group with JOIN (HEAD), timed
//!    too (joins/s). The members of group `g` (counted from 0) are users
//!    `g m + j mod U`, `j < m`, with `U` as many users as groups: every
//!    user is in `m` groups, as a user of pair chats is in several.
//!
//! Each phase reports the node's commit rounds and journal fdatasyncs in
//! it (STATS deltas), so its rate splits into rounds per second and
//! operations per round: under `fsync=always` a round costs one
//! fdatasync, so few operations per round means the disk's sync latency
//! bounds the rate. (A CREATE_GROUP or JOIN holds back every later
//! request of its connection until it is answered, protocol.md 1.4: a
//! round holds at most one operation per connection, so use many
//! connections.)
//!
//! Verification: every group answers GROUP_INFO with head 0 and exactly
//! `--members` members.

use serde_json::Map;

use super::conn::Conn;
use super::context::Ctx;
use super::driver::{run_phase, split, Job, PhaseResult, Tally};
use super::progress::group_digits;
use super::report::Report;
use super::workloads::{delta, node_stats, setup_jobs, SetupJob, SetupOp};
use tidemark_protocol::{JoinStart, Request, Response};

/// Groups created when `--groups` is not given.
const GROUPS_DEFAULT: u64 = 1_000_000;
/// Members joined to each group when `--members` is not given.
const MEMBERS_DEFAULT: u64 = 2;

/// The user of group `g`'s `j`-th membership (both counted from 0; user
/// ids from 1), among `users` users.
fn member_of(g: u64, j: u64, members: u64, users: u64) -> u64 {
    (g * members + j) % users + 1
}

/// What one timed phase did, with the node's rounds and syncs in it.
struct PhaseFigures {
    ops: u64,
    secs: f64,
    rounds: u64,
    fsyncs: u64,
    p50_us: u64,
    p99_us: u64,
}

impl PhaseFigures {
    fn per_sec(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }

    /// "1,000,000 in 10.00 s: 100,000/s; 2,000 rounds (500/s, 500.0 per
    /// round), 2,000 fsyncs (500.0 per fsync); latency p50/p99".
    fn line(&self) -> String {
        format!(
            "{} in {:.2} s: {}/s; {} commit rounds ({}/s, {:.1} per round), {} fsyncs ({:.1} per fsync); latency p50 {} us, p99 {} us",
            group_digits(self.ops),
            self.secs,
            group_digits(self.per_sec() as u64),
            group_digits(self.rounds),
            group_digits((self.rounds as f64 / self.secs.max(1e-9)) as u64),
            self.ops as f64 / self.rounds.max(1) as f64,
            group_digits(self.fsyncs),
            self.ops as f64 / self.fsyncs.max(1) as f64,
            group_digits(self.p50_us),
            group_digits(self.p99_us),
        )
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "ops": self.ops,
            "secs": self.secs,
            "per_sec": self.per_sec(),
            "commit_rounds": self.rounds,
            "fsyncs": self.fsyncs,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
        })
    }
}

/// Runs `n` requests `gen(i)` as a timed phase; fails on any error.
fn timed_phase<'a, G, F>(
    ctx: &Ctx<'a>,
    conns: &mut [Conn],
    label: &str,
    unit: &str,
    n: u64,
    make_gen: F,
) -> Result<(PhaseResult<SetupJob<'a, G>>, PhaseFigures), String>
where
    F: Fn() -> G,
    G: FnMut(u64) -> SetupOp + Send,
{
    let before = node_stats(&mut conns[0])?;
    let jobs = setup_jobs(ctx, conns.len(), n, make_gen);
    let r = run_phase(conns, jobs, &ctx.measured_phase(label, unit))?;
    let after = node_stats(&mut conns[0])?;
    if r.tally.errors > 0 {
        return Err(format!(
            "{label}: {} requests failed, e.g. {}",
            r.tally.errors,
            r.tally.error_samples.join("; ")
        ));
    }
    let figures = PhaseFigures {
        ops: r.tally.ops,
        secs: r.elapsed.as_secs_f64(),
        rounds: delta(&before, &after, "engine.commit_rounds"),
        fsyncs: delta(&before, &after, "engine.fsyncs"),
        p50_us: r.tally.latency_us.value_at_quantile(0.5),
        p99_us: r.tally.latency_us.value_at_quantile(0.99),
    };
    Ok((r, figures))
}

/// GROUP_INFO of every group of a range: head 0 and `members` members.
struct VerifyJob {
    range: std::ops::Range<u64>,
    base: u64,
    members: u64,
    checked: u64,
    fault: Option<String>,
}

impl Job for VerifyJob {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let g = self.range.next()?;
        Some((
            g,
            Request::GroupInfo {
                group: self.base + g + 1,
            },
        ))
    }

    fn complete(&mut self, g: u64, resp: Response<'_>, t: &mut Tally) {
        match resp {
            Response::GroupInfo(info) => {
                t.ops += 1;
                self.checked += 1;
                if (info.head, info.member_count) != (0, self.members) && self.fault.is_none() {
                    self.fault = Some(format!(
                        "group {}: head {} and {} members, expected 0 and {}",
                        g + 1,
                        info.head,
                        info.member_count,
                        self.members
                    ));
                }
            }
            r => t.unexpected(&r, "GROUP_INFO"),
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// Runs the creation workload.
pub(crate) fn create(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let groups = a.groups.unwrap_or(GROUPS_DEFAULT).max(1);
    let members = a.members.unwrap_or(MEMBERS_DEFAULT);
    if members > groups {
        return Err(format!(
            "create: --members {members} above --groups {groups} (a group's members are distinct users among as many users as groups)"
        ));
    }
    let users = groups;
    let mut params = Map::new();
    params.insert("groups".into(), groups.into());
    params.insert("members".into(), members.into());
    let mut rep = Report::new(
        ctx,
        "create",
        format!(
            "create: {} groups, then {} joins each ({} users), {} connections x {} in flight, fsync {}",
            group_digits(groups),
            members,
            group_digits(users),
            a.connections,
            a.in_flight,
            ctx.fsync
        ),
        params,
        "groups",
    );
    let mut conns = ctx.connect(a.connections)?;

    let (created, creation) = timed_phase(ctx, &mut conns, "create", "groups", groups, || {
        |i| SetupOp::Create(i + 1)
    })?;
    rep.tally = created.tally;
    rep.measured_secs = created.elapsed.as_secs_f64();
    rep.cut_short = created.cut_short;
    rep.extra.insert("creation".into(), creation.line().into());
    rep.extra.insert("creation_phase".into(), creation.json());
    if rep.cut_short {
        rep.verification = "not verified: --duration stopped the creation".into();
        return Ok(rep);
    }

    if members > 0 {
        let (_, joins) = timed_phase(ctx, &mut conns, "join", "joins", groups * members, || {
            move |i| SetupOp::Join {
                group: i / members + 1,
                user: member_of(i / members, i % members, members, users),
                start: JoinStart::Head,
            }
        })?;
        rep.extra.insert("joins".into(), joins.line().into());
        rep.extra.insert("joins_phase".into(), joins.json());
    }

    let jobs: Vec<_> = split(groups, conns.len())
        .into_iter()
        .map(|range| VerifyJob {
            range,
            base: ctx.base,
            members,
            checked: 0,
            fault: None,
        })
        .collect();
    let v = run_phase(&mut conns, jobs, &ctx.setup_phase("verify", "groups"))?;
    let checked: u64 = v.jobs.iter().map(|j| j.checked).sum();
    let fault = v.jobs.iter().find_map(|j| j.fault.clone());
    rep.verified = fault.is_none() && v.tally.errors == 0 && checked == groups;
    rep.verification = match fault {
        Some(f) => f,
        None if v.tally.errors > 0 => format!(
            "GROUP_INFO failed {} times, e.g. {}",
            v.tally.errors,
            v.tally.error_samples.join("; ")
        ),
        None => format!(
            "every group answers GROUP_INFO with head 0 and {members} members ({} of {} checked)",
            group_digits(checked),
            group_digits(groups)
        ),
    };
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::member_of;

    /// A group's members are distinct users, and every user is in
    /// `members` groups.
    #[test]
    fn members_are_distinct_in_a_group_and_spread_over_users() {
        let (groups, members) = (7, 3);
        let mut count = vec![0u64; groups as usize + 1];
        for g in 0..groups {
            let mut users: Vec<u64> = (0..members)
                .map(|j| member_of(g, j, members, groups))
                .collect();
            for &u in &users {
                assert!((1..=groups).contains(&u));
                count[u as usize] += 1;
            }
            users.sort_unstable();
            users.dedup();
            assert_eq!(users.len() as u64, members, "group {g}");
        }
        assert!(count[1..].iter().all(|&c| c == members));
    }
}
