//! The module paths a piece of code names (from `crate::`, `self::`, `super::`, with use-tree groups), resolved
//! from the crate root, and the names a module re-exports.

use crate::ModPath;
use crate::code::find_word;

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
pub(crate) fn reexports(code: &str, module: &[String]) -> Vec<(String, ModPath)> {
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
