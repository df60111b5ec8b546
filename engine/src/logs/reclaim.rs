//! Space reclamation of the shared files (storage v2 design 5.1 and 5.4):
//! the live-byte accounting of every journal and cold file, and the pure
//! planner that picks which cold files to compact.
//!
//! Accounting ([`LiveBytes`]): per shared file its length, whether it is
//! sealed (no more appends), and `live` = the sum of the `bytes` of the
//! extents that point into it, plus, in a cold file, their 32-byte extent
//! headers (what copying them writes, so the planner's bound counts the
//! bytes really copied). Invariant A1 (I6 in the design): `live` changes
//! exactly when an extent is added to or removed from some group's list
//! (append, rewrite install, trim, promotion, delete), so it always equals
//! that sum, and `live <= len`; a file with `live > 0` is never deleted
//! ([`LiveBytes::forget`] asserts it). Journal files also hold
//! big-group records, control entries and frame overhead; none of those keep
//! a file alive once it is out of the replay window.
//!
//! Planner ([`plan`]): every sealed cold file with nothing live goes (it
//! costs no copy); then, with `S` the bytes of the sealed cold files, `L`
//! their live bytes and `C` = `cold_file_bytes`,
//!
//! > while `S > 2L + C`: compact the sealed cold file of lowest usage
//! > `live / len` (copy its live extents to the current cold file, then
//! > the file goes to the graveyard).
//!
//! Why each victim costs less than it frees: the lowest usage of a set of
//! files is at most its mean usage `L / S`, and `S > 2L + C` makes that
//! mean below 1/2; removing the lowest keeps the rest's mean below 1/2
//! while the loop goes on. So every victim has `live < len / 2`: it copies
//! `live` and frees `len`, a net gain of `len - live > live`. **Bytes copied
//! per byte freed < 1**, and after the run **`S <= 2L + C`** (invariant I7;
//! the design's `+ G` is the graveyard, files already out of the plan and
//! awaiting the next checkpoint). The copies go to the unsealed current
//! file, which the planner never picks; when it seals, the next run counts
//! it (its usage is near 1 when sealed, as it holds only bytes that were
//! live when copied).
//!
//! Costs: the planner sorts the sealed cold files, O(files log files) per run
//! (a few thousand files for a terabyte of cold data); the accounting is a
//! `BTreeMap` lookup per extent change.
//!
//! Wired into the engine by step S6 (evacuation and compaction on the
//! maintenance worker); until then only tests use it.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use crate::logs::cold::EXTENT_HEADER_BYTES;
use crate::logs::extents::{Extent, FileId, FileKind};

/// The live bytes `ext` stands for in its file: its records, and its header
/// in a cold file.
fn weight(ext: &Extent) -> u64 {
    let header = match ext.file().kind() {
        FileKind::Cold => EXTENT_HEADER_BYTES as u64,
        FileKind::Journal => 0,
    };
    u64::from(ext.bytes()) + header
}

/// One shared file as the accounting sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileUsage {
    /// Bytes written to the file (headers and dead bytes included).
    pub len: u64,
    /// Sum of the `bytes` of the extents pointing into the file (and of
    /// their headers in a cold file).
    pub live: u64,
    /// No more appends: the journal rolled past it, or the cold writer did.
    pub sealed: bool,
}

/// Live bytes per shared file (invariant A1).
#[derive(Clone, Debug, Default)]
pub struct LiveBytes {
    files: BTreeMap<FileId, FileUsage>,
}

impl LiveBytes {
    #[cfg(test)]
    pub fn new() -> LiveBytes {
        LiveBytes::default()
    }

    /// The file's length is now `len` (a new file, or appends to it).
    /// Lengths never shrink: shared files are never cut while in use.
    pub fn set_len(&mut self, file: FileId, len: u64) {
        let f = self.files.entry(file).or_default();
        debug_assert!(!f.sealed || len == f.len, "a sealed file does not grow");
        f.len = f.len.max(len);
    }

    /// The file takes no more appends.
    pub fn seal(&mut self, file: FileId) {
        self.files.entry(file).or_default().sealed = true;
    }

    /// `ext` now points into its file (appended, or installed by a rewrite).
    pub fn add(&mut self, ext: &Extent) {
        let f = self.files.entry(ext.file()).or_default();
        f.live += weight(ext);
        // A file's length covers every extent in it (the writer reports the
        // length before the extent is installed).
        f.len = f.len.max(ext.end());
        debug_assert!(f.live <= f.len, "A1: live <= len");
    }

