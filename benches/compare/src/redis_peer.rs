//! Redis Streams, modelled as a competent Redis user would model the
//! workloads: one stream per group (`s:{g}`) with explicit dense ids
//! `0-{n}` assigned by a Lua script that also keeps every group's head in
//! the hash `heads`; cursors in one hash per group (`c:{g}`, field = user);
//! each user's groups in a set (`ug:{u}`); pipelining on every connection;
//! the unread query as a server-side Lua script (one round trip).
//! Durability: AOF with `appendfsync always` (fsync before the reply,
//! shared by every client served in one event-loop iteration) or
//! `everysec`.

use std::time::Instant;

use redis::{Connection, Value};
use tidemark_server::bench::plan;

use crate::common::*;

/// SEND: the next id of the group, the stream entry with that id, the head.
const SEND_LUA: &str = r#"
local n = redis.call('HINCRBY', KEYS[2], ARGV[4], 1)
redis.call('XADD', KEYS[1], '0-' .. n, 's', ARGV[1], 'c', ARGV[2], 'p', ARGV[3])
return n
"#;

/// UNREAD of a user: for each of its groups, head - cursor.
const UNREAD_LUA: &str = r#"
local gs = redis.call('SMEMBERS', KEYS[1])
local out = {}
for _, g in ipairs(gs) do
  local h = tonumber(redis.call('HGET', 'heads', g) or '0')
  local c = tonumber(redis.call('HGET', 'c:' .. g, ARGV[1]) or '0')
  out[#out + 1] = tonumber(g)
  out[#out + 1] = h - c
end
return out
"#;

/// UNREAD with cursors kept per user (`uc:{u}`: group -> cursor): two
/// commands per query whatever the number of groups.
const UNREAD_USER_HASH_LUA: &str = r#"
local kv = redis.call('HGETALL', KEYS[1])
if #kv == 0 then return {} end
local gs = {}
for i = 1, #kv, 2 do gs[#gs + 1] = kv[i] end
local hs = redis.call('HMGET', 'heads', unpack(gs))
local out = {}
for i = 1, #gs do
  out[#out + 1] = tonumber(gs[i])
  out[#out + 1] = tonumber(hs[i] or '0') - tonumber(kv[2 * i])
end
return out
"#;

pub struct Redis {
    url: String,
}

fn int(v: &Value) -> u64 {
    match v {
        Value::Int(i) => *i as u64,
        Value::BulkString(b) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

impl Redis {
    pub fn new(port: u16) -> Redis {
        Redis {
            url: format!("redis://127.0.0.1:{port}/"),
        }
    }

    fn conn(&self) -> Connection {
        redis::Client::open(self.url.as_str())
            .and_then(|c| c.get_connection())
            .expect("connect to redis")
    }

    fn reset(&self, always: bool) -> Connection {
        let mut c = self.conn();
        let _: () = redis::cmd("FLUSHALL").query(&mut c).expect("FLUSHALL");
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendfsync")
            .arg(if always { "always" } else { "everysec" })
            .query(&mut c)
            .expect("CONFIG SET appendfsync");
        // Start every workload from a compact AOF, so a rewrite triggered by
        // the previous workload's data does not run during this one.
        let _: Value = redis::cmd("BGREWRITEAOF")
            .query(&mut c)
            .unwrap_or(Value::Nil);
        wait_rewrite(&mut c);
        c
    }

    fn load(&self, c: &mut Connection, script: &str) -> String {
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(script)
            .query(c)
            .expect("SCRIPT LOAD")
    }

    fn setting(always: bool) -> (Durability, String) {
        if always {
            (Durability::Strict, "AOF appendfsync always".into())
        } else {
            (Durability::Relaxed, "AOF appendfsync everysec".into())
        }
    }

    /// Sends `items` (group, message index) with the SEND script,
    /// `depth` per pipeline; returns the ids.
    fn send_all(
        c: &mut Connection,
        sha: &str,
        items: impl Iterator<Item = (u64, u64)>,
        payloads: &[Vec<u8>],
        depth: usize,
        lat: &mut Lat,
    ) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let items: Vec<(u64, u64)> = items.collect();
        for chunk in items.chunks(depth.max(1)) {
            let mut p = redis::pipe();
            for &(g, i) in chunk {
                let (sender, cmid) = plan::sender_of(i);
                p.cmd("EVALSHA")
                    .arg(sha)
                    .arg(2)
                    .arg(format!("s:{g}"))
                    .arg("heads")
                    .arg(sender)
                    .arg(cmid)
                    .arg(&payloads[(i % payloads.len() as u64) as usize][..])
                    .arg(g);
            }
            let t = Instant::now();
            let r: Vec<Value> = p.query(c).expect("pipelined SEND");
            lat.record_n(t.elapsed(), chunk.len() as u64);
            for (&(g, _), v) in chunk.iter().zip(&r) {
                out.push((g, int(v)));
            }
        }
        out
    }

    pub fn w1(&self, s: &Scale, always: bool) -> Row {
        let mut c = self.reset(always);
        let sha = self.load(&mut c, SEND_LUA);
        let payloads = s.payloads();
        note(&format!("redis w1 (always={always})"));
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn();
            let mut lat = Lat::new();
            let r = split(s.w1_messages, s.connections)[k].clone();
            let ids = Self::send_all(
                &mut c,
                &sha,
                r.map(|i| (plan::w1_group(s.seed, s.w1_groups, i), i)),
                &payloads,
                s.in_flight,
                &mut lat,
            );
            (ids, lat)
        });
        let secs = secs(t);
        let (ids, lat) = merge_sends(res);
        let v = dense(s.w1_groups, &ids);
        let (durability, setting) = Self::setting(always);
        Row {
            workload: "w1",
            system: "Redis Streams".into(),
            durability,
            setting,
            unit: "msgs",
            ops: ids.len() as u64,
            secs,
            payload_bytes: ids.len() as u64 * s.size as u64,
            latency: Quantiles::of(&lat),
            setup_secs: 0.0,
            verified: v.is_ok() && ids.len() as u64 == s.w1_messages,
            verification: v.unwrap_or_else(|e| e),
            wire: true,
        }
    }

    pub fn w2(&self, s: &Scale) -> Row {
        let mut c = self.reset(false);
        let sha = self.load(&mut c, SEND_LUA);
        let payloads = s.payloads();
        note("redis w2 setup");
        let t0 = Instant::now();
        let mut lat = Lat::new();
        Self::send_all(
            &mut c,
            &sha,
            (0..s.w2_messages).map(|i| (1, i)),
            &payloads,
            1000,
            &mut lat,
        );
        let mut p = redis::pipe();
        for m in 1..=s.w2_members {
            p.cmd("HSET")
                .arg("c:1")
                .arg(m)
                .arg(plan::w2_cursor(s.seed, s.w2_messages, m))
                .ignore();
        }
        let _: () = p.query(&mut c).expect("HSET cursors");
        let setup = secs(t0);
        note("redis w2");
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn();
            let mut lat = Lat::new();
            let members: Vec<u64> = (1..=s.w2_members)
                .filter(|m| (m % s.connections as u64) as usize == k)
                .collect();
            let (mut delivered, mut bytes) = (0u64, 0u64);
            let mut fault = None;
            // (member, start cursor, last id received, stage): stage 0 =
            // reading, 1 = the final ACK goes out this round, 2 = finished.
            let mut active: Vec<(u64, u64, u64, u8)> = Vec::new();
            let mut next = 0;
            loop {
                while active.len() < s.in_flight && next < members.len() {
                    let m = members[next];
                    let cur = plan::w2_cursor(s.seed, s.w2_messages, m);
                    active.push((m, cur, cur, 0));
                    next += 1;
                }
                if active.is_empty() {
                    break;
                }
                let mut p = redis::pipe();
                for &(m, start, last, stage) in &active {
                    if last > start || stage == 1 {
                        // The request for the next page acknowledges the
                        // previous page; after the last page, a final ACK.
                        p.cmd("HSET").arg("c:1").arg(m).arg(last).ignore();
                    }
                    if stage == 0 {
                        p.cmd("XRANGE")
                            .arg("s:1")
                            .arg(format!("(0-{last}"))
                            .arg("+")
                            .arg("COUNT")
                            .arg(s.page);
                    }
                }
                let tq = Instant::now();
                let r: Vec<Value> = p.query(&mut c).expect("pipelined pull");
                lat.record_n(tq.elapsed(), active.len() as u64);
                let mut replies = r.into_iter();
                for a in active.iter_mut() {
                    if a.3 == 1 {
                        a.3 = 2;
                        continue;
                    }
                    let Some(Value::Array(entries)) = replies.next() else {
                        fault = Some("XRANGE answered no array".to_string());
                        a.3 = 2;
                        continue;
                    };
                    for e in &entries {
                        let Value::Array(parts) = e else { continue };
                        let id = match parts.first() {
                            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                                .ok()
                                .and_then(|s| s.strip_prefix("0-"))
                                .and_then(|s| s.parse::<u64>().ok())
                                .unwrap_or(0),
                            _ => 0,
                        };
                        if id != a.2 + 1 {
                            fault.get_or_insert(format!("member {}: id {id} after {}", a.0, a.2));
                        }
                        a.2 = id;
                        delivered += 1;
                        if let Some(Value::Array(f)) = parts.get(1) {
                            if let Some(Value::BulkString(pl)) = f.get(5) {
                                bytes += pl.len() as u64;
                            }
                        }
                    }
                    if (entries.len() as u32) < s.page || a.2 >= s.w2_messages {
                        a.3 = if a.2 > a.1 { 1 } else { 2 };
                    }
                }
                active.retain(|a| a.3 != 2);
            }
            (delivered, bytes, lat, fault)
        });
        let secs = secs(t);
        let (delivered, bytes, lat, fault) = merge_pulls(res);
        let expected = plan::w2_expected(s.seed, s.w2_messages, s.w2_members);
        let cursors: Vec<Value> = redis::cmd("HVALS")
            .arg("c:1")
            .query(&mut c)
            .unwrap_or_default();
        let at_head = cursors.iter().filter(|v| int(v) == s.w2_messages).count() as u64;
        Row {
            workload: "w2",
            system: "Redis Streams".into(),
            durability: Durability::Relaxed,
            setting: "AOF appendfsync everysec".into(),
            unit: "deliveries",
            ops: delivered,
            secs,
            payload_bytes: bytes,
            latency: Quantiles::of(&lat),
            setup_secs: setup,
            verified: fault.is_none() && delivered == expected && at_head == s.w2_members,
            verification: fault.unwrap_or_else(|| {
                format!(
                    "delivered {delivered} (expected {expected}); {at_head} cursors at the head"
                )
            }),
            wire: true,
        }
    }

    pub fn w3(&self, s: &Scale) -> Row {
        let mut c = self.reset(false);
        note("redis w3 setup");
        let t0 = Instant::now();
        for chunk in (1..=s.w3_members).collect::<Vec<_>>().chunks(10_000) {
            let mut p = redis::pipe();
            for &m in chunk {
                p.cmd("HSET").arg("c:1").arg(m).arg(0).ignore();
            }
            let _: () = p.query(&mut c).expect("HSET");
        }
        let setup = secs(t0);
        let (parts, model) = s.w3_split(s.connections);
        note("redis w3");
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn();
            let mut lat = Lat::new();
            for chunk in parts[k].chunks(s.in_flight.max(1)) {
                let mut p = redis::pipe();
                for &(m, to) in chunk {
                    p.cmd("HSET").arg("c:1").arg(m).arg(to).ignore();
                }
                let tq = Instant::now();
                let _: () = p.query(&mut c).expect("pipelined HSET");
                lat.record_n(tq.elapsed(), chunk.len() as u64);
            }
            lat
        });
        let secs = secs(t);
        let mut lat = Lat::new();
        for l in &res {
            lat.merge(l);
        }
        let all: Vec<(u64, u64)> = redis::cmd("HGETALL")
            .arg("c:1")
            .query(&mut c)
            .unwrap_or_default();
        let mismatches = all
            .iter()
            .filter(|&&(m, v)| model.get((m - 1) as usize) != Some(&v))
            .count();
        Row {
            workload: "w3",
            system: "Redis Streams".into(),
            durability: Durability::Relaxed,
            setting: "AOF appendfsync everysec".into(),
            unit: "acks",
            ops: s.w3_acks,
            secs,
            payload_bytes: 0,
            latency: Quantiles::of(&lat),
            setup_secs: setup,
            verified: mismatches == 0 && all.len() as u64 == s.w3_members,
            verification: format!(
                "{} of {} cursors equal the model (HSET is last-writer-wins: correct only because one member's ACKs travel in order on one connection)",
                all.len() - mismatches,
                s.w3_members
            ),
            wire: true,
        }
    }

    /// W4 with cursors in one hash per group and groups in a set per user
    /// (`per_user_hash = false`), or with cursors in one hash per user.
    pub fn w4(&self, s: &Scale, per_user_hash: bool) -> Row {
        let mut c = self.reset(false);
        let sha = self.load(&mut c, SEND_LUA);
        let unread = self.load(
            &mut c,
            if per_user_hash {
                UNREAD_USER_HASH_LUA
            } else {
                UNREAD_LUA
            },
        );
        let payloads = s.payloads();
        let p4 = s.w4_plan();
        let heads = p4.heads();
        note("redis w4 setup");
        let t0 = Instant::now();
        parallel(s.connections.min(4), |k| {
            let mut c = self.conn();
            let mut lat = Lat::new();
            let r = split(s.w4_messages, s.connections.min(4))[k].clone();
            Self::send_all(
                &mut c,
                &sha,
                r.map(|i| (p4.message_group(i), i)),
                &payloads,
                1000,
                &mut lat,
            );
        });
        parallel(s.connections.min(4), |k| {
            let mut c = self.conn();
            let users = split(s.w4_users, s.connections.min(4))[k].clone();
            let mut p = redis::pipe();
            let mut n = 0;
            for u in users {
                let u = u + 1;
                let gs = p4.user_groups(u, &heads);
                if per_user_hash {
                    let mut cmd = redis::cmd("HSET");
                    cmd.arg(format!("uc:{u}"));
                    for (g, cur) in gs {
                        cmd.arg(g).arg(cur);
                    }
                    p.add_command(cmd).ignore();
                } else {
                    p.cmd("SADD")
                        .arg(format!("ug:{u}"))
                        .arg(gs.iter().map(|g| g.0).collect::<Vec<_>>())
                        .ignore();
                    for (g, cur) in gs {
                        p.cmd("HSET").arg(format!("c:{g}")).arg(u).arg(cur).ignore();
                    }
                }
                n += 1;
                if n % 200 == 0 {
                    let _: () = p.query(&mut c).expect("memberships");
                    p = redis::pipe();
                }
            }
            let _: () = p.query(&mut c).expect("memberships");
        });
        let setup = secs(t0);
        note("redis w4");
        let expect: Vec<(u64, u64)> = (0..s.w4_queries)
            .map(|i| {
                let gs = p4.user_groups(p4.query_user(i), &heads);
                (
                    gs.len() as u64,
                    gs.iter().map(|&(g, c)| heads[(g - 1) as usize] - c).sum(),
                )
            })
            .collect();
        let t = Instant::now();
        let res = parallel(s.connections, |k| {
            let mut c = self.conn();
            let mut lat = Lat::new();
            let mut bad = 0u64;
            let qs: Vec<u64> = split(s.w4_queries, s.connections)[k].clone().collect();
            for chunk in qs.chunks(s.in_flight.max(1)) {
                let mut p = redis::pipe();
                for &i in chunk {
                    let u = p4.query_user(i);
                    let key = if per_user_hash {
                        format!("uc:{u}")
                    } else {
                        format!("ug:{u}")
                    };
                    p.cmd("EVALSHA").arg(&unread).arg(1).arg(key).arg(u);
                }
                let tq = Instant::now();
                let r: Vec<Vec<i64>> = p.query(&mut c).expect("pipelined unread");
                lat.record_n(tq.elapsed(), chunk.len() as u64);
                for (&i, v) in chunk.iter().zip(&r) {
                    let n = v.len() as u64 / 2;
                    let sum: i64 = v.iter().skip(1).step_by(2).sum();
                    if (n, sum as u64) != expect[i as usize] {
                        bad += 1;
                    }
                }
            }
            (lat, bad)
        });
        let secs = secs(t);
        let (lat, bad) = merge_acks(res);
        Row {
            workload: "w4",
            system: if per_user_hash {
                "Redis Streams (cursors per user)".into()
            } else {
                "Redis Streams".into()
            },
            durability: Durability::Relaxed,
            setting: "AOF appendfsync everysec".into(),
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

fn wait_rewrite(c: &mut Connection) {
    for _ in 0..600 {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query(c)
            .unwrap_or_default();
        if !info.contains("aof_rewrite_in_progress:1") && !info.contains("aof_rewrite_scheduled:1")
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
