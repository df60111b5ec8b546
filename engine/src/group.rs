//! One group in memory: the id-assignment state (send path) and the log
//! slot (commit and read paths), behind separate locks so senders, the
//! commit thread and readers rarely wait on each other.
//!
//! Lock order: `assign` before the engine's pending-round lock; `log` is
//! never held while taking `assign`.
//!
//! A group's head passes three stages, each with one owner:
//! - *assigned*: [`AssignState::last_id`], the last msg_id handed to a
//!   sender (its record is queued in a commit round, maybe not yet in the
//!   journal). Moved only by the send path, under `assign`.
//! - *applied*: [`GroupLog::head`], the last msg_id the log holds (in its
//!   files or its unwritten tail). Its record is in the journal (synced
//!   under `fsync=always`), so applied records are durable. Moved only by
//!   `apply` (commit thread, replay) and by loading, under `log` for writing.
//! - *visible*: [`Group::head`], a copy of the applied head that readers
//!   take without a lock. Written only by [`Group::publish_head`], from the
//!   log, under `log` for writing; for a log not loaded, it is the head its
//!   recorded state names.
//!
//! Invariant: visible == applied whenever `log` is not held for writing,
//! and visible <= assigned once `assign` is ready (ids are assigned before
//! they are journaled, and journaled before they are applied). Debug
//! assertions check both where the heads move.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::dedup::DedupWindow;
use crate::group_log::{GroupLog, LoadReport, LogContext, LogState};
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
    /// The newest applied (readable) msg_id, readable without a lock: a
    /// copy of the log's head (see the module docs).
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
    /// The last msg_id handed out: the *assigned* head, >= the visible
    /// head (see the module docs).
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
    /// A group whose visible head is the one its log slot names.
    pub fn new(id: u64, slot: u32, log: LogSlot) -> Group {
        let head = log.head();
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

    /// The visible head: the newest msg_id a reader may ask for.
    pub fn head(&self) -> u64 {
        self.visible_head.load(Ordering::Acquire)
    }

    /// Makes the log's head visible. The caller holds `log` for writing
    /// (that is where `log` comes from), so publishers never race. The
    /// visible head never moves backward: a log only grows at its head.
    pub fn publish_head(&self, log: &GroupLog) {
        let old = self.visible_head.swap(log.head(), Ordering::AcqRel);
        debug_assert!(
            old <= log.head(),
            "group {}: visible head {old} would move back to {}",
            self.id,
            log.head()
        );
    }

    /// Checks (debug builds) that the visible head is the slot's head. The
    /// caller holds `log` (for reading or writing), so no publish is under
    /// way.
    pub fn debug_check_head(&self, slot: &LogSlot) {
        debug_assert!(
            matches!(slot, LogSlot::Deleted) || self.head() == slot.head(),
            "group {}: visible head {} but the log's head is {}",
            self.id,
            self.head(),
            slot.head()
        );
    }

    // --- loading (the maintenance worker, recovery) -------------------

    /// Loads the group's log if it is still as its recorded state left it
    /// (first use after open, or replay meeting the group). Returns what
    /// loading found, `None` if it was loaded already or was found damaged
    /// (then the slot says why).
    ///
    /// The verifying scan runs with no lock held (requests to the group
    /// take `log` and must not wait for the disk; neither may a checkpoint,
    /// which takes every group's `log`). The result is installed under
    /// `log` only if the slot is still the one scanned: a deletion
    /// meanwhile discards it. Cutting a torn tail is the one write, done at
    /// install under `log` for that reason (a deleted group's id may be
    /// reused by a new group at the same path).
    ///
    /// At run time only the maintenance worker calls this (one thread, so
    /// two loads of a group never overlap); recovery calls it before the
    /// worker starts.
    pub fn load_if_unloaded(&self, ctx: &LogContext) -> Option<LoadReport> {
        let state = match &*self.log.read() {
            LogSlot::Unloaded(state) => state.clone(),
            _ => return None,
        };
        let loaded = GroupLog::load(ctx, self.id, &state);
        let mut slot = self.log.write();
        if !matches!(&*slot, LogSlot::Unloaded(s) if *s == state) {
            // Deleted meanwhile: nothing is installed.
            return None;
        }
        let loaded = loaded.and_then(|(log, load)| {
            log.cut_tails(ctx, &load.cuts)?;
            Ok((log, load))
        });
        match loaded {
            Ok((log, load)) => {
                // Loading keeps the recorded head or finds records past it.
                self.publish_head(&log);
                *slot = LogSlot::Loaded(log);
                Some(load)
            }
            Err(e) => {
                log::error!("group {} is damaged: {e}", self.id);
                *slot = LogSlot::Damaged {
                    state,
                    reason: e.to_string(),
                };
                None
            }
        }
    }
}

impl LogSlot {
    /// A group whose files could not be created or found: damaged, with a
    /// placeholder state (head 0, an empty segment 1) so a checkpoint
    /// still lists it.
    pub fn damaged(reason: String) -> LogSlot {
        LogSlot::Damaged {
            state: LogState {
                head: 0,
                segments: vec![(1, crate::segment::SEGMENT_HEADER_BYTES as u64)],
            },
            reason,
        }
    }

    /// The head of the log this slot holds or names (0 once deleted).
    pub fn head(&self) -> u64 {
        match self {
            LogSlot::Loaded(l) => l.head(),
            LogSlot::Unloaded(s) | LogSlot::Damaged { state: s, .. } => s.head,
            LogSlot::Deleted => 0,
        }
    }

    /// The state a checkpoint records for this slot (None once deleted).
    pub fn state(&self) -> Option<LogState> {
        match self {
            LogSlot::Unloaded(s) | LogSlot::Damaged { state: s, .. } => Some(s.clone()),
            LogSlot::Loaded(l) => Some(l.state()),
            LogSlot::Deleted => None,
        }
    }
}
