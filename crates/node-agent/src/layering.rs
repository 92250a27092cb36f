//! The crate's module graph stays one-way: a test reads the sources, finds which top-level module names which
//! (`crate::<module>` in code, comments and test code left out) and fails on any cycle, printing the edges.
//! The intended order, lowest first: shared pieces (`api`, `backoff`, `chan`, `config`, `watch`, ...), then
//! `events`, `runtime_health`, `stats`; `node`; `pods`; `gc`, `eviction`, `pod_resources`; `agent`; `server`.
//! A lower module reaches a higher one only through what the agent wires in (channels, trait objects).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The code of one source file without comments and without its `#[cfg(test)]` items at the end.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // test modules sit at the end of a file here; what follows is test code
            break;
        }
        if trimmed.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "tests" {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") && !name.ends_with("_tests.rs") {
            out.push(path);
        }
    }
}

/// Top-level modules and the files of each.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut mods = BTreeMap::new();
    for entry in std::fs::read_dir(src)
        .expect("the crate's src directory")
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            mods.insert(name, files);
        } else if let Some(stem) = name.strip_suffix(".rs")
            // `testing` is test support (built for tests only)
            && !matches!(stem, "lib" | "testing")
            && !stem.ends_with("_tests")
        {
            mods.insert(stem.to_owned(), vec![path]);
        }
    }
    mods
}

/// The top-level modules `code` names: `crate::m` and `crate::{m, ...}`.
fn named(code: &str, known: &BTreeMap<String, Vec<PathBuf>>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                let m = ident(part.trim());
                if known.contains_key(&m) {
                    out.insert(m);
                }
            }
        } else {
            let m = ident(rest);
            if known.contains_key(&m) {
                out.insert(m);
            }
        }
    }
    out
}

/// Edges `from -> to` between top-level modules.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let mut edges = BTreeMap::new();
    for (name, files) in &mods {
        let mut to = BTreeSet::new();
        for file in files {
            let text = std::fs::read_to_string(file).expect("readable source");
            to.extend(named(&code_of(&text), &mods));
        }
        to.remove(name);
        edges.insert(name.clone(), to);
    }
    edges
}

/// A cycle through the graph, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|p| p == n) {
            let mut c = path[at..].to_vec();
            c.push(n.to_owned());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_owned());
        for next in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in edges.keys() {
        if let Some(c) = visit(n, edges, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn top_level_modules_depend_one_way() {
    let edges = graph(&src());
    for (from, to) in &edges {
        if !to.is_empty() {
            println!("{from} -> {}", to.iter().cloned().collect::<Vec<_>>().join(", "));
        }
    }
    assert!(edges.len() > 10, "the crate's modules were found: {edges:?}");
    assert!(
        edges["agent"].contains("pods"),
        "the agent runs the pod lifecycle"
    );
    if let Some(c) = cycle(&edges) {
        panic!("modules name each other in a cycle: {}", c.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec![]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
    .collect();
    assert_eq!(
        cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let mut acyclic = edges.clone();
    acyclic.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&acyclic), None);
}

/// The pod worker's state, the sync and the worker loop call one way: the loop drives the sync, both use the
/// state, neither the state nor the sync names the loop.
#[test]
fn the_pod_worker_loop_sync_and_state_are_one_way() {
    let pods = src().join("pods");
    let code = |f: &str| code_of(&std::fs::read_to_string(pods.join(f)).expect("readable source"));
    let (state, sync, worker) = (code("worker_state.rs"), code("sync.rs"), code("worker.rs"));
    assert!(!state.contains("super::worker::") && !state.contains("super::sync"));
    assert!(!sync.contains("super::worker::") && !sync.contains("super::worker;"));
    assert!(worker.contains("super::worker_state::"));
}
