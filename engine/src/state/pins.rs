//! Which journal files a checkpoint must keep because small groups' records
//! are in them (storage v2 design 4.2 step 6, rule D6): the *pinned* list a
//! manifest carries, and the deletion rule of checkpoint step K7.
//!
//! A small group's extents point into journal files that may lie before
//! the replay position of both kept manifests. Such a file must stay while
//! any kept manifest's state or the memory state names it. The state is
//! captured fuzzily (K2 copies groups one by one while rounds go on), so
//! the pinned list of checkpoint k is taken at K1:
//!
//! > `pinned(k)` = {journal files with live bytes at K1 of k}.
//!
//! Why that covers every file the state manifest k stores names: a group
//! not captured in k was not changed since its last capture (it was not
//! dirty at K1), so its stored item is its memory state at K1, whose files
//! were live then. An item captured in k names files its group pointed
//! into at its capture: either already at K1 (so live then, even if a
//! promotion or a trim between K1 and the capture took them away since),
//! or appended after K1, which are at or after the replay position of k
//! (K1 rolls the journal), kept by the replay-window rule as long as k is.
//!
//! K7 of checkpoint k deletes a journal file only if it is before the
//! replay position of both kept manifests (the existing rule), in neither
//! `pinned(k)` nor `pinned(k - 1)`, and has no live bytes now. So a file a
//! promotion leaves between checkpoints k - 1 and k goes at K7 of k + 1 at
//! the earliest (D6): both kept manifests are always complete recovery
//! points. The property test below drives the rule against a model of
//! fuzzy captures.
//!
//! Cost: `pinned(k)` is O(journal files) at K1 (memory only); the deletion
//! rule O(log pins) per file.
//!
//! Wired in: the commit thread takes `pinned` (`logs/reclaim.rs`, beside
//! the accounting it reads) at K1 into the capture, the
//! manifest stores it (format-spec/storage.md section 6.3), and
//! `checkpointer.rs` K7 asks `journal_file_deletable`.
//!
//! **Snapshot holds** ([`Holds`], format-spec/storage.md section 18): a
//! snapshot (`snapshot.rs`, an online backup, later a Raft snapshot) needs
//! the files of one stored manifest and a prefix of the journal to stay as
//! they were while it is copied, however long that takes. While any hold
//! is active, K7 deletes nothing (manifests, run parts, journal and cold
//! files, retention's graveyard), and the trash keeps what was moved into
//! it; a deleted group's directory still moves (a new group of that id
//! needs the path), and each hold notes where it went. Deferred, not lost:
//! K7 decides from listings and the graveyard list, so the first
//! checkpoint after the last hold ends deletes what the held ones kept,
//! and the first round after it queues the trash's removals.
//!
//! Invariants of [`Holds`]: `newest` is the newest stored manifest (set
//! after K6, before K7); `journal_end` is a frame boundary of the current
//! journal file at or after the end of every frame written so far minus
//! the one being written (set by the journal writer after each write and
//! roll, so it is at or after `newest`'s replay position); a hold's
//! `moved` names, per group, the first trash entry its directory moved to
//! after the hold began; `renaming` counts trash renames under way that
//! began while a hold was active. Cost: every call is one leaf lock and
//! O(1) work (a move: O(active holds)).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::commit::journal::{EndWatcher, JournalEnd};
use crate::logs::extents::{FileId, FileKind};
use crate::logs::reclaim::LiveBytes;
use crate::logs::trash::Holding;
use crate::state::manifest::Manifest;

/// What a hold captured: the manifest, the journal end, how long the
/// capture held the lock.
pub(crate) struct Held {
    pub id: u64,
    pub manifest: Arc<Manifest>,
    pub journal_end: JournalEnd,
    pub pause: Duration,
}

/// Where a held group's directory is, as far as a hold knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Whereabouts {
    /// Not moved since the hold began, and no rename under way.
    InPlace,
    /// Moved to this trash entry (the first move since the hold began).
    Moved(PathBuf),
    /// A trash rename is under way: ask again.
    Renaming,
}

#[derive(Default)]
struct HoldsInner {
    newest: Option<Arc<Manifest>>,
    journal_end: JournalEnd,
    next_id: u64,
    active: BTreeMap<u64, HashMap<u64, PathBuf>>,
    renaming: u32,
}

impl EndWatcher for Holds {
    /// The journal writer after each frame write and roll.
    fn journal_at(&self, end: JournalEnd) {
        self.inner.lock().journal_end = end;
    }
}

impl Holding for Holds {
    fn active(&self) -> bool {
        Holds::active(self)
    }

    fn moving(
        &self,
        group: u64,
        to: &Path,
        rename: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        Holds::moving(self, group, to, rename)
    }
}

/// The snapshot holds of an engine (module doc).
#[derive(Default)]
pub struct Holds {
    inner: Mutex<HoldsInner>,
}

impl Holds {
    /// After K6 (and at open): `m` is the newest stored manifest.
    pub(crate) fn set_newest(&self, m: &Manifest) {
        self.inner.lock().newest = Some(Arc::new(m.clone()));
    }

