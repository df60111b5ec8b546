//! [`ConnId`], the name of a connection that the event loop, the
//! connections, the handlers and the node's subscription and receipt
//! indexes share. It sits below all of them so that none of them imports
//! another to name a connection.

/// Identifies a connection across the reuse of its slot in the event loop
/// (the slot's index and the generation of its occupant).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId {
    pub index: usize,
    pub generation: u64,
}
