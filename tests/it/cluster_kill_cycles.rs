//! A replica set's members never exit by themselves or crash-loop around
//! snapshot installs and leadership loss (format-spec/cluster.md sections
//! 5.1, 8.2-8.4), with three real `tidemark serve --cluster-*` processes
//! on loopback and a small Raft log bound (`--raft-log-max-bytes 32768`,
//! so that a member back from a kill is usually sent a snapshot, and
//! offered it again while it installs).
//!
//! `the_leader_killed_and_restarted_under_load_again_and_again_loses_nothing`:
//! client threads keep pipelined sends in flight (each retransmitted with
//! its `client_msg_id` until acknowledged) while, cycle after cycle, the
//! leader is SIGKILLed and restarted a moment later. Every cycle: no
//! other member's process ended (a member that loses leadership with a
//! round at its gate, or must install a snapshot, restarts itself in
//! place: same pid), and the restarted one starts (a crash loop fails its
//! start). At the end: every acknowledged send is stored once at its
//! acknowledged id, ids dense, and after a clean stop (every exit status
//! 0) `ctl dump` of the three engines is identical.
//! `TIDEMARK_KILL_CYCLES=N` cycles (default 12), `TIDEMARK_KILL_RESTART_MS`
//! the time a killed leader stays down (default 300 ms); RELIABILITY.md
//! has the figures of a long run.
//!
//! `a_follower_killed_at_each_step_of_its_install_starts_and_catches_up`:
//! a follower made to need a snapshot is SIGKILLed at each step of its
//! install in turn (while the stream is received, once it is received,
//! after the install's commit point, while the new run finishes the
//! swap: each kill lands at or just after its step, as the follower's log
//! and directory show it), restarted each time: it starts every time, and
//! at the end its engine matches the others'.
//!
//! `a_sigterm_during_a_restart_in_place_stops_the_member`: a follower
//! restarting itself to install a snapshot is sent SIGTERM while the old
//! run shuts down for the exec; it exits with status 0 within a bounded
//! wait (the signal is not lost across the exec).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidemark_client::{parse_sent, Client, ClientConfig, ClientError};
use tidemark_protocol::{ErrorCode, JoinStart, Request};

use crate::cluster_snapshot::{
    free_ports, leader, new_member, on_leader, raft_log_span, GROUP, IDS, WAIT,
};
use crate::harness::{replica_dump, ReplicaMember};

/// Sends each client keeps in flight.
const WINDOW: u64 = 8;
/// Client `t` sends as this plus `t`.
const SENDER_BASE: u64 = 500;

type Ports = HashMap<u64, (u16, u16)>;

fn client_to(ports: &Ports, id: u64) -> Option<Client> {
    let mut config = ClientConfig::new(format!("127.0.0.1:{}", ports[&id].0));
    config.io_timeout = Duration::from_secs(3);
    Client::connect(&config).ok()
}

