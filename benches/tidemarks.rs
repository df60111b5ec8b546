//! Tidemark benchmarks: the IM-bench workloads on cursors, in process.
//!
//! - `ack_single` (W3 shape): one group of 100,000 members, single ACKs from
//!   one thread, each moving a random member's cursor forward. One
//!   iteration is one ACK. Setup stores 100,000 messages (not W3's 1,000,000:
//!   enough room for the cursors to move) and, once, times a W3 run of
//!   1,000,000 ACKs outside criterion.
//! - `ack_batched`: `batch_ack` of 50 `(group, msg_id)` pairs of one user,
//!   every pair moving that user's cursor in one of its 50 groups forward.
//!   10,000 users are members of the same 50 groups so that every ACK moves
//!   a cursor (one user alone would run out of messages to acknowledge).
//!   One iteration is one call; throughput counts ACKs.
//! - `pull_w2` (W2 shape): one group, 2,000 members, 100,000 stored 200-byte
//!   messages, cursors uniform in [90,000, 100,000). `read_pages_no_ack`
//!   reads every member's backlog with `Engine::read` in pages of 200 (the
//!   read path `pull` uses, cursors unchanged, so every iteration is the same
//!   work); `pull_and_ack_chain` is the real W2 protocol, `pull` with
//!   `ack_up_to` = last id of the previous page and a final `ack`, on 2,000
//!   fresh members joined (untimed) before each iteration. Throughput counts
//!   records delivered; every iteration checks the delivered total.
//! - `unread_w4` (W4 shape): 100,000 users, 10,000 groups, 50 groups per
//!   user (5,000,000 memberships), 1,000,000 messages, random cursors;
//!   `unread(user)` of random users. Setup also times W4's 100,000 queries
//!   once and checks every answer against a model.
//! - `sync`: users in 50 groups, each with 1 to 100 unread messages;
//!   `sync(user, 20, 1 MiB, None)` of random users.
//!
//! Data lives in temporary directories with `fsync=never`; setup runs once
//! per benchmark, outside the timing, and only for benchmarks that the
//! command-line filter selects. Lines starting with `setup:` and `verify:`
//! are printed outside the timing.

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{
    black_box, criterion_group, criterion_main, BenchmarkGroup, Criterion, SamplingMode, Throughput,
};
use tidemark_engine::{AppendRequest, Config, Engine, FsyncPolicy, JoinStart, OpTicket};

const SEED: u64 = 0x7469_6465_6d61_726b;
const PAYLOAD_BYTES: usize = 200;
/// Distinct random payloads cycled through where payload content is not read.
const PAYLOADS: usize = 1024;
const APPEND_BATCH: usize = 1_000;
/// Joins submitted between two waits (bounds the pending round).
const JOIN_CHUNK: usize = 100_000;

const W3_MEMBERS: u64 = 100_000;
const W3_MESSAGES: u64 = 100_000;
const W3_ACKS: usize = 1_000_000;
/// Largest forward step of one ACK.
const ACK_STEP_MAX: u64 = 16;

const BATCH_GROUPS: u64 = 50;
const BATCH_USERS: u64 = 10_000;
const BATCH_MESSAGES_PER_GROUP: u64 = 2_000;

const W2_MEMBERS: u64 = 2_000;
const W2_MESSAGES: u64 = 100_000;
const W2_CURSOR_LOW: u64 = 90_000;
const W2_PAGE_RECORDS: usize = 200;
const W2_PAGE_BYTES: usize = 1 << 20;
/// First user id of the members joined for each `pull_and_ack_chain` iteration.
const W2_FRESH_USERS_BASE: u64 = 1_000_000;

/// W4 at full size: setup (1,000,000 appends, 5,000,000 joins) stays well
/// under a minute on two cores, so no scaling down was needed.
const W4_USERS: u64 = 100_000;
const W4_GROUPS: u64 = 10_000;
const W4_GROUPS_PER_USER: usize = 50;
const W4_MESSAGES: u64 = 1_000_000;
const W4_QUERIES: usize = 100_000;

