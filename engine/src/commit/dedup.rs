//! The idempotence window of one group: `(sender, client_msg_id) -> msg_id`
//! for its recent sends, so a retransmitted send returns the original id and
//! stores nothing.
//!
//! The window holds at least the group's last `dedup_window_sends` sends and
//! every send younger than `dedup_window_ms`, never more than
//! `dedup_entries_max`. It is not persisted on its own: it is rebuilt from the
//! group log (the records carry sender and client_msg_id), so it survives a
//! restart exactly as far as the log does.
//!
//! Keys come from clients, so the map keeps std's randomly keyed SipHash:
//! a client must not be able to choose colliding keys.
//!
//! Messages, edits and recalls share one key space (storage.md section 12,
//! "One key space"): the window also remembers what each key was used for
//! ([`Keyed`]), so that a key reused for another request (a RECALL with
//! the key of an earlier SEND, an EDIT of another target) is refused by
//! the caller instead of being answered as a retransmit of a request it
//! is not. Only changes carry that note ([`DedupWindow`]'s `changes`, one
//! entry per edit or recall in the window), so a window of messages costs
//! what it did.
//!
//! Node-wide, [`DedupBudget`] bounds the entries of all windows together
//! (`dedup_entries_total_max`): past it, a window being sent to keeps only
//! its last `dedup_window_sends` sends (the age extension goes first), and
//! the windows of the groups sent to least recently leave memory whole.
//! Such a window is rebuilt from the log on its group's next send, exactly
//! as after a restart, so the configured minimum is never broken: the cost
//! of the bound is that rebuild, never a forgotten send.
//!
//! [`DedupBudget`] also lists, by time of last use, the groups holding state
//! that an idle group gives back (a send state with its window, a loaded
//! log): the commit thread takes the ones idle for `idle_evict_ms` off the
//! front of that list and drops their state (`commit.rs`, "idle sweep"),
//! which the next send rebuilds by the same rule. Both lists cost one
//! entry per group holding such state, nothing per idle group.
//!
//! Every send takes the lists' lock, so the commit thread's sweep never
//! waits for it: it takes its groups and gives back what it learnt (the
//! windows it dropped, the groups to list again) only when the lock is
//! free ([`DedupBudget::try_sweep`]), else one sweep later. Rebuilding a
//! sparse list (O(entries)) is the maintenance worker's, never the
//! sweep's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::config::Config;
use crate::error::{Error, Result};
use crate::logs::group_log::{scanned, GroupLog, LogContext, Scan, Scanned};
use crate::logs::record;
use crate::sleep_lock::SleepMutex;

/// What an idempotence key was used for: a retransmit is the same request
/// only if it repeats this (storage.md section 12, "One key space"). The
/// payload of a message or an edit is not compared, as it never was: a
/// key names one request, and its retransmit carries the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyed {
    /// A SEND's message.
    Message,
    /// An EDIT of message `target`.
    Edit { target: u64 },
    /// A RECALL of message `target`.
    Recall { target: u64 },
}

impl Keyed {
    /// The kind of the record the request stores.
    pub fn kind(self) -> u8 {
        match self {
            Keyed::Message => record::KIND_MESSAGE,
            Keyed::Edit { .. } => record::KIND_EDIT,
            Keyed::Recall { .. } => record::KIND_RECALL,
        }
    }

    /// What the verified record `rec` was stored for; `None` for a gap,
    /// which no request made.
    pub fn of_record(rec: &[u8]) -> Option<Keyed> {
        let target = record::peek_target(rec).unwrap_or(0);
        match record::peek_kind(rec) {
            record::KIND_MESSAGE => Some(Keyed::Message),
            record::KIND_EDIT => Some(Keyed::Edit { target }),
            record::KIND_RECALL => Some(Keyed::Recall { target }),
            _ => None,
        }
    }
}

/// The request an idempotence key names in the window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Original {
    pub msg_id: u64,
    pub timestamp_ms: u64,
    pub keyed: Keyed,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    sender_id: u64,
    client_msg_id: u64,
    timestamp_ms: u64,
}

