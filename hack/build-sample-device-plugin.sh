#!/usr/bin/env bash
# Builds the upstream sample device plugin (test/images/sample-device-plugin of the pinned k8s.io/kubernetes
# module: registers example.com/resource with two devices) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/sample-device-plugin/<version>/sample-device-plugin
# The go.mod is written as hack/build-kubernetes.sh writes its own: k8s.io/kubernetes at KUBERNETES_VERSION, every
# staging module from its published release. The real-node device plugin tests run the binary.
# Idempotent: does nothing when the binary for this version is already there. Prints the binary's path on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(tr -d '[:space:]' < "$root/KUBERNETES_VERSION")
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/sample-device-plugin/$version"
if [ -x "$dir/sample-device-plugin" ]; then echo "$dir/sample-device-plugin"; exit 0; fi
command -v go >/dev/null || { echo "build-sample-device-plugin: go is not installed" >&2; exit 1; }
minor=${version#v1.}; minor=${minor%%.*}
patch=${version##*.}
staging_version="v0.$minor.$patch"
mkdir -p "$dir"
# built in a scratch directory first so an interrupted build never leaves a half-written binary in place
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$gomod" ] || { echo "build-sample-device-plugin: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
{
  echo "module nodeagent.local/sample-device-plugin"
  echo
  grep -m1 '^go ' "$gomod"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
} > go.mod
pkg=k8s.io/kubernetes/test/images/sample-device-plugin
echo "build-sample-device-plugin: go get $pkg" >&2
go get "$pkg@$version" >&2
echo "build-sample-device-plugin: go build" >&2
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o sample-device-plugin "$pkg" >&2
mv sample-device-plugin "$dir/sample-device-plugin"
echo "$dir/sample-device-plugin"