const SYNC_GROUPS: u64 = 50;
const SYNC_USERS: u64 = 1_000;
const SYNC_MESSAGES_PER_GROUP: u64 = 1_000;
const SYNC_UNREAD_MAX: u64 = 100;
const SYNC_PER_GROUP: usize = 20;
const SYNC_BYTES: usize = 1 << 20;

/// splitmix64: deterministic, fixed seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

fn payloads(rng: &mut Rng, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            let mut p = vec![0u8; PAYLOAD_BYTES];
            rng.fill(&mut p);
            p
        })
        .collect()
}

fn bench_group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    g
}

/// An engine in a temporary directory.
struct Fixture {
    _dir: tempfile::TempDir,
    engine: Engine,
}

impl Fixture {
    fn new(tune: impl FnOnce(&mut Config)) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut config = Config::new(dir.path());
        config.fsync = FsyncPolicy::Never;
        tune(&mut config);
        let engine = Engine::open(config).expect("open engine");
        Fixture { _dir: dir, engine }
    }

    /// Creates groups `1..=groups` in few commit rounds.
    fn create_groups(&self, groups: u64) {
        let mut last = None;
        for g in 1..=groups {
            last = Some(self.engine.submit_create_group(g).expect("create group"));
        }
        if let Some(t) = last {
            self.engine.wait_op(t).expect("group creations");
        }
    }

    /// Appends one message per item of `groups`, by batches; `payload(i)` is
    /// the payload of the i-th message.
    fn store<'p>(&self, groups: impl Iterator<Item = u64>, payload: impl Fn(usize) -> &'p [u8]) {
        let mut reqs = Vec::with_capacity(APPEND_BATCH);
        for (i, g) in groups.enumerate() {
            reqs.push(AppendRequest {
                group_id: g,
                sender_id: 1,
                client_msg_id: i as u64 + 1,
                payload: payload(i),
            });
            if reqs.len() == APPEND_BATCH {
                self.engine.append_batch(&reqs).expect("append_batch");
                reqs.clear();
            }
        }
        if !reqs.is_empty() {
            self.engine.append_batch(&reqs).expect("append_batch");
        }
    }

    /// Joins every `(group, user, start)`, waiting every `JOIN_CHUNK` joins;
    /// returns how many were submitted.
    fn join_all(&self, joins: impl Iterator<Item = (u64, u64, JoinStart)>) -> u64 {
        let mut n = 0u64;
        let mut unwaited = 0;
        let mut last: Option<OpTicket> = None;
        for (g, u, start) in joins {
            last = Some(self.engine.submit_join(g, u, start).expect("submit_join"));
            n += 1;
            unwaited += 1;
            if unwaited == JOIN_CHUNK {
                self.engine
                    .wait_op(last.take().expect("ticket"))
                    .expect("join");
                unwaited = 0;
            }
        }
        if let Some(t) = last {
            self.engine.wait_op(t).expect("join");
        }
        n
    }

    fn memberships(&self) -> u64 {
        self.engine.membership_memory().0
    }
}

/// Runs `iters` operations on `state` in chunks of at most `chunk`:
/// `prepare(state, n)` builds the inputs of `n` operations outside the
/// timing, `run(state, inputs)` performs them inside it and says whether
/// every one did what the model expected. Returns the time spent in `run`.
fn timed_chunks<S, T>(
    state: &mut S,
    iters: u64,
    chunk: usize,
    prepare: impl Fn(&mut S, usize) -> T,
    run: impl Fn(&mut S, T) -> bool,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    let mut all_ok = true;
    while left > 0 {
        let n = left.min(chunk as u64) as usize;
        let input = prepare(state, n);
        let start = Instant::now();
        all_ok &= run(state, input);
        total += start.elapsed();
        left -= n as u64;
    }
    assert!(
        all_ok,
        "an ACK did not move its cursor as the model expects"
    );
    total
}

// ---------------------------------------------------------------- ack_single

/// The cursors of the W3 group as the bench expects them to be.
struct W3 {
    f: Fixture,
    /// Index `user - 1`.
    cursors: Vec<u64>,
    rng: Rng,
}

