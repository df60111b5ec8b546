//! `tidemark demo`: a scripted session that shows the delivery guarantees
//! end to end, and checks them.
//!
//! One group, five members. alice sends (her own messages count as read by
//! her: the node moves a caught-up sender's cursor); bob and carol are
//! online (subscribed), dave and erin are offline. Then:
//!
//! 1. alice sends a first batch while dave and erin are offline.
//! 2. alice pipelines a second batch and her connection is cut before the
//!    answers arrive: she reconnects and retransmits every send with its
//!    `client_msg_id`; the node answers `duplicate` for those it had stored.
//!    carol's connection is cut before her (lazy) batch ACK went out: she
//!    reconnects, resubscribes and catches up by pulling; that pull carries
//!    the pending ACK (`ack_up_to`), so the node does not re-send it.
//! 3. erin comes online (subscribe, catch up); alice sends a third batch.
//! 4. dave comes online and pulls page by page, each request acknowledging
//!    the previous page; he "crashes" before acknowledging the last page
//!    and pulls again with the marks he persisted: the node re-sends the
//!    last page, his filter drops it.
//!
//! Before that, on a second group of alice and bob, the six packets of one
//! message are printed as they go (the seeds' flow): `msg:R` (alice's
//! SEND), `msg:A` (its answer, once durable), `msg:N` (the PUSH to bob),
//! `ack:R` (bob's ACK), `ack:A` (its answer) and `ack:N` (the RECEIPT that
//! tells alice bob has it; format-spec/protocol.md 4.22). At the end,
//! alice's client library (`Receipts`) reports how many members have her
//! last message.
//!
//! Each member's application counts what it received. The demo prints, per
//! member, delivered / expected / duplicates (N / N / 0 when the system
//! works) and exits non-zero otherwise. Without `--addr` it runs a node
//! in-process on a temporary directory, removed at the end.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use tidemark_client::protocol::{JoinStart, Subscription};
use tidemark_client::reliable::ClientMsgIds;
use tidemark_client::{
    Client, ClientConfig, Event, Inbox, Message, Receipts, ReliableClient, ReliableConfig,
};
use tidemark_node::{NodeConfig, Shutdown};

use crate::token_file::read_token_file;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Use this running node instead of starting one in-process (the demo
    /// then uses a fresh random group id and user ids).
    #[arg(long)]
    pub addr: Option<String>,
    /// File holding the node's token (with --addr).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Messages alice sends in each of the three batches.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub messages: u64,
}

/// What one member's application saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberReport {
    pub name: &'static str,
    pub user: u64,
    /// Distinct messages of the group the application received.
    pub delivered: u64,
    /// Messages alice was told were stored.
    pub expected: u64,
    /// Messages the application received more than once (extra copies).
    pub duplicates: u64,
    /// Received messages whose bytes differ from what alice sent.
    pub mismatched: u64,
    /// Copies the client library's dedup filter dropped before the
    /// application saw them.
    pub dropped_by_filter: u64,
    /// The member's cursor after closing (should be the head).
    pub cursor: u64,
}

impl MemberReport {
    pub fn ok(&self) -> bool {
        self.delivered == self.expected && self.duplicates == 0 && self.mismatched == 0
    }
}

#[derive(Clone, Debug)]
pub struct DemoReport {
    pub node: String,
    pub in_process: bool,
    pub group: u64,
    /// Sends alice was told succeeded.
    pub sent: u64,
    /// The group's head at the end: messages stored.
    pub head: u64,
    /// Sends transmitted again after the cut (same client_msg_id).
    pub retransmits: u64,
    /// Of those, how many the node answered `duplicate` (stored once).
    pub duplicate_answers: u64,
    pub members: Vec<MemberReport>,
    /// The six packets of one message, one line each (msg:R .. ack:N).
    pub flow: Vec<String>,
    /// Members at or above alice's last message, as her client library's
    /// receipts report it (every member, alice included, when all is well).
    pub last_delivered: u64,
    pub member_count: u64,
    pub narrative: Vec<String>,
}

