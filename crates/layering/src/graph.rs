//! The edges between sibling modules of a crate's tree, and the cycles among them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::code::code_of;
use crate::paths::paths_in;
use crate::tree::{read_crate, read_text};
use crate::{Cycle, Edge, ModPath, Module, ReadError};

/// The module at `path` of `root`, if there is one.
fn find<'a>(root: &'a Module, path: &[String]) -> Option<&'a Module> {
    let mut m = root;
    for seg in path {
        m = m.children.get(seg)?;
    }
    Some(m)
}

/// Follows re-exports in `path` so that it names the module an item comes from: the longest prefix that is a
/// module, then, if the next segment is a name that module re-exports, the re-export's target (again).
fn canonical(root: &Module, path: &[String]) -> ModPath {
    let mut p = path.to_vec();
    for _ in 0..8 {
        let mut depth = 0;
        while depth < p.len() && find(root, &p[..=depth]).is_some() {
            depth += 1;
        }
        let Some(m) = find(root, &p[..depth]) else {
            return p;
        };
        let Some(next) = p.get(depth) else {
            return p;
        };
        match m.reexports.get(next) {
            Some(target) if target.as_slice() != &p[..=depth] => {
                let mut q = target.clone();
                q.extend(p[depth + 1..].iter().cloned());
                p = q;
            }
            _ => return p,
        }
    }
    p
}

/// Every edge between siblings in the crate `root`, grouped by parent module.
pub fn edges(root: &Module) -> Result<BTreeMap<ModPath, BTreeSet<Edge>>, ReadError> {
    let mut out: BTreeMap<ModPath, BTreeSet<Edge>> = BTreeMap::new();
    let mut stack: Vec<(ModPath, &Module)> = vec![(Vec::new(), root)];
    while let Some((path, m)) = stack.pop() {
        for (name, child) in &m.children {
            let mut p = path.clone();
            p.push(name.clone());
            stack.push((p, child));
        }
        let Some(file) = &m.file else { continue };
        let code = code_of(&read_text(file)?);
        for named in paths_in(&code, &path) {
            let named = canonical(root, &named);
            let common = path.iter().zip(&named).take_while(|(a, b)| a == b).count();
            if common >= path.len() || common >= named.len() {
                continue;
            }
            let parent = &path[..common];
            let (from, to) = (&path[common], &named[common]);
            let is_child = find(root, parent).is_some_and(|p| p.children.contains_key(to));
            if !is_child {
                continue;
            }
            out.entry(parent.to_vec()).or_default().insert(Edge {
                from: from.clone(),
                to: to.clone(),
                file: file.clone(),
                path: format!("crate::{}", named.join("::")),
            });
        }
    }
    Ok(out)
}

/// The cycles of the crate whose root file is `root`.
pub fn check_crate(root: &Path) -> Result<Vec<Cycle>, ReadError> {
    let tree = read_crate(root)?;
    let mut cycles = Vec::new();
    for (parent, es) in edges(&tree)? {
        let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for e in &es {
            graph.entry(&e.from).or_default().insert(&e.to);
        }
        for scc in strongly_connected(&graph) {
            if scc.len() < 2 {
                continue;
            }
            let members: BTreeSet<&str> = scc.iter().copied().collect();
            let mut seen = BTreeSet::new();
            let edges = es
                .iter()
                .filter(|e| members.contains(e.from.as_str()) && members.contains(e.to.as_str()))
                .filter(|e| seen.insert((e.from.clone(), e.to.clone())))
                .cloned()
                .collect();
            cycles.push(Cycle {
                parent: parent.clone(),
                members: scc.iter().map(|s| (*s).to_owned()).collect(),
                edges,
            });
        }
    }
    Ok(cycles)
}

/// Tarjan's strongly connected components of `graph`, each in a stable order.
fn strongly_connected<'a>(graph: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, graph: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in graph.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(w, graph, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                scc.push(w);
                if w == v {
                    break;
                }
            }
            scc.sort_unstable();
            s.out.push(scc);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in graph.keys() {
        if !s.index.contains_key(v) {
            visit(v, graph, &mut s);
        }
    }
    s.out
}
