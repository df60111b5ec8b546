//! A fault-injecting TCP proxy for tests: clients connect to the proxy, the
//! proxy connects to the real node, and two threads per connection copy
//! bytes each way. Each connection draws a fault plan from a seeded PRNG
//! (seed and connection number), so a run's plans are reproducible even
//! though thread timing is not. Each fault is drawn independently:
//!
//! - cut: after a random number of bytes in one direction, both sockets are
//!   shut down, usually in the middle of a frame;
//! - stall: after a random number of bytes one direction stops for a while
//!   (long enough to trip client timeouts), then goes on;
//! - delay: every chunk waits a few milliseconds.
//!
//! A connection with none of them passes bytes untouched.
//!
//! Only std: threads, blocking sockets with short read timeouts so that
//! pumps notice `stop` and cuts.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often each fault happens, per connection (each independently), and
/// how strong it is.
#[derive(Clone, Copy, Debug)]
pub struct Faults {
    pub cut_percent: u64,
    /// A cut happens after this many bytes (inclusive range) in one direction.
    pub cut_after_bytes: (u64, u64),
    pub delay_percent: u64,
    /// Per-chunk delay, milliseconds.
    pub delay_ms: (u64, u64),
    pub stall_percent: u64,
    pub stall_after_bytes: (u64, u64),
    pub stall_ms: (u64, u64),
}

impl Faults {
    pub fn none() -> Faults {
        Faults {
            cut_percent: 0,
            cut_after_bytes: (0, 0),
            delay_percent: 0,
            delay_ms: (0, 0),
            stall_percent: 0,
            stall_after_bytes: (0, 0),
            stall_ms: (0, 0),
        }
    }
}

/// What the proxy did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyCounts {
    pub connections: u64,
    pub cuts: u64,
    pub stalls: u64,
    pub delayed_connections: u64,
    pub bytes: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    cuts: AtomicU64,
    stalls: AtomicU64,
    delayed: AtomicU64,
    bytes: AtomicU64,
}

struct Shared {
    upstream: String,
    seed: u64,
    stop: AtomicBool,
    faults: Mutex<Faults>,
    counters: Counters,
    /// Both sockets of every connection, to cut them all at the end.
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
    pumps: Mutex<Vec<JoinHandle<()>>>,
    /// Until then, nothing goes from the node to any client.
    stall_until: Mutex<Option<Instant>>,
}

pub struct Proxy {
    pub addr: String,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

/// splitmix64: a tiny seeded PRNG.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, (lo, hi): (u64, u64)) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }
    pub fn percent(&mut self, p: u64) -> bool {
        self.next_u64() % 100 < p
    }
}

/// One direction's faults.
#[derive(Clone, Copy, Debug, Default)]
struct Plan {
    /// Shut both sockets down after this many bytes.
    cut_after: Option<u64>,
    /// Stop for `.1` milliseconds once `.0` bytes have passed.
    stall: Option<(u64, u64)>,
    /// Wait this many milliseconds (range) before each chunk.
    delay_ms: Option<(u64, u64)>,
}

