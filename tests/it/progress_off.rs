//! `backup` and `ctl verify` draw progress on standard error only when it
//! is a terminal (server/src/cli/progress.rs). Run as a script runs them,
//! with both outputs captured (pipes, not terminals), they print what they
//! printed before progress existed: the report on standard output, as
//! text or one JSON line, nothing on standard error, and no control
//! character (a progress line's carriage returns and escapes) anywhere.

use std::path::Path;
use std::process::Command;

use tidemark_protocol::JoinStart;

use crate::harness::{tidemark_bin, Node};

const GROUPS: u64 = 3;
const SENDS: u64 = 20;

/// Any byte below a space but the newline, or DEL.
fn control_bytes(b: &[u8]) -> Vec<u8> {
    b.iter()
        .copied()
        .filter(|&c| (c < 0x20 && c != b'\n') || c == 0x7f)
        .collect()
}

fn run(args: &[&str], dir: &Path) -> String {
    let out = Command::new(tidemark_bin())
        .args(args)
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "",
        "{args:?}: nothing on standard error"
    );
    assert_eq!(control_bytes(&out.stdout), b"", "{args:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn backup_and_ctl_verify_draw_nothing_when_stderr_is_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(&dir.path().join("node"), &[]);
    let mut c = node.client();
    for g in 1..=GROUPS {
        c.create_group(g).unwrap();
        c.join(g, 100 + g, JoinStart::Earliest).unwrap();
        for i in 1..=SENDS {
            c.send(g, 7, i, format!("g{g} m{i}").as_bytes()).unwrap();
        }
    }
    let addr = node.addr.as_str();

    let copy = dir.path().join("copy");
    let text = run(&["backup", "--addr", addr], &copy);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with(&format!("backup of {addr} in {}: ", copy.display())),
        "{text}"
    );
    assert!(lines[1].starts_with("checkpoint "), "{text}");
    assert_eq!(
        lines[2..],
        [
            "the copy was opened once and closed cleanly: ctl verify and ctl repair take it as is"
                .to_string(),
            format!("restore: tidemark serve --data {}", copy.display()),
        ]
    );

    let copy_json = dir.path().join("copy-json");
    let text = run(&["backup", "--json", "--addr", addr], &copy_json);
    assert_eq!(text.lines().count(), 1, "{text}");
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(j["bytes"].as_u64().unwrap() > 0, "{text}");

    let text = run(&["ctl", "verify", "--data"], &copy);
    let records = GROUPS * SENDS;
    assert!(
        text.starts_with(&format!("ok: {GROUPS} groups, {records} records, "))
            && text.ends_with(" journal frames checked; 0 damaged, 0 note(s)\n")
            && text.lines().count() == 1,
        "{text}"
    );
    let text = run(&["ctl", "verify", "--json", "--data"], &copy_json);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        (j["clean"].as_bool(), j["records"].as_u64()),
        (Some(true), Some(records))
    );
    assert_eq!(text.lines().count(), 1, "{text}");
}
