//! SIGKILL during appends: a child process appends from several threads under
//! `FsyncPolicy::Always` and reports every acknowledged append on stdout; the
//! parent kills it at a random moment, reopens the data directory in-process
//! and checks that every acknowledged append is there, byte-exact, that ids
//! are dense and that no retransmit was stored twice. Repeated over many
//! rounds on the same directory, so each round also recovers what the earlier
//! crashes left.
//!
//! The child is this test binary itself, re-executed with `--exact
//! crash_kill::child_process` and `TIDEMARK_CRASH_CHILD=<data dir>`.
//!
//! Environment:
//! - `TIDEMARK_CRASH_ROUNDS=N`: rounds (default 20, a few seconds); raise it
//!   for a long reliability run.
//! - `TIDEMARK_CRASH_SEED=S`: replay a run (the seed is printed at the start
//!   and in every failure message).
//!
//! Stdout protocol of the child, one line per acknowledged call:
//! `ACK <group> <msg_id> <sender> <client_msg_id>` after `append` returned Ok
//! with a new id, and `DUP <group> <msg_id> <sender> <client_msg_id>
//! <duplicate flag>` after a deliberate retransmit returned Ok. Every other
//! line (the test harness's own) is ignored, as is a last line cut short by
//! the kill.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tidemark_engine::record::{self, RECORD_HEADER_BYTES};
use tidemark_engine::{Config, Engine, Error, FsyncPolicy};

const CHILD_ENV: &str = "TIDEMARK_CRASH_CHILD";
const CHILD_SEED_ENV: &str = "TIDEMARK_CRASH_CHILD_SEED";
const CHILD_ROUND_ENV: &str = "TIDEMARK_CRASH_CHILD_ROUND";
const ROUNDS_ENV: &str = "TIDEMARK_CRASH_ROUNDS";
const SEED_ENV: &str = "TIDEMARK_CRASH_SEED";

const ROUNDS_DEFAULT: u64 = 20;
const GROUPS: u64 = 20;
const GROUP_ID_BASE: u64 = 1000;
const CHILD_THREADS: u64 = 4;
/// Sender ids are `round * SENDERS_PER_ROUND + thread + 1`, so no two
/// appends of a run share `(sender, client_msg_id)` except deliberate
/// retransmits.
const SENDERS_PER_ROUND: u64 = 16;
const PAYLOAD_BYTES_MAX: usize = 4096;
/// Payloads are 1..=this many bytes.
const PAYLOAD_LEN_MAX: u64 = 600;
/// One append in this many is a retransmit of an earlier one.
const RETRANSMIT_ONE_IN: u64 = 8;
/// Retransmit candidates taken from the tail of each group at child start.
const STORED_CANDIDATES_PER_GROUP: u64 = 32;
const KILL_AFTER_MS_MIN: u64 = 20;
const KILL_AFTER_MS_MAX: u64 = 300;
/// Problems quoted in a failure message at most.
const PROBLEMS_SHOWN_MAX: usize = 30;

