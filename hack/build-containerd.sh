#!/usr/bin/env bash
# Builds containerd 2.x (Go module github.com/containerd/containerd/v2: cmd/containerd and
# cmd/containerd-shim-runc-v2, build tag no_btrfs, version below) from the Go module proxy into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/containerd/<version>/
# The real-mode tests run node-agent on it beside Debian's containerd 1.6 (NA_CRI_CONTAINERD=2 for
# tests/containerd/setup.sh). Idempotent: does nothing when both binaries are there. Prints the directory.
set -euo pipefail
version=v2.2.9
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/containerd/$version"
if [ -x "$dir/containerd" ] && [ -x "$dir/containerd-shim-runc-v2" ]; then echo "$dir"; exit 0; fi
command -v go >/dev/null || { echo "build-containerd: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
echo "build-containerd: go install github.com/containerd/containerd/v2/cmd/{containerd,containerd-shim-runc-v2}@$version" >&2
# built into a scratch directory first so an interrupted build never leaves a half-written binary in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -tags no_btrfs -ldflags "-s -w" \
  "github.com/containerd/containerd/v2/cmd/containerd@$version" \
  "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$version" >&2
mv "$tmp/containerd" "$tmp/containerd-shim-runc-v2" "$dir/"
echo "$dir"
