//! Members and tidemarks: join, leave, ACK (single and batched), pull above
//! the cursor, unread counts, sync, history and read receipts.
//!
//! Joins and leaves are journaled and take effect when their commit round
//! is applied (on the commit thread), so a checkpoint's snapshot of the
//! memberships always matches the journal position it names. ACKs change
//! only memory; moved cursors reach the journal in bulk every
//! `cursor_flush_ms` and with every checkpoint.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::commit::journal::{body, EntryKind};
use crate::commit::loading::JoinNeeds;
use crate::commit::thread::Reply;
use crate::engine::{Engine, OpTicket};
use crate::error::{Error, Result};
use crate::group::{Group, LogSlot};
use crate::logs::group_log::{scanned, ReadBatch, Scan};
use crate::logs::retention::Retention;

/// Where a new member's cursor starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JoinStart {
    /// At the head: history before the join is not the member's.
    Head,
    /// Below the earliest stored message: everything stored is unread.
    Earliest,
    /// Unread from this msg_id on (clamped to what is stored).
    At(u64),
}

/// The outcome of [`Engine::ack_move`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckMove {
    /// The member's cursor after the ACK.
    pub cursor: u64,
    /// The ACK moved it (a lower or equal id does not).
    pub moved: bool,
}

/// The outcome of one pair of [`Engine::batch_ack`].
#[derive(Debug)]
pub struct AckOutcome {
    /// The member's cursor right after this pair was applied (or refused);
    /// 0 when the user is not a member or the group is not found.
    pub cursor: u64,
    /// Why the pair was refused; `None` when it was applied.
    pub error: Option<Error>,
}

/// What a pull returns.
pub struct Pull {
    /// The member's cursor after `ack_up_to` was applied (the records start above it).
    pub cursor: u64,
    pub head: u64,
    pub batch: ReadBatch,
}

/// One row of `unread(user)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unread {
    pub group_id: u64,
    pub head: u64,
    pub cursor: u64,
    pub unread: u64,
}

/// One group of a sync answer.
pub struct SyncGroup {
    pub unread: Unread,
    pub batch: ReadBatch,
}

pub struct Sync {
    pub groups: Vec<SyncGroup>,
    /// Resume with `sync(.., after_group = Some(id))` to get the rest.
    pub continue_after: Option<u64>,
}

/// A page of history: records in ascending id order, the page being the
/// newest records below `before` that fit its count and byte limits.
pub struct History {
    pub batch: ReadBatch,
    /// Oldest msg_id this member may see: its join point, raised to the floor.
    pub earliest_visible: u64,
    /// True when this page reaches `earliest_visible` (no older page).
    pub complete: bool,
    /// True when retention dropped messages the member could have seen.
    pub truncated_by_retention: bool,
}

/// The group id of the one-to-one chat of `a` and `b` (either order): a
/// group of two whose id both sides compute without a lookup. The top bit is
/// set, so direct chats never collide with ids below 2^63 that an
/// application assigns to ordinary groups; two pairs collide with
/// probability about 2^-63 each (SplitMix64 of the ordered pair).
pub fn direct_group_id(a: u64, b: u64) -> u64 {
    let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let h = mix(lo.wrapping_add(0x9e37_79b9_7f4a_7c15) ^ mix(hi));
    h | (1 << 63)
}

impl Engine {
    /// Queues one entry of `group` (found by the caller) with a reply,
    /// without the free-space check (the caller made the checks its
    /// request needs).
    fn submit_group_entry(
        &self,
        group: &Arc<Group>,
        kind: EntryKind,
        body: impl FnOnce(&mut Vec<u8>),
    ) -> Result<OpTicket> {
        let group_id = group.id;
        let reply = Arc::new(Reply::default());
        let _assign = group.assign.lock();
        // Checked again under the lock, which orders this op against a delete.
        if group.is_deleting() {
            return Err(Error::GroupNotFound { group: group_id });
        }
        let round = self.push_entry_with_reply(group, kind, body, Some(reply.clone()))?;
        Ok(OpTicket::pending(round, Some(reply)))
    }

    /// Adds `user` to the group with its cursor at `start`; returns the
    /// cursor. Durable when it returns. Joining again returns the cursor.
    pub fn join(&self, group_id: u64, user: u64, start: JoinStart) -> Result<u64> {
        let ticket = self.submit_join(group_id, user, start)?;
        self.wait_op(ticket)
    }

