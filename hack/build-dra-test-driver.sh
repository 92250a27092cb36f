#!/usr/bin/env bash
# Builds the Kubernetes e2e suite's DRA test driver (test/e2e/dra/test-driver of the pinned k8s.io/kubernetes
# module: a DRA driver whose kubelet plugin registers through plugins_registry, publishes the node's
# ResourceSlice and writes CDI specs) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/dra-test-driver/<hash of version>/dra-test-driver
# The go.mod is written here as hack/build-kubernetes.sh writes its own: k8s.io/kubernetes at KUBERNETES_VERSION,
# every staging module from its published release. The real-node DRA test runs the binary.
# Idempotent: does nothing when the binary for this version is already there. Prints the binary's path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(tr -d '[:space:]' < "$root/KUBERNETES_VERSION")
hash=$(echo "dra-test-driver $version" | sha256sum | cut -c1-16)
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/dra-test-driver/$hash"
if [ -x "$dir/dra-test-driver" ]; then echo "$dir/dra-test-driver"; exit 0; fi
command -v go >/dev/null || { echo "build-dra-test-driver: go is not installed" >&2; exit 1; }
minor=${version#v1.}; minor=${minor%%.*}
patch=${version##*.}
staging_version="v0.$minor.$patch"
mkdir -p "$dir"
# built in a scratch directory first so an interrupted build never leaves a half-written binary in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$gomod" ] || { echo "build-dra-test-driver: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
{
  echo "module nodeagent.local/dra-test-driver"
  echo
  grep -m1 '^go ' "$gomod"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
} > go.mod
# the driver's main package lives in the dependency: name it under a build tag so `go mod tidy` keeps what it needs
printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/test/e2e/dra/test-driver"\n' > tools.go
echo "build-dra-test-driver: go mod tidy" >&2
go mod tidy >&2
echo "build-dra-test-driver: go build" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o dra-test-driver k8s.io/kubernetes/test/e2e/dra/test-driver >&2
mv dra-test-driver "$dir/dra-test-driver"
echo "$dir/dra-test-driver"
