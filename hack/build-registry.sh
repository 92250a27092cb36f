#!/usr/bin/env bash
# Builds the CNCF distribution registry (Go module github.com/distribution/distribution/v3, cmd/registry, version
# below) from the Go module proxy into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/registry/<version>/registry
# The real-mode tests serve images to containerd from it on 127.0.0.1 (tests/containerd/registry.sh).
# Idempotent: does nothing when the binary is already there. Prints the binary's path on stdout.
set -euo pipefail
version=v3.1.2
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/registry/$version"
if [ -x "$dir/registry" ]; then echo "$dir/registry"; exit 0; fi
command -v go >/dev/null || { echo "build-registry: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
echo "build-registry: go install github.com/distribution/distribution/v3/cmd/registry@$version" >&2
# the binary goes to a scratch directory first so an interrupted build never leaves a half-written one in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" \
  "github.com/distribution/distribution/v3/cmd/registry@$version" >&2
mv "$tmp/registry" "$dir/registry"
echo "$dir/registry"