    /// Queues a join; the ticket's value is the member's cursor. A join
    /// reads no file and builds no send state: it never waits for the
    /// disk. It may wait for a background load of the saved state to end
    /// (its user may be near `groups_per_user_max`).
    pub fn submit_join(&self, group_id: u64, user: u64, start: JoinStart) -> Result<OpTicket> {
        self.blocking(|| self.try_submit_join(group_id, user, start))
    }

    /// [`Engine::submit_join`] that never waits: while the saved state
    /// loads and neither the user's registered groups nor the load's bound
    /// decide the join (`commit/loading.rs`), `NotReady` with the ticket of
    /// the worker's job that registers the user's saved groups (then it is
    /// decided exactly), or with [`crate::STATE_TICKET`] when the saved
    /// state has no complete user index.
    pub fn try_submit_join(&self, group_id: u64, user: u64, start: JoinStart) -> Result<OpTicket> {
        let group = self.try_group(group_id)?;
        let cursors = &self.shared.cursors;
        if let Some(c) = cursors.get(user, group.slot) {
            return Ok(OpTicket::done(c.cursor));
        }
        // Its limit counts every group of the user: while the state loads,
        // it goes on once the count is exact or the load's bound decides it
        // (looked up only then: a join's path pays one atomic load).
        let load = &self.shared.load;
        if load.loading() {
            let limit = self.shared.ctx.config.groups_per_user_max;
            let registered = self.try_user_groups(user)?;
            match load.join_needs(user, registered, cursors.groups_of(user), limit) {
                JoinNeeds::Nothing => {}
                JoinNeeds::UserGroups => return Err(self.register_user_groups(user)),
                JoinNeeds::WholeState => self.whole_state()?,
            }
        }
        self.check_writable()?;
        let assign = group.assign.lock();
        // Checked again under the lock, which orders the join against a delete.
        if group.is_deleting() {
            return Err(Error::GroupNotFound { group: group_id });
        }
        // The cursor is resolved against the assigned head: it counts every
        // record queued before this join, which is exactly what precedes it
        // in the journal, so the cursor is resolved here, once, and replay
        // reproduces it. Without a send state no record of the group is
        // queued (a state is dropped only once its last round completed),
        // so the assigned head is the applied one, the log's, loaded or not (a log left unloaded by recovery or the
        // idle sweep does not grow when loaded: recovery loads every group
        // whose segments may lead the journal). So no log is loaded and no
        // window rebuilt for a join.
        let (head, below) = {
            let log = group.log.read();
            match &*log {
                LogSlot::Damaged { reason, .. } => {
                    return Err(Error::GroupDamaged {
                        group: group_id,
                        reason: reason.clone(),
                    })
                }
                LogSlot::Deleted => return Err(Error::GroupNotFound { group: group_id }),
                LogSlot::Loaded(_) | LogSlot::Unloaded(_) | LogSlot::Small(_) => {}
            }
            if assign.is_some() || matches!(&*log, LogSlot::Loaded(_)) {
                // A use: what the group holds stays (not its window's use
                // for the dedup budget: a join sends nothing).
                self.shared.dedup.touch_used(group_id);
            }
            let head = assign.as_deref().map_or_else(|| log.head(), |a| a.last_id);
            (head, log.floor().saturating_sub(1))
        };
        let cursor = match start {
            JoinStart::Head => head,
            JoinStart::Earliest => below,
            JoinStart::At(m) => m.saturating_sub(1).clamp(below, head.max(below)),
        };
        let reply = Arc::new(Reply::default());
        let round = self.push_entry_with_reply(
            &group,
            EntryKind::Join,
            |b| body::encode_join(b, user, cursor),
            Some(reply.clone()),
        )?;
        Ok(OpTicket::pending(round, Some(reply)))
    }

    /// Removes `user` from the group. Durable when it returns.
    pub fn leave(&self, group_id: u64, user: u64) -> Result<()> {
        let ticket = self.submit_leave(group_id, user)?;
        self.wait_op(ticket).map(|_| ())
    }

    /// Queues a leave.
    pub fn submit_leave(&self, group_id: u64, user: u64) -> Result<OpTicket> {
        self.blocking(|| self.try_submit_leave(group_id, user))
    }

    /// [`Engine::submit_leave`] that never reads the disk: `NotReady`
    /// while the group is looked up in the saved state still loading
    /// (`Engine::try_group`).
    pub fn try_submit_leave(&self, group_id: u64, user: u64) -> Result<OpTicket> {
        let group = self.try_group(group_id)?;
        if self.shared.cursors.get(user, group.slot).is_none() {
            return Err(Error::NotMember {
                group: group_id,
                user,
            });
        }
        self.check_writable()?;
        self.submit_group_entry(&group, EntryKind::Leave, |b| body::encode_leave(b, user))
    }

