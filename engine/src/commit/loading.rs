//! Whether the saved state is still being registered after the engine
//! opened (`state/lazy.rs` registers it; format-spec/storage.md section 11,
//! "Loading in the background"), for the requests and threads that need
//! every group: the flag they read, the wait, and their refusal meanwhile.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::catalog::UserGroups;
use crate::error::{Error, Result, STATE_TICKET};

/// Why a load stopped, as `Error::Corrupt` says it: path, group, offset,
/// reason.
type Failure = (PathBuf, Option<u64>, u64, String);

/// Whether the checkpoint's state is still loading, for the engine's
/// requests and threads. One owner: the loader thread ends it.
#[derive(Default)]
pub(crate) struct LoadStatus {
    loading: AtomicBool,
    /// The loader stopped at damage (or panicked): waiters go on and get
    /// this error.
    failed: Mutex<Option<Failure>>,
    /// Ask the loader to stop between batches (a simulated crash).
    stop: AtomicBool,
    ended: Mutex<()>,
    ended_cv: Condvar,
    /// How the limits are decided while the load runs (set by `start`).
    limits: Mutex<Option<Arc<LimitsWhileLoading>>>,
}

impl LoadStatus {
    pub(crate) fn loading(&self) -> bool {
        self.loading.load(Ordering::Acquire)
    }

    /// Requests waiting for the whole state may run (again): the load
    /// ended, or stopped at damage (they then get its error).
    pub(crate) fn settled(&self) -> bool {
        !self.loading() || self.failed.lock().is_some()
    }

    /// Why the load stopped, if it did.
    pub(crate) fn failure(&self) -> Option<Error> {
        let failed = self.failed.lock();
        let (path, group, offset, reason) = failed.as_ref()?;
        Some(Error::Corrupt {
            path: path.clone(),
            group: *group,
            offset: *offset,
            reason: reason.clone(),
        })
    }

    /// Blocks until [`LoadStatus::settled`].
    pub(crate) fn wait_settled(&self) {
        let mut g = self.ended.lock();
        while !self.settled() {
            self.ended_cv.wait(&mut g);
        }
    }

    /// The loader ended: done (`None`), or stopped at `failed` (then the
    /// state stays loading: what needs all of it gets the error).
    /// `state_dir` names the failure when it is not `Error::Corrupt`.
    pub(crate) fn end(&self, failed: Option<&Error>, state_dir: PathBuf) {
        let _g = self.ended.lock();
        match failed {
            None => {
                self.loading.store(false, Ordering::Release);
                *self.limits.lock() = None;
            }
            Some(Error::Corrupt {
                path,
                group,
                offset,
                reason,
            }) => *self.failed.lock() = Some((path.clone(), *group, *offset, reason.clone())),
            Some(other) => *self.failed.lock() = Some((state_dir, None, 0, other.to_string())),
        }
        self.ended_cv.notify_all();
    }

    /// Asks a running loader to stop at its next batch.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Whether the loader was asked to stop.
    pub(crate) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// A load starts (before the engine's threads do); `limits` decides
    /// joins and creations until it ends (replay's joins counted in it).
    pub(crate) fn start(&self, limits: Arc<LimitsWhileLoading>) {
        *self.limits.lock() = Some(limits);
        self.loading.store(true, Ordering::Release);
    }

    /// What a join of `user` needs before it goes on (is queued, replayed
    /// or applied from a replicated round): nothing once the state is
    /// whole, else [`LimitsWhileLoading::join_needs`] with the user's
    /// saved groups as `user_groups` says and `registered` memberships of
    /// the user registered now; `limit` is `groups_per_user_max`.
    pub(crate) fn join_needs(
        &self,
        user: u64,
        user_groups: UserGroups,
        registered: usize,
        limit: usize,
    ) -> JoinNeeds {
        if !self.loading() {
            return JoinNeeds::Nothing;
        }
        let limits = self.limits.lock().clone();
        limits.map_or(JoinNeeds::WholeState, |l| {
            l.join_needs(user, user_groups, registered, limit)
        })
    }

    /// Whether a group may be created now with `registered` groups
    /// registered: the state is whole, or
    /// [`LimitsWhileLoading::admits_create`] proves it passes
    /// `groups_max` (`max`). `false`: it waits for the load.
    pub(crate) fn admits_create(&self, registered: usize, max: usize) -> bool {
        if !self.loading() {
            return true;
        }
        let limits = self.limits.lock().clone();
        limits.is_some_and(|l| l.admits_create(registered, max))
    }
}