/// A send the send path assigned an id to: what its group's window
/// remembers of it ([`DedupBudget::remember_sent`]).
pub struct Sent {
    pub msg_id: u64,
    pub sender_id: u64,
    pub client_msg_id: u64,
    pub timestamp_ms: u64,
    pub keyed: Keyed,
}

/// The limits of a window, taken from [`Config`].
#[derive(Clone, Copy, Debug)]
pub struct WindowLimits {
    pub sends: usize,
    pub age_ms: u64,
    pub entries_max: usize,
}

impl WindowLimits {
    pub fn from_config(c: &Config) -> Self {
        WindowLimits {
            sends: c.dedup_window_sends,
            age_ms: c.dedup_window_ms,
            entries_max: c.dedup_entries_max,
        }
    }
}

#[derive(Default)]
pub struct DedupWindow {
    by_key: HashMap<(u64, u64), u64>,
    /// Entries of msg_ids `first_id .. first_id + recent.len()`, oldest first.
    recent: VecDeque<Entry>,
    first_id: u64,
    /// The entries in `recent` that are edits or recalls, by msg_id, with
    /// what they changed; an entry in `recent` without one is a message.
    /// Allocated by the first change: a window of messages pays one
    /// pointer for it (boxed on purpose: an empty `HashMap` in place
    /// would cost every busy group's send state 48 bytes).
    #[allow(clippy::box_collection)]
    changes: Option<Box<HashMap<u64, Keyed>>>,
}

impl DedupWindow {
    /// The earlier request with this key, if it is still in the window.
    pub fn lookup(&self, sender_id: u64, client_msg_id: u64) -> Option<Original> {
        let id = *self.by_key.get(&(sender_id, client_msg_id))?;
        let e = self.recent.get(usize::try_from(id - self.first_id).ok()?)?;
        Some(Original {
            msg_id: id,
            timestamp_ms: e.timestamp_ms,
            keyed: self
                .changes
                .as_ref()
                .and_then(|c| c.get(&id).copied())
                .unwrap_or(Keyed::Message),
        })
    }

    /// Remembers the verified record `rec` with header `h` (a message's,
    /// a change's or a gap's), which must be the next id after the newest
    /// one remembered: the one rule of the paths that fill a window from
    /// records (a replicated round, a rebuild from the log; a send
    /// inserts what it assigned, [`Self::insert`]).
    pub fn remember(
        &mut self,
        h: &record::RecordHeader,
        rec: &[u8],
        limits: WindowLimits,
        over_budget: bool,
    ) {
        match Keyed::of_record(rec) {
            Some(keyed) => self.insert(
                h.msg_id,
                h.sender_id,
                h.client_msg_id,
                h.timestamp_ms,
                keyed,
                limits,
                over_budget,
            ),
            // A gap record (repair's stand-in for a lost message) was
            // never sent: it holds its id's place, but its (0, 0) key must
            // not answer a real send.
            None => self.insert_unkeyed(h.msg_id, h.timestamp_ms, limits),
        }
    }

    /// Remembers request `msg_id` with its key and what it was for; it
    /// must be the next id after the newest one remembered. Evicts what
    /// left the window. With `over_budget` (the node holds more entries
    /// than its budget) the window keeps only its last `limits.sends`
    /// sends, whatever their age.
    #[allow(clippy::too_many_arguments)]
    pub fn insert(
        &mut self,
        msg_id: u64,
        sender_id: u64,
        client_msg_id: u64,
        timestamp_ms: u64,
        keyed: Keyed,
        limits: WindowLimits,
        over_budget: bool,
    ) {
        if self.recent.is_empty() {
            self.first_id = msg_id;
        }
        debug_assert_eq!(
            msg_id,
            self.first_id + self.recent.len() as u64,
            "dedup ids must be dense"
        );
        self.recent.push_back(Entry {
            sender_id,
            client_msg_id,
            timestamp_ms,
        });
        self.by_key.insert((sender_id, client_msg_id), msg_id);
        if keyed != Keyed::Message {
            self.changes.get_or_insert_default().insert(msg_id, keyed);
        }
        self.evict(timestamp_ms, limits, over_budget);
    }