    /// `ext` no longer points into its file (trimmed, replaced, promoted or
    /// deleted).
    pub fn remove(&mut self, ext: &Extent) {
        let f = self
            .files
            .get_mut(&ext.file())
            .expect("invariant A1: an extent's file is accounted");
        f.live = f
            .live
            .checked_sub(weight(ext))
            .expect("invariant A1: live counts every extent pointing into the file");
    }

    pub fn usage(&self, file: FileId) -> Option<FileUsage> {
        self.files.get(&file).copied()
    }

    /// Every accounted file, in file order.
    pub fn files(&self) -> impl Iterator<Item = (FileId, FileUsage)> + '_ {
        self.files.iter().map(|(f, u)| (*f, *u))
    }

    /// Sealed and nothing live: the file may go to the graveyard (a journal
    /// file only once it also left the replay window).
    #[cfg(test)]
    pub fn is_dead(&self, file: FileId) -> bool {
        self.files
            .get(&file)
            .is_some_and(|f| f.sealed && f.live == 0)
    }

    /// Stops accounting a file on its way to the graveyard.
    pub fn forget(&mut self, file: FileId) -> Option<FileUsage> {
        let f = self.files.remove(&file)?;
        assert_eq!(f.live, 0, "I6: a file with live extents is never deleted");
        Some(f)
    }

    /// The cold files as the planner takes them.
    pub fn cold_files(&self) -> Vec<ColdFile> {
        self.files
            .iter()
            .filter(|(id, _)| id.kind() == FileKind::Cold)
            .map(|(id, f)| ColdFile {
                seq: id.seq(),
                len: f.len,
                live: f.live,
                sealed: f.sealed,
            })
            .collect()
    }
}

/// A cold file as the planner sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdFile {
    pub seq: u64,
    pub len: u64,
    pub live: u64,
    pub sealed: bool,
}

impl ColdFile {
    /// Lower usage (`live / len`) first, then older (lower seq) first.
    fn by_usage(a: &ColdFile, b: &ColdFile) -> Ordering {
        let ua = u128::from(a.live) * u128::from(b.len);
        let ub = u128::from(b.live) * u128::from(a.len);
        ua.cmp(&ub).then(a.seq.cmp(&b.seq))
    }
}

/// What one planner run decided.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Seqs of the cold files to compact, in order.
    pub victims: Vec<u64>,
    /// Live bytes the compaction copies (the victims' `live`).
    pub copy_bytes: u64,
    /// Bytes the victims occupy (freed once they are graveyarded).
    pub free_bytes: u64,
}

/// `S` and `L`: bytes and live bytes of the sealed cold files.
fn sealed_totals(files: &[ColdFile]) -> (u64, u64) {
    files
        .iter()
        .filter(|f| f.sealed)
        .fold((0, 0), |(s, l), f| (s + f.len, l + f.live))
}

/// The cold files to compact: the dead ones, then the lowest usage first
/// until `S <= 2L + C` (`C` = `cold_file_bytes`; see the module docs for
/// why this copies less than it frees). Unsealed files (the one being
/// written) are never picked.
pub fn plan(files: &[ColdFile], cold_file_bytes: u64) -> Plan {
    let (mut s, mut l) = sealed_totals(files);
    let mut plan = Plan::default();
    let dead = files.iter().any(|f| f.sealed && f.live == 0);
    if !dead && s <= 2 * l + cold_file_bytes {
        return plan;
    }
    let mut sealed: Vec<ColdFile> = files.iter().filter(|f| f.sealed).copied().collect();
    sealed.sort_by(ColdFile::by_usage);
    for f in sealed {
        if f.live > 0 && s <= 2 * l + cold_file_bytes {
            break;
        }
        debug_assert!(2 * f.live < f.len, "the victim's usage is below 1/2");
        plan.victims.push(f.seq);
        plan.copy_bytes += f.live;
        plan.free_bytes += f.len;
        s -= f.len;
        l -= f.live;
    }
    plan
}

