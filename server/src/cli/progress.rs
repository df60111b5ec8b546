//! Progress on standard error for the commands that take minutes on a
//! big directory: `ctl verify` (bytes checked of the bytes it reads, and
//! the kind of file it is reading) and `backup` (bytes and files copied,
//! and the file being written). Drawn like cargo's: only when standard
//! error is a terminal and the command does not print `--json`, redrawn in
//! place at most a few times a second, cut to the terminal's width, and
//! cleared when the command ends.
//! Otherwise nothing is drawn at all, so standard output and the standard
//! error of a script or a test are what they are without it.
//!
//! The engine and the copy only report (`tidemark_engine::VerifyProgress`,
//! [`Copied`], which the copy in `backup.rs` fills); this module is the
//! one that draws, with `indicatif`.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tidemark_engine::{Reading, VerifyProgress};

/// How far a copy is, reported after every chunk written and every file
/// completed. `bytes` never decreases; at the end it is the `bytes` of the
/// node's BACKUP response, and `files` its `files`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied<'a> {
    /// Files complete (written whole and fdatasynced).
    pub files: u32,
    /// Bytes written, of every file so far.
    pub bytes: u64,
    /// The file being written (the last one, once complete).
    pub file: &'a str,
}

/// How often the spinner turns while no report arrives (a big file being
/// read, a slow node).
const TICK: Duration = Duration::from_millis(120);

/// A progress line on standard error, or nothing (module docs).
pub struct Progress {
    bar: Option<ProgressBar>,
    /// What the line names now (it is set only when it changes).
    reading: Option<Reading>,
    file: String,
}

impl Progress {
    /// Whether progress is drawn: standard error is a terminal and the
    /// output is not JSON.
    fn drawn(json: bool) -> bool {
        !json && std::io::stderr().is_terminal()
    }

    fn new(json: bool, template: &str) -> Progress {
        let bar = Self::drawn(json).then(|| {
            let style = ProgressStyle::with_template(template)
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(style);
            bar.enable_steady_tick(TICK);
            bar
        });
        Progress {
            bar,
            reading: None,
            file: String::new(),
        }
    }

    /// The line of `ctl verify`.
    pub fn verify(json: bool) -> Progress {
        Progress::new(
            json,
            "{spinner} verify [{bar:30}] {bytes}/{total_bytes} ({eta} left) {wide_msg}",
        )
    }

    /// The line of `backup` (the node says the total only at the end).
    pub fn backup(json: bool) -> Progress {
        Progress::new(
            json,
            "{spinner} backup: {bytes} copied ({binary_bytes_per_sec}), {wide_msg}",
        )
    }

    pub fn verified(&mut self, p: VerifyProgress) {
        let Some(bar) = &self.bar else { return };
        if bar.length() != Some(p.total) {
            bar.set_length(p.total);
        }
        bar.set_position(p.checked);
        if self.reading != Some(p.reading) {
            self.reading = Some(p.reading);
            bar.set_message(p.reading.name());
        }
    }

    pub fn copied(&mut self, c: &Copied<'_>) {
        let Some(bar) = &self.bar else { return };
        bar.set_position(c.bytes);
        // A message is made only when the file changes.
        if self.file != c.file {
            self.file = c.file.to_owned();
            bar.set_message(format!("{} files done, now {}", c.files, c.file));
        }
    }
}

impl Drop for Progress {
    /// The line is cleared: what the command prints next stands alone.
    fn drop(&mut self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