    /// Sets the group's retention policy. Durable when it returns.
    pub fn set_retention(&self, group_id: u64, policy: Retention) -> Result<()> {
        let ticket = self.submit_set_retention(group_id, policy)?;
        self.wait_op(ticket).map(|_| ())
    }

    /// Queues a SetRetention entry; the policy holds once its round
    /// completes, and the checkpointer's next retention pass applies it.
    /// Accepted while the disk is nearly full, like a delete: a policy is
    /// how an operator gives space back, and its entry is 33 bytes.
    pub fn submit_set_retention(&self, group_id: u64, policy: Retention) -> Result<OpTicket> {
        self.blocking(|| self.try_submit_set_retention(group_id, policy))
    }

    /// [`Engine::submit_set_retention`] that never reads the disk:
    /// `NotReady` while the group is looked up in the saved state still
    /// loading (`Engine::try_group`).
    pub fn try_submit_set_retention(&self, group_id: u64, policy: Retention) -> Result<OpTicket> {
        self.check_not_stopped()?;
        let group = self.try_group(group_id)?;
        self.submit_group_entry(&group, EntryKind::SetRetention, |b| {
            body::encode_set_retention(b, &policy)
        })
    }

    /// Clears the member's history up to `up_to` (OpenIM's per-user
    /// floor): its join point rises to `up_to + 1`, so HISTORY, PULL and
    /// SYNC never again return a record at or below `up_to` to it, and its
    /// cursor rises to `up_to` (clearing acknowledges what it clears, so its
    /// unread count stays the number of records it can still read). Never
    /// lowers either; other members are untouched. `up_to` above the head
    /// clears everything (it is resolved against the head when queued, so
    /// the journaled value is exact and replay reproduces it). Returns the
    /// join point; durable when it returns.
    pub fn clear_history(&self, group_id: u64, user: u64, up_to: u64) -> Result<u64> {
        let ticket = self.submit_clear_history(group_id, user, up_to)?;
        self.wait_op(ticket)
    }

    /// Queues a history clear (a ClearHistory entry); the ticket's value is
    /// the member's join point after it. `NotMember` for a user who is no
    /// member.
    pub fn submit_clear_history(&self, group_id: u64, user: u64, up_to: u64) -> Result<OpTicket> {
        self.blocking(|| self.try_submit_clear_history(group_id, user, up_to))
    }

    /// [`Engine::submit_clear_history`] that never reads the disk (memory
    /// only): `NotReady` while the group is looked up in the saved state
    /// still loading (`Engine::try_group`).
    pub fn try_submit_clear_history(
        &self,
        group_id: u64,
        user: u64,
        up_to: u64,
    ) -> Result<OpTicket> {
        self.check_writable()?;
        let group = self.try_group(group_id)?;
        self.member_cursor(&group, user)?;
        let assign = group.assign.lock();
        // Checked again under the lock, which orders this op against a delete.
        if group.is_deleting() {
            return Err(Error::GroupNotFound { group: group_id });
        }
        // As for a join: the assigned head counts every record queued
        // before this entry, which is what precedes it in the journal.
        let head = assign
            .as_deref()
            .map_or_else(|| group.log.read().head(), |a| a.last_id);
        let up_to = up_to.min(head);
        let reply = Arc::new(Reply::default());
        let round = self.push_entry_with_reply(
            &group,
            EntryKind::ClearHistory,
            |b| body::encode_clear_history(b, user, up_to),
            Some(reply.clone()),
        )?;
        Ok(OpTicket::pending(round, Some(reply)))
    }

    /// True if `user` is a member of the group.
    pub fn is_member(&self, group_id: u64, user: u64) -> bool {
        self.group(group_id)
            .is_ok_and(|g| self.shared.cursors.get(user, g.slot).is_some())
    }

    /// The group's members in ascending user id order.
    pub fn members(&self, group_id: u64) -> Result<Vec<u64>> {
        Ok(self.group(group_id)?.members.lock().users())
    }

    /// The group's member count and member-list version: the version
    /// changes whenever a member joins or leaves and never repeats (not even
    /// for a group deleted and created again), so callers can cache what
    /// they derive from [`Self::members`] until it changes.
    pub fn members_version(&self, group_id: u64) -> Result<MembersVersion> {
        let group = self.group(group_id)?;
        let m = group.members.lock();
        Ok(MembersVersion {
            version: m.version(),
            count: m.len(),
        })
    }

