//! The live line on stderr: operations so far and the rate over the last
//! interval. On a terminal it rewrites one line; otherwise (a log file, a
//! script) it prints a line every few seconds.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TTY_INTERVAL: Duration = Duration::from_millis(500);
const LOG_INTERVAL: Duration = Duration::from_secs(5);
const TICK: Duration = Duration::from_millis(50);

pub struct Progress<'a> {
    label: &'a str,
    unit: &'a str,
    tty: bool,
}

impl<'a> Progress<'a> {
    pub fn new(label: &'a str, unit: &'a str) -> Progress<'a> {
        Progress {
            label,
            unit,
            tty: std::io::stderr().is_terminal(),
        }
    }

    /// Prints until `stop` is set, then clears the line (on a terminal).
    pub fn run(&self, ops: &AtomicU64, stop: &AtomicBool) {
        let interval = if self.tty { TTY_INTERVAL } else { LOG_INTERVAL };
        let start = Instant::now();
        let (mut last_t, mut last_n) = (start, 0u64);
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(TICK);
            let now = Instant::now();
            if now - last_t < interval {
                continue;
            }
            let n = ops.load(Ordering::Relaxed);
            let rate = (n - last_n) as f64 / (now - last_t).as_secs_f64();
            let line = format!(
                "{}: {} {} in {:.1} s, {} {}/s",
                self.label,
                group_digits(n),
                self.unit,
                (now - start).as_secs_f64(),
                group_digits(rate as u64),
                self.unit
            );
            let mut err = std::io::stderr().lock();
            // Progress is best effort: a closed stderr must not fail the run.
            let _ = if self.tty {
                write!(err, "\r\x1b[2K{line}")
            } else {
                writeln!(err, "{line}")
            };
            let _ = err.flush();
            (last_t, last_n) = (now, n);
        }
        if self.tty {
            let _ = write!(std::io::stderr(), "\r\x1b[2K");
        }
    }
}

/// `1234567` as `1,234,567`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}
