//! The `testenv` program met with what it cannot act on: each refusal exits non-zero and names what it looked
//! for. (Its `up` is exercised by the demo and the conformance subset, which start their control plane with it.)

use std::process::Command;

fn testenv(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_testenv"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .output()
        .expect("the testenv program runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_directory_without_a_control_plane_is_named() {
    let dir = std::env::temp_dir().join(format!("testenv-cli-none-{}", std::process::id()));
    let dir = dir.to_str().expect("utf-8 temp dir");
    for args in [
        vec!["down", "--dir", dir],
        vec!["node-kubeconfig", "--dir", dir, "--node", "n1"],
    ] {
        let (ok, stderr) = testenv(&args);
        assert!(!ok, "testenv {args:?} succeeded");
        assert!(
            stderr.contains("no control plane there")
                || stderr.contains(&format!("{dir}/control-plane.json")),
            "testenv {args:?}: {stderr}"
        );
        assert!(
            stderr.contains(dir),
            "testenv {args:?} does not name {dir}: {stderr}"
        );
    }
}

#[test]
fn an_unknown_command_is_named() {
    let (ok, stderr) = testenv(&["start"]);
    assert!(!ok);
    assert!(stderr.contains("'start'"), "{stderr}");
}
