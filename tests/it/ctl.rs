//! `tidemark ctl` against the real binary: a node fills a directory and
//! stops; the test damages it (bytes flipped in the middle of a large
//! group's sealed segment, the journal file holding a small group's
//! records cut short); `ctl verify` names the damage (status 1); `ctl
//! repair` without `--yes` says what it would do and changes no byte, with
//! `--yes` repairs; `ctl verify` is clean (status 0); the node serves the
//! repaired groups again: every intact record before and after the damage
//! at its id, the next sends after the old heads, the gaps visible in `ctl
//! dump` and over the wire (kind Gap in protocol version 2, an empty
//! message in version 1), and not unread. A running node's directory is
//! refused (status 2).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tidemark_client::{Client, ClientConfig, Kind};
use tidemark_protocol::JoinStart;

use crate::cluster;
use crate::harness::{tidemark_bin, Node, ReplicaMember};
use crate::storage_format::tree;

const BIG: u64 = 1;
const SMALL: u64 = 2;
const BIG_SENDS: u64 = 120;
const SMALL_SENDS: u64 = 3;

fn payload(i: u64) -> Vec<u8> {
    vec![b'a' + (i % 26) as u8; 20_000]
}

fn ctl(args: &[&str], data: &Path) -> Output {
    Command::new(tidemark_bin())
        .arg("ctl")
        .args(args)
        .arg("--data")
        .arg(data)
        .output()
        .expect("run tidemark ctl")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn segment(data: &Path, group: u64, base: u64) -> PathBuf {
    let name = format!("{group:016x}");
    for shard in std::fs::read_dir(data.join("groups")).unwrap() {
        let p = shard
            .unwrap()
            .path()
            .join(&name)
            .join(format!("{base:020}.seg"));
        if p.exists() {
            return p;
        }
    }
    panic!("no segment {base} of group {group}");
}

/// `(msg_id, kind, payload)` of `ctl dump --json`.
fn dump(data: &Path, group: u64) -> Vec<(u64, String, Vec<u8>)> {
    let o = ctl(&["dump", "--json", "--group", &group.to_string()], data);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["msg_id"].as_u64().unwrap(),
                v["kind"].as_str().unwrap().to_owned(),
                v["payload"].as_str().unwrap_or("").as_bytes().to_vec(),
            )
        })
        .collect()
}

/// Segments of 1 MiB (the smallest allowed).
const FLAGS: [&str; 2] = ["--segment-bytes-max", "1048684"];

/// A node on `data`: group 1 with `big` records of 20,000 bytes (member
/// 100), group 2 small with three ("small 1", ...; member 200).
fn start_and_fill(data: &Path, big: u64) -> Node {
    let node = Node::start(data, &FLAGS);
    let mut c = node.client();
    c.create_group(BIG).unwrap();
    c.create_group(SMALL).unwrap();
    c.join(BIG, 100, JoinStart::Earliest).unwrap();
    c.join(SMALL, 200, JoinStart::Earliest).unwrap();
    for i in 1..=big {
        assert_eq!(c.send(BIG, 7, i, &payload(i)).unwrap().msg_id, i);
    }
    for i in 1..=SMALL_SENDS {
        c.send(SMALL, 8, i, format!("small {i}").as_bytes())
            .unwrap();
    }
    node
}