impl W3 {
    fn setup() -> W3 {
        let start = Instant::now();
        let f = Fixture::new(|_| {});
        f.create_groups(1);
        let payloads = payloads(&mut Rng(SEED), PAYLOADS);
        f.store((0..W3_MESSAGES).map(|_| 1), |i| &payloads[i % PAYLOADS]);
        let stored = start.elapsed();
        f.join_all((1..=W3_MEMBERS).map(|u| (1, u, JoinStart::Earliest)));
        assert_eq!(f.memberships(), W3_MEMBERS);
        println!(
            "setup: ack_single: 1 group, {W3_MESSAGES} messages stored in {stored:.2?}, \
             {W3_MEMBERS} members joined in {:.2?}",
            start.elapsed() - stored
        );
        W3 {
            f,
            cursors: vec![0; W3_MEMBERS as usize],
            rng: Rng(SEED ^ 3),
        }
    }

    /// `n` ACKs `(user, msg_id)`, each strictly above that user's cursor.
    fn moves(&mut self, n: usize) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let i = self.rng.below(W3_MEMBERS) as usize;
            let c = self.cursors[i];
            if c >= W3_MESSAGES {
                continue;
            }
            let to = (c + 1 + self.rng.below(ACK_STEP_MAX)).min(W3_MESSAGES);
            self.cursors[i] = to;
            out.push((i as u64 + 1, to));
        }
        out
    }

    fn run(&self, moves: &[(u64, u64)]) -> bool {
        let mut all_moved = true;
        for &(u, m) in moves {
            let c = self.f.engine.ack(1, u, m).expect("ack");
            all_moved &= c == m;
        }
        all_moved
    }

    /// Compares every member's cursor and the read counts with the model.
    fn verify(&self) {
        let mut ok = 0;
        for (i, &c) in self.cursors.iter().enumerate() {
            let rows = self.f.engine.unread(i as u64 + 1);
            assert_eq!(rows.len(), 1);
            assert_eq!(rows[0].cursor, c, "cursor of member {}", i + 1);
            ok += 1;
        }
        for m in [1, W3_MESSAGES / 2, W3_MESSAGES] {
            let expected = self.cursors.iter().filter(|&&c| c >= m).count() as u32;
            assert_eq!(
                self.f.engine.read_count(1, m).expect("read_count"),
                expected
            );
        }
        let acked = self.cursors.iter().sum::<u64>();
        println!(
            "verify: ack_single: {ok} cursors and 3 read counts match the model \
             (cursors moved by {acked} ids in total)"
        );
    }
}

fn ack_single(c: &mut Criterion) {
    let mut w3: Option<W3> = None;
    let mut g = bench_group(c, "ack_single");
    g.throughput(Throughput::Elements(1));
    g.bench_function("w3_100k_members_1_thread", |b| {
        let w3 = w3.get_or_insert_with(|| {
            let mut w3 = W3::setup();
            // W3 itself: 1,000,000 single ACKs, timed once.
            let moves = w3.moves(W3_ACKS);
            let start = Instant::now();
            let all_moved = w3.run(&moves);
            let t = start.elapsed();
            assert!(all_moved);
            println!(
                "verify: ack_single: W3 run of {W3_ACKS} single ACKs on one thread: {t:.2?}, \
                 {:.0} ACKs/s",
                W3_ACKS as f64 / t.as_secs_f64()
            );
            w3
        });
        b.iter_custom(|iters| {
            timed_chunks(&mut *w3, iters, 10_000, W3::moves, |w3, moves| {
                w3.run(&moves)
            })
        })
    });
    g.finish();
    if let Some(w3) = w3 {
        w3.verify();
        w3.f.engine.close().expect("close");
    }
}

// --------------------------------------------------------------- ack_batched

struct Batched {
    f: Fixture,
    /// `cursors[(user - 1) * BATCH_GROUPS + group - 1]`.
    cursors: Vec<u16>,
    rng: Rng,
    acks: u64,
}

