//! The salvaging walk of one group's records, on a stopped node's files:
//! what `ctl dump`, `verify` and `repair` read a group with.
//!
//! Unlike the engine's verifying scan (`segment::scan`), which stops at the
//! first invalid record, this walk goes on past damage: after an invalid
//! record at offset `P` it looks at every later offset for the first record
//! that decodes and passes its CRC (`record::decode_verified`) with an id
//! the lost bytes can explain (at least the expected id, and at most one id
//! per 44 bytes skipped, since no record is shorter), and resumes there.
//! The ids in between are *lost*; everything before and after is kept.
//!
//! Representation: the walk reports [`Event`]s to a callback in id order,
//! borrowing record bytes from the file buffer; nothing per record is kept.
//!
//! Costs: each file of the group is read once, whole, with `read` (offline:
//! no mapping, so a file cut meanwhile is an I/O error, never SIGBUS); the
//! search after damage looks at each later byte once with a few compares
//! before any CRC, so a walk is linear in the group's bytes.
//!
//! Trust: a record taken after damage passed its CRC and fits the ids, but
//! a client chose its payload, which could embed bytes shaped as a record
//! of a plausible later id. The search takes the first candidate; storage.md
//! section 3, "Gap records", states this limit.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::logs::extents::{FileId, FileKind};
use crate::logs::record::{self, RecordHeader, RECORD_BYTES_STORED_MAX, RECORD_HEADER_BYTES};
use crate::logs::segment::{self, SegmentHeader, SEGMENT_HEADER_BYTES};
use crate::state::GroupRecord;

/// What the walk of a group finds, in id order.
#[derive(Debug)]
pub(crate) enum Event<'a> {
    /// A valid record with the id the walk expected.
    Record {
        header: RecordHeader,
        bytes: &'a [u8],
        file: &'a Path,
        offset: u64,
    },
    /// Damage: bytes at `offset` of `file` are not what the state says.
    /// `lost` is the id range `(first, last)` whose records are gone, if
    /// any (header damage, for one, loses none by itself).
    Damage {
        file: PathBuf,
        offset: u64,
        reason: String,
        lost: Option<(u64, u64)>,
    },
    /// Bytes after the last record of the active segment and after every
    /// id the state names: a torn write a crash left, which the node cuts
    /// when it loads the group. Not damage.
    TornTail { file: PathBuf, offset: u64 },
    /// A sealed segment whose records are all there but end at another
    /// length than the state records (`recorded`), or an active segment
    /// whose records end before it: only the state is wrong (a repair
    /// interrupted between its segment and its manifest leaves this).
    LengthMismatch {
        file: PathBuf,
        recorded: u64,
        found: u64,
    },
}

/// Where a group's segment `base` lives.
pub(crate) fn segment_path(data_dir: &Path, group: u64, base: u64) -> PathBuf {
    crate::logs::group_log::group_dir(data_dir, group).join(segment::file_name(base))
}

/// The path of shared file `raw` (a small group's extent names it so).
pub(crate) fn shared_path(data_dir: &Path, raw: u32) -> PathBuf {
    let f = FileId::from_raw(raw);
    let dir = crate::commit::journal::journal_dir(data_dir);
    match f.kind() {
        FileKind::Journal => crate::commit::journal::journal_path(&dir, f.seq()),
        FileKind::Cold => dir.join(crate::logs::cold::file_name(f.seq())),
    }
}

/// Reads a whole file; `Ok(None)` if it does not exist.
pub(crate) fn read_file(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
    }
}

