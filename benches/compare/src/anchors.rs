//! The machine's physical anchors, measured in the same run: sequential
//! write bandwidth (1 MiB writes, one fdatasync at the end, on the disk the
//! systems use), fdatasync latency of a 4 KiB append, memcpy bandwidth, and
//! loopback TCP throughput (one sender, one receiver).

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Instant;

use hdrhistogram::Histogram;

#[derive(Clone, Debug)]
pub struct Anchors {
    pub seq_write_mb_s: f64,
    pub fdatasync_p50_us: u64,
    pub fdatasync_p99_us: u64,
    pub memcpy_gb_s: f64,
    pub loopback_mb_s: f64,
}

const SEQ_BYTES: usize = 1 << 30;
const SYNC_WRITES: usize = 2_000;
const MEMCPY_BYTES: usize = 256 << 20;
const MEMCPY_ROUNDS: usize = 8;
const TCP_BYTES: usize = 4 << 30;

fn fdatasync(f: &std::fs::File) {
    // SAFETY: fdatasync(2) on an open descriptor we own.
    let r = unsafe { libc::fdatasync(f.as_raw_fd()) };
    assert_eq!(r, 0, "fdatasync failed");
}

pub fn seq_write(dir: &Path) -> f64 {
    let path = dir.join("anchor-seq");
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("open anchor file");
    let buf: Vec<u8> = (0..1 << 20).map(|i: usize| (i * 7) as u8).collect();
    let t = Instant::now();
    for _ in 0..SEQ_BYTES / buf.len() {
        f.write_all(&buf).expect("write");
    }
    fdatasync(&f);
    let s = t.elapsed().as_secs_f64();
    drop(f);
    let _ = std::fs::remove_file(&path);
    SEQ_BYTES as f64 / 1e6 / s
}

pub fn fdatasync_latency(dir: &Path) -> (u64, u64) {
    let path = dir.join("anchor-sync");
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&path)
        .expect("open anchor file");
    let buf = vec![0x5au8; 4096];
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
    for _ in 0..SYNC_WRITES {
        let t = Instant::now();
        f.write_all(&buf).expect("write");
        fdatasync(&f);
        let _ = h.record((t.elapsed().as_micros() as u64).max(1));
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    (h.value_at_quantile(0.5), h.value_at_quantile(0.99))
}

pub fn memcpy() -> f64 {
    let src: Vec<u8> = (0..MEMCPY_BYTES).map(|i| i as u8).collect();
    let mut dst = vec![0u8; MEMCPY_BYTES];
    dst.copy_from_slice(&src); // fault the pages in
    let t = Instant::now();
    for _ in 0..MEMCPY_ROUNDS {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    }
    (MEMCPY_BYTES * MEMCPY_ROUNDS) as f64 / 1e9 / t.elapsed().as_secs_f64()
}

pub fn loopback() -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let mut buf = vec![0u8; 256 << 10];
        let mut n = 0usize;
        while n < TCP_BYTES {
            let k = s.read(&mut buf).expect("read");
            if k == 0 {
                break;
            }
            n += k;
        }
        n
    });
    let mut s = TcpStream::connect(addr).expect("connect");
    let buf = vec![0xa5u8; 256 << 10];
    let t = Instant::now();
    let mut sent = 0;
    while sent < TCP_BYTES {
        s.write_all(&buf).expect("write");
        sent += buf.len();
    }
    let got = rx.join().expect("receiver");
    got as f64 / 1e6 / t.elapsed().as_secs_f64()
}

pub fn measure(dir: &Path) -> Anchors {
    let seq_write_mb_s = seq_write(dir);
    let (p50, p99) = fdatasync_latency(dir);
    Anchors {
        seq_write_mb_s,
        fdatasync_p50_us: p50,
        fdatasync_p99_us: p99,
        memcpy_gb_s: memcpy(),
        loopback_mb_s: loopback(),
    }
}
