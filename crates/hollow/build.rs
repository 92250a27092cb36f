//! Lays out the fleet binary's code: the functions a fleet runs (start, idle nodes, then pods; listed in
//! `code-order.txt`, written by `hack/code-order.sh` from a profiled run) are linked first and side by side, so
//! the pages of code a running fleet maps are those it runs and not the rest of the binary around them (the
//! kernel maps a binary's pages in runs around each one touched, so code run here and there maps most of it).
//! Functions the list names that the build does not have are skipped; functions it does not name keep the
//! linker's order. Only the release profile on x86_64-unknown-linux-gnu, where rustc links with its own LLD;
//! `HOLLOW_CODE_ORDER=off` links without the list. What it saves: docs/density.md, "The code order".

use std::path::PathBuf;

fn main() {
    let list = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"))
        .join("code-order.txt");
    println!("cargo::rerun-if-changed={}", list.display());
    println!("cargo::rerun-if-env-changed=HOLLOW_CODE_ORDER");
    let release = std::env::var("PROFILE").is_ok_and(|p| p == "release");
    let target = std::env::var("TARGET").unwrap_or_default();
    let off = std::env::var("HOLLOW_CODE_ORDER").is_ok_and(|v| v == "off");
    if !release || target != "x86_64-unknown-linux-gnu" || off || !list.exists() {
        return;
    }
    println!(
        "cargo::rustc-link-arg-bin=hollow=-Wl,--symbol-ordering-file={}",
        list.display()
    );
    println!("cargo::rustc-link-arg-bin=hollow=-Wl,--no-warn-symbol-ordering");
}
