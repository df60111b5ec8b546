//! The engine's context as the groups and the layers above them see it:
//! the logs' context ([`LogContext`], which a `Context` derefs to, so a
//! function of the logs takes `&ctx` as it is) and the dirty list of
//! groups (`dirty.rs`), which only the groups' layers mark and take.

use std::ops::Deref;

use crate::commit::dirty::DirtyList;
use crate::group::Group;
use crate::logs::group_log::LogContext;

pub struct Context {
    pub logs: LogContext,
    /// What changed since the last checkpoint capture.
    pub dirty: DirtyList<Group>,
}

impl Context {
    pub fn new(logs: LogContext) -> Context {
        Context {
            logs,
            dirty: DirtyList::default(),
        }
    }
}

impl Deref for Context {
    type Target = LogContext;

    fn deref(&self) -> &LogContext {
        &self.logs
    }
}