    /// Remembers `msg_id` (the next id, as for `insert`) without a key: a
    /// gap record's place in the window, which no retransmit can match.
    fn insert_unkeyed(&mut self, msg_id: u64, timestamp_ms: u64, limits: WindowLimits) {
        if self.recent.is_empty() {
            self.first_id = msg_id;
        }
        debug_assert_eq!(msg_id, self.first_id + self.recent.len() as u64);
        self.recent.push_back(Entry {
            sender_id: 0,
            client_msg_id: 0,
            timestamp_ms,
        });
        self.evict(timestamp_ms, limits, false);
    }

    fn evict(&mut self, now_ms: u64, limits: WindowLimits, over_budget: bool) {
        while let Some(front) = self.recent.front() {
            let over_cap = self.recent.len() > limits.entries_max;
            let old = self.recent.len() > limits.sends
                && (over_budget || front.timestamp_ms.saturating_add(limits.age_ms) < now_ms);
            if !over_cap && !old {
                break;
            }
            let key = (front.sender_id, front.client_msg_id);
            if self.by_key.get(&key) == Some(&self.first_id) {
                self.by_key.remove(&key);
            }
            if let Some(changes) = &mut self.changes {
                changes.remove(&self.first_id);
                if changes.is_empty() {
                    self.changes = None;
                }
            }
            self.recent.pop_front();
            self.first_id += 1;
        }
    }

    /// Sends remembered.
    pub fn len(&self) -> usize {
        self.recent.len()
    }

    /// Inserts every record of a page read back from a log (a rebuild);
    /// returns the last record's timestamp.
    fn insert_batch(
        &mut self,
        batch: &crate::logs::group_log::ReadBatch,
        limits: WindowLimits,
    ) -> Option<u64> {
        let mut last = None;
        for r in batch.records() {
            self.remember(&r.header, r.bytes, limits, false);
            last = Some(r.header.timestamp_ms);
        }
        last
    }

    /// Rebuilds the window of a small group (`list`, copied under its
    /// slot's lock) from its records, and gives the timestamp of its last
    /// record. A small group holds at most `small_group_bytes_max` bytes, so
    /// all of them within the entry cap are read, a page at a time by
    /// `read_above` (the records above an id: `small_log::read_above`).
    pub fn rebuild_small(
        list: &crate::logs::extents::ExtentList,
        mut read_above: impl FnMut(u64) -> Result<crate::logs::group_log::ReadBatch>,
        now_ms: u64,
        limits: WindowLimits,
    ) -> Result<(DedupWindow, u64)> {
        let mut window = DedupWindow::default();
        let mut last_ts = 0;
        let head = list.next_id() - 1;
        let start = head
            .saturating_sub(limits.entries_max as u64 - 1)
            .max(list.floor());
        let mut after = start - 1;
        while after < head {
            let batch = read_above(after)?;
            last_ts = window.insert_batch(&batch, limits).unwrap_or(last_ts);
            after = batch.last_id;
        }
        window.evict(now_ms, limits, false);
        Ok((window, last_ts))
    }

