//! The source files of a crate against the layering they promise: no two
//! files import each other, directly or round a circle (the engine, the
//! node, the replica set crate, the server crate with its commands), and in
//! the engine no file imports from a layer above its own.
//!
//! The check reads the code as text, without compiling it: every
//! `crate::`, `super::` and `self::` path of a file (in `use` items and in
//! expressions), and paths through a child module that the file declares.
//! A path is followed through `use` re-exports (`pub(crate) use` in a
//! `mod.rs` or `lib.rs`) to the file that defines the name, so a re-export
//! does not hide an arrow. Comments, string literals and `#[cfg(test)]`
//! items are left out, and so are test files (`*_tests.rs`, `tests.rs`):
//! a test may import anything. A `mod` declaration is no import.
//!
//! To see an arrow the check reports, open the importing file at the name
//! given: it is the first name the file takes from the other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The engine's layers, bottom first. A file may import from its own layer
/// and from those below; a file of no layer fails the check, so a new file
/// is placed on purpose. The longest matching prefix places a file.
const ENGINE_LAYERS: &[(&str, &[&str])] = &[
    // The file layer and what every layer shares: errors, the clock, the
    // background worker, the locks whose waiters sleep.
    (
        "io",
        &["io/", "error.rs", "clock.rs", "worker.rs", "sleep_lock.rs"],
    ),
    // Records, segments, extents, cold files, journal framing and the
    // limits that size them: no knowledge of checkpoints or groups.
    // The journal's files and frames are a log too: only the applier of
    // rounds (`commit/`) knows what they mean for groups. `config.rs` is a
    // plain value here (its checks against the formats are `limits.rs`),
    // `sizing.rs` the memory its `groups_max` default follows, `space.rs`
    // the free-space reserve that writers ask.
    (
        "logs",
        &[
            "logs/",
            "config.rs",
            "sizing.rs",
            "space.rs",
            "commit/journal/",
        ],
    ),
    // Memberships, cursors, tidemarks' tables.
    ("members", &["members/"]),
    // A loaded group, the catalog of groups, rounds and their applier.
    ("commit", &["commit/", "group.rs", "catalog.rs"]),
    // Checkpoints, recovery, snapshots.
    ("state", &["state/"]),
    // The facade and what only it and tools use. `impl Engine` blocks of a
    // subsystem (tidemarks, replication, edits) are the facade's too.
    (
        "facade",
        &[
            "engine.rs",
            "ready.rs",
            "edits.rs",
            "members/tidemarks.rs",
            "commit/replicate.rs",
            "offline/",
            "fuzz_targets.rs",
            "spec_vectors.rs",
            "limits.rs",
            "lib.rs",
        ],
    ),
];

/// Circles that are known and allowed for now, each as the exact set of its
/// files. An entry that no longer matches a circle fails the check too, so
/// the list only shrinks. The engine has none.
const ENGINE_CIRCLES_ALLOWED: &[&[&str]] = &[];

/// Upward imports allowed for now (importer, imported), with the same
/// rule. The engine has none.
const ENGINE_UPWARD_ALLOWED: &[(&str, &str)] = &[];

/// The node's circles allowed for now, with the same rule. The node has
/// none.
const NODE_CIRCLES_ALLOWED: &[&[&str]] = &[];

/// The replica set crate's circles allowed for now, with the same rule.
/// It has none.
const CLUSTER_CIRCLES_ALLOWED: &[&[&str]] = &[];

/// The server crate's (the binary's library: serving, the commands of
/// `cli/`, the bench tool) circles allowed for now, with the same rule. It
/// has none.
const SERVER_CIRCLES_ALLOWED: &[&[&str]] = &[];

#[test]
fn the_engine_has_no_import_circle_and_no_upward_import() {
    let tree = Tree::read(&root().join("engine/src"));
    let graph = tree.graph();
    let mut faults = circle_faults(&graph, ENGINE_CIRCLES_ALLOWED);
    faults.extend(layer_faults(&graph, ENGINE_LAYERS, ENGINE_UPWARD_ALLOWED));
    assert!(faults.is_empty(), "engine/src:\n{}", faults.join("\n"));
}