impl Batched {
    fn setup() -> Batched {
        let start = Instant::now();
        let f = Fixture::new(|_| {});
        f.create_groups(BATCH_GROUPS);
        let payloads = payloads(&mut Rng(SEED), PAYLOADS);
        f.store(
            (0..BATCH_GROUPS * BATCH_MESSAGES_PER_GROUP).map(|i| 1 + i % BATCH_GROUPS),
            |i| &payloads[i % PAYLOADS],
        );
        let stored = start.elapsed();
        f.join_all(
            (1..=BATCH_USERS)
                .flat_map(|u| (1..=BATCH_GROUPS).map(move |g| (g, u, JoinStart::Earliest))),
        );
        assert_eq!(f.memberships(), BATCH_USERS * BATCH_GROUPS);
        println!(
            "setup: ack_batched: {BATCH_GROUPS} groups x {BATCH_MESSAGES_PER_GROUP} messages \
             stored in {stored:.2?}, {BATCH_USERS} users joined all of them in {:.2?}",
            start.elapsed() - stored
        );
        Batched {
            f,
            cursors: vec![0; (BATCH_USERS * BATCH_GROUPS) as usize],
            rng: Rng(SEED ^ 5),
            acks: 0,
        }
    }

    /// `n` calls: a user and its 50 pairs, each above its cursor.
    fn calls(&mut self, n: usize) -> Vec<(u64, Vec<(u64, u64)>)> {
        let mut out = Vec::with_capacity(n);
        let head = BATCH_MESSAGES_PER_GROUP as u16;
        while out.len() < n {
            let u = self.rng.below(BATCH_USERS);
            let row =
                &mut self.cursors[(u * BATCH_GROUPS) as usize..((u + 1) * BATCH_GROUPS) as usize];
            if row.iter().any(|&c| c >= head) {
                continue;
            }
            let pairs = row
                .iter_mut()
                .enumerate()
                .map(|(g, c)| {
                    *c = (*c + 1 + self.rng.below(4) as u16).min(head);
                    (g as u64 + 1, u64::from(*c))
                })
                .collect();
            out.push((u + 1, pairs));
        }
        out
    }

    fn run(&mut self, calls: &[(u64, Vec<(u64, u64)>)]) -> bool {
        let mut all_moved = true;
        for (u, pairs) in calls {
            let results = self.f.engine.batch_ack(*u, pairs);
            for (r, &(_, m)) in results.iter().zip(pairs) {
                all_moved &= r.error.is_none() && r.cursor == m;
            }
            self.acks += pairs.len() as u64;
        }
        all_moved
    }

    fn verify(&self) {
        for u in 1..=BATCH_USERS {
            let rows = self.f.engine.unread(u);
            assert_eq!(rows.len(), BATCH_GROUPS as usize);
            for r in rows {
                let i = ((u - 1) * BATCH_GROUPS + r.group_id - 1) as usize;
                assert_eq!(r.cursor, u64::from(self.cursors[i]), "user {u}");
            }
        }
        println!(
            "verify: ack_batched: {} ACKs made; all {} cursors match the model",
            self.acks,
            self.cursors.len()
        );
    }
}

fn ack_batched(c: &mut Criterion) {
    let mut state: Option<Batched> = None;
    let mut g = bench_group(c, "ack_batched");
    g.throughput(Throughput::Elements(BATCH_GROUPS));
    g.bench_function("batch_ack_50_groups", |b| {
        let s = state.get_or_insert_with(Batched::setup);
        b.iter_custom(|iters| {
            timed_chunks(&mut *s, iters, 1_000, Batched::calls, |s, calls| {
                s.run(&calls)
            })
        })
    });
    g.finish();
    if let Some(s) = state {
        s.verify();
        s.f.engine.close().expect("close");
    }
}

// ------------------------------------------------------------------- pull_w2

struct W2 {
    f: Fixture,
    /// The W2 cursors, index `member - 1`.
    cursors: Vec<u64>,
    /// Sum of `W2_MESSAGES - cursor`.
    expected: u64,
    /// Fresh members joined so far by `pull_and_ack_chain`.
    fresh_joined: u64,
}

