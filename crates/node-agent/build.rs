//! Compiles the APIs the agent serves from the project's own `.proto` files (`proto/` at the workspace root):
//! the pod-resources API v1, and the APIs it calls: the kubelet plugin registration API v1, the CSI node side and the DRA driver API (v1, v1beta1); the device plugin API v1beta1 (served and called).
//! The descriptor set is built in Rust (`protox`), so no `protoc` is needed here.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = [
        root.join("podresources/v1/api.proto"),
        root.join("pluginregistration/v1/api.proto"),
        root.join("csi/v1/csi.proto"),
        root.join("deviceplugin/v1beta1/api.proto"),
        root.join("dra/v1/api.proto"),
        root.join("dra/v1beta1/api.proto"),
    ];
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let descriptors = protox::compile(&files, [&root])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // the client connects over a unix socket of the caller's making: no `connect(url)` helper
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
