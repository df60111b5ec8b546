//! Engine options. Every limit has a unit in its name, a default here (one
//! constant in [`defaults`], which `Config::new` and `tidemark serve`'s
//! flags take, and which a test checks against the "Limits" table of
//! format-spec/storage.md), and a line in that table.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::logs::record::RECORD_HEADER_BYTES;

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

/// The largest `small_group_bytes_max`: a promotion copies that much on
/// the commit thread, once per group.
pub const SMALL_GROUP_BYTES_LIMIT: u64 = 16 << 20;

/// The default of every engine limit, one constant each: `Config::new`
/// takes them, `tidemark serve` shows them as its flags' defaults, and a
/// test checks them against format-spec/storage.md section 13. The
/// relationships `Config::validate` checks hold between them at compile
/// time (the assertions below the module).
pub mod defaults {
    pub const SEGMENT_BYTES_MAX: u64 = 32 << 20;
    pub const SMALL_GROUP_BYTES_MAX: u64 = 64 << 10;
    pub const INDEX_INTERVAL_BYTES: u32 = 4096;
    pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;
    pub const OPEN_SEGMENTS_MAX: usize = 16_384;
    pub const DEDUP_WINDOW_SENDS: usize = 10_000;
    pub const DEDUP_WINDOW_MS: u64 = 10 * 60 * 1000;
    pub const DEDUP_ENTRIES_MAX: usize = 1_000_000;
    pub const DEDUP_ENTRIES_TOTAL_MAX: usize = 10_000_000;
    pub const IDLE_EVICT_MS: u64 = 10 * 60 * 1000;
    pub const CHECKPOINT_JOURNAL_BYTES: u64 = 64 << 20;
    pub const CHECKPOINT_DIRTY_GROUPS_MAX: usize = 1_000_000;
    pub const CHECKPOINT_INTERVAL_MS: u64 = 60_000;
    pub const RUN_FILE_BYTES_MAX: u64 = 256 << 20;
    pub const JOURNAL_FILE_BYTES: u64 = 64 << 20;
    pub const SEGMENT_TAIL_BYTES: usize = 16 << 10;
    pub const COMMIT_ROUND_BYTES_MAX: usize = 8 << 20;
    /// `groups_max` has no constant: it follows the memory the process
    /// may use ([`crate::sizing::default_groups_max`]).
    pub use crate::sizing::default_groups_max as groups_max;
    pub const MEMBERS_PER_GROUP_MAX: usize = 500_000;
    pub const GROUPS_PER_USER_MAX: usize = 20_000;
    pub const CURSOR_FLUSH_MS: u64 = 1000;
    pub const RETENTION_CHECK_MS: u64 = 60_000;
    /// A message may be edited or recalled for a day after it was sent.
    pub const CHANGE_WINDOW_MS: u64 = 86_400_000;
    pub const DISK_FREE_MIN_BYTES: u64 = 64 << 20;
}

/// Options of an engine. `Config::new(dir)` gives the documented defaults.
#[derive(Clone, Debug)]
pub struct Config {
    pub data_dir: PathBuf,
    pub fsync: FsyncPolicy,
    /// A segment is sealed and a new one started before it would exceed this.
    pub segment_bytes_max: u64,
    /// A group whose records take at most this many bytes keeps them in
    /// the shared journal, without files of its own; past it they are
    /// promoted to its own segment files (storage v2 design section 4).
    /// 0 promotes at the first record: every group with a record has its
    /// segment files, as in 0.1. Small groups' records leave old journal
    /// files for cold files after checkpoints (`rewrite.rs`). At most
    /// [`SMALL_GROUP_BYTES_LIMIT`].
    pub small_group_bytes_max: u64,
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
    /// Open with the checkpoint's groups and memberships loaded in the
    /// background (`state/lazy.rs`): the engine opens once the runs'
    /// checksums are checked and the journal tail is replayed, and a
    /// group is taken from the runs by its first request. `false` (the
    /// library's default) loads everything before `open` returns; the
    /// node's default is `true`.
    pub load_in_background: bool,
    /// Test knob, 0 in production: the background loader waits this long
    /// before each batch, so that tests can act (and crash) while a load
    /// is pending.
    pub load_batch_pause_ms: u64,
    /// A checkpoint is taken once this many journal bytes were written
    /// since the last one's replay position...
    pub checkpoint_journal_bytes: u64,
    /// ...or once this many groups changed since the last capture...
    pub checkpoint_dirty_groups_max: usize,
    /// ...or this long after the last one, if anything changed.
    pub checkpoint_interval_ms: u64,
    /// A checkpoint's run files are cut into parts of at most this many
    /// bytes (at most `RUN_FILE_BYTES_READ_MAX`, 1 GiB, the largest part a
    /// reader accepts).
    pub run_file_bytes_max: u64,
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
    /// Groups an engine holds. Default: from the memory the process may
    /// use (`sizing.rs`).
    pub groups_max: usize,
    pub members_per_group_max: usize,
    pub groups_per_user_max: usize,
    /// Moved cursors are written to the journal at least this often.
    pub cursor_flush_ms: u64,
    /// Retention policies are applied at least this often.
    pub retention_check_ms: u64,
    /// The retention policy every group created from now on gets (a
    /// SetRetention entry journaled with its creation, so it is stored per
    /// group: changing this later changes no existing group, and a
    /// replica applies the creator's policy, not its own default). The
    /// default keeps everything.
    pub retention_default: crate::Retention,
    /// How long after a message was accepted its sender (or an
    /// administrator) may edit or recall it (`edits.rs`).
    pub change_window_ms: u64,
    /// Below this much free disk space, new writes are refused with
    /// `DiskFull` (nothing is assigned or written), and accepted again by
    /// themselves once space returns. 0 disables the check.
    pub disk_free_min_bytes: u64,
}

