//! Engine benchmarks: append throughput under `fsync=never` (one thread, big
//! batches) and `fsync=always` (16 threads, one append at a time, sharing
//! fsyncs through group commit), over 10,000 groups and over one group; and
//! reading a warm group above a cursor. A baseline measures what one lone
//! 4 KiB write + fdatasync costs on the same filesystem, the floor against
//! which the `always` figures are to be read.
//!
//! Data lives in temporary directories on the normal filesystem (not
//! /dev/shm): fsync cost is part of what is measured. Setup (creating groups,
//! storing the messages to read) runs once per benchmark, outside the timing,
//! and only for the benchmarks a command-line filter selects.
//! Sample counts and times are small so that `cargo bench --bench engine`
//! stays within a few minutes on two cores.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use tidemark_engine::{AppendRequest, Config, Engine, EngineStats, FsyncPolicy};

const PAYLOAD_BYTES: usize = 200;
/// Distinct random payloads cycled through by the appends.
const PAYLOADS: usize = 1024;
const MANY_GROUPS: u64 = 10_000;
const BATCH_REQUESTS: usize = 1_000;
const APPEND_THREADS: u64 = 16;
const READ_MESSAGES: u64 = 100_000;
const READ_PAGE_RECORDS: usize = 200;
const READ_PAGE_BYTES: usize = 1 << 20;
const SEED: u64 = 0x7469_6465_6d61_726b;

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
}

fn payloads(rng: &mut Rng) -> Vec<Vec<u8>> {
    (0..PAYLOADS)
        .map(|_| {
            (0..PAYLOAD_BYTES)
                .map(|_| rng.next().to_le_bytes()[0])
                .collect()
        })
        .collect()
}

/// An engine in a fresh temporary directory with groups `1..=groups`.
fn engine_with_groups(fsync: FsyncPolicy, groups: u64) -> (tempfile::TempDir, Engine) {
    let start = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path());
    config.fsync = fsync;
    let engine = Engine::open(config).expect("open engine");
    // Submit every creation, then wait once: one commit round for many groups.
    let mut last = None;
    for g in 1..=groups {
        last = Some(engine.submit_create_group(g).expect("create group"));
    }
    if let Some(t) = last {
        engine.wait_op(t).expect("group creations durable");
    }
    println!(
        "setup: {groups} groups created ({fsync:?}) in {:.2?}",
        start.elapsed()
    );
    (dir, engine)
}

fn bench_group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    g
}

/// An engine in a temporary directory, set up on the first call of a
/// benchmark's routine: criterion calls the routine only for benchmarks that
/// the command-line filter selects, so a filtered run skips the setup of the
/// others.
struct Fixture {
    _dir: tempfile::TempDir,
    engine: Engine,
    stats_at_start: EngineStats,
}

impl Fixture {
    fn new(fsync: FsyncPolicy, groups: u64) -> Fixture {
        let (dir, engine) = engine_with_groups(fsync, groups);
        let stats_at_start = engine.stats();
        Fixture {
            _dir: dir,
            engine,
            stats_at_start,
        }
    }

    /// Prints how the measured appends shared commit rounds, and closes.
    fn finish(self, name: &str) {
        let (a, b) = (self.stats_at_start, self.engine.stats());
        let (appends, rounds) = (b.appends - a.appends, b.rounds - a.rounds);
        println!(
            "{name}: {appends} appends in {rounds} commit rounds ({} journal syncs), {:.1} appends a round on average",
            b.journal_syncs - a.journal_syncs,
            appends as f64 / rounds.max(1) as f64
        );
        self.engine.close().expect("close");
    }
}

/// One thread, `append_batch` of `BATCH_REQUESTS` appends spread uniformly
/// over the groups; one iteration is one batch.
fn append_never(c: &mut Criterion, name: &str, groups: u64) {
    let mut fixture = None;
    let mut rng = Rng(SEED);
    let payloads = payloads(&mut rng);
    let mut client_msg_id = 0u64;
    let mut g = bench_group(c, name);
    g.throughput(Throughput::Elements(BATCH_REQUESTS as u64));
    g.bench_function("append_batch_1000", |b| {
        let engine = &fixture
            .get_or_insert_with(|| Fixture::new(FsyncPolicy::Never, groups))
            .engine;
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let reqs: Vec<AppendRequest<'_>> = (0..BATCH_REQUESTS)
                    .map(|_| {
                        client_msg_id += 1;
                        AppendRequest {
                            group_id: 1 + rng.below(groups),
                            sender_id: 1,
                            client_msg_id,
                            payload: &payloads[rng.below(PAYLOADS as u64) as usize],
                        }
                    })
                    .collect();
                let start = Instant::now();
                let done = engine.append_batch(&reqs).expect("append_batch");
                total += start.elapsed();
                debug_assert!(done.iter().all(|a| !a.duplicate));
            }
            total
        })
    });
    g.finish();
    if let Some(f) = fixture {
        f.finish(name);
    }
}