/// splitmix64: a tiny deterministic PRNG, enough for test schedules.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform enough in `lo..hi` for tests.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The payload of the append `(group, sender, client_msg_id)`: its length and
/// bytes depend on all three, so the parent can recompute it and a record
/// stored under the wrong group, sender or id does not match.
fn payload_of(group: u64, sender: u64, client_msg_id: u64) -> Vec<u8> {
    let mut rng = Rng(mix(group ^ mix(sender ^ mix(client_msg_id))));
    let len = rng.range(1, PAYLOAD_LEN_MAX + 1) as usize;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        out.extend_from_slice(&rng.next().to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Small segments and journal files, so that the kills also land in segment
/// rollovers and checkpoints. In odd rounds groups keep up to 8 KiB of
/// records in the journal (storage v2 small groups), so kills also land in
/// promotions, and a directory written with one threshold is opened with
/// the other. Parent and child open with the round's configuration.
fn config(dir: &Path, round: u64) -> Config {
    let mut c = Config::new(dir);
    c.fsync = FsyncPolicy::Always;
    c.payload_bytes_max = PAYLOAD_BYTES_MAX;
    c.segment_bytes_max = 64 << 10;
    c.checkpoint_journal_bytes = 256 << 10;
    c.small_group_bytes_max = if round % 2 == 1 { 8 << 10 } else { 0 };
    c
}

fn group_ids() -> impl Iterator<Item = u64> {
    (0..GROUPS).map(|i| GROUP_ID_BASE + i)
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not an integer")),
    )
}

/// The child role. In an ordinary test run `TIDEMARK_CRASH_CHILD` is unset and
/// this test passes at once; only the parent test below runs it for real, in
/// a child process that appends until it is killed.
#[test]
fn child_process() {
    let Some(dir) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let seed = env_u64(CHILD_SEED_ENV).expect("child seed");
    let round = env_u64(CHILD_ROUND_ENV).expect("child round");
    let out = Mutex::new(std::io::stdout());
    // The harness has printed "test crash_kill::child_process ... " without
    // a newline: end that line so the first ACK starts one of its own.
    emit(&out, "child start\n");

    let engine = Engine::open(config(Path::new(&dir), round)).expect("child: open");
    for g in group_ids() {
        match engine.create_group(g) {
            Ok(()) | Err(Error::GroupExists { .. }) => {}
            Err(e) => panic!("child: create group {g}: {e}"),
        }
    }
    // Retransmit candidates stored before this child started: their dedup
    // window must survive the restart.
    let mut stored = Vec::new();
    for g in group_ids() {
        let head = engine.head(g).expect("child: head");
        let after = head.saturating_sub(STORED_CANDIDATES_PER_GROUP);
        let batch = engine
            .read(g, after, STORED_CANDIDATES_PER_GROUP as usize, usize::MAX)
            .expect("child: read");
        for r in batch.records() {
            stored.push((g, r.header.sender_id, r.header.client_msg_id));
        }
    }

    std::thread::scope(|s| {
        for t in 0..CHILD_THREADS {
            let (engine, out, stored) = (&engine, &out, &stored);
            s.spawn(move || append_forever(engine, out, stored, seed, round, t));
        }
    });
    unreachable!("child threads append until killed");
}

fn append_forever(
    engine: &Engine,
    out: &Mutex<std::io::Stdout>,
    stored: &[(u64, u64, u64)],
    seed: u64,
    round: u64,
    thread: u64,
) -> ! {
    let mut rng = Rng(mix(seed ^ mix(round ^ mix(thread))));
    let sender = round * SENDERS_PER_ROUND + thread + 1;
    let mut next_client_msg_id = 1u64;
    // This thread's acknowledged appends, retransmit candidates.
    let mut acked: Vec<(u64, u64, u64)> = Vec::new();
    loop {
        if rng.range(0, RETRANSMIT_ONE_IN) == 0 && !(acked.is_empty() && stored.is_empty()) {
            let from_stored = acked.is_empty() || (!stored.is_empty() && rng.next() & 1 == 0);
            let (g, s, c) = if from_stored {
                stored[rng.range(0, stored.len() as u64) as usize]
            } else {
                acked[rng.range(0, acked.len() as u64) as usize]
            };
            let a = engine
                .append(g, s, c, &payload_of(g, s, c))
                .unwrap_or_else(|e| panic!("child: retransmit to group {g}: {e}"));
            emit(
                out,
                &format!("DUP {g} {} {s} {c} {}\n", a.msg_id, u8::from(a.duplicate)),
            );
            continue;
        }
        let g = GROUP_ID_BASE + rng.range(0, GROUPS);
        let c = next_client_msg_id;
        next_client_msg_id += 1;
        let a = engine
            .append(g, sender, c, &payload_of(g, sender, c))
            .unwrap_or_else(|e| panic!("child: append to group {g}: {e}"));
        emit(out, &format!("ACK {g} {} {sender} {c}\n", a.msg_id));
        acked.push((g, sender, c));
    }
}

/// Writes whole lines under the lock, flushed, so lines never interleave and
/// every acknowledged line is in the pipe before the next append starts.
fn emit(out: &Mutex<std::io::Stdout>, line: &str) {
    let out = out.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = out.lock();
    out.write_all(line.as_bytes()).expect("child: write stdout");
    out.flush().expect("child: flush stdout");
}

/// One line of the child's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Report {
    Ack {
        group: u64,
        msg_id: u64,
        sender: u64,
        client_msg_id: u64,
    },
    Dup {
        group: u64,
        msg_id: u64,
        sender: u64,
        client_msg_id: u64,
        duplicate: bool,
    },
}

