//! The daemon's modules form layers at every level: among the top-level
//! modules of `backend/src`, and among the direct children of every folder
//! of it (a child folder stands for everything under it), no module
//! reaches, through its code, a module that reaches back to it. A circle
//! means modules that can only be understood together (the layers are
//! listed in `backend/src/lib.rs`); these tests name the first one found.
//!
//! Imports are read from the code, not from comments, strings or
//! `#[cfg(test)]` parts: every `crate::`, `super::` and `self::` path, in
//! `use` declarations (nested groups included) and inline, resolved to the
//! deepest module of the source tree it names. An item of a folder's own
//! `mod.rs` belongs to the folder, not to one of its children.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root (`["engine", "sweep"]`).
type ModPath = Vec<String>;

/// Per folder (its module path), the imports among its direct children:
/// child -> child -> where (`file:line`) it was first seen.
type Graphs = BTreeMap<ModPath, BTreeMap<String, BTreeMap<String, String>>>;

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read the source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a source file is, from the crate root: `a/mod.rs` and
/// `a.rs` are `a`; the crate roots (`lib.rs`, `main.rs`) are `[]`.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap();
    if parts.is_empty() && (file == "lib.rs" || file == "main.rs") {
        return parts;
    }
    if file != "mod.rs" {
        parts.push(file.trim_end_matches(".rs").to_string());
    }
    parts
}

/// `text` with comments, string and character literals blanked out
/// (newlines kept, so lines still count).
fn strip_comments_and_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&c, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            while j < c.len() {
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.extend(c[i..j.min(c.len())].iter().map(|&ch| blank(ch)));
            i = j;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                let skip = if c[i] == '\\' { 2 } else { 1 };
                for k in 0..skip {
                    if let Some(&ch) = c.get(i + k) {
                        out.push(blank(ch));
                    }
                }
                i += skip;
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{..}'), not a lifetime.
            let end = if next == Some('\\') {
                (i + 2..c.len()).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.extend(c[i..=e].iter().map(|&ch| blank(ch)));
                    i = e + 1;
                }
                None => {
                    out.push(c[i]);
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Whether `c[i]` continues an identifier (so an `r` there starts no raw
/// string).
fn ident_before(c: &[char], i: usize) -> bool {
    i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')
}

/// `code` (comments and literals already blanked) without its
/// `#[cfg(test)]` items and `pub(in path)` visibilities, which name a
/// module without importing anything from it.
fn strip_test_items(code: &str) -> String {
    let c: Vec<char> = code.chars().collect();
    let mut keep = vec![true; c.len()];
    let squeezed = |from: usize| -> (String, Vec<usize>) {
        // The non-blank characters from `from`, with their positions.
        let mut s = String::new();
        let mut at = Vec::new();
        for (j, &ch) in c.iter().enumerate().skip(from) {
            if !ch.is_whitespace() {
                s.push(ch);
                at.push(j);
            }
            if s.len() >= 16 {
                break;
            }
        }
        (s, at)
    };
    let mut i = 0;
    while i < c.len() {
        if c[i] != '#' && c[i] != 'p' {
            i += 1;
            continue;
        }
        let (s, at) = squeezed(i);
        if c[i] == '#' && s.starts_with("#[cfg(test)]") {
            // The attribute, any further attributes, then the item: up to
            // its `;`, or through its braces.
            let mut j = at[11] + 1;
            let mut depth = 0i32;
            let mut braces = false;
            while j < c.len() {
                match c[j] {
                    '[' | '(' => depth += 1,
                    ']' | ')' => depth -= 1,
                    '{' => {
                        depth += 1;
                        braces = true;
                    }
                    '}' => {
                        depth -= 1;
                        if braces && depth == 0 {
                            break;
                        }
                    }
                    ';' if depth == 0 && !braces => break,
                    _ => {}
                }
                j += 1;
            }
            for k in keep.iter_mut().take((j + 1).min(c.len())).skip(i) {
                *k = false;
            }
            i = j + 1;
        } else if c[i] == 'p' && s.starts_with("pub(in") && !ident_before(&c, i) {
            let close = (i..c.len()).find(|&j| c[j] == ')').unwrap_or(c.len() - 1);
            for k in keep.iter_mut().take(close + 1).skip(i) {
                *k = false;
            }
            i = close + 1;
        } else {
            i += 1;
        }
    }
    c.iter()
        .zip(keep)
        .map(|(&ch, k)| if k || ch == '\n' { ch } else { ' ' })
        .collect()
}

/// A token of the code: an identifier, `::`, or one other character.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path,
    Punct(char),
}

/// The tokens of `code`, each with its line (1-based).
fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(ch), line));
            i += 1;
        }
    }
    out
}