#[test]
fn the_node_has_no_import_circle() {
    assert_no_import_circle("server/node/src", NODE_CIRCLES_ALLOWED);
}

#[test]
fn the_cluster_has_no_import_circle() {
    assert_no_import_circle("server/cluster/src", CLUSTER_CIRCLES_ALLOWED);
}

/// The server crate, its `cli/` commands included (`main.rs` is a crate
/// of its own that imports the library by name: no arrow of this tree).
#[test]
fn the_server_and_its_commands_have_no_import_circle() {
    assert_no_import_circle("server/src", SERVER_CIRCLES_ALLOWED);
}

/// The circle check of the crate whose sources are at `src` (relative to
/// the workspace root).
fn assert_no_import_circle(src: &str, allowed: &[&[&str]]) {
    let tree = Tree::read(&root().join(src));
    let faults = circle_faults(&tree.graph(), allowed);
    assert!(faults.is_empty(), "{src}:\n{}", faults.join("\n"));
}

#[test]
fn a_circle_through_a_re_export_is_named_with_its_arrows() {
    let tree = Tree::from_files(&[
        ("lib.rs", "mod a;\nmod b;\npub use b::Bee;\n"),
        // `crate::Bee` goes through lib.rs's re-export to b.rs.
        (
            "a.rs",
            "// use crate::c::Sea; is a comment\nuse crate::Bee;\npub struct Ay;\n",
        ),
        (
            "b.rs",
            "pub struct Bee;\nfn f() { let _ = crate::a::Ay; }\n",
        ),
        (
            "c.rs",
            "#[cfg(test)]\nmod tests {\n    use crate::a::Ay;\n}\npub struct Sea;\n",
        ),
    ]);
    let graph = tree.graph();
    assert_eq!(
        circle_faults(&graph, &[]),
        vec![
            "circle of 2 files {\"a.rs\", \"b.rs\"}, one loop: a.rs -> b.rs (Bee) -> a.rs (Ay)"
                .to_string()
        ]
    );
    assert!(circle_faults(&graph, &[&["a.rs", "b.rs"]]).is_empty());
    assert_eq!(
        circle_faults(&graph, &[&["a.rs", "b.rs"], &["b.rs", "c.rs"]]),
        vec!["allowed circle no longer there, remove it: [\"b.rs\", \"c.rs\"]".to_string()]
    );
    let layers: &[(&str, &[&str])] = &[("low", &["a.rs", "c.rs"]), ("high", &["b.rs", "lib.rs"])];
    assert_eq!(
        layer_faults(&graph, layers, &[]),
        vec!["upward import: a.rs (low) -> b.rs (high): Bee".to_string()]
    );
    assert!(layer_faults(&graph, layers, &[("a.rs", "b.rs")]).is_empty());
    assert_eq!(
        layer_faults(&graph, layers, &[("a.rs", "b.rs"), ("b.rs", "a.rs")]),
        vec!["allowed upward import no longer there, remove it: b.rs -> a.rs".to_string()]
    );
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A crate's non-test source files, by path relative to its `src/`, with
/// the text the check reads (comments, literals and test items removed).
struct Tree {
    files: BTreeMap<String, String>,
    /// Per file, the names its `use` items bring in.
    uses: BTreeMap<String, Vec<Use>>,
}

/// Arrows between files: importer -> imported -> first name taken.
type Graph = BTreeMap<String, BTreeMap<String, String>>;

impl Tree {
    fn read(src: &Path) -> Tree {
        let mut files = BTreeMap::new();
        let mut dirs = vec![src.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let Some(rel) = path.strip_prefix(src).ok().and_then(|p| p.to_str()) else {
                    continue;
                };
                if rel.ends_with(".rs") && !is_test_file(rel) {
                    let text =
                        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
                    files.insert(rel.to_string(), strip(&text));
                }
            }
        }
        assert!(files.contains_key("lib.rs"), "{src:?} has no lib.rs");
        Tree::new(files)
    }

    fn new(files: BTreeMap<String, String>) -> Tree {
        let uses = files
            .iter()
            .map(|(file, text)| (file.clone(), uses(text, &module_of(file))))
            .collect();
        Tree { files, uses }
    }

    fn from_files(files: &[(&str, &str)]) -> Tree {
        Tree::new(
            files
                .iter()
                .map(|(rel, text)| (rel.to_string(), strip(text)))
                .collect(),
        )
    }

    /// The file that holds module `path` (`[]` is the crate root).
    fn file_of(&self, path: &[String]) -> Option<String> {
        if path.is_empty() {
            return Some("lib.rs".to_string());
        }
        let joined = path.join("/");
        [format!("{joined}.rs"), format!("{joined}/mod.rs")]
            .into_iter()
            .find(|f| self.files.contains_key(f))
    }

    /// The file that defines what `path` names, following `use` items of
    /// the modules on the way; `None` outside the crate.
    fn resolve(&self, path: &[String], depth: usize) -> Option<String> {
        let (file, rest) = self.module_file(path)?;
        if depth < 8 {
            if let Some(first) = rest.first() {
                if let Some(target) = self.uses[&file]
                    .iter()
                    .find(|u| &u.name == first)
                    .map(|u| u.path.clone())
                {
                    let mut onward = target;
                    onward.extend(rest[1..].iter().cloned());
                    if let Some(found) = self.resolve(&onward, depth + 1) {
                        return Some(found);
                    }
                }
            }
        }
        Some(file)
    }

    /// The longest prefix of `path` that is a module file: the file and
    /// the rest of the path.
    fn module_file<'p>(&self, path: &'p [String]) -> Option<(String, &'p [String])> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.file_of(&path[..n]).map(|f| (f, &path[n..])))
    }

    fn graph(&self) -> Graph {
        let mut graph = Graph::new();
        for (file, text) in &self.files {
            let module = module_of(file);
            let arrows = graph.entry(file.clone()).or_default();
            for path in paths(text, &module, &self.uses[file]) {
                let Some(target) = self.resolve(&path, 0) else {
                    continue;
                };
                if &target != file {
                    // The name the file takes: the first one past a module.
                    let name = self
                        .module_file(&path)
                        .and_then(|(_, rest)| rest.first().cloned())
                        .or_else(|| path.last().cloned())
                        .unwrap_or_default();
                    arrows.entry(target).or_insert(name);
                }
            }
        }
        graph
    }
}

