//! SQLite (bundled, in process, WAL) with the seeds' schema:
//! `t_group_msgs(group_id, msg_id, sender_id, time, msg_detail)` clustered
//! by `(group_id, msg_id)`, `t_group_users(group_id, user_id,
//! last_ack_msg_id)` with an index on `user_id`, plus `t_groups(group_id,
//! head)` holding the id counter a dense per-group msg_id needs.
//!
//! SQLite has one writer at a time, so writes go through one connection
//! and are batched the way a real application would batch them: a send
//! transaction takes every send in flight at once (connections x in-flight),
//! ACKs likewise; reads (pulls, unread queries) run on `local_threads`
//! connections. Cursor updates are monotonic (`MAX(last_ack_msg_id, ?)`).
//! Durability: `synchronous=FULL` (WAL synced at every commit) or `OFF`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rusqlite::{params, Connection};
use tidemark_server::bench::plan;

use crate::common::*;

pub struct Sqlite {
    dir: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE t_groups(group_id INTEGER PRIMARY KEY, head INTEGER NOT NULL);
CREATE TABLE t_group_msgs(
    group_id INTEGER NOT NULL, msg_id INTEGER NOT NULL, sender_id INTEGER NOT NULL,
    time INTEGER NOT NULL, msg_detail BLOB NOT NULL,
    PRIMARY KEY (group_id, msg_id)) WITHOUT ROWID;
CREATE TABLE t_group_users(
    group_id INTEGER NOT NULL, user_id INTEGER NOT NULL, last_ack_msg_id INTEGER NOT NULL,
    PRIMARY KEY (group_id, user_id)) WITHOUT ROWID;
";
const INDEX: &str = "CREATE INDEX t_group_users_user ON t_group_users(user_id);";

impl Sqlite {
    pub fn new(dir: &Path) -> Sqlite {
        Sqlite {
            dir: dir.to_owned(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.db"))
    }

    fn open(&self, name: &str, full: bool) -> Connection {
        let c = Connection::open(self.path(name)).expect("open sqlite");
        c.pragma_update(None, "journal_mode", "WAL").expect("WAL");
        c.pragma_update(None, "synchronous", if full { "FULL" } else { "OFF" })
            .expect("synchronous");
        c.pragma_update(None, "cache_size", -262_144)
            .expect("cache_size"); // 256 MiB
        c.busy_timeout(std::time::Duration::from_secs(30))
            .expect("busy timeout");
        c
    }

    /// A fresh database `name` with the schema.
    fn create(&self, name: &str, full: bool) -> Connection {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path(name).display()));
        }
        let c = self.open(name, full);
        c.execute_batch(SCHEMA).expect("schema");
        c
    }

    fn setting(full: bool) -> (Durability, String) {
        if full {
            (Durability::Strict, "WAL, synchronous=FULL".into())
        } else {
            (Durability::Relaxed, "WAL, synchronous=OFF".into())
        }
    }

    fn insert_groups(c: &mut Connection, heads: impl Iterator<Item = (u64, u64)>) {
        let tx = c.transaction().expect("tx");
        {
            let mut st = tx
                .prepare("INSERT INTO t_groups VALUES (?1, ?2)")
                .expect("prepare");
            for (g, h) in heads {
                st.execute(params![g as i64, h as i64])
                    .expect("insert group");
            }
        }
        tx.commit().expect("commit");
    }

    /// Sends (group, message index) in transactions of `batch`; returns ids.
    fn send_all(
        c: &mut Connection,
        items: &[(u64, u64)],
        payloads: &[Vec<u8>],
        batch: usize,
        lat: &mut Lat,
    ) -> Vec<(u64, u64)> {
        let mut out = Vec::with_capacity(items.len());
        for chunk in items.chunks(batch.max(1)) {
            let t = Instant::now();
            let tx = c.transaction().expect("tx");
            {
                let mut next = tx
                    .prepare_cached(
                        "UPDATE t_groups SET head = head + 1 WHERE group_id = ?1 RETURNING head",
                    )
                    .expect("prepare");
                let mut ins = tx
                    .prepare_cached("INSERT INTO t_group_msgs VALUES (?1, ?2, ?3, ?4, ?5)")
                    .expect("prepare");
                let now = now_ms();
                for &(g, i) in chunk {
                    let id: i64 = next.query_row([g as i64], |r| r.get(0)).expect("next id");
                    let (sender, _) = plan::sender_of(i);
                    ins.execute(params![
                        g as i64,
                        id,
                        sender as i64,
                        now,
                        &payloads[(i % payloads.len() as u64) as usize][..]
                    ])
                    .expect("insert message");
                    out.push((g, id as u64));
                }
            }
            tx.commit().expect("commit");
            lat.record_n(t.elapsed(), chunk.len() as u64);
        }
        out
    }