fn parse_report(line: &str) -> Option<Report> {
    let mut words = line.split(' ');
    let tag = words.next()?;
    let nums: Vec<u64> = words.map(|w| w.parse().ok()).collect::<Option<_>>()?;
    match (tag, nums.as_slice()) {
        ("ACK", &[group, msg_id, sender, client_msg_id]) => Some(Report::Ack {
            group,
            msg_id,
            sender,
            client_msg_id,
        }),
        ("DUP", &[group, msg_id, sender, client_msg_id, duplicate]) if duplicate <= 1 => {
            Some(Report::Dup {
                group,
                msg_id,
                sender,
                client_msg_id,
                duplicate: duplicate == 1,
            })
        }
        _ => None,
    }
}

/// Splits the child's stdout into reports. A line the kill cut short (no
/// final newline) was never acknowledged and is dropped; a complete line
/// that starts like a report but does not parse is an error.
fn parse_stdout(raw: &[u8]) -> Result<Vec<Report>, String> {
    let mut reports = Vec::new();
    let complete = match raw.iter().rposition(|&b| b == b'\n') {
        Some(i) => &raw[..=i],
        None => &[][..],
    };
    for line in complete.split(|&b| b == b'\n') {
        let line = String::from_utf8_lossy(line);
        if !(line.starts_with("ACK ") || line.starts_with("DUP ")) {
            continue;
        }
        reports.push(parse_report(&line).ok_or_else(|| format!("malformed line {line:?}"))?);
    }
    Ok(reports)
}

/// What the parent knows of one group after reading it whole.
#[derive(Default)]
struct StoredGroup {
    /// msg_id -> (sender, client_msg_id).
    by_id: BTreeMap<u64, (u64, u64)>,
}

/// Totals over the whole run.
#[derive(Default)]
struct Totals {
    acks: u64,
    dups: u64,
    losses: u64,
    duplicates: u64,
    /// Recovery work done by the parent's reopenings, to show the kills
    /// land mid-write rather than between rounds.
    records_replayed: u64,
    bytes_cut: u64,
}