fn is_test_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    name == "tests.rs" || name.ends_with("_tests.rs")
}

/// `logs/group_log.rs` -> `[logs, group_log]`; `logs/mod.rs` -> `[logs]`.
fn module_of(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The text without comments, without the contents of string and char
/// literals, and without items under `#[cfg(test)]`.
fn strip(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let rest = &text[i..];
        if rest.starts_with("//") {
            i += rest.find('\n').unwrap_or(rest.len());
        } else if rest.starts_with("/*") {
            let mut depth = 0;
            while i < bytes.len() {
                if text[i..].starts_with("/*") {
                    depth += 1;
                    i += 2;
                } else if text[i..].starts_with("*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(len) = raw_string_len(rest) {
            out.push_str("\"\"");
            i += len;
        } else if bytes[i] == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != b'"' {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if let Some(len) = char_literal_len(rest) {
            out.push_str("' '");
            i += len;
        } else {
            let c = rest.chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
        }
    }
    drop_test_items(&out)
}

/// `r"..."`, `r#"..."#` (and `b` prefixed) at the start of `s`.
fn raw_string_len(s: &str) -> Option<usize> {
    let after_b = s.strip_prefix('b').unwrap_or(s);
    let after_r = after_b.strip_prefix('r')?;
    let hashes = after_r.len() - after_r.trim_start_matches('#').len();
    let body = after_r[hashes..].strip_prefix('"')?;
    let close = format!("\"{}", "#".repeat(hashes));
    let end = body.find(&close)?;
    Some(s.len() - body.len() + end + close.len())
}

/// `'x'`, `'\n'`, `'\u{..}'` at the start of `s` (not a lifetime).
fn char_literal_len(s: &str) -> Option<usize> {
    let body = s.strip_prefix('\'')?;
    let mut chars = body.char_indices();
    let (_, first) = chars.next()?;
    let end = if first == '\\' {
        body.get(2..)?.find('\'')? + 2
    } else {
        let (at, c) = chars.next()?;
        if c != '\'' {
            return None;
        }
        at
    };
    Some(1 + end + 1)
}

/// Removes each item that follows `#[cfg(test)]`: a `use` up to its `;`,
/// anything else up to its `;` or through its braced body.
fn drop_test_items(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let is_use = item.trim_start().starts_with("use ")
            || item.trim_start().starts_with("pub(crate) use ");
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' if !is_use => depth += 1,
                '}' if !is_use && depth == 0 => {
                    // The end of the enclosing item: a test field or
                    // variant was the last one.
                    end = i;
                    break;
                }
                '}' if !is_use => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Star,
    Semi,
    Dollar,
    Dot,
    Other,
}

fn tokens(text: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c.is_alphanumeric() || c == '_' {
            let mut end = i + c.len_utf8();
            while let Some(&(j, d)) = chars.peek() {
                if !(d.is_alphanumeric() || d == '_') {
                    break;
                }
                end = j + d.len_utf8();
                chars.next();
            }
            out.push(Token::Ident(text[i..end].to_string()));
            continue;
        }
        out.push(match c {
            ':' if chars.peek().map(|&(_, d)| d) == Some(':') => {
                chars.next();
                Token::Colons
            }
            '{' => Token::Open,
            '}' => Token::Close,
            ',' => Token::Comma,
            '*' => Token::Star,
            ';' => Token::Semi,
            '$' => Token::Dollar,
            '.' => Token::Dot,
            c if c.is_whitespace() => continue,
            _ => Token::Other,
        });
    }
    out
}

/// The child modules a file declares (`mod name;`).
fn children(toks: &[Token]) -> BTreeSet<String> {
    toks.windows(3)
        .filter_map(|w| match w {
            [Token::Ident(m), Token::Ident(name), Token::Semi] if m == "mod" => Some(name.clone()),
            _ => None,
        })
        .collect()
}

/// Where a path that starts with `first` begins, as an absolute module
/// path, or `None` for another crate.
fn start_of(first: &str, module: &[String], kids: &BTreeSet<String>) -> Option<Vec<String>> {
    match first {
        "crate" => Some(Vec::new()),
        "self" => Some(module.to_vec()),
        "super" => Some(module[..module.len().saturating_sub(1)].to_vec()),
        name if kids.contains(name) => Some([module, &[name.to_string()]].concat()),
        _ => None,
    }
}

/// Every path into the crate that a file names, made absolute. A
/// re-export that the file does not use itself is the module's face, not
/// an import of the file: its users are led on to the defining file.
fn paths(text: &str, module: &[String], uses: &[Use]) -> Vec<Vec<String>> {
    let toks = tokens(text);
    let kids = children(&toks);
    let used_here = |name: &str| {
        toks.iter()
            .filter(|t| matches!(t, Token::Ident(n) if n == name))
            .count()
            > 1
    };
    let mut out: Vec<Vec<String>> = uses
        .iter()
        .filter(|u| !u.public || used_here(&u.name))
        .map(|u| u.path.clone())
        .collect();
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == Token::Ident("use".into()) {
            // Use items were read above.
            while i < toks.len() && toks[i] != Token::Semi {
                i += 1;
            }
            continue;
        }
        let after_path_sep =
            i > 0 && matches!(toks[i - 1], Token::Colons | Token::Dollar | Token::Dot);
        if let (Token::Ident(first), Some(Token::Colons), false) =
            (&toks[i], toks.get(i + 1), after_path_sep)
        {
            if let Some(mut path) = start_of(first, module, &kids) {
                let mut j = i + 1;
                while let (Some(Token::Colons), Some(Token::Ident(seg))) =
                    (toks.get(j), toks.get(j + 1))
                {
                    if seg == "super" {
                        path.pop();
                    } else {
                        path.push(seg.clone());
                    }
                    j += 2;
                }
                out.push(path);
                i = j;
                continue;
            }
        }
        i += 1;
    }
    out
}

/// The names a file's `use` items bring in, each with the absolute path it
/// stands for (globs and other crates left out).
fn uses(text: &str, module: &[String]) -> Vec<Use> {
    let toks = tokens(text);
    let kids = children(&toks);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i] == Token::Ident("use".into()) {
            let end = toks[i..]
                .iter()
                .position(|t| *t == Token::Semi)
                .map_or(toks.len(), |p| i + p);
            let public = i > 0 && toks[i - 1] == Token::Ident("pub".into())
                || i > 3
                    && toks[i - 1] == Token::Other
                    && toks[i - 4] == Token::Ident("pub".into());
            let mut pos = i + 1;
            let mut found = Vec::new();
            use_tree(&toks[..end], &mut pos, None, module, &kids, &mut found);
            out.extend(
                found
                    .into_iter()
                    .map(|(name, path)| Use { name, path, public }),
            );
            i = end;
        }
        i += 1;
    }
    out
}

