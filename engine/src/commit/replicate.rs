//! Replication hooks (format-spec/storage.md section 17): what the Raft
//! layer (`server/cluster`) needs from the engine, with no networking
//! here. A leader's rounds are read back as their journal
//! payloads ([`Engine::read_rounds`], by positioned reads where the round
//! index, `journal/rounds.rs`, says they lie); a follower takes them with
//! [`Engine::append_replicated`], which writes each payload unchanged in
//! this node's own envelope and applies it through the one applier
//! (`apply.rs`, `Mode::Replicated`). The leader fixed every msg_id,
//! timestamp and join cursor before it wrote the round, so the follower's
//! group logs hold byte-identical records.
//!
//! What a follower checks before anything is written (a payload that fails
//! is refused with a typed error and leaves no trace): the payload CRC and
//! structure (as recovery checks a frame); `round_index` is its last round
//! plus one (`RoundOutOfOrder` otherwise: a gap or a round it holds); the
//! entries are sorted by group id, each body is well formed for its kind,
//! every entry but CreateGroup names a group that exists at that point of
//! the round (CreateGroup one that does not), and each group's records
//! continue its assigned head (`InvalidRound` otherwise).
//!
//! Ids never collide: a replicated round's records go through the same
//! send-state discipline as local sends (`AssignState`, under the group's
//! assign lock and the pending-round lock): the follower checks that they
//! continue `last_id` and then counts them in (`last_id`, the timestamp,
//! the dedup window, so a retransmit to a node that later leads is
//! recognised). A local send on a follower therefore gets the id after the
//! replicated ones, never one of them. Refusing local writes while a node
//! follows is the replica layer's job (a follower answers NOT_LEADER); the
//! engine's own guard is that a local frame that takes the round number a
//! queued payload was checked against stops writes rather than let two
//! rounds share a number (`commit/thread.rs`).
//!
//! Determinism: applying a round depends on the node's state and on the
//! membership limits (`members_per_group_max`, `groups_per_user_max`: a
//! join over a limit is refused on every node alike), which must therefore
//! be equal on all replicas.
//!
//! Costs: `append_replicated` is one pass over the payload (CRC, entry
//! walk, record CRCs), one assign lock per group with records, one commit
//! round; calls are serialised (one payload in flight), each waiting for
//! its round to be durable under the fsync policy. A round that needs the
//! maintenance worker first (a group's send state not in memory; while
//! the saved state loads, a group or a user's saved groups not registered
//! yet) is not taken: `try_append_replicated` answers `NotReady` with the
//! job's ticket, and the caller hands it over again once the ticket is
//! settled (`append_replicated` waits for it), so the caller's thread
//! never reads the mapped runs nor waits for the worker. `read_rounds`
//! is two positioned reads per round.

use std::sync::Arc;

use crate::commit::dedup::WindowLimits;
use crate::commit::journal::frame::{self, PAYLOAD_HEADER_BYTES};
use crate::commit::journal::rounds::{self, RoundPayload};
use crate::commit::journal::{body, EntryIter, EntryKind, FrameKind};
use crate::commit::loading::JoinNeeds;
use crate::commit::thread::{ReplicatedRound, Reply};
use crate::engine::{Engine, OpTicket};
use crate::error::{Error, Result};
use crate::group::Group;
use crate::logs::record;

/// The records of a payload for a group that exists before it, with the
/// first msg_id they must continue from.
struct GroupRecords<'a> {
    group: Arc<Group>,
    first: u64,
    runs: Vec<&'a [u8]>,
}

impl Engine {
    /// The oldest round whose payload [`Engine::read_rounds`] can return;
    /// `last_round() + 1` when the retained journal holds none (after a
    /// restart: a lagging follower then needs a snapshot).
    pub fn first_round(&self) -> u64 {
        self.shared.ctx.rounds.first_round()
    }

