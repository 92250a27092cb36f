#!/usr/bin/env bash
# Builds KWOK (Go module sigs.k8s.io/kwok, cmd/kwok, version below) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/kwok/<version>/kwok
# with, beside it, stages.yaml: the stages kwokctl gives a cluster by default (node-initialize,
# node-heartbeat-with-lease, and the fast pod stages), taken from the same module; the bare kwok binary has none.
# For the side-by-side density benchmark (built on the benchmark's first run, not in CI setup).
# Idempotent. Prints the binary's path on stdout.
set -euo pipefail
version=v0.8.0
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/kwok/$version"
if [ -x "$dir/kwok" ] && [ -s "$dir/stages.yaml" ]; then echo "$dir/kwok"; exit 0; fi
command -v go >/dev/null || { echo "build-kwok: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
echo "build-kwok: go install sigs.k8s.io/kwok/cmd/kwok@$version" >&2
GOBIN="$dir" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$version" >&2
src="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$version/kustomize/stage"
{
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    cat "$src/$f"
  done
} > "$dir/stages.yaml.tmp"
mv "$dir/stages.yaml.tmp" "$dir/stages.yaml"
echo "$dir/kwok"