/// A name that a `use` item brings into a file.
struct Use {
    name: String,
    /// The absolute path it stands for.
    path: Vec<String>,
    /// A re-export (`pub use`, `pub(crate) use`): users of the name are
    /// led on to `path`.
    public: bool,
}

/// The first segment of a use path into another crate.
const EXTERN: &str = "<extern>";

/// One use tree from `toks[*pos]`: a path, then `{...}`, `*`, or a name
/// (`self` in a group names the prefix), optionally renamed with `as`.
fn use_tree(
    toks: &[Token],
    pos: &mut usize,
    prefix: Option<Vec<String>>,
    module: &[String],
    kids: &BTreeSet<String>,
    out: &mut Vec<(String, Vec<String>)>,
) {
    let mut path = prefix;
    let mut last: Option<String> = None;
    while *pos < toks.len() {
        match &toks[*pos] {
            Token::Ident(seg) if seg == "as" => {
                *pos += 1;
                if let (Some(Token::Ident(alias)), Some(p)) = (toks.get(*pos), &path) {
                    if p.first().map(String::as_str) != Some(EXTERN) {
                        out.push((alias.clone(), p.clone()));
                    }
                    *pos += 1;
                }
                return;
            }
            Token::Ident(seg) => {
                path = match path {
                    None => start_of(seg, module, kids).or(Some(vec![EXTERN.into()])),
                    Some(mut p) if seg == "super" => {
                        p.pop();
                        Some(p)
                    }
                    Some(p) if seg == "self" => Some(p),
                    Some(mut p) => {
                        p.push(seg.clone());
                        Some(p)
                    }
                };
                last = Some(seg.clone());
                *pos += 1;
                if toks.get(*pos) == Some(&Token::Colons) {
                    *pos += 1;
                    continue;
                }
                break;
            }
            Token::Open => {
                *pos += 1;
                while *pos < toks.len() && toks[*pos] != Token::Close {
                    if toks[*pos] == Token::Comma {
                        *pos += 1;
                        continue;
                    }
                    use_tree(toks, pos, path.clone(), module, kids, out);
                }
                *pos += 1;
                return;
            }
            Token::Star => {
                *pos += 1;
                return;
            }
            _ => {
                *pos += 1;
                return;
            }
        }
    }
    if let (Some(p), Some(name)) = (path, last) {
        if p.first().map(String::as_str) != Some(EXTERN) {
            let name = if name == "self" {
                p.last().cloned().unwrap_or_default()
            } else {
                name
            };
            out.push((name, p));
        }
    }
}

