//! The workspace's manifests against what they promise: the stated minimum
//! Rust covers every locked dependency, the README states that minimum, and
//! every declared workspace dependency is used by some member.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `key = "value"` at the start of a line of a manifest.
fn toml_str(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.trim().strip_prefix(key)?.trim_start();
        let v = rest.strip_prefix('=')?.trim();
        Some(v.strip_prefix('"')?.strip_suffix('"')?.to_string())
    })
}

/// The manifests of the root package and of every workspace member, from
/// the root's `members = [...]`.
fn member_manifests() -> Vec<String> {
    let manifest = read("Cargo.toml");
    let start = manifest
        .find("members = [")
        .expect("members = [ in Cargo.toml");
    let list = &manifest[start + "members = [".len()..];
    let list = &list[..list.find(']').expect("end of members")];
    let mut out = vec!["Cargo.toml".to_string()];
    out.extend(
        list.split(',')
            .map(|m| m.trim().trim_matches('"'))
            .filter(|m| !m.is_empty())
            .map(|m| format!("{m}/Cargo.toml")),
    );
    out
}

fn version(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The registry sources cargo unpacked (those of this platform's build).
fn registry_dirs() -> Vec<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return Vec::new();
    };
    std::fs::read_dir(src)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn the_stated_minimum_rust_covers_every_locked_dependency() {
    let manifest = read("Cargo.toml");
    let stated = toml_str(&manifest, "rust-version").expect("rust-version in Cargo.toml");
    let lock = read("Cargo.lock");
    let dirs = registry_dirs();
    let mut checked = 0;
    let mut too_new = Vec::new();
    for package in lock.split("[[package]]").skip(1) {
        let (Some(name), Some(ver)) = (toml_str(package, "name"), toml_str(package, "version"))
        else {
            continue;
        };
        // Crates of other platforms are locked but never unpacked here.
        let Some(text) = dirs
            .iter()
            .find_map(|d| std::fs::read_to_string(d.join(format!("{name}-{ver}/Cargo.toml"))).ok())
        else {
            continue;
        };
        checked += 1;
        if let Some(needs) = toml_str(&text, "rust-version") {
            if version(&needs) > version(&stated) {
                too_new.push(format!("{name} {ver} needs {needs}"));
            }
        }
    }
    if checked == 0 {
        eprintln!("workspace: no unpacked registry sources found; rust-version not checked");
        return;
    }
    assert!(
        too_new.is_empty(),
        "rust-version {stated} is below what locked dependencies need: {too_new:?}"
    );
    // Every member inherits it, so cargo and clippy hold the code to it.
    for member in member_manifests() {
        assert!(
            read(&member).contains("rust-version.workspace = true"),
            "{member} does not inherit rust-version"
        );
    }
    let readme = read("README.md");
    assert!(
        readme.contains(&format!("Rust toolchain, {stated} or newer")),
        "README does not state rust-version {stated}"
    );
}

#[test]
fn every_workspace_dependency_is_used_by_a_member() {
    let manifest = read("Cargo.toml");
    let start = manifest
        .find("[workspace.dependencies]")
        .expect("[workspace.dependencies]");
    let section = &manifest[start..];
    let end = section[1..].find("\n[").map_or(section.len(), |i| i + 1);
    let members: Vec<String> = member_manifests().iter().map(|m| read(m)).collect();
    assert!(members.len() > 2, "members = [...] not found in Cargo.toml");
    let unused: Vec<&str> = section[..end]
        .lines()
        .skip(1)
        .filter_map(|l| l.split('=').next().map(str::trim))
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .filter(|name| {
            // `name.workspace = true`, or `name = { workspace = true, ... }`
            // when the member adds features (`testing`).
            !members.iter().any(|m| {
                m.contains(&format!("\n{name}.workspace = true"))
                    || m.contains(&format!("\n{name} = {{ workspace = true"))
            })
        })
        .collect();
    assert!(unused.is_empty(), "declared but unused: {unused:?}");
}
