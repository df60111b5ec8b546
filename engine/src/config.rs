//! Engine options. Every limit has a unit in its name, a default here, and a
//! line in format-spec/storage.md ("Limits").

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::record::RECORD_HEADER_BYTES;
use crate::segment::SEGMENT_HEADER_BYTES;

/// When an append counts as durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// An append returns only after its commit round's journal bytes were
    /// fdatasync'ed. One fsync per round, however many groups it wrote.
    Always,
    /// Appends return once written to the page cache; the journal is
    /// fdatasync'ed at least every `Duration` (a power loss may lose that much).
    Interval(Duration),
    /// Appends return once written to the page cache; the engine never syncs
    /// the journal (survives a process crash, not a power loss).
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = Error;

    /// Parses `always`, `never` or `interval:MS`.
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            _ => {
                let ms = s
                    .strip_prefix("interval:")
                    .and_then(|ms| ms.parse::<u64>().ok())
                    .filter(|ms| *ms > 0)
                    .ok_or_else(|| Error::InvalidConfig {
                        reason: format!(
                            "fsync policy {s:?}: expected always, never or interval:MS with MS > 0"
                        ),
                    })?;
                Ok(FsyncPolicy::Interval(Duration::from_millis(ms)))
            }
        }
    }
}

/// Options of an engine. `Config::new(dir)` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub fsync: FsyncPolicy,
    /// A segment is sealed and a new one started before it would exceed this.
    pub segment_bytes_max: u64,
    /// One sparse-index entry per this many bytes of log.
    pub index_interval_bytes: u32,
    pub payload_bytes_max: usize,
    /// Segment files kept open (file descriptor plus mapping) at once.
    pub open_segments_max: usize,
    /// A group remembers at least this many of its latest sends for dedup...
    pub dedup_window_sends: usize,
    /// ...and every send younger than this...
    pub dedup_window_ms: u64,
    /// ...but never more than this many entries per group (memory bound).
    pub dedup_entries_max: usize,
    /// Entries of all groups' windows together; past it, windows keep only
    /// their last `dedup_window_sends` sends and the least recently used
    /// windows leave memory (rebuilt from the log on their next send).
    pub dedup_entries_total_max: usize,
    /// A group neither sent to nor loaded for this long gives back its send
    /// state (dedup window included) and, if small and synced, its loaded
    /// log; its next send rebuilds the window from the log as after a
    /// restart, so retransmits are answered exactly as before.
    pub idle_evict_ms: u64,
    /// Journal bytes after which a checkpoint syncs the group logs and starts
    /// a new journal file.
    pub journal_checkpoint_bytes: u64,
    /// A journal file rolls to the next one before a frame would take it
    /// past this many bytes (a larger frame goes alone into a new file).
    /// At most `u32::MAX`, so offsets in a journal file fit a `u32`.
    pub journal_file_bytes: u64,
    /// A group's records are held in memory (they are in the journal) and
    /// written to its segment file once this many bytes wait, when the
    /// segment is sealed, or at a checkpoint: one write per group per 16 KiB
    /// instead of one per group per round. 0 writes every round.
    pub segment_tail_bytes: usize,
    /// Bytes of records one commit round takes at most.
    pub commit_round_bytes_max: usize,
    /// Groups an engine holds.
    pub groups_max: usize,
    pub members_per_group_max: usize,
    pub groups_per_user_max: usize,
    /// Moved cursors are written to the journal at least this often.
    pub cursor_flush_ms: u64,
    /// Retention policies are applied at least this often.
    pub retention_check_ms: u64,
    /// Below this much free disk space, new writes are refused with
    /// `DiskFull` (nothing is assigned or written), and accepted again by
    /// themselves once space returns. 0 disables the check.
    pub disk_free_min_bytes: u64,
}