/// What one pass over the members delivered.
#[derive(Default, Debug, PartialEq, Eq)]
struct Delivered {
    records: u64,
    payload_bytes: u64,
    pages: u64,
    checksum: u64,
}

impl Delivered {
    fn take(&mut self, batch: &tidemark_engine::ReadBatch) {
        for r in batch.records() {
            let p = r.payload();
            self.checksum = self.checksum.wrapping_add(u64::from(p[0]));
            self.payload_bytes += p.len() as u64;
        }
        self.records += batch.count;
        self.pages += 1;
    }
}

/// The W2 cursors: uniform in [90,000, 100,000), fixed seed.
fn w2_cursors() -> Vec<u64> {
    let mut rng = Rng(SEED ^ 22);
    (0..W2_MEMBERS)
        .map(|_| W2_CURSOR_LOW + rng.below(W2_MESSAGES - W2_CURSOR_LOW))
        .collect()
}

impl W2 {
    fn setup() -> W2 {
        let start = Instant::now();
        let f = Fixture::new(|_| {});
        f.create_groups(1);
        // Every message its own fixed-seed random payload.
        let mut rng = Rng(SEED ^ 2);
        let mut buf = vec![0u8; APPEND_BATCH * PAYLOAD_BYTES];
        for first in (0..W2_MESSAGES).step_by(APPEND_BATCH) {
            rng.fill(&mut buf);
            let reqs: Vec<AppendRequest<'_>> = buf
                .chunks(PAYLOAD_BYTES)
                .enumerate()
                .map(|(i, p)| AppendRequest {
                    group_id: 1,
                    sender_id: 1,
                    client_msg_id: first + i as u64 + 1,
                    payload: p,
                })
                .collect();
            f.engine.append_batch(&reqs).expect("append_batch");
        }
        assert_eq!(f.engine.head(1).expect("head"), W2_MESSAGES);
        let stored = start.elapsed();
        let cursors = w2_cursors();
        let w2 = W2 {
            expected: cursors.iter().map(|c| W2_MESSAGES - c).sum(),
            f,
            cursors,
            fresh_joined: 0,
        };
        w2.join_members(1);
        println!(
            "setup: pull_w2: {W2_MESSAGES} messages of {PAYLOAD_BYTES} random bytes stored in \
             {stored:.2?}, {W2_MEMBERS} members joined in {:.2?}; backlog {} records",
            start.elapsed() - stored,
            w2.expected
        );
        w2
    }

    /// Joins members `first..first + W2_MEMBERS` with the W2 cursors.
    fn join_members(&self, first: u64) {
        self.f.join_all(
            self.cursors
                .iter()
                .enumerate()
                .map(|(i, &c)| (1, first + i as u64, JoinStart::At(c + 1))),
        );
        for (i, &c) in self.cursors.iter().enumerate().step_by(97) {
            let rows = self.f.engine.unread(first + i as u64);
            assert_eq!(rows[0].cursor, c, "join cursor");
        }
    }

    /// Every member's backlog, read with `Engine::read` (cursors unchanged).
    fn read_all(&self) -> Delivered {
        let mut d = Delivered::default();
        for &c in &self.cursors {
            let mut after = c;
            loop {
                let batch = self
                    .f
                    .engine
                    .read(1, after, W2_PAGE_RECORDS, W2_PAGE_BYTES)
                    .expect("read");
                d.take(&batch);
                after = batch.last_id;
                if !batch.has_more {
                    break;
                }
            }
        }
        d
    }

    /// W2 proper for members `first..first + W2_MEMBERS`: pull pages of 200,
    /// each pull ACKing the previous page, then ACK the last page.
    fn pull_all(&self, first: u64) -> Delivered {
        let e = &self.f.engine;
        let mut d = Delivered::default();
        for user in first..first + W2_MEMBERS {
            let mut ack = None;
            loop {
                let p = e
                    .pull(1, user, W2_PAGE_RECORDS, W2_PAGE_BYTES, ack)
                    .expect("pull");
                if p.batch.count == 0 {
                    break;
                }
                d.take(&p.batch);
                if !p.batch.has_more {
                    e.ack(1, user, p.batch.last_id).expect("final ack");
                    break;
                }
                ack = Some(p.batch.last_id);
            }
        }
        d
    }
}

