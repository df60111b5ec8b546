//! IM-bench v1 (design brief section 5) against peers, in one run:
//! tidemark (over the wire, and W2 in process), Redis Streams, SQLite and
//! PostgreSQL, with the same parameters and payloads, at both durability
//! levels where durability matters, plus the machine's physical anchors;
//! writes a Markdown table. `run.sh` starts the peers and calls `run`.

mod anchors;
mod common;
mod pg_peer;
mod redis_peer;
mod sqlite_peer;
mod tidemark_peer;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use common::{note, Durability, Quantiles, Row, Scale};

#[derive(Parser)]
#[command(
    name = "tidemark-compare",
    about = "IM-bench v1: tidemark against Redis, SQLite, PostgreSQL"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the comparison (peers must be running) and write the table.
    Run(Box<RunArgs>),
    /// Measure only the physical anchors.
    Anchors {
        #[arg(long)]
        work_dir: PathBuf,
    },
    /// `tidemark bench` (the load tool), for when the binary lacks the subcommand.
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        flags: Vec<String>,
    },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Redis port (0: skip Redis).
    #[arg(long, default_value_t = 0)]
    redis_port: u16,
    /// PostgreSQL port (0: skip PostgreSQL).
    #[arg(long, default_value_t = 0)]
    pg_port: u16,
    #[arg(long, default_value = "postgres")]
    pg_user: String,
    /// Directory for SQLite files, tidemark nodes and anchor files.
    #[arg(long)]
    work_dir: PathBuf,
    /// The tidemark binary (`tidemark serve`).
    #[arg(long)]
    node_bin: PathBuf,
    /// Systems: tidemark, redis, sqlite, postgres.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "tidemark,redis,sqlite,postgres"
    )]
    systems: Vec<String>,
    /// Workloads: w1, w2, w3, w4.
    #[arg(long, value_delimiter = ',', default_value = "w1,w2,w3,w4")]
    workloads: Vec<String>,
    /// Markdown output.
    #[arg(long)]
    out: PathBuf,
    /// A description of the machine for the table.
    #[arg(long, default_value = "")]
    machine: String,
    /// The command line to print in the table.
    #[arg(long, default_value = "")]
    command: String,
    #[command(flatten)]
    scale: Scale,
}

fn main() {
    match Cli::parse().command {
        Cmd::Run(a) => run(*a),
        Cmd::Anchors { work_dir } => println!("{:?}", anchors::measure(&work_dir)),
        Cmd::Bench { flags } => {
            let args = tidemark_server::bench::BenchArgs::parse_flags(flags).unwrap_or_else(|e| {
                eprintln!("{e}");
                std::process::exit(2)
            });
            if let Err(e) = tidemark_server::bench::run(args) {
                eprintln!("tidemark bench: {e}");
                std::process::exit(1);
            }
        }
    }
}