impl Proxy {
    pub fn start(upstream: &str, seed: u64, faults: Faults) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let shared = Arc::new(Shared {
            upstream: upstream.to_string(),
            seed,
            stop: AtomicBool::new(false),
            faults: Mutex::new(faults),
            counters: Counters::default(),
            open: Mutex::new(Vec::new()),
            pumps: Mutex::new(Vec::new()),
            stall_until: Mutex::new(None),
        });
        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(listener, s))
            .expect("spawn the proxy");
        Proxy {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    pub fn counts(&self) -> ProxyCounts {
        let c = &self.shared.counters;
        ProxyCounts {
            connections: c.connections.load(Ordering::Relaxed),
            cuts: c.cuts.load(Ordering::Relaxed),
            stalls: c.stalls.load(Ordering::Relaxed),
            delayed_connections: c.delayed.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
        }
    }

    /// Holds every byte from the node to the clients, on every connection
    /// (open now or opened meanwhile), for `d` from now.
    pub fn stall_responses(&self, d: Duration) {
        *self.shared.stall_until.lock().unwrap() = Some(Instant::now() + d);
    }

    /// Cuts every open connection now.
    pub fn cut_all(&self) {
        for (a, b) in self.shared.open.lock().unwrap().drain(..) {
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.cut_all();
        let pumps = std::mem::take(&mut *self.shared.pumps.lock().unwrap());
        for p in pumps {
            let _ = p.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(upstream) = TcpStream::connect(&shared.upstream) else {
            continue; // the client sees a close, as if the node were down
        };
        let n = shared.counters.connections.fetch_add(1, Ordering::Relaxed);
        let faults = *shared.faults.lock().unwrap();
        let mut rng = Rng::new(shared.seed ^ n.wrapping_mul(0x2545_f491_4f6c_dd1d));
        // Each fault independently, each in a random direction
        // (client -> node or node -> client).
        let mut up_plan = Plan::default();
        let mut down_plan = Plan::default();
        if rng.percent(faults.cut_percent) {
            let after = Some(rng.range(faults.cut_after_bytes));
            if rng.percent(50) {
                up_plan.cut_after = after;
            } else {
                down_plan.cut_after = after;
            }
        }
        if rng.percent(faults.stall_percent) {
            let stall = Some((
                rng.range(faults.stall_after_bytes),
                rng.range(faults.stall_ms),
            ));
            if rng.percent(50) {
                up_plan.stall = stall;
            } else {
                down_plan.stall = stall;
            }
        }
        if rng.percent(faults.delay_percent) {
            shared.counters.delayed.fetch_add(1, Ordering::Relaxed);
            up_plan.delay_ms = Some(faults.delay_ms);
            down_plan.delay_ms = Some(faults.delay_ms);
        }
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (Ok(c2), Ok(u2), Ok(c3), Ok(u3)) = (
            client.try_clone(),
            upstream.try_clone(),
            client.try_clone(),
            upstream.try_clone(),
        ) else {
            continue;
        };
        shared.open.lock().unwrap().push((c3, u3));
        let seed = rng.next_u64();
        let s1 = shared.clone();
        let s2 = shared.clone();
        let up = std::thread::spawn(move || pump(client, upstream, up_plan, false, seed, s1));
        let down = std::thread::spawn(move || pump(u2, c2, down_plan, true, seed ^ 1, s2));
        let mut pumps = shared.pumps.lock().unwrap();
        pumps.retain(|p| !p.is_finished());
        pumps.push(up);
        pumps.push(down);
    }
}

/// Copies `from` to `to` following `plan`; `down` is node -> client.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    plan: Plan,
    down: bool,
    seed: u64,
    shared: Arc<Shared>,
) {
    let mut rng = Rng::new(seed);
    let _ = from.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = vec![0u8; 16 * 1024];
    let mut forwarded = 0u64;
    let mut stalled = false;
    let cut = |from: &TcpStream, to: &TcpStream| {
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    };
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            cut(&from, &to);
            return;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => {
                // Half-close: pass the end of stream on.
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => {
                cut(&from, &to);
                return;
            }
        };
        let mut chunk = &buf[..n];
        if down {
            let until = *shared.stall_until.lock().unwrap();
            if let Some(until) = until {
                std::thread::sleep(until.saturating_duration_since(Instant::now()));
            }
        }
        if let Some(ms) = plan.delay_ms {
            std::thread::sleep(Duration::from_millis(rng.range(ms)));
        }
        if let Some((after, ms)) = plan.stall {
            if !stalled && forwarded + chunk.len() as u64 >= after {
                // Forward up to the stall point, stop, then go on.
                let keep = (after.saturating_sub(forwarded) as usize).min(chunk.len());
                if to.write_all(&chunk[..keep]).is_err() {
                    cut(&from, &to);
                    return;
                }
                forwarded += keep as u64;
                shared
                    .counters
                    .bytes
                    .fetch_add(keep as u64, Ordering::Relaxed);
                chunk = &chunk[keep..];
                stalled = true;
                shared.counters.stalls.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(ms));
            }
        }
        if let Some(after) = plan.cut_after {
            if forwarded + chunk.len() as u64 >= after {
                // Forward up to the cut point (mid-frame, as a rule), then
                // close both sides.
                let keep = (after.saturating_sub(forwarded) as usize).min(chunk.len());
                let _ = to.write_all(&chunk[..keep]);
                shared
                    .counters
                    .bytes
                    .fetch_add(keep as u64, Ordering::Relaxed);
                shared.counters.cuts.fetch_add(1, Ordering::Relaxed);
                cut(&from, &to);
                return;
            }
        }
        if to.write_all(chunk).is_err() {
            cut(&from, &to);
            return;
        }
        forwarded += chunk.len() as u64;
        shared
            .counters
            .bytes
            .fetch_add(chunk.len() as u64, Ordering::Relaxed);
    }
}