    pub fn w1(&self, s: &Scale, full: bool) -> Row {
        let mut c = self.create("w1", full);
        Self::insert_groups(&mut c, (1..=s.w1_groups).map(|g| (g, 0)));
        let payloads = s.payloads();
        let items: Vec<(u64, u64)> = (0..s.w1_messages)
            .map(|i| (plan::w1_group(s.seed, s.w1_groups, i), i))
            .collect();
        note(&format!("sqlite w1 (full={full})"));
        let mut lat = Lat::new();
        let t = Instant::now();
        let ids = Self::send_all(
            &mut c,
            &items,
            &payloads,
            s.connections * s.in_flight,
            &mut lat,
        );
        let secs = secs(t);
        let v = dense(s.w1_groups, &ids);
        let (durability, setting) = Self::setting(full);
        Row {
            workload: "w1",
            system: "SQLite".into(),
            durability,
            setting,
            unit: "msgs",
            ops: ids.len() as u64,
            secs,
            payload_bytes: ids.len() as u64 * s.size as u64,
            latency: Quantiles::of(&lat),
            setup_secs: 0.0,
            verified: v.is_ok(),
            verification: v.unwrap_or_else(|e| e),
            wire: false,
        }
    }

    pub fn w2(&self, s: &Scale) -> Row {
        let mut c = self.create("w2", false);
        let payloads = s.payloads();
        note("sqlite w2 setup");
        let t0 = Instant::now();
        Self::insert_groups(&mut c, std::iter::once((1, 0)));
        let items: Vec<(u64, u64)> = (0..s.w2_messages).map(|i| (1, i)).collect();
        Self::send_all(&mut c, &items, &payloads, 10_000, &mut Lat::new());
        {
            let tx = c.transaction().expect("tx");
            {
                let mut st = tx
                    .prepare("INSERT INTO t_group_users VALUES (1, ?1, ?2)")
                    .expect("prepare");
                for m in 1..=s.w2_members {
                    st.execute(params![
                        m as i64,
                        plan::w2_cursor(s.seed, s.w2_messages, m) as i64
                    ])
                    .expect("join");
                }
            }
            tx.commit().expect("commit");
        }
        c.execute_batch(INDEX).expect("index");
        let setup = secs(t0);
        note("sqlite w2");
        let threads = s.local_threads.max(1);
        let t = Instant::now();
        let res = parallel(threads, |k| {
            let c = self.open("w2", false);
            let mut ack = c
                .prepare("UPDATE t_group_users SET last_ack_msg_id = MAX(last_ack_msg_id, ?2) WHERE group_id = 1 AND user_id = ?1")
                .expect("prepare");
            let mut page = c
                .prepare("SELECT msg_id, sender_id, time, msg_detail FROM t_group_msgs WHERE group_id = 1 AND msg_id > ?1 ORDER BY msg_id LIMIT ?2")
                .expect("prepare");
            let mut lat = Lat::new();
            let (mut delivered, mut bytes, mut fault) = (0u64, 0u64, None);
            // What a server would copy into its output buffer.
            let mut out: Vec<u8> = Vec::with_capacity(1 << 20);
            for m in (1..=s.w2_members).filter(|m| (m % threads as u64) as usize == k) {
                let start = plan::w2_cursor(s.seed, s.w2_messages, m);
                let mut last = start;
                loop {
                    let tq = Instant::now();
                    if last > start {
                        ack.execute(params![m as i64, last as i64]).expect("ack");
                    }
                    out.clear();
                    let mut n = 0u32;
                    let mut rows = page.query(params![last as i64, s.page]).expect("page");
                    while let Some(r) = rows.next().expect("row") {
                        let id: i64 = r.get(0).expect("msg_id");
                        let sender: i64 = r.get(1).expect("sender");
                        let time: i64 = r.get(2).expect("time");
                        let detail = r.get_ref(3).expect("detail").as_blob().expect("blob");
                        if id as u64 != last + 1 {
                            fault.get_or_insert(format!("member {m}: id {id} after {last}"));
                        }
                        last = id as u64;
                        out.extend_from_slice(&id.to_le_bytes());
                        out.extend_from_slice(&sender.to_le_bytes());
                        out.extend_from_slice(&time.to_le_bytes());
                        out.extend_from_slice(detail);
                        bytes += detail.len() as u64;
                        n += 1;
                    }
                    delivered += n as u64;
                    lat.record_n(tq.elapsed(), 1);
                    if n < s.page || last >= s.w2_messages {
                        break;
                    }
                }
                if last > start {
                    ack.execute(params![m as i64, last as i64])
                        .expect("final ack");
                }
            }
            (delivered, bytes, lat, fault)
        });
        let secs = secs(t);
        let (delivered, bytes, lat, fault) = merge_pulls(res);
        let expected = plan::w2_expected(s.seed, s.w2_messages, s.w2_members);
        let at_head: i64 = c
            .query_row(
                "SELECT count(*) FROM t_group_users WHERE group_id = 1 AND last_ack_msg_id = ?1",
                [s.w2_messages as i64],
                |r| r.get(0),
            )
            .expect("count");
        Row {
            workload: "w2",
            system: "SQLite".into(),
            durability: Durability::Relaxed,
            setting: "WAL, synchronous=OFF".into(),
            unit: "deliveries",
            ops: delivered,
            secs,
            payload_bytes: bytes,
            latency: Quantiles::of(&lat),
            setup_secs: setup,
            verified: fault.is_none() && delivered == expected && at_head as u64 == s.w2_members,
            verification: fault.unwrap_or_else(|| {
                format!(
                    "delivered {delivered} (expected {expected}); {at_head} cursors at the head"
                )
            }),
            wire: false,
        }
    }

