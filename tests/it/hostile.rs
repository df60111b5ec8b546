//! Hostile clients against the real node: many connections, garbage, huge
//! length prefixes, frames stalled halfway, pipelining without reading the
//! responses, subscribing without reading the pushes. The node's memory must
//! stay under the bound its limits imply, and a well-behaved client must keep
//! being served throughout.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use tidemark_protocol::{encode_request, JoinStart, Request, Subscription};

use crate::harness::Node;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn hello() -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(
        1,
        &Request::Hello {
            min_version: 1,
            max_version: 1,
            client_name: "hostile",
        },
        &mut out,
    )
    .unwrap();
    out
}

#[test]
fn hostile_clients_neither_exhaust_memory_nor_starve_good_ones() {
    let dir = tempfile::tempdir().unwrap();
    // Limits: frames of 128 KiB, 64 KiB of output per connection.
    let node = Node::start(
        dir.path(),
        &[
            "--fsync",
            "never",
            "--frame-bytes-max",
            "131072",
            "--payload-bytes-max",
            "65536",
            "--output-bytes-max",
            "131072",
            "--connections-max",
            "400",
        ],
    );
    let pid = node.child.id();
    let mut good = node.client();
    good.create_group(1).unwrap();
    good.join(1, 1, JoinStart::Earliest).unwrap();
    let rss_start = rss_bytes(pid);

    let mut hostile: Vec<TcpStream> = Vec::new();
    let mut x: u64 = 0x2545F4914F6CDD1D;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..300u32 {
        let Ok(mut s) = TcpStream::connect(&node.addr) else {
            continue;
        };
        let _ = s.set_nonblocking(true);
        match i % 6 {
            // Garbage bytes.
            0 => {
                let junk: Vec<u8> = (0..4096).map(|_| rand() as u8).collect();
                let _ = s.write(&junk);
            }
            // A length prefix of 4 GiB.
            1 => {
                let _ = s.write(&u32::MAX.to_le_bytes());
            }
            // A frame stalled halfway: the header of a 100 KiB frame, then nothing.
            2 => {
                let _ = s.write(&hello());
                let _ = s.write(&(100_000u32).to_le_bytes());
                let _ = s.write(&[1, 0x03, 0, 0]);
            }
            // Pipelining thousands of requests, never reading a response.
            3 => {
                let _ = s.write(&hello());
                let mut batch = Vec::new();
                for id in 2..5000u64 {
                    encode_request(id, &Request::Ping, &mut batch).unwrap();
                }
                let _ = s.write(&batch);
            }
            // Subscribing to the busy group, never reading the pushes.
            4 => {
                let _ = s.write(&hello());
                let mut sub = Vec::new();
                encode_request(
                    2,
                    &Request::Subscribe(Subscription::Groups(vec![1])),
                    &mut sub,
                )
                .unwrap();
                let _ = s.write(&sub);
            }
            // Connect and do nothing.
            _ => {}
        }
        hostile.push(s);
    }
    // Meanwhile: heavy pushes for the non-reading subscribers, and the good
    // client's round trips keep working.
    let payload = vec![9u8; 16 << 10];
    let start = Instant::now();
    let mut worst = Duration::ZERO;
    for i in 1..=300u64 {
        let t = Instant::now();
        good.send(1, 2, i, &payload).unwrap();
        good.ping().unwrap();
        worst = worst.max(t.elapsed());
    }
    let page = good.pull(1, 1, 0, 10, 0).unwrap();
    assert_eq!(page.messages.first().map(|m| m.msg_id), Some(1));
    assert!(page.has_more, "pages are cut to the frame limit, not lost");
    assert_eq!(page.head, 300);
    let rss_end = rss_bytes(pid);
    // The bound the limits imply: per hostile connection at most one frame
    // buffered in and 128 KiB (+ one response) queued out; 300 connections
    // ~ 75 MiB, plus the engine. Allow generous headroom for the allocator.
    let bound = rss_start + 160 * 1024 * 1024;
    println!(
        "hostile clients: {} connections, node RSS {} KiB -> {} KiB (bound {} KiB), 300 good sends in {:?}, slowest {:?}",
        hostile.len(),
        rss_start / 1024,
        rss_end / 1024,
        bound / 1024,
        start.elapsed(),
        worst
    );
    assert!(
        rss_end < bound,
        "node memory {rss_end} exceeds the bound {bound}"
    );
    drop(hostile);
    good.ping().unwrap();
}
