//! A logical connection to a node that outlives its TCP connections:
//! connects lazily, reconnects after a failure with exponential backoff
//! (with jitter, capped), and retries idempotent requests until they succeed,
//! fail for a reason a retry cannot change, or the retry budget runs out.

use std::time::{Duration, Instant};

use super::error::{classify, Class, Ctx, Error};
use crate::client::{later, Client, ClientConfig, ClientError};

/// Exponential backoff: `base * 2^k`, capped at `max`, each delay drawn
/// uniformly from its upper half so that clients cut off together do not
/// come back together.
#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    attempt: u32,
    rng: u64,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Backoff {
        Backoff::seeded(base, max, super::random_u64())
    }

    /// A backoff whose jitter is drawn from `seed`: the same seed gives the
    /// same delays (tests).
    pub(crate) fn seeded(base: Duration, max: Duration, seed: u64) -> Backoff {
        Backoff {
            base,
            max: max.max(base),
            attempt: 0,
            // xorshift never leaves 0; an odd state is never 0.
            rng: seed | 1,
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let exp = self.base.saturating_mul(1u32 << self.attempt.min(20));
        let d = exp.min(self.max);
        self.attempt = self.attempt.saturating_add(1);
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let half = d / 2;
        let nanos = half.as_nanos().min(u64::MAX as u128) as u64;
        half + Duration::from_nanos(self.rng % nanos.saturating_add(1))
    }

    pub(crate) fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// Counters of a link.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Connections established (handshake done).
    pub connects: u64,
    /// Connections established after the first: recoveries from a failure.
    pub reconnects: u64,
    /// Connection attempts that failed.
    pub connect_failures: u64,
    /// Connections dropped because they failed (closed, timed out, garbage).
    pub broken: u64,
    /// NOT_LEADER answers followed to the leader a CLUSTER request named
    /// (format-spec/protocol.md 4.31, 4.32).
    pub redirects: u64,
}

pub(crate) struct Link {
    /// Its `addr` is the node connected to (or tried) now.
    config: ClientConfig,
    /// The other members of the node's replica set, tried in turn when the
    /// node cannot be reached: [`ReliableConfig::members`](super::ReliableConfig)
    /// at first, then what CLUSTER answered. Empty for a single node.
    others: Vec<String>,
    client: Option<Client>,
    backoff: Backoff,
    generation: u64,
    stats: LinkStats,
}

impl Link {
    pub(crate) fn new(config: ClientConfig, backoff_base: Duration, backoff_max: Duration) -> Link {
        Link {
            config,
            others: Vec::new(),
            client: None,
            backoff: Backoff::new(backoff_base, backoff_max),
            generation: 0,
            stats: LinkStats::default(),
        }
    }

    /// The other members of a replica set to try (module docs of `others`).
    pub(crate) fn with_members(mut self, members: &[String]) -> Link {
        self.others = members
            .iter()
            .filter(|a| **a != self.config.addr)
            .cloned()
            .collect();
        self
    }

    /// The members of the replica set this link's node is in, learned from
    /// a cluster map: the others are tried when the node cannot be reached.
    pub(crate) fn set_members(&mut self, members: &[String]) {
        if !members.is_empty() {
            self.others = members
                .iter()
                .filter(|a| **a != self.config.addr)
                .cloned()
                .collect();
        }
    }

    /// Tries the next member of the replica set (if any) from now on.
    fn next_member(&mut self) {
        if self.others.is_empty() {
            return;
        }
        let next = self.others.remove(0);
        let current = std::mem::replace(&mut self.config.addr, next);
        self.others.push(current);
    }

    /// NOT_LEADER: asks the answering member (CLUSTER) who leads and where,
    /// drops the connection, and connects to the leader from now on; to
    /// the next member when no leader is known (the member may be cut off).
    /// One request; never fails (a failure is a broken connection).
    pub(crate) fn redirect(&mut self) {
        let map = self.client.as_mut().and_then(|c| c.cluster().ok());
        self.broken();
        self.stats.redirects += 1;
        let Some(map) = map else {
            self.next_member();
            return;
        };
        if !map.members.is_empty() {
            self.others = map
                .members
                .iter()
                .map(|(_, a)| a.clone())
                .filter(|a| *a != self.config.addr)
                .collect();
        }
        match map.leader_addr() {
            Some(leader) if leader != self.config.addr => {
                let leader = leader.to_string();
                self.others.retain(|a| *a != leader);
                let current = std::mem::replace(&mut self.config.addr, leader);
                self.others.push(current);
            }
            _ => self.next_member(),
        }
    }

    /// Counts connections: changes whenever a new one is established (the
    /// node then knows nothing of the old one's subscription).
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn stats(&self) -> LinkStats {
        self.stats
    }

    /// The current connection, without connecting.
    pub(crate) fn connected(&mut self) -> Option<&mut Client> {
        self.client.as_mut()
    }

    /// The current connection, connecting (with backoff between failed
    /// attempts) if there is none. Gives up at `deadline`.
    pub(crate) fn get(&mut self, deadline: Instant) -> Result<&mut Client, Error> {
        let mut attempts = 0u32;
        while self.client.is_none() {
            attempts += 1;
            match Client::connect(&self.config) {
                Ok(c) => {
                    self.generation += 1;
                    self.stats.connects += 1;
                    if self.stats.connects > 1 {
                        self.stats.reconnects += 1;
                    }
                    self.client = Some(c);
                }
                Err(e) => {
                    self.stats.connect_failures += 1;
                    match classify(&e) {
                        Class::Permanent { .. } => {
                            return Err(Error::from_client(e, Ctx::default(), attempts))
                        }
                        Class::Broken | Class::Busy | Class::Redirect => {
                            // An unreachable node: maybe its replica set's
                            // next member leads now.
                            self.next_member();
                            if !self.pause(deadline) {
                                return Err(Error::from_client(e, Ctx::default(), attempts));
                            }
                        }
                    }
                }
            }
        }
        match self.client.as_mut() {
            Some(c) => Ok(c),
            // invariant: the loop above ends only with a connection.
            None => Err(Error::Unavailable {
                attempts,
                cause: "no connection".into(),
            }),
        }
    }

