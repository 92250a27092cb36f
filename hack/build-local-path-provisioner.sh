#!/usr/bin/env bash
# Builds Rancher's local-path-provisioner (Go module github.com/rancher/local-path-provisioner, version below)
# into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/local-path-provisioner/<version>/local-path-provisioner
# The real dynamic provisioner the persistent-volume tests run against the test control plane (built on those
# tests; hack/setup.sh --binaries builds it). Idempotent. Prints the binary's path on stdout.
set -euo pipefail
version=v0.0.30
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/local-path-provisioner/$version"
bin="$dir/local-path-provisioner"
if [ -x "$bin" ]; then echo "$bin"; exit 0; fi
command -v go >/dev/null || { echo "build-local-path-provisioner: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
echo "build-local-path-provisioner: go install github.com/rancher/local-path-provisioner@$version" >&2
GOBIN="$dir" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
  "github.com/rancher/local-path-provisioner@$version" >&2
echo "$bin"
