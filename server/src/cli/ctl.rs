//! `tidemark ctl`: the offline tool for a stopped node's data directory
//! (format-spec/storage.md section 19): `inspect`, `dump`, `verify`,
//! `repair`, and `raft-log` for a replica set member's Raft log
//! (`cli/raft_log.rs`). The reading, checking and repairing is the engine's
//! (`tidemark_engine::DataDir`, `engine/src/offline/`); this module parses
//! the command line and prints, as text or (`--json`, for `inspect`,
//! `dump` and `verify`) JSON.
//!
//! `verify` draws its progress on standard error when that is a terminal
//! (`cli/progress.rs`).
//!
//! Nothing is written unless `repair` is given `--yes`; without it, repair
//! prints what it would do. A directory a running node holds (its `LOCK`)
//! is refused.
//!
//! Exit status ([`EXIT_CLEAN`], [`EXIT_DAMAGE`], [`EXIT_ERROR`]), like
//! `PRAGMA integrity_check` answers "ok" or the problems: 0 when the
//! command did what it was asked and, for `verify`, found no damage; 1 when
//! `verify` found damage, or `repair` refused, left a group unrepaired,
//! found nothing it can do while `verify` finds damage, or was not given
//! `--yes` while there was something to do; 2 when the
//! command could not run (usage, a locked, missing or unreadable directory,
//! a group that does not exist).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use tidemark_engine::{DataDir, Error, RecordShape, RepairTarget};

use super::common::out;

pub use super::common::{EXIT_CLEAN, EXIT_DAMAGE, EXIT_ERROR};

/// Payload bytes `dump` prints as text before it cuts (`--json` prints all).
const PAYLOAD_SHOWN_MAX: usize = 64;

/// `tidemark ctl`: work on the data directory of a stopped node.
#[derive(Args, Debug)]
pub struct CtlArgs {
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// What the directory holds: the checkpoint in force and its replay
    /// position, journal and cold files, every group (head, floor,
    /// members, segments or extents, sizes, damage).
    Inspect(InspectArgs),
    /// A group's records (a range of ids, gap records included), or the
    /// frames and entries of journal files.
    Dump(DumpArgs),
    /// Check every CRC, every checked invariant of the storage format and
    /// every file the checkpoint names. Exit status 0: clean; 1: damage
    /// (each finding printed with its file and offset); 2: could not check.
    Verify(VerifyArgs),
    /// Repair damaged groups: keep every intact record before and after
    /// the damage at its id, write a gap record for each lost id, record
    /// the group again in a new checkpoint; and a lost or damaged journal
    /// (replay from after it; its small groups' lost records become gaps).
    /// Prints what it would do; does it only with --yes. Needs a directory
    /// a clean shutdown left.
    Repair(RepairArgs),
    /// A replica set member's Raft log: header, start, members, hard
    /// state, entries (index range and terms), and how the file ends
    /// (clean, a torn tail, or damage with its file and offset). Exit
    /// status 0: clean or torn; 1: damage; 2: no log could be read.
    RaftLog(super::raft_log::RaftLogArgs),
}

#[derive(Args, Debug)]
pub struct DirArgs {
    /// The data directory of a stopped node.
    #[arg(long, default_value = tidemark_node::defaults::DATA_DIR)]
    pub data: PathBuf,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Only this group, with its members.
    #[arg(long)]
    pub group: Option<u64>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Print one JSON object: the findings and the totals.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The group whose records to print.
    #[arg(long, required_unless_present = "journal", conflicts_with = "journal")]
    pub group: Option<u64>,
    /// First msg_id printed.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Last msg_id printed (default: the head).
    #[arg(long)]
    pub to: Option<u64>,
    /// Print journal frames and entries instead: of file SEQ, or of every
    /// journal file without a value.
    #[arg(long, value_name = "SEQ", num_args = 0..=1, default_missing_value = "all")]
    pub journal: Option<String>,
    /// One JSON object per record (or per journal file) and line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RepairArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Repair only this group (default: every damaged group).
    #[arg(long, conflicts_with = "delete_group")]
    pub group: Option<u64>,
    /// Delete this group (records, memberships, files) instead: for a group
    /// that cannot be repaired, so that its journal files can go.
    #[arg(long, value_name = "GROUP")]
    pub delete_group: Option<u64>,
    /// Do it. Without --yes nothing is written.
    #[arg(long)]
    pub yes: bool,
}