/// `pinned(k)` (the rule that needs it is in `state/pins.rs`): the shared
/// files with live bytes at K1 (`at_k1` is the accounting as it was
/// then) that the replay window does not keep anyway (journal files before
/// `replay_seq`, and every cold file), as [`FileId::raw`] values, sorted
/// (journal files first).
pub fn pinned(at_k1: &LiveBytes, replay_seq: u64) -> Vec<u64> {
    at_k1
        .files()
        .filter(|(f, u)| u.live > 0 && (f.kind() == FileKind::Cold || f.seq() < replay_seq))
        .map(|(f, _)| u64::from(f.raw()))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn f(seq: u64, len: u64, live: u64) -> ColdFile {
        ColdFile {
            seq,
            len,
            live,
            sealed: true,
        }
    }

    #[test]
    fn planner_table() {
        const C: u64 = 100;
        // (files, expected victims)
        let cases: Vec<(Vec<ColdFile>, Vec<u64>)> = vec![
            (vec![], vec![]),
            // S = 300, L = 100: 300 <= 2 * 100 + 100, within the bound.
            (vec![f(1, 100, 50), f(2, 100, 30), f(3, 100, 20)], vec![]),
            // S = 300, L = 90: over; the lowest usage (file 3) goes, then
            // S = 200 <= 2 * 80 + 100.
            (vec![f(1, 100, 50), f(2, 100, 30), f(3, 100, 10)], vec![3]),
            // Dead files first (no copy), then by usage, not by size.
            (
                vec![f(1, 100, 40), f(2, 400, 100), f(3, 100, 0), f(4, 100, 45)],
                vec![3, 2],
            ),
            // Equal usage: the older file first.
            (
                vec![f(7, 100, 10), f(5, 100, 10), f(6, 100, 10)],
                vec![5, 6],
            ),
            // The unsealed file is never picked, nor counted in S.
            (
                vec![
                    ColdFile {
                        sealed: false,
                        ..f(9, 100, 0)
                    },
                    f(1, 100, 60),
                    f(2, 100, 60),
                ],
                vec![],
            ),
            // Dead files go even within the bound (they cost no copy).
            (vec![f(1, 100, 0), f(2, 100, 0)], vec![1, 2]),
            (vec![f(1, 100, 90), f(2, 100, 0)], vec![2]),
        ];
        for (files, want) in cases {
            let p = plan(&files, C);
            assert_eq!(p.victims, want, "{files:?}");
            let picked: Vec<&ColdFile> = want
                .iter()
                .map(|s| files.iter().find(|f| f.seq == *s).unwrap())
                .collect();
            assert_eq!(p.copy_bytes, picked.iter().map(|f| f.live).sum::<u64>());
            assert_eq!(p.free_bytes, picked.iter().map(|f| f.len).sum::<u64>());
            let rest: Vec<ColdFile> = files
                .iter()
                .filter(|f| !want.contains(&f.seq))
                .copied()
                .collect();
            let (s, l) = sealed_totals(&rest);
            assert!(s <= 2 * l + C, "I7 after {files:?}");
        }
    }

    fn ext(file: FileId, offset: u32, bytes: u32) -> Extent {
        Extent::new(file, offset, bytes, 1).unwrap()
    }

    #[test]
    fn live_bytes_follow_the_extents() {
        let j = FileId::journal(3).unwrap();
        let c = FileId::cold(4).unwrap();
        let mut live = LiveBytes::new();
        live.set_len(j, 48);
        let (a, b) = (ext(j, 100, 60), ext(j, 300, 50));
        live.add(&a);
        live.add(&b);
        assert_eq!(
            live.usage(j),
            Some(FileUsage {
                len: 350,
                live: 110,
                sealed: false
            })
        );
        live.seal(j);
        assert!(!live.is_dead(j));
        // A rewrite moves `a` and `b` into a cold file.
        let n = ext(c, 64, 110);
        live.set_len(c, 174);
        live.add(&n);
        assert_eq!(
            live.usage(c).map(|u| u.live),
            Some(142),
            "records and header"
        );
        live.remove(&a);
        live.remove(&b);
        assert!(live.is_dead(j));
        assert_eq!(live.forget(j).map(|u| u.len), Some(350));
        assert_eq!(live.usage(j), None);
        assert!(!live.is_dead(c), "not sealed");
        assert_eq!(
            live.cold_files(),
            vec![ColdFile {
                seq: 4,
                len: 174,
                live: 142,
                sealed: false
            }]
        );
    }

    #[test]
    #[should_panic(expected = "I6")]
    fn a_file_with_live_extents_is_never_forgotten() {
        let c = FileId::cold(1).unwrap();
        let mut live = LiveBytes::new();
        live.add(&ext(c, 64, 100));
        live.forget(c);
    }

    #[test]
    #[should_panic(expected = "A1")]
    fn removing_an_extent_twice_breaks_a1_loudly() {
        let c = FileId::cold(1).unwrap();
        let mut live = LiveBytes::new();
        let e = ext(c, 64, 100);
        live.add(&e);
        live.remove(&e);
        live.remove(&e);
    }

    /// A simulated cold store: sealed files and the one being written, each
    /// a list of extents `(bytes, alive)`; rolls at `C` as the writer does.
    struct Store {
        c: u64,
        sealed: BTreeMap<u64, Vec<(u64, bool)>>,
        active: (u64, Vec<(u64, bool)>),
        next_seq: u64,
        copied: u64,
        freed_net: u64,
    }

    impl Store {
        fn len(extents: &[(u64, bool)]) -> u64 {
            32 + extents.iter().map(|e| 32 + e.0).sum::<u64>()
        }

        fn write(&mut self, bytes: u64) {
            let (_, ext) = &self.active;
            if !ext.is_empty() && Self::len(ext) + 32 + bytes > self.c {
                let (seq, ext) = std::mem::replace(&mut self.active, (self.next_seq, Vec::new()));
                self.next_seq += 1;
                self.sealed.insert(seq, ext);
            }
            self.active.1.push((bytes, true));
        }

        fn files(&self) -> Vec<ColdFile> {
            let file = |seq: u64, ext: &[(u64, bool)], sealed| ColdFile {
                seq,
                len: Self::len(ext),
                live: ext.iter().filter(|e| e.1).map(|e| 32 + e.0).sum(),
                sealed,
            };
            let mut v: Vec<ColdFile> = self.sealed.iter().map(|(s, e)| file(*s, e, true)).collect();
            v.push(file(self.active.0, &self.active.1, false));
            v
        }

        /// Plans and compacts until the planner has nothing to do (a copy
        /// can seal the current file, which the next run then counts).
        fn reclaim(&mut self) -> Result<(), TestCaseError> {
            for _ in 0..1000 {
                let files = self.files();
                let p = plan(&files, self.c);
                if p.victims.is_empty() {
                    let (s, l) = sealed_totals(&files);
                    prop_assert!(s <= 2 * l + self.c, "I7: S {} L {} C {}", s, l, self.c);
                    return Ok(());
                }
                for seq in p.victims {
                    let victim = self.sealed.remove(&seq).expect("a sealed victim");
                    let len = Self::len(&victim);
                    let mut copied = 0;
                    for (bytes, _) in victim.into_iter().filter(|e| e.1) {
                        self.write(bytes);
                        copied += 32 + bytes;
                    }
                    prop_assert!(2 * copied < len, "a victim of usage >= 1/2");
                    self.copied += copied;
                    self.freed_net += len - copied;
                }
            }
            Err(TestCaseError::fail("reclamation did not settle"))
        }

        fn kill(&mut self, pick: usize) {
            let mut alive: Vec<&mut (u64, bool)> = self
                .sealed
                .values_mut()
                .chain(std::iter::once(&mut self.active.1))
                .flat_map(|v| v.iter_mut())
                .filter(|e| e.1)
                .collect();
            if !alive.is_empty() {
                let n = alive.len();
                alive[pick % n].1 = false;
            }
        }
    }

    proptest! {
        /// Over random writes (evacuations into the cold store) and deaths
        /// (trims, deletes, promotions), running the planner to its fixed
        /// point after every event keeps `S <= 2L + C`, every victim is
        /// under half live, and all compactions together copy fewer bytes
        /// (extent headers included) than they free net of the copies.
        #[test]
        fn the_bound_holds_and_compaction_copies_less_than_it_frees(
            c in 300u64..3000,
            events in proptest::collection::vec((any::<bool>(), 1u64..400, any::<usize>()), 1..300),
        ) {
            let mut st = Store {
                c,
                sealed: BTreeMap::new(),
                active: (1, Vec::new()),
                next_seq: 2,
                copied: 0,
                freed_net: 0,
            };
            for (write, bytes, pick) in events {
                if write {
                    st.write(bytes.min(c - 64));
                } else {
                    st.kill(pick);
                }
                st.reclaim()?;
            }
            prop_assert!(
                st.copied < st.freed_net || st.freed_net == 0,
                "copied {} freed {}", st.copied, st.freed_net
            );
        }
    }
}