fn run(a: RunArgs) {
    let s = &a.scale;
    let has = |x: &str| a.systems.iter().any(|y| y == x);
    let wants = |x: &str| a.workloads.iter().any(|y| y == x);
    std::fs::create_dir_all(&a.work_dir).expect("work dir");
    let started = std::time::Instant::now();
    let load_start = common::loadavg();
    note("anchors");
    let anchors = anchors::measure(&a.work_dir);
    note(&format!("{anchors:?}"));

    let tm = tidemark_peer::Tidemark {
        node_bin: a.node_bin.clone(),
        data_dir: a.work_dir.clone(),
    };
    let redis = (has("redis") && a.redis_port != 0).then(|| redis_peer::Redis::new(a.redis_port));
    let sqlite_dir = a.work_dir.join("sqlite");
    std::fs::create_dir_all(&sqlite_dir).expect("sqlite dir");
    let sqlite = has("sqlite").then(|| sqlite_peer::Sqlite::new(&sqlite_dir));
    let pg =
        (has("postgres") && a.pg_port != 0).then(|| pg_peer::Postgres::new(a.pg_port, &a.pg_user));

    let mut rows: Vec<Row> = Vec::new();
    // One failing system must not lose the others' figures: a panic
    // becomes a row marked unverified with the reason.
    let mut push = |w: &'static str, system: &str, f: &dyn Fn() -> Row| {
        let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(r) => r,
            Err(e) => {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panic".into());
                Row {
                    workload: w,
                    system: system.into(),
                    durability: Durability::Relaxed,
                    setting: "(failed)".into(),
                    unit: "ops",
                    ops: 0,
                    secs: 1.0,
                    payload_bytes: 0,
                    latency: Quantiles::default(),
                    setup_secs: 0.0,
                    verified: false,
                    verification: format!("FAILED: {why}"),
                    wire: true,
                }
            }
        };
        note(&format!(
            "{} {} ({}): {:.0} {}/s, {:.1} MB/s, p50 {} us, p99 {} us, verified {}",
            r.workload,
            r.system,
            r.setting,
            r.ops_per_sec(),
            r.unit,
            r.mb_per_sec(),
            r.latency.p50_us,
            r.latency.p99_us,
            r.verified
        ));
        rows.push(r);
    };
    if wants("w1") {
        for strict in [true, false] {
            if has("tidemark") {
                push("w1", "tidemark", &|| tm.w1(s, strict));
            }
            if let Some(r) = &redis {
                push("w1", "Redis Streams", &|| r.w1(s, strict));
            }
            if let Some(q) = &sqlite {
                push("w1", "SQLite", &|| q.w1(s, strict));
            }
            if let Some(p) = &pg {
                push("w1", "PostgreSQL", &|| p.w1(s, strict));
            }
        }
    }
    if wants("w2") {
        if has("tidemark") {
            push("w2", "tidemark", &|| tm.w2(s));
            push("w2", "tidemark engine", &|| tm.w2_in_process(s));
        }
        if let Some(r) = &redis {
            push("w2", "Redis Streams", &|| r.w2(s));
        }
        if let Some(q) = &sqlite {
            push("w2", "SQLite", &|| q.w2(s));
        }
        if let Some(p) = &pg {
            push("w2", "PostgreSQL", &|| p.w2(s));
        }
    }
    if wants("w3") {
        if has("tidemark") {
            push("w3", "tidemark", &|| tm.w3(s));
        }
        if let Some(r) = &redis {
            push("w3", "Redis Streams", &|| r.w3(s));
        }
        if let Some(q) = &sqlite {
            push("w3", "SQLite", &|| q.w3(s));
        }
        if let Some(p) = &pg {
            push("w3", "PostgreSQL", &|| p.w3(s));
        }
    }
    if wants("w4") {
        if has("tidemark") {
            push("w4", "tidemark", &|| tm.w4(s));
        }
        if let Some(r) = &redis {
            push("w4", "Redis Streams", &|| r.w4(s, false));
            push("w4", "Redis Streams (cursors per user)", &|| r.w4(s, true));
        }
        if let Some(q) = &sqlite {
            push("w4", "SQLite", &|| q.w4(s));
        }
        if let Some(p) = &pg {
            push("w4", "PostgreSQL", &|| p.w4(s));
        }
    }
    let load = format!(
        "{load_start} at the start, {} at the end",
        common::loadavg()
    );
    let md = table(&a, &anchors, &rows, started.elapsed().as_secs_f64(), &load);
    if let Some(dir) = a.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&a.out, &md).expect("write the table");
    let json: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "workload": r.workload, "system": r.system, "durability": format!("{:?}", r.durability),
                "setting": r.setting, "unit": r.unit, "ops": r.ops, "secs": r.secs,
                "ops_per_sec": r.ops_per_sec(), "mb_per_sec": r.mb_per_sec(),
                "p50_us": r.latency.p50_us, "p99_us": r.latency.p99_us, "max_us": r.latency.max_us,
                "setup_secs": r.setup_secs, "verified": r.verified, "verification": r.verification,
                "wire": r.wire,
            })
        })
        .collect();
    let _ = std::fs::write(
        a.out.with_extension("json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "anchors": {
                "seq_write_mb_s": anchors.seq_write_mb_s,
                "fdatasync_p50_us": anchors.fdatasync_p50_us,
                "fdatasync_p99_us": anchors.fdatasync_p99_us,
                "memcpy_gb_s": anchors.memcpy_gb_s,
                "loopback_mb_s": anchors.loopback_mb_s,
            },
            "rows": json,
        }))
        .unwrap_or_default(),
    );
    println!("{md}");
}

fn fmt_n(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The best peer (not tidemark) of a workload and durability class, over
/// the wire unless `in_process`.
fn best_peer<'a>(rows: &'a [Row], w: &str, d: Durability, wire: Option<bool>) -> Option<&'a Row> {
    rows.iter()
        .filter(|r| r.workload == w && r.durability == d && !r.system.starts_with("tidemark"))
        .filter(|r| wire.is_none_or(|x| r.wire == x))
        .filter(|r| r.verified)
        .max_by(|a, b| a.ops_per_sec().total_cmp(&b.ops_per_sec()))
}