    /// The round index a payload carries (storage.md section 5, its
    /// header's `round_index`), `None` if it is shorter than a header. The
    /// payload is not checked: [`Engine::append_replicated`] does that.
    pub fn round_index_of(payload: &[u8]) -> Option<u64> {
        frame::payload_header(payload).map(|h| h.round_index)
    }

    /// The newest round written to the journal (0 before the first).
    pub fn last_round(&self) -> u64 {
        self.shared.ctx.rounds.last_round()
    }

    /// The replicated payloads of rounds `lo..=hi`, oldest first, byte for
    /// byte as the journal holds them: as many as fit `bytes_max`, but at
    /// least one. `RoundCompacted` for a round before [`Self::first_round`],
    /// `RoundNotWritten` for `hi` after [`Self::last_round`], `Corrupt` for
    /// a frame damaged on disk.
    pub fn read_rounds(&self, lo: u64, hi: u64, bytes_max: usize) -> Result<Vec<RoundPayload>> {
        let ctx = &self.shared.ctx;
        rounds::read_rounds(
            &*ctx.vfs,
            &crate::commit::journal::journal_dir(&ctx.config.data_dir),
            &ctx.rounds,
            lo,
            hi,
            bytes_max,
        )
    }

    /// [`Engine::try_append_replicated`], waiting for the maintenance
    /// worker's jobs it needs (for a caller that may wait: tests, tools).
    pub fn append_replicated(&self, payload: &[u8]) -> Result<u64> {
        self.blocking(|| self.try_append_replicated(payload))
    }

    /// Takes a round another node wrote (a payload [`Engine::read_rounds`]
    /// returned there): checks it (module docs), writes it unchanged in
    /// this node's envelope, syncs it per the fsync policy and applies it.
    /// Returns its `round_index` once it is durable and applied. A refused
    /// payload is `InvalidRound` or `RoundOutOfOrder` (or the error of a
    /// group it names, e.g. `GroupDamaged`), and nothing was written.
    ///
    /// `NotReady` (nothing written, nothing queued, the round still the
    /// next one) when the round needs a job of the maintenance worker
    /// first: a group's send state, or, while the saved state loads in the
    /// background, a group or a user's saved groups registered from the
    /// mapped runs ([`Self::groups_registered`]). The caller hands the same
    /// payload over again once the ticket is settled
    /// ([`Engine::settled_load`]; [`Engine::state_load_settled`] for
    /// [`crate::STATE_TICKET`]); the commit listeners are told when it is.
    /// So the calling thread (a replica's raft driver) never reads a run
    /// nor waits for the worker; it waits only for the round's own write
    /// (and sync).
    pub fn try_append_replicated(&self, payload: &[u8]) -> Result<u64> {
        self.check_writable()?;
        // One payload in flight: each is checked against the rounds
        // written before it.
        let _one = self.shared.replicating.lock();
        let invalid = |reason: String| Error::InvalidRound { reason };
        if u32::try_from(payload.len()).is_err() {
            return Err(invalid(format!("payload of {} bytes", payload.len())));
        }
        let header = frame::check_payload(payload, FrameKind::Round).map_err(invalid)?;
        let expected = self.last_round().saturating_add(1);
        if header.round_index != expected {
            return Err(Error::RoundOutOfOrder {
                round: header.round_index,
                expected,
            });
        }
        self.groups_registered(payload)?;
        self.append_replicated_once(payload, header.round_index)
    }

