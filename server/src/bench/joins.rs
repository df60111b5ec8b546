//! The joins workload: memberships loaded as a loader of an application's
//! groups does, JOINs pipelined (`--in-flight` per connection; one
//! connection shows what format-spec/protocol.md 1.4 lets a connection's
//! pipelined JOINs share: commit rounds). Setup creates `--groups` groups;
//! the measured phase joins `--ops` users, user `i` to group `i mod
//! groups`, each at the head; the verification counts every group's
//! members (GROUP_INFO) against the JOINs answered.

use std::ops::Range;

use serde_json::Map;

use super::conn::Conn;
use super::context::Ctx;
use super::driver::{run_phase, split, Job, Tally};
use super::progress::group_digits;
use super::report::Report;
use super::workloads::{delta, node_stats, setup, SetupOp};
use tidemark_protocol::{JoinStart, Request, Response};

struct JoinJob {
    range: Range<u64>,
    groups: u64,
    base: u64,
}

impl Job for JoinJob {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let i = self.range.next()?;
        Some((
            i,
            Request::Join {
                group: self.base + i % self.groups + 1,
                user: self.base + i + 1,
                start: JoinStart::Head,
            },
        ))
    }

    fn complete(&mut self, i: u64, resp: Response<'_>, t: &mut Tally) {
        match resp {
            // Groups without messages: every member joins at 0.
            Response::Join { cursor: 0, .. } => t.ops += 1,
            Response::Join { cursor, .. } => {
                t.error(format!("JOIN of user {} answered cursor {cursor}", i + 1))
            }
            r => t.unexpected(&r, "JOIN"),
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// The groups' member counts added up (one GROUP_INFO each).
fn members_counted(conn: &mut Conn, base: u64, groups: u64) -> Result<u64, String> {
    let mut total = 0;
    for g in 1..=groups {
        let mut answer = Err(format!("GROUP_INFO of group {g}: no answer"));
        conn.call(&Request::GroupInfo { group: base + g }, &mut |r| {
            answer = match r {
                Response::GroupInfo(info) => Ok(info.member_count),
                other => Err(format!("GROUP_INFO of group {g}: {other:?}")),
            }
        })?;
        total += answer?;
    }
    Ok(total)
}

/// Joins: `--ops` JOINs (200,000) to `--groups` groups (1,000).
pub(crate) fn joins(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let groups = a.groups.unwrap_or(1_000).max(1);
    let joins = a.ops.unwrap_or(200_000);
    let mut params = Map::new();
    params.insert("groups".into(), groups.into());
    params.insert("joins".into(), joins.into());
    let mut rep = Report::new(
        ctx,
        "joins",
        format!(
            "Joins: {} JOINs to {} groups, {} connections x {} in flight, fsync {}",
            group_digits(joins),
            group_digits(groups),
            a.connections,
            a.in_flight,
            ctx.fsync
        ),
        params,
        "joins",
    );
    let mut conns = ctx.connect(a.connections)?;
    let t = setup(ctx, &mut conns, "joins setup", "groups", groups, || {
        |i| SetupOp::Create(i + 1)
    })?;
    rep.setup
        .push((format!("{} groups created", group_digits(groups)), t));

    let before = node_stats(&mut conns[0])?;
    let jobs: Vec<_> = split(joins, conns.len())
        .into_iter()
        .map(|range| JoinJob {
            range,
            groups,
            base: ctx.base,
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.measured_phase("joins", "joins"))?;
    let after = node_stats(&mut conns[0])?;

    let members = members_counted(&mut conns[0], ctx.base, groups)?;
    let answered = r.tally.ops;
    rep.verified = members == answered && r.tally.errors == 0;
    rep.verification = if members == answered {
        format!(
            "members counted: {} in {} groups, one per JOIN answered",
            group_digits(members),
            group_digits(groups)
        )
    } else {
        format!(
            "{} members counted, {} JOINs answered",
            group_digits(members),
            group_digits(answered)
        )
    };
    let rounds = delta(&before, &after, "engine.commit_rounds");
    rep.extra.insert(
        "commit".into(),
        format!(
            "{} joins in {} commit rounds ({:.1} a round), {} fsyncs",
            group_digits(answered),
            group_digits(rounds),
            answered as f64 / rounds.max(1) as f64,
            group_digits(delta(&before, &after, "engine.fsyncs"))
        )
        .into(),
    );
    rep.tally = r.tally;
    rep.measured_secs = r.elapsed.as_secs_f64();
    rep.cut_short = r.cut_short;
    Ok(rep)
}
