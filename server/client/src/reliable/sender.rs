//! The reliable client: the sender's pending queue with retransmits, and
//! every other request retried idempotently across reconnects.
//!
//! A SEND's life: [`ReliableClient::enqueue`] gives it a `client_msg_id`
//! and puts it in the pending queue (in enqueue order); the driver
//! transmits pending sends on the current connection, up to
//! `sends_in_flight_max` pipelined, and waits for responses. The send stays
//! pending until its response:
//!
//! - a success completes it with the `msg_id` (if the response says
//!   `duplicate`, an earlier copy had been stored: same `msg_id`);
//! - a lost connection, or no response within `send_timeout_ms`, makes the
//!   outcome unknown: the driver drops the connection, reconnects with
//!   backoff, and transmits the send again with the same `client_msg_id`;
//! - `OVERLOADED` / `TOO_MANY_REQUESTS_IN_FLIGHT`: back off, transmit again;
//! - any other refusal completes it with the typed error;
//! - after `give_up_after_ms` it completes with the node's refusal if the
//!   node was refusing it (nothing was stored), else with
//!   [`Error::Unavailable`]: the outcome is unknown; the caller may send it
//!   again later with [`ReliableClient::enqueue_with_id`] and the same id.
//!
//! Why a timeout drops the connection instead of retransmitting on it: the
//! node answers every request, so a request unanswered for seconds means
//! the path is stalled, and a copy sent on the same stalled connection would
//! wait behind the original. A new connection is a fresh path; a copy of the
//! original that still arrives on the old one is recognised by the node.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::error::{classify, Class, Ctx, Error};
use super::link::LinkStats;
use super::router::{Router, UNMAPPED, WRONG_SET_HOPS_MAX};
use super::{ClientMsgIds, ReliableConfig};
use crate::client::{later, parse_sent, ClientError, GroupState, Message, Page, Sent};
use tidemark_protocol::{GroupInfo, JoinStart, MemberEntry, Request, RetentionPolicy};

/// How one enqueued send ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendOutcome {
    pub group: u64,
    pub sender: u64,
    pub client_msg_id: u64,
    pub result: Result<Sent, Error>,
}

/// Counters of a [`ReliableClient`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Sends the node accepted (the application was told the `msg_id`).
    pub sent: u64,
    /// Sends that ended with an error.
    pub failed: u64,
    /// Transmissions after the first, with the same `client_msg_id`.
    pub retransmits: u64,
    /// Responses with `duplicate = true`: a retransmit of a send the node
    /// had already stored (so it was stored once).
    pub duplicates: u64,
    /// Waits for a SEND response that ran out (`send_timeout_ms`).
    pub timeouts: u64,
    pub link: LinkStats,
}

struct PendingSend {
    group: u64,
    sender: u64,
    client_msg_id: u64,
    payload: Vec<u8>,
    enqueued: Instant,
    transmissions: u32,
    /// Request id on the current connection, once transmitted on it.
    request: Option<u64>,
    sent_at: Instant,
    /// The last reason it is still pending, for `Unavailable`.
    last_failure: Option<String>,
    /// The node's busy refusal, when that was the last thing that happened
    /// to it: reported as such if the budget runs out.
    last_refusal: Option<Error>,
    /// Connection attempts that failed while it was pending.
    connect_attempts: u32,
    /// The set whose link `request` was transmitted on.
    route: u32,
    /// WRONG_SET answers followed for it.
    wrong_set_hops: u32,
}

pub struct ReliableClient {
    config: ReliableConfig,
    /// One link per replica set, and the cluster map (`router.rs`).
    router: Router,
    ids: ClientMsgIds,
    /// Pending sends by enqueue sequence number.
    pending: BTreeMap<u64, PendingSend>,
    next_seq: u64,
    /// (set, request id) -> sequence number, for each set's connection of
    /// generation `in_flight_gen[set]`.
    in_flight: HashMap<(u32, u64), u64>,
    in_flight_gen: HashMap<u32, u64>,
    done: BTreeMap<u64, SendOutcome>,
    stats: SenderStats,
}