fn find<'a>(rows: &'a [Row], w: &str, system: &str, d: Durability) -> Option<&'a Row> {
    rows.iter()
        .find(|r| r.workload == w && r.system == system && r.durability == d)
}

const TITLES: [(&str, &str); 4] = [
    ("w1", "W1 append"),
    ("w2", "W2 fan-out pull"),
    ("w3", "W3 ACK storm"),
    ("w4", "W4 unread"),
];

fn table(a: &RunArgs, an: &anchors::Anchors, rows: &[Row], total_secs: f64, load: &str) -> String {
    let s = &a.scale;
    let mut o = String::new();
    let _ = writeln!(o, "# IM-bench v1: tidemark and its peers, one run\n");
    if !a.machine.is_empty() {
        let _ = writeln!(o, "Machine: {}\n", a.machine);
    }
    let _ = writeln!(o, "Load average (1 min) of the machine: {load}. Every system shares the 2 cores with its client, and with whatever else runs on the machine.\n");
    if !a.command.is_empty() {
        let _ = writeln!(
            o,
            "Command: `{}` (the whole run took {:.0} s)\n",
            a.command, total_secs
        );
    }
    let full = |x: u64, f: u64| {
        if x == f {
            "full size".to_string()
        } else {
            format!("**scaled: brief says {}**", fmt_n(f as f64))
        }
    };
    let _ = writeln!(o, "## Parameters (the same for every system)\n");
    let _ = writeln!(o, "Payloads: {} random bytes (1,024 distinct payloads, seed {:#x}); {} connections x {} requests in flight for systems over the wire; {} threads for in-process reads.\n", s.size, s.seed, s.connections, s.in_flight, s.local_threads);
    let _ = writeln!(o, "| workload | parameters | scale |\n|---|---|---|");
    if a.workloads.iter().any(|x| x == "w1") {
        let _ = writeln!(
            o,
            "| W1 | {} messages to {} groups, group uniform at random | messages: {}; groups: {} |",
            fmt_n(s.w1_messages as f64),
            fmt_n(s.w1_groups as f64),
            full(s.w1_messages, 1_000_000),
            full(s.w1_groups, 10_000)
        );
    }
    if a.workloads.iter().any(|x| x == "w2") {
        let _ = writeln!(o, "| W2 | 1 group, {} members, {} stored messages, cursors uniform in [{}, {}), pages of {}, each page ACKs the previous | members: {}; messages: {} |", fmt_n(s.w2_members as f64), fmt_n(s.w2_messages as f64), fmt_n((s.w2_messages - s.w2_messages / 10) as f64), fmt_n(s.w2_messages as f64), s.page, full(s.w2_members, 2_000), full(s.w2_messages, 100_000));
    }
    if a.workloads.iter().any(|x| x == "w3") {
        let _ = writeln!(o, "| W3 | 1 group, {} members, {} single ACKs each moving a random member's cursor forward by 1..=16 (head {}) | members: {}; ACKs: {} |", fmt_n(s.w3_members as f64), fmt_n(s.w3_acks as f64), fmt_n(s.w3_messages as f64), full(s.w3_members, 100_000), full(s.w3_acks, 1_000_000));
    }
    if a.workloads.iter().any(|x| x == "w4") {
        let _ = writeln!(o, "| W4 | {} users x {} of {} groups, {} messages, random cursors; {} queries \"unread count of every group of user u\" | users: {}; messages: {}; queries: {} |\n", fmt_n(s.w4_users as f64), s.w4_groups_per_user, fmt_n(s.w4_groups as f64), fmt_n(s.w4_messages as f64), fmt_n(s.w4_queries as f64), full(s.w4_users, 100_000), full(s.w4_messages, 1_000_000), full(s.w4_queries, 100_000));
    }

    let _ = writeln!(o, "## Physical anchors (this machine, this run)\n");
    let _ = writeln!(o, "| anchor | value |\n|---|---|");
    let _ = writeln!(
        o,
        "| sequential write, 1 MiB writes + fdatasync (1 GiB) | {:.0} MB/s |",
        an.seq_write_mb_s
    );
    let _ = writeln!(
        o,
        "| fdatasync of a 4 KiB append | p50 {} us, p99 {} us |",
        an.fdatasync_p50_us, an.fdatasync_p99_us
    );
    let _ = writeln!(
        o,
        "| memcpy (256 MiB buffers) | {:.1} GB/s |",
        an.memcpy_gb_s
    );
    let _ = writeln!(
        o,
        "| loopback TCP, one stream | {:.0} MB/s |\n",
        an.loopback_mb_s
    );

    let _ = writeln!(o, "## Results\n");
    let _ = writeln!(o, "Ratios are tidemark's throughput divided by the row's, within the same durability class (tidemark over the wire; for the in-process SQLite W2 row, tidemark's engine in process).\n");
    for (w, title) in TITLES {
        let rs: Vec<&Row> = rows.iter().filter(|r| r.workload == w).collect();
        if rs.is_empty() {
            continue;
        }
        let _ = writeln!(o, "### {title}\n");
        let _ = writeln!(o, "| system | durability | transport | ops/s | payload MB/s | p50 us | p99 us | max us | setup s | verified | tidemark / this |\n|---|---|---|---:|---:|---:|---:|---:|---:|---|---:|");
        for r in &rs {
            let tm = if r.system.starts_with("tidemark") || !r.verified {
                None
            } else if r.wire {
                find(rows, w, "tidemark", r.durability)
            } else {
                find(rows, w, "tidemark engine", r.durability)
                    .or_else(|| find(rows, w, "tidemark", r.durability))
            };
            let ratio = tm
                .map(|t| format!("{:.2}x", t.ops_per_sec() / r.ops_per_sec().max(1e-9)))
                .unwrap_or_else(|| "".into());
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} {} | {:.1} | {} | {} | {} | {:.1} | {} | {} |",
                if r.system.starts_with("tidemark") {
                    format!("**{}**", r.system)
                } else {
                    r.system.clone()
                },
                r.setting,
                if r.wire { "loopback TCP" } else { "in process" },
                fmt_n(r.ops_per_sec()),
                r.unit,
                r.mb_per_sec(),
                fmt_n(r.latency.p50_us as f64),
                fmt_n(r.latency.p99_us as f64),
                fmt_n(r.latency.max_us as f64),
                r.setup_secs,
                if r.verified { "yes" } else { "**NO**" },
                ratio
            );
        }
        let _ = writeln!(o);
        for r in &rs {
            let _ = writeln!(o, "- {} ({}): {}", r.system, r.setting, r.verification);
        }
        let _ = writeln!(o);
    }

    let _ = writeln!(o, "## tidemark / best peer of the same durability\n");
    let _ = writeln!(o, "| workload | durability | tidemark | best peer | ratio | goal | met |\n|---|---|---:|---|---:|---|---|");
    let goals: [(&str, Durability, Option<bool>, &str, f64); 6] = [
        (
            "w1",
            Durability::Strict,
            None,
            "W1 append (over the wire)",
            5.0,
        ),
        (
            "w1",
            Durability::Relaxed,
            None,
            "W1 append (over the wire)",
            0.0,
        ),
        (
            "w2",
            Durability::Relaxed,
            Some(true),
            "W2 over the wire",
            2.0,
        ),
        (
            "w2",
            Durability::Relaxed,
            Some(false),
            "W2 in process (engine vs SQLite)",
            5.0,
        ),
        ("w3", Durability::Relaxed, None, "W3 ACK storm", 3.0),
        ("w4", Durability::Relaxed, None, "W4 unread", 10.0),
    ];
    for (w, d, wire, label, goal) in goals {
        let t = if wire == Some(false) {
            find(rows, w, "tidemark engine", d)
        } else {
            find(rows, w, "tidemark", d)
        };
        let (Some(t), Some(p)) = (t, best_peer(rows, w, d, wire)) else {
            continue;
        };
        let ratio = t.ops_per_sec() / p.ops_per_sec().max(1e-9);
        let _ = writeln!(
            o,
            "| {label} | {} | {} {}/s | {} ({}) {} {}/s | **{:.2}x** | {} | {} |",
            d.label(),
            fmt_n(t.ops_per_sec()),
            t.unit,
            p.system,
            p.setting,
            fmt_n(p.ops_per_sec()),
            p.unit,
            ratio,
            if goal > 0.0 {
                format!(">= {goal}x")
            } else {
                "none stated".into()
            },
            if goal == 0.0 {
                "-"
            } else if ratio >= goal && t.verified {
                "yes"
            } else {
                "**no**"
            }
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "## tidemark against the machine\n");
    for d in [Durability::Strict, Durability::Relaxed] {
        if let Some(t) = find(rows, "w1", "tidemark", d) {
            let _ = writeln!(o, "- W1 {} ({}): {:.1} MB/s of payload = {:.1}% of sequential write bandwidth ({:.0} MB/s); {:.0} sends per fdatasync-p50 interval.", t.setting, d.label(), t.mb_per_sec(), 100.0 * t.mb_per_sec() / an.seq_write_mb_s, an.seq_write_mb_s, t.ops_per_sec() * an.fdatasync_p50_us as f64 / 1e6);
        }
    }
    if let Some(t) = find(rows, "w2", "tidemark", Durability::Relaxed) {
        let _ = writeln!(o, "- W2 over the wire: {:.0} MB/s of payload = {:.1}% of loopback TCP ({:.0} MB/s) and {:.1}% of memcpy ({:.1} GB/s). Goal: at least 50% of loopback.", t.mb_per_sec(), 100.0 * t.mb_per_sec() / an.loopback_mb_s, an.loopback_mb_s, 100.0 * t.mb_per_sec() / (an.memcpy_gb_s * 1000.0), an.memcpy_gb_s);
    }
    if let Some(t) = find(rows, "w2", "tidemark engine", Durability::Relaxed) {
        let _ = writeln!(
            o,
            "- W2 in process: {:.0} MB/s of payload = {:.1}% of memcpy.",
            t.mb_per_sec(),
            100.0 * t.mb_per_sec() / (an.memcpy_gb_s * 1000.0)
        );
    }
    let _ = writeln!(o);
    let _ = writeln!(o, "## How each system is modelled (where a peer's model is weaker or stronger than tidemark's)\n");
    let _ = writeln!(o, "{}", MODELS);
    o
}

