//! One group in memory: the id-assignment state (send path) and the log
//! slot (commit and read paths), behind separate locks so senders, the
//! commit thread and readers rarely wait on each other.
//!
//! Lock order: `assign` before the engine's pending-round lock; `log` is
//! never held while taking `assign`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::dedup::DedupWindow;
use crate::group_log::{GroupLog, LogState};
use crate::membership::GroupMembers;
use crate::retention::Retention;

pub struct Group {
    pub id: u64,
    /// Dense small integer standing for the id in the cursor table.
    pub slot: u32,
    /// Member list and read counts. Never locked while a cursor-table shard
    /// lock is held.
    pub members: Mutex<GroupMembers>,
    pub retention: Mutex<Retention>,
    pub assign: Mutex<AssignState>,
    pub log: RwLock<LogSlot>,
    /// The newest applied (readable) msg_id, readable without a lock.
    visible_head: AtomicU64,
    /// Set once a DELETE_GROUP of this group was accepted (queued), before
    /// its commit round removes the group from the registry. From then on
    /// the group is not found by any request ([`Group::is_deleting`]); only
    /// the commit thread still applies the entries queued before the delete.
    /// Written with the `assign` lock held, so a send that checks it under
    /// that lock is ordered before or after the delete, never across it.
    deleting: AtomicBool,
}

/// Where the group's log is.
pub enum LogSlot {
    /// Known from the checkpoint; opened and verified on first use.
    Unloaded(LogState),
    Loaded(GroupLog),
    /// Failed verification. Kept with its last known state so a checkpoint
    /// does not forget the group; answers `GroupDamaged` until repaired.
    Damaged {
        state: LogState,
        reason: String,
    },
    /// Deleted; the registry no longer lists it.
    Deleted,
}

/// The send path's view of a group.
#[derive(Default)]
pub struct AssignState {
    /// Initialised from the log on first send (dedup window rebuilt).
    pub ready: bool,
    /// The last msg_id handed out (>= the visible head).
    pub last_id: u64,
    pub last_timestamp_ms: u64,
    /// The commit round that holds `last_id`.
    pub last_round: u64,
    pub dedup: DedupWindow,
    /// `dedup` holds the group's window (false: never built, or dropped for
    /// the node's dedup budget; rebuilt from the log before the next send).
    pub dedup_loaded: bool,
}

impl Group {
    pub fn new(id: u64, slot: u32, log: LogSlot, head: u64) -> Group {
        Group {
            id,
            slot,
            members: Mutex::new(GroupMembers::new(0)),
            retention: Mutex::new(Retention::default()),
            assign: Mutex::new(AssignState::default()),
            log: RwLock::new(log),
            visible_head: AtomicU64::new(head),
            deleting: AtomicBool::new(false),
        }
    }

    /// True once the group's deletion was accepted: every request treats the
    /// group as not found from then on, also while the deletion waits for
    /// its commit round (format-spec/protocol.md section 4.6). The one
    /// predicate behind `Engine::group` and the per-user listings.
    pub fn is_deleting(&self) -> bool {
        self.deleting.load(Ordering::Acquire)
    }

    /// Marks the group as being deleted. The caller holds `assign`.
    pub fn mark_deleting(&self, _assign: &AssignState) {
        self.deleting.store(true, Ordering::Release);
    }

    pub fn head(&self) -> u64 {
        self.visible_head.load(Ordering::Acquire)
    }

    pub fn publish_head(&self, head: u64) {
        self.visible_head.store(head, Ordering::Release);
    }
}

impl LogSlot {
    /// The state a checkpoint records for this slot (None once deleted).
    pub fn state(&self) -> Option<LogState> {
        match self {
            LogSlot::Unloaded(s) | LogSlot::Damaged { state: s, .. } => Some(s.clone()),
            LogSlot::Loaded(l) => Some(l.state()),
            LogSlot::Deleted => None,
        }
    }
}