    /// Rebuilds the window of `log` from its records: the last `sends`
    /// records, extended back segment by segment while a segment's first
    /// record is younger than `age_ms`. With `Scan::Refused`, a sealed
    /// segment whose index is not built stops it with `NeedsIndex` (the
    /// caller builds that index without the log's lock and tries again).
    ///
    /// A sealed segment that fails its check (`GroupDamaged`) is left out:
    /// storage.md section 4 says such a group still takes sends, and its
    /// other records are served; the window then lacks that segment's
    /// sends (a retransmit of one of them would be stored again, as a new
    /// message: its original cannot be read anyway). Damage in the active
    /// segment fails the rebuild.
    pub fn rebuild(
        log: &GroupLog,
        ctx: &LogContext,
        scan: Scan,
        now_ms: u64,
        limits: WindowLimits,
    ) -> Result<Scanned<DedupWindow>> {
        let mut window = DedupWindow::default();
        let head = log.head();
        if head < log.floor() {
            return Ok(Ok(window));
        }
        let by_count = head
            .saturating_sub(limits.sends as u64 - 1)
            .max(log.floor());
        let cap = head
            .saturating_sub(limits.entries_max as u64 - 1)
            .max(log.floor());
        // Whole segments: records before `by_count` in its segment may still
        // be young enough to belong to the window; the eviction rule decides.
        let mut seg = log.segment_of(by_count);
        let mut start = log.segment_base(seg);
        while seg > 0 {
            let first_ts = match log.first_header_from(ctx, scan, seg) {
                Ok(read) => scanned!(Ok::<_, Error>(read))
                    .map(|h| h.timestamp_ms)
                    .unwrap_or(0),
                // Nothing to read back there: the window starts after it.
                Err(Error::GroupDamaged { .. }) if log.is_sealed(seg) => break,
                Err(e) => return Err(e),
            };
            if first_ts.saturating_add(limits.age_ms) < now_ms {
                break;
            }
            seg -= 1;
            start = log.segment_base(seg);
        }
        let start = start.max(cap);
        let mut after = start - 1;
        while after < head {
            // One segment at a time, so a damaged one is skipped whole.
            let seg = log.segment_of(after + 1);
            let count = (log.segment_last_id(seg) - after).min(4096) as usize;
            let batch = match log.read_with(ctx, scan, after, count, usize::MAX) {
                Ok(read) => scanned!(Ok::<_, Error>(read)),
                Err(Error::GroupDamaged { reason, .. }) if log.is_sealed(seg) => {
                    log::warn!("the dedup window leaves out a damaged segment: {reason}");
                    after = log.segment_last_id(seg);
                    continue;
                }
                Err(e) => return Err(e),
            };
            window.insert_batch(&batch, limits);
            after = batch.last_id;
        }
        window.evict(now_ms, limits, false);
        Ok(Ok(window))
    }
}

/// The entries of all windows of an engine, which groups' windows were
/// used least recently, and which groups holding state were used least
/// recently. Only counts, group ids and times: each window stays under its
/// group's assign lock.
pub struct DedupBudget {
    entries: AtomicUsize,
    dropped: AtomicU64,
    /// Taken by every send and by the commit thread's sweep: a lock whose
    /// waiters sleep (`sleep_lock.rs`).
    lists: SleepMutex<Lists>,
    /// What the idle sweep could not give back to `lists` yet (the lock
    /// was held); a leaf lock, held only to take or keep it.
    swept: SleepMutex<Swept>,
    /// A rebuild of sparse lists is queued on the maintenance worker.
    shrink_queued: AtomicBool,
}

/// What an idle sweep learnt that `lists` must be told
/// ([`DedupBudget::try_sweep`]).
#[derive(Default)]
struct Swept {
    /// Groups whose window the sweep dropped: they leave the windows list.
    windows_dropped: Vec<u64>,
    /// Groups the sweep left for later: listed again as used now.
    later: Vec<u64>,
}

/// What the idle sweep did with one of the groups [`DedupBudget::try_sweep`]
/// gave it, with no lock of the budget held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepStep {
    /// The group's window was dropped; it held this many entries.
    pub window_dropped: Option<usize>,
    /// Some of its state stays for now (a lock held, records not synced):
    /// listed again as used once the sweep is over.
    pub later: bool,
}

/// How a sweep ([`DedupBudget::try_sweep`]) ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SweepEnd {
    /// Every group idle now was taken.
    Done,
    /// It stopped at its bound, or found the lists' lock held: sweep
    /// again soon.
    Again,
}

/// Both lists under one lock: a send updates both with one lock taken.
struct Lists {
    /// Groups with a window in memory, least recently sent to first.
    windows: lru::LruCache<u64, ()>,
    /// Groups with a send state or a loaded log, least recently used first,
    /// with the time of that use (ms since the epoch).
    used: lru::LruCache<u64, u64>,
    /// The most entries each list held since it was last rebuilt.
    windows_peak: usize,
    used_peak: usize,
}

impl Lists {
    /// A list holds less than a quarter of its peak ([`Self::shrink_if_sparse`]).
    fn is_sparse(&self) -> bool {
        (self.windows_peak > 1024 && self.windows.len() * 4 < self.windows_peak)
            || (self.used_peak > 1024 && self.used.len() * 4 < self.used_peak)
    }

