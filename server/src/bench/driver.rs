//! Runs one phase of a workload: one thread per connection, each keeping up
//! to `in_flight` requests outstanding (queue, write in one go, read every
//! response that arrived, refill), timing every request into an HDR
//! histogram, and counting progress for the live line.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::conn::Conn;
use super::progress::Progress;
use tidemark_protocol::{Records, Request, Response};

/// Error messages kept per phase (the count is exact; the texts are samples).
const ERROR_SAMPLES_MAX: usize = 5;
/// Largest latency the histogram holds, in microseconds (an hour).
const LATENCY_US_MAX: u64 = 3_600_000_000;

/// One connection's share of a phase, as a state machine: it proposes
/// requests and consumes their responses. `tag` is the job's own handle
/// of a request (an index, a member); the driver hands it back.
pub trait Job: Send {
    /// The next request, or `None` if none can be sent now (the job may be
    /// waiting for responses).
    fn next(&mut self) -> Option<(u64, Request<'_>)>;
    /// The response to the request `next` returned with `tag`.
    fn complete(&mut self, tag: u64, resp: Response<'_>, t: &mut Tally);
    /// A frame not tied to a request (PUSH, RESYNC, connection ERROR).
    fn unsolicited(&mut self, resp: Response<'_>, t: &mut Tally) {
        if let Response::Error(e) = resp {
            t.error(format!("{:?}: {}", e.code, e.message));
        }
    }
    /// True when `next` will never propose another request.
    fn finished(&self) -> bool;
}

/// What a phase counted: operations (the workload's unit), payload bytes,
/// requests, errors and per-request latency.
pub struct Tally {
    pub ops: u64,
    pub payload_bytes: u64,
    pub requests: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub latency_us: Histogram<u64>,
}

impl Tally {
    pub fn new() -> Tally {
        Tally {
            ops: 0,
            payload_bytes: 0,
            requests: 0,
            errors: 0,
            error_samples: Vec::new(),
            // 3 significant digits from 1 us to an hour: about 200 KiB.
            latency_us: Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
                .expect("invariant: constant histogram bounds are valid"),
        }
    }

    pub fn error(&mut self, what: String) {
        self.errors += 1;
        self.keep_sample(what);
    }

    /// Keeps `what` if it is among the first `ERROR_SAMPLES_MAX` distinct
    /// errors.
    fn keep_sample(&mut self, what: String) {
        if self.error_samples.len() < ERROR_SAMPLES_MAX && !self.error_samples.contains(&what) {
            self.error_samples.push(what);
        }
    }

    /// Records an error response as an error; true if it was one.
    pub fn check(&mut self, resp: &Response<'_>, what: &str) -> bool {
        if let Response::Error(e) = resp {
            self.error(format!("{what}: {:?}: {}", e.code, e.message));
            true
        } else {
            false
        }
    }

    /// Counts an answer the workload did not ask for as an error: an ERROR
    /// with its code, anything else as unexpected.
    pub fn unexpected(&mut self, resp: &Response<'_>, what: &str) {
        if !self.check(resp, what) {
            self.error(format!("unexpected answer to {what}"));
        }
    }

    /// A SEND's answer: its `(msg_id, duplicate)`, counted as one operation
    /// of `size` payload bytes; any other answer is counted as an error.
    pub fn sent(&mut self, resp: &Response<'_>, size: u64) -> Option<(u64, bool)> {
        match *resp {
            Response::Send {
                msg_id, duplicate, ..
            } => {
                self.ops += 1;
                self.payload_bytes += size;
                Some((msg_id, duplicate))
            }
            ref r => {
                self.unexpected(r, "SEND");
                None
            }
        }
    }

    /// Takes a page of records that must continue `last` densely (ids
    /// `last + 1`, `last + 2`, ...), each counted as an operation with its
    /// payload bytes. Returns the last id taken and, if the page broke the
    /// sequence, the id that broke it (the page ends there). A record that
    /// fails its checks is counted as an error (`what: ...`) and ends the
    /// page.
    pub fn take_dense(
        &mut self,
        records: &Records<'_>,
        last: u64,
        what: &str,
    ) -> (u64, Option<u64>) {
        let mut last = last;
        for r in records.iter(true) {
            match r {
                Ok(r) if r.msg_id() == last + 1 => {
                    last += 1;
                    self.ops += 1;
                    self.payload_bytes += r.payload().len() as u64;
                }
                Ok(r) => return (last, Some(r.msg_id())),
                Err(e) => {
                    self.error(format!("{what}: {e}"));
                    break;
                }
            }
        }
        (last, None)
    }

    pub fn record_latency(&mut self, us: u64) {
        // Saturate rather than fail: a value past an hour is still counted.
        let _ = self.latency_us.record(us.clamp(1, LATENCY_US_MAX));
    }

    pub fn merge(&mut self, other: &Tally) {
        self.ops += other.ops;
        self.payload_bytes += other.payload_bytes;
        self.requests += other.requests;
        self.errors += other.errors;
        for s in &other.error_samples {
            self.keep_sample(s.clone());
        }
        let _ = self.latency_us.add(&other.latency_us);
    }
}

impl Default for Tally {
    fn default() -> Self {
        Tally::new()
    }
}

/// How a phase runs.
pub struct PhaseConfig<'a> {
    /// Shown on the progress line.
    pub label: &'a str,
    /// Unit of the progress line ("sends", "deliveries", ...).
    pub unit: &'a str,
    pub in_flight: usize,
    /// Stop proposing new requests at this instant (requests in flight
    /// still complete).
    pub deadline: Option<Instant>,
    pub progress: bool,
    /// A connection the node closed (or that failed) ends that
    /// connection's share of the phase instead of failing it: the
    /// population workload's load under which the node is killed. Requests
    /// in flight then are left unanswered, and `cut_short` is set.
    pub until_disconnect: bool,
}

/// The outcome of a phase: the jobs (holding what verification needs),
/// their merged tally, and the wall time.
pub struct PhaseResult<J> {
    pub jobs: Vec<J>,
    pub tally: Tally,
    pub elapsed: Duration,
    /// True when the deadline stopped the phase before the jobs finished.
    pub cut_short: bool,
}

/// Runs `jobs[i]` on `conns[i]`, one thread each, until every job is
/// finished (or the deadline passed) and nothing is in flight.
pub fn run_phase<J: Job>(
    conns: &mut [Conn],
    jobs: Vec<J>,
    cfg: &PhaseConfig<'_>,
) -> Result<PhaseResult<J>, String> {
    if jobs.len() > conns.len() {
        return Err(format!(
            "{} jobs for {} connections",
            jobs.len(),
            conns.len()
        ));
    }
    let ops = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let cut_short = AtomicBool::new(false);
    let start = Instant::now();
    let results: Vec<Result<(J, Tally), String>> = std::thread::scope(|s| {
        let progress = cfg
            .progress
            .then(|| s.spawn(|| Progress::new(cfg.label, cfg.unit).run(&ops, &stop)));
        let handles: Vec<_> = conns
            .iter_mut()
            .zip(jobs)
            .map(|(conn, job)| {
                let (ops, cut_short) = (&ops, &cut_short);
                s.spawn(move || drive(conn, job, cfg, ops, cut_short))
            })
            .collect();
        let results = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a load thread panicked".to_string()))
            })
            .collect();
        stop.store(true, Ordering::Relaxed);
        if let Some(p) = progress {
            let _ = p.join();
        }
        results
    });
    let elapsed = start.elapsed();
    let mut tally = Tally::new();
    let mut out = Vec::with_capacity(results.len());
    for r in results {
        let (job, t) = r?;
        tally.merge(&t);
        out.push(job);
    }
    Ok(PhaseResult {
        jobs: out,
        tally,
        elapsed,
        cut_short: cut_short.load(Ordering::Relaxed),
    })
}