    /// Begins a hold: the newest stored manifest and the journal end now,
    /// taken under one lock (the bounded pause of a backup: nothing else
    /// is done under it). `None` before a manifest is known.
    pub(crate) fn hold(&self) -> Option<Held> {
        let started = Instant::now();
        let mut i = self.inner.lock();
        let manifest = i.newest.clone()?;
        let journal_end = i.journal_end;
        let id = i.next_id;
        i.next_id += 1;
        i.active.insert(id, HashMap::new());
        drop(i);
        Some(Held {
            id,
            manifest,
            journal_end,
            pause: started.elapsed(),
        })
    }

    pub(crate) fn release(&self, id: u64) {
        self.inner.lock().active.remove(&id);
    }

    /// Whether any hold is active: K7 and the trash's removals wait.
    pub fn active(&self) -> bool {
        !self.inner.lock().active.is_empty()
    }

    /// Renames group `group`'s directory to the trash entry `to` with
    /// `rename`, noting the move in every active hold (the first move per
    /// group wins). Called by the trash, on the applying thread.
    pub(crate) fn moving(
        &self,
        group: u64,
        to: &Path,
        rename: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let counted = {
            let mut i = self.inner.lock();
            let any = !i.active.is_empty();
            if any {
                i.renaming += 1;
            }
            any
        };
        let result = rename();
        let mut i = self.inner.lock();
        if counted {
            i.renaming -= 1;
        }
        if result.is_ok() {
            for moved in i.active.values_mut() {
                moved.entry(group).or_insert_with(|| to.to_owned());
            }
        }
        result
    }

    /// Where group `group`'s directory is for hold `id`.
    pub(crate) fn whereabouts(&self, id: u64, group: u64) -> Whereabouts {
        let i = self.inner.lock();
        match i.active.get(&id).and_then(|m| m.get(&group)) {
            Some(to) => Whereabouts::Moved(to.clone()),
            None if i.renaming > 0 => Whereabouts::Renaming,
            None => Whereabouts::InPlace,
        }
    }
}