    /// A page of the group's members with their cursors, in ascending user
    /// id order: at most `max` members whose id is above `after_user` (0:
    /// from the first). The next page starts after the last user returned.
    /// O(log members + page × log(groups of a member)): the member list is
    /// kept sorted (`membership.rs`), so a page is a search and a merge of
    /// its two sorted parts, then one cursor lookup per member returned;
    /// the group's size only enters through the search. Reads memory only
    /// (a group's log need not be loaded).
    ///
    /// Pages taken while members join and leave list every member present
    /// throughout exactly once (ids only ascend from page to page); one who
    /// joins or leaves meanwhile may or may not be listed.
    pub fn members_page(&self, group_id: u64, after_user: u64, max: usize) -> Result<MembersPage> {
        self.blocking(|| self.try_members_page(group_id, after_user, max))
    }

    /// [`Engine::members_page`] that never reads the disk: `NotReady`
    /// while the group is looked up in the saved state still loading
    /// (`Engine::try_group`).
    pub fn try_members_page(
        &self,
        group_id: u64,
        after_user: u64,
        max: usize,
    ) -> Result<MembersPage> {
        let group = self.try_group(group_id)?;
        // Under the members lock the list and the cursor table agree
        // (membership.rs invariant), so every listed user has a cursor.
        let members = group.members.lock();
        let (users, has_more) = members.page_after(after_user, max);
        let cursor_of = group.cursor_of(&self.shared.cursors);
        let page = users.into_iter().map(|u| (u, cursor_of(u))).collect();
        Ok(MembersPage {
            members: page,
            has_more,
        })
    }

    /// What GROUP_INFO answers: the group's committed head, its retention
    /// floor, its member count and its retention policy. O(1) (memory only:
    /// a log left unloaded still knows its segments).
    pub fn group_info(&self, group_id: u64) -> Result<GroupInfo> {
        self.blocking(|| self.try_group_info(group_id))
    }

    /// [`Engine::group_info`] that never reads the disk: `NotReady` while
    /// the group is looked up in the saved state still loading
    /// (`Engine::try_group`).
    pub fn try_group_info(&self, group_id: u64) -> Result<GroupInfo> {
        let group = self.try_group(group_id)?;
        let head = group.head();
        let floor = group.log.read().floor();
        let members = group.members.lock().len();
        Ok(GroupInfo {
            head,
            floor,
            members,
            retention: group.retention(),
        })
    }

    /// Moves the member's cursor forward to `msg_id` and returns the cursor.
    /// A lower or equal id changes nothing; an id above the head is refused.
    /// Memory only: persisted in bulk (see the module docs).
    pub fn ack(&self, group_id: u64, user: u64, msg_id: u64) -> Result<u64> {
        Ok(self.ack_move(group_id, user, msg_id)?.cursor)
    }

    /// [`Engine::ack`], also saying whether the cursor moved (what a
    /// receipt reports), at no extra cost.
    pub fn ack_move(&self, group_id: u64, user: u64, msg_id: u64) -> Result<AckMove> {
        self.blocking(|| self.try_ack_move(group_id, user, msg_id))
    }

    /// [`Engine::ack_move`] that never reads the disk: `NotReady` (before
    /// anything moved) while the group is looked up in the saved state
    /// still loading (`Engine::try_group`).
    pub fn try_ack_move(&self, group_id: u64, user: u64, msg_id: u64) -> Result<AckMove> {
        let group = self.try_group(group_id)?;
        self.ack_in(&group, user, msg_id)
    }

    /// The ACK of [`Engine::try_ack_move`] in `group`, found by the caller.
    fn ack_in(&self, group: &Arc<Group>, user: u64, msg_id: u64) -> Result<AckMove> {
        let group_id = group.id;
        let head = group.head();
        if msg_id > head {
            // Checked before touching the cursor so a refused ACK moves nothing.
            self.member_cursor(group, user)?;
            return Err(Error::CursorAboveHead {
                group: group_id,
                requested: msg_id,
                head,
            });
        }
        // The members lock spans the move (membership.rs invariant).
        let mut members = group.members.lock();
        let Some(m) = self.shared.cursors.advance(user, group.slot, msg_id) else {
            return Err(Error::NotMember {
                group: group_id,
                user,
            });
        };
        if m.new != m.old {
            members.advance(m.old, m.new);
            self.shared.counters.acks.fetch_add(1, Ordering::Relaxed);
        }
        // Lock order: a group's `ckpt` before its members.
        drop(members);
        if m.newly_checkpoint_dirty {
            // Once per membership per checkpoint: the next one stores it.
            group.cursor_moved(&self.shared.ctx.dirty, user);
        }
        Ok(AckMove {
            cursor: m.new,
            moved: m.new != m.old,
        })
    }