#[test]
fn sigkill_during_appends_loses_no_acknowledged_message() {
    let rounds = env_u64(ROUNDS_ENV).unwrap_or(ROUNDS_DEFAULT);
    let seed = env_u64(SEED_ENV).unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        mix(t.as_nanos() as u64 ^ u64::from(std::process::id()))
    });
    println!("crash_kill: seed {seed} ({SEED_ENV}={seed} replays the schedule), {rounds} rounds");
    let dir = tempfile::tempdir().expect("tempdir");
    let exe = std::env::current_exe().expect("current_exe");
    let mut rng = Rng(seed);
    // Every acknowledged append of the run: (group, sender, client_msg_id) -> msg_id.
    let mut acked: HashMap<(u64, u64, u64), u64> = HashMap::new();
    let mut totals = Totals::default();
    let started = Instant::now();

    for round in 1..=rounds {
        let kill_after = Duration::from_millis(rng.range(KILL_AFTER_MS_MIN, KILL_AFTER_MS_MAX + 1));
        let child_seed = rng.next();
        let ctx = format!("seed {seed}, round {round}, kill after {kill_after:?}");

        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_kill::child_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .env(CHILD_SEED_ENV, child_seed.to_string())
            .env(CHILD_ROUND_ENV, round.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let mut stdout = child.stdout.take().expect("child stdout");
        let mut stderr = child.stderr.take().expect("child stderr");
        let out_reader = std::thread::spawn(move || {
            let mut raw = Vec::new();
            stdout.read_to_end(&mut raw).map(|_| raw)
        });
        let err_reader = std::thread::spawn(move || {
            let mut text = String::new();
            stderr.read_to_string(&mut text).map(|_| text)
        });
        std::thread::sleep(kill_after);
        // `Child::kill` sends SIGKILL; if the child already exited on its
        // own it fails with InvalidInput, and the status check below says why.
        let _ = child.kill();
        let status = child.wait().expect("wait for child");
        let raw = out_reader
            .join()
            .expect("stdout reader")
            .expect("read child stdout");
        let child_stderr = err_reader
            .join()
            .expect("stderr reader")
            .unwrap_or_default();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "{ctx}: the child must die by SIGKILL, not exit on its own ({status}); its stderr:\n{child_stderr}"
        );
        let reports = parse_stdout(&raw).unwrap_or_else(|e| panic!("{ctx}: {e}"));

        let mut problems = Vec::new();
        let mut round_acks = 0u64;
        for r in &reports {
            if let Report::Ack {
                group,
                msg_id,
                sender,
                client_msg_id,
            } = *r
            {
                round_acks += 1;
                if let Some(old) = acked.insert((group, sender, client_msg_id), msg_id) {
                    problems.push(format!(
                        "ACK of a fresh send ({group}, {sender}, {client_msg_id}) reused a key acknowledged before as id {old}"
                    ));
                }
            }
        }
        totals.acks += round_acks;

        let engine = Engine::open(config(dir.path(), round))
            .unwrap_or_else(|e| panic!("{ctx}: reopen after SIGKILL: {e}"));
        let report = engine.recovery_report().clone();
        totals.records_replayed += report.records_replayed;
        totals.bytes_cut += report.bytes_cut();
        if !report.damaged_groups.is_empty() {
            problems.push(format!(
                "recovery found damaged groups: {:?}",
                report.damaged_groups
            ));
        }
        let existing: HashSet<u64> = engine.group_ids().into_iter().collect();
        let mut stored: HashMap<u64, StoredGroup> = HashMap::new();
        for g in group_ids().filter(|g| existing.contains(g)) {
            stored.insert(g, read_group(&engine, g, &mut problems, &mut totals));
        }
        if let Some(extra) = existing.iter().find(|g| !group_ids().any(|x| x == **g)) {
            problems.push(format!("unexpected group {extra} after recovery"));
        }

        // Every acknowledged append of this and every earlier round.
        for (&(group, sender, client_msg_id), &msg_id) in &acked {
            let found = stored
                .get(&group)
                .and_then(|sg| sg.by_id.get(&msg_id).copied());
            match found {
                Some(k) if k == (sender, client_msg_id) => {}
                Some((s, c)) => {
                    totals.losses += 1;
                    problems.push(format!(
                        "LOST: group {group} msg {msg_id} was acknowledged for (sender {sender}, client_msg_id {client_msg_id}) but holds (sender {s}, client_msg_id {c})"
                    ));
                }
                None => {
                    totals.losses += 1;
                    let head = engine.head(group).ok();
                    problems.push(format!(
                        "LOST: group {group} msg {msg_id} (sender {sender}, client_msg_id {client_msg_id}) acknowledged but missing; head now {head:?}"
                    ));
                }
            }
        }
        // Every deliberate retransmit got the original id back.
        for r in &reports {
            if let Report::Dup {
                group,
                msg_id,
                sender,
                client_msg_id,
                duplicate,
            } = *r
            {
                totals.dups += 1;
                if !duplicate {
                    problems.push(format!(
                        "retransmit of (group {group}, sender {sender}, client_msg_id {client_msg_id}) was not recognised: stored again as msg {msg_id}"
                    ));
                }
                if let Some(&orig) = acked.get(&(group, sender, client_msg_id)) {
                    if orig != msg_id {
                        problems.push(format!(
                            "retransmit of (group {group}, sender {sender}, client_msg_id {client_msg_id}) returned msg {msg_id}, the original was acknowledged as msg {orig}"
                        ));
                    }
                }
                let found = stored
                    .get(&group)
                    .and_then(|sg| sg.by_id.get(&msg_id).copied());
                if found != Some((sender, client_msg_id)) {
                    totals.losses += 1;
                    problems.push(format!(
                        "retransmit of (group {group}, sender {sender}, client_msg_id {client_msg_id}) was acknowledged as msg {msg_id}, which holds {found:?}"
                    ));
                }
            }
        }

        if problems.is_empty() {
            if rng.range(0, 3) == 0 {
                // Sometimes leave without a clean checkpoint, so the next
                // child also starts with a journal replay.
                engine.simulate_crash();
            } else if let Err(e) = engine.close() {
                problems.push(format!("close: {e}"));
            }
        }
        if !problems.is_empty() {
            let shown = problems.len().min(PROBLEMS_SHOWN_MAX);
            panic!(
                "{ctx}: {} problems (first {shown} below); this round {} reports, {round_acks} ACKs; totals: acks {}, losses {}, duplicates {}; recovery: {report:?}\n{}",
                problems.len(),
                reports.len(),
                totals.acks,
                totals.losses,
                totals.duplicates,
                problems[..shown].join("\n")
            );
        }
    }

    println!(
        "crash_kill: seed {seed}: {rounds} rounds, {} acknowledged appends, {} acknowledged retransmits, losses {}, duplicates {} (recovery replayed {} records, cut {} torn bytes), {:.1?}",
        totals.acks,
        totals.dups,
        totals.losses,
        totals.duplicates,
        totals.records_replayed,
        totals.bytes_cut,
        started.elapsed()
    );
    assert_eq!(totals.losses, 0);
    assert_eq!(totals.duplicates, 0);
    assert!(
        totals.acks > 0,
        "seed {seed}: no append was acknowledged in {rounds} rounds: the child never got going"
    );
}

