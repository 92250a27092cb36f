#!/usr/bin/env bash
# Builds kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and kubeadm (the VM test joining a node
# with `kubeadm join`) at the version named in
# KUBERNETES_VERSION from the official Go module k8s.io/kubernetes (through the Go module proxy), into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/kubernetes/<version>/bin
# With arguments, builds those commands of k8s.io/kubernetes/cmd instead, into the same directory, e.g.
# `hack/build-kubernetes.sh kubelet` for the kubelet benchmark (built on that benchmark's first run, not by setup).
# Idempotent: does nothing when all the binaries asked for are already there. Prints the bin directory on stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=$(tr -d '[:space:]' < "$root/KUBERNETES_VERSION")
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
out="$cache/kubernetes/$version"
bin="$out/bin"
if [ $# -gt 0 ]; then cmds=("$@"); else cmds=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubeadm); fi
for c in "${cmds[@]}"; do
  case "$c" in *[!a-z0-9-]*|"") echo "build-kubernetes: $c is not a command name of k8s.io/kubernetes/cmd" >&2; exit 1 ;; esac
done

have_all() { for c in "${cmds[@]}"; do [ -x "$bin/$c" ] || return 1; done; }
if have_all; then echo "$bin"; exit 0; fi

command -v go >/dev/null || { echo "build-kubernetes: go is not installed" >&2; exit 1; }
minor=${version#v1.}; minor=${minor%%.*}
patch=${version##*.}
staging_version="v0.$minor.$patch"

# a source directory per set of commands, so a build of other commands never removes this one's
src="$out/src"
[ $# -gt 0 ] && src="$out/src-$(IFS=-; echo "${cmds[*]}")"
rm -rf "$src"; mkdir -p "$src" "$bin"
cd "$src"
echo "build-kubernetes: resolving k8s.io/kubernetes@$version" >&2
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
[ -f "$gomod" ] || { echo "build-kubernetes: no go.mod for k8s.io/kubernetes@$version" >&2; exit 1; }
go_line=$(grep -m1 '^go ' "$gomod")
{
  echo "module nodeagent.local/kubernetes-build"
  echo
  echo "$go_line"
  echo
  echo "require k8s.io/kubernetes $version"
  echo
  # every staging module (replaced by a local path upstream) comes from its published release instead
  grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/' "$gomod" | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
} > go.mod
{
  echo "//go:build tools"
  echo
  echo "package tools"
  echo
  echo "import ("
  for c in "${cmds[@]}"; do echo "	_ \"k8s.io/kubernetes/cmd/$c\""; done
  echo ")"
} > tools.go
echo "build-kubernetes: go mod tidy" >&2
go mod tidy >&2
# static, as the release builds these programs; and every program built from this module elsewhere (the conformance
# suite, its images, the test drivers) is built with cgo off too, so Go's build cache serves the packages they share
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
for c in "${cmds[@]}"; do
  echo "build-kubernetes: go build $c" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c" >&2
  mv "$bin/$c.tmp" "$bin/$c"
done
have_all
echo "$bin"
