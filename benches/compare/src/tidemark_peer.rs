//! tidemark: over the wire through `tidemark_server::bench` (the same code
//! as `tidemark bench --spawn --json`, a node per workload on a fresh
//! directory), and W2 in process on the engine (the same work as SQLite's
//! in-process W2: read each page, copy it into an output buffer, ACK).

use std::path::{Path, PathBuf};
use std::time::Instant;

use tidemark_engine::{Config, Engine, FsyncPolicy, JoinStart};
use tidemark_server::bench::{plan, run_workloads, BenchArgs, JsonValue};

use crate::common::*;

pub struct Tidemark {
    pub node_bin: PathBuf,
    pub data_dir: PathBuf,
}

impl Tidemark {
    fn run(&self, s: &Scale, workload: &str, fsync: &str, flags: &[String]) -> JsonValue {
        let mut all: Vec<String> = vec![
            "--spawn".into(),
            "--node-bin".into(),
            self.node_bin.display().to_string(),
            "--data-dir".into(),
            self.data_dir.display().to_string(),
            "--fsync".into(),
            fsync.into(),
            "--quiet".into(),
            "--json".into(),
            "-w".into(),
            workload.into(),
            "--connections".into(),
            s.connections.to_string(),
            "--in-flight".into(),
            s.in_flight.to_string(),
            "--size".into(),
            s.size.to_string(),
            "--seed".into(),
            s.seed.to_string(),
            "--page".into(),
            s.page.to_string(),
        ];
        all.extend(flags.iter().cloned());
        note(&format!("tidemark {workload} (fsync={fsync})"));
        let args = BenchArgs::parse_flags(all).expect("bench flags");
        let mut r = run_workloads(&args).expect("tidemark bench");
        r.pop().expect("one result")
    }

    fn row(
        v: &JsonValue,
        workload: &'static str,
        unit: &'static str,
        durability: Durability,
        setting: &str,
    ) -> Row {
        let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
        let u = |k: &str| v[k].as_u64().unwrap_or(0);
        let setup: f64 = v["setup_secs"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|x| !x["what"].as_str().unwrap_or("").starts_with("verify"))
                    .map(|x| x["secs"].as_f64().unwrap_or(0.0))
                    .sum()
            })
            .unwrap_or(0.0);
        Row {
            workload,
            system: "tidemark".into(),
            durability,
            setting: setting.into(),
            unit,
            ops: u("ops"),
            secs: f("measured_secs"),
            payload_bytes: u("payload_bytes"),
            latency: Quantiles {
                p50_us: v["latency_us"]["p50"].as_u64().unwrap_or(0),
                p99_us: v["latency_us"]["p99"].as_u64().unwrap_or(0),
                max_us: v["latency_us"]["max"].as_u64().unwrap_or(0),
            },
            setup_secs: setup,
            verified: v["verified"].as_bool() == Some(true) && u("errors") == 0,
            verification: v["verification"].as_str().unwrap_or("").to_string(),
            wire: true,
        }
    }

    pub fn w1(&self, s: &Scale, always: bool) -> Row {
        let fsync = if always { "always" } else { "never" };
        let v = self.run(
            s,
            "w1",
            fsync,
            &[
                "--groups".into(),
                s.w1_groups.to_string(),
                "--messages".into(),
                s.w1_messages.to_string(),
            ],
        );
        let (d, setting) = if always {
            (Durability::Strict, "fsync=always")
        } else {
            (Durability::Relaxed, "fsync=never")
        };
        let mut row = Self::row(&v, "w1", "msgs", d, setting);
        if let Some(c) = v["commit"].as_str() {
            row.verification = format!("{}; {c}", row.verification);
        }
        row
    }

    pub fn w2(&self, s: &Scale) -> Row {
        let v = self.run(
            s,
            "w2",
            "never",
            &[
                "--members".into(),
                s.w2_members.to_string(),
                "--messages".into(),
                s.w2_messages.to_string(),
            ],
        );
        Self::row(&v, "w2", "deliveries", Durability::Relaxed, "fsync=never")
    }

    pub fn w3(&self, s: &Scale) -> Row {
        let v = self.run(
            s,
            "w3",
            "never",
            &[
                "--members".into(),
                s.w3_members.to_string(),
                "--messages".into(),
                s.w3_messages.to_string(),
                "--ops".into(),
                s.w3_acks.to_string(),
            ],
        );
        Self::row(&v, "w3", "acks", Durability::Relaxed, "fsync=never")
    }

    pub fn w4(&self, s: &Scale) -> Row {
        let v = self.run(
            s,
            "w4",
            "never",
            &[
                "--members".into(),
                s.w4_users.to_string(),
                "--groups".into(),
                s.w4_groups.to_string(),
                "--groups-per-user".into(),
                s.w4_groups_per_user.to_string(),
                "--messages".into(),
                s.w4_messages.to_string(),
                "--ops".into(),
                s.w4_queries.to_string(),
            ],
        );
        Self::row(&v, "w4", "queries", Durability::Relaxed, "fsync=never")
    }

    /// W2 on the engine in process: `local_threads` threads, each page
    /// copied into an output buffer (what a server's write would copy).
    pub fn w2_in_process(&self, s: &Scale) -> Row {
        let dir = self.data_dir.join("tidemark-inprocess-w2");
        let _ = std::fs::remove_dir_all(&dir);
        let row = w2_engine(&dir, s);
        let _ = std::fs::remove_dir_all(&dir);
        row
    }
}