const MODELS: &str = "\
- **tidemark**: `tidemark bench --spawn` (the same code, linked): a fresh node per workload; SEND is idempotent by `(sender, client_msg_id)` and answered once durable under the policy; cursors only move forward and an ACK above the head is refused; every record's CRC is checked by the client. W2-W4 run with `fsync=never`: an ACK is never synced per request under any policy (cursors are persisted in bulk), so the like-for-like peers are the relaxed ones. The in-process W2 row reads pages with `Engine::pull` (ACKing the previous page) and copies each page into an output buffer.
- **Redis Streams** (Redis 7, one instance, AOF): a stream per group with explicit dense ids `0-n` from a Lua script that also keeps the head in a hash (`XADD` alone would give time-based ids, and unread counts would need a scan); cursors in a hash per group; user -> groups in a set; the unread query is a Lua script (one round trip; inside it, `SMEMBERS` plus two `HGET`s per group). W4 also runs a second Redis model, \"cursors per user\": one hash per user (group -> cursor), so the script is one `HGETALL` plus one `HMGET` of the heads; it is faster for W4 and costs W3 nothing (an ACK is one `HSET` either way). Every connection pipelines `in_flight` commands. *Weaker than ours*: no idempotent send (a retransmit stores a second copy); `HSET` cursors are last-writer-wins (not monotonic, not checked against the head): correct here only because one member's ACKs are ordered on one connection; no end-to-end checksum. *Stronger*: everything in memory (the dataset must fit in RAM), and `appendfsync always` fsyncs once per event-loop iteration for all clients (group commit, like ours).
- **SQLite** (bundled, WAL, in process: no network, no protocol, no second process; stronger in that sense): the seeds' schema, `t_group_msgs` clustered by `(group_id, msg_id)` (WITHOUT ROWID), `t_group_users` keyed by `(group_id, user_id)` plus an index on `user_id`, and `t_groups(group_id, head)` as the per-group id counter. One writer (SQLite allows one): W1 sends in transactions of 256 (every send in flight at once in tidemark's run: group commit by hand), W3 ACKs likewise; reads on 2 threads. Cursor updates are monotonic (`MAX`) but not checked against the head. No idempotent send.
- **PostgreSQL** 15 (loopback TCP, one connection per client thread, the synchronous `postgres` crate: one statement in flight per connection, so at most 16 requests in flight against tidemark's 256): the same schema with `BIGINT`/`BYTEA`; a send is one statement (`UPDATE t_groups .. RETURNING head` feeding the `INSERT` in a CTE); a page is one statement (the ACK of the previous page as a CTE plus the `SELECT`); W3's ACKs in flight on a connection go as one `UPDATE .. FROM unnest(..)` (coalesced per member); cursor updates monotonic (`GREATEST`), not checked against the head; concurrent commits share WAL flushes (`synchronous_commit=on`). No idempotent send. Server settings: `shared_buffers=1GB`, `wal_level=minimal`, `max_wal_size=4GB`, `checkpoint_timeout=30min`.
- Setup (creating groups, storing messages, joining members) is excluded from every figure and timed separately; peers load it with their bulk paths (COPY, big transactions, pipelines).";
