//! Leadership confirmations for reads on the leader (format-spec/cluster.md
//! section 5.2): Raft's read index (raft-rs `RawNode::read_index`,
//! `ReadOnlyOption::Safe`), one heartbeat round for every read that
//! arrived meanwhile.
//!
//! Representation: read *tickets* numbered 1, 2, 3, ... by the callers
//! ([`Reads::ticket`], any thread), and three watermarks under one leaf
//! lock: `asked` (the last ticket given), `confirmed` (every ticket up to
//! it is confirmed: this node was still the leader after the ticket was
//! given) and `failed` (every ticket up to it that was not confirmed
//! before it failed: leadership was lost). The driver asks raft-rs for a
//! read index with the context `asked` (8 bytes, little-endian) when
//! tickets wait; raft-rs answers a context once a quorum acknowledged a
//! heartbeat carrying it (or a later one), which confirms every ticket up
//! to it.
//!
//! Invariants: `failed` takes precedence: a ticket at or below `failed`
//! is failed even if a confirmation above it arrives later (the driver
//! ignores contexts at or below `failed`); tickets above `failed` are
//! confirmed only by a context issued after they were given. A caller may
//! compute its read's answer when it takes its ticket and hold it until
//! the ticket is confirmed: a confirmation means a quorum still followed
//! this leader after the ticket was given, so no other leader had
//! acknowledged a write by then, and this leader's engine held every
//! write acknowledged before the read arrived (it answers a write only
//! once applied, and applied every earlier term's before its writes gate
//! opened).
//!
//! Costs: a ticket is one lock and, for the first ticket after the driver
//! last looked, one channel send; the driver issues one read index (one
//! heartbeat to each peer) per turn at most, whatever the number of
//! tickets.

use std::sync::Arc;

use parking_lot::Mutex;

/// Called (on the driver's thread) when tickets were confirmed or failed.
pub type ReadsListener = Arc<dyn Fn() + Send + Sync>;

/// The watermarks (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadsSettled {
    pub confirmed: u64,
    pub failed: u64,
}

impl ReadsSettled {
    /// `Some(true)` once `ticket` is confirmed, `Some(false)` once it
    /// failed, `None` while it waits.
    pub fn outcome(&self, ticket: u64) -> Option<bool> {
        if ticket <= self.failed {
            Some(false)
        } else if ticket <= self.confirmed {
            Some(true)
        } else {
            None
        }
    }
}

#[derive(Default)]
struct State {
    asked: u64,
    /// The last ticket the driver issued a read index for.
    issued: u64,
    settled: ReadsSettled,
    /// The driver was told that tickets wait and has not looked since.
    poked: bool,
}

/// Shared by the callers and the driver (module docs).
#[derive(Default)]
pub struct Reads {
    state: Mutex<State>,
    listener: Mutex<Option<ReadsListener>>,
}

impl Reads {
    /// A new ticket; `true` if the driver must be told (no ticket waited
    /// since it last looked).
    pub fn ticket(&self) -> (u64, bool) {
        let mut st = self.state.lock();
        st.asked += 1;
        let poke = !st.poked;
        st.poked = true;
        (st.asked, poke)
    }

    pub fn settled(&self) -> ReadsSettled {
        self.state.lock().settled
    }

    pub fn set_listener(&self, f: ReadsListener) {
        *self.listener.lock() = Some(f);
    }

    /// The driver: the context of a read index to issue now, if tickets
    /// wait that none issued covers.
    pub fn to_issue(&self) -> Option<Vec<u8>> {
        let mut st = self.state.lock();
        st.poked = false;
        if st.asked <= st.issued.max(st.settled.failed) {
            return None;
        }
        st.issued = st.asked;
        Some(st.asked.to_le_bytes().to_vec())
    }

    /// The driver: raft-rs answered the read index of `ctx`.
    pub fn confirm(&self, ctx: &[u8]) {
        let Ok(bytes) = <[u8; 8]>::try_from(ctx) else {
            return; // not one of ours (a context is always 8 bytes)
        };
        let ticket = u64::from_le_bytes(bytes);
        {
            let mut st = self.state.lock();
            if ticket <= st.settled.failed || ticket <= st.settled.confirmed {
                return;
            }
            st.settled.confirmed = ticket;
        }
        self.notify();
    }

    /// The driver: leadership lost (or cannot be confirmed): every ticket
    /// given so far fails.
    pub fn fail_all(&self) {
        {
            let mut st = self.state.lock();
            if st.settled.failed == st.asked {
                return;
            }
            st.settled.failed = st.asked;
            st.issued = st.asked;
        }
        self.notify();
    }

    fn notify(&self) {
        let listener = self.listener.lock().clone();
        if let Some(f) = listener {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tickets_are_confirmed_by_a_later_context_and_failures_win() {
        let r = Reads::default();
        let (t1, poke) = r.ticket();
        assert!(poke);
        let (t2, poke) = r.ticket();
        assert!(!poke, "one poke per batch");
        let ctx = r.to_issue().unwrap();
        assert_eq!(r.to_issue(), None, "one read index per batch");
        let (t3, _) = r.ticket();
        r.confirm(&ctx);
        let s = r.settled();
        assert_eq!(
            (s.outcome(t1), s.outcome(t2), s.outcome(t3)),
            (Some(true), Some(true), None)
        );
        let late = r.to_issue().unwrap();
        r.fail_all();
        // A confirmation of a failed ticket comes too late.
        r.confirm(&late);
        assert_eq!(r.settled().outcome(t3), Some(false));
        let (t4, _) = r.ticket();
        assert_eq!(r.settled().outcome(t4), None);
        r.confirm(&r.to_issue().unwrap());
        assert_eq!(r.settled().outcome(t4), Some(true));
    }
}
