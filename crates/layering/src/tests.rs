//! The reader and the cycle finder on small crates written to a temporary directory, and on a copy of
//! node-agent with a cycle planted in it.

use std::path::{Path, PathBuf};

use super::*;

/// Writes `files` (path relative to `src/`, text) under a new temporary directory; returns it and the root.
fn crate_of(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (path, text) in files {
        let p = dir.path().join("src").join(path);
        std::fs::create_dir_all(p.parent().expect("a parent")).expect("directories");
        std::fs::write(&p, text).expect("a source file");
    }
    let root = dir.path().join("src/lib.rs");
    (dir, root)
}

fn members(cycles: &[Cycle]) -> Vec<(String, Vec<String>)> {
    cycles
        .iter()
        .map(|c| (c.parent.join("::"), c.members.clone()))
        .collect()
}

#[test]
fn a_cycle_between_top_level_modules_is_found_with_its_places() {
    let (_dir, root) = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("a.rs", "use crate::b::B;\n"),
        ("b.rs", "pub struct B;\nfn f() { crate::c::g() }\n"),
        ("c.rs", "pub fn g() {}\nuse super::a;\n"),
    ]);
    let cycles = check_crate(&root).expect("readable");
    assert_eq!(
        members(&cycles),
        vec![(String::new(), vec!["a".into(), "b".into(), "c".into()])]
    );
    let text = cycles[0].to_string();
    assert!(text.contains("a -> b") && text.contains("crate::b::B"), "{text}");
    assert!(text.contains("c -> a") && text.contains("c.rs"), "{text}");
}

#[test]
fn a_cycle_in_a_sub_module_is_found_at_its_level() {
    let (_dir, root) = crate_of(&[
        ("lib.rs", "pub mod pods;\n"),
        ("pods/mod.rs", "mod worker;\nmod status;\npub struct Config;\n"),
        ("pods/worker/mod.rs", "mod sync;\nmod state;\n"),
        // siblings inside pods::worker, one through super::, one through a use group
        (
            "pods/worker/sync.rs",
            "use super::state::State;\nuse crate::pods::Config;\n",
        ),
        (
            "pods/worker/state.rs",
            "pub struct State;\nuse crate::pods::{worker::{sync}, status};\n",
        ),
        ("pods/status.rs", "use crate::pods::Config;\n"),
    ]);
    let cycles = check_crate(&root).expect("readable");
    assert_eq!(
        members(&cycles),
        vec![("pods::worker".into(), vec!["state".into(), "sync".into()])],
        "naming the parent's own items (Config) is no edge; state -> status is one way"
    );
}

#[test]
fn a_re_export_does_not_hide_an_edge() {
    let (_dir, root) = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\npub use a::A;\n"),
        ("a.rs", "pub struct A;\nuse crate::b::B;\n"),
        // names a's A through the root's re-export
        ("b.rs", "pub struct B;\nfn f(_: crate::A) {}\n"),
    ]);
    let cycles = check_crate(&root).expect("readable");
    assert_eq!(
        members(&cycles),
        vec![(String::new(), vec!["a".into(), "b".into()])]
    );
}

#[test]
fn test_items_comments_and_strings_are_not_read_but_code_after_them_is() {
    let (_dir, root) = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b::B;\n"),
        (
            "b.rs",
            "pub struct B;\n\
             // crate::a::nothing\n\
             /* crate::a::nothing */\n\
             const S: &str = \"crate::a::nothing\";\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::*;\n    fn t() { let _ = '{'; }\n}\n",
        ),
    ]);
    assert_eq!(check_crate(&root).expect("readable"), vec![]);
    // the same file with code after its test module: that code is read
    let (_dir2, root2) = crate_of(&[
        ("lib.rs", "mod a;\nmod b;\n"),
        ("a.rs", "pub fn f() {}\nuse crate::b::B;\n"),
        (
            "b.rs",
            "pub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::*;\n}\nfn g() { crate::a::f() }\n",
        ),
    ]);
    assert_eq!(
        members(&check_crate(&root2).expect("readable")),
        vec![(String::new(), vec!["a".into(), "b".into()])]
    );
}