    /// A hash map keeps its capacity when emptied: once a list holds less
    /// than a quarter of its peak, it is rebuilt at its size (in order), so
    /// a burst of busy groups does not cost memory after they went idle.
    /// Amortised O(1) per removal.
    fn shrink_if_sparse(&mut self) {
        fn rebuilt<V: Copy>(l: &lru::LruCache<u64, V>) -> lru::LruCache<u64, V> {
            let mut fresh = lru::LruCache::unbounded();
            for (&k, &v) in l.iter().rev() {
                fresh.put(k, v);
            }
            fresh
        }
        if self.windows_peak > 1024 && self.windows.len() * 4 < self.windows_peak {
            self.windows = rebuilt(&self.windows);
            self.windows_peak = self.windows.len();
        }
        if self.used_peak > 1024 && self.used.len() * 4 < self.used_peak {
            self.used = rebuilt(&self.used);
            self.used_peak = self.used.len();
        }
    }
}

impl Swept {
    fn is_empty(&self) -> bool {
        self.windows_dropped.is_empty() && self.later.is_empty()
    }

    /// Keeps what `other` could not give back, for the next sweep.
    fn keep(&mut self, mut other: Swept) {
        self.windows_dropped.append(&mut other.windows_dropped);
        self.later.append(&mut other.later);
    }

    /// Tells `lists` what the sweep learnt. A dropped window leaves the
    /// windows list unless its group was used again since it was taken
    /// (it is back on the used list: its window may be a new one).
    fn give_back(&mut self, lists: &mut Lists) {
        let now = crate::clock::now_ms();
        for g in self.windows_dropped.drain(..) {
            if !lists.used.contains(&g) {
                lists.windows.pop(&g);
            }
        }
        for g in self.later.drain(..) {
            lists.used.put(g, now);
        }
        lists.used_peak = lists.used_peak.max(lists.used.len());
    }
}

impl Default for DedupBudget {
    fn default() -> Self {
        DedupBudget::new()
    }
}

impl DedupBudget {
    pub fn new() -> Self {
        DedupBudget {
            entries: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            lists: SleepMutex::new(Lists {
                windows: lru::LruCache::unbounded(),
                used: lru::LruCache::unbounded(),
                windows_peak: 0,
                used_peak: 0,
            }),
            swept: SleepMutex::default(),
            shrink_queued: AtomicBool::new(false),
        }
    }

    /// Entries in all windows.
    pub fn entries(&self) -> usize {
        self.entries.load(Ordering::Relaxed)
    }

    /// Windows dropped from memory for the budget since open.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The send path's one call into the budget, under the group's assign
    /// lock once the id is assigned: remembers `sent` in the group's
    /// `window` and counts what the window gained and lost. While all
    /// windows hold `total_max` entries or more, the window keeps only its
    /// last `limits.sends` sends ([`DedupWindow::insert`]); dropping whole
    /// windows for the budget is `Engine::fit_dedup_budget`'s, after the
    /// locks are given back.
    pub fn remember_sent(
        &self,
        window: &mut DedupWindow,
        sent: &Sent,
        limits: WindowLimits,
        total_max: usize,
    ) {
        self.counted(window, total_max, |w, over| {
            w.insert(
                sent.msg_id,
                sent.sender_id,
                sent.client_msg_id,
                sent.timestamp_ms,
                sent.keyed,
                limits,
                over,
            )
        });
    }

    /// As [`Self::remember_sent`] for a verified record of a replicated
    /// round (`DedupWindow::remember`: a gap record keeps only its place).
    pub fn remember_record(
        &self,
        window: &mut DedupWindow,
        h: &record::RecordHeader,
        rec: &[u8],
        limits: WindowLimits,
        total_max: usize,
    ) {
        self.counted(window, total_max, |w, over| {
            w.remember(h, rec, limits, over)
        });
    }

    /// Runs `change` on `window`, telling it whether the node is over its
    /// budget, and counts the entries it gained or lost.
    fn counted(
        &self,
        window: &mut DedupWindow,
        total_max: usize,
        change: impl FnOnce(&mut DedupWindow, bool),
    ) {
        let over = self.entries() >= total_max;
        let before = window.len();
        change(window, over);
        self.resized(before, window.len());
    }

    /// A window changed size from `before` to `after` entries.
    pub fn resized(&self, before: usize, after: usize) {
        if after >= before {
            self.entries.fetch_add(after - before, Ordering::Relaxed);
        } else {
            self.entries.fetch_sub(before - after, Ordering::Relaxed);
        }
    }