    /// Acknowledges many `(group, msg_id)` pairs of one user, in order; one
    /// outcome per pair. A failed pair reports the member's cursor as it
    /// stands right after that pair (before the next one is applied), found
    /// with one membership lookup: the cost is O(pairs × log(groups of the
    /// user)), never pairs × groups. It may wait for the lookups of its
    /// groups in a saved state still loading ([`Engine::try_batch_ack`]).
    pub fn batch_ack(&self, user: u64, acks: &[(u64, u64)]) -> Vec<AckOutcome> {
        match self.blocking(|| self.try_batch_ack(user, acks)) {
            Ok(outcomes) => outcomes,
            // The worker stopped while the lookups waited for it: nothing
            // was applied.
            Err(_) => acks
                .iter()
                .map(|_| AckOutcome {
                    cursor: 0,
                    error: Some(Error::ShuttingDown),
                })
                .collect(),
        }
    }

    /// [`Engine::batch_ack`] that never reads the disk. Every group the
    /// pairs name is looked up first (`Engine::try_lookup`, one lookup
    /// per group): while one of them must be looked up in the saved state
    /// still loading, nothing is applied and the whole batch gets
    /// `NotReady` with the ticket of the last of those lookups, so one
    /// worker hop covers them all; run again after it, every lookup's
    /// answer is final and the pairs are applied in order with the groups
    /// found, each getting its outcome as after a full load. (Applying the
    /// pairs up to the first unregistered group and parking the rest would
    /// have to keep a partial answer and ACKs already applied: a batch
    /// applies whole or not at all, so running it again is the same
    /// request.) The only error is `NotReady`.
    pub fn try_batch_ack(&self, user: u64, acks: &[(u64, u64)]) -> Result<Vec<AckOutcome>> {
        // After the load (it starts only at open, so it never starts
        // again) every lookup's answer is final at once: each pair looks
        // its group up as it is applied, with no map of the batch's groups
        // on the ACK path.
        let found = if self.shared.load.loading() {
            Some(self.try_lookup_all(acks.iter().map(|&(g, _)| g))?)
        } else {
            None
        };
        let outcomes = acks.iter().map(|&(g, m)| {
            let looked_up;
            let lookup = match &found {
                Some(found) => found.get(&g),
                None => {
                    looked_up = self.try_lookup(g);
                    Some(&looked_up)
                }
            };
            match lookup {
                Some(Ok(Some(group))) if !group.is_deleting() => {
                    match self.ack_in(group, user, m) {
                        Ok(a) => AckOutcome {
                            cursor: a.cursor,
                            error: None,
                        },
                        Err(e) => AckOutcome {
                            cursor: self.member_cursor(group, user).map_or(0, |c| c.cursor),
                            error: Some(e),
                        },
                    }
                }
                Some(Err(e)) => AckOutcome {
                    cursor: 0,
                    error: Some(lookup_error_again(g, e)),
                },
                _ => AckOutcome {
                    cursor: 0,
                    error: Some(Error::GroupNotFound { group: g }),
                },
            }
        });
        Ok(outcomes.collect())
    }

    /// The member's cursor in one group: a hash lookup of the user and a
    /// binary search of its memberships. `GroupNotFound` (also while the
    /// group's deletion is pending) or `NotMember`.
    pub fn cursor(&self, group_id: u64, user: u64) -> Result<u64> {
        let group = self.group(group_id)?;
        Ok(self.member_cursor(&group, user)?.cursor)
    }

    /// [`Engine::cursor`] that never reads the disk: `NotReady` while the
    /// group is looked up in the saved state still loading
    /// (`Engine::try_group`).
    pub fn try_cursor(&self, group_id: u64, user: u64) -> Result<u64> {
        let group = self.try_group(group_id)?;
        Ok(self.member_cursor(&group, user)?.cursor)
    }

    fn member_cursor(
        &self,
        group: &Group,
        user: u64,
    ) -> Result<crate::members::cursors::MemberCursor> {
        self.shared
            .cursors
            .get(user, group.slot)
            .ok_or(Error::NotMember {
                group: group.id,
                user,
            })
    }

    /// Records above the member's cursor: applies `ack_up_to` first (the
    /// last id of the previous page), then reads at most `max_count` records
    /// and `max_bytes` bytes (at least one record if any).
    pub fn pull(
        &self,
        group_id: u64,
        user: u64,
        max_count: usize,
        max_bytes: usize,
        ack_up_to: Option<u64>,
    ) -> Result<Pull> {
        self.blocking(|| self.try_pull(group_id, user, max_count, max_bytes, ack_up_to))
    }

