#!/usr/bin/env bash
# Installs everything node-agent needs on a fresh machine of this project's kind (Debian with Go and rustup):
# Debian packages (protoc for the CRI protos; containerd, runc, CNI plugins and busybox for real-mode tests),
# rustfmt/clippy, the pinned Kubernetes binaries, the CNCF distribution registry the real-mode tests pull images
# from, containerd 2.x (the second runtime of the real-mode tests), the pod-resources test client, the
# local-path provisioner of the persistent-volume tests and the upstream
# node conformance suite with the images it uses (hack/conformance.sh build), built once from the Go module proxy,
# then cached; as root also the Debian guest of the VM tests (hack/build-vm-image.sh).
# Idempotent and quick when everything is already there.
#
#   hack/setup.sh               everything
#   hack/setup.sh --toolchain   only what building the Rust workspace needs (Debian packages, rustfmt, clippy), so a
#                               caller can start that build while the Go-built binaries are made
#   hack/setup.sh --binaries    only the Go-built binaries (Kubernetes, helm, registry, containerd 2.x, ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
phase=${1:-all}
case "$phase" in
  all|--toolchain|--binaries) ;;
  *) echo "setup: unknown argument $phase (use --toolchain or --binaries, or nothing for both)" >&2; exit 2 ;;
esac

toolchain() {
  packages=(protobuf-compiler containerd runc containernetworking-plugins busybox-static iproute2 gcc libc6-dev python3 util-linux curl openssl)
  missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo_cmd apt-get update -qq
    $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
  fi

  command -v cargo >/dev/null || { echo "setup: cargo not found (install Rust with rustup)" >&2; exit 1; }
  command -v go >/dev/null || { echo "setup: go not found (Go >= 1.25 is needed to build Kubernetes)" >&2; exit 1; }
  if command -v rustup >/dev/null; then
    rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt >&2
    rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy >&2
  fi
}

binaries() {
  # the VM tests' guest (mmdebstrap needs root; without root those tests fail saying so), made from Debian's
  # packages while the Go builds below use the CPU; the only step here that runs apt
  local vm="" script
  if [ "$(id -u)" = 0 ]; then bash "$root/hack/build-vm-image.sh" >/dev/null & vm=$!; fi
  # each step says how long it took: seconds when cached, minutes on a fresh machine
  for script in build-kubernetes.sh build-helm.sh build-registry.sh build-containerd.sh \
    build-podresources-client.sh build-sample-device-plugin.sh build-csi-mock-driver.sh build-dra-test-driver.sh \
    build-local-path-provisioner.sh build-external-attacher.sh build-external-provisioner.sh "conformance.sh build"; do
    step $script
  done
  if [ -n "$vm" ]; then wait "$vm" || { echo "setup: the VM guest image could not be built" >&2; return 1; }; fi
  echo "setup: ready (Kubernetes $(cat "$root/KUBERNETES_VERSION") in $(bash "$root/hack/build-kubernetes.sh"))" >&2
}

step() {
  local t0=$SECONDS
  bash "$root/hack/$1" "${@:2}" >/dev/null
  echo "setup: $* done in $((SECONDS - t0)) s" >&2
}

[ "$phase" = --binaries ] || toolchain
[ "$phase" = --toolchain ] || binaries