/// Walks every record of `g` (from its first stored id, which for a small
/// group may be below its floor: callers clip) and reports what it finds.
/// A group recorded damaged without the places of its records (found
/// damaged while it was small) has nothing to walk: `Ok(false)`.
pub(crate) fn walk_group(
    data_dir: &Path,
    g: &GroupRecord,
    sink: &mut dyn FnMut(Event<'_>),
) -> Result<bool> {
    if let Some(small) = &g.small {
        walk_small(data_dir, g.group, small, sink)?;
        return Ok(true);
    }
    if g.segments.is_empty() {
        // No record yet (head 0), or damaged while small: nothing to read.
        return Ok(g.head == 0);
    }
    let last = g.segments.len() - 1;
    for (i, &(base, recorded)) in g.segments.iter().enumerate() {
        let path = segment_path(data_dir, g.group, base);
        // A sealed segment holds exactly the ids up to the next base; the
        // active one at least up to the head (more if written after the
        // checkpoint; the node keeps those).
        let upper = g.segments.get(i + 1).map(|&(next, _)| next - 1);
        let Some(bytes) = read_file(&path)? else {
            let to = upper.unwrap_or(g.head);
            sink(Event::Damage {
                file: path,
                offset: 0,
                reason: "segment file missing".into(),
                lost: (to >= base).then_some((base, to)),
            });
            continue;
        };
        match SegmentHeader::decode(&bytes) {
            Ok(h) if h.group_id != g.group => sink(Event::Damage {
                file: path.clone(),
                offset: 16,
                reason: format!("segment belongs to group {} not {}", h.group_id, g.group),
                lost: None,
            }),
            Ok(h) if h.base_msg_id != base => sink(Event::Damage {
                file: path.clone(),
                offset: 24,
                reason: format!("segment header names base {} not {base}", h.base_msg_id),
                lost: None,
            }),
            Ok(_) => {}
            Err(reason) => sink(Event::Damage {
                file: path.clone(),
                offset: 0,
                reason,
                lost: None,
            }),
        }
        let start = SEGMENT_HEADER_BYTES.min(bytes.len());
        let end = walk_span(&bytes, start, base, upper, &path, 0, sink);
        if i < last {
            if end.ids_missing_from.is_none() && end.pos as u64 != recorded {
                sink(Event::LengthMismatch {
                    file: path.clone(),
                    recorded,
                    found: end.pos as u64,
                });
            }
            continue;
        }
        // The active segment.
        let found_last = end.next_id - 1;
        if let Some(offset) = end.invalid_at {
            if offset >= recorded && found_last >= g.head {
                sink(Event::TornTail {
                    file: path.clone(),
                    offset,
                });
            } else {
                sink(Event::Damage {
                    file: path.clone(),
                    offset,
                    reason: end.invalid_why.clone(),
                    lost: (g.head > found_last).then_some((end.next_id, g.head)),
                });
                continue;
            }
        } else if found_last < g.head {
            sink(Event::Damage {
                file: path.clone(),
                offset: end.pos as u64,
                reason: format!(
                    "segment ends at offset {} after msg_id {found_last}, the group's head is {}",
                    end.pos, g.head
                ),
                lost: Some((end.next_id, g.head)),
            });
            continue;
        }
        if (end.pos as u64) < recorded {
            sink(Event::LengthMismatch {
                file: path,
                recorded,
                found: end.pos as u64,
            });
        }
    }
    Ok(true)
}

fn walk_small(
    data_dir: &Path,
    group: u64,
    small: &crate::state::SmallRecord,
    sink: &mut dyn FnMut(Event<'_>),
) -> Result<()> {
    let mut files: HashMap<u32, Option<Vec<u8>>> = HashMap::new();
    let mut id = small.first_id;
    for &(file, offset, bytes, count) in &small.extents {
        let path = shared_path(data_dir, file);
        if let std::collections::hash_map::Entry::Vacant(v) = files.entry(file) {
            v.insert(read_file(&path)?);
        }
        let last = id + u64::from(count) - 1;
        let window = files[&file]
            .as_deref()
            .and_then(|b| b.get(offset as usize..(offset as usize).checked_add(bytes as usize)?));
        // The file must say the extent is this group's (the node's read
        // check, `shared_files::check_owner`): another group's valid records
        // at that place are damage, never this group's records.
        let not_owned = files[&file].as_deref().zip(window).and_then(|(all, _)| {
            let ext =
                crate::logs::extents::Extent::new(FileId::from_raw(file), offset, bytes, count)?;
            let piece = crate::logs::extents::Piece { first_id: id, ext };
            crate::logs::shared_files::check_owner(all, group, &piece).err()
        });
        match window {
            Some(_) if not_owned.is_some() => sink(Event::Damage {
                reason: not_owned.unwrap_or_default(),
                file: path,
                offset: u64::from(offset),
                lost: Some((id, last)),
            }),
            None => sink(Event::Damage {
                reason: if files[&file].is_none() {
                    "file missing".into()
                } else {
                    format!("file ends before the extent of {bytes} bytes at offset {offset}")
                },
                file: path,
                offset: u64::from(offset),
                lost: Some((id, last)),
            }),
            Some(w) => {
                let end = walk_span(w, 0, id, Some(last), &path, u64::from(offset), sink);
                if end.ids_missing_from.is_none() && end.pos != w.len() {
                    sink(Event::Damage {
                        file: path.clone(),
                        offset: u64::from(offset) + end.pos as u64,
                        reason: format!(
                            "bytes after msg_id {last} inside its extent (ids {id}..={last})"
                        ),
                        lost: None,
                    });
                }
            }
        }
        id = last + 1;
    }
    Ok(())
}

/// Where a span's walk ended.
struct SpanEnd {
    /// Offset just past the last record taken.
    pos: usize,
    /// The id the next record would have.
    next_id: u64,
    /// Set when ids up to the span's `last` were missing at its end (a
    /// `Damage` event was sent for them).
    ids_missing_from: Option<u64>,
    /// An open-ended span (the active segment) that ended on bytes no
    /// record follows: where they start and why they are not a record.
    invalid_at: Option<u64>,
    invalid_why: String,
}

/// Walks the records in `bytes[start..]` expecting ids `first..=last`
/// (`last` None: as many as valid records follow), taking records past
/// damage as the module docs say. `base` is added to offsets reported.
/// With `last` set, damage and missing ids are sent as events; without it,
/// bytes at the end that no record follows are left to the caller
/// (`invalid_at`: a torn tail or damage depending on the state).
fn walk_span(
    bytes: &[u8],
    start: usize,
    first: u64,
    last: Option<u64>,
    file: &Path,
    base: u64,
    sink: &mut dyn FnMut(Event<'_>),
) -> SpanEnd {
    let mut pos = start;
    let mut next = first;
    while pos < bytes.len() && last.is_none_or(|l| next <= l) {
        let rest = &bytes[pos..];
        let why = match record::decode_verified(rest, RECORD_BYTES_STORED_MAX) {
            Ok(h) if h.msg_id == next => {
                let len = h.record_len as usize;
                sink(Event::Record {
                    header: h,
                    bytes: &rest[..len],
                    file,
                    offset: base + pos as u64,
                });
                pos += len;
                next += 1;
                continue;
            }
            Ok(h) => format!("msg_id {} where {next} was expected", h.msg_id),
            Err(e) => e.to_string(),
        };
        match resync(bytes, pos, next, last) {
            Some((at, id)) => {
                sink(Event::Damage {
                    file: file.to_owned(),
                    offset: base + pos as u64,
                    reason: format!("{why}; records resume at offset {}", base + at as u64),
                    lost: (id > next).then_some((next, id - 1)),
                });
                pos = at;
                next = id;
            }
            None => {
                if let Some(l) = last {
                    sink(Event::Damage {
                        file: file.to_owned(),
                        offset: base + pos as u64,
                        reason: format!("{why}; no valid record follows"),
                        lost: Some((next, l)),
                    });
                    return SpanEnd {
                        pos,
                        next_id: next,
                        ids_missing_from: Some(next),
                        invalid_at: None,
                        invalid_why: String::new(),
                    };
                }
                return SpanEnd {
                    pos,
                    next_id: next,
                    ids_missing_from: None,
                    invalid_at: Some(base + pos as u64),
                    invalid_why: why,
                };
            }
        }
    }
    let missing = last.filter(|&l| next <= l);
    if let Some(l) = missing {
        sink(Event::Damage {
            file: file.to_owned(),
            offset: base + pos as u64,
            reason: format!(
                "the bytes end at offset {} before msg_id {next}",
                base + pos as u64
            ),
            lost: Some((next, l)),
        });
    }
    SpanEnd {
        pos,
        next_id: next,
        ids_missing_from: missing.map(|_| next),
        invalid_at: None,
        invalid_why: String::new(),
    }
}

/// The first offset after `from` where a valid record of an id in
/// `next..` starts that the skipped bytes can explain (at most one lost id
/// per `RECORD_HEADER_BYTES` skipped, and not past `last`).
fn resync(bytes: &[u8], from: usize, next: u64, last: Option<u64>) -> Option<(usize, u64)> {
    let end = bytes.len().checked_sub(RECORD_HEADER_BYTES)?;
    for at in from + 1..=end {
        let h = &bytes[at..];
        let id = u64::from_le_bytes(h[8..16].try_into().ok()?);
        let skipped_ids = ((at - from) / RECORD_HEADER_BYTES) as u64;
        // Cheap filters before the CRC: the id, kind, flags and reserved
        // bytes (decode_verified checks them again with the length).
        if id < next || id - next > skipped_ids || last.is_some_and(|l| id > l) {
            continue;
        }
        if h[40] > record::KIND_GAP || h[41] > record::FLAG_ERASED || h[42] != 0 || h[43] != 0 {
            continue;
        }
        if record::decode_verified(h, RECORD_BYTES_STORED_MAX).is_ok() {
            return Some((at, id));
        }
    }
    None
}

/// An event of the walk as one line of text, naming its file and offset.
pub(crate) fn describe(ev: &Event<'_>) -> String {
    match ev {
        Event::Record { header, .. } => format!("record {}", header.msg_id),
        Event::Damage { file, offset, .. } | Event::TornTail { file, offset } => {
            format!("{} offset {offset}: {}", file.display(), what(ev))
        }
        Event::LengthMismatch { file, .. } => format!("{}: {}", file.display(), what(ev)),
    }
}

/// What an event says, without its file and offset.
pub(crate) fn what(ev: &Event<'_>) -> String {
    match ev {
        Event::Record { header, .. } => format!("record {}", header.msg_id),
        Event::Damage { reason, lost, .. } => {
            let lost = lost.map_or(String::new(), |(a, b)| format!(" (msg_ids {a}..={b} lost)"));
            format!("{reason}{lost}")
        }
        Event::TornTail { .. } => {
            "torn tail after the last record (cut by the node at its next open)".into()
        }
        Event::LengthMismatch {
            recorded, found, ..
        } => format!("its records end at offset {found}, the checkpoint records {recorded} bytes"),
    }
}
