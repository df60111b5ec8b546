//! The population workload (BENCHMARKS.md, "Population"): what a node costs for the groups it *holds*, and what
//! holding them does to sends and restarts.
//!
//! 1. Creates `--groups` groups (1,000,000) over the wire with an IM node's
//!    size mix: 80% two-member chats, 19.9% of 3-200 members, 0.1% (at
//!    least one) of 1,000 up to `--group-size-max` (100,000) members; sizes
//!    follow a truncated power law inside each band (exponent
//!    [`MID_EXPONENT`], [`BIG_EXPONENT`]: means about 21 and 4,650, so
//!    about 10.4 memberships per group at full size). Members are users
//!    `1..=--members` (as many as groups) drawn Zipf([`USER_EXPONENT`]), so
//!    one user is in many groups and every user in a few. Then every
//!    membership is a JOIN (HEAD).
//! 2. Sends `--messages` (1,000,000) W1-style messages (`--size` bytes)
//!    over the groups, Zipf(1.0) by group (the measured phase: throughput
//!    and latency, checkpoints included). Senders are users above the
//!    population, so no cursor moves.
//! 3. Stops the node cleanly and restarts it (time to the first answered
//!    PING), validates; then sends again, kills the node with SIGKILL once
//!    a tenth of `--messages` more sends were acknowledged, restarts it and
//!    validates again.
//!
//! Measured between the phases: the data directory's allocated bytes and
//! inodes (per group after creation), the node's resident memory (per
//! group after creation, per membership after the joins; deltas from the
//! empty node), and the engine's checkpoint counters from STATS.
//!
//! Memory is that of *idle* groups (the goal is bytes per idle
//! group): the node runs with a short `--idle-evict-ms`
//! (`--node-idle-evict-ms`, 5 s; the node's default is 10 minutes), and
//! after creation and after the joins the workload waits for the groups to
//! go idle before reading memory ([`settle`]): it polls STATS
//! `engine.groups_in_use` until it is 0 or stops falling after a
//! checkpoint (new groups' files must be synced before their memory can
//! go), and until a checkpoint was stored since the phase (what it changed
//! is held for the next capture until then), or, from a node that has the flag but not that figure, waits a
//! fixed [`SETTLE_FIXED_SLACK`] past the idle time. A binary without the flag
//! (0.1) gets neither flag nor wait: its groups never go idle; nor does
//! any node with `--node-idle-evict-ms 0` (the node's own idle time). The send
//! phase then starts on idle groups, so a send to a group unused for the
//! idle time loads its log first (STATS `engine.group_loads`, reported).
//!
//! Validation after each restart: every group answers READ_COUNT with its
//! planned member count; every acknowledged send is read back with HISTORY
//! (CRC, sender, client_msg_id and payload), ids are consecutive, and the
//! head is the last acknowledged id (after the clean stop) or at least it
//! (after the kill). Any fault fails the workload.
//!
//! The plan (sizes, members, send targets) is generated before each phase
//! and never timed; it is a pure function of `--seed`.

