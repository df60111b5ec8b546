//! Replays the committed fuzz corpora through the fuzz targets, so that
//! `cargo test` (and so CI) keeps every target compiling and passing on
//! every input it ever found interesting.
//!
//! The target bodies are library functions
//! (`tidemark_engine::fuzz_targets`, `tidemark_protocol::fuzz_targets`,
//! `tidemark_cluster::fuzz_targets`);
//! `fuzz/fuzz_targets/<name>.rs` are three-line cargo-fuzz wrappers around
//! them. Every file of `fuzz/corpus/<name>/` (seeds),
//! and `fuzz/regressions/<name>/` (inputs of fixed findings) is run
//! through target `<name>`.
//!
//! `TIDEMARK_FUZZ_WRITE_SEEDS=1 cargo test --test it fuzz_corpus` (re)writes
//! the generated seeds into `fuzz/corpus/` (format-spec vectors, files of
//! small engines, op sequences); other files there are left alone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Instant;

type Target = fn(&[u8]);

fn targets() -> Vec<(&'static str, Target)> {
    let mut t: Vec<(&'static str, Target)> = tidemark_engine::fuzz_targets::TARGETS.to_vec();
    t.extend_from_slice(tidemark_protocol::fuzz_targets::TARGETS);
    t.extend_from_slice(tidemark_cluster::fuzz_targets::TARGETS);
    t
}

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of a directory, sorted; none if it does not exist.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(d) => d
            .map(|e| e.expect("read a corpus directory entry").path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// The file stems of a directory's entries with extension `ext` (or all
/// subdirectories when `ext` is `None`).
fn names_in(dir: &Path, ext: Option<&str>) -> BTreeSet<String> {
    let Ok(d) = std::fs::read_dir(dir) else {
        return BTreeSet::new();
    };
    d.map(|e| e.expect("read a directory entry").path())
        .filter(|p| match ext {
            Some(ext) => p.extension().is_some_and(|e| e == ext),
            None => p.is_dir(),
        })
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect()
}

#[test]
fn every_target_has_a_wrapper_and_a_seed_corpus() {
    let fuzz = fuzz_dir();
    let registered: BTreeSet<String> = targets().iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        names_in(&fuzz.join("fuzz_targets"), Some("rs")),
        registered,
        "fuzz/fuzz_targets/*.rs and the registered targets differ"
    );
    let cargo_toml = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for name in &registered {
        assert!(
            cargo_toml.contains(&format!("name = \"{name}\"")),
            "fuzz/Cargo.toml has no [[bin]] for {name}"
        );
        assert!(
            !files_in(&fuzz.join("corpus").join(name)).is_empty(),
            "fuzz/corpus/{name}/ holds no seed"
        );
    }
    for dir in ["corpus", "regressions"] {
        let stale: Vec<String> = names_in(&fuzz.join(dir), None)
            .difference(&registered)
            .cloned()
            .collect();
        assert!(
            stale.is_empty(),
            "fuzz/{dir}/ has directories of no target: {stale:?}"
        );
    }
}

/// Panics in any thread of this process since it started. libFuzzer
/// aborts on a panic in any thread (an engine thread's included: the
/// commit thread turns its own panic into stopped writes, which a target
/// tolerates), so the replay counts them all, not only the ones
/// `catch_unwind` sees on the calling thread.
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
    });
}

#[test]
fn committed_corpora_replay_cleanly() {
    count_panics();
    let fuzz = fuzz_dir();
    let mut failures = Vec::new();
    let mut replayed = 0;
    let started = Instant::now();
    for (name, target) in targets() {
        for dir in ["corpus", "regressions"] {
            for file in files_in(&fuzz.join(dir).join(name)) {
                let bytes = std::fs::read(&file).expect("read a corpus file");
                replayed += 1;
                let before = PANICS.load(Ordering::SeqCst);
                let unwound = std::panic::catch_unwind(|| target(&bytes)).is_err();
                if unwound || PANICS.load(Ordering::SeqCst) != before {
                    failures.push(file.display().to_string());
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz targets failed on committed inputs (panic messages above): {failures:#?}"
    );
    assert!(replayed > 0);
    eprintln!("replayed {replayed} fuzz inputs in {:?}", started.elapsed());
}

/// Parses a format-spec `.hex` vector: `#` comment lines, hex byte pairs.
fn parse_hex(text: &str) -> Vec<u8> {
    let digits: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(|l| l.chars().filter(|c| !c.is_whitespace()))
        .collect();
    assert_eq!(digits.len() & 1, 0, "odd number of hex digits");
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).expect("hex digits"))
        .collect()
}

/// `(file stem, bytes)` of every vector in `format-spec/vectors/<kind>/`.
fn vectors(kind: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("format-spec/vectors")
        .join(kind);
    files_in(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "hex"))
        .map(|p| {
            let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&p).expect("read a vector");
            (stem, parse_hex(&text))
        })
        .collect()
}

#[test]
fn write_seed_corpus() {
    if std::env::var_os("TIDEMARK_FUZZ_WRITE_SEEDS").is_none() {
        return;
    }
    let mut seeds = tidemark_engine::fuzz_targets::seeds(&vectors("storage"));
    seeds.extend(tidemark_protocol::fuzz_targets::seeds(&vectors("protocol")));
    seeds.extend(tidemark_cluster::fuzz_targets::seeds());
    let corpus = fuzz_dir().join("corpus");
    for (target, name, bytes) in seeds {
        let dir = corpus.join(target);
        std::fs::create_dir_all(&dir).expect("create a corpus directory");
        std::fs::write(dir.join(name), bytes).expect("write a seed");
    }
}
