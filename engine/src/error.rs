//! Typed errors of the engine. Every variant is an operating error a caller can
//! act on; programmer errors are assertions, never variants here.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What an operator can do about a damaged group: part of every
/// `GroupDamaged` message (and of the wire's GROUP_DAMAGED text).
pub const DAMAGED_GROUP_HINT: &str = "what an operator can do: stop the node and run \
     `tidemark ctl verify` then `tidemark ctl repair --yes` on its data directory (it keeps \
     every intact record and marks each lost one with a gap record), delete the group \
     (DELETE_GROUP; it can then be created again, empty, and the journal files kept for it \
     are released), or stop the node and run `tidemark ctl repair --data DIR --yes` (lost \
     ids become gap records), or restore the data directory from a backup; the node keeps \
     serving every other group";

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The ticket of `Error::NotReady` for a request that waits for the whole
/// state (its group id is 0): settled once the background load ended
/// (`commit::loading::LoadStatus::settled`), never by the maintenance worker, whose
/// tickets count up from 1.
pub const STATE_TICKET: u64 = u64::MAX - 1;

/// What went wrong, with enough structure for the server to map each variant
/// onto one wire error code.
#[derive(Debug)]
pub enum Error {
    /// An I/O call failed. `context` names the operation and file.
    Io { context: String, source: io::Error },
    /// Bytes on disk are not what the format allows, somewhere a crash cannot
    /// explain (not the torn tail of the newest data). In a group's files:
    /// the group is damaged. In the journal (`group: None`), from `open`:
    /// acknowledged entries are damaged or a journal file is missing, and
    /// the data directory is not opened (the reason says what to do).
    Corrupt {
        path: PathBuf,
        group: Option<u64>,
        offset: u64,
        reason: String,
    },
    /// A payload larger than `payload_bytes_max`.
    PayloadTooLarge { len: usize, max: usize },
    /// The group does not exist.
    GroupNotFound { group: u64 },
    /// `create_group` for an id that already exists.
    GroupExists { group: u64 },
    /// A group whose files failed verification; it answers this until repaired.
    GroupDamaged { group: u64, reason: String },
    /// An earlier write or fsync failed: the engine accepts no more writes
    /// until it is reopened (reads go on). Never retried, never papered over.
    WritesStopped { reason: String },
    /// The engine is shutting down.
    ShuttingDown,
    /// The pending commit round is full (`commit_round_bytes_max`); retry
    /// after a back-off. Only from the non-blocking `try_submit`.
    Overloaded,
    /// Free disk space is below `disk_free_min_bytes`: the write was refused
    /// before anything was assigned; retry once space returns.
    DiskFull { free: u64, min: u64 },
    /// A write found the disk full (ENOSPC or EDQUOT) although the reserve
    /// let it through. Nothing of the write was taken in: the file is as if
    /// it had not happened, so the commit thread holds the work and writes
    /// it again once space returns. (A *sync* that fails is `Io`, whatever
    /// its errno, and never retried.)
    NoSpace { context: String },
    /// The data directory is held by another engine instance (or a `ctl`
    /// command); `holder` is the process id its `LOCK` file names, when it
    /// names one (storage.md section 2, "LOCK").
    Locked { path: PathBuf, holder: Option<u32> },
    /// A configuration value out of its allowed range.
    InvalidConfig { reason: String },
    /// The offline tools (`DataDir::open`) were given a directory that
    /// holds no tidemark data (no `FORMAT`, no file of format 1): nothing
    /// is damaged, it is the wrong directory. `member_engine`: the
    /// directory is a replica set member's (storage.md section 19, "A
    /// replica set member's directory"), whose engine is there.
    NotADataDir {
        path: PathBuf,
        member_engine: Option<PathBuf>,
    },
    /// The user is not a member of the group.
    NotMember { group: u64, user: u64 },
    /// An ACK for an id above the group's head.
    CursorAboveHead {
        group: u64,
        requested: u64,
        head: u64,
    },
    /// The messages asked for were dropped by retention; `earliest` is the
    /// oldest msg_id still stored.
    BelowRetentionFloor { group: u64, earliest: u64 },
    /// A membership limit (`members_per_group_max`, `groups_per_user_max`).
    LimitExceeded { what: &'static str, max: usize },
    /// An edit or a recall the rules refuse (format-spec/protocol.md
    /// 4.28): nothing was written.
    ChangeRefused {
        group: u64,
        target: u64,
        why: ChangeRefusal,
    },
    /// The idempotence key `(sender_id, client_msg_id)` of a send, an
    /// edit or a recall names an earlier request of another kind (or a
    /// change of another target) still in the group's dedup window,
    /// `msg_id` (storage.md section 12, "One key space"): nothing was
    /// written. A retransmit repeats its request; a new request takes a
    /// new key.
    KeyReused {
        group: u64,
        sender_id: u64,
        client_msg_id: u64,
        msg_id: u64,
    },
    /// The request needs the group's files read first (its first use
    /// after open: the verifying load of its log, the index of a sealed
    /// segment, its dedup window), and the caller asked not to wait for
    /// the disk (the `try_` requests of an event loop). The maintenance
    /// worker is doing it; once [`crate::Engine::settled_load`] reaches
    /// `ticket` (the commit listeners are called then) the same request
    /// can run again. Nothing was done: the request changed nothing (a
    /// PULL may have applied its `ack_up_to`, which doing again changes
    /// nothing). The blocking requests never return it.
    NotReady { group: u64, ticket: u64 },
    /// Replication (`Engine::read_rounds`): the round is no longer in the
    /// retained journal (a checkpoint deleted its file, or a power cut
    /// under fsync `interval`/`never` lost it); `first` is the oldest
    /// round retained. A follower that needs it needs a snapshot.
    RoundCompacted { round: u64, first: u64 },
    /// Replication (`Engine::read_rounds`): the round was not written yet;
    /// `last` is the newest round written.
    RoundNotWritten { round: u64, last: u64 },
    /// Replication (`Engine::append_replicated`): the payload's round is
    /// not the one after this node's last round (`expected`): a gap or a
    /// round this node holds already. Nothing was written.
    RoundOutOfOrder { round: u64, expected: u64 },
    /// Replication (`Engine::append_replicated`): the payload is not a
    /// valid round for this node's state (checksum, structure, or entries
    /// that do not continue its groups). Nothing was written.
    InvalidRound { reason: String },
    /// The data directory holds storage format `found`, which this build
    /// does not read (it reads `supported` only); nothing was written to
    /// it. `detail` names what was seen (format 1: the files and their
    /// versions).
    UnsupportedFormat {
        path: PathBuf,
        found: u16,
        supported: u16,
        detail: String,
    },
}

/// Why an edit or a recall was refused; `code()` is the wire's detail of
/// error 17 (protocol.md 6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeRefusal {
    /// The requester is neither the message's sender nor an administrator.
    NotSender,
    /// The message is older than the change window allows.
    WindowPassed,
    /// No message of that id is stored (above the head, below the floor,
    /// 0), or the id is itself an edit or a recall.
    NoSuchMessage,
    /// The message was recalled already.
    Recalled,
}