use std::collections::{HashSet, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::conn::Conn;
use super::context::{Ctx, IO_TIMEOUT};
use super::driver::{run_phase, split, Job, Tally};
use super::node::{kill_now, serve_has_flag, DiskUsage, Memory, SpawnedNode};
use super::plan::{self, hash, Rng, Zipf};
use super::progress::group_digits;
use super::report::Report;
use super::workloads::{node_stats, send_request, setup, SetupOp};
use tidemark_protocol::{JoinStart, Request, Response};

/// Groups per thousand in the middle band and in the big band (the rest
/// are two-member chats).
const MID_PER_MILLE: u64 = 199;
const BIG_PER_MILLE: u64 = 1;
/// The middle band's sizes and power-law exponent (mean about 21).
const MID_MIN: u64 = 3;
const MID_MAX: u64 = 200;
const MID_EXPONENT: f64 = 1.6;
/// The big band starts here (it ends at `--group-size-max`); its
/// power-law exponent gives a mean of about 4,650 up to 100,000.
const BIG_MIN: u64 = 1000;
const BIG_EXPONENT: f64 = 2.0;
/// Users are drawn Zipf with this exponent: at full size the busiest user
/// is in about 10,000 groups (under the default `groups_per_user_max` of
/// 20,000) and the least busy in about 4.
const USER_EXPONENT: f64 = 0.6;
/// Sends pick groups Zipf(1.0) by rank.
const SEND_EXPONENT: f64 = 1.0;
/// Users and groups the population needs at least (the big band's floor).
const USERS_MIN: u64 = BIG_MIN;

/// The node flag that makes groups go idle sooner ([`node_flags`]).
const IDLE_FLAG: &str = "--idle-evict-ms";
/// How often [`settle`] asks STATS.
const SETTLE_POLL: Duration = Duration::from_millis(200);
/// Past the idle time, the idle sweep still needs its period (1 s) and its
/// pace (1,024 groups a millisecond) to give everything back: [`settle`]
/// waits at least this much longer before it accepts a count that stopped
/// falling.
const SETTLE_SWEEP_SLACK: Duration = Duration::from_millis(2_000);
/// A group that cannot give its memory back yet (its new files not yet
/// synced) is listed again and waits for the next checkpoint (at most
/// `checkpoint_interval_ms`, 60 s, apart by default): [`settle`] waits at
/// most this long past the idle time.
const SETTLE_MAX: Duration = Duration::from_secs(120);
/// From a node that has the flag but does not report
/// `engine.groups_in_use`: the fixed wait past the idle time.
const SETTLE_FIXED_SLACK: Duration = Duration::from_secs(5);

// Sub-seeds of the population's random streams (distinct from plan.rs's).
const TAG_BAND: u64 = 16;
const TAG_SIZE: u64 = 17;
const TAG_MEMBERS: u64 = 18;
const TAG_SEND_RANK: u64 = 19;
const TAG_SEND: u64 = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Band {
    Pair,
    Mid,
    Big,
}

/// A bijection of `0..n`: `x -> (a x + b) mod n` with `gcd(a, n) = 1`, so
/// that which groups are big, and which are the busiest senders' targets,
/// is spread over the id space instead of being the lowest ids.
#[derive(Clone, Copy, Debug)]
struct Shuffle {
    n: u64,
    a: u64,
    b: u64,
}

impl Shuffle {
    fn new(seed: u64, tag: u64, n: u64) -> Shuffle {
        let n = n.max(1);
        let mut a = hash(seed, tag, 0) % n;
        while gcd(a, n) != 1 {
            a = (a + 1) % n;
        }
        Shuffle {
            n,
            a,
            b: hash(seed, tag, 1) % n,
        }
    }

    fn at(&self, x: u64) -> u64 {
        ((u128::from(self.a) * u128::from(x) + u128::from(self.b)) % u128::from(self.n)) as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// An integer in `[lo, hi]` with P(k) roughly proportional to k^-exponent
/// (the continuous law on `[lo, hi + 1)`, floored), from `u` in `[0, 1)`.
fn power_law(lo: u64, hi: u64, exponent: f64, u: f64) -> u64 {
    let e = 1.0 - exponent;
    let (a, b) = ((lo as f64).powf(e), ((hi + 1) as f64).powf(e));
    let x = (a + u * (b - a)).powf(1.0 / e);
    (x as u64).clamp(lo, hi)
}

/// The groups, their sizes and members: a pure function of the seed.
pub struct Population {
    pub seed: u64,
    pub groups: u64,
    pub users: u64,
    pub big_groups: u64,
    pub mid_groups: u64,
    big_max: u64,
    bands: Shuffle,
    /// Group `g`'s members are `members[offsets[g - 1]..offsets[g]]`.
    offsets: Vec<u64>,
    members: Vec<u32>,
}

impl Population {
    pub fn new(seed: u64, groups: u64, users: u64, big_max: u64) -> Result<Population, String> {
        if groups == 0 || groups > u64::from(u32::MAX) {
            return Err("population: --groups must be in 1..2^32".into());
        }
        if !(USERS_MIN..=u64::from(u32::MAX)).contains(&users) {
            return Err(format!(
                "population: at least {USERS_MIN} users (--members) and below 2^32"
            ));
        }
        let big_groups = (groups * BIG_PER_MILLE / 1000).max(1);
        let mid_groups = (groups * MID_PER_MILLE / 1000).min(groups - big_groups);
        let mut p = Population {
            seed,
            groups,
            users,
            big_groups,
            mid_groups,
            big_max: big_max.clamp(BIG_MIN, users),
            bands: Shuffle::new(seed, TAG_BAND, groups),
            offsets: Vec::new(),
            members: Vec::new(),
        };
        p.generate();
        Ok(p)
    }

    pub fn band(&self, group: u64) -> Band {
        let x = self.bands.at(group - 1);
        if x < self.big_groups {
            Band::Big
        } else if x < self.big_groups + self.mid_groups {
            Band::Mid
        } else {
            Band::Pair
        }
    }

    fn size(&self, group: u64) -> u64 {
        let u = Rng::new(hash(self.seed, TAG_SIZE, group)).unit();
        match self.band(group) {
            Band::Pair => 2,
            Band::Mid => power_law(MID_MIN, MID_MAX, MID_EXPONENT, u),
            Band::Big => power_law(BIG_MIN, self.big_max, BIG_EXPONENT, u),
        }
    }

    /// Draws group `group`'s distinct members: Zipf draws, duplicates
    /// drawn again; a group so big that the draws keep hitting members
    /// (near the whole population) is completed with the users that follow
    /// a random one, so the work stays proportional to the size.
    fn draw_members(&self, group: u64, users: &Zipf, out: &mut Vec<u32>) {
        let k = self.size(group) as usize;
        let mut rng = Rng::new(hash(self.seed, TAG_MEMBERS, group));
        let start = out.len();
        let mut set: HashSet<u32> = HashSet::new();
        let big = k > 64;
        let mut attempts = 8 * k + 64;
        let mut push = |u: u32, out: &mut Vec<u32>| {
            let fresh = if big {
                set.insert(u)
            } else {
                !out[start..].contains(&u)
            };
            if fresh {
                out.push(u);
            }
        };
        while out.len() - start < k && attempts > 0 {
            attempts -= 1;
            push(users.sample(&mut rng) as u32, out);
        }
        let mut next = rng.below(self.users);
        while out.len() - start < k {
            push((next + 1) as u32, out);
            next = (next + 1) % self.users;
        }
    }

    fn generate(&mut self) {
        let users = Zipf::new(1, self.users, USER_EXPONENT);
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let parts: Vec<(Vec<u64>, Vec<u32>)> = std::thread::scope(|s| {
            let this = &*self;
            let users = &users;
            let handles: Vec<_> = split(self.groups, threads)
                .into_iter()
                .map(|r| {
                    s.spawn(move || {
                        let mut sizes = Vec::with_capacity((r.end - r.start) as usize);
                        let mut members = Vec::new();
                        for g in r {
                            let before = members.len();
                            this.draw_members(g + 1, users, &mut members);
                            sizes.push((members.len() - before) as u64);
                        }
                        (sizes, members)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .expect("invariant: member generation does not panic")
                })
                .collect()
        });
        let total: usize = parts.iter().map(|p| p.1.len()).sum();
        self.offsets = Vec::with_capacity(self.groups as usize + 1);
        self.offsets.push(0);
        self.members = Vec::with_capacity(total);
        for (sizes, members) in parts {
            for s in sizes {
                let last = *self.offsets.last().unwrap_or(&0);
                self.offsets.push(last + s);
            }
            self.members.extend_from_slice(&members);
        }
    }

    /// Group `group`'s members (user ids before `--id-base`).
    pub fn members(&self, group: u64) -> &[u32] {
        let g = (group - 1) as usize;
        &self.members[self.offsets[g] as usize..self.offsets[g + 1] as usize]
    }

    pub fn memberships(&self) -> u64 {
        self.members.len() as u64
    }

    /// The group of membership `i` (an index into the flat member list).
    fn group_of(&self, i: u64) -> u64 {
        self.offsets.partition_point(|&o| o <= i) as u64
    }

    pub fn largest(&self) -> u64 {
        self.offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }

    /// The groups of sends `range` (message indexes): Zipf(1.0) by rank,
    /// ranks spread over the ids.
    pub fn send_targets(&self, range: Range<u64>) -> Vec<u32> {
        let zipf = Zipf::new(1, self.groups, SEND_EXPONENT);
        let ranks = Shuffle::new(self.seed, TAG_SEND_RANK, self.groups);
        range
            .map(|i| {
                let rank = zipf.sample(&mut Rng::new(hash(self.seed, TAG_SEND, i)));
                (1 + ranks.at(rank - 1)) as u32
            })
            .collect()
    }
}

// ---------------------------------------------------------------- jobs

/// Sends `targets[k]` for `k` in `range`: message index `first + k`.
struct SendJob<'a> {
    range: Range<u64>,
    first: u64,
    targets: &'a [u32],
    base: u64,
    sender_offset: u64,
    payloads: &'a [Vec<u8>],
    size: u64,
    acked: &'a AtomicU64,
    /// `(group, msg_id, message index)` of every acknowledged send.
    got: Vec<(u32, u64, u64)>,
    duplicates: u64,
}

impl Job for SendJob<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let k = self.range.next()?;
        let g = u64::from(self.targets[k as usize]);
        let i = self.first + k;
        Some((
            i,
            send_request(self.base, self.sender_offset, g, i, self.payloads),
        ))
    }

    fn complete(&mut self, i: u64, resp: Response<'_>, t: &mut Tally) {
        if let Some((msg_id, duplicate)) = t.sent(&resp, self.size) {
            self.got
                .push((self.targets[(i - self.first) as usize], msg_id, i));
            self.acked.fetch_add(1, Ordering::Relaxed);
            self.duplicates += u64::from(duplicate);
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// What a validation found wrong: a count, and the first few in words.
#[derive(Default)]
struct Faults {
    count: u64,
    samples: Vec<String>,
}

impl Faults {
    fn add(&mut self, what: String) {
        self.count += 1;
        if self.samples.len() < 5 {
            self.samples.push(what);
        }
    }

    fn merge(&mut self, other: Faults) {
        self.count += other.count;
        for s in other.samples {
            if self.samples.len() < 5 {
                self.samples.push(s);
            }
        }
    }
}

/// READ_COUNT (msg_id 0: every member) of every group in `range` (ids
/// before the base), against the planned member count.
struct CountJob<'a> {
    range: Range<u64>,
    pop: &'a Population,
    base: u64,
    faults: Faults,
}

impl Job for CountJob<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let g = self.range.next()?;
        Some((
            g,
            Request::ReadCount {
                group: self.base + g,
                msg_id: 0,
            },
        ))
    }

    fn complete(&mut self, g: u64, resp: Response<'_>, t: &mut Tally) {
        t.ops += 1;
        let want = self.pop.members(g).len() as u64;
        match resp {
            Response::ReadCount { count } if count == want => {}
            Response::ReadCount { count } => self
                .faults
                .add(format!("group {g}: {count} members, {want} joined")),
            Response::Error(e) => self.faults.add(format!(
                "group {g}: READ_COUNT: {:?}: {}",
                e.code, e.message
            )),
            _ => self
                .faults
                .add(format!("group {g}: unexpected answer to READ_COUNT")),
        }
    }

    fn finished(&self) -> bool {
        self.range.is_empty()
    }
}

/// One group's read-back: its acknowledged sends `acked` (ascending ids),
/// walked from the newest as HISTORY pages arrive, newest first.
struct GroupCheck<'a> {
    group: u64,
    acked: &'a [(u32, u64, u64)],
    /// Acknowledged sends not yet matched: `acked[..left]`.
    left: usize,
    /// `before_msg_id` of the next page (0: from the head).
    before: u64,
    /// The id the next record must carry (0 before the first).
    expect: u64,
    head: Option<u64>,
}

/// HISTORY of every group with acknowledged sends, from the head down to
/// the first message, checking every acknowledged send is there intact.
struct ReadBackJob<'a> {
    checks: Vec<GroupCheck<'a>>,
    /// Groups (indexes into `checks`) not started yet, and ready to ask
    /// for their next page.
    not_started: Range<usize>,
    ready: VecDeque<usize>,
    in_flight: usize,
    window: usize,
    pop: &'a Population,
    base: u64,
    /// Senders' offset (see `send_request`).
    sender_offset: u64,
    payloads: &'a [Vec<u8>],
    page: u32,
    /// After a clean stop the head must equal the last acknowledged id;
    /// after a kill it may be above (sends stored but not answered).
    exact: bool,
    records: u64,
    faults: Faults,
}