impl ReliableClient {
    /// A client that connects on first use.
    pub fn new(config: ReliableConfig) -> ReliableClient {
        let router = Router::new(
            config.client.clone(),
            &config.members,
            Duration::from_millis(config.backoff_base_ms),
            Duration::from_millis(config.backoff_max_ms),
        );
        ReliableClient {
            config,
            router,
            ids: ClientMsgIds::new(),
            pending: BTreeMap::new(),
            next_seq: 0,
            in_flight: HashMap::new(),
            in_flight_gen: HashMap::new(),
            done: BTreeMap::new(),
            stats: SenderStats::default(),
        }
    }

    /// Connects now (retrying for `give_up_after_ms`), so that a wrong
    /// address or token is reported here.
    pub fn connect(config: ReliableConfig) -> Result<ReliableClient, Error> {
        let mut c = ReliableClient::new(config);
        let budget = c.config.give_up_after();
        c.router.link(UNMAPPED).get(later(Instant::now(), budget))?;
        Ok(c)
    }

    pub fn config(&self) -> &ReliableConfig {
        &self.config
    }

    pub fn stats(&self) -> SenderStats {
        SenderStats {
            link: self.router.stats(),
            ..self.stats
        }
    }

    /// Sends not yet answered.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Cuts the current connection as a network failure would: pending
    /// sends get no response on it and are retransmitted. For tests and
    /// `tidemark demo`.
    pub fn cut_connection(&mut self) {
        self.router.cut_all();
    }

    /// The cluster map the client routes by, once learned (after a
    /// WRONG_SET, or before a fan-out of UNREAD or SYNC); `None` while
    /// every request goes to the configured node.
    pub fn shard_map(&self) -> Option<&crate::client::ShardMap> {
        self.router.map()
    }

    /// Sends one message and waits for the node's answer, retransmitting
    /// as needed. Returns its `msg_id`.
    pub fn send(&mut self, group: u64, sender: u64, payload: &[u8]) -> Result<Sent, Error> {
        let id = self.ids.next_id();
        self.send_with_id(group, sender, id, payload)
    }

    /// [`send`](Self::send) with a caller-chosen `client_msg_id` (e.g. one
    /// persisted before a crash, to retransmit across process restarts).
    pub fn send_with_id(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        payload: &[u8],
    ) -> Result<Sent, Error> {
        let seq = self.push_pending(group, sender, client_msg_id, payload.to_vec());
        self.drive(|s| s.done.contains_key(&seq));
        match self.done.remove(&seq) {
            Some(o) => o.result,
            // invariant: drive returns only when `seq` is done or nothing is
            // pending, and `seq` was pending.
            None => Err(Error::Unavailable {
                attempts: 0,
                cause: "send lost from the pending queue".into(),
            }),
        }
    }

    /// Queues a send without waiting; returns its `client_msg_id`. Collect
    /// outcomes with [`next_outcome`](Self::next_outcome) or
    /// [`flush`](Self::flush).
    /// If a connection is up, the send is transmitted at once (within the
    /// window); this never waits to connect.
    pub fn enqueue(&mut self, group: u64, sender: u64, payload: Vec<u8>) -> u64 {
        let id = self.ids.next_id();
        self.enqueue_with_id(group, sender, id, payload);
        id
    }

    /// [`enqueue`](Self::enqueue) with a caller-chosen `client_msg_id`.
    pub fn enqueue_with_id(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        payload: Vec<u8>,
    ) {
        self.push_pending(group, sender, client_msg_id, payload);
        let key = self.router.route(group);
        if self.router.link(key).connected().is_some() {
            self.sync_generation(key);
            if !self.transmit(key) {
                self.connection_failed(key, "connection lost while sending");
            }
        }
    }

    /// A new connection of set `key` has nothing in flight: every pending
    /// send transmitted on its old one is to be transmitted again.
    fn sync_generation(&mut self, key: u32) {
        let generation = self.router.link(key).generation();
        if self.in_flight_gen.get(&key) != Some(&generation) {
            self.in_flight.retain(|(k, _), _| *k != key);
            self.in_flight_gen.insert(key, generation);
            for p in self.pending.values_mut() {
                if p.route == key {
                    p.request = None;
                }
            }
        }
    }