#[test]
fn a_damaged_directory_is_verified_repaired_and_served_again() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = start_and_fill(&data, BIG_SENDS);
    // A running node's directory is refused, and nothing is written.
    let o = ctl(&["verify"], &data);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("running node"), "{}", text(&o));
    assert!(node.terminate().success());

    let o = ctl(&["verify"], &data);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // 20,044-byte records, 52 to a 1 MiB segment: bases 1, 53, 105.
    let sealed = segment(&data, BIG, 53);
    let mut b = std::fs::read(&sealed).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0xff;
    b[mid + 1] ^= 0xff;
    std::fs::write(&sealed, b).unwrap();
    // The small group's records are the journal's last: its third goes.
    let journal = data.join("journal").join(format!("{:020}.tmj", 1));
    let len = std::fs::metadata(&journal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap()
        .set_len(len - 30)
        .unwrap();

    let o = ctl(&["verify"], &data);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains(&*sealed.to_string_lossy()), "{t}");
    assert!(t.contains(&*journal.to_string_lossy()), "{t}");

    let before = tree(&data);
    let o = ctl(&["repair"], &data);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("nothing is written without --yes"));
    assert!(text(&o).contains("gap records for msg_ids"), "{}", text(&o));
    assert_eq!(tree(&data), before, "repair without --yes wrote");

    let o = ctl(&["repair", "--yes"], &data);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = ctl(&["verify"], &data);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));

    // The gaps, in ctl dump; every other record intact at its id.
    let records = dump(&data, BIG);
    assert_eq!(records.len() as u64, BIG_SENDS);
    let gaps: Vec<u64> = records
        .iter()
        .filter(|r| r.1 == "gap")
        .map(|r| r.0)
        .collect();
    assert!(!gaps.is_empty(), "a gap marks the lost record");
    assert!(gaps[0] > 53 && *gaps.last().unwrap() < 104, "{gaps:?}");
    for (i, (id, kind, p)) in records.iter().enumerate() {
        assert_eq!(*id, i as u64 + 1);
        if kind == "message" {
            assert_eq!(*p, payload(*id), "record {id}");
        }
    }
    let small = dump(&data, SMALL);
    assert_eq!(
        small
            .iter()
            .map(|r| (r.0, r.1.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "message"), (2, "message"), (3, "gap")]
    );

    // Served again: a version 2 client sees the gaps as kind Gap, a
    // version 1 client as empty messages (protocol.md section 7), both at
    // dense ids with every other record intact; the gaps are not unread.
    let node = Node::start(&data, &FLAGS);
    let mut c = node.client();
    let mut v1 = {
        let mut config = ClientConfig::new(node.addr.clone());
        config.max_version = 1;
        Client::connect(&config).expect("a version 1 client")
    };
    let unread = c.unread(100).unwrap();
    assert_eq!(
        unread.iter().find(|g| g.group == BIG).map(|g| g.unread),
        Some(BIG_SENDS - gaps.len() as u64),
        "gaps are not unread"
    );
    // Another member reads with the version 1 client (each read ACKs).
    c.join(BIG, 101, JoinStart::Earliest).unwrap();
    for (client, user, gap_kind) in [(&mut c, 100, Kind::Gap), (&mut v1, 101, Kind::Message)] {
        let mut seen: Vec<tidemark_client::Message> = Vec::new();
        while (seen.len() as u64) < BIG_SENDS {
            let page = client.pull(BIG, user, seen.len() as u64, 1000, 0).unwrap();
            assert!(!page.messages.is_empty());
            seen.extend(page.messages);
        }
        for (i, m) in seen.iter().enumerate() {
            assert_eq!(m.msg_id, i as u64 + 1, "dense ids");
            if gaps.contains(&m.msg_id) {
                assert_eq!((m.kind, m.payload.len()), (gap_kind, 0), "gap {}", m.msg_id);
            } else {
                assert_eq!((m.kind, &m.payload), (Kind::Message, &payload(m.msg_id)));
            }
        }
    }
    assert_eq!(
        c.send(BIG, 7, BIG_SENDS + 1, b"after").unwrap().msg_id,
        BIG_SENDS + 1
    );
    let page = c.pull(SMALL, 200, 0, 2, 0).unwrap();
    assert_eq!(
        page.messages
            .iter()
            .map(|m| (m.msg_id, m.payload.clone()))
            .collect::<Vec<_>>(),
        vec![(1, b"small 1".to_vec()), (2, b"small 2".to_vec())]
    );
    assert_eq!(c.send(SMALL, 8, 9, b"small 4").unwrap().msg_id, 4);
}

