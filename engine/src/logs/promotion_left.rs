//! The segment files a small group's promotion left that a crash made moot
//! (format-spec/storage.md section 10, case S1), judged against the
//! records the group holds after recovery's replay.
//!
//! A promotion writes the group's records into a new segment file (and
//! later appends go on there) before any checkpoint records the group
//! segmented. After a crash every kept manifest records the group small,
//! and replay promotes it again at the same journal entry, moving the
//! directory to the trash first (`GroupLog::create_files`). But under
//! fsync `never` or `interval` a power cut may take the journal's tail,
//! promotion entry included, while the segment file's pages reached the
//! disk: the segment then holds acknowledged records with ids past the
//! head the journal explains. Dropping them would give those ids to new
//! messages (a member whose cursor is above them would never see those
//! messages, and a client that read id N would read another message at
//! N). So the files are judged ([`judge`]):
//!
//! - no record the directory proves was given out lies past the group's
//!   head, and those it holds are the group's: [`Left::Moot`], the
//!   directory moves to the trash at the open (as the next promotion
//!   would move it; until then a later deletion and creation of the id
//!   could meet it);
//! - the segments hold the group's records up to its head (compared, not
//!   assumed: record by record, where both hold an id) and more after it:
//!   [`Left::Leads`], the group takes the loaded log in place of its
//!   extents, as a big group adopts a segment that leads the journal
//!   (section 11, step 6). When no id is held by both (a group without
//!   records, or whose records were all trimmed), nothing shows the files
//!   are this incarnation's: they are adopted only when the journal may
//!   have lost records (`journal_lost`: a replayed file written under
//!   `never` or `interval`, a torn tail cut, or a gap replay met), as
//!   recovery did before for a group's first segment; otherwise they are
//!   [`Left::Foreign`];
//! - a record both hold differs (same id, another message), or the header
//!   names another group or base: [`Left::Foreign`]. A promotion copies
//!   the group's records byte for byte (erasure aside, below), and replay
//!   restores the records up to the head from the same journal bytes, so
//!   the files of this group's own promotion always agree with it: files
//!   that differ are not its promotion's. Group ids are reused: they are
//!   the directory of a deleted incarnation of the id whose move to the
//!   trash a power cut took back (the move is a rename made durable only
//!   by a later sync of `groups/`), which holds nothing of this group's.
//!   Damaging the group for them would refuse a state a crash makes, and
//!   adopting them would mix two incarnations; so the group is served
//!   from its own records, the files are left where they are (logged;
//!   `verify` notes them at the first differing record) and the group's
//!   next promotion moves them to the trash, as before this judgement.
//!   The same files could also be what a build without this judgement
//!   left after it gave ids again: the two cannot be told apart from the
//!   files, and in that case the damage was done (and served) by that
//!   build.
//!
//! What a power cut tore cannot prove anything: a first segment shorter
//! than its header or whose header fails its checksum holds no record that
//! can be read, and records after the first invalid one are unreadable
//! (as for any segment tail, section 11 step 6). A recalled message may be
//! in erased form in one copy and not in the other (a promotion and a
//! rewrite copy recalled messages erased): the two are the same record
//! when they are equal once both are erased.
//!
//! The node (`commit/small_log.rs`, after replay and when replay finds a
//! gap) and `ctl verify` (`offline/verify.rs`) both call [`judge`], so
//! they name the same finding at the same file and offset.
//!
//! Costs: one directory listing, one verifying scan of the directory's
//! segments, and a read of the records both hold (at most the promotion
//! threshold plus a round), for each small group that has a directory:
//! rare (a crash during the life of a promotion), and only at an open.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::logs::extents::ExtentList;
use crate::logs::group_log::{GroupLog, LoadReport, LogContext, LogState, ReadBatch};
use crate::logs::record;
use crate::logs::segment::{self, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::logs::small_read;

/// What the files at a small group's path are.
pub(crate) enum Left {
    /// Nothing in the directory `dir` proves an id past the group's head.
    Moot { dir: PathBuf },
    /// The log of the directory's segments, loaded (its torn tails not
    /// cut yet: `load.cuts`), holding the group's records up to `head`
    /// where both hold an id, and more up to `log.head()`, from `from`
    /// (`head + 1`, or the segments' first id when the group's floor was
    /// above its head when it was promoted: the ids between were given
    /// out and trimmed); `path` and `offset` are where record `from`
    /// lies.
    Leads {
        log: Box<GroupLog>,
        load: LoadReport,
        head: u64,
        from: u64,
        path: PathBuf,
        offset: u64,
    },
    /// Files that are not this group's promotion's (module docs): the
    /// first record (or header field) that shows it, at `path` and
    /// `offset`.
    Foreign {
        path: PathBuf,
        offset: u64,
        why: String,
    },
}

impl Left {
    /// The file (for [`Left::Moot`], the directory) and offset a finding
    /// names.
    pub(crate) fn place(&self) -> (&std::path::Path, u64) {
        match self {
            Left::Moot { dir } => (dir, 0),
            Left::Leads { path, offset, .. } | Left::Foreign { path, offset, .. } => {
                (path, *offset)
            }
        }
    }

    /// What the node does and `verify` reports (the text of both).
    pub(crate) fn describe(&self) -> String {
        match self {
            Left::Moot { .. } => "the files of a promotion a crash made moot (no record past \
                                    the small group's head, the same records up to it): the \
                                    node moves the directory to the trash at open"
                .into(),
            Left::Leads {
                log, head, from, ..
            } => format!(
                "segment files a promotion left hold msg_ids {from}..={} past the head {head} of \
                 the small group (the same records up to it): the journal entries that promoted \
                 it were lost to a power cut; the node adopts them at open, so no id is given \
                 again",
                log.head()
            ),
            Left::Foreign { why, .. } => format!(
                "segment files at the small group's path are not its promotion's ({why}): a \
                 deleted incarnation's directory whose move to the trash a power cut took back; \
                 the group is served from its own records and its next promotion moves them to \
                 the trash"
            ),
        }
    }
}

/// Judges the segment files under the directory of small group
/// `group_id`, whose records after replay are `list` (module docs);
/// `None` if it has no directory; `journal_lost`: the journal may have
/// lost records (module docs). Writes nothing: a torn tail the load
/// found is in `load.cuts`, for whoever installs the log. `Err` for I/O
/// errors, and for damage to the group's own records (`Error::Corrupt`
/// naming their file).
pub(crate) fn judge(
    ctx: &LogContext,
    group_id: u64,
    list: &ExtentList,
    journal_lost: bool,
) -> Result<Option<Left>> {
    let dir = ctx.group_dir(group_id);
    let entries = match ctx.vfs.read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
    };
    let moot = Left::Moot { dir: dir.clone() };
    // The promotion's segment is the lowest: its base is the group's floor
    // when it was promoted; the later ones continue it.
    let Some(base) = entries
        .iter()
        .filter_map(|p| segment::parse_file_name(p))
        .min()
    else {
        return Ok(Some(moot));
    };
    let path = dir.join(segment::file_name(base));
    let mut header = [0u8; SEGMENT_HEADER_BYTES];
    let read = ctx
        .vfs
        .open(&path, crate::io::OpenMode::Read)
        .and_then(|f| {
            let len = f.file_len()?;
            if len <= SEGMENT_HEADER_BYTES as u64 {
                return Ok(false);
            }
            f.read_exact_at(&mut header, 0).map(|()| true)
        })
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    if !read {
        return Ok(Some(moot)); // no record
    }
    let foreign = |offset: u64, why: String| Left::Foreign {
        path: path.clone(),
        offset,
        why,
    };
    match SegmentHeader::decode(&header) {
        // A creation the power cut tore: nothing after it can be read.
        Err(_) => return Ok(Some(moot)),
        Ok(h) if h.group_id != group_id => {
            let why = format!("the segment belongs to group {} not {group_id}", h.group_id);
            return Ok(Some(foreign(16, why)));
        }
        Ok(h) if h.base_msg_id != base => {
            let why = format!("the segment header names base {} not {base}", h.base_msg_id);
            return Ok(Some(foreign(24, why)));
        }
        Ok(_) => {}
    }
    // As a log recorded empty at `base`: its records, and the segments
    // named for the id after each one's last, are taken in as they scan.
    let state = LogState {
        head: base - 1,
        segments: vec![(base, SEGMENT_HEADER_BYTES as u64)],
    };
    let (log, load) = GroupLog::load(ctx, group_id, &state)?;
    let last = log.head();
    let head = list.next_id() - 1;
    let lo = base.max(list.floor());
    let hi = head.min(last);
    if lo <= hi {
        let count = hi - lo + 1;
        let theirs =
            small_read::read_above(&ctx.shared_files, group_id, list, lo - 1, count, usize::MAX)?;
        let theirs = records(theirs.batch);
        let ours = records(log.read(ctx, lo - 1, count as usize, usize::MAX)?);
        let walk_theirs = record::records_walk(&theirs);
        let walk_ours = record::records_walk(&ours);
        let differs = walk_theirs
            .iter()
            .zip(&walk_ours)
            .find(|((_, a, al), (_, b, bl))| {
                !same_record(&theirs[*a..*a + *al], &ours[*b..*b + *bl])
            })
            .map(|(&(id, ..), _)| id)
            .or_else(|| (walk_theirs.len() != walk_ours.len()).then_some(lo));
        if let Some(id) = differs {
            let (at, offset) = offset_of(ctx, group_id, &log, id)?;
            forget_files(ctx, group_id, &log);
            return Ok(Some(Left::Foreign {
                path: at,
                offset,
                why: format!(
                    "its msg_id {id} is not the record the group holds at {id} (in a journal or \
                     cold file)"
                ),
            }));
        }
    }
    if last <= head {
        forget_files(ctx, group_id, &log);
        return Ok(Some(moot));
    }
    let from = (head + 1).max(base);
    let (path, offset) = offset_of(ctx, group_id, &log, from)?;
    if lo > hi && !journal_lost {
        forget_files(ctx, group_id, &log);
        let why = format!(
            "they hold msg_ids {from}..={last}, the group holds none of them, and no journal file \
             lost records"
        );
        return Ok(Some(Left::Foreign { path, offset, why }));
    }
    Ok(Some(Left::Leads {
        log: Box::new(log),
        load,
        head,
        from,
        path,
        offset,
    }))
}

