//! Test-only: a simulated network between in-process replicas. Every
//! message is delivered after a random delay (so messages are reordered),
//! may be dropped or duplicated, and is never delivered over a cut link or
//! to a node that is not attached (down). What it models: an unreliable
//! datagram network with partitions. What it leaves out: bandwidth, and
//! corruption (the TCP transport's CRC is the next step's).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::{Mailbox, Message, Transport};

/// A small deterministic generator (xorshift).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

struct State {
    mailboxes: HashMap<u64, Mailbox>,
    /// Messages in flight by (due time, sequence).
    queue: BTreeMap<(Instant, u64), Message>,
    /// Directed links that deliver nothing.
    cut: HashSet<(u64, u64)>,
    drop_percent: u64,
    dup_percent: u64,
    delay_max_ms: u64,
    rng: Rng,
    seq: u64,
    stop: bool,
}

/// The network (module docs).
pub struct Net {
    /// Snapshot streams delivered whole.
    pub snapshots: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    cv: Condvar,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Net {
    pub fn new(seed: u64) -> Arc<Net> {
        let net = Arc::new(Net {
            snapshots: std::sync::atomic::AtomicU64::new(0),
            state: Mutex::new(State {
                mailboxes: HashMap::new(),
                queue: BTreeMap::new(),
                cut: HashSet::new(),
                drop_percent: 0,
                dup_percent: 0,
                delay_max_ms: 0,
                rng: Rng(seed | 1),
                seq: 0,
                stop: false,
            }),
            cv: Condvar::new(),
            thread: Mutex::new(None),
        });
        let n = net.clone();
        let t = std::thread::spawn(move || n.deliver_loop());
        *net.thread.lock() = Some(t);
        net
    }

    /// Loss, duplication (percent of messages) and the largest delay.
    pub fn set_faults(&self, drop_percent: u64, dup_percent: u64, delay_max_ms: u64) {
        let mut s = self.state.lock();
        s.drop_percent = drop_percent;
        s.dup_percent = dup_percent;
        s.delay_max_ms = delay_max_ms;
    }

    pub fn attach(&self, id: u64, mailbox: Mailbox) {
        self.state.lock().mailboxes.insert(id, mailbox);
    }

    pub fn detach(&self, id: u64) {
        self.state.lock().mailboxes.remove(&id);
    }

    /// Cuts every link between `id` and the nodes in `others`, both ways.
    pub fn isolate(&self, id: u64, others: &[u64]) {
        let mut s = self.state.lock();
        for &o in others {
            if o != id {
                s.cut.insert((id, o));
                s.cut.insert((o, id));
            }
        }
    }

    pub fn heal(&self) {
        self.state.lock().cut.clear();
    }

    pub fn transport(self: &Arc<Self>, from: u64) -> SimTransport {
        SimTransport {
            from,
            net: self.clone(),
        }
    }

    fn push(&self, from: u64, msg: Message) {
        let mut s = self.state.lock();
        let lost = s.rng.below(100) < s.drop_percent;
        if s.stop || s.cut.contains(&(from, msg.to)) || lost {
            return;
        }
        let copies = if s.rng.below(100) < s.dup_percent {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let max = s.delay_max_ms + 1;
            let delay = Duration::from_millis(s.rng.below(max));
            s.seq += 1;
            let key = (Instant::now() + delay, s.seq);
            s.queue.insert(key, msg.clone());
        }
        drop(s);
        self.cv.notify_one();
    }

    fn deliver_loop(&self) {
        let mut s = self.state.lock();
        loop {
            if s.stop {
                return;
            }
            let now = Instant::now();
            match s.queue.keys().next().copied() {
                Some(key) if key.0 <= now => {
                    let Some(msg) = s.queue.remove(&key) else {
                        continue;
                    };
                    if s.cut.contains(&(msg.from, msg.to)) {
                        continue;
                    }
                    if let Some(mb) = s.mailboxes.get(&msg.to).cloned() {
                        mb.deliver(msg);
                    }
                }
                Some(key) => {
                    self.cv.wait_for(&mut s, key.0 - now);
                }
                None => {
                    self.cv.wait_for(&mut s, Duration::from_millis(50));
                }
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.state.lock().stop = true;
        self.cv.notify_all();
    }
}

/// Stops the delivery thread (the net's own `Arc` is held by it).
pub fn stop(net: &Arc<Net>) {
    net.state.lock().stop = true;
    net.cv.notify_all();
    if let Some(t) = net.thread.lock().take() {
        let _ = t.join();
    }
}

/// One replica's way into the network.
pub struct SimTransport {
    from: u64,
    net: Arc<Net>,
}

impl Transport for SimTransport {
    fn send(&self, msg: Message) {
        self.net.push(self.from, msg);
    }

    /// The simulated network routes by node id to whoever is attached:
    /// addresses mean nothing here.
    fn set_peers(&self, _peers: &[(u64, String)]) {}

    /// The stream encoded in memory and read into the receiver's directory
    /// by its mailbox, on a thread of its own, as over TCP; nothing goes
    /// over a cut link or to a node that is down.
    fn send_snapshot(
        &self,
        msg: Message,
        snapshot: Arc<tidemark_engine::Snapshot>,
        done: Box<dyn FnOnce(bool) + Send>,
    ) {
        let (from, net) = (self.from, self.net.clone());
        std::thread::spawn(move || {
            let mailbox = {
                let s = net.state.lock();
                if s.stop || s.cut.contains(&(from, msg.to)) {
                    None
                } else {
                    s.mailboxes.get(&msg.to).cloned()
                }
            };
            let mut stream = Vec::new();
            let sent = crate::snapshot::write_stream(&mut stream, &msg, &snapshot);
            drop(snapshot);
            let ok = match (sent, mailbox) {
                (Ok(_), Some(mb)) => {
                    let mut r = &stream[crate::snapshot::PREAMBLE.len()..];
                    mb.receive_snapshot(&mut r, from).is_ok()
                }
                _ => false,
            };
            net.snapshots
                .fetch_add(u64::from(ok), std::sync::atomic::Ordering::AcqRel);
            done(ok);
        });
    }
}