    /// The set a pending send is waited for on: the one it was transmitted
    /// to, else the one its group routes to now.
    fn key_of(&self, p: &PendingSend) -> u32 {
        if p.request.is_some() {
            p.route
        } else {
            self.router.route(p.group)
        }
    }

    /// A completed send (the earliest enqueued among those completed),
    /// driving the queue until one completes; `None` when nothing is
    /// pending or completed.
    pub fn next_outcome(&mut self) -> Option<SendOutcome> {
        if self.done.is_empty() {
            self.drive(|s| !s.done.is_empty());
        }
        self.done.pop_first().map(|(_, o)| o)
    }

    /// Drives the queue until every pending send completed; returns all
    /// outcomes not collected yet, in enqueue order.
    pub fn flush(&mut self) -> Vec<SendOutcome> {
        self.drive(|_| false);
        std::mem::take(&mut self.done).into_values().collect()
    }

    fn push_pending(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        payload: Vec<u8>,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let now = Instant::now();
        self.pending.insert(
            seq,
            PendingSend {
                group,
                sender,
                client_msg_id,
                payload,
                enqueued: now,
                transmissions: 0,
                request: None,
                sent_at: now,
                last_failure: None,
                last_refusal: None,
                connect_attempts: 0,
                route: UNMAPPED,
                wrong_set_hops: 0,
            },
        );
        seq
    }

    fn complete(&mut self, seq: u64, result: Result<Sent, Error>) {
        if let Some(p) = self.pending.remove(&seq) {
            if let Some(rid) = p.request {
                self.in_flight.remove(&(p.route, rid));
            }
            match &result {
                Ok(s) => {
                    self.stats.sent += 1;
                    if s.duplicate {
                        self.stats.duplicates += 1;
                    }
                }
                Err(_) => self.stats.failed += 1,
            }
            self.done.insert(
                seq,
                SendOutcome {
                    group: p.group,
                    sender: p.sender,
                    client_msg_id: p.client_msg_id,
                    result,
                },
            );
        }
    }

    /// Fails the sends pending for longer than the budget.
    fn expire(&mut self, now: Instant) {
        let budget = self.config.give_up_after();
        let old: Vec<(u64, Error)> = self
            .pending
            .iter()
            .filter(|(_, p)| now.duration_since(p.enqueued) >= budget)
            .map(|(&seq, p)| {
                let e = match &p.last_refusal {
                    Some(refusal) => refusal.clone().with_attempts(p.transmissions),
                    None => Error::Unavailable {
                        attempts: p.transmissions.saturating_add(p.connect_attempts),
                        cause: p
                            .last_failure
                            .clone()
                            .unwrap_or_else(|| "no answer".to_string()),
                    },
                };
                (seq, e)
            })
            .collect();
        for (seq, e) in old {
            self.complete(seq, Err(e));
        }
    }

    fn note_failure(&mut self, key: u32, why: &str) {
        for p in self.pending.values_mut() {
            if p.request.is_some() && p.route == key {
                p.last_failure = Some(why.to_string());
                p.last_refusal = None;
            }
        }
    }

    /// Set `key`'s connection failed: everything on it has unknown outcome.
    fn connection_failed(&mut self, key: u32, why: &str) {
        self.note_failure(key, why);
        self.router.link(key).broken();
    }

