//! The node's event loop: one mio poll over the listener, the connections
//! and a waker. One thread runs it; the engine's commit thread is the other.
//!
//! Why one loop on a 2-core machine: the engine already owns a second core
//! for journal writes and fsyncs; every request here is a memory operation
//! (an append is queued, not written), so one loop saturates the network
//! long before it saturates its core, and it needs no locks of its own.
//!
//! The loop moves bytes and parked work; it never parses a frame nor knows
//! what an opcode means: each connection turns its next request into an
//! [`Action`] (`Connection::handle_next`), and every response carries its
//! request id and whether it is an error.
//!
//! The loop never waits for the disk. A durable send, a join are
//! [`Parked`] until their commit round settles, a PULL that found nothing
//! waits as a [`LongPoll`]; after every commit round the
//! commit thread's listener queues a notice and wakes the loop, which
//! answers what completed, pushes the new records to subscribers and
//! re-runs the long polls of the groups that grew. A request whose group's
//! files must be read first (its first use since the engine opened) gets
//! `NotReady` from the engine: it stays at the front of its connection's
//! input buffer, nothing behind it starts, and it runs again when the
//! engine's maintenance worker has read them (the worker calls the same
//! listener).
//!
//! On a replica set member, a read's answer (computed at once) waits for
//! its read ticket (format-spec/cluster.md section 5.2: the replica's
//! driver confirms a batch of tickets with one heartbeat round and wakes
//! the loop), then, if it shows cursors, for the Cursors round in flight
//! (section 5), as a parked write does: `reads` by ticket, then `pending`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashSet};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use parking_lot::Mutex;
use tidemark_engine::{raise_open_file_limit, CommitNotice, Engine, ReadBatch};

use crate::backup;
use crate::config::{
    LiveLimits, NodeConfig, FRAMES_PER_PASS_MAX, INPUT_BYTES_FREE, READ_BYTES_PER_PASS_MAX,
};
use crate::conn_id::ConnId;
use crate::connection::{Barrier, Connection, Next};
use crate::handlers::{self, Action, Ctx, LongPoll, Parked, Report};
use crate::host::HostFigures;
use crate::log_limit::{EventKind, LogLimiter};
use crate::long_poll::{LongPolls, PollKey};
use crate::metrics::{MetricsServer, Published, Scrape};
use crate::outgoing::{self, Outgoing};
use crate::receipts::Receipts;
use crate::slowlog::{SlowLog, Summary};
use crate::stats::{Buffers, Sources, Stats};
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{ErrorCode, Opcode};

const LISTENER: Token = Token(0);
const WAKER: Token = Token(1);
const FIRST_CONNECTION: usize = 2;
/// How long a graceful shutdown waits for in-flight work and output.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);
/// At most one warning per this long about connections refused for want of
/// descriptors (with the count since the last one).
const FD_WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A connection and its socket, with the interest it is registered for.
struct Slot {
    conn: Connection,
    stream: TcpStream,
    interest: Option<Interest>,
    /// Distinguishes this connection from earlier ones in the same slot.
    generation: u64,
    /// This connection's parked long polls, dropped when it closes.
    polls: HashSet<PollKey>,
    /// In `EventLoop::ready`: it has work left from its last turn.
    ready: bool,
    /// Has an entry in `EventLoop::frame_timers`.
    frame_timer_armed: bool,
    /// This connection's queued output as counted in `EventLoop::out_total`.
    out_counted: usize,
    /// This connection's queued output as `EventLoop::out_by_size` holds it
    /// (0: no entry); brought up to `out_counted` before output is shed.
    out_indexed: usize,
    /// On `EventLoop::out_unindexed`: `out_indexed` may differ from
    /// `out_counted`.
    out_index_stale: bool,
    /// This connection's input memory as counted in `EventLoop::in_total`.
    in_counted: usize,
    /// The client's address (event lines, the slow log).
    peer: SocketAddr,
}

/// A request answered later ([`Parked`] or [`LongPoll`]) with what is
/// needed to answer it. `op` only labels its latency figure.
struct Waiting<W> {
    conn: ConnId,
    request_id: u64,
    op: Option<Opcode>,
    /// What the request asked, for the slow log.
    args: Summary,
    started: Instant,
    work: W,
}

/// A CLUSTER_CHANGE and how it ended, queued by the leadership's callback.
type AnsweredChange = (Waiting<()>, crate::config::ChangeOutcome);

/// Handle on a running node from another thread (the signal thread,
/// tests): stop it, or hand it new live limits.
#[derive(Clone)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    waker: Arc<Waker>,
    live: Arc<Mutex<Option<LiveLimits>>>,
}

impl Shutdown {
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
    }

    /// New live limits ([`LiveLimits`]: which, and what a change does to
    /// work under way): the loop takes them at the start of its next pass,
    /// before it handles any event of that pass. A second call before then
    /// replaces the first.
    pub fn apply_live(&self, limits: LiveLimits) {
        *self.live.lock() = Some(limits);
        // A failed wake means the loop is gone; nothing to do.
        let _ = self.waker.wake();
    }
}

