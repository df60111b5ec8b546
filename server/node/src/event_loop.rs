//! The node's event loop: one mio poll over the listener, the connections
//! and a waker. One thread runs it; the engine's commit thread is the other.
//!
//! Why one loop on a 2-core machine: the engine already owns a second core
//! for journal writes and fsyncs; every request here is a memory operation
//! (an append is queued, not written), so one loop saturates the network
//! long before it saturates its core, and it needs no locks of its own.
//!
//! The loop never waits for the disk. A durable send, a join, a long-poll
//! pull are parked as [`Deferred`] work; after every commit round the
//! commit thread's listener queues a notice and wakes the loop, which
//! answers what completed, pushes the new records to subscribers and
//! re-runs the long polls of the groups that grew. A request whose group's
//! files must be read first (its first use since the engine opened) gets
//! `NotReady` from the engine: it stays at the front of its connection's
//! input buffer, nothing behind it starts, and it runs again when the
//! engine's maintenance worker has read them (the worker calls the same
//! listener).

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
use tidemark_engine::{raise_open_file_limit, CommitNotice, Engine};

use crate::config::{NodeConfig, FRAMES_PER_PASS_MAX, INPUT_BYTES_FREE, READ_BYTES_PER_PASS_MAX};
use crate::connection::{Barrier, Connection, OutChunk};
use crate::handlers::{self, Ctx, Deferred, Handled, OpKind, Outgoing};
use crate::long_poll::{LongPolls, PollKey};
use crate::stats::{Buffers, Stats};
use crate::subscriptions::Subscriptions;
use tidemark_protocol::{
    decode_request, ErrorCode, Opcode, RecordsLen, Response, ResyncScope, Stat, Subscription,
    RECORDS_RESPONSE_OVERHEAD_BYTES,
};

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
    sub_groups: HashSet<u64>,
    sub_users: HashSet<u64>,
    /// This connection's parked long polls, dropped when it closes.
    polls: HashSet<PollKey>,
    /// In `EventLoop::ready`: it has work left from its last turn.
    ready: bool,
    /// Has an entry in `EventLoop::frame_timers`.
    frame_timer_armed: bool,
    /// This connection's queued output as counted in `EventLoop::out_total`.
    out_counted: usize,
    /// This connection's input memory as counted in `EventLoop::in_total`.
    in_counted: usize,
}

/// Identifies a connection across slot reuse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct ConnId {
    index: usize,
    generation: u64,
}

/// Deferred work with what is needed to answer it.
struct Waiting {
    conn: ConnId,
    request_id: u64,
    op: Opcode,
    started: Instant,
    work: Deferred,
    /// What it holds back on its connection while parked.
    barrier: Barrier,
}

/// Handle to stop a running node from another thread (signal handler, tests).
#[derive(Clone)]
pub struct Shutdown {
    flag: Arc<AtomicBool>,
    waker: Arc<Waker>,
}