impl ChangeRefusal {
    pub fn code(self) -> u64 {
        match self {
            ChangeRefusal::NotSender => 1,
            ChangeRefusal::WindowPassed => 2,
            ChangeRefusal::NoSuchMessage => 3,
            ChangeRefusal::Recalled => 4,
        }
    }
}

impl fmt::Display for ChangeRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChangeRefusal::NotSender => "only its sender or an administrator may change it",
            ChangeRefusal::WindowPassed => "the change window has passed",
            ChangeRefusal::NoSuchMessage => "no such message is stored",
            ChangeRefusal::Recalled => "it was recalled",
        })
    }
}

impl Error {
    /// Wraps an `io::Error` with the operation and path it came from.
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Wraps the error of a *write* (never a sync): a full disk becomes
    /// `NoSpace`, which the commit thread may retry; anything else is `Io`.
    pub(crate) fn write(context: impl Into<String>, source: io::Error) -> Error {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Error::NoSpace {
                context: context.into(),
            },
            _ => Error::io(context, source),
        }
    }

    /// True when the error says the disk is (nearly) full: a refused write
    /// (`DiskFull`) or a write that found no space (`NoSpace`).
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Error::DiskFull { .. } | Error::NoSpace { .. })
    }

    /// True when the error says the disk is full, also an `Io` error whose
    /// errno is ENOSPC or EDQUOT (a rename, a directory made): for callers
    /// that give up and retry later (the open), never for those that would
    /// retry a failed sync.
    pub(crate) fn found_no_space(&self) -> bool {
        self.is_disk_full()
            || matches!(self, Error::Io { source, .. }
                if matches!(source.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { context, source } => write!(f, "i/o error: {context}: {source}"),
            Error::Corrupt {
                path,
                group,
                offset,
                reason,
            } => {
                write!(f, "corrupt data in {} at offset {offset}", path.display())?;
                if let Some(g) = group {
                    write!(f, " (group {g})")?;
                }
                write!(f, ": {reason}")
            }
            Error::PayloadTooLarge { len, max } => {
                write!(f, "payload of {len} bytes exceeds the limit of {max}")
            }
            Error::GroupNotFound { group } => write!(f, "group {group} not found"),
            Error::GroupExists { group } => write!(f, "group {group} already exists"),
            Error::GroupDamaged { group, reason } => {
                write!(
                    f,
                    "group {group} is damaged: {reason}; {DAMAGED_GROUP_HINT}"
                )
            }
            Error::WritesStopped { reason } => {
                write!(f, "writes stopped after an earlier failure: {reason}")
            }
            Error::ShuttingDown => write!(f, "engine is shutting down"),
            Error::Overloaded => write!(f, "the pending commit round is full; retry later"),
            Error::DiskFull { free, min } => write!(
                f,
                "disk nearly full: {free} bytes free, {min} required; retry once space returns"
            ),
            Error::NoSpace { context } => write!(
                f,
                "{context}: no space left on device; retry once space returns"
            ),
            Error::Locked { path, holder } => {
                // `path` is the directory's LOCK file.
                let dir = path.parent().unwrap_or(path);
                write!(f, "data directory {} is locked by ", dir.display())?;
                match holder {
                    Some(pid) => write!(f, "process {pid} (its LOCK file names it)")?,
                    None => write!(f, "another process")?,
                }
                write!(
                    f,
                    ": a running node (`tidemark serve`) or a `tidemark ctl` command uses \
                     it. Stop that process first, or give this one another data directory"
                )
            }
            Error::InvalidConfig { reason } => write!(f, "invalid configuration: {reason}"),
            Error::NotADataDir {
                path,
                member_engine,
            } => {
                write!(
                    f,
                    "{} is not a tidemark data directory: it holds no FORMAT file and no data",
                    path.display()
                )?;
                if let Some(engine) = member_engine {
                    write!(
                        f,
                        "; it is a replica set member's directory, whose engine's data \
                         directory is {}",
                        engine.display()
                    )?;
                }
                Ok(())
            }
            Error::NotMember { group, user } => {
                write!(f, "user {user} is not a member of group {group}")
            }
            Error::CursorAboveHead {
                group,
                requested,
                head,
            } => {
                write!(
                    f,
                    "ack of msg_id {requested} above the head {head} of group {group}"
                )
            }
            Error::BelowRetentionFloor { group, earliest } => {
                write!(f, "group {group} no longer stores those messages; the earliest stored msg_id is {earliest}")
            }
            Error::LimitExceeded { what, max } => write!(f, "limit {what} = {max} reached"),
            Error::ChangeRefused { group, target, why } => {
                write!(
                    f,
                    "message {target} of group {group} cannot be changed: {why}"
                )
            }
            Error::KeyReused {
                group,
                sender_id,
                client_msg_id,
                msg_id,
            } => write!(
                f,
                "the key (sender {sender_id}, client_msg_id {client_msg_id}) names message \
                 {msg_id} of group {group}, a request of another kind or target; a new \
                 request needs a new client_msg_id"
            ),
            Error::NotReady { ticket, .. } if *ticket == STATE_TICKET => write!(
                f,
                "the node is still loading its saved groups and memberships (STATS \
                 storage.state_loading); run the request again once it is done"
            ),
            Error::NotReady { group, ticket } => write!(
                f,
                "group {group} is being read from disk (background job {ticket}); run the \
                 request again once it is done"
            ),
            Error::RoundCompacted { round, first } => write!(
                f,
                "round {round} is no longer in the journal (the oldest retained is {first})"
            ),
            Error::RoundNotWritten { round, last } => {
                write!(f, "round {round} was not written yet (the last is {last})")
            }
            Error::RoundOutOfOrder { round, expected } => write!(
                f,
                "replicated round {round} does not follow this node's journal (round {expected} \
                 was expected); nothing was written"
            ),
            Error::InvalidRound { reason } => {
                write!(f, "invalid replicated round, nothing was written: {reason}")
            }
            Error::UnsupportedFormat {
                path,
                found,
                supported,
                detail,
            } => write!(
                f,
                "data directory {} has storage format {found}, and this build reads format \
                 {supported} only: {detail}",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
