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

use std::collections::BTreeMap;
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

mod code;
mod graph;
mod paths;
mod tree;

pub use code::code_of;
pub use graph::{check_crate, edges};
pub use paths::paths_in;
pub use tree::read_crate;

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