impl ReadBackJob<'_> {
    /// Checks one page; returns whether another page is needed.
    fn check_page(
        &mut self,
        k: usize,
        has_more: bool,
        records: tidemark_protocol::Records<'_>,
    ) -> bool {
        let c = &mut self.checks[k];
        let mut faults = Vec::new();
        let mut oldest = None;
        for r in records.iter(true) {
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    faults.push(format!("group {}: records: {e}", c.group));
                    break;
                }
            };
            self.records += 1;
            let id = r.msg_id();
            if c.head.is_none() {
                c.head = Some(id);
                let last = c.acked.last().map_or(0, |a| a.1);
                if id < last || (self.exact && id != last) {
                    faults.push(format!(
                        "group {}: head {id}, last acknowledged id {last}",
                        c.group
                    ));
                }
            } else if id != c.expect {
                faults.push(format!(
                    "group {}: HISTORY gave id {id} after {}",
                    c.group,
                    c.expect + 1
                ));
            }
            c.expect = id.saturating_sub(1);
            oldest = Some(id);
            while c.left > 0 && c.acked[c.left - 1].1 > id {
                faults.push(format!(
                    "group {}: acknowledged id {} missing",
                    c.group,
                    c.acked[c.left - 1].1
                ));
                c.left -= 1;
            }
            if c.left > 0 && c.acked[c.left - 1].1 == id {
                let i = c.acked[c.left - 1].2;
                let (sender, client_msg_id) = plan::sender_of(i);
                let payload = &self.payloads[(i % self.payloads.len() as u64) as usize];
                if r.sender_id() != self.base + self.sender_offset + sender
                    || r.client_msg_id() != client_msg_id
                    || r.payload() != payload.as_slice()
                {
                    faults.push(format!(
                        "group {}: id {id} holds another message than the one acknowledged",
                        c.group
                    ));
                }
                c.left -= 1;
            } else if self.exact {
                faults.push(format!("group {}: id {id} was never acknowledged", c.group));
            }
        }
        let more = has_more && oldest.is_some() && faults.is_empty();
        if let Some(o) = oldest {
            c.before = o;
        }
        if !more && c.left > 0 && faults.is_empty() {
            faults.push(format!(
                "group {}: {} acknowledged sends not in HISTORY (the oldest id {})",
                c.group, c.left, c.acked[0].1
            ));
        }
        for f in faults {
            self.faults.add(f);
        }
        more
    }
}