/// How the limits that count every group are decided before every group
/// is registered: `groups_per_user_max` for a join, `groups_max` for a
/// creation.
///
/// A join is refused when its user already has `groups_per_user_max`
/// groups, and replay, a replica and the live node must all decide it as
/// they would with every group registered: each of the rules below admits
/// a join only when its apply decides it so, which is why a replica that
/// applies a round decides its joins as its leader did, whichever rule
/// each used (format-spec/storage.md section 11).
///
/// 1. Exact, from the user index (a manifest saying its index is
///    complete, version 4): once every saved group the index names for the
///    user is registered (`Catalog::find_groups_of_user`, then
///    [`UserGroups::Registered`]), the cursor table holds every membership
///    of the user and keeps holding them (groups made since are registered
///    when made; a leave, a join or a deletion changes the table itself),
///    so the apply's own check counts the user's groups exactly, also for
///    joins admitted earlier and applied in between. An index entry of a
///    group deleted since, or of a membership left since, costs a lookup
///    and registers nothing of the user (its group's own rows decide).
/// 2. The manifest's bound, before any lookup: the manifest being loaded
///    says no user had more than `groups_per_user_bound` groups in its
///    state (storage.md section 6.3), and a group not yet registered is as
///    the checkpoint left it. So when a join applies, its user has at
///    most: the memberships registered now, plus the bound in groups still
///    in the runs, plus the joins of that user admitted earlier by this
///    rule and not yet applied. If that sum is below the limit, the join
///    passes with every group registered too, and it is admitted now. The
///    earlier joins are counted by user, never uncounted (an applied one is
///    then counted twice: the sum only errs high).
///
/// A join neither rule admits needs its user's groups registered first
/// ([`JoinNeeds::UserGroups`]) or, without a complete index, the whole
/// state ([`JoinNeeds::WholeState`]). Counted only while the load runs.
///
/// A creation is checked when it is queued, under the registry's lock
/// (never on replay): the groups are at most those registered plus the
/// manifest's `groups_bound`.
pub(crate) struct LimitsWhileLoading {
    /// `None`: a manifest without bounds (version 2): no join and no
    /// creation is admitted by a bound.
    groups_per_user_bound: Option<u64>,
    groups_bound: Option<u64>,
    joins_admitted: Mutex<HashMap<u64, u64>>,
}

/// What a join needs before it goes on while the state loads
/// ([`LimitsWhileLoading`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum JoinNeeds {
    /// It is decided as with every group registered: go on.
    Nothing,
    /// Every saved group of its user registered first
    /// (`Catalog::find_groups_of_user`: lookups in the mapped runs), then
    /// it goes on.
    UserGroups,
    /// The whole state first (no complete user index).
    WholeState,
}

impl LimitsWhileLoading {
    pub(crate) fn new(groups_per_user_bound: Option<u64>, groups_bound: Option<u64>) -> Self {
        LimitsWhileLoading {
            groups_per_user_bound,
            groups_bound,
            joins_admitted: Mutex::new(HashMap::new()),
        }
    }

    /// What a join of `user`, with `registered` memberships registered now
    /// and its saved groups as `user_groups` says, needs before it goes on
    /// (type docs: the exact rule, then the bound).
    pub(crate) fn join_needs(
        &self,
        user: u64,
        user_groups: UserGroups,
        registered: usize,
        limit: usize,
    ) -> JoinNeeds {
        match user_groups {
            UserGroups::Registered => JoinNeeds::Nothing,
            _ if self.admit_join(user, registered, limit) => JoinNeeds::Nothing,
            UserGroups::Unregistered => JoinNeeds::UserGroups,
            UserGroups::Unindexed => JoinNeeds::WholeState,
        }
    }

    /// Whether a join of `user`, with `registered` memberships registered
    /// now, passes `limit` whatever the groups not yet registered hold; if
    /// so it is counted for the user's later joins (type docs, rule 2).
    fn admit_join(&self, user: u64, registered: usize, limit: usize) -> bool {
        let Some(bound) = self.groups_per_user_bound else {
            return false;
        };
        let mut admitted = self.joins_admitted.lock();
        let earlier = admitted.get(&user).copied().unwrap_or(0);
        let most = (registered as u64)
            .saturating_add(bound)
            .saturating_add(earlier);
        if most >= limit as u64 {
            return false;
        }
        admitted.insert(user, earlier + 1);
        true
    }

    /// Whether one more group passes `max` with `registered` groups
    /// registered, whatever the runs still hold.
    pub(crate) fn admits_create(&self, registered: usize, max: usize) -> bool {
        self.groups_bound
            .is_some_and(|bound| (registered as u64).saturating_add(bound) < max as u64)
    }
}

/// The process's hook told when a background load starts (`true`) and
/// when its loader thread ends (`false`), however it ends: the binary
/// tunes its allocator meanwhile (a load frees and takes pages again at a
/// high rate). Process-wide, as the allocator is; loads of several
/// engines overlap, so the hook counts them.
static LOADING_HOOK: std::sync::OnceLock<fn(bool)> = std::sync::OnceLock::new();