/// Reads a group whole and checks what holds for every stored record,
/// acknowledged or not: ids dense from 1 to head, CRC good, payload the one
/// derived from (group, sender, client_msg_id), timestamps never going back,
/// and no (sender, client_msg_id) twice.
fn read_group(
    engine: &Engine,
    group: u64,
    problems: &mut Vec<String>,
    totals: &mut Totals,
) -> StoredGroup {
    let head = engine.head(group).expect("head of an existing group");
    let mut sg = StoredGroup::default();
    let mut keys: HashMap<(u64, u64), u64> = HashMap::new();
    let mut after = 0u64;
    let mut last_ts = 0u64;
    loop {
        let batch = match engine.read(group, after, 500, 1 << 20) {
            Ok(b) => b,
            Err(e) => {
                problems.push(format!("group {group}: read after {after}: {e}"));
                return sg;
            }
        };
        for r in batch.records() {
            let h = r.header;
            if h.msg_id != after + 1 {
                problems.push(format!(
                    "group {group}: ids not dense: msg {} follows msg {after}",
                    h.msg_id
                ));
                return sg;
            }
            after = h.msg_id;
            if let Err(e) =
                record::decode_verified(r.bytes, RECORD_HEADER_BYTES + PAYLOAD_BYTES_MAX)
            {
                problems.push(format!("group {group} msg {}: {e}", h.msg_id));
            }
            if r.payload() != payload_of(group, h.sender_id, h.client_msg_id).as_slice() {
                problems.push(format!(
                    "group {group} msg {}: payload of {} bytes is not the one derived from (sender {}, client_msg_id {})",
                    h.msg_id,
                    r.payload().len(),
                    h.sender_id,
                    h.client_msg_id
                ));
            }
            if h.timestamp_ms < last_ts {
                problems.push(format!(
                    "group {group} msg {}: timestamp {} before the previous {last_ts}",
                    h.msg_id, h.timestamp_ms
                ));
            }
            last_ts = h.timestamp_ms;
            if let Some(first) = keys.insert((h.sender_id, h.client_msg_id), h.msg_id) {
                totals.duplicates += 1;
                problems.push(format!(
                    "DUPLICATE: group {group}: (sender {}, client_msg_id {}) stored as msg {first} and msg {}",
                    h.sender_id, h.client_msg_id, h.msg_id
                ));
            }
            sg.by_id.insert(h.msg_id, (h.sender_id, h.client_msg_id));
        }
        if batch.count == 0 || !batch.has_more {
            break;
        }
        if batch.last_id != after {
            problems.push(format!(
                "group {group}: batch last_id {} but its last record is msg {after}",
                batch.last_id
            ));
            return sg;
        }
    }
    if after != head {
        problems.push(format!(
            "group {group}: head is {head} but records end at msg {after}"
        ));
    }
    sg
}
