//! The module graph of a crate, read from its sources, and the cycles in it.
//!
//! Every module's children must depend on each other one way: if `pods::worker` names `pods::status`, nothing
//! under `pods::status` may name `pods::worker`. The check holds at every level of the tree (the crate root's
//! modules, `pods`'s, `pods::worker`'s, ...), so a layer keeps its order however deep a module sits.
//!
//! How it reads a crate:
//! * the tree follows `mod x;` declarations from the crate root (with their `#[path]`), not the directories,
//!   so a file is where the compiler puts it;
//! * code is read whole, without comments, string and character literals and items marked `#[cfg(test)]`
//!   (tests may reach across layers; code after a test module is still read);
//! * a path names a module when it starts at `crate::`, `self::` or `super::` (use trees with their groups,
//!   and paths in expressions and types); a name re-exported by a parent (`pub use`) counts as the module it
//!   comes from, so going through a parent's re-export does not hide an edge;
//! * an edge runs between two children of the deepest module both ends share: a child naming its parent's own
//!   items, or a parent naming its children, is no edge.
//!
//! [`check_crate`] returns every cycle with the places that make it, or nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// A module path from the crate root, e.g. `["pods", "worker"]` (the root is `[]`).
pub type ModPath = Vec<String>;

/// One module of the tree.
#[derive(Debug, Default)]
pub struct Module {
    /// The file holding the module's own code (none for inline modules, which are not followed).
    pub file: Option<PathBuf>,
    /// Child modules by name.
    pub children: BTreeMap<String, Module>,
    /// Names this module re-exports (`pub use a::b::C;` -> `C` -> the absolute path of `C`).
    pub reexports: BTreeMap<String, ModPath>,
}

/// Why a crate could not be read.
#[derive(Debug)]
pub struct ReadError {
    /// The file or directory.
    pub path: PathBuf,
    /// What went wrong.
    pub source: std::io::Error,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "reading {}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// One edge between two sibling modules, with one place that makes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The sibling that names the other.
    pub from: String,
    /// The sibling named.
    pub to: String,
    /// A file under `from` that names `to`.
    pub file: PathBuf,
    /// The path as written, resolved from the crate root.
    pub path: String,
}

/// A cycle among the children of one module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The parent module (`[]` for the crate root).
    pub parent: ModPath,
    /// The children in the cycle, in order; the first follows the last.
    pub members: Vec<String>,
    /// The edges among the members, one place each.
    pub edges: Vec<Edge>,
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parent = if self.parent.is_empty() {
            "crate".to_owned()
        } else {
            format!("crate::{}", self.parent.join("::"))
        };
        writeln!(
            f,
            "modules of {parent} name each other in a cycle: {}",
            self.members.join(", ")
        )?;
        for e in &self.edges {
            writeln!(
                f,
                "  {} -> {}: {} names {}",
                e.from,
                e.to,
                e.file.display(),
                e.path
            )?;
        }
        Ok(())
    }
}

/// Reads the crate whose root file is `root` (its `lib.rs` or `main.rs`).
pub fn read_crate(root: &Path) -> Result<Module, ReadError> {
    read_module(root, true, &[])
}

fn read_text(path: &Path) -> Result<String, ReadError> {
    std::fs::read_to_string(path).map_err(|source| ReadError {
        path: path.to_owned(),
        source,
    })
}

/// Reads the module in `file`; `owns_dir` is true for `lib.rs`, `main.rs` and `mod.rs`, whose children sit
/// beside them (other files' children sit in a directory named after the file).
fn read_module(file: &Path, owns_dir: bool, path: &[String]) -> Result<Module, ReadError> {
    let text = read_text(file)?;
    let code = code_of(&text);
    let dir = file.parent().unwrap_or(Path::new("."));
    let child_dir = if owns_dir {
        dir.to_owned()
    } else {
        dir.join(file.file_stem().unwrap_or_default())
    };
    let mut module = Module {
        file: Some(file.to_owned()),
        ..Module::default()
    };
    for name in mod_declarations(&code) {
        let (child_file, child_owns_dir) = match path_attribute(&text, &name) {
            // a `#[path]` is relative to the declaring file's directory, and its file's own children sit beside it
            Some(p) => (dir.join(p), true),
            None => {
                let flat = child_dir.join(format!("{name}.rs"));
                if flat.exists() {
                    (flat, false)
                } else {
                    (child_dir.join(&name).join("mod.rs"), true)
                }
            }
        };
        let mut child_path = path.to_vec();
        child_path.push(name.clone());
        let child = read_module(&child_file, child_owns_dir, &child_path)?;
        module.children.insert(name, child);
    }
    for (name, target) in reexports(&code, path) {
        module.reexports.insert(name, target);
    }
    Ok(module)
}

