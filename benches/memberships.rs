//! Memory and disk cost of a membership.
//!
//! Opens an engine (`fsync=never`), creates 10,000 groups with 100 messages
//! each, then loads `TIDEMARK_MEMBERSHIPS` memberships (default 10,000,000:
//! 200,000 users x 50 groups, each user's groups chosen deterministically,
//! cursors uniform at random in [0, head]). Prints the heap growth counted
//! by a global allocator wrapper, the engine's own `membership_memory()`
//! figure, and the growth of the checkpoint file, each per membership.
//! Targets (goals, not assertions): <= 32 bytes in memory, <= 16 on disk.
//!
//! `cargo bench --bench memberships`; `TIDEMARK_MEMBERSHIPS=100000` for a
//! quick run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use tidemark_engine::{AppendRequest, Config, Engine, FsyncPolicy, JoinStart, OpTicket};

/// `System`, counting the bytes currently allocated (as requested, not as
/// the allocator rounds them) and the peak.
struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(n: usize) {
    let now = CURRENT.fetch_add(n, Ordering::Relaxed) + n;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the same arguments; the
// counters do not affect allocation.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const GROUPS: u64 = 10_000;
const GROUPS_PER_USER: u64 = 50;
const MESSAGES_PER_GROUP: u64 = 100;
const PAYLOAD_BYTES: usize = 200;
const DEFAULT_MEMBERSHIPS: u64 = 10_000_000;
/// Joins submitted between two waits (bounds the pending round).
const JOIN_CHUNK: u64 = 100_000;
const SEED: u64 = 0x7469_6465_6d61_726b;

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The k-th group (1-based id) of `user`: `base + k * step` modulo the group
/// count, with `step` in 1..=199 so that 50 of them are distinct.
fn group_of(user: u64, k: u64) -> u64 {
    let h = splitmix(user ^ SEED);
    let base = h % GROUPS;
    let step = 1 + (h >> 32) % 199;
    1 + (base + k * step) % GROUPS
}

fn heap() -> usize {
    CURRENT.load(Ordering::Relaxed)
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Bytes this process has passed to write system calls (Linux
/// `/proc/self/io` `wchar`), if available.
fn written_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Bytes of the journal files now in `data_dir/journal`.
fn journal_bytes(data_dir: &Path) -> u64 {
    std::fs::read_dir(data_dir.join("journal"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn checkpoint_bytes(data_dir: &Path) -> u64 {
    std::fs::metadata(data_dir.join("checkpoint"))
        .expect("checkpoint file")
        .len()
}

fn main() {
    // `cargo bench` passes `--bench`; nothing here takes arguments.
    let memberships: u64 = match std::env::var("TIDEMARK_MEMBERSHIPS") {
        Ok(v) => v.parse().expect("TIDEMARK_MEMBERSHIPS: a count"),
        Err(_) => DEFAULT_MEMBERSHIPS,
    };
    let users = memberships.div_ceil(GROUPS_PER_USER);
    println!(
        "memberships bench: {memberships} memberships = {users} users x up to \
         {GROUPS_PER_USER} of {GROUPS} groups ({MESSAGES_PER_GROUP} messages each), fsync=never"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let mut config = Config::new(dir.path());
    config.fsync = FsyncPolicy::Never;
    config.members_per_group_max = config.members_per_group_max.max(users as usize);
    config.groups_per_user_max = config.groups_per_user_max.max(GROUPS_PER_USER as usize);
    let engine = Engine::open(config).expect("open engine");

    let start = Instant::now();
    let mut last = None;
    for g in 1..=GROUPS {
        last = Some(engine.submit_create_group(g).expect("create group"));
    }
    engine
        .wait_op(last.expect("groups"))
        .expect("group creations");
    let payload = [0x5au8; PAYLOAD_BYTES];
    let mut reqs = Vec::with_capacity(1_000);
    let mut client_msg_id = 0;
    for _ in 0..MESSAGES_PER_GROUP {
        for g in 1..=GROUPS {
            client_msg_id += 1;
            reqs.push(AppendRequest {
                group_id: g,
                sender_id: 1,
                client_msg_id,
                payload: &payload,
            });
            if reqs.len() == reqs.capacity() {
                engine.append_batch(&reqs).expect("append_batch");
                reqs.clear();
            }
        }
    }
    if !reqs.is_empty() {
        engine.append_batch(&reqs).expect("append_batch");
    }
    drop(reqs);
    let heads: Vec<u64> = (1..=GROUPS)
        .map(|g| engine.head(g).expect("head"))
        .collect();
    engine.checkpoint().expect("checkpoint");
    println!(
        "setup: {GROUPS} groups created and {} messages stored in {:.2?}",
        GROUPS * MESSAGES_PER_GROUP,
        start.elapsed()
    );

    let heap_before = heap();
    let engine_before = engine.membership_memory();
    let disk_before = checkpoint_bytes(dir.path());
    PEAK.store(heap_before, Ordering::Relaxed);
    let written_before = written_bytes();
    let journal_before = journal_bytes(dir.path());

    let start = Instant::now();
    let mut submitted = 0u64;
    let mut unwaited = 0u64;
    let mut last: Option<OpTicket> = None;
    let mut waited = std::time::Duration::ZERO;
    'users: for user in 1..=users {
        for k in 0..GROUPS_PER_USER {
            if submitted == memberships {
                break 'users;
            }
            let g = group_of(user, k);
            let head = heads[g as usize - 1];
            let cursor = splitmix(user.wrapping_mul(GROUPS) + g) % (head + 1);
            last = Some(
                engine
                    .submit_join(g, user, JoinStart::At(cursor + 1))
                    .expect("submit_join"),
            );
            submitted += 1;
            unwaited += 1;
            if unwaited == JOIN_CHUNK {
                unwaited = 0;
                let w = Instant::now();
                engine.wait_op(last.take().expect("ticket")).expect("join");
                waited += w.elapsed();
            }
        }
    }
    if let Some(t) = last {
        let w = Instant::now();
        engine.wait_op(t).expect("join");
        waited += w.elapsed();
    }
    let load = start.elapsed();
    let written_load = written_bytes().zip(written_before).map(|(a, b)| a - b);
    let journal_after = journal_bytes(dir.path());
    let peak = PEAK.load(Ordering::Relaxed);
    let heap_loaded = heap();
    let engine_after = engine.membership_memory();
    let loaded = engine_after.0 - engine_before.0;
    assert_eq!(loaded, memberships, "every join became a membership");
    println!(
        "load: {loaded} memberships joined in {load:.2?} ({:.0} joins/s; {waited:.2?} of it \
         waiting for the commit thread to apply them)",
        loaded as f64 / load.as_secs_f64()
    );

    let start = Instant::now();
    engine.checkpoint().expect("checkpoint");
    let checkpoint_time = start.elapsed();
    let heap_after = heap();
    let disk_after = checkpoint_bytes(dir.path());

    let per = |bytes: f64| bytes / loaded as f64;
    let heap_delta = heap_after as i64 - heap_before as i64;
    println!(
        "memory (allocator): heap {:.1} MiB before, {:.1} MiB after loading, {:.1} MiB after \
         the checkpoint (peak while loading {:.1} MiB)",
        mib(heap_before),
        mib(heap_loaded),
        mib(heap_after),
        mib(peak)
    );
    println!(
        "memory (allocator): delta {heap_delta} bytes = {:.2} bytes per membership (target <= 32)",
        per(heap_delta as f64)
    );
    println!(
        "memory (engine.membership_memory()): {} bytes for {} memberships (before: {} for {}) \
         = {:.2} bytes per membership",
        engine_after.1,
        engine_after.0,
        engine_before.1,
        engine_before.0,
        per(engine_after.1 as f64 - engine_before.1 as f64)
    );
    println!(
        "disk (checkpoint file): {disk_before} bytes before, {disk_after} after \
         (checkpoint written in {checkpoint_time:.2?}) = {:.2} bytes per membership (target <= 16)",
        per(disk_after as f64 - disk_before as f64)
    );

    println!(
        "journal files: {journal_before} bytes before loading, {journal_after} after (checkpoints \
         during the load may have removed older journal files)"
    );
    if let Some(w) = written_load {
        println!(
            "disk traffic: {w} bytes written while loading (journal entries, cursor flushes, \
             checkpoints) = {:.2} bytes per membership",
            per(w as f64)
        );
    }

    let start = Instant::now();
    engine.close().expect("close");
    println!("close: {:.2?}", start.elapsed());
}