impl Shutdown {
    pub fn request(&self) {
        self.flag.store(true, Ordering::SeqCst);
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
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    connections: usize,
    next_generation: u64,
    notices: Arc<Mutex<Vec<CommitNotice>>>,
    /// Parked sends and operations by the commit round they wait for.
    pending: BTreeMap<u64, Vec<Waiting>>,
    /// Parked long polls, by group and by deadline.
    polls: LongPolls<Waiting>,
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
    /// `output_bytes_total_max`.
    out_by_size: BTreeSet<(usize, usize)>,
    /// Input memory of all connections (sum of `Slot::in_counted`).
    in_total: usize,
    subs: Subscriptions<ConnId>,
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
        Ok(EventLoop {
            engine,
            config,
            poll,
            listener: Some(listener),
            waker,
            shutdown: Arc::new(AtomicBool::new(false)),
            slots: Vec::new(),
            free: Vec::new(),
            connections: 0,
            next_generation: 0,
            notices,
            pending: BTreeMap::new(),
            polls: LongPolls::default(),
            loads: BTreeMap::new(),
            dirty: Vec::new(),
            ready: Vec::new(),
            frame_timers: BinaryHeap::new(),
            out_total: 0,
            out_by_size: BTreeSet::new(),
            in_total: 0,
            subs: Subscriptions::default(),
            stats: Stats::default(),
            spare_fd: open_spare_fd(),
            accept_blocked: false,
            fd_refusals_unlogged: 0,
            fd_warned_at: None,
        })
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
            let now = Instant::now();
            self.expire_polls(now);
            self.expire_frames(now);
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
                    && self.slots.iter().flatten().all(|s| s.conn.out.is_empty());
                if drained || drain_deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(());
                }
            }
        }
    }

    fn next_timeout(&mut self, drain_deadline: Option<Instant>) -> Option<Duration> {
        let frames = self.frame_timers.peek().map(|Reverse((at, _))| *at);
        let next = self
            .polls
            .next_deadline()
            .into_iter()
            .chain(frames)
            .chain(drain_deadline)
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
        for i in 0..self.slots.len() {
            if let Some(slot) = self.slots[i].as_mut() {
                slot.conn.closing = true;
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
                sub_groups: HashSet::new(),
                sub_users: HashSet::new(),
                polls: HashSet::new(),
                ready: false,
                frame_timer_armed: false,
                out_counted: 0,
                in_counted: 0,
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
        }
    }

    /// Writes the documented refusal (ERROR OVERLOADED, request id 0,
    /// detail = connections_max) with one non-blocking write; the stream is
    /// closed when the caller drops it.
    fn refuse_connection(&mut self, stream: &mut TcpStream, message: &str) {
        self.stats.connections_refused += 1;
        let out = handlers::error(
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
        self.slots
            .get_mut(id.index)?
            .as_mut()
            .filter(|s| s.generation == id.generation)
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
                match slot.conn.decoder.read_from(&mut slot.stream) {
                    Ok(0) => {
                        slot.conn.peer_closed = true;
                        break;
                    }
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
                    Err(_) => {
                        slot.conn.peer_closed = true;
                        break;
                    }
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
            match slot.conn.out.write_to(&mut slot.stream) {
                Ok(n) if n > 0 => {
                    self.stats.bytes_out += n as u64;
                    progress = true;
                }
                Ok(_) => {}
                Err(_) => {
                    // The peer is gone: nothing queued can be delivered.
                    // (Or EFAULT: record bytes queued from a segment file
                    // cut under the node since; the frame is broken, so the
                    // connection ends the same way. See engine segment.rs.)
                    slot.conn.peer_closed = true;
                    slot.conn.out = Default::default();
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
        let need = slot.conn.decoder.memory_bytes();
        if !slot.conn.closing
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
        let input = if slot.conn.closing {
            slot.conn.decoder.allocated()
        } else {
            slot.conn.decoder.memory_bytes()
        };
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
        self.stats.errors += 1;
        let max = self.config.limits.input_bytes_total_max;
        let out = handlers::error(
            0,
            ErrorCode::Overloaded,
            Some(max as u64),
            "node input buffers full (input_bytes_total_max)",
        );
        self.send(id, out);
        if let Some(slot) = self.slot_mut(id) {
            slot.conn.closing = true;
            slot.conn.fatal = true;
        }
    }

    /// Brings the node-wide output total up to date with this connection's
    /// queue. O(log connections).
    fn account(&mut self, index: usize) {
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        let out = slot.conn.out.len();
        if out != slot.out_counted {
            if slot.out_counted > 0 {
                self.out_by_size.remove(&(slot.out_counted, index));
            }
            if out > 0 {
                self.out_by_size.insert((out, index));
            }
            self.out_total = self.out_total - slot.out_counted + out;
            slot.out_counted = out;
        }
    }

    /// While the output queued by all connections is above
    /// `output_bytes_total_max`, closes the connection with the most output
    /// queued (its queued responses are dropped; requests it has in flight
    /// get no response). A client that reads its responses holds little
    /// queued output, so the clients closed are the ones that do not read.
    fn shed_output(&mut self) {
        let max = self.config.limits.output_bytes_total_max;
        while self.out_total > max {
            let Some(&(queued, index)) = self.out_by_size.last() else {
                break;
            };
            self.stats.connections_shed += 1;
            log::debug!("closing connection {index}: {queued} bytes of output queued");
            if let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) {
                slot.conn.out = Default::default();
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
        // The clock runs only while the node is willing to read: a frame
        // held back by the node's own back-pressure is not the client's
        // delay. It restarts with each whole frame.
        let partial = slot.conn.wants_read(limits.output_bytes_max)
            && slot.conn.decoder.holds_partial_frame();
        if !partial {
            slot.conn.partial_since = None;
            return;
        }
        if handled_frames || slot.conn.partial_since.is_none() {
            slot.conn.partial_since = Some(Instant::now());
        }
        if !slot.frame_timer_armed {
            slot.frame_timer_armed = true;
            let since = slot.conn.partial_since.unwrap_or_else(Instant::now);
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
            let Some(since) = slot.conn.partial_since else {
                continue;
            };
            if since + timeout > now {
                // A newer partial frame: its own deadline.
                slot.frame_timer_armed = true;
                self.frame_timers.push(Reverse((since + timeout, id)));
                continue;
            }
            slot.conn.partial_since = None;
            let ms = self.config.limits.frame_timeout_ms;
            let out = handlers::error(
                0,
                ErrorCode::BadFrame,
                None,
                &format!("no whole frame within frame_timeout_ms ({ms} ms)"),
            );
            self.stats.errors += 1;
            self.stats.frames_timed_out += 1;
            self.send(id, out);
            if let Some(slot) = self.slot_mut(id) {
                slot.conn.closing = true;
                slot.conn.fatal = true;
            }
            self.dirty.push(id.index);
        }
    }

    /// Handles the whole frames the decoder holds, in order, while output
    /// has room, the turn has frames left, and the next request may start
    /// (format-spec/protocol.md section 1.4: a request that could observe a
    /// parked one's effect waits in the decoder until that one is answered).
    /// Returns the number of frames handled.
    fn handle_frames(&mut self, index: usize, frames_left: &mut usize) -> usize {
        let mut handled = 0;
        let limits = self.config.limits;
        loop {
            let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
                return handled;
            };
            if slot.conn.closing
                || slot.conn.out.len() >= limits.output_bytes_max
                || *frames_left == 0
                || slot.conn.waiting_load.is_some()
            {
                return handled;
            }
            if let Some(opcode) = slot.conn.decoder.front_opcode() {
                if !slot.conn.may_start(opcode) {
                    return handled;
                }
            }
            let mut phase = slot.conn.phase;
            let in_flight = slot.conn.in_flight;
            let ctx = Ctx {
                engine: &self.engine,
                limits: &limits,
                token: self.config.token.as_deref(),
                server_name: handlers::SERVER_NAME,
            };
            // The frame borrows the decoder; it is handled into owned output
            // before the connection is touched again. It stays at the front
            // until it is taken below (a request that must wait for the
            // engine's worker stays there).
            let (request_id, op, outcome) = match slot.conn.decoder.front_frame() {
                Ok(None) => return handled,
                Err(fe) => {
                    let out = handlers::error(
                        0,
                        fe.error_code(),
                        Some(limits.frame_bytes_max as u64),
                        &fe.to_string(),
                    );
                    (0, None, Handled::Fatal(out))
                }
                Ok(Some(frame)) => {
                    let id = frame.header.request_id;
                    match decode_request(&frame) {
                        Err(de) => {
                            let detail =
                                (de.error_code() == ErrorCode::UnsupportedVersion).then_some(1);
                            (
                                id,
                                None,
                                Handled::Fatal(handlers::error(
                                    id,
                                    de.error_code(),
                                    detail,
                                    &de.to_string(),
                                )),
                            )
                        }
                        Ok(req) => {
                            let op = req.opcode();
                            if self.shutdown.load(Ordering::SeqCst) {
                                (
                                    id,
                                    Some(op),
                                    Handled::Reply(handlers::error(
                                        id,
                                        ErrorCode::ShuttingDown,
                                        None,
                                        "node is shutting down",
                                    )),
                                )
                            } else if in_flight >= limits.requests_in_flight_max && defers(op) {
                                let out = handlers::error(
                                    id,
                                    ErrorCode::TooManyRequestsInFlight,
                                    Some(limits.requests_in_flight_max as u64),
                                    "too many requests in flight",
                                );
                                (id, Some(op), Handled::Reply(out))
                            } else {
                                (id, Some(op), handlers::handle(&ctx, &mut phase, id, req))
                            }
                        }
                    }
                }
            };
            let conn = ConnId {
                index,
                generation: slot.generation,
            };
            if let Handled::NotReady(ticket) = outcome {
                // Not run: it waits in the input buffer for the worker, and
                // so does everything behind it (format-spec/protocol.md 1.4).
                slot.conn.waiting_load = Some(ticket);
                self.stats.requests_waited_for_load += 1;
                self.loads.entry(ticket).or_default().push(conn);
                return handled;
            }
            slot.conn.decoder.consume_front();
            handled += 1;
            *frames_left -= 1;
            slot.conn.phase = phase;
            if let Some(op) = op {
                self.stats.request(op);
            }
            let started = Instant::now();
            match outcome {
                Handled::Reply(out) => self.respond(conn, op, started, out),
                Handled::Fatal(out) => {
                    self.stats.errors += 1;
                    self.send(conn, out);
                    if let Some(slot) = self.slot_mut(conn) {
                        slot.conn.closing = true;
                        slot.conn.fatal = true;
                    }
                }
                Handled::Deferred(work) => self.defer(conn, request_id, op, started, work),
                Handled::Subscribe(sub) => {
                    let out = self.subscribe(conn, request_id, sub);
                    self.respond(conn, op, started, out);
                }
                Handled::Unsubscribe => {
                    self.unsubscribe_all(conn);
                    self.respond(
                        conn,
                        op,
                        started,
                        handlers::reply(request_id, &Response::Unsubscribe, Vec::new(), 0),
                    );
                }
                Handled::Stats => {
                    let out = self.stats_reply(request_id);
                    self.respond(conn, op, started, out);
                }
                Handled::NotReady(_) => unreachable!("left in the input buffer above"),
            }
        }
    }

    fn respond(&mut self, conn: ConnId, op: Option<Opcode>, started: Instant, out: Outgoing) {
        let frame_max = self.config.limits.frame_bytes_max as usize + 4;
        let len = out.head.len() + out.chunks.iter().map(|c| c.bytes().len()).sum::<usize>();
        // Record-carrying responses are sized to fit; a list answer (UNREAD,
        // BATCH_ACK, STATS) of an extreme size is refused, not sent oversized.
        let out = if len > frame_max {
            let request_id = u64::from_le_bytes(out.head[8..16].try_into().unwrap_or_default());
            handlers::error(
                request_id,
                ErrorCode::LimitExceeded,
                Some(frame_max as u64 - 4),
                "response would exceed frame_bytes_max",
            )
        } else {
            out
        };
        if let Some(op) = op {
            self.stats.latency(op, started.elapsed());
        }
        if out.head.get(5) == Some(&0xFF) {
            self.stats.errors += 1;
        }
        self.send(conn, out);
    }

    fn send(&mut self, conn: ConnId, out: Outgoing) {
        // After a fatal error the connection writes nothing more.
        let Some(slot) = self.slot_mut(conn).filter(|s| !s.conn.fatal) else {
            return;
        };
        slot.conn.out.push(OutChunk::Bytes(out.head));
        for c in out.chunks {
            slot.conn.out.push(OutChunk::Records(c));
        }
        self.stats.deliveries += out.records;
        self.account(conn.index);
    }

    fn defer(
        &mut self,
        conn: ConnId,
        request_id: u64,
        op: Option<Opcode>,
        started: Instant,
        work: Deferred,
    ) {
        let Some(op) = op else { return };
        let barrier = match work {
            Deferred::Send(_) => Barrier::Send,
            Deferred::Op(..) => Barrier::Op,
            Deferred::Poll(_) => Barrier::None,
        };
        if let Some(slot) = self.slot_mut(conn) {
            slot.conn.park(barrier);
        }
        let w = Waiting {
            conn,
            request_id,
            op,
            started,
            work,
            barrier,
        };
        match w.work {
            Deferred::Poll(p) => {
                let key = self.polls.insert(p.group, started + p.wait, w);
                if let Some(slot) = self.slot_mut(conn) {
                    slot.polls.insert(key);
                }
            }
            // An operation may already be complete (a retransmit of a durable
            // send): answer it without waiting for a round.
            _ => {
                if let Some(out) = self.answer(&w) {
                    self.finish(w, out);
                } else {
                    self.pending.entry(round_of(&w.work)).or_default().push(w);
                }
            }
        }
    }

    /// Answers every parked send and operation whose round completed (or
    /// failed): only those, whatever the number parked.
    fn complete_pending(&mut self) {
        let settled = self.engine.settled_round();
        let later = match settled.checked_add(1) {
            Some(next) => self.pending.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.pending, later);
        for w in due.into_values().flatten() {
            match self.answer(&w) {
                Some(out) => self.finish(w, out),
                // Not expected (its round is settled); keep it parked.
                None => self.pending.entry(round_of(&w.work)).or_default().push(w),
            }
        }
    }

    /// The response to parked work, if its round's outcome is known.
    fn answer(&self, w: &Waiting) -> Option<Outgoing> {
        let out = match &w.work {
            Deferred::Send(ticket) => match self.engine.poll(ticket)? {
                Ok(a) => handlers::reply(
                    w.request_id,
                    &Response::Send {
                        msg_id: a.msg_id,
                        timestamp_ms: a.timestamp_ms,
                        duplicate: a.duplicate,
                    },
                    Vec::new(),
                    0,
                ),
                Err(e) => handlers::engine_error(w.request_id, &e),
            },
            Deferred::Op(ticket, kind) => match self.engine.poll_op(ticket)? {
                Ok(value) => {
                    let resp: Response<'_, RecordsLen> = match kind {
                        OpKind::CreateGroup => Response::CreateGroup,
                        OpKind::DeleteGroup => Response::DeleteGroup,
                        OpKind::Leave => Response::Leave,
                        OpKind::Join { group } => Response::Join {
                            cursor: value,
                            head: self.engine.head(*group).unwrap_or(value),
                        },
                    };
                    handlers::reply(w.request_id, &resp, Vec::new(), 0)
                }
                Err(e) => handlers::engine_error(w.request_id, &e),
            },
            Deferred::Poll(_) => unreachable!("polls are parked separately"),
        };
        Some(out)
    }

    /// Answers parked work and updates its connection.
    fn finish(&mut self, w: Waiting, out: Outgoing) {
        if let Some(slot) = self.slot_mut(w.conn) {
            slot.conn.unpark(w.barrier);
        }
        self.respond(w.conn, Some(w.op), w.started, out);
        self.dirty.push(w.conn.index);
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
        let settled = self.engine.settled_load();
        let later = match settled.checked_add(1) {
            Some(next) => self.loads.split_off(&next),
            None => BTreeMap::new(),
        };
        let due = std::mem::replace(&mut self.loads, later);
        for conn in due.into_values().flatten() {
            if let Some(slot) = self.slot_mut(conn) {
                slot.conn.waiting_load = None;
                self.dirty.push(conn.index);
            }
        }
    }

    /// Re-runs the long polls of `group` (only those): each that finds
    /// records now is answered; the others keep waiting.
    fn wake_polls(&mut self, group: u64) {
        for key in self.polls.waiters(group) {
            let Some(Deferred::Poll(p)) = self.polls.get(key).map(|w| &w.work) else {
                continue;
            };
            let p = *p;
            let out = self.engine.try_pull(
                p.group,
                p.user,
                p.max_count as usize,
                p.max_bytes as usize,
                None,
            );
            // A long poll was parked after a pull of its group ran, so the
            // group is loaded and new records are indexed: NotReady is not
            // expected; if it came, the poll keeps waiting.
            let nothing_yet = match &out {
                Ok(pull) => pull.batch.count == 0,
                Err(e) => matches!(e, tidemark_engine::Error::NotReady { .. }),
            };
            if nothing_yet {
                continue;
            }
            let Some(w) = self.polls.remove(key) else {
                continue;
            };
            self.unpark_poll(&w, key);
            let out = match out {
                Ok(pull) => handlers::pull_reply(w.request_id, pull),
                Err(e) => handlers::engine_error(w.request_id, &e),
            };
            self.finish(w, out);
        }
    }

    /// Answers long polls whose wait is over with what is there (nothing,
    /// unless a message arrived unnoticed). Costs the polls that expire.
    fn expire_polls(&mut self, now: Instant) {
        for (key, w) in self.polls.take_due(now) {
            self.unpark_poll(&w, key);
            let Deferred::Poll(p) = w.work else { continue };
            let out = match self.engine.try_pull(
                p.group,
                p.user,
                p.max_count as usize,
                p.max_bytes as usize,
                None,
            ) {
                Ok(pull) => handlers::pull_reply(w.request_id, pull),
                Err(e) => handlers::engine_error(w.request_id, &e),
            };
            self.finish(w, out);
        }
    }

    /// Forgets a poll that left the parked set in its connection's list.
    fn unpark_poll(&mut self, w: &Waiting, key: PollKey) {
        if let Some(slot) = self.slot_mut(w.conn) {
            slot.polls.remove(&key);
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
        let budget =
            (self.config.limits.frame_bytes_max - RECORDS_RESPONSE_OVERHEAD_BYTES) as usize;
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
            // Invariant: bounded by the frame budget.
            let section = RecordsLen {
                count: batch.count as u32,
                bytes: batch.bytes as u32,
            };
            let frame = handlers::reply(
                0,
                &Response::Push {
                    group,
                    records: section,
                },
                batch.chunks.clone(),
                batch.count,
            );
            for &conn in &targets {
                let limit = self.config.limits.output_bytes_max;
                let node_full = self.out_total + frame.head.len() + batch.bytes
                    > self.config.limits.output_bytes_total_max;
                let Some(slot) = self.slot_mut(conn) else {
                    continue;
                };
                if slot.sub_groups.is_empty() && slot.sub_users.is_empty() {
                    continue; // cancelled by an earlier RESYNC in this loop
                }
                if node_full || slot.conn.out.len() + frame.head.len() + batch.bytes > limit {
                    self.resync(conn);
                } else {
                    self.stats.pushes += 1;
                    self.send(
                        conn,
                        Outgoing {
                            head: frame.head.clone(),
                            chunks: frame.chunks.clone(),
                            records: frame.records,
                        },
                    );
                }
                self.dirty.push(conn.index);
            }
        }
    }

    /// Tells a subscriber its pushes stopped and cancels its subscription;
    /// it pulls to catch up (its cursors did not move: nothing is lost).
    fn resync(&mut self, conn: ConnId) {
        let subscribed = self
            .slot_mut(conn)
            .is_some_and(|s| !s.sub_groups.is_empty() || !s.sub_users.is_empty());
        if !subscribed {
            return;
        }
        self.stats.resyncs += 1;
        self.unsubscribe_all(conn);
        let resync: Response<'_, RecordsLen> = Response::Resync(ResyncScope::All);
        self.send(conn, handlers::reply(0, &resync, Vec::new(), 0));
        self.dirty.push(conn.index);
    }

    fn subscribe(&mut self, conn: ConnId, request_id: u64, sub: Subscription) -> Outgoing {
        let max = self.config.limits.subscriptions_max;
        let Some(slot) = self.slot_mut(conn) else {
            return handlers::error(request_id, ErrorCode::Internal, None, "connection gone");
        };
        let adding = match &sub {
            Subscription::User(_) => 1,
            Subscription::Groups(g) => g.len(),
        };
        if slot.sub_groups.len() + slot.sub_users.len() + adding > max {
            return handlers::error(
                request_id,
                ErrorCode::LimitExceeded,
                Some(max as u64),
                "too many subscriptions",
            );
        }
        match sub {
            Subscription::User(user) => {
                slot.sub_users.insert(user);
                self.subs.add_user(&self.engine, conn, user);
            }
            Subscription::Groups(groups) => {
                if let Some(missing) = groups.iter().find(|g| self.engine.head(**g).is_err()) {
                    return handlers::error(
                        request_id,
                        ErrorCode::GroupNotFound,
                        None,
                        &format!("group {missing} not found"),
                    );
                }
                let Some(slot) = self.slot_mut(conn) else {
                    unreachable!("checked above")
                };
                slot.sub_groups.extend(groups.iter().copied());
                for g in groups {
                    self.subs.add_group(conn, g);
                }
            }
        }
        if let Some(slot) = self.slot_mut(conn) {
            slot.conn.subscriptions = slot.sub_groups.len() + slot.sub_users.len();
        }
        handlers::reply(request_id, &Response::Subscribe, Vec::new(), 0)
    }

    fn unsubscribe_all(&mut self, conn: ConnId) {
        let Some(slot) = self.slot_mut(conn) else {
            return;
        };
        let groups = std::mem::take(&mut slot.sub_groups);
        let users = std::mem::take(&mut slot.sub_users);
        slot.conn.subscriptions = 0;
        self.subs.remove(&self.engine, conn, groups, users);
    }

    fn stats_reply(&self, request_id: u64) -> Outgoing {
        let buffers = Buffers {
            output: self.out_total,
            input: self.in_total,
        };
        let figures =
            self.stats
                .report(self.connections, buffers, &self.engine, &self.config.limits);
        let list: Vec<Stat<'_>> = figures
            .iter()
            .map(|(name, value)| Stat {
                name,
                value: *value,
            })
            .collect();
        handlers::reply(request_id, &Response::Stats(list), Vec::new(), 0)
    }

    /// Re-registers the connection for what it wants, or closes it.
    fn update(&mut self, index: usize) {
        let limits = self.config.limits;
        let Some(slot) = self.slots.get_mut(index).and_then(|s| s.as_mut()) else {
            return;
        };
        if slot.conn.finished() || (slot.conn.peer_closed && slot.conn.in_flight == 0) {
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
            if slot.out_counted > 0 {
                self.out_by_size.remove(&(slot.out_counted, index));
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

/// Requests that are answered later count against requests_in_flight_max.
/// The commit round parked work waits for.
fn round_of(work: &Deferred) -> u64 {
    match work {
        Deferred::Send(ticket) => ticket.round,
        Deferred::Op(ticket, _) => ticket.round(),
        Deferred::Poll(_) => unreachable!("polls are parked separately"),
    }
}

fn defers(op: Opcode) -> bool {
    matches!(
        op,
        Opcode::Send
            | Opcode::Pull
            | Opcode::CreateGroup
            | Opcode::DeleteGroup
            | Opcode::Join
            | Opcode::Leave
    )
}

/// Opens the engine, serves until SIGINT/SIGTERM or `on_ready`'s handle
/// says stop, then shuts down gracefully (cursors persisted, clean
/// checkpoint). `on_ready` gets the bound address once the node accepts
/// connections.
pub fn serve(
    mut config: NodeConfig,
    on_ready: impl FnOnce(SocketAddr, Shutdown),
) -> Result<(), String> {
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
    let engine =
        Arc::new(Engine::open(config.engine.clone()).map_err(|e| format!("open engine: {e}"))?);
    let report = engine.recovery_report();
    log::info!("recovered: {}", report.summary());
    let mut event_loop = EventLoop::with_listener(engine.clone(), config, listener)
        .map_err(|e| format!("event loop: {e}"))?;
    let addr = event_loop.local_addr().map_err(|e| e.to_string())?;
    on_ready(addr, event_loop.shutdown_handle());
    event_loop.run().map_err(|e| format!("event loop: {e}"))?;
    let stats = engine.stats();
    drop(event_loop);
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