/// Runs a `ctl` command and gives its exit status.
pub fn run(args: CtlArgs) -> ExitCode {
    let status = match args.command {
        CtlCommand::Inspect(a) => inspect(a),
        CtlCommand::Dump(a) => dump(a),
        CtlCommand::Verify(a) => verify(a),
        CtlCommand::Repair(a) => repair(a),
        CtlCommand::RaftLog(a) => super::raft_log::run(a),
    };
    match status {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("tidemark ctl: {e}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

/// Opens `dir` for a command that only reads it; a replica set member's
/// directory (`engine/` beside `raft/`) is read at its engine's directory,
/// said on stderr.
fn open_to_read(dir: &Path) -> Result<DataDir, String> {
    match tidemark_engine::member_engine(dir) {
        Some(engine) if !dir.join("FORMAT").exists() => {
            eprintln!(
                "tidemark ctl: {} is a replica set member's directory: reading its engine, {}",
                dir.display(),
                engine.display()
            );
            open(&engine)
        }
        _ => open(dir),
    }
}

/// Opens `dir` as given (`repair` writes: a member's engine is named
/// explicitly, never found for it).
fn open(dir: &Path) -> Result<DataDir, String> {
    DataDir::open(dir).map_err(|e| match e {
        Error::Locked { .. } => format!("{e}; ctl works on stopped nodes only"),
        other => other.to_string(),
    })
}

fn inspect(a: InspectArgs) -> Result<u8, String> {
    let d = open_to_read(&a.dir.data)?;
    let mut i = d.inspect().map_err(|e| e.to_string())?;
    if let Some(g) = a.group {
        i.groups.retain(|x| x.id == g);
        if i.groups.is_empty() {
            return Err(format!("group {g} is not in the checkpoint"));
        }
    }
    if a.json {
        let v = json!({
            "data_dir": i.path.display().to_string(),
            "checkpoint": i.manifest.as_ref().map(|m| json!({
                "manifest": m.file.display().to_string(),
                "seq": m.ckpt_seq,
                "clean_shutdown": m.clean,
                "replay_journal_seq": m.replay_journal_seq,
                "replay_lsn": m.replay_lsn,
                "replay_round": m.replay_round,
                "runs": m.runs.iter().map(|r| json!({
                    "seq": r.0, "parts": r.1, "items": r.2, "bytes": r.3,
                })).collect::<Vec<_>>(),
                "pinned": m.pinned.iter().map(|&p| pinned_name(p)).collect::<Vec<_>>(),
                "groups_per_user_bound": m.groups_per_user_bound,
                "groups_bound": m.groups_bound,
            })),
            "rejected_manifests": i.rejected_manifests.iter().map(|(p, why)| json!({
                "file": p.display().to_string(), "reason": why,
            })).collect::<Vec<_>>(),
            "journal_files": i.journal_files.iter().map(|f| json!({
                "seq": f.0, "bytes": f.1, "first_lsn": f.2, "first_round": f.3,
            })).collect::<Vec<_>>(),
            "cold_files": i.cold_files.iter().map(|f| json!({"seq": f.0, "bytes": f.1}))
                .collect::<Vec<_>>(),
            "groups": i.groups.iter().map(|g| json!({
                "group": g.id,
                "kind": g.kind,
                "head": g.head,
                "floor": g.floor,
                "applied_lsn": g.applied_lsn,
                "members": g.members.iter().map(|m| json!({
                    "user": m.user, "cursor": m.cursor, "join_point": m.join_point,
                })).collect::<Vec<_>>(),
                "segments": g.segments.iter().map(|s| json!({
                    "base": s.0, "recorded_bytes": s.1, "file_bytes": s.2,
                })).collect::<Vec<_>>(),
                "extents": g.extents.iter().map(|e| json!({
                    "file": pinned_name(u64::from(e.0)), "offset": e.1, "bytes": e.2, "count": e.3,
                })).collect::<Vec<_>>(),
                "damaged": g.damaged,
                "retention": {
                    "by_cursor": g.retention.0,
                    "max_age_ms": g.retention.1,
                    "max_bytes": g.retention.2,
                },
            })).collect::<Vec<_>>(),
        });
        out(&format!("{v}\n"));
        return Ok(EXIT_CLEAN);
    }
    let mut s = format!("data directory {}\n", i.path.display());
    match &i.manifest {
        None => s.push_str("checkpoint: none stored\n"),
        Some(m) => {
            s.push_str(&format!(
                "checkpoint {} ({}): {}, replay from journal file {} at lsn {} (round {})\n",
                m.ckpt_seq,
                m.file.display(),
                if m.clean {
                    "clean shutdown"
                } else {
                    "not a clean shutdown"
                },
                m.replay_journal_seq,
                m.replay_lsn,
                m.replay_round
            ));
            for r in &m.runs {
                s.push_str(&format!(
                    "  run {}: {} part(s), {} items, {} bytes\n",
                    r.0, r.1, r.2, r.3
                ));
            }
            if !m.pinned.is_empty() {
                let names: Vec<String> = m.pinned.iter().map(|&p| pinned_name(p)).collect();
                s.push_str(&format!("  pinned: {}\n", names.join(", ")));
            }
            let bound = |b: Option<u64>| b.map_or("unknown".to_string(), |b| b.to_string());
            s.push_str(&format!(
                "  at most {} groups, at most {} per user\n",
                bound(m.groups_bound),
                bound(m.groups_per_user_bound)
            ));
        }
    }
    for (p, why) in &i.rejected_manifests {
        s.push_str(&format!("  rejected manifest {}: {why}\n", p.display()));
    }
    s.push_str(&format!("journal files: {}\n", i.journal_files.len()));
    for f in &i.journal_files {
        s.push_str(&format!(
            "  {:020}.tmj: {} bytes, first lsn {}, first round {}\n",
            f.0, f.1, f.2, f.3
        ));
    }
    if !i.cold_files.is_empty() {
        s.push_str(&format!("cold files: {}\n", i.cold_files.len()));
        for f in &i.cold_files {
            s.push_str(&format!("  {:020}.tmc: {} bytes\n", f.0, f.1));
        }
    }
    s.push_str(&format!("groups: {}\n", i.groups.len()));
    for g in &i.groups {
        s.push_str(&format!(
            "  group {}: {}, head {}, floor {}, {} member(s), applied lsn {}\n",
            g.id,
            g.kind,
            g.head,
            g.floor,
            g.members.len(),
            g.applied_lsn
        ));
        if let Some(why) = &g.damaged {
            s.push_str(&format!("    damaged: {why}\n"));
        }
        for seg in &g.segments {
            s.push_str(&format!(
                "    segment {}: {} bytes recorded, {}\n",
                seg.0,
                seg.1,
                seg.2
                    .map_or("file missing".to_owned(), |l| format!("{l} bytes on disk"))
            ));
        }
        if !g.extents.is_empty() {
            let bytes: u64 = g.extents.iter().map(|e| u64::from(e.2)).sum();
            s.push_str(&format!(
                "    {} extent(s), {bytes} bytes, in {}\n",
                g.extents.len(),
                distinct_files(&g.extents).join(", ")
            ));
        }
        if a.group.is_some() {
            for m in &g.members {
                s.push_str(&format!(
                    "    member {}: cursor {}, join point {}\n",
                    m.user, m.cursor, m.join_point
                ));
            }
        }
    }
    out(&s);
    Ok(EXIT_CLEAN)
}

/// A shared file id as stored (2^31 + seq for a cold file) as its name.
fn pinned_name(raw: u64) -> String {
    const COLD: u64 = 1 << 31;
    if raw & COLD != 0 {
        format!("{:020}.tmc", raw & !COLD)
    } else {
        format!("{raw:020}.tmj")
    }
}

fn distinct_files(extents: &[(u32, u32, u32, u32)]) -> Vec<String> {
    let mut files: Vec<u32> = extents.iter().map(|e| e.0).collect();
    files.dedup();
    files
        .into_iter()
        .map(|f| pinned_name(u64::from(f)))
        .collect()
}

fn dump(a: DumpArgs) -> Result<u8, String> {
    let d = open_to_read(&a.dir.data)?;
    if let Some(which) = &a.journal {
        let seq = match which.as_str() {
            "all" => None,
            n => Some(
                n.parse::<u64>()
                    .map_err(|_| format!("--journal {n}: not a journal file number"))?,
            ),
        };
        let files = d.journal(seq).map_err(|e| e.to_string())?;
        let mut s = String::new();
        for f in files {
            if a.json {
                let v = json!({
                    "seq": f.seq,
                    "file": f.path.display().to_string(),
                    "header": f.header,
                    "frames": f.frames.iter().map(|fr| json!({
                        "offset": fr.offset,
                        "lsn": fr.lsn,
                        "round": fr.round,
                        "synced_len": fr.synced_len,
                        "entries": fr.entries.iter().map(|e| json!({
                            "kind": e.0, "group": e.1, "body": e.2,
                        })).collect::<Vec<_>>(),
                    })).collect::<Vec<_>>(),
                    "stopped": f.stop.as_ref().map(|(at, why)| json!({"offset": at, "reason": why})),
                });
                s.push_str(&format!("{v}\n"));
                continue;
            }
            s.push_str(&format!(
                "journal file {} ({}): {}\n",
                f.seq,
                f.path.display(),
                f.header.as_deref().unwrap_or("header unreadable")
            ));
            for fr in &f.frames {
                s.push_str(&format!(
                    "  frame at {}: lsn {}, round {}, synced_len {}, {} entries\n",
                    fr.offset,
                    fr.lsn,
                    fr.round,
                    fr.synced_len,
                    fr.entries.len()
                ));
                for (kind, group, body) in &fr.entries {
                    let sep = if body.is_empty() { "" } else { " " };
                    s.push_str(&format!("    {kind} group {group}{sep}{body}\n"));
                }
            }
            if let Some((at, why)) = &f.stop {
                s.push_str(&format!("  stopped at offset {at}: {why}\n"));
            }
        }
        out(&s);
        return Ok(EXIT_CLEAN);
    }
    // Invariant: clap requires --group unless --journal.
    let Some(group) = a.group else {
        return Err("--group or --journal is required".into());
    };
    let dump = d
        .records(group, a.from, a.to.unwrap_or(u64::MAX))
        .map_err(|e| e.to_string())?;
    let mut s = String::new();
    for r in &dump.records {
        let shape = r.shape;
        if a.json {
            let mut v = json!({
                "group": group,
                "msg_id": r.msg_id,
                "kind": shape.name(),
                "timestamp_ms": r.timestamp_ms,
                "sender": r.sender_id,
                "client_msg_id": r.client_msg_id,
                "file": r.file.display().to_string(),
                "offset": r.offset,
            });
            if let Some(target) = shape.target() {
                v["target"] = Value::from(target);
            }
            if matches!(shape, RecordShape::Message | RecordShape::Edit { .. }) {
                match std::str::from_utf8(&r.payload) {
                    Ok(t) => v["payload"] = Value::from(t),
                    Err(_) => v["payload_hex"] = Value::from(super::hex(&r.payload)),
                }
            }
            s.push_str(&format!("{v}\n"));
        } else if shape == RecordShape::Gap {
            s.push_str(&format!(
                "#{} gap (lost to damage, repaired) {}\n",
                r.msg_id,
                super::utc(r.timestamp_ms)
            ));
        } else {
            // A long payload is cut for the terminal (--json has it whole).
            let text = if r.payload.len() > PAYLOAD_SHOWN_MAX {
                format!(
                    "{}... ({} bytes)",
                    super::payload_text(&r.payload[..PAYLOAD_SHOWN_MAX]),
                    r.payload.len()
                )
            } else {
                super::payload_text(&r.payload)
            };
            let shown = match shape {
                RecordShape::Edit { target } => format!("edit of #{target}: {text}"),
                RecordShape::Recall { target } => format!("recall of #{target}"),
                RecordShape::Erased => "(recalled; payload erased)".to_owned(),
                _ => text,
            };
            s.push_str(&format!(
                "#{} {} from {} (client_msg_id {}): {shown}\n",
                r.msg_id,
                super::utc(r.timestamp_ms),
                r.sender_id,
                r.client_msg_id,
            ));
        }
    }
    out(&s);
    for why in &dump.damage {
        eprintln!("damage: {why}");
    }
    Ok(if dump.damage.is_empty() {
        EXIT_CLEAN
    } else {
        EXIT_DAMAGE
    })
}

fn verify(a: VerifyArgs) -> Result<u8, String> {
    let d = open_to_read(&a.dir.data)?;
    let mut progress = super::progress::Progress::verify(a.json);
    let v = d
        .verify_with_progress(&mut |p| progress.verified(p))
        .map_err(|e| e.to_string());
    // The line is cleared before anything is printed.
    drop(progress);
    let v = v?;
    let status = if v.clean() { EXIT_CLEAN } else { EXIT_DAMAGE };
    if a.json {
        let j = json!({
            "data_dir": a.dir.data.display().to_string(),
            "clean": v.clean(),
            "groups": v.groups,
            "records": v.records,
            "journal_frames": v.journal_frames,
            "findings": v.findings.iter().map(|f| json!({
                "damage": f.damage,
                "group": f.group,
                "file": f.file.as_ref().map(|p| p.display().to_string()),
                "offset": f.offset,
                "what": f.what,
            })).collect::<Vec<_>>(),
        });
        out(&format!("{j}\n"));
        return Ok(status);
    }
    let mut s = String::new();
    for f in &v.findings {
        s.push_str(&format!("{f}\n"));
    }
    let damage = v.findings.iter().filter(|f| f.damage).count();
    s.push_str(&format!(
        "{}: {} groups, {} records, {} journal frames checked; {damage} damaged, {} note(s)\n",
        if v.clean() { "ok" } else { "DAMAGED" },
        v.groups,
        v.records,
        v.journal_frames,
        v.findings.len() - damage
    ));
    out(&s);
    Ok(if v.clean() { EXIT_CLEAN } else { EXIT_DAMAGE })
}

fn repair(a: RepairArgs) -> Result<u8, String> {
    let mut d = open(&a.dir.data)?;
    let target = match (a.delete_group, a.group) {
        (Some(g), _) => RepairTarget::DeleteGroup(g),
        (None, Some(g)) => RepairTarget::Group(g),
        (None, None) => RepairTarget::AllDamaged,
    };
    let plan = d.plan_repair(target).map_err(|e| e.to_string())?;
    if let Some(why) = &plan.refused {
        eprintln!("tidemark ctl: repair refused: {why}");
        return Ok(EXIT_DAMAGE);
    }
    let mut s = String::new();
    for (g, why) in &plan.unrepairable {
        s.push_str(&format!("group {g} cannot be repaired: {why}\n"));
    }
    if plan.is_empty() {
        // Repair and verify agree on what is damage: damage this tool
        // does not repair is said, not hidden behind "nothing to repair".
        let v = match target {
            RepairTarget::AllDamaged => d.verify().map_err(|e| e.to_string())?,
            _ => Default::default(),
        };
        let left: Vec<_> = v.findings.iter().filter(|f| f.damage).collect();
        if left.is_empty() {
            s.push_str("nothing to repair\n");
        } else {
            s.push_str("nothing this tool can repair, but verify finds damage:\n");
            for f in &left {
                s.push_str(&format!("  {f}\n"));
            }
        }
        out(&s);
        return Ok(if plan.unrepairable.is_empty() && left.is_empty() {
            EXIT_CLEAN
        } else {
            EXIT_DAMAGE
        });
    }
    s.push_str(if a.yes {
        "repairing:\n"
    } else {
        "would do (nothing is written without --yes):\n"
    });
    for line in &plan.actions {
        s.push_str(&format!("  {line}\n"));
    }
    out(&s);
    if !a.yes {
        return Ok(EXIT_DAMAGE);
    }
    let unrepairable = !plan.unrepairable.is_empty();
    d.repair(plan).map_err(|e| format!("repair failed: {e}"))?;
    let v = d.verify().map_err(|e| e.to_string())?;
    let mut s = String::from("done\n");
    for f in v.findings.iter().filter(|f| f.damage) {
        s.push_str(&format!("still: {f}\n"));
    }
    s.push_str(&format!(
        "verify: {}\n",
        if v.clean() { "ok" } else { "DAMAGED" }
    ));
    out(&s);
    Ok(if v.clean() && !unrepairable {
        EXIT_CLEAN
    } else {
        EXIT_DAMAGE
    })
}