fn pull_w2(c: &mut Criterion) {
    let mut w2: Option<W2> = None;
    let mut reference: Option<Delivered> = None;
    let backlog: u64 = w2_cursors().iter().map(|c| W2_MESSAGES - c).sum();
    let mut g = bench_group(c, "pull_w2");
    // One iteration delivers the whole backlog (about 10 million records):
    // flat sampling keeps it to a few iterations per sample.
    g.sampling_mode(SamplingMode::Flat);
    g.throughput(Throughput::Elements(backlog));
    g.bench_function("read_pages_no_ack", |b| {
        let w2 = w2.get_or_insert_with(W2::setup);
        b.iter(|| {
            let d = w2.read_all();
            assert_eq!(d.records, w2.expected, "delivered total");
            black_box(d.checksum)
        })
    });
    g.bench_function("pull_and_ack_chain", |b| {
        let w2 = w2.get_or_insert_with(W2::setup);
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let first = W2_FRESH_USERS_BASE + w2.fresh_joined;
                w2.join_members(first);
                w2.fresh_joined += W2_MEMBERS;
                let start = Instant::now();
                let d = w2.pull_all(first);
                total += start.elapsed();
                assert_eq!(d.records, w2.expected, "delivered total");
                let r = reference.get_or_insert_with(|| w2.read_all());
                assert_eq!(&d, r, "pull delivered what read delivers");
            }
            total
        })
    });
    g.finish();
    if let Some(w2) = w2 {
        let e = &w2.f.engine;
        // Every fresh member ACKed up to the head; the original members
        // (cursors below the head) did not move.
        let at_head = e.read_count(1, W2_MESSAGES).expect("read_count");
        assert_eq!(u64::from(at_head), w2.fresh_joined);
        for (i, &c) in w2.cursors.iter().enumerate() {
            assert_eq!(e.unread(i as u64 + 1)[0].cursor, c);
        }
        // One timed pass of each, to print records/s and MB/s.
        let start = Instant::now();
        let d = w2.read_all();
        let t_read = start.elapsed();
        let first = W2_FRESH_USERS_BASE + w2.fresh_joined;
        w2.join_members(first);
        let start = Instant::now();
        let p = w2.pull_all(first);
        let t_pull = start.elapsed();
        assert_eq!(d, p);
        let mb = d.payload_bytes as f64 / 1e6;
        println!(
            "verify: pull_w2: delivered {} records ({} pages, {mb:.1} MB of payload) per pass \
             == sum(100,000 - cursor) = {}; {} fresh members ACKed to the head, original \
             {W2_MEMBERS} cursors unchanged",
            d.records, p.pages, w2.expected, w2.fresh_joined
        );
        println!(
            "verify: pull_w2: one pass read_pages_no_ack {t_read:.2?} = {:.0} deliveries/s, \
             {:.0} MB/s; pull_and_ack_chain {t_pull:.2?} = {:.0} deliveries/s, {:.0} MB/s \
             (payload MB/s of zero-copy delivery: records are borrowed from the segment \
             mappings and only each payload's first byte is touched; no socket, no copy)",
            d.records as f64 / t_read.as_secs_f64(),
            mb / t_read.as_secs_f64(),
            d.records as f64 / t_pull.as_secs_f64(),
            mb / t_pull.as_secs_f64()
        );
        w2.f.engine.close().expect("close");
    }
}

// ----------------------------------------------------------------- unread_w4

struct W4 {
    f: Fixture,
    heads: Vec<u64>,
    /// `groups[(user - 1) * 50 + k]`: the user's k-th group.
    groups: Vec<u16>,
    /// The cursor of that membership.
    cursors: Vec<u16>,
}

