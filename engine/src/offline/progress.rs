//! How far [`DataDir::verify_with_progress`](super::DataDir) is: the bytes
//! it has checked of the bytes it will read, and what kind of file it is
//! reading, reported to a caller's callback (`tidemark ctl verify` draws a
//! progress bar from it on a terminal; the engine draws nothing).
//!
//! The total is counted before the first read from what the directory
//! state already lists, without reading or walking anything twice: the
//! fallback checkpoint's run bytes (its manifest records them), the
//! journal files replay would read (one `stat` each, from the listing the
//! check makes anyway), every segment's length as the checkpoint records
//! it and every small group's extent bytes.
//!
//! Invariants: `checked` never decreases and never exceeds `total`; the
//! last report has `checked == total`. Within a unit (a journal file, a
//! group) the count moves with the records walked, capped at the unit's
//! size (damage skips bytes; an active segment written after the
//! checkpoint holds more than it records); at a unit's end it is the
//! unit's size, whatever was read.
//!
//! Costs: a report at each unit's start and end and at most one per
//! [`REPORT_STEP_BYTES`] within a unit, so the callback's cost stays small
//! beside the reads and CRCs it reports on.

/// Bytes checked between two reports within one unit.
pub const REPORT_STEP_BYTES: u64 = 1 << 20;

/// What `verify` is reading when it reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// The run parts of the fallback checkpoint (the one before the one
    /// in force), each checked alone.
    FallbackRuns,
    /// A journal file replay would read: its header and frames.
    Journal,
    /// A group's segment files.
    Segments,
    /// A small group's records, in extents of journal and cold files.
    Extents,
}

impl Reading {
    /// A short name for the kind of file (a progress line shows it).
    pub fn name(&self) -> &'static str {
        match self {
            Reading::FallbackRuns => "checkpoint runs",
            Reading::Journal => "journal",
            Reading::Segments => "segments",
            Reading::Extents => "small groups",
        }
    }
}

/// One report of `verify`'s progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VerifyProgress {
    /// Bytes checked so far (module docs: monotone, at most `total`).
    pub checked: u64,
    /// Bytes the check reads in all, counted before it starts.
    pub total: u64,
    pub reading: Reading,
}

/// The counter behind the reports: units (a journal file, a group, the
/// fallback's runs) begun and ended in turn, with the bytes walked in
/// between.
pub(crate) struct Meter<'a> {
    sink: Option<&'a mut dyn FnMut(VerifyProgress)>,
    total: u64,
    /// Bytes of the units ended.
    ended: u64,
    /// The unit under way: its size and the bytes walked in it.
    unit: u64,
    walked: u64,
    reading: Reading,
    /// `checked` at the last report.
    reported: u64,
}

impl<'a> Meter<'a> {
    /// A meter of `total` bytes reporting to `sink`.
    pub(crate) fn new(total: u64, sink: &'a mut dyn FnMut(VerifyProgress)) -> Meter<'a> {
        Meter {
            sink: Some(sink),
            total,
            ended: 0,
            unit: 0,
            walked: 0,
            reading: Reading::Journal,
            reported: 0,
        }
    }

    /// A meter that reports to no one (a check run for its findings only).
    pub(crate) fn quiet() -> Meter<'static> {
        Meter {
            sink: None,
            total: 0,
            ended: 0,
            unit: 0,
            walked: 0,
            reading: Reading::Journal,
            reported: 0,
        }
    }

    fn checked(&self) -> u64 {
        (self.ended + self.walked.min(self.unit)).min(self.total)
    }

    fn report(&mut self) {
        let checked = self.checked();
        self.reported = checked;
        let p = VerifyProgress {
            checked,
            total: self.total,
            reading: self.reading,
        };
        if let Some(sink) = self.sink.as_mut() {
            sink(p);
        }
    }

    /// A unit of `bytes` (as the total counted it) begins.
    pub(crate) fn begin(&mut self, reading: Reading, bytes: u64) {
        self.reading = reading;
        self.unit = bytes;
        self.walked = 0;
        self.report();
    }

    /// `bytes` of the unit under way were walked.
    pub(crate) fn walked(&mut self, bytes: u64) {
        self.walked = self.walked.saturating_add(bytes);
        if self.checked() - self.reported >= REPORT_STEP_BYTES {
            self.report();
        }
    }

    /// The unit under way ended: all of its bytes count as checked.
    pub(crate) fn end(&mut self) {
        self.ended = self.ended.saturating_add(self.unit);
        self.unit = 0;
        self.walked = 0;
        self.report();
    }

    /// The check is over: the last report says everything was checked
    /// (units that ended early, a journal file with nothing to walk, still
    /// counted in the total).
    pub(crate) fn finish(&mut self) {
        self.ended = self.total;
        self.unit = 0;
        self.walked = 0;
        self.report();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within a unit, reports come every `REPORT_STEP_BYTES` and stop at
    /// the unit's size however much more is walked; `finish` reaches the
    /// total even when a unit ended early.
    #[test]
    fn a_unit_reports_in_steps_capped_at_its_size() {
        let mut seen = Vec::new();
        let mut sink = |p: VerifyProgress| seen.push(p.checked);
        let mut m = Meter::new(10 * REPORT_STEP_BYTES, &mut sink);
        m.begin(Reading::Segments, 3 * REPORT_STEP_BYTES);
        for _ in 0..8 {
            m.walked(REPORT_STEP_BYTES / 2);
        }
        m.end();
        m.begin(Reading::Journal, 5 * REPORT_STEP_BYTES);
        m.walked(REPORT_STEP_BYTES);
        m.finish();
        let s = REPORT_STEP_BYTES;
        assert_eq!(
            seen,
            [0, s, 2 * s, 3 * s, 3 * s, 3 * s, 4 * s, 10 * s],
            "in steps of {s}"
        );
    }
}
