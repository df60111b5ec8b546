//! PostgreSQL with the seeds' schema (as SQLite: `t_group_msgs`,
//! `t_group_users` with an index on `user_id`, `t_groups` for the per-group
//! id counter), over loopback TCP, one connection per client thread. The
//! `postgres` crate is synchronous: one statement in flight per
//! connection, so every operation is one round trip, made one statement
//! where a CTE allows (send = next id + insert; pull = ack of the previous
//! page + next page). Batched where a real gateway would batch: the ACK
//! storm's ACKs in flight on a connection go as one `UPDATE .. FROM
//! unnest(..)`. Cursor updates are monotonic (`GREATEST`). Setup uses COPY.
//! Durability per session: `synchronous_commit = on` (WAL flushed before
//! the commit returns; concurrent commits share flushes) or `off`.

use std::io::Write;
use std::time::Instant;

use postgres::{Client, NoTls};
use tidemark_server::bench::plan;

use crate::common::*;

pub struct Postgres {
    conninfo: String,
}

const SCHEMA: &str = "
DROP TABLE IF EXISTS t_groups, t_group_msgs, t_group_users;
CREATE TABLE t_groups(group_id BIGINT PRIMARY KEY, head BIGINT NOT NULL);
CREATE TABLE t_group_msgs(
    group_id BIGINT NOT NULL, msg_id BIGINT NOT NULL, sender_id BIGINT NOT NULL,
    time BIGINT NOT NULL, msg_detail BYTEA NOT NULL,
    PRIMARY KEY (group_id, msg_id));
CREATE TABLE t_group_users(
    group_id BIGINT NOT NULL, user_id BIGINT NOT NULL, last_ack_msg_id BIGINT NOT NULL,
    PRIMARY KEY (group_id, user_id));
";
const INDEX: &str = "CREATE INDEX t_group_users_user ON t_group_users(user_id); ANALYZE;";

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

impl Postgres {
    pub fn new(port: u16, user: &str) -> Postgres {
        Postgres {
            conninfo: format!("host=127.0.0.1 port={port} user={user} dbname=postgres"),
        }
    }

    fn conn(&self, sync: bool) -> Client {
        let mut c = Client::connect(&self.conninfo, NoTls).expect("connect to postgres");
        c.batch_execute(if sync {
            "SET synchronous_commit = on"
        } else {
            "SET synchronous_commit = off"
        })
        .expect("SET synchronous_commit");
        c
    }

    fn reset(&self) -> Client {
        let mut c = self.conn(false);
        c.batch_execute(SCHEMA).expect("schema");
        c.batch_execute("CHECKPOINT").expect("checkpoint");
        c
    }

    fn setting(sync: bool) -> (Durability, String) {
        if sync {
            (Durability::Strict, "synchronous_commit=on".into())
        } else {
            (Durability::Relaxed, "synchronous_commit=off".into())
        }
    }

    /// COPY rows given as tab-separated lines.
    fn copy(c: &mut Client, table: &str, mut lines: impl FnMut(&mut Vec<u8>) -> bool) {
        let mut w = c
            .copy_in(&format!("COPY {table} FROM STDIN"))
            .expect("COPY");
        let mut buf = Vec::with_capacity(1 << 20);
        loop {
            let more = lines(&mut buf);
            if buf.len() >= 1 << 20 || !more {
                w.write_all(&buf).expect("COPY data");
                buf.clear();
            }
            if !more {
                break;
            }
        }
        w.finish().expect("COPY finish");
    }

    /// Messages `(group, index)` with dense ids, via COPY, and the heads.
    fn store(c: &mut Client, groups: u64, items: &[(u64, u64)], payloads: &[Vec<u8>]) {
        let mut heads = vec![0u64; groups as usize];
        let hexes: Vec<String> = payloads.iter().map(|p| hex(p)).collect();
        let now = now_ms();
        let mut k = 0;
        Self::copy(c, "t_group_msgs", |buf| {
            if k == items.len() {
                return false;
            }
            let (g, i) = items[k];
            k += 1;
            let h = &mut heads[(g - 1) as usize];
            *h += 1;
            let (sender, _) = plan::sender_of(i);
            let _ = writeln!(
                buf,
                "{g}\t{h}\t{sender}\t{now}\t\\\\x{}",
                hexes[(i % hexes.len() as u64) as usize]
            );
            true
        });
        let mut g = 0;
        Self::copy(c, "t_groups", |buf| {
            if g == heads.len() {
                return false;
            }
            let _ = writeln!(buf, "{}\t{}", g + 1, heads[g]);
            g += 1;
            true
        });
    }

