//! The log of `tidemark` on standard error: its level, its format, and a
//! level change while the node runs (SIGHUP, `reload`).
//!
//! What sets the level, first match wins: `serve --log-level` (or
//! `log_level` in its config file); the `RUST_LOG` environment variable,
//! with env_logger's directives (`warn,tidemark_node=debug`); the
//! command's own default (info for `serve`, warn for the client commands,
//! which print only their result). A level given to `serve` covers every
//! module; per-module levels come only from `RUST_LOG`.
//!
//! Formats: `text`, env_logger's `[TIME LEVEL TARGET] message` lines, and
//! `json`, one object per line, `{"ts":..., "level":..., "target":...,
//! "message":...}` (RFC 3339 time with milliseconds, UTC; the level in
//! capitals), for log shippers that parse lines.
//!
//! Representation: one process-wide logger that holds an env_logger
//! `Logger` behind a read-write lock; a level change builds a new one and
//! swaps it in. Costs: a read lock (uncontended but for a swap) per line
//! that passes `log`'s global maximum level.

use std::io::Write;
use std::sync::{OnceLock, RwLock};

use log::{LevelFilter, Log, Metadata, Record};

/// `--log-level`: the level of every module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogLevel {
    Off,
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl From<LogLevel> for LevelFilter {
    fn from(level: LogLevel) -> LevelFilter {
        match level {
            LogLevel::Off => LevelFilter::Off,
            LogLevel::Error => LevelFilter::Error,
            LogLevel::Warn => LevelFilter::Warn,
            LogLevel::Info => LevelFilter::Info,
            LogLevel::Debug => LevelFilter::Debug,
            LogLevel::Trace => LevelFilter::Trace,
        }
    }
}

/// `--log-format`: how each line is written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// `[TIME LEVEL TARGET] message`, for people.
    #[default]
    Text,
    /// One JSON object per line: ts, level, target, message.
    Json,
}

/// What the log is built from (module docs: which level wins).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogSettings {
    /// `--log-level`, when it was given (flag or config key).
    pub level: Option<LogLevel>,
    /// The level without `--log-level` and without `RUST_LOG`.
    pub fallback: LevelFilter,
    pub format: LogFormat,
}

/// The process-wide logger.
struct Reloadable {
    current: RwLock<env_logger::Logger>,
    format: LogFormat,
}

static LOGGER: OnceLock<Reloadable> = OnceLock::new();

impl Log for Reloadable {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        read(&self.current).enabled(metadata)
    }

    fn log(&self, record: &Record<'_>) {
        let logger = read(&self.current);
        if logger.matches(record) {
            logger.log(record);
        }
    }

    fn flush(&self) {
        read(&self.current).flush();
    }
}

/// The lock's content even after a panic while it was held: a logger is
/// replaced whole, so there is no half-made state to fear.
fn read(lock: &RwLock<env_logger::Logger>) -> std::sync::RwLockReadGuard<'_, env_logger::Logger> {
    lock.read().unwrap_or_else(|p| p.into_inner())
}

/// Installs the logger. Called once, first thing in `main`; a second call
/// changes nothing.
pub fn init(settings: LogSettings) {
    let logger = build(settings);
    let max = logger.filter();
    let installed = LOGGER.get_or_init(|| Reloadable {
        current: RwLock::new(logger),
        format: settings.format,
    });
    if log::set_logger(installed).is_ok() {
        log::set_max_level(max);
    }
}

/// Rebuilds the logger for a new `--log-level` (`None`: back to
/// `RUST_LOG` or the fallback); the format stays what [`init`] set.
pub fn set_level(level: Option<LogLevel>, fallback: LevelFilter) {
    let Some(installed) = LOGGER.get() else {
        return;
    };
    let logger = build(LogSettings {
        level,
        fallback,
        format: installed.format,
    });
    let max = logger.filter();
    *installed.current.write().unwrap_or_else(|p| p.into_inner()) = logger;
    log::set_max_level(max);
}

fn build(settings: LogSettings) -> env_logger::Logger {
    let mut builder = env_logger::Builder::new();
    match (settings.level, std::env::var("RUST_LOG")) {
        (Some(level), _) => {
            builder.filter_level(level.into());
        }
        (None, Ok(directives)) if !directives.trim().is_empty() => {
            builder.parse_filters(&directives);
        }
        (None, _) => {
            builder.filter_level(settings.fallback);
        }
    }
    if let Ok(style) = std::env::var("RUST_LOG_STYLE") {
        builder.parse_write_style(&style);
    }
    if settings.format == LogFormat::Json {
        builder.format(write_json);
    }
    builder.build()
}

/// One line of `--log-format json`.
// Format: {"ts":"RFC 3339 UTC, ms","level":"INFO","target":"...","message":"..."}\n
fn write_json(buf: &mut env_logger::fmt::Formatter, record: &Record<'_>) -> std::io::Result<()> {
    let text = |s: &str| serde_json::Value::from(s).to_string();
    writeln!(
        buf,
        "{{\"ts\":{},\"level\":{},\"target\":{},\"message\":{}}}",
        text(&buf.timestamp_millis().to_string()),
        text(record.level().as_str()),
        text(record.target()),
        text(&record.args().to_string()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JSON line escapes what a message may hold (quotes, newlines,
    /// control characters) and has exactly the four members.
    #[test]
    fn a_json_line_is_one_object() {
        // Format through the real formatter into a buffer we can read.
        let shared = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let logger = env_logger::Builder::new()
            .filter_level(LevelFilter::Trace)
            .format(write_json)
            .target(env_logger::Target::Pipe(Box::new(SharedBuf(
                shared.clone(),
            ))))
            .build();
        logger.log(
            &Record::builder()
                .args(format_args!("a \"quoted\"\nline\u{1}"))
                .level(log::Level::Warn)
                .target("tidemark_node::event_loop")
                .build(),
        );
        let text = String::from_utf8(shared.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text:?}");
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(v["level"], "WARN");
        assert_eq!(v["target"], "tidemark_node::event_loop");
        assert_eq!(v["message"], "a \"quoted\"\nline\u{1}");
        let ts = v["ts"].as_str().unwrap();
        assert!(
            ts.ends_with('Z') && ts.contains('T') && ts.contains('.'),
            "{ts}"
        );
        assert_eq!(v.as_object().unwrap().len(), 4);
    }

    /// `--log-level` wins over RUST_LOG; without it RUST_LOG's directives
    /// apply, else the fallback.
    #[test]
    fn the_level_given_wins_over_rust_log() {
        let settings = |level| LogSettings {
            level,
            fallback: LevelFilter::Warn,
            format: LogFormat::Text,
        };
        assert_eq!(
            build(settings(Some(LogLevel::Debug))).filter(),
            LevelFilter::Debug
        );
        let from_env = build(settings(None)).filter();
        match std::env::var("RUST_LOG") {
            Ok(s) if !s.trim().is_empty() => {}
            _ => assert_eq!(from_env, LevelFilter::Warn),
        }
    }

    struct SharedBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