    /// Drops the connection after a failure; the next `get` reconnects.
    pub(crate) fn broken(&mut self) {
        if let Some(c) = self.client.take() {
            c.cut();
            self.stats.broken += 1;
        }
    }

    /// Cuts the connection on purpose (fault injection), as a network
    /// failure would: responses not read yet are lost with it, and requests
    /// in flight on it have unknown outcome.
    pub(crate) fn cut(&mut self) {
        self.broken();
    }

    /// Drops the connection quietly (closing, not failing).
    pub(crate) fn close(&mut self) {
        self.client = None;
    }

    /// Sleeps the next backoff delay. When that delay would end past
    /// `deadline`, sleeps until the deadline instead and returns false: the
    /// caller gives up. Never returns false early: a caller that loops
    /// until its deadline (the sender's queue) would otherwise spin without
    /// any pause for the last delay's worth of its budget, hammering a node
    /// that is refusing (10,000 attempts in a second were seen).
    pub(crate) fn pause(&mut self, deadline: Instant) -> bool {
        let d = self.backoff.next_delay();
        let now = Instant::now();
        if later(now, d) > deadline {
            std::thread::sleep(deadline.saturating_duration_since(now));
            return false;
        }
        std::thread::sleep(d);
        true
    }

    /// An operation succeeded: the next failure starts backing off afresh.
    pub(crate) fn succeeded(&mut self) {
        self.backoff.reset();
    }

    /// Runs an idempotent request, retrying it on a new connection after a
    /// connection failure and after a back-off when the node is busy, for
    /// up to `budget`. A refusal (a request error) is returned at once.
    pub(crate) fn call<T>(
        &mut self,
        budget: Duration,
        ctx: Ctx,
        mut op: impl FnMut(&mut Client) -> Result<T, ClientError>,
    ) -> Result<T, Error> {
        let deadline = later(Instant::now(), budget);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let client = self.get(deadline)?;
            let e = match op(client) {
                Ok(v) => {
                    self.succeeded();
                    return Ok(v);
                }
                Err(e) => e,
            };
            match classify(&e) {
                Class::Permanent { drop_connection } => {
                    if drop_connection {
                        self.broken();
                    }
                    return Err(Error::from_client(e, ctx, attempts));
                }
                Class::Broken => self.broken(),
                Class::Busy => {}
                Class::Redirect => self.redirect(),
            }
            if !self.pause(deadline) {
                return Err(Error::from_client(e, ctx, attempts));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap_with_jitter_and_resets() {
        let base = Duration::from_millis(10);
        let max = Duration::from_millis(100);
        let mut b = Backoff::new(base, max);
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        for (k, d) in delays.iter().enumerate() {
            let full = (base * (1 << k)).min(max);
            assert!(*d >= full / 2 && *d <= full, "delay {k}: {d:?} vs {full:?}");
        }
        b.reset();
        assert!(b.next_delay() <= base);
    }

    #[test]
    fn the_backoff_schedule_is_exponential_capped_and_jittered_by_its_seed() {
        let (base, max) = (Duration::from_millis(20), Duration::from_millis(500));
        let schedule = |seed| {
            let mut b = Backoff::seeded(base, max, seed);
            (0..10).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        let a = schedule(42);
        assert_eq!(a, schedule(42), "one seed, one schedule");
        assert_ne!(a, schedule(7), "another seed, other jitter");
        // Delay k lies in the upper half of min(base * 2^k, max).
        let caps = [20, 40, 80, 160, 320, 500, 500, 500, 500, 500];
        for (k, (d, cap)) in a.iter().zip(caps).enumerate() {
            let cap = Duration::from_millis(cap);
            assert!(*d >= cap / 2 && *d <= cap, "delay {k}: {d:?}, cap {cap:?}");
        }
        // A budget of 2 s holds a handful of attempts, not thousands.
        let mut spent = Duration::ZERO;
        let attempts = a
            .iter()
            .take_while(|d| {
                spent += **d;
                spent <= Duration::from_secs(2)
            })
            .count();
        assert!((5..=10).contains(&attempts), "{attempts} attempts in 2 s");
    }

    #[test]
    fn a_pause_that_would_overrun_the_deadline_waits_for_it_and_gives_up() {
        // The first delay (at least 500 ms) is longer than the budget left.
        let mut link = Link::new(
            ClientConfig::new("127.0.0.1:1"),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let deadline = Instant::now() + Duration::from_millis(30);
        assert!(!link.pause(deadline));
        // Giving up before the deadline made callers that loop until their
        // deadline spin without pausing.
        assert!(Instant::now() >= deadline, "gave up before the deadline");
    }

    #[test]
    fn an_unreachable_node_is_unavailable_once_the_budget_is_spent() {
        // A port nobody listens on: bind, learn the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let mut link = Link::new(
            ClientConfig::new(format!("127.0.0.1:{port}")),
            Duration::from_millis(5),
            Duration::from_millis(20),
        );
        let start = Instant::now();
        let err = link
            .call(Duration::from_millis(200), Ctx::default(), |c| c.ping())
            .unwrap_err();
        assert!(
            matches!(err, Error::Unavailable { attempts, .. } if attempts >= 1),
            "{err}"
        );
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(link.stats().connect_failures >= 2, "{:?}", link.stats());
    }
}