/// One client thread: sends `cmid` 1, 2, ... as `sender`, `WINDOW` at a
/// time on one connection, to whichever member leads; a send not
/// acknowledged is sent again with its `client_msg_id`. Returns every
/// acknowledged `cmid` with its msg_id (a retransmit's acknowledgement
/// must name the same id).
fn client(
    ports: &Ports,
    sender: u64,
    stop: &AtomicBool,
    acked_total: &AtomicU64,
) -> HashMap<u64, u64> {
    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut next_cmid = 1;
    // Sent and not acknowledged yet, oldest first.
    let mut open: Vec<u64> = Vec::new();
    let mut target = IDS[0];
    while !stop.load(Ordering::Acquire) {
        let Some(mut c) = client_to(ports, target) else {
            target = IDS[(IDS.iter().position(|&i| i == target).unwrap_or(0) + 1) % IDS.len()];
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        while open.len() < WINDOW as usize {
            open.push(next_cmid);
            next_cmid += 1;
        }
        let payload = |cmid: u64| format!("{sender}/{cmid} {}", "x".repeat(300)).into_bytes();
        let mut ids = Vec::new();
        for &cmid in &open {
            let body = payload(cmid);
            match c.submit(&Request::Send {
                group: GROUP,
                sender,
                client_msg_id: cmid,
                payload: &body,
            }) {
                Ok(id) => ids.push((cmid, id)),
                Err(_) => break,
            }
        }
        let mut moved = false;
        for (cmid, id) in ids {
            let outcome = c
                .wait(id, Duration::from_secs(5))
                .and_then(|f| parse_sent(&f));
            match outcome {
                Ok(sent) => {
                    let before = acked.insert(cmid, sent.msg_id);
                    assert!(
                        before.is_none_or(|b| b == sent.msg_id),
                        "sender {sender} cmid {cmid} acknowledged as {before:?} and {}",
                        sent.msg_id
                    );
                    open.retain(|&o| o != cmid);
                    acked_total.fetch_add(1, Ordering::AcqRel);
                }
                Err(ClientError::Server {
                    code: ErrorCode::NotLeader,
                    detail: Some(l),
                    ..
                }) if IDS.contains(&l) && l != target => {
                    target = l;
                    moved = true;
                    break;
                }
                Err(_) => {
                    // Unknown outcome (a kill, a refused round, a follower
                    // not knowing the leader): sent again later.
                    target =
                        IDS[(IDS.iter().position(|&i| i == target).unwrap_or(0) + 1) % IDS.len()];
                    moved = true;
                    std::thread::sleep(Duration::from_millis(20));
                    break;
                }
            }
        }
        if !moved && open.is_empty() {
            continue;
        }
    }
    acked
}

/// Stops every member cleanly and returns its dump of `GROUP`, once the
/// three are identical; a member stopped behind (its dump a prefix of
/// another's: it had not applied everything committed yet) gets another
/// start and stop, up to 5 times.
fn stop_and_compare(members: &mut HashMap<u64, ReplicaMember>, ports: &Ports) -> String {
    for attempt in 1..=5 {
        // Followers learn the last commit index from the leader's next
        // heartbeats (every 20 ms) and apply it.
        std::thread::sleep(Duration::from_millis(1500));
        for m in members.values_mut() {
            m.terminate();
        }
        let dumps: Vec<(u64, String)> = IDS
            .iter()
            .map(|&id| {
                (
                    id,
                    replica_dump(&members[&id].dir, GROUP, &format!("node {id}")),
                )
            })
            .collect();
        let longest = dumps
            .iter()
            .map(|(_, d)| d.clone())
            .max_by_key(String::len)
            .expect("three dumps");
        let mut behind = false;
        for (id, d) in &dumps {
            if *d == longest {
                continue;
            }
            let diff = longest.lines().zip(d.lines()).find(|(x, y)| x != y);
            assert!(
                longest.starts_with(d.as_str()),
                "node {id}'s records differ: {} and {} lines, first difference {diff:?}",
                d.lines().count(),
                longest.lines().count()
            );
            behind = true;
        }
        if !behind {
            return longest;
        }
        eprintln!("stop {attempt}: a member stopped behind; starting them all again");
        for m in members.values_mut() {
            m.spawn();
        }
        leader(ports);
    }
    panic!("the members' logs did not converge after 5 stops");
}

#[test]
fn the_leader_killed_and_restarted_under_load_again_and_again_loses_nothing() {
    let cycles: usize = std::env::var("TIDEMARK_KILL_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12);
    let down = Duration::from_millis(
        std::env::var("TIDEMARK_KILL_RESTART_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300),
    );
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members: HashMap<u64, ReplicaMember> = IDS
        .iter()
        .map(|&id| (id, new_member(id, root.path(), &ports)))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    let senders: Vec<u64> = (0..3).map(|t| SENDER_BASE + t).collect();
    for &s in &senders {
        on_leader(&ports, |c| c.join(GROUP, s, JoinStart::Head));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked_total = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = senders
        .iter()
        .map(|&sender| {
            let (ports, stop, total) = (ports.clone(), stop.clone(), acked_total.clone());
            std::thread::spawn(move || (sender, client(&ports, sender, &stop, &total)))
        })
        .collect();
    let began = Instant::now();
    let mut snapshots_seen = 0;
    for cycle in 1..=cycles {
        // Load flows: a few rounds acknowledged since the last cycle.
        let from = acked_total.load(Ordering::Acquire);
        let deadline = Instant::now() + WAIT;
        while acked_total.load(Ordering::Acquire) < from + 3 * WINDOW {
            assert!(
                Instant::now() < deadline,
                "cycle {cycle}: no send acknowledged within {WAIT:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let lead = leader(&ports);
        members.get_mut(&lead).expect("member").kill();
        std::thread::sleep(down);
        // Starts (its listening line), or the test fails: no crash loop.
        members.get_mut(&lead).expect("member").spawn();
        for (id, m) in members.iter_mut() {
            if let Some(status) = m.ended() {
                panic!(
                    "cycle {cycle}: node {id} exited by itself with {status}; its log ends:\n{}",
                    tail(&m.log_text())
                );
            }
        }
    }
    stop.store(true, Ordering::Release);
    let mut acked: HashMap<(u64, u64), u64> = HashMap::new();
    for t in threads {
        let (sender, mine) = t.join().expect("client thread");
        acked.extend(mine.into_iter().map(|(cmid, id)| ((sender, cmid), id)));
    }
    let elapsed = began.elapsed();
    for (id, m) in members.iter_mut() {
        if let Some(status) = m.ended() {
            panic!("node {id} exited by itself with {status}");
        }
        snapshots_seen += m
            .log_text()
            .matches("to finish a snapshot's install")
            .count();
    }
    // Every acknowledged send once, at its id; ids dense.
    let records = on_leader(&ports, |c| {
        let mut out = Vec::new();
        let mut before = 0;
        loop {
            let (page, more) = c.history(GROUP, senders[0], before, 1000)?;
            before = page.last().map_or(0, |m| m.msg_id);
            out.extend(page);
            if !more || before <= 1 {
                break;
            }
        }
        out.reverse();
        Ok(out)
    });
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.msg_id, i as u64 + 1, "ids are dense");
    }
    let stored: HashMap<(u64, u64), u64> = records
        .iter()
        .map(|r| ((r.sender_id, r.client_msg_id), r.msg_id))
        .collect();
    assert_eq!(stored.len(), records.len(), "a client_msg_id stored twice");
    for (key, id) in &acked {
        assert_eq!(
            stored.get(key),
            Some(id),
            "acknowledged send {key:?} at {id}"
        );
    }
    let restarts: usize = members
        .values()
        .map(|m| m.log_text().matches("restarting in place").count())
        .sum();
    eprintln!(
        "kill cycles: {cycles} leader kills ({} ms down) in {:.1} s; {} sends acknowledged, \
         {} stored; {restarts} restarts in place ({snapshots_seen} to install a snapshot); \
         0 exits",
        down.as_millis(),
        elapsed.as_secs_f64(),
        acked.len(),
        records.len()
    );
    // Every replica holds them: the three engines are identical.
    let dump = stop_and_compare(&mut members, &ports);
    assert_eq!(
        dump.lines().count(),
        records.len(),
        "every record in the dumps"
    );
}

/// The last lines of a log, for a failure message.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Sends through the leader until its Raft log starts after `had`.
fn write_past(ports: &Ports, lead_dir: &Path, had: u64, cmid: &mut u64) {
    let deadline = Instant::now() + WAIT;
    while raft_log_span(lead_dir).0 <= had {
        assert!(
            Instant::now() < deadline,
            "the leader's Raft log was never compacted"
        );
        for _ in 0..10 {
            *cmid += 1;
            let payload = format!("m{cmid} {}", "x".repeat(200));
            let c = *cmid;
            on_leader(ports, |cl| {
                cl.send(GROUP, SENDER_BASE, c, payload.as_bytes())
            });
        }
    }
}

/// Waits until `ready` says the follower reached its kill point (polled
/// every millisecond); false if it never did within `WAIT`.
fn reached(ready: &mut dyn FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn a_follower_killed_at_each_step_of_its_install_starts_and_catches_up() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members: HashMap<u64, ReplicaMember> = IDS
        .iter()
        .map(|&id| (id, new_member(id, root.path(), &ports)))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    on_leader(&ports, |c| c.join(GROUP, SENDER_BASE, JoinStart::Head));
    let mut cmid = 0;
    let lead = leader(&ports);
    let down = *IDS.iter().find(|&&id| id != lead).expect("a follower");
    let steps: [(&str, &str); 4] = [
        ("receiving the stream", "snap-in/tmp-"),
        ("stream received", "bytes received and synced"),
        ("install committed", "is to be installed: the node restarts"),
        (
            "new run finishing the swap",
            "finishing the install of the snapshot",
        ),
    ];
    let mut hit = Vec::new();
    for (step, mark) in steps {
        let m = members.get_mut(&down).expect("member");
        m.kill();
        let (_, had) = raft_log_span(&m.dir);
        write_past(&ports, &members[&lead].dir, had, &mut cmid);
        let m = members.get_mut(&down).expect("member");
        let seen = m.log_text().matches(mark).count();
        m.spawn();
        let dir = m.dir.clone();
        let landed = reached(&mut || match mark.strip_prefix("snap-in/") {
            Some(prefix) => std::fs::read_dir(dir.join("snap-in")).is_ok_and(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
            }),
            None => m.log_text().matches(mark).count() > seen,
        });
        m.kill();
        hit.push((step, landed));
        // Starts again (a crash loop fails here) and catches up.
        m.spawn();
    }
    eprintln!("kill points reached (step, reached before the kill): {hit:?}");
    cmid += 1;
    let c = cmid;
    on_leader(&ports, |cl| cl.send(GROUP, SENDER_BASE, c, b"last"));
    let dump = stop_and_compare(&mut members, &ports);
    assert_eq!(
        dump.lines().count() as u64,
        cmid,
        "every send in every replica"
    );
}

#[test]
fn a_sigterm_during_a_restart_in_place_stops_the_member() {
    let root = tempfile::tempdir().expect("temp dir");
    let ports = free_ports();
    let mut members: HashMap<u64, ReplicaMember> = IDS
        .iter()
        .map(|&id| (id, new_member(id, root.path(), &ports)))
        .collect();
    on_leader(&ports, |c| c.create_group(GROUP));
    on_leader(&ports, |c| c.join(GROUP, SENDER_BASE, JoinStart::Head));
    let mut cmid = 0;
    let lead = leader(&ports);
    let down = *IDS.iter().find(|&&id| id != lead).expect("a follower");
    // The SIGTERM lands while the old run shuts down for the exec (the
    // replica stopped for the install), then right at the exec (the old
    // run's last line): the signal pending across it.
    for mark in [
        "is to be installed: the node restarts",
        "restarting in place",
    ] {
        members.get_mut(&down).expect("member").kill();
        let (_, had) = raft_log_span(&members[&down].dir);
        write_past(&ports, &members[&lead].dir, had, &mut cmid);
        // Back, it is sent a snapshot and restarts itself to install it.
        let m = members.get_mut(&down).expect("member");
        let seen = m.log_text().matches(mark).count();
        m.spawn();
        let deadline = Instant::now() + WAIT;
        while m.log_text().matches(mark).count() == seen {
            assert!(
                Instant::now() < deadline,
                "the follower never installed a snapshot"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        m.signal(libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(status) = m.ended() {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "the member ignored a SIGTERM during its restart in place ({mark:?}); its log \
                 ends:\n{}",
                tail(&m.log_text())
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "exit status {status} ({mark:?})");
        // Started again, it finishes the install and catches up.
        m.spawn();
    }
    // Where each signal was taken: by the old run (no exec) or the new one.
    for line in members[&down].log_text().lines() {
        if line.contains("signal 15") || line.contains("restarting") {
            eprintln!("node {down}: {line}");
        }
    }
    cmid += 1;
    let c = cmid;
    on_leader(&ports, |cl| cl.send(GROUP, SENDER_BASE, c, b"last"));
    let dump = stop_and_compare(&mut members, &ports);
    assert_eq!(
        dump.lines().count() as u64,
        cmid,
        "every send in every replica"
    );
}