    /// [`Engine::pull`] that never waits for the disk: `NotReady` when the
    /// group's log must be loaded first (checked before `ack_up_to` is
    /// applied) or a sealed segment's index built (after: applying it
    /// again when the pull runs again changes nothing).
    pub fn try_pull(
        &self,
        group_id: u64,
        user: u64,
        max_count: usize,
        max_bytes: usize,
        ack_up_to: Option<u64>,
    ) -> Result<Pull> {
        let group = self.try_group(group_id)?;
        self.ensure_loaded(&group)?;
        if let Some(a) = ack_up_to {
            self.ack(group_id, user, a)?;
        }
        let cursor = self.member_cursor(&group, user)?.cursor;
        let head = group.head();
        let batch = self.with_log(&group, |log| {
            if cursor + 1 < log.floor() {
                return Err(Error::BelowRetentionFloor {
                    group: group_id,
                    earliest: log.floor(),
                });
            }
            log.read_with(
                &self.shared.ctx,
                Scan::Refused,
                cursor,
                max_count,
                max_bytes,
            )
        })?;
        Ok(Pull {
            cursor,
            head,
            batch,
        })
    }

    /// For every group of `user`: head, cursor and unread count, in
    /// ascending group id order. O(groups of the user). A group whose
    /// deletion is pending is left out, as every request treats it as gone.
    pub fn unread(&self, user: u64) -> Vec<Unread> {
        if self.blocking(|| self.user_state(user)).is_err() {
            self.shared.load.wait_settled();
        }
        self.unread_now(user)
    }

    /// [`Engine::unread`] that never waits for the disk: while the
    /// checkpoint's state loads in the background, the user's saved groups
    /// are registered from the user index first, by the maintenance
    /// worker (a lookup per group it names, once per user and load):
    /// `NotReady` with its job's ticket until then, or with
    /// [`crate::STATE_TICKET`] when the saved state has no complete index
    /// (a user's groups are then known only once every group is).
    pub fn try_unread(&self, user: u64) -> Result<Vec<Unread>> {
        self.user_state(user)?;
        Ok(self.unread_now(user))
    }

    fn unread_now(&self, user: u64) -> Vec<Unread> {
        let mut out = Vec::new();
        let mut rows = 0u64;
        let catalog = self.shared.catalog.read();
        self.shared.cursors.for_each_of_user(user, |slot, cursor| {
            rows += 1;
            if let Some(g) = catalog.by_slot(slot).filter(|g| !g.is_deleting()) {
                let head = g.head();
                out.push(Unread {
                    group_id: g.id,
                    head,
                    cursor,
                    // Edits and recalls, and recalled messages, are not
                    // unread (`logs/changes.rs`).
                    unread: g.unread_of(cursor, head),
                });
            }
        });
        drop(catalog);
        self.shared
            .counters
            .membership_rows_listed
            .fetch_add(rows, Ordering::Relaxed);
        out.sort_unstable_by_key(|u| u.group_id);
        out
    }

    /// Every group of `user` with unread messages, with its unread count and
    /// the first page above its cursor (at most `per_group_max` records),
    /// within `total_max_bytes` (the first group's first record is always
    /// returned). Groups come in ascending id order, starting after
    /// `after_group`; `continue_after` says where to resume.
    pub fn sync(
        &self,
        user: u64,
        per_group_max: usize,
        total_max_bytes: usize,
        after_group: Option<u64>,
    ) -> Result<Sync> {
        self.blocking(|| self.try_sync(user, per_group_max, total_max_bytes, after_group))
    }

