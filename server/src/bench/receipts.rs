//! The receipts workload (the seeds' `ack:N`): what receipts
//! cost in one large group. One group of `--members` members (100,000 by
//! default) and the W3 ACK storm run twice on the same node, with the same
//! plan and the same shape of work:
//!
//! 1. **baseline**: the storm with no receipt subscriber;
//! 2. **receipts**: `--receipt-subscribers` connections (4 by default)
//!    each subscribed with SUBSCRIBE_RECEIPTS to the group as a sender
//!    that has sent messages into it (so that every flush has recent
//!    messages to count), then the same storm again, its targets raised
//!    by the head of the first run so that every ACK moves a cursor again.
//!
//! The figures are both runs' ACK throughput and latency, their ratio, and
//! the receipt frames the subscribers received (with their entries). Above
//! the node's `--receipt-members-max` (1,000 by default) the group's
//! receipts are counts (RECEIPT_COUNTS); `--node-receipt-members-max` on a
//! spawned node raises the threshold to measure list receipts (RECEIPT of
//! every member that moved) in the same group instead.
//!
//! Verification: every ACK of both runs answered its target, and every
//! subscriber received at least one receipt frame of the group, each
//! well-formed for its mode (counts: the subscriber's own sender, at most
//! `RECENT_SENDS_MAX` ids).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Map;

use super::args::BenchArgs;
use super::conn::Conn;
use super::context::Ctx;
use super::driver::{run_phase, Job, Tally};
use super::plan;
use super::progress::group_digits;
use super::report::Report;
use super::workloads::{delta, node_stats, one_group_setup, W3Job};
use tidemark_protocol::{JoinStart, Request, Response};

/// Sender ids of the subscribers start here (above any member).
const SENDER_OFFSET: u64 = 1 << 31;

/// The spawned node's flags for this workload.
pub(crate) fn node_flags(args: &BenchArgs) -> Vec<String> {
    match args.node_receipt_members_max {
        Some(n) => vec!["--receipt-members-max".into(), n.to_string()],
        None => Vec::new(),
    }
}

/// Sends `n` messages to the group, round-robin from the subscribers'
/// senders.
struct SenderJob<'a> {
    group: u64,
    senders: Vec<u64>,
    next: u64,
    n: u64,
    payload: &'a [u8],
}

impl Job for SenderJob<'_> {
    fn next(&mut self) -> Option<(u64, Request<'_>)> {
        if self.next >= self.n {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let sender = self.senders[(i % self.senders.len() as u64) as usize];
        Some((
            i,
            Request::Send {
                group: self.group,
                sender,
                client_msg_id: i + 1,
                payload: self.payload,
            },
        ))
    }

    fn complete(&mut self, _tag: u64, resp: Response<'_>, t: &mut Tally) {
        t.sent(&resp, self.payload.len() as u64);
    }

    fn finished(&self) -> bool {
        self.next >= self.n
    }
}

/// What one subscriber received.
#[derive(Default)]
struct Heard {
    receipt_frames: u64,
    receipt_entries: u64,
    counts_frames: u64,
    counts_entries: u64,
    fault: Option<String>,
}

/// Reads a subscriber's connection until `stop`.
fn listen(mut conn: Conn, group: u64, sender: u64, stop: Arc<AtomicBool>) -> Heard {
    let mut h = Heard::default();
    while !stop.load(Ordering::Relaxed) {
        let r = conn.read_within(Duration::from_millis(50), &mut |_, resp| match resp {
            Response::Receipt { group: g, receipts } if g == group => {
                h.receipt_frames += 1;
                h.receipt_entries += receipts.len() as u64;
            }
            Response::ReceiptCounts {
                group: g,
                sender: s,
                counts,
            } if g == group => {
                h.counts_frames += 1;
                h.counts_entries += counts.len() as u64;
                if s != sender || counts.len() > tidemark_node::RECENT_SENDS_MAX {
                    h.fault.get_or_insert(format!(
                        "RECEIPT_COUNTS of sender {s} with {} counts to the subscriber of sender {sender}",
                        counts.len()
                    ));
                }
            }
            other => {
                h.fault
                    .get_or_insert(format!("unexpected frame {:?}", other.kind()));
            }
        });
        if let Err(e) = r {
            h.fault.get_or_insert(e);
            break;
        }
    }
    h
}