/// The paths of the path tree starting at `toks[at]`, each as its segments
/// after `prefix` (`a::{b, c::{d, self}}` gives `a::b`, `a::c::d`, `a::c`);
/// returns the position after the tree.
fn path_tree(
    toks: &[(Tok, usize)],
    mut at: usize,
    prefix: &[String],
    out: &mut Vec<Vec<String>>,
) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(at).map(|t| &t.0) {
            Some(Tok::Ident(name)) => {
                // `self` in a group names the group's prefix.
                if name != "self" {
                    path.push(name.clone());
                }
                at += 1;
                if toks.get(at).map(|t| &t.0) == Some(&Tok::Path) {
                    at += 1;
                    continue;
                }
                out.push(path);
                return at;
            }
            Some(Tok::Punct('{')) => {
                at += 1;
                loop {
                    match toks.get(at).map(|t| &t.0) {
                        Some(Tok::Punct('}')) | None => return at + 1,
                        Some(Tok::Punct(',')) => at += 1,
                        _ => {
                            let before = at;
                            at = path_tree(toks, at, &path, out);
                            // Skip `as name` and anything unexpected.
                            while !matches!(
                                toks.get(at).map(|t| &t.0),
                                Some(Tok::Punct(',')) | Some(Tok::Punct('}')) | None
                            ) {
                                at += 1;
                            }
                            if at == before {
                                at += 1;
                            }
                        }
                    }
                }
            }
            _ => {
                // `*`, or a path that ends in `::<` (generic arguments).
                out.push(path);
                return at + usize::from(toks.get(at).is_some());
            }
        }
    }
}

/// Every module path the code of module `me` names through `crate::`,
/// `super::` or `self::`, with its line, resolved from the crate root (not
/// yet cut to a module of the tree).
fn named_paths(code: &str, me: &[String]) -> Vec<(Vec<String>, usize)> {
    let toks = tokens(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let starts = matches!(&toks[i].0, Tok::Ident(n) if n == "crate" || n == "super" || n == "self")
            && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path)
            && !(i > 0 && toks[i - 1].0 == Tok::Path);
        if !starts {
            i += 1;
            continue;
        }
        let line = toks[i].1;
        // The base the path starts from.
        let mut base: Vec<String> = me.to_vec();
        let mut at = i;
        match &toks[at].0 {
            Tok::Ident(n) if n == "crate" => {
                base.clear();
                at += 2;
            }
            Tok::Ident(n) if n == "self" => at += 2,
            _ => {
                while matches!(toks.get(at).map(|t| &t.0), Some(Tok::Ident(n)) if n == "super")
                    && toks.get(at + 1).map(|t| &t.0) == Some(&Tok::Path)
                {
                    base.pop();
                    at += 2;
                }
            }
        }
        let mut found = Vec::new();
        let end = path_tree(&toks, at, &[], &mut found);
        for p in found {
            let mut full = base.clone();
            full.extend(p);
            out.push((full, line));
        }
        i = end.max(i + 1);
    }
    out
}