fn w2_engine(dir: &Path, s: &Scale) -> Row {
    note("tidemark w2 in process");
    let mut config = Config::new(dir);
    config.fsync = FsyncPolicy::Never;
    let engine = Engine::open(config).expect("open engine");
    let payloads = s.payloads();
    let t0 = Instant::now();
    engine.create_group(1).expect("create group");
    for chunk in (0..s.w2_messages).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<tidemark_engine::AppendRequest<'_>> = chunk
            .iter()
            .map(|&i| {
                let (sender, cmid) = plan::sender_of(i);
                tidemark_engine::AppendRequest {
                    group_id: 1,
                    sender_id: sender,
                    client_msg_id: cmid,
                    payload: &payloads[(i % payloads.len() as u64) as usize],
                }
            })
            .collect();
        engine.append_batch(&batch).expect("append");
    }
    for m in 1..=s.w2_members {
        engine
            // The engine's `At(m)` names the first unread message (cursor
            // m - 1); the wire's JOIN AT names the cursor itself.
            .join(
                1,
                m,
                JoinStart::At(plan::w2_cursor(s.seed, s.w2_messages, m) + 1),
            )
            .expect("join");
    }
    let setup = secs(t0);
    let threads = s.local_threads.max(1);
    let t = Instant::now();
    let res = parallel(threads, |k| {
        let mut lat = Lat::new();
        let (mut delivered, mut fault) = (0u64, None);
        let mut out: Vec<u8> = Vec::with_capacity(1 << 20);
        for m in (1..=s.w2_members).filter(|m| (m % threads as u64) as usize == k) {
            let start = plan::w2_cursor(s.seed, s.w2_messages, m);
            let mut last = start;
            loop {
                let tq = Instant::now();
                let ack = (last > start).then_some(last);
                let p = engine
                    .pull(1, m, s.page as usize, 1 << 20, ack)
                    .expect("pull");
                out.clear();
                for ch in &p.batch.chunks {
                    out.extend_from_slice(ch.bytes());
                }
                lat.record_n(tq.elapsed(), 1);
                if p.batch.count > 0 && p.batch.last_id != last + p.batch.count {
                    fault.get_or_insert(format!(
                        "member {m}: page not dense: last {last}, count {}, last_id {}, cursor {}",
                        p.batch.count, p.batch.last_id, p.cursor
                    ));
                }
                delivered += p.batch.count;
                last = p.batch.last_id.max(last);
                if !p.batch.has_more || p.batch.count == 0 {
                    break;
                }
            }
            if last > start {
                engine.ack(1, m, last).expect("final ack");
            }
        }
        (delivered, lat, fault)
    });
    let secs = secs(t);
    let (mut delivered, mut fault) = (0, None);
    let mut lat = Lat::new();
    for (d, l, f) in res {
        delivered += d;
        lat.merge(&l);
        fault = fault.or(f);
    }
    let expected = plan::w2_expected(s.seed, s.w2_messages, s.w2_members);
    let _ = engine.close();
    Row {
        workload: "w2",
        system: "tidemark engine".into(),
        durability: Durability::Relaxed,
        setting: "in process, fsync=never".into(),
        unit: "deliveries",
        ops: delivered,
        secs,
        payload_bytes: delivered * s.size as u64,
        latency: Quantiles::of(&lat),
        setup_secs: setup,
        verified: fault.is_none() && delivered == expected,
        verification: fault
            .unwrap_or_else(|| format!("delivered {delivered} (expected {expected})")),
        wire: false,
    }
}