    /// [`Engine::sync`] that never waits for the disk: `NotReady` when a
    /// group it would read must be loaded first. The loads of all such
    /// groups are queued at once (tickets complete in order, so the last
    /// one covers them all).
    pub fn try_sync(
        &self,
        user: u64,
        per_group_max: usize,
        total_max_bytes: usize,
        after_group: Option<u64>,
    ) -> Result<Sync> {
        let mut groups = Vec::new();
        let mut budget = total_max_bytes;
        let mut continue_after = None;
        let pending: Vec<Unread> = self
            .try_unread(user)?
            .into_iter()
            // Records above the cursor, counted or not: an edit or a
            // recall of a read message is not unread but is delivered.
            .filter(|u| u.head > u.cursor && after_group.is_none_or(|a| u.group_id > a))
            .collect();
        let mut not_ready = None;
        for u in &pending {
            if let Ok(group) = self.try_group(u.group_id) {
                if let Err(e @ Error::NotReady { .. }) = self.ensure_loaded(&group) {
                    not_ready = Some(e);
                }
            }
        }
        if let Some(e) = not_ready {
            return Err(e);
        }
        for u in pending {
            let page_budget = if groups.is_empty() {
                budget.max(1)
            } else {
                budget
            };
            if page_budget == 0 {
                continue_after = groups.last().map(|g: &SyncGroup| g.unread.group_id);
                break;
            }
            let pull = match self.try_pull(u.group_id, user, per_group_max, page_budget, None) {
                Ok(p) => p,
                // Left or deleted since the unread list was taken: skip it.
                Err(Error::NotMember { .. } | Error::GroupNotFound { .. }) => continue,
                // Listed without records; a pull of the group says why.
                Err(Error::BelowRetentionFloor { .. } | Error::GroupDamaged { .. }) => Pull {
                    cursor: u.cursor,
                    head: u.head,
                    batch: ReadBatch {
                        last_id: u.cursor,
                        ..Default::default()
                    },
                },
                Err(e) => return Err(e),
            };
            if !groups.is_empty() && pull.batch.bytes > budget {
                continue_after = groups.last().map(|g: &SyncGroup| g.unread.group_id);
                break;
            }
            budget = budget.saturating_sub(pull.batch.bytes);
            let unread = Unread {
                cursor: pull.cursor,
                head: pull.head,
                unread: self
                    .try_group(u.group_id)
                    .map_or(pull.head - pull.cursor, |g| {
                        g.unread_of(pull.cursor, pull.head)
                    }),
                ..u
            };
            groups.push(SyncGroup {
                unread,
                batch: pull.batch,
            });
        }
        Ok(Sync {
            groups,
            continue_after,
        })
    }

    /// Older messages for roaming: the newest records below `before_msg_id`
    /// (below the head + 1 when `None`), never below the member's join
    /// point: at most `max_count` of them and at most `max_bytes` bytes,
    /// except that the newest is returned whatever its size. The work is
    /// bounded by the page, not by `max_count` (see `GroupLog::read_before`).
    pub fn history(
        &self,
        group_id: u64,
        user: u64,
        before_msg_id: Option<u64>,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<History> {
        self.blocking(|| self.try_history(group_id, user, before_msg_id, max_count, max_bytes))
    }

    /// [`Engine::history`] that never waits for the disk: `NotReady` when
    /// the group's log or a sealed segment's index must be read first.
    pub fn try_history(
        &self,
        group_id: u64,
        user: u64,
        before_msg_id: Option<u64>,
        max_count: usize,
        max_bytes: usize,
    ) -> Result<History> {
        let group = self.try_group(group_id)?;
        let join_point = self.member_cursor(&group, user)?.join_point;
        let head = group.head();
        self.with_log(&group, |log| {
            let floor = log.floor();
            let earliest = join_point.max(floor);
            let before = before_msg_id.unwrap_or(head + 1).min(head + 1);
            let batch = scanned!(log.read_before(
                &self.shared.ctx,
                Scan::Refused,
                before,
                earliest,
                max_count,
                max_bytes
            ));
            // The oldest id of the page (ids are dense); for an empty page,
            // where a page of `max_count` would have started.
            let start = if batch.count > 0 {
                batch.last_id + 1 - batch.count
            } else {
                earliest.max(before.saturating_sub(max_count as u64))
            };
            Ok(Ok(History {
                batch,
                earliest_visible: earliest,
                complete: start <= earliest,
                truncated_by_retention: join_point < floor,
            }))
        })
    }

    /// How many members' cursors are at or above `msg_id` (read receipts).
    /// O(log of the cursor range) in a group of more than 64 members (a
    /// tree), one cursor lookup per member in a smaller one.
    pub fn read_count(&self, group_id: u64, msg_id: u64) -> Result<u32> {
        self.blocking(|| self.try_read_count(group_id, msg_id))
    }

    /// [`Engine::read_count`] that never reads the disk: `NotReady` while
    /// the group is looked up in the saved state still loading
    /// (`Engine::try_group`).
    pub fn try_read_count(&self, group_id: u64, msg_id: u64) -> Result<u32> {
        Ok(self
            .try_group(group_id)?
            .read_count(&self.shared.cursors, msg_id))
    }

    /// Persists every moved cursor now and waits until durable (tests and
    /// graceful shutdown; the commit thread does this on its own timer).
    pub fn flush_cursors(&self) -> Result<()> {
        let round = self.request_cursor_flush()?;
        self.wait_round(round)
    }
}

/// A group's lookup error again, for each pair of a batch that names the
/// group (`Error` is not `Clone`: an `Io` error's source is not): a lookup
/// fails only with the load's `Corrupt` (the group's saved items do not
/// decode) or `ShuttingDown`; any other kind would be told as
/// `GroupDamaged` with its text.
fn lookup_error_again(group: u64, e: &Error) -> Error {
    match e {
        Error::Corrupt {
            path,
            group,
            offset,
            reason,
        } => Error::Corrupt {
            path: path.clone(),
            group: *group,
            offset: *offset,
            reason: reason.clone(),
        },
        Error::ShuttingDown => Error::ShuttingDown,
        other => Error::GroupDamaged {
            group,
            reason: other.to_string(),
        },
    }
}

/// See [`Engine::members_page`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembersPage {
    /// `(user, cursor)` in ascending user id order.
    pub members: Vec<(u64, u64)>,
    /// Members above the last one returned remain.
    pub has_more: bool,
}