/// `APPEND_THREADS` threads, each keeping `in_flight` appends to random
/// groups submitted and waiting for the oldest (1: plain `append`), so
/// concurrent appends share commit rounds and their fsyncs, as a node's
/// connections with pipelined sends do. One iteration is one append on every
/// thread; the time is the wall time of all.
fn append_always(c: &mut Criterion, name: &str, groups: u64, in_flight: usize) {
    let mut fixture = None;
    let payloads = payloads(&mut Rng(SEED));
    let client_msg_id = AtomicU64::new(0);
    let mut g = bench_group(c, name);
    g.throughput(Throughput::Elements(APPEND_THREADS));
    g.bench_function(
        format!("append_{APPEND_THREADS}_threads_{in_flight}_in_flight"),
        |b| {
            let engine = &fixture
                .get_or_insert_with(|| Fixture::new(FsyncPolicy::Always, groups))
                .engine;
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..APPEND_THREADS {
                        let (payloads, client_msg_id) = (&payloads, &client_msg_id);
                        s.spawn(move || {
                            let mut rng =
                                Rng(SEED ^ (t + 1) ^ client_msg_id.load(Ordering::Relaxed));
                            let mut window = std::collections::VecDeque::with_capacity(in_flight);
                            for _ in 0..iters {
                                let id = client_msg_id.fetch_add(1, Ordering::Relaxed) + 1;
                                let group = 1 + rng.below(groups);
                                let payload = &payloads[rng.below(PAYLOADS as u64) as usize];
                                let req = AppendRequest {
                                    group_id: group,
                                    sender_id: t + 1,
                                    client_msg_id: id,
                                    payload,
                                };
                                window.push_back(engine.submit(&req).expect("submit"));
                                if window.len() >= in_flight {
                                    engine
                                        .wait(window.pop_front().expect("non-empty"))
                                        .expect("append");
                                }
                            }
                            for ticket in window {
                                engine.wait(ticket).expect("append");
                            }
                        });
                    }
                });
                start.elapsed()
            })
        },
    );
    g.finish();
    if let Some(f) = fixture {
        f.finish(name);
    }
}

fn append_never_10k_groups(c: &mut Criterion) {
    append_never(c, "append_never_10k_groups", MANY_GROUPS);
}

fn append_never_1_group(c: &mut Criterion) {
    append_never(c, "append_never_1_group", 1);
}

fn append_always_10k_groups_16_threads(c: &mut Criterion) {
    append_always(c, "append_always_10k_groups_16_threads", MANY_GROUPS, 1);
    append_always(
        c,
        "append_always_10k_groups_16_threads_pipelined",
        MANY_GROUPS,
        16,
    );
}

fn append_always_1_group(c: &mut Criterion) {
    append_always(c, "append_always_1_group", 1, 1);
}

/// One group of `READ_MESSAGES` stored messages, read whole above cursor 0
/// in pages of `READ_PAGE_RECORDS`, touching every payload. One iteration
/// reads every message once; the segments are warm in the page cache.
fn read_above_cursor_warm(c: &mut Criterion) {
    let mut fixture = None;
    let mut g = bench_group(c, "read_above_cursor_warm");
    g.throughput(Throughput::Elements(READ_MESSAGES));
    g.bench_function("pages_of_200", |b| {
        let engine = &fixture.get_or_insert_with(stored_messages).engine;
        b.iter(|| {
            let mut after = 0u64;
            let mut records = 0u64;
            let mut sum = 0u64;
            loop {
                let batch = engine
                    .read(1, after, READ_PAGE_RECORDS, READ_PAGE_BYTES)
                    .expect("read");
                for r in batch.records() {
                    sum = sum.wrapping_add(u64::from(r.payload()[0]));
                    records += 1;
                }
                after = batch.last_id;
                if !batch.has_more {
                    break;
                }
            }
            assert_eq!(records, READ_MESSAGES);
            criterion::black_box(sum)
        })
    });
    g.finish();
    if let Some(f) = fixture {
        f.engine.close().expect("close");
    }
}

/// Group 1 with `READ_MESSAGES` messages, stored by batches.
fn stored_messages() -> Fixture {
    let start = Instant::now();
    let f = Fixture::new(FsyncPolicy::Never, 1);
    let payloads = payloads(&mut Rng(SEED));
    for first in (0..READ_MESSAGES).step_by(BATCH_REQUESTS) {
        let reqs: Vec<AppendRequest<'_>> = (first
            ..(first + BATCH_REQUESTS as u64).min(READ_MESSAGES))
            .map(|i| AppendRequest {
                group_id: 1,
                sender_id: 1,
                client_msg_id: i + 1,
                payload: &payloads[i as usize % PAYLOADS],
            })
            .collect();
        f.engine.append_batch(&reqs).expect("populate");
    }
    assert_eq!(f.engine.head(1).expect("head"), READ_MESSAGES);
    println!(
        "setup: {READ_MESSAGES} messages of {PAYLOAD_BYTES} bytes stored in {:.2?}",
        start.elapsed()
    );
    f
}

/// The floor for `fsync=always`: one 4 KiB append to a file followed by
/// fdatasync, on one thread, in the same kind of directory.
fn baseline_fdatasync(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut file = std::fs::File::create(dir.path().join("baseline")).expect("create");
    let block = [0x5au8; 4096];
    let mut g = bench_group(c, "baseline_fdatasync");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write_4k_fdatasync", |b| {
        b.iter(|| {
            file.write_all(&block).expect("write");
            file.sync_data().expect("fdatasync");
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    baseline_fdatasync,
    append_never_10k_groups,
    append_always_10k_groups_16_threads,
    append_never_1_group,
    append_always_1_group,
    read_above_cursor_warm
);
criterion_main!(benches);