    pub fn w3(&self, s: &Scale) -> Row {
        let mut c = self.create("w3", false);
        note("sqlite w3 setup");
        let t0 = Instant::now();
        Self::insert_groups(&mut c, std::iter::once((1, s.w3_messages)));
        {
            let tx = c.transaction().expect("tx");
            {
                let mut st = tx
                    .prepare("INSERT INTO t_group_users VALUES (1, ?1, 0)")
                    .expect("prepare");
                for m in 1..=s.w3_members {
                    st.execute([m as i64]).expect("join");
                }
            }
            tx.commit().expect("commit");
        }
        c.execute_batch(INDEX).expect("index");
        let setup = secs(t0);
        // One writer: the ACKs in their global order, in transactions of
        // every ACK in flight at once.
        let (acks, model) = plan::w3_acks(s.seed, s.w3_members, s.w3_messages, s.w3_acks);
        note("sqlite w3");
        let mut lat = Lat::new();
        let t = Instant::now();
        for chunk in acks.chunks((s.connections * s.in_flight).max(1)) {
            let tq = Instant::now();
            let tx = c.transaction().expect("tx");
            {
                let mut st = tx
                    .prepare_cached("UPDATE t_group_users SET last_ack_msg_id = MAX(last_ack_msg_id, ?2) WHERE group_id = 1 AND user_id = ?1")
                    .expect("prepare");
                for &(m, to) in chunk {
                    st.execute(params![m as i64, to as i64]).expect("ack");
                }
            }
            tx.commit().expect("commit");
            lat.record_n(tq.elapsed(), chunk.len() as u64);
        }
        let secs = secs(t);
        let mut st = c
            .prepare("SELECT user_id, last_ack_msg_id FROM t_group_users WHERE group_id = 1")
            .expect("prepare");
        let rows: Vec<(i64, i64)> = st
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .expect("query")
            .map(|r| r.expect("row"))
            .collect();
        let bad = rows
            .iter()
            .filter(|&&(m, v)| model.get((m - 1) as usize) != Some(&(v as u64)))
            .count();
        Row {
            workload: "w3",
            system: "SQLite".into(),
            durability: Durability::Relaxed,
            setting: "WAL, synchronous=OFF".into(),
            unit: "acks",
            ops: s.w3_acks,
            secs,
            payload_bytes: 0,
            latency: Quantiles::of(&lat),
            setup_secs: setup,
            verified: bad == 0 && rows.len() as u64 == s.w3_members,
            verification: format!(
                "{} of {} cursors equal the model",
                rows.len() - bad,
                s.w3_members
            ),
            wire: false,
        }
    }