/// Sets the hook told when a background load of the saved state starts
/// (`true`) and ends (`false`); once per process (`false` if one was set
/// already). It runs on the engine's threads and must not block.
pub fn set_loading_hook(hook: fn(bool)) -> bool {
    LOADING_HOOK.set(hook).is_ok()
}

/// A background load in progress, for the hook: told `true` when made,
/// `false` when dropped (the loader thread holds it; a panic drops it
/// too).
pub(crate) struct LoadingHint(());

impl LoadingHint {
    pub(crate) fn start() -> LoadingHint {
        if let Some(hook) = LOADING_HOOK.get() {
            hook(true);
        }
        LoadingHint(())
    }
}

impl Drop for LoadingHint {
    fn drop(&mut self) {
        if let Some(hook) = LOADING_HOOK.get() {
            hook(false);
        }
    }
}

/// `Err` for a request that needs every group or every membership of a
/// user while the state loads: `NotReady` with [`STATE_TICKET`], or the
/// load's own error if it stopped at damage.
pub(crate) fn whole_state(load: &LoadStatus) -> Result<()> {
    if !load.loading() {
        return Ok(());
    }
    match load.failure() {
        Some(e) => Err(e),
        None => Err(Error::NotReady {
            group: 0,
            ticket: STATE_TICKET,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_join_is_admitted_while_registered_plus_bound_plus_earlier_joins_stay_below_the_limit() {
        let joins = LimitsWhileLoading::new(Some(3), None);
        // 0 registered + 3 + 0 < 5, then 0 + 3 + 1 < 5, then 0 + 3 + 2 = 5.
        assert!(joins.admit_join(1, 0, 5));
        assert!(joins.admit_join(1, 0, 5));
        assert!(!joins.admit_join(1, 0, 5));
        // Counted per user; registered memberships count too.
        assert!(joins.admit_join(2, 1, 5));
        assert!(!joins.admit_join(3, 2, 5));
        // Without a bound nothing is admitted.
        assert!(!LimitsWhileLoading::new(None, Some(0)).admit_join(1, 0, usize::MAX));
        // A bound at the top never overflows into an admission.
        let top = LimitsWhileLoading::new(Some(u64::MAX), Some(u64::MAX));
        assert!(!top.admit_join(1, 5, usize::MAX));
        assert!(!top.admits_create(5, usize::MAX));
    }

    #[test]
    fn a_creation_is_admitted_while_registered_plus_bound_stay_below_the_limit() {
        let limits = LimitsWhileLoading::new(None, Some(3));
        assert!(limits.admits_create(1, 5));
        assert!(!limits.admits_create(2, 5));
        assert!(!LimitsWhileLoading::new(Some(0), None).admits_create(0, usize::MAX));
    }

    /// The exact rule first (a user whose saved groups are registered),
    /// then the bound; a join neither admits needs the user's groups, or
    /// the whole state without a complete index.
    #[test]
    fn a_join_the_bound_cannot_decide_needs_its_users_groups_or_the_whole_state() {
        use UserGroups::{Registered, Unindexed, Unregistered};
        let joins = LimitsWhileLoading::new(Some(5), None);
        assert_eq!(
            joins.join_needs(1, Unregistered, 0, 5),
            JoinNeeds::UserGroups
        );
        assert_eq!(joins.join_needs(1, Unindexed, 0, 5), JoinNeeds::WholeState);
        // Exact: however many the user has, the apply counts them.
        assert_eq!(joins.join_needs(1, Registered, 9, 5), JoinNeeds::Nothing);
        assert_eq!(joins.join_needs(2, Unregistered, 0, 6), JoinNeeds::Nothing);
        assert_eq!(
            joins.join_needs(2, Unregistered, 0, 6),
            JoinNeeds::UserGroups
        );
        // Without bounds only the exact rule admits.
        let none = LimitsWhileLoading::new(None, None);
        assert_eq!(
            none.join_needs(1, Unregistered, 0, 99),
            JoinNeeds::UserGroups
        );
        assert_eq!(none.join_needs(1, Registered, 0, 99), JoinNeeds::Nothing);
    }

    #[test]
    fn with_the_state_whole_every_join_goes_on() {
        use UserGroups::Unindexed;
        let status = LoadStatus::default();
        assert_eq!(status.join_needs(1, Unindexed, 10, 1), JoinNeeds::Nothing);
        assert!(status.admits_create(10, 1));
        status.start(Arc::new(LimitsWhileLoading::new(Some(0), Some(0))));
        assert_eq!(
            status.join_needs(1, Unindexed, 10, 1),
            JoinNeeds::WholeState
        );
        assert_eq!(status.join_needs(1, Unindexed, 0, 1), JoinNeeds::Nothing);
        assert!(!status.admits_create(10, 1));
        assert!(status.admits_create(0, 1));
        status.end(None, PathBuf::new());
        assert_eq!(status.join_needs(1, Unindexed, 10, 1), JoinNeeds::Nothing);
        assert!(status.admits_create(10, 1));
    }
}