/// The deepest module of `modules` that `path` lies in.
fn resolve(modules: &BTreeSet<ModPath>, path: &[String]) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// The modules of the tree under `src` and the source files that count
/// (those not compiled for tests only), with their modules.
fn tree(src: &Path) -> (BTreeSet<ModPath>, Vec<(PathBuf, ModPath)>) {
    let mut files = Vec::new();
    sources(src, &mut files);
    files.sort();
    let modules: BTreeSet<ModPath> = files
        .iter()
        .map(|f| module_of(f.strip_prefix(src).unwrap()))
        .collect();
    // Modules declared `#[cfg(test)] [pub(...)] mod name;` by their parent.
    let mut test_only = BTreeSet::new();
    for f in &files {
        let me = module_of(f.strip_prefix(src).unwrap());
        let code = strip_comments_and_literals(&std::fs::read_to_string(f).unwrap());
        let words: Vec<String> = tokens(&code)
            .into_iter()
            .map(|(t, _)| match t {
                Tok::Ident(n) => n,
                Tok::Path => "::".into(),
                Tok::Punct(c) => c.to_string(),
            })
            .collect();
        for (i, w) in words.windows(7).enumerate() {
            if w.concat() != "#[cfg(test)]" {
                continue;
            }
            let item = words.iter().skip(i + 7).take(8);
            let item: Vec<&String> = item.take_while(|w| *w != ";" && *w != "{").collect();
            if let Some(k) = item.iter().position(|w| *w == "mod") {
                if let Some(name) = item.get(k + 1) {
                    let mut m = me.clone();
                    m.push((*name).clone());
                    test_only.insert(m);
                }
            }
        }
    }
    let counted = files
        .into_iter()
        .map(|f| {
            let m = module_of(f.strip_prefix(src).unwrap());
            (f, m)
        })
        .filter(|(_, m)| !m.is_empty() && !test_only.iter().any(|t| m.starts_with(t)))
        .collect();
    (modules, counted)
}

/// The import graphs of every folder of the source tree under `src`.
fn graphs(src: &Path) -> Graphs {
    let (modules, files) = tree(src);
    let mut graphs = Graphs::new();
    for (file, me) in files {
        let rel = file.strip_prefix(src).unwrap().display().to_string();
        let text = std::fs::read_to_string(&file).unwrap();
        let code = strip_test_items(&strip_comments_and_literals(&text));
        for (path, line) in named_paths(&code, &me) {
            let to = resolve(&modules, &path);
            // At each folder above the file: the child it is in, and the
            // child the path leads to, if another.
            for k in 0..me.len() {
                if to.len() > k && to[..k] == me[..k] && to[k] != me[k] {
                    graphs
                        .entry(me[..k].to_vec())
                        .or_default()
                        .entry(me[k].clone())
                        .or_default()
                        .entry(to[k].clone())
                        .or_insert_with(|| format!("{rel}:{line}"));
                }
            }
        }
    }
    graphs
}

/// A circle through `at`, as the path from `at` back to it, if any.
fn cycle_from(
    graph: &BTreeMap<String, BTreeMap<String, String>>,
    at: &str,
    path: &mut Vec<String>,
    done: &mut BTreeSet<String>,
) -> Option<Vec<String>> {
    if let Some(i) = path.iter().position(|m| m == at) {
        let mut c = path[i..].to_vec();
        c.push(at.to_string());
        return Some(c);
    }
    if done.contains(at) {
        return None;
    }
    path.push(at.to_string());
    for next in graph.get(at).into_iter().flat_map(|m| m.keys()) {
        if let Some(c) = cycle_from(graph, next, path, done) {
            return Some(c);
        }
    }
    path.pop();
    done.insert(at.to_string());
    None
}

/// The first circle of `graph`, in words (`a -> b (file:line)`, ...).
fn first_circle(graph: &BTreeMap<String, BTreeMap<String, String>>) -> Option<String> {
    let mut done = BTreeSet::new();
    graph.keys().find_map(|m| {
        cycle_from(graph, m, &mut Vec::new(), &mut done).map(|c| {
            c.windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
                .collect::<Vec<_>>()
                .join("\n  ")
        })
    })
}

/// The first circle among the children of any folder of `graphs`, naming
/// the folder.
fn first_circle_anywhere(graphs: &Graphs) -> Option<String> {
    graphs.iter().find_map(|(folder, g)| {
        first_circle(g).map(|c| format!("among the children of src/{}:\n  {c}", folder.join("/")))
    })
}

fn daemon_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../backend/src")
}

#[test]
fn top_level_modules_import_each_other_in_one_direction_only() {
    let graphs = graphs(&daemon_src());
    let graph = graphs.get(&Vec::new()).cloned().unwrap_or_default();
    // The graph is not empty: the parse found the daemon's layers.
    assert!(graph.get("engine").is_some_and(|m| m.contains_key("vm")));
    assert!(graph
        .get("ctrl")
        .is_some_and(|m| m.contains_key("resources")));
    if let Some(c) = first_circle(&graph) {
        panic!("import cycle:\n  {c}");
    }
}