impl DemoReport {
    /// Every member got every message once, the group stores each send
    /// once, and every cursor reached the head (the last batch ACK went out
    /// on close).
    pub fn ok(&self) -> bool {
        self.head == self.sent
            && self.members.iter().all(|m| m.ok() && m.cursor == self.head)
            && self.flow.len() == 6
            && self.last_delivered == self.member_count
    }

    pub fn to_json(&self) -> Value {
        json!({
            "node": self.node,
            "in_process": self.in_process,
            "group": self.group,
            "sent": self.sent,
            "head": self.head,
            "retransmits": self.retransmits,
            "duplicate_answers": self.duplicate_answers,
            "flow": self.flow,
            "last_delivered": self.last_delivered,
            "member_count": self.member_count,
            "ok": self.ok(),
            "members": self.members.iter().map(|m| json!({
                "user": m.user,
                "name": m.name,
                "delivered": m.delivered,
                "expected": m.expected,
                "duplicates": m.duplicates,
                "mismatched": m.mismatched,
                "dropped_by_filter": m.dropped_by_filter,
                "cursor": m.cursor,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for line in &self.narrative {
            s.push_str(line);
            s.push('\n');
        }
        s.push_str(&format!(
            "ack:N    alice's last message is delivered to {} of {} members (her client library's receipts)\n",
            self.last_delivered, self.member_count
        ));
        s.push('\n');
        s.push_str("member  user                  delivered / expected / duplicates   (dropped by dedup filter, cursor)\n");
        for m in &self.members {
            let mark = if m.ok() && m.cursor == self.head {
                ""
            } else {
                "   <-- FAILED"
            };
            s.push_str(&format!(
                "{:<7} {:<20}  {:>9} / {:>8} / {:<10}   ({} dropped, cursor {}){mark}\n",
                m.name,
                m.user,
                m.delivered,
                m.expected,
                m.duplicates,
                m.dropped_by_filter,
                m.cursor
            ));
            if m.mismatched > 0 {
                s.push_str(&format!(
                    "        {} message(s) with bytes different from what was sent\n",
                    m.mismatched
                ));
            }
        }
        s.push('\n');
        s.push_str(
            "dropped: copies that reached the client twice (pushed and pulled, re-sent after a lost ACK)\n         and that its dedup filter removed before the application saw them\n",
        );
        s.push('\n');
        if self.ok() {
            s.push_str(&format!(
                "OK: every member received all {} messages exactly once; the group stores each once (head {}); alice heard every delivery.\n",
                self.sent, self.head
            ));
        } else {
            s.push_str(&format!(
                "FAILED: a member is short, saw a duplicate or is not acknowledged to the head, the group stores {} messages for {} sends, or alice's receipts are short ({} of {}).\n",
                self.head, self.sent, self.last_delivered, self.member_count
            ));
        }
        s
    }
}

/// The `tidemark demo` subcommand.
pub fn run_cli(a: DemoArgs) -> Result<(), String> {
    let token = match &a.token_file {
        Some(p) => Some(read_token_file(p)?),
        None => None,
    };
    let report = run(a.addr.clone(), token, a.messages)?;
    let text = if a.json {
        format!("{}\n", report.to_json())
    } else {
        report.to_text()
    };
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing output: {e}"))?;
    if report.ok() {
        Ok(())
    } else {
        Err("demo failed: see the member table".into())
    }
}

/// A node running on a thread of this process, on a temporary directory;
/// shut down and removed on drop.
struct LocalNode {
    addr: SocketAddr,
    dir: PathBuf,
    shutdown: Option<Shutdown>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl LocalNode {
    fn start() -> Result<LocalNode, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let dir =
            std::env::temp_dir().join(format!("tidemark-demo-{}-{nanos}", std::process::id()));
        let mut config = NodeConfig::new(&dir);
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("demo-node".into())
            .spawn(move || {
                tidemark_node::serve(config, move |addr, shutdown| {
                    let _ = tx.send((addr, shutdown));
                })
            })
            .map_err(|e| format!("start the node thread: {e}"))?;
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok((addr, shutdown)) => Ok(LocalNode {
                addr,
                dir,
                shutdown: Some(shutdown),
                thread: Some(thread),
            }),
            Err(_) => {
                let why = match thread.join() {
                    Ok(Err(e)) => e,
                    _ => "the node did not start".into(),
                };
                let _ = std::fs::remove_dir_all(&dir);
                Err(format!("in-process node: {why}"))
            }
        }
    }
}

impl Drop for LocalNode {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            s.request();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One member's application: what it received, by msg_id.
struct App {
    name: &'static str,
    user: u64,
    group: u64,
    /// msg_id -> (times received, payload)
    received: BTreeMap<u64, (u64, Vec<u8>)>,
    dropped_by_filter: u64,
}

impl App {
    fn new(name: &'static str, user: u64, group: u64) -> App {
        App {
            name,
            user,
            group,
            received: BTreeMap::new(),
            dropped_by_filter: 0,
        }
    }

    fn take(&mut self, m: Message) {
        if m.group != self.group {
            return;
        }
        let e = self.received.entry(m.msg_id).or_insert((0, m.payload));
        e.0 += 1;
    }

    fn distinct(&self) -> u64 {
        self.received.len() as u64
    }

    /// Reads the inbox until the app has `want` messages (or `limit`
    /// passes), then keeps reading until it is quiet, so that a late
    /// duplicate would be seen and counted.
    fn drain(&mut self, inbox: &mut Inbox, want: u64, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        while self.distinct() < want && Instant::now() < deadline {
            if let Some(m) = inbox
                .next(Duration::from_millis(100))
                .map_err(|e| format!("{}: {e}", self.name))?
            {
                self.take(m);
            }
        }
        while let Some(m) = inbox
            .next(Duration::from_millis(150))
            .map_err(|e| format!("{}: {e}", self.name))?
        {
            self.take(m);
        }
        Ok(())
    }

    fn close(&mut self, inbox: Inbox) -> Result<(), String> {
        let stats = inbox.close().map_err(|e| format!("{}: {e}", self.name))?;
        self.dropped_by_filter += stats.duplicates_dropped;
        Ok(())
    }

    fn report(&self, sent: &HashMap<u64, Vec<u8>>, cursor: u64) -> MemberReport {
        let mut mismatched = 0;
        let mut duplicates = 0;
        let mut delivered = 0;
        for (id, (times, payload)) in &self.received {
            duplicates += times - 1;
            match sent.get(id) {
                Some(p) if p == payload => delivered += 1,
                _ => mismatched += 1,
            }
        }
        MemberReport {
            name: self.name,
            user: self.user,
            delivered,
            expected: sent.len() as u64,
            duplicates,
            mismatched,
            dropped_by_filter: self.dropped_by_filter,
            cursor,
        }
    }
}

/// Runs the demo against `addr`, or against a node started in-process.
pub fn run(
    addr: Option<String>,
    token: Option<Vec<u8>>,
    per_batch: u64,
) -> Result<DemoReport, String> {
    let local = match addr {
        Some(_) => None,
        None => Some(LocalNode::start()?),
    };
    let node_addr = match (&addr, &local) {
        (Some(a), _) => a.clone(),
        (None, Some(n)) => n.addr.to_string(),
        // invariant: `local` is Some whenever `addr` is None.
        (None, None) => return Err("no node".into()),
    };
    // A fresh node gets the small ids of the walkthrough; a shared node gets
    // random ones, so the demo cannot collide with data already there.
    let (group, user_base) = if local.is_some() {
        (1, 0)
    } else {
        let r = tidemark_client::reliable::random_u64() % 9_000_000 + 1_000_000;
        (r, r * 10)
    };
    let mut narrative = Vec::new();
    match &local {
        Some(n) => narrative.push(format!(
            "node     {} (in-process, data in {}, removed at exit)",
            n.addr,
            n.dir.display()
        )),
        None => narrative.push(format!("node     {node_addr}")),
    }

    let mut client = ClientConfig::new(node_addr.clone());
    client.token = token;
    client.client_name = "tidemark-demo".into();
    client.io_timeout = Duration::from_secs(5);
    let mut base = ReliableConfig::with_client(client);
    base.give_up_after_ms = 20_000;
    base.send_timeout_ms = 3_000;
    base.heartbeat_ms = 1_000;
    base.ack_every_messages = 5;
    base.ack_every_ms = 200;

    let alice = user_base + 1;
    let names = ["bob", "carol", "dave", "erin"];
    let users: Vec<u64> = (2..=5).map(|i| user_base + i).collect();
    let (bob, carol, dave, erin) = (users[0], users[1], users[2], users[3]);
    const CAROL: usize = 1;
    const DAVE: usize = 2;
    const ERIN: usize = 3;
    let mut apps: Vec<App> = names
        .iter()
        .zip(&users)
        .map(|(n, &u)| App::new(n, u, group))
        .collect();

    let mut admin = ReliableClient::connect(base.clone()).map_err(|e| e.to_string())?;
    admin.create_group(group).map_err(|e| e.to_string())?;
    for u in std::iter::once(alice).chain(users.iter().copied()) {
        admin
            .join(group, u, JoinStart::Head)
            .map_err(|e| e.to_string())?;
    }
    narrative.push(format!(
        "group    {group}: alice {alice} sends; bob {bob}, carol {carol}, dave {dave}, erin {erin} receive (all join at the head)"
    ));

    let flow = six_packets(&base.client, &mut admin, group + 1, alice, bob)?;
    narrative.push(format!(
        "the six packets of one message (group {}: alice and bob):",
        group + 1
    ));
    narrative.extend(flow.iter().map(|l| format!("  {l}")));

    let mut sender = ReliableClient::connect(base.clone()).map_err(|e| e.to_string())?;
    // msg_id -> payload of every send alice was told succeeded.
    let mut sent: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut n = 0u64;
    let mut next_payload = || {
        n += 1;
        format!("message {n} from alice").into_bytes()
    };

    // bob and carol are online; carol acknowledges lazily, so that the cut
    // of her connection loses every ACK.
    let mut lazy = base.clone();
    lazy.ack_every_messages = 1_000_000;
    lazy.ack_every_ms = 3_600_000;
    let mut inboxes: Vec<Option<Inbox>> = vec![
        Some(Inbox::new(base.clone(), bob)),
        Some(Inbox::new(lazy, carol)),
        None,
        None,
    ];
    for ib in inboxes.iter_mut().flatten() {
        ib.subscribe().map_err(|e| e.to_string())?;
    }
    let drain_limit = Duration::from_secs(20);
    let drain_online = |apps: &mut Vec<App>, inboxes: &mut Vec<Option<Inbox>>, want: u64| {
        for (app, ib) in apps.iter_mut().zip(inboxes.iter_mut()) {
            if let Some(ib) = ib {
                app.drain(ib, want, drain_limit)?;
            }
        }
        Ok::<(), String>(())
    };

    // 1. dave and erin offline.
    for _ in 0..per_batch {
        send(&mut sender, group, alice, next_payload(), &mut sent)?;
    }
    drain_online(&mut apps, &mut inboxes, sent.len() as u64)?;
    narrative.push(format!(
        "batch 1  alice sends {per_batch}: bob and carol (online) get them pushed; dave and erin are offline"
    ));

    // 2. Cut connections.
    let before = sender.stats();
    // client_msg_id -> payload until the answers say the msg_id.
    let mut pipelined: HashMap<u64, Vec<u8>> = HashMap::new();
    for _ in 0..per_batch {
        let payload = next_payload();
        let id = sender.enqueue(group, alice, payload.clone());
        pipelined.insert(id, payload);
    }
    // Let the node store and answer them, then cut before reading a byte.
    std::thread::sleep(Duration::from_millis(300));
    sender.cut_connection();
    if let Some(ib) = inboxes[CAROL].as_mut() {
        ib.cut_connection();
    }
    for o in sender.flush() {
        let s = o.result.map_err(|e| format!("alice: {e}"))?;
        let payload = pipelined.remove(&o.client_msg_id).unwrap_or_default();
        sent.insert(s.msg_id, payload);
    }
    let after = sender.stats();
    let retransmits = after.retransmits - before.retransmits;
    let duplicate_answers = after.duplicates - before.duplicates;
    drain_online(&mut apps, &mut inboxes, sent.len() as u64)?;
    narrative.push(format!(
        "batch 2  alice pipelines {per_batch} sends; her connection is cut before she reads the answers:"
    ));
    narrative.push(format!(
        "         she reconnects and retransmits {retransmits} with the same client_msg_id; the node answers duplicate for {duplicate_answers}"
    ));
    narrative.push(
        "         carol's connection is cut before her batch ACK went out: she reconnects, resubscribes and catches up\n         (the pull that catches her up carries the pending ACK as ack_up_to)"
            .to_string(),
    );

    // 3. erin comes online; batch 3.
    let mut erin_inbox = Inbox::new(base.clone(), erin);
    erin_inbox.subscribe().map_err(|e| e.to_string())?;
    inboxes[ERIN] = Some(erin_inbox);
    for _ in 0..per_batch {
        send(&mut sender, group, alice, next_payload(), &mut sent)?;
    }
    drain_online(&mut apps, &mut inboxes, sent.len() as u64)?;
    narrative.push(format!(
        "batch 3  erin comes online and catches up; alice sends {per_batch} more"
    ));

    // 4. dave comes online: paged pull, crash before the last ACK, pull again.
    let mut paged = base.clone();
    paged.page_messages_max = 4;
    let mut dave_inbox = Inbox::new(paged.clone(), dave);
    let mut pages = 0;
    loop {
        let page = dave_inbox.pull(group).map_err(|e| format!("dave: {e}"))?;
        pages += 1;
        for m in page.messages {
            apps[DAVE].take(m);
        }
        if !page.has_more {
            break;
        }
    }
    let marks = dave_inbox.marks();
    apps[DAVE].dropped_by_filter += dave_inbox.abandon().duplicates_dropped;
    let mut dave_again = Inbox::with_marks(paged, dave, marks);
    let again = dave_again
        .pull_all(group)
        .map_err(|e| format!("dave: {e}"))?;
    for m in again {
        apps[DAVE].take(m);
    }
    apps[DAVE].close(dave_again)?;
    narrative.push(format!(
        "dave     comes online and pulls {pages} pages of 4, each request acknowledging the previous page;"
    ));
    narrative.push(
        "         he crashes before acknowledging the last page and pulls again: the node sends it again"
            .to_string(),
    );

    for (app, ib) in apps.iter_mut().zip(inboxes.iter_mut()) {
        if let Some(ib) = ib.take() {
            app.close(ib)?;
        }
    }

    // ack:N through the client library: alice follows her last message.
    let last = sent.keys().copied().max().unwrap_or(0);
    let mut receipts = Receipts::new(base.clone(), alice);
    receipts.track(group, last);
    let deadline = Instant::now() + drain_limit;
    let member_count = 1 + users.len() as u64;
    while receipts.delivered(group, last).unwrap_or(0) < member_count && Instant::now() < deadline {
        receipts
            .next(Duration::from_millis(200))
            .map_err(|e| format!("alice's receipts: {e}"))?;
    }
    let last_delivered = receipts.delivered(group, last).unwrap_or(0);

    // The node's view: the head, and each member's cursor.
    let mut head = 0;
    let mut cursors = Vec::new();
    for &u in &users {
        let st = admin.unread(u).map_err(|e| e.to_string())?;
        let g = st.iter().find(|g| g.group == group);
        head = head.max(g.map_or(0, |g| g.head));
        cursors.push(g.map_or(0, |g| g.cursor));
    }
    let members = apps
        .iter()
        .zip(cursors)
        .map(|(a, c)| a.report(&sent, c))
        .collect();
    Ok(DemoReport {
        node: node_addr,
        in_process: local.is_some(),
        group,
        sent: sent.len() as u64,
        head,
        retransmits,
        duplicate_answers,
        members,
        flow,
        last_delivered,
        member_count,
        narrative,
    })
}

/// The seeds' six packets of one message, on their own group of alice and
/// bob, over raw connections so that each packet is seen: alice subscribes
/// to the group's receipts and bob to its messages first, then alice sends
/// (`msg:R`, answered `msg:A` once durable), the node pushes it to bob
/// (`msg:N`), bob acknowledges (`ack:R`, answered `ack:A`) and the node
/// tells alice (`ack:N`, a RECEIPT at the end of its receipt interval).
/// One line per packet.
fn six_packets(
    config: &ClientConfig,
    admin: &mut ReliableClient,
    group: u64,
    alice: u64,
    bob: u64,
) -> Result<Vec<String>, String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |e: tidemark_client::ClientError| format!("{what}: {e}")
    };
    admin.create_group(group).map_err(|e| e.to_string())?;
    for u in [alice, bob] {
        admin
            .join(group, u, JoinStart::Head)
            .map_err(|e| e.to_string())?;
    }
    let mut a = Client::connect(config).map_err(e("alice"))?;
    let mut b = Client::connect(config).map_err(e("bob"))?;
    a.subscribe_receipts(alice, &[group])
        .map_err(e("alice: SUBSCRIBE_RECEIPTS"))?;
    b.subscribe(Subscription::Groups(vec![group]))
        .map_err(e("bob: SUBSCRIBE"))?;
    let payload = b"hello bob";
    let client_msg_id = ClientMsgIds::new().next_id();
    let mut flow = vec![format!(
        "msg:R  alice -> node   SEND group {group}, sender {alice}, client_msg_id {client_msg_id:#x}, \"hello bob\""
    )];
    let sent = a
        .send(group, alice, client_msg_id, payload)
        .map_err(e("alice: SEND"))?;
    flow.push(format!(
        "msg:A  node -> alice   SEND ok: msg_id {} (answered once durable)",
        sent.msg_id
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    let pushed = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("bob: no PUSH of the message".into());
        }
        if let Some(Event::Push(msgs)) = b.next_event(left).map_err(e("bob"))? {
            if let Some(m) = msgs.into_iter().find(|m| m.msg_id == sent.msg_id) {
                break m;
            }
        }
    };
    flow.push(format!(
        "msg:N  node -> bob     PUSH group {group}: msg_id {} \"{}\"",
        pushed.msg_id,
        String::from_utf8_lossy(&pushed.payload)
    ));
    flow.push(format!(
        "ack:R  bob -> node     ACK group {group}, user {bob}, msg_id {}",
        pushed.msg_id
    ));
    let acked_at = Instant::now();
    let cursor = b.ack(group, bob, pushed.msg_id).map_err(e("bob: ACK"))?;
    flow.push(format!("ack:A  node -> bob     ACK ok: cursor {cursor}"));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("alice: no RECEIPT of bob's ACK".into());
        }
        if let Some(Event::Receipt { group: g, receipts }) =
            a.next_event(left).map_err(e("alice"))?
        {
            if let Some(r) = receipts
                .iter()
                .find(|r| g == group && r.user == bob && r.cursor >= sent.msg_id)
            {
                flow.push(format!(
                    "ack:N  node -> alice   RECEIPT group {group}: user {bob} at cursor {} (delivered), {} ms after the ACK",
                    r.cursor,
                    acked_at.elapsed().as_millis()
                ));
                return Ok(flow);
            }
        }
    }
}

fn send(
    sender: &mut ReliableClient,
    group: u64,
    user: u64,
    payload: Vec<u8>,
    sent: &mut HashMap<u64, Vec<u8>>,
) -> Result<(), String> {
    let s = sender
        .send(group, user, &payload)
        .map_err(|e| format!("alice: {e}"))?;
    sent.insert(s.msg_id, payload);
    Ok(())
}