impl Job for ReadBackJob<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        let k = match self.ready.pop_front() {
            Some(k) => k,
            None if self.in_flight < self.window => self.not_started.next()?,
            None => return None,
        };
        self.in_flight += 1;
        let c = &self.checks[k];
        let member = self.pop.members(c.group)[0];
        Some((
            k as u64,
            Request::History {
                group: self.base + c.group,
                user: self.base + u64::from(member),
                before_msg_id: c.before,
                max_count: self.page,
            },
        ))
    }

    fn complete(&mut self, k: u64, resp: Response<'_>, t: &mut Tally) {
        self.in_flight -= 1;
        t.ops += 1;
        let k = k as usize;
        match resp {
            Response::History { has_more, records } => {
                if self.check_page(k, has_more, records) {
                    self.ready.push_back(k);
                }
            }
            Response::Error(e) => self.faults.add(format!(
                "group {}: HISTORY: {:?}: {}",
                self.checks[k].group, e.code, e.message
            )),
            _ => self.faults.add(format!(
                "group {}: unexpected answer to HISTORY",
                self.checks[k].group
            )),
        }
    }

    fn finished(&self) -> bool {
        self.ready.is_empty() && self.not_started.is_empty() && self.in_flight == 0
    }
}

// ---------------------------------------------------------------- phases

/// One [`SendJob`] per connection for messages `range` (indexes), whose
/// groups are `targets` (from `range.start`).
fn send_jobs<'a>(
    ctx: &'a Ctx<'_>,
    users: u64,
    acked: &'a AtomicU64,
    range: Range<u64>,
    targets: &'a [u32],
) -> Vec<SendJob<'a>> {
    split(range.end - range.start, ctx.args.connections.max(1))
        .into_iter()
        .map(|r| SendJob {
            got: Vec::with_capacity((r.end - r.start) as usize),
            range: r,
            first: range.start,
            targets,
            base: ctx.base,
            // Senders are users above the population: never members, so
            // no cursor moves with a send.
            sender_offset: users,
            payloads: ctx.payloads,
            size: ctx.args.size as u64,
            acked,
            duplicates: 0,
        })
        .collect()
}

fn connect(ctx: &Ctx<'_>, addr: &str, n: usize) -> Result<Vec<Conn>, String> {
    (0..n)
        .map(|_| Conn::connect(addr, ctx.token.as_deref(), IO_TIMEOUT))
        .collect()
}

/// What one validation found.
struct Validation {
    groups: u64,
    records: u64,
    acked: u64,
    faults: Faults,
    secs: f64,
}

impl Validation {
    fn to_json(&self) -> Value {
        json!({
            "groups_checked": self.groups,
            "acknowledged_sends_checked": self.acked,
            "records_read": self.records,
            "faults": self.faults.count,
            "fault_samples": self.faults.samples,
            "secs": self.secs,
        })
    }
}

/// Member counts of every group, then every acknowledged send read back.
/// `acked` is sorted by (group, msg_id).
/// Restarts the node on its directory and measures the restart: its
/// seconds, the memory the node then holds, and a validation of every
/// group (`exact` and `label` as for `validate`).
fn restart_and_validate(
    ctx: &Ctx<'_>,
    node: &mut SpawnedNode,
    pop: &Population,
    acked: &[(u32, u64, u64)],
    exact: bool,
    label: &str,
) -> Result<(f64, Memory, Validation), String> {
    let secs = node.restart(ctx.token.as_deref())?.as_secs_f64();
    let mem = node.memory()?;
    let validation = validate(ctx, &node.addr, pop, acked, exact, label)?;
    Ok((secs, mem, validation))
}

