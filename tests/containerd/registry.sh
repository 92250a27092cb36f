#!/usr/bin/env bash
# Start or stop a CNCF distribution registry on 127.0.0.1 (an ephemeral port) for node-agent's real-mode tests,
# and point a containerd set up by setup.sh at it over plain HTTP.
#
# usage: tests/containerd/registry.sh start DIR [USER:PASSWORD]   prints the registry's address (127.0.0.1:PORT)
#        tests/containerd/registry.sh stop DIR
# start: storage, config and log below DIR; with USER:PASSWORD every request needs basic auth (htpasswd, bcrypt).
#        The binary comes from hack/build-registry.sh (built once from the Go module proxy, then cached).
#        With NA_CRI_DIR set (the containerd of setup.sh), writes $NA_CRI_DIR/certs.d/<address>/hosts.toml so that
#        containerd pulls from the registry over HTTP; containerd reads it at each pull, no restart needed.
# stop:  stops the registry by the PID in DIR/registry.pid and removes its hosts.toml (DIR itself is kept).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
log() { echo "[registry] $*" >&2; }
die() { log "error: $*"; exit 1; }

cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 start|stop DIR [USER:PASSWORD]"

case "$cmd" in
stop)
  if [ -f "$dir/registry.pid" ]; then
    pid=$(cat "$dir/registry.pid")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$dir/registry.pid"
  fi
  if [ -f "$dir/hosts.toml.path" ]; then
    rm -rf "$(dirname "$(cat "$dir/hosts.toml.path")")"
    rm -f "$dir/hosts.toml.path"
  fi
  exit 0
  ;;
start) ;;
*) die "unknown command $cmd (start or stop)" ;;
esac

auth=${3:-}
if [ -f "$dir/registry.pid" ] && kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then
  die "a registry from $dir is already running (pid $(cat "$dir/registry.pid")); stop it first"
fi
bin=$(bash "$HERE/../../hack/build-registry.sh")
mkdir -p "$dir/storage"
{
  echo "version: 0.1"
  echo "log: {level: info, formatter: text}"
  echo "storage:"
  echo "  filesystem: {rootdirectory: \"$dir/storage\"}"
  echo "  delete: {enabled: true}"
  echo "http:"
  echo "  addr: 127.0.0.1:0"
  echo "  secret: node-agent-test-registry"
  if [ -n "$auth" ]; then
    case "$auth" in *:*) ;; *) die "credentials must be USER:PASSWORD" ;; esac
    python3 "$HERE/htpasswd.py" "${auth%%:*}" "${auth#*:}" > "$dir/htpasswd"
    echo "auth:"
    echo "  htpasswd: {realm: node-agent-test, path: \"$dir/htpasswd\"}"
  fi
} > "$dir/config.yml"

: > "$dir/registry.log"
# no tracing exporter: nothing listens for it here
OTEL_TRACES_EXPORTER=none setsid "$bin" serve "$dir/config.yml" </dev/null >>"$dir/registry.log" 2>&1 &
echo $! > "$dir/registry.pid"
addr=""
for _ in $(seq 1 100); do
  addr=$(sed -n 's/.*msg="listening on \(127\.0\.0\.1:[0-9]*\)".*/\1/p' "$dir/registry.log" | head -1)
  [ -n "$addr" ] && break
  kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null || die "the registry exited; see $dir/registry.log"
  sleep 0.1
done
[ -n "$addr" ] || die "the registry did not report its address; see $dir/registry.log"
echo "$addr" > "$dir/address"

if [ -n "${NA_CRI_DIR:-}" ]; then
  hosts="$NA_CRI_DIR/certs.d/$addr/hosts.toml"
  mkdir -p "$(dirname "$hosts")"
  cat > "$hosts" <<TOML
server = "http://$addr"
[host."http://$addr"]
  capabilities = ["pull", "resolve"]
TOML
  echo "$hosts" > "$dir/hosts.toml.path"
fi
log "serving on $addr (pid $(cat "$dir/registry.pid"))"
echo "$addr"
