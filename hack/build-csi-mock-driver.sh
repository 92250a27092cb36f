#!/usr/bin/env bash
# Builds tests/csi-mock-driver (the Kubernetes e2e suite's mock CSI driver from the pinned k8s.io/kubernetes
# module, with a minimal plugin registrar of its own) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/csi-mock-driver/<version>-<hash of main.go>/csi-mock-driver
# The go.mod is written here as hack/build-kubernetes.sh writes its own: k8s.io/kubernetes at KUBERNETES_VERSION,
# every staging module from its published release. The real-node CSI tests run the binary.
# Idempotent: does nothing when the binary for these sources is already there. Prints the binary's path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(tr -d '[:space:]' < "$root/KUBERNETES_VERSION")
main="$root/tests/csi-mock-driver/main.go"
hash=$( (cat "$main"; echo "$version") | sha256sum | cut -c1-16)
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/csi-mock-driver/$hash"
if [ -x "$dir/csi-mock-driver" ]; then echo "$dir/csi-mock-driver"; exit 0; fi
command -v go >/dev/null || { echo "build-csi-mock-driver: go is not installed" >&2; exit 1; }
minor=${version#v1.}; minor=${minor%%.*}
patch=${version##*.}
staging_version="v0.$minor.$patch"
mkdir -p "$dir"
# built in a scratch directory first so an interrupted build never leaves a half-written binary in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$gomod" ] || { echo "build-csi-mock-driver: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
{
  echo "module nodeagent.local/csi-mock-driver"
  echo
  grep -m1 '^go ' "$gomod"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
} > go.mod
cp "$main" main.go
echo "build-csi-mock-driver: go mod tidy" >&2
go mod tidy >&2
echo "build-csi-mock-driver: go build" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o csi-mock-driver . >&2
mv csi-mock-driver "$dir/csi-mock-driver"
echo "$dir/csi-mock-driver"