    pub fn w1(&self, s: &Scale, sync: bool) -> Row {
        let mut c = self.reset();
        let mut g = 0;
        Self::copy(&mut c, "t_groups", |buf| {
            if g == s.w1_groups {
                return false;
            }
            g += 1;
            let _ = writeln!(buf, "{g}\t0");
            true
        });
        c.batch_execute("ANALYZE").expect("analyze");
        let payloads = s.payloads();
        note(&format!("postgres w1 (sync={sync})"));
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn(sync);
            let st = c
                .prepare(
                    "WITH h AS (UPDATE t_groups SET head = head + 1 WHERE group_id = $1 RETURNING head)
                     INSERT INTO t_group_msgs SELECT $1, head, $2, $3, $4 FROM h RETURNING msg_id",
                )
                .expect("prepare");
            let mut lat = Lat::new();
            let mut ids = Vec::new();
            for i in split(s.w1_messages, s.connections)[k].clone() {
                let g = plan::w1_group(s.seed, s.w1_groups, i);
                let (sender, _) = plan::sender_of(i);
                let p = &payloads[(i % payloads.len() as u64) as usize][..];
                let tq = Instant::now();
                let row = c
                    .query_one(&st, &[&(g as i64), &(sender as i64), &now_ms(), &p])
                    .expect("send");
                lat.record_n(tq.elapsed(), 1);
                let id: i64 = row.get(0);
                ids.push((g, id as u64));
            }
            (ids, lat)
        });
        let secs = secs(t);
        let (ids, lat) = merge_sends(res);
        let v = dense(s.w1_groups, &ids);
        let (durability, setting) = Self::setting(sync);
        Row {
            workload: "w1",
            system: "PostgreSQL".into(),
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
            wire: true,
        }
    }

    pub fn w2(&self, s: &Scale) -> Row {
        let mut c = self.reset();
        let payloads = s.payloads();
        note("postgres w2 setup");
        let t0 = Instant::now();
        let items: Vec<(u64, u64)> = (0..s.w2_messages).map(|i| (1, i)).collect();
        Self::store(&mut c, 1, &items, &payloads);
        let mut m = 0;
        Self::copy(&mut c, "t_group_users", |buf| {
            if m == s.w2_members {
                return false;
            }
            m += 1;
            let _ = writeln!(buf, "1\t{m}\t{}", plan::w2_cursor(s.seed, s.w2_messages, m));
            true
        });
        c.batch_execute(INDEX).expect("index");
        let setup = secs(t0);
        note("postgres w2");
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn(false);
            let page = c
                .prepare(
                    "WITH a AS (UPDATE t_group_users SET last_ack_msg_id = GREATEST(last_ack_msg_id, $2::int8)
                                WHERE group_id = 1 AND user_id = $1::int8 AND $2::int8 > 0)
                     SELECT msg_id, sender_id, time, msg_detail FROM t_group_msgs
                     WHERE group_id = 1 AND msg_id > $3::int8 ORDER BY msg_id LIMIT $4::int8",
                )
                .expect("prepare");
            let ack = c
                .prepare("UPDATE t_group_users SET last_ack_msg_id = GREATEST(last_ack_msg_id, $2) WHERE group_id = 1 AND user_id = $1")
                .expect("prepare");
            let mut lat = Lat::new();
            let (mut delivered, mut bytes, mut fault) = (0u64, 0u64, None);
            let mut out: Vec<u8> = Vec::with_capacity(1 << 20);
            for m in (1..=s.w2_members).filter(|m| (m % s.connections as u64) as usize == k) {
                let start = plan::w2_cursor(s.seed, s.w2_messages, m);
                let mut last = start;
                loop {
                    let acked: i64 = if last > start { last as i64 } else { 0 };
                    let tq = Instant::now();
                    let rows = c
                        .query(
                            &page,
                            &[&(m as i64), &acked, &(last as i64), &(s.page as i64)],
                        )
                        .expect("page");
                    lat.record_n(tq.elapsed(), 1);
                    out.clear();
                    for r in &rows {
                        let id: i64 = r.get(0);
                        let detail: &[u8] = r.get(3);
                        if id as u64 != last + 1 {
                            fault.get_or_insert(format!("member {m}: id {id} after {last}"));
                        }
                        last = id as u64;
                        out.extend_from_slice(detail);
                        bytes += detail.len() as u64;
                    }
                    delivered += rows.len() as u64;
                    if (rows.len() as u32) < s.page || last >= s.w2_messages {
                        break;
                    }
                }
                if last > start {
                    let tq = Instant::now();
                    c.execute(&ack, &[&(m as i64), &(last as i64)])
                        .expect("final ack");
                    lat.record_n(tq.elapsed(), 1);
                }
            }
            (delivered, bytes, lat, fault)
        });
        let secs = secs(t);
        let (delivered, bytes, lat, fault) = merge_pulls(res);
        let expected = plan::w2_expected(s.seed, s.w2_messages, s.w2_members);
        let at_head: i64 = c
            .query_one(
                "SELECT count(*) FROM t_group_users WHERE group_id = 1 AND last_ack_msg_id = $1",
                &[&(s.w2_messages as i64)],
            )
            .expect("count")
            .get(0);
        Row {
            workload: "w2",
            system: "PostgreSQL".into(),
            durability: Durability::Relaxed,
            setting: "synchronous_commit=off".into(),
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
            wire: true,
        }
    }

    pub fn w3(&self, s: &Scale) -> Row {
        let mut c = self.reset();
        note("postgres w3 setup");
        let t0 = Instant::now();
        c.batch_execute(&format!(
            "INSERT INTO t_groups VALUES (1, {})",
            s.w3_messages
        ))
        .expect("group");
        let mut m = 0;
        Self::copy(&mut c, "t_group_users", |buf| {
            if m == s.w3_members {
                return false;
            }
            m += 1;
            let _ = writeln!(buf, "1\t{m}\t0");
            true
        });
        c.batch_execute(INDEX).expect("index");
        c.batch_execute("VACUUM ANALYZE t_group_users")
            .expect("vacuum");
        let setup = secs(t0);
        let (parts, model) = s.w3_split(s.connections);
        note("postgres w3");
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn(false);
            let st = c
                .prepare(
                    "UPDATE t_group_users u SET last_ack_msg_id = GREATEST(u.last_ack_msg_id, v.m)
                     FROM unnest($1::int8[], $2::int8[]) AS v(uid, m)
                     WHERE u.group_id = 1 AND u.user_id = v.uid",
                )
                .expect("prepare");
            let mut lat = Lat::new();
            for chunk in parts[k].chunks(s.in_flight.max(1)) {
                // Coalesce: one row per member (UPDATE .. FROM applies one
                // source row per target row), the highest ACK wins.
                let mut batch: Vec<(i64, i64)> = Vec::with_capacity(chunk.len());
                for &(m, to) in chunk {
                    match batch.iter_mut().find(|b| b.0 == m as i64) {
                        Some(b) => b.1 = b.1.max(to as i64),
                        None => batch.push((m as i64, to as i64)),
                    }
                }
                let (us, ms): (Vec<i64>, Vec<i64>) = batch.into_iter().unzip();
                let tq = Instant::now();
                c.execute(&st, &[&us, &ms]).expect("acks");
                lat.record_n(tq.elapsed(), chunk.len() as u64);
            }
            lat
        });
        let secs = secs(t);
        let mut lat = Lat::new();
        for l in &res {
            lat.merge(l);
        }
        let rows = c
            .query(
                "SELECT user_id, last_ack_msg_id FROM t_group_users WHERE group_id = 1",
                &[],
            )
            .expect("read back");
        let bad = rows
            .iter()
            .filter(|r| {
                let (m, v): (i64, i64) = (r.get(0), r.get(1));
                model.get((m - 1) as usize) != Some(&(v as u64))
            })
            .count();
        Row {
            workload: "w3",
            system: "PostgreSQL".into(),
            durability: Durability::Relaxed,
            setting: "synchronous_commit=off".into(),
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
            wire: true,
        }
    }

    pub fn w4(&self, s: &Scale) -> Row {
        let mut c = self.reset();
        let payloads = s.payloads();
        let p4 = s.w4_plan();
        let heads = p4.heads();
        note("postgres w4 setup");
        let t0 = Instant::now();
        let items: Vec<(u64, u64)> = (0..s.w4_messages)
            .map(|i| (p4.message_group(i), i))
            .collect();
        Self::store(&mut c, s.w4_groups, &items, &payloads);
        drop(items);
        let (mut u, mut pending): (u64, Vec<(u64, u64)>) = (0, Vec::new());
        Self::copy(&mut c, "t_group_users", |buf| {
            while pending.is_empty() {
                if u == s.w4_users {
                    return false;
                }
                u += 1;
                pending = p4.user_groups(u, &heads);
                pending.reverse();
            }
            if let Some((g, cur)) = pending.pop() {
                let _ = writeln!(buf, "{g}\t{u}\t{cur}");
            }
            true
        });
        c.batch_execute(INDEX).expect("index");
        c.batch_execute("VACUUM ANALYZE").expect("vacuum");
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
        note("postgres w4");
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn(false);
            let st = c
                .prepare(
                    "SELECT gu.group_id, g.head - gu.last_ack_msg_id FROM t_group_users gu
                     JOIN t_groups g ON g.group_id = gu.group_id WHERE gu.user_id = $1",
                )
                .expect("prepare");
            let mut lat = Lat::new();
            let mut bad = 0u64;
            for i in split(s.w4_queries, s.connections)[k].clone() {
                let u = p4.query_user(i);
                let tq = Instant::now();
                let rows = c.query(&st, &[&(u as i64)]).expect("unread");
                lat.record_n(tq.elapsed(), 1);
                let sum: i64 = rows.iter().map(|r| r.get::<_, i64>(1)).sum();
                if (rows.len() as u64, sum as u64) != expect[i as usize] {
                    bad += 1;
                }
            }
            (lat, bad)
        });
        let secs = secs(t);
        let (lat, bad) = merge_acks(res);
        Row {
            workload: "w4",
            system: "PostgreSQL".into(),
            durability: Durability::Relaxed,
            setting: "synchronous_commit=off".into(),
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
            wire: true,
        }
    }
}
