//! Where a group's records live and how they are read, kept and given
//! back (format-spec/storage.md sections 3, 4, 9): the record layout; a
//! big group's own segment files with their sparse index; a small group's
//! extents in the shared journal and cold files, its reads and its
//! promotion to segments; space reclamation of the shared files; retention
//! planning; a deleted group's trash.
//!
//! Everything here works on one group's records (or on the shared files
//! that hold them); the commit thread (`commit`) decides what is appended,
//! the checkpointer (`state`) when files may go.

pub(crate) mod changes;
pub(crate) mod cold;
pub(crate) mod extents;
pub(crate) mod group_log;
mod index;
pub(crate) mod promotion_left;
#[cfg(test)]
mod promotion_left_tests;
pub(crate) mod reclaim;
#[cfg(any(test, feature = "testing"))]
pub mod record;
#[cfg(not(any(test, feature = "testing")))]
pub(crate) mod record;
pub(crate) mod retention;
#[cfg(test)]
pub(crate) mod retention_index_tests;
pub(crate) mod segment;
mod segment_cache;
pub(crate) mod shared_files;
#[cfg(test)]
pub(crate) mod small_log_tests;
pub(crate) mod small_read;
#[cfg(test)]
pub(crate) mod small_tests;
pub(crate) mod trash;
