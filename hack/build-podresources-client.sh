#!/usr/bin/env bash
# Builds tests/podresources-client (a pod-resources API consumer on the client Kubernetes publishes in the Go
# module k8s.io/kubelet; its dependencies come from the Go module proxy) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/podresources-client/<hash of its sources>/podresources-client
# The real-node tests run it against node-agent's pod-resources socket (tests/tests/real_node/pod_resources.rs).
# Idempotent: does nothing when the binary for these sources is already there. Prints the binary's path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src="$root/tests/podresources-client"
hash=$(cat "$src/main.go" "$src/go.mod" "$src/go.sum" | sha256sum | cut -c1-16)
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/podresources-client/$hash"
if [ -x "$dir/podresources-client" ]; then echo "$dir/podresources-client"; exit 0; fi
command -v go >/dev/null || { echo "build-podresources-client: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
echo "build-podresources-client: go build in $src" >&2
# built in a scratch directory first so an interrupted build never leaves a half-written binary in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$src" && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$tmp/podresources-client" .) >&2
mv "$tmp/podresources-client" "$dir/podresources-client"
echo "$dir/podresources-client"