/// The names of the `mod x;` declarations in `code` (already without test items and comments); inline
/// modules (`mod x { ... }`) belong to the file that holds them and are not listed.
fn mod_declarations(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = find_word(code, "mod", i) {
        i = at + 3;
        let rest = code[i..].trim_start();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() && rest[name.len()..].trim_start().starts_with(';') {
            out.push(name);
        }
    }
    out
}

/// The `#[path = "..."]` given to `mod name;` in the raw `text`, if any: the attributes directly before the
/// declaration (and its visibility) are read.
fn path_attribute(text: &str, name: &str) -> Option<String> {
    let mut from = 0;
    while let Some(at) = find_word(text, "mod", from) {
        from = at + 3;
        let rest = text[from..].trim_start();
        if !(rest.starts_with(name) && rest[name.len()..].trim_start().starts_with(';')) {
            continue;
        }
        let mut head = strip_visibility(text[..at].trim_end()).trim_end();
        while head.ends_with(']') {
            let open = head.rfind("#[")?;
            let attr = &head[open..];
            if attr.trim_start_matches("#[").trim_start().starts_with("path") {
                let q = attr.find('"')?;
                let end = attr[q + 1..].find('"')?;
                return Some(attr[q + 1..q + 1 + end].to_owned());
            }
            head = head[..open].trim_end();
        }
        return None;
    }
    None
}

/// `head` without a trailing `pub`, `pub(crate)`, `pub(super)` or `pub(in path)`.
fn strip_visibility(head: &str) -> &str {
    let h = head.trim_end();
    if let Some(h2) = h.strip_suffix(')')
        && let Some(open) = h2.rfind('(')
        && h2[..open].trim_end().ends_with("pub")
    {
        let h3 = h2[..open].trim_end();
        return &h3[..h3.len() - 3];
    }
    h.strip_suffix("pub").unwrap_or(h)
}

/// The byte offset of `word` at or after `from`, standing alone (not part of a longer identifier).
fn find_word(code: &str, word: &str, from: usize) -> Option<usize> {
    let mut i = from;
    while let Some(rel) = code.get(i..)?.find(word) {
        let at = i + rel;
        let before = code[..at].chars().next_back();
        let after = code[at + word.len()..].chars().next();
        let is_ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !is_ident(before) && !is_ident(after) {
            return Some(at);
        }
        i = at + word.len();
    }
    None
}

/// `text` without comments, with string and character literals emptied, and without items marked
/// `#[cfg(test)]`.
pub fn code_of(text: &str) -> String {
    let stripped = strip_comments_and_literals(text);
    remove_test_items(&stripped)
}