impl Config {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        Config {
            data_dir: data_dir.into(),
            fsync: FsyncPolicy::Always,
            segment_bytes_max: 32 << 20,
            index_interval_bytes: 4096,
            payload_bytes_max: 1 << 20,
            open_segments_max: 16_384,
            dedup_window_sends: 10_000,
            dedup_window_ms: 10 * 60 * 1000,
            dedup_entries_max: 1_000_000,
            dedup_entries_total_max: 10_000_000,
            idle_evict_ms: 10 * 60 * 1000,
            journal_checkpoint_bytes: 64 << 20,
            journal_file_bytes: 64 << 20,
            segment_tail_bytes: 16 << 10,
            commit_round_bytes_max: 8 << 20,
            groups_max: 10_000_000,
            members_per_group_max: 500_000,
            groups_per_user_max: 20_000,
            cursor_flush_ms: 1000,
            retention_check_ms: 60_000,
            disk_free_min_bytes: 64 << 20,
        }
    }

    /// The largest record this configuration can produce.
    pub fn record_bytes_max(&self) -> usize {
        RECORD_HEADER_BYTES + self.payload_bytes_max
    }

    /// Checks the relationships between limits that the engine relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidConfig { reason });
        if self.payload_bytes_max == 0
            || self.record_bytes_max() > crate::record::RECORD_BYTES_STORED_MAX
        {
            return bad(format!(
                "payload_bytes_max {} out of range",
                self.payload_bytes_max
            ));
        }
        // A segment must hold at least one record of the largest size, and
        // record positions must fit the index's u32 position field.
        let min_segment = (SEGMENT_HEADER_BYTES + self.record_bytes_max()) as u64;
        if self.segment_bytes_max < min_segment || self.segment_bytes_max > u32::MAX as u64 {
            return bad(format!(
                "segment_bytes_max {} must be in [{min_segment}, {}]",
                self.segment_bytes_max,
                u32::MAX
            ));
        }
        // A journal file holds its header and at least one frame of one
        // record; offsets in it fit a u32.
        let min_journal = (crate::journal::JOURNAL_HEADER_BYTES
            + crate::journal::frame::FRAME_OVERHEAD_BYTES
            + crate::journal::ENTRY_HEADER_BYTES
            + self.record_bytes_max()) as u64;
        if self.journal_file_bytes < min_journal || self.journal_file_bytes > u32::MAX as u64 {
            return bad(format!(
                "journal_file_bytes {} must be in [{min_journal}, {}]",
                self.journal_file_bytes,
                u32::MAX
            ));
        }
        if self.index_interval_bytes == 0 {
            return bad("index_interval_bytes must be positive".into());
        }
        if self.open_segments_max < 2 {
            return bad("open_segments_max must be at least 2".into());
        }
        if self.commit_round_bytes_max < self.record_bytes_max() {
            return bad("commit_round_bytes_max must hold the largest record".into());
        }
        if self.groups_max >= u32::MAX as usize {
            return bad("groups_max must be below 2^32".into());
        }
        if self.cursor_flush_ms == 0 || self.retention_check_ms == 0 {
            return bad("cursor_flush_ms and retention_check_ms must be positive".into());
        }
        if self.dedup_window_sends == 0 {
            return bad("dedup_window_sends must be at least 1".into());
        }
        if self.dedup_entries_max < self.dedup_window_sends {
            return bad("dedup_entries_max must be at least dedup_window_sends".into());
        }
        if self.dedup_entries_total_max < self.dedup_window_sends {
            return bad("dedup_entries_total_max must be at least dedup_window_sends".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::new("/tmp/x").validate().unwrap();
    }

    #[test]
    fn fsync_policy_parses_the_documented_forms() {
        assert_eq!(
            "always".parse::<FsyncPolicy>().unwrap(),
            FsyncPolicy::Always
        );
        assert_eq!("never".parse::<FsyncPolicy>().unwrap(), FsyncPolicy::Never);
        assert_eq!(
            "interval:250".parse::<FsyncPolicy>().unwrap(),
            FsyncPolicy::Interval(Duration::from_millis(250))
        );
        for bad in ["", "sometimes", "interval:", "interval:0", "interval:x"] {
            assert!(bad.parse::<FsyncPolicy>().is_err(), "{bad}");
        }
    }

    #[test]
    fn journal_file_bytes_must_hold_a_frame_of_the_largest_record_and_fit_u32() {
        let mut c = Config::new("/tmp/x");
        c.journal_file_bytes = u32::MAX as u64 + 1;
        assert!(c.validate().is_err());
        c.journal_file_bytes = c.payload_bytes_max as u64;
        assert!(c.validate().is_err());
        c.journal_file_bytes = (48 + 64 + 16 + c.record_bytes_max()) as u64;
        c.validate().unwrap();
    }

    #[test]
    fn segment_smaller_than_largest_record_is_rejected() {
        let mut c = Config::new("/tmp/x");
        c.segment_bytes_max = c.payload_bytes_max as u64;
        assert!(c.validate().is_err());
    }
}
