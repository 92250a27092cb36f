#!/usr/bin/env bash
# Builds helm (Go module helm.sh/helm/v3, version below) into
#   ${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/helm/<version>/helm
# Idempotent. Prints the binary's path on stdout.
set -euo pipefail
version=v3.22.0
cache=${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}
dir="$cache/helm/$version"
if [ -x "$dir/helm" ]; then echo "$dir/helm"; exit 0; fi
command -v go >/dev/null || { echo "build-helm: go is not installed" >&2; exit 1; }
mkdir -p "$dir"
echo "build-helm: go install helm.sh/helm/v3/cmd/helm@$version" >&2
GOBIN="$dir" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version" \
  "helm.sh/helm/v3/cmd/helm@$version" >&2
echo "$dir/helm"