#[test]
fn path_attributes_and_test_only_modules_are_followed_as_the_compiler_does() {
    let (_dir, root) = crate_of(&[
        ("lib.rs", "mod m;\n#[cfg(test)]\nmod testing;\n"),
        ("m.rs", "#[path = \"m_extra.rs\"]\nmod extra;\nmod inner;\n"),
        ("m_extra.rs", "use crate::m::inner::I;\n"),
        ("m/inner.rs", "pub struct I;\nuse super::extra;\n"),
        // never read: only built for tests
        ("testing.rs", "this is not rust"),
    ]);
    let tree = read_crate(&root).expect("readable");
    assert!(tree.children.contains_key("m") && !tree.children.contains_key("testing"));
    let m = &tree.children["m"];
    assert_eq!(m.children.keys().collect::<Vec<_>>(), ["extra", "inner"]);
    assert!(
        m.children["extra"]
            .file
            .as_ref()
            .is_some_and(|f| f.ends_with("m_extra.rs"))
    );
    assert_eq!(
        members(&check_crate(&root).expect("readable")),
        vec![("m".into(), vec!["extra".into(), "inner".into()])]
    );
}

#[test]
fn a_missing_module_file_is_an_error_naming_it() {
    let (_dir, root) = crate_of(&[("lib.rs", "mod gone;\n")]);
    let e = check_crate(&root).expect_err("no file for `gone`");
    assert!(e.to_string().contains("gone"), "{e}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a directory");
    for entry in std::fs::read_dir(from).expect("a readable directory").flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("a copied file");
        }
    }
}

/// node-agent as it is has no cycle; with one reference planted upwards — the pod model naming the pod
/// manager, then a sub-module naming its sibling back — the check fails and names the cycle.
#[test]
fn a_cycle_planted_in_the_pod_side_of_node_agent_is_found() {
    let real = Path::new(env!("CARGO_MANIFEST_DIR")).join("../node-agent/src");
    let dir = tempfile::tempdir().expect("a temporary directory");
    copy_dir(&real, dir.path());
    let root = dir.path().join("lib.rs");
    assert_eq!(
        check_crate(&root).expect("readable"),
        vec![],
        "node-agent has no cycle"
    );

    let tree = read_crate(&root).expect("readable");
    let pods = &tree.children["pods"];
    assert!(pods.children.len() >= 5, "the pod side has its layers");
    // plant: the lowest layer of pods names the highest one
    let (low, high) = ("model", "manager");
    assert!(pods.children.contains_key(low) && pods.children.contains_key(high));
    let low_file = pods.children[low].file.clone().expect("a file");
    let mut text = std::fs::read_to_string(&low_file).expect("readable");
    text.push_str(&format!(
        "\nfn planted() {{ let _ = crate::pods::{high}::planted; }}\n"
    ));
    std::fs::write(&low_file, text).expect("writable");
    let cycles = check_crate(&root).expect("readable");
    let found = members(&cycles);
    assert!(
        found
            .iter()
            .any(|(p, m)| p == "pods" && m.contains(&low.to_owned()) && m.contains(&high.to_owned())),
        "{found:?}"
    );

    // and one level down: inside the model, the first child names a sibling that names it
    std::fs::write(
        &low_file,
        std::fs::read_to_string(pods.children[low].file.as_ref().expect("a file"))
            .expect("readable")
            .replace(
                &format!("\nfn planted() {{ let _ = crate::pods::{high}::planted; }}\n"),
                "",
            ),
    )
    .expect("writable");
    let model = &pods.children[low];
    let names: Vec<&String> = model.children.keys().collect();
    assert!(names.len() >= 2, "the model has sub-modules: {names:?}");
    let edges = edges(&tree).expect("readable");
    let inner = edges
        .get(&vec!["pods".to_owned(), low.to_owned()])
        .cloned()
        .unwrap_or_default();
    let one = inner.iter().next().expect("an edge inside the model");
    let back_file = model.children[&one.to].file.clone().expect("a file");
    let mut back = std::fs::read_to_string(&back_file).expect("readable");
    back.push_str(&format!(
        "\nfn planted() {{ let _ = crate::pods::{low}::{}::planted; }}\n",
        one.from
    ));
    std::fs::write(&back_file, back).expect("writable");
    let found = members(&check_crate(&root).expect("readable"));
    assert!(
        found
            .iter()
            .any(|(p, m)| p == &format!("pods::{low}") && m.contains(&one.from) && m.contains(&one.to)),
        "{found:?}"
    );
}
