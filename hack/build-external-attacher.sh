#!/usr/bin/env bash
# Builds the Kubernetes CSI external-attacher sidecar (Go module github.com/kubernetes-csi/external-attacher/v4,
# version below) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/external-attacher/<version>/csi-attacher
# The real controller side of CSI attach: it watches VolumeAttachments against the test control plane and calls
# the driver's ControllerPublishVolume (the real-node CSI tests run it; hack/setup.sh --binaries builds it).
# Idempotent. Prints the binary's path on stdout.
set -euo pipefail
version=v4.13.0
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/external-attacher/$version"
bin="$dir/csi-attacher"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "build-external-attacher: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
# the module's go.mod has replace directives, so `go install pkg@version` refuses it: build from its source
src=$(go mod download -json "github.com/kubernetes-csi/external-attacher/v4@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p')
[ -d "$src" ] || { echo "build-external-attacher: no source for external-attacher@$version" >&2; exit 1; }
# built in a scratch copy (the module cache is read-only) so an interrupted build never leaves a half-written binary
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/." "$tmp/"
chmod -R u+w "$tmp"
cd "$tmp"
echo "build-external-attacher: go build ./cmd/csi-attacher ($version)" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o csi-attacher ./cmd/csi-attacher >&2
mv csi-attacher "$bin"
echo "$bin"