pub struct EventLoop {
    engine: Arc<Engine>,
    config: NodeConfig,
    poll: Poll,
    listener: Option<TcpListener>,
    waker: Arc<Waker>,
    shutdown: Arc<AtomicBool>,
    /// Live limits handed over by a [`Shutdown`] handle, not yet applied.
    live: Arc<Mutex<Option<LiveLimits>>>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    connections: usize,
    next_generation: u64,
    notices: Arc<Mutex<Vec<CommitNotice>>>,
    /// Parked sends and operations by the commit round they wait for.
    pending: BTreeMap<u64, Vec<Waiting<Parked>>>,
    /// A replica set member's reads by the read ticket they wait for
    /// (format-spec/cluster.md section 5.2), and whether the replica said
    /// tickets settled since the loop last looked.
    reads: BTreeMap<u64, Vec<Waiting<Parked>>>,
    reads_settled: Arc<AtomicBool>,
    /// Parked long polls, by group and by deadline.
    polls: LongPolls<Waiting<LongPoll>>,
    /// Connections whose front request waits for the engine's maintenance
    /// worker, by the ticket it waits for.
    loads: BTreeMap<u64, Vec<ConnId>>,
    /// Connections with new output from deferred work, driven at the end of
    /// the loop iteration (never from inside another connection's handling).
    dirty: Vec<usize>,
    /// Connections that used their whole turn (FRAMES_PER_PASS_MAX frames
    /// or READ_BYTES_PER_PASS_MAX bytes) and may have more to do without a
    /// new readiness event (mio is edge-triggered): served again next pass.
    ready: Vec<usize>,
    /// When a partial frame of a connection may time out, earliest first
    /// (at most one entry per connection, see `Slot::frame_timer_armed`).
    frame_timers: BinaryHeap<Reverse<(Instant, ConnId)>>,
    /// Output queued by all connections (sum of `Slot::out_counted`).
    out_total: usize,
    /// `(queued output, slot index)` of every connection with output
    /// queued: the largest is the first closed when `out_total` passes
    /// `output_bytes_total_max`. Brought up to date (from
    /// `out_unindexed`) where output may be shed, after a connection's turn
    /// and once per loop pass, not with every response queued or written:
    /// a response costs an addition, a turn at most one update of this
    /// set.
    out_by_size: BTreeSet<(usize, usize)>,
    /// Slots whose `out_indexed` may differ from `out_counted` (each at
    /// most once while `Slot::out_index_stale`; a slot closed and reused
    /// meanwhile may appear twice, which indexing tolerates).
    out_unindexed: Vec<usize>,
    /// Input memory of all connections (sum of `Slot::in_counted`).
    in_total: usize,
    subs: Subscriptions<ConnId>,
    /// Receipt subscriptions and the cursors moved since the last flush.
    receipts: Receipts<ConnId>,
    stats: Stats,
    /// A descriptor held in reserve: when accept fails for want of
    /// descriptors (EMFILE, ENFILE), it is closed so that the waiting
    /// connection can be accepted and told OVERLOADED, then taken again.
    spare_fd: Option<std::fs::File>,
    /// Accepting stopped for want of descriptors with no spare to use: tried
    /// again when a connection closes (the listener is edge-triggered).
    accept_blocked: bool,
    /// Connections refused for want of descriptors not yet logged, and when
    /// the last warning was logged.
    fd_refusals_unlogged: u64,
    fd_warned_at: Option<Instant>,
    /// The last slow requests (SLOWLOG).
    slowlog: SlowLog,
    /// Keeps event lines (accepts, closes, authentication failures,
    /// protocol errors) from flooding the log.
    log_limit: LogLimiter,
    /// Disk and memory figures, measured by the host refresher.
    host: Arc<HostFigures>,
    /// Where a metrics scrape asks for a report and gets it.
    published: Arc<Published>,
    /// INFO's items, fixed at start.
    info: Vec<(String, String)>,
    /// When the node started serving (uptime), also as Unix ms.
    started: Instant,
    started_unix_ms: u64,
    /// BACKUPs under way (at most `backup::BACKUPS_MAX`): their frames
    /// move to their connections as those drain (`pump_backups`).
    backups: Vec<backup::Stream>,
    /// Membership changes answered by the replica set's leadership (from
    /// its thread), to be sent on the loop (`answer_changes`).
    changes: Arc<Mutex<Vec<AnsweredChange>>>,
}

/// Wall-clock ms since the Unix epoch (0 if the clock is before it): the
/// times STATS reports (`server.started_unix_ms`, `backup.last_*`).
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Holds one descriptor number for `EventLoop::spare_fd`.
fn open_spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// Whether an accept failed for want of descriptors (per process or per
/// system).
fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

impl EventLoop {
    /// Hooks the loop to the engine's commit rounds, over a listener bound
    /// already: [`serve`] binds before it opens the engine, so that a taken
    /// address is reported at once instead of after recovery and a
    /// checkpoint.
    pub fn with_listener(
        engine: Arc<Engine>,
        config: NodeConfig,
        mut listener: TcpListener,
        host: Arc<HostFigures>,
    ) -> io::Result<EventLoop> {
        let poll = Poll::new()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
        let notices: Arc<Mutex<Vec<CommitNotice>>> = Arc::default();
        let (n, w) = (notices.clone(), waker.clone());
        engine.add_commit_listener(Arc::new(move |notice: &CommitNotice| {
            n.lock().push(notice.clone());
            // A failed wake means the loop is gone; nothing to do.
            let _ = w.wake();
        }));
        let reads_settled = Arc::new(AtomicBool::new(false));
        if let Some(gate) = &config.leadership {
            let (r, w) = (reads_settled.clone(), waker.clone());
            gate.0.on_reads(Arc::new(move || {
                r.store(true, Ordering::Release);
                // A failed wake means the loop is gone; nothing to do.
                let _ = w.wake();
            }));
        }
        let receipts = Receipts::new(
            Duration::from_millis(config.limits.receipt_interval_ms),
            config.limits.receipt_members_max,
            config.limits.frame_bytes_max,
        );
        Ok(EventLoop {
            receipts,
            engine,
            poll,
            listener: Some(listener),
            waker,
            shutdown: Arc::new(AtomicBool::new(false)),
            live: Arc::default(),
            slots: Vec::new(),
            free: Vec::new(),
            connections: 0,
            next_generation: 0,
            notices,
            pending: BTreeMap::new(),
            reads: BTreeMap::new(),
            reads_settled,
            polls: LongPolls::default(),
            loads: BTreeMap::new(),
            dirty: Vec::new(),
            ready: Vec::new(),
            frame_timers: BinaryHeap::new(),
            out_total: 0,
            out_by_size: BTreeSet::new(),
            out_unindexed: Vec::new(),
            in_total: 0,
            subs: Subscriptions::default(),
            stats: Stats::default(),
            spare_fd: open_spare_fd(),
            accept_blocked: false,
            fd_refusals_unlogged: 0,
            fd_warned_at: None,
            slowlog: SlowLog::new(
                config.limits.slowlog_threshold_us,
                config.limits.slowlog_entries_max,
            ),
            log_limit: LogLimiter::new(Instant::now()),
            host,
            published: Arc::default(),
            info: Vec::new(),
            started: Instant::now(),
            started_unix_ms: unix_ms_now(),
            config,
            backups: Vec::new(),
            changes: Arc::default(),
        })
    }

    /// INFO's items, once the addresses are bound.
    fn set_info(&mut self, listen: SocketAddr, metrics: Option<SocketAddr>) {
        self.info = crate::stats::info_items(&self.config, listen, metrics);
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.listener {
            Some(l) => l.local_addr(),
            None => Err(io::ErrorKind::NotConnected.into()),
        }
    }

    pub fn shutdown_handle(&self) -> Shutdown {
        Shutdown {
            flag: self.shutdown.clone(),
            waker: self.waker.clone(),
            live: self.live.clone(),
        }
    }