    /// While the checkpoint's state loads in the background: `Ok` once
    /// every group the payload names is registered or known absent (its
    /// checks look the groups up in the catalog) and every join's
    /// per-user limit, which counts every group of its user, is decided as
    /// the leader decided it (`LimitsWhileLoading`): by the load's bound,
    /// or with the user's saved groups registered, or, without a complete
    /// user index, once the whole state is. Otherwise `NotReady` with the
    /// ticket of the maintenance worker's job that does the lookups in the
    /// mapped runs (`Need::Registered`, `Need::UserGroups`: the jobs a
    /// client's request queues, so both coalesce) or
    /// [`crate::STATE_TICKET`]: every job the round needs is asked for at
    /// once, and the ticket is the latest of them.
    ///
    /// No run is read here, on the thread that hands the round over (a
    /// replica's driver, whose ticks and heartbeats must not wait for a
    /// block read), nor by the commit thread that applies the round: it
    /// finds every group and membership it needs registered.
    fn groups_registered(&self, payload: &[u8]) -> Result<()> {
        if !self.shared.load.loading() {
            return Ok(());
        }
        let s = &self.shared;
        let limit = s.ctx.config.groups_per_user_max;
        let mut not_ready = None;
        let mut wait = |e: Error| match e {
            Error::NotReady { .. } => {
                crate::commit::worker_jobs::keep_latest(&mut not_ready, e);
                Ok(())
            }
            other => Err(other),
        };
        for e in EntryIter::new(&payload[PAYLOAD_HEADER_BYTES..], FrameKind::Round) {
            // Registered, or known absent (the checks refuse an entry of
            // a group that does not exist), or the worker's lookup.
            match self.try_group(e.group_id) {
                Ok(_) | Err(Error::GroupNotFound { .. }) => {}
                Err(other) => wait(other)?,
            }
            if e.kind != EntryKind::Join {
                continue;
            }
            // A body that does not decode is refused by the checks.
            let Some((user, _)) = body::decode_join(e.body) else {
                continue;
            };
            let registered = self.try_user_groups(user)?;
            match s
                .load
                .join_needs(user, registered, s.cursors.groups_of(user), limit)
            {
                JoinNeeds::Nothing => {}
                JoinNeeds::UserGroups => wait(self.register_user_groups(user))?,
                JoinNeeds::WholeState => {
                    if let Err(whole) = self.whole_state() {
                        wait(whole)?;
                    }
                }
            }
        }
        not_ready.map_or(Ok(()), Err)
    }