pub(crate) fn receipts(ctx: &Ctx<'_>) -> Result<Report, String> {
    let a = ctx.args;
    let members = a.members.unwrap_or(100_000).max(1);
    let messages = a.messages.unwrap_or(1_000).max(1);
    let acks = a.ops.unwrap_or(200_000);
    let subscribers = a.receipt_subscribers.max(1);
    let mut params = Map::new();
    params.insert("members".into(), members.into());
    params.insert("messages".into(), messages.into());
    params.insert("acks".into(), acks.into());
    params.insert("receipt_subscribers".into(), subscribers.into());
    let mut rep = Report::new(
        ctx,
        "receipts",
        format!(
            "receipts: 1 group, {} members, {} single ACKs without and then with {} receipt subscribers, {} connections x {} in flight",
            group_digits(members),
            group_digits(acks),
            subscribers,
            a.connections,
            a.in_flight
        ),
        params,
        "acks",
    );
    let mut conns = ctx.connect(a.connections)?;
    one_group_setup(
        ctx,
        &mut conns,
        &mut rep,
        "receipts setup",
        messages,
        members,
        |_| JoinStart::At(0),
        " at cursor 0",
    )?;
    let group = ctx.base + 1;
    let (moves, _) = plan::w3_acks(a.seed, members, messages, acks);
    let c = conns.len() as u64;
    let storm = |raise: u64| -> Vec<W3Job> {
        let mut per_conn: Vec<Vec<(u64, u64)>> = vec![Vec::new(); c as usize];
        for &(m, to) in &moves {
            per_conn[(m % c) as usize].push((m, to + raise));
        }
        per_conn
            .into_iter()
            .map(|acks| W3Job {
                group,
                base: ctx.base,
                acks,
                pos: 0,
                fault: None,
            })
            .collect()
    };

    // 1. Baseline: nobody listens.
    let base_run = run_phase(
        &mut conns,
        storm(0),
        &ctx.measured_phase("receipts baseline", "acks"),
    )?;

    // 2. Subscribers, each as a sender of `messages` / subscribers new
    //    messages (the head doubles), then the same storm above them.
    let senders: Vec<u64> = (0..subscribers as u64)
        .map(|i| ctx.base + SENDER_OFFSET + i)
        .collect();
    let mut subs = ctx.connect(subscribers)?;
    for (conn, &sender) in subs.iter_mut().zip(&senders) {
        let mut ok = false;
        conn.call(
            &Request::SubscribeReceipts {
                sender,
                groups: vec![group],
            },
            &mut |r| ok = matches!(r, Response::SubscribeReceipts),
        )?;
        if !ok {
            return Err("SUBSCRIBE_RECEIPTS refused (a node without receipts?)".into());
        }
    }
    let payload = &ctx.payloads[0];
    let send_job = vec![SenderJob {
        group,
        senders: senders.clone(),
        next: 0,
        n: messages,
        payload,
    }];
    let sent = run_phase(
        &mut conns[..1],
        send_job,
        &ctx.setup_phase("receipts senders", "sends"),
    )?;
    if sent.tally.errors > 0 {
        return Err(format!(
            "the subscribers' sends failed: {}",
            sent.tally.error_samples.join("; ")
        ));
    }
    rep.setup.push((
        format!(
            "{subscribers} subscribers, {} messages sent by them",
            group_digits(messages)
        ),
        sent.elapsed.as_secs_f64(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let listeners: Vec<_> = subs
        .into_iter()
        .zip(senders.iter().copied())
        .map(|(conn, sender)| {
            let stop = stop.clone();
            std::thread::spawn(move || listen(conn, group, sender, stop))
        })
        .collect();
    let before = node_stats(&mut conns[0])?;
    let with_run = run_phase(
        &mut conns,
        storm(messages),
        &ctx.measured_phase("receipts with subscribers", "acks"),
    );
    // The last interval's receipts (100 ms by default) arrive after the
    // last ACK.
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let heard: Vec<Heard> = listeners
        .into_iter()
        .map(|t| t.join().unwrap_or_default())
        .collect();
    let with_run = with_run?;
    let after = node_stats(&mut conns[0])?;

    let fault = base_run
        .jobs
        .iter()
        .chain(&with_run.jobs)
        .find_map(|j| j.fault.clone())
        .or_else(|| heard.iter().find_map(|h| h.fault.clone()))
        .or_else(|| {
            heard
                .iter()
                .any(|h| h.receipt_frames + h.counts_frames == 0)
                .then(|| "a subscriber received no receipt".to_string())
        });
    let sum = |f: fn(&Heard) -> u64| heard.iter().map(f).sum::<u64>();
    let base_rate = base_run.tally.ops as f64 / base_run.elapsed.as_secs_f64().max(1e-9);
    let with_rate = with_run.tally.ops as f64 / with_run.elapsed.as_secs_f64().max(1e-9);
    let ratio = with_rate / base_rate.max(1e-9);
    let q = |t: &Tally, x: f64| t.latency_us.value_at_quantile(x);
    let e = &mut rep.extra;
    e.insert("baseline_acks_per_sec".into(), base_rate.into());
    e.insert("with_receipts_acks_per_sec".into(), with_rate.into());
    e.insert("throughput_ratio".into(), ratio.into());
    e.insert("baseline_p50_us".into(), q(&base_run.tally, 0.5).into());
    e.insert("baseline_p99_us".into(), q(&base_run.tally, 0.99).into());
    e.insert(
        "with_receipts_p50_us".into(),
        q(&with_run.tally, 0.5).into(),
    );
    e.insert(
        "with_receipts_p99_us".into(),
        q(&with_run.tally, 0.99).into(),
    );
    e.insert("receipt_frames".into(), sum(|h| h.receipt_frames).into());
    e.insert("receipt_entries".into(), sum(|h| h.receipt_entries).into());
    e.insert(
        "receipt_counts_frames".into(),
        sum(|h| h.counts_frames).into(),
    );
    e.insert(
        "receipt_counts_entries".into(),
        sum(|h| h.counts_entries).into(),
    );
    e.insert(
        "node_receipt_frames".into(),
        delta(&before, &after, "net.receipts").into(),
    );
    e.insert(
        "node_bytes_out".into(),
        delta(&before, &after, "net.bytes_out").into(),
    );
    rep.table.push(format!(
        "  baseline  {} acks/s (p50 {} us, p99 {} us), no subscriber",
        group_digits(base_rate as u64),
        group_digits(q(&base_run.tally, 0.5)),
        group_digits(q(&base_run.tally, 0.99)),
    ));
    rep.table.push(format!(
        "  receipts  {} acks/s (p50 {} us, p99 {} us) with {subscribers} subscribers: ratio {ratio:.3}; they got {} RECEIPT ({} entries) and {} RECEIPT_COUNTS ({} counts)",
        group_digits(with_rate as u64),
        group_digits(q(&with_run.tally, 0.5)),
        group_digits(q(&with_run.tally, 0.99)),
        group_digits(sum(|h| h.receipt_frames)),
        group_digits(sum(|h| h.receipt_entries)),
        group_digits(sum(|h| h.counts_frames)),
        group_digits(sum(|h| h.counts_entries)),
    ));
    rep.verified = fault.is_none() && base_run.tally.errors == 0 && with_run.tally.errors == 0;
    rep.verification = fault.unwrap_or_else(|| {
        format!(
            "every ACK of both runs answered its target; each of the {subscribers} subscribers received receipts of the group"
        )
    });
    rep.tally = with_run.tally;
    rep.measured_secs = with_run.elapsed.as_secs_f64();
    rep.cut_short = base_run.cut_short || with_run.cut_short;
    Ok(rep)
}