    /// `group`'s window was just used (a send): it leaves memory
    /// last, and the group is not idle.
    pub fn touch(&self, group: u64) {
        let now = crate::clock::now_ms();
        let mut lists = self.lists.lock();
        lists.windows.put(group, ());
        lists.used.put(group, now);
        lists.windows_peak = lists.windows_peak.max(lists.windows.len());
        lists.used_peak = lists.used_peak.max(lists.used.len());
    }

    /// `group` was just used without its window (its log was loaded or
    /// created): it is not idle.
    pub fn touch_used(&self, group: u64) {
        let now = crate::clock::now_ms();
        let mut lists = self.lists.lock();
        lists.used.put(group, now);
        lists.used_peak = lists.used_peak.max(lists.used.len());
    }

    /// Puts back a window [`Self::take_least_recent`] took out.
    pub fn touch_window(&self, group: u64) {
        let mut lists = self.lists.lock();
        lists.windows.put(group, ());
        lists.windows_peak = lists.windows_peak.max(lists.windows.len());
    }

    /// `group` was deleted: it leaves both lists; `len` is what its window
    /// held.
    pub fn forget(&self, group: u64, len: usize) {
        let mut lists = self.lists.lock();
        lists.windows.pop(&group);
        lists.used.pop(&group);
        lists.shrink_if_sparse();
        drop(lists);
        self.resized(len, 0);
    }

    /// The group whose window was used least recently, taken out of the
    /// order (the caller drops its window, or puts it back with
    /// [`Self::touch_window`]).
    pub fn take_least_recent(&self) -> Option<u64> {
        let mut lists = self.lists.lock();
        let g = lists.windows.pop_lru().map(|(g, ())| g);
        lists.shrink_if_sparse();
        g
    }

    /// The idle sweep: takes up to `max` groups whose last use is at least
    /// `idle_ms` before `now_ms` off the used list and hands each to
    /// `step` (which drops its state), with no lock of the budget held.
    /// It never waits for the lists' lock: what the last sweep learnt and
    /// the groups to take are exchanged with the lists under one
    /// `try_lock`, what this one learnt under a second; a lock held by a
    /// send leaves them for the next sweep (`Again`). A list left sparse
    /// is rebuilt by `shrink` (queued on the maintenance worker; it calls
    /// [`Self::shrink_if_sparse`]).
    pub fn try_sweep(
        &self,
        now_ms: u64,
        idle_ms: u64,
        max: usize,
        mut step: impl FnMut(u64) -> SweepStep,
        shrink: impl FnOnce(),
    ) -> SweepEnd {
        // Taken out, so no lock of the budget is held while `step` runs.
        let mut swept = std::mem::take(&mut *self.swept.lock());
        let Some(mut lists) = self.lists.try_lock() else {
            self.swept.lock().keep(swept);
            return SweepEnd::Again;
        };
        swept.give_back(&mut lists);
        let mut idle = Vec::new();
        while idle.len() < max {
            match lists.used.peek_lru() {
                Some((_, &used)) if used.saturating_add(idle_ms) <= now_ms => {}
                _ => break,
            }
            if let Some((g, _)) = lists.used.pop_lru() {
                idle.push(g);
            }
        }
        drop(lists);
        for &id in &idle {
            let done = step(id);
            if let Some(len) = done.window_dropped {
                self.resized(len, 0);
                swept.windows_dropped.push(id);
            }
            if done.later {
                swept.later.push(id);
            }
        }
        let sparse = match self.lists.try_lock() {
            Some(mut lists) => {
                swept.give_back(&mut lists);
                lists.is_sparse()
            }
            None => false,
        };
        if sparse && !self.shrink_queued.swap(true, Ordering::AcqRel) {
            shrink();
        }
        let left = !swept.is_empty();
        self.swept.lock().keep(swept);
        if idle.len() == max || left {
            SweepEnd::Again
        } else {
            SweepEnd::Done
        }
    }

    /// Rebuilds a list that holds less than a quarter of its peak (the
    /// maintenance worker's job the sweep queues): O(entries) under the
    /// lists' lock, off the commit thread.
    pub fn shrink_if_sparse(&self) {
        self.shrink_queued.store(false, Ordering::Release);
        self.lists.lock().shrink_if_sparse();
    }