/// A cleanly stopped node loses the journal file holding a small group's
/// records: `verify` names it, `repair --yes` turns exactly that group's
/// ids into gaps (the clean checkpoint names them) and moves the replay
/// position past the journal; the large group loses nothing; the node
/// serves both and the small group's sends go on after its old head.
#[test]
fn a_lost_journal_file_of_a_stopped_node_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut node = start_and_fill(&data, 60);
    assert!(node.terminate().success());
    let journal = data.join("journal").join(format!("{:020}.tmj", 1));
    std::fs::remove_file(&journal).unwrap();

    let o = ctl(&["verify"], &data);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&*journal.to_string_lossy()),
        "{}",
        text(&o)
    );
    let o = ctl(&["repair", "--yes"], &data);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains("replay from journal file"),
        "{}",
        text(&o)
    );
    let o = ctl(&["verify"], &data);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(
        dump(&data, SMALL)
            .iter()
            .map(|r| (r.0, r.1.as_str()))
            .collect::<Vec<_>>(),
        vec![(1, "gap"), (2, "gap"), (3, "gap")]
    );

    let node = Node::start(&data, &FLAGS);
    let mut c = node.client();
    let page = c.pull(BIG, 100, 0, 1000, 0).unwrap();
    assert_eq!(page.messages.len(), 60);
    assert!(page
        .messages
        .iter()
        .enumerate()
        .all(|(i, m)| m.msg_id == i as u64 + 1 && m.payload == payload(m.msg_id)));
    assert_eq!(
        c.send(SMALL, 8, 9, b"after").unwrap().msg_id,
        SMALL_SENDS + 1
    );
    assert_eq!(c.send(BIG, 7, 61, b"after").unwrap().msg_id, 61);
}