    /// The sending state machine; returns when `stop` holds or nothing is
    /// pending.
    fn drive(&mut self, stop: impl Fn(&Self) -> bool) {
        let send_timeout = Duration::from_millis(self.config.send_timeout_ms);
        let io_timeout = self.config.client.io_timeout;
        while !stop(self) && !self.pending.is_empty() {
            let now = Instant::now();
            self.expire(now);
            // The set of the oldest send is served first: its link is the
            // one transmitted on and waited on this turn (sends of other
            // sets wait; a response of theirs that comes late costs at most
            // a retransmit, which the node's dedup answers).
            let Some((oldest, key)) = self
                .pending
                .values()
                .min_by_key(|p| p.enqueued)
                .map(|p| (p.enqueued, self.key_of(p)))
            else {
                break;
            };
            let deadline = later(oldest, self.config.give_up_after());

            // A connection (new ones start with nothing in flight).
            if let Err(e) = self.router.link(key).get(deadline) {
                match e {
                    Error::Unavailable { attempts, cause } => {
                        // The oldest sends ran out of budget while the node
                        // was unreachable; `expire` fails them next round
                        // (with this cause, not this error wrapped in a
                        // second "node unavailable").
                        let router = &self.router;
                        for p in self.pending.values_mut() {
                            let mine = if p.request.is_some() {
                                p.route == key
                            } else {
                                router.route(p.group) == key
                            };
                            if mine {
                                p.last_failure = Some(cause.clone());
                                p.last_refusal = None;
                                p.connect_attempts = p.connect_attempts.saturating_add(attempts);
                            }
                        }
                        std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
                    }
                    refused => {
                        let seqs: Vec<u64> = self
                            .pending
                            .iter()
                            .filter(|(_, p)| self.key_of(p) == key)
                            .map(|(&seq, _)| seq)
                            .collect();
                        for seq in seqs {
                            self.complete(seq, Err(refused.clone()));
                        }
                    }
                }
                continue;
            }
            self.sync_generation(key);
            if !self.transmit(key) {
                self.connection_failed(key, "connection lost while sending");
                self.router.link(key).pause(deadline);
                continue;
            }
            if !self.in_flight.keys().any(|(k, _)| *k == key) {
                continue; // everything pending failed locally, or was re-routed
            }

            // Wait for one response, at most until the oldest in-flight send
            // times out.
            let oldest_sent = self
                .pending
                .values()
                .filter(|p| p.request.is_some() && p.route == key)
                .map(|p| p.sent_at)
                .min()
                .unwrap_or(now);
            let wait = later(oldest_sent, send_timeout)
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let Some(client) = self.router.link(key).connected() else {
                continue;
            };
            client.set_io_timeout(wait);
            let got = client.recv();
            client.set_io_timeout(io_timeout);
            match got {
                Ok(frame) => {
                    let rid = frame.request_id();
                    if rid == 0 {
                        // An ERROR about the connection (shutdown, overload).
                        if let Err(e) = frame.response() {
                            self.connection_failed(key, &e.to_string());
                            self.router.link(key).pause(deadline);
                        }
                        continue;
                    }
                    let Some(seq) = self.in_flight.remove(&(key, rid)) else {
                        continue; // not a send of ours: ignore
                    };
                    match parse_sent(&frame) {
                        Ok(sent) => {
                            self.router.link(key).succeeded();
                            self.complete(seq, Ok(sent));
                        }
                        Err(e) => self.send_failed(seq, e, deadline, key),
                    }
                }
                Err(ClientError::Timeout) => {
                    self.stats.timeouts += 1;
                    self.connection_failed(key, "no answer within send_timeout_ms");
                }
                Err(e) => {
                    self.connection_failed(key, &e.to_string());
                    self.router.link(key).pause(deadline);
                }
            }
        }
    }