fn strip_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // raw string r"..." or r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // a character literal ('x', '\n', '\u{..}') or a lifetime ('a)
            let close = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&j| chars[j] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(j) => {
                    out.push_str("' '");
                    i = j + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` without each item that follows a `#[cfg(test)]` attribute: up to its first `;` outside brackets,
/// or its first `{ ... }` block, whichever closes first.
fn remove_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let mut depth = 0i32;
        let mut end = item.len();
        for (i, c) in item.char_indices() {
            match c {
                '{' | '(' | '[' => depth += 1,
                '}' | ')' | ']' => {
                    depth -= 1;
                    if depth == 0 && c == '}' {
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

/// Every path in `code` that starts at `crate`, `self` or `super`, resolved from the crate root for code in
/// module `module`; use-tree groups give one path per leaf.
pub fn paths_in(code: &str, module: &[String]) -> Vec<ModPath> {
    let mut out = Vec::new();
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let boundary = i == 0 || {
            let p = chars[i - 1];
            !(p.is_alphanumeric() || p == '_' || p == ':' || p == '$')
        };
        if boundary
            && ["crate::", "self::", "super::"]
                .iter()
                .any(|p| starts_with_at(&chars, i, p))
        {
            let (trees, end) = parse_tree(&chars, i);
            for t in trees {
                if let Some(abs) = resolve(&t, module) {
                    out.push(abs);
                }
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn starts_with_at(chars: &[char], i: usize, s: &str) -> bool {
    s.chars().enumerate().all(|(k, c)| chars.get(i + k) == Some(&c))
}

fn skip_ws(chars: &[char], mut i: usize) -> usize {
    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
        i += 1;
    }
    i
}

/// Parses a path or use tree at `i`: the leaf paths (segments) and where it ended.
fn parse_tree(chars: &[char], mut i: usize) -> (Vec<Vec<String>>, usize) {
    let mut segs: Vec<String> = Vec::new();
    loop {
        i = skip_ws(chars, i);
        match chars.get(i) {
            Some('{') => {
                let mut leaves = Vec::new();
                i += 1;
                loop {
                    i = skip_ws(chars, i);
                    match chars.get(i) {
                        Some('}') => {
                            i += 1;
                            break;
                        }
                        Some(',') => i += 1,
                        None => break,
                        _ => {
                            let (sub, end) = parse_tree(chars, i);
                            for s in sub {
                                let mut full = segs.clone();
                                if s.first().is_some_and(|x| x == "self") {
                                    full.extend(s.into_iter().skip(1));
                                } else {
                                    full.extend(s);
                                }
                                leaves.push(full);
                            }
                            if end == i {
                                i += 1;
                            } else {
                                i = end;
                            }
                        }
                    }
                }
                return (leaves, i);
            }
            Some(c) if c.is_alphabetic() || *c == '_' => {
                let start = i;
                while chars.get(i).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                    i += 1;
                }
                segs.push(chars[start..i].iter().collect());
                let j = skip_ws(chars, i);
                if starts_with_at(chars, j, "::") {
                    i = j + 2;
                    continue;
                }
                return (vec![segs], i);
            }
            _ => return (vec![segs], i),
        }
    }
}

/// `segs` (starting with `crate`, `self` or `super`) from the crate root, for code in `module`.
fn resolve(segs: &[String], module: &[String]) -> Option<ModPath> {
    let mut base: Vec<String> = module.to_vec();
    let mut rest = segs;
    match rest.first().map(String::as_str) {
        Some("crate") => {
            base.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    base.extend(rest.iter().cloned());
    Some(base)
}

/// The names `code` (of module `module`) re-exports with `pub use` (any visibility but private), each with
/// the absolute path it stands for (a path not from `crate`, `self` or `super` is read from `module`).
fn reexports(code: &str, module: &[String]) -> Vec<(String, ModPath)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find_word(code, "use", from) {
        from = at + 3;
        let before = code[..at].trim_end();
        let public = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        if !public {
            continue;
        }
        let end = code[at..].find(';').map_or(code.len(), |e| at + e);
        let tree = &code[at + 3..end];
        let chars: Vec<char> = tree.chars().collect();
        let start = skip_ws(&chars, 0);
        let (leaves, _) = parse_tree(&chars, start);
        for leaf in leaves {
            // `a::b::C as D` keeps D; the parser stops at `as`, so the alias is not seen: the last segment is
            // the name, which is right for plain re-exports
            // `use child::X` names a path from this module (or an external crate, which no module matches)
            let abs = resolve(&leaf, module).or_else(|| {
                let mut p = module.to_vec();
                p.extend(leaf.iter().cloned());
                Some(p)
            });
            if let (Some(name), Some(abs)) = (leaf.last().cloned(), abs)
                && name != "self"
                && name != "*"
            {
                out.push((name, abs));
            }
        }
    }
    out
}

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

/// The root files of the crates under `workspace` (`crates/*/src/{lib,main}.rs`, `tests/src/lib.rs`).
pub fn workspace_roots(workspace: &Path) -> Vec<PathBuf> {
    let mut roots = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(workspace.join("crates"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    dirs.push(workspace.join("tests"));
    dirs.sort();
    for d in dirs {
        for root in ["src/lib.rs", "src/main.rs"] {
            let f = d.join(root);
            if f.exists() {
                roots.push(f);
            }
        }
    }
    roots
}

#[cfg(test)]
mod tests;
