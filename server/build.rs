//! Records the git commit the binary is built from, for `tidemark --version`
//! (`TIDEMARK_COMMIT`: `git rev-parse --short HEAD`). Outside a git checkout
//! (a source tarball, a crate package) or without git, it is `unknown`: the
//! version number alone then identifies the build. A checkout with
//! uncommitted changes still reports the commit it started from.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let commit = commit().unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=TIDEMARK_COMMIT={commit}");
}

/// The short commit id, when this package is a tracked part of a git
/// checkout (a tarball unpacked inside some other repository is not: its
/// commit would say nothing about this source).
fn commit() -> Option<String> {
    let commit = git(&["rev-parse", "--short", "HEAD"])?;
    // Rebuild when HEAD moves: a commit or a checkout changes HEAD itself
    // (detached) or the branch it names, loose or packed. A path that does
    // not exist would make cargo rerun this script on every build.
    for file in [
        git(&["rev-parse", "--path-format=absolute", "--git-path", "HEAD"]),
        git(&["rev-parse", "--symbolic-full-name", "HEAD"])
            .and_then(|r| git(&["rev-parse", "--path-format=absolute", "--git-path", &r])),
        git(&[
            "rev-parse",
            "--path-format=absolute",
            "--git-path",
            "packed-refs",
        ]),
    ]
    .into_iter()
    .flatten()
    {
        if Path::new(&file).exists() {
            println!("cargo:rerun-if-changed={file}");
        }
    }
    git(&["ls-files", "--error-unmatch", "build.rs"])?;
    Some(commit)
}

/// `git ARGS` in this package's directory: its trimmed output, or `None` if
/// git is missing or fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