/// Inside every folder too: the files of a folder, and its subfolders
/// each taken whole, import each other in one direction only.
#[test]
fn no_folder_has_an_import_circle_among_its_children() {
    let graphs = graphs(&daemon_src());
    // Folders were read, not only the top level.
    let engine = graphs
        .get(&vec!["engine".to_string()])
        .expect("engine's graph");
    assert!(engine.get("sweep").is_some_and(|m| m.contains_key("poll")));
    let soft = graphs
        .get(&vec!["rnic".to_string(), "soft".to_string()])
        .expect("the software RNIC's graph");
    assert!(soft.get("path").is_some_and(|m| m.contains_key("route")));
    if let Some(c) = first_circle_anywhere(&graphs) {
        panic!("import circle {c}");
    }
}

/// The engine is the device model both RNICs share: it hands work to an
/// RNIC's data path through the seam below it (`rnic_path`) and never
/// names an RNIC; and neither RNIC reaches into the other.
#[test]
fn the_engine_never_imports_an_rnic_and_the_rnics_never_each_other() {
    let graphs = graphs(&daemon_src());
    let top = graphs.get(&Vec::new()).expect("the top-level graph");
    assert!(top.get("rnic").is_some_and(|m| m.contains_key("engine")));
    assert!(top
        .get("engine")
        .is_some_and(|m| m.contains_key("rnic_path")));
    if let Some(at) = top.get("engine").and_then(|m| m.get("rnic")) {
        panic!("the engine imports an RNIC ({at})");
    }
    let rnic = graphs
        .get(&vec!["rnic".to_string()])
        .cloned()
        .unwrap_or_default();
    for (a, b) in [("soft", "verbs"), ("verbs", "soft")] {
        if let Some(at) = rnic.get(a).and_then(|m| m.get(b)) {
            panic!("rnic::{a} imports rnic::{b} ({at})");
        }
    }
}

/// The reading of paths: nested groups, `self` and `super`, inline paths;
/// not comments, strings, `pub(in ...)` or test code.
#[test]
fn paths_are_read_through_groups_super_and_self_and_not_from_comments_or_tests() {
    let me: ModPath = vec!["a".into(), "b".into(), "c".into()];
    let text = r#"
        use crate::{x::{y, z::{self, w as ww}}, v::*};
        use super::{self as up, q::R};
        use self::inner::S;
        use super::super::p;
        // use crate::comment;
        /* crate::block */
        pub(in crate::hidden) fn f() -> u32 {
            let s = "crate::string";
            let c = '"';
            crate::m::n::f(c, s)
        }
        #[cfg(test)]
        mod tests {
            use crate::test_only;
        }
        #[cfg(test)]
        use crate::test_import;
        fn after() { crate::last::g() }
    "#;
    let code = strip_test_items(&strip_comments_and_literals(text));
    let got: BTreeSet<String> = named_paths(&code, &me)
        .into_iter()
        .map(|(p, _)| p.join("::"))
        .collect();
    let want: BTreeSet<String> = [
        "x::y",
        "x::z",
        "x::z::w",
        "v",
        "a::b",
        "a::b::q::R",
        "a::b::c::inner::S",
        "a::p",
        "m::n::f",
        "last::g",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(got, want);
}

/// The checks find a circle where there is one, at the level where it is,
/// and name it with where each import is.
#[test]
fn a_circle_among_a_folders_files_is_found_and_named() {
    let dir = std::env::temp_dir().join(format!("module-graph-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod low;\npub mod up;\n");
    write("low.rs", "pub struct L;\n");
    write(
        "up/mod.rs",
        "mod one;\nmod two;\n#[cfg(test)]\nmod tests;\n",
    );
    write("up/one.rs", "use crate::low::L;\nuse super::two::T;\n");
    write("up/two.rs", "pub struct T;\nfn f() { super::one::g() }\n");
    write("up/tests.rs", "use crate::up::one;\n");
    let g = graphs(&dir);
    // The top level is fine; the folder is not.
    assert!(g[&Vec::new()]["up"].contains_key("low"));
    assert!(first_circle(&g[&Vec::new()]).is_none());
    let found = first_circle_anywhere(&g).expect("the circle one <-> two");
    assert!(found.contains("src/up"), "{found}");
    assert!(found.contains("one -> two (up/one.rs:2)"), "{found}");
    assert!(found.contains("two -> one (up/two.rs:2)"), "{found}");
    // Without the back import there is none.
    write("up/two.rs", "pub struct T;\n");
    assert!(first_circle_anywhere(&graphs(&dir)).is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