/// Closes the files of a log that is not adopted: the segment cache must
/// not keep them for a later log of the group at the same path.
fn forget_files(ctx: &LogContext, group_id: u64, log: &GroupLog) {
    for (base, _) in log.state().segments {
        ctx.cache.forget(group_id, base);
    }
}

/// The bytes of a read's records, in one buffer.
fn records(batch: ReadBatch) -> Vec<u8> {
    let mut out = Vec::with_capacity(batch.bytes);
    for chunk in &batch.chunks {
        out.extend_from_slice(chunk.bytes());
    }
    out
}

/// Two copies of one record: equal, or equal once both are erased (a copy
/// of a recalled message may be in erased form, storage.md section 3).
fn same_record(a: &[u8], b: &[u8]) -> bool {
    if a == b {
        return true;
    }
    let erasable = |r: &[u8]| record::peek_kind(r) == record::KIND_MESSAGE;
    if a.len() != b.len() || !erasable(a) || !erasable(b) {
        return false;
    }
    if !record::peek_erased(a) && !record::peek_erased(b) {
        return false;
    }
    let erased = |r: &[u8]| {
        let mut copy = r.to_vec();
        if !record::peek_erased(&copy) {
            record::erase_in_place(&mut copy);
        }
        copy
    };
    erased(a) == erased(b)
}

/// The segment file holding record `id` of `log` and the record's offset
/// in it.
fn offset_of(ctx: &LogContext, group_id: u64, log: &GroupLog, id: u64) -> Result<(PathBuf, u64)> {
    let base = log.segment_base(log.segment_of(id));
    let before = log.read(ctx, base - 1, (id - base) as usize, usize::MAX)?;
    let path = ctx.group_dir(group_id).join(segment::file_name(base));
    Ok((path, SEGMENT_HEADER_BYTES as u64 + before.bytes as u64))
}