    pub fn w4(&self, s: &Scale) -> Row {
        let mut c = self.create("w4", false);
        let payloads = s.payloads();
        let p4 = s.w4_plan();
        let heads = p4.heads();
        note("sqlite w4 setup");
        let t0 = Instant::now();
        Self::insert_groups(&mut c, (1..=s.w4_groups).map(|g| (g, 0)));
        let items: Vec<(u64, u64)> = (0..s.w4_messages)
            .map(|i| (p4.message_group(i), i))
            .collect();
        Self::send_all(&mut c, &items, &payloads, 50_000, &mut Lat::new());
        drop(items);
        {
            let tx = c.transaction().expect("tx");
            {
                let mut st = tx
                    .prepare("INSERT INTO t_group_users VALUES (?1, ?2, ?3)")
                    .expect("prepare");
                for u in 1..=s.w4_users {
                    for (g, cur) in p4.user_groups(u, &heads) {
                        st.execute(params![g as i64, u as i64, cur as i64])
                            .expect("join");
                    }
                }
            }
            tx.commit().expect("commit");
        }
        c.execute_batch(INDEX).expect("index");
        c.execute_batch("ANALYZE").expect("analyze");
        let setup = secs(t0);
        let expect: Vec<(u64, u64)> = (0..s.w4_queries)
            .map(|i| {
                let gs = p4.user_groups(p4.query_user(i), &heads);
                (
                    gs.len() as u64,
                    gs.iter().map(|&(g, c)| heads[(g - 1) as usize] - c).sum(),
                )
            })
            .collect();
        note("sqlite w4");
        let threads = s.local_threads.max(1);
        let t = Instant::now();
        let res = parallel(threads, |k| {
            let c = self.open("w4", false);
            let mut st = c
                .prepare("SELECT gu.group_id, g.head - gu.last_ack_msg_id FROM t_group_users gu JOIN t_groups g ON g.group_id = gu.group_id WHERE gu.user_id = ?1")
                .expect("prepare");
            let mut lat = Lat::new();
            let mut bad = 0u64;
            for i in split(s.w4_queries, threads)[k].clone() {
                let tq = Instant::now();
                let u = p4.query_user(i);
                let (mut n, mut sum) = (0u64, 0u64);
                let mut rows = st.query([u as i64]).expect("query");
                while let Some(r) = rows.next().expect("row") {
                    let unread: i64 = r.get(1).expect("unread");
                    n += 1;
                    sum += unread as u64;
                }
                lat.record_n(tq.elapsed(), 1);
                if (n, sum) != expect[i as usize] {
                    bad += 1;
                }
            }
            (lat, bad)
        });
        let secs = secs(t);
        let (lat, bad) = merge_acks(res);
        Row {
            workload: "w4",
            system: "SQLite".into(),
            durability: Durability::Relaxed,
            setting: "WAL, synchronous=OFF".into(),
            unit: "queries",
            ops: s.w4_queries,
            secs,
            payload_bytes: 0,
            latency: Quantiles::of(&lat),
            setup_secs: setup,
            verified: bad == 0,
            verification: format!(
                "{} of {} answers match the model",
                s.w4_queries - bad,
                s.w4_queries
            ),
            wire: false,
        }
    }
}
