//! Every crate of the workspace: no cycle between the children of any module.

use std::path::Path;

#[test]
fn every_module_of_every_crate_depends_one_way() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let roots = layering::workspace_roots(&workspace);
    assert!(
        roots.len() >= 8,
        "the workspace's crate roots were found: {roots:?}"
    );
    let mut failures = Vec::new();
    let mut levels = 0;
    for root in &roots {
        let tree = layering::read_crate(root).unwrap_or_else(|e| panic!("{e}"));
        let edges = layering::edges(&tree).unwrap_or_else(|e| panic!("{e}"));
        levels += edges.len();
        for cycle in layering::check_crate(root).unwrap_or_else(|e| panic!("{e}")) {
            failures.push(format!("{}: {cycle}", root.display()));
        }
    }
    // the reader sees the tree: node-agent alone has edges at its root, in pods and below
    assert!(levels > 10, "edges were found at only {levels} module levels");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