    /// Transmits set `key`'s pending sends not yet sent on its connection,
    /// oldest first, up to the window. False when the connection failed.
    fn transmit(&mut self, key: u32) -> bool {
        let todo: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.request.is_none() && self.router.route(p.group) == key)
            .map(|(&seq, _)| seq)
            .collect();
        let mut in_flight = self.in_flight.keys().filter(|(k, _)| *k == key).count();
        let Some(client) = self.router.link(key).connected() else {
            return false;
        };
        let limits = client.limits();
        let window = self
            .config
            .sends_in_flight_max
            .min(limits.requests_in_flight_max as usize)
            .max(1);
        let mut too_large = Vec::new();
        let mut ok = true;
        for seq in todo {
            if in_flight >= window {
                break;
            }
            let Some(p) = self.pending.get_mut(&seq) else {
                continue;
            };
            if p.payload.len() > limits.payload_bytes_max as usize {
                too_large.push((seq, p.payload.len(), limits.payload_bytes_max));
                continue;
            }
            match client.submit(&Request::Send {
                group: p.group,
                sender: p.sender,
                client_msg_id: p.client_msg_id,
                payload: &p.payload,
            }) {
                Ok(rid) => {
                    if p.transmissions > 0 {
                        self.stats.retransmits += 1;
                    }
                    p.transmissions += 1;
                    p.request = Some(rid);
                    p.route = key;
                    p.sent_at = Instant::now();
                    self.in_flight.insert((key, rid), seq);
                    in_flight += 1;
                }
                Err(e) => {
                    p.last_failure = Some(e.to_string());
                    p.last_refusal = None;
                    ok = false;
                    break;
                }
            }
        }
        for (seq, payload_bytes, limit) in too_large {
            self.complete(
                seq,
                Err(Error::PayloadTooLarge {
                    payload_bytes,
                    limit: u64::from(limit),
                }),
            );
        }
        ok
    }

    fn send_failed(&mut self, seq: u64, e: ClientError, deadline: Instant, key: u32) {
        // The sender is the user a NOT_MEMBER names.
        let (group, sender) = self
            .pending
            .get(&seq)
            .map_or((0, 0), |p| (p.group, p.sender));
        let ctx = Ctx::member(group, sender);
        if e.wrong_set().is_some() {
            // Another set holds the group: learn the map from the refusing
            // node and transmit it again there (nothing was done here).
            let hops = self.pending.get_mut(&seq).map_or(u32::MAX, |p| {
                p.request = None;
                p.wrong_set_hops += 1;
                p.wrong_set_hops
            });
            if hops <= WRONG_SET_HOPS_MAX {
                let budget = deadline.saturating_duration_since(Instant::now());
                match self.router.learn(key, budget) {
                    Ok(()) => return,
                    Err(learned) => {
                        if let Some(p) = self.pending.get_mut(&seq) {
                            p.last_failure = Some(learned.to_string());
                        }
                        self.router.link(key).pause(deadline);
                        return;
                    }
                }
            }
        }
        match classify(&e) {
            Class::Permanent { drop_connection } => {
                let attempts = self.pending.get(&seq).map_or(0, |p| p.transmissions);
                if drop_connection {
                    self.connection_failed(key, &e.to_string());
                }
                self.complete(seq, Err(Error::from_client(e, ctx, attempts)));
            }
            Class::Busy => {
                if let Some(p) = self.pending.get_mut(&seq) {
                    p.request = None;
                    p.last_failure = Some(e.to_string());
                    p.last_refusal = Some(Error::from_client(e, ctx, 1));
                }
                // Backs off (with jitter) before the next transmission; at
                // the deadline `expire` reports the refusal.
                self.router.link(key).pause(deadline);
            }
            Class::Broken => {
                self.connection_failed(key, &e.to_string());
                self.router.link(key).pause(deadline);
            }
            Class::Redirect => {
                // Before the connection goes: the redirect asks on it.
                self.router.link(key).redirect();
                self.connection_failed(key, &e.to_string());
                self.router.link(key).pause(deadline);
            }
        }
    }

    /// A request about the node itself (PING, STATS, ...): to the
    /// configured node.
    fn call<T>(
        &mut self,
        ctx: Ctx,
        op: impl FnMut(&mut crate::client::Client) -> Result<T, ClientError>,
    ) -> Result<T, Error> {
        let budget = self.config.give_up_after();
        self.router.link(UNMAPPED).call(budget, ctx, op)
    }

    /// A request about `ctx.group`: to the set that holds it, following
    /// WRONG_SET (`Router::call`).
    fn call_group<T>(
        &mut self,
        ctx: Ctx,
        op: impl FnMut(&mut crate::client::Client) -> Result<T, ClientError>,
    ) -> Result<T, Error> {
        let budget = self.config.give_up_after();
        self.router.call(ctx.group, budget, ctx, op)
    }

    /// CLUSTER_MAP of the configured node (format-spec/protocol.md 4.33),
    /// and the client routes by it from now on.
    pub fn cluster_map(&mut self) -> Result<crate::client::ShardMap, Error> {
        let budget = self.config.give_up_after();
        let map = self
            .router
            .link(UNMAPPED)
            .call(budget, Ctx::default(), |c| c.cluster_map())?;
        self.router.adopt(UNMAPPED, map.clone());
        Ok(map)
    }

    /// PING, reconnecting as needed.
    pub fn ping(&mut self) -> Result<(), Error> {
        self.call(Ctx::default(), |c| c.ping())
    }

    /// CLUSTER: the replica set the node belongs to and its leader (every
    /// member answers; a single node answers node id 0 and no members).
    pub fn cluster(&mut self) -> Result<crate::client::ClusterMap, Error> {
        self.call(Ctx::default(), |c| c.cluster())
    }

    /// CREATE_GROUP. If the first attempt's answer was lost with its
    /// connection, the retry may report `GroupExists`; use
    /// [`ensure_group`](Self::ensure_group) when that does not matter.
    pub fn create_group(&mut self, group: u64) -> Result<(), Error> {
        self.call_group(Ctx::group(group), |c| c.create_group(group))
    }

    /// Creates the group unless it exists; true if this call created it.
    pub fn ensure_group(&mut self, group: u64) -> Result<bool, Error> {
        match self.create_group(group) {
            Ok(()) => Ok(true),
            Err(Error::GroupExists { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn delete_group(&mut self, group: u64) -> Result<(), Error> {
        self.call_group(Ctx::group(group), |c| c.delete_group(group))
    }

    /// JOIN (idempotent); returns the member's cursor.
    pub fn join(&mut self, group: u64, user: u64, start: JoinStart) -> Result<u64, Error> {
        self.call_group(Ctx::member(group, user), |c| c.join(group, user, start))
    }

    pub fn leave(&mut self, group: u64, user: u64) -> Result<(), Error> {
        self.call_group(Ctx::member(group, user), |c| c.leave(group, user))
    }

    /// One PULL page, without dedup (for tools; receivers use an
    /// [`Inbox`](super::Inbox)).
    pub fn pull_page(
        &mut self,
        group: u64,
        user: u64,
        ack_up_to: u64,
        max_count: u32,
        wait_ms: u32,
    ) -> Result<Page, Error> {
        self.call_group(Ctx::member(group, user), |c| {
            c.pull(group, user, ack_up_to, max_count, wait_ms)
        })
    }

    /// ACK; returns the cursor.
    pub fn ack(&mut self, group: u64, user: u64, msg_id: u64) -> Result<u64, Error> {
        self.call_group(Ctx::member(group, user), |c| c.ack(group, user, msg_id))
    }

    /// BATCH_ACK: per item, the cursor or the typed error. Items of groups
    /// of several replica sets are split into one BATCH_ACK per set (a
    /// node refuses a batch naming another set's group whole,
    /// format-spec/protocol.md 4.33); the results come back in item order.
    pub fn batch_ack(
        &mut self,
        user: u64,
        items: &[(u64, u64)],
    ) -> Result<Vec<Result<u64, Error>>, Error> {
        let budget = self.config.give_up_after();
        let mut results: Vec<Option<Result<u64, Error>>> = vec![None; items.len()];
        let mut hops = 0;
        loop {
            // The items still unanswered, by the set their group routes to.
            let mut by_set: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
            for (i, &(group, _)) in items.iter().enumerate() {
                if results[i].is_none() {
                    by_set.entry(self.router.route(group)).or_default().push(i);
                }
            }
            let Some((key, indices)) = by_set.into_iter().next() else {
                break;
            };
            let batch: Vec<(u64, u64)> = indices.iter().map(|&i| items[i]).collect();
            match self
                .router
                .link(key)
                .call(budget, Ctx::user(user), |c| c.batch_ack(user, &batch))
            {
                Ok(answers) => {
                    for (&i, r) in indices.iter().zip(answers) {
                        let group = items[i].0;
                        results[i] = Some(r.map_err(|code| {
                            Error::from_code(code, None, String::new(), Ctx::member(group, user))
                        }));
                    }
                }
                Err(refused @ Error::WrongSet { .. }) if hops < WRONG_SET_HOPS_MAX => {
                    hops += 1;
                    if self.router.learn(key, budget).is_err() {
                        return Err(refused);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(Error::Unavailable {
                        attempts: 0,
                        cause: "item not answered".into(),
                    })
                })
            })
            .collect())
    }

    /// UNREAD: every group of the user, ascending. In a cluster the
    /// client asks every replica set (each answers for the groups it
    /// holds) and merges the lists (format-spec/protocol.md 4.33).
    pub fn unread(&mut self, user: u64) -> Result<Vec<GroupState>, Error> {
        let budget = self.config.give_up_after();
        self.router.ensure_map(budget)?;
        let mut out = Vec::new();
        for key in self.router.sets() {
            out.extend(
                self.router
                    .link(key)
                    .call(budget, Ctx::user(user), |c| c.unread(user))?,
            );
        }
        out.sort_by_key(|g| g.group);
        Ok(out)
    }

    /// SYNC, continued until done: every group with unread messages and up
    /// to `per_group_max` of its records (0: counts only), ascending by
    /// group. In a cluster, each replica set's SYNC (continued until done)
    /// merged, as UNREAD.
    pub fn sync_all(
        &mut self,
        user: u64,
        per_group_max: u32,
        total_max_bytes: u32,
    ) -> Result<Vec<GroupState>, Error> {
        let budget = self.config.give_up_after();
        self.router.ensure_map(budget)?;
        let mut out = Vec::new();
        for key in self.router.sets() {
            let mut continuation = 0;
            loop {
                let (groups, next) = self.router.link(key).call(budget, Ctx::user(user), |c| {
                    c.sync(user, per_group_max, total_max_bytes, continuation)
                })?;
                out.extend(groups);
                // A node that repeats a continuation would loop forever.
                if next == 0 || next <= continuation {
                    break;
                }
                continuation = next;
            }
        }
        out.sort_by_key(|g| g.group);
        Ok(out)
    }

    /// HISTORY page: newest first, and whether older messages exist.
    pub fn history(
        &mut self,
        group: u64,
        user: u64,
        before_msg_id: u64,
        max_count: u32,
    ) -> Result<(Vec<Message>, bool), Error> {
        self.call_group(Ctx::member(group, user), |c| {
            c.history(group, user, before_msg_id, max_count)
        })
    }

    /// READ_COUNT: members whose cursor is at or above `msg_id` (with 0:
    /// every member).
    pub fn read_count(&mut self, group: u64, msg_id: u64) -> Result<u64, Error> {
        self.call_group(Ctx::group(group), |c| c.read_count(group, msg_id))
    }

    /// MEMBERS page: at most `max_count` members above `after_user` (0:
    /// from the first) with their cursors, ascending, and whether more
    /// remain.
    pub fn members(
        &mut self,
        group: u64,
        after_user: u64,
        max_count: u32,
    ) -> Result<(Vec<MemberEntry>, bool), Error> {
        self.call_group(Ctx::group(group), |c| {
            c.members(group, after_user, max_count)
        })
    }

    /// GROUP_INFO: head, retention floor, member count, retention policy.
    pub fn group_info(&mut self, group: u64) -> Result<GroupInfo, Error> {
        self.call_group(Ctx::group(group), |c| c.group_info(group))
    }

    /// SET_RETENTION: the group's retention policy (retried: setting the
    /// same policy again is harmless).
    pub fn set_retention(&mut self, group: u64, policy: RetentionPolicy) -> Result<(), Error> {
        self.call_group(Ctx::group(group), |c| c.set_retention(group, policy))
    }

    /// CLEAR_HISTORY: `(join_point, cursor)` of the member afterwards
    /// (retried: a clear only raises, so a repeat is harmless).
    pub fn clear_history(
        &mut self,
        group: u64,
        user: u64,
        up_to: u64,
    ) -> Result<(u64, u64), Error> {
        self.call_group(Ctx::member(group, user), |c| {
            c.clear_history(group, user, up_to)
        })
    }

    /// RECALL (protocol version 2) of message `target` of `group`, by its
    /// sender (or an admin sender of the node), waiting for the answer.
    /// Retried across reconnects with one `client_msg_id`, so the node
    /// stores it once whatever the retries (a retry of an accepted recall
    /// gets the original's answer, `duplicate` set). A refusal by the rules
    /// is [`Error::ChangeRefused`], not retried.
    pub fn recall(&mut self, group: u64, sender: u64, target: u64) -> Result<Sent, Error> {
        let id = self.ids.next_id();
        self.recall_with_id(group, sender, id, target)
    }

    /// [`recall`](Self::recall) with a caller-chosen `client_msg_id` (one
    /// persisted before a crash, to retransmit across process restarts).
    pub fn recall_with_id(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        target: u64,
    ) -> Result<Sent, Error> {
        self.call_group(Ctx::member(group, sender), |c| {
            c.recall(group, sender, client_msg_id, target)
        })
    }

    /// EDIT (protocol version 2): message `target`'s new payload, as
    /// [`recall`](Self::recall) (one `client_msg_id` for every retry).
    pub fn edit(
        &mut self,
        group: u64,
        sender: u64,
        target: u64,
        payload: &[u8],
    ) -> Result<Sent, Error> {
        let id = self.ids.next_id();
        self.edit_with_id(group, sender, id, target, payload)
    }

    /// [`edit`](Self::edit) with a caller-chosen `client_msg_id`.
    pub fn edit_with_id(
        &mut self,
        group: u64,
        sender: u64,
        client_msg_id: u64,
        target: u64,
        payload: &[u8],
    ) -> Result<Sent, Error> {
        self.call_group(Ctx::member(group, sender), |c| {
            c.edit(group, sender, client_msg_id, target, payload)
        })
    }

    /// HISTORY_LATEST (protocol version 2): a page of messages in their
    /// latest state, newest first; see [`crate::Client::history_latest`].
    pub fn history_latest(
        &mut self,
        group: u64,
        user: u64,
        before_msg_id: u64,
        max_count: u32,
    ) -> Result<(Vec<Message>, bool, u64), Error> {
        self.call_group(Ctx::member(group, user), |c| {
            c.history_latest(group, user, before_msg_id, max_count)
        })
    }

    /// The node's STATS.
    pub fn node_stats(&mut self) -> Result<Vec<(String, u64)>, Error> {
        self.call(Ctx::default(), |c| c.stats())
    }

    /// The node's INFO (an addition: see [`crate::Client::info`]).
    pub fn node_info(&mut self) -> Result<Vec<(String, String)>, Error> {
        self.call(Ctx::default(), |c| c.info())
    }

    /// The node's slow log (an addition: see [`crate::Client::slowlog`]).
    /// A retried reset may empty the log twice; the second list is what
    /// arrived in between.
    pub fn node_slowlog(
        &mut self,
        reset: bool,
        max_count: u32,
    ) -> Result<crate::SlowLogReport, Error> {
        self.call(Ctx::default(), |c| c.slowlog(reset, max_count))
    }
}

impl std::fmt::Debug for ReliableClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReliableClient")
            .field("addr", &self.config.client.addr)
            .field("pending", &self.pending.len())
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unreachable_config(budget_ms: u64) -> ReliableConfig {
        // A port nobody listens on: bind, learn the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let mut config = ReliableConfig::new(format!("127.0.0.1:{port}"));
        config.backoff_base_ms = 5;
        config.backoff_max_ms = 20;
        config.give_up_after_ms = budget_ms;
        config
    }

    #[test]
    fn a_send_to_an_unreachable_node_says_unavailable_once_with_the_cause() {
        let mut c = ReliableClient::new(unreachable_config(200));
        let err = c.send(1, 1, b"x").unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, Error::Unavailable { attempts, cause }
                if *attempts >= 1 && !cause.contains("unavailable")),
            "{text}"
        );
        assert_eq!(
            text.matches("node unavailable").count(),
            1,
            "one 'node unavailable', then the cause: {text}"
        );
    }

    #[test]
    fn an_invalid_address_fails_at_once_without_retries() {
        for addr in ["not an address", "no-such-host.invalid:7070"] {
            let mut config = unreachable_config(60_000);
            config.client.addr = addr.into();
            let start = Instant::now();
            let err = ReliableClient::connect(config.clone()).unwrap_err();
            assert!(matches!(err, Error::Address { .. }), "{addr}: {err}");
            assert!(err.to_string().contains(addr), "{err}");
            let mut c = ReliableClient::new(config);
            let err = c.send(1, 1, b"x").unwrap_err();
            assert!(matches!(err, Error::Address { .. }), "{addr}: {err}");
            // Not a timing bound: the 60 s budget was not spent retrying.
            assert!(start.elapsed() < Duration::from_secs(30), "{addr} retried");
        }
    }
}