/// K7 of checkpoint k: may shared file `file` go? `replay_floor` is the
/// lower of the two kept manifests' replay files (a journal file at or
/// after it stays); `pins` and `pins_prev` their pinned lists (sorted raw
/// ids); `live` the accounting now.
pub fn deletable(
    file: FileId,
    replay_floor: u64,
    pins: &[u64],
    pins_prev: &[u64],
    live: &LiveBytes,
) -> bool {
    let raw = u64::from(file.raw());
    let live_now = live.usage(file).is_some_and(|u| u.live > 0);
    (file.kind() == FileKind::Cold || file.seq() < replay_floor)
        && pins.binary_search(&raw).is_err()
        && pins_prev.binary_search(&raw).is_err()
        && !live_now
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::*;
    use crate::logs::extents::Extent;
    use crate::logs::reclaim::pinned;

    fn ext(seq: u64, offset: u32) -> Extent {
        Extent::new(FileId::journal(seq).unwrap(), offset, 100, 1).unwrap()
    }

    #[test]
    fn the_pinned_list_and_the_deletion_rule() {
        let mut live = LiveBytes::new();
        live.add(&ext(3, 0));
        live.add(&ext(5, 0));
        live.remove(&ext(5, 0));
        live.add(&Extent::new(FileId::cold(9).unwrap(), 32, 100, 1).unwrap());
        // Live at K1: 3 and cold 9 (5 is accounted but holds nothing live).
        let cold9 = u64::from(FileId::cold(9).unwrap().raw());
        assert_eq!(pinned(&live, 10), vec![3, cold9]);
        // A journal file in the replay window is not listed.
        assert_eq!(pinned(&live, 3), vec![cold9]);
        let none: &[u64] = &[];
        for (seq, floor, pins, prev, want) in [
            (2, 10, none, none, true),
            (10, 10, none, none, false), // in the replay window
            (4, 10, &[4][..], none, false),
            (4, 10, none, &[4][..], false), // pinned by the older manifest
            (3, 10, none, none, false),     // live now
            (5, 10, none, none, true),
        ] {
            assert_eq!(
                deletable(FileId::journal(seq).unwrap(), floor, pins, prev, &live),
                want,
                "file {seq}"
            );
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        /// A round appends an extent of group g in the current file.
        Append(usize),
        /// The journal rolls to the next file.
        Roll,
        /// Group g is promoted: its extents leave the shared files.
        Promote(usize),
        /// K1 of a checkpoint (if none is under way): the journal rolls.
        Start,
        /// K2 copies one group it took at K1.
        CaptureOne,
        /// K2 copies the rest; K4-K7.
        Finish,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0..4usize).prop_map(Op::Append),
            1 => Just(Op::Roll),
            1 => (0..4usize).prop_map(Op::Promote),
            1 => Just(Op::Start),
            2 => Just(Op::CaptureOne),
            1 => Just(Op::Finish),
        ]
    }

    /// A stored checkpoint: per group the files its item names, the replay
    /// file, the pinned list.
    #[derive(Clone, Default)]
    struct Manifest {
        state: BTreeMap<usize, Vec<u64>>,
        replay: u64,
        pins: Vec<u64>,
    }

    /// A checkpoint under way: groups K1 took, the accounting at K1, items
    /// copied so far, the replay file.
    type UnderWay = (BTreeSet<usize>, LiveBytes, BTreeMap<usize, Vec<u64>>, u64);

    struct Model {
        cur: u64,
        groups: Vec<Vec<Extent>>,
        dirty: BTreeSet<usize>,
        live: LiveBytes,
        next_offset: u32,
        ckpt: Option<UnderWay>,
        kept: Vec<Manifest>, // newest last, at most 2
        deleted: BTreeSet<u64>,
    }

    impl Model {
        fn new() -> Model {
            Model {
                cur: 1,
                groups: vec![Vec::new(); 4],
                dirty: BTreeSet::new(),
                live: LiveBytes::new(),
                next_offset: 48,
                ckpt: None,
                kept: vec![Manifest {
                    replay: 1,
                    ..Manifest::default()
                }],
                deleted: BTreeSet::new(),
            }
        }

        fn capture(&mut self, g: usize) {
            let files: Vec<u64> = self.groups[g].iter().map(|e| e.file().seq()).collect();
            self.dirty.remove(&g);
            if let Some((_, _, items, _)) = self.ckpt.as_mut() {
                items.insert(g, files);
            }
        }

        fn apply(&mut self, op: &Op) {
            match *op {
                Op::Append(g) => {
                    let e = ext(self.cur, self.next_offset);
                    self.next_offset += 100;
                    self.live.add(&e);
                    self.groups[g].push(e);
                    self.dirty.insert(g);
                }
                Op::Roll => {
                    self.cur += 1;
                    self.next_offset = 48;
                }
                Op::Promote(g) => {
                    for e in std::mem::take(&mut self.groups[g]) {
                        self.live.remove(&e);
                    }
                    self.dirty.insert(g);
                }
                Op::Start => {
                    if self.ckpt.is_none() {
                        self.cur += 1;
                        self.next_offset = 48;
                        let taken = std::mem::take(&mut self.dirty);
                        self.ckpt = Some((taken, self.live.clone(), BTreeMap::new(), self.cur));
                    }
                }
                Op::CaptureOne => {
                    let next = self.ckpt.as_mut().and_then(|(taken, ..)| taken.pop_first());
                    if let Some(g) = next {
                        self.capture(g);
                    }
                }
                Op::Finish => {
                    let Some((taken, _, _, _)) = self.ckpt.as_mut() else {
                        return;
                    };
                    for g in std::mem::take(taken) {
                        self.capture(g);
                    }
                    let (_, at_k1, items, replay) = self.ckpt.take().unwrap();
                    let mut state = self.kept.last().unwrap().state.clone();
                    state.extend(items);
                    let m = Manifest {
                        state,
                        replay,
                        pins: pinned(&at_k1, u64::MAX),
                    };
                    self.kept.push(m);
                    if self.kept.len() > 2 {
                        self.kept.remove(0);
                    }
                    let floor = self.kept.iter().map(|m| m.replay).min().unwrap();
                    let prev = &self.kept[0].pins;
                    let pins = &self.kept[self.kept.len() - 1].pins;
                    for seq in 1..self.cur {
                        if !self.deleted.contains(&seq)
                            && deletable(
                                FileId::journal(seq).unwrap(),
                                floor,
                                pins,
                                prev,
                                &self.live,
                            )
                        {
                            self.deleted.insert(seq);
                        }
                    }
                }
            }
        }

        /// No kept manifest and no group in memory names a deleted file.
        fn check(&self) -> Result<(), TestCaseError> {
            for (i, m) in self.kept.iter().enumerate() {
                for (g, files) in &m.state {
                    for f in files {
                        prop_assert!(
                            !self.deleted.contains(f),
                            "manifest {i} names file {f} of group {g}, deleted"
                        );
                    }
                }
            }
            for (g, exts) in self.groups.iter().enumerate() {
                for e in exts {
                    prop_assert!(
                        !self.deleted.contains(&e.file().seq()),
                        "group {g} in memory"
                    );
                }
            }
            Ok(())
        }
    }

    proptest! {
        #[test]
        fn no_kept_manifest_names_a_deleted_file_and_unpinned_files_go(
            ops in proptest::collection::vec(op(), 1..200)
        ) {
            let mut m = Model::new();
            for op in &ops {
                m.apply(op);
                m.check()?;
            }
            // Liveness: with every group promoted and two more checkpoints
            // (and one to move the replay window), every file before the
            // window is gone.
            for g in 0..4 {
                m.apply(&Op::Promote(g));
            }
            for _ in 0..3 {
                m.apply(&Op::Start);
                m.apply(&Op::Finish);
                m.check()?;
            }
            let floor = m.kept.iter().map(|k| k.replay).min().unwrap();
            for seq in 1..floor {
                prop_assert!(m.deleted.contains(&seq), "file {seq} kept after its groups left");
            }
        }
    }
}