    /// Runs until a shutdown is requested and the in-flight work drained.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut drain_deadline: Option<Instant> = None;
        loop {
            // Connections with work left from the last pass: look for new
            // events without waiting, then give them their next turn.
            let timeout = if self.ready.is_empty() && self.dirty.is_empty() {
                self.next_timeout(drain_deadline)
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            // New live limits first: whatever this pass handles sees them.
            let live = self.live.lock().take();
            if let Some(limits) = live {
                self.apply_live(limits);
            }
            let again = std::mem::take(&mut self.ready);
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(t) => self.drive(t - FIRST_CONNECTION),
                }
            }
            // Each connection gets at most one turn per pass from this list
            // (and one per event and per dirty mark): a connection with a
            // deep input never holds the loop for more than its turn.
            for index in again {
                if let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) {
                    if slot.ready {
                        slot.ready = false;
                        self.drive(index);
                    }
                }
            }
            // Commit notices, timers and shutdown are checked on every
            // wake-up, whatever woke the loop.
            self.on_commits();
            self.complete_reads();
            self.pump_backups();
            self.answer_changes();
            let now = Instant::now();
            self.expire_polls(now);
            self.expire_frames(now);
            for (kind, n) in self.log_limit.flush(now) {
                log::warn!("{n} similar events suppressed: {}", kind.name());
            }
            if self.published.take_wanted() {
                self.published.publish(Scrape {
                    figures: self.figures(),
                    durations: self.stats.durations(),
                });
            }
            self.flush_receipts(now);
            self.shed_output();
            // Marks made while these are driven wait for the next pass.
            let mut dirty = std::mem::take(&mut self.dirty);
            dirty.sort_unstable();
            dirty.dedup();
            for index in dirty {
                self.drive(index);
            }
            if self.accept_blocked && self.spare_fd.is_some() {
                self.accept_blocked = false;
                self.accept();
            }
            if self.shutdown.load(Ordering::SeqCst) {
                if drain_deadline.is_none() {
                    log::info!(
                        "shutdown requested: draining {} connections",
                        self.connections
                    );
                    drain_deadline = Some(Instant::now() + SHUTDOWN_DRAIN);
                    self.begin_shutdown();
                }
                let drained = self.pending.is_empty()
                    && self.slots.iter().flatten().all(|s| !s.conn.wants_write());
                if drained || drain_deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(());
                }
            }
        }
    }

    /// Takes new live limits (SIGHUP). Everything that reads them reads
    /// `config.limits` at its next use, but the slow log, which holds its
    /// own copy; what is buffered over a lowered budget is dealt with by
    /// the checks of this pass (`shed_output`, the read and input checks).
    fn apply_live(&mut self, limits: LiveLimits) {
        limits.apply_to(&mut self.config.limits);
        self.slowlog
            .set_limits(limits.slowlog_threshold_us, limits.slowlog_entries_max);
    }

    fn next_timeout(&mut self, drain_deadline: Option<Instant>) -> Option<Duration> {
        let frames = self.frame_timers.peek().map(|Reverse((at, _))| *at);
        let next = self
            .polls
            .next_deadline()
            .into_iter()
            .chain(frames)
            .chain(self.receipts.deadline())
            .chain(self.backups.iter().map(backup::Stream::deadline))
            .chain(drain_deadline)
            .chain(self.log_limit.next_flush())
            .min()?;
        Some(next.saturating_duration_since(Instant::now()))
    }

    /// Stops accepting, answers waiting long polls at once, and closes idle
    /// connections; requests in flight are still answered.
    fn begin_shutdown(&mut self) {
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        self.expire_polls(Instant::now() + Duration::from_secs(3600 * 24 * 365));
        // Backups under way end: their threads stop at their next frame
        // and their snapshots' holds end (the client sees no BACKUP end).
        self.backups.clear();
        for i in 0..self.slots.len() {
            if let Some(slot) = self.slots[i].as_mut() {
                slot.conn.begin_close();
            }
            self.update(i);
        }
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let (mut stream, peer) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if out_of_descriptors(&e) => {
                    // The classic way out: give back the spare descriptor,
                    // accept the waiting connection on it, refuse it, and
                    // take the spare again. Without a spare, wait for a
                    // connection to close (no retry loop, no log flood).
                    let Some(spare) = self.spare_fd.take() else {
                        self.accept_blocked = true;
                        self.warn_out_of_descriptors(&e);
                        return;
                    };
                    drop(spare);
                    let accepted = listener.accept();
                    match accepted {
                        Ok((mut stream, _)) => {
                            self.refuse_connection(&mut stream, "out of file descriptors");
                            // Closed before the spare is taken again: the
                            // spare gets its number back.
                            drop(stream);
                            self.spare_fd = open_spare_fd();
                            self.fd_refusals_unlogged += 1;
                            self.warn_out_of_descriptors(&e);
                        }
                        Err(e2) if e2.kind() == io::ErrorKind::WouldBlock => {
                            self.spare_fd = open_spare_fd();
                            return;
                        }
                        Err(_) => {
                            self.spare_fd = open_spare_fd();
                            self.accept_blocked = true;
                            self.warn_out_of_descriptors(&e);
                            return;
                        }
                    }
                    continue;
                }
                Err(e) => {
                    log::warn!("accept: {e}");
                    return;
                }
            };
            if self.connections >= self.config.limits.connections_max {
                self.refuse_connection(&mut stream, "too many connections");
                continue;
            }
            let _ = stream.set_nodelay(true);
            let index = self.free.pop().unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
            self.next_generation += 1;
            let mut slot = Slot {
                conn: Connection::new(self.config.limits.frame_bytes_max),
                stream,
                interest: Some(Interest::READABLE),
                generation: self.next_generation,
                polls: HashSet::new(),
                ready: false,
                frame_timer_armed: false,
                out_counted: 0,
                out_indexed: 0,
                out_index_stale: false,
                in_counted: 0,
                peer,
            };
            if let Err(e) = self.poll.registry().register(
                &mut slot.stream,
                Token(index + FIRST_CONNECTION),
                Interest::READABLE,
            ) {
                log::warn!("register {peer}: {e}");
                self.free.push(index);
                continue;
            }
            self.slots[index] = Some(slot);
            self.connections += 1;
            self.stats.connections_accepted += 1;
            if self.log_limit.allow(EventKind::Accept, Instant::now()) {
                log::info!(
                    "connection from {peer} accepted ({} open)",
                    self.connections
                );
            }
        }
    }

    /// Writes the documented refusal (ERROR OVERLOADED, request id 0,
    /// detail = connections_max) with one non-blocking write; the stream is
    /// closed when the caller drops it.
    fn refuse_connection(&mut self, stream: &mut TcpStream, message: &str) {
        self.stats.connections_refused += 1;
        let out = outgoing::error(
            0,
            ErrorCode::Overloaded,
            Some(self.config.limits.connections_max as u64),
            message,
        );
        // Best effort: a refused client gets the reason if its socket takes it.
        let _ = io::Write::write(stream, &out.head);
    }

    /// One warning per FD_WARNING_INTERVAL at most.
    fn warn_out_of_descriptors(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .fd_warned_at
            .is_some_and(|at| now < at + FD_WARNING_INTERVAL)
        {
            return;
        }
        self.fd_warned_at = Some(now);
        log::warn!(
            "accept: {e}: {} connections refused with OVERLOADED since the last warning \
             (connections open: {}; raise RLIMIT_NOFILE or lower --connections-max / \
             --open-segments-max)",
            std::mem::take(&mut self.fd_refusals_unlogged),
            self.connections
        );
    }

    fn conn_id(&self, index: usize) -> Option<ConnId> {
        self.slots.get(index)?.as_ref().map(|s| ConnId {
            index,
            generation: s.generation,
        })
    }

    fn slot_mut(&mut self, id: ConnId) -> Option<&mut Slot> {
        slot_of(&mut self.slots, id)
    }

    /// One turn of a connection: reads, handles and writes until it has
    /// nothing more to do now or has used its turn (FRAMES_PER_PASS_MAX
    /// frames, READ_BYTES_PER_PASS_MAX bytes read), then updates its
    /// registration. A connection that used its turn is queued for another
    /// one next pass, after the other connections had theirs.
    fn drive(&mut self, index: usize) {
        let limits = self.config.limits;
        let mut frames_left = FRAMES_PER_PASS_MAX;
        let mut read_left = READ_BYTES_PER_PASS_MAX;
        let mut handled = 0;
        loop {
            let mut progress = false;
            // Read what the socket has, as far as the decoder, the output
            // and this turn allow.
            loop {
                let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
                    return;
                };
                if read_left == 0 || !slot.conn.wants_read(limits.output_bytes_max) {
                    break;
                }
                // The connection marks itself closed on Ok(0) and on errors.
                match slot.conn.read_from(&mut slot.stream) {
                    Ok(0) => break,
                    Ok(n) => {
                        self.stats.bytes_in += n as u64;
                        read_left = read_left.saturating_sub(n);
                        progress = true;
                        // The node-wide input budget, checked as soon as a
                        // frame's length prefix says what it will need.
                        self.charge_input(index);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let n = self.handle_frames(index, &mut frames_left);
            if n > 0 {
                handled += n;
                progress = true;
                // The frame now at the front may be a big one.
                self.charge_input(index);
            }
            let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
                return;
            };
            // On an error the connection drops its output and ends.
            if let Ok(n) = slot.conn.write_to(&mut slot.stream) {
                if n > 0 {
                    self.stats.bytes_out += n as u64;
                    progress = true;
                }
            }
            // Written bytes leave the node's total before more requests of
            // this turn are handled (STATS reports it).
            self.account(index);
            if !progress || frames_left == 0 || read_left == 0 {
                break;
            }
        }
        let turn_used = frames_left == 0 || read_left == 0;
        self.after_turn(index, handled > 0, turn_used);
        self.charge_input(index);
        self.account(index);
        self.update(index);
        self.shed_output();
    }

    /// Counts what this connection's input needs now against the node's
    /// `input_bytes_total_max`: a connection may grow to INPUT_BYTES_FREE
    /// whatever the total; beyond, only within the budget, else its frame is
    /// refused (`refuse_input`).
    fn charge_input(&mut self, index: usize) {
        let max = self.config.limits.input_bytes_total_max;
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        let need = slot.conn.input_bytes();
        if !slot.conn.is_closing()
            && need > slot.in_counted
            && need > INPUT_BYTES_FREE
            && self.in_total + (need - slot.in_counted) > max
        {
            self.refuse_input(index);
        }
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        // A closing connection reads nothing more: only its buffer counts,
        // not the frame it announced.
        let input = slot.conn.input_bytes();
        self.in_total = self.in_total - slot.in_counted + input;
        slot.in_counted = input;
    }

    /// Refuses the frame whose length prefix would take the node's input
    /// over `input_bytes_total_max`: ERROR OVERLOADED with request id 0 (its
    /// header was not read), then the connection closes as after any fatal
    /// error; the frame's body is never read.
    fn refuse_input(&mut self, index: usize) {
        let Some(id) = self.conn_id(index) else {
            return;
        };
        self.stats.input_refused += 1;
        self.stats.error(ErrorCode::Overloaded);
        let max = self.config.limits.input_bytes_total_max;
        let out = outgoing::error(
            0,
            ErrorCode::Overloaded,
            Some(max as u64),
            "node input buffers full (input_bytes_total_max)",
        );
        self.fail(id, out);
    }

    /// Brings the node-wide output total up to date with this connection's
    /// queue. O(1): the ordered index `shed_output` reads is updated there
    /// (`index_output`).
    fn account(&mut self, index: usize) {
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        let out = slot.conn.output_bytes();
        if out != slot.out_counted {
            self.out_total = self.out_total - slot.out_counted + out;
            slot.out_counted = out;
            if !slot.out_index_stale {
                slot.out_index_stale = true;
                self.out_unindexed.push(index);
            }
        }
    }

    /// Brings `out_by_size` up to date with every connection's counted
    /// output: O(log connections) for each connection whose output changed
    /// since the last call.
    fn index_output(&mut self) {
        // Taken and given back, so the list keeps its capacity: a turn
        // allocates nothing here.
        let mut pending = std::mem::take(&mut self.out_unindexed);
        for index in pending.drain(..) {
            let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
                continue;
            };
            slot.out_index_stale = false;
            if slot.out_indexed == slot.out_counted {
                continue;
            }
            if slot.out_indexed > 0 {
                self.out_by_size.remove(&(slot.out_indexed, index));
            }
            if slot.out_counted > 0 {
                self.out_by_size.insert((slot.out_counted, index));
            }
            slot.out_indexed = slot.out_counted;
        }
        self.out_unindexed = pending;
    }

    /// While the output queued by all connections is above
    /// `output_bytes_total_max`, closes the connection with the most output
    /// queued (its queued responses are dropped; requests it has in flight
    /// get no response). A client that reads its responses holds little
    /// queued output, so the clients closed are the ones that do not read.
    fn shed_output(&mut self) {
        let max = self.config.limits.output_bytes_total_max;
        self.index_output();
        while self.out_total > max {
            let Some(&(queued, index)) = self.out_by_size.last() else {
                break;
            };
            self.stats.connections_shed += 1;
            log::debug!("closing connection {index}: {queued} bytes of output queued");
            if let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) {
                slot.conn.drop_output();
            }
            self.close(index);
        }
    }

    /// Bookkeeping after a connection's turn: queue it for another turn if
    /// it used this one whole, and run the clock of a partial frame.
    fn after_turn(&mut self, index: usize, handled_frames: bool, turn_used: bool) {
        let limits = self.config.limits;
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        let id = ConnId {
            index,
            generation: slot.generation,
        };
        if turn_used && !slot.ready {
            slot.ready = true;
            self.ready.push(index);
        }
        let Some(since) = slot
            .conn
            .frame_clock(limits.output_bytes_max, handled_frames)
        else {
            return;
        };
        if !slot.frame_timer_armed {
            slot.frame_timer_armed = true;
            let at = since + Duration::from_millis(limits.frame_timeout_ms);
            self.frame_timers.push(Reverse((at, id)));
        }
    }

    /// Closes connections whose partial frame did not complete within
    /// `frame_timeout_ms` (ERROR BAD_FRAME with request id 0, fatal). Costs
    /// the timers that are due, one per connection at most.
    fn expire_frames(&mut self, now: Instant) {
        let timeout = Duration::from_millis(self.config.limits.frame_timeout_ms);
        while let Some(Reverse((at, id))) = self.frame_timers.peek().copied() {
            if at > now {
                break;
            }
            self.frame_timers.pop();
            let Some(slot) = self.slot_mut(id) else {
                continue;
            };
            slot.frame_timer_armed = false;
            let Some(since) = slot.conn.partial_frame_since() else {
                continue;
            };
            if since + timeout > now {
                // A newer partial frame: its own deadline.
                slot.frame_timer_armed = true;
                self.frame_timers.push(Reverse((since + timeout, id)));
                continue;
            }
            let ms = self.config.limits.frame_timeout_ms;
            let out = outgoing::error(
                0,
                ErrorCode::BadFrame,
                None,
                &format!("no whole frame within frame_timeout_ms ({ms} ms)"),
            );
            self.stats.error(ErrorCode::BadFrame);
            self.stats.frames_timed_out += 1;
            self.event(
                id.index,
                EventKind::ProtocolError,
                "no whole frame within frame_timeout_ms",
            );
            self.fail(id, out);
            self.dirty.push(id.index);
        }
    }

    /// Lets the connection handle the whole frames it holds, in order,
    /// while it may (`Connection::handle_next`: output room, ordering,
    /// loads) and the turn has frames left, and does what each asks.
    /// Returns the number of frames handled.
    fn handle_frames(&mut self, index: usize, frames_left: &mut usize) -> usize {
        let mut handled = 0;
        let limits = self.config.limits;
        while *frames_left > 0 {
            let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
                return handled;
            };
            let conn = ConnId {
                index,
                generation: slot.generation,
            };
            let mut ctx = Ctx {
                engine: &self.engine,
                limits: &limits,
                sends: &self.config.sends,
                token: self.config.token.as_deref(),
                shutting_down: self.shutdown.load(Ordering::SeqCst),
                subs: &mut self.subs,
                receipts: &mut self.receipts,
                conn,
                // The connection sets its own (`Session::handle`).
                version: tidemark_protocol::HELLO_VERSION,
                leadership: self.config.leadership.as_ref().map(|g| &*g.0),
                shards: self.config.shards.as_deref(),
            };
            // The handler's own time counts (latency, slow log).
            let started = Instant::now();
            let (request_id, op, args, action) = match slot.conn.handle_next(&mut ctx) {
                Next::Idle => return handled,
                Next::WaitsForLoad(ticket) => {
                    self.stats.requests_waited_for_load += 1;
                    self.loads.entry(ticket).or_default().push(conn);
                    return handled;
                }
                Next::Handled {
                    request_id,
                    op,
                    args,
                    action,
                } => (request_id, op, args, action),
            };
            handled += 1;
            *frames_left -= 1;
            if let Some(op) = op {
                self.stats.request(op);
            }
            match action {
                Action::Answer(out) => self.respond(conn, op, args, started, out),
                Action::Closed(code) => {
                    // The connection queued the fatal ERROR itself.
                    self.stats.error(code);
                    let (kind, what) = match code {
                        ErrorCode::Unauthenticated => {
                            (EventKind::AuthFailure, "authentication failed")
                        }
                        _ => (EventKind::ProtocolError, "protocol error"),
                    };
                    let what = format!("{what} ({}), closing", crate::stats::code_name(code));
                    self.event(index, kind, &what);
                    self.account(index);
                }
                Action::Park(work) => self.park(Waiting {
                    conn,
                    request_id,
                    op,
                    args,
                    started,
                    work,
                }),
                Action::Confirm { ticket, work } => {
                    self.reads.entry(ticket).or_default().push(Waiting {
                        conn,
                        request_id,
                        op,
                        args,
                        started,
                        work,
                    })
                }
                Action::Wait(poll) => {
                    let w = Waiting {
                        conn,
                        request_id,
                        op,
                        args,
                        started,
                        work: poll,
                    };
                    let key = self.polls.insert(poll.group, started + poll.wait, w);
                    if let Some(slot) = self.slot_mut(conn) {
                        slot.polls.insert(key);
                    }
                }
                Action::Report(report) => {
                    let out = match report {
                        Report::Stats => self.stats_reply(request_id),
                        Report::Info => handlers::info(request_id, &self.info),
                        Report::SlowLog { reset, max_count } => handlers::slowlog(
                            request_id,
                            &mut self.slowlog,
                            reset,
                            max_count,
                            limits.frame_bytes_max,
                        ),
                    };
                    self.respond(conn, op, args, started, out);
                }
                Action::Backup => self.start_backup(conn, request_id, op, args, started),
                Action::ClusterChange(change) => {
                    let Some(gate) = self.config.leadership.clone() else {
                        // Invariant: `Connection` answers CLUSTER_CHANGE
                        // itself on a node without a leadership.
                        continue;
                    };
                    let w = Waiting {
                        conn,
                        request_id,
                        op,
                        args,
                        started,
                        work: (),
                    };
                    let (done, waker) = (self.changes.clone(), self.waker.clone());
                    gate.0.change(
                        change,
                        Box::new(move |outcome| {
                            done.lock().push((w, outcome));
                            let _ = waker.wake();
                        }),
                    );
                }
            }
        }
        handled
    }

    /// Logs an event of a connection, within its kind's rate
    /// (`log_limit.rs`).
    fn event(&mut self, index: usize, kind: EventKind, what: &str) {
        let Some(peer) = self
            .slots
            .get(index)
            .and_then(|s| s.as_ref())
            .map(|s| s.peer)
        else {
            return;
        };
        if self.log_limit.allow(kind, Instant::now()) {
            match kind {
                EventKind::Accept | EventKind::Close => log::info!("connection {peer}: {what}"),
                EventKind::AuthFailure | EventKind::ProtocolError => {
                    log::warn!("connection {peer}: {what}")
                }
            }
        }
    }

    /// BACKUP: begins a snapshot (O(1)) and the thread that streams it, or
    /// answers why not (OVERLOADED while `BACKUPS_MAX` run).
    fn start_backup(
        &mut self,
        conn: ConnId,
        request_id: u64,
        op: Option<Opcode>,
        args: Summary,
        started: Instant,
    ) {
        if self.backups.len() >= backup::BACKUPS_MAX {
            let out = outgoing::error(
                request_id,
                ErrorCode::Overloaded,
                Some(backup::BACKUPS_MAX as u64),
                "as many backups as the node runs at once are under way",
            );
            return self.respond(conn, op, args, started, out);
        }
        match backup::start(
            &self.engine,
            conn,
            request_id,
            self.config.limits.frame_bytes_max,
            self.waker.clone(),
        ) {
            Ok(stream) => self.backups.push(stream),
            Err(out) => {
                self.stats.backup_ended(false, unix_ms_now());
                self.respond(conn, op, args, started, out)
            }
        }
    }

    /// Moves the frames the backup threads made to their connections,
    /// each only while its output is below `backup::OUTPUT_QUEUED_MAX`
    /// (the rest waits in the bounded channel, and the thread waits for
    /// room): a backup goes as fast as its client reads. A stream whose
    /// connection is gone is dropped, which stops its thread.
    fn pump_backups(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.backups.len() {
            let (conn, request_id) = (self.backups[i].conn, self.backups[i].request_id);
            let mut over = false;
            // A client that reads nothing for `STALL_MAX` loses its backup
            // (and its connection): the hold it keeps must end.
            if let Some(slot) = self.slot_mut(conn) {
                let output = slot.conn.output_bytes();
                if !self.backups[i].alive(output, now) {
                    log::warn!(
                        "backup on connection {}: no progress for {:?}; ended",
                        conn.index,
                        backup::STALL_MAX
                    );
                    self.stats.backup_ended(false, unix_ms_now());
                    self.backups.swap_remove(i);
                    if let Some(slot) = self.slot_mut(conn) {
                        slot.conn.drop_output();
                    }
                    self.close(conn.index);
                    continue;
                }
            }
            loop {
                let Some(slot) = self.slot_mut(conn) else {
                    // The client went away before the end.
                    self.stats.backup_ended(false, unix_ms_now());
                    over = true;
                    break;
                };
                if slot.conn.output_bytes() >= backup::OUTPUT_QUEUED_MAX {
                    break;
                }
                match self.backups[i].try_next() {
                    backup::Next::Msg(backup::Msg::Chunk(frame)) => {
                        self.send(conn, backup::outgoing(request_id, frame, None));
                        let output = self.slot_mut(conn).map_or(0, |s| s.conn.output_bytes());
                        self.backups[i].queued(output, now);
                    }
                    backup::Next::Msg(backup::Msg::End { frame, error }) => {
                        if let Some(code) = error {
                            self.stats.error(code);
                        }
                        self.stats.backup_ended(error.is_none(), unix_ms_now());
                        self.send(conn, backup::outgoing(request_id, frame, error));
                        over = true;
                    }
                    backup::Next::Nothing => break,
                    backup::Next::Gone => {
                        let out = outgoing::error(
                            request_id,
                            ErrorCode::Internal,
                            None,
                            "the backup thread ended without finishing",
                        );
                        self.stats.error(ErrorCode::Internal);
                        self.stats.backup_ended(false, unix_ms_now());
                        self.send(conn, out);
                        over = true;
                    }
                }
                self.dirty.push(conn.index);
                if over {
                    break;
                }
            }
            if over {
                self.backups.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Answers the membership changes whose outcome came back (4.34).
    fn answer_changes(&mut self) {
        let done = std::mem::take(&mut *self.changes.lock());
        for (w, outcome) in done {
            let out = handlers::cluster_change(w.request_id, &outcome);
            self.respond(w.conn, w.op, w.args, w.started, out);
            // Written out with this pass's dirty connections.
            self.dirty.push(w.conn.index);
        }
    }

    fn respond(
        &mut self,
        conn: ConnId,
        op: Option<Opcode>,
        args: Summary,
        started: Instant,
        out: Outgoing,
    ) {
        let frame_max = self.config.limits.frame_bytes_max as usize + 4;
        let len = out.head.len() + out.chunks.iter().map(|c| c.bytes().len()).sum::<usize>();
        // Record-carrying responses are sized to fit; a list answer (UNREAD,
        // BATCH_ACK, STATS) of an extreme size is refused, not sent oversized.
        let out = if len > frame_max {
            outgoing::error(
                out.request_id,
                ErrorCode::LimitExceeded,
                Some(frame_max as u64 - 4),
                "response would exceed frame_bytes_max",
            )
        } else {
            out
        };
        if let Some(op) = op {
            let took = started.elapsed();
            self.stats.latency(op, took);
            if let Some(slot) = self.slot_mut(conn) {
                let peer = slot.peer;
                self.slowlog.finished(op, took, peer, args);
            }
        }
        if let Some(code) = out.error {
            self.stats.error(code);
        }
        self.send(conn, out);
    }

    fn send(&mut self, conn: ConnId, out: Outgoing) {
        let records = out.records;
        // After a fatal error the connection queues nothing more.
        if self.slot_mut(conn).is_some_and(|s| s.conn.queue(out)) {
            self.stats.deliveries += records;
            self.account(conn.index);
        }
    }

    /// Queues a fatal ERROR the loop itself raised (input budget, frame
    /// timeout); the connection closes after it.
    fn fail(&mut self, conn: ConnId, out: Outgoing) {
        if let Some(slot) = self.slot_mut(conn) {
            slot.conn.fail(out);
            self.account(conn.index);
        }
    }

    /// Parks a request until its commit round settles; one that is
    /// complete already (a retransmit of a durable send) is answered at
    /// once.
    fn park(&mut self, w: Waiting<Parked>) {
        match w.work.answer(&self.engine, w.request_id) {
            Some(out) => {
                if let Some((group, sender, msg_id)) = w.work.accepted(&out) {
                    self.receipts.sent(group, sender, msg_id);
                }
                self.finish(w.conn, w.op, w.args, w.started, Barrier::of(&w.work), out)
            }
            None => self.pending.entry(w.work.round()).or_default().push(w),
        }
    }

    /// Answers every parked send and operation whose round completed (or
    /// failed): only those, whatever the number parked.
    fn complete_pending(&mut self) {
        let due = take_settled(&mut self.pending, self.engine.settled_round());
        // One not answered is not expected (its round is settled): it stays
        // parked.
        for w in due.into_values().flatten() {
            self.park(w);
        }
    }

    /// Answers parked work and updates its connection.
    fn finish(
        &mut self,
        conn: ConnId,
        op: Option<Opcode>,
        args: Summary,
        started: Instant,
        barrier: Barrier,
        out: Outgoing,
    ) {
        if let Some(slot) = self.slot_mut(conn) {
            slot.conn.parked_done(barrier);
        }
        self.respond(conn, op, args, started, out);
        self.dirty.push(conn.index);
    }

    /// After commit rounds: answer completed work, push new records, wake
    /// long polls of groups that grew.
    fn on_commits(&mut self) {
        let notices = std::mem::take(&mut *self.notices.lock());
        if notices.is_empty() {
            return;
        }
        self.complete_pending();
        self.complete_loads();
        for notice in &notices {
            for a in &notice.appended {
                self.push(a.group, a.first, a.last);
                self.wake_polls(a.group);
            }
        }
    }

    /// Lets the connections whose front request waited for a worker job
    /// that is now done handle it again (only those, whatever the number
    /// waiting).
    fn complete_loads(&mut self) {
        if self.loads.is_empty() {
            return;
        }
        let mut due = take_settled(&mut self.loads, self.engine.settled_load());
        // Requests that need the whole state while the engine loads it
        // (a JOIN or CREATE_GROUP near its limit; UNREAD and SYNC without
        // a saved user index) wait for
        // its own ticket,
        // which the worker's never reach.
        if self.engine.state_load_settled() {
            due.extend(self.loads.remove_entry(&tidemark_engine::STATE_TICKET));
        }
        for conn in due.into_values().flatten() {
            if let Some(slot) = self.slot_mut(conn) {
                slot.conn.load_settled();
                self.dirty.push(conn.index);
            }
        }
    }

    /// Re-runs the long polls of `group` (only those): each that finds
    /// records now is answered; the others keep waiting.
    fn wake_polls(&mut self, group: u64) {
        for key in self.polls.waiters(group) {
            self.answer_poll(key, false);
        }
    }

    /// Answers long polls whose wait is over with what is there (nothing,
    /// unless a message arrived unnoticed). Costs the polls that expire.
    fn expire_polls(&mut self, now: Instant) {
        for key in self.polls.due(now) {
            self.answer_poll(key, true);
        }
    }

    /// The one path of a long poll's wake-up and expiry: runs it again and
    /// answers it if it has something to say (or its deadline passed).
    fn answer_poll(&mut self, key: PollKey, deadline_passed: bool) {
        let Some(w) = self.polls.get(key) else {
            return;
        };
        let Some(out) = w.work.answer(&self.engine, w.request_id, deadline_passed) else {
            return;
        };
        let Some(w) = self.polls.remove(key) else {
            return;
        };
        if let Some(slot) = self.slot_mut(w.conn) {
            slot.polls.remove(&key);
        }
        // On a replica set, the cursor it shows may wait for its Cursors
        // round, as every answer that shows cursors does
        // (`Connection::hold_for_cursors`); a parked answer holds nothing
        // back on its connection, as the poll did not.
        // It is a read too: sent once a read ticket taken now is
        // confirmed (format-spec/cluster.md section 5.2).
        if let Some(gate) = &self.config.leadership {
            let round = self.engine.cursor_round_unsettled().unwrap_or(0);
            let ticket = gate.0.read_ticket();
            self.reads.entry(ticket).or_default().push(Waiting {
                conn: w.conn,
                request_id: w.request_id,
                op: w.op,
                args: w.args,
                started: w.started,
                work: Parked::Cursors { round, out },
            });
            return;
        }
        self.finish(w.conn, w.op, w.args, w.started, Barrier::None, out);
    }

    /// Parks the reads whose ticket was confirmed (answered then, or when
    /// their Cursors round completes) and refuses those whose ticket failed
    /// with `NOT_LEADER`; tickets settle in order, so this costs the reads
    /// settled and one look at the first waiting.
    fn complete_reads(&mut self) {
        if !self.reads_settled.swap(false, Ordering::AcqRel) && self.reads.is_empty() {
            return;
        }
        let Some(gate) = self.config.leadership.as_ref().map(|g| g.0.clone()) else {
            return;
        };
        while let Some(entry) = self.reads.first_entry() {
            let Some(confirmed) = gate.read_outcome(*entry.key()) else {
                break;
            };
            for w in entry.remove() {
                if confirmed {
                    self.park(w);
                    continue;
                }
                let refusal = gate.refusal().unwrap_or(crate::config::NotLeader {
                    leader: None,
                    client_addr: None,
                    starting: false,
                });
                let out = handlers::not_leader(w.request_id, &refusal);
                let barrier = Barrier::of(&w.work);
                self.finish(w.conn, w.op, w.args, w.started, barrier, out);
            }
        }
    }

    /// Pushes records `first..=last` of `group` to every subscriber. A
    /// subscriber whose output is full gets RESYNC(all) and loses its
    /// subscription; it pulls to catch up (nothing is lost).
    fn push(&mut self, group: u64, first: u64, last: u64) {
        let targets = self.subs.targets(&self.engine, group);
        if targets.is_empty() {
            return;
        }
        let budget = outgoing::records_budget(&self.config.limits);
        let mut after = first - 1;
        while after < last {
            // Records just appended: their segment is indexed, so this
            // never waits for the worker (a NotReady would RESYNC below).
            let batch = match self
                .engine
                .try_read(group, after, (last - after) as usize, budget)
            {
                Ok(b) if b.count > 0 => b,
                // Deleted, or its deletion is pending: no further pushes of
                // it, without notice (format-spec/protocol.md 4.6, 5.1).
                Err(tidemark_engine::Error::GroupNotFound { .. }) => return,
                // The records cannot be read back (a damaged group): the
                // subscribers must pull to learn why.
                _ => {
                    for &conn in &targets {
                        self.resync(conn);
                    }
                    return;
                }
            };
            after = batch.last_id;
            // Records are shown per protocol version (`Engine::present`):
            // one frame for the version 1 subscribers, one for the others,
            // each made only if someone gets it.
            let versions: Vec<bool> = targets
                .iter()
                .map(|&c| self.slot_mut(c).is_some_and(|s| s.conn.version() >= 2))
                .collect();
            let mut frames: [Option<(Outgoing, usize)>; 2] = [None, None];
            for kinds in [false, true] {
                if versions.contains(&kinds) {
                    let shown = self.engine.present(
                        group,
                        ReadBatch {
                            chunks: batch.chunks.clone(),
                            ..batch
                        },
                        kinds,
                    );
                    let bytes = shown.bytes;
                    frames[usize::from(kinds)] = Some((handlers::push(group, shown), bytes));
                }
            }
            for (&conn, &kinds) in targets.iter().zip(&versions) {
                // Invariant: a frame was made for every version listed.
                let (frame, bytes) = frames[usize::from(kinds)]
                    .as_ref()
                    .expect("invariant: a frame per version of the targets");
                if self.push_frame(conn, frame, *bytes) {
                    self.stats.pushes += 1;
                }
            }
        }
    }

    /// Queues a server-initiated frame (`bytes` of records after its head)
    /// on a subscriber, or, when it would pass the connection's or the
    /// node's output limit, sends RESYNC(all) instead. True if queued.
    fn push_frame(&mut self, conn: ConnId, frame: &Outgoing, bytes: usize) -> bool {
        let limit = self.config.limits.output_bytes_max;
        let node_full =
            self.out_total + frame.head.len() + bytes > self.config.limits.output_bytes_total_max;
        let Some(slot) = self.slot_mut(conn) else {
            return false;
        };
        if !slot.conn.is_subscribed() {
            return false; // cancelled by an earlier RESYNC
        }
        let queued = if node_full || slot.conn.output_bytes() + frame.head.len() + bytes > limit {
            self.resync(conn);
            false
        } else {
            self.send(conn, frame.clone());
            true
        };
        self.dirty.push(conn.index);
        queued
    }

    /// Sends the receipts due by `now` (format-spec/protocol.md 5.3, 5.4):
    /// the frames of the groups that had cursors move in the interval
    /// (`Receipts::flush` costs only those).
    fn flush_receipts(&mut self, now: Instant) {
        for f in self.receipts.flush(&self.engine, now) {
            for &conn in &f.to {
                if self.push_frame(conn, &f.frame, 0) {
                    self.stats.receipts += 1;
                }
            }
        }
    }

    /// Tells a subscriber its pushes stopped and cancels its subscription;
    /// it pulls to catch up (its cursors did not move: nothing is lost).
    fn resync(&mut self, conn: ConnId) {
        let subscribed = self.slot_mut(conn).is_some_and(|s| s.conn.is_subscribed());
        if !subscribed {
            return;
        }
        self.stats.resyncs += 1;
        self.unsubscribe_all(conn);
        self.send(conn, handlers::resync_all());
        self.dirty.push(conn.index);
    }

    /// Drops the connection's subscriptions, from its list and the index.
    fn unsubscribe_all(&mut self, conn: ConnId) {
        if let Some(slot) = slot_of(&mut self.slots, conn) {
            slot.conn
                .unsubscribe_all(&self.engine, &mut self.subs, &mut self.receipts, conn);
        }
    }

    /// The STATS figures now (also what a metrics scrape gets).
    fn figures(&self) -> Vec<(String, u64)> {
        let raft = self
            .config
            .leadership
            .as_ref()
            .and_then(|l| l.0.raft_figures());
        self.stats.report(&Sources {
            connections: self.connections,
            buffers: Buffers {
                output: self.out_total,
                input: self.in_total,
            },
            engine: &self.engine,
            limits: &self.config.limits,
            host: &self.host,
            slowlog: &self.slowlog,
            log_suppressed: self.log_limit.suppressed_total(),
            started: self.started,
            started_unix_ms: self.started_unix_ms,
            now: Instant::now(),
            cluster_map_epoch: self.config.shards.as_ref().map_or(0, |m| m.epoch),
            cluster_node_id: self
                .config
                .leadership
                .as_ref()
                .map_or(0, |l| l.0.map().node_id),
            raft: raft.as_ref(),
        })
    }

    fn stats_reply(&self, request_id: u64) -> Outgoing {
        handlers::stats(
            request_id,
            &self.figures(),
            self.config.limits.frame_bytes_max,
        )
    }

    /// Re-registers the connection for what it wants, or closes it.
    fn update(&mut self, index: usize) {
        let limits = self.config.limits;
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        if slot.conn.finished() {
            self.close(index);
            return;
        }
        let want = match (
            slot.conn.wants_read(limits.output_bytes_max),
            slot.conn.wants_write(),
        ) {
            (true, true) => Some(Interest::READABLE | Interest::WRITABLE),
            (true, false) => Some(Interest::READABLE),
            (false, true) => Some(Interest::WRITABLE),
            (false, false) => None,
        };
        if want == slot.interest {
            return;
        }
        let token = Token(index + FIRST_CONNECTION);
        let registry = self.poll.registry();
        let result = match (slot.interest, want) {
            (_, None) => registry.deregister(&mut slot.stream),
            (None, Some(i)) => registry.register(&mut slot.stream, token, i),
            (Some(_), Some(i)) => registry.reregister(&mut slot.stream, token, i),
        };
        slot.interest = want;
        if result.is_err() {
            self.close(index);
        }
    }

    fn close(&mut self, index: usize) {
        let Some(id) = self.conn_id(index) else {
            return;
        };
        self.unsubscribe_all(id);
        self.event(index, EventKind::Close, "closed");
        let keys = self.slots[index]
            .as_mut()
            .map(|s| std::mem::take(&mut s.polls))
            .unwrap_or_default();
        for key in keys {
            self.polls.remove(key);
        }
        if let Some(mut slot) = self.slots[index].take() {
            if slot.interest.is_some() {
                let _ = self.poll.registry().deregister(&mut slot.stream);
            }
            if slot.out_indexed > 0 {
                self.out_by_size.remove(&(slot.out_indexed, index));
            }
            self.out_total -= slot.out_counted;
            self.in_total -= slot.in_counted;
            self.connections -= 1;
            self.free.push(index);
            // A descriptor was freed: take the spare back (the loop then
            // accepts again if accepting was blocked).
            drop(slot);
            if self.spare_fd.is_none() {
                self.spare_fd = open_spare_fd();
            }
        }
    }
}

/// Removes and returns the entries of `waiting` (keyed by the engine
/// ticket they wait for) whose ticket is at or below `settled`; tickets
/// settle in order, so these are exactly the ones done. Costs what it takes
/// out, whatever the number left waiting.
fn take_settled<T>(waiting: &mut BTreeMap<u64, T>, settled: u64) -> BTreeMap<u64, T> {
    let later = match settled.checked_add(1) {
        Some(next) => waiting.split_off(&next),
        None => BTreeMap::new(),
    };
    std::mem::replace(waiting, later)
}

/// The slot of connection `id`, if it is still open.
fn slot_of(slots: &mut [Option<Slot>], id: ConnId) -> Option<&mut Slot> {
    slots
        .get_mut(id.index)?
        .as_mut()
        .filter(|s| s.generation == id.generation)
}

/// Opens the engine, serves until SIGINT/SIGTERM or `on_ready`'s handle
/// says stop, then shuts down gracefully (cursors persisted, clean
/// checkpoint). `on_ready` gets the bound address once the node accepts
/// connections.
pub fn serve(
    config: NodeConfig,
    on_ready: impl FnOnce(SocketAddr, Shutdown),
) -> Result<(), String> {
    let open = |c: &NodeConfig| {
        Engine::open(c.engine.clone())
            .map(Arc::new)
            .map_err(|e| format!("open engine: {e}"))
    };
    let engine = serve_engine(config, open, on_ready)?;
    let stats = engine.stats();
    match Arc::try_unwrap(engine) {
        Ok(engine) => engine.close().map_err(|e| format!("close engine: {e}"))?,
        Err(_) => return Err("engine still referenced at shutdown".into()),
    }
    log::info!(
        "stopped: {} appends, {} commit rounds, {} fsyncs",
        stats.appends,
        stats.rounds,
        stats.journal_syncs
    );
    Ok(())
}

/// [`serve`] over an engine that `open` provides once the listener is bound
/// (a replica set member's, which its replica owns and closes); returns it
/// once the event loop stopped, every reference of the node's dropped.
pub fn serve_engine(
    mut config: NodeConfig,
    open: impl FnOnce(&NodeConfig) -> Result<Arc<Engine>, String>,
    on_ready: impl FnOnce(SocketAddr, Shutdown),
) -> Result<Arc<Engine>, String> {
    config.validate()?;
    // Segment files and connections share the descriptor limit: fit both
    // at start, so that a connection over the budget gets the documented
    // OVERLOADED rather than an accept that fails.
    let nofile = raise_open_file_limit(config.descriptors_needed());
    if let Some(warning) = config.fit_descriptors(nofile)? {
        log::warn!("{warning}");
    }
    // Bind first: a taken or invalid address is the cheapest thing to get
    // wrong, and must not cost a recovery and a checkpoint of the data
    // directory before it is reported. Connections that arrive while the
    // engine opens wait in the listen backlog.
    let listener =
        TcpListener::bind(config.listen).map_err(|e| format!("listen {}: {e}", config.listen))?;
    let mut metrics = config.metrics_listen.map(MetricsServer::bind).transpose()?;
    let engine = open(&config)?;
    let report = engine.recovery_report();
    log::info!("recovered: {}", report.summary());
    // The host refresher: disk and memory figures, off the event loop.
    let host = Arc::new(HostFigures::new(Instant::now()));
    let (stop_host, host_stopped) = std::sync::mpsc::channel::<()>();
    let host_thread = crate::host::spawn(
        config.engine.data_dir.clone(),
        tidemark_engine::journal_dir(&config.engine.data_dir),
        host.clone(),
        host_stopped,
    )
    .map_err(|e| format!("host refresher thread: {e}"))?;
    let mut event_loop = EventLoop::with_listener(engine.clone(), config, listener, host)
        .map_err(|e| format!("event loop: {e}"))?;
    let addr = event_loop.local_addr().map_err(|e| e.to_string())?;
    event_loop.set_info(addr, metrics.as_ref().map(MetricsServer::addr));
    if let Some(m) = metrics.as_mut() {
        m.start(
            event_loop.published.clone(),
            event_loop.waker.clone(),
            event_loop.info.clone(),
        )
        .map_err(|e| format!("metrics thread: {e}"))?;
        log::info!("metrics on http://{}/metrics", m.addr());
    }
    on_ready(addr, event_loop.shutdown_handle());
    event_loop.run().map_err(|e| format!("event loop: {e}"))?;
    if let Some(mut m) = metrics.take() {
        m.stop();
    }
    drop(stop_host);
    let _ = host_thread.join();
    drop(event_loop);
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_settled_takes_the_settled_tickets_only() {
        let mut waiting: BTreeMap<u64, Vec<u32>> =
            [(3, vec![1]), (4, vec![2]), (9, vec![3])].into();
        let due = take_settled(&mut waiting, 4);
        assert_eq!(due.keys().copied().collect::<Vec<_>>(), vec![3, 4]);
        assert_eq!(waiting.keys().copied().collect::<Vec<_>>(), vec![9]);
        assert!(take_settled(&mut waiting, 8).is_empty());
        waiting.insert(u64::MAX, vec![4]);
        assert_eq!(take_settled(&mut waiting, u64::MAX).len(), 2);
        assert!(waiting.is_empty());
    }
}
