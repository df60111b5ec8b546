//! The round gate (format-spec/cluster.md section 4.1): what lets a Raft
//! layer decide when a round of this node's own may be written. An engine
//! opened with a gate ([`crate::Engine::open_gated`]) seals each Round
//! frame it writes as its own (a commit round, a frame of moved cursors)
//! with its next round index, hands the payload to
//! [`RoundGate::replicate`] and writes, syncs and applies the frame only
//! when that returns `Ok` (the payload is committed by the replica set).
//! An `Err` fails the round and stops writes (`WritesStopped`), as a
//! failed fdatasync does: nothing of the round reached the journal, and
//! the caller reopens the engine to go on. Rounds another node wrote
//! (`Engine::append_replicated`) never pass the gate: they were committed
//! before they were handed to the engine.
//!
//! So with a gate the engine holds only committed rounds: its journal,
//! its group logs, what readers see and every acknowledgement follow the
//! Raft commit, never precede it.
//!
//! Invariant: a round number passes the gate once. A write that found the
//! disk full is tried again with the same frame; the gate is not asked
//! again for the round it already passed, and a different payload under
//! that number (which would make this node's journal differ from the
//! replica set's) stops writes instead (checked by its `payload_crc`).
//!
//! Costs: one CRC of the payload (the seal, done again by the journal
//! write) and the wait in `replicate`, on the commit thread, where it
//! takes the place of the fdatasync's wait: the next round fills meanwhile.

use crate::commit::journal::{FrameBuf, Journal};
use crate::error::{Error, Result};

/// Decides when a round this node wrote may be journaled (module docs).
pub trait RoundGate: Send + Sync {
    /// Called on the commit thread with the payload of the next Round
    /// frame this node writes (format-spec/storage.md section 5), one call
    /// at a time. Returns once the payload is committed (`Ok`) or can no
    /// longer be committed by this node (`Err`, the reason).
    fn replicate(&self, payload: &[u8]) -> std::result::Result<(), String>;
}

/// The commit thread's side of the gate: the gate, and the round it last
/// passed with that payload's CRC.
pub(crate) struct Gate {
    gate: std::sync::Arc<dyn RoundGate>,
    passed: Option<(u64, u32)>,
}

impl Gate {
    pub fn new(gate: std::sync::Arc<dyn RoundGate>) -> Gate {
        Gate { gate, passed: None }
    }

    /// Passes `frame` (to be written next by `journal` as a Round frame)
    /// through the gate, unless its round passed it already with the same
    /// payload. `WritesStopped` if the gate refused it or the round passed
    /// with another payload.
    pub fn pass(&mut self, journal: &Journal, frame: &mut FrameBuf) -> Result<()> {
        let (round, payload) = journal.seal_round_payload(frame)?;
        let crc =
            crate::commit::journal::frame::payload_header(payload).map_or(0, |h| h.payload_crc);
        match self.passed {
            Some((r, c)) if r == round && c == crc => return Ok(()),
            Some((r, _)) if r == round => {
                return Err(Error::WritesStopped {
                    reason: format!("round {round} differs from the payload replicated for it"),
                })
            }
            _ => {}
        }
        self.gate
            .replicate(payload)
            .map_err(|reason| Error::WritesStopped {
                reason: format!("round {round} not replicated: {reason}"),
            })?;
        self.passed = Some((round, crc));
        Ok(())
    }
}
