#!/usr/bin/env bash
# Builds the Kubernetes CSI external-provisioner sidecar (Go module github.com/kubernetes-csi/external-provisioner/v6,
# version below) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/external-provisioner/<version>/csi-provisioner
# The real dynamic provisioner of CSI volumes: it watches PersistentVolumeClaims of its driver's StorageClass
# against the test control plane, calls the driver's CreateVolume and makes the PersistentVolume (the hollow
# storage test and benchmark run it).
# Idempotent. Prints the binary's path on stdout.
set -euo pipefail
version=v6.4.0
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/external-provisioner/$version"
bin="$dir/csi-provisioner"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "build-external-provisioner: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
# the module's go.mod has replace directives, so `go install pkg@version` refuses it: build from its source
src=$(go mod download -json "github.com/kubernetes-csi/external-provisioner/v6@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[ -d "$src" ] || { echo "build-external-provisioner: no source for external-provisioner@$version" >&2; exit 1; }
# built in a scratch copy (the module cache is read-only) so an interrupted build never leaves a half-written binary
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/." "$tmp/"
chmod -R u+w "$tmp"
cd "$tmp"
echo "build-external-provisioner: go build ./cmd/csi-provisioner ($version)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o csi-provisioner ./cmd/csi-provisioner >&2
mv csi-provisioner "$bin"
echo "$bin"