/// The import circles (strongly connected sets of two files or more) that
/// are not allowed, each with one loop through it, and the allowed ones
/// that are gone.
fn circle_faults(graph: &Graph, allowed: &[&[&str]]) -> Vec<String> {
    let mut faults = Vec::new();
    let circles = circles(graph);
    for files in &circles {
        let names: BTreeSet<&str> = files.iter().map(String::as_str).collect();
        if allowed
            .iter()
            .any(|a| a.iter().copied().collect::<BTreeSet<_>>() == names)
        {
            continue;
        }
        faults.push(format!(
            "circle of {} files {:?}, one loop: {}",
            files.len(),
            names,
            one_loop(graph, files)
        ));
    }
    for a in allowed {
        let set: BTreeSet<String> = a.iter().map(|s| s.to_string()).collect();
        if !circles.contains(&set) {
            faults.push(format!("allowed circle no longer there, remove it: {a:?}"));
        }
    }
    faults
}

/// Strongly connected components of two files or more (Tarjan).
fn circles(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|a| a.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("invariant: visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("invariant: visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut set = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                set.insert(w.to_string());
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                s.out.push(set);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// A shortest loop from the circle's first file back to it, each arrow
/// with the first name it carries.
fn one_loop(graph: &Graph, files: &BTreeSet<String>) -> String {
    let start = files.iter().next().expect("invariant: a circle has files");
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.as_str()]);
    let mut last = None;
    'search: while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().filter(|w| files.contains(*w)) {
            if w == start {
                last = Some(v);
                break 'search;
            }
            if !came_from.contains_key(w.as_str()) {
                came_from.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    let mut route = vec![start.as_str()];
    let mut v = last.expect("invariant: a circle loops back to its start");
    while v != start {
        route.push(v);
        v = came_from[v];
    }
    route.push(start);
    route.reverse();
    let mut text = route[0].to_string();
    for pair in route.windows(2) {
        text.push_str(&format!(" -> {} ({})", pair[1], graph[pair[0]][pair[1]]));
    }
    text
}

/// Each arrow from a file to a file of a higher layer that `allowed` does
/// not list, each file that no layer places, and each allowed arrow that is
/// no longer an upward import.
fn layer_faults(
    graph: &Graph,
    layers: &[(&str, &[&str])],
    allowed: &[(&str, &str)],
) -> Vec<String> {
    let place = |file: &str| {
        layers
            .iter()
            .enumerate()
            .flat_map(|(n, (_, prefixes))| prefixes.iter().map(move |p| (n, *p)))
            .filter(|(_, p)| file.starts_with(p))
            .max_by_key(|(_, p)| p.len())
            .map(|(n, _)| n)
    };
    let mut faults = Vec::new();
    for (file, arrows) in graph {
        let Some(from) = place(file) else {
            faults.push(format!("{file} is in no layer: add it to the layer list"));
            continue;
        };
        for (target, name) in arrows {
            if let Some(to) = place(target).filter(|&to| to > from) {
                if allowed.contains(&(file.as_str(), target.as_str())) {
                    continue;
                }
                faults.push(format!(
                    "upward import: {file} ({}) -> {target} ({}): {name}",
                    layers[from].0, layers[to].0
                ));
            }
        }
    }
    for &(file, target) in allowed {
        let upward =
            graph.get(file).is_some_and(|a| a.contains_key(target)) && place(target) > place(file);
        if !upward {
            faults.push(format!(
                "allowed upward import no longer there, remove it: {file} -> {target}"
            ));
        }
    }
    faults
}