impl W4 {
    fn setup() -> W4 {
        let start = Instant::now();
        let f = Fixture::new(|_| {});
        f.create_groups(W4_GROUPS);
        let created = start.elapsed();
        let payloads = payloads(&mut Rng(SEED), PAYLOADS);
        let mut rng = Rng(SEED ^ 4);
        let targets: Vec<u64> = (0..W4_MESSAGES).map(|_| 1 + rng.below(W4_GROUPS)).collect();
        f.store(targets.iter().copied(), |i| &payloads[i % PAYLOADS]);
        let heads: Vec<u64> = (1..=W4_GROUPS)
            .map(|g| f.engine.head(g).expect("head"))
            .collect();
        assert_eq!(heads.iter().sum::<u64>(), W4_MESSAGES);
        let stored = start.elapsed() - created;
        let n = (W4_USERS as usize) * W4_GROUPS_PER_USER;
        let mut groups = Vec::with_capacity(n);
        let mut cursors = Vec::with_capacity(n);
        let mut mine = Vec::with_capacity(W4_GROUPS_PER_USER);
        for _ in 0..W4_USERS {
            mine.clear();
            while mine.len() < W4_GROUPS_PER_USER {
                let g = 1 + rng.below(W4_GROUPS) as u16;
                if !mine.contains(&g) {
                    mine.push(g);
                }
            }
            for &g in &mine {
                groups.push(g);
                cursors.push(rng.below(heads[g as usize - 1] + 1) as u16);
            }
        }
        let t = Instant::now();
        let joined = f.join_all((0..n).map(|i| {
            let user = (i / W4_GROUPS_PER_USER) as u64 + 1;
            let c = u64::from(cursors[i]);
            (u64::from(groups[i]), user, JoinStart::At(c + 1))
        }));
        assert_eq!(f.memberships(), joined);
        println!(
            "setup: unread_w4: {W4_GROUPS} groups created in {created:.2?}, {W4_MESSAGES} \
             messages stored in {stored:.2?}, {joined} memberships ({W4_USERS} users x \
             {W4_GROUPS_PER_USER}) joined at random cursors in {:.2?}; total {:.2?}",
            t.elapsed(),
            start.elapsed()
        );
        W4 {
            f,
            heads,
            groups,
            cursors,
        }
    }

    /// The unread total of `user` per the model.
    fn expected_unread(&self, user: u64) -> u64 {
        let at = (user - 1) as usize * W4_GROUPS_PER_USER;
        (at..at + W4_GROUPS_PER_USER)
            .map(|i| self.heads[self.groups[i] as usize - 1] - u64::from(self.cursors[i]))
            .sum()
    }
}

fn unread_w4(c: &mut Criterion) {
    let mut w4: Option<W4> = None;
    let mut rng = Rng(SEED ^ 44);
    let mut g = bench_group(c, "unread_w4");
    g.throughput(Throughput::Elements(1));
    g.bench_function("unread_of_user_50_groups", |b| {
        let w4 = w4.get_or_insert_with(|| {
            let w4 = W4::setup();
            // W4 itself: 100,000 queries of random users, timed once.
            let mut qrng = Rng(SEED ^ 40);
            let users: Vec<u64> = (0..W4_QUERIES).map(|_| 1 + qrng.below(W4_USERS)).collect();
            let mut totals = Vec::with_capacity(W4_QUERIES);
            let start = Instant::now();
            for &u in &users {
                let rows = w4.f.engine.unread(u);
                totals.push((rows.len(), rows.iter().map(|r| r.unread).sum::<u64>()));
            }
            let t = start.elapsed();
            for (&u, &(rows, total)) in users.iter().zip(&totals) {
                assert_eq!(rows, W4_GROUPS_PER_USER, "groups of user {u}");
                assert_eq!(total, w4.expected_unread(u), "unread total of user {u}");
            }
            println!(
                "verify: unread_w4: W4 run of {W4_QUERIES} queries: {t:.2?}, {:.0} queries/s, \
                 mean {:.2} us per query; every answer has {W4_GROUPS_PER_USER} groups and the \
                 model's unread total",
                W4_QUERIES as f64 / t.as_secs_f64(),
                t.as_secs_f64() * 1e6 / W4_QUERIES as f64
            );
            w4
        });
        b.iter(|| {
            let rows = w4.f.engine.unread(1 + rng.below(W4_USERS));
            black_box(rows.len())
        })
    });
    g.finish();
    if let Some(w4) = w4 {
        w4.f.engine.close().expect("close");
    }
}