impl Config {
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        use defaults::*;
        Config {
            data_dir: data_dir.into(),
            fsync: FsyncPolicy::Always,
            segment_bytes_max: SEGMENT_BYTES_MAX,
            small_group_bytes_max: SMALL_GROUP_BYTES_MAX,
            index_interval_bytes: INDEX_INTERVAL_BYTES,
            payload_bytes_max: PAYLOAD_BYTES_MAX,
            open_segments_max: OPEN_SEGMENTS_MAX,
            dedup_window_sends: DEDUP_WINDOW_SENDS,
            dedup_window_ms: DEDUP_WINDOW_MS,
            dedup_entries_max: DEDUP_ENTRIES_MAX,
            dedup_entries_total_max: DEDUP_ENTRIES_TOTAL_MAX,
            idle_evict_ms: IDLE_EVICT_MS,
            load_in_background: false,
            load_batch_pause_ms: 0,
            checkpoint_journal_bytes: CHECKPOINT_JOURNAL_BYTES,
            checkpoint_dirty_groups_max: CHECKPOINT_DIRTY_GROUPS_MAX,
            checkpoint_interval_ms: CHECKPOINT_INTERVAL_MS,
            run_file_bytes_max: RUN_FILE_BYTES_MAX,
            journal_file_bytes: JOURNAL_FILE_BYTES,
            segment_tail_bytes: SEGMENT_TAIL_BYTES,
            commit_round_bytes_max: COMMIT_ROUND_BYTES_MAX,
            groups_max: groups_max(),
            members_per_group_max: MEMBERS_PER_GROUP_MAX,
            groups_per_user_max: GROUPS_PER_USER_MAX,
            cursor_flush_ms: CURSOR_FLUSH_MS,
            retention_check_ms: RETENTION_CHECK_MS,
            retention_default: crate::Retention {
                by_cursor: false,
                max_age_ms: 0,
                max_bytes: 0,
            },
            change_window_ms: CHANGE_WINDOW_MS,
            disk_free_min_bytes: DISK_FREE_MIN_BYTES,
        }
    }

    /// The largest record this configuration can produce.
    pub fn record_bytes_max(&self) -> usize {
        RECORD_HEADER_BYTES + self.payload_bytes_max
    }
}

/// `Config::new` with small groups off (`small_group_bytes_max` 0): every
/// group with a record has its own segment files. For the tests of segment
/// logs (loads, idle unloads, segment damage, full disks at segment
/// writes), which small groups would otherwise never reach; small groups
/// have their own tests (`small_log_tests`, `checkpoint_tests`,
/// `engine_ops`).
#[cfg(test)]
impl Config {
    pub(crate) fn segmented(data_dir: impl Into<PathBuf>) -> Config {
        Config {
            small_group_bytes_max: 0,
            ..Config::new(data_dir)
        }
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
    fn a_run_part_limit_a_reader_would_refuse_is_rejected() {
        let mut c = Config::new("/tmp/x");
        c.run_file_bytes_max = crate::state::run::RUN_FILE_BYTES_READ_MAX + 1;
        assert!(c.validate().is_err());
        c.run_file_bytes_max = crate::state::run::RUN_FILE_BYTES_READ_MAX;
        c.validate().unwrap();
        c.run_file_bytes_max = 4096;
        c.validate().unwrap();
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
    fn small_group_bytes_max_is_bounded_not_by_the_segment_size() {
        let mut c = Config::new("/tmp/x");
        c.small_group_bytes_max = SMALL_GROUP_BYTES_LIMIT + 1;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("must be at most"), "{e}");
        // A promotion appends through the segment log, which rolls: a
        // threshold above one segment is fine.
        c.segment_bytes_max = 8192;
        c.payload_bytes_max = 1024;
        c.small_group_bytes_max = SMALL_GROUP_BYTES_LIMIT;
        c.validate().unwrap();
        c.small_group_bytes_max = 0;
        c.validate().unwrap();
    }

    #[test]
    fn segment_smaller_than_largest_record_is_rejected() {
        let mut c = Config::new("/tmp/x");
        c.segment_bytes_max = c.payload_bytes_max as u64;
        assert!(c.validate().is_err());
    }
}
