//! Memberships and tidemarks (format-spec/storage.md section 15): the
//! cursor table (16 bytes per membership, ACK = one compare-and-swap), a
//! group's member list and read counts, and the facade's member requests
//! (join, leave, ack, pull, unread, sync, history, member pages, history
//! clears).

#[cfg(test)]
mod clear_history_tests;
pub(crate) mod cursors;
pub(crate) mod membership;
mod read_counts;
#[cfg(test)]
pub(crate) mod tidemark_tests;
pub(crate) mod tidemarks;
mod user_index;
mod user_lists;