fn drive<J: Job>(
    conn: &mut Conn,
    mut job: J,
    cfg: &PhaseConfig<'_>,
    ops: &AtomicU64,
    cut_short: &AtomicBool,
) -> Result<(J, Tally), String> {
    let window = cfg
        .in_flight
        .clamp(1, conn.requests_in_flight_max.max(1) as usize);
    let mut tally = Tally::new();
    let mut in_flight: HashMap<u64, (Instant, u64)> = HashMap::with_capacity(window * 2);
    let mut reported = 0u64;
    let mut stopped = false;
    loop {
        if !stopped && cfg.deadline.is_some_and(|d| Instant::now() >= d) {
            stopped = true;
            if !job.finished() {
                cut_short.store(true, Ordering::Relaxed);
            }
        }
        if !stopped && in_flight.len() < window {
            let now = Instant::now();
            while in_flight.len() < window {
                let Some((tag, req)) = job.next() else { break };
                let id = conn.queue(&req)?;
                in_flight.insert(id, (now, tag));
                tally.requests += 1;
            }
            if let Err(e) = conn.flush() {
                if cfg.until_disconnect {
                    cut_short.store(true, Ordering::Relaxed);
                    break;
                }
                return Err(e);
            }
        }
        if in_flight.is_empty() {
            if stopped || job.finished() {
                break;
            }
            return Err(format!("{}: a connection's job stalled", cfg.label));
        }
        let mut lost = None;
        let read = conn.read_some(&mut |id, resp| {
            if id == 0 {
                job.unsolicited(resp, &mut tally);
                return;
            }
            match in_flight.remove(&id) {
                Some((t0, tag)) => {
                    tally.record_latency(t0.elapsed().as_micros() as u64);
                    job.complete(tag, resp, &mut tally);
                }
                None => lost = Some(id),
            }
        });
        if let Err(e) = read {
            if cfg.until_disconnect {
                cut_short.store(true, Ordering::Relaxed);
                break;
            }
            return Err(format!(
                "{}: {e} ({} requests in flight)",
                cfg.label,
                in_flight.len()
            ));
        }
        if let Some(id) = lost {
            return Err(format!("{}: response to unknown request {id}", cfg.label));
        }
        ops.fetch_add(tally.ops - reported, Ordering::Relaxed);
        reported = tally.ops;
    }
    Ok((job, tally))
}

/// Splits `0..n` into `parts` contiguous ranges of nearly equal size.
pub fn split(n: u64, parts: usize) -> Vec<std::ops::Range<u64>> {
    let parts = parts.max(1) as u64;
    (0..parts)
        .map(|i| (n * i / parts)..(n * (i + 1) / parts))
        .collect()
}
