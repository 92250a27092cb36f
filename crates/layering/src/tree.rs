//! A crate's module tree, read from its root file by following `mod x;` declarations as the compiler does.

use std::path::Path;

use crate::code::{code_of, find_word};
use crate::paths::reexports;
use crate::{Module, ReadError};

/// Reads the crate whose root file is `root` (its `lib.rs` or `main.rs`).
pub fn read_crate(root: &Path) -> Result<Module, ReadError> {
    read_module(root, true, &[])
}

pub(crate) fn read_text(path: &Path) -> Result<String, ReadError> {
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
