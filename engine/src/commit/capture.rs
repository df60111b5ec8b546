//! The hand-over of checkpoints between the commit thread and the
//! checkpointer thread (`state/checkpointer.rs`): the commit thread
//! *captures* (K1, between two rounds: the dirty lists, the journal's next
//! position, the pinned journal files) and leaves the [`Capture`] here;
//! the checkpointer takes it and does the rest while rounds go on. Both
//! threads and the facade wait on [`Coordination`]. The commit thread
//! knows the checkpointer only through this.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::commit::dirty::Taken;
use crate::commit::journal::JournalStart;
use crate::group::Group;

/// One capture (K1), handed from the commit thread.
pub(crate) struct Capture {
    pub taken: Taken<Group>,
    /// Replay starts with the frame numbered `replay.lsn` (the next one at
    /// the capture), in journal file `replay.seq`; `replay.round` is the
    /// round index it will carry.
    pub replay: JournalStart,
    /// The last round applied before the capture.
    pub round: u64,
    /// The last capture of a clean shutdown.
    pub clean: bool,
    /// Apply the retention policies first (`Engine::checkpoint`).
    pub retention: bool,
    /// The journal files with small groups' records at the capture
    /// (`reclaim::pinned`), which the manifest keeps.
    pub pinned: Vec<u64>,
}

/// What the commit thread, the facade and the checkpointer share.
#[derive(Default)]
pub(crate) struct Status {
    /// A capture waiting for this thread.
    pub job: Option<Capture>,
    /// This thread is working on a capture.
    pub busy: bool,
    /// The round of the last capture whose checkpoint was stored or put
    /// off (`Engine::checkpoint` waits for it).
    pub attempted_through: u64,
    /// This thread asks for a capture (retention dropped segments, or a
    /// put-off checkpoint is due again), not before `wanted_at`.
    pub wanted: bool,
    pub wanted_at: Option<Instant>,
    pub shutdown: bool,
    pub exited: bool,
}

/// The checkpointer's half of the shared state.
#[derive(Default)]
pub(crate) struct Coordination {
    pub status: Mutex<Status>,
    pub cv: Condvar,
}