    /// One try of [`Engine::append_replicated`] once the payload's CRC,
    /// structure and round number passed: `NotReady` (nothing queued) if a
    /// group's send state is not in memory, the worker asked to build
    /// every such group's.
    fn append_replicated_once(&self, payload: &[u8], round_index: u64) -> Result<u64> {
        let invalid = |reason: String| Error::InvalidRound { reason };
        let with_records = self.check_entries(payload).map_err(invalid)?;
        // In group id order (the payload's), as `submit_batch` locks.
        let mut slots: Vec<_> = with_records.iter().map(|g| g.group.assign.lock()).collect();
        let mut not_ready = None;
        for (g, slot) in with_records.iter().zip(slots.iter_mut()) {
            let assign = match self.ready_to_assign(&g.group, slot) {
                Ok(assign) => assign,
                Err(e @ Error::NotReady { .. }) => {
                    crate::commit::worker_jobs::keep_latest(&mut not_ready, e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            if assign.last_id.checked_add(1) != Some(g.first) {
                return Err(invalid(format!(
                    "the records of group {} start at msg_id {}, but its last id is {}",
                    g.group.id, g.first, assign.last_id
                )));
            }
        }
        if let Some(e) = not_ready {
            return Err(e);
        }
        let reply = Arc::new(Reply::default());
        let mut p = self.lock_pending(false, false)?;
        p.replicated.push(ReplicatedRound {
            payload: payload.to_vec(),
            round_index,
            reply: reply.clone(),
        });
        let round = p.round;
        let limits = WindowLimits::from_config(&self.shared.ctx.config);
        let budget = &self.shared.dedup;
        for (g, slot) in with_records.iter().zip(slots.iter_mut()) {
            // Invariant: ready_to_assign filled every slot above.
            let assign = slot
                .as_deref_mut()
                .expect("invariant: send state built above");
            for run in &g.runs {
                let mut rest: &[u8] = run;
                while !rest.is_empty() {
                    // Invariant: check_entries verified every record.
                    let h = record::decode_header(rest, usize::MAX)
                        .expect("invariant: verified records");
                    // As the leader's send path remembered it: its kind
                    // and target too (a gap without a key).
                    budget.remember_record(
                        &mut assign.dedup,
                        &h,
                        &rest[..h.record_len as usize],
                        limits,
                        self.shared.ctx.config.dedup_entries_total_max,
                    );
                    assign.last_id = h.msg_id;
                    assign.last_timestamp_ms = assign.last_timestamp_ms.max(h.timestamp_ms);
                    rest = &rest[h.record_len as usize..];
                }
            }
            assign.last_round = round;
        }
        drop(p);
        drop(slots);
        self.shared.pending_cv.notify_all();
        if let Some(g) = with_records.first() {
            self.fit_dedup_budget(g.group.id);
        }
        self.wait_op(OpTicket::pending(round, Some(reply)))
    }

    /// Checks the entries of a payload whose CRC and structure passed
    /// (module docs); returns the records of each group that exists before
    /// the payload, in group id order.
    fn check_entries<'a>(&self, payload: &'a [u8]) -> Result<Vec<GroupRecords<'a>>, String> {
        let mut out: Vec<GroupRecords<'a>> = Vec::new();
        let mut current: Option<u64> = None;
        // The state of the current group as the round goes: whether it
        // exists, the group that existed before the round while its entries
        // still apply to it, and the msg_id its next records must have
        // (unknown until the assign state is read, for a group that
        // existed before).
        let mut exists = false;
        let mut original: Option<Arc<Group>> = None;
        let mut next_id: Option<u64> = None;
        let catalog = self.shared.catalog.read();
        for e in EntryIter::new(&payload[PAYLOAD_HEADER_BYTES..], FrameKind::Round) {
            if current.is_some_and(|c| e.group_id < c) {
                return Err(format!(
                    "entries not sorted by group id at group {}",
                    e.group_id
                ));
            }
            if current != Some(e.group_id) {
                current = Some(e.group_id);
                original = catalog
                    .get(e.group_id)
                    .filter(|g| !g.is_deleting())
                    .cloned();
                exists = original.is_some();
                next_id = None;
            }
            let g = e.group_id;
            if e.kind != EntryKind::CreateGroup && !exists {
                return Err(format!(
                    "a {:?} entry for group {g}, which does not exist",
                    e.kind
                ));
            }
            let well_formed = match e.kind {
                EntryKind::CreateGroup => {
                    if exists {
                        return Err(format!("CreateGroup for group {g}, which exists"));
                    }
                    exists = true;
                    original = None;
                    next_id = Some(1);
                    e.body.is_empty()
                }
                EntryKind::DeleteGroup => {
                    exists = false;
                    original = None;
                    e.body.is_empty()
                }
                EntryKind::Records => {
                    let Some((first, count)) = body::decode_records(e.body) else {
                        return Err(format!("group {g}: a Records body that is not valid records with consecutive msg_ids"));
                    };
                    if next_id.is_some_and(|n| n != first) {
                        return Err(format!(
                            "group {g}: records start at msg_id {first}, {} was expected",
                            next_id.unwrap_or(0)
                        ));
                    }
                    next_id = Some(first.saturating_add(count));
                    if let Some(group) = &original {
                        match out.last_mut() {
                            Some(r) if r.group.id == g => r.runs.push(e.body),
                            _ => out.push(GroupRecords {
                                group: group.clone(),
                                first,
                                runs: vec![e.body],
                            }),
                        }
                    }
                    true
                }
                EntryKind::Join => body::decode_join(e.body).is_some(),
                EntryKind::Leave => body::decode_leave(e.body).is_some(),
                EntryKind::SetRetention => body::decode_set_retention(e.body).is_some(),
                EntryKind::ClearHistory => body::decode_clear_history(e.body).is_some(),
                EntryKind::Cursors => {
                    !e.body.is_empty() && e.body.len() % body::CURSOR_ROW_BYTES == 0
                }
            };
            if !well_formed {
                return Err(format!("group {g}: a malformed {:?} body", e.kind));
            }
        }
        Ok(out)
    }
}
