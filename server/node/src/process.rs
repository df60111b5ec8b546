//! The `process_*` series of `/metrics`: the figures every Prometheus
//! client library exports for its process (start time, CPU time, memory,
//! file descriptors), under the same names, so the usual dashboards and
//! alerts work on a node as they do on any other process.
//!
//! Read from `/proc/self` (and `getrlimit`) by the metrics thread at each
//! scrape, never by the event loop: counting the open descriptors lists
//! `/proc/self/fd`, which grows with the connections. What cannot be read
//! (another system, a `/proc` without the file, a line that does not
//! parse) is `None`, and its series is left out of the scrape: never a
//! panic, never a made-up 0.

use std::fmt::Write as _;

/// The process figures of one scrape; `None`: not readable here.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessFigures {
    /// When the process started, in seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// User and system CPU time the process used.
    pub cpu_seconds: Option<f64>,
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    /// The soft limit on open descriptors (`RLIMIT_NOFILE`).
    pub max_fds: Option<u64>,
}

/// `(utime + stime, starttime)` in clock ticks, from the text of
/// `/proc/self/stat`. The command name (field 2) is in parentheses and may
/// hold spaces and parentheses itself, so fields are counted after its
/// last `)`: utime is field 14, stime 15, starttime 22 (proc(5)).
fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 (the state).
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some((field(14)?.checked_add(field(15)?)?, field(22)?))
}

/// The boot time in seconds since the Unix epoch, from the text of
/// `/proc/stat` (its `btime` line).
fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// Clock ticks per second, the unit of `/proc/self/stat`'s times.
fn ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then_some(hz as f64)
}

fn open_fds() -> Option<u64> {
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    // The listing's own descriptor is counted, as the Prometheus client
    // libraries count it.
    Some(entries.filter(|e| e.is_ok()).count() as u64)
}

fn max_fds() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given, which lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    // RLIM_INFINITY is not a count.
    (limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

impl ProcessFigures {
    /// The figures now (a few small reads of `/proc`, one listing of
    /// `/proc/self/fd`).
    pub fn read() -> ProcessFigures {
        let stat = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|t| parse_stat(&t));
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_boot_time(&t));
        let hz = ticks_per_second();
        let memory = crate::host::process_memory();
        ProcessFigures {
            start_time_seconds: stat
                .zip(boot)
                .zip(hz)
                .map(|(((_, start), boot), hz)| boot as f64 + start as f64 / hz),
            cpu_seconds: stat.zip(hz).map(|((cpu, _), hz)| cpu as f64 / hz),
            resident_memory_bytes: memory.map(|(resident, _)| resident),
            virtual_memory_bytes: memory.map(|(_, size)| size),
            open_fds: open_fds(),
            max_fds: max_fds(),
        }
    }

    /// The series in the text format, with `# HELP` and `# TYPE`; those
    /// not read are left out.
    pub fn render(&self, out: &mut String) {
        let float = |v: Option<f64>| v.map(|v| format!("{v}"));
        let int = |v: Option<u64>| v.map(|v| v.to_string());
        let values = [
            float(self.start_time_seconds),
            float(self.cpu_seconds),
            int(self.resident_memory_bytes),
            int(self.virtual_memory_bytes),
            int(self.open_fds),
            int(self.max_fds),
        ];
        for ((name, kind, _), (help, value)) in SERIES.iter().zip(HELP.iter().zip(values)) {
            if let Some(value) = value {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} {kind}");
                let _ = writeln!(out, "{name} {value}");
            }
        }
    }
}

/// The series, `(name, type, unit)`, in the order of [`ProcessFigures`]'
/// fields (format-spec/metrics.md lists them).
pub const SERIES: [(&str, &str, &str); 6] = [
    ("process_start_time_seconds", "gauge", "seconds"),
    ("process_cpu_seconds_total", "counter", "seconds"),
    ("process_resident_memory_bytes", "gauge", "bytes"),
    ("process_virtual_memory_bytes", "gauge", "bytes"),
    ("process_open_fds", "gauge", "descriptors"),
    ("process_max_fds", "gauge", "descriptors"),
];

/// Their HELP texts, those of the Prometheus client libraries.
const HELP: [&str; 6] = [
    "Start time of the process since unix epoch in seconds.",
    "Total user and system CPU time spent in seconds.",
    "Resident memory size in bytes.",
    "Virtual memory size in bytes.",
    "Number of open file descriptors.",
    "Maximum number of open file descriptors.",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with spaces and a parenthesis, as a process may
        // name itself.
        let text = "4242 (tide (mark) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    150 50 0 0 20 0 9 0 123456 843440128 2528 18446744073709551615";
        assert_eq!(parse_stat(text), Some((200, 123456)));
        assert_eq!(parse_stat("4242 (cut short) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis at all"), None);
        assert_eq!(parse_stat(""), None);
    }

    #[test]
    fn boot_time_is_the_btime_line() {
        let text = "cpu  1 2 3\nintr 5\nbtime 1795500000\nprocesses 9\n";
        assert_eq!(parse_boot_time(text), Some(1_795_500_000));
        assert_eq!(parse_boot_time("cpu 1\n"), None);
        assert_eq!(parse_boot_time("btime soon\n"), None);
    }

    #[test]
    fn what_is_not_read_is_left_out() {
        let mut out = String::new();
        ProcessFigures {
            open_fds: Some(12),
            ..ProcessFigures::default()
        }
        .render(&mut out);
        assert_eq!(
            out,
            "# HELP process_open_fds Number of open file descriptors.\n\
             # TYPE process_open_fds gauge\n\
             process_open_fds 12\n"
        );
    }

    /// On Linux every figure reads, and they are plausible for this test
    /// process.
    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_whole() {
        let p = ProcessFigures::read();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = p.start_time_seconds.unwrap();
        assert!(start <= now + 1.0 && start > now - 24.0 * 3600.0, "{start}");
        assert!(p.cpu_seconds.unwrap() >= 0.0);
        assert!(p.resident_memory_bytes.unwrap() > 0);
        assert!(p.virtual_memory_bytes.unwrap() >= p.resident_memory_bytes.unwrap());
        let fds = p.open_fds.unwrap();
        assert!(fds >= 3, "{fds}");
        assert!(p.max_fds.is_none_or(|m| m >= fds));
    }
}
