//! The daemon's modules form layers: no top-level module of
//! `backend/src` reaches, through its code, a module that reaches back to
//! it. A cycle means two modules that can only be understood together
//! (the layers are listed in `backend/src/lib.rs`); this test names the
//! first one it finds.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

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

/// The top-level modules each top-level module names in its code (not in
/// comments, not in its unit tests), with where.
fn imports(src: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        let module = first.trim_end_matches(".rs").to_string();
        // The crate root and the binary see everything.
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (n, line) in code.lines().enumerate() {
            if line.trim_start().starts_with("//") {
                continue;
            }
            for (i, _) in line.match_indices("crate::") {
                let to: String = line[i + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !to.is_empty() && to != module {
                    graph
                        .entry(module.clone())
                        .or_default()
                        .entry(to)
                        .or_insert_with(|| format!("{}:{}", rel.display(), n + 1));
                }
            }
        }
    }
    graph
}

/// A cycle through `at`, as the path from `at` back to it, if any.
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

#[test]
fn top_level_modules_import_each_other_in_one_direction_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../backend/src");
    let graph = imports(&src);
    // The graph is not empty: the parse found the daemon's layers.
    assert!(graph.get("engine").is_some_and(|m| m.contains_key("vm")));
    assert!(graph
        .get("ctrl")
        .is_some_and(|m| m.contains_key("resources")));
    let mut done = BTreeSet::new();
    for module in graph.keys() {
        if let Some(c) = cycle_from(&graph, module, &mut Vec::new(), &mut done) {
            let steps: Vec<String> = c
                .windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
                .collect();
            panic!("import cycle:\n  {}", steps.join("\n  "));
        }
    }
}