    /// Holds the lists' lock as a send does while it lists its group
    /// (tests: what waits for it).
    #[cfg(test)]
    pub(crate) fn hold_lists(&self) -> impl Drop + '_ {
        self.lists.lock()
    }

    /// Groups listed as holding state an idle group gives back.
    pub fn used_len(&self) -> usize {
        self.lists.lock().used.len()
    }

    pub fn count_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// While all windows hold more than `total_max` entries, drops the
    /// windows of the groups sent to least recently: `drop_window(group)`
    /// drops one (the caller has the groups and their locks) and says what
    /// came of it. The windows it could not drop are listed again, as used
    /// last, once the budget fits. Called with no lock held.
    pub fn fit(&self, total_max: usize, mut drop_window: impl FnMut(u64) -> WindowDrop) {
        let mut busy = Vec::new();
        while self.entries() > total_max {
            let Some(id) = self.take_least_recent() else {
                break;
            };
            match drop_window(id) {
                WindowDrop::Dropped { len } => {
                    self.resized(len, 0);
                    self.count_dropped();
                }
                WindowDrop::Busy => busy.push(id),
                WindowDrop::Gone => {}
            }
        }
        for id in busy {
            self.touch_window(id);
        }
    }
}

/// What came of dropping a group's window for the budget
/// ([`DedupBudget::fit`]).
pub enum WindowDrop {
    /// Dropped; it held `len` entries.
    Dropped { len: usize },
    /// Kept for now (in use): listed again.
    Busy,
    /// No window to drop (the group was deleted, or went idle).
    Gone,
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: WindowLimits = WindowLimits {
        sends: 3,
        age_ms: 1000,
        entries_max: 5,
    };

    fn at(msg_id: u64, timestamp_ms: u64) -> Option<Original> {
        Some(Original {
            msg_id,
            timestamp_ms,
            keyed: Keyed::Message,
        })
    }

    /// A send is remembered and counted in the budget by one call; over the
    /// node-wide budget the window keeps only its last `sends` sends and
    /// the budget counts what left.
    #[test]
    fn a_send_is_remembered_and_counted_by_one_call() {
        let budget = DedupBudget::new();
        let mut w = DedupWindow::default();
        let sent = |msg_id| Sent {
            msg_id,
            sender_id: 7,
            client_msg_id: 100 + msg_id,
            timestamp_ms: 10,
            keyed: Keyed::Message,
        };
        for id in 1..=4 {
            budget.remember_sent(&mut w, &sent(id), LIMITS, 100);
        }
        assert_eq!((w.len(), budget.entries()), (4, 4));
        assert_eq!(w.lookup(7, 104), at(4, 10));
        // The node holds its budget's worth: this window shrinks to its
        // last `sends` sends, and the budget gives back what left.
        budget.remember_sent(&mut w, &sent(5), LIMITS, 4);
        assert_eq!((w.len(), budget.entries()), (LIMITS.sends, LIMITS.sends));
        assert_eq!(w.lookup(7, 102), None);
        assert_eq!(w.lookup(7, 105), at(5, 10));
    }

    /// The budget drops the windows sent to least recently until it fits,
    /// lists the busy ones again, and counts what it dropped.
    #[test]
    fn fit_drops_the_least_recent_windows_until_the_budget_holds() {
        let budget = DedupBudget::new();
        for g in [1, 2, 3] {
            budget.touch(g);
            budget.resized(0, 4);
        }
        let mut asked = Vec::new();
        budget.fit(5, |g| {
            asked.push(g);
            if g == 1 {
                WindowDrop::Busy
            } else {
                WindowDrop::Dropped { len: 4 }
            }
        });
        assert_eq!(asked, vec![1, 2, 3]);
        assert_eq!((budget.entries(), budget.dropped()), (4, 2));
        assert_eq!(
            budget.take_least_recent(),
            Some(1),
            "the busy one is listed again"
        );
        assert_eq!(budget.take_least_recent(), None);
    }