// ---------------------------------------------------------------------- sync

struct SyncFixture {
    f: Fixture,
    /// `cursors[(user - 1) * SYNC_GROUPS + group - 1]`.
    cursors: Vec<u64>,
}

impl SyncFixture {
    fn setup() -> SyncFixture {
        let start = Instant::now();
        let f = Fixture::new(|_| {});
        f.create_groups(SYNC_GROUPS);
        let payloads = payloads(&mut Rng(SEED), PAYLOADS);
        f.store(
            (0..SYNC_GROUPS * SYNC_MESSAGES_PER_GROUP).map(|i| 1 + i % SYNC_GROUPS),
            |i| &payloads[i % PAYLOADS],
        );
        let stored = start.elapsed();
        let mut rng = Rng(SEED ^ 6);
        let head = SYNC_MESSAGES_PER_GROUP;
        let cursors: Vec<u64> = (0..SYNC_USERS * SYNC_GROUPS)
            .map(|_| head - 1 - rng.below(SYNC_UNREAD_MAX))
            .collect();
        f.join_all(cursors.iter().enumerate().map(|(i, &c)| {
            let i = i as u64;
            (
                1 + i % SYNC_GROUPS,
                1 + i / SYNC_GROUPS,
                JoinStart::At(c + 1),
            )
        }));
        println!(
            "setup: sync: {SYNC_GROUPS} groups x {SYNC_MESSAGES_PER_GROUP} messages stored in \
             {stored:.2?}, {SYNC_USERS} users joined all of them with 1..={SYNC_UNREAD_MAX} \
             unread each in {:.2?}",
            start.elapsed() - stored
        );
        let s = SyncFixture { f, cursors };
        s.verify();
        s
    }

    fn verify(&self) {
        let mut records = 0u64;
        for u in 1..=SYNC_USERS {
            let s = self
                .f
                .engine
                .sync(u, SYNC_PER_GROUP, SYNC_BYTES, None)
                .expect("sync");
            assert_eq!(s.groups.len(), SYNC_GROUPS as usize);
            assert!(s.continue_after.is_none());
            for sg in &s.groups {
                let i = ((u - 1) * SYNC_GROUPS + sg.unread.group_id - 1) as usize;
                let unread = SYNC_MESSAGES_PER_GROUP - self.cursors[i];
                assert_eq!(sg.unread.unread, unread);
                assert_eq!(sg.batch.count, unread.min(SYNC_PER_GROUP as u64));
                assert_eq!(
                    sg.batch.records().next().map(|r| r.header.msg_id),
                    Some(self.cursors[i] + 1)
                );
                records += sg.batch.count;
            }
        }
        println!(
            "verify: sync: all {SYNC_USERS} users get {SYNC_GROUPS} groups, min(20, unread) \
             records each starting above the cursor ({:.1} records per sync on average)",
            records as f64 / SYNC_USERS as f64
        );
    }
}

fn sync(c: &mut Criterion) {
    let mut fixture: Option<SyncFixture> = None;
    let mut rng = Rng(SEED ^ 66);
    let mut g = bench_group(c, "sync");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sync_50_groups_20_per_group", |b| {
        let s = fixture.get_or_insert_with(SyncFixture::setup);
        b.iter(|| {
            let out =
                s.f.engine
                    .sync(1 + rng.below(SYNC_USERS), SYNC_PER_GROUP, SYNC_BYTES, None)
                    .expect("sync");
            black_box(out.groups.len())
        })
    });
    g.finish();
    if let Some(s) = fixture {
        s.f.engine.close().expect("close");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().without_plots();
    targets = ack_single, ack_batched, pull_w2, unread_w4, sync
}
criterion_main!(benches);