fn validate(
    ctx: &Ctx<'_>,
    addr: &str,
    pop: &Population,
    acked: &[(u32, u64, u64)],
    exact: bool,
    label: &str,
) -> Result<Validation, String> {
    let started = Instant::now();
    let a = ctx.args;
    let mut conns = connect(ctx, addr, a.connections)?;
    let jobs: Vec<_> = split(pop.groups, conns.len())
        .into_iter()
        .map(|r| CountJob {
            range: (r.start + 1)..(r.end + 1),
            pop,
            base: ctx.base,
            faults: Faults::default(),
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.setup_phase(label, "groups"))?;
    let mut faults = Faults::default();
    for e in &r.tally.error_samples {
        faults.add(e.clone());
    }
    for j in r.jobs {
        faults.merge(j.faults);
    }

    let mut checks: Vec<GroupCheck<'_>> = Vec::new();
    let mut start = 0;
    while start < acked.len() {
        let g = acked[start].0;
        let end = start + acked[start..].partition_point(|x| x.0 == g);
        checks.push(GroupCheck {
            group: u64::from(g),
            acked: &acked[start..end],
            left: end - start,
            before: 0,
            expect: 0,
            head: None,
        });
        start = end;
    }
    let n_checks = checks.len();
    let mut parts: Vec<Vec<GroupCheck<'_>>> = Vec::new();
    let mut rest = checks.into_iter();
    for r in split(n_checks as u64, conns.len()) {
        parts.push(rest.by_ref().take((r.end - r.start) as usize).collect());
    }
    let jobs: Vec<_> = parts
        .into_iter()
        .map(|checks| ReadBackJob {
            not_started: 0..checks.len(),
            checks,
            ready: VecDeque::new(),
            in_flight: 0,
            window: a.in_flight.max(1),
            pop,
            base: ctx.base,
            sender_offset: pop.users,
            payloads: ctx.payloads,
            page: a.page.max(1),
            exact,
            records: 0,
            faults: Faults::default(),
        })
        .collect();
    let r = run_phase(&mut conns, jobs, &ctx.setup_phase(label, "pages"))?;
    for e in &r.tally.error_samples {
        faults.add(e.clone());
    }
    let mut records = 0;
    for j in r.jobs {
        records += j.records;
        faults.merge(j.faults);
    }
    Ok(Validation {
        groups: pop.groups,
        records,
        acked: acked.len() as u64,
        faults,
        secs: started.elapsed().as_secs_f64(),
    })
}

/// The `serve` flags the population's node runs with: a short idle time
/// ([`IDLE_FLAG`], `--node-idle-evict-ms` unless 0) if `bin` has that
/// flag, and `--node-checkpoint-interval-ms` and
/// `--node-small-group-bytes-max` if given (an error if `bin` lacks one).
pub(crate) fn node_flags(
    args: &super::BenchArgs,
    bin: &std::path::Path,
) -> Result<Vec<String>, String> {
    let mut flags = Vec::new();
    if args.node_idle_evict_ms > 0 && serve_has_flag(bin, IDLE_FLAG)? {
        flags.extend([IDLE_FLAG.to_string(), args.node_idle_evict_ms.to_string()]);
    }
    let passed = [
        (
            args.node_checkpoint_interval_ms,
            "--node-checkpoint-interval-ms",
            "--checkpoint-interval-ms",
        ),
        (
            args.node_small_group_bytes_max,
            "--node-small-group-bytes-max",
            "--small-group-bytes-max",
        ),
    ];
    for (value, ours, flag) in passed {
        let Some(v) = value else { continue };
        if !serve_has_flag(bin, flag)? {
            return Err(format!("{ours}: {} serve has no {flag}", bin.display()));
        }
        flags.extend([flag.to_string(), v.to_string()]);
    }
    Ok(flags)
}

/// How a [`settle`] ended.
struct Settled {
    secs: f64,
    /// `engine.groups_in_use` when it ended (None: not reported).
    groups_in_use: Option<u64>,
    /// Checkpoints the node stored meanwhile (None: not reported).
    checkpoints: Option<u64>,
}

impl Settled {
    fn to_json(&self) -> Value {
        json!({
            "secs": self.secs,
            "groups_in_use": self.groups_in_use,
            "checkpoints": self.checkpoints,
        })
    }
}

/// Waits for the groups a phase used to go idle and give back their
/// memory (module docs). Returns at once if `idle_ms` is None (the node
/// has no idle eviction) or STATS says no group is in use. Else polls
/// `engine.groups_in_use` until it is 0, or until it has not fallen for
/// `max(2 × idle time, 5 s)` once the idle time and
/// [`SETTLE_SWEEP_SLACK`] have passed *and* a checkpoint was stored since
/// the wait began (a group whose new files are not synced yet stays in use
/// until a checkpoint syncs them), or at the latest [`SETTLE_MAX`] past the
/// idle time; and, when the node reports its checkpoints, until one was
/// stored since the wait began (what the phase changed is then no longer
/// held for the next capture), within the same bound. Without that figure it waits the idle time and
/// [`SETTLE_FIXED_SLACK`].
fn settle(conn: &mut Conn, idle_ms: Option<u64>) -> Result<Settled, String> {
    let started = Instant::now();
    let first = node_stats(conn)?;
    let in_use = stat(&first, "engine.groups_in_use");
    let ckpt0 = stat(&first, "engine.checkpoints");
    let checkpoints = |s: &std::collections::HashMap<String, u64>| {
        ckpt0
            .zip(stat(s, "engine.checkpoints"))
            .map(|(a, b)| b.saturating_sub(a))
    };
    let Some(idle_ms) = idle_ms else {
        return Ok(Settled {
            secs: 0.0,
            groups_in_use: in_use,
            checkpoints: Some(0),
        });
    };
    let idle = Duration::from_millis(idle_ms);
    let Some(mut last) = in_use else {
        std::thread::sleep(idle + SETTLE_FIXED_SLACK);
        return Ok(Settled {
            secs: started.elapsed().as_secs_f64(),
            groups_in_use: None,
            checkpoints: checkpoints(&node_stats(conn)?),
        });
    };
    let stalled_for = (2 * idle).max(Duration::from_secs(5));
    let mut fell_at = Instant::now();
    let mut stored = Some(0);
    // Idle also means nothing waiting for a checkpoint: the users whose
    // membership changed are listed per group until the next capture
    // (`dirty.rs`), state of the phase, not of idle groups. So the wait
    // goes on until a checkpoint was stored since it began (at most
    // `checkpoint_interval_ms` after the phase; `--node-checkpoint-interval-ms`).
    while last > 0 || stored == Some(0) {
        let waited = started.elapsed();
        let checkpointed = stored.is_none_or(|n| n > 0);
        if waited >= idle + SETTLE_MAX
            || (checkpointed
                && waited >= idle + SETTLE_SWEEP_SLACK
                && fell_at.elapsed() >= stalled_for)
        {
            break;
        }
        std::thread::sleep(SETTLE_POLL);
        let s = node_stats(conn)?;
        let now = stat(&s, "engine.groups_in_use").unwrap_or(0);
        let before = stored;
        stored = checkpoints(&s);
        // A checkpoint just stored lets the groups it synced go at their
        // next turn (up to an idle time later): the stall clock restarts.
        if now < last || stored != before {
            fell_at = Instant::now();
        }
        last = now;
    }
    Ok(Settled {
        secs: started.elapsed().as_secs_f64(),
        groups_in_use: Some(last),
        checkpoints: stored,
    })
}

fn stat(stats: &std::collections::HashMap<String, u64>, name: &str) -> Option<u64> {
    stats.get(name).copied()
}

fn per(x: u64, base: u64, n: u64) -> f64 {
    (x as f64 - base as f64) / n.max(1) as f64
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// Runs the population workload on the node `--spawn` started.
pub(crate) fn population(ctx: &Ctx<'_>, node: &mut SpawnedNode) -> Result<Report, String> {
    let a = ctx.args;
    let groups = a.groups.unwrap_or(1_000_000);
    let users = a.members.unwrap_or(groups.max(USERS_MIN));
    let messages = a.messages.unwrap_or(1_000_000);
    let started = Instant::now();
    let pop = Population::new(a.seed, groups, users, a.group_size_max)?;
    let memberships = pop.memberships();
    let plan_secs = started.elapsed().as_secs_f64();

    let mut params = Map::new();
    params.insert("groups".into(), groups.into());
    params.insert("users".into(), users.into());
    params.insert("messages".into(), messages.into());
    params.insert("group_size_max".into(), pop.big_max.into());
    let mut rep = Report::new(
        ctx,
        "population",
        format!(
            "population: {} groups ({} pairs, {} of {MID_MIN}-{MID_MAX}, {} of {}-{}; {} memberships, largest {}), {} users, then {} sends Zipf({SEND_EXPONENT}) by group, {} connections x {} in flight, {}-byte payloads, fsync {}",
            group_digits(groups),
            group_digits(groups - pop.mid_groups - pop.big_groups),
            group_digits(pop.mid_groups),
            group_digits(pop.big_groups),
            group_digits(BIG_MIN),
            group_digits(pop.big_max),
            group_digits(memberships),
            group_digits(pop.largest()),
            group_digits(users),
            group_digits(messages),
            a.connections,
            a.in_flight,
            a.size,
            ctx.fsync
        ),
        params,
        "sends",
    );

    // ---- phase 1: groups and memberships
    let mut conns = connect(ctx, &node.addr, a.connections)?;
    let empty_disk = node.disk_usage()?;
    let empty_mem = node.memory()?;
    let create_secs = setup(
        ctx,
        &mut conns,
        "population groups",
        "groups",
        groups,
        || |i| SetupOp::Create(i + 1),
    )?;
    let created_disk = node.disk_usage()?;
    let created_mem_at_once = node.memory()?;
    let idle_ms = node.has_flag(IDLE_FLAG).then_some(a.node_idle_evict_ms);
    let created_settle = settle(&mut conns[0], idle_ms)?;
    let created_mem = node.memory()?;
    let pop_ref = &pop;
    let join_secs = setup(
        ctx,
        &mut conns,
        "population joins",
        "joins",
        memberships,
        || {
            let mut group = 0u64;
            move |i| {
                // Memberships come in order within a connection's range:
                // find the first one's group, then step along.
                if group == 0 {
                    group = pop_ref.group_of(i);
                }
                while pop_ref.offsets[group as usize] <= i {
                    group += 1;
                }
                SetupOp::Join {
                    group,
                    user: u64::from(pop_ref.members[i as usize]),
                    start: JoinStart::Head,
                }
            }
        },
    )?;
    let joined_disk = node.disk_usage()?;
    let joined_mem_at_once = node.memory()?;
    let joined_settle = settle(&mut conns[0], idle_ms)?;
    let joined_mem = node.memory()?;
    rep.setup.push((
        format!("plan ({} memberships)", group_digits(memberships)),
        plan_secs,
    ));
    rep.setup.push((
        format!("{} groups created", group_digits(groups)),
        create_secs,
    ));
    rep.setup
        .push((format!("{} joins", group_digits(memberships)), join_secs));

    // ---- phase 2: sends
    let targets = pop.send_targets(0..messages);
    let before = node_stats(&mut conns[0])?;
    let acked_count = AtomicU64::new(0);
    let r = run_phase(
        &mut conns,
        send_jobs(ctx, users, &acked_count, 0..messages, &targets),
        &ctx.measured_phase("population sends", "sends"),
    )?;
    let after = node_stats(&mut conns[0])?;
    let sent_disk = node.disk_usage()?;
    let sent_mem = node.memory()?;
    drop(conns);
    let mut acked: Vec<(u32, u64, u64)> = Vec::with_capacity(messages as usize);
    let mut duplicates = 0;
    for j in &r.jobs {
        duplicates += j.duplicates;
        acked.extend_from_slice(&j.got);
    }
    acked.sort_unstable();
    let mut dense_fault = None;
    let mut start = 0;
    while start < acked.len() && dense_fault.is_none() {
        let g = acked[start].0;
        let end = start + acked[start..].partition_point(|x| x.0 == g);
        for (k, x) in acked[start..end].iter().enumerate() {
            if x.1 != k as u64 + 1 {
                dense_fault = Some(format!(
                    "group {g}: the {}th id acknowledged is {}",
                    k + 1,
                    x.1
                ));
                break;
            }
        }
        start = end;
    }
    let groups_touched = {
        let mut n = 0u64;
        let mut last = 0u32;
        for x in &acked {
            if x.0 != last {
                n += 1;
                last = x.0;
            }
        }
        n
    };
    rep.tally = r.tally;
    rep.measured_secs = r.elapsed.as_secs_f64();
    rep.cut_short = r.cut_short;

    // ---- phase 3: clean stop and restart, validate; kill under load, restart, validate
    let stop_secs = node.stop_clean()?.as_secs_f64();
    let (clean_restart_secs, clean_mem, clean) =
        restart_and_validate(ctx, node, &pop, &acked, true, "validate (clean restart)")?;

    let crash_sends = messages.max(1);
    let kill_after = (messages / 10).max(1);
    let crash_targets = pop.send_targets(messages..messages + crash_sends);
    acked_count.store(0, Ordering::Relaxed);
    let mut conns = connect(ctx, &node.addr, a.connections)?;
    let pid = node.pid();
    let mut load_cfg = ctx.setup_phase("population load until SIGKILL", "sends");
    load_cfg.until_disconnect = true;
    let crash = std::thread::scope(|s| {
        let killer = s.spawn(|| {
            while acked_count.load(Ordering::Relaxed) < kill_after {
                std::thread::sleep(Duration::from_micros(200));
            }
            kill_now(pid);
        });
        let r = run_phase(
            &mut conns,
            send_jobs(
                ctx,
                users,
                &acked_count,
                messages..messages + crash_sends,
                &crash_targets,
            ),
            &load_cfg,
        );
        if r.is_err() || !matches!(&r, Ok(r) if r.cut_short) {
            // The load ended without the kill (an error, or every send
            // answered first): kill now so the killer thread ends.
            acked_count.fetch_add(kill_after, Ordering::Relaxed);
        }
        let _ = killer.join();
        r
    });
    drop(conns);
    node.reap()?;
    let crash = crash?;
    let mut crash_errors = crash.tally.error_samples.clone();
    if !crash.cut_short {
        crash_errors.push("every send of the load was answered before the kill".into());
    }
    let crash_acked: u64 = crash.jobs.iter().map(|j| j.got.len() as u64).sum();
    for j in &crash.jobs {
        duplicates += j.duplicates;
        acked.extend_from_slice(&j.got);
    }
    acked.sort_unstable();
    let (crash_restart_secs, crash_mem, crashed) =
        restart_and_validate(ctx, node, &pop, &acked, false, "validate (crash restart)")?;

    // ---- figures
    let ckpt = |s: &std::collections::HashMap<String, u64>| {
        (
            stat(s, "engine.checkpoints"),
            stat(s, "engine.checkpoint_bytes"),
            stat(s, "engine.checkpoint_bytes_max"),
            stat(s, "engine.journal_bytes"),
        )
    };
    let (c0, b0, _, j0) = ckpt(&before);
    let (c1, b1, m1, j1) = ckpt(&after);
    let ratio = |b: Option<u64>, j: Option<u64>| match (b, j) {
        (Some(b), Some(j)) if j > 0 => Some(b as f64 / j as f64),
        _ => None,
    };
    let d = |x: Option<u64>, y: Option<u64>| x.zip(y).map(|(x, y)| y.saturating_sub(x));
    let send_ckpt_bytes = d(b0, b1);
    let send_journal = d(j0, j1);
    let checkpoints = json!({
        "count": c1,
        "bytes": b1,
        "bytes_max": m1,
        "journal_bytes": j1,
        "bytes_per_journal_byte": ratio(b1, j1),
        "send_phase": {
            "count": d(c0, c1),
            "bytes": send_ckpt_bytes,
            "journal_bytes": send_journal,
            "bytes_per_journal_byte": ratio(send_ckpt_bytes, send_journal),
        },
    });
    let disk_json = |u: DiskUsage| json!({"bytes": u.bytes, "inodes": u.inodes});
    let mem_json = |m: Memory| json!({"rss_bytes": m.rss_bytes, "anon_bytes": m.anon_bytes});
    rep.extra.insert(
        "population".into(),
        json!({
            "groups": groups,
            "users": users,
            "memberships": memberships,
            "pair_groups": groups - pop.mid_groups - pop.big_groups,
            "mid_groups": pop.mid_groups,
            "big_groups": pop.big_groups,
            "largest_group": pop.largest(),
            "memberships_per_group": memberships as f64 / groups as f64,
        }),
    );
    rep.extra.insert(
        "create".into(),
        json!({
            "groups": groups,
            "secs": create_secs,
            "groups_per_sec": groups as f64 / create_secs.max(1e-9),
        }),
    );
    rep.extra.insert(
        "join".into(),
        json!({
            "memberships": memberships,
            "secs": join_secs,
            "joins_per_sec": memberships as f64 / join_secs.max(1e-9),
        }),
    );
    let bytes_per_group = per(created_disk.bytes, empty_disk.bytes, groups);
    let inodes_per_group = per(created_disk.inodes, empty_disk.inodes, groups);
    rep.extra.insert(
        "disk".into(),
        json!({
            "empty": disk_json(empty_disk),
            "after_create": disk_json(created_disk),
            "after_join": disk_json(joined_disk),
            "after_send": disk_json(sent_disk),
            "bytes_per_group": bytes_per_group,
            "inodes_per_group": inodes_per_group,
            "bytes_per_membership": per(joined_disk.bytes, created_disk.bytes, memberships),
        }),
    );
    let rss_per_group = per(created_mem.rss_bytes, empty_mem.rss_bytes, groups);
    let rss_per_membership = per(joined_mem.rss_bytes, created_mem.rss_bytes, memberships);
    rep.extra.insert(
        "memory".into(),
        json!({
            "empty": mem_json(empty_mem),
            "after_create": mem_json(created_mem),
            "after_join": mem_json(joined_mem),
            "after_send": mem_json(sent_mem),
            "after_clean_restart": mem_json(clean_mem),
            "after_crash_restart": mem_json(crash_mem),
            "rss_bytes_per_group": rss_per_group,
            "rss_bytes_per_membership": rss_per_membership,
            "anon_bytes_per_group": per(created_mem.anon_bytes, empty_mem.anon_bytes, groups),
            "anon_bytes_per_membership": per(joined_mem.anon_bytes, created_mem.anon_bytes, memberships),
            "before_settle": {
                "after_create": mem_json(created_mem_at_once),
                "after_join": mem_json(joined_mem_at_once),
            },
            "settle": {
                "idle_evict_ms": idle_ms,
                "after_create": created_settle.to_json(),
                "after_join": joined_settle.to_json(),
            },
        }),
    );
    let rounds = d(
        stat(&before, "engine.commit_rounds"),
        stat(&after, "engine.commit_rounds"),
    );
    rep.extra.insert(
        "send".into(),
        json!({
            "messages": messages,
            "groups_touched": groups_touched,
            "commit_rounds": rounds,
            "fsyncs": d(stat(&before, "engine.fsyncs"), stat(&after, "engine.fsyncs")),
            "group_loads": d(stat(&before, "engine.group_loads"), stat(&after, "engine.group_loads")),
            "requests_waited_for_load": d(
                stat(&before, "net.requests_waited_for_load"),
                stat(&after, "net.requests_waited_for_load")
            ),
        }),
    );
    rep.extra.insert("checkpoints".into(), checkpoints);
    rep.extra.insert(
        "restart".into(),
        json!({
            "clean_stop_secs": stop_secs,
            "clean_restart_secs": clean_restart_secs,
            "crash_load_sends_acknowledged": crash_acked,
            "crash_kill_after_acknowledged": kill_after,
            "crash_restart_secs": crash_restart_secs,
        }),
    );
    rep.extra.insert(
        "validation".into(),
        json!({
            "after_clean_restart": clean.to_json(),
            "after_crash_restart": crashed.to_json(),
        }),
    );

    // ---- verdict
    let mut problems = Vec::new();
    if let Some(f) = dense_fault {
        problems.push(format!("ids not dense: {f}"));
    }
    if duplicates > 0 {
        problems.push(format!("{duplicates} sends answered as duplicates"));
    }
    if rep.tally.errors > 0 {
        problems.push(format!("{} send errors", rep.tally.errors));
    }
    for (what, v) in [
        ("after the clean restart", &clean),
        ("after the crash restart", &crashed),
    ] {
        if v.faults.count > 0 {
            problems.push(format!(
                "{what}: {} faults, e.g. {}",
                v.faults.count,
                v.faults.samples.join("; ")
            ));
        }
    }
    if !crash_errors.is_empty() {
        problems.push(format!("load before the kill: {}", crash_errors.join("; ")));
    }
    rep.verified = problems.is_empty();
    rep.verification = if rep.verified {
        format!(
            "every group's member count read back after both restarts ({} groups, {} memberships); every acknowledged send read back intact ({} after the clean restart, heads equal; {} after the kill, heads at or above), ids dense",
            group_digits(groups),
            group_digits(memberships),
            group_digits(clean.acked),
            group_digits(crashed.acked)
        )
    } else {
        problems.join(" | ")
    };

    let opt = |v: Option<u64>| v.map_or_else(|| "n/a".to_string(), group_digits);
    let optf = |v: Option<f64>| v.map_or_else(|| "n/a".to_string(), |x| format!("{x:.3}"));
    rep.table = vec![
        format!(
            "create    {} groups in {:.2} s: {} groups/s",
            group_digits(groups),
            create_secs,
            group_digits((groups as f64 / create_secs.max(1e-9)) as u64)
        ),
        format!(
            "join      {} memberships in {:.2} s: {} joins/s",
            group_digits(memberships),
            join_secs,
            group_digits((memberships as f64 / join_secs.max(1e-9)) as u64)
        ),
        format!(
            "disk      {} bytes and {:.3} inodes per group (empty {} / {} inodes; created {} / {}; joined {}; after sends {} / {})",
            group_digits(bytes_per_group.max(0.0) as u64),
            inodes_per_group,
            mib(empty_disk.bytes),
            group_digits(empty_disk.inodes),
            mib(created_disk.bytes),
            group_digits(created_disk.inodes),
            mib(joined_disk.bytes),
            mib(sent_disk.bytes),
            group_digits(sent_disk.inodes)
        ),
        format!(
            "memory    {} bytes RSS per group, {:.1} per membership (empty {}, created {}, joined {}, after sends {}, after restarts {} / {})",
            group_digits(rss_per_group.max(0.0) as u64),
            rss_per_membership,
            mib(empty_mem.rss_bytes),
            mib(created_mem.rss_bytes),
            mib(joined_mem.rss_bytes),
            mib(sent_mem.rss_bytes),
            mib(clean_mem.rss_bytes),
            mib(crash_mem.rss_bytes)
        ),
        match idle_ms {
            Some(ms) => format!(
                "idle      node idle time {ms} ms: read {:.1} s after creation ({} groups in use; {} at once) and {:.1} s after the joins ({} in use; {} at once)",
                created_settle.secs,
                opt(created_settle.groups_in_use),
                mib(created_mem_at_once.rss_bytes),
                joined_settle.secs,
                opt(joined_settle.groups_in_use),
                mib(joined_mem_at_once.rss_bytes)
            ),
            None => "idle      the node has no idle eviction (no --idle-evict-ms): memory read at once".to_string(),
        },
        format!(
            "sends     {} groups touched, {} commit rounds, {} group loads",
            group_digits(groups_touched),
            opt(rounds),
            opt(d(
                stat(&before, "engine.group_loads"),
                stat(&after, "engine.group_loads")
            ))
        ),
        format!(
            "ckpt      {} checkpoints, {} bytes (largest {}), {} journal bytes: {} checkpoint bytes per journal byte; send phase: {} checkpoints, {}",
            opt(c1),
            opt(b1),
            opt(m1),
            opt(j1),
            optf(ratio(b1, j1)),
            opt(d(c0, c1)),
            optf(ratio(send_ckpt_bytes, send_journal))
        ),
        format!(
            "restart   clean stop {:.2} s, clean restart {:.3} s; SIGKILL after {} acknowledged sends of the load, crash restart {:.3} s",
            stop_secs,
            clean_restart_secs,
            group_digits(crash_acked),
            crash_restart_secs
        ),
        format!(
            "validate  clean restart: {} faults in {:.1} s; crash restart: {} faults in {:.1} s",
            clean.faults.count, clean.secs, crashed.faults.count, crashed.secs
        ),
    ];
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_has_its_bands_and_distinct_members() {
        let p = Population::new(7, 5_000, 5_000, 100_000).unwrap();
        assert_eq!(p.big_groups, 5);
        assert_eq!(p.mid_groups, 995);
        let mut bands = [0u64; 3];
        for g in 1..=p.groups {
            let m = p.members(g);
            let band = p.band(g);
            bands[band as usize] += 1;
            let (lo, hi) = match band {
                Band::Pair => (2, 2),
                Band::Mid => (MID_MIN, MID_MAX),
                Band::Big => (BIG_MIN, 5_000),
            };
            assert!(
                (lo..=hi).contains(&(m.len() as u64)),
                "group {g}: {}",
                m.len()
            );
            let distinct: HashSet<u32> = m.iter().copied().collect();
            assert_eq!(distinct.len(), m.len(), "group {g}");
            assert!(m.iter().all(|&u| (1..=5_000).contains(&u)));
            assert_eq!(p.group_of(p.offsets[(g - 1) as usize]), g);
        }
        assert_eq!(bands, [4_000, 995, 5]);
        // Deterministic, and sizes favour the small end of the band.
        let q = Population::new(7, 5_000, 5_000, 100_000).unwrap();
        assert_eq!(p.members, q.members);
        let mids: Vec<usize> = (1..=p.groups)
            .filter(|&g| p.band(g) == Band::Mid)
            .map(|g| p.members(g).len())
            .collect();
        let below_20 = mids.iter().filter(|&&n| n < 20).count();
        assert!(below_20 * 2 > mids.len(), "{below_20} of {}", mids.len());
    }

    #[test]
    fn users_span_many_groups_and_sends_skew_by_group() {
        let p = Population::new(3, 20_000, 20_000, 100_000).unwrap();
        let mut per_user = vec![0u32; 20_001];
        for &u in &p.members {
            per_user[u as usize] += 1;
        }
        let busiest = *per_user.iter().max().unwrap();
        assert!(busiest > 200, "{busiest}");
        let targets = p.send_targets(0..50_000);
        assert!(targets.iter().all(|&g| (1..=20_000).contains(&g)));
        let mut counts = vec![0u32; 20_001];
        for &g in &targets {
            counts[g as usize] += 1;
        }
        // Zipf(1): the busiest group gets about 1/H(20,000) = 9% of sends.
        let top = *counts.iter().max().unwrap();
        assert!((2_500..7_000).contains(&top), "{top}");
    }

    #[test]
    fn shuffle_is_a_bijection() {
        for n in [1u64, 2, 10, 1000, 1001] {
            let s = Shuffle::new(5, 1, n);
            let mut seen: Vec<u64> = (0..n).map(|x| s.at(x)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
        }
    }
}