/// `ctl raft-log` on a real replica set member's directory (a set of
/// three, stopped after some rounds): the header, start, members, hard
/// state and entries, status 0; then a byte flipped in the middle of the
/// Raft log (a record a later write shows to have been synced): status 1,
/// the file and the offset of the damaged record named, the file left as
/// it was.
#[test]
fn ctl_raft_log_prints_a_members_log_and_names_damage() {
    let root = tempfile::tempdir().unwrap();
    let ports = cluster::free_ports();
    let mut members: Vec<ReplicaMember> = [1, 2, 3]
        .iter()
        .map(|&id| cluster::start_member(id, root.path(), &ports))
        .collect();
    cluster::on_leader(&ports, |c| c.create_group(BIG));
    cluster::on_leader(&ports, |c| c.join(BIG, 100, JoinStart::Earliest));
    for i in 1..=20 {
        cluster::on_leader(&ports, |c| {
            c.send(BIG, 7, i, format!("round {i}").as_bytes())
        });
    }
    for m in &mut members {
        m.terminate();
    }
    let dir = members[0].dir.clone();

    let o = ctl(&["raft-log"], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let t = text(&o);
    for part in [
        "version 3",
        "hard state: term ",
        "node 1: voter",
        "end: clean",
    ] {
        assert!(t.contains(part), "{part:?} in {t}");
    }
    let o = ctl(&["raft-log", "--json"], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let (hs, entries) = (&v["hard_state"], &v["entries"]);
    assert!(hs["term"].as_u64().unwrap() >= 1, "{v}");
    // Bootstrap's start (1, 1), then the leader's empty entry, the group,
    // the join and 20 sends: one entry each at least.
    assert_eq!(v["start"]["index"], 1);
    assert!(entries["last"].as_u64().unwrap() >= 23, "{v}");
    assert!(hs["commit"].as_u64().unwrap() >= 23, "{v}");
    assert_eq!(v["members"]["list"].as_array().unwrap().len(), 3, "{v}");
    assert!(v["damage"].is_null() && v["torn"].is_null(), "{v}");

    let path = dir.join("raft").join("log");
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let o = ctl(&["raft-log", "--json"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let damage = &v["damage"];
    assert_eq!(damage["file"], path.display().to_string());
    let offset = damage["offset"].as_u64().unwrap();
    assert!(offset <= mid as u64 && offset + 1000 > mid as u64, "{v}");
    assert_eq!(v["valid_bytes"], offset);
    let o = ctl(&["raft-log"], &dir);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    assert!(
        t.contains(&format!("DAMAGED: {} at offset {offset}", path.display())),
        "{t}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "ctl only reads");
}

/// Small groups besides `SMALL` (three records each, member `300 + g`).
const MORE_SMALL: [u64; 3] = [3, 4, 5];

/// A node fills the directory (a segmented group, four small ones) and
/// stops cleanly; a restarted node takes two more sends in every group,
/// the small group first, and is killed (`crash`) or stopped. Returns the
/// last acknowledged id of each group.
fn fill_restart_and_stop(data: &Path, crash: bool) -> Vec<(u64, u64)> {
    let mut node = start_and_fill(data, 30);
    let mut c = node.client();
    for g in MORE_SMALL {
        c.create_group(g).unwrap();
        c.join(g, 300 + g, JoinStart::Earliest).unwrap();
        for i in 1..=3 {
            c.send(g, 8, i, format!("small {g}/{i}").as_bytes())
                .unwrap();
        }
    }
    drop(c);
    assert!(node.terminate().success());
    let mut node = Node::start(data, &FLAGS);
    let mut c = node.client();
    let mut acked = Vec::new();
    for g in [SMALL, BIG].into_iter().chain(MORE_SMALL) {
        let mut last = 0;
        for i in 0..2 {
            last = c.send(g, 9, 100 + i, b"after restart").unwrap().msg_id;
        }
        acked.push((g, last));
    }
    drop(c);
    if crash {
        node.kill();
    } else {
        assert!(node.terminate().success());
    }
    acked
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

fn flip(path: &Path, at: usize) {
    let mut b = std::fs::read(path).unwrap();
    b[at] ^= 0x10;
    std::fs::write(path, b).unwrap();
}

/// `(path, bytes)` of the files of `dir` with `suffix`, by name.
fn files(dir: &Path, suffix: &str) -> Vec<(PathBuf, u64)> {
    let mut v: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p, len)
        })
        .collect();
    v.sort();
    v
}

/// One damage to a copy of a filled directory, then `ctl verify` (status 1,
/// naming the file and the offset), `ctl repair --yes`, and `serve`. Each
/// acknowledged record's fate is one of: the node refuses the directory
/// naming the damaged file, or it serves every group (none has vanished)
/// and the next send to each gets an id above every acknowledged one (an
/// id is never handed out twice). Returns whether the node served.
fn damage_verify_repair_serve(
    base: &Path,
    acked: &[(u64, u64)],
    what: &str,
    damage: impl FnOnce(&Path) -> (PathBuf, Option<u64>),
) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    copy_dir(base, &data);
    let (file, offset) = damage(&data);
    let o = ctl(&["verify"], &data);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{what}: verify finds damage: {t}");
    assert!(
        t.contains(&*file.to_string_lossy()),
        "{what}: names {}: {t}",
        file.display()
    );
    if let Some(offset) = offset {
        assert!(
            t.contains(&format!("offset {offset}")),
            "{what}: offset {offset}: {t}"
        );
    }
    let repair = ctl(&["repair", "--yes"], &data);
    match Node::try_start(&data, &FLAGS) {
        Err(err) => {
            assert!(
                err.contains(&*file.to_string_lossy()),
                "{what}: the node refuses naming {}: {err}",
                file.display()
            );
            assert_ne!(repair.status.code(), Some(0), "{what}: {}", text(&repair));
            false
        }
        Ok(node) => {
            let mut c = node.client();
            for &(g, last) in acked {
                let id = c
                    .send(g, 77, 1, b"after repair")
                    .unwrap_or_else(|e| panic!("{what}: group {g}: {e}"))
                    .msg_id;
                assert!(
                    id > last,
                    "{what}: group {g} gave id {id}, {last} was acknowledged ({})",
                    text(&repair)
                );
            }
            true
        }
    }
}

/// Damage to every kind of checkpoint file and journal header, after a
/// crash and after a clean stop (format-spec/storage.md sections 10, 11
/// and 19): the node, `verify` and `repair` agree that it is damage,
/// name the file, and never let a group vanish or an id be given twice.
#[test]
fn checkpoint_and_journal_header_damage_is_named_and_never_reissues_an_id() {
    let dir = tempfile::tempdir().unwrap();
    let crashed = dir.path().join("crashed");
    let acked_crashed = fill_restart_and_stop(&crashed, true);
    let stopped = dir.path().join("stopped");
    let acked_stopped = fill_restart_and_stop(&stopped, false);

    for (base, acked, when) in [
        (&crashed, &acked_crashed, "after a crash"),
        (&stopped, &acked_stopped, "after a clean stop"),
    ] {
        // The oldest run part, which both kept manifests name: no
        // checkpoint is usable, so the node refuses (never opens without
        // its small groups).
        let served = damage_verify_repair_serve(base, acked, &format!("run part {when}"), |d| {
            let (part, _) = files(&d.join("state"), ".tmr").remove(0);
            flip(&part, 64 + 20);
            (part, Some(64))
        });
        let _ = served;
        // Both manifests lost while the data stays.
        let served = damage_verify_repair_serve(base, acked, &format!("manifests {when}"), |d| {
            for (m, _) in files(&d.join("manifest"), ".tmm") {
                std::fs::remove_file(m).unwrap();
            }
            (d.join("manifest"), None)
        });
        assert!(!served, "no checkpoint {when}: refused");
        // The newest manifest: the previous one is complete.
        let served = damage_verify_repair_serve(base, acked, &format!("manifest {when}"), |d| {
            let (m, len) = files(&d.join("manifest"), ".tmm").pop().unwrap();
            flip(&m, len as usize - 3);
            (m, Some(0))
        });
        assert!(served, "the fallback manifest serves {when}");
    }

    // After the crash, the clean checkpoint's journal file holds no frame
    // and the next one holds the restarted node's: its header damaged is
    // damage (the node refuses), and repair writes it anew, losing
    // nothing.
    let served =
        damage_verify_repair_serve(&crashed, &acked_crashed, "empty journal header", |d| {
            let journals = files(&d.join("journal"), ".tmj");
            let i = journals
                .iter()
                .position(|(_, len)| *len == 48)
                .expect("an empty journal file");
            assert!(journals[i + 1..].iter().any(|(_, len)| *len > 48));
            let path = journals[i].0.clone();
            flip(&path, 20);
            (path, Some(0))
        });
    assert!(served, "the repaired header serves");
    // After the crash, a flipped bit in the small group's first record
    // since the restart (in the journal only): the checkpoint in force
    // still says "clean", but frames follow it. The node refuses; repair
    // must not drop the frames (and give their ids again): it refuses.
    let served = damage_verify_repair_serve(&crashed, &acked_crashed, "journal frame", |d| {
        // The newest file with frames (an empty spare, made ahead of the
        // next roll, may follow it).
        let (path, _) = files(&d.join("journal"), ".tmj")
            .into_iter()
            .rev()
            .find(|(_, len)| *len > 0)
            .unwrap();
        // Header 48, envelope 32, payload header 32, entry header 16, the
        // record's header 44: a byte of its payload.
        flip(&path, 48 + 32 + 32 + 16 + 44 + 2);
        (path, None)
    });
    assert!(!served, "refused");
}
