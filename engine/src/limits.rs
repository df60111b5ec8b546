//! [`Config::validate`]: the relationships between a configuration's
//! limits and the fixed sizes of every format they bound (records,
//! segments, journal frames, checkpoint run parts). It sits above all of
//! those formats, which each own their constants, so that `config.rs`
//! stays a plain value the lowest layers can read.

use crate::commit::journal::{
    frame::FRAME_OVERHEAD_BYTES, ENTRY_HEADER_BYTES, JOURNAL_HEADER_BYTES,
};
use crate::config::{defaults, Config, SMALL_GROUP_BYTES_LIMIT};
use crate::error::{Error, Result};
use crate::logs::record::{RECORD_BYTES_STORED_MAX, RECORD_HEADER_BYTES};
use crate::logs::segment::SEGMENT_HEADER_BYTES;
use crate::state::run::{RUN_FILE_BYTES_MIN, RUN_FILE_BYTES_READ_MAX};

// `Config::validate`'s relationships, for the defaults, at compile time.
const _: () = {
    use defaults::*;
    let record_bytes_max = RECORD_HEADER_BYTES + PAYLOAD_BYTES_MAX;
    assert!(PAYLOAD_BYTES_MAX > 0 && record_bytes_max <= RECORD_BYTES_STORED_MAX);
    assert!(SEGMENT_BYTES_MAX >= (SEGMENT_HEADER_BYTES + record_bytes_max) as u64);
    assert!(SEGMENT_BYTES_MAX <= u32::MAX as u64);
    assert!(SMALL_GROUP_BYTES_MAX <= SMALL_GROUP_BYTES_LIMIT);
    let journal_min =
        JOURNAL_HEADER_BYTES + FRAME_OVERHEAD_BYTES + ENTRY_HEADER_BYTES + record_bytes_max;
    assert!(JOURNAL_FILE_BYTES >= journal_min as u64 && JOURNAL_FILE_BYTES <= u32::MAX as u64);
    assert!(INDEX_INTERVAL_BYTES > 0 && OPEN_SEGMENTS_MAX >= 2);
    assert!(COMMIT_ROUND_BYTES_MAX >= record_bytes_max);
    assert!(crate::sizing::GROUPS_MAX_CEILING < u32::MAX as usize);
    assert!(CURSOR_FLUSH_MS > 0 && RETENTION_CHECK_MS > 0);
    assert!(RUN_FILE_BYTES_MAX >= RUN_FILE_BYTES_MIN);
    assert!(RUN_FILE_BYTES_MAX <= RUN_FILE_BYTES_READ_MAX);
    assert!(CHECKPOINT_JOURNAL_BYTES > 0 && CHECKPOINT_DIRTY_GROUPS_MAX > 0);
    assert!(CHECKPOINT_INTERVAL_MS > 0);
    assert!(DEDUP_WINDOW_SENDS > 0);
    assert!(DEDUP_ENTRIES_MAX >= DEDUP_WINDOW_SENDS);
    assert!(DEDUP_ENTRIES_TOTAL_MAX >= DEDUP_WINDOW_SENDS);
    // A group's whole window fits the node-wide budget.
    assert!(DEDUP_ENTRIES_TOTAL_MAX >= DEDUP_ENTRIES_MAX);
};

impl Config {
    /// Checks the relationships between limits that the engine relies on.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::InvalidConfig { reason });
        if self.payload_bytes_max == 0 || self.record_bytes_max() > RECORD_BYTES_STORED_MAX {
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
        // A promotion copies a small group's records on the applying
        // thread (`commit/apply.rs`), so the threshold bounds that copy.
        if self.small_group_bytes_max > SMALL_GROUP_BYTES_LIMIT {
            return bad(format!(
                "small_group_bytes_max {} must be at most {SMALL_GROUP_BYTES_LIMIT}",
                self.small_group_bytes_max
            ));
        }
        // A journal file holds its header and at least one frame of one
        // record; offsets in it fit a u32.
        let min_journal = (JOURNAL_HEADER_BYTES
            + FRAME_OVERHEAD_BYTES
            + ENTRY_HEADER_BYTES
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
        let (lo, hi) = (RUN_FILE_BYTES_MIN, RUN_FILE_BYTES_READ_MAX);
        if !(lo..=hi).contains(&self.run_file_bytes_max) {
            return bad(format!(
                "run_file_bytes_max {} must be in [{lo}, {hi}] (the largest run part a reader accepts)",
                self.run_file_bytes_max
            ));
        }
        if self.checkpoint_journal_bytes == 0
            || self.checkpoint_dirty_groups_max == 0
            || self.checkpoint_interval_ms == 0
        {
            return bad(
                "checkpoint_journal_bytes, checkpoint_dirty_groups_max and checkpoint_interval_ms must be positive"
                    .into(),
            );
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
