//! Crash torture of the real node: senders, a puller that ACKs, and SIGKILL
//! at a random moment, round after round. After every restart:
//! - every send that got a response is stored exactly once, byte-exact;
//! - ids are dense in every group;
//! - no cursor is behind its last persisted value (the value a restart
//!   found, which recovery's checkpoint persisted) nor beyond the head;
//! - unread == head - cursor.
//!
//! `TIDEMARK_TORTURE_ROUNDS` sets the rounds (default 10; the long mode is
//! 200). Runs under `fsync=always` and `fsync=interval:20` (after a process
//! kill the page cache survives, so the interval allowance is zero here; the
//! power-loss allowance is tested in the engine's power-cut tests).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tidemark_client::{Client, ClientConfig};
use tidemark_protocol::JoinStart;

use crate::harness::Node;

/// `(group, msg_id, sender, client_msg_id)` of every answered send.
type Answered = Arc<Mutex<Vec<(u64, u64, u64, u64)>>>;

const GROUPS: u64 = 3;
const READER: u64 = 999;
const ACKER: u64 = 100;

fn payload(sender: u64, cmid: u64) -> Vec<u8> {
    format!("{sender}:{cmid}:")
        .repeat(1 + (cmid % 7) as usize)
        .into_bytes()
}

/// Every stored record of a group via HISTORY (moves no cursor).
fn stored(c: &mut Client, g: u64) -> Vec<(u64, u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut before = 0;
    loop {
        let (page, more) = c.history(g, READER, before, 500).unwrap();
        for m in &page {
            out.push((m.msg_id, m.sender_id, m.client_msg_id, m.payload.clone()));
        }
        match page.last() {
            Some(oldest) if more => before = oldest.msg_id,
            _ => break,
        }
    }
    out.reverse();
    out
}

fn torture(fsync: &str) {
    let rounds: u64 = std::env::var("TIDEMARK_TORTURE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let dir = tempfile::tempdir().unwrap();
    let mut node = Node::start(dir.path(), &["--fsync", fsync]);
    {
        let mut c = node.client();
        for g in 1..=GROUPS {
            c.create_group(g).unwrap();
            c.join(g, READER, JoinStart::Earliest).unwrap();
            c.join(g, ACKER, JoinStart::Earliest).unwrap();
        }
    }
    let answered: Answered = Arc::default();
    let mut persisted: HashMap<u64, u64> = HashMap::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ fsync.len() as u64;
    let (mut sends, mut cmid_base) = (0usize, 0u64);
    for round in 0..rounds {
        // Check everything the previous rounds were told.
        let mut c = node.client();
        let mut seen: HashMap<(u64, u64), (u64, u64, Vec<u8>)> = HashMap::new();
        for g in 1..=GROUPS {
            let records = stored(&mut c, g);
            let mut keys = HashSet::new();
            for (i, (id, s, cmid, p)) in records.iter().enumerate() {
                assert_eq!(*id, i as u64 + 1, "round {round}: ids dense in group {g}");
                assert!(
                    keys.insert((*s, *cmid)),
                    "round {round}: ({s}, {cmid}) stored twice in group {g}"
                );
                seen.insert((g, *id), (*s, *cmid, p.clone()));
            }
        }
        for &(g, id, s, cmid) in answered.lock().iter() {
            let got = seen
                .get(&(g, id))
                .unwrap_or_else(|| panic!("round {round}: answered send {g}/{id} lost"));
            assert_eq!(got, &(s, cmid, payload(s, cmid)), "round {round}: {g}/{id}");
        }
        for u in c.unread(ACKER).unwrap() {
            assert!(u.cursor <= u.head, "round {round}: cursor beyond head");
            assert_eq!(u.unread, u.head - u.cursor);
            let floor = persisted.get(&u.group).copied().unwrap_or(0);
            assert!(
                u.cursor >= floor,
                "round {round}: cursor {} behind persisted {floor}",
                u.cursor
            );
            persisted.insert(u.group, u.cursor);
        }
        sends = answered.lock().len();

        // Load, then SIGKILL at a random moment.
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for sender in 1..=2u64 {
            let (cfg, answered, stop) = (node.config(), answered.clone(), stop.clone());
            let base = cmid_base + sender * 1_000_000;
            threads.push(std::thread::spawn(move || {
                let Ok(mut c) = Client::connect(&cfg) else {
                    return;
                };
                for i in 0.. {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let (g, cmid) = (1 + i % GROUPS, base + i);
                    match c.send(g, sender, cmid, &payload(sender, cmid)) {
                        Ok(s) if !s.duplicate => answered.lock().push((g, s.msg_id, sender, cmid)),
                        Ok(_) => {}
                        Err(_) => return, // the node died
                    }
                }
            }));
        }
        let (cfg, stop2) = (ClientConfig::new(node.addr.clone()), stop.clone());
        threads.push(std::thread::spawn(move || {
            let Ok(mut c) = Client::connect(&cfg) else {
                return;
            };
            let mut acks: HashMap<u64, u64> = HashMap::new();
            while !stop2.load(Ordering::SeqCst) {
                for g in 1..=GROUPS {
                    let ack = acks.get(&g).copied().unwrap_or(0);
                    match c.pull(g, ACKER, ack, 50, 0) {
                        Ok(p) => {
                            if let Some(m) = p.messages.last() {
                                acks.insert(g, m.msg_id);
                            }
                        }
                        Err(_) => return,
                    }
                }
            }
        }));
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(30 + x % 250));
        node = node.restart_after_kill();
        stop.store(true, Ordering::SeqCst);
        for t in threads {
            t.join().unwrap();
        }
        cmid_base += 10_000_000;
    }
    println!("torture fsync={fsync}: {rounds} rounds, {sends} answered sends checked, losses 0, duplicates 0");
}

#[test]
fn sigkill_torture_under_fsync_always() {
    torture("always");
}

#[test]
fn sigkill_torture_under_fsync_interval() {
    torture("interval:20");
}