    /// A change's key remembers what it changed, for as long as the key is
    /// in the window, and leaves with it.
    #[test]
    fn a_change_is_remembered_with_its_target() {
        let mut w = DedupWindow::default();
        w.insert(1, 1, 1, 10, Keyed::Message, LIMITS, false);
        w.insert(2, 1, 2, 10, Keyed::Recall { target: 1 }, LIMITS, false);
        w.insert(3, 1, 3, 10, Keyed::Edit { target: 1 }, LIMITS, false);
        assert_eq!(w.lookup(1, 1).map(|o| o.keyed), Some(Keyed::Message));
        assert_eq!(
            w.lookup(1, 2).map(|o| o.keyed),
            Some(Keyed::Recall { target: 1 })
        );
        assert_eq!(
            w.lookup(1, 3).map(|o| o.keyed),
            Some(Keyed::Edit { target: 1 })
        );
        for id in 4..=9 {
            w.insert(id, 1, id, 5000, Keyed::Message, LIMITS, false);
        }
        assert_eq!(w.lookup(1, 2), None);
        assert!(w.changes.is_none(), "evicted with their entries");
    }

    #[test]
    fn keeps_the_last_sends_and_the_young_ones() {
        let mut w = DedupWindow::default();
        for id in 1..=5 {
            w.insert(id, 1, 100 + id, 10, Keyed::Message, LIMITS, false);
        }
        // all young: kept up to the cap of 5
        assert_eq!(w.len(), 5);
        assert_eq!(w.lookup(1, 101), at(1, 10));
        // time passes: only the last 3 sends stay
        w.insert(6, 1, 106, 5000, Keyed::Message, LIMITS, false);
        assert_eq!(w.len(), 3);
        assert_eq!(w.lookup(1, 103), None);
        assert_eq!(w.lookup(1, 104), at(4, 10));
        assert_eq!(w.lookup(1, 106), at(6, 5000));
    }

    #[test]
    fn cap_bounds_memory_even_for_young_sends() {
        let mut w = DedupWindow::default();
        for id in 1..=100 {
            w.insert(id, 2, id, 10, Keyed::Message, LIMITS, false);
        }
        assert_eq!(w.len(), 5);
        assert_eq!(w.lookup(2, 95), None);
        assert_eq!(w.lookup(2, 96), at(96, 10));
    }

    #[test]
    fn over_the_node_budget_a_window_keeps_only_its_minimum() {
        let mut w = DedupWindow::default();
        for id in 1..=5 {
            w.insert(id, 1, id, 10, Keyed::Message, LIMITS, false);
        }
        assert_eq!(w.len(), 5, "young sends are kept up to the cap");
        w.insert(6, 1, 6, 10, Keyed::Message, LIMITS, true);
        assert_eq!(w.len(), 3, "the last `sends` sends, however young");
        assert_eq!(w.lookup(1, 4), at(4, 10));
        assert_eq!(w.lookup(1, 3), None);
    }

    #[test]
    fn the_node_wide_budget_drops_idle_windows_and_keeps_the_guarantee() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = crate::Config::new(dir.path());
        c.fsync = crate::FsyncPolicy::Never;
        c.dedup_window_sends = 5;
        c.dedup_entries_max = 50;
        c.dedup_entries_total_max = 20;
        let e = crate::Engine::open(c).unwrap();
        let mut ids = HashMap::new();
        for g in 1..=10u64 {
            e.create_group(g).unwrap();
            for m in 1..=10u64 {
                let a = e.append(g, 7, g * 100 + m, b"x").unwrap();
                ids.insert((g, m), a.msg_id);
                let entries = e.stats().dedup_entries;
                assert!(entries <= 20, "{entries} entries after group {g} send {m}");
            }
        }
        assert!(e.stats().dedup_windows_dropped > 0);
        // Group 1's window left memory; a retransmit of each of its last
        // `dedup_window_sends` sends still finds the original.
        for m in 6..=10u64 {
            let a = e.append(1, 7, 100 + m, b"x").unwrap();
            assert!(a.duplicate, "send {m} of group 1 forgotten");
            assert_eq!(a.msg_id, ids[&(1, m)]);
        }
        assert_eq!(e.head(1).unwrap(), 10, "nothing stored twice");
        assert!(e.stats().dedup_entries <= 20);
    }
}
