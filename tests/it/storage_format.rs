//! The binary refuses a data directory of another storage format
//! (format-spec/storage.md section 2, "FORMAT"): a directory tidemark 0.1
//! wrote is named as format 1 with the versions of its files, the node
//! exits with a failure status, and nothing is written to the directory.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::harness::tidemark_bin;

/// The header of a tidemark 0.1 journal file (journal version 2, seq 1).
const FORMAT_1_JOURNAL_HEADER: [u8; 32] = [
    0x54, 0x44, 0x4d, 0x4b, 0x4a, 0x52, 0x4e, 0x4c, 0x02, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x7e, 0xee, 0x53, 0x50,
];

/// `format-spec/vectors/storage/<name>.hex` as bytes.
fn storage_vector(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("format-spec/vectors/storage")
        .join(format!("{name}.hex"));
    let text = std::fs::read_to_string(&path).unwrap();
    let digits: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

/// Every path under `dir` with its bytes (directories as `None`), sorted.
pub(crate) fn tree(dir: &Path) -> Vec<(PathBuf, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                out.push((p.clone(), None));
                stack.push(p);
            } else {
                out.push((p.clone(), Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn serve_refuses_a_directory_tidemark_0_1_wrote_naming_format_1() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("journal")).unwrap();
    std::fs::create_dir_all(data.join("groups/05c/0000000000000005")).unwrap();
    std::fs::write(data.join("checkpoint"), storage_vector("checkpoint")).unwrap();
    std::fs::write(
        data.join("journal/00000000000000000001.tmj"),
        FORMAT_1_JOURNAL_HEADER,
    )
    .unwrap();
    let before = tree(&data);
    let out = Command::new(tidemark_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in [
        "tidemark: open engine: data directory",
        "has storage format 1, and this build reads format 2 only",
        "checkpoint version 1",
        "journal version 2",
        "was written by tidemark 0.1 (storage format 1)",
        "nothing was written to it",
    ] {
        assert!(err.contains(needle), "stderr names {needle:?}: {err}");
    }
    assert_eq!(tree(&data), before, "nothing was written to the directory");
}