/// See [`Engine::group_info`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupInfo {
    /// The newest committed msg_id (0: none yet).
    pub head: u64,
    /// The oldest stored msg_id (1 until retention drops messages; above
    /// `head` when nothing is stored).
    pub floor: u64,
    pub members: usize,
    /// The group's policy ([`Retention::default`]: keeps everything).
    pub retention: Retention,
}

/// See [`Engine::members_version`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MembersVersion {
    pub version: u64,
    pub count: usize,
}

impl LogSlot {
    /// The oldest stored msg_id.
    pub(crate) fn floor(&self) -> u64 {
        match self {
            LogSlot::Loaded(l) => l.floor(),
            LogSlot::Unloaded(s) | LogSlot::Damaged { state: s, .. } => {
                s.segments.first().map_or(1, |s| s.0)
            }
            LogSlot::Small(list) => list.floor(),
            LogSlot::Deleted => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_group_id_is_symmetric_and_in_the_direct_namespace() {
        assert_eq!(direct_group_id(3, 9), direct_group_id(9, 3));
        assert_ne!(direct_group_id(3, 9), direct_group_id(3, 10));
        assert!(direct_group_id(1, 2) >= 1 << 63);
    }
}

/// MEMBERS and GROUP_INFO's engine calls: pages by user id with the
/// members' cursors, and a group's head, floor, count and policy.
#[cfg(test)]
mod member_list_tests {
    use super::*;
    use crate::Config;

    #[test]
    fn member_pages_list_everyone_once_with_their_cursors() {
        let dir = tempfile::tempdir().unwrap();
        let e = Engine::open(Config::new(dir.path())).unwrap();
        e.create_group(1).unwrap();
        for i in 1..=5 {
            e.append(1, 999, i, b"m").unwrap();
        }
        // 150 members (past the read-count tree's threshold), ids spread.
        let users: Vec<u64> = (1..=150u64).map(|u| u * 7919 % 100_003).collect();
        for &u in &users {
            e.join(1, u, JoinStart::Earliest).unwrap();
        }
        for &u in users.iter().step_by(3) {
            e.ack(1, u, u % 6).unwrap();
        }
        let mut want: Vec<(u64, u64)> = users
            .iter()
            .map(|&u| (u, e.cursor(1, u).unwrap()))
            .collect();
        want.sort_unstable();
        let (mut got, mut after): (Vec<(u64, u64)>, u64) = (Vec::new(), 0);
        loop {
            let page = e.members_page(1, after, 11).unwrap();
            assert!(page.members.len() <= 11);
            got.extend(&page.members);
            match page.members.last() {
                Some(&(last, _)) if page.has_more => after = last,
                _ => break,
            }
        }
        assert_eq!(got, want);
        assert!(want.iter().any(|&(_, c)| c > 0), "some cursors moved");
        assert_eq!(
            e.members_page(2, 0, 10).unwrap_err().to_string(),
            Error::GroupNotFound { group: 2 }.to_string()
        );

        let info = e.group_info(1).unwrap();
        assert_eq!((info.head, info.floor, info.members), (5, 1, 150));
        assert!(info.retention.keeps_everything());
        let policy = Retention {
            by_cursor: true,
            max_age_ms: 86_400_000,
            max_bytes: 1 << 30,
        };
        e.set_retention(1, policy).unwrap();
        e.leave(1, users[0]).unwrap();
        let info = e.group_info(1).unwrap();
        assert_eq!((info.members, info.retention), (149, policy));
        e.create_group(3).unwrap();
        let empty = e.group_info(3).unwrap();
        assert_eq!((empty.head, empty.floor, empty.members), (0, 1, 0));
    }
}
